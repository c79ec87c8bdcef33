//! A full disk: appends fail with a clear error, never a panic, the log
//! stays readable and everything acknowledged survives a reopen.
//!
//! The failure is made with `RLIMIT_FSIZE` (with `SIGXFSZ` ignored, writes
//! and preallocations past the limit fail with `EFBIG`, or are cut short).
//! The limit is per process, so a child process (this test binary, running
//! only `io_errors::io_errors_child`) sets it and appends; it prints
//! `ACK <i> <base>` per acknowledged batch and `ERR <message>` for the first
//! failure. The parent then reopens the log without the limit and checks it.

use crate::common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use weir_proto::batch::BatchHeader;
use weir_storage::{LogConfig, PartitionLog, ShardConfig, StorageError, StorageShard};

const DIR_VAR: &str = "WEIR_IOERR_CHILD_DIR";
const PREALLOC_VAR: &str = "WEIR_IOERR_PREALLOC";
const SEED: u64 = 0x5eed;
/// The file size limit of the child.
const LIMIT: u64 = 2 << 20;
/// Largest payload of a batch: the limit is reached after some hundreds.
const MAX_LEN: usize = 20_000;
/// Bound of the append loop (the limit is reached long before).
const MAX_APPENDS: u64 = 5_000;
/// Appends tried after the first failure.
const RETRIES: u64 = 20;
/// How long the parent waits for a line from the child before calling it hung.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

fn config() -> LogConfig {
    // One segment: the limit is per file, so the active segment must reach it.
    LogConfig::default()
}

fn shard(prealloc_step: u64) -> StorageShard {
    StorageShard::new(ShardConfig {
        prealloc_step,
        ..ShardConfig::default()
    })
}

fn ack(i: u64, base: u64) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ACK {i} {base}").unwrap();
    out.flush().unwrap();
}

/// The batch the child appends as number `i`: after the first failure it
/// alternates small batches (which may still fit) and large ones.
fn child_batch(i: u64) -> bytes::BytesMut {
    if i >= MAX_APPENDS && (i - MAX_APPENDS) % 2 == 0 {
        numbered_batch(SEED, i, 200)
    } else {
        numbered_batch(SEED, i, MAX_LEN)
    }
}

/// Checks that the log holds exactly the acknowledged batches.
async fn check_acked(log: &PartitionLog, acked: &BTreeMap<u64, u64>, what: &str) {
    let got = read_to_end(log, 0, 1 << 20)
        .await
        .unwrap_or_else(|e| panic!("{what}: the log is not readable: {e}"));
    let mut next = 0;
    for (base, bytes) in &got {
        assert_eq!(*base, next, "{what}: offsets are not contiguous");
        let i = acked
            .get(base)
            .unwrap_or_else(|| panic!("{what}: batch at {base} was never acknowledged"));
        let want = stored(child_batch(*i), *base);
        assert!(bytes[..] == want[..], "{what}: batch {i} at {base} differs");
        next = BatchHeader::peek(bytes).unwrap().last_offset() as u64 + 1;
    }
    assert_eq!(
        got.len(),
        acked.len(),
        "{what}: acknowledged batches missing"
    );
    // (The log end may still count a failed batch until the log has
    // rolled back, which it does in the background.)
    assert_eq!(log.high_watermark(), next, "{what}: high watermark");
}

fn limit_file_size(limit: u64) {
    // SAFETY: plain libc calls with valid arguments; this process runs
    // only this test.
    unsafe {
        assert_ne!(libc::signal(libc::SIGXFSZ, libc::SIG_IGN), libc::SIG_ERR);
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut r), 0);
        r.rlim_cur = limit as libc::rlim_t;
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &r), 0);
    }
}

/// The child: appends under a file size limit until an append fails.
#[test]
fn io_errors_child() {
    let Some(dir) = std::env::var_os(DIR_VAR) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let prealloc: u64 = std::env::var(PREALLOC_VAR).unwrap().parse().unwrap();
    limit_file_size(LIMIT);
    // End the harness's "test io_errors::io_errors_child ... " line.
    println!();
    run(move || async move {
        let shard = shard(prealloc);
        let (log, _) = PartitionLog::open(&shard, &dir, config())
            .await
            .expect("open under the limit");
        let mut acked = BTreeMap::new();
        let mut first_err = None;
        for i in 0..MAX_APPENDS {
            match log.append_acked(numbered_batch(SEED, i, MAX_LEN)).await {
                Ok(info) => {
                    ack(i, info.base_offset);
                    acked.insert(info.base_offset, i);
                }
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        let e = first_err.expect("an append fails once the file reaches the limit");
        let msg = e.to_string();
        println!("ERR {msg}");
        assert!(matches!(e, StorageError::Io { .. }), "{e:?}");
        assert!(
            msg.contains("I/O error")
                && (msg.contains("File too large") || msg.contains("short write")),
            "the error names the I/O failure: {msg}"
        );
        assert!(!e.is_retriable());
        check_acked(&log, &acked, "after the failure").await;

        // More appends: each either succeeds (a small batch may still fit)
        // or fails with an error that says why; none panics.
        for k in 0..RETRIES {
            let i = MAX_APPENDS + k;
            match log.append_acked(child_batch(i)).await {
                Ok(info) => {
                    ack(i, info.base_offset);
                    acked.insert(info.base_offset, i);
                }
                Err(e) => {
                    let m = e.to_string();
                    println!("RETRY {k}: {m}");
                    assert!(
                        matches!(
                            e,
                            StorageError::Io { .. }
                                | StorageError::Recovering { .. }
                                | StorageError::Offline { .. }
                        ),
                        "{e:?}"
                    );
                    assert!(!m.is_empty());
                }
            }
        }
        check_acked(&log, &acked, "after the retries").await;
        match log.close().await {
            Ok(()) => println!("CLOSE ok"),
            Err(e) => println!("CLOSE {e}"),
        }
        drop(log);

        // Reopen under the same limit: recovery only cuts files.
        let shard = self::shard(prealloc);
        let (log, rep) = PartitionLog::open(&shard, &dir, config())
            .await
            .expect("reopen under the limit");
        println!("REOPEN {rep:?}");
        check_acked(&log, &acked, "after a reopen in the child").await;
        drop(log);
        println!("DONE");
    });
}

struct ChildRun {
    acked: BTreeMap<u64, u64>,
    err: Option<String>,
    done: bool,
    lines: Vec<String>,
}

fn run_child(dir: &Path, prealloc: u64) -> ChildRun {
    let mut child = child_test(&test_name(module_path!(), "io_errors_child"))
        .env(DIR_VAR, dir)
        .env(PREALLOC_VAR, prealloc.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("child starts");
    let lines = line_reader(child.stdout.take().unwrap());
    let mut run = ChildRun {
        acked: BTreeMap::new(),
        err: None,
        done: false,
        lines: Vec::new(),
    };
    loop {
        let line = match lines.recv_timeout(CHILD_TIMEOUT) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("child hung: {:#?}", run.lines);
            }
        };
        if let Some((i, base)) = parse_ack(&line) {
            assert!(run.acked.insert(base, i).is_none());
        } else if let Some(m) = line.strip_prefix("ERR ") {
            run.err = Some(m.trim_end().to_string());
        } else if line.starts_with("DONE") {
            run.done = true;
        }
        if !line.starts_with("ACK ") {
            run.lines.push(line.trim_end().to_string());
        }
    }
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "child failed ({status}): {:#?}",
        run.lines
    );
    run
}

fn check_in_parent(dir: PathBuf, acked: BTreeMap<u64, u64>, prealloc: u64) {
    run(move || async move {
        let shard = shard(prealloc);
        let (log, rep) = PartitionLog::open(&shard, &dir, config())
            .await
            .unwrap_or_else(|e| panic!("reopen without the limit: {e}"));
        let got = read_to_end(&log, 0, 1 << 20).await.unwrap();
        let mut next = 0;
        for (base, bytes) in &got {
            assert_eq!(*base, next);
            let i = acked[base];
            assert!(
                bytes[..] == stored(child_batch(i), *base)[..],
                "batch {i} at {base} differs"
            );
            next = BatchHeader::peek(bytes).unwrap().last_offset() as u64 + 1;
        }
        assert_eq!(got.len(), acked.len(), "{rep:?}");
        // Without the limit the log works again.
        for i in 0..50 {
            let b = numbered_batch(SEED ^ 1, i, MAX_LEN);
            let info = log.append_acked(b).await.unwrap();
            assert_eq!(info.base_offset, next);
            next = info.last_offset + 1;
        }
        log.close().await.unwrap();
        let shard = self::shard(prealloc);
        let (log, rep) = PartitionLog::open(&shard, &dir, config()).await.unwrap();
        assert!(rep.clean);
        assert_eq!(rep.log_end_offset, next);
        assert_eq!(
            read_to_end(&log, 0, 1 << 20).await.unwrap().len(),
            acked.len() + 50
        );
        log.close().await.unwrap();
    });
}

fn full_disk_case(prealloc: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("full-0");
    let r = run_child(&dir, prealloc);
    assert!(r.done, "child did not finish: {:#?}", r.lines);
    let err = r.err.expect("child reported the failure");
    eprintln!(
        "prealloc {prealloc}: {} acknowledged, error: {err}\n{:#?}",
        r.acked.len(),
        r.lines
    );
    if prealloc == 0 {
        // Without preallocation the limit is hit by a write, after data.
        assert!(r.acked.len() > 50, "{}", r.acked.len());
        let size: u64 = log_files(&dir)
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum();
        assert!(size <= LIMIT);
    }
    check_in_parent(dir, r.acked, prealloc);
}

#[test]
fn full_disk_without_preallocation() {
    full_disk_case(0);
}

#[test]
fn full_disk_while_preallocating_in_small_steps() {
    full_disk_case(256 << 10);
}

#[test]
fn full_disk_at_the_first_preallocation() {
    // The default step (32 MiB) is past the limit: the first append fails.
    full_disk_case(ShardConfig::default().prealloc_step);
}
