//! Every bound of the broker, named (qualifier last) and in one place, so
//! that what a client can make a core hold is readable here. Limits a user
//! may want to change are flags (`weir broker --help`); their defaults are
//! the `*_DEFAULT` constants below. `docs/architecture.md` lists them all.

/// Largest native request frame unless `--max-frame-bytes` says otherwise
/// (the native protocol's own default; the Kafka listener's bound is the
/// smaller of the flag and [`weir_kafka::codec::MAX_REQUEST_FRAME_BYTES`]).
pub const FRAME_BYTES_MAX_DEFAULT: u32 = weir_proto::frame::FRAME_BYTES_MAX_DEFAULT as u32;

/// Largest Kafka request frame of an API other than Produce (those carry
/// names and offsets, not record batches): a larger one closes the
/// connection before it is buffered, and bounds what the Kafka decoder may
/// reserve for a hostile array count.
pub const KAFKA_NON_PRODUCE_FRAME_BYTES_MAX: usize = 8 << 20;

/// Request bytes one core holds at most (being read or handled): a
/// connection takes from this budget as bytes arrive, and gives a frame's
/// share back once the frame is answered.
pub const INFLIGHT_BYTES_PER_CORE: u64 = 512 << 20;
/// Bytes read from a socket at a time (and so the most a connection reads
/// beyond its share of [`INFLIGHT_BYTES_PER_CORE`]).
pub const READ_CHUNK_BYTES: usize = 64 << 10;
/// Buffer reserved ahead for a frame whose length is known, beyond the
/// bytes already read (memory is reserved, not yet used or counted).
pub const FRAME_RESERVE_AHEAD_BYTES: usize = 1 << 20;
/// Requests of one connection in progress at once (read, not yet
/// answered). Beyond this the connection is not read until the oldest is
/// answered.
pub const PIPELINE_MAX: usize = 32;
/// Once the first byte of a frame has arrived, the whole frame must arrive
/// within this long, or the connection is closed (`--frame-read-timeout-ms`).
pub const FRAME_READ_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// A connection on an SSL:// listener must finish its TLS handshake within
/// this long, or it is closed (a client that connects and sends nothing,
/// or garbage, holds a connection slot no longer).
pub const TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// A connection closed after an answer (a failed login, a bad frame) is
/// closed this long after the answer is sent: the client reads the answer
/// before the close (Kafka's `connection.failed.authentication.delay.ms`,
/// 100 ms too).
pub const CLOSE_LINGER_MS: u64 = 100;
/// Failed SASL logins from one address answered at once; later ones wait
/// 100 ms, then twice as long each time.
pub const SASL_FAILURES_BEFORE_DELAY: u32 = 3;
/// The longest a failed login's answer waits.
pub const SASL_FAILURE_DELAY_MS_MAX: u64 = 5_000;
/// Addresses whose failed logins a core remembers.
pub const SASL_FAILURE_SOURCES_MAX: usize = 10_000;
/// Open connections per core, both ports together; a connection beyond it
/// is closed at once (`--max-connections-per-core`).
pub const CONNECTIONS_PER_CORE_MAX_DEFAULT: usize = 10_000;
/// Partitions named in one produce, fetch or list-offsets request.
pub const REQUEST_PARTITIONS_MAX: usize = 10_000;
/// The longest a fetch may wait for data (`max_wait_ms` is capped to it).
pub const FETCH_WAIT_MS_MAX: u32 = 30_000;
/// Capacity of each cross-core channel (messages).
pub const MESH_CHANNEL_CAPACITY: usize = 1024;
/// Cross-core requests one core may have outstanding at another core: a
/// request takes a credit before it is sent and gives it back when its
/// answer arrives (or its wait ends).
pub const MESH_CREDITS_PER_PEER: u64 = 4096;
/// The longest a cross-core request waits for its answer, beyond any wait
/// the request itself asks for (a long-poll fetch's `max_wait_ms`); then it
/// fails with `CoreUnavailable`.
pub const MESH_REPLY_TIMEOUT_MS: u64 = 30_000;
/// The longest a topic change waits for every core to apply it.
pub const METADATA_APPLY_TIMEOUT_MS: u64 = 60_000;
/// Topic changes waiting for the metadata writer at once; more wait to
/// be queued.
pub const METADATA_QUEUE_MAX: usize = 1024;
/// How often a core checks for a shutdown request.
pub const STOP_POLL_MS: u64 = 50;
/// How long shutdown waits for in-flight requests.
pub const DRAIN_MS_MAX: u64 = 10_000;

const _: () = assert!(READ_CHUNK_BYTES as u64 * 64 <= INFLIGHT_BYTES_PER_CORE);
// Frames: a Kafka non-Produce frame ≤ a Kafka frame ≤ a native frame (by
// default) ≤ what one core holds in flight, so that one frame of the
// largest kind can always be read (`--max-frame-bytes` is checked against
// the budget at start-up, `server::config`).
const _: () =
    assert!(KAFKA_NON_PRODUCE_FRAME_BYTES_MAX <= weir_kafka::codec::MAX_REQUEST_FRAME_BYTES);
const _: () =
    assert!(weir_kafka::codec::MAX_REQUEST_FRAME_BYTES <= FRAME_BYTES_MAX_DEFAULT as usize);
const _: () = assert!(weir_proto::frame::FRAME_BYTES_MAX_DEFAULT <= u32::MAX as usize);
const _: () = assert!(FRAME_BYTES_MAX_DEFAULT as u64 <= INFLIGHT_BYTES_PER_CORE);
// A frame's reservation ahead is read in whole chunks.
const _: () = assert!(READ_CHUNK_BYTES <= FRAME_RESERVE_AHEAD_BYTES);
const _: () = assert!(MESH_CREDITS_PER_PEER >= MESH_CHANNEL_CAPACITY as u64);
