//! Consumer groups against a real broker on this machine.
//!
//! ```text
//! cargo bench -p weir-broker --bench groups -- [--seconds S] [--rounds N] [--commits N]
//! ```
//!
//! Starts the release `weir` binary (2 cores, 512 MiB batch cache per core)
//! on free loopback ports over a fresh data directory under `target/`,
//! fills 16 partitions with 1 KiB records (about 16 MiB each, all cached),
//! then measures, with *default* group settings (10 s session, 3 s
//! heartbeat, cooperative-sticky):
//! 1. one `Consumer` polling all 16 partitions for `--seconds` (record value
//!    bytes returned by `poll`, rewinding each partition to its cached tail
//!    when it reaches the end), then four `GroupConsumer`s of one group
//!    doing the same over their share, side by side: the ratio;
//! 2. `--rounds` times: three members own the 16 partitions and poll; a
//!    fourth joins; the time from its join being answered (the member is
//!    detected) until the group is `Stable` again with every partition
//!    owned (it then leaves again);
//! 3. `--commits` commits of 16 partitions by one member (p50/p99/max).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::Broker;
use weir_client::{
    Client, Consumer, ConsumerConfig, GroupConsumer, GroupConsumerConfig, OffsetReset, Producer,
    ProducerConfig, ProducerRecord,
};
use weir_proto::messages::{CommitOffset, OffsetSpec};

const PARTITIONS: u32 = 16;
const TOPIC: &str = "g1k";
/// Records per partition (1 KiB each): 16 MiB per partition, 256 MiB in all.
const RECORDS_PER_PARTITION: u64 = 16 << 10;
/// Records of each partition read over and over (the cached tail).
const TAIL: u64 = 12 << 10;

fn arg(args: &[String], name: &str, default: f64) -> f64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(default)
}

async fn fill(addr: std::net::SocketAddr) {
    let mut c = ProducerConfig::default();
    c.batch_size = 256 << 10;
    c.buffer_memory = 128 << 20;
    let p = Producer::new(Client::connect(addr).await.unwrap(), c);
    let value = Bytes::from(vec![b'x'; 1024]);
    let topic: Arc<str> = TOPIC.into();
    let mut waiting = Vec::new();
    for i in 0..RECORDS_PER_PARTITION * u64::from(PARTITIONS) {
        let r = ProducerRecord {
            topic: topic.clone(),
            partition: Some((i % u64::from(PARTITIONS)) as u32),
            value: Some(value.clone()),
            ..ProducerRecord::default()
        };
        waiting.push(p.send(r).await.unwrap());
    }
    p.flush().await;
    for f in waiting {
        f.await.unwrap();
    }
    p.close().await;
}

async fn ends(client: &Client) -> Vec<u64> {
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        out.push(
            client
                .list_offsets(TOPIC, p, OffsetSpec::Latest)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    out
}

fn consumer_config() -> ConsumerConfig {
    let mut c = ConsumerConfig::default();
    c.auto_offset_reset = OffsetReset::Earliest;
    c.max_poll_records = 2000;
    c
}

/// One plain consumer over every partition for `secs`: value bytes/s.
async fn single(addr: std::net::SocketAddr, secs: f64) -> f64 {
    let client = Client::connect(addr).await.unwrap();
    let ends = ends(&client).await;
    let mut consumer = Consumer::new(client, consumer_config());
    consumer.assign((0..PARTITIONS).map(|p| (TOPIC.to_string(), p)).collect());
    for (p, e) in ends.iter().enumerate() {
        consumer.seek(TOPIC, p as u32, e - TAIL).unwrap();
    }
    let mut bytes = 0u64;
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        for r in consumer.poll(Duration::from_millis(100)).await.unwrap() {
            bytes += r.value.as_ref().map_or(0, |v| v.len()) as u64;
        }
        for (p, e) in ends.iter().enumerate() {
            if consumer.position(TOPIC, p as u32) >= Some(*e) {
                consumer.seek(TOPIC, p as u32, e - TAIL).unwrap();
            }
        }
    }
    bytes as f64 / start.elapsed().as_secs_f64()
}

fn group_config(group: &str) -> GroupConsumerConfig {
    let mut c = GroupConsumerConfig::new(group);
    c.consumer = consumer_config();
    c
}

/// Four members of one group, each polling its share until `stop`;
/// counts value bytes into `bytes` once `counting` is set.
async fn group_member(
    addr: std::net::SocketAddr,
    group: String,
    ends: Arc<Vec<u64>>,
    bytes: Arc<AtomicU64>,
    counting: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) {
    let mut m = GroupConsumer::new(Client::connect(addr).await.unwrap(), group_config(&group));
    m.subscribe(&[TOPIC]).await.unwrap();
    let mut sought = std::collections::BTreeSet::new();
    while !stop.load(Ordering::Relaxed) {
        let got = m.poll(Duration::from_millis(100)).await.unwrap();
        if counting.load(Ordering::Relaxed) {
            let n: u64 = got
                .iter()
                .map(|r| r.value.as_ref().map_or(0, |v| v.len()) as u64)
                .sum();
            bytes.fetch_add(n, Ordering::Relaxed);
        }
        for (t, p) in m.assignment() {
            let e = ends[p as usize];
            if sought.insert(p) || m.position(&t, p) >= Some(e) {
                m.seek(&t, p, e - TAIL).unwrap();
            }
        }
    }
    m.close().await.unwrap();
}

async fn group_of_four(addr: std::net::SocketAddr, secs: f64) -> f64 {
    let client = Client::connect(addr).await.unwrap();
    let ends = Arc::new(ends(&client).await);
    let bytes = Arc::new(AtomicU64::new(0));
    let counting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(group_member(
                addr,
                "four".into(),
                ends.clone(),
                bytes.clone(),
                counting.clone(),
                stop.clone(),
            ))
        })
        .collect();
    // Count once the group is stable with four members.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(d) = client.describe_group("four").await {
            if d.members.len() == 4 && d.state == "Stable" {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the group did not settle");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    counting.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let n = bytes.load(Ordering::Relaxed);
    let rate = n as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    rate
}

/// A member that polls until `stop` (no counting, no rewinding).
async fn idle_member(addr: std::net::SocketAddr, group: String, stop: Arc<AtomicBool>) {
    let mut m = GroupConsumer::new(Client::connect(addr).await.unwrap(), group_config(&group));
    m.subscribe(&[TOPIC]).await.unwrap();
    while !stop.load(Ordering::Relaxed) {
        m.poll(Duration::from_millis(100)).await.unwrap();
        m.commit_sync().await.unwrap();
    }
    m.close().await.unwrap();
}

async fn wait_stable(client: &Client, group: &str, members: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(d) = client.describe_group(group).await {
            if d.members.len() == members && d.state == "Stable" {
                return;
            }
        }
        assert!(Instant::now() < deadline, "the group did not settle");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Join-to-stable times of a fourth member, ms.
async fn rebalances(addr: std::net::SocketAddr, rounds: usize) -> Vec<f64> {
    let client = Client::connect(addr).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..3)
        .map(|_| tokio::spawn(idle_member(addr, "rebalance".into(), stop.clone())))
        .collect();
    wait_stable(&client, "rebalance", 3).await;
    let mut out = Vec::new();
    for _ in 0..rounds {
        let mut m = GroupConsumer::new(
            Client::connect(addr).await.unwrap(),
            group_config("rebalance"),
        );
        m.subscribe(&[TOPIC]).await.unwrap();
        let joined = Instant::now();
        let poller = tokio::spawn(async move {
            loop {
                m.poll(Duration::from_millis(100)).await.unwrap();
                if m.assignment().len() >= 4 {
                    // Keep polling a little so the group can settle.
                    let until = Instant::now() + Duration::from_millis(50);
                    while Instant::now() < until {
                        m.poll(Duration::from_millis(10)).await.unwrap();
                    }
                    return m;
                }
            }
        });
        wait_stable(&client, "rebalance", 4).await;
        out.push(joined.elapsed().as_secs_f64() * 1e3);
        let m = poller.await.unwrap();
        m.close().await.unwrap();
        wait_stable(&client, "rebalance", 3).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    out
}

/// Latencies of committing 16 partitions, µs.
async fn commits(addr: std::net::SocketAddr, n: usize) -> hdrhistogram::Histogram<u64> {
    let client = Client::connect(addr).await.unwrap();
    let mut m = GroupConsumer::new(Client::connect(addr).await.unwrap(), group_config("commit"));
    m.subscribe(&[TOPIC]).await.unwrap();
    while m.assignment().len() < PARTITIONS as usize {
        m.poll(Duration::from_millis(10)).await.unwrap();
    }
    let ends = ends(&client).await;
    let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    for i in 0..n {
        let offsets = (0..PARTITIONS)
            .map(|p| CommitOffset {
                topic: TOPIC.into(),
                partition: p,
                offset: ends[p as usize] - (i as u64 % 1000),
                metadata: None,
            })
            .collect();
        let t = Instant::now();
        m.commit_offsets(offsets).await.unwrap();
        h.record(t.elapsed().as_micros() as u64).unwrap();
    }
    m.close().await.unwrap();
    h
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs = arg(&args, "--seconds", 5.0);
    let rounds = arg(&args, "--rounds", 10.0) as usize;
    let n_commits = arg(&args, "--commits", 5000.0) as usize;
    let root = std::path::PathBuf::from("target/weir-bench-groups");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let b = Broker::start_with(&root, 2, &["--cache-bytes-per-core", "536870912"]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic(TOPIC, PARTITIONS, vec![]).await.unwrap();
        fill(b.listen).await;
        let one = single(b.listen, secs).await;
        let four = group_of_four(b.listen, secs).await;
        let one_again = single(b.listen, secs).await;
        println!("one consumer, cached 1 KiB records, {PARTITIONS} partitions:   {:>8.1} MB/s", one / 1e6);
        println!("group of 4 consumers, same data:                   {:>8.1} MB/s", four / 1e6);
        println!("one consumer again:                                {:>8.1} MB/s", one_again / 1e6);
        println!(
            "group / single: {:.0} % (of the mean of the two single runs)",
            100.0 * four / ((one + one_again) / 2.0)
        );
        let mut times = rebalances(b.listen, rounds).await;
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "rebalance after a 4th member joins, join answered -> Stable ({} rounds): min {:.1} ms, median {:.1} ms, max {:.1} ms",
            times.len(),
            times[0],
            times[times.len() / 2],
            times[times.len() - 1]
        );
        let h = commits(b.listen, n_commits).await;
        println!(
            "commit of {PARTITIONS} partitions ({} commits): p50 {} µs, p99 {} µs, p99.9 {} µs, max {} µs",
            h.len(),
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max()
        );
    });
    drop(rt);
    assert!(b.stop().success());
    let _ = std::fs::remove_dir_all(&root);
}
