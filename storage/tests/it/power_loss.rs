//! Durability across a simulated power loss.
//!
//! A SIGKILL test (`crash.rs`) cannot catch a missing fdatasync: O_DIRECT
//! writes are in the device by the time they complete, and a killed process
//! loses nothing the kernel already has. Only a power loss drops writes that
//! were not synced. Real power loss needs a device that forgets unsynced
//! writes (dm-flakey `drop_writes`, dm-log-writes), i.e. kernel modules and
//! root on the test machine; this sandbox has neither reliably and CI
//! runners on a fresh machine do not either. So the disk is simulated.
//!
//! ## Method
//! The log runs on the real file system while [`Journal`] records, in
//! completion order, every file operation the storage crate makes under the
//! partition directory: writes (offset and bytes), truncations,
//! preallocations, file syncs (with the sequence number at which each was
//! *issued*: it only covers what completed before), creations, renames,
//! removals and directory fsyncs. After each `append_acked` returns (with
//! `flush.messages=1`), or each `flush()` (with a large `flush.messages`,
//! where the acknowledgement is the durable offset `flush()` returns), the
//! test marks the journal. Then, for a cut instant T, the directory is
//! rebuilt as a power loss at T would leave it:
//! * **names**: the namespace operations covered by the last directory
//!   fsync completed before T survive; of the later ones a random *prefix*
//!   survives (journaling file systems commit metadata in order);
//! * **data**, per file (inode, so renames carry it): every operation
//!   covered by the file's last sync completed before T survives; of the
//!   later ones each 4 KiB page of each write, and each size change,
//!   survives at random (all, none, or a coin per page — the last is the
//!   harshest: holes and torn multi-page writes).
//!
//! The image is written to a fresh directory, opened with
//! [`PartitionLog::open`], and every batch acknowledged before T must be
//! readable at its offset with identical bytes. Some cases truncate the log
//! (`truncate_to`, appends quiet) between two phases of appends: a batch
//! it removes is no longer expected once it began, and once it returned no
//! removed batch may come back. proptest draws the batch sizes, appenders,
//! segment size, preallocation, flush policy, truncation, the cut instants
//! and the page subsets.
//!
//! ## Proof that it catches the defect
//! [`weir_storage::testing::set_skip_fdatasync`] makes the flush round skip
//! its fdatasync but still advance the durable offset and acknowledge.
//! `a_skipped_fdatasync_is_caught` runs a fixed case with it and asserts that
//! a loss is found; the same case passes with the switch off.
//!
//! ## Not modelled
//! * Writes in flight at T (issued, not completed) are dropped whole; the
//!   tail writer re-sends identical bytes for the block it rewrites, so a
//!   torn rewrite could only tear new, unacknowledged bytes.
//! * Tearing inside a 4 KiB page (sector-level) and bit rot.
//! * Directories other than the partition's: `open` fsyncs the parent when
//!   it creates the partition directory, which this model does not see.
//! * Operations other than append, roll, the flush round, producer
//!   snapshots, `truncate_to` and close: retention, `delete_before` and
//!   compaction swaps are recorded by the same hooks but this harness does
//!   not drive them.
//! * Lying devices (a sync that returns before the data is stable).

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::Rng;
use common::*;
use proptest::prelude::*;
use weir_storage::testing::{IoOp, Journal};
use weir_storage::{LogConfig, PartitionLog, ShardConfig, StorageShard};

/// Page granularity of what survives of an unsynced write.
const PAGE_BYTES: usize = 4096;
/// Largest batch payload drawn.
const PAYLOAD_BYTES_MAX: usize = 12_000;
/// Most batches in one case.
const BATCHES_MAX: usize = 60;
/// Most concurrent appenders.
const APPENDERS_MAX: usize = 4;
/// Most cut instants tried per case.
const CUTS_MAX: usize = 10;
/// Bound of the neighbour log's appends in a case with one.
const NEIGHBOUR_APPENDS_MAX: u64 = 10_000;
/// proptest cases unless `PROPTEST_CASES` says otherwise.
const CASES_DEFAULT: u32 = 24;
/// `flush.messages` of the cases that acknowledge through `flush()`.
const FLUSH_MESSAGES_RELAXED: u64 = 1000;
/// Mark tag bit of a `flush()` result (the rest is the durable offset it
/// returned); other marks are batch numbers acknowledged by `append_acked`.
const FLUSHED: u64 = 1 << 63;
/// Mark tag of the start and the end of a `truncate_to`.
const TRUNCATION: u64 = 1 << 62;

/// What survives of the operations a sync did not cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// Nothing (the harshest for acknowledged data).
    None,
    /// Everything (what a process kill leaves).
    All,
    /// Each page and size change on a coin flip.
    Random,
}

/// One cut: where (a fraction of the journal, or right after an
/// acknowledgement), what survives, and the seed of the coin flips.
#[derive(Debug, Clone, Copy)]
struct Cut {
    at: f64,
    after_ack: bool,
    keep: Keep,
    seed: u64,
}

#[derive(Debug, Clone)]
struct Case {
    /// Payload size of each batch.
    sizes: Vec<usize>,
    appenders: usize,
    segment_bytes: u64,
    prealloc_step: u64,
    /// `None`: `flush.messages=1`, each `append_acked` acknowledges its
    /// batch durably. `Some(k)`: `flush.messages` is large, `append_acked`
    /// only means written, and every `k`-th batch an appender calls
    /// `flush()`, whose returned durable offset is what is acknowledged.
    flush_every: Option<usize>,
    /// `Some((fraction, back))`: after that fraction of the batches, the
    /// log is truncated to `back` records before its end (appends quiet),
    /// then the rest are appended.
    truncate: Option<(f64, u64)>,
    cuts: Vec<Cut>,
    /// `ShardConfig::write_through_bytes_min`: rounds at least this large
    /// are written through `O_DSYNC` (0: never).
    write_through_min: u64,
    /// Another log on the same core (not recorded) is appended to while
    /// the case runs, so that rounds sync both logs' files with one
    /// `syncfs` (the core's sync group).
    neighbour: bool,
}

fn keep_strategy() -> impl Strategy<Value = Keep> {
    prop_oneof![Just(Keep::None), Just(Keep::All), Just(Keep::Random)]
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(0..PAYLOAD_BYTES_MAX, 1..BATCHES_MAX),
        1..=APPENDERS_MAX,
        prop_oneof![Just(16u64 << 10), Just(64 << 10), Just(1 << 20)],
        prop_oneof![Just(0u64), Just(64 << 10)],
        prop_oneof![Just(None), (1usize..8).prop_map(Some)],
        prop_oneof![Just(None), (0.0..1.0f64, 0u64..40).prop_map(Some)],
        prop::collection::vec(
            (0.0..1.0f64, any::<bool>(), keep_strategy(), any::<u64>()).prop_map(
                |(at, after_ack, keep, seed)| Cut {
                    at,
                    after_ack,
                    keep,
                    seed,
                },
            ),
            1..CUTS_MAX,
        ),
        prop_oneof![Just(0u64), Just(4096), Just(64 << 10)],
        any::<bool>(),
    )
        .prop_map(
            |(
                sizes,
                appenders,
                segment_bytes,
                prealloc_step,
                flush_every,
                truncate,
                cuts,
                write_through_min,
                neighbour,
            )| Case {
                sizes,
                appenders,
                segment_bytes,
                prealloc_step,
                flush_every,
                truncate,
                cuts,
                write_through_min,
                neighbour,
            },
        )
}

fn log_config(segment_bytes: u64, relaxed: bool) -> LogConfig {
    let mut c = LogConfig::default();
    if relaxed {
        c.set("flush.messages", &FLUSH_MESSAGES_RELAXED.to_string())
            .unwrap();
    }
    c.set("segment.bytes", &segment_bytes.to_string()).unwrap();
    c.set("index.interval.bytes", "2048").unwrap();
    c.set("segment.ms", &i64::MAX.to_string()).unwrap();
    c
}

/// Batch `i` of a case: a numbered payload of `len` bytes (so it can be
/// recognised), timestamp `1000 + i`.
fn case_batch(i: u64, len: usize) -> bytes::BytesMut {
    let mut p = i.to_be_bytes().to_vec();
    p.extend_from_slice(&payload(i, len));
    batch(1 + (i % 3) as i32, &p, 1000 + i as i64)
}

/// The number `i` of a batch made by [`case_batch`].
fn case_batch_number(stored: &[u8]) -> u64 {
    let at = weir_proto::batch::HEADER_BYTES;
    u64::from_be_bytes(stored[at..at + 8].try_into().expect("8 bytes"))
}

/// What the run recorded.
struct Run {
    ops: Vec<(u64, IoOp)>,
    /// Batch number → (base offset, last offset, stored bytes) of every
    /// appended batch (which ones were acknowledged durably, and when, is
    /// in the journal's marks).
    appended: BTreeMap<u64, (u64, u64, Vec<u8>)>,
    truncation: Option<Truncation>,
    /// Syncs that covered several files (one `syncfs`).
    shared_syncs: u64,
}

/// A `truncate_to` between the two phases of a run.
#[derive(Debug, Clone, Copy)]
struct Truncation {
    /// Sequence numbers of the marks before and after it.
    start: u64,
    end: u64,
    /// The log end it returned: batches of the first phase at or above it
    /// are gone.
    new_end: u64,
    /// Batches of the first phase (numbers below this).
    phase1: u64,
}

/// Runs the appends of `case` on a recorded directory.
fn run_case(case: &Case, skip_fdatasync: bool) -> Run {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t-0");
    std::fs::create_dir_all(&dir).unwrap();
    let case = case.clone();
    let (root, dir2) = (tmp.path().to_path_buf(), dir.clone());
    let (ops, acked, truncation, shared_syncs) = run_ret(move || async move {
        let (tmp, dir) = (root, dir2);
        weir_storage::testing::set_skip_fdatasync(skip_fdatasync);
        let journal = std::rc::Rc::new(Journal::record(&dir));
        let shard = StorageShard::new(ShardConfig {
            prealloc_step: case.prealloc_step,
            write_through_bytes_min: case.write_through_min,
            ..ShardConfig::default()
        });
        let config = log_config(case.segment_bytes, case.flush_every.is_some());
        let (log, _) = PartitionLog::open(&shard, &dir, config)
            .await
            .expect("open");
        // The neighbour: small durable appends, as fast as they are
        // acknowledged, until the case is done (bounded in count).
        let stop = std::rc::Rc::new(std::cell::Cell::new(false));
        let neighbour = if case.neighbour {
            let (other, _) =
                PartitionLog::open(&shard, &tmp.join("t-1"), log_config(1 << 20, false))
                    .await
                    .expect("open the neighbour");
            let stop = stop.clone();
            Some(glommio::spawn_local(async move {
                for i in 0..NEIGHBOUR_APPENDS_MAX {
                    if stop.get() {
                        break;
                    }
                    other
                        .append_acked(case_batch(i, 1000))
                        .await
                        .expect("neighbour append");
                }
                other.close().await.expect("close the neighbour");
            }))
        } else {
            None
        };
        let next = std::rc::Rc::new(std::cell::Cell::new(0usize));
        let acked = std::rc::Rc::new(std::cell::RefCell::new(BTreeMap::new()));
        let sizes = std::rc::Rc::new(case.sizes.clone());
        // Appends batches `next..upto` with `case.appenders` tasks.
        let append_upto = |upto: usize| {
            let tasks: Vec<_> = (0..case.appenders)
                .map(|_| {
                    let flush_every = case.flush_every;
                    let (log, next, acked, sizes, journal) = (
                        log.clone(),
                        next.clone(),
                        acked.clone(),
                        sizes.clone(),
                        journal.clone(),
                    );
                    glommio::spawn_local(async move {
                        loop {
                            let i = next.get();
                            if i >= upto {
                                break;
                            }
                            next.set(i + 1);
                            let b = case_batch(i as u64, sizes[i]);
                            let info = log.append_acked(b.clone()).await.expect("append");
                            acked.borrow_mut().insert(
                                i as u64,
                                (
                                    info.base_offset,
                                    info.last_offset,
                                    stored(b, info.base_offset),
                                ),
                            );
                            match flush_every {
                                None => {
                                    journal.mark(i as u64);
                                }
                                Some(k) if i % k == 0 => {
                                    let durable = log.flush().await.expect("flush");
                                    journal.mark(FLUSHED | durable);
                                }
                                Some(_) => {}
                            }
                        }
                    })
                })
                .collect();
            async move {
                for t in tasks {
                    t.await;
                }
            }
        };
        let phase1 = case
            .truncate
            .map_or(sizes.len(), |(f, _)| (f * sizes.len() as f64) as usize);
        append_upto(phase1).await;
        let mut truncation = None;
        if let Some((_, back)) = case.truncate {
            // With the appenders quiet (truncation is a follower's
            // operation, not concurrent with acknowledged appends).
            let to = log.log_end_offset().saturating_sub(back);
            let start = journal.mark(TRUNCATION);
            let new_end = log.truncate_to(to).await.expect("truncate");
            let end = journal.mark(TRUNCATION);
            truncation = Some(Truncation {
                start,
                end,
                new_end,
                phase1: phase1 as u64,
            });
        }
        append_upto(sizes.len()).await;
        stop.set(true);
        if let Some(n) = neighbour {
            n.await;
        }
        let shared_syncs = shard.stats().shared_syncs;
        // Closing waits for the producer-snapshot writer (on the blocking
        // pool), so nothing is written after the journal is taken. The cuts
        // fall anywhere, the close included.
        log.close().await.expect("close");
        drop(log);
        drop(shard);
        drain_file_closes(&tmp).await;
        weir_storage::testing::set_skip_fdatasync(false);
        let journal = std::rc::Rc::try_unwrap(journal).expect("one journal");
        let acked = acked.borrow().clone();
        (journal.take(), acked, truncation, shared_syncs)
    });
    // The model's fidelity: with nothing lost, the rebuilt directory is the
    // real one (every file operation was recorded).
    let end = ops.last().map_or(0, |(s, _)| s + 1);
    let model = disk_after_power_loss(&ops, end, Keep::All, &mut Rng::new(0));
    let real: BTreeMap<PathBuf, Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            !e.file_name()
                .to_string_lossy()
                .starts_with(".weir-io-probe")
        })
        .map(|e| {
            (
                PathBuf::from(e.file_name()),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        model.keys().collect::<Vec<_>>(),
        real.keys().collect::<Vec<_>>(),
        "the journal's files are the directory's"
    );
    for (p, bytes) in &real {
        assert!(
            model[p] == *bytes,
            "the journal's {} ({} bytes) is the file ({} bytes)",
            p.display(),
            model[p].len(),
            bytes.len()
        );
    }
    Run {
        ops,
        appended: acked,
        truncation,
        shared_syncs,
    }
}

/// A file's contents: operations on one inode.
#[derive(Debug, Clone)]
enum DataOp {
    /// `durable`: written through `O_DSYNC`, on disk whatever the cut.
    Write {
        offset: u64,
        data: Vec<u8>,
        durable: bool,
    },
    SetLen(u64),
    Extend(u64),
}

#[derive(Debug, Default, Clone)]
struct Inode {
    ops: Vec<(u64, DataOp)>,
    /// Every operation numbered below this is durable.
    synced: u64,
}

#[derive(Debug, Clone)]
enum NsOp {
    Create(PathBuf, usize),
    Rename(PathBuf, PathBuf),
    Remove(PathBuf),
}

/// The disk as a power loss at sequence number `cut` leaves it: file name
/// → contents.
fn disk_after_power_loss(
    ops: &[(u64, IoOp)],
    cut: u64,
    keep: Keep,
    rng: &mut Rng,
) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut inodes: Vec<Inode> = Vec::new();
    let mut names: BTreeMap<PathBuf, usize> = BTreeMap::new();
    let mut ns_ops: Vec<(u64, NsOp)> = Vec::new();
    let mut dir_synced = 0u64;
    let inode_of = |names: &BTreeMap<PathBuf, usize>, p: &Path| -> usize {
        *names
            .get(p)
            .unwrap_or_else(|| panic!("operation on {} which does not exist", p.display()))
    };
    for (seq, op) in ops.iter().take_while(|(s, _)| *s < cut) {
        let seq = *seq;
        match op {
            IoOp::Create { path } => {
                if !names.contains_key(path) {
                    inodes.push(Inode::default());
                    names.insert(path.clone(), inodes.len() - 1);
                    ns_ops.push((seq, NsOp::Create(path.clone(), inodes.len() - 1)));
                }
            }
            IoOp::Write { path, offset, data } | IoOp::DurableWrite { path, offset, data } => {
                let i = inode_of(&names, path);
                inodes[i].ops.push((
                    seq,
                    DataOp::Write {
                        offset: *offset,
                        data: data.clone(),
                        durable: matches!(op, IoOp::DurableWrite { .. }),
                    },
                ));
            }
            IoOp::SetLen { path, len } => {
                let i = inode_of(&names, path);
                inodes[i].ops.push((seq, DataOp::SetLen(*len)));
            }
            IoOp::Extend { path, len } => {
                let i = inode_of(&names, path);
                inodes[i].ops.push((seq, DataOp::Extend(*len)));
            }
            IoOp::Sync { path, issued } => {
                let i = inode_of(&names, path);
                inodes[i].synced = inodes[i].synced.max(*issued);
            }
            IoOp::Rename { from, to } => {
                let i = names.remove(from).expect("rename of an existing file");
                names.insert(to.clone(), i);
                ns_ops.push((seq, NsOp::Rename(from.clone(), to.clone())));
            }
            IoOp::Remove { path } => {
                names.remove(path);
                ns_ops.push((seq, NsOp::Remove(path.clone())));
            }
            IoOp::DirSync { dir, issued } => {
                assert!(dir.as_os_str().is_empty(), "one directory is modelled");
                dir_synced = dir_synced.max(*issued);
            }
            IoOp::Mark { .. } => {}
            other => panic!("operation not modelled: {other:?}"),
        }
    }
    // Names: what the last directory sync covered, then a random prefix.
    let durable = ns_ops.iter().take_while(|(s, _)| *s < dir_synced).count();
    let extra = match keep {
        Keep::None => 0,
        Keep::All => ns_ops.len() - durable,
        Keep::Random => rng.range(0, (ns_ops.len() - durable) as u64 + 1) as usize,
    };
    let mut ns: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for (_, op) in &ns_ops[..durable + extra] {
        match op {
            NsOp::Create(p, i) => {
                ns.insert(p.clone(), *i);
            }
            NsOp::Rename(from, to) => {
                if let Some(i) = ns.remove(from) {
                    ns.insert(to.clone(), i);
                }
            }
            NsOp::Remove(p) => {
                ns.remove(p);
            }
        }
    }
    // Data: what the file's last sync covered, then pages at random.
    ns.into_iter()
        .map(|(p, i)| {
            let inode = &inodes[i];
            let mut f: Vec<u8> = Vec::new();
            for (seq, op) in &inode.ops {
                let synced =
                    *seq < inode.synced || matches!(op, DataOp::Write { durable: true, .. });
                let mut lands = || match keep {
                    _ if synced => true,
                    Keep::None => false,
                    Keep::All => true,
                    Keep::Random => rng.next_u64() & 1 == 1,
                };
                match op {
                    DataOp::Write { offset, data, .. } => {
                        for (k, page) in data.chunks(PAGE_BYTES).enumerate() {
                            if lands() {
                                let at = *offset as usize + k * PAGE_BYTES;
                                if f.len() < at + page.len() {
                                    f.resize(at + page.len(), 0);
                                }
                                f[at..at + page.len()].copy_from_slice(page);
                            }
                        }
                    }
                    DataOp::SetLen(len) => {
                        if lands() {
                            f.resize(*len as usize, 0);
                        }
                    }
                    DataOp::Extend(len) => {
                        if lands() && f.len() < *len as usize {
                            f.resize(*len as usize, 0);
                        }
                    }
                }
            }
            (p, f)
        })
        .collect()
}

/// Where the cut of `c` falls: a sequence number.
fn cut_point(ops: &[(u64, IoOp)], c: &Cut) -> u64 {
    let marks: Vec<u64> = ops
        .iter()
        .filter(|(_, op)| matches!(op, IoOp::Mark { .. }))
        .map(|(s, _)| *s)
        .collect();
    let end = ops.last().map_or(0, |(s, _)| s + 1);
    if c.after_ack && !marks.is_empty() {
        let k = ((c.at * marks.len() as f64) as usize).min(marks.len() - 1);
        marks[k] + 1
    } else {
        (c.at * (end + 1) as f64) as u64
    }
}

/// Rebuilds the disk after a power loss at each cut, reopens the log and
/// checks every batch acknowledged before the cut. Returns the first loss.
fn check_cuts(run: &Run, case: &Case) -> Result<(), String> {
    let (cuts, segment_bytes) = (&case.cuts, case.segment_bytes);
    let relaxed = case.flush_every.is_some();
    let marks: Vec<(u64, u64)> = run
        .ops
        .iter()
        .filter_map(|(s, op)| match op {
            IoOp::Mark { tag } => Some((*s, *tag)),
            _ => None,
        })
        .collect();
    let images: Vec<_> = cuts
        .iter()
        .map(|c| {
            let cut = cut_point(&run.ops, c);
            let mut rng = Rng::new(c.seed);
            let files = disk_after_power_loss(&run.ops, cut, c.keep, &mut rng);
            // Acknowledged before the cut: batches marked by append_acked,
            // and every batch below the highest offset flush() returned.
            let before = marks.iter().filter(|(s, _)| *s < cut);
            // A truncation that began before the cut may have removed the
            // first phase's batches at or above its new end; one that ended
            // before the cut has, for good.
            // A durable offset flush() returned covers the batches appended
            // before it: those of the first phase, and those of the second
            // only if it returned after the truncation began.
            let (phase1, t_start) = run
                .truncation
                .map_or((u64::MAX, u64::MAX), |t| (t.phase1, t.start));
            let durable_after = |from: u64| {
                before
                    .clone()
                    .filter(|(s, t)| *s >= from && t & FLUSHED != 0)
                    .map(|(_, t)| t & !FLUSHED)
                    .max()
                    .unwrap_or(0)
            };
            let (durable1, durable2) = (durable_after(0), durable_after(t_start));
            let marked: Vec<u64> = before
                .filter(|(_, t)| t & (FLUSHED | TRUNCATION) == 0)
                .map(|(_, t)| *t)
                .collect();
            let cut_away = |i: u64, base: u64| {
                run.truncation
                    .is_some_and(|t| t.start < cut && i < t.phase1 && base >= t.new_end)
            };
            let expect: Vec<(u64, u64, Vec<u8>)> = run
                .appended
                .iter()
                .filter(|(i, (base, last, _))| {
                    let durable = if **i < phase1 { durable1 } else { durable2 };
                    (*last < durable || marked.contains(i)) && !cut_away(**i, *base)
                })
                .map(|(i, (base, _, bytes))| (*i, *base, bytes.clone()))
                .collect();
            let gone: Option<(u64, u64)> = run
                .truncation
                .filter(|t| t.end < cut)
                .map(|t| (t.new_end, t.phase1));
            (*c, cut, files, expect, gone)
        })
        .collect();
    run_ret(move || async move {
        for (c, cut, files, expect, gone) in images {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("t-0");
            std::fs::create_dir_all(&dir).unwrap();
            for (p, bytes) in &files {
                std::fs::write(dir.join(p), bytes).unwrap();
            }
            let what = format!("cut at {cut} ({c:?}), files {:?}", files.keys());
            let shard = StorageShard::new(ShardConfig::default());
            let (log, _) = PartitionLog::open(&shard, &dir, log_config(segment_bytes, relaxed))
                .await
                .map_err(|e| format!("{what}: open failed: {e}"))?;
            let got: BTreeMap<u64, bytes::Bytes> =
                read_to_end(&log, log.log_start_offset(), 1 << 20)
                    .await
                    .map_err(|e| format!("{what}: read failed: {e}"))?
                    .into_iter()
                    .collect();
            // A completed truncation is durable: nothing it removed returns.
            if let Some((new_end, phase1)) = gone {
                for (base, b) in got.range(new_end..) {
                    let i = case_batch_number(b);
                    if i < phase1 {
                        return Err(format!(
                            "{what}: batch {i} at offset {base}, truncated away below \
                             {new_end}, came back"
                        ));
                    }
                }
            }
            for (i, base, bytes) in &expect {
                match got.get(base) {
                    Some(b) if b[..] == bytes[..] => {}
                    Some(_) => {
                        return Err(format!(
                            "{what}: acknowledged batch {i} at offset {base} differs"
                        ))
                    }
                    None => {
                        return Err(format!(
                            "{what}: acknowledged batch {i} at offset {base} is lost \
                             (log end {})",
                            log.log_end_offset()
                        ))
                    }
                }
            }
            log.close()
                .await
                .map_err(|e| format!("{what}: close: {e}"))?;
            drop(log);
            drop(shard);
            drain_file_closes(tmp.path()).await;
        }
        Ok(())
    })
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CASES_DEFAULT)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: regressions_beside_source(),
        ..ProptestConfig::default()
    })]

    #[test]
    fn acknowledged_batches_survive_power_loss(case in case_strategy()) {
        let run = run_case(&case, false);
        prop_assert_eq!(run.appended.len(), case.sizes.len());
        if let Err(e) = check_cuts(&run, &case) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// A fixed case: one appender, one segment, 8 batches; a cut right after
/// each acknowledgement, with nothing unsynced surviving. `flush_every` as
/// in [`Case`].
fn fixed_case(flush_every: Option<usize>) -> Case {
    Case {
        sizes: vec![100, 5000, 0, 9000, 300, 4096, 12_000, 17],
        appenders: 1,
        segment_bytes: 1 << 20,
        prealloc_step: 64 << 10,
        flush_every,
        truncate: None,
        cuts: (0..8)
            .map(|k| Cut {
                at: k as f64 / 8.0,
                after_ack: true,
                keep: Keep::None,
                seed: k,
            })
            .collect(),
        write_through_min: 0,
        neighbour: false,
    }
}

/// Both ways of acknowledging: `append_acked` with `flush.messages=1`, and
/// `flush()` every 2 batches with a large `flush.messages`.
const FIXED_MODES: [Option<usize>; 2] = [None, Some(2)];

#[test]
fn the_fixed_case_passes_with_fdatasync() {
    for mode in FIXED_MODES {
        let case = fixed_case(mode);
        let run = run_case(&case, false);
        check_cuts(&run, &case).expect("no acknowledged batch lost");
    }
}

/// Break the thing on purpose: with the flush round's fdatasync skipped
/// (acknowledgements still sent), the power-loss check must find a lost
/// acknowledged batch. This is what shows the test above can fail.
#[test]
fn a_skipped_fdatasync_is_caught() {
    for mode in FIXED_MODES {
        let case = fixed_case(mode);
        let run = run_case(&case, true);
        let found = check_cuts(&run, &case);
        let e = found
            .expect_err("a power loss after skipped fdatasyncs must lose acknowledged batches");
        eprintln!("found, as it must ({mode:?}): {e}");
        assert!(e.contains("is lost") || e.contains("differs"), "{e}");
    }
}

/// 120 batches of mixed sizes from sixteen appenders, cut at 24 points
/// (half right after an acknowledgement, a third keeping a random part of
/// the unsynced writes).
fn sixteen_appenders(
    segment_bytes: u64,
    flush_every: Option<usize>,
    write_through_min: u64,
) -> Case {
    Case {
        sizes: (0..120)
            .map(|i| [100, 5000, 9000, 300, 12_000][i % 5])
            .collect(),
        appenders: 16,
        segment_bytes,
        prealloc_step: 64 << 10,
        flush_every,
        truncate: None,
        cuts: (0..24)
            .map(|k| Cut {
                at: k as f64 / 24.0,
                after_ack: k % 2 == 0,
                keep: if k % 3 == 0 { Keep::Random } else { Keep::None },
                seed: k,
            })
            .collect(),
        write_through_min,
        neighbour: false,
    }
}

/// Overlapped flush rounds: sixteen appenders that go on appending once
/// their batch is written, each asking for durability (`flush()`) every
/// third batch, keep several rounds in flight, so a round's writes
/// complete while an earlier round's fdatasync runs (the journal shows it)
/// and syncs queue behind each other. (Appenders that each wait for their
/// batch to be durable move in lockstep: one round at a time.) Every cut —
/// right after an acknowledgement or anywhere, nothing or a random part of
/// the unsynced writes surviving — keeps every acknowledged batch.
#[test]
fn overlapped_rounds_keep_every_acknowledged_batch() {
    let case = sixteen_appenders(1 << 20, Some(3), 0);
    let run = run_case(&case, false);
    // A write that completed after a sync was issued and before it
    // completed: the next round's writes overlapped that sync.
    let overlapped = run.ops.iter().any(|(done, op)| match op {
        IoOp::Sync { issued, .. } => run
            .ops
            .iter()
            .any(|(seq, w)| matches!(w, IoOp::Write { .. }) && *seq > *issued && *seq < *done),
        _ => false,
    });
    assert!(
        overlapped,
        "no write overlapped a sync: the case does not test overlapped rounds"
    );
    check_cuts(&run, &case).expect("no acknowledged batch lost");
}

/// Rounds written through `O_DSYNC` (`write_through_bytes_min`, here
/// 4 KiB so that most rounds are): sixteen appenders, each batch
/// acknowledged once durable (`flush.messages=1`); the journal shows writes
/// through the `O_DSYNC` descriptor.
/// Every cut keeps every acknowledged batch — the model keeps such a write
/// whatever the cut, and nothing else because of it.
#[test]
fn rounds_written_through_o_dsync_keep_every_acknowledged_batch() {
    let case = sixteen_appenders(256 << 10, None, 4096);
    let run = run_case(&case, false);
    let through = run
        .ops
        .iter()
        .filter(|(_, op)| matches!(op, IoOp::DurableWrite { path, .. } if path.extension().is_some_and(|e| e == "log")))
        .count();
    assert!(through > 0, "no round was written through O_DSYNC");
    check_cuts(&run, &case).expect("no acknowledged batch lost");
}

/// A log alone on its core (no neighbour) writes its small rounds
/// through `O_DSYNC` (`ShardConfig::write_through_alone_bytes_max`, 128
/// KiB, where the threshold for every log is 512 KiB): sixteen appenders,
/// each batch acknowledged once durable; the journal shows small writes
/// through the `O_DSYNC` descriptor and at most one fdatasync per segment
/// (where it is rolled), not one per round; every cut keeps every
/// acknowledged batch.
#[test]
fn small_rounds_of_a_log_alone_are_written_through_and_keep_every_acknowledged_batch() {
    let case = sixteen_appenders(
        256 << 10,
        None,
        weir_storage::shard::WRITE_THROUGH_BYTES_MIN_DEFAULT,
    );
    let run = run_case(&case, false);
    let through: Vec<usize> = run
        .ops
        .iter()
        .filter_map(|(_, op)| match op {
            IoOp::DurableWrite { path, data, .. }
                if path.extension().is_some_and(|e| e == "log") =>
            {
                Some(data.len())
            }
            _ => None,
        })
        .collect();
    assert!(!through.is_empty(), "no round was written through O_DSYNC");
    assert!(
        through
            .iter()
            .all(|&n| (n as u64) < weir_storage::shard::WRITE_THROUGH_BYTES_MIN_DEFAULT),
        "every round here is below the threshold: {through:?}"
    );
    let log_syncs = run
        .ops
        .iter()
        .filter(|(_, op)| matches!(op, IoOp::Sync { path, .. } if path.extension().is_some_and(|e| e == "log")))
        .count();
    let segments = run
        .ops
        .iter()
        .filter(|(_, op)| matches!(op, IoOp::Create { path } if path.extension().is_some_and(|e| e == "log")))
        .count();
    assert!(
        log_syncs <= segments,
        "{log_syncs} fdatasyncs of {segments} segments: rounds were synced, not written through"
    );
    check_cuts(&run, &case).expect("no acknowledged batch lost");
}

/// Rounds that sync the case's log together with another log of the same
/// core: the core's sync group makes both files durable with one
/// `syncfs` (the journal notes it as a sync of each file, issued when the
/// `syncfs` was). Sixteen appenders, each batch acknowledged once durable;
/// every cut keeps every acknowledged batch.
#[test]
fn rounds_synced_with_another_log_keep_every_acknowledged_batch() {
    let mut case = sixteen_appenders(1 << 20, None, 0);
    case.neighbour = true;
    let run = run_case(&case, false);
    assert!(
        run.shared_syncs > 0,
        "no sync covered both logs: the case does not test the sync group"
    );
    check_cuts(&run, &case).expect("no acknowledged batch lost");
}
