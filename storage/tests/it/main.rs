//! The storage engine's integration tests, as one test binary (one link of
//! the crate and its dependencies instead of one per file: the CI build is
//! what a change waits for). Each file is a module; a test is named
//! `file::test` (`bash .ci/test -E 'package(weir-storage) & test(/^crash::/)'`).
//! The tests that re-run this binary as a child process (`crash::`,
//! `io_errors::`, `compaction::`) name the child's test by its full path
//! ([`common::child_test`]). The proptest regression files are beside their
//! modules (`model.proptest-regressions`, `power_loss.proptest-regressions`):
//! with a `main.rs` here proptest's default would look for them in
//! `tests/proptest-regressions/`, so the configs say `WithSource`.

#[path = "../common/mod.rs"]
mod common;

mod blocking_wakeups;
mod compaction;
mod crash;
mod idempotence;
mod io_errors;
mod log_basic;
mod model;
mod no_blocking;
mod power_loss;
mod read_ahead;
mod replica;
mod sync_group;
mod torn_tail;
mod transactions;
