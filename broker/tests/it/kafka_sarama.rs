//! An old Go Kafka client, unchanged, against Weir's Kafka listener: sarama
//! 1.22.1, Debian 12's `golang-github-shopify-sarama-dev`, built offline
//! from `/usr/share/gocode` (GOPATH mode) with Debian's Go.
//! `broker/tests/kafka/sarama/main.go` drives it; `bash .ci/kafka-clients`
//! installs both packages, and this test fails with that advice when they
//! are missing.
//!
//! sarama 1.22.1 predates ApiVersions negotiation: it picks each request's
//! version from its configured `Version` alone, and some not at all. It
//! commits group offsets with OffsetCommit v1 whatever `Version` says, and
//! at its default `Version` (0.8.2) lists offsets with ListOffsets v0 —
//! both versions Kafka 4 removed (KIP-896).
//! The program produces 2000 keyed records (Produce v3, acks=all), reads
//! half of each partition in a consumer group and closes it (commits with
//! OffsetCommit v1), reads the rest in a second session that must start at
//! those commits (every record once, at the offset its acknowledgement
//! named), and checks the log's ends (ListOffsets v0) and the commits
//! (OffsetFetch v1) at the default `Version`. The native protocol sees the
//! same commits.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{runtime, Broker};
use weir_client::{Client, OffsetSpec};

/// Where Debian's Go packages put their sources.
const GOCODE: &str = "/usr/share/gocode";
const RECORDS: i64 = 2000;

/// The program, built once per test run into `target/sarama/`.
fn sarama_client() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(build).clone()
}

fn build() -> PathBuf {
    let advice = "run `bash .ci/kafka-clients` (installs Debian's golang-go and \
                  golang-github-shopify-sarama-dev)";
    let go = common::client_program("go").arg("version").output();
    assert!(
        go.as_ref().is_ok_and(|o| o.status.success()),
        "`go version`: {go:?}: {advice}"
    );
    let sarama = Path::new(GOCODE).join("src/github.com/Shopify/sarama");
    assert!(
        sarama.join("consumer_group.go").exists(),
        "{} is missing: {advice}",
        sarama.display()
    );
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = manifest.join("../target/sarama");
    std::fs::create_dir_all(&out).unwrap();
    let bin = out.join("sarama-client");
    // GOPATH mode, offline: sarama and its dependencies come from Debian's
    // packages only. A GOPATH-mode build names its package by directory, so
    // it runs in the program's directory.
    let built = common::client_program("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(manifest.join("tests/kafka/sarama"))
        .env("GO111MODULE", "off")
        .env("GOPATH", GOCODE)
        .env("GOCACHE", out.join("go-cache"))
        .env("GOFLAGS", "")
        .env("GOPROXY", "off")
        .env("GOENV", "off")
        .output()
        .expect("go build runs");
    assert!(
        built.status.success(),
        "go build of broker/tests/kafka/sarama failed ({advice} if sarama's dependencies are \
         missing):\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    bin
}

/// The value of `"key":` in the program's flat JSON object: a number (up to
/// the next comma or the closing brace) or an array of numbers.
fn field<'a>(json: &'a str, key: &str) -> &'a str {
    let tag = format!("\"{key}\":");
    let i = json
        .find(&tag)
        .unwrap_or_else(|| panic!("no {key}: {json}"))
        + tag.len();
    let rest = &json[i..];
    let end = if rest.starts_with('[') {
        rest.find(']').unwrap() + 1
    } else {
        rest.find([',', '}']).unwrap()
    };
    &rest[..end]
}

fn num(json: &str, key: &str) -> i64 {
    field(json, key)
        .parse()
        .unwrap_or_else(|e| panic!("{key}: {e}: {json}"))
}

fn list(json: &str, key: &str) -> Vec<i64> {
    field(json, key)
        .trim_matches(['[', ']'])
        .split(',')
        .map(|s| s.parse().unwrap_or_else(|e| panic!("{key}: {e}: {json}")))
        .collect()
}

#[test]
fn sarama_1_22_produces_consumes_in_a_group_resumes_from_v1_commits_and_lists_offsets_v0() {
    let bin = sarama_client();
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &["--group-initial-rebalance-delay-ms", "0"]);
    // The native protocol creates the topic (sarama's ClusterAdmin sends
    // CreateTopics v0 below its V0_11_0_0, which Weir does not serve).
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        c.create_topic("sarama-records", 4, vec![]).await.unwrap();
    });

    let started = std::time::Instant::now();
    let out = common::client_program(&bin)
        .args(["all", &b.kafka.to_string(), "sarama"])
        .env("SARAMA_LOG", "1")
        .output()
        .expect("the sarama client runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("\"ok\":true"),
        "the sarama client failed ({:?}): {stdout}\n{stderr}",
        out.status
    );
    eprintln!("sarama client: {:.1?}: {stdout}", started.elapsed());
    let json = stdout.trim();

    assert_eq!(num(json, "produced"), RECORDS, "{json}");
    assert_eq!(num(json, "phase1"), RECORDS / 2, "{json}");
    assert_eq!(num(json, "phase2"), RECORDS / 2, "{json}");
    assert_eq!(num(json, "distinct"), RECORDS, "{json}");
    assert_eq!(num(json, "duplicates"), 0, "{json}");
    assert_eq!(num(json, "missing"), 0, "{json}");
    // Every partition had a commit from the first session, in its middle,
    // and the second session started there.
    let phase1 = list(json, "committed_phase1");
    let newest = list(json, "newest");
    assert_eq!(phase1.len(), 4, "{json}");
    assert!(
        phase1.iter().zip(&newest).all(|(c, n)| 0 < *c && c < n),
        "{json}"
    );
    assert_eq!(list(json, "phase2_initial"), phase1, "{json}");
    assert_eq!(list(json, "phase2_first"), phase1, "{json}");
    // ListOffsets v0: the log starts at 0 and ends after N records.
    assert_eq!(list(json, "oldest"), vec![0; 4], "{json}");
    assert_eq!(num(json, "listed"), RECORDS, "{json}");
    // OffsetFetch v1: the group committed the log ends.
    assert_eq!(list(json, "committed_final"), newest, "{json}");
    assert_eq!(num(json, "committed_sum"), RECORDS, "{json}");

    // The native protocol sees the same commits and ends.
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        let mut committed = c.committed_offsets("sarama-group", None).await.unwrap();
        committed.sort_by_key(|o| o.partition);
        let total: u64 = committed.iter().map(|o| o.offset).sum();
        assert_eq!(total, RECORDS as u64, "{committed:?}");
        for o in &committed {
            assert_eq!(o.topic, "sarama-records");
            let end = c
                .list_offsets("sarama-records", o.partition, OffsetSpec::Latest)
                .await
                .unwrap();
            assert_eq!(Some(o.offset), end, "{o:?}");
            assert_eq!(o.offset as i64, newest[o.partition as usize], "{o:?}");
        }
        assert_eq!(committed.len(), 4, "{committed:?}");
        let d = c.describe_group("sarama-group").await.unwrap();
        assert_eq!(d.kind, "classic", "{d:?}");
    });
    b.stop();
}
