//! Consumer groups in the broker: the hosting of the state machines of
//! `weir-groups` (sans-IO: KIP-848 and classic groups, assignors, the
//! `__consumer_offsets` records, limits). [`coordinator`]: where a group
//! lives, its lock, storing each step before answering, held heartbeats,
//! commits, describe/list/delete, expiry; [`classic_service`]: the classic
//! machine's held joins and syncs; [`store`]: the records appended to
//! `__consumer_offsets` and how a replayed one is applied; [`machine`]: the
//! groups as a machine of the coordinator runtime ([`crate::coordinator`]:
//! it creates the topic, replays, writes durably); [`clock`]: where the
//! time the machines are given is read.
//!
//! The coordinator still speaks the native protocol's group messages
//! (`weir_proto::messages`) at its boundary; the Kafka listener maps its
//! own onto them.

pub mod api;
pub mod classic_service;
pub mod clock;
pub mod coordinator;
pub mod machine;
pub mod registry;
pub mod store;

// The state machines, assignors, record formats and limits are the
// sans-IO crate `weir-groups`; these re-exports keep their paths.
pub use weir_groups::{assignor, classic, consumer, limits, records};
