//! A node's controller: its QUIC endpoint, its member of the Raft metadata
//! quorum, and the liveness protocol, on one dedicated thread.
//!
//! **Why a thread of its own.** The controller's traffic is small (votes,
//! appends of a few metadata commands, heartbeats every few hundred
//! milliseconds) and openraft 0.9 runs on tokio. Putting it on a core's
//! glommio executor would mean a second runtime inside the core's loop or
//! a custom `quinn::Runtime`, and the controller's fdatasyncs and
//! elections would then share the core with the data path. A dedicated
//! thread with a current-thread tokio runtime keeps it isolated: a data
//! core that is saturated does not delay a heartbeat into a fencing.
//! (Replication's data traffic, next, wants per-core endpoints instead.)
//!
//! **Liveness.** Every node (the leader too) registers with the quorum
//! ([`Command::RegisterNode`] once per run, which bumps its broker epoch
//! and fences the previous run; [`Command::UpdateNode`] for new addresses)
//! and then sends a heartbeat to the controller leader every
//! `heartbeat_interval`, and to the other voters too. The leader fences
//! ([`Command::FenceNode`]) a registered node whose last heartbeat, or
//! registration, is older than `session_timeout`. Since every voter hears
//! the heartbeats, a new leader knows who was alive: a node that died
//! before the election is fenced a session after it died, not a session
//! after the election (a node a new leader never heard of gets a full
//! session). A fenced node learns so from its next heartbeat's answer and
//! registers again.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// The controller's clock is tokio's: the wall clock in a node, the
// simulated one in the simulation tests (`crate::sim`).
use tokio::time::Instant;

use openraft::error::{ClientWriteError, RaftError};
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{BasicNode, Snapshot};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::link::{Links, Transport};
use crate::meta::{ClusterState, Command, NodeInfo, Outcome};
use crate::raft::store::{LogStore, StateMachine};
use crate::raft::{Network, Raft};
use crate::tls::NodeTls;
use crate::wire::{decode, encode, read_frame, write_frame, Request, Response, WVote};

/// How a controller starts.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// This node's id (≥ 1).
    pub node_id: u64,
    /// The cluster id every node of the cluster is configured with.
    pub cluster_id: String,
    /// UDP address the QUIC endpoint binds (port 0 picks one).
    pub listen: SocketAddr,
    /// Directory of the Raft log, vote and snapshot.
    pub data_dir: PathBuf,
    /// Certificates.
    pub tls: NodeTls,
    /// The initial voters (id → replication address, this node included)
    /// for a cluster that has never started; ignored once the Raft log
    /// holds anything. Empty: join an existing cluster as a learner
    /// (a voter adds it).
    pub voters: BTreeMap<u64, String>,
    /// What this node registers (its `id` and `replication` are filled in).
    pub node: NodeInfo,
    /// How often the node heartbeats to the controller leader.
    pub heartbeat_interval: Duration,
    /// A node not heard from for this long is fenced.
    pub session_timeout: Duration,
    /// Raft election timeout, lower bound (the upper is twice it).
    pub election_timeout: Duration,
    /// How often the leader moves leadership back to preferred replicas
    /// that are live and in sync (Kafka's auto leader rebalance); `None`:
    /// never.
    pub leader_rebalance_interval: Option<Duration>,
    /// The election timeout's upper bound instead of twice the lower
    /// (the simulation gives each node one timeout of its own, drawn from
    /// the seed: openraft's own draw is not seeded).
    pub(crate) election_timeout_max: Option<Duration>,
}

impl ControllerConfig {
    /// Defaults for everything but identity, addresses and certificates.
    pub fn new(
        node_id: u64,
        cluster_id: &str,
        listen: SocketAddr,
        data_dir: PathBuf,
        tls: NodeTls,
    ) -> Self {
        Self {
            node_id,
            cluster_id: cluster_id.to_string(),
            listen,
            data_dir,
            tls,
            voters: BTreeMap::new(),
            node: NodeInfo::default(),
            heartbeat_interval: Duration::from_millis(300),
            session_timeout: Duration::from_secs(3),
            election_timeout: Duration::from_millis(300),
            leader_rebalance_interval: Some(Duration::from_secs(300)),
            election_timeout_max: None,
        }
    }
}

/// Why a controller operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// No leader could be reached in time.
    #[error("no controller leader answered within {0:?}")]
    NoLeader(Duration),
    /// The quorum refused the change (the metadata is unchanged).
    #[error("{0}")]
    Refused(crate::meta::Refusal),
    /// The controller has stopped.
    #[error("the controller has stopped")]
    Stopped,
    /// Other failures (I/O, Raft).
    #[error("{0}")]
    Other(String),
}

/// Last heartbeat per node, as the leader saw it.
#[derive(Default)]
struct Liveness {
    seen: HashMap<u64, Instant>,
    /// The broker epoch each node had when last looked at: a new one means
    /// it registered (again), which counts as a heartbeat.
    epochs: HashMap<u64, u64>,
    term: u64,
    /// Nodes this leader decided to fence (id → the broker epoch fenced),
    /// until its state shows them fenced or registered again: their
    /// heartbeats are not acknowledged meanwhile (an acknowledgement
    /// extends a lease the fencing is about to end).
    fencing: HashMap<u64, u64>,
}

pub(crate) struct Shared {
    pub(crate) raft: Raft,
    links: Arc<dyn Transport>,
    pub(crate) cfg: ControllerConfig,
    pub(crate) state: watch::Receiver<Arc<ClusterState>>,
    liveness: Mutex<Liveness>,
    epoch: Mutex<u64>,
    /// What this node registers.
    node: Mutex<NodeInfo>,
    /// Wakes the member loop (the node's info changed).
    wake: tokio::sync::Notify,
    /// The leader lease (see [`Controller::holds_lease`]), read on every
    /// partition lookup of every core: atomics, no lock.
    pub(crate) lease: Lease,
}

/// A running controller. Dropping it stops it (as [`Controller::stop`]).
pub struct Controller {
    shared: Arc<Shared>,
    runtime: tokio::runtime::Handle,
    local_addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Controller {
    /// Starts the controller on its own thread and returns once its
    /// endpoint is bound and its Raft member is running.
    pub fn start(cfg: ControllerConfig) -> Result<Self> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("weir-controller-{}", cfg.node_id))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::Thread {
                            action: "starting the controller runtime",
                            source: e,
                        }));
                        return;
                    }
                };
                runtime.block_on(async move {
                    match boot(cfg).await {
                        Ok((shared, endpoint)) => {
                            let local = endpoint.local_addr();
                            let handle = tokio::runtime::Handle::current();
                            let tasks = spawn_tasks(&shared, endpoint.clone());
                            let _ =
                                ready_tx.send(local.map(|a| (shared.clone(), handle, a)).map_err(
                                    |source| Error::Endpoint {
                                        action: "reading the endpoint's local address".to_string(),
                                        source,
                                    },
                                ));
                            let _ = stop_rx.await;
                            for t in tasks {
                                t.abort();
                            }
                            let _ = shared.raft.shutdown().await;
                            endpoint.close(0u32.into(), b"stopping");
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })
            .map_err(|source| Error::Thread {
                action: "spawning the controller thread",
                source,
            })?;
        let (shared, runtime, local_addr) = ready_rx.recv().map_err(|_| Error::ThreadEnded)??;
        Ok(Self {
            shared,
            runtime,
            local_addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The UDP address the endpoint is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.shared.cfg.node_id
    }

    /// The metadata as applied on this node, and a way to wait for changes.
    pub fn watch(&self) -> watch::Receiver<Arc<ClusterState>> {
        self.shared.state.clone()
    }

    /// The metadata as applied on this node.
    pub fn state(&self) -> Arc<ClusterState> {
        self.shared.state.borrow().clone()
    }

    /// The controller leader as this node knows it.
    pub fn leader(&self) -> Option<u64> {
        self.shared.raft.metrics().borrow().current_leader
    }

    /// Whether this node may act as a leader of partitions now, its
    /// metadata applied up to `applied_version`: a leader lease. The
    /// controller fences a node a session timeout after the last
    /// heartbeat it received; the node's lease ends a heartbeat interval
    /// before a session timeout after the last heartbeat it *sent* that
    /// was acknowledged (unfenced) — so a node paused or cut off stops
    /// acting as a leader before another can be elected in its place, and
    /// after a fencing it acts again only once it has registered anew and
    /// applied the metadata up to that registration (which includes every
    /// leadership change made while it was fenced).
    pub fn holds_lease(&self, applied_version: u64) -> bool {
        self.shared.lease.holds(applied_version)
    }

    /// The node's broker epoch (0 until it has registered).
    pub fn broker_epoch(&self) -> u64 {
        *self.shared.epoch.lock().expect("not poisoned")
    }

    /// What this node registers (or has registered).
    pub fn registered_info(&self) -> NodeInfo {
        self.shared.node.lock().expect("not poisoned").clone()
    }

    /// Registers again with `info` (its `id` and `replication` kept) when
    /// it differs from what was registered: a new broker epoch.
    pub fn update_node(&self, mut info: NodeInfo) {
        let mut node = self.shared.node.lock().expect("not poisoned");
        info.id = node.id;
        info.replication = node.replication.clone();
        if *node != info {
            *node = info;
            *self.shared.epoch.lock().expect("not poisoned") = 0;
            self.shared.wake.notify_one();
        }
    }

    /// Waits (blocking the calling thread, which must not be the
    /// controller's) until this node is registered and its applied state
    /// shows it live, for at most `within`; calls `waiting` with the time
    /// waited every `every` meanwhile (to log).
    pub fn wait_registered(
        &self,
        within: Duration,
        every: Duration,
        mut waiting: impl FnMut(Duration),
    ) -> Result<(), ControllerError> {
        let shared = self.shared.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let task = self.runtime.spawn(async move {
            let mut watch = shared.state.clone();
            let id = shared.cfg.node_id;
            loop {
                // This run's registration applied here: the epoch it got,
                // in this node's own state. (The state replayed from disk
                // shows the previous run live, at its epoch; a view taken
                // from it would lead what that run led.)
                let registered = *shared.epoch.lock().expect("not poisoned");
                let live = watch
                    .borrow_and_update()
                    .nodes
                    .get(&id)
                    .is_some_and(|n| !n.fenced && n.broker_epoch >= registered);
                if live && registered > 0 {
                    let _ = tx.send(());
                    return;
                }
                // The epoch is set once the registration is committed,
                // maybe before it is applied here: look again soon even
                // without a change.
                let _ = tokio::time::timeout(Duration::from_millis(20), watch.changed()).await;
            }
        });
        let start = Instant::now();
        loop {
            let left = within.saturating_sub(start.elapsed());
            match rx.recv_timeout(every.min(left)) {
                Ok(()) => return Ok(()),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(ControllerError::Stopped)
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if start.elapsed() >= within {
                        task.abort();
                        return Err(ControllerError::NoLeader(within));
                    }
                    waiting(start.elapsed());
                }
            }
        }
    }

    /// Proposes `command` (forwarded to the leader when this node is not
    /// it) and waits until this node has applied it. `Ok` carries the
    /// outcome; a command the state refused is [`ControllerError::Refused`].
    pub async fn propose(&self, command: Command) -> Result<Outcome, ControllerError> {
        let shared = self.shared.clone();
        let task = self.runtime.spawn(async move {
            let outcome = propose(&shared, command, Duration::from_secs(5)).await?;
            wait_applied(&shared.state, outcome.version).await?;
            Ok::<_, ControllerError>(outcome)
        });
        let outcome = task.await.map_err(|_| ControllerError::Stopped)??;
        match outcome.error {
            Some(e) => Err(ControllerError::Refused(e)),
            None => Ok(outcome),
        }
    }

    /// Adds node `id` (reachable at `addr`) to the voters: it first catches
    /// up as a learner, then a joint change makes it a voter. Call it on
    /// the leader ([`Controller::leader`]).
    pub async fn add_voter(&self, id: u64, addr: String) -> Result<(), ControllerError> {
        self.change_voters(id, Some(addr)).await
    }

    /// Removes node `id` from the voters (call it on the leader).
    pub async fn remove_voter(&self, id: u64) -> Result<(), ControllerError> {
        self.change_voters(id, None).await
    }

    /// Adds `id` (with its address) or, without one, removes it.
    async fn change_voters(&self, id: u64, addr: Option<String>) -> Result<(), ControllerError> {
        let shared = self.shared.clone();
        self.runtime
            .spawn(async move { change_voters(&shared, id, addr).await })
            .await
            .map_err(|_| ControllerError::Stopped)?
    }

    /// The current voter ids.
    pub fn voters(&self) -> std::collections::BTreeSet<u64> {
        voters(&self.shared.raft)
    }

    /// Stops the controller: its Raft member and endpoint close; the
    /// thread is joined.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("node_id", &self.node_id())
            .field("local_addr", &self.local_addr)
            .field("leader", &self.leader())
            .field("version", &self.state().version)
            .finish()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// On the leader: adds `id` (with its address: first as a learner that
/// catches up, then a joint change makes it a voter) or, without one,
/// removes it from the voters.
pub(crate) async fn change_voters(
    shared: &Shared,
    id: u64,
    addr: Option<String>,
) -> Result<(), ControllerError> {
    let other = |e: &dyn std::fmt::Display| ControllerError::Other(e.to_string());
    let raft = &shared.raft;
    let mut voters = voters(raft);
    match addr {
        Some(addr) => {
            raft.add_learner(id, BasicNode::new(addr), true)
                .await
                .map_err(|e| other(&e))?;
            voters.insert(id);
        }
        None => {
            voters.remove(&id);
        }
    }
    raft.change_membership(voters, false)
        .await
        .map_err(|e| other(&e))?;
    Ok(())
}

pub(crate) fn voters(raft: &Raft) -> std::collections::BTreeSet<u64> {
    raft.metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .collect()
}

async fn boot(mut cfg: ControllerConfig) -> Result<(Arc<Shared>, quinn::Endpoint)> {
    if cfg.node_id == 0 {
        return Err(Error::NodeIdZero);
    }
    let mut endpoint =
        quinn::Endpoint::server(cfg.tls.server_config()?, cfg.listen).map_err(|source| {
            Error::Endpoint {
                action: format!("binding the replication endpoint on {} (udp)", cfg.listen),
                source,
            }
        })?;
    endpoint.set_default_client_config(cfg.tls.client_config()?);
    let local = endpoint.local_addr().map_err(|source| Error::Endpoint {
        action: "reading the endpoint's local address".to_string(),
        source,
    })?;
    if cfg.node.replication.is_empty() {
        cfg.node.replication = local.to_string();
    }
    let links = Links::new(endpoint.clone(), cfg.cluster_id.clone(), cfg.node_id);
    Ok((boot_member(cfg, Arc::new(links)).await?, endpoint))
}

/// Opens the Raft log and state machine, starts the Raft member on
/// `links` and initializes a new quorum (see [`ControllerConfig::voters`]).
/// `cfg.node.replication` is where the others reach this node.
pub(crate) async fn boot_member(
    mut cfg: ControllerConfig,
    links: Arc<dyn Transport>,
) -> Result<Arc<Shared>> {
    cfg.node.id = cfg.node_id;
    let raft_dir = cfg.data_dir.clone();
    let log = LogStore::open(&raft_dir).map_err(|e| Error::OpenRaft {
        what: "log",
        dir: raft_dir.clone(),
        source: Box::new(e),
    })?;
    // Never started: no vote, no entry, no snapshot.
    let fresh = log.is_empty() && !raft_dir.join("snapshot").exists();
    let (publish, state) = watch::channel(Arc::new(ClusterState::default()));
    let sm = StateMachine::open(&raft_dir, publish).map_err(|e| Error::OpenRaft {
        what: "snapshot",
        dir: raft_dir.clone(),
        source: Box::new(e),
    })?;
    let raft_config = openraft::Config {
        cluster_name: cfg.cluster_id.clone(),
        heartbeat_interval: (cfg.election_timeout.as_millis() as u64 / 3).max(10),
        election_timeout_min: cfg.election_timeout.as_millis() as u64,
        election_timeout_max: cfg
            .election_timeout_max
            .unwrap_or(cfg.election_timeout * 2)
            .as_millis() as u64,
        install_snapshot_timeout: 2_000,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(1_000),
        max_in_snapshot_log_to_keep: 100,
        ..Default::default()
    }
    .validate()
    .map_err(|e| Error::RaftConfig {
        source: Box::new(e),
    })?;
    let raft = Raft::new(
        cfg.node_id,
        Arc::new(raft_config),
        Network {
            links: links.clone(),
        },
        log,
        sm,
    )
    .await
    .map_err(|e| Error::RaftStart {
        source: Box::new(e),
    })?;
    // A voter without an address is this node at its bound address.
    for addr in cfg.voters.values_mut() {
        if addr.is_empty() {
            *addr = cfg.node.replication.clone();
        }
    }
    if !cfg.voters.is_empty() && fresh {
        let members: BTreeMap<u64, BasicNode> = cfg
            .voters
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr)))
            .collect();
        // Every initial voter initializes with the same membership (the
        // same first log entry on each); refused (harmlessly) if another
        // voter's leader reached this node first.
        match raft.initialize(members).await {
            Ok(()) => {
                info!(node = cfg.node_id, voters = ?cfg.voters.keys(), "initialized a new metadata quorum")
            }
            Err(RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => {}
            Err(e) => {
                return Err(Error::RaftInit {
                    source: Box::new(e),
                })
            }
        }
    }
    // The only voter need not wait an election timeout after a restart.
    let sole_voter = {
        let m = raft.metrics();
        let voters: Vec<u64> = m
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        voters == [cfg.node_id]
    };
    if sole_voter {
        let _ = raft.trigger().elect().await;
    }
    Ok(Arc::new(Shared {
        raft,
        links,
        state,
        liveness: Mutex::new(Liveness::default()),
        epoch: Mutex::new(0),
        node: Mutex::new(cfg.node.clone()),
        wake: tokio::sync::Notify::new(),
        cfg,
        lease: Lease::new(),
    }))
}

fn spawn_tasks(
    shared: &Arc<Shared>,
    endpoint: quinn::Endpoint,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = member_tasks(shared);
    tasks.push(tokio::spawn(accept_loop(shared.clone(), endpoint)));
    tasks
}

/// The tasks every member runs whatever its transport: registration and
/// heartbeats, and the leader's duties.
pub(crate) fn member_tasks(shared: &Arc<Shared>) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        tokio::spawn(member_loop(shared.clone())),
        tokio::spawn(leader_loop(shared.clone())),
    ]
}

async fn accept_loop(shared: Arc<Shared>, endpoint: quinn::Endpoint) {
    while let Some(incoming) = endpoint.accept().await {
        let shared = shared.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let conn = match incoming.await {
                Ok(c) => c,
                // A certificate refused either way is a transport error
                // (TLS alert); a peer that gave up is not worth a warning.
                Err(e) if tls_refusal(&e) => {
                    warn!(%remote, error = %e, "refused a node connection: TLS handshake failed (certificate not from this cluster's CA?)");
                    return;
                }
                Err(e) => {
                    tracing::debug!(%remote, error = %e, "a node connection ended during its handshake");
                    return;
                }
            };
            if let Err(e) = serve_connection(&shared, conn).await {
                tracing::debug!(%remote, error = %e.chain(), "node connection ended");
            }
        });
    }
}

/// Whether a failed handshake was a certificate refused, by either side:
/// our TLS stack's error, or the peer's TLS alert (a QUIC crypto error
/// code, 0x100 + alert).
fn tls_refusal(e: &quinn::ConnectionError) -> bool {
    match e {
        quinn::ConnectionError::TransportError(_) => true,
        quinn::ConnectionError::ConnectionClosed(close) => {
            u64::from(close.error_code) & !0xff == 0x100
        }
        _ => false,
    }
}

async fn serve_connection(shared: &Arc<Shared>, conn: quinn::Connection) -> Result<()> {
    let remote = conn.remote_address();
    let accept_stream = |source| Error::Connection {
        action: "accepting a stream",
        source,
    };
    // The hello.
    let (mut send, mut recv) = conn.accept_bi().await.map_err(accept_stream)?;
    let hello: Request =
        decode(&read_frame(&mut recv).await?).map_err(|message| Error::Malformed { message })?;
    let peer = match hello {
        Request::Hello {
            cluster_id,
            node_id,
        } if cluster_id == shared.cfg.cluster_id => node_id,
        Request::Hello {
            cluster_id,
            node_id,
        } => {
            warn!(%remote, node = node_id, theirs = %cluster_id, ours = %shared.cfg.cluster_id, "refused a node of another cluster");
            let why = format!(
                "cluster id `{cluster_id}` is not this cluster's (`{}`)",
                shared.cfg.cluster_id
            );
            write_frame(&mut send, &encode(&Response::Refused(why))).await?;
            let _ = send.stopped().await;
            conn.close(1u32.into(), b"wrong cluster");
            return Ok(());
        }
        other => {
            warn!(%remote, "refused a node connection that did not start with a hello: {other:?}");
            conn.close(1u32.into(), b"hello first");
            return Ok(());
        }
    };
    if let Err(e) = crate::tls::check_peer_is(&conn, peer) {
        let why = e.chain().to_string();
        warn!(%remote, node = peer, error = %why, "refused a node connection");
        write_frame(&mut send, &encode(&Response::Refused(why))).await?;
        let _ = send.stopped().await;
        conn.close(1u32.into(), b"not that node");
        return Ok(());
    }
    write_frame(&mut send, &encode(&Response::HelloOk)).await?;
    loop {
        let (mut send, mut recv) = conn.accept_bi().await.map_err(accept_stream)?;
        let shared = shared.clone();
        tokio::spawn(async move {
            let answer = match read_frame(&mut recv).await {
                Ok(body) => match decode::<Request>(&body) {
                    // A node speaks for itself only (its certificate is
                    // checked against its hello).
                    Ok(Request::Heartbeat { node_id, .. })
                    | Ok(Request::Propose(
                        Command::RegisterNode(NodeInfo { id: node_id, .. })
                        | Command::UpdateNode(NodeInfo { id: node_id, .. }),
                    )) if node_id != peer => Response::Refused(format!(
                        "node {peer} cannot register or heartbeat for node {node_id}"
                    )),
                    Ok(request) => handle(&shared, request).await,
                    Err(e) => Response::Refused(e),
                },
                Err(e) => {
                    tracing::debug!(peer, error = %e.chain(), "reading a request");
                    return;
                }
            };
            if let Err(e) = write_frame(&mut send, &encode(&answer)).await {
                tracing::debug!(peer, error = %e.chain(), "writing an answer");
            }
        });
    }
}

pub(crate) async fn handle(shared: &Arc<Shared>, request: Request) -> Response {
    let raft = &shared.raft;
    match request {
        Request::Hello { .. } => Response::HelloOk,
        Request::Vote { vote, last_log_id } => {
            match raft
                .vote(VoteRequest {
                    vote: vote.into(),
                    last_log_id: last_log_id.map(Into::into),
                })
                .await
            {
                Ok(r) => Response::Vote {
                    vote: r.vote.into(),
                    granted: r.vote_granted,
                    last_log_id: r.last_log_id.map(Into::into),
                },
                Err(e) => Response::Refused(e.to_string()),
            }
        }
        Request::Append {
            vote,
            prev_log_id,
            entries,
            leader_commit,
        } => {
            match raft
                .append_entries(AppendEntriesRequest {
                    vote: vote.into(),
                    prev_log_id: prev_log_id.map(Into::into),
                    entries: entries.into_iter().map(Into::into).collect(),
                    leader_commit: leader_commit.map(Into::into),
                })
                .await
            {
                Ok(r) => Response::Append(r.into()),
                Err(e) => Response::Refused(e.to_string()),
            }
        }
        Request::Snapshot { vote, meta, data } => {
            let snapshot = Snapshot {
                meta: (&meta).into(),
                snapshot: Box::new(data),
            };
            match raft.install_full_snapshot(vote.into(), snapshot).await {
                Ok(r) => Response::Snapshot(WVote::from(r.vote)),
                Err(e) => Response::Refused(e.to_string()),
            }
        }
        Request::Propose(command) => match raft.client_write(command).await {
            Ok(r) => Response::Proposed(r.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Response::NotLeader(f.leader_id)
            }
            Err(e) => Response::Refused(e.to_string()),
        },
        Request::Heartbeat { node_id, .. } => {
            if raft.metrics().borrow().current_leader != Some(shared.cfg.node_id) {
                return Response::NotLeader(raft.metrics().borrow().current_leader);
            }
            heartbeat_at_leader(shared, node_id).await
        }
    }
}

/// Notes a heartbeat of `node_id` in the leader's liveness table.
fn record_heartbeat(shared: &Shared, node_id: u64) {
    shared
        .liveness
        .lock()
        .expect("not poisoned")
        .seen
        .insert(node_id, Instant::now());
}

/// The leader's answer to a heartbeat. An acknowledgement extends the
/// node's lease, so it is given only by a leader a quorum confirms now (a
/// deposed leader that has not heard of its successor must not extend
/// leases the successor will not know of), and only once it has applied
/// an entry of its own term (a fencing an earlier leader left in the log
/// commits with it, and must be in the state the answer is read from).
async fn heartbeat_at_leader(shared: &Shared, node_id: u64) -> Response {
    record_heartbeat(shared, node_id);
    if let Err(e) = shared.raft.ensure_linearizable().await {
        return Response::Refused(format!("not confirmed as the controller leader: {e}"));
    }
    let caught_up = {
        let m = shared.raft.metrics();
        let m = m.borrow();
        m.last_applied
            .is_some_and(|l| l.leader_id == *m.vote.leader_id())
    };
    if !caught_up {
        return Response::Refused(
            "a new controller leader: heartbeats are acknowledged once its first entry is applied"
                .to_string(),
        );
    }
    if shared
        .liveness
        .lock()
        .expect("not poisoned")
        .fencing
        .contains_key(&node_id)
    {
        return Response::Refused(format!("node {node_id} is being fenced"));
    }
    let state = shared.state.borrow().clone();
    match state.nodes.get(&node_id) {
        Some(n) => Response::HeartbeatAck {
            epoch: n.broker_epoch,
            fenced: n.fenced,
        },
        None => Response::HeartbeatAck {
            epoch: 0,
            fenced: true,
        },
    }
}

/// Proposes `command` on the leader, wherever it is, until `deadline`.
pub(crate) async fn propose(
    shared: &Shared,
    command: Command,
    within: Duration,
) -> Result<Outcome, ControllerError> {
    let deadline = Instant::now() + within;
    let mut last_error = String::new();
    while Instant::now() < deadline {
        // A leader that cannot reach a quorum holds the write until it
        // commits or the leader steps down: the deadline bounds it too.
        let write = tokio::time::timeout_at(deadline, shared.raft.client_write(command.clone()));
        let Ok(written) = write.await else {
            last_error = format!("not committed within {within:?} (no quorum reached)");
            break;
        };
        match written {
            Ok(r) => return Ok(r.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                if let (Some(id), Some(node)) = (f.leader_id, f.leader_node) {
                    // A leader that died holds the call until its timeout;
                    // a new leader elected meanwhile ends the wait at once.
                    let mut metrics = shared.raft.metrics();
                    let request = Request::Propose(command.clone());
                    let forward = shared.links.call(id, &node.addr, &request);
                    let replaced = metrics.wait_for(|m| m.current_leader.is_some_and(|l| l != id));
                    tokio::select! {
                        answer = forward => match answer {
                            Ok(Response::Proposed(o)) => return Ok(o),
                            Ok(other) => last_error = format!("leader {id} answered {other:?}"),
                            Err(e) => last_error = format!("leader {id}: {}", e.chain()),
                        },
                        _ = replaced => continue,
                    }
                }
            }
            Err(RaftError::Fatal(e)) => return Err(ControllerError::Other(e.to_string())),
            Err(e) => last_error = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if last_error.is_empty() {
        Err(ControllerError::NoLeader(within))
    } else {
        Err(ControllerError::Other(format!(
            "no controller leader accepted the change within {within:?}: {last_error}"
        )))
    }
}

/// Proposes `command` on this node only if it leads (never forwarded),
/// waiting until `within` for the commit.
async fn propose_as_leader(
    shared: &Shared,
    command: Command,
    within: Duration,
) -> Result<Outcome, ControllerError> {
    let write = tokio::time::timeout(within, shared.raft.client_write(command));
    match write.await {
        Ok(Ok(r)) => Ok(r.data),
        Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))) => Err(
            ControllerError::Other("this node no longer leads the controller".to_string()),
        ),
        Ok(Err(e)) => Err(ControllerError::Other(e.to_string())),
        Err(_) => Err(ControllerError::Other(format!(
            "not committed within {within:?} (no quorum reached)"
        ))),
    }
}

async fn wait_applied(
    state: &watch::Receiver<Arc<ClusterState>>,
    version: u64,
) -> Result<(), ControllerError> {
    let mut state = state.clone();
    let waited = tokio::time::timeout(
        Duration::from_secs(5),
        state.wait_for(|s| s.version >= version),
    )
    .await
    .map(|r| r.map(|_| ()));
    match waited {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(ControllerError::Stopped),
        Err(_) => Err(ControllerError::Other(format!(
            "version {version} was committed but not applied on this node within 5 s"
        ))),
    }
}

/// A node's leader lease: until when (ms after `base`, 0: none) and the
/// metadata version it must have applied first (its registration's after
/// a fencing). Written by the member loop, read by every core.
#[derive(Debug)]
pub(crate) struct Lease {
    base: Instant,
    until_ms: std::sync::atomic::AtomicU64,
    min_version: std::sync::atomic::AtomicU64,
}

impl Lease {
    fn new() -> Lease {
        Lease {
            base: Instant::now(),
            until_ms: std::sync::atomic::AtomicU64::new(0),
            min_version: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn ms(&self, t: Instant) -> u64 {
        // 1 at the least: 0 means no lease.
        (t.saturating_duration_since(self.base).as_millis() as u64).max(1)
    }

    pub(crate) fn holds(&self, applied_version: u64) -> bool {
        use std::sync::atomic::Ordering::Acquire;
        let until = self.until_ms.load(Acquire);
        until != 0
            && self.ms(Instant::now()) < until
            && applied_version >= self.min_version.load(Acquire)
    }

    /// A registration acknowledged: after a fencing (no lease) the node
    /// leads again only once it has applied `version`; an update of a
    /// live node's addresses keeps the version it had.
    fn registered(&self, until: Instant, version: u64) {
        use std::sync::atomic::Ordering::{AcqRel, Release};
        if self.until_ms.load(std::sync::atomic::Ordering::Acquire) == 0 {
            self.min_version.store(version, Release);
        }
        self.until_ms.fetch_max(self.ms(until), AcqRel);
    }

    /// An unfenced heartbeat acknowledged: a live lease lasts longer.
    fn extend(&self, until: Instant) {
        use std::sync::atomic::Ordering::AcqRel;
        let until = self.ms(until);
        let _ = self
            .until_ms
            .fetch_update(AcqRel, std::sync::atomic::Ordering::Acquire, |now| {
                (now != 0).then_some(now.max(until))
            });
    }

    /// Fenced: no lease until the next registration.
    fn revoke(&self) {
        self.until_ms.store(0, std::sync::atomic::Ordering::Release);
    }
}

/// How long an acknowledged heartbeat (or registration) sent at `t` lets
/// the node lead: to `t` + the session timeout − one heartbeat interval.
fn lease_span(cfg: &ControllerConfig) -> Duration {
    cfg.session_timeout.saturating_sub(cfg.heartbeat_interval)
}

/// Every node: register, then heartbeat to the leader; register again
/// when fenced.
async fn member_loop(shared: Arc<Shared>) {
    let interval = shared.cfg.heartbeat_interval;
    // This run of the node registered: later registrations (new addresses,
    // or after a fencing) are updates, which keep what it leads.
    let mut registered = false;
    loop {
        let epoch = *shared.epoch.lock().expect("not poisoned");
        if epoch == 0 {
            let info = shared.node.lock().expect("not poisoned").clone();
            let command = if registered {
                Command::UpdateNode(info.clone())
            } else {
                Command::RegisterNode(info.clone())
            };
            let sent = Instant::now();
            match propose(&shared, command, interval * 3).await {
                Ok(o) if *shared.node.lock().expect("not poisoned") != info => {
                    registered |= o.error.is_none();
                    continue;
                }
                Ok(o) if o.error.is_none() => {
                    // The controller counts the session from its
                    // acknowledgement, later than `sent`. After a fencing
                    // (no lease), the node leads again only once it has
                    // applied this registration (and every leadership
                    // change before it); an update of a live node's
                    // addresses keeps the version it had.
                    shared
                        .lease
                        .registered(sent + lease_span(&shared.cfg), o.version);
                    info!(
                        node = shared.cfg.node_id,
                        epoch = o.broker_epoch,
                        version = o.version,
                        "registered with the controller"
                    );
                    *shared.epoch.lock().expect("not poisoned") = o.broker_epoch;
                    registered = true;
                    continue;
                }
                Ok(o) => warn!(node = shared.cfg.node_id, error = ?o.error, "registration refused"),
                Err(e) => {
                    tracing::debug!(node = shared.cfg.node_id, error = %e, "registration did not reach a leader")
                }
            }
        } else {
            let leader = shared.raft.metrics().borrow().current_leader;
            let sent = Instant::now();
            let answer = match leader {
                // A leader that was paused still believes it leads: its
                // own heartbeat counts once a quorum confirms it.
                Some(l) if l == shared.cfg.node_id => Some(heartbeat_at_leader(&shared, l).await),
                Some(l) => {
                    let addr = shared
                        .raft
                        .metrics()
                        .borrow()
                        .membership_config
                        .membership()
                        .get_node(&l)
                        .map(|n| n.addr.clone());
                    match addr {
                        Some(addr) => shared
                            .links
                            .call(
                                l,
                                &addr,
                                &Request::Heartbeat {
                                    node_id: shared.cfg.node_id,
                                    epoch,
                                },
                            )
                            .await
                            .ok(),
                        None => None,
                    }
                }
                None => None,
            };
            if !matches!(answer, Some(Response::HeartbeatAck { .. })) {
                tracing::debug!(
                    node = shared.cfg.node_id,
                    ?leader,
                    ?answer,
                    "heartbeat not acknowledged"
                );
            }
            if let Some(Response::HeartbeatAck {
                epoch: known,
                fenced,
            }) = answer
            {
                if fenced || known != epoch {
                    warn!(
                        node = shared.cfg.node_id,
                        epoch, known, fenced, "fenced by the controller; registering again"
                    );
                    shared.lease.revoke();
                    *shared.epoch.lock().expect("not poisoned") = 0;
                    continue;
                }
                shared.lease.extend(sent + lease_span(&shared.cfg));
            }
        }
        let _ = tokio::time::timeout(interval, shared.wake.notified()).await;
    }
}

/// Preferred-leader elections the leader proposes per tick at most.
const ELECTIONS_PER_TICK: usize = 16;

/// The leader's duties: name the cluster, fence nodes whose heartbeats
/// lapsed, hand leadership back to preferred replicas.
async fn leader_loop(shared: Arc<Shared>) {
    let tick = (shared.cfg.heartbeat_interval / 2).max(Duration::from_millis(10));
    let mut metrics = shared.raft.metrics();
    let mut first = true;
    let mut last_rebalance = Instant::now();
    loop {
        // Every tick, and at once when leadership changes.
        let mut paused = false;
        if !first {
            let asleep = Instant::now();
            let _ = tokio::time::timeout(tick, metrics.changed()).await;
            // Woken far later than the tick: this process (or its host)
            // stood still. The heartbeats sent meanwhile wait unread in
            // its sockets: every node gets a session from now rather than
            // being fenced for this node's own silence.
            paused = asleep.elapsed() > tick + shared.cfg.session_timeout / 3;
        }
        first = false;
        let (leader, term) = {
            let m = shared.raft.metrics();
            let m = m.borrow();
            (m.current_leader, m.current_term)
        };
        if leader != Some(shared.cfg.node_id) {
            continue;
        }
        let state = shared.state.borrow().clone();
        if state.cluster_id.is_empty() {
            let _ = propose(
                &shared,
                Command::InitCluster {
                    cluster_id: shared.cfg.cluster_id.clone(),
                },
                tick,
            )
            .await;
            continue;
        }
        let now = Instant::now();
        let lapsed: Vec<(u64, u64)> = {
            let mut live = shared.liveness.lock().expect("not poisoned");
            if live.term != term {
                // A new leader cannot know which leases the one before it
                // extended: every node gets a full session from now (as
                // KRaft's newly active controller gives its brokers).
                live.term = term;
                live.fencing.clear();
                live.epochs.clear();
                for id in state.nodes.keys() {
                    live.seen.insert(*id, now);
                }
            }
            if paused {
                warn!(
                    node = shared.cfg.node_id,
                    "the controller leader stood still for over a third of a session: every node's session starts again"
                );
                for id in state.nodes.keys() {
                    live.seen.insert(*id, now);
                }
            }
            // A fencing ends once applied (or overtaken by a registration).
            live.fencing.retain(|id, epoch| {
                state
                    .nodes
                    .get(id)
                    .is_some_and(|n| !n.fenced && n.broker_epoch == *epoch)
            });
            let Liveness {
                seen,
                epochs,
                fencing,
                ..
            } = &mut *live;
            let lapsed: Vec<(u64, u64)> = state
                .nodes
                .iter()
                .filter(|(_, n)| !n.fenced)
                .filter(|(id, n)| {
                    // A registration is a sign of life: the session of a
                    // node that registered since the last look starts now
                    // (it has not had time to heartbeat yet).
                    let before = epochs.insert(**id, n.broker_epoch);
                    if before.is_some_and(|e| e != n.broker_epoch) {
                        seen.insert(**id, now);
                    }
                    let seen = *seen.entry(**id).or_insert(now);
                    now.duration_since(seen) > shared.cfg.session_timeout
                })
                .map(|(id, n)| (*id, n.broker_epoch))
                .collect();
            // Decided under the lock the heartbeats take: none is
            // acknowledged from here on.
            fencing.extend(lapsed.iter().copied());
            lapsed
        };
        for (id, epoch) in lapsed {
            warn!(
                node = id,
                epoch, "no heartbeat within the session timeout: fencing"
            );
            // Committed by this leader or not at all: a deposed leader's
            // liveness table is stale, and forwarded to its successor the
            // fencing would end a lease that successor just extended.
            let fence = Command::FenceNode { id, epoch };
            match propose_as_leader(&shared, fence, tick).await {
                Ok(o) if o.error.is_none() => info!(node = id, version = o.version, "fenced"),
                Ok(o) => tracing::debug!(node = id, error = ?o.error, "fence not applied"),
                Err(e) => tracing::debug!(node = id, error = %e, "fence not committed"),
            }
        }
        if let Some(every) = shared.cfg.leader_rebalance_interval {
            if last_rebalance.elapsed() >= every {
                // A bounded number per tick, so fencing is never held up
                // long; the rest in the next ticks.
                let due = crate::meta::preferred_not_leading(&state);
                if due.len() <= ELECTIONS_PER_TICK {
                    last_rebalance = Instant::now();
                }
                for (topic, partition) in due.into_iter().take(ELECTIONS_PER_TICK) {
                    let name = format!("{topic}-{partition}");
                    let cmd = Command::ElectPreferredLeader { topic, partition };
                    match propose(&shared, cmd, tick).await {
                        Ok(o) if o.error.is_none() => {
                            info!(partition = %name, "the preferred replica leads again")
                        }
                        Ok(o) => {
                            tracing::debug!(partition = %name, error = ?o.error, "preferred leader not elected")
                        }
                        Err(e) => {
                            tracing::debug!(partition = %name, error = %e, "preferred leader election not committed")
                        }
                    }
                }
            }
        }
    }
}
