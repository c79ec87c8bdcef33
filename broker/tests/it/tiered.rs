//! Tiered storage against real object stores: moto's S3 server (a
//! process, on a free loopback port) and the local-directory backend.
//! Segments of 1 MiB, 4 MiB kept locally: the data is uploaded, local
//! disk stays small, and every record is read back byte for byte (CRC per
//! batch) from offset 0 by the SDK and by confluent-kafka, and by
//! timestamp; a broker SIGKILLed mid-upload never serves a half object
//! and cleans up what it left; with the object store stopped, produce goes
//! on, uploads catch up afterwards and a remote read fails fast,
//! retriable.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use weir_client::{Acks, Client, ErrorCode, OffsetSpec};
use weir_proto::batch::Compression;
use weir_proto::builder::BatchBuilder;
use weir_proto::reader::RecordBatch;
use weir_proto::record::RecordData;

use crate::common::{runtime, scrape, wait_until, Broker};
use crate::kafka_clients::python_script;

/// Timestamp of record 0; record `i` has `TS0 + i`.
const TS0: i64 = 1_700_000_000_000;
/// Bytes of each record's value.
const VALUE_BYTES: usize = 1000;

/// moto's S3 server on a free loopback port, with one bucket; killed by
/// PID when dropped.
struct S3Server {
    child: Child,
    endpoint: String,
}

impl S3Server {
    fn start(bucket: &str) -> S3Server {
        let bin =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/s3-venv/bin/moto_server");
        assert!(
            bin.exists(),
            "{} is missing: run `bash .ci/object-store` (installs moto's S3 server)",
            bin.display()
        );
        // Port 0: moto binds a free port itself and names it on stderr
        // (" * Running on http://127.0.0.1:PORT"), so no other process
        // can take it between our choosing and its binding.
        let (child, addr) = spawn_announcing(
            Command::new(bin).args(["-H", "127.0.0.1", "-p", "0"]),
            Announces::OnStderr,
            "Running on http://",
            "moto's S3 server",
        );
        let s = S3Server {
            child,
            endpoint: format!("http://{addr}"),
        };
        // CreateBucket: moto takes an unsigned PUT.
        let status = http_put(addr, &format!("/{bucket}"));
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        s
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: a signal to our own child, by PID.
        let r = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(r, 0);
    }

    /// The broker flags for this store and bucket.
    fn flags(&self, bucket: &str) -> Vec<String> {
        vec![
            "--remote-storage".into(),
            format!("s3://{bucket}/weir"),
            "--remote-storage-option".into(),
            format!("endpoint={}", self.endpoint),
            "--remote-storage-option".into(),
            "region=us-east-1".into(),
            "--remote-storage-option".into(),
            "access_key_id=test".into(),
            "--remote-storage-option".into(),
            "secret_access_key=test".into(),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Azurite's blob service (Azure Blob Storage's emulator, from npm) on a
/// free loopback port, with one container; killed by PID when dropped.
struct AzureServer {
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl AzureServer {
    fn start(container: &str) -> AzureServer {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let bin = root.join("target/azurite/node_modules/.bin/azurite-blob");
        assert!(
            bin.exists(),
            "{} is missing: run `bash .ci/object-store` (installs Azurite)",
            bin.display()
        );
        let dir = tempfile::tempdir().unwrap();
        // Port 0, as for moto: Azurite names the port it bound on stdout.
        let (child, addr) = spawn_announcing(
            Command::new(bin)
                .args(["--blobHost", "127.0.0.1", "--blobPort", "0"])
                .arg("--location")
                .arg(dir.path())
                .args(["--silent", "--skipApiVersionCheck"]),
            Announces::OnStdout,
            "successfully listens on http://",
            "Azurite",
        );
        let s = AzureServer {
            child,
            endpoint: format!("http://{addr}"),
            _dir: dir,
        };
        let out = Command::new("python3")
            .arg(root.join("broker/tests/object_store/azure_container.py"))
            .args([&s.endpoint, container])
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stdout.starts_with(b"201"),
            "creating the container: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        s
    }

    /// The broker flags for this store and container: Azurite's
    /// development account, its path-style endpoint.
    fn flags(&self, container: &str) -> Vec<String> {
        let option = |kv: String| ["--remote-storage-option".to_string(), kv];
        let mut f = vec![
            "--remote-storage".to_string(),
            format!("az://{container}/weir"),
        ];
        f.extend(option("account_name=devstoreaccount1".into()));
        f.extend(option(
            "access_key=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
                .into(),
        ));
        f.extend(option(format!(
            "endpoint={}/devstoreaccount1",
            self.endpoint
        )));
        f
    }
}

impl Drop for AzureServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port free now (for a server the test starts).
/// Which of its streams a server names its address on.
#[derive(Clone, Copy)]
enum Announces {
    OnStdout,
    OnStderr,
}

/// Spawns `cmd` (the server `what`) with the stream it `announces` on
/// piped (the other to null), and reads that stream up to the line where
/// it says it listens — `marker` followed by `127.0.0.1:PORT`; the rest of
/// the output is drained on a thread so the server never blocks on a full
/// pipe. Kills the server and panics, with what it said, if it exits,
/// closes the stream or says nothing within 30 s first.
fn spawn_announcing(
    cmd: &mut Command,
    announces: Announces,
    marker: &str,
    what: &str,
) -> (Child, SocketAddr) {
    use std::io::{BufRead, Read};
    let (stdout, stderr) = match announces {
        Announces::OnStdout => (Stdio::piped(), Stdio::null()),
        Announces::OnStderr => (Stdio::null(), Stdio::piped()),
    };
    let mut child = cmd.stdout(stdout).stderr(stderr).spawn().unwrap();
    let out: Box<dyn Read + Send> = match announces {
        Announces::OnStdout => Box::new(child.stdout.take().unwrap()),
        Announces::OnStderr => Box::new(child.stderr.take().unwrap()),
    };
    let marker = marker.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = std::io::BufReader::new(out).lines();
        let mut seen = String::new();
        for line in lines.by_ref() {
            let Ok(line) = line else { break };
            if let Some(at) = line.find(&marker) {
                let addr = line[at + marker.len()..]
                    .split(|c: char| c.is_whitespace() || c == '/')
                    .next()
                    .and_then(|a| a.parse::<SocketAddr>().ok());
                let _ = tx.send(addr.ok_or(line.clone()));
                // Keep reading so the child never blocks on the pipe.
                for _ in lines.by_ref() {}
                return;
            }
            seen.push_str(&line);
            seen.push('\n');
        }
        let _ = tx.send(Err(seen));
    });
    let said = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(addr)) => return (child, addr),
        Ok(Err(seen)) => seen,
        Err(_) => "nothing within 30 s".to_string(),
    };
    let _ = child.kill();
    let status = child.wait();
    panic!("{what} did not say where it listens (exit: {status:?}); it said:\n{said}")
}

fn http_put(addr: SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The broker flags every test uses: passes every 100 ms.
const FAST: [&str; 4] = [
    "--remote-log-task-interval-ms",
    "100",
    "--retention-check-ms",
    "100",
];

fn start(dir: &Path, remote: &[String]) -> Broker {
    let mut args: Vec<&str> = FAST.to_vec();
    args.extend(remote.iter().map(String::as_str));
    Broker::start_with(dir, 1, &args)
}

fn create_tiered(b: &Broker, topic: &str) {
    let r = b.client().create_topic(
        topic,
        1,
        &[
            ("remote.storage.enable", "true"),
            ("segment.bytes", "1048576"),
            ("local.retention.bytes", "4194304"),
            // The records' timestamps are from 2023.
            ("retention.ms", "-1"),
        ],
    );
    assert_eq!(r.error, 0, "{r:?}");
}

/// Writes records `from..to` (`{i:08}-` and padding, timestamp `TS0 + i`)
/// to partition 0, 100 per batch, acks=all.
pub(crate) async fn produce(c: &Client, topic: &str, from: u64, to: u64) {
    let mut i = from;
    while i < to {
        let mut b = BatchBuilder::new(Compression::None).unwrap();
        let end = (i + 100).min(to);
        for r in i..end {
            let mut v = format!("{r:08}-").into_bytes();
            v.resize(VALUE_BYTES, b'a' + (r % 26) as u8);
            b.push(&RecordData {
                key: None,
                value: Some(Bytes::from(v)),
                headers: Vec::new(),
                timestamp: TS0 + r as i64,
            })
            .unwrap();
        }
        let base = c
            .produce(topic, 0, b.build().unwrap().freeze(), Acks::All)
            .await
            .unwrap();
        assert_eq!(base, Some(i));
        i = end;
    }
}

/// Reads partition 0 from `from` up to `to`, every batch's CRC checked and
/// every record's value its offset's; returns the log start offset the
/// broker answered first.
pub(crate) async fn read_all(c: &Client, topic: &str, from: u64, to: u64) -> u64 {
    let mut next = from;
    let mut log_start = None;
    while next < to {
        let f = c.fetch(topic, 0, next, 1 << 20, 0).await.unwrap();
        log_start.get_or_insert(f.log_start_offset);
        assert!(!f.batches.is_empty(), "nothing at {next}");
        for b in &f.batches {
            let batch = RecordBatch::parse(b).expect("a whole batch, its CRC right");
            for r in batch.records().unwrap().iter() {
                let r = r.unwrap();
                let off = r.offset as u64;
                if off < next {
                    continue;
                }
                assert_eq!(off, next, "offsets in order, none missing");
                let v = r.record.value.unwrap();
                assert!(
                    v.starts_with(format!("{off:08}-").as_bytes()),
                    "value at {off}"
                );
                assert_eq!(v.len(), VALUE_BYTES);
                assert_eq!(r.timestamp, TS0 + off as i64);
                next += 1;
            }
        }
    }
    log_start.unwrap_or(from)
}

/// Bytes of the partition's files on local disk (allocated, as `du`).
pub(crate) fn local_bytes(dir: &Path, topic: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    // Retention may delete a file between the listing and its metadata.
    std::fs::read_dir(dir.join(format!("{topic}-0")))
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

fn metric(b: &Broker, name: &str) -> f64 {
    scrape(b.metrics)
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until every closed segment is uploaded and local retention ran.
fn wait_uploaded(b: &Broker, dir: &Path, topic: &str) {
    wait_until(
        Instant::now() + Duration::from_secs(60),
        "segments uploaded, local disk trimmed",
        || {
            metric(b, "weir_remote_upload_lag_bytes") <= (2 << 20) as f64
                && local_bytes(dir, topic) <= 8 << 20
        },
    );
}

/// 200 MiB (as the issue asks) through moto's S3: local disk ≤ 8 MiB, every record read back
/// from offset 0 by the SDK and confluent-kafka, byte for byte; the log
/// start is the remote one; offsets-for-times lands inside a remote
/// segment.
#[test]
fn a_tiered_topic_keeps_little_on_local_disk_and_replays_every_record_from_s3() {
    let s3 = S3Server::start("weir-a");
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path(), &s3.flags("weir-a"));
    create_tiered(&b, "logs");
    const N: u64 = 200_000;
    let addr = b.listen;
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        produce(&c, "logs", 0, N).await;
    });
    wait_uploaded(&b, dir.path(), "logs");
    assert!(metric(&b, "weir_remote_uploads_total") >= 190.0);
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        let start = read_all(&c, "logs", 0, N).await;
        assert_eq!(start, 0, "the log starts at the remote tier's start");
        assert_eq!(
            c.list_offsets("logs", 0, OffsetSpec::Earliest)
                .await
                .unwrap(),
            Some(0)
        );
        // A timestamp inside the third segment (remote).
        let at = c
            .list_offsets("logs", 0, OffsetSpec::Timestamp(TS0 + 2_500))
            .await
            .unwrap();
        assert_eq!(at, Some(2_500));
        // What `weir topic describe` shows: the local and the remote log.
        let d = c.describe_topic("logs").await.unwrap();
        let p = &d.partitions[0];
        assert_eq!(p.log_start_offset, 0);
        assert!(p.local_log_start_offset >= 190_000, "{p:?}");
        assert!(p.remote_bytes >= 190 << 20, "{p:?}");
        assert!(p.size_bytes <= 8 << 20, "{p:?}");
        assert!(p.remote_segments >= 190, "{p:?}");
    });
    assert!(metric(&b, "weir_remote_fetches_total") > 0.0);
    // Kafka's ListOffsets -4 (the local log start) and -5 (the last
    // offset in the remote tier); for a topic not tiered, the log start
    // and none.
    let plain = b.client().create_topic("plain", 1, &[]);
    assert_eq!(plain.error, 0, "{plain:?}");
    let local_start = runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        c.describe_topic("logs").await.unwrap().partitions[0].local_log_start_offset
    });
    let earliest_local = kafka_list_offset(&b, "logs", -4);
    assert_eq!(earliest_local, local_start as i64);
    let latest_tiered = kafka_list_offset(&b, "logs", -5);
    assert!(
        latest_tiered + 1 >= local_start as i64 && latest_tiered < N as i64,
        "latest tiered {latest_tiered}, local start {local_start}"
    );
    assert_eq!(kafka_list_offset(&b, "plain", -4), 0);
    assert_eq!(kafka_list_offset(&b, "plain", -5), -1);
    let out = python_script(
        "tiered.py",
        &[
            &b.kafka.to_string(),
            "logs",
            &N.to_string(),
            &(TS0 + 12_345).to_string(),
        ],
    );
    assert!(out.contains(&format!("read {N}")), "{out}");
    assert!(out.contains("ts 12345"), "{out}");
    assert!(local_bytes(dir.path(), "logs") <= 8 << 20);
}

/// One Kafka ListOffsets (v9) of `topic`-0 for `timestamp`: the offset
/// answered, after checking no error was.
fn kafka_list_offset(b: &Broker, topic: &str, timestamp: i64) -> i64 {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{
        ApiKey, BrokerId, ListOffsetsRequest, ListOffsetsResponse, TopicName,
    };
    use kafka_protocol::protocol::StrBytes;
    let mut k = crate::common::KafkaConn::connect(b.kafka);
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_timestamp(timestamp)])]);
    k.send(ApiKey::ListOffsets, 9, &req);
    let r: ListOffsetsResponse = k.read(9);
    let p = &r.topics[0].partitions[0];
    assert_eq!(p.error_code, 0, "ListOffsets {timestamp} of {topic}: {p:?}");
    p.offset
}

/// The same through Azure Blob Storage (Azurite): 20 MiB uploaded,
/// local disk trimmed, every record read back from offset 0 — most from
/// the container.
#[test]
fn a_tiered_topic_on_azure_blob_storage_replays_every_record() {
    let az = AzureServer::start("weir-az");
    let dir = tempfile::tempdir().unwrap();
    let b = start(dir.path(), &az.flags("weir-az"));
    create_tiered(&b, "logs");
    const N: u64 = 20_000;
    let addr = b.listen;
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        produce(&c, "logs", 0, N).await;
    });
    wait_uploaded(&b, dir.path(), "logs");
    assert!(metric(&b, "weir_remote_uploads_total") >= 15.0);
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        assert_eq!(read_all(&c, "logs", 0, N).await, 0);
        let d = c.describe_topic("logs").await.unwrap();
        assert!(d.partitions[0].local_log_start_offset >= 15_000, "{d:?}");
    });
    assert!(metric(&b, "weir_remote_fetches_total") > 0.0);
}

/// The object store stopped (SIGSTOP) under load: produce goes on, a read
/// of a remote segment fails fast with a retriable error, uploads fail
/// (their requests time out, their retries give up) and local segments
/// wait; resumed, uploads catch up and everything reads back. The issue
/// stops the store for 60 s against the default timeouts (a request 30 s,
/// its retries 60 s); here 6 s against 1 s and 2 s: the same failures,
/// sooner.
#[test]
fn with_the_object_store_stopped_produce_goes_on_and_remote_reads_fail_fast() {
    let s3 = S3Server::start("weir-b");
    let dir = tempfile::tempdir().unwrap();
    let mut flags = s3.flags("weir-b");
    for (flag, ms) in [
        ("--remote-read-timeout-ms", "2000"),
        ("--remote-request-timeout-ms", "1000"),
        ("--remote-retry-timeout-ms", "2000"),
    ] {
        flags.extend([flag.to_string(), ms.to_string()]);
    }
    let b = start(dir.path(), &flags);
    create_tiered(&b, "logs");
    let addr = b.listen;
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        produce(&c, "logs", 0, 10_000).await;
    });
    wait_uploaded(&b, dir.path(), "logs");
    s3.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        produce(&c, "logs", 10_000, 20_000).await;
        let t = Instant::now();
        let e = c.fetch("logs", 0, 0, 1 << 20, 0).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::RemoteStorageError), "{e}");
        assert!(ErrorCode::RemoteStorageError.is_retriable());
        assert!(
            t.elapsed() < Duration::from_secs(6),
            "failed fast: {:?}",
            t.elapsed()
        );
    });
    assert!(
        local_bytes(dir.path(), "logs") > 8 << 20,
        "segments not uploaded stay on local disk"
    );
    // Held until uploads have failed (timed out, retries given up), and
    // 6 s at least.
    wait_until(
        Instant::now() + Duration::from_secs(30),
        "an upload failed while the store is stopped",
        || metric(&b, "weir_remote_upload_errors_total") >= 1.0,
    );
    if let Some(rest) = Duration::from_secs(6).checked_sub(stopped.elapsed()) {
        std::thread::sleep(rest);
    }
    s3.signal(libc::SIGCONT);
    wait_uploaded(&b, dir.path(), "logs");
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        read_all(&c, "logs", 0, 20_000).await;
    });
}

/// SIGKILL mid-upload, 20 rounds (local-directory backend): afterwards
/// every acknowledged record reads back, and the remote folder holds only
/// whole segments — one upload per base offset, each with all its
/// objects: what a killed upload left was cleaned up. DeleteRecords
/// below the local log start then moves the log start into the remote
/// tier and deletes the remote segments below it; deleting the topic
/// deletes them all.
#[test]
fn sigkill_mid_upload_leaves_no_half_segment_served_or_kept() {
    let dir = tempfile::tempdir().unwrap();
    let remote = dir.path().join("remote");
    let flags = vec![
        "--remote-storage".to_string(),
        format!("file://{}", remote.display()),
    ];
    let data = dir.path().join("data");
    let mut b = start(&data, &flags);
    create_tiered(&b, "logs");
    let mut acked = 0u64;
    for round in 0..20u64 {
        let addr = b.listen;
        runtime().block_on(async {
            let c = Client::connect(addr).await.unwrap();
            produce(&c, "logs", acked, acked + 2_000).await;
        });
        acked += 2_000;
        // Killed while the last rounds' segments upload.
        std::thread::sleep(Duration::from_millis(20 * (round % 7)));
        b.kill();
        b = start(&data, &flags);
    }
    wait_uploaded(&b, &data, "logs");
    let addr = b.listen;
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        read_all(&c, "logs", 0, acked).await;
    });
    // Whole segments only, one per base offset.
    let mut logs = std::collections::BTreeMap::<String, usize>::new();
    let mut objects = 0;
    for part in walk(&remote) {
        let name = part.file_name().unwrap().to_string_lossy().into_owned();
        let (stem, _) = name.rsplit_once('.').unwrap();
        *logs.entry(stem.to_string()).or_default() += 1;
        objects += 1;
    }
    let bases: Vec<&str> = logs.keys().map(|k| &k[..20]).collect();
    let distinct: std::collections::BTreeSet<_> = bases.iter().collect();
    assert_eq!(
        distinct.len(),
        bases.len(),
        "one upload per base offset: {logs:?}"
    );
    assert!(
        logs.values().all(|&n| n == 5),
        "every segment whole: {logs:?}"
    );
    assert!(objects >= 5 * 30);
}

/// `--remote-log-manager-copy-max-bytes-per-second` holds a node's
/// uploads to its rate: 5 MiB of closed segments take at least 4 s to
/// reach the remote tier at 1 MiB/s (without the cap, a directory store
/// takes them in about a second); the waits are counted; every record is
/// read back afterwards.
#[test]
fn uploads_keep_to_the_copy_rate_cap() {
    let dir = tempfile::tempdir().unwrap();
    let flags = vec![
        "--remote-storage".to_string(),
        format!("file://{}", dir.path().join("remote").display()),
        "--remote-log-manager-copy-max-bytes-per-second".to_string(),
        (1u64 << 20).to_string(),
    ];
    let data = dir.path().join("data");
    let b = start(&data, &flags);
    create_tiered(&b, "capped");
    let started = Instant::now();
    let addr = b.listen;
    // ~7.6 MiB: seven 1 MiB segments close.
    let records = 8_000;
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        produce(&c, "capped", 0, records).await;
    });
    let uploaded = 5u64 << 20;
    wait_until(
        Instant::now() + Duration::from_secs(60),
        "5 MiB of segments uploaded",
        || metric(&b, "weir_remote_uploaded_bytes_total") >= uploaded as f64,
    );
    let took = started.elapsed();
    // The first batch goes at once; every later byte waits its turn.
    let batch = 100 * (VALUE_BYTES as u64 + 100);
    let least = Duration::from_secs_f64((uploaded - batch) as f64 / (1u64 << 20) as f64);
    assert!(
        took >= least,
        "{uploaded} bytes uploaded in {took:?} at a cap of 1 MiB/s (at least {least:?})"
    );
    assert!(metric(&b, "weir_remote_copy_throttle_seconds_total") > 1.0);
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        read_all(&c, "capped", 0, records).await;
    });
}

/// A share group on a tiered topic starts at the remote log's start and
/// acquires records from the remote tier: every one of 8 MiB, most of it
/// remote only, delivered once to an SDK share consumer.
#[test]
fn a_share_group_reads_a_tiered_topic_from_the_remote_tier() {
    use weir_client::{ShareConsumer, ShareConsumerConfig};
    let dir = tempfile::tempdir().unwrap();
    let flags = vec![
        "--remote-storage".to_string(),
        format!("file://{}", dir.path().join("remote").display()),
        "--share-auto-offset-reset".to_string(),
        "earliest".to_string(),
    ];
    let data = dir.path().join("data");
    let b = start(&data, &flags);
    create_tiered(&b, "shared");
    let addr = b.listen;
    const N: u64 = 8_000;
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        produce(&c, "shared", 0, N).await;
    });
    wait_until(
        Instant::now() + Duration::from_secs(60),
        "most of the topic remote only",
        || {
            runtime().block_on(async {
                let c = Client::connect(addr).await.unwrap();
                let d = c.describe_topic("shared").await.unwrap();
                d.partitions[0].local_log_start_offset >= 3_000
            })
        },
    );
    let mut seen = vec![0u32; N as usize];
    runtime().block_on(async {
        let mut config = ShareConsumerConfig::new("tiered-share");
        config.max_wait = Duration::from_millis(200);
        let mut c = ShareConsumer::new(Client::connect(addr).await.unwrap(), config);
        c.subscribe(&["shared"]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut got = 0;
        while got < N && Instant::now() < deadline {
            for r in c.poll(Duration::from_millis(300)).await.unwrap() {
                let v = r.record.value.as_deref().unwrap();
                let off: u64 = std::str::from_utf8(&v[..8]).unwrap().parse().unwrap();
                assert_eq!(off, r.record.offset, "value and offset agree");
                seen[off as usize] += 1;
                got += 1;
            }
        }
        c.close().await.unwrap();
    });
    assert!(
        seen.iter().all(|&n| n == 1),
        "every record once; first missing or repeated: {:?}",
        seen.iter().position(|&n| n != 1)
    );
    assert!(metric(&b, "weir_remote_fetches_total") > 0.0);
}

/// The orphan sweep: an object under the partition's remote folder whose
/// segment id no metadata names (a deposed leader's late write) is
/// deleted once 10 minutes old; a fresh one, and every segment the
/// metadata names, stay; every record reads back.
#[test]
fn the_sweep_deletes_old_objects_no_metadata_names_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let remote = dir.path().join("remote");
    let flags = vec![
        "--remote-storage".to_string(),
        format!("file://{}", remote.display()),
        "--remote-log-orphan-sweep-ms".to_string(),
        "100".to_string(),
    ];
    let data = dir.path().join("data");
    let b = start(&data, &flags);
    create_tiered(&b, "swept");
    let addr = b.listen;
    let records = 4_000;
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        produce(&c, "swept", 0, records).await;
    });
    wait_until(
        Instant::now() + Duration::from_secs(60),
        "segments uploaded",
        || metric(&b, "weir_remote_uploads_total") >= 2.0,
    );
    let logs = |dir: &Path| -> Vec<PathBuf> {
        walk(dir)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect()
    };
    let real = logs(&remote);
    let folder = real[0].parent().unwrap().to_path_buf();
    let stray = |name: &str, age: Duration| {
        let path = folder.join(name);
        let f = std::fs::File::create(&path).unwrap();
        f.set_modified(std::time::SystemTime::now() - age).unwrap();
        path
    };
    let old = stray(
        "00000000000000000000-0123456789abcdef0123456789abcdef.log",
        Duration::from_secs(3_600),
    );
    let fresh = stray(
        "00000000000000000000-fedcba9876543210fedcba9876543210.index",
        Duration::ZERO,
    );
    // The count follows the deletion's answer, which reaches the core
    // after the file is gone: waited for, then the file looked at.
    wait_until(
        Instant::now() + Duration::from_secs(30),
        "the old orphan deleted and counted",
        || metric(&b, "weir_remote_orphans_deleted_total") >= 1.0,
    );
    assert!(!old.exists(), "the old orphan is gone");
    assert!(fresh.exists(), "a fresh object is not swept yet");
    let now = logs(&remote);
    assert!(
        real.iter().all(|p| now.contains(p)),
        "every named segment stays: {real:?} {now:?}"
    );
    runtime().block_on(async {
        let c = Client::connect(addr).await.unwrap();
        read_all(&c, "swept", 0, records).await;
    });
}

pub(crate) fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A topic cannot be tiered on a broker without an object store, nor be
/// compacted and tiered.
#[test]
fn tiering_needs_an_object_store_and_a_delete_policy() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 1);
    let r = b
        .client()
        .create_topic("t", 1, &[("remote.storage.enable", "true")]);
    assert_ne!(r.error, 0);
    assert!(msg(&r).contains("--remote-storage"), "{r:?}");
    drop(b);
    let dir = tempfile::tempdir().unwrap();
    let flags = vec![
        "--remote-storage".to_string(),
        format!("file://{}", dir.path().join("remote").display()),
    ];
    let b = start(&dir.path().join("data"), &flags);
    let r = b.client().create_topic(
        "t",
        1,
        &[
            ("remote.storage.enable", "true"),
            ("cleanup.policy", "compact"),
        ],
    );
    assert!(msg(&r).contains("cleanup.policy=compact"), "{r:?}");
    let r = b.client().create_topic(
        "t",
        1,
        &[
            ("remote.storage.enable", "true"),
            ("retention.bytes", "1000000"),
            ("local.retention.bytes", "2000000"),
        ],
    );
    assert!(msg(&r).contains("at most retention.bytes"), "{r:?}");
}

fn msg(r: &weir_proto::messages::TopicResult) -> &str {
    r.message.as_deref().unwrap_or_default()
}

/// Transactions in remote segments: 10 committed and 10 aborted
/// transactions interleaved, then enough records to push them all out of
/// local disk; a read_committed SDK consumer replaying from offset 0 (all
/// of it from the remote tier, the aborted transactions known from the
/// segments' `.txnindex` objects) gets every committed record and no
/// aborted one; read_uncommitted gets both.
#[test]
fn read_committed_replays_from_the_remote_tier_skip_aborted_transactions() {
    use weir_client::transactional::TransactionalProducer;
    use weir_client::{
        ClientConfig, Consumer, ConsumerConfig, IsolationLevel, Producer, ProducerConfig,
        ProducerRecord,
    };
    let dir = tempfile::tempdir().unwrap();
    let flags = vec![
        "--remote-storage".to_string(),
        format!("file://{}", dir.path().join("remote").display()),
    ];
    let data = dir.path().join("data");
    let b = start(&data, &flags);
    let r = b.client().create_topic(
        "tx",
        1,
        &[
            ("remote.storage.enable", "true"),
            ("segment.bytes", "65536"),
            ("local.retention.bytes", "65536"),
        ],
    );
    assert_eq!(r.error, 0, "{r:?}");
    let addr = b.listen;
    let pad = "p".repeat(400);
    let rt = runtime();
    let end = rt.block_on(async {
        let p = TransactionalProducer::connect(
            addr,
            ClientConfig::default(),
            ProducerConfig::default(),
            "tiered-tx",
        )
        .await
        .unwrap();
        p.init_transactions().await.unwrap();
        for round in 0..10 {
            for (kind, commit) in [("c", true), ("a", false)] {
                p.begin_transaction().unwrap();
                let mut acks = Vec::new();
                for i in 0..50 {
                    let v = format!("{kind}{round}-{i}-{pad}");
                    acks.push(
                        p.send(ProducerRecord::new("tx", v).partition(0))
                            .await
                            .unwrap(),
                    );
                }
                for a in acks {
                    a.await.unwrap();
                }
                if commit {
                    p.commit_transaction().await.unwrap();
                } else {
                    p.abort_transaction().await.unwrap();
                }
            }
        }
        // Plain records after them, so that their segments close and go.
        let plain = Producer::new(
            Client::connect(addr).await.unwrap(),
            ProducerConfig::default(),
        );
        let mut acks = Vec::new();
        for i in 0..1_000 {
            acks.push(
                plain
                    .send(ProducerRecord::new("tx", format!("t{i}-{pad}")).partition(0))
                    .await
                    .unwrap(),
            );
        }
        let (mut first, mut last) = (None, 0);
        for a in acks {
            last = a.await.unwrap().offset.unwrap();
            first.get_or_insert(last);
        }
        plain.close().await;
        (first.unwrap(), last)
    });
    let (first_plain, end) = end;
    // Every transaction's records (and markers: all below the first plain
    // record) are remote only. How the plain records are batched (and so
    // where segments roll) depends on timing: the local log start is
    // compared with where the transactions end, not with a fixed offset.
    wait_until(
        Instant::now() + Duration::from_secs(30),
        "the transactions' segments are remote only",
        || {
            rt.block_on(async {
                let c = Client::connect(addr).await.unwrap();
                let d = c.describe_topic("tx").await.unwrap();
                d.partitions[0].local_log_start_offset >= first_plain
            })
        },
    );
    let read = |isolation| {
        rt.block_on(async {
            let mut config = ConsumerConfig::default();
            config.isolation_level = isolation;
            let mut c = Consumer::new(Client::connect(addr).await.unwrap(), config);
            c.assign(vec![("tx".to_string(), 0)]);
            c.seek_to_beginning(&[("tx".to_string(), 0)]).await.unwrap();
            let mut got = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut at = 0;
            while at < end && Instant::now() < deadline {
                for r in c.poll(Duration::from_millis(200)).await.unwrap() {
                    at = r.offset;
                    let v = String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned();
                    got.push(
                        v.split('-').next().unwrap().to_string()
                            + "-"
                            + v.split('-').nth(1).unwrap(),
                    );
                }
            }
            got
        })
    };
    let committed = read(IsolationLevel::ReadCommitted);
    assert_eq!(committed.iter().filter(|v| v.starts_with('c')).count(), 500);
    assert_eq!(
        committed.iter().filter(|v| v.starts_with('a')).count(),
        0,
        "no aborted record"
    );
    assert_eq!(
        committed.iter().filter(|v| v.starts_with('t')).count(),
        1_000
    );
    let all = read(IsolationLevel::ReadUncommitted);
    assert_eq!(all.iter().filter(|v| v.starts_with('a')).count(), 500);

    // Each remote segment came with its producers' state as of its end,
    // built on the one before: the transactional producer of the first
    // segments is in every later snapshot, with no transaction open at
    // the last.
    use weir_storage::producer_state::ProducerStateTable;
    let mut snapshots: Vec<(u64, u64, ProducerStateTable)> = walk(&dir.path().join("remote"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "snapshot"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let base: u64 = name[..20].parse().unwrap();
            let (at, t) = ProducerStateTable::decode(&std::fs::read(&p).unwrap()).unwrap();
            (base, at, t)
        })
        .collect();
    snapshots.sort_by_key(|s| s.0);
    assert!(snapshots.len() >= 2, "{} snapshots", snapshots.len());
    for w in snapshots.windows(2) {
        assert_eq!(
            w[0].1, w[1].0,
            "a snapshot is at its segment's end, the next one's base"
        );
    }
    let first: Vec<i64> = snapshots[0].2.iter().map(|(pid, _)| pid).collect();
    assert!(!first.is_empty());
    for (base, _, t) in &snapshots {
        assert!(t.transactional(), "the snapshot of {base}");
        for pid in &first {
            assert!(
                t.get(*pid).is_some(),
                "producer {pid} in the snapshot of {base}"
            );
        }
    }
    assert_eq!(snapshots.last().unwrap().2.open_transactions().count(), 0);
}
