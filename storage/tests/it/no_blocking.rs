//! No blocking file-system call on a core's event loop after `open`.
//!
//! The executor thread is declared an event loop
//! ([`weir_storage::testing::watch_event_loop`]); the crate's blocking
//! helpers (`write_atomic`, `sync_dir`, `remove_file`, the cleaner's
//! renames, index-file reads) log every call they make on it. A log is then
//! driven through appends with segment rolls (directory fsync, checkpoint in
//! the flush round, producer snapshots), truncation, `delete_before`,
//! retention and close, and a compacted log through a cleaner pass (its
//! swap renames, removals, directory fsyncs and reopening of the new
//! segment); the watch's log must stay empty. A call made on purpose shows
//! the watch works; with the segment roll's directory fsync or the swapped
//! segment's index reads put back on the loop these tests fail.

use crate::common;

use common::*;
use weir_storage::testing::{take_blocking_calls, watch_event_loop};
use weir_storage::{checkpoint, LogConfig, PartitionLog, ShardConfig, StorageShard};

/// Batches appended (enough for several rolls of 16 KiB segments).
const BATCHES: u64 = 60;

#[test]
fn nothing_after_open_blocks_the_event_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t-0");
    run(move || async move {
        let mut c = LogConfig::default();
        c.set("segment.bytes", "16384").unwrap();
        c.set("retention.bytes", "40000").unwrap();
        c.set("segment.ms", &i64::MAX.to_string()).unwrap();
        let shard = StorageShard::new(ShardConfig {
            prealloc_step: 64 << 10,
            ..ShardConfig::default()
        });
        let (log, _) = PartitionLog::open(&shard, &dir, c).await.unwrap();
        watch_event_loop(true);
        for i in 0..BATCHES {
            log.append_acked(batch(1, &payload(i, 1500), 1000 + i as i64))
                .await
                .unwrap();
        }
        assert!(log.segment_count() > 3, "segments rolled");
        let end = log.log_end_offset();
        log.truncate_to(end - 5).await.unwrap();
        log.delete_before(3).await.unwrap();
        let r = log.enforce_retention().await.unwrap();
        assert!(r.segments_deleted > 0, "retention deleted segments: {r:?}");
        log.close().await.unwrap();
        let calls = take_blocking_calls();
        assert!(
            calls.is_empty(),
            "blocking calls on the event loop: {calls:?}"
        );
        // The watch sees a blocking call made on the loop.
        checkpoint::sync_dir(&dir).unwrap();
        assert_eq!(take_blocking_calls(), ["sync_dir"]);
        watch_event_loop(false);
        drop(log);
        drop(shard);
        drain_file_closes(&dir).await;
    });
}

#[test]
fn a_compaction_pass_does_not_block_the_event_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c-0");
    run(move || async move {
        let mut c = LogConfig::default();
        c.set("cleanup.policy", "compact").unwrap();
        c.set("segment.bytes", "8192").unwrap();
        c.set("segment.ms", &i64::MAX.to_string()).unwrap();
        let shard = StorageShard::new(ShardConfig {
            prealloc_step: 0,
            ..ShardConfig::default()
        });
        let (log, _) = PartitionLog::open(&shard, &dir, c).await.unwrap();
        watch_event_loop(true);
        // The same keys over and over: most records are superseded.
        for i in 0..BATCHES {
            log.append_acked(records_batch(i % 4, 3, 400, 1000 + i as i64))
                .await
                .unwrap();
        }
        let rep = log.clean(true).await.unwrap().expect("a pass");
        assert!(rep.records_removed > 0, "{rep:?}");
        log.close().await.unwrap();
        let calls = take_blocking_calls();
        assert!(
            calls.is_empty(),
            "blocking calls on the event loop: {calls:?}"
        );
        watch_event_loop(false);
        drop(log);
        drop(shard);
        drain_file_closes(&dir).await;
    });
}
