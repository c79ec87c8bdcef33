//! Faults a Jepsen run would try (issue 31), against three nodes of RF 3
//! and min.insync.replicas 2, with a workload throughout and the queue
//! checker of `weir_testkit::checker` at the end: idempotent acks=all
//! producers writing each key's values in order to several partitions, an
//! assign-mode reader and a consumer group polling (and committing)
//! throughout, and at the end every replica's log read off its disk.
//!
//! Each fault is asserted to have been in effect (nftables counted the
//! packets it dropped, the process was stopped) and, where it must, to
//! have moved a leadership.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_client::{ConsumerRecord, Producer, ProducerRecord, RebalanceListener, TopicPartition};
use weir_testkit::checker::{self, Event, Final, History, Rec};
use weir_testkit::poll_until;

use super::{runtime, serial, Cluster, SESSION_MS};

/// Keys each producer writes (key `k` goes to partition `k % partitions`).
const KEYS_PER_PRODUCER: u32 = 6;
/// Records a producer has unacknowledged at once.
const IN_FLIGHT: usize = 8;
/// The reader ids of the history: the assign-mode reader, then group
/// members from `MEMBER_BASE`.
const ASSIGN_READER: u32 = 100;
const MEMBER_BASE: u32 = 200;

/// How the workload's producers are set.
#[derive(Debug, Clone, Copy)]
struct Producers {
    /// How many.
    count: u32,
    /// Idempotent (the default): off only to show the checker sees the
    /// duplicates retries then make.
    idempotent: bool,
}

impl Producers {
    fn idempotent(count: u32) -> Producers {
        Producers {
            count,
            idempotent: true,
        }
    }
}

/// The workload: its tasks, and the history they write.
struct Workload {
    history: Arc<History>,
    /// Each producer's statistics, as of its last record (for a failure's
    /// message).
    stats: Stats,
    stop_producers: Arc<AtomicBool>,
    stop_readers: Arc<AtomicBool>,
    producers: Vec<tokio::task::JoinHandle<()>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Workload {
    /// Starts `producers` producers, one assign-mode reader and `members`
    /// members of group `jepsen` on `topic` (`partitions` partitions),
    /// bootstrapping from every node of `c`.
    fn start(
        c: &Cluster,
        rt: &tokio::runtime::Runtime,
        topic: &str,
        partitions: u32,
        producers: Producers,
        members: u32,
    ) -> Workload {
        let bootstrap: Vec<String> = c.nodes.values().map(|n| n.listen.to_string()).collect();
        let bootstrap = bootstrap.join(",");
        let history = Arc::new(History::default());
        let stats = Stats::default();
        let stop_producers = Arc::new(AtomicBool::new(false));
        let stop_readers = Arc::new(AtomicBool::new(false));
        let producers = (0..producers.count)
            .map(|id| {
                rt.spawn(produce(
                    id,
                    producers,
                    Target {
                        bootstrap: bootstrap.clone(),
                        topic: topic.to_string(),
                        partitions,
                    },
                    (history.clone(), stats.clone()),
                    stop_producers.clone(),
                ))
            })
            .collect();
        let mut readers = vec![rt.spawn(read_assigned(
            bootstrap.clone(),
            topic.to_string(),
            history.clone(),
            stop_readers.clone(),
        ))];
        readers.extend((0..members).map(|m| {
            rt.spawn(read_in_group(
                MEMBER_BASE + m,
                bootstrap.clone(),
                topic.to_string(),
                history.clone(),
                stop_readers.clone(),
            ))
        }));
        Workload {
            history,
            stats,
            stop_producers,
            stop_readers,
            producers,
            readers,
        }
    }

    fn acks(&self) -> usize {
        self.history.acks()
    }

    /// Waits until `more` records were acknowledged after now, or panics
    /// with `why` and what `c`'s nodes logged after `within`.
    fn more_acks(&self, c: &Cluster, more: usize, within: Duration, why: &str) {
        let from = self.acks();
        poll_until(Instant::now() + within, || {
            (self.acks() >= from + more).then_some(()).ok_or(())
        })
        .unwrap_or_else(|()| {
            let ids: Vec<u64> = c.bind.keys().copied().collect();
            let logs = c.log_tails(&ids, 40, |l| {
                !l.contains("DEBUG") && !l.contains("RPCError")
            });
            let mut per_partition = BTreeMap::<u32, usize>::new();
            for e in self.history.events().iter().rev().take(self.acks() - from) {
                if let Event::Ack { partition, .. } = e {
                    *per_partition.entry(*partition).or_default() += 1;
                }
            }
            let views: Vec<String> = c
                .nodes
                .keys()
                .map(|n| format!("node {n}'s view:\n{}", view(c, *n)))
                .collect();
            panic!(
                "{why}: {} acknowledged within {within:?}, wanted {more}; by partition \
                 {per_partition:?}\nproducers: {:#?}\n{}\n{logs}",
                self.acks() - from,
                self.stats.lock().unwrap(),
                views.join("\n")
            )
        });
    }

    /// Stops the producers (waiting for their last records' answers),
    /// lets the readers poll a little longer, stops them; the history.
    fn stop(self, rt: &tokio::runtime::Runtime) -> Vec<Event> {
        self.stop_producers.store(true, Ordering::Release);
        for p in self.producers {
            rt.block_on(p).expect("a producer task");
        }
        // The readers read on for a moment: more of the log is checked.
        std::thread::sleep(Duration::from_secs(2));
        self.stop_readers.store(true, Ordering::Release);
        for r in self.readers {
            rt.block_on(r).expect("a reader task");
        }
        self.history.events()
    }
}

/// Each producer's statistics, by producer id.
type Stats = Arc<Mutex<BTreeMap<u32, weir_client::ProducerStats>>>;

/// `weir topic describe jepsen` through node `n`, whatever it answers
/// within 5 s (for a failure's message).
fn view(c: &Cluster, n: u64) -> String {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["topic", "describe", "jepsen", "--bootstrap"])
        .arg(c.nodes[&n].listen.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _ = poll_until(Instant::now() + Duration::from_secs(5), || {
        child.try_wait().unwrap().ok_or(())
    });
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let addr = c.nodes[&n].listen;
    let metadata = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let call = async {
                let client = weir_client::Client::connect(addr).await?;
                client.metadata(Some(vec!["jepsen".into()])).await
            };
            tokio::time::timeout(Duration::from_secs(5), call).await
        });
    format!(
        "{}{}metadata: {metadata:?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Where the producers write.
struct Target {
    bootstrap: String,
    topic: String,
    partitions: u32,
}

/// Producer `id`: keys `id * KEYS_PER_PRODUCER..`, each key's values in
/// order, until stopped or 1 000 000 records.
async fn produce(
    id: u32,
    settings: Producers,
    target: Target,
    (history, stats): (Arc<History>, Stats),
    stop: Arc<AtomicBool>,
) {
    let Target {
        bootstrap,
        topic,
        partitions,
    } = target;
    let producer = Producer::builder()
        .bootstrap(bootstrap)
        .config(|c| {
            // A record not delivered within this is failed (indefinite):
            // the run's end waits for no more than this.
            c.delivery_timeout_ms = 15_000;
            c.linger_ms = 2;
            c.enable_idempotence = settings.idempotent;
        })
        // A request unanswered this long is sent again (on a new
        // connection): what a leader whose answers are lost sees.
        .client_config(|c| c.request_timeout = Duration::from_secs(2))
        .build()
        .await
        .expect("a producer");
    let window = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut seq = vec![0u64; KEYS_PER_PRODUCER as usize];
    let mut pending = Vec::new();
    for i in 0..1_000_000u64 {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let j = (i % u64::from(KEYS_PER_PRODUCER)) as usize;
        let key = id * KEYS_PER_PRODUCER + j as u32;
        let rec = Rec { key, seq: seq[j] };
        seq[j] += 1;
        let partition = key % partitions;
        let permit = window.clone().acquire_owned().await.unwrap();
        let record = ProducerRecord::new(topic.clone(), rec.encode())
            .key(key.to_string())
            .partition(partition);
        let Ok(delivery) = producer.send(record).await else {
            continue;
        };
        let history = history.clone();
        pending.push(tokio::spawn(async move {
            if let Ok(md) = delivery.await {
                history.push(Event::Ack {
                    producer: id,
                    partition,
                    offset: md.offset.expect("acks=all: an offset"),
                    rec,
                });
            }
            drop(permit);
        }));
        if i % 64 == 0 {
            stats.lock().unwrap().insert(id, producer.statistics());
        }
        // Paced: the nodes' timing (2 s sessions) is what is under test,
        // not two cores saturated.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for p in pending {
        p.await.unwrap();
    }
    producer.close().await;
}

/// The records of a poll, into the history (values that are not the
/// workload's are left out).
fn record_polls(history: &History, reader: u32, runs: &BTreeMap<u32, u32>, rs: &[ConsumerRecord]) {
    for r in rs {
        if let Some(rec) = r.value.as_deref().and_then(Rec::parse) {
            history.push(Event::Polled {
                reader,
                run: runs.get(&r.partition).copied().unwrap_or(0),
                partition: r.partition,
                offset: r.offset,
                rec,
            });
        }
    }
}

/// An assign-mode reader of every partition, from offset 0.
async fn read_assigned(
    bootstrap: String,
    topic: String,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
) {
    let mut consumer = weir_client::Consumer::builder()
        .bootstrap(bootstrap)
        .topics([topic.clone()])
        .build()
        .await
        .expect("an assign-mode reader");
    let mut runs = BTreeMap::new();
    for (_, p) in consumer.assignment() {
        consumer.seek(&topic, p, 0).unwrap();
        runs.insert(p, 0);
        history.push(Event::Assigned {
            reader: ASSIGN_READER,
            run: 0,
            partition: p,
            from: Some(0),
        });
    }
    while !stop.load(Ordering::Acquire) {
        match consumer.poll(Duration::from_millis(200)).await {
            Ok(rs) => record_polls(&history, ASSIGN_READER, &runs, &rs),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Partitions a member was given, waiting to be noted with where their
/// run starts.
#[derive(Clone, Default)]
struct Given(Arc<Mutex<Vec<TopicPartition>>>);

impl RebalanceListener for Given {
    fn on_assigned(&mut self, partitions: &[TopicPartition]) {
        self.0.lock().unwrap().extend_from_slice(partitions);
    }
}

/// Member `reader` of group `jepsen`: polls, and commits what it polled
/// after each poll. A partition given to it starts a new run, from the
/// group's committed offset (or 0: the log's start, by `earliest`).
async fn read_in_group(
    reader: u32,
    bootstrap: String,
    topic: String,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
) {
    let mut member = weir_client::Consumer::builder()
        .bootstrap(bootstrap)
        .group_id("jepsen")
        .group_config(|g| {
            g.session_timeout = Duration::from_secs(6);
            g.heartbeat_interval = Duration::from_secs(1);
            g.consumer.auto_offset_reset = weir_client::OffsetReset::Earliest;
        })
        .build_group()
        .await
        .expect("a group member");
    let given = Given::default();
    member.set_rebalance_listener(given.clone());
    member.subscribe(&[&topic]).await.expect("subscribed");
    let next_run = AtomicU32::new(1);
    let mut runs: BTreeMap<u32, u32> = BTreeMap::new();
    while !stop.load(Ordering::Acquire) {
        let polled = member.poll(Duration::from_millis(200)).await;
        let fresh: Vec<TopicPartition> = std::mem::take(&mut *given.0.lock().unwrap());
        for (t, p) in fresh {
            let from = match member.committed(Some(&[(t, p)])).await {
                Ok(c) => Some(c.first().map_or(0, |c| c.offset)),
                Err(_) => None,
            };
            let run = next_run.fetch_add(1, Ordering::Relaxed);
            runs.insert(p, run);
            history.push(Event::Assigned {
                reader,
                run,
                partition: p,
                from,
            });
        }
        match polled {
            Ok(rs) if !rs.is_empty() => {
                record_polls(&history, reader, &runs, &rs);
                let _ = member.commit_sync().await;
            }
            Ok(_) => {}
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let _ = member.close().await;
}

/// Every replica's log of `topic`'s partitions, read off the nodes' disks
/// once the replicas hold the same bytes (or after `within`, as they are:
/// the checker then reports how they differ).
fn replica_logs(c: &Cluster, topic: &str, partitions: u32, within: Duration) -> Final {
    let nodes: Vec<u64> = c.bind.keys().copied().collect();
    let dir = |n: u64, p: u32| c.root.path().join(format!("node-{n}/{topic}-{p}"));
    let _ = poll_until(Instant::now() + within, || {
        let same = (0..partitions).all(|p| {
            let d: Vec<(u64, u32)> = nodes
                .iter()
                .map(|n| super::log_digest(&dir(*n, p)))
                .collect();
            d.windows(2).all(|w| w[0] == w[1])
        });
        same.then_some(()).ok_or(())
    });
    nodes
        .iter()
        .map(|n| {
            let ps = (0..partitions)
                .map(|p| (p, read_log(&dir(*n, p))))
                .collect();
            (*n, ps)
        })
        .collect()
}

/// The workload's records in a partition directory's segment files.
fn read_log(dir: &std::path::Path) -> BTreeMap<u64, Rec> {
    read_records(dir)
        .into_iter()
        .filter_map(|(o, _, r)| Some((o, r?)))
        .collect()
}

/// Every record in a partition directory's segment files: offset,
/// timestamp, and the workload's record if it is one.
fn read_records(dir: &std::path::Path) -> Vec<(u64, i64, Option<Rec>)> {
    use weir_proto::reader::RecordBatch;
    let mut out = Vec::new();
    for f in super::segment_files(dir) {
        let bytes = std::fs::read(&f).unwrap_or_default();
        // Up to the first invalid batch: the preallocated, zeroed tail.
        for (_, range) in weir_proto::batch::batches(&bytes).map_while(Result::ok) {
            let batch = RecordBatch::parse(&bytes[range]).expect("a validated batch");
            if batch.header().attributes.is_control() {
                continue;
            }
            let records = batch.records().expect("its records");
            for r in records.iter() {
                let r = r.expect("a record");
                let rec = r.record.value.and_then(Rec::parse);
                out.push((r.offset as u64, r.timestamp, rec));
            }
        }
    }
    out
}

/// The leader of each partition of `topic` as node `via` sees it.
fn leaders_via(c: &Cluster, via: u64, topic: &str) -> Vec<u64> {
    c.partition_rows_via(via, topic)
        .iter()
        .map(|r| r[1].parse().unwrap_or(0))
        .collect()
}

/// Waits until node `via` names, for partition `p`, a leader other than
/// `old` (a leadership moved away from a faulty node); panics with the
/// nodes' logs if it does not within `within`.
fn leader_moves(c: &Cluster, via: u64, topic: &str, p: usize, old: u64, within: Duration) {
    let moved = poll_until(Instant::now() + within, || {
        let now = leaders_via(c, via, topic);
        match now.get(p) {
            Some(l) if *l != old && *l != 0 => Ok(()),
            _ => Err(now),
        }
    });
    if let Err(now) = moved {
        let ids: Vec<u64> = c.bind.keys().copied().collect();
        let logs = c.log_tails(&ids, 40, |l| {
            !l.contains("DEBUG") && !l.contains("RPCError")
        });
        panic!(
            "{topic}-{p}'s leadership did not move off node {old} within {within:?} (as node \
             {via} sees it: leaders {now:?})\n{logs}"
        );
    }
}

/// The SDK clients' own log (to stderr) at `TEST_CLIENT_LOG` (a tracing
/// filter, e.g. `weir_client=debug`), if set.
fn client_log() {
    if let Ok(filter) = std::env::var("TEST_CLIENT_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// Node `i` of the net is cluster node `i + 1`.
fn ix(id: u64) -> usize {
    id as usize - 1
}

/// The network faults, in the order the CI test runs them.
const NETWORK_FAULTS: [&str; 8] = [
    "mute-leader",
    "isolate-leader",
    "isolate-controller",
    "one-way-from-leader",
    "bridge",
    "flapping",
    "loss",
    "slow-leader",
];

/// Whether the run makes fault `name`: all of them unless `WEIR_FAULTS`
/// names some (comma-separated), to look at one alone.
fn wanted(name: &str) -> bool {
    match std::env::var("WEIR_FAULTS") {
        Ok(list) => list.split(',').any(|f| f.trim() == name),
        Err(_) => true,
    }
}

/// Makes network fault `name` under the running workload `w`, asserts it
/// was in effect (and moved a leadership where it must), heals it and
/// waits for the ISR to be full again; says what happened.
fn network_fault(c: &mut Cluster, w: &Workload, topic: &str, name: &str) -> String {
    let settle = Duration::from_secs(30);
    let n = c.bind.len();
    eprintln!("fault: {name}");
    let what = match name {
        // Partition 0's leader's answers to its clients are lost for 2.5 s
        // (the producers' request timeout is 2 s): requests arrive and are
        // written, producers time out and send them again.
        "mute-leader" => {
            let leader = c.agreed_leader(topic);
            c.net.as_mut().unwrap().mute_to_clients(ix(leader));
            std::thread::sleep(Duration::from_millis(2_500));
            let dropped = c.net.as_ref().unwrap().dropped(ix(leader));
            assert!(dropped > 0, "the mute dropped nothing");
            c.net.as_mut().unwrap().heal();
            w.more_acks(c, 100, settle, "after the leader's answers were lost");
            format!("leader {leader}'s answers to clients lost for 2.5 s: {dropped} dropped")
        }
        // Partition 0's leader isolated from the other nodes (its clients
        // still reach it): it must stop acknowledging; another node leads.
        "isolate-leader" => {
            let leader = c.agreed_leader(topic);
            let other = *c.nodes.keys().find(|n| **n != leader).unwrap();
            c.net.as_mut().unwrap().isolate(ix(leader));
            leader_moves(c, other, topic, 0, leader, Duration::from_secs(15));
            w.more_acks(c, 100, settle, "with the old leader isolated");
            let dropped = c.net.as_ref().unwrap().dropped(ix(leader));
            assert!(dropped > 0, "the isolation dropped nothing");
            format!("leader {leader} isolated: {dropped} packets dropped, leadership moved")
        }
        // The controller leader isolated: another is elected.
        "isolate-controller" => {
            let controller = c.converged(&[1, 2, 3], settle).controller_leader;
            let other = *c.nodes.keys().find(|n| **n != controller).unwrap();
            c.net.as_mut().unwrap().isolate(ix(controller));
            weir_testkit::wait_until(
                Instant::now() + Duration::from_secs(15),
                format!("a controller leader other than node {controller}"),
                || match c.describe(other) {
                    Some(d) if d.controller_leader != controller && d.controller_leader != 0 => {
                        Ok(())
                    }
                    d => Err(format!("{:?}", d.map(|d| d.controller_leader))),
                },
            );
            w.more_acks(c, 100, settle, "with the controller leader isolated");
            let dropped = c.net.as_ref().unwrap().dropped(ix(controller));
            assert!(dropped > 0, "the isolation dropped nothing");
            format!("controller leader {controller} isolated: {dropped} dropped, another elected")
        }
        // Partition 0's leader sends nothing to the others (it still
        // hears them): it can neither heartbeat nor answer its followers;
        // fenced, it must lose the partition.
        "one-way-from-leader" => {
            let leader = c.agreed_leader(topic);
            let other = *c.nodes.keys().find(|n| **n != leader).unwrap();
            let links = (0..n)
                .filter(|j| *j != ix(leader))
                .map(|j| (ix(leader), j))
                .collect();
            c.net.as_mut().unwrap().set_cut(links);
            leader_moves(c, other, topic, 0, leader, Duration::from_secs(15));
            w.more_acks(c, 100, settle, "with the old leader's sends cut");
            let dropped = c.net.as_ref().unwrap().dropped(ix(leader));
            assert!(dropped > 0, "the cut dropped nothing");
            format!("leader {leader}'s sends cut: {dropped} dropped, leadership moved")
        }
        // A bridge through node 2: the others cannot reach each other,
        // each reaches node 2.
        "bridge" => {
            c.net.as_mut().unwrap().bridge_through(1);
            w.more_acks(c, 100, settle, "through a bridge");
            let dropped: u64 = (0..n).map(|i| c.net.as_ref().unwrap().dropped(i)).sum();
            assert!(dropped > 0, "the bridge dropped nothing");
            format!("bridge through node 2: {dropped} dropped")
        }
        // Each node in turn isolated for a second, then healed for half
        // of one.
        "flapping" => {
            let mut dropped = 0;
            for i in 0..n {
                c.net.as_mut().unwrap().isolate(i);
                std::thread::sleep(Duration::from_secs(1));
                dropped += c.net.as_ref().unwrap().dropped(i);
                c.net.as_mut().unwrap().heal();
                std::thread::sleep(Duration::from_millis(500));
            }
            assert!(dropped > 0, "the isolations dropped nothing");
            w.more_acks(c, 100, settle, "after flapping");
            format!("flapping isolations: {dropped} dropped")
        }
        // Every node drops 15 % of what it receives from the others.
        "loss" => {
            for i in 0..n {
                c.net.as_ref().unwrap().set_loss(i, 15);
            }
            w.more_acks(c, 100, settle, "under packet loss");
            let dropped: u64 = (0..n).map(|i| c.net.as_ref().unwrap().dropped(i)).sum();
            assert!(dropped > 0, "the loss dropped nothing");
            format!("15 % packet loss: {dropped} dropped")
        }
        // Partition 0's leader's link congested: 2 Mbit/s, up to 200 ms
        // queued, the rest dropped (the kernel has no netem for a plain
        // delay). Everything it sends — answers, replication, heartbeats —
        // is late or lost under load.
        "slow-leader" => {
            let leader = c.agreed_leader(topic);
            c.net.as_ref().unwrap().set_slow(ix(leader), Some("2mbit"));
            w.more_acks(c, 100, settle, "with the leader's link slow");
            let held = c.net.as_ref().unwrap().held_back(ix(leader));
            assert!(held > 0, "the slow link held nothing back");
            format!("leader {leader}'s link at 2 Mbit/s: {held} packets held back")
        }
        other => panic!("no network fault {other}"),
    };
    c.net.as_mut().unwrap().heal();
    c.converged(&[1, 2, 3], settle);
    c.isr_full(topic, 3, settle);
    what
}

/// The history's check against the replicas' logs, printed with what the
/// faults did; panics on any anomaly.
fn check_run(
    c: &Cluster,
    rt: &tokio::runtime::Runtime,
    w: Workload,
    topic: &str,
    partitions: u32,
    faults: &[String],
) -> checker::Report {
    let history = w.stop(rt);
    let logs = replica_logs(c, topic, partitions, Duration::from_secs(30));
    let report = checker::check(&history, &logs);
    eprintln!("faults:\n  {}\n{report}", faults.join("\n  "));
    report.assert_clean();
    assert!(report.polled > 0, "{report}");
    report
}

/// Network faults, one after another under one workload (see
/// [`NETWORK_FAULTS`]): every fault dropped packets, the first three
/// moved leaderships; the checker finds nothing.
#[test]
fn network_faults_lose_nothing_the_checker_can_find() {
    const TOPIC: &str = "jepsen";
    const PARTITIONS: u32 = 3;
    let _serial = serial();
    let rt = runtime();
    let (mut c, w) = running(&[], Producers::idempotent(2), &rt);
    let mut done = Vec::new();
    for name in NETWORK_FAULTS.into_iter().filter(|f| wanted(f)) {
        done.push(network_fault(&mut c, &w, TOPIC, name));
    }
    let report = check_run(&c, &rt, w, TOPIC, PARTITIONS, &done);
    assert!(report.acked >= 300 + 100 * done.len(), "{report}");
}

/// The process faults, in the order the CI test runs them.
const PROCESS_FAULTS: [&str; 4] = ["pause-leader", "kill-leader", "kill-two", "kill-all"];

/// Makes process fault `name` under the running workload `w`, asserts it
/// had its effect, brings every node back and waits for the ISR to be
/// full again; says what happened.
fn process_fault(c: &mut Cluster, w: &Workload, topic: &str, name: &str) -> String {
    let settle = Duration::from_secs(30);
    let all: Vec<u64> = c.bind.keys().copied().collect();
    eprintln!("fault: {name}");
    let what = match name {
        // Partition 0's leader SIGSTOPped past the session timeout: another
        // leads; SIGCONT.
        "pause-leader" => {
            let leader = c.agreed_leader(topic);
            let other = *c.nodes.keys().find(|n| **n != leader).unwrap();
            c.nodes[&leader].pause();
            leader_moves(c, other, topic, 0, leader, Duration::from_secs(15));
            w.more_acks(c, 100, settle, "with the leader paused");
            std::thread::sleep(Duration::from_millis(SESSION_MS));
            c.nodes[&leader].resume();
            format!("leader {leader} paused past the session timeout: leadership moved")
        }
        // Partition 0's leader SIGKILLed: another leads; restarted.
        "kill-leader" => {
            let leader = c.agreed_leader(topic);
            let other = *c.nodes.keys().find(|n| **n != leader).unwrap();
            c.nodes.remove(&leader).unwrap().kill();
            leader_moves(c, other, topic, 0, leader, Duration::from_secs(15));
            w.more_acks(c, 100, settle, "with the leader killed");
            c.start(leader);
            format!("leader {leader} killed: leadership moved; restarted")
        }
        // Two nodes SIGKILLed at once (no quorum, no ISR of 2), restarted.
        "kill-two" => {
            let two: Vec<u64> = c.nodes.keys().copied().take(2).collect();
            for id in &two {
                c.nodes.remove(id).unwrap().kill();
            }
            for id in &two {
                c.start(*id);
            }
            c.converged(&all, settle);
            w.more_acks(c, 100, settle, "after two nodes were killed and restarted");
            format!("nodes {two:?} killed at once, restarted")
        }
        // Every node SIGKILLed at once, restarted together.
        "kill-all" => {
            for id in &all {
                c.nodes.remove(id).unwrap().kill();
            }
            c.start_all();
            c.converged(&all, settle);
            w.more_acks(c, 100, settle, "after every node was killed and restarted");
            "every node killed at once, restarted".to_string()
        }
        other => panic!("no process fault {other}"),
    };
    c.converged(&all, settle);
    c.isr_full(topic, 3, settle);
    what
}

/// Process faults under one workload (see [`PROCESS_FAULTS`]): the
/// leader paused past the session timeout and resumed, the leader killed
/// and restarted, two nodes killed at once (no quorum) and every node
/// killed at once; the checker finds nothing.
#[test]
fn process_faults_lose_nothing_the_checker_can_find() {
    let _serial = serial();
    let rt = runtime();
    let (mut c, w) = workload_on(Cluster::new(3), Producers::idempotent(2), &rt);
    let mut done = Vec::new();
    for name in PROCESS_FAULTS.into_iter().filter(|f| wanted(f)) {
        done.push(process_fault(&mut c, &w, "jepsen", name));
    }
    let report = check_run(&c, &rt, w, "jepsen", 3, &done);
    assert!(report.acked >= 300 + 100 * done.len(), "{report}");
}

/// The long form (not in CI; `docs/reliability.md` has the command):
/// network and process faults picked at random (seed `WEIR_FAULTS_SEED`,
/// else the clock's, printed) for `WEIR_FAULTS_MINUTES` minutes (default
/// 60) under one workload on three nodes in namespaces, then the checker.
#[test]
#[ignore = "the long form: an hour by default"]
fn long_run_of_mixed_faults_loses_nothing_the_checker_can_find() {
    let minutes: u64 = std::env::var("WEIR_FAULTS_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(60);
    let mut seed: u64 = std::env::var("WEIR_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("long run: {minutes} min, WEIR_FAULTS_SEED={seed}");
    let _serial = serial();
    let rt = runtime();
    let (mut c, w) = running(&[], Producers::idempotent(2), &rt);
    let faults: Vec<&str> = NETWORK_FAULTS.into_iter().chain(PROCESS_FAULTS).collect();
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    let end = Instant::now() + Duration::from_secs(minutes * 60);
    while Instant::now() < end {
        // xorshift64
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let name = faults[(seed % faults.len() as u64) as usize];
        if NETWORK_FAULTS.contains(&name) {
            network_fault(&mut c, &w, "jepsen", name);
        } else {
            process_fault(&mut c, &w, "jepsen", name);
        }
        *counts.entry(name).or_default() += 1;
    }
    let done: Vec<String> = counts.iter().map(|(f, n)| format!("{f} × {n}")).collect();
    let report = check_run(&c, &rt, w, "jepsen", 3, &done);
    eprintln!(
        "long run: {minutes} min, {} faults, {} acknowledged, {} polled: clean",
        counts.values().sum::<u32>(),
        report.acked,
        report.polled
    );
}

/// A cluster of three nodes in namespaces (every node started with `env`)
/// running the workload (see [`workload_on`]).
fn running(
    env: &[(&str, &str)],
    producers: Producers,
    rt: &tokio::runtime::Runtime,
) -> (Cluster, Workload) {
    client_log();
    let mut c = Cluster::in_namespaces(3);
    c.env = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    workload_on(c, producers, rt)
}

/// Starts `c`'s nodes, creates topic `jepsen` (3 partitions, RF 3,
/// min.insync.replicas 2) and runs the workload on it until 300 records
/// are acknowledged.
fn workload_on(
    mut c: Cluster,
    producers: Producers,
    rt: &tokio::runtime::Runtime,
) -> (Cluster, Workload) {
    c.start_all();
    c.converged(&[1, 2, 3], Duration::from_secs(20));
    c.replicated_topic("jepsen", 3);
    let w = Workload::start(&c, rt, "jepsen", 3, producers, 2);
    w.more_acks(&c, 300, Duration::from_secs(30), "before any fault");
    (c, w)
}

/// The checker sees what a broken durability rule does (issue 31's
/// acceptance): with every leader's high watermark following its own
/// fdatasync'd offset alone (a mutation: `acks=all` answered before any
/// follower holds the records), isolating a leader loses records it
/// acknowledged, and the checker reports them.
#[test]
fn the_checker_reports_what_a_broken_durability_rule_loses() {
    let _serial = serial();
    let rt = runtime();
    let env = [(
        weir_broker::replica::state::MUTATION_HW_IGNORES_FOLLOWERS_ENV,
        "1",
    )];
    let (mut c, w) = running(&env, Producers::idempotent(2), &rt);
    let what = network_fault(&mut c, &w, "jepsen", "isolate-leader");
    let history = w.stop(&rt);
    let logs = replica_logs(&c, "jepsen", 3, Duration::from_secs(30));
    let report = checker::check(&history, &logs);
    eprintln!("{what}\n{report}");
    use checker::Anomaly::{AckedElsewhere, InconsistentOffset, Lost, Premature};
    assert!(report.count(Lost) > 0, "nothing reported lost:\n{report}");
    assert!(
        report.count(InconsistentOffset) + report.count(AckedElsewhere) + report.count(Premature)
            > 0,
        "{report}"
    );
}

/// The checker sees the duplicates of producers without idempotence: a
/// leader's answers lost for a while, the producers send again what it
/// had written, and the checker reports records twice in the log.
#[test]
fn the_checker_reports_the_duplicates_of_producers_without_idempotence() {
    let _serial = serial();
    let rt = runtime();
    let producers = Producers {
        count: 2,
        idempotent: false,
    };
    let (mut c, w) = running(&[], producers, &rt);
    let what = network_fault(&mut c, &w, "jepsen", "mute-leader");
    let history = w.stop(&rt);
    let logs = replica_logs(&c, "jepsen", 3, Duration::from_secs(30));
    let report = checker::check(&history, &logs);
    eprintln!("{what}\n{report}");
    assert!(
        report.count(checker::Anomaly::Duplicated) > 0,
        "no duplicate reported:\n{report}"
    );
}

/// The environment that runs a node under libfaketime with its wall clock
/// offset by what `clock` holds (`+3h`, `-10m`, …, re-read at every
/// clock read). `CLOCK_MONOTONIC` is left alone: on a real machine it
/// never jumps (NTP steps the wall clock), and leases, sessions and
/// timers are measured on it.
fn faketime_env(clock: &std::path::Path) -> Vec<(String, String)> {
    let lib = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("libfaketime: install it with `bash .ci/fault-tools`");
    [
        ("LD_PRELOAD", lib.to_string()),
        ("FAKETIME_TIMESTAMP_FILE", clock.display().to_string()),
        ("FAKETIME_NO_CACHE", "1".to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Seconds since the epoch of a log line's RFC 3339 timestamp
/// (`2026-12-04T21:20:24.136252Z …`).
fn line_time(line: &str) -> Option<i64> {
    let ts = line.split_whitespace().next()?;
    let (date, time) = ts.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let (h, min) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let sec = t.next()?.split('.').next()?.parse::<i64>().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3_600 + min * 60 + sec)
}

/// How far node `id`'s wall clock is from the test's, in seconds, as its
/// log shows: a topic `name` is created and the node's line about
/// following or leading its partition is dated by the node's clock.
fn clock_offset(c: &Cluster, id: u64, name: &str) -> i64 {
    c.create_topic(name, 1, 3, &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let needle = format!("partition={name}-0");
    let line = poll_until(Instant::now() + Duration::from_secs(10), || {
        std::fs::read_to_string(c.log_path(id))
            .unwrap_or_default()
            .lines()
            .find(|l| l.contains(&needle))
            .map(str::to_string)
            .ok_or(())
    })
    .unwrap_or_else(|()| panic!("node {id} logged nothing about {name}"));
    line_time(&line).expect("a dated line") - now
}

/// Clock faults on one node, under the workload: node 2's wall clock 3 h
/// ahead from its start, then stepped back 6 h (3 h behind), then to
/// 10 min ahead. Retention (default, 7 days), time-index lookups,
/// sessions and leases must not care: every anomaly count is 0, and a
/// timestamp lookup on every partition answers the first record at or
/// after the time asked, whoever leads it.
#[test]
fn clock_faults_on_one_node_lose_nothing_the_checker_can_find() {
    const PARTITIONS: u32 = 3;
    let _serial = serial();
    let rt = runtime();
    let mut c = Cluster::new(3);
    let clock = c.root.path().join("node-2.clock");
    std::fs::write(&clock, "+3h").unwrap();
    c.node_env.insert(2, faketime_env(&clock));
    let (c, w) = workload_on(c, Producers::idempotent(2), &rt);
    let mut done = Vec::new();
    for (i, (set, hours)) in [("+3h", 3.0), ("-3h", -3.0), ("+10m", 1.0 / 6.0)]
        .into_iter()
        .enumerate()
    {
        std::fs::write(&clock, set).unwrap();
        let off = clock_offset(&c, 2, &format!("tick-{i}"));
        let want = (hours * 3_600.0) as i64;
        assert!(
            (off - want).abs() < 120,
            "node 2's clock is {off} s off, wanted {want} s ({set})"
        );
        w.more_acks(
            &c,
            100,
            Duration::from_secs(30),
            &format!("with node 2's clock at {set}"),
        );
        done.push(format!("node 2's wall clock at {set}: its log {off} s off"));
    }
    std::fs::write(&clock, "+0").unwrap();
    let report = check_run(&c, &rt, w, "jepsen", PARTITIONS, &done);
    assert!(report.acked >= 600, "{report}");
    // Timestamp lookups: the first record at or after each time asked.
    let rows = c.partition_rows("jepsen");
    for p in 0..PARTITIONS {
        let leader: u64 = rows[p as usize][1].parse().unwrap();
        let records = read_records(&c.root.path().join(format!("node-{leader}/jepsen-{p}")));
        let client_addr = c.nodes[&leader].listen;
        for (o, ts, _) in records.iter().step_by((records.len() / 8).max(1)) {
            let found = rt.block_on(async {
                let client = weir_client::Client::connect(client_addr).await.unwrap();
                client
                    .list_offsets(
                        "jepsen",
                        p,
                        weir_proto::messages::OffsetSpec::Timestamp(*ts),
                    )
                    .await
                    .unwrap()
            });
            let first = records.iter().find(|(_, t, _)| t >= ts).map(|(o, _, _)| *o);
            assert_eq!(
                found, first,
                "jepsen-{p} at {ts} (the record at {o}), led by node {leader}"
            );
        }
    }
}

/// Disk faults on one node, under the workload: node 2's data on a small
/// disk of its own, its writes throttled to 20 per second for 6 s (a slow
/// disk), then the disk filled: node 2 stops (exit 74) and other
/// replicas lead what it led. The cluster goes on (≥ 100 records
/// acknowledged under each fault), nothing acknowledged is lost, and
/// given space and a restart node 2 rejoins the ISR.
#[test]
fn disk_faults_on_one_node_lose_nothing_the_checker_can_find() {
    const PARTITIONS: u32 = 3;
    let _serial = serial();
    let rt = runtime();
    let space = tempfile::tempdir().unwrap();
    let disk = weir_testkit::disk::Disk::new(space.path(), &space.path().join("node-2"), 256)
        .unwrap_or_else(|e| panic!("a loop-device disk for node 2: {e}"));
    let c = Cluster::new(3);
    std::fs::create_dir(disk.mount().join("data")).unwrap();
    std::os::unix::fs::symlink(disk.mount().join("data"), c.root.path().join("node-2")).unwrap();
    let (mut c, w) = workload_on(c, Producers::idempotent(2), &rt);
    let mut done = Vec::new();

    // A slow disk.
    disk.throttle(c.nodes[&2].pid(), 20).unwrap();
    let start = Instant::now();
    w.more_acks(&c, 100, Duration::from_secs(30), "with node 2's disk slow");
    std::thread::sleep(Duration::from_secs(6).saturating_sub(start.elapsed()));
    let writes = disk.throttled_writes();
    assert!(writes > 0, "no write of node 2 went through the throttle");
    disk.unthrottle().unwrap();
    done.push(format!(
        "node 2's disk at 20 writes/s for 6 s: {writes} writes throttled"
    ));
    c.isr_full("jepsen", 3, Duration::from_secs(30));

    // A full disk: 40 MiB more for a partition with a replica on node 2
    // (past the 32 MiB its segment has preallocated) while it has 64 KiB.
    // Node 2 stops (exit 74): other replicas lead what it led.
    c.replicated_topic("bulk", 1);
    disk.fill(64 << 10);
    let bulk = bulk_write(&c, &rt, 40 << 20);
    let status = {
        let n = c.nodes.get_mut(&2).unwrap();
        poll_until(Instant::now() + Duration::from_secs(30), || {
            n.try_wait().ok_or(())
        })
        .expect("node 2 stopped when its disk was full")
    };
    assert_eq!(status.code(), Some(74), "node 2's exit status");
    let log = c.log(2);
    assert!(
        log.contains("the data disk is full: stopping the broker"),
        "node 2's log says why it stopped:\n{log}"
    );
    w.more_acks(
        &c,
        100,
        Duration::from_secs(30),
        "with node 2 stopped by a full disk",
    );
    done.push(format!("node 2's disk full: it stopped (exit 74); {bulk}"));
    disk.unfill();
    c.nodes.remove(&2);
    c.start(2);
    c.converged(&[1, 2, 3], Duration::from_secs(30));
    c.isr_full("jepsen", 3, Duration::from_secs(30));
    let report = check_run(&c, &rt, w, "jepsen", PARTITIONS, &done);
    assert!(report.acked >= 500, "{report}");
    drop(c);
    drop(disk);
}

/// Writes `bytes` to topic `bulk` in 64 KiB records (acks=all, at most
/// 60 s); says how much was acknowledged.
fn bulk_write(c: &Cluster, rt: &tokio::runtime::Runtime, bytes: usize) -> String {
    let bootstrap: Vec<String> = c.nodes.values().map(|n| n.listen.to_string()).collect();
    let bootstrap = bootstrap.join(",");
    rt.block_on(async move {
        let producer = Producer::builder()
            .bootstrap(bootstrap)
            .config(|c| c.delivery_timeout_ms = 30_000)
            .build()
            .await
            .expect("a producer");
        let value = bytes::Bytes::from(vec![7u8; 64 << 10]);
        let mut deliveries = Vec::new();
        for _ in 0..bytes / value.len() {
            match producer
                .send(ProducerRecord::new("bulk", value.clone()).partition(0))
                .await
            {
                Ok(d) => deliveries.push(d),
                Err(_) => break,
            }
        }
        let (mut ok, mut failed, mut first) = (0, 0, None);
        for d in deliveries {
            match tokio::time::timeout(Duration::from_secs(60), d).await {
                Ok(Ok(_)) => ok += 1,
                Ok(Err(e)) => {
                    failed += 1;
                    first.get_or_insert(e.to_string());
                }
                Err(_) => failed += 1,
            }
        }
        producer.close().await;
        format!("{ok} × 64 KiB to bulk acknowledged, {failed} failed (first: {first:?})")
    })
}
