//! The cluster view: Metadata, FindCoordinator, DescribeCluster, InitProducerId,
//! and the leader epochs and endpoints other answers carry.

use super::common::*;
use super::errors::*;
use crate::service::acl::{self, Op, Resource};
use crate::service::auth::Session;

/// Which of this node's Kafka listeners a client of `listener` (its
/// security protocol) came in on: 0 the first, k the k-th further one.
fn listener_index(core: &Core, listener: SecurityProtocol) -> usize {
    let more = &core.shared.config.kafka_more;
    more.iter()
        .position(|l| l.protocol == listener)
        .map_or(0, |k| k + 1)
}

/// Host and port the clients of `listener` are told to connect to.
pub(super) fn advertised(core: &Core, listener: SecurityProtocol) -> (String, i32) {
    let config = &core.shared.config;
    let (told, bound) = match listener_index(core, listener) {
        0 => (
            &config.kafka_advertised_listener,
            core.shared.kafka_listen.unwrap_or(config.listen),
        ),
        k => (
            &config.kafka_more[k - 1].advertised,
            config.kafka_more[k - 1].addr,
        ),
    };
    match told {
        Some((h, p)) => (h.clone(), i32::from(*p)),
        None => (bound.ip().to_string(), i32::from(bound.port())),
    }
}

/// The Kafka brokers this node shows clients: with per-core Kafka ports,
/// one per core of every node of the cluster (node id = the core's
/// cluster-wide index, at its own port; a one-node cluster's ids are its
/// core indexes), so that clients send each partition's requests to the
/// node and core that hold it; else one (node 0, the Kafka listener).
///
/// Each address is the one of the listener the client came in on
/// (`listener`, its security protocol; a node without one: its first).
pub(super) fn endpoints(
    core: &Core,
    listener: SecurityProtocol,
) -> Option<admin::ClusterEndpoints> {
    core.shared.config.kafka_core_port_base?;
    let (host, _) = advertised(core, listener);
    let ports = match listener_index(core, listener) {
        0 => &core.shared.kafka_core_ports,
        k => &core.shared.kafka_more_core_ports[k - 1],
    };
    let ports = ports
        .iter()
        .map(|p| p.load(std::sync::atomic::Ordering::Acquire))
        .collect();
    let name = listener.name();
    Some(admin::ClusterEndpoints::new(
        core,
        true,
        name,
        (host, ports),
    ))
}

pub(super) fn brokers(core: &Core, listener: SecurityProtocol) -> Vec<(i32, String, i32)> {
    brokers_of(core, listener, endpoints(core, listener).as_ref())
}

/// [`brokers`] from endpoints already built.
pub(super) fn brokers_of(
    core: &Core,
    listener: SecurityProtocol,
    endpoints: Option<&admin::ClusterEndpoints>,
) -> Vec<(i32, String, i32)> {
    match endpoints {
        None => {
            let (host, port) = advertised(core, listener);
            vec![(NODE_ID, host, port)]
        }
        Some(e) => e
            .cores
            .iter()
            .enumerate()
            .map(|(i, (host, port))| (i as i32, host.clone(), i32::from(*port)))
            .collect(),
    }
}

/// A partition's leader epoch as this node's metadata has it (-1 where it
/// has none: a partition it does not know).
pub(super) fn leader_epoch_of(m: &TopicMeta, p: u32) -> i32 {
    m.placement
        .get(p as usize)
        .map_or(-1, |pl| pl.leader_epoch as i32)
}

/// KIP-320: a request's `current_leader_epoch` against the partition's
/// here. Older is FENCED_LEADER_EPOCH (the client's metadata is stale: it
/// refreshes it), newer is UNKNOWN_LEADER_EPOCH (this node's view lags:
/// the client retries). -1, or a partition this node knows no epoch of,
/// is not checked. As in Kafka, checked before leadership.
pub(super) fn check_leader_epoch(
    core: &Core,
    topic: &str,
    p: i32,
    current: i32,
) -> Result<(), i16> {
    if current < 0 || p < 0 {
        return Ok(());
    }
    let view = core.metadata();
    let ours = view.get(topic).map_or(-1, |m| leader_epoch_of(m, p as u32));
    match current.cmp(&ours) {
        _ if ours < 0 => Ok(()),
        std::cmp::Ordering::Less => Err(E::FencedLeaderEpoch.code()),
        std::cmp::Ordering::Greater => Err(E::UnknownLeaderEpoch.code()),
        std::cmp::Ordering::Equal => Ok(()),
    }
}

/// KIP-951: the leaders this node knows now of partitions a client was
/// refused at (NOT_LEADER_OR_FOLLOWER, a fenced epoch), so that it moves
/// without a Metadata round, and their endpoints for the answer.
pub(super) struct NewLeaders {
    pub(super) endpoints: Option<admin::ClusterEndpoints>,
    pub(super) named: std::collections::BTreeSet<i32>,
    listener: SecurityProtocol,
}

impl NewLeaders {
    pub(super) fn new(core: &Core, listener: SecurityProtocol) -> Self {
        NewLeaders {
            endpoints: endpoints(core, listener),
            named: Default::default(),
            listener,
        }
    }

    /// `(broker, leader epoch)` of `topic`-`p`'s leader, if it has one.
    pub(super) fn leader(&mut self, core: &Core, topic: &str, p: i32) -> Option<(i32, i32)> {
        let view = core.metadata();
        let m = view
            .get(topic)
            .filter(|m| p >= 0 && (p as u32) < m.partitions())?;
        let broker = match &self.endpoints {
            None => NODE_ID,
            Some(e) => e.leader(topic, m, p as u32)? as i32,
        };
        self.named.insert(broker);
        Some((broker, leader_epoch_of(m, p as u32)))
    }

    /// `(broker, host, port)` of every leader named.
    pub(super) fn endpoints(&self, core: &Core) -> Vec<(i32, String, i32)> {
        brokers_of(core, self.listener, self.endpoints.as_ref())
            .into_iter()
            .filter(|(b, _, _)| self.named.contains(b))
            .collect()
    }
}

/// Whether an error code sends a client to look for the leader.
pub(super) fn leader_moved(code: i16) -> bool {
    code == E::NotLeaderOrFollower.code() || code == E::FencedLeaderEpoch.code()
}

/// `(node, host, port)` of the broker that coordinates `group` (the
/// core leading its offsets partition, on whichever node), or the Kafka
/// error to answer: COORDINATOR_NOT_AVAILABLE while that partition has no
/// live leader (clients retry).
pub(super) fn coordinator_broker(
    core: &Core,
    listener: SecurityProtocol,
    topic: &str,
    key: &str,
) -> Result<(i32, String, i32), i16> {
    let Some(endpoints) = endpoints(core, listener) else {
        let (h, p) = advertised(core, listener);
        return Ok((NODE_ID, h, p));
    };
    let (_, i) =
        crate::service::admin::coordinator_in(core, &endpoints, topic, key).map_err(|r| {
            match ErrorCode::from_u16(r.0) {
                ErrorCode::NotCoordinator => E::CoordinatorNotAvailable.code(),
                _ => group_code(r.0),
            }
        })?;
    let (host, port) = endpoints
        .cores
        .get(i as usize)
        .ok_or(E::CoordinatorNotAvailable.code())?;
    Ok((i as i32, host.clone(), i32::from(*port)))
}

pub(super) fn uuid_of(meta: &TopicMeta) -> uuid::Uuid {
    uuid::Uuid::parse_str(&meta.id).unwrap_or_default()
}

/// Partitions as the describe APIs name them: (topic id, name, indexes),
/// topics no longer known left out.
pub(super) fn described_partitions(
    core: &Core,
    tps: Vec<weir_proto::messages::TopicPartitions>,
) -> Vec<(uuid::Uuid, TopicName, Vec<i32>)> {
    let view = core.metadata();
    tps.into_iter()
        .filter_map(|tp| {
            let id = view.get(&tp.topic).map(uuid_of)?;
            let parts = tp.partitions.into_iter().map(|p| p as i32).collect();
            Some((id, super::common::topic_name(tp.topic), parts))
        })
        .collect()
}

/// Topic names by id for one request: the index is built at most once,
/// and only if the request names a topic by id, so a lookup is a hash
/// probe rather than a scan of every topic.
pub(super) struct TopicIds<'a> {
    pub(super) core: &'a Core,
    pub(super) by_id: std::cell::OnceCell<HashMap<uuid::Uuid, String>>,
}

impl<'a> TopicIds<'a> {
    pub(super) fn new(core: &'a Core) -> Self {
        TopicIds {
            core,
            by_id: std::cell::OnceCell::new(),
        }
    }

    /// The topic with this id.
    pub(super) fn name(&self, id: uuid::Uuid) -> Option<String> {
        if id.is_nil() {
            return None;
        }
        self.by_id
            .get_or_init(|| {
                let view = self.core.metadata();
                view.topics()
                    .iter()
                    .map(|(n, m)| (uuid_of(m), n.clone()))
                    .collect()
            })
            .get(&id)
            .cloned()
    }

    /// A request's topic: by name, or by id where the name is empty.
    pub(super) fn resolve(&self, name: &str, id: uuid::Uuid) -> Option<String> {
        if name.is_empty() && !id.is_nil() {
            self.name(id)
        } else {
            Some(name.to_string())
        }
    }
}

pub(super) async fn metadata(
    core: &Rc<Core>,
    r: MetadataRequest,
    version: i16,
    session: &Session,
) -> MetadataResponse {
    // Null (v1+) or empty (v0) asks for every topic.
    let wanted: Option<Vec<(Option<String>, uuid::Uuid)>> = match r.topics {
        None => None,
        Some(t) if t.is_empty() && version == 0 => None,
        Some(t) => Some(
            t.into_iter()
                .map(|t| (t.name.map(|n| n.0.to_string()), t.topic_id))
                .collect(),
        ),
    };
    let ids = TopicIds::new(core);
    let names: Option<Vec<String>> = wanted.as_ref().map(|w| {
        w.iter()
            .filter_map(|(n, id)| match n {
                Some(n) => Some(n.clone()),
                None => ids.name(*id),
            })
            .collect()
    });
    // Topics the principal may not describe: named, they are answered
    // TOPIC_AUTHORIZATION_FAILED (and never auto-created); asked for all,
    // they are left out.
    let describable = |n: &str| acl::allowed(core, session, Op::Describe, Resource::Topic(n));
    let (names, refused): (Option<Vec<String>>, Vec<String>) = match names {
        None => (None, Vec::new()),
        Some(all) => {
            let (ok, no) = all.into_iter().partition(|n| describable(n));
            (Some(ok), no)
        }
    };
    let may_create = acl::allowed(core, session, Op::Create, Resource::Cluster);
    let found = if (r.allow_auto_topic_creation || version < 4) && may_create {
        admin::topics(core, names, true).await
    } else if names.is_none() {
        admin::listed_topics(core, true)
            .into_iter()
            .filter(|n| describable(n))
            .map(|n| {
                let m = core.metadata().get(&n).cloned();
                (n, m)
            })
            .collect()
    } else {
        names
            .unwrap_or_else(|| admin::listed_topics(core, true))
            .into_iter()
            .map(|n| {
                let m = core.metadata().get(&n).cloned();
                (n, m)
            })
            .collect()
    };
    let cluster = endpoints(core, session.protocol);
    let mut topics: Vec<MetadataResponseTopic> = found
        .into_iter()
        .filter(|(n, _)| describable(n))
        .map(|(name, meta)| match meta {
            Some(m) => {
                let leader = |p: u32| match &cluster {
                    None => NODE_ID,
                    Some(e) => e.leader(&name, &m, p).map_or(-1, |i| i as i32),
                };
                MetadataResponseTopic::default()
                    .with_name(Some(topic_name(name.clone())))
                    .with_topic_id(uuid_of(&m))
                    .with_is_internal(crate::metadata::is_internal(&name))
                    .with_partitions(
                        (0..m.partitions())
                            .map(|p| {
                                let ids = |v: Vec<u32>| {
                                    v.into_iter().map(|i| BrokerId(i as i32)).collect()
                                };
                                let (replicas, isr) = match &cluster {
                                    Some(e) if m.placement.len() > p as usize => {
                                        let (r, i) = e.replicas(&m, p);
                                        (ids(r), ids(i))
                                    }
                                    _ => (vec![BrokerId(leader(p))], vec![BrokerId(leader(p))]),
                                };
                                MetadataResponsePartition::default()
                                    .with_partition_index(p as i32)
                                    .with_leader_id(BrokerId(leader(p)))
                                    .with_leader_epoch(leader_epoch_of(&m, p))
                                    .with_replica_nodes(replicas)
                                    .with_isr_nodes(isr)
                            })
                            .collect(),
                    )
            }
            None => MetadataResponseTopic::default()
                .with_error_code(E::UnknownTopicOrPartition.code())
                .with_name(Some(topic_name(name))),
        })
        .collect();
    topics.extend(refused.into_iter().map(|n| {
        MetadataResponseTopic::default()
            .with_error_code(E::TopicAuthorizationFailed.code())
            .with_name(Some(topic_name(n)))
    }));
    // Ids asked for that name no topic.
    if let Some(w) = &wanted {
        for (n, id) in w {
            if n.is_none() && ids.name(*id).is_none() {
                topics.push(
                    MetadataResponseTopic::default()
                        .with_error_code(E::UnknownTopicId.code())
                        .with_topic_id(*id),
                );
            }
        }
    }
    MetadataResponse::default()
        .with_brokers(
            brokers_of(core, session.protocol, cluster.as_ref())
                .into_iter()
                .map(|(node, host, port)| {
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(node))
                        .with_host(s(host))
                        .with_port(port)
                })
                .collect(),
        )
        .with_cluster_id(Some(s(CLUSTER_ID)))
        .with_controller_id(BrokerId(NODE_ID))
        .with_topics(topics)
}

pub(super) fn find_coordinator(
    core: &Core,
    listener: SecurityProtocol,
    r: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    // Groups (key type 0) and transactional ids (1). Share groups (2)
    // are not served: INVALID_REQUEST, with the reason.
    let lookup = |key: &str| match r.key_type {
        0 => coordinator_broker(core, listener, OFFSETS_TOPIC, key).map_err(|e| (e, None)),
        1 => coordinator_broker(core, listener, crate::txns::TXN_TOPIC, key).map_err(|e| (e, None)),
        k => Err((
            E::InvalidRequest.code(),
            Some(s(format!("coordinator key type {k} is not served by Weir"))),
        )),
    };
    if version >= 4 {
        let coordinators = r
            .coordinator_keys
            .into_iter()
            .map(|key| {
                let c = Coordinator::default();
                match lookup(key.as_str()) {
                    Ok((node, host, port)) => c
                        .with_node_id(BrokerId(node))
                        .with_host(s(host))
                        .with_port(port),
                    Err((e, m)) => c
                        .with_error_code(e)
                        .with_error_message(m)
                        .with_node_id(BrokerId(-1))
                        .with_port(-1),
                }
                .with_key(key)
            })
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    match lookup(r.key.as_str()) {
        Ok((node, host, port)) => FindCoordinatorResponse::default()
            .with_node_id(BrokerId(node))
            .with_host(s(host))
            .with_port(port),
        Err((e, m)) => FindCoordinatorResponse::default()
            .with_error_code(e)
            .with_error_message(m)
            .with_node_id(BrokerId(-1))
            .with_port(-1),
    }
}

/// InitProducerId of an idempotent producer (a transactional one:
/// `txn::init_transactional`).
pub(super) async fn init_producer_id(core: &Rc<Core>, session: &Session) -> InitProducerIdResponse {
    // Kafka 2.8+: IdempotentWrite on the cluster, or Write on some topic.
    if !acl::may_write_idempotently(core, session) {
        return InitProducerIdResponse::default()
            .with_error_code(E::ClusterAuthorizationFailed.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
    }
    match admin::init_producer_id(core).await {
        Ok(id) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(0),
        Err(e) => InitProducerIdResponse::default()
            .with_error_code(broker_error_code(&e))
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    }
}

pub(super) fn describe_cluster(core: &Core, listener: SecurityProtocol) -> DescribeClusterResponse {
    DescribeClusterResponse::default()
        .with_cluster_id(s(CLUSTER_ID))
        .with_controller_id(BrokerId(NODE_ID))
        .with_brokers(
            brokers(core, listener)
                .into_iter()
                .map(|(node, host, port)| {
                    DescribeClusterBroker::default()
                        .with_broker_id(BrokerId(node))
                        .with_host(s(host))
                        .with_port(port)
                })
                .collect(),
        )
}
