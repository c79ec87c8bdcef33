//! A core's sync group: the files its flush rounds ask to sync at about the
//! same time share one sync (one `syncfs` for several files). What a
//! power loss keeps is checked by `power_loss::rounds_synced_with_another_log_…`;
//! here: that the syncs are shared (and not without the group), and that a
//! failed sync of the group fails every append it covered — none
//! acknowledged, each log offline — while what was acknowledged before
//! survives a reopen. (Whether that failed sync was a `syncfs` or an
//! fdatasync depends on when each log's write completed: the failure
//! path of `syncfs` is the same code as its success path's, which the
//! power-loss case checks.)

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::*;
use weir_storage::{LogConfig, PartitionLog, ShardConfig, StorageError, StorageShard};

/// Logs appended to at once.
const LOGS: usize = 8;
/// Rounds of one append per log.
const ROUNDS: u64 = 20;

const DIR_VAR: &str = "WEIR_SYNC_GROUP_CHILD_DIR";

fn log_dir(root: &Path, i: usize) -> PathBuf {
    root.join(format!("t-{i}"))
}

/// Opens `LOGS` logs, then appends one batch to each, all at once, `rounds`
/// times (each batch acknowledged once durable: `flush.messages` 1).
/// Returns the shard's (sync calls, shared syncs) over the appends.
async fn append_to_all(shard: &StorageShard, root: &Path, rounds: u64) -> (u64, u64) {
    let mut logs = Vec::new();
    for i in 0..LOGS {
        let (log, _) = PartitionLog::open(shard, &log_dir(root, i), LogConfig::default())
            .await
            .expect("open");
        logs.push(log);
    }
    let before = shard.stats();
    for r in 0..rounds {
        let tasks: Vec<_> = logs
            .iter()
            .map(|log| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    log.append_acked(batch(1, &payload(r, 1000), 0)).await
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("append");
        }
    }
    let after = shard.stats();
    for log in logs {
        assert_eq!(log.high_watermark(), rounds);
        log.close().await.unwrap();
    }
    (
        after.fdatasyncs - before.fdatasyncs,
        after.shared_syncs - before.shared_syncs,
    )
}

#[test]
fn a_round_over_several_logs_is_one_sync() {
    run(|| async {
        let tmp = tempfile::tempdir().unwrap();
        let shard = StorageShard::new(ShardConfig::default());
        let (syncs, shared) = append_to_all(&shard, tmp.path(), ROUNDS).await;
        // A round's eight files share syncs: on average at least two files
        // a sync (a round is split when a log's write completes after a
        // sync began — on a loaded machine more often; without the group
        // it is one sync per file, `LOGS` a round).
        eprintln!("{syncs} syncs ({shared} shared) for {ROUNDS} rounds over {LOGS} logs");
        assert!(
            syncs <= ROUNDS * LOGS as u64 / 2 && shared > 0,
            "{syncs} syncs ({shared} shared) for {ROUNDS} rounds over {LOGS} logs"
        );
        // Everything is there after a reopen.
        let shard = StorageShard::new(ShardConfig::default());
        for i in 0..LOGS {
            let (log, _) =
                PartitionLog::open(&shard, &log_dir(tmp.path(), i), LogConfig::default())
                    .await
                    .unwrap();
            let got = read_to_end(&log, 0, 1 << 20).await.unwrap();
            assert_eq!(got.len() as u64, ROUNDS, "log {i}");
            for (r, (base, bytes)) in got.iter().enumerate() {
                assert_eq!(*base, r as u64);
                assert_eq!(
                    bytes[..],
                    stored(batch(1, &payload(r as u64, 1000), 0), *base)[..]
                );
            }
        }
    });
}

#[test]
fn without_the_group_each_file_is_synced_on_its_own() {
    run(|| async {
        let tmp = tempfile::tempdir().unwrap();
        let shard = StorageShard::new(ShardConfig {
            sync_group: false,
            ..ShardConfig::default()
        });
        let (syncs, shared) = append_to_all(&shard, tmp.path(), ROUNDS).await;
        assert_eq!(shared, 0);
        assert_eq!(
            syncs,
            ROUNDS * LOGS as u64,
            "one fdatasync per log per round"
        );
    });
}

/// The child: an acknowledged append to every log, then (its syncs failing
/// with EIO from the trigger file on) one more append to each, all logs at
/// once — the syncs they ask for share passes of the core's sync group
/// (how many files a pass takes depends on when each write completes).
#[test]
fn sync_group_child() {
    let Some(root) = std::env::var_os(DIR_VAR) else {
        return;
    };
    let root = PathBuf::from(root);
    println!();
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        let mut logs = Vec::new();
        for i in 0..LOGS {
            let (log, _) = PartitionLog::open(&shard, &log_dir(&root, i), LogConfig::default())
                .await
                .expect("open");
            log.append_acked(batch(1, &payload(0, 1500), 0))
                .await
                .expect("the first append, before the fault");
            logs.push(log);
        }
        std::fs::write(root.join("eio"), b"").unwrap();
        let tasks: Vec<_> = logs
            .iter()
            .map(|log| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    log.append_acked(batch(1, &payload(1, 1500), 0)).await
                })
            })
            .collect();
        for (i, t) in tasks.into_iter().enumerate() {
            match t.await {
                Ok(info) => println!("ACKED {i} {}", info.base_offset),
                Err(e) => {
                    // The failed sync itself, or the log it took offline.
                    assert!(
                        matches!(e, StorageError::Io { .. } | StorageError::Offline { .. }),
                        "{e:?}"
                    );
                    println!("FAILED {i} {e}");
                }
            }
        }
        // Each log is offline now: a later append is refused too.
        for (i, log) in logs.iter().enumerate() {
            match log.append_acked(batch(1, &payload(3, 1500), 0)).await {
                Ok(info) => println!("ACKED {i} {}", info.base_offset),
                Err(e) => println!("REFUSED {i} {e}"),
            }
        }
        std::io::stdout().flush().unwrap();
        std::process::exit(0);
    });
}

#[test]
fn a_failed_sync_of_the_group_fails_every_append_it_covered() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let out = child_test(&test_name(module_path!(), "sync_group_child"))
        .env(DIR_VAR, &root)
        .env(weir_storage::testing::FDATASYNC_EIO_ENV, root.join("eio"))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("child runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {text}");
    let count = |p: &str| text.lines().filter(|l| l.starts_with(p)).count();
    assert_eq!(
        count("ACKED "),
        0,
        "nothing acknowledged after the fault: {text}"
    );
    assert_eq!(count("FAILED "), LOGS, "{text}");
    assert_eq!(count("REFUSED "), LOGS, "{text}");
    // Each failed in a sync (a syncfs for a pass of several files, an
    // fdatasync for a pass of one), which its error names.
    for l in text.lines().filter(|l| l.starts_with("FAILED ")) {
        assert!(
            (l.contains("syncfs") || l.contains("fdatasync")) && l.contains("I/O error"),
            "not a failed sync: {l}"
        );
    }
    // What was acknowledged before the fault is there; what failed is not
    // acknowledged, and a reopen keeps at most what reached the disk.
    std::fs::remove_file(root.join("eio")).unwrap();
    run(move || async move {
        let shard = StorageShard::new(ShardConfig::default());
        for i in 0..LOGS {
            let (log, _) = PartitionLog::open(&shard, &log_dir(&root, i), LogConfig::default())
                .await
                .expect("reopen");
            let got = read_to_end(&log, 0, 1 << 20).await.unwrap();
            assert!(
                (1..=2).contains(&got.len()),
                "log {i}: {} batches",
                got.len()
            );
            assert_eq!(got[0].1[..], stored(batch(1, &payload(0, 1500), 0), 0)[..]);
        }
    });
}
