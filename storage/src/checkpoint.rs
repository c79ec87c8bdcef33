//! Small per-partition files: the checkpoint and the clean-shutdown marker.
//!
//! Both are tiny, written rarely (segment close, `delete_before`, shutdown)
//! and replaced atomically: write a temporary file, fsync it, rename it over
//! the old one, fsync the directory. A crash (or power loss) at any point
//! leaves either the old file or the new one, whole; `.tmp` leftovers are
//! removed by `open`.
//!
//! ## Blocking calls and the event loop
//! The file-system calls here (`open`, `write`, `fsync`, `rename`,
//! `unlink`) block. The plain functions ([`write_atomic`], [`sync_dir`],
//! [`remove_file`], [`Checkpoint::store`]) are for cold paths off a core's
//! event loop — `PartitionLog::open`'s recovery, which blocks by design, and
//! callers in other crates. Code running on a core's event loop (segment
//! roll, flush round, truncation, retention, close, the cleaner) uses the
//! `_async` forms, which run the same calls, in the same order, on glommio's
//! blocking thread pool ([`run_blocking`]) so the core keeps serving while a
//! directory fsync waits for the disk.
//!
//! ```text
//! partition.checkpoint (32 bytes)        .clean_shutdown (24 bytes)
//!   0  8 magic "WEIRCKPT"                  0  8 magic "WEIRCLEN"
//!   8  4 version (u32 BE) = 1              8  4 version (u32 BE) = 1
//!  12  8 log_start_offset (u64 BE)        12  8 log_end_offset (u64 BE)
//!  20  8 recovery_point (u64 BE)          20  4 crc32c of bytes 0..20
//!  28  4 crc32c of bytes 0..28
//! ```
//!
//! `recovery_point`: every segment whose base offset is below it was closed
//! cleanly (fdatasync'd, files cut to their exact size, final index entry
//! written), so recovery after a crash only scans segments at or above it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Result, StorageError};
use crate::testing::{self, IoOp};

/// File name of the checkpoint.
pub const CHECKPOINT_FILE: &str = "partition.checkpoint";
/// File name of the clean-shutdown marker.
pub const CLEAN_SHUTDOWN_FILE: &str = ".clean_shutdown";

const CHECKPOINT_MAGIC: &[u8; 8] = b"WEIRCKPT";
const MARKER_MAGIC: &[u8; 8] = b"WEIRCLEN";
const VERSION: u32 = 1;

/// The partition checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checkpoint {
    /// First offset readable (raised by retention and `delete_before`).
    pub log_start_offset: u64,
    /// Segments with a base offset below this were closed cleanly.
    pub recovery_point: u64,
}

fn seal(mut body: Vec<u8>) -> Vec<u8> {
    let crc = crc32c::crc32c(&body);
    body.extend_from_slice(&crc.to_be_bytes());
    body
}

fn open_sealed(path: &Path, magic: &[u8; 8], len: usize) -> Result<Option<Vec<u8>>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StorageError::io("read", path, e)),
    };
    let corrupt = |reason: &str| StorageError::Corrupt {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    if bytes.len() != len || &bytes[..8] != magic {
        return Err(corrupt("not a Weir file of this kind (size or magic)"));
    }
    let crc = u32::from_be_bytes(bytes[len - 4..].try_into().expect("4 bytes"));
    if crc32c::crc32c(&bytes[..len - 4]) != crc {
        return Err(corrupt("checksum mismatch"));
    }
    let version = u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(corrupt(&format!("unsupported version {version}")));
    }
    Ok(Some(bytes))
}

/// Writes `bytes` to `dir/name` atomically and durably (blocking; see
/// [`write_atomic_async`] on a core's event loop).
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    testing::blocking_call("write_atomic");
    let tmp = dir.join(format!("{name}.tmp"));
    let dst = dir.join(name);
    let mut f = fs::File::create(&tmp).map_err(|e| StorageError::io("create", &tmp, e))?;
    testing::note(|| IoOp::Create { path: tmp.clone() });
    testing::note(|| IoOp::SetLen {
        path: tmp.clone(),
        len: 0,
    });
    f.write_all(bytes)
        .map_err(|e| StorageError::io("write", &tmp, e))?;
    testing::note(|| IoOp::Write {
        path: tmp.clone(),
        offset: 0,
        data: bytes.to_vec(),
    });
    let issued = testing::issue_point();
    f.sync_all()
        .map_err(|e| StorageError::io("write", &tmp, e))?;
    testing::note(|| IoOp::Sync {
        path: tmp.clone(),
        issued,
    });
    fs::rename(&tmp, &dst).map_err(|e| StorageError::io("rename", &dst, e))?;
    testing::note(|| IoOp::Rename {
        from: tmp.clone(),
        to: dst.clone(),
    });
    sync_dir(dir)
}

/// fsyncs a directory so that creations, renames and unlinks in it are
/// durable (blocking; see [`sync_dir_async`] on a core's event loop).
pub fn sync_dir(dir: &Path) -> Result<()> {
    testing::blocking_call("sync_dir");
    let issued = testing::issue_point();
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StorageError::io("fsync directory", dir, e))?;
    testing::note(|| IoOp::DirSync {
        dir: dir.to_path_buf(),
        issued,
    });
    Ok(())
}

/// How often a core looks again for the result of blocking work it waits
/// for (see [`on_blocking_pool`]).
pub const BLOCKING_RESULT_POLL_MS: u64 = 10;

/// Runs `work` on the current glommio executor's blocking thread pool and
/// waits for it without blocking the core. Must be called on a glommio
/// executor.
///
/// glommio 0.9 can miss the wake-up of a finished blocking job when its
/// executor has gone to sleep with nothing else to do (seen as a test
/// executor asleep in `io_uring_enter` for minutes while its blocking
/// thread was idle, its result delivered). So the wait also arms a timer
/// every [`BLOCKING_RESULT_POLL_MS`]: each wake-up makes the reactor
/// collect finished blocking jobs. A job that finishes before the first
/// tick costs one timer.
pub async fn on_blocking_pool<R: Send + 'static>(work: impl FnOnce() -> R + Send + 'static) -> R {
    let job = glommio::executor().spawn_blocking(work);
    let mut job = std::pin::pin!(job);
    loop {
        let done = futures_lite::future::or(async { Some(job.as_mut().await) }, async {
            glommio::timer::sleep(std::time::Duration::from_millis(BLOCKING_RESULT_POLL_MS)).await;
            None
        })
        .await;
        if let Some(r) = done {
            return r;
        }
    }
}

/// Runs blocking file-system work on the blocking thread pool
/// ([`on_blocking_pool`]).
pub async fn run_blocking<R: Send + 'static>(
    work: impl FnOnce() -> Result<R> + Send + 'static,
) -> Result<R> {
    on_blocking_pool(work).await
}

/// [`write_atomic`] on the blocking pool (for a core's event loop).
pub async fn write_atomic_async(dir: &Path, name: &str, bytes: Vec<u8>) -> Result<()> {
    let (dir, name) = (dir.to_path_buf(), name.to_string());
    run_blocking(move || write_atomic(&dir, &name, &bytes)).await
}

/// [`sync_dir`] on the blocking pool (for a core's event loop).
pub async fn sync_dir_async(dir: &Path) -> Result<()> {
    let dir = dir.to_path_buf();
    run_blocking(move || sync_dir(&dir)).await
}

/// Removes files (absent ones are skipped), then fsyncs `dir` so the
/// removals are durable; on the blocking pool (for a core's event loop).
/// A directory removed meanwhile (its log deleted) is not an error: its
/// files are gone with it.
pub async fn remove_files_durably(dir: &Path, files: Vec<PathBuf>) -> Result<()> {
    let dir = dir.to_path_buf();
    run_blocking(move || {
        for f in &files {
            remove_file(f)?;
        }
        if !dir.exists() {
            return Ok(());
        }
        sync_dir(&dir)
    })
    .await
}

/// Removes a file (blocking); `Ok(false)` if it was not there. Not durable
/// until the directory is synced.
pub fn remove_file(path: &Path) -> Result<bool> {
    testing::blocking_call("remove_file");
    testing::removal_gate();
    match fs::remove_file(path) {
        Ok(()) => {
            testing::note(|| IoOp::Remove {
                path: path.to_path_buf(),
            });
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StorageError::io("remove", path, e)),
    }
}

impl Checkpoint {
    /// Reads `dir/partition.checkpoint`; `None` if there is none.
    pub fn load(dir: &Path) -> Result<Option<Checkpoint>> {
        let Some(b) = open_sealed(&dir.join(CHECKPOINT_FILE), CHECKPOINT_MAGIC, 32)? else {
            return Ok(None);
        };
        Ok(Some(Checkpoint {
            log_start_offset: u64::from_be_bytes(b[12..20].try_into().expect("8 bytes")),
            recovery_point: u64::from_be_bytes(b[20..28].try_into().expect("8 bytes")),
        }))
    }

    fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(32);
        body.extend_from_slice(CHECKPOINT_MAGIC);
        body.extend_from_slice(&VERSION.to_be_bytes());
        body.extend_from_slice(&self.log_start_offset.to_be_bytes());
        body.extend_from_slice(&self.recovery_point.to_be_bytes());
        seal(body)
    }

    /// Writes it atomically and durably (blocking).
    pub fn store(&self, dir: &Path) -> Result<()> {
        write_atomic(dir, CHECKPOINT_FILE, &self.encode())
    }

    /// Writes it atomically and durably, on the blocking pool.
    pub async fn store_async(&self, dir: &Path) -> Result<()> {
        write_atomic_async(dir, CHECKPOINT_FILE, self.encode()).await
    }
}

fn clean_marker(log_end_offset: u64) -> Vec<u8> {
    let mut body = Vec::with_capacity(24);
    body.extend_from_slice(MARKER_MAGIC);
    body.extend_from_slice(&VERSION.to_be_bytes());
    body.extend_from_slice(&log_end_offset.to_be_bytes());
    seal(body)
}

/// Writes the clean-shutdown marker (blocking).
pub fn store_clean_marker(dir: &Path, log_end_offset: u64) -> Result<()> {
    write_atomic(dir, CLEAN_SHUTDOWN_FILE, &clean_marker(log_end_offset))
}

/// Writes the clean-shutdown marker, on the blocking pool.
pub async fn store_clean_marker_async(dir: &Path, log_end_offset: u64) -> Result<()> {
    write_atomic_async(dir, CLEAN_SHUTDOWN_FILE, clean_marker(log_end_offset)).await
}

/// Reads and removes the clean-shutdown marker, returning the log end offset
/// it recorded. A damaged marker counts as absent (the log is then
/// recovered as after a crash).
pub fn take_clean_marker(dir: &Path) -> Result<Option<u64>> {
    let path: PathBuf = dir.join(CLEAN_SHUTDOWN_FILE);
    let found = match open_sealed(&path, MARKER_MAGIC, 24) {
        Ok(Some(b)) => Some(u64::from_be_bytes(b[12..20].try_into().expect("8 bytes"))),
        Ok(None) => return Ok(None),
        Err(e) => {
            tracing::warn!(error = %e, "ignoring damaged clean-shutdown marker");
            None
        }
    };
    remove_file(&path)?;
    sync_dir(dir)?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_and_marker_round_trip_and_detect_damage() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(Checkpoint::load(d.path()).unwrap(), None);
        let c = Checkpoint {
            log_start_offset: 7,
            recovery_point: 42,
        };
        c.store(d.path()).unwrap();
        assert_eq!(Checkpoint::load(d.path()).unwrap(), Some(c));
        store_clean_marker(d.path(), 99).unwrap();
        assert_eq!(take_clean_marker(d.path()).unwrap(), Some(99));
        assert_eq!(take_clean_marker(d.path()).unwrap(), None);
        let p = d.path().join(CHECKPOINT_FILE);
        let mut b = fs::read(&p).unwrap();
        b[15] ^= 1;
        fs::write(&p, b).unwrap();
        assert!(Checkpoint::load(d.path()).is_err());
    }
}
