//! What a core does with a [`CoreMsg`]: the partition operations on logs it
//! owns, and (on core 0) topic changes.

use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use weir_storage::{AppendInfo, PartitionLog, StorageError};

use crate::core::{AdminChange, Core, CoreMsg, FetchOk, OffsetsOk, PartitionError, ProduceOk};
use crate::errors as code;
use crate::registry::TopicError;

/// Maps a storage error to a wire error.
pub fn storage_error(e: &StorageError) -> PartitionError {
    let c = match e {
        StorageError::InvalidBatch { .. } | StorageError::TrailingBytes { .. } => {
            code::CORRUPT_MESSAGE
        }
        StorageError::BatchTooLarge { .. } => code::MESSAGE_TOO_LARGE,
        StorageError::OffsetOutOfRange { .. } => code::OFFSET_OUT_OF_RANGE,
        StorageError::Recovering { .. } => code::RECOVERING,
        StorageError::OutOfOrderSequence { .. } => code::OUT_OF_ORDER_SEQUENCE,
        StorageError::InvalidProducerEpoch { .. } => code::INVALID_PRODUCER_EPOCH,
        StorageError::UnknownProducerId { .. } => code::UNKNOWN_PRODUCER_ID,
        StorageError::KeyRequired { .. } => code::INVALID_RECORD,
        _ => code::STORAGE_ERROR,
    };
    PartitionError {
        code: c,
        message: e.to_string(),
    }
}

/// Handles one message addressed to this core.
pub async fn handle_core_msg(core: &Rc<Core>, msg: CoreMsg) {
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
            reply.send(core, init_producer_id_local(core)).await;
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
        CoreMsg::Admin { change, reply } => {
            let r = apply_admin(core, change).await;
            reply.send(core, r).await;
        }
        CoreMsg::Sync {
            registry,
            deleted,
            reply,
        } => {
            if let Err(e) = core.apply_registry(registry, deleted).await {
                tracing::error!(core = core.id, error = %format!("{e:#}"), "applying a topic change failed");
            }
            reply.send(core, ()).await;
        }
        CoreMsg::Group { request, reply } => {
            let r = crate::group_coordinator::handle(core, request).await;
            reply.send(core, r).await;
        }
        CoreMsg::LogEnds { partitions, reply } => {
            reply.send(core, log_ends_local(core, &partitions)).await;
        }
        CoreMsg::Reply { id, value } => core.deliver(id, value),
    }
}

/// Log end offsets (high watermarks) of partitions this core owns.
pub fn log_ends_local(
    core: &Core,
    partitions: &[(String, u32)],
) -> Vec<Result<u64, PartitionError>> {
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
) -> Result<(PartitionLog, AppendInfo), PartitionError> {
    let log = core.owned_log(topic, partition)?;
    let info = log
        .append(BytesMut::from(&batch[..]))
        .await
        .map_err(|e| storage_error(&e))?;
    Ok((log, info))
}

/// Waits until an appended batch may be acknowledged as `acks` says: 0
/// and 1 once it is written (1 waits, 0 does not), all once the topic's
/// flush policy is met (fdatasync'd by default).
pub async fn ack_local(
    log: PartitionLog,
    info: AppendInfo,
    acks: i8,
) -> Result<ProduceOk, PartitionError> {
    match acks {
        0 => Ok(()),
        1 => log.wait_written(info.last_offset + 1).await,
        _ => log.wait_acked(&info).await,
    }
    .map_err(|e| storage_error(&e))?;
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
) -> Result<FetchOk, PartitionError> {
    let log = core.owned_log(topic, partition)?;
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
        .map_err(|e| storage_error(&e))?;
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
) -> Result<OffsetsOk, PartitionError> {
    let log = core.owned_log(topic, partition)?;
    let for_timestamp = match timestamp {
        Some(ts) => log
            .offset_for_timestamp(ts)
            .await
            .map_err(|e| storage_error(&e))?,
        None => None,
    };
    Ok(OffsetsOk {
        log_start_offset: log.log_start_offset(),
        high_watermark: log.high_watermark(),
        size_bytes: log.size_bytes(),
        for_timestamp,
    })
}

/// Parts per million of a ratio in 0..=1.
fn ppm(r: f64) -> u32 {
    (r.clamp(0.0, 1.0) * 1e6).round() as u32
}

/// Runs a cleaner pass (`run`) on a partition this core owns, or reports
/// its dirty ratio.
pub async fn compact_local(
    core: &Core,
    topic: &str,
    partition: u32,
    run: bool,
) -> Result<weir_proto::messages::CompactPartitionResult, PartitionError> {
    let log = core.owned_log(topic, partition)?;
    let pass = if run {
        log.clean(true).await.map_err(|e| storage_error(&e))?
    } else {
        None
    };
    Ok(weir_proto::messages::CompactPartitionResult {
        partition,
        error: code::NONE,
        message: None,
        dirty_ratio_ppm: ppm(log.dirty_ratio()),
        pass: pass.map(|r| weir_proto::messages::CompactPass {
            bytes_read: r.bytes_read,
            bytes_written: r.bytes_written,
            records_read: r.records_read,
            records_removed: r.records_removed,
            tombstones_removed: r.tombstones_removed,
            segments_before: r.segments_before as u32,
            segments_after: r.segments_after as u32,
            size_before: r.size_before,
            size_after: r.size_after,
            dirty_ratio_before_ppm: ppm(r.dirty_ratio_before),
            dirty_ratio_after_ppm: ppm(r.dirty_ratio_after),
            first_dirty: r.first_dirty,
            map_full: r.map_full,
            duration_us: r.duration.as_micros() as u64,
        }),
    })
}

/// Hands out a new producer id (core 0 only: it owns the allocator).
pub fn init_producer_id_local(core: &Core) -> Result<i64, PartitionError> {
    assert_eq!(core.id, 0, "producer ids are handed out by core 0");
    core.producer_ids
        .borrow_mut()
        .allocate()
        .map_err(|e| PartitionError {
            code: code::STORAGE_ERROR,
            message: format!("allocating a producer id failed: {e:#}"),
        })
}

/// Applies a topic change on core 0: updates and stores the registry, then
/// makes every core match it before answering.
pub async fn apply_admin(core: &Rc<Core>, change: AdminChange) -> Result<(), TopicError> {
    assert_eq!(core.id, 0, "topic changes are applied by core 0");
    let mut reg = core.registry.borrow().clone();
    let mut deleted = Vec::new();
    match &change {
        AdminChange::Create(name, spec) => reg.create(name, spec.clone())?,
        AdminChange::Delete(name) => {
            let spec = reg.delete(name)?;
            deleted = (0..spec.partitions).map(|p| (name.clone(), p)).collect();
        }
        AdminChange::Alter(name, set) => reg.alter(name, set)?,
        AdminChange::AddPartitions(name, total) => {
            reg.add_partitions(name, *total)?;
        }
    }
    reg.store(&core.shared.config.data_dir)
        .map_err(|e| TopicError::Config(format!("storing the topic registry failed: {e:#}")))?;
    let mut waits = Vec::new();
    for c in 1..core.cores() {
        let (tx, rx) = core.expect_reply::<()>();
        let msg = CoreMsg::Sync {
            registry: reg.clone(),
            deleted: deleted.clone(),
            reply: tx,
        };
        if core.send_to(c, msg).await.is_ok() {
            waits.push(rx);
        }
    }
    core.apply_registry(reg, deleted)
        .await
        .map_err(|e| TopicError::Config(format!("{e:#}")))?;
    for rx in waits {
        let _ = rx.await;
    }
    Ok(())
}
