//! The records consumer groups keep in `__consumer_offsets`, in Apache
//! Kafka's own format where Kafka has the record, so that anything that
//! reads the topic as Kafka's (lag monitors, `kafka-console-consumer
//! --formatter`, Burrow) reads Weir's unchanged (specified in
//! `docs/storage-format.md`):
//!
//! * a key is an `int16` record type and the key's fields; a value is an
//!   `int16` version and the value's fields; strings are `int16` length +
//!   UTF-8 (-1: null), bytes `int32` length + bytes, integers big-endian;
//! * committed offsets: Kafka's `OffsetCommitKey` (type 1) and
//!   `OffsetCommitValue` v3, as Kafka 4.0 writes them;
//! * classic groups: Kafka's `GroupMetadataKey` (type 2) and
//!   `GroupMetadataValue` v3, as Kafka 4.x writes them;
//! * KIP-848 groups and members: Weir's own layouts under record types
//!   Kafka does not define ([`WEIR_CONSUMER_GROUP_KEY`],
//!   [`WEIR_CONSUMER_MEMBER_KEY`]), which Kafka's readers skip (its
//!   loaders log an unknown key and go on; Burrow skips unknown types).
//!
//! Every record has a key; the latest record of a key wins when the
//! partition is replayed, and a record with a null value (a tombstone)
//! deletes the key, so the topic can be compacted.
//!
//! Data directories written before this format (Weir's first layout: a
//! `u8` version 0 and a `u8` kind in front of each key) are read too: see
//! [`decode_record`].

use std::collections::{BTreeMap, BTreeSet};

use bytes::{BufMut, Bytes, BytesMut};

use crate::classic::{Snapshot, SnapshotMember, SnapshotState};
use crate::consumer::Member;

/// The internal topic the group records live in (Kafka's name).
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
/// Longest group id, bytes.
pub const GROUP_ID_BYTES_MAX: usize = 255;
/// Longest metadata string stored with an offset, bytes.
pub const OFFSET_METADATA_BYTES_MAX: usize = 4096;

/// Kafka's record type of a committed offset (`OffsetCommitKey`; type 0
/// is its legacy twin, same layout).
pub const OFFSET_COMMIT_KEY: i16 = 1;
/// Kafka's record type of a classic group (`GroupMetadataKey`).
pub const GROUP_METADATA_KEY: i16 = 2;
/// Weir's record type of a KIP-848 consumer group's epochs and assignor
/// (0x5701: far above Kafka's types, 0–23 in Kafka 4.1).
pub const WEIR_CONSUMER_GROUP_KEY: i16 = 0x5701;
/// Weir's record type of one KIP-848 member (0x5702).
pub const WEIR_CONSUMER_MEMBER_KEY: i16 = 0x5702;
/// The `OffsetCommitValue` version written: Kafka 4.0's (4.1 writes the
/// flexible v4, which readers that know only v0–3 refuse).
pub const OFFSET_COMMIT_VALUE_VERSION: i16 = 3;
/// The `GroupMetadataValue` version written: Kafka 4.x's.
pub const GROUP_METADATA_VALUE_VERSION: i16 = 3;
/// The version of Weir's own values.
pub const WEIR_VALUE_VERSION: i16 = 0;

/// What a record is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKey {
    /// The committed offset of one partition for a group.
    Offset {
        /// The group id.
        group: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
    },
    /// A KIP-848 consumer group's epochs and assignor.
    Group {
        /// The group id.
        group: String,
    },
    /// One member of a KIP-848 consumer group: its epochs, subscription,
    /// assignment, revoking partitions and target.
    Member {
        /// The group id.
        group: String,
        /// The member id.
        member: String,
    },
    /// A classic group's state: generation, protocol, leader, members and
    /// their assignments.
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
    /// The client's metadata string (stored as Kafka does: none is "").
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

/// A record's value, decoded by its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Of [`RecordKey::Offset`].
    Offset(OffsetValue),
    /// Of [`RecordKey::Group`].
    Group(GroupValue),
    /// Of [`RecordKey::Member`].
    Member(Box<Member>),
    /// Of [`RecordKey::Classic`].
    Classic(Snapshot),
}

/// A decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// What it is about.
    pub key: RecordKey,
    /// Its value (`None`: a tombstone).
    pub value: Option<Value>,
    /// Written in Weir's first layout (before Kafka's format).
    pub legacy: bool,
}

/// A record that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed __consumer_offsets record: {0}")]
pub struct RecordError(pub String);

fn put_str(out: &mut BytesMut, s: &str) {
    out.put_u16(s.len() as u16);
    out.put_slice(s.as_bytes());
}

fn put_opt_str(out: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_str(out, s),
        None => out.put_i16(-1),
    }
}

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_u32(b.len() as u32);
    out.put_slice(b);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn i16(&mut self) -> Result<i16, RecordError> {
        Ok(self.u16()? as i16)
    }
    fn i32(&mut self) -> Result<i32, RecordError> {
        Ok(self.u32()? as i32)
    }
    fn i64(&mut self) -> Result<i64, RecordError> {
        Ok(self.u64()? as i64)
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
        self.opt_string()?
            .ok_or_else(|| RecordError("null where a string is required".into()))
    }
    /// A Kafka nullable string: length -1 is null.
    fn opt_string(&mut self) -> Result<Option<String>, RecordError> {
        let n = self.i16()?;
        if n == -1 {
            return Ok(None);
        }
        let n = usize::try_from(n).map_err(|_| RecordError(format!("string length {n}")))?;
        String::from_utf8(self.take(n)?.to_vec())
            .map(Some)
            .map_err(|_| RecordError("not UTF-8".into()))
    }
    /// Kafka bytes: `int32` length and the bytes.
    fn bytes(&mut self) -> Result<Bytes, RecordError> {
        let n = self.i32()?;
        let n = usize::try_from(n).map_err(|_| RecordError(format!("bytes length {n}")))?;
        Ok(Bytes::copy_from_slice(self.take(n)?))
    }
    fn end(&self) -> Result<(), RecordError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(RecordError(format!("{} trailing bytes", self.0.len())))
        }
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

    /// `[type i16][group][...]`: Kafka's `OffsetCommitKey` (type 1: group,
    /// topic, partition i32) and `GroupMetadataKey` (type 2: group); Weir's
    /// group (0x5701: group) and member (0x5702: group, member id).
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        match self {
            RecordKey::Offset {
                group,
                topic,
                partition,
            } => {
                out.put_i16(OFFSET_COMMIT_KEY);
                put_str(&mut out, group);
                put_str(&mut out, topic);
                out.put_u32(*partition);
            }
            RecordKey::Classic { group } => {
                out.put_i16(GROUP_METADATA_KEY);
                put_str(&mut out, group);
            }
            RecordKey::Group { group } => {
                out.put_i16(WEIR_CONSUMER_GROUP_KEY);
                put_str(&mut out, group);
            }
            RecordKey::Member { group, member } => {
                out.put_i16(WEIR_CONSUMER_MEMBER_KEY);
                put_str(&mut out, group);
                put_str(&mut out, member);
            }
        }
        out.freeze()
    }
}

/// Decodes a record, in Kafka's format or Weir's first layout.
///
/// The first layout's keys began with `u8` 0 and a `u8` kind (0 offset, 1
/// group, 2 member, 3 classic), so they read as record types 0–3. Type 0
/// (an offset, the layout of Kafka's legacy key) and type 3 are never
/// written now; type 1 is a new offset key if a topic and partition follow
/// the group (the old group key ends there), type 2 a new classic key if
/// nothing follows the group (the old member key has the member id).
pub fn decode_record(key: &[u8], value: Option<&[u8]>) -> Result<Record, RecordError> {
    let mut r = Reader(key);
    let kind = r.i16()?;
    let group = r.string()?;
    let rest = r.0.len();
    let (key, legacy) = match kind {
        0 => (offset_key(group, &mut r)?, true),
        OFFSET_COMMIT_KEY if rest > 0 => (offset_key(group, &mut r)?, false),
        1 => (RecordKey::Group { group }, true),
        GROUP_METADATA_KEY if rest == 0 => (RecordKey::Classic { group }, false),
        2 => (
            RecordKey::Member {
                group,
                member: r.string()?,
            },
            true,
        ),
        3 => (RecordKey::Classic { group }, true),
        WEIR_CONSUMER_GROUP_KEY => (RecordKey::Group { group }, false),
        WEIR_CONSUMER_MEMBER_KEY => (
            RecordKey::Member {
                group,
                member: r.string()?,
            },
            false,
        ),
        k => return Err(RecordError(format!("unknown record type {k}"))),
    };
    r.end()?;
    let value = value.map(|v| decode_value(&key, v, legacy)).transpose()?;
    Ok(Record { key, value, legacy })
}

fn offset_key(group: String, r: &mut Reader<'_>) -> Result<RecordKey, RecordError> {
    Ok(RecordKey::Offset {
        group,
        topic: r.string()?,
        partition: r.u32()?,
    })
}

fn decode_value(key: &RecordKey, v: &[u8], legacy: bool) -> Result<Value, RecordError> {
    if legacy {
        return legacy::decode_value(key, v);
    }
    Ok(match key {
        RecordKey::Offset { .. } => Value::Offset(OffsetValue::decode(v)?),
        RecordKey::Group { .. } => Value::Group(GroupValue::decode(v)?),
        RecordKey::Member { .. } => Value::Member(Box::new(decode_member(v)?)),
        RecordKey::Classic { group } => Value::Classic(
            decode_classic(v)
                .map_err(|e| RecordError(format!("classic group `{group}`: {}", e.0)))?,
        ),
    })
}

impl OffsetValue {
    /// Kafka's `OffsetCommitValue` v3: `[version i16 = 3][offset
    /// i64][leader_epoch i32 = -1][metadata: string][commit_timestamp
    /// i64]`.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        out.put_i16(OFFSET_COMMIT_VALUE_VERSION);
        out.put_u64(self.offset);
        out.put_i32(-1);
        put_str(&mut out, self.metadata.as_deref().unwrap_or(""));
        out.put_i64(self.commit_timestamp);
        out.freeze()
    }

    /// Decodes Kafka's `OffsetCommitValue` v0–3 (v1's expire timestamp is
    /// read and not kept; an empty metadata string is none).
    pub fn decode(b: &[u8]) -> Result<OffsetValue, RecordError> {
        let mut r = Reader(b);
        let version = r.i16()?;
        if !(0..=3).contains(&version) {
            return Err(RecordError(format!(
                "OffsetCommitValue version {version} is not read"
            )));
        }
        let offset = r.i64()?;
        if version >= 3 {
            r.i32()?; // leader epoch
        }
        let metadata = r.string()?;
        let commit_timestamp = r.i64()?;
        if version == 1 {
            r.i64()?; // expire timestamp
        }
        r.end()?;
        let offset =
            u64::try_from(offset).map_err(|_| RecordError(format!("negative offset {offset}")))?;
        Ok(OffsetValue {
            offset,
            commit_timestamp,
            metadata: (!metadata.is_empty()).then_some(metadata),
        })
    }
}

impl GroupValue {
    /// `[version i16 = 0][group_epoch i32][assignment_epoch i32][assignor:
    /// string]`.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        out.put_i16(WEIR_VALUE_VERSION);
        out.put_i32(self.group_epoch);
        out.put_i32(self.assignment_epoch);
        put_str(&mut out, &self.assignor);
        out.freeze()
    }

    /// Decodes a value.
    pub fn decode(b: &[u8]) -> Result<GroupValue, RecordError> {
        let mut r = Reader(b);
        weir_version(&mut r)?;
        let (group_epoch, assignment_epoch) = (r.i32()?, r.i32()?);
        let assignor = r.string()?;
        r.end()?;
        Ok(GroupValue {
            group_epoch,
            assignment_epoch,
            assignor,
        })
    }
}

fn weir_version(r: &mut Reader<'_>) -> Result<(), RecordError> {
    match r.i16()? {
        WEIR_VALUE_VERSION => Ok(()),
        v => Err(RecordError(format!("unknown version {v}"))),
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

/// A consumer-group member's record value: `[version i16 = 0]` and
/// `put_member_body`'s layout.
pub fn encode_member(m: &Member) -> Bytes {
    let mut out = BytesMut::new();
    out.put_i16(WEIR_VALUE_VERSION);
    put_member_body(&mut out, m);
    out.freeze()
}

/// `[epoch i32][previous_epoch i32][has_instance u8][instance?][client_id]
/// [session_timeout_ms u32][rebalance_timeout_ms u32][topics: u32 n, n ×
/// str][assigned: u32 n, n × (topic, partition u32, epoch i32)][revoking:
/// same][target: u32 n, n × (topic, partition u32)]`; strings are u16
/// length + UTF-8 bytes.
fn put_member_body(out: &mut BytesMut, m: &Member) {
    out.put_i32(m.epoch);
    out.put_i32(m.previous_epoch);
    match &m.instance_id {
        Some(i) => {
            out.put_u8(1);
            put_str(out, i);
        }
        None => out.put_u8(0),
    }
    put_str(out, &m.client_id);
    out.put_u32(m.session_timeout_ms);
    out.put_u32(m.rebalance_timeout_ms);
    out.put_u32(m.topics.len() as u32);
    for t in &m.topics {
        put_str(out, t);
    }
    put_tps(out, m.assigned.iter().map(|(tp, e)| (tp, Some(*e))));
    put_tps(out, m.revoking.iter().map(|(tp, e)| (tp, Some(*e))));
    put_tps(out, m.target.iter().map(|tp| (tp, None)));
}

/// Decodes a member's record value (its session starts at load).
pub fn decode_member(b: &[u8]) -> Result<Member, RecordError> {
    let mut r = Reader(b);
    weir_version(&mut r)?;
    read_member_body(r)
}

fn read_member_body(mut r: Reader<'_>) -> Result<Member, RecordError> {
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

/// A classic group as Kafka's `GroupMetadataValue` v3:
/// `[version i16 = 3][protocol_type: string][generation i32][protocol:
/// nullable string][leader: nullable string][current_state_timestamp i64
/// = -1][members: i32 n, n × (member_id, group_instance_id nullable,
/// client_id, client_host, rebalance_timeout i32, session_timeout i32,
/// subscription bytes, assignment bytes)]`.
///
/// Kafka stores a group once it is stable (or empty); Weir stores every
/// state, and each is told apart within Kafka's schema: no members is
/// Empty; members and a null leader is PreparingRebalance; members, a
/// leader and no assignment (all empty) is CompletingRebalance; else
/// Stable. A Kafka reader sees the members and their last assignments.
pub fn encode_classic(s: &Snapshot) -> Bytes {
    let mut out = BytesMut::with_capacity(64 + s.members.len() * 64);
    out.put_i16(GROUP_METADATA_VALUE_VERSION);
    put_str(&mut out, s.protocol_type.as_deref().unwrap_or(""));
    out.put_i32(s.generation);
    put_opt_str(&mut out, s.protocol_name.as_deref());
    let leader = match s.state {
        SnapshotState::PreparingRebalance => None,
        _ => s.leader.as_deref(),
    };
    put_opt_str(&mut out, leader);
    out.put_i64(-1);
    out.put_u32(s.members.len() as u32);
    let completing = s.state == SnapshotState::CompletingRebalance;
    for m in &s.members {
        put_str(&mut out, &m.member_id);
        put_opt_str(&mut out, m.group_instance_id.as_deref());
        put_str(&mut out, &m.client_id);
        put_str(&mut out, &m.client_host);
        out.put_u32(m.rebalance_timeout_ms);
        out.put_u32(m.session_timeout_ms);
        put_bytes(&mut out, &m.metadata);
        // Completing: assignments of the generation before are not this
        // generation's (none is stored yet).
        put_bytes(&mut out, if completing { &[] } else { &m.assignment });
    }
    out.freeze()
}

/// Decodes Kafka's `GroupMetadataValue` v0–3 into a classic group's
/// snapshot (the state as [`encode_classic`] tells it apart), checked.
pub fn decode_classic(b: &[u8]) -> Result<Snapshot, RecordError> {
    let mut r = Reader(b);
    let version = r.i16()?;
    if !(0..=3).contains(&version) {
        return Err(RecordError(format!(
            "GroupMetadataValue version {version} is not read"
        )));
    }
    let protocol_type = r.string()?;
    let generation = r.i32()?;
    let protocol_name = r.opt_string()?;
    let leader = r.opt_string()?;
    if version >= 2 {
        r.i64()?; // current state timestamp
    }
    // member id, client id, host (2 each), session (4), two bytes (4 each).
    let n = r.count(18)?;
    let mut members = Vec::with_capacity(n);
    for _ in 0..n {
        let member_id = r.string()?;
        let group_instance_id = if version >= 3 { r.opt_string()? } else { None };
        let client_id = r.string()?;
        let client_host = r.string()?;
        let rebalance_timeout = if version >= 1 { Some(r.u32()?) } else { None };
        let session_timeout_ms = r.u32()?;
        members.push(SnapshotMember {
            member_id,
            group_instance_id,
            client_id,
            client_host,
            session_timeout_ms,
            rebalance_timeout_ms: rebalance_timeout.unwrap_or(session_timeout_ms),
            metadata: r.bytes()?,
            assignment: r.bytes()?,
        });
    }
    r.end()?;
    let state = if members.is_empty() {
        SnapshotState::Empty
    } else if leader.is_none() {
        SnapshotState::PreparingRebalance
    } else if members.iter().all(|m| m.assignment.is_empty()) {
        SnapshotState::CompletingRebalance
    } else {
        SnapshotState::Stable
    };
    let leader = match (&leader, members.first()) {
        (None, Some(first)) => Some(first.member_id.clone()),
        _ => leader,
    };
    let snapshot = Snapshot {
        generation,
        state,
        protocol_type: (!protocol_type.is_empty()).then_some(protocol_type),
        protocol_name,
        leader,
        members,
    };
    snapshot
        .checked()
        .map_err(|e| RecordError(format!("inconsistent group: {e}")))
}

/// Weir's first layout (read only, for data directories written before
/// Kafka's format): a `u8` version 0 in front of each value.
mod legacy {
    use super::*;

    pub(super) fn decode_value(key: &RecordKey, v: &[u8]) -> Result<Value, RecordError> {
        Ok(match key {
            RecordKey::Offset { .. } => Value::Offset(offset(v)?),
            RecordKey::Group { .. } => Value::Group(group(v)?),
            RecordKey::Member { .. } => {
                let mut r = Reader(v);
                version(&mut r)?;
                Value::Member(Box::new(read_member_body(r)?))
            }
            RecordKey::Classic { group } => Value::Classic(
                Snapshot::decode(v)
                    .map_err(|e| RecordError(format!("classic group `{group}`: {e}")))?,
            ),
        })
    }

    fn version(r: &mut Reader<'_>) -> Result<(), RecordError> {
        match r.u8()? {
            0 => Ok(()),
            v => Err(RecordError(format!("unknown version {v}"))),
        }
    }

    /// `[version u8][offset u64][commit_timestamp i64][has_metadata u8]`
    /// then, if present, `[metadata: u16 len + bytes]`.
    fn offset(b: &[u8]) -> Result<OffsetValue, RecordError> {
        let mut r = Reader(b);
        version(&mut r)?;
        let offset = r.u64()?;
        let commit_timestamp = r.i64()?;
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

    /// `[version u8 = 1][group_epoch i32][assignment_epoch i32][assignor]`;
    /// version 0 (`[0][generation i32][assignor]`, written before epochs)
    /// has both epochs = generation.
    fn group(b: &[u8]) -> Result<GroupValue, RecordError> {
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

    #[cfg(test)]
    pub(super) fn encode_offset_key(group: &str, topic: &str, partition: u32) -> Bytes {
        let mut out = BytesMut::new();
        out.put_u8(0);
        out.put_u8(0);
        put_str(&mut out, group);
        put_str(&mut out, topic);
        out.put_u32(partition);
        out.freeze()
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

    fn member() -> Member {
        Member {
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
        }
    }

    fn classic(state: SnapshotState) -> Snapshot {
        let m = |id: &str, a: &'static [u8]| SnapshotMember {
            member_id: id.into(),
            group_instance_id: (id == "b").then(|| "ib".to_string()),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            metadata: Bytes::from_static(b"sub"),
            assignment: Bytes::from_static(a),
        };
        let members = match state {
            SnapshotState::Empty => vec![],
            SnapshotState::CompletingRebalance => vec![m("a", b""), m("b", b"")],
            _ => vec![m("a", b"to-a"), m("b", b"")],
        };
        let empty = members.is_empty();
        Snapshot {
            generation: 5,
            state,
            protocol_type: Some("consumer".into()),
            protocol_name: (!empty).then(|| "range".to_string()),
            leader: (!empty).then(|| "a".to_string()),
            members,
        }
    }

    fn round_trip(key: &RecordKey, value: Option<Bytes>) -> Record {
        decode_record(&key.encode(), value.as_deref()).unwrap()
    }

    #[test]
    fn keys_and_values_round_trip() {
        let offset = RecordKey::Offset {
            group: "g".into(),
            topic: "orders".into(),
            partition: 7,
        };
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
            let r = round_trip(&offset, Some(v.encode()));
            assert_eq!(
                (r.key, r.value, r.legacy),
                (offset.clone(), Some(Value::Offset(v)), false)
            );
        }
        let group = RecordKey::Group { group: "g2".into() };
        let g = GroupValue {
            group_epoch: 9,
            assignment_epoch: 8,
            assignor: "range".into(),
        };
        let r = round_trip(&group, Some(g.encode()));
        assert_eq!((r.key, r.value), (group.clone(), Some(Value::Group(g))));
        let key = RecordKey::Member {
            group: "g".into(),
            member: "m".into(),
        };
        let bytes = encode_member(&member());
        let r = round_trip(&key, Some(bytes.clone()));
        assert_eq!(r.value, Some(Value::Member(Box::new(member()))));
        for n in 0..bytes.len() {
            assert!(decode_member(&bytes[..n]).is_err());
        }
        // Tombstones.
        let r = round_trip(&group, None);
        assert_eq!((r.key, r.value), (group, None));
    }

    #[test]
    fn classic_groups_keep_their_state_within_kafkas_schema() {
        let key = RecordKey::Classic { group: "cg".into() };
        for state in [
            SnapshotState::Empty,
            SnapshotState::PreparingRebalance,
            SnapshotState::CompletingRebalance,
            SnapshotState::Stable,
        ] {
            let s = classic(state);
            let r = round_trip(&key, Some(encode_classic(&s)));
            assert_eq!(r.value, Some(Value::Classic(s)), "{state:?}");
        }
        // An empty group as Kafka writes one.
        let mut kafka = BytesMut::new();
        kafka.put_i16(3);
        put_str(&mut kafka, "");
        kafka.put_i32(0);
        kafka.put_i16(-1);
        kafka.put_i16(-1);
        kafka.put_i64(-1);
        kafka.put_i32(0);
        let s = decode_classic(&kafka).unwrap();
        assert_eq!(
            (s.state, s.generation, s.protocol_type),
            (SnapshotState::Empty, 0, None)
        );
    }

    #[test]
    fn records_of_the_first_layout_are_read() {
        let old_key = legacy::encode_offset_key("g", "t", 3);
        let mut old_value = BytesMut::new();
        old_value.put_u8(0);
        old_value.put_u64(30);
        old_value.put_i64(1_700_000_000_000);
        old_value.put_u8(1);
        put_str(&mut old_value, "meta");
        let r = decode_record(&old_key, Some(&old_value)).unwrap();
        assert!(r.legacy);
        assert_eq!(
            r.value,
            Some(Value::Offset(OffsetValue {
                offset: 30,
                commit_timestamp: 1_700_000_000_000,
                metadata: Some("meta".into()),
            }))
        );
        // The old group key [0][1][group] against the new offset key.
        let r = decode_record(
            &[0, 1, 0, 1, b'g'],
            Some(&[1, 0, 0, 0, 7, 0, 0, 0, 6, 0, 1, b'r']),
        )
        .unwrap();
        assert!(r.legacy);
        assert_eq!(r.key, RecordKey::Group { group: "g".into() });
        assert_eq!(
            r.value,
            Some(Value::Group(GroupValue {
                group_epoch: 7,
                assignment_epoch: 6,
                assignor: "r".into()
            }))
        );
        // The old member key [0][2][group][member], value [0][body].
        let mut v = BytesMut::new();
        v.put_u8(0);
        put_member_body(&mut v, &member());
        let r = decode_record(&[0, 2, 0, 1, b'g', 0, 1, b'm'], Some(&v)).unwrap();
        assert!(r.legacy);
        assert_eq!(r.value, Some(Value::Member(Box::new(member()))));
        // The old classic key [0][3][group], value the old snapshot.
        let s = classic(SnapshotState::Stable);
        let r = decode_record(&[0, 3, 0, 1, b'g'], Some(&s.encode())).unwrap();
        assert!(r.legacy);
        assert_eq!(r.value, Some(Value::Classic(s)));
    }

    #[test]
    fn malformed_records_are_errors_not_panics() {
        let k = RecordKey::Member {
            group: "g".into(),
            member: "m".into(),
        }
        .encode();
        for n in 0..k.len() {
            assert!(decode_record(&k[..n], None).is_err());
        }
        let mut long = k.to_vec();
        long.push(0);
        assert!(decode_record(&long, None).is_err());
        assert!(decode_record(&[0, 9, 0, 0], None).is_err());
        let offset = RecordKey::Offset {
            group: "g".into(),
            topic: "t".into(),
            partition: 0,
        }
        .encode();
        assert!(decode_record(&offset, Some(&[0, 3, 2])).is_err());
        assert!(decode_record(&offset, Some(&[0, 9, 0, 0, 0, 0, 0, 0, 0, 0])).is_err());
        let classic = encode_classic(&classic(SnapshotState::Stable));
        for n in 0..classic.len() {
            assert!(decode_classic(&classic[..n]).is_err());
        }
    }
}
