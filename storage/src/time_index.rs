//! The sparse time index (`.timeindex`): timestamp → relative offset.
//!
//! Each entry is 12 bytes, big endian: `max_timestamp: i64` and
//! `relative_offset: u32`. An entry `(T, r)` is written at the same index
//! points as the offset index and means: *every record in the batches up to
//! and including the batch at relative offset `r` has a timestamp `<= T`*.
//! So `T` never decreases, and the last entry of a closed segment (written
//! for its last batch) holds the segment's largest timestamp.
//!
//! Lookup for "first record with timestamp >= t": the last entry with
//! `T < t` proves everything up to its batch is older, so a scan may start
//! there; with no such entry it starts at the segment's first batch.

/// Bytes per entry.
pub const ENTRY_BYTES: usize = 12;

/// The in-memory copy of one segment's time index.
#[derive(Debug, Default, Clone)]
pub struct TimeIndex {
    entries: Vec<(i64, u32)>,
}

impl TimeIndex {
    /// Decodes a file's bytes, keeping the prefix where relative offsets
    /// strictly increase and timestamps do not decrease.
    pub fn decode(bytes: &[u8]) -> Self {
        let mut entries: Vec<(i64, u32)> = Vec::with_capacity(bytes.len() / ENTRY_BYTES);
        for chunk in bytes.chunks_exact(ENTRY_BYTES) {
            let ts = i64::from_be_bytes(chunk[0..8].try_into().expect("8 bytes"));
            let rel = u32::from_be_bytes(chunk[8..12].try_into().expect("4 bytes"));
            if let Some(&(t, r)) = entries.last() {
                if rel <= r || ts < t {
                    break;
                }
            }
            entries.push((ts, rel));
        }
        TimeIndex { entries }
    }

    /// Encodes one entry.
    pub fn encode_entry(ts: i64, rel: u32) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[0..8].copy_from_slice(&ts.to_be_bytes());
        b[8..12].copy_from_slice(&rel.to_be_bytes());
        b
    }

    /// Encodes every entry (the whole file).
    pub fn encode_all(&self) -> Vec<u8> {
        self.entries
            .iter()
            .flat_map(|&(t, r)| Self::encode_entry(t, r))
            .collect()
    }

    /// Adds an entry; returns false (and adds nothing) if it breaks the order.
    pub fn push(&mut self, ts: i64, rel: u32) -> bool {
        if let Some(&(t, r)) = self.entries.last() {
            if rel <= r || ts < t {
                return false;
            }
        }
        self.entries.push((ts, rel));
        true
    }

    /// The relative offset of the last entry with timestamp `< ts`.
    pub fn last_older_than(&self, ts: i64) -> Option<u32> {
        let i = self.entries.partition_point(|&(t, _)| t < ts);
        i.checked_sub(1).map(|i| self.entries[i].1)
    }

    /// Keeps only the first `n` entries.
    pub fn truncate(&mut self, n: usize) {
        self.entries.truncate(n);
    }

    /// All entries.
    pub fn entries(&self) -> &[(i64, u32)] {
        &self.entries
    }

    /// The last entry.
    pub fn last(&self) -> Option<(i64, u32)> {
        self.entries.last().copied()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_returns_last_entry_strictly_older() {
        let mut ix = TimeIndex::default();
        assert!(ix.push(100, 0));
        assert!(ix.push(100, 5));
        assert!(ix.push(250, 9));
        assert!(!ix.push(200, 12));
        assert_eq!(ix.last_older_than(100), None);
        assert_eq!(ix.last_older_than(101), Some(5));
        assert_eq!(ix.last_older_than(1000), Some(9));
        let mut bytes = ix.encode_all();
        bytes.extend_from_slice(&[0u8; 100]);
        assert_eq!(TimeIndex::decode(&bytes).entries(), ix.entries());
    }
}
