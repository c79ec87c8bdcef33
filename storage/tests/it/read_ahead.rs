//! Read-ahead of sequential cold readers: what it brings into the cache is
//! byte for byte what was appended (batches cut by its chunk boundaries,
//! batches larger than a chunk), it keeps a sequential reader off the disk,
//! and it never puts back data the log dropped while it was reading.

use crate::common;

use common::*;
use weir_storage::{LogConfig, PartitionLog, ShardConfig, StorageShard};

fn config() -> LogConfig {
    let mut c = LogConfig::default();
    c.set("max.message.bytes", &(3 << 20).to_string()).unwrap();
    c
}

/// Appends batches of 1 KiB to 2.5 MiB (several larger than a read-ahead
/// chunk, most cut by a chunk boundary) until about `total` bytes.
async fn fill(log: &PartitionLog, total: usize) -> Vec<(u64, Vec<u8>)> {
    let mut expect = Vec::new();
    let mut bytes = 0;
    let mut i = 0u64;
    while bytes < total {
        let len = match i % 7 {
            0 => 2_500_000,
            1 => 1_100_000,
            2 => 1024,
            _ => 300_000 + (i as usize * 7919) % 400_000,
        };
        let b = batch(2, &payload(i, len), i as i64);
        let info = log.append_acked(b.clone()).await.unwrap();
        bytes += b.len();
        expect.push((info.base_offset, stored(b, info.base_offset)));
        i += 1;
    }
    expect
}

/// Every batch from offset 0 on, read `max_bytes` at a time.
async fn read_sequentially(log: &PartitionLog, max_bytes: u64) -> Vec<(u64, Vec<u8>)> {
    let all = read_to_end(log, 0, max_bytes).await.unwrap();
    all.into_iter().map(|(o, b)| (o, b.to_vec())).collect()
}

#[test]
fn a_sequential_cold_reader_is_served_from_what_was_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = PartitionLog::open(&shard, &path, config()).await.unwrap();
        let expect = fill(&log, 40 << 20).await;
        log.close().await.unwrap();

        // A new shard: nothing of the log is cached.
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = PartitionLog::open(&shard, &path, config()).await.unwrap();
        let reads = expect.len() as u64;
        assert_eq!(read_sequentially(&log, 256 << 10).await, expect);
        let s = shard.stats();
        assert!(
            s.read_ahead_bytes > 20 << 20,
            "most of the log came in by read-ahead: {s:?}"
        );
        assert!(
            s.cache.misses * 4 < reads,
            "few of the {reads} reads went to disk themselves: {s:?}"
        );
        log.close().await.unwrap();
    });
}

#[test]
fn a_read_ahead_never_caches_what_a_truncation_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-1");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = PartitionLog::open(&shard, &path, config()).await.unwrap();
        let mut expect = fill(&log, 24 << 20).await;
        log.close().await.unwrap();

        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = PartitionLog::open(&shard, &path, config()).await.unwrap();
        // Two sequential reads start a read-ahead past the second ...
        let first = log.read(0, 1).await.unwrap();
        log.read(first.next_offset, 1).await.unwrap();
        // ... which is still reading when the log is cut behind the reader
        // and written again with other batches at the same offsets.
        let cut = expect[3].0;
        assert_eq!(log.truncate_to(cut).await.unwrap(), cut);
        expect.truncate(3);
        // Three records a batch where the old ones held two: most old
        // batches start inside a new one.
        for i in 0..40u64 {
            let b = batch(3, &payload(1000 + i, 5000), 1000 + i as i64);
            let info = log.append_acked(b.clone()).await.unwrap();
            expect.push((info.base_offset, stored(b, info.base_offset)));
        }
        // Whatever the read-ahead finished meanwhile, readers see the new
        // batches, from the cache and from disk, from every offset.
        assert_eq!(read_sequentially(&log, 1 << 20).await, expect);
        for o in cut..log.log_end_offset() {
            let r = log.read(o, 1).await.unwrap();
            let want = expect.iter().rev().find(|(base, _)| *base <= o).unwrap();
            assert_eq!(r.batches[0].as_ref(), &want.1[..], "read at {o}");
        }
        log.close().await.unwrap();
        let shard = StorageShard::new(ShardConfig::default());
        let (log, _) = PartitionLog::open(&shard, &path, config()).await.unwrap();
        assert_eq!(read_sequentially(&log, 1 << 20).await, expect);
        log.close().await.unwrap();
    });
}
