//! Unchanged Kafka clients against Weir's Kafka listener: Debian's `kcat`
//! (librdkafka 2.0), and from PyPI, pinned, `confluent-kafka` (librdkafka
//! 2.16), `kafka-python` and `aiokafka` (`broker/tests/kafka/clients.py`
//! drives each). `bash .ci/kafka-clients` installs them (`.ci/run` does);
//! these tests fail with that advice when they are missing.
//!
//! Each client creates a topic of 4 partitions, produces 10 000 keyed
//! records with acks=all (with its default idempotence and with it on),
//! reads them back exactly once in per-key order on their murmur2
//! partitions, runs a group of two that splits the partitions, commits and
//! hands over without loss, and looks offsets up by time. Records cross
//! between the Weir SDK and Kafka clients both ways.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::{runtime, Broker};
use weir_client::{Acks, Client, Consumer, ConsumerConfig, OffsetSpec};
use weir_proto::batch::Compression;
use weir_proto::reader::RecordBatch;

/// Runs `broker/tests/kafka/<script>` with the pinned Python clients and
/// `args`; its stdout, once it exited successfully (else the test fails
/// with both outputs).
pub(crate) fn python_script(script: &str, args: &[&str]) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/kafka")
        .join(script);
    let out = common::client_program(python())
        .arg(path)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{script}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

pub(crate) fn python() -> PathBuf {
    let p = std::env::var_os("WEIR_KAFKA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/kafka-venv/bin/python")
        });
    assert!(
        p.exists(),
        "{} is missing: run `bash .ci/kafka-clients` (installs kcat and the pinned Python Kafka \
         clients), or set WEIR_KAFKA_PYTHON",
        p.display()
    );
    p
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/clients.py")
}

fn start() -> (tempfile::TempDir, Broker) {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &["--group-initial-rebalance-delay-ms", "0"]);
    (dir, b)
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("the client runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn client_run(b: &Broker, client: &str, prefix: &str, idempotence: &str) -> String {
    client_run_with(b, client, prefix, idempotence, &[])
}

/// [`client_run`] with more arguments to the script (`no-group`).
fn client_run_with(
    b: &Broker,
    client: &str,
    prefix: &str,
    idempotence: &str,
    more: &[&str],
) -> String {
    let out = run_ok(
        common::client_program(python())
            .arg(script())
            .args([client, &b.kafka.to_string(), prefix, idempotence])
            .args(more),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(stdout.contains("\"ok\": true"), "{stdout}");
    stdout
}

/// Every record of a topic, read with the Weir SDK: (partition, key, value).
fn sdk_read(
    b: &Broker,
    topic: &str,
    partitions: u32,
    expect: usize,
) -> Vec<(u32, Vec<u8>, Vec<u8>)> {
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        let mut config = ConsumerConfig::default();
        config.auto_offset_reset = weir_client::OffsetReset::Earliest;
        let mut consumer = Consumer::new(c, config);
        consumer.assign((0..partitions).map(|p| (topic.to_string(), p)).collect());
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while out.len() < expect && std::time::Instant::now() < deadline {
            for r in consumer
                .poll(std::time::Duration::from_millis(200))
                .await
                .unwrap()
            {
                out.push((
                    r.partition,
                    r.key.map(|k| k.to_vec()).unwrap_or_default(),
                    r.value.map(|v| v.to_vec()).unwrap_or_default(),
                ));
            }
        }
        out
    })
}

#[test]
fn confluent_kafka_round_trips_groups_and_offsets_and_the_sdk_reads_its_records() {
    let (_dir, b) = start();
    client_run(&b, "confluent", "ck-default", "default");
    client_run(&b, "confluent", "ck-idem", "on");
    // Records produced by librdkafka are read by the Weir SDK, keys intact.
    let got = sdk_read(&b, "ck-idem-records", 4, 10_000);
    assert_eq!(got.len(), 10_000);
    let mut values: Vec<u64> = got
        .iter()
        .map(|(_, _, v)| String::from_utf8_lossy(v).parse().unwrap())
        .collect();
    values.sort_unstable();
    assert_eq!(values, (0..10_000).collect::<Vec<u64>>());
    assert!(got.iter().all(|(_, k, v)| k
        == format!(
            "k{}",
            String::from_utf8_lossy(v).parse::<u64>().unwrap() % 100
        )
        .as_bytes()));
    b.stop();
}

/// librdkafka's KIP-848 consumer (`group.protocol=consumer`) on the
/// coordinator's consumer groups: member epochs, server-side assignment,
/// revocation before reassignment, commits with the member epoch.
#[test]
fn confluent_kafka_kip848_consumers_share_a_group_with_server_side_assignment() {
    let (_dir, b) = start();
    client_run(&b, "confluent-kip848", "k848", "on");
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        let d = c.describe_group("k848-records-group").await.unwrap();
        assert_eq!(d.kind, "consumer", "{d:?}");
        assert!(d.generation >= 2, "{d:?}");
    });
    b.stop();
}

#[test]
fn kafka_python_round_trips_groups_and_offsets() {
    let (_dir, b) = start();
    client_run(&b, "kafka-python", "kp-default", "default");
    // The group phase once: it does not depend on the producer's
    // idempotence, and kafka-python's takes ~20 s.
    client_run_with(&b, "kafka-python", "kp-idem", "on", &["no-group"]);
    b.stop();
}

#[test]
fn aiokafka_round_trips_groups_and_offsets() {
    let (_dir, b) = start();
    client_run(&b, "aiokafka", "ak-default", "default");
    client_run(&b, "aiokafka", "ak-idem", "on");
    b.stop();
}

#[test]
fn librdkafka_compression_codecs_are_stored_and_served_as_they_are() {
    let (_dir, b) = start();
    let out = run_ok(common::client_program(python()).arg(script()).args([
        "compression",
        &b.kafka.to_string(),
        "cc",
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for codec in ["lz4", "zstd", "gzip", "snappy"] {
        assert!(stdout.contains(&format!("\"{codec}\": 1000")), "{stdout}");
    }
    // The Weir SDK decodes all four from those batches.
    for codec in ["lz4", "zstd", "gzip", "snappy"] {
        assert_eq!(
            sdk_read(&b, &format!("cc-{codec}"), 4, 1000).len(),
            1000,
            "{codec}"
        );
    }
    b.stop();
}

/// librdkafka's admin API: DeleteRecords, DescribeConsumerGroups of a
/// KIP-848 and a classic group, IncrementalAlterConfigs' four operations.
#[test]
fn librdkafka_admin_deletes_records_describes_both_group_kinds_and_alters_configs() {
    let (_dir, b) = start();
    let out = run_ok(common::client_program(python()).arg(script()).args([
        "admin",
        &b.kafka.to_string(),
        "adm",
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\"ok\": true"), "{stdout}");
    // What DeleteRecords did is what the native protocol sees.
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        let start = c.list_offsets("adm-deleted", 0, OffsetSpec::Earliest);
        let end = c.list_offsets("adm-deleted", 0, OffsetSpec::Latest);
        assert_eq!(
            (start.await.unwrap(), end.await.unwrap()),
            (Some(40), Some(100))
        );
    });
    b.stop();
}

fn kcat(b: &Broker, args: &[&str], stdin: &[u8]) -> String {
    let out = common::kcat(b.kafka, args, stdin);
    assert!(
        out.status.success(),
        "kcat {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn kcat_lists_produces_consumes_and_joins_a_group_and_reads_sdk_records() {
    let (_dir, b) = start();
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        c.create_topic("kc", 4, vec![]).await.unwrap();
        // Records from the Weir SDK, for kcat to read.
        let batch = common::records_batch("sdk", 50, 1_700_000_000_000);
        c.produce("kc", 3, batch.freeze(), Acks::All).await.unwrap();
    });
    let meta = kcat(&b, &["-L"], b"");
    // Each core is a broker (its own Kafka port) leading the partitions it
    // owns; the 4 partitions spread over both cores.
    assert!(meta.contains("2 brokers:"), "{meta}");
    assert!(
        meta.contains("leader 0,") && meta.contains("leader 1,"),
        "{meta}"
    );
    assert!(meta.contains("topic \"kc\" with 4 partitions"), "{meta}");
    // Internal topics are listed, as Kafka lists them (marked internal).
    assert!(meta.contains("topic \"__consumer_offsets\""), "{meta}");
    let lines: String = (0..200)
        .map(|i| format!("key{}:value{i}\n", i % 10))
        .collect();
    kcat(&b, &["-t", "kc", "-P", "-K:"], lines.as_bytes());
    let read = kcat(&b, &["-t", "kc", "-C", "-e", "-f", "%p %k %s\n"], b"");
    let rows: Vec<&str> = read.lines().collect();
    assert_eq!(rows.len(), 250, "{read}");
    assert_eq!(rows.iter().filter(|r| r.contains(" value")).count(), 200);
    assert_eq!(
        rows.iter()
            .filter(|r| r.starts_with("3 ") && r.contains("sdk-"))
            .count(),
        50
    );
    // A group (classic protocol) reads everything and commits on exit.
    let grouped = kcat(
        &b,
        &[
            "-G",
            "kc-group",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%p %o\n",
            "kc",
        ],
        b"",
    );
    assert_eq!(grouped.lines().count(), 250, "{grouped}");
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        let committed = c.committed_offsets("kc-group", None).await.unwrap();
        let total: u64 = committed.iter().map(|o| o.offset).sum();
        assert_eq!(total, 250, "{committed:?}");
        let d = c.describe_group("kc-group").await.unwrap();
        assert_eq!(d.kind, "classic");
    });
    b.stop();
}

/// The codec of every batch stored in a topic's partitions, and their
/// bytes (as fetched: as stored).
fn stored_batches(b: &Broker, topic: &str, partitions: u32) -> (Vec<Compression>, usize) {
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        let (mut codecs, mut bytes) = (Vec::new(), 0);
        for p in 0..partitions {
            let mut at = 0;
            loop {
                let f = c.fetch(topic, p, at, 1 << 20, 0).await.unwrap();
                for batch in &f.batches {
                    let rb = RecordBatch::parse(batch).unwrap();
                    codecs.push(rb.compression());
                    bytes += batch.len();
                }
                match f.next_offset() {
                    Some(next) if next < f.high_watermark => at = next,
                    _ => break,
                }
            }
        }
        (codecs, bytes)
    })
}

/// Debian 12's kcat runs on librdkafka 2.0.2, which compresses with gzip,
/// snappy and lz4 only if the broker advertises Produce v0 (librdkafka
/// issue 4956, KAFKA-18659); else it sends every batch uncompressed,
/// silently. The stored batches carry the codec asked for, within 2× the
/// bytes confluent-kafka's batches of the same records take.
#[test]
fn old_librdkafka_compresses_with_gzip_snappy_and_lz4() {
    let (_dir, b) = start();
    // confluent-kafka (librdkafka 2.16) writes `cc-<codec>`: key k<i>,
    // value v<i> ten times, i < 1000.
    run_ok(common::client_program(python()).arg(script()).args([
        "compression",
        &b.kafka.to_string(),
        "cc",
    ]));
    let lines: String = (0..1000)
        .map(|i| format!("k{i}:{}\n", format!("v{i}").repeat(10)))
        .collect();
    for (codec, want) in [
        ("gzip", Compression::Gzip),
        ("snappy", Compression::Snappy),
        ("lz4", Compression::Lz4),
    ] {
        let topic = format!("kz-{codec}");
        runtime().block_on(async {
            let c = Client::connect(b.listen).await.unwrap();
            c.create_topic(&topic, 4, vec![]).await.unwrap();
        });
        kcat(
            &b,
            &["-t", &topic, "-P", "-K:", "-z", codec],
            lines.as_bytes(),
        );
        let (codecs, bytes) = stored_batches(&b, &topic, 4);
        assert!(!codecs.is_empty(), "{codec}: nothing stored");
        assert!(
            codecs.iter().all(|c| *c == want),
            "{codec}: stored codecs {codecs:?}"
        );
        let (_, theirs) = stored_batches(&b, &format!("cc-{codec}"), 4);
        assert!(
            bytes <= 2 * theirs,
            "{codec}: kcat's batches take {bytes} bytes, confluent-kafka's {theirs}"
        );
        let read = kcat(&b, &["-t", &topic, "-C", "-e", "-f", "%k:%s\n"], b"");
        let mut got: Vec<&str> = read.lines().collect();
        let mut sent: Vec<&str> = lines.lines().collect();
        got.sort_unstable();
        sent.sort_unstable();
        assert_eq!(got, sent, "{codec}");
    }
    b.stop();
}

/// Every record of `__consumer_offsets` decodes with Kafka's own schemas
/// (an independent decoder in `clients.py`, written from Kafka's JSON
/// message definitions): a classic group's committed offsets, metadata and
/// commit timestamps read back exactly, its group record as Kafka's
/// `GroupMetadataValue`, and nothing in a record type Kafka would misread.
#[test]
fn consumer_offsets_reads_as_kafkas_format() {
    let (_dir, b) = start();
    let out = run_ok(common::client_program(python()).arg(script()).args([
        "offsets-topic",
        &b.kafka.to_string(),
        "ot",
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\"ok\": true"), "{stdout}");
    assert!(stdout.contains("\"metadata\": \"meta-0"), "{stdout}");
    b.stop();
}
