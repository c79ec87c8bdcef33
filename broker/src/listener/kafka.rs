//! The Kafka listener: Apache Kafka's wire protocol onto the same service
//! layer as the native protocol ([`crate::service`]) and the same group
//! coordinator ([`crate::groups::coordinator`]).
//!
//! [`kafka_codec`](super::kafka_codec) decodes a request frame into
//! `kafka-protocol`'s typed request (record batches stay the frame's bytes)
//! and encodes answers (a Fetch answer's batches are the cache's bytes, not
//! copied, when a partition's answer is one batch). This module maps each
//! API onto the service and maps errors onto Kafka's codes.
//!
//! **One node.** Metadata lists one broker (node 0, the advertised
//! address) leading every partition; Kafka clients know nothing of cores,
//! so a partition of another core is served through the mesh, as on the
//! native shared port.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersionsResponse;
use kafka_protocol::messages::consumer_group_heartbeat_response::{
    Assignment as HbAssignment, TopicPartitions as HbTopicPartitions,
};
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_proto::api::ApiKey as NativeKey;
use weir_proto::error_code::ErrorCode;
use weir_proto::messages as native;

use crate::groups::classic;
use crate::groups::consumer::{GroupError, Heartbeat};
use crate::groups::coordinator::{self, GroupRequest, GroupResponse};
use crate::listener::connection::{Answer, Pending, Protocol};
use crate::listener::kafka_codec::{self as codec, KafkaRequest, KafkaResponse, RequestFrame};
use crate::metadata::writer::Change;
use crate::metadata::{ConfigOp, TopicError, TopicMeta, TopicSpec, OFFSETS_TOPIC};
use crate::server::limits::{KAFKA_NON_PRODUCE_FRAME_BYTES_MAX, REQUEST_PARTITIONS_MAX};
use crate::service::fetch::{FetchParams, FetchPart};
use crate::service::offsets::{Listed, OffsetQuery};
use crate::service::produce::ProducePart;
use crate::service::{self, admin, BrokerError, Ctx, StorageFailure};
use crate::shard::Core;

/// Kafka's error codes this listener answers with.
pub mod code {
    /// The transactional id is not authorised (the answer to a
    /// transaction-coordinator lookup: transactions are not served).
    pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
    /// UNKNOWN_SERVER_ERROR.
    pub const UNKNOWN: i16 = -1;
    /// OFFSET_OUT_OF_RANGE.
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    /// CORRUPT_MESSAGE.
    pub const CORRUPT_MESSAGE: i16 = 2;
    /// UNKNOWN_TOPIC_OR_PARTITION.
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    /// NOT_LEADER_OR_FOLLOWER.
    pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    /// FENCED_LEADER_EPOCH: the client's leader epoch is older than the
    /// broker's (its metadata is stale).
    pub const FENCED_LEADER_EPOCH: i16 = 74;
    /// UNKNOWN_LEADER_EPOCH: the client's leader epoch is newer than the
    /// broker's (the broker's view lags; retriable).
    pub const UNKNOWN_LEADER_EPOCH: i16 = 75;
    /// REQUEST_TIMED_OUT.
    pub const REQUEST_TIMED_OUT: i16 = 7;
    /// MESSAGE_TOO_LARGE.
    pub const MESSAGE_TOO_LARGE: i16 = 10;
    /// COORDINATOR_LOAD_IN_PROGRESS.
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    /// COORDINATOR_NOT_AVAILABLE.
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    /// NOT_COORDINATOR.
    pub const NOT_COORDINATOR: i16 = 16;
    /// INVALID_TOPIC_EXCEPTION.
    pub const INVALID_TOPIC: i16 = 17;
    /// NOT_ENOUGH_REPLICAS.
    pub const NOT_ENOUGH_REPLICAS: i16 = 19;
    /// ILLEGAL_GENERATION.
    pub const ILLEGAL_GENERATION: i16 = 22;
    /// INCONSISTENT_GROUP_PROTOCOL.
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    /// INVALID_GROUP_ID.
    pub const INVALID_GROUP_ID: i16 = 24;
    /// UNKNOWN_MEMBER_ID.
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    /// INVALID_SESSION_TIMEOUT.
    pub const INVALID_SESSION_TIMEOUT: i16 = 26;
    /// REBALANCE_IN_PROGRESS.
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    /// TOPIC_ALREADY_EXISTS.
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    /// INVALID_PARTITIONS.
    pub const INVALID_PARTITIONS: i16 = 37;
    /// INVALID_REPLICATION_FACTOR.
    pub const INVALID_REPLICATION_FACTOR: i16 = 38;
    /// INVALID_REPLICA_ASSIGNMENT.
    pub const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
    /// INVALID_CONFIG.
    pub const INVALID_CONFIG: i16 = 40;
    /// INVALID_REQUEST.
    pub const INVALID_REQUEST: i16 = 42;
    /// POLICY_VIOLATION.
    pub const POLICY_VIOLATION: i16 = 44;
    /// OUT_OF_ORDER_SEQUENCE_NUMBER.
    pub const OUT_OF_ORDER_SEQUENCE: i16 = 45;
    /// INVALID_PRODUCER_EPOCH.
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    /// UNKNOWN_PRODUCER_ID.
    pub const UNKNOWN_PRODUCER_ID: i16 = 59;
    /// NON_EMPTY_GROUP.
    pub const NON_EMPTY_GROUP: i16 = 68;
    /// GROUP_ID_NOT_FOUND.
    pub const GROUP_ID_NOT_FOUND: i16 = 69;
    /// FENCED_INSTANCE_ID.
    pub const FENCED_INSTANCE_ID: i16 = 82;
    /// INVALID_RECORD.
    pub const INVALID_RECORD: i16 = 87;
    /// UNKNOWN_TOPIC_ID.
    pub const UNKNOWN_TOPIC_ID: i16 = 100;
    /// FENCED_MEMBER_EPOCH.
    pub const FENCED_MEMBER_EPOCH: i16 = 110;
    /// STALE_MEMBER_EPOCH.
    pub const STALE_MEMBER_EPOCH: i16 = 113;
    /// GROUP_MAX_SIZE_REACHED.
    pub const GROUP_MAX_SIZE_REACHED: i16 = 81;
    /// UNRELEASED_INSTANCE_ID.
    pub const UNRELEASED_INSTANCE_ID: i16 = 111;
    /// UNSUPPORTED_ASSIGNOR.
    pub const UNSUPPORTED_ASSIGNOR: i16 = 112;
}

/// The node id of this broker in Kafka's Metadata.
const NODE_ID: i32 = 0;
/// The cluster id Kafka clients see.
const CLUSTER_ID: &str = "weir";

/// The Kafka protocol (framing and dispatch) for [`crate::listener::connection`].
#[derive(Debug, Clone, Copy)]
pub struct Kafka;

impl Protocol for Kafka {
    fn frame_len(&self, buf: &[u8], max: usize) -> Result<Option<usize>, (u32, Answer)> {
        let len = codec::peek_request_frame_len(buf, max).map_err(|e| {
            tracing::warn!(error = %e, "closing Kafka connection: bad frame size");
            (0, closing())
        })?;
        let key = buf.get(4..6).map(|b| i16::from_be_bytes([b[0], b[1]]));
        if let (Some(n), Some(key)) = (len, key) {
            let produce = key == kafka_protocol::messages::ApiKey::Produce as i16;
            if !produce && n > KAFKA_NON_PRODUCE_FRAME_BYTES_MAX {
                tracing::warn!(
                    api = key,
                    bytes = n,
                    max = KAFKA_NON_PRODUCE_FRAME_BYTES_MAX,
                    "closing Kafka connection: a request other than Produce over its size limit"
                );
                return Err((0, closing()));
            }
        }
        Ok(len)
    }

    fn api_of(&self, frame: &[u8]) -> Option<NativeKey> {
        let key = frame.get(4..6).map(|b| i16::from_be_bytes([b[0], b[1]]))?;
        native_key(key)
    }

    fn is_error(&self, _answer: &Answer) -> bool {
        false
    }

    async fn dispatch(&self, core: &Rc<Core>, request: Bytes, ctx: Ctx) -> Pending {
        let frame = request.slice(codec::SIZE_PREFIX_BYTES..);
        match codec::decode_request(frame) {
            Ok(req) => serve(core, req, ctx).await,
            Err(codec::DecodeError::Refused { header, answer }) => {
                tracing::debug!(
                    api = header.api_key,
                    version = header.api_version,
                    "Kafka request at a version not served: refused"
                );
                Pending::Ready(Answer::plain(BytesMut::from(&answer[..])))
            }
            Err(e) => {
                tracing::debug!(error = %e, "Kafka request not decoded");
                let error = match &e {
                    codec::DecodeError::UnsupportedVersion { .. } => codec::UNSUPPORTED_VERSION,
                    _ => code::INVALID_REQUEST,
                };
                // An error body where the API has one at that version (the
                // ApiVersions fallback among them); else the connection is
                // closed, as Kafka does.
                let answer = e
                    .header()
                    .filter(|_| !matches!(e, codec::DecodeError::UnsupportedApi { .. }))
                    .and_then(|h| codec::error_response(&h, error))
                    .map(|b| Answer::plain(BytesMut::from(&b[..])))
                    .unwrap_or_else(closing);
                Pending::Ready(answer)
            }
        }
    }
}

/// An answer that only closes the connection.
fn closing() -> Answer {
    Answer {
        head: BytesMut::new(),
        payload: Vec::new(),
        close: true,
    }
}

/// The native API a Kafka API is counted under in the metrics (and
/// Fetch, whose long polls a closing connection cancels).
fn native_key(key: i16) -> Option<NativeKey> {
    use kafka_protocol::messages::ApiKey as K;
    let k = K::try_from(key).ok()?;
    Some(match k {
        K::Produce => NativeKey::Produce,
        K::Fetch => NativeKey::Fetch,
        K::ListOffsets => NativeKey::ListOffsets,
        K::Metadata => NativeKey::Metadata,
        K::ApiVersions => NativeKey::ApiVersions,
        K::CreateTopics => NativeKey::CreateTopics,
        K::DeleteTopics => NativeKey::DeleteTopics,
        K::InitProducerId => NativeKey::InitProducerId,
        K::JoinGroup => NativeKey::JoinGroup,
        K::Heartbeat => NativeKey::Heartbeat,
        K::LeaveGroup => NativeKey::LeaveGroup,
        K::OffsetCommit => NativeKey::OffsetCommit,
        K::OffsetFetch => NativeKey::OffsetFetch,
        K::ListGroups => NativeKey::ListGroups,
        K::DescribeGroups => NativeKey::DescribeGroup,
        K::DeleteGroups => NativeKey::DeleteGroup,
        _ => return None,
    })
}

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

fn topic_name(v: impl Into<String>) -> TopicName {
    TopicName(s(v))
}

/// Encodes an answer (a failure to encode closes the connection: the
/// client cannot be answered in its version).
fn answer(header: &codec::RequestHeaderInfo, response: KafkaResponse) -> Answer {
    match codec::encode_response(header, &response) {
        Ok(head) => Answer::plain(head),
        Err(e) => {
            tracing::warn!(error = %e, api = header.api_key, version = header.api_version, "Kafka answer not encoded");
            closing()
        }
    }
}

fn later(f: impl std::future::Future<Output = Answer> + 'static) -> Pending {
    Pending::Later(glommio::spawn_local(f))
}

/// An answer that describes the cluster: computed only when every earlier
/// answer of the connection is written (see [`Pending::AtTurn`]). `f` is
/// polled only then.
fn at_turn(f: impl std::future::Future<Output = Answer> + 'static) -> Pending {
    Pending::AtTurn(Box::new(move || Box::pin(f)))
}

/// The ApiVersions answer: every API the codec decodes is served here (the
/// `match` in [`serve`] is exhaustive over them).
fn api_versions() -> ApiVersionsResponse {
    codec::api_versions_response()
}

/// Starts serving one decoded request.
async fn serve(core: &Rc<Core>, req: RequestFrame, ctx: Ctx) -> Pending {
    let h = req.header();
    let version = req.api_version;
    let client_id = req.client_id.clone().unwrap_or_default();
    let core = core.clone();
    match req.body {
        KafkaRequest::ApiVersions(_) => {
            Pending::Ready(answer(&h, KafkaResponse::ApiVersions(api_versions())))
        }
        KafkaRequest::Metadata(r) => at_turn(async move {
            let resp = metadata(&core, r, version).await;
            answer(&h, KafkaResponse::Metadata(resp))
        }),
        KafkaRequest::Produce(r) => produce(&core, h, r, ctx).await,
        KafkaRequest::Fetch(r) => later(async move { fetch(&core, h, r, ctx).await }),
        KafkaRequest::ListOffsets(r) => later(async move {
            let resp = list_offsets(&core, r, version).await;
            answer(&h, KafkaResponse::ListOffsets(resp))
        }),
        KafkaRequest::FindCoordinator(r) => at_turn(async move {
            answer(
                &h,
                KafkaResponse::FindCoordinator(find_coordinator(&core, r, version)),
            )
        }),
        KafkaRequest::InitProducerId(r) => later(async move {
            answer(
                &h,
                KafkaResponse::InitProducerId(init_producer_id(&core, r).await),
            )
        }),
        KafkaRequest::CreateTopics(r) => later(async move {
            answer(
                &h,
                KafkaResponse::CreateTopics(create_topics(&core, r, version).await),
            )
        }),
        KafkaRequest::DeleteTopics(r) => later(async move {
            answer(
                &h,
                KafkaResponse::DeleteTopics(delete_topics(&core, r).await),
            )
        }),
        KafkaRequest::JoinGroup(r) => later(async move {
            answer(
                &h,
                KafkaResponse::JoinGroup(join_group(&core, r, version, client_id).await),
            )
        }),
        KafkaRequest::SyncGroup(r) => {
            later(async move { answer(&h, KafkaResponse::SyncGroup(sync_group(&core, r).await)) })
        }
        KafkaRequest::Heartbeat(r) => {
            later(async move { answer(&h, KafkaResponse::Heartbeat(heartbeat(&core, r).await)) })
        }
        KafkaRequest::LeaveGroup(r) => later(async move {
            answer(
                &h,
                KafkaResponse::LeaveGroup(leave_group(&core, r, version).await),
            )
        }),
        KafkaRequest::OffsetCommit(r) => later(async move {
            answer(
                &h,
                KafkaResponse::OffsetCommit(offset_commit(&core, r).await),
            )
        }),
        KafkaRequest::OffsetFetch(r) => later(async move {
            answer(
                &h,
                KafkaResponse::OffsetFetch(offset_fetch(&core, r, version).await),
            )
        }),
        KafkaRequest::ListGroups(r) => {
            later(async move { answer(&h, KafkaResponse::ListGroups(list_groups(&core, r).await)) })
        }
        KafkaRequest::DescribeGroups(r) => later(async move {
            answer(
                &h,
                KafkaResponse::DescribeGroups(describe_groups(&core, r, version).await),
            )
        }),
        KafkaRequest::DeleteGroups(r) => later(async move {
            answer(
                &h,
                KafkaResponse::DeleteGroups(delete_groups(&core, r).await),
            )
        }),
        KafkaRequest::CreatePartitions(r) => later(async move {
            answer(
                &h,
                KafkaResponse::CreatePartitions(create_partitions(&core, r).await),
            )
        }),
        KafkaRequest::DescribeConfigs(r) => later(async move {
            answer(
                &h,
                KafkaResponse::DescribeConfigs(describe_configs(&core, r).await),
            )
        }),
        KafkaRequest::IncrementalAlterConfigs(r) => later(async move {
            answer(
                &h,
                KafkaResponse::IncrementalAlterConfigs(alter_configs(&core, r).await),
            )
        }),
        KafkaRequest::OffsetForLeaderEpoch(r) => later(async move {
            answer(
                &h,
                KafkaResponse::OffsetForLeaderEpoch(offset_for_leader_epoch(&core, r).await),
            )
        }),
        KafkaRequest::DescribeCluster(_) => {
            at_turn(
                async move { answer(&h, KafkaResponse::DescribeCluster(describe_cluster(&core))) },
            )
        }
        KafkaRequest::ConsumerGroupHeartbeat(r) => later(async move {
            answer(
                &h,
                KafkaResponse::ConsumerGroupHeartbeat(
                    consumer_group_heartbeat(&core, r, client_id).await,
                ),
            )
        }),
        KafkaRequest::DeleteRecords(r) => later(async move {
            answer(
                &h,
                KafkaResponse::DeleteRecords(delete_records(&core, r).await),
            )
        }),
        KafkaRequest::ConsumerGroupDescribe(r) => later(async move {
            answer(
                &h,
                KafkaResponse::ConsumerGroupDescribe(consumer_group_describe(&core, r).await),
            )
        }),
    }
}

// --- errors ------------------------------------------------------------------

/// The Kafka code of a service error.
pub fn broker_error_code(e: &BrokerError) -> i16 {
    match e {
        BrokerError::UnknownPartition { .. } => code::UNKNOWN_TOPIC_OR_PARTITION,
        BrokerError::NotOwner { .. } | BrokerError::NotLeader { .. } => {
            code::NOT_LEADER_OR_FOLLOWER
        }
        BrokerError::Topic(t) => topic_error_code(t),
        BrokerError::Storage { kind, .. } => match kind {
            StorageFailure::Corrupt => code::CORRUPT_MESSAGE,
            StorageFailure::TooLarge => code::MESSAGE_TOO_LARGE,
            StorageFailure::OffsetOutOfRange => code::OFFSET_OUT_OF_RANGE,
            StorageFailure::Recovering => code::NOT_LEADER_OR_FOLLOWER,
            StorageFailure::OutOfOrderSequence => code::OUT_OF_ORDER_SEQUENCE,
            StorageFailure::InvalidProducerEpoch => code::INVALID_PRODUCER_EPOCH,
            StorageFailure::UnknownProducerId => code::UNKNOWN_PRODUCER_ID,
            StorageFailure::InvalidRecord => code::INVALID_RECORD,
            _ => code::UNKNOWN,
        },
        BrokerError::Corrupt(_) => code::CORRUPT_MESSAGE,
        BrokerError::Policy(_) => code::POLICY_VIOLATION,
        BrokerError::InvalidRequest(_) => code::INVALID_REQUEST,
        BrokerError::TimedOut(_) => code::REQUEST_TIMED_OUT,
        BrokerError::NotEnoughReplicas { .. } => code::NOT_ENOUGH_REPLICAS,
        _ => code::NOT_ENOUGH_REPLICAS,
    }
}

fn topic_error_code(e: &TopicError) -> i16 {
    match e {
        TopicError::Exists(_) => code::TOPIC_ALREADY_EXISTS,
        TopicError::Unknown(_) => code::UNKNOWN_TOPIC_OR_PARTITION,
        TopicError::Partitions { .. } => code::INVALID_PARTITIONS,
        TopicError::ReplicationFactor { .. } => code::INVALID_REPLICATION_FACTOR,
        TopicError::Config(_) => code::INVALID_CONFIG,
        TopicError::InvalidName(_) => code::INVALID_TOPIC,
        TopicError::NotApplied(_) => code::UNKNOWN,
        TopicError::Reassignment(_) => code::INVALID_REPLICA_ASSIGNMENT,
    }
}

/// The Kafka code of a Weir error code (group and commit answers).
fn weir_code(c: u16) -> i16 {
    match ErrorCode::from_u16(c) {
        ErrorCode::None => 0,
        ErrorCode::UnknownTopicOrPartition => code::UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode::OffsetOutOfRange => code::OFFSET_OUT_OF_RANGE,
        ErrorCode::InvalidRequest => code::INVALID_REQUEST,
        ErrorCode::Recovering => code::COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode::StorageError => code::COORDINATOR_NOT_AVAILABLE,
        ErrorCode::NotCoordinator => code::NOT_COORDINATOR,
        ErrorCode::RequestTimedOut => code::REQUEST_TIMED_OUT,
        ErrorCode::PolicyViolation => code::POLICY_VIOLATION,
        ErrorCode::UnknownMemberId => code::UNKNOWN_MEMBER_ID,
        ErrorCode::IllegalGeneration => code::ILLEGAL_GENERATION,
        ErrorCode::GroupNotEmpty => code::NON_EMPTY_GROUP,
        ErrorCode::GroupIdNotFound => code::GROUP_ID_NOT_FOUND,
        ErrorCode::InvalidGroupId => code::INVALID_GROUP_ID,
        ErrorCode::InconsistentAssignor => code::INCONSISTENT_GROUP_PROTOCOL,
        ErrorCode::InvalidSessionTimeout => code::INVALID_SESSION_TIMEOUT,
        ErrorCode::FencedMemberEpoch => code::FENCED_MEMBER_EPOCH,
        ErrorCode::StaleMemberEpoch => code::STALE_MEMBER_EPOCH,
        ErrorCode::RebalanceInProgress => code::REBALANCE_IN_PROGRESS,
        ErrorCode::FencedInstanceId => code::FENCED_INSTANCE_ID,
        _ => code::UNKNOWN,
    }
}

// --- metadata ----------------------------------------------------------------

/// Host and port Kafka clients are told to connect to.
fn advertised(core: &Core) -> (String, i32) {
    if let Some((h, p)) = &core.shared.config.kafka_advertised_listener {
        return (h.clone(), i32::from(*p));
    }
    let a = core
        .shared
        .kafka_listen
        .unwrap_or(core.shared.config.listen);
    (a.ip().to_string(), i32::from(a.port()))
}

/// The Kafka brokers this node shows clients: with per-core Kafka ports,
/// one per core of every node of the cluster (node id = the core's
/// cluster-wide index, at its own port; a one-node cluster's ids are its
/// core indexes), so that clients send each partition's requests to the
/// node and core that hold it; else one (node 0, the Kafka listener).
fn endpoints(core: &Core) -> Option<admin::ClusterEndpoints> {
    core.shared.config.kafka_core_port_base?;
    let (host, _) = advertised(core);
    let ports = core
        .shared
        .kafka_core_ports
        .iter()
        .map(|p| p.load(std::sync::atomic::Ordering::Acquire))
        .collect();
    Some(admin::ClusterEndpoints::new(core, true, (host, ports)))
}

fn brokers(core: &Core) -> Vec<(i32, String, i32)> {
    brokers_of(core, endpoints(core).as_ref())
}

/// [`brokers`] from endpoints already built.
fn brokers_of(core: &Core, endpoints: Option<&admin::ClusterEndpoints>) -> Vec<(i32, String, i32)> {
    match endpoints {
        None => {
            let (host, port) = advertised(core);
            vec![(NODE_ID, host, port)]
        }
        Some(e) => e
            .cores
            .iter()
            .enumerate()
            .map(|(i, (host, port))| (i as i32, host.clone(), i32::from(*port)))
            .collect(),
    }
}

/// A partition's leader epoch as this node's metadata has it (-1 where it
/// has none: a partition it does not know).
fn leader_epoch_of(m: &TopicMeta, p: u32) -> i32 {
    m.placement
        .get(p as usize)
        .map_or(-1, |pl| pl.leader_epoch as i32)
}

/// KIP-320: a request's `current_leader_epoch` against the partition's
/// here. Older is FENCED_LEADER_EPOCH (the client's metadata is stale: it
/// refreshes it), newer is UNKNOWN_LEADER_EPOCH (this node's view lags:
/// the client retries). -1, or a partition this node knows no epoch of,
/// is not checked. As in Kafka, checked before leadership.
fn check_leader_epoch(core: &Core, topic: &str, p: i32, current: i32) -> Result<(), i16> {
    if current < 0 || p < 0 {
        return Ok(());
    }
    let view = core.metadata();
    let ours = view.get(topic).map_or(-1, |m| leader_epoch_of(m, p as u32));
    match current.cmp(&ours) {
        _ if ours < 0 => Ok(()),
        std::cmp::Ordering::Less => Err(code::FENCED_LEADER_EPOCH),
        std::cmp::Ordering::Greater => Err(code::UNKNOWN_LEADER_EPOCH),
        std::cmp::Ordering::Equal => Ok(()),
    }
}

/// KIP-951: the leaders this node knows now of partitions a client was
/// refused at (NOT_LEADER_OR_FOLLOWER, a fenced epoch), so that it moves
/// without a Metadata round, and their endpoints for the answer.
struct NewLeaders {
    endpoints: Option<admin::ClusterEndpoints>,
    named: std::collections::BTreeSet<i32>,
}

impl NewLeaders {
    fn new(core: &Core) -> Self {
        NewLeaders {
            endpoints: endpoints(core),
            named: Default::default(),
        }
    }

    /// `(broker, leader epoch)` of `topic`-`p`'s leader, if it has one.
    fn leader(&mut self, core: &Core, topic: &str, p: i32) -> Option<(i32, i32)> {
        let view = core.metadata();
        let m = view
            .get(topic)
            .filter(|m| p >= 0 && (p as u32) < m.partitions())?;
        let broker = match &self.endpoints {
            None => NODE_ID,
            Some(e) => e.leader(topic, m, p as u32)? as i32,
        };
        self.named.insert(broker);
        Some((broker, leader_epoch_of(m, p as u32)))
    }

    /// `(broker, host, port)` of every leader named.
    fn endpoints(&self, core: &Core) -> Vec<(i32, String, i32)> {
        brokers_of(core, self.endpoints.as_ref())
            .into_iter()
            .filter(|(b, _, _)| self.named.contains(b))
            .collect()
    }
}

/// Whether an error code sends a client to look for the leader.
fn leader_moved(code: i16) -> bool {
    matches!(
        code,
        code::NOT_LEADER_OR_FOLLOWER | code::FENCED_LEADER_EPOCH
    )
}

/// `(node, host, port)` of the broker that coordinates `group` (the
/// core leading its offsets partition, on whichever node), or the Kafka
/// error to answer: COORDINATOR_NOT_AVAILABLE while that partition has no
/// live leader (clients retry).
fn coordinator_broker(core: &Core, group: &str) -> Result<(i32, String, i32), i16> {
    let Some(endpoints) = endpoints(core) else {
        let (h, p) = advertised(core);
        return Ok((NODE_ID, h, p));
    };
    let (_, i) =
        coordinator::coordinator_at(core, &endpoints, group).map_err(
            |r| match ErrorCode::from_u16(r.0) {
                ErrorCode::NotCoordinator => code::COORDINATOR_NOT_AVAILABLE,
                _ => weir_code(r.0),
            },
        )?;
    let (host, port) = endpoints
        .cores
        .get(i as usize)
        .ok_or(code::COORDINATOR_NOT_AVAILABLE)?;
    Ok((i as i32, host.clone(), i32::from(*port)))
}

fn uuid_of(meta: &TopicMeta) -> uuid::Uuid {
    uuid::Uuid::parse_str(&meta.id).unwrap_or_default()
}

/// Topic names by id for one request: the index is built at most once,
/// and only if the request names a topic by id, so a lookup is a hash
/// probe rather than a scan of every topic.
struct TopicIds<'a> {
    core: &'a Core,
    by_id: std::cell::OnceCell<HashMap<uuid::Uuid, String>>,
}

impl<'a> TopicIds<'a> {
    fn new(core: &'a Core) -> Self {
        TopicIds {
            core,
            by_id: std::cell::OnceCell::new(),
        }
    }

    /// The topic with this id.
    fn name(&self, id: uuid::Uuid) -> Option<String> {
        if id.is_nil() {
            return None;
        }
        self.by_id
            .get_or_init(|| {
                let view = self.core.metadata();
                view.topics()
                    .iter()
                    .map(|(n, m)| (uuid_of(m), n.clone()))
                    .collect()
            })
            .get(&id)
            .cloned()
    }

    /// A request's topic: by name, or by id where the name is empty.
    fn resolve(&self, name: &str, id: uuid::Uuid) -> Option<String> {
        if name.is_empty() && !id.is_nil() {
            self.name(id)
        } else {
            Some(name.to_string())
        }
    }
}

async fn metadata(core: &Rc<Core>, r: MetadataRequest, version: i16) -> MetadataResponse {
    // Null (v1+) or empty (v0) asks for every topic.
    let wanted: Option<Vec<(Option<String>, uuid::Uuid)>> = match r.topics {
        None => None,
        Some(t) if t.is_empty() && version == 0 => None,
        Some(t) => Some(
            t.into_iter()
                .map(|t| (t.name.map(|n| n.0.to_string()), t.topic_id))
                .collect(),
        ),
    };
    let ids = TopicIds::new(core);
    let names: Option<Vec<String>> = wanted.as_ref().map(|w| {
        w.iter()
            .filter_map(|(n, id)| match n {
                Some(n) => Some(n.clone()),
                None => ids.name(*id),
            })
            .collect()
    });
    let found = if r.allow_auto_topic_creation || version < 4 {
        admin::topics(core, names, true).await
    } else {
        names
            .unwrap_or_else(|| admin::listed_topics(core, true))
            .into_iter()
            .map(|n| {
                let m = core.metadata().get(&n).cloned();
                (n, m)
            })
            .collect()
    };
    let cluster = endpoints(core);
    let mut topics: Vec<MetadataResponseTopic> = found
        .into_iter()
        .map(|(name, meta)| match meta {
            Some(m) => {
                let leader = |p: u32| match &cluster {
                    None => NODE_ID,
                    Some(e) => e.leader(&name, &m, p).map_or(-1, |i| i as i32),
                };
                MetadataResponseTopic::default()
                    .with_name(Some(topic_name(name.clone())))
                    .with_topic_id(uuid_of(&m))
                    .with_is_internal(name == OFFSETS_TOPIC)
                    .with_partitions(
                        (0..m.partitions())
                            .map(|p| {
                                let ids = |v: Vec<u32>| {
                                    v.into_iter().map(|i| BrokerId(i as i32)).collect()
                                };
                                let (replicas, isr) = match &cluster {
                                    Some(e) if m.placement.len() > p as usize => {
                                        let (r, i) = e.replicas(&m, p);
                                        (ids(r), ids(i))
                                    }
                                    _ => (vec![BrokerId(leader(p))], vec![BrokerId(leader(p))]),
                                };
                                MetadataResponsePartition::default()
                                    .with_partition_index(p as i32)
                                    .with_leader_id(BrokerId(leader(p)))
                                    .with_leader_epoch(leader_epoch_of(&m, p))
                                    .with_replica_nodes(replicas)
                                    .with_isr_nodes(isr)
                            })
                            .collect(),
                    )
            }
            None => MetadataResponseTopic::default()
                .with_error_code(code::UNKNOWN_TOPIC_OR_PARTITION)
                .with_name(Some(topic_name(name))),
        })
        .collect();
    // Ids asked for that name no topic.
    if let Some(w) = &wanted {
        for (n, id) in w {
            if n.is_none() && ids.name(*id).is_none() {
                topics.push(
                    MetadataResponseTopic::default()
                        .with_error_code(code::UNKNOWN_TOPIC_ID)
                        .with_topic_id(*id),
                );
            }
        }
    }
    MetadataResponse::default()
        .with_brokers(
            brokers_of(core, cluster.as_ref())
                .into_iter()
                .map(|(node, host, port)| {
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(node))
                        .with_host(s(host))
                        .with_port(port)
                })
                .collect(),
        )
        .with_cluster_id(Some(s(CLUSTER_ID)))
        .with_controller_id(BrokerId(NODE_ID))
        .with_topics(topics)
}

fn find_coordinator(
    core: &Core,
    r: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    // Groups only (key type 0). Transactions are not served: their
    // coordinator lookup gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED, the one
    // answer clients treat as final (COORDINATOR_NOT_AVAILABLE would have
    // them retry until their timeout), with the reason in the message.
    let (error, message) = if r.key_type == 0 {
        (0, None)
    } else {
        (
            code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            Some(s("transactions are not supported by Weir")),
        )
    };
    let lookup = |key: &str| match error {
        0 => coordinator_broker(core, key).map_err(|e| (e, None)),
        e => Err((e, message.clone())),
    };
    if version >= 4 {
        let coordinators = r
            .coordinator_keys
            .into_iter()
            .map(|key| {
                let c = Coordinator::default();
                match lookup(key.as_str()) {
                    Ok((node, host, port)) => c
                        .with_node_id(BrokerId(node))
                        .with_host(s(host))
                        .with_port(port),
                    Err((e, m)) => c
                        .with_error_code(e)
                        .with_error_message(m)
                        .with_node_id(BrokerId(-1))
                        .with_port(-1),
                }
                .with_key(key)
            })
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    match lookup(r.key.as_str()) {
        Ok((node, host, port)) => FindCoordinatorResponse::default()
            .with_node_id(BrokerId(node))
            .with_host(s(host))
            .with_port(port),
        Err((e, m)) => FindCoordinatorResponse::default()
            .with_error_code(e)
            .with_error_message(m)
            .with_node_id(BrokerId(-1))
            .with_port(-1),
    }
}

async fn init_producer_id(core: &Rc<Core>, r: InitProducerIdRequest) -> InitProducerIdResponse {
    if r.transactional_id.is_some() {
        return InitProducerIdResponse::default()
            .with_error_code(code::INVALID_REQUEST)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
    }
    match admin::init_producer_id(core).await {
        Ok(id) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(0),
        Err(e) => InitProducerIdResponse::default()
            .with_error_code(broker_error_code(&e))
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    }
}

// --- produce, fetch, offsets ---------------------------------------------------

async fn produce(
    core: &Rc<Core>,
    h: codec::RequestHeaderInfo,
    r: ProduceRequest,
    ctx: Ctx,
) -> Pending {
    let acks = r.acks;
    let transactional = r.transactional_id.is_some();
    let mut parts = Vec::new();
    let mut names = Vec::new();
    let ids = TopicIds::new(core);
    for t in r.topic_data {
        let topic = ids.resolve(&t.name, t.topic_id);
        names.push((t.name.clone(), t.topic_id, t.partition_data.len()));
        for p in t.partition_data {
            let topic = topic.clone().unwrap_or_default();
            let data = if transactional {
                Err(BrokerError::InvalidRequest(
                    "transactions are not supported by Weir".into(),
                ))
            } else if p.index < 0 {
                Err(BrokerError::unknown(&topic, 0))
            } else if topic.is_empty() {
                Err(BrokerError::unknown("", p.index as u32))
            } else {
                p.records
                    .filter(|b| !b.is_empty())
                    .ok_or_else(|| BrokerError::Corrupt("a partition without records".into()))
            };
            parts.push(ProducePart {
                topic,
                partition: p.index.max(0) as u32,
                data,
            });
        }
    }
    if !(-1..=1).contains(&acks) {
        let e = BrokerError::InvalidRequest(format!("acks {acks}: use -1, 0 or 1"));
        let outcomes = parts
            .into_iter()
            .map(|p| (p.topic, p.partition, Err(e.clone())))
            .collect();
        return Pending::Ready(produce_answer(core, &h, &names, outcomes));
    }
    let timeout = Some(Duration::from_millis(r.timeout_ms.max(0) as u64));
    match service::produce::produce(core, parts, acks as i8, timeout, ctx).await {
        Ok(acked) => {
            let core = core.clone();
            later(async move {
                let outcomes = acked.await;
                if acks == 0 {
                    // acks=0: Kafka sends no answer at all.
                    return Answer::plain(BytesMut::new());
                }
                produce_answer(&core, &h, &names, outcomes)
            })
        }
        Err(e) => {
            let mut outcomes = Vec::new();
            for (n, _, k) in &names {
                for _ in 0..*k {
                    outcomes.push((n.to_string(), 0, Err(e.clone())));
                }
            }
            Pending::Ready(produce_answer(core, &h, &names, outcomes))
        }
    }
}

/// The Produce answer; a partition refused for leadership names its
/// leader as this node knows it now (KIP-951, v10+).
fn produce_answer(
    core: &Core,
    h: &codec::RequestHeaderInfo,
    names: &[(TopicName, uuid::Uuid, usize)],
    outcomes: Vec<service::produce::ProduceOutcome>,
) -> Answer {
    let mut leaders = NewLeaders::new(core);
    let mut it = outcomes.into_iter();
    let responses = names
        .iter()
        .map(|(name, id, n)| {
            let partitions = (0..*n)
                .filter_map(|_| it.next())
                .map(|(topic, p, r)| match r {
                    Ok(ok) => PartitionProduceResponse::default()
                        .with_index(p as i32)
                        .with_base_offset(ok.base_offset as i64)
                        .with_log_append_time_ms(-1)
                        .with_log_start_offset(ok.log_start_offset as i64),
                    Err(e) => {
                        let code = broker_error_code(&e);
                        let mut d = PartitionProduceResponse::default()
                            .with_index(p as i32)
                            .with_error_code(code)
                            .with_error_message(Some(s(e.to_string())))
                            .with_base_offset(-1)
                            .with_log_append_time_ms(-1)
                            .with_log_start_offset(-1);
                        if h.api_version >= 10 && leader_moved(code) {
                            if let Some((b, epoch)) = leaders.leader(core, &topic, p as i32) {
                                d = d.with_current_leader(
                                    produce_response::LeaderIdAndEpoch::default()
                                        .with_leader_id(BrokerId(b))
                                        .with_leader_epoch(epoch),
                                );
                            }
                        }
                        d
                    }
                })
                .collect();
            TopicProduceResponse::default()
                .with_name(name.clone())
                .with_topic_id(*id)
                .with_partition_responses(partitions)
        })
        .collect();
    let endpoints = leaders
        .endpoints(core)
        .into_iter()
        .map(|(b, host, port)| {
            produce_response::NodeEndpoint::default()
                .with_node_id(BrokerId(b))
                .with_host(s(host))
                .with_port(port)
        })
        .collect();
    answer(
        h,
        KafkaResponse::Produce(
            ProduceResponse::default()
                .with_responses(responses)
                .with_node_endpoints(endpoints),
        ),
    )
}

/// A fetched topic as the request named it, and per partition its slot
/// among the partitions read, or the error answered at once.
type FetchShape = (TopicName, uuid::Uuid, Vec<(i32, Result<usize, i16>)>);

async fn fetch(core: &Rc<Core>, h: codec::RequestHeaderInfo, r: FetchRequest, ctx: Ctx) -> Answer {
    // Topics, by name or id, and their partitions: what to read, and what
    // is answered at once (unknown topic id, bad partition index).
    let mut shape: Vec<FetchShape> = Vec::new();
    let mut parts: Vec<FetchPart> = Vec::new();
    let ids = TopicIds::new(core);
    for t in r.topics {
        let topic = ids.resolve(&t.topic, t.topic_id);
        let mut ps = Vec::new();
        for p in t.partitions {
            let slot = match (&topic, p.partition >= 0 && p.fetch_offset >= 0) {
                (Some(name), true) => {
                    check_leader_epoch(core, name, p.partition, p.current_leader_epoch).map(|()| {
                        parts.push(FetchPart {
                            topic: name.clone(),
                            partition: p.partition as u32,
                            offset: p.fetch_offset as u64,
                            max_bytes: p.partition_max_bytes.max(0) as u32,
                        });
                        parts.len() - 1
                    })
                }
                _ if !t.topic_id.is_nil() && t.topic.is_empty() => Err(code::UNKNOWN_TOPIC_ID),
                _ => Err(code::UNKNOWN_TOPIC_OR_PARTITION),
            };
            ps.push((p.partition, slot));
        }
        shape.push((t.topic.clone(), t.topic_id, ps));
    }
    let params = FetchParams {
        max_bytes: r.max_bytes.max(0) as u32,
        min_bytes: r.min_bytes.max(0) as u32,
        max_wait_ms: r.max_wait_ms.max(0) as u32,
    };
    let results = match service::fetch::fetch(core, &parts, params, ctx).await {
        Ok(r) => r,
        Err(e) => {
            // A request-level refusal (too many partitions): Kafka's
            // top-level error exists from v7; before, the connection is
            // closed.
            if h.api_version < 7 {
                return closing();
            }
            let resp = FetchResponse::default().with_error_code(broker_error_code(&e));
            return answer(&h, KafkaResponse::Fetch(resp));
        }
    };
    let mut batches = codec::FetchBatches::default();
    // KIP-951 (v12+ name the leader, v16+ its endpoint).
    let mut leaders = NewLeaders::new(core);
    let responses = shape
        .into_iter()
        .map(|(name, id, ps)| {
            let topic = ids.resolve(&name, id).unwrap_or_default();
            let partitions = ps
                .into_iter()
                .map(|(index, slot)| {
                    let d = PartitionData::default()
                        .with_partition_index(index)
                        .with_aborted_transactions(Some(Vec::new()))
                        .with_records(Some(Bytes::new()));
                    let mut refused = |d: PartitionData, code: i16| {
                        let d = d
                            .with_error_code(code)
                            .with_high_watermark(-1)
                            .with_last_stable_offset(-1)
                            .with_log_start_offset(-1);
                        if h.api_version < 12 || !leader_moved(code) {
                            return d;
                        }
                        match leaders.leader(core, &topic, index) {
                            Some((b, epoch)) => d.with_current_leader(
                                fetch_response::LeaderIdAndEpoch::default()
                                    .with_leader_id(BrokerId(b))
                                    .with_leader_epoch(epoch),
                            ),
                            None => d,
                        }
                    };
                    match slot.map(|i| &results[i]) {
                        Err(c @ (code::UNKNOWN_TOPIC_ID | code::UNKNOWN_TOPIC_OR_PARTITION)) => {
                            d.with_error_code(c)
                        }
                        Err(c) => refused(d, c),
                        Ok(Err(e)) => refused(d, broker_error_code(e)),
                        Ok(Ok(ok)) => {
                            // Never null: clients read an empty record set
                            // as size 0, and librdkafka refuses -1. Several
                            // batches go out as they are, not concatenated.
                            let records = batches.records(&ok.batches);
                            d.with_high_watermark(ok.high_watermark as i64)
                                .with_last_stable_offset(ok.high_watermark as i64)
                                .with_log_start_offset(ok.log_start_offset as i64)
                                .with_records(Some(records))
                        }
                    }
                })
                .collect();
            FetchableTopicResponse::default()
                .with_topic(name)
                .with_topic_id(id)
                .with_partitions(partitions)
        })
        .collect();
    let endpoints = leaders
        .endpoints(core)
        .into_iter()
        .map(|(b, host, port)| {
            fetch_response::NodeEndpoint::default()
                .with_node_id(BrokerId(b))
                .with_host(s(host))
                .with_port(port)
        })
        .collect();
    let resp = FetchResponse::default()
        .with_responses(responses)
        .with_node_endpoints(endpoints);
    match codec::encode_fetch_response(&h, &resp, batches) {
        Ok(seg) => Answer {
            head: seg.head,
            payload: seg.payload,
            close: false,
        },
        Err(e) => {
            tracing::warn!(error = %e, "Kafka fetch answer not encoded");
            closing()
        }
    }
}

async fn list_offsets(core: &Rc<Core>, r: ListOffsetsRequest, version: i16) -> ListOffsetsResponse {
    let mut queries = Vec::new();
    let mut shape = Vec::new();
    for t in r.topics {
        let mut ps = Vec::new();
        for p in t.partitions {
            let q = match p.timestamp {
                -2 => Some(OffsetQuery::Earliest),
                -1 => Some(OffsetQuery::Latest),
                ts if ts >= 0 => Some(OffsetQuery::Timestamp(ts)),
                _ => None,
            };
            let slot = match (q, p.partition_index >= 0) {
                (Some(q), true) => {
                    check_leader_epoch(core, &t.name, p.partition_index, p.current_leader_epoch)
                        .map(|()| {
                            queries.push((t.name.to_string(), p.partition_index as u32, q));
                            queries.len() - 1
                        })
                }
                _ => Err(code::INVALID_REQUEST),
            };
            ps.push((p.partition_index, p.timestamp, slot));
        }
        shape.push((t.name, ps));
    }
    let results = service::offsets::list_offsets(core, &queries).await;
    let topics = shape
        .into_iter()
        .map(|(name, ps)| {
            let partitions = ps
                .into_iter()
                .map(|(index, ts, slot)| {
                    let d = ListOffsetsPartitionResponse::default()
                        .with_partition_index(index)
                        .with_leader_epoch(-1);
                    let r = match (&results, slot) {
                        (_, Err(c)) => Err(c),
                        (Err(e), _) => Err(broker_error_code(e)),
                        (Ok(all), Ok(i)) => all[i].as_ref().map_err(broker_error_code).copied(),
                    };
                    match r {
                        Ok(Listed {
                            offset: Some(o),
                            leader_epoch,
                        }) => d
                            .with_offset(o as i64)
                            .with_timestamp(if ts >= 0 { ts } else { -1 })
                            // From v4 (older versions have no field).
                            .with_leader_epoch(match leader_epoch {
                                Some(e) if version >= 4 => e as i32,
                                _ => -1,
                            }),
                        Ok(Listed { offset: None, .. }) => d.with_offset(-1).with_timestamp(-1),
                        Err(c) => d.with_error_code(c).with_offset(-1).with_timestamp(-1),
                    }
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(name)
                .with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

// --- topics ------------------------------------------------------------------

async fn create_topics(
    core: &Rc<Core>,
    r: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let mut out = Vec::new();
    for t in r.topics {
        let name = t.name.to_string();
        let partitions = if t.num_partitions < 0 {
            core.shared.config.default_partitions
        } else {
            t.num_partitions as u32
        };
        // -1: the broker's default (one replica).
        let rf = if t.replication_factor < 0 {
            1
        } else {
            t.replication_factor as u32
        };
        let mut result = CreatableTopicResult::default().with_name(t.name.clone());
        if version >= 5 {
            result = result
                .with_num_partitions(partitions as i32)
                .with_replication_factor(rf as i16);
        }
        let configs = t
            .configs
            .into_iter()
            .filter_map(|c| c.value.map(|v| (c.name.to_string(), v.to_string())))
            .collect();
        let mut spec = TopicSpec::new(partitions, configs);
        spec.replication_factor = rf;
        let change = Change::Create(name.clone(), spec);
        let done = if r.validate_only {
            admin::validate_change(core, change)
        } else {
            admin::change_topic(core, change).await
        };
        out.push(match done {
            Ok(()) => {
                let id = core.metadata().get(&name).map(uuid_of).unwrap_or_default();
                result.with_topic_id(id)
            }
            Err(e) => result
                .with_error_code(topic_error_code(&e))
                .with_error_message(Some(s(e.to_string()))),
        });
    }
    CreateTopicsResponse::default().with_topics(out)
}

async fn delete_topics(core: &Rc<Core>, r: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let mut wanted: Vec<(Option<String>, uuid::Uuid)> = r
        .topic_names
        .into_iter()
        .map(|n| (Some(n.to_string()), uuid::Uuid::nil()))
        .collect();
    wanted.extend(
        r.topics
            .into_iter()
            .map(|t| (t.name.map(|n| n.to_string()), t.topic_id)),
    );
    let mut out = Vec::new();
    let ids = TopicIds::new(core);
    for (name, id) in wanted {
        let resolved = name.clone().or_else(|| ids.name(id));
        let result = DeletableTopicResult::default()
            .with_name(name.clone().map(topic_name))
            .with_topic_id(id);
        let Some(topic) = resolved else {
            out.push(result.with_error_code(code::UNKNOWN_TOPIC_ID));
            continue;
        };
        out.push(
            match admin::change_topic(core, Change::Delete(topic)).await {
                Ok(()) => result,
                Err(e) => result
                    .with_error_code(topic_error_code(&e))
                    .with_error_message(Some(s(e.to_string()))),
            },
        );
    }
    DeleteTopicsResponse::default().with_responses(out)
}

// --- groups ------------------------------------------------------------------

async fn group(core: &Rc<Core>, req: GroupRequest) -> GroupResponse {
    coordinator::serve(core, req).await
}

fn classic_code(e: &Option<classic::ClassicError>) -> i16 {
    e.as_ref().map_or(0, |e| e.kafka_code())
}

async fn join_group(
    core: &Rc<Core>,
    r: JoinGroupRequest,
    version: i16,
    client_id: String,
) -> JoinGroupResponse {
    let request = classic::JoinRequest {
        member_id: r.member_id.to_string(),
        group_instance_id: r.group_instance_id.map(|i| i.to_string()),
        client_id,
        client_host: String::new(),
        protocol_type: r.protocol_type.to_string(),
        protocols: r
            .protocols
            .into_iter()
            .map(|p| (p.name.to_string(), p.metadata))
            .collect(),
        session_timeout_ms: r.session_timeout_ms.max(0) as u32,
        rebalance_timeout_ms: if version == 0 {
            r.session_timeout_ms.max(0) as u32
        } else {
            r.rebalance_timeout_ms.max(0) as u32
        },
        require_known_member_id: version >= 4,
    };
    let req = GroupRequest::ClassicJoin {
        group: r.group_id.to_string(),
        request,
    };
    match group(core, req).await {
        GroupResponse::ClassicJoin(j) => JoinGroupResponse::default()
            .with_error_code(classic_code(&j.error))
            .with_generation_id(j.generation_id)
            .with_protocol_type(j.protocol_type.map(s))
            .with_protocol_name(j.protocol_name.map(s))
            .with_leader(s(j.leader))
            .with_member_id(s(j.member_id))
            .with_members(
                j.members
                    .into_iter()
                    .map(|m| {
                        JoinGroupResponseMember::default()
                            .with_member_id(s(m.member_id))
                            .with_group_instance_id(m.group_instance_id.map(s))
                            .with_metadata(m.metadata)
                    })
                    .collect(),
            ),
        other => JoinGroupResponse::default()
            .with_error_code(refused_code(&other))
            .with_generation_id(-1),
    }
}

/// The Kafka code of a coordinator-level refusal.
fn refused_code(r: &GroupResponse) -> i16 {
    match r {
        GroupResponse::Refused(c, _) => weir_code(*c),
        _ => code::UNKNOWN,
    }
}

async fn sync_group(core: &Rc<Core>, r: SyncGroupRequest) -> SyncGroupResponse {
    let request = classic::SyncRequest {
        member_id: r.member_id.to_string(),
        group_instance_id: r.group_instance_id.map(|i| i.to_string()),
        generation_id: r.generation_id,
        protocol_type: r.protocol_type.map(|p| p.to_string()),
        protocol_name: r.protocol_name.map(|p| p.to_string()),
        assignments: r
            .assignments
            .into_iter()
            .map(|a| (a.member_id.to_string(), a.assignment))
            .collect(),
    };
    let req = GroupRequest::ClassicSync {
        group: r.group_id.to_string(),
        request,
    };
    match group(core, req).await {
        GroupResponse::ClassicSync(x) => SyncGroupResponse::default()
            .with_error_code(classic_code(&x.error))
            .with_protocol_type(x.protocol_type.map(s))
            .with_protocol_name(x.protocol_name.map(s))
            .with_assignment(x.assignment),
        other => SyncGroupResponse::default().with_error_code(refused_code(&other)),
    }
}

async fn heartbeat(core: &Rc<Core>, r: HeartbeatRequest) -> HeartbeatResponse {
    let req = GroupRequest::ClassicHeartbeat {
        group: r.group_id.to_string(),
        member_id: r.member_id.to_string(),
        instance_id: r.group_instance_id.map(|i| i.to_string()),
        generation: r.generation_id,
    };
    let error = match group(core, req).await {
        GroupResponse::ClassicHeartbeat(Ok(())) => 0,
        GroupResponse::ClassicHeartbeat(Err(e)) => e.kafka_code(),
        other => refused_code(&other),
    };
    HeartbeatResponse::default().with_error_code(error)
}

async fn leave_group(core: &Rc<Core>, r: LeaveGroupRequest, version: i16) -> LeaveGroupResponse {
    // v0–2 name one member; v3+ a batch.
    let members: Vec<(String, Option<String>)> = if r.members.is_empty() {
        vec![(r.member_id.to_string(), None)]
    } else {
        r.members
            .iter()
            .map(|m| {
                (
                    m.member_id.to_string(),
                    m.group_instance_id.as_ref().map(|i| i.to_string()),
                )
            })
            .collect()
    };
    let req = GroupRequest::ClassicLeave {
        group: r.group_id.to_string(),
        members: members.clone(),
    };
    match group(core, req).await {
        GroupResponse::ClassicLeave(results) => {
            let codes: Vec<i16> = results
                .iter()
                .map(|r| r.as_ref().err().map_or(0, |e| e.kafka_code()))
                .collect();
            if version < 3 {
                return LeaveGroupResponse::default().with_error_code(codes[0]);
            }
            LeaveGroupResponse::default().with_members(
                members
                    .into_iter()
                    .zip(codes)
                    .map(|((m, i), c)| {
                        MemberResponse::default()
                            .with_member_id(s(m))
                            .with_group_instance_id(i.map(s))
                            .with_error_code(c)
                    })
                    .collect(),
            )
        }
        other => LeaveGroupResponse::default().with_error_code(refused_code(&other)),
    }
}

async fn offset_commit(core: &Rc<Core>, r: OffsetCommitRequest) -> OffsetCommitResponse {
    let mut offsets = Vec::new();
    let mut bad = Vec::new();
    for t in &r.topics {
        for p in &t.partitions {
            if p.committed_offset < 0 || p.partition_index < 0 {
                bad.push((t.name.to_string(), p.partition_index));
                continue;
            }
            offsets.push(native::CommitOffset {
                topic: t.name.to_string(),
                partition: p.partition_index as u32,
                offset: p.committed_offset as u64,
                metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
            });
        }
    }
    let req = GroupRequest::Commit(native::OffsetCommitRequest {
        group: r.group_id.to_string(),
        member_id: r.member_id.to_string(),
        generation: r.generation_id_or_member_epoch,
        offsets,
    });
    let mut codes: HashMap<(String, i32), i16> = HashMap::new();
    match group(core, req).await {
        GroupResponse::Commit(c) => {
            let top = weir_code(c.error);
            for p in c.partitions {
                let e = if top != 0 { top } else { weir_code(p.error) };
                codes.insert((p.topic, p.partition as i32), e);
            }
            if top != 0 {
                for t in &r.topics {
                    for p in &t.partitions {
                        codes.insert((t.name.to_string(), p.partition_index), top);
                    }
                }
            }
        }
        other => {
            let c = refused_code(&other);
            for t in &r.topics {
                for p in &t.partitions {
                    codes.insert((t.name.to_string(), p.partition_index), c);
                }
            }
        }
    }
    for k in bad {
        codes.insert(k, code::INVALID_REQUEST);
    }
    let topics = r
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.to_string();
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(
                            *codes
                                .get(&(name.clone(), p.partition_index))
                                .unwrap_or(&code::UNKNOWN),
                        )
                })
                .collect();
            OffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_topic_id(t.topic_id)
                .with_partitions(partitions)
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}

/// One group's committed offsets for the asked partitions (`None`: all).
async fn committed(
    core: &Rc<Core>,
    group_id: &str,
    asked: Option<Vec<(String, Vec<i32>)>>,
) -> (i16, Vec<(String, Vec<(i32, i64, Option<String>)>)>) {
    let req = GroupRequest::Fetch(native::OffsetFetchRequest {
        group: group_id.to_string(),
        partitions: None,
    });
    let offsets = match group(core, req).await {
        GroupResponse::Fetch(f) if f.error == 0 => f.offsets,
        GroupResponse::Fetch(f) => return (weir_code(f.error), Vec::new()),
        other => return (refused_code(&other), Vec::new()),
    };
    let mut by: std::collections::BTreeMap<String, Vec<(i32, i64, Option<String>)>> =
        Default::default();
    for o in &offsets {
        by.entry(o.topic.clone()).or_default().push((
            o.partition as i32,
            o.offset as i64,
            o.metadata.clone(),
        ));
    }
    let out = match asked {
        None => by.into_iter().collect(),
        Some(asked) => asked
            .into_iter()
            .map(|(t, ps)| {
                let have = by.get(&t);
                let rows = ps
                    .into_iter()
                    .map(|p| {
                        have.and_then(|h| h.iter().find(|(q, _, _)| *q == p).cloned())
                            .unwrap_or((p, -1, Some(String::new())))
                    })
                    .collect();
                (t, rows)
            })
            .collect(),
    };
    (0, out)
}

/// Committed offsets as OffsetFetch answers them: v1–7 and v8+ have the
/// same shape in different generated types.
macro_rules! committed_topics {
    ($topic:ident, $partition:ident, $topics:expr) => {
        $topics
            .into_iter()
            .map(|(t, rows)| {
                $topic::default().with_name(topic_name(t)).with_partitions(
                    rows.into_iter()
                        .map(|(p, o, m)| {
                            $partition::default()
                                .with_partition_index(p)
                                .with_committed_offset(o)
                                .with_committed_leader_epoch(-1)
                                .with_metadata(m.map(s))
                        })
                        .collect(),
                )
            })
            .collect()
    };
}

/// The partitions an OffsetFetch names per topic (`None`: all).
fn asked<T>(
    topics: Option<Vec<T>>,
    f: impl Fn(T) -> (String, Vec<i32>),
) -> Option<Vec<(String, Vec<i32>)>> {
    topics.map(|ts| ts.into_iter().map(f).collect())
}

async fn offset_fetch(core: &Rc<Core>, r: OffsetFetchRequest, version: i16) -> OffsetFetchResponse {
    if version >= 8 {
        let mut groups = Vec::new();
        for g in r.groups {
            let wanted = asked(g.topics, |t| (t.name.to_string(), t.partition_indexes));
            let (error, topics) = committed(core, &g.group_id, wanted).await;
            groups.push(
                OffsetFetchResponseGroup::default()
                    .with_group_id(g.group_id)
                    .with_error_code(error)
                    .with_topics(committed_topics!(
                        OffsetFetchResponseTopics,
                        OffsetFetchResponsePartitions,
                        topics
                    )),
            );
        }
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let wanted = asked(r.topics, |t| (t.name.to_string(), t.partition_indexes));
    let (error, topics) = committed(core, &r.group_id, wanted).await;
    OffsetFetchResponse::default()
        .with_error_code(error)
        .with_topics(committed_topics!(
            OffsetFetchResponseTopic,
            OffsetFetchResponsePartition,
            topics
        ))
}

/// ListGroups: every group with its type (`consumer`: KIP-848 and native
/// members; `classic`), filtered by state (v4+) and type (v5+) as asked
/// (case-insensitive; an empty filter keeps all).
async fn list_groups(core: &Rc<Core>, r: ListGroupsRequest) -> ListGroupsResponse {
    let keep = |filter: &[StrBytes], v: &str| {
        filter.is_empty() || filter.iter().any(|f| f.as_str().eq_ignore_ascii_case(v))
    };
    match group(core, GroupRequest::List).await {
        GroupResponse::List(l) => ListGroupsResponse::default().with_groups(
            l.into_iter()
                .filter(|(g, kind)| keep(&r.states_filter, &g.state) && keep(&r.types_filter, kind))
                .map(|(g, kind)| {
                    ListedGroup::default()
                        .with_group_id(GroupId(s(g.group)))
                        .with_protocol_type(s("consumer"))
                        .with_group_state(s(g.state))
                        .with_group_type(s(kind))
                })
                .collect(),
        ),
        other => ListGroupsResponse::default().with_error_code(refused_code(&other)),
    }
}

async fn describe_groups(
    core: &Rc<Core>,
    r: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let mut out = Vec::new();
    for g in r.groups {
        let req = GroupRequest::DescribeWithBytes(native::DescribeGroupRequest {
            group: g.to_string(),
        });
        let d = DescribedGroup::default().with_group_id(g.clone());
        out.push(match group(core, req).await {
            GroupResponse::DescribeWithBytes(x, bytes) if x.error == 0 => {
                let mut bytes: HashMap<String, coordinator::ClassicMemberBytes> = bytes
                    .into_iter()
                    .map(|b| (b.member_id.clone(), b))
                    .collect();
                d.with_group_state(s(x.state))
                    .with_protocol_type(s("consumer"))
                    .with_protocol_data(s(x.assignor))
                    .with_members(
                        x.members
                            .into_iter()
                            .map(|m| {
                                // Classic members: what their clients sent;
                                // members of consumer groups have none.
                                let b = bytes.remove(&m.member_id).unwrap_or_default();
                                DescribedGroupMember::default()
                                    .with_member_id(s(m.member_id))
                                    .with_group_instance_id(m.instance_id.map(s))
                                    .with_client_id(s(m.client_id))
                                    .with_client_host(s(b.client_host))
                                    .with_member_metadata(b.metadata)
                                    .with_member_assignment(b.assignment)
                            })
                            .collect(),
                    )
            }
            GroupResponse::DescribeWithBytes(x, _)
                if ErrorCode::from_u16(x.error) == ErrorCode::GroupIdNotFound && version < 6 =>
            {
                // Before v6 Kafka answers an unknown group as Dead.
                d.with_group_state(s("Dead"))
            }
            GroupResponse::DescribeWithBytes(x, _) => d
                .with_error_code(weir_code(x.error))
                .with_error_message(x.message.filter(|_| version >= 6).map(s)),
            other => d.with_error_code(refused_code(&other)),
        });
    }
    DescribeGroupsResponse::default().with_groups(out)
}

async fn delete_groups(core: &Rc<Core>, r: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut out = Vec::new();
    for g in r.groups_names {
        let req = GroupRequest::Delete(native::DeleteGroupRequest {
            group: g.to_string(),
        });
        let error = match group(core, req).await {
            GroupResponse::Result(x) => weir_code(x.error),
            other => refused_code(&other),
        };
        out.push(
            DeletableGroupResult::default()
                .with_group_id(g)
                .with_error_code(error),
        );
    }
    DeleteGroupsResponse::default().with_results(out)
}

/// ConsumerGroupDescribe (KIP-848): groups of the consumer protocol with
/// their epochs and each member's current and target assignment; a
/// classic group is GROUP_ID_NOT_FOUND ("not a consumer group"), as Kafka
/// answers.
async fn consumer_group_describe(
    core: &Rc<Core>,
    r: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    use kafka_protocol::messages::consumer_group_describe_response::{
        Assignment, DescribedGroup as CgGroup, Member, TopicPartitions as CgTopicPartitions,
    };
    let assignment = |tps: Vec<native::TopicPartitions>| {
        Assignment::default().with_topic_partitions(
            tps.into_iter()
                .filter_map(|tp| {
                    let id = core.metadata().get(&tp.topic).map(uuid_of)?;
                    Some(
                        CgTopicPartitions::default()
                            .with_topic_id(id)
                            .with_topic_name(topic_name(tp.topic))
                            .with_partitions(tp.partitions.into_iter().map(|p| p as i32).collect()),
                    )
                })
                .collect(),
        )
    };
    let mut out = Vec::new();
    for g in r.group_ids {
        let req = GroupRequest::Describe(native::DescribeGroupRequest {
            group: g.to_string(),
        });
        let d = CgGroup::default().with_group_id(g.clone());
        out.push(match group(core, req).await {
            GroupResponse::Describe(x) if x.error == 0 && x.kind == "consumer" => d
                .with_group_state(s(x.state))
                .with_group_epoch(x.generation)
                .with_assignment_epoch(x.assignment_epoch)
                .with_assignor_name(s(x.assignor))
                .with_members(
                    x.members
                        .into_iter()
                        .map(|m| {
                            let mut owned = m.owned;
                            owned.extend(m.revoking);
                            Member::default()
                                .with_member_id(s(m.member_id))
                                .with_instance_id(m.instance_id.map(s))
                                .with_member_epoch(m.member_epoch)
                                .with_client_id(s(m.client_id))
                                .with_subscribed_topic_names(
                                    m.topics.into_iter().map(topic_name).collect(),
                                )
                                .with_assignment(assignment(owned))
                                .with_target_assignment(assignment(m.assignment))
                                .with_member_type(1)
                        })
                        .collect(),
                ),
            GroupResponse::Describe(x) if x.error == 0 => d
                .with_error_code(code::GROUP_ID_NOT_FOUND)
                .with_error_message(Some(s(format!(
                    "Group {} is not a consumer group.",
                    g.as_str()
                )))),
            GroupResponse::Describe(x) => d
                .with_error_code(weir_code(x.error))
                .with_error_message(x.message.map(s)),
            other => d.with_error_code(refused_code(&other)),
        });
    }
    ConsumerGroupDescribeResponse::default().with_groups(out)
}

// --- more admin --------------------------------------------------------------

/// DeleteRecords: raises each partition's log start offset (offset -1:
/// to the high watermark); answers the new low watermark.
async fn delete_records(core: &Rc<Core>, r: DeleteRecordsRequest) -> DeleteRecordsResponse {
    use kafka_protocol::messages::delete_records_response::{
        DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
    };
    let asked: usize = r.topics.iter().map(|t| t.partitions.len()).sum();
    let too_many = asked > REQUEST_PARTITIONS_MAX;
    let mut topics = Vec::with_capacity(r.topics.len());
    for t in r.topics {
        let name = t.name.to_string();
        let mut parts = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let res = DeleteRecordsPartitionResult::default()
                .with_partition_index(p.partition_index)
                .with_low_watermark(-1);
            let outcome = if too_many {
                Err(code::INVALID_REQUEST)
            } else if p.partition_index < 0 {
                Err(code::UNKNOWN_TOPIC_OR_PARTITION)
            } else {
                service::offsets::delete_records(core, &name, p.partition_index as u32, p.offset)
                    .await
                    .map_err(|e| broker_error_code(&e))
            };
            parts.push(match outcome {
                Ok(low) => res.with_low_watermark(low as i64),
                Err(c) => res.with_error_code(c),
            });
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(parts),
        );
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

async fn create_partitions(
    core: &Rc<Core>,
    r: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut out = Vec::new();
    for t in r.topics {
        let result = CreatePartitionsTopicResult::default().with_name(t.name.clone());
        let done = if t.count < 0 {
            Err(TopicError::Partitions {
                topic: t.name.to_string(),
                count: 0,
                reason: "negative count".into(),
            })
        } else {
            let change = Change::AddPartitions(t.name.to_string(), t.count as u32);
            if r.validate_only {
                admin::validate_change(core, change)
            } else {
                admin::change_topic(core, change).await
            }
        };
        out.push(match done {
            Ok(()) => result,
            Err(e) => result
                .with_error_code(topic_error_code(&e))
                .with_error_message(Some(s(e.to_string()))),
        });
    }
    CreatePartitionsResponse::default().with_results(out)
}

/// Kafka's config resource types.
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// Kafka's config sources.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_DEFAULT: i8 = 5;

async fn describe_configs(core: &Rc<Core>, r: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let mut out = Vec::new();
    for res in r.resources {
        let result = DescribeConfigsResult::default()
            .with_resource_type(res.resource_type)
            .with_resource_name(res.resource_name.clone());
        let keys: Option<Vec<String>> = res
            .configuration_keys
            .map(|k| k.into_iter().map(|k| k.to_string()).collect());
        let wanted = |k: &str| keys.as_ref().is_none_or(|ks| ks.iter().any(|x| x == k));
        match res.resource_type {
            RESOURCE_TOPIC => {
                let name = res.resource_name.to_string();
                let explicit = core
                    .metadata()
                    .get(&name)
                    .map(|m| m.configs.clone())
                    .unwrap_or_default();
                let described = admin::describe(core, vec![name.clone()]).await;
                out.push(match described.into_iter().next().and_then(|(_, d)| d) {
                    Some(d) => result.with_configs(
                        d.configs
                            .into_iter()
                            .filter(|(k, _)| wanted(k))
                            .map(|(k, v)| {
                                let source = if explicit.contains_key(&k) {
                                    SOURCE_TOPIC
                                } else {
                                    SOURCE_DEFAULT
                                };
                                DescribeConfigsResourceResult::default()
                                    .with_name(s(k))
                                    .with_value(Some(s(v)))
                                    .with_config_source(source)
                            })
                            .collect(),
                    ),
                    None => result
                        .with_error_code(code::UNKNOWN_TOPIC_OR_PARTITION)
                        .with_error_message(Some(s(format!("unknown topic `{name}`")))),
                });
            }
            // This node's settings are flags, not Kafka broker configs:
            // an empty list.
            RESOURCE_BROKER => out.push(result),
            t => out.push(
                result
                    .with_error_code(code::INVALID_REQUEST)
                    .with_error_message(Some(s(format!("config resource type {t} is not served")))),
            ),
        }
    }
    DescribeConfigsResponse::default().with_results(out)
}

async fn alter_configs(
    core: &Rc<Core>,
    r: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut out = Vec::new();
    for res in r.resources {
        let result = AlterConfigsResourceResponse::default()
            .with_resource_type(res.resource_type)
            .with_resource_name(res.resource_name.clone());
        if res.resource_type != RESOURCE_TOPIC {
            out.push(
                result
                    .with_error_code(code::INVALID_REQUEST)
                    .with_error_message(Some(s("only topic configs can be changed"))),
            );
            continue;
        }
        // Kafka's operations: 0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT.
        let mut ops = Vec::new();
        let mut refused = None;
        for c in res.configs {
            let name = c.name.to_string();
            match (c.config_operation, c.value) {
                (0, Some(v)) => ops.push(ConfigOp::Set(name, v.to_string())),
                (1, _) => ops.push(ConfigOp::Delete(name)),
                (2, Some(v)) => ops.push(ConfigOp::Append(name, v.to_string())),
                (3, Some(v)) => ops.push(ConfigOp::Subtract(name, v.to_string())),
                (op @ 0..=3, None) => {
                    refused = Some(format!("config `{name}`: operation {op} needs a value"))
                }
                (op, _) => {
                    refused = Some(format!(
                        "config `{name}`: unknown operation {op} (0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT)"
                    ))
                }
            }
        }
        let done = match refused {
            Some(m) => Err((code::INVALID_REQUEST, m)),
            None if r.validate_only => {
                admin::validate_change(core, Change::Alter(res.resource_name.to_string(), ops))
                    .map_err(|e| (topic_error_code(&e), e.to_string()))
            }
            None => admin::change_topic(core, Change::Alter(res.resource_name.to_string(), ops))
                .await
                .map_err(|e| (topic_error_code(&e), e.to_string())),
        };
        out.push(match done {
            Ok(()) => result,
            Err((c, m)) => result.with_error_code(c).with_error_message(Some(s(m))),
        });
    }
    IncrementalAlterConfigsResponse::default().with_responses(out)
}

/// Where each asked leader epoch ends in the partition's log (KIP-320: a
/// consumer that resumes at an offset with the epoch that wrote it learns
/// whether the log it read from was truncated below it): the largest
/// epoch at or below the one asked and the start of the next, capped at
/// the high watermark (a consumer never reads past it); -1 and -1 when
/// the log has no epoch that old.
async fn offset_for_leader_epoch(
    core: &Rc<Core>,
    r: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let mut topics = Vec::new();
    for t in r.topics {
        let mut partitions = Vec::new();
        for p in t.partitions {
            let e = EpochEndOffset::default().with_partition(p.partition);
            let r = if p.partition < 0 {
                Err(code::UNKNOWN_TOPIC_OR_PARTITION)
            } else {
                match check_leader_epoch(core, &t.topic, p.partition, p.current_leader_epoch) {
                    Err(c) => Err(c),
                    Ok(()) => service::offsets::offsets(core, &t.topic, p.partition as u32, None)
                        .await
                        .map_err(|e| broker_error_code(&e)),
                }
            };
            partitions.push(match r {
                Ok(o) => {
                    let hw = o.high_watermark;
                    let asked = p.leader_epoch.max(0) as u32;
                    match weir_storage::epochs::end_offset_in(&o.leader_epochs, asked, hw)
                        .filter(|_| p.leader_epoch >= 0)
                    {
                        Some((epoch, end)) => e
                            .with_leader_epoch(epoch as i32)
                            .with_end_offset(end.min(hw) as i64),
                        None => e.with_leader_epoch(-1).with_end_offset(-1),
                    }
                }
                Err(c) => e
                    .with_error_code(c)
                    .with_leader_epoch(-1)
                    .with_end_offset(-1),
            });
        }
        topics.push(
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic)
                .with_partitions(partitions),
        );
    }
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}

fn describe_cluster(core: &Core) -> DescribeClusterResponse {
    DescribeClusterResponse::default()
        .with_cluster_id(s(CLUSTER_ID))
        .with_controller_id(BrokerId(NODE_ID))
        .with_brokers(
            brokers(core)
                .into_iter()
                .map(|(node, host, port)| {
                    DescribeClusterBroker::default()
                        .with_broker_id(BrokerId(node))
                        .with_host(s(host))
                        .with_port(port)
                })
                .collect(),
        )
}

// --- KIP-848 -----------------------------------------------------------------

/// Kafka's server assignor names onto Weir's.
fn assignor_name(name: &str) -> String {
    match name {
        "uniform" => "cooperative-sticky".to_string(),
        other => other.to_string(),
    }
}

async fn consumer_group_heartbeat(
    core: &Rc<Core>,
    r: ConsumerGroupHeartbeatRequest,
    client_id: String,
) -> ConsumerGroupHeartbeatResponse {
    use std::collections::BTreeSet;
    let ids = TopicIds::new(core);
    let owned: Option<BTreeSet<(String, u32)>> = r.topic_partitions.map(|tps| {
        tps.into_iter()
            .filter_map(|t| ids.name(t.topic_id).map(|n| (n, t.partitions)))
            .flat_map(|(n, ps)| {
                ps.into_iter()
                    .filter(|p| *p >= 0)
                    .map(move |p| (n.clone(), p as u32))
            })
            .collect()
    });
    let heartbeat = Heartbeat {
        member_id: r.member_id.to_string(),
        member_epoch: r.member_epoch,
        instance_id: r.instance_id.map(|i| i.to_string()),
        client_id,
        rebalance_timeout_ms: (r.rebalance_timeout_ms > 0).then_some(r.rebalance_timeout_ms as u32),
        session_timeout_ms: None,
        topics: r
            .subscribed_topic_names
            .map(|ts| ts.into_iter().map(|t| t.to_string()).collect()),
        assignor: r.server_assignor.map(|a| assignor_name(&a)),
        owned,
    };
    let req = GroupRequest::ConsumerHeartbeat {
        group: r.group_id.to_string(),
        heartbeat,
    };
    match group(core, req).await {
        GroupResponse::ConsumerHeartbeat(Ok(a)) => {
            let mut by_topic: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
            for (t, p) in &a.assignment {
                by_topic.entry(t.clone()).or_default().push(*p as i32);
            }
            let left = a.member_epoch < 0;
            let assignment = (!left).then(|| {
                HbAssignment::default().with_topic_partitions(
                    by_topic
                        .into_iter()
                        .filter_map(|(t, ps)| {
                            core.metadata().get(&t).map(|m| {
                                HbTopicPartitions::default()
                                    .with_topic_id(uuid_of(m))
                                    .with_partitions(ps)
                            })
                        })
                        .collect(),
                )
            });
            ConsumerGroupHeartbeatResponse::default()
                .with_member_id(Some(s(a.member_id)))
                .with_member_epoch(a.member_epoch)
                .with_heartbeat_interval_ms(a.heartbeat_interval_ms as i32)
                .with_assignment(assignment)
        }
        GroupResponse::ConsumerHeartbeat(Err(e)) => {
            let c = match &e {
                GroupError::UnknownMember(_) => code::UNKNOWN_MEMBER_ID,
                GroupError::FencedMemberEpoch(_) => code::FENCED_MEMBER_EPOCH,
                GroupError::StaleMemberEpoch(_) => code::STALE_MEMBER_EPOCH,
                GroupError::UnsupportedAssignor(_) => code::UNSUPPORTED_ASSIGNOR,
                GroupError::InvalidSessionTimeout(_) => code::INVALID_SESSION_TIMEOUT,
                GroupError::InvalidRequest(_) => code::INVALID_REQUEST,
                GroupError::GroupMaxSize(_) => code::GROUP_MAX_SIZE_REACHED,
                GroupError::UnreleasedInstanceId(_) => code::UNRELEASED_INSTANCE_ID,
            };
            ConsumerGroupHeartbeatResponse::default()
                .with_error_code(c)
                .with_error_message(Some(s(e.message())))
        }
        other => ConsumerGroupHeartbeatResponse::default().with_error_code(refused_code(&other)),
    }
}
