//! A real broker on loopback: topics, produce/fetch across cores, offsets,
//! long poll, bad input, SIGKILL and SIGTERM.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use weir_proto::error_code::ErrorCode;
use weir_proto::messages::*;

const UNKNOWN_TOPIC: u16 = 3;
const OFFSET_OUT_OF_RANGE: u16 = 4;
const CORRUPT: u16 = 2;

fn produce(c: &mut Client, topic: &str, parts: &[(u32, &[u8])], acks: i8) -> ProduceResponse {
    let mut at = 0u32;
    let mut partitions = Vec::new();
    let mut payload: Vec<&[u8]> = Vec::new();
    for (p, data) in parts {
        partitions.push(ProducePartition {
            topic: topic.into(),
            partition: *p,
            payload_offset: at,
            payload_len: data.len() as u32,
        });
        at += data.len() as u32;
        payload.push(data);
    }
    c.ok(
        &ProduceRequest {
            transactional_id: None,
            acks,
            timeout_ms: 30_000,
            partitions,
        },
        &payload,
    )
    .0
}

fn fetch(
    c: &mut Client,
    topic: &str,
    partition: u32,
    offset: u64,
    wait_ms: u32,
) -> (FetchPartitionResult, Vec<u8>) {
    let (r, payload) = c.ok(
        &FetchRequest {
            read_committed: false,
            max_wait_ms: wait_ms,
            min_bytes: 1,
            max_bytes: 1 << 20,
            partitions: vec![FetchPartition {
                topic: topic.into(),
                partition,
                offset,
                max_bytes: 1 << 20,
            }],
        },
        &[],
    );
    let p = r.partitions.into_iter().next().unwrap();
    let data =
        payload[p.payload_offset as usize..(p.payload_offset + p.payload_len) as usize].to_vec();
    (p, data)
}

fn read_all(c: &mut Client, topic: &str, partition: u32) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let (p, data) = fetch(c, topic, partition, offset, 0);
        assert_eq!(p.error, 0, "{:?}", p.message);
        if data.is_empty() {
            return out;
        }
        let v = values(&data);
        let from = offset;
        offset = v.last().unwrap().0 + 1;
        out.extend(v.into_iter().filter(|(o, _)| *o >= from));
    }
}

#[test]
fn produce_and_fetch_across_cores_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let mut c = b.client();
    assert_eq!(c.create_topic("orders", 4, &[]).error, 0);
    assert_eq!(c.create_topic("orders", 4, &[]).error, 10, "exists");
    let (md, _) = c.ok(&MetadataRequest { topics: None }, &[]);
    assert_eq!(md.cores.len(), 2);
    let t = &md.topics[0];
    assert_eq!(t.partitions.len(), 4);
    let owners: std::collections::BTreeSet<u32> = t.partitions.iter().map(|p| p.core).collect();
    assert_eq!(owners.len(), 2, "partitions live on both cores");

    // One request spanning all partitions (both cores), each acks mode.
    let batches: Vec<_> = (0..4)
        .map(|p| records_batch(&format!("p{p}"), 5, 1_000))
        .collect();
    for acks in [-1i8, 1, 0] {
        let parts: Vec<(u32, &[u8])> = batches
            .iter()
            .enumerate()
            .map(|(p, b)| (p as u32, &b[..]))
            .collect();
        let r = produce(&mut c, "orders", &parts, acks);
        for p in &r.partitions {
            assert_eq!(p.error, 0, "{:?}", p.message);
        }
    }
    // acks=0 may still be in flight: a flush is not observable, so wait for
    // the data with a long poll instead of sleeping.
    for p in 0..4u32 {
        let (r, _) = fetch(&mut c, "orders", p, 10, 5_000);
        assert_eq!(r.error, 0);
        let got = read_all(&mut c, "orders", p);
        assert_eq!(got.len(), 15);
        for (i, (o, v)) in got.iter().enumerate() {
            assert_eq!(*o, i as u64);
            assert_eq!(v, &format!("p{p}-{}", i % 5));
        }
    }
    // Through a core's own port too, for the partitions it owns; the
    // others are refused with NotOwner (no silent forwarding there).
    let mut c1 = Client::connect(std::net::SocketAddr::new(b.listen.ip(), b.core_ports[1]));
    for p in &t.partitions {
        if p.core == 1 {
            assert_eq!(read_all(&mut c1, "orders", p.partition).len(), 15);
        } else {
            let (r, _) = fetch(&mut c1, "orders", p.partition, 0, 0);
            assert_eq!(r.error, ErrorCode::NotOwner.as_u16(), "{:?}", r.message);
        }
    }

    assert!(b.stop().success(), "SIGTERM exits 0");
    let b = Broker::start(dir.path(), 2);
    let text = common::scrape(b.metrics);
    for core in 0..2 {
        assert!(
            text.contains(&format!(
                "weir_recovery_scanned_segments_total{{core=\"{core}\"}} 0"
            )),
            "a start after SIGTERM scans nothing"
        );
    }
    let mut c = b.client();
    let (md, _) = c.ok(&MetadataRequest { topics: None }, &[]);
    assert_eq!(
        md.topics[0].name, "orders",
        "topic metadata survives restart"
    );
    for p in 0..4 {
        assert_eq!(read_all(&mut c, "orders", p).len(), 15);
    }
}

#[test]
fn acked_records_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let mut c = b.client();
    c.create_topic("t", 2, &[]);
    // A producer keeps producing (acks=all) while the broker is killed;
    // every acknowledgement it got is reported here first.
    let (tx, rx) = std::sync::mpsc::channel::<(u32, u64)>();
    let addr = b.listen;
    let producer = std::thread::spawn(move || {
        let mut c = Client::connect(addr);
        for i in 0..100_000u32 {
            let p = i % 2;
            let batch = records_batch(&format!("r{i}"), 3, 5);
            let req = ProduceRequest {
                transactional_id: None,
                acks: -1,
                timeout_ms: 30_000,
                partitions: vec![ProducePartition {
                    topic: "t".into(),
                    partition: p,
                    payload_offset: 0,
                    payload_len: batch.len() as u32,
                }],
            };
            match c.try_ok(&req, &[&batch]) {
                Ok(r) if r.partitions[0].error == 0 => {
                    if tx.send((p, r.partitions[0].base_offset + 3)).is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    });
    let mut acked = [0u64; 2];
    for _ in 0..300 {
        let (p, end) = rx.recv().unwrap();
        acked[p as usize] = acked[p as usize].max(end);
    }
    b.kill();
    for (p, end) in rx.iter() {
        acked[p as usize] = acked[p as usize].max(end);
    }
    producer.join().unwrap();
    let b = Broker::start(dir.path(), 2);
    let mut c = b.client();
    for p in 0..2u32 {
        let got = read_all(&mut c, "t", p);
        assert!(
            got.len() as u64 >= acked[p as usize],
            "every acknowledged record is there"
        );
        for (i, (o, _)) in got.iter().enumerate() {
            assert_eq!(*o, i as u64, "offsets are contiguous");
        }
    }
}

#[test]
fn long_poll_wakes_when_data_arrives_and_offsets_by_time() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let mut c = b.client();
    c.create_topic("lp", 1, &[]);
    let addr = b.listen;
    let t0 = Instant::now();
    let waiter = std::thread::spawn(move || {
        let mut c = Client::connect(addr);
        let (p, data) = fetch(&mut c, "lp", 0, 0, 20_000);
        (p.error, values(&data), t0.elapsed())
    });
    // Whether the waiter's fetch is already parked or arrives after the
    // produce, it must return the record long before its 20 s timeout.
    let batch = records_batch("x", 1, 10_000);
    produce(&mut c, "lp", &[(0, &batch)], -1);
    let (err, vals, took) = waiter.join().unwrap();
    assert_eq!(err, 0);
    assert_eq!(vals[0].1, "x-0");
    assert!(
        took < Duration::from_secs(15),
        "woke on data, not on the timeout"
    );

    for ts in [20_000i64, 30_000] {
        let batch = records_batch("y", 2, ts);
        produce(&mut c, "lp", &[(0, &batch)], -1);
    }
    let (r, _) = c.ok(
        &ListOffsetsRequest {
            read_committed: false,
            partitions: vec![
                ListOffsetsPartition {
                    topic: "lp".into(),
                    partition: 0,
                    spec: OffsetSpec::Earliest,
                },
                ListOffsetsPartition {
                    topic: "lp".into(),
                    partition: 0,
                    spec: OffsetSpec::Latest,
                },
                ListOffsetsPartition {
                    topic: "lp".into(),
                    partition: 0,
                    spec: OffsetSpec::Timestamp(20_001),
                },
                ListOffsetsPartition {
                    topic: "lp".into(),
                    partition: 0,
                    spec: OffsetSpec::Timestamp(99_999),
                },
            ],
        },
        &[],
    );
    let o: Vec<_> = r.partitions.iter().map(|p| p.offset).collect();
    assert_eq!(o, vec![Some(0), Some(5), Some(2), None]);
}

#[test]
fn bad_input_gets_clear_errors_and_hurts_no_one() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &["--max-frame-bytes", "65536"]);
    let mut good = b.client();
    good.create_topic("ok", 2, &[]);
    let batch = records_batch("a", 2, 1);
    produce(&mut good, "ok", &[(0, &batch)], -1);

    // Unknown API key: an error answer, the connection stays usable.
    let mut c = b.client();
    let mut f = Vec::new();
    f.extend_from_slice(&12u32.to_be_bytes());
    f.extend_from_slice(&999u16.to_be_bytes());
    f.extend_from_slice(&0u16.to_be_bytes());
    f.extend_from_slice(&7u32.to_be_bytes());
    f.extend_from_slice(&0u32.to_be_bytes());
    c.send_raw(&f).unwrap();
    let r = c.read_frame().unwrap();
    let (h, _, _) = weir_proto::frame::decode_response(&r).unwrap();
    assert_eq!(h.error, ErrorCode::UnsupportedApi);
    let mut other = b.client();
    other.ok(&ApiVersionsRequest {}, &[]);
    assert_eq!(h.correlation_id, 7);
    c.ok(&ApiVersionsRequest {}, &[]);

    // A known API at an unknown version.
    let mut f = Vec::new();
    f.extend_from_slice(&12u32.to_be_bytes());
    f.extend_from_slice(&1u16.to_be_bytes());
    f.extend_from_slice(&77u16.to_be_bytes());
    f.extend_from_slice(&8u32.to_be_bytes());
    f.extend_from_slice(&0u32.to_be_bytes());
    c.send_raw(&f).unwrap();
    let (h, _, _) = weir_proto::frame::decode_response(&c.read_frame().unwrap()).unwrap();
    assert_eq!(h.error, ErrorCode::UnsupportedVersion);

    // A body that fails validation.
    let mut f = Vec::new();
    f.extend_from_slice(&(12u32 + 8).to_be_bytes());
    f.extend_from_slice(&1u16.to_be_bytes()); // Metadata
    f.extend_from_slice(&0u16.to_be_bytes());
    f.extend_from_slice(&8u32.to_be_bytes());
    f.extend_from_slice(&8u32.to_be_bytes());
    f.extend_from_slice(&[0xff; 8]);
    c.send_raw(&f).unwrap();
    let (h, _, _) = weir_proto::frame::decode_response(&c.read_frame().unwrap()).unwrap();
    assert_eq!(h.error, ErrorCode::InvalidRequest);

    // Bad CRC, unknown topic, fetch past the end: partition-level errors.
    let mut bad = records_batch("b", 1, 1);
    let n = bad.len();
    bad[n - 1] ^= 1;
    let r = produce(&mut c, "ok", &[(0, &bad)], -1);
    assert_eq!(r.partitions[0].error, CORRUPT);
    assert!(r.partitions[0].message.as_ref().unwrap().contains("CRC"));
    let r = produce(&mut c, "nope", &[(0, &batch)], -1);
    assert_eq!(r.partitions[0].error, UNKNOWN_TOPIC);
    // A transactional batch (no transaction serves it yet) and a forged
    // transaction marker: refused, nothing appended.
    let tx = crate::common::batch_of_values(&["t"], Some((5, 0, 0, true)));
    let r = produce(&mut c, "ok", &[(0, &tx[..])], -1);
    assert_eq!(r.partitions[0].error, ErrorCode::InvalidRequest.as_u16());
    let m = r.partitions[0].message.clone().unwrap_or_default();
    assert!(m.contains("transactional batch"), "{m}");
    let marker = weir_storage::txn::marker_batch(
        5,
        0,
        weir_storage::txn::Marker {
            kind: weir_storage::txn::MarkerKind::Commit,
            coordinator_epoch: 0,
        },
        1,
    );
    let r = produce(&mut c, "ok", &[(0, &marker)], -1);
    assert_ne!(r.partitions[0].error, 0, "a forged marker was appended");
    let (p, _) = fetch(&mut c, "ok", 0, 99, 0);
    assert_eq!(p.error, OFFSET_OUT_OF_RANGE);
    assert!(p.message.unwrap().contains("0..=2"));

    // A frame over --max-frame-bytes: an error answer, then the connection closes.
    let mut big = b.client();
    big.send_raw(&(1u32 << 20).to_be_bytes()).unwrap();
    let (h, _, _) = weir_proto::frame::decode_response(&big.read_frame().unwrap()).unwrap();
    assert_eq!(h.error, ErrorCode::FrameTooLarge);
    let mut byte = [0u8; 1];
    use std::io::Read;
    assert_eq!(big.stream.read(&mut byte).unwrap_or(0), 0, "closed");

    // Nothing written was lost, and other connections still work.
    let (p, data) = fetch(&mut good, "ok", 0, 0, 0);
    assert_eq!(p.error, 0);
    assert_eq!(values(&data).len(), 2);
}

#[test]
fn metrics_endpoint_serves_prometheus_text() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let mut c = b.client();
    c.create_topic("m", 2, &[]);
    let batch = records_batch("m", 3, 1);
    produce(&mut c, "m", &[(0, &batch), (1, &batch)], -1);
    fetch(&mut c, "m", 0, 0, 0);
    let text = common::scrape(b.metrics);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    for needle in [
        "weir_requests_total{api=\"Produce\"",
        "weir_request_duration_seconds_bucket{api=\"Fetch\"",
        "weir_bytes_in_total{core=\"0\"}",
        "weir_cache_hit_ratio{core=\"1\"}",
        "weir_fsync_seconds_total",
        "weir_fsync_duration_seconds_bucket{core=\"0\",le=\"+Inf\"}",
        "weir_partition_log_end_offset{topic=\"m\",partition=\"1\"",
    ] {
        assert!(text.contains(needle), "missing {needle}");
    }
}

#[test]
fn long_poll_over_several_partitions_returns_when_one_gets_data() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let mut c = b.client();
    c.create_topic("multi", 4, &[]);
    let addr = b.listen;
    let t0 = Instant::now();
    let waiter = std::thread::spawn(move || {
        let mut c = Client::connect(addr);
        let (r, payload) = c.ok(
            &FetchRequest {
                read_committed: false,
                max_wait_ms: 20_000,
                min_bytes: 1,
                max_bytes: 1 << 20,
                partitions: (0..4)
                    .map(|p| FetchPartition {
                        topic: "multi".into(),
                        partition: p,
                        offset: 0,
                        max_bytes: 1 << 20,
                    })
                    .collect(),
            },
            &[],
        );
        (r, payload.len(), t0.elapsed())
    });
    let batch = records_batch("z", 1, 1);
    produce(&mut c, "multi", &[(3, &batch)], -1);
    let (r, len, took) = waiter.join().unwrap();
    assert!(len > 0);
    assert!(r.partitions.iter().all(|p| p.error == 0));
    assert!(
        took < Duration::from_secs(15),
        "answered on data, not at the timeout"
    );
}

/// A data directory of an earlier version (a `topics.toml` registry, no
/// cluster metadata) starts with its topics, ids and records, moved into
/// the cluster metadata once.
#[test]
fn a_topics_toml_registry_is_migrated_into_the_cluster_metadata_once() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let mut c = b.client();
    assert_eq!(
        c.create_topic("legacy", 2, &[("retention.ms", "86400000")])
            .error,
        0
    );
    for p in 0..2u32 {
        let batch = records_batch(&format!("p{p}"), 10, 1_000);
        let r = produce(&mut c, "legacy", &[(p, &batch[..])], -1);
        assert_eq!(r.partitions[0].error, 0);
    }
    assert!(b.stop().success());
    // Make it look like an earlier version's directory.
    for gone in ["raft", "cluster.id", "certs"] {
        let path = dir.path().join(gone);
        if path.is_dir() {
            std::fs::remove_dir_all(path).unwrap();
        } else {
            std::fs::remove_file(path).unwrap();
        }
    }
    let id = "5f0c2a7e-1b2d-4c3e-9f40-0123456789ab"; // kept (see metadata::id_bytes)
    std::fs::write(
        dir.path().join("topics.toml"),
        format!(
            "version = 7\n[topics.legacy]\nid = \"{id}\"\ncores = [1, 0]\n[topics.legacy.configs]\n\"retention.ms\" = \"86400000\"\n"
        ),
    )
    .unwrap();
    for round in 0..2 {
        let b = Broker::start(dir.path(), 2);
        let mut c = b.client();
        let (md, _) = c.ok(
            &MetadataRequest {
                topics: Some(vec!["legacy".into()]),
            },
            &[],
        );
        let t = &md.topics[0];
        assert_eq!(t.error, 0, "round {round}");
        let cores: Vec<u32> = t.partitions.iter().map(|p| p.core).collect();
        assert_eq!(cores, vec![1, 0], "round {round}: and its placement");
        for p in 0..2u32 {
            let got = read_all(&mut c, "legacy", p);
            assert_eq!(got.len(), 10, "round {round}: partition {p}");
        }
        assert!(!dir.path().join("topics.toml").exists());
        assert!(dir.path().join("topics.toml.migrated").exists());
        assert!(b.stop().success());
    }
}

/// Producer ids come in blocks from the controller quorum, past any id an
/// earlier version of the node handed out (its `producer-ids` file), and
/// never repeat across restarts.
#[test]
fn producer_ids_start_past_an_earlier_versions_counter_and_never_repeat() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("producer-ids"), "5000\n").unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..2 {
        let b = Broker::start(dir.path(), 2);
        let mut c = b.client();
        for _ in 0..3 {
            let (r, _) = c.ok(&InitProducerIdRequest::default(), &[]);
            assert_eq!(r.error, 0);
            assert!(r.producer_id >= 5000, "{}", r.producer_id);
            assert!(
                seen.insert(r.producer_id),
                "{} handed out twice",
                r.producer_id
            );
        }
        b.kill();
    }
}

/// Fetch v2's `FetchPartition::CONTINUE`: a connection's fetch of a
/// partition goes on from where its previous one ended, so fetches sent
/// before any is answered read consecutive ranges; a fetch by offset
/// moves the point; a partition the connection never fetched, or whose
/// last fetch failed, is refused (InvalidRequest) while the request's
/// other partitions are served.
#[test]
fn a_continuing_fetch_reads_on_from_where_the_connections_last_fetch_ended() {
    use weir_proto::frame::{self, RequestHeader};
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let mut c = b.client();
    assert_eq!(c.create_topic("cont", 2, &[]).error, 0);
    let one = records_batch("b0", 10, 1_000).len() as u32;
    for i in 0..6 {
        let batch = records_batch(&format!("b{i}"), 10, 1_000);
        let r = produce(&mut c, "cont", &[(0, &batch[..])], -1);
        assert_eq!(r.partitions[0].error, 0);
    }
    let request = |parts: &[(u32, u64)]| FetchRequest {
        read_committed: false,
        max_wait_ms: 0,
        min_bytes: 1,
        max_bytes: 1 << 20,
        partitions: parts
            .iter()
            .map(|&(partition, offset)| FetchPartition {
                topic: "cont".into(),
                partition,
                offset,
                max_bytes: one,
            })
            .collect(),
    };
    let answer = |c: &mut Client, corr: u32| {
        let f = c.read_frame().unwrap();
        let (rh, body, payload) = frame::decode_response(&f).unwrap();
        assert_eq!(rh.correlation_id, corr);
        let r = frame::decode_body::<FetchResponse>(body).unwrap();
        let payload = payload.to_vec();
        r.partitions
            .into_iter()
            .map(|p| {
                let data = &payload
                    [p.payload_offset as usize..(p.payload_offset + p.payload_len) as usize];
                let offsets: Vec<u64> = values(data).into_iter().map(|(o, _)| o).collect();
                (p, offsets)
            })
            .collect::<Vec<_>>()
    };
    let send = |c: &mut Client, corr: u32, parts: &[(u32, u64)]| {
        let h = RequestHeader::of::<FetchRequest>(corr);
        let wire = frame::encode_request_with_payload(&h, &request(parts), &[]).unwrap();
        c.send_raw(&wire).unwrap();
    };

    // One by offset and two continuing, all sent before any is answered:
    // one batch of ten each, back to back.
    let mut wire = Vec::new();
    for (corr, offset) in [
        (101, 0),
        (102, FetchPartition::CONTINUE),
        (103, FetchPartition::CONTINUE),
    ] {
        let h = RequestHeader::of::<FetchRequest>(corr);
        wire.extend(frame::encode_request_with_payload(&h, &request(&[(0, offset)]), &[]).unwrap());
    }
    c.send_raw(&wire).unwrap();
    for (corr, from) in [(101, 0u64), (102, 10), (103, 20)] {
        let got = answer(&mut c, corr);
        let (p, offsets) = &got[0];
        assert_eq!((p.error, p.fetch_offset), (0, from), "{:?}", p.message);
        assert_eq!(*offsets, (from..from + 10).collect::<Vec<_>>());
    }

    // A fetch by offset moves the point; at the end a continuing fetch
    // comes back empty, from the end.
    let (p, _) = fetch(&mut c, "cont", 0, 50, 0);
    assert_eq!((p.error, p.fetch_offset), (0, 50));
    send(&mut c, 104, &[(0, FetchPartition::CONTINUE)]);
    let got = answer(&mut c, 104);
    assert_eq!((got[0].0.error, got[0].0.fetch_offset), (0, 60));
    assert!(got[0].1.is_empty());

    // Another connection has nothing to continue from: refused for that
    // partition, the other one served.
    let mut fresh = b.client();
    send(&mut fresh, 7, &[(0, FetchPartition::CONTINUE), (1, 0)]);
    let got = answer(&mut fresh, 7);
    assert_eq!(got[0].0.error, ErrorCode::InvalidRequest.as_u16());
    let message = got[0].0.message.clone().unwrap_or_default();
    assert!(message.contains("nothing to continue from"), "{message}");
    assert!(got[0].1.is_empty());
    assert_eq!((got[1].0.error, got[1].0.fetch_offset), (0, 0));

    // A failed fetch leaves nothing to continue from.
    let (p, _) = fetch(&mut c, "cont", 0, 1_000, 0);
    assert_eq!(p.error, OFFSET_OUT_OF_RANGE);
    send(&mut c, 105, &[(0, FetchPartition::CONTINUE)]);
    let got = answer(&mut c, 105);
    assert_eq!(got[0].0.error, ErrorCode::InvalidRequest.as_u16());
}
