//! The metadata: the versioned view of the cluster every core reads —
//! which topics exist (each with a stable id), their configs, and which
//! core owns each partition (its *placement*, recorded here, not computed).
//!
//! **One writer.** Every change (create, delete, alter, add partitions)
//! goes through [`writer`] on core 0: applied to the current view in
//! arrival order, given the next version number, stored durably in
//! `<data_dir>/topics.toml` (written to a temporary file, fsync'd, renamed,
//! directory fsync'd — on glommio's blocking-thread pool, not the core's
//! loop), then applied on every core, and only then acknowledged. A change
//! that fails on any core is an error to its client. Cores apply views in
//! version order and ignore an older one.
//!
//! **Placement.** A new partition is placed on core
//! `(crc32c(topic) + p) % cores` (the rule of earlier versions, so
//! existing data directories keep their layout); the placement is then part
//! of the view, so a controller can later move it. A restart with fewer
//! cores re-places the partitions of cores that are gone.
//!
//! `topics.toml` of earlier versions (no version, no placement, no ids) is
//! read and rewritten in this format at the first start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

pub mod writer;

/// A change waiting for the writer, and where its outcome goes.
pub(crate) struct Job {
    pub(crate) change: Change,
    pub(crate) done: glommio::channels::local_channel::LocalSender<Result<u64, TopicError>>,
}

/// The writer's queue (held by core 0; the writer is `writer.rs`).
pub struct Writer {
    pub(crate) queue: std::rc::Rc<glommio::channels::local_channel::LocalSender<Job>>,
}

/// A topic change (what the metadata writer is asked for; carried
/// between cores by the mesh).
#[derive(Debug, Clone)]
pub enum Change {
    /// Create a topic.
    Create(String, TopicSpec),
    /// Delete a topic.
    Delete(String),
    /// Change configs, in order.
    Alter(String, Vec<ConfigOp>),
    /// Raise the partition count to this total.
    AddPartitions(String, u32),
    /// Move a partition to replicas on these nodes, the preferred leader
    /// first (a node already holding one keeps its core; a new one takes
    /// its least loaded core).
    Reassign {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Node ids.
        nodes: Vec<u64>,
    },
}
use weir_storage::LogConfig;

/// File name of the registry in the data directory.
pub const REGISTRY_FILE: &str = "topics.toml";
/// The internal topic of the groups' records (defined with its format).
pub use weir_groups::records::OFFSETS_TOPIC;
/// The internal topic of the transaction coordinator's records.
pub const TXN_TOPIC: &str = "__transaction_state";
/// The internal topic of share partitions' durable state (KIP-932).
pub const SHARE_STATE_TOPIC: &str = "__share_group_state";
/// The internal topics: the coordinator runtime's machines write them
/// (clients do not; they are left out of topic listings unless asked for).
pub const INTERNAL_TOPICS: [&str; 3] = [OFFSETS_TOPIC, TXN_TOPIC, SHARE_STATE_TOPIC];

/// Whether `topic` is internal (see [`INTERNAL_TOPICS`]).
pub fn is_internal(topic: &str) -> bool {
    INTERNAL_TOPICS.contains(&topic)
}
/// Longest topic name (Kafka's limit).
pub const TOPIC_NAME_BYTES_MAX: usize = 249;
/// Most partitions of one topic.
pub const PARTITIONS_MAX: u32 = 10_000;

/// One topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSpec {
    /// Number of partitions.
    pub partitions: u32,
    /// Topic configs by Kafka name (only those set explicitly).
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
    /// Replicas of each partition (on distinct nodes).
    #[serde(default = "one")]
    pub replication_factor: u32,
}

fn one() -> u32 {
    1
}

impl TopicSpec {
    /// `partitions` partitions of one replica each, with `configs`.
    pub fn new(partitions: u32, configs: BTreeMap<String, String>) -> TopicSpec {
        TopicSpec {
            partitions,
            configs,
            replication_factor: 1,
        }
    }
}

/// Why a topic operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// Bad name.
    #[error("invalid topic name `{0}`: use 1 to 249 of [a-zA-Z0-9._-], not `.` or `..`")]
    InvalidName(String),
    /// Exists already.
    #[error("topic `{0}` already exists")]
    Exists(String),
    /// Does not exist.
    #[error("unknown topic `{0}`")]
    Unknown(String),
    /// Bad partition count.
    #[error("invalid partition count {count} for `{topic}`: {reason}")]
    Partitions {
        /// Topic.
        topic: String,
        /// Requested count.
        count: u32,
        /// Why.
        reason: String,
    },
    /// A replication factor the cluster cannot place.
    #[error("invalid replication factor for `{topic}`: {reason}")]
    ReplicationFactor {
        /// Topic.
        topic: String,
        /// Why.
        reason: String,
    },
    /// Bad config.
    #[error("{0}")]
    Config(String),
    /// The change could not be stored, or not applied on every core.
    #[error("{0}")]
    NotApplied(String),
    /// A reassignment the cluster cannot make.
    #[error("invalid reassignment: {0}")]
    Reassignment(String),
}

/// Checks a topic name like Kafka does.
pub fn validate_name(name: &str) -> Result<(), TopicError> {
    let ok = !name.is_empty()
        && name.len() <= TOPIC_NAME_BYTES_MAX
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(TopicError::InvalidName(name.to_string()))
    }
}

/// The storage configuration of a topic with these configs.
pub fn log_config(configs: &BTreeMap<String, String>) -> Result<LogConfig, TopicError> {
    let mut c = LogConfig::default();
    for (k, v) in configs {
        c.set(k, v).map_err(|e| TopicError::Config(e.to_string()))?;
    }
    c.validate()
        .map_err(|e| TopicError::Config(e.to_string()))?;
    Ok(c)
}

/// Topic configs whose value is a comma-separated list (Kafka's LIST type):
/// the only ones APPEND and SUBTRACT apply to.
pub const LIST_CONFIGS: &[&str] = &["cleanup.policy"];

/// One change to a topic's configs (Kafka's IncrementalAlterConfigs
/// operations; the native AlterConfigs sets only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigOp {
    /// Set the key to the value.
    Set(String, String),
    /// Remove the key: it takes the default again.
    Delete(String),
    /// Add the value's items to a list config (its current value, or the
    /// default), those not in it yet, at the end.
    Append(String, String),
    /// Remove the value's items from a list config.
    Subtract(String, String),
}

impl ConfigOp {
    /// Sets, one per pair.
    pub fn sets(pairs: impl IntoIterator<Item = (String, String)>) -> Vec<ConfigOp> {
        pairs
            .into_iter()
            .map(|(k, v)| ConfigOp::Set(k, v))
            .collect()
    }

    /// `configs` after `ops`, in order, validated as a whole.
    fn apply_all(
        configs: &BTreeMap<String, String>,
        ops: &[ConfigOp],
    ) -> Result<BTreeMap<String, String>, TopicError> {
        let mut next = configs.clone();
        for op in ops {
            op.apply(&mut next)?;
        }
        log_config(&next)?;
        Ok(next)
    }

    fn apply(&self, configs: &mut BTreeMap<String, String>) -> Result<(), TopicError> {
        let list_op = |key: &str, value: &str, append: bool| {
            if !LIST_CONFIGS.contains(&key) {
                return Err(TopicError::Config(format!(
                    "config `{key}` is not a list: {} applies to {} only",
                    if append { "APPEND" } else { "SUBTRACT" },
                    LIST_CONFIGS.join(", ")
                )));
            }
            let current = match configs.get(key) {
                Some(v) => v.clone(),
                None => log_config(configs)?.get(key).unwrap_or_default(),
            };
            let mut items: Vec<String> = current
                .split(',')
                .map(str::trim)
                .filter(|i| !i.is_empty())
                .map(str::to_string)
                .collect();
            for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                if append {
                    if !items.iter().any(|i| i == item) {
                        items.push(item.to_string());
                    }
                } else {
                    items.retain(|i| i != item);
                }
            }
            Ok(items.join(","))
        };
        match self {
            ConfigOp::Set(k, v) => {
                configs.insert(k.clone(), v.clone());
            }
            ConfigOp::Delete(k) => {
                configs.remove(k);
            }
            ConfigOp::Append(k, v) => {
                let next = list_op(k, v, true)?;
                configs.insert(k.clone(), next);
            }
            ConfigOp::Subtract(k, v) => {
                let next = list_op(k, v, false)?;
                configs.insert(k.clone(), next);
            }
        }
        Ok(())
    }
}

/// Effective configs of a topic: every key with its value (defaults filled in).
pub fn effective_configs(configs: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let c = log_config(configs).unwrap_or_default();
    weir_storage::config::KEYS
        .iter()
        .map(|k| (k.to_string(), c.get(k).unwrap_or_default()))
        .collect()
}

/// The placement rule for new partitions: topics spread by a hash of
/// their name, partitions round-robin from there.
pub fn initial_core(topic: &str, partition: u32, cores: usize) -> u32 {
    ((crc32c::crc32c(topic.as_bytes()) as usize + partition as usize) % cores.max(1)) as u32
}

/// The directory of a partition's log.
pub fn partition_dir(data_dir: &Path, topic: &str, partition: u32) -> PathBuf {
    data_dir.join(format!("{topic}-{partition}"))
}

/// A stable 128-bit topic id, shown as a UUID (version 4 layout). Unique
/// per creation: a topic deleted and created again gets a new one.
pub fn new_topic_id(name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let a = u64::from(crc32c::crc32c(name.as_bytes())) << 32 | u64::from(std::process::id());
    let mix = |x: u64| {
        // splitmix64
        let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let hi = mix(now ^ a);
    let lo = mix(hi ^ seq ^ now.rotate_left(17));
    let hi = (hi & !0xF000) | 0x4000;
    let lo = (lo & !(0xC << 60)) | (0x8 << 60);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    )
}

/// In [`TopicMeta::cores`]: the partition lives on another node.
pub const REMOTE: u32 = u32::MAX;

/// One topic in the view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMeta {
    /// Stable id (a UUID).
    pub id: String,
    /// The owner core of each partition on this node, by partition number
    /// ([`REMOTE`]: on another node).
    pub cores: Vec<u32>,
    /// Topic configs by Kafka name (only those set explicitly).
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
    /// The leading node of each partition (0: none live), from the
    /// cluster metadata; empty in views not built from it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaders: Vec<u64>,
    /// Each partition's replicas, leader epoch and ISR, from the cluster
    /// metadata; empty in views not built from it.
    #[serde(skip)]
    pub placement: Vec<Placement>,
}

/// One partition's replication as the cluster metadata has it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// Replicas: (node, core), the preferred leader first.
    pub replicas: Vec<(u64, u32)>,
    /// Leader epoch.
    pub leader_epoch: u32,
    /// In-sync replicas.
    pub isr: Vec<u64>,
}

impl TopicMeta {
    /// Number of partitions.
    pub fn partitions(&self) -> u32 {
        self.cores.len() as u32
    }

    /// The core holding this node's replica of `partition` if node `me`
    /// leads it (or the view names no leaders: a view not built from the
    /// cluster metadata).
    pub fn leading_core(&self, partition: u32, me: u64) -> Option<usize> {
        let leader = self.leaders.get(partition as usize).copied();
        self.core_of(partition)
            .filter(|_| leader.is_none_or(|l| l == me))
    }

    /// The core holding this node's replica of `partition` (leader or
    /// follower), if it has one.
    pub fn core_of(&self, partition: u32) -> Option<usize> {
        self.cores
            .get(partition as usize)
            .filter(|&&c| c != REMOTE)
            .map(|&c| c as usize)
    }
}

/// The view node `node` (with `cores` cores) serves, from the cluster
/// metadata: every topic, each partition placed on the core its replica
/// on this node names (folded into `cores` if the node has fewer now), or
/// [`REMOTE`].
pub fn view_for(state: &weir_replication::ClusterState, node: u64, cores: usize) -> MetadataView {
    let topics = state
        .topics
        .iter()
        .map(|(name, t)| {
            let placed = t
                .partitions
                .iter()
                .map(|p| {
                    p.replicas
                        .iter()
                        .find(|r| r.node == node)
                        .map_or(REMOTE, |r| r.core % cores.max(1) as u32)
                })
                .collect();
            let leaders = t.partitions.iter().map(|p| p.leader.unwrap_or(0)).collect();
            let placement = t
                .partitions
                .iter()
                .map(|p| Placement {
                    replicas: p.replicas.iter().map(|r| (r.node, r.core)).collect(),
                    leader_epoch: p.leader_epoch,
                    isr: p.isr.clone(),
                })
                .collect();
            (
                name.clone(),
                TopicMeta {
                    id: uuid::Uuid::from_bytes(t.id).to_string(),
                    cores: placed,
                    configs: t.configs.clone(),
                    leaders,
                    placement,
                },
            )
        })
        .collect();
    MetadataView {
        version: state.version,
        topics,
    }
}

/// A topic id as the cluster metadata stores it (a view's id is its
/// UUID text; an unparsable one, from a hand-edited file, is hashed).
pub fn id_bytes(id: &str) -> [u8; 16] {
    match uuid::Uuid::parse_str(id) {
        Ok(u) => *u.as_bytes(),
        Err(_) => {
            let mut out = [0u8; 16];
            for (i, chunk) in out.chunks_mut(4).enumerate() {
                let seed = crc32c::crc32c(&[i as u8]);
                chunk.copy_from_slice(&crc32c::crc32c_append(seed, id.as_bytes()).to_le_bytes());
            }
            out
        }
    }
}

/// The versioned view: every topic with its placement.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataView {
    /// Raised by one with every change; never reused.
    pub version: u64,
    #[serde(default)]
    topics: BTreeMap<String, TopicMeta>,
}

/// `topics.toml` as earlier versions wrote it (no version, no placement).
#[derive(Debug, Default, Deserialize)]
struct AnyFile {
    #[serde(default)]
    version: Option<u64>,
    #[serde(default)]
    topics: BTreeMap<String, AnyTopic>,
}

#[derive(Debug, Deserialize)]
struct AnyTopic {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    cores: Option<Vec<u32>>,
    #[serde(default)]
    partitions: Option<u32>,
    #[serde(default)]
    configs: BTreeMap<String, String>,
}

impl MetadataView {
    /// Loads `<data_dir>/topics.toml` (empty at version 0 if absent) for a
    /// broker of `cores` cores. Returns whether the view was changed while
    /// loading (migrated from the old format, or partitions re-placed
    /// because their core is gone): it must then be stored again.
    pub fn load(data_dir: &Path, cores: usize) -> anyhow::Result<(MetadataView, bool)> {
        let path = data_dir.join(REGISTRY_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((MetadataView::default(), false))
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let f: AnyFile =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let mut changed = f.version.is_none();
        let mut topics = BTreeMap::new();
        for (name, t) in f.topics {
            let mut placed = match (t.cores, t.partitions) {
                (Some(c), _) => c,
                (None, Some(n)) => {
                    changed = true;
                    (0..n).map(|p| initial_core(&name, p, cores)).collect()
                }
                (None, None) => anyhow::bail!(
                    "{}: topic `{name}` has neither `cores` nor `partitions`",
                    path.display()
                ),
            };
            for (p, c) in placed.iter_mut().enumerate() {
                if *c as usize >= cores {
                    let to = initial_core(&name, p as u32, cores);
                    tracing::warn!(topic = %name, partition = p, from = *c, to, "core gone: partition re-placed");
                    *c = to;
                    changed = true;
                }
            }
            let id = t.id.unwrap_or_else(|| {
                changed = true;
                new_topic_id(&name)
            });
            topics.insert(
                name,
                TopicMeta {
                    id,
                    cores: placed,
                    configs: t.configs,
                    leaders: Vec::new(),
                    placement: Vec::new(),
                },
            );
        }
        let mut view = MetadataView {
            version: f.version.unwrap_or(0),
            topics,
        };
        if changed {
            view.version += 1;
        }
        Ok((view, changed))
    }

    /// The file's contents.
    pub fn encode(&self) -> anyhow::Result<String> {
        toml::to_string(self).context("encoding the metadata")
    }

    /// Stores it atomically and durably (blocking: call from a blocking
    /// thread, or at start-up).
    pub fn store(&self, data_dir: &Path) -> anyhow::Result<()> {
        let text = self.encode()?;
        weir_storage::checkpoint::write_atomic(data_dir, REGISTRY_FILE, text.as_bytes())
            .context("writing the metadata (topics.toml)")?;
        Ok(())
    }

    /// The topics.
    pub fn topics(&self) -> &BTreeMap<String, TopicMeta> {
        &self.topics
    }

    /// One topic.
    pub fn get(&self, name: &str) -> Option<&TopicMeta> {
        self.topics.get(name)
    }

    /// The core owning a partition, if it exists.
    pub fn owner(&self, topic: &str, partition: u32) -> Option<usize> {
        self.topics.get(topic)?.core_of(partition)
    }

    /// Adds a topic after validating it, placing its partitions over
    /// `cores` cores.
    pub fn create(&mut self, name: &str, spec: TopicSpec, cores: usize) -> Result<(), TopicError> {
        validate_name(name)?;
        if self.topics.contains_key(name) {
            return Err(TopicError::Exists(name.into()));
        }
        if spec.partitions == 0 || spec.partitions > PARTITIONS_MAX {
            return Err(TopicError::Partitions {
                topic: name.into(),
                count: spec.partitions,
                reason: format!("must be 1 to {PARTITIONS_MAX}"),
            });
        }
        log_config(&spec.configs)?;
        let placed = (0..spec.partitions)
            .map(|p| initial_core(name, p, cores))
            .collect();
        self.topics.insert(
            name.into(),
            TopicMeta {
                id: new_topic_id(name),
                cores: placed,
                configs: spec.configs,
                leaders: Vec::new(),
                placement: Vec::new(),
            },
        );
        Ok(())
    }

    /// Removes a topic.
    pub fn delete(&mut self, name: &str) -> Result<TopicMeta, TopicError> {
        self.topics
            .remove(name)
            .ok_or_else(|| TopicError::Unknown(name.into()))
    }

    /// Changes configs of a topic, in order, against its current configs
    /// (validated as a whole afterwards: all or nothing).
    pub fn alter(&mut self, name: &str, ops: &[ConfigOp]) -> Result<(), TopicError> {
        let t = self
            .topics
            .get_mut(name)
            .ok_or_else(|| TopicError::Unknown(name.into()))?;
        t.configs = ConfigOp::apply_all(&t.configs, ops)?;
        Ok(())
    }

    /// Raises the partition count of a topic; returns the old count.
    pub fn add_partitions(
        &mut self,
        name: &str,
        total: u32,
        cores: usize,
    ) -> Result<u32, TopicError> {
        let t = self
            .topics
            .get_mut(name)
            .ok_or_else(|| TopicError::Unknown(name.into()))?;
        let old = t.partitions();
        if total <= old || total > PARTITIONS_MAX {
            return Err(TopicError::Partitions {
                topic: name.into(),
                count: total,
                reason: format!(
                    "the topic has {old} partitions; the new count must be larger (at most {PARTITIONS_MAX})"
                ),
            });
        }
        t.cores
            .extend((old..total).map(|p| initial_core(name, p, cores)));
        Ok(old)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(partitions: u32) -> TopicSpec {
        TopicSpec::new(partitions, BTreeMap::new())
    }

    #[test]
    fn config_ops_set_delete_append_and_subtract_all_or_nothing() {
        let mut v = MetadataView::default();
        v.create("t", spec(1), 1).unwrap();
        let get = |v: &MetadataView, k: &str| v.get("t").unwrap().configs.get(k).cloned();
        v.alter("t", &[ConfigOp::Set("retention.ms".into(), "1000".into())])
            .unwrap();
        // APPEND to an unset list starts from its default (`delete`).
        v.alter(
            "t",
            &[ConfigOp::Append("cleanup.policy".into(), "compact".into())],
        )
        .unwrap();
        assert_eq!(get(&v, "cleanup.policy").as_deref(), Some("delete,compact"));
        // Appending what is there already changes nothing.
        v.alter(
            "t",
            &[ConfigOp::Append("cleanup.policy".into(), "delete".into())],
        )
        .unwrap();
        assert_eq!(get(&v, "cleanup.policy").as_deref(), Some("delete,compact"));
        v.alter(
            "t",
            &[
                ConfigOp::Subtract("cleanup.policy".into(), "delete".into()),
                ConfigOp::Delete("retention.ms".into()),
            ],
        )
        .unwrap();
        assert_eq!(get(&v, "cleanup.policy").as_deref(), Some("compact"));
        assert_eq!(get(&v, "retention.ms"), None);
        // Not a list: refused, with the reason.
        let e = v
            .alter("t", &[ConfigOp::Append("retention.ms".into(), "5".into())])
            .unwrap_err();
        assert!(e.to_string().contains("not a list"), "{e}");
        // A bad value later in the request leaves the earlier ops undone.
        let before = v.get("t").unwrap().configs.clone();
        v.alter(
            "t",
            &[
                ConfigOp::Set("retention.ms".into(), "7".into()),
                ConfigOp::Subtract("cleanup.policy".into(), "compact".into()),
            ],
        )
        .unwrap_err();
        assert_eq!(v.get("t").unwrap().configs, before);
    }

    #[test]
    fn a_topic_id_survives_the_trip_through_the_cluster_metadata() {
        let id = new_topic_id("t");
        assert_eq!(uuid::Uuid::from_bytes(id_bytes(&id)).to_string(), id);
        // A hand-edited id that is no UUID still maps to one stable id.
        assert_eq!(id_bytes("not-a-uuid"), id_bytes("not-a-uuid"));
        assert_ne!(id_bytes("not-a-uuid"), id_bytes("not-a-uuid2"));
    }

    #[test]
    fn view_round_trips_and_validates() {
        let d = tempfile::tempdir().unwrap();
        let mut v = MetadataView::default();
        let mut configs = BTreeMap::new();
        configs.insert("retention.ms".to_string(), "1000".to_string());
        v.create("orders", TopicSpec::new(4, configs), 2).unwrap();
        assert!(matches!(
            v.create("orders", spec(1), 2),
            Err(TopicError::Exists(_))
        ));
        assert!(v.create("bad name", spec(1), 2).is_err());
        let mut bad = BTreeMap::new();
        bad.insert("segment.bytes".to_string(), "1".to_string());
        assert!(matches!(
            v.create("x", TopicSpec::new(1, bad), 2),
            Err(TopicError::Config(_))
        ));
        v.version = 7;
        v.store(d.path()).unwrap();
        assert_eq!(MetadataView::load(d.path(), 2).unwrap(), (v.clone(), false));
        assert_eq!(v.add_partitions("orders", 6, 2).unwrap(), 4);
        assert!(v.add_partitions("orders", 6, 2).is_err());
        assert_eq!(v.get("orders").unwrap().partitions(), 6);
        assert!(v.get("orders").unwrap().cores.iter().all(|&c| c < 2));
    }

    #[test]
    fn old_registry_files_are_migrated_and_gone_cores_re_placed() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join(REGISTRY_FILE),
            "[topics.orders]\npartitions = 3\n\n[topics.orders.configs]\n\"retention.ms\" = \"5\"\n",
        )
        .unwrap();
        let (v, changed) = MetadataView::load(d.path(), 4).unwrap();
        assert!(changed);
        assert_eq!(v.version, 1);
        let t = v.get("orders").unwrap();
        assert_eq!(
            t.cores,
            (0..3)
                .map(|p| initial_core("orders", p, 4))
                .collect::<Vec<_>>()
        );
        assert_eq!(t.configs.get("retention.ms").map(String::as_str), Some("5"));
        v.store(d.path()).unwrap();
        // Fewer cores: partitions of cores that are gone move, the rest stay.
        let (w, changed) = MetadataView::load(d.path(), 1).unwrap();
        assert!(changed);
        assert_eq!(w.version, 2);
        assert_eq!(w.get("orders").unwrap().cores, vec![0, 0, 0]);
        assert_eq!(w.get("orders").unwrap().id, t.id);
    }

    #[test]
    fn topic_ids_are_uuids_and_unique() {
        let a = new_topic_id("t");
        let b = new_topic_id("t");
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
    }
}
