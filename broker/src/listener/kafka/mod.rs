//! The Kafka listener: Apache Kafka's wire protocol onto the same service
//! layer as the native protocol ([`crate::service`]) and the same group
//! coordinator ([`crate::groups::coordinator`]).
//!
//! [`codec`](weir_kafka::codec) decodes a request frame into
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
use weir_kafka::codec::{self, KafkaRequest, KafkaResponse, RequestFrame};
use weir_kafka::error::coordinator_code;
use weir_kafka::ResponseError as E;
use weir_proto::api::ApiKey as NativeKey;
use weir_proto::error_code::ErrorCode;
use weir_proto::messages as native;

use crate::groups::classic;
use crate::groups::consumer::{GroupError, Heartbeat};
use crate::groups::coordinator::{self, GroupRequest, GroupResponse};
use crate::listener::connection::{Answer, Pending, Protocol};

use crate::metadata::writer::Change;
use crate::metadata::{ConfigOp, TopicError, TopicMeta, TopicSpec, OFFSETS_TOPIC};
use crate::server::limits::{KAFKA_NON_PRODUCE_FRAME_BYTES_MAX, REQUEST_PARTITIONS_MAX};
use crate::service::fetch::{FetchParams, FetchPart};
use crate::service::offsets::{Listed, OffsetQuery};
use crate::service::produce::ProducePart;
use crate::service::{self, admin, BrokerError, Ctx, StorageFailure};
use crate::shard::Core;

/// The node id of this broker in Kafka's Metadata.
mod cluster;
mod data;
mod errors;
mod groups;
mod topics;

use cluster::*;
use data::*;
pub use errors::broker_error_code;
use errors::*;
use groups::*;
use topics::*;

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
                    _ => E::InvalidRequest.code(),
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
