//! The leader-epoch cache of one partition: for every leader epoch that
//! wrote to the log, the offset of its first batch (Kafka's
//! `leader-epoch-checkpoint`). A follower that lost track of its leader
//! asks the new leader where its last epoch ends there, and truncates what
//! it holds past that point (a tail the old leader wrote but never got
//! replicated) before fetching again.
//!
//! On disk: `leader-epoch-checkpoint` in the partition's directory, one
//! `EPOCH START-OFFSET` line per epoch in ascending order, replaced
//! atomically (temporary file, fsync, rename, directory fsync) whenever an
//! epoch is added or the log is truncated below an epoch's start. A new
//! epoch's entry is made durable before the first batch of that epoch is
//! appended, so the file may name an epoch whose batch never reached the
//! disk (dropped on open: its start is past the log end) but never misses
//! one whose batch did.

use std::path::Path;

use crate::checkpoint;
use crate::error::{Result, StorageError};

/// The file's name in the partition directory.
pub const FILE: &str = "leader-epoch-checkpoint";

/// Epoch → start offset, ascending in both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpochCache {
    entries: Vec<(u32, u64)>,
}

impl EpochCache {
    /// Reads the cache of the partition in `dir` (empty if there is none),
    /// dropping epochs that start at or past `log_end` (their first batch
    /// never reached the disk).
    pub fn load(dir: &Path, log_end: u64) -> Result<EpochCache> {
        let path = dir.join(FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(EpochCache::default()),
            Err(e) => return Err(StorageError::io("read", &path, e)),
        };
        let mut entries: Vec<(u32, u64)> = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let mut it = line.split_whitespace();
            let parsed = match (it.next(), it.next(), it.next()) {
                (Some(e), Some(o), None) => e.parse::<u32>().ok().zip(o.parse::<u64>().ok()),
                _ => None,
            };
            let Some((epoch, start)) = parsed else {
                return Err(StorageError::io(
                    "parse",
                    &path,
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("not `EPOCH START-OFFSET`: {line:?}"),
                    ),
                ));
            };
            if entries
                .last()
                .is_some_and(|&(e, s)| epoch <= e || start < s)
            {
                return Err(StorageError::io(
                    "parse",
                    &path,
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("epochs and offsets must ascend: {line:?}"),
                    ),
                ));
            }
            entries.push((epoch, start));
        }
        entries.retain(|&(_, start)| start < log_end);
        Ok(EpochCache { entries })
    }

    /// The file's text.
    fn encode(&self) -> Vec<u8> {
        let mut out = String::new();
        for (e, s) in &self.entries {
            out.push_str(&format!("{e} {s}\n"));
        }
        out.into_bytes()
    }

    /// Writes the cache to `dir` durably (on the blocking pool).
    pub async fn store(&self, dir: &Path) -> Result<()> {
        checkpoint::write_atomic_async(dir, FILE, self.encode()).await
    }

    /// The newest epoch and its start offset.
    pub fn latest(&self) -> Option<(u32, u64)> {
        self.entries.last().copied()
    }

    /// Every entry, oldest first.
    pub fn entries(&self) -> &[(u32, u64)] {
        &self.entries
    }

    /// Records that `epoch` starts at `start` (the offset of its first
    /// batch). Returns whether the cache changed (an epoch not newer than
    /// the latest is ignored).
    pub fn assign(&mut self, epoch: u32, start: u64) -> bool {
        match self.entries.last() {
            Some(&(e, _)) if epoch <= e => false,
            _ => {
                self.entries.push((epoch, start));
                true
            }
        }
    }

    /// Forgets every epoch that starts at or after `log_end` (the log was
    /// truncated there). Returns whether the cache changed.
    pub fn truncate(&mut self, log_end: u64) -> bool {
        let before = self.entries.len();
        self.entries.retain(|&(_, s)| s < log_end);
        self.entries.len() != before
    }

    /// Where `epoch` ends in this log, as Kafka's OffsetForLeaderEpoch
    /// answers: the largest epoch at or below `epoch` and the offset after
    /// its last batch (the next epoch's start, or `log_end` for the
    /// latest). `None` if every epoch here is newer than `epoch`, or none
    /// is known.
    pub fn end_offset_for(&self, epoch: u32, log_end: u64) -> Option<(u32, u64)> {
        end_offset_in(&self.entries, epoch, log_end)
    }
}

/// [`EpochCache::end_offset_for`] over a copy of a cache's entries
/// (`(epoch, start offset)`, ascending), as another core holds them.
pub fn end_offset_in(entries: &[(u32, u64)], epoch: u32, log_end: u64) -> Option<(u32, u64)> {
    let i = entries.iter().rposition(|&(e, _)| e <= epoch)?;
    let end = entries.get(i + 1).map_or(log_end, |&(_, s)| s);
    Some((entries[i].0, end))
}

/// The epoch that wrote the batch holding `offset`: the newest among
/// `entries` that starts at or before it (`None` before the first).
pub fn epoch_at(entries: &[(u32, u64)], offset: u64) -> Option<u32> {
    entries
        .iter()
        .rev()
        .find(|&&(_, start)| start <= offset)
        .map(|&(e, _)| e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_answer_where_they_end_and_survive_a_reload() {
        let mut c = EpochCache::default();
        assert!(c.assign(0, 0));
        assert!(c.assign(3, 10));
        assert!(!c.assign(3, 12), "not newer");
        assert!(!c.assign(2, 12), "older");
        assert!(c.assign(5, 20));
        assert_eq!(c.end_offset_for(0, 30), Some((0, 10)));
        assert_eq!(
            c.end_offset_for(1, 30),
            Some((0, 10)),
            "largest at or below"
        );
        assert_eq!(c.end_offset_for(4, 30), Some((3, 20)));
        assert_eq!(c.end_offset_for(5, 30), Some((5, 30)));
        assert_eq!(c.end_offset_for(9, 30), Some((5, 30)));
        let newer_only = EpochCache {
            entries: vec![(4, 0)],
        };
        assert_eq!(newer_only.end_offset_for(3, 5), None);
        assert_eq!(epoch_at(&c.entries, 0), Some(0));
        assert_eq!(epoch_at(&c.entries, 19), Some(3));
        assert_eq!(epoch_at(&c.entries, 20), Some(5));
        assert_eq!(epoch_at(&newer_only.entries, 0), Some(4));
        assert_eq!(epoch_at(&[], 7), None);

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), c.encode()).unwrap();
        assert_eq!(EpochCache::load(dir.path(), 30).unwrap(), c);
        // Epoch 5's first batch never reached the disk.
        let cut = EpochCache::load(dir.path(), 20).unwrap();
        assert_eq!(cut.latest(), Some((3, 10)));
        assert!(c.truncate(15));
        assert_eq!(c.latest(), Some((3, 10)));
        assert!(!c.truncate(15));
    }

    #[test]
    fn a_damaged_file_is_an_error_not_an_empty_cache() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["1 0\n0 5\n", "1\n", "x 0\n", "1 5\n2 3\n"] {
            std::fs::write(dir.path().join(FILE), bad).unwrap();
            assert!(EpochCache::load(dir.path(), 100).is_err(), "{bad:?}");
        }
        std::fs::remove_file(dir.path().join(FILE)).unwrap();
        assert_eq!(
            EpochCache::load(dir.path(), 100).unwrap(),
            EpochCache::default()
        );
    }
}
