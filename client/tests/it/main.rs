//! The client's integration tests, as one test binary (one link of the
//! crate and its dependencies instead of one per file: the CI build is what
//! a change waits for). Each file is a module; a test is named
//! `file::test` (`bash .ci/test -E 'package(weir-client) & test(/^producer::/)'`).

#[path = "../common/mod.rs"]
mod common;

mod broker_faults;
mod consumer;
mod metrics_facade;
mod mock_server;
mod pipelining;
mod producer;
