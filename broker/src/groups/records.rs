//! The records consumer groups keep in `__consumer_offsets`: keys and
//! values of committed offsets and of group metadata, in an explicit
//! big-endian binary layout with a version byte (specified in
//! `docs/storage-format.md`).
//!
//! Every record has a key; the latest record of a key wins when the
//! partition is replayed, and a record with a null value (a tombstone)
//! deletes the key, so the topic can be compacted.

use bytes::{BufMut, Bytes, BytesMut};

pub use crate::metadata::OFFSETS_TOPIC;
/// Version of the key and value layouts written by this build.
pub const RECORD_VERSION: u8 = 0;
/// Longest group id, bytes.
pub const GROUP_ID_BYTES_MAX: usize = 255;
/// Longest metadata string stored with an offset, bytes.
pub const OFFSET_METADATA_BYTES_MAX: usize = 4096;

/// What a record is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKey {
    /// The committed offset of one partition for a group (kind 0).
    Offset {
        /// The group id.
        group: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
    },
    /// A group's metadata (kind 1).
    Group {
        /// The group id.
        group: String,
    },
}

/// A committed offset, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetValue {
    /// The next offset to consume.
    pub offset: u64,
    /// When it was committed (ms since the epoch).
    pub commit_timestamp: i64,
    /// The client's metadata string.
    pub metadata: Option<String>,
}

/// A group's metadata, as stored: enough to keep generations growing
/// across restarts (members are not stored: they rejoin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupValue {
    /// The last generation handed out.
    pub generation: i32,
    /// The group's assignor.
    pub assignor: String,
}

/// A record that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed __consumer_offsets record: {0}")]
pub struct RecordError(pub String);

fn put_str(out: &mut BytesMut, s: &str) {
    out.put_u16(s.len() as u16);
    out.put_slice(s.as_bytes());
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        if self.0.len() < n {
            return Err(RecordError(format!(
                "needs {n} more bytes, has {}",
                self.0.len()
            )));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, RecordError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, RecordError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, RecordError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn string(&mut self) -> Result<String, RecordError> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| RecordError("not UTF-8".into()))
    }
    fn end(&self) -> Result<(), RecordError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(RecordError(format!("{} trailing bytes", self.0.len())))
        }
    }
}

fn version(r: &mut Reader<'_>) -> Result<(), RecordError> {
    match r.u8()? {
        RECORD_VERSION => Ok(()),
        v => Err(RecordError(format!("unknown version {v}"))),
    }
}

impl RecordKey {
    /// The group the record belongs to.
    pub fn group(&self) -> &str {
        match self {
            RecordKey::Offset { group, .. } | RecordKey::Group { group } => group,
        }
    }

    /// `[version u8][kind u8][group: u16 len + bytes]`, then for an offset
    /// `[topic: u16 len + bytes][partition u32]`.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        out.put_u8(RECORD_VERSION);
        match self {
            RecordKey::Offset {
                group,
                topic,
                partition,
            } => {
                out.put_u8(0);
                put_str(&mut out, group);
                put_str(&mut out, topic);
                out.put_u32(*partition);
            }
            RecordKey::Group { group } => {
                out.put_u8(1);
                put_str(&mut out, group);
            }
        }
        out.freeze()
    }

    /// Decodes a key.
    pub fn decode(b: &[u8]) -> Result<RecordKey, RecordError> {
        let mut r = Reader(b);
        version(&mut r)?;
        let kind = r.u8()?;
        let group = r.string()?;
        let key = match kind {
            0 => RecordKey::Offset {
                group,
                topic: r.string()?,
                partition: r.u32()?,
            },
            1 => RecordKey::Group { group },
            k => return Err(RecordError(format!("unknown kind {k}"))),
        };
        r.end()?;
        Ok(key)
    }
}

impl OffsetValue {
    /// `[version u8][offset u64][commit_timestamp i64][has_metadata u8]`
    /// then, if present, `[metadata: u16 len + bytes]`.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        out.put_u8(RECORD_VERSION);
        out.put_u64(self.offset);
        out.put_i64(self.commit_timestamp);
        match &self.metadata {
            Some(m) => {
                out.put_u8(1);
                put_str(&mut out, m);
            }
            None => out.put_u8(0),
        }
        out.freeze()
    }

    /// Decodes a value.
    pub fn decode(b: &[u8]) -> Result<OffsetValue, RecordError> {
        let mut r = Reader(b);
        version(&mut r)?;
        let offset = r.u64()?;
        let commit_timestamp = r.u64()? as i64;
        let metadata = match r.u8()? {
            0 => None,
            _ => Some(r.string()?),
        };
        r.end()?;
        Ok(OffsetValue {
            offset,
            commit_timestamp,
            metadata,
        })
    }
}

impl GroupValue {
    /// `[version u8][generation i32][assignor: u16 len + bytes]`.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        out.put_u8(RECORD_VERSION);
        out.put_i32(self.generation);
        put_str(&mut out, &self.assignor);
        out.freeze()
    }

    /// Decodes a value.
    pub fn decode(b: &[u8]) -> Result<GroupValue, RecordError> {
        let mut r = Reader(b);
        version(&mut r)?;
        let generation = r.u32()? as i32;
        let assignor = r.string()?;
        r.end()?;
        Ok(GroupValue {
            generation,
            assignor,
        })
    }
}

/// The `__consumer_offsets` partition that holds a group (and whose owner
/// core coordinates it): CRC32C of the id modulo the partition count.
pub fn partition_for(group: &str, partitions: u32) -> u32 {
    crc32c::crc32c(group.as_bytes()) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_round_trip() {
        for k in [
            RecordKey::Offset {
                group: "g".into(),
                topic: "orders".into(),
                partition: 7,
            },
            RecordKey::Group { group: "g2".into() },
        ] {
            assert_eq!(RecordKey::decode(&k.encode()).unwrap(), k);
        }
        for v in [
            OffsetValue {
                offset: 42,
                commit_timestamp: 1_700_000_000_000,
                metadata: Some("m".into()),
            },
            OffsetValue {
                offset: 0,
                commit_timestamp: -1,
                metadata: None,
            },
        ] {
            assert_eq!(OffsetValue::decode(&v.encode()).unwrap(), v);
        }
        let g = GroupValue {
            generation: 9,
            assignor: "range".into(),
        };
        assert_eq!(GroupValue::decode(&g.encode()).unwrap(), g);
    }

    #[test]
    fn malformed_records_are_errors_not_panics() {
        let k = RecordKey::Group { group: "g".into() }.encode();
        for n in 0..k.len() {
            assert!(RecordKey::decode(&k[..n]).is_err());
        }
        let mut long = k.to_vec();
        long.push(0);
        assert!(RecordKey::decode(&long).is_err());
        assert!(RecordKey::decode(&[9, 0, 0, 0]).is_err());
        assert!(OffsetValue::decode(&[0, 1, 2]).is_err());
    }
}
