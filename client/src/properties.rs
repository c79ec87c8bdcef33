//! Configuration by Kafka's property names (`linger.ms`, `acks`,
//! `auto.offset.reset`, …) for the settings that mean the same thing here,
//! as [`crate::ProducerBuilder::from_config`],
//! [`crate::ConsumerBuilder::from_config`] and
//! [`crate::ShareConsumerBuilder::from_config`] read them.
//!
//! Values are strings, as in a Java `.properties` file ([`Properties::parse`]
//! reads one). An unknown name is an error rather than ignored, so a typo
//! does not pass silently; a few Kafka names that have no effect here
//! (`client.id` for a producer, serializers) are accepted and ignored.
//! Weir-only settings use the `weir.` prefix (`weir.shard.aware`,
//! `weir.io.thread`).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::consumer::{ConsumerConfig, IsolationLevel};
use crate::group_consumer::GroupConsumerConfig;
use crate::producer::{Compression, ProducerConfig};
use crate::share_consumer::{AcknowledgementMode, AcquireMode, ShareConsumerConfig};
use crate::{Acks, ClientConfig, OffsetReset};

/// Most properties one [`Properties`] holds (the number of names this
/// crate knows is far lower).
pub const PROPERTIES_MAX: usize = 256;

/// Why a property could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PropertyError {
    /// No setting of this role has this name.
    #[error("unknown {role} property `{name}`")]
    Unknown {
        /// `producer`, `consumer` or `share consumer`.
        role: &'static str,
        /// The property's name.
        name: String,
    },
    /// The value does not parse or is out of range.
    #[error("property `{name}`: invalid value `{value}`: {expected}")]
    Invalid {
        /// The property's name.
        name: String,
        /// The value given.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A line of a properties text is not `name=value`.
    #[error("line {line}: not `name=value` or a comment")]
    Syntax {
        /// 1-based line number.
        line: usize,
    },
    /// More than [`PROPERTIES_MAX`] properties.
    #[error("more than {PROPERTIES_MAX} properties")]
    TooMany,
}

/// Properties by name, in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    map: BTreeMap<String, String>,
}

impl Properties {
    /// No properties.
    pub fn new() -> Properties {
        Properties::default()
    }

    /// Sets one property (names are trimmed; a later value wins).
    pub fn set(mut self, name: impl AsRef<str>, value: impl AsRef<str>) -> Properties {
        self.map.insert(
            name.as_ref().trim().to_string(),
            value.as_ref().trim().to_string(),
        );
        self
    }

    /// Reads `name=value` (or `name: value`) lines; `#` and `!` start
    /// comment lines; blank lines are skipped.
    pub fn parse(text: &str) -> Result<Properties, PropertyError> {
        let mut p = Properties::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .or_else(|| line.split_once(':'))
                .ok_or(PropertyError::Syntax { line: i + 1 })?;
            p = p.set(k, v);
            if p.map.len() > PROPERTIES_MAX {
                return Err(PropertyError::TooMany);
            }
        }
        Ok(p)
    }

    /// The value of a property.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.map.get(name).map(String::as_str)
    }

    /// (name, value) pairs in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Properties {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Properties {
        iter.into_iter()
            .fold(Properties::new(), |p, (k, v)| p.set(k, v))
    }
}

fn invalid(name: &str, value: &str, expected: &'static str) -> PropertyError {
    PropertyError::Invalid {
        name: name.to_string(),
        value: value.to_string(),
        expected,
    }
}

fn num<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, PropertyError> {
    value
        .parse()
        .map_err(|_| invalid(name, value, "a whole number in range"))
}

fn ms(name: &str, value: &str) -> Result<Duration, PropertyError> {
    Ok(Duration::from_millis(num(name, value)?))
}

fn boolean(name: &str, value: &str) -> Result<bool, PropertyError> {
    match value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(name, value, "true or false")),
    }
}

/// Applies a connection setting; `Ok(false)` if `name` is not one.
pub(crate) fn apply_client(
    c: &mut ClientConfig,
    name: &str,
    value: &str,
) -> Result<bool, PropertyError> {
    match name {
        "request.timeout.ms" => c.request_timeout = ms(name, value)?,
        "socket.connection.setup.timeout.ms" => c.connect_timeout = ms(name, value)?,
        "reconnect.backoff.ms" => c.reconnect_backoff = ms(name, value)?,
        "reconnect.backoff.max.ms" => c.reconnect_backoff_max = ms(name, value)?,
        "weir.bootstrap.timeout.ms" => c.bootstrap_timeout = ms(name, value)?,
        "transactional.id" => c.transactional_id = Some(value.to_string()),
        "security.protocol" => {
            c.security_protocol = value
                .parse()
                .map_err(|_| invalid(name, value, "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"))?
        }
        "sasl.mechanism" | "sasl.mechanisms" => {
            c.sasl_mechanism = Some(
                weir_proto::sasl::Mechanism::from_name(&value.to_ascii_uppercase()).ok_or_else(
                    || {
                        invalid(
                            name,
                            value,
                            "SCRAM-SHA-512, SCRAM-SHA-256, PLAIN or OAUTHBEARER",
                        )
                    },
                )?,
            )
        }
        "sasl.username" => c.sasl_username = Some(value.into()),
        "sasl.password" => c.sasl_password = Some(value.into()),
        "weir.sasl.oauthbearer.token.file" => c.sasl_oauthbearer_token_file = Some(value.into()),
        "ssl.ca.location" => c.tls.ca_file = Some(value.into()),
        "ssl.certificate.location" => c.tls.certificate_file = Some(value.into()),
        "ssl.key.location" => c.tls.key_file = Some(value.into()),
        "weir.ssl.server.name" => c.tls.server_name = Some(value.into()),
        _ => return Ok(false),
    }
    Ok(true)
}

/// Applies a producer setting; `Ok(false)` if `name` is not one.
pub(crate) fn apply_producer(
    c: &mut ProducerConfig,
    name: &str,
    value: &str,
) -> Result<bool, PropertyError> {
    match name {
        "linger.ms" => c.linger_ms = num(name, value)?,
        "weir.linger.adaptive" => c.linger_adaptive = boolean(name, value)?,
        "batch.size" => c.batch_size = num(name, value)?,
        "buffer.memory" => c.buffer_memory = num(name, value)?,
        "max.block.ms" => c.max_block_ms = num(name, value)?,
        "acks" => {
            c.acks = value
                .parse::<Acks>()
                .map_err(|_| invalid(name, value, "0, 1, all or -1"))?
        }
        "retries" => c.retries = num(name, value)?,
        "retry.backoff.ms" => c.retry_backoff_ms = num(name, value)?,
        "delivery.timeout.ms" => c.delivery_timeout_ms = num(name, value)?,
        "max.in.flight.requests.per.connection" => c.max_in_flight = num(name, value)?,
        "enable.idempotence" => c.enable_idempotence = boolean(name, value)?,
        "transaction.timeout.ms" => c.transaction_timeout_ms = num(name, value)?,
        "metadata.max.age.ms" => c.metadata_max_age_ms = num(name, value)?,
        "compression.type" => {
            let level = match c.compression {
                Compression::Zstd { level } => level,
                _ => ZSTD_LEVEL_DEFAULT,
            };
            c.compression = match value.to_ascii_lowercase().as_str() {
                "none" => Compression::None,
                "lz4" => Compression::Lz4,
                "zstd" => Compression::Zstd { level },
                _ => return Err(invalid(name, value, "none, lz4 or zstd")),
            }
        }
        // Applied after `compression.type` (properties go in name order).
        "compression.zstd.level" => match &mut c.compression {
            Compression::Zstd { level } => *level = num(name, value)?,
            _ => return Err(invalid(name, value, "compression.type=zstd with it")),
        },
        "weir.shard.aware" => c.shard_aware = boolean(name, value)?,
        "weir.io.thread" => c.io_thread = boolean(name, value)?,
        // Kafka names with no effect here.
        "client.id" | "key.serializer" | "value.serializer" => {}
        _ => return Ok(false),
    }
    Ok(true)
}

/// The zstd level `compression.type=zstd` means without a level.
pub const ZSTD_LEVEL_DEFAULT: i32 = 3;

/// Applies a (group) consumer setting; `Ok(false)` if `name` is not one.
pub(crate) fn apply_consumer(
    c: &mut GroupConsumerConfig,
    name: &str,
    value: &str,
) -> Result<bool, PropertyError> {
    let f: &mut ConsumerConfig = &mut c.consumer;
    match name {
        "group.id" => c.group_id = value.to_string(),
        "client.id" => c.client_id = value.to_string(),
        "auto.offset.reset" => {
            f.auto_offset_reset = match value.to_ascii_lowercase().as_str() {
                "earliest" => OffsetReset::Earliest,
                "latest" => OffsetReset::Latest,
                "none" => OffsetReset::None,
                _ => return Err(invalid(name, value, "earliest, latest or none")),
            }
        }
        "isolation.level" => {
            f.isolation_level = match value.to_ascii_lowercase().as_str() {
                "read_uncommitted" => IsolationLevel::ReadUncommitted,
                "read_committed" => IsolationLevel::ReadCommitted,
                _ => return Err(invalid(name, value, "read_uncommitted or read_committed")),
            }
        }
        "max.poll.records" => f.max_poll_records = num(name, value)?,
        "fetch.max.bytes" => f.fetch_max_bytes = num(name, value)?,
        "max.partition.fetch.bytes" => f.max_partition_fetch_bytes = num(name, value)?,
        "fetch.max.wait.ms" => f.fetch_max_wait_ms = num(name, value)?,
        "enable.auto.commit" => c.enable_auto_commit = boolean(name, value)?,
        "auto.commit.interval.ms" => c.auto_commit_interval = ms(name, value)?,
        "session.timeout.ms" => c.session_timeout = ms(name, value)?,
        "heartbeat.interval.ms" => c.heartbeat_interval = ms(name, value)?,
        "max.poll.interval.ms" => c.max_poll_interval = ms(name, value)?,
        "partition.assignment.strategy" => {
            c.assignor = value
                .parse()
                .map_err(|_| invalid(name, value, "range, roundrobin or cooperative-sticky"))?
        }
        "weir.prefetch" => f.prefetch = boolean(name, value)?,
        "weir.shard.aware" => f.shard_aware = boolean(name, value)?,
        "key.deserializer" | "value.deserializer" => {}
        _ => return Ok(false),
    }
    Ok(true)
}

/// Sets one share consumer setting by its Kafka name (Kafka's
/// `ShareConsumer` configs); `Ok(false)` if the name is not one.
pub(crate) fn apply_share(
    c: &mut ShareConsumerConfig,
    name: &str,
    value: &str,
) -> Result<bool, PropertyError> {
    match name {
        "group.id" => c.group_id = value.to_string(),
        "share.acknowledgement.mode" => {
            c.acknowledgement_mode = match value.to_ascii_lowercase().as_str() {
                "implicit" => AcknowledgementMode::Implicit,
                "explicit" => AcknowledgementMode::Explicit,
                _ => return Err(invalid(name, value, "implicit or explicit")),
            }
        }
        "share.acquire.mode" => {
            c.acquire_mode = AcquireMode::from_name(&value.to_ascii_lowercase())
                .ok_or_else(|| invalid(name, value, "batch_optimized or record_limit"))?
        }
        "max.poll.records" => {
            c.max_records = match num(name, value)? {
                0 => return Err(invalid(name, value, "at least 1")),
                n => n,
            }
        }
        "fetch.max.wait.ms" => c.max_wait = ms(name, value)?,
        "max.partition.fetch.bytes" => {
            c.max_partition_bytes = match num(name, value)? {
                0 => return Err(invalid(name, value, "at least 1")),
                n => n,
            }
        }
        "client.id" | "key.deserializer" | "value.deserializer" => {}
        _ => return Ok(false),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_names_set_the_share_consumer_settings() {
        let mut c = ShareConsumerConfig::new("");
        for (k, v) in [
            ("group.id", "workers"),
            ("share.acknowledgement.mode", "EXPLICIT"),
            ("share.acquire.mode", "record_limit"),
            ("max.poll.records", "50"),
            ("fetch.max.wait.ms", "250"),
            ("max.partition.fetch.bytes", "65536"),
            ("value.deserializer", "ignored"),
        ] {
            assert_eq!(apply_share(&mut c, k, v), Ok(true), "{k}");
        }
        assert_eq!(c.group_id, "workers");
        assert_eq!(c.acknowledgement_mode, AcknowledgementMode::Explicit);
        assert_eq!(c.acquire_mode, AcquireMode::RecordLimit);
        assert_eq!(
            (c.max_records, c.max_wait, c.max_partition_bytes),
            (50, Duration::from_millis(250), 65536)
        );
        assert_eq!(
            apply_share(&mut c, "auto.offset.reset", "earliest"),
            Ok(false)
        );
        for (k, v) in [
            ("share.acquire.mode", "strict"),
            ("share.acknowledgement.mode", "auto"),
            ("max.poll.records", "0"),
            ("max.poll.records", "-1"),
            ("max.partition.fetch.bytes", "0"),
        ] {
            let e = apply_share(&mut c, k, v).unwrap_err().to_string();
            assert!(e.contains(k) && e.contains(v), "{e}");
        }
        // Refused values changed nothing.
        assert_eq!(
            (c.acquire_mode, c.max_records),
            (AcquireMode::RecordLimit, 50)
        );
    }

    #[test]
    fn kafka_names_set_the_producer_settings() {
        let mut c = ProducerConfig::default();
        let mut cc = ClientConfig::default();
        let p = Properties::parse(
            "# a comment\nlinger.ms=20\nbatch.size = 65536\nacks=1\nenable.idempotence=false\n\
             compression.type=zstd\nrequest.timeout.ms=1500\nclient.id=app\n",
        )
        .unwrap();
        for (k, v) in p.iter() {
            let known =
                apply_client(&mut cc, k, v).unwrap() || apply_producer(&mut c, k, v).unwrap();
            assert!(known, "{k}");
        }
        assert_eq!(c.linger_ms, 20);
        assert!(c.linger_adaptive);
        assert!(apply_producer(&mut c, "weir.linger.adaptive", "false").unwrap());
        assert!(!c.linger_adaptive);
        assert!(apply_producer(&mut c, "weir.linger.adaptive", "sometimes").is_err());
        assert_eq!(c.batch_size, 65536);
        assert_eq!(c.acks, Acks::Leader);
        assert!(!c.enable_idempotence);
        assert_eq!(
            c.compression,
            Compression::Zstd {
                level: ZSTD_LEVEL_DEFAULT
            }
        );
        assert_eq!(cc.request_timeout, Duration::from_millis(1500));
        assert!(matches!(
            apply_producer(&mut c, "acks", "2"),
            Err(PropertyError::Invalid { .. })
        ));
        assert!(matches!(
            apply_producer(&mut c, "compression.type", "gzip"),
            Err(PropertyError::Invalid { .. })
        ));
        assert_eq!(apply_producer(&mut c, "lingr.ms", "1"), Ok(false));
        assert_eq!(
            Properties::parse("a=1\nnonsense\n"),
            Err(PropertyError::Syntax { line: 2 })
        );
    }

    #[test]
    fn kafka_names_set_the_consumer_settings() {
        let mut c = GroupConsumerConfig::new("");
        for (k, v) in [
            ("group.id", "billing"),
            ("auto.offset.reset", "earliest"),
            ("max.poll.records", "10"),
            ("enable.auto.commit", "true"),
        ] {
            assert!(apply_consumer(&mut c, k, v).unwrap(), "{k}");
        }
        assert_eq!(c.group_id, "billing");
        assert_eq!(c.consumer.auto_offset_reset, OffsetReset::Earliest);
        assert_eq!(c.consumer.max_poll_records, 10);
        assert!(c.enable_auto_commit);
        assert!(apply_consumer(&mut c, "auto.offset.reset", "smallest").is_err());
        assert!(apply_consumer(&mut c, "isolation.level", "read_committed").unwrap());
        assert_eq!(c.consumer.isolation_level, IsolationLevel::ReadCommitted);
        assert!(apply_consumer(&mut c, "isolation.level", "committed").is_err());
    }
}
