//! Per-partition log configuration, with Kafka's topic-config names.
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `segment.bytes` | 1 GiB | roll the active segment when the next batch would pass this size |
//! | `segment.ms` | 7 days | roll the active segment when it is this old (at the next append) |
//! | `retention.ms` | 7 days (`-1` = forever) | delete closed segments whose newest record is older |
//! | `retention.bytes` | `-1` (no limit) | delete oldest closed segments while the log is larger |
//! | `index.interval.bytes` | 4096 | bytes of log between two index entries |
//! | `flush.messages` | 1 | fdatasync after this many records; 1 = every acknowledged append is on disk |
//! | `flush.ms` | `-1` (none) | fdatasync unsynced data at the latest after this long |
//! | `max.message.bytes` | 1048588 | largest batch accepted |
//! | `cleanup.policy` | `delete` | `delete` (retention removes old segments), `compact` (the cleaner keeps the latest record per key; retention does not delete) or `compact,delete` (both) |
//! | `min.cleanable.dirty.ratio` | 0.5 | the cleaner picks a compacted log when its dirty bytes / (clean + dirty) bytes reach this |
//! | `min.compaction.lag.ms` | 0 | a segment is cleaned only once its newest record is at least this old |
//! | `delete.retention.ms` | 86400000 (24 h) | a tombstone (null value) is kept this long after the segment holding it was first cleaned |
//! | `remote.storage.enable` | `false` | tiered storage: closed segments are uploaded to the object store; local retention then deletes only uploaded ones |
//! | `local.retention.ms` | `-2` (= `retention.ms`) | with tiering: how long closed, uploaded segments stay on local disk (`-1`: forever) |
//! | `local.retention.bytes` | `-2` (= `retention.bytes`) | with tiering: how many bytes of uploaded segments stay on local disk (`-1`: no limit) |

use crate::error::{Result, StorageError};

/// Smallest accepted `segment.bytes` (Kafka's minimum is 14 bytes; ours
/// keeps a segment able to hold at least a few index entries).
pub const SEGMENT_BYTES_MIN: u64 = 4096;
/// Largest accepted `segment.bytes`: positions in the index are `u32`.
pub const SEGMENT_BYTES_MAX: u64 = i32::MAX as u64;
/// Default `segment.bytes`.
pub const SEGMENT_BYTES_DEFAULT: u64 = 1 << 30;
/// Default `segment.ms` (7 days).
pub const SEGMENT_MS_DEFAULT: i64 = 7 * 24 * 3600 * 1000;
/// Default `retention.ms` (7 days).
pub const RETENTION_MS_DEFAULT: i64 = 7 * 24 * 3600 * 1000;
/// Default `index.interval.bytes`.
pub const INDEX_INTERVAL_BYTES_DEFAULT: u64 = 4096;
/// Default `max.message.bytes` (Kafka's: 1 MiB + the 12-byte log overhead).
pub const MAX_MESSAGE_BYTES_DEFAULT: u64 = 1024 * 1024 + 12;
/// Default `min.cleanable.dirty.ratio`.
pub const MIN_CLEANABLE_DIRTY_RATIO_DEFAULT: f64 = 0.5;
/// Default `delete.retention.ms` (24 hours).
pub const DELETE_RETENTION_MS_DEFAULT: i64 = 24 * 3600 * 1000;

/// `cleanup.policy`: what removes old records from a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CleanupPolicy {
    /// Retention (`retention.ms`, `retention.bytes`) deletes old segments.
    #[default]
    Delete,
    /// The cleaner keeps the latest record of every key; retention deletes nothing.
    Compact,
    /// Both: the cleaner compacts and retention deletes old segments.
    CompactDelete,
}

impl CleanupPolicy {
    /// Whether the cleaner compacts the log.
    pub fn compacts(self) -> bool {
        matches!(self, CleanupPolicy::Compact | CleanupPolicy::CompactDelete)
    }

    /// Whether retention deletes old segments.
    pub fn deletes(self) -> bool {
        matches!(self, CleanupPolicy::Delete | CleanupPolicy::CompactDelete)
    }

    /// Kafka's spelling: `delete`, `compact` or `compact,delete`.
    pub fn as_str(self) -> &'static str {
        match self {
            CleanupPolicy::Delete => "delete",
            CleanupPolicy::Compact => "compact",
            CleanupPolicy::CompactDelete => "compact,delete",
        }
    }

    /// Parses `delete`, `compact`, `compact,delete` or `delete,compact`
    /// (spaces around the comma are ignored).
    pub fn parse(s: &str) -> Option<CleanupPolicy> {
        let mut compact = false;
        let mut delete = false;
        for part in s.split(',') {
            match part.trim() {
                "compact" => compact = true,
                "delete" => delete = true,
                _ => return None,
            }
        }
        Some(match (compact, delete) {
            (true, true) => CleanupPolicy::CompactDelete,
            (true, false) => CleanupPolicy::Compact,
            (false, true) => CleanupPolicy::Delete,
            (false, false) => return None,
        })
    }
}

const _: () = assert!(SEGMENT_BYTES_DEFAULT <= SEGMENT_BYTES_MAX);
const _: () = assert!(MAX_MESSAGE_BYTES_DEFAULT < SEGMENT_BYTES_DEFAULT);

/// The configuration of one partition log.
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// `segment.bytes`.
    pub segment_bytes: u64,
    /// `segment.ms`.
    pub segment_ms: i64,
    /// `retention.ms`; `None` keeps data forever.
    pub retention_ms: Option<i64>,
    /// `retention.bytes`; `None` sets no size limit.
    pub retention_bytes: Option<u64>,
    /// `index.interval.bytes`.
    pub index_interval_bytes: u64,
    /// `flush.messages`: records between two fdatasyncs.
    pub flush_messages: u64,
    /// `flush.ms`; `None`: no time-based flush.
    pub flush_ms: Option<i64>,
    /// `max.message.bytes`.
    pub max_message_bytes: u64,
    /// `cleanup.policy`.
    pub cleanup_policy: CleanupPolicy,
    /// `min.cleanable.dirty.ratio` (0..=1).
    pub min_cleanable_dirty_ratio: f64,
    /// `min.compaction.lag.ms`.
    pub min_compaction_lag_ms: i64,
    /// `delete.retention.ms`.
    pub delete_retention_ms: i64,
    /// `min.insync.replicas`: with `acks=all`, fewer in-sync replicas than
    /// this refuses the write (replication; the log itself ignores it).
    pub min_insync_replicas: u32,
    /// `unclean.leader.election.enable`: a replica out of the ISR may be
    /// elected leader when no ISR member is live (losing what it missed).
    pub unclean_leader_election: bool,
    /// `remote.storage.enable`: tiered storage.
    pub remote_storage: bool,
    /// `local.retention.ms`: `-2` follows `retention.ms`, `-1` keeps
    /// uploaded segments forever.
    pub local_retention_ms: i64,
    /// `local.retention.bytes`: `-2` follows `retention.bytes`, `-1` sets
    /// no limit.
    pub local_retention_bytes: i64,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            segment_ms: SEGMENT_MS_DEFAULT,
            retention_ms: Some(RETENTION_MS_DEFAULT),
            retention_bytes: None,
            index_interval_bytes: INDEX_INTERVAL_BYTES_DEFAULT,
            flush_messages: 1,
            flush_ms: None,
            max_message_bytes: MAX_MESSAGE_BYTES_DEFAULT,
            cleanup_policy: CleanupPolicy::Delete,
            min_cleanable_dirty_ratio: MIN_CLEANABLE_DIRTY_RATIO_DEFAULT,
            min_compaction_lag_ms: 0,
            min_insync_replicas: 1,
            unclean_leader_election: false,
            delete_retention_ms: DELETE_RETENTION_MS_DEFAULT,
            remote_storage: false,
            local_retention_ms: -2,
            local_retention_bytes: -2,
        }
    }
}

/// The keys [`LogConfig::set`] understands.
pub const KEYS: &[&str] = &[
    "segment.bytes",
    "segment.ms",
    "retention.ms",
    "retention.bytes",
    "index.interval.bytes",
    "flush.messages",
    "flush.ms",
    "max.message.bytes",
    "cleanup.policy",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "delete.retention.ms",
    "min.insync.replicas",
    "unclean.leader.election.enable",
    "remote.storage.enable",
    "local.retention.ms",
    "local.retention.bytes",
];

impl LogConfig {
    /// How long closed segments stay on local disk: `retention.ms`
    /// without tiering; with it `local.retention.ms` (or `retention.ms`).
    pub fn local_retention_ms(&self) -> Option<i64> {
        match (self.remote_storage, self.local_retention_ms) {
            (false, _) | (true, -2) => self.retention_ms,
            (true, -1) => None,
            (true, n) => Some(n),
        }
    }

    /// How many bytes stay on local disk: `retention.bytes` without
    /// tiering; with it `local.retention.bytes` (or `retention.bytes`).
    pub fn local_retention_bytes(&self) -> Option<u64> {
        match (self.remote_storage, self.local_retention_bytes) {
            (false, _) | (true, -2) => self.retention_bytes,
            (true, -1) => None,
            (true, n) => Some(n as u64),
        }
    }

    /// Checks what single keys cannot: tiering is not for compacted logs
    /// (Kafka refuses it too), and the local retention is at most the
    /// total.
    pub fn validate(&self) -> Result<()> {
        if !self.remote_storage {
            return Ok(());
        }
        let bad = |key: &str, value: String, reason: &str| StorageError::Config {
            key: key.to_string(),
            value,
            reason: reason.to_string(),
        };
        if self.cleanup_policy.compacts() {
            return Err(bad(
                "remote.storage.enable",
                "true".into(),
                "tiered storage is not supported with cleanup.policy=compact",
            ));
        }
        let within = |local: Option<i64>, total: Option<i64>| match (local, total) {
            (_, None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(t)) => l <= t,
        };
        if !within(self.local_retention_ms(), self.retention_ms) {
            return Err(bad(
                "local.retention.ms",
                self.local_retention_ms.to_string(),
                "must be at most retention.ms",
            ));
        }
        let total_bytes = self.retention_bytes.map(|b| b as i64);
        let local_bytes = self.local_retention_bytes().map(|b| b as i64);
        if !within(local_bytes, total_bytes) {
            return Err(bad(
                "local.retention.bytes",
                self.local_retention_bytes.to_string(),
                "must be at most retention.bytes",
            ));
        }
        Ok(())
    }

    /// Whether an acknowledged append must wait for fdatasync.
    pub fn sync_every_append(&self) -> bool {
        self.flush_messages <= 1
    }

    /// Sets one key by its Kafka name. Values are integers (`-1` means
    /// "unlimited" for `retention.ms`, `retention.bytes` and `flush.ms`),
    /// except `cleanup.policy` (`delete`, `compact`, `compact,delete`) and
    /// `min.cleanable.dirty.ratio` (a number from 0 to 1).
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let bad = |reason: &str| StorageError::Config {
            key: key.to_string(),
            value: value.to_string(),
            reason: reason.to_string(),
        };
        match key {
            "cleanup.policy" => {
                self.cleanup_policy = CleanupPolicy::parse(value)
                    .ok_or_else(|| bad("must be delete, compact or compact,delete"))?;
                return Ok(());
            }
            "unclean.leader.election.enable" => {
                self.unclean_leader_election = match value.trim() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad("must be true or false")),
                };
                return Ok(());
            }
            "remote.storage.enable" => {
                self.remote_storage = match value.trim() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad("must be true or false")),
                };
                return Ok(());
            }
            "min.cleanable.dirty.ratio" => {
                let r: f64 = value.trim().parse().map_err(|_| bad("not a number"))?;
                if !(0.0..=1.0).contains(&r) {
                    return Err(bad("must be between 0 and 1"));
                }
                self.min_cleanable_dirty_ratio = r;
                return Ok(());
            }
            _ => {}
        }
        let n: i64 = value.trim().parse().map_err(|_| bad("not an integer"))?;
        let positive = |min: i64| {
            if n < min {
                Err(bad(&format!("must be at least {min}")))
            } else {
                Ok(n)
            }
        };
        let optional = || -> Result<Option<i64>> {
            match n {
                -1 => Ok(None),
                n if n >= 0 => Ok(Some(n)),
                _ => Err(bad("must be -1 (unlimited) or at least 0")),
            }
        };
        match key {
            "segment.bytes" => {
                let v = positive(SEGMENT_BYTES_MIN as i64)? as u64;
                if v > SEGMENT_BYTES_MAX {
                    return Err(bad(&format!("must be at most {SEGMENT_BYTES_MAX}")));
                }
                self.segment_bytes = v;
            }
            "segment.ms" => self.segment_ms = positive(1)?,
            "retention.ms" => self.retention_ms = optional()?,
            "retention.bytes" => self.retention_bytes = optional()?.map(|v| v as u64),
            "index.interval.bytes" => self.index_interval_bytes = positive(0)? as u64,
            "flush.messages" => self.flush_messages = positive(1)? as u64,
            "flush.ms" => self.flush_ms = optional()?,
            "max.message.bytes" => {
                self.max_message_bytes = positive(weir_proto::batch::HEADER_BYTES as i64)? as u64
            }
            "local.retention.ms" | "local.retention.bytes" => {
                if n < -2 {
                    return Err(bad(
                        "must be -2 (follow retention), -1 (unlimited) or at least 0",
                    ));
                }
                if key == "local.retention.ms" {
                    self.local_retention_ms = n;
                } else {
                    self.local_retention_bytes = n;
                }
            }
            "min.compaction.lag.ms" => self.min_compaction_lag_ms = positive(0)?,
            "delete.retention.ms" => self.delete_retention_ms = positive(0)?,
            "min.insync.replicas" => {
                self.min_insync_replicas =
                    u32::try_from(positive(1)?).map_err(|_| bad("must be at most 4294967295"))?
            }
            _ => return Err(bad(&format!("unknown key (known: {})", KEYS.join(", ")))),
        }
        Ok(())
    }

    /// The value of a key as text (`-1` for unlimited), or `None` for an unknown key.
    pub fn get(&self, key: &str) -> Option<String> {
        let opt = |v: Option<i64>| v.unwrap_or(-1).to_string();
        Some(match key {
            "segment.bytes" => self.segment_bytes.to_string(),
            "segment.ms" => self.segment_ms.to_string(),
            "retention.ms" => opt(self.retention_ms),
            "retention.bytes" => opt(self.retention_bytes.map(|v| v as i64)),
            "index.interval.bytes" => self.index_interval_bytes.to_string(),
            "flush.messages" => self.flush_messages.to_string(),
            "flush.ms" => opt(self.flush_ms),
            "max.message.bytes" => self.max_message_bytes.to_string(),
            "cleanup.policy" => self.cleanup_policy.as_str().to_string(),
            "min.cleanable.dirty.ratio" => self.min_cleanable_dirty_ratio.to_string(),
            "min.compaction.lag.ms" => self.min_compaction_lag_ms.to_string(),
            "delete.retention.ms" => self.delete_retention_ms.to_string(),
            "min.insync.replicas" => self.min_insync_replicas.to_string(),
            "unclean.leader.election.enable" => self.unclean_leader_election.to_string(),
            "remote.storage.enable" => self.remote_storage.to_string(),
            "local.retention.ms" => self.local_retention_ms.to_string(),
            "local.retention.bytes" => self.local_retention_bytes.to_string(),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_and_get_round_trip_every_key() {
        let mut c = LogConfig::default();
        for k in KEYS {
            let v = c.get(k).unwrap();
            c.set(k, &v).unwrap();
        }
        assert_eq!(c, LogConfig::default());
        c.set("retention.ms", "-1").unwrap();
        assert_eq!(c.retention_ms, None);
        c.set("segment.bytes", "1048576").unwrap();
        assert_eq!(c.segment_bytes, 1 << 20);
        c.set("cleanup.policy", "delete, compact").unwrap();
        assert_eq!(c.cleanup_policy, CleanupPolicy::CompactDelete);
        assert_eq!(c.get("cleanup.policy").unwrap(), "compact,delete");
        c.set("min.cleanable.dirty.ratio", "0.25").unwrap();
        assert_eq!(c.min_cleanable_dirty_ratio, 0.25);
    }

    #[test]
    fn local_retention_follows_the_total_unless_tiered() {
        let mut c = LogConfig::default();
        c.set("retention.bytes", "100").unwrap();
        c.set("local.retention.bytes", "10").unwrap();
        assert_eq!(c.local_retention_bytes(), Some(100), "not tiered");
        c.set("remote.storage.enable", "true").unwrap();
        assert_eq!(c.local_retention_bytes(), Some(10));
        assert_eq!(c.local_retention_ms(), c.retention_ms, "-2 follows");
        c.validate().unwrap();
        c.set("local.retention.bytes", "1000").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("at most retention.bytes"), "{e}");
        c.set("local.retention.bytes", "-2").unwrap();
        c.set("cleanup.policy", "compact").unwrap();
        assert!(c.validate().is_err());
        assert!(c.set("local.retention.ms", "-3").is_err());
    }

    #[test]
    fn bad_values_name_the_key() {
        let mut c = LogConfig::default();
        let e = c.set("segment.bytes", "12").unwrap_err().to_string();
        assert!(e.contains("segment.bytes=12"), "{e}");
        assert!(c.set("flush.messages", "0").is_err());
        assert!(c.set("retention.ms", "-2").is_err());
        assert!(c
            .set("nope", "1")
            .unwrap_err()
            .to_string()
            .contains("unknown key"));
        assert!(c.set("segment.ms", "abc").is_err());
        assert!(c.set("cleanup.policy", "compacted").is_err());
        assert!(c.set("cleanup.policy", "").is_err());
        assert!(c.set("min.cleanable.dirty.ratio", "1.5").is_err());
        assert!(c.set("delete.retention.ms", "-1").is_err());
        assert_eq!(c, LogConfig::default());
    }
}
