//! The `--driver kafka` side of `weir-bench`: the same workloads through a
//! Kafka client library (librdkafka, by the `rdkafka` crate, built from its
//! bundled sources), so one tool drives Weir's Kafka listener, Weir's
//! native listener, Apache Kafka or Redpanda, like for like.
//!
//! The workload's driver settings map onto librdkafka's names: `acks`,
//! `linger.ms`, `batch.size`, `compression.type` (none, lz4, zstd),
//! `enable.idempotence` (with `acks: all` only, as the Weir SDK does),
//! `max.in.flight.requests.per.connection`, and `bufferMemory` as
//! `queue.buffering.max.kbytes`. Topics are made with the Kafka admin API
//! (CreateTopics, `--replication-factor`) with the workload's topic configs.
//! Producers are `ThreadedProducer`s whose delivery reports go to a
//! callback (no future per record). Consumers are group members
//! (`enable.auto.commit` every second, `auto.offset.reset=earliest`,
//! `fetch.wait.max.ms=100`, as the Weir SDK's consumers in the benchmark).

use std::time::Duration;

use anyhow::{bail, Context};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::util::Timeout;

use crate::workload::DriverSettings;

/// Most records librdkafka may queue per producer (its own default is
/// 100 000): the byte bound (`bufferMemory`) is the one that applies, as
/// for the Weir SDK.
const QUEUE_MESSAGES_MAX: u32 = 10_000_000;

/// How long a producer waits before offering a record again when
/// librdkafka's queue is full (librdkafka has no wait to await).
const QUEUE_FULL_BACKOFF: Duration = Duration::from_millis(1);

/// How long a record may wait for room in librdkafka's queue before its
/// send fails (Kafka's `max.block.ms` default), so that an unreachable
/// broker ends the run with errors rather than holding it.
const QUEUE_FULL_WAIT_MAX: Duration = Duration::from_secs(60);

/// How long the end of a run waits for librdkafka to deliver what it has
/// queued.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// What a producer's delivery reports go to: called on librdkafka's
/// polling thread with the record's intended send time (µs), its value's
/// size and the outcome.
pub type OnDelivery = Box<dyn Fn(u64, u64, Result<(), String>) + Send + Sync>;

/// The producer's context: hands each delivery report to [`OnDelivery`]
/// (no future or channel per record).
pub struct Reports {
    on_delivery: OnDelivery,
}

impl rdkafka::ClientContext for Reports {}

impl ProducerContext for Reports {
    /// The intended send time (µs): carried in the opaque pointer itself,
    /// so a record costs no allocation of ours.
    type DeliveryOpaque = usize;

    fn delivery(&self, r: &DeliveryResult<'_>, intended_us: usize) {
        let (bytes, outcome) = match r {
            Ok(m) => (m.payload_len(), Ok(())),
            Err((e, m)) => (m.payload_len(), Err(e.to_string())),
        };
        (self.on_delivery)(intended_us as u64, bytes as u64, outcome);
    }
}

/// A librdkafka producer configured from the workload's driver settings.
pub struct KafkaProducer {
    inner: ThreadedProducer<Reports>,
}

impl KafkaProducer {
    /// Creates the producer (it connects on first use); its delivery
    /// reports go to `on_delivery`.
    /// With `transactional_id` (the workload's `transactionRecords`), the
    /// producer is transactional: call [`KafkaProducer::init_transactions`]
    /// before sending.
    pub fn new(
        bootstrap: &str,
        d: &DriverSettings,
        extra: &[(String, String)],
        transactional_id: Option<&str>,
        on_delivery: OnDelivery,
    ) -> anyhow::Result<KafkaProducer> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", bootstrap)
            .set("client.id", "weir-bench")
            .set("acks", &d.acks)
            .set("linger.ms", d.linger_ms.to_string())
            .set("batch.size", d.batch_size.max(1).to_string())
            .set("compression.type", &d.compression)
            .set(
                "enable.idempotence",
                (d.idempotence && d.acks == "all").to_string(),
            )
            .set(
                "max.in.flight.requests.per.connection",
                d.max_in_flight.to_string(),
            )
            .set(
                "queue.buffering.max.kbytes",
                (d.buffer_memory / 1024).max(1).to_string(),
            )
            .set(
                "queue.buffering.max.messages",
                QUEUE_MESSAGES_MAX.to_string(),
            )
            .set("partitioner", "murmur2_random");
        if let Some(id) = transactional_id {
            c.set("transactional.id", id);
        }
        apply(&mut c, extra);
        let inner = c
            .create_with_context(Reports { on_delivery })
            .with_context(|| format!("creating a librdkafka producer for {bootstrap}"))?;
        Ok(KafkaProducer { inner })
    }

    /// Queues one record (its delivery report comes to the callback with
    /// `intended_us` and its value's size); waits while librdkafka's queue
    /// is full.
    #[allow(clippy::too_many_arguments)]
    pub async fn send(
        &self,
        topic: &str,
        partition: Option<u32>,
        key: Option<&[u8]>,
        value: &[u8],
        timestamp_ms: i64,
        intended_us: u64,
    ) -> Result<(), KafkaError> {
        let mut r = BaseRecord::<[u8], [u8], usize>::with_opaque_to(topic, intended_us as usize)
            .payload(value)
            .timestamp(timestamp_ms);
        if let Some(k) = key {
            r = r.key(k);
        }
        if let Some(p) = partition {
            r = r.partition(p as i32);
        }
        let deadline = std::time::Instant::now() + QUEUE_FULL_WAIT_MAX;
        loop {
            match self.inner.send(r) {
                Ok(()) => return Ok(()),
                Err((e @ KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                    if std::time::Instant::now() >= deadline =>
                {
                    return Err(e)
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    r = back;
                    tokio::time::sleep(QUEUE_FULL_BACKOFF).await;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Waits until everything queued is delivered (or failed).
    pub fn flush(&self) -> Result<(), KafkaError> {
        self.inner.flush(Timeout::After(FLUSH_TIMEOUT))
    }

    /// A transactional producer's InitProducerId, then its first
    /// transaction begun (blocks the thread).
    pub fn init_transactions(&self) -> Result<(), KafkaError> {
        self.inner
            .init_transactions(Timeout::After(TRANSACTION_TIMEOUT))?;
        self.inner.begin_transaction()
    }

    /// Commits the transaction under way (its records delivered first)
    /// and begins the next one, unless `last` (blocks the thread).
    pub fn commit_transaction(&self, last: bool) -> Result<(), KafkaError> {
        // rdkafka's commit flushes first, polling up to 100 ms at a time
        // for events that the threaded producer's own thread takes: every
        // commit took ≥ 100 ms. Waiting here for librdkafka's queue to
        // drain (the thread serves the delivery reports) leaves its flush
        // nothing to wait for.
        let deadline = std::time::Instant::now() + TRANSACTION_TIMEOUT;
        while self.inner.in_flight_count() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
        self.inner
            .commit_transaction(Timeout::After(TRANSACTION_TIMEOUT))?;
        if last {
            Ok(())
        } else {
            self.inner.begin_transaction()
        }
    }

    /// Aborts the transaction under way (after a failed commit) and
    /// begins the next one (blocks the thread).
    pub fn abort_transaction(&self) -> Result<(), KafkaError> {
        self.inner
            .abort_transaction(Timeout::After(TRANSACTION_TIMEOUT))?;
        self.inner.begin_transaction()
    }
}

/// How long a transaction's init, commit or abort may take.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// Sets the user's librdkafka properties (`--kafka-config`) over ours.
fn apply(c: &mut ClientConfig, extra: &[(String, String)]) {
    for (k, v) in extra {
        c.set(k, v);
    }
}

/// Creates the topics through the Kafka admin API, with the workload's
/// topic configs.
pub async fn create_topics(
    bootstrap: &str,
    topics: &[String],
    partitions: u32,
    replication_factor: u32,
    configs: &[(String, String)],
    extra: &[(String, String)],
) -> anyhow::Result<()> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    apply(&mut c, extra);
    let admin: AdminClient<DefaultClientContext> = c
        .create()
        .with_context(|| format!("creating a librdkafka admin client for {bootstrap}"))?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            configs.iter().fold(
                NewTopic::new(
                    t,
                    partitions as i32,
                    TopicReplication::Fixed(replication_factor as i32),
                ),
                |n, (k, v)| n.set(k, v),
            )
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Timeout::After(Duration::from_secs(30))));
    let results = admin
        .create_topics(&new, &opts)
        .await
        .with_context(|| format!("CreateTopics to {bootstrap}"))?;
    for r in results {
        if let Err((topic, code)) = r {
            bail!("creating topic {topic} on {bootstrap}: {code}");
        }
    }
    Ok(())
}

/// A consumer's context: notes when the group first gave it an
/// assignment (possibly empty: a member beyond the partition count).
#[derive(Default)]
pub struct Joined {
    flag: std::sync::atomic::AtomicBool,
}

impl Joined {
    /// Whether the member has had its first assignment.
    pub fn joined(&self) -> bool {
        self.flag.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl rdkafka::ClientContext for Joined {}

impl ConsumerContext for Joined {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if matches!(rebalance, Rebalance::Assign(_)) {
            self.flag.store(true, std::sync::atomic::Ordering::Release);
        }
    }
}

/// How long librdkafka waits before fetching again once its local queue is
/// over `queued.max.messages.kbytes` (librdkafka's default: 1000 ms). With
/// a broker that answers a 8 MB fetch in under a millisecond, the queue
/// fills at once; the default then idles the consumer for most of each
/// second (bursts of fetches a second apart, the drain 2-4x slower), as
/// librdkafka's own docs for the property warn.
const FETCH_QUEUE_BACKOFF_MS: u32 = 10;

/// A group member reading `topic` from the earliest offset where its group
/// has no commit; its context tells when it joined. The caller polls it
/// (on a thread of its own: librdkafka's poll blocks).
/// `isolation`: `isolation.level` if set (else librdkafka's default,
/// read_committed).
pub fn group_consumer(
    bootstrap: &str,
    group: &str,
    topic: &str,
    isolation: Option<&str>,
    extra: &[(String, String)],
) -> anyhow::Result<BaseConsumer<Joined>> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("client.id", "weir-bench")
        .set("group.id", group)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS.to_string());
    if let Some(level) = isolation {
        c.set("isolation.level", level);
    }
    apply(&mut c, extra);
    let c: BaseConsumer<Joined> = c
        .create_with_context(Joined::default())
        .with_context(|| format!("creating a librdkafka consumer for {bootstrap}"))?;
    c.subscribe(&[topic])
        .with_context(|| format!("subscribing to {topic}"))?;
    Ok(c)
}
