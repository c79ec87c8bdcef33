//! The records consumer groups keep in `__consumer_offsets`: keys and
//! values of committed offsets and of group metadata, in an explicit
//! big-endian binary layout with a version byte (specified in
//! `docs/storage-format.md`).
//!
//! Every record has a key; the latest record of a key wins when the
//! partition is replayed, and a record with a null value (a tombstone)
//! deletes the key, so the topic can be compacted.

use std::collections::{BTreeMap, BTreeSet};

use bytes::{BufMut, Bytes, BytesMut};

use crate::groups::consumer::Member;

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
    /// One member of a consumer group: its epochs, subscription,
    /// assignment, revoking partitions and target (kind 2).
    Member {
        /// The group id.
        group: String,
        /// The member id.
        member: String,
    },
    /// A classic group's state: generation, protocol, leader, members and
    /// their assignments (kind 3).
    Classic {
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

/// A consumer group's metadata, as stored: its epochs and assignor (its
/// members are records of their own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupValue {
    /// The group epoch (the last one handed out: never reused).
    pub group_epoch: i32,
    /// The epoch of the target assignment.
    pub assignment_epoch: i32,
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
    fn i32(&mut self) -> Result<i32, RecordError> {
        Ok(self.u32()? as i32)
    }
    fn tp(&mut self) -> Result<(String, u32), RecordError> {
        Ok((self.string()?, self.u32()?))
    }
    /// A count of items each at least `min` bytes long: never more than
    /// the bytes left could hold.
    fn count(&mut self, min: usize) -> Result<usize, RecordError> {
        let n = self.u32()? as usize;
        if n > self.0.len() / min {
            return Err(RecordError(format!(
                "{n} items cannot fit in {} bytes",
                self.0.len()
            )));
        }
        Ok(n)
    }
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
            RecordKey::Offset { group, .. }
            | RecordKey::Group { group }
            | RecordKey::Member { group, .. }
            | RecordKey::Classic { group } => group,
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
            RecordKey::Member { group, member } => {
                out.put_u8(2);
                put_str(&mut out, group);
                put_str(&mut out, member);
            }
            RecordKey::Classic { group } => {
                out.put_u8(3);
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
            2 => RecordKey::Member {
                group,
                member: r.string()?,
            },
            3 => RecordKey::Classic { group },
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
    /// `[version u8 = 1][group_epoch i32][assignment_epoch i32][assignor:
    /// u16 len + bytes]`. Version 0 (`[0][generation i32][assignor]`,
    /// written before epochs) decodes with both epochs = generation.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        out.put_u8(1);
        out.put_i32(self.group_epoch);
        out.put_i32(self.assignment_epoch);
        put_str(&mut out, &self.assignor);
        out.freeze()
    }

    /// Decodes a value.
    pub fn decode(b: &[u8]) -> Result<GroupValue, RecordError> {
        let mut r = Reader(b);
        let (group_epoch, assignment_epoch) = match r.u8()? {
            0 => {
                let g = r.i32()?;
                (g, g)
            }
            1 => (r.i32()?, r.i32()?),
            v => return Err(RecordError(format!("unknown version {v}"))),
        };
        let assignor = r.string()?;
        r.end()?;
        Ok(GroupValue {
            group_epoch,
            assignment_epoch,
            assignor,
        })
    }
}

fn put_tps<'a>(
    out: &mut BytesMut,
    tps: impl ExactSizeIterator<Item = (&'a (String, u32), Option<i32>)>,
) {
    out.put_u32(tps.len() as u32);
    for ((t, p), e) in tps {
        put_str(out, t);
        out.put_u32(*p);
        if let Some(e) = e {
            out.put_i32(e);
        }
    }
}

/// A consumer-group member's record value: `[version u8 = 0][epoch
/// i32][previous_epoch i32][has_instance u8][instance?][client_id]
/// [session_timeout_ms u32][rebalance_timeout_ms u32][topics: u32 n, n ×
/// str][assigned: u32 n, n × (topic, partition u32, epoch i32)][revoking:
/// same][target: u32 n, n × (topic, partition u32)]`; strings are u16
/// length + UTF-8 bytes.
pub fn encode_member(m: &Member) -> Bytes {
    let mut out = BytesMut::new();
    out.put_u8(RECORD_VERSION);
    out.put_i32(m.epoch);
    out.put_i32(m.previous_epoch);
    match &m.instance_id {
        Some(i) => {
            out.put_u8(1);
            put_str(&mut out, i);
        }
        None => out.put_u8(0),
    }
    put_str(&mut out, &m.client_id);
    out.put_u32(m.session_timeout_ms);
    out.put_u32(m.rebalance_timeout_ms);
    out.put_u32(m.topics.len() as u32);
    for t in &m.topics {
        put_str(&mut out, t);
    }
    put_tps(&mut out, m.assigned.iter().map(|(tp, e)| (tp, Some(*e))));
    put_tps(&mut out, m.revoking.iter().map(|(tp, e)| (tp, Some(*e))));
    put_tps(&mut out, m.target.iter().map(|tp| (tp, None)));
    out.freeze()
}

/// Decodes a member's record value (its session starts at load).
pub fn decode_member(b: &[u8]) -> Result<Member, RecordError> {
    let mut r = Reader(b);
    version(&mut r)?;
    let epoch = r.i32()?;
    let previous_epoch = r.i32()?;
    let instance_id = match r.u8()? {
        0 => None,
        _ => Some(r.string()?),
    };
    let client_id = r.string()?;
    let session_timeout_ms = r.u32()?;
    let rebalance_timeout_ms = r.u32()?;
    let mut topics = BTreeSet::new();
    for _ in 0..r.count(2)? {
        topics.insert(r.string()?);
    }
    let with_epochs = |r: &mut Reader<'_>| -> Result<BTreeMap<(String, u32), i32>, RecordError> {
        let mut out = BTreeMap::new();
        for _ in 0..r.count(10)? {
            let tp = r.tp()?;
            out.insert(tp, r.i32()?);
        }
        Ok(out)
    };
    let assigned = with_epochs(&mut r)?;
    let revoking = with_epochs(&mut r)?;
    let mut target = BTreeSet::new();
    for _ in 0..r.count(6)? {
        target.insert(r.tp()?);
    }
    r.end()?;
    Ok(Member {
        epoch,
        previous_epoch,
        instance_id,
        client_id,
        topics,
        session_timeout_ms,
        rebalance_timeout_ms,
        assigned,
        revoking,
        target,
        last_heartbeat_ms: 0,
        revoke_deadline_ms: None,
    })
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
            group_epoch: 9,
            assignment_epoch: 8,
            assignor: "range".into(),
        };
        assert_eq!(GroupValue::decode(&g.encode()).unwrap(), g);
        // Written before epochs: both epochs are the generation.
        let old = [0, 0, 0, 0, 7, 0, 5, b'r', b'a', b'n', b'g', b'e'];
        let d = GroupValue::decode(&old).unwrap();
        assert_eq!(
            (d.group_epoch, d.assignment_epoch, d.assignor.as_str()),
            (7, 7, "range")
        );
        let m = Member {
            epoch: 4,
            previous_epoch: 2,
            instance_id: Some("i".into()),
            client_id: "c".into(),
            topics: ["t".to_string()].into(),
            session_timeout_ms: 100,
            rebalance_timeout_ms: 200,
            assigned: [(("t".to_string(), 1), 4)].into(),
            revoking: [(("t".to_string(), 0), 2)].into(),
            target: [("t".to_string(), 1)].into(),
            last_heartbeat_ms: 0,
            revoke_deadline_ms: None,
        };
        let bytes = encode_member(&m);
        assert_eq!(decode_member(&bytes).unwrap(), m);
        for n in 0..bytes.len() {
            assert!(decode_member(&bytes[..n]).is_err());
        }
        for k in [
            RecordKey::Member {
                group: "g".into(),
                member: "m".into(),
            },
            RecordKey::Classic { group: "g".into() },
        ] {
            assert_eq!(RecordKey::decode(&k.encode()).unwrap(), k);
        }
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
