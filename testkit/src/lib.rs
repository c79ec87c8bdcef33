//! What Weir's tests share, whatever crate they test (a dev-dependency
//! only):
//!
//! - [`Node`]: a `weir broker` process, started from a [`NodeBuilder`]
//!   and known by the addresses of its ready line; stopped (SIGTERM),
//!   killed (SIGKILL), paused (SIGSTOP) and resumed by PID, each wait
//!   bounded ([`process`]);
//! - [`wait_until`] / [`poll_until`]: waiting for a condition with a
//!   deadline, the way tests synchronise ([`wait`]);
//! - [`ports`]: ports fixed in advance, below the kernel's ephemeral range;
//! - [`checker`]: a Jepsen-style queue checker (histories of acks and
//!   polls against every replica's final log, every anomaly counted);
//! - [`disk`]: a small loop-device disk for one node, to fill and to slow
//!   down;
//! - [`netns`]: a cluster's own network (namespaces on a bridge) and its
//!   faults (partitions, one-way cuts, packet loss) with nftables;
//! - [`scrape`] (a node's `/metrics`), [`runtime`] (the SDK tests' tokio
//!   runtime), [`weir_bin`] (the binary, for crates that do not build it).
#![warn(missing_docs)]

pub mod checker;
pub mod disk;
pub mod netns;
pub mod node;
pub mod ports;
pub mod process;
pub mod wait;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

pub use node::{weir_bin, Node, NodeBuilder, StartError};
pub use process::{Log, Process};
pub use wait::{poll_until, wait_until};

/// Runs `program args` to its end: its stdout, or an error naming the
/// command and what it printed on stderr (the net and disk harnesses'
/// `ip`, `nft`, `mkfs.ext4`, `mount`, …).
pub(crate) fn run_command(program: &str, args: &[&str]) -> std::io::Result<String> {
    let out = std::process::Command::new(program).args(args).output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A tokio runtime for SDK clients in tests: 2 workers, like the machine.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `GET /metrics` from a node's metrics address: the whole HTTP answer.
pub fn scrape(metrics: SocketAddr) -> String {
    let mut s = TcpStream::connect(metrics)
        .unwrap_or_else(|e| panic!("connecting to the metrics endpoint {metrics}: {e}"));
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}
