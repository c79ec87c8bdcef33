//! A batching producer, in the manner of Kafka's.
//!
//! [`Producer::send`] appends a record to the open batch of its
//! (topic, partition) and returns a [`DeliveryFuture`] that resolves once
//! the broker acknowledged it ([`Producer::send_with`] calls a callback
//! instead). The sender — on a thread of its own with a one-thread tokio
//! runtime ([`ProducerConfig::io_thread`], the default), else a task of the
//! creating runtime — closes a batch when
//! it reaches [`ProducerConfig::batch_size`], when
//! [`ProducerConfig::linger_ms`] passed since its first record (and its
//! partition has no closed batch still waiting to be sent), or on
//! [`Producer::flush`] / [`Producer::close`], and sends closed batches in
//! produce requests (a partition's waiting batches together, up to
//! [`PARTITION_REQUEST_BYTES_MAX`] of them per request), up to
//! [`ProducerConfig::max_in_flight`] requests per connection at once.
//!
//! Routing: with [`ProducerConfig::shard_aware`] (the default) the
//! producer learns each partition's owning core from metadata and sends its
//! batches to that core's own port ([`ShardRouter`]); a "not owner" answer
//! makes it learn the layout again and retry. Otherwise everything goes
//! through the bootstrap connection and the broker forwards.
//!
//! Ordering and retries: batches of one partition are sent in the order
//! they were closed. A batch failing with a retriable error
//! ([`ClientError::is_retriable`]) is sent again after
//! [`ProducerConfig::retry_backoff_ms`], once nothing else of its partition
//! is in flight, until [`ProducerConfig::delivery_timeout_ms`] after it
//! was opened. With idempotence (the default, with [`Acks::All`]) each
//! batch carries the producer's id and a per-partition sequence, so a
//! retry of a batch the broker already appended is acknowledged with the
//! original offsets instead of being appended twice, and a batch can never
//! overtake an earlier one. If a batch fails for good, the partition's
//! later batches that were already given sequences fail too (they could
//! not be appended in order), and the producer takes a new id for what
//! follows.
//!
//! Partitioning: an explicit [`ProducerRecord::partition`] wins; otherwise
//! the [`Partitioner`] (by default [`DefaultPartitioner`]: Kafka's murmur2
//! of the key) picks one among the topic's partitions (from the cached
//! layout, asked again after [`ProducerConfig::metadata_max_age_ms`]);
//! records it leaves unplaced (null keys by default) go to the topic's
//! *sticky* partition, which changes each time its batch is closed.
//!
//! Memory: the estimated size of every record buffered or in flight is
//! counted against [`ProducerConfig::buffer_memory`]; `send` waits up to
//! [`ProducerConfig::max_block_ms`] for room, then fails with
//! [`ClientError::BufferFull`].
//!
//! ```no_run
//! # async fn demo() -> weir_client::Result<()> {
//! use weir_client::{Producer, ProducerRecord};
//!
//! let producer = Producer::builder().bootstrap("localhost:9292").build().await?;
//! let delivery = producer
//!     .send(ProducerRecord::new("events", "hello").key("device-7"))
//!     .await?;
//! let meta = delivery.await?;
//! println!("stored at {}-{} offset {:?}", meta.topic, meta.partition, meta.offset);
//! producer.close().await;
//! # Ok(()) }
//! ```

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::{oneshot, Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use weir_proto::batch::Compression as Codec;
use weir_proto::builder::BatchBuilder;
use weir_proto::error_code::ErrorCode;
use weir_proto::record::RecordData;

use tracing::Instrument;

use crate::builder::ProducerBuilder;
use crate::partitioner::partition_for_key;
use crate::stats::{ProducerCounters, ProducerStats};
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
    /// A batch of a partition with nothing in flight and nothing waiting
    /// is sent at once, without lingering; while the partition has a
    /// request in flight its records gather (up to `linger_ms` or
    /// `batch_size`) and go when the answer comes back. At a low rate each
    /// record then costs one round trip, not `linger_ms` plus one; at a
    /// high rate the batches fill as before (property
    /// `weir.linger.adaptive`).
    /// Default true; a transactional producer turns it off (its records
    /// are visible at the commit, which sends every batch).
    pub linger_adaptive: bool,
    /// A batch is sent as soon as its (estimated, uncompressed) size
    /// reaches this. A record that would take a non-empty batch past it
    /// starts a new batch. Default 512 KiB.
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
    /// Produce requests awaiting answers per connection. Default 5 (also
    /// the most allowed with idempotence).
    pub max_in_flight: usize,
    /// Idempotent delivery (the default, as in Kafka ≥ 3.0; used with
    /// [`Acks::All`] only): the broker hands the producer an id, each
    /// batch carries a per-partition sequence, and the broker drops
    /// duplicates from retries (answering with the original offsets) and
    /// refuses gaps, so retries never duplicate or reorder records.
    pub enable_idempotence: bool,
    /// Send each partition's batches straight to the broker core that
    /// owns it (one connection per core, learned from metadata, re-learned
    /// on a "not owner" error) rather than through the bootstrap
    /// connection. Default true. [`Producer::new`] then sends through a
    /// [`ShardRouter`]; a backend given to [`Producer::with_backend`] gets
    /// [`Route::Core`] routes.
    pub shard_aware: bool,
    /// Topic layouts (partition count, owning cores) are asked again after
    /// this long, so that added partitions come into use. Default 5 min.
    pub metadata_max_age_ms: u64,
    /// Run the sender (batching, requests, its connections) on a thread of
    /// its own with a one-thread tokio runtime, as Kafka's Java producer
    /// and librdkafka do, so that records are sent while the application
    /// keeps its own runtime busy, whatever that runtime's flavour. Default
    /// true. With false the sender is a task on the runtime that creates
    /// the producer (needed for tests with tokio's paused clock); on a
    /// current-thread runtime it then only runs when the application's
    /// task yields.
    pub io_thread: bool,
    /// Batches carry the transactional attribute (set by
    /// [`crate::transactional::TransactionalProducer`]; needs idempotence).
    /// Default false.
    pub transactional: bool,
    /// A transactional producer's `transaction.timeout.ms`: its
    /// coordinator aborts a transaction open longer. Default 60 s.
    pub transaction_timeout_ms: u32,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            linger_ms: 5,
            linger_adaptive: true,
            batch_size: 512 << 10,
            buffer_memory: 32 << 20,
            max_block_ms: 60_000,
            compression: Compression::None,
            acks: Acks::All,
            retries: u32::MAX,
            retry_backoff_ms: 100,
            delivery_timeout_ms: 120_000,
            max_in_flight: 5,
            enable_idempotence: true,
            shard_aware: true,
            metadata_max_age_ms: 300_000,
            io_thread: true,
            transactional: false,
            transaction_timeout_ms: 60_000,
        }
    }
}

/// A record to send.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerRecord {
    /// The topic.
    pub topic: Arc<str>,
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
    pub fn new(topic: impl Into<Arc<str>>, value: impl Into<Bytes>) -> Self {
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

/// What [`Producer::send_with`] calls with a record's outcome.
pub type DeliveryCallback = Box<dyn FnOnce(Result<RecordMetadata>) + Send + 'static>;

/// Where an acknowledged record was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMetadata {
    /// The topic (shared by the records of a batch).
    pub topic: Arc<str>,
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

/// Where a produce request is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// The bootstrap connection (the broker forwards to the owning core).
    Bootstrap,
    /// The owning core's own port.
    Core(u32),
}

/// A topic's partitions and the cores that own them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicLayout {
    /// Number of partitions (at least 1).
    pub partitions: u32,
    /// The owning core of each partition (empty if unknown: everything
    /// goes through the bootstrap connection).
    pub owners: Vec<u32>,
}

/// What a [`Producer`] sends through: [`Client`]s, or a fake in tests.
pub trait ProducerBackend: Send + Sync + 'static {
    /// Sends batches in one request, as [`Client::produce_many`], through
    /// `route`.
    fn produce(
        &self,
        route: Route,
        acks: Acks,
        batches: Vec<(String, u32, Bytes)>,
    ) -> BoxFuture<'_, Result<Vec<Result<Option<u64>>>>>;

    /// The current layout of `topic`, asked of the broker.
    fn layout<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<TopicLayout>>;

    /// A new idempotent-producer identity: (producer id, epoch).
    fn init_producer_id(&self) -> BoxFuture<'_, Result<(i64, i16)>>;
}

fn layout_of(t: &weir_proto::messages::TopicMetadata) -> Result<TopicLayout> {
    let partitions = u32::try_from(t.partitions.len())
        .map_err(|_| ClientError::InvalidResponse("too many partitions".into()))?;
    let mut owners = vec![0; t.partitions.len()];
    for p in &t.partitions {
        match owners.get_mut(p.partition as usize) {
            Some(o) => *o = p.core,
            None => {
                return Err(ClientError::InvalidResponse(format!(
                    "metadata of `{}` lists partition {} of {partitions}",
                    t.name, p.partition
                )))
            }
        }
    }
    Ok(TopicLayout { partitions, owners })
}

/// One [`Client`] for everything: routes are ignored (the broker forwards
/// each partition's batches to its core).
impl ProducerBackend for Client {
    fn produce(
        &self,
        _route: Route,
        acks: Acks,
        batches: Vec<(String, u32, Bytes)>,
    ) -> BoxFuture<'_, Result<Vec<Result<Option<u64>>>>> {
        Box::pin(Client::produce_many(self, acks, batches))
    }

    fn layout<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<TopicLayout>> {
        Box::pin(async move {
            let t = self.topic_metadata(topic).await?;
            Ok(TopicLayout {
                owners: Vec::new(),
                ..layout_of(&t)?
            })
        })
    }

    fn init_producer_id(&self) -> BoxFuture<'_, Result<(i64, i16)>> {
        Box::pin(Client::init_producer_id(self))
    }
}

/// Shard-aware routing: a bootstrap [`Client`] for metadata, plus one
/// connection per broker core (opened on first use), so that each
/// partition's batches go straight to the core that owns it.
pub struct ShardRouter {
    bootstrap: Arc<Client>,
    cores: Mutex<HashMap<u32, Arc<Client>>>,
    /// Each core's address, and the host it was advertised as.
    addrs: Mutex<HashMap<u32, (std::net::SocketAddr, String)>>,
    /// Layouts the consumer side learned (the producer keeps its own).
    layouts: Mutex<HashMap<String, TopicLayout>>,
}

impl fmt::Debug for ShardRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardRouter")
            .field("bootstrap", &self.bootstrap.addr())
            .finish()
    }
}

impl ShardRouter {
    /// Routes through `bootstrap`'s broker.
    pub fn new(bootstrap: Arc<Client>) -> ShardRouter {
        ShardRouter {
            bootstrap,
            cores: Mutex::new(HashMap::new()),
            addrs: Mutex::new(HashMap::new()),
            layouts: Mutex::new(HashMap::new()),
        }
    }

    /// Where a partition lives, from a cached layout (learned on first use).
    async fn route_of(&self, topic: &str, partition: u32) -> Route {
        let cached = self
            .layouts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(topic)
            .cloned();
        let layout = match cached {
            Some(l) => Some(l),
            None => match ProducerBackend::layout(self, topic).await {
                Ok(l) => {
                    self.layouts
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(topic.to_string(), l.clone());
                    Some(l)
                }
                Err(_) => None,
            },
        };
        layout
            .and_then(|l| l.owners.get(partition as usize).copied())
            .map_or(Route::Bootstrap, Route::Core)
    }

    /// `topic`'s metadata from the bootstrap node or, if that fails (the
    /// node is down) or answers `NotLeader` for the topic (it is cut off
    /// from the controller: its metadata may be out of date), from any
    /// other node this router has learned of; the bootstrap node's answer
    /// if none of them has a better one.
    async fn metadata_anywhere(
        &self,
        topic: &str,
    ) -> Result<weir_proto::messages::MetadataResponse> {
        let ask = Some(vec![topic.to_string()]);
        let stale = |md: &weir_proto::messages::MetadataResponse| {
            md.topics
                .iter()
                .any(|t| t.error == ErrorCode::NotLeader.as_u16())
        };
        let first = match self.bootstrap.metadata(ask.clone()).await {
            Ok(md) if !stale(&md) => return Ok(md),
            Ok(md) => Ok(md),
            Err(e) => Err(e),
        };
        let boot = self.bootstrap.addr();
        let others: Vec<u32> = {
            let addrs = self.addrs.lock().unwrap_or_else(|e| e.into_inner());
            let mut seen = std::collections::HashSet::new();
            let mut cores: Vec<(u32, std::net::SocketAddr)> =
                addrs.iter().map(|(c, (a, _))| (*c, *a)).collect();
            cores.sort_unstable();
            cores
                .into_iter()
                .filter(|(_, a)| a.ip() != boot.ip() || a.port() != boot.port())
                .filter(|(_, a)| seen.insert(*a))
                .map(|(c, _)| c)
                .collect()
        };
        for c in others {
            match self.client_for(Route::Core(c)).metadata(ask.clone()).await {
                Ok(md) if !stale(&md) => return Ok(md),
                _ => {}
            }
        }
        first
    }

    /// Forgets the layouts of these partitions' topics (learned again on
    /// next use).
    fn forget_topics<'a>(
        &self,
        partitions: impl Iterator<Item = &'a weir_proto::messages::FetchPartition>,
    ) {
        let mut layouts = self.layouts.lock().unwrap_or_else(|e| e.into_inner());
        for p in partitions {
            layouts.remove(&p.topic);
        }
    }

    /// Forgets the layout of every topic with a partition answered
    /// `NotLeader`, `NotOwner` or unknown (learned again on next use).
    fn relearn<'a>(
        &self,
        partitions: &[weir_proto::messages::FetchPartition],
        answers: impl Iterator<Item = (usize, &'a Result<crate::FetchedBatches>)>,
    ) {
        for (i, r) in answers {
            if let Err(e) = r {
                if matches!(
                    e.code(),
                    Some(
                        ErrorCode::NotLeader
                            | ErrorCode::NotOwner
                            | ErrorCode::UnknownTopicOrPartition
                    )
                ) {
                    self.layouts
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&partitions[i].topic);
                }
            }
        }
    }

    /// The connection to the core that owns a partition (the bootstrap
    /// one while its layout is not known).
    pub(crate) async fn client_of(&self, topic: &str, partition: u32) -> Arc<Client> {
        self.client_for(self.route_of(topic, partition).await)
    }

    /// Forgets a topic's layout (learned again on next use).
    pub(crate) fn forget_topic(&self, topic: &str) {
        self.layouts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(topic);
    }

    fn client_for(&self, route: Route) -> Arc<Client> {
        let Route::Core(c) = route else {
            return self.bootstrap.clone();
        };
        let mut cores = self.cores.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = cores.get(&c) {
            return client.clone();
        }
        let addr = self
            .addrs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&c)
            .cloned();
        match addr {
            Some((addr, host)) => {
                let config = crate::config_for_host(self.bootstrap.config(), &host);
                let client = Arc::new(Client::connect_lazy(addr, config));
                cores.insert(c, client.clone());
                client
            }
            None => self.bootstrap.clone(),
        }
    }
}

/// Reads each partition from the core (and node) that holds it: the
/// partitions of one fetch are split by owner and fetched from each in
/// parallel (each a long poll of `max_wait_ms`, each with `max_bytes`).
/// The answer comes as soon as one owner returns records (or an error),
/// with whatever the others answered by then; the partitions of owners
/// still waiting come back empty (their long poll is abandoned), so data
/// on one node is not held back by another node's empty long poll. A
/// partition answered `NotLeader`, `NotOwner` or unknown has its topic's
/// layout learned again before the next fetch. On one node the broker
/// forwards between its cores, and a plain [`Client`] saves the per-core
/// connections.
impl crate::consumer::ConsumerBackend for ShardRouter {
    fn fetch_many(
        &self,
        isolation: crate::IsolationLevel,
        max_wait_ms: u32,
        max_bytes: u32,
        partitions: Vec<weir_proto::messages::FetchPartition>,
    ) -> BoxFuture<'_, Result<Vec<Result<crate::FetchedBatches>>>> {
        Box::pin(async move {
            let mut groups: HashMap<Route, Vec<usize>> = HashMap::new();
            for (i, p) in partitions.iter().enumerate() {
                let route = self.route_of(&p.topic, p.partition).await;
                groups.entry(route).or_default().push(i);
            }
            if groups.len() == 1 {
                let route = *groups.keys().next().expect("one route");
                let answers = self
                    .client_for(route)
                    .fetch_many_at(isolation, max_wait_ms, max_bytes, partitions.clone())
                    .await
                    .inspect_err(|_| self.forget_topics(partitions.iter()))?;
                self.relearn(&partitions, answers.iter().enumerate());
                return Ok(answers);
            }
            // One fetch per route, polled together on this task, in route
            // order: the first poll queues each on its connection, so two
            // fetch_many calls reach every connection in the order they
            // were first polled (a consumer's continuing fetch must follow
            // the fetch it continues).
            type RouteFetch<'f> = (
                Vec<usize>,
                BoxFuture<'f, Result<Vec<Result<crate::FetchedBatches>>>>,
            );
            let mut fetches: Vec<Option<RouteFetch<'_>>> = Vec::with_capacity(groups.len());
            let mut routes: Vec<_> = groups.into_iter().collect();
            routes.sort_by_key(|(_, idx)| idx[0]);
            for (route, idx) in routes {
                let client = self.client_for(route);
                let parts: Vec<_> = idx.iter().map(|&i| partitions[i].clone()).collect();
                let fetch: BoxFuture<'_, _> = Box::pin(async move {
                    client
                        .fetch_many_at(isolation, max_wait_ms, max_bytes, parts)
                        .await
                });
                fetches.push(Some((idx, fetch)));
            }
            let mut out: Vec<Option<Result<crate::FetchedBatches>>> =
                (0..partitions.len()).map(|_| None).collect();
            let mut worth = false;
            std::future::poll_fn(|cx| {
                for slot in fetches.iter_mut() {
                    let Some((_, fetch)) = slot else { continue };
                    let Poll::Ready(r) = fetch.as_mut().poll(cx) else {
                        continue;
                    };
                    let (idx, _) = slot.take().expect("polled");
                    // The node may be down: its partitions' leaders are
                    // learned again before the next fetch.
                    let answers = match r {
                        Ok(a) => a,
                        Err(e) => {
                            self.forget_topics(idx.iter().map(|&i| &partitions[i]));
                            return Poll::Ready(Err(e));
                        }
                    };
                    for (i, a) in idx.into_iter().zip(answers) {
                        worth |= a.as_ref().map_or(true, |f| !f.batches.is_empty());
                        out[i] = Some(a);
                    }
                }
                // A long poll answers once something came back (what else
                // has is added, the waits still out are abandoned); a
                // fetch that does not wait takes every route's answer.
                let done = fetches.iter().all(Option::is_none) || (worth && max_wait_ms > 0);
                if done {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                }
            })
            .await?;
            drop(fetches);
            let answers: Vec<_> = out
                .into_iter()
                .map(|r| r.unwrap_or_else(|| Ok(crate::FetchedBatches::default())))
                .collect();
            self.relearn(&partitions, answers.iter().enumerate());
            Ok(answers)
        })
    }

    fn list_offsets<'a>(
        &'a self,
        isolation: crate::IsolationLevel,
        topic: &'a str,
        partition: u32,
        spec: weir_proto::messages::OffsetSpec,
    ) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(async move {
            let client = self.client_for(self.route_of(topic, partition).await);
            client
                .list_offsets_at(isolation, topic, partition, spec)
                .await
        })
    }
}

impl ProducerBackend for ShardRouter {
    fn produce(
        &self,
        route: Route,
        acks: Acks,
        batches: Vec<(String, u32, Bytes)>,
    ) -> BoxFuture<'_, Result<Vec<Result<Option<u64>>>>> {
        let client = self.client_for(route);
        Box::pin(async move { client.produce_many(acks, batches).await })
    }

    fn layout<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<TopicLayout>> {
        Box::pin(async move {
            let md = self.metadata_anywhere(topic).await?;
            let boot = self.bootstrap.addr();
            let mut resolved = Vec::with_capacity(md.cores.len());
            for c in &md.cores {
                resolved.push((
                    c.core,
                    (
                        crate::resolve_advertised(&c.host, c.port, boot.ip()).await,
                        c.host.clone(),
                    ),
                ));
            }
            {
                let mut addrs = self.addrs.lock().unwrap_or_else(|e| e.into_inner());
                let mut cores = self.cores.lock().unwrap_or_else(|e| e.into_inner());
                for (core, addr) in resolved {
                    if addrs.insert(core, addr.clone()) != Some(addr) {
                        cores.remove(&core);
                    }
                }
            }
            let t = md
                .topics
                .iter()
                .find(|t| t.name == topic)
                .ok_or_else(|| ClientError::topic(topic, 3, None))?;
            if t.error != 0 {
                return Err(ClientError::topic(topic, t.error, None));
            }
            layout_of(t)
        })
    }

    fn init_producer_id(&self) -> BoxFuture<'_, Result<(i64, i16)>> {
        Box::pin(self.bootstrap.init_producer_id())
    }
}

/// The outcome of one batch, shared by the futures of its records.
#[derive(Debug)]
struct BatchOutcome {
    topic: Arc<str>,
    partition: u32,
    /// Set once: the base offset (`None` with acks=0) or the error.
    result: std::sync::OnceLock<std::result::Result<Option<u64>, ClientError>>,
    /// When the outcome became known (set just before `result`).
    completed: std::sync::OnceLock<SystemTime>,
    wakers: Mutex<Vec<std::task::Waker>>,
}

impl BatchOutcome {
    fn new(topic: Arc<str>, partition: u32) -> Arc<BatchOutcome> {
        Arc::new(BatchOutcome {
            topic,
            partition,
            result: std::sync::OnceLock::new(),
            completed: std::sync::OnceLock::new(),
            wakers: Mutex::new(Vec::new()),
        })
    }

    fn set(&self, r: Result<Option<u64>>) {
        let _ = self.completed.set(SystemTime::now());
        let _ = self.result.set(r);
        let wakers = std::mem::take(&mut *self.wakers.lock().unwrap_or_else(|e| e.into_inner()));
        for w in wakers {
            w.wake();
        }
    }

    fn record(&self, index: u32) -> Option<Result<RecordMetadata>> {
        let r = self.result.get()?;
        Some(match r {
            Ok(base) => Ok(RecordMetadata {
                topic: self.topic.clone(),
                partition: self.partition,
                offset: base.map(|o| o + u64::from(index)),
            }),
            Err(e) => Err(e.duplicate()),
        })
    }
}

/// Resolves when a sent record was acknowledged (or failed for good).
#[must_use = "the record's outcome is only known by awaiting it"]
#[derive(Debug)]
pub struct DeliveryFuture {
    batch: Arc<BatchOutcome>,
    index: u32,
}

impl DeliveryFuture {
    /// The record's offset (`Ok(None)` with [`Acks::None`]) or error, if
    /// known already — like [`DeliveryFuture::try_outcome`] without
    /// building the [`RecordMetadata`]. Once this returned `Some`, do not
    /// await the future.
    pub fn try_offset(&mut self) -> Option<Result<Option<u64>>> {
        let r = self.batch.result.get()?;
        Some(match r {
            Ok(base) => Ok(base.map(|o| o + u64::from(self.index))),
            Err(e) => Err(e.duplicate()),
        })
    }

    /// The outcome, if it is known already, without waiting.
    pub fn try_outcome(&mut self) -> Option<Result<RecordMetadata>> {
        self.batch.record(self.index)
    }

    /// When the producer learned the outcome — its I/O task read the
    /// broker's answer, or gave up — if it has: the time a Kafka
    /// producer's send callback would run (how OMB measures publish
    /// latency), whenever this future is looked at.
    pub fn completed_at(&self) -> Option<SystemTime> {
        self.batch.result.get()?;
        self.batch.completed.get().copied()
    }
}

impl Future for DeliveryFuture {
    type Output = Result<RecordMetadata>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(r) = self.batch.record(self.index) {
            return Poll::Ready(r);
        }
        let mut wakers = self.batch.wakers.lock().unwrap_or_else(|e| e.into_inner());
        // Set between the check and the lock: the setter takes the wakers
        // after setting, so look again under the lock.
        if let Some(r) = self.batch.record(self.index) {
            return Poll::Ready(r);
        }
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// A batching producer; see the [module docs](self).
pub struct Producer {
    shared: Arc<Shared>,
    sender: Mutex<Option<SenderHandle>>,
}

/// How [`Producer::close`] waits for the sender to finish.
enum SenderHandle {
    /// A task on the application's runtime.
    Task(JoinHandle<()>),
    /// The producer's own thread; the receiver resolves (with an error)
    /// when the thread ends.
    Thread(oneshot::Receiver<()>),
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
    /// The runtime of the producer's own thread (with
    /// [`ProducerConfig::io_thread`]): metadata lookups `send` needs run
    /// there, so that connections live on it.
    io: Option<tokio::runtime::Handle>,
    stats: ProducerCounters,
}

/// A topic's layout as the producer last learned it.
struct CachedLayout {
    layout: TopicLayout,
    learned: Instant,
    /// Set by an answer that says the layout changed ("not owner",
    /// unknown partition): ask again before using it, but keep it in case
    /// asking fails.
    stale: bool,
    /// When asking again last failed: the cached layout is used without
    /// asking until `retry_backoff_ms` later.
    failed_at: Option<Instant>,
}

struct Sticky {
    partition: u32,
    /// False once its batch was closed: the next record picks another.
    active: bool,
}

struct State {
    open: HashMap<Key, Batch, FastHash>,
    /// Size of each partition's last closed batch: the next one reserves
    /// that much room at once (busy partitions do not grow their buffers
    /// record by record; quiet ones reserve little).
    last_sizes: HashMap<Key, usize, FastHash>,
    /// Closed batches waiting for the sender, oldest first.
    ready: VecDeque<Batch>,
    /// Topic layouts and when they were learned.
    layouts: HashMap<String, CachedLayout, FastHash>,
    sticky: HashMap<String, Sticky, FastHash>,
    /// Every batch not yet completed, with the flushes waiting for it.
    waiters: HashMap<u64, Vec<oneshot::Sender<()>>, FastHash>,
    next_id: u64,
    /// Batches with a smaller id are sent without lingering (flush).
    force_below: u64,
    closed: bool,
    rng: u64,
}

struct Batch {
    id: u64,
    topic: Arc<str>,
    partition: u32,
    builder: BatchBuilder,
    created: Instant,
    /// When it was closed (set by [`State::close`]).
    closed_at: Option<Instant>,
    /// What its records' futures wait for.
    outcome: Arc<BatchOutcome>,
    /// Buffer memory (semaphore permits) held by its records, given back
    /// when the batch is completed.
    reserved: u32,
    /// Its records.
    records: u32,
    /// Callbacks of [`Producer::send_with`]: (record index, callback).
    callbacks: Vec<(u32, DeliveryCallback)>,
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
        self.close_sticky(b, true);
    }

    /// Closes `b`; with `move_on`, keyless records then go to another
    /// sticky partition. A batch sent early because its partition was idle
    /// ([`ProducerConfig::linger_adaptive`]) keeps the partition sticky:
    /// moving on would spread one-record batches over every idle
    /// partition.
    fn close_sticky(&mut self, mut b: Batch, move_on: bool) {
        b.closed_at = Some(Instant::now());
        if let Some(s) = self.sticky.get_mut(&*b.topic) {
            if move_on && s.partition == b.partition {
                s.active = false;
            }
        }
        self.last_sizes
            .insert((b.topic.clone(), b.partition), b.builder.estimated_size());
        self.ready.push_back(b);
    }
}

impl Producer {
    /// A producer sending through `client`'s broker, with the
    /// [`DefaultPartitioner`]. With [`ProducerConfig::shard_aware`] (the
    /// default) it opens one more connection per broker core and sends
    /// each partition's batches to its owning core.
    ///
    /// With [`ProducerConfig::io_thread`] (the default) the producer opens
    /// its own connection to `client`'s address, from its own thread, and
    /// does not use `client`'s; otherwise it spawns its sender task on the
    /// current runtime, so it must then be called within a tokio runtime.
    /// [`Producer::builder`] connects by host name, with retries.
    pub fn new(client: impl Into<Arc<Client>>, config: ProducerConfig) -> Producer {
        Producer::with_partitioner(client, config, Arc::new(DefaultPartitioner))
    }

    /// [`Producer::new`] with another partitioner.
    pub fn with_partitioner(
        client: impl Into<Arc<Client>>,
        config: ProducerConfig,
        partitioner: Arc<dyn Partitioner>,
    ) -> Producer {
        let mut client: Arc<Client> = client.into();
        if config.io_thread {
            // The connection's reader task must live on the producer's
            // thread, not on the application's runtime.
            client = Arc::new(client.reopen_lazy());
        }
        let backend: Arc<dyn ProducerBackend> = if config.shard_aware {
            Arc::new(ShardRouter::new(client))
        } else {
            client
        };
        Producer::with_backend(backend, config, partitioner)
    }

    /// A producer with a custom partitioner and backend (a [`Client`], a
    /// [`ShardRouter`], or a fake one).
    ///
    /// With [`ProducerConfig::io_thread`] the backend's futures run on the
    /// producer's thread: a [`Client`] given here should not be connected
    /// yet ([`Client::connect_lazy`]), or its connection's reader stays a
    /// task of the runtime that connected it, which then has to run for
    /// answers to arrive. Panics if the thread cannot be started, as
    /// [`std::thread::spawn`] does.
    pub fn with_backend(
        backend: Arc<dyn ProducerBackend>,
        config: ProducerConfig,
        partitioner: Arc<dyn Partitioner>,
    ) -> Producer {
        let memory = Arc::new(Semaphore::new(
            config.buffer_memory.min(Semaphore::MAX_PERMITS),
        ));
        let io_thread = config.io_thread;
        let runtime = if io_thread {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .thread_name("weir-producer")
                .build()
            {
                Ok(rt) => Some(rt),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot build the producer's runtime: the sender runs as a task");
                    None
                }
            }
        } else {
            None
        };
        let shared = Arc::new(Shared {
            backend,
            partitioner,
            config,
            memory,
            io: runtime.as_ref().map(|rt| rt.handle().clone()),
            stats: ProducerCounters::default(),
            state: Mutex::new(State {
                open: HashMap::default(),
                last_sizes: HashMap::default(),
                ready: VecDeque::new(),
                layouts: HashMap::default(),
                sticky: HashMap::default(),
                waiters: HashMap::default(),
                next_id: 0,
                force_below: 0,
                closed: false,
                rng: RandomState::new().hash_one(0u64) | 1,
            }),
            wake: Notify::new(),
        });
        let sender = Sender::new(shared.clone());
        let handle = match runtime {
            Some(rt) => {
                let (done_tx, done_rx) = oneshot::channel::<()>();
                let run = sender.run();
                std::thread::Builder::new()
                    .name("weir-producer".into())
                    .spawn(move || {
                        rt.block_on(run);
                        // Dropping the runtime stops the connections'
                        // tasks; then `close` may return.
                        drop(rt);
                        drop(done_tx);
                    })
                    .map(|_| SenderHandle::Thread(done_rx))
                    .expect("start the producer's thread")
            }
            None => SenderHandle::Task(tokio::spawn(sender.run())),
        };
        Producer {
            shared,
            sender: Mutex::new(Some(handle)),
        }
    }

    /// A builder: bootstrap servers by name, retries, Kafka-style
    /// properties. See [`ProducerBuilder`].
    pub fn builder() -> ProducerBuilder {
        ProducerBuilder::default()
    }

    /// A snapshot of the producer's statistics.
    pub fn statistics(&self) -> ProducerStats {
        let held = self
            .shared
            .config
            .buffer_memory
            .min(Semaphore::MAX_PERMITS)
            .saturating_sub(self.shared.memory.available_permits());
        self.shared.stats.snapshot(held as u64)
    }

    /// The producer's settings.
    pub fn config(&self) -> &ProducerConfig {
        &self.shared.config
    }

    /// Whether batches carry an idempotent-producer identity: with
    /// [`ProducerConfig::enable_idempotence`] and [`Acks::All`].
    pub fn is_idempotent(&self) -> bool {
        self.shared.idempotent()
    }

    /// Buffers a record. Waits only for the topic's layout (first use of a
    /// topic, or once [`ProducerConfig::metadata_max_age_ms`] passed) and
    /// for buffer space (up to `max_block_ms`, then
    /// [`ClientError::BufferFull`]); the returned future resolves when the
    /// record is acknowledged.
    pub async fn send(&self, record: ProducerRecord) -> Result<DeliveryFuture> {
        let (batch, index) = self.buffer(record, None).await?;
        Ok(DeliveryFuture { batch, index })
    }

    /// Buffers a record, as [`Producer::send`], and calls `callback` with
    /// its outcome once it is acknowledged or failed for good: "do X for
    /// every acknowledged record" without keeping futures.
    ///
    /// The callback runs on the producer's sender (its own thread with
    /// [`ProducerConfig::io_thread`], else its task): keep it short, and
    /// hand heavy work to a channel. Callbacks of one partition's records
    /// run in the order of their offsets; every callback of the records
    /// sent before a [`Producer::flush`] has run when `flush` returns. A
    /// callback that panics is reported with `tracing` and does not stop
    /// the producer. If `send_with` returns an error the callback is
    /// dropped without being called.
    ///
    /// ```no_run
    /// # async fn demo(producer: weir_client::Producer) -> weir_client::Result<()> {
    /// use weir_client::ProducerRecord;
    ///
    /// producer
    ///     .send_with(ProducerRecord::new("events", "hello"), |outcome| match outcome {
    ///         Ok(meta) => println!("{}-{}@{:?}", meta.topic, meta.partition, meta.offset),
    ///         Err(e) => eprintln!("lost: {e}"),
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn send_with<F>(&self, record: ProducerRecord, callback: F) -> Result<()>
    where
        F: FnOnce(Result<RecordMetadata>) + Send + 'static,
    {
        self.buffer(record, Some(Box::new(callback))).await?;
        Ok(())
    }

    /// Buffers a record (with its callback): its batch's outcome and its
    /// index in the batch.
    async fn buffer(
        &self,
        record: ProducerRecord,
        callback: Option<DeliveryCallback>,
    ) -> Result<(Arc<BatchOutcome>, u32)> {
        let shared = &self.shared;
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
            let n = shared.layout_for_send(&record.topic).await?.partitions;
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
        // Released if the record is not buffered after all; once it is, its
        // batch keeps the count and gives it back when completed.
        let permit = match shared.memory.try_acquire_many(permits) {
            Ok(p) => p,
            Err(_) => {
                let wait = Duration::from_millis(shared.config.max_block_ms);
                let acquire = shared.memory.acquire_many(permits);
                match tokio::time::timeout(wait, acquire).await {
                    Ok(Ok(p)) => p,
                    Ok(Err(_)) => return Err(closed("while send waited for buffer space")),
                    Err(_) => return Err(ClientError::BufferFull { waited: wait }),
                }
            }
        };
        let data = RecordData {
            key: record.key,
            value: record.value,
            headers: record.headers,
            timestamp: record.timestamp.unwrap_or_else(now_ms),
        };
        let mut wake = false;
        let future = {
            let mut st = shared.lock();
            if st.closed {
                return Err(closed("before send"));
            }
            let batch_size = shared.config.batch_size;
            let mut key = (record.topic, 0);
            let exists = loop {
                key.1 = match (partition, count) {
                    (Some(p), _) => p,
                    (None, Some(n)) => st.sticky_partition(&key.0, n),
                    (None, None) => unreachable!("the count is known when no partition is"),
                };
                // None: no open batch; Some(full?) otherwise.
                let open = st.open.get(&key).map(|b| {
                    !b.builder.is_empty() && b.builder.estimated_size() + size > batch_size
                });
                if open != Some(true) {
                    break open.is_some();
                }
                // The record does not fit: close the batch. A sticky record
                // then moves on to the topic's next sticky partition.
                let b = st.open.remove(&key).expect("just seen");
                st.close(b);
                wake = true;
            };
            let partition = key.1;
            if !exists {
                let id = st.next_id;
                st.next_id += 1;
                st.waiters.insert(id, Vec::new());
                let mut builder = shared.builder()?;
                let hint = st.last_sizes.get(&key).copied().unwrap_or(0);
                builder.reserve(hint.min(batch_size));
                st.open.insert(
                    key.clone(),
                    Batch {
                        id,
                        topic: key.0.clone(),
                        partition,
                        builder,
                        created: Instant::now(),
                        closed_at: None,
                        outcome: BatchOutcome::new(key.0.clone(), partition),
                        reserved: 0,
                        records: 0,
                        callbacks: Vec::new(),
                    },
                );
                // The sender's next deadline may now be this batch's.
                wake = true;
            }
            let b = st.open.get_mut(&key).expect("just inserted");
            // An empty batch left behind on failure is completed by the
            // sender without being sent.
            b.builder.push(&data)?;
            let index = b.builder.len() as u32 - 1;
            b.records = index + 1;
            let future = (b.outcome.clone(), index);
            if let Some(cb) = callback {
                // Under the state lock, before the batch can reach the
                // sender: it cannot complete before its callback is in.
                b.callbacks.push((index, cb));
            }
            permit.forget();
            b.reserved += permits;
            shared.stats.accepted();
            if b.builder.estimated_size() >= batch_size {
                let b = st.open.remove(&key).expect("just seen");
                st.close(b);
                wake = true;
            }
            future
        };
        if wake {
            shared.wake.notify_one();
        }
        Ok(future)
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
        let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner()).take();
        match sender {
            Some(SenderHandle::Task(task)) => {
                let _ = task.await;
            }
            Some(SenderHandle::Thread(done)) => {
                let _ = done.await;
            }
            None => {}
        }
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

    fn idempotent(&self) -> bool {
        self.config.enable_idempotence && self.config.acks == Acks::All
    }

    fn builder(&self) -> Result<BatchBuilder> {
        Ok(match self.config.compression {
            Compression::None => BatchBuilder::new(Codec::None)?,
            Compression::Lz4 => BatchBuilder::new(Codec::Lz4)?,
            Compression::Zstd { level } => BatchBuilder::new(Codec::Zstd)?.zstd_level(level),
        })
    }

    /// The cached layout of a topic, and whether it may be used without
    /// asking the broker (younger than `metadata_max_age_ms` and not
    /// stale, or asking failed less than `retry_backoff_ms` ago).
    fn cached_layout(&self, topic: &str) -> Option<(TopicLayout, bool)> {
        let max_age = Duration::from_millis(self.config.metadata_max_age_ms);
        let backoff = Duration::from_millis(self.config.retry_backoff_ms);
        let st = self.lock();
        let c = st.layouts.get(topic)?;
        let fresh = !c.stale && c.learned.elapsed() < max_age;
        let resting = c.failed_at.is_some_and(|t| t.elapsed() < backoff);
        Some((c.layout.clone(), fresh || resting))
    }

    /// The topic's layout: from the cache while it may be used (see
    /// [`Shared::cached_layout`]), else asked of the broker. If asking
    /// fails and a layout is cached, that one is used (and not asked for
    /// again for `retry_backoff_ms`): a broker that restarts does not fail
    /// sends, whose batches are retried within `delivery_timeout_ms`.
    async fn layout(&self, topic: &str) -> Result<TopicLayout> {
        let cached = self.cached_layout(topic);
        if let Some((l, true)) = cached {
            return Ok(l);
        }
        let asked = self.backend.layout(topic).await.and_then(|l| {
            if l.partitions == 0 {
                return Err(ClientError::InvalidResponse(format!(
                    "topic `{topic}` has no partitions"
                )));
            }
            Ok(l)
        });
        match asked {
            Ok(l) => {
                self.lock().layouts.insert(
                    topic.to_string(),
                    CachedLayout {
                        layout: l.clone(),
                        learned: Instant::now(),
                        stale: false,
                        failed_at: None,
                    },
                );
                Ok(l)
            }
            Err(e) => {
                self.stats.metadata_failure(&e);
                let Some((l, _)) = cached else {
                    return Err(e);
                };
                tracing::debug!(topic, error = %e, "metadata lookup failed: using the cached layout");
                if let Some(c) = self.lock().layouts.get_mut(topic) {
                    c.failed_at = Some(Instant::now());
                }
                Ok(l)
            }
        }
    }

    /// The layout `send` needs to place a record. Looked up on the
    /// producer's own runtime (where its connections live) if it has one.
    /// A retriable failure without a cached layout is asked again every
    /// `retry_backoff_ms` until `max_block_ms` passed.
    async fn layout_for_send(self: &Arc<Self>, topic: &Arc<str>) -> Result<TopicLayout> {
        if let Some((l, true)) = self.cached_layout(topic) {
            return Ok(l);
        }
        let backoff = Duration::from_millis(self.config.retry_backoff_ms);
        let deadline = Instant::now() + Duration::from_millis(self.config.max_block_ms);
        loop {
            let got = match &self.io {
                Some(io) => {
                    let (shared, topic) = (self.clone(), topic.clone());
                    io.spawn(async move { shared.layout(&topic).await })
                        .await
                        .unwrap_or_else(|_| Err(closed("while send waited for metadata")))
                }
                None => self.layout(topic).await,
            };
            match got {
                Err(e) if e.is_retriable() && Instant::now() + backoff < deadline => {
                    tokio::time::sleep(backoff).await;
                }
                got => return got,
            }
        }
    }

    /// Marks a topic's layout stale (after a "not owner" or similar
    /// error): it is asked again before its next use, and used if asking
    /// fails.
    fn forget_layout(&self, topic: &str) {
        if let Some(c) = self.lock().layouts.get_mut(topic) {
            c.stale = true;
            c.failed_at = None;
        }
    }

    /// The batches to send now, the next linger deadline, and whether
    /// the producer is closed with nothing left open or ready.
    ///
    /// A batch whose linger passed stays open while its partition has a
    /// closed batch still waiting to be sent (`waiting`): records keep
    /// joining it until the partition can send again, as in Kafka's
    /// accumulator. So `linger_ms = 0` sends at once while there is room in
    /// flight and batches whatever arrives meanwhile, instead of closing a
    /// batch per record and queueing them behind the in-flight limit.
    ///
    /// With [`ProducerConfig::linger_adaptive`], a batch of a partition
    /// that is neither waiting nor `busy` (a batch in flight) is due at
    /// once.
    fn take_ready(
        &self,
        now: Instant,
        waiting: &HashSet<Key, FastHash>,
        busy: &HashSet<Key, FastHash>,
    ) -> (Vec<Batch>, Option<Instant>, bool) {
        let mut st = self.lock();
        let linger = Duration::from_millis(self.config.linger_ms);
        let adaptive = self.config.linger_adaptive;
        // (key, whether the batch lingered its time or was forced)
        let due: Vec<(Key, bool)> = st
            .open
            .iter()
            .filter_map(|(k, b)| {
                let forced = st.closed || b.id < st.force_below;
                let lingered = forced || b.created + linger <= now;
                let idle = adaptive && !busy.contains(k);
                (forced || ((lingered || idle) && !waiting.contains(k)))
                    .then(|| (k.clone(), lingered))
            })
            .collect();
        for (k, lingered) in due {
            let b = st.open.remove(&k).expect("listed");
            st.close_sticky(b, lingered);
        }
        // Held batches wake nobody: the sender looks again when their
        // partition's waiting batch is sent.
        let deadline = st
            .open
            .iter()
            .filter(|(k, _)| !waiting.contains(*k))
            .map(|(_, b)| b.created + linger)
            .min();
        let ready: Vec<Batch> = st.ready.drain(..).collect();
        let done = st.closed && ready.is_empty() && st.open.is_empty();
        (ready, deadline, done)
    }

    /// Resolves a batch's records and the flushes waiting for it.
    fn complete(&self, b: Batch, outcome: Result<Option<u64>>) {
        let Batch {
            id,
            outcome: shared,
            reserved,
            records,
            callbacks,
            ..
        } = b;
        let n = u64::from(records);
        self.stats.completed(n, outcome.is_ok());
        shared.set(outcome);
        self.memory.add_permits(reserved as usize);
        for (index, callback) in callbacks {
            let r = shared.record(index).expect("just set");
            let run = std::panic::AssertUnwindSafe(move || callback(r));
            if std::panic::catch_unwind(run).is_err() {
                tracing::error!(topic = %shared.topic, partition = shared.partition, "a delivery callback panicked");
            }
        }
        let waiters = self.lock().waiters.remove(&id).unwrap_or_default();
        for w in waiters {
            let _ = w.send(());
        }
    }
}

/// A batch between being closed and being acknowledged.
struct Outgoing {
    batch: Batch,
    /// The encoded batch, once built (at its first send, stamped with the
    /// producer identity and sequence).
    bytes: Option<Bytes>,
    /// (generation of the producer identity, base sequence).
    stamp: Option<(u64, i32)>,
    attempts: u32,
}

/// The sender's view of one partition.
#[derive(Default)]
struct Lane {
    /// Batches not sent yet, or waiting to be sent again, in order.
    queue: VecDeque<Outgoing>,
    /// Base sequences of this lane's batches in flight.
    in_flight: Vec<i32>,
    /// Batches in flight (with or without sequences).
    in_flight_count: usize,
    /// Not sent before this (retry backoff).
    not_before: Option<Instant>,
    /// The identity generation of `next_seq`.
    generation: u64,
    next_seq: i32,
    /// Batches stamped in a generation up to this one can no longer be
    /// appended in order (an earlier batch failed for good): they fail.
    poisoned: Option<u64>,
}

/// Sequences run from 0 to `i32::MAX`, then wrap to 0.
fn seq_add(seq: i32, n: u32) -> i32 {
    ((seq as i64 + n as i64) % (i32::MAX as i64 + 1)) as i32
}

/// Whether sequence `a` comes before `b` (within half the sequence space).
fn seq_before(a: i32, b: i32) -> bool {
    let d = (b as i64 - a as i64).rem_euclid(i32::MAX as i64 + 1);
    d != 0 && d < (1 << 30)
}

type Key = (Arc<str>, u32);

/// The batching maps' hasher: they are keyed by topic names, hashed once
/// or more per record, so SipHash's DoS resistance buys nothing and its
/// cost (or FNV's, a byte at a time: 15 % of the CPU of a 100-byte produce)
/// shows. FxHash takes a word at a time.
type FastHash = rustc_hash::FxBuildHasher;

/// A finished produce request: its route and each batch with its result.
type Done = (Route, Vec<(Key, Outgoing, Result<Option<u64>>)>);

/// The sender task's state.
struct Sender {
    shared: Arc<Shared>,
    lanes: HashMap<Key, Lane, FastHash>,
    in_flight: HashMap<Route, usize>,
    identity: Option<(i64, i16)>,
    generation: u64,
    done_tx: tokio::sync::mpsc::UnboundedSender<Done>,
    done_rx: tokio::sync::mpsc::UnboundedReceiver<Done>,
    identity_retry: Option<Instant>,
    /// Why the last attempt to get a producer id failed.
    identity_error: Option<ClientError>,
}

impl Sender {
    fn new(shared: Arc<Shared>) -> Sender {
        let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel();
        Sender {
            shared,
            lanes: HashMap::default(),
            in_flight: HashMap::new(),
            identity: None,
            generation: 0,
            done_tx,
            done_rx,
            identity_retry: None,
            identity_error: None,
        }
    }

    fn requests_in_flight(&self) -> usize {
        self.in_flight.values().sum()
    }

    fn max_in_flight(&self) -> usize {
        let m = self.shared.config.max_in_flight.max(1);
        if self.shared.idempotent() {
            m.min(MAX_IN_FLIGHT_IDEMPOTENT)
        } else {
            m
        }
    }

    /// Partitions with a batch in flight.
    fn busy(&self) -> HashSet<Key, FastHash> {
        self.lanes
            .iter()
            .filter(|(_, l)| l.in_flight_count > 0)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Partitions with a closed batch not yet sent.
    fn waiting(&self) -> HashSet<Key, FastHash> {
        self.lanes
            .iter()
            .filter(|(_, l)| !l.queue.is_empty())
            .map(|(k, _)| k.clone())
            .collect()
    }

    async fn run(mut self) {
        let mut waiting = HashSet::default();
        loop {
            let busy = if self.shared.config.linger_adaptive {
                self.busy()
            } else {
                HashSet::default()
            };
            let (ready, deadline, closed_empty) =
                self.shared.take_ready(Instant::now(), &waiting, &busy);
            for b in ready {
                if b.builder.is_empty() {
                    self.shared.complete(b, Ok(None));
                    continue;
                }
                let key = (b.topic.clone(), b.partition);
                self.lanes
                    .entry(key)
                    .or_default()
                    .queue
                    .push_back(Outgoing {
                        batch: b,
                        bytes: None,
                        stamp: None,
                        attempts: 0,
                    });
            }
            self.expire();
            let next_retry = self.dispatch().await;
            if closed_empty
                && self.requests_in_flight() == 0
                && self.lanes.values().all(|l| l.queue.is_empty())
            {
                return;
            }
            // A partition whose waiting batch just went out may close its
            // held open batch now.
            let now_waiting = self.waiting();
            let freed = waiting.iter().any(|k| !now_waiting.contains(k));
            waiting = now_waiting;
            if freed {
                continue;
            }
            let wake_at = [deadline, next_retry].into_iter().flatten().min();
            tokio::select! {
                done = self.done_rx.recv() => {
                    if let Some(done) = done {
                        self.finish(done);
                    }
                    // Handle every other completion at once.
                    while let Ok(done) = self.done_rx.try_recv() {
                        self.finish(done);
                    }
                }
                _ = self.shared.wake.notified() => {}
                _ = sleep_until_opt(wake_at) => {}
            }
        }
    }

    /// Fails queued batches older than `delivery_timeout_ms`.
    fn expire(&mut self) {
        let timeout = Duration::from_millis(self.shared.config.delivery_timeout_ms);
        let keys: Vec<Key> = self.lanes.keys().cloned().collect();
        for key in keys {
            loop {
                let lane = self.lanes.get_mut(&key).expect("listed");
                let expired = lane
                    .queue
                    .front()
                    .is_some_and(|o| o.batch.created.elapsed() >= timeout);
                if !expired {
                    break;
                }
                let o = lane.queue.pop_front().expect("seen");
                let e = match &self.identity_error {
                    Some(e) if o.bytes.is_none() => ClientError::InvalidArgument(format!(
                        "not sent within delivery_timeout_ms ({} ms): getting a producer id failed: {e}",
                        timeout.as_millis()
                    )),
                    _ => ClientError::Timeout(timeout),
                };
                self.fail(&key, o, e);
            }
        }
    }

    /// Sends what can be sent; returns the earliest retry time of lanes
    /// waiting for their backoff.
    async fn dispatch(&mut self) -> Option<Instant> {
        let now = Instant::now();
        let idempotent = self.shared.idempotent();
        if idempotent && self.identity.is_none() && self.lanes.values().any(|l| !l.queue.is_empty())
        {
            if self.identity_retry.is_some_and(|t| t > now) {
                return self.identity_retry;
            }
            match self.shared.backend.init_producer_id().await {
                Ok(id) => {
                    self.identity = Some(id);
                    self.identity_retry = None;
                    self.identity_error = None;
                }
                Err(e) => {
                    self.identity_error = Some(e);
                    let t = now + Duration::from_millis(self.shared.config.retry_backoff_ms);
                    self.identity_retry = Some(t);
                    return Some(t);
                }
            }
        }
        let mut next_retry: Option<Instant> = None;
        // Which lanes can send, grouped by route.
        let mut by_route: HashMap<Route, Vec<Key>> = HashMap::new();
        let keys: Vec<Key> = self
            .lanes
            .iter()
            .filter(|(_, l)| !l.queue.is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let lane = &self.lanes[&key];
            if let Some(t) = lane.not_before {
                if t > now {
                    next_retry = Some(next_retry.map_or(t, |n: Instant| n.min(t)));
                    continue;
                }
            }
            // Past its backoff, the lane may still have to wait (a retry
            // behind batches in flight, or its in-flight limit).
            if !self.sendable(&key, now) {
                continue;
            }
            let route = self.route(&key.0, key.1).await;
            by_route.entry(route).or_default().push(key);
        }
        let max = self.max_in_flight();
        for (route, mut keys) in by_route {
            // The partition whose next batch is oldest goes first, so that
            // busy partitions (up to PARTITION_REQUEST_BYTES_MAX each in a
            // request) do not keep the others waiting.
            keys.sort_by_key(|k| self.lanes[k].queue.front().map(|o| o.batch.created));
            // Partitions take turns; one with more batches queued goes to
            // the back and is in a later request, so a single busy
            // partition fills every request slot of its connection, not
            // one per pass of the sender.
            let mut keys: VecDeque<Key> = keys.into();
            while !keys.is_empty() && self.in_flight.get(&route).copied().unwrap_or(0) < max {
                // One request: each partition's waiting batches, up to
                // REQUEST_BYTES_MAX.
                let mut batches = Vec::new();
                let mut bytes = 0usize;
                let mut more = Vec::new();
                while let Some(key) = keys.front().cloned() {
                    if !batches.is_empty() && bytes >= REQUEST_BYTES_MAX {
                        break;
                    }
                    keys.pop_front();
                    // The partition's next batch, and more of its batches
                    // not sent before, in order, up to
                    // PARTITION_REQUEST_BYTES_MAX (a batch sent again goes
                    // alone).
                    let mut part = 0usize;
                    while part == 0 || self.joins_request(&key, part, bytes, now) {
                        let Some(o) = self.take_for_send(&key) else {
                            break;
                        };
                        let n = o.bytes.as_ref().map_or(0, Bytes::len);
                        let again = o.attempts > 1;
                        bytes += n;
                        part += n.max(1);
                        batches.push((key.clone(), o));
                        if again {
                            break;
                        }
                    }
                    if self.sendable(&key, now) {
                        more.push(key);
                    }
                }
                keys.extend(more);
                if batches.is_empty() {
                    break;
                }
                *self.in_flight.entry(route).or_default() += 1;
                self.shared.stats.request_sent();
                let shared = self.shared.clone();
                let acks = self.shared.config.acks;
                let done_tx = self.done_tx.clone();
                let span = tracing::debug_span!("weir.produce", ?route, batches = batches.len());
                let call = async move {
                    let req = batches
                        .iter()
                        .map(|((t, p), o)| (t.to_string(), *p, o.bytes.clone().expect("built")))
                        .collect();
                    let n = batches.len();
                    let started = Instant::now();
                    let answer = shared.backend.produce(route, acks, req).await;
                    shared.stats.latency(started.elapsed());
                    let results: Vec<Result<Option<u64>>> = match answer {
                        Ok(r) if r.len() == n => r,
                        Ok(r) => {
                            let e = ClientError::InvalidResponse(format!(
                                "{} produce results for {n} batches",
                                r.len()
                            ));
                            (0..n).map(|_| Err(e.duplicate())).collect()
                        }
                        Err(e) => (0..n).map(|_| Err(e.duplicate())).collect(),
                    };
                    let out = batches
                        .into_iter()
                        .zip(results)
                        .map(|((k, o), r)| (k, o, r))
                        .collect();
                    let _ = done_tx.send((route, out));
                };
                let mut call: BoxFuture<'static, ()> = Box::pin(call.instrument(span));
                // Poll the call once here, so that requests reach their
                // connection in the order they were formed (a connection
                // sends calls in the order they are first polled); then
                // let a task finish it.
                let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
                if first.is_pending() {
                    tokio::spawn(call);
                }
            }
        }
        // A batch failed for good meanwhile and dropped the identity: the
        // next pass (at once) fetches a new one for the batches left.
        if idempotent && self.identity.is_none() && self.lanes.values().any(|l| !l.queue.is_empty())
        {
            next_retry = Some(next_retry.map_or(now, |t| t.min(now)));
        }
        next_retry
    }

    /// Whether a partition's next queued batch may be sent now: not waiting
    /// for a retry backoff, not a retry while others of its partition are
    /// in flight (so they reach the broker in order), and fewer of its
    /// batches in flight than [`Sender::lane_in_flight_max`].
    fn sendable(&self, key: &Key, now: Instant) -> bool {
        let Some(lane) = self.lanes.get(key) else {
            return false;
        };
        let Some(front) = lane.queue.front() else {
            return false;
        };
        lane.not_before.is_none_or(|t| t <= now)
            && !(front.attempts > 0 && lane.in_flight_count > 0)
            && lane.in_flight_count < self.lane_in_flight_max()
    }

    /// Whether a partition's next queued batch joins the request being
    /// formed, after `part` bytes of the partition's batches (`bytes` in
    /// all): a batch not sent before, of a partition that may send
    /// ([`Sender::sendable`]), within [`PARTITION_REQUEST_BYTES_MAX`] and
    /// [`REQUEST_BYTES_MAX`].
    fn joins_request(&self, key: &Key, part: usize, bytes: usize, now: Instant) -> bool {
        let Some(front) = self.lanes.get(key).and_then(|l| l.queue.front()) else {
            return false;
        };
        let size = front.batch.builder.estimated_size();
        front.attempts == 0
            && self.sendable(key, now)
            && part + size <= PARTITION_REQUEST_BYTES_MAX
            && bytes + size <= REQUEST_BYTES_MAX
    }

    /// Batches of one partition in flight at most: with idempotence, as
    /// many as the broker remembers per producer to recognise a retried
    /// one ([`LANE_BATCHES_IN_FLIGHT_IDEMPOTENT`]).
    fn lane_in_flight_max(&self) -> usize {
        if self.shared.idempotent() {
            LANE_BATCHES_IN_FLIGHT_IDEMPOTENT
        } else {
            usize::MAX
        }
    }

    /// Where a partition's batches go.
    async fn route(&mut self, topic: &str, partition: u32) -> Route {
        if !self.shared.config.shard_aware {
            return Route::Bootstrap;
        }
        match self.shared.layout(topic).await {
            Ok(l) => l
                .owners
                .get(partition as usize)
                .map_or(Route::Bootstrap, |&c| Route::Core(c)),
            Err(_) => Route::Bootstrap,
        }
    }

    /// Takes the front batch of a lane for sending: builds it (stamped
    /// with the producer identity and the lane's next sequence) on its
    /// first send.
    fn take_for_send(&mut self, key: &Key) -> Option<Outgoing> {
        let identity = self.identity;
        let generation = self.generation;
        let idempotent = self.shared.idempotent();
        let lane = self.lanes.get_mut(key)?;
        // A batch failed for good in this pass dropped the identity: the
        // next batches wait in the queue for a new one (the next pass).
        if idempotent && identity.is_none() && lane.queue.front()?.bytes.is_none() {
            return None;
        }
        let mut o = lane.queue.pop_front()?;
        if o.bytes.is_none() {
            if idempotent {
                let (pid, epoch) = identity.expect("checked above");
                if lane.generation != generation {
                    lane.generation = generation;
                    lane.next_seq = 0;
                }
                o.batch.builder.producer_id = pid;
                o.batch.builder.producer_epoch = epoch;
                o.batch.builder.base_sequence = lane.next_seq;
                o.batch.builder.transactional = self.shared.config.transactional;
                o.stamp = Some((generation, lane.next_seq));
                lane.next_seq = seq_add(lane.next_seq, o.batch.builder.len() as u32);
            }
            // The builder is done with: complete the batch in its buffer.
            let empty = BatchBuilder::new(Codec::None).expect("uncompressed is supported");
            match std::mem::replace(&mut o.batch.builder, empty).finish() {
                Ok(b) => {
                    self.shared.stats.batch(b.len());
                    let closed = o.batch.closed_at.unwrap_or(o.batch.created);
                    self.shared
                        .stats
                        .batch_stages(closed - o.batch.created, closed.elapsed());
                    o.bytes = Some(b.freeze());
                }
                Err(e) => {
                    self.fail(key, o, e.into());
                    return None;
                }
            }
        }
        let lane = self.lanes.get_mut(key).expect("present");
        if let Some((_, seq)) = o.stamp {
            lane.in_flight.push(seq);
        }
        lane.in_flight_count += 1;
        o.attempts += 1;
        Some(o)
    }

    /// Handles a finished request.
    fn finish(&mut self, (route, results): Done) {
        if let Some(n) = self.in_flight.get_mut(&route) {
            *n = n.saturating_sub(1);
        }
        self.shared.stats.request_done();
        let backoff = Duration::from_millis(self.shared.config.retry_backoff_ms);
        let timeout = Duration::from_millis(self.shared.config.delivery_timeout_ms);
        for (key, o, r) in results {
            let lane = self.lanes.entry(key.clone()).or_default();
            lane.in_flight_count = lane.in_flight_count.saturating_sub(1);
            if let Some((_, seq)) = o.stamp {
                if let Some(i) = lane.in_flight.iter().position(|s| *s == seq) {
                    lane.in_flight.swap_remove(i);
                }
            }
            let e = match r {
                Ok(offset) => {
                    let bytes = o.bytes.as_ref().map_or(0, Bytes::len);
                    self.shared.stats.acked_bytes(bytes as u64);
                    self.shared.complete(o.batch, Ok(offset));
                    continue;
                }
                Err(e) => e,
            };
            self.shared.stats.error(&e);
            // The layout changed, or a core's connection failed (after a
            // broker restart its port may be another): learn it again.
            if matches!(
                e.code(),
                Some(
                    ErrorCode::NotOwner | ErrorCode::NotLeader | ErrorCode::UnknownTopicOrPartition
                )
            ) || (e.code().is_none() && e.is_retriable() && route != Route::Bootstrap)
            {
                self.shared.forget_layout(&key.0);
            }
            let poisoned = match (o.stamp, lane.poisoned) {
                (Some((g, _)), Some(p)) => g <= p,
                _ => false,
            };
            // A gap reported while an earlier batch of the lane is still
            // unresolved is that batch's doing: send again after it.
            let earlier_pending = o.stamp.is_some_and(|(g, seq)| {
                lane.in_flight.iter().any(|s| seq_before(*s, seq))
                    || lane.queue.iter().any(|q| {
                        q.stamp
                            .is_some_and(|(qg, qs)| qg == g && seq_before(qs, seq))
                    })
            });
            let retriable = e.is_retriable()
                || (earlier_pending && e.code() == Some(ErrorCode::OutOfOrderSequence));
            if !poisoned
                && retriable
                && o.attempts <= self.shared.config.retries
                && o.batch.created.elapsed() + backoff < timeout
            {
                // Back in the queue, in sequence order (stamped batches go
                // before unstamped ones).
                let pos = lane
                    .queue
                    .iter()
                    .position(|q| match (q.stamp, o.stamp) {
                        (None, _) => true,
                        (Some((qg, qs)), Some((g, s))) => qg > g || (qg == g && seq_before(s, qs)),
                        (Some(_), None) => false,
                    })
                    .unwrap_or(lane.queue.len());
                lane.queue.insert(pos, o);
                lane.not_before = Some(Instant::now() + backoff);
                self.shared.stats.retry();
                continue;
            }
            let e = if poisoned {
                ClientError::InvalidArgument(format!(
                    "not appended: an earlier batch of {}-{} failed for good, so this one could \
                     not keep its place in the partition ({e})",
                    key.0, key.1
                ))
            } else {
                e
            };
            self.fail(&key, o, e);
        }
    }

    /// Fails a batch for good. With idempotence, the lane's later batches
    /// stamped in the same generation can no longer be appended in order:
    /// they fail too, and the producer takes a new identity so that the
    /// partition's next batches start a new sequence.
    fn fail(&mut self, key: &Key, o: Outgoing, e: ClientError) {
        if let Some((g, _)) = o.stamp {
            let lane = self.lanes.get_mut(key).expect("present");
            lane.poisoned = Some(lane.poisoned.map_or(g, |p| p.max(g)));
            let doomed: Vec<Outgoing> = {
                let mut keep = VecDeque::new();
                let mut doomed = Vec::new();
                for q in lane.queue.drain(..) {
                    if q.stamp.is_some_and(|(qg, _)| qg <= g) {
                        doomed.push(q);
                    } else {
                        keep.push_back(q);
                    }
                }
                lane.queue = keep;
                doomed
            };
            if g == self.generation {
                self.generation += 1;
                self.identity = None;
            }
            for q in doomed {
                let msg = format!(
                    "not appended: an earlier batch of {}-{} failed for good ({e}), so this one \
                     could not keep its place in the partition",
                    key.0, key.1
                );
                self.shared
                    .complete(q.batch, Err(ClientError::InvalidArgument(msg)));
            }
        }
        self.shared.complete(o.batch, Err(e));
    }
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Produce requests carry at most this many bytes of batches (a single
/// larger batch is sent alone).
pub const REQUEST_BYTES_MAX: usize = 4 << 20;

/// One partition's batches in one request: at most this many bytes (at
/// least one batch). A partition with several batches waiting sends them
/// together, so one busy partition has more than one batch per request
/// in flight.
pub const PARTITION_REQUEST_BYTES_MAX: usize = 1 << 20;

/// With idempotence, at most this many requests per connection are in
/// flight (as Kafka).
pub const MAX_IN_FLIGHT_IDEMPOTENT: usize = 5;

/// With idempotence, at most this many batches of one partition are in
/// flight: the batches a Weir broker remembers per producer and partition
/// to answer a retried one with its original offsets
/// (`weir_storage::producer_state::PRODUCER_BATCHES_RETAINED`).
pub const LANE_BATCHES_IN_FLIGHT_IDEMPOTENT: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_wrap_and_order() {
        assert_eq!(seq_add(5, 3), 8);
        assert_eq!(seq_add(i32::MAX, 1), 0);
        assert_eq!(seq_add(i32::MAX - 1, 3), 1);
        assert!(seq_before(1, 2));
        assert!(!seq_before(2, 2));
        assert!(!seq_before(3, 2));
        assert!(seq_before(i32::MAX, 0));
        assert!(!seq_before(0, i32::MAX));
    }
}
