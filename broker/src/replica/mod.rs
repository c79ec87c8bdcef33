//! Replication of partitions between nodes, on each core: the role of every
//! replica this core holds (leader, follower, or waiting for a leader), the
//! leader's view of its followers (what each has fetched and fdatasync'd),
//! the high watermark, ISR changes, and the follower fetchers.
//!
//! **Leader.** A follower's fetch reports the offset it needs next and the
//! offset below which it has fdatasync'd. The high watermark is the
//! smallest fdatasync'd offset over the ISR, the leader's own included, and
//! never goes down: an `acks=all` produce is answered once it is past the
//! batch, and consumers read only below it — so an acknowledged or
//! consumed record is on disk on every ISR member (Weir's promise is
//! stronger than Kafka's, whose followers report what they hold, not what
//! they synced). A follower that has not caught up with the leader's log
//! end for `replica.lag.time.max.ms` leaves the ISR; one caught up with
//! the high watermark joins it again. ISR changes go through the
//! controller (`AlterPartition`) with the leader's epoch, so a deposed
//! leader cannot make them.
//!
//! **Follower.** One fetcher per (leader node, leader core) on the
//! follower's core (see [`fetcher`]), over the per-core QUIC endpoints of
//! `weir_replication::data`. Batches are appended byte for byte; after a
//! leader change a divergent tail is truncated (the leader answers where
//! the follower's last epoch ends).
//!
//! A partition with one replica keeps the single-node path: no high
//! watermark gating (consumers read what is written, `acks=all` waits for
//! the local flush policy).

pub mod fetcher;
pub mod serve;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use weir_storage::PartitionLog;

use crate::service::BrokerError;
use crate::shard::Core;

/// What this node's replica of a partition is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// It leads.
    Leader,
    /// It follows `node`'s replica on that node's core `core`.
    Follower {
        /// Leader node.
        node: u64,
        /// The leader's core on its node.
        core: u32,
    },
    /// No live leader.
    NoLeader,
}

/// A follower's progress as its leader sees it.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// The next offset it asked for (its log end).
    pub fetch_offset: u64,
    /// Below this, its log is fdatasync'd.
    pub durable: u64,
    /// When it last had everything the leader had.
    pub caught_up: Instant,
    /// The leader's log end at its previous fetch, and when.
    last_fetch_leo: u64,
    last_fetch_at: Instant,
}

/// One replica on this core and its replication state.
pub struct Replica {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Its log.
    pub log: PartitionLog,
    pub(crate) state: RefCell<State>,
}

pub(crate) struct State {
    pub(crate) role: Role,
    pub(crate) epoch: u32,
    /// Replica nodes and their cores.
    pub(crate) replicas: Vec<(u64, u32)>,
    pub(crate) isr: Vec<u64>,
    pub(crate) min_isr: u32,
    /// The high watermark (leader: computed; follower: the leader's last
    /// answer, at most the local log end).
    pub(crate) hw: u64,
    /// Leader: each follower's progress.
    pub(crate) followers: HashMap<u64, Progress>,
    /// Leader: when it took over (a follower that never fetched since is
    /// measured from here).
    pub(crate) since: Instant,
    /// Leader: produce and fetch waits for the high watermark.
    waiters: Vec<(u64, oneshot::Sender<Result<(), BrokerError>>)>,
    /// Leader: an ISR change is being proposed.
    pub(crate) isr_pending: bool,
    /// Leader: a follower proposed back into the ISR; counted in the high
    /// watermark from the proposal on (the controller may commit it before
    /// this core hears of it).
    pub(crate) joining: Option<u64>,
    /// Leader: a follower joins the ISR only once it holds (durably)
    /// everything below this — the log end when the partition gained
    /// replicas: what a single replica acknowledged on its own flush until
    /// then may be above the high watermark.
    pub(crate) join_floor: u64,
    /// Follower: its log is being replaced (see `fetcher::restart_at`).
    pub(crate) restarting: bool,
    /// Leader: the task that raises the high watermark as the local log
    /// becomes durable (dropped, so cancelled, on a role change).
    durable_task: Option<glommio::Task<()>>,
}

impl Replica {
    /// Whether writes to it are replicated (more than one replica).
    pub fn replicated(&self) -> bool {
        self.state.borrow().replicas.len() > 1
    }

    /// The role now.
    pub fn role(&self) -> Role {
        self.state.borrow().role
    }

    /// The high watermark.
    pub fn high_watermark(&self) -> u64 {
        self.state.borrow().hw
    }

    /// Leader: raises the high watermark to the smallest fdatasync'd
    /// offset over the ISR, and answers the waits it passes.
    pub(crate) fn recompute_hw(&self, me: u64) {
        let mut st = self.state.borrow_mut();
        if st.role != Role::Leader {
            return;
        }
        let mut hw = self.log.durable_offset();
        for n in st.isr.iter().chain(st.joining.iter()).filter(|n| **n != me) {
            hw = hw.min(st.followers.get(n).map_or(0, |p| p.durable));
        }
        if hw > st.hw {
            st.hw = hw;
            let waiters = std::mem::take(&mut st.waiters);
            for (upto, tx) in waiters {
                if upto <= hw {
                    let _ = tx.send(Ok(()));
                } else if !tx.is_canceled() {
                    st.waiters.push((upto, tx));
                }
            }
        }
    }

    /// The leader epoch now.
    pub fn epoch(&self) -> u32 {
        self.state.borrow().epoch
    }

    /// `acks=all`: waits until the high watermark passes `upto` while this
    /// replica leads at `epoch` (`NotLeader` if it stops leading or a
    /// new epoch begins: the batch may be truncated), then checks that
    /// the ISR is still at least `min.insync.replicas` (else
    /// `NotEnoughReplicas`: appended, but on fewer replicas than asked).
    pub async fn wait_acknowledged(&self, upto: u64, epoch: u32) -> Result<(), BrokerError> {
        self.wait_hw(upto).await?;
        let st = self.state.borrow();
        if st.role != Role::Leader || st.epoch != epoch {
            return Err(self.not_leader(&st));
        }
        if (st.isr.len() as u32) < st.min_isr {
            return Err(BrokerError::NotEnoughReplicas {
                topic: self.topic.clone(),
                partition: self.partition,
                isr: st.isr.len(),
                min: st.min_isr,
            });
        }
        Ok(())
    }

    /// Waits until the high watermark is at least `upto` (fails with
    /// `NotLeader` if this replica stops leading first).
    pub async fn wait_hw(&self, upto: u64) -> Result<(), BrokerError> {
        let rx = {
            let mut st = self.state.borrow_mut();
            if st.role != Role::Leader {
                return Err(self.not_leader(&st));
            }
            if st.hw >= upto {
                return Ok(());
            }
            let (tx, rx) = oneshot::channel();
            st.waiters.retain(|(_, t)| !t.is_canceled());
            st.waiters.push((upto, tx));
            rx
        };
        rx.await.unwrap_or_else(|_| {
            Err(BrokerError::NotLeader {
                topic: self.topic.clone(),
                partition: self.partition,
                leader: 0,
            })
        })
    }

    /// `NotLeader` unless this replica leads.
    pub fn check_leader(&self) -> Result<(), BrokerError> {
        let st = self.state.borrow();
        match st.role {
            Role::Leader => Ok(()),
            _ => Err(self.not_leader(&st)),
        }
    }

    fn not_leader(&self, st: &State) -> BrokerError {
        BrokerError::NotLeader {
            topic: self.topic.clone(),
            partition: self.partition,
            leader: match st.role {
                Role::Follower { node, .. } => node,
                _ => 0,
            },
        }
    }
}

/// The replicas of one core.
#[derive(Default)]
pub struct Replication {
    /// By topic, then partition (looked up by `&str`: no key is built on
    /// the produce and fetch paths).
    parts: RefCell<HashMap<String, HashMap<u32, Rc<Replica>>>>,
    /// Fetchers running, by (leader node, leader core).
    pub(crate) fetchers: RefCell<HashMap<(u64, u32), ()>>,
    /// This core's QUIC endpoint (serves followers, connects to leaders).
    pub(crate) endpoint: RefCell<Option<weir_replication::quinn::Endpoint>>,
}

impl Replication {
    /// The replica of a partition on this core, if any.
    pub fn get(&self, topic: &str, partition: u32) -> Option<Rc<Replica>> {
        self.parts.borrow().get(topic)?.get(&partition).cloned()
    }

    /// Forgets the replica of a partition (its log was replaced; the next
    /// [`reconcile`] makes a new one).
    pub(crate) fn remove(&self, topic: &str, partition: u32) {
        let mut parts = self.parts.borrow_mut();
        if let Some(ps) = parts.get_mut(topic) {
            if let Some(r) = ps.remove(&partition) {
                step_down(&r);
            }
            if ps.is_empty() {
                parts.remove(topic);
            }
        }
    }

    /// Every replica on this core.
    pub fn all(&self) -> Vec<Rc<Replica>> {
        self.parts
            .borrow()
            .values()
            .flat_map(|t| t.values().cloned())
            .collect()
    }

    /// The replicas following the leader core `target`.
    /// In topic and partition order.
    pub(crate) fn following(&self, target: (u64, u32)) -> Vec<Rc<Replica>> {
        let mut out: Vec<Rc<Replica>> = self
            .all()
            .into_iter()
            .filter(|r| {
                r.role()
                    == Role::Follower {
                        node: target.0,
                        core: target.1,
                    }
            })
            .collect();
        out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        out
    }

    /// The high watermark consumers read up to, for a replicated
    /// partition this core leads (`None`: not replicated, read what is
    /// written).
    pub fn consumer_limit(&self, topic: &str, partition: u32) -> Option<Rc<Replica>> {
        self.get(topic, partition)
            .filter(|r| r.replicated() && r.role() == Role::Leader)
    }

    /// Refuses a write to a replica that does not lead (`NotLeader`), and
    /// an `acks=all` write to a replicated partition whose ISR is smaller
    /// than its `min.insync.replicas` (`NotEnoughReplicas`).
    pub fn check_append(&self, topic: &str, partition: u32, acks: i8) -> Result<(), BrokerError> {
        let Some(r) = self.get(topic, partition) else {
            return Ok(());
        };
        r.check_leader()?;
        if acks != -1 {
            return Ok(());
        }
        let st = r.state.borrow();
        if st.replicas.len() > 1 && (st.isr.len() as u32) < st.min_isr {
            return Err(BrokerError::NotEnoughReplicas {
                topic: topic.to_string(),
                partition,
                isr: st.isr.len(),
                min: st.min_isr,
            });
        }
        Ok(())
    }
}

/// Makes this core's replicas match its metadata view: roles, epochs,
/// ISR; starts the fetchers of new followers and the high-watermark task of
/// new leaders; fails the waits of replicas that stopped leading.
pub fn reconcile(core: &Rc<Core>) {
    let view = core.metadata();
    let me = core.shared.config.cluster.node_id;
    let mut keep = std::collections::HashSet::new();
    let mut targets = Vec::new();
    for (topic, meta) in view.topics() {
        let min_isr =
            crate::metadata::log_config(&meta.configs).map_or(1, |c| c.min_insync_replicas);
        for p in 0..meta.partitions() {
            if meta.core_of(p) != Some(core.id) {
                continue;
            }
            let Some(placement) = meta.placement.get(p as usize) else {
                continue;
            };
            let Some(log) = core.log(topic, p) else {
                continue;
            };
            keep.insert((topic.clone(), p));
            let leader = meta.leaders.get(p as usize).copied().unwrap_or(0);
            let role = if leader == me {
                Role::Leader
            } else if leader == 0 {
                Role::NoLeader
            } else {
                match placement.replicas.iter().find(|(n, _)| *n == leader) {
                    Some((_, c)) => Role::Follower {
                        node: leader,
                        core: *c,
                    },
                    None => Role::NoLeader,
                }
            };
            let existing = core.replication.get(topic, p);
            let replica = match existing {
                Some(r) if r.log.same(&log) => r,
                other => {
                    if let Some(old) = other {
                        step_down(&old);
                    }
                    let r = Rc::new(Replica {
                        topic: topic.clone(),
                        partition: p,
                        log: log.clone(),
                        state: RefCell::new(State {
                            role: Role::NoLeader,
                            epoch: 0,
                            replicas: Vec::new(),
                            isr: Vec::new(),
                            min_isr: 1,
                            hw: 0,
                            followers: HashMap::new(),
                            since: Instant::now(),
                            waiters: Vec::new(),
                            isr_pending: false,
                            joining: None,
                            join_floor: 0,
                            restarting: false,
                            durable_task: None,
                        }),
                    });
                    core.replication
                        .parts
                        .borrow_mut()
                        .entry(topic.clone())
                        .or_default()
                        .insert(p, r.clone());
                    r
                }
            };
            let changed = {
                let mut st = replica.state.borrow_mut();
                let changed = st.role != role || st.epoch != placement.leader_epoch;
                if st.isr != placement.isr {
                    st.isr_pending = false;
                    st.joining = None;
                }
                st.isr = placement.isr.clone();
                st.replicas = placement.replicas.clone();
                st.min_isr = min_isr;
                changed
            };
            if changed {
                let was_leader = replica.role() == Role::Leader;
                become_role(core, &replica, role, placement.leader_epoch, me);
                if topic == crate::metadata::OFFSETS_TOPIC && core.groups.is_loaded() {
                    move_groups(core, p, meta.partitions(), was_leader, role == Role::Leader);
                }
            }
            if let Role::Follower { node, core: c } = role {
                targets.push((node, c));
            }
            if role == Role::Leader {
                // A partition that gained replicas (a reassignment) starts
                // tracking its own durability in the high watermark, and
                // takes a follower into the ISR only once it holds all
                // this replica wrote alone. One that lost them keeps the
                // task: it answers the acks=all waits still pending.
                let tracking = replica.state.borrow().durable_task.is_some();
                if replica.replicated() && !tracking {
                    let task = glommio::spawn_local(raise_hw_as_durable(replica.clone(), me));
                    let mut st = replica.state.borrow_mut();
                    st.durable_task = Some(task);
                    st.join_floor = replica.log.log_end_offset();
                }
                // The ISR may have shrunk: the high watermark may move.
                replica.recompute_hw(me);
            }
        }
    }
    // Replicas gone from this core (deleted, moved).
    let gone: Vec<Rc<Replica>> = {
        let mut parts = core.replication.parts.borrow_mut();
        let mut gone = Vec::new();
        for (topic, ps) in parts.iter_mut() {
            ps.retain(|p, r| {
                let kept = keep.contains(&(topic.clone(), *p));
                if !kept {
                    gone.push(r.clone());
                }
                kept
            });
        }
        parts.retain(|_, ps| !ps.is_empty());
        gone
    };
    for r in gone {
        if r.topic == crate::metadata::OFFSETS_TOPIC
            && r.role() == Role::Leader
            && core.groups.is_loaded()
        {
            // Its groups are coordinated where it moved.
            let n = view
                .get(crate::metadata::OFFSETS_TOPIC)
                .map_or(0, |m| m.partitions());
            move_groups(core, r.partition, n, true, false);
        }
        step_down(&r);
    }
    for t in targets {
        fetcher::ensure(core, t);
    }
}

/// A `__consumer_offsets` partition changed hands on this core: its
/// groups are replayed when this core starts leading it (answered
/// `Recovering` meanwhile), forgotten when it stops.
fn move_groups(core: &Rc<Core>, p: u32, n: u32, was_leader: bool, leads: bool) {
    if leads {
        core.groups.loading.borrow_mut().insert(p);
        glommio::spawn_local(crate::groups::store::replay_led(core.clone(), p)).detach();
    } else if was_leader {
        core.groups.forget_partition(p, n);
        core.groups.loading.borrow_mut().remove(&p);
    }
}

/// Fails the high-watermark waits and stops the leader's task.
fn step_down(r: &Replica) {
    let mut st = r.state.borrow_mut();
    st.durable_task = None;
    let waiters = std::mem::take(&mut st.waiters);
    let leader = match st.role {
        Role::Follower { node, .. } => node,
        _ => 0,
    };
    for (_, tx) in waiters {
        let _ = tx.send(Err(BrokerError::NotLeader {
            topic: r.topic.clone(),
            partition: r.partition,
            leader,
        }));
    }
}

fn become_role(core: &Rc<Core>, r: &Rc<Replica>, role: Role, epoch: u32, me: u64) {
    {
        let mut st = r.state.borrow_mut();
        st.role = role;
        st.epoch = epoch;
    }
    step_down(r);
    match role {
        Role::Leader => {
            r.log.set_leader_epoch(Some(epoch));
            let now = Instant::now();
            {
                let mut st = r.state.borrow_mut();
                st.followers.clear();
                st.since = now;
                st.isr_pending = false;
                st.joining = None;
                // Never above what this replica holds.
                st.hw = st.hw.min(r.log.log_end_offset());
            }
            r.recompute_hw(me);
            tracing::info!(partition = %format!("{}-{}", r.topic, r.partition), epoch, "leading");
            if r.replicated() {
                let task = glommio::spawn_local(raise_hw_as_durable(r.clone(), me));
                r.state.borrow_mut().durable_task = Some(task);
            }
        }
        Role::Follower { node, .. } => {
            r.log.set_leader_epoch(None);
            tracing::info!(partition = %format!("{}-{}", r.topic, r.partition), epoch, leader = node, "following");
        }
        Role::NoLeader => {
            r.log.set_leader_epoch(None);
        }
    }
    let _ = core;
}

/// A replicated leader's high watermark follows its own log's
/// fdatasync'd offset (the followers' part comes with their fetches).
async fn raise_hw_as_durable(r: Rc<Replica>, me: u64) {
    loop {
        let next = r.high_watermark() + 1;
        if r.log.wait_durable(next).await.is_err() {
            return;
        }
        if r.role() != Role::Leader {
            return;
        }
        r.recompute_hw(me);
        if r.high_watermark() < next {
            // Waiting for a follower: its next fetch raises it.
            let wait = r.wait_hw(next);
            if wait.await.is_err() {
                return;
            }
        }
    }
}

/// Leader, every quarter of `replica.lag.time.max.ms` (at most every
/// second, at most every half `--replica-silence-max-ms`): a follower of
/// the ISR that has not caught up for that long, or is behind and has sent
/// no fetch for `--replica-silence-max-ms`, is proposed out of it. A live
/// follower always has a fetch at its leader (a new one at least every
/// `FETCH_WAIT_MS`), so one that silent is dead or cut off, and the
/// `acks=all` produces waiting for it need not wait for its fencing (a
/// session timeout) or for `replica.lag.time.max.ms` (Kafka's 30 s).
pub async fn isr_loop(core: Rc<Core>) {
    let lag = Duration::from_millis(core.shared.config.cluster.replica_lag_time_max_ms);
    let silence = match core.shared.config.cluster.replica_silence_max_ms {
        0 => None,
        ms => Some(Duration::from_millis(ms)),
    };
    let tick = (lag / 4)
        .min(silence.map_or(Duration::MAX, |s| s / 2))
        .clamp(Duration::from_millis(25), Duration::from_secs(1));
    let me = core.shared.config.cluster.node_id;
    while !core.shared.stopping() {
        glommio::timer::sleep(tick).await;
        let now = Instant::now();
        for r in core.replication.all() {
            let shrunk = {
                let st = r.state.borrow();
                if st.role != Role::Leader || st.isr_pending || st.replicas.len() < 2 {
                    continue;
                }
                let leo = r.log.log_end_offset();
                let keep: Vec<u64> = st
                    .isr
                    .iter()
                    .copied()
                    .filter(|n| {
                        *n == me || {
                            let p = st.followers.get(n);
                            let caught = p.map_or(st.since, |p| p.caught_up);
                            let silent = p.zip(silence).is_some_and(|(p, silence)| {
                                p.fetch_offset < leo
                                    && now.duration_since(p.last_fetch_at) > silence
                            });
                            now.duration_since(caught) < lag && !silent
                        }
                    })
                    .collect();
                (keep.len() < st.isr.len()).then_some((keep, st.epoch))
            };
            if let Some((isr, epoch)) = shrunk {
                tracing::warn!(
                    partition = %format!("{}-{}", r.topic, r.partition),
                    ?isr,
                    "a follower fell behind replica.lag.time.max.ms, or went silent: shrinking the ISR"
                );
                propose_isr(&core, &r, epoch, isr);
            }
        }
    }
}

/// Proposes a new ISR for a partition this core leads at `epoch`.
pub(crate) fn propose_isr(core: &Rc<Core>, r: &Rc<Replica>, epoch: u32, isr: Vec<u64>) {
    let from = {
        let mut st = r.state.borrow_mut();
        st.isr_pending = true;
        st.isr.clone()
    };
    let (core, r) = (core.clone(), r.clone());
    glommio::spawn_local(async move {
        let cmd = weir_replication::Command::AlterPartition {
            topic: r.topic.clone(),
            partition: r.partition,
            leader: core.shared.config.cluster.node_id,
            leader_epoch: epoch,
            from,
            isr: isr.clone(),
        };
        match core.shared.controller.propose(cmd).await {
            Ok(_) => {
                tracing::info!(partition = %format!("{}-{}", r.topic, r.partition), ?isr, "ISR changed")
            }
            Err(e) => {
                tracing::info!(partition = %format!("{}-{}", r.topic, r.partition), error = %e, "ISR change not made");
                let mut st = r.state.borrow_mut();
                st.isr_pending = false;
                st.joining = None;
            }
        }
    })
    .detach();
}

/// Updates a follower's progress after its fetch at `now` (the leader's
/// log end is `leo`), Kafka's way: caught up now if it asked for the log
/// end, or as of its previous fetch if it asked for what the log end was
/// then.
pub(crate) fn note_progress(
    st: &mut State,
    node: u64,
    fetch_offset: u64,
    durable: u64,
    leo: u64,
    now: Instant,
) {
    let since = st.since;
    let p = st.followers.entry(node).or_insert(Progress {
        fetch_offset,
        durable,
        caught_up: since,
        last_fetch_leo: 0,
        last_fetch_at: since,
    });
    if fetch_offset >= leo {
        p.caught_up = now;
    } else if fetch_offset >= p.last_fetch_leo {
        p.caught_up = p.caught_up.max(p.last_fetch_at);
    }
    p.fetch_offset = fetch_offset;
    p.durable = durable.min(fetch_offset);
    p.last_fetch_leo = leo;
    p.last_fetch_at = now;
}
