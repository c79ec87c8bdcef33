//! The `weir` command-line tools against a real broker: topic admin,
//! produce from stdin, consume with formats and seeks, and their errors.

use crate::common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use common::{weir, Broker};

fn ok(b: &Broker, args: &[&str], stdin: &[u8]) -> (String, String) {
    let out = weir(b, args, stdin);
    let (so, se) = (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    );
    assert!(out.status.success(), "weir {args:?} failed: {se}");
    (so, se)
}

/// Runs a command that must fail; returns its one-line reason.
fn fails(b: &Broker, args: &[&str]) -> String {
    let out = weir(b, args, b"");
    let se = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success(), "weir {args:?} succeeded");
    assert_eq!(se.lines().count(), 1, "one line: {se:?}");
    assert!(se.starts_with("error: "), "{se:?}");
    se
}

#[test]
fn cli_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let bootstrap = b.listen.to_string();

    let (so, _) = ok(
        &b,
        &[
            "topic",
            "create",
            "events",
            "--partitions",
            "4",
            "--config",
            "retention.ms=86400000",
            "--bootstrap",
            &bootstrap,
        ],
        b"",
    );
    assert!(so.contains("created topic events"), "{so}");

    // 10 000 keyed lines: `user-K|value-I`.
    const N: usize = 10_000;
    let lines: Vec<(String, String)> = (0..N)
        .map(|i| (format!("user-{}", i % 97), format!("value-{i}")))
        .collect();
    let input: String = lines.iter().map(|(k, v)| format!("{k}|{v}\n")).collect();
    let (_, se) = ok(
        &b,
        &["produce", "events", "--key-separator", "|"],
        input.as_bytes(),
    );
    assert!(se.contains("10000 records acknowledged"), "{se}");

    let (so, se) = ok(
        &b,
        &[
            "consume",
            "events",
            "--from",
            "earliest",
            "--max-records",
            "10000",
            "--format",
            "%p %o %k %v",
        ],
        b"",
    );
    assert!(se.contains("10000 records consumed"), "{se}");
    let mut got = Vec::new();
    let mut offsets: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut key_partition: HashMap<String, u32> = HashMap::new();
    for line in so.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 4, "{line}");
        let (p, o) = (f[0].parse::<u32>().unwrap(), f[1].parse::<u64>().unwrap());
        offsets.entry(p).or_default().push(o);
        assert_eq!(
            *key_partition.entry(f[2].to_string()).or_insert(p),
            p,
            "one key, one partition"
        );
        got.push((f[2].to_string(), f[3].to_string()));
    }
    assert_eq!(got.len(), N);
    let want: BTreeSet<_> = lines.iter().cloned().collect();
    assert_eq!(
        got.iter().cloned().collect::<BTreeSet<_>>(),
        want,
        "every line came back"
    );
    assert_eq!(offsets.len(), 4, "keys spread over all partitions");
    for (p, o) in &offsets {
        let expect: Vec<u64> = (0..o.len() as u64).collect();
        assert_eq!(o, &expect, "partition {p}: offsets 0.. in order");
    }
    // Per key, values come back in the order they were produced.
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (k, v) in &got {
        let i: usize = v["value-".len()..].parse().unwrap();
        if let Some(prev) = last.insert(k, i) {
            assert!(prev < i, "{k}: {prev} before {i}");
        }
    }

    let (so, _) = ok(&b, &["topic", "describe", "events"], b"");
    assert!(so.contains("retention.ms"), "{so}");
    let rows: Vec<Vec<&str>> = so
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("PARTITION"))
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 4, "{so}");
    // PARTITION LEADER EPOCH REPLICAS ISR CORE LOG-START LOG-END BYTES
    let ends: u64 = rows.iter().map(|r| r[7].parse::<u64>().unwrap()).sum();
    assert_eq!(ends, N as u64, "{so}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[0], i.to_string());
        // One node (id 1): it leads, holds and is the ISR of everything.
        assert_eq!(&r[1..5], ["1", "0", "1", "1"], "{so}");
        assert_eq!(r[7].parse::<usize>().unwrap(), offsets[&(i as u32)].len());
        assert!(r[8].parse::<u64>().unwrap() > 0, "bytes on disk");
    }
    let cores: BTreeSet<&str> = rows.iter().map(|r| r[5]).collect();
    assert_eq!(cores.len(), 2, "partitions on both cores: {so}");

    let (so, _) = ok(&b, &["topic", "list"], b"");
    assert!(so.lines().any(|l| l == "events"), "{so}");

    // Seek by time: every record is newer, so it starts at offset 0.
    let (so, _) = ok(
        &b,
        &[
            "consume",
            "events",
            "--partition",
            "2",
            "--from",
            "2024-01-15T10:00:00Z",
            "--max-records",
            "3",
            "--format",
            "%t/%p@%o",
        ],
        b"",
    );
    assert_eq!(so, "events/2@0\nevents/2@1\nevents/2@2\n");
    // From an offset, and from the end (nothing new: exits on the timeout).
    let (so, _) = ok(
        &b,
        &[
            "consume",
            "events",
            "--partition",
            "1",
            "--from",
            "5",
            "--max-records",
            "1",
            "--format",
            "%o",
        ],
        b"",
    );
    assert_eq!(so, "5\n");
    let t = Instant::now();
    let (so, _) = ok(
        &b,
        &[
            "consume",
            "events",
            "--from",
            "latest",
            "--timeout-ms",
            "300",
        ],
        b"",
    );
    assert_eq!(so, "");
    assert!(t.elapsed() < Duration::from_secs(10));

    // Errors: one line, non-zero exit.
    let e = fails(&b, &["topic", "create", "events", "--partitions", "4"]);
    assert!(e.contains("already exists"), "{e}");
    let e = fails(&b, &["consume", "no-such-topic"]);
    assert!(e.contains("no-such-topic"), "{e}");
    let e = fails(&b, &["consume", "events", "--partition", "9"]);
    assert!(e.contains("4 partitions"), "{e}");
    fails(&b, &["topic", "describe", "no-such-topic"]);
    fails(&b, &["topic", "list", "--bootstrap", "127.0.0.1:1"]);
}

#[test]
fn cli_admin_and_unkeyed_produce() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    ok(&b, &["topic", "create", "logs", "--partitions", "2"], b"");
    ok(
        &b,
        &["topic", "alter", "logs", "--config", "retention.ms=3600000"],
        b"",
    );
    let (so, _) = ok(&b, &["topic", "describe", "logs"], b"");
    assert!(
        so.lines()
            .any(|l| l.split_whitespace().eq(["retention.ms", "3600000"])),
        "{so}"
    );
    ok(
        &b,
        &["topic", "add-partitions", "logs", "--total", "3"],
        b"",
    );
    let e = fails(&b, &["topic", "add-partitions", "logs", "--total", "2"]);
    assert!(e.contains("InvalidPartitions"), "{e}");

    // Unkeyed lines stick to a partition per batch, and each new batch
    // moves to another partition: batches of ~5 records (200 bytes) spread
    // 70 lines over more than one partition.
    let input: String = (0..70).map(|i| format!("line {i}\n")).collect();
    let (_, se) = ok(
        &b,
        &[
            "produce",
            "logs",
            "--batch-size",
            "200",
            "--linger-ms",
            "50",
            "--compression",
            "zstd",
            "--acks",
            "1",
        ],
        input.as_bytes(),
    );
    assert!(se.contains("70 records acknowledged"), "{se}");
    // acks=0 and a fixed partition.
    let (_, se) = ok(
        &b,
        &["produce", "logs", "--partition", "1", "--acks", "0"],
        b"a\nb\n",
    );
    assert!(se.contains("2 records sent"), "{se}");
    let (so, _) = ok(&b, &["consume", "logs", "--format", "%p %v"], b"");
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    for l in so.lines() {
        *per.entry(l.split(' ').next().unwrap()).or_default() += 1;
    }
    assert_eq!(so.lines().count(), 72, "{so}");
    assert!(per.len() >= 2, "{so}");
    assert!(so.contains("1 a\n1 b\n"), "{so}");

    let e = fails(&b, &["produce", "nope"]);
    assert!(e.contains("nope"), "{e}");
    ok(&b, &["topic", "delete", "logs"], b"");
    let (so, _) = ok(&b, &["topic", "list"], b"");
    assert_eq!(so, "");
    fails(&b, &["topic", "delete", "logs"]);
}

/// A core port that is taken: the broker exits at once, non-zero, saying
/// which core could not listen where and what to change — it does not
/// start without that core, and does not hang on the cores that started.
#[test]
fn a_taken_core_port_fails_the_start_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let base = weir_testkit::ports::run(weir_testkit::ports::Proto::Tcp, 1);
    // Core 1's own port is base + 1.
    let _taken = std::net::TcpListener::bind(("127.0.0.1", base + 1)).unwrap();
    let log = dir.path().join("broker.log");
    let failed = common::Node::builder(env!("CARGO_BIN_EXE_weir"))
        .data_dir(dir.path().join("data"))
        .cores(2)
        .core_port_base(base)
        .log_to(&log)
        .try_start();
    let Err(failed) = failed else {
        panic!("the broker started with core 1's port taken");
    };
    let status = failed
        .status
        .unwrap_or_else(|| panic!("the broker neither started nor failed within 60 s: {failed}"));
    let err = failed.log;
    assert!(!status.success(), "exit status {status}: {err}");
    assert!(
        err.contains(&format!("{}", base + 1)) && err.contains("--core-port-base"),
        "the error names the port and the flag: {err}"
    );
    // The cores that did start stop at once: none was left waiting for an
    // answer from the core that failed (core 0 creating the offsets topic
    // waited for it to apply the change, until the drain limit).
    assert!(
        !err.contains("cores still running"),
        "a core outlived the failed start: {err}"
    );
}
