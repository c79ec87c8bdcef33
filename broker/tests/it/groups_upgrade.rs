//! A data directory whose `__consumer_offsets` holds records in Weir's
//! first layout (before Kafka's format) keeps its committed offsets across
//! the upgrade, and its records are rewritten in Kafka's format.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use common::{runtime, Broker};
use weir_broker::groups::records::{self, RecordKey};
use weir_client::{Acks, Client};
use weir_proto::batch::Compression;
use weir_proto::builder::BatchBuilder;
use weir_proto::reader::RecordBatch;
use weir_proto::record::RecordData;
use weir_storage::{LogConfig, PartitionLog, ShardConfig, StorageShard};

const GROUP: &str = "legacy-g";

fn put_str(b: &mut BytesMut, s: &str) {
    b.put_u16(s.len() as u16);
    b.put_slice(s.as_bytes());
}

/// The first layout's offset key and value: `[0][kind 0][group][topic]
/// [partition u32]`, `[0][offset u64][timestamp i64][1][metadata]`.
fn first_layout_offset(topic: &str, partition: u32, offset: u64) -> (Bytes, Bytes) {
    let mut k = BytesMut::new();
    k.put_u8(0);
    k.put_u8(0);
    put_str(&mut k, GROUP);
    put_str(&mut k, topic);
    k.put_u32(partition);
    let mut v = BytesMut::new();
    v.put_u8(0);
    v.put_u64(offset);
    v.put_i64(1_700_000_000_000);
    v.put_u8(1);
    put_str(&mut v, "from-v1");
    (k.freeze(), v.freeze())
}

/// Appends the records to the stopped broker's `__consumer_offsets`
/// partition that holds [`GROUP`], as the first layout's broker did.
fn write_first_layout(data: &Path, records: Vec<(Bytes, Bytes)>) {
    let n = std::fs::read_dir(data)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("__consumer_offsets-")
        })
        .count() as u32;
    assert!(n > 0, "no __consumer_offsets partitions in {data:?}");
    let dir = data.join(format!(
        "__consumer_offsets-{}",
        records::partition_for(GROUP, n)
    ));
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(move || async move {
            let shard = StorageShard::new(ShardConfig::default());
            let (log, _) = PartitionLog::open(&shard, &dir, LogConfig::default())
                .await
                .unwrap();
            let mut b = BatchBuilder::new(Compression::None).unwrap();
            for (key, value) in records {
                b.push(&RecordData {
                    key: Some(key),
                    value: Some(value),
                    headers: Vec::new(),
                    timestamp: 1_700_000_000_000,
                })
                .unwrap();
            }
            log.append_acked(b.build().unwrap()).await.unwrap();
            log.close().await.unwrap();
        })
        .expect("glommio executor starts (check `ulimit -l`)")
        .join()
        .unwrap();
}

/// The keys of [`GROUP`]'s records in `__consumer_offsets`, in log order,
/// with whether each is a tombstone.
async fn group_keys(c: &Client, partitions: u32) -> Vec<(Bytes, bool)> {
    let p = records::partition_for(GROUP, partitions);
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let f = c
            .fetch("__consumer_offsets", p, at, 1 << 20, 0)
            .await
            .unwrap();
        for b in &f.batches {
            let rb = RecordBatch::parse(b).unwrap();
            for r in rb.records().unwrap().iter() {
                let r = r.unwrap();
                if (r.offset as u64) < at {
                    continue;
                }
                let key = Bytes::copy_from_slice(r.record.key.unwrap());
                let decoded = records::decode_record(&key, None).unwrap();
                if decoded.key.group() == GROUP {
                    out.push((key, r.record.value.is_none()));
                }
            }
        }
        match f.next_offset() {
            Some(next) if next < f.high_watermark => at = next,
            _ => return out,
        }
    }
}

#[test]
fn offsets_of_the_first_layout_survive_the_upgrade_and_are_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 1);
    let partitions = runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        c.create_topic("up", 2, vec![]).await.unwrap();
        for p in 0..2 {
            let batch = common::records_batch("r", 50, 1_700_000_000_000);
            c.produce("up", p, batch.freeze(), Acks::All).await.unwrap();
        }
        c.describe_topic("__consumer_offsets")
            .await
            .unwrap()
            .partitions
            .len() as u32
    });
    b.stop();
    write_first_layout(
        dir.path(),
        vec![
            first_layout_offset("up", 0, 30),
            first_layout_offset("up", 1, 40),
        ],
    );

    let b = Broker::start(dir.path(), 1);
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        let mut got = c.committed_offsets(GROUP, None).await.unwrap();
        got.sort_by_key(|o| o.partition);
        let got: Vec<_> = got
            .iter()
            .map(|o| (o.partition, o.offset, o.metadata.as_deref()))
            .collect();
        assert_eq!(got, [(0, 30, Some("from-v1")), (1, 40, Some("from-v1"))]);
        // The rewrite runs after the replay: the old keys tombstoned, then
        // the group's records in Kafka's format (type 1 offsets).
        let deadline = Instant::now() + Duration::from_secs(20);
        let keys = loop {
            let keys = group_keys(&c, partitions).await;
            let rewritten = keys.iter().filter(|(k, _)| k[..2] == [0, 1]).count();
            if rewritten == 2 || Instant::now() > deadline {
                break keys;
            }
            pause().await;
        };
        let old: Vec<_> = keys.iter().filter(|(k, _)| k[..2] == [0, 0]).collect();
        assert_eq!(old.len(), 4, "two old records, two tombstones: {keys:?}");
        assert!(old[2..].iter().all(|(_, tomb)| *tomb), "{keys:?}");
        let new: Vec<_> = keys.iter().filter(|(k, _)| k[..2] == [0, 1]).collect();
        assert_eq!(new.len(), 2, "{keys:?}");
        assert!(new.iter().all(|(_, tomb)| !tomb));
        let expect = RecordKey::Offset {
            group: GROUP.into(),
            topic: "up".into(),
            partition: 0,
        }
        .encode();
        assert!(new.iter().any(|(k, _)| *k == expect));
    });
    b.stop();

    // Read back in the new format alone (the old keys are tombstones).
    let b = Broker::start(dir.path(), 1);
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        let mut got = c.committed_offsets(GROUP, None).await.unwrap();
        got.sort_by_key(|o| o.partition);
        let got: Vec<_> = got.iter().map(|o| (o.partition, o.offset)).collect();
        assert_eq!(got, [(0, 30), (1, 40)]);
        // Nothing left to rewrite: no new tombstones.
        let keys = group_keys(&c, partitions).await;
        assert_eq!(keys.len(), 6, "{keys:?}");
    });
    b.stop();
}

/// A short pause between looks at the log (the rewrite is in the
/// background and announces itself nowhere a client can wait on).
async fn pause() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}
