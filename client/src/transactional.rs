//! The transactional producer (Kafka's KIP-98, the v1 client flow): records
//! written to several partitions, and the consumer offsets they came from,
//! commit or abort together; `read_committed` consumers
//! ([`crate::IsolationLevel::ReadCommitted`]) never see an aborted or
//! unfinished write.
//!
//! ```no_run
//! # async fn demo() -> weir_client::Result<()> {
//! use weir_client::ProducerRecord;
//! let p = weir_client::Producer::builder()
//!     .bootstrap("127.0.0.1:9292")
//!     .from_config([("transactional.id", "my-app-1"), ("transaction.timeout.ms", "30000")])
//!     .build_transactional()
//!     .await?;
//! p.init_transactions().await?;
//! p.begin_transaction()?;
//! p.send(ProducerRecord::new("out", "v")).await?;
//! p.send_offsets_to_transaction(&[("in".into(), 0, 42)], "my-group").await?;
//! p.commit_transaction().await?;
//! # Ok(()) }
//! ```
//!
//! **How:** the producer is an idempotent [`Producer`] whose batches carry
//! the transactional attribute and whose produce requests the
//! transactional id. Before the first batch of a partition in a
//! transaction is sent, the partition is added to the transaction at the
//! id's coordinator (AddPartitionsToTxn: one for the partitions of every
//! request formed by then, so a burst of requests to several connections
//! adds once); `commit_transaction` waits for
//! every record, then ends the transaction (EndTxn), which the coordinator
//! answers once its markers are written. `send_offsets_to_transaction`
//! adds the group's offsets partition (AddOffsetsToTxn) and commits the
//! offsets at the group's coordinator as part of the transaction
//! (TxnOffsetCommit).
//!
//! **Errors:** [`ClientError::ProducerFenced`] — another instance
//! initialized the same id, or the transaction timed out or was aborted by
//! an operator — is fatal: close the producer. A record that failed makes
//! the commit fail with [`ClientError::TransactionAbortable`]: abort, then
//! go on.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use weir_proto::error_code::ErrorCode;
use weir_proto::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, CommitOffset, EndTxnRequest,
    InitProducerIdRequest, OffsetCommitRequest, Request, TxnOffsetCommitRequest, TxnPartition,
};

use crate::groups::{Coordinated, GroupAnswer};
use crate::producer::{
    BoxFuture, DefaultPartitioner, DeliveryFuture, Producer, ProducerBackend, ProducerRecord,
    Route, ShardRouter, TopicLayout,
};
use crate::{Acks, Client, ClientConfig, ClientError, ProducerConfig, Result};

/// Wait between attempts of a coordinator call refused with a retriable
/// code (the coordinator moving or loading, the previous transaction still
/// ending).
const COORDINATOR_RETRY: Duration = Duration::from_millis(100);

/// A producer whose records commit or abort together. See the [module
/// docs](self).
pub struct TransactionalProducer {
    producer: Producer,
    txn: Arc<TxnState>,
}

/// What the producer and its backend share.
struct TxnState {
    id: String,
    timeout_ms: u32,
    /// For the coordinators (transaction and group).
    client: Arc<Client>,
    /// The (producer id, epoch) InitProducerId handed out.
    identity: Mutex<Option<(i64, i16)>>,
    /// A transaction is open.
    open: AtomicBool,
    /// Partitions added to the open transaction.
    added: Mutex<HashSet<(String, u32)>>,
    /// Partitions of produce requests formed and not yet added: the
    /// first request to add adds them all (one AddPartitionsToTxn for a
    /// burst of requests to several connections, not one after another).
    wanted: Mutex<HashSet<(String, u32)>>,
    /// Something was added (partitions or offsets): the end is sent.
    anything: AtomicBool,
    /// Why the open transaction cannot commit.
    failed: Mutex<Option<String>>,
    /// Why the producer was fenced (fatal).
    fenced: Mutex<Option<String>>,
    /// The producer's failed-record count when the transaction began.
    failed_before: AtomicU64,
}

impl TxnState {
    fn identity(&self) -> Result<(i64, i16)> {
        self.check_fenced()?;
        self.identity
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ok_or_else(|| ClientError::InvalidArgument("init_transactions first".into()))
    }

    fn check_fenced(&self) -> Result<()> {
        match &*self.fenced.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(why) => Err(ClientError::ProducerFenced(why.clone())),
            None => Ok(()),
        }
    }

    /// Notes a failure of the open transaction (fencing is fatal).
    fn note(&self, e: &ClientError) {
        if let ClientError::ProducerFenced(why) = e {
            self.fenced
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(|| why.clone());
        }
        if !e.is_retriable() {
            self.failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(|| e.to_string());
        }
    }

    /// Sends `req` to the transaction coordinator, again while it answers
    /// a retriable code (for up to the request timeout); a fenced producer
    /// is [`ClientError::ProducerFenced`].
    async fn call<R: Request>(&self, req: &R) -> Result<R::Response>
    where
        R::Response: GroupAnswer + Message,
    {
        let key = Coordinated::Transaction(&self.id);
        let deadline = Instant::now() + self.client.config.request_timeout;
        loop {
            let r = self
                .client
                .coordinator_call(&key, req, Duration::ZERO)
                .await?;
            let code = ErrorCode::from_u16(r.error());
            if code.is_none() {
                return Ok(r);
            }
            let message = r.message().unwrap_or_else(|| code.description().into());
            let retriable = code.is_retriable() || code == ErrorCode::StorageError;
            if retriable && Instant::now() + COORDINATOR_RETRY < deadline {
                tokio::time::sleep(COORDINATOR_RETRY).await;
                continue;
            }
            let e = match code {
                ErrorCode::InvalidProducerEpoch => ClientError::ProducerFenced(message),
                code => ClientError::Server { code, message },
            };
            self.note(&e);
            return Err(e);
        }
    }

    /// Adds `new` to the open transaction.
    async fn add_partitions(&self, new: Vec<(String, u32)>) -> Result<()> {
        let (producer_id, producer_epoch) = self.identity()?;
        let req = AddPartitionsToTxnRequest {
            transactional_id: self.id.clone(),
            producer_id,
            producer_epoch,
            partitions: new
                .iter()
                .map(|(topic, partition)| TxnPartition {
                    topic: topic.clone(),
                    partition: *partition,
                })
                .collect(),
        };
        self.call(&req).await?;
        self.anything.store(true, Ordering::Release);
        self.added
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(new);
        Ok(())
    }
}

/// The messages' human-readable error detail.
trait Message {
    fn message(&self) -> Option<String>;
}

macro_rules! messages {
    ($($t:ty),*) => {$(
        impl Message for $t {
            fn message(&self) -> Option<String> {
                self.message.clone()
            }
        }
    )*};
}

messages!(
    weir_proto::messages::InitProducerIdResponse,
    weir_proto::messages::TxnResult,
    weir_proto::messages::EndTxnResponse
);

/// The producer's backend: adds each partition to the transaction before
/// its first batch goes out, hands out the transaction's producer id.
///
/// Requests must reach their connections in the order the producer formed
/// them (an idempotent partition's batches carry consecutive sequences:
/// one overtaken by the next is refused out of order). The producer
/// ensures it by polling each call once as it forms it; a call that first
/// waits for AddPartitionsToTxn would lose that place. So calls pass
/// `order` (a FIFO lock, taken on their first poll) until their request
/// is on its connection: a later one waits for an earlier one's add.
struct TxnBackend {
    inner: Arc<dyn ProducerBackend>,
    txn: Arc<TxnState>,
    order: tokio::sync::Mutex<()>,
}

impl ProducerBackend for TxnBackend {
    fn produce(
        &self,
        route: Route,
        acks: Acks,
        batches: Vec<(String, u32, Bytes)>,
    ) -> BoxFuture<'_, Result<Vec<Result<Option<u64>>>>> {
        // Noted as the request is formed (before its first poll): a request
        // that adds takes every partition noted so far.
        let needs_add = {
            let added = self.txn.added.lock().unwrap_or_else(|e| e.into_inner());
            let mut wanted = self.txn.wanted.lock().unwrap_or_else(|e| e.into_inner());
            let mut any = false;
            for (t, p, _) in &batches {
                if !added.contains(&(t.clone(), *p)) {
                    wanted.insert((t.clone(), *p));
                    any = true;
                }
            }
            any
        };
        Box::pin(async move {
            let turn = self.order.lock().await;
            if needs_add {
                // The producer forms its requests to the other connections
                // right after this one's first poll: let it, so that they
                // are noted and added with this one's.
                tokio::task::yield_now().await;
                let new: Vec<(String, u32)> = {
                    let added = self.txn.added.lock().unwrap_or_else(|e| e.into_inner());
                    let wanted = self.txn.wanted.lock().unwrap_or_else(|e| e.into_inner());
                    let mut new: Vec<(String, u32)> = wanted
                        .iter()
                        .filter(|tp| !added.contains(tp))
                        .cloned()
                        .collect();
                    new.sort();
                    new
                };
                if !new.is_empty() {
                    self.txn.add_partitions(new).await?;
                }
            }
            // Polled once under the lock: the request is on its connection
            // before the next call's goes.
            let mut call = self.inner.produce(route, acks, batches);
            let first =
                std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx))).await;
            drop(turn);
            let r = match first {
                std::task::Poll::Ready(r) => r,
                std::task::Poll::Pending => call.await,
            };
            match &r {
                Err(e) => self.txn.note(e),
                Ok(results) => results
                    .iter()
                    .filter_map(|r| r.as_ref().err())
                    .for_each(|e| self.txn.note(e)),
            }
            r
        })
    }

    fn layout<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<TopicLayout>> {
        self.inner.layout(topic)
    }

    fn init_producer_id(&self) -> BoxFuture<'_, Result<(i64, i16)>> {
        Box::pin(async move { self.txn.identity() })
    }
}

impl TransactionalProducer {
    /// Connects to the broker at `addr` as the transactional producer
    /// `transactional_id` (1 to 1024 bytes; one instance at a time: a new
    /// one fences the old), with `producer`'s `transaction_timeout_ms`.
    /// Idempotence is forced on and acks to all. From Kafka-style
    /// properties: [`crate::ProducerBuilder::build_transactional`]
    /// (`transactional.id`, `transaction.timeout.ms`).
    pub async fn connect(
        addr: SocketAddr,
        mut client: ClientConfig,
        producer: ProducerConfig,
        transactional_id: &str,
    ) -> Result<TransactionalProducer> {
        client.transactional_id = Some(transactional_id.to_string());
        Self::with_client(Client::connect_lazy(addr, client), producer)
    }

    /// A transactional producer over `client`, whose config names the
    /// transactional id ([`ClientConfig::transactional_id`]).
    pub fn with_client(
        client: Client,
        mut producer: ProducerConfig,
    ) -> Result<TransactionalProducer> {
        let id = client.config.transactional_id.clone().unwrap_or_default();
        if id.is_empty() || id.len() > 1024 {
            return Err(ClientError::InvalidArgument(format!(
                "a transactional id of {} bytes (1 to 1024; `transactional.id`)",
                id.len()
            )));
        }
        producer.enable_idempotence = true;
        producer.acks = Acks::All;
        producer.transactional = true;
        // A transaction's records become visible at its commit, whose flush
        // sends every batch: sending a partition's first records at once
        // only cuts the transaction into more, smaller requests (2.9 ->
        // 2.0 produce requests per transaction of 1000 records on 16
        // partitions, +20 % throughput; docs/benchmarks.md, issue 32).
        producer.linger_adaptive = false;
        let bootstrap = Arc::new(client);
        let txn = Arc::new(TxnState {
            id,
            timeout_ms: producer.transaction_timeout_ms,
            client: bootstrap.clone(),
            identity: Mutex::new(None),
            open: AtomicBool::new(false),
            added: Mutex::new(HashSet::new()),
            wanted: Mutex::new(HashSet::new()),
            anything: AtomicBool::new(false),
            failed: Mutex::new(None),
            fenced: Mutex::new(None),
            failed_before: AtomicU64::new(0),
        });
        let inner: Arc<dyn ProducerBackend> = if producer.shard_aware {
            Arc::new(ShardRouter::new(Arc::new(bootstrap.reopen_lazy())))
        } else {
            Arc::new(bootstrap.reopen_lazy())
        };
        let backend = Arc::new(TxnBackend {
            order: tokio::sync::Mutex::new(()),
            inner,
            txn: txn.clone(),
        });
        let producer = Producer::with_backend(backend, producer, Arc::new(DefaultPartitioner));
        Ok(TransactionalProducer { producer, txn })
    }

    /// The transactional id.
    pub fn transactional_id(&self) -> &str {
        &self.txn.id
    }

    /// Registers the transactional id with its coordinator and gets its
    /// producer id and a new epoch: an older instance with the same id is
    /// fenced and its open transaction aborted. Call once, before the
    /// first transaction.
    pub async fn init_transactions(&self) -> Result<()> {
        self.txn.check_fenced()?;
        let req = InitProducerIdRequest {
            transactional_id: Some(self.txn.id.clone()),
            transaction_timeout_ms: self.txn.timeout_ms,
            producer_id: -1,
            producer_epoch: -1,
        };
        let r = self.txn.call(&req).await?;
        *self.txn.identity.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((r.producer_id, r.producer_epoch));
        Ok(())
    }

    /// The producer id and epoch `init_transactions` got.
    pub fn producer_identity(&self) -> Option<(i64, i16)> {
        *self.txn.identity.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Begins a transaction (locally: the coordinator learns of it with
    /// its first partition).
    pub fn begin_transaction(&self) -> Result<()> {
        self.txn.identity()?;
        if self.txn.open.swap(true, Ordering::AcqRel) {
            return Err(ClientError::InvalidArgument(
                "a transaction is already open: commit or abort it first".into(),
            ));
        }
        self.txn
            .added
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.txn
            .wanted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.txn.anything.store(false, Ordering::Release);
        *self.txn.failed.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.txn
            .failed_before
            .store(self.producer.statistics().records_failed, Ordering::Release);
        Ok(())
    }

    fn check_open(&self) -> Result<()> {
        self.txn.check_fenced()?;
        if !self.txn.open.load(Ordering::Acquire) {
            return Err(ClientError::InvalidArgument(
                "no transaction is open: begin_transaction first".into(),
            ));
        }
        Ok(())
    }

    /// Sends a record in the open transaction (as [`Producer::send`]: the
    /// future resolves when the record is written, visible to
    /// read_committed consumers once the transaction commits).
    pub async fn send(&self, record: ProducerRecord) -> Result<DeliveryFuture> {
        self.check_open()?;
        self.producer.send(record).await
    }

    /// Commits consumer offsets as part of the open transaction: `group`'s
    /// offsets (topic, partition, next offset to read) become its committed
    /// offsets when the transaction commits, and are dropped if it aborts.
    pub async fn send_offsets_to_transaction(
        &self,
        offsets: &[(String, u32, u64)],
        group: &str,
    ) -> Result<()> {
        self.check_open()?;
        let (producer_id, producer_epoch) = self.txn.identity()?;
        self.txn
            .call(&AddOffsetsToTxnRequest {
                transactional_id: self.txn.id.clone(),
                producer_id,
                producer_epoch,
                group: group.to_string(),
            })
            .await?;
        self.txn.anything.store(true, Ordering::Release);
        let req = TxnOffsetCommitRequest {
            transactional_id: self.txn.id.clone(),
            producer_id,
            producer_epoch,
            commit: OffsetCommitRequest {
                group: group.to_string(),
                member_id: String::new(),
                generation: -1,
                offsets: offsets
                    .iter()
                    .map(|(topic, partition, offset)| CommitOffset {
                        topic: topic.clone(),
                        partition: *partition,
                        offset: *offset,
                        metadata: None,
                    })
                    .collect(),
            },
        };
        let r = self
            .txn
            .client
            .group_call(group, &req, Duration::ZERO)
            .await?;
        let refused = |code: u16, message: Option<String>| {
            let code = ErrorCode::from_u16(code);
            let message = message.unwrap_or_else(|| code.description().into());
            let e = match code {
                ErrorCode::InvalidProducerEpoch => ClientError::ProducerFenced(message),
                code => ClientError::Group {
                    group: group.to_string(),
                    code,
                    message,
                },
            };
            self.txn.note(&e);
            e
        };
        if r.error != 0 {
            return Err(refused(r.error, r.message));
        }
        if let Some(p) = r.partitions.into_iter().find(|p| p.error != 0) {
            return Err(refused(p.error, p.message));
        }
        Ok(())
    }

    /// Waits for every record of the open transaction, then commits it:
    /// its records become visible to read_committed consumers, its offsets
    /// the group's. [`ClientError::TransactionAbortable`] if a record
    /// failed (abort then), [`ClientError::ProducerFenced`] if fenced.
    pub async fn commit_transaction(&self) -> Result<()> {
        self.end(true).await
    }

    /// Aborts the open transaction: none of its records or offsets are
    /// ever visible to read_committed consumers.
    pub async fn abort_transaction(&self) -> Result<()> {
        self.end(false).await
    }

    async fn end(&self, commit: bool) -> Result<()> {
        self.check_open()?;
        self.producer.flush().await;
        self.txn.check_fenced()?;
        if commit {
            let failed_now = self.producer.statistics().records_failed;
            let failed_records = failed_now > self.txn.failed_before.load(Ordering::Acquire);
            let failed = self
                .txn
                .failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if failed.is_some() || failed_records {
                let why = failed.unwrap_or_else(|| {
                    self.producer
                        .statistics()
                        .last_error
                        .unwrap_or_else(|| "a record of the transaction failed".into())
                });
                return Err(ClientError::TransactionAbortable(why));
            }
        }
        if self.txn.anything.load(Ordering::Acquire) {
            let (producer_id, producer_epoch) = self.txn.identity()?;
            self.txn
                .call(&EndTxnRequest {
                    transactional_id: self.txn.id.clone(),
                    producer_id,
                    producer_epoch,
                    commit,
                })
                .await?;
        }
        self.txn.open.store(false, Ordering::Release);
        Ok(())
    }

    /// Waits until every record sent so far is written (or failed).
    pub async fn flush(&self) {
        self.producer.flush().await;
    }

    /// Waits for what was sent, then stops the producer (an open
    /// transaction is left to the coordinator's timeout, or to the next
    /// instance's `init_transactions`, which aborts it).
    pub async fn close(&self) {
        self.producer.close().await;
    }
}
