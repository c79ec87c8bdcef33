//! The service's answers to requests from other cores: a core receives
//! [`CoreMsg`]s on its mesh ([`crate::shard::mesh::serve`]) and runs each
//! here, as its own task, answering through the message's `ReplyTo`.

use std::rc::Rc;

use crate::shard::mesh::CoreMsg;
use crate::shard::partition::{ack_waits, all_acked};
use crate::shard::partition::{compact_local, init_producer_id_local, log_ends_local};
use crate::shard::Core;

/// Handles one request from another core.
pub async fn handle(core: &Rc<Core>, msg: CoreMsg) {
    match msg {
        CoreMsg::Produce {
            topic,
            partition,
            batches,
            acks,
            transaction,
            appended,
            reply,
        } => match crate::service::produce::append_here(
            core,
            &topic,
            partition,
            batches,
            acks,
            transaction,
        )
        .await
        {
            Err(e) => appended.send(&core.mesh, Err(e)).await,
            Ok((log, infos)) => {
                appended.send(&core.mesh, Ok(())).await;
                let waits = ack_waits(core, &topic, partition, log, infos, acks);
                reply.send(&core.mesh, all_acked(waits).await).await;
            }
        },
        CoreMsg::InitProducerId { reply } => {
            reply
                .send(&core.mesh, init_producer_id_local(core).await)
                .await;
        }
        CoreMsg::Fetch {
            topic,
            partition,
            offset,
            max_bytes,
            wait_ms,
            reply,
        } => {
            let r =
                crate::tier::read::fetch_owned(core, &topic, partition, offset, max_bytes, wait_ms)
                    .await;
            reply.send(&core.mesh, r).await;
        }
        CoreMsg::Offsets {
            topic,
            partition,
            timestamp,
            reply,
        } => {
            let r = crate::tier::read::offsets_owned(core, &topic, partition, timestamp).await;
            reply.send(&core.mesh, r).await;
        }
        CoreMsg::DeleteRecords {
            topic,
            partition,
            before,
            reply,
        } => {
            let r = crate::tier::read::delete_records_owned(core, &topic, partition, before).await;
            reply.send(&core.mesh, r).await;
        }
        CoreMsg::Compact {
            topic,
            partition,
            run,
            reply,
        } => {
            let r = compact_local(core, &topic, partition, run).await;
            reply.send(&core.mesh, r).await;
        }
        CoreMsg::Metrics { reply } => {
            reply
                .send(&core.mesh, crate::shard::stats::snapshot(core))
                .await;
        }
        CoreMsg::Metadata { change, reply } => {
            let r = crate::metadata::writer::submit_local(core, change).await;
            reply.send(&core.mesh, r).await;
        }
        CoreMsg::ApplyMetadata {
            view,
            deleted,
            reply,
        } => {
            let r = core
                .apply_metadata(view, deleted)
                .await
                .map_err(|e| format!("core {}: {e:#}", core.id));
            if let Err(e) = &r {
                tracing::error!(core = core.id, error = %e, "applying a metadata change failed");
            }
            reply.send(&core.mesh, r).await;
        }
        CoreMsg::Group { request, reply } => {
            let r = crate::groups::coordinator::handle(core, request).await;
            reply.send(&core.mesh, r).await;
        }
        CoreMsg::TxnStates { ids, reply } => {
            let r = crate::txns::admin::local_states(core, ids.as_deref());
            reply.send(&core.mesh, r).await;
        }
        CoreMsg::Producers {
            topic,
            partition,
            reply,
        } => {
            let r = crate::txns::admin::producers_local(core, &topic, partition);
            reply.send(&core.mesh, r).await;
        }
        CoreMsg::ShareReset { key, start, reply } => {
            let r = crate::share::service::reset_here(core, key, start).await;
            reply.send(&core.mesh, r).await;
        }
        CoreMsg::ShareState {
            partition,
            key,
            value,
            write,
            reply,
        } => {
            let r = crate::share::state::here(core, partition, key, value, write).await;
            reply.send(&core.mesh, r).await;
        }
        CoreMsg::Txn { request, reply } => {
            let r = crate::txns::coordinator::handle(core, request).await;
            reply.send(&core.mesh, r).await;
        }
        CoreMsg::Marker {
            topic,
            partition,
            producer_id,
            epoch,
            commit,
            coordinator_epoch,
            reply,
        } => {
            let r = crate::txns::coordinator::marker_here(
                core,
                (&topic, partition),
                (producer_id, epoch),
                commit,
                coordinator_epoch,
            )
            .await;
            reply.send(&core.mesh, r).await;
        }
        CoreMsg::LogEnds { partitions, reply } => {
            reply
                .send(&core.mesh, log_ends_local(core, &partitions))
                .await;
        }
        // Handled by the mesh receiver itself.
        CoreMsg::Cancel { .. } => {}
    }
}

/// What follows a core's applying a metadata view (the core calls it
/// through `Shared::after_metadata`): the groups drop the committed offsets
/// of deleted partitions (tombstoned in `__consumer_offsets`), and the
/// replicas on the core take the roles the view gives them.
pub fn metadata_applied(core: &std::rc::Rc<crate::shard::Core>, deleted: &[(String, u32)]) {
    crate::groups::coordinator::purge_deleted(core, deleted);
    let changes = crate::replica::reconcile(core);
    crate::coordinator::leaderships(core, &changes);
}
