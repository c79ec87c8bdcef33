//! Storage benchmark: durable appends (group commit) and reopen times.
//!
//! ```text
//! cargo bench -p weir-storage --bench append -- [--seconds S] [--dir DIR] [--only NAME]
//! cargo bench -p weir-storage --bench append -- --reopen [--gib N] [--dir DIR]
//! ```
//!
//! The append matrix runs on one core (one glommio executor): for 1 KiB and
//! 100-byte records, batches of 16 KiB to 1 MiB, across 1, 16 and 64
//! partitions, every append acknowledged only once fdatasync'd. It prints
//! MiB/s, records/s, and append-to-durable latency percentiles.
//!
//! `--reopen` fills one partition with N GiB (default 4), closes it and
//! times a clean reopen; then a child process appends to it and is killed
//! with SIGKILL, and the unclean reopen is timed.

use std::cell::Cell;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use glommio::{LocalExecutorBuilder, Placement};
use hdrhistogram::Histogram;
use weir_proto::batch::Compression;
use weir_proto::builder::BatchBuilder;
use weir_proto::record::RecordData;
use weir_storage::{LogConfig, PartitionLog, ShardConfig, StorageShard};

/// Bytes kept in flight across all partitions of a run.
const INFLIGHT_BYTES_MAX: usize = 32 << 20;
/// In-flight appends per partition, at most.
const INFLIGHT_PER_PARTITION_MAX: usize = 16;
/// Bytes a run writes at most (disk space bound).
const RUN_BYTES_MAX: u64 = 6 << 30;

fn make_batch(record_bytes: usize, batch_bytes: usize) -> BytesMut {
    let mut b = BatchBuilder::new(Compression::None).expect("codec");
    let value = Bytes::from(
        (0..record_bytes)
            .map(|i| (i * 31 % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    let now = 1_700_000_000_000;
    while b.estimated_size() + record_bytes + 16 <= batch_bytes || b.is_empty() {
        b.push(&RecordData {
            key: None,
            value: Some(value.clone()),
            headers: Vec::new(),
            timestamp: now,
        })
        .expect("push");
    }
    b.build().expect("build")
}

struct RunResult {
    bytes: u64,
    records: u64,
    secs: f64,
    hist: Histogram<u64>,
    fsyncs: u64,
    rounds: u64,
}

fn run_on_executor<T: Send + 'static>(
    f: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = T>>> + Send + 'static,
) -> T {
    match LocalExecutorBuilder::new(Placement::Fixed(0)).spawn(f) {
        Ok(h) => h.join().expect("bench executor panicked"),
        Err(e) => {
            eprintln!(
                "error: cannot start a glommio executor: {e}\n\
                 hint: io_uring needs locked memory; raise it with `ulimit -l unlimited` \
                 (or LimitMEMLOCK=infinity under systemd)"
            );
            std::process::exit(2);
        }
    }
}

fn append_run(
    dir: PathBuf,
    partitions: usize,
    record_bytes: usize,
    batch_bytes: usize,
    secs: f64,
    config: LogConfig,
) -> RunResult {
    run_on_executor(move || {
        Box::pin(async move {
            let shard = StorageShard::new(ShardConfig::default());
            let template = make_batch(record_bytes, batch_bytes);
            let records_per_batch = weir_proto::batch::BatchHeader::peek(&template)
                .unwrap()
                .records_count as u64;
            let blen = template.len();
            let per_part =
                (INFLIGHT_BYTES_MAX / (blen * partitions)).clamp(1, INFLIGHT_PER_PARTITION_MAX);
            let mut logs = Vec::new();
            for p in 0..partitions {
                let (log, _) =
                    PartitionLog::open(&shard, dir.join(format!("bench-{p}")), config.clone())
                        .await
                        .expect("open");
                logs.push(log);
            }
            let hist = Rc::new(std::cell::RefCell::new(
                Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap(),
            ));
            let bytes = Rc::new(Cell::new(0u64));
            let stop = Instant::now() + Duration::from_secs_f64(secs);
            let start = Instant::now();
            let before = shard.stats();
            let mut tasks = Vec::new();
            for log in &logs {
                for _ in 0..per_part {
                    let (log, t, hist, bytes) =
                        (log.clone(), template.clone(), hist.clone(), bytes.clone());
                    tasks.push(glommio::spawn_local(async move {
                        while Instant::now() < stop && bytes.get() < RUN_BYTES_MAX {
                            let t0 = Instant::now();
                            log.append_acked(t.clone()).await.expect("append");
                            let _ = hist
                                .borrow_mut()
                                .record(t0.elapsed().as_micros().max(1) as u64);
                            bytes.set(bytes.get() + t.len() as u64);
                        }
                    }));
                }
            }
            for t in tasks {
                t.await;
            }
            let secs = start.elapsed().as_secs_f64();
            let after = shard.stats();
            for log in &logs {
                log.close().await.expect("close");
            }
            let total = bytes.get();
            let hist = hist.borrow().clone();
            RunResult {
                bytes: total,
                records: total / blen as u64 * records_per_batch,
                secs,
                hist,
                fsyncs: after.fdatasyncs - before.fdatasyncs,
                rounds: after.flush_rounds - before.flush_rounds,
            }
        })
    })
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn fresh_dir(root: &Path, name: &str) -> PathBuf {
    let d = root.join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create bench dir");
    d
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let root =
        PathBuf::from(arg(&args, "--dir").unwrap_or_else(|| "target/weir-bench-data".into()));
    if let Some(dir) = arg(&args, "--fill-child") {
        fill_child(PathBuf::from(dir));
        return;
    }
    if args.iter().any(|a| a == "--reopen") {
        let gib: u64 = arg(&args, "--gib")
            .map(|s| s.parse().expect("--gib N"))
            .unwrap_or(4);
        reopen_bench(&root, gib);
        return;
    }
    let secs: f64 = arg(&args, "--seconds")
        .map(|s| s.parse().expect("--seconds S"))
        .unwrap_or(4.0);
    let only = arg(&args, "--only");
    let mut config = LogConfig::default();
    if let Some(n) = arg(&args, "--flush-messages") {
        // For comparison only: acknowledgements then wait for the write, not fdatasync.
        config
            .set("flush.messages", &n)
            .expect("--flush-messages N");
    }
    println!(
        "{:<8} {:>8} {:>5} {:>9} {:>12} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "record",
        "batch",
        "parts",
        "MiB/s",
        "records/s",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "syncs/s"
    );
    for (record, batches) in [
        (1024usize, [16usize << 10, 256 << 10, 1 << 20]),
        (100, [16 << 10, 256 << 10, 1 << 20]),
    ] {
        for batch in batches {
            for parts in [1usize, 16, 64] {
                let name = format!("r{record}-b{}k-p{parts}", batch >> 10);
                if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
                    continue;
                }
                let dir = fresh_dir(&root, &name);
                let r = append_run(dir.clone(), parts, record, batch, secs, config.clone());
                let _ = std::fs::remove_dir_all(&dir);
                let h = &r.hist;
                println!(
                    "{:<8} {:>7}K {:>5} {:>9.1} {:>12.0} {:>9} {:>9} {:>9} {:>9} {:>8.0}",
                    record,
                    batch >> 10,
                    parts,
                    r.bytes as f64 / r.secs / 1048576.0,
                    r.records as f64 / r.secs,
                    h.value_at_quantile(0.5),
                    h.value_at_quantile(0.99),
                    h.value_at_quantile(0.999),
                    h.max(),
                    r.fsyncs as f64 / r.secs,
                );
                let _ = r.rounds;
            }
        }
    }
}

/// Appends 1 MiB batches to `dir/p-0` forever, printing `ACKED` once the
/// first one is durable; the parent kills it with SIGKILL.
fn fill_child(dir: PathBuf) {
    run_on_executor(move || {
        Box::pin(async move {
            let shard = StorageShard::new(ShardConfig::default());
            let (log, _) = PartitionLog::open(&shard, dir.join("p-0"), LogConfig::default())
                .await
                .expect("open");
            let t = make_batch(1024, 1 << 20);
            let mut n = 0u64;
            loop {
                log.append_acked(t.clone()).await.expect("append");
                n += 1;
                if n == 64 {
                    println!("ACKED");
                    use std::io::Write;
                    std::io::stdout().flush().unwrap();
                }
            }
        })
    })
}

fn reopen_bench(root: &Path, gib: u64) {
    let dir = fresh_dir(root, "reopen");
    let part = dir.join("p-0");
    let d = dir.clone();
    let fill = run_on_executor(move || {
        Box::pin(async move {
            let shard = StorageShard::new(ShardConfig::default());
            let (log, _) = PartitionLog::open(&shard, d.join("p-0"), LogConfig::default())
                .await
                .expect("open");
            let t = make_batch(1024, 1 << 20);
            let start = Instant::now();
            let n = gib << 10;
            let mut tasks = Vec::new();
            for _ in 0..16 {
                let (log, t) = (log.clone(), t.clone());
                tasks.push(glommio::spawn_local(async move {
                    for _ in 0..n / 16 {
                        log.append_acked(t.clone()).await.expect("append");
                    }
                }));
            }
            for t in tasks {
                t.await;
            }
            let secs = start.elapsed().as_secs_f64();
            let size = log.size_bytes();
            log.close().await.expect("close");
            (size, secs)
        })
    });
    println!(
        "filled {:.2} GiB in {:.1} s ({:.0} MiB/s)",
        fill.0 as f64 / (1u64 << 30) as f64,
        fill.1,
        fill.0 as f64 / 1048576.0 / fill.1
    );
    let time_open = |label: &str| {
        let p = part.clone();
        let (took, rep, size) = run_on_executor(move || {
            Box::pin(async move {
                let shard = StorageShard::new(ShardConfig::default());
                let t = Instant::now();
                let (log, rep) = PartitionLog::open(&shard, &p, LogConfig::default())
                    .await
                    .expect("open");
                let took = t.elapsed();
                let size = log.size_bytes();
                log.close().await.expect("close");
                (took, rep, size)
            })
        });
        println!(
            "{label}: open took {:.1} ms ({:.2} GiB, {} segments, scanned {}, clean {})",
            took.as_secs_f64() * 1e3,
            size as f64 / (1u64 << 30) as f64,
            rep.segments,
            rep.scanned_segments,
            rep.clean
        );
    };
    time_open("clean shutdown");
    // Crash: a child appends and is killed with SIGKILL mid-write.
    let exe = std::env::current_exe().expect("current exe");
    let mut child = Command::new(exe)
        .args(["--fill-child", dir.to_str().expect("utf-8 dir")])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let out = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(out).lines();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match lines.next() {
            Some(Ok(l)) if l == "ACKED" => break,
            Some(_) if Instant::now() < deadline => continue,
            _ => panic!("child did not acknowledge"),
        }
    }
    child.kill().expect("SIGKILL child");
    child.wait().expect("reap child");
    time_open("after SIGKILL");
    let _ = std::fs::remove_dir_all(&dir);
}
