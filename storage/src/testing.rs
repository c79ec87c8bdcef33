//! Test-only hooks: an I/O journal for power-loss simulation, and a switch
//! that breaks durability on purpose. **Not for production use**: nothing
//! here is part of the supported API, and nothing here changes behaviour
//! unless a test turns it on.
//!
//! ## I/O journal
//! [`Journal::record`] starts recording every file operation the storage
//! crate completes under a directory: creations, direct-I/O writes (offset
//! and bytes), truncations, preallocations, fdatasyncs and fsyncs,
//! renames, removals and directory fsyncs. Each operation gets a sequence
//! number from one process-wide counter, taken when it *completed*; a
//! sync also carries the sequence number at which it was *issued*, as it
//! only covers what completed before that. A test can then rebuild the
//! directory as a power loss at any sequence number would leave it
//! (`storage/tests/it/power_loss.rs`).
//!
//! Recording is process-wide (the producer snapshot is written on glommio's
//! blocking pool, another thread) and filtered by directory, so tests
//! running in parallel record only their own directories. When nothing is
//! recorded the cost is one relaxed atomic load per file operation.
//!
//! Not covered: operations outside the crate's hooks (`remove_dir_all` of
//! a deleted log, the device probe's scratch file, reads).
//!
//! ## Blocking calls on an event loop
//! [`watch_event_loop`] declares the calling thread a core's event loop;
//! the crate's blocking file-system helpers then log each call they make on
//! it, and [`take_blocking_calls`] returns them. `tests/no_blocking.rs`
//! uses it to check that nothing after `open` blocks the loop.
//!
//! ## Skipping fdatasync
//! [`set_skip_fdatasync`] makes the flush round of every log *on the
//! calling thread* skip its fdatasync while still advancing the durable
//! offset and acknowledging waiters — the defect a power-loss test must
//! catch. Thread-local rather than process-wide, so that a test proving the
//! defect is caught cannot break other tests running in parallel threads of
//! the same binary. Segment finalization, truncation and the small files
//! still sync.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// One completed file operation, paths relative to the recorded directory.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IoOp {
    /// A file was opened with `create` (a new empty file if the name was free).
    Create {
        /// The file.
        path: PathBuf,
    },
    /// Bytes written at an offset.
    Write {
        /// The file.
        path: PathBuf,
        /// Where.
        offset: u64,
        /// What.
        data: Vec<u8>,
    },
    /// A write through an `O_DSYNC` descriptor completed: these bytes are
    /// durable by themselves (no other operation is made durable by it).
    DurableWrite {
        /// The file.
        path: PathBuf,
        /// Where.
        offset: u64,
        /// What.
        data: Vec<u8>,
    },
    /// The file's size set to `len` (truncated or extended with zeros).
    SetLen {
        /// The file.
        path: PathBuf,
        /// New size.
        len: u64,
    },
    /// The file's size raised to at least `len` (preallocation, zeros).
    Extend {
        /// The file.
        path: PathBuf,
        /// Size at least.
        len: u64,
    },
    /// fdatasync or fsync of a file completed: everything done to the file
    /// before sequence number `issued` is durable.
    Sync {
        /// The file.
        path: PathBuf,
        /// Sequence number when the sync was issued.
        issued: u64,
    },
    /// A rename.
    Rename {
        /// Old name.
        from: PathBuf,
        /// New name (replaced if present).
        to: PathBuf,
    },
    /// A name removed.
    Remove {
        /// The file.
        path: PathBuf,
    },
    /// fsync of a directory completed: every creation, rename and removal
    /// in it before sequence number `issued` is durable.
    DirSync {
        /// The directory (empty: the recorded directory itself).
        dir: PathBuf,
        /// Sequence number when the sync was issued.
        issued: u64,
    },
    /// A point a test marked (an acknowledgement, say).
    Mark {
        /// The test's tag.
        tag: u64,
    },
}

struct Recording {
    id: u64,
    root: PathBuf,
    ops: Vec<(u64, IoOp)>,
}

struct Recorder {
    next_seq: u64,
    next_id: u64,
    recordings: Vec<Recording>,
}

static RECORDING: AtomicBool = AtomicBool::new(false);
static RECORDER: Mutex<Recorder> = Mutex::new(Recorder {
    next_seq: 0,
    next_id: 0,
    recordings: Vec::new(),
});

fn recorder() -> std::sync::MutexGuard<'static, Recorder> {
    RECORDER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether anything is being recorded (cheap; check before copying bytes).
pub(crate) fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// The sequence number the next operation will get: a sync issued now
/// covers every operation numbered below it.
pub(crate) fn issue_point() -> u64 {
    if !recording() {
        return 0;
    }
    recorder().next_seq
}

/// Records `op` (built with paths absolute or as the crate saw them) for
/// every recording whose directory holds its path.
pub(crate) fn note(op: impl FnOnce() -> IoOp) {
    if !recording() {
        return;
    }
    let op = op();
    let mut r = recorder();
    let seq = r.next_seq;
    let mut hit = false;
    for rec in &mut r.recordings {
        if let Some(rel) = relative(&op, &rec.root) {
            rec.ops.push((seq, rel));
            hit = true;
        }
    }
    if hit {
        r.next_seq += 1;
    }
}

fn strip(p: &Path, root: &Path) -> Option<PathBuf> {
    p.strip_prefix(root).ok().map(Path::to_path_buf)
}

fn relative(op: &IoOp, root: &Path) -> Option<IoOp> {
    Some(match op {
        IoOp::Create { path } => IoOp::Create {
            path: strip(path, root)?,
        },
        IoOp::Write { path, offset, data } => IoOp::Write {
            path: strip(path, root)?,
            offset: *offset,
            data: data.clone(),
        },
        IoOp::DurableWrite { path, offset, data } => IoOp::DurableWrite {
            path: strip(path, root)?,
            offset: *offset,
            data: data.clone(),
        },
        IoOp::SetLen { path, len } => IoOp::SetLen {
            path: strip(path, root)?,
            len: *len,
        },
        IoOp::Extend { path, len } => IoOp::Extend {
            path: strip(path, root)?,
            len: *len,
        },
        IoOp::Sync { path, issued } => IoOp::Sync {
            path: strip(path, root)?,
            issued: *issued,
        },
        IoOp::Rename { from, to } => IoOp::Rename {
            from: strip(from, root)?,
            to: strip(to, root)?,
        },
        IoOp::Remove { path } => IoOp::Remove {
            path: strip(path, root)?,
        },
        IoOp::DirSync { dir, issued } => IoOp::DirSync {
            dir: strip(dir, root)?,
            issued: *issued,
        },
        IoOp::Mark { .. } => return None,
    })
}

/// A recording of the file operations under one directory; stops when
/// dropped or taken.
#[derive(Debug)]
pub struct Journal {
    id: u64,
    root: PathBuf,
}

impl Journal {
    /// Starts recording every operation on paths under `root` (compared as
    /// given: pass the same path the log is opened with).
    pub fn record(root: &Path) -> Journal {
        let mut r = recorder();
        let id = r.next_id;
        r.next_id += 1;
        r.recordings.push(Recording {
            id,
            root: root.to_path_buf(),
            ops: Vec::new(),
        });
        RECORDING.store(true, Ordering::Relaxed);
        Journal {
            id,
            root: root.to_path_buf(),
        }
    }

    /// Records a test's mark now; returns its sequence number. Every
    /// operation that completed before the call has a lower number.
    pub fn mark(&self, tag: u64) -> u64 {
        let mut r = recorder();
        let seq = r.next_seq;
        r.next_seq += 1;
        if let Some(rec) = r.recordings.iter_mut().find(|x| x.id == self.id) {
            rec.ops.push((seq, IoOp::Mark { tag }));
        }
        seq
    }

    /// The recorded directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Stops recording and returns `(sequence number, operation)` in order.
    pub fn take(self) -> Vec<(u64, IoOp)> {
        let ops = remove(self.id);
        std::mem::forget(self);
        ops
    }
}

fn remove(id: u64) -> Vec<(u64, IoOp)> {
    let mut r = recorder();
    let ops = match r.recordings.iter().position(|x| x.id == id) {
        Some(i) => r.recordings.swap_remove(i).ops,
        None => Vec::new(),
    };
    if r.recordings.is_empty() {
        RECORDING.store(false, Ordering::Relaxed);
    }
    ops
}

impl Drop for Journal {
    fn drop(&mut self) {
        remove(self.id);
    }
}

thread_local! {
    static SKIP_FDATASYNC: Cell<bool> = const { Cell::new(false) };
    static EVENT_LOOP: Cell<bool> = const { Cell::new(false) };
    static BLOCKING_CALLS: std::cell::RefCell<Vec<&'static str>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Declares (or no longer) the calling thread a core's event loop: the
/// blocking file-system calls the crate makes on it are logged.
pub fn watch_event_loop(on: bool) {
    EVENT_LOOP.with(|e| e.set(on));
}

/// The blocking calls logged on this thread since the last call.
pub fn take_blocking_calls() -> Vec<&'static str> {
    BLOCKING_CALLS.with(|b| std::mem::take(&mut *b.borrow_mut()))
}

/// Logs a blocking file-system call if this thread is a watched event loop.
pub(crate) fn blocking_call(what: &'static str) {
    if EVENT_LOOP.with(Cell::get) {
        BLOCKING_CALLS.with(|b| b.borrow_mut().push(what));
    }
}

/// Removals held back by [`hold_removals`], and how many wait.
static REMOVALS: std::sync::Mutex<(bool, usize)> = std::sync::Mutex::new((false, 0));
static REMOVALS_RELEASED: std::sync::Condvar = std::sync::Condvar::new();

/// With `true`, every file removal of this process (they run on the
/// blocking pool) waits until it is called with `false` — a slow unlink,
/// to see what waits behind one.
pub fn hold_removals(hold: bool) {
    REMOVALS.lock().unwrap_or_else(|e| e.into_inner()).0 = hold;
    if !hold {
        REMOVALS_RELEASED.notify_all();
    }
}

/// How many removals wait in [`hold_removals`] now.
pub fn removals_held() -> usize {
    REMOVALS.lock().unwrap_or_else(|e| e.into_inner()).1
}

/// Waits while removals are held ([`hold_removals`]).
pub(crate) fn removal_gate() {
    let mut r = REMOVALS.lock().unwrap_or_else(|e| e.into_inner());
    if !r.0 {
        return;
    }
    r.1 += 1;
    while r.0 {
        r = REMOVALS_RELEASED.wait(r).unwrap_or_else(|e| e.into_inner());
    }
    r.1 -= 1;
}

/// **Breaks durability on purpose.** With `true`, the flush rounds of logs
/// on the calling thread skip their fdatasync but still advance the durable
/// offset and acknowledge — the defect a power-loss test must catch.
pub fn set_skip_fdatasync(skip: bool) {
    SKIP_FDATASYNC.with(|s| s.set(skip));
}

/// Whether [`set_skip_fdatasync`] is on for this thread.
pub(crate) fn skip_fdatasync() -> bool {
    SKIP_FDATASYNC.with(Cell::get)
}

/// The environment variable of the fdatasync fault hook: a file path;
/// while that file exists, every fdatasync of this process fails with
/// EIO (what a dying disk, or a full thin-provisioned volume, answers).
/// For fault tests of whole processes (issue 31's fsyncgate case):
/// `io_uring` fsyncs cannot be intercepted with an `LD_PRELOAD` shim.
pub const FDATASYNC_EIO_ENV: &str = "WEIR_FAULT_FDATASYNC_EIO";

/// Whether the fdatasync fault hook is armed now ([`FDATASYNC_EIO_ENV`]).
pub(crate) fn fdatasync_fails() -> bool {
    static TRIGGER: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    file_hook_armed(&TRIGGER, FDATASYNC_EIO_ENV)
}

/// The environment variable of the write fault hook: a file path; while
/// that file exists, every segment write of this process fails with EIO
/// (a dying disk). For fault tests of whole processes, as
/// [`FDATASYNC_EIO_ENV`].
pub const WRITE_EIO_ENV: &str = "WEIR_FAULT_WRITE_EIO";

/// Whether the write fault hook is armed now ([`WRITE_EIO_ENV`]).
pub(crate) fn write_fails() -> bool {
    static TRIGGER: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    file_hook_armed(&TRIGGER, WRITE_EIO_ENV)
}

/// The error an armed fault hook answers for `op` on `path`: EIO.
pub(crate) fn injected_eio(
    op: &'static str,
    path: impl Into<std::path::PathBuf>,
) -> crate::StorageError {
    crate::StorageError::io(op, path, std::io::Error::from_raw_os_error(libc::EIO))
}

/// Whether a file-triggered test hook is armed now: the environment
/// variable `env` names a file (read once, into `trigger`); the hook is
/// armed while that file exists. Without the variable it costs one
/// `OnceLock` read.
pub fn file_hook_armed(
    trigger: &'static std::sync::OnceLock<Option<std::path::PathBuf>>,
    env: &str,
) -> bool {
    trigger
        .get_or_init(|| std::env::var_os(env).map(std::path::PathBuf::from))
        .as_ref()
        .is_some_and(|t| t.exists())
}
