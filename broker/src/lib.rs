//! # weir-broker
//!
//! The `weir` binary's library: configuration ([`config`]), the topic
//! registry ([`registry`]), one [`core::Core`] per pinned glommio executor,
//! the cross-core messages and their handlers ([`handlers`]), the native
//! protocol connections ([`connection`]), the consumer-group coordinator
//! ([`group_coordinator`], with [`assignor`], and `__consumer_offsets`:
//! its records in [`group_records`], appends and replay in [`group_store`]) and start-up/shutdown ([`server`]).
#![warn(missing_docs)]

pub mod assignor;
pub mod config;
pub mod connection;
pub mod core;
pub mod errors;
pub mod group_coordinator;
pub mod group_records;
pub mod group_store;
pub mod handlers;
pub mod metrics;
pub mod producer_ids;
pub mod registry;
pub mod router;
pub mod server;
