//! One segment: a `.log` file of batches and its two sparse indexes.
//!
//! Files are named by the segment's base offset, 20 decimal digits:
//! `00000000000000000000.log`, `.index`, `.timeindex`. A segment is
//! *active* (receives appends), *sealed* (rolled, waiting for its last
//! writes and fdatasync) or *finalized* (its final index entry written, every
//! file cut to its exact size and fdatasync'd; never written again unless a
//! truncation makes it active again).
//!
//! The `.log` file is preallocated ahead of the writer in steps
//! ([`crate::shard::ShardConfig::prealloc_step`]); the zeros past the logical
//! end read as an invalid batch, which is where recovery stops.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use glommio::io::{DmaFile, OpenOptions};
use weir_proto::batch::{self, BatchError, BatchHeader, HEADER_BYTES, LOG_OVERHEAD};

use crate::error::{Result, StorageError};
use crate::offset_index::{self, OffsetIndex};
use crate::tail_writer::{TailWriter, WriteJob};
use crate::testing::{self, IoOp};
use crate::time_index::{self, TimeIndex};

/// Bytes read per direct-I/O read while scanning a segment.
pub const SCAN_CHUNK_BYTES: u64 = 1 << 20;

/// The three files of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// `.log`
    Log,
    /// `.index`
    Index,
    /// `.timeindex`
    TimeIndex,
}

/// Where a segment is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentState {
    /// Receives appends.
    Active,
    /// Rolled; its last writes and fdatasync are pending.
    Sealed,
    /// Closed for good: exact sizes, final index entry, fdatasync'd.
    Finalized,
}

/// The file name stem of a segment.
pub fn file_stem(base: u64) -> String {
    format!("{base:020}")
}

/// Parses `00000000000000001234.log` into 1234.
pub fn parse_log_file_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".log")?;
    (stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()))
        .then(|| stem.parse().ok())
        .flatten()
}

/// One segment of a partition log (owned by the log's state).
#[derive(Debug)]
pub struct Segment {
    /// Offset of the first record the segment may hold.
    pub base: u64,
    /// Offset after its last batch (`base` when empty).
    pub next_offset: u64,
    /// Largest record timestamp (`i64::MIN` when empty).
    pub max_timestamp: i64,
    /// When it was created (ms), for `segment.ms`.
    pub created_ms: i64,
    /// The `.log` writer.
    pub log: TailWriter,
    /// In-memory offset index.
    pub index: OffsetIndex,
    /// The `.index` writer.
    pub index_w: TailWriter,
    /// In-memory time index.
    pub time_index: TimeIndex,
    /// The `.timeindex` writer.
    pub time_w: TailWriter,
    /// Log bytes appended since the last index entry (including its batch).
    pub bytes_since_index: u64,
    /// Base offset and position of the last batch.
    pub last_batch: Option<(u64, u64)>,
    /// Life stage.
    pub state: SegmentState,
    /// Written since the last fdatasync.
    pub unsynced: bool,
    /// Bytes of the `.log` known to be fdatasync'd.
    pub synced_len: u64,
    /// Index entries queued for (or written to) the index files.
    pub released: usize,
    /// Offset after each batch queued on the `.log` writer, in order.
    pub queued_ends: std::collections::VecDeque<u64>,
    /// A second descriptor of the `.log`, opened with `O_DSYNC`, for
    /// rounds written through (`ShardConfig::write_through_bytes_min`);
    /// opened on the first such round, dropped when the segment is sealed.
    pub log_write_through: Option<Rc<DmaFile>>,
}

/// Paths of a segment's three files.
pub fn paths(dir: &Path, base: u64) -> [PathBuf; 3] {
    let s = file_stem(base);
    [
        dir.join(format!("{s}.log")),
        dir.join(format!("{s}.index")),
        dir.join(format!("{s}.timeindex")),
    ]
}

async fn open_file(path: &Path, create: bool) -> Result<Rc<DmaFile>> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .dma_open(path)
        .await
        .map_err(|e| StorageError::io("open", path, e))?;
    if create {
        testing::note(|| IoOp::Create {
            path: path.to_path_buf(),
        });
    }
    Ok(Rc::new(f))
}

/// Opens `path` (an existing segment `.log`) again with `O_DSYNC`: a
/// direct write through it completes once its data, and the metadata
/// needed to read it back, are durable.
pub async fn open_write_through(path: &Path) -> Result<Rc<DmaFile>> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .dma_open(path)
        .await
        .map_err(|e| StorageError::io("open (O_DSYNC)", path, e))?;
    Ok(Rc::new(f))
}

async fn file_len(f: &DmaFile, path: &Path) -> Result<u64> {
    f.file_size()
        .await
        .map_err(|e| StorageError::io("stat", path, e))
}

fn read_index_file(path: &Path) -> Result<Vec<u8>> {
    testing::blocking_call("read_index_file");
    match std::fs::read(path) {
        Ok(b) => Ok(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(StorageError::io("read", path, e)),
    }
}

impl Segment {
    /// Creates an empty segment (truncating stale files of the same name).
    pub async fn create(dir: &Path, base: u64, now_ms: i64, prealloc_step: u64) -> Result<Segment> {
        Self::create_at(dir, paths(dir, base), base, now_ms, prealloc_step).await
    }

    /// Creates an empty segment in files at `[log, index, timeindex]`
    /// paths of `dir` (the cleaner writes `.cleaned` copies this way).
    pub async fn create_at(
        dir: &Path,
        [lp, ip, tp]: [PathBuf; 3],
        base: u64,
        now_ms: i64,
        prealloc_step: u64,
    ) -> Result<Segment> {
        let lf = open_file(&lp, true).await?;
        let ifl = open_file(&ip, true).await?;
        let tf = open_file(&tp, true).await?;
        for (f, p) in [(&lf, &lp), (&ifl, &ip), (&tf, &tp)] {
            f.truncate(0)
                .await
                .map_err(|e| StorageError::io("truncate", p, e))?;
            testing::note(|| IoOp::SetLen {
                path: p.clone(),
                len: 0,
            });
        }
        // The new names must be durable before data is acknowledged in
        // them; off the event loop (this runs at every segment roll).
        crate::checkpoint::sync_dir_async(dir).await?;
        Ok(Segment {
            base,
            next_offset: base,
            max_timestamp: i64::MIN,
            created_ms: now_ms,
            log: TailWriter::new(lf, lp, 0, prealloc_step),
            index: OffsetIndex::default(),
            index_w: TailWriter::new(ifl, ip, 0, 0),
            time_index: TimeIndex::default(),
            time_w: TailWriter::new(tf, tp, 0, 0),
            bytes_since_index: 0,
            last_batch: None,
            state: SegmentState::Active,
            unsynced: false,
            synced_len: 0,
            released: 0,
            queued_ends: Default::default(),
            log_write_through: None,
        })
    }

    /// Opens an existing segment as found on disk: the log's length is the
    /// file's, the indexes are their decoded prefixes. Recovery corrects
    /// both before the segment is used.
    pub async fn open(dir: &Path, base: u64, now_ms: i64, prealloc_step: u64) -> Result<Segment> {
        let [lp, ip, tp] = paths(dir, base);
        let lf = open_file(&lp, false).await?;
        let len = file_len(&lf, &lp).await?;
        // Small files, read on the blocking pool: the cleaner opens a
        // swapped-in segment on the event loop.
        let (ipc, tpc) = (ip.clone(), tp.clone());
        let (iraw, traw) = crate::checkpoint::run_blocking(move || {
            Ok((read_index_file(&ipc)?, read_index_file(&tpc)?))
        })
        .await?;
        let mut index = OffsetIndex::decode(&iraw);
        let mut time_index = TimeIndex::decode(&traw);
        // Entry k of one index pairs with entry k of the other: keep the
        // common prefix.
        let paired = index
            .entries()
            .iter()
            .zip(time_index.entries())
            .take_while(|((r, _), (_, t))| r == t)
            .count();
        index.truncate(paired);
        time_index.truncate(paired);
        let ifl = open_file(&ip, true).await?;
        let tf = open_file(&tp, true).await?;
        let (ilen, tlen) = (
            (index.len() * offset_index::ENTRY_BYTES) as u64,
            (time_index.len() * time_index::ENTRY_BYTES) as u64,
        );
        let mut seg = Segment {
            base,
            next_offset: base,
            max_timestamp: i64::MIN,
            created_ms: now_ms,
            log: TailWriter::new(lf, lp, len, prealloc_step),
            index,
            index_w: TailWriter::new(ifl, ip, ilen, 0),
            time_index,
            time_w: TailWriter::new(tf, tp, tlen, 0),
            bytes_since_index: 0,
            last_batch: None,
            state: SegmentState::Finalized,
            unsynced: false,
            synced_len: len,
            released: paired,
            queued_ends: Default::default(),
            log_write_through: None,
        };
        // Whatever lies past the decoded entries (padding, stale entries) is cut.
        if iraw.len() as u64 != ilen {
            seg.index_w.reset_to(ilen);
        }
        if traw.len() as u64 != tlen {
            seg.time_w.reset_to(tlen);
        }
        Ok(seg)
    }

    /// Logical size of the `.log` file.
    pub fn size(&self) -> u64 {
        self.log.end()
    }

    /// Whether it holds no batch.
    pub fn is_empty(&self) -> bool {
        self.log.end() == 0
    }

    /// Appends a validated batch (base offset already assigned). The bytes
    /// are queued for the next flush round.
    pub fn append(&mut self, data: Bytes, h: &BatchHeader, index_interval: u64) {
        let pos = self.log.end();
        let base_offset = h.base_offset as u64;
        self.max_timestamp = self.max_timestamp.max(h.max_timestamp);
        if self.last_batch.is_none() || self.bytes_since_index >= index_interval {
            self.add_index_point(base_offset, pos);
        }
        self.bytes_since_index += data.len() as u64;
        self.last_batch = Some((base_offset, pos));
        self.next_offset = h.last_offset() as u64 + 1;
        self.log.push(data);
        self.queued_ends.push_back(self.next_offset);
    }

    /// Adds an index point (offset and time entry) for the batch at `offset`, `pos`.
    ///
    /// The entry is used for lookups at once, but written to the index files
    /// only once its batch is fdatasync'd (see [`Segment::release_index_entries`]).
    pub fn add_index_point(&mut self, offset: u64, pos: u64) {
        let rel = (offset - self.base) as u32;
        if self.index.push(rel, pos as u32) {
            let pushed = self.time_index.push(self.max_timestamp, rel);
            assert!(pushed, "time index entries follow the offset index");
        }
        self.bytes_since_index = 0;
    }

    /// Queues for writing the index entries whose batches are fdatasync'd.
    ///
    /// Invariant: an index entry on disk points at a batch that, with every
    /// batch before it in the segment, reached the disk before the entry
    /// was written. So recovery may trust the log up to the last index
    /// entry it finds and scan only from there: no hole can hide before it.
    pub fn release_index_entries(&mut self) {
        while self.released < self.index.len() {
            let (rel, pos) = self.index.entries()[self.released];
            if pos as u64 >= self.synced_len {
                break;
            }
            let (ts, trel) = self.time_index.entries()[self.released];
            debug_assert_eq!(rel, trel);
            self.index_w
                .push(Bytes::copy_from_slice(&OffsetIndex::encode_entry(rel, pos)));
            self.time_w
                .push(Bytes::copy_from_slice(&TimeIndex::encode_entry(ts, rel)));
            self.released += 1;
        }
    }

    /// Records that the first `len` bytes of the `.log` are fdatasync'd.
    pub fn mark_synced(&mut self, len: u64) {
        self.synced_len = self.synced_len.max(len);
    }

    /// Whether some index entries are not yet queued for writing.
    pub fn has_unreleased(&self) -> bool {
        self.released < self.index.len()
    }

    /// Adds the final index point (for the last batch) if it has none, so
    /// the last time-index entry holds the segment's largest timestamp.
    pub fn add_final_index_point(&mut self) {
        if let Some((offset, pos)) = self.last_batch {
            let rel = (offset - self.base) as u32;
            if self.index.last().map(|(r, _)| r) != Some(rel) {
                self.add_index_point(offset, pos);
            }
        }
    }

    /// Takes the write jobs of the three files.
    pub fn take_jobs(&mut self) -> Vec<(FileKind, WriteJob)> {
        self.take_jobs_upto(u64::MAX).0
    }

    /// Takes the write jobs of the three files, the `.log` job limited to
    /// about `max_log_bytes`. Also returns, if queued batches remain, the
    /// offset up to which the jobs write (the first batch left behind).
    pub fn take_jobs_upto(
        &mut self,
        max_log_bytes: u64,
    ) -> (Vec<(FileKind, WriteJob)>, Option<u64>) {
        self.release_index_entries();
        let mut left = None;
        let log = self.log.take_job_upto(max_log_bytes).map(|(job, n)| {
            let n = n.min(self.queued_ends.len());
            let last = self.queued_ends.drain(..n).next_back();
            if !self.queued_ends.is_empty() {
                left = last;
            }
            job
        });
        if log.is_some() {
            self.unsynced = true;
        }
        let jobs = [
            (FileKind::Log, log),
            (FileKind::Index, self.index_w.take_job()),
            (FileKind::TimeIndex, self.time_w.take_job()),
        ]
        .into_iter()
        .filter_map(|(k, j)| j.map(|j| (k, j)))
        .collect();
        (jobs, left)
    }

    /// The writer of one of the files.
    pub fn writer(&mut self, kind: FileKind) -> &mut TailWriter {
        match kind {
            FileKind::Log => &mut self.log,
            FileKind::Index => &mut self.index_w,
            FileKind::TimeIndex => &mut self.time_w,
        }
    }

    /// Makes the next jobs cut every file to its logical size (no bytes
    /// may be pending: run the write jobs first).
    pub fn cut_files_to_size(&mut self) {
        self.log.truncate_to_end();
        self.index_w.truncate_to_end();
        self.time_w.truncate_to_end();
    }

    /// The three files, for fdatasync or close.
    pub fn files(&self) -> [(Rc<DmaFile>, PathBuf); 3] {
        [
            (self.log.file().clone(), self.log.path().clone()),
            (self.index_w.file().clone(), self.index_w.path().clone()),
            (self.time_w.file().clone(), self.time_w.path().clone()),
        ]
    }

    /// A cursor at `(offset, position)` (from [`Segment::floor`] or
    /// [`Segment::time_floor`]).
    pub fn cursor(&self, (offset, pos): (u64, u64)) -> SegmentCursor {
        SegmentCursor {
            base: self.base,
            file: self.log.file().clone(),
            path: self.log.path().clone(),
            align: self.log.align(),
            offset,
            pos,
            limit: self.log.written(),
        }
    }

    /// The nearest known (offset, position) at or before `offset`.
    pub fn floor(&self, offset: u64) -> (u64, u64) {
        let rel = offset.saturating_sub(self.base).min(u32::MAX as u64) as u32;
        match self.index.lookup(rel) {
            Some((r, p)) => (self.base + r as u64, p as u64),
            None => (self.base, 0),
        }
    }

    /// Where a scan for the first record with timestamp `>= ts` may start.
    pub fn time_floor(&self, ts: i64) -> (u64, u64) {
        match self.time_index.last_older_than(ts) {
            Some(rel) => self.floor(self.base + rel as u64),
            None => (self.base, 0),
        }
    }

    /// Cuts the segment to `pos` (a batch boundary at or below the written
    /// end) whose next offset is `next_offset`; `scan` describes the batches
    /// from the last index entry kept up to `pos`. The files are truncated
    /// by the next write jobs.
    pub fn cut(&mut self, pos: u64, next_offset: u64, scan: &ScanSummary) {
        let n = self.index.count_below_position(pos as u32);
        let n = n.min(self.time_index.len());
        self.index.truncate(n);
        self.time_index.truncate(n);
        self.log.reset_to(pos);
        self.queued_ends.clear();
        self.synced_len = self.synced_len.min(pos);
        self.released = self
            .released
            .min(n)
            .min((self.index_w.written() / offset_index::ENTRY_BYTES as u64) as usize)
            .min((self.time_w.written() / time_index::ENTRY_BYTES as u64) as usize);
        self.index_w
            .reset_to((self.released * offset_index::ENTRY_BYTES) as u64);
        self.time_w
            .reset_to((self.released * time_index::ENTRY_BYTES) as u64);
        self.next_offset = next_offset;
        self.max_timestamp = self
            .time_index
            .last()
            .map(|(t, _)| t)
            .unwrap_or(i64::MIN)
            .max(scan.max_timestamp);
        self.last_batch = scan.last_batch.or_else(|| {
            self.index
                .last()
                .map(|(r, p)| (self.base + r as u64, p as u64))
        });
        self.bytes_since_index = match self.index.last() {
            Some((_, p)) => pos - p as u64,
            None => 0,
        };
        self.state = SegmentState::Active;
    }
}

/// Where to scan a segment from, copied out of the log's state so that no
/// borrow is held across the I/O.
#[derive(Debug, Clone)]
pub struct SegmentCursor {
    /// The segment's base offset.
    pub base: u64,
    /// Its `.log` file.
    pub file: Rc<DmaFile>,
    /// The file's path.
    pub path: PathBuf,
    /// Alignment of direct-I/O reads.
    pub align: u64,
    /// Offset of the batch at `pos` (or a lower bound for it).
    pub offset: u64,
    /// Where to start reading.
    pub pos: u64,
    /// Bytes of the file written to disk (reads stop there).
    pub limit: u64,
}

impl SegmentCursor {
    /// Scans from the cursor up to `limit` (see [`scan`]).
    pub async fn scan(
        &self,
        limit: u64,
        visit: impl FnMut(&BatchHeader, u64, &Bytes) -> bool,
    ) -> Result<ScanSummary> {
        scan(
            &self.file,
            &self.path,
            self.align,
            self.base,
            self.pos,
            self.offset,
            limit,
            visit,
        )
        .await
    }

    /// The same segment from another (offset, position).
    pub fn at(&self, (offset, pos): (u64, u64)) -> SegmentCursor {
        SegmentCursor {
            offset,
            pos,
            ..self.clone()
        }
    }
}

/// Reads a segment's batches front to back from a cursor with several
/// reads in flight (tasks of the current task queue, so the disk stays
/// busy while batches are processed), validating each batch as a scan
/// does. A batch cut by a chunk boundary is stitched (only its own bytes
/// are copied). Used by the cleaner and by sequential readers' read-ahead;
/// reads still in flight when the stream is dropped are cancelled.
#[derive(Debug)]
pub struct SegmentStream {
    cur: SegmentCursor,
    chunk: u64,
    next_read: u64,
    inflight: std::collections::VecDeque<glommio::Task<Result<Bytes>>>,
    /// Bytes of a batch begun in the previous chunk.
    carry: BytesMut,
    expect_min: u64,
    /// Who reads, for errors ("cleaner", "read-ahead").
    reader: &'static str,
}

impl SegmentStream {
    /// A stream of `cur`'s segment from the cursor to its limit, in reads
    /// of `chunk` bytes.
    pub fn new(cur: SegmentCursor, chunk: u64, reader: &'static str) -> SegmentStream {
        SegmentStream {
            chunk: chunk.max(1),
            next_read: cur.pos,
            expect_min: cur.offset,
            cur,
            inflight: Default::default(),
            carry: BytesMut::new(),
            reader,
        }
    }

    fn corrupt(&self, reason: String) -> StorageError {
        StorageError::Corrupt {
            path: self.cur.path.clone(),
            reason: format!("{}: {reason}", self.reader),
        }
    }

    /// The batches of the next chunk(s) that complete any; `None` at the
    /// end of the segment. Keeps up to `depth` reads of at most
    /// `chunk_max` bytes (and the stream's chunk) in flight.
    pub async fn next(
        &mut self,
        depth: usize,
        chunk_max: u64,
    ) -> Result<Option<Vec<(BatchHeader, Bytes)>>> {
        loop {
            match self.next_chunk(depth, chunk_max).await? {
                Some(b) if b.is_empty() => continue,
                other => return Ok(other),
            }
        }
    }

    /// The batches completed by the next chunk (maybe none); `None` at the
    /// end of the segment.
    async fn next_chunk(
        &mut self,
        depth: usize,
        chunk_max: u64,
    ) -> Result<Option<Vec<(BatchHeader, Bytes)>>> {
        let chunk = self.chunk.min(chunk_max.max(1));
        while self.inflight.len() < depth.max(1) && self.next_read < self.cur.limit {
            let len = chunk.min(self.cur.limit - self.next_read);
            let (file, path, align, pos) = (
                self.cur.file.clone(),
                self.cur.path.clone(),
                self.cur.align,
                self.next_read,
            );
            let tq = glommio::executor().current_task_queue();
            let task = glommio::spawn_local_into(
                async move { read_range(&file, &path, align, pos, len).await },
                tq,
            )
            .map_err(|e| self.corrupt(format!("cannot spawn a read: {e}")))?;
            self.inflight.push_back(task);
            self.next_read += len;
        }
        let Some(task) = self.inflight.pop_front() else {
            if !self.carry.is_empty() {
                return Err(self.corrupt(format!(
                    "{} bytes at the end of the segment are not a whole batch",
                    self.carry.len()
                )));
            }
            return Ok(None);
        };
        let chunk = task.await?;
        let mut out = Vec::new();
        let mut rest = chunk;
        if !self.carry.is_empty() {
            // Complete the batch begun in the previous chunk: its header
            // first, then the rest of its bytes.
            if self.carry.len() < HEADER_BYTES {
                let take = (HEADER_BYTES - self.carry.len()).min(rest.len());
                self.carry.extend_from_slice(&rest[..take]);
                rest = rest.slice(take..);
                if self.carry.len() < HEADER_BYTES {
                    return Ok(Some(out));
                }
            }
            let h = BatchHeader::peek(&self.carry).map_err(|e| self.corrupt(e.to_string()))?;
            let total = h.total_len();
            if h.batch_length < (HEADER_BYTES - LOG_OVERHEAD) as i32
                || total as u64 > self.cur.limit
            {
                return Err(self.corrupt(format!("bad batch length {}", h.batch_length)));
            }
            let take = (total - self.carry.len()).min(rest.len());
            self.carry.extend_from_slice(&rest[..take]);
            rest = rest.slice(take..);
            if self.carry.len() < total {
                return Ok(Some(out));
            }
            let one = self.carry.split().freeze();
            let h = check(&one, self.cur.base, self.expect_min)
                .map_err(|e| self.corrupt(e.to_string()))?;
            self.expect_min = h.last_offset() as u64 + 1;
            out.push((h, one));
        }
        while !rest.is_empty() {
            match BatchHeader::parse_framed(&rest) {
                Ok(h) => {
                    let one = rest.slice(..h.total_len());
                    let h = check(&one, self.cur.base, self.expect_min)
                        .map_err(|e| self.corrupt(e.to_string()))?;
                    self.expect_min = h.last_offset() as u64 + 1;
                    rest = rest.slice(h.total_len()..);
                    out.push((h, one));
                }
                Err(BatchError::ShortHeader { .. } | BatchError::LengthPastEnd { .. })
                    if self.next_read < self.cur.limit || !self.inflight.is_empty() =>
                {
                    self.carry.extend_from_slice(&rest);
                    break;
                }
                Err(e) => return Err(self.corrupt(e.to_string())),
            }
        }
        Ok(Some(out))
    }
}

/// What a scan saw.
#[derive(Debug, Clone, Default)]
pub struct ScanSummary {
    /// Position after the last valid batch.
    pub end_pos: u64,
    /// Offset after the last valid batch (or the start offset).
    pub next_offset: u64,
    /// Largest timestamp seen.
    pub max_timestamp: i64,
    /// Base offset and position of the last valid batch seen.
    pub last_batch: Option<(u64, u64)>,
    /// Why the scan stopped before `limit`, if it did.
    pub stopped: Option<BatchError>,
}

/// Reads `[pos, pos + len)` of a file with aligned direct I/O into `Bytes`.
pub async fn read_range(
    file: &DmaFile,
    path: &Path,
    align: u64,
    pos: u64,
    len: u64,
) -> Result<Bytes> {
    let start = pos - pos % align;
    let end = (pos + len).div_ceil(align) * align;
    let r = file
        .read_at_aligned(start, (end - start) as usize)
        .await
        .map_err(|e| StorageError::io("read", path, e))?;
    let from = ((pos - start) as usize).min(r.len());
    let to = ((pos - start + len) as usize).min(r.len());
    let mut b = BytesMut::with_capacity(to - from);
    b.extend_from_slice(&r[from..to]);
    Ok(b.freeze())
}

/// Where the last data of `[from, to)` of a file ends, by the file
/// system's extent map (`SEEK_DATA`/`SEEK_HOLE`): holes and preallocated,
/// never-written extents are not data. Returns `to` if the file system
/// cannot tell, `from` if the range holds no data. A blocking `lseek` (cold
/// paths only); block granular, so the bytes before it may still be zeros.
pub fn data_extent_end(file: &DmaFile, from: u64, to: u64) -> u64 {
    use std::os::unix::io::AsRawFd;
    let fd = file.as_raw_fd();
    let mut pos = from;
    let mut end = from;
    while pos < to {
        // SAFETY: lseek on a descriptor we own; reads and writes use
        // positioned I/O, so moving the file offset affects nothing.
        let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            let e = std::io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::ENXIO) {
                end
            } else {
                to
            };
        }
        let data = data as u64;
        if data >= to {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data as libc::off_t, libc::SEEK_HOLE) };
        if hole < 0 {
            return to;
        }
        let hole = (hole as u64).min(to);
        end = hole;
        pos = hole;
    }
    end
}

/// Where the last non-zero byte of `[from, to)` of a file ends (`from` if
/// every byte is zero): extents first ([`data_extent_end`]), then reading
/// backwards in [`SCAN_CHUNK_BYTES`] chunks.
pub async fn nonzero_end(
    file: &DmaFile,
    path: &Path,
    align: u64,
    from: u64,
    to: u64,
) -> Result<u64> {
    let mut hi = data_extent_end(file, from, to);
    while hi > from {
        let lo = hi.saturating_sub(SCAN_CHUNK_BYTES).max(from);
        let chunk = read_range(file, path, align, lo, hi - lo).await?;
        if let Some(i) = chunk.iter().rposition(|&b| b != 0) {
            return Ok(lo + i as u64 + 1);
        }
        hi = lo;
    }
    Ok(from)
}

/// Scans batches from `pos` (where the batch with base offset
/// `start_offset` begins, or the first batch after it) up to `limit`,
/// validating each batch's framing, CRC and offset order. Calls `visit` for
/// each valid batch with its header, position and bytes; `visit` returns
/// false to stop early. Reading stops at the first invalid batch.
#[allow(clippy::too_many_arguments)]
pub async fn scan(
    file: &DmaFile,
    path: &Path,
    align: u64,
    seg_base: u64,
    mut pos: u64,
    start_offset: u64,
    limit: u64,
    mut visit: impl FnMut(&BatchHeader, u64, &Bytes) -> bool,
) -> Result<ScanSummary> {
    let mut sum = ScanSummary {
        end_pos: pos,
        next_offset: start_offset,
        max_timestamp: i64::MIN,
        last_batch: None,
        stopped: None,
    };
    let mut expect_min = start_offset;
    'outer: while pos < limit {
        let want = SCAN_CHUNK_BYTES.min(limit - pos);
        let chunk = read_range(file, path, align, pos, want).await?;
        let mut at = 0usize;
        loop {
            let rest = chunk.slice(at..);
            if rest.is_empty() {
                break;
            }
            let h = match BatchHeader::parse_framed(&rest) {
                Ok(h) => h,
                Err(BatchError::LengthPastEnd { needed, .. })
                    if at == 0 && pos + needed as u64 <= limit =>
                {
                    // One batch larger than the chunk: read exactly it.
                    let one = read_range(file, path, align, pos, needed as u64).await?;
                    match check(&one, seg_base, expect_min) {
                        Ok(h) => {
                            if !record(&mut sum, &h, pos, &one, &mut visit) {
                                break 'outer;
                            }
                            expect_min = sum.next_offset;
                            pos += needed as u64;
                            continue 'outer;
                        }
                        Err(e) => {
                            sum.stopped = Some(e);
                            break 'outer;
                        }
                    }
                }
                Err(BatchError::LengthPastEnd { .. } | BatchError::ShortHeader { .. })
                    if at > 0 =>
                {
                    // The batch continues past this chunk: read on from it.
                    break;
                }
                Err(e) => {
                    sum.stopped = Some(e);
                    break 'outer;
                }
            };
            let one = rest.slice(..h.total_len());
            match check(&one, seg_base, expect_min) {
                Ok(h) => {
                    if !record(&mut sum, &h, pos + at as u64, &one, &mut visit) {
                        break 'outer;
                    }
                    expect_min = sum.next_offset;
                    at += h.total_len();
                }
                Err(e) => {
                    sum.stopped = Some(e);
                    break 'outer;
                }
            }
        }
        if at == 0 {
            // Shorter than a header at the very end of the range.
            sum.stopped = Some(BatchError::ShortHeader { len: chunk.len() });
            break;
        }
        pos += at as u64;
    }
    Ok(sum)
}

/// Validates one stored batch (framing, CRC, codec, counts) and that its
/// offsets fit the segment and follow `expect_min`.
pub fn check(one: &[u8], seg_base: u64, expect_min: u64) -> Result<BatchHeader, BatchError> {
    let h = batch::validate(one)?;
    let base = h.base_offset;
    if base < 0
        || (base as u64) < expect_min
        || (base as u64) < seg_base
        || h.last_offset() as u64 - seg_base > u32::MAX as u64
    {
        return Err(BatchError::Records(
            "batch offset out of order for this segment",
        ));
    }
    Ok(h)
}

fn record(
    sum: &mut ScanSummary,
    h: &BatchHeader,
    pos: u64,
    bytes: &Bytes,
    visit: &mut impl FnMut(&BatchHeader, u64, &Bytes) -> bool,
) -> bool {
    let go_on = visit(h, pos, bytes);
    sum.end_pos = pos + h.total_len() as u64;
    sum.next_offset = h.last_offset() as u64 + 1;
    sum.max_timestamp = sum.max_timestamp.max(h.max_timestamp);
    sum.last_batch = Some((h.base_offset as u64, pos));
    go_on
}

/// Quick check that a header fits in one read of `HEADER_BYTES`.
pub const _HEADER_FITS: () = assert!((HEADER_BYTES as u64) < SCAN_CHUNK_BYTES);
