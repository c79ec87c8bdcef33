//! Running a workload: topics, producers (rate-limited from intended send
//! times), consumers, the per-second reporter, the report.
//!
//! ## Measurement
//! * A rate-limited producer gives record `k` the intended send time
//!   `start + k / rate`; it waits for that moment if it is early and sends
//!   at once if it is late. **Publish latency** runs from the intended
//!   time to the acknowledgement, so a stall that delays sends (a full
//!   buffer, a slow broker) is charged to every record it delayed — no
//!   coordinated omission. **Publish delay** is the actual minus the
//!   intended send time (as in the OpenMessaging Benchmark). At producer
//!   rate 0 (as fast as possible) the intended time is the actual one.
//! * The intended send time (µs since the Unix epoch) is written into the
//!   first 8 bytes of each value (values shorter than 8 bytes use the
//!   record timestamp, in ms); **end-to-end latency** is the consume time
//!   minus that.
//! * Histograms are in µs; only the measured phase (after the warm-up)
//!   counts in the totals and percentiles; every second of the run is an
//!   interval of the report.
//! * A producer's acknowledgements are observed in send order, so a record
//!   acknowledged before an earlier one is charged until the earlier one
//!   is acknowledged (a slight overestimate, never an underestimate).
//!
//! ## Consumers
//! Each subscription is a consumer group (`<topic>-sub-<n>`) whose
//! `consumerPerSubscription` members are `GroupConsumer`s: the broker
//! assigns the partitions (cooperative-sticky; members beyond the
//! partition count stay idle), so every subscription reads every record.
//! Members auto-commit every second and before a partition is revoked, so
//! a partition that moves while the group forms is resumed where its
//! previous owner stopped. Topics are fresh for each run, so every member
//! starts at the earliest offset where nothing is committed.
//!
//! With `subscriptionType: share` a subscription is a share group
//! (`<topic>-share-<n>`) of `ShareConsumer`s (implicit acknowledgement:
//! a poll's records are accepted by the next poll): every member reads
//! every partition, each record delivered to one of them. A share group
//! starts at the log's end (the broker's `--share-auto-offset-reset`), so
//! its members open their share sessions before the producers start.
//! `consumerProcessingMicros` makes each record cost its consumer that
//! much waiting after each poll (a call to another service, say).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use hdrhistogram::Histogram;
use weir_client::{
    Client, DeliveryFuture, GroupConsumer, GroupConsumerConfig, OffsetReset, Producer,
    ProducerRecord,
};

use crate::report::{Interval, Machine, Percentiles, Report, Totals};
use crate::stages;
use crate::workload::{
    KeyDistributor, ShareAcquireMode, SubscriptionType, UnkeyedPartitioner, Workload,
};

/// What to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Producers only.
    Produce,
    /// Prepare a backlog (`consumerBacklogSizeGB`, at least one test
    /// duration's worth at the producer rate if unset), then measure the
    /// consumers draining it.
    Consume,
    /// Producers and consumers together.
    EndToEnd,
}

impl Mode {
    /// The report's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Produce => "produce",
            Mode::Consume => "consume",
            Mode::EndToEnd => "end-to-end",
        }
    }
}

/// Which client library drives the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// The Weir SDK, on Weir's native protocol.
    Weir,
    /// librdkafka (the `rdkafka` crate), on the Kafka protocol: Weir's
    /// Kafka listener, Apache Kafka, Redpanda.
    Kafka,
    /// OpenTelemetry exports to an OTLP receiver ([`crate::otlp`]): each
    /// record one span; produce only.
    Otlp(crate::otlp::Transport),
}

impl Driver {
    /// Its name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Driver::Weir => "weir",
            Driver::Kafka => "kafka",
            Driver::Otlp(crate::otlp::Transport::Grpc) => "otlp-grpc",
            Driver::Otlp(crate::otlp::Transport::Http) => "otlp-http",
        }
    }
}

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// What to run.
    pub mode: Mode,
    /// The client library.
    pub driver: Driver,
    /// The broker (its native listener for [`Driver::Weir`], a Kafka
    /// listener for [`Driver::Kafka`]).
    pub bootstrap: SocketAddr,
    /// librdkafka properties set over the driver's (`--kafka-config`).
    pub kafka_config: Vec<(String, String)>,
    /// The OTLP receiver of [`Driver::Otlp`] (`bootstrap` stays the native
    /// listener: topics are made there).
    pub otlp: Option<SocketAddr>,
    /// "embedded", "discard" or the bootstrap address, for the report.
    pub target: String,
    /// Print a progress line each second.
    pub progress: bool,
    /// Set to stop early (Ctrl-C); the report is still written.
    pub stop: Arc<AtomicBool>,
    /// Suffix of the topic names (unique per run).
    pub run_id: String,
    /// Where a relative `payloadFile` is looked up (the workload file's
    /// directory).
    pub workload_dir: std::path::PathBuf,
    /// The broker's metrics endpoint (`GET /metrics`): its produce stages
    /// over the measured phase go into the report.
    pub broker_metrics: Option<SocketAddr>,
    /// Replicas of each partition of the topics the run creates.
    pub replication_factor: u32,
    /// Connection settings of the Weir SDK (driver weir): TLS
    /// (`--command-config`).
    pub client: weir_client::ClientConfig,
    /// How a rate-limited producer waits for its next record's time.
    pub pacing: Pacing,
}

/// How a rate-limited producer waits between records due less than 1 ms
/// apart (longer waits are timer sleeps either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Pacing {
    /// The producer runs on a thread of its own and sleeps (a precise
    /// `nanosleep`, 1 µs timer slack) until its next record is due: it
    /// leaves the CPUs to whatever shares them — the broker, when both run
    /// on one machine. A halted vCPU takes a while to wake on some VMs;
    /// that shows in the latencies, as it would for any sleeping client.
    #[default]
    Sleep,
    /// The producer spins until its next record is due, giving the CPU to
    /// any other runnable thread on each turn (`sched_yield`): the lowest
    /// latencies when the load generator has CPUs of its own (`taskset`),
    /// a whole CPU taken from anything it shares one with.
    Spin,
}

impl Pacing {
    /// The name the report prints (`--pacing` takes the same, through
    /// clap's `ValueEnum`).
    pub fn name(self) -> &'static str {
        match self {
            Pacing::Sleep => "sleep",
            Pacing::Spin => "spin",
        }
    }
}

/// Microseconds since the Unix epoch.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 1 hour, 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

/// A pair of histograms: the current interval's and the measured phase's.
struct Hist {
    interval: Histogram<u64>,
    total: Histogram<u64>,
    merged_at: Instant,
}

/// How often a task's histograms are merged into the shared ones while it
/// runs: a merge walks and resets every bucket (~23 000 of them), which
/// per chunk of records cost 5 % of the CPU of a 100-byte produce.
const MERGE_EVERY: Duration = Duration::from_millis(20);

impl Hist {
    fn new() -> Hist {
        Hist {
            interval: histogram(),
            total: histogram(),
            merged_at: Instant::now(),
        }
    }

    /// Whether [`MERGE_EVERY`] has passed since the last merge.
    fn merge_due(&self) -> bool {
        self.merged_at.elapsed() >= MERGE_EVERY
    }

    /// Adds this task's samples to the shared histograms and starts over.
    fn merge_into(&mut self, shared: &Mutex<Hist>) {
        {
            let mut h = shared.lock().expect("histogram");
            let _ = h.interval.add(&self.interval);
            let _ = h.total.add(&self.total);
        }
        self.interval.reset();
        self.total.reset();
        self.merged_at = Instant::now();
    }

    fn record(&mut self, us: u64, measured: bool) {
        let v = us.clamp(1, 3_600_000_000);
        let _ = self.interval.record(v);
        if measured {
            let _ = self.total.record(v);
        }
    }
}

/// Counter values at one moment: published, published bytes, publish
/// errors, consumed, consumed bytes.
type Counts = (u64, u64, u64, u64, u64);

/// Everything the tasks update and the reporter reads.
struct Shared {
    /// Connection settings of the Weir SDK's clients.
    client: weir_client::ClientConfig,
    published: AtomicU64,
    published_bytes: AtomicU64,
    publish_errors: AtomicU64,
    consumed: AtomicU64,
    consumed_bytes: AtomicU64,
    publish_latency: Mutex<Hist>,
    publish_delay: Mutex<Hist>,
    e2e: Mutex<Hist>,
    /// Set when the measured phase started (after the warm-up).
    measuring: AtomicBool,
    /// Producers stop sending.
    stop_producing: AtomicBool,
    /// Consumers stop.
    stop_consuming: AtomicBool,
    first_error: Mutex<Option<String>>,
    /// Write the intended send time into each value (end-to-end latency is
    /// measured).
    stamp_values: bool,
    /// When a consumer last got records (µs since the epoch).
    last_consume_us: AtomicU64,
    /// Consumers that joined their group (had a first assignment).
    consumers_joined: AtomicU64,
    /// The workload's `payloadFile`, if it has one: every value.
    payload_file: Option<Bytes>,
    /// The Weir SDK producers (their statistics give the client's stages).
    weir_producers: Mutex<Vec<Arc<Producer>>>,
    /// Transactions committed (a transactional workload).
    transactions: AtomicU64,
}

impl Shared {
    fn measured(&self) -> bool {
        self.measuring.load(Ordering::Relaxed)
    }

    fn counts(&self) -> Counts {
        (
            self.published.load(Ordering::Relaxed),
            self.published_bytes.load(Ordering::Relaxed),
            self.publish_errors.load(Ordering::Relaxed),
            self.consumed.load(Ordering::Relaxed),
            self.consumed_bytes.load(Ordering::Relaxed),
        )
    }

    /// Keeps the first publish error for the report.
    fn note_error(&self, e: &dyn std::fmt::Display) {
        self.first_error
            .lock()
            .expect("error")
            .get_or_insert_with(|| e.to_string());
    }
}

/// The values producers send: a pool of payloads (random bytes as the
/// workload says, constant otherwise).
fn payloads(w: &Workload) -> Vec<Vec<u8>> {
    let size = w.message_size;
    if !w.use_randomized_payloads {
        return vec![vec![b'x'; size]];
    }
    let pool = w.payload_pool_size();
    let random = ((size as f64) * w.random_bytes_ratio.clamp(0.0, 1.0)) as usize;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ now_us();
    (0..pool)
        .map(|_| {
            let mut v = vec![b'x'; size];
            for b in v.iter_mut().take(random) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            v
        })
        .collect()
}

/// Where a producer sends: the Weir SDK or librdkafka (with the tally its
/// delivery reports go to).
enum Sender {
    Weir(Arc<Producer>),
    /// The Weir SDK's transactional producer (`driver.transactionRecords`).
    WeirTxn(weir_client::transactional::TransactionalProducer),
    Kafka(crate::kafka::KafkaProducer, Arc<DeliveryTally>),
    /// OTLP exports (their answers go to the tally, per span).
    Otlp(crate::otlp::OtlpProducer, Arc<DeliveryTally>),
}

/// Delivery reports that arrive by callback — librdkafka's (on its
/// polling thread) or OTLP exports' answers (per span) — of one producer,
/// added to the shared totals every [`CHUNK`] reports or 1 ms (and at the
/// end).
struct DeliveryTally {
    shared: Arc<Shared>,
    local: Mutex<(Hist, u64, u64, u64, Instant)>,
}

impl DeliveryTally {
    fn new(shared: Arc<Shared>) -> Arc<DeliveryTally> {
        Arc::new(DeliveryTally {
            shared,
            local: Mutex::new((Hist::new(), 0, 0, 0, Instant::now())),
        })
    }

    fn report(&self, intended_us: u64, bytes: u64, outcome: Result<(), String>) {
        let mut l = self.local.lock().expect("tally");
        match outcome {
            Ok(()) => {
                let measured = self.shared.measured();
                l.0.record(now_us().saturating_sub(intended_us), measured);
                l.1 += 1;
                l.2 += bytes;
            }
            Err(e) => {
                l.3 += 1;
                self.shared.note_error(&e);
            }
        }
        if l.1 + l.3 >= CHUNK as u64 || l.4.elapsed() >= Duration::from_millis(1) {
            self.flush_locked(&mut l, false);
        }
    }

    fn flush(&self) {
        let mut l = self.local.lock().expect("tally");
        self.flush_locked(&mut l, true);
    }

    /// Adds the counts to the shared ones, and the histogram once it is
    /// due (or `all`).
    fn flush_locked(&self, l: &mut (Hist, u64, u64, u64, Instant), all: bool) {
        if all || l.0.merge_due() {
            l.0.merge_into(&self.shared.publish_latency);
        }
        self.shared.published.fetch_add(l.1, Ordering::Relaxed);
        self.shared
            .published_bytes
            .fetch_add(l.2, Ordering::Relaxed);
        self.shared.publish_errors.fetch_add(l.3, Ordering::Relaxed);
        (l.1, l.2, l.3, l.4) = (0, 0, 0, Instant::now());
    }
}

impl Sender {
    async fn connect(
        driver: Driver,
        (bootstrap, otlp, topic): (SocketAddr, Option<SocketAddr>, &str),
        w: &Workload,
        extra: &[(String, String)],
        shared: &Arc<Shared>,
        index: u64,
    ) -> anyhow::Result<Sender> {
        Ok(match driver {
            Driver::Otlp(transport) => {
                let tally = DeliveryTally::new(shared.clone());
                let reports = tally.clone();
                let addr = otlp.context("the OTLP drivers need the receiver's address")?;
                let p = crate::otlp::OtlpProducer::connect(
                    transport,
                    addr,
                    topic,
                    w.driver.otlp_spans_per_export,
                    Duration::from_millis(w.driver.linger_ms),
                    w.driver.max_in_flight,
                    Arc::new(move |intended, bytes, outcome| {
                        reports.report(intended, bytes, outcome)
                    }),
                )
                .await?;
                Sender::Otlp(p, tally)
            }
            Driver::Weir if w.driver.transaction_records.is_some() => {
                let id = format!("weir-bench-{}-{index}", std::process::id());
                let p = weir_client::transactional::TransactionalProducer::connect(
                    bootstrap,
                    shared.client.clone(),
                    w.driver.producer_config(),
                    &id,
                )
                .await?;
                p.init_transactions()
                    .await
                    .with_context(|| format!("init_transactions to {bootstrap}"))?;
                p.begin_transaction()?;
                Sender::WeirTxn(p)
            }
            Driver::Weir => {
                let client = Client::connect_with(bootstrap, shared.client.clone()).await?;
                let p = Arc::new(Producer::new(client, w.driver.producer_config()));
                shared
                    .weir_producers
                    .lock()
                    .expect("producers")
                    .push(p.clone());
                Sender::Weir(p)
            }
            Driver::Kafka => {
                let tally = DeliveryTally::new(shared.clone());
                let reports = tally.clone();
                // One transactional id per producer of this run.
                let id = w
                    .driver
                    .transaction_records
                    .map(|_| format!("weir-bench-{}-{index}", std::process::id()));
                let p = crate::kafka::KafkaProducer::new(
                    &bootstrap.to_string(),
                    &w.driver,
                    extra,
                    id.as_deref(),
                    Box::new(move |intended, bytes, outcome| {
                        reports.report(intended, bytes, outcome)
                    }),
                )?;
                if id.is_some() {
                    blocking(|| p.init_transactions())
                        .with_context(|| format!("init_transactions to {bootstrap}"))?;
                }
                Sender::Kafka(p, tally)
            }
        })
    }

    /// Sends a record; the Weir SDK's acknowledgement to await, or `None`
    /// where the delivery report goes to the producer's callback
    /// (librdkafka).
    async fn send(
        &self,
        record: ProducerRecord,
        intended_us: u64,
    ) -> Result<Option<DeliveryFuture>, String> {
        match self {
            Sender::Weir(p) => p.send(record).await.map(Some).map_err(|e| e.to_string()),
            Sender::WeirTxn(p) => p.send(record).await.map(Some).map_err(|e| e.to_string()),
            Sender::Otlp(p, _) => {
                p.send(record.value.as_deref().unwrap_or_default(), intended_us)
                    .await;
                Ok(None)
            }
            Sender::Kafka(p, _) => p
                .send(
                    &record.topic,
                    record.partition,
                    record.key.as_deref(),
                    record.value.as_deref().unwrap_or_default(),
                    record.timestamp.unwrap_or(0),
                    intended_us,
                )
                .await
                .map(|()| None)
                .map_err(|e| e.to_string()),
        }
    }

    /// Commits the transaction under way (and begins the next unless
    /// `last`); a failed commit is counted as an error and the
    /// transaction aborted.
    async fn commit(&self, shared: &Shared, last: bool) {
        let committed = match self {
            Sender::WeirTxn(p) => p.commit_transaction().await.map_err(|e| e.to_string()),
            Sender::Kafka(p, tally) => {
                // librdkafka's commit blocks its thread until the records
                // are delivered and the transaction has ended (and begins
                // the next unless `last`).
                let r = blocking(|| p.commit_transaction(last));
                tally.flush();
                r.map_err(|e| e.to_string())
            }
            Sender::Weir(_) | Sender::Otlp(..) => return,
        };
        match committed {
            Ok(()) => {
                shared.transactions.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                shared.note_error(&format!("commit_transaction: {e}"));
                shared.publish_errors.fetch_add(1, Ordering::Relaxed);
                let aborted = match self {
                    Sender::WeirTxn(p) => p.abort_transaction().await.map_err(|e| e.to_string()),
                    // librdkafka's abort begins the next transaction.
                    Sender::Kafka(p, _) if !last => {
                        blocking(|| p.abort_transaction()).map_err(|e| e.to_string())
                    }
                    _ => Ok(()),
                };
                if let Err(e) = aborted {
                    shared.note_error(&format!("abort_transaction: {e}"));
                }
            }
        }
        if let (Sender::WeirTxn(p), false) = (self, last) {
            if let Err(e) = p.begin_transaction() {
                shared.note_error(&format!("begin_transaction: {e}"));
            }
        }
    }

    /// Sends what is buffered and waits for it.
    async fn flush(&self) {
        match self {
            Sender::Weir(p) => p.flush().await,
            Sender::WeirTxn(p) => p.flush().await,
            Sender::Kafka(p, tally) => {
                // librdkafka's flush blocks its thread.
                let _ = blocking(|| p.flush());
                tally.flush();
            }
            Sender::Otlp(p, tally) => {
                p.flush().await;
                tally.flush();
            }
        }
    }

    async fn close(&self) {
        match self {
            Sender::Weir(p) => p.close().await,
            Sender::WeirTxn(p) => p.close().await,
            Sender::Kafka(..) | Sender::Otlp(..) => {}
        }
    }
}

/// What one producer task does.
struct ProducerJob {
    w: Arc<Workload>,
    topic: Arc<str>,
    /// Records/s; 0: as fast as possible.
    rate: f64,
    driver: Driver,
    bootstrap: SocketAddr,
    otlp: Option<SocketAddr>,
    kafka_config: Arc<[(String, String)]>,
    shared: Arc<Shared>,
    /// Distinguishes producers (spreads their partitions and keys).
    index: u64,
    /// How the rate loop waits (`rate` > 0).
    pacing: Pacing,
    /// Stop after this many bytes of values (backlog preparation).
    limit_bytes: Option<u64>,
}

/// Records per chunk handed from a producer to its acker.
const CHUNK: usize = 512;

/// Runs librdkafka's blocking calls: off the runtime's workers on the
/// run's (multi-thread) runtime, in place on a producer's own thread.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Starts a producer: a task of the run's runtime, or — rate-limited with
/// [`Pacing::Sleep`] — a thread of its own with a one-thread runtime, so
/// that its sleeps between records block nothing else.
fn spawn_producer(job: ProducerJob) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    if job.rate <= 0.0 || job.pacing != Pacing::Sleep {
        return tokio::spawn(produce(job));
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("weir-bench-producer".into())
        .spawn(move || {
            // Sleeps end when due, not up to 50 µs later (the default
            // timer slack): at 50 000 records/s they are 20 µs apart.
            // SAFETY: prctl(PR_SET_TIMERSLACK) only sets this thread's
            // timer slack; it reads no memory of ours.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
            let outcome = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting a producer's runtime")
                .and_then(|rt| rt.block_on(produce(job)));
            let _ = tx.send(outcome);
        });
    tokio::spawn(async move {
        thread.context("starting a producer's thread")?;
        rx.await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("a producer's thread panicked")))
    })
}

/// One producer: sends `rate` records/s (0: as fast as possible) until
/// told to stop; an acker task records when each was acknowledged.
async fn produce(job: ProducerJob) -> anyhow::Result<()> {
    let ProducerJob {
        w,
        topic,
        rate,
        driver,
        bootstrap,
        otlp,
        kafka_config,
        shared,
        index,
        pacing,
        limit_bytes,
    } = job;
    let partitions = w.partitions_per_topic;
    let p = Sender::connect(
        driver,
        (bootstrap, otlp, &topic),
        &w,
        &kafka_config,
        &shared,
        index,
    )
    .await?;
    let per_txn = w.driver.transaction_records;
    let mut in_txn: u64 = 0;
    let pool: Vec<Bytes> = match &shared.payload_file {
        Some(p) => vec![p.clone()],
        None => payloads(&w).into_iter().map(Bytes::from).collect(),
    };
    // Sent records travel to the acker in chunks (one channel operation per
    // chunk); the acker awaits them in order on another thread, so their
    // acknowledgements are observed as they happen, and merges its
    // histogram into the shared one once per chunk.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<(u64, u64, DeliveryFuture)>>(256);
    let acker = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut local = Hist::new();
            // The SDK's completion time of the last record: a batch's
            // records share it, converted once.
            let mut last_done: Option<(SystemTime, u64)> = None;
            while let Some(chunk) = rx.recv().await {
                let (mut ok, mut bytes_ok, mut failed) = (0u64, 0u64, 0u64);
                // A record's latency ends when the SDK learned of its
                // acknowledgement (`completed_at`: a Kafka producer's
                // callback time, OMB's measure), not when this task gets
                // to look — the chunk reaches it up to ~1 ms after its
                // first record was sent, and it shares the CPUs.
                for (intended, bytes, mut f) in chunk {
                    let outcome = match f.try_offset() {
                        Some(r) => r,
                        None => (&mut f).await.map(|m| m.offset),
                    };
                    match outcome {
                        Ok(_) => {
                            let done = match (f.completed_at(), last_done) {
                                (Some(t), Some((l, us))) if l == t => us,
                                (Some(t), _) => {
                                    let us = t
                                        .duration_since(UNIX_EPOCH)
                                        .map_or_else(|_| now_us(), |d| d.as_micros() as u64);
                                    last_done = Some((t, us));
                                    us
                                }
                                (None, _) => now_us(),
                            };
                            local.record(done.saturating_sub(intended), shared.measured());
                            ok += 1;
                            bytes_ok += bytes;
                        }
                        Err(e) => {
                            failed += 1;
                            shared.note_error(&e);
                        }
                    }
                }
                if local.merge_due() {
                    local.merge_into(&shared.publish_latency);
                }
                shared.published.fetch_add(ok, Ordering::Relaxed);
                shared
                    .published_bytes
                    .fetch_add(bytes_ok, Ordering::Relaxed);
                shared.publish_errors.fetch_add(failed, Ordering::Relaxed);
            }
            local.merge_into(&shared.publish_latency);
        })
    };
    // The intended send time goes into each value only if someone reads
    // it (end-to-end latency); otherwise values are shared, not copied.
    let stamp = shared.stamp_values;
    let mut chunk: Vec<(u64, u64, DeliveryFuture)> = Vec::with_capacity(CHUNK);
    let mut chunk_started = Instant::now();
    let mut delay = Hist::new();
    let start = Instant::now();
    let start_us = now_us();
    let interval_ns = if rate > 0.0 { 1e9 / rate } else { 0.0 };
    let mut k: u64 = 0;
    let mut sent_bytes: u64 = 0;
    let mut key_n: u64 = index.wrapping_mul(7919);
    while !shared.stop_producing.load(Ordering::Relaxed) {
        if limit_bytes.is_some_and(|l| sent_bytes >= l) {
            break;
        }
        // The intended send time of record k.
        let intended_us = if interval_ns > 0.0 {
            let at = Duration::from_nanos((k as f64 * interval_ns) as u64);
            let due = start + at;
            let now = Instant::now();
            if due > now {
                // Waits of 1 ms or more are the runtime's timer (its
                // resolution); shorter ones as `pacing` says. Records due
                // meanwhile are sent back to back.
                if due - now >= Duration::from_millis(1) {
                    tokio::time::sleep_until(due.into()).await;
                } else {
                    match pacing {
                        // On the producer's own thread (`spawn_producer`).
                        Pacing::Sleep => std::thread::sleep(due - now),
                        Pacing::Spin => std::thread::yield_now(),
                    }
                    // Whatever else this runtime runs gets its turn.
                    tokio::task::yield_now().await;
                }
                if Instant::now() < due {
                    continue;
                }
            }
            start_us + at.as_micros() as u64
        } else {
            now_us()
        };
        if interval_ns > 0.0 {
            let actual = now_us();
            delay.record(actual.saturating_sub(intended_us), shared.measured());
        }
        let pooled = &pool[(k as usize) % pool.len()];
        let value = if stamp && pooled.len() >= 8 {
            let mut v = pooled.to_vec();
            v[..8].copy_from_slice(&intended_us.to_be_bytes());
            Bytes::from(v)
        } else {
            pooled.clone()
        };
        let key = match w.key_distributor {
            KeyDistributor::NoKey => None,
            KeyDistributor::KeyRoundRobin => {
                key_n = key_n.wrapping_add(1);
                Some(Bytes::from(format!("key-{}", key_n % 10_000)))
            }
            KeyDistributor::RandomNano => Some(Bytes::from(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.subsec_nanos())
                    .unwrap_or(0)
                    .to_string(),
            )),
        };
        let partition = if key.is_none() && w.unkeyed_partitioner == UnkeyedPartitioner::RoundRobin
        {
            Some(((k + index) % partitions as u64) as u32)
        } else {
            None
        };
        let bytes = value.len() as u64;
        let record = ProducerRecord {
            topic: topic.clone(),
            partition,
            key,
            value: Some(value),
            headers: Vec::new(),
            timestamp: Some((intended_us / 1000) as i64),
        };
        match p.send(record, intended_us).await {
            Ok(Some(f)) => chunk.push((intended_us, bytes, f)),
            Ok(None) => {}
            Err(e) => {
                shared.publish_errors.fetch_add(1, Ordering::Relaxed);
                shared.note_error(&e);
            }
        }
        sent_bytes += bytes;
        k += 1;
        if let Some(n) = per_txn {
            in_txn += 1;
            if in_txn >= n {
                p.commit(&shared, false).await;
                in_txn = 0;
            }
        }
        // A chunk goes to the acker when full, or after 1 ms (so that slow,
        // rate-limited producers are observed promptly).
        if chunk.len() >= CHUNK
            || ((interval_ns > 0.0 || chunk.len() % 64 == 0)
                && chunk_started.elapsed() >= Duration::from_millis(1))
        {
            let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
            chunk_started = Instant::now();
            if tx.send(full).await.is_err() {
                break;
            }
            if delay.merge_due() {
                delay.merge_into(&shared.publish_delay);
            }
        }
    }
    if !chunk.is_empty() {
        let _ = tx.send(chunk).await;
    }
    delay.merge_into(&shared.publish_delay);
    drop(tx);
    if per_txn.is_some() && in_txn > 0 {
        p.commit(&shared, true).await;
    }
    p.flush().await;
    let _ = acker.await;
    p.close().await;
    Ok(())
}

/// One consumer of a subscription: reads its partitions from `from_start`
/// (the beginning) or the end, recording end-to-end latency.
async fn consume(
    topic: String,
    group: String,
    bootstrap: SocketAddr,
    isolation: Option<String>,
    processing_us: u64,
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    let client = Client::connect_with(bootstrap, shared.client.clone()).await?;
    let mut c = GroupConsumerConfig::new(group);
    if isolation.as_deref() == Some("read_committed") {
        c.consumer.isolation_level = weir_client::IsolationLevel::ReadCommitted;
    }
    c.client_id = "weir-bench".into();
    c.enable_auto_commit = true;
    c.auto_commit_interval = Duration::from_secs(1);
    c.consumer.auto_offset_reset = OffsetReset::Earliest;
    c.consumer.max_poll_records = 5000;
    c.consumer.fetch_max_wait_ms = 100;
    let mut consumer = GroupConsumer::new(client, c);
    consumer
        .subscribe(&[topic.as_str()])
        .await
        .with_context(|| format!("joining the group of {topic}"))?;
    while !shared.stop_consuming.load(Ordering::Relaxed) {
        let records = consumer.poll(Duration::from_millis(100)).await?;
        if records.is_empty() {
            // Not consumption: the drain's end is its last record's.
            continue;
        }
        let values = records
            .iter()
            .map(|r| (r.value.as_deref().unwrap_or_default(), r.timestamp));
        consumed(&shared, values, processing_us).await;
    }
    consumer.close().await?;
    Ok(())
}

/// Counts a poll's records (not none: the time of the last is the
/// drain's end), bytes and end-to-end latency, then spends the
/// workload's processing cost on them.
async fn consumed<'a>(
    shared: &Shared,
    values: impl Iterator<Item = (&'a [u8], i64)>,
    processing_us: u64,
) {
    let now = now_us();
    let measured = shared.measured();
    let (mut n, mut bytes) = (0u64, 0u64);
    {
        let mut h = shared.e2e.lock().expect("histogram");
        for (v, ts) in values {
            n += 1;
            bytes += v.len() as u64;
            h.record(now.saturating_sub(sent_us(v, ts)), measured);
        }
    }
    shared.consumed.fetch_add(n, Ordering::Relaxed);
    shared.consumed_bytes.fetch_add(bytes, Ordering::Relaxed);
    shared
        .last_consume_us
        .fetch_max(now_us(), Ordering::Relaxed);
    if processing_us > 0 && n > 0 {
        tokio::time::sleep(Duration::from_micros(n * processing_us)).await;
    }
}

/// Records a share-group member takes per poll: `shareMaxRecords`, else
/// the SDK's default (500: Kafka's `max.poll.records`) — one 512 KiB
/// batch of 1 KiB records per fetch, so that a partition's window of
/// 2000 records in flight holds four members' fetches (1000 per poll
/// held two: four members per partition drained 9 % slower, 2026-12-07),
/// and, when records cost work, a member does not hold seconds of work
/// others could do.
fn share_poll_records(configured: Option<u32>) -> u32 {
    configured.unwrap_or(weir_client::share_consumer::MAX_RECORDS_DEFAULT)
}

/// One member of a share-group subscription: joins (counted once its
/// assignment is its share of the group's, at most `fair` partitions),
/// then reads and accepts records — in a drain (`open_first` off:
/// `--mode consume`) not before the drain is measured from, since
/// records taken earlier would be counted before its start and worked on
/// inside it. With `open_first` (producers start once every member
/// joined) its first poll, before it counts as joined, opens its share
/// sessions: they start the share partitions at the log's end before a
/// record is sent.
///
/// A member's assignment moves only with its heartbeats (every 5 s by
/// default): the first members to join hold more partitions than their
/// share until then. Counted as joined at their first assignment and
/// polling at once, they drained while the group was still settling —
/// each early member fetching both partitions, its polls waiting for
/// both — and the drain measured the join as much as the group
/// (2026-12-07: the same 8 members drained at 0.61 M or 0.96 M records/s
/// by luck).
async fn consume_share(
    topic: String,
    group: String,
    bootstrap: SocketAddr,
    processing_us: u64,
    (max_records, mode): (Option<u32>, ShareAcquireMode),
    (fair, open_first): (usize, bool),
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    let client = Client::connect_with(bootstrap, shared.client.clone()).await?;
    let mut c = weir_client::ShareConsumerConfig::new(group);
    c.max_wait = Duration::from_millis(100);
    c.max_records = share_poll_records(max_records);
    c.acquire_mode = match mode {
        ShareAcquireMode::BatchOptimized => weir_client::AcquireMode::BatchOptimized,
        ShareAcquireMode::RecordLimit => weir_client::AcquireMode::RecordLimit,
    };
    let mut consumer = weir_client::ShareConsumer::new(client, c);
    consumer.subscribe(&[topic.as_str()])?;
    // Heartbeats run in the background: the assignment settles without
    // a poll (a poll would take records before the drain starts).
    let deadline = Instant::now() + KAFKA_JOIN_TIMEOUT;
    let settled = |c: &weir_client::ShareConsumer| (1..=fair).contains(&c.assignment().len());
    while !settled(&consumer) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut first = Vec::new();
    if open_first {
        first = consumer.poll(Duration::from_millis(100)).await?;
    }
    shared.consumers_joined.fetch_add(1, Ordering::Relaxed);
    while !open_first && !shared.measured() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    while !shared.stop_consuming.load(Ordering::Relaxed) {
        let records = if first.is_empty() {
            consumer.poll(Duration::from_millis(100)).await?
        } else {
            std::mem::take(&mut first)
        };
        if records.is_empty() {
            continue;
        }
        let values = records.iter().map(|r| {
            (
                r.record.value.as_deref().unwrap_or_default(),
                r.record.timestamp,
            )
        });
        consumed(&shared, values, processing_us).await;
    }
    consumer.close().await?;
    Ok(())
}

/// When a record was meant to be sent (µs since the epoch): the stamp in
/// its value's first 8 bytes, else its timestamp (ms).
fn sent_us(value: &[u8], timestamp_ms: i64) -> u64 {
    match value.get(..8) {
        Some(b) => u64::from_be_bytes(b.try_into().expect("8 bytes")),
        None => (timestamp_ms.max(0) as u64) * 1000,
    }
}

/// Records a consumer counted but has not yet added to the shared
/// totals (librdkafka hands records over one at a time).
const KAFKA_CONSUME_BATCH: u64 = 1000;

/// Records a librdkafka consumer takes between two reads of the clock.
const KAFKA_CLOCK_RECORDS: u32 = 64;

/// A librdkafka consumer's counts reach the shared totals at least this
/// often (µs) while records come.
const KAFKA_FLUSH_US: u64 = 20_000;

/// How long a run waits for librdkafka consumers to join before it starts
/// the producers anyway.
const KAFKA_JOIN_TIMEOUT: Duration = Duration::from_secs(30);

/// One consumer of a subscription through librdkafka (see [`consume`]).
async fn consume_kafka(
    topic: String,
    group: String,
    bootstrap: SocketAddr,
    isolation: Option<String>,
    kafka_config: Arc<[(String, String)]>,
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    // librdkafka's poll blocks its caller: each member runs on a thread of
    // its own (tokio's blocking pool), polling as librdkafka's own
    // examples do.
    tokio::task::spawn_blocking(move || {
        consume_kafka_blocking(
            &topic,
            &group,
            bootstrap,
            isolation.as_deref(),
            &kafka_config,
            &shared,
        )
    })
    .await?
}

fn consume_kafka_blocking(
    topic: &str,
    group: &str,
    bootstrap: SocketAddr,
    isolation: Option<&str>,
    kafka_config: &[(String, String)],
    shared: &Shared,
) -> anyhow::Result<()> {
    use rdkafka::consumer::Consumer;
    use rdkafka::message::Message;
    let consumer = crate::kafka::group_consumer(
        &bootstrap.to_string(),
        group,
        topic,
        isolation,
        kafka_config,
    )?;
    let mut local = Hist::new();
    let (mut n, mut bytes) = (0u64, 0u64);
    let mut last_flush = now_us();
    let mut joined = false;
    // The clock is read once per KAFKA_CLOCK_RECORDS records (and after
    // every empty poll), as the Weir driver reads it once per polled batch:
    // two clock reads per record were a tenth of this thread's time.
    let (mut now, mut since_clock) = (now_us(), 0u32);
    while !shared.stop_consuming.load(Ordering::Relaxed) {
        let got = consumer.poll(Duration::from_millis(100));
        if !joined && consumer.context().joined() {
            joined = true;
            shared.consumers_joined.fetch_add(1, Ordering::Relaxed);
        }
        since_clock += 1;
        if got.is_none() || since_clock >= KAFKA_CLOCK_RECORDS {
            (now, since_clock) = (now_us(), 0);
        }
        if let Some(m) = got {
            let m = m.with_context(|| format!("consuming {topic} in group {group}"))?;
            let v = m.payload().unwrap_or_default();
            let ts = m.timestamp().to_millis().unwrap_or(0);
            local.record(now.saturating_sub(sent_us(v, ts)), shared.measured());
            n += 1;
            bytes += v.len() as u64;
        }
        if n >= KAFKA_CONSUME_BATCH || (n > 0 && now.saturating_sub(last_flush) >= KAFKA_FLUSH_US) {
            local.merge_into(&shared.e2e);
            shared.consumed.fetch_add(n, Ordering::Relaxed);
            shared.consumed_bytes.fetch_add(bytes, Ordering::Relaxed);
            shared
                .last_consume_us
                .fetch_max(now_us(), Ordering::Relaxed);
            (n, bytes) = (0, 0);
            last_flush = now;
        }
    }
    Ok(())
}

/// Runs `w` and returns its report.
pub async fn run(w: &Workload, opts: &RunOptions) -> anyhow::Result<Report> {
    let started_at = SystemTime::now();
    let w = Arc::new(w.clone());
    let topics: Vec<String> = w
        .topic_names()
        .into_iter()
        .map(|t| format!("{t}-{}", opts.run_id))
        .collect();
    let configs = w.driver.topic_configs();
    let payload_file = w.read_payload_file(&opts.workload_dir)?.map(Bytes::from);
    if w.subscription_type == SubscriptionType::Share && opts.driver == Driver::Kafka {
        anyhow::bail!(
            "subscriptionType share runs with the weir driver only (librdkafka's share consumer is not wrapped)"
        );
    }
    if matches!(opts.driver, Driver::Otlp(_)) && opts.mode != Mode::Produce {
        anyhow::bail!("the OTLP drivers produce only: use --mode produce");
    }
    match opts.driver {
        Driver::Weir | Driver::Otlp(_) => {
            let admin = Client::connect_with(opts.bootstrap, opts.client.clone())
                .await
                .with_context(|| format!("connecting to {}", opts.bootstrap))?;
            for t in &topics {
                admin
                    .create_replicated_topic(
                        t,
                        w.partitions_per_topic,
                        opts.replication_factor,
                        configs.clone(),
                    )
                    .await
                    .with_context(|| format!("creating topic {t}"))?;
            }
        }
        Driver::Kafka => {
            crate::kafka::create_topics(
                &opts.bootstrap.to_string(),
                &topics,
                w.partitions_per_topic,
                opts.replication_factor,
                &configs,
                &opts.kafka_config,
            )
            .await?
        }
    }
    let shared = Arc::new(Shared {
        client: opts.client.clone(),
        published: AtomicU64::new(0),
        published_bytes: AtomicU64::new(0),
        publish_errors: AtomicU64::new(0),
        consumed: AtomicU64::new(0),
        consumed_bytes: AtomicU64::new(0),
        publish_latency: Mutex::new(Hist::new()),
        publish_delay: Mutex::new(Hist::new()),
        e2e: Mutex::new(Hist::new()),
        measuring: AtomicBool::new(false),
        stop_producing: AtomicBool::new(false),
        stop_consuming: AtomicBool::new(false),
        first_error: Mutex::new(None),
        stamp_values: opts.mode != Mode::Produce,
        last_consume_us: AtomicU64::new(0),
        consumers_joined: AtomicU64::new(0),
        payload_file,
        weir_producers: Mutex::new(Vec::new()),
        transactions: AtomicU64::new(0),
    });
    let mut notes = Vec::new();
    if opts.mode == Mode::Consume && w.subscription_type == SubscriptionType::Share {
        notes.push(
            "share groups start at the log's end unless the broker runs with \
             --share-auto-offset-reset earliest: without it the backlog is not read"
                .to_string(),
        );
    }
    let kafka_config: Arc<[(String, String)]> = opts.kafka_config.clone().into();
    let producers_total = u64::from(w.producers_per_topic * w.topics);
    let per_producer_rate = if producers_total > 0 {
        w.producer_rate / producers_total as f64
    } else {
        0.0
    };

    let mut backlog_records = 0u64;
    // Consume mode: write the backlog first (as fast as possible), then
    // measure the consumers reading it.
    if opts.mode == Mode::Consume {
        let mut backlog = w.backlog_bytes();
        if backlog == 0 {
            backlog = (w.producer_rate.max(100_000.0)
                * w.message_size as f64
                * w.duration().as_secs_f64()) as u64;
            notes.push(format!(
                "no consumerBacklogSizeGB: prepared a backlog of {backlog} bytes"
            ));
        }
        let per = backlog / producers_total.max(1);
        let mut tasks = Vec::new();
        for (ti, t) in topics.iter().enumerate() {
            for pi in 0..w.producers_per_topic.max(1) {
                tasks.push(tokio::spawn(produce(ProducerJob {
                    w: w.clone(),
                    topic: t.as_str().into(),
                    rate: 0.0,
                    driver: opts.driver,
                    bootstrap: opts.bootstrap,
                    otlp: opts.otlp,
                    kafka_config: kafka_config.clone(),
                    shared: shared.clone(),
                    index: (ti as u64) << 16 | pi as u64,
                    pacing: opts.pacing,
                    limit_bytes: Some(per),
                })));
            }
        }
        for t in tasks {
            t.await??;
        }
        backlog_records = shared.published.load(Ordering::Relaxed);
        notes.push(format!("backlog prepared: {backlog_records} records"));
        if w.driver.tiered() {
            notes.push(wait_remote(opts.broker_metrics, &topics, backlog).await);
        }
        shared.published.store(0, Ordering::Relaxed);
        shared.published_bytes.store(0, Ordering::Relaxed);
        *shared.publish_latency.lock().expect("histogram") = Hist::new();
        *shared.publish_delay.lock().expect("histogram") = Hist::new();
    }

    let mut tasks = Vec::new();
    if opts.mode != Mode::Produce {
        for t in &topics {
            for sub in 0..w.subscriptions_per_topic {
                for _ in 0..w.consumer_per_subscription.max(1) {
                    let (topic, group) = (t.clone(), format!("{t}-sub-{sub}"));
                    let shared = shared.clone();
                    let processing = w.consumer_processing_micros;
                    tasks.push(match (opts.driver, w.subscription_type) {
                        (Driver::Weir, SubscriptionType::Share) => tokio::spawn(consume_share(
                            topic,
                            format!("{t}-share-{sub}"),
                            opts.bootstrap,
                            processing,
                            (w.share_max_records, w.share_acquire_mode),
                            (
                                (w.partitions_per_topic as usize)
                                    .div_ceil(w.consumer_per_subscription.max(1) as usize),
                                opts.mode != Mode::Consume,
                            ),
                            shared,
                        )),
                        (Driver::Weir, SubscriptionType::Group) => tokio::spawn(consume(
                            topic,
                            group,
                            opts.bootstrap,
                            w.driver.isolation_level.clone(),
                            processing,
                            shared,
                        )),
                        (Driver::Otlp(_), _) => unreachable!("refused above"),
                        (Driver::Kafka, _) => tokio::spawn(consume_kafka(
                            topic,
                            group,
                            opts.bootstrap,
                            w.driver.isolation_level.clone(),
                            kafka_config.clone(),
                            shared,
                        )),
                    });
                }
            }
        }
    }
    // The native consumers join before their first poll; librdkafka's join
    // in the background: producers start once every member has its first
    // assignment (bounded), so that what is measured is not the join.
    let joins_later =
        opts.driver == Driver::Kafka || w.subscription_type == SubscriptionType::Share;
    if joins_later && !tasks.is_empty() {
        let deadline = Instant::now() + KAFKA_JOIN_TIMEOUT;
        while shared.consumers_joined.load(Ordering::Relaxed) < tasks.len() as u64 {
            if Instant::now() >= deadline || opts.stop.load(Ordering::Relaxed) {
                notes.push(format!(
                    "{} of {} consumers joined their groups within {:?}",
                    shared.consumers_joined.load(Ordering::Relaxed),
                    tasks.len(),
                    KAFKA_JOIN_TIMEOUT
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let mut producers = Vec::new();
    if opts.mode != Mode::Consume {
        for (ti, t) in topics.iter().enumerate() {
            for pi in 0..w.producers_per_topic {
                producers.push(spawn_producer(ProducerJob {
                    w: w.clone(),
                    topic: t.as_str().into(),
                    rate: per_producer_rate,
                    driver: opts.driver,
                    bootstrap: opts.bootstrap,
                    otlp: opts.otlp,
                    kafka_config: kafka_config.clone(),
                    shared: shared.clone(),
                    index: (ti as u64) << 16 | pi as u64,
                    pacing: opts.pacing,
                    limit_bytes: None,
                }));
            }
        }
    }

    // The reporter: one interval per second.
    // A consume run measures the drain of the backlog from its first
    // record: no warm-up, and it ends once every subscription read the
    // whole backlog (or the duration ran out).
    let warmup = if opts.mode == Mode::Consume {
        if !w.warmup().is_zero() {
            notes.push(
                "consume mode: the warm-up is skipped (the drain is measured from its start)"
                    .into(),
            );
        }
        Duration::ZERO
    } else {
        w.warmup()
    };
    let drain_target = backlog_records * u64::from(w.subscriptions_per_topic.max(1));
    let total = warmup + w.duration();
    let start = Instant::now();
    let start_us = now_us();
    let bar = if opts.progress {
        let b = indicatif::ProgressBar::new_spinner();
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                .expect("template"),
        );
        Some(b)
    } else {
        None
    };
    let mut intervals = Vec::new();
    let mut last: Counts = (0, 0, 0, 0, 0);
    let mut measure_start: Option<(Instant, Counts)> = None;
    let mut stage_start = None;
    if warmup.is_zero() {
        shared.measuring.store(true, Ordering::Relaxed);
        measure_start = Some((start, shared.counts()));
        stage_start = Some(read_stages(&shared, opts.broker_metrics, &mut notes).await);
    }
    let mut stopped_early = false;
    let subs = i64::from((w.subscriptions_per_topic * w.topics).max(1));
    let mut tick = 1u64;
    loop {
        let next = start + Duration::from_secs(tick);
        while Instant::now() < next {
            if opts.stop.load(Ordering::Relaxed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20).min(next - Instant::now())).await;
        }
        let elapsed = start.elapsed();
        let now = shared.counts();
        let secs = elapsed.as_secs_f64() - (tick - 1) as f64;
        let secs = secs.max(1e-3);
        let take = |h: &Mutex<Hist>| {
            let mut h = h.lock().expect("histogram");
            let p = Percentiles::from_histogram(&h.interval);
            h.interval.reset();
            p
        };
        let pl = take(&shared.publish_latency);
        let _ = take(&shared.publish_delay);
        let e2e = take(&shared.e2e);
        let iv = Interval {
            t_s: elapsed.as_secs_f64(),
            warmup: measure_start.is_none(),
            publish_rate: (now.0 - last.0) as f64 / secs,
            publish_mb_s: (now.1 - last.1) as f64 / secs / 1e6,
            publish_error_rate: (now.2 - last.2) as f64 / secs,
            consume_rate: (now.3 - last.3) as f64 / secs,
            consume_mb_s: (now.4 - last.4) as f64 / secs / 1e6,
            backlog: if opts.mode == Mode::Produce {
                0
            } else {
                now.0 as i64 * subs - now.3 as i64
            },
            publish_latency_p50_ms: pl.p50_ms,
            publish_latency_p99_ms: pl.p99_ms,
            end_to_end_latency_p50_ms: e2e.p50_ms,
            end_to_end_latency_p99_ms: e2e.p99_ms,
        };
        if let Some(b) = &bar {
            b.set_message(format!(
                "{}pub {:>9.0} rec/s {:>7.1} MB/s | cons {:>9.0} rec/s | backlog {:>9} | pub p99 {:>8.2} ms | e2e p99 {:>8.2} ms",
                if iv.warmup { "[warm-up] " } else { "" },
                iv.publish_rate,
                iv.publish_mb_s,
                iv.consume_rate,
                iv.backlog,
                iv.publish_latency_p99_ms,
                iv.end_to_end_latency_p99_ms
            ));
            b.tick();
        }
        intervals.push(iv);
        last = now;
        if measure_start.is_none() && elapsed >= warmup {
            shared.measuring.store(true, Ordering::Relaxed);
            measure_start = Some((Instant::now(), now));
            stage_start = Some(read_stages(&shared, opts.broker_metrics, &mut notes).await);
        }
        if opts.stop.load(Ordering::Relaxed) {
            stopped_early = true;
            break;
        }
        if elapsed >= total {
            break;
        }
        if opts.mode == Mode::Consume && now.3 >= drain_target {
            notes.push(format!(
                "the backlog was drained after {:.1} s",
                elapsed.as_secs_f64()
            ));
            break;
        }
        tick += 1;
    }
    let (m_start, m_counts) = measure_start.unwrap_or((start, (0, 0, 0, 0, 0)));
    let mut measured_seconds = m_start.elapsed().as_secs_f64().max(1e-3);
    if opts.mode == Mode::Consume {
        // The drain ended with the last record consumed, not at the tick
        // that noticed it.
        let last = shared.last_consume_us.load(Ordering::Relaxed);
        if last > start_us {
            measured_seconds = ((last - start_us) as f64 / 1e6).max(1e-3);
        }
    }
    let end = shared.counts();
    let stage_end = read_stages(&shared, opts.broker_metrics, &mut notes).await;
    let (producer_stages, broker_stages) = match stage_start {
        Some((p0, b0)) => (
            stages::producer_stages(p0, stage_end.0),
            match (b0, stage_end.1) {
                (Some(b0), Some(b1)) => Some(stages::broker_stages(&b0, &b1)),
                _ => None,
            },
        ),
        None => (None, None),
    };
    shared.stop_producing.store(true, Ordering::Relaxed);
    for p in producers {
        match p.await {
            Ok(Err(e)) => notes.push(format!("a producer failed: {e:#}")),
            Err(e) => notes.push(format!("a producer task failed: {e}")),
            Ok(Ok(())) => {}
        }
    }
    shared.stop_consuming.store(true, Ordering::Relaxed);
    for c in tasks {
        match c.await {
            Ok(Err(e)) => notes.push(format!("a consumer failed: {e:#}")),
            Err(e) => notes.push(format!("a consumer task failed: {e}")),
            Ok(Ok(())) => {}
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if let Some(e) = shared.first_error.lock().expect("error").take() {
        notes.push(format!("first publish error: {e}"));
    }
    if let Some(n) = w.driver.transaction_records {
        notes.push(format!(
            "{} transactions of {n} records committed (whole run, warm-up included)",
            shared.transactions.load(Ordering::Relaxed)
        ));
    }
    let totals = Totals {
        published: end.0 - m_counts.0,
        published_bytes: end.1 - m_counts.1,
        publish_errors: end.2 - m_counts.2,
        consumed: end.3 - m_counts.3,
        consumed_bytes: end.4 - m_counts.4,
        measured_seconds,
        publish_rate: (end.0 - m_counts.0) as f64 / measured_seconds,
        publish_mb_s: (end.1 - m_counts.1) as f64 / measured_seconds / 1e6,
        consume_rate: (end.3 - m_counts.3) as f64 / measured_seconds,
        consume_mb_s: (end.4 - m_counts.4) as f64 / measured_seconds / 1e6,
        acknowledged_all: shared.published.load(Ordering::Relaxed) + backlog_records,
        consumed_all: shared.consumed.load(Ordering::Relaxed),
    };
    let total_of =
        |h: &Mutex<Hist>| Percentiles::from_histogram(&h.lock().expect("histogram").total);
    Ok(Report {
        tool: format!("weir-bench {}", env!("CARGO_PKG_VERSION")),
        started_at: crate::report::rfc3339_utc(started_at),
        mode: opts.mode.name().to_string(),
        target: opts.target.clone(),
        workload: serde_json::to_value(&*w)?,
        machine: Machine::detect(),
        intervals,
        totals,
        publish_latency: total_of(&shared.publish_latency),
        publish_delay: total_of(&shared.publish_delay),
        end_to_end_latency: total_of(&shared.e2e),
        producer_stages,
        broker_stages,
        stopped_early,
        notes,
    })
}

/// Tiered topics (`driver.topicConfigs` with `remote.storage.enable=true`)
/// in consume mode: waits until the backlog is in the remote tier and off
/// local disk — the broker's `weir_remote_upload_lag_bytes` and the
/// topics' `weir_partition_size_bytes` each at most a tenth of the backlog
/// — so that the drain measures a replay from the remote tier. Bounded by
/// [`TIERED_WAIT`]; returns the note saying how it went.
async fn wait_remote(metrics: Option<SocketAddr>, topics: &[String], backlog: u64) -> String {
    let Some(addr) = metrics else {
        return "tiered topics: the broker's metrics are not known (--broker-metrics): \
                the drain did not wait for the uploads"
            .into();
    };
    let start = Instant::now();
    let bound = backlog as f64 / 10.0;
    loop {
        let lag = stages::read_sum(addr, "weir_remote_upload_lag_bytes", "").await;
        let mut local = 0.0;
        for t in topics {
            let label = format!("topic=\"{t}\"");
            local += stages::read_sum(addr, "weir_partition_size_bytes", &label)
                .await
                .unwrap_or(f64::MAX);
        }
        match lag {
            Ok(lag) if lag <= bound && local <= bound => {
                return format!(
                    "tiered topics: the drain started once the backlog was remote, after {:.1} s \
                     (upload lag {:.0} MB, {:.0} MB left on local disk)",
                    start.elapsed().as_secs_f64(),
                    lag / 1e6,
                    local / 1e6
                );
            }
            Err(e) => return format!("tiered topics: not waited for the uploads: {e:#}"),
            _ if start.elapsed() >= TIERED_WAIT => {
                return format!(
                    "tiered topics: the backlog was not all remote after {TIERED_WAIT:?}: \
                     the drain read part of it locally"
                )
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The longest [`wait_remote`] waits.
const TIERED_WAIT: Duration = Duration::from_secs(900);

/// The SDK producers' and (if its metrics endpoint is known) the broker's
/// cumulative stage figures now; a failed broker reading becomes a note.
async fn read_stages(
    shared: &Shared,
    broker_metrics: Option<SocketAddr>,
    notes: &mut Vec<String>,
) -> (stages::ProducerReading, Option<stages::BrokerReading>) {
    let producers = shared.weir_producers.lock().expect("producers").clone();
    let client = stages::read_producers(&producers);
    let broker = match broker_metrics {
        None => None,
        Some(addr) => match stages::read_broker(addr).await {
            Ok(r) => Some(r),
            Err(e) => {
                notes.push(format!("broker stages not reported: {e:#}"));
                None
            }
        },
    };
    (client, broker)
}
