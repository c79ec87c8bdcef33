//! `weir-replication`: the node-to-node layer of a Weir cluster.
//!
//! - [`tls`]: the cluster CA and node certificates (mutual TLS 1.3).
//! - [`wire`]: the node protocol (8-byte frame header, rkyv bodies) over
//!   QUIC streams ([`quinn`]).
//! - [`link`]: outgoing connections to peers.
//! - [`isr`]: a leader's ISR and high watermark, sans-IO.
//! - [`meta`]: the replicated cluster metadata and its commands, and
//!   replica placement.
//! - [`remote`]: tiered storage's remote log metadata (part of [`meta`]).
//! - [`raft`]: the metadata quorum on openraft, with its durable log.
//! - [`controller`]: a node's controller (endpoint, Raft member, liveness)
//!   on its own thread.
//! - [`error`]: the crate's [`Error`].

#![warn(missing_docs)]

pub mod controller;
pub mod error;
pub mod glommio_rt;
pub mod isr;
pub mod link;
pub mod raft;
pub mod security;
pub mod tls;

// rkyv's derive gives the archived twin of a tuple variant an undocumented
// field, which `missing_docs` reports (and cannot be told otherwise); the
// items of these modules are documented.
#[allow(missing_docs)]
pub mod data;
#[allow(missing_docs)]
pub mod meta;
#[allow(missing_docs)]
pub mod remote;
#[allow(missing_docs)]
pub mod wire;

#[cfg(test)]
mod sim;

pub use controller::{Controller, ControllerConfig, ControllerError};
pub use error::{Error, Result};
pub use meta::{
    join_listeners, pick_listener, split_listeners, AdvertisedListener, ClusterState, Command,
    NodeInfo, Outcome,
};
pub use quinn;
