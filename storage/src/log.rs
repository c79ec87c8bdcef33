//! The partition log: an ordered list of segments, append, read, recovery,
//! truncation and retention.
//!
//! ## Watermarks
//! * **log end offset** — the offset the next appended record gets. An
//!   append is accepted (offsets assigned, readable from the cache) but not
//!   yet *visible*.
//! * **high watermark** (`written`) — every batch below it has been written
//!   to its segment with direct I/O: it survives a crash of the process.
//!   Reads never return data at or above it.
//! * **durable offset** — every batch below it has been fdatasync'd: it
//!   survives a power loss.
//!
//! ## Durability contract
//! * after [`PartitionLog::append`] returns, the batch has offsets and is
//!   queued in memory — nothing is on disk yet;
//! * after [`PartitionLog::append_acked`] returns, the batch is on disk as
//!   the topic's flush policy says: fdatasync'd with the default
//!   `flush.messages=1`, otherwise written (safe from a process crash) and
//!   fdatasync'd within `flush.messages` records or `flush.ms`;
//! * after [`PartitionLog::flush`] returns, everything appended before the
//!   call is fdatasync'd.
//!
//! ## Idempotent producers
//! A batch with a producer id is checked against the partition's
//! [`ProducerStateTable`] inside `append`, under the append lock and before
//! anything is queued: a sequence gap, an unknown producer or a fenced epoch
//! is refused with nothing written or cached; a retry of one of the
//! producer's last 5 batches is not appended again and returns the original
//! offsets with [`AppendInfo::duplicate`] set (it still waits in
//! [`PartitionLog::wait_acked`], as the original may not be durable yet).
//! The table is snapshotted to `producer.snapshot` (every
//! [`PRODUCER_SNAPSHOT_INTERVAL_BYTES`] appended, at every segment roll and
//! at `close`), each snapshot written only once the batches below its offset
//! are fdatasync'd; `open` loads it and replays the batches after it.
//!
//! ## Fault model
//! A process crash loses nothing written; a power loss loses nothing below
//! the durable offset. Segment files, the checkpoint, the clean-shutdown
//! marker and the snapshots are created or renamed with a directory fsync
//! before anything that depends on them is acknowledged; a new partition
//! directory is fsync'd into its parent by `open`. Tested with a real
//! SIGKILL (`tests/crash.rs`) and a simulated power loss that drops every
//! unsynced write and directory change at random (`tests/power_loss.rs`,
//! which also shows that a skipped fdatasync would be caught).
//!
//! ## Blocking calls
//! After `open`, a core's event loop makes no blocking file-system call for
//! a log: data goes through io_uring (glommio `DmaFile`: writes, truncation,
//! preallocation, fdatasync); directory fsyncs (segment roll, retention,
//! truncation), the atomically replaced small files (checkpoint in the
//! flush round when a segment is finalized, clean-shutdown marker, producer
//! snapshot, cleaner checkpoint), renames and removals run on glommio's
//! blocking thread pool ([`checkpoint::run_blocking`]), awaited in order.
//! `open` (recovery) does block: it lists the directory, reads the small
//! files and index files with `std::fs`, probes extents with `lseek`, and
//! may fsync the directory; it runs once per partition, at start-up or
//! when the partition is created. `delete` removes the directory on the
//! blocking pool.
//!
//! ## Concurrency
//! Everything runs on the owning core. `append_lock` orders appends and
//! excludes them during truncation; `io_lock` makes file mutations (flush
//! rounds, truncation, retention, close) one at a time. Lock order: append,
//! then io (then sync, then snapshot). The producer-snapshot writer takes
//! only `snapshot_lock`, which truncation, close and delete also take, so a
//! snapshot is never written over a cut it does not know of. No `RefCell`
//! borrow is held across an `.await`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_channel::oneshot;
use glommio::io::DmaFile;
use glommio::sync::Semaphore;
use weir_proto::batch::{self, BatchError, BatchHeader};

use crate::checkpoint::{self, Checkpoint};
use crate::cleaner::CleanerCheckpoint;
use crate::config::LogConfig;
use crate::epochs::EpochCache;
use crate::error::{Result, StorageError};
use crate::producer_state::{
    ActiveProducer, ProducerStateTable, Verdict, PRODUCER_SNAPSHOT_INTERVAL_BYTES,
};
use crate::segment::{self, FileKind, ScanSummary, Segment, SegmentState};
use crate::shard::{bump, probe_device, ShardInner, StorageShard};
use crate::sync_group::sync_files;
use crate::tail_writer::WriteJob;
use crate::txn::{self, AbortedTxn, Marker, MarkerKind};

/// Read-ahead of a cold read: at least this many bytes are read from disk.
pub const READ_AHEAD_BYTES: u64 = 256 << 10;
/// Bytes of one log's active segment written in one flush round; the rest
/// waits for the next round, which then overlaps this round's fdatasync.
pub const ROUND_LOG_BYTES_MAX: u64 = 8 << 20;
/// Flush rounds whose write completions a log remembers
/// ([`PartitionLog::written_at`]).
pub const WRITTEN_MARKS_MAX: usize = 64;
/// Largest single cold read.
pub const READ_BYTES_MAX: u64 = 16 << 20;
/// A sequential reader is kept this many bytes ahead: once fewer of the
/// bytes after its read are cached, the next this many are read in the
/// background (at most 1/16 of the core's cache; one read-ahead per log at
/// a time).
pub const READ_AHEAD_WINDOW_BYTES: u64 = 8 << 20;
/// A read-ahead reads in chunks of this size ...
pub const READ_AHEAD_CHUNK_BYTES: u64 = 1 << 20;
/// ... with this many in flight, so that the device has a queue to work on.
pub const READ_AHEAD_DEPTH: usize = 4;
/// A reader with this many batches cached ahead of it needs no read-ahead
/// yet, whatever their size (bounds the cache walk of every read).
const READ_AHEAD_BATCHES_ENOUGH: usize = 256;

/// Offsets assigned to an appended batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    /// Offset of the batch's first record.
    pub base_offset: u64,
    /// Offset of its last record.
    pub last_offset: u64,
    /// Records in the batch.
    pub records: u32,
    /// The batch is a retry of an idempotent producer's batch already in
    /// the log: nothing was appended, the offsets are the original batch's.
    pub duplicate: bool,
}

/// Batches returned by [`PartitionLog::read`].
#[derive(Debug, Clone, Default)]
pub struct ReadResult {
    /// Whole batches, in offset order, as stored (shared, not copied). The
    /// first may start before the requested offset (it contains it).
    pub batches: Vec<Bytes>,
    /// Offset to read next.
    pub next_offset: u64,
    /// High watermark at the time of the read.
    pub high_watermark: u64,
    /// Log start offset at the time of the read.
    pub log_start_offset: u64,
    /// Last stable offset at the time of the read (the high watermark, or
    /// below it the first offset of the oldest open transaction): a
    /// read-committed reader stops there.
    pub last_stable_offset: u64,
}

/// What opening a log found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Whether the previous shutdown was clean (no scan was needed).
    pub clean: bool,
    /// Segments found.
    pub segments: usize,
    /// Segments scanned (after a crash: the unfinalized ones).
    pub scanned_segments: usize,
    /// Bytes of data recovery cut from the log: for each scanned segment,
    /// from the end of its last valid batch to the end of the last non-zero
    /// byte after it (a torn or corrupt batch, garbage, a partial write,
    /// including zeros *between* such bytes); zeros after the last non-zero
    /// byte (preallocation, block padding, a zeroed tail) are not counted.
    /// Plus the whole size of segments removed after a gap in the offsets.
    pub truncated_bytes: u64,
    /// Index files rebuilt from the log.
    pub rebuilt_indexes: usize,
    /// Log start offset after opening.
    pub log_start_offset: u64,
    /// Log end offset after opening.
    pub log_end_offset: u64,
    /// Bytes of batches read to rebuild the idempotent-producer state (those
    /// after the producer snapshot; 0 after a clean close).
    pub producer_state_scanned_bytes: u64,
}

/// What a retention pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Segments deleted.
    pub segments_deleted: usize,
    /// Bytes deleted.
    pub bytes_deleted: u64,
    /// Log start offset afterwards.
    pub log_start_offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    Open,
    Recovering,
    Offline(String),
    Closed,
}

struct Waiter {
    upto: u64,
    durable: bool,
    tx: oneshot::Sender<Result<()>>,
}

pub(crate) struct LogState {
    pub(crate) config: LogConfig,
    pub(crate) segments: BTreeMap<u64, Segment>,
    pub(crate) log_start: u64,
    pub(crate) next_offset: u64,
    written: u64,
    durable: u64,
    appended_records: u64,
    synced_records: u64,
    /// Records a sync already decided on (perhaps still in flight) covers:
    /// `flush.messages` counts from here, so a round that overlaps the
    /// previous round's fdatasync does not sync again for the same records.
    sync_planned_records: u64,
    /// When the last rounds' writes finished: (written offset, instant),
    /// oldest first, at most [`WRITTEN_MARKS_MAX`] (for
    /// [`PartitionLog::written_at`]).
    written_marks: std::collections::VecDeque<(u64, Instant)>,
    last_sync: Instant,
    force_sync: bool,
    recovery_point: u64,
    waiters: Vec<Waiter>,
    /// [`PartitionLog::wait_appended`]'s waiters: (log end awaited, waker).
    append_waiters: Vec<(u64, oneshot::Sender<Result<()>>)>,
    mode: Mode,
    /// `delete` ran (or runs): a second one does nothing (the directory
    /// may hold a new log by then).
    deleted: bool,
    /// Idempotent-producer state of the batches below `next_offset`.
    producers: ProducerStateTable,
    /// The aborted transactions whose abort marker each segment (by base)
    /// holds, in marker order (see [`crate::txn`]).
    aborted: BTreeMap<u64, Vec<AbortedTxn>>,
    /// Segments whose `.txnindex` file lags `aborted` (written with the
    /// next producer snapshot, before it).
    aborted_dirty: std::collections::BTreeSet<u64>,
    /// Bytes appended since the last snapshot was taken.
    snapshot_bytes: u64,
    /// A snapshot `(offset, table)` waiting for `durable` to reach its offset.
    snapshot_pending: Option<(u64, ProducerStateTable)>,
    /// Offset of the snapshot file on disk, if any.
    snapshot_on_disk: Option<u64>,
    /// Bumped by truncation, close and delete: a snapshot taken before is
    /// not written.
    snapshot_gen: u64,
    /// A snapshot writer task is running.
    snapshot_writing: bool,
    /// Where compaction stands (see `cleaner`).
    pub(crate) cleaner: CleanerCheckpoint,
    /// After close: the log's size and segment bases (the segments and
    /// their files are gone).
    closed_view: Option<(u64, Vec<u64>)>,
    /// Leader epochs and where each starts (see [`crate::epochs`]).
    epochs: EpochCache,
    /// The epoch this replica leads at: stamped into every batch
    /// [`PartitionLog::append`] takes (`None`: batches keep theirs).
    leader_epoch: Option<u32>,
}

impl LogState {
    /// A cursor at `offset` in the segment holding it; with `or_next`, in
    /// the next segment if `offset` falls in a gap.
    fn cursor_at(&self, offset: u64, or_next: bool) -> Option<crate::segment::SegmentCursor> {
        self.segments
            .range(..=offset)
            .next_back()
            .filter(|(_, s)| s.next_offset > offset)
            .or_else(|| {
                or_next
                    .then(|| self.segments.range(offset..).next())
                    .flatten()
            })
            .map(|(_, s)| s.cursor(s.floor(offset)))
    }

    /// Records an appended batch (`bytes`, in the segment at `seg_base`) in
    /// the producer state, and an abort marker in that segment's
    /// aborted-transaction index.
    fn record_batch(&mut self, h: &BatchHeader, bytes: &[u8], seg_base: u64, partition: &str) {
        record_batch(
            &mut self.producers,
            &mut self.aborted,
            h,
            bytes,
            seg_base,
            partition,
        )
        .then(|| self.aborted_dirty.insert(seg_base));
    }

    /// The aborted-transaction index of segments `merged` joins segment
    /// `into`'s (the cleaner replaced them by one segment).
    pub(crate) fn merge_aborted(&mut self, into: u64, merged: impl Iterator<Item = u64>) {
        for b in merged {
            self.aborted_dirty.remove(&b);
            if let Some(entries) = self.aborted.remove(&b) {
                self.aborted.entry(into).or_default().extend(entries);
                self.aborted_dirty.insert(into);
            }
        }
    }

    /// Every aborted transaction the log indexes.
    pub(crate) fn aborted_entries(&self) -> impl Iterator<Item = &AbortedTxn> {
        self.aborted.values().flatten()
    }

    /// The first offset of the oldest open transaction.
    pub(crate) fn first_unstable_offset(&self) -> Option<u64> {
        self.producers.first_unstable_offset()
    }

    /// The last stable offset: the high watermark, or below it the first
    /// offset of the oldest open transaction.
    fn last_stable_offset(&self) -> u64 {
        let hw = self.written;
        self.producers
            .first_unstable_offset()
            .map_or(hw, |f| f.min(hw))
    }

    /// Takes a snapshot of the producer state as of `offset` (the log end)
    /// unless one is already waiting to be written.
    fn take_snapshot(&mut self, offset: u64) {
        if self.snapshot_pending.is_none() {
            self.snapshot_pending = Some((offset, self.producers.clone()));
            self.snapshot_bytes = 0;
        }
    }
}

pub(crate) struct LogInner {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) dir: PathBuf,
    pub(crate) shard: Rc<ShardInner>,
    append_lock: Semaphore,
    io_lock: Semaphore,
    sync_lock: Semaphore,
    snapshot_lock: Semaphore,
    /// One cleaner pass at a time.
    pub(crate) clean_lock: Semaphore,
    pub(crate) in_dirty: Cell<bool>,
    /// Opening a segment's `O_DSYNC` descriptor failed once: this log
    /// writes and fdatasyncs every round.
    write_through_off: Cell<bool>,
    /// Bumped whenever batches of this log leave the cache because the
    /// log changed under them (truncation, retention, compaction, close):
    /// a read that started before must not put what it read back.
    cache_gen: Cell<u64>,
    /// A read-ahead in flight: where it started and the reads waiting for
    /// it (see [`PartitionLog::read`]).
    read_ahead: RefCell<Option<ReadAheadRun>>,
    /// Read-aheads started (numbers them).
    read_ahead_runs: Cell<u64>,
    /// The streams of reads followed: a read continuing one is
    /// sequential (its read-ahead may start).
    read_streams: RefCell<crate::read_streams::ReadStreams>,
    /// Tiered storage: the offset below which every record is in the
    /// remote tier (committed remote metadata); with
    /// `remote.storage.enable`, local retention deletes only segments
    /// ending at or below it. 0: nothing is remote.
    remote_end: Cell<u64>,
    pub(crate) state: RefCell<LogState>,
}

/// A closed segment, as tiered storage uploads it
/// ([`PartitionLog::sealed_segments`]).
#[derive(Debug, Clone)]
pub struct SealedSegment {
    /// Offset of its first record (its base).
    pub base: u64,
    /// Offset after its last record.
    pub end: u64,
    /// Bytes of its `.log` file holding batches.
    pub bytes: u64,
    /// Largest record timestamp.
    pub max_timestamp: i64,
    /// Its `.log` file.
    pub log_path: PathBuf,
    /// Its offset index, encoded as in the `.index` file (exact: no
    /// padding).
    pub index: Vec<u8>,
    /// Its time index, encoded as in the `.timeindex` file.
    pub time_index: Vec<u8>,
    /// The aborted transactions whose abort marker it holds (its
    /// `.txnindex`).
    pub aborted: Vec<crate::txn::AbortedTxn>,
}

/// A read-ahead in flight (see [`PartitionLog::read`]).
struct ReadAheadRun {
    id: u64,
    /// Where it started.
    from: u64,
    /// Reads waiting for it: woken at each batch it caches, and when it ends.
    waiters: Vec<oneshot::Sender<()>>,
}

/// One partition's log, owned by one core. Cheap to clone (a reference).
#[derive(Clone)]
pub struct PartitionLog {
    pub(crate) inner: Rc<LogInner>,
}

impl std::fmt::Debug for PartitionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionLog")
            .field("name", &self.inner.name)
            .finish()
    }
}

type JobOutcome = (u64, FileKind, Result<crate::tail_writer::Written>);

/// Runs write jobs concurrently on this core.
async fn run_jobs(jobs: Vec<(u64, FileKind, WriteJob)>) -> Vec<JobOutcome> {
    let tasks: Vec<_> = jobs
        .into_iter()
        .map(|(b, k, j)| glommio::spawn_local(async move { (b, k, j.run().await) }))
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await);
    }
    out
}

/// Removes the files of the segments at `bases` and fsyncs the directory,
/// on the blocking pool.
async fn remove_segments_durably(dir: &Path, bases: &[u64]) -> Result<()> {
    let files = bases
        .iter()
        .flat_map(|&b| {
            segment::paths(dir, b)
                .into_iter()
                .chain([txn_index_path(dir, b)])
        })
        .collect();
    checkpoint::remove_files_durably(dir, files).await
}

/// Records a batch in `producers` (see [`LogState::record_batch`]); an
/// abort marker closing a transaction adds an entry to `aborted` at
/// `seg_base`. Whether `aborted` changed.
fn record_batch(
    producers: &mut ProducerStateTable,
    aborted: &mut BTreeMap<u64, Vec<AbortedTxn>>,
    h: &BatchHeader,
    bytes: &[u8],
    seg_base: u64,
    partition: &str,
) -> bool {
    if !h.attributes.is_control() {
        producers.record(h);
        return false;
    }
    let marker = match txn::marker_of(bytes) {
        Ok(m) => m,
        Err(why) => {
            // Kafka's other control records (none are written here) carry
            // no transaction: left alone.
            tracing::debug!(
                partition,
                offset = h.base_offset,
                why,
                "control batch without a marker"
            );
            return false;
        }
    };
    let offset = h.base_offset as u64;
    let first = producers.record_marker(h.producer_id, h.producer_epoch, offset);
    match (marker.kind, first) {
        (MarkerKind::Abort, Some(first_offset)) => {
            let lso = producers.first_unstable_offset().unwrap_or(offset + 1);
            aborted.entry(seg_base).or_default().push(AbortedTxn {
                producer_id: h.producer_id,
                first_offset,
                last_offset: offset,
                last_stable_offset: lso,
            });
            true
        }
        _ => false,
    }
}

/// Reads the aborted-transaction index files of the segments at `bases`
/// (blocking; a segment without one has no aborted transaction as far as
/// the files know). `Err` names an unusable file.
fn read_txn_indexes(
    dir: &Path,
    bases: &[u64],
) -> std::result::Result<BTreeMap<u64, Vec<AbortedTxn>>, String> {
    let mut out = BTreeMap::new();
    for &b in bases {
        let path = txn_index_path(dir, b);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let entries =
                    txn::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
                if !entries.is_empty() {
                    out.insert(b, entries);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    Ok(out)
}

/// Writes aborted-transaction index files atomically and durably
/// (blocking): an empty one is removed.
fn write_txn_indexes(dir: &Path, files: &[(PathBuf, Vec<u8>)]) -> Result<()> {
    for (path, bytes) in files {
        if bytes.is_empty() {
            checkpoint::remove_file(path)?;
        } else {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .expect("an index file name");
            checkpoint::write_atomic(dir, name, bytes)?;
        }
    }
    checkpoint::sync_dir(dir)
}

/// Path of segment `base`'s aborted-transaction index.
pub(crate) fn txn_index_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!(
        "{}.{}",
        segment::file_stem(base),
        txn::INDEX_SUFFIX
    ))
}

enum RoundError {
    Write(StorageError),
    Sync(StorageError),
}

impl PartitionLog {
    /// Opens (or creates) the log in `dir` (`<topic>-<partition>`), owned by
    /// `shard`'s core, and recovers it (see `docs/storage-format.md`):
    /// after a clean shutdown nothing is scanned; after a crash the segments
    /// not known to be closed cleanly are scanned and cut after their last
    /// valid batch, and their indexes rebuilt. The idempotent-producer state
    /// is then loaded from `producer.snapshot` and the batches after it (all
    /// of them if the snapshot is missing, damaged or past the log end).
    pub async fn open(
        shard: &StorageShard,
        dir: impl Into<PathBuf>,
        config: LogConfig,
    ) -> Result<(PartitionLog, RecoveryReport)> {
        let dir: PathBuf = dir.into();
        if !dir.is_dir() {
            std::fs::create_dir_all(&dir)
                .map_err(|e| StorageError::io("create directory", &dir, e))?;
            // The new directory's name must survive a power loss with the
            // data acknowledged in it.
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                checkpoint::sync_dir(parent)?;
            }
        }
        probe_device(&dir).await?;
        let sh = shard.inner.clone();
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| dir.display().to_string());
        let now = sh.clock.now_ms();
        let step = prealloc_step(sh.config.prealloc_step, config.segment_bytes);
        crate::cleaner::recover_swaps(&dir)?;
        let clean_leo = checkpoint::take_clean_marker(&dir)?;
        let ckpt = Checkpoint::load(&dir)?.unwrap_or_default();

        let mut bases = Vec::new();
        let entries = std::fs::read_dir(&dir).map_err(|e| StorageError::io("list", &dir, e))?;
        for e in entries {
            let e = e.map_err(|e| StorageError::io("list", &dir, e))?;
            let fname = e.file_name().to_string_lossy().into_owned();
            if let Some(b) = segment::parse_log_file_name(&fname) {
                bases.push(b);
            } else if fname.ends_with(".tmp") {
                let _ = checkpoint::remove_file(&e.path());
            }
        }
        bases.sort_unstable();

        let mut report = RecoveryReport {
            clean: clean_leo.is_some(),
            segments: bases.len(),
            ..Default::default()
        };
        let mut segments = BTreeMap::new();
        let n = bases.len();
        for (i, &base) in bases.iter().enumerate() {
            let last = i + 1 == n;
            let mut seg = Segment::open(&dir, base, now, step).await?;
            let trusted = (clean_leo.is_some() || base < ckpt.recovery_point)
                && trust_closed(&mut seg).await?;
            if !trusted {
                recover_segment(&mut seg, &config, &mut report, &sh).await?;
                if !last {
                    seg.state = SegmentState::Sealed;
                }
            }
            if last {
                seg.state = SegmentState::Active;
                if let Some((t, _)) = seg.time_index.entries().first() {
                    seg.created_ms = (*t).min(now);
                }
            }
            segments.insert(base, seg);
        }
        if let (Some(leo), Some(seg)) = (clean_leo, segments.values().next_back()) {
            if seg.next_offset != leo {
                tracing::warn!(partition = %name, marker = leo, found = seg.next_offset,
                    "clean-shutdown marker disagrees with the log; recovering the active segment");
                let base = seg.base;
                let seg = segments.get_mut(&base).expect("present");
                recover_segment(seg, &config, &mut report, &sh).await?;
            }
        }
        // Each segment starts where the previous one ends. After a crash a
        // roll can be on disk while the end of the previous segment is not
        // (batches are written after the roll, in the background), and a
        // truncation can be cut short before it removed the later segments.
        // Nothing after such a gap was acknowledged: remove it, as Kafka
        // does after a truncation, so that no offset below the log end is
        // missing.
        let gap = segments
            .values()
            .zip(segments.values().skip(1))
            .find(|(a, b)| a.next_offset != b.base)
            .map(|(a, b)| (a.base, a.next_offset, b.base));
        if let Some((keep, end, next_base)) = gap {
            tracing::warn!(partition = %name, end, next_base,
                "segments after a gap in the offsets were not acknowledged; removing them");
            let doomed: Vec<u64> = segments.range(keep + 1..).map(|(b, _)| *b).collect();
            for b in &doomed {
                if let Some(seg) = segments.remove(b) {
                    report.truncated_bytes += seg.size();
                    bump(&sh.counters.recovery_truncated_bytes, seg.size());
                }
            }
            remove_segments_durably(&dir, &doomed).await?;
            let seg = segments.get_mut(&keep).expect("kept");
            seg.state = SegmentState::Active;
            if let Some((t, _)) = seg.time_index.entries().first() {
                seg.created_ms = (*t).min(now);
            }
        }
        if segments.is_empty() {
            let base = ckpt.log_start_offset;
            segments.insert(base, Segment::create(&dir, base, now, step).await?);
        }
        let first = *segments.keys().next().expect("one segment");
        // The active segment takes appends from now on, so it is no longer
        // closed cleanly even if the checkpoint says so (a clean shutdown
        // moves the recovery point past it): lower the recovery point to it,
        // durably before the first append, so that a crash leads to a scan.
        let active_base = *segments.keys().next_back().expect("one segment");
        let recovery_point = ckpt.recovery_point.min(active_base);
        let next_offset = segments.values().next_back().expect("one").next_offset;
        let log_start = ckpt.log_start_offset.max(first).min(next_offset);
        report.log_start_offset = log_start;
        report.log_end_offset = next_offset;
        if report.truncated_bytes > 0 {
            tracing::warn!(partition = %name, bytes = report.truncated_bytes,
                "recovery cut a torn or corrupt tail");
        }
        let needs_round = segments.values().any(|s| {
            s.state == SegmentState::Sealed
                || s.log.has_work()
                || s.index_w.has_work()
                || s.time_w.has_work()
                || s.has_unreleased()
        });
        let dir_for_cleaner = dir.clone();
        let epochs = EpochCache::load(&dir, next_offset)?;
        let inner = Rc::new(LogInner {
            id: sh.next_log_id(),
            name,
            dir,
            shard: sh.clone(),
            append_lock: Semaphore::new(1),
            io_lock: Semaphore::new(1),
            sync_lock: Semaphore::new(1),
            snapshot_lock: Semaphore::new(1),
            clean_lock: Semaphore::new(1),
            in_dirty: Cell::new(false),
            write_through_off: Cell::new(false),
            cache_gen: Cell::new(0),
            read_ahead: RefCell::new(None),
            read_ahead_runs: Cell::new(0),
            read_streams: RefCell::default(),
            remote_end: Cell::new(0),
            state: RefCell::new(LogState {
                config,
                segments,
                log_start,
                next_offset,
                written: next_offset,
                durable: next_offset,
                appended_records: 0,
                synced_records: 0,
                sync_planned_records: 0,
                written_marks: std::collections::VecDeque::new(),
                last_sync: Instant::now(),
                force_sync: false,
                recovery_point,
                waiters: Vec::new(),
                append_waiters: Vec::new(),
                mode: Mode::Open,
                deleted: false,
                producers: ProducerStateTable::new(),
                aborted: BTreeMap::new(),
                aborted_dirty: Default::default(),
                snapshot_bytes: 0,
                snapshot_pending: None,
                snapshot_on_disk: None,
                snapshot_gen: 0,
                snapshot_writing: false,
                cleaner: CleanerCheckpoint::load(&dir_for_cleaner),
                closed_view: None,
                epochs,
                leader_epoch: None,
            }),
        });
        sh.register(&inner);
        let log = PartitionLog { inner };
        if needs_round {
            // Make recovery's cuts durable before new data lands on them.
            log.inner.state.borrow_mut().force_sync = true;
            log.inner.flush_round(oneshot::channel().0, false).await;
            log.inner.check_mode()?;
        }
        if recovery_point != ckpt.recovery_point {
            log.inner.store_checkpoint().await?;
        }
        report.producer_state_scanned_bytes = log.inner.load_producer_state().await?;
        Ok((log, report))
    }

    /// `topic-partition` (the directory name).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The directory holding the segments.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The current configuration.
    pub fn config(&self) -> LogConfig {
        self.inner.state.borrow().config.clone()
    }

    /// Replaces the configuration (takes effect at the next append, flush
    /// round or retention pass).
    pub fn set_config(&self, config: LogConfig) {
        self.inner.state.borrow_mut().config = config;
    }

    /// First offset that can be read.
    pub fn log_start_offset(&self) -> u64 {
        self.inner.state.borrow().log_start
    }

    /// Offset the next appended record will get.
    pub fn log_end_offset(&self) -> u64 {
        self.inner.state.borrow().next_offset
    }

    /// Every batch below this offset is written to disk (readable).
    pub fn high_watermark(&self) -> u64 {
        self.inner.state.borrow().written
    }

    /// Every batch below this offset is fdatasync'd.
    pub fn durable_offset(&self) -> u64 {
        self.inner.state.borrow().durable
    }

    /// Bytes of log (sum of segment sizes, indexes not included).
    pub fn size_bytes(&self) -> u64 {
        let st = self.inner.state.borrow();
        match &st.closed_view {
            Some((size, _)) => *size,
            None => st.segments.values().map(|s| s.size()).sum(),
        }
    }

    /// Bytes of log from `offset` to the log end (0 at or past it): from
    /// the last index entry at or below `offset`, so over by at most
    /// `index.interval.bytes`. What a follower at `offset` has to fetch.
    pub fn bytes_from(&self, offset: u64) -> u64 {
        let st = self.inner.state.borrow();
        if offset >= st.next_offset {
            return 0;
        }
        let first = st
            .segments
            .range(..=offset)
            .next_back()
            .map_or(0, |(b, _)| *b);
        st.segments
            .range(first..)
            .map(|(b, s)| {
                let from = if *b == first { s.floor(offset).1 } else { 0 };
                s.size().saturating_sub(from)
            })
            .sum()
    }

    /// Number of segments.
    pub fn segment_count(&self) -> usize {
        self.segment_bases().len()
    }

    /// Tiered storage: every record below `end` is in the remote tier
    /// (its metadata committed), so local retention may delete the
    /// segments wholly below it. Never lowered.
    pub fn set_remote_end(&self, end: u64) {
        let e = &self.inner.remote_end;
        e.set(e.get().max(end));
    }

    /// Tiered storage: the offset below which records are remote, as last
    /// set.
    pub fn remote_end(&self) -> u64 {
        self.inner.remote_end.get()
    }

    /// Closed segments (not the active one) that end at or below `upto`
    /// and after `from`, oldest first: what tiered storage may upload.
    pub fn sealed_segments(&self, from: u64, upto: u64) -> Vec<SealedSegment> {
        let st = self.inner.state.borrow();
        let active = st.segments.keys().next_back().copied();
        st.segments
            .values()
            .filter(|s| {
                Some(s.base) != active
                    && s.state == SegmentState::Finalized
                    && s.next_offset > from
                    && s.next_offset <= upto
                    && s.next_offset > s.base
            })
            .map(|s| SealedSegment {
                base: s.base,
                end: s.next_offset,
                bytes: s.size(),
                max_timestamp: s.max_timestamp,
                log_path: crate::segment::paths(&self.inner.dir, s.base)[0].clone(),
                index: s.index.encode_all(),
                time_index: s.time_index.encode_all(),
                aborted: st.aborted.get(&s.base).cloned().unwrap_or_default(),
            })
            .collect()
    }

    /// Base offsets of the segments, in order.
    pub fn segment_bases(&self) -> Vec<u64> {
        let st = self.inner.state.borrow();
        match &st.closed_view {
            Some((_, bases)) => bases.clone(),
            None => st.segments.keys().copied().collect(),
        }
    }

    /// Appends one validated batch: checks framing, magic and CRC, and for
    /// a batch with a producer id its epoch and sequence (see the module
    /// docs), rejects it with nothing written if anything is wrong, assigns
    /// offsets by rewriting the base offset (the rest of the batch is stored
    /// byte for byte) and queues it for the next flush round.
    ///
    /// A retry of one of the producer's last batches is not appended: the
    /// original batch's offsets are returned with `duplicate` set.
    ///
    /// After this returns the batch is in memory only; see
    /// [`PartitionLog::wait_acked`], [`PartitionLog::append_acked`] and
    /// [`PartitionLog::wait_durable`].
    pub async fn append(&self, data: BytesMut) -> Result<AppendInfo> {
        self.append_as(data, false).await
    }

    /// Appends a batch a follower fetched from its leader, byte for byte:
    /// its base offset must be this log's end (else
    /// [`StorageError::ReplicaGap`] and nothing changes), its CRC must
    /// hold, and its leader epoch (stamped by the leader) starts a new
    /// entry of the epoch cache if it is newer. The leader already checked
    /// the producer's sequence; the producer state records the batch, so a
    /// follower that becomes leader knows every producer.
    pub async fn append_replica(&self, data: BytesMut) -> Result<AppendInfo> {
        self.append_as(data, true).await
    }

    /// Makes this replica the leader at `epoch` (its appends are stamped
    /// with it; the epoch starts at the next offset appended), or a
    /// follower (`None`).
    pub fn set_leader_epoch(&self, epoch: Option<u32>) {
        self.inner.state.borrow_mut().leader_epoch = epoch;
    }

    /// The newest leader epoch in this log and where it starts.
    pub fn latest_epoch(&self) -> Option<(u32, u64)> {
        self.inner.state.borrow().epochs.latest()
    }

    /// Where `epoch` ends in this log (OffsetForLeaderEpoch, see
    /// [`EpochCache::end_offset_for`]).
    pub fn end_offset_for_epoch(&self, epoch: u32) -> Option<(u32, u64)> {
        let st = self.inner.state.borrow();
        st.epochs.end_offset_for(epoch, st.next_offset)
    }

    /// Every leader epoch of this log with its start offset, oldest first.
    pub fn leader_epochs(&self) -> Vec<(u32, u64)> {
        self.inner.state.borrow().epochs.entries().to_vec()
    }

    /// Appends several batches of one request in order, with no other
    /// append between them, so that their offsets are contiguous (unless
    /// one is a duplicate of a retried batch). A batch refused for itself
    /// (framing, CRC, size, no records, keys of a compacted topic) refuses
    /// them all before any is appended; otherwise it stops at the first
    /// refused batch (producer sequence, I/O): the offsets of those
    /// appended before it, and its error.
    pub async fn append_many(
        &self,
        batches: Vec<BytesMut>,
    ) -> (Vec<AppendInfo>, Option<StorageError>) {
        self.append_many_guarded(batches, None).await
    }

    /// The guard of a transactional write of `producer_id` about to be
    /// verified with its coordinator (see
    /// [`PartitionLog::append_many_guarded`]).
    pub fn txn_guard(&self, producer_id: i64) -> crate::producer_state::TxnGuard {
        self.inner.state.borrow().producers.txn_guard(producer_id)
    }

    /// [`PartitionLog::append_many`] of a transactional producer's batches
    /// verified under `guard`: refused
    /// ([`StorageError::TransactionEnded`]) if a batch would open a
    /// transaction and a marker of the producer came after the guard was
    /// taken — checked under the append order, which markers take too.
    pub async fn append_many_guarded(
        &self,
        batches: Vec<BytesMut>,
        guard: Option<crate::producer_state::TxnGuard>,
    ) -> (Vec<AppendInfo>, Option<StorageError>) {
        let inner = &self.inner;
        let mut done = Vec::with_capacity(batches.len());
        // What can be refused without the log's state is checked for every
        // batch first: such a refusal appends none of them.
        let mut headers = Vec::with_capacity(batches.len());
        for data in &batches {
            match self.check_produced(data) {
                Ok(h) => headers.push(h),
                Err(e) => return (done, Some(e)),
            }
        }
        let Ok(_order) = inner.append_lock.acquire_permit(1).await else {
            return (done, Some(inner.closed()));
        };
        if let Some(g) = guard {
            if !inner.state.borrow().producers.guard_holds(&g) {
                return (
                    done,
                    Some(StorageError::TransactionEnded {
                        partition: inner.name.clone(),
                        producer_id: g.producer_id,
                    }),
                );
            }
        }
        for (data, h) in batches.into_iter().zip(headers) {
            match self.append_locked(data, false, Some(h)).await {
                Ok(info) => done.push(info),
                Err(e) => return (done, Some(e)),
            }
        }
        (done, None)
    }

    /// Appends the marker that ends producer `producer_id`'s transaction
    /// (the transaction coordinator's write; see [`crate::txn`]) at the
    /// producer's `epoch`: a commit makes the transaction's records
    /// readable committed, an abort adds it to the aborted-transaction
    /// index; either way the last stable offset moves past it. A marker of
    /// an epoch older than the producer's is refused
    /// ([`StorageError::InvalidProducerEpoch`]). Durable as any append.
    pub async fn append_marker(
        &self,
        producer_id: i64,
        epoch: i16,
        marker: Marker,
        timestamp: i64,
    ) -> Result<AppendInfo> {
        let inner = &self.inner;
        let data = txn::marker_batch(producer_id, epoch, marker, timestamp);
        let h = self.check_whole(&data)?;
        let _order = inner
            .append_lock
            .acquire_permit(1)
            .await
            .map_err(|_| inner.closed())?;
        self.check_not_fenced(producer_id, epoch)?;
        self.append_locked(data, false, Some(h)).await
    }

    /// Appends a transaction coordinator's transactional batch (Kafka's
    /// offsets committed in a transaction, written to `__consumer_offsets`
    /// with the producer's id and epoch and no sequence): checked as a
    /// produced batch, but not against the producer's sequence (it is not
    /// the producer's write); it opens the producer's transaction here
    /// like any transactional batch, and its marker closes it.
    pub async fn append_unsequenced(&self, data: BytesMut) -> Result<AppendInfo> {
        let inner = &self.inner;
        let h = self.check_produced(&data)?;
        if h.producer_id < 0 || h.base_sequence >= 0 || !h.attributes.is_transactional() {
            return Err(StorageError::InvalidBatch {
                partition: inner.name.clone(),
                source: BatchError::Records(
                    "an unsequenced batch is a producer's transactional one without a sequence",
                ),
            });
        }
        let _order = inner
            .append_lock
            .acquire_permit(1)
            .await
            .map_err(|_| inner.closed())?;
        self.check_not_fenced(h.producer_id, h.producer_epoch)?;
        self.append_checked(data, false, Some(h), true).await
    }

    /// Refuses a write of producer `producer_id` at an epoch older than
    /// the one the log knows (the producer was fenced).
    fn check_not_fenced(&self, producer_id: i64, epoch: i16) -> Result<()> {
        let inner = &self.inner;
        let producers = &inner.state.borrow().producers;
        match producers
            .get(producer_id)
            .map(|e| e.epoch)
            .filter(|&c| c > epoch)
        {
            Some(current) => Err(StorageError::InvalidProducerEpoch {
                partition: inner.name.clone(),
                producer_id,
                epoch,
                current,
            }),
            None => Ok(()),
        }
    }

    /// The last stable offset: the high watermark, or below it the first
    /// offset of the oldest open transaction (a read-committed reader reads
    /// below it).
    pub fn last_stable_offset(&self) -> u64 {
        self.inner.state.borrow().last_stable_offset()
    }

    /// The open transactions: `(producer id, first offset)`, oldest first.
    pub fn open_transactions(&self) -> Vec<(i64, u64)> {
        self.inner
            .state
            .borrow()
            .producers
            .open_transactions()
            .collect()
    }

    /// The producers this partition remembers (Kafka's
    /// DescribeProducers), by producer id.
    pub fn producers(&self) -> Vec<ActiveProducer> {
        let st = self.inner.state.borrow();
        let mut out: Vec<ActiveProducer> = st
            .producers
            .iter()
            .map(|(producer_id, e)| ActiveProducer {
                producer_id,
                epoch: e.epoch,
                last_sequence: e.last_batch().map_or(-1, |b| b.last_seq),
                last_timestamp: e.last_timestamp,
                txn_first_offset: e.txn_first_offset,
            })
            .collect();
        out.sort_by_key(|p| p.producer_id);
        out
    }

    /// The aborted transactions a read-committed read of `[from, upto)`
    /// must skip: those that ended at or after `from` and began before
    /// `upto`, in marker order — from the aborted-transaction index of the
    /// segment holding `from` onwards, stopping at an entry whose last
    /// stable offset reaches `upto` (every transaction that began below
    /// `upto` had ended by then: Kafka's rule).
    pub fn aborted_transactions(&self, from: u64, upto: u64) -> Vec<AbortedTxn> {
        let st = self.inner.state.borrow();
        let first_seg = st
            .segments
            .range(..=from)
            .next_back()
            .map_or(0, |(&b, _)| b);
        let mut out = Vec::new();
        for entries in st.aborted.range(first_seg..).map(|(_, e)| e) {
            for e in entries {
                if e.last_offset >= from && e.first_offset < upto {
                    out.push(*e);
                }
                if e.last_stable_offset >= upto {
                    return out;
                }
            }
        }
        out
    }

    async fn append_as(&self, data: BytesMut, replica: bool) -> Result<AppendInfo> {
        let inner = &self.inner;
        let _order = inner
            .append_lock
            .acquire_permit(1)
            .await
            .map_err(|_| inner.closed())?;
        self.append_locked(data, replica, None).await
    }

    /// One whole, valid batch (framing, CRC) of at least one record (or a
    /// control batch) and nothing after it.
    fn check_whole(&self, data: &[u8]) -> Result<BatchHeader> {
        let inner = &self.inner;
        let h = batch::validate(data).map_err(|source| StorageError::InvalidBatch {
            partition: inner.name.clone(),
            source,
        })?;
        if h.total_len() != data.len() {
            return Err(StorageError::TrailingBytes {
                partition: inner.name.clone(),
                batch_len: h.total_len(),
                buf_len: data.len(),
            });
        }
        if h.records_count == 0 && !h.attributes.is_control() {
            return Err(StorageError::InvalidBatch {
                partition: inner.name.clone(),
                source: BatchError::Records("a produced batch must hold at least one record"),
            });
        }
        Ok(h)
    }

    /// The checks of a produced batch that do not depend on the log's
    /// state: [`PartitionLog::check_whole`], `max.message.bytes`, keys on a
    /// compacted topic.
    fn check_produced(&self, data: &[u8]) -> Result<BatchHeader> {
        let inner = &self.inner;
        let h = self.check_whole(data)?;
        let (max, policy) = {
            let st = inner.state.borrow();
            (st.config.max_message_bytes, st.config.cleanup_policy)
        };
        if data.len() as u64 > max {
            return Err(StorageError::BatchTooLarge {
                partition: inner.name.clone(),
                size: data.len(),
                max,
            });
        }
        if h.attributes.is_control() {
            // Markers are the transaction coordinator's (append_marker).
            return Err(StorageError::InvalidBatch {
                partition: inner.name.clone(),
                source: BatchError::Records("a producer may not write a control batch"),
            });
        }
        if policy.compacts() {
            check_keys(&inner.name, policy, data)?;
        }
        Ok(h)
    }

    /// [`PartitionLog::append_as`] under the append lock; `checked`: the
    /// header [`PartitionLog::check_produced`] returned for it, if called.
    async fn append_locked(
        &self,
        data: BytesMut,
        replica: bool,
        checked: Option<BatchHeader>,
    ) -> Result<AppendInfo> {
        self.append_checked(data, replica, checked, false).await
    }

    /// [`PartitionLog::append_locked`]; `unsequenced`: a coordinator's
    /// batch, not checked against its producer's sequence.
    async fn append_checked(
        &self,
        mut data: BytesMut,
        replica: bool,
        checked: Option<BatchHeader>,
        unsequenced: bool,
    ) -> Result<AppendInfo> {
        let inner = &self.inner;
        inner.check_mode()?;
        let h = match checked {
            Some(h) => h,
            None if !replica => self.check_produced(&data)?,
            None => self.check_whole(&data)?,
        };
        let (seg_bytes, seg_ms) = {
            let st = inner.state.borrow();
            (st.config.segment_bytes, st.config.segment_ms)
        };
        if replica {
            let (end, leading) = {
                let st = inner.state.borrow();
                (st.next_offset, st.leader_epoch)
            };
            if let Some(epoch) = leading {
                // Made leader while the fetch was in flight: the old
                // leader's batches must not land in the new leader's log.
                return Err(StorageError::Leading {
                    partition: inner.name.clone(),
                    epoch,
                });
            }
            if h.base_offset != end as i64 {
                return Err(StorageError::ReplicaGap {
                    partition: inner.name.clone(),
                    expected: end,
                    got: h.base_offset,
                });
            }
        }
        // A marker (append_marker's: a producer's control batch was
        // refused above) is not in its producer's sequence.
        let verdict = if replica || unsequenced || h.attributes.is_control() {
            Verdict::Append
        } else {
            inner.state.borrow().producers.check(&inner.name, &h)?
        };
        if let Verdict::Duplicate(orig) = verdict {
            tracing::debug!(partition = %inner.name, producer_id = h.producer_id,
                base_sequence = h.base_sequence, base_offset = orig.base_offset,
                "duplicate batch not appended");
            return Ok(AppendInfo {
                base_offset: orig.base_offset,
                last_offset: orig.last_offset,
                records: h.records_count.max(0) as u32,
                duplicate: true,
            });
        }
        let now = inner.shard.clock.now_ms();
        let roll_base = {
            let st = inner.state.borrow();
            let seg = st.segments.values().next_back().expect("active segment");
            let last = st.next_offset + h.last_offset_delta as u64;
            let full = seg.size() + data.len() as u64 > seg_bytes;
            let old = now.saturating_sub(seg.created_ms) >= seg_ms;
            let rel_overflow = last - seg.base > u32::MAX as u64;
            (!seg.is_empty() && (full || old || rel_overflow)).then_some(st.next_offset)
        };
        if let Some(base) = roll_base {
            let step = prealloc_step(
                inner.shard.config.prealloc_step,
                inner.state.borrow().config.segment_bytes,
            );
            let seg = Segment::create(&inner.dir, base, now, step).await?;
            let mut st = inner.state.borrow_mut();
            if let Some(active) = st.segments.values_mut().next_back() {
                active.state = SegmentState::Sealed;
            }
            st.segments.insert(base, seg);
            st.take_snapshot(base);
        }
        // The batch's leader epoch: this leader's (stamped), or the one
        // the leader stamped. A newer epoch is recorded durably before its
        // first batch lands.
        let epoch = {
            let st = inner.state.borrow();
            match (replica, st.leader_epoch) {
                (false, Some(e)) => Some(e),
                (false, None) => None,
                (true, _) => u32::try_from(h.partition_leader_epoch).ok(),
            }
        };
        if let Some(e) = epoch {
            if !replica {
                batch::set_partition_leader_epoch(&mut data, e as i32);
            }
            let newer = {
                let st = inner.state.borrow();
                let mut c = st.epochs.clone();
                c.assign(e, st.next_offset).then_some(c)
            };
            if let Some(c) = newer {
                c.store(&inner.dir).await?;
                inner.state.borrow_mut().epochs = c;
            }
        }
        let mut st = inner.state.borrow_mut();
        let base_offset = st.next_offset;
        if !replica {
            batch::set_base_offset(&mut data, base_offset as i64);
        }
        let h = BatchHeader {
            base_offset: base_offset as i64,
            partition_leader_epoch: epoch.map_or(h.partition_leader_epoch, |e| e as i32),
            ..h
        };
        let bytes = data.freeze();
        let interval = st.config.index_interval_bytes;
        let seg = st
            .segments
            .values_mut()
            .next_back()
            .expect("active segment");
        seg.append(bytes.clone(), &h, interval);
        let last_offset = h.last_offset() as u64;
        st.next_offset = last_offset + 1;
        st.appended_records += h.records_count.max(0) as u64;
        let seg_base = *st.segments.keys().next_back().expect("active segment");
        st.record_batch(&h, &bytes, seg_base, &inner.name);
        st.snapshot_bytes += bytes.len() as u64;
        if st.snapshot_bytes >= PRODUCER_SNAPSHOT_INTERVAL_BYTES {
            let end = st.next_offset;
            st.take_snapshot(end);
        }
        if !st.append_waiters.is_empty() {
            let end = st.next_offset;
            let (ready, waiting) = std::mem::take(&mut st.append_waiters)
                .into_iter()
                .partition::<Vec<_>, _>(|(upto, _)| *upto <= end);
            st.append_waiters = waiting;
            for (_, tx) in ready {
                let _ = tx.send(Ok(()));
            }
        }
        drop(st);
        inner
            .shard
            .cache
            .borrow_mut()
            .insert(inner.id, base_offset, last_offset, bytes.clone());
        bump(&inner.shard.counters.appends, 1);
        bump(&inner.shard.counters.appended_bytes, bytes.len() as u64);
        inner.shard.schedule(inner);
        Ok(AppendInfo {
            base_offset,
            last_offset,
            records: h.records_count.max(0) as u32,
            duplicate: false,
        })
    }

    /// Appends and waits until the batch is on disk as the flush policy says
    /// (fdatasync'd with the default `flush.messages=1`):
    /// [`PartitionLog::append`] then [`PartitionLog::wait_acked`].
    pub async fn append_acked(&self, data: BytesMut) -> Result<AppendInfo> {
        let info = self.append(data).await?;
        self.wait_acked(&info).await?;
        Ok(info)
    }

    /// Waits until an appended batch is on disk as the flush policy says:
    /// every batch up to `info.last_offset` fdatasync'd with the default
    /// `flush.messages=1`, otherwise written. A duplicate waits too (its
    /// original may not be durable yet).
    pub async fn wait_acked(&self, info: &AppendInfo) -> Result<()> {
        let durable = self.inner.state.borrow().config.sync_every_append();
        self.inner.wait(info.last_offset + 1, durable).await
    }

    /// When every batch below `upto` had been written, if that was within
    /// the last [`WRITTEN_MARKS_MAX`] flush rounds (a batch's time from
    /// append to written, and from written to durable, without waiting
    /// twice).
    pub fn written_at(&self, upto: u64) -> Option<Instant> {
        let st = self.inner.state.borrow();
        if st.written < upto {
            return None;
        }
        st.written_marks
            .iter()
            .find(|(w, _)| *w >= upto)
            .map(|(_, at)| *at)
    }

    /// Waits until every batch below `upto` is written (readable, safe from
    /// a process crash).
    pub async fn wait_written(&self, upto: u64) -> Result<()> {
        self.inner.wait(upto, false).await
    }

    /// Waits until every batch below `upto` is fdatasync'd.
    pub async fn wait_durable(&self, upto: u64) -> Result<()> {
        self.inner.wait(upto, true).await
    }

    /// Waits until the log ends past `upto - 1` (a batch holding it is
    /// appended, not necessarily written), or the log fails or closes.
    pub async fn wait_appended(&self, upto: u64) -> Result<()> {
        let inner = &self.inner;
        let rx = {
            let mut st = inner.state.borrow_mut();
            if st.next_offset >= upto {
                return Ok(());
            }
            drop(st);
            inner.check_mode()?;
            st = inner.state.borrow_mut();
            let (tx, rx) = oneshot::channel();
            st.append_waiters.retain(|(_, tx)| !tx.is_canceled());
            st.append_waiters.push((upto, tx));
            rx
        };
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(inner.closed()),
        }
    }

    /// A follower's read: as [`PartitionLog::read`], but batches appended
    /// and not yet written are served too, from the cache every append
    /// goes into — so a follower writes its copy beside the leader's own
    /// write instead of after it (Kafka's followers read the leader's page
    /// cache the same way). A batch no longer cached is read once written.
    ///
    /// What is served here may never be written: a failed write rolls the
    /// log back to its written offset, and a leader that went on after
    /// that in the same leader epoch would leave such a follower with
    /// batches it cannot tell apart from the leader's later ones. So only
    /// a log whose failed writes stop the process
    /// ([`crate::ShardConfig::on_write_failure`]) may serve this.
    ///
    /// Below the written offset this is [`PartitionLog::read`] (what is
    /// written first, with its read-ahead: a follower catching up reads
    /// as any sequential reader does); from there on, the cache.
    pub async fn read_appended(&self, offset: u64, max_bytes: u64) -> Result<ReadResult> {
        let end = self.log_end_offset();
        if offset >= self.high_watermark() && offset < end {
            if let Some(out) = self.read_cached_below(offset, max_bytes, Some(end))? {
                if !out.batches.is_empty() {
                    return Ok(out);
                }
            }
            // No longer cached: served once written.
            self.wait_written(offset + 1).await?;
        }
        self.read(offset, max_bytes).await
    }

    /// Makes everything appended so far durable; returns the durable offset.
    pub async fn flush(&self) -> Result<u64> {
        let upto = self.log_end_offset();
        self.inner.wait(upto, true).await?;
        Ok(self.durable_offset())
    }

    /// Reads whole batches from `offset` up to about `max_bytes` (at least
    /// one batch if any is readable, so a consumer always progresses). Never
    /// returns data at or above the high watermark. Hits in the core's cache
    /// are returned without copying; misses are read with direct I/O and
    /// what is read ahead is cached.
    pub async fn read(&self, offset: u64, max_bytes: u64) -> Result<ReadResult> {
        let inner = &self.inner;
        // The read-ahead this read waits for, if any.
        let mut waited_for = None;
        let mut cold_again = 3;
        let out = loop {
            if let Some(out) = self.read_cached(offset, max_bytes)? {
                if !out.batches.is_empty() {
                    inner.shard.cache.borrow_mut().count(true);
                }
                break out;
            }
            // A miss where a read-ahead is bringing the data in: wait for
            // it to get there (or end) rather than read the same bytes
            // twice. Only the first read-ahead seen is waited for.
            let wait = match &mut *inner.read_ahead.borrow_mut() {
                Some(run) if run.from <= offset && waited_for.is_none_or(|id| id == run.id) => {
                    waited_for = Some(run.id);
                    let (tx, rx) = oneshot::channel();
                    run.waiters.push(tx);
                    Some(rx)
                }
                _ => None,
            };
            match wait {
                Some(rx) => {
                    let _ = rx.await;
                }
                None => {
                    inner.shard.cache.borrow_mut().count(false);
                    let gen = inner.cache_gen.get();
                    let out = self.read_cold(offset, max_bytes, gen).await?;
                    // The log changed under the read (truncated and maybe
                    // written again at the same positions): read again,
                    // a few times at most.
                    if inner.cache_gen.get() != gen && cold_again > 0 {
                        cold_again -= 1;
                        continue;
                    }
                    break out;
                }
            }
        };
        let sequential = inner
            .read_streams
            .borrow_mut()
            .read(offset, out.next_offset);
        if sequential && !out.batches.is_empty() {
            self.read_ahead_after(out.next_offset);
        }
        Ok(out)
    }

    /// Starts a read-ahead after a sequential read that ended at `from`,
    /// unless one is in flight or enough after `from` is cached already
    /// (a tailing reader's data is: appends are cached).
    fn read_ahead_after(&self, from: u64) {
        let inner = &self.inner;
        if inner.read_ahead.borrow().is_some() || inner.check_mode().is_err() {
            return;
        }
        let window = READ_AHEAD_WINDOW_BYTES.min(inner.shard.cache.borrow().stats().budget / 16);
        if window < READ_AHEAD_CHUNK_BYTES {
            return;
        }
        let hw = inner.state.borrow().written;
        // What is cached after `from`: `window` bytes, or (small batches)
        // READ_AHEAD_BATCHES_ENOUGH batches, are enough for now.
        let (mut at, mut ahead, mut batches) = (from, 0u64, 0usize);
        {
            let cache = inner.shard.cache.borrow();
            while at < hw && ahead < window && batches < READ_AHEAD_BATCHES_ENOUGH {
                let Some(b) = cache.peek(inner.id, at) else {
                    break;
                };
                ahead += b.data.len() as u64;
                at = b.last_offset + 1;
                batches += 1;
            }
        }
        if at >= hw || ahead >= window || batches >= READ_AHEAD_BATCHES_ENOUGH {
            return;
        }
        let id = inner.read_ahead_runs.get() + 1;
        inner.read_ahead_runs.set(id);
        *inner.read_ahead.borrow_mut() = Some(ReadAheadRun {
            id,
            from: at,
            waiters: Vec::new(),
        });
        let log = self.clone();
        glommio::spawn_local(async move {
            if let Err(e) = log.read_ahead(at, window).await {
                tracing::debug!(partition = %log.inner.name, offset = at, error = %e, "read-ahead failed");
            }
            // Dropping the waiters' senders wakes them.
            log.inner.read_ahead.borrow_mut().take();
        })
        .detach();
    }

    /// Reads about `window` bytes of the segment holding `at` from `at` on
    /// into the cache, waking waiting reads as batches arrive.
    async fn read_ahead(&self, at: u64, window: u64) -> Result<()> {
        let inner = &self.inner;
        let gen = inner.cache_gen.get();
        let (cur, hw) = {
            let st = inner.state.borrow();
            (st.cursor_at(at, false), st.written)
        };
        let Some(cur) = cur else {
            return Ok(());
        };
        let mut stream =
            crate::segment::SegmentStream::new(cur, READ_AHEAD_CHUNK_BYTES, "read-ahead");
        let mut read = 0u64;
        'chunks: while read < window {
            let Some(batches) = stream.next(READ_AHEAD_DEPTH, u64::MAX).await? else {
                break;
            };
            for (h, b) in batches {
                let (base, last) = (h.base_offset as u64, h.last_offset() as u64);
                if base >= hw || inner.cache_gen.get() != gen || inner.check_mode().is_err() {
                    break 'chunks;
                }
                if last < at {
                    continue;
                }
                read += b.len() as u64;
                inner
                    .shard
                    .cache
                    .borrow_mut()
                    .insert(inner.id, base, last, b);
            }
            // Wake the reads waiting for what this chunk brought in.
            if let Some(run) = &mut *inner.read_ahead.borrow_mut() {
                for w in run.waiters.drain(..) {
                    let _ = w.send(());
                }
            }
        }
        bump(&inner.shard.counters.read_ahead_bytes, read);
        Ok(())
    }

    /// What the cache holds from `offset` on (`None`: a miss at `offset`).
    fn read_cached(&self, offset: u64, max_bytes: u64) -> Result<Option<ReadResult>> {
        self.read_cached_below(offset, max_bytes, None)
    }

    /// [`PartitionLog::read_cached`] up to `limit` (the written offset
    /// when `None`).
    fn read_cached_below(
        &self,
        offset: u64,
        max_bytes: u64,
        limit: Option<u64>,
    ) -> Result<Option<ReadResult>> {
        let inner = &self.inner;
        let mut out = inner.nothing_read(offset);
        let hw = limit.unwrap_or(out.high_watermark);
        if offset < out.log_start_offset || offset > hw {
            return Err(inner.out_of_range(offset));
        }
        let mut bytes = 0u64;
        // Cache first: a tailing consumer is served from memory.
        let cache = inner.shard.cache.borrow();
        while out.next_offset < hw {
            let hit = if out.batches.is_empty() {
                cache.peek(inner.id, out.next_offset)
            } else {
                cache.get_exact(inner.id, out.next_offset)
            };
            let Some(b) = hit else { break };
            if b.base_offset >= hw
                || (!out.batches.is_empty() && bytes + b.data.len() as u64 > max_bytes)
            {
                break;
            }
            bytes += b.data.len() as u64;
            out.next_offset = b.last_offset + 1;
            out.batches.push(b.data);
        }
        Ok((!out.batches.is_empty() || offset == hw).then_some(out))
    }

    /// Reads from disk: the segment holding `offset` (or the next one, if
    /// `offset` falls in a gap), caching what is read unless the log's
    /// cache generation moved from `gen` meanwhile.
    async fn read_cold(&self, offset: u64, max_bytes: u64, gen: u64) -> Result<ReadResult> {
        let inner = &self.inner;
        let mut out = inner.nothing_read(offset);
        let hw = out.high_watermark;
        let mut bytes = 0u64;
        let mut want = offset;
        // Where a batch ends that was too long for the previous read.
        let mut whole_to = 0;
        while out.batches.is_empty() && want < hw {
            let Some(cur) = inner.state.borrow().cursor_at(want, true) else {
                break;
            };
            let (seg_base, limit) = (cur.base, cur.limit);
            let read_len = max_bytes.clamp(READ_AHEAD_BYTES, READ_BYTES_MAX);
            let scan_limit = limit.min((cur.pos + read_len).max(whole_to));
            whole_to = 0;
            let mut cached = Vec::new();
            let target = want;
            let summary = cur
                .scan(scan_limit, |h, _, b| {
                    cached.push((h.base_offset as u64, h.last_offset() as u64, b.clone()));
                    true
                })
                .await?;
            {
                // The log changed under the read (truncated, compacted,
                // closed): what was read is not cached.
                let keep = inner.cache_gen.get() == gen;
                let mut cache = inner.shard.cache.borrow_mut();
                for (base, last, b) in &cached {
                    if *base >= hw {
                        break;
                    }
                    if keep {
                        cache.insert(inner.id, *base, *last, b.clone());
                    }
                    if *last < target {
                        continue;
                    }
                    if !out.batches.is_empty() && bytes + b.len() as u64 > max_bytes {
                        break;
                    }
                    bytes += b.len() as u64;
                    out.next_offset = last + 1;
                    out.batches.push(b.clone());
                }
            }
            if out.batches.is_empty() {
                // A batch longer than the read: read again, all of it.
                if let Some(BatchError::LengthPastEnd { needed, .. }) = &summary.stopped {
                    let end = summary.end_pos + *needed as u64;
                    if end > scan_limit && end <= limit {
                        whole_to = end;
                        continue;
                    }
                }
                // Nothing at or after `want` in what was read: continue after it.
                if let (Some(e), true) = (&summary.stopped, summary.end_pos < limit) {
                    bump(&inner.shard.counters.io_errors, 1);
                    return Err(StorageError::Corrupt {
                        path: cur.path.clone(),
                        reason: format!(
                            "invalid batch at position {} below the high watermark: {e}",
                            summary.end_pos
                        ),
                    });
                }
                if summary.end_pos >= limit {
                    want = {
                        let st = inner.state.borrow();
                        match st.segments.range(seg_base + 1..).next() {
                            Some((&b, _)) => b.max(want),
                            None => break,
                        }
                    };
                } else {
                    want = summary.next_offset.max(want);
                }
            }
        }
        // Data truncated while the read was in flight is not returned.
        let (start, hw, lso) = {
            let st = inner.state.borrow();
            (st.log_start, st.written, st.last_stable_offset())
        };
        out.batches.retain(|b| {
            BatchHeader::peek(b)
                .is_ok_and(|h| (h.base_offset as u64) < hw && (h.last_offset() as u64) >= start)
        });
        out.high_watermark = hw;
        out.log_start_offset = start;
        out.last_stable_offset = lso;
        Ok(out)
    }

    /// The first offset whose record timestamp is `>= ts`, through the time
    /// indexes; `None` if every record is older. Searches written data only.
    pub async fn offset_for_timestamp(&self, ts: i64) -> Result<Option<u64>> {
        let inner = &self.inner;
        let candidates: Vec<_> = {
            let st = inner.state.borrow();
            st.segments
                .values()
                .filter(|s| s.max_timestamp >= ts && s.base < st.written)
                .map(|s| s.cursor(s.time_floor(ts)))
                .collect()
        };
        let (start, hw) = {
            let st = inner.state.borrow();
            (st.log_start, st.written)
        };
        for cur in candidates {
            let mut found = None;
            cur.scan(cur.limit, |h, _, b| {
                if (h.base_offset as u64) >= hw {
                    return false;
                }
                if h.max_timestamp >= ts && (h.last_offset() as u64) >= start {
                    found = Some(first_at_or_after(h, b, ts).max(start));
                    return false;
                }
                true
            })
            .await?;
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// Removes every batch at or after the one containing `offset` (as
    /// Kafka: the log end becomes that batch's base offset), from memory and
    /// disk, durably. Returns the new log end offset.
    pub async fn truncate_to(&self, offset: u64) -> Result<u64> {
        let inner = &self.inner;
        let _a = inner.lock(&inner.append_lock).await?;
        let _files = inner.lock_files().await?;
        inner.check_mode()?;
        let start = inner.state.borrow().log_start;
        if offset < start {
            return Err(inner.out_of_range(offset));
        }
        inner.write_pending_locked().await?;
        let end = inner.truncate_locked(offset).await?;
        let cut = {
            let st = inner.state.borrow();
            let mut c = st.epochs.clone();
            c.truncate(end).then_some(c)
        };
        if let Some(c) = cut {
            c.store(&inner.dir).await?;
            inner.state.borrow_mut().epochs = c;
        }
        Ok(end)
    }

    /// Raises the log start offset to `offset` (DeleteRecords): records
    /// below it are no longer served, and segments entirely below it are
    /// deleted. `offset` may be at most the high watermark. Returns the new
    /// log start offset.
    pub async fn delete_before(&self, offset: u64) -> Result<u64> {
        let inner = &self.inner;
        let files = inner.lock_files().await?;
        inner.check_mode()?;
        let hw = inner.state.borrow().written;
        if offset > hw {
            return Err(inner.out_of_range(offset));
        }
        let doomed = {
            let mut st = inner.state.borrow_mut();
            if offset <= st.log_start {
                return Ok(st.log_start);
            }
            st.log_start = offset;
            let active = *st.segments.keys().next_back().expect("active");
            let doomed: Vec<u64> = st
                .segments
                .values()
                .filter(|s| {
                    s.base != active
                        && s.next_offset <= offset
                        && s.state == SegmentState::Finalized
                })
                .map(|s| s.base)
                .collect();
            for b in &doomed {
                st.segments.remove(b);
                st.aborted.remove(b);
                st.aborted_dirty.remove(b);
            }
            doomed
        };
        inner.uncache(|c, id| c.remove_below(id, offset));
        inner.store_checkpoint().await?;
        // The doomed segments are out of the state and the new start is
        // durable: their files go without holding the log's I/O (an
        // unlink can take a while — a discard of the freed extents).
        drop(files);
        remove_segments_durably(&inner.dir, &doomed).await?;
        Ok(offset)
    }

    /// Deletes closed segments by `retention.ms` (the segment's newest
    /// record is older) and `retention.bytes` (the log is larger without
    /// it), oldest first, never the active segment; advances the log start
    /// offset. Uses the shard's clock.
    pub async fn enforce_retention(&self) -> Result<RetentionReport> {
        let inner = &self.inner;
        let files = inner.lock_files().await?;
        inner.check_mode()?;
        let now = inner.shard.clock.now_ms();
        let (doomed, report) = {
            let mut st = inner.state.borrow_mut();
            let cfg = st.config.clone();
            if !cfg.cleanup_policy.deletes() {
                return Ok(RetentionReport {
                    log_start_offset: st.log_start,
                    ..Default::default()
                });
            }
            let mut total: u64 = st.segments.values().map(|s| s.size()).sum();
            let active = *st.segments.keys().next_back().expect("active");
            let mut doomed = Vec::new();
            let mut bytes = 0;
            // With tiering, only segments already remote leave local disk,
            // by the local retention; the remote tier's retention is the
            // broker's.
            let remote_end = cfg.remote_storage.then(|| inner.remote_end.get());
            let (retention_ms, retention_bytes) =
                (cfg.local_retention_ms(), cfg.local_retention_bytes());
            for s in st.segments.values() {
                if s.base == active || s.state != SegmentState::Finalized {
                    break;
                }
                if remote_end.is_some_and(|end| s.next_offset > end) {
                    break;
                }
                let by_time =
                    retention_ms.is_some_and(|ms| s.max_timestamp < now.saturating_sub(ms));
                let by_size = retention_bytes.is_some_and(|max| total - s.size() >= max);
                if !(by_time || by_size) {
                    break;
                }
                total -= s.size();
                bytes += s.size();
                doomed.push(s.base);
            }
            for b in &doomed {
                st.segments.remove(b);
                st.aborted.remove(b);
                st.aborted_dirty.remove(b);
            }
            let first = *st.segments.keys().next().expect("active remains");
            st.log_start = st.log_start.max(first);
            (
                doomed,
                RetentionReport {
                    segments_deleted: 0,
                    bytes_deleted: bytes,
                    log_start_offset: st.log_start,
                },
            )
        };
        if doomed.is_empty() {
            return Ok(report);
        }
        inner.uncache(|c, id| c.remove_below(id, report.log_start_offset));
        inner.store_checkpoint().await?;
        // As in `delete_before`: the files go without holding the log's
        // I/O, so appends are not held up by the unlinks (at 50 MB/s with
        // segments deleted every second: publish p99 10–12 ms while they
        // held it, docs/benchmarks.md).
        drop(files);
        remove_segments_durably(&inner.dir, &doomed).await?;
        tracing::info!(partition = %inner.name, segments = doomed.len(), bytes = report.bytes_deleted,
            log_start = report.log_start_offset, "retention deleted segments");
        Ok(RetentionReport {
            segments_deleted: doomed.len(),
            ..report
        })
    }

    /// Closes the log cleanly: writes and fdatasyncs everything, closes the
    /// active segment (final index entry, exact file sizes) and writes the
    /// clean-shutdown marker, so the next open does not scan.
    pub async fn close(&self) -> Result<()> {
        let inner = &self.inner;
        let _a = inner.lock(&inner.append_lock).await?;
        let _files = inner.lock_files().await?;
        inner.check_mode()?;
        inner.state.borrow_mut().force_sync = true;
        if let Err(e) = inner.round_locked(None, false).await {
            inner.fail(e);
            return inner.check_mode();
        }
        let active = *inner
            .state
            .borrow()
            .segments
            .keys()
            .next_back()
            .expect("active");
        inner.finalize_segment(active).await?;
        // Everything is durable: the producer state as of the log end.
        {
            let _snap = inner.lock(&inner.snapshot_lock).await?;
            let (offset, table) = {
                let mut st = inner.state.borrow_mut();
                st.snapshot_gen += 1;
                st.snapshot_pending = None;
                (st.next_offset, std::mem::take(&mut st.producers))
            };
            match inner.store_snapshot(table, offset).await {
                Ok(()) => inner.state.borrow_mut().snapshot_on_disk = Some(offset),
                // The previous snapshot (if any) stays valid: the next open
                // replays more batches.
                Err(e) => tracing::warn!(partition = %inner.name, error = %e,
                    "could not write the producer snapshot at close"),
            }
        }
        let leo = {
            let mut st = inner.state.borrow_mut();
            st.recovery_point = st.next_offset;
            st.mode = Mode::Closed;
            st.next_offset
        };
        inner.store_checkpoint().await?;
        checkpoint::store_clean_marker_async(&inner.dir, leo).await?;
        inner.uncache(|c, id| c.remove_log(id));
        inner.fail_waiters(&inner.closed());
        inner.close_files().await;
        Ok(())
    }

    /// Creates an empty log in `dir`, which must not exist, that starts at
    /// `start`: a follower whose log ends below its leader's log start
    /// (retention deleted what it would fetch next) starts again there
    /// (Kafka's truncate-fully-and-start-at).
    pub async fn create_at(
        shard: &StorageShard,
        dir: impl Into<PathBuf>,
        config: LogConfig,
        start: u64,
    ) -> Result<PartitionLog> {
        let dir: PathBuf = dir.into();
        if dir.exists() {
            return Err(StorageError::io(
                "create directory",
                &dir,
                std::io::Error::new(std::io::ErrorKind::AlreadyExists, "it exists already"),
            ));
        }
        std::fs::create_dir_all(&dir).map_err(|e| StorageError::io("create directory", &dir, e))?;
        let ckpt = Checkpoint {
            log_start_offset: start,
            recovery_point: start,
        };
        ckpt.store_async(&dir).await?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            checkpoint::sync_dir_async(parent).await?;
        }
        let (log, _) = Self::open(shard, dir, config).await?;
        Ok(log)
    }

    /// Whether `other` is a handle to this same open log (not another
    /// log opened later in the same directory).
    pub fn same(&self, other: &PartitionLog) -> bool {
        Rc::ptr_eq(&self.inner, &other.inner)
    }

    /// Closes the log and removes its directory (topic deletion). Once:
    /// a second call on the same log does nothing.
    pub async fn delete(&self) -> Result<()> {
        let inner = &self.inner;
        if std::mem::replace(&mut inner.state.borrow_mut().deleted, true) {
            return Ok(());
        }
        let _a = inner.lock(&inner.append_lock).await?;
        let _files = inner.lock_files().await?;
        let _snap = inner.lock(&inner.snapshot_lock).await?;
        {
            let mut st = inner.state.borrow_mut();
            st.mode = Mode::Closed;
            st.snapshot_gen += 1;
            st.snapshot_pending = None;
        }
        inner.close_files().await;
        inner.uncache(|c, id| c.remove_log(id));
        inner.fail_waiters(&inner.closed());
        let dir = inner.dir.clone();
        checkpoint::run_blocking(move || {
            std::fs::remove_dir_all(&dir).map_err(|e| StorageError::io("remove directory", &dir, e))
        })
        .await
    }
}

/// Refuses a batch for a compacted log if one of its records has no key.
fn check_keys(name: &str, policy: crate::config::CleanupPolicy, data: &[u8]) -> Result<()> {
    let invalid = |source| StorageError::InvalidBatch {
        partition: name.to_string(),
        source,
    };
    let records = weir_proto::reader::RecordBatch::parse(data)
        .and_then(|b| b.records())
        .map_err(invalid)?;
    for (index, r) in records.iter().enumerate() {
        if r.map_err(invalid)?.record.key.is_none() {
            return Err(StorageError::KeyRequired {
                partition: name.to_string(),
                policy: policy.as_str(),
                index,
            });
        }
    }
    Ok(())
}

/// The offset of the first record with timestamp `>= ts` in a batch whose
/// max timestamp is `>= ts` (decompressing it if needed); the batch's base
/// offset if its records cannot be decoded.
/// A segment's preallocation step: the shard's, but no more than its
/// segment size (rounded up to a MiB; a segment exceeds it by one batch at
/// most, preallocated by a further step): a log of small segments does not
/// hold 32 MiB of zeros per active segment.
fn prealloc_step(shard_step: u64, segment_bytes: u64) -> u64 {
    shard_step.min(segment_bytes.div_ceil(1 << 20) << 20)
}

/// The offset of the first record of batch `bytes` (header `h`) whose
/// timestamp is at or after `ts` (the batch's base offset if none can be
/// read).
pub fn first_at_or_after(h: &BatchHeader, bytes: &Bytes, ts: i64) -> u64 {
    let found = weir_proto::reader::RecordBatch::parse(bytes)
        .and_then(|b| b.records())
        .ok()
        .and_then(|recs| {
            recs.iter()
                .map_while(|r| r.ok())
                .find(|r| r.timestamp >= ts)
                .map(|r| r.offset as u64)
        });
    found.unwrap_or(h.base_offset as u64)
}

/// Checks a segment that should have been closed cleanly: its last index
/// entry must point at a valid batch that ends exactly at the file's end.
/// Fills in next offset, max timestamp and last batch. Returns false if the
/// segment must be scanned instead.
pub(crate) async fn trust_closed(seg: &mut Segment) -> Result<bool> {
    let Some((rel, pos)) = seg.index.last() else {
        return Ok(seg.log.end() == 0);
    };
    if seg.time_index.last().map(|(_, r)| r) != Some(rel) {
        return Ok(false);
    }
    let (pos, size) = (pos as u64, seg.log.end());
    if pos + batch::HEADER_BYTES as u64 > size {
        return Ok(false);
    }
    let head = segment::read_range(
        seg.log.file(),
        seg.log.path(),
        seg.log.align(),
        pos,
        batch::HEADER_BYTES as u64,
    )
    .await?;
    let Ok(h) = BatchHeader::peek(&head) else {
        return Ok(false);
    };
    if h.base_offset as u64 != seg.base + rel as u64
        || pos + h.total_len() as u64 != size
        || h.magic != batch::MAGIC
    {
        return Ok(false);
    }
    seg.next_offset = h.last_offset() as u64 + 1;
    seg.max_timestamp = seg.time_index.last().map(|(t, _)| t).unwrap_or(i64::MIN);
    seg.last_batch = Some((h.base_offset as u64, pos));
    seg.bytes_since_index = h.total_len() as u64;
    Ok(true)
}

/// Scans a segment from its last trustworthy index entry, rebuilds the
/// index entries after it, and cuts the log after the last valid batch.
///
/// Index entries reach the files only after the log bytes before them were
/// fdatasync'd (`Segment::release_index_entries`), so no hole can hide
/// before the last entry; a crash scan therefore reads only the tail written
/// since the last flush round that wrote index entries.
async fn recover_segment(
    seg: &mut Segment,
    config: &LogConfig,
    report: &mut RecoveryReport,
    shard: &ShardInner,
) -> Result<()> {
    report.scanned_segments += 1;
    bump(&shard.counters.recovery_scanned_segments, 1);
    let file_len = seg.log.written();
    let old_index = seg.index.entries().to_vec();
    let old_time_index = seg.time_index.entries().to_vec();
    // The last index entry that points at a matching batch: index entries
    // are written only after the log up to them was fdatasync'd, so the log
    // before it holds no hole and the scan starts there.
    let mut n = seg.index.len().min(seg.time_index.len());
    while n > 0 {
        let (r, p) = seg.index.entries()[n - 1];
        if p as u64 + batch::HEADER_BYTES as u64 <= file_len {
            let head = segment::read_range(
                seg.log.file(),
                seg.log.path(),
                seg.log.align(),
                p as u64,
                batch::HEADER_BYTES as u64,
            )
            .await?;
            if BatchHeader::peek(&head).is_ok_and(|h| {
                h.base_offset as u64 == seg.base + r as u64 && h.magic == batch::MAGIC
            }) {
                break;
            }
        }
        n -= 1;
    }
    let (start_off, start_pos) = match n {
        0 => (seg.base, 0),
        n => {
            let (r, p) = seg.index.entries()[n - 1];
            (seg.base + r as u64, p as u64)
        }
    };
    let mut seen: Vec<(u64, u64, u64, i64)> = Vec::new();
    let sum: ScanSummary = segment::scan(
        seg.log.file(),
        seg.log.path(),
        seg.log.align(),
        seg.base,
        start_pos,
        start_off,
        file_len,
        |h, pos, b| {
            seen.push((h.base_offset as u64, pos, b.len() as u64, h.max_timestamp));
            true
        },
    )
    .await?;
    // Keep the entries before the start point; the scan re-adds the rest
    // (its first batch is the start point itself).
    let keep = n.saturating_sub(1);
    seg.index.truncate(keep);
    seg.time_index.truncate(keep);
    seg.released = seg.released.min(keep);
    seg.index_w
        .reset_to((seg.released * crate::offset_index::ENTRY_BYTES) as u64);
    seg.time_w
        .reset_to((seg.released * crate::time_index::ENTRY_BYTES) as u64);
    seg.max_timestamp = seg.time_index.last().map(|(t, _)| t).unwrap_or(i64::MIN);
    seg.last_batch = None;
    seg.bytes_since_index = 0;
    let end = sum.end_pos;
    seg.log.reset_to(end);
    seg.synced_len = end;
    for (off, pos, len, max_ts) in seen {
        // Re-run the append-side index logic on the scanned batches.
        seg.max_timestamp = seg.max_timestamp.max(max_ts);
        if seg.last_batch.is_none() || seg.bytes_since_index >= config.index_interval_bytes {
            seg.add_index_point(off, pos);
        }
        seg.bytes_since_index += len;
        seg.last_batch = Some((off, pos));
    }
    if seg.last_batch.is_none() {
        seg.last_batch = seg
            .index
            .last()
            .map(|(r, p)| (seg.base + r as u64, p as u64));
    }
    seg.next_offset = match sum.last_batch {
        Some(_) => sum.next_offset,
        None => start_off,
    };
    if seg.index.entries() != old_index.as_slice()
        || seg.time_index.entries() != old_time_index.as_slice()
    {
        report.rebuilt_indexes += 1;
    }
    // What was cut is the data after the valid end: up to the last
    // non-zero byte (preallocated zeros and block padding are not data).
    let cut = if file_len > end {
        segment::nonzero_end(
            seg.log.file(),
            seg.log.path(),
            seg.log.align(),
            end,
            file_len,
        )
        .await?
            - end
    } else {
        0
    };
    if cut > 0 {
        report.truncated_bytes += cut;
        bump(&shard.counters.recovery_truncated_bytes, cut);
        tracing::warn!(segment = %seg.log.path().display(), position = end, bytes = cut,
            file_bytes_after = file_len - end, reason = ?sum.stopped,
            "cutting invalid tail of segment");
    }
    Ok(())
}

impl LogInner {
    /// Drops batches of this log from the core's cache (`drop` is given
    /// the cache and the log's id) and tells reads in flight not to put
    /// back what they read before.
    pub(crate) fn uncache(&self, drop: impl FnOnce(&mut crate::cache::BatchCache, u64)) {
        self.cache_gen.set(self.cache_gen.get() + 1);
        drop(&mut self.shard.cache.borrow_mut(), self.id);
    }

    /// An empty read at `offset`, with the log's bounds now.
    fn nothing_read(&self, offset: u64) -> ReadResult {
        let st = self.state.borrow();
        ReadResult {
            batches: Vec::new(),
            next_offset: offset,
            high_watermark: st.written,
            log_start_offset: st.log_start,
            last_stable_offset: st.last_stable_offset(),
        }
    }

    /// Takes one of the log's locks.
    pub(crate) async fn lock<'a>(
        &'a self,
        sem: &'a Semaphore,
    ) -> Result<glommio::sync::Permit<'a>> {
        sem.acquire_permit(1).await.map_err(|_| self.closed())
    }

    /// Takes the I/O lock, then waits for a pipelined fdatasync still in
    /// flight (the sync lock): what every file-changing operation needs.
    pub(crate) async fn lock_files(
        &self,
    ) -> Result<(glommio::sync::Permit<'_>, glommio::sync::Permit<'_>)> {
        let io = self.lock(&self.io_lock).await?;
        let sync = self.lock(&self.sync_lock).await?;
        Ok((io, sync))
    }

    /// Closes the segments' files now (a dropped glommio file is only
    /// closed at the executor's next I/O cycle, which never comes if the
    /// executor ends). Keeps what the log's accessors report: sizes and
    /// segment bases stay as they were at the close.
    async fn close_files(&self) {
        let files: Vec<Rc<DmaFile>> = {
            let mut st = self.state.borrow_mut();
            let segs = std::mem::take(&mut st.segments);
            st.closed_view = Some((
                segs.values().map(|s| s.size()).sum(),
                segs.keys().copied().collect(),
            ));
            segs.into_values()
                .flat_map(|seg| {
                    let through = seg.log_write_through.clone();
                    seg.files().map(|(f, _)| f).into_iter().chain(through)
                })
                .collect()
        };
        for f in files {
            if let Err(e) = f.close_rc().await {
                tracing::debug!(partition = %self.name, error = %e, "closing a segment file failed");
            }
        }
    }

    fn closed(&self) -> StorageError {
        StorageError::Closed {
            partition: self.name.clone(),
        }
    }

    fn out_of_range(&self, offset: u64) -> StorageError {
        let st = self.state.borrow();
        StorageError::OffsetOutOfRange {
            partition: self.name.clone(),
            offset,
            log_start: st.log_start,
            log_end: st.written,
        }
    }

    pub(crate) fn check_mode(&self) -> Result<()> {
        match &self.state.borrow().mode {
            Mode::Open => Ok(()),
            Mode::Recovering => Err(StorageError::Recovering {
                partition: self.name.clone(),
            }),
            Mode::Offline(reason) => Err(StorageError::Offline {
                partition: self.name.clone(),
                reason: reason.clone(),
            }),
            Mode::Closed => Err(self.closed()),
        }
    }

    async fn wait(self: &Rc<Self>, upto: u64, durable: bool) -> Result<()> {
        let rx = {
            let st = self.state.borrow();
            let mark = if durable { st.durable } else { st.written };
            if mark >= upto {
                return Ok(());
            }
            drop(st);
            self.check_mode()?;
            let mut st = self.state.borrow_mut();
            let (tx, rx) = oneshot::channel();
            // Waiters whose caller gave up (a timed-out long poll) go.
            st.waiters.retain(|w| !w.tx.is_canceled());
            st.waiters.push(Waiter { upto, durable, tx });
            if durable {
                st.force_sync = true;
            }
            rx
        };
        self.shard.schedule(self);
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(self.closed()),
        }
    }

    fn wake_waiters(&self) {
        let mut st = self.state.borrow_mut();
        let (w, d) = (st.written, st.durable);
        let waiters = std::mem::take(&mut st.waiters);
        for x in waiters {
            if (if x.durable { d } else { w }) >= x.upto {
                let _ = x.tx.send(Ok(()));
            } else {
                st.waiters.push(x);
            }
        }
    }

    fn fail_waiters(&self, e: &StorageError) {
        let (waiters, appends) = {
            let mut st = self.state.borrow_mut();
            (
                std::mem::take(&mut st.waiters),
                std::mem::take(&mut st.append_waiters),
            )
        };
        for x in waiters {
            let _ = x.tx.send(Err(e.clone()));
        }
        for (_, tx) in appends {
            let _ = tx.send(Err(e.clone()));
        }
    }

    /// One flush round for this log (called by the committer).
    ///
    /// `writes_done` is signalled (or dropped) once this round's writes are
    /// done and the next round may start: the committer then begins the
    /// next round's writes while this one's fdatasync is in flight.
    /// `alone`: the committer's round writes this log only.
    pub(crate) async fn flush_round(
        self: &Rc<Self>,
        writes_done: oneshot::Sender<()>,
        alone: bool,
    ) {
        let Ok(io) = self.io_lock.acquire_permit(1).await else {
            return;
        };
        if self.state.borrow().mode != Mode::Open {
            return;
        }
        if let Err(e) = self.round_locked(Some((io, writes_done)), alone).await {
            self.fail(e);
        }
    }

    fn fail(self: &Rc<Self>, e: RoundError) {
        bump(&self.shard.counters.io_errors, 1);
        match e {
            RoundError::Write(e) => {
                if let Some(stop) = self.shard.config.on_write_failure {
                    tracing::error!(partition = %self.name, error = %e, "write failed");
                    stop(&e);
                }
                tracing::error!(partition = %self.name, error = %e, "write failed; rolling back to the last written offset");
                self.state.borrow_mut().mode = Mode::Recovering;
                self.fail_waiters(&e);
                let me = self.clone();
                glommio::spawn_local(async move { me.roll_back().await }).detach();
            }
            RoundError::Sync(e) => {
                tracing::error!(partition = %self.name, error = %e, "fdatasync failed; taking the log offline");
                self.state.borrow_mut().mode = Mode::Offline(e.to_string());
                self.fail_waiters(&e);
                if let Some(stop) = self.shard.config.on_sync_failure {
                    stop(&e);
                }
            }
        }
    }

    async fn roll_back(self: Rc<Self>) {
        let (Ok(_a), Ok(_io), Ok(_sync)) = (
            self.append_lock.acquire_permit(1).await,
            self.io_lock.acquire_permit(1).await,
            self.sync_lock.acquire_permit(1).await,
        ) else {
            return;
        };
        let target = self.state.borrow().written;
        let r = self.truncate_locked(target).await;
        let mut st = self.state.borrow_mut();
        match r {
            Ok(_) => {
                tracing::info!(partition = %self.name, offset = target, "rolled back after write failure");
                st.mode = Mode::Open;
            }
            Err(e) => {
                tracing::error!(partition = %self.name, error = %e, "roll back failed; log offline");
                st.mode = Mode::Offline(e.to_string());
            }
        }
    }

    /// Writes every pending byte (used under both locks before truncation).
    async fn write_pending_locked(self: &Rc<Self>) -> Result<()> {
        match self.round_locked(None, false).await {
            Ok(()) => Ok(()),
            Err(RoundError::Write(e)) | Err(RoundError::Sync(e)) => {
                self.fail(RoundError::Write(e.clone()));
                Err(e)
            }
        }
    }

    /// Whether a round of at least
    /// [`crate::ShardConfig::write_through_bytes_min`] bytes is written
    /// through `O_DSYNC`: the log syncs every round (`flush.messages` 1).
    fn writes_through(&self, flush_messages: u64) -> bool {
        self.shard.config.write_through_bytes_min > 0
            && flush_messages <= 1
            && !self.write_through_off.get()
    }

    /// Whether a round's `len` bytes of the active segment are written
    /// through: at least [`crate::ShardConfig::write_through_bytes_min`],
    /// or fewer than [`crate::ShardConfig::write_through_alone_bytes_max`]
    /// when the core's round writes this log `alone`.
    fn through_len(&self, len: u64, alone: bool) -> bool {
        let c = &self.shard.config;
        len >= c.write_through_bytes_min || (alone && len < c.write_through_alone_bytes_max)
    }

    /// Opens the active segment's `O_DSYNC` descriptor before the first
    /// round large enough to be written through it.
    async fn prepare_write_through(&self, alone: bool) {
        let (base, path) = {
            let st = self.state.borrow();
            if !self.writes_through(st.config.flush_messages) {
                return;
            }
            let Some(seg) = st.segments.values().next_back() else {
                return;
            };
            if seg.log_write_through.is_some() || !self.through_len(seg.log.queued_bytes(), alone) {
                return;
            }
            (seg.base, seg.log.path().clone())
        };
        match segment::open_write_through(&path).await {
            Ok(f) => {
                if let Some(seg) = self.state.borrow_mut().segments.get_mut(&base) {
                    seg.log_write_through.get_or_insert(f);
                }
            }
            Err(e) => {
                self.write_through_off.set(true);
                tracing::warn!(partition = %self.name, error = %e, "opening the log with O_DSYNC failed; every round is written, then fdatasync'd");
            }
        }
    }

    /// Takes this round's jobs: everything queued, except that the active
    /// segment's `.log` job is limited to [`ROUND_LOG_BYTES_MAX`]. Returns
    /// the jobs, if batches were left for the next round the offset up to
    /// which this round writes, and the segment whose `.log` job is written
    /// through its `O_DSYNC` descriptor (durable once written; the active
    /// segment, at least `write_through_bytes_min` bytes, nothing of it
    /// unsynced before this round).
    #[allow(clippy::type_complexity)]
    fn take_all_jobs(
        &self,
        alone: bool,
    ) -> (Vec<(u64, FileKind, WriteJob)>, Option<u64>, Option<u64>) {
        let mut st = self.state.borrow_mut();
        let mut jobs = Vec::new();
        let mut left = None;
        let mut durable = None;
        // No segments: the log was closed (or deleted) meanwhile.
        let Some(active) = st.segments.keys().next_back().copied() else {
            return (jobs, left, durable);
        };
        let through = self.writes_through(st.config.flush_messages);
        for seg in st.segments.values_mut() {
            let max = if seg.base == active {
                ROUND_LOG_BYTES_MAX
            } else {
                u64::MAX
            };
            let clean = !seg.unsynced;
            let (js, l) = seg.take_jobs_upto(max);
            left = left.or(l);
            for (k, mut j) in js {
                if let (true, true, FileKind::Log, Some(f)) = (
                    through && clean && seg.base == active,
                    self.through_len(j.len(), alone),
                    k,
                    &seg.log_write_through,
                ) {
                    j.write_through(f.clone());
                    durable = Some(seg.base);
                }
                jobs.push((seg.base, k, j));
            }
        }
        (jobs, left, durable)
    }

    /// Applies job outcomes; returns the first error.
    fn apply(&self, outcomes: Vec<JobOutcome>) -> Result<()> {
        let mut st = self.state.borrow_mut();
        let mut first = None;
        for (base, kind, r) in outcomes {
            let Some(seg) = st.segments.get_mut(&base) else {
                continue;
            };
            match r {
                Ok(w) => seg.writer(kind).complete(w),
                Err(e) => {
                    seg.writer(kind).fail();
                    if kind == FileKind::Log {
                        seg.queued_ends.clear();
                    }
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// One round: writes, then fdatasync as the policy says, then closing
    /// of rolled segments. With `pipeline` (the caller's I/O permit and its
    /// signal), the I/O lock is handed over to the next round as soon as the
    /// writes are done, unless a rolled segment must be closed; the sync
    /// lock applies the syncs' outcomes in order. Several rounds' syncs may be
    /// in flight at once: the writes of round N+1 wait for no sync.
    async fn round_locked(
        self: &Rc<Self>,
        pipeline: Option<(glommio::sync::Permit<'_>, oneshot::Sender<()>)>,
        alone: bool,
    ) -> Result<(), RoundError> {
        let (mut target, mut target_records) = {
            let st = self.state.borrow();
            (st.next_offset, st.appended_records)
        };
        self.prepare_write_through(alone).await;
        let (jobs, left, durable) = self.take_all_jobs(alone);
        if let Some(upto) = left {
            // Batches were left for the next round: this one covers less,
            // and its records are not counted as synced (a sync too many is
            // harmless, one too few is not).
            target = upto;
            target_records = self.state.borrow().synced_records;
            self.shard.schedule(self);
        }
        self.apply(run_jobs(jobs).await)
            .map_err(RoundError::Write)?;
        let (files, sealed) = {
            let mut st = self.state.borrow_mut();
            if target > st.written {
                if st.written_marks.len() >= WRITTEN_MARKS_MAX {
                    st.written_marks.pop_front();
                }
                st.written_marks.push_back((target, Instant::now()));
            }
            st.written = st.written.max(target);
            let cfg = &st.config;
            let counted = st.synced_records.max(st.sync_planned_records);
            let by_count = target_records.saturating_sub(counted) >= cfg.flush_messages
                && target_records > counted;
            let by_time = cfg.flush_ms.is_some_and(|ms| {
                st.last_sync.elapsed() >= Duration::from_millis(ms.max(0) as u64)
            });
            let sealed: Vec<u64> = st
                .segments
                .values()
                .filter(|s| s.state == SegmentState::Sealed)
                .map(|s| s.base)
                .collect();
            let need = st.force_sync || by_count || by_time || !sealed.is_empty();
            let mut files = Vec::new();
            let mut synced = Vec::new();
            if need {
                for s in st.segments.values_mut() {
                    if s.unsynced {
                        s.unsynced = false;
                        // Written through O_DSYNC: durable already.
                        if durable != Some(s.base) {
                            let [log, ..] = s.files();
                            files.push(log);
                        }
                        synced.push((s.base, s.log.written()));
                    }
                }
                st.force_sync = false;
                st.sync_planned_records = st.sync_planned_records.max(target_records);
            }
            (need.then_some((files, synced)), sealed)
        };
        // Written is readable and acknowledges acks=1: wake those waiters
        // now, not after the fdatasync below.
        self.wake_waiters();
        // The next round's writes may start now (unless a rolled segment
        // must be closed first), whatever syncs are still in flight.
        let pipelined = sealed.is_empty()
            && pipeline
                .map(|(io, done)| {
                    drop(io);
                    let _ = done.send(());
                })
                .is_some();
        let (files, synced) = files.unzip();
        let sync = async {
            match files {
                // The test-only switch breaks durability on purpose (see
                // `crate::testing`): the power-loss test must then fail.
                Some(files) if !crate::testing::skip_fdatasync() => {
                    sync_files(&self.shard, files).await
                }
                _ => Ok(()),
            }
        };
        let (_order, synced_ok) = if pipelined {
            // This round's fdatasync runs beside earlier rounds' (the file
            // system joins concurrent syncs into one journal commit and
            // device flush), but its outcome is applied in round order:
            // the sync lock's waiters are served in order, and this one is
            // queued (`zip` polls it first) before the next round can
            // start. A truncation or roll-back, which takes the sync lock
            // after the I/O lock, waits behind it.
            let (order, r) =
                futures_lite::future::zip(self.sync_lock.acquire_permit(1), sync).await;
            // An earlier round's fdatasync failed meanwhile: its data may
            // be lost, so this round may make nothing durable (its waiters
            // were failed then).
            if matches!(self.state.borrow().mode, Mode::Offline(_)) {
                return Ok(());
            }
            (order.ok(), r)
        } else {
            (None, sync.await)
        };
        synced_ok.map_err(RoundError::Sync)?;
        if let Some(synced) = synced {
            let mut st = self.state.borrow_mut();
            for (base, len) in synced {
                if let Some(s) = st.segments.get_mut(&base) {
                    s.mark_synced(len);
                }
            }
            st.durable = st.durable.max(target);
            st.synced_records = target_records;
            st.last_sync = Instant::now();
        }
        for base in sealed {
            self.finalize_segment(base)
                .await
                .map_err(RoundError::Sync)?;
        }
        self.wake_waiters();
        self.maybe_write_snapshot();
        let st = self.state.borrow();
        if let Some(ms) = st.config.flush_ms {
            if st.durable < st.written {
                self.shard
                    .schedule_at(st.last_sync + Duration::from_millis(ms.max(0) as u64), self);
            }
        }
        Ok(())
    }

    /// Closes a segment for good: final index entry, exact file sizes,
    /// fdatasync of all three files, and the recovery point moved past it.
    async fn finalize_segment(self: &Rc<Self>, base: u64) -> Result<()> {
        let write = |s: &mut Segment| {
            s.take_jobs()
                .into_iter()
                .map(|(k, j)| (s.base, k, j))
                .collect::<Vec<_>>()
        };
        let jobs = {
            let mut st = self.state.borrow_mut();
            let Some(seg) = st.segments.get_mut(&base) else {
                return Ok(());
            };
            // Callers sync the segment's data first: every entry may be written.
            let written = seg.log.written();
            seg.mark_synced(written);
            seg.add_final_index_point();
            write(seg)
        };
        self.apply(run_jobs(jobs).await)?;
        let (jobs, files) = {
            let mut st = self.state.borrow_mut();
            let Some(seg) = st.segments.get_mut(&base) else {
                return Ok(());
            };
            seg.cut_files_to_size();
            // Sealed: no more rounds write through it (glommio closes a
            // dropped file at its next I/O cycle).
            seg.log_write_through = None;
            (write(seg), seg.files().to_vec())
        };
        self.apply(run_jobs(jobs).await)?;
        sync_files(&self.shard, files).await?;
        let changed = {
            let mut st = self.state.borrow_mut();
            if let Some(seg) = st.segments.get_mut(&base) {
                seg.state = SegmentState::Finalized;
                seg.unsynced = false;
            }
            let rp = st
                .segments
                .values()
                .find(|s| s.state != SegmentState::Finalized)
                .map(|s| s.base)
                .unwrap_or(st.next_offset);
            let changed = rp != st.recovery_point;
            st.recovery_point = rp;
            changed
        };
        if changed {
            self.store_checkpoint().await?;
        }
        Ok(())
    }

    /// Stores the checkpoint on the blocking pool.
    async fn store_checkpoint(&self) -> Result<()> {
        let c = {
            let st = self.state.borrow();
            Checkpoint {
                log_start_offset: st.log_start,
                recovery_point: st.recovery_point,
            }
        };
        c.store_async(&self.dir).await
    }

    /// Starts writing the pending producer snapshot if every batch below
    /// its offset is fdatasync'd and no writer is running. The writer runs
    /// in its own task (encoding and file I/O on glommio's blocking pool),
    /// so a round's appenders never wait for it.
    fn maybe_write_snapshot(self: &Rc<Self>) {
        let job = {
            let mut st = self.state.borrow_mut();
            let due = st
                .snapshot_pending
                .as_ref()
                .is_some_and(|(o, _)| *o <= st.durable);
            if !due || st.snapshot_writing || st.mode != Mode::Open {
                return;
            }
            let (offset, table) = st.snapshot_pending.take().expect("due");
            st.snapshot_writing = true;
            (offset, table, st.snapshot_gen)
        };
        let me = self.clone();
        glommio::spawn_local(async move { me.write_snapshot(job).await }).detach();
    }

    async fn write_snapshot(self: Rc<Self>, (offset, table, gen): (u64, ProducerStateTable, u64)) {
        if let Ok(_snap) = self.snapshot_lock.acquire_permit(1).await {
            // A truncation, close or delete since the snapshot was taken
            // makes it stale; an older snapshot never replaces a newer one.
            let current = {
                let st = self.state.borrow();
                st.snapshot_gen == gen
                    && st.mode == Mode::Open
                    && st.snapshot_on_disk.is_none_or(|o| o < offset)
            };
            if current {
                match self.store_snapshot(table, offset).await {
                    Ok(()) => self.state.borrow_mut().snapshot_on_disk = Some(offset),
                    Err(e) => tracing::warn!(partition = %self.name, offset, error = %e,
                        "could not write the producer snapshot"),
                }
            }
        }
        self.state.borrow_mut().snapshot_writing = false;
        self.maybe_write_snapshot();
    }

    /// Writes `producer.snapshot` on glommio's blocking pool (caller holds
    /// `snapshot_lock`; every batch below `offset` is fdatasync'd).
    async fn store_snapshot(&self, table: ProducerStateTable, offset: u64) -> Result<()> {
        // The aborted-transaction index below `offset` first: a snapshot
        // on disk means every entry below it is in the files.
        let files: Vec<(u64, PathBuf, Vec<u8>)> = {
            let st = self.state.borrow();
            st.aborted_dirty
                .iter()
                .map(|&b| {
                    let below: Vec<AbortedTxn> = st
                        .aborted
                        .get(&b)
                        .map(|e| {
                            e.iter()
                                .filter(|e| e.last_offset < offset)
                                .copied()
                                .collect()
                        })
                        .unwrap_or_default();
                    (b, txn_index_path(&self.dir, b), txn::encode(&below))
                })
                .collect()
        };
        if !files.is_empty() {
            let dir = self.dir.clone();
            let writes: Vec<(PathBuf, Vec<u8>)> = files
                .iter()
                .map(|(_, p, e)| (p.clone(), e.clone()))
                .collect();
            crate::checkpoint::on_blocking_pool(move || write_txn_indexes(&dir, &writes)).await?;
            let mut st = self.state.borrow_mut();
            for (b, _, _) in files {
                let all_below = st
                    .aborted
                    .get(&b)
                    .is_none_or(|e| e.iter().all(|e| e.last_offset < offset));
                if all_below {
                    st.aborted_dirty.remove(&b);
                }
            }
        }
        let dir = self.dir.clone();
        crate::checkpoint::on_blocking_pool(move || table.store(&dir, offset)).await
    }

    /// Loads the producer state at open: the snapshot, then every batch from
    /// its offset (or from the log start, without a usable snapshot) to the
    /// log end; the aborted-transaction index from the segments' files and
    /// those batches. Returns the bytes of batches replayed.
    async fn load_producer_state(self: &Rc<Self>) -> Result<u64> {
        let (scanned, end) = self.rebuild_producer_state(None).await?;
        if scanned > 0 {
            // Spare the next open this replay.
            let _snap = self.lock(&self.snapshot_lock).await?;
            let table = self.state.borrow().producers.clone();
            match self.store_snapshot(table, end).await {
                Ok(()) => self.state.borrow_mut().snapshot_on_disk = Some(end),
                Err(e) => tracing::warn!(partition = %self.name, error = %e,
                    "could not write the producer snapshot after recovery"),
            }
        }
        Ok(scanned)
    }

    /// The producer state and the aborted-transaction index rebuilt from
    /// the snapshot on disk and the batches after it (see
    /// [`LogInner::load_producer_state`]); `known`: the index as far as it
    /// is known (`None`: read from the segments' files). Only its entries
    /// below where the replay starts are kept: the replay finds the rest
    /// again. Returns the bytes replayed and the log end.
    async fn rebuild_producer_state(
        self: &Rc<Self>,
        known: Option<BTreeMap<u64, Vec<AbortedTxn>>>,
    ) -> Result<(u64, u64)> {
        let dir = self.dir.clone();
        let loaded = crate::checkpoint::on_blocking_pool(move || ProducerStateTable::load(&dir))
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(partition = %self.name, error = %e,
                    "ignoring unusable producer snapshot; rebuilding producer state from the log");
                None
            });
        let (start, end, bases) = {
            let st = self.state.borrow();
            (
                st.log_start,
                st.next_offset,
                st.segments.keys().copied().collect::<Vec<_>>(),
            )
        };
        let (mut table, mut from, mut on_disk) = match loaded {
            Some((offset, t)) if offset <= end => (t, offset.max(start), Some(offset)),
            Some((offset, _)) => {
                // Its batches were cut (a crash during a truncation, or
                // data lost below it): remove it before the log grows again.
                tracing::warn!(partition = %self.name, offset, log_end = end,
                    "producer snapshot is past the log end; rebuilding producer state from the log");
                let dir = self.dir.clone();
                checkpoint::run_blocking(move || ProducerStateTable::remove_snapshot(&dir)).await?;
                (ProducerStateTable::new(), start, None)
            }
            None => (ProducerStateTable::new(), start, None),
        };
        let mut aborted = match known {
            Some(k) => k,
            None => {
                let dir = self.dir.clone();
                let read =
                    crate::checkpoint::on_blocking_pool(move || read_txn_indexes(&dir, &bases))
                        .await;
                match read {
                    Ok(a) => a,
                    Err(why) => {
                        // Rebuilt from the whole log.
                        tracing::warn!(partition = %self.name, why,
                            "unusable aborted-transaction index; rebuilding it and the producer state from the log");
                        (table, from, on_disk) = (ProducerStateTable::new(), start, None);
                        BTreeMap::new()
                    }
                }
            }
        };
        let mut dirty = std::collections::BTreeSet::new();
        for (base, entries) in aborted.iter_mut() {
            let before = entries.len();
            entries.retain(|e| e.last_offset < from);
            if entries.len() != before {
                dirty.insert(*base);
            }
        }
        aborted.retain(|_, e| !e.is_empty());
        let cursors: Vec<_> = {
            let st = self.state.borrow();
            st.segments
                .values()
                .filter(|s| s.next_offset > from)
                .map(|s| s.cursor(s.floor(from)))
                .collect()
        };
        let mut scanned = 0u64;
        for cur in cursors {
            let base = cur.base;
            let sum = cur
                .scan(cur.limit, |h, _, b| {
                    if h.last_offset() as u64 >= from {
                        if record_batch(&mut table, &mut aborted, h, b, base, &self.name) {
                            dirty.insert(base);
                        }
                        scanned += b.len() as u64;
                    }
                    true
                })
                .await?;
            if let (Some(e), true) = (&sum.stopped, sum.end_pos < cur.limit) {
                tracing::warn!(segment = %cur.path.display(), position = sum.end_pos, error = %e,
                    "invalid batch while rebuilding producer state; skipping the rest of the segment");
            }
        }
        {
            let mut st = self.state.borrow_mut();
            st.producers = table;
            st.aborted = aborted;
            st.aborted_dirty.extend(dirty);
            st.snapshot_on_disk = on_disk;
        }
        Ok((scanned, end))
    }

    /// Cuts the log at the batch containing `offset` (both locks held, no
    /// pending bytes before the cut point). Returns the new log end.
    async fn truncate_locked(self: &Rc<Self>, offset: u64) -> Result<u64> {
        let cur = {
            let st = self.state.borrow();
            if offset >= st.next_offset && st.written >= st.next_offset {
                return Ok(st.next_offset);
            }
            let (_, s) = st
                .segments
                .range(..=offset)
                .next_back()
                .or_else(|| st.segments.iter().next())
                .expect("a segment");
            s.cursor(s.floor(offset))
        };
        let (seg_base, floor_off) = (cur.base, cur.offset);
        let mut cut = None;
        let sum = cur
            .scan(cur.limit, |h, pos, _| {
                if h.last_offset() as u64 >= offset {
                    cut = Some((pos, h.base_offset as u64));
                    false
                } else {
                    true
                }
            })
            .await?;
        let (pos, new_end) = cut.unwrap_or((sum.end_pos, sum.next_offset.max(floor_off)));
        // Producer state: no snapshot above the new end may survive (on
        // disk, pending or being written), and no batch at or after it may
        // be remembered. The file goes first, so that a failure changes
        // nothing and a crash leaves no stale snapshot.
        let _snap = self.lock(&self.snapshot_lock).await?;
        let log_end = new_end.max(seg_base);
        if self
            .state
            .borrow()
            .snapshot_on_disk
            .is_some_and(|o| o > log_end)
        {
            let dir = self.dir.clone();
            checkpoint::run_blocking(move || ProducerStateTable::remove_snapshot(&dir)).await?;
            self.state.borrow_mut().snapshot_on_disk = None;
        }
        {
            let mut st = self.state.borrow_mut();
            st.snapshot_gen += 1;
            if st
                .snapshot_pending
                .as_ref()
                .is_some_and(|(o, _)| *o > log_end)
            {
                st.snapshot_pending = None;
            }
            st.producers.truncate(log_end);
            // Aborts whose markers are cut are not aborted (yet).
            let mut changed = Vec::new();
            for (b, entries) in st.aborted.iter_mut() {
                let before = entries.len();
                entries.retain(|e| e.last_offset < log_end);
                if entries.len() != before {
                    changed.push(*b);
                }
            }
            st.aborted.retain(|_, e| !e.is_empty());
            st.aborted_dirty.extend(changed);
        }
        // Summarise what remains after the last index entry kept.
        let (kept_off, kept_pos) = {
            let st = self.state.borrow();
            let s = &st.segments[&seg_base];
            let n = s
                .index
                .count_below_position(pos as u32)
                .min(s.time_index.len());
            match n {
                0 => (s.base, 0),
                n => {
                    let (r, p) = s.index.entries()[n - 1];
                    (s.base + r as u64, p as u64)
                }
            }
        };
        let remain = cur
            .at((kept_off, kept_pos))
            .scan(pos, |_, _, _| true)
            .await?;
        let doomed = {
            let mut st = self.state.borrow_mut();
            let doomed: Vec<u64> = st.segments.range(seg_base + 1..).map(|(b, _)| *b).collect();
            for b in &doomed {
                st.segments.remove(b);
                st.aborted.remove(b);
                st.aborted_dirty.remove(b);
            }
            let seg = st.segments.get_mut(&seg_base).expect("kept");
            seg.cut(pos, new_end.max(seg_base), &remain);
            st.next_offset = new_end.max(seg_base);
            st.written = st.next_offset;
            st.durable = st.durable.min(st.next_offset);
            st.synced_records = st.appended_records;
            st.sync_planned_records = st.appended_records;
            st.recovery_point = st.recovery_point.min(seg_base);
            st.log_start = st.log_start.min(st.next_offset);
            doomed
        };
        self.uncache(|c, id| c.remove_from(id, new_end));
        // The lowered recovery point must be durable before the cut segment
        // is written again.
        self.store_checkpoint().await?;
        let (jobs, files) = {
            let mut st = self.state.borrow_mut();
            let seg = st.segments.get_mut(&seg_base).expect("kept");
            let jobs: Vec<_> = seg
                .take_jobs()
                .into_iter()
                .map(|(k, j)| (seg_base, k, j))
                .collect();
            (jobs, seg.files().to_vec())
        };
        self.apply(run_jobs(jobs).await)?;
        sync_files(&self.shard, files).await?;
        {
            let mut st = self.state.borrow_mut();
            st.durable = st.next_offset;
            if let Some(s) = st.segments.get_mut(&seg_base) {
                s.unsynced = false;
            }
        }
        remove_segments_durably(&self.dir, &doomed).await?;
        if self.state.borrow().producers.transactional() {
            // A transaction whose marker was cut is open again: the state
            // is rebuilt from the snapshot below the cut (or the log start).
            let known = self.state.borrow().aborted.clone();
            self.rebuild_producer_state(Some(known)).await?;
        }
        self.wake_waiters();
        Ok(self.state.borrow().next_offset)
    }
}
