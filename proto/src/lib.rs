//! # weir-proto
//!
//! Sans-IO wire formats shared by every Weir component. Nothing in this crate
//! opens a socket, touches a file or reads the clock: it turns bytes into
//! values and back.
//!
//! * [`batch`] — the record batch header (Kafka RecordBatch v2, magic 2):
//!   validation, CRC32C, base-offset rewriting. This is the unit stored on disk
//!   and sent on the wire, byte for byte.
#![warn(missing_docs)]

pub mod batch;
