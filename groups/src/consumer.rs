//! A consumer group as KIP-848 defines it, as a pure state machine: no
//! I/O, no clock (time comes in as `now_ms`), no core. The coordinator
//! (the broker's `groups/coordinator.rs`) runs it under the group's lock and stores what
//! it marks dirty before answering; the model test drives it directly.
//!
//! **Epochs.** The *group epoch* grows with every change of membership,
//! subscriptions, assignor or partition counts; each change recomputes the
//! *target assignment*, whose epoch (the *assignment epoch*) is the group
//! epoch it was computed at. Each member has a *member epoch*: the
//! assignment epoch it has reconciled to.
//!
//! **Reconciliation.** A member behind the target first gives up what its
//! target no longer holds: those partitions move to its *revoking* set and
//! its epoch stays. Only when it reports them released (a heartbeat whose
//! owned partitions leave them out) does its epoch move to the assignment
//! epoch; it then gets the partitions of its target that no other member
//! holds (assigned or revoking) — the rest follow, at the same epoch, as
//! their previous owners release them. A member that does not release
//! within its rebalance timeout is fenced (removed; its partitions free).
//! So a partition is in at most one member's assigned-or-revoking set at
//! any instant ([`ConsumerGroup::holders`]), and only that member may
//! commit it.
//!
//! **Commits** carry a member epoch; a commit of a partition is applied
//! only if the member holds it now and held it at that epoch already (the
//! epoch is at least the one the partition was assigned at, and at most
//! the member's current one): a commit sent just before a heartbeat moved
//! the member's epoch still lands, a commit from before the member got
//! the partition (or from a fenced incarnation) does not.
//!
//! **Durability.** Every change of a member's epoch, assignment, revoking
//! set or target, and of the group's epochs, marks it dirty;
//! [`ConsumerGroup::take_dirty`] hands the coordinator what to store
//! (member records, tombstones of removed members, the group record)
//! before it answers. [`ConsumerGroup::restore`] rebuilds a group from
//! those records: members keep their epochs and assignments and get a
//! fresh session; nothing reuses an epoch because the group epoch is
//! stored with every bump.

use std::collections::{BTreeMap, BTreeSet};

use crate::assignor::{Assignment, Assignor, Tp};
use crate::limits::{
    CONSUMER_MEMBER_ID_BYTES_MAX, GROUP_MEMBERS_MAX, HEARTBEAT_INTERVAL_MS_MAX, MEMBER_TOPICS_MAX,
    OWNED_PARTITIONS_MAX, SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN,
};

/// Member epoch of a join (KIP-848).
pub const JOIN_EPOCH: i32 = 0;
/// Member epoch of a leave.
pub const LEAVE_EPOCH: i32 = -1;
/// Member epoch of a static member's temporary leave.
pub const STATIC_LEAVE_EPOCH: i32 = -2;

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupError {
    /// The member is not in the group (left, expelled, fenced, or never
    /// joined).
    UnknownMember(String),
    /// The member's epoch is ahead of or too far behind the
    /// coordinator's: it was fenced and must rejoin with epoch 0.
    FencedMemberEpoch(String),
    /// A commit's epoch or partitions do not match the member's current
    /// assignment.
    StaleMemberEpoch(String),
    /// Unknown assignor name.
    UnsupportedAssignor(String),
    /// Session or rebalance timeout out of bounds.
    InvalidSessionTimeout(String),
    /// Malformed or oversized request.
    InvalidRequest(String),
    /// The group is full.
    GroupMaxSize(String),
    /// Another live member uses this instance id.
    UnreleasedInstanceId(String),
}

impl GroupError {
    /// The human-readable detail.
    pub fn message(&self) -> &str {
        match self {
            GroupError::UnknownMember(m)
            | GroupError::FencedMemberEpoch(m)
            | GroupError::StaleMemberEpoch(m)
            | GroupError::UnsupportedAssignor(m)
            | GroupError::InvalidSessionTimeout(m)
            | GroupError::InvalidRequest(m)
            | GroupError::GroupMaxSize(m)
            | GroupError::UnreleasedInstanceId(m) => m,
        }
    }
}

/// A member's heartbeat (KIP-848 `ConsumerGroupHeartbeat`, and the native
/// join and heartbeat mapped onto it). `None` fields mean "unchanged".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heartbeat {
    /// The member's id; empty on a join asks the coordinator for one.
    pub member_id: String,
    /// [`JOIN_EPOCH`], [`LEAVE_EPOCH`], [`STATIC_LEAVE_EPOCH`], or the
    /// epoch the member last received.
    pub member_epoch: i32,
    /// Static membership id.
    pub instance_id: Option<String>,
    /// Free text naming the client.
    pub client_id: String,
    /// How long the member may take to release partitions.
    pub rebalance_timeout_ms: Option<u32>,
    /// How long without a heartbeat before it is expelled.
    pub session_timeout_ms: Option<u32>,
    /// Its subscription.
    pub topics: Option<BTreeSet<String>>,
    /// The server-side assignor it asks for.
    pub assignor: Option<String>,
    /// The partitions it owns now.
    pub owned: Option<BTreeSet<Tp>>,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The member's id.
    pub member_id: String,
    /// Its epoch (-1 after a leave).
    pub member_epoch: i32,
    /// The partitions it may own now.
    pub assignment: BTreeSet<Tp>,
    /// How often to heartbeat.
    pub heartbeat_interval_ms: u32,
}

/// One member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its epoch.
    pub epoch: i32,
    /// Its epoch before the last bump (a heartbeat whose answer was lost
    /// carries it).
    pub previous_epoch: i32,
    /// Static membership id.
    pub instance_id: Option<String>,
    /// Free text naming the client.
    pub client_id: String,
    /// Its subscription.
    pub topics: BTreeSet<String>,
    /// Session timeout.
    pub session_timeout_ms: u32,
    /// Rebalance timeout: how long it may take to release partitions.
    pub rebalance_timeout_ms: u32,
    /// What it holds, with the epoch each partition was assigned at.
    pub assigned: BTreeMap<Tp, i32>,
    /// What it must release; nobody else gets these until it does.
    pub revoking: BTreeMap<Tp, i32>,
    /// Its share of the target assignment.
    pub target: BTreeSet<Tp>,
    /// Last heartbeat (volatile).
    pub last_heartbeat_ms: u64,
    /// When its revocation times out (volatile).
    pub revoke_deadline_ms: Option<u64>,
}

impl Member {
    /// Whether it holds `tp` (assigned or revoking).
    pub fn holds(&self, tp: &Tp) -> bool {
        self.assigned.contains_key(tp) || self.revoking.contains_key(tp)
    }

    fn interval(&self) -> u32 {
        (self.session_timeout_ms / 3).clamp(1, HEARTBEAT_INTERVAL_MS_MAX)
    }
}

/// What a step changed that must be stored before answering.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dirty {
    /// The group record (epochs, assignor).
    pub group: bool,
    /// Members whose record changed (removed ones: a tombstone).
    pub members: BTreeSet<String>,
}

impl Dirty {
    /// Nothing to store.
    pub fn is_empty(&self) -> bool {
        !self.group && self.members.is_empty()
    }
}

/// A consumer group.
#[derive(Debug, Clone, Default)]
pub struct ConsumerGroup {
    /// Grows with every change of membership, subscriptions, assignor or
    /// partition counts.
    pub group_epoch: i32,
    /// The group epoch the target was computed at.
    pub assignment_epoch: i32,
    /// The server-side assignor's name.
    pub assignor: String,
    /// Members by id.
    pub members: BTreeMap<String, Member>,
    /// Partition counts the target was computed with.
    pub counts: BTreeMap<String, u32>,
    dirty: Dirty,
    /// Grows with every change a held heartbeat may want to see.
    changes: u64,
}

fn check_timeout(what: &str, ms: u32) -> Result<u32, GroupError> {
    if (SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX).contains(&ms) {
        Ok(ms)
    } else {
        Err(GroupError::InvalidSessionTimeout(format!(
            "{what} {ms} ms is not within {SESSION_TIMEOUT_MS_MIN}..={SESSION_TIMEOUT_MS_MAX}"
        )))
    }
}

impl ConsumerGroup {
    /// A group restored from its stored records (members get a fresh
    /// session from `now_ms`).
    pub fn restore(
        group_epoch: i32,
        assignment_epoch: i32,
        assignor: String,
        members: BTreeMap<String, Member>,
        now_ms: u64,
    ) -> ConsumerGroup {
        let members = members
            .into_iter()
            .map(|(id, mut m)| {
                m.last_heartbeat_ms = now_ms;
                m.revoke_deadline_ms =
                    (!m.revoking.is_empty()).then(|| now_ms + u64::from(m.rebalance_timeout_ms));
                (id, m)
            })
            .collect();
        ConsumerGroup {
            group_epoch,
            assignment_epoch,
            assignor,
            members,
            ..Default::default()
        }
    }

    /// What changed since the last call.
    pub fn take_dirty(&mut self) -> Dirty {
        std::mem::take(&mut self.dirty)
    }

    /// A counter that moves whenever an answer to some member may have
    /// changed (held heartbeats compare it).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// The member holding `tp` (assigned or revoking), if any.
    pub fn holders<'a>(&'a self, tp: &'a Tp) -> impl Iterator<Item = &'a String> + 'a {
        self.members
            .iter()
            .filter(move |(_, m)| m.holds(tp))
            .map(|(id, _)| id)
    }

    /// `Empty`, `Stable` (every member at the assignment epoch, holding
    /// exactly its target) or `Reconciling`.
    pub fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.members.values().all(|m| {
            m.epoch == self.assignment_epoch
                && m.revoking.is_empty()
                && m.assigned.keys().eq(m.target.iter())
        }) {
            "Stable"
        } else {
            "Reconciling"
        }
    }

    fn touch(&mut self, member: &str) {
        self.dirty.members.insert(member.to_string());
        self.changes += 1;
    }

    /// Bumps the group epoch and recomputes the target (`counts`: the
    /// partition count of a topic, `None` if it does not exist).
    fn bump(&mut self, counts: &dyn Fn(&str) -> Option<u32>) {
        self.group_epoch = self.group_epoch.checked_add(1).unwrap_or(1).max(1);
        self.dirty.group = true;
        self.changes += 1;
        let subscriptions: BTreeMap<String, BTreeSet<String>> = self
            .members
            .iter()
            .map(|(id, m)| (id.clone(), m.topics.clone()))
            .collect();
        self.counts = self.subscribed_counts(counts);
        let previous: Assignment = self
            .members
            .iter()
            .map(|(id, m)| (id.clone(), m.target.clone()))
            .collect();
        let assignor = Assignor::parse(&self.assignor).unwrap_or(Assignor::CooperativeSticky);
        let mut target = assignor.assign(&subscriptions, &self.counts, &previous);
        self.assignment_epoch = self.group_epoch;
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let t = target.remove(&id).unwrap_or_default();
            let m = self.members.get_mut(&id).expect("listed");
            if m.target != t {
                m.target = t;
                self.touch(&id);
            }
        }
    }

    /// Whether a subscribed topic's partition count differs from the one
    /// the target was computed with.
    pub fn counts_changed(&self, counts: &dyn Fn(&str) -> Option<u32>) -> bool {
        !self.members.is_empty() && self.subscribed_counts(counts) != self.counts
    }

    fn subscribed_counts(&self, counts: &dyn Fn(&str) -> Option<u32>) -> BTreeMap<String, u32> {
        self.members
            .values()
            .flat_map(|m| m.topics.iter())
            .filter_map(|t| counts(t).map(|n| (t.clone(), n)))
            .collect()
    }

    /// Removes a member; its partitions become free and the target is
    /// recomputed.
    pub fn remove(&mut self, member: &str, counts: &dyn Fn(&str) -> Option<u32>) -> bool {
        if self.members.remove(member).is_none() {
            return false;
        }
        self.touch(member);
        self.bump(counts);
        true
    }

    fn free(&self, member: &str, tp: &Tp) -> bool {
        !self
            .members
            .iter()
            .any(|(id, m)| id != member && m.holds(tp))
    }

    /// Moves a member towards its target as far as it may now.
    fn reconcile(&mut self, id: &str, now_ms: u64) {
        let epoch = self.assignment_epoch;
        let Some(m) = self.members.get(id) else {
            return;
        };
        if !m.revoking.is_empty() {
            return;
        }
        let revoke: Vec<Tp> = m
            .assigned
            .keys()
            .filter(|tp| !m.target.contains(*tp))
            .cloned()
            .collect();
        if m.epoch != epoch && !revoke.is_empty() {
            let m = self.members.get_mut(id).expect("present");
            for tp in revoke {
                let e = m.assigned.remove(&tp).expect("assigned");
                m.revoking.insert(tp, e);
            }
            m.revoke_deadline_ms = Some(now_ms + u64::from(m.rebalance_timeout_ms));
            self.touch(id);
            return;
        }
        let gain: Vec<Tp> = m
            .target
            .iter()
            .filter(|tp| !m.assigned.contains_key(*tp) && self.free(id, tp))
            .cloned()
            .collect();
        let m = self.members.get_mut(id).expect("present");
        let mut changed = false;
        if m.epoch != epoch {
            m.previous_epoch = m.epoch;
            m.epoch = epoch;
            changed = true;
        }
        for tp in gain {
            m.assigned.insert(tp, epoch);
            changed = true;
        }
        if changed {
            self.touch(id);
        }
    }

    /// Handles a heartbeat (a join with epoch 0, a leave with -1 or -2).
    /// `fresh_id` names a member that joins without an id; `counts` gives
    /// partition counts.
    pub fn heartbeat(
        &mut self,
        now_ms: u64,
        hb: Heartbeat,
        fresh_id: &mut dyn FnMut() -> String,
        counts: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<Answer, GroupError> {
        for (what, s) in [
            ("member id", Some(&hb.member_id)),
            ("client id", Some(&hb.client_id)),
            ("instance id", hb.instance_id.as_ref()),
        ] {
            if s.is_some_and(|s| s.len() > CONSUMER_MEMBER_ID_BYTES_MAX) {
                return Err(GroupError::InvalidRequest(format!(
                    "{what} is over {CONSUMER_MEMBER_ID_BYTES_MAX} bytes"
                )));
            }
        }
        if let Some(t) = &hb.topics {
            if t.len() > MEMBER_TOPICS_MAX {
                return Err(GroupError::InvalidRequest(format!(
                    "a member may subscribe to at most {MEMBER_TOPICS_MAX} topics"
                )));
            }
        }
        if hb
            .owned
            .as_ref()
            .is_some_and(|o| o.len() > OWNED_PARTITIONS_MAX)
        {
            return Err(GroupError::InvalidRequest(format!(
                "a member may report at most {OWNED_PARTITIONS_MAX} owned partitions"
            )));
        }
        if let Some(a) = &hb.assignor {
            if Assignor::parse(a).is_none() {
                return Err(GroupError::UnsupportedAssignor(format!(
                    "unknown assignor `{a}`: use range, roundrobin or cooperative-sticky"
                )));
            }
        }
        match hb.member_epoch {
            LEAVE_EPOCH | STATIC_LEAVE_EPOCH => {
                if !self.remove(&hb.member_id, counts) {
                    return Err(self.unknown(&hb.member_id));
                }
                Ok(Answer {
                    member_id: hb.member_id,
                    member_epoch: LEAVE_EPOCH,
                    assignment: BTreeSet::new(),
                    heartbeat_interval_ms: 0,
                })
            }
            JOIN_EPOCH => self.join(now_ms, &hb, fresh_id, counts).map(|id| {
                self.reconcile(&id, now_ms);
                self.answer(&id)
            }),
            e if e < 0 => Err(GroupError::InvalidRequest(format!(
                "member epoch {e} is not valid"
            ))),
            e => {
                let id = hb.member_id.clone();
                let m = self.members.get(&id).ok_or_else(|| self.unknown(&id))?;
                let lost_answer = e == m.previous_epoch && e < m.epoch;
                if e > m.epoch || (e < m.epoch && !lost_answer) {
                    let current = m.epoch;
                    self.remove(&id, counts);
                    return Err(GroupError::FencedMemberEpoch(format!(
                        "member `{id}` sent epoch {e}, its epoch is {current}: it was fenced; \
                         rejoin with epoch 0"
                    )));
                }
                if lost_answer
                    && hb
                        .owned
                        .as_ref()
                        .is_some_and(|o| !o.iter().all(|tp| m.holds(tp)))
                {
                    self.remove(&id, counts);
                    return Err(GroupError::FencedMemberEpoch(format!(
                        "member `{id}` sent its previous epoch {e} owning partitions it no \
                         longer holds: it was fenced; rejoin with epoch 0"
                    )));
                }
                self.update(&id, &hb, now_ms, counts)?;
                if !lost_answer {
                    // A member that missed an answer hears it again first.
                    self.reconcile(&id, now_ms);
                }
                Ok(self.answer(&id))
            }
        }
    }

    fn unknown(&self, id: &str) -> GroupError {
        GroupError::UnknownMember(format!(
            "the group has no member `{id}` (it left, was expelled after its session or \
             rebalance timeout, or never joined): rejoin"
        ))
    }

    /// Adds a member (or resets an existing one that rejoins with epoch
    /// 0: it lost everything it held). Returns its id.
    fn join(
        &mut self,
        now_ms: u64,
        hb: &Heartbeat,
        fresh_id: &mut dyn FnMut() -> String,
        counts: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<String, GroupError> {
        let topics = hb.topics.clone().unwrap_or_default();
        if topics.is_empty() {
            return Err(GroupError::InvalidRequest(format!(
                "a member must subscribe to 1 to {MEMBER_TOPICS_MAX} topics"
            )));
        }
        let session = check_timeout("session timeout", hb.session_timeout_ms.unwrap_or(45_000))?;
        let rebalance = check_timeout(
            "rebalance timeout",
            hb.rebalance_timeout_ms.unwrap_or(300_000),
        )?;
        if let Some(a) = &hb.assignor {
            let others = self.members.keys().any(|id| *id != hb.member_id);
            if others && !self.assignor.is_empty() && *a != self.assignor {
                return Err(GroupError::UnsupportedAssignor(format!(
                    "the group uses the assignor `{}`, not `{a}`",
                    self.assignor
                )));
            }
        }
        if let Some(inst) = &hb.instance_id {
            if let Some((other, _)) = self
                .members
                .iter()
                .find(|(id, m)| **id != hb.member_id && m.instance_id.as_ref() == Some(inst))
            {
                return Err(GroupError::UnreleasedInstanceId(format!(
                    "instance id `{inst}` is used by member `{other}`"
                )));
            }
        }
        let id = if hb.member_id.is_empty() {
            if self.members.len() >= GROUP_MEMBERS_MAX {
                return Err(GroupError::GroupMaxSize(format!(
                    "the group has {GROUP_MEMBERS_MAX} members"
                )));
            }
            fresh_id()
        } else {
            hb.member_id.clone()
        };
        if self.members.remove(&id).is_none() && self.members.len() >= GROUP_MEMBERS_MAX {
            return Err(GroupError::GroupMaxSize(format!(
                "the group has {GROUP_MEMBERS_MAX} members"
            )));
        }
        if let Some(a) = &hb.assignor {
            self.assignor = a.clone();
        } else if self.assignor.is_empty() {
            self.assignor = Assignor::CooperativeSticky.name().to_string();
        }
        self.members.insert(
            id.clone(),
            Member {
                epoch: JOIN_EPOCH,
                previous_epoch: JOIN_EPOCH,
                instance_id: hb.instance_id.clone(),
                client_id: hb.client_id.clone(),
                topics,
                session_timeout_ms: session,
                rebalance_timeout_ms: rebalance,
                assigned: BTreeMap::new(),
                revoking: BTreeMap::new(),
                target: BTreeSet::new(),
                last_heartbeat_ms: now_ms,
                revoke_deadline_ms: None,
            },
        );
        self.touch(&id);
        self.bump(counts);
        Ok(id)
    }

    /// Takes in what a heartbeat of a known member says.
    fn update(
        &mut self,
        id: &str,
        hb: &Heartbeat,
        now_ms: u64,
        counts: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<(), GroupError> {
        let session = hb
            .session_timeout_ms
            .map(|t| check_timeout("session timeout", t))
            .transpose()?;
        let rebalance = hb
            .rebalance_timeout_ms
            .map(|t| check_timeout("rebalance timeout", t))
            .transpose()?;
        if hb.topics.as_ref().is_some_and(|t| t.is_empty()) {
            return Err(GroupError::InvalidRequest(
                "a member must subscribe to at least one topic".into(),
            ));
        }
        let others = self.members.len() > 1;
        if let Some(a) = &hb.assignor {
            if others && *a != self.assignor {
                return Err(GroupError::UnsupportedAssignor(format!(
                    "the group uses the assignor `{}`, not `{a}`",
                    self.assignor
                )));
            }
        }
        let m = self.members.get_mut(id).expect("checked");
        m.last_heartbeat_ms = now_ms;
        let mut durable = false;
        if let Some(s) = session {
            durable |= m.session_timeout_ms != s;
            m.session_timeout_ms = s;
        }
        if let Some(r) = rebalance {
            durable |= m.rebalance_timeout_ms != r;
            m.rebalance_timeout_ms = r;
        }
        if let Some(owned) = &hb.owned {
            let before = m.revoking.len();
            m.revoking.retain(|tp, _| owned.contains(tp));
            if m.revoking.is_empty() {
                m.revoke_deadline_ms = None;
            }
            durable |= m.revoking.len() != before;
        }
        let mut rebalance_needed = false;
        if let Some(t) = &hb.topics {
            if *t != m.topics {
                m.topics = t.clone();
                rebalance_needed = true;
            }
        }
        if let Some(a) = &hb.assignor {
            if *a != self.assignor {
                self.assignor = a.clone();
                rebalance_needed = true;
            }
        }
        if durable {
            self.touch(id);
        }
        if rebalance_needed {
            self.touch(id);
            self.bump(counts);
        }
        Ok(())
    }

    fn answer(&self, id: &str) -> Answer {
        let m = &self.members[id];
        Answer {
            member_id: id.to_string(),
            member_epoch: m.epoch,
            assignment: m.assigned.keys().cloned().collect(),
            heartbeat_interval_ms: m.interval(),
        }
    }

    /// The answer a member would get now without changing anything
    /// (`None` if it is gone).
    pub fn current(&self, id: &str) -> Option<Answer> {
        self.members.contains_key(id).then(|| self.answer(id))
    }

    /// Expels members whose session ended, fences members whose
    /// revocation timed out, and recomputes the target if a subscribed
    /// topic's partition count changed. Returns the expelled members with
    /// the reason.
    pub fn tick(
        &mut self,
        now_ms: u64,
        counts: &dyn Fn(&str) -> Option<u32>,
    ) -> Vec<(String, &'static str)> {
        let gone: Vec<(String, &'static str)> = self
            .members
            .iter()
            .filter_map(|(id, m)| {
                if now_ms.saturating_sub(m.last_heartbeat_ms) > u64::from(m.session_timeout_ms) {
                    Some((id.clone(), "session timed out"))
                } else if m.revoke_deadline_ms.is_some_and(|d| now_ms > d) {
                    Some((
                        id.clone(),
                        "did not release partitions within its rebalance timeout",
                    ))
                } else {
                    None
                }
            })
            .collect();
        for (id, _) in &gone {
            self.remove(id, counts);
        }
        if self.counts_changed(counts) {
            self.bump(counts);
        }
        gone
    }

    /// When [`ConsumerGroup::tick`] has something to do next.
    pub fn next_deadline(&self) -> Option<u64> {
        self.members
            .values()
            .flat_map(|m| {
                [
                    Some(m.last_heartbeat_ms + u64::from(m.session_timeout_ms) + 1),
                    m.revoke_deadline_ms.map(|d| d + 1),
                ]
            })
            .flatten()
            .min()
    }

    /// Checks a member's commit of `tps` at `epoch`: a group-level error,
    /// or one per partition (`None`: it may be written).
    pub fn validate_commit(
        &self,
        member: &str,
        epoch: i32,
        tps: &[Tp],
    ) -> Result<Vec<Option<GroupError>>, GroupError> {
        let m = self
            .members
            .get(member)
            .ok_or_else(|| self.unknown(member))?;
        if epoch > m.epoch || epoch < 0 {
            return Err(GroupError::StaleMemberEpoch(format!(
                "commit at epoch {epoch}; member `{member}` is at epoch {}",
                m.epoch
            )));
        }
        Ok(tps
            .iter()
            .map(|tp| {
                let since = m.assigned.get(tp).or_else(|| m.revoking.get(tp));
                match since {
                    Some(&e) if e <= epoch => None,
                    Some(&e) => Some(GroupError::StaleMemberEpoch(format!(
                        "{}-{} was assigned to member `{member}` at epoch {e}, after the \
                         commit's epoch {epoch}",
                        tp.0, tp.1
                    ))),
                    None => Some(GroupError::StaleMemberEpoch(format!(
                        "{}-{} is not assigned to member `{member}` (epoch {})",
                        tp.0, tp.1, m.epoch
                    ))),
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(t: &str) -> Option<u32> {
        match t {
            "t" => Some(4),
            "u" => Some(2),
            _ => None,
        }
    }

    fn join(g: &mut ConsumerGroup, now: u64, name: &str) -> Answer {
        let mut id = || name.to_string();
        g.heartbeat(
            now,
            Heartbeat {
                member_epoch: JOIN_EPOCH,
                topics: Some(["t".to_string()].into()),
                assignor: Some("cooperative-sticky".into()),
                session_timeout_ms: Some(10_000),
                rebalance_timeout_ms: Some(5_000),
                ..Default::default()
            },
            &mut id,
            &counts,
        )
        .unwrap()
    }

    fn hb(g: &mut ConsumerGroup, now: u64, a: &Answer) -> Result<Answer, GroupError> {
        g.heartbeat(
            now,
            Heartbeat {
                member_id: a.member_id.clone(),
                member_epoch: a.member_epoch,
                owned: Some(a.assignment.clone()),
                ..Default::default()
            },
            &mut || unreachable!(),
            &counts,
        )
    }

    fn single_holders(g: &ConsumerGroup) {
        for p in 0..4 {
            let tp = ("t".to_string(), p);
            assert!(g.holders(&tp).count() <= 1, "{tp:?} held twice: {g:?}");
        }
    }

    #[test]
    fn the_a_b_c_interleaving_never_hands_one_partition_to_two_members() {
        let mut g = ConsumerGroup::default();
        let a = join(&mut g, 0, "a");
        assert_eq!(a.assignment.len(), 4);
        let b = join(&mut g, 1, "b");
        assert!(b.assignment.is_empty(), "A still holds everything");
        // A hears of the change: two partitions to revoke, epoch unchanged.
        let a1 = hb(&mut g, 2, &a).unwrap();
        assert_eq!((a1.assignment.len(), a1.member_epoch), (2, a.member_epoch));
        // A releases: its epoch moves on.
        let a2 = hb(&mut g, 3, &a1).unwrap();
        assert!(a2.member_epoch > a1.member_epoch);
        let b1 = hb(&mut g, 4, &b).unwrap();
        assert_eq!(b1.assignment.len(), 2);
        // C joins before B's next heartbeat: nothing B holds goes to C.
        let c = join(&mut g, 5, "c");
        assert!(c.assignment.is_disjoint(&b1.assignment));
        single_holders(&g);
        for tp in &b1.assignment {
            let r = g.validate_commit("c", c.member_epoch, std::slice::from_ref(tp));
            assert!(matches!(
                r.unwrap()[0],
                Some(GroupError::StaleMemberEpoch(_))
            ));
        }
        // Everyone reconciles; the group settles with each partition once.
        let (mut a, mut b, mut c) = (a2, b1, c);
        for now in 6..20 {
            a = hb(&mut g, now, &a).unwrap();
            b = hb(&mut g, now, &b).unwrap();
            c = hb(&mut g, now, &c).unwrap();
            single_holders(&g);
        }
        assert_eq!(g.state(), "Stable");
        assert_eq!(
            a.assignment.len() + b.assignment.len() + c.assignment.len(),
            4
        );
    }

    #[test]
    fn a_member_that_does_not_release_in_time_is_fenced() {
        let mut g = ConsumerGroup::default();
        let a = join(&mut g, 0, "a");
        let b = join(&mut g, 1, "b");
        let a1 = hb(&mut g, 2, &a).unwrap();
        assert_eq!(a1.assignment.len(), 2);
        // A keeps heartbeating but never releases.
        let still = Heartbeat {
            member_id: "a".into(),
            member_epoch: a1.member_epoch,
            owned: Some(a.assignment.clone()),
            ..Default::default()
        };
        g.heartbeat(1000, still.clone(), &mut || unreachable!(), &counts)
            .unwrap();
        assert!(g.tick(4000, &counts).is_empty());
        let gone = g.tick(5003, &counts);
        assert_eq!(gone, vec![("a".to_string(), gone[0].1)]);
        let e = g
            .heartbeat(5004, still, &mut || unreachable!(), &counts)
            .unwrap_err();
        assert!(matches!(e, GroupError::UnknownMember(_)));
        let b1 = hb(&mut g, 5005, &b).unwrap();
        assert_eq!(b1.assignment.len(), 4);
    }

    #[test]
    fn epochs_ahead_or_far_behind_fence_and_a_lost_answer_is_repeated() {
        let mut g = ConsumerGroup::default();
        let a = join(&mut g, 0, "a");
        let mut ahead = a.clone();
        ahead.member_epoch += 1;
        assert!(matches!(
            hb(&mut g, 1, &ahead),
            Err(GroupError::FencedMemberEpoch(_))
        ));
        let a = join(&mut g, 2, "a");
        let _b = join(&mut g, 3, "b");
        let a1 = hb(&mut g, 4, &a).unwrap();
        let a2 = hb(&mut g, 5, &a1).unwrap();
        assert!(a2.member_epoch > a1.member_epoch);
        // The answer a2 was lost: A heartbeats with its previous epoch and
        // hears it again.
        let again = hb(&mut g, 6, &a1).unwrap();
        assert_eq!(again, a2);
        // A commit at the old epoch of a partition A held then lands.
        let tp = a2.assignment.iter().next().unwrap().clone();
        let r = g.validate_commit("a", a1.member_epoch, &[tp]).unwrap();
        assert_eq!(r, vec![None]);
    }

    #[test]
    fn restore_keeps_epochs_and_assignments() {
        let mut g = ConsumerGroup::default();
        let a = join(&mut g, 0, "a");
        let a = hb(&mut g, 1, &a).unwrap();
        let r = ConsumerGroup::restore(
            g.group_epoch,
            g.assignment_epoch,
            g.assignor.clone(),
            g.members.clone(),
            100,
        );
        let mut r = r;
        let a1 = hb(&mut r, 101, &a).unwrap();
        assert_eq!(a1, a);
        let b = join(&mut r, 102, "b");
        assert!(b.member_epoch > a.member_epoch || b.assignment.is_empty());
        assert!(r.group_epoch > g.group_epoch);
    }
}
