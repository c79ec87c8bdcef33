//! The coordinator runtime: hosts state machines that keep their state in
//! an internal compacted topic, one instance per partition of it, on the
//! core leading that partition (Kafka 4's group coordinator runs on the
//! same kind of runtime). The consumer groups are its first machine
//! (`__consumer_offsets`, [`crate::groups`]); the transaction coordinator
//! (`__transaction_state`) and share partitions' state
//! (`__share_group_state`) are machines on it too.
//!
//! What the runtime does for every machine, so that no machine does it
//! itself:
//! - **Topic:** core 0 creates the machine's internal topic at start-up
//!   (or gives an existing one the configs this build asks for), with as
//!   many replicas as the cluster has live nodes, up to the wanted factor
//!   (`ensure_topic`); an on-demand machine's topic is created when it
//!   first writes ([`create_on_demand`]).
//! - **Placement:** a key (a group id, a transactional id) belongs to
//!   partition `crc32c(key) % partitions` of the topic ([`partition_of`]);
//!   the core leading that partition hosts it. (Kafka hashes with Java's
//!   `String.hashCode`; clients never compute it — they ask
//!   FindCoordinator — and Weir's data directories already place groups
//!   by crc32c.)
//! - **Replay:** at start-up each core replays the durable records of the
//!   partitions it leads ([`start`]); a core that starts leading a
//!   partition later (failover, reassignment) replays it then and answers
//!   its keys `Recovering` meanwhile; one that stops leading forgets the
//!   partition's state ([`leaderships`]). Only what is durable is
//!   replayed: a record written but not yet fdatasync'd was never answered.
//! - **Writes:** a machine's change is appended to its partition as one
//!   batch and answered only once durable — fdatasync'd here and, for a
//!   replicated topic, by its ISR ([`write`]; [`append`] gives the
//!   appended and the durable moments apart).
//!
//! A machine is the state and what acts on it: it implements [`Machine`]
//! (replay a record, forget a partition, start serving one) and is listed
//! in [`machines`]. Its requests reach its core through the service (the
//! mesh carries them); it serializes its own changes per key.

pub mod hosting;

use std::collections::BTreeMap;
use std::rc::Rc;

use bytes::Bytes;
use weir_proto::batch::Compression;
use weir_proto::builder::BatchBuilder;
use weir_proto::reader::RecordBatch;
use weir_proto::record::RecordData;

use crate::error::{BrokerError, StorageFailure};
use crate::metadata::writer;
use crate::metadata::{Change, ConfigOp, TopicSpec};
use crate::replica::Leadership;
use crate::shard::partition::{self, ack_waits, all_acked};
use crate::shard::Core;
pub use hosting::Hosting;

/// Bytes of an internal topic read at a time when replaying.
pub const REPLAY_READ_BYTES: u64 = 1 << 20;

/// A state machine hosted by the runtime: its state lives in the
/// partitions of one internal compacted topic.
pub trait Machine {
    /// Its internal topic.
    fn topic(&self) -> &'static str;

    /// What the runtime keeps for it on this core.
    fn hosting(&self) -> &Hosting;

    /// How its topic is created: partitions, configs, wanted replicas.
    fn topic_plan(&self, core: &Core) -> TopicPlan;

    /// Drops the state of partition `p` (of `n`): this core stopped
    /// leading it, or is about to replay it.
    fn forget(&self, p: u32, n: u32);

    /// Applies one durable record of partition `p`, oldest first (the
    /// latest record of a key wins; a null value deletes).
    fn replay(&self, core: &Core, p: u32, key: Option<&[u8]>, value: Option<&[u8]>);

    /// A durable record of producer `producer_id`'s transaction (Kafka's
    /// offsets committed in a transaction): pending until its marker
    /// ([`Machine::replay_marker`]). By default, applied as any record.
    fn replay_transactional(
        &self,
        core: &Core,
        p: u32,
        producer_id: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) {
        let _ = producer_id;
        self.replay(core, p, key, value);
    }

    /// Producer `producer_id`'s transaction ended in partition `p`
    /// (its marker, durable): commit or abort what it wrote there.
    fn replay_marker(&self, core: &Core, p: u32, producer_id: i64, commit: bool) {
        let _ = (core, p, producer_id, commit);
    }

    /// Partition `p` (of `n`; `None`: every partition this core leads, at
    /// start-up) is replayed: what it held is served from now.
    fn replayed(&self, core: &Rc<Core>, p: Option<(u32, u32)>);

    /// This core's replay at start-up is done: start the machine's own
    /// work (timers, expiry).
    fn started(&self, core: &Rc<Core>);

    /// Its topic is created when the machine first writes
    /// ([`create_on_demand`]), not at start-up: a cluster that never
    /// uses the machine pays nothing for it (Kafka creates its internal
    /// topics on demand too).
    fn on_demand(&self) -> bool {
        false
    }
}

/// The machines of a core. A new machine is added here (and its state to
/// [`Core`]).
pub fn machines(core: &Core) -> [&dyn Machine; 3] {
    [&core.groups, &core.txns, &core.shares.states]
}

/// The machine keeping its state in `topic`, if any.
pub fn machine_of<'a>(core: &'a Core, topic: &str) -> Option<&'a dyn Machine> {
    machines(core).into_iter().find(|m| m.topic() == topic)
}

/// How a machine's internal topic is created.
#[derive(Debug, Clone)]
pub struct TopicPlan {
    /// Partitions of a new topic.
    pub partitions: u32,
    /// Its configs (set on an existing topic too).
    pub configs: BTreeMap<String, String>,
    /// Replicas wanted (at most the live nodes get them).
    pub replication_factor: u32,
}

impl TopicPlan {
    /// A compacted topic kept forever (the latest record of each key is
    /// the state), with the replicas `__consumer_offsets` is given.
    pub fn compacted(core: &Core, partitions: u32) -> TopicPlan {
        TopicPlan {
            partitions,
            configs: BTreeMap::from([
                ("cleanup.policy".to_string(), "compact".to_string()),
                ("retention.ms".to_string(), "-1".to_string()),
            ]),
            replication_factor: core.shared.config.offsets_replication_factor,
        }
    }
}

/// The partition of `key` among `partitions` (`crc32c(key) % partitions`).
pub fn place(key: &str, partitions: u32) -> u32 {
    weir_groups::records::partition_for(key, partitions)
}

/// The partition of `topic` that `key` belongs to; `None` while the topic
/// does not exist.
pub fn partition_of(core: &Core, topic: &str, key: &str) -> Option<u32> {
    let n = core.metadata().get(topic).map(|t| t.partitions())?;
    Some(place(key, n))
}

/// Core 0, at start-up: creates every machine's topic; then every core
/// replays the partitions it leads and starts its machines.
pub async fn start(core: &Rc<Core>) -> Result<(), BrokerError> {
    if core.id == 0 {
        for m in machines(core) {
            if m.on_demand() && core.metadata().get(m.topic()).is_none() {
                continue;
            }
            let plan = m.topic_plan(core);
            ensure_topic(core, m.topic(), plan).await?;
        }
    }
    for m in machines(core) {
        load(core, m).await?;
    }
    for m in machines(core) {
        m.started(core);
    }
    Ok(())
}

/// Replays every partition of `m`'s topic this core leads (start-up).
async fn load(core: &Rc<Core>, m: &dyn Machine) -> Result<(), BrokerError> {
    let topic = m.topic();
    let n = core.metadata().get(topic).map_or(0, |t| t.partitions());
    let mut records = 0u64;
    for p in 0..n {
        // Only partitions this core leads: a follower's replica is
        // replayed if it becomes the leader ([`leaderships`]).
        if !core.locate(topic, p).is_ok_and(|c| c == core.id) {
            continue;
        }
        records += replay(core, m, p).await?;
    }
    if records > 0 {
        tracing::info!(core = core.id, records, "{topic} replayed");
    }
    m.replayed(core, None);
    m.hosting().set_loaded();
    Ok(())
}

/// What the replicas on this core did when it applied a metadata view:
/// a partition of a machine's topic this core started leading is replayed
/// (its keys are answered `Recovering` until then), one it stopped leading
/// is forgotten. Before the start-up replay is done there is nothing to
/// move: that replay reads what this core leads then.
pub fn leaderships(core: &Rc<Core>, changes: &[Leadership]) {
    for change in changes {
        let Some(m) = machine_of(core, &change.topic) else {
            continue;
        };
        if !m.hosting().loaded() {
            continue;
        }
        let (p, n) = (change.partition, change.partitions);
        if change.leads {
            m.hosting().set_loading(p, true);
            let (core, topic) = (core.clone(), m.topic());
            glommio::spawn_local(async move { replay_led(&core, topic, p, n).await }).detach();
        } else if change.was_leader {
            m.forget(p, n);
            m.hosting().set_loading(p, false);
        }
    }
}

/// Replays partition `p` of `topic` again (its machine's state ran ahead
/// of the log: a write failed): answered `Recovering` meanwhile.
pub fn reload(core: &Rc<Core>, topic: &'static str, p: u32) {
    let Some(m) = machine_of(core, topic) else {
        return;
    };
    let n = core.metadata().get(topic).map_or(0, |t| t.partitions());
    m.hosting().set_loading(p, true);
    let core = core.clone();
    glommio::spawn_local(async move { replay_led(&core, topic, p, n).await }).detach();
}

/// This core became the leader of partition `p` of a machine's topic:
/// replays it, served from then on.
async fn replay_led(core: &Rc<Core>, topic: &'static str, p: u32, n: u32) {
    let Some(m) = machine_of(core, topic) else {
        return;
    };
    m.forget(p, n);
    match replay(core, m, p).await {
        Ok(records) => tracing::info!(partition = p, records, "now serving {topic}-{p}"),
        Err(e) => tracing::error!(partition = p, error = %e, "replaying {topic}-{p} failed"),
    }
    m.replayed(core, Some((p, n)));
    m.hosting().set_loading(p, false);
}

/// Feeds partition `p`'s durable records to `m`; returns how many.
async fn replay(core: &Rc<Core>, m: &dyn Machine, p: u32) -> Result<u64, BrokerError> {
    let topic = m.topic();
    let Some(log) = core.log(topic, p) else {
        return Ok(0);
    };
    let corrupt = |e: &dyn std::fmt::Display, at: u64| BrokerError::Storage {
        kind: StorageFailure::Corrupt,
        message: format!("replaying {topic}-{p} at {at}: {e}"),
    };
    let mut records = 0u64;
    let mut at = log.log_start_offset();
    // Only what is durable: a record written but not fdatasync'd was
    // never answered.
    let end = log.durable_offset();
    while at < end {
        let r = log
            .read(at, REPLAY_READ_BYTES)
            .await
            .map_err(|e| BrokerError::Storage {
                kind: StorageFailure::Io,
                message: format!("replaying {topic}-{p} at {at}: {e}"),
            })?;
        let before = at;
        for b in &r.batches {
            let rb = RecordBatch::parse(b).map_err(|e| corrupt(&e, at))?;
            let last = rb.header().last_offset() as u64;
            let h = rb.header();
            if h.attributes.is_control() {
                // A transaction marker (in `__consumer_offsets`).
                if let Ok(marker) = weir_storage::txn::marker_of(b) {
                    let commit = marker.kind == weir_storage::txn::MarkerKind::Commit;
                    m.replay_marker(core, p, h.producer_id, commit);
                }
                at = at.max(last + 1);
                continue;
            }
            let txn = h.attributes.is_transactional().then_some(h.producer_id);
            let decoded = rb.records().map_err(|e| corrupt(&e, at))?;
            for rec in decoded.iter() {
                let rec = rec.map_err(|e| corrupt(&e, at))?;
                if (rec.offset as u64) < at {
                    continue;
                }
                records += 1;
                match txn {
                    None => m.replay(core, p, rec.record.key, rec.record.value),
                    Some(pid) => {
                        m.replay_transactional(core, p, pid, rec.record.key, rec.record.value)
                    }
                }
            }
            at = at.max(last + 1);
        }
        if at == before {
            break;
        }
    }
    Ok(records)
}

/// Appends records (encoded keys, values or tombstones) to partition `p`
/// of `topic` on this core as one batch, and waits until it is durable:
/// fdatasync'd here and, for a replicated topic, by its ISR. What a
/// machine answers after this is stored.
pub async fn write(
    core: &Rc<Core>,
    topic: &str,
    p: u32,
    records: impl Iterator<Item = (Bytes, Option<Bytes>)>,
) -> Result<(), BrokerError> {
    append(core, topic, p, records).await?.await
}

/// [`write`] in two steps: returns once the batch is appended to the
/// partition's log (after every batch appended before it), with the
/// future that resolves once it is durable. Durability follows the log's
/// order: a batch appended later is never durable without this one.
pub async fn append(
    core: &Rc<Core>,
    topic: &str,
    p: u32,
    records: impl Iterator<Item = (Bytes, Option<Bytes>)>,
) -> Result<impl std::future::Future<Output = Result<(), BrokerError>>, BrokerError> {
    let batch = batch_of(core, topic, records, None)?;
    let (log, infos) = partition::append_local(core, topic, p, batch, -1).await?;
    let waits = ack_waits(core, topic, p, log, infos, -1);
    Ok(async move { all_acked(waits).await.map(|_| ()) })
}

/// [`write`] as part of producer (id, epoch)'s transaction (Kafka's
/// offsets committed in a transaction): a transactional batch of that
/// producer, without a sequence; it becomes visible when the
/// transaction's marker commits it.
pub async fn write_transactional(
    core: &Rc<Core>,
    topic: &str,
    p: u32,
    records: impl Iterator<Item = (Bytes, Option<Bytes>)>,
    producer: (i64, i16),
) -> Result<(), BrokerError> {
    let batch = batch_of(core, topic, records, Some(producer))?;
    partition::append_unsequenced_local(core, topic, p, batch).await
}

/// One uncompressed batch of `records`, a producer's transactional one
/// if `producer` is given.
fn batch_of(
    core: &Core,
    topic: &str,
    records: impl Iterator<Item = (Bytes, Option<Bytes>)>,
    producer: Option<(i64, i16)>,
) -> Result<Bytes, BrokerError> {
    let encoding = |e: weir_proto::batch::BatchError| BrokerError::Storage {
        kind: StorageFailure::Io,
        message: format!("encoding {topic} records: {e}"),
    };
    let mut b = BatchBuilder::new(Compression::None).map_err(encoding)?;
    if let Some((id, epoch)) = producer {
        (b.producer_id, b.producer_epoch, b.transactional) = (id, epoch, true);
    }
    let ts = core.storage.now_ms();
    for (key, value) in records {
        b.push(&RecordData {
            key: Some(key),
            value,
            headers: Vec::new(),
            timestamp: ts,
        })
        .map_err(encoding)?;
    }
    Ok(b.build().map_err(encoding)?.freeze())
}

/// How many replicas a new internal topic gets: the wanted factor, at most
/// the live nodes. A new cluster's nodes start together: this waits (up to
/// 10 s) for the initial voters to register first, so the topic is not
/// created with fewer replicas than it could have.
async fn replicas(core: &Core, want: u32) -> u32 {
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

/// Creates `topic` if it does not exist, or gives an existing one the
/// configs `plan` asks for (core 0, start-up).
/// Creates the topic of an on-demand machine ([`Machine::on_demand`]) if
/// it does not exist yet (from any core: the metadata writer takes the
/// change). Its partitions are then led, replayed (empty) and served as
/// any that a core starts leading ([`leaderships`]).
pub async fn create_on_demand(core: &Rc<Core>, m: &dyn Machine) -> Result<(), BrokerError> {
    if core.metadata().get(m.topic()).is_some() {
        return Ok(());
    }
    let plan = m.topic_plan(core);
    ensure_topic(core, m.topic(), plan).await
}

async fn ensure_topic(core: &Rc<Core>, topic: &str, plan: TopicPlan) -> Result<(), BrokerError> {
    let existing = core.metadata().get(topic).cloned();
    let change = match existing {
        None => {
            let mut spec = TopicSpec::new(plan.partitions, plan.configs);
            spec.replication_factor = replicas(core, plan.replication_factor).await;
            Change::Create(topic.to_string(), spec)
        }
        Some(t)
            if plan
                .configs
                .iter()
                .any(|(k, v)| t.configs.get(k) != Some(v)) =>
        {
            Change::Alter(topic.to_string(), ConfigOp::sets(plan.configs))
        }
        Some(_) => return Ok(()),
    };
    match writer::submit(core, change).await {
        // Another node of the cluster created it first.
        Ok(_) | Err(crate::metadata::TopicError::Exists(_)) => Ok(()),
        Err(e) => Err(BrokerError::Storage {
            kind: StorageFailure::Io,
            message: format!("setting up {topic}: {e}"),
        }),
    }
}
