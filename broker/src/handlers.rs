//! What a core does with a [`CoreMsg`]: the partition operations on logs it
//! owns, and (on core 0) topic changes.

use std::rc::Rc;

use bytes::BytesMut;
use weir_storage::StorageError;

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
            reply,
        } => {
            let _ = reply.send(
                produce_local(core, &topic, partition, BytesMut::from(&batch[..]), acks).await,
            );
        }
        CoreMsg::Fetch {
            topic,
            partition,
            offset,
            max_bytes,
            wait_ms,
            reply,
        } => {
            let _ =
                reply.send(fetch_local(core, &topic, partition, offset, max_bytes, wait_ms).await);
        }
        CoreMsg::Offsets {
            topic,
            partition,
            timestamp,
            reply,
        } => {
            let _ = reply.send(offsets_local(core, &topic, partition, timestamp).await);
        }
        CoreMsg::Metrics { reply } => {
            let _ = reply.send(crate::metrics::snapshot(core));
        }
        CoreMsg::Admin { change, reply } => {
            let _ = reply.send(apply_admin(core, change).await);
        }
        CoreMsg::Sync {
            registry,
            deleted,
            reply,
        } => {
            if let Err(e) = core.apply_registry(registry, deleted).await {
                tracing::error!(core = core.id, error = %format!("{e:#}"), "applying a topic change failed");
            }
            let _ = reply.send(());
        }
    }
}

/// Appends one batch to a partition this core owns, acknowledging as `acks` says.
pub async fn produce_local(
    core: &Core,
    topic: &str,
    partition: u32,
    batch: BytesMut,
    acks: i8,
) -> Result<ProduceOk, PartitionError> {
    let log = core.owned_log(topic, partition)?;
    let info = match acks {
        0 => log.append(batch).await,
        1 => match log.append(batch).await {
            Ok(info) => log.wait_written(info.last_offset + 1).await.map(|_| info),
            Err(e) => Err(e),
        },
        _ => log.append_acked(batch).await,
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
        let (tx, rx) = futures_channel::oneshot::channel();
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
