//! What replication needs of a log: a leader stamps its epoch into every
//! batch and records where each epoch starts; a follower appends the
//! leader's batches byte for byte (and refuses a gap); after a leader
//! change a divergent tail is found through the epochs and truncated; all
//! of it survives a reopen.

use crate::common;

use common::*;
use weir_storage::{LogConfig, PartitionLog, ShardConfig, StorageError, StorageShard};

async fn all_batches(log: &PartitionLog) -> Vec<bytes::Bytes> {
    let mut out = Vec::new();
    let mut at = log.log_start_offset();
    loop {
        let r = log.read(at, 1 << 20).await.unwrap();
        if r.batches.is_empty() {
            return out;
        }
        out.extend(r.batches);
        at = r.next_offset;
    }
}

/// A leader's and a follower's log of one partition, under `root`.
async fn pair(shard: &StorageShard, root: &std::path::Path) -> (PartitionLog, PartitionLog) {
    let open = |dir: std::path::PathBuf| async move {
        PartitionLog::open(shard, &dir, LogConfig::default())
            .await
            .unwrap()
            .0
    };
    (
        open(root.join("leader/t-0")).await,
        open(root.join("follower/t-0")).await,
    )
}

fn epoch_of(b: &[u8]) -> i32 {
    weir_proto::batch::BatchHeader::peek(b)
        .unwrap()
        .partition_leader_epoch
}

#[test]
fn a_follower_copies_the_leader_byte_for_byte_and_truncates_a_divergent_tail() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (leader, follower) = pair(&shard, &root).await;
        let fp = root.join("follower/t-0");
        // Epoch 1 writes 3 batches of 2 records, then epoch 4 one more.
        leader.set_leader_epoch(Some(1));
        for i in 0..3 {
            leader
                .append_acked(batch(2, &payload(i, 50), 10))
                .await
                .unwrap();
        }
        leader.set_leader_epoch(Some(4));
        leader
            .append_acked(batch(2, &payload(9, 50), 10))
            .await
            .unwrap();
        assert_eq!(leader.leader_epochs(), vec![(1, 0), (4, 6)]);
        let batches = all_batches(&leader).await;
        assert_eq!(
            batches.iter().map(|b| epoch_of(b)).collect::<Vec<_>>(),
            [1, 1, 1, 4]
        );

        // The follower takes them as they are; a gap is refused.
        let e = follower
            .append_replica(bytes::BytesMut::from(&batches[1][..]))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                StorageError::ReplicaGap {
                    expected: 0,
                    got: 2,
                    ..
                }
            ),
            "{e}"
        );
        for b in &batches[..3] {
            let info = follower
                .append_replica(bytes::BytesMut::from(&b[..]))
                .await
                .unwrap();
            follower.wait_acked(&info).await.unwrap();
        }
        assert_eq!(all_batches(&follower).await, batches[..3]);
        assert_eq!(follower.leader_epochs(), vec![(1, 0)]);

        // The follower is made leader at epoch 5 (a stale leadership: the
        // leader above already wrote at 4) and takes two batches nobody
        // copies. Its last epoch, 5, is unknown to the leader, whose
        // largest epoch at or below 5 is 4, ending at 8; the follower's
        // own log at epochs up to 4 ends where its epoch 5 starts (6). It
        // truncates to the smaller: 6, then fetches from there.
        follower.set_leader_epoch(Some(5));
        follower.append_acked(batch(1, b"x", 10)).await.unwrap();
        follower.append_acked(batch(1, b"y", 10)).await.unwrap();
        assert_eq!(follower.leader_epochs(), vec![(1, 0), (5, 6)]);
        follower.set_leader_epoch(None);
        assert_eq!(leader.end_offset_for_epoch(5), Some((4, 8)));
        assert_eq!(leader.end_offset_for_epoch(1), Some((1, 6)));
        // The follower's truncation point: the leader's end of the
        // follower's epoch at or below the leader's answer.
        let (e, end) = leader.end_offset_for_epoch(5).unwrap();
        let mine = follower.end_offset_for_epoch(e).unwrap();
        let cut = end.min(mine.1);
        assert_eq!(cut, 6);
        assert_eq!(follower.truncate_to(cut).await.unwrap(), 6);
        assert_eq!(follower.leader_epochs(), vec![(1, 0)]);
        let info = follower
            .append_replica(bytes::BytesMut::from(&batches[3][..]))
            .await
            .unwrap();
        follower.wait_acked(&info).await.unwrap();
        assert_eq!(all_batches(&follower).await, batches);
        assert_eq!(follower.leader_epochs(), leader.leader_epochs());

        // Everything survives a reopen.
        follower.close().await.unwrap();
        let (again, _) = PartitionLog::open(&shard, &fp, LogConfig::default())
            .await
            .unwrap();
        assert_eq!(again.leader_epochs(), vec![(1, 0), (4, 6)]);
        assert_eq!(all_batches(&again).await, batches);
    });
}

#[test]
fn a_follower_that_becomes_leader_knows_the_producers_and_drops_their_retries() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (leader, follower) = pair(&shard, &root).await;
        leader.set_leader_epoch(Some(0));
        let mut b = batch(3, b"idempotent", 10);
        let mut h = weir_proto::batch::BatchHeader::peek(&b).unwrap();
        h.producer_id = 77;
        h.producer_epoch = 0;
        h.base_sequence = 0;
        let mut head = [0u8; weir_proto::batch::HEADER_BYTES];
        h.write(&mut head);
        b[..weir_proto::batch::HEADER_BYTES].copy_from_slice(&head);
        let crc = weir_proto::batch::compute_crc(&b);
        weir_proto::batch::set_crc(&mut b, crc);
        leader.append_acked(b.clone()).await.unwrap();
        for x in all_batches(&leader).await {
            follower
                .append_replica(bytes::BytesMut::from(&x[..]))
                .await
                .unwrap();
        }
        follower.set_leader_epoch(Some(1));
        // The producer retries the batch at the new leader: a duplicate.
        let again = follower.append(b).await.unwrap();
        assert!(again.duplicate);
        assert_eq!((again.base_offset, again.last_offset), (0, 2));
        assert_eq!(follower.log_end_offset(), 3);
    });
}

/// A follower behind its leader's log start starts an empty log at that
/// offset and takes the leader's batches from there; the start survives
/// a reopen, and an existing directory is not overwritten.
#[test]
fn a_log_created_at_an_offset_takes_the_leaders_batches_from_there() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (leader, old) = pair(&shard, &root).await;
        leader.set_leader_epoch(Some(2));
        for i in 0..4 {
            leader
                .append_acked(batch(3, &payload(i, 40), 10))
                .await
                .unwrap();
        }
        // Retention took the first two batches at the leader.
        assert_eq!(leader.delete_before(6).await.unwrap(), 6);
        let fp = root.join("follower/t-0");
        let e = PartitionLog::create_at(&shard, &fp, LogConfig::default(), 6)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("exists already"), "{e}");
        old.delete().await.unwrap();
        // Deleting twice does nothing (the directory may hold a new log).
        old.delete().await.unwrap();
        // An index entry per batch, so `bytes_from` is exact below.
        let dense = LogConfig {
            index_interval_bytes: 1,
            ..LogConfig::default()
        };
        let follower = PartitionLog::create_at(&shard, &fp, dense, 6)
            .await
            .unwrap();
        assert_eq!(
            (follower.log_start_offset(), follower.log_end_offset()),
            (6, 6)
        );
        let batches = all_batches(&leader).await;
        for b in &batches {
            if weir_proto::batch::BatchHeader::peek(b).unwrap().base_offset >= 6 {
                follower
                    .append_replica(bytes::BytesMut::from(&b[..]))
                    .await
                    .unwrap();
            }
        }
        follower.flush().await.unwrap();
        assert_eq!(follower.log_end_offset(), 12);
        // What a follower at an offset still has to fetch.
        assert_eq!(follower.bytes_from(12), 0);
        assert_eq!(follower.bytes_from(6), follower.size_bytes());
        // The leader serves two batches from its log start (6..9, 9..12):
        // from 9 on, the second one's bytes.
        assert_eq!(batches.len(), 2);
        let tail = batches[1].len() as u64;
        assert_eq!(follower.bytes_from(9), tail);
        assert_eq!(follower.bytes_from(10), tail, "from its batch's start");
        assert_eq!(follower.leader_epochs(), vec![(2, 6)]);
        follower.close().await.unwrap();
        let (again, _) = PartitionLog::open(&shard, &fp, LogConfig::default())
            .await
            .unwrap();
        assert_eq!((again.log_start_offset(), again.log_end_offset()), (6, 12));
        assert_eq!(all_batches(&again).await, all_batches(&leader).await);
    });
}

#[test]
fn a_follower_may_read_what_is_appended_before_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let (leader, follower) = pair(&shard, &root).await;
        leader.set_leader_epoch(Some(1));
        leader
            .append_acked(batch(2, &payload(0, 50), 10))
            .await
            .unwrap();

        // A follower's long poll waits for the next append, not for it to
        // be written.
        let waiting = {
            let leader = leader.clone();
            glommio::spawn_local(async move { leader.wait_appended(3).await })
        };
        let appended = batch(3, &payload(1, 50), 10);
        let info = leader.append(appended).await.unwrap();
        assert_eq!((info.base_offset, info.last_offset), (2, 4));
        // Nothing yielded since the append: the round that writes it has
        // not run, and a reader of written data sees nothing past offset 2.
        assert_eq!(leader.high_watermark(), 2, "the batch is not written yet");
        assert!(leader.read(2, 1 << 20).await.unwrap().batches.is_empty());
        let r = leader.read_appended(2, 1 << 20).await.unwrap();
        assert_eq!(r.batches.len(), 1, "the appended batch is served");
        assert_eq!(r.next_offset, 5);
        waiting.await.unwrap();

        // The follower takes it as it takes written ones; the leader's
        // write and its own then both complete.
        follower
            .append_replica(bytes::BytesMut::from(&all_batches(&leader).await[0][..]))
            .await
            .unwrap();
        follower
            .append_replica(bytes::BytesMut::from(&r.batches[0][..]))
            .await
            .unwrap();
        leader.wait_acked(&info).await.unwrap();
        follower.flush().await.unwrap();
        assert_eq!(all_batches(&follower).await, all_batches(&leader).await);

        // At the log end there is nothing to serve; a wait past it ends
        // with an error when the log closes.
        assert!(leader
            .read_appended(5, 1 << 20)
            .await
            .unwrap()
            .batches
            .is_empty());
        let waiting = {
            let leader = leader.clone();
            glommio::spawn_local(async move { leader.wait_appended(6).await })
        };
        futures_lite::future::yield_now().await;
        leader.close().await.unwrap();
        assert!(waiting.await.is_err(), "a closed log ends the wait");
    });
}
