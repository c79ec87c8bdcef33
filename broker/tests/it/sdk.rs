//! The SDK (`weir_client::Producer` / `Consumer`) against a real broker:
//! keyed order, compression, seek by time, out-of-range resets, idempotent
//! retries across forced disconnects, a full buffer, shard-aware routing.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{runtime, Broker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use weir_client::partitioner::partition_for_key;
use weir_client::producer::Compression;
use weir_client::{
    Client, ClientError, Consumer, ConsumerConfig, ConsumerRecord, OffsetReset, Producer,
    ProducerConfig, ProducerRecord,
};
use weir_proto::error_code::ErrorCode;

fn producer_config() -> ProducerConfig {
    let mut c = ProducerConfig::default();
    c.linger_ms = 2;
    c.batch_size = 16 << 10;
    c
}

/// Reads every record of `partitions` from the start until `want` records
/// arrived (bounded by a 30 s deadline).
async fn read_all(
    addr: SocketAddr,
    partitions: Vec<(String, u32)>,
    want: usize,
) -> Vec<ConsumerRecord> {
    let mut c = ConsumerConfig::default();
    c.auto_offset_reset = OffsetReset::Earliest;
    c.fetch_max_wait_ms = 100;
    let mut consumer = Consumer::new(Client::connect(addr).await.unwrap(), c);
    consumer.assign(partitions);
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while out.len() < want && tokio::time::Instant::now() < deadline {
        out.extend(consumer.poll(Duration::from_millis(200)).await.unwrap());
    }
    // Nothing more than expected.
    out.extend(consumer.poll(Duration::from_millis(200)).await.unwrap());
    out
}

fn all_partitions(topic: &str, n: u32) -> Vec<(String, u32)> {
    (0..n).map(|p| (topic.to_string(), p)).collect()
}

fn text(b: &Option<Bytes>) -> String {
    String::from_utf8(b.as_ref().unwrap().to_vec()).unwrap()
}

#[test]
fn keyed_records_keep_per_key_order_and_compression_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        for (name, compression) in [
            ("plain", Compression::None),
            ("lz4", Compression::Lz4),
            ("zstd", Compression::Zstd { level: 5 }),
        ] {
            admin.create_topic(name, 6, vec![]).await.unwrap();
            let mut c = producer_config();
            c.compression = compression;
            let p = Producer::new(Client::connect(b.listen).await.unwrap(), c);
            assert!(p.is_idempotent());
            let mut futures = Vec::new();
            for i in 0..3000u32 {
                let key = format!("device-{}", i % 37);
                let value = format!("{key}:{i}:{}", "x".repeat((i % 200) as usize));
                let r = ProducerRecord::new(name, value)
                    .key(key)
                    .header("seq", Some(Bytes::from(i.to_string())))
                    .timestamp(1_700_000_000_000 + i as i64);
                futures.push(p.send(r).await.unwrap());
            }
            p.flush().await;
            for f in futures {
                let m = f.await.unwrap();
                assert!(m.offset.is_some());
            }
            p.close().await;
            let got = read_all(b.listen, all_partitions(name, 6), 3000).await;
            assert_eq!(got.len(), 3000, "{name}: every record exactly once");
            let mut last: HashMap<String, u32> = HashMap::new();
            for r in &got {
                let key = text(&r.key);
                assert_eq!(
                    r.partition,
                    partition_for_key(key.as_bytes(), 6),
                    "{name} {key}"
                );
                let v = text(&r.value);
                let i: u32 = v.split(':').nth(1).unwrap().parse().unwrap();
                assert_eq!(v, format!("{key}:{i}:{}", "x".repeat((i % 200) as usize)));
                assert_eq!(
                    r.headers,
                    vec![("seq".to_string(), Some(Bytes::from(i.to_string())))]
                );
                assert_eq!(r.timestamp, 1_700_000_000_000 + i as i64);
                if let Some(prev) = last.insert(key.clone(), i) {
                    assert!(prev < i, "{name}: {key} went from {prev} to {i}");
                }
            }
        }
    });
}

#[test]
fn seek_by_time_and_out_of_range_resets() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &["--retention-check-ms", "100"]);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("t", 1, vec![]).await.unwrap();
        let p = Producer::new(Client::connect(b.listen).await.unwrap(), producer_config());
        let mut fs = Vec::new();
        for i in 0..100i64 {
            let r = ProducerRecord::new("t", format!("v{i}"))
                .partition(0)
                .timestamp(10_000 + i * 10);
            fs.push(p.send(r).await.unwrap());
        }
        p.flush().await;
        for f in fs {
            f.await.unwrap();
        }

        // Seek by time: the first record at or after the timestamp.
        let mut consumer = Consumer::new(
            Client::connect(b.listen).await.unwrap(),
            ConsumerConfig::default(),
        );
        consumer.assign(vec![("t".into(), 0)]);
        assert_eq!(
            consumer.seek_to_timestamp("t", 0, 10_455).await.unwrap(),
            46
        );
        let got = consumer.poll(Duration::from_secs(5)).await.unwrap();
        assert_eq!(got[0].offset, 46);
        assert_eq!(text(&got[0].value), "v46");
        // After every record: the log end.
        assert_eq!(
            consumer.seek_to_timestamp("t", 0, 99_999).await.unwrap(),
            100
        );

        // A position past the log end is out of range.
        for reset in [
            OffsetReset::Earliest,
            OffsetReset::Latest,
            OffsetReset::None,
        ] {
            let mut c = ConsumerConfig::default();
            c.auto_offset_reset = reset;
            let mut consumer = Consumer::new(Client::connect(b.listen).await.unwrap(), c);
            consumer.assign(vec![("t".into(), 0)]);
            consumer.seek("t", 0, 500).unwrap();
            let r = consumer.poll(Duration::from_millis(300)).await;
            match reset {
                OffsetReset::Earliest => {
                    let got = r.unwrap();
                    assert_eq!(got[0].offset, 0);
                }
                OffsetReset::Latest => {
                    assert!(r.unwrap().is_empty());
                    assert_eq!(consumer.position("t", 0), Some(100));
                }
                OffsetReset::None => match r {
                    Err(ClientError::Partition { code, message, .. }) => {
                        assert_eq!(code, ErrorCode::OffsetOutOfRange);
                        assert!(
                            message.contains("t-0") && message.contains("0..100"),
                            "{message}"
                        );
                    }
                    other => panic!("{other:?}"),
                },
            }
            assert_eq!(
                consumer.skipped("t", 0),
                0,
                "moving back jumps over nothing"
            );
        }

        // Retention removes the start of the log: a consumer positioned
        // there resets as auto_offset_reset says and counts what it skipped.
        admin
            .alter_configs("t", vec![("segment.bytes".into(), "4096".into())])
            .await
            .unwrap();
        let mut fs = Vec::new();
        for i in 100..400i64 {
            let r = ProducerRecord::new("t", format!("v{i}:{}", "p".repeat(200)))
                .partition(0)
                .timestamp(10_000 + i * 10);
            fs.push(p.send(r).await.unwrap());
        }
        p.flush().await;
        for f in fs {
            f.await.unwrap();
        }
        admin
            .alter_configs("t", vec![("retention.bytes".into(), "8192".into())])
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let start = loop {
            let start = admin.describe_topic("t").await.unwrap().partitions[0].log_start_offset;
            if start > 0 {
                break start;
            }
            assert!(std::time::Instant::now() < deadline, "retention never ran");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut c = ConsumerConfig::default();
        c.auto_offset_reset = OffsetReset::Earliest;
        let mut consumer = Consumer::new(Client::connect(b.listen).await.unwrap(), c);
        consumer.assign(vec![("t".into(), 0)]);
        consumer.seek("t", 0, 0).unwrap();
        let got = consumer.poll(Duration::from_secs(5)).await.unwrap();
        assert!(got[0].offset >= start, "{} < {start}", got[0].offset);
        assert_eq!(
            consumer.skipped("t", 0),
            got[0].offset,
            "skips reported, never silent"
        );

        let mut c = ConsumerConfig::default();
        c.auto_offset_reset = OffsetReset::None;
        let mut consumer = Consumer::new(Client::connect(b.listen).await.unwrap(), c);
        consumer.assign(vec![("t".into(), 0)]);
        consumer.seek("t", 0, 0).unwrap();
        let e = consumer.poll(Duration::from_secs(5)).await.unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        p.close().await;
    });
}

/// A loopback proxy to `upstream` that cuts every connection after it
/// forwarded `cut_after` bytes towards the broker (mid-request, usually),
/// or, with `stall`, forwards nothing at all.
async fn proxy(
    upstream: SocketAddr,
    cut_after: u64,
    stall: Arc<AtomicBool>,
    cuts: Arc<AtomicU64>,
) -> SocketAddr {
    let l = TcpListener::bind((weir_testkit::ports::private_loopback(), 0))
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut n = 0u64;
        loop {
            let Ok((mut down, _)) = l.accept().await else {
                return;
            };
            n += 1;
            let (stall, cuts) = (stall.clone(), cuts.clone());
            // Vary where the cut falls from one connection to the next.
            let limit = cut_after + (n * 7919) % cut_after.max(1);
            tokio::spawn(async move {
                if stall.load(Ordering::SeqCst) {
                    let mut sink = vec![0u8; 1 << 16];
                    while matches!(down.read(&mut sink).await, Ok(k) if k > 0) {}
                    return;
                }
                let Ok(mut up) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut dr, mut dw) = down.split();
                let (mut ur, mut uw) = up.split();
                let to_broker = async {
                    let mut buf = vec![0u8; 1 << 16];
                    let mut sent = 0u64;
                    loop {
                        let k = match dr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => k,
                        };
                        let k = k.min((limit - sent) as usize);
                        if uw.write_all(&buf[..k]).await.is_err() {
                            return;
                        }
                        sent += k as u64;
                        if sent >= limit {
                            cuts.fetch_add(1, Ordering::SeqCst);
                            // Let the broker get (and maybe answer) what
                            // it was sent, then cut both ways.
                            return;
                        }
                    }
                };
                let to_client = async {
                    let _ = tokio::io::copy(&mut ur, &mut dw).await;
                };
                tokio::select! {
                    _ = to_broker => {}
                    _ = to_client => {}
                }
            });
        }
    });
    addr
}

#[test]
fn idempotent_retries_after_forced_disconnects_store_each_record_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("t", 4, vec![]).await.unwrap();
        let cuts = Arc::new(AtomicU64::new(0));
        let via = proxy(
            b.listen,
            300_000,
            Arc::new(AtomicBool::new(false)),
            cuts.clone(),
        )
        .await;
        let mut c = producer_config();
        // Through the proxy only (the per-core ports would bypass it).
        c.shard_aware = false;
        c.retry_backoff_ms = 10;
        c.batch_size = 32 << 10;
        let p = Producer::new(Client::connect(via).await.unwrap(), c);
        const N: u32 = 40_000;
        let mut fs = Vec::new();
        for i in 0..N {
            let r = ProducerRecord::new("t", format!("{i:08}:{}", "y".repeat(64))).partition(i % 4);
            fs.push(p.send(r).await.unwrap());
        }
        p.flush().await;
        let mut acked: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (i, f) in fs.into_iter().enumerate() {
            let m = f.await.unwrap_or_else(|e| panic!("record {i}: {e}"));
            acked
                .entry(m.partition)
                .or_default()
                .push(m.offset.unwrap());
        }
        p.close().await;
        assert!(
            cuts.load(Ordering::SeqCst) >= 3,
            "the proxy cut connections mid-send"
        );
        let got = read_all(b.listen, all_partitions("t", 4), N as usize).await;
        assert_eq!(got.len(), N as usize, "each record exactly once");
        let mut last: HashMap<u32, i64> = HashMap::new();
        for r in &got {
            let i: i64 = text(&r.value)[..8].parse().unwrap();
            assert_eq!(i as u32 % 4, r.partition);
            let prev = last.insert(r.partition, i).unwrap_or(-1);
            assert!(prev < i, "partition {}: {i} after {prev}", r.partition);
        }
        // The offsets the producer was told are where the records are.
        for (part, offsets) in acked {
            assert_eq!(
                offsets,
                (0..N as u64 / 4).collect::<Vec<_>>(),
                "partition {part}"
            );
        }
    });
}

#[test]
fn a_full_buffer_blocks_send_then_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 1);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("t", 1, vec![]).await.unwrap();
        // A broker that never answers: the proxy swallows every request.
        let via = proxy(
            b.listen,
            1 << 30,
            Arc::new(AtomicBool::new(true)),
            Arc::default(),
        )
        .await;
        let mut c = producer_config();
        c.shard_aware = false;
        c.buffer_memory = 64 << 10;
        c.max_block_ms = 300;
        c.linger_ms = 0;
        let p = Producer::new(Client::connect(via).await.unwrap(), c);
        let started = std::time::Instant::now();
        let mut accepted = 0;
        let e = loop {
            match p
                .send(ProducerRecord::new("t", vec![b'z'; 1000]).partition(0))
                .await
            {
                Ok(_) => accepted += 1,
                Err(e) => break e,
            }
            assert!(accepted < 1000, "the buffer never filled");
        };
        assert!(matches!(e, ClientError::BufferFull { .. }), "{e:?}");
        assert!(e.to_string().contains("buffer_memory"), "{e}");
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(accepted > 10 && accepted < 70, "{accepted}");
    });
}

#[test]
fn shard_aware_producer_talks_to_owning_cores_and_core_ports_refuse_others() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("t", 8, vec![]).await.unwrap();
        let md = admin.topic_metadata("t").await.unwrap();
        // A core's own port refuses partitions of the other core.
        let (foreign, owner) = md
            .partitions
            .iter()
            .find(|p| p.core == 1)
            .map(|p| (p.partition, p.core))
            .unwrap();
        let core0 = Client::connect(("127.0.0.1", b.core_ports[0]))
            .await
            .unwrap();
        let batch = common::records_batch("x", 1, 0).freeze();
        let e = core0
            .produce("t", foreign, batch.clone(), weir_client::Acks::All)
            .await
            .unwrap_err();
        match e {
            ClientError::Partition { code, message, .. } => {
                assert_eq!(code, ErrorCode::NotOwner);
                assert!(message.contains(&format!("core {owner}")), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // The shard-aware producer sends everything to the right cores.
        let p = Producer::new(Client::connect(b.listen).await.unwrap(), producer_config());
        let mut fs = Vec::new();
        for i in 0..800u32 {
            fs.push(
                p.send(ProducerRecord::new("t", format!("{i}")).partition(i % 8))
                    .await
                    .unwrap(),
            );
        }
        p.flush().await;
        for f in fs {
            f.await.unwrap();
        }
        p.close().await;
        let got = read_all(b.listen, all_partitions("t", 8), 800).await;
        assert_eq!(got.len(), 800);
    });
}

/// The consumer's continuing fetches (Fetch v2) against a real broker:
/// two partitions on the two cores (one connection each), one batch per
/// fetch, a seek back in the middle — every record once, in order per
/// partition, from the sought offset on.
#[test]
fn continuing_fetches_keep_order_across_cores_and_a_seek() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("cf", 2, vec![]).await.unwrap();
        // Small batches: many fetches of one batch each.
        let mut pc = producer_config();
        pc.batch_size = 512;
        let p = Producer::new(Client::connect(b.listen).await.unwrap(), pc);
        let mut futures = Vec::new();
        for i in 0..4000u32 {
            let r = ProducerRecord::new("cf", format!("{}:{i}", i % 2)).partition(i % 2);
            futures.push(p.send(r).await.unwrap());
        }
        p.flush().await;
        for f in futures {
            f.await.unwrap();
        }
        p.close().await;
        let mut c = ConsumerConfig::default();
        c.auto_offset_reset = OffsetReset::Earliest;
        c.max_partition_fetch_bytes = 1;
        c.max_poll_records = 50;
        let mut consumer = Consumer::new(Client::connect(b.listen).await.unwrap(), c);
        consumer.assign(all_partitions("cf", 2));
        let mut got: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        let mut sought = false;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while got.values().map(Vec::len).sum::<usize>() < 4000 + 500 {
            assert!(tokio::time::Instant::now() < deadline, "read {got:?}");
            for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
                assert_eq!(
                    text(&r.value),
                    format!("{}:{}", r.partition, r.offset * 2 + u64::from(r.partition))
                );
                got.entry(r.partition).or_default().push(r.offset);
            }
            if !sought && got.get(&0).is_some_and(|v| v.len() >= 1000) {
                let at = *got[&0].last().unwrap() + 1 - 500;
                consumer.seek("cf", 0, at).unwrap();
                sought = true;
            }
        }
        let p0 = &got[&0];
        let back = p0.windows(2).position(|w| w[1] != w[0] + 1).unwrap();
        assert_eq!(p0[..=back], (0..=p0[back]).collect::<Vec<_>>()[..]);
        assert_eq!(p0[back + 1], p0[back] + 1 - 500, "read on from the seek");
        assert_eq!(p0[back + 1..], (p0[back + 1]..2000).collect::<Vec<_>>()[..]);
        assert_eq!(got[&1], (0..2000).collect::<Vec<_>>());
        assert!(
            consumer.statistics().fetches > 20,
            "{:?}",
            consumer.statistics()
        );
    });
}
