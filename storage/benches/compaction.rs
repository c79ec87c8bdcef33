//! Compaction benchmark: cleaner throughput, and what a pass costs the
//! produce path of the same core.
//!
//! ```text
//! cargo bench -p weir-storage --bench compaction -- [--gib N] [--keys K] [--dir DIR] [--busy-mib-s N]
//! ```
//!
//! On one core (one glommio executor, pinned to CPU 0): fills a compacted
//! partition with N GiB (default 1) of 1 KiB records over K distinct keys
//! (default 100 000), in segments of 128 MiB, and cleans it with nothing
//! else running (the cleaner's throughput = cleanable bytes / pass
//! duration). Then fills a second copy and, while durable produce (1 KiB
//! records in 64 KiB batches, 16 appends in flight) runs on another
//! partition of the same core, lets the core's own cleaner
//! (`StorageShard::start_cleaner`: its low-priority task queue and I/O
//! pacing) compact it, paused and resumed every second: the produce rate
//! in the slices with the cleaner running is compared with the slices
//! between them, so the disk's drift over the run cancels out.

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
const SLICE: Duration = Duration::from_secs(1);
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

/// Durable appends of the same batch from `INFLIGHT` tasks until `tick`
/// (which samples `bytes`) ends.
async fn produce_counting(log: &PartitionLog, bytes: Rc<Cell<u64>>, tick: glommio::Task<()>) {
    let value = Bytes::from(vec![7u8; RECORD_BYTES]);
    let one = batch(0, None, &value);
    let stop = Rc::new(Cell::new(false));
    let tasks: Vec<_> = (0..INFLIGHT)
        .map(|_| {
            let (log, stop, bytes, one) = (log.clone(), stop.clone(), bytes.clone(), one.clone());
            glommio::spawn_local(async move {
                while !stop.get() {
                    log.append_acked(one.clone()).await.expect("append");
                    bytes.set(bytes.get() + one.len() as u64);
                }
            })
        })
        .collect();
    tick.await;
    stop.set(true);
    for t in tasks {
        t.await;
    }
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
            // Produce throughout; the core's cleaner compacts the big
            // partition, paused and resumed every `SLICE`, so the produce
            // rate with and without it is compared over interleaved slices
            // (the disk's speed drifts over tens of seconds).
            let done = Rc::new(Cell::new(false));
            let counted = Rc::new(Cell::new(0u64));
            let producer = {
                let (other, done, counted) = (other.clone(), done.clone(), counted.clone());
                glommio::spawn_local(async move {
                    let bytes = Rc::new(Cell::new(0u64));
                    let b2 = bytes.clone();
                    let tick = glommio::spawn_local(async move {
                        while !done.get() {
                            counted.set(b2.get());
                            glommio::timer::sleep(Duration::from_millis(1)).await;
                        }
                    });
                    produce_counting(&other, bytes, tick).await
                })
            };
            let stop = Rc::new(Cell::new(false));
            let stop_cleaner = stop.clone();
            let passes = shard.stats().cleaner_passes;
            shard.set_cleaner_paused(true);
            shard
                .start_cleaner(Duration::from_millis(10), move || stop_cleaner.get())
                .unwrap();
            let (mut on, mut off) = ((0u64, Duration::ZERO), (0u64, Duration::ZERO));
            let mut running = false;
            let deadline = Instant::now() + Duration::from_secs(600);
            while shard.stats().cleaner_passes == passes && Instant::now() < deadline {
                let (b0, t0) = (counted.get(), Instant::now());
                glommio::timer::sleep(SLICE).await;
                let slice = (counted.get() - b0, t0.elapsed());
                let acc = if running { &mut on } else { &mut off };
                acc.0 += slice.0;
                acc.1 += slice.1;
                running = !running;
                shard.set_cleaner_paused(!running);
            }
            shard.set_cleaner_paused(false);
            done.set(true);
            stop.set(true);
            producer.await;
            let rep = shard.last_clean_report().expect("a pass");
            print_pass("cleaner during produce (running half the time)", &rep);
            let (r_on, r_off) = (mb_s(on.0, on.1), mb_s(off.0, off.1));
            println!(
                "produce with the cleaner running: {r_on:.0} MB/s over {:.1} s; paused: {r_off:.0} MB/s over {:.1} s ({:+.1} %)",
                on.1.as_secs_f64(),
                off.1.as_secs_f64(),
                (r_on / r_off - 1.0) * 100.0
            );
            big.close().await.unwrap();
            other.close().await.unwrap();
        })
        .expect("glommio executor starts (check `ulimit -l`)")
        .join()
        .unwrap();
}
