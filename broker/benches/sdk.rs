//! The SDK against a real broker on this machine: the `weir_client`
//! `Producer` (not hand-built batches) and `Consumer::poll`.
//!
//! ```text
//! cargo bench -p weir-broker --bench sdk -- [--seconds S] [--cores N] [--workers N] [--only shared|r100|r1k|consume|again]
//! ```
//!
//! Starts the release `weir` binary on free loopback ports over a fresh
//! data directory under `target/`, then:
//! 1. one producer, 1 KiB records, 16 partitions, `acks=all`, no
//!    compression, through the shared port only;
//! 2. one producer, 100-byte records, 16 partitions, `acks=all`;
//! 3. as 1, with shard-aware routing (each partition's batches to its
//!    core's own port);
//! 4. one consumer polling the cached tail of 3 back (record value bytes
//!    returned by `poll`, CRC-checked and decoded), and the same data read
//!    with raw `Client::fetch_many` on one connection for comparison;
//! 5. 1 again (shared port), so that the routing comparison brackets 3.
//!
//! The client runs on a tokio runtime with `--workers` worker threads
//! (default 1) plus the main thread, on the same 2 cores as the broker.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::Broker;
use weir_client::{
    Client, Consumer, ConsumerConfig, DeliveryFuture, OffsetReset, Producer, ProducerConfig,
    ProducerRecord,
};

const PARTITIONS: u32 = 16;

fn arg(args: &[String], name: &str, default: f64) -> f64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(default)
}

/// Produces `record_bytes` records round-robin over the partitions for
/// `secs`; returns (bytes/s of record values, records/s), counting only
/// acknowledged records.
async fn produce(
    addr: std::net::SocketAddr,
    topic: &str,
    record_bytes: usize,
    shard_aware: bool,
    secs: f64,
) -> (f64, f64) {
    let mut c = ProducerConfig::default();
    c.shard_aware = shard_aware;
    c.batch_size = 256 << 10;
    c.buffer_memory = 128 << 20;
    let p = Producer::new(Client::connect(addr).await.unwrap(), c);
    let value = Bytes::from(vec![b'x'; record_bytes]);
    let mut waiting: VecDeque<DeliveryFuture> = VecDeque::new();
    let mut acked: u64 = 0;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut i: u32 = 0;
    let topic: std::sync::Arc<str> = topic.into();
    while Instant::now() < deadline {
        for _ in 0..1024 {
            let r = ProducerRecord {
                topic: topic.clone(),
                partition: Some(i % PARTITIONS),
                value: Some(value.clone()),
                ..ProducerRecord::default()
            };
            i = i.wrapping_add(1);
            waiting.push_back(p.send(r).await.unwrap());
        }
        while let Some(o) = waiting.front_mut().and_then(DeliveryFuture::try_outcome) {
            o.unwrap();
            waiting.pop_front();
            acked += 1;
        }
    }
    p.flush().await;
    for f in waiting {
        f.await.unwrap();
        acked += 1;
    }
    let s = start.elapsed().as_secs_f64();
    p.close().await;
    (acked as f64 * record_bytes as f64 / s, acked as f64 / s)
}

/// Polls the last `tail` records of each partition over and over for
/// `secs`; returns bytes/s of record values returned by `poll`.
async fn consume(addr: std::net::SocketAddr, topic: &str, tail: u64, secs: f64) -> (f64, f64) {
    let client = Client::connect(addr).await.unwrap();
    let mut ends = Vec::new();
    for p in 0..PARTITIONS {
        let end = client
            .list_offsets(topic, p, weir_proto::messages::OffsetSpec::Latest)
            .await
            .unwrap()
            .unwrap();
        ends.push(end);
    }
    let mut c = ConsumerConfig::default();
    c.auto_offset_reset = OffsetReset::Earliest;
    c.max_poll_records = 2000;
    let mut consumer = Consumer::new(client, c);
    let parts: Vec<(String, u32)> = (0..PARTITIONS).map(|p| (topic.to_string(), p)).collect();
    consumer.assign(parts.clone());
    // A partition that reached its end starts over at its cached tail, so
    // every partition always has data to fetch.
    let rewind = |consumer: &mut Consumer, all: bool| {
        for (p, end) in ends.iter().enumerate() {
            if all || consumer.position(topic, p as u32) >= Some(*end) {
                consumer
                    .seek(topic, p as u32, end.saturating_sub(tail))
                    .unwrap();
            }
        }
    };
    rewind(&mut consumer, true);
    let mut bytes: u64 = 0;
    let mut records: u64 = 0;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        let got = consumer.poll(Duration::from_millis(100)).await.unwrap();
        for r in &got {
            bytes += r.value.as_ref().map_or(0, |v| v.len()) as u64;
        }
        records += got.len() as u64;
        rewind(&mut consumer, false);
    }
    let s = start.elapsed().as_secs_f64();
    (bytes as f64 / s, records as f64 / s)
}

/// The same reads with `Client::fetch_many` on one connection (no decoding):
/// the transport's share of the consumer's figure.
async fn raw_fetch(addr: std::net::SocketAddr, topic: &str, tail: u64, secs: f64) -> f64 {
    let client = Client::connect(addr).await.unwrap();
    let mut ends = Vec::new();
    for p in 0..PARTITIONS {
        let end = client
            .list_offsets(topic, p, weir_proto::messages::OffsetSpec::Latest)
            .await
            .unwrap()
            .unwrap();
        ends.push(end);
    }
    let mut pos: Vec<u64> = ends.iter().map(|e| e.saturating_sub(tail)).collect();
    let mut bytes = 0u64;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        let targets = (0..PARTITIONS)
            .map(|p| weir_proto::messages::FetchPartition {
                topic: topic.to_string(),
                partition: p,
                offset: pos[p as usize],
                max_bytes: 2 << 20,
            })
            .collect();
        let r = client.fetch_many(0, 32 << 20, targets).await.unwrap();
        for (p, f) in r.into_iter().enumerate() {
            let f = f.unwrap();
            for b in &f.batches {
                bytes += b.len() as u64;
            }
            let next = f.next_offset().unwrap_or(ends[p]);
            pos[p] = if next >= ends[p] {
                ends[p].saturating_sub(tail)
            } else {
                next
            };
        }
    }
    bytes as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs = arg(&args, "--seconds", 5.0);
    let cores = arg(&args, "--cores", 2.0) as usize;
    let workers = arg(&args, "--workers", 1.0) as usize;
    // --only NAME runs one phase: shared, r100, r1k, consume (needs r1k), again.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let run = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o == name || (o == "consume" && name == "r1k"))
    };
    let root = std::path::PathBuf::from("target/weir-bench-sdk");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let b = Broker::start_with(&root, cores, &["--cache-bytes-per-core", "536870912"]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        for t in ["r1k", "r1k-shared", "r100", "r1k-shared-again"] {
            admin.create_topic(t, PARTITIONS, vec![]).await.unwrap();
        }
        // The shard-aware 1 KiB run goes last, so that its tail is what the
        // batch caches hold when the consumer reads it back.
        if run("shared") {
        let (bps, rps) = produce(b.listen, "r1k-shared", 1024, false, secs).await;
        println!("producer 1 KiB records, {PARTITIONS} partitions, acks=all, shared port: {:>8.1} MB/s {:>10.0} records/s", bps / 1e6, rps);
        }
        if run("r100") {
        let (bps, rps) = produce(b.listen, "r100", 100, true, secs).await;
        println!("producer 100 B records, {PARTITIONS} partitions, acks=all, shard-aware: {:>8.1} MB/s {:>10.0} records/s", bps / 1e6, rps);
        }
        if run("r1k") {
        let (bps, rps) = produce(b.listen, "r1k", 1024, true, secs).await;
        println!("producer 1 KiB records, {PARTITIONS} partitions, acks=all, shard-aware: {:>8.1} MB/s {:>10.0} records/s", bps / 1e6, rps);
        }
        if run("consume") {
        // The last ~24 MiB of each partition (384 MiB in all) is cached.
        let (bps, rps) = consume(b.listen, "r1k", 24 << 10, secs).await;
        let raw = raw_fetch(b.listen, "r1k", 24 << 10, secs).await;
        println!("raw fetch_many, one connection, same data:  {:>8.1} MB/s", raw / 1e6);
        println!("consumer poll, cached 1 KiB records, {PARTITIONS} partitions: {:>8.1} MB/s {:>10.0} records/s", bps / 1e6, rps);
        }
        // The shared port once more, after the shard-aware run, so that the
        // comparison is not only an artefact of the order (the disk fills).
        if run("again") {
        let (bps, rps) = produce(b.listen, "r1k-shared-again", 1024, false, secs).await;
        println!("producer 1 KiB records, {PARTITIONS} partitions, acks=all, shared port again: {:>8.1} MB/s {:>10.0} records/s", bps / 1e6, rps);
        }
    });
    drop(rt);
    assert!(b.stop().success());
    let _ = std::fs::remove_dir_all(&root);
}
