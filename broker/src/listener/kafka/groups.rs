//! Consumer groups: the classic protocol, KIP-848, offsets.

use super::cluster::*;
use super::common::*;
use super::errors::*;

pub(super) async fn group(core: &Rc<Core>, req: GroupRequest) -> GroupResponse {
    coordinator::serve(core, req).await
}

pub(super) fn classic_code(e: &Option<classic::ClassicError>) -> i16 {
    e.as_ref().map_or(0, |e| e.kafka_code())
}

pub(super) async fn join_group(
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
pub(super) fn refused_code(r: &GroupResponse) -> i16 {
    match r {
        GroupResponse::Refused(c, _) => group_code(*c),
        _ => E::UnknownServerError.code(),
    }
}

pub(super) async fn sync_group(core: &Rc<Core>, r: SyncGroupRequest) -> SyncGroupResponse {
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

pub(super) async fn heartbeat(core: &Rc<Core>, r: HeartbeatRequest) -> HeartbeatResponse {
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

pub(super) async fn leave_group(
    core: &Rc<Core>,
    r: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
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

/// A commit's entries (topic, partition, offset, metadata) as the
/// coordinator takes them; those refused before it (a negative offset or
/// partition); and every partition asked, in order.
type CommitEntries = (
    Vec<native::CommitOffset>,
    Vec<(String, i32)>,
    Vec<(String, i32)>,
);

pub(super) fn commit_offsets(
    entries: impl Iterator<Item = (String, i32, i64, Option<String>)>,
) -> CommitEntries {
    let (mut offsets, mut bad, mut asked) = (Vec::new(), Vec::new(), Vec::new());
    for (topic, partition, offset, metadata) in entries {
        asked.push((topic.clone(), partition));
        if offset < 0 || partition < 0 {
            bad.push((topic, partition));
            continue;
        }
        offsets.push(native::CommitOffset {
            topic,
            partition: partition as u32,
            offset: offset as u64,
            metadata,
        });
    }
    (offsets, bad, asked)
}

/// The Kafka code of each partition (`asked`) of a commit (`req`, an
/// OffsetCommit or a TxnOffsetCommit) once the coordinator answered;
/// `bad`: partitions refused before it (INVALID_REQUEST).
pub(super) async fn commit_codes(
    core: &Rc<Core>,
    req: GroupRequest,
    asked: &[(String, i32)],
    bad: Vec<(String, i32)>,
) -> HashMap<(String, i32), i16> {
    let mut codes: HashMap<(String, i32), i16> = HashMap::new();
    match group(core, req).await {
        GroupResponse::Commit(c) => {
            let top = group_code(c.error);
            for p in c.partitions {
                let e = if top != 0 { top } else { group_code(p.error) };
                codes.insert((p.topic, p.partition as i32), e);
            }
            if top != 0 {
                for k in asked {
                    codes.insert(k.clone(), top);
                }
            }
        }
        other => {
            let c = refused_code(&other);
            for k in asked {
                codes.insert(k.clone(), c);
            }
        }
    }
    for k in bad {
        codes.insert(k, E::InvalidRequest.code());
    }
    codes
}

pub(super) async fn offset_commit(core: &Rc<Core>, r: OffsetCommitRequest) -> OffsetCommitResponse {
    let (offsets, bad, asked) = commit_offsets(r.topics.iter().flat_map(|t| {
        t.partitions.iter().map(|p| {
            let metadata = p.committed_metadata.as_ref().map(|m| m.to_string());
            (
                t.name.to_string(),
                p.partition_index,
                p.committed_offset,
                metadata,
            )
        })
    }));
    let req = GroupRequest::Commit(native::OffsetCommitRequest {
        group: r.group_id.to_string(),
        member_id: r.member_id.to_string(),
        generation: r.generation_id_or_member_epoch,
        offsets,
    });
    let codes = commit_codes(core, req, &asked, bad).await;
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
                                .unwrap_or(&E::UnknownServerError.code()),
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
/// A committed offset as OffsetFetch answers it: partition, offset,
/// metadata, error code.
pub(super) type CommittedRow = (i32, i64, Option<String>, i16);

/// `group_id`'s committed offsets of the partitions `asked` (`None`: all
/// it has). With `stable` (KIP-447's `require_stable`, what a
/// read_committed consumer asks), a partition whose offsets are pending
/// in an open transaction answers UNSTABLE_OFFSET_COMMIT: the client
/// retries until the transaction ends, rather than starting from the
/// offsets before it.
pub(super) async fn committed(
    core: &Rc<Core>,
    group_id: &str,
    asked: Option<Vec<(String, Vec<i32>)>>,
    stable: bool,
) -> (i16, Vec<(String, Vec<CommittedRow>)>) {
    let r = native::OffsetFetchRequest {
        group: group_id.to_string(),
        partitions: None,
    };
    let req = if stable {
        GroupRequest::FetchStable(r)
    } else {
        GroupRequest::Fetch(r)
    };
    let (offsets, pending) = match group(core, req).await {
        GroupResponse::Fetch(f) if f.error == 0 => (f.offsets, Vec::new()),
        GroupResponse::FetchStable(f, pending) if f.error == 0 => (f.offsets, pending),
        GroupResponse::Fetch(f) | GroupResponse::FetchStable(f, _) => {
            return (group_code(f.error), Vec::new())
        }
        other => return (refused_code(&other), Vec::new()),
    };
    let unstable = |t: &str, p: i32| pending.iter().any(|(pt, pp)| pt == t && *pp as i32 == p);
    let mut by: std::collections::BTreeMap<String, Vec<CommittedRow>> = Default::default();
    for o in &offsets {
        by.entry(o.topic.clone()).or_default().push((
            o.partition as i32,
            o.offset as i64,
            o.metadata.clone(),
            0,
        ));
    }
    // Pending offsets of partitions without a committed one yet.
    for (t, p) in &pending {
        let rows = by.entry(t.clone()).or_default();
        if !rows.iter().any(|r| r.0 == *p as i32) {
            rows.push((*p as i32, -1, Some(String::new()), 0));
        }
    }
    let out: Vec<(String, Vec<CommittedRow>)> = match asked {
        None => by.into_iter().collect(),
        Some(asked) => asked
            .into_iter()
            .map(|(t, ps)| {
                let have = by.get(&t);
                let rows = ps
                    .into_iter()
                    .map(|p| {
                        have.and_then(|h| h.iter().find(|r| r.0 == p).cloned())
                            .unwrap_or((p, -1, Some(String::new()), 0))
                    })
                    .collect();
                (t, rows)
            })
            .collect(),
    };
    let out = out
        .into_iter()
        .map(|(t, rows)| {
            let rows = rows
                .into_iter()
                .map(|(p, o, m, e)| {
                    if unstable(&t, p) {
                        (p, -1, Some(String::new()), E::UnstableOffsetCommit.code())
                    } else {
                        (p, o, m, e)
                    }
                })
                .collect();
            (t, rows)
        })
        .collect();
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
                        .map(|(p, o, m, e)| {
                            $partition::default()
                                .with_partition_index(p)
                                .with_committed_offset(o)
                                .with_committed_leader_epoch(-1)
                                .with_metadata(m.map(s))
                                .with_error_code(e)
                        })
                        .collect(),
                )
            })
            .collect()
    };
}

/// The partitions an OffsetFetch names per topic (`None`: all).
pub(super) fn asked<T>(
    topics: Option<Vec<T>>,
    f: impl Fn(T) -> (String, Vec<i32>),
) -> Option<Vec<(String, Vec<i32>)>> {
    topics.map(|ts| ts.into_iter().map(f).collect())
}

pub(super) async fn offset_fetch(
    core: &Rc<Core>,
    r: OffsetFetchRequest,
    version: i16,
    refused: &[String],
) -> OffsetFetchResponse {
    if version >= 8 {
        let mut groups = Vec::new();
        for g in r.groups {
            if refused.iter().any(|x| x.as_str() == g.group_id.as_str()) {
                groups.push(
                    OffsetFetchResponseGroup::default()
                        .with_group_id(g.group_id)
                        .with_error_code(E::GroupAuthorizationFailed.code()),
                );
                continue;
            }
            let wanted = asked(g.topics, |t| (t.name.to_string(), t.partition_indexes));
            let (error, topics) = committed(core, &g.group_id, wanted, r.require_stable).await;
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
    let (error, topics) = committed(core, &r.group_id, wanted, r.require_stable).await;
    OffsetFetchResponse::default()
        .with_error_code(error)
        .with_topics(committed_topics!(
            OffsetFetchResponseTopic,
            OffsetFetchResponsePartition,
            topics
        ))
}

/// ListGroups: every group with its type (`consumer`: KIP-848 and native
/// members; `classic`; `share`), filtered by state (v4+) and type (v5+) as asked
/// (case-insensitive; an empty filter keeps all).
pub(super) async fn list_groups(core: &Rc<Core>, r: ListGroupsRequest) -> ListGroupsResponse {
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
                        .with_protocol_type(s(if kind == "share" { "share" } else { "consumer" }))
                        .with_group_state(s(g.state))
                        .with_group_type(s(kind))
                })
                .collect(),
        ),
        other => ListGroupsResponse::default().with_error_code(refused_code(&other)),
    }
}

pub(super) async fn describe_groups(
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
                .with_error_code(group_code(x.error))
                .with_error_message(x.message.filter(|_| version >= 6).map(s)),
            other => d.with_error_code(refused_code(&other)),
        });
    }
    DescribeGroupsResponse::default().with_groups(out)
}

pub(super) async fn delete_groups(core: &Rc<Core>, r: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut out = Vec::new();
    for g in r.groups_names {
        let req = GroupRequest::Delete(native::DeleteGroupRequest {
            group: g.to_string(),
        });
        let error = match group(core, req).await {
            GroupResponse::Result(x) => group_code(x.error),
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
pub(super) async fn consumer_group_describe(
    core: &Rc<Core>,
    r: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    use kafka_protocol::messages::consumer_group_describe_response::{
        Assignment, DescribedGroup as CgGroup, Member, TopicPartitions as CgTopicPartitions,
    };
    let assignment = |tps: Vec<native::TopicPartitions>| {
        Assignment::default().with_topic_partitions(
            described_partitions(core, tps)
                .into_iter()
                .map(|(id, name, parts)| {
                    CgTopicPartitions::default()
                        .with_topic_id(id)
                        .with_topic_name(name)
                        .with_partitions(parts)
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
                .with_error_code(E::GroupIdNotFound.code())
                .with_error_message(Some(s(format!(
                    "Group {} is not a consumer group.",
                    g.as_str()
                )))),
            GroupResponse::Describe(x) => d
                .with_error_code(group_code(x.error))
                .with_error_message(x.message.map(s)),
            other => d.with_error_code(refused_code(&other)),
        });
    }
    ConsumerGroupDescribeResponse::default().with_groups(out)
}

// --- KIP-848 -----------------------------------------------------------------

/// Kafka's server assignor names onto Weir's.
pub(super) fn assignor_name(name: &str) -> String {
    match name {
        "uniform" => "cooperative-sticky".to_string(),
        other => other.to_string(),
    }
}

pub(super) async fn consumer_group_heartbeat(
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
                GroupError::UnknownMember(_) => E::UnknownMemberId.code(),
                GroupError::FencedMemberEpoch(_) => E::FencedMemberEpoch.code(),
                GroupError::StaleMemberEpoch(_) => E::StaleMemberEpoch.code(),
                GroupError::UnsupportedAssignor(_) => E::UnsupportedAssignor.code(),
                GroupError::InvalidSessionTimeout(_) => E::InvalidSessionTimeout.code(),
                GroupError::InvalidRequest(_) => E::InvalidRequest.code(),
                GroupError::GroupMaxSize(_) => E::GroupMaxSizeReached.code(),
                GroupError::UnreleasedInstanceId(_) => E::UnreleasedInstanceId.code(),
            };
            ConsumerGroupHeartbeatResponse::default()
                .with_error_code(c)
                .with_error_message(Some(s(e.message())))
        }
        other => ConsumerGroupHeartbeatResponse::default().with_error_code(refused_code(&other)),
    }
}
