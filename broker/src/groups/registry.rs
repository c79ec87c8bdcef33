//! The groups one core coordinates, as state: each group (its consumer
//! and classic machines, committed offsets, waiters), the per-group locks,
//! the held classic requests, the log ends learnt for commit checks, and
//! what has been replayed. The core holds a [`Groups`]; what acts on it is
//! `coordinator.rs` (and `classic_service.rs`, `store.rs`).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use bytes::Bytes;
use futures_channel::oneshot;

use crate::groups::assignor::Tp;
use crate::groups::classic::{self, ClassicGroup};
use crate::groups::clock::mono_ms;
use crate::groups::consumer::{ConsumerGroup, Member};
use crate::groups::records::{self, GroupValue, OffsetValue, RecordKey};

/// One group, on its coordinator's core: a consumer group (native and
/// KIP-848 members), or a classic one (Kafka JoinGroup/SyncGroup) while
/// `classic` is set. An empty group of one kind becomes the other when a
/// member of the other kind joins; a group with members of one kind
/// refuses the other.
#[derive(Default)]
pub(crate) struct Group {
    /// Its members, epochs and assignments.
    pub(crate) consumer: ConsumerGroup,
    /// Its classic state, if it is a classic group.
    pub(crate) classic: Option<ClassicGroup>,
    /// The classic state was dropped (the group became a consumer group):
    /// its record is to be tombstoned.
    pub(crate) classic_dropped: bool,
    pub(crate) offsets: BTreeMap<Tp, OffsetValue>,
    /// Offsets committed in open transactions, by producer id: they join
    /// `offsets` when the transaction's marker commits it.
    pub(crate) pending_txn: BTreeMap<i64, BTreeMap<Tp, OffsetValue>>,
    /// When the group last lost its last member (ms since the epoch), or
    /// was loaded without members; `None` while it has members.
    pub(crate) empty_since_ms: Option<i64>,
    /// Its removal (retention) is in progress.
    pub(crate) expiring: bool,
    /// An expiry check of it is queued.
    pub(crate) ticking: bool,
    /// Held heartbeats by member: woken (`true`) when an answer may have
    /// changed, or ended (`false`) by a newer heartbeat of the same member.
    pub(crate) waiters: HashMap<String, oneshot::Sender<bool>>,
}

impl Group {
    pub(crate) fn wake_all(&mut self) {
        for (_, tx) in self.waiters.drain() {
            let _ = tx.send(true);
        }
    }
}

/// The groups one core coordinates.
#[derive(Default)]
pub struct Groups {
    pub(crate) groups: RefCell<HashMap<String, Group>>,
    /// Held classic JoinGroups and SyncGroups by token.
    pub(crate) held: RefCell<HashMap<classic::Token, oneshot::Sender<classic::Output>>>,
    pub(crate) next_token: Cell<u64>,
    pub(crate) next_member: Cell<u64>,
    /// Which `__consumer_offsets` partitions are replayed (the
    /// coordinator runtime's): until the start-up replay is done, and while
    /// a partition this core just started leading is replayed, its groups
    /// are answered `Recovering` (retriable).
    pub(crate) hosting: crate::coordinator::hosting::Hosting,
    /// Keys of records in Weir's first layout met while replaying, by
    /// partition, and whether the latest one of each is live (to be
    /// rewritten in Kafka's format once the partition is replayed).
    pub(crate) legacy: RefCell<BTreeMap<u32, BTreeMap<Bytes, bool>>>,
    /// Log end offsets learnt from partition owners, for commit checks.
    pub(crate) log_ends: RefCell<HashMap<Tp, u64>>,
    /// One request at a time per group that changes it (joins,
    /// heartbeats, leaves, commits, deletes, expiry), from its checks to
    /// its records being durable: no check is stale when a record lands,
    /// records land in the order they were decided, and no answer tells
    /// of a state that is not stored. Only groups with a request in
    /// progress have an entry.
    pub(crate) locks: RefCell<HashMap<String, Rc<glommio::sync::Semaphore>>>,
}

impl Group {
    /// Whether it has members of either kind.
    pub(crate) fn has_members(&self) -> bool {
        !self.consumer.members.is_empty()
            || self
                .classic
                .as_ref()
                .is_some_and(|c| c.members().next().is_some())
    }
}

/// A group's lock, held; forgotten by the map once nobody holds or waits
/// for it.
pub(crate) struct GroupLock<'a> {
    pub(crate) groups: &'a Groups,
    pub(crate) lock: Rc<glommio::sync::Semaphore>,
}

impl Drop for GroupLock<'_> {
    fn drop(&mut self) {
        self.lock.signal(1);
        // Held here and by the map: nobody else waits.
        if Rc::strong_count(&self.lock) <= 2 {
            self.groups
                .locks
                .borrow_mut()
                .retain(|_, l| !Rc::ptr_eq(l, &self.lock));
        }
    }
}

impl Groups {
    /// Replays a committed offset (`None`: a tombstone).
    /// A replayed offset committed in producer `producer_id`'s
    /// transaction (pending until its marker).
    pub(crate) fn replay_pending(&self, group: String, producer_id: i64, tp: Tp, v: OffsetValue) {
        let mut groups = self.groups.borrow_mut();
        let g = groups.entry(group).or_default();
        g.pending_txn.entry(producer_id).or_default().insert(tp, v);
    }

    /// Producer `producer_id`'s transaction ended in `__consumer_offsets`
    /// partition `p` (of `n`): its pending offsets of the groups there
    /// are committed, or dropped.
    pub(crate) fn end_txn(&self, p: u32, n: u32, producer_id: i64, commit: bool) {
        let mut groups = self.groups.borrow_mut();
        for (name, g) in groups.iter_mut() {
            if crate::groups::records::partition_for(name, n) != p {
                continue;
            }
            if let Some(offsets) = g.pending_txn.remove(&producer_id) {
                if commit {
                    g.offsets.extend(offsets);
                }
            }
        }
    }

    pub(crate) fn replay_offset(&self, group: String, tp: Tp, value: Option<OffsetValue>) {
        let mut groups = self.groups.borrow_mut();
        match value {
            Some(v) => {
                groups.entry(group).or_default().offsets.insert(tp, v);
            }
            None => {
                if let Some(g) = groups.get_mut(&group) {
                    g.offsets.remove(&tp);
                }
            }
        }
    }

    /// Every record that describes `group` as it is now, in this build's
    /// format (what a rewrite of records of an older layout writes).
    pub(crate) fn current_records(&self, group: &str) -> Vec<(RecordKey, Option<Bytes>)> {
        let groups = self.groups.borrow();
        let Some(g) = groups.get(group) else {
            return Vec::new();
        };
        let name = || group.to_string();
        let mut out: Vec<(RecordKey, Option<Bytes>)> = Vec::new();
        for ((topic, partition), v) in &g.offsets {
            let key = RecordKey::Offset {
                group: name(),
                topic: topic.clone(),
                partition: *partition,
            };
            out.push((key, Some(v.encode())));
        }
        let c = &g.consumer;
        if c.group_epoch > 0 || !c.members.is_empty() {
            let value = GroupValue {
                group_epoch: c.group_epoch,
                assignment_epoch: c.assignment_epoch,
                assignor: c.assignor.clone(),
            };
            out.push((RecordKey::Group { group: name() }, Some(value.encode())));
        }
        for (id, m) in &c.members {
            let key = RecordKey::Member {
                group: name(),
                member: id.clone(),
            };
            out.push((key, Some(records::encode_member(m))));
        }
        if let Some(classic) = &g.classic {
            let value = records::encode_classic(&classic.snapshot());
            out.push((RecordKey::Classic { group: name() }, Some(value)));
        }
        out
    }

    /// Replays a group's metadata (`None`: the group was deleted).
    pub(crate) fn replay_group(&self, group: String, value: Option<GroupValue>) {
        let mut groups = self.groups.borrow_mut();
        match value {
            Some(v) => {
                let c = &mut groups.entry(group).or_default().consumer;
                c.group_epoch = c.group_epoch.max(v.group_epoch);
                c.assignment_epoch = v.assignment_epoch;
                c.assignor = v.assignor;
            }
            None => {
                groups.remove(&group);
            }
        }
    }

    /// Replays a member's record (`None`: it left or was expelled).
    pub(crate) fn replay_member(&self, group: String, member: String, value: Option<Member>) {
        let mut groups = self.groups.borrow_mut();
        match value {
            Some(m) => {
                groups
                    .entry(group)
                    .or_default()
                    .consumer
                    .members
                    .insert(member, m);
            }
            None => {
                if let Some(g) = groups.get_mut(&group) {
                    g.consumer.members.remove(&member);
                }
            }
        }
    }

    /// Forgets the cached log ends of deleted partitions (their topic may
    /// come back empty).
    pub fn forget_log_ends(&self, deleted: &[(String, u32)]) {
        let mut cache = self.log_ends.borrow_mut();
        for tp in deleted {
            cache.remove(tp);
        }
    }

    /// Takes a group's lock (waits for the request holding it).
    pub(crate) async fn lock(&self, group: &str) -> GroupLock<'_> {
        let lock = self
            .locks
            .borrow_mut()
            .entry(group.to_string())
            .or_insert_with(|| Rc::new(glommio::sync::Semaphore::new(1)))
            .clone();
        lock.acquire(1).await.expect("group locks are never closed");
        GroupLock { groups: self, lock }
    }

    /// Replays a classic group's state (`None`: it is no longer classic,
    /// or was deleted).
    pub(crate) fn replay_classic(
        &self,
        group: String,
        snapshot: Option<classic::Snapshot>,
        config: classic::Config,
    ) {
        let mut groups = self.groups.borrow_mut();
        match snapshot {
            Some(s) => {
                groups.entry(group).or_default().classic =
                    Some(ClassicGroup::restore(s, config, mono_ms()));
            }
            None => {
                if let Some(g) = groups.get_mut(&group) {
                    g.classic = None;
                }
            }
        }
    }

    /// Forgets the groups of `__consumer_offsets` partition `p` of `n`
    /// (this core stopped leading it: another node coordinates them now).
    pub(crate) fn forget_partition(&self, p: u32, n: u32) {
        self.groups
            .borrow_mut()
            .retain(|g, _| records::partition_for(g, n) != p);
    }

    /// Members of the groups `which` picks get a session from `now_ms`.
    pub(crate) fn fresh_sessions(&self, now_ms: u64, which: impl Fn(&str) -> bool) {
        for (name, g) in self.groups.borrow_mut().iter_mut() {
            if !which(name) {
                continue;
            }
            let c = std::mem::take(&mut g.consumer);
            g.consumer = ConsumerGroup::restore(
                c.group_epoch,
                c.assignment_epoch,
                c.assignor,
                c.members,
                now_ms,
            );
        }
    }
}
