//! `weir-client` (tokio) against a real broker: admin, produce, fetch,
//! offsets, long poll and error mapping.

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{records_batch, values, Broker};
use weir_client::{Acks, Client, ClientError};
use weir_proto::error_code::ErrorCode;
use weir_proto::messages::{FetchPartition, OffsetSpec};

fn batch(prefix: &str, n: usize, ts: i64) -> Bytes {
    records_batch(prefix, n, ts).freeze()
}

/// Every value in `batches`, from `offset` on.
fn values_from(batches: &[Bytes], offset: u64) -> Vec<(u64, String)> {
    let all: Vec<u8> = batches.concat();
    values(&all)
        .into_iter()
        .filter(|(o, _)| *o >= offset)
        .collect()
}

#[test]
fn client_against_a_broker() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        assert!(!c.api_versions().await.unwrap().is_empty());
        c.create_topic("t", 4, vec![("retention.ms".into(), "600000".into())])
            .await
            .unwrap();
        match c.create_topic("t", 4, vec![]).await.unwrap_err() {
            ClientError::Topic {
                topic,
                code,
                message,
            } => {
                assert_eq!((topic.as_str(), code), ("t", ErrorCode::TopicAlreadyExists));
                assert!(message.contains("already exists"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c.list_topics().await.unwrap(), vec!["t"]);
        let md = c.metadata(None).await.unwrap();
        assert_eq!(md.cores.len(), 2);
        assert_eq!(c.topic_metadata("t").await.unwrap().partitions.len(), 4);

        // One request: two batches for partition 1 (appended in order), one
        // each for 0 and 3 (other core), and one for a partition that does
        // not exist.
        let r = c
            .produce_many(
                Acks::All,
                vec![
                    ("t".into(), 1, batch("a", 3, 1_000)),
                    ("t".into(), 0, batch("b", 2, 1_000)),
                    ("t".into(), 1, batch("c", 4, 2_000)),
                    ("t".into(), 3, batch("d", 1, 3_000)),
                    ("t".into(), 9, batch("e", 1, 3_000)),
                ],
            )
            .await
            .unwrap();
        let offsets: Vec<_> = r[..4]
            .iter()
            .map(|r| r.as_ref().unwrap().unwrap())
            .collect();
        assert_eq!(offsets, vec![0, 0, 3, 0]);
        assert_eq!(
            r[4].as_ref().unwrap_err().code(),
            Some(ErrorCode::UnknownTopicOrPartition)
        );
        assert_eq!(
            c.produce("t", 1, batch("f", 2, 4_000), Acks::Leader)
                .await
                .unwrap(),
            Some(7)
        );

        let f = c.fetch("t", 1, 4, 1 << 20, 0).await.unwrap();
        assert_eq!(f.high_watermark, 9);
        assert_eq!(f.next_offset(), Some(9));
        let got = values_from(&f.batches, 4);
        let want: Vec<(u64, String)> = [(4, "c-1"), (5, "c-2"), (6, "c-3"), (7, "f-0"), (8, "f-1")]
            .iter()
            .map(|(o, v)| (*o, v.to_string()))
            .collect();
        assert_eq!(got, want);

        assert_eq!(
            c.list_offsets("t", 1, OffsetSpec::Earliest).await.unwrap(),
            Some(0)
        );
        assert_eq!(
            c.list_offsets("t", 1, OffsetSpec::Latest).await.unwrap(),
            Some(9)
        );
        assert_eq!(
            c.list_offsets("t", 1, OffsetSpec::Timestamp(2_001))
                .await
                .unwrap(),
            Some(4)
        );
        assert_eq!(
            c.list_offsets("t", 1, OffsetSpec::Timestamp(i64::MAX))
                .await
                .unwrap(),
            None
        );
        let e = c
            .list_offsets("nope", 0, OffsetSpec::Latest)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnknownTopicOrPartition));
        let e = c.fetch("nope", 0, 0, 1 << 20, 0).await.unwrap_err();
        assert!(
            matches!(e, ClientError::Partition { partition: 0, .. }),
            "{e:?}"
        );
        let e = c
            .produce("nope", 0, batch("x", 1, 0), Acks::All)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");

        // Long poll: a fetch at the end wakes when another client appends.
        let c2 = Client::connect(b.listen).await.unwrap();
        let t = Instant::now();
        let (polled, _) = tokio::join!(c.fetch("t", 2, 0, 1 << 20, 10_000), async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            c2.produce("t", 2, batch("late", 2, 5_000), Acks::All)
                .await
                .unwrap()
        });
        assert_eq!(values_from(&polled.unwrap().batches, 0).len(), 2);
        assert!(t.elapsed() < Duration::from_secs(5), "woke before max_wait");

        let many = c
            .fetch_many(
                0,
                1 << 20,
                (0..4)
                    .map(|p| FetchPartition {
                        topic: "t".into(),
                        partition: p,
                        offset: 0,
                        max_bytes: 1 << 20,
                    })
                    .collect(),
            )
            .await
            .unwrap();
        let counts: Vec<usize> = many
            .iter()
            .map(|r| values_from(&r.as_ref().unwrap().batches, 0).len())
            .collect();
        assert_eq!(counts, vec![2, 9, 2, 1]);

        // Admin round trip.
        c.alter_configs("t", vec![("retention.ms".into(), "1234567".into())])
            .await
            .unwrap();
        let d = c.describe_topic("t").await.unwrap();
        assert!(d
            .configs
            .iter()
            .any(|(k, v)| k == "retention.ms" && v == "1234567"));
        let ends: Vec<u64> = d.partitions.iter().map(|p| p.log_end_offset).collect();
        assert_eq!(ends, vec![2, 9, 2, 1]);
        let e = c
            .alter_configs("t", vec![("no.such.key".into(), "1".into())])
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidConfig), "{e}");
        c.create_partitions("t", 6).await.unwrap();
        assert_eq!(c.describe_topic("t").await.unwrap().partitions.len(), 6);
        let e = c.create_partitions("t", 5).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidPartitions));
        c.delete_topic("t").await.unwrap();
        let e = c.describe_topic("t").await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnknownTopicOrPartition));
        assert!(c.list_topics().await.unwrap().is_empty());
    });
}

/// Several batches of one partition in one request are appended together:
/// with other clients appending to the partition at the same time, each
/// batch sits at the offset its request's answer implies (the first
/// batch's offset plus the records before it) — on the core the client is
/// connected to, and through the mesh on the other.
#[test]
fn a_requests_batches_of_a_partition_land_together_under_concurrent_producers() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    common::runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("m", 2, vec![]).await.unwrap();
        for p in 0..2u32 {
            let producers: Vec<_> = (0..4)
                .map(|c| {
                    let addr = b.listen;
                    tokio::spawn(async move {
                        let client = Client::connect(addr).await.unwrap();
                        let mut placed = Vec::new();
                        for r in 0..25 {
                            let names: Vec<String> =
                                (0..4).map(|i| format!("c{c}r{r}b{i}")).collect();
                            let batches = names
                                .iter()
                                .enumerate()
                                .map(|(i, n)| ("m".to_string(), p, batch(n, 1 + i, 1_000)))
                                .collect();
                            let res = client.produce_many(Acks::All, batches).await.unwrap();
                            for ((i, n), o) in names.into_iter().enumerate().zip(res) {
                                placed.push((o.unwrap().unwrap(), n, 1 + i as u64));
                            }
                        }
                        placed
                    })
                })
                .collect();
            let mut placed = Vec::new();
            for t in producers {
                placed.extend(t.await.unwrap());
            }
            let mut stored = std::collections::HashMap::new();
            let mut at = 0;
            loop {
                let f = admin.fetch("m", p, at, 1 << 20, 0).await.unwrap();
                if f.batches.is_empty() {
                    break;
                }
                stored.extend(values_from(&f.batches, at));
                at = f.next_offset().unwrap();
            }
            assert_eq!(stored.len(), 4 * 25 * (1 + 2 + 3 + 4), "partition {p}");
            for (offset, name, records) in placed {
                for j in 0..records {
                    assert_eq!(
                        stored.get(&(offset + j)).map(String::as_str),
                        Some(format!("{name}-{j}").as_str()),
                        "partition {p}: record {j} of batch {name}, answered at offset {offset}"
                    );
                }
            }
        }
    });
    b.stop();
}
