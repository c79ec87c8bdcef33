//! Compaction benchmark: cleaner throughput, and what a pass costs the
//! produce path of the same core.
//!
//! ```text
//! cargo bench -p weir-storage --bench compaction -- [--gib N] [--keys K] [--dir DIR] [--busy-mib-s N]
//! ```
//!
//! On one core (one glommio executor, pinned to CPU 0): fills a compacted
//! partition with N GiB (default 1) of 1 KiB records over K distinct keys
//! (default 100 000), in segments of 128 MiB, and closes it. Then, on
//! another partition of the same core, durable produce (1 KiB records in
//! 64 KiB batches, 16 appends in flight) runs alone for a few seconds (the
//! baseline), and again while the core's own cleaner (started with
//! `StorageShard::start_cleaner`, its low-priority task queue) compacts the
//! big partition. Prints the cleaner's pass report (throughput = cleanable
//! bytes / pass duration) and both produce rates.

use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use glommio::{LocalExecutorBuilder, Placement};
use weir_proto::batch::Compression;
use weir_proto::builder::BatchBuilder;
use weir_proto::record::RecordData;
use weir_storage::{LogConfig, ManualClock, PartitionLog, ShardConfig, StorageShard};

const RECORD_BYTES: usize = 1024;
const BATCH_RECORDS: usize = 64;
const INFLIGHT: usize = 16;
const BASELINE: Duration = Duration::from_secs(5);
const T0: i64 = 1_700_000_000_000;

fn batch(first: u64, keys: Option<u64>, value: &Bytes) -> BytesMut {
    let mut b = BatchBuilder::new(Compression::None).expect("codec");
    for i in first..first + BATCH_RECORDS as u64 {
        b.push(&RecordData {
            key: keys.map(|k| Bytes::from(format!("key-{:08}", i % k))),
            value: Some(value.clone()),
            headers: Vec::new(),
            timestamp: T0,
        })
        .expect("push");
    }
    b.finish().expect("batch")
}

/// Durable appends of the same batch from `INFLIGHT` tasks until `stop()`;
/// returns the bytes appended and the time taken.
async fn produce(log: &PartitionLog, stop: impl Fn() -> bool + 'static) -> (u64, Duration) {
    let stop = Rc::new(stop);
    let bytes = Rc::new(Cell::new(0u64));
    let value = Bytes::from(vec![7u8; RECORD_BYTES]);
    let one = batch(0, None, &value);
    let started = Instant::now();
    let tasks: Vec<_> = (0..INFLIGHT)
        .map(|_| {
            let (log, stop, bytes, one) = (log.clone(), stop.clone(), bytes.clone(), one.clone());
            glommio::spawn_local(async move {
                while !stop() {
                    log.append_acked(one.clone()).await.expect("append");
                    bytes.set(bytes.get() + one.len() as u64);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await;
    }
    (bytes.get(), started.elapsed())
}

fn mb_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

/// Fills a compacted partition in `dir` with `gib` GiB of 1 KiB records
/// over `keys` keys, closes every segment but a tiny active one, and
/// returns it reopened.
async fn fill(
    shard: &StorageShard,
    clock: &ManualClock,
    dir: PathBuf,
    cfg: &LogConfig,
    gib: u64,
    keys: u64,
) -> PartitionLog {
    let (log, _) = PartitionLog::open(shard, &dir, cfg.clone()).await.unwrap();
    let value = Bytes::from(vec![42u8; RECORD_BYTES - 16]);
    let target = gib << 30;
    let started = Instant::now();
    let mut i = 0u64;
    while log.size_bytes() < target {
        log.append(batch(i, Some(keys), &value)).await.unwrap();
        i += BATCH_RECORDS as u64;
        if (i / BATCH_RECORDS as u64) % 256 == 0 {
            log.flush().await.unwrap();
        }
    }
    // Close the last full segment: roll by age.
    clock.advance(cfg.segment_ms + 1);
    log.append(batch(i, Some(keys), &value)).await.unwrap();
    log.close().await.unwrap();
    println!(
        "filled {:.2} GiB ({} records, {keys} keys) in {:.1} s",
        log.size_bytes() as f64 / (1u64 << 30) as f64,
        i,
        started.elapsed().as_secs_f64()
    );
    let (log, _) = PartitionLog::open(shard, &dir, cfg.clone()).await.unwrap();
    println!(
        "compacted partition: {} segments, dirty ratio {:.3}",
        log.segment_count(),
        log.dirty_ratio()
    );
    log
}

fn print_pass(what: &str, rep: &weir_storage::CleanReport) {
    // The whole log but its tiny active segment was cleanable.
    let cleanable = rep.size_before;
    println!(
        "{what}: {:.2} GiB -> {:.1} MiB, read {:.2} GiB, wrote {:.1} MiB, removed {} of {} records, {:.2} s (map {:.2} s): {:.0} MB/s of log cleaned",
        cleanable as f64 / (1u64 << 30) as f64,
        rep.size_after as f64 / (1u64 << 20) as f64,
        rep.bytes_read as f64 / (1u64 << 30) as f64,
        rep.bytes_written as f64 / (1u64 << 20) as f64,
        rep.records_removed,
        rep.records_read,
        rep.duration.as_secs_f64(),
        rep.map_duration.as_secs_f64(),
        mb_s(cleanable, rep.duration),
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut gib, mut keys, mut dir) = (1u64, 100_000u64, None::<PathBuf>);
    let mut busy: Option<u64> = ShardConfig::default().cleaner_io_busy_bytes_per_sec;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--gib" => gib = args.next().and_then(|v| v.parse().ok()).expect("--gib N"),
            "--keys" => keys = args.next().and_then(|v| v.parse().ok()).expect("--keys K"),
            "--dir" => dir = args.next().map(PathBuf::from),
            "--busy-mib-s" => {
                let v: u64 = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--busy-mib-s N");
                busy = (v > 0).then_some(v << 20);
            }
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    let tmp = tempfile::tempdir_in(dir.unwrap_or_else(std::env::temp_dir)).expect("temp dir");
    let root = tmp.path().to_path_buf();
    LocalExecutorBuilder::new(Placement::Fixed(0))
        .spawn(move || async move {
            let clock = ManualClock::new(T0);
            let shard = StorageShard::with_clock(
                ShardConfig {
                    cleaner_io_busy_bytes_per_sec: busy,
                    ..ShardConfig::default()
                },
                Rc::new(clock.clone()),
            );
            println!(
                "cleaner I/O while the core appends: {}",
                busy.map_or("unlimited".to_string(), |b| format!("{} MiB/s", b >> 20))
            );
            let mut cfg = LogConfig::default();
            cfg.set("segment.bytes", &(128u64 << 20).to_string())
                .unwrap();
            cfg.set("cleanup.policy", "compact").unwrap();
            cfg.set("retention.ms", "-1").unwrap();
            // The cleaner alone, on a first copy.
            let alone = fill(&shard, &clock, root.join("alone-0"), &cfg, gib, keys).await;
            let rep = alone.clean(true).await.unwrap().expect("a pass");
            print_pass("cleaner alone", &rep);
            alone.delete().await.unwrap();
            // The same with produce on the core, through the core's cleaner.
            let big = fill(&shard, &clock, root.join("compacted-0"), &cfg, gib, keys).await;
            let (other, _) =
                PartitionLog::open(&shard, root.join("events-0"), LogConfig::default())
                    .await
                    .unwrap();
            // Baseline: produce alone.
            let t = Instant::now();
            let (b0, d0) = produce(&other, move || t.elapsed() >= BASELINE).await;
            println!(
                "produce alone: {:.0} MB/s over {:.1} s",
                mb_s(b0, d0),
                d0.as_secs_f64()
            );
            // The core's cleaner picks the partition up; produce meanwhile.
            let done = Rc::new(Cell::new(false));
            let watch = {
                let (shard, done) = (shard.clone(), done.clone());
                glommio::spawn_local(async move {
                    let passes = shard.stats().cleaner_passes;
                    while shard.stats().cleaner_passes == passes {
                        glommio::timer::sleep(Duration::from_millis(5)).await;
                    }
                    done.set(true);
                })
            };
            let stop = Rc::new(Cell::new(false));
            let stop_cleaner = stop.clone();
            shard
                .start_cleaner(Duration::from_millis(10), move || stop_cleaner.get())
                .unwrap();
            let d2 = done.clone();
            let (b1, d1) = produce(&other, move || d2.get()).await;
            watch.await;
            stop.set(true);
            let rep = shard.last_clean_report().expect("a pass");
            print_pass("cleaner during produce", &rep);
            // Baseline again, after: the machine's speed drifts.
            let t = Instant::now();
            let (b2, d2) = produce(&other, move || t.elapsed() >= BASELINE).await;
            println!("produce alone, after: {:.0} MB/s over {:.1} s", mb_s(b2, d2), d2.as_secs_f64());
            let alone = (mb_s(b0, d0) + mb_s(b2, d2)) / 2.0;
            println!(
                "produce during the pass: {:.0} MB/s over {:.1} s ({:+.1} % vs alone, mean of before and after)",
                mb_s(b1, d1),
                d1.as_secs_f64(),
                (mb_s(b1, d1) / alone - 1.0) * 100.0
            );
            big.close().await.unwrap();
            other.close().await.unwrap();
        })
        .expect("glommio executor starts (check `ulimit -l`)")
        .join()
        .unwrap();
}
