//! Producer ids for idempotent producers, handed out by core 0.
//!
//! Ids must never repeat in the cluster, or a new producer could be taken
//! for an old one whose state a partition still holds. Core 0 reserves ids
//! in blocks of [`BLOCK`] from the controller quorum
//! (`Command::AllocateProducerIds`, committed before the first id of the
//! block is handed out), so blocks of different nodes never overlap and a
//! crash skips the rest of a block. A `<data-dir>/producer-ids` file of an
//! earlier version (the node's own durable counter) is a floor: blocks
//! start past the ids that node already handed out.

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

    /// A fresh producer id, reserving a block in this node's file with a
    /// blocking write if needed (tests of the file; the broker uses
    /// [`allocate`]).
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

/// A fresh producer id from core 0's allocator: a new block is reserved
/// through the controller quorum when the current one is used up, and
/// concurrent callers wait for one reservation (`reserving`).
pub async fn allocate(
    ids: &std::cell::RefCell<ProducerIds>,
    reserving: &glommio::sync::Semaphore,
    controller: &weir_replication::Controller,
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
        let at_least = ids.borrow().next;
        let outcome = controller
            .propose(weir_replication::Command::AllocateProducerIds {
                at_least,
                count: BLOCK,
            })
            .await
            .map_err(|e| anyhow::anyhow!("reserving producer ids from the controller: {e}"))?;
        let mut s = ids.borrow_mut();
        s.next = outcome.block_start;
        s.limit = outcome.block_start + BLOCK;
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
