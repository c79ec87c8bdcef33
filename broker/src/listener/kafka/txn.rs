//! Transactions: InitProducerId with a transactional id,
//! AddPartitionsToTxn (v0–3), AddOffsetsToTxn, TxnOffsetCommit, EndTxn,
//! and the coordinator lookup (FindCoordinator key type 1), onto the
//! transaction coordinator ([`crate::txns`]). Both client protocols:
//! KIP-98's v1 (the client adds every partition; EndTxn v0–4) and
//! KIP-890's v2, which clients use when ApiVersions finalizes
//! `transaction.version` 2 (EndTxn v5 bumps the epoch at every end;
//! Produce v12+ and TxnOffsetCommit v5 add their partition themselves).
//! Transactional Produce is checked, or its partition added, in the
//! service.

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};

use super::common::*;
use super::errors::txn_code;
use crate::service::acl;
use crate::service::auth::Session;
use crate::txns::api::{TxnRefusal, TxnRequest};
use crate::txns::coordinator as txns;
use weir_txn::TransactionVersion;

/// InitProducerId for a transactional producer.
pub(super) async fn init_transactional(
    core: &Rc<Core>,
    id: String,
    r: &InitProducerIdRequest,
    session: &Session,
) -> InitProducerIdResponse {
    // Transactional-id ACLs are not built: a transactional producer needs
    // what an idempotent one does (IdempotentWrite on the cluster, or
    // Write on some topic).
    if !acl::may_write_idempotently(core, session) {
        return refused_init(E::ClusterAuthorizationFailed.code());
    }
    // KIP-360 (v3+): the id and epoch the client had, if any.
    let expected = (r.producer_id.0 >= 0).then_some((r.producer_id.0, r.producer_epoch));
    let req = TxnRequest::InitProducerId {
        id,
        timeout_ms: i64::from(r.transaction_timeout_ms),
        expected,
        version: TransactionVersion::V1,
    };
    match txns::serve(core, req).await {
        Ok(Some((pid, epoch))) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch),
        Ok(None) => refused_init(E::UnknownServerError.code()),
        Err(e) => refused_init(init_code(&e)),
    }
}

fn refused_init(code: i16) -> InitProducerIdResponse {
    InitProducerIdResponse::default()
        .with_error_code(code)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1)
}

/// A refusal's code for a request of `version`: PRODUCER_FENCED came with
/// KIP-588 (`since`: the first version that knows it); older versions are
/// told INVALID_PRODUCER_EPOCH, as Kafka tells them.
fn versioned_code(e: &TxnRefusal, version: i16, since: i16) -> i16 {
    match e {
        TxnRefusal::Txn(weir_txn::TxnError::ProducerFenced(_)) if version < since => {
            E::InvalidProducerEpoch.code()
        }
        e => txn_code(e),
    }
}

/// Kafka's InitProducerId answers a fenced expectation INVALID_PRODUCER_EPOCH
/// (KIP-360: the client then bumps again or fails fatally).
fn init_code(e: &TxnRefusal) -> i16 {
    match e {
        TxnRefusal::Txn(weir_txn::TxnError::ProducerFenced(_)) => E::InvalidProducerEpoch.code(),
        e => txn_code(e),
    }
}

/// AddPartitionsToTxn (v0–3): one answer for all the partitions, as
/// Kafka gives it (an unknown topic fails the whole request, the others
/// then answer OPERATION_NOT_ATTEMPTED).
pub(super) async fn add_partitions_to_txn(
    core: &Rc<Core>,
    r: AddPartitionsToTxnRequest,
    version: i16,
    session: &Session,
) -> AddPartitionsToTxnResponse {
    let id = r.v3_and_below_transactional_id.to_string();
    let mut tps: Vec<(String, u32)> = Vec::new();
    let mut unknown: Vec<(String, i32)> = Vec::new();
    let mut denied: Vec<(String, i32)> = Vec::new();
    for t in &r.v3_and_below_topics {
        let name = t.name.to_string();
        let meta = core.metadata().get(&name).cloned();
        let may = acl::allowed(core, session, acl::Op::Write, acl::Resource::Topic(&name));
        for &p in &t.partitions {
            let exists = meta
                .as_ref()
                .is_some_and(|m| p >= 0 && (p as u32) < m.partitions());
            if !may {
                denied.push((name.clone(), p));
            } else if !exists {
                unknown.push((name.clone(), p));
            } else {
                tps.push((name.clone(), p as u32));
            }
        }
    }
    let code_of = |topic: &str, p: i32, all: i16| -> i16 {
        if denied.iter().any(|(t, q)| t == topic && *q == p) {
            E::TopicAuthorizationFailed.code()
        } else if unknown.iter().any(|(t, q)| t == topic && *q == p) {
            E::UnknownTopicOrPartition.code()
        } else {
            all
        }
    };
    let all = if !unknown.is_empty() || !denied.is_empty() {
        E::OperationNotAttempted.code()
    } else {
        let req = TxnRequest::AddPartitions {
            id,
            producer_id: r.v3_and_below_producer_id.0,
            epoch: r.v3_and_below_producer_epoch,
            partitions: tps,
            version: TransactionVersion::V1,
        };
        match txns::serve(core, req).await {
            Ok(_) => 0,
            Err(e) => versioned_code(&e, version, 2),
        }
    };
    let results = r
        .v3_and_below_topics
        .iter()
        .map(|t| {
            let name = t.name.to_string();
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name.clone())
                .with_results_by_partition(
                    t.partitions
                        .iter()
                        .map(|&p| {
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(p)
                                .with_partition_error_code(code_of(&name, p, all))
                        })
                        .collect(),
                )
        })
        .collect();
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results)
}

/// EndTxn: commit or abort; answered once the markers are written (at
/// most `END_WAITS_FOR_MARKERS_MS`). v5 is KIP-890's v2: the end bumps
/// the epoch, and the answer names the producer id and epoch the client
/// goes on with.
pub(super) async fn end_txn(core: &Rc<Core>, r: EndTxnRequest, version: i16) -> EndTxnResponse {
    let req = TxnRequest::EndTxn {
        id: r.transactional_id.to_string(),
        producer_id: r.producer_id.0,
        epoch: r.producer_epoch,
        commit: r.committed,
        version: end_txn_version(version),
    };
    match txns::serve(core, req).await {
        Ok(pair) => {
            let (pid, epoch) = pair.unwrap_or((r.producer_id.0, r.producer_epoch));
            EndTxnResponse::default()
                .with_producer_id(ProducerId(pid))
                .with_producer_epoch(epoch)
        }
        Err(e) => EndTxnResponse::default()
            .with_error_code(versioned_code(&e, version, 2))
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    }
}

/// The transaction protocol an EndTxn of `version` speaks (Kafka's rule:
/// v5+ is KIP-890's v2).
fn end_txn_version(version: i16) -> TransactionVersion {
    if version >= 5 {
        TransactionVersion::V2
    } else {
        TransactionVersion::V1
    }
}

/// AddOffsetsToTxn (v0–3): the group's `__consumer_offsets` partition
/// joins the transaction (TxnOffsetCommit then writes there).
pub(super) async fn add_offsets_to_txn(
    core: &Rc<Core>,
    r: AddOffsetsToTxnRequest,
    version: i16,
) -> AddOffsetsToTxnResponse {
    let group = r.group_id.to_string();
    let Some(p) = crate::coordinator::partition_of(core, OFFSETS_TOPIC, &group) else {
        return AddOffsetsToTxnResponse::default()
            .with_error_code(E::CoordinatorNotAvailable.code());
    };
    let req = TxnRequest::AddPartitions {
        id: r.transactional_id.to_string(),
        producer_id: r.producer_id.0,
        epoch: r.producer_epoch,
        partitions: vec![(OFFSETS_TOPIC.to_string(), p)],
        version: TransactionVersion::V1,
    };
    match txns::serve(core, req).await {
        Ok(_) => AddOffsetsToTxnResponse::default(),
        Err(e) => {
            AddOffsetsToTxnResponse::default().with_error_code(versioned_code(&e, version, 2))
        }
    }
}

/// TxnOffsetCommit: offsets committed as part of the transaction, at the
/// group's coordinator; visible when the transaction commits. From v5
/// (KIP-890's v2) the client sends no AddOffsetsToTxn: the group's
/// `__consumer_offsets` partition joins the transaction here first.
pub(super) async fn txn_offset_commit(
    core: &Rc<Core>,
    r: TxnOffsetCommitRequest,
    version: i16,
) -> TxnOffsetCommitResponse {
    if version >= 5 {
        if let Some(code) = implicit_add_offsets(core, &r).await {
            return txn_offset_commit_answer(r, |_, _| code);
        }
    }
    let (offsets, bad, asked) = super::groups::commit_offsets(r.topics.iter().flat_map(|t| {
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
    let req = GroupRequest::TxnCommit {
        request: native::OffsetCommitRequest {
            group: r.group_id.to_string(),
            member_id: r.member_id.to_string(),
            generation: r.generation_id,
            offsets,
        },
        producer: (r.producer_id.0, r.producer_epoch),
    };
    let codes = super::groups::commit_codes(core, req, &asked, bad).await;
    txn_offset_commit_answer(r, |topic, p| {
        codes
            .get(&(topic.to_string(), p))
            .copied()
            .unwrap_or(E::UnknownServerError.code())
    })
}

/// KIP-890 v2's implicit AddOffsetsToTxn of a TxnOffsetCommit v5: the
/// group's offsets partition joins the transaction (waiting out the
/// previous transaction's markers, as a v2 write does); the refusal's
/// code if it does not.
async fn implicit_add_offsets(core: &Rc<Core>, r: &TxnOffsetCommitRequest) -> Option<i16> {
    let Some(p) = crate::coordinator::partition_of(core, OFFSETS_TOPIC, r.group_id.as_str()) else {
        return Some(E::CoordinatorNotAvailable.code());
    };
    let req = TxnRequest::Verify {
        id: r.transactional_id.to_string(),
        producer_id: r.producer_id.0,
        epoch: r.producer_epoch,
        tp: (OFFSETS_TOPIC.to_string(), p),
        add: true,
    };
    match txns::serve(core, req).await {
        Ok(_) => None,
        // A fenced producer learns it as a v5 client expects.
        Err(e) => Some(txn_code(&e)),
    }
}

/// The TxnOffsetCommit answer: each partition of the request with
/// `code_of(topic, partition)`.
fn txn_offset_commit_answer(
    r: TxnOffsetCommitRequest,
    code_of: impl Fn(&str, i32) -> i16,
) -> TxnOffsetCommitResponse {
    use kafka_protocol::messages::txn_offset_commit_response::{
        TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
    };
    let topics = r
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    TxnOffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code_of(t.name.as_str(), p.partition_index))
                })
                .collect();
            TxnOffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    TxnOffsetCommitResponse::default().with_topics(topics)
}

/// The coordinator's answer for a transactional id this node holds no
/// state of: not its coordinator, still loading, or unknown.
fn absent_code(core: &Core, id: &str) -> i16 {
    match txns::coordinator_of(core, id) {
        Ok(_) => E::TransactionalIdNotFound.code(),
        Err(e) => txn_code(&e),
    }
}

/// A transaction's partitions, by topic.
fn topics_of(m: &weir_txn::TxnMetadata) -> Vec<(String, Vec<i32>)> {
    let mut by_topic: Vec<(String, Vec<i32>)> = Vec::new();
    for (t, p) in &m.partitions {
        match by_topic.last_mut() {
            Some((last, ps)) if last == t => ps.push(*p as i32),
            _ => by_topic.push((t.clone(), vec![*p as i32])),
        }
    }
    by_topic
}

/// DescribeTransactions (v0): each id as its coordinator (this node) knows
/// it; NOT_COORDINATOR for an id another node coordinates.
pub(super) async fn describe_transactions(
    core: &Rc<Core>,
    r: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
    let ids: Vec<String> = r.transactional_ids.iter().map(|i| i.to_string()).collect();
    let too_many = ids.len() > REQUEST_PARTITIONS_MAX;
    let states = if too_many {
        Vec::new()
    } else {
        crate::txns::admin::node_states(core, Some(ids.clone())).await
    };
    let transaction_states = r
        .transactional_ids
        .into_iter()
        .map(|id| {
            let base = TransactionState::default()
                .with_transactional_id(id.clone())
                .with_transaction_state(StrBytes::from_static_str(""))
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
                .with_transaction_start_time_ms(-1);
            if too_many {
                return base.with_error_code(E::InvalidRequest.code());
            }
            match states.iter().find(|m| m.transactional_id == id.as_str()) {
                None => base.with_error_code(absent_code(core, &id)),
                Some(m) => base
                    .with_transaction_state(StrBytes::from_static_str(m.state.name()))
                    .with_transaction_timeout_ms(m.timeout_ms.min(i32::MAX as u32) as i32)
                    .with_transaction_start_time_ms(m.start_ms)
                    .with_producer_id(ProducerId(m.producer_id))
                    .with_producer_epoch(m.producer_epoch)
                    .with_topics(
                        topics_of(m)
                            .into_iter()
                            .map(|(t, ps)| {
                                TopicData::default()
                                    .with_topic(TopicName(StrBytes::from_string(t)))
                                    .with_partitions(ps)
                            })
                            .collect(),
                    ),
            }
        })
        .collect();
    DescribeTransactionsResponse::default().with_transaction_states(transaction_states)
}

/// The states ListTransactions filters by (Kafka's names).
const STATE_NAMES: [&str; 7] = [
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
];

/// ListTransactions (v0–1): the transactional ids this core coordinates
/// (each core is a broker to Kafka clients, and admin clients ask every
/// broker), filtered by state, producer id and (v1) how long the
/// transaction has run.
pub(super) async fn list_transactions(
    core: &Rc<Core>,
    r: ListTransactionsRequest,
) -> ListTransactionsResponse {
    use kafka_protocol::messages::list_transactions_response::TransactionState;
    let unknown: Vec<StrBytes> = r
        .state_filters
        .iter()
        .filter(|s| !STATE_NAMES.contains(&s.as_str()))
        .cloned()
        .collect();
    let now = core.storage.now_ms();
    let states = crate::txns::admin::local_states(core, None);
    let listed = states
        .iter()
        .filter(|m| {
            r.state_filters.is_empty()
                || r.state_filters.iter().any(|s| s.as_str() == m.state.name())
        })
        .filter(|m| {
            r.producer_id_filters.is_empty()
                || r.producer_id_filters.iter().any(|p| p.0 == m.producer_id)
        })
        .filter(|m| {
            r.duration_filter < 0 || (m.start_ms >= 0 && now - m.start_ms >= r.duration_filter)
        })
        .map(|m| {
            TransactionState::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(
                    m.transactional_id.clone(),
                )))
                .with_producer_id(ProducerId(m.producer_id))
                .with_transaction_state(StrBytes::from_static_str(m.state.name()))
        })
        .collect();
    ListTransactionsResponse::default()
        .with_unknown_state_filters(unknown)
        .with_transaction_states(listed)
}

/// DescribeProducers (v0): the producers each partition's leader (this
/// node) remembers; NOT_LEADER_OR_FOLLOWER for a partition led elsewhere.
pub(super) async fn describe_producers(
    core: &Rc<Core>,
    r: DescribeProducersRequest,
) -> DescribeProducersResponse {
    use kafka_protocol::messages::describe_producers_response::{
        PartitionResponse, ProducerState, TopicResponse,
    };
    let asked: usize = r.topics.iter().map(|t| t.partition_indexes.len()).sum();
    let too_many = asked > REQUEST_PARTITIONS_MAX;
    let mut topics = Vec::with_capacity(r.topics.len());
    for t in r.topics {
        let name = t.name.to_string();
        let mut partitions = Vec::with_capacity(t.partition_indexes.len());
        for p in t.partition_indexes {
            let base = PartitionResponse::default().with_partition_index(p);
            let answer = if too_many {
                base.with_error_code(E::InvalidRequest.code())
                    .with_error_message(Some(StrBytes::from_string(format!(
                        "the request names {asked} partitions; at most \
                         {REQUEST_PARTITIONS_MAX} per request"
                    ))))
            } else if p < 0 {
                base.with_error_code(E::UnknownTopicOrPartition.code())
            } else {
                match crate::txns::admin::producers(core, &name, p as u32).await {
                    Err(e) => base
                        .with_error_code(super::errors::broker_error_code(&e))
                        .with_error_message(Some(StrBytes::from_string(e.to_string()))),
                    Ok(producers) => base.with_active_producers(
                        producers
                            .into_iter()
                            .map(|a| {
                                ProducerState::default()
                                    .with_producer_id(ProducerId(a.producer_id))
                                    .with_producer_epoch(i32::from(a.epoch))
                                    .with_last_sequence(a.last_sequence)
                                    .with_last_timestamp(a.last_timestamp)
                                    .with_coordinator_epoch(-1)
                                    .with_current_txn_start_offset(
                                        a.txn_first_offset.map_or(-1, |o| o as i64),
                                    )
                            })
                            .collect(),
                    ),
                }
            };
            partitions.push(answer);
        }
        topics.push(
            TopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    DescribeProducersResponse::default().with_topics(topics)
}
