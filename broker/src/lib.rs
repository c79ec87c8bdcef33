//! # weir-broker
//!
//! The `weir` binary's library, one room per concern (see
//! `docs/architecture.md`):
//!
//! - [`server`]: start-up and shutdown, configuration, every named limit;
//! - [`listener`]: connections (a protocol-neutral pipeline) with a codec
//!   and dispatch per protocol (`native`), and the HTTP metrics endpoint;
//! - [`service`]: produce, fetch, offsets, admin as a typed Rust API with
//!   one error enum ([`service::BrokerError`]) — no wire types;
//! - [`metadata`]: the versioned view of topics and placement, and its one
//!   writer;
//! - [`shard`]: one core — its partitions, its mesh to the other cores;
//! - [`groups`]: the consumer-group coordinator and `__consumer_offsets`;
//! - [`metrics`]: per-core counters and their Prometheus rendering.
//!
//! A request goes down listener → service → shard → storage and back; no
//! room below a listener knows a wire format (the group coordinator still
//! does, until its own issue).
#![warn(missing_docs)]

pub mod cluster;
pub mod coordinator;
pub mod error;
pub mod groups;
pub mod listener;
pub mod metadata;
pub mod metrics;
pub mod replica;
pub mod server;
pub mod service;
pub mod shard;
pub mod share;
pub mod tier;
pub mod txns;

#[cfg(test)]
mod layering_tests;
