//! # weir-proto
//!
//! Sans-IO wire formats shared by every Weir component. Nothing in this crate
//! opens a socket, touches a file or reads the clock: it turns bytes into
//! values and back.
//!
//! * [`batch`] — the record batch header (Kafka RecordBatch v2, magic 2):
//!   validation, CRC32C, base-offset rewriting. This is the unit stored on disk
//!   and sent on the wire, byte for byte.
//! * [`varint`] — the zigzag varints and varlongs records are made of.
//! * [`record`] — one record inside a batch: a zero-copy [`record::Record`]
//!   view and the owned [`record::RecordData`] producers build from.
//! * [`compression`] — LZ4 (frame format) and zstd for the records section,
//!   with bounded decompression.
//! * [`builder`] — [`builder::BatchBuilder`], which encodes records into a
//!   complete, CRC-stamped batch.
//! * [`reader`] — [`reader::RecordBatch`], which validates a batch and
//!   iterates over its records with absolute offsets and timestamps.
//!
//! The native protocol (specified in `docs/protocol.md`):
//!
//! * [`frame`] — request and response frames: a 16-byte header, an rkyv
//!   body and a raw payload of record batches; [`frame::peek_frame_len`],
//!   [`frame::decode_request`], [`frame::encode_request`], … and
//!   [`frame::FrameError`].
//! * [`api`] — [`api::ApiKey`], the stable API numbers, and the versions
//!   this build speaks.
//! * [`error_code`] — [`error_code::ErrorCode`], the stable error numbers.
//! * [`messages`] — the request and response bodies (rkyv archives,
//!   validated on decode) and the typed [`messages::AnyRequest`].
//!
//! * [`sasl`] — SASL mechanisms (PLAIN, SCRAM-SHA-256/512), both sides,
//!   for the broker's listeners and the SDK.
//!
//! All decoding is total: malformed input yields a [`batch::BatchError`] or a
//! [`frame::FrameError`], never a panic nor an allocation sized by a field
//! read from the input before it was checked against the bytes present.
#![warn(missing_docs)]

pub mod api;
pub mod batch;
pub mod builder;
pub mod compression;
pub mod error_code;
pub mod frame;
pub mod messages;
pub mod reader;
pub mod record;
pub mod sasl;
pub mod segments;
pub mod varint;
