//! The replicated cluster metadata: what the controller quorum agrees on,
//! and the commands that change it.
//!
//! Every node applies the same committed commands in log order, so every
//! node's [`ClusterState`] at a given [`ClusterState::version`] (the Raft
//! log index last applied) is the same. Commands carry every decision
//! already made (a topic's id and its placement are chosen by the node that
//! proposes it, see [`place`]), so applying one is deterministic: it
//! validates against the state and records, or refuses with an error that
//! the proposer receives.

use std::collections::{BTreeMap, HashMap};

use rkyv::{Archive, Deserialize, Serialize};

pub use crate::remote::{RemoteCopy, RemoteSegment, RemoteSegmentState, RemoteState, RemoteTopic};

pub use crate::security::{
    AclBinding, QuotaAlteration, QuotaEntityPart, QuotaEntry, ScramDeletion, ScramUpsertion,
    SecurityState, StoredScram, UserCredentials,
};

/// One node's addresses, as it registers them.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct NodeInfo {
    /// Node id (≥ 1, unique in the cluster).
    pub id: u64,
    /// Rack (or zone), for spreading replicas; empty when unset.
    pub rack: String,
    /// Number of cores (shards) the node serves partitions on.
    pub cores: u32,
    /// Native protocol address (`host:port`).
    pub native: String,
    /// Per-core native ports, in core order (empty when the node has none).
    pub core_ports: Vec<u16>,
    /// Kafka protocol address, empty when the listener is off.
    pub kafka: String,
    /// Per-core Kafka ports, in core order (empty when the node has none).
    pub kafka_core_ports: Vec<u16>,
    /// Node-to-node (QUIC) address (the controller's endpoint).
    pub replication: String,
    /// Per-core replication (QUIC) ports, in core order: a follower's core
    /// fetches from the leader's core at its node's replication host and
    /// this port. Empty until the cores listen.
    pub replication_core_ports: Vec<u16>,
    /// Metrics and admin HTTP address, empty when off.
    pub metrics: String,
}

/// One client listener of a node as it advertises it: a name (Kafka's
/// listener name, which is Weir's security protocol name: `SASL_SSL`…),
/// `host:port`, and the per-core ports.
///
/// A node's listeners of one family (native or Kafka) are stored in
/// [`NodeInfo`]'s `native` / `kafka` string and its `core_ports` /
/// `kafka_core_ports`, so that the metadata format stays what it was: one
/// listener is a bare `host:port` (the form every earlier node wrote);
/// several are `NAME://host:port` joined by commas, the first one the
/// node's primary, and their per-core ports one after another (each
/// `cores` long, or none at all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdvertisedListener {
    /// The listener's name (`None`: a node's only listener, written bare).
    pub name: Option<String>,
    /// `host:port`.
    pub addr: String,
    /// Per-core ports, in core order (empty when the node has none).
    pub ports: Vec<u16>,
}

/// Encodes a node's listeners of one family (see [`AdvertisedListener`]):
/// the address string and the per-core ports to store.
pub fn join_listeners(listeners: &[AdvertisedListener]) -> (String, Vec<u16>) {
    if let [only] = listeners {
        return (only.addr.clone(), only.ports.clone());
    }
    let addrs = listeners
        .iter()
        .map(|l| match &l.name {
            Some(n) => format!("{n}://{}", l.addr),
            None => l.addr.clone(),
        })
        .collect::<Vec<_>>()
        .join(",");
    let ports = if listeners.iter().all(|l| !l.ports.is_empty()) {
        listeners.iter().flat_map(|l| l.ports.clone()).collect()
    } else {
        Vec::new()
    };
    (addrs, ports)
}

/// Decodes what [`join_listeners`] stored (empty `addrs`: none).
pub fn split_listeners(addrs: &str, ports: &[u16]) -> Vec<AdvertisedListener> {
    let parts: Vec<&str> = addrs.split(',').filter(|a| !a.is_empty()).collect();
    let per = if parts.is_empty() || ports.len() % parts.len() != 0 {
        0
    } else {
        ports.len() / parts.len()
    };
    parts
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let (name, addr) = match a.split_once("://") {
                Some((n, a)) => (Some(n.to_string()), a.to_string()),
                None => (None, a.to_string()),
            };
            AdvertisedListener {
                name,
                addr,
                ports: ports[i * per..(i + 1) * per].to_vec(),
            }
        })
        .collect()
}

/// The listener named `name` (case-insensitively) of those stored, or the
/// node's primary (first) one when it has none of that name (a node whose
/// configuration lags the others'); `None` when it has none at all.
pub fn pick_listener(addrs: &str, ports: &[u16], name: &str) -> Option<AdvertisedListener> {
    let all = split_listeners(addrs, ports);
    let named = all.iter().position(|l| {
        l.name
            .as_deref()
            .is_some_and(|n| n.eq_ignore_ascii_case(name))
    });
    all.into_iter().nth(named.unwrap_or(0))
}

/// A registered node and its liveness.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct NodeState {
    /// What the node registered.
    pub info: NodeInfo,
    /// Bumped at every registration and every fencing: a node's requests
    /// carry the epoch it registered with, and a stale one is refused.
    pub broker_epoch: u64,
    /// Fenced (its heartbeats lapsed): it leads nothing until it registers again.
    pub fenced: bool,
}

/// Where one replica of a partition lives.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Replica {
    /// Node id.
    pub node: u64,
    /// Core (shard) on that node.
    pub core: u32,
}

/// One partition's replicas and leadership.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PartitionState {
    /// Replicas, the preferred leader first.
    pub replicas: Vec<Replica>,
    /// Leading node, or `None` while no replica in the ISR is live.
    pub leader: Option<u64>,
    /// Bumped at every leader change.
    pub leader_epoch: u32,
    /// In-sync replicas (node ids).
    pub isr: Vec<u64>,
    /// The replicas a reassignment moves to, the preferred leader first
    /// (empty: none under way). While one is, `replicas` holds these and
    /// the old in-sync ones; it completes when every target node is in
    /// the ISR (see [`Command::ReassignPartition`]).
    pub target: Vec<Replica>,
}

/// One topic.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TopicState {
    /// Stable id (a UUID), distinct for a topic re-created under the same name.
    pub id: [u8; 16],
    /// Topic configs by Kafka name (only those set explicitly).
    pub configs: BTreeMap<String, String>,
    /// Partitions in order.
    pub partitions: Vec<PartitionState>,
}

/// The replicated state.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct ClusterState {
    /// Set by the first command the quorum commits; never changes.
    pub cluster_id: String,
    /// Registered nodes by id.
    pub nodes: BTreeMap<u64, NodeState>,
    /// Topics by name.
    pub topics: BTreeMap<String, TopicState>,
    /// The Raft log index of the last command applied (0 before any).
    pub version: u64,
    /// The first producer id not yet handed to a node.
    pub next_producer_id: i64,
    /// Users' credentials, ACLs and client quotas (format 4).
    pub security: SecurityState,
    /// Tiered storage: the remote segments of every partition.
    pub remote: RemoteState,
}

/// A change to the metadata.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Names the cluster; the first command a new quorum commits.
    InitCluster {
        /// The cluster id every node is configured with.
        cluster_id: String,
    },
    /// A node (re)joins — a new run of it: stored, unfenced, its epoch
    /// bumped; a registration it had that was not fenced is fenced first
    /// (its partitions led elsewhere, at a new epoch); partitions without
    /// a live leader whose ISR holds it are led by it.
    RegisterNode(NodeInfo),
    /// A node's heartbeats lapsed: fenced (if its epoch is still `epoch`)
    /// and every partition it leads goes to another live ISR member, or
    /// to none.
    FenceNode {
        /// Node.
        id: u64,
        /// The epoch the controller last saw it with.
        epoch: u64,
    },
    /// Creates a topic with the placement given.
    CreateTopic {
        /// Name.
        name: String,
        /// Stable id.
        id: [u8; 16],
        /// Configs set explicitly.
        configs: BTreeMap<String, String>,
        /// Replicas of each partition, the preferred leader first.
        placement: Vec<Vec<Replica>>,
    },
    /// Deletes a topic.
    DeleteTopic {
        /// Name.
        name: String,
    },
    /// Replaces a topic's configs, if they are still `from` (the proposer
    /// computed `to` from them; a change in between is a conflict).
    AlterConfigs {
        /// Name.
        name: String,
        /// The configs the change was computed against.
        from: BTreeMap<String, String>,
        /// The new configs.
        to: BTreeMap<String, String>,
    },
    /// Reserves a block of `count` producer ids for a node, starting at
    /// `at_least` or later (a node's ids from before the cluster).
    AllocateProducerIds {
        /// Lowest first id the node accepts.
        at_least: i64,
        /// Ids in the block.
        count: i64,
    },
    /// A partition's leader changes its ISR (Kafka's AlterPartition):
    /// applied only if `leader` still leads at `leader_epoch` (a deposed
    /// leader cannot change it). Every member must be a replica; the
    /// leader stays in it.
    AlterPartition {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// The proposing leader.
        leader: u64,
        /// Its leader epoch.
        leader_epoch: u32,
        /// The ISR the change was computed from (another change meanwhile,
        /// e.g. a fencing, makes it a conflict).
        from: Vec<u64>,
        /// The new ISR.
        isr: Vec<u64>,
    },
    /// Moves a partition to the replicas `to`, the preferred leader first
    /// (Kafka's AlterPartitionReassignments), if its replicas are still
    /// `from`. The partition's replicas become `to` plus the current ISR
    /// members not in it (the new ones copy the leader's log and join the
    /// ISR as followers do); once every node of `to` is in the ISR, the
    /// replicas become `to`, the others leave, and if the leader is one of
    /// them, the first in-sync replica of `to` leads at a new epoch. A
    /// node already holding a replica keeps its core; new nodes must be
    /// live. A new reassignment replaces one under way.
    ReassignPartition {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// The replicas the proposer saw.
        from: Vec<Replica>,
        /// The replicas to move to.
        to: Vec<Replica>,
    },
    /// The partition's preferred replica (its first) leads again at a new
    /// epoch, if it is live and in the ISR (Kafka's preferred leader
    /// election); nothing changes if it leads already.
    ElectPreferredLeader {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
    },
    /// Adds partitions to a topic that still has `from` of them.
    AddPartitions {
        /// Name.
        name: String,
        /// The partition count the placement was computed against.
        from: u32,
        /// Replicas of each new partition.
        placement: Vec<Vec<Replica>>,
    },
    /// A registered node's addresses change within one run of it (its
    /// cores' ports, once bound): stored, its epoch bumped, what it leads
    /// kept. Unlike [`Command::RegisterNode`], which is a new run of the
    /// node (a restart). From a node not registered, or fenced, the same
    /// as a registration. (Last, so earlier variants keep their tags in
    /// stored logs.)
    UpdateNode(NodeInfo),
    /// Removes and sets users' SCRAM credentials (Kafka's
    /// AlterUserScramCredentials; the proposer checked each one).
    AlterScramCredentials {
        /// Credentials to remove.
        deletions: Vec<ScramDeletion>,
        /// Credentials to set.
        upsertions: Vec<ScramUpsertion>,
    },
    /// Adds ACLs (Kafka's CreateAcls).
    CreateAcls {
        /// Bindings.
        acls: Vec<AclBinding>,
    },
    /// Removes ACLs (Kafka's DeleteAcls: the bindings the proposer found
    /// its filters to match).
    DeleteAcls {
        /// Bindings.
        acls: Vec<AclBinding>,
    },
    /// Sets and removes client quotas (Kafka's AlterClientQuotas).
    AlterClientQuotas {
        /// Changes, in order.
        changes: Vec<QuotaAlteration>,
    },
    /// A partition's leader begins uploading a segment to the remote tier
    /// (tiered storage): recorded as started, if it still leads at its
    /// epoch and the segment continues the remote log.
    RemoteCopyStarted(Box<RemoteCopy>),
    /// The upload is complete: the segment becomes readable, if its
    /// uploader still leads at `leader_epoch` and it still continues the
    /// remote log (else the uploader deletes its objects).
    RemoteCopyFinished {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// The proposing leader.
        leader: u64,
        /// Its leader epoch.
        leader_epoch: u32,
        /// The segment.
        id: [u8; 16],
    },
    /// Remote segments are to be deleted (retention, DeleteRecords, or the
    /// cleanup of a copy that never finished): no longer read.
    RemoteDeleteStarted {
        /// Topic id.
        topic_id: [u8; 16],
        /// Partition.
        partition: u32,
        /// Segments.
        ids: Vec<[u8; 16]>,
    },
    /// DeleteRecords on a tiered partition: its log start is raised to
    /// `offset` (remote segments wholly below it are to be deleted), if
    /// `leader` still leads it at `leader_epoch`.
    RemoteLogStart {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// The proposing leader.
        leader: u64,
        /// Its leader epoch.
        leader_epoch: u32,
        /// The new log start.
        offset: u64,
    },
    /// Remote segments' objects are deleted: forgotten.
    RemoteDeleteFinished {
        /// Topic id.
        topic_id: [u8; 16],
        /// Partition.
        partition: u32,
        /// Segments.
        ids: Vec<[u8; 16]>,
    },
}

/// Why a command was refused.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalKind {
    /// The topic exists already.
    Exists,
    /// No such topic or node.
    Unknown,
    /// The state changed since the command was computed: compute it again.
    Conflict,
    /// Anything else (a bad placement, another cluster id, …).
    Invalid,
}

/// A refused command: what kind, and the message for the operator.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Kind.
    pub kind: RefusalKind,
    /// Message.
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn refuse(kind: RefusalKind, message: impl Into<String>) -> Refusal {
    Refusal {
        kind,
        message: message.into(),
    }
}

/// What applying a command answered.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct Outcome {
    /// The version (log index) the command was applied at.
    pub version: u64,
    /// Why it was refused (nothing changed), if it was.
    pub error: Option<Refusal>,
    /// For `RegisterNode`: the node's new broker epoch.
    pub broker_epoch: u64,
    /// For `AllocateProducerIds`: the block's first id.
    pub block_start: i64,
}

impl ClusterState {
    /// Applies `command`, committed at log index `version`.
    pub fn apply(&mut self, version: u64, command: &Command) -> Outcome {
        self.version = version;
        let mut outcome = Outcome {
            version,
            ..Outcome::default()
        };
        if let Err(e) = self.apply_inner(command, &mut outcome) {
            outcome.error = Some(e);
        }
        outcome
    }

    /// Records a log entry that carries no command (a leader's blank entry
    /// or a membership change): only the version moves.
    pub fn touch(&mut self, version: u64) {
        self.version = version;
    }

    fn apply_inner(&mut self, command: &Command, outcome: &mut Outcome) -> Result<(), Refusal> {
        use RefusalKind::*;
        match command {
            Command::InitCluster { cluster_id } => {
                if self.cluster_id.is_empty() {
                    self.cluster_id = cluster_id.clone();
                    Ok(())
                } else if &self.cluster_id == cluster_id {
                    Ok(())
                } else {
                    Err(refuse(
                        Invalid,
                        format!("the cluster is `{}`, not `{cluster_id}`", self.cluster_id),
                    ))
                }
            }
            Command::RegisterNode(info) | Command::UpdateNode(info) => {
                if info.id == 0 {
                    return Err(refuse(Invalid, "node id 0 is not allowed"));
                }
                let epoch = self.nodes.get(&info.id).map_or(0, |n| n.broker_epoch) + 1;
                // A node that registers again is a new incarnation (a
                // restart, before the old one was fenced): the old one is
                // fenced now, as Kafka's controller does, so that the new
                // one never leads at an epoch the old one led at — its
                // log may lack what the old one wrote last, and clients
                // must see a new epoch. It leads again through an election
                // (below, if it is a partition's only in-sync replica) or
                // the preferred-leader rebalance once it has caught up.
                let restart = matches!(command, Command::RegisterNode(_));
                if let Some(old) = self
                    .nodes
                    .get_mut(&info.id)
                    .filter(|n| restart && !n.fenced)
                {
                    old.fenced = true;
                    self.move_leadership_off(info.id);
                }
                self.nodes.insert(
                    info.id,
                    NodeState {
                        info: info.clone(),
                        broker_epoch: epoch,
                        fenced: false,
                    },
                );
                outcome.broker_epoch = epoch;
                self.elect_leaderless(info.id);
                Ok(())
            }
            Command::FenceNode { id, epoch } => {
                let node = self
                    .nodes
                    .get_mut(id)
                    .ok_or_else(|| refuse(Unknown, format!("unknown node {id}")))?;
                if node.broker_epoch != *epoch {
                    return Err(refuse(
                        Conflict,
                        format!(
                            "node {id} is at epoch {}, not {epoch}: it registered again",
                            node.broker_epoch
                        ),
                    ));
                }
                if !node.fenced {
                    node.fenced = true;
                    node.broker_epoch += 1;
                }
                self.move_leadership_off(*id);
                Ok(())
            }
            Command::AlterPartition {
                topic,
                partition,
                leader,
                leader_epoch,
                from,
                isr,
            } => {
                let fenced: Vec<u64> = isr.iter().copied().filter(|n| !self.is_live(*n)).collect();
                let p = self.partition_mut(topic, *partition)?;
                if p.leader != Some(*leader) || p.leader_epoch != *leader_epoch {
                    return Err(refuse(
                        Conflict,
                        format!(
                            "{topic}-{partition} is led by {:?} at epoch {}, not by {leader} at {leader_epoch}",
                            p.leader, p.leader_epoch
                        ),
                    ));
                }
                let mut was = from.clone();
                was.sort_unstable();
                let mut now = p.isr.clone();
                now.sort_unstable();
                if was != now {
                    return Err(refuse(
                        Conflict,
                        format!(
                            "the ISR of {topic}-{partition} is {:?} now, not {from:?}",
                            p.isr
                        ),
                    ));
                }
                if !fenced.is_empty() {
                    return Err(refuse(
                        Invalid,
                        format!("nodes {fenced:?} are fenced: not added to the ISR of {topic}-{partition}"),
                    ));
                }
                if !isr.contains(leader)
                    || isr.iter().any(|n| !p.replicas.iter().any(|r| r.node == *n))
                {
                    return Err(refuse(
                        Invalid,
                        format!("ISR {isr:?} of {topic}-{partition} must hold its leader and only replicas"),
                    ));
                }
                let mut isr = isr.clone();
                isr.sort_unstable();
                isr.dedup();
                p.isr = isr;
                self.finish_reassignment(topic, *partition);
                Ok(())
            }
            Command::ElectPreferredLeader { topic, partition } => {
                let live = self.live_nodes();
                let p = self.partition_mut(topic, *partition)?;
                let Some(preferred) = p.replicas.first().map(|r| r.node) else {
                    return Err(refuse(
                        Invalid,
                        format!("{topic}-{partition} has no replica"),
                    ));
                };
                if p.leader == Some(preferred) {
                    return Ok(());
                }
                if !live.contains(&preferred) || !p.isr.contains(&preferred) {
                    return Err(refuse(
                        Conflict,
                        format!(
                            "the preferred replica of {topic}-{partition}, node {preferred}, is not a live member of the ISR {:?}",
                            p.isr
                        ),
                    ));
                }
                p.leader = Some(preferred);
                p.leader_epoch += 1;
                Ok(())
            }
            Command::ReassignPartition {
                topic,
                partition,
                from,
                to,
            } => {
                self.check_reassignment(topic, *partition, from, to)?;
                let p = self.partition_mut(topic, *partition)?;
                let mut replicas = to.clone();
                replicas.extend(
                    p.replicas.iter().filter(|r| {
                        p.isr.contains(&r.node) && !to.iter().any(|t| t.node == r.node)
                    }),
                );
                p.replicas = replicas;
                // Done at once if every node of `to` is in sync already.
                p.target = to.clone();
                self.finish_reassignment(topic, *partition);
                Ok(())
            }
            Command::CreateTopic {
                name,
                id,
                configs,
                placement,
            } => {
                if self.topics.contains_key(name) {
                    return Err(refuse(Exists, format!("topic `{name}` already exists")));
                }
                if placement.is_empty() {
                    return Err(refuse(
                        Invalid,
                        format!("topic `{name}` needs at least one partition"),
                    ));
                }
                let partitions = self.new_partitions(name, placement)?;
                self.topics.insert(
                    name.clone(),
                    TopicState {
                        id: *id,
                        configs: configs.clone(),
                        partitions,
                    },
                );
                Ok(())
            }
            Command::DeleteTopic { name } => match self.topics.remove(name) {
                Some(t) => {
                    self.remote.topic_deleted(t.id);
                    Ok(())
                }
                None => Err(refuse(Unknown, format!("unknown topic `{name}`"))),
            },
            Command::AlterConfigs { name, from, to } => {
                let topic = self
                    .topics
                    .get_mut(name)
                    .ok_or_else(|| refuse(Unknown, format!("unknown topic `{name}`")))?;
                if &topic.configs != from {
                    return Err(refuse(
                        Conflict,
                        format!("the configs of `{name}` changed meanwhile"),
                    ));
                }
                topic.configs = to.clone();
                Ok(())
            }
            Command::AllocateProducerIds { at_least, count } => {
                if *count <= 0 || *at_least < 0 {
                    return Err(refuse(Invalid, "a producer-id block needs a positive size"));
                }
                let start = self.next_producer_id.max(*at_least);
                self.next_producer_id = start
                    .checked_add(*count)
                    .ok_or_else(|| refuse(Invalid, "producer ids exhausted"))?;
                outcome.block_start = start;
                Ok(())
            }
            Command::AddPartitions {
                name,
                from,
                placement,
            } => {
                let count = self
                    .topics
                    .get(name)
                    .ok_or_else(|| refuse(Unknown, format!("unknown topic `{name}`")))?
                    .partitions
                    .len();
                if count != *from as usize {
                    return Err(refuse(
                        Conflict,
                        format!("`{name}` has {count} partitions now, not {from}"),
                    ));
                }
                let added = self.new_partitions(name, placement)?;
                self.topics
                    .get_mut(name)
                    .expect("checked above")
                    .partitions
                    .extend(added);
                Ok(())
            }
            Command::AlterScramCredentials {
                deletions,
                upsertions,
            } => {
                self.security.alter_scram(deletions, upsertions);
                Ok(())
            }
            Command::CreateAcls { acls } => {
                self.security.create_acls(acls);
                Ok(())
            }
            Command::DeleteAcls { acls } => {
                self.security.delete_acls(acls);
                Ok(())
            }
            Command::AlterClientQuotas { changes } => {
                self.security.alter_quotas(changes);
                Ok(())
            }
            Command::RemoteCopyStarted(copy) => {
                let id =
                    self.leading(&copy.topic, copy.partition, copy.leader, copy.leader_epoch)?;
                self.remote
                    .copy_started(id, copy)
                    .map_err(|m| refuse(Conflict, m))
            }
            Command::RemoteCopyFinished {
                topic,
                partition,
                leader,
                leader_epoch,
                id,
            } => {
                let topic_id = self.leading(topic, *partition, *leader, *leader_epoch)?;
                self.remote
                    .copy_finished(topic_id, *partition, *id)
                    .map_err(|m| refuse(Conflict, m))
            }
            Command::RemoteDeleteStarted {
                topic_id,
                partition,
                ids,
            } => self
                .remote
                .delete_started(*topic_id, *partition, ids)
                .map_err(|m| refuse(Conflict, m)),
            Command::RemoteDeleteFinished {
                topic_id,
                partition,
                ids,
            } => {
                self.remote.delete_finished(*topic_id, *partition, ids);
                Ok(())
            }
            Command::RemoteLogStart {
                topic,
                partition,
                leader,
                leader_epoch,
                offset,
            } => {
                let id = self.leading(topic, *partition, *leader, *leader_epoch)?;
                self.remote.raise_log_start(id, topic, *partition, *offset);
                Ok(())
            }
        }
    }

    /// The id of `topic` if `leader` leads its `partition` at
    /// `leader_epoch` (a deposed leader's proposal is refused).
    fn leading(
        &self,
        topic: &str,
        partition: u32,
        leader: u64,
        leader_epoch: u32,
    ) -> Result<[u8; 16], Refusal> {
        let t = self
            .topics
            .get(topic)
            .ok_or_else(|| refuse(RefusalKind::Unknown, format!("unknown topic `{topic}`")))?;
        let p = t.partitions.get(partition as usize).ok_or_else(|| {
            refuse(
                RefusalKind::Unknown,
                format!("`{topic}` has no partition {partition}"),
            )
        })?;
        if p.leader != Some(leader) || p.leader_epoch != leader_epoch {
            return Err(refuse(
                RefusalKind::Conflict,
                format!(
                    "{topic}-{partition} is led by {:?} at epoch {}, not by {leader} at {leader_epoch}",
                    p.leader, p.leader_epoch
                ),
            ));
        }
        Ok(t.id)
    }

    /// Checks a placement and makes its partitions (led by their first
    /// live replica).
    fn new_partitions(
        &self,
        name: &str,
        placement: &[Vec<Replica>],
    ) -> Result<Vec<PartitionState>, Refusal> {
        use RefusalKind::Invalid;
        for replicas in placement {
            if replicas.is_empty() {
                return Err(refuse(
                    Invalid,
                    format!("a partition of `{name}` has no replica"),
                ));
            }
            for r in replicas {
                self.node_of(r)?;
            }
        }
        Ok(placement
            .iter()
            .map(|replicas| {
                let isr: Vec<u64> = replicas.iter().map(|r| r.node).collect();
                let leader = isr.iter().copied().find(|n| self.is_live(*n));
                PartitionState {
                    replicas: replicas.clone(),
                    leader,
                    leader_epoch: 0,
                    isr,
                    target: Vec::new(),
                }
            })
            .collect())
    }

    /// A checksum of the whole state (crc32c of its encoding): nodes at
    /// the same version must agree on it.
    pub fn digest(&self) -> u32 {
        crc32c::crc32c(&crate::wire::encode(self))
    }

    /// A partition, or `Unknown`.
    fn partition_mut(
        &mut self,
        topic: &str,
        partition: u32,
    ) -> Result<&mut PartitionState, Refusal> {
        self.topics
            .get_mut(topic)
            .and_then(|t| t.partitions.get_mut(partition as usize))
            .ok_or_else(|| {
                refuse(
                    RefusalKind::Unknown,
                    format!("unknown partition {topic}-{partition}"),
                )
            })
    }

    /// The ids of the registered nodes not fenced.
    fn live_nodes(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| !n.fenced)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether node `id` is registered and not fenced.
    pub fn is_live(&self, id: u64) -> bool {
        self.nodes.get(&id).is_some_and(|n| !n.fenced)
    }

    /// A fenced node leaves every ISR it is in (unless it is the last
    /// member: the last ISR is what a safe election waits for), and the
    /// partitions it led get another live ISR member as leader — with
    /// `unclean.leader.election.enable=true`, any live replica if no ISR
    /// member is live — or none.
    ///
    /// Of the eligible replicas, the one leading the fewest partitions of
    /// the topic, then of the cluster, the first in assignment order among
    /// equals: leadership stays spread over any sequence of failovers,
    /// without waiting for the preferred-leader rebalance. (Kafka takes
    /// the first in assignment order, which spreads one failover but piles
    /// up over several; the lowest id piled every partition of a lost node
    /// onto one survivor.)
    fn move_leadership_off(&mut self, id: u64) {
        let live = self.live_nodes();
        let mut overall = leaders_count(self.topics.values().flat_map(|t| &t.partitions));
        for topic in self.topics.values_mut() {
            let unclean = topic
                .configs
                .get("unclean.leader.election.enable")
                .is_some_and(|v| v == "true");
            let mut in_topic = leaders_count(&topic.partitions);
            for p in &mut topic.partitions {
                if p.isr.len() > 1 {
                    p.isr.retain(|n| *n != id);
                }
                if p.leader == Some(id) {
                    let pick = |eligible: &dyn Fn(u64) -> bool| {
                        p.replicas
                            .iter()
                            .enumerate()
                            .filter(|(_, r)| r.node != id && eligible(r.node))
                            .min_by_key(|(i, r)| {
                                let count =
                                    |m: &HashMap<u64, usize>| m.get(&r.node).copied().unwrap_or(0);
                                (count(&in_topic), count(&overall), *i)
                            })
                            .map(|(_, r)| r.node)
                    };
                    let mut leader = pick(&|n| p.isr.contains(&n) && live.contains(&n));
                    if leader.is_none() && unclean {
                        leader = pick(&|n| live.contains(&n));
                        if let Some(l) = leader {
                            p.isr = vec![l];
                        }
                    }
                    for m in [&mut in_topic, &mut overall] {
                        if let Some(c) = m.get_mut(&id) {
                            *c = c.saturating_sub(1);
                        }
                        if let Some(l) = leader {
                            *m.entry(l).or_default() += 1;
                        }
                    }
                    p.leader = leader;
                    p.leader_epoch += 1;
                }
            }
        }
    }

    /// The node a replica is placed on: refused if the node is not in the
    /// cluster or has no such core.
    fn node_of(&self, r: &Replica) -> Result<&NodeState, Refusal> {
        let node = self.nodes.get(&r.node).ok_or_else(|| {
            refuse(
                RefusalKind::Invalid,
                format!("replica on node {}, which is not in the cluster", r.node),
            )
        })?;
        if r.core >= node.info.cores {
            return Err(refuse(
                RefusalKind::Invalid,
                format!(
                    "replica on core {} of node {}, which has {} cores",
                    r.core, r.node, node.info.cores
                ),
            ));
        }
        Ok(node)
    }

    /// Refuses a reassignment that cannot be made: an unknown partition,
    /// replicas that changed since `from`, or a target with no replica,
    /// a node twice, an unknown or fenced new node, a core the node does
    /// not have, or a replica moved between cores of its node.
    fn check_reassignment(
        &self,
        topic: &str,
        partition: u32,
        from: &[Replica],
        to: &[Replica],
    ) -> Result<(), Refusal> {
        use RefusalKind::*;
        let name = format!("{topic}-{partition}");
        let p = self
            .topics
            .get(topic)
            .and_then(|t| t.partitions.get(partition as usize))
            .ok_or_else(|| refuse(Unknown, format!("unknown partition {name}")))?;
        if p.replicas != from {
            return Err(refuse(
                Conflict,
                format!("the replicas of {name} are {:?} now", p.replicas),
            ));
        }
        if to.is_empty() {
            return Err(refuse(
                Invalid,
                format!("{name} needs at least one replica"),
            ));
        }
        for (i, r) in to.iter().enumerate() {
            if to[..i].iter().any(|o| o.node == r.node) {
                return Err(refuse(
                    Invalid,
                    format!("node {} named twice for {name}", r.node),
                ));
            }
            let node = self.node_of(r)?;
            match p.replicas.iter().find(|o| o.node == r.node) {
                Some(o) if o.core != r.core => {
                    return Err(refuse(
                        Invalid,
                        format!(
                            "the replica of {name} on node {} is on core {}: moving a replica between the cores of one node is not supported",
                            r.node, o.core
                        ),
                    ))
                }
                Some(_) => {}
                None if node.fenced => {
                    return Err(refuse(
                        Invalid,
                        format!("node {} is fenced (down): it cannot take a new replica of {name}", r.node),
                    ))
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Completes a partition's reassignment once every target node is in
    /// the ISR: the replicas become the target, the others leave the ISR,
    /// and a leader that left hands over to the first live in-sync target
    /// replica at a new epoch.
    fn finish_reassignment(&mut self, topic: &str, partition: u32) {
        let live = self.live_nodes();
        let Some(p) = self
            .topics
            .get_mut(topic)
            .and_then(|t| t.partitions.get_mut(partition as usize))
        else {
            return;
        };
        if p.target.is_empty() || !p.target.iter().all(|r| p.isr.contains(&r.node)) {
            return;
        }
        p.replicas = std::mem::take(&mut p.target);
        let replicas = &p.replicas;
        p.isr.retain(|n| replicas.iter().any(|r| r.node == *n));
        if p.leader.is_some_and(|l| !p.isr.contains(&l)) {
            p.leader = p
                .replicas
                .iter()
                .map(|r| r.node)
                .find(|n| p.isr.contains(n) && live.contains(n));
            p.leader_epoch += 1;
        }
    }

    fn elect_leaderless(&mut self, id: u64) {
        for topic in self.topics.values_mut() {
            for p in &mut topic.partitions {
                if p.leader.is_none() && p.isr.contains(&id) {
                    p.leader = Some(id);
                    p.leader_epoch += 1;
                }
            }
        }
    }
}

/// The partitions whose preferred replica (their first) is live and in
/// the ISR but does not lead: what a preferred leader election moves.
pub fn preferred_not_leading(state: &ClusterState) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for (name, t) in &state.topics {
        for (i, p) in t.partitions.iter().enumerate() {
            let Some(preferred) = p.replicas.first().map(|r| r.node) else {
                continue;
            };
            if p.leader != Some(preferred) && p.isr.contains(&preferred) && state.is_live(preferred)
            {
                out.push((name.clone(), i as u32));
            }
        }
    }
    out
}

/// Why a placement is impossible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// More replicas asked for than live nodes.
    #[error("replication factor {rf} is larger than the {live} live node(s)")]
    NotEnoughNodes {
        /// Asked.
        rf: u32,
        /// Live nodes.
        live: usize,
    },
    /// Zero partitions or replicas.
    #[error("{0}")]
    Invalid(String),
}

/// Chooses replicas for `partitions` new partitions with `rf` replicas
/// each, over the live nodes of `state`.
///
/// Nodes are ordered rack by rack in turn (a, b, c, a, b, c, …) so the
/// replicas of one partition land on distinct racks when there are enough;
/// partition `p`'s replicas are the `rf` nodes from position
/// `(start + p) % n`, so leaders (the first replica) rotate over all
/// nodes. `start` is the number of partitions the cluster already has, so
/// successive topics do not all lead from the first node. On a node, each
/// replica takes the core with the fewest replicas so far (existing topics
/// counted), lowest core first.
pub fn place(
    state: &ClusterState,
    partitions: u32,
    rf: u32,
) -> Result<Vec<Vec<Replica>>, PlacementError> {
    if partitions == 0 || rf == 0 {
        return Err(PlacementError::Invalid(
            "partitions and replication factor must be at least 1".into(),
        ));
    }
    let live: Vec<&NodeState> = state.nodes.values().filter(|n| !n.fenced).collect();
    if (rf as usize) > live.len() {
        return Err(PlacementError::NotEnoughNodes {
            rf,
            live: live.len(),
        });
    }
    // Rack-interleaved order.
    let mut racks: BTreeMap<&str, Vec<&NodeState>> = BTreeMap::new();
    for n in &live {
        racks.entry(n.info.rack.as_str()).or_default().push(n);
    }
    let mut order = Vec::with_capacity(live.len());
    let mut i = 0;
    while order.len() < live.len() {
        for nodes in racks.values() {
            if let Some(n) = nodes.get(i) {
                order.push(*n);
            }
        }
        i += 1;
    }
    let mut load = replica_load(state, order.iter().map(|n| n.info.id));
    let existing: usize = state.topics.values().map(|t| t.partitions.len()).sum();
    let n = order.len();
    let mut placement = Vec::with_capacity(partitions as usize);
    for p in 0..partitions as usize {
        let mut replicas = Vec::with_capacity(rf as usize);
        // The followers, a window after the leader in the rack-interleaved
        // order (distinct racks), in reverse every other time round the
        // nodes: the partitions a node leads then name different nodes
        // next, and a failover shares them out (as Kafka's replica shift
        // does) instead of handing them all to one node.
        let round = (existing + p) / n;
        let follower = |r: usize| match r {
            0 => 0,
            r if round % 2 == 1 => rf as usize - r,
            r => r,
        };
        for r in 0..rf as usize {
            let node = order[(existing + p + follower(r)) % n].info.id;
            let cores = load
                .get_mut(&node)
                .expect("every live node has a load entry");
            let core = least_loaded(cores);
            cores[core as usize] += 1;
            replicas.push(Replica { node, core });
        }
        placement.push(replicas);
    }
    Ok(placement)
}

/// Replicas per core of each of `nodes` (registered ones), over every
/// topic of `state`.
fn replica_load(state: &ClusterState, nodes: impl Iterator<Item = u64>) -> BTreeMap<u64, Vec<u32>> {
    let mut load: BTreeMap<u64, Vec<u32>> = nodes
        .filter_map(|id| {
            let cores = state.nodes.get(&id)?.info.cores.max(1);
            Some((id, vec![0; cores as usize]))
        })
        .collect();
    for p in state.topics.values().flat_map(|t| &t.partitions) {
        for r in &p.replicas {
            if let Some(c) = load
                .get_mut(&r.node)
                .and_then(|cores| cores.get_mut(r.core as usize))
            {
                *c += 1;
            }
        }
    }
    load
}

/// How many of `partitions` each node leads.
fn leaders_count<'a>(
    partitions: impl IntoIterator<Item = &'a PartitionState>,
) -> HashMap<u64, usize> {
    let mut m = HashMap::new();
    for l in partitions.into_iter().filter_map(|p| p.leader) {
        *m.entry(l).or_default() += 1;
    }
    m
}

/// The core with the fewest replicas, lowest first.
fn least_loaded(cores: &[u32]) -> u32 {
    cores
        .iter()
        .enumerate()
        .min_by_key(|(c, count)| (**count, *c))
        .map_or(0, |(c, _)| c as u32)
}

/// The core a new replica on node `node` takes: its core with the fewest
/// replicas (0 for a node not registered; the command is refused then).
pub fn core_for_new_replica(state: &ClusterState, node: u64) -> u32 {
    replica_load(state, std::iter::once(node))
        .get(&node)
        .map_or(0, |cores| least_loaded(cores))
}

#[cfg(test)]
mod listener_tests {
    use super::*;

    fn l(name: Option<&str>, addr: &str, ports: &[u16]) -> AdvertisedListener {
        AdvertisedListener {
            name: name.map(String::from),
            addr: addr.into(),
            ports: ports.to_vec(),
        }
    }

    #[test]
    fn one_listener_is_stored_bare_as_before() {
        let (a, p) = join_listeners(&[l(Some("PLAINTEXT"), "h:9092", &[9500, 9501])]);
        assert_eq!((a.as_str(), p.as_slice()), ("h:9092", &[9500, 9501][..]));
        let back = pick_listener(&a, &p, "SASL_SSL").unwrap();
        assert_eq!(back, l(None, "h:9092", &[9500, 9501]));
        assert_eq!(pick_listener("", &[], "PLAINTEXT"), None);
    }

    #[test]
    fn several_listeners_round_trip_and_are_picked_by_name() {
        let list = [
            l(Some("PLAINTEXT"), "127.0.0.1:9092", &[9500, 9501]),
            l(Some("SASL_SSL"), "[::1]:9093", &[9502, 9503]),
        ];
        let (a, p) = join_listeners(&list);
        assert_eq!(a, "PLAINTEXT://127.0.0.1:9092,SASL_SSL://[::1]:9093");
        assert_eq!(split_listeners(&a, &p), list);
        assert_eq!(pick_listener(&a, &p, "sasl_ssl").unwrap(), list[1]);
        // No listener of that name: the primary.
        assert_eq!(pick_listener(&a, &p, "SSL").unwrap(), list[0]);
        // Without per-core ports on one of them: none for any.
        let (a, p) = join_listeners(&[list[0].clone(), l(Some("SSL"), "h:1", &[])]);
        assert!(p.is_empty());
        assert!(split_listeners(&a, &p).iter().all(|l| l.ports.is_empty()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64, rack: &str, cores: u32) -> Command {
        Command::RegisterNode(NodeInfo {
            id,
            rack: rack.into(),
            cores,
            ..NodeInfo::default()
        })
    }

    fn cluster(nodes: &[(u64, &str, u32)]) -> ClusterState {
        let mut s = ClusterState::default();
        for (i, (id, rack, cores)) in nodes.iter().enumerate() {
            assert_eq!(s.apply(i as u64 + 1, &node(*id, rack, *cores)).error, None);
        }
        s
    }

    fn create(s: &mut ClusterState, name: &str, partitions: u32, rf: u32) -> Outcome {
        let placement = place(s, partitions, rf).unwrap();
        let v = s.version + 1;
        s.apply(
            v,
            &Command::CreateTopic {
                name: name.into(),
                id: [1; 16],
                configs: BTreeMap::new(),
                placement,
            },
        )
    }

    #[test]
    fn twelve_partitions_spread_four_per_node_and_evenly_over_cores() {
        let mut s = cluster(&[(1, "", 2), (2, "", 2), (3, "", 2)]);
        assert_eq!(create(&mut s, "t", 12, 1).error, None);
        let mut per_node: BTreeMap<u64, usize> = BTreeMap::new();
        let mut per_core: BTreeMap<(u64, u32), usize> = BTreeMap::new();
        for p in &s.topics["t"].partitions {
            let r = p.replicas[0];
            *per_node.entry(r.node).or_default() += 1;
            *per_core.entry((r.node, r.core)).or_default() += 1;
            assert_eq!(p.leader, Some(r.node));
        }
        assert_eq!(
            per_node.values().copied().collect::<Vec<_>>(),
            vec![4, 4, 4]
        );
        assert!(per_core.values().all(|c| *c == 2), "{per_core:?}");
    }

    #[test]
    fn replicas_of_a_partition_go_to_distinct_racks_and_nodes() {
        let mut s = cluster(&[
            (1, "a", 1),
            (2, "a", 1),
            (3, "b", 1),
            (4, "b", 1),
            (5, "c", 1),
            (6, "c", 1),
        ]);
        assert_eq!(create(&mut s, "t", 30, 3).error, None);
        let rack = |id: u64| s.nodes[&id].info.rack.clone();
        let mut leaders: BTreeMap<u64, usize> = BTreeMap::new();
        for p in &s.topics["t"].partitions {
            let mut racks: Vec<String> = p.replicas.iter().map(|r| rack(r.node)).collect();
            racks.sort();
            racks.dedup();
            assert_eq!(racks.len(), 3, "{p:?}");
            *leaders.entry(p.leader.unwrap()).or_default() += 1;
        }
        assert_eq!(leaders.len(), 6);
        assert!(leaders.values().all(|c| *c == 5), "{leaders:?}");
    }

    #[test]
    fn a_replication_factor_above_the_live_nodes_is_refused() {
        let mut s = cluster(&[(1, "", 1), (2, "", 1)]);
        assert_eq!(
            place(&s, 3, 3).unwrap_err().to_string(),
            "replication factor 3 is larger than the 2 live node(s)"
        );
        let epoch = s.nodes[&2].broker_epoch;
        assert_eq!(
            s.apply(10, &Command::FenceNode { id: 2, epoch }).error,
            None
        );
        assert!(matches!(
            place(&s, 1, 2),
            Err(PlacementError::NotEnoughNodes { rf: 2, live: 1 })
        ));
    }

    #[test]
    fn fencing_moves_leaders_to_live_isr_members_and_registration_takes_them_back() {
        let mut s = cluster(&[(1, "", 1), (2, "", 1)]);
        assert_eq!(create(&mut s, "rf2", 2, 2).error, None);
        assert_eq!(create(&mut s, "rf1", 2, 1).error, None);
        let led_by_2 = |s: &ClusterState, t: &str| {
            s.topics[t]
                .partitions
                .iter()
                .filter(|p| p.leader == Some(2))
                .count()
        };
        assert_eq!(led_by_2(&s, "rf2"), 1);
        assert_eq!(led_by_2(&s, "rf1"), 1);
        let epoch = s.nodes[&2].broker_epoch;
        assert_eq!(
            s.apply(20, &Command::FenceNode { id: 2, epoch }).error,
            None
        );
        assert!(s.nodes[&2].fenced);
        assert!(s.topics["rf2"]
            .partitions
            .iter()
            .all(|p| p.leader == Some(1)));
        let rf1: Vec<Option<u64>> = s.topics["rf1"]
            .partitions
            .iter()
            .map(|p| p.leader)
            .collect();
        assert!(rf1.contains(&None) && rf1.contains(&Some(1)), "{rf1:?}");
        // A stale fence (the node registered again since) changes nothing.
        let before = s.clone();
        let out = s.apply(21, &Command::FenceNode { id: 2, epoch });
        assert!(out.error.unwrap().message.contains("registered again"));
        assert_eq!(s.nodes, before.nodes);
        // Rejoining: a new epoch, the leaderless partition comes back.
        let out = s.apply(22, &node(2, "", 1));
        assert_eq!(out.broker_epoch, epoch + 2);
        assert!(s.topics["rf1"]
            .partitions
            .iter()
            .all(|p| p.leader.is_some()));
    }

    #[test]
    fn producer_id_blocks_never_overlap_and_respect_a_floor() {
        let mut s = ClusterState::default();
        let mut alloc = |version: u64, at_least: i64| {
            let c = Command::AllocateProducerIds {
                at_least,
                count: 1000,
            };
            s.apply(version, &c).block_start
        };
        assert_eq!((alloc(1, 0), alloc(2, 0)), (0, 1000));
        // A node with ids from before the cluster asks past them.
        assert_eq!((alloc(3, 5000), alloc(4, 0)), (5000, 6000));
    }

    #[test]
    fn a_duplicate_topic_or_a_replica_on_a_missing_core_is_refused_and_changes_nothing() {
        let mut s = cluster(&[(1, "", 2)]);
        assert_eq!(create(&mut s, "t", 1, 1).error, None);
        let before = s.topics.clone();
        let refused = create(&mut s, "t", 1, 1).error.unwrap();
        assert_eq!(refused.kind, RefusalKind::Exists);
        assert!(refused.message.contains("already exists"));
        let out = s.apply(
            50,
            &Command::CreateTopic {
                name: "u".into(),
                id: [2; 16],
                configs: BTreeMap::new(),
                placement: vec![vec![Replica { node: 1, core: 7 }]],
            },
        );
        assert!(out.error.unwrap().message.contains("has 2 cores"));
        assert_eq!(s.topics, before);
        assert_eq!(s.version, 50);
    }

    fn fence(s: &mut ClusterState, id: u64) -> Outcome {
        let epoch = s.nodes[&id].broker_epoch;
        let v = s.version + 1;
        s.apply(v, &Command::FenceNode { id, epoch })
    }

    fn alter(s: &mut ClusterState, leader: u64, epoch: u32, isr: Vec<u64>) -> Outcome {
        let v = s.version + 1;
        let from = s.topics["t"].partitions[0].isr.clone();
        s.apply(
            v,
            &Command::AlterPartition {
                topic: "t".into(),
                partition: 0,
                leader,
                leader_epoch: epoch,
                from,
                isr,
            },
        )
    }

    #[test]
    fn only_the_current_leader_at_its_epoch_changes_the_isr() {
        let mut s = cluster(&[(1, "", 1), (2, "", 1), (3, "", 1)]);
        assert_eq!(create(&mut s, "t", 1, 3).error, None);
        let p = s.topics["t"].partitions[0].clone();
        let leader = p.leader.unwrap();
        let others: Vec<u64> = p.isr.iter().copied().filter(|n| *n != leader).collect();
        // Shrink to the leader and one follower.
        assert_eq!(
            alter(&mut s, leader, 0, vec![leader, others[0]]).error,
            None
        );
        assert_eq!(s.topics["t"].partitions[0].isr.len(), 2);
        // A stale epoch, another node, a set without the leader or with a
        // non-replica: refused, nothing changes.
        let before = s.topics.clone();
        let stale = alter(&mut s, leader, 7, vec![leader]).error.unwrap();
        assert_eq!(stale.kind, RefusalKind::Conflict);
        let usurper = alter(&mut s, others[0], 0, vec![others[0]]).error.unwrap();
        assert_eq!(usurper.kind, RefusalKind::Conflict);
        let headless = alter(&mut s, leader, 0, vec![others[0]]).error.unwrap();
        assert_eq!(headless.kind, RefusalKind::Invalid);
        let stranger = alter(&mut s, leader, 0, vec![leader, 9]).error.unwrap();
        assert_eq!(stranger.kind, RefusalKind::Invalid);
        // Computed from an ISR that changed meanwhile: a conflict.
        let v = s.version + 1;
        let stale_isr = s.apply(
            v,
            &Command::AlterPartition {
                topic: "t".into(),
                partition: 0,
                leader,
                leader_epoch: 0,
                from: vec![1, 2, 3],
                isr: vec![1, 2, 3],
            },
        );
        assert_eq!(stale_isr.error.unwrap().kind, RefusalKind::Conflict);
        assert_eq!(s.topics, before);
        // A fenced node is not added back.
        assert_eq!(fence(&mut s, others[1]).error, None);
        let before = s.topics.clone();
        let fenced = alter(&mut s, leader, 0, vec![leader, others[0], others[1]])
            .error
            .unwrap();
        assert_eq!(fenced.kind, RefusalKind::Invalid);
        assert_eq!(s.topics, before);
    }

    #[test]
    fn a_restarted_node_leads_nothing_at_an_epoch_it_led_at_before() {
        let mut s = cluster(&[(1, "", 1), (2, "", 1), (3, "", 1)]);
        assert_eq!(create(&mut s, "t", 6, 3).error, None);
        let led: Vec<(usize, u32)> = s.topics["t"]
            .partitions
            .iter()
            .enumerate()
            .filter(|(_, p)| p.leader == Some(1))
            .map(|(i, p)| (i, p.leader_epoch))
            .collect();
        assert!(!led.is_empty());
        // Its addresses change within one run: it keeps leading.
        let v = s.version + 1;
        let o = s.apply(
            v,
            &Command::UpdateNode(NodeInfo {
                id: 1,
                cores: 1,
                ..NodeInfo::default()
            }),
        );
        assert_eq!(o.error, None);
        for (i, e) in &led {
            let p = &s.topics["t"].partitions[*i];
            assert_eq!((p.leader, p.leader_epoch), (Some(1), *e));
        }
        // A new run (a restart before the old one was fenced): the old
        // one's partitions are led by others at a new epoch, and it left
        // their ISRs (it catches up first).
        let v = s.version + 1;
        let o = s.apply(v, &node(1, "", 1));
        assert_eq!(o.error, None);
        assert!(!s.nodes[&1].fenced);
        for (i, e) in &led {
            let p = &s.topics["t"].partitions[*i];
            assert!(p.leader.is_some_and(|l| l != 1), "{p:?}");
            assert!(p.leader_epoch > *e && !p.isr.contains(&1), "{p:?}");
        }
        // The only in-sync replica restarting leads again, at a new epoch.
        let mut one = cluster(&[(1, "", 1)]);
        assert_eq!(create(&mut one, "t", 1, 1).error, None);
        let before = one.topics["t"].partitions[0].leader_epoch;
        let v = one.version + 1;
        assert_eq!(one.apply(v, &node(1, "", 1)).error, None);
        let p = &one.topics["t"].partitions[0];
        assert_eq!(p.leader, Some(1));
        assert!(p.leader_epoch > before);
    }

    #[test]
    fn leadership_stays_spread_over_twenty_kills_of_rotating_nodes() {
        let mut s = cluster(&[(1, "", 1), (2, "", 1), (3, "", 1)]);
        assert_eq!(create(&mut s, "t", 12, 3).error, None);
        for round in 0..20u64 {
            // Killed and restarted: fenced, registered again, then each
            // leader takes it back into the ISR once it has caught up.
            let victim = round % 3 + 1;
            assert_eq!(fence(&mut s, victim).error, None);
            let v = s.version + 1;
            assert_eq!(s.apply(v, &node(victim, "", 1)).error, None);
            for i in 0..12 {
                let p = s.topics["t"].partitions[i].clone();
                let mut isr = p.isr.clone();
                isr.push(victim);
                let v = s.version + 1;
                let o = s.apply(
                    v,
                    &Command::AlterPartition {
                        topic: "t".into(),
                        partition: i as u32,
                        leader: p.leader.unwrap(),
                        leader_epoch: p.leader_epoch,
                        from: p.isr,
                        isr,
                    },
                );
                assert_eq!(o.error, None);
            }
            let led = |s: &ClusterState| -> Vec<usize> {
                (1..=3)
                    .map(|n| {
                        s.topics["t"]
                            .partitions
                            .iter()
                            .filter(|p| p.leader == Some(n))
                            .count()
                    })
                    .collect()
            };
            let after_kill = led(&s);
            assert_eq!(after_kill.iter().sum::<usize>(), 12);
            assert!(
                after_kill.iter().all(|n| *n <= 6),
                "after kill {round} of node {victim}, nodes 1..=3 lead {after_kill:?}"
            );
        }
    }

    #[test]
    fn a_lost_leaders_partitions_are_shared_by_the_survivors() {
        let mut s = cluster(&[(1, "", 1), (2, "", 1), (3, "", 1)]);
        assert_eq!(create(&mut s, "t", 12, 3).error, None);
        let led_by = |s: &ClusterState, n: u64| {
            s.topics["t"]
                .partitions
                .iter()
                .filter(|p| p.leader == Some(n))
                .count()
        };
        let victim = 1;
        let lost: Vec<usize> = s.topics["t"]
            .partitions
            .iter()
            .enumerate()
            .filter(|(_, p)| p.leader == Some(victim))
            .map(|(i, _)| i)
            .collect();
        assert!(!lost.is_empty());
        let before = s.topics.clone();
        assert_eq!(fence(&mut s, victim).error, None);
        for i in lost {
            let replicas: Vec<u64> = before["t"].partitions[i]
                .replicas
                .iter()
                .map(|r| r.node)
                .collect();
            let l = s.topics["t"].partitions[i].leader;
            assert!(
                l.is_some_and(|l| l != victim && replicas.contains(&l)),
                "{replicas:?}"
            );
        }
        // The survivors share them.
        assert!(
            led_by(&s, 2) <= 6 && led_by(&s, 3) <= 6,
            "{:?}",
            s.topics["t"]
        );
        assert_eq!(led_by(&s, 2) + led_by(&s, 3), 12);
    }

    #[test]
    fn fencing_a_leader_elects_from_the_isr_and_drops_it_from_every_isr() {
        let mut s = cluster(&[(1, "", 1), (2, "", 1), (3, "", 1)]);
        assert_eq!(create(&mut s, "t", 1, 3).error, None);
        let leader = s.topics["t"].partitions[0].leader.unwrap();
        let others: Vec<u64> = (1..=3).filter(|n| *n != leader).collect();
        // Only one follower is in sync.
        assert_eq!(
            alter(&mut s, leader, 0, vec![leader, others[0]]).error,
            None
        );
        assert_eq!(fence(&mut s, leader).error, None);
        let p = &s.topics["t"].partitions[0];
        assert_eq!(p.leader, Some(others[0]), "the in-sync follower leads");
        assert_eq!(p.leader_epoch, 1);
        assert_eq!(p.isr, vec![others[0]]);
        // The new leader dies too: the last ISR member stays, nobody
        // leads (the out-of-sync replica is not elected).
        assert_eq!(fence(&mut s, others[0]).error, None);
        let p = &s.topics["t"].partitions[0];
        assert_eq!(p.leader, None);
        assert_eq!(p.isr, vec![others[0]]);
        assert_eq!(p.leader_epoch, 2);
        // It comes back: it leads again.
        let v = s.version + 1;
        assert_eq!(s.apply(v, &node(others[0], "", 1)).error, None);
        assert_eq!(s.topics["t"].partitions[0].leader, Some(others[0]));
    }

    #[test]
    fn unclean_election_takes_any_live_replica_only_when_enabled() {
        let mut s = cluster(&[(1, "", 1), (2, "", 1)]);
        let placement = place(&s, 1, 2).unwrap();
        let v = s.version + 1;
        let configs = BTreeMap::from([(
            "unclean.leader.election.enable".to_string(),
            "true".to_string(),
        )]);
        let create = Command::CreateTopic {
            name: "t".into(),
            id: [2; 16],
            configs,
            placement,
        };
        assert_eq!(s.apply(v, &create).error, None);
        let leader = s.topics["t"].partitions[0].leader.unwrap();
        let other = 3 - leader;
        assert_eq!(alter(&mut s, leader, 0, vec![leader]).error, None);
        assert_eq!(fence(&mut s, leader).error, None);
        let p = &s.topics["t"].partitions[0];
        assert_eq!(
            p.leader,
            Some(other),
            "unclean: the out-of-sync replica leads"
        );
        assert_eq!(p.isr, vec![other]);
    }

    fn reassign(s: &mut ClusterState, to: &[(u64, u32)]) -> Outcome {
        let command = Command::ReassignPartition {
            topic: "t".into(),
            partition: 0,
            from: s.topics["t"].partitions[0].replicas.clone(),
            to: to
                .iter()
                .map(|&(node, core)| Replica { node, core })
                .collect(),
        };
        s.apply(s.version + 1, &command)
    }

    #[test]
    fn a_reassignment_adds_the_new_replicas_and_completes_when_they_are_in_sync() {
        let mut s = cluster(&[(1, "", 2), (2, "", 2), (3, "", 2), (4, "", 2)]);
        let v = s.version + 1;
        let placement = vec![vec![
            Replica { node: 1, core: 0 },
            Replica { node: 2, core: 1 },
            Replica { node: 3, core: 0 },
        ]];
        let create = Command::CreateTopic {
            name: "t".into(),
            id: [3; 16],
            configs: BTreeMap::new(),
            placement,
        };
        assert_eq!(s.apply(v, &create).error, None);
        // Node 1 (the leader) moves to node 4.
        assert_eq!(reassign(&mut s, &[(4, 1), (2, 1), (3, 0)]).error, None);
        let p = &s.topics["t"].partitions[0];
        let nodes: Vec<u64> = p.replicas.iter().map(|r| r.node).collect();
        assert_eq!(nodes, [4, 2, 3, 1], "the target, then the old in-sync ones");
        assert_eq!(p.target.len(), 3);
        assert_eq!(
            (p.leader, p.leader_epoch),
            (Some(1), 0),
            "the leader stays meanwhile"
        );
        // Node 4 caught up: the leader adds it to the ISR, which completes
        // the move; the leader left, so node 4 (first in sync) leads.
        assert_eq!(alter(&mut s, 1, 0, vec![1, 2, 3, 4]).error, None);
        let p = &s.topics["t"].partitions[0];
        let nodes: Vec<u64> = p.replicas.iter().map(|r| r.node).collect();
        assert_eq!(nodes, [4, 2, 3]);
        assert!(p.target.is_empty());
        assert_eq!(p.isr, [2, 3, 4]);
        assert_eq!((p.leader, p.leader_epoch), (Some(4), 1));
    }

    #[test]
    fn a_replica_added_waits_until_it_is_in_sync() {
        let mut s = cluster(&[(1, "", 1), (2, "", 1)]);
        let v = s.version + 1;
        let create = Command::CreateTopic {
            name: "t".into(),
            id: [4; 16],
            configs: BTreeMap::new(),
            placement: vec![vec![Replica { node: 1, core: 0 }]],
        };
        assert_eq!(s.apply(v, &create).error, None);
        assert_eq!(reassign(&mut s, &[(1, 0), (2, 0)]).error, None);
        let p = &s.topics["t"].partitions[0];
        assert_eq!(p.replicas.len(), 2);
        assert_eq!(p.isr, [1]);
        assert_eq!(p.target.len(), 2, "under way until node 2 is in sync");
        assert_eq!(alter(&mut s, 1, 0, vec![1, 2]).error, None);
        assert!(s.topics["t"].partitions[0].target.is_empty());
    }

    #[test]
    fn a_reassignment_is_checked_and_a_new_one_replaces_one_under_way() {
        let mut s = cluster(&[(1, "", 2), (2, "", 2), (3, "", 2), (4, "", 2)]);
        assert_eq!(create(&mut s, "t", 1, 2).error, None);
        let p = s.topics["t"].partitions[0].clone();
        let here: Vec<(u64, u32)> = p.replicas.iter().map(|r| (r.node, r.core)).collect();
        let spare = (1..=4).find(|n| here.iter().all(|(h, _)| h != n)).unwrap();
        let before = s.topics.clone();
        for (to, kind, says) in [
            (vec![], RefusalKind::Invalid, "at least one replica"),
            (
                vec![(spare, 0), (spare, 1)],
                RefusalKind::Invalid,
                "named twice",
            ),
            (vec![(9, 0)], RefusalKind::Invalid, "not in the cluster"),
            (vec![(spare, 5)], RefusalKind::Invalid, "has 2 cores"),
            (
                vec![(here[0].0, 1 - here[0].1)],
                RefusalKind::Invalid,
                "between the cores",
            ),
        ] {
            let e = reassign(&mut s, &to).error.expect("refused");
            assert_eq!(e.kind, kind, "{to:?}: {}", e.message);
            assert!(e.message.contains(says), "{to:?}: {}", e.message);
        }
        // Computed from other replicas: a conflict.
        let v = s.version + 1;
        let stale = s.apply(
            v,
            &Command::ReassignPartition {
                topic: "t".into(),
                partition: 0,
                from: vec![Replica {
                    node: spare,
                    core: 0,
                }],
                to: vec![Replica {
                    node: spare,
                    core: 0,
                }],
            },
        );
        assert_eq!(stale.error.unwrap().kind, RefusalKind::Conflict);
        // A fenced node takes no new replica.
        assert_eq!(fence(&mut s, spare).error, None);
        let e = reassign(&mut s, &[(spare, 0)]).error.unwrap();
        assert!(e.message.contains("fenced"), "{}", e.message);
        assert_eq!(s.topics, before);
        // Registered again: the move starts; a second one replaces it,
        // dropping the replica that had not caught up.
        let v = s.version + 1;
        assert_eq!(s.apply(v, &node(spare, "", 2)).error, None);
        assert_eq!(reassign(&mut s, &[here[0], (spare, 0)]).error, None);
        assert_eq!(s.topics["t"].partitions[0].replicas.len(), 3);
        assert_eq!(reassign(&mut s, &[here[0], here[1]]).error, None);
        let p = &s.topics["t"].partitions[0];
        assert_eq!(p.replicas, before["t"].partitions[0].replicas);
        assert!(p.target.is_empty(), "back where it was: nothing under way");
        // Dropping an out-of-sync replica takes effect at once.
        let leader = p.leader.unwrap();
        assert_eq!(alter(&mut s, leader, 0, vec![leader]).error, None);
        let keep = here.iter().copied().find(|(n, _)| *n == leader).unwrap();
        assert_eq!(reassign(&mut s, &[keep]).error, None);
        let p = &s.topics["t"].partitions[0];
        assert_eq!(p.replicas.len(), 1);
        assert!(p.target.is_empty());
        assert_eq!(p.leader, Some(leader));
    }

    #[test]
    fn the_preferred_replica_leads_again_once_it_is_back_in_sync() {
        let mut s = cluster(&[(1, "", 1), (2, "", 1), (3, "", 1)]);
        assert_eq!(create(&mut s, "t", 1, 3).error, None);
        let preferred = s.topics["t"].partitions[0].replicas[0].node;
        assert_eq!(s.topics["t"].partitions[0].leader, Some(preferred));
        assert!(preferred_not_leading(&s).is_empty());
        let elect = Command::ElectPreferredLeader {
            topic: "t".into(),
            partition: 0,
        };
        // It dies: another leads; while it is down (and out of the ISR)
        // it cannot be elected.
        assert_eq!(fence(&mut s, preferred).error, None);
        let other = s.topics["t"].partitions[0].leader.unwrap();
        assert_ne!(other, preferred);
        let e = s.apply(s.version + 1, &elect).error.unwrap();
        assert_eq!(e.kind, RefusalKind::Conflict, "{}", e.message);
        assert!(preferred_not_leading(&s).is_empty());
        // Back, and back in the ISR: elected at a new epoch.
        assert_eq!(s.apply(s.version + 1, &node(preferred, "", 1)).error, None);
        let isr = vec![1, 2, 3];
        let epoch = s.topics["t"].partitions[0].leader_epoch;
        assert_eq!(alter(&mut s, other, epoch, isr).error, None);
        assert_eq!(preferred_not_leading(&s), [("t".to_string(), 0)]);
        assert_eq!(s.apply(s.version + 1, &elect).error, None);
        let p = &s.topics["t"].partitions[0];
        assert_eq!((p.leader, p.leader_epoch), (Some(preferred), epoch + 1));
        // Again: nothing changes.
        assert_eq!(s.apply(s.version + 1, &elect).error, None);
        assert_eq!(s.topics["t"].partitions[0].leader_epoch, epoch + 1);
    }
}
