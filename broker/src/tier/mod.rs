//! Tiered storage (KIP-405's model): closed segments of topics with
//! `remote.storage.enable=true` are uploaded by their partition's leader to
//! the object store (`weir_tier::RemoteStore`, `--remote-storage`), their
//! remote log metadata committed in the cluster metadata
//! (`weir_replication::remote`); local retention then deletes only
//! uploaded segments; a fetch or ListOffsets below the local log start is
//! served from the remote tier.
//!
//! - [`state`]: what a core holds (remote chunks read, indexes, counters).
//! - [`read`]: fetches and offsets-for-times from remote segments, through
//!   the core's chunk cache with read-ahead.
//! - [`upload`]: the per-core task: uploads, remote retention, cleanup of
//!   unfinished uploads and of deleted topics' objects.

pub mod read;
pub mod state;
pub mod upload;

use std::sync::Arc;

use weir_replication::meta::RemoteSegment;

use crate::shard::Core;

/// The id of `topic` as the cluster metadata has it.
pub(crate) fn topic_id(core: &Core, topic: &str) -> Option<[u8; 16]> {
    core.metadata()
        .get(topic)
        .map(|t| crate::metadata::id_bytes(&t.id))
}

/// The readable remote segments of a partition, in offset order, as this
/// node's applied cluster metadata has them.
pub(crate) fn readable(core: &Core, topic_id: &[u8; 16], partition: u32) -> Vec<RemoteSegment> {
    let state: Arc<weir_replication::ClusterState> = core.shared.controller.state();
    state
        .remote
        .readable(topic_id, partition)
        .into_iter()
        .cloned()
        .collect()
}

/// A partition's log start offset for clients: its first remote offset
/// (or the log start DeleteRecords raised it to) if it is tiered and has
/// remote segments below its local log start.
pub fn log_start(core: &Core, topic: &str, partition: u32, local_start: u64) -> u64 {
    if core.shared.remote.is_none() {
        return local_start;
    }
    let Some(id) = topic_id(core, topic) else {
        return local_start;
    };
    let state = core.shared.controller.state();
    let raised = state.remote.log_start(&id, partition);
    state
        .remote
        .readable(&id, partition)
        .first()
        .map_or(local_start, |s| s.base.max(raised).min(local_start))
}

/// This node's leader epoch of a partition, if it leads it now (the
/// metadata names it, and its replica on this core is the leader).
pub(crate) fn leader_epoch(core: &Core, topic: &str, partition: u32) -> Option<u32> {
    let me = core.shared.config.cluster.node_id;
    let view = core.metadata();
    let t = view.get(topic)?;
    if t.leaders.get(partition as usize).copied() != Some(me) {
        return None;
    }
    if let Some(r) = core.replication.get(topic, partition) {
        r.check_leader().ok()?;
    }
    t.placement.get(partition as usize).map(|p| p.leader_epoch)
}

/// Remote-read failures as the broker answers them: retriable.
pub(crate) fn unavailable(e: impl std::fmt::Display) -> crate::error::BrokerError {
    crate::error::BrokerError::Storage {
        kind: crate::error::StorageFailure::RemoteUnavailable,
        message: format!("the remote tier could not be read: {e} (retry)"),
    }
}
