//! Broker benchmark over the native protocol, client and broker on this
//! machine: produce (acks=all) 1 KiB and 100-byte records to 16 partitions,
//! then fetch the cached data back.
//!
//! ```text
//! cargo bench -p weir-broker --bench native -- [--seconds S] [--connections N] [--cores N]
//! ```
//!
//! It starts the release `weir` binary on free loopback ports over a fresh
//! data directory under `target/`, and drives it with N blocking client
//! threads (one connection each, one request in flight per connection).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use weir_proto::messages::*;

const PARTITIONS: u32 = 16;
/// Bytes of record batches per produce request (spread over all partitions).
const REQUEST_BYTES: usize = 1 << 20;
/// 1 KiB records per partition the fetch phase cycles over (~32 MiB each).
const CACHED_RECORDS_PER_PARTITION: u64 = 30_000;

fn arg(args: &[String], name: &str, default: f64) -> f64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(default)
}

fn batch_of(record_bytes: usize, batch_bytes: usize) -> (bytes::BytesMut, u64) {
    let mut b =
        weir_proto::builder::BatchBuilder::new(weir_proto::batch::Compression::None).unwrap();
    let value = bytes::Bytes::from(vec![b'x'; record_bytes]);
    let mut n = 0;
    while b.estimated_size() + record_bytes + 16 <= batch_bytes {
        b.push(&weir_proto::record::RecordData {
            key: None,
            value: Some(value.clone()),
            headers: Vec::new(),
            timestamp: 1_700_000_000_000,
        })
        .unwrap();
        n += 1;
    }
    (b.build().unwrap(), n)
}

fn produce_phase(
    b: &Broker,
    topic: &str,
    record_bytes: usize,
    conns: usize,
    secs: f64,
) -> (f64, f64) {
    let per_partition = REQUEST_BYTES / PARTITIONS as usize;
    let (batch, records_per_batch) = batch_of(record_bytes, per_partition);
    let bytes = Arc::new(AtomicU64::new(0));
    let records = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let threads: Vec<_> = (0..conns)
        .map(|_| {
            let (addr, batch, bytes, records, topic) = (
                b.listen,
                batch.clone(),
                bytes.clone(),
                records.clone(),
                topic.to_string(),
            );
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let partitions: Vec<ProducePartition> = (0..PARTITIONS)
                    .map(|p| ProducePartition {
                        topic: topic.clone(),
                        partition: p,
                        payload_offset: p * batch.len() as u32,
                        payload_len: batch.len() as u32,
                    })
                    .collect();
                let payload: Vec<&[u8]> = (0..PARTITIONS).map(|_| &batch[..]).collect();
                let req = ProduceRequest {
                    transactional_id: None,
                    acks: -1,
                    timeout_ms: 30_000,
                    partitions,
                };
                while Instant::now() < deadline {
                    let (r, _) = c.ok(&req, &payload);
                    assert!(r.partitions.iter().all(|p| p.error == 0));
                    bytes.fetch_add(
                        (batch.len() * PARTITIONS as usize) as u64,
                        Ordering::Relaxed,
                    );
                    records.fetch_add(records_per_batch * PARTITIONS as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = start.elapsed().as_secs_f64();
    (
        bytes.load(Ordering::Relaxed) as f64 / s,
        records.load(Ordering::Relaxed) as f64 / s,
    )
}

fn fetch_phase(b: &Broker, topic: &str, conns: usize, secs: f64) -> f64 {
    let bytes = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let threads: Vec<_> = (0..conns)
        .map(|t| {
            let (addr, bytes, topic) = (b.listen, bytes.clone(), topic.to_string());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                // Start each partition at its last ~32 MiB: that part is in the cache.
                let (lo, _) = c.ok(
                    &ListOffsetsRequest {
                        read_committed: false,
                        partitions: (0..PARTITIONS)
                            .map(|p| ListOffsetsPartition {
                                topic: topic.clone(),
                                partition: p,
                                spec: OffsetSpec::Latest,
                            })
                            .collect(),
                    },
                    &[],
                );
                let starts: Vec<u64> = lo
                    .partitions
                    .iter()
                    .map(|r| {
                        r.offset
                            .unwrap_or(0)
                            .saturating_sub(CACHED_RECORDS_PER_PARTITION)
                    })
                    .collect();
                let mut offsets = starts.clone();
                let mut p = t as u32 % PARTITIONS;
                // One reusable receive buffer: the client copies each
                // response once, from the socket, and decodes nothing but
                // batch headers.
                let mut frame = Vec::with_capacity(16 << 20);
                let mut corr = 1_000_000u32;
                while Instant::now() < deadline {
                    corr += 1;
                    let req = FetchRequest {
                        read_committed: false,
                        max_wait_ms: 0,
                        min_bytes: 0,
                        max_bytes: 8 << 20,
                        partitions: vec![FetchPartition {
                            topic: topic.clone(),
                            partition: p,
                            offset: offsets[p as usize],
                            max_bytes: 8 << 20,
                        }],
                    };
                    let head = weir_proto::frame::encode_request(
                        &weir_proto::frame::RequestHeader::of::<FetchRequest>(corr),
                        &req,
                        0,
                    )
                    .unwrap();
                    use std::io::{Read, Write};
                    c.stream.write_all(&head).unwrap();
                    let mut len = [0u8; 4];
                    c.stream.read_exact(&mut len).unwrap();
                    let n = u32::from_be_bytes(len) as usize;
                    frame.clear();
                    frame.extend_from_slice(&len);
                    (&mut c.stream)
                        .take(n as u64)
                        .read_to_end(&mut frame)
                        .unwrap();
                    let (_, body, payload) = weir_proto::frame::decode_response(&frame).unwrap();
                    let r: FetchResponse = weir_proto::frame::decode_body(body).unwrap();
                    let part = &r.partitions[0];
                    assert_eq!(part.error, 0, "{:?}", part.message);
                    bytes.fetch_add(payload.len() as u64, Ordering::Relaxed);
                    // Walk the partition; start over at its end (the data stays cached).
                    let mut at = 0usize;
                    let mut next = offsets[p as usize];
                    while at < payload.len() {
                        let h = weir_proto::batch::BatchHeader::peek(&payload[at..]).unwrap();
                        next = h.last_offset() as u64 + 1;
                        at += h.total_len();
                    }
                    offsets[p as usize] = if next >= part.high_watermark {
                        starts[p as usize]
                    } else {
                        next
                    };
                    p = (p + 1) % PARTITIONS;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    bytes.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs = arg(&args, "--seconds", 5.0);
    let conns = arg(&args, "--connections", 4.0) as usize;
    let cores = arg(&args, "--cores", 2.0) as usize;
    let root = std::path::PathBuf::from("target/weir-bench-native");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let retention = arg(&args, "--retention-check-ms", 300_000.0).to_string();
    let b = Broker::start_with(
        &root,
        cores,
        &[
            "--cache-bytes-per-core",
            "536870912",
            "--retention-check-ms",
            &retention,
        ],
    );
    let mut c = b.client();
    for (name, rb) in [("r1k", 1024usize), ("r100", 100)] {
        let (r, _) = c.ok(
            &CreateTopicsRequest {
                topics: vec![NewTopic {
                    name: name.into(),
                    partitions: PARTITIONS,
                    configs: Vec::new(),
                    replication_factor: 1,
                }],
            },
            &[],
        );
        assert_eq!(r.topics[0].error, 0);
        let (bps, rps) = produce_phase(&b, name, rb, conns, secs);
        println!(
            "produce {rb:>5} B records, {PARTITIONS} partitions, acks=all, {conns} connections: {:>8.1} MB/s {:>12.0} records/s",
            bps / 1e6,
            rps
        );
    }
    // Fetch what is cached of the 1 KiB topic (the last ~512 MiB per core stay cached).
    let bps = fetch_phase(&b, "r1k", conns, secs);
    println!(
        "fetch 1 KiB records, {PARTITIONS} partitions, {conns} connections: {:>8.1} MB/s",
        bps / 1e6
    );
    let status = b.stop();
    assert!(status.success());
    let _ = std::fs::remove_dir_all(&root);
}
