//! Crash safety with a real process kill.
//!
//! A child process (this test binary, running only `crash::crash_child`)
//! appends numbered batches to a log with several concurrent appenders and
//! prints `ACK <i> <base offset>` after each `append_acked` returns. The parent
//! kills it with SIGKILL after a random number of acknowledgements, reopens
//! the log and checks that every acknowledged batch is there, byte for
//! byte, at its offset, that offsets are contiguous and that the whole log
//! reads without error. Rounds append to the same directory, so logs that
//! were already recovered (and some cleanly closed) are recovered again.
//!
//! Replay a failure with `WEIR_CRASH_TEST_SEED=<seed printed on failure>`
//! (the kill moment still depends on timing); soak with
//! `WEIR_CRASH_ROUNDS=<n>`; keep the log for a post-mortem with
//! `WEIR_CRASH_KEEP_DIR=<empty dir>`.

use crate::common;

use std::cell::Cell;
use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use weir_proto::batch::BatchHeader;
use weir_storage::{LogConfig, PartitionLog, ShardConfig, StorageShard};

const DIR_VAR: &str = "WEIR_CRASH_CHILD_DIR";
const SEED_VAR: &str = "WEIR_CRASH_SEED";
const FIRST_VAR: &str = "WEIR_CRASH_FIRST";
const PREALLOC_VAR: &str = "WEIR_CRASH_PREALLOC";

/// Concurrent appenders in the child.
const APPENDERS: usize = 4;
/// Bounds of one child's run (it is normally killed long before).
const CHILD_MAX_BATCHES: u64 = 20_000;
const CHILD_MAX_TIME: Duration = Duration::from_secs(20);
/// Largest payload of a numbered batch (segments are 64 KiB, so some
/// batches are larger than a segment).
const MAX_LEN: usize = 70_000;
/// Rounds: at least `MIN_ROUNDS`, at most `ROUNDS`, within `BUDGET`.
const ROUNDS: u64 = 30;
const MIN_ROUNDS: u64 = 10;
const BUDGET: Duration = Duration::from_secs(45);
/// How long the parent waits for a line from the child before calling it hung.
const LINE_TIMEOUT: Duration = Duration::from_secs(40);

fn config() -> LogConfig {
    let mut c = LogConfig::default();
    c.set("segment.bytes", "65536").unwrap();
    c.set("index.interval.bytes", "2048").unwrap();
    // Batch timestamps are from 1970: no roll by age when a child reopens
    // the log, so it appends to the segment recovery just repaired.
    c.set("segment.ms", &i64::MAX.to_string()).unwrap();
    c
}

fn shard_config(prealloc_step: u64) -> ShardConfig {
    ShardConfig {
        prealloc_step,
        ..ShardConfig::default()
    }
}

fn env_u64(var: &str) -> u64 {
    std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} is set"))
        .parse()
        .unwrap_or_else(|_| panic!("{var} is a number"))
}

/// The child: appends until killed (or its bounds run out, then closes).
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(DIR_VAR) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let (seed, first, prealloc) = (env_u64(SEED_VAR), env_u64(FIRST_VAR), env_u64(PREALLOC_VAR));
    // End the harness's "test crash::crash_child ... " line.
    println!();
    run(move || async move {
        let shard = StorageShard::new(shard_config(prealloc));
        let (log, _) = PartitionLog::open(&shard, &dir, config())
            .await
            .expect("child opens the log");
        let next = Rc::new(Cell::new(first));
        let started = Instant::now();
        let tasks: Vec<_> = (0..APPENDERS)
            .map(|_| {
                let (log, next) = (log.clone(), next.clone());
                glommio::spawn_local(async move {
                    loop {
                        let i = next.get();
                        if i - first >= CHILD_MAX_BATCHES || started.elapsed() > CHILD_MAX_TIME {
                            break;
                        }
                        next.set(i + 1);
                        let info = log
                            .append_acked(numbered_batch(seed, i, MAX_LEN))
                            .await
                            .unwrap_or_else(|e| panic!("append of batch {i} failed: {e}"));
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "ACK {i} {}", info.base_offset).unwrap();
                        out.flush().unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
        log.close().await.expect("child closes the log");
    });
}

/// Runs one child, kills it after `kill_after` acknowledgements, and
/// returns every acknowledgement it printed (also those read after the kill).
fn run_child(
    path: &PathBuf,
    seed: u64,
    first: u64,
    prealloc: u64,
    kill_after: u64,
) -> Vec<(u64, u64)> {
    let mut child = child_test(&test_name(module_path!(), "crash_child"))
        .env(DIR_VAR, path)
        .env(SEED_VAR, seed.to_string())
        .env(FIRST_VAR, first.to_string())
        .env(PREALLOC_VAR, prealloc.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("child starts");
    let lines = line_reader(child.stdout.take().expect("piped stdout"));
    let mut acks = Vec::new();
    let mut killed = false;
    loop {
        match lines.recv_timeout(LINE_TIMEOUT) {
            // The harness's own lines and a line cut by the kill are skipped.
            Ok(line) => {
                let Some(ack) = parse_ack(&line) else {
                    continue;
                };
                acks.push(ack);
                if !killed && acks.len() as u64 >= kill_after {
                    child.kill().expect("SIGKILL the child");
                    killed = true;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "child printed nothing for {LINE_TIMEOUT:?}; acks so far: {}",
                    acks.len()
                );
            }
        }
    }
    let status = child.wait().expect("wait for the child");
    if killed {
        // It may have finished on its own just before the kill.
        assert!(
            status.signal() == Some(libc::SIGKILL) || status.success(),
            "child: {status}"
        );
    } else {
        assert!(status.success(), "child failed on its own: {status}");
    }
    acks
}

struct Verified {
    log_end: u64,
    batches: usize,
    truncated_bytes: u64,
    scanned_segments: usize,
}

/// Reopens the log and checks it against the acknowledgements.
fn verify(
    path: PathBuf,
    seed: u64,
    acked: BTreeMap<u64, u64>,
    prealloc: u64,
    max_bytes: u64,
    close: bool,
) -> Verified {
    run_ret(move || async move {
        let shard = StorageShard::new(shard_config(prealloc));
        let (log, rep) = PartitionLog::open(&shard, &path, config())
            .await
            .unwrap_or_else(|e| panic!("reopen after the kill failed: {e}"));
        assert_eq!(rep.log_start_offset, 0, "{rep:?}");
        let got = read_to_end(&log, 0, max_bytes)
            .await
            .unwrap_or_else(|e| panic!("recovered log does not read to its end: {e}"));
        let mut next = 0u64;
        let mut seen = HashSet::new();
        let mut by_base = BTreeMap::new();
        for (base, bytes) in &got {
            assert_eq!(*base, next, "offsets are not contiguous");
            let h = BatchHeader::peek(bytes).unwrap();
            let (i, s) = batch_number(bytes).expect("a numbered batch");
            assert_eq!(s, seed, "batch at {base} is not one the child wrote");
            assert!(seen.insert(i), "batch {i} is in the log twice");
            assert!(
                bytes[..] == stored(numbered_batch(seed, i, MAX_LEN), *base)[..],
                "batch {i} at offset {base} is not byte-identical"
            );
            by_base.insert(*base, i);
            next = h.last_offset() as u64 + 1;
        }
        assert_eq!(next, log.log_end_offset());
        assert_eq!(next, log.high_watermark());
        assert_eq!(next, rep.log_end_offset);
        for (base, i) in &acked {
            assert_eq!(
                by_base.get(base),
                Some(i),
                "acknowledged batch {i} at offset {base} was lost (log end {next})"
            );
        }
        // The end of the log reads as empty, not as an error.
        assert!(log.read(next, 1000).await.unwrap().batches.is_empty());
        if close {
            log.close().await.expect("clean close after recovery");
        }
        // Otherwise dropped as after a crash. Either way its files are
        // closed by glommio at its next I/O: run one before the executor
        // exits, or every round leaks a descriptor per segment file.
        drop(log);
        drain_file_closes(&path).await;
        Verified {
            log_end: next,
            batches: got.len(),
            truncated_bytes: rep.truncated_bytes,
            scanned_segments: rep.scanned_segments,
        }
    })
}

#[test]
fn acked_batches_survive_kill_9() {
    let seed = seed_from_env("WEIR_CRASH_TEST_SEED");
    eprintln!("crash test seed {seed} (replay with WEIR_CRASH_TEST_SEED={seed})");
    let mut rng = Rng::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    // WEIR_CRASH_KEEP_DIR=<dir> keeps the log there for a post-mortem.
    let path = match std::env::var_os("WEIR_CRASH_KEEP_DIR") {
        Some(d) => PathBuf::from(d).join("crash-0"),
        None => tmp.path().join("crash-0"),
    };
    let mut acked: BTreeMap<u64, u64> = BTreeMap::new();
    let started = Instant::now();
    // WEIR_CRASH_ROUNDS=<n> runs exactly n rounds (a soak).
    let soak: Option<u64> = std::env::var("WEIR_CRASH_ROUNDS")
        .ok()
        .map(|v| v.parse().expect("a number of rounds"));
    let mut rounds = 0;
    for round in 0..soak.unwrap_or(ROUNDS) {
        if soak.is_none() && round >= MIN_ROUNDS && started.elapsed() > BUDGET {
            break;
        }
        let kill_after = rng.range(1, 301);
        let prealloc = [0, 64 << 10, 32 << 20][rng.range(0, 3) as usize];
        let first = (round + 1) * 1_000_000;
        let acks = run_child(&path, seed, first, prealloc, kill_after);
        assert!(
            acks.len() as u64 >= kill_after,
            "round {round}: child ended early"
        );
        for &(i, base) in &acks {
            assert!((first..first + CHILD_MAX_BATCHES).contains(&i));
            assert!(
                acked.insert(base, i).is_none(),
                "offset {base} acknowledged twice"
            );
        }
        let max_bytes = [1, 3000, 64 << 10, 1 << 20][rng.range(0, 4) as usize];
        let close = rng.range(0, 3) == 0;
        let v = verify(
            path.clone(),
            seed,
            acked.clone(),
            [0, 32 << 20][rng.range(0, 2) as usize],
            max_bytes,
            close,
        );
        eprintln!(
            "round {round}: kill after {kill_after} (prealloc {prealloc}), {} acked, log end {}, \
             {} batches, {} segments scanned, {} bytes cut, closed cleanly: {close}",
            acks.len(),
            v.log_end,
            v.batches,
            v.scanned_segments,
            v.truncated_bytes
        );
        rounds += 1;
    }
    assert!(rounds >= soak.unwrap_or(MIN_ROUNDS).min(MIN_ROUNDS));
    eprintln!(
        "{rounds} rounds, {} acknowledged batches, {:?}",
        acked.len(),
        started.elapsed()
    );
}
