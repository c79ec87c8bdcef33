//! One core's storage: the batch cache, the group committer and counters.
//!
//! A [`StorageShard`] is created inside a glommio executor and lives on that
//! core; every [`crate::PartitionLog`] it opens is owned by the same core.
//! Nothing here is `Send`: only this core touches its files, cache and state.
//!
//! **Group commit.** Appends only queue bytes. A single committer task per
//! core runs *flush rounds*: each round takes every log that has new data,
//! issues all their direct-I/O writes concurrently, then the syncs the
//! logs' flush policies ask for — one for all of them: a file is
//! fdatasync'd, several are made durable by one `syncfs`
//! (`crate::sync_group`) — then wakes the appenders
//! whose data is now written or durable. Appends that arrive during a round
//! go into the next one, so one sync covers every append of a tick.
//! The next round's writes start as soon as this round's writes are done,
//! whatever sync is in flight: a log's syncs of several rounds may be
//! pending at once (the core runs one sync at a time, and the files asked
//! for meanwhile share the next), their outcomes applied in round order
//! (`LogInner::round_locked`).

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::path::Path;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};

use crate::cache::{BatchCache, CacheStats, CACHE_BYTES_PER_CORE_DEFAULT};
use crate::clock::{Clock, SystemClock};
use crate::error::{Result, StorageError};
use crate::log::LogInner;

/// Upper bounds (µs) of the fdatasync latency histogram buckets.
pub const FSYNC_BUCKETS_US: [u64; 10] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 250_000,
];

/// Default [`ShardConfig::write_through_bytes_min`].
pub const WRITE_THROUGH_BYTES_MIN_DEFAULT: u64 = 512 << 10;

/// Default [`ShardConfig::write_through_alone_bytes_max`].
pub const WRITE_THROUGH_ALONE_BYTES_MAX_DEFAULT: u64 = 128 << 10;

/// Default preallocation step of segment files.
pub const PREALLOC_STEP_DEFAULT: u64 = 32 << 20;

/// Settings of one core's storage.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// Byte budget of the batch cache.
    pub cache_bytes: u64,
    /// Segment files are preallocated ahead of the writer in steps of this
    /// many bytes (0 disables preallocation).
    pub prealloc_step: u64,
    /// Memory the cleaner's key → offset map may use in one pass
    /// (`log.cleaner.dedupe.buffer.size`, per core).
    pub cleaner_dedupe_buffer_bytes: u64,
    /// The cleaner's I/O (bytes read + written) per second at most; `None`:
    /// unlimited (`log.cleaner.io.max.bytes.per.second`).
    pub cleaner_io_max_bytes_per_sec: Option<u64>,
    /// The cleaner's I/O per second at most while the core is appending
    /// (an append in the last 200 ms); `None`: no lower limit then.
    pub cleaner_io_busy_bytes_per_sec: Option<u64>,
    /// Bytes per cleaner read (a few are in flight per segment read).
    pub cleaner_read_chunk_bytes: u64,
    /// A flush round that appends at least this many bytes to a log's
    /// active segment, of a log that syncs every round (`flush.messages`
    /// 1, the default), writes them through an `O_DSYNC` descriptor
    /// instead of writing and then fdatasyncing: large rounds reach the
    /// disk's rate with syncs (each write durable on completion, several
    /// in flight), small ones keep write + fdatasync, which is faster for
    /// them (docs/benchmarks.md, issue 35). 0: never.
    pub write_through_bytes_min: u64,
    /// With `write_through_bytes_min` above 0, a flush round of the core
    /// that writes one log only, of fewer bytes than this, is written
    /// through too: one I/O instead of a write and an fdatasync (through
    /// io_uring's worker) — the lower latency for a partition alone on its
    /// core at a moderate rate. Rounds between this and
    /// `write_through_bytes_min` keep write + fdatasync, whose sync the
    /// next round's writes overlap; rounds of several logs keep the
    /// threshold, one shared sync (`sync_group`) beating a device flush
    /// per log. 0: off.
    pub write_through_alone_bytes_max: u64,
    /// Called when a log's fdatasync fails, after the log is taken
    /// offline. A failed fdatasync may have dropped the dirty pages it
    /// was to write ("fsyncgate"): retrying it can report success for
    /// data the disk never got, so a broker stops here rather than carry
    /// on. `None`: the log stays offline, the rest of the shard serves.
    pub on_sync_failure: Option<fn(&StorageError)>,
    /// Called when a log's write (or preallocation) fails — the disk is
    /// full, an I/O error — before the log rolls back to what it had
    /// written. `None`: the log rolls back and goes on, refusing each
    /// append that needs space it cannot get and serving reads (a one-node
    /// broker). A broker in a cluster stops instead: other replicas lead
    /// its partitions, and its followers, which may have been served
    /// batches appended after the written offset
    /// ([`crate::PartitionLog::read_appended`]), never see this log go on
    /// in the same leader epoch without them.
    pub on_write_failure: Option<fn(&StorageError)>,
    /// The files a core's flush rounds ask to sync at about the same time
    /// share one sync: one fdatasync for one file, one `syncfs(2)` for
    /// several (`crate::sync_group`). Off: each file is fdatasync'd on its
    /// own.
    pub sync_group: bool,
}

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig {
            cache_bytes: CACHE_BYTES_PER_CORE_DEFAULT,
            prealloc_step: PREALLOC_STEP_DEFAULT,
            cleaner_dedupe_buffer_bytes: crate::cleaner::DEDUPE_BUFFER_BYTES_DEFAULT,
            cleaner_io_max_bytes_per_sec: None,
            cleaner_io_busy_bytes_per_sec: Some(
                crate::cleaner::CLEANER_IO_BUSY_BYTES_PER_SEC_DEFAULT,
            ),
            cleaner_read_chunk_bytes: crate::cleaner::READ_CHUNK_BYTES_DEFAULT,
            write_through_bytes_min: WRITE_THROUGH_BYTES_MIN_DEFAULT,
            write_through_alone_bytes_max: WRITE_THROUGH_ALONE_BYTES_MAX_DEFAULT,
            on_sync_failure: None,
            on_write_failure: None,
            sync_group: true,
        }
    }
}

/// Counters of one core's storage (monotonic unless noted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Batches appended.
    pub appends: u64,
    /// Bytes appended.
    pub appended_bytes: u64,
    /// Flush rounds run.
    pub flush_rounds: u64,
    /// Sync calls issued: fdatasyncs, and syncfs calls that each made
    /// several files durable ([`ShardStats::shared_syncs`]).
    pub fdatasyncs: u64,
    /// Syncs that made several files durable at once (one `syncfs`).
    pub shared_syncs: u64,
    /// Total time spent in fdatasync, µs.
    pub fdatasync_micros: u64,
    /// Longest fdatasync, µs.
    pub fdatasync_micros_max: u64,
    /// fdatasyncs per latency bucket ([`FSYNC_BUCKETS_US`]; not cumulative;
    /// slower ones only in the total count).
    pub fdatasync_buckets: [u64; FSYNC_BUCKETS_US.len()],
    /// Failed writes or syncs.
    pub io_errors: u64,
    /// Bytes cut from torn or corrupt tails by recovery.
    pub recovery_truncated_bytes: u64,
    /// Segments scanned by recovery.
    pub recovery_scanned_segments: u64,
    /// Cache counters (occupancy is a gauge).
    pub cache: CacheStats,
    /// Cleaner passes that rewrote segments.
    pub cleaner_passes: u64,
    /// Bytes the cleaner read.
    pub cleaner_bytes_read: u64,
    /// Bytes the cleaner wrote.
    pub cleaner_bytes_written: u64,
    /// Records the cleaner removed (superseded, expired tombstones, keyless).
    pub cleaner_records_removed: u64,
    /// Time spent in cleaner passes, µs.
    pub cleaner_micros: u64,
    /// Bytes read ahead of sequential readers into the cache.
    pub read_ahead_bytes: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub appends: Cell<u64>,
    pub appended_bytes: Cell<u64>,
    pub flush_rounds: Cell<u64>,
    pub fdatasyncs: Cell<u64>,
    pub shared_syncs: Cell<u64>,
    pub fdatasync_micros: Cell<u64>,
    pub fdatasync_micros_max: Cell<u64>,
    pub fdatasync_buckets: [Cell<u64>; FSYNC_BUCKETS_US.len()],
    pub io_errors: Cell<u64>,
    pub recovery_truncated_bytes: Cell<u64>,
    pub recovery_scanned_segments: Cell<u64>,
    pub cleaner_passes: Cell<u64>,
    pub cleaner_bytes_read: Cell<u64>,
    pub cleaner_bytes_written: Cell<u64>,
    pub cleaner_records_removed: Cell<u64>,
    pub cleaner_micros: Cell<u64>,
    pub read_ahead_bytes: Cell<u64>,
}

pub(crate) fn bump(c: &Cell<u64>, by: u64) {
    c.set(c.get() + by);
}

pub(crate) struct ShardInner {
    pub cache: RefCell<BatchCache>,
    pub clock: Rc<dyn Clock>,
    pub config: ShardConfig,
    pub counters: Counters,
    dirty: RefCell<Vec<Rc<LogInner>>>,
    /// Every log opened on this shard (for the cleaner).
    pub(crate) logs: RefCell<Vec<Weak<LogInner>>>,
    /// The report of the cleaner's last pass.
    pub(crate) last_clean: RefCell<Option<crate::cleaner::CleanReport>>,
    /// Paces the cleaner's I/O.
    pub(crate) cleaner_throttle: RefCell<crate::cleaner::Throttle>,
    /// The cleaner waits (between reads and writes) while this is set.
    pub(crate) cleaner_paused: Cell<bool>,
    timed: RefCell<Vec<(Instant, Weak<LogInner>)>>,
    wake: LocalSender<()>,
    next_id: Cell<u64>,
    /// The core's syncs, grouped.
    pub(crate) syncs: crate::sync_group::SyncGroup,
}

/// One core's storage. Cheap to clone (a reference).
#[derive(Clone)]
pub struct StorageShard {
    pub(crate) inner: Rc<ShardInner>,
}

impl std::fmt::Debug for StorageShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageShard")
            .field("config", &self.inner.config)
            .finish()
    }
}

impl StorageShard {
    /// Creates the shard and spawns its committer. Must be called inside a
    /// glommio executor; the shard belongs to that executor's core.
    pub fn new(config: ShardConfig) -> Self {
        Self::with_clock(config, Rc::new(SystemClock))
    }

    /// Like [`StorageShard::new`] with an injected clock (tests).
    pub fn with_clock(config: ShardConfig, clock: Rc<dyn Clock>) -> Self {
        let (tx, rx) = local_channel::new_bounded(1);
        let inner = Rc::new(ShardInner {
            cache: RefCell::new(BatchCache::new(config.cache_bytes)),
            clock,
            config,
            counters: Counters::default(),
            dirty: RefCell::new(Vec::new()),
            logs: RefCell::new(Vec::new()),
            last_clean: RefCell::new(None),
            cleaner_throttle: RefCell::new(crate::cleaner::Throttle::new()),
            cleaner_paused: Cell::new(false),
            timed: RefCell::new(Vec::new()),
            wake: tx,
            next_id: Cell::new(1),
            syncs: Default::default(),
        });
        glommio::spawn_local(committer(Rc::downgrade(&inner), rx)).detach();
        StorageShard { inner }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ShardStats {
        let c = &self.inner.counters;
        ShardStats {
            appends: c.appends.get(),
            appended_bytes: c.appended_bytes.get(),
            flush_rounds: c.flush_rounds.get(),
            fdatasyncs: c.fdatasyncs.get(),
            shared_syncs: c.shared_syncs.get(),
            fdatasync_micros: c.fdatasync_micros.get(),
            fdatasync_micros_max: c.fdatasync_micros_max.get(),
            fdatasync_buckets: std::array::from_fn(|i| c.fdatasync_buckets[i].get()),
            io_errors: c.io_errors.get(),
            recovery_truncated_bytes: c.recovery_truncated_bytes.get(),
            recovery_scanned_segments: c.recovery_scanned_segments.get(),
            cache: self.inner.cache.borrow().stats(),
            cleaner_passes: c.cleaner_passes.get(),
            cleaner_bytes_read: c.cleaner_bytes_read.get(),
            cleaner_bytes_written: c.cleaner_bytes_written.get(),
            cleaner_records_removed: c.cleaner_records_removed.get(),
            cleaner_micros: c.cleaner_micros.get(),
            read_ahead_bytes: c.read_ahead_bytes.get(),
        }
    }

    /// The report of the last cleaner pass on this shard (automatic or
    /// asked for), if any.
    pub fn last_clean_report(&self) -> Option<crate::cleaner::CleanReport> {
        self.inner.last_clean.borrow().clone()
    }

    /// Pauses (or resumes) this core's cleaner: a pass in progress waits
    /// at its next read or write until resumed. For operators who need the
    /// disk for a while, and for benchmarks that compare with and without.
    pub fn set_cleaner_paused(&self, paused: bool) {
        self.inner.cleaner_paused.set(paused);
    }

    /// The clock this shard decides retention and roll by.
    pub fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }
}

impl ShardInner {
    pub fn next_log_id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    /// Remembers an opened log (the cleaner visits them).
    pub fn register(&self, log: &Rc<LogInner>) {
        let mut logs = self.logs.borrow_mut();
        logs.retain(|w| w.strong_count() > 0);
        logs.push(Rc::downgrade(log));
    }

    /// Queues a log for the next flush round.
    pub fn schedule(&self, log: &Rc<LogInner>) {
        if !log.in_dirty.replace(true) {
            self.dirty.borrow_mut().push(log.clone());
        }
        let _ = self.wake.try_send(());
    }

    /// Asks for a round at `at` for a log with data that `flush.ms` must sync.
    pub fn schedule_at(&self, at: Instant, log: &Rc<LogInner>) {
        self.timed.borrow_mut().push((at, Rc::downgrade(log)));
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.timed.borrow().iter().map(|(t, _)| *t).min()
    }

    fn take_due(&self) -> Vec<Rc<LogInner>> {
        let now = Instant::now();
        let mut due = Vec::new();
        self.timed.borrow_mut().retain(|(t, w)| {
            if *t <= now {
                if let Some(l) = w.upgrade() {
                    due.push(l);
                }
                false
            } else {
                w.strong_count() > 0
            }
        });
        due
    }
}

async fn committer(shard: Weak<ShardInner>, rx: LocalReceiver<()>) {
    loop {
        let deadline = match shard.upgrade() {
            Some(s) => s.next_deadline(),
            None => return,
        };
        let alive = match deadline {
            None => rx.recv().await.is_some(),
            Some(at) => {
                let wait = at.saturating_duration_since(Instant::now());
                futures_lite::future::or(async { rx.recv().await.is_some() }, async {
                    glommio::timer::sleep(wait.max(Duration::from_micros(100))).await;
                    true
                })
                .await
            }
        };
        if !alive {
            return;
        }
        // Let appenders woken by the previous round queue their next batches
        // first, so that this round carries more of them.
        futures_lite::future::yield_now().await;
        let Some(s) = shard.upgrade() else { return };
        for l in s.take_due() {
            s.schedule(&l);
        }
        let logs: Vec<Rc<LogInner>> = std::mem::take(&mut *s.dirty.borrow_mut());
        if logs.is_empty() {
            continue;
        }
        bump(&s.counters.flush_rounds, 1);
        drop(s);
        // Each log's round signals when its writes are done; its fdatasync
        // may still be in flight while the next round's writes start.
        // A round of one log alone may write small rounds through
        // (`write_through_alone_bytes_max`).
        let alone = logs.len() == 1;
        let writes_done: Vec<_> = logs
            .into_iter()
            .map(|l| {
                l.in_dirty.set(false);
                let (tx, rx) = futures_channel::oneshot::channel();
                glommio::spawn_local(async move { l.flush_round(tx, alone).await }).detach();
                rx
            })
            .collect();
        for rx in writes_done {
            let _ = rx.await;
        }
    }
}

/// glommio decides whether a device supports polled I/O by reading from the
/// first file it opens on it; on a new, empty file that read "succeeds" and
/// the device is wrongly marked pollable, after which every read fails with
/// EOPNOTSUPP. Opening a file with real data first makes the probe honest.
/// glommio keeps that verdict per thread, so this is done once per device
/// per executor thread.
pub(crate) async fn probe_device(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    thread_local!(static PROBED: RefCell<HashSet<u64>> = RefCell::new(HashSet::new()));
    let meta = std::fs::metadata(dir).map_err(|e| StorageError::io("stat", dir, e))?;
    let dev = meta.dev();
    if PROBED.with(|p| p.borrow().contains(&dev)) {
        return Ok(());
    }
    let path = dir.join(format!(
        ".weir-io-probe-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&path, vec![0u8; 4096]).map_err(|e| StorageError::io("write", &path, e))?;
    let f = glommio::io::DmaFile::open(&path)
        .await
        .map_err(|e| StorageError::io("open", &path, e))?;
    let _ = f.close().await;
    let _ = std::fs::remove_file(&path);
    PROBED.with(|p| p.borrow_mut().insert(dev));
    Ok(())
}
