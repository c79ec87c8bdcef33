//! Small per-partition files: the checkpoint and the clean-shutdown marker.
//!
//! Both are tiny, written rarely (segment close, `delete_before`, shutdown)
//! and replaced atomically: write a temporary file, fsync it, rename it over
//! the old one, fsync the directory. They use blocking `std::fs` calls: each
//! is a few hundred bytes on a cold path.
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

/// Removes a file (blocking); `Ok(false)` if it was not there. Not durable
/// until the directory is synced.
pub fn remove_file(path: &Path) -> Result<bool> {
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

    /// Writes it atomically and durably.
    pub fn store(&self, dir: &Path) -> Result<()> {
        let mut body = Vec::with_capacity(32);
        body.extend_from_slice(CHECKPOINT_MAGIC);
        body.extend_from_slice(&VERSION.to_be_bytes());
        body.extend_from_slice(&self.log_start_offset.to_be_bytes());
        body.extend_from_slice(&self.recovery_point.to_be_bytes());
        write_atomic(dir, CHECKPOINT_FILE, &seal(body))
    }
}

/// Writes the clean-shutdown marker.
pub fn store_clean_marker(dir: &Path, log_end_offset: u64) -> Result<()> {
    let mut body = Vec::with_capacity(24);
    body.extend_from_slice(MARKER_MAGIC);
    body.extend_from_slice(&VERSION.to_be_bytes());
    body.extend_from_slice(&log_end_offset.to_be_bytes());
    write_atomic(dir, CLEAN_SHUTDOWN_FILE, &seal(body))
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
