//! What a core holds for tiered storage: chunks of remote `.log` objects
//! it read (an LRU bounded in bytes), remote segments' indexes, the reads
//! in flight and its counters. No I/O here.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use bytes::Bytes;
use futures_channel::oneshot;
use weir_storage::offset_index::OffsetIndex;
use weir_storage::time_index::TimeIndex;

/// Remote `.log` objects are read in chunks of this size, at aligned
/// positions.
pub const CHUNK_BYTES: u64 = 4 << 20;
/// Remote chunks a core keeps.
pub const CACHE_BYTES: u64 = 64 << 20;
/// After a read, this many following chunks of the segment are read ahead
/// (a sequential replay finds them cached).
pub const READ_AHEAD_CHUNKS: u64 = 2;
/// Remote reads (fetches) a core runs at once; more wait.
pub const READS_IN_FLIGHT: u64 = 4;
/// Remote segments' indexes a core keeps.
pub const INDEXES_MAX: usize = 256;

/// A chunk: (segment id, chunk number).
pub(crate) type ChunkKey = ([u8; 16], u64);

/// A remote segment's indexes.
#[derive(Debug)]
pub struct RemoteIndexes {
    /// Relative offset → position in the `.log` object.
    pub offsets: OffsetIndex,
    /// Timestamp → relative offset.
    pub times: TimeIndex,
}

/// A core's counters of tiered storage.
#[derive(Debug, Default)]
pub struct TierCounters {
    /// Segments uploaded (metadata committed).
    pub uploads: Cell<u64>,
    /// Bytes of `.log` objects uploaded.
    pub uploaded_bytes: Cell<u64>,
    /// Uploads that failed (retried at the next pass).
    pub upload_errors: Cell<u64>,
    /// Remote segments deleted (objects and metadata).
    pub deletes: Cell<u64>,
    /// Remote deletions that failed.
    pub delete_errors: Cell<u64>,
    /// Fetches served from the remote tier.
    pub reads: Cell<u64>,
    /// Bytes of batches served from the remote tier.
    pub read_bytes: Cell<u64>,
    /// Remote reads that failed (answered retriable).
    pub read_errors: Cell<u64>,
    /// Time spent in remote fetches, µs.
    pub read_micros: Cell<u64>,
    /// Chunks read from the object store (misses and read-ahead).
    pub chunks_read: Cell<u64>,
    /// Time uploads waited for the node's copy rate cap, µs.
    pub copy_throttle_micros: Cell<u64>,
    /// Orphaned objects deleted (no remote log metadata named them).
    pub orphans_deleted: Cell<u64>,
}

pub(crate) fn bump(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

/// Chunks by key, least recently used evicted first.
#[derive(Default)]
pub(crate) struct Chunks {
    map: HashMap<ChunkKey, (Bytes, u64)>,
    bytes: u64,
    tick: u64,
}

impl Chunks {
    pub(crate) fn get(&mut self, k: &ChunkKey) -> Option<Bytes> {
        self.tick += 1;
        let t = self.tick;
        self.map.get_mut(k).map(|(b, used)| {
            *used = t;
            b.clone()
        })
    }

    pub(crate) fn contains(&self, k: &ChunkKey) -> bool {
        self.map.contains_key(k)
    }

    pub(crate) fn put(&mut self, k: ChunkKey, b: Bytes) {
        self.tick += 1;
        self.bytes += b.len() as u64;
        if let Some((old, _)) = self.map.insert(k, (b, self.tick)) {
            self.bytes -= old.len() as u64;
        }
        while self.bytes > CACHE_BYTES && self.map.len() > 1 {
            let Some((&victim, _)) = self.map.iter().min_by_key(|(_, (_, used))| *used) else {
                break;
            };
            if let Some((b, _)) = self.map.remove(&victim) {
                self.bytes -= b.len() as u64;
            }
        }
    }

    /// Forgets a segment's chunks (it was deleted).
    pub(crate) fn forget(&mut self, id: &[u8; 16]) {
        let bytes = &mut self.bytes;
        self.map.retain(|k, (b, _)| {
            let keep = &k.0 != id;
            if !keep {
                *bytes -= b.len() as u64;
            }
            keep
        });
    }
}

/// What a core holds for tiered storage (shared with its read-ahead tasks).
pub struct TierState {
    pub(crate) chunks: RefCell<Chunks>,
    /// Chunks being read: the reads waiting for each.
    pub(crate) loading: RefCell<HashMap<ChunkKey, Vec<oneshot::Sender<()>>>>,
    pub(crate) indexes: RefCell<HashMap<[u8; 16], Rc<RemoteIndexes>>>,
    pub(crate) reads: glommio::sync::Semaphore,
    /// When each tiered partition's remote folder was last swept of
    /// orphaned objects.
    pub(crate) swept: RefCell<HashMap<(String, u32), std::time::Instant>>,
    /// Each tiered partition's producers' state at the end of the last
    /// segment this core uploaded (where its next upload starts).
    pub(crate) producers:
        RefCell<HashMap<(String, u32), (u64, weir_storage::producer_state::ProducerStateTable)>>,
    /// Counters.
    pub counters: TierCounters,
}

impl Default for TierState {
    fn default() -> Self {
        TierState {
            chunks: Default::default(),
            loading: Default::default(),
            indexes: Default::default(),
            reads: glommio::sync::Semaphore::new(READS_IN_FLIGHT),
            swept: Default::default(),
            producers: Default::default(),
            counters: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_stay_within_their_budget_least_recently_used_first() {
        let mut c = Chunks::default();
        let chunk = Bytes::from(vec![0u8; (CHUNK_BYTES) as usize]);
        let n = CACHE_BYTES / CHUNK_BYTES;
        for i in 0..n {
            c.put(([1; 16], i), chunk.clone());
        }
        assert!(c.get(&([1; 16], 0)).is_some());
        c.put(([2; 16], 0), chunk.clone());
        assert!(c.bytes <= CACHE_BYTES);
        assert!(c.contains(&([1; 16], 0)), "recently used: kept");
        assert!(!c.contains(&([1; 16], 1)), "least recently used: evicted");
        c.forget(&[1; 16]);
        assert_eq!(c.bytes, CHUNK_BYTES);
    }
}
