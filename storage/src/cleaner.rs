//! Log compaction: the cleaner keeps the latest record of every key.
//!
//! A log whose `cleanup.policy` includes `compact` is split into a *clean*
//! part (below `first_dirty`: compacted by an earlier pass) and a *dirty*
//! part (written since). Only closed, finalized segments are cleanable; the
//! active segment and any segment whose newest record is younger than
//! `min.compaction.lag.ms` (and everything after it) are not. A pass:
//!
//! 1. builds a map *key hash → latest offset* over the dirty part, from
//!    `first_dirty` on, within the shard's `log.cleaner.dedupe.buffer.size`
//!    ([`MAP_BYTES_PER_KEY`] bytes counted per key); if the map fills, the
//!    pass covers only the batches that fit (`map_end`) and the next pass
//!    continues from there;
//! 2. rewrites every cleanable segment below `map_end`, in groups of
//!    consecutive segments whose sizes add up to at most `segment.bytes`,
//!    into one new segment each, keeping a record unless a later record of
//!    its key lies below `map_end`, it has no key, or it is a tombstone
//!    (null value) whose segment was cleaned at least `delete.retention.ms`
//!    ago. Offsets never change: a rewritten batch keeps its base offset
//!    and `last_offset_delta` (records inside leave gaps), a batch that
//!    loses every record is dropped — except the last batch of a new
//!    segment, kept with no records, so each segment still ends where the
//!    next begins. Unchanged batches are copied byte for byte; a batch that
//!    lost records is re-encoded from the raw records kept (recompressed
//!    with its codec);
//! 3. swaps each new segment in (see *Swap*), drops the log's cached
//!    batches in its range, and finally stores `first_dirty = map_end`.
//!
//! ## Swap (crash safety)
//! The new segment is written as `<base>.log.cleaned` (+ `.index.cleaned`,
//! `.timeindex.cleaned`) and fdatasync'd. Then, holding the log's file
//! locks: the three files are renamed to `.swap` (the `.log` last) and the
//! directory fsync'd — from here the swap is decided; the replaced
//! segments' files are deleted, the `.swap` files renamed over the final
//! names (the `.log` last) and the directory fsync'd. `open` finishes a
//! decided swap (a `.log.swap` exists: delete every segment whose base lies
//! in the new segment's offset range, rename the `.swap` files) and
//! discards an undecided one (`.cleaned` files, `.swap` index files without
//! a `.log.swap`). So after a crash at any point either the old segments
//! or the new one are visible, never neither and never both.
//!
//! ## Cleaner checkpoint
//! `cleaner.checkpoint` holds `first_dirty` and, per segment of the clean
//! part, when it was cleaned (ms, the shard's clock) — the tombstone clock.
//! A segment made of several gets the latest of their times (or now, if it
//! holds records cleaned for the first time), so a tombstone is never
//! dropped earlier than `delete.retention.ms` after its first cleaning. The
//! file is replaced atomically; a missing or damaged one makes the whole
//! log dirty again and keeps every tombstone (safe, only slower).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weir_proto::batch::{self, BatchError, BatchHeader, Compression, HEADER_BYTES, LOG_OVERHEAD};
use weir_proto::record::Record;

use crate::checkpoint;
use crate::error::{Result, StorageError};
use crate::log::{LogInner, PartitionLog};
use crate::segment::{self, Segment, SegmentCursor, SegmentState, SegmentStream};
use crate::shard::{bump, ShardInner, StorageShard};

/// Default `log.cleaner.dedupe.buffer.size` per core.
pub const DEDUPE_BUFFER_BYTES_DEFAULT: u64 = 64 << 20;
/// Memory counted per key in the cleaner's map (a 16-byte key hash, an
/// 8-byte offset and the hash table's overhead).
pub const MAP_BYTES_PER_KEY: u64 = 32;
/// Default `log.cleaner.backoff.ms`: how long a core's cleaner sleeps when
/// no log needs cleaning.
pub const CLEANER_BACKOFF_MS_DEFAULT: u64 = 15_000;
/// Default cap of the cleaner's I/O while its core is appending (see
/// [`crate::ShardConfig::cleaner_io_busy_bytes_per_sec`]).
pub const CLEANER_IO_BUSY_BYTES_PER_SEC_DEFAULT: u64 = 100 << 20;
/// How long after an append the core counts as appending.
const BUSY_HOLD: Duration = Duration::from_millis(200);

/// File name of the cleaner checkpoint.
pub const CLEANER_CHECKPOINT_FILE: &str = "cleaner.checkpoint";
/// Suffix of a new segment's files while they are written.
pub const CLEANED_SUFFIX: &str = ".cleaned";
/// Suffix of a new segment's files once the swap is decided.
pub const SWAP_SUFFIX: &str = ".swap";

/// Bytes of batches collected before they are written out.
const WRITE_WINDOW_BYTES: u64 = 8 << 20;
/// Default bytes per cleaner read ([`crate::ShardConfig::cleaner_read_chunk_bytes`]).
pub const READ_CHUNK_BYTES_DEFAULT: u64 = 4 << 20;
/// Bytes of batches processed between two yields to the core's other
/// task queues (the produce and fetch paths).
const YIELD_EVERY_BYTES: u64 = 256 << 10;
const CHECKPOINT_MAGIC: &[u8; 8] = b"WEIRCLNR";
const CHECKPOINT_VERSION: u32 = 1;

/// What one cleaner pass did.
#[derive(Debug, Clone, PartialEq)]
pub struct CleanReport {
    /// `topic-partition`.
    pub partition: String,
    /// Bytes read (building the map and rewriting).
    pub bytes_read: u64,
    /// Bytes of segments written.
    pub bytes_written: u64,
    /// Records looked at while rewriting.
    pub records_read: u64,
    /// Records removed: superseded by a later record of their key, expired
    /// tombstones, records without a key.
    pub records_removed: u64,
    /// Of those, tombstones dropped after `delete.retention.ms`.
    pub tombstones_removed: u64,
    /// Cleanable segments rewritten.
    pub segments_before: usize,
    /// Segments they became.
    pub segments_after: usize,
    /// Log bytes before and after the pass.
    pub size_before: u64,
    /// Log bytes after the pass.
    pub size_after: u64,
    /// Dirty ratio before the pass.
    pub dirty_ratio_before: f64,
    /// Dirty ratio after the pass.
    pub dirty_ratio_after: f64,
    /// The clean part now ends here (the next pass starts its map here).
    pub first_dirty: u64,
    /// The map filled before the dirty part ended (more to do next pass).
    pub map_full: bool,
    /// Wall time of the pass.
    pub duration: Duration,
    /// Of which building the key map.
    pub map_duration: Duration,
}

/// The persistent cleaner state of one log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CleanerCheckpoint {
    /// Offsets below are clean.
    pub first_dirty: u64,
    /// Segment base → when it was cleaned (ms).
    pub cleaned_ms: BTreeMap<u64, i64>,
}

impl CleanerCheckpoint {
    /// Reads `dir/cleaner.checkpoint`; missing or damaged → empty (the
    /// whole log dirty, every tombstone kept).
    pub fn load(dir: &Path) -> CleanerCheckpoint {
        let path = dir.join(CLEANER_CHECKPOINT_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(_) => return CleanerCheckpoint::default(),
        };
        match Self::decode(&bytes) {
            Some(c) => c,
            None => {
                tracing::warn!(path = %path.display(),
                    "ignoring damaged cleaner checkpoint: the log is treated as dirty");
                CleanerCheckpoint::default()
            }
        }
    }

    fn decode(b: &[u8]) -> Option<CleanerCheckpoint> {
        if b.len() < 28 || &b[..8] != CHECKPOINT_MAGIC {
            return None;
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().ok()?) {
            return None;
        }
        let u32_at = |i: usize| Some(u32::from_be_bytes(body.get(i..i + 4)?.try_into().ok()?));
        let u64_at = |i: usize| Some(u64::from_be_bytes(body.get(i..i + 8)?.try_into().ok()?));
        if u32_at(8)? != CHECKPOINT_VERSION {
            return None;
        }
        let first_dirty = u64_at(12)?;
        let n = u32_at(20)? as usize;
        if body.len() != 24 + n * 16 {
            return None;
        }
        let cleaned_ms = (0..n)
            .map(|k| Some((u64_at(24 + k * 16)?, u64_at(32 + k * 16)? as i64)))
            .collect::<Option<_>>()?;
        Some(CleanerCheckpoint {
            first_dirty,
            cleaned_ms,
        })
    }

    /// Writes it atomically and durably (blocking; tests).
    #[cfg(test)]
    pub fn store(&self, dir: &Path) -> Result<()> {
        checkpoint::write_atomic(dir, CLEANER_CHECKPOINT_FILE, &self.encode())
    }

    /// Writes it atomically and durably, on the blocking pool.
    pub async fn store_async(&self, dir: &Path) -> Result<()> {
        checkpoint::write_atomic_async(dir, CLEANER_CHECKPOINT_FILE, self.encode()).await
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(28 + self.cleaned_ms.len() * 16);
        b.extend_from_slice(CHECKPOINT_MAGIC);
        b.extend_from_slice(&CHECKPOINT_VERSION.to_be_bytes());
        b.extend_from_slice(&self.first_dirty.to_be_bytes());
        b.extend_from_slice(&(self.cleaned_ms.len() as u32).to_be_bytes());
        for (base, ms) in &self.cleaned_ms {
            b.extend_from_slice(&base.to_be_bytes());
            b.extend_from_slice(&ms.to_be_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_be_bytes());
        b
    }
}

/// Paces the cleaner's I/O of one shard: a byte budget per second, the
/// lower one while the core is appending.
#[derive(Debug)]
pub(crate) struct Throttle {
    start: Instant,
    bytes: u64,
    rate: Option<u64>,
    last_appended: u64,
    busy_until: Instant,
}

impl Throttle {
    pub(crate) fn new() -> Throttle {
        let now = Instant::now();
        Throttle {
            start: now,
            bytes: 0,
            rate: None,
            last_appended: 0,
            busy_until: now,
        }
    }
}

/// Whether the shard appended in the last [`BUSY_HOLD`].
fn busy(shard: &ShardInner) -> bool {
    let mut t = shard.cleaner_throttle.borrow_mut();
    let now = Instant::now();
    let appended = shard.counters.appended_bytes.get();
    if appended != t.last_appended {
        t.last_appended = appended;
        t.busy_until = now + BUSY_HOLD;
    }
    now < t.busy_until
}

/// Counts `bytes` of cleaner I/O and sleeps as long as the budget says.
async fn pace(shard: &ShardInner, bytes: u64) {
    let busy = busy(shard);
    let wait = {
        let mut t = shard.cleaner_throttle.borrow_mut();
        let now = Instant::now();
        let cfg = &shard.config;
        let rate = match (busy, cfg.cleaner_io_busy_bytes_per_sec) {
            (true, Some(b)) => Some(cfg.cleaner_io_max_bytes_per_sec.map_or(b, |m| m.min(b))),
            _ => cfg.cleaner_io_max_bytes_per_sec,
        };
        if t.rate != rate || now.duration_since(t.start) > Duration::from_secs(1) {
            t.start = now;
            t.bytes = 0;
            t.rate = rate;
        }
        t.bytes += bytes;
        rate.filter(|&r| r > 0).and_then(|r| {
            let due = t.start + Duration::from_secs_f64(t.bytes as f64 / r as f64);
            due.checked_duration_since(now)
        })
    };
    if let Some(d) = wait {
        glommio::timer::sleep(d).await;
    }
    while shard.cleaner_paused.get() {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
}

/// A hasher for keys that are already hashes.
#[derive(Default)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }
}

/// 128 bits of hash of a key (XXH3-128): two distinct keys collide with
/// probability ~2^-128 per pair, so a collision (which would drop a live
/// key's value) is not a practical concern.
fn key_hash(key: &[u8]) -> u128 {
    twox_hash::XxHash3_128::oneshot(key)
}

/// Key hash → offset of the latest record of the key, bounded in entries.
struct KeyMap {
    map: HashMap<u128, u64, BuildHasherDefault<PreHashed>>,
    max: usize,
}

impl KeyMap {
    fn new(budget_bytes: u64, hint: usize) -> KeyMap {
        let max = (budget_bytes / MAP_BYTES_PER_KEY).max(1) as usize;
        KeyMap {
            map: HashMap::with_capacity_and_hasher(hint.min(max), Default::default()),
            max,
        }
    }

    /// Whether `n` more keys surely fit.
    fn fits(&self, n: usize) -> bool {
        self.map.len() + n <= self.max
    }

    fn latest(&self, key: &[u8]) -> Option<u64> {
        self.map.get(&key_hash(key)).copied()
    }
}

/// What a pass decided before rewriting: the key map (covering offsets
/// `first_dirty..map_end`), the pass's time and the log's config.
#[derive(Clone, Copy)]
struct PassParams<'a> {
    map: &'a KeyMap,
    map_end: u64,
    first_dirty: u64,
    now: i64,
    cfg: &'a crate::config::LogConfig,
    aborted: &'a Aborted,
}

/// The log's aborted transactions, by producer: (first offset, marker
/// offset) of each. A transactional batch inside one of its producer's
/// ranges is an aborted transaction's: the cleaner drops it (and keeps it
/// out of the key map), as Kafka's cleaner does. Markers are kept.
#[derive(Debug, Default)]
struct Aborted(std::collections::HashMap<i64, Vec<(u64, u64)>>);

impl Aborted {
    fn of(st: &crate::log::LogState) -> Aborted {
        let mut by = std::collections::HashMap::<i64, Vec<(u64, u64)>>::new();
        for e in st.aborted_entries() {
            by.entry(e.producer_id)
                .or_default()
                .push((e.first_offset, e.last_offset));
        }
        Aborted(by)
    }

    /// Whether batch `h` belongs to an aborted transaction.
    fn holds(&self, h: &BatchHeader) -> bool {
        if !h.attributes.is_transactional() || h.attributes.is_control() {
            return false;
        }
        let at = h.base_offset as u64;
        self.0
            .get(&h.producer_id)
            .is_some_and(|r| r.iter().any(|&(first, last)| first <= at && at <= last))
    }
}

/// A cleanable segment, copied out of the log's state.
#[derive(Debug, Clone)]
struct Source {
    base: u64,
    end: u64,
    size: u64,
    cursor: SegmentCursor,
    floor_first_dirty: (u64, u64),
    cleaned_ms: Option<i64>,
}

/// What the log's state says about cleaning, at one moment.
struct Plan {
    sources: Vec<Source>,
    first_dirty: u64,
    /// Where the uncleanable part starts.
    uncleanable: u64,
    clean_bytes: u64,
    dirty_bytes: u64,
}

impl Plan {
    fn ratio(&self) -> f64 {
        let total = self.clean_bytes + self.dirty_bytes;
        if total == 0 {
            0.0
        } else {
            self.dirty_bytes as f64 / total as f64
        }
    }
}

/// Outcome of filtering one batch.
enum Filtered {
    Unchanged,
    Rewritten(Bytes),
    Removed,
}

/// Filters one batch's records with `keep(offset, key, is_tombstone)`.
/// Returns the outcome and the number of records removed. With
/// `keep_empty`, a batch that loses every record is kept with none.
fn filter_batch(
    data: &Bytes,
    h: &BatchHeader,
    keep_empty: bool,
    mut keep: impl FnMut(u64, Option<&[u8]>, bool) -> bool,
) -> std::result::Result<(Filtered, u64), BatchError> {
    if h.attributes.is_control() || h.records_count == 0 {
        return Ok((Filtered::Unchanged, 0));
    }
    let (codec, records) = records_of(h, data)?;
    let section = records.data();
    let mut spans = Vec::new();
    let mut pos = 0usize;
    let count = h.records_count as usize;
    for _ in 0..count {
        let rest = section
            .get(pos..)
            .ok_or(BatchError::Records("records section ends early"))?;
        let (r, used) = Record::parse(rest)?;
        let offset = (h.base_offset + i64::from(r.offset_delta)) as u64;
        if keep(offset, r.key, r.value.is_none()) {
            spans.push(pos..pos + used);
        }
        pos += used;
    }
    let removed = (count - spans.len()) as u64;
    if removed == 0 {
        return Ok((Filtered::Unchanged, 0));
    }
    if spans.is_empty() && !keep_empty {
        return Ok((Filtered::Removed, removed));
    }
    let mut raw = Vec::with_capacity(spans.iter().map(|s| s.len()).sum());
    for s in &spans {
        raw.extend_from_slice(&section[s.clone()]);
    }
    let mut out_h = BatchHeader {
        records_count: spans.len() as i32,
        ..*h
    };
    let body = if spans.is_empty() || codec == Compression::None {
        if spans.is_empty() {
            // No records: store no codec either.
            out_h.attributes.0 &= !0x7;
        }
        raw
    } else {
        let mut c = Vec::with_capacity(raw.len() / 2);
        weir_proto::compression::compress(
            codec,
            &raw,
            weir_proto::compression::ZSTD_LEVEL_DEFAULT,
            &mut c,
        )?;
        c
    };
    let total = HEADER_BYTES + body.len();
    out_h.batch_length = (total - LOG_OVERHEAD) as i32;
    let mut out = BytesMut::zeroed(HEADER_BYTES);
    let mut head = [0u8; HEADER_BYTES];
    out_h.write(&mut head);
    out.copy_from_slice(&head);
    out.extend_from_slice(&body);
    let crc = batch::compute_crc(&out);
    batch::set_crc(&mut out, crc);
    Ok((Filtered::Rewritten(out.freeze()), removed))
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    crate::testing::blocking_call("rename");
    std::fs::rename(from, to).map_err(|e| StorageError::io("rename", to, e))?;
    crate::testing::note(|| crate::testing::IoOp::Rename {
        from: from.to_path_buf(),
        to: to.to_path_buf(),
    });
    Ok(())
}

/// Removes files on the blocking pool, ignoring failures (cleanup after an
/// error; `open` removes `.cleaned` leftovers anyway).
async fn remove_all_quietly(paths: Vec<PathBuf>) {
    let _ = checkpoint::run_blocking(move || {
        for p in &paths {
            let _ = remove_if_present(p);
        }
        Ok(())
    })
    .await;
}

fn remove_if_present(p: &Path) -> Result<()> {
    crate::testing::blocking_call("remove_if_present");
    match std::fs::remove_file(p) {
        Ok(()) => {
            crate::testing::note(|| crate::testing::IoOp::Remove {
                path: p.to_path_buf(),
            });
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::io("remove", p, e)),
    }
}

/// The offset after the last batch of a `.log` file (its base offset if
/// it holds none), reading only the batch headers. Used on a decided swap,
/// which was fdatasync'd whole before it was decided.
fn log_file_end(path: &Path, base: u64) -> Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).map_err(|e| StorageError::io("open", path, e))?;
    let len = f
        .metadata()
        .map_err(|e| StorageError::io("stat", path, e))?
        .len();
    let mut pos = 0u64;
    let mut end = base;
    let mut head = [0u8; HEADER_BYTES];
    while pos + HEADER_BYTES as u64 <= len {
        f.seek(SeekFrom::Start(pos))
            .and_then(|_| f.read_exact(&mut head))
            .map_err(|e| StorageError::io("read", path, e))?;
        let Ok(h) = BatchHeader::peek(&head) else {
            break;
        };
        if h.magic != batch::MAGIC || h.batch_length <= 0 {
            break;
        }
        end = h.last_offset() as u64 + 1;
        pos += h.total_len() as u64;
    }
    Ok(end)
}

/// Finishes decided swaps and discards undecided ones in `dir` (called by
/// `open` before it lists the segments).
pub(crate) fn recover_swaps(dir: &Path) -> Result<()> {
    let mut names = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| StorageError::io("list", dir, e))?;
    for e in entries {
        let e = e.map_err(|e| StorageError::io("list", dir, e))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    let mut changed = false;
    let mut decided = Vec::new();
    for n in &names {
        if n.ends_with(CLEANED_SUFFIX) {
            remove_if_present(&dir.join(n))?;
            changed = true;
        } else if let Some(stem) = n.strip_suffix(SWAP_SUFFIX) {
            if let Some(base) = segment::parse_log_file_name(stem) {
                decided.push(base);
            }
        }
    }
    for n in &names {
        // `.index.swap` / `.timeindex.swap` without a `.log.swap`: undecided.
        if let Some(stem) = n.strip_suffix(SWAP_SUFFIX) {
            if !stem.ends_with(".log") {
                let base = stem.split('.').next().and_then(|s| s.parse::<u64>().ok());
                if base.is_some_and(|b| !decided.contains(&b)) {
                    remove_if_present(&dir.join(n))?;
                    changed = true;
                }
            }
        }
    }
    for base in decided {
        let [lp, ip, tp] = segment::paths(dir, base);
        let swap_log = with_suffix(&lp, SWAP_SUFFIX);
        let end = log_file_end(&swap_log, base)?;
        tracing::warn!(dir = %dir.display(), base, end,
            "finishing a compaction swap interrupted by a crash");
        for n in &names {
            if let Some(b) = segment::parse_log_file_name(n) {
                if b > base && b < end {
                    for p in segment::paths(dir, b) {
                        remove_if_present(&p)?;
                    }
                }
            }
        }
        for p in [&ip, &tp, &lp] {
            let s = with_suffix(p, SWAP_SUFFIX);
            if s.exists() {
                rename(&s, p)?;
            }
        }
        changed = true;
    }
    if changed {
        checkpoint::sync_dir(dir)?;
    }
    Ok(())
}

impl ShardInner {
    /// The logs of this shard still open.
    pub(crate) fn live_logs(&self) -> Vec<Rc<LogInner>> {
        let mut logs = self.logs.borrow_mut();
        logs.retain(|w| w.strong_count() > 0);
        logs.iter().filter_map(Weak::upgrade).collect()
    }
}

impl StorageShard {
    /// Starts this core's cleaner: a task in a low-priority task queue
    /// (glommio shares 10 against the default queue's 1000, latency not
    /// important) that every `backoff` looks at the shard's compacted logs
    /// and cleans, one pass at a time, the dirtiest whose dirty ratio has
    /// reached its `min.cleanable.dirty.ratio`, until none has. Stops when
    /// the shard is dropped or `stop` returns true.
    pub fn start_cleaner(
        &self,
        backoff: Duration,
        stop: impl Fn() -> bool + 'static,
    ) -> Result<()> {
        let tq = glommio::executor().create_task_queue(
            glommio::Shares::Static(10),
            glommio::Latency::NotImportant,
            "weir-cleaner",
        );
        let shard = Rc::downgrade(&self.inner);
        glommio::spawn_local_into(cleaner_loop(shard, backoff, stop), tq)
            .map_err(|e| {
                StorageError::io(
                    "spawn the cleaner",
                    PathBuf::new(),
                    std::io::Error::other(e.to_string()),
                )
            })?
            .detach();
        Ok(())
    }
}

async fn cleaner_loop(shard: Weak<ShardInner>, backoff: Duration, stop: impl Fn() -> bool) {
    let step = Duration::from_millis(100).min(backoff);
    loop {
        let mut waited = Duration::ZERO;
        while waited < backoff {
            if stop() || shard.strong_count() == 0 {
                return;
            }
            glommio::timer::sleep(step).await;
            waited += step;
        }
        // Bounded: at most one pass per log per wake-up.
        let logs = match shard.upgrade() {
            Some(s) => s.live_logs(),
            None => return,
        };
        let mut candidates: Vec<(f64, PartitionLog)> = logs
            .into_iter()
            .map(|inner| PartitionLog { inner })
            .filter_map(|log| {
                let cfg = log.config();
                let r = log.dirty_ratio();
                (cfg.cleanup_policy.compacts() && r > 0.0 && r >= cfg.min_cleanable_dirty_ratio)
                    .then_some((r, log))
            })
            .collect();
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (_, log) in candidates {
            if stop() {
                return;
            }
            if let Err(e) = log.clean(false).await {
                tracing::warn!(partition = log.name(), error = %e, "cleaner pass failed");
            }
        }
    }
}

impl PartitionLog {
    /// The share of the cleanable part of a compacted log not cleaned yet:
    /// dirty bytes / (clean + dirty bytes), over closed segments older than
    /// `min.compaction.lag.ms`. 0 for a log that is not compacted.
    pub fn dirty_ratio(&self) -> f64 {
        let inner = &self.inner;
        let st = inner.state.borrow();
        if !st.config.cleanup_policy.compacts() {
            return 0.0;
        }
        plan_of(&st, inner.shard.clock.now_ms(), false).ratio()
    }

    /// Runs one cleaner pass now (see the module docs of `cleaner`). Without
    /// `force` it does nothing unless the dirty ratio has reached
    /// `min.cleanable.dirty.ratio`; with `force` (`weir topic compact`) it
    /// rewrites the cleanable part whatever the ratio (dropping expired
    /// tombstones even with nothing dirty). Returns `None` if the log is not
    /// compacted or nothing was cleanable. Reads go on during the pass.
    pub async fn clean(&self, force: bool) -> Result<Option<CleanReport>> {
        let inner = &self.inner;
        let _one = inner.lock(&inner.clean_lock).await?;
        inner.check_mode()?;
        let started = Instant::now();
        let now = inner.shard.clock.now_ms();
        let (plan, cfg, size_before, aborted) = {
            let st = inner.state.borrow();
            if !st.config.cleanup_policy.compacts() {
                return Ok(None);
            }
            (
                plan_of(&st, now, true),
                st.config.clone(),
                st.segments.values().map(|s| s.size()).sum::<u64>(),
                Aborted::of(&st),
            )
        };
        let ratio_before = plan.ratio();
        if plan.sources.is_empty()
            || (!force && (plan.dirty_bytes == 0 || ratio_before < cfg.min_cleanable_dirty_ratio))
        {
            return Ok(None);
        }
        let first_dirty = plan.first_dirty;
        let mut report = CleanReport {
            partition: inner.name.clone(),
            bytes_read: 0,
            bytes_written: 0,
            records_read: 0,
            records_removed: 0,
            tombstones_removed: 0,
            segments_before: 0,
            segments_after: 0,
            size_before,
            size_after: size_before,
            dirty_ratio_before: ratio_before,
            dirty_ratio_after: ratio_before,
            first_dirty,
            map_full: false,
            duration: Duration::ZERO,
            map_duration: Duration::ZERO,
        };

        // 1. The map over the dirty part.
        let mut map = KeyMap::new(
            inner.shard.config.cleaner_dedupe_buffer_bytes,
            (plan.dirty_bytes / 256) as usize + 1024,
        );
        let mut map_end = first_dirty;
        let mut full = false;
        'sources: for src in plan.sources.iter().filter(|s| s.end > first_dirty) {
            let mut stream = SegmentStream::new(
                src.cursor.at(src.floor_first_dirty),
                inner.shard.config.cleaner_read_chunk_bytes,
                "cleaner",
            );
            while let Some(batches) = next_batches(&mut stream, &inner.shard).await? {
                let read: u64 = batches.iter().map(|(_, b)| b.len() as u64).sum();
                report.bytes_read += read;
                pace(&inner.shard, read).await;
                let mut since_yield = 0u64;
                for (h, b) in &batches {
                    let last = h.last_offset() as u64;
                    if last < first_dirty {
                        continue;
                    }
                    if !map.fits(h.records_count.max(0) as usize) && !map.map.is_empty() {
                        full = true;
                        break 'sources;
                    }
                    // An aborted transaction's records never stand for
                    // their keys.
                    if !aborted.holds(h) {
                        add_to_map(&mut map, h, b, first_dirty)
                            .map_err(|e| corrupt(&src.cursor.path, e))?;
                    }
                    map_end = last + 1;
                    since_yield += b.len() as u64;
                    if since_yield >= YIELD_EVERY_BYTES {
                        since_yield = 0;
                        glommio::executor().yield_task_queue_now().await;
                    }
                }
            }
        }
        if !full {
            map_end = map_end.max(plan.uncleanable);
        }
        report.map_full = full;
        report.map_duration = started.elapsed();

        // 2. + 3. Rewrite and swap, group by group.
        let groups = group_sources(&plan.sources, map_end, cfg.segment_bytes);
        for group in groups {
            let end = self
                .rewrite_group(
                    &group,
                    &PassParams {
                        map: &map,
                        map_end,
                        first_dirty,
                        now,
                        cfg: &cfg,
                        aborted: &aborted,
                    },
                    &mut report,
                )
                .await?;
            if !inner.swap_in(&group, end).await? {
                // The log changed under the pass (retention, truncation):
                // stop here; the next pass starts over.
                map_end = first_dirty;
                break;
            }
            report.segments_before += group.len();
            report.segments_after += 1;
            let cleaned = if group.iter().any(|s| s.end > first_dirty) {
                now
            } else {
                group
                    .iter()
                    .filter_map(|s| s.cleaned_ms)
                    .max()
                    .unwrap_or(now)
            };
            {
                let mut st = inner.state.borrow_mut();
                for s in &group {
                    st.cleaner.cleaned_ms.remove(&s.base);
                }
                st.cleaner.cleaned_ms.insert(group[0].base, cleaned);
            }
            glommio::yield_if_needed().await;
        }
        let ckpt = {
            let mut st = inner.state.borrow_mut();
            let st = &mut *st;
            let segments = &st.segments;
            st.cleaner
                .cleaned_ms
                .retain(|b, _| segments.contains_key(b));
            st.cleaner.first_dirty = st.cleaner.first_dirty.max(map_end);
            st.cleaner.clone()
        };
        ckpt.store_async(&inner.dir).await?;
        {
            let st = inner.state.borrow();
            report.size_after = st.segments.values().map(|s| s.size()).sum();
            report.first_dirty = st.cleaner.first_dirty;
            report.dirty_ratio_after = plan_of(&st, now, false).ratio();
        }
        report.duration = started.elapsed();
        *inner.shard.last_clean.borrow_mut() = Some(report.clone());
        let c = &inner.shard.counters;
        bump(&c.cleaner_passes, 1);
        bump(&c.cleaner_bytes_read, report.bytes_read);
        bump(&c.cleaner_bytes_written, report.bytes_written);
        bump(&c.cleaner_records_removed, report.records_removed);
        bump(&c.cleaner_micros, report.duration.as_micros() as u64);
        tracing::info!(partition = %inner.name, bytes_read = report.bytes_read,
            bytes_written = report.bytes_written, records_removed = report.records_removed,
            tombstones_removed = report.tombstones_removed,
            segments = %format!("{} -> {}", report.segments_before, report.segments_after),
            dirty_ratio = %format!("{:.3} -> {:.3}", report.dirty_ratio_before, report.dirty_ratio_after),
            duration_ms = report.duration.as_millis() as u64,
            map_ms = report.map_duration.as_millis() as u64, map_full = report.map_full,
            "cleaner pass");
        Ok(Some(report))
    }

    /// Writes the cleaned copy of a group of segments as `.cleaned` files,
    /// fdatasync'd. Returns the offset the new segment ends at.
    async fn rewrite_group(
        &self,
        group: &[Source],
        pass: &PassParams<'_>,
        report: &mut CleanReport,
    ) -> Result<u64> {
        let inner = &self.inner;
        let base = group[0].base;
        let end = group.last().map(|s| s.end).unwrap_or(base);
        let paths = segment::paths(&inner.dir, base).map(|p| with_suffix(&p, CLEANED_SUFFIX));
        let mut out = Segment::create_at(
            &inner.dir,
            paths.clone(),
            base,
            pass.now,
            inner.shard.config.prealloc_step,
        )
        .await?;
        let result = self.copy_group(group, pass, report, &mut out).await;
        let result = match result {
            Ok(()) => finish_out(&inner.shard, &mut out).await,
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            drop(out);
            remove_all_quietly(paths.to_vec()).await;
            return Err(e);
        }
        if out.next_offset != end && !out.is_empty() {
            let e = StorageError::Corrupt {
                path: paths[0].clone(),
                reason: format!(
                    "cleaned segment ends at {} instead of {end}",
                    out.next_offset
                ),
            };
            remove_all_quietly(paths.to_vec()).await;
            return Err(e);
        }
        report.bytes_written += out.size();
        Ok(end)
    }

    async fn copy_group(
        &self,
        group: &[Source],
        pass: &PassParams<'_>,
        report: &mut CleanReport,
        out: &mut Segment,
    ) -> Result<()> {
        let PassParams {
            map,
            map_end,
            first_dirty,
            now,
            cfg,
            aborted,
        } = *pass;
        let interval = cfg.index_interval_bytes;
        for (k, src) in group.iter().enumerate() {
            let last_source = k + 1 == group.len();
            let expired = src
                .cleaned_ms
                .is_some_and(|t| now.saturating_sub(t) >= cfg.delete_retention_ms);
            let mut stream = SegmentStream::new(
                src.cursor.at((src.base, 0)),
                self.inner.shard.config.cleaner_read_chunk_bytes,
                "cleaner",
            );
            let mut next = next_batches(&mut stream, &self.inner.shard).await?;
            while let Some(batches) = next.take() {
                // The next chunk is known before this one is written out:
                // the last batch of the segment is the last of the last chunk.
                next = next_batches(&mut stream, &self.inner.shard).await?;
                let done = next.is_none();
                let read: u64 = batches.iter().map(|(_, b)| b.len() as u64).sum();
                report.bytes_read += read;
                pace(&self.inner.shard, read).await;
                let n = batches.len();
                let mut since_yield = 0u64;
                for (i, (h, b)) in batches.into_iter().enumerate() {
                    since_yield += b.len() as u64;
                    if since_yield >= YIELD_EVERY_BYTES {
                        since_yield = 0;
                        glommio::executor().yield_task_queue_now().await;
                    }
                    let is_last = last_source && done && i + 1 == n;
                    report.records_read += h.records_count.max(0) as u64;
                    if aborted.holds(&h) {
                        report.records_removed += h.records_count.max(0) as u64;
                        continue;
                    }
                    let mut tombstones = 0u64;
                    let (f, removed) = filter_batch(&b, &h, is_last, |offset, key, tomb| {
                        let Some(key) = key else { return false };
                        if offset < map_end && map.latest(key).is_some_and(|l| l > offset) {
                            return false;
                        }
                        if tomb && expired && offset < first_dirty {
                            tombstones += 1;
                            return false;
                        }
                        true
                    })
                    .map_err(|e| corrupt(&src.cursor.path, e))?;
                    report.records_removed += removed;
                    report.tombstones_removed += tombstones;
                    match f {
                        Filtered::Unchanged => out.append(b, &h, interval),
                        Filtered::Rewritten(nb) => {
                            let nh =
                                BatchHeader::peek(&nb).map_err(|e| corrupt(&src.cursor.path, e))?;
                            out.append(nb, &nh, interval)
                        }
                        Filtered::Removed => {}
                    }
                }
                let pending = out.log.end() - out.log.written();
                if pending >= WRITE_WINDOW_BYTES {
                    write_out(&mut *out).await?;
                    pace(&self.inner.shard, pending).await;
                }
            }
        }
        Ok(())
    }
}

/// Test hook: aborts the process at the named point of a swap when
/// `WEIR_CLEANER_FAIL_POINT` names it (`decided`, `replaced-removed`), so
/// crash tests reach the swap's windows deterministically.
fn fail_point(name: &str) {
    if std::env::var_os("WEIR_CLEANER_FAIL_POINT").is_some_and(|v| v == name) {
        std::process::abort();
    }
}

fn corrupt(path: &Path, e: BatchError) -> StorageError {
    StorageError::Corrupt {
        path: path.to_path_buf(),
        reason: format!("cleaner: {e}"),
    }
}

/// The records of a batch the scan already validated (framing, CRC),
/// decompressed if need be.
fn records_of<'a>(
    h: &BatchHeader,
    b: &'a Bytes,
) -> std::result::Result<(Compression, weir_proto::reader::DecodedRecords<'a>), BatchError> {
    let codec =
        Compression::from_id(h.attributes.0 & 0x7).ok_or(BatchError::UnknownCompression {
            id: h.attributes.0 & 0x7,
        })?;
    let section = b
        .get(HEADER_BYTES..h.total_len())
        .ok_or(BatchError::Records("batch shorter than its header says"))?;
    let data = match codec {
        Compression::None => std::borrow::Cow::Borrowed(section),
        c => std::borrow::Cow::Owned(weir_proto::compression::decompress(c, section)?),
    };
    Ok((codec, weir_proto::reader::DecodedRecords::new(*h, data)?))
}

/// Reads of one [`SegmentStream`] in flight.
const READ_DEPTH: usize = 3;
/// While the core appends: one read in flight, of at most this many bytes,
/// so the appends' writes and fdatasyncs do not queue behind the cleaner's.
const BUSY_READ_BYTES_MAX: u64 = 1 << 20;

/// The cleaner's next batches of `stream`: [`READ_DEPTH`] reads in flight,
/// one of at most [`BUSY_READ_BYTES_MAX`] while the core appends.
async fn next_batches(
    stream: &mut SegmentStream,
    shard: &ShardInner,
) -> Result<Option<Vec<(BatchHeader, Bytes)>>> {
    if busy(shard) {
        stream.next(1, BUSY_READ_BYTES_MAX).await
    } else {
        stream.next(READ_DEPTH, u64::MAX).await
    }
}

/// Adds the keyed records of one batch at or after `from` to the map.
fn add_to_map(
    map: &mut KeyMap,
    h: &BatchHeader,
    b: &Bytes,
    from: u64,
) -> std::result::Result<(), BatchError> {
    if h.attributes.is_control() || h.records_count == 0 {
        return Ok(());
    }
    let (_, records) = records_of(h, b)?;
    for r in records.iter() {
        let r = r?;
        let offset = r.offset as u64;
        if offset < from {
            continue;
        }
        if let Some(key) = r.record.key {
            map.map.insert(key_hash(key), offset);
        }
    }
    Ok(())
}

/// Consecutive sources below `map_end`, grouped so that each group's size
/// stays within `segment_bytes` and its offsets within a segment's `u32`
/// relative range.
fn group_sources(sources: &[Source], map_end: u64, segment_bytes: u64) -> Vec<Vec<Source>> {
    let mut groups: Vec<Vec<Source>> = Vec::new();
    let mut size = 0u64;
    for s in sources.iter().filter(|s| s.base < map_end) {
        let fits = groups.last().is_some_and(|g| {
            size + s.size <= segment_bytes && s.end - g[0].base <= u32::MAX as u64
        });
        if fits {
            size += s.size;
            groups.last_mut().expect("a group").push(s.clone());
        } else {
            size = s.size;
            groups.push(vec![s.clone()]);
        }
    }
    groups
}

/// Writes what is queued on a `.cleaned` segment.
async fn write_out(out: &mut Segment) -> Result<()> {
    let end = out.log.end();
    out.mark_synced(end);
    for (kind, job) in out.take_jobs() {
        match job.run().await {
            Ok(w) => out.writer(kind).complete(w),
            Err(e) => {
                out.writer(kind).fail();
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Final index entry, exact sizes, fdatasync of the three files.
async fn finish_out(shard: &ShardInner, out: &mut Segment) -> Result<()> {
    let end = out.log.end();
    out.mark_synced(end);
    out.add_final_index_point();
    write_out(out).await?;
    out.cut_files_to_size();
    write_out(out).await?;
    for (f, p) in out.files() {
        crate::tail_writer::fdatasync(&f, &p).await?;
        bump(&shard.counters.fdatasyncs, 1);
    }
    Ok(())
}

/// The cleanable segments and the dirty ratio, from the log's state.
fn plan_of(st: &crate::log::LogState, now: i64, with_sources: bool) -> Plan {
    let first_dirty = st.cleaner.first_dirty.max(st.log_start);
    let lag = st.config.min_compaction_lag_ms;
    let active = st.segments.keys().next_back().copied();
    let mut sources = Vec::new();
    let mut uncleanable = active.unwrap_or(st.next_offset);
    // Nothing at or past the last stable offset is cleaned: an open
    // transaction's records may still be aborted.
    let unstable = st.first_unstable_offset().unwrap_or(u64::MAX);
    let (mut clean_bytes, mut dirty_bytes) = (0, 0);
    for s in st.segments.values() {
        let too_young = lag > 0 && s.max_timestamp > now.saturating_sub(lag);
        let open_txn = s.next_offset > unstable;
        if Some(s.base) == active || s.state != SegmentState::Finalized || too_young || open_txn {
            uncleanable = s.base;
            break;
        }
        if s.next_offset > first_dirty {
            dirty_bytes += s.size();
        } else {
            clean_bytes += s.size();
        }
        if !with_sources {
            continue;
        }
        sources.push(Source {
            base: s.base,
            end: s.next_offset,
            size: s.size(),
            cursor: s.cursor((s.base, 0)),
            floor_first_dirty: s.floor(first_dirty.max(s.base)),
            cleaned_ms: st.cleaner.cleaned_ms.get(&s.base).copied(),
        });
    }
    Plan {
        sources,
        first_dirty,
        uncleanable,
        clean_bytes,
        dirty_bytes,
    }
}

impl LogInner {
    /// Swaps the `.cleaned` copy of `group` in (see the module docs).
    /// Returns false, with the copy removed, if the group changed since
    /// the pass began.
    async fn swap_in(self: &Rc<Self>, group: &[Source], end: u64) -> Result<bool> {
        let _files = self.lock_files().await?;
        let base = group[0].base;
        let [lp, ip, tp] = segment::paths(&self.dir, base);
        let cleaned = [&ip, &tp, &lp].map(|p| with_suffix(p, CLEANED_SUFFIX));
        let unchanged = self.check_mode().is_ok() && {
            let st = self.state.borrow();
            let active = st.segments.keys().next_back().copied();
            group.iter().all(|s| {
                Some(s.base) != active
                    && st.segments.get(&s.base).is_some_and(|seg| {
                        seg.state == SegmentState::Finalized && seg.size() == s.size
                    })
            })
        };
        // Renames, removals and directory fsyncs run on the blocking pool,
        // each step awaited before the next, so the order (and so the crash
        // safety) is the one described in the module docs.
        if !unchanged {
            checkpoint::run_blocking(move || cleaned.iter().try_for_each(|p| remove_if_present(p)))
                .await?;
            return Ok(false);
        }
        // Decide: `.cleaned` → `.swap`, the `.log` last.
        let (dir, finals) = (self.dir.clone(), [ip.clone(), tp.clone(), lp.clone()]);
        let (d, f) = (dir.clone(), finals.clone());
        checkpoint::run_blocking(move || {
            for (p, c) in f.iter().zip(&cleaned) {
                rename(c, &with_suffix(p, SWAP_SUFFIX))?;
            }
            checkpoint::sync_dir(&d)
        })
        .await?;
        fail_point("decided");
        // Carry out: the replaced segments go, the new one takes the name.
        let replaced: Vec<PathBuf> = group[1..]
            .iter()
            .flat_map(|s| {
                let txn_index = crate::log::txn_index_path(&self.dir, s.base);
                segment::paths(&self.dir, s.base)
                    .into_iter()
                    .chain([txn_index])
            })
            .collect();
        checkpoint::run_blocking(move || replaced.iter().try_for_each(|p| remove_if_present(p)))
            .await?;
        fail_point("replaced-removed");
        checkpoint::run_blocking(move || {
            for p in &finals {
                rename(&with_suffix(p, SWAP_SUFFIX), p)?;
            }
            checkpoint::sync_dir(&dir)
        })
        .await?;
        let now = self.shard.clock.now_ms();
        let mut seg = Segment::open(&self.dir, base, now, self.shard.config.prealloc_step).await?;
        if !crate::log::trust_closed(&mut seg).await? {
            return Err(StorageError::Corrupt {
                path: lp.clone(),
                reason: "the cleaned segment does not end with its final index entry".into(),
            });
        }
        if seg.is_empty() {
            seg.next_offset = end;
        }
        {
            let mut st = self.state.borrow_mut();
            for s in group {
                st.segments.remove(&s.base);
            }
            st.segments.insert(base, seg);
            st.merge_aborted(base, group[1..].iter().map(|s| s.base));
        }
        self.uncache(|c, id| c.remove_range(id, base, end));
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_round_trips_and_damage_means_empty() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            CleanerCheckpoint::load(d.path()),
            CleanerCheckpoint::default()
        );
        let c = CleanerCheckpoint {
            first_dirty: 1234,
            cleaned_ms: [(0, 5), (700, -1)].into_iter().collect(),
        };
        c.store(d.path()).unwrap();
        assert_eq!(CleanerCheckpoint::load(d.path()), c);
        let p = d.path().join(CLEANER_CHECKPOINT_FILE);
        let mut b = std::fs::read(&p).unwrap();
        b[13] ^= 1;
        std::fs::write(&p, b).unwrap();
        assert_eq!(
            CleanerCheckpoint::load(d.path()),
            CleanerCheckpoint::default()
        );
    }

    #[test]
    fn key_hashes_differ_and_are_stable() {
        assert_eq!(key_hash(b"a"), key_hash(b"a"));
        assert_ne!(key_hash(b"a"), key_hash(b"b"));
        assert_ne!(key_hash(b""), key_hash(b"\0"));
    }
}
