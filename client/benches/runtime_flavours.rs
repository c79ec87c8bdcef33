//! The producer on a current-thread vs a multi-thread tokio runtime,
//! against a real broker (issue 18: on a current-thread runtime a tight
//! `send` loop used to send nothing until the whole buffer was full).
//!
//! ```text
//! cargo build --release -p weir-broker --bin weir
//! cargo bench -p weir-client --bench runtime_flavours -- [--seconds S] [--bytes B] [--cores N] [--runs R]
//! ```
//!
//! Starts the release `weir` binary (see `weir_testkit::weir_bin`; or
//! `WEIR_BIN`) with `--cores` cores (default 1) over a fresh data
//! directory, then runs the same tight loop — `send_with` of `--bytes`-byte
//! records (default 100) round-robin over 16 partitions, `acks=all`, a
//! callback counting acknowledgements, never yielding otherwise — for
//! `--seconds` (default 5) on `--runs` runtimes (default 3), alternating
//! a current-thread runtime and a 2-worker multi-thread runtime, starting
//! and ending with current-thread for an odd count (so the comparison
//! brackets drift on a shared machine). Prints, per run, acknowledged
//! records/s (counted up to the end of the final flush), how many records
//! had been sent when the first acknowledgement arrived and after how
//! long, and the producer's batch and request-latency statistics; then
//! the mean of each flavour and their ratio.

#[path = "../tests/common/broker.rs"]
#[allow(dead_code)]
mod broker;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use weir_client::{Client, Producer, ProducerRecord};

const PARTITIONS: u32 = 16;

fn arg(args: &[String], name: &str, default: f64) -> f64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(default)
}

struct Run {
    acked_per_s: f64,
    first_ack_after: u64,
    /// Microseconds from the first send to the first acknowledgement.
    first_ack_us: u64,
    sent: u64,
    stats: weir_client::ProducerStats,
}

async fn tight_loop(bootstrap: String, topic: String, bytes: usize, secs: f64) -> Run {
    let producer = Producer::builder()
        .bootstrap(bootstrap)
        .from_config([("batch.size", "262144"), ("buffer.memory", "134217728")])
        .build()
        .await
        .unwrap();
    let topic: Arc<str> = topic.into();
    let value = Bytes::from(vec![b'x'; bytes]);
    let sent = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let first = Arc::new(AtomicU64::new(u64::MAX));
    let first_us = Arc::new(AtomicU64::new(u64::MAX));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut i: u64 = 0;
    while Instant::now() < deadline {
        for _ in 0..256 {
            let record = ProducerRecord {
                topic: topic.clone(),
                partition: Some((i % u64::from(PARTITIONS)) as u32),
                value: Some(value.clone()),
                ..ProducerRecord::default()
            };
            let (sent_then, acked, first, first_us) =
                (sent.clone(), acked.clone(), first.clone(), first_us.clone());
            producer
                .send_with(record, move |r| {
                    r.expect("acknowledged");
                    let was = first.compare_exchange(
                        u64::MAX,
                        sent_then.load(Ordering::Relaxed),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    if was.is_ok() {
                        first_us.store(start.elapsed().as_micros() as u64, Ordering::Relaxed);
                    }
                    acked.fetch_add(1, Ordering::Relaxed);
                })
                .await
                .unwrap();
            i += 1;
            sent.store(i, Ordering::Relaxed);
        }
    }
    producer.flush().await;
    let elapsed = start.elapsed().as_secs_f64();
    let stats = producer.statistics();
    producer.close().await;
    Run {
        acked_per_s: acked.load(Ordering::Relaxed) as f64 / elapsed,
        first_ack_after: first.load(Ordering::Relaxed),
        first_ack_us: first_us.load(Ordering::Relaxed),
        sent: i,
        stats,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs = arg(&args, "--seconds", 5.0);
    let bytes = arg(&args, "--bytes", 100.0) as usize;
    let cores = arg(&args, "--cores", 1.0) as usize;
    let dir = tempfile::tempdir().unwrap();
    let b = broker::start_broker(dir.path(), cores, 0);
    let bootstrap = b.listen.to_string();
    let setup = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let runs = arg(&args, "--runs", 3.0) as usize;
    let flavours: Vec<&str> = (0..runs)
        .map(|k| {
            if k % 2 == 0 {
                "current-thread"
            } else {
                "multi-thread (2 workers)"
            }
        })
        .collect();
    setup.block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        for k in 0..flavours.len() {
            admin
                .create_topic(&format!("flavour-{k}"), PARTITIONS, vec![])
                .await
                .unwrap();
        }
    });
    println!(
        "producer, {bytes} B records, {PARTITIONS} partitions, acks=all, {secs} s per run, broker with {cores} core(s)"
    );
    let mut per_flavour: [(f64, u32); 2] = [(0.0, 0); 2];
    for (k, name) in flavours.iter().enumerate() {
        let rt = if name.starts_with("multi") {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let job = tight_loop(bootstrap.clone(), format!("flavour-{k}"), bytes, secs);
        // As a spawned task: on the multi-thread runtime it runs on a
        // worker, as an application's tasks do.
        let run = rt.block_on(async { tokio::spawn(job).await.unwrap() });
        println!(
            "{name:>26}: {:>10.0} records/s acknowledged ({:.1} MB/s of values); first ack after {} of {} sends ({:.1} ms); {} batches, mean {} B; request latency mean {:.1} ms, max {:.1} ms",
            run.acked_per_s,
            run.acked_per_s * bytes as f64 / 1e6,
            run.first_ack_after,
            run.sent,
            run.first_ack_us as f64 / 1e3,
            run.stats.batches_sent,
            run.stats.bytes_sent / run.stats.batches_sent.max(1),
            run.stats.request_latency_mean.as_secs_f64() * 1e3,
            run.stats.request_latency_max.as_secs_f64() * 1e3,
        );
        let f = &mut per_flavour[k % 2];
        f.0 += run.acked_per_s;
        f.1 += 1;
    }
    let mean = |(sum, n): (f64, u32)| sum / f64::from(n.max(1));
    let (ct, mt) = (mean(per_flavour[0]), mean(per_flavour[1]));
    println!(
        "mean: current-thread {ct:.0} records/s, multi-thread {mt:.0} records/s: current/multi = {:.3}",
        ct / mt
    );
}
