//! A share group's membership (KIP-932's ShareGroupHeartbeat) and its
//! assignor, as a pure state machine.
//!
//! Members join with epoch 0 and an id of their own (KIP-1082), leave
//! with epoch -1, and heartbeat within their session timeout or are
//! removed ([`ShareGroup::expire`]). Every change of membership,
//! subscriptions or partition counts bumps the *group epoch* and
//! recomputes the assignment at once: share groups have no revocation —
//! a partition may be read by several members, so a member takes its new
//! partitions on its next heartbeat, whose answer carries them and the
//! group epoch as its member epoch. A heartbeat at the member's previous
//! epoch (the answer that moved it was lost) is answered again; any
//! other epoch is fenced.
//!
//! **The assignor** (Kafka's `simple`): per topic, over the members
//! subscribed to it in id order, with `M` members and `P` partitions:
//! `M <= P` spreads the partitions round-robin (each member reads its
//! own); `M > P` gives member `j` partition `j mod P` (each partition is
//! read by `M / P` or `M / P + 1` members). Every partition of a
//! subscribed topic has a reader; no member is idle while another holds
//! two partitions.
//!
//! Membership is not stored: a coordinator that restarts or moves
//! answers UNKNOWN_MEMBER_ID and members join again with their ids (what
//! they consumed is in the share partitions' own durable state).

use std::collections::{BTreeMap, BTreeSet};

use crate::limits::{
    GROUP_MAX_SIZE_DEFAULT, HEARTBEAT_INTERVAL_MS_DEFAULT, MEMBER_ID_BYTES_MAX, MEMBER_TOPICS_MAX,
    SESSION_TIMEOUT_MS_DEFAULT,
};

/// A topic partition.
pub type Tp = (String, u32);

/// Member epoch of a join.
pub const JOIN_EPOCH: i32 = 0;
/// Member epoch of a leave.
pub const LEAVE_EPOCH: i32 = -1;

/// Why a heartbeat was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareGroupError {
    /// The member is not in the group (left, expired, never joined, or
    /// the coordinator restarted): join again with epoch 0.
    UnknownMember(String),
    /// The member's epoch is neither its current one nor the one before:
    /// join again with epoch 0.
    FencedMemberEpoch(String),
    /// Malformed (an empty member id, a join without subscriptions, too
    /// many topics).
    InvalidRequest(String),
    /// The group has `group.share.max.size` members.
    GroupMaxSize(String),
}

impl ShareGroupError {
    /// The human-readable detail.
    pub fn message(&self) -> &str {
        match self {
            ShareGroupError::UnknownMember(m)
            | ShareGroupError::FencedMemberEpoch(m)
            | ShareGroupError::InvalidRequest(m)
            | ShareGroupError::GroupMaxSize(m) => m,
        }
    }
}

impl std::fmt::Display for ShareGroupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for ShareGroupError {}

/// A share group's settings (`group.share.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupConfig {
    /// `group.share.session.timeout.ms`.
    pub session_timeout_ms: i64,
    /// `group.share.heartbeat.interval.ms`.
    pub heartbeat_interval_ms: i64,
    /// `group.share.max.size`.
    pub max_size: usize,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            session_timeout_ms: SESSION_TIMEOUT_MS_DEFAULT,
            heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS_DEFAULT,
            max_size: GROUP_MAX_SIZE_DEFAULT,
        }
    }
}

/// A heartbeat (ShareGroupHeartbeat's fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// The member's own id.
    pub member_id: String,
    /// 0 to join, -1 to leave, else the epoch it has.
    pub member_epoch: i32,
    /// The topics it subscribes to (`None`: unchanged; required to join).
    pub subscribed: Option<Vec<String>>,
    /// Its rack, if it says.
    pub rack: Option<String>,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatAnswer {
    /// The member's epoch now (-1 after a leave).
    pub member_epoch: i32,
    /// When to heartbeat again.
    pub heartbeat_interval_ms: i64,
    /// Its partitions, when they changed (or it joined); `None`: as before.
    pub assignment: Option<Vec<Tp>>,
}

/// A member as the group sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its id.
    pub id: String,
    /// The epoch it has (the group epoch of its last assignment).
    pub epoch: i32,
    /// The epoch before (a heartbeat at it is a lost answer's retry).
    pub previous_epoch: i32,
    /// Topics it subscribes to.
    pub subscribed: BTreeSet<String>,
    /// Its rack.
    pub rack: Option<String>,
    /// Its partitions (the assignment it was given).
    pub assigned: BTreeSet<Tp>,
    /// When its session ends without a heartbeat.
    pub deadline_ms: i64,
}

/// A share group.
#[derive(Debug, Clone)]
pub struct ShareGroup {
    config: GroupConfig,
    epoch: i32,
    members: BTreeMap<String, Member>,
    /// The target assignment (by member), at the group epoch.
    target: BTreeMap<String, BTreeSet<Tp>>,
    /// Partition counts of the subscribed topics the assignment was
    /// computed with.
    partitions: BTreeMap<String, u32>,
}

impl ShareGroup {
    /// An empty group.
    pub fn new(config: GroupConfig) -> ShareGroup {
        ShareGroup {
            config,
            epoch: 0,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            partitions: BTreeMap::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> GroupConfig {
        self.config
    }

    /// Applies new settings (sessions already running keep their
    /// deadlines until their next heartbeat).
    pub fn set_config(&mut self, config: GroupConfig) {
        self.config = config;
    }

    /// The group epoch.
    pub fn epoch(&self) -> i32 {
        self.epoch
    }

    /// The members, in id order.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// Whether nobody is in the group.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The topics some member subscribes to.
    pub fn subscribed_topics(&self) -> BTreeSet<String> {
        self.members
            .values()
            .flat_map(|m| m.subscribed.iter().cloned())
            .collect()
    }

    /// The members assigned `tp` now.
    pub fn readers_of(&self, tp: &Tp) -> Vec<&str> {
        self.members
            .values()
            .filter(|m| m.assigned.contains(tp))
            .map(|m| m.id.as_str())
            .collect()
    }

    /// Serves a heartbeat at `now_ms`; `partitions_of` says how many
    /// partitions a topic has (`None`: no such topic, nothing assigned).
    pub fn heartbeat(
        &mut self,
        hb: &Heartbeat,
        partitions_of: &dyn Fn(&str) -> Option<u32>,
        now_ms: i64,
    ) -> Result<HeartbeatAnswer, ShareGroupError> {
        if hb.member_id.is_empty() || hb.member_id.len() > MEMBER_ID_BYTES_MAX {
            return Err(ShareGroupError::InvalidRequest(format!(
                "a member id of {} bytes (1..={MEMBER_ID_BYTES_MAX}; the member chooses it)",
                hb.member_id.len()
            )));
        }
        if let Some(topics) = &hb.subscribed {
            if topics.len() > MEMBER_TOPICS_MAX {
                return Err(ShareGroupError::InvalidRequest(format!(
                    "{} subscribed topics (at most {MEMBER_TOPICS_MAX})",
                    topics.len()
                )));
            }
        }
        let interval = self.config.heartbeat_interval_ms;
        let deadline = now_ms.saturating_add(self.config.session_timeout_ms);
        match hb.member_epoch {
            LEAVE_EPOCH => {
                if self.members.contains_key(&hb.member_id) {
                    self.remove(&hb.member_id, partitions_of);
                }
                Ok(HeartbeatAnswer {
                    member_epoch: LEAVE_EPOCH,
                    heartbeat_interval_ms: interval,
                    assignment: None,
                })
            }
            JOIN_EPOCH => {
                let Some(topics) = hb.subscribed.as_ref().filter(|t| !t.is_empty()) else {
                    return Err(ShareGroupError::InvalidRequest(
                        "a join names the topics it subscribes to".into(),
                    ));
                };
                if !self.members.contains_key(&hb.member_id)
                    && self.members.len() >= self.config.max_size
                {
                    return Err(ShareGroupError::GroupMaxSize(format!(
                        "the share group has {} members (group.share.max.size)",
                        self.members.len()
                    )));
                }
                let subscribed: BTreeSet<String> = topics.iter().cloned().collect();
                self.members.insert(
                    hb.member_id.clone(),
                    Member {
                        id: hb.member_id.clone(),
                        epoch: JOIN_EPOCH,
                        previous_epoch: JOIN_EPOCH,
                        subscribed,
                        rack: hb.rack.clone(),
                        assigned: BTreeSet::new(),
                        deadline_ms: deadline,
                    },
                );
                self.reassign(partitions_of);
                Ok(self.answer_current(&hb.member_id, true))
            }
            epoch => {
                let Some(m) = self.members.get_mut(&hb.member_id) else {
                    return Err(ShareGroupError::UnknownMember(format!(
                        "member {} is not in the group: join again with epoch 0",
                        hb.member_id
                    )));
                };
                if epoch != m.epoch && epoch != m.previous_epoch {
                    return Err(ShareGroupError::FencedMemberEpoch(format!(
                        "member {} sent epoch {epoch}; it has {}: join again with epoch 0",
                        hb.member_id, m.epoch
                    )));
                }
                m.deadline_ms = deadline;
                if hb.rack.is_some() {
                    m.rack = hb.rack.clone();
                }
                let lost_answer = epoch != m.epoch;
                let mut changed = false;
                if let Some(topics) = &hb.subscribed {
                    let subscribed: BTreeSet<String> = topics.iter().cloned().collect();
                    if subscribed != m.subscribed {
                        m.subscribed = subscribed;
                        changed = true;
                    }
                }
                if changed {
                    self.reassign(partitions_of);
                } else {
                    self.refresh(partitions_of);
                }
                Ok(self.answer_current(&hb.member_id, lost_answer))
            }
        }
    }

    /// Removes the members whose session ended at `now_ms`; their ids
    /// (their acquired records are to be released).
    pub fn expire(
        &mut self,
        now_ms: i64,
        partitions_of: &dyn Fn(&str) -> Option<u32>,
    ) -> Vec<String> {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| m.deadline_ms <= now_ms)
            .map(|m| m.id.clone())
            .collect();
        for id in &gone {
            self.members.remove(id);
        }
        if !gone.is_empty() {
            self.reassign(partitions_of);
        }
        gone
    }

    /// The earliest session deadline.
    pub fn next_deadline(&self) -> Option<i64> {
        self.members.values().map(|m| m.deadline_ms).min()
    }

    fn remove(&mut self, id: &str, partitions_of: &dyn Fn(&str) -> Option<u32>) {
        self.members.remove(id);
        self.reassign(partitions_of);
    }

    /// Recomputes the assignment if a subscribed topic's partition count
    /// changed.
    fn refresh(&mut self, partitions_of: &dyn Fn(&str) -> Option<u32>) {
        let now = self.counts(partitions_of);
        if now != self.partitions {
            self.reassign(partitions_of);
        }
    }

    fn counts(&self, partitions_of: &dyn Fn(&str) -> Option<u32>) -> BTreeMap<String, u32> {
        self.subscribed_topics()
            .into_iter()
            .filter_map(|t| partitions_of(&t).map(|n| (t, n)))
            .collect()
    }

    /// A new group epoch and target assignment.
    fn reassign(&mut self, partitions_of: &dyn Fn(&str) -> Option<u32>) {
        self.partitions = self.counts(partitions_of);
        self.epoch = self.epoch.wrapping_add(1).max(1);
        let mut target: BTreeMap<String, BTreeSet<Tp>> = self
            .members
            .keys()
            .map(|id| (id.clone(), BTreeSet::new()))
            .collect();
        for (topic, &n) in &self.partitions {
            if n == 0 {
                continue;
            }
            let readers: Vec<&String> = self
                .members
                .values()
                .filter(|m| m.subscribed.contains(topic))
                .map(|m| &m.id)
                .collect();
            let m = readers.len() as u32;
            if m == 0 {
                continue;
            }
            if m <= n {
                for p in 0..n {
                    let id = readers[(p % m) as usize];
                    target
                        .entry(id.clone())
                        .or_default()
                        .insert((topic.clone(), p));
                }
            } else {
                for (j, id) in readers.iter().enumerate() {
                    target
                        .entry((*id).clone())
                        .or_default()
                        .insert((topic.clone(), j as u32 % n));
                }
            }
        }
        self.target = target;
    }

    /// The member's answer; moves it to the group epoch if its
    /// assignment is behind (the answer then carries it), or when
    /// `always` (a join, a lost answer's retry).
    fn answer_current(&mut self, id: &str, always: bool) -> HeartbeatAnswer {
        let interval = self.config.heartbeat_interval_ms;
        let epoch = self.epoch;
        let target = self.target.get(id).cloned().unwrap_or_default();
        let m = self.members.get_mut(id).expect("a member answered");
        let moved = m.epoch != epoch;
        if moved {
            m.previous_epoch = m.epoch;
            m.epoch = epoch;
            m.assigned = target;
        }
        HeartbeatAnswer {
            member_epoch: m.epoch,
            heartbeat_interval_ms: interval,
            assignment: (moved || always).then(|| m.assigned.iter().cloned().collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(id: &str, topics: &[&str]) -> Heartbeat {
        Heartbeat {
            member_id: id.into(),
            member_epoch: JOIN_EPOCH,
            subscribed: Some(topics.iter().map(|t| t.to_string()).collect()),
            rack: None,
        }
    }

    fn beat(id: &str, epoch: i32) -> Heartbeat {
        Heartbeat {
            member_id: id.into(),
            member_epoch: epoch,
            subscribed: None,
            rack: None,
        }
    }

    fn two(t: &str) -> Option<u32> {
        (t == "t").then_some(2)
    }

    #[test]
    fn more_members_than_partitions_share_them_and_every_partition_has_readers() {
        let mut g = ShareGroup::new(GroupConfig::default());
        let mut epochs = Vec::new();
        for i in 0..8 {
            let a = g
                .heartbeat(&join(&format!("m{i}"), &["t"]), &two, 0)
                .unwrap();
            let n = a.assignment.as_ref().map(|a| a.len());
            assert_eq!(n, Some(if i == 0 { 2 } else { 1 }), "member {i}");
            epochs.push(a.member_epoch);
        }
        // Everyone catches up with the last epoch.
        for (i, epoch) in epochs.iter().enumerate() {
            let id = format!("m{i}");
            let a = g.heartbeat(&beat(&id, *epoch), &two, 1).unwrap();
            assert_eq!(a.member_epoch, g.epoch());
        }
        let p0 = g.readers_of(&("t".into(), 0)).len();
        let p1 = g.readers_of(&("t".into(), 1)).len();
        assert_eq!((p0, p1), (4, 4));
    }

    #[test]
    fn fewer_members_spread_the_partitions_and_a_leaver_gives_them_back() {
        let four = |t: &str| (t == "t").then_some(4);
        let mut g = ShareGroup::new(GroupConfig::default());
        let a = g.heartbeat(&join("a", &["t"]), &four, 0).unwrap();
        assert_eq!(a.assignment.unwrap().len(), 4);
        let b = g.heartbeat(&join("b", &["t"]), &four, 0).unwrap();
        assert_eq!(b.assignment.unwrap().len(), 2);
        // a learns it has 2 now.
        let a = g.heartbeat(&beat("a", a.member_epoch), &four, 1).unwrap();
        assert_eq!(a.assignment.unwrap().len(), 2);
        // An unchanged heartbeat carries no assignment.
        let again = g.heartbeat(&beat("a", a.member_epoch), &four, 2).unwrap();
        assert_eq!(again.assignment, None);
        let left = g.heartbeat(&beat("b", LEAVE_EPOCH), &four, 3).unwrap();
        assert_eq!(left.member_epoch, LEAVE_EPOCH);
        let a = g.heartbeat(&beat("a", a.member_epoch), &four, 4).unwrap();
        assert_eq!(a.assignment.unwrap().len(), 4);
    }

    #[test]
    fn epochs_sessions_and_bad_heartbeats() {
        let mut g = ShareGroup::new(GroupConfig {
            session_timeout_ms: 100,
            ..GroupConfig::default()
        });
        let a = g.heartbeat(&join("a", &["t"]), &two, 0).unwrap();
        let _ = g.heartbeat(&join("b", &["t"]), &two, 0).unwrap();
        // a's next answer moves it; a retry at the old epoch is answered.
        let moved = g.heartbeat(&beat("a", a.member_epoch), &two, 10).unwrap();
        assert!(moved.member_epoch > a.member_epoch);
        let retry = g.heartbeat(&beat("a", a.member_epoch), &two, 11).unwrap();
        assert_eq!(retry.member_epoch, moved.member_epoch);
        assert!(retry.assignment.is_some());
        assert!(matches!(
            g.heartbeat(&beat("a", moved.member_epoch + 5), &two, 12),
            Err(ShareGroupError::FencedMemberEpoch(_))
        ));
        assert!(matches!(
            g.heartbeat(&beat("nobody", 3), &two, 12),
            Err(ShareGroupError::UnknownMember(_))
        ));
        assert!(matches!(
            g.heartbeat(&join("", &["t"]), &two, 12),
            Err(ShareGroupError::InvalidRequest(_))
        ));
        assert!(matches!(
            g.heartbeat(&join("c", &[]), &two, 12),
            Err(ShareGroupError::InvalidRequest(_))
        ));
        // b never heartbeats again: its session ends at 100.
        assert_eq!(g.expire(99, &two), Vec::<String>::new());
        assert_eq!(g.expire(100, &two), ["b"]);
        let a = g
            .heartbeat(&beat("a", moved.member_epoch), &two, 101)
            .unwrap();
        assert_eq!(
            a.assignment.unwrap().len(),
            2,
            "a reads both partitions now"
        );
        // A full group refuses a new member.
        let mut full = ShareGroup::new(GroupConfig {
            max_size: 1,
            ..GroupConfig::default()
        });
        full.heartbeat(&join("x", &["t"]), &two, 0).unwrap();
        assert!(matches!(
            full.heartbeat(&join("y", &["t"]), &two, 0),
            Err(ShareGroupError::GroupMaxSize(_))
        ));
    }

    #[test]
    fn new_partitions_are_assigned_on_the_next_heartbeat() {
        let mut g = ShareGroup::new(GroupConfig::default());
        let a = g.heartbeat(&join("a", &["t", "missing"]), &two, 0).unwrap();
        assert_eq!(a.assignment.unwrap().len(), 2);
        let three = |t: &str| (t == "t").then_some(3);
        let a = g.heartbeat(&beat("a", a.member_epoch), &three, 1).unwrap();
        assert_eq!(a.assignment.unwrap().len(), 3);
    }
}
