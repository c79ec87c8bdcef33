//! The one writer of the metadata, on core 0, and the one applier.
//!
//! Topic changes from every connection of every core arrive here
//! ([`submit`]: through the mesh from other cores) and wait in one bounded
//! queue ([`METADATA_QUEUE_MAX`]). A single task takes them one at a time:
//! checks the change against this node's view, turns it into a cluster
//! metadata command (placement chosen here, see
//! [`weir_replication::meta::place`]) and proposes it to the controller
//! quorum, which commits it (fdatasync'd on a majority) and applies it on
//! every node. The change is answered once this node's cores serve it.
//!
//! **One applier.** Every new version of the cluster metadata, whoever
//! proposed it, reaches this node through its controller; a task on core
//! 0 ([`follow`]) derives the node's view from it
//! ([`super::view_for`]), sends it to every core and waits until each has
//! applied it (opened or deleted its logs) — at most
//! [`METADATA_APPLY_TIMEOUT_MS`] — and then releases the changes waiting
//! for that version. A core that fails to apply a version makes the
//! changes waiting for it an error to their clients (the metadata keeps
//! them; the core logged why).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use weir_replication::meta::{core_for_new_replica, place, RefusalKind, Replica};
use weir_replication::{ClusterState, Command, ControllerError};

use super::{Change, ConfigOp, Job, MetadataView, TopicError, Writer};
use crate::server::limits::{METADATA_APPLY_TIMEOUT_MS, METADATA_QUEUE_MAX};
use crate::shard::mesh::CoreMsg;
use crate::shard::Core;

/// Where a change waiting for a version hears how applying it went.
type Waiter = LocalSender<Result<(), String>>;

/// How far the applier has gone, and the changes waiting for a version.
#[derive(Default)]
struct Applied {
    version: Cell<u64>,
    waiters: RefCell<Vec<(u64, Waiter)>>,
}

impl Applied {
    /// Waits until `version` is applied on every core (or failed to be).
    async fn wait(&self, version: u64) -> Result<(), String> {
        if self.version.get() >= version {
            return Ok(());
        }
        let (tx, rx) = local_channel::new_bounded(1);
        self.waiters.borrow_mut().push((version, tx));
        rx.recv()
            .await
            .unwrap_or_else(|| Err("the metadata applier stopped".into()))
    }

    /// Version `version` was applied (with `result`): releases its waiters.
    fn done(&self, version: u64, result: &Result<(), String>) {
        self.version.set(version);
        self.waiters.borrow_mut().retain(|(v, tx)| {
            if *v <= version {
                let _ = tx.try_send(result.clone());
                false
            } else {
                true
            }
        });
    }
}

/// Starts the writer and the applier on core 0.
pub fn start(core: &Rc<Core>) {
    assert_eq!(core.id, 0, "the metadata writer runs on core 0");
    let (tx, rx) = local_channel::new_bounded(METADATA_QUEUE_MAX);
    *core.metadata_writer.borrow_mut() = Some(Writer { queue: Rc::new(tx) });
    let applied = Rc::new(Applied::default());
    applied.version.set(core.metadata().version);
    glommio::spawn_local(follow(core.clone(), applied.clone())).detach();
    glommio::spawn_local(run(core.clone(), rx, applied)).detach();
}

async fn run(core: Rc<Core>, rx: LocalReceiver<Job>, applied: Rc<Applied>) {
    while let Some(job) = rx.recv().await {
        let r = apply(&core, &applied, job.change).await;
        let _ = job.done.try_send(r);
    }
}

/// Applies every new version of the cluster metadata on this node's cores,
/// in order (versions that arrive while one is applied are taken together).
async fn follow(core: Rc<Core>, applied: Rc<Applied>) {
    let mut watch = core.shared.controller.watch();
    loop {
        let state = watch.borrow_and_update().clone();
        core.shared.publish_security(&state.security);
        if state.version > applied.version.get() {
            let current = core.metadata();
            let next = super::view_for(&state, core.shared.config.cluster.node_id, core.cores());
            let result = if next.topics == current.topics {
                Ok(())
            } else {
                let deleted = deleted_partitions(&current, &next);
                apply_everywhere(&core, Arc::new(next), deleted).await
            };
            if let Err(e) = &result {
                tracing::error!(version = state.version, error = %e, "metadata not applied on every core");
            }
            applied.done(state.version, &result);
        }
        if watch.changed().await.is_err() {
            return;
        }
    }
}

/// Partitions this node serves in `current` that `next` no longer has
/// (their topic deleted, or deleted and created again under a new id).
fn deleted_partitions(current: &MetadataView, next: &MetadataView) -> Vec<(String, u32)> {
    let mut deleted = Vec::new();
    for (name, t) in current.topics() {
        let gone = next.get(name).is_none_or(|n| n.id != t.id);
        if gone {
            deleted.extend(
                (0..t.partitions())
                    .filter(|p| t.core_of(*p).is_some())
                    .map(|p| (name.clone(), p)),
            );
        }
    }
    deleted
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

/// Refuses to tier a topic on a broker without an object store.
fn check_remote(core: &Core, change: &Change) -> Result<(), TopicError> {
    let enables = |k: &str, v: &str| k == "remote.storage.enable" && v.trim() == "true";
    let tiers = match change {
        Change::Create(_, spec) => spec.configs.iter().any(|(k, v)| enables(k, v)),
        Change::Alter(_, ops) => ops
            .iter()
            .any(|op| matches!(op, ConfigOp::Set(k, v) if enables(k, v))),
        _ => false,
    };
    if tiers && core.shared.remote.is_none() {
        return Err(TopicError::Config(
            "remote.storage.enable=true needs tiered storage on the broker: \
             start it with --remote-storage (s3://bucket/prefix or file:///path)"
                .into(),
        ));
    }
    Ok(())
}

/// Queues a change on core 0 and waits for its outcome.
pub async fn submit_local(core: &Rc<Core>, change: Change) -> Result<u64, TopicError> {
    check_remote(core, &change)?;
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

/// Makes `change` in `next` (this node's view): the checks every change
/// passes before it is proposed.
fn apply_to(next: &mut MetadataView, change: Change, cores: usize) -> Result<(), TopicError> {
    match change {
        Change::Create(name, spec) => next.create(&name, spec, cores)?,
        Change::Delete(name) => {
            next.delete(&name)?;
        }
        Change::Alter(name, ops) => next.alter(&name, &ops)?,
        Change::AddPartitions(name, total) => {
            next.add_partitions(&name, total, cores)?;
        }
        // Checked by the controller against the cluster state (nodes,
        // cores, liveness); the view changes once it is applied.
        Change::Reassign { .. } => {}
    }
    Ok(())
}

/// Whether `change` would be applied to the current view (validate_only
/// requests): the writer's own checks, on a copy, nothing stored.
pub fn check(core: &Core, change: Change) -> Result<(), TopicError> {
    check_remote(core, &change)?;
    let mut next = (*core.metadata()).clone();
    command_for(&core.shared.controller.state(), &change)?;
    apply_to(&mut next, change, core.cores())
}

/// The cluster metadata command that makes `change` in `state`.
fn command_for(state: &ClusterState, change: &Change) -> Result<Command, TopicError> {
    let topic = |name: &str| {
        state
            .topics
            .get(name)
            .ok_or_else(|| TopicError::Unknown(name.into()))
    };
    let placed = |name: &str, count: u32, rf: u32| {
        place(state, count, rf).map_err(|e| match e {
            weir_replication::meta::PlacementError::NotEnoughNodes { .. } => {
                TopicError::ReplicationFactor {
                    topic: name.into(),
                    reason: e.to_string(),
                }
            }
            _ if rf == 0 => TopicError::ReplicationFactor {
                topic: name.into(),
                reason: "must be at least 1".into(),
            },
            _ => TopicError::Partitions {
                topic: name.into(),
                count,
                reason: e.to_string(),
            },
        })
    };
    Ok(match change {
        Change::Create(name, spec) => Command::CreateTopic {
            name: name.clone(),
            id: super::id_bytes(&super::new_topic_id(name)),
            configs: spec.configs.clone(),
            placement: placed(name, spec.partitions, spec.replication_factor)?,
        },
        Change::Delete(name) => Command::DeleteTopic { name: name.clone() },
        Change::Alter(name, ops) => {
            let from = topic(name)?.configs.clone();
            let to = ConfigOp::apply_all(&from, ops)?;
            Command::AlterConfigs {
                name: name.clone(),
                from,
                to,
            }
        }
        Change::AddPartitions(name, total) => {
            let t = topic(name)?;
            let from = t.partitions.len() as u32;
            // New partitions get as many replicas as the first one has.
            let rf = t.partitions.first().map_or(1, |p| p.replicas.len() as u32);
            Command::AddPartitions {
                name: name.clone(),
                from,
                placement: placed(name, total.saturating_sub(from), rf)?,
            }
        }
        Change::Reassign {
            topic: name,
            partition,
            nodes,
        } => {
            let t = topic(name)?;
            let p = t.partitions.get(*partition as usize).ok_or_else(|| {
                TopicError::Reassignment(format!(
                    "`{name}` has {} partitions: no partition {partition}",
                    t.partitions.len()
                ))
            })?;
            let to = nodes
                .iter()
                .map(|&node| Replica {
                    node,
                    core: p
                        .replicas
                        .iter()
                        .find(|r| r.node == node)
                        .map_or_else(|| core_for_new_replica(state, node), |r| r.core),
                })
                .collect();
            Command::ReassignPartition {
                topic: name.clone(),
                partition: *partition,
                from: p.replicas.clone(),
                to,
            }
        }
    })
}

fn topic_of(change: &Change) -> &str {
    match change {
        Change::Create(n, _)
        | Change::Delete(n)
        | Change::Alter(n, _)
        | Change::AddPartitions(n, _)
        | Change::Reassign { topic: n, .. } => n,
    }
}

/// Applies one change: checked, proposed to the controller quorum, and
/// waited for until this node's cores serve it.
async fn apply(core: &Rc<Core>, applied: &Applied, change: Change) -> Result<u64, TopicError> {
    check(core, change.clone())?;
    let controller = core.shared.controller.clone();
    let name = topic_of(&change).to_string();
    let mut conflicts = 0;
    let outcome = loop {
        let command = command_for(&controller.state(), &change)?;
        match controller.propose(command).await {
            Ok(o) => break o,
            Err(ControllerError::Refused(r)) => match r.kind {
                // Computed against a state that changed meanwhile: again.
                RefusalKind::Conflict if conflicts < 3 => conflicts += 1,
                RefusalKind::Exists => return Err(TopicError::Exists(name)),
                RefusalKind::Unknown => return Err(TopicError::Unknown(name)),
                _ if matches!(change, Change::Reassign { .. }) => {
                    return Err(TopicError::Reassignment(r.message))
                }
                _ => return Err(TopicError::NotApplied(r.message)),
            },
            Err(e) => {
                return Err(TopicError::NotApplied(format!(
                    "the controller quorum did not take the change: {e}"
                )))
            }
        }
    };
    applied.wait(outcome.version).await.map_err(|e| {
        TopicError::NotApplied(format!(
            "metadata version {} was committed but not applied everywhere: {e}",
            outcome.version
        ))
    })?;
    Ok(outcome.version)
}

/// Sends a view to every core and waits until each has applied it.
async fn apply_everywhere(
    core: &Rc<Core>,
    next: Arc<MetadataView>,
    deleted: Vec<(String, u32)>,
) -> Result<(), String> {
    let version = next.version;
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
        Ok(())
    } else {
        Err(format!("version {version}: {}", failures.join("; ")))
    }
}

/// Stops taking changes (shutdown): queued ones are answered "stopped".
pub fn stop(core: &Core) {
    core.metadata_writer.borrow_mut().take();
}
