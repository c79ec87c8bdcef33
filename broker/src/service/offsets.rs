//! Offsets of partitions: log start, high watermark, size, and the offset
//! for a timestamp (through the time index), each on the owner core.

use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use weir_storage::epochs::epoch_at;

use super::{BrokerError, OffsetsOk, Result};
use crate::metadata::OFFSETS_TOPIC;
use crate::server::limits::REQUEST_PARTITIONS_MAX;
use crate::shard::mesh::{CoreMsg, ReplyTo};
use crate::shard::Core;

/// Which offset a list-offsets request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetQuery {
    /// The log start offset.
    Earliest,
    /// The high watermark.
    Latest,
    /// The last stable offset (a read_committed reader's end).
    LatestStable,
    /// The first offset whose timestamp is at or after this (ms).
    Timestamp(i64),
    /// The first offset on local disk (the log start unless tiered;
    /// Kafka's -4, `EARLIEST_LOCAL_TIMESTAMP`).
    EarliestLocal,
    /// The last offset in the remote tier (Kafka's -5,
    /// `LATEST_TIERED_TIMESTAMP`): none for a topic that is not tiered
    /// or while nothing of it is remote.
    LatestTiered,
}

/// Runs a partition operation on its owner core (locally, or through the
/// mesh).
pub async fn on_owner<T: Send + 'static>(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    local: impl Future<Output = Result<T>>,
    remote: impl FnOnce(ReplyTo<Result<T>>) -> CoreMsg,
) -> Result<T> {
    let owner = core.locate(topic, partition)?;
    if owner == core.id {
        return local.await;
    }
    core.call(owner, Duration::ZERO, remote).await?
}

/// Offsets of one partition (with a timestamp lookup if `ts` is given).
pub async fn offsets(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    ts: Option<i64>,
) -> Result<OffsetsOk> {
    on_owner(
        core,
        topic,
        partition,
        crate::tier::read::offsets_owned(core, topic, partition, ts),
        |reply| CoreMsg::Offsets {
            topic: topic.to_string(),
            partition,
            timestamp: ts,
            reply,
        },
    )
    .await
}

/// What a list-offsets query found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    /// The offset (`None`: no record at or after the timestamp).
    pub offset: Option<u64>,
    /// The leader epoch that wrote the record there, as Kafka answers it:
    /// for the latest offset, the log's newest epoch.
    pub leader_epoch: Option<u32>,
}

/// Answers each query in order.
pub async fn list_offsets(
    core: &Rc<Core>,
    queries: &[(String, u32, OffsetQuery)],
) -> Result<Vec<Result<Listed>>> {
    if queries.len() > REQUEST_PARTITIONS_MAX {
        return Err(BrokerError::InvalidRequest(format!(
            "the request names {} partitions; at most {REQUEST_PARTITIONS_MAX} per request",
            queries.len()
        )));
    }
    let mut out = Vec::with_capacity(queries.len());
    for (topic, partition, q) in queries {
        let ts = match q {
            OffsetQuery::Timestamp(t) => Some(*t),
            _ => None,
        };
        let r = offsets(core, topic, *partition, ts).await;
        out.push(r.map(|o| {
            let epochs = &o.leader_epochs;
            let (offset, leader_epoch) = match q {
                OffsetQuery::Earliest => (
                    Some(o.log_start_offset),
                    epoch_at(epochs, o.log_start_offset),
                ),
                OffsetQuery::Latest => (Some(o.high_watermark), epochs.last().map(|e| e.0)),
                OffsetQuery::LatestStable => (
                    Some(o.last_stable_offset),
                    epoch_at(epochs, o.last_stable_offset).or(epochs.last().map(|e| e.0)),
                ),
                OffsetQuery::Timestamp(_) => (
                    o.for_timestamp,
                    o.for_timestamp.and_then(|at| epoch_at(epochs, at)),
                ),
                OffsetQuery::EarliestLocal => (
                    Some(o.local_log_start_offset),
                    epoch_at(epochs, o.local_log_start_offset),
                ),
                OffsetQuery::LatestTiered => {
                    let last = o.remote_end.and_then(|end| end.checked_sub(1));
                    (last, last.and_then(|at| epoch_at(epochs, at)))
                }
            };
            Listed {
                offset,
                leader_epoch,
            }
        }));
    }
    Ok(out)
}

/// Deletes the records of a partition before `before` (-1: the high
/// watermark), as Kafka's DeleteRecords; returns the new log start offset.
pub async fn delete_records(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    before: i64,
) -> Result<u64> {
    if crate::metadata::is_internal(topic) {
        return Err(BrokerError::Policy(format!(
            "{topic} is internal: its records are its coordinator's state{}",
            if topic == OFFSETS_TOPIC {
                " (delete the group instead)"
            } else {
                ""
            }
        )));
    }
    on_owner(
        core,
        topic,
        partition,
        crate::tier::read::delete_records_owned(core, topic, partition, before),
        |reply| CoreMsg::DeleteRecords {
            topic: topic.to_string(),
            partition,
            before,
            reply,
        },
    )
    .await
}
