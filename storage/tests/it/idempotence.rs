//! Idempotent producers: duplicates, sequence gaps, fenced epochs, and the
//! producer state across clean and unclean reopens and truncation.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use common::*;
use weir_proto::batch;
use weir_storage::producer_state::PRODUCER_SNAPSHOT_FILE;
use weir_storage::{
    LogConfig, PartitionLog, ProducerStateTable, RecoveryReport, ShardConfig, StorageError,
    StorageShard,
};

fn small_segments() -> LogConfig {
    let mut c = LogConfig::default();
    c.set("segment.bytes", "8192").unwrap();
    c.set("index.interval.bytes", "1024").unwrap();
    c
}

/// A valid batch of `records` records from producer `pid` at `epoch`,
/// sequences `seq..seq + records`, with `payload` as its records section,
/// timestamped now.
pub(crate) fn pbatch(pid: i64, epoch: i16, seq: i32, records: i32, payload: &[u8]) -> BytesMut {
    let mut b = BytesMut::with_capacity(batch::HEADER_BYTES + payload.len());
    b.put_i64(0); // base offset
    b.put_i32((batch::HEADER_BYTES - batch::LOG_OVERHEAD + payload.len()) as i32);
    b.put_i32(0); // leader epoch
    b.put_i8(2); // magic
    b.put_u32(0); // crc, set below
    b.put_i16(0); // attributes
    b.put_i32(records - 1); // last offset delta
                            // Now: a reopened segment's age comes from its timestamps, and an old
                            // one would roll (and snapshot) at the first append.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    b.put_i64(now);
    b.put_i64(now);
    b.put_i64(pid);
    b.put_i16(epoch);
    b.put_i32(seq);
    b.put_i32(records);
    b.put_slice(payload);
    let crc = batch::compute_crc(&b);
    batch::set_crc(&mut b, crc);
    b
}

async fn open(
    shard: &StorageShard,
    path: &Path,
    config: LogConfig,
) -> (PartitionLog, RecoveryReport) {
    PartitionLog::open(shard, path, config).await.unwrap()
}

/// `(base offset, bytes)` of every batch in the log.
async fn all_batches(log: &PartitionLog) -> Vec<(u64, Vec<u8>)> {
    read_to_end(log, log.log_start_offset(), 4096)
        .await
        .unwrap()
        .into_iter()
        .map(|(o, b)| (o, b.to_vec()))
        .collect()
}

/// Sum of the stored sizes of the batches from `from` on.
async fn bytes_from(log: &PartitionLog, from: u64) -> u64 {
    all_batches(log)
        .await
        .iter()
        .filter(|(o, _)| *o >= from)
        .map(|(_, b)| b.len() as u64)
        .sum()
}

#[test]
fn a_retried_batch_returns_the_original_offsets_and_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = open(&shard, &path, LogConfig::default()).await;
        let first = pbatch(7, 0, 0, 3, b"first");
        let a = log.append_acked(first.clone()).await.unwrap();
        assert_eq!((a.base_offset, a.last_offset, a.duplicate), (0, 2, false));
        // Batches without a producer id are not checked.
        log.append_acked(batch(2, b"plain", 1)).await.unwrap();
        log.append_acked(batch(2, b"plain", 1)).await.unwrap();
        let b = log
            .append_acked(pbatch(7, 0, 3, 2, b"second"))
            .await
            .unwrap();
        assert_eq!((b.base_offset, b.last_offset), (7, 8));
        let appended = shard.stats().appended_bytes;

        // The retry of the first batch: not appended, the original offsets.
        let r = log.append(first.clone()).await.unwrap();
        assert!(r.duplicate);
        assert_eq!((r.base_offset, r.last_offset, r.records), (0, 2, 3));
        log.wait_acked(&r).await.unwrap();
        let r = log
            .append_acked(pbatch(7, 0, 3, 2, b"second"))
            .await
            .unwrap();
        assert!(r.duplicate);
        assert_eq!((r.base_offset, r.last_offset), (7, 8));

        assert_eq!(log.log_end_offset(), 9);
        assert_eq!(shard.stats().appended_bytes, appended, "nothing queued");
        let stored_batches = all_batches(&log).await;
        assert_eq!(stored_batches.len(), 4, "one copy of each batch");
        assert_eq!(stored_batches[0].1, stored(first, 0));
        log.close().await.unwrap();
    });
}

#[test]
fn a_duplicate_waits_until_its_original_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-1");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = open(&shard, &path, LogConfig::default()).await;
        let b = pbatch(3, 0, 0, 1, b"x");
        let orig = log.append(b.clone()).await.unwrap();
        // The original is only queued: its retry is a duplicate all the same.
        let dup = log.append(b).await.unwrap();
        assert!(dup.duplicate);
        assert_eq!(dup.base_offset, orig.base_offset);
        assert!(log.durable_offset() <= orig.last_offset, "not flushed yet");
        log.wait_acked(&dup).await.unwrap();
        assert!(log.durable_offset() > orig.last_offset);
        log.close().await.unwrap();
    });
}

#[test]
fn sequence_gaps_and_unknown_producers_are_rejected_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-2");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = open(&shard, &path, small_segments()).await;
        log.append_acked(pbatch(7, 0, 0, 2, &payload(0, 7000)))
            .await
            .unwrap();
        let (segments, appended) = (log.segment_count(), shard.stats().appended_bytes);
        // Would roll the segment if it were accepted.
        let e = log
            .append(pbatch(7, 0, 5, 1, &payload(1, 7000)))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                StorageError::OutOfOrderSequence {
                    producer_id: 7,
                    expected: 2,
                    got: 5,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "out-of-order sequence for producer 7 on t-2: expected 2, got 5"
        );
        let e = log.append(pbatch(8, 0, 4, 1, b"x")).await.unwrap_err();
        assert!(
            matches!(e, StorageError::UnknownProducerId { producer_id: 8, .. }),
            "{e}"
        );
        assert_eq!(log.log_end_offset(), 2);
        assert_eq!(
            log.segment_count(),
            segments,
            "no roll for a rejected batch"
        );
        assert_eq!(shard.stats().appended_bytes, appended);
        log.flush().await.unwrap();
        assert_eq!(all_batches(&log).await.len(), 1);
        // The expected sequence is still accepted.
        let a = log.append_acked(pbatch(7, 0, 2, 1, b"y")).await.unwrap();
        assert_eq!((a.base_offset, a.duplicate), (2, false));
        log.close().await.unwrap();
    });
}

#[test]
fn an_older_epoch_is_fenced_and_a_new_epoch_restarts_at_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-3");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = open(&shard, &path, LogConfig::default()).await;
        log.append_acked(pbatch(7, 1, 0, 1, b"a")).await.unwrap();
        log.append_acked(pbatch(7, 1, 1, 1, b"b")).await.unwrap();
        let e = log.append(pbatch(7, 2, 2, 1, b"c")).await.unwrap_err();
        assert!(
            matches!(
                e,
                StorageError::OutOfOrderSequence {
                    expected: 0,
                    got: 2,
                    ..
                }
            ),
            "{e}"
        );
        log.append_acked(pbatch(7, 2, 0, 1, b"c")).await.unwrap();
        let e = log.append(pbatch(7, 1, 2, 1, b"zombie")).await.unwrap_err();
        assert!(
            matches!(
                e,
                StorageError::InvalidProducerEpoch {
                    producer_id: 7,
                    epoch: 1,
                    current: 2,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "producer 7 on t-3 is fenced: epoch 1 is older than the current epoch 2"
        );
        assert_eq!(log.log_end_offset(), 3);
        log.close().await.unwrap();
    });
}

/// Appends batch `seq` of producers `1..=producers` (one record each).
async fn append_round(log: &PartitionLog, producers: i64, seq: i32) {
    for pid in 1..=producers {
        let info = log
            .append_acked(pbatch(pid, 0, seq, 1, &payload(pid as u64, 300)))
            .await
            .unwrap();
        assert!(!info.duplicate);
    }
}

/// Checks that the last batch of every producer is detected as a duplicate
/// (with its offset) and that the next sequence is expected.
async fn check_state(log: &PartitionLog, producers: i64, last_seq: i32, last_base: u64) {
    for pid in 1..=producers {
        let r = log
            .append(pbatch(pid, 0, last_seq, 1, &payload(pid as u64, 300)))
            .await
            .unwrap();
        assert!(r.duplicate, "producer {pid}");
        assert_eq!(
            r.base_offset,
            last_base + (pid - 1) as u64,
            "producer {pid}"
        );
        let e = log
            .append(pbatch(pid, 0, last_seq + 2, 1, b"gap"))
            .await
            .unwrap_err();
        assert!(
            matches!(e, StorageError::OutOfOrderSequence { expected, .. } if expected == last_seq + 1),
            "{e}"
        );
    }
}

#[test]
fn producer_state_survives_a_clean_reopen_without_scanning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-4");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = open(&shard, &path, small_segments()).await;
        assert_eq!(rep.producer_state_scanned_bytes, 0);
        for seq in 0..4 {
            append_round(&log, 10, seq).await;
        }
        assert!(log.segment_count() > 1);
        log.close().await.unwrap();
        assert!(path.join(PRODUCER_SNAPSHOT_FILE).exists());

        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = open(&shard, &path, small_segments()).await;
        assert!(rep.clean);
        assert_eq!(rep.producer_state_scanned_bytes, 0, "{rep:?}");
        check_state(&log, 10, 3, 30).await;
        append_round(&log, 10, 4).await;
        log.close().await.unwrap();
    });
}

#[test]
fn producer_state_is_rebuilt_from_the_batches_after_an_unclean_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-5");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = open(&shard, &path, LogConfig::default()).await;
        for seq in 0..3 {
            append_round(&log, 5, seq).await;
        }
        log.close().await.unwrap();
        // Appends after the clean close's snapshot (at 15; no roll after
        // it with the default segment size), then a crash.
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = open(&shard, &path, LogConfig::default()).await;
        append_round(&log, 5, 3).await;
        log.append_acked(batch(2, b"plain", 5)).await.unwrap();
        append_round(&log, 5, 4).await;
        let after_snapshot = bytes_from(&log, 15).await;
        drop(log);

        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = open(&shard, &path, LogConfig::default()).await;
        assert!(!rep.clean);
        assert_eq!(
            rep.producer_state_scanned_bytes, after_snapshot,
            "only the batches after the snapshot are replayed: {rep:?}"
        );
        check_state(&log, 5, 4, 22).await;
        // The rebuilt state was snapshotted: a second crash replays nothing.
        drop(log);
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = open(&shard, &path, LogConfig::default()).await;
        assert_eq!(rep.producer_state_scanned_bytes, 0, "{rep:?}");
        check_state(&log, 5, 4, 22).await;
        log.close().await.unwrap();
    });
}

#[test]
fn without_a_snapshot_the_whole_log_is_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-6");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = open(&shard, &path, LogConfig::default()).await;
        for seq in 0..3 {
            append_round(&log, 4, seq).await;
        }
        let total = bytes_from(&log, 0).await;
        drop(log); // no snapshot was ever written: no roll, far below 64 MiB
        assert!(!path.join(PRODUCER_SNAPSHOT_FILE).exists());

        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = open(&shard, &path, LogConfig::default()).await;
        assert_eq!(rep.producer_state_scanned_bytes, total, "{rep:?}");
        check_state(&log, 4, 2, 8).await;
        log.close().await.unwrap();
    });
}

#[test]
fn a_damaged_or_stale_snapshot_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-7");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = open(&shard, &path, LogConfig::default()).await;
        for seq in 0..3 {
            append_round(&log, 3, seq).await;
        }
        let total = bytes_from(&log, 0).await;
        log.close().await.unwrap();

        // Damaged: a flipped byte.
        let snap = path.join(PRODUCER_SNAPSHOT_FILE);
        let mut b = std::fs::read(&snap).unwrap();
        b[30] ^= 0x10;
        std::fs::write(&snap, b).unwrap();
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = open(&shard, &path, LogConfig::default()).await;
        assert_eq!(rep.producer_state_scanned_bytes, total, "{rep:?}");
        check_state(&log, 3, 2, 6).await;
        log.close().await.unwrap();

        // Past the log end (as after a crash during a truncation): ignored
        // and removed, the state is rebuilt and snapshotted at the log end.
        ProducerStateTable::new().store(&path, 1_000).unwrap();
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = open(&shard, &path, LogConfig::default()).await;
        assert_eq!(rep.producer_state_scanned_bytes, total, "{rep:?}");
        check_state(&log, 3, 2, 6).await;
        let (offset, _) = ProducerStateTable::load(&path).unwrap().unwrap();
        assert_eq!(offset, 9);
        log.close().await.unwrap();
    });
}

#[test]
fn a_truncated_batch_is_appended_again_when_retried() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-8");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = open(&shard, &path, LogConfig::default()).await;
        for seq in 0..5 {
            let a = log
                .append_acked(pbatch(7, 0, seq, 1, b"old"))
                .await
                .unwrap();
            assert_eq!(a.base_offset, seq as u64);
        }
        log.close().await.unwrap(); // snapshot at 5

        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = open(&shard, &path, LogConfig::default()).await;
        assert_eq!(rep.producer_state_scanned_bytes, 0);
        assert_eq!(log.truncate_to(2).await.unwrap(), 2);
        // Sequence 2 was cut: its retry is a new batch, not a duplicate.
        let a = log.append_acked(pbatch(7, 0, 2, 1, b"new")).await.unwrap();
        assert_eq!((a.base_offset, a.duplicate), (2, false));
        // Sequence 1 is still in the log.
        let d = log.append(pbatch(7, 0, 1, 1, b"old")).await.unwrap();
        assert_eq!((d.base_offset, d.duplicate), (1, true));
        log.append_acked(batch(3, b"plain", 1)).await.unwrap(); // 3..=5
        let a = log.append_acked(pbatch(7, 0, 3, 1, b"new")).await.unwrap();
        assert_eq!(a.base_offset, 6);
        drop(log); // crash

        // The snapshot at 5 described the cut batches: it must not be used.
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = open(&shard, &path, LogConfig::default()).await;
        assert!(rep.producer_state_scanned_bytes > 0, "{rep:?}");
        let d = log.append(pbatch(7, 0, 3, 1, b"new")).await.unwrap();
        assert_eq!((d.base_offset, d.duplicate), (6, true));
        let a = log.append_acked(pbatch(7, 0, 4, 1, b"new")).await.unwrap();
        assert_eq!((a.base_offset, a.duplicate), (7, false));
        // Truncating every batch of a producer forgets it.
        assert_eq!(log.truncate_to(0).await.unwrap(), 0);
        let e = log.append(pbatch(7, 0, 5, 1, b"x")).await.unwrap_err();
        assert!(matches!(e, StorageError::UnknownProducerId { .. }), "{e}");
        log.close().await.unwrap();
    });
}

#[test]
fn snapshots_are_written_at_segment_rolls_once_durable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-9");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = open(&shard, &path, small_segments()).await;
        for seq in 0..40 {
            append_round(&log, 3, seq).await;
        }
        assert!(log.segment_count() > 3);
        let last_roll = *log.segment_bases().last().unwrap();
        // The writer runs in its own task: wait for the last roll's snapshot.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some((offset, _))) = ProducerStateTable::load(&path) {
                if offset == last_roll {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "no snapshot at {last_roll}");
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
        let after = bytes_from(&log, last_roll).await;
        assert!(after < bytes_from(&log, 0).await);
        drop(log);

        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = open(&shard, &path, small_segments()).await;
        assert_eq!(rep.producer_state_scanned_bytes, after, "{rep:?}");
        check_state(&log, 3, 39, 117).await;
        log.close().await.unwrap();
    });
}
