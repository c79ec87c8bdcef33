//! The sparse offset index (`.index`): relative offset → file position.
//!
//! Each entry is 8 bytes, big endian: `relative_offset: u32` (offset minus
//! the segment's base offset) and `position: u32` (byte position of the batch
//! in the `.log` file). An entry is written for the first batch of a
//! segment, then whenever `index.interval.bytes` of log have been appended
//! since the previous entry, and for the last batch when the segment is
//! closed. Entries strictly increase in both fields.
//!
//! The file is written with direct I/O in whole blocks, so after a crash it
//! may end in zero padding or stale entries: [`OffsetIndex::decode`] keeps
//! the strictly increasing prefix, and recovery checks the last entry
//! against the log.

/// Bytes per entry.
pub const ENTRY_BYTES: usize = 8;

/// The in-memory copy of one segment's offset index.
#[derive(Debug, Default, Clone)]
pub struct OffsetIndex {
    entries: Vec<(u32, u32)>,
}

impl OffsetIndex {
    /// Decodes a file's bytes, keeping the strictly increasing prefix.
    pub fn decode(bytes: &[u8]) -> Self {
        let mut entries: Vec<(u32, u32)> = Vec::with_capacity(bytes.len() / ENTRY_BYTES);
        for chunk in bytes.chunks_exact(ENTRY_BYTES) {
            let rel = u32::from_be_bytes(chunk[0..4].try_into().expect("4 bytes"));
            let pos = u32::from_be_bytes(chunk[4..8].try_into().expect("4 bytes"));
            if let Some(&(r, p)) = entries.last() {
                if rel <= r || pos <= p {
                    break;
                }
            }
            entries.push((rel, pos));
        }
        OffsetIndex { entries }
    }

    /// Encodes one entry.
    pub fn encode_entry(rel: u32, pos: u32) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[0..4].copy_from_slice(&rel.to_be_bytes());
        b[4..8].copy_from_slice(&pos.to_be_bytes());
        b
    }

    /// Encodes every entry (the whole file).
    pub fn encode_all(&self) -> Vec<u8> {
        self.entries
            .iter()
            .flat_map(|&(r, p)| Self::encode_entry(r, p))
            .collect()
    }

    /// Adds an entry; returns false (and adds nothing) if it would not
    /// strictly increase.
    pub fn push(&mut self, rel: u32, pos: u32) -> bool {
        if let Some(&(r, p)) = self.entries.last() {
            if rel <= r || pos <= p {
                return false;
            }
        }
        self.entries.push((rel, pos));
        true
    }

    /// The entry with the largest relative offset `<= rel`.
    pub fn lookup(&self, rel: u32) -> Option<(u32, u32)> {
        let i = self.entries.partition_point(|&(r, _)| r <= rel);
        i.checked_sub(1).map(|i| self.entries[i])
    }

    /// Keeps only the first `n` entries.
    pub fn truncate(&mut self, n: usize) {
        self.entries.truncate(n);
    }

    /// Number of entries whose position is below `pos`.
    pub fn count_below_position(&self, pos: u32) -> usize {
        self.entries.partition_point(|&(_, p)| p < pos)
    }

    /// All entries.
    pub fn entries(&self) -> &[(u32, u32)] {
        &self.entries
    }

    /// The last entry.
    pub fn last(&self) -> Option<(u32, u32)> {
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
    fn decode_stops_at_padding_and_lookup_finds_floor() {
        let mut ix = OffsetIndex::default();
        assert!(ix.push(0, 0));
        assert!(ix.push(10, 4100));
        assert!(ix.push(25, 9000));
        assert!(!ix.push(25, 9999));
        let mut bytes = ix.encode_all();
        bytes.extend_from_slice(&[0u8; 4096 - 24]);
        let back = OffsetIndex::decode(&bytes);
        assert_eq!(back.entries(), ix.entries());
        assert_eq!(back.lookup(9), Some((0, 0)));
        assert_eq!(back.lookup(10), Some((10, 4100)));
        assert_eq!(back.lookup(1000), Some((25, 9000)));
        assert_eq!(back.count_below_position(9000), 2);
    }
}
