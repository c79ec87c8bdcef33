//! A batching producer on top of a [`Client`], in the manner of Kafka's.
//!
//! [`Producer::send`] appends a record to the open batch of its
//! (topic, partition) and returns a [`DeliveryFuture`] that resolves once
//! the broker acknowledged it. A background tokio task sends batches with
//! [`Client::produce_many`] (one request for every ready batch) when a batch
//! reaches [`ProducerConfig::batch_size`], when
//! [`ProducerConfig::linger_ms`] passed since its first record, or on
//! [`Producer::flush`] / [`Producer::close`]. One request is in flight at a
//! time, so batches of a partition are appended in the order they were
//! filled, retries included.
//!
//! Partitioning: an explicit [`ProducerRecord::partition`] wins; otherwise
//! the [`Partitioner`] (by default [`DefaultPartitioner`]: Kafka's murmur2
//! of the key) picks one among the topic's partitions (looked up once with
//! a metadata request, then cached for the producer's life); records it
//! leaves unplaced (null keys by default) go to the topic's *sticky*
//! partition, which changes each time its batch is closed.
//!
//! Memory: the estimated size of every record buffered or in flight is
//! counted against [`ProducerConfig::buffer_memory`]; `send` waits up to
//! [`ProducerConfig::max_block_ms`] for room, then fails with
//! [`ClientError::BufferFull`].

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use weir_proto::batch::Compression as Codec;
use weir_proto::builder::BatchBuilder;
use weir_proto::record::RecordData;

use crate::partitioner::partition_for_key;
use crate::{Acks, Client, ClientError, Result};

/// A boxed, sendable future (the return type of [`ProducerBackend`]'s
/// methods).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The codec of the batches a [`Producer`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Uncompressed (the default).
    #[default]
    None,
    /// LZ4 frames.
    Lz4,
    /// Zstandard at `level`.
    Zstd {
        /// The zstd level (zstd clamps out-of-range levels).
        level: i32,
    },
}

/// Settings of a [`Producer`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProducerConfig {
    /// How long a batch waits for more records after its first one.
    /// Default 5 ms.
    pub linger_ms: u64,
    /// A batch is sent as soon as its (estimated, uncompressed) size
    /// reaches this. A record that would take a non-empty batch past it
    /// starts a new batch. Default 128 KiB.
    pub batch_size: usize,
    /// Bytes of records (estimated) that may be buffered or in flight.
    /// Default 32 MiB.
    pub buffer_memory: usize,
    /// Longest wait of [`Producer::send`] for buffer space before it fails
    /// with [`ClientError::BufferFull`]. Default 60 s.
    pub max_block_ms: u64,
    /// The batches' codec. Default none.
    pub compression: Compression,
    /// When the broker acknowledges. Default [`Acks::All`]; with
    /// [`Acks::None`] offsets are unknown ([`RecordMetadata::offset`] is
    /// `None`) and so are errors.
    pub acks: Acks,
    /// How many times a batch is sent again after a retriable error
    /// ([`ClientError::is_retriable`]). Default `u32::MAX` (bounded by
    /// `delivery_timeout_ms`).
    pub retries: u32,
    /// Wait before sending again after a retriable error. Default 100 ms.
    pub retry_backoff_ms: u64,
    /// A batch is not retried once this has passed since it was opened.
    /// Default 120 s.
    pub delivery_timeout_ms: u64,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            linger_ms: 5,
            batch_size: 128 << 10,
            buffer_memory: 32 << 20,
            max_block_ms: 60_000,
            compression: Compression::None,
            acks: Acks::All,
            retries: u32::MAX,
            retry_backoff_ms: 100,
            delivery_timeout_ms: 120_000,
        }
    }
}

/// A record to send.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerRecord {
    /// The topic.
    pub topic: String,
    /// The partition; `None` to let the partitioner choose.
    pub partition: Option<u32>,
    /// The key.
    pub key: Option<Bytes>,
    /// The value (`None`: a tombstone).
    pub value: Option<Bytes>,
    /// Headers: (key, value).
    pub headers: Vec<(String, Option<Bytes>)>,
    /// Create time in ms since the epoch; `None` for now.
    pub timestamp: Option<i64>,
}

impl ProducerRecord {
    /// A record with a value and nothing else.
    pub fn new(topic: impl Into<String>, value: impl Into<Bytes>) -> Self {
        ProducerRecord {
            topic: topic.into(),
            value: Some(value.into()),
            ..ProducerRecord::default()
        }
    }

    /// Sets the key.
    pub fn key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the partition.
    pub fn partition(mut self, partition: u32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Adds a header.
    pub fn header(mut self, key: impl Into<String>, value: Option<Bytes>) -> Self {
        self.headers.push((key.into(), value));
        self
    }

    /// Sets the timestamp.
    pub fn timestamp(mut self, ms: i64) -> Self {
        self.timestamp = Some(ms);
        self
    }
}

/// Where an acknowledged record was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMetadata {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The record's offset; `None` with [`Acks::None`].
    pub offset: Option<u64>,
}

/// Picks the partition of records sent without one.
pub trait Partitioner: Send + Sync {
    /// The partition of a record of `topic` among `partitions` (at least
    /// 1), or `None` to use the topic's sticky partition.
    fn partition(&self, topic: &str, key: Option<&[u8]>, partitions: u32) -> Option<u32>;
}

/// Kafka's default: keyed records by murmur2 of the key
/// ([`partition_for_key`]), the others sticky.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultPartitioner;

impl Partitioner for DefaultPartitioner {
    fn partition(&self, _topic: &str, key: Option<&[u8]>, partitions: u32) -> Option<u32> {
        key.map(|k| partition_for_key(k, partitions))
    }
}

/// What a [`Producer`] sends through: a [`Client`], or a fake in tests.
pub trait ProducerBackend: Send + Sync + 'static {
    /// As [`Client::produce_many`].
    fn produce_many(
        &self,
        acks: Acks,
        batches: Vec<(String, u32, Bytes)>,
    ) -> BoxFuture<'_, Result<Vec<Result<Option<u64>>>>>;

    /// The number of partitions of `topic`.
    fn partition_count<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<u32>>;
}

impl ProducerBackend for Client {
    fn produce_many(
        &self,
        acks: Acks,
        batches: Vec<(String, u32, Bytes)>,
    ) -> BoxFuture<'_, Result<Vec<Result<Option<u64>>>>> {
        Box::pin(Client::produce_many(self, acks, batches))
    }

    fn partition_count<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<u32>> {
        Box::pin(async move {
            let t = self.topic_metadata(topic).await?;
            u32::try_from(t.partitions.len())
                .map_err(|_| ClientError::InvalidResponse("too many partitions".into()))
        })
    }
}

/// Resolves when a sent record was acknowledged (or failed for good).
#[must_use = "the record's outcome is only known by awaiting it"]
#[derive(Debug)]
pub struct DeliveryFuture {
    rx: oneshot::Receiver<Result<RecordMetadata>>,
}

impl Future for DeliveryFuture {
    type Output = Result<RecordMetadata>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|_| Err(closed("before the record was delivered"))))
    }
}

/// A batching producer; see the [module docs](self).
pub struct Producer {
    shared: Arc<Shared>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for Producer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("config", &self.shared.config)
            .finish()
    }
}

struct Shared {
    backend: Arc<dyn ProducerBackend>,
    partitioner: Arc<dyn Partitioner>,
    config: ProducerConfig,
    memory: Arc<Semaphore>,
    state: Mutex<State>,
    /// Wakes the sender task (a single waiter: `notify_one` keeps a permit).
    wake: Notify,
}

struct Sticky {
    partition: u32,
    /// False once its batch was closed: the next record picks another.
    active: bool,
}

struct State {
    open: HashMap<(String, u32), Batch>,
    /// Closed batches waiting for the sender, oldest first.
    ready: VecDeque<Batch>,
    partitions: HashMap<String, u32>,
    sticky: HashMap<String, Sticky>,
    /// Every batch not yet completed, with the flushes waiting for it.
    waiters: HashMap<u64, Vec<oneshot::Sender<()>>>,
    next_id: u64,
    /// Batches with a smaller id are sent without lingering (flush).
    force_below: u64,
    closed: bool,
    rng: u64,
}

struct Batch {
    id: u64,
    topic: String,
    partition: u32,
    builder: BatchBuilder,
    created: Instant,
    records: Vec<oneshot::Sender<Result<RecordMetadata>>>,
    permits: Vec<OwnedSemaphorePermit>,
}

fn closed(when: &str) -> ClientError {
    ClientError::InvalidArgument(format!("the producer was closed {when}"))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Upper estimate of a record's encoded size.
fn record_size(r: &ProducerRecord) -> usize {
    let len = |b: &Option<Bytes>| b.as_ref().map_or(0, Bytes::len);
    let headers: usize = r.headers.iter().map(|(k, v)| k.len() + len(v) + 10).sum();
    // length, attributes, timestamp and offset deltas, key and value
    // lengths, header count: at most 26 bytes of varints.
    26 + len(&r.key) + len(&r.value) + headers
}

/// A copy of an error, to report one failure to several records.
fn dup(e: &ClientError) -> ClientError {
    match e {
        ClientError::Io(io) => ClientError::Io(std::io::Error::new(io.kind(), io.to_string())),
        ClientError::Disconnected => ClientError::Disconnected,
        ClientError::Protocol(f) => ClientError::Protocol(f.clone()),
        ClientError::InvalidResponse(m) => ClientError::InvalidResponse(m.clone()),
        ClientError::CorruptBatch(b) => ClientError::CorruptBatch(b.clone()),
        ClientError::Server { code, message } => ClientError::Server {
            code: *code,
            message: message.clone(),
        },
        ClientError::Topic {
            topic,
            code,
            message,
        } => ClientError::Topic {
            topic: topic.clone(),
            code: *code,
            message: message.clone(),
        },
        ClientError::Partition {
            topic,
            partition,
            code,
            message,
        } => ClientError::Partition {
            topic: topic.clone(),
            partition: *partition,
            code: *code,
            message: message.clone(),
        },
        ClientError::Timeout(d) => ClientError::Timeout(*d),
        ClientError::InvalidArgument(m) => ClientError::InvalidArgument(m.clone()),
        ClientError::BufferFull { waited } => ClientError::BufferFull { waited: *waited },
    }
}

impl State {
    fn random(&mut self) -> u64 {
        // xorshift64
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    /// The topic's sticky partition among `n`, picking a new one (unlike
    /// the previous one when `n > 1`) if its batch was closed.
    fn sticky_partition(&mut self, topic: &str, n: u32) -> u32 {
        match self.sticky.get(topic) {
            Some(s) if s.active && s.partition < n => return s.partition,
            _ => {}
        }
        let prev = self.sticky.get(topic).map(|s| s.partition);
        let p = match prev {
            Some(prev) if n > 1 && prev < n => {
                let r = (self.random() % u64::from(n - 1)) as u32;
                if r >= prev {
                    r + 1
                } else {
                    r
                }
            }
            _ => (self.random() % u64::from(n)) as u32,
        };
        self.sticky.insert(
            topic.to_string(),
            Sticky {
                partition: p,
                active: true,
            },
        );
        p
    }

    /// Closes an open batch: it goes to the sender, and its partition stops
    /// being sticky.
    fn close(&mut self, b: Batch) {
        if let Some(s) = self.sticky.get_mut(&b.topic) {
            if s.partition == b.partition {
                s.active = false;
            }
        }
        self.ready.push_back(b);
    }
}

impl Producer {
    /// A producer sending through `client`, with the
    /// [`DefaultPartitioner`]. Spawns its sender task, so it must be called
    /// within a tokio runtime.
    pub fn new(client: impl Into<Arc<Client>>, config: ProducerConfig) -> Producer {
        let client: Arc<Client> = client.into();
        Producer::with_backend(client, config, Arc::new(DefaultPartitioner))
    }

    /// A producer with a custom partitioner and backend (a [`Client`], or a
    /// fake one).
    pub fn with_backend(
        backend: Arc<dyn ProducerBackend>,
        config: ProducerConfig,
        partitioner: Arc<dyn Partitioner>,
    ) -> Producer {
        let memory = Arc::new(Semaphore::new(
            config.buffer_memory.min(Semaphore::MAX_PERMITS),
        ));
        let shared = Arc::new(Shared {
            backend,
            partitioner,
            config,
            memory,
            state: Mutex::new(State {
                open: HashMap::new(),
                ready: VecDeque::new(),
                partitions: HashMap::new(),
                sticky: HashMap::new(),
                waiters: HashMap::new(),
                next_id: 0,
                force_below: 0,
                closed: false,
                rng: RandomState::new().hash_one(0u64) | 1,
            }),
            wake: Notify::new(),
        });
        let task = tokio::spawn(run(shared.clone()));
        Producer {
            shared,
            task: Mutex::new(Some(task)),
        }
    }

    /// The producer's settings.
    pub fn config(&self) -> &ProducerConfig {
        &self.shared.config
    }

    /// Buffers a record. Waits only for the topic's partition count (first
    /// use of a topic without an explicit partition) and for buffer space
    /// (up to `max_block_ms`, then [`ClientError::BufferFull`]); the
    /// returned future resolves when the record is acknowledged.
    pub async fn send(&self, record: ProducerRecord) -> Result<DeliveryFuture> {
        let shared = &self.shared;
        if shared.lock().closed {
            return Err(closed("before send"));
        }
        let size = record_size(&record);
        let permits = u32::try_from(size)
            .ok()
            .filter(|&p| p as usize <= shared.config.buffer_memory.min(Semaphore::MAX_PERMITS));
        let Some(permits) = permits else {
            return Err(ClientError::InvalidArgument(format!(
                "a record of about {size} bytes does not fit buffer_memory ({} bytes)",
                shared.config.buffer_memory
            )));
        };
        let mut partition = record.partition;
        let mut count = None;
        if partition.is_none() {
            let n = self.partition_count(&record.topic).await?;
            count = Some(n);
            partition = shared
                .partitioner
                .partition(&record.topic, record.key.as_deref(), n);
            if let Some(p) = partition.filter(|&p| p >= n) {
                return Err(ClientError::InvalidArgument(format!(
                    "the partitioner chose partition {p} of topic `{}`, which has {n}",
                    record.topic
                )));
            }
        }
        let wait = Duration::from_millis(shared.config.max_block_ms);
        let permit =
            match tokio::time::timeout(wait, shared.memory.clone().acquire_many_owned(permits))
                .await
            {
                Ok(Ok(p)) => p,
                Ok(Err(_)) => return Err(closed("while send waited for buffer space")),
                Err(_) => return Err(ClientError::BufferFull { waited: wait }),
            };
        let data = RecordData {
            key: record.key,
            value: record.value,
            headers: record.headers,
            timestamp: record.timestamp.unwrap_or_else(now_ms),
        };
        let (tx, rx) = oneshot::channel();
        let mut wake = false;
        {
            let mut st = shared.lock();
            if st.closed {
                return Err(closed("before send"));
            }
            let batch_size = shared.config.batch_size;
            let mut key = (record.topic, 0);
            loop {
                key.1 = match (partition, count) {
                    (Some(p), _) => p,
                    (None, Some(n)) => st.sticky_partition(&key.0, n),
                    (None, None) => unreachable!("the count is known when no partition is"),
                };
                let full = st.open.get(&key).is_some_and(|b| {
                    !b.builder.is_empty() && b.builder.estimated_size() + size > batch_size
                });
                if !full {
                    break;
                }
                // The record does not fit: close the batch. A sticky record
                // then moves on to the topic's next sticky partition.
                let b = st.open.remove(&key).expect("just seen");
                st.close(b);
                wake = true;
            }
            let partition = key.1;
            if !st.open.contains_key(&key) {
                let id = st.next_id;
                st.next_id += 1;
                st.waiters.insert(id, Vec::new());
                let builder = shared.builder()?;
                st.open.insert(
                    key.clone(),
                    Batch {
                        id,
                        topic: key.0.clone(),
                        partition,
                        builder,
                        created: Instant::now(),
                        records: Vec::new(),
                        permits: Vec::new(),
                    },
                );
                // The sender's next deadline may now be this batch's.
                wake = true;
            }
            let b = st.open.get_mut(&key).expect("just inserted");
            // An empty batch left behind on failure is completed by the
            // sender without being sent.
            b.builder.push(&data)?;
            b.records.push(tx);
            b.permits.push(permit);
            if b.builder.estimated_size() >= batch_size {
                let b = st.open.remove(&key).expect("just seen");
                st.close(b);
                wake = true;
            }
        }
        if wake {
            shared.wake.notify_one();
        }
        Ok(DeliveryFuture { rx })
    }

    /// Sends every batch now and waits until each record sent before this
    /// call was acknowledged or failed (their futures tell which).
    pub async fn flush(&self) {
        let rxs = {
            let mut st = self.shared.lock();
            st.force_below = st.next_id;
            let mut rxs = Vec::with_capacity(st.waiters.len());
            for w in st.waiters.values_mut() {
                let (tx, rx) = oneshot::channel();
                w.push(tx);
                rxs.push(rx);
            }
            rxs
        };
        self.shared.wake.notify_one();
        for rx in rxs {
            let _ = rx.await;
        }
    }

    /// Refuses further sends, delivers everything buffered and stops the
    /// sender task. Dropping the producer also refuses further sends and
    /// lets the task deliver what is buffered, without waiting.
    pub async fn close(&self) {
        self.shared.lock().closed = true;
        self.flush().await;
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    async fn partition_count(&self, topic: &str) -> Result<u32> {
        if let Some(&n) = self.shared.lock().partitions.get(topic) {
            return Ok(n);
        }
        let n = self.shared.backend.partition_count(topic).await?;
        if n == 0 {
            return Err(ClientError::InvalidResponse(format!(
                "topic `{topic}` has no partitions"
            )));
        }
        self.shared.lock().partitions.insert(topic.to_string(), n);
        Ok(n)
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn builder(&self) -> Result<BatchBuilder> {
        Ok(match self.config.compression {
            Compression::None => BatchBuilder::new(Codec::None)?,
            Compression::Lz4 => BatchBuilder::new(Codec::Lz4)?,
            Compression::Zstd { level } => BatchBuilder::new(Codec::Zstd)?.zstd_level(level),
        })
    }

    /// The batches to send now, the next linger deadline, and whether the
    /// sender is done (closed with nothing left).
    fn take_ready(&self, now: Instant) -> (Vec<Batch>, Option<Instant>, bool) {
        let mut st = self.lock();
        let linger = Duration::from_millis(self.config.linger_ms);
        let due: Vec<(String, u32)> = st
            .open
            .iter()
            .filter(|(_, b)| st.closed || b.id < st.force_below || b.created + linger <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            let b = st.open.remove(&k).expect("listed");
            st.close(b);
        }
        let deadline = st.open.values().map(|b| b.created + linger).min();
        let ready: Vec<Batch> = st.ready.drain(..).collect();
        let done = st.closed && ready.is_empty() && st.open.is_empty();
        (ready, deadline, done)
    }

    /// Resolves a batch's records and the flushes waiting for it.
    fn complete(&self, b: Batch, outcome: Result<Option<u64>>) {
        let Batch {
            id,
            topic,
            partition,
            records,
            permits,
            ..
        } = b;
        match outcome {
            Ok(base) => {
                for (i, tx) in records.into_iter().enumerate() {
                    let _ = tx.send(Ok(RecordMetadata {
                        topic: topic.clone(),
                        partition,
                        offset: base.map(|o| o + i as u64),
                    }));
                }
            }
            Err(e) => {
                for tx in records {
                    let _ = tx.send(Err(dup(&e)));
                }
            }
        }
        drop(permits);
        let waiters = self.lock().waiters.remove(&id).unwrap_or_default();
        for w in waiters {
            let _ = w.send(());
        }
    }

    /// Sends batches in one request, retrying those that fail with a
    /// retriable error (all of them again, in order, after the backoff).
    async fn send_batches(&self, batches: Vec<Batch>) {
        let mut pending: Vec<(Batch, Bytes)> = Vec::with_capacity(batches.len());
        for b in batches {
            if b.builder.is_empty() {
                self.complete(b, Ok(None));
                continue;
            }
            match b.builder.build() {
                Ok(bytes) => pending.push((b, bytes.freeze())),
                Err(e) => self.complete(b, Err(e.into())),
            }
        }
        let backoff = Duration::from_millis(self.config.retry_backoff_ms);
        let timeout = Duration::from_millis(self.config.delivery_timeout_ms);
        let mut attempt: u32 = 0;
        while !pending.is_empty() {
            let req = pending
                .iter()
                .map(|(b, bytes)| (b.topic.clone(), b.partition, bytes.clone()))
                .collect();
            let results: Vec<Result<Option<u64>>> =
                match self.backend.produce_many(self.config.acks, req).await {
                    Ok(r) if r.len() == pending.len() => r,
                    Ok(r) => {
                        let e = ClientError::InvalidResponse(format!(
                            "{} produce results for {} batches",
                            r.len(),
                            pending.len()
                        ));
                        pending.iter().map(|_| Err(dup(&e))).collect()
                    }
                    Err(e) => pending.iter().map(|_| Err(dup(&e))).collect(),
                };
            let mut retry = Vec::new();
            for ((b, bytes), r) in pending.drain(..).zip(results) {
                match r {
                    Err(e)
                        if e.is_retriable()
                            && attempt < self.config.retries
                            && b.created.elapsed() + backoff < timeout =>
                    {
                        retry.push((b, bytes))
                    }
                    r => self.complete(b, r),
                }
            }
            if !retry.is_empty() {
                attempt += 1;
                tokio::time::sleep(backoff).await;
            }
            pending = retry;
        }
    }
}

/// The sender task: sends ready batches, sleeps until the next linger
/// deadline or a wake-up.
async fn run(shared: Arc<Shared>) {
    loop {
        let (ready, deadline, done) = shared.take_ready(Instant::now());
        if !ready.is_empty() {
            shared.send_batches(ready).await;
            continue;
        }
        if done {
            return;
        }
        match deadline {
            Some(d) => {
                tokio::select! {
                    _ = shared.wake.notified() => {}
                    _ = tokio::time::sleep_until(d) => {}
                }
            }
            None => shared.wake.notified().await,
        }
    }
}
