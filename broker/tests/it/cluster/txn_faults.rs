//! Kafka transactions under broker faults (issue 32's acceptance): three
//! nodes, a topic of 4 partitions with RF 3 and min.insync.replicas 2, one
//! transactional confluent-kafka producer (`broker/tests/kafka/txn_faults.py`)
//! running transactions of 12 records (3 on each partition), most
//! committed, every 4th aborted on purpose. While it runs, in four rounds
//! (`WEIR_TXN_FAULT_ROUNDS` for another number), a node is SIGKILLed the
//! moment the producer sends a commit — the node of its transaction
//! coordinator, then a node leading a partition of the topic (another than
//! the coordinator's), and again — and restarted once transactions commit
//! again, the cluster converged and every ISR full. At the end every
//! partition is read read_committed and read_uncommitted, and a checker of
//! the client's outcomes against what is visible counts Jepsen's anomalies:
//! a torn transaction (some but not all of its records visible), an aborted
//! read (G1a: a visible record of a transaction the client saw aborted), a
//! lost commit (a transaction the client saw committed not wholly
//! visible), a record visible twice, a transaction left open for good (the
//! last stable offsets below the high watermarks) — all must be 0.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::{serial, Cluster};
use crate::common;

const TOPIC: &str = "txf";
const PARTS: u32 = 4;
/// Records of one transaction (3 on each partition).
const PER_TXN: u32 = 3 * PARTS;
const TXN_ID: &str = "txf-app";
/// Committed transactions wanted before a kill and after each.
const PROGRESS: usize = 3;
/// The script's own limits (the test stops it sooner).
const MAX_TXNS: &str = "2000";
const MAX_SECONDS: &str = "75";

/// What the client learned of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Committed,
    Aborted,
    Unknown,
}

/// The transactional producer's process and what it printed so far.
struct Script {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    seen: Vec<String>,
    outcomes: BTreeMap<u64, Outcome>,
    /// Each commit-ok in the order printed: (transaction, when).
    commits: Vec<(u64, Instant)>,
    /// When the client learned each transaction's outcome.
    ended: HashMap<u64, Instant>,
    /// How long each end the client saw succeed took (the script's own
    /// measure).
    end_took: HashMap<u64, Duration>,
    done: bool,
}

impl Script {
    fn start(boot: &str) -> Script {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/txn_faults.py");
        let mut child = common::client_program(crate::kafka_clients::python())
            .arg(path)
            .args([
                boot,
                TOPIC,
                &PARTS.to_string(),
                TXN_ID,
                MAX_TXNS,
                MAX_SECONDS,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Script {
            child,
            stdin,
            lines: rx,
            seen: Vec::new(),
            outcomes: BTreeMap::new(),
            commits: Vec::new(),
            ended: HashMap::new(),
            end_took: HashMap::new(),
            done: false,
        }
    }

    /// Notes what `line` tells.
    fn take(&mut self, line: &str) {
        let w: Vec<&str> = line.split_whitespace().collect();
        let outcome = match w[0] {
            "commit-ok" => Some(Outcome::Committed),
            "abort-ok" => Some(Outcome::Aborted),
            "failed" => Some(Outcome::Unknown),
            "init" | "ending" => None,
            "done" => {
                self.done = true;
                None
            }
            _ => panic!("unexpected line from the transactional producer: {line}"),
        };
        if let Some(o) = outcome {
            let k: u64 = w[1].parse().unwrap_or_else(|_| panic!("{line}"));
            assert!(
                self.outcomes.insert(k, o).is_none(),
                "two outcomes of {k}: {line}"
            );
            if o == Outcome::Committed {
                self.commits.push((k, Instant::now()));
            }
            self.ended.insert(k, Instant::now());
            if o != Outcome::Unknown {
                if let Some(t) = w.last().and_then(|t| t.parse::<f64>().ok()) {
                    self.end_took.insert(k, Duration::from_secs_f64(t));
                }
            }
        }
        self.seen.push(line.to_string());
    }

    /// Takes the lines printed so far, without waiting.
    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.take(&line);
        }
    }

    /// Takes lines until `until(line)` holds for one (that line), or
    /// `within` passed (None).
    fn until(
        &mut self,
        within: Duration,
        mut until: impl FnMut(&Script, &str) -> bool,
    ) -> Option<String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => return None,
                Err(RecvTimeoutError::Disconnected) => {
                    panic!(
                        "the transactional producer ended: {:?}\n{}",
                        self.child.wait(),
                        self.tail()
                    )
                }
            };
            self.take(&line);
            if until(self, &line) {
                return Some(line);
            }
        }
    }

    /// [`Script::until`], which must hold within `within` (else the test
    /// fails with `what` and the last lines).
    fn wait(
        &mut self,
        what: &str,
        within: Duration,
        until: impl FnMut(&Script, &str) -> bool,
    ) -> String {
        self.until(within, until)
            .unwrap_or_else(|| panic!("not within {within:?}: {what}\n{}", self.tail()))
    }

    /// Commits of transactions after `k`.
    fn commits_after(&self, k: u64) -> usize {
        self.commits.iter().filter(|(c, _)| *c > k).count()
    }

    fn tail(&self) -> String {
        self.seen[self.seen.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Script {
    /// A failed test leaves no producer running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// On a failure (always, with `WEIR_TXN_FAULTS_KEEP_LOGS` set), keeps the
/// nodes' logs (those of before each kill too) where the cluster's
/// directory does not delete them, and prints what they said of
/// transactions.
struct KeepLogs(PathBuf);

impl Drop for KeepLogs {
    fn drop(&mut self) {
        if !std::thread::panicking() && std::env::var_os("WEIR_TXN_FAULTS_KEEP_LOGS").is_none() {
            return;
        }
        let keep = std::env::temp_dir().join(format!(
            "weir-txn-faults-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis())
        ));
        let _ = std::fs::create_dir_all(&keep);
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&self.0)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        logs.sort();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| {
                    l.contains("WARN")
                        || l.contains("ERROR")
                        || l.contains("transaction")
                        || l.contains("panicked")
                })
                .collect();
            eprintln!(
                "{}:\n{}",
                log.display(),
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
            let _ = std::fs::copy(&log, keep.join(log.file_name().unwrap()));
        }
        eprintln!("the nodes' logs are kept in {}", keep.display());
    }
}

/// One SIGKILL: which node, why, the transaction whose commit it met.
struct Kill {
    node: u64,
    role: &'static str,
    /// It led the controller quorum too.
    controller: bool,
    during: u64,
    pid: u32,
    /// Commits before it, and of transactions after `during`.
    before: usize,
    after: usize,
    /// From the kill to the first commit of a transaction after `during`.
    recovered_in: Duration,
    /// From the kill to the client learning `during`'s outcome.
    during_ended_in: Duration,
}

/// The node leading `id`'s partition of `__transaction_state`.
fn coordinator(c: &Cluster, id: &str) -> u64 {
    let rows = c.partition_rows("__transaction_state");
    let p = weir_groups::records::partition_for(id, rows.len() as u32) as usize;
    rows[p][1]
        .parse()
        .unwrap_or_else(|_| panic!("no leader of __transaction_state-{p}: {:?}", rows[p]))
}

/// Kills `node` the moment the script starts to commit a transaction;
/// waits for commits of transactions after it, restarts the node and waits
/// for the cluster to have it back.
fn kill_mid_commit(
    c: &mut Cluster,
    s: &mut Script,
    round: usize,
    node: u64,
    role: &'static str,
) -> Kill {
    let controller = c
        .converged(&[1, 2, 3], Duration::from_secs(30))
        .controller_leader
        == node;
    // A commit starting from now on (not one printed while the test was
    // busy).
    s.drain();
    let line = s.wait(
        "a transaction's commit to start",
        Duration::from_secs(30),
        |_, l| l.starts_with("ending ") && l.ends_with(" commit"),
    );
    let during: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let before = s.commits.len();
    let pid = c.nodes[&node].pid();
    let at = Instant::now();
    c.nodes.remove(&node).unwrap().kill();
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "node {node} (pid {pid}) is still there after SIGKILL"
    );
    eprintln!("killed node {node} ({role}, pid {pid}) as transaction {during} began its commit");
    s.wait(
        &format!(
            "{PROGRESS} commits after node {node} ({role}) was killed during {during}'s commit"
        ),
        Duration::from_secs(45),
        |s, _| s.commits_after(during) >= PROGRESS,
    );
    let recovered_in = s
        .commits
        .iter()
        .find(|(k, _)| *k > during)
        .map(|(_, t)| t.duration_since(at))
        .unwrap();
    // Its log before the kill (a restart truncates the file).
    let _ = std::fs::copy(c.log_path(node), killed_log(c, node, round));
    c.start(node);
    c.converged(&[1, 2, 3], Duration::from_secs(30));
    c.isr_full(TOPIC, 3, Duration::from_secs(30));
    c.isr_full("__transaction_state", 3, Duration::from_secs(30));
    eprintln!("node {node} restarted and back in every ISR");
    Kill {
        node,
        role,
        controller,
        during,
        pid,
        before,
        after: s.commits_after(during),
        recovered_in,
        during_ended_in: s.ended[&during].duration_since(at),
    }
}

/// Where node `node`'s log of before kill `round` is kept.
fn killed_log(c: &Cluster, node: u64, round: usize) -> PathBuf {
    c.log_path(node)
        .with_extension(format!("before-kill-{round}.log"))
}

/// A record of `t{k}:{i}`.
fn parse_value(v: &str) -> Option<(u64, u32)> {
    let (k, i) = v.strip_prefix('t')?.split_once(':')?;
    Some((k.parse().ok()?, i.parse().ok()?))
}

/// What the checker found.
#[derive(Default, Debug)]
struct Anomalies {
    torn: Vec<String>,
    aborted_read: Vec<String>,
    lost_commit: Vec<String>,
    duplicates: Vec<String>,
    /// A record on another partition than its index says, a value not of
    /// a transaction the client ran, a read_committed record that
    /// read_uncommitted has not at its offset, or a transaction open for
    /// good.
    other: Vec<String>,
    /// Transactions the client saw aborted whose records are in the log
    /// (read_uncommitted sees them): what an aborted read would show.
    aborted_in_log: usize,
}

impl Anomalies {
    fn count(&self) -> usize {
        self.torn.len()
            + self.aborted_read.len()
            + self.lost_commit.len()
            + self.duplicates.len()
            + self.other.len()
    }
}

/// The checker: the client's outcomes against the records each isolation
/// level sees, `(partition, offset, value)`.
fn check(
    outcomes: &BTreeMap<u64, Outcome>,
    rc: &[(u32, u64, String)],
    ru: &[(u32, u64, String)],
    ends: &str,
) -> (Anomalies, String) {
    let mut a = Anomalies::default();
    // `ends rc [..] ru [..]`: every transaction ended, the last stable
    // offsets are the high watermarks.
    match ends
        .strip_prefix("ends rc ")
        .and_then(|e| e.split_once(" ru "))
    {
        Some((stable, high)) if stable == high => {}
        _ => a.other.push(format!(
            "a transaction left open: read_committed's ends are not the high watermarks ({ends:?})"
        )),
    }
    let ru_at: HashMap<(u32, u64), &str> =
        ru.iter().map(|(p, o, v)| ((*p, *o), v.as_str())).collect();
    // Per transaction, each record index seen read_committed: where.
    let mut visible: BTreeMap<u64, BTreeMap<u32, Vec<(u32, u64)>>> = BTreeMap::new();
    for (p, o, v) in rc {
        if ru_at.get(&(*p, *o)) != Some(&v.as_str()) {
            a.other.push(format!(
                "read_committed {v} at {p}/{o}, read_uncommitted {:?}",
                ru_at.get(&(*p, *o))
            ));
        }
        let Some((k, i)) = parse_value(v) else {
            a.other
                .push(format!("{v} at {p}/{o}: not a record of the workload"));
            continue;
        };
        if !outcomes.contains_key(&k) || i >= PER_TXN {
            a.other
                .push(format!("{v} at {p}/{o}: of no transaction the client ran"));
            continue;
        }
        if i % PARTS != *p {
            a.other.push(format!(
                "{v} at {p}/{o}: record {i} belongs to partition {}",
                i % PARTS
            ));
        }
        visible
            .entry(k)
            .or_default()
            .entry(i)
            .or_default()
            .push((*p, *o));
    }
    for (k, seen) in &visible {
        for (i, at) in seen {
            if at.len() > 1 {
                a.duplicates
                    .push(format!("t{k}:{i} visible {} times: {at:?}", at.len()));
            }
        }
        if (seen.len() as u32) < PER_TXN {
            let missing: Vec<u32> = (0..PER_TXN).filter(|i| !seen.contains_key(i)).collect();
            a.torn.push(format!(
                "transaction {k} ({:?}): {} of {PER_TXN} records visible, missing {missing:?}",
                outcomes[k],
                seen.len()
            ));
        }
    }
    let mut n = BTreeMap::<&str, usize>::new();
    for (k, o) in outcomes {
        let shown = visible.get(k).map_or(0, |s| s.len());
        match o {
            Outcome::Aborted if shown > 0 => a.aborted_read.push(format!(
                "transaction {k} aborted for the client: {shown} records visible"
            )),
            Outcome::Committed if shown < PER_TXN as usize => a.lost_commit.push(format!(
                "transaction {k} committed for the client: {shown} of {PER_TXN} records visible"
            )),
            _ => {}
        }
        *n.entry(match (o, shown) {
            (Outcome::Committed, _) => "committed",
            (Outcome::Aborted, _) => "aborted",
            (Outcome::Unknown, 0) => "unknown, resolved absent",
            (Outcome::Unknown, _) => "unknown, resolved visible",
        })
        .or_default() += 1;
    }
    // The aborts wrote records the reader had to skip: the check of
    // aborted reads has something to find.
    let in_log: std::collections::BTreeSet<u64> = ru
        .iter()
        .filter_map(|(_, _, v)| parse_value(v).map(|(k, _)| k))
        .collect();
    let aborted_in_log = outcomes
        .iter()
        .filter(|(k, o)| **o == Outcome::Aborted && in_log.contains(k))
        .count();
    a.aborted_in_log = aborted_in_log;
    let report = format!(
        "transactions: {n:?}; aborted with records in the log: {aborted_in_log}; records read \
         read_committed {}, read_uncommitted {}; anomalies: torn {}, aborted read (G1a) {}, lost \
         commit {}, duplicated {}, other {}",
        rc.len(),
        ru.len(),
        a.torn.len(),
        a.aborted_read.len(),
        a.lost_commit.len(),
        a.duplicates.len(),
        a.other.len()
    );
    (a, report)
}

/// Issue 32's acceptance: the transaction coordinator's node and then a
/// partition leader's node SIGKILLed mid-commit; every transaction wholly
/// visible or wholly absent read_committed, nothing the client saw aborted
/// visible, everything it saw committed visible, nothing twice.
#[test]
fn transactions_survive_killing_the_coordinator_and_a_leader_mid_commit() {
    let _serial = serial();
    let started = Instant::now();
    let mut c = Cluster::three();
    c.replicated_topic(TOPIC, PARTS);
    let _keep = KeepLogs(c.root.path().to_path_buf());
    let boot: Vec<String> = (1..=3).map(|id| c.nodes[&id].kafka.to_string()).collect();
    let boot = boot.join(",");
    let mut s = Script::start(&boot);
    s.wait(
        &format!("{PROGRESS} transactions committed"),
        Duration::from_secs(60),
        |s, _| s.commits.len() >= PROGRESS,
    );

    // Kill rounds: the coordinator's node, then a leader's, in turn.
    let rounds: usize = std::env::var("WEIR_TXN_FAULT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let mut kills: Vec<Kill> = Vec::new();
    for round in 0..rounds {
        let coord = coordinator(&c, TXN_ID);
        let kill = if round % 2 == 0 {
            kill_mid_commit(&mut c, &mut s, round, coord, "coordinator")
        } else {
            // A node leading a partition of the topic, another than the
            // coordinator's if one does: in the first such round one that
            // does not lead the controller quorum either, in the next one
            // that does (its coordinator then loses its lease with a write
            // pending), when there is a choice.
            let leaders: Vec<u64> = c
                .partition_rows(TOPIC)
                .iter()
                .map(|r| r[1].parse().unwrap())
                .collect();
            let controller = c
                .converged(&[1, 2, 3], Duration::from_secs(30))
                .controller_leader;
            let want_controller = round % 4 == 3;
            let candidates: Vec<u64> = leaders.iter().copied().filter(|l| *l != coord).collect();
            let victim = candidates
                .iter()
                .copied()
                .find(|l| (*l == controller) == want_controller)
                .or(candidates.first().copied())
                .unwrap_or(leaders[0]);
            kill_mid_commit(&mut c, &mut s, round, victim, "leader")
        };
        kills.push(kill);
    }

    // A few more with every node back, then stop.
    let last = s.outcomes.keys().last().copied().unwrap_or(0);
    s.wait(
        "commits with every node back",
        Duration::from_secs(30),
        |s, _| s.commits_after(last) >= PROGRESS,
    );
    let _ = writeln!(s.stdin, "stop");
    s.wait(
        "the transactional producer to stop",
        Duration::from_secs(60),
        |s, _| s.done,
    );
    let status = s.child.wait().unwrap();
    assert!(
        status.success(),
        "the transactional producer: {status}\n{}",
        s.tail()
    );

    // Everything, read both ways.
    let out = crate::kafka_clients::python_script(
        "txn_faults.py",
        &[&boot, TOPIC, &PARTS.to_string(), "read"],
    );
    assert!(out.lines().any(|l| l == "done"), "{out}");
    let (mut rc, mut ru) = (Vec::new(), Vec::new());
    for l in out.lines() {
        let w: Vec<&str> = l.splitn(4, ' ').collect();
        let rec = || {
            (
                w[1].parse().unwrap(),
                w[2].parse().unwrap(),
                w[3].to_string(),
            )
        };
        match w[0] {
            "rc" => rc.push(rec()),
            "ru" => ru.push(rec()),
            _ => {}
        }
    }
    let ends = out.lines().find(|l| l.starts_with("ends ")).unwrap_or("");
    let (a, report) = check(&s.outcomes, &rc, &ru, ends);
    // How long an end takes without a kill: what "mid-commit" is against.
    let killed: Vec<u64> = kills.iter().map(|k| k.during).collect();
    let mut ends_took: Vec<Duration> = s
        .end_took
        .iter()
        .filter(|(k, _)| !killed.contains(k))
        .map(|(_, took)| *took)
        .collect();
    ends_took.sort();
    for k in &kills {
        eprintln!(
            "node {} ({}{}, pid {}) SIGKILLed as transaction {}'s commit was sent; its outcome \
             for the client: {:?}, {:?} after the kill (its end took {:?}); {} commits before, {} \
             of later transactions after, the first {:?} after the kill",
            k.node,
            k.role,
            if k.controller {
                ", the controller leader"
            } else {
                ""
            },
            k.pid,
            k.during,
            s.outcomes.get(&k.during),
            k.during_ended_in,
            s.end_took.get(&k.during),
            k.before,
            k.after,
            k.recovered_in
        );
    }
    eprintln!(
        "{report}; {ends}; an end without a kill took p50 {:?}, max {:?}; wall time {:?}",
        ends_took.get(ends_took.len() / 2),
        ends_took.last(),
        started.elapsed()
    );
    // (The nodes' logs are printed and kept on a failure: `KeepLogs`.)
    assert!(
        a.count() == 0,
        "anomalies: {a:#?}\n{report}\nthe client's lines:\n{}",
        s.seen.join("\n")
    );
    // It did something: commits before each kill and after it, aborts
    // whose records the readers had to skip.
    for w in kills.windows(2) {
        assert!(
            w[1].before > w[0].before,
            "no commit between the kills of nodes {} and {}",
            w[0].node,
            w[1].node
        );
    }
    for k in &kills {
        assert!(
            k.before >= PROGRESS && k.after >= PROGRESS,
            "node {}'s kill: {} commits before, {} after",
            k.node,
            k.before,
            k.after
        );
    }
    assert!(a.aborted_in_log >= 2, "{report}");
}
