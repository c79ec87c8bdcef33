//! The consumer-group coordinator.
//!
//! **Which core:** a group lives on the core that owns its partition of
//! `__consumer_offsets` ([`records::partition_for`], then
//! the metadata's placement). Group requests arriving on any core
//! and any listener are forwarded there over the mesh
//! ([`CoreMsg::Group`]) and answered back the same way; everything about a
//! group (members, target assignment, committed offsets, held heartbeats,
//! expiry) is touched only on that core.
//!
//! **Membership:** a member joins (gets an id), then heartbeats with the
//! partitions it owns and how long ago its application polled. The
//! coordinator computes the group's *target* assignment with the group's
//! assignor whenever membership, subscriptions or partition counts change
//! (each change of the target is a new generation), and answers each
//! heartbeat with the member's target minus the partitions another member
//! still reports owning or was last handed (answered): a partition moves
//! only after its previous owner heard of the change and released it, so
//! two members are never handed one partition, and only the member it was
//! handed to may commit it. Eager assignors
//! (`range`, `roundrobin`) additionally make members revoke everything on
//! a new generation (client side); `cooperative-sticky` revokes only what
//! moves. A heartbeat whose answer would not change anything is held
//! until the assignment changes (or `wait_ms`, at most half the session
//! timeout), so a rebalance propagates without polling delays.
//!
//! **Expiry:** a member without a heartbeat for its session timeout, or
//! reporting more than `max_poll_interval_ms` since its last poll, is
//! removed; its partitions are reassigned.
//!
//! **Durability:** committed offsets and group metadata are records in the
//! group's `__consumer_offsets` partition (keys and values in
//! [`group_records`]); a commit is answered once its records are durable
//! (`acks=all`). On start-up each core replays its partitions (latest
//! record per key wins, tombstones delete). Members are not stored: after
//! a restart they rejoin (their old ids are unknown).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_channel::oneshot;
use weir_proto::messages::*;

use crate::groups::assignor::{Assignment, Assignor, Tp};
// The coordinator answers in native group messages until it gets its own
// protocol-neutral model (issue "Consumer groups that hold under faults").
use crate::groups::records::{
    self as records, GroupValue, OffsetValue, RecordKey, GROUP_ID_BYTES_MAX, OFFSETS_TOPIC,
    OFFSET_METADATA_BYTES_MAX,
};
use crate::groups::store;
use crate::listener::native::wire_error;
use crate::service::BrokerError;
use crate::shard::mesh::CoreMsg;
use crate::shard::partition;
use crate::shard::Core;
use weir_proto::error_code::ErrorCode;

/// Shortest session timeout a member may ask for.
pub const SESSION_TIMEOUT_MS_MIN: u32 = 100;
/// Longest session timeout a member may ask for.
pub const SESSION_TIMEOUT_MS_MAX: u32 = 30 * 60 * 1000;
/// Longest time a heartbeat is held, and the heartbeat interval answered.
pub const HEARTBEAT_INTERVAL_MS_MAX: u32 = 3000;
/// How often a core checks its groups for expired members and changed
/// partition counts.
pub const EXPIRY_CHECK_MS: u64 = 100;
/// Most members of one group.
pub const GROUP_MEMBERS_MAX: usize = 10_000;
/// Most topics one member may subscribe to.
pub const MEMBER_TOPICS_MAX: usize = 10_000;
/// Most offsets in one commit.
pub const COMMIT_OFFSETS_MAX: usize = 10_000;

const _: () = assert!(SESSION_TIMEOUT_MS_MIN < SESSION_TIMEOUT_MS_MAX);
const _: () = assert!(EXPIRY_CHECK_MS < SESSION_TIMEOUT_MS_MIN as u64 * 2);

/// A group request, forwarded to the coordinator's core.
#[derive(Debug)]
pub enum GroupRequest {
    /// JoinGroup.
    Join(JoinGroupRequest),
    /// Heartbeat.
    Heartbeat(HeartbeatRequest),
    /// LeaveGroup.
    Leave(LeaveGroupRequest),
    /// OffsetCommit.
    Commit(OffsetCommitRequest),
    /// OffsetFetch.
    Fetch(OffsetFetchRequest),
    /// DescribeGroup.
    Describe(DescribeGroupRequest),
    /// DeleteGroup.
    Delete(DeleteGroupRequest),
    /// The groups of one core (ListGroups asks every core).
    List,
}

impl GroupRequest {
    fn group(&self) -> &str {
        match self {
            GroupRequest::Join(r) => &r.group,
            GroupRequest::Heartbeat(r) => &r.group,
            GroupRequest::Leave(r) => &r.group,
            GroupRequest::Commit(r) => &r.group,
            GroupRequest::Fetch(r) => &r.group,
            GroupRequest::Describe(r) => &r.group,
            GroupRequest::Delete(r) => &r.group,
            GroupRequest::List => "",
        }
    }
}

/// The coordinator's answer.
#[derive(Debug)]
pub enum GroupResponse {
    /// To Join and Heartbeat.
    Assignment(GroupAssignment),
    /// To Leave and Delete.
    Result(GroupResult),
    /// To OffsetCommit.
    Commit(OffsetCommitResponse),
    /// To OffsetFetch.
    Fetch(OffsetFetchResponse),
    /// To DescribeGroup.
    Describe(DescribeGroupResponse),
    /// To List.
    List(Vec<GroupListing>),
}

/// The error of a request, before it is put in the answer's shape.
struct Refusal(u16, String);

impl GroupResponse {
    /// The same refusal with another error.
    fn with_error(self, e: Refusal) -> GroupResponse {
        let (error, message) = (e.0, Some(e.1));
        match self {
            GroupResponse::Assignment(a) => GroupResponse::Assignment(GroupAssignment {
                error,
                message,
                ..a
            }),
            GroupResponse::Result(_) => GroupResponse::Result(GroupResult { error, message }),
            GroupResponse::Commit(c) => GroupResponse::Commit(OffsetCommitResponse {
                error,
                message,
                ..c
            }),
            GroupResponse::Fetch(f) => GroupResponse::Fetch(OffsetFetchResponse {
                error,
                message,
                ..f
            }),
            GroupResponse::Describe(d) => GroupResponse::Describe(DescribeGroupResponse {
                error,
                message,
                ..d
            }),
            GroupResponse::List(l) => GroupResponse::List(l),
        }
    }

    fn refused(req: &GroupRequest, e: Refusal) -> GroupResponse {
        let (error, message) = (e.0, Some(e.1));
        match req {
            GroupRequest::Join(_) | GroupRequest::Heartbeat(_) => {
                GroupResponse::Assignment(GroupAssignment {
                    error,
                    message,
                    ..Default::default()
                })
            }
            GroupRequest::Leave(_) | GroupRequest::Delete(_) => {
                GroupResponse::Result(GroupResult { error, message })
            }
            GroupRequest::Commit(_) => GroupResponse::Commit(OffsetCommitResponse {
                error,
                message,
                partitions: Vec::new(),
            }),
            GroupRequest::Fetch(_) => GroupResponse::Fetch(OffsetFetchResponse {
                error,
                message,
                offsets: Vec::new(),
            }),
            GroupRequest::Describe(r) => GroupResponse::Describe(DescribeGroupResponse {
                error,
                message,
                group: r.group.clone(),
                ..Default::default()
            }),
            GroupRequest::List => GroupResponse::List(Vec::new()),
        }
    }
}

/// One member.
struct Member {
    client_id: String,
    topics: BTreeSet<String>,
    session_timeout: Duration,
    max_poll_interval_ms: u32,
    last_heartbeat: Instant,
    /// The generation at which it joined: commits from older ones are
    /// refused.
    joined_generation: i32,
    /// What it reported owning in its last heartbeat (the client's word).
    owned: BTreeSet<Tp>,
    /// What the coordinator last answered it may own (the server's word):
    /// no other member is handed a partition while it is here or in
    /// `owned`, so handed sets never overlap.
    handed: BTreeSet<Tp>,
    /// Ends its held heartbeat.
    waiter: Option<oneshot::Sender<()>>,
}

/// One group, on its coordinator's core.
#[derive(Default)]
struct Group {
    generation: i32,
    assignor: String,
    members: BTreeMap<String, Member>,
    target: Assignment,
    /// Partition counts of the subscribed topics the target was computed
    /// with.
    counts: BTreeMap<String, u32>,
    offsets: BTreeMap<Tp, OffsetValue>,
    /// When the group last lost its last member (ms since the epoch), or
    /// was loaded without members; `None` while it has members.
    empty_since_ms: Option<i64>,
    /// Its removal (retention) is in progress.
    expiring: bool,
}

impl Group {
    fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self
            .members
            .iter()
            .all(|(id, m)| self.target.get(id).is_some_and(|t| *t == m.owned))
        {
            "Stable"
        } else {
            "Reconciling"
        }
    }

    /// What `member` may own now: its target minus what any other member
    /// owns or was handed and has not yet been told to give up — a
    /// partition handed to one member and not yet reported owned by it
    /// is not handed to another (the interleaving of
    /// `a_partition_handed_out_but_not_yet_reported_is_not_handed_out_again`).
    fn allowed(&self, member: &str) -> BTreeSet<Tp> {
        let Some(t) = self.target.get(member) else {
            return BTreeSet::new();
        };
        t.iter()
            .filter(|tp| {
                !self.members.iter().any(|(id, m)| {
                    id != member && (m.owned.contains(*tp) || m.handed.contains(*tp))
                })
            })
            .cloned()
            .collect()
    }

    /// Whether `member` may commit `tp`: handed to it (or owned by it,
    /// while it gives the partition up), and handed to no other member.
    fn may_commit(&self, member: &str, tp: &Tp) -> bool {
        let Some(m) = self.members.get(member) else {
            return false;
        };
        (m.handed.contains(tp) || m.owned.contains(tp))
            && !self
                .members
                .iter()
                .any(|(id, o)| id != member && o.handed.contains(tp))
    }

    fn wake_all(&mut self) {
        for m in self.members.values_mut() {
            if let Some(tx) = m.waiter.take() {
                let _ = tx.send(());
            }
        }
    }

    /// The answer to `member` (recorded as what it was handed).
    fn answer(&mut self, member: &str) -> GroupAssignment {
        let allowed = self.allowed(member);
        let assignment = to_wire(&allowed);
        if let Some(m) = self.members.get_mut(member) {
            m.handed = allowed;
        }
        GroupAssignment {
            error: 0,
            message: None,
            member_id: member.to_string(),
            generation: self.generation,
            assignor: self.assignor.clone(),
            assignment,
            heartbeat_interval_ms: self.members.get(member).map_or(0, |m| {
                (m.session_timeout.as_millis() as u32 / 3).clamp(1, HEARTBEAT_INTERVAL_MS_MAX)
            }),
        }
    }
}

/// The groups one core coordinates.
#[derive(Default)]
pub struct Groups {
    groups: RefCell<HashMap<String, Group>>,
    next_member: Cell<u64>,
    /// Set once this core replayed its `__consumer_offsets` partitions;
    /// until then group requests are answered `Recovering` (retriable).
    loaded: Cell<bool>,
    /// Log end offsets learnt from partition owners, for commit checks.
    log_ends: RefCell<HashMap<Tp, u64>>,
    /// One commit at a time per group (only groups with a commit in
    /// progress have an entry).
    commit_locks: RefCell<HashMap<String, Rc<glommio::sync::Semaphore>>>,
}

impl Groups {
    /// Replays a committed offset (`None`: a tombstone).
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

    /// Replays a group's metadata (`None`: the group was deleted).
    pub(crate) fn replay_group(&self, group: String, value: Option<GroupValue>) {
        let mut groups = self.groups.borrow_mut();
        match value {
            Some(v) => {
                let g = groups.entry(group).or_default();
                g.generation = g.generation.max(v.generation);
                g.assignor = v.assignor;
            }
            None => {
                groups.remove(&group);
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

    /// The commit lock of a group.
    fn commit_lock(&self, group: &str) -> Rc<glommio::sync::Semaphore> {
        self.commit_locks
            .borrow_mut()
            .entry(group.to_string())
            .or_insert_with(|| Rc::new(glommio::sync::Semaphore::new(1)))
            .clone()
    }

    /// Forgets a group's commit lock once no commit holds or waits for it.
    fn release_commit_lock(&self, lock: &Rc<glommio::sync::Semaphore>) {
        // Held here by the map, the caller, and any waiting commit.
        if Rc::strong_count(lock) <= 2 {
            self.commit_locks
                .borrow_mut()
                .retain(|_, l| !Rc::ptr_eq(l, lock));
        }
    }

    /// The groups are loaded: requests are served from now on.
    pub(crate) fn set_loaded(&self) {
        self.loaded.set(true);
    }
}

fn to_wire(set: &BTreeSet<Tp>) -> Vec<TopicPartitions> {
    TopicPartitions::group(set)
}

fn from_wire(list: &[TopicPartitions]) -> BTreeSet<Tp> {
    TopicPartitions::pairs(list).collect()
}

/// The core that coordinates `group`, or why there is none.
fn coordinator_of(core: &Core, group: &str) -> Result<usize, Refusal> {
    if group.is_empty() || group.len() > GROUP_ID_BYTES_MAX {
        return Err(Refusal(
            ErrorCode::InvalidGroupId.as_u16(),
            format!("group id must be 1 to {GROUP_ID_BYTES_MAX} bytes"),
        ));
    }
    let n = core
        .metadata()
        .get(OFFSETS_TOPIC)
        .map(|t| t.partitions())
        .ok_or_else(|| {
            Refusal(
                ErrorCode::StorageError.as_u16(),
                format!("the internal topic {OFFSETS_TOPIC} does not exist"),
            )
        })?;
    let p = records::partition_for(group, n);
    core.owner(OFFSETS_TOPIC, p).ok_or_else(|| {
        Refusal(
            ErrorCode::StorageError.as_u16(),
            format!("{OFFSETS_TOPIC}-{p} has no owner core"),
        )
    })
}

/// Serves a group request from a connection on this core: forwards it to
/// the coordinator's core (or every core, for a listing) and waits for the
/// answer there.
pub async fn serve(core: &Rc<Core>, req: GroupRequest) -> GroupResponse {
    if matches!(req, GroupRequest::List) {
        let mut all = Vec::new();
        for c in 0..core.cores() {
            if let GroupResponse::List(l) = on_core(core, c, GroupRequest::List).await {
                all.extend(l);
            }
        }
        all.sort_by(|a, b| a.group.cmp(&b.group));
        return GroupResponse::List(all);
    }
    match coordinator_of(core, req.group()) {
        Ok(c) => on_core(core, c, req).await,
        Err(e) => GroupResponse::refused(&req, e),
    }
}

async fn on_core(core: &Rc<Core>, c: usize, req: GroupRequest) -> GroupResponse {
    if c == core.id {
        return handle(core, req).await;
    }
    let kind = |e: BrokerError| Refusal(ErrorCode::StorageError.as_u16(), e.to_string());
    // A heartbeat may be held up to its `wait_ms` (the coordinator holds
    // it at most half the session timeout): the mesh deadline comes on top.
    let held = match &req {
        GroupRequest::Heartbeat(h) => Duration::from_millis(u64::from(h.wait_ms)),
        _ => Duration::ZERO,
    };
    let refusal = GroupResponse::refused(&req, Refusal(0, String::new()));
    match core
        .call(c, held, |reply| CoreMsg::Group {
            request: req,
            reply,
        })
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(core = c, error = %e, "group request not answered");
            refusal.with_error(kind(e))
        }
    }
}

/// Handles a group request on the coordinator's core.
pub async fn handle(core: &Rc<Core>, req: GroupRequest) -> GroupResponse {
    if !core.groups.loaded.get() {
        let e = Refusal(
            ErrorCode::Recovering.as_u16(),
            format!(
                "core {} is still loading its consumer groups from {OFFSETS_TOPIC}: retry",
                core.id
            ),
        );
        return GroupResponse::refused(&req, e);
    }
    let r = match &req {
        GroupRequest::Join(r) => join(core, r).map(GroupResponse::Assignment),
        GroupRequest::Heartbeat(r) => heartbeat(core, r).await.map(GroupResponse::Assignment),
        GroupRequest::Leave(r) => leave(core, r).map(GroupResponse::Result),
        GroupRequest::Commit(r) => commit(core, r).await.map(GroupResponse::Commit),
        GroupRequest::Fetch(r) => Ok(GroupResponse::Fetch(fetch_offsets(core, r))),
        GroupRequest::Describe(r) => describe(core, r).map(GroupResponse::Describe),
        GroupRequest::Delete(r) => delete(core, r).await.map(GroupResponse::Result),
        GroupRequest::List => Ok(GroupResponse::List(list(core))),
    };
    r.unwrap_or_else(|e| GroupResponse::refused(&req, e))
}

fn unknown_member(group: &str, member: &str) -> Refusal {
    Refusal(
        ErrorCode::UnknownMemberId.as_u16(),
        format!(
            "group `{group}` has no member `{member}` (it left, was expelled after its session \
             or poll timeout, or the broker restarted): rejoin"
        ),
    )
}

/// Recomputes the target assignment; a changed target is a new generation
/// (stored). Wakes every held heartbeat.
fn rebalance(core: &Rc<Core>, name: &str, g: &mut Group) {
    let subscriptions: BTreeMap<String, BTreeSet<String>> = g
        .members
        .iter()
        .map(|(id, m)| (id.clone(), m.topics.clone()))
        .collect();
    let counts = subscribed_counts(core, g);
    let assignor = Assignor::parse(&g.assignor).unwrap_or(Assignor::Range);
    let target = assignor.assign(&subscriptions, &counts, &g.target);
    g.counts = counts;
    if target != g.target {
        g.target = target;
        g.generation = g.generation.wrapping_add(1).max(1);
        let value = GroupValue {
            generation: g.generation,
            assignor: g.assignor.clone(),
        };
        let (core, name) = (core.clone(), name.to_string());
        glommio::spawn_local(async move {
            let key = RecordKey::Group {
                group: name.clone(),
            };
            if let Err(e) =
                store::write_records(&core, &name, vec![(key, Some(value.encode()))]).await
            {
                tracing::warn!(group = %name, error = %e, "storing the group's generation failed");
            }
        })
        .detach();
    }
    g.wake_all();
}

fn subscribed_counts(core: &Core, g: &Group) -> BTreeMap<String, u32> {
    let view = core.metadata();
    g.members
        .values()
        .flat_map(|m| m.topics.iter())
        .filter_map(|t| view.get(t).map(|s| (t.clone(), s.partitions())))
        .collect()
}

fn join(core: &Rc<Core>, r: &JoinGroupRequest) -> Result<GroupAssignment, Refusal> {
    if Assignor::parse(&r.assignor).is_none() {
        return Err(Refusal(
            ErrorCode::InconsistentAssignor.as_u16(),
            format!(
                "unknown assignor `{}`: use range, roundrobin or cooperative-sticky",
                r.assignor
            ),
        ));
    }
    let range = SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX;
    if !range.contains(&r.session_timeout_ms) || !range.contains(&r.max_poll_interval_ms) {
        return Err(Refusal(
            ErrorCode::InvalidSessionTimeout.as_u16(),
            format!(
                "session_timeout_ms {} and max_poll_interval_ms {} must be within \
                 {SESSION_TIMEOUT_MS_MIN}..={SESSION_TIMEOUT_MS_MAX}",
                r.session_timeout_ms, r.max_poll_interval_ms
            ),
        ));
    }
    if r.topics.is_empty() || r.topics.len() > MEMBER_TOPICS_MAX {
        return Err(Refusal(
            ErrorCode::InvalidRequest.as_u16(),
            format!("a member must subscribe to 1 to {MEMBER_TOPICS_MAX} topics"),
        ));
    }
    let mut groups = core.groups.groups.borrow_mut();
    if !r.member_id.is_empty() && !groups.contains_key(&r.group) {
        // A rejoin with an id the group does not know: refused without
        // leaving an empty group behind.
        return Err(unknown_member(&r.group, &r.member_id));
    }
    let g = groups.entry(r.group.clone()).or_default();
    if !g.members.is_empty() && g.assignor != r.assignor {
        return Err(Refusal(
            ErrorCode::InconsistentAssignor.as_u16(),
            format!(
                "group `{}` uses the assignor `{}`, not `{}`",
                r.group, g.assignor, r.assignor
            ),
        ));
    }
    let id = if r.member_id.is_empty() {
        if g.members.len() >= GROUP_MEMBERS_MAX {
            return Err(Refusal(
                ErrorCode::PolicyViolation.as_u16(),
                format!("group `{}` has {GROUP_MEMBERS_MAX} members", r.group),
            ));
        }
        let n = core.groups.next_member.get();
        core.groups.next_member.set(n + 1);
        let client = if r.client_id.is_empty() {
            "member"
        } else {
            r.client_id.as_str()
        };
        format!("{client}-{}-{n}-{:x}", core.id, core.storage.now_ms())
    } else if g.members.contains_key(&r.member_id) {
        r.member_id.clone()
    } else {
        return Err(unknown_member(&r.group, &r.member_id));
    };
    let joined = g.generation;
    let m = g.members.entry(id.clone()).or_insert_with(|| Member {
        client_id: r.client_id.clone(),
        topics: BTreeSet::new(),
        session_timeout: Duration::ZERO,
        max_poll_interval_ms: 0,
        last_heartbeat: Instant::now(),
        joined_generation: joined,
        owned: BTreeSet::new(),
        handed: BTreeSet::new(),
        waiter: None,
    });
    m.topics = r.topics.iter().cloned().collect();
    m.session_timeout = Duration::from_millis(r.session_timeout_ms.into());
    m.max_poll_interval_ms = r.max_poll_interval_ms;
    m.last_heartbeat = Instant::now();
    g.assignor = r.assignor.clone();
    rebalance(core, &r.group, g);
    Ok(g.answer(&id))
}

async fn heartbeat(core: &Rc<Core>, r: &HeartbeatRequest) -> Result<GroupAssignment, Refusal> {
    let owned = from_wire(&r.owned);
    let hold = {
        let mut groups = core.groups.groups.borrow_mut();
        let g = groups
            .get_mut(&r.group)
            .ok_or_else(|| unknown_member(&r.group, &r.member_id))?;
        let m = g
            .members
            .get_mut(&r.member_id)
            .ok_or_else(|| unknown_member(&r.group, &r.member_id))?;
        if r.since_poll_ms > m.max_poll_interval_ms {
            let limit = m.max_poll_interval_ms;
            g.members.remove(&r.member_id);
            rebalance(core, &r.group, g);
            return Err(Refusal(
                ErrorCode::UnknownMemberId.as_u16(),
                format!(
                    "member `{}` expelled from group `{}`: its application did not poll for \
                     {} ms (max_poll_interval_ms {limit}); rejoin",
                    r.member_id, r.group, r.since_poll_ms
                ),
            ));
        }
        m.last_heartbeat = Instant::now();
        // A newer heartbeat ends the member's held one.
        if let Some(tx) = m.waiter.take() {
            let _ = tx.send(());
        }
        let hold = Duration::from_millis(r.wait_ms.into()).min(m.session_timeout / 2);
        if m.owned != owned {
            m.owned = owned.clone();
            // Released partitions may now go to their new owners.
            g.wake_all();
        }
        hold
    };
    let deadline = Instant::now() + hold;
    loop {
        let rx = {
            let mut groups = core.groups.groups.borrow_mut();
            let Some(g) = groups.get_mut(&r.group) else {
                return Err(unknown_member(&r.group, &r.member_id));
            };
            if !g.members.contains_key(&r.member_id) {
                return Err(unknown_member(&r.group, &r.member_id));
            }
            let answer = g.answer(&r.member_id);
            let unchanged = answer.generation == r.generation
                && from_wire(&answer.assignment) == owned
                && Instant::now() < deadline
                && !core.shared.stopping();
            if !unchanged {
                return Ok(answer);
            }
            let (tx, rx) = oneshot::channel();
            if let Some(m) = g.members.get_mut(&r.member_id) {
                m.waiter = Some(tx);
            }
            rx
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let superseded = futures_lite::future::or(
            // Woken (`Ok`), or our waiter was replaced by a newer
            // heartbeat of the same member (`Err`: the sender dropped).
            async { rx.await.is_err() },
            async {
                // Wake up for shutdown too.
                let end = Instant::now() + left;
                while Instant::now() < end && !core.shared.stopping() {
                    let step = end.saturating_duration_since(Instant::now());
                    glommio::timer::sleep(step.min(Duration::from_millis(50))).await;
                }
                false
            },
        )
        .await;
        if superseded {
            // A newer heartbeat of this member is held now: answer this
            // one at once. (Re-registering would replace that one's
            // waiter in turn, and the two would wake each other in a busy
            // loop that kept the core at 100 % until a hold ran out.)
            let mut groups = core.groups.groups.borrow_mut();
            let Some(g) = groups.get_mut(&r.group) else {
                return Err(unknown_member(&r.group, &r.member_id));
            };
            if !g.members.contains_key(&r.member_id) {
                return Err(unknown_member(&r.group, &r.member_id));
            }
            return Ok(g.answer(&r.member_id));
        }
    }
}

fn leave(core: &Rc<Core>, r: &LeaveGroupRequest) -> Result<GroupResult, Refusal> {
    let mut groups = core.groups.groups.borrow_mut();
    let g = groups
        .get_mut(&r.group)
        .ok_or_else(|| unknown_member(&r.group, &r.member_id))?;
    if g.members.remove(&r.member_id).is_none() {
        return Err(unknown_member(&r.group, &r.member_id));
    }
    rebalance(core, &r.group, g);
    Ok(GroupResult::default())
}

/// Log end offsets of partitions, asking each owner core once.
async fn log_ends(core: &Rc<Core>, tps: &[Tp]) -> Vec<Result<u64, BrokerError>> {
    let mut by_core: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut out: Vec<Result<u64, BrokerError>> = Vec::with_capacity(tps.len());
    for (i, (t, p)) in tps.iter().enumerate() {
        match core.owner(t, *p) {
            Some(c) => {
                by_core.entry(c).or_default().push(i);
                out.push(Ok(0));
            }
            None => out.push(Err(BrokerError::unknown(t, *p))),
        }
    }
    let tasks: Vec<_> = by_core
        .into_iter()
        .map(|(c, idx)| {
            let core = core.clone();
            let parts: Vec<Tp> = idx.iter().map(|&i| tps[i].clone()).collect();
            glommio::spawn_local(async move {
                let ends = if c == core.id {
                    partition::log_ends_local(&core, &parts)
                } else {
                    let n = parts.len();
                    core.call(c, Duration::ZERO, |reply| CoreMsg::LogEnds {
                        partitions: parts,
                        reply,
                    })
                    .await
                    .unwrap_or_else(|e| (0..n).map(|_| Err(e.clone())).collect())
                };
                (idx, ends)
            })
        })
        .collect();
    for t in tasks {
        let (idx, ends) = t.await;
        for (i, e) in idx.into_iter().zip(ends) {
            out[i] = e;
        }
    }
    out
}

/// Log end offsets for a commit: a partition whose cached log end is
/// already at or past the offset needs no question to its owner (a log end
/// never decreases while the topic exists; deleting a topic forgets its
/// entries); the others are asked ([`log_ends`]) and cached.
async fn checked_log_ends(
    core: &Rc<Core>,
    offsets: &[CommitOffset],
    tps: &[Tp],
) -> Vec<Result<u64, BrokerError>> {
    let mut out: Vec<Option<Result<u64, BrokerError>>> = {
        let cache = core.groups.log_ends.borrow();
        offsets
            .iter()
            .zip(tps)
            .map(|(o, tp)| {
                cache
                    .get(tp)
                    .filter(|&&end| o.offset <= end)
                    .map(|&e| Ok(e))
            })
            .collect()
    };
    let ask: Vec<Tp> = tps
        .iter()
        .zip(&out)
        .filter(|(_, known)| known.is_none())
        .map(|(tp, _)| tp.clone())
        .collect();
    if !ask.is_empty() {
        let answers = log_ends(core, &ask).await;
        let mut cache = core.groups.log_ends.borrow_mut();
        let mut answers = ask.into_iter().zip(answers);
        for slot in out.iter_mut().filter(|s| s.is_none()) {
            let (tp, end) = answers.next().expect("one answer per question");
            if let Ok(e) = &end {
                let known = cache.entry(tp).or_insert(*e);
                *known = (*known).max(*e);
            }
            *slot = Some(end);
        }
    }
    out.into_iter()
        .map(|e| e.expect("every partition answered"))
        .collect()
}

async fn commit(core: &Rc<Core>, r: &OffsetCommitRequest) -> Result<OffsetCommitResponse, Refusal> {
    if r.offsets.len() > COMMIT_OFFSETS_MAX {
        return Err(Refusal(
            ErrorCode::InvalidRequest.as_u16(),
            format!(
                "a commit of {} offsets; at most {COMMIT_OFFSETS_MAX}",
                r.offsets.len()
            ),
        ));
    }
    // One commit of a group at a time, from its checks to its append: no
    // check is stale when the record lands, and records land in the order
    // they were checked.
    let lock = core.groups.commit_lock(&r.group);
    let _serial = lock
        .acquire_permit(1)
        .await
        .map_err(|e| Refusal(ErrorCode::StorageError.as_u16(), e.to_string()))?;
    let r = commit_checked(core, r).await;
    core.groups.release_commit_lock(&lock);
    r
}

/// The member's right to commit, checked now (before and again after the
/// log-end lookup, which waits).
fn check_member(
    core: &Core,
    r: &OffsetCommitRequest,
    tps: &[Tp],
    errors: &mut [Option<(u16, String)>],
) -> Result<(), Refusal> {
    let groups = core.groups.groups.borrow();
    let g = groups.get(&r.group);
    if r.member_id.is_empty() && r.generation < 0 {
        // An admin commit (e.g. `weir group reset`): only without
        // active members.
        if let Some(g) = g.filter(|g| !g.members.is_empty()) {
            return Err(Refusal(
                ErrorCode::GroupNotEmpty.as_u16(),
                format!(
                    "group `{}` has {} active members: stop them before changing its offsets",
                    r.group,
                    g.members.len()
                ),
            ));
        }
        return Ok(());
    }
    let g = g.ok_or_else(|| unknown_member(&r.group, &r.member_id))?;
    let m = g
        .members
        .get(&r.member_id)
        .ok_or_else(|| unknown_member(&r.group, &r.member_id))?;
    if r.generation > g.generation || r.generation < m.joined_generation {
        return Err(Refusal(
            ErrorCode::IllegalGeneration.as_u16(),
            format!(
                "generation {} of member `{}` is not current (group `{}` is at \
                 generation {}; the member joined at {})",
                r.generation, r.member_id, r.group, g.generation, m.joined_generation
            ),
        ));
    }
    for (i, tp) in tps.iter().enumerate() {
        if !g.may_commit(&r.member_id, tp) {
            errors[i].get_or_insert((
                ErrorCode::IllegalGeneration.as_u16(),
                format!(
                    "{}-{} is not assigned to member `{}` in generation {}",
                    tp.0, tp.1, r.member_id, g.generation
                ),
            ));
        }
    }
    Ok(())
}

async fn commit_checked(
    core: &Rc<Core>,
    r: &OffsetCommitRequest,
) -> Result<OffsetCommitResponse, Refusal> {
    let tps: Vec<Tp> = r
        .offsets
        .iter()
        .map(|o| (o.topic.clone(), o.partition))
        .collect();
    // Per offset: an error, or None if it may be written.
    let mut errors: Vec<Option<(u16, String)>> = vec![None; tps.len()];
    check_member(core, r, &tps, &mut errors)?;
    for (i, o) in r.offsets.iter().enumerate() {
        if o.metadata
            .as_ref()
            .is_some_and(|m| m.len() > OFFSET_METADATA_BYTES_MAX)
        {
            errors[i].get_or_insert((
                ErrorCode::InvalidRequest.as_u16(),
                format!("metadata is over {OFFSET_METADATA_BYTES_MAX} bytes"),
            ));
        }
    }
    let ends = checked_log_ends(core, &r.offsets, &tps).await;
    // The lookup waited: the member may have been fenced or lost a
    // partition meanwhile.
    check_member(core, r, &tps, &mut errors)?;
    let ts = core.storage.now_ms();
    let mut records = Vec::new();
    let mut accepted = Vec::new();
    for (i, (o, end)) in r.offsets.iter().zip(ends).enumerate() {
        if errors[i].is_some() {
            continue;
        }
        match end {
            Err(e) => errors[i] = Some(wire_error(&e)),
            Ok(end) if o.offset > end => {
                errors[i] = Some((
                    ErrorCode::OffsetOutOfRange.as_u16(),
                    format!(
                        "offset {} of {}-{} is beyond the log end offset {end}",
                        o.offset, o.topic, o.partition
                    ),
                ))
            }
            Ok(_) => {
                let value = OffsetValue {
                    offset: o.offset,
                    commit_timestamp: ts,
                    metadata: o.metadata.clone(),
                };
                let key = RecordKey::Offset {
                    group: r.group.clone(),
                    topic: o.topic.clone(),
                    partition: o.partition,
                };
                records.push((key, Some(value.encode())));
                accepted.push((i, value));
            }
        }
    }
    if !records.is_empty() {
        match store::write_records(core, &r.group, records).await {
            Ok(()) => {
                let mut groups = core.groups.groups.borrow_mut();
                let g = groups.entry(r.group.clone()).or_default();
                for (i, v) in accepted {
                    g.offsets.insert(tps[i].clone(), v);
                }
            }
            Err(e) => {
                for (i, _) in accepted {
                    errors[i] = Some(wire_error(&e));
                }
            }
        }
    }
    let partitions = r
        .offsets
        .iter()
        .zip(errors)
        .map(|(o, e)| CommitResult {
            topic: o.topic.clone(),
            partition: o.partition,
            error: e.as_ref().map_or(0, |e| e.0),
            message: e.map(|e| e.1),
        })
        .collect();
    Ok(OffsetCommitResponse {
        error: 0,
        message: None,
        partitions,
    })
}

fn committed(g: &Group, filter: Option<&BTreeSet<Tp>>) -> Vec<CommittedOffset> {
    g.offsets
        .iter()
        .filter(|(tp, _)| filter.is_none_or(|f| f.contains(*tp)))
        .map(|((t, p), v)| CommittedOffset {
            topic: t.clone(),
            partition: *p,
            offset: v.offset,
            metadata: v.metadata.clone(),
            commit_timestamp: v.commit_timestamp,
        })
        .collect()
}

fn fetch_offsets(core: &Core, r: &OffsetFetchRequest) -> OffsetFetchResponse {
    let groups = core.groups.groups.borrow();
    let filter = r.partitions.as_deref().map(from_wire);
    OffsetFetchResponse {
        error: 0,
        message: None,
        offsets: groups
            .get(&r.group)
            .map(|g| committed(g, filter.as_ref()))
            .unwrap_or_default(),
    }
}

fn describe(core: &Core, r: &DescribeGroupRequest) -> Result<DescribeGroupResponse, Refusal> {
    let groups = core.groups.groups.borrow();
    let g = groups.get(&r.group).ok_or_else(|| not_found(&r.group))?;
    Ok(DescribeGroupResponse {
        error: 0,
        message: None,
        group: r.group.clone(),
        state: g.state().into(),
        generation: g.generation,
        assignor: g.assignor.clone(),
        coordinator_core: core.id as u32,
        members: g
            .members
            .iter()
            .map(|(id, m)| MemberDescription {
                member_id: id.clone(),
                client_id: m.client_id.clone(),
                topics: m.topics.iter().cloned().collect(),
                assignment: to_wire(&g.target.get(id).cloned().unwrap_or_default()),
                owned: to_wire(&m.owned),
            })
            .collect(),
        offsets: committed(g, None),
    })
}

fn not_found(group: &str) -> Refusal {
    Refusal(
        ErrorCode::GroupIdNotFound.as_u16(),
        format!("no group `{group}` (no members, commits or metadata)"),
    )
}

async fn delete(core: &Rc<Core>, r: &DeleteGroupRequest) -> Result<GroupResult, Refusal> {
    let keys: Vec<(RecordKey, Option<Bytes>)> = {
        let groups = core.groups.groups.borrow();
        let g = groups.get(&r.group).ok_or_else(|| not_found(&r.group))?;
        if !g.members.is_empty() {
            return Err(Refusal(
                ErrorCode::GroupNotEmpty.as_u16(),
                format!(
                    "group `{}` has {} active members: stop them first",
                    r.group,
                    g.members.len()
                ),
            ));
        }
        let mut keys: Vec<_> = g
            .offsets
            .keys()
            .map(|(t, p)| {
                (
                    RecordKey::Offset {
                        group: r.group.clone(),
                        topic: t.clone(),
                        partition: *p,
                    },
                    None,
                )
            })
            .collect();
        keys.push((
            RecordKey::Group {
                group: r.group.clone(),
            },
            None,
        ));
        keys
    };
    store::write_records(core, &r.group, keys)
        .await
        .map_err(|e| {
            let (code, message) = wire_error(&e);
            Refusal(code, message)
        })?;
    let mut groups = core.groups.groups.borrow_mut();
    if groups.get(&r.group).is_some_and(|g| g.members.is_empty()) {
        groups.remove(&r.group);
    }
    Ok(GroupResult::default())
}

fn list(core: &Core) -> Vec<GroupListing> {
    core.groups
        .groups
        .borrow()
        .iter()
        .map(|(name, g)| GroupListing {
            group: name.clone(),
            state: g.state().into(),
            members: g.members.len() as u32,
            assignor: g.assignor.clone(),
        })
        .collect()
}

/// Expels members whose session expired and reassigns when a subscribed
/// topic's partition count changed, every [`EXPIRY_CHECK_MS`], until the
/// broker stops.
pub async fn expiry_loop(core: Rc<Core>) {
    while !core.shared.stopping() {
        glommio::timer::sleep(Duration::from_millis(EXPIRY_CHECK_MS)).await;
        let now = Instant::now();
        let mut groups = core.groups.groups.borrow_mut();
        for (name, g) in groups.iter_mut() {
            let before = g.members.len();
            g.members.retain(|id, m| {
                let alive = now.duration_since(m.last_heartbeat) <= m.session_timeout;
                if !alive {
                    tracing::info!(group = %name, member = %id, "member expelled: session timed out");
                }
                alive
            });
            if g.members.len() != before || subscribed_counts(&core, g) != g.counts {
                rebalance(&core, name, g);
            }
        }
        let expired = expired_groups(&core, &mut groups);
        drop(groups);
        for name in expired {
            let core = core.clone();
            glommio::spawn_local(async move {
                let r = DeleteGroupRequest { group: name.clone() };
                match delete(&core, &r).await {
                    Ok(_) => tracing::info!(group = %name, "empty group and its offsets expired (--offsets-retention-ms)"),
                    Err(e) => {
                        tracing::debug!(group = %name, error = %e.1, "group not expired");
                        if let Some(g) = core.groups.groups.borrow_mut().get_mut(&name) {
                            g.expiring = false;
                        }
                    }
                }
            })
            .detach();
        }
    }
}

/// The groups past their retention: no members, and neither a commit nor
/// a member for `offsets_retention_ms` (marked as expiring). A group that
/// just became empty starts its retention now.
fn expired_groups(core: &Core, groups: &mut HashMap<String, Group>) -> Vec<String> {
    let now = core.storage.now_ms();
    let retention = core.shared.config.offsets_retention_ms as i64;
    let mut out = Vec::new();
    for (name, g) in groups.iter_mut() {
        if !g.members.is_empty() {
            g.empty_since_ms = None;
            continue;
        }
        let since = *g.empty_since_ms.get_or_insert(now);
        let last_commit = g.offsets.values().map(|o| o.commit_timestamp).max();
        let last = last_commit.map_or(since, |c| c.max(since));
        if !g.expiring && now - last > retention {
            g.expiring = true;
            out.push(name.clone());
        }
    }
    out
}

/// Tombstones the committed offsets of deleted partitions in every group
/// this core coordinates (a topic deleted and created again starts
/// without them).
pub fn purge_deleted(core: &Rc<Core>, deleted: &[(String, u32)]) {
    if deleted.is_empty() {
        return;
    }
    let gone: BTreeSet<&Tp> = deleted.iter().collect();
    let mut work = Vec::new();
    for (name, g) in core.groups.groups.borrow_mut().iter_mut() {
        let tps: Vec<Tp> = g
            .offsets
            .keys()
            .filter(|tp| gone.contains(tp))
            .cloned()
            .collect();
        if tps.is_empty() {
            continue;
        }
        for tp in &tps {
            g.offsets.remove(tp);
        }
        work.push((name.clone(), tps));
    }
    for (group, tps) in work {
        let core = core.clone();
        glommio::spawn_local(async move {
            let keys = tps
                .into_iter()
                .map(|(topic, partition)| {
                    let key = RecordKey::Offset {
                        group: group.clone(),
                        topic,
                        partition,
                    };
                    (key, None)
                })
                .collect();
            if let Err(e) = store::write_records(&core, &group, keys).await {
                tracing::warn!(group = %group, error = %e, "purging offsets of a deleted topic failed");
            }
        })
        .detach();
    }
}
