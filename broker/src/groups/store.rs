//! Where consumer groups are stored: the records of `__consumer_offsets`
//! (compacted), appended by a group's coordinator to its own partition.
//! The groups are a machine of the coordinator runtime
//! ([`crate::coordinator`], see `machine.rs`): it creates the topic,
//! replays the partitions a core leads into its groups (through
//! `apply` here) and writes their records durably.
//!
//! **Which core:** everything here runs on the core that owns the
//! partition concerned (the group's coordinator).

use std::collections::BTreeMap;
use std::rc::Rc;

use bytes::Bytes;

use crate::coordinator;
use crate::error::BrokerError;
use crate::groups::api::Refusal;
use crate::groups::records::{self, GroupValue, RecordKey, Value, OFFSETS_TOPIC};
use crate::shard::Core;

/// Appends records to the group's `__consumer_offsets` partition (on this
/// core) as one batch and waits until it is durable.
pub async fn write_records(
    core: &Rc<Core>,
    group: &str,
    records: Vec<(RecordKey, Option<Bytes>)>,
) -> Result<(), BrokerError> {
    let p = coordinator::partition_of(core, OFFSETS_TOPIC, group).unwrap_or(0);
    let raw = records.into_iter().map(|(k, v)| (k.encode(), v));
    coordinator::write(core, OFFSETS_TOPIC, p, raw).await
}

/// [`write_records`] as part of producer (id, epoch)'s transaction.
pub async fn write_records_transactional(
    core: &Rc<Core>,
    group: &str,
    records: Vec<(RecordKey, Option<Bytes>)>,
    producer: (i64, i16),
) -> Result<(), BrokerError> {
    let p = coordinator::partition_of(core, OFFSETS_TOPIC, group).unwrap_or(0);
    let raw = records.into_iter().map(|(k, v)| (k.encode(), v));
    coordinator::write_transactional(core, OFFSETS_TOPIC, p, raw, producer).await
}

/// Rewrites the groups of partition `p` that have records in Weir's first
/// layout into Kafka's format: per group, under its lock, one batch of
/// tombstones for the old keys (the old offset key is Kafka's legacy
/// offset key, so a Kafka reader sees the offset deleted, then set again
/// by the next record) and the group's current records. In the background
/// after a replay: a failure is logged and the next replay rewrites again
/// (old and new records describe the same state).
pub(crate) async fn rewrite_legacy(core: &Rc<Core>, p: u32, keys: Vec<Bytes>) {
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
        if let Err(e) = coordinator::write(core, OFFSETS_TOPIC, p, tombstones.chain(now)).await {
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
pub(crate) fn apply(core: &Core, key: Option<&[u8]>, value: Option<&[u8]>, p: u32) -> bool {
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
