//! What a core does with a partition it owns — append, wait for the
//! acknowledgement, read, offsets, compact — and with a request from
//! another core ([`handle`]). Everything here runs on the owner core.

use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use weir_storage::{AppendInfo, CleanReport, PartitionLog};

use super::mesh::CoreMsg;
use super::Core;
use crate::service::{BrokerError, FetchOk, OffsetsOk, ProduceOk};

/// The outcome of a compaction request on one partition.
#[derive(Debug, Clone)]
pub struct CompactOk {
    /// The dirty ratio now, 0..=1.
    pub dirty_ratio: f64,
    /// The pass, if one ran.
    pub pass: Option<CleanReport>,
}

/// Handles one request from another core.
pub async fn handle(core: &Rc<Core>, msg: CoreMsg) {
    match msg {
        CoreMsg::Produce {
            topic,
            partition,
            batch,
            acks,
            appended,
            reply,
        } => match append_local(core, &topic, partition, batch).await {
            Err(e) => appended.send(core, Err(e)).await,
            Ok((log, info)) => {
                appended.send(core, Ok(())).await;
                reply.send(core, ack_local(log, info, acks).await).await;
            }
        },
        CoreMsg::InitProducerId { reply } => {
            reply.send(core, init_producer_id_local(core).await).await;
        }
        CoreMsg::Fetch {
            topic,
            partition,
            offset,
            max_bytes,
            wait_ms,
            reply,
        } => {
            let r = fetch_local(core, &topic, partition, offset, max_bytes, wait_ms).await;
            reply.send(core, r).await;
        }
        CoreMsg::Offsets {
            topic,
            partition,
            timestamp,
            reply,
        } => {
            let r = offsets_local(core, &topic, partition, timestamp).await;
            reply.send(core, r).await;
        }
        CoreMsg::Compact {
            topic,
            partition,
            run,
            reply,
        } => {
            let r = compact_local(core, &topic, partition, run).await;
            reply.send(core, r).await;
        }
        CoreMsg::Metrics { reply } => {
            reply.send(core, crate::metrics::snapshot(core)).await;
        }
        CoreMsg::Metadata { change, reply } => {
            let r = crate::metadata::writer::submit_local(core, change).await;
            reply.send(core, r).await;
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
            reply.send(core, r).await;
        }
        CoreMsg::Group { request, reply } => {
            let r = crate::groups::coordinator::handle(core, request).await;
            reply.send(core, r).await;
        }
        CoreMsg::LogEnds { partitions, reply } => {
            reply.send(core, log_ends_local(core, &partitions)).await;
        }
    }
}

/// Log end offsets (high watermarks) of partitions this core owns.
pub fn log_ends_local(core: &Core, partitions: &[(String, u32)]) -> Vec<Result<u64, BrokerError>> {
    partitions
        .iter()
        .map(|(t, p)| core.owned_log(t, *p).map(|l| l.high_watermark()))
        .collect()
}

/// Appends one batch to a partition this core owns (validated, offsets
/// assigned, producer sequence checked; a duplicate of an idempotent
/// producer's batch is not appended again and reports the original
/// offsets). Returns as soon as the batch is queued: see [`ack_local`].
pub async fn append_local(
    core: &Core,
    topic: &str,
    partition: u32,
    batch: Bytes,
) -> Result<(PartitionLog, AppendInfo), BrokerError> {
    if core.shared.config.test_panic_on_produce_to.as_deref() == Some(topic) {
        panic!("test-only trigger: produce to `{topic}` (--test-panic-on-produce-to)");
    }
    let log = core.owned_log(topic, partition)?;
    let info = log
        .append(BytesMut::from(&batch[..]))
        .await
        .map_err(BrokerError::from)?;
    Ok((log, info))
}

/// Waits until an appended batch may be acknowledged as `acks` says: 0
/// and 1 once it is written (1 waits, 0 does not), all once the topic's
/// flush policy is met (fdatasync'd by default).
pub async fn ack_local(
    log: PartitionLog,
    info: AppendInfo,
    acks: i8,
) -> Result<ProduceOk, BrokerError> {
    match acks {
        0 => Ok(()),
        1 => log.wait_written(info.last_offset + 1).await,
        _ => log.wait_acked(&info).await,
    }
    .map_err(BrokerError::from)?;
    Ok(ProduceOk {
        base_offset: info.base_offset,
        log_start_offset: log.log_start_offset(),
    })
}

/// Reads from a partition this core owns.
pub async fn fetch_local(
    core: &Core,
    topic: &str,
    partition: u32,
    offset: u64,
    max_bytes: u64,
    wait_ms: u32,
) -> Result<FetchOk, BrokerError> {
    let log = core.owned_log(topic, partition)?;
    if max_bytes == 0 {
        // Only the watermarks: the fetch's byte budget is spent.
        return Ok(FetchOk {
            batches: Vec::new(),
            high_watermark: log.high_watermark(),
            log_start_offset: log.log_start_offset(),
        });
    }
    if wait_ms > 0 && offset == log.high_watermark() {
        // Long poll: wake when a batch at `offset` is written, or time out.
        let wait = std::time::Duration::from_millis(wait_ms as u64);
        let _ = futures_lite::future::or(
            async { log.wait_written(offset + 1).await.is_ok() },
            async {
                glommio::timer::sleep(wait).await;
                false
            },
        )
        .await;
    }
    let r = log
        .read(offset, max_bytes)
        .await
        .map_err(BrokerError::from)?;
    Ok(FetchOk {
        batches: r.batches,
        high_watermark: r.high_watermark,
        log_start_offset: r.log_start_offset,
    })
}

/// Offsets of a partition this core owns.
pub async fn offsets_local(
    core: &Core,
    topic: &str,
    partition: u32,
    timestamp: Option<i64>,
) -> Result<OffsetsOk, BrokerError> {
    let log = core.owned_log(topic, partition)?;
    let for_timestamp = match timestamp {
        Some(ts) => log
            .offset_for_timestamp(ts)
            .await
            .map_err(BrokerError::from)?,
        None => None,
    };
    Ok(OffsetsOk {
        log_start_offset: log.log_start_offset(),
        high_watermark: log.high_watermark(),
        size_bytes: log.size_bytes(),
        for_timestamp,
    })
}

/// Runs a cleaner pass (`run`) on a partition this core owns, or reports
/// its dirty ratio.
pub async fn compact_local(
    core: &Core,
    topic: &str,
    partition: u32,
    run: bool,
) -> Result<CompactOk, BrokerError> {
    let log = core.owned_log(topic, partition)?;
    let pass = if run {
        log.clean(true).await.map_err(BrokerError::from)?
    } else {
        None
    };
    Ok(CompactOk {
        dirty_ratio: log.dirty_ratio(),
        pass,
    })
}

/// Hands out a new producer id (core 0 only: it owns the allocator).
pub async fn init_producer_id_local(core: &Core) -> Result<i64, BrokerError> {
    assert_eq!(core.id, 0, "producer ids are handed out by core 0");
    super::producer_ids::allocate(&core.producer_ids, &core.producer_ids_reserving)
        .await
        .map_err(|e| BrokerError::Storage {
            kind: crate::service::StorageFailure::Io,
            message: format!("allocating a producer id failed: {e:#}"),
        })
}
