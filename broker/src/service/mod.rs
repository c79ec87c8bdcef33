//! The broker's service: what a client can ask of Weir — produce, fetch,
//! offsets, topic administration, producer ids — as a typed Rust API with
//! one error enum, [`BrokerError`]. No wire type appears here: a listener
//! (`crate::listener::native`, later the Kafka one) decodes its protocol's
//! request, calls a function of this module and encodes the result in its
//! own format. Replication will call the same functions.
//!
//! **Which core:** every function runs on the core of the connection that
//! asked, and reaches the partitions' owner cores through the mesh
//! (`crate::shard::mesh`); the answer is assembled on the asking core.
//!
//! **Bounds:** every request is bounded by the named limits in
//! [`crate::server::limits`] (partitions per request, longest long-poll
//! wait, bytes read per fetch); a cross-core step that gets no answer
//! within [`crate::server::limits::MESH_REPLY_TIMEOUT_MS`] fails with
//! [`BrokerError::CoreUnavailable`].

pub mod acl;
pub mod admin;
pub mod auth;
pub mod fetch;
pub mod offsets;
pub mod produce;
pub mod quota;
pub mod remote;
pub mod users;

pub use crate::error::{topic_code, BrokerError, Result, StorageFailure};
pub use crate::shard::partition::{FetchOk, OffsetsOk, ProduceOk};

/// How the connection asking may be served.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ctx {
    /// A core's own port: produce and fetch requests for partitions of
    /// other cores are refused with [`BrokerError::NotOwner`] (so
    /// shard-aware clients learn of stale metadata) instead of forwarded.
    pub owner_only: bool,
}
