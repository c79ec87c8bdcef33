//! Transactions in the log: markers move the last stable offset, aborts
//! land in the aborted-transaction index, and all of it survives a clean
//! reopen, a crash, a lost producer snapshot, a truncation and a replica
//! copy; a producer's own control batch is refused.

use crate::common::*;
use crate::idempotence::pbatch;

use std::path::Path;

use bytes::BytesMut;
use weir_proto::batch;
use weir_storage::producer_state::PRODUCER_SNAPSHOT_FILE;
use weir_storage::txn::{self, AbortedTxn, Marker, MarkerKind};
use weir_storage::{LogConfig, PartitionLog, ShardConfig, StorageError, StorageShard};

fn small_segments() -> LogConfig {
    let mut c = LogConfig::default();
    c.set("segment.bytes", "8192").unwrap();
    c.set("index.interval.bytes", "1024").unwrap();
    c
}

/// A transactional batch (see [`pbatch`]).
fn tbatch(pid: i64, epoch: i16, seq: i32, records: i32, payload: &[u8]) -> BytesMut {
    let mut b = pbatch(pid, epoch, seq, records, payload);
    b[21..23].copy_from_slice(&batch::Attributes::TRANSACTIONAL.to_be_bytes());
    let crc = batch::compute_crc(&b);
    batch::set_crc(&mut b, crc);
    b
}

fn marker(kind: MarkerKind) -> Marker {
    Marker {
        kind,
        coordinator_epoch: 3,
    }
}

async fn open(shard: &StorageShard, path: &Path) -> PartitionLog {
    PartitionLog::open(shard, path, small_segments())
        .await
        .unwrap()
        .0
}

/// What a log says of its transactions: open ones, the aborted ones of
/// the whole log, the last stable offset.
fn txn_state(log: &PartitionLog) -> (Vec<(i64, u64)>, Vec<AbortedTxn>, u64) {
    (
        log.open_transactions(),
        log.aborted_transactions(0, u64::MAX),
        log.last_stable_offset(),
    )
}

#[test]
fn markers_move_the_last_stable_offset_and_aborts_survive_reopens_and_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let log = open(&shard, &path).await;
        let big = payload(0, 3000);
        // Producer 7's transaction at 0..2, a plain batch at 2, producer
        // 8's transaction at 3.
        log.append_acked(tbatch(7, 0, 0, 2, &big)).await.unwrap();
        log.append_acked(pbatch(9, 0, 0, 1, &big)).await.unwrap();
        log.append_acked(tbatch(8, 0, 0, 1, &big)).await.unwrap();
        assert_eq!(txn_state(&log), (vec![(7, 0), (8, 3)], vec![], 0));
        let read = log.read(0, 1 << 20).await.unwrap();
        assert_eq!(read.last_stable_offset, 0);
        assert_eq!(read.high_watermark, 4);
        // Commit 7 (at 4): stable up to 8's first batch.
        let c = log
            .append_marker(7, 0, marker(MarkerKind::Commit), 1)
            .await
            .unwrap();
        log.wait_acked(&c).await.unwrap();
        assert_eq!(c.base_offset, 4);
        assert_eq!(txn_state(&log), (vec![(8, 3)], vec![], 3));
        // Abort 8 (at 5): everything stable, 8's transaction indexed.
        let a = log
            .append_marker(8, 0, marker(MarkerKind::Abort), 1)
            .await
            .unwrap();
        log.wait_acked(&a).await.unwrap();
        let aborted8 = AbortedTxn {
            producer_id: 8,
            first_offset: 3,
            last_offset: 5,
            last_stable_offset: 6,
        };
        assert_eq!(txn_state(&log), (vec![], vec![aborted8], 6));
        // The marker batches are Kafka's control batches, in the log.
        let read = log.read(4, 1 << 20).await.unwrap();
        let kinds: Vec<MarkerKind> = read
            .batches
            .iter()
            .filter(|b| batch::BatchHeader::peek(b).unwrap().attributes.is_control())
            .map(|b| txn::marker_of(b).unwrap().kind)
            .collect();
        assert_eq!(kinds, [MarkerKind::Commit, MarkerKind::Abort]);
        // Producer 7 again, in a new epoch (KIP-890), in later segments;
        // aborted.
        for i in 0..3 {
            log.append_acked(tbatch(7, 1, i, 1, &big)).await.unwrap();
        }
        let a = log
            .append_marker(7, 1, marker(MarkerKind::Abort), 1)
            .await
            .unwrap();
        log.wait_acked(&a).await.unwrap();
        assert!(log.segment_count() >= 3, "{}", log.segment_count());
        let aborted7 = AbortedTxn {
            producer_id: 7,
            first_offset: 6,
            last_offset: 9,
            last_stable_offset: 10,
        };
        let all = (vec![], vec![aborted8, aborted7], 10);
        assert_eq!(txn_state(&log), all);
        // What a read of a range must skip.
        assert_eq!(log.aborted_transactions(0, 3), vec![]);
        assert_eq!(log.aborted_transactions(0, 4), vec![aborted8]);
        assert_eq!(log.aborted_transactions(6, 7), vec![aborted7]);
        assert_eq!(log.aborted_transactions(10, 11), vec![]);
        // An older epoch's marker is refused.
        let e = log
            .append_marker(7, 0, marker(MarkerKind::Commit), 1)
            .await
            .unwrap_err();
        assert!(
            matches!(e, StorageError::InvalidProducerEpoch { .. }),
            "{e}"
        );

        // A clean reopen: the same, nothing replayed.
        log.close().await.unwrap();
        let (log, report) = PartitionLog::open(&shard, &path, small_segments())
            .await
            .unwrap();
        assert_eq!(report.producer_state_scanned_bytes, 0);
        assert_eq!(txn_state(&log), all);

        // A crash with a transaction open (8, at 10) after a new abort.
        log.append_acked(tbatch(9, 0, 1, 1, b"x")).await.unwrap();
        let a = log
            .append_marker(9, 0, marker(MarkerKind::Abort), 1)
            .await
            .unwrap();
        log.wait_acked(&a).await.unwrap();
        log.append_acked(tbatch(8, 0, 1, 1, b"y")).await.unwrap();
        let before = txn_state(&log);
        assert_eq!(before.0, vec![(8, 12)]);
        assert_eq!(before.1.len(), 3);
        assert_eq!(before.2, 12);
        drop(log);
        let log = open(&shard, &path).await;
        assert_eq!(txn_state(&log), before);

        // Without the producer snapshot: rebuilt from the whole log.
        log.close().await.unwrap();
        std::fs::remove_file(path.join(PRODUCER_SNAPSHOT_FILE)).unwrap();
        let log = open(&shard, &path).await;
        assert_eq!(txn_state(&log), before);

        // A follower copying the log batch by batch knows the same.
        let copy_path = path.with_file_name("t-0-copy");
        let copy = open(&shard, &copy_path).await;
        for (_, b) in read_to_end(&log, 0, 1 << 20).await.unwrap() {
            copy.append_replica(BytesMut::from(&b[..])).await.unwrap();
        }
        copy.flush().await.unwrap();
        assert_eq!(txn_state(&copy), before);
        copy.close().await.unwrap();
        log.close().await.unwrap();
    });
}

#[test]
fn a_truncation_that_cuts_a_marker_reopens_its_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-1");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let log = open(&shard, &path).await;
        log.append_acked(tbatch(7, 0, 0, 1, b"a")).await.unwrap();
        log.append_acked(tbatch(8, 0, 0, 1, b"b")).await.unwrap();
        for (pid, kind) in [(7, MarkerKind::Commit), (8, MarkerKind::Abort)] {
            let m = log.append_marker(pid, 0, marker(kind), 1).await.unwrap();
            log.wait_acked(&m).await.unwrap();
        }
        assert_eq!(txn_state(&log).2, 4);
        assert_eq!(txn_state(&log).1.len(), 1);
        // Cut both markers: both transactions are open again, nothing is
        // aborted.
        assert_eq!(log.truncate_to(2).await.unwrap(), 2);
        assert_eq!(txn_state(&log), (vec![(7, 0), (8, 1)], vec![], 0));
        // And so after a crash.
        drop(log);
        let log = open(&shard, &path).await;
        assert_eq!(txn_state(&log), (vec![(7, 0), (8, 1)], vec![], 0));
        log.close().await.unwrap();
    });
}

#[test]
fn a_producer_may_not_write_a_control_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-2");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let log = open(&shard, &path).await;
        log.append_acked(tbatch(7, 0, 0, 1, b"a")).await.unwrap();
        let forged = txn::marker_batch(7, 0, marker(MarkerKind::Commit), 1);
        let e = log.append(forged.clone()).await.unwrap_err();
        assert!(
            e.to_string()
                .contains("a producer may not write a control batch"),
            "{e}"
        );
        let (done, e) = log.append_many(vec![forged]).await;
        assert!(done.is_empty() && e.is_some());
        assert_eq!(log.log_end_offset(), 1);
        assert_eq!(txn_state(&log).0, vec![(7, 0)]);
        log.close().await.unwrap();
    });
}

/// A transactional write verified under a guard: refused if its
/// producer's transaction ended (a marker) between the guard and the
/// append and the write would open a new transaction — a late write that
/// nothing would end; accepted when it continues the open transaction or
/// no marker came.
#[test]
fn a_write_verified_before_its_transaction_ended_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let log = open(&shard, &path).await;
        let v = payload(0, 100);
        // No marker since the guard: the write opens the transaction.
        let g = log.txn_guard(7);
        let (done, refused) = log
            .append_many_guarded(vec![tbatch(7, 0, 0, 1, &v)], Some(g))
            .await;
        assert!(refused.is_none(), "{refused:?}");
        assert_eq!(done.len(), 1);
        // A guard taken while it is open, continuing it: accepted.
        let g = log.txn_guard(7);
        let (_, refused) = log
            .append_many_guarded(vec![tbatch(7, 0, 1, 1, &v)], Some(g))
            .await;
        assert!(refused.is_none(), "{refused:?}");
        // The guard of a write verified while the transaction was open…
        let late = log.txn_guard(7);
        // …then the transaction ends (its commit marker)…
        log.append_marker(7, 0, marker(MarkerKind::Commit), 1)
            .await
            .unwrap();
        // …and the late write would open a new one: refused, nothing
        // appended, nothing left open.
        let end = log.log_end_offset();
        let (done, refused) = log
            .append_many_guarded(vec![tbatch(7, 0, 2, 1, &v)], Some(late))
            .await;
        assert!(done.is_empty());
        assert!(
            matches!(
                refused,
                Some(StorageError::TransactionEnded { producer_id: 7, .. })
            ),
            "{refused:?}"
        );
        assert_eq!(log.log_end_offset(), end);
        assert!(log.open_transactions().is_empty());
        // Verified afresh (a guard after the marker): the next transaction.
        let g = log.txn_guard(7);
        let (_, refused) = log
            .append_many_guarded(vec![tbatch(7, 0, 2, 1, &v)], Some(g))
            .await;
        assert!(refused.is_none(), "{refused:?}");
        assert_eq!(log.open_transactions(), vec![(7, 3)]);
        // Another producer's marker does not refuse producer 8's write.
        let g8 = log.txn_guard(8);
        log.append_marker(7, 0, marker(MarkerKind::Abort), 1)
            .await
            .unwrap();
        let (_, refused) = log
            .append_many_guarded(vec![tbatch(8, 0, 0, 1, &v)], Some(g8))
            .await;
        assert!(refused.is_none(), "{refused:?}");
    });
}
