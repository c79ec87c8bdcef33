//! Consumer groups: the coordinator ([`coordinator`]: membership,
//! assignment, commits, expiry), the assignors ([`assignor`]), and
//! `__consumer_offsets` — its record formats ([`records`]) and its appends
//! and replay ([`store`]).
//!
//! The coordinator still speaks the native protocol's group messages
//! (`weir_proto::messages`) at its boundary; the issue "Consumer groups
//! that hold under faults" gives it a protocol-neutral model (epochs, the
//! classic and KIP-848 protocols) shared by the native and Kafka listeners.

pub mod assignor;
pub mod classic;
pub mod classic_service;
pub mod clock;
pub mod consumer;
pub mod coordinator;
pub mod limits;
pub mod records;
pub mod store;

#[cfg(test)]
mod model_tests;
