//! Fetch: read a request's partitions on their owner cores, within one
//! byte budget, waiting (a long poll) when there is not enough data yet.
//!
//! **Budget spent while reading.** The partitions of one owner core are
//! read one after the other, each with what is left of the request's
//! `max_bytes` (and at most its own `max_bytes`); the owner cores work in
//! parallel. Once the budget is spent, later partitions report only their
//! watermarks. A final pass in request order keeps the rule that a fetch
//! returns at least the first batch it finds, even one larger than the
//! budget, and never more than the budget beyond it.
//!
//! **Long polls** wait at most [`FETCH_WAIT_MS_MAX`]; the waits are tasks
//! owned by the request, so a request dropped because its connection
//! closed stops waiting at once.
//!
//! **Continuing** ([`Cursors`]): a native fetch may ask for a partition
//! from where the connection's previous fetch of it ended, so a client
//! keeps a second fetch in flight before the first is answered.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use glommio::channels::local_channel;

use super::{admin, BrokerError, Ctx, FetchOk, Result};
use crate::server::limits::{FETCH_WAIT_MS_MAX, REQUEST_PARTITIONS_MAX};
use crate::shard::mesh::CoreMsg;
use crate::shard::Core;

/// One partition of a fetch request.
#[derive(Debug, Clone)]
pub struct FetchPart {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// First offset wanted.
    pub offset: u64,
    /// Most bytes wanted from this partition.
    pub max_bytes: u32,
}

/// The request-wide parameters of a fetch.
#[derive(Debug, Clone, Copy)]
pub struct FetchParams {
    /// Most bytes in the whole answer (beyond the first batch).
    pub max_bytes: u32,
    /// Answer once this many bytes are there…
    pub min_bytes: u32,
    /// …or after this long (capped to [`FETCH_WAIT_MS_MAX`]).
    pub max_wait_ms: u32,
    /// Only what is committed: batches below the last stable offset
    /// (Kafka's `isolation.level=read_committed`).
    pub read_committed: bool,
}

/// Where a connection's fetches of each partition ended, for native
/// Fetch v2's `FetchPartition::CONTINUE` ("from where the previous fetch of
/// this partition on this connection ended"). A fetch takes a sequence
/// number when it is read ([`Cursors::begin`]) and records its ends when
/// answered ([`Cursors::ended`]); a later-numbered record wins, so fetches
/// served concurrently leave the end of the last one read. A continuing
/// fetch is served at its turn to be answered (after every earlier
/// answer), so the fetches before it have all recorded theirs.
#[derive(Debug, Default)]
pub struct Cursors {
    next: Cell<u64>,
    /// Topic → partition → end: looked up by `&str`, so recording and
    /// resolving allocate nothing once a topic is known.
    ends: RefCell<HashMap<String, HashMap<u32, End>>>,
    /// Partitions in `ends`.
    len: Cell<usize>,
}

/// Where the last-read fetch of a partition ended: (its sequence number,
/// the end offset — `None` if it failed).
type End = (u64, Option<u64>);

impl Cursors {
    /// A fetch was read: its sequence number.
    pub fn begin(&self) -> u64 {
        let n = self.next.get();
        self.next.set(n + 1);
        n
    }

    /// Fetch `seq` of `topic`-`partition` ended at `end` (the offset after
    /// its last batch, or where it was read from if it found none; `None`
    /// if it failed). Bounded: a connection that fetched more than
    /// [`REQUEST_PARTITIONS_MAX`] partitions forgets the others (their
    /// continuing fetches are refused, and the client fetches by offset).
    pub fn ended(&self, seq: u64, topic: &str, partition: u32, end: Option<u64>) {
        let mut ends = self.ends.borrow_mut();
        if let Some(e) = ends.get_mut(topic).and_then(|t| t.get_mut(&partition)) {
            if e.0 <= seq {
                *e = (seq, end);
            }
            return;
        }
        if self.len.get() >= REQUEST_PARTITIONS_MAX {
            ends.clear();
            self.len.set(0);
        }
        let partitions = match ends.get_mut(topic) {
            Some(t) => t,
            None => ends.entry(topic.to_string()).or_default(),
        };
        partitions.insert(partition, (seq, end));
        self.len.set(self.len.get() + 1);
    }

    /// Where the connection's last fetch of `topic`-`partition` ended, if
    /// it has one that did not fail.
    pub fn resolve(&self, topic: &str, partition: u32) -> Option<u64> {
        self.ends.borrow().get(topic)?.get(&partition)?.1
    }
}

/// Where a fetch of a partition from `offset` that answered `r` ends: after
/// its last batch, or at `offset` if it found none; `None` if it failed.
pub fn end_of(offset: u64, r: &Result<FetchOk>) -> Option<u64> {
    let f = r.as_ref().ok()?;
    let Some(last) = f.batches.last() else {
        return Some(offset);
    };
    let h = weir_proto::batch::BatchHeader::peek(last).ok()?;
    u64::try_from(h.last_offset() + 1)
        .ok()
        .map(|e| e.max(offset))
}

/// Reads the partitions (one result each, in order), waiting up to
/// `max_wait_ms` for `min_bytes`.
pub async fn fetch(
    core: &Rc<Core>,
    parts: &[FetchPart],
    params: FetchParams,
    ctx: Ctx,
) -> Result<Vec<Result<FetchOk>>> {
    if parts.len() > REQUEST_PARTITIONS_MAX {
        return Err(BrokerError::InvalidRequest(format!(
            "the fetch names {} partitions; at most {REQUEST_PARTITIONS_MAX} per request",
            parts.len()
        )));
    }
    let committed = |results: &mut Vec<Result<FetchOk>>| {
        if params.read_committed {
            for f in results.iter_mut().flatten() {
                let lso = f.last_stable_offset;
                f.batches.retain(|b| {
                    weir_proto::batch::BatchHeader::peek(b)
                        .is_ok_and(|h| (h.base_offset as u64) < lso)
                });
            }
        }
    };
    let mut results = read_all(core, parts, params.max_bytes, ctx).await;
    committed(&mut results);
    let got: u64 = results
        .iter()
        .flatten()
        .flat_map(|f| f.batches.iter().map(|b| b.len() as u64))
        .sum();
    // A partition error (out of range, unknown, not owner) is answered at
    // once: waiting would not change it.
    let any_error = results.iter().any(|r| r.is_err());
    let wait_ms = params.max_wait_ms.min(FETCH_WAIT_MS_MAX);
    if wait_ms > 0 && params.min_bytes > 0 && got < u64::from(params.min_bytes) && !any_error {
        long_poll(core, parts, wait_ms, ctx).await;
        results = read_all(core, parts, params.max_bytes, ctx).await;
        committed(&mut results);
    }
    trim(&mut results, params.max_bytes);
    Ok(results)
}

/// Waits until any partition gets data (each owner waits on its log), or
/// `wait_ms`. The waits are tasks of this request: dropped with it.
async fn long_poll(core: &Rc<Core>, parts: &[FetchPart], wait_ms: u32, ctx: Ctx) {
    let (tx, rx) = local_channel::new_bounded::<()>(1);
    let tx = Rc::new(tx);
    let waits: Vec<_> = parts
        .iter()
        .map(|p| {
            let (core, p, tx) = (core.clone(), p.clone(), tx.clone());
            glommio::spawn_local(async move {
                match read_one(&core, &p, 1, wait_ms, ctx).await {
                    Ok(f) if f.batches.is_empty() => {}
                    // Data, or an error (e.g. the log was truncated below
                    // the offset meanwhile): answer now.
                    _ => {
                        let _ = tx.try_send(());
                    }
                }
            })
        })
        .collect();
    drop(tx);
    futures_lite::future::or(
        async {
            // Every wait ended without data: wait out the rest.
            if rx.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        },
        glommio::timer::sleep(Duration::from_millis(u64::from(wait_ms))),
    )
    .await;
    drop(waits);
}

/// Reads one partition on its owner core; with `wait_ms`, the owner waits
/// for data at the offset if there is none yet.
async fn read_one(
    core: &Rc<Core>,
    p: &FetchPart,
    max_bytes: u64,
    wait_ms: u32,
    ctx: Ctx,
) -> Result<FetchOk> {
    let (topic, partition, offset) = (p.topic.as_str(), p.partition, p.offset);
    if ctx.owner_only {
        if let Some(owner) = core.owner(topic, partition) {
            if owner != core.id {
                return Err(admin::not_owner(core, topic, partition, owner));
            }
        }
    }
    let owner = core.locate(topic, partition)?;
    if owner == core.id {
        return crate::tier::read::fetch_owned(core, topic, partition, offset, max_bytes, wait_ms)
            .await;
    }
    let wait = Duration::from_millis(u64::from(wait_ms));
    core.call(owner, wait, |reply| CoreMsg::Fetch {
        topic: topic.to_string(),
        partition,
        offset,
        max_bytes,
        wait_ms,
        reply,
    })
    .await?
}

/// Reads every partition without waiting: the partitions of each owner
/// core in order, spending one shared budget; the cores in parallel.
async fn read_all(
    core: &Rc<Core>,
    parts: &[FetchPart],
    max_bytes: u32,
    ctx: Ctx,
) -> Vec<Result<FetchOk>> {
    let mut by_core: BTreeMap<Option<usize>, Vec<usize>> = BTreeMap::new();
    for (i, p) in parts.iter().enumerate() {
        by_core
            .entry(core.owner(&p.topic, p.partition))
            .or_default()
            .push(i);
    }
    let left = Rc::new(Cell::new(u64::from(max_bytes.max(1))));
    let tasks: Vec<_> = by_core
        .into_values()
        .map(|idx| {
            let (core, left) = (core.clone(), left.clone());
            let parts: Vec<(usize, FetchPart)> =
                idx.into_iter().map(|i| (i, parts[i].clone())).collect();
            glommio::spawn_local(async move {
                let mut out = Vec::with_capacity(parts.len());
                for (i, p) in parts {
                    let budget = u64::from(p.max_bytes.max(1)).min(left.get());
                    let r = read_one(&core, &p, budget, 0, ctx).await;
                    if let Ok(f) = &r {
                        let n: u64 = f.batches.iter().map(|b| b.len() as u64).sum();
                        left.set(left.get().saturating_sub(n));
                    }
                    out.push((i, r));
                }
                out
            })
        })
        .collect();
    let mut results: Vec<Option<Result<FetchOk>>> = (0..parts.len()).map(|_| None).collect();
    for t in tasks {
        for (i, r) in t.await {
            results[i] = Some(r);
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every partition was read"))
        .collect()
}

/// Keeps the batches within the request's budget, in request order: at
/// least the first batch, then none that would go over `max_bytes`.
fn trim(results: &mut [Result<FetchOk>], max_bytes: u32) {
    let mut at: u64 = 0;
    for f in results.iter_mut().flatten() {
        let mut keep = 0;
        for b in &f.batches {
            if at > 0 && at + b.len() as u64 > u64::from(max_bytes) {
                break;
            }
            at += b.len() as u64;
            keep += 1;
        }
        f.batches.truncate(keep);
    }
}
