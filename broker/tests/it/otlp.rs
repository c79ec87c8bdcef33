//! The OTLP receivers: the unchanged OpenTelemetry Python SDK exporting
//! over gRPC and HTTP, its records read back by confluent-kafka and
//! decoded with opentelemetry-proto (broker/tests/kafka/otlp.py); bad
//! input refused with the answer OTLP's retry rules expect and nothing
//! appended; a slow or silent client cut off while others are served.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use weir_client::{Client, OffsetSpec};
use weir_otlp::wire::{put_len, put_nested};

use crate::common::{runtime, Broker};
use crate::kafka_clients::python_script;

fn start(extra: &[&str]) -> (tempfile::TempDir, Broker) {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_otlp(dir.path(), 2, extra);
    (dir, b)
}

fn json_field(out: &str, key: &str) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {out}"))
}

#[test]
fn the_python_sdk_exports_over_grpc_and_http_and_every_record_decodes() {
    let (_d, b) = start(&[
        "--otlp-create-topics",
        "true",
        "--otlp-topic-partitions",
        "3",
        "--otlp-partition-traces-by-id",
        "true",
    ]);
    let out = python_script(
        "otlp.py",
        &[
            &b.otlp_grpc.unwrap().to_string(),
            &b.otlp_http.unwrap().to_string(),
            &b.kafka.to_string(),
            "otlp_proto",
            "10000",
            "10000",
        ],
    );
    assert_eq!(json_field(&out, "spans"), 20_000, "{out}");
    assert_eq!(json_field(&out, "logs"), 20_000, "{out}");
    // 2 000 traces over 3 partitions, each trace in one.
    assert_eq!(json_field(&out, "partitions_used"), 3, "{out}");
    assert!(json_field(&out, "metric_points") >= 8, "{out}");
    b.stop();
}

#[test]
fn otlp_json_records_decode_as_the_same_requests() {
    let (_d, b) = start(&[
        "--otlp-create-topics",
        "true",
        "--otlp-topic-partitions",
        "2",
        "--otlp-partition-traces-by-id",
        "true",
        "--otlp-encoding",
        "otlp_json",
    ]);
    let out = python_script(
        "otlp.py",
        &[
            &b.otlp_grpc.unwrap().to_string(),
            &b.otlp_http.unwrap().to_string(),
            &b.kafka.to_string(),
            "otlp_json",
            "1000",
            "1000",
        ],
    );
    assert_eq!(json_field(&out, "spans"), 2_000, "{out}");
    assert_eq!(json_field(&out, "logs"), 2_000, "{out}");
    b.stop();
}

#[test]
fn bad_otlp_grpc_input_gets_the_codes_otlp_retries_by() {
    let (_d, b) = start(&[
        "--otlp-create-topics",
        "true",
        "--otlp-max-request-bytes",
        "1048576",
    ]);
    let out = python_script("otlp_grpc_bad.py", &[&b.otlp_grpc.unwrap().to_string()]);
    assert!(out.contains("\"ok\": true"), "{out}");
    assert_eq!(
        end_offset(&b, "otlp_spans"),
        None,
        "nothing appended: {out}"
    );
    b.stop();
}

/// One HTTP/1.1 request over a fresh connection; the status, the headers
/// (lowercase) and the body.
fn http(addr: SocketAddr, head: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{head}\r\nHost: weir\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    read_response(&mut s)
}

fn read_response(s: &mut TcpStream) -> (u16, String, Vec<u8>) {
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head[9..12].parse().unwrap();
    (status, head, raw[split + 4..].to_vec())
}

/// A traces export of one span with `trace_id`.
fn one_span(trace_id: &[u8]) -> Vec<u8> {
    let mut req = Vec::new();
    put_nested(&mut req, 1, |rs| {
        put_nested(rs, 2, |ss| {
            put_nested(ss, 2, |span| {
                put_len(span, 1, trace_id);
                put_len(span, 2, &[7; 8]);
                put_len(span, 5, b"span");
            })
        })
    });
    req
}

/// The end offset of partition 0 (`None`: no such topic).
fn end_offset(b: &Broker, topic: &str) -> Option<u64> {
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        match c.list_offsets(topic, 0, OffsetSpec::Latest).await {
            Ok(end) => Some(end.unwrap_or(0)),
            Err(e) if e.to_string().contains("unknown topic") => None,
            Err(e) => panic!("{topic}: {e}"),
        }
    })
}

const PROTOBUF: &str = "Content-Type: application/x-protobuf";

#[test]
fn bad_otlp_http_input_is_refused_with_a_reason_and_nothing_is_appended() {
    let (_d, b) = start(&[
        "--otlp-create-topics",
        "true",
        "--otlp-max-request-bytes",
        "1048576",
    ]);
    let addr = b.otlp_http.unwrap();
    let good = one_span(&[1; 16]);
    let (status, head, body) = http(
        addr,
        &format!("POST /v1/traces HTTP/1.1\r\n{PROTOBUF}"),
        &good,
    );
    assert_eq!(status, 200, "{head}");
    assert!(
        head.contains("content-type: application/x-protobuf"),
        "{head}"
    );
    assert!(body.is_empty(), "a full success has no partial_success");

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&vec![0u8; 64 << 20]).unwrap();
    let bomb = gz.finish().unwrap();
    let bad_json = br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz"}]}]}]}"#;
    let post = |extra: &str| format!("POST /v1/traces HTTP/1.1\r\n{extra}");
    for (what, head, body, want, needle) in [
        (
            "truncated protobuf",
            post(PROTOBUF),
            &b"\x0a\x05\x01"[..],
            400,
            "malformed OTLP protobuf",
        ),
        (
            "a 5-byte trace id",
            post(PROTOBUF),
            &one_span(&[1; 5])[..],
            400,
            "Span.trace_id: 5 bytes",
        ),
        (
            "bad JSON",
            post("Content-Type: application/json"),
            &bad_json[..],
            400,
            "Span.trace_id: expected 32 hex digits",
        ),
        (
            "a gzip bomb",
            post(&format!("{PROTOBUF}\r\nContent-Encoding: gzip")),
            &bomb[..],
            413,
            "larger than 1048576 bytes once decompressed",
        ),
        (
            "plain text",
            post("Content-Type: text/plain"),
            &b"x"[..],
            415,
            "application/x-protobuf",
        ),
        (
            "an unknown encoding",
            post(&format!("{PROTOBUF}\r\nContent-Encoding: br")),
            &good[..],
            415,
            "gzip, zstd and identity",
        ),
        (
            "a GET",
            format!("GET /v1/traces HTTP/1.1\r\n{PROTOBUF}"),
            &b""[..],
            405,
            "POST",
        ),
        (
            "no such path",
            format!("POST /v1/spans HTTP/1.1\r\n{PROTOBUF}"),
            &good[..],
            404,
            "/v1/traces",
        ),
    ] {
        let (status, h, body) = http(addr, &head, body);
        let text = String::from_utf8_lossy(&body);
        assert_eq!(status, want, "{what}: {h}\n{text}");
        assert!(text.contains(needle), "{what}: {text}");
        assert!(!h.contains("retry-after"), "{what} is not retried: {h}");
    }
    // A body announced over the limit is refused before it is read (sent
    // here without it: the answer comes first, then the connection closes).
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST /v1/traces HTTP/1.1\r\nHost: weir\r\n{PROTOBUF}\r\nContent-Length: 2097152\r\n\r\n"
    )
    .unwrap();
    let (status, h, body) = read_response(&mut s);
    assert_eq!(status, 413, "{h}");
    assert!(String::from_utf8_lossy(&body).contains("larger than 1048576 bytes"));
    // JSON failures answer in JSON: a google.rpc.Status.
    let (_, _, body) = http(addr, &post("Content-Type: application/json"), bad_json);
    let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status["code"], 3, "{status}");

    assert_eq!(
        end_offset(&b, "otlp_spans"),
        Some(1),
        "only the good export was appended"
    );
    // Counted: one export, one span; every refusal for good.
    let metric = |name: &str| crate::common::metric(b.metrics, name);
    assert_eq!(metric("weir_otlp_exports_total"), 1.0);
    assert_eq!(metric("weir_otlp_items_total"), 1.0);
    assert!(metric("weir_otlp_refused_total") >= 10.0);
    assert_eq!(metric("weir_otlp_retry_later_total"), 0.0);
    // Per signal: the export was of traces; a wrong path names none.
    let text = weir_testkit::scrape(b.metrics);
    let of = |prefix: &str| crate::common::samples(&text, prefix);
    assert_eq!(of("weir_otlp_items_total{signal=\"traces\""), 1.0);
    assert_eq!(of("weir_otlp_items_total{signal=\"logs\""), 0.0);
    assert!(of("weir_otlp_refused_total{signal=\"unknown\"") >= 1.0);
    b.stop();
}

#[test]
fn a_slow_client_is_cut_off_while_others_are_served() {
    let (_d, b) = start(&[
        "--otlp-create-topics",
        "true",
        "--otlp-timeout-ms",
        "1500",
        "--otlp-idle-timeout-ms",
        "3000",
    ]);
    let addr = b.otlp_http.unwrap();
    let good = one_span(&[2; 16]);
    // Promises 100 000 bytes, sends 10.
    let mut slow = TcpStream::connect(addr).unwrap();
    write!(
        slow,
        "POST /v1/traces HTTP/1.1\r\nHost: weir\r\n{PROTOBUF}\r\nContent-Length: 100000\r\n\r\n"
    )
    .unwrap();
    slow.write_all(&good[..10]).unwrap();
    // Connects and sends nothing at all.
    let mut silent = TcpStream::connect(addr).unwrap();
    for _ in 0..5 {
        let (status, h, _) = http(
            addr,
            &format!("POST /v1/traces HTTP/1.1\r\n{PROTOBUF}"),
            &good,
        );
        assert_eq!(status, 200, "{h}");
    }
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let (status, h, body) = read_response(&mut slow);
    assert_eq!(status, 408, "{h}");
    assert!(String::from_utf8_lossy(&body).contains("--otlp-timeout-ms"));
    // The silent connection is closed (EOF), not held.
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        silent.read(&mut buf).unwrap(),
        0,
        "closed after the idle limit"
    );
    assert_eq!(end_offset(&b, "otlp_spans"), Some(5));
    b.stop();
}

/// A traces export of one span whose id is `n` (and trace id too).
pub(crate) fn numbered_span(n: u64) -> Vec<u8> {
    let mut trace = [0u8; 16];
    trace[8..].copy_from_slice(&n.to_be_bytes());
    let mut req = Vec::new();
    put_nested(&mut req, 1, |rs| {
        put_nested(rs, 2, |ss| {
            put_nested(ss, 2, |span| {
                put_len(span, 1, &trace);
                put_len(span, 2, &n.to_be_bytes());
                put_len(span, 5, b"numbered");
            })
        })
    });
    req
}

/// One export over a fresh connection: the status, or `None` when the
/// connection failed (refused, reset: a broker gone).
pub(crate) fn try_export(addr: SocketAddr, body: &[u8]) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(
        s,
        "POST /v1/traces HTTP/1.1\r\nHost: weir\r\n{PROTOBUF}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .ok()?;
    s.write_all(body).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    let status = head.get(9..12)?.parse().ok()?;
    Some((status, head))
}

/// The span ids (as numbers) of a traces record (`otlp_proto`).
pub(crate) fn span_ids(value: &[u8]) -> Vec<u64> {
    let json = weir_otlp::codec::to_json(weir_otlp::Signal::Traces.request(), value).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let mut ids = Vec::new();
    for rs in v["resourceSpans"].as_array().unwrap() {
        for ss in rs["scopeSpans"].as_array().unwrap() {
            for s in ss["spans"].as_array().unwrap() {
                ids.push(u64::from_str_radix(s["spanId"].as_str().unwrap(), 16).unwrap());
            }
        }
    }
    ids
}

/// Every span id in `otlp_spans` (both partitions), with how often.
fn span_counts(b: &Broker, expect_at_least: usize) -> std::collections::BTreeMap<u64, u32> {
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        let mut config = weir_client::ConsumerConfig::default();
        config.auto_offset_reset = weir_client::OffsetReset::Earliest;
        let mut consumer = weir_client::Consumer::new(c, config);
        consumer.assign(vec![("otlp_spans".into(), 0), ("otlp_spans".into(), 1)]);
        let mut counts = std::collections::BTreeMap::new();
        let mut spans = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while spans < expect_at_least && std::time::Instant::now() < deadline {
            for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
                for id in span_ids(&r.value.expect("a record value")) {
                    *counts.entry(id).or_insert(0) += 1;
                    spans += 1;
                }
            }
        }
        counts
    })
}

/// The unchanged Python SDK's gRPC and HTTP span exporters send while the
/// broker is SIGKILLed and started again on the same ports
/// (broker/tests/kafka/otlp_sigkill.py): every export answered success is
/// in the topic afterwards, and the exporters' own retries carry the rest.
#[test]
fn every_export_answered_success_survives_a_sigkill_and_the_rest_are_retried() {
    use std::io::BufRead;
    use std::process::Stdio;
    use weir_testkit::ports::{run, Proto};
    let dir = tempfile::tempdir().unwrap();
    // Fixed ports: the exporters keep their endpoints over the restart.
    let (grpc, http) = (run(Proto::Tcp, 0), run(Proto::Tcp, 0));
    let (grpc, http) = (format!("127.0.0.1:{grpc}"), format!("127.0.0.1:{http}"));
    let args = [
        "--otlp-create-topics",
        "true",
        "--otlp-topic-partitions",
        "2",
    ];
    let start = || Broker::start_otlp_on(dir.path(), 2, (&grpc, &http), &args);
    let b = start();
    const EXPORTS: u64 = 150;
    const PER: u64 = 10;
    let script =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/otlp_sigkill.py");
    let mut sdk = crate::common::client_program(crate::kafka_clients::python())
        .arg(script)
        .args([&grpc, &http, &EXPORTS.to_string(), &PER.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = sdk.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
            let (first, n) = (v["first"].as_u64().unwrap(), v["n"].as_u64().unwrap());
            if tx.send((first, n, v["ok"].as_bool().unwrap())).is_err() {
                return;
            }
        }
    });
    // Exports answered success (first span id, count), and refused ones.
    let (mut acked, mut failed) = (Vec::new(), Vec::new());
    let next = |acked: &mut Vec<(u64, u64)>, failed: &mut Vec<u64>| -> bool {
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok((first, n, true)) => acked.push((first, n)),
            Ok((first, _, false)) => failed.push(first),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return false,
            Err(e) => panic!("the exporters went silent: {e}"),
        }
        true
    };
    // Both exporters under way, then the kill while they send.
    while acked.len() < 40 {
        assert!(next(&mut acked, &mut failed), "the exporters ended early");
    }
    b.kill();
    let b = start();
    while next(&mut acked, &mut failed) {}
    let status = sdk.wait().unwrap();
    let mut err = String::new();
    sdk.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "{err}");
    assert_eq!(
        (acked.len() as u64, failed),
        (2 * EXPORTS, Vec::<u64>::new()),
        "every export answered success after the exporters' retries\n{err}"
    );
    assert!(
        err.contains("retrying in"),
        "the kill cut no export off (no exporter retried):\n{err}"
    );
    let want = (acked.len() as u64 * PER) as usize;
    let counts = span_counts(&b, want);
    let lost: Vec<u64> = acked
        .iter()
        .flat_map(|&(first, n)| first..first + n)
        .filter(|id| !counts.contains_key(id))
        .collect();
    assert!(
        lost.is_empty(),
        "spans of acknowledged exports lost: {lost:?}"
    );
    // At-least-once: only the exports in flight at the kill (one per
    // exporter) may be there twice (written, unanswered, sent again).
    let twice = counts.values().filter(|&&c| c > 1).count() as u64;
    assert!(twice <= 2 * PER, "{twice} spans stored more than once");
    assert_eq!(
        counts.len() as u64,
        2 * EXPORTS * PER,
        "no span beyond those sent"
    );
    b.stop();
}

#[test]
fn a_full_buffer_answers_retry_later_and_retried_exports_arrive_once() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    // A 1-byte buffer: an export waiting for its acknowledgement holds the
    // core's whole budget, so exports arriving meanwhile are refused.
    let (_d, b) = start(&[
        "--otlp-create-topics",
        "true",
        "--otlp-topic-partitions",
        "2",
        "--otlp-buffer-bytes",
        "1",
    ]);
    let addr = b.otlp_http.unwrap();
    let busy = Arc::new(AtomicU64::new(0));
    const THREADS: u64 = 8;
    const EACH: u64 = 100;
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let busy = busy.clone();
            std::thread::spawn(move || {
                for i in 0..EACH {
                    let n = t * EACH + i;
                    loop {
                        let (status, head) =
                            try_export(addr, &numbered_span(n)).expect("the broker answers");
                        match status {
                            200 => break,
                            429 => {
                                assert!(head.contains("retry-after: 1"), "{head}");
                                busy.fetch_add(1, Ordering::Relaxed);
                            }
                            s => panic!("export {n}: {s}: {head}"),
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        busy.load(Ordering::Relaxed) > 0,
        "no export was ever refused for a full buffer"
    );
    assert_eq!(
        crate::common::metric(b.metrics, "weir_otlp_retry_later_total"),
        busy.load(Ordering::Relaxed) as f64
    );
    let counts = span_counts(&b, (THREADS * EACH) as usize);
    assert_eq!(counts.len() as u64, THREADS * EACH, "every export arrived");
    assert!(
        counts.values().all(|&c| c == 1),
        "a refused export was written"
    );
    b.stop();
}

#[test]
fn otlp_connections_count_against_the_core_connection_limit() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_otlp(
        dir.path(),
        1,
        &[
            "--otlp-create-topics",
            "true",
            "--max-connections-per-core",
            "1",
        ],
    );
    let addr = b.otlp_http.unwrap();
    let good = one_span(&[3; 16]);
    // A keep-alive connection, served: it holds the core's one slot.
    let mut held = TcpStream::connect(addr).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        held,
        "POST /v1/traces HTTP/1.1\r\nHost: weir\r\n{PROTOBUF}\r\nContent-Length: {}\r\n\r\n",
        good.len()
    )
    .unwrap();
    held.write_all(&good).unwrap();
    let mut buf = [0u8; 12];
    held.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");
    // Another is closed at once.
    let mut refused = TcpStream::connect(addr).unwrap();
    refused
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let _ = refused.write_all(b"POST /v1/traces HTTP/1.1\r\n");
    let mut rest = Vec::new();
    let _ = refused.read_to_end(&mut rest);
    assert!(rest.is_empty(), "no answer on a refused connection");
    // Once the first closes, exports are served again.
    drop(held);
    crate::common::wait_until(
        std::time::Instant::now() + Duration::from_secs(20),
        "the slot is given back",
        || matches!(try_export(addr, &good), Some((200, _))),
    );
    b.stop();
}

/// `weir acl add` `operation` on `topic` for `principal` (through the
/// native listener's super user), then waits until `allowed` holds.
fn grant(
    b: &crate::common::Node,
    principal: &str,
    (operation, topic): (&str, &str),
    allowed: impl FnMut() -> bool,
) {
    let args = [
        "acl",
        "add",
        "--principal",
        principal,
        "--operation",
        operation,
        "--topic",
        topic,
    ];
    let out = crate::common::weir_at(b.listen, &args, b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    crate::common::wait_until(
        std::time::Instant::now() + Duration::from_secs(20),
        format!("{principal} may {operation} {topic}"),
        allowed,
    );
}

#[test]
fn a_bearer_token_names_the_principal_the_acls_hold_to() {
    let dir = tempfile::tempdir().unwrap();
    let (signing, jwk) = crate::oauth::key("k1");
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, format!(r#"{{"keys":[{jwk}]}}"#)).unwrap();
    let b = Broker::start_otlp(
        dir.path(),
        1,
        &[
            "--otlp-create-topics",
            "true",
            "--sasl-oauthbearer-jwks-file",
            jwks.to_str().unwrap(),
            "--sasl-oauthbearer-expected-issuer",
            "https://idp.test",
            "--sasl-oauthbearer-expected-audience",
            "weir",
            "--authorizer",
            "acl",
            "--super-users",
            "User:ANONYMOUS",
        ],
    );
    let addr = b.otlp_http.unwrap();
    let good = one_span(&[4; 16]);
    let post = |auth: &str| {
        http(
            addr,
            &format!("POST /v1/traces HTTP/1.1\r\n{PROTOBUF}{auth}"),
            &good,
        )
    };
    // No token: the connection's principal (here the super user).
    assert_eq!(post("").0, 200);
    let agent = crate::oauth::token(&signing, "k1", "agent-7", 300);
    let bearer = format!("\r\nAuthorization: Bearer {agent}");
    let (status, h, body) = post(&bearer);
    assert_eq!(status, 403, "{h}");
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("User:agent-7 may not Write topic `otlp_spans`"),
        "{text}"
    );
    let (status, _, body) = post("\r\nAuthorization: Bearer not.a.token");
    assert_eq!(status, 401, "{}", String::from_utf8_lossy(&body));
    let expired = crate::oauth::token(&signing, "k1", "agent-7", -600);
    assert_eq!(post(&format!("\r\nAuthorization: Bearer {expired}")).0, 401);
    grant(&b, "User:agent-7", ("Write", "otlp_spans"), || {
        post(&bearer).0 == 200
    });
    assert_eq!(
        end_offset(&b, "otlp_spans"),
        Some(2),
        "the refused exports wrote nothing"
    );
    // A missing topic is created for a principal that may create it
    // (Create on the topic or the cluster), as Kafka's auto-creation.
    let mut log = Vec::new();
    put_nested(&mut log, 1, |rl| {
        put_nested(rl, 2, |sl| put_nested(sl, 2, |r| put_len(r, 3, b"INFO")))
    });
    let post_log = || {
        let head = format!("POST /v1/logs HTTP/1.1\r\n{PROTOBUF}{bearer}");
        http(addr, &head, &log)
    };
    grant(&b, "User:agent-7", ("Write", "otlp_logs"), || {
        let (status, _, body) = post_log();
        status == 403 && String::from_utf8_lossy(&body).contains("may not Create topic `otlp_logs`")
    });
    assert_eq!(end_offset(&b, "otlp_logs"), None, "not created");
    grant(&b, "User:agent-7", ("Create", "otlp_logs"), || {
        post_log().0 == 200
    });
    assert_eq!(end_offset(&b, "otlp_logs"), Some(1));
    b.stop();
}

#[test]
fn a_client_certificate_over_tls_names_the_otlp_principal() {
    let dir = tempfile::tempdir().unwrap();
    let pki = crate::tls::Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign("server", "weir", true);
    let (agent_cert, agent_key) = pki.sign("agent", "Agent-7", false);
    let ca = pki.ca("ca");
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let b = crate::common::Node::builder(env!("CARGO_BIN_EXE_weir"))
        .data_dir(dir.path().join("data"))
        .cores(1)
        .otlp_listen("off", "SSL://127.0.0.1:0")
        .args([
            "--otlp-create-topics",
            "true",
            "--ssl-certificate-file",
            &path(&cert),
            "--ssl-key-file",
            &path(&key),
            "--ssl-ca-file",
            &path(&ca),
            "--ssl-client-auth",
            "required",
            "--ssl-principal-mapping-rules",
            "RULE:^CN=(.*?)$/$1/L, DEFAULT",
            "--authorizer",
            "acl",
            "--super-users",
            "User:ANONYMOUS",
        ])
        .start();
    let url = format!("https://{}/v1/traces", b.otlp_http.unwrap());
    let span = dir.path().join("span.bin");
    std::fs::write(&span, one_span(&[5; 16])).unwrap();
    // curl over TLS, with or without the client certificate: the HTTP
    // status ("000" when the handshake fails).
    let post = |with_cert: bool| {
        let mut c = crate::common::client_program("curl");
        c.args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--cacert",
            &path(&ca),
        ]);
        if with_cert {
            c.args(["--cert", &path(&agent_cert), "--key", &path(&agent_key)]);
        }
        c.args([
            "-H",
            "Content-Type: application/x-protobuf",
            "--data-binary",
        ])
        .arg(format!("@{}", path(&span)))
        .arg(&url);
        String::from_utf8(c.output().unwrap().stdout).unwrap()
    };
    assert_eq!(post(false), "000", "a required certificate");
    assert_eq!(post(true), "403", "User:agent-7 may not write yet");
    // The topic is missing: created by the export, which needs Create
    // (the Write grant below waits until both hold).
    grant(&b, "User:agent-7", ("Create", "otlp_spans"), || true);
    grant(&b, "User:agent-7", ("Write", "otlp_spans"), || {
        post(true) == "200"
    });
    b.stop();
}

#[test]
fn a_principal_over_its_produce_quota_is_told_to_retry_later() {
    let (_d, b) = start(&["--otlp-create-topics", "true"]);
    let addr = b.otlp_http.unwrap();
    // A 30 KB span: three seconds of a 10 KB/s budget.
    let mut big = Vec::new();
    put_nested(&mut big, 1, |rs| {
        put_nested(rs, 2, |ss| {
            put_nested(ss, 2, |span| {
                put_len(span, 1, &[6; 16]);
                put_len(span, 2, &[6; 8]);
                put_len(span, 5, &vec![b'x'; 30_000]);
            })
        })
    });
    let out = crate::common::weir_at(
        b.listen,
        &[
            "quota",
            "set",
            "--user",
            "ANONYMOUS",
            "producer_byte_rate=10000",
        ],
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Once the quota applies, an export runs the budget into debt and the
    // next is answered 429 with the wait.
    let mut written = 0;
    let head = crate::common::wait_until(
        std::time::Instant::now() + Duration::from_secs(20),
        "an export refused over the quota",
        || match try_export(addr, &big) {
            Some((200, _)) => {
                written += 1;
                None
            }
            Some((429, head)) => Some(head),
            other => panic!("{other:?}"),
        },
    );
    assert!(head.contains("retry-after: "), "{head}");
    let wait: u64 = head
        .split("retry-after: ")
        .nth(1)
        .and_then(|r| r.lines().next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap();
    assert!((1..=4).contains(&wait), "Retry-After {wait}");
    assert!(head.contains("over its producer_byte_rate quota"), "{head}");
    // Retried after the wait, it is taken.
    crate::common::wait_until(
        std::time::Instant::now() + Duration::from_secs(30),
        "the retried export is taken",
        || matches!(try_export(addr, &big), Some((200, _))),
    );
    written += 1;
    assert_eq!(
        crate::common::metric(b.metrics, "weir_otlp_exports_total"),
        written as f64
    );
    assert_eq!(
        end_offset(&b, "otlp_spans"),
        Some(written),
        "refused exports wrote nothing"
    );
    b.stop();
}
