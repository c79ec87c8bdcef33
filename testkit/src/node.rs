//! A `weir broker` process: started, waited for until its ready line, and
//! known by the addresses that line gives.
//!
//! The broker prints one line on stdout once every core listens:
//!
//! ```text
//! weir broker ready: listen=127.0.0.1:P cores=N core_ports=[a, b] metrics=127.0.0.1:M kafka=127.0.0.1:K kafka_core_ports=[c, d] data_dir=PATH
//! ```
//!
//! This crate does not build the binary: callers pass its path, the
//! broker crate's tests `env!("CARGO_BIN_EXE_weir")`, other crates'
//! [`weir_bin`].

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::process::{Log, Process};

/// What the ready line starts with.
pub const READY: &str = "weir broker ready:";

/// Longest wait for a node's ready line.
pub const READY_WITHIN: Duration = Duration::from_secs(60);

/// The `weir` binary, for tests of crates that do not build it (and so
/// cannot name it with `CARGO_BIN_EXE_weir`): `WEIR_BIN` if set, else the
/// `weir` in the test's own profile directory (`target/debug/weir` for
/// `cargo test`, `target/release/weir` for `cargo bench`), which
/// `cargo test --workspace` builds before running any test. A missing
/// binary fails the test with the command that builds it (cargo cannot be
/// run from inside `cargo test`: the build directory is locked).
pub fn weir_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("WEIR_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test's own path");
    // <target>/<profile>/deps/<test>-<hash>, or <target>/<profile>/examples/<name>
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test binary lives two levels under the target dir");
    let bin = profile.join("weir");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p weir-broker --bin weir{}` \
         (same CARGO_TARGET_DIR), or set WEIR_BIN",
        bin.display(),
        if profile.ends_with("release") {
            " --release"
        } else {
            ""
        }
    );
    bin
}

/// A running `weir broker` that printed its ready line. Dropped, it is
/// killed (SIGKILL).
#[derive(Debug)]
pub struct Node {
    process: Process,
    /// The shared native listener.
    pub listen: SocketAddr,
    /// Each core's own native port (only its own partitions).
    pub core_ports: Vec<u16>,
    /// The metrics endpoint (`GET /metrics`, see [`crate::scrape`]).
    pub metrics: SocketAddr,
    /// The Kafka listener (every test node runs one: a node started with
    /// `kafka_listener = "off"` fails [`NodeBuilder::start`]).
    pub kafka: SocketAddr,
    /// Each core's own Kafka port.
    pub kafka_core_ports: Vec<u16>,
    /// The OTLP/gRPC receiver (off unless [`NodeBuilder::otlp`]).
    pub otlp_grpc: Option<SocketAddr>,
    /// The OTLP/HTTP receiver (off unless [`NodeBuilder::otlp`]).
    pub otlp_http: Option<SocketAddr>,
    /// The data directory.
    pub data_dir: PathBuf,
}

impl Node {
    /// `weir broker` at `weir` (a path), configured by the builder's
    /// methods; by default on loopback with every listener on a port the
    /// kernel picks, its log (stderr) at `WEIR_LOG=warn` with the test's
    /// output.
    pub fn builder(weir: impl Into<PathBuf>) -> NodeBuilder {
        NodeBuilder {
            weir: weir.into(),
            name: "weir broker".into(),
            config: None,
            data_dir: None,
            cores: None,
            listen: None,
            core_port_base: None,
            args: Vec::new(),
            env: vec![("WEIR_LOG".into(), "warn".into())],
            log: Log::Inherit,
            ready_within: READY_WITHIN,
            netns: None,
            otlp: None,
        }
    }

    /// The process (to signal it, wait for it, read its log).
    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// SIGSTOP: see [`Process::pause`].
    pub fn pause(&self) {
        self.process.pause();
    }

    /// SIGCONT: see [`Process::resume`].
    pub fn resume(&self) {
        self.process.resume();
    }

    /// Its exit status if it has exited, without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.process.try_wait()
    }

    /// SIGTERM and a bounded wait: see [`Process::stop`].
    pub fn stop(self) -> ExitStatus {
        self.process.stop()
    }

    /// SIGKILL and a bounded wait: see [`Process::kill`].
    pub fn kill(self) {
        self.process.kill();
    }

    /// What it logged so far (see [`Process::log`]).
    pub fn log(&self) -> String {
        self.process.log()
    }
}

/// How to start a [`Node`]: see [`Node::builder`].
#[derive(Debug, Clone)]
pub struct NodeBuilder {
    weir: PathBuf,
    name: String,
    config: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    cores: Option<usize>,
    listen: Option<SocketAddr>,
    core_port_base: Option<u16>,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    log: Log,
    ready_within: Duration,
    netns: Option<String>,
    otlp: Option<(String, String)>,
}

impl NodeBuilder {
    /// Runs the OTLP receivers (gRPC and HTTP) on ports the kernel picks;
    /// without this (or [`NodeBuilder::otlp_listen`]) a test node runs
    /// none, whatever its config file says.
    pub fn otlp(self) -> Self {
        self.otlp_listen("127.0.0.1:0", "127.0.0.1:0")
    }

    /// The OTLP receivers' `--otlp-grpc-listen` and `--otlp-http-listen`
    /// values (`off`, an address, `SSL://address`).
    pub fn otlp_listen(mut self, grpc: impl Into<String>, http: impl Into<String>) -> Self {
        self.otlp = Some((grpc.into(), http.into()));
        self
    }

    /// Runs the node inside network namespace `ns` (`ip netns exec NS
    /// weir …`, which execs: the PID is the node's); see [`crate::netns`].
    pub fn netns(mut self, ns: impl Into<String>) -> Self {
        self.netns = Some(ns.into());
        self
    }

    /// Names the node in panics ("node 2"; "weir broker" unless set).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// `--config FILE`. The file then names the listeners: the builder
    /// passes none but those set with [`NodeBuilder::listen`] and
    /// [`NodeBuilder::core_port_base`].
    pub fn config(mut self, file: impl Into<PathBuf>) -> Self {
        self.config = Some(file.into());
        self
    }

    /// `--data-dir DIR`.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// `--cores N`.
    pub fn cores(mut self, cores: usize) -> Self {
        self.cores = Some(cores);
        self
    }

    /// `--listen ADDR` (default without a config file: `127.0.0.1:0`).
    /// A port fixed in advance comes from [`crate::ports`].
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }

    /// `--core-port-base PORT` (default without a config file: 0, a port
    /// the kernel picks per core). A port fixed in advance comes from
    /// [`crate::ports`].
    pub fn core_port_base(mut self, port: u16) -> Self {
        self.core_port_base = Some(port);
        self
    }

    /// More arguments of `weir broker` (not the listeners': see
    /// [`NodeBuilder::listen`], [`NodeBuilder::core_port_base`]).
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// An environment variable of the process (`WEIR_LOG` replaces the
    /// default `warn`).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Where its log (stderr) goes (default: the test's stderr).
    pub fn log(mut self, log: Log) -> Self {
        self.log = log;
        self
    }

    /// Its log (stderr) to `file`, which [`Node::log`] reads.
    pub fn log_to(self, file: impl Into<PathBuf>) -> Self {
        self.log(Log::File(file.into()))
    }

    /// How long [`NodeBuilder::start`] waits for the ready line (default
    /// [`READY_WITHIN`]).
    pub fn ready_within(mut self, limit: Duration) -> Self {
        self.ready_within = limit;
        self
    }

    /// The command line this builder runs.
    pub fn command(&self) -> Command {
        let mut c = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.weir);
                c
            }
            None => Command::new(&self.weir),
        };
        c.arg("broker");
        if let Some(file) = &self.config {
            c.arg("--config").arg(file);
        }
        if let Some(dir) = &self.data_dir {
            c.arg("--data-dir").arg(dir);
        }
        if let Some(n) = self.cores {
            c.args(["--cores", &n.to_string()]);
        }
        let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let defaults = self.config.is_none();
        if let Some(a) = self.listen.or(defaults.then_some(any)) {
            c.args(["--listen", &a.to_string()]);
        }
        if let Some(p) = self.core_port_base.or(defaults.then_some(0)) {
            c.args(["--core-port-base", &p.to_string()]);
        }
        if defaults {
            c.args(["--metrics-listen", &any.to_string()]);
            c.args(["--kafka-listener", &any.to_string()]);
        }
        // Off unless asked: OTLP's default ports are fixed, and tests run
        // side by side.
        let (grpc, http) = self.otlp.clone().unwrap_or(("off".into(), "off".into()));
        c.args(["--otlp-grpc-listen", &grpc, "--otlp-http-listen", &http]);
        c.args(&self.args);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// Starts the process without waiting for it to be ready (its stdout
    /// drained): for a node that is not meant to become ready.
    pub fn spawn(self) -> Process {
        self.spawn_reporting_ready().0
    }

    /// Starts the process; the receiver gets the ready line, or is
    /// dropped when stdout closes first.
    fn spawn_reporting_ready(self) -> (Process, mpsc::Receiver<String>) {
        let mut child = self
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(self.log.stdio())
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.weir.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || drain(stdout, tx));
        (Process::new(child, self.name, self.log), rx)
    }

    /// Starts the node and waits (at most [`NodeBuilder::ready_within`])
    /// for its ready line; the error says why it is not ready (it exited,
    /// or time ran out and it was killed) with its log, if that went to a
    /// file.
    pub fn try_start(self) -> Result<Node, StartError> {
        let within = self.ready_within;
        let (mut process, ready) = self.spawn_reporting_ready();
        let (mut why, exiting) = match ready.recv_timeout(within) {
            Ok(line) => match Ready::parse(&line) {
                Ok(r) => {
                    return Ok(Node {
                        process,
                        listen: r.listen,
                        core_ports: r.core_ports,
                        metrics: r.metrics,
                        kafka: r.kafka,
                        kafka_core_ports: r.kafka_core_ports,
                        otlp_grpc: r.otlp_grpc,
                        otlp_http: r.otlp_http,
                        data_dir: r.data_dir,
                    })
                }
                Err(e) => (format!("{e}: `{line}`"), false),
            },
            Err(mpsc::RecvTimeoutError::Timeout) => {
                (format!("no ready line within {within:?}"), false)
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => (
                "it closed its stdout without a ready line".to_string(),
                true,
            ),
        };
        // Exiting (its stdout closed): a moment to do so; else killed.
        let status = if exiting {
            process.wait_within(Duration::from_secs(10))
        } else {
            None
        };
        if status.is_none() {
            why.push_str(" (killed)");
            process.end();
        }
        Err(StartError {
            name: process.name().to_string(),
            status,
            why,
            log: process.log(),
        })
    }

    /// [`NodeBuilder::try_start`] that must succeed.
    pub fn start(self) -> Node {
        self.try_start().unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Reads `stdout` to its end (so the process never blocks writing it),
/// sending the ready line on `ready`.
fn drain(stdout: impl Read, ready: mpsc::Sender<String>) {
    let mut ready = Some(ready);
    let mut out = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        match out.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        if text.starts_with(READY) {
            if let Some(tx) = ready.take() {
                let _ = tx.send(text.trim_end().to_string());
            }
        }
    }
}

/// Why a node did not start.
#[derive(Debug)]
pub struct StartError {
    /// The node's name.
    pub name: String,
    /// Its exit status if it exited by itself (`None`: the harness
    /// killed it).
    pub status: Option<ExitStatus>,
    /// What went wrong.
    pub why: String,
    /// What it logged, if its log went to a file.
    pub log: String,
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} did not become ready: {}", self.name, self.why)?;
        if let Some(s) = self.status {
            write!(f, " (exit status {s})")?;
        }
        if !self.log.is_empty() {
            write!(f, "; its log:\n{}", self.log)?;
        }
        Ok(())
    }
}

impl std::error::Error for StartError {}

/// The addresses of a ready line.
#[derive(Debug, PartialEq)]
struct Ready {
    listen: SocketAddr,
    core_ports: Vec<u16>,
    metrics: SocketAddr,
    kafka: SocketAddr,
    kafka_core_ports: Vec<u16>,
    otlp_grpc: Option<SocketAddr>,
    otlp_http: Option<SocketAddr>,
    data_dir: PathBuf,
}

impl Ready {
    fn parse(line: &str) -> Result<Ready, String> {
        let mut rest = line
            .strip_prefix(READY)
            .ok_or("not a ready line")?
            .trim_start();
        let mut fields = std::collections::HashMap::new();
        while !rest.is_empty() {
            let (key, after) = rest.split_once('=').ok_or("a field without `=`")?;
            let (value, next) = if key == "data_dir" {
                // The last field: a path, spaces and all.
                (after, "")
            } else if let Some(list) = after.strip_prefix('[') {
                let end = list.find(']').ok_or("a list without `]`")?;
                (&list[..end], &list[end + 1..])
            } else {
                after.split_at(after.find(' ').unwrap_or(after.len()))
            };
            fields.insert(key, value);
            rest = next.trim_start();
        }
        let field = |k: &str| fields.get(k).copied().ok_or(format!("no {k}="));
        let addr = |k: &str| -> Result<SocketAddr, String> {
            let v = field(k)?;
            v.parse().map_err(|e| format!("{k}={v}: {e}"))
        };
        let ports = |k: &str| -> Result<Vec<u16>, String> {
            let v = field(k)?;
            v.split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| p.parse().map_err(|e| format!("{k}=[{v}]: {e}")))
                .collect()
        };
        if field("kafka")? == "off" {
            return Err(
                "the node runs without its Kafka listener (kafka=off), which every test node has"
                    .into(),
            );
        }
        // Optional (`off`, or absent in a line of an older broker).
        let maybe = |k: &str| match fields.get(k) {
            None | Some(&"off") => Ok(None),
            Some(_) => addr(k).map(Some),
        };
        Ok(Ready {
            listen: addr("listen")?,
            core_ports: ports("core_ports")?,
            metrics: addr("metrics")?,
            kafka: addr("kafka")?,
            kafka_core_ports: ports("kafka_core_ports")?,
            otlp_grpc: maybe("otlp_grpc")?,
            otlp_http: maybe("otlp_http")?,
            data_dir: PathBuf::from(field("data_dir")?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_line_gives_every_address() {
        let line = "weir broker ready: listen=127.0.0.1:9292 cores=2 core_ports=[9300, 9301] \
                    metrics=127.0.0.1:9644 kafka=127.0.0.1:9092 kafka_core_ports=[9500, 9501] \
                    data_dir=/tmp/a dir/x";
        assert_eq!(
            Ready::parse(line).unwrap(),
            Ready {
                listen: "127.0.0.1:9292".parse().unwrap(),
                core_ports: vec![9300, 9301],
                metrics: "127.0.0.1:9644".parse().unwrap(),
                kafka: "127.0.0.1:9092".parse().unwrap(),
                kafka_core_ports: vec![9500, 9501],
                otlp_grpc: None,
                otlp_http: None,
                data_dir: PathBuf::from("/tmp/a dir/x"),
            }
        );
        let otlp = line.replace(
            " data_dir",
            " otlp_grpc=127.0.0.1:4317 otlp_http=off data_dir",
        );
        let r = Ready::parse(&otlp).unwrap();
        assert_eq!(
            (r.otlp_grpc, r.otlp_http),
            (Some("127.0.0.1:4317".parse().unwrap()), None)
        );
        let no_core_ports = line.replace("kafka_core_ports=[9500, 9501]", "kafka_core_ports=[]");
        assert_eq!(Ready::parse(&no_core_ports).unwrap().kafka_core_ports, []);
        let off = line.replace("kafka=127.0.0.1:9092", "kafka=off");
        assert!(Ready::parse(&off).unwrap_err().contains("kafka=off"));
    }

    /// A stand-in for `weir` in a fresh directory: a shell script.
    fn fake_weir(script: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("weir");
        std::fs::write(&bin, format!("#!/bin/sh\n{script}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        (dir, bin)
    }

    #[test]
    fn a_node_is_started_from_its_ready_line_paused_and_stopped() {
        let (dir, weir) = fake_weir(
            "echo starting; echo \"$@\" >&2; \
             echo 'weir broker ready: listen=127.0.0.1:1 cores=1 core_ports=[2] metrics=127.0.0.1:3 \
             kafka=127.0.0.1:4 kafka_core_ports=[5] data_dir=/d'; exec sleep 60",
        );
        let log = dir.path().join("log");
        let mut node = Node::builder(weir)
            .data_dir("/d")
            .cores(1)
            .args(["--x", "y"])
            .log_to(&log)
            .start();
        assert_eq!(node.listen, "127.0.0.1:1".parse().unwrap());
        assert_eq!(
            (node.core_ports.clone(), node.kafka_core_ports.clone()),
            (vec![2], vec![5])
        );
        assert_eq!(
            node.log().trim(),
            "broker --data-dir /d --cores 1 --listen 127.0.0.1:0 --core-port-base 0 \
             --metrics-listen 127.0.0.1:0 --kafka-listener 127.0.0.1:0 \
             --otlp-grpc-listen off --otlp-http-listen off --x y"
        );
        node.pause();
        assert_eq!(node.process().wait_within(Duration::from_millis(50)), None);
        node.resume();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(node.stop().signal(), Some(libc::SIGTERM));
    }

    #[test]
    fn a_start_that_fails_says_how_and_what_was_logged() {
        let (dir, weir) = fake_weir("echo no such luck >&2; exit 3");
        let e = Node::builder(weir)
            .log_to(dir.path().join("log"))
            .try_start()
            .unwrap_err();
        assert_eq!(e.status.and_then(|s| s.code()), Some(3), "{e}");
        assert!(e.log.contains("no such luck"), "{e}");
        let (_dir, weir) = fake_weir("exec sleep 60");
        let e = Node::builder(weir)
            .ready_within(Duration::from_millis(200))
            .try_start()
            .unwrap_err();
        assert_eq!(e.status, None, "killed: {e}");
        assert!(e.why.contains("no ready line within"), "{e}");
    }
}
