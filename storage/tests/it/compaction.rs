//! Log compaction: the cleaner against a model of "latest value per key"
//! with tombstone timing, plus the rules around it (keys required, retention
//! with `compact,delete`, unique keys, the map budget, reads during and after
//! a pass, and crashes at random and chosen points of a pass).

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::{run, run_ret, seed_from_env, Rng};
use proptest::prelude::*;
use weir_proto::batch::Compression;
use weir_proto::builder::BatchBuilder;
use weir_proto::reader::RecordBatch;
use weir_proto::record::RecordData;
use weir_storage::{
    Clock, LogConfig, ManualClock, PartitionLog, ShardConfig, StorageError, StorageShard,
};

const T0: i64 = 1_700_000_000_000;
const RETENTION_MS: i64 = 5_000;

/// One record as the model keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    offset: u64,
    key: Vec<u8>,
    value: Option<Vec<u8>>,
}

fn config(policy: &str) -> LogConfig {
    let mut c = LogConfig::default();
    c.set("segment.bytes", "4096").unwrap();
    c.set("index.interval.bytes", "512").unwrap();
    c.set("cleanup.policy", policy).unwrap();
    c.set("retention.ms", "-1").unwrap();
    c.set("delete.retention.ms", &RETENTION_MS.to_string())
        .unwrap();
    c
}

fn shard(clock: &ManualClock, budget: u64) -> StorageShard {
    shard_with(clock, budget, 64 << 10)
}

/// A shard whose cleaner reads `chunk` bytes at a time (small chunks cut
/// batches at chunk boundaries).
fn shard_with(clock: &ManualClock, budget: u64, chunk: u64) -> StorageShard {
    StorageShard::with_clock(
        ShardConfig {
            prealloc_step: 0,
            cleaner_dedupe_buffer_bytes: budget,
            cleaner_read_chunk_bytes: chunk,
            ..ShardConfig::default()
        },
        Rc::new(clock.clone()),
    )
}

/// A batch of `(key, value)` records (value `None`: a tombstone).
fn keyed(records: &[(Vec<u8>, Option<Vec<u8>>)], ts: i64, codec: Compression) -> BytesMut {
    let mut b = BatchBuilder::new(codec).unwrap();
    for (k, v) in records {
        b.push(&RecordData {
            key: Some(Bytes::copy_from_slice(k)),
            value: v.as_deref().map(Bytes::copy_from_slice),
            headers: Vec::new(),
            timestamp: ts,
        })
        .unwrap();
    }
    b.build().unwrap()
}

/// Every record readable from the log start, in offset order, checking
/// that offsets only grow.
async fn read_all(log: &PartitionLog) -> Vec<Rec> {
    let mut out: Vec<Rec> = Vec::new();
    let mut at = log.log_start_offset();
    let hw = log.high_watermark();
    while at < hw {
        let r = log.read(at, 64 << 10).await.expect("read");
        if r.batches.is_empty() {
            break;
        }
        for b in &r.batches {
            let rb = RecordBatch::parse(b).expect("stored batch is valid");
            for rec in rb.records().expect("records").iter() {
                let rec = rec.expect("record");
                let offset = rec.offset as u64;
                if offset < at {
                    continue;
                }
                if let Some(prev) = out.last() {
                    assert!(
                        offset > prev.offset,
                        "offsets go back: {offset} after {}",
                        prev.offset
                    );
                }
                out.push(Rec {
                    offset,
                    key: rec.record.key.map(<[u8]>::to_vec).unwrap_or_default(),
                    value: rec.record.value.map(<[u8]>::to_vec),
                });
            }
        }
        assert!(r.next_offset > at, "read did not progress at {at}");
        at = r.next_offset;
    }
    out
}

macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!($($arg)+));
        }
    };
}

/// The model: every record appended, and what the passes so far allow.
#[derive(Default)]
struct Model {
    all: BTreeMap<u64, Rec>,
    /// The log's clean part ends here (from the last report).
    first_dirty: u64,
    /// Tombstone offset → when a pass first cleaned it.
    first_cleaned: HashMap<u64, i64>,
    /// Tombstones seen dropped by a pass that was allowed to.
    dropped_ok: HashSet<u64>,
}

impl Model {
    fn latest(&self) -> HashMap<&[u8], &Rec> {
        let mut m = HashMap::new();
        for r in self.all.values() {
            m.insert(r.key.as_slice(), r);
        }
        m
    }

    /// Records a pass at `now` that left the clean part ending at `first_dirty`.
    fn passed(&mut self, now: i64, first_dirty: u64) {
        for r in self.all.range(..first_dirty).map(|(_, r)| r) {
            if r.value.is_none() {
                self.first_cleaned.entry(r.offset).or_insert(now);
            }
        }
        self.first_dirty = self.first_dirty.max(first_dirty);
    }

    /// Checks the log's records against the model. `pass_at`: a pass just
    /// ran at this time (tombstones found missing now must have been
    /// allowed to go).
    fn check(&mut self, got: &[Rec], pass_at: Option<i64>) -> Result<(), String> {
        for r in got {
            let want = self.all.get(&r.offset);
            ensure!(
                want == Some(r),
                "record at {} is {:?}, model has {:?}",
                r.offset,
                r,
                want
            );
        }
        let present: HashSet<u64> = got.iter().map(|r| r.offset).collect();
        // The dirty part is untouched.
        for r in self.all.range(self.first_dirty..).map(|(_, r)| r) {
            ensure!(
                present.contains(&r.offset),
                "dirty record {} missing",
                r.offset
            );
        }
        // The clean part holds one record per key.
        let mut keys = HashSet::new();
        for r in got.iter().filter(|r| r.offset < self.first_dirty) {
            ensure!(
                keys.insert(r.key.clone()),
                "key {:?} twice in the clean part (second at {})",
                r.key,
                r.offset
            );
        }
        // The latest record of every key is there; a tombstone may be gone
        // once delete.retention.ms passed since it was first cleaned.
        let latest: Vec<(u64, bool)> = self
            .latest()
            .values()
            .map(|r| (r.offset, r.value.is_none()))
            .collect();
        for (offset, tomb) in latest {
            if present.contains(&offset) {
                continue;
            }
            ensure!(tomb, "latest value at {offset} missing");
            if self.dropped_ok.contains(&offset) {
                continue;
            }
            let allowed = match (pass_at, self.first_cleaned.get(&offset)) {
                (Some(t), Some(&f)) => t - f >= RETENTION_MS,
                _ => false,
            };
            ensure!(allowed, "tombstone at {offset} dropped too early");
            self.dropped_ok.insert(offset);
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum Op {
    Append {
        keys: Vec<(u8, bool, u8)>,
        codec: u8,
    },
    Clean {
        force: bool,
    },
    Advance {
        ms: i64,
    },
    Reopen,
}

fn op(keys: u8) -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (prop::collection::vec((0..keys, prop::bool::weighted(0.15), 0u8..200), 1..6), 0u8..3)
            .prop_map(|(keys, codec)| Op::Append { keys, codec }),
        3 => any::<bool>().prop_map(|force| Op::Clean { force }),
        2 => (0i64..3_000).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Reopen),
    ]
}

fn value_for(offset: u64, len: u8) -> Vec<u8> {
    let mut v = offset.to_be_bytes().to_vec();
    v.resize(8 + len as usize, (offset % 251) as u8);
    v
}

async fn run_model(ops: Vec<Op>, budget: u64, chunk: u64, dir: PathBuf) -> Result<(), String> {
    let clock = ManualClock::new(T0);
    let sh = shard_with(&clock, budget, chunk);
    let open = |sh: StorageShard| {
        let dir = dir.clone();
        async move {
            PartitionLog::open(&sh, &dir, config("compact"))
                .await
                .map(|(l, _)| l)
                .map_err(|e| format!("open: {e}"))
        }
    };
    let mut log = open(sh.clone()).await?;
    let mut m = Model::default();
    for op in ops {
        let mut pass_at = None;
        match op {
            Op::Append { keys, codec } => {
                let next = log.log_end_offset();
                let recs: Vec<(Vec<u8>, Option<Vec<u8>>)> = keys
                    .iter()
                    .enumerate()
                    .map(|(i, &(k, tomb, len))| {
                        let v = (!tomb).then(|| value_for(next + i as u64, len));
                        (vec![b'k', k], v)
                    })
                    .collect();
                let codec =
                    [Compression::None, Compression::Lz4, Compression::Zstd][codec as usize];
                let info = log
                    .append_acked(keyed(&recs, clock.now_ms(), codec))
                    .await
                    .map_err(|e| format!("append: {e}"))?;
                for (i, (k, v)) in recs.into_iter().enumerate() {
                    let offset = info.base_offset + i as u64;
                    m.all.insert(
                        offset,
                        Rec {
                            offset,
                            key: k,
                            value: v,
                        },
                    );
                }
            }
            Op::Clean { force } => {
                let now = clock.now_ms();
                if let Some(rep) = log.clean(force).await.map_err(|e| format!("clean: {e}"))? {
                    ensure!(
                        rep.dirty_ratio_after <= rep.dirty_ratio_before + 1e-9 || rep.map_full,
                        "dirty ratio grew: {rep:?}"
                    );
                    m.passed(now, rep.first_dirty);
                    pass_at = Some(now);
                }
            }
            Op::Advance { ms } => clock.advance(ms),
            Op::Reopen => {
                log.close().await.map_err(|e| format!("close: {e}"))?;
                log = open(sh.clone()).await?;
            }
        }
        let got = read_all(&log).await;
        m.check(&got, pass_at)?;
        ensure!(
            log.log_end_offset() == m.all.keys().next_back().map_or(0, |o| o + 1),
            "log end moved"
        );
    }
    log.close().await.map_err(|e| format!("close: {e}"))?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: common::regressions_beside_source(),
        ..ProptestConfig::default()
    })]

    #[test]
    fn cleaner_matches_the_model(
        keys in 2u8..40,
        budget in prop::sample::select(vec![32u64 * 4, 32 * 16, 64 << 20]),
        chunk in prop::sample::select(vec![7u64, 61, 200, 1000, 4096, 1 << 20]),
        seed_ops in prop::collection::vec(any::<prop::sample::Index>(), 20..80),
        ops_pool in prop::collection::vec(op(40), 80),
    ) {
        let ops: Vec<Op> = seed_ops
            .iter()
            .map(|i| {
                let mut op = i.get(&ops_pool).clone();
                if let Op::Append { keys: ks, .. } = &mut op {
                    for k in ks.iter_mut() {
                        k.0 %= keys;
                    }
                }
                op
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t-0");
        let r = run_ret(move || run_model(ops, budget, chunk, path));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

/// A compacted log `t-0` in a new directory, on a shard with a manual clock.
async fn compacted_log() -> (tempfile::TempDir, ManualClock, StorageShard, PartitionLog) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let sh = shard(&clock, 64 << 20);
    let (log, _) = PartitionLog::open(&sh, dir.path().join("t-0"), config("compact"))
        .await
        .unwrap();
    (dir, clock, sh, log)
}

/// Appends `n` single-record batches over `keys` keys (value = offset).
async fn fill(log: &PartitionLog, clock: &ManualClock, n: u64, keys: u64) {
    for i in 0..n {
        let k = format!("key-{}", i % keys).into_bytes();
        let v = log.log_end_offset().to_be_bytes().to_vec();
        log.append_acked(keyed(&[(k, Some(v))], clock.now_ms(), Compression::None))
            .await
            .unwrap();
    }
}

#[test]
fn reading_a_compacted_log_from_the_start_yields_the_latest_value_of_every_key() {
    run(|| async {
        let (dir, clock, sh, log) = compacted_log().await;
        fill(&log, &clock, 3000, 50).await;
        let before = log.size_bytes();
        assert!(log.dirty_ratio() > 0.99, "{}", log.dirty_ratio());
        let rep = log.clean(false).await.unwrap().expect("a pass");
        assert!(rep.records_removed > 2000, "{rep:?}");
        assert!(
            log.size_bytes() < before / 5,
            "{} of {before}",
            log.size_bytes()
        );
        assert_eq!(log.dirty_ratio(), 0.0);
        assert_eq!(log.log_end_offset(), 3000);
        let got = read_all(&log).await;
        // Below the active segment: one record per key, its latest value.
        let clean: Vec<&Rec> = got.iter().filter(|r| r.offset < rep.first_dirty).collect();
        let mut latest: HashMap<Vec<u8>, u64> = HashMap::new();
        for o in 0..rep.first_dirty {
            latest.insert(format!("key-{}", o % 50).into_bytes(), o);
        }
        let mut want: Vec<u64> = latest.values().copied().collect();
        want.sort_unstable();
        let have: Vec<u64> = clean.iter().map(|r| r.offset).collect();
        assert_eq!(have, want);
        for r in &clean {
            assert_eq!(r.value.as_deref(), Some(&r.offset.to_be_bytes()[..]));
        }
        // Everything after is untouched.
        let dirty = got.iter().filter(|r| r.offset >= rep.first_dirty).count() as u64;
        assert_eq!(dirty, 3000 - rep.first_dirty);
        // A read inside a removed range continues at the next survivor.
        // (The survivors are the last record of each key: offset 0 up to
        // the first survivor is one removed range.)
        assert!(have[0] > 0);
        let (gap, inside) = (0, have[0] / 2);
        // (Reading as a consumer does: one small read at a time, going on
        // after the last batch returned, which may hold no records.)
        let mut at = inside;
        let mut first = None;
        for _ in 0..1000 {
            let r = log.read(at, 1).await.unwrap();
            first = r
                .batches
                .iter()
                .flat_map(|b| {
                    let rb = RecordBatch::parse(b).unwrap();
                    rb.records()
                        .unwrap()
                        .iter()
                        .map(|r| r.unwrap().offset as u64)
                        .collect::<Vec<_>>()
                })
                .find(|&o| o >= inside);
            if first.is_some() || r.next_offset >= log.high_watermark() {
                break;
            }
            at = r.next_offset;
        }
        assert_eq!(first, Some(have[gap]));
        // Nothing new: a second pass does nothing unless asked; asked, it
        // groups the small cleaned segments into fewer files and changes
        // no record; the result survives a reopen.
        assert!(log.clean(false).await.unwrap().is_none());
        let segments = log.segment_count();
        let rep = log.clean(true).await.unwrap().expect("a forced pass");
        assert!(
            rep.segments_after * 3 <= rep.segments_before && log.segment_count() < segments,
            "{rep:?}"
        );
        assert_eq!(rep.records_removed, 0);
        assert_eq!(read_all(&log).await, got);
        log.close().await.unwrap();
        let (log, rep) = PartitionLog::open(&sh, dir.path().join("t-0"), config("compact"))
            .await
            .unwrap();
        assert!(rep.clean);
        assert_eq!(read_all(&log).await, got);
        assert_eq!(log.dirty_ratio(), 0.0);
        log.close().await.unwrap();
    });
}

#[test]
fn tombstones_vanish_only_after_delete_retention() {
    run(|| async {
        let (_dir, clock, _sh, log) = compacted_log().await;
        let put = |k: &str, v: Option<&str>| {
            keyed(
                &[(k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()))],
                clock.now_ms(),
                Compression::None,
            )
        };
        log.append_acked(put("a", Some("1"))).await.unwrap();
        log.append_acked(put("b", Some("1"))).await.unwrap();
        let tomb = log.append_acked(put("a", None)).await.unwrap().base_offset;
        // Roll past them.
        fill(&log, &clock, 200, 10).await;
        let keys_of = |got: &[Rec]| -> Vec<(String, bool)> {
            got.iter()
                .filter(|r| r.offset <= tomb)
                .map(|r| {
                    (
                        String::from_utf8_lossy(&r.key).into_owned(),
                        r.value.is_some(),
                    )
                })
                .collect()
        };
        log.clean(true).await.unwrap().expect("first pass");
        assert_eq!(
            keys_of(&read_all(&log).await),
            [("b".to_string(), true), ("a".to_string(), false)],
            "a's value is gone, its tombstone stays"
        );
        clock.advance(RETENTION_MS - 1);
        let rep = log.clean(true).await.unwrap().expect("second pass");
        assert_eq!(rep.tombstones_removed, 0);
        assert_eq!(
            keys_of(&read_all(&log).await).len(),
            2,
            "kept within delete.retention.ms"
        );
        clock.advance(1);
        let rep = log.clean(true).await.unwrap().expect("third pass");
        assert_eq!(rep.tombstones_removed, 1, "{rep:?}");
        assert_eq!(keys_of(&read_all(&log).await), [("b".to_string(), true)]);
        log.close().await.unwrap();
    });
}

#[test]
fn compact_delete_also_drops_old_segments_by_time_and_compact_alone_does_not() {
    for (policy, deletes) in [
        ("compact,delete", true),
        ("compact", false),
        ("delete", true),
    ] {
        run(move || async move {
            let dir = tempfile::tempdir().unwrap();
            let clock = ManualClock::new(T0);
            let sh = shard(&clock, 64 << 20);
            let mut cfg = config(policy);
            cfg.set("retention.ms", "60000").unwrap();
            let (log, _) = PartitionLog::open(&sh, dir.path().join("t-0"), cfg)
                .await
                .unwrap();
            fill(&log, &clock, 300, 300).await;
            let segments = log.segment_count();
            assert!(segments > 3, "{segments}");
            clock.advance(120_000);
            let rep = log.enforce_retention().await.unwrap();
            if deletes {
                assert_eq!(rep.segments_deleted, segments - 1, "{policy}");
                assert_eq!(log.segment_count(), 1);
                assert!(log.log_start_offset() > 0);
            } else {
                assert_eq!(rep.segments_deleted, 0, "{policy}");
                assert_eq!(log.segment_count(), segments);
                assert_eq!(log.log_start_offset(), 0);
            }
            log.close().await.unwrap();
        });
    }
}

#[test]
fn unique_keys_leave_the_size_unchanged_and_the_cleaner_does_not_loop() {
    run(|| async {
        let (_dir, clock, _sh, log) = compacted_log().await;
        fill(&log, &clock, 1000, u64::MAX).await;
        let before = read_all(&log).await;
        let size = log.size_bytes();
        let rep = log.clean(false).await.unwrap().expect("a pass");
        assert_eq!(rep.records_removed, 0);
        assert_eq!(log.size_bytes(), size);
        assert_eq!(rep.dirty_ratio_after, 0.0);
        // Nothing dirty: no further pass, however often asked.
        for _ in 0..3 {
            assert!(log.clean(false).await.unwrap().is_none());
        }
        assert_eq!(read_all(&log).await, before);
        log.close().await.unwrap();
    });
}

#[test]
fn a_full_map_compacts_what_fits_and_the_next_pass_continues() {
    run(|| async {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(T0);
        // Room for 20 keys; the log has 200 keys, each written 3 times.
        let sh = shard(&clock, 32 * 20);
        let (log, _) = PartitionLog::open(&sh, dir.path().join("t-0"), config("compact"))
            .await
            .unwrap();
        fill(&log, &clock, 600, 200).await;
        let mut passes = 0;
        let mut first_dirty = 0;
        while let Some(rep) = log.clean(false).await.unwrap() {
            passes += 1;
            assert!(rep.first_dirty > first_dirty, "no progress: {rep:?}");
            first_dirty = rep.first_dirty;
            assert!(passes < 100, "cleaner loops");
            if !rep.map_full {
                break;
            }
        }
        assert!(passes > 5, "{passes} passes");
        let got = read_all(&log).await;
        let clean: Vec<&Rec> = got.iter().filter(|r| r.offset < first_dirty).collect();
        let keys: HashSet<&[u8]> = clean.iter().map(|r| r.key.as_slice()).collect();
        assert_eq!(
            keys.len(),
            clean.len(),
            "one record per key in the clean part"
        );
        log.close().await.unwrap();
    });
}

#[test]
fn a_compacted_log_refuses_records_without_a_key_and_appends_nothing() {
    run(|| async {
        let (dir, _clock, sh, log) = compacted_log().await;
        let mut b = BatchBuilder::new(Compression::Lz4).unwrap();
        for key in [Some(Bytes::from_static(b"k")), None] {
            b.push(&RecordData {
                key,
                value: Some(Bytes::from_static(b"v")),
                headers: Vec::new(),
                timestamp: T0,
            })
            .unwrap();
        }
        let e = log.append(b.build().unwrap()).await.unwrap_err();
        assert!(
            matches!(e, StorageError::KeyRequired { index: 1, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("needs a key"), "{e}");
        assert_eq!(log.log_end_offset(), 0);
        log.close().await.unwrap();
        // A delete-policy log takes them.
        let (log, _) = PartitionLog::open(&sh, dir.path().join("u-0"), config("delete"))
            .await
            .unwrap();
        log.append_acked(b.build().unwrap()).await.unwrap();
        assert_eq!(log.log_end_offset(), 2);
        log.close().await.unwrap();
    });
}

#[test]
fn reads_go_on_while_a_pass_runs() {
    run(|| async {
        let (_dir, clock, _sh, log) = compacted_log().await;
        fill(&log, &clock, 4000, 100).await;
        let done = Rc::new(std::cell::Cell::new(false));
        let reader = {
            let (log, done) = (log.clone(), done.clone());
            glommio::spawn_local(async move {
                let mut reads = 0u64;
                let started = Instant::now();
                while !done.get() && started.elapsed() < Duration::from_secs(30) {
                    // Every record read is the one written at its offset.
                    for r in read_all(&log).await {
                        assert_eq!(r.value.as_deref(), Some(&r.offset.to_be_bytes()[..]));
                    }
                    reads += 1;
                    // A reader that never waits would hold the core: the
                    // pass's I/O completions are reaped only when the
                    // executor polls its rings, at the latest once per
                    // preempt period (100 ms), so the pass would take
                    // until the reader gave up.
                    glommio::timer::sleep(Duration::from_millis(1)).await;
                }
                reads
            })
        };
        let rep = log.clean(true).await.unwrap().expect("a pass");
        done.set(true);
        let reads = reader.await;
        assert!(reads >= 1);
        assert!(rep.records_removed > 3000, "{rep:?}");
        log.close().await.unwrap();
    });
}

// ---- crashes during compaction ----

const CHILD_DIR_VAR: &str = "WEIR_COMPACT_CHILD_DIR";

/// The child: cleans the log in `WEIR_COMPACT_CHILD_DIR` until killed.
#[test]
fn compaction_crash_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR_VAR) else {
        return;
    };
    println!();
    run(move || async move {
        let sh = StorageShard::new(ShardConfig {
            prealloc_step: 0,
            ..ShardConfig::default()
        });
        let (log, _) = PartitionLog::open(&sh, PathBuf::from(dir), config("compact"))
            .await
            .expect("child opens the log");
        println!("OPEN");
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            log.clean(true).await.expect("pass");
            println!("PASS");
        }
    });
}

/// Runs the child on `dir` and kills it after `kill_after` (or lets a
/// fail point abort it).
fn crash_child(dir: &Path, kill_after: Duration, fail_point: Option<&str>) {
    use std::io::BufRead;
    let mut cmd = common::child_test(&common::test_name(module_path!(), "compaction_crash_child"));
    cmd.env(CHILD_DIR_VAR, dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    if let Some(fp) = fail_point {
        cmd.env("WEIR_CLEANER_FAIL_POINT", fp);
    }
    let mut child = cmd.spawn().unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // Wait for the child to have the log open, then let it clean a while.
    let opened = lines.by_ref().any(|l| l.unwrap() == "OPEN");
    if !opened {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the child ended without opening the log");
    }
    if fail_point.is_none() {
        std::thread::sleep(kill_after);
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child was meant to die");
}

/// Writes a model log: `n` records over `keys` keys, some tombstones.
fn prepare(dir: &Path, seed: u64, first: u64, n: u64, keys: u64) -> Vec<Rec> {
    let dir = dir.to_path_buf();
    run_ret(move || async move {
        let clock = ManualClock::new(T0);
        let sh = shard(&clock, 64 << 20);
        let (log, _) = PartitionLog::open(&sh, &dir, config("compact"))
            .await
            .unwrap();
        assert_eq!(log.log_end_offset(), first);
        let mut rng = Rng::new(seed);
        let mut recs = Vec::new();
        let mut i = 0;
        while i < n {
            let len = rng.range(1, 6).min(n - i);
            let mut batch = Vec::new();
            for j in 0..len {
                let offset = first + i + j;
                let key = format!("k{}", rng.range(0, keys)).into_bytes();
                let value =
                    (rng.range(0, 10) > 0).then(|| value_for(offset, rng.range(0, 100) as u8));
                batch.push((key.clone(), value.clone()));
                recs.push(Rec { offset, key, value });
            }
            log.append_acked(keyed(&batch, T0, Compression::None))
                .await
                .unwrap();
            i += len;
        }
        log.close().await.unwrap();
        recs
    })
}

/// Reopens after a crash and checks the log against the model.
fn verify_after_crash(dir: &Path, m: &mut Model, what: &str) {
    let dir = dir.to_path_buf();
    let got = run_ret(move || async move {
        let clock = ManualClock::new(T0);
        let sh = shard(&clock, 64 << 20);
        let (log, _) = PartitionLog::open(&sh, &dir, config("compact"))
            .await
            .unwrap_or_else(|e| panic!("reopen failed: {e}"));
        let leftovers: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".cleaned") || n.ends_with(".swap"))
            .collect();
        assert!(leftovers.is_empty(), "left over: {leftovers:?}");
        let got = read_all(&log).await;
        log.close().await.unwrap();
        got
    });
    // Every record left is the one written at its offset, and the latest
    // value of every key survived (tombstones are not checked: the child's
    // clock is not known here).
    let present: HashSet<u64> = got.iter().map(|r| r.offset).collect();
    for r in &got {
        assert_eq!(
            m.all.get(&r.offset),
            Some(r),
            "{what}: record at {}",
            r.offset
        );
    }
    for r in m.latest().values() {
        assert!(
            present.contains(&r.offset) || r.value.is_none(),
            "{what}: latest value at {} lost",
            r.offset
        );
    }
}

#[test]
fn a_crash_at_any_point_of_a_pass_leaves_old_or_new_segments() {
    let seed = seed_from_env("WEIR_COMPACT_CRASH_SEED");
    eprintln!("seed {seed} (replay with WEIR_COMPACT_CRASH_SEED={seed})");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    let mut m = Model::default();
    let started = Instant::now();
    let mut round = 0u64;
    let points = [
        Some("decided"),
        Some("replaced-removed"),
        None,
        None,
        None,
        None,
    ];
    while round < 8 && (round < 4 || started.elapsed() < Duration::from_secs(25)) {
        let first = m.all.keys().next_back().map_or(0, |o| o + 1);
        for r in prepare(&path, rng.next_u64(), first, 3000, 200) {
            m.all.insert(r.offset, r);
        }
        let fp = points[round as usize % points.len()];
        let kill_after = Duration::from_millis(rng.range(1, 150));
        crash_child(&path, kill_after, fp);
        let swaps = std::fs::read_dir(&path)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".log.swap")
            })
            .count();
        if fp.is_some() {
            assert_eq!(
                swaps, 1,
                "round {round}: the fail point {fp:?} leaves a decided swap"
            );
        }
        verify_after_crash(
            &path,
            &mut m,
            &format!("round {round} ({fp:?}, {kill_after:?})"),
        );
        round += 1;
    }
}

/// A keyed batch of producer `pid`'s transaction.
fn txn_keyed(pid: i64, seq: i32, key: &str, value: &str, ts: i64) -> BytesMut {
    let mut b = BatchBuilder::new(Compression::None).unwrap();
    (
        b.producer_id,
        b.producer_epoch,
        b.base_sequence,
        b.transactional,
    ) = (pid, 0, seq, true);
    b.push(&RecordData {
        key: Some(Bytes::copy_from_slice(key.as_bytes())),
        value: Some(Bytes::copy_from_slice(value.as_bytes())),
        headers: Vec::new(),
        timestamp: ts,
    })
    .unwrap();
    b.build().unwrap()
}

/// Compaction of a log with transactions (Kafka's rules): an aborted
/// transaction's records are dropped and never stand for their key (an
/// aborted later value does not remove a committed earlier one), the
/// markers stay, and nothing at or past an open transaction is cleaned.
#[test]
fn compaction_drops_aborted_records_keeps_markers_and_stops_at_an_open_transaction() {
    use weir_storage::txn::{Marker, MarkerKind};
    run(|| async {
        let marker = |kind| Marker {
            kind,
            coordinator_epoch: 0,
        };
        let (_dir, clock, _sh, log) = compacted_log().await;
        let ts = clock.now_ms();
        // Committed: k = "committed"; then aborted: k = "aborted".
        log.append_acked(txn_keyed(1, 0, "k", "committed", ts))
            .await
            .unwrap();
        let m = log
            .append_marker(1, 0, marker(MarkerKind::Commit), ts)
            .await
            .unwrap();
        log.wait_acked(&m).await.unwrap();
        log.append_acked(txn_keyed(2, 0, "k", "aborted", ts))
            .await
            .unwrap();
        log.append_acked(txn_keyed(2, 1, "j", "aborted", ts))
            .await
            .unwrap();
        let m = log
            .append_marker(2, 0, marker(MarkerKind::Abort), ts)
            .await
            .unwrap();
        log.wait_acked(&m).await.unwrap();
        // Enough plain records to roll segments, then an open transaction.
        fill(&log, &clock, 200, 10).await;
        let open_at = log.log_end_offset();
        log.append_acked(txn_keyed(3, 0, "k", "open", ts))
            .await
            .unwrap();
        fill(&log, &clock, 200, 10).await;
        assert_eq!(log.last_stable_offset(), open_at);
        let before = log.segment_count();
        let rep = log.clean(true).await.unwrap().expect("a forced pass");
        assert!(rep.records_removed > 0, "{rep:?}");
        let all = read_all(&log).await;
        let value = |k: &str| -> Vec<String> {
            all.iter()
                .filter(|r| r.key == k.as_bytes())
                .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into())
                .collect()
        };
        // The committed value stands; the aborted ones are gone; the open
        // transaction's record (past the last stable offset) is untouched.
        assert_eq!(value("k"), ["committed", "open"], "{before} segments");
        assert!(value("j").is_empty());
        // Both markers are still in the log.
        let mut markers = 0;
        let mut at = 0;
        while at < log.high_watermark() {
            let r = log.read(at, 1 << 20).await.unwrap();
            for b in &r.batches {
                let h = weir_proto::batch::BatchHeader::peek(b).unwrap();
                markers += usize::from(h.attributes.is_control());
                at = at.max(h.last_offset() as u64 + 1);
            }
            if r.batches.is_empty() {
                break;
            }
        }
        assert_eq!(markers, 2);
        assert_eq!(log.last_stable_offset(), open_at);
        log.close().await.unwrap();
    });
}
