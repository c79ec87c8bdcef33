//! Authorization of each Kafka request ([`crate::service::acl`]) before it
//! is served: the group APIs need Read (Describe to look one up) on the
//! group, topic administration the operation on each topic named (Create
//! on the cluster or the topic), cluster administration Alter or Describe
//! on the cluster. Produce, Fetch, ListOffsets and Metadata check each
//! topic in their handlers (a refused topic is answered
//! TOPIC_AUTHORIZATION_FAILED beside the others; Metadata hides topics a
//! principal may not describe).
//!
//! A refused request is answered with the API's authorization error where
//! its answer has a place for one (closed, logged, where none: OffsetFetch
//! v8+ refused for a group). CreatePartitions, DescribeConfigs,
//! IncrementalAlterConfigs and DeleteRecords serve what the principal may
//! touch and refuse the rest resource by resource; ListGroups lists the
//! groups it may describe.

use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::offset_commit_request::OffsetCommitRequestTopic;
use kafka_protocol::messages::{
    CreatePartitionsRequest, DeleteRecordsRequest, DescribeConfigsRequest,
    IncrementalAlterConfigsRequest, OffsetCommitRequest,
};

use super::common::*;
use super::errors::broker_error_code;
use crate::error::BrokerError;
use crate::service::acl::{self, Op, Resource};
use crate::service::auth::Session;

/// What a request needs, as a list of (operation, resource) checks.
fn group(op: Op, g: &str) -> (Op, Resource<'_>) {
    (op, Resource::Group(g))
}

fn needs(body: &KafkaRequest, version: i16) -> Vec<(Op, Resource<'_>)> {
    use KafkaRequest as R;
    match body {
        R::JoinGroup(r) => vec![group(Op::Read, r.group_id.as_str())],
        R::SyncGroup(r) => vec![group(Op::Read, r.group_id.as_str())],
        R::Heartbeat(r) => vec![group(Op::Read, r.group_id.as_str())],
        R::LeaveGroup(r) => vec![group(Op::Read, r.group_id.as_str())],
        R::OffsetCommit(r) => vec![group(Op::Read, r.group_id.as_str())],
        R::TxnOffsetCommit(r) => vec![group(Op::Read, r.group_id.as_str())],
        R::AddOffsetsToTxn(r) => vec![group(Op::Read, r.group_id.as_str())],
        R::ConsumerGroupHeartbeat(r) => vec![group(Op::Read, r.group_id.as_str())],
        R::ShareGroupHeartbeat(r) => vec![group(Op::Read, r.group_id.as_str())],
        // Topics are checked by the handler (per partition).
        R::ShareFetch(r) => r
            .group_id
            .iter()
            .map(|g| group(Op::Read, g.as_str()))
            .collect(),
        R::ShareAcknowledge(r) => r
            .group_id
            .iter()
            .map(|g| group(Op::Read, g.as_str()))
            .collect(),
        R::OffsetFetch(r) if version < 8 => vec![group(Op::Describe, r.group_id.as_str())],
        // v8+ (several groups): checked per group by the handler.
        R::OffsetFetch(_) => Vec::new(),
        R::FindCoordinator(r) if r.key_type == 0 && version < 4 => {
            vec![group(Op::Describe, r.key.as_str())]
        }
        R::FindCoordinator(r) if r.key_type == 0 => r
            .coordinator_keys
            .iter()
            .map(|k| group(Op::Describe, k.as_str()))
            .collect(),
        R::DescribeGroups(r) => r
            .groups
            .iter()
            .map(|g| group(Op::Describe, g.as_str()))
            .collect(),
        R::ConsumerGroupDescribe(r) => r
            .group_ids
            .iter()
            .map(|g| group(Op::Describe, g.as_str()))
            .collect(),
        R::ShareGroupDescribe(r) => r
            .group_ids
            .iter()
            .map(|g| group(Op::Describe, g.as_str()))
            .collect(),
        // Kafka's: Describe on the group (topics are not checked).
        R::DescribeShareGroupOffsets(r) => r
            .groups
            .iter()
            .map(|g| group(Op::Describe, g.group_id.as_str()))
            .collect(),
        // Kafka's: Read on the group and on each topic named (Delete on
        // the group to delete).
        R::AlterShareGroupOffsets(r) => std::iter::once(group(Op::Read, r.group_id.as_str()))
            .chain(
                r.topics
                    .iter()
                    .map(|t| (Op::Read, Resource::Topic(t.topic_name.as_str()))),
            )
            .collect(),
        R::DeleteShareGroupOffsets(r) => std::iter::once(group(Op::Delete, r.group_id.as_str()))
            .chain(
                r.topics
                    .iter()
                    .map(|t| (Op::Read, Resource::Topic(t.topic_name.as_str()))),
            )
            .collect(),
        R::DeleteGroups(r) => r
            .groups_names
            .iter()
            .map(|g| group(Op::Delete, g.as_str()))
            .collect(),
        R::DescribeCluster(_) | R::DescribeUserScramCredentials(_) => {
            vec![(Op::Describe, Resource::Cluster)]
        }
        R::AlterUserScramCredentials(_) | R::CreateAcls(_) | R::DeleteAcls(_) => {
            vec![(Op::Alter, Resource::Cluster)]
        }
        R::DescribeAcls(_) => vec![(Op::Describe, Resource::Cluster)],
        // Transactional-id ACLs are not built: describing transactions is
        // describing the cluster.
        R::DescribeTransactions(_) | R::ListTransactions(_) => {
            vec![(Op::Describe, Resource::Cluster)]
        }
        R::DescribeProducers(r) => r
            .topics
            .iter()
            .map(|t| (Op::Read, Resource::Topic(t.name.as_str())))
            .collect(),
        R::DescribeClientQuotas(_) => vec![(Op::DescribeConfigs, Resource::Cluster)],
        R::DeleteTopics(r) => r
            .topic_names
            .iter()
            .map(|t| t.as_str())
            .chain(
                r.topics
                    .iter()
                    .filter_map(|t| t.name.as_ref().map(|n| n.as_str())),
            )
            .map(|t| (Op::Delete, Resource::Topic(t)))
            .collect(),
        R::OffsetForLeaderEpoch(r) => r
            .topics
            .iter()
            .map(|t| (Op::Describe, Resource::Topic(t.topic.as_str())))
            .collect(),
        // Checked per topic or group by their handlers, or needing nothing.
        R::ListGroups(_)
        | R::CreatePartitions(_)
        | R::DeleteRecords(_)
        | R::DescribeConfigs(_)
        | R::IncrementalAlterConfigs(_)
        | R::ApiVersions(_)
        | R::Metadata(_)
        | R::Produce(_)
        | R::Fetch(_)
        | R::ListOffsets(_)
        | R::CreateTopics(_)
        | R::InitProducerId(_)
        | R::FindCoordinator(_)
        | R::SaslHandshake(_)
        | R::SaslAuthenticate(_)
        | R::AlterClientQuotas(_)
        // Topics are checked by the handler; transactional-id ACLs are not
        // built yet (issue 32).
        | R::AddPartitionsToTxn(_)
        | R::EndTxn(_) => Vec::new(),
    }
}

/// The refusal of a request the session may not make, if it may not.
pub(super) fn gate(
    core: &Core,
    session: &Session,
    h: &codec::RequestHeaderInfo,
    body: &KafkaRequest,
) -> Option<Answer> {
    if !core.shared.config.authorization.enabled {
        return None;
    }
    let denied = needs(body, h.api_version)
        .into_iter()
        .find_map(|(op, r)| acl::check(core, session, op, r).err())?;
    tracing::debug!(peer = %session.peer, error = %denied, "Kafka request refused");
    let code = broker_error_code(&denied);
    if let KafkaRequest::OffsetCommit(r) = body {
        let mut resp = OffsetCommitResponse::default();
        resp.topics = r.topics.iter().map(|t| commit_refused(t, code)).collect();
        return Some(answer(h, KafkaResponse::OffsetCommit(resp)));
    }
    if let KafkaRequest::DeleteTopics(r) = body {
        let mut resp = DeleteTopicsResponse::default();
        resp.responses = r
            .topic_names
            .iter()
            .cloned()
            .map(Some)
            .chain(r.topics.iter().map(|t| t.name.clone()))
            .map(|n| {
                let mut d = DeletableTopicResult::default();
                d.name = n;
                d.error_code = code;
                d.error_message = Some(s(denied.to_string()));
                d
            })
            .collect();
        return Some(answer(h, KafkaResponse::DeleteTopics(resp)));
    }
    if let KafkaRequest::FindCoordinator(r) = body {
        if h.api_version < 4 {
            let mut resp = FindCoordinatorResponse::default();
            resp.error_code = code;
            resp.error_message = Some(s(denied.to_string()));
            resp.node_id = BrokerId(-1);
            resp.port = -1;
            return Some(answer(h, KafkaResponse::FindCoordinator(resp)));
        }
        {
            let mut resp = FindCoordinatorResponse::default();
            resp.coordinators = r
                .coordinator_keys
                .iter()
                .map(|k| {
                    let mut c = Coordinator::default();
                    c.key = k.clone();
                    c.node_id = BrokerId(-1);
                    c.port = -1;
                    c.error_code = code;
                    c.error_message = Some(s(denied.to_string()));
                    c
                })
                .collect();
            return Some(answer(h, KafkaResponse::FindCoordinator(resp)));
        }
    }
    match codec::error_response(h, code) {
        Some(b) => Some(Answer::plain(BytesMut::from(&b[..]))),
        None => {
            tracing::warn!(
                peer = %session.peer,
                api = h.api_key,
                error = %denied,
                "closing Kafka connection: a refused request whose answer has no place for the error"
            );
            Some(closing())
        }
    }
}

/// CreateTopics: topics the session may not create (Create on the
/// cluster or on the topic), answered TOPIC_AUTHORIZATION_FAILED.
pub(super) fn create_refused(
    core: &Core,
    session: &Session,
    name: &str,
) -> Option<CreatableTopicResult> {
    let may = acl::allowed(core, session, Op::Create, Resource::Cluster)
        || acl::allowed(core, session, Op::Create, Resource::Topic(name));
    (!may).then(|| {
        let mut r = CreatableTopicResult::default();
        r.name = topic_name(name);
        r.error_code = E::TopicAuthorizationFailed.code();
        r.error_message = Some(s(format!(
            "{} may not Create topic `{name}`",
            session.principal().unwrap_or_default()
        )));
        r
    })
}

/// Whether the session may describe group `g` (ListGroups lists only those).
pub(super) fn group_describable(core: &Core, session: &Session, g: &str) -> bool {
    acl::may_describe_group(core, session, g)
}

/// A config resource (Kafka's type 2 topic, else the broker: the cluster).
fn config_resource(resource_type: i8, name: &str) -> Resource<'_> {
    match resource_type {
        2 => Resource::Topic(name),
        _ => Resource::Cluster,
    }
}

/// Takes out of `items` those `denied` refuses, answering each with `refuse`.
fn split<T, A>(
    items: &mut Vec<T>,
    denied: impl Fn(&T) -> Option<BrokerError>,
    refuse: impl Fn(&T, &BrokerError) -> A,
) -> Vec<A> {
    let mut refused = Vec::new();
    items.retain(|item| match denied(item) {
        None => true,
        Some(e) => {
            refused.push(refuse(item, &e));
            false
        }
    });
    refused
}

/// CreatePartitions: Alter on each topic.
pub(super) fn refuse_create_partitions(
    core: &Core,
    session: &Session,
    r: &mut CreatePartitionsRequest,
) -> Vec<CreatePartitionsTopicResult> {
    split(
        &mut r.topics,
        |t| acl::check(core, session, Op::Alter, Resource::Topic(t.name.as_str())).err(),
        |t, e| {
            let mut out = CreatePartitionsTopicResult::default();
            out.name = t.name.clone();
            out.error_code = broker_error_code(e);
            out.error_message = Some(s(e.to_string()));
            out
        },
    )
}

/// DescribeConfigs: DescribeConfigs on each topic (on the cluster for a
/// broker's).
pub(super) fn refuse_describe_configs(
    core: &Core,
    session: &Session,
    r: &mut DescribeConfigsRequest,
) -> Vec<DescribeConfigsResult> {
    split(
        &mut r.resources,
        |c| {
            let res = config_resource(c.resource_type, c.resource_name.as_str());
            acl::check(core, session, Op::DescribeConfigs, res).err()
        },
        |c, e| {
            let mut out = DescribeConfigsResult::default();
            out.resource_type = c.resource_type;
            out.resource_name = c.resource_name.clone();
            out.error_code = broker_error_code(e);
            out.error_message = Some(s(e.to_string()));
            out
        },
    )
}

/// IncrementalAlterConfigs: AlterConfigs on each topic (on the cluster
/// for a broker's).
pub(super) fn refuse_alter_configs(
    core: &Core,
    session: &Session,
    r: &mut IncrementalAlterConfigsRequest,
) -> Vec<AlterConfigsResourceResponse> {
    split(
        &mut r.resources,
        |c| {
            let res = config_resource(c.resource_type, c.resource_name.as_str());
            acl::check(core, session, Op::AlterConfigs, res).err()
        },
        |c, e| {
            let mut out = AlterConfigsResourceResponse::default();
            out.resource_type = c.resource_type;
            out.resource_name = c.resource_name.clone();
            out.error_code = broker_error_code(e);
            out.error_message = Some(s(e.to_string()));
            out
        },
    )
}

/// DeleteRecords: Delete on each topic.
pub(super) fn refuse_delete_records(
    core: &Core,
    session: &Session,
    r: &mut DeleteRecordsRequest,
) -> Vec<DeleteRecordsTopicResult> {
    split(
        &mut r.topics,
        |t| acl::check(core, session, Op::Delete, Resource::Topic(t.name.as_str())).err(),
        |t, e| {
            let mut out = DeleteRecordsTopicResult::default();
            out.name = t.name.clone();
            out.partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let mut d = DeleteRecordsPartitionResult::default();
                    d.partition_index = p.partition_index;
                    d.low_watermark = -1;
                    d.error_code = broker_error_code(e);
                    d
                })
                .collect();
            out
        },
    )
}

/// OffsetCommit: Read on each topic (the group's Read is the gate's).
pub(super) fn refuse_offset_commit_topics(
    core: &Core,
    session: &Session,
    r: &mut OffsetCommitRequest,
) -> Vec<OffsetCommitResponseTopic> {
    split(
        &mut r.topics,
        |t| acl::check(core, session, Op::Read, Resource::Topic(t.name.as_str())).err(),
        |t, e| commit_refused(t, broker_error_code(e)),
    )
}

/// A commit topic answered `code` for each of its partitions.
fn commit_refused(t: &OffsetCommitRequestTopic, code: i16) -> OffsetCommitResponseTopic {
    OffsetCommitResponseTopic::default()
        .with_name(t.name.clone())
        .with_topic_id(t.topic_id)
        .with_partitions(
            t.partitions
                .iter()
                .map(|p| {
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code)
                })
                .collect(),
        )
}
