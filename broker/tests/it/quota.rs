//! Client quotas: set, listed and removed with `weir quota` and Kafka's
//! AlterClientQuotas / DescribeClientQuotas, refused with a clear error
//! when Kafka would refuse them, kept across a restart; and enforced — a
//! librdkafka producer under a 10 MB/s quota is held to it while another
//! principal on the same node is not slowed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use weir_testkit::Node;

use crate::common;
use crate::sasl::{add_user, start_with, PASSWORD};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.into())
}

/// One request (v0, header v1) and its answer's body.
fn kafka_call<Req: Encodable>(node: &Node, key: i16, req: &Req) -> Bytes {
    let mut body = BytesMut::new();
    req.encode(&mut body, 0).unwrap();
    let mut c = TcpStream::connect(node.kafka).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.write_all(&common::kafka_frame(key, 0, 7, &body)).unwrap();
    let mut size = [0u8; 4];
    c.read_exact(&mut size).unwrap();
    let mut b = vec![0u8; i32::from_be_bytes(size) as usize];
    c.read_exact(&mut b).unwrap();
    Bytes::from(b).slice(4..)
}

fn kafka_alter(node: &Node, user: &str, key: &str, value: f64) -> AlterClientQuotasResponse {
    let mut e = EntityData::default();
    e.entity_type = s("user");
    e.entity_name = Some(s(user));
    let mut op = OpData::default();
    op.key = s(key);
    op.value = value;
    let mut entry = EntryData::default();
    entry.entity = vec![e];
    entry.ops = vec![op];
    let mut r = AlterClientQuotasRequest::default();
    r.entries = vec![entry];
    AlterClientQuotasResponse::decode(&mut kafka_call(node, 49, &r), 0).unwrap()
}

fn kafka_describe(node: &Node) -> Vec<(String, String, f64)> {
    let mut c = ComponentData::default();
    c.entity_type = s("user");
    c.match_type = 2;
    let mut r = DescribeClientQuotasRequest::default();
    r.components = vec![c];
    let resp = DescribeClientQuotasResponse::decode(&mut kafka_call(node, 48, &r), 0).unwrap();
    assert_eq!(resp.error_code, 0, "{:?}", resp.error_message);
    let mut out = Vec::new();
    for e in resp.entries.unwrap_or_default() {
        let who = e.entity[0]
            .entity_name
            .as_ref()
            .map_or("<default>".to_string(), |n| n.to_string());
        for v in e.values {
            out.push((who.clone(), v.key.to_string(), v.value));
        }
    }
    out
}

fn weir(node: &Node, args: &[&str]) -> (bool, String) {
    let out = common::weir_at(node.listen, args, b"");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `weir quota set ARGS…`, which must succeed.
fn quota_set(node: &Node, args: &[&str]) {
    let all: Vec<&str> = ["quota", "set"].iter().chain(args).copied().collect();
    let (ok, text) = weir(node, &all);
    assert!(ok, "weir {all:?}: {text}");
}

fn plain(dir: &std::path::Path) -> Node {
    start_with(dir, "PLAINTEXT://127.0.0.1:0", None, 10_000, "")
}

#[test]
fn quotas_are_set_listed_removed_refused_and_kept_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = plain(dir.path());
    // The CLI and Kafka's API change the same quotas.
    quota_set(&node, &["--user", "agent", "producer_byte_rate=10485760"]);
    let r = kafka_alter(&node, "reader", "consumer_byte_rate", 2048.0);
    assert_eq!(
        r.entries[0].error_code, 0,
        "{:?}",
        r.entries[0].error_message
    );
    quota_set(&node, &["--default-user", "request_percentage=50"]);
    let mut seen = kafka_describe(&node);
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        seen,
        vec![
            ("<default>".into(), "request_percentage".into(), 50.0),
            ("agent".into(), "producer_byte_rate".into(), 10485760.0),
            ("reader".into(), "consumer_byte_rate".into(), 2048.0),
        ]
    );
    // What Kafka refuses is refused, with what is wrong, and changes nothing.
    let r = kafka_alter(&node, "agent", "controller_mutation_rate", 1.0);
    assert_eq!(r.entries[0].error_code, 42, "INVALID_REQUEST");
    let message = r.entries[0].error_message.as_ref().unwrap().to_string();
    assert!(message.contains("not supported"), "{message}");
    let r = kafka_alter(&node, "agent", "producer_byte_rate", -5.0);
    assert_eq!(r.entries[0].error_code, 42);
    let (ok, text) = weir(
        &node,
        &["quota", "set", "--user", "agent", "producer_byte_rate=fast"],
    );
    assert!(!ok && text.contains("not a number"), "{text}");
    let (ok, text) = weir(&node, &["quota", "set", "producer_byte_rate=1"]);
    assert!(!ok && text.contains("--user"), "{text}");
    assert_eq!(kafka_describe(&node).len(), 3);
    // Removed by key, and the entity goes with its last value.
    let (ok, text) = weir(&node, &["quota", "remove", "--user", "reader"]);
    assert!(ok, "{text}");
    let (ok, list) = weir(&node, &["quota", "list"]);
    assert!(ok, "{list}");
    assert!(
        list.contains("agent") && list.contains("10485760"),
        "{list}"
    );
    assert!(
        list.contains("<default>") && !list.contains("reader"),
        "{list}"
    );
    // Kept across a restart.
    node.stop();
    let node = plain(dir.path());
    let (ok, after) = weir(&node, &["quota", "list"]);
    assert!(ok, "{after}");
    assert_eq!(after, list);
}

/// The acceptance figure: a producer principal under a 10 MB/s quota is
/// held within ±10 % over 30 s (`WEIR_QUOTA_SECONDS`), librdkafka backing
/// off as the broker throttles it, while another principal producing on
/// the same node at the same time is not slowed (it gets more than twice
/// the capped rate, and is never throttled).
#[test]
fn a_producer_principal_is_held_to_its_quota_while_another_is_not_slowed() {
    const RATE: f64 = 10.0 * 1024.0 * 1024.0;
    let seconds: f64 = std::env::var("WEIR_QUOTA_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30.0);
    let dir = tempfile::tempdir().unwrap();
    let node = start_with(dir.path(), "SASL_PLAINTEXT://127.0.0.1:0", None, 10_000, "");
    add_user(&node, dir.path(), "capped");
    add_user(&node, dir.path(), "free");
    let mut native = common::Client::connect(node.listen);
    assert_eq!(native.create_topic("telemetry", 2, &[]).error, 0);
    quota_set(
        &node,
        &["--user", "capped", &format!("producer_byte_rate={RATE}")],
    );
    let stdout = crate::kafka_clients::python_script(
        "quota.py",
        &[
            &node.kafka.to_string(),
            "telemetry",
            "capped",
            "free",
            PASSWORD,
            &seconds.to_string(),
            // The other principal: 256 MiB as fast as it can.
            "256",
        ],
    );
    let field = |who: &str, key: &str| -> f64 {
        // {"capped": {"bytes": …, "rate": …, "max_throttle_ms": …}, …}
        let at = stdout.find(&format!("\"{who}\": {{")).expect(who);
        let rest = &stdout[at..];
        let k = rest.find(&format!("\"{key}\": ")).expect(key) + key.len() + 4;
        let end = rest[k..].find([',', '}']).unwrap();
        rest[k..k + end].trim().parse().unwrap()
    };
    let capped = field("capped", "rate");
    let free = field("free", "rate");
    eprintln!(
        "capped {:.2} MiB/s (quota 10), free {:.2} MiB/s: {stdout}",
        capped / 1048576.0,
        free / 1048576.0
    );
    assert!(
        (capped - RATE).abs() <= RATE * 0.10,
        "the capped producer ran at {:.2} MiB/s under a 10 MiB/s quota: {stdout}",
        capped / 1048576.0
    );
    assert!(
        free > 2.0 * RATE,
        "the producer without a quota ran at only {:.2} MiB/s: {stdout}",
        free / 1048576.0
    );
    assert_eq!(field("free", "max_throttle_ms"), 0.0, "{stdout}");
    assert!(field("capped", "max_throttle_ms") > 0.0, "{stdout}");
    // The broker's account: throttled time for the capped user only.
    let text = common::scrape(node.metrics);
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("weir_quota_throttle_seconds_total{kind=\"produce\",user=\"capped\"")
        })
        .unwrap_or_else(|| panic!("no throttle metric for capped:\n{text}"));
    assert!(!line.ends_with(" 0"), "{line}");
    assert!(!text.contains("user=\"free\""), "{text}");
}

/// A fetch quota on a client id: kcat reading 6 MiB under 2 MiB/s takes
/// at least the debt beyond its one-second burst (2 s), and the broker
/// counts the throttling against that client id; the same read under
/// another client id is not throttled.
#[test]
fn a_consumer_client_id_is_held_to_its_fetch_quota() {
    const RATE: u64 = 2 * 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let node = plain(dir.path());
    let mut native = common::Client::connect(node.listen);
    assert_eq!(native.create_topic("metrics", 1, &[]).error, 0);
    // 6 MiB in 1536 records of 4 KiB.
    let line = format!("{}\n", "m".repeat(4095));
    let lines = line.repeat(1536);
    let out = common::kcat(node.kafka, &["-t", "metrics", "-P"], lines.as_bytes());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    quota_set(
        &node,
        &["--client-id", "slow", &format!("consumer_byte_rate={RATE}")],
    );
    let read = |client_id: &str| {
        let t0 = std::time::Instant::now();
        let out = common::kcat(
            node.kafka,
            &[
                "-t",
                "metrics",
                "-C",
                "-e",
                "-q",
                "-X",
                &format!("client.id={client_id}"),
            ],
            b"",
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout.len(), lines.len(), "every record read");
        t0.elapsed()
    };
    let slow = read("slow");
    assert!(
        slow >= Duration::from_millis(1800),
        "6 MiB under a 2 MiB/s fetch quota read in {slow:?}"
    );
    let text = common::scrape(node.metrics);
    let line = text
        .lines()
        .find(|l| {
            l.starts_with(
                "weir_quota_throttle_seconds_total{kind=\"fetch\",user=\"\",client_id=\"slow\"",
            )
        })
        .unwrap_or_else(|| panic!("no fetch throttle metric for client id slow:\n{text}"));
    assert!(!line.ends_with(" 0"), "{line}");
    read("fast");
    assert!(!common::scrape(node.metrics).contains("client_id=\"fast\""));
}

/// The native protocol is held to quotas too: its answers carry no
/// throttle field, so the connection is muted. An SDK producer (the
/// anonymous principal of a plaintext listener) writing 6 MiB under a
/// 2 MiB/s user quota takes at least its debt's time, and every batch is
/// acknowledged.
#[test]
fn an_sdk_producer_is_muted_to_its_user_quota() {
    use weir_client::{Acks, Client};

    const RATE: u64 = 2 * 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let node = plain(dir.path());
    quota_set(
        &node,
        &["--user", "ANONYMOUS", &format!("producer_byte_rate={RATE}")],
    );
    common::runtime().block_on(async {
        let c = Client::connect(node.listen).await.unwrap();
        c.create_topic("muted", 1, vec![]).await.unwrap();
        let t0 = std::time::Instant::now();
        let mut bytes = 0;
        let mut batches = 0;
        while bytes < 6 * 1024 * 1024 {
            let batch = common::records_batch(&"v".repeat(1024), 64, 1_700_000_000_000);
            bytes += batch.len();
            c.produce("muted", 0, batch.freeze(), Acks::Leader)
                .await
                .unwrap();
            batches += 1;
        }
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(1800),
            "{bytes} bytes in {batches} batches under a 2 MiB/s quota took {took:?}"
        );
    });
}
