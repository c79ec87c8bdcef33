//! The topic registry: which topics exist, their partition counts and
//! configs, persisted in `<data_dir>/topics.toml` (replaced atomically), and
//! which core owns each partition.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use weir_storage::LogConfig;

/// File name of the registry in the data directory.
pub const REGISTRY_FILE: &str = "topics.toml";
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
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct RegistryFile {
    #[serde(default)]
    topics: BTreeMap<String, TopicSpec>,
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
    /// Bad config.
    #[error("{0}")]
    Config(String),
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
    Ok(c)
}

/// Effective configs of a topic: every key with its value (defaults filled in).
pub fn effective_configs(configs: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let c = log_config(configs).unwrap_or_default();
    weir_storage::config::KEYS
        .iter()
        .map(|k| (k.to_string(), c.get(k).unwrap_or_default()))
        .collect()
}

/// The core that owns `partition` of `topic` with `cores` cores: topics are
/// spread by a hash of their name, partitions round-robin from there.
pub fn owner_core(topic: &str, partition: u32, cores: usize) -> usize {
    (crc32c::crc32c(topic.as_bytes()) as usize + partition as usize) % cores.max(1)
}

/// The directory of a partition's log.
pub fn partition_dir(data_dir: &Path, topic: &str, partition: u32) -> PathBuf {
    data_dir.join(format!("{topic}-{partition}"))
}

/// All topics, loaded from and stored to the data directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registry {
    topics: BTreeMap<String, TopicSpec>,
}

impl Registry {
    /// Loads `<data_dir>/topics.toml` (empty if absent).
    pub fn load(data_dir: &Path) -> anyhow::Result<Registry> {
        let path = data_dir.join(REGISTRY_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Registry::default()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let f: RegistryFile =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        Ok(Registry { topics: f.topics })
    }

    /// Stores it atomically and durably.
    pub fn store(&self, data_dir: &Path) -> anyhow::Result<()> {
        let text = toml::to_string(&RegistryFile {
            topics: self.topics.clone(),
        })
        .context("encoding the topic registry")?;
        weir_storage::checkpoint::write_atomic(data_dir, REGISTRY_FILE, text.as_bytes())
            .context("writing the topic registry")?;
        Ok(())
    }

    /// The topics.
    pub fn topics(&self) -> &BTreeMap<String, TopicSpec> {
        &self.topics
    }

    /// One topic.
    pub fn get(&self, name: &str) -> Option<&TopicSpec> {
        self.topics.get(name)
    }

    /// Adds a topic after validating it.
    pub fn create(&mut self, name: &str, spec: TopicSpec) -> Result<(), TopicError> {
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
        self.topics.insert(name.into(), spec);
        Ok(())
    }

    /// Removes a topic.
    pub fn delete(&mut self, name: &str) -> Result<TopicSpec, TopicError> {
        self.topics
            .remove(name)
            .ok_or_else(|| TopicError::Unknown(name.into()))
    }

    /// Sets configs of a topic (validated as a whole first).
    pub fn alter(&mut self, name: &str, set: &[(String, String)]) -> Result<(), TopicError> {
        let spec = self
            .topics
            .get_mut(name)
            .ok_or_else(|| TopicError::Unknown(name.into()))?;
        let mut configs = spec.configs.clone();
        for (k, v) in set {
            configs.insert(k.clone(), v.clone());
        }
        log_config(&configs)?;
        spec.configs = configs;
        Ok(())
    }

    /// Raises the partition count of a topic.
    pub fn add_partitions(&mut self, name: &str, total: u32) -> Result<u32, TopicError> {
        let spec = self
            .topics
            .get_mut(name)
            .ok_or_else(|| TopicError::Unknown(name.into()))?;
        if total <= spec.partitions || total > PARTITIONS_MAX {
            return Err(TopicError::Partitions {
                topic: name.into(),
                count: total,
                reason: format!(
                    "the topic has {} partitions; the new count must be larger (at most {PARTITIONS_MAX})",
                    spec.partitions
                ),
            });
        }
        let old = spec.partitions;
        spec.partitions = total;
        Ok(old)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_round_trips_and_validates() {
        let d = tempfile::tempdir().unwrap();
        let mut r = Registry::default();
        let mut configs = BTreeMap::new();
        configs.insert("retention.ms".to_string(), "1000".to_string());
        r.create(
            "orders",
            TopicSpec {
                partitions: 4,
                configs,
            },
        )
        .unwrap();
        assert!(matches!(
            r.create(
                "orders",
                TopicSpec {
                    partitions: 1,
                    configs: BTreeMap::new()
                }
            ),
            Err(TopicError::Exists(_))
        ));
        assert!(r
            .create(
                "bad name",
                TopicSpec {
                    partitions: 1,
                    configs: BTreeMap::new()
                }
            )
            .is_err());
        let mut bad = BTreeMap::new();
        bad.insert("segment.bytes".to_string(), "1".to_string());
        assert!(matches!(
            r.create(
                "x",
                TopicSpec {
                    partitions: 1,
                    configs: bad
                }
            ),
            Err(TopicError::Config(_))
        ));
        r.store(d.path()).unwrap();
        assert_eq!(Registry::load(d.path()).unwrap(), r);
        assert_eq!(r.add_partitions("orders", 6).unwrap(), 4);
        assert!(r.add_partitions("orders", 6).is_err());
        assert!(owner_core("orders", 0, 2) < 2);
    }
}
