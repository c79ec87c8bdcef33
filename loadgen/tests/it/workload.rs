//! The workload model: shipped files, parse errors, semantic checks,
//! overrides and round trips.

use std::path::{Path, PathBuf};
use std::time::Duration;

use weir_loadgen::workload::{DriverSettings, KeyDistributor, Workload, WorkloadError};

const BASE: &str = "\
name: test
topics: 1
partitionsPerTopic: 16
messageSize: 1024
producersPerTopic: 1
subscriptionsPerTopic: 1
consumerPerSubscription: 1
producerRate: 50000
testDurationMinutes: 1
";

fn base() -> Workload {
    Workload::from_yaml(BASE).unwrap()
}

fn workloads_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads")
}

fn shipped() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(workloads_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// The error message of parsing `yaml`, in full.
fn parse_err(yaml: &str) -> String {
    format!("{:#}", Workload::from_yaml(yaml).unwrap_err())
}

/// `BASE` with the line starting `key:` replaced by `line` (or `line`
/// appended if there is none).
fn with(key: &str, line: &str) -> String {
    let mut found = false;
    let mut out: Vec<String> = BASE
        .lines()
        .map(|l| {
            if l.starts_with(&format!("{key}:")) {
                found = true;
                line.to_string()
            } else {
                l.to_string()
            }
        })
        .collect();
    if !found {
        out.push(line.to_string());
    }
    out.join("\n") + "\n"
}

fn without(key: &str) -> String {
    BASE.lines()
        .filter(|l| !l.starts_with(&format!("{key}:")))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn every_shipped_workload_loads_and_validates() {
    let files = shipped();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "1-topic-1-partition-1kb.yaml",
            "1-topic-100-partitions-1kb-4p-4c-500k.yaml",
            "1-topic-16-partitions-1kb.yaml",
            "backlog-1-topic-1-partition-1000b-2gb.yaml",
            "backlog-1-topic-1-partition-1000b-cached.yaml",
            "backlog-1-topic-16-partitions-1kb.yaml",
            "latency-1-topic-1-partition-1000b-200k-linger1.yaml",
            "latency-1-topic-1-partition-1000b-50mbs.yaml",
            "latency-1-topic-1-partition-1000b-linger0.yaml",
            "max-rate-1-topic-1-partition-1000b.yaml",
            "max-rate-1-topic-1-partition-100b.yaml",
            "max-rate-1-topic-16-partitions-100b.yaml",
            "share-1-topic-2-partitions-1kb.yaml",
            "tiered-backlog-1-topic-1-partition-1000b-2gb.yaml",
            "transactions-1-topic-16-partitions-1kb.yaml",
        ]
    );
    for path in &files {
        let w = Workload::load(path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
        w.validate().unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        assert!(
            text.starts_with("# "),
            "{}: starts with a comment saying what it is",
            path.display()
        );
        assert_eq!(w.duration(), Duration::from_secs(60), "{}", path.display());
        assert_eq!(w.warmup(), Duration::from_secs(15), "{}", path.display());
        for t in w.topic_names() {
            weir_broker::metadata::validate_name(&t).unwrap();
        }
        if text.starts_with("# OMB workload") {
            // OMB's own workloads, scaled to this machine, with Weir's
            // default driver settings.
            assert!(
                text.contains("Scaled"),
                "{}: says how it was scaled",
                path.display()
            );
            assert_eq!(w.driver, DriverSettings::default(), "{}", path.display());
        } else if text.contains("transactionRecords") {
            // Issue 32's transactional produce: 16 partitions as OMB's.
            assert_eq!(w.driver.transaction_records, Some(1000));
            assert_eq!(w.partitions_per_topic, 16, "{}", path.display());
        } else if text.contains("subscriptionType: share") {
            // Issue 33's share group: 8 members on 2 partitions.
            assert_eq!(
                (w.partitions_per_topic, w.consumer_per_subscription),
                (2, 8),
                "{}",
                path.display()
            );
        } else {
            // The single-partition rows of docs/benchmarks.md.
            assert_eq!(
                (w.topics, w.partitions_per_topic, w.producers_per_topic),
                (1, 1, 1),
                "{}",
                path.display()
            );
        }
    }
}

#[test]
fn shipped_workloads_have_the_documented_shape() {
    let load = |f: &str| Workload::load(&workloads_dir().join(f)).unwrap();

    let w = load("1-topic-1-partition-1kb.yaml");
    assert_eq!(
        (w.topics, w.partitions_per_topic, w.message_size),
        (1, 1, 1024)
    );
    assert_eq!(w.producer_rate, 50000.0);
    assert_eq!(w.topic_names(), ["1-topic-1-partition-1Kb-0"]);

    let w = load("1-topic-16-partitions-1kb.yaml");
    assert_eq!((w.partitions_per_topic, w.producer_rate), (16, 50000.0));

    let w = load("1-topic-100-partitions-1kb-4p-4c-500k.yaml");
    assert_eq!(w.partitions_per_topic, 100);
    assert_eq!((w.producers_per_topic, w.consumer_per_subscription), (4, 4));
    assert_eq!(w.producer_rate, 200000.0);
    assert!(w.use_randomized_payloads);
    assert_eq!((w.random_bytes_ratio, w.payload_pool_size()), (0.5, 1000));

    let w = load("backlog-1-topic-16-partitions-1kb.yaml");
    assert_eq!(w.backlog_bytes(), 4 << 30);
    assert_eq!(w.producer_rate, 100000.0);

    let w = load("max-rate-1-topic-16-partitions-100b.yaml");
    assert_eq!((w.message_size, w.producer_rate), (100, 0.0));
}

#[test]
fn defaults_of_optional_fields() {
    let w = base();
    assert!(!w.use_randomized_payloads);
    assert_eq!(w.random_bytes_ratio, 0.0);
    assert_eq!(w.randomized_payload_pool_size, 0);
    assert_eq!(w.payload_pool_size(), 1000);
    assert_eq!(w.payload_file, None);
    assert_eq!(w.key_distributor, KeyDistributor::NoKey);
    assert_eq!(w.consumer_backlog_size_gb, 0.0);
    assert_eq!(w.backlog_bytes(), 0);
    assert_eq!(w.warmup(), Duration::ZERO);
    assert_eq!(w.duration(), Duration::from_secs(60));
    let d = &w.driver;
    assert_eq!(d.acks, "all");
    assert_eq!((d.linger_ms, d.batch_size, d.max_in_flight), (5, 524288, 5));
    assert_eq!(d.compression, "none");
    assert!(d.idempotence);
    assert_eq!((d.flush_messages, d.flush_ms), (None, None));
    assert!(d.topic_configs().is_empty());
}

#[test]
fn omb_original_files_parse() {
    // OMB's own files (minus nothing we do not know): quoted enum, payload
    // file, integer rate and durations.
    let w = Workload::from_yaml(
        "name: 1 topic / 1 partition / 1Kb\n\
         topics: 1\n\
         partitionsPerTopic: 1\n\
         keyDistributor: \"NO_KEY\"\n\
         messageSize: 1024\n\
         payloadFile: \"payload/payload-1Kb.data\"\n\
         subscriptionsPerTopic: 1\n\
         consumerPerSubscription: 1\n\
         producersPerTopic: 1\n\
         producerRate: 50000\n\
         consumerBacklogSizeGB: 0\n\
         testDurationMinutes: 15\n",
    )
    .unwrap();
    assert_eq!(w.payload_file.as_deref(), Some("payload/payload-1Kb.data"));
    assert_eq!(w.duration(), Duration::from_secs(15 * 60));
    for (text, kd) in [
        ("NO_KEY", KeyDistributor::NoKey),
        ("KEY_ROUND_ROBIN", KeyDistributor::KeyRoundRobin),
        ("RANDOM_NANO", KeyDistributor::RandomNano),
    ] {
        let w = Workload::from_yaml(&with("keyDistributor", &format!("keyDistributor: {text}")))
            .unwrap();
        assert_eq!(w.key_distributor, kd);
        assert_eq!(kd.to_string(), text);
    }
}

#[test]
fn unknown_field_is_named() {
    let e = parse_err(&with("producerStartRate", "producerStartRate: 10"));
    assert!(e.starts_with("workload: "), "{e}");
    assert!(e.contains("unknown field `producerStartRate`"), "{e}");
    assert!(e.contains("line"), "{e}");

    let e = parse_err(&with("driver", "driver:\n  lingerMS: 3"));
    assert!(e.contains("unknown field `lingerMS`"), "{e}");
    assert!(e.contains("lingerMs"), "lists the valid names: {e}");
}

#[test]
fn missing_required_field_is_named() {
    for field in [
        "name",
        "topics",
        "partitionsPerTopic",
        "messageSize",
        "producersPerTopic",
        "subscriptionsPerTopic",
        "consumerPerSubscription",
        "producerRate",
        "testDurationMinutes",
    ] {
        let e = parse_err(&without(field));
        assert!(e.starts_with("workload: "), "{e}");
        assert!(
            e.contains(&format!("missing field `{field}`")),
            "{field}: {e}"
        );
    }
}

#[test]
fn wrong_type_is_named() {
    for (key, line) in [
        ("topics", "topics: many"),
        ("partitionsPerTopic", "partitionsPerTopic: -1"),
        ("producerRate", "producerRate: fast"),
        ("useRandomizedPayloads", "useRandomizedPayloads: maybe"),
        ("keyDistributor", "keyDistributor: BY_HASH"),
    ] {
        let e = parse_err(&with(key, line));
        assert!(e.starts_with("workload: "), "{e}");
        assert!(e.contains(key), "{key}: {e}");
        assert!(e.contains("line"), "{key}: {e}");
    }
    let e = parse_err(&with("driver", "driver:\n  lingerMs: soon"));
    assert!(e.contains("driver.lingerMs"), "{e}");
    let e = parse_err(&with("driver", "driver:\n  acks: [1]"));
    assert!(e.contains("driver.acks"), "{e}");
}

#[test]
fn driver_acks_accepts_yaml_numbers() {
    for (yaml, acks) in [("1", "1"), ("0", "0"), ("\"1\"", "1"), ("all", "all")] {
        let w = Workload::from_yaml(&with("driver", &format!("driver:\n  acks: {yaml}"))).unwrap();
        assert_eq!(w.driver.acks, acks);
    }
}

#[test]
fn not_yaml_and_empty_documents_are_errors() {
    assert!(parse_err("").starts_with("workload: "));
    assert!(parse_err("topics: [").starts_with("workload: "));
    assert!(parse_err("- 1\n- 2\n").starts_with("workload: "));
}

/// `BASE` with each `(key, line)` applied as [`with`] does.
fn with_all(changes: &[(&str, &str)]) -> String {
    let mut yaml = BASE.to_string();
    for (key, line) in changes {
        let mut found = false;
        let mut out: Vec<String> = yaml
            .lines()
            .map(|l| {
                if l.starts_with(&format!("{key}:")) {
                    found = true;
                    line.to_string()
                } else {
                    l.to_string()
                }
            })
            .collect();
        if !found {
            out.push(line.to_string());
        }
        yaml = out.join("\n") + "\n";
    }
    yaml
}

/// Each semantic rule: the offending YAML and the field the error names.
#[test]
fn each_semantic_check_names_its_field() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("name", "name: \"  \"")], "name"),
        (&[("topics", "topics: 0")], "topics"),
        (
            &[("partitionsPerTopic", "partitionsPerTopic: 0")],
            "partitionsPerTopic",
        ),
        (
            &[("partitionsPerTopic", "partitionsPerTopic: 10001")],
            "partitionsPerTopic",
        ),
        (&[("messageSize", "messageSize: 0")], "messageSize"),
        (&[("messageSize", "messageSize: 1048576")], "messageSize"),
        (
            &[("randomBytesRatio", "randomBytesRatio: 1.5")],
            "randomBytesRatio",
        ),
        (
            &[("randomBytesRatio", "randomBytesRatio: -0.1")],
            "randomBytesRatio",
        ),
        (
            &[("randomBytesRatio", "randomBytesRatio: .nan")],
            "randomBytesRatio",
        ),
        (
            &[
                ("useRandomizedPayloads", "useRandomizedPayloads: true"),
                (
                    "randomizedPayloadPoolSize",
                    "randomizedPayloadPoolSize: 2000000",
                ),
            ],
            "randomizedPayloadPoolSize",
        ),
        (&[("payloadFile", "payloadFile: \"\"")], "payloadFile"),
        (
            &[
                ("payloadFile", "payloadFile: p.data"),
                ("useRandomizedPayloads", "useRandomizedPayloads: true"),
            ],
            "payloadFile",
        ),
        (
            &[
                ("producersPerTopic", "producersPerTopic: 0"),
                ("subscriptionsPerTopic", "subscriptionsPerTopic: 0"),
            ],
            "producersPerTopic",
        ),
        (
            &[("consumerPerSubscription", "consumerPerSubscription: 0")],
            "consumerPerSubscription",
        ),
        (
            &[(
                "consumerProcessingMicros",
                "consumerProcessingMicros: 1000001",
            )],
            "consumerProcessingMicros",
        ),
        (&[("producerRate", "producerRate: -1")], "producerRate"),
        (&[("producerRate", "producerRate: .inf")], "producerRate"),
        (
            &[("consumerBacklogSizeGB", "consumerBacklogSizeGB: -1")],
            "consumerBacklogSizeGB",
        ),
        (
            &[
                ("consumerBacklogSizeGB", "consumerBacklogSizeGB: 1"),
                ("subscriptionsPerTopic", "subscriptionsPerTopic: 0"),
            ],
            "consumerBacklogSizeGB",
        ),
        (
            &[
                ("consumerBacklogSizeGB", "consumerBacklogSizeGB: 1"),
                ("producersPerTopic", "producersPerTopic: 0"),
            ],
            "consumerBacklogSizeGB",
        ),
        (
            &[("warmupDurationMinutes", "warmupDurationMinutes: -1")],
            "warmupDurationMinutes",
        ),
        (
            &[("testDurationMinutes", "testDurationMinutes: 0")],
            "testDurationMinutes",
        ),
        (
            &[("testDurationMinutes", "testDurationMinutes: 1e12")],
            "testDurationMinutes",
        ),
        (&[("driver", "driver:\n  acks: 2")], "driver.acks"),
        (&[("driver", "driver:\n  acks: \"-1\"")], "driver.acks"),
        (
            &[("driver", "driver:\n  lingerMs: 3000000000")],
            "driver.lingerMs",
        ),
        (
            &[("driver", "driver:\n  batchSize: 2000000")],
            "driver.batchSize",
        ),
        (
            &[("driver", "driver:\n  compression: gzip")],
            "driver.compression",
        ),
        (
            &[("driver", "driver:\n  flushMessages: 0")],
            "driver.flushMessages",
        ),
        (
            &[("driver", "driver:\n  flushMs: 18446744073709551615")],
            "driver.flushMs",
        ),
        (
            &[("driver", "driver:\n  maxInFlight: 0")],
            "driver.maxInFlight",
        ),
        (
            &[("driver", "driver:\n  topicConfigs: remote.storage.enable")],
            "driver.topicConfigs",
        ),
        (
            &[("driver", "driver:\n  maxInFlight: 6")],
            "driver.maxInFlight",
        ),
        (
            &[("driver", "driver:\n  transactionRecords: 0")],
            "driver.transactionRecords",
        ),
        (
            &[(
                "driver",
                "driver:\n  transactionRecords: 100\n  idempotence: false",
            )],
            "driver.transactionRecords",
        ),
        (
            &[("driver", "driver:\n  transactionRecords: 100\n  acks: 1")],
            "driver.transactionRecords",
        ),
        (
            &[("driver", "driver:\n  isolationLevel: committed")],
            "driver.isolationLevel",
        ),
    ];
    for (changes, field) in cases {
        let yaml = with_all(changes);
        let w: Workload = serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
        let err: WorkloadError = w
            .validate()
            .expect_err(&format!("expected an error for:\n{yaml}"));
        assert_eq!(err.field, *field, "{yaml}: {err}");
        assert!(!err.message.is_empty());
        assert!(
            err.to_string().starts_with(&format!("field `{field}`: ")),
            "{err}"
        );
        let e = parse_err(&yaml);
        assert!(
            e.starts_with(&format!("workload: field `{field}`: ")),
            "{yaml}: {e}"
        );
    }
}

#[test]
fn semantic_edges_that_are_allowed() {
    // Consume-only and produce-only workloads.
    let w = Workload::from_yaml(&with("producersPerTopic", "producersPerTopic: 0")).unwrap();
    assert_eq!(w.total_producers(), 0);
    let w = Workload::from_yaml(
        &with("subscriptionsPerTopic", "subscriptionsPerTopic: 0")
            .replace("consumerPerSubscription: 1", "consumerPerSubscription: 0"),
    )
    .unwrap();
    assert_eq!(w.total_consumers(), 0);
    // Ratio bounds, as-fast-as-possible, idempotence off allows more in flight.
    Workload::from_yaml(&with("randomBytesRatio", "randomBytesRatio: 1")).unwrap();
    Workload::from_yaml(&with("producerRate", "producerRate: 0")).unwrap();
    Workload::from_yaml(&with(
        "driver",
        "driver:\n  idempotence: false\n  maxInFlight: 32",
    ))
    .unwrap();
    Workload::from_yaml(&with("driver", "driver:\n  acks: 1\n  maxInFlight: 32")).unwrap();
    // Largest message.
    Workload::from_yaml(&with(
        "messageSize",
        &format!("messageSize: {}", weir_loadgen::workload::MESSAGE_SIZE_MAX),
    ))
    .unwrap();
}

#[test]
fn set_overrides_top_level_fields() {
    let mut w = base();
    w.set("partitionsPerTopic", "4").unwrap();
    assert_eq!(w.partitions_per_topic, 4);
    w.set("producerRate", "1234.5").unwrap();
    assert_eq!(w.producer_rate, 1234.5);
    w.set("testDurationMinutes", "0.5").unwrap();
    assert_eq!(w.duration(), Duration::from_secs(30));
    w.set("useRandomizedPayloads", "true").unwrap();
    assert!(w.use_randomized_payloads);
    w.set("keyDistributor", "KEY_ROUND_ROBIN").unwrap();
    assert_eq!(w.key_distributor, KeyDistributor::KeyRoundRobin);
    // Text fields take the value as written, even if YAML reads a number.
    w.set("name", "123").unwrap();
    assert_eq!(w.name, "123");
    w.set("name", "my run: 2").unwrap();
    assert_eq!(w.name, "my run: 2");
    // Optional fields: set and cleared.
    w.set("useRandomizedPayloads", "false").unwrap();
    w.set("payloadFile", "payload/1kb.data").unwrap();
    assert_eq!(w.payload_file.as_deref(), Some("payload/1kb.data"));
    w.set("payloadFile", "null").unwrap();
    assert_eq!(w.payload_file, None);
}

#[test]
fn set_overrides_driver_fields() {
    let mut w = base();
    w.set("driver.lingerMs", "10").unwrap();
    assert_eq!(w.driver.linger_ms, 10);
    w.set("driver.acks", "1").unwrap();
    assert_eq!(w.driver.acks, "1");
    w.set("driver.acks", "all").unwrap();
    w.set("driver.compression", "zstd").unwrap();
    assert_eq!(w.driver.compression, "zstd");
    w.set("driver.idempotence", "false").unwrap();
    assert!(!w.driver.idempotence);
    w.set("driver.flushMessages", "1000").unwrap();
    w.set("driver.flushMs", "50").unwrap();
    assert_eq!(
        (w.driver.flush_messages, w.driver.flush_ms),
        (Some(1000), Some(50))
    );
    assert_eq!(
        w.driver.topic_configs(),
        [
            ("flush.messages".to_string(), "1000".to_string()),
            ("flush.ms".to_string(), "50".to_string())
        ]
    );
    w.set(
        "driver.topicConfigs",
        "remote.storage.enable=true, segment.bytes=1048576",
    )
    .unwrap();
    assert!(w.driver.tiered());
    assert_eq!(
        w.driver.topic_configs()[2..],
        [
            ("remote.storage.enable".to_string(), "true".to_string()),
            ("segment.bytes".to_string(), "1048576".to_string())
        ]
    );
    w.set("driver.topicConfigs", "").unwrap();
    assert!(!w.driver.tiered());
    w.set("driver.flushMs", "").unwrap();
    assert_eq!(w.driver.flush_ms, None);
    let c = w.driver.producer_config();
    assert_eq!((c.linger_ms, c.enable_idempotence), (10, false));
    assert_eq!(c.acks, weir_client::Acks::All);
    assert_eq!(
        c.compression,
        weir_client::producer::Compression::Zstd {
            level: weir_loadgen::workload::ZSTD_LEVEL
        }
    );
}

#[test]
fn set_rejects_unknown_names() {
    let mut w = base();
    let before = w.clone();
    let e = format!("{:#}", w.set("partitions", "4").unwrap_err());
    assert!(e.contains("unknown workload field `partitions`"), "{e}");
    for name in [
        "partitionsPerTopic",
        "driver.lingerMs",
        "testDurationMinutes",
    ] {
        assert!(e.contains(name), "lists {name}: {e}");
    }
    let e = format!("{:#}", w.set("lingerMs", "4").unwrap_err());
    assert!(e.contains("did you mean `driver.lingerMs`"), "{e}");
    let e = format!("{:#}", w.set("partitionsperTopic", "4").unwrap_err());
    assert!(e.contains("did you mean `partitionsPerTopic`"), "{e}");
    assert!(w.set("driver", "{}").is_err());
    assert!(w.set("driver.nope", "1").is_err());
    assert_eq!(w, before);

    let names = Workload::field_names();
    assert!(names.contains(&"driver.maxInFlight".to_string()));
    assert!(names.contains(&"driver.lingerAdaptive".to_string()));
    assert!(names.contains(&"consumerBacklogSizeGB".to_string()));
    assert!(names.contains(&"subscriptionType".to_string()));
    assert!(!names.contains(&"driver".to_string()));
    assert!(names.contains(&"driver.otlpSpansPerExport".to_string()));
    assert!(names.contains(&"shareMaxRecords".to_string()));
    assert!(names.contains(&"shareAcquireMode".to_string()));
    assert!(names.contains(&"unkeyedPartitioner".to_string()));
    assert_eq!(names.len(), 21 + 14);
}

#[test]
fn set_rejects_bad_values_and_leaves_the_workload_unchanged() {
    let mut w = base();
    let before = w.clone();
    for (field, value) in [
        ("topics", "many"),
        ("topics", "1.5"),
        ("topics", "-1"),
        ("producerRate", "fast"),
        ("shareMaxRecords", "-1"),
        ("shareAcquireMode", "strict"),
        ("unkeyedPartitioner", "random"),
        ("useRandomizedPayloads", "yes"),
        ("keyDistributor", "BY_HASH"),
        ("driver.lingerMs", "soon"),
        ("driver.idempotence", "1"),
    ] {
        let e = format!("{:#}", w.set(field, value).unwrap_err());
        assert!(
            e.contains(&format!("`{field}`")) && e.contains(value),
            "{field}={value}: {e}"
        );
        assert_eq!(w, before);
    }
    // Well-typed but semantically wrong: the validation error names the field.
    for (field, value) in [
        ("topics", "0"),
        ("randomBytesRatio", "2"),
        ("testDurationMinutes", "0"),
        ("driver.acks", "2"),
        ("driver.compression", "gzip"),
        ("driver.maxInFlight", "6"),
        ("shareMaxRecords", "0"),
        ("shareMaxRecords", "100001"),
    ] {
        let e = format!("{:#}", w.set(field, value).unwrap_err());
        assert!(
            e.contains(&format!("field `{field}`")),
            "{field}={value}: {e}"
        );
        assert!(e.contains(&format!("{field}={value}")), "{e}");
        assert_eq!(w, before);
    }
}

#[test]
fn set_all_validates_once_at_the_end() {
    let mut w = base();
    // One at a time, the first leaves neither producers nor subscriptions.
    w.set("subscriptionsPerTopic", "0").unwrap();
    assert!(w.set("producersPerTopic", "0").is_err());
    w.set_all([("producersPerTopic", "0"), ("subscriptionsPerTopic", "2")])
        .unwrap();
    assert_eq!((w.producers_per_topic, w.subscriptions_per_topic), (0, 2));
    w.set_all(vec![
        ("driver.idempotence".to_string(), "false".to_string()),
        ("driver.maxInFlight".to_string(), "16".to_string()),
    ])
    .unwrap();
    assert_eq!(w.driver.max_in_flight, 16);
    let before = w.clone();
    assert!(w
        .set_all([("topics", "3"), ("partitionsPerTopic", "0")])
        .is_err());
    assert_eq!(w, before, "all or nothing");
}

#[test]
fn round_trip_yaml_workload_yaml() {
    let mut all: Vec<Workload> = shipped()
        .iter()
        .map(|p| Workload::load(p).unwrap())
        .collect();
    let mut w = base();
    w.set_all([
        ("keyDistributor", "RANDOM_NANO"),
        ("payloadFile", "payload/x.data"),
        ("randomBytesRatio", "0.1"),
        ("consumerBacklogSizeGB", "0.3"),
        ("warmupDurationMinutes", "0.1"),
        ("driver.flushMessages", "7"),
        ("driver.compression", "lz4"),
        ("driver.acks", "0"),
    ])
    .unwrap();
    all.push(w);
    for w in all {
        let yaml = serde_yaml::to_string(&w).unwrap();
        let back = Workload::from_yaml(&yaml).unwrap_or_else(|e| panic!("{yaml}: {e:#}"));
        assert_eq!(back, w, "{yaml}");
        assert_eq!(serde_yaml::to_string(&back).unwrap(), yaml);
    }
}

#[test]
fn load_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let e = format!("{:#}", Workload::load(&missing).unwrap_err());
    assert!(e.contains(&missing.display().to_string()), "{e}");

    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, with("topics", "topics: 0")).unwrap();
    let e = format!("{:#}", Workload::load(&bad).unwrap_err());
    assert!(e.contains(&bad.display().to_string()), "{e}");
    assert!(e.contains("field `topics`"), "{e}");

    let unknown = dir.path().join("unknown.yaml");
    std::fs::write(&unknown, with("bogus", "bogus: 1")).unwrap();
    let e = format!("{:#}", Workload::load(&unknown).unwrap_err());
    assert!(e.contains(&unknown.display().to_string()), "{e}");
    assert!(e.contains("unknown field `bogus`"), "{e}");
}

#[test]
fn durations_and_backlog() {
    let mut w = base();
    w.set_all([
        ("warmupDurationMinutes", "0.25"),
        ("testDurationMinutes", "2.5"),
        ("consumerBacklogSizeGB", "1.5"),
    ])
    .unwrap();
    assert_eq!(w.warmup(), Duration::from_secs(15));
    assert_eq!(w.duration(), Duration::from_secs(150));
    assert_eq!(w.backlog_bytes(), 3 << 29);
}

#[test]
fn topic_names_are_deterministic_and_valid() {
    let mut w = base();
    w.set_all([
        ("name", "1 producer / 1 consumers on 1 topic"),
        ("topics", "3"),
    ])
    .unwrap();
    assert_eq!(
        w.topic_names(),
        [
            "1-producer-1-consumers-on-1-topic-0",
            "1-producer-1-consumers-on-1-topic-1",
            "1-producer-1-consumers-on-1-topic-2",
        ]
    );
    assert_eq!(w.topic_names(), w.clone().topic_names());

    w.set("name", "  /// ").unwrap();
    assert_eq!(w.topic_names()[0], "workload-0");
    w.set("name", "Größe: 1KB_v2.x").unwrap();
    assert_eq!(w.topic_names()[0], "Gr-e-1KB_v2.x-0");

    w.set_all([("name", "x".repeat(400).as_str()), ("topics", "1000")])
        .unwrap();
    let names = w.topic_names();
    assert_eq!(names.len(), 1000);
    for n in &names {
        assert!(n.len() <= 249, "{n}");
        weir_broker::metadata::validate_name(n).unwrap();
    }
    let unique: std::collections::HashSet<_> = names.iter().collect();
    assert_eq!(unique.len(), 1000);
}

#[test]
fn payload_file_is_read_relative_to_a_base_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.data"), vec![7u8; 1024]).unwrap();
    std::fs::write(dir.path().join("short.data"), vec![7u8; 10]).unwrap();
    let mut w = base();
    assert_eq!(w.read_payload_file(dir.path()).unwrap(), None);
    w.set("payloadFile", "p.data").unwrap();
    assert_eq!(
        w.read_payload_file(dir.path()).unwrap(),
        Some(vec![7u8; 1024])
    );
    w.set("payloadFile", "short.data").unwrap();
    let e = format!("{:#}", w.read_payload_file(dir.path()).unwrap_err());
    assert!(e.contains("messageSize"), "{e}");
    w.set("payloadFile", "nope.data").unwrap();
    let e = format!("{:#}", w.read_payload_file(dir.path()).unwrap_err());
    assert!(e.contains("nope.data"), "{e}");
}

#[test]
fn single_partition_workloads_set_what_their_rows_measure() {
    let load = |f: &str| Workload::load(&workloads_dir().join(f)).unwrap();
    let w = load("latency-1-topic-1-partition-1000b-linger0.yaml");
    assert_eq!((w.message_size, w.producer_rate), (1000, 50000.0));
    assert_eq!(w.driver.linger_ms, 0);
    let w = load("latency-1-topic-1-partition-1000b-200k-linger1.yaml");
    assert_eq!((w.producer_rate, w.driver.linger_ms), (200000.0, 1));
    let w = load("latency-1-topic-1-partition-1000b-50mbs.yaml");
    assert_eq!(w.driver, DriverSettings::default());
    let w = load("backlog-1-topic-1-partition-1000b-2gb.yaml");
    assert_eq!(w.backlog_bytes(), 2 << 30);
    let w = load("max-rate-1-topic-1-partition-100b.yaml");
    assert_eq!((w.message_size, w.producer_rate), (100, 0.0));
}
