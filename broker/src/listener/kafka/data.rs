//! The data path: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch.

use super::cluster::*;
use super::common::*;
use super::errors::*;
use crate::service::acl::{self, Op, Resource};
use crate::service::auth::Session;
use crate::service::quota;

pub(super) async fn produce(
    core: &Rc<Core>,
    h: codec::RequestHeaderInfo,
    r: ProduceRequest,
    ctx: Ctx,
    session: &Session,
) -> Pending {
    let acks = r.acks;
    let transaction: Option<std::rc::Rc<str>> = r
        .transactional_id
        .as_ref()
        .map(|t| std::rc::Rc::from(t.as_str()));
    let mut parts = Vec::new();
    let mut names = Vec::new();
    let ids = TopicIds::new(core);
    for t in r.topic_data {
        let topic = ids.resolve(&t.name, t.topic_id);
        names.push((t.name.clone(), t.topic_id, t.partition_data.len()));
        let denied = topic
            .as_deref()
            .and_then(|n| acl::check(core, session, Op::Write, Resource::Topic(n)).err());
        for p in t.partition_data {
            let topic = topic.clone().unwrap_or_default();
            let data = if let Some(e) = &denied {
                Err(e.clone())
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
                transaction: transaction.clone(),
                // KIP-890 v2: a client that sends v12+ speaks it (Kafka's
                // clients cap Produce at v11 otherwise).
                adds_to_txn: h.api_version >= 12,
            });
        }
    }
    if !(-1..=1).contains(&acks) {
        let e = BrokerError::InvalidRequest(format!("acks {acks}: use -1, 0 or 1"));
        let outcomes = parts
            .into_iter()
            .map(|p| (p.topic, p.partition, Err(e.clone())))
            .collect();
        return Pending::Ready(produce_answer(
            core,
            session.protocol,
            &h,
            &names,
            outcomes,
            0,
        ));
    }
    let timeout = Some(Duration::from_millis(r.timeout_ms.max(0) as u64));
    // Over its quota, the client is throttled, not refused (Kafka's).
    let throttle = quota::throttle_ms(quota::spend_produce(core, session, &parts));
    match service::produce::produce(core, parts, acks as i8, timeout, ctx).await {
        Ok(acked) => {
            let (core, listener) = (core.clone(), session.protocol);
            later(async move {
                let outcomes = acked.await;
                if acks == 0 {
                    // acks=0: Kafka sends no answer at all.
                    return Answer::plain(BytesMut::new());
                }
                produce_answer(&core, listener, &h, &names, outcomes, throttle)
            })
        }
        Err(e) => {
            let mut outcomes = Vec::new();
            for (n, _, k) in &names {
                for _ in 0..*k {
                    outcomes.push((n.to_string(), 0, Err(e.clone())));
                }
            }
            Pending::Ready(produce_answer(
                core,
                session.protocol,
                &h,
                &names,
                outcomes,
                throttle,
            ))
        }
    }
}

/// A refused partition's code in a Produce answer of `version`. A
/// transactional write whose check (or v2 add) the coordinator could not
/// answer now is told NOT_ENOUGH_REPLICAS, as Kafka tells it: retriable,
/// and without the metadata refresh a NOT_COORDINATOR would cost (older
/// clients do not retry coordinator errors on a produce). From v12 a
/// CONCURRENT_TRANSACTIONS stays itself: v2 clients retry it.
fn produce_error_code(e: &BrokerError, version: i16) -> i16 {
    use crate::txns::api::TxnRefusal as R;
    match e {
        BrokerError::Transaction(R::NotCoordinator(_) | R::Loading(_) | R::Storage(_)) => {
            E::NotEnoughReplicas.code()
        }
        BrokerError::Transaction(R::Txn(weir_txn::TxnError::ConcurrentTransactions(_)))
            if version < 12 =>
        {
            E::NotEnoughReplicas.code()
        }
        e => broker_error_code(e),
    }
}

/// The Produce answer; a partition refused for leadership names its
/// leader as this node knows it now (KIP-951, v10+).
pub(super) fn produce_answer(
    core: &Core,
    listener: SecurityProtocol,
    h: &codec::RequestHeaderInfo,
    names: &[(TopicName, uuid::Uuid, usize)],
    outcomes: Vec<service::produce::ProduceOutcome>,
    throttle_ms: i32,
) -> Answer {
    let mut leaders = NewLeaders::new(core, listener);
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
                        let code = produce_error_code(&e, h.api_version);
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
                .with_throttle_time_ms(throttle_ms)
                .with_responses(responses)
                .with_node_endpoints(endpoints),
        ),
    )
}

/// A fetched topic as the request named it, and per partition its slot
/// among the partitions read, or the error answered at once.
pub(super) type FetchShape = (TopicName, uuid::Uuid, Vec<(i32, Result<usize, i16>)>);

pub(super) async fn fetch(
    core: &Rc<Core>,
    h: codec::RequestHeaderInfo,
    r: FetchRequest,
    ctx: Ctx,
    session: &Session,
) -> Answer {
    // Topics, by name or id, and their partitions: what to read, and what
    // is answered at once (unknown topic id, bad partition index).
    let mut shape: Vec<FetchShape> = Vec::new();
    let mut parts: Vec<FetchPart> = Vec::new();
    let ids = TopicIds::new(core);
    for t in r.topics {
        let topic = ids.resolve(&t.topic, t.topic_id);
        let readable = topic
            .as_deref()
            .is_none_or(|n| acl::allowed(core, session, Op::Read, Resource::Topic(n)));
        let mut ps = Vec::new();
        for p in t.partitions {
            let slot = match (&topic, p.partition >= 0 && p.fetch_offset >= 0) {
                (Some(_), _) if !readable => Err(E::TopicAuthorizationFailed.code()),
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
                _ if !t.topic_id.is_nil() && t.topic.is_empty() => Err(E::UnknownTopicId.code()),
                _ => Err(E::UnknownTopicOrPartition.code()),
            };
            ps.push((p.partition, slot));
        }
        shape.push((t.topic.clone(), t.topic_id, ps));
    }
    let read_committed = r.isolation_level == 1;
    let mut params = FetchParams {
        max_bytes: r.max_bytes.max(0) as u32,
        min_bytes: r.min_bytes.max(0) as u32,
        max_wait_ms: r.max_wait_ms.max(0) as u32,
        read_committed,
    };
    quota::cap_fetch(core, session, &mut params);
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
    let throttle = quota::throttle_ms(quota::spend_fetch(core, session, &results));
    let mut batches = codec::FetchBatches::default();
    // KIP-951 (v12+ name the leader, v16+ its endpoint).
    let mut leaders = NewLeaders::new(core, session.protocol);
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
                        Err(c)
                            if c == E::UnknownTopicId.code()
                                || c == E::UnknownTopicOrPartition.code() =>
                        {
                            d.with_error_code(c)
                        }
                        Err(c) => refused(d, c),
                        Ok(Err(e)) => refused(d, broker_error_code(e)),
                        Ok(Ok(ok)) => {
                            // Never null: clients read an empty record set
                            // as size 0, and librdkafka refuses -1. Several
                            // batches go out as they are, not concatenated.
                            let records = batches.records(&ok.batches);
                            // read_committed: the aborted transactions the
                            // records hold, for the client to skip.
                            let aborted = read_committed.then(|| {
                                ok.aborted
                                    .iter()
                                    .map(|&(pid, first)| {
                                        fetch_response::AbortedTransaction::default()
                                            .with_producer_id(ProducerId(pid))
                                            .with_first_offset(first as i64)
                                    })
                                    .collect()
                            });
                            d.with_high_watermark(ok.high_watermark as i64)
                                .with_last_stable_offset(ok.last_stable_offset as i64)
                                .with_log_start_offset(ok.log_start_offset as i64)
                                .with_aborted_transactions(aborted.or(Some(Vec::new())))
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
        .with_throttle_time_ms(throttle)
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

pub(super) async fn list_offsets(
    core: &Rc<Core>,
    r: ListOffsetsRequest,
    version: i16,
    session: &Session,
) -> ListOffsetsResponse {
    let mut queries = Vec::new();
    let mut shape = Vec::new();
    for t in r.topics {
        let mut ps = Vec::new();
        let described = acl::allowed(core, session, Op::Describe, Resource::Topic(&t.name));
        for p in t.partitions {
            let q = match p.timestamp {
                -2 => Some(OffsetQuery::Earliest),
                -1 if r.isolation_level == 1 => Some(OffsetQuery::LatestStable),
                -1 => Some(OffsetQuery::Latest),
                // KIP-405 / KIP-1005 (ListOffsets v8, v9).
                -4 => Some(OffsetQuery::EarliestLocal),
                -5 => Some(OffsetQuery::LatestTiered),
                ts if ts >= 0 => Some(OffsetQuery::Timestamp(ts)),
                _ => None,
            };
            let slot = match (q, p.partition_index >= 0) {
                _ if !described => Err(E::TopicAuthorizationFailed.code()),
                (Some(q), true) => {
                    check_leader_epoch(core, &t.name, p.partition_index, p.current_leader_epoch)
                        .map(|()| {
                            queries.push((t.name.to_string(), p.partition_index as u32, q));
                            queries.len() - 1
                        })
                }
                _ => Err(E::InvalidRequest.code()),
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

/// Where each asked leader epoch ends in the partition's log (KIP-320: a
/// consumer that resumes at an offset with the epoch that wrote it learns
/// whether the log it read from was truncated below it): the largest
/// epoch at or below the one asked and the start of the next, capped at
/// the high watermark (a consumer never reads past it); -1 and -1 when
/// the log has no epoch that old.
pub(super) async fn offset_for_leader_epoch(
    core: &Rc<Core>,
    r: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let mut topics = Vec::new();
    for t in r.topics {
        let mut partitions = Vec::new();
        for p in t.partitions {
            let e = EpochEndOffset::default().with_partition(p.partition);
            let r = if p.partition < 0 {
                Err(E::UnknownTopicOrPartition.code())
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
