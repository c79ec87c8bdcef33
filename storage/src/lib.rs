//! # weir-storage
//!
//! The partition log of Weir: append-only segments of Kafka RecordBatch v2
//! bytes, written with direct I/O through io_uring (glommio `DmaFile`),
//! group-committed per core, read through a per-core batch cache.
//!
//! Main types:
//! * [`StorageShard`] — one per core: batch cache, group committer, counters.
//! * [`PartitionLog`] — one partition (`<topic>-<partition>/`), owned by one
//!   shard: append, read, offset for timestamp, truncation, retention,
//!   recovery on open, idempotent-producer checks.
//! * [`ProducerStateTable`] — per-partition idempotent-producer state
//!   (sequence and epoch checks, duplicate detection), snapshotted to
//!   `producer.snapshot` and rebuilt from the batches on open.
//! * [`LogConfig`] — Kafka-named per-topic settings.
//!
//! Which core owns what: a `StorageShard` and every log opened through it
//! belong to the glommio executor that created them; they are `!Send` and
//! must only be used there. Other cores reach a partition by sending a
//! request to its owner.
//!
//! Durability is explicit: see the [`log`] module docs for exactly when a
//! batch is in memory, written, or fdatasync'd. On-disk formats are in
//! `docs/storage-format.md`.
#![warn(missing_docs)]

pub mod cache;
pub mod checkpoint;
pub mod cleaner;
pub mod clock;
pub mod config;
pub mod epochs;
pub mod error;
pub mod log;
pub mod offset_index;
pub mod producer_state;
pub mod read_streams;
pub mod segment;
pub mod shard;
mod sync_group;
pub mod tail_writer;
#[doc(hidden)]
pub mod testing;
pub mod time_index;
pub mod txn;

pub use cache::{CacheStats, CACHE_BYTES_PER_CORE_DEFAULT};
pub use cleaner::CleanReport;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{CleanupPolicy, LogConfig};
pub use epochs::EpochCache;
pub use error::{Result, StorageError};
pub use log::{
    AppendInfo, PartitionLog, ReadResult, RecoveryReport, RetentionReport, SealedSegment,
};
pub use producer_state::{ActiveProducer, ProducerStateTable};
pub use shard::{ShardConfig, ShardStats, StorageShard};
