//! Bounds and defaults, with Kafka's config names (Kafka 4.1's defaults
//! and ranges).

/// `group.share.record.lock.duration.ms`: how long a member holds the
/// records it acquired before they are available again.
pub const RECORD_LOCK_DURATION_MS_DEFAULT: i64 = 30_000;
/// The lock duration's bounds (`group.share.min.record.lock.duration.ms`,
/// `group.share.max.record.lock.duration.ms`).
pub const RECORD_LOCK_DURATION_MS_MIN: i64 = 1_000;
/// See [`RECORD_LOCK_DURATION_MS_MIN`].
pub const RECORD_LOCK_DURATION_MS_MAX: i64 = 3_600_000;

/// `group.share.delivery.count.limit`: deliveries of a record before it
/// is archived instead of made available again.
pub const DELIVERY_COUNT_LIMIT_DEFAULT: u16 = 5;
/// The delivery limit's bounds.
pub const DELIVERY_COUNT_LIMIT_MIN: u16 = 2;
/// See [`DELIVERY_COUNT_LIMIT_MIN`].
pub const DELIVERY_COUNT_LIMIT_MAX: u16 = 10;

/// `group.share.partition.max.record.locks`: records in flight in one
/// share partition (between its start and end offsets); no more are
/// acquired from the log beyond it. Bounds a share partition's memory.
pub const PARTITION_MAX_RECORD_LOCKS_DEFAULT: usize = 2_000;
/// The bounds of [`PARTITION_MAX_RECORD_LOCKS_DEFAULT`].
pub const PARTITION_MAX_RECORD_LOCKS_MIN: usize = 100;
/// See [`PARTITION_MAX_RECORD_LOCKS_MIN`].
pub const PARTITION_MAX_RECORD_LOCKS_MAX: usize = 10_000;

/// `group.share.session.timeout.ms`.
pub const SESSION_TIMEOUT_MS_DEFAULT: i64 = 45_000;
/// `group.share.heartbeat.interval.ms`.
pub const HEARTBEAT_INTERVAL_MS_DEFAULT: i64 = 5_000;
/// `group.share.max.size`: members of one share group.
pub const GROUP_MAX_SIZE_DEFAULT: usize = 200;

/// Acknowledgement batches in one request partition (hostile counts are
/// refused, not looped over).
pub const ACK_BATCHES_MAX: usize = 10_000;
/// Bytes of a member id.
pub const MEMBER_ID_BYTES_MAX: usize = 255;
/// Topics one member subscribes to.
pub const MEMBER_TOPICS_MAX: usize = 1_000;
