//! Producer ids for idempotent producers, handed out by core 0.
//!
//! Ids must never repeat for the life of a data directory, or a new
//! producer could be taken for an old one whose state a partition still
//! holds. Core 0 reserves ids in blocks of [`BLOCK`]: before handing out
//! the first id of a block it durably stores the end of that block in
//! `<data-dir>/producer-ids` (write to a temporary file, fsync, rename,
//! fsync the directory). After a crash the rest of the block is skipped.
//! The file write happens once per [`BLOCK`] ids, on glommio's
//! blocking-thread pool ([`allocate`]), never on the core's event loop.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// Ids reserved by one durable write.
pub const BLOCK: i64 = 1000;
/// The file holding the first id not yet reserved.
pub const FILE_NAME: &str = "producer-ids";

/// Core 0's producer-id allocator.
#[derive(Debug)]
pub struct ProducerIds {
    path: PathBuf,
    next: i64,
    limit: i64,
}

impl ProducerIds {
    /// Loads the allocator of `data_dir` (nothing reserved yet: the first
    /// [`ProducerIds::allocate`] reserves a block).
    pub fn load(data_dir: &Path) -> anyhow::Result<ProducerIds> {
        let path = data_dir.join(FILE_NAME);
        let next = match std::fs::read_to_string(&path) {
            Ok(s) => s
                .trim()
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .with_context(|| {
                    format!(
                        "{} holds `{}`, not a producer id; restore it or remove it only if no \
                         idempotent producer ever wrote to this broker",
                        path.display(),
                        s.trim()
                    )
                })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok(ProducerIds {
            path,
            next,
            limit: next,
        })
    }

    /// The next id of the reserved block, if there is one left.
    fn take(&mut self) -> Option<i64> {
        (self.next < self.limit).then(|| {
            self.next += 1;
            self.next - 1
        })
    }

    /// A fresh producer id, reserving a block with a blocking write if
    /// needed (start-up and tests; the broker uses [`allocate`]).
    pub fn allocate_blocking(&mut self) -> anyhow::Result<i64> {
        if let Some(id) = self.take() {
            return Ok(id);
        }
        let limit = self.next + BLOCK;
        store(&self.path, limit)?;
        self.limit = limit;
        Ok(self.take().expect("a block was just reserved"))
    }
}

/// A fresh producer id from core 0's allocator: the block reservation's
/// file write runs on glommio's blocking-thread pool, and concurrent
/// callers wait for one reservation (`reserving`).
pub async fn allocate(
    ids: &std::cell::RefCell<ProducerIds>,
    reserving: &glommio::sync::Semaphore,
) -> anyhow::Result<i64> {
    loop {
        if let Some(id) = ids.borrow_mut().take() {
            return Ok(id);
        }
        let _one = reserving
            .acquire_permit(1)
            .await
            .map_err(|e| anyhow::anyhow!("producer-id reservation: {e}"))?;
        if let Some(id) = ids.borrow_mut().take() {
            return Ok(id);
        }
        let (path, limit) = {
            let s = ids.borrow();
            (s.path.clone(), s.next + BLOCK)
        };
        weir_storage::checkpoint::on_blocking_pool(move || store(&path, limit)).await?;
        ids.borrow_mut().limit = limit;
    }
}

fn store(path: &Path, limit: i64) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    writeln!(f, "{limit}").with_context(|| format!("writing {}", tmp.display()))?;
    f.sync_all()
        .with_context(|| format!("syncing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing directory {}", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_never_repeat_across_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = ProducerIds::load(dir.path()).unwrap();
        let first: Vec<i64> = (0..3).map(|_| a.allocate_blocking().unwrap()).collect();
        assert_eq!(first, vec![0, 1, 2]);
        // A restart (clean or not) skips the rest of the reserved block.
        let mut b = ProducerIds::load(dir.path()).unwrap();
        assert_eq!(b.allocate_blocking().unwrap(), BLOCK);
        for _ in 1..BLOCK {
            b.allocate_blocking().unwrap();
        }
        assert_eq!(b.allocate_blocking().unwrap(), 2 * BLOCK);
        let mut c = ProducerIds::load(dir.path()).unwrap();
        assert_eq!(c.allocate_blocking().unwrap(), 3 * BLOCK);
    }

    #[test]
    fn a_damaged_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), "garbage").unwrap();
        let e = ProducerIds::load(dir.path()).unwrap_err();
        assert!(format!("{e:#}").contains("not a producer id"), "{e:#}");
    }
}
