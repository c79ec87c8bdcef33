//! The transaction coordinator: where a transactional id lives, how
//! requests reach it, how its state machine's decisions are stored before
//! they are answered, and how the markers of a decided transaction are
//! written.
//!
//! **Which core:** a transactional id lives on the core that leads its
//! partition of `__transaction_state` (`crc32c(id) % partitions`, then
//! the metadata's placement). Requests arriving on any core are forwarded
//! there over the mesh ([`CoreMsg::Txn`]).
//!
//! **Serialization and durability:** a partition's steps run one at a
//! time under its lock, from the state machine's decision to its record
//! being durable in `__transaction_state` (fdatasync'd, and on the ISR of
//! a replicated topic); only then is the request answered. A failed write
//! forgets the partition and replays it (the machine's state ran ahead of
//! the log).
//!
//! **Markers:** once a transaction's end (or a fencing abort) is durable,
//! a marker is appended to each of its partitions, on the core leading it
//! (through the mesh), each durable as an acks=all write; when all are,
//! the transaction completes (another record). A partition that cannot
//! take its marker now (no leader here, a leader moving) is retried every
//! [`MARKER_RETRY_MS`] for as long as this core coordinates the id — a
//! lapse of this node's leader lease pauses the markers, it does not end
//! them; a core that takes the partition of `__transaction_state` over (or
//! replays it after a failed write) writes the markers of every
//! transaction still prepared. A retried EndTxn of a transaction already
//! decided is answered once it completed.

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use weir_txn::{records, Markers, Step, TransactionVersion, Transactions};

use super::api::{Tp, TxnRefusal, TxnRequest, TxnResponse};
use super::registry::txn_config;
use super::TXN_TOPIC;
use crate::error::BrokerError;
use crate::shard::mesh::CoreMsg;
use crate::shard::partition;
use crate::shard::Core;

/// How often a core looks for timed-out transactions and expired ids.
pub const EXPIRY_CHECK_MS: u64 = 1000;
/// How long EndTxn waits for its markers before answering (the decision
/// is durable already; the markers go on being written after).
pub const END_WAITS_FOR_MARKERS_MS: u64 = 10_000;
/// Wait between attempts at markers that could not be written.
pub const MARKER_RETRY_MS: u64 = 200;
/// How often a retried EndTxn looks whether its transaction completed.
const END_RETRY_POLL_MS: u64 = 20;
/// How long a v2 write's implicit add waits for the previous
/// transaction's markers before answering CONCURRENT_TRANSACTIONS (Kafka's
/// `add.partitions.to.txn.retry.backoff.max.ms`).
pub const IMPLICIT_ADD_WAIT_MS: u64 = 100;
/// Between two tries of an implicit add (Kafka's
/// `add.partitions.to.txn.retry.backoff.ms`).
const IMPLICIT_ADD_RETRY_MS: u64 = 5;
/// Producer ids kept at hand (a step uses at most one).
const IDS_AT_HAND: usize = 2;

/// `id`'s partition of `__transaction_state`.
pub fn txn_partition(core: &Core, id: &str) -> Result<u32, TxnRefusal> {
    if id.is_empty() || id.len() > weir_txn::coordinator::TRANSACTIONAL_ID_BYTES_MAX {
        return Err(TxnRefusal::Txn(weir_txn::TxnError::InvalidRequest(
            format!("a transactional id of {} bytes", id.len()),
        )));
    }
    crate::coordinator::partition_of(core, TXN_TOPIC, id).ok_or_else(|| {
        TxnRefusal::Loading(format!("the internal topic {TXN_TOPIC} does not exist yet"))
    })
}

/// The core of this node that coordinates `id`, or why there is none.
pub fn coordinator_of(core: &Core, id: &str) -> Result<usize, TxnRefusal> {
    let p = txn_partition(core, id)?;
    core.locate(TXN_TOPIC, p).map_err(|e| match e {
        BrokerError::NotLeader { leader, .. } => TxnRefusal::NotCoordinator(format!(
            "`{id}` is coordinated by {} ({TXN_TOPIC}-{p}): ask FindCoordinator",
            if leader == 0 {
                "no live node now".to_string()
            } else {
                format!("node {leader}")
            }
        )),
        e => TxnRefusal::Storage(e.to_string()),
    })
}

/// The node coordinating `id` when it is another node than this one.
fn coordinating_node(core: &Core, id: &str) -> Result<Option<u64>, TxnRefusal> {
    let p = txn_partition(core, id)?;
    let me = core.shared.config.cluster.node_id;
    let leader = core
        .metadata()
        .get(TXN_TOPIC)
        .and_then(|t| t.leaders.get(p as usize).copied())
        .unwrap_or(0);
    Ok((leader != 0 && leader != me).then_some(leader))
}

/// Serves a request from a connection on this core: on the coordinator's
/// core, through the mesh if that is another.
pub async fn serve(core: &Rc<Core>, req: TxnRequest) -> TxnResponse {
    // A verification for a partition this node leads, of an id another
    // node coordinates: asked there (a client's own requests go to the
    // coordinator it found).
    if let TxnRequest::Verify {
        id,
        producer_id,
        epoch,
        tp,
        add,
    } = &req
    {
        if let Some(node) = coordinating_node(core, id)? {
            return verify_on_node(core, node, id, (*producer_id, *epoch), tp.clone(), *add)
                .await
                .map(|()| None);
        }
    }
    let c = coordinator_of(core, req.id())?;
    if c == core.id {
        return handle(core, req).await;
    }
    core.call(c, Duration::ZERO, |reply| CoreMsg::Txn {
        request: req,
        reply,
    })
    .await
    .unwrap_or_else(|e| Err(TxnRefusal::Storage(e.to_string())))
}

/// Handles a request on the coordinator's core.
pub async fn handle(core: &Rc<Core>, req: TxnRequest) -> TxnResponse {
    let p = txn_partition(core, req.id())?;
    if coordinator_of(core, req.id())? != core.id {
        return Err(TxnRefusal::NotCoordinator(format!(
            "{TXN_TOPIC}-{p} moved to another core: retry"
        )));
    }
    if !core.txns.hosting.ready(p) {
        return Err(TxnRefusal::Loading(format!(
            "{TXN_TOPIC}-{p} is being loaded: retry"
        )));
    }
    let now = core.storage.now_ms();
    match req {
        TxnRequest::InitProducerId {
            id,
            timeout_ms,
            expected,
            version,
        } => step(core, p, |t, ids| {
            t.init_producer_id(&id, timeout_ms, expected, version, now, ids)
        })
        .await
        .map(Some),
        TxnRequest::AddPartitions {
            id,
            producer_id,
            epoch,
            partitions,
            version,
        } => step(core, p, |t, _| {
            t.add_partitions(&id, producer_id, epoch, &partitions, version, now)
        })
        .await
        .map(|()| None),
        TxnRequest::Verify {
            id,
            producer_id,
            epoch,
            tp,
            add,
        } => {
            if add {
                return implicit_add(core, p, &id, (producer_id, epoch), tp)
                    .await
                    .map(|()| None);
            }
            let parts = core.txns.parts.borrow();
            let t = parts.get(&p).ok_or_else(|| {
                TxnRefusal::Txn(weir_txn::TxnError::InvalidProducerIdMapping(format!(
                    "`{id}` has no producer id here"
                )))
            })?;
            t.verify(&id, producer_id, epoch, &tp)
                .map(|()| None)
                .map_err(TxnRefusal::Txn)
        }
        TxnRequest::EndTxn {
            id,
            producer_id,
            epoch,
            commit,
            version,
        } => step_then_markers(core, p, &id, |t, ids| {
            t.end_txn(&id, (producer_id, epoch), commit, version, now, ids)
        })
        .await
        .map(Some),
        TxnRequest::Abort { id } => {
            step_then_markers(core, p, &id, |t, ids| t.abort(&id, now, ids))
                .await
                .map(Some)
        }
    }
}

/// KIP-890 v2: a transactional write adds its partition to the producer's
/// transaction (which opens if none is). While the previous transaction's
/// markers are still being written (CONCURRENT_TRANSACTIONS) the add is
/// tried again for up to [`IMPLICIT_ADD_WAIT_MS`], as Kafka's partition
/// leaders do: a produce is expensive to retry from the client.
async fn implicit_add(
    core: &Rc<Core>,
    p: u32,
    id: &str,
    (producer_id, epoch): (i64, i16),
    tp: Tp,
) -> Result<(), TxnRefusal> {
    let deadline = std::time::Instant::now() + Duration::from_millis(IMPLICIT_ADD_WAIT_MS);
    let partitions = [tp];
    loop {
        let now = core.storage.now_ms();
        let r = step(core, p, |t, _| {
            t.add_partitions(
                id,
                producer_id,
                epoch,
                &partitions,
                TransactionVersion::V2,
                now,
            )
        })
        .await;
        match r {
            Err(TxnRefusal::Txn(weir_txn::TxnError::ConcurrentTransactions(_)))
                if std::time::Instant::now() < deadline =>
            {
                glommio::timer::sleep(Duration::from_millis(IMPLICIT_ADD_RETRY_MS)).await;
            }
            r => return r,
        }
    }
}

/// Runs one step of partition `p`'s state machine under its lock: its
/// record durable, its markers started (detached), its answer.
async fn step<T>(
    core: &Rc<Core>,
    p: u32,
    f: impl FnOnce(&mut Transactions, &mut dyn FnMut() -> i64) -> Step<T>,
) -> Result<T, TxnRefusal> {
    let (answer, markers) = run_step(core, p, f).await?;
    if let Some(task) = markers {
        task.detach();
    }
    answer.map_err(TxnRefusal::Txn)
}

/// [`step`], answered once the markers it decided are written (at most
/// [`END_WAITS_FOR_MARKERS_MS`]): a client that committed then reads its
/// output read_committed, or its group's offsets, sees them. A retry of
/// an end already decided (its markers written by an earlier step's task,
/// or by a replay's) is answered once `id`'s transaction completed, as
/// Kafka does.
async fn step_then_markers<T>(
    core: &Rc<Core>,
    p: u32,
    id: &str,
    f: impl FnOnce(&mut Transactions, &mut dyn FnMut() -> i64) -> Step<T>,
) -> Result<T, TxnRefusal> {
    // The partition's lock is free again once `run_step` returns: the
    // markers' completion takes it.
    let (answer, markers) = run_step(core, p, f).await?;
    if markers.is_none() && answer.is_ok() {
        decided_end_completed(core, p, id).await?;
    }
    if let Some(mut task) = markers {
        let wait = Duration::from_millis(END_WAITS_FOR_MARKERS_MS);
        let done = futures_lite::future::or(
            async {
                (&mut task).await;
                true
            },
            async {
                glommio::timer::sleep(wait).await;
                false
            },
        )
        .await;
        if !done {
            task.detach();
        }
    }
    answer.map_err(TxnRefusal::Txn)
}

/// A retried EndTxn of a transaction already decided: `Ok` once it has
/// completed — its markers written, and its decision durable on the ISR
/// (the completion's record, after it in the log, is: every completion
/// of the partition started by then has ended) —
/// CONCURRENT_TRANSACTIONS (retried by the client) if that takes more
/// than [`END_WAITS_FOR_MARKERS_MS`]. The state it answers from may
/// have been replayed after a write of the decision failed (say, while
/// this node's lease lapsed): answering before the completion could tell
/// the client of a decision that a new coordinator never sees.
async fn decided_end_completed(core: &Rc<Core>, p: u32, id: &str) -> Result<(), TxnRefusal> {
    let deadline = std::time::Instant::now() + Duration::from_millis(END_WAITS_FOR_MARKERS_MS);
    // The completions started once the transaction is seen completed
    // (its own among them) must have ended.
    let mut completed_at = None;
    loop {
        if !core.txns.hosting.ready(p) {
            return Err(TxnRefusal::Loading(format!(
                "{TXN_TOPIC}-{p} is being loaded: retry"
            )));
        }
        let preparing = match core.txns.parts.borrow().get(&p) {
            None => {
                return Err(TxnRefusal::NotCoordinator(format!(
                    "{TXN_TOPIC}-{p} is no longer coordinated here: ask FindCoordinator"
                )))
            }
            Some(t) => t.get(id).is_some_and(|m| m.state.preparing()),
        };
        // A completion appended is answered once durable.
        if !preparing {
            let upto = *completed_at.get_or_insert_with(|| core.txns.completions_started(p));
            if core.txns.completions_ended(p) >= upto {
                return Ok(());
            }
        }
        if std::time::Instant::now() >= deadline {
            return Err(TxnRefusal::Txn(weir_txn::TxnError::ConcurrentTransactions(
                format!(
                    "`{id}`'s transaction is still ending (its markers are being written): retry"
                ),
            )));
        }
        glommio::timer::sleep(Duration::from_millis(END_RETRY_POLL_MS)).await;
    }
}

/// One step under partition `p`'s lock: decided, stored, markers started.
async fn run_step<T>(
    core: &Rc<Core>,
    p: u32,
    f: impl FnOnce(&mut Transactions, &mut dyn FnMut() -> i64) -> Step<T>,
) -> Result<Committed<T>, TxnRefusal> {
    run_step_until(core, p, f, Stored::Durable).await
}

/// How far a step's record is stored before the step is answered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stored {
    /// Durable (on the ISR, fdatasync'd).
    Durable,
    /// Appended to the partition's log: a later step's record, after it
    /// in the log, is durable only with it. A failure to make it durable
    /// replays the partition, as a failed write does.
    Appended,
}

/// [`run_step`], its record stored as far as `stored` says.
async fn run_step_until<T>(
    core: &Rc<Core>,
    p: u32,
    f: impl FnOnce(&mut Transactions, &mut dyn FnMut() -> i64) -> Step<T>,
    stored: Stored,
) -> Result<Committed<T>, TxnRefusal> {
    let lock = core.txns.lock(p);
    let _one = lock
        .acquire_permit(1)
        .await
        .map_err(|_| TxnRefusal::Storage("the broker is stopping".into()))?;
    refill_ids(core).await?;
    let step = {
        let mut parts = core.txns.parts.borrow_mut();
        let t = parts
            .entry(p)
            .or_insert_with(|| Transactions::new(txn_config()));
        let mut ids = core.txns.ids.borrow_mut();
        f(t, &mut || ids.pop_front().expect("producer ids at hand"))
    };
    Ok(commit_steps(core, p, vec![step], stored)
        .await?
        .pop()
        .expect("one step"))
}

/// The answer of a step, and the task writing its markers (if any).
type Committed<T> = (Result<T, weir_txn::TxnError>, Option<glommio::Task<()>>);

/// Stores the records of `steps` (one batch) as far as `stored` says,
/// starts their markers, and gives their answers. A failed write forgets
/// `p` and replays it.
async fn commit_steps<T>(
    core: &Rc<Core>,
    p: u32,
    steps: Vec<Step<T>>,
    stored: Stored,
) -> Result<Vec<Committed<T>>, TxnRefusal> {
    let encoded: Vec<(Bytes, Option<Bytes>)> = steps
        .iter()
        .filter_map(|s| s.record.as_ref())
        .map(|r| {
            let (k, v) = records::encode(r);
            (Bytes::from(k), v.map(Bytes::from))
        })
        .collect();
    if !encoded.is_empty() {
        let failed = move |core: &Rc<Core>, e: &BrokerError| {
            tracing::warn!(partition = p, error = %e, "{TXN_TOPIC} write failed: replaying the partition");
            crate::coordinator::reload(core, TXN_TOPIC, p);
        };
        // Numbered before the first wait: the state changed already, and
        // a retried EndTxn that sees it waits for this number.
        let seq = (stored == Stored::Appended).then(|| core.txns.completion_started(p));
        let appended = crate::coordinator::append(core, TXN_TOPIC, p, encoded.into_iter()).await;
        let written = match (appended, seq) {
            (Ok(durable), None) => durable.await,
            (Ok(durable), Some(seq)) => {
                let core = core.clone();
                glommio::spawn_local(async move {
                    let r = durable.await;
                    core.txns.completion_ended(p, seq);
                    if let Err(e) = r {
                        failed(&core, &e);
                    }
                })
                .detach();
                Ok(())
            }
            (Err(e), seq) => {
                if let Some(seq) = seq {
                    core.txns.completion_ended(p, seq);
                }
                Err(e)
            }
        };
        if let Err(e) = written {
            failed(core, &e);
            return Err(TxnRefusal::Storage(format!(
                "storing the transaction's state failed: {e}"
            )));
        }
    }
    let mut answers = Vec::with_capacity(steps.len());
    for s in steps {
        let task = s.markers.map(|m| {
            let core = core.clone();
            let generation = core.txns.generation(p);
            glommio::spawn_local(async move { write_markers(&core, p, generation, m).await })
        });
        answers.push((s.answer, task));
    }
    Ok(answers)
}

/// Tops up the core's producer ids from the cluster's allocator.
async fn refill_ids(core: &Rc<Core>) -> Result<(), TxnRefusal> {
    while core.txns.ids.borrow().len() < IDS_AT_HAND {
        let id = crate::service::admin::init_producer_id(core)
            .await
            .map_err(|e| TxnRefusal::Storage(format!("no producer id: {e}")))?;
        core.txns.ids.borrow_mut().push_back(id);
    }
    Ok(())
}

/// Writes a decided transaction's markers (see the module docs), then
/// completes it. For partition `p`'s `generation` only: once `p` is
/// forgotten (another core leads it, or it is replayed: the replay
/// writes the markers of what it finds prepared) or the transaction has
/// completed, it stops. While this node holds no leader lease it writes
/// nothing and waits: a lapse of the lease (the controller's leader
/// killed, say) forgets nothing, and nothing else would write these
/// markers once the lease is back — the transaction would stay prepared,
/// its producer refused CONCURRENT_TRANSACTIONS, for as long as this core
/// coordinates it.
pub async fn write_markers(core: &Rc<Core>, p: u32, generation: u64, markers: Markers) {
    let coordinator_epoch = core
        .metadata()
        .get(TXN_TOPIC)
        .and_then(|m| m.placement.get(p as usize).map(|pl| pl.leader_epoch as i32))
        .unwrap_or(0);
    let mut left: Vec<Tp> = markers.partitions.clone();
    let mut rounds = 0u64;
    while !left.is_empty() {
        if core.shared.stopping() || !markers_still_ours(core, p, generation, &markers) {
            // The next coordinator (or this core's replay) writes them, or
            // they are written.
            return;
        }
        if let Err(e) = coordinator_of(core, &markers.transactional_id) {
            // No lease now (or a leadership moving, which the metadata that
            // says so ends by forgetting `p`): nothing is written as leader.
            if rounds % 50 == 0 {
                tracing::warn!(transactional_id = %markers.transactional_id, why = %e,
                    "transaction markers wait: this core may not coordinate now");
            }
            rounds += 1;
            glommio::timer::sleep(Duration::from_millis(MARKER_RETRY_MS)).await;
            continue;
        }
        // Every partition's marker at once (each waits for its own durable
        // write): a transaction ends in one write's time, not one per
        // partition.
        let shared = Rc::new(markers.clone());
        let writes: Vec<_> = left
            .into_iter()
            .map(|tp| {
                let (core, m) = (core.clone(), shared.clone());
                glommio::spawn_local(async move {
                    let r = marker_to(&core, &tp, &m, coordinator_epoch).await;
                    (tp, r)
                })
            })
            .collect();
        let mut failed = Vec::new();
        for w in writes {
            match w.await {
                (_, Ok(())) => {}
                // A partition deleted meanwhile needs no marker.
                (_, Err(BrokerError::UnknownPartition { .. })) => {}
                (tp, Err(e)) => {
                    if rounds % 50 == 0 {
                        tracing::warn!(topic = %tp.0, partition = tp.1, error = %e,
                            transactional_id = %markers.transactional_id,
                            "transaction marker not written yet: retrying");
                    }
                    failed.push(tp);
                }
            }
        }
        left = failed;
        if !left.is_empty() {
            rounds += 1;
            glommio::timer::sleep(Duration::from_millis(MARKER_RETRY_MS)).await;
        }
    }
    // The outcome is durable already (the decision, then every marker):
    // the completion's record need only be appended before EndTxn is
    // answered. The next step of this transactional id (its next
    // transaction's first add) is appended after it, so is durable only
    // with it; were it lost, a replay finds the decision prepared and
    // writes the markers again.
    let now = core.storage.now_ms();
    let done = run_step_until(
        core,
        p,
        |t, _| Step {
            record: t.markers_written(&markers, now),
            markers: None,
            answer: Ok(()),
        },
        Stored::Appended,
    )
    .await
    .and_then(|(answer, _)| answer.map_err(TxnRefusal::Txn));
    if let Err(e) = done {
        tracing::warn!(transactional_id = %markers.transactional_id, error = %e,
            "completing the transaction failed (its markers are written; a replay completes it)");
    }
}

/// Whether `markers` are still this core's to write: partition `p` is
/// still at `generation` and its transaction still prepared with them.
fn markers_still_ours(core: &Core, p: u32, generation: u64, markers: &Markers) -> bool {
    core.txns.generation(p) == generation
        && core
            .txns
            .parts
            .borrow()
            .get(&p)
            .is_some_and(|t| t.is_pending(markers))
}

/// One marker, on the core of this node leading `tp`.
async fn marker_to(
    core: &Rc<Core>,
    tp: &Tp,
    m: &Markers,
    coordinator_epoch: i32,
) -> Result<(), BrokerError> {
    let (topic, partition) = (tp.0.clone(), tp.1);
    let (producer_id, epoch, commit) = (m.producer_id, m.producer_epoch, m.commit);
    let c = match core.locate(&topic, partition) {
        Ok(c) => c,
        Err(BrokerError::NotLeader { leader, .. })
            if leader != 0 && leader != core.shared.config.cluster.node_id =>
        {
            return marker_on_node(core, leader, tp, m, coordinator_epoch).await;
        }
        Err(e) => return Err(e),
    };
    if c == core.id {
        return marker_here(
            core,
            (&topic, partition),
            (producer_id, epoch),
            commit,
            coordinator_epoch,
        )
        .await;
    }
    core.call(c, Duration::ZERO, |reply| CoreMsg::Marker {
        topic,
        partition,
        producer_id,
        epoch,
        commit,
        coordinator_epoch,
        reply,
    })
    .await?
}

/// One marker on a partition node `node` leads, through its leading core.
async fn marker_on_node(
    core: &Rc<Core>,
    node: u64,
    tp: &Tp,
    m: &Markers,
    coordinator_epoch: i32,
) -> Result<(), BrokerError> {
    let unavailable = |why: String| {
        BrokerError::Transaction(TxnRefusal::Storage(format!(
            "the marker of {}-{} on node {node}: {why}",
            tp.0, tp.1
        )))
    };
    let link = crate::replica::link_to(core, node, tp)
        .await
        .map_err(unavailable)?;
    let req = weir_replication::data::MarkerWrite {
        producer_id: m.producer_id,
        producer_epoch: m.producer_epoch,
        commit: m.commit,
        coordinator_epoch,
        partitions: vec![tp.clone()],
    };
    let results = link
        .markers(&req)
        .await
        .map_err(|e| unavailable(e.chain().to_string()))?;
    match results.first() {
        Some(r) if r.error == 0 => Ok(()),
        Some(r) => Err(unavailable(format!(
            "refused: {}",
            r.message.clone().unwrap_or_default()
        ))),
        None => Err(unavailable("no answer".into())),
    }
}

/// KIP-890's verification asked of the coordinator on another node (the
/// leader of `id`'s `__transaction_state` partition).
async fn verify_on_node(
    core: &Rc<Core>,
    node: u64,
    id: &str,
    producer: (i64, i16),
    tp: Tp,
    add: bool,
) -> Result<(), TxnRefusal> {
    let p = txn_partition(core, id)?;
    let at = (TXN_TOPIC.to_string(), p);
    let unreachable = |why: String| {
        TxnRefusal::NotCoordinator(format!("`{id}`'s coordinator on node {node}: {why}"))
    };
    let link = crate::replica::link_to(core, node, &at)
        .await
        .map_err(unreachable)?;
    let r = link
        .verify_txn(id, producer, tp, add)
        .await
        .map_err(|e| unreachable(e.chain().to_string()))?;
    if r.error == 0 {
        return Ok(());
    }
    let message = r.message.unwrap_or_default();
    use weir_proto::error_code::ErrorCode as C;
    use weir_txn::TxnError as T;
    Err(match C::from_u16(r.error) {
        C::InvalidProducerEpoch => TxnRefusal::Txn(T::ProducerFenced(message)),
        C::ConcurrentTransactions => TxnRefusal::Txn(T::ConcurrentTransactions(message)),
        C::UnknownProducerId => TxnRefusal::Txn(T::InvalidProducerIdMapping(message)),
        C::NotCoordinator => TxnRefusal::NotCoordinator(message),
        C::Recovering => TxnRefusal::Loading(message),
        C::StorageError => TxnRefusal::Storage(message),
        _ => TxnRefusal::Txn(T::InvalidTxnState(message)),
    })
}

/// Answers another node's verification (this core coordinates `id`).
pub async fn verify_here(
    core: &Rc<Core>,
    id: String,
    (producer_id, epoch): (i64, i16),
    tp: Tp,
    add: bool,
) -> weir_replication::data::MarkerResult {
    let req = TxnRequest::Verify {
        id,
        producer_id,
        epoch,
        tp,
        add,
    };
    match handle(core, req).await {
        Ok(_) => Default::default(),
        Err(e) => weir_replication::data::MarkerResult {
            error: BrokerError::Transaction(e.clone()).code().as_u16(),
            message: Some(e.to_string()),
        },
    }
}

/// A marker on a partition this core leads; in `__consumer_offsets`, the
/// offsets the transaction committed there are then committed (or
/// dropped) in their groups.
pub async fn marker_here(
    core: &Rc<Core>,
    (topic, partition): (&str, u32),
    producer: (i64, i16),
    commit: bool,
    coordinator_epoch: i32,
) -> Result<(), BrokerError> {
    partition::marker_local(core, topic, partition, producer, commit, coordinator_epoch).await?;
    if topic == crate::metadata::OFFSETS_TOPIC {
        crate::groups::coordinator::end_txn(core, partition, producer.0, commit);
    }
    Ok(())
}

/// Every [`EXPIRY_CHECK_MS`]: aborts the transactions of this core's
/// partitions that timed out, forgets the ids idle too long.
pub async fn expiry_loop(core: Rc<Core>) {
    while !core.shared.stopping() {
        glommio::timer::sleep(Duration::from_millis(EXPIRY_CHECK_MS)).await;
        let parts: Vec<u32> = core.txns.parts.borrow().keys().copied().collect();
        for p in parts {
            if !core.txns.hosting.ready(p) {
                continue;
            }
            let lock = core.txns.lock(p);
            let Ok(_one) = lock.acquire_permit(1).await else {
                return;
            };
            if refill_ids(&core).await.is_err() {
                continue;
            }
            let now = core.storage.now_ms();
            let steps = {
                let mut parts = core.txns.parts.borrow_mut();
                let Some(t) = parts.get_mut(&p) else {
                    continue;
                };
                let mut ids = core.txns.ids.borrow_mut();
                t.expire(now, &mut || ids.pop_front().expect("producer ids at hand"))
            };
            if steps.is_empty() {
                continue;
            }
            for s in &steps {
                if let Some(m) = &s.markers {
                    tracing::info!(transactional_id = %m.transactional_id,
                        "transaction timed out: aborted, its producer fenced");
                }
            }
            if let Ok(done) = commit_steps(&core, p, steps, Stored::Durable).await {
                for (_, task) in done {
                    if let Some(t) = task {
                        t.detach();
                    }
                }
            }
        }
    }
}
