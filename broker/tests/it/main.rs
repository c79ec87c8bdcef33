//! The broker's integration tests, as one test binary (one link of the
//! broker and its dependencies instead of one per file: the CI build is
//! what a change waits for). Each file is a module; a test is named
//! `file::test` (`bash .ci/test -E 'test(/^cluster::/)'`). The tests that
//! start several nodes (`cluster::`, `core_faults::`) run alone
//! (`.config/nextest.toml`).

#[path = "../common/mod.rs"]
mod common;

mod acl;
mod broker_native;
mod cli;
mod client;
mod cluster;
mod compaction;
mod core_faults;
mod groups;
mod groups_upgrade;
mod kafka_bad_input;
mod kafka_clients;
mod kafka_sarama;
mod oauth;
mod otlp;
mod quota;
mod sasl;
mod sdk;
mod share;
mod share_sdk;
mod tiered;
mod tls;
mod transactions;
