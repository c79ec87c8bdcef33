//! What every API family of the Kafka listener shares: the imports they
//! speak in (a prelude), the node's identity, and building answers.

pub(super) use std::collections::HashMap;
pub(super) use std::rc::Rc;
pub(super) use std::time::Duration;

pub(super) use bytes::{Bytes, BytesMut};
pub(super) use kafka_protocol::messages::api_versions_response::ApiVersionsResponse;
pub(super) use kafka_protocol::messages::consumer_group_heartbeat_response::{
    Assignment as HbAssignment, TopicPartitions as HbTopicPartitions,
};
pub(super) use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
pub(super) use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
pub(super) use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
pub(super) use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
pub(super) use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
pub(super) use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
pub(super) use kafka_protocol::messages::describe_groups_response::{
    DescribedGroup, DescribedGroupMember,
};
pub(super) use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
pub(super) use kafka_protocol::messages::find_coordinator_response::Coordinator;
pub(super) use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
pub(super) use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
pub(super) use kafka_protocol::messages::leave_group_response::MemberResponse;
pub(super) use kafka_protocol::messages::list_groups_response::ListedGroup;
pub(super) use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
pub(super) use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
pub(super) use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
pub(super) use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
pub(super) use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
pub(super) use kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, TopicProduceResponse,
};
pub(super) use kafka_protocol::messages::*;
pub(super) use kafka_protocol::protocol::StrBytes;
pub(super) use weir_kafka::codec::{self, KafkaRequest, KafkaResponse, RequestFrame};
pub(super) use weir_kafka::error::coordinator_code;
pub(super) use weir_kafka::ResponseError as E;
pub(super) use weir_proto::api::ApiKey as NativeKey;
pub(super) use weir_proto::error_code::ErrorCode;
pub(super) use weir_proto::messages as native;

pub(super) use crate::groups::classic;
pub(super) use crate::groups::consumer::{GroupError, Heartbeat};
pub(super) use crate::groups::coordinator::{self, GroupRequest, GroupResponse};
pub(super) use crate::listener::connection::{Answer, Pending, Protocol};
pub(super) use crate::server::tls::SecurityProtocol;

pub(super) use crate::metadata::Change;
pub(super) use crate::metadata::{ConfigOp, TopicError, TopicMeta, TopicSpec, OFFSETS_TOPIC};
pub(super) use crate::server::limits::{KAFKA_NON_PRODUCE_FRAME_BYTES_MAX, REQUEST_PARTITIONS_MAX};
pub(super) use crate::service::fetch::{FetchParams, FetchPart};
pub(super) use crate::service::offsets::{Listed, OffsetQuery};
pub(super) use crate::service::produce::ProducePart;
pub(super) use crate::service::{self, admin, BrokerError, Ctx, StorageFailure};
pub(super) use crate::shard::Core;

/// The node id of this broker in Kafka's Metadata.
pub(super) const NODE_ID: i32 = 0;
/// The cluster id Kafka clients see.
pub(super) const CLUSTER_ID: &str = "weir";

/// An answer that only closes the connection.
pub(super) fn closing() -> Answer {
    Answer {
        head: BytesMut::new(),
        payload: Vec::new(),
        close: true,
    }
}

/// The native API a Kafka API is counted under in the metrics (and
/// Fetch, whose long polls a closing connection cancels).
pub(super) fn native_key(key: i16) -> Option<NativeKey> {
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

pub(super) fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

pub(super) fn topic_name(v: impl Into<String>) -> TopicName {
    TopicName(s(v))
}

/// Encodes an answer (a failure to encode closes the connection: the
/// client cannot be answered in its version).
pub(super) fn answer(header: &codec::RequestHeaderInfo, response: KafkaResponse) -> Answer {
    match codec::encode_response(header, &response) {
        Ok(head) => Answer::plain(head),
        Err(e) => {
            tracing::warn!(error = %e, api = header.api_key, version = header.api_version, "Kafka answer not encoded");
            closing()
        }
    }
}

pub(super) fn later(f: impl std::future::Future<Output = Answer> + 'static) -> Pending {
    Pending::Later(glommio::spawn_local(f))
}

/// An answer that describes the cluster: computed only when every earlier
/// answer of the connection is written (see [`Pending::AtTurn`]). `f` is
/// polled only then.
pub(super) fn at_turn(f: impl std::future::Future<Output = Answer> + 'static) -> Pending {
    Pending::AtTurn(Box::new(move || Box::pin(f)))
}

/// The ApiVersions answer: every API the codec decodes is served here (the
/// `match` in [`serve`] is exhaustive over them).
pub(super) fn api_versions() -> ApiVersionsResponse {
    codec::api_versions_response()
}
