//! Consumer groups against a real broker (2 cores), through the SDK's
//! `GroupConsumer` and the `weir` CLI: independent groups, splitting
//! partitions, a member killed with SIGKILL, a member that stops polling,
//! fenced zombies, cooperative rebalancing, restarts, resets by time and
//! lag figures.

use crate::common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{runtime, Broker};
use tokio::time::Instant;
use weir_client::{
    Acks, Client, ConsumerRecord, GroupAssignor, GroupConsumer, GroupConsumerConfig,
    RebalanceListener, TopicPartition,
};
use weir_proto::error_code::ErrorCode;
use weir_proto::messages::{CommitOffset, HeartbeatRequest, JoinGroupRequest};

/// Settings for tests: a session long enough that a busy 2-core machine
/// never expels a healthy member (tests of expiry use their own), start at
/// the earliest record.
fn config(group: &str, assignor: GroupAssignor) -> GroupConsumerConfig {
    let mut c = GroupConsumerConfig::new(group);
    c.assignor = assignor;
    c.session_timeout = Duration::from_millis(6000);
    c.heartbeat_interval = Duration::from_millis(500);
    c.consumer.auto_offset_reset = weir_client::OffsetReset::Earliest;
    c.consumer.fetch_max_wait_ms = 100;
    c
}

async fn member(addr: SocketAddr, c: GroupConsumerConfig, topic: &str) -> GroupConsumer {
    let mut m = GroupConsumer::new(Client::connect(addr).await.unwrap(), c);
    m.subscribe(&[topic]).await.unwrap();
    m
}

/// Produces `n` records with values `{topic}-{p}-{i}` and timestamps
/// `ts + i` to each partition.
async fn produce(client: &Client, topic: &str, partitions: u32, n: usize, ts: i64) {
    for p in 0..partitions {
        let batch = common::records_batch(&format!("{topic}-{p}"), n, ts).freeze();
        client.produce(topic, p, batch, Acks::All).await.unwrap();
    }
}

/// Produces records with values `{prefix}-{p}-{i}` (i from `first`).
async fn produce_from(client: &Client, topic: &str, partitions: u32, first: usize, n: usize) {
    for p in 0..partitions {
        let mut b =
            weir_proto::builder::BatchBuilder::new(weir_proto::batch::Compression::None).unwrap();
        for i in first..first + n {
            b.push(&weir_proto::record::RecordData {
                key: None,
                value: Some(bytes::Bytes::from(format!("{topic}-{p}-{i}"))),
                headers: Vec::new(),
                timestamp: now_ms(),
            })
            .unwrap();
        }
        client
            .produce(topic, p, b.build().unwrap().freeze(), Acks::All)
            .await
            .unwrap();
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn value(r: &ConsumerRecord) -> String {
    String::from_utf8(r.value.as_ref().unwrap().to_vec()).unwrap()
}

fn all_values(topic: &str, partitions: u32, n: usize) -> BTreeSet<String> {
    (0..partitions)
        .flat_map(|p| (0..n).map(move |i| format!("{topic}-{p}-{i}")))
        .collect()
}

/// Polls every member in turn until `done` holds (30 s at most); returns
/// what each member got.
async fn poll_until(
    members: &mut [&mut GroupConsumer],
    mut done: impl FnMut(&[Vec<ConsumerRecord>], &[&mut GroupConsumer]) -> bool,
) -> Vec<Vec<ConsumerRecord>> {
    let mut got: Vec<Vec<ConsumerRecord>> = members.iter().map(|_| Vec::new()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done(&got, members) {
        assert!(Instant::now() < deadline, "condition not reached in 30 s");
        for (i, m) in members.iter_mut().enumerate() {
            got[i].extend(m.poll(Duration::from_millis(50)).await.unwrap());
        }
    }
    got
}

/// Polls the members until the coordinator reports the group `Stable`
/// with `n` members (every member reported owning its target; 30 s at
/// most).
async fn settle(admin: &Client, group: &str, members: &mut [&mut GroupConsumer], n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let d = admin.describe_group(group).await.unwrap();
        if d.members.len() == n && d.state == "Stable" {
            return;
        }
        assert!(Instant::now() < deadline, "{group} did not settle: {d:?}");
        for m in members.iter_mut() {
            m.poll(Duration::from_millis(20)).await.unwrap();
        }
    }
}

/// Records which partitions a member was given and lost.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(&'static str, TopicPartition)>>>);

impl Log {
    fn events(&self, kind: &str) -> Vec<TopicPartition> {
        let v = self.0.lock().unwrap();
        v.iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, tp)| tp.clone())
            .collect()
    }
}

impl RebalanceListener for Log {
    fn on_assigned(&mut self, partitions: &[TopicPartition]) {
        let mut v = self.0.lock().unwrap();
        v.extend(partitions.iter().map(|tp| ("assigned", tp.clone())));
    }
    fn on_revoked(&mut self, partitions: &[TopicPartition]) {
        let mut v = self.0.lock().unwrap();
        v.extend(partitions.iter().map(|tp| ("revoked", tp.clone())));
    }
    fn on_lost(&mut self, partitions: &[TopicPartition]) {
        let mut v = self.0.lock().unwrap();
        v.extend(partitions.iter().map(|tp| ("lost", tp.clone())));
    }
}

fn weir(b: &Broker, args: &[&str]) -> Output {
    common::weir(b, args, b"")
}

fn weir_ok(b: &Broker, args: &[&str]) -> String {
    let out = weir(b, args);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "weir {args:?} failed: {se}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn two_groups_read_the_same_topic_independently() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("events", 4, vec![]).await.unwrap();
        produce(&admin, "events", 4, 100, now_ms()).await;
        let want = all_values("events", 4, 100);
        // "alerting": one member; "warehouse": two members.
        let mut a = member(b.listen, config("alerting", GroupAssignor::Range), "events").await;
        let mut w1 = member(
            b.listen,
            config("warehouse", GroupAssignor::Range),
            "events",
        )
        .await;
        let mut w2 = member(
            b.listen,
            config("warehouse", GroupAssignor::Range),
            "events",
        )
        .await;
        let got = poll_until(&mut [&mut a, &mut w1, &mut w2], |got, _| {
            got[0].len() >= 400 && got[1].len() + got[2].len() >= 400
        })
        .await;
        let alerting: Vec<String> = got[0].iter().map(value).collect();
        assert_eq!(
            alerting.len(),
            400,
            "the only member reads each record once"
        );
        assert_eq!(alerting.iter().cloned().collect::<BTreeSet<_>>(), want);
        let warehouse: BTreeSet<String> = got[1].iter().chain(&got[2]).map(value).collect();
        assert_eq!(warehouse, want, "the second group sees every record too");
        // Both warehouse members get work.
        settle(&admin, "warehouse", &mut [&mut w1, &mut w2], 2).await;
        assert!(!w1.assignment().is_empty() && !w2.assignment().is_empty());
        let groups = admin.list_groups().await.unwrap();
        let names: Vec<&str> = groups.iter().map(|g| g.group.as_str()).collect();
        assert_eq!(names, ["alerting", "warehouse"]);
        for m in [a, w1, w2] {
            m.close().await.unwrap();
        }
    });
}

#[test]
fn three_members_split_six_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("six", 6, vec![]).await.unwrap();
        for assignor in [
            GroupAssignor::Range,
            GroupAssignor::RoundRobin,
            GroupAssignor::CooperativeSticky,
        ] {
            let group = format!("split-{}", assignor.name());
            let mut ms = Vec::new();
            for _ in 0..3 {
                ms.push(member(b.listen, config(&group, assignor), "six").await);
            }
            let [m1, m2, m3] = &mut ms[..] else {
                unreachable!()
            };
            poll_until(&mut [m1, m2, m3], |_, ms| {
                ms.iter().all(|m| m.assignment().len() == 2)
            })
            .await;
            let [m1, m2, m3] = &mut ms[..] else {
                unreachable!()
            };
            settle(&admin, &group, &mut [m1, m2, m3], 3).await;
            let mut union = BTreeSet::new();
            for m in &ms {
                for tp in m.assignment() {
                    assert!(union.insert(tp), "{assignor:?}: a partition owned twice");
                }
            }
            assert_eq!(union.len(), 6);
            let d = admin.describe_group(&group).await.unwrap();
            assert_eq!(d.assignor, assignor.name());
            for m in ms {
                m.close().await.unwrap();
            }
            let d = admin.describe_group(&group).await.unwrap();
            assert_eq!(d.state, "Empty");
        }
        // A fourth member of a 3-partition topic stays idle.
        admin.create_topic("three", 3, vec![]).await.unwrap();
        let mut ms = Vec::new();
        for _ in 0..4 {
            ms.push(member(b.listen, config("idle", GroupAssignor::Range), "three").await);
        }
        let [a, b2, c, d] = &mut ms[..] else {
            unreachable!()
        };
        poll_until(&mut [a, b2, c, d], |_, ms| {
            ms.iter().map(|m| m.assignment().len()).sum::<usize>() == 3
        })
        .await;
        assert_eq!(ms.iter().filter(|m| m.assignment().is_empty()).count(), 1);
    });
}

#[test]
fn member_killed_with_sigkill_is_replaced_and_processing_continues_from_the_last_commit() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let rt = runtime();
    let admin = rt.block_on(Client::connect(b.listen)).unwrap();
    rt.block_on(admin.create_topic("jobs", 4, vec![])).unwrap();
    // The victim: `weir consume --group --commit` in its own process.
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "consume",
            "jobs",
            "--group",
            "workers",
            "--commit",
            "--format",
            "%p %o %v",
            "--timeout-ms",
            "60000",
            "--session-timeout-ms",
            "1500",
            "--bootstrap",
            &b.listen.to_string(),
        ])
        .env("WEIR_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let printed = Arc::new(Mutex::new(Vec::<String>::new()));
    let out = child.stdout.take().unwrap();
    let sink = printed.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            match line {
                Ok(l) => sink.lock().unwrap().push(l),
                Err(_) => break,
            }
        }
    });
    rt.block_on(async {
        let mut survivor = member(
            b.listen,
            config("workers", GroupAssignor::CooperativeSticky),
            "jobs",
        )
        .await;
        let mut seen: Vec<ConsumerRecord> = Vec::new();
        // Both members own two partitions each.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            seen.extend(survivor.poll(Duration::from_millis(50)).await.unwrap());
            let d = admin.describe_group("workers").await.unwrap();
            if d.members.len() == 2 && d.state == "Stable" && survivor.assignment().len() == 2 {
                break;
            }
            assert!(Instant::now() < deadline, "no stable 2-member group: {d:?}");
        }
        produce_from(&admin, "jobs", 4, 0, 100).await;
        // Wait until the victim printed its half, then kill it.
        let deadline = Instant::now() + Duration::from_secs(30);
        while printed.lock().unwrap().len() < 200 {
            seen.extend(survivor.poll(Duration::from_millis(50)).await.unwrap());
            survivor.commit_sync().await.unwrap();
            assert!(Instant::now() < deadline, "the victim printed too little");
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let victim_parts: BTreeSet<u32> = printed
            .lock()
            .unwrap()
            .iter()
            .map(|l| l.split(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(victim_parts.len(), 2);
        // More work arrives while the victim is dead.
        produce_from(&admin, "jobs", 4, 100, 100).await;
        let want = all_values("jobs", 4, 200);
        let deadline = Instant::now() + Duration::from_secs(30);
        let killed = Instant::now();
        let mut took_over = None;
        loop {
            seen.extend(survivor.poll(Duration::from_millis(50)).await.unwrap());
            survivor.commit_sync().await.unwrap();
            if took_over.is_none() && survivor.assignment().len() == 4 {
                took_over = Some(killed.elapsed());
            }
            let mut all: BTreeSet<String> = seen.iter().map(value).collect();
            all.extend(
                printed
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|l| l.splitn(3, ' ').nth(2).unwrap().to_string()),
            );
            if all == want {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "records missing after the takeover: {:?}",
                want.difference(&all).take(5).collect::<Vec<_>>()
            );
        }
        // The takeover waited for the session timeout (1.5 s after the
        // victim's last heartbeat, which was at most a heartbeat interval,
        // 0.5 s, before the kill), and not much longer.
        let took = took_over.expect("the survivor owns every partition");
        assert!(took >= Duration::from_millis(400), "{took:?}");
        assert!(took < Duration::from_secs(10), "{took:?}");
        // The survivor resumed the victim's partitions at (or before) the
        // last offset the victim printed + 1: at-least-once, no gap.
        for p in victim_parts {
            let last_printed: u64 = printed
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.starts_with(&format!("{p} ")))
                .map(|l| l.split(' ').nth(1).unwrap().parse::<u64>().unwrap())
                .max()
                .unwrap();
            let first_after: u64 = seen
                .iter()
                .filter(|r| r.partition == p)
                .map(|r| r.offset)
                .min()
                .unwrap();
            assert!(first_after <= last_printed + 1, "gap in partition {p}");
        }
        let d = admin.describe_group("workers").await.unwrap();
        assert_eq!(d.members.len(), 1);
        survivor.close().await.unwrap();
    });
    reader.join().unwrap();
}

#[test]
fn member_that_stops_polling_is_expelled() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("slow", 4, vec![]).await.unwrap();
        let mut c = config("pollers", GroupAssignor::CooperativeSticky);
        c.max_poll_interval = Duration::from_millis(1000);
        let log = Log::default();
        let mut lazy = member(b.listen, c.clone(), "slow").await;
        lazy.set_rebalance_listener(log.clone());
        let mut busy = member(b.listen, c.clone(), "slow").await;
        poll_until(&mut [&mut lazy, &mut busy], |_, ms| {
            ms.iter().all(|m| m.assignment().len() == 2)
        })
        .await;
        let lazy_id = lazy.member_id();
        // `lazy` stops polling (its heartbeats go on): after
        // max_poll_interval it is out, and `busy` gets everything.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            busy.poll(Duration::from_millis(50)).await.unwrap();
            if busy.assignment().len() == 4 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the idle member was not expelled"
            );
        }
        let d = admin.describe_group("pollers").await.unwrap();
        assert!(d.members.iter().all(|m| m.member_id != lazy_id));
        // Its commits are refused; when it polls again it learns it lost
        // its partitions and rejoins as a new member.
        let e = lazy.commit_sync().await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnknownMemberId), "{e}");
        lazy.poll(Duration::from_millis(100)).await.unwrap();
        assert_eq!(log.events("lost").len(), 2);
        let deadline = Instant::now() + Duration::from_secs(15);
        while lazy.member_id().is_empty() || lazy.member_id() == lazy_id {
            lazy.poll(Duration::from_millis(50)).await.unwrap();
            busy.poll(Duration::from_millis(50)).await.unwrap();
            assert!(Instant::now() < deadline, "no rejoin");
        }
        // The coordinator expels on its own too: a heartbeat reporting a
        // poll older than max_poll_interval.
        let raw = Client::connect(b.listen).await.unwrap();
        let j = raw
            .join_group(JoinGroupRequest {
                group: "pollers".into(),
                member_id: String::new(),
                client_id: "raw".into(),
                topics: vec!["slow".into()],
                assignor: "cooperative-sticky".into(),
                session_timeout_ms: 5000,
                max_poll_interval_ms: 1000,
            })
            .await
            .unwrap();
        let e = raw
            .heartbeat(HeartbeatRequest {
                group: "pollers".into(),
                member_id: j.member_id.clone(),
                generation: j.generation,
                owned: vec![],
                since_poll_ms: 1500,
                wait_ms: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnknownMemberId), "{e}");
        assert!(e.to_string().contains("did not poll"), "{e}");
    });
}

#[test]
fn fenced_zombie_commit_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("fence", 2, vec![]).await.unwrap();
        produce(&admin, "fence", 2, 10, now_ms()).await;
        // A raw member that joins, takes both partitions, then goes silent
        // (a paused process: a zombie).
        let zombie = Client::connect(b.listen).await.unwrap();
        let j = zombie
            .join_group(JoinGroupRequest {
                group: "fenced".into(),
                member_id: String::new(),
                client_id: "zombie".into(),
                topics: vec!["fence".into()],
                assignor: "range".into(),
                session_timeout_ms: 500,
                max_poll_interval_ms: 60_000,
            })
            .await
            .unwrap();
        assert_eq!(
            j.assignment
                .iter()
                .map(|t| t.partitions.len())
                .sum::<usize>(),
            2
        );
        let hb = zombie
            .heartbeat(HeartbeatRequest {
                group: "fenced".into(),
                member_id: j.member_id.clone(),
                generation: j.generation,
                owned: j.assignment.clone(),
                since_poll_ms: 0,
                wait_ms: 0,
            })
            .await
            .unwrap();
        let offset = |p: u32, o: u64| CommitOffset {
            topic: "fence".into(),
            partition: p,
            offset: o,
            metadata: Some("zombie".into()),
        };
        zombie
            .commit_offsets("fenced", &j.member_id, hb.generation, vec![offset(0, 3)])
            .await
            .unwrap();
        // A commit beyond the log end is refused.
        let e = zombie
            .commit_offsets("fenced", &j.member_id, hb.generation, vec![offset(0, 11)])
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::OffsetOutOfRange), "{e}");
        // The replacement takes over after the zombie's session expires.
        let mut live = member(b.listen, config("fenced", GroupAssignor::Range), "fence").await;
        poll_until(&mut [&mut live], |_, ms| ms[0].assignment().len() == 2).await;
        let got = live.poll(Duration::from_millis(200)).await.unwrap();
        assert!(got.iter().all(|r| r.partition != 0 || r.offset >= 3));
        // The zombie wakes up and commits: refused, nothing changes.
        let e = zombie
            .commit_offsets("fenced", &j.member_id, hb.generation, vec![offset(0, 9)])
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnknownMemberId), "{e}");
        let c = admin.committed_offsets("fenced", None).await.unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].offset, c[0].metadata.as_deref()), (3, Some("zombie")));
        // A live member committing with a generation from before it joined
        // is fenced too.
        let e = admin
            .commit_offsets("fenced", &live.member_id(), 0, vec![offset(0, 5)])
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::StaleMemberEpoch), "{e}");
        live.commit_sync().await.unwrap();
        // Admin changes need an empty group.
        let e = admin
            .commit_offsets("fenced", "", -1, vec![offset(0, 0)])
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::GroupNotEmpty), "{e}");
        let e = admin.delete_group("fenced").await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::GroupNotEmpty), "{e}");
        live.close().await.unwrap();
        admin.delete_group("fenced").await.unwrap();
        let e = admin.describe_group("fenced").await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::GroupIdNotFound), "{e}");
        assert!(admin
            .committed_offsets("fenced", None)
            .await
            .unwrap()
            .is_empty());
        // Clients cannot write the internal topic.
        let e = admin
            .produce(
                "__consumer_offsets",
                0,
                common::records_batch("x", 1, 0).freeze(),
                Acks::All,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::PolicyViolation), "{e}");
        assert!(!admin
            .list_topics()
            .await
            .unwrap()
            .contains(&"__consumer_offsets".to_string()));
    });
}

#[test]
fn cooperative_rebalancing_keeps_unaffected_partitions_assigned() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("coop", 4, vec![]).await.unwrap();
        let c = config("coop", GroupAssignor::CooperativeSticky);
        let (la, lb) = (Log::default(), Log::default());
        let mut a = member(b.listen, c.clone(), "coop").await;
        a.set_rebalance_listener(la.clone());
        let mut bm = member(b.listen, c.clone(), "coop").await;
        bm.set_rebalance_listener(lb.clone());
        poll_until(&mut [&mut a, &mut bm], |_, ms| {
            ms.iter().all(|m| m.assignment().len() == 2)
        })
        .await;
        let (before_a, before_b) = (a.assignment(), bm.assignment());
        let (revoked_a, revoked_b) = (la.events("revoked").len(), lb.events("revoked").len());
        let mut cm = member(b.listen, c.clone(), "coop").await;
        poll_until(&mut [&mut a, &mut bm, &mut cm], |_, ms| {
            let sizes: Vec<usize> = ms.iter().map(|m| m.assignment().len()).collect();
            sizes.iter().sum::<usize>() == 4 && sizes.iter().all(|&n| n >= 1)
        })
        .await;
        // Exactly one partition moved (from a or b to c); nothing else was
        // revoked, and what a and b kept they never lost.
        let moved_a: Vec<_> = la.events("revoked")[revoked_a..].to_vec();
        let moved_b: Vec<_> = lb.events("revoked")[revoked_b..].to_vec();
        assert_eq!(moved_a.len() + moved_b.len(), 1, "{moved_a:?} {moved_b:?}");
        assert_eq!(cm.assignment().len(), 1);
        assert_eq!(
            cm.assignment()[0],
            moved_a.iter().chain(&moved_b).next().unwrap().clone()
        );
        for (before, now, moved) in [
            (&before_a, a.assignment(), &moved_a),
            (&before_b, bm.assignment(), &moved_b),
        ] {
            let kept: Vec<_> = before.iter().filter(|tp| !moved.contains(tp)).collect();
            assert!(kept.iter().all(|tp| now.contains(tp)));
        }
        assert!(la.events("lost").is_empty() && lb.events("lost").is_empty());
        // The group settles with a bumped generation.
        let d = admin.describe_group("coop").await.unwrap();
        assert_eq!(d.members.len(), 3);
        assert_eq!(d.assignor, "cooperative-sticky");
    });
}

#[test]
fn committed_offsets_survive_a_broker_restart() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let generation = runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("durable", 3, vec![]).await.unwrap();
        produce(&admin, "durable", 3, 50, now_ms()).await;
        let mut m = member(b.listen, config("keeper", GroupAssignor::Range), "durable").await;
        poll_until(&mut [&mut m], |_, ms| ms[0].assignment().len() == 3).await;
        let offsets = (0..3)
            .map(|p| CommitOffset {
                topic: "durable".into(),
                partition: p,
                offset: 10 + u64::from(p),
                metadata: Some(format!("m{p}")),
            })
            .collect();
        m.commit_offsets(offsets).await.unwrap();
        let generation = m.generation();
        m.close().await.unwrap();
        generation
    });
    assert!(b.stop().success());
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        let c = admin.committed_offsets("keeper", None).await.unwrap();
        let got: Vec<(u32, u64, Option<&str>)> = c
            .iter()
            .map(|o| (o.partition, o.offset, o.metadata.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (0, 10, Some("m0")),
                (1, 11, Some("m1")),
                (2, 12, Some("m2"))
            ]
        );
        // The internal topic is compacted (every record has a key; a
        // cleaner pass over it is accepted).
        let t = admin.describe_topic("__consumer_offsets").await.unwrap();
        assert!(t
            .configs
            .contains(&("cleanup.policy".to_string(), "compact".to_string())));
        admin.compact("__consumer_offsets", true).await.unwrap();
        assert_eq!(admin.committed_offsets("keeper", None).await.unwrap(), c);
        // Generations keep growing across the restart.
        let d = admin.describe_group("keeper").await.unwrap();
        assert!(
            d.generation >= generation,
            "{} < {generation}",
            d.generation
        );
        // A new member resumes at the committed offsets.
        let mut m = member(b.listen, config("keeper", GroupAssignor::Range), "durable").await;
        let got = poll_until(&mut [&mut m], |got, _| got[0].len() >= 40 + 39 + 38).await;
        for p in 0..3u32 {
            let first = got[0]
                .iter()
                .filter(|r| r.partition == p)
                .map(|r| r.offset)
                .min();
            assert_eq!(first, Some(10 + u64::from(p)));
        }
        assert_eq!(d.members.len(), 0);
    });
}

#[test]
fn reset_to_datetime_replays_exactly_the_records_from_that_time() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let rt = runtime();
    let hour = 3_600_000;
    let old_ts = now_ms() - 3 * hour;
    let new_ts = now_ms() - hour;
    rt.block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("replay", 2, vec![]).await.unwrap();
        for p in 0..2 {
            for (prefix, ts) in [("old", old_ts), ("new", new_ts)] {
                let batch = common::records_batch(&format!("{prefix}-{p}"), 20, ts).freeze();
                admin.produce("replay", p, batch, Acks::All).await.unwrap();
            }
        }
        // The group consumed everything.
        let mut m = member(b.listen, config("fixers", GroupAssignor::Range), "replay").await;
        poll_until(&mut [&mut m], |got, _| got[0].len() >= 80).await;
        m.commit_sync().await.unwrap();
        // Resetting needs the group to be empty.
        let out = weir(
            &b,
            &[
                "group",
                "reset",
                "fixers",
                "--topic",
                "replay",
                "--to-earliest",
            ],
        );
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("active members"));
        m.close().await.unwrap();
    });
    // "Replay the last two hours": the first record at or after new_ts.
    let at = humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + Duration::from_millis(new_ts as u64),
    )
    .to_string();
    let args = [
        "group",
        "reset",
        "fixers",
        "--topic",
        "replay",
        "--to-datetime",
        &at,
    ];
    let plan = weir_ok(&b, &args);
    assert!(plan.contains("TOPIC") && plan.contains("OLD") && plan.contains("NEW"));
    assert!(plan.contains("dry run"), "{plan}");
    let lines: Vec<Vec<&str>> = plan
        .lines()
        .filter(|l| l.trim_start().starts_with("replay"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines,
        [["replay", "0", "40", "20"], ["replay", "1", "40", "20"]]
    );
    rt.block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        let c = admin.committed_offsets("fixers", None).await.unwrap();
        assert!(c.iter().all(|o| o.offset == 40), "dry run changed nothing");
    });
    let mut exec = args.to_vec();
    exec.push("--execute");
    assert!(weir_ok(&b, &exec).contains("reset"));
    rt.block_on(async {
        let mut m = member(b.listen, config("fixers", GroupAssignor::Range), "replay").await;
        let got = poll_until(&mut [&mut m], |got, _| got[0].len() >= 40).await;
        // Nothing more arrives.
        let more = m.poll(Duration::from_millis(300)).await.unwrap();
        let values: BTreeSet<String> = got[0].iter().chain(&more).map(value).collect();
        let want: BTreeSet<String> = (0..2)
            .flat_map(|p| (0..20).map(move |i| format!("new-{p}-{i}")))
            .collect();
        assert_eq!(values, want);
        assert_eq!(got[0].len() + more.len(), 40);
        m.close().await.unwrap();
    });
    // The other reset modes, as plans.
    for (flag, value, want) in [
        ("--to-earliest", None, "0"),
        ("--to-latest", None, "40"),
        ("--to-offset", Some("7"), "7"),
        ("--shift-by", Some("-5"), "15"),
    ] {
        let mut a = vec!["group", "reset", "fixers", "--topic", "replay", flag];
        a.extend(value);
        let plan = weir_ok(&b, &a);
        let row: Vec<&str> = plan
            .lines()
            .find(|l| l.split_whitespace().take(2).eq(["replay", "0"]))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(row[3], want, "{flag}: {plan}");
    }
}

#[test]
fn lag_figures_match_produced_minus_committed() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let ts = now_ms() - 60_000;
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("lagging", 2, vec![]).await.unwrap();
        let b0 = common::records_batch("p0", 50, ts).freeze();
        admin.produce("lagging", 0, b0, Acks::All).await.unwrap();
        let b1 = common::records_batch("p1", 30, ts).freeze();
        admin.produce("lagging", 1, b1, Acks::All).await.unwrap();
        let offsets = vec![
            CommitOffset {
                topic: "lagging".into(),
                partition: 0,
                offset: 20,
                metadata: None,
            },
            CommitOffset {
                topic: "lagging".into(),
                partition: 1,
                offset: 30,
                metadata: None,
            },
        ];
        admin
            .commit_offsets("lagged", "", -1, offsets)
            .await
            .unwrap();
        let d = admin.describe_group("lagged").await.unwrap();
        assert_eq!(d.state, "Empty");
        let now = now_ms();
        let lag = admin.group_lag(&d, now).await.unwrap();
        assert_eq!(lag.len(), 2);
        assert_eq!(
            (lag[0].committed, lag[0].log_end, lag[0].lag),
            (Some(20), 50, 30)
        );
        // The next unconsumed record (offset 20) has timestamp ts + 20.
        let want = (now - (ts + 20)) as f64 / 1000.0;
        assert!((lag[0].lag_seconds - want).abs() < 0.01, "{lag:?}");
        assert_eq!(
            (lag[1].committed, lag[1].log_end, lag[1].lag),
            (Some(30), 30, 0)
        );
        assert_eq!(lag[1].lag_seconds, 0.0);
        // Group requests are served from every listener: each core's own
        // port forwards them to the coordinator's core too.
        for port in &b.core_ports {
            let c = Client::connect(("127.0.0.1", *port)).await.unwrap();
            let d = c.describe_group("lagged").await.unwrap();
            assert_eq!(d.offsets.len(), 2);
            assert_eq!(c.list_groups().await.unwrap().len(), 1);
        }
    });
    let out = weir_ok(&b, &["group", "describe", "lagged"]);
    assert!(out.contains("State: Empty"), "{out}");
    let header = out
        .lines()
        .find(|l| l.trim_start().starts_with("TOPIC"))
        .unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        [
            "TOPIC",
            "PARTITION",
            "CURRENT-OFFSET",
            "LOG-END-OFFSET",
            "LAG",
            "LAG-SECONDS",
            "CONSUMER-ID"
        ]
    );
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.split_whitespace().take(2).eq(["lagging", "0"]))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(&row[..5], ["lagging", "0", "20", "50", "30"]);
    let secs: f64 = row[5].parse().unwrap();
    assert!((55.0..120.0).contains(&secs), "{secs}");
    assert_eq!(row[6], "-");
    let list = weir_ok(&b, &["group", "list"]);
    assert!(list
        .lines()
        .any(|l| l.trim_start().starts_with("lagged") && l.contains("Empty")));
    assert!(weir_ok(&b, &["group", "delete", "lagged"]).contains("deleted"));
    assert!(!weir(&b, &["group", "describe", "lagged"]).status.success());
    // A recreated topic starts empty: commits are checked against its new
    // log end, not the old one.
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        let at = |offset| {
            vec![CommitOffset {
                topic: "lagging".into(),
                partition: 0,
                offset,
                metadata: None,
            }]
        };
        admin.commit_offsets("again", "", -1, at(50)).await.unwrap();
        admin.delete_topic("lagging").await.unwrap();
        admin.create_topic("lagging", 2, vec![]).await.unwrap();
        let e = admin
            .commit_offsets("again", "", -1, at(10))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::OffsetOutOfRange), "{e}");
        admin.commit_offsets("again", "", -1, at(0)).await.unwrap();
    });
}

#[test]
fn a_held_heartbeat_replaced_by_a_newer_one_of_the_same_member_is_answered_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("held", 2, vec![]).await.unwrap();
        let j = admin
            .join_group(JoinGroupRequest {
                group: "held".into(),
                member_id: String::new(),
                client_id: "raw".into(),
                topics: vec!["held".into()],
                assignor: "cooperative-sticky".into(),
                session_timeout_ms: 10_000,
                max_poll_interval_ms: 60_000,
            })
            .await
            .unwrap();
        // Nothing will change: each heartbeat may be held up to 5 s.
        let heartbeat = || {
            let (addr, member_id, owned) = (b.listen, j.member_id.clone(), j.assignment.clone());
            let generation = j.generation;
            tokio::spawn(async move {
                let c = Client::connect(addr).await.unwrap();
                let r = c
                    .heartbeat(HeartbeatRequest {
                        group: "held".into(),
                        member_id,
                        generation,
                        owned,
                        since_poll_ms: 0,
                        wait_ms: 5_000,
                    })
                    .await;
                (r, Instant::now())
            })
        };
        let started = Instant::now();
        let first = heartbeat();
        // Let the first one be held before the second arrives (if it is
        // not yet, the roles swap: still one of them must go at once).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let second = heartbeat();
        let (r1, t1) = first.await.unwrap();
        let (r2, t2) = second.await.unwrap();
        r1.unwrap();
        r2.unwrap();
        let early = t1.min(t2).duration_since(started);
        assert!(
            early < Duration::from_millis(2_500),
            "the replaced heartbeat was held {early:?} (it used to spin the core until its hold ran out)"
        );
    });
    b.stop();
}

/// The partitions of an answer, as (topic, partition) pairs.
fn parts(list: &[weir_proto::messages::TopicPartitions]) -> BTreeSet<(String, u32)> {
    list.iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t.topic.clone(), *p)))
        .collect()
}

/// A owns 4 partitions; B joins, A releases what moves to B, B is answered
/// its share; C joins *before B's next heartbeat*. The sticky target now
/// splits B's share between B and C — but B was handed those partitions
/// and may already be consuming them, so C must not be handed any of them
/// until B has heard of the change and released them (this used to hand
/// C a partition B was still entitled to, and both could commit it).
#[test]
fn a_partition_handed_out_but_not_yet_reported_is_not_handed_out_again() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("abc", 4, vec![]).await.unwrap();
        produce(&admin, "abc", 4, 5, now_ms()).await;
        let c = Client::connect(b.listen).await.unwrap();
        let join = |id: &str| JoinGroupRequest {
            group: "abc-group".into(),
            member_id: String::new(),
            client_id: id.into(),
            topics: vec!["abc".into()],
            assignor: "cooperative-sticky".into(),
            session_timeout_ms: 60_000,
            max_poll_interval_ms: 60_000,
        };
        let hb = |id: &str, generation: i32, owned: &[weir_proto::messages::TopicPartitions]| {
            HeartbeatRequest {
                group: "abc-group".into(),
                member_id: id.into(),
                generation,
                owned: owned.to_vec(),
                since_poll_ms: 0,
                wait_ms: 0,
            }
        };
        // A joins and takes all 4.
        let a = c.join_group(join("a")).await.unwrap();
        assert_eq!(parts(&a.assignment).len(), 4);
        let a1 = c
            .heartbeat(hb(&a.member_id, a.generation, &a.assignment))
            .await
            .unwrap();
        // B joins: nothing free yet (A owns everything).
        let bj = c.join_group(join("b")).await.unwrap();
        assert!(parts(&bj.assignment).is_empty());
        // A learns its new share and releases the rest.
        let a2 = c
            .heartbeat(hb(&a.member_id, a1.generation, &a1.assignment))
            .await
            .unwrap();
        assert_eq!(parts(&a2.assignment).len(), 2);
        let a3 = c
            .heartbeat(hb(&a.member_id, a2.generation, &a2.assignment))
            .await
            .unwrap();
        // B is answered its share (and may start consuming it).
        let b1 = c
            .heartbeat(hb(&bj.member_id, bj.generation, &[]))
            .await
            .unwrap();
        let b_share = parts(&b1.assignment);
        assert_eq!(b_share.len(), 2);
        // C joins before B's next heartbeat.
        let cj = c.join_group(join("c")).await.unwrap();
        let c_share = parts(&cj.assignment);
        assert!(
            c_share.is_disjoint(&b_share),
            "C was handed {c_share:?} while B still holds {b_share:?}"
        );
        // C cannot commit a partition B holds.
        let (topic, p) = b_share.iter().next().unwrap().clone();
        let e = c
            .commit_offsets(
                "abc-group",
                &cj.member_id,
                cj.generation,
                vec![CommitOffset {
                    topic,
                    partition: p,
                    offset: 1,
                    metadata: None,
                }],
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::StaleMemberEpoch), "{e}");
        // B hears of the change, takes what it was handed, and releases
        // what moves to C; then C gets it.
        let b2 = c
            .heartbeat(hb(&bj.member_id, b1.generation, &b1.assignment))
            .await
            .unwrap();
        // B now releases what moves to C: describe shows it revoking, and
        // held by nobody else.
        let d = c.describe_group("abc-group").await.unwrap();
        assert_eq!(
            (d.kind.as_str(), d.state.as_str()),
            ("consumer", "Reconciling")
        );
        let bd = d
            .members
            .iter()
            .find(|m| m.member_id == bj.member_id)
            .unwrap();
        let revoking = parts(&bd.revoking);
        assert!(!revoking.is_empty(), "{d:?}");
        assert!(revoking.is_disjoint(&parts(&b2.assignment)));
        for m in d.members.iter().filter(|m| m.member_id != bj.member_id) {
            assert!(parts(&m.owned).is_disjoint(&revoking), "{d:?}");
        }
        let b3 = c
            .heartbeat(hb(&bj.member_id, b2.generation, &b2.assignment))
            .await
            .unwrap();
        let c1 = c
            .heartbeat(hb(&cj.member_id, cj.generation, &cj.assignment))
            .await
            .unwrap();
        let (a_now, b_now, c_now) = (
            parts(&a3.assignment),
            parts(&b3.assignment),
            parts(&c1.assignment),
        );
        assert!(a_now.is_disjoint(&b_now) && b_now.is_disjoint(&c_now));
        assert!(a_now.is_disjoint(&c_now));
        assert!(!c_now.is_empty(), "C got its share once B released it");
        assert_eq!(a_now.len() + b_now.len() + c_now.len(), 4);
    });
    // `weir group describe` shows the type, the epochs and what each
    // member holds, releases and is headed for.
    let out = weir_ok(&b, &["group", "describe", "abc-group"]);
    assert!(out.contains("Type: consumer"), "{out}");
    let header = out
        .lines()
        .find(|l| l.trim_start().starts_with("CONSUMER-ID"))
        .unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        [
            "CONSUMER-ID",
            "CLIENT-ID",
            "EPOCH",
            "TOPICS",
            "ASSIGNED",
            "REVOKING",
            "TARGET"
        ]
    );
    for client in ["a", "b", "c"] {
        let row: Vec<&str> = out
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|r| r.get(1) == Some(&client))
            .unwrap_or_else(|| panic!("no row for {client}: {out}"));
        let epoch: i32 = row[2].parse().unwrap();
        assert!(epoch >= 1, "{out}");
        assert_eq!(row[3], "abc");
    }
}

/// A rejoin with a member id the group does not know is refused and
/// leaves no empty group behind; commits are bounded; the internal topic's
/// configs cannot be changed by clients.
#[test]
fn bad_group_requests_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        c.create_topic("bounded", 1, vec![]).await.unwrap();
        let e = c
            .join_group(JoinGroupRequest {
                group: "phantom".into(),
                member_id: "made-up".into(),
                client_id: "x".into(),
                topics: vec!["bounded".into()],
                assignor: "range".into(),
                session_timeout_ms: 10_000,
                max_poll_interval_ms: 10_000,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnknownMemberId), "{e}");
        let groups = c.list_groups().await.unwrap();
        assert!(
            groups.iter().all(|g| g.group != "phantom"),
            "a phantom group was left: {groups:?}"
        );
        let offsets: Vec<CommitOffset> = (0..10_001)
            .map(|p| CommitOffset {
                topic: "bounded".into(),
                partition: p,
                offset: 0,
                metadata: None,
            })
            .collect();
        let e = c
            .commit_offsets("bounded-group", "", -1, offsets)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidRequest), "{e}");
        assert!(e.to_string().contains("at most 10000"), "{e}");
        let e = c
            .alter_configs(
                "__consumer_offsets",
                vec![("cleanup.policy".into(), "delete".into())],
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidConfig), "{e}");
        assert!(e.to_string().contains("internal"), "{e}");
    });
}

/// Offsets committed by a group (0 if it does not exist).
async fn committed(c: &Client, g: &str) -> usize {
    c.committed_offsets(g, None)
        .await
        .map(|v| v.len())
        .unwrap_or(0)
}

/// An empty group is removed with its offsets once `--offsets-retention-ms`
/// passed since its last commit (tombstones written, so it stays gone
/// after a restart), and the offsets of a deleted topic are purged at once.
#[test]
fn empty_groups_expire_and_offsets_of_deleted_topics_are_purged() {
    let dir = tempfile::tempdir().unwrap();
    // One small-segment partition of `__consumer_offsets`, so the
    // compaction of the expired groups' records can be seen.
    let args = [
        "--offsets-retention-ms",
        "1500",
        "--offsets-partitions",
        "1",
        "--offsets-segment-bytes",
        "4096",
    ];
    let b = Broker::start_with(dir.path(), 2, &args);
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        for t in ["kept", "gone"] {
            c.create_topic(t, 1, vec![]).await.unwrap();
            produce(&c, t, 1, 5, now_ms()).await;
        }
        let offset = |t: &str| CommitOffset {
            topic: t.into(),
            partition: 0,
            offset: 3,
            metadata: None,
        };
        c.commit_offsets("g-kept", "", -1, vec![offset("kept")])
            .await
            .unwrap();
        c.commit_offsets("g-gone", "", -1, vec![offset("gone"), offset("kept")])
            .await
            .unwrap();
        let last_commit = Instant::now();
        assert_eq!(committed(&c, "g-gone").await, 2);
        c.delete_topic("gone").await.unwrap();
        assert_eq!(
            committed(&c, "g-gone").await,
            1,
            "the deleted topic's offset is purged when the deletion is acknowledged"
        );
        // Both groups are empty: they expire after the retention.
        let t0 = Instant::now();
        loop {
            let groups = c.list_groups().await.unwrap();
            if groups.iter().all(|g| !g.group.starts_with("g-")) {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "groups not expired: {groups:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            last_commit.elapsed() >= Duration::from_millis(1200),
            "expired {:?} after the last commit, retention 1500 ms",
            last_commit.elapsed()
        );
        assert_eq!(committed(&c, "g-kept").await, 0);
        // Their records are tombstoned: once the segments holding them
        // close (other groups' commits roll them) and the cleaner runs,
        // no offset of theirs is left in the log.
        assert!(
            live_records_of(&c, &["g-kept", "g-gone"]).await > 0,
            "before compaction the commits are in the log"
        );
        for i in 0..100u64 {
            let o = CommitOffset {
                topic: "kept".into(),
                partition: 0,
                offset: i % 5,
                metadata: Some("x".repeat(64)),
            };
            c.commit_offsets("filler", "", -1, vec![o]).await.unwrap();
        }
        c.compact("__consumer_offsets", true).await.unwrap();
        assert_eq!(
            live_records_of(&c, &["g-kept", "g-gone"]).await,
            0,
            "the expired groups' offsets were compacted away"
        );
    });
    assert_eq!(b.stop().code(), Some(0));
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let c = Client::connect(b.listen).await.unwrap();
        let groups = c.list_groups().await.unwrap();
        assert!(
            groups.iter().all(|g| !g.group.starts_with("g-")),
            "expired groups came back after a restart: {groups:?}"
        );
        assert_eq!(committed(&c, "g-kept").await, 0);
        assert_eq!(committed(&c, "g-gone").await, 0);
    });
}

/// Records of `__consumer_offsets` (one partition) with a value whose key
/// names one of `groups` (tombstones are not counted).
async fn live_records_of(c: &Client, groups: &[&str]) -> usize {
    let mut at = 0;
    let mut n = 0;
    loop {
        let f = c
            .fetch("__consumer_offsets", 0, at, 1 << 20, 0)
            .await
            .unwrap();
        if f.batches.is_empty() {
            return n;
        }
        for b in &f.batches {
            let rb = weir_proto::reader::RecordBatch::parse(b).unwrap();
            at = rb.header().last_offset() as u64 + 1;
            for r in rb.records().unwrap().iter() {
                let r = r.unwrap();
                let key = r.record.key.unwrap_or_default();
                let named = groups
                    .iter()
                    .any(|g| key.windows(g.len()).any(|w| w == g.as_bytes()));
                if named && r.record.value.is_some() {
                    n += 1;
                }
            }
        }
        if at >= f.high_watermark {
            return n;
        }
    }
}

/// Raw members commit continuously while others join and leave (the
/// group keeps rebalancing); the broker is killed with SIGKILL in the
/// middle. After the restart every acknowledged commit is there (or a
/// later one), the members come back with their epochs (a member that
/// heartbeats with its stored epoch resumes), and no epoch is handed out
/// twice: every epoch answered after the restart is above every epoch
/// answered before it, or the resumed member's own.
#[test]
fn sigkill_mid_rebalance_keeps_acknowledged_commits_and_reuses_no_epoch() {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const PARTITIONS: u32 = 6;
    const RECORDS: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let join = |client_id: String| JoinGroupRequest {
        group: "mid".into(),
        member_id: String::new(),
        client_id,
        topics: vec!["mid".into()],
        assignor: "cooperative-sticky".into(),
        session_timeout_ms: 30_000,
        max_poll_interval_ms: 30_000,
    };
    let hb = |id: &str, generation: i32, owned: Vec<weir_proto::messages::TopicPartitions>| {
        HeartbeatRequest {
            group: "mid".into(),
            member_id: id.into(),
            generation,
            owned,
            since_poll_ms: 0,
            wait_ms: 0,
        }
    };
    // Highest acknowledged commit per partition; highest epoch answered;
    // the last (member, epoch, assignment) of a member that stays.
    let acked: Arc<Mutex<BTreeMap<u32, u64>>> = Arc::default();
    let max_epoch = Arc::new(Mutex::new(0i32));
    let stayer: Arc<Mutex<Option<(String, i32)>>> = Arc::default();
    let next: Arc<Vec<AtomicU64>> = Arc::new((0..PARTITIONS).map(|_| AtomicU64::new(0)).collect());
    let dead = Arc::new(AtomicBool::new(false));
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        admin.create_topic("mid", PARTITIONS, vec![]).await.unwrap();
        produce_from(&admin, "mid", PARTITIONS, 0, RECORDS as usize).await;
        let mut tasks = Vec::new();
        for i in 0..4usize {
            let (addr, acked, max_epoch, stayer, next, dead) = (
                b.listen,
                acked.clone(),
                max_epoch.clone(),
                stayer.clone(),
                next.clone(),
                dead.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let c = Client::connect(addr).await.unwrap();
                // Member 0 stays; the others leave and rejoin, so the
                // group keeps rebalancing.
                let mut rounds = 0u32;
                'life: while !dead.load(Ordering::Relaxed) {
                    let Ok(mut a) = c.join_group(join(format!("m{i}"))).await else {
                        break;
                    };
                    rounds += 1;
                    for _ in 0..(if i == 0 { u32::MAX } else { 5 + rounds % 7 }) {
                        {
                            let mut m = max_epoch.lock().unwrap();
                            *m = (*m).max(a.generation);
                        }
                        if i == 0 {
                            *stayer.lock().unwrap() = Some((a.member_id.clone(), a.generation));
                        }
                        for t in &a.assignment {
                            for &p in &t.partitions {
                                let o = next[p as usize].fetch_add(1, Ordering::SeqCst) + 1;
                                let off = CommitOffset {
                                    topic: "mid".into(),
                                    partition: p,
                                    offset: o.min(RECORDS),
                                    metadata: None,
                                };
                                match c
                                    .commit_offsets("mid", &a.member_id, a.generation, vec![off])
                                    .await
                                {
                                    Ok(_) => {
                                        let mut acked = acked.lock().unwrap();
                                        let e = acked.entry(p).or_default();
                                        *e = (*e).max(o.min(RECORDS));
                                    }
                                    Err(e) if e.code().is_some() => {}
                                    Err(_) => break 'life,
                                }
                            }
                        }
                        match c
                            .heartbeat(hb(&a.member_id, a.generation, a.assignment.clone()))
                            .await
                        {
                            Ok(n) => a = n,
                            Err(e) if e.code().is_some() => continue 'life,
                            Err(_) => break 'life,
                        }
                    }
                    if c.leave_group("mid", &a.member_id).await.is_err() {
                        break;
                    }
                }
            }));
        }
        // Kill once enough commits were acknowledged across rebalances.
        let deadline = Instant::now() + Duration::from_secs(60);
        while acked.lock().unwrap().values().sum::<u64>() < 300 || *max_epoch.lock().unwrap() < 8 {
            assert!(
                Instant::now() < deadline,
                "no progress: {:?}",
                acked.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        dead.store(true, Ordering::Relaxed);
        b.kill();
        for t in tasks {
            t.await.unwrap();
        }
    });
    let acked = acked.lock().unwrap().clone();
    let max_epoch = *max_epoch.lock().unwrap();
    let (stayer_id, stayer_epoch) = stayer.lock().unwrap().clone().unwrap();
    let b = Broker::start(dir.path(), 2);
    runtime().block_on(async {
        let admin = Client::connect(b.listen).await.unwrap();
        let committed: BTreeMap<u32, u64> = admin
            .committed_offsets("mid", None)
            .await
            .unwrap()
            .iter()
            .map(|o| (o.partition, o.offset))
            .collect();
        for (p, o) in &acked {
            assert!(
                committed.get(p).is_some_and(|c| c >= o),
                "partition {p}: acknowledged {o}, committed after the restart {:?}",
                committed.get(p)
            );
        }
        let d = admin.describe_group("mid").await.unwrap();
        assert!(d.generation >= max_epoch, "{} < {max_epoch}", d.generation);
        let m = d
            .members
            .iter()
            .find(|m| m.member_id == stayer_id)
            .expect("the member that stayed is restored");
        // It resumes: a heartbeat with its epoch (or the one before, if an
        // answer was lost in the kill) is accepted.
        let resumed = admin
            .heartbeat(hb(&stayer_id, m.member_epoch, m.owned.clone()))
            .await
            .unwrap();
        assert!(resumed.generation >= stayer_epoch);
        let fresh = admin.join_group(join("after".into())).await.unwrap();
        assert!(
            fresh.generation > max_epoch,
            "a join after the restart got epoch {} (epochs up to {max_epoch} were answered before)",
            fresh.generation
        );
    });
    b.stop();
}
