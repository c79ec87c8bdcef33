//! The per-core batch cache.
//!
//! Segments are read and written with direct I/O, so the kernel's page cache
//! does not help; each core keeps this cache instead. It holds whole batches
//! as shared [`Bytes`] (a hit is a reference-count increment, never a copy):
//! every appended batch (the tail that tailing consumers read) and the
//! batches brought in by cold reads (read-ahead). Eviction is first in,
//! first out within a byte budget.
//!
//! Owned by one core's [`crate::StorageShard`]; never shared across threads.

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;

/// Default budget of one core's cache.
pub const CACHE_BYTES_PER_CORE_DEFAULT: u64 = 256 << 20;

#[derive(Debug)]
struct Entry {
    last_offset: u64,
    data: Bytes,
    seq: u64,
}

/// A cached batch.
#[derive(Debug, Clone)]
pub struct CachedBatch {
    /// Offset of its first record.
    pub base_offset: u64,
    /// Offset of its last record.
    pub last_offset: u64,
    /// The batch bytes, as stored.
    pub data: Bytes,
}

/// Hit and miss counters, and occupancy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that went to disk.
    pub misses: u64,
    /// Bytes held.
    pub bytes: u64,
    /// The budget.
    pub budget: u64,
}

/// One core's cache of batches, keyed by (log id, base offset).
#[derive(Debug)]
pub struct BatchCache {
    budget: u64,
    used: u64,
    logs: HashMap<u64, BTreeMap<u64, Entry>>,
    fifo: VecDeque<(u64, u64, u64)>,
    live: usize,
    seq: u64,
    hits: u64,
    misses: u64,
}

impl BatchCache {
    /// An empty cache holding at most `budget` bytes.
    pub fn new(budget: u64) -> Self {
        BatchCache {
            budget,
            used: 0,
            logs: HashMap::new(),
            fifo: VecDeque::new(),
            live: 0,
            seq: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits,
            misses: self.misses,
            bytes: self.used,
            budget: self.budget,
        }
    }

    /// Inserts (or replaces) a batch. Batches larger than the budget are not kept.
    pub fn insert(&mut self, log: u64, base_offset: u64, last_offset: u64, data: Bytes) {
        let len = data.len() as u64;
        if len > self.budget {
            return;
        }
        self.seq += 1;
        let seq = self.seq;
        let map = self.logs.entry(log).or_default();
        if let Some(old) = map.insert(
            base_offset,
            Entry {
                last_offset,
                data,
                seq,
            },
        ) {
            self.used -= old.data.len() as u64;
        } else {
            self.live += 1;
        }
        self.used += len;
        self.fifo.push_back((log, base_offset, seq));
        self.evict();
    }

    /// The batch that contains `offset`, counting a hit or a miss.
    pub fn get(&mut self, log: u64, offset: u64) -> Option<CachedBatch> {
        let found = self.peek(log, offset);
        self.count(found.is_some());
        found
    }

    /// Counts a read answered from the cache (`hit`) or from disk.
    pub fn count(&mut self, hit: bool) {
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
    }

    /// The batch that contains `offset`, without counting.
    pub fn peek(&self, log: u64, offset: u64) -> Option<CachedBatch> {
        let map = self.logs.get(&log)?;
        let (&base, e) = map.range(..=offset).next_back()?;
        (e.last_offset >= offset).then(|| CachedBatch {
            base_offset: base,
            last_offset: e.last_offset,
            data: e.data.clone(),
        })
    }

    /// The cached batch starting exactly at `base_offset`.
    pub fn get_exact(&self, log: u64, base_offset: u64) -> Option<CachedBatch> {
        let e = self.logs.get(&log)?.get(&base_offset)?;
        Some(CachedBatch {
            base_offset,
            last_offset: e.last_offset,
            data: e.data.clone(),
        })
    }

    /// Drops every batch of `log` whose last offset is `>= offset`.
    pub fn remove_from(&mut self, log: u64, offset: u64) {
        self.remove_where(log, |base, last| base >= offset || last >= offset);
    }

    /// Drops every batch of `log` whose last offset is `< offset`.
    pub fn remove_below(&mut self, log: u64, offset: u64) {
        self.remove_where(log, |_, last| last < offset);
    }

    /// Drops every batch of `log`.
    pub fn remove_log(&mut self, log: u64) {
        if let Some(map) = self.logs.remove(&log) {
            for e in map.values() {
                self.used -= e.data.len() as u64;
                self.live -= 1;
            }
        }
        self.compact_fifo();
    }

    /// Drops the batches of `log` that hold offsets in `[from, to)`.
    pub fn remove_range(&mut self, log: u64, from: u64, to: u64) {
        self.remove_where(log, |base, last| base < to && last >= from);
    }

    fn remove_where(&mut self, log: u64, drop: impl Fn(u64, u64) -> bool) {
        let Some(map) = self.logs.get_mut(&log) else {
            return;
        };
        let mut freed = 0;
        let mut n = 0;
        map.retain(|&base, e| {
            let d = drop(base, e.last_offset);
            if d {
                freed += e.data.len() as u64;
                n += 1;
            }
            !d
        });
        self.used -= freed;
        self.live -= n;
        self.compact_fifo();
    }

    fn evict(&mut self) {
        while self.used > self.budget {
            let Some((log, base, seq)) = self.fifo.pop_front() else {
                break;
            };
            if let Some(map) = self.logs.get_mut(&log) {
                if map.get(&base).is_some_and(|e| e.seq == seq) {
                    let e = map.remove(&base).expect("present");
                    self.used -= e.data.len() as u64;
                    self.live -= 1;
                }
            }
        }
        self.compact_fifo();
    }

    /// Keeps the FIFO from growing with entries that were removed by
    /// truncation or replaced.
    fn compact_fifo(&mut self) {
        if self.fifo.len() > 2 * self.live + 1024 {
            let logs = &self.logs;
            self.fifo.retain(|(log, base, seq)| {
                logs.get(log)
                    .and_then(|m| m.get(base))
                    .is_some_and(|e| e.seq == *seq)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_oldest_first_within_budget() {
        let mut c = BatchCache::new(100);
        for i in 0..5u64 {
            c.insert(1, i * 10, i * 10 + 9, Bytes::from(vec![0u8; 30]));
        }
        assert!(c.stats().bytes <= 100);
        assert!(c.get(1, 5).is_none());
        assert_eq!(c.get(1, 45).unwrap().base_offset, 40);
        assert_eq!(c.stats().hits, 1);
        assert_eq!(c.stats().misses, 1);
        c.remove_from(1, 35);
        assert!(c.peek(1, 45).is_none());
        assert!(c.peek(1, 25).is_some());
        c.remove_log(1);
        assert_eq!(c.stats().bytes, 0);
    }
}
