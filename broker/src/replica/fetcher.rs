//! The follower's side: one fetcher per leader core this core follows
//! partitions of. It fetches them together, appends what comes byte for
//! byte, truncates a divergent tail when the leader says so, and reports
//! in each fetch what it has fdatasync'd. A fetch long-polls at the leader
//! only when everything fetched so far is durable here; otherwise it asks
//! without waiting (while the leader had more than it sent), or waits for
//! its own fdatasync first (it has all the leader had), so the leader
//! learns of each durable batch at once (that is what moves the high
//! watermark and answers `acks=all`).

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use weir_proto::batch::BatchHeader;
use weir_proto::error_code::ErrorCode;
use weir_replication::data::{DataLink, FetchPart, ReplicaFetch, FETCH_PARTITIONS_MAX};
use weir_storage::{PartitionLog, StorageError};

use super::state::{Replica, Role};
use crate::shard::Core;

/// Longest a follower's fetch waits at the leader for new batches.
const FETCH_WAIT_MS: u32 = 500;
/// Most bytes of batches one fetch asks for while the follower is behind
/// the leader's log end (catching up: large answers, few round trips).
const FETCH_MAX_BYTES: u32 = 8 << 20;
/// Most bytes one fetch asks for once the follower is near the leader's
/// log end (less than [`CATCH_UP_GAP_BYTES`] behind). The leader learns
/// what is durable here from the *next* fetch, so an acks=all produce
/// waits for about two answers to cross the link after its batch: small
/// answers keep that short (one partition, RF 3, acks=all at the
/// producer's max rate on loopback: +25–32 % throughput against 8 MiB,
/// docs/benchmarks.md).
const FETCH_IN_SYNC_MAX_BYTES: u32 = 1 << 20;
/// A follower further behind than this (estimated from the last answer's
/// bytes per offset) fetches [`FETCH_MAX_BYTES`] at a time: more than a
/// producer keeps in flight, so a follower keeping up with acks=all
/// produces stays below it.
const CATCH_UP_GAP_BYTES: u64 = 16 << 20;
/// Wait before trying again after a failed connection or an error answer.
const RETRY_BACKOFF: Duration = Duration::from_millis(100);

/// Starts the fetcher for the leader core `target` unless it runs.
pub fn ensure(core: &Rc<Core>, target: (u64, u32)) {
    if core
        .replication
        .fetchers
        .borrow_mut()
        .insert(target, ())
        .is_some()
    {
        return;
    }
    glommio::spawn_local(run(core.clone(), target)).detach();
}

/// Where node `node`'s core `core` listens for replication, if known.
pub(crate) async fn leader_addr(core: &Core, node: u64, c: u32) -> Option<SocketAddr> {
    let state = core.shared.controller.state();
    let info = &state.nodes.get(&node)?.info;
    let port = *info.replication_core_ports.get(c as usize)?;
    let (host, _) = info.replication.rsplit_once(':')?;
    let host = host.trim_matches(['[', ']']).to_string();
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Some(SocketAddr::new(ip, port));
    }
    // A host name: resolved off the core.
    glommio::executor()
        .spawn_blocking(move || {
            use std::net::ToSocketAddrs;
            (host.as_str(), port).to_socket_addrs().ok()?.next()
        })
        .await
}

async fn run(core: Rc<Core>, target: (u64, u32)) {
    let (leader, leader_core) = target;
    let me = core.shared.config.cluster.node_id;
    let mut link: Option<DataLink> = None;
    // Where the next fetch starts when there are more partitions than one
    // fetch may name (they take turns).
    let mut turn = 0usize;
    // The last answer left a partition below the leader's log end.
    let mut behind = true;
    loop {
        let mut parts = core.replication.following(target);
        if parts.is_empty() || core.shared.stopping() {
            core.replication.fetchers.borrow_mut().remove(&target);
            return;
        }
        if parts.len() > FETCH_PARTITIONS_MAX {
            turn %= parts.len();
            parts.rotate_left(turn);
            parts.truncate(FETCH_PARTITIONS_MAX);
            turn += FETCH_PARTITIONS_MAX;
        }
        let l = match &link {
            Some(l) if !l.is_closed() => l.clone(),
            _ => {
                let endpoint = core.replication.endpoint.borrow().clone();
                let addr = leader_addr(&core, leader, leader_core).await;
                let (Some(endpoint), Some(addr)) = (endpoint, addr) else {
                    glommio::timer::sleep(RETRY_BACKOFF).await;
                    continue;
                };
                let cluster_id = core.shared.controller.state().cluster_id.clone();
                match DataLink::connect(&endpoint, leader, addr, &cluster_id, me).await {
                    Ok(l) => {
                        link = Some(l.clone());
                        l
                    }
                    Err(e) => {
                        tracing::debug!(leader, core = leader_core, error = %e.chain(), "cannot reach the leader");
                        glommio::timer::sleep(RETRY_BACKOFF).await;
                        continue;
                    }
                }
            }
        };
        let all_durable = parts
            .iter()
            .all(|r| r.log.durable_offset() >= r.log.log_end_offset());
        let req = ReplicaFetch {
            replica: me,
            max_wait_ms: if all_durable { FETCH_WAIT_MS } else { 0 },
            max_bytes: if behind {
                FETCH_MAX_BYTES
            } else {
                FETCH_IN_SYNC_MAX_BYTES
            },
            partitions: parts
                .iter()
                .map(|r| FetchPart {
                    topic: r.topic.clone(),
                    partition: r.partition,
                    leader_epoch: r.state.borrow().epoch,
                    fetch_offset: r.log.log_end_offset(),
                    last_fetched_epoch: r.log.latest_epoch().map(|(e, _)| e),
                    durable_offset: r.log.durable_offset(),
                })
                .collect(),
        };
        // A leader that died without closing the connection: give up after
        // the long poll plus QUIC's own patience.
        let limit = Duration::from_millis(u64::from(req.max_wait_ms)) + Duration::from_secs(5);
        let answer = futures_lite::future::or(async { Some(l.fetch(&req).await) }, async {
            glommio::timer::sleep(limit).await;
            None
        })
        .await;
        let answers = match answer {
            Some(Ok(a)) => a,
            Some(Err(e)) => {
                tracing::debug!(leader, core = leader_core, error = %e.chain(), "fetch failed");
                link = None;
                glommio::timer::sleep(RETRY_BACKOFF).await;
                continue;
            }
            None => {
                link = None;
                continue;
            }
        };
        let mut got = 0u64;
        let mut errors = 0usize;
        behind = false;
        // Some partition was still short of the leader's log end when the
        // leader answered.
        let mut short = false;
        let follows = |r: &Replica| {
            r.role()
                == Role::Follower {
                    node: leader,
                    core: leader_core,
                }
        };
        for (r, (part, bytes)) in parts.iter().zip(answers) {
            if !follows(r) {
                continue;
            }
            if part.error == ErrorCode::OffsetOutOfRange.as_u16()
                && part.log_start_offset > r.log.log_end_offset()
            {
                restart_at(&core, r, part.log_start_offset).await;
                continue;
            }
            if part.error != 0 {
                errors += 1;
                tracing::debug!(partition = %format!("{}-{}", r.topic, r.partition),
                    code = %ErrorCode::from_u16(part.error), message = ?part.message, "fetch refused");
                continue;
            }
            if let Some((epoch, end)) = part.diverging {
                if follows(r) {
                    truncate_divergent(r, epoch, end).await;
                }
                continue;
            }
            got += bytes.len() as u64;
            let (len, end_before) = (bytes.len() as u64, r.log.log_end_offset());
            if let Err(e) = append_all(r, bytes, &follows).await {
                errors += 1;
                tracing::warn!(partition = %format!("{}-{}", r.topic, r.partition), error = %e, "replicated batch not appended");
            }
            // Only while it still follows this leader (a new role may have
            // come with the appends' waits).
            if follows(r) {
                let mut st = r.state.borrow_mut();
                st.isr
                    .follow_hw(part.high_watermark, r.log.log_end_offset());
                let end = r.log.log_end_offset();
                let gap = part.log_end_offset.saturating_sub(end);
                let per_offset = len / end.saturating_sub(end_before).max(1);
                behind |= gap > 0 && (per_offset == 0 || gap * per_offset > CATCH_UP_GAP_BYTES);
                short |= gap > 0;
            }
        }
        core.metrics.replication_in(got);
        if got == 0 && errors > 0 {
            // Refused partitions (an epoch not applied yet, a log start
            // past ours): do not spin on them.
            glommio::timer::sleep(RETRY_BACKOFF).await;
        } else if (got == 0 && !all_durable) || (got > 0 && !short) {
            // Nothing new, or everything the leader had: let the leader know
            // as soon as what is here is durable — the next fetch says so
            // (and long-polls for more). Asking again at once would mostly
            // come back empty, one more round trip per batch on both nodes.
            for r in &parts {
                let _ = r.log.wait_durable(r.log.log_end_offset()).await;
            }
        }
    }
}

/// Appends the batches of one partition's answer (whole batches, as the
/// leader sent them) while `follows` holds (checked before each: an
/// append waits, and the replica may lead by then). A batch this log
/// already holds is skipped.
async fn append_all(
    r: &Replica,
    mut bytes: BytesMut,
    follows: &dyn Fn(&Replica) -> bool,
) -> Result<(), StorageError> {
    while !bytes.is_empty() {
        let h = BatchHeader::parse_framed(&bytes).map_err(|source| StorageError::InvalidBatch {
            partition: format!("{}-{}", r.topic, r.partition),
            source,
        })?;
        // Split off, not copied: the batch keeps a share of the answer's
        // buffer.
        let batch = bytes.split_to(h.total_len());
        if (h.last_offset() as u64) < r.log.log_end_offset() {
            continue;
        }
        if !follows(r) {
            return Ok(());
        }
        r.log.append_replica(batch).await?;
    }
    Ok(())
}

/// This follower's log ends below the leader's log start (retention
/// deleted what it would fetch next; a new replica of an old
/// partition): its log is replaced by an empty one starting there. Nothing
/// is lost: a replica that far behind is not in the ISR.
async fn restart_at(core: &Rc<Core>, r: &Rc<Replica>, start: u64) {
    let name = format!("{}-{}", r.topic, r.partition);
    // The log this core holds now, one restart at a time, never a leader's.
    let held = |core: &Core| {
        core.log(&r.topic, r.partition)
            .is_some_and(|l| l.same(&r.log))
    };
    {
        let mut st = r.state.borrow_mut();
        if !held(core) || st.restarting || st.role == Role::Leader {
            return;
        }
        st.restarting = true;
    }
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        tracing::error!(partition = %name, error = %e, "{what}");
        r.state.borrow_mut().restarting = false;
    };
    let (dir, config) = (r.log.dir().to_path_buf(), r.log.config());
    let below = r.log.log_end_offset();
    if let Err(e) = r.log.delete().await {
        return failed(
            "could not delete the log to start at the leader's log start",
            &e,
        );
    }
    let log = match PartitionLog::create_at(&core.storage, &dir, config, start).await {
        Ok(log) => log,
        Err(e) => return failed("could not start the log at the leader's log start", &e),
    };
    // A move or a deletion applied meanwhile: the new log is not wanted.
    let placed = core
        .metadata()
        .get(&r.topic)
        .and_then(|t| t.core_of(r.partition))
        == Some(core.id);
    if !held(core) || !placed {
        let _ = log.delete().await;
        return;
    }
    tracing::warn!(partition = %name, log_end = below, start, "this replica ended below the leader's log start: it starts again there");
    core.logs
        .borrow_mut()
        .insert((r.topic.clone(), r.partition), log);
    core.replication.remove(&r.topic, r.partition);
    // A new replica over the new log, as after a metadata change (the
    // hook reconciles this core's replicas with its view; nothing was
    // deleted).
    (core.shared.after_metadata)(core, &[]);
}

/// The leader says this log diverges: its epoch at or below the
/// follower's last one is `epoch`, ending at `end`. Cuts the log where
/// both agree: the smaller of `end` and where this log's own epochs up to
/// `epoch` end.
async fn truncate_divergent(r: &Replica, epoch: u32, end: u64) {
    let mine = match r.log.end_offset_for_epoch(epoch) {
        Some((_, e)) => e,
        // Every epoch here is newer: keep what precedes the first.
        None => r.log.leader_epochs().first().map_or(0, |&(_, s)| s),
    };
    let cut = end.min(mine).max(r.log.log_start_offset());
    let name = format!("{}-{}", r.topic, r.partition);
    match r.log.truncate_to(cut).await {
        Ok(new_end) => {
            tracing::warn!(partition = %name, epoch, leader_end = end, new_end, "truncated a divergent tail (written under an earlier leader, never acknowledged)")
        }
        Err(e) => {
            tracing::error!(partition = %name, error = %e, "truncating a divergent tail failed")
        }
    }
}
