//! Metadata change latency in a three-node cluster on loopback: a topic
//! created through node 1 until every node has applied it.
//!
//! `cargo bench -p weir-broker --bench cluster [-- --changes N]`
//!
//! Three `weir broker` processes (release build, one core each) on this
//! machine, each a controller voter. For each change: `CreateTopics` on
//! node 1 (answered once node 1's cores serve it), then each node's
//! `DescribeCluster` polled until its applied version reaches the
//! version the change got. Prints p50/p99/max of both.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weir_client::Client;

struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let changes: usize = std::env::args()
        .skip_while(|a| a != "--changes")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let weir = env!("CARGO_BIN_EXE_weir");
    let root = tempfile::tempdir().unwrap();
    let certs = root.path().join("certs");
    let ok = Command::new(weir)
        .args([
            "cluster",
            "certs",
            "--out",
            certs.to_str().unwrap(),
            "--nodes",
            "3",
        ])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success());
    let udp: Vec<SocketAddr> = (0..3)
        .map(|_| {
            UdpSocket::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
        })
        .collect();
    let voters: Vec<String> = udp
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}@{a}", i + 1))
        .collect();
    let voters = voters.join(",");
    let spawn = |id: usize| {
        let mut child = Command::new(weir)
            .args(["broker", "--cores", "1", "--listen", "127.0.0.1:0"])
            .args(["--core-port-base", "0", "--metrics-listen", "127.0.0.1:0"])
            .args(["--kafka-listener", "off", "--cluster-id", "bench"])
            .args(["--node-id", &id.to_string(), "--voters", &voters])
            .args(["--certs-dir", certs.to_str().unwrap()])
            .args(["--replication-listen", &udp[id - 1].to_string()])
            .args([
                "--data-dir",
                root.path().join(format!("n{id}")).to_str().unwrap(),
            ])
            .env("WEIR_LOG", "warn,openraft=error")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let line = BufReader::new(out)
            .lines()
            .map(|l| l.unwrap())
            .find(|l| l.starts_with("weir broker ready:"))
            .expect("ready line");
        let addr: SocketAddr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("listen="))
            .unwrap()
            .parse()
            .unwrap();
        (Node(child), addr)
    };
    let started: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (1..=3).map(|id| s.spawn(move || spawn(id))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let addrs: Vec<SocketAddr> = started.iter().map(|(_, a)| *a).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (acked, everywhere) = rt.block_on(async {
        let clients: Vec<Client> = connect_all(&addrs).await;
        let mut acked = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        let mut everywhere = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        for i in 0..changes {
            let start = Instant::now();
            clients[0]
                .create_topic(&format!("m{i}"), 1, Vec::new())
                .await
                .unwrap();
            acked.record(start.elapsed().as_micros() as u64).unwrap();
            let version = clients[0]
                .describe_cluster()
                .await
                .unwrap()
                .metadata_version;
            for c in &clients[1..] {
                while c.describe_cluster().await.unwrap().metadata_version < version {
                    assert!(start.elapsed() < Duration::from_secs(10));
                }
            }
            everywhere
                .record(start.elapsed().as_micros() as u64)
                .unwrap();
        }
        (acked, everywhere)
    });
    let ms = |h: &hdrhistogram::Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "metadata changes: {changes} topic creates through node 1 of 3 (1 core each, loopback)"
    );
    for (what, h) in [
        ("acknowledged by node 1", &acked),
        ("applied on all 3 nodes", &everywhere),
    ] {
        println!(
            "  {what:24} p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
            ms(h, 0.5),
            ms(h, 0.99),
            h.max() as f64 / 1000.0
        );
    }
    drop(started);
}

async fn connect_all(addrs: &[SocketAddr]) -> Vec<Client> {
    let mut out = Vec::new();
    for a in addrs {
        out.push(Client::connect(*a).await.unwrap());
    }
    out
}
