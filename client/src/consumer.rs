//! A polling [`Consumer`] over manually assigned partitions.
//!
//! [`Consumer::assign`] takes the partitions to read; [`Consumer::poll`]
//! fetches all of them in one [`Client::fetch_many`] request (a long poll),
//! validates every batch's CRC, decompresses lz4/zstd batches, and returns
//! up to [`ConsumerConfig::max_poll_records`] records, in offset order per
//! partition. Records decoded beyond that limit stay buffered for the next
//! poll.
//!
//! ## Positions and resets
//!
//! A partition's *position* is the offset of the next record `poll` returns.
//! It is set by [`Consumer::seek`] and friends; a partition without one gets
//! it from [`ConsumerConfig::auto_offset_reset`] on the next poll. When the
//! broker answers a fetch with `OffsetOutOfRange` (retention removed the
//! records, or the position is past the log end), the position is reset the
//! same way, and the offsets jumped over are added to
//! [`Consumer::skipped`]; with [`OffsetReset::None`] the poll fails with
//! [`ClientError::Partition`] (code `OffsetOutOfRange`, see [`Consumer::poll`]) naming the partition and the valid range.
//! Nothing is skipped silently.
//!
//! ## Pipelining
//!
//! Fetches are sent ahead on spawned tasks, up to [`PREFETCH_DEPTH`] (2)
//! at a time. Before returning, `poll` sends one if none is out. When
//! `poll` takes an answer it sends the next fetch before decoding, so the
//! transfer overlaps the decoding: by offset (after the answer's last
//! batch headers) if none is out, else — while records are coming — one
//! that *continues* where the fetch still out will end
//! ([`FetchPartition::CONTINUE`]: the broker serves a connection's
//! requests in order and remembers where its last fetch of each partition
//! ended), so the broker has the next fetch in hand while the client reads
//! and decodes the one before. The consumer holds at most about three
//! fetches' worth of records ([`ConsumerConfig::fetch_max_bytes`] each).
//! A fetch sent ahead never waits for data at the broker (it would hold
//! back the fetch of a `poll` after a seek); when it comes back empty,
//! `poll` long-polls. A partition's part of an answer is dropped if the
//! partition was sought, reset or reassigned meanwhile; a continuing
//! fetch whose part did not start at the partition's fetch offset (a
//! seek, a reconnection, an error before it) is dropped with every one
//! after it, and the next fetch is by offset. Set
//! [`ConsumerConfig::prefetch`] to `false` to fetch only inside `poll`.
//!
//! ## Left out
//!
//! No consumer groups or committed offsets (positions live in memory).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use weir_proto::batch::Compression as Codec;
use weir_proto::error_code::ErrorCode;
use weir_proto::messages::{FetchPartition, OffsetSpec};
use weir_proto::reader::RecordBatch;

use crate::producer::BoxFuture;
use crate::stats::ConsumerStats;
use crate::{Client, ClientError, FetchedBatches, Result};

/// Where a partition without a valid position starts (Kafka's
/// `auto.offset.reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OffsetReset {
    /// The log start offset.
    Earliest,
    /// The log end offset: only records appended from now on (the default).
    #[default]
    Latest,
    /// No reset: `poll` fails (see [`Consumer::poll`]).
    None,
}

/// What a consumer reads of transactional writes (Kafka's
/// `isolation.level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsolationLevel {
    /// Every record written, committed or not (the default, as Kafka's).
    #[default]
    ReadUncommitted,
    /// Only records of committed transactions (and non-transactional
    /// ones): reads end at the last stable offset, aborted transactions'
    /// records are skipped.
    ReadCommitted,
}

/// Settings of a [`Consumer`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConsumerConfig {
    /// Most records one `poll` returns. Default 500.
    pub max_poll_records: usize,
    /// Most bytes of one fetch response. Default 50 MiB.
    pub fetch_max_bytes: u32,
    /// Most bytes one partition contributes to a fetch (at least one batch
    /// is always returned). Default 1 MiB.
    pub max_partition_fetch_bytes: u32,
    /// Longest time the broker waits for data in a fetch (further bounded by
    /// `poll`'s timeout). Default 500 ms.
    pub fetch_max_wait_ms: u32,
    /// What to do without a valid position. Default [`OffsetReset::Latest`].
    pub auto_offset_reset: OffsetReset,
    /// Send the next fetch before `poll` returns (see the module docs).
    /// Default true.
    pub prefetch: bool,
    /// Fetch each partition from the node and core that holds it (a
    /// [`crate::ShardRouter`]: one connection per core, learned from
    /// metadata, re-learned on `NotLeader`/`NotOwner`) rather than through
    /// the given connection, which then only carries metadata. Needed in
    /// a cluster of several nodes (a node serves only its own
    /// partitions). Default true; property `weir.shard.aware`.
    pub shard_aware: bool,
    /// Read uncommitted (default) or only committed transactions;
    /// property `isolation.level`.
    pub isolation_level: IsolationLevel,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            max_poll_records: 500,
            fetch_max_bytes: 50 << 20,
            max_partition_fetch_bytes: 1 << 20,
            fetch_max_wait_ms: 500,
            auto_offset_reset: OffsetReset::Latest,
            prefetch: true,
            shard_aware: true,
            isolation_level: IsolationLevel::ReadUncommitted,
        }
    }
}

/// A record returned by [`Consumer::poll`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerRecord {
    /// The topic.
    pub topic: Arc<str>,
    /// The partition.
    pub partition: u32,
    /// The record's offset.
    pub offset: u64,
    /// The record's timestamp (ms).
    pub timestamp: i64,
    /// The key; `None` for null.
    pub key: Option<Bytes>,
    /// The value; `None` for null (a tombstone).
    pub value: Option<Bytes>,
    /// Headers in order (keys decoded as UTF-8, lossily).
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// What a [`Consumer`] reads through: a [`Client`], or a fake in tests.
pub trait ConsumerBackend: Send + Sync + 'static {
    /// As [`Client::fetch_many_at`].
    fn fetch_many(
        &self,
        isolation: IsolationLevel,
        max_wait_ms: u32,
        max_bytes: u32,
        partitions: Vec<FetchPartition>,
    ) -> BoxFuture<'_, Result<Vec<Result<FetchedBatches>>>>;

    /// As [`Client::list_offsets_at`].
    fn list_offsets<'a>(
        &'a self,
        isolation: IsolationLevel,
        topic: &'a str,
        partition: u32,
        spec: OffsetSpec,
    ) -> BoxFuture<'a, Result<Option<u64>>>;
}

impl ConsumerBackend for Client {
    fn fetch_many(
        &self,
        isolation: IsolationLevel,
        max_wait_ms: u32,
        max_bytes: u32,
        partitions: Vec<FetchPartition>,
    ) -> BoxFuture<'_, Result<Vec<Result<FetchedBatches>>>> {
        Box::pin(Client::fetch_many_at(
            self,
            isolation,
            max_wait_ms,
            max_bytes,
            partitions,
        ))
    }

    fn list_offsets<'a>(
        &'a self,
        isolation: IsolationLevel,
        topic: &'a str,
        partition: u32,
        spec: OffsetSpec,
    ) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(Client::list_offsets_at(
            self, isolation, topic, partition, spec,
        ))
    }
}

/// One assigned partition's state.
#[derive(Debug)]
struct PartitionState {
    /// Shared with the records handed out.
    topic: Arc<str>,
    partition: u32,
    /// Next offset `poll` returns; `None` until set or reset.
    position: Option<u64>,
    /// Where the next fetch starts (past the buffered records).
    fetch_offset: u64,
    /// Decoded records not yet returned.
    buffered: VecDeque<ConsumerRecord>,
    /// Offsets jumped over by out-of-range resets.
    skipped: u64,
}

impl PartitionState {
    fn set_position(&mut self, offset: u64) {
        self.position = Some(offset);
        self.fetch_offset = offset;
        self.buffered.clear();
    }
}

/// Reads records from assigned partitions. See the [module docs](self).
pub struct Consumer {
    backend: Arc<dyn ConsumerBackend>,
    config: ConsumerConfig,
    parts: Vec<PartitionState>,
    /// Partition `poll` drains first (rotates for fairness).
    next_drain: usize,
    /// The fetches sent ahead, oldest first (at most [`PREFETCH_DEPTH`]).
    prefetch: VecDeque<Prefetch>,
    /// Fires once the newest fetch sent ahead has its place in its
    /// connection's queue: the next one waits for it, so that a
    /// continuing fetch goes out after the fetch it continues.
    last_placed: Option<tokio::sync::oneshot::Receiver<()>>,
    stats: ConsumerStats,
}

/// Most fetches a [`Consumer`] keeps sent ahead (see the module docs).
pub const PREFETCH_DEPTH: usize = 2;

/// A [`Consumer`] as a [`futures_core::Stream`] of records; from
/// [`Consumer::into_stream`].
pub struct ConsumerStream {
    state: StreamState,
    /// Records of the last poll not yet yielded.
    buffered: VecDeque<ConsumerRecord>,
    poll_timeout: Duration,
}

/// A poll in progress owns the consumer and gives it back with its result.
type PollFuture = BoxFuture<'static, (Box<Consumer>, Result<Vec<ConsumerRecord>>)>;

enum StreamState {
    Idle(Box<Consumer>),
    Polling(PollFuture),
}

impl std::fmt::Debug for ConsumerStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerStream")
            .field("buffered", &self.buffered.len())
            .field("polling", &matches!(self.state, StreamState::Polling(_)))
            .finish()
    }
}

impl ConsumerStream {
    /// The consumer back, with the records already polled but not yet
    /// yielded (their positions are past them: seek back to read them
    /// again), unless a poll is in progress (then `Err(self)`; poll the
    /// stream until it yields and try again).
    pub fn into_inner(self) -> std::result::Result<(Consumer, Vec<ConsumerRecord>), Self> {
        match self.state {
            StreamState::Idle(c) => Ok((*c, self.buffered.into())),
            StreamState::Polling(_) => Err(self),
        }
    }
}

impl futures_core::Stream for ConsumerStream {
    type Item = Result<ConsumerRecord>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = &mut *self;
        loop {
            if let Some(r) = this.buffered.pop_front() {
                return Poll::Ready(Some(Ok(r)));
            }
            match &mut this.state {
                StreamState::Idle(_) => {
                    let timeout = this.poll_timeout;
                    let placeholder = StreamState::Polling(Box::pin(std::future::pending()));
                    let StreamState::Idle(mut c) = std::mem::replace(&mut this.state, placeholder)
                    else {
                        unreachable!("matched Idle")
                    };
                    this.state = StreamState::Polling(Box::pin(async move {
                        let r = c.poll(timeout).await;
                        (c, r)
                    }));
                }
                StreamState::Polling(f) => {
                    let (c, r) = std::task::ready!(f.as_mut().poll(cx));
                    this.state = StreamState::Idle(c);
                    match r {
                        Ok(records) => this.buffered.extend(records),
                        Err(e) => return Poll::Ready(Some(Err(e))),
                    }
                }
            }
        }
    }
}

/// A fetch sent before `poll` needed it.
struct Prefetch {
    /// (topic, partition, fetch offset) of each fetched partition, in
    /// request order; the offsets are [`FetchPartition::CONTINUE`] for a
    /// continuing fetch.
    targets: Vec<(String, u32, u64)>,
    task: tokio::task::JoinHandle<Result<Vec<Result<FetchedBatches>>>>,
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("config", &self.config)
            .field("partitions", &self.parts)
            .finish()
    }
}

impl Consumer {
    /// A builder: bootstrap servers by name, retries, Kafka-style
    /// properties. See [`crate::ConsumerBuilder`].
    pub fn builder() -> crate::ConsumerBuilder {
        crate::ConsumerBuilder::default()
    }

    /// A consumer reading through `client`'s broker: with
    /// [`ConsumerConfig::shard_aware`] (the default) each partition from
    /// the node and core that holds it, else everything through `client`.
    pub fn new(client: impl Into<Arc<Client>>, config: ConsumerConfig) -> Consumer {
        let client: Arc<Client> = client.into();
        if config.shard_aware {
            return Consumer::with_backend(Arc::new(crate::ShardRouter::new(client)), config);
        }
        Consumer::with_backend(client, config)
    }

    /// A consumer reading through any [`ConsumerBackend`].
    pub fn with_backend(backend: Arc<dyn ConsumerBackend>, config: ConsumerConfig) -> Consumer {
        Consumer {
            backend,
            config,
            parts: Vec::new(),
            next_drain: 0,
            prefetch: VecDeque::new(),
            last_placed: None,
            stats: ConsumerStats::default(),
        }
    }

    /// The consumer's settings.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// Replaces the assignment. Partitions kept from the previous
    /// assignment keep their position and buffered records; new ones start
    /// without a position. Duplicates are ignored.
    pub fn assign(&mut self, partitions: Vec<(String, u32)>) {
        let mut old = std::mem::take(&mut self.parts);
        for (topic, partition) in partitions {
            if self
                .parts
                .iter()
                .any(|p| *p.topic == *topic && p.partition == partition)
            {
                continue;
            }
            let state = match old
                .iter()
                .position(|p| *p.topic == *topic && p.partition == partition)
            {
                Some(i) => old.swap_remove(i),
                None => PartitionState {
                    topic: Arc::from(topic.as_str()),
                    partition,
                    position: None,
                    fetch_offset: 0,
                    buffered: VecDeque::new(),
                    skipped: 0,
                },
            };
            self.parts.push(state);
        }
        self.next_drain = 0;
        self.drop_prefetched();
    }

    /// The assigned partitions, in assignment order.
    pub fn assignment(&self) -> Vec<(String, u32)> {
        self.parts
            .iter()
            .map(|p| (p.topic.to_string(), p.partition))
            .collect()
    }

    fn index(&self, topic: &str, partition: u32) -> Result<usize> {
        self.parts
            .iter()
            .position(|p| *p.topic == *topic && p.partition == partition)
            .ok_or_else(|| {
                ClientError::InvalidArgument(format!(
                    "partition {topic}-{partition} is not assigned"
                ))
            })
    }

    /// Sets the next offset `poll` returns for an assigned partition
    /// (dropping its buffered records).
    pub fn seek(&mut self, topic: &str, partition: u32, offset: u64) -> Result<()> {
        let i = self.index(topic, partition)?;
        self.parts[i].set_position(offset);
        Ok(())
    }

    /// Seeks each partition to its log start offset.
    pub async fn seek_to_beginning(&mut self, partitions: &[(String, u32)]) -> Result<()> {
        for (topic, partition) in partitions {
            self.seek_to_spec(topic, *partition, OffsetSpec::Earliest)
                .await?;
        }
        Ok(())
    }

    /// Seeks each partition to its log end offset.
    pub async fn seek_to_end(&mut self, partitions: &[(String, u32)]) -> Result<()> {
        for (topic, partition) in partitions {
            self.seek_to_spec(topic, *partition, OffsetSpec::Latest)
                .await?;
        }
        Ok(())
    }

    /// Seeks to the first record whose timestamp is at or after `ts` (ms),
    /// or to the log end if every record is older. Returns the new position.
    pub async fn seek_to_timestamp(&mut self, topic: &str, partition: u32, ts: i64) -> Result<u64> {
        let i = self.index(topic, partition)?;
        let offset = match self
            .backend
            .list_offsets(
                self.config.isolation_level,
                topic,
                partition,
                OffsetSpec::Timestamp(ts),
            )
            .await?
        {
            Some(o) => o,
            None => self.lookup(topic, partition, OffsetSpec::Latest).await?,
        };
        self.parts[i].set_position(offset);
        Ok(offset)
    }

    async fn seek_to_spec(&mut self, topic: &str, partition: u32, spec: OffsetSpec) -> Result<u64> {
        let i = self.index(topic, partition)?;
        let offset = self.lookup(topic, partition, spec).await?;
        self.parts[i].set_position(offset);
        Ok(offset)
    }

    /// `list_offsets` for Earliest / Latest, which always have an answer.
    async fn lookup(&self, topic: &str, partition: u32, spec: OffsetSpec) -> Result<u64> {
        self.backend
            .list_offsets(self.config.isolation_level, topic, partition, spec)
            .await?
            .ok_or_else(|| {
                ClientError::InvalidResponse(format!(
                    "no {spec:?} offset for partition {topic}-{partition}"
                ))
            })
    }

    /// The offset of the next record `poll` returns for a partition, or
    /// `None` if it is not assigned or has no position yet.
    pub fn position(&self, topic: &str, partition: u32) -> Option<u64> {
        let i = self.index(topic, partition).ok()?;
        self.parts[i].position
    }

    /// How many offsets of a partition were jumped over by resets after
    /// `OffsetOutOfRange` (records removed by retention before they were
    /// read, or skipped by a reset to the log end). Cumulative; 0 for
    /// partitions not assigned.
    pub fn skipped(&self, topic: &str, partition: u32) -> u64 {
        self.index(topic, partition)
            .map(|i| self.parts[i].skipped)
            .unwrap_or(0)
    }

    /// Records buffered by earlier fetches and not yet returned.
    pub fn buffered(&self) -> usize {
        self.parts.iter().map(|p| p.buffered.len()).sum()
    }

    /// A partition's log start offset: the first offset it still holds
    /// (Kafka's `beginningOffsets`). Asked of the broker; the partition
    /// need not be assigned.
    pub async fn beginning_offset(&self, topic: &str, partition: u32) -> Result<u64> {
        self.lookup(topic, partition, OffsetSpec::Earliest).await
    }

    /// A partition's log end offset: the offset its next record will get
    /// (Kafka's `endOffsets`). Asked of the broker; the partition need not
    /// be assigned.
    pub async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64> {
        self.lookup(topic, partition, OffsetSpec::Latest).await
    }

    /// How many records of an assigned partition are after the consumer's
    /// position: the log end offset (asked of the broker) minus the
    /// position, or `None` if the partition has no position yet. Records
    /// buffered but not yet returned by `poll` count as lag.
    pub async fn lag(&self, topic: &str, partition: u32) -> Result<Option<u64>> {
        let i = self.index(topic, partition)?;
        let Some(position) = self.parts[i].position else {
            return Ok(None);
        };
        let end = self.end_offset(topic, partition).await?;
        Ok(Some(end.saturating_sub(position)))
    }

    /// The consumer as a [`futures_core::Stream`] of records: each item is
    /// a record, or the error of a [`Consumer::poll`] (after which the
    /// stream goes on polling). It never ends; records come in the order
    /// `poll` returns them. Each `poll` waits up to `poll_timeout` (an
    /// empty poll just polls again). [`ConsumerStream::into_inner`] gives
    /// the consumer back, e.g. to seek.
    ///
    /// ```no_run
    /// # async fn demo(mut consumer: weir_client::Consumer) -> weir_client::Result<()> {
    /// use std::time::Duration;
    /// use futures_lite::StreamExt;
    ///
    /// let mut records = consumer.into_stream(Duration::from_millis(500));
    /// while let Some(record) = records.next().await {
    ///     let record = record?;
    ///     println!("{}-{}@{}", record.topic, record.partition, record.offset);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn into_stream(self, poll_timeout: Duration) -> ConsumerStream {
        ConsumerStream {
            state: StreamState::Idle(Box::new(self)),
            buffered: VecDeque::new(),
            poll_timeout,
        }
    }

    /// Returns up to `max_poll_records` records, in offset order per
    /// partition. Buffered records are returned without fetching;
    /// otherwise all assigned partitions are fetched in one request that
    /// waits up to `min(timeout, fetch_max_wait_ms)` for data, repeated
    /// until some record arrives or `timeout` has passed. An empty vector
    /// means nothing arrived in time (or nothing is assigned).
    ///
    /// Fails with [`ClientError::Partition`] (code `OffsetOutOfRange`, the
    /// message naming the partition and the valid range) if a partition
    /// needs a reset and `auto_offset_reset` is [`OffsetReset::None`], with
    /// [`ClientError::CorruptBatch`] if a fetched batch is invalid (bad
    /// CRC, undecodable records; the records before it are still returned
    /// by the next poll), and with the fetch's error otherwise.
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>> {
        let got = self.poll_inner(timeout).await;
        match &got {
            Ok(records) => {
                let len = |b: &Option<Bytes>| b.as_ref().map_or(0, Bytes::len) as u64;
                let bytes = records
                    .iter()
                    .map(|r| len(&r.key) + len(&r.value))
                    .sum::<u64>();
                self.stats.poll(records.len(), bytes);
            }
            Err(e) => {
                self.stats.poll(0, 0);
                self.stats.error(e);
            }
        }
        got
    }

    /// A snapshot of the consumer's statistics.
    pub fn statistics(&self) -> ConsumerStats {
        self.stats.clone()
    }

    async fn poll_inner(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>> {
        if self.parts.is_empty() {
            return Ok(Vec::new());
        }
        let deadline = Instant::now() + timeout;
        loop {
            if self.buffered() > 0 {
                return Ok(self.drain_and_prefetch());
            }
            self.ensure_positions().await?;
            if let Some(pre) = self.prefetch.pop_front() {
                // The fetch sent ahead: take what still matches the
                // partitions' fetch offsets.
                let left = deadline.saturating_duration_since(Instant::now());
                let mut pre = pre;
                match tokio::time::timeout(left, &mut pre.task).await {
                    Ok(Ok(Ok(results))) => {
                        // Send the next fetch before decoding this one, so
                        // the transfer overlaps the decoding: by offset
                        // (after the last batch headers) if none is out,
                        // and while records come, one continuing where the
                        // last one out ends. (A partition whose decoding
                        // fails or resets drops its part of them.)
                        let flowing = results
                            .iter()
                            .any(|r| r.as_ref().is_ok_and(|f| !f.batches.is_empty()));
                        if self.prefetch.is_empty() {
                            // (A continuing part that failed has no offset
                            // to go on from: then nothing is sent here.)
                            let next: Option<Vec<_>> = pre
                                .targets
                                .iter()
                                .zip(&results)
                                .map(|((t, p, o), r)| {
                                    let continued = *o == FetchPartition::CONTINUE;
                                    let after = match r {
                                        Ok(f) => {
                                            let from = if continued { f.fetch_offset } else { *o };
                                            f.next_offset().map_or(from, |n| n.max(from))
                                        }
                                        Err(_) if continued => return None,
                                        Err(_) => *o,
                                    };
                                    Some((t.clone(), *p, after))
                                })
                                .collect();
                            if let Some(next) = next {
                                self.send_ahead(next);
                            }
                        }
                        if flowing {
                            self.send_continuing();
                        }
                        let targets = std::mem::take(&mut pre.targets);
                        drop(pre);
                        self.take_prefetched(&targets, results).await?;
                    }
                    Ok(Ok(Err(e))) => return Err(e),
                    // A panicked or aborted task: fetch again.
                    Ok(Err(_)) => {}
                    Err(_) => {
                        // Not answered within this poll's timeout: keep waiting
                        // for it in the next poll.
                        self.prefetch.push_front(pre);
                        return Ok(Vec::new());
                    }
                }
                if self.buffered() > 0 {
                    return Ok(self.drain_and_prefetch());
                }
                if Instant::now() >= deadline {
                    return Ok(Vec::new());
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = u32::try_from(left.as_millis())
                .unwrap_or(u32::MAX)
                .min(self.config.fetch_max_wait_ms);
            self.fetch_once(wait).await?;
            if self.buffered() > 0 || Instant::now() >= deadline {
                return Ok(self.drain_and_prefetch());
            }
        }
    }

    /// [`Consumer::drain`], then sends the next fetch ahead if none is
    /// out.
    fn drain_and_prefetch(&mut self) -> Vec<ConsumerRecord> {
        let out = self.drain();
        if self.prefetch.is_empty() {
            let targets = self
                .parts
                .iter()
                .map(|p| (p.topic.to_string(), p.partition, p.fetch_offset))
                .collect();
            self.send_ahead(targets);
        }
        out
    }

    /// Drops the fetches sent ahead (aborting their tasks).
    fn drop_prefetched(&mut self) {
        self.prefetch.clear();
        self.last_placed = None;
    }

    /// Sends a fetch of `targets` (topic, partition, offset) ahead, if
    /// prefetching is on, every partition has a position and fewer than
    /// [`PREFETCH_DEPTH`] are out.
    fn send_ahead(&mut self, targets: Vec<(String, u32, u64)>) {
        if !self.config.prefetch
            || self.prefetch.len() >= PREFETCH_DEPTH
            || !self.parts.iter().all(|p| p.position.is_some())
        {
            return;
        }
        let max_bytes = self.config.max_partition_fetch_bytes;
        let request = targets
            .iter()
            .map(|(topic, partition, offset)| FetchPartition {
                topic: topic.clone(),
                partition: *partition,
                offset: *offset,
                max_bytes,
            })
            .collect();
        let backend = self.backend.clone();
        // Never a long poll: the broker answers a connection's requests in
        // order, so a fetch waiting for data would hold back the fetch of a
        // `poll` after a seek. At the end of the log the fetch sent ahead
        // comes back empty at once, and `poll` then long-polls itself.
        let (max, isolation) = (self.config.fetch_max_bytes, self.config.isolation_level);
        // In order on the wire: this fetch takes its place in its
        // connection's queue after the one sent before it (a continuing
        // fetch must follow the fetch it continues; if it does not, its
        // answer starts elsewhere and is dropped).
        let before = self.last_placed.take();
        let (placed, placed_rx) = tokio::sync::oneshot::channel();
        self.last_placed = Some(placed_rx);
        let task = tokio::spawn(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            let mut fetch = std::pin::pin!(backend.fetch_many(isolation, 0, max, request));
            let first = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(std::future::Future::poll(fetch.as_mut(), cx))
            })
            .await;
            let _ = placed.send(());
            match first {
                std::task::Poll::Ready(r) => r,
                std::task::Poll::Pending => fetch.await,
            }
        });
        self.stats.fetch();
        self.prefetch.push_back(Prefetch { targets, task });
    }

    /// Sends ahead a fetch of every partition continuing where the last
    /// fetch out ends ([`FetchPartition::CONTINUE`]), if one is out.
    fn send_continuing(&mut self) {
        if self.prefetch.is_empty() {
            return;
        }
        let targets = self
            .parts
            .iter()
            .map(|p| (p.topic.to_string(), p.partition, FetchPartition::CONTINUE))
            .collect();
        self.send_ahead(targets);
    }

    fn fetch_targets(&self) -> Vec<FetchPartition> {
        self.parts
            .iter()
            .map(|p| FetchPartition {
                topic: p.topic.to_string(),
                partition: p.partition,
                offset: p.fetch_offset,
                max_bytes: self.config.max_partition_fetch_bytes,
            })
            .collect()
    }

    /// Gives every partition without a position one, per
    /// `auto_offset_reset`.
    async fn ensure_positions(&mut self) -> Result<()> {
        for i in 0..self.parts.len() {
            if self.parts[i].position.is_some() {
                continue;
            }
            let (topic, partition) = (self.parts[i].topic.clone(), self.parts[i].partition);
            let spec = match self.config.auto_offset_reset {
                OffsetReset::Earliest => OffsetSpec::Earliest,
                OffsetReset::Latest => OffsetSpec::Latest,
                OffsetReset::None => {
                    return Err(no_offset(
                        &topic,
                        partition,
                        format!("partition {topic}-{partition} has no position"),
                    ))
                }
            };
            let offset = self.lookup(&topic, partition, spec).await?;
            self.parts[i].set_position(offset);
            self.drop_prefetched();
        }
        Ok(())
    }

    /// Decodes the answer of a fetch sent ahead: each partition's part is
    /// used only if the partition is still assigned with the same fetch
    /// offset. Errors as [`Consumer::fetch_once`].
    async fn take_prefetched(
        &mut self,
        targets: &[(String, u32, u64)],
        results: Vec<Result<FetchedBatches>>,
    ) -> Result<()> {
        if results.len() != targets.len() {
            return Err(ClientError::InvalidResponse(format!(
                "{} fetch results for {} partitions",
                results.len(),
                targets.len()
            )));
        }
        let mut first_err = None;
        let mut broken = false;
        for ((topic, partition, offset), r) in targets.iter().zip(results) {
            let Some(i) = self
                .parts
                .iter()
                .position(|p| *p.topic == **topic && p.partition == *partition)
            else {
                continue;
            };
            if *offset == FetchPartition::CONTINUE {
                // A continuing part counts only if it starts where this
                // partition's records end; else it and the fetches out
                // after it (which continue it) are dropped. Its errors
                // come back to the fetch by offset that follows.
                match r {
                    Ok(f) if f.fetch_offset == self.parts[i].fetch_offset => {
                        self.stats.fetched(fetched_bytes(&f));
                        if let Err(e) = decode_into(&mut self.parts[i], &f) {
                            first_err.get_or_insert(e);
                        }
                    }
                    _ => broken = true,
                }
                continue;
            }
            if self.parts[i].fetch_offset != *offset {
                continue;
            }
            let outcome = match r {
                Ok(fetched) => {
                    self.stats.fetched(fetched_bytes(&fetched));
                    decode_into(&mut self.parts[i], &fetched)
                }
                Err(e) if e.code() == Some(ErrorCode::OffsetOutOfRange) => {
                    self.reset_out_of_range(i).await
                }
                Err(e) => Err(e),
            };
            if let Err(e) = outcome {
                first_err.get_or_insert(e);
            }
        }
        if broken || first_err.is_some() {
            self.drop_prefetched();
        }
        first_err.map_or(Ok(()), Err)
    }

    /// One fetch of every assigned partition; decodes into the buffers.
    /// The first error is returned after every partition was handled.
    async fn fetch_once(&mut self, wait_ms: u32) -> Result<()> {
        let targets = self.fetch_targets();
        self.stats.fetch();
        let results = self
            .backend
            .fetch_many(
                self.config.isolation_level,
                wait_ms,
                self.config.fetch_max_bytes,
                targets,
            )
            .await?;
        if results.len() != self.parts.len() {
            return Err(ClientError::InvalidResponse(format!(
                "{} fetch results for {} partitions",
                results.len(),
                self.parts.len()
            )));
        }
        let mut first_err = None;
        for (i, r) in results.into_iter().enumerate() {
            let outcome = match r {
                Ok(fetched) => {
                    self.stats.fetched(fetched_bytes(&fetched));
                    decode_into(&mut self.parts[i], &fetched)
                }
                Err(e) if e.code() == Some(ErrorCode::OffsetOutOfRange) => {
                    self.reset_out_of_range(i).await
                }
                Err(e) => Err(e),
            };
            if let Err(e) = outcome {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The broker said the fetch offset of partition `i` is out of range:
    /// reset per `auto_offset_reset`, counting the offsets jumped over.
    async fn reset_out_of_range(&mut self, i: usize) -> Result<()> {
        let (topic, partition) = (self.parts[i].topic.clone(), self.parts[i].partition);
        let at = self.parts[i].fetch_offset;
        let start = self.lookup(&topic, partition, OffsetSpec::Earliest).await?;
        let end = self.lookup(&topic, partition, OffsetSpec::Latest).await?;
        let target = match self.config.auto_offset_reset {
            OffsetReset::Earliest => start,
            OffsetReset::Latest => end,
            OffsetReset::None => {
                let why = format!(
                    "offset {at} of partition {topic}-{partition} is out of range: \
                     the log holds offsets {start}..{end}"
                );
                return Err(no_offset(&topic, partition, why));
            }
        };
        let p = &mut self.parts[i];
        self.stats.reset(target.saturating_sub(at));
        p.skipped += target.saturating_sub(at);
        p.set_position(target);
        Ok(())
    }

    /// Takes up to `max_poll_records` buffered records, partition by
    /// partition, starting from a rotating one.
    fn drain(&mut self) -> Vec<ConsumerRecord> {
        let max = self.config.max_poll_records.max(1);
        let n = self.parts.len();
        let mut out = Vec::new();
        for k in 0..n {
            let p = &mut self.parts[(self.next_drain + k) % n];
            while out.len() < max {
                let Some(r) = p.buffered.pop_front() else {
                    break;
                };
                out.push(r);
            }
            if p.position.is_some() {
                p.position = Some(p.buffered.front().map_or(p.fetch_offset, |r| r.offset));
            }
        }
        if n > 0 {
            self.next_drain = (self.next_drain + 1) % n;
        }
        out
    }
}

/// The error for a partition that needs a reset under
/// [`OffsetReset::None`]: [`ClientError::Partition`] with code
/// `OffsetOutOfRange` and a message naming the partition (and the valid
/// range, if known).
fn no_offset(topic: &str, partition: u32, why: String) -> ClientError {
    ClientError::Partition {
        topic: topic.to_string(),
        partition,
        code: ErrorCode::OffsetOutOfRange,
        message: format!("{why} and auto_offset_reset is none (seek first)"),
    }
}

/// Whether a control batch is an abort marker (its record's key: version
/// i16, type i16 — 0 abort, 1 commit).
fn is_abort_marker(rb: &RecordBatch<'_>) -> bool {
    let Ok(records) = rb.records() else {
        return false;
    };
    match records.iter().next() {
        Some(Ok(r)) => r
            .record
            .key
            .is_some_and(|k| k.len() >= 4 && i16::from_be_bytes([k[2], k[3]]) == 0),
        _ => false,
    }
}

fn fetched_bytes(f: &FetchedBatches) -> u64 {
    f.batches.iter().map(|b| b.len() as u64).sum()
}

/// Validates and decodes one partition's fetched batches into its buffer,
/// skipping records below the fetch offset. On a bad batch, the records
/// before it stay buffered and the fetch offset stays at it.
fn decode_into(p: &mut PartitionState, fetched: &FetchedBatches) -> Result<()> {
    // Read committed: the transactions aborted in this range (Kafka's
    // consumer's rule): from its first offset, a producer's transactional
    // batches are skipped until its abort marker.
    let mut aborted = fetched.aborted.iter().peekable();
    let mut aborting: std::collections::HashSet<i64> = std::collections::HashSet::new();
    for batch in &fetched.batches {
        let rb = RecordBatch::parse(batch)?;
        let h = *rb.header();
        let last = u64::try_from(h.last_offset())
            .map_err(|_| ClientError::InvalidResponse("negative batch offset".into()))?;
        while let Some(&&(pid, _)) = aborted.peek().filter(|(_, first)| *first <= last) {
            aborting.insert(pid);
            aborted.next();
        }
        let skip = h.attributes.is_transactional() && aborting.contains(&h.producer_id);
        if h.attributes.is_control() && is_abort_marker(&rb) {
            aborting.remove(&h.producer_id);
        }
        if last < p.fetch_offset {
            continue;
        }
        if !h.attributes.is_control() && !skip {
            let from = p.fetch_offset;
            let mut out = Vec::new();
            decode_records(batch, &rb, &p.topic, p.partition, |o| o >= from, &mut out)?;
            p.buffered.extend(out);
        }
        p.fetch_offset = last + 1;
    }
    Ok(())
}

/// Decodes the records of one parsed (non-control) batch whose offsets
/// `keep` accepts onto `out`: all of them, or none if one is bad. Keys,
/// values and headers point into `batch` when it is not compressed.
pub(crate) fn decode_records(
    batch: &Bytes,
    rb: &RecordBatch<'_>,
    topic: &Arc<str>,
    partition: u32,
    keep: impl Fn(u64) -> bool,
    out: &mut Vec<ConsumerRecord>,
) -> Result<()> {
    let records = rb.records()?;
    let zero_copy = rb.compression() == Codec::None;
    let bytes = |s: &[u8]| {
        if zero_copy {
            batch.slice_ref(s)
        } else {
            Bytes::copy_from_slice(s)
        }
    };
    let kept = out.len();
    for r in &records {
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                out.truncate(kept);
                return Err(e.into());
            }
        };
        let Ok(offset) = u64::try_from(r.offset) else {
            out.truncate(kept);
            return Err(ClientError::InvalidResponse(
                "negative record offset".into(),
            ));
        };
        if !keep(offset) {
            continue;
        }
        out.push(ConsumerRecord {
            topic: topic.clone(),
            partition,
            offset,
            timestamp: r.timestamp,
            key: r.record.key.map(bytes),
            value: r.record.value.map(bytes),
            headers: r
                .record
                .headers()
                .map(|h| {
                    (
                        String::from_utf8_lossy(h.key).into_owned(),
                        h.value.map(bytes),
                    )
                })
                .collect(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_proto::batch::Compression;
    use weir_proto::builder::BatchBuilder;
    use weir_proto::record::RecordData;

    /// A batch at `base` of producer `pid` (transactional if `txn`) with
    /// `values`; a control batch of one marker (`abort`) if `marker`.
    fn batch(base: u64, pid: i64, txn: bool, marker: Option<bool>, values: &[&str]) -> Bytes {
        let mut b = BatchBuilder::new(Compression::None).unwrap();
        (b.producer_id, b.producer_epoch, b.base_sequence) = (pid, 0, 0);
        b.transactional = txn;
        let record = |key: Option<Bytes>, value: Option<Bytes>| RecordData {
            key,
            value,
            headers: Vec::new(),
            timestamp: 1,
        };
        match marker {
            Some(abort) => {
                b.control = true;
                let kind: i16 = if abort { 0 } else { 1 };
                let mut key = 0i16.to_be_bytes().to_vec();
                key.extend_from_slice(&kind.to_be_bytes());
                let value = Bytes::from_static(&[0, 0, 0, 0, 0, 0]);
                b.push(&record(Some(Bytes::from(key)), Some(value)))
                    .unwrap();
            }
            None => {
                for v in values {
                    b.push(&record(None, Some(Bytes::from(v.to_string()))))
                        .unwrap();
                }
            }
        }
        let mut out = b.finish().unwrap();
        // The base offset is outside the CRC.
        out[..8].copy_from_slice(&(base as i64).to_be_bytes());
        out.freeze()
    }

    fn state() -> PartitionState {
        PartitionState {
            topic: Arc::from("t"),
            partition: 0,
            position: Some(0),
            fetch_offset: 0,
            buffered: VecDeque::new(),
            skipped: 0,
        }
    }

    fn values(p: &PartitionState) -> Vec<String> {
        p.buffered
            .iter()
            .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned())
            .collect()
    }

    #[test]
    fn read_committed_skips_aborted_transactions_and_markers() {
        let batches = vec![
            batch(0, -1, false, None, &["a"]),
            // Producer 7's transaction, aborted by the marker at 4.
            batch(1, 7, true, None, &["t1", "t2"]),
            // Producer 8's, committed at 5.
            batch(3, 8, true, None, &["c1"]),
            batch(4, 7, true, Some(true), &[]),
            batch(5, 8, true, Some(false), &[]),
            // Producer 7's next transaction, committed at 7.
            batch(6, 7, true, None, &["t3"]),
            batch(7, 7, true, Some(false), &[]),
        ];
        let fetched = FetchedBatches {
            batches: batches.clone(),
            high_watermark: 8,
            log_start_offset: 0,
            last_stable_offset: 8,
            aborted: vec![(7, 1)],
            fetch_offset: 0,
        };
        let mut p = state();
        decode_into(&mut p, &fetched).unwrap();
        assert_eq!(values(&p), ["a", "c1", "t3"]);
        assert_eq!(p.fetch_offset, 8, "past the markers");
        // Read uncommitted: no aborted list, every data record.
        let mut p = state();
        let all = FetchedBatches {
            aborted: Vec::new(),
            ..fetched.clone()
        };
        decode_into(&mut p, &all).unwrap();
        assert_eq!(values(&p), ["a", "t1", "t2", "c1", "t3"]);
        // From the middle of the aborted transaction (a later fetch: the
        // broker names it again as it ends at or after the fetch offset).
        let mut p = state();
        p.fetch_offset = 2;
        let tail = FetchedBatches {
            batches: batches[1..].to_vec(),
            ..fetched
        };
        decode_into(&mut p, &tail).unwrap();
        assert_eq!(values(&p), ["c1", "t3"]);
    }
}
