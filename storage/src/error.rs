//! Errors of the storage engine.
//!
//! Every failure is a value: I/O errors carry the operation and the path,
//! batch errors the partition. `StorageError` is `Clone` (I/O sources are
//! behind an `Arc`) because one failed flush round must be reported to every
//! appender that waited on it.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use thiserror::Error;
use weir_proto::batch::BatchError;

/// Result alias for the storage engine.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// What went wrong in a storage operation.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum StorageError {
    /// A file operation failed.
    #[error("I/O error during {op} on {}: {source}", path.display())]
    Io {
        /// The operation (`"write"`, `"fdatasync"`, …).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The batch given to `append` is not a valid record batch.
    #[error("invalid record batch for {partition}: {source}")]
    InvalidBatch {
        /// `topic-partition`.
        partition: String,
        /// Why.
        #[source]
        source: BatchError,
    },
    /// The buffer given to `append` holds more than one batch (or trailing bytes).
    #[error("append to {partition} takes exactly one batch: the batch is {batch_len} bytes but {buf_len} were given")]
    TrailingBytes {
        /// `topic-partition`.
        partition: String,
        /// Length of the first batch.
        batch_len: usize,
        /// Length of the buffer.
        buf_len: usize,
    },
    /// A replicated batch for a log that leads (it became the leader while
    /// the batch was on its way).
    #[error("{partition} leads at epoch {epoch}: a replicated batch is not appended")]
    Leading {
        /// `topic-partition`.
        partition: String,
        /// Its leader epoch.
        epoch: u32,
    },
    /// A replicated batch does not start at the follower's log end.
    #[error(
        "replicated batch for {partition} starts at offset {got}, not at the log end {expected}"
    )]
    ReplicaGap {
        /// `topic-partition`.
        partition: String,
        /// The log end offset.
        expected: u64,
        /// The batch's base offset.
        got: i64,
    },
    /// The batch is larger than the topic's `max.message.bytes`.
    #[error("record batch of {size} bytes exceeds max.message.bytes ({max}) of {partition}")]
    BatchTooLarge {
        /// `topic-partition`.
        partition: String,
        /// Batch size.
        size: usize,
        /// The limit.
        max: u64,
    },
    /// A record without a key was appended to a compacted log
    /// (`cleanup.policy` includes `compact`): nothing was appended.
    #[error("{partition} is compacted (cleanup.policy={policy}): every record needs a key, but the record at index {index} of the batch has none; nothing was appended")]
    KeyRequired {
        /// `topic-partition`.
        partition: String,
        /// The policy.
        policy: &'static str,
        /// Position of the first keyless record in the batch.
        index: usize,
    },
    /// A read or seek named an offset outside the log.
    #[error("offset {offset} is out of range for {partition}: valid offsets are {log_start}..={log_end} (log end)")]
    OffsetOutOfRange {
        /// `topic-partition`.
        partition: String,
        /// The requested offset.
        offset: u64,
        /// First offset in the log.
        log_start: u64,
        /// Offset the next record will get (reads of it return nothing).
        log_end: u64,
    },
    /// A previous write failed and the log is rolling back to its last
    /// written offset; the append was not accepted.
    #[error("{partition}: an earlier write failed and the log is recovering; retry the append")]
    Recovering {
        /// `topic-partition`.
        partition: String,
    },
    /// The log could not recover from a write failure: appends are refused,
    /// reads of written data still work.
    #[error("{partition} is offline after an I/O failure: {reason}")]
    Offline {
        /// `topic-partition`.
        partition: String,
        /// The failure that took it offline.
        reason: String,
    },
    /// The log was closed.
    #[error("{partition} is closed")]
    Closed {
        /// `topic-partition`.
        partition: String,
    },
    /// A configuration key or value is not valid.
    #[error("invalid config {key}={value}: {reason}")]
    Config {
        /// The key (Kafka's name, e.g. `segment.bytes`).
        key: String,
        /// The value given.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// An idempotent producer's batch does not follow its last one: a
    /// sequence gap, a repeat older than the batches remembered, or a new
    /// epoch not starting at sequence 0. Nothing was appended.
    #[error("out-of-order sequence for producer {producer_id} on {partition}: expected {expected}, got {got}")]
    OutOfOrderSequence {
        /// `topic-partition`.
        partition: String,
        /// The producer id.
        producer_id: i64,
        /// The base sequence the next batch must have.
        expected: i32,
        /// The batch's base sequence.
        got: i32,
    },
    /// A transactional write verified with its coordinator found, when it
    /// came to be appended, that its producer's transaction had ended
    /// meanwhile (a marker after the verification): appended, it would
    /// open a transaction nothing ends. Nothing was appended.
    #[error("producer {producer_id}'s transaction on {partition} ended while the write was verified: a late write, refused")]
    TransactionEnded {
        /// `topic-partition`.
        partition: String,
        /// The producer id.
        producer_id: i64,
    },
    /// The batch's producer epoch is older than the producer's current
    /// epoch: a newer instance of the producer fenced this one. Nothing was
    /// appended.
    #[error("producer {producer_id} on {partition} is fenced: epoch {epoch} is older than the current epoch {current}")]
    InvalidProducerEpoch {
        /// `topic-partition`.
        partition: String,
        /// The producer id.
        producer_id: i64,
        /// The batch's epoch.
        epoch: i16,
        /// The producer's current epoch.
        current: i16,
    },
    /// The partition has no state for this producer id (never seen, evicted,
    /// or its batches were truncated) and the batch does not start a
    /// sequence at 0. Nothing was appended.
    #[error("unknown producer id {producer_id} on {partition}")]
    UnknownProducerId {
        /// `topic-partition`.
        partition: String,
        /// The producer id.
        producer_id: i64,
    },
    /// A file on disk is not what Weir wrote and cannot be repaired.
    #[error("{}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl StorageError {
    /// Whether it is the disk being full (ENOSPC, or EDQUOT: out of
    /// quota), whatever the operation.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StorageError::Io { source, .. } => {
                matches!(
                    source.kind(),
                    io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
                ) || matches!(
                    source.raw_os_error(),
                    Some(libc::ENOSPC) | Some(libc::EDQUOT)
                )
            }
            _ => false,
        }
    }

    /// Wraps an I/O error (std or glommio) with the operation and path.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, e: impl Into<io::Error>) -> Self {
        StorageError::Io {
            op,
            path: path.into(),
            source: Arc::new(e.into()),
        }
    }

    /// Whether retrying the same request later can succeed.
    pub fn is_retriable(&self) -> bool {
        matches!(self, StorageError::Recovering { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_told_from_other_io_errors() {
        let err = |code| StorageError::io("write", "/x", io::Error::from_raw_os_error(code));
        assert!(err(libc::ENOSPC).is_disk_full());
        assert!(err(libc::EDQUOT).is_disk_full());
        assert!(!err(libc::EIO).is_disk_full());
        let by_kind = io::Error::new(io::ErrorKind::StorageFull, "preallocate");
        assert!(StorageError::io("preallocate", "/x", by_kind).is_disk_full());
    }
}
