//! The tiering task of each core: every `--remote-log-task-interval-ms`,
//! for each tiered partition this core holds,
//!
//! 1. tells the log where the remote tier ends (local retention deletes
//!    only segments below it — on followers too, which never upload);
//! 2. where this node leads: cleans up what an earlier pass or leader left
//!    (copies started and never finished, deletions started): their
//!    objects are deleted, then their metadata;
//! 3. applies the total retention (`retention.ms`, `retention.bytes`,
//!    local and remote bytes together) to the remote segments, oldest
//!    first: metadata marked (no longer read), objects deleted, metadata
//!    removed;
//! 4. uploads the closed segments wholly below the high watermark that
//!    the remote log does not hold yet, oldest first, one at a time: the
//!    copy recorded as started (fenced by the leader epoch), the indexes,
//!    the leader epochs and then the records uploaded under the segment's
//!    own id, the copy recorded as finished — only then is it read, and
//!    only then may local retention delete it. A segment that begins
//!    before the remote end (a new leader's segments need not be cut where
//!    the old leader's were) is uploaded from its batch at the remote end.
//!
//! Core 0 of the node leading the metadata quorum also deletes the remote
//! objects of deleted topics. A failure ends the partition's pass; the
//! next pass starts over from the committed metadata.

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use weir_proto::batch::{BatchHeader, HEADER_BYTES};
use weir_replication::meta::{Command, RemoteCopy, RemoteSegment, RemoteSegmentState};
use weir_storage::offset_index::OffsetIndex;
use weir_storage::producer_state::ProducerStateTable;
use weir_storage::time_index::TimeIndex;
use weir_storage::{PartitionLog, SealedSegment};
use weir_tier::layout::{encode_epochs, object_key, parse_segment_id, partition_dir, ObjectKind};
use weir_tier::RemoteStore;

use super::state::bump;
use crate::shard::Core;

/// Bytes of batches an upload asks of the log at a time.
const UPLOAD_READ_BYTES: u64 = 4 << 20;
/// An object no remote log metadata names is deleted by the sweep once
/// this old (by the store's clock).
pub const ORPHAN_AGE: Duration = Duration::from_secs(600);

/// Runs the tiering passes until the broker stops.
pub async fn task_loop(core: Rc<Core>) {
    let interval = core.shared.config.remote_log_task_interval_ms;
    loop {
        let mut waited = 0;
        while waited < interval {
            if core.shared.stopping() {
                return;
            }
            let step = interval.min(100);
            glommio::timer::sleep(Duration::from_millis(step)).await;
            waited += step;
        }
        pass(&core).await;
    }
}

/// One pass over the core's tiered partitions.
pub async fn pass(core: &Rc<Core>) {
    let Some(store) = core.shared.remote.clone() else {
        return;
    };
    let logs: Vec<_> = core
        .logs
        .borrow()
        .iter()
        .filter(|(_, l)| l.config().remote_storage)
        .map(|((t, p), l)| (t.clone(), *p, l.clone()))
        .collect();
    // What the core keeps per tiered partition, for those it still holds.
    let held: std::collections::HashSet<(String, u32)> =
        logs.iter().map(|(t, p, _)| (t.clone(), *p)).collect();
    core.tier.swept.borrow_mut().retain(|k, _| held.contains(k));
    core.tier
        .producers
        .borrow_mut()
        .retain(|k, _| held.contains(k));
    for (topic, partition, log) in logs {
        if core.shared.stopping() {
            return;
        }
        let Some(topic_id) = super::topic_id(core, &topic) else {
            continue;
        };
        let part = Part {
            core,
            store: &store,
            topic: &topic,
            topic_id,
            partition,
            log: &log,
        };
        if let Err(e) = part.run().await {
            tracing::warn!(partition = %format!("{topic}-{partition}"), error = %e, "tiering pass failed; retried at the next");
        }
    }
    if core.id == 0 && core.shared.controller.leader() == Some(core.shared.config.cluster.node_id) {
        if let Err(e) = delete_deleted_topics(core, &store).await {
            tracing::warn!(error = %e, "deleting the remote data of deleted topics failed; retried at the next pass");
        }
    }
}

/// One tiered partition in a pass.
struct Part<'a> {
    core: &'a Rc<Core>,
    store: &'a RemoteStore,
    topic: &'a str,
    topic_id: [u8; 16],
    partition: u32,
    log: &'a PartitionLog,
}

type PassResult = Result<(), String>;

impl Part<'_> {
    fn name(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }

    /// The partition, as the core's tiering state keys it.
    fn at(&self) -> (String, u32) {
        (self.topic.to_string(), self.partition)
    }

    fn segments(&self) -> Vec<RemoteSegment> {
        self.core
            .shared
            .controller
            .state()
            .remote
            .segments(&self.topic_id, self.partition)
            .to_vec()
    }

    fn key(&self, seg: &RemoteSegment, kind: ObjectKind) -> String {
        object_key(
            self.topic,
            &self.topic_id,
            self.partition,
            seg.base,
            &seg.id,
            kind,
        )
    }

    /// This node's leader epoch of the partition, if it leads it now.
    fn leader_epoch(&self) -> Option<u32> {
        super::leader_epoch(self.core, self.topic, self.partition)
    }

    /// The high watermark: what every in-sync replica holds.
    fn high_watermark(&self) -> u64 {
        match self.core.replication.get(self.topic, self.partition) {
            Some(r) if r.replicated() => r.high_watermark(),
            _ => self.log.high_watermark(),
        }
    }

    async fn propose(&self, c: Command) -> Result<(), String> {
        self.core
            .shared
            .controller
            .propose(c)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn run(&self) -> PassResult {
        let remote_end = |segs: &[RemoteSegment]| {
            segs.iter()
                .rev()
                .find(|s| s.state == RemoteSegmentState::CopyFinished)
                .map(|s| s.end)
        };
        if let Some(end) = remote_end(&self.segments()) {
            self.log.set_remote_end(end);
        }
        let Some(epoch) = self.leader_epoch() else {
            return Ok(());
        };
        self.clean_up().await?;
        self.sweep_orphans(epoch).await;
        self.retention().await?;
        loop {
            let end = remote_end(&self.segments());
            let hw = self.high_watermark();
            let next = self
                .log
                .sealed_segments(end.unwrap_or(0), hw)
                .into_iter()
                .next();
            let Some(seg) = next else {
                return Ok(());
            };
            if self.core.shared.stopping() || self.leader_epoch() != Some(epoch) {
                return Ok(());
            }
            self.upload(&seg, end, epoch).await?;
        }
    }

    /// Deletes the objects of copies never finished and of deletions
    /// started, then their metadata. Nothing of this partition is being
    /// uploaded meanwhile: one core owns it and runs its pass in turn.
    async fn clean_up(&self) -> PassResult {
        let stale: Vec<RemoteSegment> = self
            .segments()
            .into_iter()
            .filter(|s| s.state != RemoteSegmentState::CopyFinished)
            .collect();
        if stale.is_empty() {
            return Ok(());
        }
        self.delete_objects(&stale).await?;
        self.propose(Command::RemoteDeleteFinished {
            topic_id: self.topic_id,
            partition: self.partition,
            ids: stale.iter().map(|s| s.id).collect(),
        })
        .await?;
        tracing::info!(partition = %self.name(), segments = stale.len(), "unfinished remote copies and deletions cleaned up");
        Ok(())
    }

    /// Every `--remote-log-orphan-sweep-ms`: lists the partition's remote
    /// folder and deletes the objects of segment ids the remote log
    /// metadata does not name, once [`ORPHAN_AGE`] old — what a deposed
    /// leader wrote after the new one cleaned its unfinished copy up (its
    /// finish is then refused, so nothing reads them). Only while this
    /// core leads the partition at `epoch` and the node holds its leader
    /// lease with the metadata it applied (a node cut off from the
    /// quorum, whose view may miss newer segments, deletes nothing),
    /// looked at again before each deletion; the metadata is read after
    /// the listing, and the age keeps the sweep off an upload whose start
    /// this node has not applied yet. A failure is logged and counted: the
    /// pass goes on (retention, uploads), the sweep waits for its next
    /// turn.
    async fn sweep_orphans(&self, epoch: u32) {
        let every = self.core.shared.config.remote_log_orphan_sweep_ms;
        let at = self.at();
        let due = every > 0
            && self
                .core
                .tier
                .swept
                .borrow()
                .get(&at)
                .is_none_or(|t| t.elapsed() >= Duration::from_millis(every));
        if !due {
            return;
        }
        self.core
            .tier
            .swept
            .borrow_mut()
            .insert(at, std::time::Instant::now());
        let fenced = || !self.core.holds_lease() || self.leader_epoch() != Some(epoch);
        if fenced() {
            return;
        }
        let folder = partition_dir(self.topic, &self.topic_id, self.partition);
        let listed = match self.store.list(&folder).await {
            Ok(l) => l,
            Err(e) => {
                bump(&self.core.tier.counters.delete_errors, 1);
                tracing::warn!(partition = %self.name(), error = %e,
                    "listing the remote folder for orphaned objects failed; swept again later");
                return;
            }
        };
        let known: std::collections::HashSet<[u8; 16]> =
            self.segments().iter().map(|s| s.id).collect();
        let old_enough =
            |modified: std::time::SystemTime| modified.elapsed().is_ok_and(|age| age >= ORPHAN_AGE);
        let mut deleted = 0u64;
        for (key, modified) in listed {
            let orphan = parse_segment_id(&key).is_some_and(|id| !known.contains(&id));
            if !orphan || !old_enough(modified) {
                continue;
            }
            if fenced() {
                break;
            }
            if let Err(e) = self.store.delete(&key).await {
                bump(&self.core.tier.counters.delete_errors, 1);
                tracing::warn!(partition = %self.name(), key, error = %e,
                    "deleting an orphaned remote object failed; swept again later");
                break;
            }
            deleted += 1;
        }
        if deleted > 0 {
            bump(&self.core.tier.counters.orphans_deleted, deleted);
            tracing::info!(partition = %self.name(), objects = deleted,
                "remote objects no metadata names deleted");
        }
    }

    async fn delete_objects(&self, segs: &[RemoteSegment]) -> PassResult {
        for s in segs {
            for kind in ObjectKind::ALL {
                if let Err(e) = self.store.delete(&self.key(s, kind)).await {
                    bump(&self.core.tier.counters.delete_errors, 1);
                    return Err(e.to_string());
                }
            }
            self.core.tier.chunks.borrow_mut().forget(&s.id);
            self.core.tier.indexes.borrow_mut().remove(&s.id);
        }
        Ok(())
    }

    /// The total retention over the remote segments: the oldest go while
    /// older than `retention.ms`, or while the partition (remote and
    /// local) is larger than `retention.bytes` without them.
    async fn retention(&self) -> PassResult {
        let cfg = self.log.config();
        if !cfg.cleanup_policy.deletes() {
            return Ok(());
        }
        let readable: Vec<RemoteSegment> = self
            .segments()
            .into_iter()
            .filter(|s| s.state == RemoteSegmentState::CopyFinished)
            .collect();
        let Some(last) = readable.last() else {
            return Ok(());
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let local = self
            .log
            .bytes_from(last.end.max(self.log.log_start_offset()));
        let mut total: u64 = readable.iter().map(|s| s.bytes).sum::<u64>() + local;
        let mut doomed = Vec::new();
        for s in &readable {
            let by_time = cfg
                .retention_ms
                .is_some_and(|ms| s.max_timestamp < now.saturating_sub(ms));
            let by_size = cfg
                .retention_bytes
                .is_some_and(|max| total - s.bytes >= max);
            if !(by_time || by_size) {
                break;
            }
            total -= s.bytes;
            doomed.push(s.clone());
        }
        if doomed.is_empty() {
            return Ok(());
        }
        let ids: Vec<[u8; 16]> = doomed.iter().map(|s| s.id).collect();
        self.propose(Command::RemoteDeleteStarted {
            topic_id: self.topic_id,
            partition: self.partition,
            ids: ids.clone(),
        })
        .await?;
        self.delete_objects(&doomed).await?;
        self.propose(Command::RemoteDeleteFinished {
            topic_id: self.topic_id,
            partition: self.partition,
            ids,
        })
        .await?;
        bump(&self.core.tier.counters.deletes, doomed.len() as u64);
        tracing::info!(partition = %self.name(), segments = doomed.len(), "remote retention deleted segments");
        Ok(())
    }

    /// Uploads `seg` from the remote end `end` (its base if the remote log
    /// is empty).
    async fn upload(&self, seg: &SealedSegment, end: Option<u64>, epoch: u32) -> PassResult {
        let base = end.unwrap_or(seg.base).max(seg.base);
        if end.is_some_and(|e| e < seg.base) {
            return Err(format!(
                "the remote log ends at {} but the local log's next closed segment starts at {}: \
                 the records between are in neither; not uploading past the gap",
                end.unwrap_or_default(),
                seg.base
            ));
        }
        // Where `base` is in the local file (0 unless the segment begins
        // before the remote end).
        let from = if base == seg.base {
            0
        } else {
            self.position_of(seg, base).await?
        };
        let (index, time_index) = rebase(seg, base, from);
        let epochs: Vec<(u32, u64)> = {
            let all = self.log.leader_epochs();
            let mut out: Vec<(u32, u64)> = Vec::new();
            for (e, start) in all {
                if start >= seg.end {
                    break;
                }
                if start <= base {
                    out.clear();
                }
                out.push((e, start.max(base)));
            }
            out
        };
        // The abort markers of the part uploaded.
        let aborted: Vec<_> = seg
            .aborted
            .iter()
            .filter(|a| a.last_offset >= base)
            .copied()
            .collect();
        let meta = RemoteSegment {
            aborted_txns: aborted.len() as u32,
            id: *uuid::Uuid::new_v4().as_bytes(),
            base,
            end: seg.end,
            bytes: seg.bytes - from,
            max_timestamp: seg.max_timestamp,
            leader_epoch: epoch,
            node: self.core.shared.config.cluster.node_id,
            epochs: epochs.clone(),
            state: RemoteSegmentState::CopyStarted,
        };
        self.propose(Command::RemoteCopyStarted(Box::new(RemoteCopy {
            topic: self.topic.to_string(),
            partition: self.partition,
            leader: meta.node,
            leader_epoch: epoch,
            segment: meta.clone(),
        })))
        .await?;
        let put = async {
            let store = self.store;
            store
                .put(&self.key(&meta, ObjectKind::Index), Bytes::from(index))
                .await?;
            store
                .put(
                    &self.key(&meta, ObjectKind::TimeIndex),
                    Bytes::from(time_index),
                )
                .await?;
            store
                .put(
                    &self.key(&meta, ObjectKind::Epochs),
                    Bytes::from(encode_epochs(&epochs)),
                )
                .await?;
            if !aborted.is_empty() {
                store
                    .put(
                        &self.key(&meta, ObjectKind::TxnIndex),
                        Bytes::from(weir_storage::txn::encode(&aborted)),
                    )
                    .await?;
            }
            Ok::<(), weir_tier::TierError>(())
        };
        let put = async {
            put.await.map_err(|e| e.to_string())?;
            let mut producers = self.producers_at(base).await?;
            self.upload_records(seg, &meta, &mut producers).await?;
            self.store
                .put(
                    &self.key(&meta, ObjectKind::ProducerSnapshot),
                    Bytes::from(producers.encode(meta.end)),
                )
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(producers)
        };
        let producers = match put.await {
            Ok(p) => p,
            Err(e) => {
                bump(&self.core.tier.counters.upload_errors, 1);
                // Left as started: the next pass deletes what was written.
                return Err(format!("uploading {}..{}: {e}", meta.base, meta.end));
            }
        };
        let finished = Command::RemoteCopyFinished {
            topic: self.topic.to_string(),
            partition: self.partition,
            leader: meta.node,
            leader_epoch: epoch,
            id: meta.id,
        };
        if let Err(e) = self.propose(finished).await {
            bump(&self.core.tier.counters.upload_errors, 1);
            return Err(format!(
                "the upload of {}..{} was not recorded: {e}",
                meta.base, meta.end
            ));
        }
        self.log.set_remote_end(meta.end);
        // The next upload starts here: it builds on this table instead of
        // reading the snapshot back from the store.
        self.core
            .tier
            .producers
            .borrow_mut()
            .insert(self.at(), (meta.end, producers));
        bump(&self.core.tier.counters.uploads, 1);
        bump(&self.core.tier.counters.uploaded_bytes, meta.bytes);
        tracing::info!(partition = %self.name(), base = meta.base, end = meta.end, bytes = meta.bytes, "segment uploaded to the remote tier");
        Ok(())
    }

    /// Uploads the record batches of `meta.base..meta.end` as the
    /// segment's `.log` object, read through the log — from the core's
    /// batch cache where they still are (a segment just closed is), else
    /// with the core's direct I/O — rather than from the file through the
    /// page cache: a disk read per upload made the partition's own writes
    /// wait (docs/benchmarks.md, "Tiered storage").
    async fn upload_records(
        &self,
        seg: &SealedSegment,
        meta: &RemoteSegment,
        producers: &mut ProducerStateTable,
    ) -> PassResult {
        let mut up = self
            .store
            .upload(&self.key(meta, ObjectKind::Log), meta.bytes)
            .map_err(|e| e.to_string())?;
        let (mut at, mut sent) = (meta.base, 0u64);
        while at < meta.end {
            let r = self
                .log
                .read(at, UPLOAD_READ_BYTES)
                .await
                .map_err(|e| format!("reading {at} to upload it: {e}"))?;
            let before = at;
            for b in r.batches {
                let h = BatchHeader::peek(&b).map_err(|e| e.to_string())?;
                if h.base_offset as u64 >= meta.end {
                    break;
                }
                if (h.last_offset() as u64) < at {
                    continue;
                }
                at = h.last_offset() as u64 + 1;
                sent += b.len() as u64;
                producers.record_read(&h, &b);
                let wait = self.store.copy_delay(b.len() as u64);
                if !wait.is_zero() {
                    bump(
                        &self.core.tier.counters.copy_throttle_micros,
                        wait.as_micros() as u64,
                    );
                    glommio::timer::sleep(wait).await;
                }
                up.write(b).await.map_err(|e| e.to_string())?;
            }
            if at == before {
                return Err(format!("no batch at {at} of the segment at {}", seg.base));
            }
        }
        if sent != meta.bytes {
            return Err(format!(
                "the batches of {}..{} are {sent} bytes, the segment {}",
                meta.base, meta.end, meta.bytes
            ));
        }
        up.finish().await.map_err(|e| e.to_string())
    }

    /// The producers' state at `base`, where an upload starts: the table
    /// this core built uploading the segment ending there, else the
    /// snapshot uploaded with it (read back from the store), else (the
    /// first segment uploaded, or one uploaded before snapshots were, or
    /// an unreadable one) an empty table — a snapshot then holds the
    /// producers of the segments uploaded since. A store that does not
    /// answer fails the upload (retried at the next pass).
    async fn producers_at(&self, base: u64) -> Result<ProducerStateTable, String> {
        let kept = self.core.tier.producers.borrow_mut().remove(&self.at());
        if let Some((_, t)) = kept.filter(|(end, _)| *end == base) {
            return Ok(t);
        }
        let Some(prev) = super::readable(self.core, &self.topic_id, self.partition)
            .into_iter()
            .find(|s| s.end == base)
        else {
            return Ok(ProducerStateTable::new());
        };
        let key = self.key(&prev, ObjectKind::ProducerSnapshot);
        let bytes = match self.store.get(&key).await {
            Ok(bytes) => bytes,
            Err(weir_tier::TierError::NotFound(_)) => return Ok(ProducerStateTable::new()),
            Err(e) => return Err(format!("reading the producer snapshot before {base}: {e}")),
        };
        Ok(match ProducerStateTable::decode(&bytes) {
            Ok((at, t)) if at == base => t,
            Ok((at, _)) => {
                tracing::warn!(partition = %self.name(), key, at, base,
                    "a remote producer snapshot at another offset than its segment's end: starting empty");
                ProducerStateTable::new()
            }
            Err(why) => {
                tracing::warn!(partition = %self.name(), key, why,
                    "an unreadable remote producer snapshot: starting empty");
                ProducerStateTable::new()
            }
        })
    }

    /// The position in `seg`'s file of the batch starting at `offset`
    /// (read from the file from the index entry at or below it).
    async fn position_of(&self, seg: &SealedSegment, offset: u64) -> Result<u64, String> {
        let idx = OffsetIndex::decode(&seg.index);
        let rel = u32::try_from(offset - seg.base).map_err(|_| "offset out of the segment")?;
        let mut pos = idx.lookup(rel).map_or(0, |(_, p)| p as u64);
        while pos + HEADER_BYTES as u64 <= seg.bytes {
            let head = self
                .store
                .read_local(seg.log_path.clone(), pos..pos + HEADER_BYTES as u64)
                .await
                .map_err(|e| e.to_string())?;
            let h = BatchHeader::peek(&head).map_err(|e| e.to_string())?;
            let b = h.base_offset as u64;
            if b == offset {
                return Ok(pos);
            }
            if b > offset {
                break;
            }
            pos += h.total_len() as u64;
        }
        Err(format!(
            "no batch starts at {offset} in the segment at {}",
            seg.base
        ))
    }
}

/// The segment's indexes for an object starting at offset `base`, file
/// position `from`: entries before it dropped, the rest made relative to
/// it, a first entry at the object's start.
fn rebase(seg: &SealedSegment, base: u64, from: u64) -> (Vec<u8>, Vec<u8>) {
    if base == seg.base {
        return (seg.index.clone(), seg.time_index.clone());
    }
    let delta = (base - seg.base) as u32;
    let from = from as u32;
    let mut offsets = OffsetIndex::default();
    offsets.push(0, 0);
    for &(rel, pos) in OffsetIndex::decode(&seg.index).entries() {
        if rel > delta && pos > from {
            offsets.push(rel - delta, pos - from);
        }
    }
    let mut times = TimeIndex::default();
    for &(ts, rel) in TimeIndex::decode(&seg.time_index).entries() {
        if rel >= delta {
            times.push(ts, rel - delta);
        }
    }
    (offsets.encode_all(), times.encode_all())
}

/// Deletes the objects of deleted topics, then their metadata.
async fn delete_deleted_topics(core: &Rc<Core>, store: &RemoteStore) -> Result<(), String> {
    let state = core.shared.controller.state();
    for (topic_id, t) in state.remote.topics.iter().filter(|(_, t)| t.deleted) {
        for (partition, segs) in &t.partitions {
            for s in segs {
                for kind in ObjectKind::ALL {
                    let key = object_key(&t.name, topic_id, *partition, s.base, &s.id, kind);
                    store.delete(&key).await.map_err(|e| e.to_string())?;
                }
            }
            core.shared
                .controller
                .propose(Command::RemoteDeleteFinished {
                    topic_id: *topic_id,
                    partition: *partition,
                    ids: segs.iter().map(|s| s.id).collect(),
                })
                .await
                .map_err(|e| e.to_string())?;
        }
        tracing::info!(topic = %t.name, "remote data of the deleted topic removed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_uploaded_from_the_remote_end_has_its_indexes_rebased() {
        let mut idx = OffsetIndex::default();
        for (rel, pos) in [(0, 0), (10, 4096), (20, 8192), (30, 12288)] {
            idx.push(rel, pos);
        }
        let mut times = TimeIndex::default();
        for (ts, rel) in [(100, 0), (110, 10), (120, 20), (130, 30)] {
            times.push(ts, rel);
        }
        let seg = SealedSegment {
            base: 1000,
            end: 1040,
            bytes: 16384,
            max_timestamp: 139,
            log_path: "/nowhere".into(),
            index: idx.encode_all(),
            time_index: times.encode_all(),
            aborted: Vec::new(),
        };
        assert_eq!(
            rebase(&seg, 1000, 0),
            (seg.index.clone(), seg.time_index.clone())
        );
        // From the batch at offset 1015, position 6000.
        let (i, t) = rebase(&seg, 1015, 6000);
        assert_eq!(
            OffsetIndex::decode(&i).entries(),
            [(0, 0), (5, 2192), (15, 6288)]
        );
        assert_eq!(TimeIndex::decode(&t).entries(), [(120, 5), (130, 15)]);
    }
}
