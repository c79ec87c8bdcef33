//! One core of the broker (its *shard*): the storage shard, the partition
//! logs it owns, its copy of the topic registry, and its ends of the
//! cross-core mesh.
//!
//! Which core owns what: partition `p` of topic `t` lives on core
//! [`crate::registry::owner_core`]; only that core opens its log. Core 0
//! also owns the authoritative topic registry (it alone writes
//! `topics.toml`) and broadcasts every change to the other cores, which
//! keep read-only copies for routing.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use std::any::Any;
use std::cell::Cell;
use std::marker::PhantomData;

use futures_channel::oneshot;
use glommio::channels::channel_mesh::{Receivers, Senders};
use weir_storage::{PartitionLog, ShardConfig, StorageShard};

use crate::config::BrokerConfig;
use crate::registry::{self, owner_core, partition_dir, Registry, TopicSpec};

/// Where the answer to a cross-core request goes: back over the mesh to
/// the requesting core, which hands it to the waiting task there.
///
/// Answers never wake a task of another core directly (with a
/// cross-thread channel): glommio's wake-up of a task from a foreign
/// thread races with the task completing on its own core, and a
/// short-lived request task can be freed while the foreign waker still
/// touches it (seen as heap corruption under cross-core fetch load).
/// Mesh messages are received by long-lived tasks, and the hand-off to the
/// waiting task happens on its own core.
pub struct ReplyTo<T> {
    core: usize,
    id: u64,
    _t: PhantomData<fn(T)>,
}

impl<T> std::fmt::Debug for ReplyTo<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReplyTo(core {}, #{})", self.core, self.id)
    }
}

impl<T: Send + 'static> ReplyTo<T> {
    /// Sends the answer (from the core that handled the request).
    pub async fn send(self, from: &Core, value: T) {
        let value = ReplyValue(Box::new(value));
        if self.core == from.id {
            from.deliver(self.id, value);
        } else if from
            .send_to(self.core, CoreMsg::Reply { id: self.id, value })
            .await
            .is_err()
        {
            tracing::debug!(core = self.core, "a reply could not be delivered");
        }
    }
}

/// An answer in transit (its type is known to the receiving request).
pub struct ReplyValue(Box<dyn Any + Send>);

impl std::fmt::Debug for ReplyValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplyValue")
    }
}

/// Messages between cores. Everything in them is `Send`; batches travel as
/// `Bytes` (a reference count, not a copy).
#[derive(Debug)]
pub enum CoreMsg {
    /// Append one batch to a partition this core owns: answer `appended`
    /// once it is queued (or refused), then `reply` once it may be
    /// acknowledged as `acks` says.
    Produce {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// One record batch.
        batch: Bytes,
        /// 0, 1 or -1 (all).
        acks: i8,
        /// Whether the batch was queued.
        appended: ReplyTo<Result<(), PartitionError>>,
        /// The acknowledgement.
        reply: ReplyTo<Result<ProduceOk, PartitionError>>,
    },
    /// Read from a partition this core owns.
    Fetch {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// First offset wanted.
        offset: u64,
        /// Byte budget.
        max_bytes: u64,
        /// If there is nothing at `offset` yet, wait up to this long for it.
        wait_ms: u32,
        /// Where the answer goes.
        reply: ReplyTo<Result<FetchOk, PartitionError>>,
    },
    /// Offsets of a partition this core owns.
    Offsets {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Timestamp to look up, if any.
        timestamp: Option<i64>,
        /// Where the answer goes.
        reply: ReplyTo<Result<OffsetsOk, PartitionError>>,
    },
    /// Run a cleaner pass on (or report the dirty ratio of) a partition
    /// this core owns.
    Compact {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Run a pass (true) or only report.
        run: bool,
        /// Where the answer goes.
        reply: ReplyTo<Result<weir_proto::messages::CompactPartitionResult, PartitionError>>,
    },
    /// A topic change for core 0 to apply and broadcast.
    Admin {
        /// The change.
        change: AdminChange,
        /// Where the answer goes.
        reply: ReplyTo<Result<(), registry::TopicError>>,
    },
    /// Hand out a producer id (sent to core 0, which owns the allocator).
    InitProducerId {
        /// Where the id goes.
        reply: ReplyTo<Result<i64, PartitionError>>,
    },
    /// The answer to a request this core sent (see [`ReplyTo`]).
    Reply {
        /// Which request.
        id: u64,
        /// The answer (its type is known to the waiting request).
        value: ReplyValue,
    },
    /// This core's metrics.
    Metrics {
        /// Where the snapshot goes.
        reply: ReplyTo<crate::metrics::Snapshot>,
    },
    /// A consumer-group request for a group this core coordinates.
    Group {
        /// The request.
        request: crate::group_coordinator::GroupRequest,
        /// Where the answer goes.
        reply: ReplyTo<crate::group_coordinator::GroupResponse>,
    },
    /// Log end offsets (high watermarks) of partitions this core owns.
    LogEnds {
        /// (topic, partition) pairs.
        partitions: Vec<(String, u32)>,
        /// One result per partition, in order.
        reply: ReplyTo<Vec<Result<u64, PartitionError>>>,
    },
    /// The new registry (from core 0): open, close or delete logs to match.
    Sync {
        /// The registry after the change.
        registry: Registry,
        /// Topics deleted by the change (their files go).
        deleted: Vec<(String, u32)>,
        /// Done.
        reply: ReplyTo<()>,
    },
}

/// A topic change.
#[derive(Debug, Clone)]
pub enum AdminChange {
    /// Create a topic.
    Create(String, TopicSpec),
    /// Delete a topic.
    Delete(String),
    /// Set configs.
    Alter(String, Vec<(String, String)>),
    /// Raise the partition count.
    AddPartitions(String, u32),
}

/// A produce that succeeded.
#[derive(Debug, Clone, Copy)]
pub struct ProduceOk {
    /// Offset of the batch's first record.
    pub base_offset: u64,
    /// Log start offset.
    pub log_start_offset: u64,
}

/// A fetch that succeeded.
#[derive(Debug, Clone)]
pub struct FetchOk {
    /// Whole batches.
    pub batches: Vec<Bytes>,
    /// High watermark.
    pub high_watermark: u64,
    /// Log start offset.
    pub log_start_offset: u64,
}

/// Offsets of a partition.
#[derive(Debug, Clone, Copy)]
pub struct OffsetsOk {
    /// Log start offset.
    pub log_start_offset: u64,
    /// High watermark (what consumers can read up to).
    pub high_watermark: u64,
    /// Size of the log, bytes.
    pub size_bytes: u64,
    /// Result of the timestamp lookup.
    pub for_timestamp: Option<u64>,
}

/// A partition-level failure, as a wire error code and a message.
#[derive(Debug, Clone)]
pub struct PartitionError {
    /// Stable wire error number (`weir_proto` error codes).
    pub code: u16,
    /// Human-readable reason.
    pub message: String,
}

impl PartitionError {
    /// The error for a topic or partition that does not exist.
    pub fn unknown(topic: &str, partition: u32) -> PartitionError {
        PartitionError {
            code: crate::errors::UNKNOWN_TOPIC_OR_PARTITION,
            message: format!("unknown topic or partition {topic}-{partition}"),
        }
    }
}

/// Process-wide facts shared by every core.
#[derive(Debug)]
pub struct Shared {
    /// The configuration.
    pub config: BrokerConfig,
    /// Actual per-core ports (filled in as cores bind).
    pub core_ports: Vec<AtomicU16>,
    /// Actual shared port.
    pub port: AtomicU16,
    /// Set on SIGTERM/SIGINT.
    pub stopping: Arc<AtomicBool>,
    /// Actual metrics port (core 0 binds it).
    pub metrics_port: AtomicU16,
    /// Mesh peer id of each core.
    pub peer_of_core: Vec<std::sync::atomic::AtomicUsize>,
}

impl Shared {
    /// Whether shutdown was requested.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}

/// One core's state.
pub struct Core {
    /// This core's number.
    pub id: usize,
    /// Process-wide facts.
    pub shared: Arc<Shared>,
    /// This core's storage.
    pub storage: StorageShard,
    /// Partitions this core owns.
    pub logs: RefCell<HashMap<(String, u32), PartitionLog>>,
    /// This core's copy of the registry.
    pub registry: RefCell<Registry>,
    /// Senders to every core (by mesh peer id).
    pub mesh: Senders<CoreMsg>,
    /// This core's counters.
    pub metrics: crate::metrics::Metrics,
    /// Bytes of requests being read or handled on this core: a connection
    /// takes its frame's size before reading the frame and gives it back
    /// after answering, so a core never holds more than this in requests.
    pub inflight: Rc<glommio::sync::Semaphore>,
    /// The producer-id allocator (used on core 0 only).
    pub producer_ids: RefCell<crate::producer_ids::ProducerIds>,
    /// The consumer groups this core coordinates.
    pub groups: crate::group_coordinator::Groups,
    /// Requests sent to other cores, waiting for their [`CoreMsg::Reply`].
    replies: RefCell<HashMap<u64, oneshot::Sender<ReplyValue>>>,
    next_reply: Cell<u64>,
}

/// Request bytes one core holds at most (reading or being handled).
pub const INFLIGHT_BYTES_PER_CORE: u64 = 512 << 20;

impl Core {
    /// Creates the core's state and opens the logs it owns.
    pub async fn start(
        id: usize,
        shared: Arc<Shared>,
        registry: Registry,
        mesh: Senders<CoreMsg>,
    ) -> anyhow::Result<Rc<Core>> {
        let storage = StorageShard::new(ShardConfig {
            cache_bytes: shared.config.cache_bytes_per_core,
            cleaner_dedupe_buffer_bytes: shared.config.log_cleaner_dedupe_buffer_size,
            cleaner_io_max_bytes_per_sec: shared.config.log_cleaner_io_max_bytes_per_second,
            cleaner_io_busy_bytes_per_sec: shared.config.log_cleaner_io_busy_bytes_per_second,
            ..ShardConfig::default()
        });
        let producer_ids = crate::producer_ids::ProducerIds::load(&shared.config.data_dir)?;
        let core = Rc::new(Core {
            id,
            shared,
            storage,
            logs: RefCell::new(HashMap::new()),
            registry: RefCell::new(Registry::default()),
            mesh,
            metrics: Default::default(),
            inflight: Rc::new(glommio::sync::Semaphore::new(INFLIGHT_BYTES_PER_CORE)),
            producer_ids: RefCell::new(producer_ids),
            groups: Default::default(),
            replies: RefCell::new(HashMap::new()),
            next_reply: Cell::new(0),
        });
        core.apply_registry(registry, Vec::new()).await?;
        Ok(core)
    }

    /// Number of cores.
    pub fn cores(&self) -> usize {
        self.shared.config.cores
    }

    /// The core owning a partition.
    pub fn owner(&self, topic: &str, partition: u32) -> usize {
        owner_core(topic, partition, self.cores())
    }

    /// A reply address for a request to another core, and the future that
    /// resolves with the answer (`None` if it can never come).
    pub fn expect_reply<T: 'static>(
        &self,
    ) -> (ReplyTo<T>, impl std::future::Future<Output = Option<T>>) {
        let id = self.next_reply.get();
        self.next_reply.set(id + 1);
        let (tx, rx) = oneshot::channel();
        self.replies.borrow_mut().insert(id, tx);
        let to = ReplyTo {
            core: self.id,
            id,
            _t: PhantomData,
        };
        let answer = async move {
            let v = rx.await.ok()?;
            v.0.downcast::<T>().ok().map(|b| *b)
        };
        (to, answer)
    }

    /// Hands an answer that arrived over the mesh to its waiting request
    /// (on this core, so the wake-up is local).
    pub fn deliver(&self, id: u64, value: ReplyValue) {
        if let Some(tx) = self.replies.borrow_mut().remove(&id) {
            let _ = tx.send(value);
        }
    }

    /// Sends a message to a core (its mesh peer).
    pub async fn send_to(&self, core: usize, msg: CoreMsg) -> anyhow::Result<()> {
        let peer = self.shared.peer_of_core[core].load(Ordering::Acquire);
        self.mesh
            .send_to(peer, msg)
            .await
            .map_err(|_| anyhow::anyhow!("core {core} is not accepting messages"))
    }

    /// Opens the logs this core owns under `registry` that are not open,
    /// closes the ones it no longer owns, removes deleted partitions.
    pub async fn apply_registry(
        &self,
        registry: Registry,
        deleted: Vec<(String, u32)>,
    ) -> anyhow::Result<()> {
        let data_dir = self.shared.config.data_dir.clone();
        self.groups.forget_log_ends(&deleted);
        for (topic, partition) in deleted {
            let log = self.logs.borrow_mut().remove(&(topic.clone(), partition));
            if let Some(log) = log {
                log.delete()
                    .await
                    .with_context(|| format!("deleting {topic}-{partition}"))?;
            }
        }
        for (topic, spec) in registry.topics() {
            let cfg = registry::log_config(&spec.configs)
                .map_err(|e| anyhow::anyhow!("topic {topic}: {e}"))?;
            for p in 0..spec.partitions {
                if self.owner(topic, p) != self.id {
                    continue;
                }
                let existing = self.logs.borrow().get(&(topic.clone(), p)).cloned();
                match existing {
                    Some(log) => log.set_config(cfg.clone()),
                    None => {
                        let (log, rep) = PartitionLog::open(
                            &self.storage,
                            partition_dir(&data_dir, topic, p),
                            cfg.clone(),
                        )
                        .await
                        .with_context(|| format!("opening {topic}-{p}"))?;
                        if !rep.clean && rep.segments > 0 {
                            tracing::warn!(partition = %format!("{topic}-{p}"), ?rep, "recovered after an unclean shutdown");
                        }
                        self.logs.borrow_mut().insert((topic.clone(), p), log);
                    }
                }
            }
        }
        *self.registry.borrow_mut() = registry;
        Ok(())
    }

    /// A log this core owns, or the wire error for an unknown partition.
    pub fn owned_log(&self, topic: &str, partition: u32) -> Result<PartitionLog, PartitionError> {
        self.log(topic, partition)
            .ok_or_else(|| PartitionError::unknown(topic, partition))
    }

    /// A log this core owns.
    pub fn log(&self, topic: &str, partition: u32) -> Option<PartitionLog> {
        self.logs
            .borrow()
            .get(&(topic.to_string(), partition))
            .cloned()
    }

    /// Closes every log cleanly (shutdown).
    pub async fn close_all(&self) {
        let logs: Vec<_> = self.logs.borrow_mut().drain().collect();
        for ((topic, p), log) in logs {
            if let Err(e) = log.close().await {
                tracing::error!(partition = %format!("{topic}-{p}"), error = %e, "close failed");
            }
        }
    }
}

/// Receives messages from every peer and hands each to `handle`.
pub fn serve_mesh(core: Rc<Core>, mut receivers: Receivers<CoreMsg>) {
    for (_, rx) in receivers.streams() {
        let core = core.clone();
        glommio::spawn_local(async move {
            while let Some(msg) = rx.recv().await {
                let core = core.clone();
                glommio::spawn_local(
                    async move { crate::handlers::handle_core_msg(&core, msg).await },
                )
                .detach();
            }
        })
        .detach();
    }
}
