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
pub mod state;

use state::{step_down, State};
pub use state::{Replica, Replication, Role};
pub use weir_replication::isr::Progress;
use weir_replication::isr::{Isr, LagBounds, Proposal};

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::shard::Core;

/// A replica on this core that started or stopped leading its partition
/// (what [`reconcile`] reports: the coordinator runtime replays or forgets
/// the partitions of its topics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// The topic's partitions.
    pub partitions: u32,
    /// Whether this core led it before.
    pub was_leader: bool,
    /// Whether this core leads it now.
    pub leads: bool,
}

/// Makes this core's replicas match its metadata view: roles, epochs,
/// ISR; starts the fetchers of new followers and the high-watermark task of
/// new leaders; fails the waits of replicas that stopped leading. Returns
/// the replicas whose role changed (and those gone while leading).
pub fn reconcile(core: &Rc<Core>) -> Vec<Leadership> {
    let mut changes = Vec::new();
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
                            isr: Isr::new(me, Instant::now()),
                            waiters: Vec::new(),
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
                st.isr.set_isr(&placement.isr, min_isr);
                st.replicas = placement.replicas.clone();
                changed
            };
            if changed {
                let was_leader = replica.role() == Role::Leader;
                become_role(core, &replica, role, placement.leader_epoch);
                changes.push(Leadership {
                    topic: topic.clone(),
                    partition: p,
                    partitions: meta.partitions(),
                    was_leader,
                    leads: role == Role::Leader,
                });
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
                    let task = glommio::spawn_local(raise_hw_as_durable(replica.clone()));
                    let mut st = replica.state.borrow_mut();
                    st.durable_task = Some(task);
                    st.isr.set_join_floor(replica.log.log_end_offset());
                }
                // The ISR may have shrunk: the high watermark may move.
                replica.recompute_hw();
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
        if r.role() == Role::Leader {
            // What it held is served where it moved.
            changes.push(Leadership {
                topic: r.topic.clone(),
                partition: r.partition,
                partitions: view.get(&r.topic).map_or(0, |m| m.partitions()),
                was_leader: true,
                leads: false,
            });
        }
        step_down(&r);
    }
    for t in targets {
        fetcher::ensure(core, t);
    }
    changes
}

fn become_role(core: &Rc<Core>, r: &Rc<Replica>, role: Role, epoch: u32) {
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
            r.state.borrow_mut().isr.lead(now, r.log.log_end_offset());
            r.recompute_hw();
            tracing::info!(partition = %format!("{}-{}", r.topic, r.partition), epoch, "leading");
            if r.replicated() {
                let task = glommio::spawn_local(raise_hw_as_durable(r.clone()));
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
async fn raise_hw_as_durable(r: Rc<Replica>) {
    loop {
        let next = r.high_watermark() + 1;
        if r.log.wait_durable(next).await.is_err() {
            return;
        }
        if r.role() != Role::Leader {
            return;
        }
        r.recompute_hw();
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
    let bounds = LagBounds { lag, silence };
    while !core.shared.stopping() {
        glommio::timer::sleep(tick).await;
        // Without its lease the node may have been replaced as leader:
        // the acks=all produces it holds are answered NotLeader now, not
        // at their request timeout, and no ISR change is proposed (the
        // controller, unreachable or fencing this node, would refuse it).
        if !core.holds_lease() {
            for r in core.replication.all() {
                if r.role() == Role::Leader {
                    state::fail_waits(&r);
                }
            }
            continue;
        }
        let now = Instant::now();
        for r in core.replication.all() {
            let shrunk = {
                let mut st = r.state.borrow_mut();
                if st.role != Role::Leader || st.replicas.len() < 2 {
                    continue;
                }
                let leo = r.log.log_end_offset();
                let epoch = st.epoch;
                st.isr.shrink(leo, now, bounds).map(|p| (p, epoch))
            };
            if let Some((proposal, epoch)) = shrunk {
                tracing::warn!(
                    partition = %format!("{}-{}", r.topic, r.partition),
                    isr = ?proposal.isr,
                    "a follower fell behind replica.lag.time.max.ms, or went silent: shrinking the ISR"
                );
                propose_isr(&core, &r, epoch, proposal);
            }
        }
    }
}

/// Proposes an ISR change for a partition this core leads at `epoch` (the
/// proposal is pending in its state until the metadata commits it or the
/// controller refuses it).
pub(crate) fn propose_isr(core: &Rc<Core>, r: &Rc<Replica>, epoch: u32, proposal: Proposal) {
    let (core, r) = (core.clone(), r.clone());
    glommio::spawn_local(async move {
        let Proposal { from, isr } = proposal;
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
                r.state.borrow_mut().isr.proposal_failed();
            }
        }
    })
    .detach();
}

/// A link to the core of node `node` that leads `tp` (node to node,
/// mutual TLS, from this core's replication endpoint), or why not.
pub(crate) async fn link_to(
    core: &Rc<Core>,
    node: u64,
    tp: &(String, u32),
) -> Result<weir_replication::data::DataLink, String> {
    let leader_core = core
        .metadata()
        .get(&tp.0)
        .and_then(|t| t.placement.get(tp.1 as usize).cloned())
        .and_then(|pl| {
            pl.replicas
                .iter()
                .find(|(n, _)| *n == node)
                .map(|(_, c)| *c)
        })
        .ok_or_else(|| format!("node {node}'s core for {}-{} is not known", tp.0, tp.1))?;
    let addr = crate::replica::fetcher::leader_addr(core, node, leader_core)
        .await
        .ok_or_else(|| format!("node {node}'s replication address is not known"))?;
    // One link per peer core, kept while it lives (its keep-alives notice
    // a dead peer within the mesh's idle timeout): a marker, a
    // verification or a share-state store does not pay a QUIC handshake
    // each.
    if let Some(link) = core.replication.links.borrow().get(&(node, addr)) {
        if !link.is_closed() {
            return Ok(link.clone());
        }
    }
    let endpoint = core
        .replication
        .endpoint
        .borrow()
        .clone()
        .ok_or("this core has no replication endpoint")?;
    let cluster_id = core.shared.controller.state().cluster_id.clone();
    let me = core.shared.config.cluster.node_id;
    let link = weir_replication::data::DataLink::connect(&endpoint, node, addr, &cluster_id, me)
        .await
        .map_err(|e| e.chain().to_string())?;
    let mut links = core.replication.links.borrow_mut();
    links.retain(|_, l| !l.is_closed());
    links.insert((node, addr), link.clone());
    Ok(link)
}
