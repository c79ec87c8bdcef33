//! One core of the broker (its *shard*): the storage shard, the partition
//! logs it owns, its copy of the metadata view, its consumer groups, and
//! its ends of the cross-core mesh ([`mesh`]). [`partition`] holds what a
//! core does with a partition it owns (append, read, offsets, compact) and
//! with a message from another core.
//!
//! Which core owns what: the metadata view records the owner core of every
//! partition; only that core opens its log. Core 0 also runs the metadata
//! writer (`crate::metadata::writer`) and the producer-id allocator.

pub mod answers;
pub mod logins;
pub mod mesh;
pub mod partition;
pub mod producer_ids;
pub mod published;
pub mod quotas;
pub mod stalls;
pub mod stats;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;

use anyhow::Context;
use weir_storage::{PartitionLog, ShardConfig, StorageShard};

use crate::error::BrokerError;
use crate::metadata::{self, partition_dir, MetadataView};
use crate::server::config::BrokerConfig;
use crate::server::limits::INFLIGHT_BYTES_PER_CORE;
use mesh::{CoreMsg, ReplyTo, ReplyWait};

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
    /// Actual Kafka listener address, if any.
    pub kafka_listen: Option<std::net::SocketAddr>,
    /// Each core's own Kafka port (0 until bound; all 0 without per-core
    /// Kafka brokers).
    pub kafka_core_ports: Vec<AtomicU16>,
    /// Each core's own port on each further native listener
    /// (`config.listen_more`, whose addresses are the bound ones).
    pub more_core_ports: Vec<Vec<AtomicU16>>,
    /// Each core's own port on each further Kafka listener
    /// (`config.kafka_more`; all 0 without per-core Kafka brokers).
    pub kafka_more_core_ports: Vec<Vec<AtomicU16>>,
    /// Mesh peer id of each core.
    pub peer_of_core: Arc<[std::sync::atomic::AtomicUsize]>,
    /// This node's controller (its member of the metadata quorum).
    pub controller: Arc<weir_replication::Controller>,
    /// This node's certificates (the cores' replication endpoints).
    pub node_tls: weir_replication::tls::NodeTls,
    /// Each core's replication (QUIC) port (0 until bound).
    pub replication_core_ports: Vec<AtomicU16>,
    /// What the rooms above a core do once it applied a metadata view,
    /// with the partitions deleted (`service::remote::metadata_applied`: the
    /// groups drop deleted topics' offsets, the replicas follow the view).
    /// Handed in by the server, so that the core knows neither room.
    pub after_metadata: fn(&Rc<Core>, &[(String, u32)]),
    /// TLS of the client listeners (`None`: no certificate configured).
    pub client_tls: Option<Arc<crate::server::tls::ServerTls>>,
    /// OAUTHBEARER's keys (`None`: not offered).
    pub oauth: Option<Arc<crate::server::oauth::OAuthKeys>>,
    /// Set on SIGHUP: read the certificate files again.
    pub reload_tls: Arc<AtomicBool>,
    /// The ACLs, as the metadata last had them.
    pub acls: published::Published<weir_replication::meta::AclBinding>,
    /// The client quotas, as the metadata last had them.
    pub quota_config: published::Published<weir_replication::meta::QuotaEntry>,
    /// The quotas' budgets.
    pub meters: quotas::Meters,
    /// Tiered storage's object store (`--remote-storage`), if configured.
    pub remote: Option<weir_tier::RemoteStore>,
}

impl Shared {
    /// Whether shutdown was requested.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Publishes the ACLs and quotas of `security` to every core.
    pub fn publish_security(&self, security: &weir_replication::meta::SecurityState) {
        self.acls.publish(&security.acls);
        self.quota_config.publish(&security.quotas);
    }
}

/// The exit status of a broker stopped by a failed fdatasync (EX_IOERR).
pub const EXIT_SYNC_FAILED: i32 = 74;

/// A failed fdatasync stops the broker ("fsyncgate"): the kernel may have
/// dropped the pages it failed to write, so a retry could report success
/// for data the disk never got. The process exits; restarted, it recovers
/// from what is on disk (an unacknowledged tail is cut off, replicas
/// catch up from the new leader), and meanwhile the cluster elects
/// other leaders.
fn stop_on_sync_failure(e: &weir_storage::StorageError) {
    stop_for_storage(
        e,
        "fdatasync failed: stopping the broker; restart it to recover from what is on disk",
    );
}

/// Logs why, then exits with [`EXIT_SYNC_FAILED`].
fn stop_for_storage(e: &weir_storage::StorageError, why: &str) -> ! {
    tracing::error!(error = %e, exit_status = EXIT_SYNC_FAILED, "{why}");
    std::process::exit(EXIT_SYNC_FAILED);
}

/// A failed write stops a broker of a cluster (as Kafka halts when its
/// last log directory fails): its partitions cannot take a write, and
/// while it runs it would keep leading them; stopped, it is fenced and
/// other in-sync replicas lead. Its followers may hold batches it served
/// before writing them (`PartitionLog::read_appended`): a leader that
/// rolled back and went on in the same epoch would leave them diverged
/// unknowingly. Free space or mend the disk, then restart it. (A one-node
/// broker stays up: its log rolls back, refuses the appends that need
/// space and serves reads.)
fn stop_on_write_failure(e: &weir_storage::StorageError) {
    stop_for_storage(
        e,
        if e.is_disk_full() {
            "the data disk is full: stopping the broker so that other replicas lead its partitions; \
             free space, then restart it"
        } else {
            "a write to the data disk failed: stopping the broker so that other replicas lead its \
             partitions; check the disk, then restart it"
        },
    );
}

/// Whether this broker is a node of a configured cluster (`--voters`):
/// it may lead replicated partitions, so a failed write stops it
/// ([`stop_on_write_failure`]) and its followers may be served batches
/// not yet written.
pub(crate) fn in_cluster(config: &BrokerConfig) -> bool {
    !config.cluster.voters.is_empty()
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
    /// This core's copy of the metadata view.
    metadata: RefCell<Arc<MetadataView>>,
    /// This core's ends of the cross-core mesh.
    pub mesh: Rc<mesh::Mesh>,
    /// This core's counters.
    pub metrics: crate::metrics::Metrics,
    /// Bytes of requests being read or handled on this core: a connection
    /// takes from it as bytes arrive and gives a frame's share back after
    /// answering, so a core never holds more than
    /// [`INFLIGHT_BYTES_PER_CORE`] in requests.
    pub inflight: Rc<glommio::sync::Semaphore>,
    /// Open connections on this core.
    pub connections: Cell<usize>,
    /// The producer-id allocator (used on core 0 only).
    pub producer_ids: RefCell<producer_ids::ProducerIds>,
    /// One producer-id block reservation at a time.
    pub producer_ids_reserving: glommio::sync::Semaphore,
    /// The consumer groups this core coordinates.
    pub groups: crate::groups::registry::Groups,
    /// The transactional ids this core coordinates.
    pub txns: crate::txns::registry::Txns,
    /// Share groups: those this core coordinates, and the share
    /// partitions and sessions of the partitions it owns.
    pub shares: crate::share::registry::Shares,
    /// Tiered storage: remote chunks and indexes read, counters.
    pub tier: crate::tier::state::TierState,
    /// The metadata writer's queue (core 0 only).
    pub(crate) metadata_writer: RefCell<Option<crate::metadata::Writer>>,
    /// The replicas this core holds: roles, followers, fetchers.
    pub replication: crate::replica::state::Replication,
    /// Failed SASL logins per source address.
    pub logins: logins::Logins,
    /// This core's copy of the ACLs.
    pub acls: published::CoreCopy<weir_replication::meta::AclBinding>,
    /// This core's copy of the client quotas.
    quota_copy: published::CoreCopy<weir_replication::meta::QuotaEntry>,
}

impl Core {
    /// Creates the core's state and opens the logs it owns.
    pub async fn start(
        id: usize,
        shared: Arc<Shared>,
        view: Arc<MetadataView>,
        mesh: Rc<mesh::Mesh>,
    ) -> anyhow::Result<Rc<Core>> {
        let storage = StorageShard::new(ShardConfig {
            cache_bytes: shared.config.cache_bytes_per_core,
            cleaner_dedupe_buffer_bytes: shared.config.log_cleaner_dedupe_buffer_size,
            cleaner_io_max_bytes_per_sec: shared.config.log_cleaner_io_max_bytes_per_second,
            cleaner_io_busy_bytes_per_sec: shared.config.log_cleaner_io_busy_bytes_per_second,
            write_through_bytes_min: shared.config.log_write_through_bytes,
            write_through_alone_bytes_max: shared.config.log_write_through_alone_bytes,
            sync_group: shared.config.log_sync_group,
            on_sync_failure: Some(stop_on_sync_failure),
            on_write_failure: in_cluster(&shared.config).then_some(stop_on_write_failure as fn(&_)),
            ..ShardConfig::default()
        });
        let producer_ids = producer_ids::ProducerIds::load(&shared.config.data_dir)?;
        let core = Rc::new(Core {
            id,
            shared,
            storage,
            logs: RefCell::new(HashMap::new()),
            metadata: RefCell::new(Arc::new(MetadataView::default())),
            mesh,
            metrics: Default::default(),
            inflight: Rc::new(glommio::sync::Semaphore::new(INFLIGHT_BYTES_PER_CORE)),
            connections: Cell::new(0),
            producer_ids: RefCell::new(producer_ids),
            producer_ids_reserving: glommio::sync::Semaphore::new(1),
            groups: Default::default(),
            txns: Default::default(),
            shares: Default::default(),
            tier: Default::default(),
            metadata_writer: RefCell::new(None),
            replication: Default::default(),
            logins: Default::default(),
            acls: Default::default(),
            quota_copy: Default::default(),
        });
        core.apply_metadata(view, Vec::new()).await?;
        Ok(core)
    }

    /// A reply address for a request to core `target`, and the wait for
    /// its answer ([`mesh::Mesh::expect_reply`]).
    pub async fn expect_reply<T: 'static>(
        &self,
        target: usize,
    ) -> Result<(ReplyTo<T>, ReplyWait<T>), BrokerError> {
        self.mesh.expect_reply(target).await
    }

    /// Sends a request to another core ([`mesh::Mesh::send_to`]).
    pub async fn send_to(&self, core: usize, msg: CoreMsg) -> Result<(), BrokerError> {
        self.mesh.send_to(core, msg).await
    }

    /// Sends a request to core `target` and waits for its answer
    /// ([`mesh::Mesh::call`]).
    pub async fn call<T: Send + 'static>(
        &self,
        target: usize,
        extra_wait: std::time::Duration,
        msg: impl FnOnce(ReplyTo<T>) -> CoreMsg,
    ) -> Result<T, BrokerError> {
        self.mesh.call(target, extra_wait, msg).await
    }

    /// The client quotas now.
    pub fn quota_config_now(&self) -> Arc<Vec<weir_replication::meta::QuotaEntry>> {
        self.quota_copy.current(&self.shared.quota_config)
    }

    /// Number of cores.
    pub fn cores(&self) -> usize {
        self.shared.config.cores
    }

    /// This core's metadata view.
    pub fn metadata(&self) -> Arc<MetadataView> {
        self.metadata.borrow().clone()
    }

    /// The core owning a partition, if it exists.
    pub fn owner(&self, topic: &str, partition: u32) -> Option<usize> {
        self.metadata.borrow().owner(topic, partition)
    }

    /// Whether this node holds its leader lease with the metadata it has
    /// applied (`Controller::holds_lease`): without it, it leads nothing
    /// and its metadata may be out of date.
    pub fn holds_lease(&self) -> bool {
        self.shared
            .controller
            .holds_lease(self.metadata.borrow().version)
    }

    /// The core leading a partition on this node; `NotLeader` for a
    /// partition another node leads (this node may hold a follower
    /// replica of it) or while this node holds no leader lease
    /// (`Controller::holds_lease`), `UnknownPartition` for one that does
    /// not exist.
    pub fn locate(&self, topic: &str, partition: u32) -> Result<usize, crate::error::BrokerError> {
        let view = self.metadata.borrow();
        let Some(t) = view.get(topic).filter(|t| partition < t.partitions()) else {
            return Err(self.unknown_here(topic, partition));
        };
        let not_leader = || crate::error::BrokerError::NotLeader {
            topic: topic.to_string(),
            partition,
            leader: t.leaders.get(partition as usize).copied().unwrap_or(0),
        };
        let core = t
            .leading_core(partition, self.shared.config.cluster.node_id)
            .ok_or_else(not_leader)?;
        // A node that may have been fenced (paused, cut off: no
        // acknowledged heartbeat for most of a session) or has not yet
        // applied the metadata of its last registration does not act as a
        // leader: another may lead at a newer epoch already.
        if !self.shared.controller.holds_lease(view.version) {
            return Err(not_leader());
        }
        Ok(core)
    }

    /// Makes this core match a metadata view: opens the logs it owns that
    /// are not open, applies changed configs, removes deleted partitions.
    /// A view not newer than the current one is ignored.
    pub async fn apply_metadata(
        self: &Rc<Self>,
        view: Arc<MetadataView>,
        deleted: Vec<(String, u32)>,
    ) -> anyhow::Result<()> {
        if view.version < self.metadata.borrow().version {
            return Ok(());
        }
        let data_dir = self.shared.config.data_dir.clone();
        self.groups.forget_log_ends(&deleted);
        self.delete_logs(&deleted, "deleted").await?;
        // Replicas moved to other nodes (a reassignment completed): the
        // metadata that says so is committed, so the local copy goes.
        let moved: Vec<(String, u32)> = self
            .logs
            .borrow()
            .keys()
            .filter(|(t, p)| view.get(t).is_some_and(|m| m.core_of(*p).is_none()))
            .cloned()
            .collect();
        self.groups.forget_log_ends(&moved);
        self.delete_logs(&moved, "moved to other nodes").await?;
        for (topic, meta) in view.topics() {
            let cfg = metadata::log_config(&meta.configs)
                .map_err(|e| anyhow::anyhow!("topic {topic}: {e}"))?;
            for p in 0..meta.partitions() {
                if meta.core_of(p) != Some(self.id) {
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
        *self.metadata.borrow_mut() = view;
        (self.shared.after_metadata)(self, &deleted);
        Ok(())
    }

    /// Closes and removes the logs of `parts` this core holds (`why`: the
    /// partitions were deleted, or moved to other nodes).
    async fn delete_logs(&self, parts: &[(String, u32)], why: &str) -> anyhow::Result<()> {
        for (topic, partition) in parts {
            let log = self.logs.borrow_mut().remove(&(topic.clone(), *partition));
            if let Some(log) = log {
                log.delete()
                    .await
                    .with_context(|| format!("deleting {topic}-{partition} ({why})"))?;
                tracing::info!(partition = %format!("{topic}-{partition}"), "{why}: its log here is deleted");
            }
        }
        Ok(())
    }

    /// A log this core owns, or the error: `NotLeader` for a partition
    /// the metadata has but this core does not hold (it moved away, or
    /// is not open yet: the client asks the metadata again), unknown
    /// otherwise.
    pub fn owned_log(&self, topic: &str, partition: u32) -> Result<PartitionLog, BrokerError> {
        self.log(topic, partition)
            .ok_or_else(|| self.not_held(topic, partition))
    }

    /// The error for a partition this core does not hold (any more):
    /// `NotLeader` naming the leader the metadata has, if it has the
    /// partition, unknown otherwise.
    pub fn not_held(&self, topic: &str, partition: u32) -> BrokerError {
        match self
            .metadata()
            .get(topic)
            .filter(|t| partition < t.partitions())
        {
            Some(t) => BrokerError::NotLeader {
                topic: topic.to_string(),
                partition,
                leader: t.leaders.get(partition as usize).copied().unwrap_or(0),
            },
            None => self.unknown_here(topic, partition),
        }
    }

    /// A partition this core's metadata view does not have: unknown —
    /// unless the node's controller already has it and this core has not
    /// applied that version yet (a topic just created, as a client that
    /// learnt of it from another node may find): then `NotLeader` with no
    /// leader known, which clients retry after asking the metadata again.
    fn unknown_here(&self, topic: &str, partition: u32) -> BrokerError {
        let state = self.shared.controller.state();
        let coming = state
            .topics
            .get(topic)
            .is_some_and(|t| (partition as usize) < t.partitions.len());
        if coming {
            BrokerError::NotLeader {
                topic: topic.to_string(),
                partition,
                leader: 0,
            }
        } else {
            BrokerError::unknown(topic, partition)
        }
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
