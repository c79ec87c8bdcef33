//! What crosses into the group coordinator: its requests and answers
//! (today the native protocol's group messages, which the Kafka listener
//! maps its own onto, and the classic and KIP-848 machines' own types),
//! defined here, below the coordinator, so that the mesh carrying them
//! between cores needs nothing of the coordinator itself.

use weir_proto::messages::*;

use crate::groups::classic::{self, ClassicError};
use crate::groups::consumer::{Answer, GroupError, Heartbeat};

/// A group request, forwarded to the coordinator's core.
#[derive(Debug)]
pub enum GroupRequest {
    /// JoinGroup.
    Join(JoinGroupRequest),
    /// Heartbeat.
    Heartbeat(HeartbeatRequest),
    /// LeaveGroup.
    Leave(LeaveGroupRequest),
    /// OffsetCommit.
    Commit(OffsetCommitRequest),
    /// Kafka's TxnOffsetCommit: offsets committed as part of producer
    /// (id, epoch)'s transaction, visible once its marker commits it.
    TxnCommit {
        /// The offsets (an empty member id or a negative generation: not
        /// checked against the group's members, as Kafka's v0–2).
        request: OffsetCommitRequest,
        /// The transaction's producer id and epoch.
        producer: (i64, i16),
    },
    /// OffsetFetch.
    Fetch(OffsetFetchRequest),
    /// Kafka's OffsetFetch with `require_stable` (KIP-447): the offsets,
    /// and the partitions whose offsets are pending in a transaction.
    FetchStable(OffsetFetchRequest),
    /// DescribeGroup.
    Describe(DescribeGroupRequest),
    /// Kafka's DescribeGroups: the description, with classic members'
    /// opaque bytes.
    DescribeWithBytes(DescribeGroupRequest),
    /// DeleteGroup.
    Delete(DeleteGroupRequest),
    /// The groups of one core (ListGroups asks every core).
    List,
    /// KIP-848 `ConsumerGroupHeartbeat` (join with epoch 0, leave with -1).
    ConsumerHeartbeat {
        /// The group id.
        group: String,
        /// The heartbeat.
        heartbeat: Heartbeat,
    },
    /// Kafka's classic JoinGroup (held until the join phase ends).
    ClassicJoin {
        /// The group id.
        group: String,
        /// The request.
        request: classic::JoinRequest,
    },
    /// Kafka's classic SyncGroup (a follower's is held until the leader's).
    ClassicSync {
        /// The group id.
        group: String,
        /// The request.
        request: classic::SyncRequest,
    },
    /// Kafka's classic Heartbeat.
    ClassicHeartbeat {
        /// The group id.
        group: String,
        /// The member.
        member_id: String,
        /// Its static instance id.
        instance_id: Option<String>,
        /// The generation it is in.
        generation: i32,
    },
    /// Kafka's classic LeaveGroup (a batch, v3+).
    ClassicLeave {
        /// The group id.
        group: String,
        /// (member id, instance id) of each member leaving.
        members: Vec<(String, Option<String>)>,
    },
}

impl GroupRequest {
    pub(crate) fn group(&self) -> &str {
        match self {
            GroupRequest::ConsumerHeartbeat { group, .. }
            | GroupRequest::ClassicJoin { group, .. }
            | GroupRequest::ClassicSync { group, .. }
            | GroupRequest::ClassicHeartbeat { group, .. }
            | GroupRequest::ClassicLeave { group, .. } => group,
            GroupRequest::Join(r) => &r.group,
            GroupRequest::Heartbeat(r) => &r.group,
            GroupRequest::Leave(r) => &r.group,
            GroupRequest::Commit(r) | GroupRequest::TxnCommit { request: r, .. } => &r.group,
            GroupRequest::Fetch(r) | GroupRequest::FetchStable(r) => &r.group,
            GroupRequest::Describe(r) | GroupRequest::DescribeWithBytes(r) => &r.group,
            GroupRequest::Delete(r) => &r.group,
            GroupRequest::List => "",
        }
    }
}

/// The coordinator's answer.
#[derive(Debug)]
pub enum GroupResponse {
    /// To Join and Heartbeat.
    Assignment(GroupAssignment),
    /// To Leave and Delete.
    Result(GroupResult),
    /// To OffsetCommit.
    Commit(OffsetCommitResponse),
    /// To OffsetFetch.
    Fetch(OffsetFetchResponse),
    /// To FetchStable: the offsets, and the partitions (topic, partition)
    /// with offsets pending in an open transaction.
    FetchStable(OffsetFetchResponse, Vec<(String, u32)>),
    /// To DescribeGroup.
    Describe(DescribeGroupResponse),
    /// To DescribeWithBytes: the description and, for each member of a
    /// classic group (in the description's order), its protocol metadata
    /// and assignment as the clients sent them.
    DescribeWithBytes(DescribeGroupResponse, Vec<ClassicMemberBytes>),
    /// To List: each group with its kind (`consumer` or `classic`).
    List(Vec<(GroupListing, &'static str)>),
    /// To ConsumerHeartbeat.
    ConsumerHeartbeat(Result<Answer, GroupError>),
    /// To ClassicJoin.
    ClassicJoin(classic::JoinResponse),
    /// To ClassicSync.
    ClassicSync(classic::SyncResponse),
    /// To ClassicHeartbeat.
    ClassicHeartbeat(Result<(), ClassicError>),
    /// To ClassicLeave: one result per member, in order.
    ClassicLeave(Vec<Result<(), ClassicError>>),
    /// A request of the Kafka protocols refused before it reached the
    /// group (coordinator still loading, bad group id, core unreachable):
    /// a Weir error code and a message, mapped by the listener.
    Refused(u16, String),
}

/// The error of a request, before it is put in the answer's shape.
pub(crate) struct Refusal(pub(crate) u16, pub(crate) String);

impl GroupResponse {
    /// The same refusal with another error.
    pub(crate) fn with_error(self, e: Refusal) -> GroupResponse {
        let (error, message) = (e.0, Some(e.1.clone()));
        match self {
            GroupResponse::Assignment(a) => GroupResponse::Assignment(GroupAssignment {
                error,
                message,
                ..a
            }),
            GroupResponse::Result(_) => GroupResponse::Result(GroupResult { error, message }),
            GroupResponse::Commit(c) => GroupResponse::Commit(OffsetCommitResponse {
                error,
                message,
                ..c
            }),
            GroupResponse::Fetch(f) => GroupResponse::Fetch(OffsetFetchResponse {
                error,
                message,
                ..f
            }),
            GroupResponse::FetchStable(f, _) => GroupResponse::FetchStable(
                OffsetFetchResponse {
                    error,
                    message,
                    ..f
                },
                Vec::new(),
            ),
            GroupResponse::Describe(d) => GroupResponse::Describe(DescribeGroupResponse {
                error,
                message,
                ..d
            }),
            GroupResponse::DescribeWithBytes(d, _) => GroupResponse::DescribeWithBytes(
                DescribeGroupResponse {
                    error,
                    message,
                    ..d
                },
                Vec::new(),
            ),
            GroupResponse::List(l) => GroupResponse::List(l),
            GroupResponse::ConsumerHeartbeat(_)
            | GroupResponse::ClassicJoin(_)
            | GroupResponse::ClassicSync(_)
            | GroupResponse::ClassicHeartbeat(_)
            | GroupResponse::ClassicLeave(_)
            | GroupResponse::Refused(..) => GroupResponse::Refused(e.0, e.1),
        }
    }

    pub(crate) fn refused(req: &GroupRequest, e: Refusal) -> GroupResponse {
        let (error, message) = (e.0, Some(e.1.clone()));
        match req {
            GroupRequest::Join(_) | GroupRequest::Heartbeat(_) => {
                GroupResponse::Assignment(GroupAssignment {
                    error,
                    message,
                    ..Default::default()
                })
            }
            GroupRequest::Leave(_) | GroupRequest::Delete(_) => {
                GroupResponse::Result(GroupResult { error, message })
            }
            GroupRequest::Commit(_) | GroupRequest::TxnCommit { .. } => {
                GroupResponse::Commit(OffsetCommitResponse {
                    error,
                    message,
                    partitions: Vec::new(),
                })
            }
            GroupRequest::Fetch(_) => GroupResponse::Fetch(OffsetFetchResponse {
                error,
                message,
                offsets: Vec::new(),
            }),
            GroupRequest::FetchStable(_) => GroupResponse::FetchStable(
                OffsetFetchResponse {
                    error,
                    message,
                    offsets: Vec::new(),
                },
                Vec::new(),
            ),
            GroupRequest::Describe(r) => GroupResponse::Describe(DescribeGroupResponse {
                error,
                message,
                group: r.group.clone(),
                ..Default::default()
            }),
            GroupRequest::DescribeWithBytes(r) => GroupResponse::DescribeWithBytes(
                DescribeGroupResponse {
                    error,
                    message,
                    group: r.group.clone(),
                    ..Default::default()
                },
                Vec::new(),
            ),
            GroupRequest::List => GroupResponse::List(Vec::new()),
            GroupRequest::ConsumerHeartbeat { .. }
            | GroupRequest::ClassicJoin { .. }
            | GroupRequest::ClassicSync { .. }
            | GroupRequest::ClassicHeartbeat { .. }
            | GroupRequest::ClassicLeave { .. } => GroupResponse::Refused(e.0, e.1),
        }
    }
}

/// A classic member's protocol metadata (for the chosen protocol) and
/// assignment, as its client sent them.
#[derive(Debug, Clone, Default)]
pub struct ClassicMemberBytes {
    /// The member.
    pub member_id: String,
    /// The host it connected from.
    pub client_host: String,
    /// Its subscription metadata for the group's protocol.
    pub metadata: bytes::Bytes,
    /// The assignment the leader gave it.
    pub assignment: bytes::Bytes,
}
