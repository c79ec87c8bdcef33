//! Reads from the remote tier: a fetch or an offsets-for-time below a
//! tiered partition's local log start, served from its remote segments.
//!
//! A remote `.log` object is read in aligned chunks
//! ([`CHUNK_BYTES`](super::state::CHUNK_BYTES)) kept in the core's chunk
//! cache; the chunk holding a fetch's offset is found through the
//! segment's remote offset index (read once, kept); the batches answered
//! are slices of the cached chunks (a batch across two chunks is copied
//! once), byte for byte what was produced. After each read the next
//! chunks of the segment are read ahead in the background, so a
//! sequential replay rarely waits for the store. Remote reads run at most
//! [`READS_IN_FLIGHT`](super::state::READS_IN_FLIGHT) at a time per core;
//! the store calls run on its own runtime, so the core keeps serving other
//! partitions meanwhile. A read that fails or takes longer than
//! `--remote-read-timeout-ms` is answered `RemoteUnavailable`
//! (retriable).

use std::rc::Rc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_channel::oneshot;
use weir_proto::batch::{BatchHeader, HEADER_BYTES};
use weir_replication::meta::RemoteSegment;
use weir_tier::layout::{object_key, ObjectKind};
use weir_tier::{RemoteStore, TierError};

use super::state::{bump, RemoteIndexes, CHUNK_BYTES, READ_AHEAD_CHUNKS};
use crate::error::{BrokerError, StorageFailure};
use crate::shard::answers::{FetchOk, OffsetsOk};
use crate::shard::Core;

/// One remote segment being read: where its objects are.
struct Source<'a> {
    store: &'a RemoteStore,
    topic: &'a str,
    topic_id: [u8; 16],
    partition: u32,
    seg: &'a RemoteSegment,
}

impl Source<'_> {
    fn key(&self, kind: ObjectKind) -> String {
        object_key(
            self.topic,
            &self.topic_id,
            self.partition,
            self.seg.base,
            &self.seg.id,
            kind,
        )
    }
}

/// Reads a partition this core owns: from the remote tier when `offset`
/// is below its local log start and a remote segment holds it, else from
/// the local log. The log start answered is the partition's (remote
/// included).
pub async fn fetch_owned(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    offset: u64,
    max_bytes: u64,
    wait_ms: u32,
) -> Result<FetchOk, BrokerError> {
    // Only a tiered partition pays for a look at the remote metadata.
    let tiered =
        core.shared.remote.is_some() && core.owned_log(topic, partition)?.config().remote_storage;
    if tiered {
        let log = core.owned_log(topic, partition)?;
        if offset < log.log_start_offset() && max_bytes > 0 {
            if let Some(r) = fetch(core, topic, partition, offset, max_bytes).await? {
                return Ok(r);
            }
        }
    }
    let mut r =
        crate::shard::partition::fetch_local(core, topic, partition, offset, max_bytes, wait_ms)
            .await?;
    if tiered {
        r.log_start_offset = super::log_start(core, topic, partition, r.log_start_offset);
    }
    Ok(r)
}

/// Offsets of a partition this core owns, the remote tier included: its
/// log start, and a timestamp's offset looked up in the remote segments
/// first.
pub async fn offsets_owned(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    timestamp: Option<i64>,
) -> Result<OffsetsOk, BrokerError> {
    let mut ok = crate::shard::partition::offsets_local(core, topic, partition, timestamp).await?;
    if core.shared.remote.is_none() || !core.owned_log(topic, partition)?.config().remote_storage {
        return Ok(ok);
    }
    let local_start = ok.log_start_offset;
    ok.log_start_offset = super::log_start(core, topic, partition, local_start);
    ok.remote_end = Some(0);
    if let Some(id) = super::topic_id(core, topic) {
        let remote = super::readable(core, &id, partition);
        ok.remote_bytes = remote.iter().map(|s| s.bytes).sum();
        ok.remote_segments = remote.len() as u32;
        ok.remote_end = Some(remote.iter().map(|s| s.end).max().unwrap_or(0));
    }
    if let (Some(ts), true) = (timestamp, ok.log_start_offset < local_start) {
        if let Some(found) = offset_for_timestamp(core, topic, partition, ts, local_start).await? {
            ok.for_timestamp = Some(found);
        }
    }
    Ok(ok)
}

/// DeleteRecords on a partition this core owns: for a tiered one, its
/// log start is raised in the remote log metadata first (remote segments
/// wholly below it are then deleted by the tiering task, metadata first),
/// then on local disk. Returns the partition's new log start.
pub async fn delete_records_owned(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    before: i64,
) -> Result<u64, BrokerError> {
    let log = core.owned_log(topic, partition)?;
    let local =
        |before| crate::shard::partition::delete_records_local(core, topic, partition, before);
    if core.shared.remote.is_none() || !log.config().remote_storage {
        return local(before).await;
    }
    let (hw, _) = visible(core, topic, partition)?;
    let to = match before {
        -1 => hw,
        b if b >= 0 && b as u64 <= hw => b as u64,
        // Refused with the local path's message.
        b => return local(b).await,
    };
    let epoch = super::leader_epoch(core, topic, partition)
        .ok_or_else(|| core.not_held(topic, partition))?;
    core.shared
        .controller
        .propose(weir_replication::meta::Command::RemoteLogStart {
            topic: topic.to_string(),
            partition,
            leader: core.shared.config.cluster.node_id,
            leader_epoch: epoch,
            offset: to,
        })
        .await
        .map_err(|e| {
            BrokerError::TimedOut(format!(
                "raising the remote log start of {topic}-{partition}: {e}"
            ))
        })?;
    let local_start = local(to as i64).await?;
    Ok(super::log_start(core, topic, partition, local_start).max(to))
}

/// The leader's check and the visible limits of a partition (the high
/// watermark, and the last stable offset below it).
fn visible(core: &Core, topic: &str, partition: u32) -> Result<(u64, u64), BrokerError> {
    let log = core.owned_log(topic, partition)?;
    let replica = core.replication.get(topic, partition);
    if let Some(r) = &replica {
        r.check_leader()?;
    }
    let hw = replica
        .filter(|r| r.replicated())
        .map_or(log.high_watermark(), |r| r.high_watermark());
    Ok((hw, log.last_stable_offset().min(hw)))
}

/// Batches at `offset` from the remote segment holding it, or `None` if
/// none does.
async fn fetch(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    offset: u64,
    max_bytes: u64,
) -> Result<Option<FetchOk>, BrokerError> {
    let (hw, lso) = visible(core, topic, partition)?;
    let (Some(store), Some(topic_id)) = (core.shared.remote.clone(), super::topic_id(core, topic))
    else {
        return Ok(None);
    };
    let segments = super::readable(core, &topic_id, partition);
    let Some(seg) = segments.iter().find(|s| s.base <= offset && offset < s.end) else {
        return Ok(None);
    };
    let raised = core
        .shared
        .controller
        .state()
        .remote
        .log_start(&topic_id, partition);
    let log_start = segments.first().map_or(offset, |s| s.base).max(raised);
    if offset < log_start {
        return Err(BrokerError::Storage {
            kind: StorageFailure::OffsetOutOfRange,
            message: format!(
                "offset {offset} is out of range for {topic}-{partition}: records before \
                 {log_start} were deleted (DeleteRecords)"
            ),
        });
    }
    let counters = &core.tier.counters;
    let _permit =
        core.tier
            .reads
            .acquire_permit(1)
            .await
            .map_err(|_| BrokerError::CoreUnavailable {
                core: core.id,
                reason: "stopping".into(),
            })?;
    let started = Instant::now();
    let src = Source {
        store: &store,
        topic,
        topic_id,
        partition,
        seg,
    };
    let r = match read_batches(core, &src, offset, max_bytes).await {
        Ok(batches) => {
            let end = batches
                .last()
                .and_then(|b| BatchHeader::peek(b).ok())
                .map_or(offset, |h| h.last_offset() as u64 + 1);
            aborted(
                core, &store, topic, topic_id, partition, &segments, offset, end,
            )
            .await
            .map(|a| (batches, a))
        }
        Err(e) => Err(e),
    };
    bump(&counters.read_micros, started.elapsed().as_micros() as u64);
    match r {
        Ok((batches, aborted)) => {
            bump(&counters.reads, 1);
            bump(
                &counters.read_bytes,
                batches.iter().map(|b| b.len() as u64).sum(),
            );
            Ok(Some(FetchOk {
                batches,
                high_watermark: hw,
                log_start_offset: log_start,
                last_stable_offset: lso,
                aborted,
            }))
        }
        Err(e) => {
            bump(&counters.read_errors, 1);
            tracing::warn!(partition = %format!("{topic}-{partition}"), offset, error = %e, "remote read failed");
            Err(e)
        }
    }
}

/// The aborted transactions a read of `from..upto` from the remote tier
/// overlaps (producer id, first offset), for read_committed readers: the
/// `.txnindex` objects of the remote segments from the one holding `from`
/// on (only those that have one), then the local log's — until an entry
/// written when the last stable offset had passed `upto` (no transaction
/// open across the range is aborted later), as the local read does.
#[allow(clippy::too_many_arguments)]
async fn aborted(
    core: &Rc<Core>,
    store: &RemoteStore,
    topic: &str,
    topic_id: [u8; 16],
    partition: u32,
    segments: &[RemoteSegment],
    from: u64,
    upto: u64,
) -> Result<Vec<(i64, u64)>, BrokerError> {
    let mut out = Vec::new();
    if upto <= from {
        return Ok(out);
    }
    for seg in segments
        .iter()
        .filter(|s| s.end > from && s.aborted_txns > 0)
    {
        let key = object_key(
            topic,
            &topic_id,
            partition,
            seg.base,
            &seg.id,
            ObjectKind::TxnIndex,
        );
        let bytes = store.get(&key).await.map_err(super::unavailable)?;
        let entries = weir_storage::txn::decode(&bytes)
            .map_err(|e| super::unavailable(format!("{key}: {e}")))?;
        for e in entries {
            if e.last_offset >= from && e.first_offset < upto {
                out.push((e.producer_id, e.first_offset));
            }
            if e.last_stable_offset >= upto {
                return Ok(out);
            }
        }
    }
    let log = core.owned_log(topic, partition)?;
    out.extend(
        log.aborted_transactions(log.log_start_offset(), upto)
            .into_iter()
            .filter(|a| a.last_offset >= from && a.first_offset < upto)
            .map(|a| (a.producer_id, a.first_offset)),
    );
    // A marker in a segment both remote and still local is in both lists.
    out.sort_unstable_by_key(|&(pid, first)| (first, pid));
    out.dedup();
    Ok(out)
}

/// The remote offset at or after `ts`: the first record with a timestamp
/// at or after it in the remote segments below `local_start`.
async fn offset_for_timestamp(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    ts: i64,
    local_start: u64,
) -> Result<Option<u64>, BrokerError> {
    let (Some(store), Some(topic_id)) = (core.shared.remote.clone(), super::topic_id(core, topic))
    else {
        return Ok(None);
    };
    let segments = super::readable(core, &topic_id, partition);
    for seg in segments
        .iter()
        .filter(|s| s.max_timestamp >= ts && s.base < local_start)
    {
        let src = Source {
            store: &store,
            topic,
            topic_id,
            partition,
            seg,
        };
        let idx = indexes(core, &src).await?;
        let rel = idx.times.last_older_than(ts).unwrap_or(0);
        let mut pos = idx.offsets.lookup(rel).map_or(0, |(_, p)| p as u64);
        while pos < seg.bytes {
            let h = header_at(core, &src, pos).await?;
            let len = h.total_len() as u64;
            if h.max_timestamp >= ts {
                let b = bytes_at(core, &src, pos, len).await?;
                return Ok(Some(weir_storage::log::first_at_or_after(&h, &b, ts)));
            }
            pos += len;
        }
    }
    Ok(None)
}

/// Whole batches from `offset` (the first one holding it), at most
/// `max_bytes` unless the first alone is larger.
async fn read_batches(
    core: &Rc<Core>,
    src: &Source<'_>,
    offset: u64,
    max_bytes: u64,
) -> Result<Vec<Bytes>, BrokerError> {
    let seg = src.seg;
    let idx = indexes(core, src).await?;
    let rel = u32::try_from(offset - seg.base).unwrap_or(u32::MAX);
    let mut pos = idx.offsets.lookup(rel).map_or(0, |(_, p)| p as u64);
    let mut out = Vec::new();
    let mut total = 0u64;
    while pos < seg.bytes {
        let h = header_at(core, src, pos).await?;
        let len = h.total_len() as u64;
        if pos + len > seg.bytes {
            return Err(corrupt(src, pos, "a batch runs past the object's end"));
        }
        if (h.last_offset() as u64) < offset {
            pos += len;
            continue;
        }
        if !out.is_empty() && total + len > max_bytes {
            break;
        }
        out.push(bytes_at(core, src, pos, len).await?);
        total += len;
        pos += len;
        if total >= max_bytes {
            break;
        }
    }
    read_ahead(core, src, pos);
    Ok(out)
}

fn corrupt(src: &Source<'_>, pos: u64, what: &str) -> BrokerError {
    BrokerError::Storage {
        kind: StorageFailure::Corrupt,
        message: format!(
            "remote segment {} at position {pos}: {what}",
            src.key(ObjectKind::Log)
        ),
    }
}

async fn header_at(
    core: &Rc<Core>,
    src: &Source<'_>,
    pos: u64,
) -> Result<BatchHeader, BrokerError> {
    if pos + HEADER_BYTES as u64 > src.seg.bytes {
        return Err(corrupt(
            src,
            pos,
            "a batch header runs past the object's end",
        ));
    }
    let head = bytes_at(core, src, pos, HEADER_BYTES as u64).await?;
    BatchHeader::peek(&head).map_err(|e| corrupt(src, pos, &e.to_string()))
}

/// `len` bytes of the segment's `.log` object from `pos`: a slice of one
/// cached chunk, or a copy of the parts of several.
async fn bytes_at(
    core: &Rc<Core>,
    src: &Source<'_>,
    pos: u64,
    len: u64,
) -> Result<Bytes, BrokerError> {
    let first = pos / CHUNK_BYTES;
    let last = (pos + len - 1) / CHUNK_BYTES;
    if first == last {
        let c = chunk(core, src, first).await?;
        let from = (pos - first * CHUNK_BYTES) as usize;
        if from + len as usize > c.len() {
            return Err(corrupt(
                src,
                pos,
                "the object is shorter than its metadata says",
            ));
        }
        return Ok(c.slice(from..from + len as usize));
    }
    let mut out = BytesMut::with_capacity(len as usize);
    for k in first..=last {
        let c = chunk(core, src, k).await?;
        let start = pos.max(k * CHUNK_BYTES) - k * CHUNK_BYTES;
        let end = (pos + len).min((k + 1) * CHUNK_BYTES) - k * CHUNK_BYTES;
        if end as usize > c.len() {
            return Err(corrupt(
                src,
                pos,
                "the object is shorter than its metadata says",
            ));
        }
        out.extend_from_slice(&c[start as usize..end as usize]);
    }
    Ok(out.freeze())
}

/// Chunk `k` of the segment's `.log` object: cached, being read (waited
/// for), or read now.
async fn chunk(core: &Rc<Core>, src: &Source<'_>, k: u64) -> Result<Bytes, BrokerError> {
    let key = (src.seg.id, k);
    loop {
        if let Some(c) = core.tier.chunks.borrow_mut().get(&key) {
            return Ok(c);
        }
        let wait = {
            let mut loading = core.tier.loading.borrow_mut();
            match loading.get_mut(&key) {
                Some(waiters) => {
                    let (tx, rx) = oneshot::channel();
                    waiters.push(tx);
                    Some(rx)
                }
                None => {
                    loading.insert(key, Vec::new());
                    None
                }
            }
        };
        match wait {
            // Read by another: look again (it may have failed: then read).
            Some(rx) => {
                let _ = rx.await;
                if let Some(c) = core.tier.chunks.borrow_mut().get(&key) {
                    return Ok(c);
                }
                if core.tier.loading.borrow().contains_key(&key) {
                    continue;
                }
                core.tier.loading.borrow_mut().insert(key, Vec::new());
                return load(core, src.store, src.key(ObjectKind::Log), src.seg, k)
                    .await
                    .map_err(super::unavailable);
            }
            None => {
                return load(core, src.store, src.key(ObjectKind::Log), src.seg, k)
                    .await
                    .map_err(super::unavailable)
            }
        }
    }
}

/// Reads chunk `k` (its loading mark set by the caller), caches it and
/// wakes the reads waiting for it.
async fn load(
    core: &Rc<Core>,
    store: &RemoteStore,
    key: String,
    seg: &RemoteSegment,
    k: u64,
) -> Result<Bytes, TierError> {
    let range = k * CHUNK_BYTES..((k + 1) * CHUNK_BYTES).min(seg.bytes);
    let r = store.get_range(&key, range).await;
    bump(&core.tier.counters.chunks_read, 1);
    if let Ok(c) = &r {
        core.tier.chunks.borrow_mut().put((seg.id, k), c.clone());
    }
    let waiters = core
        .tier
        .loading
        .borrow_mut()
        .remove(&(seg.id, k))
        .unwrap_or_default();
    for w in waiters {
        let _ = w.send(());
    }
    r
}

/// Starts reading the chunks after `pos` that are not cached or being
/// read, up to [`READ_AHEAD_CHUNKS`] of them, in the background.
fn read_ahead(core: &Rc<Core>, src: &Source<'_>, pos: u64) {
    let seg = src.seg;
    let next = pos / CHUNK_BYTES;
    for k in next..next + READ_AHEAD_CHUNKS {
        if k * CHUNK_BYTES >= seg.bytes {
            break;
        }
        let key = (seg.id, k);
        if core.tier.chunks.borrow().contains(&key) || core.tier.loading.borrow().contains_key(&key)
        {
            continue;
        }
        core.tier.loading.borrow_mut().insert(key, Vec::new());
        let (core, store, log_key, seg) = (
            core.clone(),
            src.store.clone(),
            src.key(ObjectKind::Log),
            seg.clone(),
        );
        glommio::spawn_local(async move {
            if let Err(e) = load(&core, &store, log_key, &seg, k).await {
                tracing::debug!(error = %e, "remote read-ahead failed");
            }
        })
        .detach();
    }
}

/// The segment's indexes: kept, or read from its `.index` and
/// `.timeindex` objects.
async fn indexes(core: &Rc<Core>, src: &Source<'_>) -> Result<Rc<RemoteIndexes>, BrokerError> {
    if let Some(i) = core.tier.indexes.borrow().get(&src.seg.id) {
        return Ok(i.clone());
    }
    let offsets = src
        .store
        .get(&src.key(ObjectKind::Index))
        .await
        .map_err(super::unavailable)?;
    let times = src
        .store
        .get(&src.key(ObjectKind::TimeIndex))
        .await
        .map_err(super::unavailable)?;
    let idx = Rc::new(RemoteIndexes {
        offsets: weir_storage::offset_index::OffsetIndex::decode(&offsets),
        times: weir_storage::time_index::TimeIndex::decode(&times),
    });
    let mut all = core.tier.indexes.borrow_mut();
    if all.len() >= super::state::INDEXES_MAX {
        all.clear();
    }
    all.insert(src.seg.id, idx.clone());
    Ok(idx)
}
