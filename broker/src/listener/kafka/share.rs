//! Share groups (KIP-932, v1 of the APIs: Kafka 4.1's and librdkafka's
//! ShareConsumer): ShareGroupHeartbeat on the group's coordinator core,
//! ShareFetch and ShareAcknowledge on the core that owns each partition
//! ([`crate::share`]).

use kafka_protocol::messages::share_acknowledge_response::{
    PartitionData as AckPartitionData, ShareAcknowledgeTopicResponse,
};
use kafka_protocol::messages::share_fetch_response::{
    AcquiredRecords, PartitionData as SharePartitionData, ShareFetchableTopicResponse,
};
use kafka_protocol::messages::share_group_heartbeat_response::{
    Assignment as ShareAssignment, TopicPartitions as ShareTopicPartitions,
};
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse,
};
use kafka_protocol::messages::{
    DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsResponse, ShareAcknowledgeRequest,
    ShareAcknowledgeResponse, ShareFetchRequest, ShareFetchResponse, ShareGroupDescribeRequest,
    ShareGroupDescribeResponse, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse,
};
use weir_share::group::{Heartbeat, ShareGroupError};
use weir_share::partition::{AckBatch, AckType, ShareError};

use super::cluster::*;
use super::common::*;
use super::errors::*;
use crate::service::acl::{self, Op, Resource};
use crate::service::auth::Session;
use crate::share::service::{PartRequest, ShareRefusal, ShareRequest};

/// Records acquired per ShareFetch when the client says none (v1's
/// `MaxRecords` 0).
const MAX_RECORDS_DEFAULT: usize = 500;

fn refusal_code(e: &ShareRefusal) -> i16 {
    match e {
        ShareRefusal::NotCoordinator(_) => E::NotCoordinator.code(),
        ShareRefusal::Group(ShareGroupError::UnknownMember(_)) => E::UnknownMemberId.code(),
        ShareRefusal::Group(ShareGroupError::FencedMemberEpoch(_)) => E::FencedMemberEpoch.code(),
        ShareRefusal::Group(ShareGroupError::InvalidRequest(_))
        | ShareRefusal::InvalidRequest(_) => E::InvalidRequest.code(),
        ShareRefusal::Group(ShareGroupError::GroupMaxSize(_)) => E::GroupMaxSizeReached.code(),
        ShareRefusal::InconsistentGroupProtocol(_) => E::InconsistentGroupProtocol.code(),
        ShareRefusal::SessionNotFound(_) => E::ShareSessionNotFound.code(),
        ShareRefusal::InvalidSessionEpoch(_) => E::InvalidShareSessionEpoch.code(),
        ShareRefusal::SessionLimitReached(_) => E::ShareSessionLimitReached.code(),
    }
}

fn ack_error_code(e: &ShareError) -> i16 {
    match e {
        ShareError::InvalidRecordState(_) => E::InvalidRecordState.code(),
        ShareError::InvalidRequest(_) => E::InvalidRequest.code(),
    }
}

pub(super) fn heartbeat(
    core: &Rc<Core>,
    r: ShareGroupHeartbeatRequest,
) -> ShareGroupHeartbeatResponse {
    let hb = Heartbeat {
        member_id: r.member_id.to_string(),
        member_epoch: r.member_epoch,
        subscribed: r
            .subscribed_topic_names
            .map(|ts| ts.into_iter().map(|t| t.to_string()).collect()),
        rack: r.rack_id.map(|r| r.to_string()),
    };
    match crate::share::service::heartbeat(core, r.group_id.as_str(), &hb) {
        Ok(a) => {
            let assignment = a.assignment.map(|tps| {
                let mut by_topic: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
                for (t, p) in tps {
                    by_topic.entry(t).or_default().push(p as i32);
                }
                ShareAssignment::default().with_topic_partitions(
                    by_topic
                        .into_iter()
                        .filter_map(|(t, ps)| {
                            core.metadata().get(&t).map(|m| {
                                ShareTopicPartitions::default()
                                    .with_topic_id(uuid_of(m))
                                    .with_partitions(ps)
                            })
                        })
                        .collect(),
                )
            });
            ShareGroupHeartbeatResponse::default()
                .with_member_id(Some(r.member_id))
                .with_member_epoch(a.member_epoch)
                .with_heartbeat_interval_ms(a.heartbeat_interval_ms as i32)
                .with_assignment(assignment)
        }
        Err(e) => ShareGroupHeartbeatResponse::default()
            .with_error_code(refusal_code(&e))
            .with_error_message(Some(s(e.to_string()))),
    }
}

/// Kafka's acknowledgement batches, checked for their types.
fn ack_batches(
    batches: impl Iterator<Item = (i64, i64, Vec<i8>)>,
) -> Result<Vec<AckBatch>, ShareError> {
    batches
        .map(|(first, last, types)| {
            if first < 0 || last < 0 {
                return Err(ShareError::InvalidRequest(format!(
                    "acknowledgement batch {first}..={last}"
                )));
            }
            let types = types
                .into_iter()
                .map(|t| {
                    u8::try_from(t)
                        .ok()
                        .and_then(AckType::from_byte)
                        .ok_or_else(|| ShareError::InvalidRequest(format!("acknowledge type {t}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(AckBatch {
                first: first as u64,
                last: last as u64,
                types,
            })
        })
        .collect()
}

/// One request partition: resolved, readable, its acknowledgements.
struct Named {
    topic_id: uuid::Uuid,
    index: i32,
    /// The topic's name, or the code to answer at once.
    topic: Result<String, i16>,
    acks: Result<Vec<AckBatch>, ShareError>,
}

fn resolve(
    core: &Core,
    ids: &TopicIds<'_>,
    session: &Session,
    topic_id: uuid::Uuid,
    index: i32,
    acks: Result<Vec<AckBatch>, ShareError>,
) -> Named {
    let topic = match ids.name(topic_id) {
        None => Err(E::UnknownTopicId.code()),
        Some(_) if index < 0 => Err(E::UnknownTopicOrPartition.code()),
        Some(n) if !acl::allowed(core, session, Op::Read, Resource::Topic(&n)) => {
            Err(E::TopicAuthorizationFailed.code())
        }
        Some(n) => Ok(n),
    };
    Named {
        topic_id,
        index,
        topic,
        acks,
    }
}

/// The request's partitions, resolved (ShareFetch and ShareAcknowledge
/// name them alike, in types of their own).
macro_rules! named_of {
    ($core:expr, $ids:expr, $session:expr, $topics:expr) => {{
        let mut named: Vec<Named> = Vec::new();
        for t in &$topics {
            for p in &t.partitions {
                let acks = ack_batches(
                    p.acknowledgement_batches
                        .iter()
                        .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone())),
                );
                named.push(resolve(
                    $core,
                    $ids,
                    $session,
                    t.topic_id,
                    p.partition_index,
                    acks,
                ));
            }
        }
        named
    }};
}

pub(super) async fn fetch(
    core: &Rc<Core>,
    r: ShareFetchRequest,
    session: &Session,
) -> ShareFetchResponse {
    let ids = TopicIds::new(core);
    let named = named_of!(core, &ids, session, r.topics);
    let forgotten: Vec<(String, u32)> = r
        .forgotten_topics_data
        .iter()
        .filter_map(|t| ids.name(t.topic_id).map(|n| (n, &t.partitions)))
        .flat_map(|(n, ps)| {
            ps.iter()
                .filter(|p| **p >= 0)
                .map(move |p| (n.clone(), *p as u32))
        })
        .collect();
    let (req, early) = request_of(
        &r.group_id.map(|g| g.to_string()),
        &r.member_id,
        r.share_session_epoch,
        &named,
    );
    let req = ShareRequest {
        forgotten,
        max_records: if r.max_records > 0 {
            r.max_records as usize
        } else {
            MAX_RECORDS_DEFAULT
        },
        max_bytes: r.max_bytes.clamp(1, 64 << 20) as u64,
        max_wait_ms: r.max_wait_ms.max(0) as u32,
        ..req
    };
    let lock_ms = core.shared.config.share.lock_ms as i32;
    let answers = match crate::share::service::fetch(core, req).await {
        Ok(a) => a,
        Err(e) => {
            return ShareFetchResponse::default()
                .with_error_code(refusal_code(&e))
                .with_error_message(Some(s(e.to_string())))
                .with_acquisition_lock_timeout_ms(lock_ms)
        }
    };
    // By topic id, in the order met.
    let mut topics: Vec<ShareFetchableTopicResponse> = Vec::new();
    let mut push = |id: uuid::Uuid, d: SharePartitionData| match topics
        .iter_mut()
        .find(|t| t.topic_id == id)
    {
        Some(t) => t.partitions.push(d),
        None => topics.push(
            ShareFetchableTopicResponse::default()
                .with_topic_id(id)
                .with_partitions(vec![d]),
        ),
    };
    for (id, index, code, ack_code) in early {
        push(
            id,
            SharePartitionData::default()
                .with_partition_index(index)
                .with_error_code(code)
                .with_acknowledge_error_code(ack_code)
                .with_records(Some(Bytes::new())),
        );
    }
    let view = core.metadata();
    for a in answers {
        let Some(m) = view.get(&a.topic) else {
            continue;
        };
        let mut d = SharePartitionData::default()
            .with_partition_index(a.partition as i32)
            .with_records(Some(if a.batches.len() == 1 {
                a.batches[0].clone()
            } else {
                Bytes::from(a.batches.concat())
            }))
            .with_acquired_records(
                a.acquired
                    .iter()
                    .map(|x| {
                        AcquiredRecords::default()
                            .with_first_offset(x.first as i64)
                            .with_last_offset(x.last as i64)
                            .with_delivery_count(x.delivery_count as i16)
                    })
                    .collect(),
            );
        if let Some(e) = &a.error {
            d = d
                .with_error_code(broker_error_code(e))
                .with_error_message(Some(s(e.to_string())));
        }
        if let Some(e) = &a.ack_error {
            d = d
                .with_acknowledge_error_code(ack_error_code(e))
                .with_acknowledge_error_message(Some(s(e.to_string())));
        } else if let Some(e) = &a.store_error {
            d = d
                .with_acknowledge_error_code(broker_error_code(e))
                .with_acknowledge_error_message(Some(s(e.to_string())));
        }
        push(uuid_of(m), d);
    }
    ShareFetchResponse::default()
        .with_acquisition_lock_timeout_ms(lock_ms)
        .with_responses(topics)
}

/// The share request of the resolved partitions, and the partitions
/// answered at once: (topic id, partition, error code, acknowledgement
/// error code).
#[allow(clippy::type_complexity)]
fn request_of(
    group: &Option<String>,
    member: &Option<StrBytes>,
    epoch: i32,
    named: &[Named],
) -> (ShareRequest, Vec<(uuid::Uuid, i32, i16, i16)>) {
    let mut early = Vec::new();
    let mut parts = Vec::new();
    for n in named {
        match (&n.topic, &n.acks) {
            (Err(code), _) => early.push((n.topic_id, n.index, *code, 0)),
            (Ok(_), Err(e)) => early.push((n.topic_id, n.index, 0, ack_error_code(e))),
            (Ok(t), Ok(acks)) => parts.push(PartRequest {
                topic: t.clone(),
                partition: n.index as u32,
                acks: acks.clone(),
            }),
        }
    }
    let req = ShareRequest::acknowledging(
        group.clone().unwrap_or_default(),
        member.as_ref().map(|m| m.to_string()).unwrap_or_default(),
        epoch,
        parts,
    );
    (req, early)
}

pub(super) async fn acknowledge(
    core: &Rc<Core>,
    r: ShareAcknowledgeRequest,
    session: &Session,
) -> ShareAcknowledgeResponse {
    let ids = TopicIds::new(core);
    let named = named_of!(core, &ids, session, r.topics);
    let (req, early) = request_of(
        &r.group_id.map(|g| g.to_string()),
        &r.member_id,
        r.share_session_epoch,
        &named,
    );
    let answers = match crate::share::service::fetch(core, req).await {
        Ok(a) => a,
        Err(e) => {
            return ShareAcknowledgeResponse::default()
                .with_error_code(refusal_code(&e))
                .with_error_message(Some(s(e.to_string())))
        }
    };
    let mut topics: Vec<ShareAcknowledgeTopicResponse> = Vec::new();
    let mut push =
        |id: uuid::Uuid, d: AckPartitionData| match topics.iter_mut().find(|t| t.topic_id == id) {
            Some(t) => t.partitions.push(d),
            None => topics.push(
                ShareAcknowledgeTopicResponse::default()
                    .with_topic_id(id)
                    .with_partitions(vec![d]),
            ),
        };
    for (id, index, code, ack_code) in early {
        push(
            id,
            AckPartitionData::default()
                .with_partition_index(index)
                .with_error_code(if code != 0 { code } else { ack_code }),
        );
    }
    let view = core.metadata();
    for a in answers {
        let Some(m) = view.get(&a.topic) else {
            continue;
        };
        let mut d = AckPartitionData::default().with_partition_index(a.partition as i32);
        if let Some(e) = &a.error {
            d = d
                .with_error_code(broker_error_code(e))
                .with_error_message(Some(s(e.to_string())));
        } else if let Some(e) = &a.ack_error {
            d = d
                .with_error_code(ack_error_code(e))
                .with_error_message(Some(s(e.to_string())));
        } else if let Some(e) = &a.store_error {
            d = d
                .with_error_code(broker_error_code(e))
                .with_error_message(Some(s(e.to_string())));
        }
        push(uuid_of(m), d);
    }
    ShareAcknowledgeResponse::default().with_responses(topics)
}

/// The share group `g` as its coordinator describes it (a consumer
/// group's id: `None`, with the refusal to answer).
async fn described(
    core: &Rc<Core>,
    g: &str,
) -> Result<weir_proto::messages::DescribeGroupResponse, (i16, String)> {
    let req = GroupRequest::Describe(weir_proto::messages::DescribeGroupRequest {
        group: g.to_string(),
    });
    match super::groups::group(core, req).await {
        GroupResponse::Describe(x) if x.error == 0 && x.kind == "share" => Ok(x),
        GroupResponse::Describe(x) if x.error == 0 => Err((
            E::GroupIdNotFound.code(),
            format!("Group {g} is not a share group."),
        )),
        GroupResponse::Describe(x) => Err((group_code(x.error), x.message.unwrap_or_default())),
        other => Err((super::groups::refused_code(&other), String::new())),
    }
}

/// ShareGroupDescribe (v1): members, their epochs and the partitions
/// each reads; a consumer group's id is GROUP_ID_NOT_FOUND ("not a share
/// group"), as Kafka answers.
pub(super) async fn describe(
    core: &Rc<Core>,
    r: ShareGroupDescribeRequest,
) -> ShareGroupDescribeResponse {
    use kafka_protocol::messages::share_group_describe_response::{
        Assignment, DescribedGroup, Member, TopicPartitions as DescribedPartitions,
    };
    let mut out = Vec::new();
    for g in r.group_ids {
        let d = DescribedGroup::default().with_group_id(g.clone());
        out.push(match described(core, g.as_str()).await {
            Ok(x) => d
                .with_group_state(s(x.state))
                .with_group_epoch(x.generation)
                .with_assignment_epoch(x.assignment_epoch)
                .with_assignor_name(s(x.assignor))
                .with_members(
                    x.members
                        .into_iter()
                        .map(|m| {
                            let parts = described_partitions(core, m.assignment)
                                .into_iter()
                                .map(|(id, name, parts)| {
                                    DescribedPartitions::default()
                                        .with_topic_id(id)
                                        .with_topic_name(name)
                                        .with_partitions(parts)
                                })
                                .collect();
                            Member::default()
                                .with_member_id(s(m.member_id))
                                .with_member_epoch(m.member_epoch)
                                .with_client_id(s(m.client_id))
                                .with_subscribed_topic_names(
                                    m.topics.into_iter().map(topic_name).collect(),
                                )
                                .with_assignment(Assignment::default().with_topic_partitions(parts))
                        })
                        .collect(),
                ),
            Err((code, why)) => d.with_error_code(code).with_error_message(Some(s(why))),
        });
    }
    ShareGroupDescribeResponse::default().with_groups(out)
}

/// DescribeShareGroupOffsets (v0): each share partition's start offset
/// (the first record not acknowledged; -1 where nothing is stored) — of
/// the topics named, or of the partitions the members read.
pub(super) async fn describe_offsets(
    core: &Rc<Core>,
    r: DescribeShareGroupOffsetsRequest,
) -> DescribeShareGroupOffsetsResponse {
    use kafka_protocol::messages::describe_share_group_offsets_response::{
        DescribeShareGroupOffsetsResponseGroup as Group,
        DescribeShareGroupOffsetsResponsePartition as Partition,
        DescribeShareGroupOffsetsResponseTopic as Topic,
    };
    let mut groups = Vec::new();
    for g in r.groups {
        let d = Group::default().with_group_id(g.group_id.clone());
        let wanted: Vec<(String, u32)> = match &g.topics {
            Some(ts) => ts
                .iter()
                .flat_map(|t| {
                    t.partitions
                        .iter()
                        .filter(|p| **p >= 0)
                        .map(move |p| (t.topic_name.to_string(), *p as u32))
                })
                .collect(),
            None => match described(core, g.group_id.as_str()).await {
                Ok(x) => x
                    .members
                    .iter()
                    .flat_map(|m| weir_proto::messages::TopicPartitions::pairs(&m.assignment))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect(),
                Err((code, why)) => {
                    groups.push(d.with_error_code(code).with_error_message(Some(s(why))));
                    continue;
                }
            },
        };
        let limit = crate::server::limits::REQUEST_PARTITIONS_MAX;
        if wanted.len() > limit {
            groups.push(
                d.with_error_code(E::InvalidRequest.code())
                    .with_error_message(Some(s(format!(
                        "{} partitions named; at most {limit}",
                        wanted.len()
                    )))),
            );
            continue;
        }
        let starts = crate::share::service::stored_starts(core, g.group_id.as_str(), &wanted).await;
        let view = core.metadata();
        let mut topics: Vec<Topic> = Vec::new();
        for ((topic, partition), r) in wanted.into_iter().zip(starts) {
            let p = Partition::default().with_partition_index(partition as i32);
            let p = match r {
                Ok(Some((start, _))) => p.with_start_offset(start as i64),
                Ok(None) => p.with_start_offset(-1),
                Err(e) => p
                    .with_start_offset(-1)
                    .with_error_code(broker_error_code(&e))
                    .with_error_message(Some(s(e.to_string()))),
            };
            match topics.iter_mut().find(|t| t.topic_name.as_str() == topic) {
                Some(t) => t.partitions.push(p),
                None => {
                    let id = view.get(&topic).map(uuid_of).unwrap_or_default();
                    topics.push(
                        Topic::default()
                            .with_topic_name(topic_name(topic))
                            .with_topic_id(id)
                            .with_partitions(vec![p]),
                    )
                }
            }
        }
        groups.push(d.with_topics(topics));
    }
    DescribeShareGroupOffsetsResponse::default().with_groups(groups)
}

/// Whether share group `g` may have its offsets reset: it has no members
/// (Kafka's NON_EMPTY_GROUP otherwise; see
/// [`crate::share::service::share_group_members`]).
async fn empty_share_group(core: &Rc<Core>, g: &str) -> Result<(), (i16, String)> {
    match crate::share::service::share_group_members(core, g).await {
        Ok(0) => Ok(()),
        Ok(n) => Err((
            E::NonEmptyGroup.code(),
            format!("share group {g} has {n} members: stop them first"),
        )),
        Err((code, why)) => Err((group_code(code), why)),
    }
}

/// An error's code and message for an answer (0 and none: done).
fn outcome<T>(r: Result<T, BrokerError>) -> (i16, Option<StrBytes>) {
    match r {
        Ok(_) => (0, None),
        Err(e) => (broker_error_code(&e), Some(s(e.to_string()))),
    }
}

/// AlterShareGroupOffsets (v0, KIP-932): moves the start of an empty
/// share group's partitions — records from there on are delivered again,
/// those below never (Kafka's `kafka-share-groups.sh --reset-offsets`).
/// Each start must lie in its partition's log (OFFSET_OUT_OF_RANGE).
pub(super) async fn alter_offsets(
    core: &Rc<Core>,
    r: AlterShareGroupOffsetsRequest,
) -> AlterShareGroupOffsetsResponse {
    use kafka_protocol::messages::alter_share_group_offsets_response::{
        AlterShareGroupOffsetsResponsePartition as Partition,
        AlterShareGroupOffsetsResponseTopic as Topic,
    };
    let g = r.group_id.to_string();
    let refused = |code: i16, why: String| {
        AlterShareGroupOffsetsResponse::default()
            .with_error_code(code)
            .with_error_message(Some(s(why)))
    };
    let n: usize = r.topics.iter().map(|t| t.partitions.len()).sum();
    let limit = crate::server::limits::REQUEST_PARTITIONS_MAX;
    if n > limit {
        return refused(
            E::InvalidRequest.code(),
            format!("{n} partitions named; at most {limit}"),
        );
    }
    if let Err((code, why)) = empty_share_group(core, &g).await {
        return refused(code, why);
    }
    let view = core.metadata();
    let mut out = Vec::new();
    for t in r.topics {
        let name = t.topic_name.to_string();
        let mut parts = Vec::new();
        for p in t.partitions {
            let r = if p.partition_index < 0 || p.start_offset < 0 {
                Err(BrokerError::InvalidRequest(format!(
                    "partition {} start offset {}: both must be 0 or more",
                    p.partition_index, p.start_offset
                )))
            } else {
                crate::share::service::reset(
                    core,
                    &g,
                    (&name, p.partition_index as u32),
                    Some(p.start_offset as u64),
                )
                .await
            };
            let (code, message) = outcome(r);
            parts.push(
                Partition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(code)
                    .with_error_message(message),
            );
        }
        out.push(
            Topic::default()
                .with_topic_id(view.get(&name).map(uuid_of).unwrap_or_default())
                .with_topic_name(t.topic_name)
                .with_partitions(parts),
        );
    }
    AlterShareGroupOffsetsResponse::default().with_responses(out)
}

/// DeleteShareGroupOffsets (v0, KIP-932): forgets an empty share group's
/// state on every partition of the topics named; it then starts again as
/// `--share-auto-offset-reset` says.
pub(super) async fn delete_offsets(
    core: &Rc<Core>,
    r: DeleteShareGroupOffsetsRequest,
) -> DeleteShareGroupOffsetsResponse {
    use kafka_protocol::messages::delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic as Topic;
    let g = r.group_id.to_string();
    let refused = |code: i16, why: String| {
        DeleteShareGroupOffsetsResponse::default()
            .with_error_code(code)
            .with_error_message(Some(s(why)))
    };
    let view = core.metadata();
    let n: u64 = r
        .topics
        .iter()
        .filter_map(|t| view.get(t.topic_name.as_str()))
        .map(|t| u64::from(t.partitions()))
        .sum();
    let limit = crate::server::limits::REQUEST_PARTITIONS_MAX as u64;
    if n > limit {
        return refused(
            E::InvalidRequest.code(),
            format!("the topics named have {n} partitions; at most {limit}"),
        );
    }
    if let Err((code, why)) = empty_share_group(core, &g).await {
        return refused(code, why);
    }
    let mut out = Vec::new();
    for t in r.topics {
        let name = t.topic_name.to_string();
        let topic = Topic::default().with_topic_name(t.topic_name.clone());
        let Some(meta) = view.get(&name) else {
            out.push(
                topic
                    .with_error_code(E::UnknownTopicOrPartition.code())
                    .with_error_message(Some(s(format!("no topic `{name}`")))),
            );
            continue;
        };
        let mut first_error = Ok(false);
        for p in 0..meta.partitions() {
            let r = crate::share::service::reset(core, &g, (&name, p), None).await;
            if first_error.is_ok() {
                first_error = r;
            }
        }
        let (code, message) = outcome(first_error);
        out.push(
            topic
                .with_topic_id(uuid_of(meta))
                .with_error_code(code)
                .with_error_message(message),
        );
    }
    DeleteShareGroupOffsetsResponse::default().with_responses(out)
}

/// Groups one DeleteGroups request looks for as share groups (each on
/// every partition of every topic); the ones past it are refused
/// (INVALID_REQUEST).
pub(super) const SHARE_GROUP_DELETES_MAX: usize = 16;

/// DeleteGroups of a share group (one its coordinator does not know as a
/// consumer group): refused while it has members (NON_EMPTY_GROUP); else
/// its state is forgotten on every partition where it has some — looked
/// for on every partition of every topic (share-group state is not
/// indexed by group), so on a cluster of many partitions it takes a
/// while. GROUP_ID_NOT_FOUND if it had none anywhere.
pub(super) async fn delete_group(core: &Rc<Core>, g: &str) -> i16 {
    if let Err((code, why)) = empty_share_group(core, g).await {
        tracing::debug!(group = g, why, "share group not deleted");
        return code;
    }
    let view = core.metadata();
    let mut found = false;
    for (name, t) in view
        .topics()
        .iter()
        .filter(|(n, _)| !crate::metadata::is_internal(n))
    {
        for p in 0..t.partitions() {
            match crate::share::service::reset(core, g, (name, p), None).await {
                Ok(had) => found |= had,
                Err(e) => return broker_error_code(&e),
            }
        }
    }
    if found {
        0
    } else {
        E::GroupIdNotFound.code()
    }
}
