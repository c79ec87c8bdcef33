//! Workloads: what a benchmark run does, in the vocabulary of the
//! [OpenMessaging Benchmark](https://github.com/openmessaging/benchmark)
//! (OMB) workload files (`workloads/*.yaml`).
//!
//! ```yaml
//! name: 1 topic / 16 partitions / 1Kb
//! topics: 1
//! partitionsPerTopic: 16
//! messageSize: 1024
//! keyDistributor: NO_KEY
//! producersPerTopic: 1
//! subscriptionsPerTopic: 1
//! consumerPerSubscription: 1
//! producerRate: 50000
//! consumerBacklogSizeGB: 0
//! warmupDurationMinutes: 0.25
//! testDurationMinutes: 1
//! driver:            # optional, every key optional
//!   acks: all
//!   lingerMs: 5
//! ```
//!
//! Field names and meanings follow OMB, with these differences:
//!
//! * unknown fields are errors (a typo must not silently fall back to a
//!   default), so OMB-only fields such as `producerStartRate` are refused;
//! * `producerRate: 0` means "as fast as the producers can", not OMB's
//!   search for the highest sustainable rate;
//! * durations are minutes as floating-point numbers (`0.25` = 15 s), and
//!   `warmupDurationMinutes` defaults to 0 (upstream OMB always warms up
//!   for 1 minute);
//! * the driver settings, which OMB keeps in a separate driver file, are
//!   embedded under `driver` ([`DriverSettings`]), all optional.
//!
//! [`Workload::from_yaml`] and [`Workload::load`] parse and then
//! [validate](Workload::validate); [`Workload::set`] overrides a field from
//! the command line by its YAML name.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail};
use serde::{Deserialize, Deserializer, Serialize};
use serde_yaml::{Mapping, Value};

/// `randomizedPayloadPoolSize` used when the field is 0 (OMB's usual value).
pub const DEFAULT_PAYLOAD_POOL_SIZE: usize = 1000;

/// The broker's default `max.message.bytes` (weir-storage's default,
/// Kafka's: 1 MiB plus the 12-byte log overhead): the largest record batch,
/// header included, a topic accepts. The workload does not change it.
pub const BROKER_MAX_MESSAGE_BYTES: usize = 1024 * 1024 + 12;

/// Largest `driver.batchSize`: a batch of that many bytes of records, plus
/// the batch header, still fits [`BROKER_MAX_MESSAGE_BYTES`].
pub const BATCH_SIZE_MAX: usize = BROKER_MAX_MESSAGE_BYTES - weir_proto::batch::HEADER_BYTES;

/// Largest `messageSize`: 1 MiB − 1 KiB, which leaves room for the record's
/// framing and key within a batch of at most [`BROKER_MAX_MESSAGE_BYTES`].
pub const MESSAGE_SIZE_MAX: usize = 1024 * 1024 - 1024;

const _: () = assert!(MESSAGE_SIZE_MAX + 512 <= BATCH_SIZE_MAX);

/// Most partitions of one topic (the broker's limit).
pub const PARTITIONS_MAX: u32 = weir_broker::metadata::PARTITIONS_MAX;

/// Longest warm-up or test (365 days), so that durations stay far from
/// overflowing clock arithmetic.
pub const DURATION_MINUTES_MAX: f64 = 365.0 * 24.0 * 60.0;

/// Most memory the pool of randomized payloads may take
/// (pool size × `messageSize`): 1 GiB.
pub const PAYLOAD_POOL_BYTES_MAX: u64 = 1 << 30;

/// Largest `driver.lingerMs` (Kafka's `linger.ms` limit, `i32::MAX`).
pub const LINGER_MS_MAX: u64 = i32::MAX as u64;

/// Largest `driver.maxInFlight` with idempotence (and `acks: all`); the
/// client would silently use no more.
pub const MAX_IN_FLIGHT_IDEMPOTENT: usize = weir_client::producer::MAX_IN_FLIGHT_IDEMPOTENT;

/// Zstandard level used for `driver.compression: zstd`.
pub const ZSTD_LEVEL: i32 = 3;

/// Longest topic name the broker accepts.
const TOPIC_NAME_BYTES_MAX: usize = weir_broker::metadata::TOPIC_NAME_BYTES_MAX;

/// Bytes in one `consumerBacklogSizeGB` unit: OMB counts GiB.
const GIB: f64 = (1u64 << 30) as f64;

/// A benchmark workload (an OMB workload file, plus Weir's driver
/// settings). Fields are named in YAML by their camelCase names (given with
/// each field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Workload {
    /// `name`: a human-readable name, also the base of the topic names
    /// ([`Workload::topic_names`]). Must not be blank.
    pub name: String,
    /// `topics`: number of topics, at least 1.
    pub topics: u32,
    /// `partitionsPerTopic`: partitions of each topic, 1 to
    /// [`PARTITIONS_MAX`].
    pub partitions_per_topic: u32,
    /// `messageSize`: bytes of each record's value, 1 to
    /// [`MESSAGE_SIZE_MAX`].
    pub message_size: usize,
    /// `useRandomizedPayloads` (default false): values are drawn from a pool
    /// of [`Workload::payload_pool_size`] distinct payloads, each with a
    /// `randomBytesRatio` share of random bytes (the rest constant), instead of
    /// one fixed payload. Cannot be combined with `payloadFile`.
    #[serde(default)]
    pub use_randomized_payloads: bool,
    /// `randomBytesRatio` (default 0): share of random bytes in each
    /// randomized payload, 0 to 1. Used with `useRandomizedPayloads` only.
    #[serde(default)]
    pub random_bytes_ratio: f64,
    /// `randomizedPayloadPoolSize` (default 0, meaning
    /// [`DEFAULT_PAYLOAD_POOL_SIZE`]): number of distinct randomized
    /// payloads. See [`Workload::payload_pool_size`].
    #[serde(default)]
    pub randomized_payload_pool_size: usize,
    /// `payloadFile` (optional): if set, the file's bytes are every record's
    /// value; the file must hold exactly `messageSize` bytes (checked when
    /// it is read, [`Workload::read_payload_file`]). If neither this nor
    /// `useRandomizedPayloads` is set, every record carries the same
    /// `messageSize`-byte value chosen by the load generator.
    #[serde(default)]
    pub payload_file: Option<String>,
    /// `keyDistributor` (default `NO_KEY`): how records are keyed.
    #[serde(default)]
    pub key_distributor: KeyDistributor,
    /// `producersPerTopic`: producers writing to each topic; 0 for a
    /// consume-only workload.
    pub producers_per_topic: u32,
    /// `subscriptionsPerTopic`: independent subscriptions (consumer groups)
    /// reading each topic; 0 for a produce-only workload.
    pub subscriptions_per_topic: u32,
    /// `consumerPerSubscription`: consumers sharing each subscription's
    /// partitions; at least 1 when `subscriptionsPerTopic` is not 0.
    pub consumer_per_subscription: u32,
    /// `subscriptionType` (Weir's; default `group`): what a subscription
    /// is — `group`, a consumer group whose members split the partitions;
    /// `share`, a share group (KIP-932) whose members all read every
    /// partition and acknowledge records one by one (the Weir driver
    /// only).
    #[serde(default)]
    pub subscription_type: SubscriptionType,
    /// `consumerProcessingMicros` (Weir's; default 0): the work each
    /// consumed record costs its consumer, in µs, spent waiting (as a
    /// call to another service would) after each poll, before the next;
    /// at most [`PROCESSING_MICROS_MAX`].
    #[serde(default)]
    pub consumer_processing_micros: u64,
    /// `shareMaxRecords` (Weir's): records a share-group member takes per
    /// poll, 1 to [`SHARE_MAX_RECORDS_MAX`]; default the SDK's (500).
    #[serde(default)]
    pub share_max_records: Option<u32>,
    /// `unkeyedPartitioner` (Weir's): where `NO_KEY` records go —
    /// `round_robin` (the default, and every figure in
    /// docs/benchmarks.md unless it says otherwise: record k of a
    /// producer to partition k + its index, modulo the partitions) or
    /// `sticky` (no partition given: the client's own partitioner, as
    /// OMB's `NO_KEY` does — the SDK's and Kafka's sticky partitioning,
    /// librdkafka's `sticky.partitioning.linger.ms`).
    #[serde(default)]
    pub unkeyed_partitioner: UnkeyedPartitioner,
    /// `shareAcquireMode` (Kafka's `share.acquire.mode`): `batch_optimized`
    /// (the default: whole batches, a poll may pass `shareMaxRecords`) or
    /// `record_limit` (at most `shareMaxRecords` per poll, a batch taken in
    /// part).
    #[serde(default)]
    pub share_acquire_mode: ShareAcquireMode,
    /// `producerRate`: records per second over all producers together (OMB's
    /// meaning); 0 means as fast as possible. Ignored without producers.
    pub producer_rate: f64,
    /// `consumerBacklogSizeGB` (default 0): if not 0, the consumers are held
    /// back until the producers have built a backlog of this many GiB
    /// ([`Workload::backlog_bytes`]) and then drain it while the producers
    /// go on at `producerRate`. Needs producers and subscriptions.
    #[serde(default, rename = "consumerBacklogSizeGB")]
    pub consumer_backlog_size_gb: f64,
    /// `warmupDurationMinutes` (default 0): minutes of load before the
    /// measured test, whose results are discarded.
    #[serde(default)]
    pub warmup_duration_minutes: f64,
    /// `testDurationMinutes`: minutes of measured load, more than 0.
    pub test_duration_minutes: f64,
    /// `driver` (optional, every key optional): producer and topic settings.
    #[serde(default)]
    pub driver: DriverSettings,
}

/// Weir's driver settings, embedded in the workload under `driver` (OMB
/// keeps them in a separate driver file). Every field is optional in YAML,
/// with the default given with it (the producer's defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct DriverSettings {
    /// `acks`: `all` (default), `1` or `0` (YAML numbers are accepted).
    #[serde(deserialize_with = "string_or_number")]
    pub acks: String,
    /// `lingerMs`: how long a batch waits for more records, 0 to
    /// [`LINGER_MS_MAX`]. Default 5.
    pub linger_ms: u64,
    /// `lingerAdaptive`: a batch of a partition with nothing in flight is
    /// sent at once (the Weir SDK's `linger_adaptive`; librdkafka has no
    /// such setting and ignores it). Default true.
    pub linger_adaptive: bool,
    /// `batchSize`: bytes of records at which a batch is sent, 0 to
    /// [`BATCH_SIZE_MAX`]. Default 524288 (the SDK's default).
    pub batch_size: usize,
    /// `compression`: `none` (default), `lz4` or `zstd` (level
    /// [`ZSTD_LEVEL`]).
    pub compression: String,
    /// `idempotence`: idempotent producers (used with `acks: all` only, as
    /// the client does). Default true.
    pub idempotence: bool,
    /// `flushMessages`: the topics' `flush.messages` (fdatasync after this
    /// many records, at least 1); unset (`null`): the broker's default.
    pub flush_messages: Option<u64>,
    /// `flushMs`: the topics' `flush.ms` (fdatasync unsynced data at the
    /// latest after this many milliseconds); unset (`null`): the broker's
    /// default.
    pub flush_ms: Option<u64>,
    /// `maxInFlight`: produce requests awaiting answers per connection, at
    /// least 1, and at most [`MAX_IN_FLIGHT_IDEMPOTENT`] with idempotence
    /// and `acks: all`. Default 5.
    pub max_in_flight: usize,
    /// `bufferMemory`: bytes of records a producer may buffer before
    /// `send` waits (Kafka's `buffer.memory`), at least 1 KiB. Default
    /// 64 MiB.
    pub buffer_memory: usize,
    /// `transactionRecords`: if set, each producer writes in transactions
    /// of this many records (a transactional id per producer: the Weir
    /// SDK's transactional producer, or librdkafka's), committing each;
    /// needs idempotence and `acks: all`. Unset (default): no
    /// transactions.
    pub transaction_records: Option<u64>,
    /// `isolationLevel`: the consumers' `isolation.level` (either
    /// driver), `read_uncommitted` or `read_committed`; unset (default):
    /// the client's own default (the Weir SDK: read_uncommitted;
    /// librdkafka: read_committed).
    pub isolation_level: Option<String>,
    /// `topicConfigs`: more configs of the run's topics, by Kafka name,
    /// `key=value` separated by commas (e.g.
    /// `remote.storage.enable=true,segment.bytes=1048576`). Default empty.
    pub topic_configs: String,
    /// `otlpSpansPerExport`: spans per OTLP export with `--driver
    /// otlp-grpc|otlp-http` (each record is one span). Default 512 (the
    /// OpenTelemetry SDK's `BatchSpanProcessor` batch).
    pub otlp_spans_per_export: usize,
}

impl Default for DriverSettings {
    fn default() -> Self {
        DriverSettings {
            acks: "all".to_string(),
            linger_ms: 5,
            linger_adaptive: true,
            batch_size: 512 * 1024,
            compression: "none".to_string(),
            idempotence: true,
            flush_messages: None,
            flush_ms: None,
            max_in_flight: 5,
            buffer_memory: 64 << 20,
            otlp_spans_per_export: 512,
            transaction_records: None,
            isolation_level: None,
            topic_configs: String::new(),
        }
    }
}

/// The accepted values of `driver.acks`.
const ACKS: &[&str] = &["all", "1", "0"];
/// The accepted values of `driver.compression`.
const COMPRESSIONS: &[&str] = &["none", "lz4", "zstd"];

impl DriverSettings {
    /// The producer configuration these settings describe (other producer
    /// settings keep the client's defaults). Meant for validated settings:
    /// an unknown `acks` or `compression` maps to the default.
    pub fn producer_config(&self) -> weir_client::ProducerConfig {
        let mut c = weir_client::ProducerConfig::default();
        c.acks = self.acks.parse().unwrap_or_default();
        c.linger_ms = self.linger_ms;
        c.linger_adaptive = self.linger_adaptive;
        c.batch_size = self.batch_size;
        c.compression = match self.compression.as_str() {
            "lz4" => weir_client::producer::Compression::Lz4,
            "zstd" => weir_client::producer::Compression::Zstd { level: ZSTD_LEVEL },
            _ => weir_client::producer::Compression::None,
        };
        c.enable_idempotence = self.idempotence;
        c.max_in_flight = self.max_in_flight;
        c.buffer_memory = self.buffer_memory;
        c
    }

    /// The topic configs to create the topics with, by Kafka name
    /// (`flush.messages`, `flush.ms`), for the settings that are set.
    pub fn topic_configs(&self) -> Vec<(String, String)> {
        let mut configs = Vec::new();
        if let Some(n) = self.flush_messages {
            configs.push(("flush.messages".to_string(), n.to_string()));
        }
        if let Some(ms) = self.flush_ms {
            configs.push(("flush.ms".to_string(), ms.to_string()));
        }
        configs.extend(self.extra_topic_configs());
        configs
    }

    /// `topicConfigs` as pairs (entries without `=` are left out; they
    /// fail validation).
    fn extra_topic_configs(&self) -> Vec<(String, String)> {
        self.topic_configs
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect()
    }

    /// Whether the run's topics are tiered (`remote.storage.enable=true`
    /// in `topicConfigs`).
    pub fn tiered(&self) -> bool {
        self.extra_topic_configs()
            .iter()
            .any(|(k, v)| k == "remote.storage.enable" && v == "true")
    }

    fn validate(&self) -> Result<(), WorkloadError> {
        if self.buffer_memory < 1024 {
            return Err(WorkloadError::new(
                "driver.bufferMemory",
                format!("must be at least 1024 bytes (got {})", self.buffer_memory),
            ));
        }
        if !ACKS.contains(&self.acks.as_str()) {
            return Err(WorkloadError::new(
                "driver.acks",
                format!("must be one of all, 1, 0 (got `{}`)", self.acks),
            ));
        }
        if self.linger_ms > LINGER_MS_MAX {
            return Err(WorkloadError::new(
                "driver.lingerMs",
                format!("must be at most {LINGER_MS_MAX} (got {})", self.linger_ms),
            ));
        }
        if self.batch_size > BATCH_SIZE_MAX {
            return Err(WorkloadError::new(
                "driver.batchSize",
                format!(
                    "must be at most {BATCH_SIZE_MAX}, so that a batch fits the broker's \
                     max.message.bytes of {BROKER_MAX_MESSAGE_BYTES} (got {})",
                    self.batch_size
                ),
            ));
        }
        if !COMPRESSIONS.contains(&self.compression.as_str()) {
            return Err(WorkloadError::new(
                "driver.compression",
                format!(
                    "must be one of none, lz4, zstd (got `{}`)",
                    self.compression
                ),
            ));
        }
        if let Some(n) = self.flush_messages {
            if n == 0 || n > i64::MAX as u64 {
                return Err(WorkloadError::new(
                    "driver.flushMessages",
                    format!("must be 1 to {} or null (got {n})", i64::MAX),
                ));
            }
        }
        if let Some(ms) = self.flush_ms {
            if ms > i64::MAX as u64 {
                return Err(WorkloadError::new(
                    "driver.flushMs",
                    format!("must be 0 to {} or null (got {ms})", i64::MAX),
                ));
            }
        }
        let malformed = |kv: &&str| {
            let key = kv.split_once('=').map(|(k, _)| k.trim());
            !kv.is_empty() && key.is_none_or(str::is_empty)
        };
        if let Some(bad) = self.topic_configs.split(',').map(str::trim).find(malformed) {
            return Err(WorkloadError::new(
                "driver.topicConfigs",
                format!("entries are key=value, separated by commas (got `{bad}`)"),
            ));
        }
        if self.max_in_flight == 0 {
            return Err(WorkloadError::new(
                "driver.maxInFlight",
                "must be at least 1 (got 0)",
            ));
        }
        if self.idempotence && self.acks == "all" && self.max_in_flight > MAX_IN_FLIGHT_IDEMPOTENT {
            return Err(WorkloadError::new(
                "driver.maxInFlight",
                format!(
                    "must be at most {MAX_IN_FLIGHT_IDEMPOTENT} with idempotence and acks=all \
                     (got {}); set driver.idempotence to false for more",
                    self.max_in_flight
                ),
            ));
        }
        if let Some(n) = self.transaction_records {
            if n == 0 || n > TRANSACTION_RECORDS_MAX {
                return Err(WorkloadError::new(
                    "driver.transactionRecords",
                    format!("must be 1 to {TRANSACTION_RECORDS_MAX} or null (got {n})"),
                ));
            }
            if !self.idempotence || self.acks != "all" {
                return Err(WorkloadError::new(
                    "driver.transactionRecords",
                    "transactions need idempotence: true and acks: all",
                ));
            }
        }
        if let Some(l) = &self.isolation_level {
            if !ISOLATION_LEVELS.contains(&l.as_str()) {
                return Err(WorkloadError::new(
                    "driver.isolationLevel",
                    format!("must be read_uncommitted or read_committed (got `{l}`)"),
                ));
            }
        }
        Ok(())
    }
}

/// Most records per transaction (`driver.transactionRecords`): a
/// transaction must end well within `transaction.timeout.ms`.
pub const TRANSACTION_RECORDS_MAX: u64 = 10_000_000;
/// The accepted values of `driver.isolationLevel`.
const ISOLATION_LEVELS: &[&str] = &["read_uncommitted", "read_committed"];

/// Accepts a YAML string or number as a string (`acks: 1` as well as
/// `acks: "1"`).
fn string_or_number<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string or an integer")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }
    d.deserialize_any(V)
}

/// Most `shareMaxRecords`.
pub const SHARE_MAX_RECORDS_MAX: u32 = 100_000;

/// Most `consumerProcessingMicros`: 1 s of work per record.
pub const PROCESSING_MICROS_MAX: u64 = 1_000_000;

/// What a subscription is (`subscriptionType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubscriptionType {
    /// `group` (the default): a consumer group; each partition is read by
    /// one member.
    #[default]
    Group,
    /// `share`: a share group; every member reads every partition, each
    /// record delivered to one member.
    Share,
}

/// Where records without a key go (`unkeyedPartitioner`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnkeyedPartitioner {
    /// `round_robin` (the default): the tool spreads them over the
    /// partitions in turn, each producer from its own.
    #[default]
    RoundRobin,
    /// `sticky`: the client's partitioner picks (one partition until its
    /// batch is sent, then another).
    Sticky,
}

/// How a share-group member's poll is bounded (`shareAcquireMode`, Kafka's
/// `share.acquire.mode` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareAcquireMode {
    /// `batch_optimized` (the default): whole batches.
    #[default]
    BatchOptimized,
    /// `record_limit`: at most `shareMaxRecords` records.
    RecordLimit,
}

/// How records are keyed (`keyDistributor`), with OMB's names and meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum KeyDistributor {
    /// `NO_KEY` (the default): records have no key.
    #[default]
    NoKey,
    /// `KEY_ROUND_ROBIN`: each producer cycles through a fixed set of keys.
    KeyRoundRobin,
    /// `RANDOM_NANO`: each record gets a key picked at random from a fixed
    /// set (OMB picks by the clock's nanoseconds).
    RandomNano,
}

impl fmt::Display for KeyDistributor {
    /// The YAML name: `NO_KEY`, `KEY_ROUND_ROBIN` or `RANDOM_NANO`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyDistributor::NoKey => "NO_KEY",
            KeyDistributor::KeyRoundRobin => "KEY_ROUND_ROBIN",
            KeyDistributor::RandomNano => "RANDOM_NANO",
        })
    }
}

/// A workload that breaks a semantic rule: which field (by its YAML name,
/// `driver.` fields prefixed) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadError {
    /// The field's YAML name, e.g. `partitionsPerTopic` or `driver.acks`.
    pub field: String,
    /// What is wrong, e.g. `must be at least 1 (got 0)`.
    pub message: String,
}

impl WorkloadError {
    fn new(field: &str, message: impl Into<String>) -> WorkloadError {
        WorkloadError {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

impl fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "field `{}`: {}", self.field, self.message)
    }
}

impl std::error::Error for WorkloadError {}

/// `Err` naming `field` unless `value` is finite and in `min..=max`
/// (`min` excluded if `min_exclusive`).
fn check_range(
    field: &str,
    value: f64,
    min: f64,
    min_exclusive: bool,
    max: f64,
) -> Result<(), WorkloadError> {
    let low_ok = if min_exclusive {
        value > min
    } else {
        value >= min
    };
    if value.is_finite() && low_ok && value <= max {
        return Ok(());
    }
    let low = if min_exclusive {
        format!("more than {min}")
    } else {
        format!("at least {min}")
    };
    Err(WorkloadError::new(
        field,
        format!("must be a number {low} and at most {max} (got {value})"),
    ))
}

/// Minutes as a duration; 0 for negative or NaN, saturating when huge.
fn minutes(m: f64) -> Duration {
    if m > 0.0 {
        Duration::try_from_secs_f64(m * 60.0).unwrap_or(Duration::MAX)
    } else {
        Duration::ZERO
    }
}

impl Workload {
    /// Parses a workload from YAML and [validates](Workload::validate) it.
    ///
    /// Errors start with `workload: ` and name the field: unknown, missing
    /// and ill-typed fields as serde_yaml reports them (with line and
    /// column), semantic errors as [`WorkloadError`]s.
    pub fn from_yaml(text: &str) -> anyhow::Result<Workload> {
        let w: Workload = serde_yaml::from_str(text).map_err(|e| anyhow!("workload: {e}"))?;
        w.validate().map_err(|e| anyhow!("workload: {e}"))?;
        Ok(w)
    }

    /// Reads, parses and validates the workload file at `path`. Errors
    /// name the path.
    pub fn load(path: &Path) -> anyhow::Result<Workload> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow!("workload {}: cannot read: {e}", path.display()))?;
        let w: Workload =
            serde_yaml::from_str(&text).map_err(|e| anyhow!("workload {}: {e}", path.display()))?;
        w.validate()
            .map_err(|e| anyhow!("workload {}: {e}", path.display()))?;
        Ok(w)
    }

    /// Checks the semantic rules given with each field; the error names
    /// the first field that breaks one.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.name.trim().is_empty() {
            return Err(WorkloadError::new("name", "must not be empty"));
        }
        if self.topics == 0 {
            return Err(WorkloadError::new("topics", "must be at least 1 (got 0)"));
        }
        if self.partitions_per_topic == 0 || self.partitions_per_topic > PARTITIONS_MAX {
            return Err(WorkloadError::new(
                "partitionsPerTopic",
                format!(
                    "must be at least 1 and at most {PARTITIONS_MAX} (got {})",
                    self.partitions_per_topic
                ),
            ));
        }
        if self.message_size == 0 || self.message_size > MESSAGE_SIZE_MAX {
            return Err(WorkloadError::new(
                "messageSize",
                format!(
                    "must be at least 1 and at most {MESSAGE_SIZE_MAX} (got {})",
                    self.message_size
                ),
            ));
        }
        check_range("randomBytesRatio", self.random_bytes_ratio, 0.0, false, 1.0)?;
        if self.use_randomized_payloads {
            let pool = self.payload_pool_size() as u64;
            let bytes = pool.saturating_mul(self.message_size as u64);
            if bytes > PAYLOAD_POOL_BYTES_MAX {
                return Err(WorkloadError::new(
                    "randomizedPayloadPoolSize",
                    format!(
                        "{pool} payloads of {} bytes take {bytes} bytes, more than the \
                         {PAYLOAD_POOL_BYTES_MAX} allowed",
                        self.message_size
                    ),
                ));
            }
        }
        if let Some(file) = &self.payload_file {
            if file.trim().is_empty() {
                return Err(WorkloadError::new(
                    "payloadFile",
                    "must not be empty (leave it out for a generated payload)",
                ));
            }
            if self.use_randomized_payloads {
                return Err(WorkloadError::new(
                    "payloadFile",
                    "cannot be combined with useRandomizedPayloads: true",
                ));
            }
        }
        if self.producers_per_topic == 0 && self.subscriptions_per_topic == 0 {
            return Err(WorkloadError::new(
                "producersPerTopic",
                "producersPerTopic and subscriptionsPerTopic are both 0: nothing to run",
            ));
        }
        if self.subscriptions_per_topic > 0 && self.consumer_per_subscription == 0 {
            return Err(WorkloadError::new(
                "consumerPerSubscription",
                format!(
                    "must be at least 1 when subscriptionsPerTopic is {} (got 0)",
                    self.subscriptions_per_topic
                ),
            ));
        }
        if self.consumer_processing_micros > PROCESSING_MICROS_MAX {
            return Err(WorkloadError::new(
                "consumerProcessingMicros",
                format!(
                    "must be at most {PROCESSING_MICROS_MAX} (got {})",
                    self.consumer_processing_micros
                ),
            ));
        }
        if let Some(n) = self.share_max_records {
            if n == 0 || n > SHARE_MAX_RECORDS_MAX {
                return Err(WorkloadError::new(
                    "shareMaxRecords",
                    format!("must be 1 to {SHARE_MAX_RECORDS_MAX} (got {n})"),
                ));
            }
        }
        check_range("producerRate", self.producer_rate, 0.0, false, f64::MAX)?;
        // Keeps backlog_bytes() within u64.
        check_range(
            "consumerBacklogSizeGB",
            self.consumer_backlog_size_gb,
            0.0,
            false,
            (1u64 << 33) as f64,
        )?;
        if self.consumer_backlog_size_gb > 0.0
            && (self.producers_per_topic == 0 || self.subscriptions_per_topic == 0)
        {
            return Err(WorkloadError::new(
                "consumerBacklogSizeGB",
                "a backlog needs producersPerTopic and subscriptionsPerTopic of at least 1",
            ));
        }
        check_range(
            "warmupDurationMinutes",
            self.warmup_duration_minutes,
            0.0,
            false,
            DURATION_MINUTES_MAX,
        )?;
        check_range(
            "testDurationMinutes",
            self.test_duration_minutes,
            0.0,
            true,
            DURATION_MINUTES_MAX,
        )?;
        self.driver.validate()
    }

    /// Overrides one field by its YAML name (`driver.` settings as
    /// `driver.lingerMs`), e.g. from the command line, then validates.
    ///
    /// `value` is read as a YAML scalar (`10`, `0.5`, `true`, `KEY_ROUND_ROBIN`,
    /// `null`, or an empty string for `null`); for text fields it is taken
    /// as written (`name` `123` is the text "123"). On error the workload is
    /// unchanged; an unknown name is refused with the list of valid ones, a
    /// value of the wrong type names the field and the value.
    pub fn set(&mut self, field: &str, value: &str) -> anyhow::Result<()> {
        self.set_all([(field, value)])
    }

    /// Applies several overrides as [`Workload::set`] does, in order, and
    /// validates once at the end, so that overrides which only make sense
    /// together (e.g. `producersPerTopic=0` and `subscriptionsPerTopic=1`)
    /// can be given in any order. On error the workload is unchanged.
    pub fn set_all<I, K, V>(&mut self, overrides: I) -> anyhow::Result<()>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut tree = serde_yaml::to_value(&*self)?;
        let mut applied = Vec::new();
        for (field, value) in overrides {
            let (field, value) = (field.as_ref(), value.as_ref());
            apply_override(&mut tree, field, value)?;
            applied.push(format!("{field}={value}"));
        }
        let w: Workload = serde_yaml::from_value(tree)
            .map_err(|e| anyhow!("override {}: {e}", applied.join(", ")))?;
        w.validate()
            .map_err(|e| anyhow!("override {}: {e}", applied.join(", ")))?;
        *self = w;
        Ok(())
    }

    /// The names [`Workload::set`] accepts: every field's YAML name, with
    /// the driver settings as `driver.<name>`.
    pub fn field_names() -> Vec<String> {
        let tree = serde_yaml::to_value(Workload::template()).expect("a workload serializes");
        leaf_names(&tree)
    }

    /// A valid workload, only used for its shape.
    fn template() -> Workload {
        Workload {
            name: "template".to_string(),
            topics: 1,
            partitions_per_topic: 1,
            message_size: 1,
            use_randomized_payloads: false,
            random_bytes_ratio: 0.0,
            randomized_payload_pool_size: 0,
            payload_file: None,
            key_distributor: KeyDistributor::NoKey,
            producers_per_topic: 1,
            subscriptions_per_topic: 1,
            consumer_per_subscription: 1,
            subscription_type: SubscriptionType::Group,
            consumer_processing_micros: 0,
            share_max_records: None,
            share_acquire_mode: ShareAcquireMode::BatchOptimized,
            unkeyed_partitioner: UnkeyedPartitioner::RoundRobin,
            producer_rate: 0.0,
            consumer_backlog_size_gb: 0.0,
            warmup_duration_minutes: 0.0,
            test_duration_minutes: 1.0,
            driver: DriverSettings::default(),
        }
    }

    /// `warmupDurationMinutes` as a duration.
    pub fn warmup(&self) -> Duration {
        minutes(self.warmup_duration_minutes)
    }

    /// `testDurationMinutes` as a duration.
    pub fn duration(&self) -> Duration {
        minutes(self.test_duration_minutes)
    }

    /// `consumerBacklogSizeGB` in bytes (GiB, as OMB counts), rounded to
    /// the nearest byte; 0 for no backlog.
    pub fn backlog_bytes(&self) -> u64 {
        let b = self.consumer_backlog_size_gb * GIB;
        if b > 0.0 {
            // `as` saturates.
            b.round() as u64
        } else {
            0
        }
    }

    /// The number of distinct randomized payloads:
    /// `randomizedPayloadPoolSize`, or [`DEFAULT_PAYLOAD_POOL_SIZE`] if it
    /// is 0.
    pub fn payload_pool_size(&self) -> usize {
        if self.randomized_payload_pool_size == 0 {
            DEFAULT_PAYLOAD_POOL_SIZE
        } else {
            self.randomized_payload_pool_size
        }
    }

    /// Reads `payloadFile` (`None` if it is not set): a relative path is
    /// taken relative to `base_dir` (e.g. the workload file's directory or
    /// the current directory). The file must hold exactly `messageSize`
    /// bytes.
    pub fn read_payload_file(&self, base_dir: &Path) -> anyhow::Result<Option<Vec<u8>>> {
        let Some(file) = &self.payload_file else {
            return Ok(None);
        };
        let path = base_dir.join(file);
        let bytes = std::fs::read(&path)
            .map_err(|e| anyhow!("payloadFile {}: cannot read: {e}", path.display()))?;
        if bytes.len() != self.message_size {
            bail!(
                "payloadFile {}: holds {} bytes but messageSize is {}",
                path.display(),
                bytes.len(),
                self.message_size
            );
        }
        Ok(Some(bytes))
    }

    /// Topics × partitions per topic.
    pub fn total_partitions(&self) -> u64 {
        u64::from(self.topics) * u64::from(self.partitions_per_topic)
    }

    /// Topics × producers per topic.
    pub fn total_producers(&self) -> u64 {
        u64::from(self.topics) * u64::from(self.producers_per_topic)
    }

    /// Topics × subscriptions per topic × consumers per subscription.
    pub fn total_consumers(&self) -> u64 {
        u64::from(self.topics)
            * u64::from(self.subscriptions_per_topic)
            * u64::from(self.consumer_per_subscription)
    }

    /// The topic names, `<name>-<i>` for `i` in `0..topics`: the name with
    /// every run of characters other than `[A-Za-z0-9._-]` replaced by one
    /// `-`, leading and trailing `-` removed (`workload` if nothing is
    /// left), and shortened so that each topic name fits the broker's limit
    /// of 249 bytes. Deterministic: the same workload name gives the same
    /// topics.
    pub fn topic_names(&self) -> Vec<String> {
        let mut base = String::with_capacity(self.name.len());
        let mut replaced = false;
        for c in self.name.chars() {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                if replaced {
                    base.push('-');
                    replaced = false;
                }
                base.push(c);
            } else {
                replaced = !base.is_empty();
            }
        }
        let mut base = base.trim_matches('-').to_string();
        if base.is_empty() {
            base = "workload".to_string();
        }
        let suffix_len = 1 + self.topics.saturating_sub(1).to_string().len();
        // The base is ASCII, so any byte index is a character boundary.
        base.truncate(TOPIC_NAME_BYTES_MAX - suffix_len);
        (0..self.topics).map(|i| format!("{base}-{i}")).collect()
    }
}

/// The settable names in a serialized workload: top-level keys, and the
/// keys of `driver` as `driver.<key>`.
fn leaf_names(tree: &Value) -> Vec<String> {
    let mut names = Vec::new();
    if let Value::Mapping(top) = tree {
        for (k, v) in top {
            let Some(k) = k.as_str() else { continue };
            match v {
                Value::Mapping(inner) if k == "driver" => {
                    names.extend(
                        inner
                            .keys()
                            .filter_map(Value::as_str)
                            .map(|ik| format!("driver.{ik}")),
                    );
                }
                _ => names.push(k.to_string()),
            }
        }
    }
    names
}

/// Sets `field` (a name from [`leaf_names`]) to `value` in the serialized
/// workload `tree`, checking that the result still deserializes.
fn apply_override(tree: &mut Value, field: &str, value: &str) -> anyhow::Result<()> {
    let names = leaf_names(tree);
    if !names.iter().any(|n| n == field) {
        let hint = names
            .iter()
            .find(|n| {
                n.eq_ignore_ascii_case(field)
                    || n.strip_prefix("driver.")
                        .is_some_and(|s| s.eq_ignore_ascii_case(field))
            })
            .map(|n| format!(" (did you mean `{n}`?)"))
            .unwrap_or_default();
        bail!(
            "unknown workload field `{field}`{hint}; valid names: {}",
            names.join(", ")
        );
    }
    let old = set_slot(tree, field).clone();
    let parsed = serde_yaml::from_str::<Value>(value).unwrap_or_else(|_| text(value));
    let mut candidates = vec![parsed.clone()];
    if !matches!(parsed, Value::String(_)) {
        // A text field given a value YAML reads as a number, bool or null.
        candidates.push(text(value));
    }
    let mut first_err = None;
    for candidate in candidates {
        *set_slot(tree, field) = candidate;
        match serde_yaml::from_value::<Workload>(tree.clone()) {
            Ok(_) => return Ok(()),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    *set_slot(tree, field) = old;
    let e = first_err.expect("at least one candidate was tried");
    bail!("invalid value `{value}` for workload field `{field}`: {e}")
}

fn text(value: &str) -> Value {
    Value::String(value.to_string())
}

fn driver_slot<'a>(top: &'a mut Mapping, inner: &str) -> Option<&'a mut Value> {
    top.get_mut("driver")?.as_mapping_mut()?.get_mut(inner)
}

/// The value of a field known to exist in `tree`.
fn set_slot<'a>(tree: &'a mut Value, field: &str) -> &'a mut Value {
    let top = tree.as_mapping_mut().expect("a workload is a mapping");
    match field.strip_prefix("driver.") {
        Some(inner) => driver_slot(top, inner),
        None => top.get_mut(field),
    }
    .expect("the field exists")
}
