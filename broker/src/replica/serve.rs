//! The leader's side: each core's QUIC endpoint accepts follower
//! connections and answers their fetches for the partitions this core
//! leads.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use weir_proto::error_code::ErrorCode;
use weir_replication::data::{
    accept_hello, write_frame_with_payload, DataRequest, DataResponse, FetchPart, FetchedPart,
    ReplicaFetch,
};
use weir_replication::wire::{decode, encode, read_frame};

use super::{propose_isr, Role};
use crate::error::BrokerError;
use crate::shard::Core;

/// Longest a follower's fetch may wait at the leader.
const FETCH_WAIT_MAX: Duration = Duration::from_secs(5);

/// Binds this core's replication endpoint; returns its port.
pub fn start(core: &Rc<Core>, addr: SocketAddr) -> anyhow::Result<u16> {
    let endpoint = weir_replication::data::core_endpoint(
        &core.shared.node_tls,
        addr,
        weir_replication::data::UdpSettings {
            buffer_bytes: core.shared.config.cluster.replication_udp_buffer_bytes,
            max_payload: core.shared.config.cluster.replication_max_udp_payload,
        },
    )?;
    let port = endpoint.local_addr()?.port();
    *core.replication.endpoint.borrow_mut() = Some(endpoint.clone());
    glommio::spawn_local(accept_loop(core.clone(), endpoint)).detach();
    Ok(port)
}

async fn accept_loop(core: Rc<Core>, endpoint: weir_replication::quinn::Endpoint) {
    while let Some(incoming) = endpoint.accept().await {
        let core = core.clone();
        glommio::spawn_local(async move {
            let remote = incoming.remote_address();
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(%remote, error = %e, "refused a replication connection (TLS handshake failed: certificate not from this cluster's CA?)");
                    return;
                }
            };
            let cluster_id = core.shared.controller.state().cluster_id.clone();
            let peer = match accept_hello(&conn, &cluster_id).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(%remote, error = %e.chain(), "refused a replication connection");
                    return;
                }
            };
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                let core = core.clone();
                glommio::spawn_local(async move {
                    let (answer, payload) = match read_frame(&mut recv).await {
                        Ok(body) => match decode::<DataRequest>(&body) {
                            Ok(DataRequest::Fetch(f))
                                if f.partitions.len()
                                    > weir_replication::data::FETCH_PARTITIONS_MAX =>
                            {
                                (
                                    DataResponse::Refused(format!(
                                        "{} partitions in one fetch; at most {}",
                                        f.partitions.len(),
                                        weir_replication::data::FETCH_PARTITIONS_MAX
                                    )),
                                    Vec::new(),
                                )
                            }
                            Ok(DataRequest::Fetch(f)) if f.replica == peer => {
                                let (parts, payload) = fetch(&core, f).await;
                                (DataResponse::Fetched(parts), payload)
                            }
                            Ok(DataRequest::Fetch(f)) => (
                                DataResponse::Refused(format!(
                                    "node {peer} fetches as node {}",
                                    f.replica
                                )),
                                Vec::new(),
                            ),
                            Ok(DataRequest::Hello { .. }) => {
                                (DataResponse::Refused("hello twice".into()), Vec::new())
                            }
                            Ok(DataRequest::Markers(m))
                                if m.partitions.len()
                                    > weir_replication::data::FETCH_PARTITIONS_MAX =>
                            {
                                (
                                    DataResponse::Refused(format!(
                                        "{} markers in one request",
                                        m.partitions.len()
                                    )),
                                    Vec::new(),
                                )
                            }
                            Ok(DataRequest::Markers(m)) => {
                                (DataResponse::Marked(markers(&core, m).await), Vec::new())
                            }
                            Ok(DataRequest::VerifyTxn {
                                id,
                                producer_id,
                                producer_epoch,
                                tp,
                                add,
                            }) => {
                                let r = crate::txns::coordinator::verify_here(
                                    &core,
                                    id,
                                    (producer_id, producer_epoch),
                                    tp,
                                    add,
                                )
                                .await;
                                (DataResponse::Verified(r), Vec::new())
                            }
                            Ok(DataRequest::ShareReset { key, start }) => {
                                let (r, had) =
                                    crate::share::service::serve_reset(&core, key, start).await;
                                (DataResponse::ShareReset(r, had), Vec::new())
                            }
                            Ok(DataRequest::ShareState { key, value, write }) => {
                                let (r, v) =
                                    crate::share::state::serve_remote(&core, key, value, write)
                                        .await;
                                (DataResponse::ShareState(r, v), Vec::new())
                            }
                            Ok(DataRequest::Produce {
                                topic,
                                partition,
                                timeout_ms,
                                payload_len,
                            }) => {
                                let r = produce(
                                    &core,
                                    &mut recv,
                                    (topic, partition),
                                    timeout_ms,
                                    payload_len,
                                )
                                .await;
                                (DataResponse::Produced(r), Vec::new())
                            }
                            Err(e) => (DataResponse::Refused(e), Vec::new()),
                        },
                        Err(_) => return,
                    };
                    let sent = payload.iter().map(|b| b.len() as u64).sum::<u64>();
                    if write_frame_with_payload(&mut send, &encode(&answer), &payload)
                        .await
                        .is_ok()
                    {
                        core.metrics.replication_out(sent);
                    }
                })
                .detach();
            }
        })
        .detach();
    }
}

/// Writes another node's transaction coordinator's markers to partitions
/// this core leads (each durable as an acks=all write).
async fn markers(
    core: &Rc<Core>,
    m: weir_replication::data::MarkerWrite,
) -> Vec<weir_replication::data::MarkerResult> {
    let mut out = Vec::with_capacity(m.partitions.len());
    for (topic, partition) in &m.partitions {
        let r = crate::txns::coordinator::marker_here(
            core,
            (topic, *partition),
            (m.producer_id, m.producer_epoch),
            m.commit,
            m.coordinator_epoch,
        )
        .await;
        out.push(match r {
            Ok(()) => Default::default(),
            Err(e) => {
                let (error, message) = e.wire();
                weir_replication::data::MarkerResult {
                    error,
                    message: Some(message),
                }
            }
        });
    }
    out
}

/// Appends the record batch another node handed on (an OTLP export it
/// took for a partition this node leads) as an acks=all produce: the
/// outcome once acknowledged, or why not.
async fn produce(
    core: &Rc<Core>,
    recv: &mut weir_replication::quinn::RecvStream,
    (topic, partition): (String, u32),
    timeout_ms: u32,
    payload_len: u32,
) -> weir_replication::data::MarkerResult {
    use crate::service::produce::{produce, ProducePart};
    let failed = |e: BrokerError| {
        let (error, message) = e.wire();
        weir_replication::data::MarkerResult {
            error,
            message: Some(message),
        }
    };
    let len = payload_len as usize;
    if len > weir_replication::data::PRODUCE_BYTES_MAX {
        return failed(BrokerError::InvalidRequest(format!(
            "a handed-on batch of {len} bytes; at most {}",
            weir_replication::data::PRODUCE_BYTES_MAX
        )));
    }
    // Its bytes wait for room in the core's in-flight budget, as a client
    // request's do: handed-on batches cannot pile up without bound.
    let Ok(_held) = core.inflight.acquire_permit(len as u64).await else {
        return failed(BrokerError::TimedOut("the leading core is stopping".into()));
    };
    let mut batch = vec![0u8; len];
    if let Err(e) = recv.read_exact(&mut batch).await {
        return failed(BrokerError::InvalidRequest(format!(
            "reading a handed-on batch: {e}"
        )));
    }
    let part = ProducePart {
        topic,
        partition,
        data: Ok(Bytes::from(batch)),
        transaction: None,
        adds_to_txn: false,
    };
    let timeout = Duration::from_millis(u64::from(timeout_ms));
    let ctx = crate::service::Ctx { owner_only: false };
    let acked = match produce(core, vec![part], -1, Some(timeout), ctx).await {
        Ok(acked) => acked,
        Err(e) => return failed(e),
    };
    match acked.await.into_iter().next() {
        Some((_, _, Ok(_))) => Default::default(),
        Some((_, _, Err(e))) => failed(e),
        None => failed(BrokerError::InvalidRequest("no outcome".into())),
    }
}

/// Answers a follower's fetch: per partition, a divergence, an error, or
/// the batches from its fetch offset (all partitions together at most
/// `max_bytes`, at least one batch); waits up to `max_wait_ms` for a new
/// batch when there is none.
pub async fn fetch(core: &Rc<Core>, req: ReplicaFetch) -> (Vec<FetchedPart>, Vec<Bytes>) {
    let (mut parts, mut payload) = fetch_once(core, &req).await;
    // Partitions answered with an error do not cut the wait short (the
    // follower backs off on them).
    let idle = parts
        .iter()
        .all(|p| p.error != 0 || (p.diverging.is_none() && p.payload_len == 0));
    if idle && req.max_wait_ms > 0 {
        let wait = Duration::from_millis(u64::from(req.max_wait_ms)).min(FETCH_WAIT_MAX);
        wait_any_new(core, &req.partitions, wait).await;
        (parts, payload) = fetch_once(core, &req).await;
    }
    (parts, payload)
}

/// Whether followers are served batches appended and not yet written
/// (`PartitionLog::read_appended`): their write then runs beside this
/// log's own instead of after it (an acks=all produce's median, RF 3 at
/// 20 MB/s on one machine: −0.5 ms, docs/benchmarks.md). Only where a
/// failed write stops the broker (a node of a configured cluster):
/// otherwise the log would roll back and go on in the same leader epoch,
/// and a follower holding what it rolled back could not tell.
fn serves_appended(core: &Core) -> bool {
    crate::shard::in_cluster(&core.shared.config)
}

/// Waits until a batch past any partition's fetch offset is there to
/// serve (appended, or written: [`serves_appended`]), or `wait` passes.
async fn wait_any_new(core: &Rc<Core>, parts: &[FetchPart], wait: Duration) {
    let appended = serves_appended(core);
    let (tx, rx) = futures_channel::oneshot::channel::<()>();
    let tx = Rc::new(RefCell::new(Some(tx)));
    let tasks: Vec<glommio::Task<()>> = parts
        .iter()
        .filter_map(|p| {
            let log = core.log(&p.topic, p.partition)?;
            let (tx, at) = (tx.clone(), p.fetch_offset);
            Some(glommio::spawn_local(async move {
                let new = if appended {
                    log.wait_appended(at + 1).await
                } else {
                    log.wait_written(at + 1).await
                };
                if new.is_ok() {
                    if let Some(tx) = tx.borrow_mut().take() {
                        let _ = tx.send(());
                    }
                }
            }))
        })
        .collect();
    futures_lite::future::or(
        async {
            let _ = rx.await;
        },
        glommio::timer::sleep(wait),
    )
    .await;
    // Dropping the tasks cancels the waits still pending.
    drop(tasks);
}

async fn fetch_once(core: &Rc<Core>, req: &ReplicaFetch) -> (Vec<FetchedPart>, Vec<Bytes>) {
    let mut budget = u64::from(req.max_bytes.max(1));
    let mut parts = Vec::with_capacity(req.partitions.len());
    let mut payload = Vec::new();
    for fp in &req.partitions {
        let (part, batches) = fetch_part(core, req.replica, fp, &mut budget).await;
        parts.push(part);
        payload.extend(batches);
    }
    (parts, payload)
}

fn refused(code: ErrorCode, message: String) -> (FetchedPart, Vec<Bytes>) {
    (
        FetchedPart {
            error: code.as_u16(),
            message: Some(message),
            ..FetchedPart::default()
        },
        Vec::new(),
    )
}

async fn fetch_part(
    core: &Rc<Core>,
    replica: u64,
    fp: &FetchPart,
    budget: &mut u64,
) -> (FetchedPart, Vec<Bytes>) {
    let name = format!("{}-{}", fp.topic, fp.partition);
    let Some(r) = core.replication.get(&fp.topic, fp.partition) else {
        return refused(
            ErrorCode::NotLeader,
            format!("{name} has no replica on this core"),
        );
    };
    let log = &r.log;
    let (epoch, leo) = {
        let st = r.state.borrow();
        if st.role != Role::Leader || st.epoch != fp.leader_epoch {
            return refused(
                ErrorCode::NotLeader,
                format!(
                    "{name}: this node {} at epoch {}, the follower asked at epoch {}",
                    if st.role == Role::Leader {
                        "leads"
                    } else {
                        "does not lead"
                    },
                    st.epoch,
                    fp.leader_epoch
                ),
            );
        }
        if !st.replicas.iter().any(|(n, _)| *n == replica) {
            return refused(
                ErrorCode::InvalidRequest,
                format!("node {replica} holds no replica of {name}"),
            );
        }
        (st.epoch, log.log_end_offset())
    };
    let answer = |diverging: Option<(u32, u64)>, payload_len: u32| FetchedPart {
        error: 0,
        message: None,
        leader_epoch: epoch,
        high_watermark: r.high_watermark(),
        log_start_offset: log.log_start_offset(),
        log_end_offset: log.log_end_offset(),
        diverging,
        payload_len,
    };
    // Does the follower's log still match this one? Its last epoch must
    // end here no earlier than its log end.
    let diverging = match fp.last_fetched_epoch {
        Some(e) => match log.end_offset_for_epoch(e) {
            Some((found, end)) if found == e && end >= fp.fetch_offset => None,
            Some((found, end)) => Some((found, end)),
            None => match log.leader_epochs().first() {
                // The follower's epochs all predate this log's: keep what
                // precedes this log's first epoch.
                Some(&(first, start)) => Some((first, start)),
                None => (fp.fetch_offset > leo).then_some((epoch, leo)),
            },
        },
        None => (fp.fetch_offset > leo).then_some((epoch, leo)),
    };
    if diverging.is_some() {
        return (answer(diverging, 0), Vec::new());
    }
    // Progress, the high watermark, and a return to the ISR.
    let now = Instant::now();
    let join = {
        let epoch_start = log.latest_epoch().map_or(0, |(_, s)| s);
        let mut st = r.state.borrow_mut();
        st.isr.fetched(
            replica,
            fp.fetch_offset,
            fp.durable_offset,
            leo,
            epoch_start,
            now,
        )
    };
    r.recompute_hw();
    if let Some(proposal) = join {
        tracing::info!(partition = %name, node = replica, "a follower caught up: back into the ISR");
        propose_isr(core, &r, epoch, proposal);
    }
    // Below the log start: the follower starts again at the base of the
    // batch holding it (DeleteRecords may cut inside a batch; a follower
    // takes whole batches) and is served from that batch on.
    let log_start = log.log_start_offset();
    let mut from = fp.fetch_offset;
    if from < log_start {
        let base = match log.read(log_start, 1).await {
            Ok(r) => r
                .batches
                .first()
                .and_then(|b| weir_proto::batch::BatchHeader::peek(b).ok())
                .map_or(log_start, |h| (h.base_offset as u64).min(log_start)),
            Err(_) => log_start,
        };
        if from < base {
            let (mut part, _) = refused(
                ErrorCode::OffsetOutOfRange,
                format!("{name}: offset {from} is below the leader's log start {log_start}"),
            );
            part.log_start_offset = base;
            part.leader_epoch = epoch;
            return (part, Vec::new());
        }
        from = log_start;
    }
    if from >= leo || *budget == 0 {
        return (answer(None, 0), Vec::new());
    }
    let read = if serves_appended(core) {
        log.read_appended(from, *budget).await
    } else {
        log.read(from, *budget).await
    };
    match read {
        Ok(read) => {
            // The batches as the cache or the disk hold them (no copy).
            let len: u64 = read.batches.iter().map(|b| b.len() as u64).sum();
            *budget = budget.saturating_sub(len);
            (answer(None, len as u32), read.batches)
        }
        Err(e) => refused(ErrorCode::StorageError, format!("{name}: {e}")),
    }
}
