//! Weir's Kafka wire protocol, sans-IO: bytes in, typed requests out; typed
//! responses in, bytes out. No sockets, no runtime, no clock — the broker's
//! Kafka listener (`weir-broker`, `listener/kafka/`) does the I/O and the
//! serving, and the fuzz target (`kafka/fuzz`) drives this crate alone.
//!
//! * [`codec`]: framing, the hostile-length guard, the table of served API
//!   versions ([`codec::SUPPORTED`]), request decoding, response encoding
//!   (the zero-copy Fetch answer), the error answer built from a header.
//! * [`legacy`]: request versions Kafka 4 removed that Weir still serves,
//!   rewritten into the lowest version `kafka-protocol` reads.
//! * [`error`]: Kafka's error codes (`kafka-protocol`'s [`ResponseError`],
//!   not a table of our own) and the one mapping from Weir's
//!   protocol-neutral [`ErrorCode`](weir_proto::error_code::ErrorCode) to
//!   them.
#![warn(missing_docs)]

pub mod codec;
pub mod error;
pub mod legacy;

pub use kafka_protocol::ResponseError;
