//! Consumer groups as pure state machines, and the records that make them
//! durable. No I/O, no runtime, no clock: time comes in as an argument
//! (`now_ms`), requests and answers are this crate's own types, and what a
//! step changed is handed back to be stored before it is answered. The
//! broker hosts them (`weir-broker`'s `groups/coordinator.rs`: where a
//! group lives, its lock, the appends to `__consumer_offsets`, replay) and
//! maps the native and Kafka protocols onto them; neither protocol's types
//! appear here (`cargo tree -p weir-groups -e normal`: `bytes`, `crc32c`, `thiserror`).
//!
//! * [`consumer`]: a group of KIP-848's protocol (epochs, reconciliation,
//!   fencing, commit validation);
//! * [`classic`]: Kafka's classic protocol (JoinGroup/SyncGroup/Heartbeat/
//!   LeaveGroup, static membership, timers) and its snapshot codec;
//! * [`assignor`]: the server-side assignors (`uniform`, `range`);
//! * [`records`]: the `__consumer_offsets` records, in Kafka's format where
//!   Kafka has the record;
//! * [`limits`]: every bound of the above, and their relations.
//!
//! A simulation drives both machines under random faults (`model_tests`).
#![warn(missing_docs)]

pub mod assignor;
pub mod classic;
pub mod consumer;
pub mod limits;
pub mod records;

#[cfg(test)]
mod model_tests;
