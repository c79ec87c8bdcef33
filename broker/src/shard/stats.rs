//! This core's metrics snapshot: its counters (`crate::metrics`) and what
//! its logs, mesh and replicas hold now.

use std::cell::Cell;

use crate::metrics::{LeaderStats, Snapshot};
use crate::shard::Core;

/// Takes this core's snapshot.
pub fn snapshot(core: &Core) -> Snapshot {
    let m = &core.metrics;
    Snapshot {
        core: core.id,
        apis: m
            .apis
            .iter()
            .map(|a| (a.errors.get(), a.latency.read()))
            .collect(),
        stages: m
            .stages
            .iter()
            .map(crate::metrics::CellHist::read)
            .collect(),
        share_stages: m
            .share_stages
            .iter()
            .map(crate::metrics::CellHist::read)
            .collect(),
        bytes_in: m.bytes_in.get(),
        bytes_out: m.bytes_out.get(),
        connections: m.connections.get(),
        connections_refused: m.connections_refused.get(),
        frame_timeouts: m.frame_timeouts.get(),
        tls_handshake_failures: m.tls_handshake_failures.get(),
        sasl_authentications: m.sasl_authentications.get(),
        sasl_authentication_failures: m.sasl_authentication_failures.get(),
        otlp: m.otlp.each_ref().map(|c| c.each_ref().map(Cell::get)),
        open_connections: core.connections.get() as u64,
        pending_replies: core.mesh.replies.len() as u64,
        running_waits: core.mesh.running.len() as u64,
        metadata_version: core.metadata().version,
        storage: core.storage.stats(),
        partitions: core
            .logs
            .borrow()
            .iter()
            .map(|((t, p), l)| {
                (
                    t.clone(),
                    *p,
                    l.log_end_offset(),
                    l.log_start_offset(),
                    l.size_bytes(),
                )
            })
            .collect(),
        dirty: core
            .logs
            .borrow()
            .iter()
            .filter(|(_, l)| l.config().cleanup_policy.compacts())
            .map(|((t, p), l)| (t.clone(), *p, l.dirty_ratio()))
            .collect(),
        tier: {
            let c = &core.tier.counters;
            vec![
                c.uploads.get(),
                c.uploaded_bytes.get(),
                c.upload_errors.get(),
                c.deletes.get(),
                c.delete_errors.get(),
                c.reads.get(),
                c.read_bytes.get(),
                c.read_errors.get(),
                c.read_micros.get(),
                c.chunks_read.get(),
                c.copy_throttle_micros.get(),
                c.orphans_deleted.get(),
            ]
        },
        tier_upload_lag_bytes: core
            .logs
            .borrow()
            .values()
            .filter(|l| l.config().remote_storage)
            .map(|l| l.bytes_from(l.remote_end().max(l.log_start_offset())))
            .sum(),
        replication_in: m.replication_in.get(),
        replication_out: m.replication_out.get(),
        reactor: (
            m.stalls.late_max_us.get(),
            m.stalls.stall_max_us.get(),
            m.stalls.stalls.get(),
        ),
        leaders: core
            .replication
            .all()
            .iter()
            .filter(|r| r.replicated() && r.role() == crate::replica::state::Role::Leader)
            .map(|r| {
                let st = r.state.borrow();
                let leo = r.log.log_end_offset();
                let me = core.shared.config.cluster.node_id;
                LeaderStats {
                    topic: r.topic.clone(),
                    partition: r.partition,
                    isr: st.isr.isr().len(),
                    replicas: st.replicas.len(),
                    min_isr: st.isr.min_isr(),
                    lag: st
                        .replicas
                        .iter()
                        .filter(|(n, _)| *n != me)
                        .map(|(n, _)| {
                            let at = st.isr.follower(*n).map_or(0, |p| p.fetch_offset);
                            let from = at.max(r.log.log_start_offset());
                            (*n, leo.saturating_sub(at), r.log.bytes_from(from))
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}
