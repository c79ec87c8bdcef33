//! A simulation of a consumer group under faults, driving the
//! coordinator's state machine ([`ConsumerGroup`]) the way the coordinator
//! does — every step's records stored before its answer, a restart
//! rebuilding the group from what was stored — with simulated clients
//! that join, heartbeat, process, commit (commits delayed at random, so
//! they race rebalances), stall (zombies that keep processing and
//! committing), crash, leave, and lose answers.
//!
//! Checked at every step, for thousands of seeded runs:
//! - no partition is held (assigned or revoking) by two members;
//! - an applied commit comes from the member that holds the partition now
//!   and has held it without a break since the commit was made (so no
//!   fenced, expelled or stale member's commit is applied);
//! - committed offsets never go backwards (every owner resumes from the
//!   committed offset, and only the rightful owner's commits land);
//! - no epoch is handed out twice: the group epoch, after a restart too,
//!   is never below an epoch already answered.

use std::collections::{BTreeMap, BTreeSet};

use crate::assignor::Tp;
use crate::consumer::{Answer, ConsumerGroup, GroupError, Heartbeat, JOIN_EPOCH, LEAVE_EPOCH};
use crate::records::{self, GroupValue};

const TOPIC: &str = "t";
const PARTITIONS: u32 = 6;
const SESSION_MS: u32 = 1_000;
const REBALANCE_MS: u32 = 2_000;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn counts(t: &str) -> Option<u32> {
    (t == TOPIC).then_some(PARTITIONS)
}

/// A commit on its way to the coordinator.
struct InFlight {
    member: String,
    epoch: i32,
    tp: Tp,
    offset: u64,
    made_at: u64,
}

/// A simulated consumer.
#[derive(Default)]
struct Client {
    member: String,
    epoch: i32,
    /// Partitions it processes, with its position in each.
    owned: BTreeMap<Tp, u64>,
    /// Stops heartbeating (but keeps processing: a zombie) until this
    /// time.
    stalled_until: u64,
}

/// What the coordinator has stored: the group record and member records.
#[derive(Default, Clone)]
struct Stored {
    group: Option<GroupValue>,
    members: BTreeMap<String, bytes::Bytes>,
}

struct Sim {
    rng: Rng,
    now: u64,
    step: u64,
    group: ConsumerGroup,
    stored: Stored,
    committed: BTreeMap<Tp, u64>,
    clients: Vec<Client>,
    in_flight: Vec<InFlight>,
    /// (member, partition) → the step since which it holds it.
    holding_since: BTreeMap<(String, Tp), u64>,
    max_answered_epoch: i32,
    next_id: u64,
    applied: u64,
    refused: u64,
    restarts: u64,
}

impl Sim {
    fn new(seed: u64, clients: usize) -> Sim {
        Sim {
            rng: Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
            now: 0,
            step: 0,
            group: ConsumerGroup::default(),
            stored: Stored::default(),
            committed: BTreeMap::new(),
            clients: (0..clients).map(|_| Client::default()).collect(),
            in_flight: Vec::new(),
            holding_since: BTreeMap::new(),
            max_answered_epoch: 0,
            next_id: 0,
            applied: 0,
            refused: 0,
            restarts: 0,
        }
    }

    /// Stores what the last step changed (the coordinator's `persist`),
    /// through the real record encoding.
    fn persist(&mut self) {
        let dirty = self.group.take_dirty();
        if dirty.group {
            self.stored.group = Some(GroupValue {
                group_epoch: self.group.group_epoch,
                assignment_epoch: self.group.assignment_epoch,
                assignor: self.group.assignor.clone(),
            });
        }
        for id in dirty.members {
            match self.group.members.get(&id) {
                Some(m) => {
                    self.stored.members.insert(id, records::encode_member(m));
                }
                None => {
                    self.stored.members.remove(&id);
                }
            }
        }
    }

    /// The coordinator restarts: the group is what was stored.
    fn restart(&mut self) {
        self.restarts += 1;
        let (ge, ae, assignor) = self
            .stored
            .group
            .as_ref()
            .map_or((0, 0, String::new()), |g| {
                (g.group_epoch, g.assignment_epoch, g.assignor.clone())
            });
        let members = self
            .stored
            .members
            .iter()
            .map(|(id, b)| (id.clone(), records::decode_member(b).expect("decodes")))
            .collect();
        self.group = ConsumerGroup::restore(ge, ae, assignor, members, self.now);
    }

    /// Runs one heartbeat through the coordinator: stored before it is
    /// answered; a crash between deciding and storing loses the step
    /// (and its answer) as the real coordinator would.
    fn heartbeat(&mut self, hb: Heartbeat) -> Option<Result<Answer, GroupError>> {
        let id = &mut self.next_id;
        let mut fresh = || {
            *id += 1;
            format!("m{id}")
        };
        let r = self.group.heartbeat(self.now, hb, &mut fresh, &counts);
        if self.rng.chance(2) {
            // Crash before the records were durable: nothing answered.
            self.group.take_dirty();
            self.restart();
            return None;
        }
        self.persist();
        if let Ok(a) = &r {
            self.max_answered_epoch = self.max_answered_epoch.max(a.member_epoch);
        }
        Some(r)
    }

    /// A client takes in an answer: commits and gives up what it lost,
    /// takes what it gained from the committed offset.
    fn apply(&mut self, c: usize, a: Answer) {
        let made_at = self.step;
        let client = &mut self.clients[c];
        client.member = a.member_id.clone();
        client.epoch = a.member_epoch;
        let lost: Vec<Tp> = client
            .owned
            .keys()
            .filter(|tp| !a.assignment.contains(*tp))
            .cloned()
            .collect();
        for tp in lost {
            let offset = client.owned.remove(&tp).expect("owned");
            self.in_flight.push(InFlight {
                member: client.member.clone(),
                epoch: client.epoch,
                tp,
                offset,
                made_at,
            });
        }
        for tp in a.assignment {
            let from = self.committed.get(&tp).copied().unwrap_or(0);
            client.owned.entry(tp).or_insert(from);
        }
    }

    fn client_step(&mut self, c: usize) {
        let stalled = self.clients[c].stalled_until > self.now;
        match self.rng.below(100) {
            // Join.
            0..=9 if self.clients[c].member.is_empty() => {
                let hb = Heartbeat {
                    member_epoch: JOIN_EPOCH,
                    client_id: format!("c{c}"),
                    topics: Some([TOPIC.to_string()].into()),
                    assignor: Some("cooperative-sticky".into()),
                    session_timeout_ms: Some(SESSION_MS),
                    rebalance_timeout_ms: Some(REBALANCE_MS),
                    ..Default::default()
                };
                if let Some(Ok(a)) = self.heartbeat(hb) {
                    self.apply(c, a);
                }
            }
            // Heartbeat (its answer sometimes lost on the way back).
            10..=49 if !self.clients[c].member.is_empty() && !stalled => {
                let cl = &self.clients[c];
                let hb = Heartbeat {
                    member_id: cl.member.clone(),
                    member_epoch: cl.epoch,
                    owned: Some(cl.owned.keys().cloned().collect()),
                    ..Default::default()
                };
                match self.heartbeat(hb) {
                    Some(Ok(a)) if !self.rng.chance(5) => self.apply(c, a),
                    Some(Ok(_)) | None => {}
                    Some(Err(_)) => {
                        // Fenced or unknown: it lost everything.
                        let cl = &mut self.clients[c];
                        cl.member.clear();
                        cl.owned.clear();
                    }
                }
            }
            // Process records and commit (zombies too).
            50..=74 => {
                let made_at = self.step;
                let n = self.rng.below(5) + 1;
                let commit = self.rng.chance(60);
                let cl = &mut self.clients[c];
                for (tp, pos) in cl.owned.iter_mut() {
                    *pos += n;
                    if commit {
                        self.in_flight.push(InFlight {
                            member: cl.member.clone(),
                            epoch: cl.epoch,
                            tp: tp.clone(),
                            offset: *pos,
                            made_at,
                        });
                    }
                }
            }
            // Stall: a long GC pause or a stopped process.
            75..=77 => {
                self.clients[c].stalled_until = self.now + self.rng.below(4_000);
            }
            // Crash: forgets everything; its in-flight commits may still
            // arrive.
            78 => {
                self.clients[c] = Client::default();
            }
            // Leave.
            79..=80 if !self.clients[c].member.is_empty() && !stalled => {
                let hb = Heartbeat {
                    member_id: self.clients[c].member.clone(),
                    member_epoch: LEAVE_EPOCH,
                    ..Default::default()
                };
                if let Some(Ok(_)) = self.heartbeat(hb) {
                    self.clients[c] = Client::default();
                }
            }
            _ => {}
        }
    }

    /// Delivers one commit: validated and applied as the coordinator does
    /// (under the group's lock, so nothing changes in between).
    fn deliver(&mut self) {
        if self.in_flight.is_empty() {
            return;
        }
        // Commits of one member travel in order (one connection), those
        // of different members in any order.
        let pick = self.rng.below(self.in_flight.len() as u64) as usize;
        let member = self.in_flight[pick].member.clone();
        let i = self
            .in_flight
            .iter()
            .position(|f| f.member == member)
            .expect("the picked one at least");
        let f = self.in_flight.remove(i);
        let ok = matches!(
            self.group.validate_commit(&f.member, f.epoch, std::slice::from_ref(&f.tp)),
            Ok(v) if v[0].is_none()
        );
        if !ok {
            self.refused += 1;
            return;
        }
        let since = self.holding_since.get(&(f.member.clone(), f.tp.clone()));
        assert!(
            since.is_some_and(|&s| s <= f.made_at),
            "step {}: commit of {:?} by {} (epoch {}, made at step {}) applied, but it \
             holds the partition since {since:?}",
            self.step,
            f.tp,
            f.member,
            f.epoch,
            f.made_at
        );
        let before = self.committed.get(&f.tp).copied().unwrap_or(0);
        assert!(
            f.offset >= before,
            "step {}: committed offset of {:?} goes back from {before} to {}",
            self.step,
            f.tp,
            f.offset
        );
        self.committed.insert(f.tp, f.offset);
        self.applied += 1;
    }

    /// Checks the invariants and records who holds what since when.
    fn check(&mut self) {
        let mut now_held = BTreeSet::new();
        for p in 0..PARTITIONS {
            let tp = (TOPIC.to_string(), p);
            let holders: Vec<&String> = self.group.holders(&tp).collect();
            assert!(
                holders.len() <= 1,
                "step {}: {tp:?} held by {holders:?}",
                self.step
            );
            if let Some(h) = holders.first() {
                now_held.insert(((*h).clone(), tp));
            }
        }
        self.holding_since.retain(|k, _| now_held.contains(k));
        for k in now_held {
            self.holding_since.entry(k).or_insert(self.step);
        }
        assert!(
            self.group.group_epoch >= self.max_answered_epoch,
            "step {}: group epoch {} below the answered epoch {}",
            self.step,
            self.group.group_epoch,
            self.max_answered_epoch
        );
        for (id, m) in &self.group.members {
            assert!(m.epoch <= self.group.assignment_epoch, "{id}: {m:?}");
        }
    }

    fn run(&mut self, steps: u64) {
        for _ in 0..steps {
            self.step += 1;
            self.now += self.rng.below(120);
            let c = self.rng.below(self.clients.len() as u64) as usize;
            match self.rng.below(10) {
                0..=5 => self.client_step(c),
                6..=8 => self.deliver(),
                _ => {
                    self.group.tick(self.now, &counts);
                    self.persist();
                }
            }
            if self.rng.chance(1) {
                self.restart();
            }
            self.check();
        }
    }
}

#[test]
fn a_group_under_random_faults_never_double_assigns_or_applies_a_stale_commit() {
    let (mut applied, mut refused, mut restarts) = (0, 0, 0);
    for seed in 0..400 {
        let mut sim = Sim::new(seed, 2 + (seed % 4) as usize);
        sim.run(1_500);
        applied += sim.applied;
        refused += sim.refused;
        restarts += sim.restarts;
    }
    // The runs exercised what they claim to.
    assert!(applied > 10_000, "{applied} commits applied");
    assert!(refused > 1_000, "{refused} commits refused");
    assert!(restarts > 1_000, "{restarts} restarts");
}

/// The checks above can fail: a coordinator that forgets when each
/// partition was assigned (accepting any epoch up to the member's current
/// one) lets a commit made before the member lost a partition land after
/// it got it back — caught.
#[test]
fn the_simulation_catches_a_coordinator_that_ignores_assignment_epochs() {
    let caught = std::panic::catch_unwind(|| {
        for seed in 0..400 {
            let mut sim = Sim::new(seed, 3);
            for _ in 0..1_500 {
                sim.run(1);
                for m in sim.group.members.values_mut() {
                    for e in m.assigned.values_mut().chain(m.revoking.values_mut()) {
                        *e = 0;
                    }
                }
            }
        }
    });
    assert!(caught.is_err(), "the broken coordinator went unnoticed");
}
