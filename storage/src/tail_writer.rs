//! Appending to a file with direct I/O: aligned writes, the partial tail
//! block kept in memory and rewritten.
//!
//! O_DIRECT writes must start and end on the device's block boundaries. A
//! [`TailWriter`] keeps a copy of the bytes of the last, partially filled
//! block; each write starts at that block's boundary, re-sends those bytes
//! followed by the new ones, and pads the final block with zeros. The
//! rewritten prefix is byte-identical to what is on disk, so a torn rewrite
//! cannot damage data written before it: only the new bytes can be torn.
//!
//! The writer is split in a synchronous half (`push`, `take_job`,
//! `complete`), used under the log's `RefCell`, and the asynchronous
//! [`WriteJob::run`], which owns everything it needs so no borrow is held
//! across an `.await`. At most one job per writer is in flight (the log's
//! I/O lock guarantees it).

use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;
use glommio::io::DmaFile;

use crate::error::{Result, StorageError};
use crate::testing::{self, IoOp};

/// Alignment used for every direct-I/O write and read (at least the
/// device's logical block size).
pub const IO_ALIGN_MIN: u64 = 4096;
/// Largest single direct-I/O write; larger writes are split and issued
/// concurrently.
pub const WRITE_CHUNK_BYTES: u64 = 1 << 20;

/// Appends to one file.
#[derive(Debug)]
pub struct TailWriter {
    file: Rc<DmaFile>,
    path: PathBuf,
    align: u64,
    /// Logical bytes known to be on disk.
    written: u64,
    /// Logical end: written + in flight + pending.
    end: u64,
    /// Where the next job starts (== `written` when idle).
    next_pos: u64,
    /// The bytes `[align_down(next_pos), next_pos)`, if known.
    head: Option<Vec<u8>>,
    pending: Vec<Bytes>,
    truncate: Option<u64>,
    prealloc_step: u64,
    prealloc_end: u64,
    in_flight: bool,
}

/// One write (and maybe a truncate and a preallocation) to run.
#[derive(Debug)]
pub struct WriteJob {
    file: Rc<DmaFile>,
    path: PathBuf,
    align: u64,
    pos: u64,
    head: Option<Vec<u8>>,
    pending: Vec<Bytes>,
    truncate: Option<u64>,
    prealloc_to: Option<u64>,
    /// Logical end once the job is done.
    pub end: u64,
    /// Written through an `O_DSYNC` descriptor ([`WriteJob::write_through`]).
    durable: bool,
}

/// What a finished job leaves behind.
#[derive(Debug)]
pub struct Written {
    end: u64,
    head: Option<Vec<u8>>,
}

impl TailWriter {
    /// A writer for `file`, whose first `len` bytes are valid. `head` is the
    /// partial last block if the caller has it (else it is read on the
    /// first write). `prealloc_step` > 0 preallocates in steps of that size.
    pub fn new(file: Rc<DmaFile>, path: PathBuf, len: u64, prealloc_step: u64) -> Self {
        let align = file.alignment().max(IO_ALIGN_MIN);
        TailWriter {
            file,
            path,
            align,
            written: len,
            end: len,
            next_pos: len,
            head: if len % align == 0 {
                Some(Vec::new())
            } else {
                None
            },
            pending: Vec::new(),
            truncate: None,
            prealloc_step,
            prealloc_end: 0,
            in_flight: false,
        }
    }

    /// The file.
    pub fn file(&self) -> &Rc<DmaFile> {
        &self.file
    }
    /// The file's path.
    pub fn path(&self) -> &PathBuf {
        &self.path
    }
    /// Alignment of reads and writes.
    pub fn align(&self) -> u64 {
        self.align
    }
    /// Logical bytes on disk.
    pub fn written(&self) -> u64 {
        self.written
    }
    /// Logical end including bytes not yet written.
    pub fn end(&self) -> u64 {
        self.end
    }
    /// Whether a job would do anything.
    pub fn has_work(&self) -> bool {
        !self.pending.is_empty() || self.truncate.is_some()
    }

    /// Queues bytes after the logical end.
    pub fn push(&mut self, bytes: Bytes) {
        self.end += bytes.len() as u64;
        self.pending.push(bytes);
    }

    /// Forgets everything past `len` (which must be `<= written`): the next
    /// job truncates the file to `len` first. Pending bytes are dropped.
    pub fn reset_to(&mut self, len: u64) {
        assert!(!self.in_flight, "reset while a write is in flight");
        assert!(len <= self.written, "reset past the written end");
        self.written = len;
        self.end = len;
        self.next_pos = len;
        self.pending.clear();
        self.head = if len % self.align == 0 {
            Some(Vec::new())
        } else {
            None
        };
        self.truncate = Some(len);
        self.prealloc_end = len;
    }

    /// Takes the queued work as a job, or `None` if there is none.
    pub fn take_job(&mut self) -> Option<WriteJob> {
        self.take_job_upto(u64::MAX).map(|(j, _)| j)
    }

    /// Takes queued work as a job: the queued byte strings, in order, while
    /// they total at most `max_bytes` (but at least one). Returns the job
    /// and how many byte strings it took; the rest stays queued.
    pub fn take_job_upto(&mut self, max_bytes: u64) -> Option<(WriteJob, usize)> {
        if !self.has_work() {
            return None;
        }
        let mut take = 0;
        let mut bytes = 0u64;
        for b in &self.pending {
            if take > 0 && bytes + b.len() as u64 > max_bytes {
                break;
            }
            bytes += b.len() as u64;
            take += 1;
        }
        let pending: Vec<Bytes> = if take == self.pending.len() {
            std::mem::take(&mut self.pending)
        } else {
            self.pending.drain(..take).collect()
        };
        assert!(!self.in_flight, "two jobs in flight on one file");
        self.in_flight = true;
        let prealloc_to = if self.prealloc_step > 0 && self.end > self.prealloc_end {
            let to = self.end.div_ceil(self.prealloc_step) * self.prealloc_step;
            self.prealloc_end = to;
            Some(to)
        } else {
            None
        };
        let job = WriteJob {
            file: self.file.clone(),
            path: self.path.clone(),
            align: self.align,
            pos: self.next_pos,
            head: self.head.take(),
            pending,
            truncate: self.truncate.take(),
            prealloc_to,
            end: self.next_pos + bytes,
            durable: false,
        };
        Some((job, take))
    }

    /// Bytes queued and not yet taken by a job.
    pub fn queued_bytes(&self) -> u64 {
        self.end - self.next_pos
    }

    /// Makes the next job cut the file to its logical end (used when a
    /// segment is closed, to drop preallocated space and padding).
    pub fn truncate_to_end(&mut self) {
        assert!(
            self.pending.is_empty(),
            "truncate_to_end with pending bytes"
        );
        self.truncate = Some(self.end);
        self.prealloc_end = self.end;
    }

    /// Records a finished job.
    pub fn complete(&mut self, done: Written) {
        self.in_flight = false;
        self.written = done.end;
        self.next_pos = done.end;
        self.head = done.head;
    }

    /// Records a failed job: nothing past `written` is trusted, the next
    /// job truncates back to it. The caller rolls the log back.
    pub fn fail(&mut self) {
        self.in_flight = false;
        self.reset_to(self.written);
    }
}

/// fdatasyncs a file (recorded for power-loss tests, see [`crate::testing`]).
pub async fn fdatasync(file: &DmaFile, path: &Path) -> Result<()> {
    if testing::fdatasync_fails() {
        return Err(testing::injected_eio("fdatasync", path.to_path_buf()));
    }
    let issued = testing::issue_point();
    file.fdatasync()
        .await
        .map_err(|e| StorageError::io("fdatasync", path, e))?;
    testing::note(|| IoOp::Sync {
        path: path.to_path_buf(),
        issued,
    });
    Ok(())
}

impl WriteJob {
    /// Bytes the job appends.
    pub fn len(&self) -> u64 {
        self.end - self.pos
    }

    /// Whether the job appends nothing (it may still truncate or
    /// preallocate).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs the job through `file`, a descriptor of the same file opened
    /// with `O_DSYNC`: each write is durable when it completes (its data
    /// and the metadata needed to read it), so the round need not
    /// fdatasync this file for it.
    pub fn write_through(&mut self, file: Rc<DmaFile>) {
        self.file = file;
        self.durable = true;
    }

    /// Runs the job: truncate, preallocate, then one aligned write.
    pub async fn run(self) -> Result<Written> {
        let io = |op: &'static str, path: &PathBuf| {
            let path = path.clone();
            move |e: glommio::GlommioError<()>| StorageError::io(op, path, e)
        };
        if let Some(len) = self.truncate {
            self.file
                .truncate(len)
                .await
                .map_err(io("truncate", &self.path))?;
            testing::note(|| IoOp::SetLen {
                path: self.path.clone(),
                len,
            });
        }
        if let Some(to) = self.prealloc_to {
            self.file
                .pre_allocate(to, false)
                .await
                .map_err(io("preallocate", &self.path))?;
            testing::note(|| IoOp::Extend {
                path: self.path.clone(),
                len: to,
            });
        }
        if self.pending.is_empty() {
            return Ok(Written {
                end: self.pos,
                head: self.head,
            });
        }
        let start = self.pos - self.pos % self.align;
        let head_len = (self.pos - start) as usize;
        let head = match self.head {
            Some(h) => h,
            None => {
                let r = self
                    .file
                    .read_at_aligned(start, self.align as usize)
                    .await
                    .map_err(io("read tail block", &self.path))?;
                if r.len() < head_len {
                    return Err(StorageError::Corrupt {
                        path: self.path.clone(),
                        reason: format!(
                            "file ends before its logical end {} (tail block read {} bytes)",
                            self.pos,
                            r.len()
                        ),
                    });
                }
                r[..head_len].to_vec()
            }
        };
        debug_assert_eq!(head.len(), head_len);
        let total = self.end - start;
        let buf_len = total.div_ceil(self.align) * self.align;
        // Split into chunks written concurrently: one huge write would run
        // at queue depth 1.
        let chunk = WRITE_CHUNK_BYTES.max(self.align);
        let mut bufs = Vec::with_capacity(buf_len.div_ceil(chunk) as usize);
        let mut sources = std::iter::once(&head[..])
            .chain(self.pending.iter().map(|b| &b[..]))
            .filter(|s| !s.is_empty());
        let mut cur: &[u8] = sources.next().unwrap_or(&[]);
        let mut at = 0u64;
        let mut new_head = Vec::new();
        let tail_start = self.end - self.end % self.align - start;
        while at < buf_len {
            let len = chunk.min(buf_len - at);
            let mut buf = self.file.alloc_dma_buffer(len as usize);
            let dst = buf.as_bytes_mut();
            let mut filled = 0usize;
            while filled < dst.len() && !cur.is_empty() {
                let n = cur.len().min(dst.len() - filled);
                dst[filled..filled + n].copy_from_slice(&cur[..n]);
                filled += n;
                cur = &cur[n..];
                if cur.is_empty() {
                    cur = sources.next().unwrap_or(&[]);
                }
            }
            dst[filled..].fill(0);
            if at + len > tail_start {
                let from = tail_start.saturating_sub(at) as usize;
                let to = (total.min(at + len) - at) as usize;
                if from < to {
                    new_head.extend_from_slice(&dst[from..to]);
                }
            }
            bufs.push((at, len, buf));
            at += len;
        }
        if testing::write_fails() {
            return Err(testing::injected_eio("write", self.path.clone()));
        }
        let tasks: Vec<_> = bufs
            .into_iter()
            .map(|(at, len, buf)| {
                let file = self.file.clone();
                let path = self.path.clone();
                let durable = self.durable;
                glommio::spawn_local(async move {
                    let copy = testing::recording().then(|| buf.as_bytes().to_vec());
                    let n = file.write_at(buf, start + at).await?;
                    if let Some(data) = copy {
                        let (offset, data) = (start + at, data[..n].to_vec());
                        testing::note(|| {
                            if durable {
                                IoOp::DurableWrite { path, offset, data }
                            } else {
                                IoOp::Write { path, offset, data }
                            }
                        });
                    }
                    Ok::<_, glommio::GlommioError<()>>(n as u64 == len)
                })
            })
            .collect();
        let mut all_full = true;
        let mut first_err = None;
        for t in tasks {
            match t.await {
                Ok(full) => all_full &= full,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(StorageError::io("write", self.path.clone(), e));
        }
        if !all_full {
            return Err(StorageError::io(
                "write",
                self.path.clone(),
                std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    format!("short write at {start}"),
                ),
            ));
        }
        Ok(Written {
            end: self.end,
            head: Some(new_head),
        })
    }
}
