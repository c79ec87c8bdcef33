//! What a core does with a partition it owns — append, wait for the
//! acknowledgement, read, offsets, compact, producer ids on core 0.
//! Everything here runs on the owner core; requests from other cores reach
//! it through `crate::service::remote`.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use weir_proto::batch::BatchHeader;
use weir_storage::{AppendInfo, PartitionLog};

use super::Core;
use crate::error::{BrokerError, StorageFailure};
use crate::metrics::Stage;

pub use super::answers::{CompactOk, FetchOk, OffsetsOk, ProduceOk};

/// Log end offsets (high watermarks) of partitions this core owns.
pub fn log_ends_local(core: &Core, partitions: &[(String, u32)]) -> Vec<Result<u64, BrokerError>> {
    partitions
        .iter()
        .map(|(t, p)| core.owned_log(t, *p).map(|l| l.high_watermark()))
        .collect()
}

/// Appends the record batches of one request's part (one or more, whole)
/// to a partition this core owns, in order and with no other append
/// between them (validated, offsets assigned, producer sequences checked;
/// a duplicate of an idempotent producer's batch is not appended again and
/// reports the original offsets). Returns as soon as they are queued: see
/// [`ack_local`]. Framing is checked first: a part that does not split
/// into whole batches appends nothing; otherwise the first refused batch
/// fails the part (those before it stay appended).
pub async fn append_local(
    core: &Core,
    topic: &str,
    partition: u32,
    data: Bytes,
    acks: i8,
) -> Result<(PartitionLog, Vec<AppendInfo>), BrokerError> {
    append_local_guarded(core, topic, partition, data, acks, None).await
}

/// [`append_local`] of a transactional producer's batches verified with
/// its coordinator under `guard` (see
/// [`weir_storage::PartitionLog::append_many_guarded`]).
pub async fn append_local_guarded(
    core: &Core,
    topic: &str,
    partition: u32,
    data: Bytes,
    acks: i8,
    guard: Option<weir_storage::producer_state::TxnGuard>,
) -> Result<(PartitionLog, Vec<AppendInfo>), BrokerError> {
    if core.shared.config.test_panic_on_produce_to.as_deref() == Some(topic) {
        panic!("test-only trigger: produce to `{topic}` (--test-panic-on-produce-to)");
    }
    let log = core.owned_log(topic, partition)?;
    core.replication.check_append(topic, partition, acks)?;
    let mut batches = Vec::new();
    let mut at = 0usize;
    while at < data.len() {
        let h = BatchHeader::parse_framed(&data[at..]).map_err(|e| {
            BrokerError::Corrupt(format!(
                "record batch at byte {at} of the partition's payload: {e}"
            ))
        })?;
        // Copied: the log stamps offsets and the leader epoch into it.
        batches.push(BytesMut::from(&data[at..at + h.total_len()]));
        at += h.total_len();
    }
    let started = Instant::now();
    let (infos, refused) = log.append_many_guarded(batches, guard).await;
    if let Some(e) = refused {
        return Err(append_error(core, topic, partition, e));
    }
    core.metrics.stage(Stage::Append, started.elapsed());
    Ok((log, infos))
}

/// The error of an append or its wait: a log closed under it (its replica
/// moved to other nodes, or the broker is stopping) is answered as a
/// partition this core does not hold (`NotLeader`), so the client asks
/// the metadata again and retries there.
fn append_error(
    core: &Core,
    topic: &str,
    partition: u32,
    e: weir_storage::StorageError,
) -> BrokerError {
    match e {
        weir_storage::StorageError::Closed { .. } => match core.not_held(topic, partition) {
            e @ BrokerError::NotLeader { .. } => e,
            _ => BrokerError::NotLeader {
                topic: topic.to_string(),
                partition,
                leader: 0,
            },
        },
        e => e.into(),
    }
}

/// Waits until an appended batch may be acknowledged as `acks` says: 0
/// and 1 once it is written (1 waits, 0 does not), all once the topic's
/// flush policy is met (fdatasync'd by default).
///
/// The time until written and then until acknowledged is counted in the
/// core's produce stages (`weir_produce_stage_seconds`).
pub async fn ack_local(
    core: Rc<Core>,
    (topic, partition): (&str, u32),
    log: PartitionLog,
    info: AppendInfo,
    acks: i8,
) -> Result<ProduceOk, BrokerError> {
    let appended = Instant::now();
    // A replicated partition's leadership at the time of the append: a
    // replica deposed meanwhile answers NotLeader, never a local-only ack.
    let replicated = core
        .replication
        .get(topic, partition)
        .filter(|r| r.replicated())
        .map(|r| {
            let e = r.epoch();
            (r, e)
        });
    match acks {
        0 => {}
        1 => {
            log.wait_written(info.last_offset + 1)
                .await
                .map_err(|e| append_error(&core, topic, partition, e))?;
            core.metrics.stage(Stage::Write, appended.elapsed());
        }
        _ => {
            // One wait (a second waiter per batch costs the core a wake-up
            // and the log a round): the write's instant is looked up after.
            log.wait_acked(&info)
                .await
                .map_err(|e| append_error(&core, topic, partition, e))?;
            if let Some(written) = log.written_at(info.last_offset + 1) {
                let written = written.max(appended);
                core.metrics.stage(Stage::Write, written - appended);
                core.metrics.stage(Stage::Sync, written.elapsed());
            }
            // Replicated: on disk on every in-sync replica, while this
            // replica still leads at the epoch it appended in.
            if let Some((r, epoch)) = replicated {
                let synced = Instant::now();
                r.wait_acknowledged(info.last_offset + 1, epoch).await?;
                core.metrics.stage(Stage::Replicate, synced.elapsed());
            }
        }
    }
    Ok(ProduceOk {
        base_offset: info.base_offset,
        log_start_offset: log.log_start_offset(),
    })
}

/// Appends the marker that ends producer `producer` (id, epoch)'s
/// transaction to a partition this core owns (the transaction
/// coordinator's write) and waits until it may be acknowledged as an
/// acks=all write.
pub async fn marker_local(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    (producer_id, epoch): (i64, i16),
    commit: bool,
    coordinator_epoch: i32,
) -> Result<(), BrokerError> {
    use weir_storage::txn::{Marker, MarkerKind};
    let log = core.owned_log(topic, partition)?;
    core.replication.check_append(topic, partition, -1)?;
    let marker = Marker {
        kind: if commit {
            MarkerKind::Commit
        } else {
            MarkerKind::Abort
        },
        coordinator_epoch,
    };
    let info = log
        .append_marker(producer_id, epoch, marker, core.storage.now_ms())
        .await
        .map_err(|e| append_error(core, topic, partition, e))?;
    ack_local(core.clone(), (topic, partition), log, info, -1).await?;
    Ok(())
}

/// Appends a coordinator's transactional batch (see
/// `PartitionLog::append_unsequenced`) to a partition this core owns and
/// waits until it may be acknowledged as an acks=all write.
pub async fn append_unsequenced_local(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    batch: Bytes,
) -> Result<(), BrokerError> {
    let log = core.owned_log(topic, partition)?;
    core.replication.check_append(topic, partition, -1)?;
    let info = log
        .append_unsequenced(BytesMut::from(&batch[..]))
        .await
        .map_err(|e| append_error(core, topic, partition, e))?;
    ack_local(core.clone(), (topic, partition), log, info, -1).await?;
    Ok(())
}

/// Waits for the acknowledgement of one appended batch.
pub(crate) type AckWait = Pin<Box<dyn Future<Output = Result<ProduceOk, BrokerError>>>>;

/// The first batch's acknowledgement, or the first failure.
pub(crate) async fn all_acked(waits: Vec<AckWait>) -> Result<ProduceOk, BrokerError> {
    let mut first = None;
    for w in waits {
        let r = w.await?;
        first.get_or_insert(r);
    }
    first.ok_or_else(|| BrokerError::Corrupt("empty record set".into()))
}

/// The waits for the acknowledgements of batches appended on this core.
pub(crate) fn ack_waits(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    log: PartitionLog,
    infos: Vec<AppendInfo>,
    acks: i8,
) -> Vec<AckWait> {
    infos
        .into_iter()
        .map(|info| {
            let (core, topic, log) = (core.clone(), topic.to_string(), log.clone());
            Box::pin(async move { ack_local(core, (&topic, partition), log, info, acks).await })
                as AckWait
        })
        .collect()
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
    // A replicated partition is read up to its high watermark (on disk on
    // every in-sync replica), only where this node leads it; another is
    // read up to what is written.
    let replica = core.replication.get(topic, partition);
    if let Some(r) = &replica {
        r.check_leader()?;
    }
    let limit = replica.filter(|r| r.replicated());
    let visible = || {
        limit
            .as_ref()
            .map_or(log.high_watermark(), |r| r.high_watermark())
    };
    if max_bytes == 0 {
        // Only the watermarks: the fetch's byte budget is spent.
        let hw = visible();
        return Ok(FetchOk {
            batches: Vec::new(),
            high_watermark: hw,
            log_start_offset: log.log_start_offset(),
            last_stable_offset: log.last_stable_offset().min(hw),
            aborted: Vec::new(),
        });
    }
    if wait_ms > 0 && offset == visible() {
        // Long poll: wake when a batch at `offset` is visible, or time out.
        let wait = std::time::Duration::from_millis(wait_ms as u64);
        let _ = futures_lite::future::or(
            async {
                match &limit {
                    Some(r) => r.wait_hw(offset + 1).await.is_ok(),
                    None => log.wait_written(offset + 1).await.is_ok(),
                }
            },
            async {
                glommio::timer::sleep(wait).await;
                false
            },
        )
        .await;
    }
    let hw = visible();
    let mut r = log
        .read(offset, max_bytes)
        .await
        .map_err(BrokerError::from)?;
    if limit.is_some() {
        // The high watermark falls between batches (followers report
        // whole batches): keep those below it.
        r.batches.retain(|b| {
            weir_proto::batch::BatchHeader::peek(b).is_ok_and(|h| (h.base_offset as u64) < hw)
        });
    }
    let hw = if limit.is_some() {
        hw
    } else {
        r.high_watermark
    };
    let last_stable_offset = r.last_stable_offset.min(hw);
    let end = r
        .batches
        .last()
        .and_then(|b| weir_proto::batch::BatchHeader::peek(b).ok())
        .map_or(offset, |h| h.last_offset() as u64 + 1);
    let aborted = if end > offset {
        log.aborted_transactions(offset, end)
            .into_iter()
            .map(|a| (a.producer_id, a.first_offset))
            .collect()
    } else {
        Vec::new()
    };
    Ok(FetchOk {
        batches: r.batches,
        high_watermark: hw,
        log_start_offset: r.log_start_offset,
        last_stable_offset,
        aborted,
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
    let high_watermark = match core.replication.consumer_limit(topic, partition) {
        Some(r) => r.high_watermark(),
        None => log.high_watermark(),
    };
    Ok(OffsetsOk {
        local_log_start_offset: log.log_start_offset(),
        remote_bytes: 0,
        remote_segments: 0,
        remote_end: None,
        log_start_offset: log.log_start_offset(),
        last_stable_offset: log.last_stable_offset().min(high_watermark),
        high_watermark,
        size_bytes: log.size_bytes(),
        for_timestamp,
        leader_epochs: log.leader_epochs(),
    })
}

/// Raises the log start offset of a partition this core owns to `before`
/// (-1: the high watermark), as Kafka's DeleteRecords: records below it
/// are no longer served, and segments wholly below it are deleted.
/// Returns the new log start offset (never lowered).
pub async fn delete_records_local(
    core: &Core,
    topic: &str,
    partition: u32,
    before: i64,
) -> Result<u64, BrokerError> {
    let log = core.owned_log(topic, partition)?;
    let hw = log.high_watermark();
    let to = match before {
        -1 => hw,
        b if b < 0 || b as u64 > hw => {
            return Err(BrokerError::Storage {
                kind: StorageFailure::OffsetOutOfRange,
                message: format!(
                    "cannot delete records of {topic}-{partition} before offset {b}: \
                     valid offsets are {}..={hw} (the high watermark), or -1 for the high watermark",
                    log.log_start_offset()
                ),
            })
        }
        b => b as u64,
    };
    log.delete_before(to).await.map_err(BrokerError::from)
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
    super::producer_ids::allocate(
        &core.producer_ids,
        &core.producer_ids_reserving,
        &core.shared.controller,
    )
    .await
    .map_err(|e| BrokerError::Storage {
        kind: StorageFailure::Io,
        message: format!("allocating a producer id failed: {e:#}"),
    })
}
