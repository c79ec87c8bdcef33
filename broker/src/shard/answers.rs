//! What a core answers about a partition it owns — the payloads the mesh
//! carries back ([`super::mesh::CoreMsg`]) and the service hands to the
//! listeners. A leaf: plain data.

use weir_storage::CleanReport;

/// A produce that succeeded.
#[derive(Debug, Clone, Copy)]
pub struct ProduceOk {
    /// Offset of the batch's first record.
    pub base_offset: u64,
    /// Log start offset.
    pub log_start_offset: u64,
}

/// A fetch of one partition that succeeded.
#[derive(Debug, Clone)]
pub struct FetchOk {
    /// Whole batches, as stored.
    pub batches: Vec<bytes::Bytes>,
    /// High watermark.
    pub high_watermark: u64,
    /// Log start offset.
    pub log_start_offset: u64,
    /// Last stable offset (at most the high watermark): a read-committed
    /// reader gets the batches below it.
    pub last_stable_offset: u64,
    /// The aborted transactions overlapping the batches read: (producer
    /// id, first offset), for a read-committed reader to skip.
    pub aborted: Vec<(i64, u64)>,
}

/// Offsets of a partition.
#[derive(Debug, Clone, Default)]
pub struct OffsetsOk {
    /// Log start offset.
    pub log_start_offset: u64,
    /// High watermark (what consumers can read up to).
    pub high_watermark: u64,
    /// Last stable offset (what read_committed consumers can read up to).
    pub last_stable_offset: u64,
    /// Size of the log, bytes.
    pub size_bytes: u64,
    /// Result of the timestamp lookup.
    pub for_timestamp: Option<u64>,
    /// The log's leader epochs with their start offsets, oldest first.
    pub leader_epochs: Vec<(u32, u64)>,
    /// First offset on local disk (`log_start_offset` unless tiered).
    pub local_log_start_offset: u64,
    /// Bytes in the remote tier (tiered storage).
    pub remote_bytes: u64,
    /// Segments in the remote tier.
    pub remote_segments: u32,
    /// Where the remote tier ends (the offset after its last record; 0:
    /// nothing remote yet); `None` for a topic that is not tiered.
    pub remote_end: Option<u64>,
}

/// The outcome of a compaction request on one partition.
#[derive(Debug, Clone)]
pub struct CompactOk {
    /// The dirty ratio now, 0..=1.
    pub dirty_ratio: f64,
    /// The pass, if one ran.
    pub pass: Option<CleanReport>,
}
