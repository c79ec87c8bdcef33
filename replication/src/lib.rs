//! `weir-replication`: the node-to-node layer of a Weir cluster.
//!
//! - [`tls`]: the cluster CA and node certificates (mutual TLS 1.3).
//! - [`wire`]: the node protocol (8-byte frame header, rkyv bodies) over
//!   QUIC streams ([`quinn`]).
//! - [`link`]: outgoing connections to peers.
//! - [`isr`]: a leader's ISR and high watermark, sans-IO.
//! - [`meta`]: the replicated cluster metadata and its commands, and
//!   replica placement.
//! - [`raft`]: the metadata quorum on openraft, with its durable log.
//! - [`controller`]: a node's controller (endpoint, Raft member, liveness)
//!   on its own thread.
//! - [`error`]: the crate's [`Error`].

pub mod controller;
pub mod data;
pub mod error;
pub mod glommio_rt;
pub mod isr;
pub mod link;
pub mod meta;
pub mod raft;
pub mod tls;
pub mod wire;

pub use controller::{Controller, ControllerConfig, ControllerError};
pub use error::{Error, Result};
pub use meta::{ClusterState, Command, NodeInfo, Outcome};
pub use quinn;
