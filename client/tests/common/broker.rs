//! A real `weir broker` process on loopback for the client's tests.
//!
//! The `weir` binary belongs to the broker crate, so these tests cannot
//! name it with `CARGO_BIN_EXE_weir`. They take `WEIR_BIN` if set, else the
//! `weir` next to the test's own profile directory (`target/debug/weir`
//! for `cargo test`, `target/release/weir` for `cargo bench`), which
//! `cargo test --workspace` builds before running any test. A missing
//! binary fails the test with the command that builds it (cargo cannot be
//! run from inside `cargo test`: the build directory is locked).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest wait for a broker's ready line.
pub const BROKER_START_MS_MAX: u64 = 60_000;

/// The `weir` binary to run.
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

/// A running `weir broker` (killed when dropped).
pub struct Broker {
    pub child: Child,
    /// The shared native listener.
    pub addr: SocketAddr,
    pub dir: PathBuf,
}

impl Broker {
    /// Starts a broker over `dir` with `cores` cores, listening on
    /// `127.0.0.1:port` (0: any free port), and waits for its ready line.
    pub fn start(dir: &Path, cores: usize, port: u16) -> Broker {
        let mut child = Command::new(weir_bin())
            .args([
                "broker",
                "--data-dir",
                dir.to_str().unwrap(),
                "--cores",
                &cores.to_string(),
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--core-port-base",
                "0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--kafka-listener",
                "127.0.0.1:0",
            ])
            .env("WEIR_LOG", "error")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start weir broker");
        let out = child.stdout.take().unwrap();
        let mut lines = BufReader::new(out).lines();
        let deadline = Instant::now() + Duration::from_millis(BROKER_START_MS_MAX);
        let line = loop {
            match lines.next() {
                Some(Ok(l)) if l.starts_with("weir broker ready:") => break l,
                Some(Ok(_)) if Instant::now() < deadline => continue,
                other => panic!("broker did not become ready: {other:?}"),
            }
        };
        let i = line.find("listen=").unwrap() + "listen=".len();
        let addr: SocketAddr = line[i..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        // Keep draining stdout so the broker never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Broker {
            child,
            addr,
            dir: dir.to_path_buf(),
        }
    }

    /// SIGTERM, and wait for the process to exit.
    pub fn stop(mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc_kill(self.child.id() as i32, 15);
        }
        self.child.wait().unwrap();
        std::mem::forget(self);
    }

    /// SIGKILL, and wait for the process to exit.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        std::mem::forget(self);
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// A loopback port free right now (for a broker that must come back on
/// the same port after a restart).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}
