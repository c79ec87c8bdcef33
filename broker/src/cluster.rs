//! The node's place in the cluster: its controller (the Raft metadata
//! quorum member of `weir-replication`, on its own thread), started before
//! the cores; the cluster id and certificates it needs; and the one-time
//! migration of a `topics.toml` registry into the cluster metadata.
//!
//! `weir broker` with no cluster flags is a one-node cluster on the same
//! path: its cluster id is generated and kept in `<data_dir>/cluster.id`,
//! and a CA with this node's certificate is created in
//! `<data_dir>/certs` at the first start.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use weir_replication::meta::Replica;
use weir_replication::tls::{self, NodeTls};
use weir_replication::{Command, Controller, ControllerConfig, ControllerError, NodeInfo};

use crate::metadata::{self, MetadataView, REGISTRY_FILE};
use crate::server::config::{host_port, BrokerConfig, MoreListener};
use crate::server::tls::SecurityProtocol;

/// File of a data directory naming the cluster it belongs to.
pub const CLUSTER_ID_FILE: &str = "cluster.id";
/// How long start-up waits for the controller quorum to register this node.
pub const REGISTER_WAIT: Duration = Duration::from_secs(120);

/// The cluster id: the configured one (which must match the data
/// directory's, if it has one) or the data directory's, or a new one.
fn cluster_id(config: &BrokerConfig) -> anyhow::Result<String> {
    let path = config.data_dir.join(CLUSTER_ID_FILE);
    let stored = match std::fs::read_to_string(&path) {
        Ok(s) => Some(s.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let id = match (&config.cluster.cluster_id, stored) {
        (Some(want), Some(have)) if *want != have => bail!(
            "the data directory {} belongs to cluster `{have}`, not `{want}` (--cluster-id)",
            config.data_dir.display()
        ),
        (_, Some(have)) => return Ok(have),
        (Some(want), None) => want.clone(),
        (None, None) => format!("weir-{}", &metadata::new_topic_id("cluster")[..18]),
    };
    if id.is_empty() || id.len() > 64 || id.chars().any(|c| c.is_whitespace()) {
        bail!("cluster id `{id}`: use 1 to 64 characters without spaces");
    }
    weir_storage::checkpoint::write_atomic(&config.data_dir, CLUSTER_ID_FILE, id.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(id)
}

/// This node's certificates: from `--certs-dir`, or created in
/// `<data_dir>/certs` for a one-node cluster.
pub(crate) fn node_tls(config: &BrokerConfig) -> anyhow::Result<NodeTls> {
    let id = config.cluster.node_id;
    let dir = match &config.cluster.certs_dir {
        Some(d) => d.clone(),
        None => {
            let dir = config.data_dir.join("certs");
            let (ca, _) = tls::ca_paths(&dir);
            if !ca.exists() {
                tls::generate_cluster(&dir, 0).context("creating the one-node cluster's CA")?;
            }
            if !tls::node_paths(&dir, id).0.exists() {
                tls::add_node(&dir, id).context("creating this node's certificate")?;
            }
            dir
        }
    };
    NodeTls::load(&dir, id).with_context(|| {
        format!(
            "loading node {id}'s certificates from {} (make them with `weir cluster certs`)",
            dir.display()
        )
    })
}

/// The addresses a node registers for one family of client listeners
/// (the first listener's protocol and advertised address, the others):
/// `host:port` for one, `NAME://host:port,…` for several (see
/// [`weir_replication::AdvertisedListener`]; the per-core ports follow
/// once the cores bound them).
fn advertised_family(first: (SecurityProtocol, String), more: &[MoreListener]) -> String {
    let named = |p: SecurityProtocol, addr: String| weir_replication::AdvertisedListener {
        name: Some(p.name().to_string()),
        addr,
        ports: Vec::new(),
    };
    let all: Vec<_> = std::iter::once(named(first.0, first.1))
        .chain(more.iter().map(|l| {
            let addr = match &l.advertised {
                Some((h, p)) => host_port(h, *p),
                None => l.addr.to_string(),
            };
            named(l.protocol, addr)
        }))
        .collect();
    weir_replication::join_listeners(&all).0
}

/// Starts the controller and waits until this node is registered with the
/// quorum (its metadata is then applied up to at least its registration).
pub fn start(
    config: &BrokerConfig,
    native: std::net::SocketAddr,
    kafka: Option<std::net::SocketAddr>,
) -> anyhow::Result<Arc<Controller>> {
    let c = &config.cluster;
    let cluster_id = cluster_id(config)?;
    let tls = node_tls(config)?;
    let mut cfg = ControllerConfig::new(
        c.node_id,
        &cluster_id,
        c.replication_listen,
        config.data_dir.join("raft"),
        tls,
    );
    cfg.voters = if c.voters.is_empty() {
        // A one-node cluster: this node, at its bound address.
        [(c.node_id, String::new())].into()
    } else if c.voters.contains_key(&c.node_id) {
        c.voters.clone()
    } else {
        // Not an initial voter: it joins an existing cluster and waits
        // until a voter adds it (`weir cluster add-voter`).
        tracing::info!(
            node = c.node_id,
            "not among --voters: waiting to be added (weir cluster add-voter {} --replication HOST:PORT)",
            c.node_id
        );
        Default::default()
    };
    cfg.node = NodeInfo {
        rack: c.rack.clone(),
        cores: config.cores as u32,
        native: advertised_family(
            (
                config.listen_protocol,
                c.advertised_listen
                    .clone()
                    .unwrap_or_else(|| native.to_string()),
            ),
            &config.listen_more,
        ),
        kafka: match kafka {
            Some(a) => advertised_family(
                (
                    config.kafka_protocol,
                    match &config.kafka_advertised_listener {
                        Some((host, port)) => host_port(host, *port),
                        None => a.to_string(),
                    },
                ),
                &config.kafka_more,
            ),
            None => String::new(),
        },
        replication: c.replication_advertised.clone().unwrap_or_default(),
        metrics: config.metrics_listen.to_string(),
        ..NodeInfo::default()
    };
    cfg.session_timeout = Duration::from_millis(c.session_timeout_ms);
    cfg.leader_rebalance_interval = (c.leader_rebalance_interval_ms > 0)
        .then(|| Duration::from_millis(c.leader_rebalance_interval_ms));
    cfg.heartbeat_interval =
        (cfg.session_timeout / 6).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let controller = Controller::start(cfg).context("starting the controller")?;
    tracing::info!(
        node = c.node_id,
        cluster = %cluster_id,
        replication = %controller.local_addr(),
        "controller started"
    );
    let voters: Vec<String> = c.voters.iter().map(|(id, a)| format!("{id}@{a}")).collect();
    controller
        .wait_registered(REGISTER_WAIT, Duration::from_secs(5), |waited| {
            tracing::warn!(
                node = c.node_id,
                waited_s = waited.as_secs(),
                voters = %voters.join(","),
                "waiting for the controller quorum to register this node (are a majority of the voters up?)"
            );
        })
        .map_err(|e| match e {
            ControllerError::NoLeader(_) => anyhow::anyhow!(
                "no controller quorum registered this node within {REGISTER_WAIT:?}: start a majority of the voters ({})",
                voters.join(",")
            ),
            e => anyhow::anyhow!("registering with the controller: {e}"),
        })?;
    Ok(Arc::new(controller))
}

/// Moves the topics of a `topics.toml` registry (earlier versions) into
/// the cluster metadata, each on this node's core it was on, with its id;
/// then renames the file to `topics.toml.migrated`.
pub fn migrate_registry(controller: &Controller, config: &BrokerConfig) -> anyhow::Result<()> {
    let path = config.data_dir.join(REGISTRY_FILE);
    if !path.exists() {
        return Ok(());
    }
    let (old, _) = MetadataView::load(&config.data_dir, config.cores)?;
    let node = config.cluster.node_id;
    let mut moved = 0;
    for (name, t) in old.topics() {
        if controller.state().topics.contains_key(name) {
            continue;
        }
        let command = Command::CreateTopic {
            name: name.clone(),
            id: metadata::id_bytes(&t.id),
            configs: t.configs.clone(),
            placement: t
                .cores
                .iter()
                .map(|&core| vec![Replica { node, core }])
                .collect(),
        };
        match futures_lite::future::block_on(controller.propose(command)) {
            Ok(_) => moved += 1,
            Err(ControllerError::Refused(r))
                if r.kind == weir_replication::meta::RefusalKind::Exists => {}
            Err(e) => bail!(
                "migrating topic `{name}` from {} into the cluster metadata: {e}",
                path.display()
            ),
        }
    }
    let to = config.data_dir.join(format!("{REGISTRY_FILE}.migrated"));
    std::fs::rename(&path, &to)
        .with_context(|| format!("renaming {} to {}", path.display(), to.display()))?;
    std::fs::File::open(&config.data_dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", config.data_dir.display()))?;
    tracing::info!(topics = moved, from = %path.display(), "topic registry migrated into the cluster metadata");
    Ok(())
}
