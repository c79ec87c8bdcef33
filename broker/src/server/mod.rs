//! Starting and stopping the broker: one pinned glommio executor per core,
//! the cross-core meshes, listeners (the shared port with SO_REUSEPORT on
//! every core, and each core's own port), signals and clean shutdown.
//!
//! **Crash-only.** The `weir broker` process aborts on a panic in any
//! thread (a panic hook, and `panic = "abort"` in the release profile):
//! a core that panicked would leave the others serving requests that
//! wait for it. The broker is restarted and recovers, which is the path
//! the tests exercise.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::Duration;

use anyhow::{anyhow, Context};
use glommio::channels::channel_mesh::MeshBuilder;
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};

pub mod config;
pub mod limits;
pub mod oauth;
pub mod otlp_config;
pub mod principal;
pub mod tls;

use config::BrokerConfig;
use limits::{DRAIN_MS_MAX, MESH_CHANNEL_CAPACITY, STOP_POLL_MS};
use weir_storage::checkpoint::on_blocking_pool;

use crate::listener::kafka::Kafka;
use crate::listener::native::Native;
use crate::listener::otlp::{serve_otlp, Receiver};
use crate::metadata::MetadataView;
use crate::service::Ctx;
use crate::shard::mesh::{self, CoreMsg, ReplyMsg};
use crate::shard::{Core, Shared};

type Mesh<T> = MeshBuilder<T, glommio::channels::channel_mesh::Full>;

/// Reserves the shared port when it is 0: binds a socket with SO_REUSEPORT
/// (without listening, so it takes no connections) to learn a free port
/// that every core then binds.
fn reserve_port(addr: SocketAddr) -> anyhow::Result<(socket2::Socket, SocketAddr)> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    s.set_reuse_port(true)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())
        .with_context(|| format!("cannot bind {addr}"))?;
    let local = s
        .local_addr()?
        .as_socket()
        .ok_or_else(|| anyhow!("bound address is not an IP address"))?;
    Ok((s, local))
}

/// Where a started broker listens (passed to [`run_with`]'s `ready`).
#[derive(Debug, Clone)]
pub struct ReadyInfo {
    /// The shared native-protocol address.
    pub listen: SocketAddr,
    /// Each core's own port.
    pub core_ports: Vec<u16>,
    /// The metrics address.
    pub metrics: SocketAddr,
    /// The Kafka protocol address, if any.
    pub kafka: Option<SocketAddr>,
    /// Each core's own Kafka port (empty without per-core Kafka brokers).
    pub kafka_core_ports: Vec<u16>,
    /// The OTLP/gRPC address, if on.
    pub otlp_grpc: Option<SocketAddr>,
    /// The OTLP/HTTP address, if on.
    pub otlp_http: Option<SocketAddr>,
    /// The data directory.
    pub data_dir: std::path::PathBuf,
}

/// Makes a panic in any thread end the process (after the panic message
/// is printed): crash-only, see the module docs.
pub fn abort_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        tracing::error!("a thread panicked: aborting the process (restart it to recover)");
        std::process::abort();
    }));
}

/// Runs the broker until SIGTERM or SIGINT; returns after a clean shutdown.
/// A panic aborts the process.
pub fn run(config: BrokerConfig) -> anyhow::Result<()> {
    abort_on_panic();
    let stopping = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stopping.clone()).context("installing signal handlers")?;
    }
    // SIGHUP: read the listeners' certificate files again.
    signal_hook::flag::register(signal_hook::consts::SIGHUP, RELOAD_TLS.clone())
        .context("installing signal handlers")?;
    run_with(config, stopping, |r| {
        println!(
            "weir broker ready: listen={} cores={} core_ports={:?} metrics={} kafka={} kafka_core_ports={:?} otlp_grpc={} otlp_http={} data_dir={}",
            r.listen,
            r.core_ports.len(),
            r.core_ports,
            r.metrics,
            off_or(r.kafka),
            r.kafka_core_ports,
            off_or(r.otlp_grpc),
            off_or(r.otlp_http),
            r.data_dir.display()
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();
    })
}

fn off_or(a: Option<SocketAddr>) -> String {
    a.map_or("off".to_string(), |a| a.to_string())
}

/// What [`run`] does, for a broker embedded in another program: runs until
/// `stopping` is set (no signal handlers are installed), calling `ready`
/// once every core listens.
pub fn run_with(
    config: BrokerConfig,
    stopping: Arc<AtomicBool>,
    ready: impl FnOnce(&ReadyInfo),
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating data directory {}", config.data_dir.display()))?;
    say_listeners(&config);
    let oauth = config
        .sasl
        .oauth
        .clone()
        .map(|o| oauth::OAuthKeys::load(o).map(Arc::new))
        .transpose()
        .context("--sasl-oauthbearer-jwks-file")?;
    let client_tls = config
        .ssl
        .clone()
        .map(|s| tls::ServerTls::load(s).map(Arc::new))
        .transpose()
        .context("the client listeners' TLS (--ssl-*)")?;
    let (placeholder, listen) =
        reserve_port(config.listen).context("the native protocol address (--listen)")?;
    let kafka = config
        .kafka_listener
        .map(|a| {
            reserve_port(a).context(
                "the Kafka protocol address (--kafka-listener; another address, or `off`, if \
                 something else listens there)",
            )
        })
        .transpose()?;
    // The further listeners' shared ports, held like the first ones'.
    let mut config = config;
    let mut placeholders = Vec::new();
    for l in config.listen_more.iter_mut() {
        let (p, a) = reserve_port(l.addr)
            .with_context(|| format!("the {} native listener (--listen)", l.protocol.name()))?;
        placeholders.push(p);
        l.addr = a;
    }
    for l in config.kafka_more.iter_mut() {
        let (p, a) = reserve_port(l.addr).with_context(|| {
            format!(
                "the {} Kafka listener (--kafka-listener)",
                l.protocol.name()
            )
        })?;
        placeholders.push(p);
        l.addr = a;
    }
    for (l, flag) in [
        (config.otlp.grpc.as_mut(), "--otlp-grpc-listen"),
        (config.otlp.http.as_mut(), "--otlp-http-listen"),
    ] {
        let Some(l) = l else { continue };
        if l.protocol.tls() && config.ssl.is_none() {
            anyhow::bail!(
                "{flag} SSL://{}: TLS needs --ssl-certificate-file and --ssl-key-file",
                l.addr
            );
        }
        let (p, a) = reserve_port(l.addr).with_context(|| {
            format!("the OTLP receiver ({flag}; another address, or `off`, if something else listens there)")
        })?;
        placeholders.push(p);
        l.addr = a;
    }
    let controller = crate::cluster::start(&config, listen, kafka.as_ref().map(|(_, a)| *a))?;
    crate::cluster::migrate_registry(&controller, &config)?;
    let view = Arc::new(crate::metadata::view_for(
        &controller.state(),
        config.cluster.node_id,
        config.cores,
    ));
    let kafka_listen = kafka.as_ref().map(|(_, a)| *a);
    let n = config.cores;
    let node_tls = crate::cluster::node_tls(&config)?;
    let unbound = |listeners: usize| -> Vec<Vec<AtomicU16>> {
        (0..listeners)
            .map(|_| (0..n).map(|_| AtomicU16::new(0)).collect())
            .collect()
    };
    let more_core_ports = unbound(config.listen_more.len());
    let kafka_more_core_ports = unbound(config.kafka_more.len());
    let remote = config
        .remote_storage
        .clone()
        .map(weir_tier::RemoteStore::open)
        .transpose()
        .context("--remote-storage")?;
    let shared = Arc::new(Shared {
        remote,
        node_tls,
        replication_core_ports: (0..n).map(|_| AtomicU16::new(0)).collect(),
        kafka_listen,
        config: BrokerConfig { listen, ..config },
        core_ports: (0..n).map(|_| AtomicU16::new(0)).collect(),
        kafka_core_ports: (0..n).map(|_| AtomicU16::new(0)).collect(),
        more_core_ports,
        kafka_more_core_ports,
        port: AtomicU16::new(listen.port()),
        stopping: stopping.clone(),
        metrics_port: AtomicU16::new(0),
        peer_of_core: (0..n)
            .map(|_| AtomicUsize::new(usize::MAX))
            .collect::<Vec<_>>()
            .into(),
        controller: controller.clone(),
        after_metadata: crate::service::remote::metadata_applied,
        client_tls,
        oauth,
        reload_tls: RELOAD_TLS.clone(),
        acls: Default::default(),
        quota_config: Default::default(),
        meters: Default::default(),
    });
    shared.publish_security(&shared.controller.state().security);
    let mesh: Mesh<CoreMsg> = MeshBuilder::full(n, MESH_CHANNEL_CAPACITY);
    let reply_mesh: Mesh<ReplyMsg> = MeshBuilder::full(n, MESH_CHANNEL_CAPACITY);
    let barrier = Arc::new(Barrier::new(n));
    let (ready_tx, ready_rx) = mpsc::channel::<anyhow::Result<usize>>();
    let cpus = std::thread::available_parallelism()
        .map(|c| c.get())
        .unwrap_or(1);
    let mut handles = Vec::new();
    for c in 0..n {
        let (shared, view, meshes, barrier, ready) = (
            shared.clone(),
            view.clone(),
            (mesh.clone(), reply_mesh.clone()),
            barrier.clone(),
            ready_tx.clone(),
        );
        let placement = if c < cpus {
            Placement::Fixed(c)
        } else {
            Placement::Unbound
        };
        let h = LocalExecutorBuilder::new(placement)
            .name(&format!("weir-core-{c}"))
            .spawn(move || async move {
                let r = core_main(c, shared.clone(), view, meshes, barrier, ready.clone()).await;
                // The other cores' waits for this one's answers end now.
                shared.peer_of_core[c].store(crate::shard::mesh::GONE, Ordering::Release);
                if let Err(e) = &r {
                    let _ = ready.send(Err(anyhow!("core {c}: {e:#}")));
                    shared.stopping.store(true, Ordering::Release);
                }
                r
            })
            .map_err(|e| {
                anyhow!(
                    "cannot start the executor for core {c}: {e}. Weir needs io_uring and \
                     locked memory for it: raise the limit with `ulimit -l unlimited` \
                     (systemd: LimitMEMLOCK=infinity) or use fewer cores (--cores)"
                )
            })?;
        handles.push(h);
    }
    drop(ready_tx);
    let mut first_err = None;
    for _ in 0..n {
        match ready_rx.recv() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                first_err = Some(e);
                break;
            }
            Err(_) => {
                first_err = Some(anyhow!("a core stopped before it was ready"));
                break;
            }
        }
    }
    drop(placeholder);
    drop(kafka);
    drop(placeholders);
    if let Some(e) = first_err {
        stopping.store(true, Ordering::Release);
        // The other cores stop at their next check of `stopping`, but one
        // may be inside a wait with a long deadline of its own (core 0
        // waits up to a minute for every core to apply the offsets topic):
        // report the failure after the drain limit rather than hang on it.
        let (done_tx, done_rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            for h in handles {
                let _ = h.join();
            }
            let _ = done_tx.send(());
        });
        if done_rx
            .recv_timeout(Duration::from_millis(DRAIN_MS_MAX))
            .is_err()
        {
            tracing::warn!(
                "cores still running {DRAIN_MS_MAX} ms after a failed start; reporting it anyway"
            );
        }
        return Err(e);
    }
    let ports: Vec<u16> = shared
        .core_ports
        .iter()
        .map(|p| p.load(Ordering::Acquire))
        .collect();
    ready(&ReadyInfo {
        listen,
        core_ports: ports.clone(),
        metrics: SocketAddr::new(
            shared.config.metrics_listen.ip(),
            shared.metrics_port.load(Ordering::Acquire),
        ),
        data_dir: shared.config.data_dir.clone(),
        otlp_grpc: shared.config.otlp.grpc.map(|l| l.addr),
        otlp_http: shared.config.otlp.http.map(|l| l.addr),
        kafka: kafka_listen,
        kafka_core_ports: shared
            .kafka_core_ports
            .iter()
            .map(|p| p.load(Ordering::Acquire))
            .filter(|_| kafka_listen.is_some() && shared.config.kafka_core_port_base.is_some())
            .collect(),
    });
    tracing::info!(%listen, cores = n, ?ports, "broker ready");
    let more = [
        (
            "native",
            &shared.config.listen_more,
            &shared.more_core_ports,
        ),
        (
            "Kafka",
            &shared.config.kafka_more,
            &shared.kafka_more_core_ports,
        ),
    ];
    for (family, listeners, ports) in more {
        for (l, ports) in listeners.iter().zip(ports) {
            let listener = format!("{}://{}", l.protocol.name(), l.addr);
            tracing::info!(family, listener, ports = ?loaded(ports), "further listener ready");
        }
    }
    // Registered again with the ports the cores bound (every listener's,
    // one after another).
    let mut node = controller.registered_info();
    node.core_ports = std::iter::once(&shared.core_ports)
        .chain(&shared.more_core_ports)
        .flat_map(|p| loaded(p))
        .collect();
    if kafka_listen.is_some() && shared.config.kafka_core_port_base.is_some() {
        node.kafka_core_ports = std::iter::once(&shared.kafka_core_ports)
            .chain(&shared.kafka_more_core_ports)
            .flat_map(|p| loaded(p))
            .collect();
    }
    node.replication_core_ports = advertised_replication_ports(&shared);
    controller.update_node(node);
    let mut result = Ok(());
    for (c, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => result = result.and(Err(e)),
            Err(e) => result = result.and(Err(anyhow!("core {c} panicked: {e:?}"))),
        }
    }
    if result.is_ok() {
        tracing::info!("broker stopped cleanly");
    }
    result
}

/// Ports as the cores stored them.
fn loaded(ports: &[AtomicU16]) -> Vec<u16> {
    ports.iter().map(|p| p.load(Ordering::Acquire)).collect()
}

/// The per-core replication ports other nodes are told: the advertised
/// replication port plus 1 + core when the cores bind the replication
/// port plus 1 + core (the default; so a proxy or NAT in front of the node
/// maps them the same way as the controller's port), else the bound ports.
fn advertised_replication_ports(shared: &Shared) -> Vec<u16> {
    let bound: Vec<u16> = shared
        .replication_core_ports
        .iter()
        .map(|p| p.load(Ordering::Acquire))
        .collect();
    let c = &shared.config.cluster;
    let advertised = c
        .replication_advertised
        .as_deref()
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse::<u16>().ok());
    match (c.replication_core_port_base, advertised) {
        (None, Some(port)) if c.replication_listen.port() != 0 => (0..bound.len())
            .map(|i| port.saturating_add(1 + i as u16))
            .collect(),
        _ => bound,
    }
}

async fn core_main(
    c: usize,
    shared: Arc<Shared>,
    view: Arc<MetadataView>,
    (mesh, reply_mesh): (Mesh<CoreMsg>, Mesh<ReplyMsg>),
    barrier: Arc<Barrier>,
    ready: mpsc::Sender<anyhow::Result<usize>>,
) -> anyhow::Result<()> {
    let (senders, receivers) = mesh
        .join()
        .await
        .map_err(|_| anyhow!("joining the cross-core mesh failed"))?;
    let (reply_senders, reply_receivers) = reply_mesh
        .join()
        .await
        .map_err(|_| anyhow!("joining the cross-core reply mesh failed"))?;
    // Both meshes are built in the same order, so a core has the same peer
    // id in both.
    assert_eq!(senders.peer_id(), reply_senders.peer_id());
    shared.peer_of_core[c].store(senders.peer_id(), Ordering::Release);
    // Every core must know every other core's mesh id before routing.
    barrier.wait();
    let core_mesh = mesh::Mesh::new(c, shared.peer_of_core.clone(), senders, reply_senders);
    let core = Core::start(c, shared.clone(), view, core_mesh.clone()).await?;
    mesh::serve(
        core_mesh,
        core.clone(),
        receivers,
        reply_receivers,
        |core, msg| async move { crate::service::remote::handle(&core, msg).await },
    );
    if c == 0 {
        crate::metadata::writer::start(&core);
    }
    crate::coordinator::start(&core).await?;
    let tls_for = |p: tls::SecurityProtocol| p.tls().then(|| shared.client_tls.clone()).flatten();
    let listen = shared.config.listen;
    let shared_l = bind_shared(listen, c, "on")?;
    let (own_l, own_port) = bind_core_port(
        listen.ip(),
        shared.config.core_port_base,
        c,
        "--core-port-base",
    )?;
    shared.core_ports[c].store(own_port, Ordering::Release);
    if c == 0 {
        let addr = shared.config.metrics_listen;
        let l = TcpListener::bind(addr)
            .map_err(std::io::Error::from)
            .with_context(|| format!("cannot listen for metrics on {addr}"))?;
        let port = l.local_addr().map_err(std::io::Error::from)?.port();
        shared.metrics_port.store(port, Ordering::Release);
        let tls = tls_for(shared.config.metrics_protocol);
        glommio::spawn_local(crate::listener::http::serve_http(core.clone(), l, tls)).detach();
    }
    glommio::spawn_local(retention_loop(core.clone())).detach();
    if shared.remote.is_some() {
        glommio::spawn_local(crate::tier::upload::task_loop(core.clone())).detach();
    }
    {
        // This core's replication endpoint: the replication address's IP,
        // its port + 1 + core (free ports when that port is 0, or with
        // --replication-core-port-base 0).
        let r = shared.config.cluster.replication_listen;
        let port = match shared.config.cluster.replication_core_port_base {
            Some(0) => 0,
            Some(base) => base.saturating_add(c as u16),
            None if r.port() == 0 => 0,
            None => r.port().saturating_add(1 + c as u16),
        };
        let addr = SocketAddr::new(r.ip(), port);
        let bound = crate::replica::serve::start(&core, addr).with_context(|| {
            format!("core {c} cannot listen for replication (QUIC) on {addr} (--replication-core-port-base)")
        })?;
        shared.replication_core_ports[c].store(bound, Ordering::Release);
        glommio::spawn_local(crate::replica::isr_loop(core.clone())).detach();
        glommio::spawn_local(crate::share::service::expiry_loop(core.clone())).detach();
    }
    {
        let shared = shared.clone();
        let stalls = core.metrics.stalls.clone();
        glommio::spawn_local(crate::shard::stalls::watch(c, stalls, move || {
            shared.stopping()
        }))
        .detach();
    }
    {
        let shared = shared.clone();
        core.storage
            .start_cleaner(
                Duration::from_millis(shared.config.log_cleaner_backoff_ms),
                move || shared.stopping(),
            )
            .context("starting the cleaner")?;
    }
    if c == 0 && shared.client_tls.is_some() {
        glommio::spawn_local(tls_reload_loop(core.clone())).detach();
    }
    let active = Rc::new(std::cell::Cell::new(0usize));
    let mut native = vec![(shared_l, own_l, shared.config.listen_protocol)];
    for (k, more) in shared.config.listen_more.iter().enumerate() {
        let shared_l = bind_shared(more.addr, c, "on")?;
        let base = further_base(shared.config.core_port_base, k + 1, shared.config.cores);
        let (own_l, port) = bind_core_port(more.addr.ip(), base, c, "--core-port-base")?;
        shared.more_core_ports[k][c].store(port, Ordering::Release);
        native.push((shared_l, own_l, more.protocol));
    }
    for (shared_l, own_l, security) in native {
        for (l, owner_only) in [(shared_l, false), (own_l, true)] {
            let (core, active) = (core.clone(), active.clone());
            let ctx = Ctx { owner_only };
            let tls = tls_for(security);
            glommio::spawn_local(accept_loop(core, l, active, ctx, Native, security, tls)).detach();
        }
    }
    for (l, receiver, what) in [
        (shared.config.otlp.grpc, Receiver::Grpc, "for OTLP/gRPC on"),
        (shared.config.otlp.http, Receiver::Http, "for OTLP/HTTP on"),
    ] {
        if let Some(l) = l {
            let listener = bind_shared(l.addr, c, what)?;
            let tls = tls_for(l.protocol);
            let serve = serve_otlp(core.clone(), listener, receiver, l.protocol, tls);
            glommio::spawn_local(serve).detach();
        }
    }
    if let Some(addr) = shared.kafka_listen {
        let first = (addr, shared.config.kafka_protocol, &shared.kafka_core_ports);
        let more = shared
            .config
            .kafka_more
            .iter()
            .zip(&shared.kafka_more_core_ports)
            .map(|(l, ports)| (l.addr, l.protocol, ports));
        for (k, (addr, security, ports)) in std::iter::once(first).chain(more).enumerate() {
            let l = bind_shared(addr, c, "for Kafka clients on")?;
            let (core, active) = (core.clone(), active.clone());
            // Partitions of other cores are served through the mesh: on the
            // shared port, and on a core's own port for a client whose
            // metadata is stale.
            let ctx = Ctx { owner_only: false };
            let tls = tls_for(security);
            let accept = accept_loop(
                core.clone(),
                l,
                active.clone(),
                ctx,
                Kafka,
                security,
                tls.clone(),
            );
            glommio::spawn_local(accept).detach();
            if let Some(base) = shared.config.kafka_core_port_base {
                let base = further_base(base, k, shared.config.cores);
                let (l, port) = bind_core_port(addr.ip(), base, c, "--kafka-core-port-base")?;
                ports[c].store(port, Ordering::Release);
                glommio::spawn_local(accept_loop(core, l, active, ctx, Kafka, security, tls))
                    .detach();
            }
        }
    }
    let _ = ready.send(Ok(c));
    while !shared.stopping() {
        glommio::timer::sleep(Duration::from_millis(STOP_POLL_MS)).await;
    }
    // Stop: accept loops end at their next wake-up; let requests in flight finish.
    let deadline = std::time::Instant::now() + Duration::from_millis(DRAIN_MS_MAX);
    while active.get() > 0 && std::time::Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    if c == 0 {
        crate::metadata::writer::stop(&core);
    }
    core.close_all().await;
    tracing::info!(core = c, "core stopped");
    Ok(())
}

/// Core `c`'s socket on a listener's shared address (SO_REUSEPORT);
/// `what` says what it is for in errors ("on", "for Kafka clients on").
fn bind_shared(addr: SocketAddr, c: usize, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .map_err(std::io::Error::from)
        .with_context(|| format!("core {c} cannot listen {what} {addr}"))
}

/// The first per-core port of a family's listener `k` (0: the first
/// listener): each further listener's per-core ports follow the one
/// before's (`base + k × cores`); 0 stays 0 (free ports).
fn further_base(base: u16, k: usize, cores: usize) -> u16 {
    if base == 0 {
        return 0;
    }
    base.saturating_add(u16::try_from(k * cores).unwrap_or(u16::MAX))
}

/// Binds core `c`'s own port, `base + c` (`base` 0: a free port), on
/// `ip`; the listener and the port it got. `flag` names the setting in
/// errors.
fn bind_core_port(
    ip: std::net::IpAddr,
    base: u16,
    c: usize,
    flag: &str,
) -> anyhow::Result<(TcpListener, u16)> {
    let port = match base {
        0 => 0,
        b => b
            .checked_add(c as u16)
            .ok_or_else(|| anyhow!("{flag} {b} + core {c} overflows"))?,
    };
    let addr = SocketAddr::new(ip, port);
    let l = TcpListener::bind(addr)
        .map_err(std::io::Error::from)
        .with_context(|| {
            format!("core {c} cannot listen on its own port {addr} ({flag}: another base, or 0 for free ports)")
        })?;
    let port = l.local_addr().map_err(std::io::Error::from)?.port();
    Ok((l, port))
}

/// Applies `retention.ms` / `retention.bytes` to this core's partitions
/// every `--retention-check-ms` (Kafka's `log.retention.check.interval.ms`).
async fn retention_loop(core: Rc<Core>) {
    loop {
        let mut waited = 0;
        while waited < core.shared.config.retention_check_ms {
            if core.shared.stopping() {
                return;
            }
            glommio::timer::sleep(Duration::from_millis(STOP_POLL_MS)).await;
            waited += STOP_POLL_MS;
        }
        let logs: Vec<_> = core.logs.borrow().values().cloned().collect();
        for log in logs {
            if let Err(e) = log.enforce_retention().await {
                tracing::warn!(partition = log.name(), error = %e, "retention pass failed");
            }
        }
    }
}

async fn accept_loop<P: crate::listener::connection::Protocol>(
    core: Rc<Core>,
    listener: TcpListener,
    active: Rc<std::cell::Cell<usize>>,
    ctx: Ctx,
    proto: P,
    security: tls::SecurityProtocol,
    tls: Option<Arc<tls::ServerTls>>,
) {
    loop {
        let Some(r) = crate::listener::accept_or_stop(&core, &listener).await else {
            return;
        };
        match r {
            Ok(stream) => {
                if crate::listener::at_connection_limit(&core, "client") {
                    drop(stream);
                    continue;
                }
                core.connections.set(core.connections.get() + 1);
                let m = &core.metrics.connections;
                m.set(m.get() + 1);
                let (core, active) = (core.clone(), active.clone());
                let acceptor = tls.as_ref().map(|t| t.acceptor());
                glommio::spawn_local(async move {
                    let peer = stream
                        .peer_addr()
                        .map(|a| a.to_string())
                        .unwrap_or_else(|_| "?".into());
                    let _ = stream.set_nodelay(true);
                    use crate::listener::connection::serve;
                    let c = core.clone();
                    use crate::service::auth::Session;
                    let login = Duration::from_millis(core.shared.config.sasl.login_timeout_ms);
                    match acceptor {
                        None => {
                            let session = Session::new(peer.clone(), security, login);
                            serve(c, proto, stream, session, active, ctx).await
                        }
                        Some(tls) => {
                            let failures = &core.metrics.tls_handshake_failures;
                            // rustls reads at most one record (often 4 KiB) per
                            // `read_tls`: on the bare socket, a recv syscall
                            // each. Read ahead into a buffer instead.
                            let buf = glommio::net::Preallocated::new(tls::READ_BUFFER_BYTES);
                            let stream = stream.buffered_with(buf);
                            let Some(stream) = tls::handshake(tls, stream, &peer, failures).await
                            else {
                                core.connections.set(core.connections.get() - 1);
                                return;
                            };
                            // A client certificate names the principal.
                            let Some(certificate) = principal::admit(
                                &core.shared.config.ssl_principal_rules,
                                stream.get_ref().1.peer_certificates(),
                                failures,
                                &peer,
                                "client",
                            ) else {
                                core.connections.set(core.connections.get() - 1);
                                return;
                            };
                            let session =
                                Session::with_principal(peer.clone(), security, login, certificate);
                            serve(c, proto, stream, session, active, ctx).await
                        }
                    }
                    core.connections.set(core.connections.get() - 1);
                })
                .detach();
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Set by SIGHUP (`weir broker` only): read the certificate files again.
static RELOAD_TLS: std::sync::LazyLock<Arc<AtomicBool>> =
    std::sync::LazyLock::new(|| Arc::new(AtomicBool::new(false)));

/// Core 0, with SSL:// listeners: reads the certificate files again on
/// SIGHUP or when one changes (looked at every `RELOAD_CHECK_MS`, on the
/// blocking pool); a failed reload keeps the configuration that works.
async fn tls_reload_loop(core: Rc<Core>) {
    let Some(t) = core.shared.client_tls.clone() else {
        return;
    };
    while !core.shared.stopping() {
        glommio::timer::sleep(Duration::from_millis(tls::RELOAD_CHECK_MS)).await;
        let signalled = core.shared.reload_tls.swap(false, Ordering::AcqRel);
        // File system calls on the blocking pool, never on the core's loop.
        let check = t.clone();
        if !signalled && !on_blocking_pool(move || check.changed()).await {
            continue;
        }
        let load = t.clone();
        match on_blocking_pool(move || load.reload()).await {
            Ok(()) => tracing::info!(signalled, "client listeners' TLS certificate reloaded"),
            Err(e) => tracing::error!(
                error = format!("{e:#}"),
                "client listeners' TLS certificate not reloaded: the previous one stays"
            ),
        }
    }
}

/// The first log line: what listens where, in which security protocol.
fn say_listeners(config: &BrokerConfig) {
    let more = |first: (tls::SecurityProtocol, SocketAddr), more: &[config::MoreListener]| {
        std::iter::once(first)
            .chain(more.iter().map(|l| (l.protocol, l.addr)))
            .collect::<Vec<_>>()
    };
    let native = more((config.listen_protocol, config.listen), &config.listen_more);
    let kafka = match config.kafka_listener {
        Some(a) => more((config.kafka_protocol, a), &config.kafka_more),
        None => Vec::new(),
    };
    let named = |all: &[(tls::SecurityProtocol, SocketAddr)]| {
        all.iter()
            .map(|(p, a)| format!("{}://{a}", p.name()))
            .collect::<Vec<_>>()
            .join(",")
    };
    let plain_public = native
        .iter()
        .chain(&kafka)
        .any(|(p, a)| *p == tls::SecurityProtocol::Plaintext && !a.ip().is_loopback());
    let kafka = if kafka.is_empty() {
        "off".to_string()
    } else {
        named(&kafka)
    };
    tracing::info!(
        native = named(&native),
        kafka,
        metrics = format!(
            "{}://{}",
            config.metrics_protocol.name(),
            config.metrics_listen
        ),
        sasl_mechanisms = config
            .sasl
            .mechanisms
            .iter()
            .map(|m| m.name())
            .collect::<Vec<_>>()
            .join(","),
        authorizer = if config.authorization.enabled {
            "acl"
        } else {
            "none"
        },
        "client listeners"
    );
    if !config.authorization.enabled {
        tracing::info!(
            "no authorizer: every client that connects (and logs in, where asked) may do anything \
             (--authorizer acl checks ACLs: see docs/security.md)"
        );
    }
    if plain_public {
        tracing::warn!(
            "a PLAINTEXT listener is on a non-loopback address: anyone who reaches it can read \
             and write every topic (SSL:// listeners: see docs/security.md)"
        );
    }
}
