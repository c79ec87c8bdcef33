//! The log against a simple in-memory model, driven by random operation
//! sequences: appends, reads, timestamp lookups, retention, truncation,
//! `delete_before`, clean and unclean reopens, with segments small enough
//! that every sequence rolls a few.

use crate::common;

use std::path::Path;
use std::rc::Rc;

use common::*;
use proptest::prelude::*;
use weir_proto::batch::BatchHeader;
use weir_storage::{LogConfig, ManualClock, PartitionLog, ShardConfig, StorageError, StorageShard};

/// The shard clock (ms); record timestamps start here.
const T0: i64 = 1_700_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    Append { records: usize, len: usize },
    Read { at: u64, max_bytes: u64 },
    Timestamp { pick: u64 },
    Retention { max_bytes: u64 },
    Truncate { pick: u64 },
    DeleteBefore { pick: u64 },
    CleanReopen,
    UncleanReopen,
}

#[derive(Debug, Clone)]
struct Setup {
    segment_bytes: u64,
    index_interval: u64,
    prealloc_step: u64,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (1usize..=5, 0usize..3000).prop_map(|(records, len)| Op::Append { records, len }),
        4 => (any::<u64>(), 1u64..20_000).prop_map(|(at, max_bytes)| Op::Read { at, max_bytes }),
        2 => any::<u64>().prop_map(|pick| Op::Timestamp { pick }),
        2 => prop_oneof![Just(0u64), 0u64..10_000, 0u64..40_000]
            .prop_map(|max_bytes| Op::Retention { max_bytes }),
        1 => any::<u64>().prop_map(|pick| Op::Truncate { pick }),
        1 => any::<u64>().prop_map(|pick| Op::DeleteBefore { pick }),
        1 => Just(Op::CleanReopen),
        1 => Just(Op::UncleanReopen),
    ]
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop::sample::select(vec![4096u64, 8192, 32 << 10]),
        prop::sample::select(vec![0u64, 512, 4096]),
        prop::sample::select(vec![0u64, 16 << 10, 32 << 20]),
    )
        .prop_map(|(segment_bytes, index_interval, prealloc_step)| Setup {
            segment_bytes,
            index_interval,
            prealloc_step,
        })
}

struct MBatch {
    base: u64,
    last: u64,
    bytes: Vec<u8>,
    /// Timestamp of each record, in offset order.
    times: Vec<i64>,
}

#[derive(Default)]
struct Model {
    /// Batches with at least one record at or after `log_start`.
    batches: Vec<MBatch>,
    log_start: u64,
    next: u64,
    next_ts: i64,
}

impl Model {
    fn drop_below_start(&mut self) {
        let start = self.log_start;
        self.batches.retain(|b| b.last >= start);
    }
    /// A valid offset in `log_start..=next` chosen by `pick`.
    fn pick(&self, pick: u64) -> u64 {
        self.log_start + pick % (self.next - self.log_start + 1)
    }
}

macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!($($arg)+));
        }
    };
}

fn config(s: &Setup) -> LogConfig {
    let mut c = LogConfig::default();
    c.set("segment.bytes", &s.segment_bytes.to_string())
        .unwrap();
    c.set("index.interval.bytes", &s.index_interval.to_string())
        .unwrap();
    c.set("retention.ms", "-1").unwrap();
    c
}

async fn open(
    s: &Setup,
    clock: &ManualClock,
    path: &Path,
) -> Result<(PartitionLog, weir_storage::RecoveryReport), String> {
    let shard = StorageShard::with_clock(
        ShardConfig {
            prealloc_step: s.prealloc_step,
            ..ShardConfig::default()
        },
        Rc::new(clock.clone()),
    );
    PartitionLog::open(&shard, path, config(s))
        .await
        .map_err(|e| format!("open: {e}"))
}

/// Checks watermarks and segment bases against the model.
fn check_marks(log: &PartitionLog, m: &Model) -> Result<(), String> {
    ensure!(
        log.log_start_offset() == m.log_start,
        "log start {} != model {}",
        log.log_start_offset(),
        m.log_start
    );
    ensure!(
        log.log_end_offset() == m.next,
        "log end {} != model {}",
        log.log_end_offset(),
        m.next
    );
    ensure!(
        log.high_watermark() == m.next,
        "high watermark {} != {}",
        log.high_watermark(),
        m.next
    );
    let bases = log.segment_bases();
    ensure!(!bases.is_empty(), "no segment");
    ensure!(
        bases[0] <= m.log_start,
        "first segment {} starts after log start {}",
        bases[0],
        m.log_start
    );
    ensure!(
        *bases.last().unwrap() <= m.next,
        "active segment {bases:?} past the log end {}",
        m.next
    );
    Ok(())
}

/// Reads everything from the log start and compares it with the model.
async fn check_all(log: &PartitionLog, m: &Model, max_bytes: u64) -> Result<(), String> {
    let got = read_to_end(log, m.log_start, max_bytes)
        .await
        .map_err(|e| format!("read to end: {e}"))?;
    ensure!(
        got.len() == m.batches.len(),
        "{} batches read, model has {}",
        got.len(),
        m.batches.len()
    );
    for ((base, bytes), b) in got.iter().zip(&m.batches) {
        ensure!(*base == b.base, "batch at {base}, model at {}", b.base);
        ensure!(bytes[..] == b.bytes[..], "batch at {base} differs");
    }
    Ok(())
}

async fn check_read(log: &PartitionLog, m: &Model, at: u64, max_bytes: u64) -> Result<(), String> {
    let r = log
        .read(at, max_bytes)
        .await
        .map_err(|e| format!("read {at}: {e}"))?;
    ensure!(
        r.high_watermark == m.next && r.log_start_offset == m.log_start,
        "read marks {} {}",
        r.high_watermark,
        r.log_start_offset
    );
    if at == m.next {
        ensure!(r.batches.is_empty(), "read at the log end returned data");
        ensure!(r.next_offset == at, "next offset {}", r.next_offset);
        return Ok(());
    }
    ensure!(!r.batches.is_empty(), "read at {at} returned nothing");
    let first = m
        .batches
        .iter()
        .position(|b| b.base <= at && at <= b.last)
        .ok_or_else(|| format!("model has no batch holding {at}"))?;
    let mut total = 0;
    for (k, got) in r.batches.iter().enumerate() {
        let want = m
            .batches
            .get(first + k)
            .ok_or_else(|| format!("read at {at} returned more batches than the log has"))?;
        ensure!(
            got[..] == want.bytes[..],
            "read at {at}: batch {k} is not the batch at {}",
            want.base
        );
        total += got.len() as u64;
    }
    ensure!(
        r.batches.len() == 1 || total <= max_bytes,
        "read at {at} returned {total} bytes for max {max_bytes}"
    );
    let last = &m.batches[first + r.batches.len() - 1];
    ensure!(
        r.next_offset == last.last + 1,
        "next offset {} after batch ending {}",
        r.next_offset,
        last.last
    );
    Ok(())
}

/// Out-of-range requests fail cleanly and change nothing.
async fn check_bad_offsets(log: &PartitionLog, m: &Model) -> Result<(), String> {
    let is_range = |e: &StorageError| matches!(e, StorageError::OffsetOutOfRange { .. });
    match log.read(m.next + 1, 100).await {
        Err(e) if is_range(&e) => {}
        other => return Err(format!("read past the end: {other:?}")),
    }
    match log.delete_before(m.next + 1).await {
        Err(e) if is_range(&e) => {}
        other => return Err(format!("delete_before past the end: {other:?}")),
    }
    if m.log_start > 0 {
        match log.read(m.log_start - 1, 100).await {
            Err(e) if is_range(&e) => {}
            other => return Err(format!("read before the start: {other:?}")),
        }
        match log.truncate_to(m.log_start - 1).await {
            Err(e) if is_range(&e) => {}
            other => return Err(format!("truncate before the start: {other:?}")),
        }
    }
    Ok(())
}

async fn apply(
    mut log: PartitionLog,
    m: &mut Model,
    s: &Setup,
    clock: &ManualClock,
    path: &Path,
    op: &Op,
) -> Result<PartitionLog, String> {
    match *op {
        Op::Append { records, len } => {
            let b = records_batch(m.next, records, len / records, m.next_ts);
            let info = log
                .append_acked(b.clone())
                .await
                .map_err(|e| format!("append: {e}"))?;
            ensure!(
                info.base_offset == m.next && info.records as usize == records,
                "append got {info:?}, model next {}",
                m.next
            );
            m.batches.push(MBatch {
                base: info.base_offset,
                last: info.last_offset,
                bytes: stored(b, info.base_offset),
                times: (0..records as i64).map(|r| m.next_ts + r).collect(),
            });
            m.next = info.last_offset + 1;
            m.next_ts += records as i64 + (m.next % 3) as i64;
        }
        Op::Read { at, max_bytes } => {
            check_read(&log, m, m.pick(at), max_bytes).await?;
            check_bad_offsets(&log, m).await?;
        }
        Op::Timestamp { pick } => {
            let times: Vec<(u64, i64)> = m
                .batches
                .iter()
                .flat_map(|b| {
                    b.times
                        .iter()
                        .enumerate()
                        .map(|(r, t)| (b.base + r as u64, *t))
                })
                .filter(|(o, _)| *o >= m.log_start)
                .collect();
            let (lo, hi) = match (times.first(), times.last()) {
                (Some(a), Some(b)) => (a.1 - 3, b.1 + 3),
                _ => (T0 - 3, T0 + 3),
            };
            let ts = lo + (pick % (hi - lo + 1) as u64) as i64;
            let want = times.iter().find(|(_, t)| *t >= ts).map(|(o, _)| *o);
            let got = log
                .offset_for_timestamp(ts)
                .await
                .map_err(|e| format!("offset_for_timestamp: {e}"))?;
            ensure!(
                got == want,
                "offset for timestamp {ts}: {got:?}, model {want:?}"
            );
        }
        Op::Retention { max_bytes } => {
            let before = log.segment_bases();
            let start_before = log.log_start_offset();
            let mut c = config(s);
            c.retention_bytes = Some(max_bytes);
            log.set_config(c);
            let rep = log
                .enforce_retention()
                .await
                .map_err(|e| format!("retention: {e}"))?;
            log.set_config(config(s));
            let after = log.segment_bases();
            let k = rep.segments_deleted;
            ensure!(
                k < before.len() && after[..] == before[k..],
                "retention deleted {k} of {before:?}, left {after:?}"
            );
            ensure!(
                rep.log_start_offset == log.log_start_offset(),
                "report says log start {}, log {}",
                rep.log_start_offset,
                log.log_start_offset()
            );
            let want = if k > 0 {
                start_before.max(after[0])
            } else {
                start_before
            };
            ensure!(
                rep.log_start_offset == want,
                "log start after retention {} (was {start_before}, segments {after:?})",
                rep.log_start_offset
            );
            m.log_start = want;
            m.drop_below_start();
        }
        Op::Truncate { pick } => {
            let at = m.pick(pick);
            let want = match m.batches.iter().find(|b| b.base <= at && at <= b.last) {
                Some(b) => b.base,
                None => m.next,
            };
            let got = log
                .truncate_to(at)
                .await
                .map_err(|e| format!("truncate_to {at}: {e}"))?;
            ensure!(got == want, "truncate_to({at}) = {got}, model {want}");
            m.batches.retain(|b| b.base < want);
            m.next = want;
            m.log_start = m.log_start.min(want);
        }
        Op::DeleteBefore { pick } => {
            // Sometimes below the log start: then nothing changes.
            let at = m.pick(pick).saturating_sub(pick % 4);
            let want = at.max(m.log_start);
            let got = log
                .delete_before(at)
                .await
                .map_err(|e| format!("delete_before {at}: {e}"))?;
            ensure!(got == want, "delete_before({at}) = {got}, model {want}");
            m.log_start = want;
            m.drop_below_start();
        }
        Op::CleanReopen => {
            log.close().await.map_err(|e| format!("close: {e}"))?;
            let (l, rep) = open(s, clock, path).await?;
            ensure!(
                rep.clean && rep.scanned_segments == 0 && rep.truncated_bytes == 0,
                "clean reopen: {rep:?}"
            );
            log = l;
            check_all(&log, m, 1 << 20).await?;
        }
        Op::UncleanReopen => {
            // Dropped without closing: as after a crash (every append was
            // acknowledged, so nothing is pending).
            drop(log);
            let (l, rep) = open(s, clock, path).await?;
            ensure!(
                !rep.clean && rep.truncated_bytes == 0,
                "unclean reopen: {rep:?}"
            );
            ensure!(
                rep.log_end_offset == m.next && rep.log_start_offset == m.log_start,
                "unclean reopen lost or invented data: {rep:?}, model {}..{}",
                m.log_start,
                m.next
            );
            log = l;
            check_all(&log, m, 3000).await?;
        }
    }
    check_marks(&log, m)?;
    Ok(log)
}

async fn run_ops(s: Setup, ops: Vec<Op>) -> Result<(), String> {
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = tmp.path().join("m-0");
    let clock = ManualClock::new(T0);
    let mut m = Model {
        next_ts: T0,
        ..Model::default()
    };
    let (mut log, _) = open(&s, &clock, &path).await?;
    for (k, op) in ops.iter().enumerate() {
        log = apply(log, &mut m, &s, &clock, &path, op)
            .await
            .map_err(|e| format!("op {k} {op:?}: {e}"))?;
    }
    check_all(&log, &m, 1).await?;
    for b in &m.batches {
        let h = BatchHeader::peek(&b.bytes).unwrap();
        ensure!(
            h.last_offset() as u64 == b.last,
            "model batch {} inconsistent",
            b.base
        );
    }
    log.close().await.map_err(|e| format!("final close: {e}"))?;
    let (log, rep) = open(&s, &clock, &path).await?;
    ensure!(rep.clean, "final reopen: {rep:?}");
    check_marks(&log, &m)?;
    check_all(&log, &m, 7000).await?;
    log.close().await.map_err(|e| format!("close: {e}"))?;
    drop(log);
    drain_file_closes(tmp.path()).await;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        // WEIR_MODEL_CASES=<n> runs more (a soak).
        cases: std::env::var("WEIR_MODEL_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(32),
        max_shrink_iters: 256,
        failure_persistence: regressions_beside_source(),
        ..ProptestConfig::default()
    })]

    #[test]
    fn log_matches_model(s in setup(), ops in prop::collection::vec(op(), 1..40)) {
        let result = run_ret(move || run_ops(s, ops));
        prop_assert!(result.is_ok(), "{}", result.unwrap_err());
    }
}
