//! The metadata quorum over real QUIC on loopback: three controllers,
//! each with its own port and directory, in this process (the process-level
//! cluster tests, with SIGKILL, live with the broker).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_replication::link::Links;
use weir_replication::meta::{place, ClusterState};
use weir_replication::tls::{self, NodeTls};
use weir_replication::wire::{Request, Response};
use weir_replication::{Command, Controller, ControllerConfig, ControllerError, NodeInfo};

const CLUSTER: &str = "test-cluster";

/// A loopback UDP address for a node, below the ephemeral range (a
/// port-0 socket of another node cannot take it before the node binds it).
fn free_udp() -> SocketAddr {
    weir_testkit::ports::addr(weir_testkit::ports::Proto::Udp)
}

struct Cluster {
    certs: PathBuf,
    dirs: BTreeMap<u64, PathBuf>,
    addrs: BTreeMap<u64, SocketAddr>,
    nodes: BTreeMap<u64, Controller>,
    _tmp: tempfile::TempDir,
}

fn config(
    certs: &Path,
    dir: &Path,
    id: u64,
    addr: SocketAddr,
    voters: &BTreeMap<u64, SocketAddr>,
) -> ControllerConfig {
    let mut cfg = ControllerConfig::new(
        id,
        CLUSTER,
        addr,
        dir.to_path_buf(),
        NodeTls::load(certs, id).unwrap(),
    );
    cfg.voters = voters.iter().map(|(id, a)| (*id, a.to_string())).collect();
    cfg.node = NodeInfo {
        cores: 2,
        native: format!("127.0.0.1:{}", 9000 + id),
        ..NodeInfo::default()
    };
    cfg.heartbeat_interval = Duration::from_millis(100);
    cfg.session_timeout = Duration::from_millis(1_000);
    cfg.election_timeout = Duration::from_millis(200);
    cfg
}

impl Cluster {
    fn start(n: u64) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let tmp = tempfile::tempdir().unwrap();
        let certs = tmp.path().join("certs");
        tls::generate_cluster(&certs, n).unwrap();
        let addrs: BTreeMap<u64, SocketAddr> = (1..=n).map(|id| (id, free_udp())).collect();
        let dirs: BTreeMap<u64, PathBuf> = (1..=n)
            .map(|id| (id, tmp.path().join(format!("node-{id}"))))
            .collect();
        let mut cluster = Cluster {
            certs,
            dirs,
            addrs,
            nodes: BTreeMap::new(),
            _tmp: tmp,
        };
        for id in 1..=n {
            cluster.restart(id);
        }
        cluster
    }

    fn restart(&mut self, id: u64) {
        let cfg = config(
            &self.certs,
            &self.dirs[&id],
            id,
            self.addrs[&id],
            &self.addrs,
        );
        self.nodes.insert(id, Controller::start(cfg).unwrap());
    }

    fn stop(&mut self, id: u64) {
        self.nodes.remove(&id).unwrap().stop();
    }

    /// Waits until every running node's state satisfies `check`.
    fn wait_all(&self, what: &str, within: Duration, check: impl Fn(&ClusterState) -> bool) {
        let deadline = Instant::now() + within;
        for (id, node) in &self.nodes {
            let mut watch = node.watch();
            loop {
                if check(&watch.borrow_and_update()) {
                    break;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                assert!(
                    !left.is_zero(),
                    "node {id}: {what} not reached within {within:?}; state {:?}",
                    node.state()
                );
                block(async {
                    let _ = tokio::time::timeout(left, watch.changed()).await;
                });
            }
        }
    }

    fn leader(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            let leaders: Vec<Option<u64>> = self.nodes.values().map(|n| n.leader()).collect();
            if let Some(Some(l)) = leaders.first() {
                if leaders.iter().all(|x| *x == Some(*l)) && self.nodes.contains_key(l) {
                    return *l;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader within {within:?}: {leaders:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn any(&self) -> &Controller {
        self.nodes.values().next().unwrap()
    }
}

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn create_topic(node: &Controller, name: &str, partitions: u32) -> Result<u64, ControllerError> {
    let placement =
        place(&node.state(), partitions, 1).map_err(|e| ControllerError::Other(e.to_string()))?;
    block(node.propose(Command::CreateTopic {
        name: name.into(),
        id: *uuid_like(name),
        configs: BTreeMap::new(),
        placement,
    }))
    .map(|o| o.version)
}

fn uuid_like(name: &str) -> Box<[u8; 16]> {
    let mut id = [0u8; 16];
    for (i, b) in name.bytes().enumerate() {
        id[i % 16] ^= b;
    }
    Box::new(id)
}

fn all_registered(n: usize) -> impl Fn(&ClusterState) -> bool {
    move |s| s.cluster_id == CLUSTER && s.nodes.len() == n && s.nodes.values().all(|x| !x.fenced)
}

#[test]
fn three_nodes_agree_on_metadata_and_survive_the_leader_stopping() {
    let mut c = Cluster::start(3);
    c.wait_all(
        "three registered nodes",
        Duration::from_secs(10),
        all_registered(3),
    );
    let v = create_topic(c.any(), "first", 12).unwrap();
    c.wait_all("the topic", Duration::from_secs(5), |s| {
        s.version >= v && s.topics.contains_key("first")
    });
    let spread: BTreeMap<u64, usize> =
        c.any().state().topics["first"]
            .partitions
            .iter()
            .fold(BTreeMap::new(), |mut m, p| {
                *m.entry(p.leader.unwrap()).or_default() += 1;
                m
            });
    assert_eq!(spread.values().copied().collect::<Vec<_>>(), vec![4, 4, 4]);
    // A duplicate is refused and changes nothing.
    let err = create_topic(c.any(), "first", 1).unwrap_err().to_string();
    assert!(err.contains("already exists"), "{err}");

    for round in 0..5 {
        let leader = c.leader(Duration::from_secs(5));
        eprintln!("round {round}: stopping leader {leader}");
        c.stop(leader);
        let stopped = Instant::now();
        let name = format!("after-{round}");
        let v = create_topic(c.any(), &name, 3).unwrap();
        let took = stopped.elapsed();
        eprintln!("round {round}: leader {leader} stopped, change committed after {took:?}");
        assert!(
            took < Duration::from_secs(2),
            "round {round}: a change took {took:?} after the leader stopped"
        );
        c.restart(leader);
        c.wait_all(
            "the restarted node caught up",
            Duration::from_secs(10),
            |s| s.version >= v && s.topics.contains_key(&name),
        );
        // Same applied state everywhere at the same version.
        // (The restarted node's registration moves leadership off its
        // previous run: a change that may land while this looks, so
        // states are compared once every node shows the same version.)
        let deadline = Instant::now() + Duration::from_secs(5);
        let states = loop {
            let states: Vec<Arc<ClusterState>> = c.nodes.values().map(|n| n.state()).collect();
            if states.windows(2).all(|w| w[0].version == w[1].version) {
                break states;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no common version"
            );
            let target = states.iter().map(|s| s.version).max().unwrap();
            c.wait_all("one version", Duration::from_secs(5), |s| {
                s.version >= target
            });
        };
        let topics: Vec<_> = states.iter().map(|s| &s.topics).collect();
        assert!(
            topics.windows(2).all(|w| w[0] == w[1]),
            "round {round}: divergent topics"
        );
    }
}

#[test]
fn a_silent_node_is_fenced_and_rejoins_and_its_partitions_follow() {
    let mut c = Cluster::start(3);
    c.wait_all(
        "three registered nodes",
        Duration::from_secs(10),
        all_registered(3),
    );
    create_topic(c.any(), "t", 6).unwrap();
    let leader = c.leader(Duration::from_secs(5));
    let victim = *c.addrs.keys().find(|id| **id != leader).unwrap();
    c.stop(victim);
    let stopped = Instant::now();
    c.wait_all("the victim fenced", Duration::from_secs(5), |s| {
        s.nodes[&victim].fenced
    });
    assert!(
        stopped.elapsed() < Duration::from_secs(4),
        "fenced after {:?}",
        stopped.elapsed()
    );
    let s = c.any().state();
    assert!(s.topics["t"]
        .partitions
        .iter()
        .all(|p| p.leader != Some(victim)));
    // A replication factor above the live nodes is refused.
    assert!(place(&s, 1, 3)
        .unwrap_err()
        .to_string()
        .contains("larger than the 2 live"));
    let fenced_at = c.any().state().nodes[&victim].broker_epoch;
    c.restart(victim);
    // (Its own replayed state shows it unfenced at its old epoch at
    // first: the new epoch is what shows it registered.)
    c.wait_all("the victim back", Duration::from_secs(10), |s| {
        s.nodes
            .get(&victim)
            .is_some_and(|n| !n.fenced && n.broker_epoch > fenced_at)
            && s.topics
                .get("t")
                .is_some_and(|t| t.partitions.iter().all(|p| p.leader.is_some()))
    });
    // Its registration counts as a heartbeat: it is not fenced again for
    // the session it has not had time to heartbeat in (it was, 1 ms after
    // registering, when only heartbeats refreshed the leader's table). Its
    // broker epoch is the one its one registration gave it (the fenced
    // epoch + 1), for two sessions.
    let mut watch = c.nodes[&leader].watch();
    let until = Instant::now() + Duration::from_millis(2_000);
    loop {
        let s = watch.borrow_and_update().clone();
        let n = &s.nodes[&victim];
        assert!(
            !n.fenced && n.broker_epoch == fenced_at + 1,
            "fenced after registering: epoch {} (fenced at {fenced_at}, fenced now: {})",
            n.broker_epoch,
            n.fenced
        );
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        block(async {
            let _ = tokio::time::timeout(left, watch.changed()).await;
        });
    }
}

#[test]
fn a_node_of_another_ca_or_cluster_is_refused_and_nothing_changes() {
    let c = Cluster::start(3);
    c.wait_all(
        "three registered nodes",
        Duration::from_secs(10),
        all_registered(3),
    );
    let before = c.any().state();
    let other = tempfile::tempdir().unwrap();
    tls::generate_cluster(other.path(), 4).unwrap();
    let target = (1u64, c.addrs[&1].to_string());
    let hello = Request::Propose(Command::RegisterNode(NodeInfo {
        id: 4,
        cores: 1,
        ..NodeInfo::default()
    }));
    // Another CA's certificate: the handshake fails.
    let err = block(async {
        let links = links_with(NodeTls::load(other.path(), 4).unwrap(), CLUSTER);
        links.call(target.0, &target.1, &hello).await.unwrap_err()
    });
    assert!(format!("{err:#}").contains("TLS handshake"), "{err:#}");
    // This CA, another cluster id: refused after the hello.
    tls::add_node(&c.certs, 4).unwrap();
    let err = block(async {
        let links = links_with(NodeTls::load(&c.certs, 4).unwrap(), "another-cluster");
        links.call(target.0, &target.1, &hello).await.unwrap_err()
    });
    assert!(
        format!("{err:#}").contains("is not this cluster's"),
        "{err:#}"
    );
    // Right CA and cluster: accepted (the same call succeeds).
    let answer = block(async {
        let links = links_with(NodeTls::load(&c.certs, 4).unwrap(), CLUSTER);
        links
            .call(
                target.0,
                &target.1,
                &Request::Heartbeat {
                    node_id: 4,
                    epoch: 0,
                },
            )
            .await
            .unwrap()
    });
    assert!(
        matches!(
            answer,
            Response::HeartbeatAck { .. } | Response::NotLeader(_)
        ),
        "{answer:?}"
    );
    let after = c.any().state();
    assert_eq!(
        before.nodes.keys().collect::<Vec<_>>(),
        after.nodes.keys().collect::<Vec<_>>()
    );
    assert_eq!(before.topics, after.topics);
}

fn links_with(tls: NodeTls, cluster: &str) -> Links {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(tls.client_config().unwrap());
    Links::new(endpoint, cluster.to_string(), 4)
}

#[test]
fn a_voter_is_added_and_removed() {
    let mut c = Cluster::start(3);
    c.wait_all(
        "three registered nodes",
        Duration::from_secs(10),
        all_registered(3),
    );
    tls::add_node(&c.certs, 4).unwrap();
    let addr = free_udp();
    let dir = c._tmp.path().join("node-4");
    let cfg = config(&c.certs, &dir, 4, addr, &BTreeMap::new());
    c.addrs.insert(4, addr);
    c.dirs.insert(4, dir);
    c.nodes.insert(4, Controller::start(cfg).unwrap());
    let leader = c.nodes[&1].leader().unwrap();
    block(c.nodes[&leader].add_voter(4, addr.to_string())).unwrap();
    assert_eq!(
        c.nodes[&leader].voters().into_iter().collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    c.wait_all(
        "four registered nodes",
        Duration::from_secs(10),
        all_registered(4),
    );
    let v = create_topic(&c.nodes[&4], "via-new-voter", 2).unwrap();
    c.wait_all("the topic", Duration::from_secs(5), |s| s.version >= v);
    let leader = c.leader(Duration::from_secs(5));
    let gone = if leader == 1 { 2 } else { 1 };
    block(c.nodes[&leader].remove_voter(gone)).unwrap();
    assert!(!c.nodes[&leader].voters().contains(&gone));
    c.stop(gone);
    // Three voters left (of which two suffice): changes still commit.
    create_topic(c.any(), "after-removal", 1).unwrap();
}

#[test]
fn a_single_node_restarts_with_its_metadata_and_leads_at_once() {
    let mut c = Cluster::start(1);
    c.nodes[&1]
        .wait_registered(Duration::from_secs(5), Duration::from_secs(5), |_| {})
        .unwrap();
    create_topic(&c.nodes[&1], "kept", 3).unwrap();
    c.stop(1);
    let restarted = Instant::now();
    c.restart(1);
    c.wait_all("the topic after a restart", Duration::from_secs(5), |s| {
        s.topics.contains_key("kept")
    });
    c.nodes[&1]
        .wait_registered(Duration::from_secs(5), Duration::from_secs(5), |_| {})
        .unwrap();
    create_topic(&c.nodes[&1], "new", 1).unwrap();
    let took = restarted.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "a restarted single node took {took:?} to take a change"
    );
    assert_eq!(c.nodes[&1].state().nodes[&1].broker_epoch, 2);
}
