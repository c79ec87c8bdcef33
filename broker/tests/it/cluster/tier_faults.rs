//! Tiered storage in a three-node cluster (issue 34's acceptance): a
//! topic of RF 3 whose segments the leader uploads to a shared object
//! store (a directory every node names with `--remote-storage`); the
//! leader is SIGKILLed while it uploads. The new leader continues from the
//! remote metadata: the remote log ends up contiguous — one upload per
//! base offset, none skipped, none twice — every acknowledged record reads
//! back from offset 0, and the followers too keep only the local
//! retention's bytes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::{leader_and_followers, serial, Cluster};
use crate::common::{self, wait_until};
use crate::tiered::{local_bytes, produce, read_all, walk};

/// The base offsets of the uploaded `.log` objects (with duplicates).
fn remote_bases(dir: &std::path::Path) -> Vec<u64> {
    if !dir.exists() {
        return Vec::new();
    }
    walk(dir)
        .iter()
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_string();
            name.ends_with(".log").then(|| name[..20].parse().unwrap())
        })
        .collect()
}

#[test]
fn a_new_leader_resumes_uploads_without_duplicating_or_skipping_segments() {
    let _serial = serial();
    let mut c = Cluster::new(3);
    let remote = c.root.path().join("remote");
    c.env.push((
        "WEIR_REMOTE_STORAGE".into(),
        format!("file://{}", remote.display()),
    ));
    c.env
        .push(("WEIR_REMOTE_LOG_TASK_INTERVAL_MS".into(), "100".into()));
    c.start_all();
    c.converged(&[1, 2, 3], Duration::from_secs(20));
    c.create_topic(
        "logs",
        1,
        3,
        &[
            "min.insync.replicas=2",
            "remote.storage.enable=true",
            "segment.bytes=1048576",
            "local.retention.bytes=4194304",
            "retention.ms=-1",
        ],
    );
    c.isr_full("logs", 3, Duration::from_secs(10));
    let (leader, followers) = leader_and_followers(&c.partition_rows("logs")[0]);
    let rt = common::runtime();
    const HALF: u64 = 12_000;
    let at = c.nodes[&leader].listen;
    rt.block_on(async {
        let cl = weir_client::Client::connect(at).await.unwrap();
        produce(&cl, "logs", 0, HALF).await;
    });
    // Killed while its uploads run (a pass every 100 ms, a segment each
    // few ms): some segments are remote, the last ones not yet.
    wait_until(
        Instant::now() + Duration::from_secs(30),
        "a first upload",
        || !remote_bases(&remote).is_empty(),
    );
    c.nodes.remove(&leader).unwrap().kill();
    let new = wait_until(
        Instant::now() + Duration::from_secs(30),
        "another node leads logs-0",
        || {
            let row = c.partition_rows("logs")[0].clone();
            match row[1].parse::<u64>() {
                Ok(l) if l != leader && l != 0 => Ok(l),
                _ => Err(format!("no failover: {row:?}")),
            }
        },
    );
    let at = c.nodes[&new].listen;
    rt.block_on(async {
        let cl = weir_client::Client::connect(at).await.unwrap();
        produce(&cl, "logs", HALF, 2 * HALF).await;
    });
    // Every closed segment below the high watermark uploaded, what the
    // killed leader left cleaned up: one upload per base offset.
    let bases = wait_until(
        Instant::now() + Duration::from_secs(60),
        "the remote log covers the records, each segment once",
        || {
            let bases = remote_bases(&remote);
            let distinct: BTreeSet<u64> = bases.iter().copied().collect();
            let covered = distinct.last().copied().unwrap_or(0) >= 2 * HALF - 2_000;
            if covered && distinct.len() == bases.len() {
                Ok(distinct)
            } else {
                Err(format!("{bases:?}"))
            }
        },
    );
    eprintln!("remote bases: {bases:?}");
    assert!(bases.len() >= 20, "{bases:?}");
    rt.block_on(async {
        let cl = weir_client::Client::connect(at).await.unwrap();
        assert_eq!(read_all(&cl, "logs", 0, 2 * HALF).await, 0);
        let d = cl.describe_topic("logs").await.unwrap();
        let p = &d.partitions[0];
        assert_eq!(p.remote_segments as usize, bases.len(), "{p:?} {bases:?}");
    });
    // Followers never upload, and keep only the local retention.
    for id in followers.iter().chain([&new]) {
        let dir = &c.nodes[id].data_dir;
        wait_until(
            Instant::now() + Duration::from_secs(30),
            format!("node {id} keeps the local retention"),
            || local_bytes(dir, "logs") <= 8 << 20,
        );
    }
}
