//! Topic administration, metadata, producer ids and compaction requests.
//! Topic changes go through the metadata writer
//! ([`crate::metadata::writer`]); this module adds the client-facing
//! policy (the internal topic is protected, auto-creation).

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{offsets, BrokerError, OffsetsOk, Result};
use weir_proto::error_code::ErrorCode;

use crate::groups::api::Refusal;
use crate::metadata::writer;
use crate::metadata::Change;
use crate::metadata::OFFSETS_TOPIC;
use crate::metadata::{self, TopicError, TopicMeta, TopicSpec};
use crate::shard::mesh::CoreMsg;
use crate::shard::partition::{self, CompactOk};
use crate::shard::Core;

/// Applies a topic change requested by a client: the internal topic
/// cannot be deleted or grown (its partition count maps groups to cores),
/// nor its configs changed (its cleanup policy keeps groups).
pub async fn change_topic(core: &Rc<Core>, change: Change) -> std::result::Result<(), TopicError> {
    refuse_internal(&change)?;
    writer::submit(core, change).await.map(|_| ())
}

/// What [`change_topic`] would answer, without changing anything (Kafka's
/// validate_only): the same policy and the metadata writer's checks.
pub fn validate_change(core: &Core, change: Change) -> std::result::Result<(), TopicError> {
    refuse_internal(&change)?;
    writer::check(core, change)
}

fn refuse_internal(change: &Change) -> std::result::Result<(), TopicError> {
    if let Change::Delete(name) | Change::AddPartitions(name, _) | Change::Alter(name, _) = change {
        if crate::metadata::is_internal(name) {
            return Err(TopicError::Config(format!(
                "{name} is internal: it cannot be deleted, get more partitions or \
                 have its configs changed"
            )));
        }
    }
    Ok(())
}

/// Creates `topic` if auto-creation is on and it does not exist; whether it
/// exists afterwards.
pub async fn ensure_topic(core: &Rc<Core>, topic: &str) -> bool {
    if core.metadata().get(topic).is_some() {
        return true;
    }
    if !core.shared.config.auto_create_topics {
        return false;
    }
    let spec = TopicSpec::new(core.shared.config.default_partitions, BTreeMap::new());
    let r = writer::submit(core, Change::Create(topic.into(), spec)).await;
    r.is_ok() || matches!(r, Err(TopicError::Exists(_)))
}

/// The own port of each core.
pub fn core_ports(core: &Core) -> Vec<u16> {
    core.shared
        .core_ports
        .iter()
        .map(|p| p.load(Ordering::Acquire))
        .collect()
}

/// The error for a partition of another core asked on a core's own port.
pub fn not_owner(core: &Core, topic: &str, partition: u32, owner: usize) -> BrokerError {
    let port = |c: usize| core.shared.core_ports[c].load(Ordering::Acquire);
    BrokerError::NotOwner {
        topic: topic.to_string(),
        partition,
        owner,
        owner_port: port(owner),
        core: core.id,
        port: port(core.id),
    }
}

/// The named topics (auto-created if that is on), or every topic but the
/// internal one (`None`): each with its metadata, or `None` if unknown.
///
/// `None` asks for every topic: `internal` says whether the internal
/// `__consumer_offsets` is among them (Kafka's Metadata lists it, marked
/// internal; the native listing leaves it out).
pub async fn topics(
    core: &Rc<Core>,
    names: Option<Vec<String>>,
    internal: bool,
) -> Vec<(String, Option<TopicMeta>)> {
    let names = match names {
        Some(n) => n,
        None => listed_topics(core, internal),
    };
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        ensure_topic(core, &name).await;
        let meta = core.metadata().get(&name).cloned();
        out.push((name, meta));
    }
    out
}

/// Every topic but the internal `__consumer_offsets` (listed only when
/// asked for by name).
pub fn visible_topics(core: &Core) -> Vec<String> {
    listed_topics(core, false)
}

/// Every topic, the internal ones only if `internal`.
pub fn listed_topics(core: &Core, internal: bool) -> Vec<String> {
    core.metadata()
        .topics()
        .keys()
        .filter(|t| internal || !crate::metadata::is_internal(t))
        .cloned()
        .collect()
}

/// Hands out a producer id through core 0.
pub async fn init_producer_id(core: &Rc<Core>) -> Result<i64> {
    if core.id == 0 {
        return partition::init_producer_id_local(core).await;
    }
    core.call(0, Duration::ZERO, |reply| CoreMsg::InitProducerId { reply })
        .await?
}

/// One partition's part of a description.
#[derive(Debug, Clone)]
pub struct PartitionInfo {
    /// Partition.
    pub partition: u32,
    /// Owner core (on the leader's node).
    pub core: usize,
    /// Its offsets (`None` if they could not be read, or another node
    /// leads it).
    pub offsets: Option<OffsetsOk>,
    /// Leader node as the cluster metadata says (0: none).
    pub leader: u64,
    /// Leader epoch.
    pub leader_epoch: u32,
    /// Replica nodes, the preferred leader first.
    pub replicas: Vec<u64>,
    /// In-sync replicas.
    pub isr: Vec<u64>,
    /// The nodes a reassignment under way moves it to (empty: none).
    pub target: Vec<u64>,
}

/// A topic's description: effective configs and every partition.
#[derive(Debug, Clone)]
pub struct TopicDescription {
    /// Every config key with its value (defaults filled in).
    pub configs: Vec<(String, String)>,
    /// Every partition.
    pub partitions: Vec<PartitionInfo>,
}

/// Describes the named topics (every visible one if `names` is empty).
pub async fn describe(
    core: &Rc<Core>,
    names: Vec<String>,
) -> Vec<(String, Option<TopicDescription>)> {
    let names = if names.is_empty() {
        visible_topics(core)
    } else {
        names
    };
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let Some(meta) = core.metadata().get(&name).cloned() else {
            out.push((name, None));
            continue;
        };
        let state = core.shared.controller.state();
        let placed = state.topics.get(&name);
        let mut partitions = Vec::new();
        for p in 0..meta.partitions() {
            let placed = placed.and_then(|t| t.partitions.get(p as usize));
            let leader = placed.and_then(|s| s.leader).unwrap_or(0);
            let here = meta.leading_core(p, core.shared.config.cluster.node_id);
            partitions.push(PartitionInfo {
                partition: p,
                core: here.unwrap_or_else(|| {
                    placed
                        .and_then(|s| s.replicas.iter().find(|r| r.node == leader))
                        .map_or(0, |r| r.core as usize)
                }),
                offsets: match here {
                    Some(_) => offsets::offsets(core, &name, p, None).await.ok(),
                    None => None,
                },
                leader,
                leader_epoch: placed.map_or(0, |s| s.leader_epoch),
                replicas: placed
                    .map_or_else(Vec::new, |s| s.replicas.iter().map(|r| r.node).collect()),
                isr: placed.map_or_else(Vec::new, |s| s.isr.clone()),
                target: placed.map_or_else(Vec::new, |s| s.target.iter().map(|r| r.node).collect()),
            });
        }
        out.push((
            name,
            Some(TopicDescription {
                configs: metadata::effective_configs(&meta.configs),
                partitions,
            }),
        ));
    }
    out
}

/// `Compact`: every partition of a compacted topic, one after the other
/// (each on its owner core); `run` = run a pass now, else only report.
pub async fn compact(
    core: &Rc<Core>,
    topic: &str,
    run: bool,
) -> Result<Vec<(u32, Result<CompactOk>)>> {
    let meta = core
        .metadata()
        .get(topic)
        .cloned()
        .ok_or_else(|| TopicError::Unknown(topic.to_string()))?;
    let policy = metadata::log_config(&meta.configs)
        .map(|c| c.cleanup_policy)
        .unwrap_or_default();
    if !policy.compacts() {
        return Err(TopicError::Config(format!(
            "topic `{topic}` is not compacted (cleanup.policy={}); set cleanup.policy=compact first",
            policy.as_str()
        ))
        .into());
    }
    let mut out = Vec::new();
    for p in 0..meta.partitions() {
        let r = offsets::on_owner(
            core,
            topic,
            p,
            partition::compact_local(core, topic, p, run),
            |reply| CoreMsg::Compact {
                topic: topic.to_string(),
                partition: p,
                run,
                reply,
            },
        )
        .await;
        out.push((p, r));
    }
    Ok(out)
}

/// The cluster as this node sees it (its controller's applied metadata);
/// each node's native address is its listener named `listener` (where the
/// client came in; a node without one: its first).
pub fn describe_cluster(
    core: &Core,
    listener: &str,
) -> weir_proto::messages::DescribeClusterResponse {
    use weir_proto::messages::{DescribeClusterResponse, NodeDescription};
    let controller = &core.shared.controller;
    let state = controller.state();
    let voters = controller.voters();
    DescribeClusterResponse {
        cluster_id: state.cluster_id.clone(),
        node_id: controller.node_id(),
        controller_leader: controller.leader().unwrap_or(0),
        metadata_version: state.version,
        metadata_digest: state.digest(),
        nodes: state
            .nodes
            .values()
            .map(|n| {
                let native =
                    weir_replication::pick_listener(&n.info.native, &n.info.core_ports, listener)
                        .unwrap_or(weir_replication::AdvertisedListener {
                            name: None,
                            addr: String::new(),
                            ports: Vec::new(),
                        });
                NodeDescription {
                    id: n.info.id,
                    rack: n.info.rack.clone(),
                    cores: n.info.cores,
                    native: native.addr,
                    core_ports: native.ports,
                    kafka: n.info.kafka.clone(),
                    replication: n.info.replication.clone(),
                    metrics: n.info.metrics.clone(),
                    broker_epoch: n.broker_epoch,
                    fenced: n.fenced,
                    voter: voters.contains(&n.info.id),
                }
            })
            .collect(),
    }
}

/// Adds a voter (after it caught up as a learner) or removes one; only on
/// the controller leader (elsewhere: `NotLeader` and the leader's id).
pub async fn change_voters(
    core: &Core,
    req: weir_proto::messages::ChangeVotersRequest,
) -> weir_proto::messages::ChangeVotersResponse {
    use weir_proto::error_code::ErrorCode;
    use weir_proto::messages::ChangeVotersResponse;
    let controller = core.shared.controller.clone();
    let leader = controller.leader().unwrap_or(0);
    let answer = |error: ErrorCode, message: Option<String>| ChangeVotersResponse {
        error: error.as_u16(),
        message,
        leader: controller.leader().unwrap_or(0),
        voters: controller.voters().into_iter().collect(),
    };
    if leader != controller.node_id() {
        return answer(
            ErrorCode::NotLeader,
            Some(format!(
                "node {} is not the controller leader (the leader is {})",
                controller.node_id(),
                if leader == 0 {
                    "not known".to_string()
                } else {
                    format!("node {leader}")
                }
            )),
        );
    }
    if req.node_id == 0 || (req.add && req.replication.is_empty()) {
        return answer(
            ErrorCode::InvalidRequest,
            Some("a node id (1 or more) and, to add it, its replication address".into()),
        );
    }
    let result = if req.add {
        controller.add_voter(req.node_id, req.replication).await
    } else {
        controller.remove_voter(req.node_id).await
    };
    match result {
        Ok(()) => answer(ErrorCode::None, None),
        Err(e) => answer(ErrorCode::InvalidRequest, Some(e.to_string())),
    }
}

/// The per-core endpoints of every node of the cluster, each with a
/// cluster-wide index (nodes by id, cores in order: a one-node cluster's
/// indexes are its core ids), for a native listener (`kafka` false) or a
/// Kafka one, the one named `listener` (a security protocol's name: where
/// the client came in; a node without one of that name: its first); and
/// where each partition's leader core sits in it.
pub struct ClusterEndpoints {
    /// `(host, port)` by cluster-wide index.
    pub cores: Vec<(String, u16)>,
    index: HashMap<(u64, u32), u32>,
    me: u64,
    state: std::sync::Arc<weir_replication::ClusterState>,
}

impl ClusterEndpoints {
    /// The endpoints as this node knows them; `local` is this node's own
    /// `(host, ports)` (its live listeners, not what it registered).
    pub fn new(core: &Core, kafka: bool, listener: &str, local: (String, Vec<u16>)) -> Self {
        let me = core.shared.config.cluster.node_id;
        let state = core.shared.controller.state();
        let mut nodes: Vec<(u64, String, Vec<u16>)> = Vec::new();
        if !state.nodes.contains_key(&me) {
            nodes.push((me, local.0.clone(), local.1.clone()));
        }
        for (id, n) in &state.nodes {
            if *id == me {
                nodes.push((me, local.0.clone(), local.1.clone()));
            } else {
                let (addrs, ports) = if kafka {
                    (&n.info.kafka, &n.info.kafka_core_ports)
                } else {
                    (&n.info.native, &n.info.core_ports)
                };
                let Some(l) = weir_replication::pick_listener(addrs, ports, listener) else {
                    nodes.push((*id, String::new(), Vec::new()));
                    continue;
                };
                let host = l.addr.rsplit_once(':').map_or(String::new(), |(h, _)| {
                    h.trim_matches(['[', ']']).to_string()
                });
                nodes.push((*id, host, l.ports));
            }
        }
        let mut cores = Vec::new();
        let mut index = HashMap::new();
        for (node, host, ports) in nodes {
            for (c, port) in ports.into_iter().enumerate() {
                index.insert((node, c as u32), cores.len() as u32);
                cores.push((host.clone(), port));
            }
        }
        ClusterEndpoints {
            cores,
            index,
            me,
            state,
        }
    }

    /// The cluster-wide indexes of partition `p`'s replicas (`meta` is
    /// this node's view of it) and of those in its ISR, in the metadata's
    /// order; replicas whose endpoints are unknown are left out.
    pub fn replicas(&self, meta: &TopicMeta, p: u32) -> (Vec<u32>, Vec<u32>) {
        let Some(placed) = meta.placement.get(p as usize) else {
            return (Vec::new(), Vec::new());
        };
        let at = |node: u64| {
            placed
                .replicas
                .iter()
                .find(|(n, _)| *n == node)
                .and_then(|(n, c)| self.index.get(&(*n, *c)).copied())
        };
        (
            placed.replicas.iter().filter_map(|(n, _)| at(*n)).collect(),
            placed.isr.iter().filter_map(|n| at(*n)).collect(),
        )
    }

    /// The cluster-wide index of this node's core `c`.
    pub fn local(&self, c: u32) -> Option<u32> {
        self.index.get(&(self.me, c)).copied()
    }

    /// The cluster-wide index of the core leading partition `p` of
    /// `topic` (`meta` is this node's view of it); `None` without a live
    /// leader, or one whose endpoints are unknown.
    pub fn leader(&self, topic: &str, meta: &TopicMeta, p: u32) -> Option<u32> {
        match meta.leading_core(p, self.me) {
            Some(c) => self.local(c as u32),
            None => {
                let leader = meta.leaders.get(p as usize).copied().unwrap_or(0);
                let replica = self
                    .state
                    .topics
                    .get(topic)?
                    .partitions
                    .get(p as usize)?
                    .replicas
                    .iter()
                    .find(|r| r.node == leader)?;
                self.index.get(&(leader, replica.core)).copied()
            }
        }
    }
}

/// Where `group`'s coordinator is among `endpoints` (FindCoordinator): its node and the
/// cluster-wide index of the core leading its offsets partition;
/// `NotCoordinator` while that partition has no live leader.
pub(crate) fn coordinator_at(
    core: &Core,
    endpoints: &ClusterEndpoints,
    group: &str,
) -> std::result::Result<(u64, u32), Refusal> {
    coordinator_in(core, endpoints, OFFSETS_TOPIC, group)
}

/// [`coordinator_at`] for the key `key` of a coordinator runtime's topic
/// (`__consumer_offsets`: a group; `__transaction_state`: a
/// transactional id).
pub(crate) fn coordinator_in(
    core: &Core,
    endpoints: &ClusterEndpoints,
    topic: &str,
    key: &str,
) -> std::result::Result<(u64, u32), Refusal> {
    let group = key;
    let p = if topic == OFFSETS_TOPIC {
        crate::groups::coordinator::offsets_partition(core, key)?
    } else {
        if key.is_empty() || key.len() > weir_txn::coordinator::TRANSACTIONAL_ID_BYTES_MAX {
            return Err(Refusal(
                ErrorCode::InvalidRequest.as_u16(),
                format!("a key of {} bytes", key.len()),
            ));
        }
        crate::coordinator::partition_of(core, topic, key).ok_or_else(|| {
            Refusal(
                ErrorCode::NotCoordinator.as_u16(),
                format!("the internal topic {topic} does not exist yet: retry"),
            )
        })?
    };
    let view = core.metadata();
    let meta = view.get(topic).ok_or_else(|| {
        Refusal(
            ErrorCode::StorageError.as_u16(),
            format!("the internal topic {topic} does not exist"),
        )
    })?;
    let node = match meta.leading_core(p, core.shared.config.cluster.node_id) {
        Some(_) => core.shared.config.cluster.node_id,
        None => meta.leaders.get(p as usize).copied().unwrap_or(0),
    };
    endpoints
        .leader(topic, meta, p)
        .map(|i| (node, i))
        .ok_or_else(|| {
            Refusal(
                ErrorCode::NotCoordinator.as_u16(),
                format!("{group}'s coordinator ({topic}-{p}) has no live node now: retry"),
            )
        })
}
