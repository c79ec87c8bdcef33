//! Regression tests for the defects the broker-core redesign fixed: each
//! failed on the broker before it (lost topic changes, stalled clients
//! holding a core's budget, reply entries left behind, unbounded fetches,
//! a panicking core leaving a half-dead process, long polls outliving
//! their connection).

use crate::common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{metric, records_batch, values, wait_until, Broker, Client};
use weir_proto::error_code::ErrorCode;
use weir_proto::messages::*;

/// The tests of this file run one at a time: one of them measures latency,
/// and the machine has 2 cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn topic_names(c: &mut Client) -> BTreeSet<String> {
    let (r, _) = c.ok(&MetadataRequest { topics: None }, &[]);
    r.topics.into_iter().map(|t| t.name).collect()
}

fn produce_req(topic: &str, partition: u32, len: usize, acks: i8) -> ProduceRequest {
    ProduceRequest {
        transactional_id: None,
        acks,
        timeout_ms: 30_000,
        partitions: vec![ProducePartition {
            topic: topic.into(),
            partition,
            payload_offset: 0,
            payload_len: len as u32,
        }],
    }
}

#[test]
fn concurrent_topic_creates_and_deletes_leave_exactly_the_acknowledged_set_after_a_restart() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let doomed: Vec<String> = (0..12).map(|i| format!("doomed-{i}")).collect();
    {
        let mut c = b.client();
        for t in &doomed {
            assert_eq!(c.create_topic(t, 2, &[]).error, 0);
        }
    }
    // 8 connections create 6 topics each while 4 others delete the doomed
    // ones, all at once.
    let addr = b.listen;
    let creators: Vec<_> = (0..8)
        .map(|w| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut acked = Vec::new();
                for i in 0..6 {
                    let name = format!("t-{w}-{i}");
                    if c.create_topic(&name, 1 + (i % 3), &[]).error == 0 {
                        acked.push(name);
                    }
                }
                acked
            })
        })
        .collect();
    let deleters: Vec<_> = doomed
        .chunks(3)
        .map(|names| {
            let names = names.to_vec();
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut acked = Vec::new();
                for n in names {
                    let (r, _) = c.ok(
                        &DeleteTopicsRequest {
                            names: vec![n.clone()],
                        },
                        &[],
                    );
                    if r.topics[0].error == 0 {
                        acked.push(n);
                    }
                }
                acked
            })
        })
        .collect();
    let mut expected = BTreeSet::new();
    for t in creators {
        expected.extend(t.join().unwrap());
    }
    let mut deleted = BTreeSet::new();
    for t in deleters {
        deleted.extend(t.join().unwrap());
    }
    assert_eq!(expected.len(), 48, "every create is acknowledged");
    assert_eq!(deleted.len(), 12, "every delete is acknowledged");
    assert_eq!(topic_names(&mut b.client()), expected);
    assert_eq!(b.stop().code(), Some(0));
    let b = Broker::start(dir.path(), 2);
    assert_eq!(
        topic_names(&mut b.client()),
        expected,
        "after a restart: exactly the acknowledged creates, none of the deleted topics"
    );
    assert!(metric(b.metrics, "weir_metadata_version") >= 2.0 * 61.0);
}

#[test]
fn stalled_large_frames_do_not_slow_other_clients_and_are_closed_after_the_deadline() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &["--frame-read-timeout-ms", "3000"]);
    let mut c = b.client();
    assert_eq!(c.create_topic("lat", 1, &[]).error, 0);
    let batch = records_batch("v", 1, 1);
    let req = produce_req("lat", 0, batch.len(), 1);
    // The p99 of 400 produces, as the median of three such windows (one
    // window hit by another process on this 2-core machine does not
    // decide the test).
    let p99 = |c: &mut Client| {
        let mut windows: Vec<u128> = (0..3)
            .map(|_| {
                let mut us: Vec<u128> = (0..400)
                    .map(|_| {
                        let t0 = Instant::now();
                        let (r, _) = c.ok(&req, &[&batch]);
                        assert_eq!(r.partitions[0].error, 0);
                        t0.elapsed().as_micros()
                    })
                    .collect();
                us.sort();
                us[us.len() * 99 / 100]
            })
            .collect();
        windows.sort();
        windows[1]
    };
    p99(&mut c); // warm up
    let idle = p99(&mut c);
    // 50 connections each declare a frame of ~100 MiB, send 12 bytes of
    // it and stall.
    let t_stall = Instant::now();
    let mut stalled: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut s = TcpStream::connect(b.listen).unwrap();
            let mut head = ((100u32 << 20) - 16).to_be_bytes().to_vec();
            head.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 0]);
            s.write_all(&head).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s
        })
        .collect();
    let loaded = p99(&mut c);
    assert!(
        t_stall.elapsed() < Duration::from_millis(2500),
        "the measurement must run while the stalled frames are open"
    );
    eprintln!("produce p99: idle {idle} µs, with 50 stalled frames {loaded} µs");
    // 1 ms of slack absorbs scheduler noise on a busy 2-core machine.
    assert!(
        loaded <= 2 * idle + 1000,
        "produce p99 with 50 stalled frames: {loaded} µs, idle: {idle} µs"
    );
    for s in &mut stalled {
        let mut one = [0u8; 1];
        match s.read(&mut one) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("a stalled connection was not closed: {other:?}"),
        }
    }
    let waited = t_stall.elapsed();
    assert!(
        waited >= Duration::from_millis(2900) && waited < Duration::from_secs(15),
        "closed after {waited:?}, deadline 3 s"
    );
    assert_eq!(metric(b.metrics, "weir_frame_read_timeouts_total"), 50.0);
    // The broker still serves.
    let (r, _) = c.ok(&req, &[&batch]);
    assert_eq!(r.partitions[0].error, 0);
}

#[test]
fn bad_crc_batches_sent_across_cores_leave_no_reply_entries_behind() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let mut c = b.client();
    // Two partitions: one lives on each core, so whichever core this
    // connection is on, one of them is across the mesh.
    assert_eq!(c.create_topic("crc", 2, &[]).error, 0);
    let mut bad = records_batch("v", 3, 1);
    let n = bad.len();
    bad[n - 1] ^= 0xFF;
    for i in 0..400 {
        let (r, _) = c.ok(&produce_req("crc", i % 2, bad.len(), -1), &[&bad]);
        assert_eq!(
            r.partitions[0].error,
            ErrorCode::CorruptMessage.as_u16(),
            "{:?}",
            r.partitions[0].message
        );
    }
    assert_eq!(metric(b.metrics, "weir_mesh_pending_replies"), 0.0);
    // Nothing was appended.
    let (r, _) = c.ok(
        &ListOffsetsRequest {
            read_committed: false,
            partitions: (0..2)
                .map(|p| ListOffsetsPartition {
                    topic: "crc".into(),
                    partition: p,
                    spec: OffsetSpec::Latest,
                })
                .collect(),
        },
        &[],
    );
    assert!(r.partitions.iter().all(|p| p.offset == Some(0)));
}

#[test]
fn a_fetch_naming_100000_partitions_is_refused_with_a_clear_error() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 1);
    let mut c = b.client();
    assert_eq!(c.create_topic("f", 1, &[]).error, 0);
    let req = FetchRequest {
        read_committed: false,
        max_wait_ms: 0,
        min_bytes: 0,
        max_bytes: 1 << 20,
        partitions: (0..100_000)
            .map(|p| FetchPartition {
                topic: "f".into(),
                partition: p,
                offset: 0,
                max_bytes: 1 << 20,
            })
            .collect(),
    };
    let (h, body, _) = c.call(&req, &[]);
    assert_eq!(h.error, ErrorCode::InvalidRequest);
    let msg = body.unwrap_err();
    assert!(
        msg.contains("100000 partitions") && msg.contains("at most 10000"),
        "{msg}"
    );
    // The connection is still usable.
    let (r, _) = c.ok(&MetadataRequest { topics: None }, &[]);
    assert_eq!(r.topics.len(), 1);
}

#[test]
fn a_long_poll_is_cancelled_when_its_connection_closes() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    assert_eq!(b.client().create_topic("poll", 2, &[]).error, 0);
    let mut polls = Vec::new();
    for _ in 0..8 {
        let mut c = b.client();
        let req = FetchRequest {
            read_committed: false,
            max_wait_ms: 25_000,
            min_bytes: 1,
            max_bytes: 1 << 20,
            partitions: (0..2)
                .map(|p| FetchPartition {
                    topic: "poll".into(),
                    partition: p,
                    offset: 0,
                    max_bytes: 1 << 20,
                })
                .collect(),
        };
        let h = weir_proto::frame::RequestHeader::of::<FetchRequest>(1);
        let bytes = weir_proto::frame::encode_request_with_payload(&h, &req, &[]).unwrap();
        c.send_raw(&bytes).unwrap();
        polls.push(c);
    }
    // Each poll waits on the partition of the other core: a pending reply.
    wait_until(
        Instant::now() + Duration::from_secs(10),
        "the long polls wait across the mesh",
        || metric(b.metrics, "weir_mesh_pending_replies") >= 8.0,
    );
    assert!(metric(b.metrics, "weir_mesh_running_waits") >= 8.0);
    drop(polls);
    // Both ends stop waiting long before the polls' 25 s: the asking core
    // forgets the requests, the owner cores end the waits.
    wait_until(
        Instant::now() + Duration::from_secs(5),
        "closing the connections cancels their long polls",
        || {
            metric(b.metrics, "weir_mesh_pending_replies") == 0.0
                && metric(b.metrics, "weir_mesh_running_waits") == 0.0
        },
    );
}

#[test]
fn a_panic_in_a_core_ends_the_process_and_a_restart_recovers_every_acknowledged_record() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut b = Broker::start_with(dir.path(), 2, &["--test-panic-on-produce-to", "boom"]);
    let mut c = b.client();
    assert_eq!(c.create_topic("data", 2, &[]).error, 0);
    assert_eq!(c.create_topic("boom", 1, &[]).error, 0);
    let mut acked = Vec::new();
    for i in 0..100u32 {
        let batch = records_batch(&format!("r{i}"), 5, 1);
        let (r, _) = c.ok(&produce_req("data", i % 2, batch.len(), -1), &[&batch]);
        assert_eq!(r.partitions[0].error, 0);
        acked.push((i % 2, r.partitions[0].base_offset, format!("r{i}")));
    }
    let batch = records_batch("x", 1, 1);
    let mut boom = b.client();
    let _ = boom.try_ok(&produce_req("boom", 0, batch.len(), -1), &[&batch]);
    // The whole process ends (aborted), not just the core.
    let status = wait_until(
        Instant::now() + Duration::from_secs(20),
        "the broker exits after a core panicked",
        || b.try_wait(),
    );
    assert!(!status.success(), "exit status {status:?}");
    drop(b);
    let b = Broker::start(dir.path(), 2);
    let mut c = b.client();
    for p in 0..2u32 {
        let (r, payload) = c.ok(
            &FetchRequest {
                read_committed: false,
                max_wait_ms: 0,
                min_bytes: 0,
                max_bytes: 64 << 20,
                partitions: vec![FetchPartition {
                    topic: "data".into(),
                    partition: p,
                    offset: 0,
                    max_bytes: 64 << 20,
                }],
            },
            &[],
        );
        assert_eq!(r.partitions[0].error, 0);
        let got = values(&payload);
        for (_, base, prefix) in acked.iter().filter(|(q, _, _)| *q == p) {
            for k in 0..5u64 {
                let want = format!("{prefix}-{k}");
                assert!(
                    got.contains(&(base + k, want.clone())),
                    "acknowledged record {want} at {} lost",
                    base + k
                );
            }
        }
    }
}

/// Runs `weir broker` with its log to a file until it is ready, stops it
/// with SIGTERM and returns what it logged.
fn broker_logs(dir: &std::path::Path, extra: &[&str]) -> String {
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("broker.log");
    let node = common::Node::builder(env!("CARGO_BIN_EXE_weir"))
        .data_dir(dir)
        .cores(1)
        .args(extra)
        .env("WEIR_LOG", "info")
        .log_to(&log)
        .start();
    assert!(node.stop().success());
    std::fs::read_to_string(&log).unwrap()
}

#[test]
fn logs_carry_no_colour_codes_off_a_terminal_and_are_json_on_request() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let text = broker_logs(dir.path(), &[]);
    assert!(text.contains("broker ready"), "{text}");
    assert!(
        !text.contains('\x1b'),
        "colour codes in a log file: {text:?}"
    );
    let json = broker_logs(dir.path(), &["--log-format", "json"]);
    let lines: Vec<&str> = json.lines().collect();
    assert!(lines.len() >= 2, "{json}");
    for l in lines {
        assert!(
            l.starts_with('{') && l.ends_with('}') && l.contains("\"level\":\"INFO\""),
            "not a JSON log line: {l}"
        );
    }
}
