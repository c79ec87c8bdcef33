//! Compacted topics through the broker and the `weir` CLI: creation and
//! alteration with `cleanup.policy`, keys required at produce time, `weir
//! topic compact`, the dirty ratio in `weir topic describe` and `/metrics`,
//! and the per-core cleaner running on its own.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{weir, Broker};

fn ok(b: &Broker, args: &[&str], stdin: &[u8]) -> String {
    let out = weir(b, args, stdin);
    let se = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "weir {args:?} failed: {se}");
    String::from_utf8(out.stdout).unwrap()
}

fn fails(b: &Broker, args: &[&str], stdin: &[u8]) -> String {
    let out = weir(b, args, stdin);
    assert!(!out.status.success(), "weir {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The sum of a metric family's samples.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Every record of the topic as (partition, offset, key, value).
fn consume_all(b: &Broker, topic: &str) -> Vec<(u32, u64, String, String)> {
    let out = ok(
        b,
        &[
            "consume",
            topic,
            "--format",
            "%p %o %k %v",
            "--timeout-ms",
            "1000",
        ],
        b"",
    );
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].to_string(),
                f[3].to_string(),
            )
        })
        .collect()
}

/// Lines `user-<i % keys>:v<i>` for i in `from..to`.
fn lines(from: u64, to: u64, keys: u64) -> Vec<u8> {
    (from..to)
        .map(|i| format!("user-{}:v{i}\n", i % keys))
        .collect::<String>()
        .into_bytes()
}

/// A compacted topic of 2 partitions with 4 KiB segments, filled through
/// `weir produce` with `n` lines over `keys` keys in small batches (so
/// segments roll).
fn create_and_fill(b: &Broker, topic: &str, n: u64, keys: u64) {
    ok(
        b,
        &[
            "topic",
            "create",
            topic,
            "--partitions",
            "2",
            "--config",
            "cleanup.policy=compact",
            "--config",
            "segment.bytes=4096",
        ],
        b"",
    );
    ok(
        b,
        &[
            "produce",
            topic,
            "--key-separator",
            ":",
            "--batch-size",
            "1024",
        ],
        &lines(0, n, keys),
    );
}

#[test]
fn compacted_topics_through_the_broker_and_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    // A long cleaner back-off: only `weir topic compact` cleans here.
    let b = Broker::start_with(dir.path(), 2, &["--log-cleaner-backoff-ms", "3600000"]);
    let keys = 40;
    create_and_fill(&b, "profiles", 2000, keys);
    // A record without a key is refused, with a reason, and nothing lands.
    let e = fails(
        &b,
        &["produce", "profiles", "--partition", "0"],
        b"no key here\n",
    );
    assert!(e.contains("needs a key"), "{e}");
    let before = consume_all(&b, "profiles");
    assert_eq!(before.len(), 2000);

    let desc = ok(&b, &["topic", "describe", "profiles"], b"");
    assert!(desc.contains("cleanup.policy"), "{desc}");
    assert!(desc.contains("compact"), "{desc}");
    assert!(desc.contains("DIRTY-RATIO"), "{desc}");

    let out = ok(&b, &["topic", "compact", "profiles"], b"");
    assert!(out.contains("RECORDS-REMOVED"), "{out}");
    assert_eq!(out.lines().count(), 3, "{out}");

    let after = consume_all(&b, "profiles");
    assert!(after.len() < 2000 / 2, "{} records left", after.len());
    // Every record left is one that was written (same key, value, partition
    // and offset), and the latest value of every key is there.
    let written: HashMap<(u32, u64), (String, String)> = before
        .iter()
        .map(|(p, o, k, v)| ((*p, *o), (k.clone(), v.clone())))
        .collect();
    for (p, o, k, v) in &after {
        assert_eq!(written.get(&(*p, *o)), Some(&(k.clone(), v.clone())));
    }
    for k in 0..keys {
        let last = (0..2000).filter(|i| i % keys == k).max().unwrap();
        let want = format!("v{last}");
        assert!(
            after
                .iter()
                .any(|(_, _, key, v)| *key == format!("user-{k}") && *v == want),
            "latest value of user-{k} ({want}) missing"
        );
    }
    let m = common::scrape(b.metrics);
    assert!(metric_sum(&m, "weir_cleaner_passes_total") >= 1.0, "{m}");
    assert!(metric_sum(&m, "weir_cleaner_removed_records_total") >= 1000.0);
    assert!(
        m.contains("weir_partition_dirty_ratio{topic=\"profiles\""),
        "{m}"
    );

    // A delete-policy topic: compact is refused until the policy says so.
    ok(&b, &["topic", "create", "events", "--partitions", "1"], b"");
    let e = fails(&b, &["topic", "compact", "events"], b"");
    assert!(e.contains("not compacted"), "{e}");
    ok(
        &b,
        &[
            "topic",
            "alter",
            "events",
            "--config",
            "cleanup.policy=compact,delete",
        ],
        b"",
    );
    ok(&b, &["topic", "compact", "events"], b"");
    let e = fails(
        &b,
        &[
            "topic",
            "alter",
            "events",
            "--config",
            "cleanup.policy=squash",
        ],
        b"",
    );
    assert!(e.contains("cleanup.policy"), "{e}");
    b.stop();
}

#[test]
fn each_core_cleans_its_compacted_partitions_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &["--log-cleaner-backoff-ms", "100"]);
    create_and_fill(&b, "shadows", 3000, 10);
    // Both partitions' cleaners run without being asked, until neither
    // partition is dirty enough for another pass. (A pass can run while the
    // topic is still being filled: a core having cleaned once does not mean
    // it has cleaned what came after.)
    common::wait_until(
        Instant::now() + Duration::from_secs(60),
        "the cleaners cleaned both partitions",
        || {
            let m = common::scrape(b.metrics);
            let value = |l: &str| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
            let cores_cleaning = m
                .lines()
                .filter(|l| l.starts_with("weir_cleaner_passes_total{"))
                .filter(|l| value(l) > Some(0.0))
                .count();
            let ratios: Vec<f64> = m
                .lines()
                .filter(|l| l.starts_with("weir_partition_dirty_ratio{topic=\"shadows\""))
                .filter_map(value)
                .collect();
            // min.cleanable.dirty.ratio's default.
            let settled = ratios.len() == 2 && ratios.iter().all(|r| *r < 0.5);
            if cores_cleaning == 2 && settled {
                Ok(())
            } else {
                Err(m)
            }
        },
    );
    let left = consume_all(&b, "shadows");
    assert!(left.len() < 1500, "{} records left", left.len());
    b.stop();
}
