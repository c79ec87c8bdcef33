//! Recovery of damaged segment files: torn, zeroed and corrupt tails,
//! corrupt batches inside the active segment, damaged or missing indexes,
//! and the clean-shutdown marker.
//!
//! Each case writes a log, damages its files the way a crash (or the disk)
//! could, reopens it and checks that recovery cuts exactly at the last
//! valid batch, keeps everything before it byte for byte, and that the log
//! takes new appends that survive another reopen.
//!
//! How the "crash" is made matters, because recovery only scans segments
//! that are not known to be closed cleanly:
//! * [`Crash::Killed`]: the log is dropped without `close` (what a process
//!   crash leaves: preallocated zeros after the data, no final index entry,
//!   the checkpoint's recovery point at the active segment's base);
//! * [`Crash::Closed`]: the log is closed (files cut to their exact size),
//!   then the clean-shutdown marker is removed *and* the checkpoint's
//!   recovery point is lowered to the active segment's base, which is the
//!   state a crash after the last roll leaves. Removing the marker alone is
//!   not enough: `close` moves the recovery point past the active segment,
//!   declaring it closed cleanly, and such segments are only checked for a
//!   consistent end (see [`Crash::MarkerOnly`]);
//! * [`Crash::MarkerOnly`]: closed, only the marker removed. A cut or
//!   extended file is still detected (the last index entry no longer ends
//!   at the file's end); a flipped byte inside a cleanly closed segment is
//!   not, by design, as in Kafka.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use weir_storage::checkpoint::{self, Checkpoint};
use weir_storage::segment::parse_log_file_name;
use weir_storage::{LogConfig, PartitionLog, RecoveryReport, ShardConfig, StorageShard};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    Killed,
    Closed,
    MarkerOnly,
}

fn config(segment_bytes: u64) -> LogConfig {
    let mut c = LogConfig::default();
    c.set("segment.bytes", &segment_bytes.to_string()).unwrap();
    c.set("index.interval.bytes", "1024").unwrap();
    // The test timestamps are from 1970: no roll by age at reopen.
    c.set("segment.ms", &i64::MAX.to_string()).unwrap();
    c
}

/// Batch `j` of a test log: real records, timestamps `1000 + 10 j + r`.
fn test_batch(j: u64) -> bytes::BytesMut {
    let records = 1 + (j % 3) as usize;
    let value_len = ((j * 397) % 1200) as usize;
    records_batch(j, records, value_len, 1000 + 10 * j as i64)
}

/// What was appended: `(base offset, stored bytes)` per batch.
type Expect = Vec<(u64, Vec<u8>)>;

/// `(position, base offset, length)` of each batch of a `.log` file, up to
/// the first zero length field or the end of the file.
fn batches_in(path: &Path) -> Vec<(u64, u64, u64)> {
    let data = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + 12 <= data.len() {
        let base = i64::from_be_bytes(data[pos..pos + 8].try_into().unwrap());
        let len = i32::from_be_bytes(data[pos + 8..pos + 12].try_into().unwrap());
        if len <= 0 || pos + 12 + len as usize > data.len() {
            break;
        }
        let total = 12 + len as usize;
        out.push((pos as u64, base as u64, total as u64));
        pos += total;
    }
    out
}

/// Relative offsets and positions of a `.index` file.
fn index_entries(path: &Path) -> Vec<(u32, u32)> {
    std::fs::read(path)
        .unwrap_or_default()
        .chunks_exact(8)
        .map(|c| {
            (
                u32::from_be_bytes(c[..4].try_into().unwrap()),
                u32::from_be_bytes(c[4..].try_into().unwrap()),
            )
        })
        .take_while(|&(r, p)| r != 0 || p == 0)
        .collect()
}

fn active_log(dir: &Path) -> PathBuf {
    log_files(dir).pop().expect("a segment")
}

fn base_of(log_path: &Path) -> u64 {
    parse_log_file_name(&log_path.file_name().unwrap().to_string_lossy()).unwrap()
}

/// Appends `n` batches to a new log in `path` and leaves it as `crash` says
/// (the marker and checkpoint are adjusted later, by [`leave_unclean`]).
fn write_log(path: &Path, n: u64, segment_bytes: u64, crash: Crash) -> Expect {
    let path = path.to_path_buf();
    run_ret(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = PartitionLog::open(&shard, &path, config(segment_bytes))
            .await
            .unwrap();
        let mut expect = Vec::new();
        for j in 0..n {
            let b = test_batch(j);
            let info = log.append_acked(b.clone()).await.unwrap();
            expect.push((info.base_offset, stored(b, info.base_offset)));
        }
        if crash != Crash::Killed {
            log.close().await.unwrap();
        }
        expect
    })
}

/// Turns a closed log into one that must be recovered (see [`Crash`]).
fn leave_unclean(dir: &Path, crash: Crash) {
    match std::fs::remove_file(dir.join(checkpoint::CLEAN_SHUTDOWN_FILE)) {
        Ok(()) => assert_ne!(crash, Crash::Killed, "a killed log has no marker"),
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
            assert_eq!(crash, Crash::Killed, "a closed log has a marker");
        }
    }
    if crash == Crash::Closed {
        let c = Checkpoint::load(dir).unwrap().expect("a checkpoint");
        let active = base_of(&active_log(dir));
        assert!(c.recovery_point > active, "close covers the active segment");
        Checkpoint {
            recovery_point: active,
            ..c
        }
        .store(dir)
        .unwrap();
    }
}

fn assert_same(got: &[(u64, bytes::Bytes)], expect: &[(u64, Vec<u8>)], what: &str) {
    assert_eq!(got.len(), expect.len(), "{what}: batch count");
    for ((gb, g), (eb, e)) in got.iter().zip(expect) {
        assert_eq!(gb, eb, "{what}: base offsets");
        assert!(g[..] == e[..], "{what}: batch at {eb} differs");
    }
}

fn log_end(expect: &[(u64, Vec<u8>)]) -> u64 {
    expect.last().map_or(0, |(b, bytes)| {
        let h = weir_proto::batch::BatchHeader::peek(bytes).unwrap();
        b + h.last_offset_delta as u64 + 1
    })
}

/// Reopens after damage, checks the log against `expect` (what must
/// survive), appends more, and checks again after an unclean and a clean
/// reopen. Returns the first report.
fn reopen_and_check(path: &Path, segment_bytes: u64, mut expect: Expect) -> RecoveryReport {
    let path = path.to_path_buf();
    run_ret(move || async move {
        let cfg = config(segment_bytes);
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = PartitionLog::open(&shard, &path, cfg.clone())
            .await
            .unwrap_or_else(|e| panic!("recovery failed: {e}"));
        let end = log_end(&expect);
        assert_eq!(rep.log_end_offset, end, "{rep:?}");
        assert_eq!(log.log_end_offset(), end);
        assert_eq!(log.high_watermark(), end);
        for max in [1, 5000, 1 << 20] {
            let got = read_to_end(&log, 0, max).await.unwrap();
            assert_same(&got, &expect, "after recovery");
        }
        // New appends go right after the last valid batch.
        for j in 1000..1005 {
            let b = test_batch(j);
            let info = log.append_acked(b.clone()).await.unwrap();
            assert_eq!(info.base_offset, log_end(&expect));
            expect.push((info.base_offset, stored(b, info.base_offset)));
        }
        drop(log);
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep2) = PartitionLog::open(&shard, &path, cfg.clone())
            .await
            .unwrap();
        assert!(!rep2.clean);
        assert_eq!(rep2.truncated_bytes, 0, "nothing more to cut: {rep2:?}");
        assert_eq!(rep2.log_end_offset, log_end(&expect));
        assert_same(
            &read_to_end(&log, 0, 3000).await.unwrap(),
            &expect,
            "after the appends and an unclean reopen",
        );
        log.close().await.unwrap();
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep3) = PartitionLog::open(&shard, &path, cfg).await.unwrap();
        assert!(rep3.clean && rep3.scanned_segments == 0, "{rep3:?}");
        assert_same(
            &read_to_end(&log, 0, 1 << 20).await.unwrap(),
            &expect,
            "after a clean reopen",
        );
        log.close().await.unwrap();
        rep
    })
}

/// How a case damages the active segment: given its `.log` path and its
/// batches, damages it and returns how many of its batches survive and
/// whether recovery must report cut bytes.
type Damage = fn(&Path, &[(u64, u64, u64)]) -> (usize, bool);

fn run_case(crash: Crash, damage: Damage) {
    eprintln!("case: {crash:?}");
    const N: u64 = 60;
    const SEGMENT: u64 = 32 << 10;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("t-0");
    let mut expect = write_log(&path, N, SEGMENT, crash);
    let active = active_log(&path);
    let layout = batches_in(&active);
    assert!(layout.len() >= 3, "the active segment holds a few batches");
    assert!(log_files(&path).len() >= 2, "there are closed segments");
    let active_base = base_of(&active);
    assert_eq!(layout[0].1, active_base);
    let first = expect.iter().position(|(b, _)| *b == active_base).unwrap();
    let (keep, garbage) = damage(&active, &layout);
    leave_unclean(&path, crash);
    expect.truncate(first + keep);
    let rep = reopen_and_check(&path, SEGMENT, expect);
    assert!(!rep.clean);
    assert!(rep.scanned_segments >= 1, "{rep:?}");
    if garbage {
        assert!(rep.truncated_bytes > 0, "{rep:?}");
    } else {
        assert_eq!(rep.truncated_bytes, 0, "{rep:?}");
    }
}

const ALL: [Crash; 3] = [Crash::Killed, Crash::Closed, Crash::MarkerOnly];

fn set_len(p: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(p)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn write_at(p: &Path, pos: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.write_all_at(bytes, pos).unwrap();
    f.sync_all().unwrap();
}

fn flip(p: &Path, pos: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, pos).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, pos).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn a_cut_in_the_middle_of_the_last_batch() {
    for crash in ALL {
        run_case(crash, |p, l| {
            let (pos, _, len) = l[l.len() - 1];
            set_len(p, pos + len / 2);
            (l.len() - 1, true)
        });
    }
}

#[test]
fn a_cut_inside_the_last_header() {
    for crash in ALL {
        run_case(crash, |p, l| {
            let (pos, _, _) = l[l.len() - 1];
            set_len(p, pos + 20);
            (l.len() - 1, true)
        });
    }
}

#[test]
fn b_zeros_from_the_middle_of_the_last_batch_on() {
    for crash in ALL {
        run_case(crash, |p, l| {
            let (pos, _, len) = l[l.len() - 1];
            let from = pos + len / 2;
            write_at(p, from, &vec![0u8; (pos + len - from) as usize + 10_000]);
            (l.len() - 1, true)
        });
    }
}

#[test]
fn b_zeros_from_a_batch_boundary_are_not_counted_as_garbage() {
    // Zeros where a batch would start read as preallocated space: the log
    // ends there and nothing is reported as cut.
    for crash in ALL {
        run_case(crash, |p, l| {
            let (pos, _, len) = l[l.len() - 1];
            write_at(p, pos, &vec![0u8; len as usize + 10_000]);
            (l.len() - 1, false)
        });
    }
}

#[test]
fn b_less_than_a_header_after_the_last_batch() {
    // Zeros: the padding of the last block written, nothing is cut as garbage.
    for crash in ALL {
        run_case(crash, |p, l| {
            let (pos, _, len) = l[l.len() - 1];
            set_len(p, pos + len);
            write_at(p, pos + len, &[0u8; 40]);
            (l.len(), false)
        });
    }
    // Anything else is the start of a torn batch.
    for crash in ALL {
        run_case(crash, |p, l| {
            let (pos, _, len) = l[l.len() - 1];
            set_len(p, pos + len);
            write_at(p, pos + len, &[7u8; 40]);
            (l.len(), true)
        });
    }
}

#[test]
fn c_a_flipped_byte_in_the_last_batch() {
    // A cleanly closed segment is trusted without reading its batches.
    for crash in [Crash::Killed, Crash::Closed] {
        run_case(crash, |p, l| {
            let (pos, _, len) = l[l.len() - 1];
            flip(p, pos + len - 3);
            (l.len() - 1, true)
        });
        run_case(crash, |p, l| {
            // In the CRC field itself.
            let (pos, _, _) = l[l.len() - 1];
            flip(p, pos + 18);
            (l.len() - 1, true)
        });
    }
}

/// Position of the last entry of the active segment's `.index` file.
fn last_index_position(log_path: &Path) -> u64 {
    let raw = std::fs::read(log_path.with_extension("index")).unwrap_or_default();
    weir_storage::offset_index::OffsetIndex::decode(&raw)
        .last()
        .map_or(0, |(_, p)| p as u64)
}

#[test]
fn d_a_flipped_byte_in_an_earlier_batch_after_the_last_index_entry() {
    for crash in [Crash::Killed, Crash::Closed] {
        // Recovery scans from the last index entry on disk: a damaged batch
        // after it (and before the last batch) is cut with all after it.
        run_case(crash, |p, l| {
            let from = last_index_position(p);
            let k = l
                .iter()
                .position(|&(pos, _, _)| pos > from)
                .unwrap_or(l.len() - 1)
                .min(l.len() - 1);
            let (pos, _, len) = l[k];
            flip(p, pos + len / 2);
            (k, true)
        });
    }
}

#[test]
fn d_a_flipped_byte_before_the_last_index_entry_is_never_served() {
    // Bit rot in data that was durable before its index entry was written
    // is not looked for at open (the scan starts at the last index entry,
    // so reopening is fast); a read that reaches it fails with a corruption
    // error instead of serving it.
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("t-0");
    let expect = write_log(&path, 60, 32 << 10, Crash::Closed);
    let active = active_log(&path);
    let layout = batches_in(&active);
    let (pos, base, len) = layout[1];
    assert!(
        pos < last_index_position(&active),
        "batch 1 is before the last index entry"
    );
    flip(&active, pos + len / 2);
    leave_unclean(&path, Crash::Closed);
    let end = log_end(&expect);
    run_ret(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = PartitionLog::open(&shard, &path, config(32 << 10))
            .await
            .unwrap();
        assert_eq!(rep.log_end_offset, end);
        let e = log.read(base, 1).await.unwrap_err();
        assert!(
            e.to_string().contains("CRC") || e.to_string().contains("invalid batch"),
            "{e}"
        );
        // Everything before the damaged batch still reads.
        assert!(log.read(0, 1).await.is_ok());
    });
}

/// Every record's `(offset, timestamp)`, from the expected batches.
fn record_times(expect: &[(u64, Vec<u8>)]) -> Vec<(u64, i64)> {
    let mut out = Vec::new();
    for (_, b) in expect {
        let rb = weir_proto::reader::RecordBatch::parse(b).unwrap();
        let h = *rb.header();
        for r in rb.records().unwrap().iter() {
            let r = r.unwrap();
            out.push((r.offset as u64, r.timestamp));
            assert!(r.timestamp <= h.max_timestamp);
        }
    }
    out
}

/// Reads from every offset and looks up every timestamp.
async fn check_lookups(log: &PartitionLog, expect: &[(u64, Vec<u8>)]) {
    let times = record_times(expect);
    for &(off, _) in &times {
        let r = log.read(off, 1).await.unwrap();
        let (b, bytes) = expect
            .iter()
            .rev()
            .find(|(b, _)| *b <= off)
            .expect("a batch holds it");
        assert!(
            r.batches[0][..] == bytes[..],
            "read at {off} returned another batch than {b}"
        );
    }
    for (k, &(off, ts)) in times.iter().enumerate() {
        assert_eq!(
            log.offset_for_timestamp(ts).await.unwrap(),
            Some(off),
            "timestamp {ts}"
        );
        let after = times.get(k + 1).map(|t| t.0);
        assert_eq!(
            log.offset_for_timestamp(ts + 1).await.unwrap(),
            after,
            "timestamp {}",
            ts + 1
        );
    }
    assert_eq!(log.offset_for_timestamp(i64::MIN).await.unwrap(), Some(0));
}

#[test]
fn e_damaged_or_missing_indexes_are_rebuilt() {
    const SEGMENT: u64 = 16 << 10;
    for (crash, keep_marker) in [
        (Crash::Closed, true),
        (Crash::Closed, false),
        (Crash::Killed, false),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("t-0");
        let expect = write_log(&path, 120, SEGMENT, crash);
        let logs = log_files(&path);
        assert!(logs.len() >= 5, "{} segments", logs.len());
        let idx = |p: &Path, ext: &str| p.with_extension(ext);
        // A closed segment without indexes.
        std::fs::remove_file(idx(&logs[0], "index")).unwrap();
        std::fs::remove_file(idx(&logs[0], "timeindex")).unwrap();
        // One with garbage indexes.
        let n = std::fs::metadata(idx(&logs[1], "index")).unwrap().len();
        std::fs::write(idx(&logs[1], "index"), payload(1, n as usize)).unwrap();
        std::fs::write(idx(&logs[1], "timeindex"), vec![0xffu8; 100]).unwrap();
        // One cut in the middle of an entry, and a time index of 5 bytes.
        let n = std::fs::metadata(idx(&logs[2], "index")).unwrap().len();
        assert!(n >= 16);
        set_len(&idx(&logs[2], "index"), n - 3);
        set_len(&idx(&logs[2], "timeindex"), 5);
        // The active segment: garbage offset index, no time index.
        let active = logs.last().unwrap();
        assert!(!index_entries(&idx(active, "index")).is_empty());
        std::fs::write(idx(active, "index"), payload(2, 64)).unwrap();
        std::fs::remove_file(idx(active, "timeindex")).unwrap();
        if !keep_marker {
            leave_unclean(&path, crash);
        }
        let p = path.clone();
        let e = expect.clone();
        let rep = run_ret(move || async move {
            let shard = StorageShard::new(ShardConfig::default());
            let (log, rep) = PartitionLog::open(&shard, &p, config(SEGMENT))
                .await
                .unwrap();
            assert_eq!(rep.log_end_offset, log_end(&e));
            assert_same(&read_to_end(&log, 0, 1 << 20).await.unwrap(), &e, "reopen");
            check_lookups(&log, &e).await;
            log.close().await.unwrap();
            rep
        });
        assert_eq!(rep.clean, keep_marker, "{rep:?}");
        assert!(
            rep.scanned_segments >= 4,
            "every damaged segment is scanned: {rep:?}"
        );
        assert!(rep.rebuilt_indexes >= 4, "{rep:?}");
        assert_eq!(rep.truncated_bytes, 0, "{rep:?}");
        // The rebuilt indexes were written: a clean reopen trusts them.
        for l in &logs {
            assert!(std::fs::metadata(idx(l, "index")).unwrap().len() >= 8);
            assert!(std::fs::metadata(idx(l, "timeindex")).unwrap().len() >= 12);
        }
        let p = path.clone();
        run(move || async move {
            let shard = StorageShard::new(ShardConfig::default());
            let (log, rep) = PartitionLog::open(&shard, &p, config(SEGMENT))
                .await
                .unwrap();
            assert!(rep.clean && rep.scanned_segments == 0, "{rep:?}");
            assert_same(
                &read_to_end(&log, 0, 4000).await.unwrap(),
                &expect,
                "clean reopen",
            );
            check_lookups(&log, &expect).await;
            log.close().await.unwrap();
        });
    }
}

#[test]
fn f_clean_marker_semantics() {
    const SEGMENT: u64 = 16 << 10;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("t-0");
    let expect = write_log(&path, 50, SEGMENT, Crash::Closed);
    let marker = path.join(checkpoint::CLEAN_SHUTDOWN_FILE);
    assert!(marker.exists(), "close writes the marker");
    let end = log_end(&expect);
    let p = path.clone();
    let m = marker.clone();
    run(move || async move {
        let cfg = config(SEGMENT);
        // Clean: nothing scanned, nothing rebuilt.
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = PartitionLog::open(&shard, &p, cfg.clone()).await.unwrap();
        assert!(rep.clean, "{rep:?}");
        assert_eq!(rep.scanned_segments, 0);
        assert_eq!(rep.truncated_bytes, 0);
        assert_eq!(rep.rebuilt_indexes, 0);
        assert_eq!(rep.log_end_offset, end);
        assert!(rep.segments >= 3);
        assert!(!m.exists(), "the marker is consumed by open");
        assert_same(
            &read_to_end(&log, 0, 1 << 20).await.unwrap(),
            &expect,
            "clean",
        );
        drop(log);

        // A crash while open: no marker, the active segment is scanned.
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = PartitionLog::open(&shard, &p, cfg.clone()).await.unwrap();
        assert!(!rep.clean, "{rep:?}");
        assert!(rep.scanned_segments >= 1, "{rep:?}");
        assert_eq!(rep.log_end_offset, end);
        assert_same(
            &read_to_end(&log, 0, 3000).await.unwrap(),
            &expect,
            "unclean",
        );
        log.close().await.unwrap();
        assert!(m.exists());

        // A damaged marker counts as absent.
        let mut bytes = std::fs::read(&m).unwrap();
        bytes[14] ^= 1;
        std::fs::write(&m, &bytes).unwrap();
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = PartitionLog::open(&shard, &p, cfg.clone()).await.unwrap();
        assert!(!rep.clean, "{rep:?}");
        assert!(!m.exists(), "the damaged marker is removed");
        assert_eq!(rep.log_end_offset, end);
        assert_same(
            &read_to_end(&log, 0, 3000).await.unwrap(),
            &expect,
            "bad marker",
        );
        log.close().await.unwrap();

        // A marker that disagrees with the log: the active segment is scanned.
        checkpoint::store_clean_marker(&p, end + 7).unwrap();
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = PartitionLog::open(&shard, &p, cfg.clone()).await.unwrap();
        assert_eq!(rep.scanned_segments, 1, "{rep:?}");
        assert_eq!(rep.log_end_offset, end);
        assert_same(
            &read_to_end(&log, 0, 3000).await.unwrap(),
            &expect,
            "wrong marker",
        );
        log.close().await.unwrap();

        // Close twice in a row and reopen: still clean, and appends continue.
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = PartitionLog::open(&shard, &p, cfg.clone()).await.unwrap();
        assert!(rep.clean && rep.scanned_segments == 0, "{rep:?}");
        let info = log.append_acked(test_batch(500)).await.unwrap();
        assert_eq!(info.base_offset, end);
        log.close().await.unwrap();
        assert!(log.close().await.is_err(), "a closed log stays closed");
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = PartitionLog::open(&shard, &p, cfg).await.unwrap();
        assert!(rep.clean && rep.scanned_segments == 0, "{rep:?}");
        assert_eq!(rep.log_end_offset, info.last_offset + 1);
        log.close().await.unwrap();
    });
}

#[test]
fn g_a_crash_after_a_clean_reopen_scans_the_active_segment() {
    // After a clean close the checkpoint says every segment, the active one
    // included, was closed cleanly. Once the log is reopened and appended
    // to, that is no longer true: a crash must lead to a scan of the active
    // segment, not to trusting it because its last indexed batch happens to
    // end at the end of the file.
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("t-0");
    let shard_cfg = ShardConfig {
        prealloc_step: 0,
        ..ShardConfig::default()
    };
    let mut cfg = LogConfig::default();
    cfg.set("index.interval.bytes", "0").unwrap();
    cfg.set("segment.ms", &i64::MAX.to_string()).unwrap();
    let p = path.clone();
    let (c, sc) = (cfg.clone(), shard_cfg.clone());
    let mut expect = run_ret(move || async move {
        let mut expect = Vec::new();
        let shard = StorageShard::new(sc.clone());
        let (log, _) = PartitionLog::open(&shard, &p, c.clone()).await.unwrap();
        for j in 0..5u64 {
            let b = batch(1, &payload(j, 300), 100 + j as i64);
            let info = log.append_acked(b.clone()).await.unwrap();
            expect.push((info.base_offset, stored(b, info.base_offset)));
        }
        log.close().await.unwrap();
        let shard = StorageShard::new(sc);
        let (log, rep) = PartitionLog::open(&shard, &p, c).await.unwrap();
        assert!(rep.clean);
        // Appends whose last batch ends exactly on a 4 KiB boundary, so the
        // file (written in whole blocks, not preallocated) ends where the
        // last indexed batch ends.
        for j in 5..8u64 {
            let b = batch(1, &payload(j, 500), 100 + j as i64);
            let info = log.append_acked(b.clone()).await.unwrap();
            expect.push((info.base_offset, stored(b, info.base_offset)));
        }
        let size = log.size_bytes();
        let mut len = 4096 - (size % 4096) as usize;
        if len < 200 {
            len += 4096;
        }
        let b = batch(1, &payload(8, len - 61), 108);
        let info = log.append_acked(b.clone()).await.unwrap();
        expect.push((info.base_offset, stored(b, info.base_offset)));
        assert_eq!(log.segment_count(), 1);
        assert_eq!(log.size_bytes() % 4096, 0);
        drop(log); // crash
        expect
    });
    let active = active_log(&path);
    let layout = batches_in(&active);
    assert_eq!(
        std::fs::metadata(&active).unwrap().len(),
        layout.last().map(|(p, _, l)| p + l).unwrap()
    );
    // The last write was torn inside the last batch.
    let (pos, _, len) = *layout.last().unwrap();
    flip(&active, pos + len - 100);
    expect.pop();
    let p = path.clone();
    run(move || async move {
        let shard = StorageShard::new(shard_cfg);
        let (log, rep) = PartitionLog::open(&shard, &p, cfg).await.unwrap();
        assert!(!rep.clean);
        assert_eq!(rep.scanned_segments, 1, "{rep:?}");
        assert!(rep.truncated_bytes > 0, "{rep:?}");
        assert_eq!(rep.log_end_offset, log_end(&expect));
        assert_same(
            &read_to_end(&log, 0, 1 << 20).await.unwrap(),
            &expect,
            "torn",
        );
        log.close().await.unwrap();
    });
}

#[test]
fn h_a_segment_after_a_lost_tail_is_removed() {
    // A crash can leave a roll on disk (the new segment's files are created
    // at once) while the last batches of the previous segment were never
    // written: the offsets between the two would be missing. The new
    // segment holds nothing acknowledged and must go.
    const SEGMENT: u64 = 32 << 10;
    for with_data in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("t-0");
        let mut expect = write_log(&path, 60, SEGMENT, Crash::Killed);
        let end = log_end(&expect);
        let active = active_log(&path);
        let layout = batches_in(&active);
        // The last two batches of the active segment were not written...
        let (pos, lost, _) = layout[layout.len() - 2];
        set_len(&active, pos);
        // ...but the segment rolled after them is on disk.
        let [log, index, time] = weir_storage::segment::paths(&path, end);
        let data = if with_data {
            stored(test_batch(999), end)
        } else {
            Vec::new()
        };
        std::fs::write(&log, &data).unwrap();
        std::fs::write(&index, []).unwrap();
        std::fs::write(&time, []).unwrap();
        expect.retain(|(b, _)| *b < lost);
        let rep = reopen_and_check(&path, SEGMENT, expect);
        assert_eq!(rep.truncated_bytes, data.len() as u64, "{rep:?}");
    }
}

#[test]
fn i_the_report_counts_the_data_cut_not_the_preallocated_rest() {
    // A crashed log's active segment is preallocated (32 MiB by default,
    // at most its segment size: 64 MiB segments here) far past its data.
    // Recovery must report the bytes of data after the valid end — up to
    // the last non-zero byte — not the file's remainder.
    const SEGMENT: u64 = 64 << 20;
    /// Garbage right after the last batch, then (after a zero gap)
    /// garbage again: `(bytes, gap, bytes)`.
    const CASES: [(u64, u64, u64); 3] = [(300_000, 0, 0), (1000, 8192, 1000), (1, 0, 0)];
    for (first, gap, second) in CASES {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("t-0");
        let expect = write_log(&path, 40, SEGMENT, Crash::Killed);
        let active = active_log(&path);
        let layout = batches_in(&active);
        let (pos, _, len) = layout[layout.len() - 1];
        let end = pos + len;
        let file_len = std::fs::metadata(&active).unwrap().len();
        let garbage = |seed: u64, n: u64| -> Vec<u8> {
            let mut g = payload(seed, n as usize);
            for b in &mut g {
                *b |= 1;
            }
            g
        };
        write_at(&active, end, &garbage(1, first));
        if second > 0 {
            write_at(&active, end + first + gap, &garbage(2, second));
        }
        let cut = first + gap + second;
        assert!(
            file_len > end + cut + (1 << 20),
            "the segment is preallocated past the garbage ({file_len} bytes)"
        );
        leave_unclean(&path, Crash::Killed);
        let rep = reopen_and_check(&path, SEGMENT, expect);
        assert_eq!(rep.truncated_bytes, cut, "{rep:?}");
    }
}
