//! # weir-broker
//!
//! The `weir` binary's library: configuration ([`config`]), the topic
//! registry ([`registry`]), one [`core::Core`] per pinned glommio executor,
//! the cross-core messages and their handlers ([`handlers`]), the native
//! protocol connections ([`connection`]) and start-up/shutdown ([`server`]).
#![warn(missing_docs)]

pub mod config;
pub mod connection;
pub mod core;
pub mod errors;
pub mod handlers;
pub mod metrics;
pub mod producer_ids;
pub mod registry;
pub mod router;
pub mod server;
