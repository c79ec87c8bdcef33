//! The node-to-node protocol: one request and one response per QUIC
//! bidirectional stream, each a frame of an 8-byte header and an rkyv body.
//!
//! ```text
//! 0      1        2          4                8
//! +------+--------+----------+----------------+----------------
//! | 'W'  | ver=1  | reserved | body length LE | rkyv body ...
//! +------+--------+----------+----------------+----------------
//! ```
//!
//! The first stream of every connection carries [`Request::Hello`]; a
//! connection whose hello names another cluster id is refused and closed.
//! Raft's messages travel as mirror types of openraft's ([`WVote`],
//! [`WEntry`], …), so the bytes on the wire and in the Raft log file are
//! Weir's own format and do not change with openraft's internals.

use std::collections::{BTreeMap, BTreeSet};

use openraft::{CommittedLeaderId, LogId, Membership, StoredMembership, Vote};
use rkyv::api::high::{HighDeserializer, HighSerializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::rancor;
use rkyv::ser::allocator::ArenaHandle;
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::meta::{Command, Outcome};
use crate::raft::Entry;

/// Frame header length.
pub const HEADER_LEN: usize = 8;
/// First byte of every frame.
pub const MAGIC: u8 = b'W';
/// Protocol version.
pub const VERSION: u8 = 1;
/// Largest body accepted (a metadata snapshot must fit).
pub const BODY_MAX: usize = 64 << 20;

/// rkyv-encodes `value`.
pub fn encode<T>(value: &T) -> Vec<u8>
where
    T: for<'a> Serialize<HighSerializer<AlignedVec, ArenaHandle<'a>, rancor::Error>>,
{
    rkyv::to_bytes::<rancor::Error>(value)
        .expect("serializing into memory cannot fail")
        .into_vec()
}

/// Validates and decodes an rkyv body.
pub fn decode<T>(body: &[u8]) -> Result<T, String>
where
    T: Archive,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<T, HighDeserializer<rancor::Error>>,
{
    let mut aligned = AlignedVec::<16>::with_capacity(body.len());
    aligned.extend_from_slice(body);
    rkyv::from_bytes::<T, rancor::Error>(&aligned).map_err(|e| format!("bad body: {e}"))
}

/// Writes one frame to `send` and finishes the stream.
pub async fn write_frame(send: &mut quinn::SendStream, body: &[u8]) -> Result<()> {
    write_frame_with_payload(send, body, &[]).await
}

/// Writes one frame, then `payload` raw (the data plane's batches), and
/// finishes the stream. The payload's buffers go to QUIC as they are
/// (held until acknowledged), not copied: a leader's answer is the cached
/// batches themselves.
pub async fn write_frame_with_payload(
    send: &mut quinn::SendStream,
    body: &[u8],
    payload: &[bytes::Bytes],
) -> Result<()> {
    let mut head = bytes::BytesMut::with_capacity(HEADER_LEN + body.len());
    // The header: magic, version, two bytes reserved, the body's length.
    head.extend_from_slice(&[MAGIC, VERSION, 0, 0]);
    head.extend_from_slice(&(body.len() as u32).to_le_bytes());
    head.extend_from_slice(body);
    let mut chunks = Vec::with_capacity(1 + payload.len());
    chunks.push(head.freeze());
    chunks.extend(payload.iter().cloned());
    send.write_all_chunks(&mut chunks)
        .await
        .map_err(|source| Error::Write { source })?;
    send.finish().map_err(|source| Error::Finish { source })?;
    Ok(())
}

/// Reads one frame's body from `recv`.
pub async fn read_frame(recv: &mut quinn::RecvStream) -> Result<Vec<u8>> {
    let mut header = [0u8; HEADER_LEN];
    recv.read_exact(&mut header)
        .await
        .map_err(|source| Error::Read {
            action: "reading a frame header",
            source,
        })?;
    if header[0] != MAGIC || header[1] != VERSION {
        return Err(Error::NotAFrame {
            magic: header[0],
            version: header[1],
        });
    }
    let len = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes")) as usize;
    if len > BODY_MAX {
        return Err(Error::FrameTooLarge { max: BODY_MAX, len });
    }
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body)
        .await
        .map_err(|source| Error::Read {
            action: "reading a frame body",
            source,
        })?;
    Ok(body)
}

/// A request from one node to another.
#[derive(Archive, Serialize, Deserialize, Debug, Clone)]
pub enum Request {
    /// The first message of a connection.
    Hello {
        /// The sender's cluster id.
        cluster_id: String,
        /// The sender's node id.
        node_id: u64,
    },
    /// Raft: request a vote.
    Vote {
        /// Candidate's vote.
        vote: WVote,
        /// Candidate's last log id.
        last_log_id: Option<WLogId>,
    },
    /// Raft: append entries (or heartbeat).
    Append {
        /// Leader's vote.
        vote: WVote,
        /// Entry before `entries`.
        prev_log_id: Option<WLogId>,
        /// Entries.
        entries: Vec<WEntry>,
        /// Leader's committed log id.
        leader_commit: Option<WLogId>,
    },
    /// Raft: install a full snapshot.
    Snapshot {
        /// Leader's vote.
        vote: WVote,
        /// Snapshot metadata.
        meta: WSnapshotMeta,
        /// The state, rkyv-encoded [`crate::meta::ClusterState`].
        data: Vec<u8>,
    },
    /// A metadata change, forwarded to the controller leader.
    Propose(Command),
    /// Liveness: node `node_id` at `epoch` is up.
    Heartbeat {
        /// Node.
        node_id: u64,
        /// Its broker epoch.
        epoch: u64,
    },
}

/// The answer to a [`Request`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone)]
pub enum Response {
    /// Hello accepted.
    HelloOk,
    /// The request was refused (wrong cluster, not the leader, …).
    Refused(String),
    /// Raft vote answer.
    Vote {
        /// The receiver's vote.
        vote: WVote,
        /// Granted.
        granted: bool,
        /// Receiver's last log id.
        last_log_id: Option<WLogId>,
    },
    /// Raft append answer.
    Append(WAppendResponse),
    /// Snapshot installed; the receiver's vote.
    Snapshot(WVote),
    /// A proposal's outcome.
    Proposed(Outcome),
    /// Not the leader: who is, if known.
    NotLeader(Option<u64>),
    /// A heartbeat's answer: the node's epoch as the controller knows it
    /// and whether it is fenced (it must register again).
    HeartbeatAck {
        /// Epoch on record.
        epoch: u64,
        /// Fenced.
        fenced: bool,
    },
}

/// openraft's `LogId`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct WLogId {
    /// Leader's term.
    pub term: u64,
    /// Leader's node id.
    pub node: u64,
    /// Index.
    pub index: u64,
}

/// openraft's `Vote`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct WVote {
    /// Term.
    pub term: u64,
    /// Candidate or leader.
    pub node: u64,
    /// Granted by a quorum.
    pub committed: bool,
}

/// openraft's `Membership` (node value: its replication address).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct WMembership {
    /// Voter sets (two during a joint change).
    pub configs: Vec<Vec<u64>>,
    /// Every node (voters and learners) and its address.
    pub nodes: Vec<(u64, String)>,
}

/// A Raft log entry's payload.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum WPayload {
    /// A new leader's blank entry.
    Blank,
    /// A metadata command.
    Normal(Command),
    /// A membership change.
    Membership(WMembership),
}

/// A Raft log entry.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct WEntry {
    /// Its id.
    pub log_id: WLogId,
    /// Its payload.
    pub payload: WPayload,
}

/// openraft's `SnapshotMeta`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct WSnapshotMeta {
    /// Last entry included.
    pub last_log_id: Option<WLogId>,
    /// Log id of the membership in force.
    pub membership_log_id: Option<WLogId>,
    /// The membership in force.
    pub membership: WMembership,
    /// Snapshot id.
    pub snapshot_id: String,
}

/// openraft's `AppendEntriesResponse`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum WAppendResponse {
    /// All stored.
    Success,
    /// Stored up to the log id.
    PartialSuccess(Option<WLogId>),
    /// Previous entry did not match.
    Conflict,
    /// The receiver has seen a higher vote.
    HigherVote(WVote),
}

impl From<LogId<u64>> for WLogId {
    fn from(id: LogId<u64>) -> Self {
        Self {
            term: id.leader_id.term,
            node: id.leader_id.node_id,
            index: id.index,
        }
    }
}

impl From<WLogId> for LogId<u64> {
    fn from(id: WLogId) -> Self {
        LogId::new(CommittedLeaderId::new(id.term, id.node), id.index)
    }
}

impl From<Vote<u64>> for WVote {
    fn from(v: Vote<u64>) -> Self {
        Self {
            term: v.leader_id.term,
            node: v.leader_id.node_id,
            committed: v.committed,
        }
    }
}

impl From<WVote> for Vote<u64> {
    fn from(v: WVote) -> Self {
        if v.committed {
            Vote::new_committed(v.term, v.node)
        } else {
            Vote::new(v.term, v.node)
        }
    }
}

impl From<&Membership<u64, openraft::BasicNode>> for WMembership {
    fn from(m: &Membership<u64, openraft::BasicNode>) -> Self {
        Self {
            configs: m
                .get_joint_config()
                .iter()
                .map(|c| c.iter().copied().collect())
                .collect(),
            nodes: m.nodes().map(|(id, n)| (*id, n.addr.clone())).collect(),
        }
    }
}

impl From<&WMembership> for Membership<u64, openraft::BasicNode> {
    fn from(m: &WMembership) -> Self {
        let configs: Vec<BTreeSet<u64>> = m
            .configs
            .iter()
            .map(|c| c.iter().copied().collect())
            .collect();
        let nodes: BTreeMap<u64, openraft::BasicNode> = m
            .nodes
            .iter()
            .map(|(id, addr)| (*id, openraft::BasicNode::new(addr)))
            .collect();
        Membership::new(configs, nodes)
    }
}

impl From<&Entry> for WEntry {
    fn from(e: &Entry) -> Self {
        use openraft::EntryPayload;
        Self {
            log_id: e.log_id.into(),
            payload: match &e.payload {
                EntryPayload::Blank => WPayload::Blank,
                EntryPayload::Normal(c) => WPayload::Normal(c.clone()),
                EntryPayload::Membership(m) => WPayload::Membership(m.into()),
            },
        }
    }
}

impl From<WEntry> for Entry {
    fn from(e: WEntry) -> Self {
        use openraft::EntryPayload;
        Entry {
            log_id: e.log_id.into(),
            payload: match e.payload {
                WPayload::Blank => EntryPayload::Blank,
                WPayload::Normal(c) => EntryPayload::Normal(c),
                WPayload::Membership(m) => EntryPayload::Membership((&m).into()),
            },
        }
    }
}

impl From<&openraft::SnapshotMeta<u64, openraft::BasicNode>> for WSnapshotMeta {
    fn from(m: &openraft::SnapshotMeta<u64, openraft::BasicNode>) -> Self {
        Self {
            last_log_id: m.last_log_id.map(Into::into),
            membership_log_id: m.last_membership.log_id().map(Into::into),
            membership: m.last_membership.membership().into(),
            snapshot_id: m.snapshot_id.clone(),
        }
    }
}

impl From<&WSnapshotMeta> for openraft::SnapshotMeta<u64, openraft::BasicNode> {
    fn from(m: &WSnapshotMeta) -> Self {
        Self {
            last_log_id: m.last_log_id.map(Into::into),
            last_membership: StoredMembership::new(
                m.membership_log_id.map(Into::into),
                (&m.membership).into(),
            ),
            snapshot_id: m.snapshot_id.clone(),
        }
    }
}

impl From<openraft::raft::AppendEntriesResponse<u64>> for WAppendResponse {
    fn from(r: openraft::raft::AppendEntriesResponse<u64>) -> Self {
        use openraft::raft::AppendEntriesResponse as A;
        match r {
            A::Success => Self::Success,
            A::PartialSuccess(id) => Self::PartialSuccess(id.map(Into::into)),
            A::Conflict => Self::Conflict,
            A::HigherVote(v) => Self::HigherVote(v.into()),
        }
    }
}

impl From<WAppendResponse> for openraft::raft::AppendEntriesResponse<u64> {
    fn from(r: WAppendResponse) -> Self {
        match r {
            WAppendResponse::Success => Self::Success,
            WAppendResponse::PartialSuccess(id) => Self::PartialSuccess(id.map(Into::into)),
            WAppendResponse::Conflict => Self::Conflict,
            WAppendResponse::HigherVote(v) => Self::HigherVote(v.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raft_messages_round_trip_through_the_mirror_types() {
        let m = WMembership {
            configs: vec![vec![1, 2, 3]],
            nodes: vec![
                (1, "127.0.0.1:1".into()),
                (2, "127.0.0.1:2".into()),
                (3, "127.0.0.1:3".into()),
            ],
        };
        let entries = vec![
            WEntry {
                log_id: WLogId {
                    term: 1,
                    node: 1,
                    index: 1,
                },
                payload: WPayload::Membership(m.clone()),
            },
            WEntry {
                log_id: WLogId {
                    term: 2,
                    node: 3,
                    index: 2,
                },
                payload: WPayload::Normal(Command::InitCluster {
                    cluster_id: "c".into(),
                }),
            },
            WEntry {
                log_id: WLogId {
                    term: 2,
                    node: 3,
                    index: 3,
                },
                payload: WPayload::Blank,
            },
        ];
        for e in &entries {
            let raft: Entry = e.clone().into();
            assert_eq!(&WEntry::from(&raft), e);
        }
        let req = Request::Append {
            vote: WVote {
                term: 2,
                node: 3,
                committed: true,
            },
            prev_log_id: None,
            entries: entries.clone(),
            leader_commit: Some(WLogId {
                term: 2,
                node: 3,
                index: 2,
            }),
        };
        let decoded: Request = decode(&encode(&req)).unwrap();
        match decoded {
            Request::Append {
                entries: e, vote, ..
            } => {
                assert_eq!(e, entries);
                assert_eq!(Vote::<u64>::from(vote), Vote::new_committed(2, 3));
            }
            other => panic!("{other:?}"),
        }
        assert!(decode::<Request>(&[1, 2, 3]).is_err());
    }
}
