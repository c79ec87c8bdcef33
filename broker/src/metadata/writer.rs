//! The one writer of the metadata, on core 0.
//!
//! Topic changes from every connection of every core arrive here
//! ([`submit`]: through the mesh from other cores) and wait in one bounded
//! queue ([`METADATA_QUEUE_MAX`]). A single task takes them one at a time:
//! applies the change to the current view, gives it the next version,
//! stores it (temporary file, fsync, rename, directory fsync, on glommio's
//! blocking-thread pool), sends it to every core and waits until each has
//! applied it (opened or deleted its logs) — at most
//! [`METADATA_APPLY_TIMEOUT_MS`] — and only then answers. So two changes
//! never see the same "current" view (no acknowledged change can be lost
//! to a concurrent one), and a change is acknowledged only once every core
//! serves it. A core that fails to apply it makes the change an error to
//! its client (the stored view keeps it; the core logged why).

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};

use super::{MetadataView, TopicError, TopicSpec, REGISTRY_FILE};
use crate::server::limits::{METADATA_APPLY_TIMEOUT_MS, METADATA_QUEUE_MAX};
use crate::shard::mesh::CoreMsg;
use crate::shard::Core;

/// A topic change.
#[derive(Debug, Clone)]
pub enum Change {
    /// Create a topic.
    Create(String, TopicSpec),
    /// Delete a topic.
    Delete(String),
    /// Change configs, in order.
    Alter(String, Vec<super::ConfigOp>),
    /// Raise the partition count to this total.
    AddPartitions(String, u32),
}

/// A change waiting for the writer, and where its outcome goes.
struct Job {
    change: Change,
    done: LocalSender<Result<u64, TopicError>>,
}

/// The writer's queue (held by core 0).
pub struct Writer {
    queue: Rc<LocalSender<Job>>,
}

/// Starts the writer on core 0.
pub fn start(core: &Rc<Core>) {
    assert_eq!(core.id, 0, "the metadata writer runs on core 0");
    let (tx, rx) = local_channel::new_bounded(METADATA_QUEUE_MAX);
    *core.metadata_writer.borrow_mut() = Some(Writer { queue: Rc::new(tx) });
    glommio::spawn_local(run(core.clone(), rx)).detach();
}

async fn run(core: Rc<Core>, rx: LocalReceiver<Job>) {
    while let Some(job) = rx.recv().await {
        let r = apply(&core, job.change).await;
        let _ = job.done.try_send(r);
    }
}

/// Applies a change through the writer, from any core; the version it got.
pub async fn submit(core: &Rc<Core>, change: Change) -> Result<u64, TopicError> {
    if core.id == 0 {
        return submit_local(core, change).await;
    }
    core.call(
        0,
        Duration::from_millis(METADATA_APPLY_TIMEOUT_MS),
        |reply| CoreMsg::Metadata { change, reply },
    )
    .await
    .unwrap_or_else(|e| Err(TopicError::NotApplied(e.to_string())))
}

/// Queues a change on core 0 and waits for its outcome.
pub async fn submit_local(core: &Rc<Core>, change: Change) -> Result<u64, TopicError> {
    let queue = core
        .metadata_writer
        .borrow()
        .as_ref()
        .map(|w| w.queue.clone());
    let Some(queue) = queue else {
        return Err(TopicError::NotApplied(
            "the metadata writer is not running (core 0 is starting or stopping)".into(),
        ));
    };
    let (done, outcome) = local_channel::new_bounded(1);
    if queue.send(Job { change, done }).await.is_err() {
        return Err(TopicError::NotApplied("the metadata writer stopped".into()));
    }
    outcome
        .recv()
        .await
        .unwrap_or_else(|| Err(TopicError::NotApplied("the metadata writer stopped".into())))
}

/// Makes `change` in `next`; the partitions it deleted.
fn apply_to(
    next: &mut MetadataView,
    change: Change,
    cores: usize,
) -> Result<Vec<(String, u32)>, TopicError> {
    match change {
        Change::Create(name, spec) => next.create(&name, spec, cores)?,
        Change::Delete(name) => {
            let t = next.delete(&name)?;
            return Ok((0..t.partitions()).map(|p| (name.clone(), p)).collect());
        }
        Change::Alter(name, ops) => next.alter(&name, &ops)?,
        Change::AddPartitions(name, total) => {
            next.add_partitions(&name, total, cores)?;
        }
    }
    Ok(Vec::new())
}

/// Whether `change` would be applied to the current view (validate_only
/// requests): the writer's own checks, on a copy, nothing stored.
pub fn check(core: &Core, change: Change) -> Result<(), TopicError> {
    let mut next = (*core.metadata()).clone();
    apply_to(&mut next, change, core.cores()).map(|_| ())
}

/// Applies one change: the next view, stored, applied on every core.
async fn apply(core: &Rc<Core>, change: Change) -> Result<u64, TopicError> {
    let current = core.metadata();
    let mut next = (*current).clone();
    let deleted = apply_to(&mut next, change, core.cores())?;
    next.version = current.version + 1;
    store(core, &next).await?;
    let version = next.version;
    let next = Arc::new(next);
    let mut failures = Vec::new();
    let mut waits = Vec::new();
    for c in 1..core.cores() {
        let (view, deleted) = (next.clone(), deleted.clone());
        let core = core.clone();
        waits.push(glommio::spawn_local(async move {
            let r = core
                .call(
                    c,
                    Duration::from_millis(METADATA_APPLY_TIMEOUT_MS),
                    |reply| CoreMsg::ApplyMetadata {
                        view,
                        deleted,
                        reply,
                    },
                )
                .await;
            match r {
                Ok(r) => r,
                Err(e) => Err(e.to_string()),
            }
        }));
    }
    if let Err(e) = core.apply_metadata(next, deleted).await {
        failures.push(format!("core 0: {e:#}"));
    }
    for w in waits {
        if let Err(e) = w.await {
            failures.push(e);
        }
    }
    if failures.is_empty() {
        Ok(version)
    } else {
        Err(TopicError::NotApplied(format!(
            "metadata version {version} was stored but not applied everywhere: {}",
            failures.join("; ")
        )))
    }
}

/// Stores a view durably, off the core's event loop.
async fn store(core: &Core, view: &MetadataView) -> Result<(), TopicError> {
    let text = view
        .encode()
        .map_err(|e| TopicError::NotApplied(format!("{e:#}")))?;
    weir_storage::checkpoint::write_atomic_async(
        &core.shared.config.data_dir,
        REGISTRY_FILE,
        text.into_bytes(),
    )
    .await
    .map_err(|e| TopicError::NotApplied(format!("storing the metadata failed: {e}")))
}

/// Stops taking changes (shutdown): queued ones are answered "stopped".
pub fn stop(core: &Core) {
    core.metadata_writer.borrow_mut().take();
}
