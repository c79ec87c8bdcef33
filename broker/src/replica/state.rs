//! The replication state of one core, without the core: each replica's
//! role, epoch, followers' progress, ISR and high watermark, and the
//! fetchers running. The core holds a [`Replication`]; what acts on it
//! (reconciling with the metadata, the ISR loop, fetchers, serving
//! followers) is in the rest of `replica/`.

use futures_channel::oneshot;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use weir_replication::isr::Isr;
use weir_storage::PartitionLog;

use crate::error::BrokerError;

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
    /// The ISR, followers' progress and the high watermark (sans-IO, in
    /// `weir_replication::isr`).
    pub(crate) isr: Isr,
    /// Leader: produce and fetch waits for the high watermark.
    pub(crate) waiters: Vec<(u64, oneshot::Sender<Result<(), BrokerError>>)>,
    /// Follower: its log is being replaced (see `fetcher::restart_at`).
    pub(crate) restarting: bool,
    /// Leader: the task that raises the high watermark as the local log
    /// becomes durable (dropped, so cancelled, on a role change).
    pub(crate) durable_task: Option<glommio::Task<()>>,
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
        self.state.borrow().isr.hw()
    }

    /// Leader: raises the high watermark to the smallest fdatasync'd
    /// offset over the ISR, and answers the waits it passes.
    pub(crate) fn recompute_hw(&self) {
        let mut st = self.state.borrow_mut();
        if st.role != Role::Leader {
            return;
        }
        let durable = self.log.durable_offset();
        let raised = if mutation_hw_ignores_followers() {
            st.isr.raise_hw_ignoring_followers(durable)
        } else {
            st.isr.raise_hw(durable)
        };
        if let Some(hw) = raised {
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
        if !st.isr.enough() {
            return Err(BrokerError::NotEnoughReplicas {
                topic: self.topic.clone(),
                partition: self.partition,
                isr: st.isr.isr().len(),
                min: st.isr.min_isr(),
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
            if st.isr.hw() >= upto {
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
    pub(crate) parts: RefCell<HashMap<String, HashMap<u32, Rc<Replica>>>>,
    /// Fetchers running, by (leader node, leader core).
    pub(crate) fetchers: RefCell<HashMap<(u64, u32), ()>>,
    /// This core's QUIC endpoint (serves followers, connects to leaders).
    pub(crate) endpoint: RefCell<Option<weir_replication::quinn::Endpoint>>,
    /// Links to other nodes' cores for markers, verifications and share
    /// state (`super::link_to`), by (node, address).
    pub(crate) links:
        RefCell<HashMap<(u64, std::net::SocketAddr), weir_replication::data::DataLink>>,
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
        if st.replicas.len() > 1 && !st.isr.enough() {
            return Err(BrokerError::NotEnoughReplicas {
                topic: topic.to_string(),
                partition,
                isr: st.isr.isr().len(),
                min: st.isr.min_isr(),
            });
        }
        Ok(())
    }
}

/// Fails the high-watermark waits and stops the leader's task.
pub(crate) fn step_down(r: &Replica) {
    r.state.borrow_mut().durable_task = None;
    fail_waits(r);
}

/// Fails the high-watermark waits with `NotLeader` (naming the leader if
/// this replica follows one): the records may yet become durable, or be
/// truncated — the producer asks the leader it finds next (an idempotent
/// one's retry is then answered with the offsets they got).
pub(crate) fn fail_waits(r: &Replica) {
    let mut st = r.state.borrow_mut();
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

/// The environment variable of a mutation that breaks the durability rule
/// on purpose: set (to anything), a leader's high watermark follows its
/// own fdatasync'd offset alone, so `acks=all` is answered and consumers
/// read records no follower holds. It exists only so that the fault
/// tests can prove their checker reports the records a failover then
/// loses; never set it on a broker that holds data anyone wants.
pub const MUTATION_HW_IGNORES_FOLLOWERS_ENV: &str = "WEIR_MUTATION_HW_IGNORES_FOLLOWERS";

/// Whether [`MUTATION_HW_IGNORES_FOLLOWERS_ENV`] is set (read once).
fn mutation_hw_ignores_followers() -> bool {
    static SET: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SET.get_or_init(|| {
        let set = std::env::var_os(MUTATION_HW_IGNORES_FOLLOWERS_ENV).is_some();
        if set {
            tracing::error!(
                "{MUTATION_HW_IGNORES_FOLLOWERS_ENV} is set: acks=all no longer waits for followers \
                 (a test mutation; acknowledged records will be lost on failover)"
            );
        }
        set
    })
}
