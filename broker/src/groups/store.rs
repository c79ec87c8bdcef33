//! Where consumer groups are stored: the records of `__consumer_offsets`
//! (created by core 0 at start-up, compacted), appended by a group's
//! coordinator to its own partition, and replayed by every core at
//! start-up to rebuild the groups it coordinates.
//!
//! **Which core:** everything here runs on the core that owns the
//! partition concerned (the group's coordinator).

use std::collections::BTreeMap;
use std::rc::Rc;

use bytes::Bytes;
use weir_proto::batch::Compression;
use weir_proto::builder::BatchBuilder;
use weir_proto::reader::RecordBatch;
use weir_proto::record::RecordData;

use crate::groups::api::Refusal;
use crate::groups::records::{self, GroupValue, RecordKey, Value, OFFSETS_TOPIC};
use crate::metadata::writer;
use crate::metadata::Change;
use crate::metadata::{ConfigOp, TopicSpec};
use crate::service::BrokerError;
use crate::shard::partition;
use crate::shard::partition::{ack_waits, all_acked};
use crate::shard::Core;

/// Bytes of `__consumer_offsets` read at a time when replaying.
pub const REPLAY_READ_BYTES: u64 = 1 << 20;

/// Appends records to the group's `__consumer_offsets` partition (on this
/// core) as one batch and waits until it is durable.
pub async fn write_records(
    core: &Rc<Core>,
    group: &str,
    records: Vec<(RecordKey, Option<Bytes>)>,
) -> Result<(), BrokerError> {
    let n = core
        .metadata()
        .get(OFFSETS_TOPIC)
        .map(|t| t.partitions())
        .unwrap_or(1);
    let p = records::partition_for(group, n);
    let raw = records.into_iter().map(|(k, v)| (k.encode(), v));
    write_raw(core, p, raw).await
}

/// Appends records with encoded keys to `__consumer_offsets` partition
/// `p` (on this core) as one batch and waits until it is durable.
async fn write_raw(
    core: &Rc<Core>,
    p: u32,
    records: impl Iterator<Item = (Bytes, Option<Bytes>)>,
) -> Result<(), BrokerError> {
    let storage = |e: weir_proto::batch::BatchError| BrokerError::Storage {
        kind: crate::service::StorageFailure::Io,
        message: format!("encoding group records: {e}"),
    };
    let mut b = BatchBuilder::new(Compression::None).map_err(storage)?;
    let ts = core.storage.now_ms();
    for (key, value) in records {
        b.push(&RecordData {
            key: Some(key),
            value,
            headers: Vec::new(),
            timestamp: ts,
        })
        .map_err(storage)?;
    }
    let batch = b.build().map_err(storage)?.freeze();
    append_durably(core, p, batch).await
}

/// Appends a batch to `__consumer_offsets` partition `p` (on this core) and
/// waits until it is durable.
async fn append_durably(core: &Rc<Core>, p: u32, batch: Bytes) -> Result<(), BrokerError> {
    let (log, infos) = partition::append_local(core, OFFSETS_TOPIC, p, batch, -1).await?;
    all_acked(ack_waits(core, OFFSETS_TOPIC, p, log, infos, -1)).await?;
    Ok(())
}

/// Rebuilds the groups of every `__consumer_offsets` partition this core
/// owns from the log (start-up).
pub async fn load(core: &Rc<Core>) -> anyhow::Result<()> {
    let Some(n) = core.metadata().get(OFFSETS_TOPIC).map(|t| t.partitions()) else {
        core.groups.set_loaded(crate::groups::clock::mono_ms());
        return Ok(());
    };
    let mut records = 0u64;
    for p in 0..n {
        // Only partitions this core leads: a follower's replica is
        // replayed if it becomes the leader (`replay_led`).
        if !core.locate(OFFSETS_TOPIC, p).is_ok_and(|c| c == core.id) {
            continue;
        }
        records += replay_partition(core, p).await?;
    }
    if records > 0 {
        tracing::info!(core = core.id, records, "consumer groups loaded");
    }
    core.groups.set_loaded(crate::groups::clock::mono_ms());
    Ok(())
}

/// This core became the leader of `__consumer_offsets` partition `p`
/// (failover): replays its groups, served from then on.
pub async fn replay_led(core: Rc<Core>, p: u32) {
    let Some(n) = core.metadata().get(OFFSETS_TOPIC).map(|t| t.partitions()) else {
        return;
    };
    core.groups.forget_partition(p, n);
    match replay_partition(&core, p).await {
        Ok(records) => {
            tracing::info!(
                partition = p,
                records,
                "now coordinating the groups of {OFFSETS_TOPIC}-{p}"
            );
        }
        Err(e) => {
            tracing::error!(partition = p, error = %e, "replaying {OFFSETS_TOPIC}-{p} failed")
        }
    }
    core.groups
        .set_partition_loaded(p, n, crate::groups::clock::mono_ms());
}

/// Replays partition `p`'s records into the core's groups; returns how
/// many.
async fn replay_partition(core: &Rc<Core>, p: u32) -> anyhow::Result<u64> {
    let mut records = 0u64;
    // Keys of records in Weir's first layout, and whether the latest one
    // of each is live (not yet rewritten and tombstoned).
    let mut legacy: BTreeMap<Bytes, bool> = BTreeMap::new();
    let Some(log) = core.log(OFFSETS_TOPIC, p) else {
        return Ok(0);
    };
    let mut at = log.log_start_offset();
    // Only what is durable: a record written but not fdatasync'd was
    // never answered.
    let end = log.durable_offset();
    while at < end {
        let r = log
            .read(at, REPLAY_READ_BYTES)
            .await
            .map_err(|e| anyhow::anyhow!("replaying {OFFSETS_TOPIC}-{p} at {at}: {e}"))?;
        let before = at;
        for b in &r.batches {
            let rb =
                RecordBatch::parse(b).map_err(|e| anyhow::anyhow!("{OFFSETS_TOPIC}-{p}: {e}"))?;
            let last = rb.header().last_offset() as u64;
            let decoded = rb
                .records()
                .map_err(|e| anyhow::anyhow!("{OFFSETS_TOPIC}-{p}: {e}"))?;
            for rec in decoded.iter() {
                let rec = rec.map_err(|e| anyhow::anyhow!("{OFFSETS_TOPIC}-{p}: {e}"))?;
                if (rec.offset as u64) < at {
                    continue;
                }
                records += 1;
                if apply(core, rec.record.key, rec.record.value, p) {
                    if let Some(k) = rec.record.key {
                        let live = rec.record.value.is_some();
                        legacy.insert(Bytes::copy_from_slice(k), live);
                    }
                }
            }
            at = at.max(last + 1);
        }
        if at == before {
            break;
        }
    }
    let legacy: Vec<Bytes> = legacy
        .into_iter()
        .filter_map(|(k, live)| live.then_some(k))
        .collect();
    if !legacy.is_empty() {
        let core = core.clone();
        glommio::spawn_local(async move { rewrite_legacy(&core, p, legacy).await }).detach();
    }
    Ok(records)
}

/// Rewrites the groups of partition `p` that have records in Weir's first
/// layout into Kafka's format: per group, under its lock, one batch of
/// tombstones for the old keys (the old offset key is Kafka's legacy
/// offset key, so a Kafka reader sees the offset deleted, then set again
/// by the next record) and the group's current records. In the background
/// after a replay: a failure is logged and the next replay rewrites again
/// (old and new records describe the same state).
async fn rewrite_legacy(core: &Rc<Core>, p: u32, keys: Vec<Bytes>) {
    let mut by_group: BTreeMap<String, Vec<Bytes>> = BTreeMap::new();
    for k in keys {
        if let Ok(r) = records::decode_record(&k, None) {
            by_group
                .entry(r.key.group().to_string())
                .or_default()
                .push(k);
        }
    }
    let groups = by_group.len();
    for (group, old) in by_group {
        let _lock = core.groups.lock(&group).await;
        let current = core.groups.current_records(&group);
        let tombstones = old.into_iter().map(|k| (k, None));
        let now = current.into_iter().map(|(k, v)| (k.encode(), v));
        if let Err(e) = write_raw(core, p, tombstones.chain(now)).await {
            tracing::warn!(partition = p, group, error = %e, "rewriting the group's records in Kafka's format failed: retried at the next load");
            return;
        }
    }
    tracing::info!(
        partition = p,
        groups,
        "{OFFSETS_TOPIC}-{p}: records of Weir's first layout rewritten in Kafka's format"
    );
}

/// Applies one replayed record (latest wins; a null value deletes); returns
/// whether it was written in Weir's first layout.
fn apply(core: &Core, key: Option<&[u8]>, value: Option<&[u8]>, p: u32) -> bool {
    let Some(key) = key else {
        tracing::warn!(
            partition = p,
            "record without key in {OFFSETS_TOPIC}: skipped"
        );
        return false;
    };
    let record = match records::decode_record(key, value) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(partition = p, error = %e, "skipped");
            return false;
        }
    };
    let value = record.value;
    match record.key {
        RecordKey::Offset {
            group,
            topic,
            partition,
        } => {
            let v = value.and_then(|v| match v {
                Value::Offset(v) => Some(v),
                _ => None,
            });
            core.groups.replay_offset(group, (topic, partition), v);
        }
        RecordKey::Group { group } => {
            let v = value.and_then(|v| match v {
                Value::Group(v) => Some(v),
                _ => None,
            });
            core.groups.replay_group(group, v);
        }
        RecordKey::Member { group, member } => {
            let v = value.and_then(|v| match v {
                Value::Member(v) => Some(*v),
                _ => None,
            });
            core.groups.replay_member(group, member, v);
        }
        RecordKey::Classic { group } => {
            let v = value.and_then(|v| match v {
                Value::Classic(v) => Some(v),
                _ => None,
            });
            let config = config(core);
            core.groups.replay_classic(group, v, config);
        }
    }
    record.legacy
}

/// Configs of `__consumer_offsets`: compacted (the latest record per key
/// is kept; tombstones delete), no time or size retention, segments of
/// `--offsets-segment-bytes` (100 MiB).
pub fn offsets_topic_configs(segment_bytes: u64) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("cleanup.policy".to_string(), "compact".to_string()),
        ("retention.ms".to_string(), "-1".to_string()),
        ("segment.bytes".to_string(), segment_bytes.to_string()),
    ])
}

/// How many replicas `__consumer_offsets` gets: the configured factor,
/// at most the live nodes. A new cluster's nodes start together: this
/// waits (up to 10 s) for the initial voters to register first, so the
/// topic is not created with fewer replicas than it could have.
async fn offsets_replicas(core: &Core) -> u32 {
    let want = core.shared.config.offsets_replication_factor;
    let voters = core.shared.config.cluster.voters.len().max(1) as u32;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut watch = core.shared.controller.watch();
    loop {
        let live = {
            let state = watch.borrow_and_update().clone();
            state.nodes.keys().filter(|n| state.is_live(**n)).count() as u32
        };
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if live >= want.min(voters) || left.is_zero() {
            return want.min(live.max(1));
        }
        // The next metadata version (a registration), or the deadline.
        futures_lite::future::or(
            async {
                let _ = watch.changed().await;
            },
            glommio::timer::sleep(left),
        )
        .await;
    }
}

/// Creates `__consumer_offsets` if it does not exist, or gives an existing
/// one the configs this build and the flags ask for (core 0, start-up).
pub async fn ensure_offsets_topic(core: &Rc<Core>) -> anyhow::Result<()> {
    let existing = core.metadata().get(OFFSETS_TOPIC).cloned();
    let configs = offsets_topic_configs(core.shared.config.offsets_segment_bytes);
    let change = match existing {
        None => {
            let mut spec = TopicSpec::new(core.shared.config.offsets_partitions, configs);
            spec.replication_factor = offsets_replicas(core).await;
            Change::Create(OFFSETS_TOPIC.to_string(), spec)
        }
        Some(t) if configs.iter().any(|(k, v)| t.configs.get(k) != Some(v)) => {
            Change::Alter(OFFSETS_TOPIC.to_string(), ConfigOp::sets(configs))
        }
        Some(_) => return Ok(()),
    };
    match writer::submit(core, change).await {
        // Another node of the cluster created it first.
        Ok(_) | Err(crate::metadata::TopicError::Exists(_)) => Ok(()),
        Err(e) => Err(anyhow::anyhow!("setting up {OFFSETS_TOPIC}: {e}")),
    }
}

/// Stores what the last step of a group changed (member records or their
/// tombstones, the group record, a classic group's state) and waits until
/// it is durable; wakes the group's held heartbeats. Called with the
/// group's lock held.
pub(crate) async fn persist(core: &Rc<Core>, name: &str) -> Result<(), Refusal> {
    let records: Vec<(RecordKey, Option<Bytes>)> = {
        let mut groups = core.groups.groups.borrow_mut();
        let Some(g) = groups.get_mut(name) else {
            return Ok(());
        };
        let dirty = g.consumer.take_dirty();
        let classic_dirty = g.classic.as_mut().is_some_and(|c| c.take_dirty());
        let dropped = std::mem::take(&mut g.classic_dropped);
        if dirty.is_empty() && !classic_dirty && !dropped {
            return Ok(());
        }
        g.wake_all();
        let c = &g.consumer;
        let mut records: Vec<(RecordKey, Option<Bytes>)> = Vec::new();
        if dirty.group {
            let value = GroupValue {
                group_epoch: c.group_epoch,
                assignment_epoch: c.assignment_epoch,
                assignor: c.assignor.clone(),
            };
            let key = RecordKey::Group {
                group: name.to_string(),
            };
            records.push((key, Some(value.encode())));
        }
        for id in dirty.members {
            let value = c.members.get(&id).map(records::encode_member);
            let key = RecordKey::Member {
                group: name.to_string(),
                member: id,
            };
            records.push((key, value));
        }
        if classic_dirty || dropped {
            let key = RecordKey::Classic {
                group: name.to_string(),
            };
            records.push((
                key,
                g.classic
                    .as_ref()
                    .map(|c| records::encode_classic(&c.snapshot())),
            ));
        }
        records
    };
    write_records(core, name, records).await.map_err(|e| {
        let (code, message) = e.wire();
        Refusal(code, message)
    })
}

/// The classic state machine's settings from the broker's.
pub fn config(core: &Core) -> crate::groups::classic::Config {
    crate::groups::classic::Config {
        initial_rebalance_delay_ms: core.shared.config.group_initial_rebalance_delay_ms,
        ..crate::groups::classic::Config::default()
    }
}
