//! Append, read, reopen, roll, retention, truncation and bad input.

use crate::common;

use std::rc::Rc;

use common::*;
use weir_storage::{LogConfig, ManualClock, PartitionLog, ShardConfig, StorageError, StorageShard};

fn small_segments() -> LogConfig {
    let mut c = LogConfig::default();
    c.set("segment.bytes", "8192").unwrap();
    c.set("index.interval.bytes", "1024").unwrap();
    c
}

async fn read_all(log: &PartitionLog, from: u64) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = from;
    loop {
        let r = log.read(at, 3000).await.unwrap();
        if r.batches.is_empty() {
            break;
        }
        for b in r.batches {
            let h = weir_proto::batch::BatchHeader::peek(&b).unwrap();
            out.push((h.base_offset as u64, b.to_vec()));
        }
        at = r.next_offset;
    }
    out
}

#[test]
fn append_read_round_trip_and_clean_reopen_does_not_scan() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = PartitionLog::open(&shard, &path, small_segments())
            .await
            .unwrap();
        assert_eq!(rep.log_end_offset, 0);
        let mut expect = Vec::new();
        for i in 0..200u64 {
            let b = batch(
                3,
                &payload(i, 100 + (i as usize * 37) % 900),
                1000 + i as i64,
            );
            let info = log.append_acked(b.clone()).await.unwrap();
            assert_eq!(info.base_offset, i * 3);
            assert_eq!(info.last_offset, i * 3 + 2);
            expect.push((info.base_offset, stored(b, info.base_offset)));
        }
        assert_eq!(log.durable_offset(), 600);
        assert!(log.segment_count() > 5, "rolled by segment.bytes");
        assert_eq!(read_all(&log, 0).await, expect);
        // A read from the middle of a batch returns that whole batch.
        let r = log.read(4, 1).await.unwrap();
        assert_eq!(r.batches[0].as_ref(), &expect[1].1[..]);
        log.close().await.unwrap();

        // A new shard has a cold cache: everything comes from disk.
        let shard = StorageShard::new(ShardConfig::default());
        let (log, rep) = PartitionLog::open(&shard, &path, small_segments())
            .await
            .unwrap();
        assert!(rep.clean);
        assert_eq!(rep.scanned_segments, 0);
        assert_eq!(rep.log_end_offset, 600);
        assert_eq!(read_all(&log, 0).await, expect);
        assert!(shard.stats().cache.misses > 0);
        // Appends continue where the log ended.
        let info = log.append_acked(batch(1, b"x", 5000)).await.unwrap();
        assert_eq!(info.base_offset, 600);
        log.close().await.unwrap();
    });
}

#[test]
fn unclean_reopen_recovers_only_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-1");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = PartitionLog::open(&shard, &path, small_segments())
            .await
            .unwrap();
        let mut expect = Vec::new();
        for i in 0..100u64 {
            let b = batch(1, &payload(i, 500), i as i64);
            let info = log.append_acked(b.clone()).await.unwrap();
            expect.push((info.base_offset, stored(b, info.base_offset)));
        }
        let segments = log.segment_count();
        drop(log); // no close: as after a crash

        let shard2 = StorageShard::new(ShardConfig::default());
        let (log, rep) = PartitionLog::open(&shard2, &path, small_segments())
            .await
            .unwrap();
        assert!(!rep.clean);
        assert!(rep.scanned_segments <= 2, "{rep:?}");
        assert_eq!(rep.truncated_bytes, 0);
        assert_eq!(rep.log_end_offset, 100);
        assert_eq!(log.segment_count(), segments);
        assert_eq!(read_all(&log, 0).await, expect);
    });
}

/// A request's batches appended together: contiguous offsets, and one
/// batch refused for itself (here too large) refuses them all before any
/// is appended, so none is appended yet reported failed.
#[test]
fn append_many_is_all_or_nothing_for_a_bad_batch_and_contiguous_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-9");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let mut config = LogConfig::default();
        config.set("max.message.bytes", "4096").unwrap();
        let (log, _) = PartitionLog::open(&shard, &path, config).await.unwrap();
        let (done, refused) = log
            .append_many(vec![
                batch(2, &payload(0, 100), 1),
                batch(1, &payload(1, 10_000), 2),
            ])
            .await;
        assert!(done.is_empty());
        assert!(
            matches!(refused, Some(StorageError::BatchTooLarge { .. })),
            "{refused:?}"
        );
        assert_eq!(log.log_end_offset(), 0);
        let (done, refused) = log
            .append_many(vec![
                batch(2, &payload(2, 100), 3),
                batch(3, &payload(3, 100), 4),
            ])
            .await;
        assert!(refused.is_none(), "{refused:?}");
        let bases: Vec<u64> = done.iter().map(|i| i.base_offset).collect();
        assert_eq!(bases, vec![0, 2]);
        log.close().await.unwrap();
    });
}

#[test]
fn bad_batches_are_rejected_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-2");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = PartitionLog::open(&shard, &path, LogConfig::default())
            .await
            .unwrap();
        log.append_acked(batch(1, b"good", 1)).await.unwrap();

        let mut bad_crc = batch(1, b"payload", 1);
        let n = bad_crc.len();
        bad_crc[n - 1] ^= 0xff;
        let e = log.append(bad_crc).await.unwrap_err();
        assert!(e.to_string().contains("CRC"), "{e}");

        let mut bad_magic = batch(1, b"payload", 1);
        bad_magic[16] = 1;
        let e = log.append(bad_magic).await.unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");

        let mut past_end = batch(1, b"payload", 1);
        past_end[8..12].copy_from_slice(&1000i32.to_be_bytes());
        let e = log.append(past_end).await.unwrap_err();
        assert!(matches!(e, StorageError::InvalidBatch { .. }), "{e}");

        let mut two = batch(1, b"a", 1);
        two.extend_from_slice(&batch(1, b"b", 1));
        assert!(matches!(
            log.append(two).await.unwrap_err(),
            StorageError::TrailingBytes { .. }
        ));

        let mut cfg = LogConfig::default();
        cfg.set("max.message.bytes", "100").unwrap();
        log.set_config(cfg);
        assert!(matches!(
            log.append(batch(1, &[0u8; 200], 1)).await.unwrap_err(),
            StorageError::BatchTooLarge { .. }
        ));

        assert_eq!(log.log_end_offset(), 1);
        let r = log.read(0, 1 << 20).await.unwrap();
        assert_eq!(r.batches.len(), 1);
        assert!(matches!(
            log.read(2, 100).await.unwrap_err(),
            StorageError::OffsetOutOfRange {
                log_start: 0,
                log_end: 1,
                ..
            }
        ));
        log.close().await.unwrap();
    });
}

/// Retention removes the deleted segments' files without holding the
/// log's I/O: an append is written and made durable while those removals
/// wait (held here, as a slow unlink — with `discard` one can take tens of
/// milliseconds, and appends used to wait behind it).
#[test]
fn retention_removes_files_without_holding_appends_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-9");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let mut cfg = small_segments();
        cfg.set("retention.bytes", "0").unwrap();
        let (log, _) = PartitionLog::open(&shard, &path, cfg).await.unwrap();
        for i in 0..40u64 {
            log.append_acked(batch(1, &payload(i, 1000), 1_000_000))
                .await
                .unwrap();
        }
        weir_storage::testing::hold_removals(true);
        let retention = glommio::spawn_local({
            let log = log.clone();
            async move { log.enforce_retention().await }
        });
        // Until retention is in its removals (they run on another thread).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while weir_storage::testing::removals_held() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "retention never reached its removals"
            );
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
        }
        let appended = futures_lite::future::or(
            async {
                Some(
                    log.append_acked(batch(1, &payload(40, 1000), 1_000_000))
                        .await
                        .unwrap(),
                )
            },
            async {
                glommio::timer::sleep(std::time::Duration::from_secs(30)).await;
                None
            },
        )
        .await;
        weir_storage::testing::hold_removals(false);
        let report = retention.await.unwrap();
        assert!(
            appended.is_some(),
            "the append waited for retention's file removals"
        );
        assert!(report.segments_deleted > 0);
        assert_eq!(log.log_start_offset(), report.log_start_offset);
        assert!(log.durable_offset() > 40);
    });
}

#[test]
fn retention_by_time_and_size_deletes_closed_segments_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-3");
    run(move || async move {
        let clock = ManualClock::new(1_000_000);
        let shard = StorageShard::with_clock(ShardConfig::default(), Rc::new(clock.clone()));
        let mut cfg = small_segments();
        cfg.set("retention.ms", "60000").unwrap();
        let (log, _) = PartitionLog::open(&shard, &path, cfg.clone())
            .await
            .unwrap();
        // Old records, then new ones.
        for i in 0..40u64 {
            log.append_acked(batch(1, &payload(i, 1000), 1_000_000))
                .await
                .unwrap();
        }
        clock.advance(120_000);
        for i in 0..40u64 {
            log.append_acked(batch(1, &payload(i, 1000), 1_120_000))
                .await
                .unwrap();
        }
        let before = log.segment_count();
        let rep = log.enforce_retention().await.unwrap();
        assert!(rep.segments_deleted > 0);
        assert!(log.segment_count() < before);
        let start = log.log_start_offset();
        assert_eq!(start, rep.log_start_offset);
        assert!(start > 0 && start <= 40, "only old segments go: {start}");
        assert!(matches!(
            log.read(0, 100).await.unwrap_err(),
            StorageError::OffsetOutOfRange { .. }
        ));
        assert!(!log.read(start, 100).await.unwrap().batches.is_empty());

        // Size: keep at most ~3 segments' worth; the active one always stays.
        cfg.set("retention.ms", "-1").unwrap();
        cfg.set("retention.bytes", "20000").unwrap();
        log.set_config(cfg.clone());
        log.enforce_retention().await.unwrap();
        assert!(log.size_bytes() <= 20000 + 8192, "{}", log.size_bytes());
        cfg.set("retention.bytes", "0").unwrap();
        log.set_config(cfg.clone());
        log.enforce_retention().await.unwrap();
        assert_eq!(
            log.segment_count(),
            1,
            "the active segment is never deleted"
        );
        let start = log.log_start_offset();
        log.close().await.unwrap();

        let (log, _) = PartitionLog::open(&shard, &path, cfg).await.unwrap();
        assert_eq!(log.log_start_offset(), start, "log start survives reopen");
        assert_eq!(log.log_end_offset(), 80);
    });
}

#[test]
fn segment_ms_rolls_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-4");
    run(move || async move {
        let clock = ManualClock::new(0);
        let shard = StorageShard::with_clock(ShardConfig::default(), Rc::new(clock.clone()));
        let mut cfg = LogConfig::default();
        cfg.set("segment.ms", "1000").unwrap();
        let (log, _) = PartitionLog::open(&shard, &path, cfg).await.unwrap();
        log.append_acked(batch(1, b"a", 0)).await.unwrap();
        clock.advance(999);
        log.append_acked(batch(1, b"b", 0)).await.unwrap();
        assert_eq!(log.segment_count(), 1);
        clock.advance(1);
        log.append_acked(batch(1, b"c", 0)).await.unwrap();
        assert_eq!(log.segment_bases(), vec![0, 2]);
        log.close().await.unwrap();
    });
}

#[test]
fn truncate_to_removes_the_batch_containing_the_offset_and_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-5");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = PartitionLog::open(&shard, &path, small_segments())
            .await
            .unwrap();
        let mut expect = Vec::new();
        for i in 0..60u64 {
            let b = batch(2, &payload(i, 700), i as i64);
            let info = log.append_acked(b.clone()).await.unwrap();
            expect.push((info.base_offset, stored(b, info.base_offset)));
        }
        let segs = log.segment_count();
        // Offset 51 is inside the batch at 50: the log ends at 50.
        assert_eq!(log.truncate_to(51).await.unwrap(), 50);
        assert_eq!(log.log_end_offset(), 50);
        assert!(log.segment_count() < segs);
        expect.truncate(25);
        assert_eq!(read_all(&log, 0).await, expect);
        // New data goes where the old was.
        let b = batch(1, b"new", 99);
        let info = log.append_acked(b.clone()).await.unwrap();
        assert_eq!(info.base_offset, 50);
        expect.push((50, stored(b, 50)));
        assert_eq!(read_all(&log, 0).await, expect);
        drop(log);
        // The truncation was durable: an unclean reopen sees the same log.
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = PartitionLog::open(&shard, &path, small_segments())
            .await
            .unwrap();
        assert_eq!(read_all(&log, 0).await, expect);
        // Truncating everything leaves an empty log at the same start.
        assert_eq!(log.truncate_to(0).await.unwrap(), 0);
        assert!(log.read(0, 100).await.unwrap().batches.is_empty());
        log.close().await.unwrap();
    });
}

#[test]
fn delete_before_advances_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-6");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = PartitionLog::open(&shard, &path, small_segments())
            .await
            .unwrap();
        for i in 0..50u64 {
            log.append_acked(batch(1, &payload(i, 900), 0))
                .await
                .unwrap();
        }
        assert!(
            log.delete_before(51).await.is_err(),
            "past the high watermark"
        );
        assert_eq!(log.delete_before(30).await.unwrap(), 30);
        assert!(log.segment_bases()[0] <= 30);
        assert!(log.segment_bases()[0] > 0, "segments wholly below went");
        assert!(log.read(29, 10).await.is_err());
        let r = log.read(30, 10).await.unwrap();
        assert!(!r.batches.is_empty());
        log.close().await.unwrap();
        let (log, _) = PartitionLog::open(&shard, &path, small_segments())
            .await
            .unwrap();
        assert_eq!(log.log_start_offset(), 30);
    });
}

#[test]
fn offset_for_timestamp_uses_the_time_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-7");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = PartitionLog::open(&shard, &path, small_segments())
            .await
            .unwrap();
        for i in 0..100u64 {
            log.append_acked(batch(1, &payload(i, 300), 10_000 + 10 * i as i64))
                .await
                .unwrap();
        }
        assert_eq!(log.offset_for_timestamp(0).await.unwrap(), Some(0));
        assert_eq!(log.offset_for_timestamp(10_000).await.unwrap(), Some(0));
        assert_eq!(log.offset_for_timestamp(10_001).await.unwrap(), Some(1));
        assert_eq!(log.offset_for_timestamp(10_500).await.unwrap(), Some(50));
        assert_eq!(log.offset_for_timestamp(10_990).await.unwrap(), Some(99));
        assert_eq!(log.offset_for_timestamp(10_991).await.unwrap(), None);
        log.close().await.unwrap();
        let (log, _) = PartitionLog::open(&shard, &path, small_segments())
            .await
            .unwrap();
        assert_eq!(log.offset_for_timestamp(10_500).await.unwrap(), Some(50));
    });
}

#[test]
fn flush_messages_acks_on_write_and_syncs_every_n_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-8");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let mut cfg = LogConfig::default();
        cfg.set("flush.messages", "10").unwrap();
        let (log, _) = PartitionLog::open(&shard, &path, cfg).await.unwrap();
        for i in 0..25u64 {
            let info = log
                .append_acked(batch(1, &payload(i, 64), 0))
                .await
                .unwrap();
            // Acknowledged = written (readable, safe from a process crash).
            assert!(log.high_watermark() > info.last_offset);
        }
        // Synced once at least 10 records accumulated. Acknowledged on
        // write, the syncs run behind the appends (on a loaded machine the
        // first may not be done when the 25th record is acknowledged):
        // wait for the first; the second may still be in flight.
        let synced =
            futures_lite::future::or(async { log.wait_durable(10).await.map(|()| true) }, async {
                glommio::timer::sleep(std::time::Duration::from_secs(30)).await;
                Ok(false)
            })
            .await
            .unwrap();
        assert!(synced, "the first 10 records were never synced");
        let syncs = shard.stats().fdatasyncs;
        assert!(
            (1..=2).contains(&syncs),
            "{syncs} fdatasyncs for 25 records with flush.messages=10"
        );
        assert!(log.durable_offset() >= 10, "{}", log.durable_offset());
        assert_eq!(log.flush().await.unwrap(), 25);
        log.close().await.unwrap();
    });
}

#[test]
fn flush_ms_syncs_written_data_without_new_appends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-9");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let mut cfg = LogConfig::default();
        cfg.set("flush.messages", "1000000").unwrap();
        cfg.set("flush.ms", "20").unwrap();
        let (log, _) = PartitionLog::open(&shard, &path, cfg).await.unwrap();
        log.append_acked(batch(1, b"x", 0)).await.unwrap();
        assert_eq!(log.high_watermark(), 1);
        // The committer's flush.ms timer is the only thing that can sync
        // now; poll for it with a deadline (there is no event to await).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while log.durable_offset() < 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "flush.ms never synced"
            );
            glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
        }
        log.close().await.unwrap();
    });
}

/// Written data is readable (the high watermark) and acknowledges acks=1
/// before its fdatasync: waiters for "written" are woken when the round's
/// writes finish, not after the sync (they used to wait for it, adding an
/// fdatasync to every long poll and acks=1 produce).
#[test]
fn written_waiters_wake_before_the_rounds_fdatasync() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        // Rounds written and then fdatasync'd (a log alone on its core
        // writes its rounds through `O_DSYNC` by default: written is
        // durable there).
        let shard = StorageShard::new(ShardConfig {
            write_through_alone_bytes_max: 0,
            ..ShardConfig::default()
        });
        let (log, _) = PartitionLog::open(&shard, &path, LogConfig::default())
            .await
            .unwrap();
        let log = Rc::new(log);
        let mut seen = Vec::new();
        for i in 0..20u64 {
            let info = log.append(batch(1, &payload(i, 200), 1)).await.unwrap();
            let written = {
                let log = log.clone();
                glommio::spawn_local(async move {
                    log.wait_written(info.last_offset + 1).await.unwrap();
                    // What was durable when the written waiter ran.
                    log.durable_offset()
                })
            };
            log.wait_acked(&info).await.unwrap();
            seen.push((info.last_offset + 1, written.await));
            // The instant its write finished is remembered.
            let at = log
                .written_at(info.last_offset + 1)
                .expect("a recent write");
            assert!(at <= std::time::Instant::now());
            assert_eq!(
                log.written_at(info.last_offset + 2),
                None,
                "not written yet"
            );
        }
        assert!(
            seen.iter().all(|(upto, durable)| durable < upto),
            "a written waiter ran only once its batch was durable: {seen:?}"
        );
    });
}
