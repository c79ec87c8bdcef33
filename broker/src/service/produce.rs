//! Produce: append a request's batches on their partitions' owner cores
//! and wait for their acknowledgements.
//!
//! Returns in two steps so that a connection's appends keep request order
//! while their acknowledgements overlap: [`produce`] returns once every
//! batch is appended (queued on its log), with a future that waits for
//! the acknowledgements (bounded by the request's timeout).

use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;

use super::{admin, BrokerError, Ctx, ProduceOk, Result};
use crate::metadata::OFFSETS_TOPIC;
use crate::server::limits::REQUEST_PARTITIONS_MAX;
use crate::shard::mesh::CoreMsg;
use crate::shard::partition::{self, ack_waits, all_acked, AckWait};
use crate::shard::Core;
use crate::txns::api::TxnWrite;

/// One partition's part of a produce request: its record batches as sent
/// (or why the listener could not cut them out of the request).
#[derive(Debug)]
pub struct ProducePart {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// One or more whole record batches.
    pub data: Result<Bytes>,
    /// The transactional id of a transactional producer's request (its
    /// batches are checked against its open transaction).
    pub transaction: Option<Rc<str>>,
    /// The client speaks KIP-890's v2 protocol (Kafka's Produce v12+): its
    /// transactional writes add their partition to the transaction
    /// rather than being checked against it.
    pub adds_to_txn: bool,
}

/// The outcome for one partition: the first batch's offsets, or why not.
pub type ProduceOutcome = (String, u32, Result<ProduceOk>);

/// Appends every batch of every part (parts concurrently, the batches of
/// one part in order); returns once all are queued, with the future that
/// waits for their acknowledgements — as `acks` says, at most `timeout`
/// (`None`: no limit) — and yields one outcome per part, in order.
pub async fn produce(
    core: &Rc<Core>,
    parts: Vec<ProducePart>,
    acks: i8,
    timeout: Option<Duration>,
    ctx: Ctx,
) -> std::result::Result<impl Future<Output = Vec<ProduceOutcome>> + 'static, BrokerError> {
    if parts.len() > REQUEST_PARTITIONS_MAX {
        return Err(BrokerError::InvalidRequest(format!(
            "the request names {} partitions; at most {REQUEST_PARTITIONS_MAX} per request",
            parts.len()
        )));
    }
    if !(-1..=1).contains(&acks) {
        return Err(BrokerError::InvalidRequest(format!(
            "acks {acks}: use -1, 0 or 1"
        )));
    }
    let tasks: Vec<_> = parts
        .into_iter()
        .map(|p| {
            let core = core.clone();
            glommio::spawn_local(async move {
                let r = match p.data {
                    Ok(data) => {
                        let tp = (p.topic.as_str(), p.partition);
                        let txn = p.transaction.map(|id| (id, p.adds_to_txn));
                        append_partition(&core, tp, data, txn, acks, ctx).await
                    }
                    Err(e) => Err(e),
                };
                (p.topic, p.partition, r)
            })
        })
        .collect();
    let mut appended = Vec::with_capacity(tasks.len());
    for t in tasks {
        appended.push(t.await);
    }
    let timeout = timeout.unwrap_or(Duration::from_millis(u64::from(u32::MAX)));
    let deadline = std::time::Instant::now() + timeout;
    Ok(async move {
        let mut out = Vec::with_capacity(appended.len());
        for (topic, partition, r) in appended {
            let r = match r {
                // `timeout` bounds the wait for the acknowledgements. As in
                // Kafka, a timed-out batch may still be appended.
                Ok(waits) => {
                    futures_lite::future::or(all_acked(waits), async {
                        let left = deadline.saturating_duration_since(std::time::Instant::now());
                        glommio::timer::sleep(left).await;
                        Err(BrokerError::TimedOut(format!(
                        "not acknowledged within timeout_ms={}; the batch may still be appended",
                        timeout.as_millis()
                    )))
                    })
                    .await
                }
                Err(e) => Err(e),
            };
            out.push((topic, partition, r));
        }
        out
    })
}

/// Appends every batch of one partition's payload, in order and together,
/// on the owner core; returns once they are queued, with the waits for
/// their acknowledgements.
async fn append_partition(
    core: &Rc<Core>,
    (topic, partition): (&str, u32),
    data: Bytes,
    transaction: Option<(Rc<str>, bool)>,
    acks: i8,
    ctx: Ctx,
) -> Result<Vec<AckWait>> {
    if crate::metadata::is_internal(topic) {
        return Err(BrokerError::Policy(format!(
            "{topic} is internal: only its coordinator writes it{}",
            if topic == OFFSETS_TOPIC {
                " (commit offsets instead)"
            } else {
                ""
            }
        )));
    }
    admin::ensure_topic(core, topic).await;
    let owner = core.locate(topic, partition)?;
    if ctx.owner_only && owner != core.id {
        return Err(admin::not_owner(core, topic, partition, owner));
    }
    if data.is_empty() {
        return Err(BrokerError::Corrupt("empty record set".into()));
    }
    let txn = match transactional_producer(&data)? {
        None => None,
        Some(producer) => {
            let Some((id, add)) = transaction else {
                return Err(BrokerError::InvalidRequest(
                    "a transactional batch without a transactional id".into(),
                ));
            };
            Some(TxnWrite {
                id: id.to_string(),
                producer,
                add,
            })
        }
    };
    if owner == core.id {
        let (log, infos) = append_here(core, topic, partition, data, acks, txn).await?;
        return Ok(ack_waits(core, topic, partition, log, infos, acks));
    }
    // Two answers: appended (so the connection's next request follows
    // it), then acknowledged.
    let (appended_tx, appended_rx) = core.expect_reply(owner).await?;
    let (reply_tx, reply_rx) = core.expect_reply(owner).await?;
    let msg = CoreMsg::Produce {
        topic: topic.to_string(),
        partition,
        batches: data,
        acks,
        transaction: txn,
        appended: appended_tx,
        reply: reply_tx,
    };
    core.send_to(owner, msg).await?;
    core.mesh
        .within(owner, Duration::ZERO, appended_rx)
        .await??;
    Ok(vec![Box::pin(
        async move { reply_rx.await.and_then(|r| r) },
    )])
}

/// Appends on the owner core (this one). A transactional producer's
/// batches (`txn`) are first verified with its coordinator (KIP-890: the
/// partition must be in the producer's open transaction, else a zombie's
/// or a late write would open a transaction in the log that nothing ends),
/// under a guard taken before the verification: a marker of the producer
/// appended meanwhile (its transaction ended) refuses a write that would
/// open a new one.
///
/// A v2 client's write (`txn.add`) adds the partition instead; its guard
/// is taken once the add answered, as the add may wait for the markers of
/// the previous transaction (which carry the epoch this write has: v2
/// bumps the epoch at every end, so a late write of an ended transaction
/// is refused by its epoch, and the guard still catches an end that
/// races this write).
pub async fn append_here(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    data: Bytes,
    acks: i8,
    txn: Option<TxnWrite>,
) -> Result<(weir_storage::PartitionLog, Vec<weir_storage::AppendInfo>)> {
    let guard = match txn {
        None => None,
        Some(TxnWrite {
            id,
            producer: (producer_id, epoch),
            add,
        }) => {
            let early = (!add)
                .then(|| {
                    core.owned_log(topic, partition)
                        .map(|l| l.txn_guard(producer_id))
                })
                .transpose()?;
            let verify = crate::txns::api::TxnRequest::Verify {
                id,
                producer_id,
                epoch,
                tp: (topic.to_string(), partition),
                add,
            };
            crate::txns::coordinator::serve(core, verify)
                .await
                .map_err(BrokerError::Transaction)?;
            match early {
                Some(g) => Some(g),
                None => Some(core.owned_log(topic, partition)?.txn_guard(producer_id)),
            }
        }
    };
    partition::append_local_guarded(core, topic, partition, data, acks, guard).await
}

/// The producer (id, epoch) of a payload's transactional batches, if it
/// has any (a walk over the headers; the log validates the batches): all
/// its batches must then be that producer's transactional ones.
fn transactional_producer(data: &[u8]) -> Result<Option<(i64, i16)>> {
    let mut at = 0;
    let (mut txn, mut plain) = (None, false);
    while let Some(h) = data
        .get(at..)
        .and_then(|rest| weir_proto::batch::BatchHeader::peek(rest).ok())
    {
        if h.attributes.is_transactional() {
            let p = (h.producer_id, h.producer_epoch);
            if txn.is_some_and(|t| t != p) {
                return Err(BrokerError::InvalidRequest(
                    "transactional batches of two producers in one request".into(),
                ));
            }
            txn = Some(p);
        } else {
            plain = true;
        }
        at += h.total_len().max(1);
    }
    if txn.is_some() && plain {
        return Err(BrokerError::InvalidRequest(
            "transactional and plain batches in one partition's records".into(),
        ));
    }
    Ok(txn)
}
