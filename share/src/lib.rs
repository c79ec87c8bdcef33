//! Share groups (KIP-932: queue semantics on the log) as pure state
//! machines, and the record that makes a share partition durable. No I/O,
//! no runtime, no clock: time comes in as an argument (`now_ms`), and what
//! a step changed is handed back to be stored before it is answered (the
//! broker hosts them; neither protocol's types appear here).
//!
//! * [`partition`]: one share partition — a group's view of one topic
//!   partition: the records in flight between its start and end offsets,
//!   each Available, Acquired (by a member, until a deadline), Acknowledged
//!   or Archived, with its delivery count;
//! * [`group`]: share-group membership (KIP-932's heartbeat, epochs,
//!   sessions) and the assignor that may give one partition to many
//!   members;
//! * [`records`]: the `__share_group_state` record of a share partition;
//! * [`limits`]: the bounds and defaults of the above (Kafka's names).
//!
//! A simulation drives a share partition with several members, lock
//! expiries and restores from its durable record (`model_tests`).
#![warn(missing_docs)]

pub mod group;
pub mod limits;
pub mod partition;
pub mod records;

#[cfg(test)]
mod model_tests;
