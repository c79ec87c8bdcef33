//! One core's syncs, grouped across files (group commit across partitions).
//!
//! A flush round writes every log that has new data, then each log asks for
//! the files it wrote to be made durable. Asked one by one, a round over
//! sixteen partitions is sixteen fdatasyncs: sixteen io_uring worker
//! wake-ups, journal commits joined only in part, and as many device
//! flushes — on a small machine the system time of those syncs, not the
//! disk, bounds a workload of many small appends (transactions: a marker
//! on every partition; Kafka clients: a request per partition).
//!
//! Here the requests of a core queue while its previous sync runs, and the
//! next sync serves all of them: a queue of one file is one fdatasync (as
//! before, through io_uring), a queue of several files is **one
//! `syncfs(2)`** of the file system that holds them, on the blocking pool.
//! `syncfs` writes back and commits everything of that file system —
//! every file of the queue among it — and flushes the device's cache, so
//! each queued file is as durable as after its own fdatasync (the
//! appends are direct I/O: there is little dirty page cache to write).
//! Its failure fails every file of the queue (each log then goes offline,
//! as after a failed fdatasync). Since Linux 5.8 `syncfs` reports
//! write-back errors of the file system; the data files' own write errors
//! are reported by their direct writes.
//!
//! Files on different file systems are not mixed: a queue with files of
//! several devices syncs each device's files on their own (one syncfs, or
//! one fdatasync, per device).

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

use futures_channel::oneshot;
use glommio::io::DmaFile;

use crate::error::{Result, StorageError};
use crate::shard::{bump, ShardInner};
use crate::testing::{self, IoOp};

/// A file waiting for a sync, and who to tell.
struct Waiting {
    file: Rc<DmaFile>,
    path: PathBuf,
    done: oneshot::Sender<Result<()>>,
}

/// The syncs of one core (see the module documentation).
#[derive(Default)]
pub(crate) struct SyncGroup {
    queue: RefCell<Vec<Waiting>>,
    /// A leader task is serving the queue.
    running: Cell<bool>,
}

/// Makes `files` durable, sharing the sync with every other file of this
/// core queued meanwhile. With the group off (`ShardConfig::sync_group`),
/// each file is fdatasync'd on its own, all concurrently.
pub(crate) async fn sync_files(
    shard: &Rc<ShardInner>,
    files: Vec<(Rc<DmaFile>, PathBuf)>,
) -> Result<()> {
    if files.is_empty() {
        return Ok(());
    }
    if !shard.config.sync_group {
        return sync_each(shard, files).await;
    }
    let group = &shard.syncs;
    let waits: Vec<_> = files
        .into_iter()
        .map(|(file, path)| {
            let (done, wait) = oneshot::channel();
            group.queue.borrow_mut().push(Waiting { file, path, done });
            wait
        })
        .collect();
    if !group.running.replace(true) {
        glommio::spawn_local(lead(shard.clone())).detach();
    }
    let mut first_err = None;
    for w in waits {
        let r = w.await.unwrap_or_else(|_| {
            Err(StorageError::Io {
                op: "sync",
                path: PathBuf::new(),
                source: std::sync::Arc::new(std::io::Error::other(
                    "the core's sync task ended before the sync",
                )),
            })
        });
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Serves the queue until it is empty: one sync per pass (per file
/// system, when the pass's files are on several).
async fn lead(shard: Rc<ShardInner>) {
    loop {
        // Let the other logs of this round queue their files first.
        futures_lite::future::yield_now().await;
        let batch = std::mem::take(&mut *shard.syncs.queue.borrow_mut());
        if batch.is_empty() {
            shard.syncs.running.set(false);
            return;
        }
        let syncs: Vec<_> = plan(batch)
            .into_iter()
            .map(|group| {
                let shard = shard.clone();
                glommio::spawn_local(async move {
                    let t = Instant::now();
                    let r = sync_group_of_files(&shard, &group).await;
                    count(&shard, t);
                    for w in group.into_iter().flat_map(|f| f.waiting) {
                        let _ = w.send(r.clone());
                    }
                })
            })
            .collect();
        for s in syncs {
            s.await;
        }
    }
}

/// One file of a pass and everyone waiting for it.
struct File {
    file: Rc<DmaFile>,
    path: PathBuf,
    waiting: Vec<oneshot::Sender<Result<()>>>,
}

/// A pass's syncs: its distinct files, grouped by file system (`st_dev`,
/// looked up only when there are several files). A file whose device
/// cannot be read is synced on its own.
fn plan(batch: Vec<Waiting>) -> Vec<Vec<File>> {
    let mut files: Vec<File> = Vec::new();
    for w in batch {
        match files.iter_mut().find(|f| Rc::ptr_eq(&f.file, &w.file)) {
            Some(f) => f.waiting.push(w.done),
            None => files.push(File {
                file: w.file,
                path: w.path,
                waiting: vec![w.done],
            }),
        }
    }
    if files.len() == 1 {
        return vec![files];
    }
    let mut groups: Vec<(Option<u64>, Vec<File>)> = Vec::new();
    for f in files {
        match device_of(&f.file) {
            Some(dev) => match groups.iter_mut().find(|(d, _)| *d == Some(dev)) {
                Some((_, g)) => g.push(f),
                None => groups.push((Some(dev), vec![f])),
            },
            None => groups.push((None, vec![f])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// The device (`st_dev`) of an open file, if it can be read.
fn device_of(file: &DmaFile) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open for the life of `file`; `st` is a
    // valid out-pointer.
    (unsafe { libc::fstat(file.as_raw_fd(), &mut st) } == 0).then_some(st.st_dev)
}

/// One sync for distinct files of one file system: an fdatasync for one
/// file, one syncfs for several.
async fn sync_group_of_files(shard: &ShardInner, files: &[File]) -> Result<()> {
    let [first, rest @ ..] = files else {
        return Ok(());
    };
    if rest.is_empty() {
        return crate::tail_writer::fdatasync(&first.file, &first.path).await;
    }
    if testing::fdatasync_fails() {
        return Err(testing::injected_eio("syncfs", first.path.clone()));
    }
    let issued = testing::issue_point();
    let fd = {
        use std::os::fd::AsRawFd;
        first.file.as_raw_fd()
    };
    // The file (and so its descriptor) is held by `files` until this returns.
    let r = crate::checkpoint::on_blocking_pool(move || {
        // SAFETY: a plain system call on a descriptor that stays open.
        if unsafe { libc::syncfs(fd) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    })
    .await;
    r.map_err(|e| StorageError::io("syncfs", &first.path, e))?;
    bump(&shard.counters.shared_syncs, 1);
    for f in files {
        testing::note(|| IoOp::Sync {
            path: f.path.clone(),
            issued,
        });
    }
    Ok(())
}

/// fdatasyncs each file on its own, all concurrently.
async fn sync_each(shard: &Rc<ShardInner>, files: Vec<(Rc<DmaFile>, PathBuf)>) -> Result<()> {
    let tasks: Vec<_> = files
        .into_iter()
        .map(|(f, p)| {
            let shard = shard.clone();
            glommio::spawn_local(async move {
                let t = Instant::now();
                let r = crate::tail_writer::fdatasync(&f, &p).await;
                count(&shard, t);
                r
            })
        })
        .collect();
    let mut first_err = None;
    for t in tasks {
        if let Err(e) = t.await {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Counts one sync call and its time.
fn count(shard: &ShardInner, since: Instant) {
    let us = since.elapsed().as_micros() as u64;
    let c = &shard.counters;
    bump(&c.fdatasyncs, 1);
    bump(&c.fdatasync_micros, us);
    if let Some(i) = crate::shard::FSYNC_BUCKETS_US.iter().position(|&b| us <= b) {
        bump(&c.fdatasync_buckets[i], 1);
    }
    if us > c.fdatasync_micros_max.get() {
        c.fdatasync_micros_max.set(us);
    }
}
