//! The consumer-group coordinator: where a group lives, how requests
//! reach it, and how its state machine's decisions are stored before they
//! are answered.
//!
//! **Which core:** a group lives on the core that owns its partition of
//! `__consumer_offsets` (`coordinator::partition_of`, then the metadata's
//! placement). Group requests arriving on any core and any listener are
//! forwarded there over the mesh ([`CoreMsg::Group`]) and answered back
//! the same way; everything about a group (members, epochs, committed
//! offsets, held heartbeats, expiry) is touched only on that core.
//!
//! **Membership** is [`ConsumerGroup`](crate::groups::consumer::ConsumerGroup)'s (KIP-848 epochs; see
//! [`super::consumer`]): the native join is a heartbeat at epoch 0, the
//! native heartbeat carries the member epoch (in its `generation` field)
//! and the partitions the member owns; a heartbeat whose answer would not
//! change anything is held until the group changes (or `wait_ms`, at most
//! half the session timeout), so a rebalance propagates without polling
//! delays.
//!
//! **Serialization and durability:** every request that changes a group
//! (join, heartbeat, leave, commit, delete, the expiry check) runs under
//! the group's lock, from its checks to its records being fdatasync'd in
//! the group's `__consumer_offsets` partition (keys and values in
//! [`records`]); only then is it answered. On start-up each core replays
//! the durable part of its partitions (latest record per key wins,
//! tombstones delete): members come back with their epochs and
//! assignments and get a fresh session to heartbeat again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_channel::oneshot;
use weir_proto::messages::*;

pub(crate) use crate::groups::api::Refusal;
pub use crate::groups::api::{ClassicMemberBytes, GroupRequest, GroupResponse};
use crate::groups::assignor::Tp;

use crate::groups::classic_service;
pub use crate::groups::clock::mono_ms;
use crate::groups::consumer::{Answer, GroupError, Heartbeat, JOIN_EPOCH, LEAVE_EPOCH};
use crate::groups::limits::MEMBER_TOPICS_MAX;
use crate::groups::registry::Group;
pub use crate::groups::registry::Groups;
pub(crate) use crate::groups::store::persist;
// Requests and answers are the native protocol's group messages (plain
// structs); the Kafka listener maps its own onto them.
use crate::error::BrokerError;
use crate::groups::records::{
    OffsetValue, RecordKey, GROUP_ID_BYTES_MAX, OFFSETS_TOPIC, OFFSET_METADATA_BYTES_MAX,
};
use crate::groups::store;
use crate::shard::mesh::CoreMsg;
use crate::shard::partition;
use crate::shard::Core;
use weir_proto::error_code::ErrorCode;

/// How often a core checks its groups for expired members and changed
/// partition counts.
pub const EXPIRY_CHECK_MS: u64 = 100;
/// Most offsets in one commit.
pub const COMMIT_OFFSETS_MAX: usize = 10_000;

const _: () = assert!(EXPIRY_CHECK_MS < crate::groups::limits::SESSION_TIMEOUT_MS_MIN as u64 * 2);

fn to_wire(set: &BTreeSet<Tp>) -> Vec<TopicPartitions> {
    TopicPartitions::group(set)
}

fn from_wire(list: &[TopicPartitions]) -> BTreeSet<Tp> {
    TopicPartitions::pairs(list).collect()
}

/// `group`'s partition of the internal offsets topic, or why there is
/// none.
pub(crate) fn offsets_partition(core: &Core, group: &str) -> Result<u32, Refusal> {
    if group.is_empty() || group.len() > GROUP_ID_BYTES_MAX {
        return Err(Refusal(
            ErrorCode::InvalidGroupId.as_u16(),
            format!("group id must be 1 to {GROUP_ID_BYTES_MAX} bytes"),
        ));
    }
    crate::coordinator::partition_of(core, OFFSETS_TOPIC, group).ok_or_else(|| {
        Refusal(
            ErrorCode::StorageError.as_u16(),
            format!("the internal topic {OFFSETS_TOPIC} does not exist"),
        )
    })
}

/// The core of this node that coordinates `group`, or why there is none
/// (`NotCoordinator`: its offsets partition is another node's).
pub(crate) fn coordinator_of(core: &Core, group: &str) -> Result<usize, Refusal> {
    let p = offsets_partition(core, group)?;
    match core.locate(OFFSETS_TOPIC, p) {
        Ok(c) => Ok(c),
        Err(BrokerError::NotLeader { leader, .. }) => {
            Err(Refusal(
                ErrorCode::NotCoordinator.as_u16(),
                if leader == 0 {
                    format!("group {group}'s coordinator ({OFFSETS_TOPIC}-{p}) has no live node now: retry")
                } else {
                    format!(
                    "group {group} is coordinated by node {leader} ({OFFSETS_TOPIC}-{p}): ask there \
                     (FindCoordinator)"
                )
                },
            ))
        }
        Err(e) => Err(Refusal(ErrorCode::StorageError.as_u16(), e.to_string())),
    }
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
        all.sort_by(|a, b| a.0.group.cmp(&b.0.group));
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
        // A classic join waits for the join phase (up to the rebalance
        // timeout, after the initial delay), a sync for the leader's.
        GroupRequest::ClassicJoin { request, .. } => Duration::from_millis(
            u64::from(request.rebalance_timeout_ms)
                + core.shared.config.group_initial_rebalance_delay_ms,
        ),
        GroupRequest::ClassicSync { .. } => {
            Duration::from_millis(u64::from(crate::groups::limits::SESSION_TIMEOUT_MS_MAX))
        }
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
    let hosting = &core.groups.hosting;
    let ready = match offsets_partition(core, req.group()) {
        Ok(p) => hosting.ready(p),
        Err(_) => hosting.loaded(),
    };
    if !ready {
        let e = Refusal(
            ErrorCode::Recovering.as_u16(),
            format!(
                "core {} is still loading its consumer groups from {OFFSETS_TOPIC}: retry",
                core.id
            ),
        );
        return GroupResponse::refused(&req, e);
    }
    // A share group's id is not a consumer group's (Kafka answers
    // GROUP_ID_NOT_FOUND: "not a consumer group").
    let joins = matches!(
        req,
        GroupRequest::Join(_)
            | GroupRequest::ConsumerHeartbeat { .. }
            | GroupRequest::ClassicJoin { .. }
    );
    if joins && core.shares.groups.borrow().contains_key(req.group()) {
        let e = Refusal(
            ErrorCode::GroupIdNotFound.as_u16(),
            format!("{} is a share group, not a consumer group", req.group()),
        );
        return GroupResponse::refused(&req, e);
    }
    let r = match &req {
        GroupRequest::Join(r) => join(core, r).await.map(GroupResponse::Assignment),
        GroupRequest::Heartbeat(r) => heartbeat(core, r).await.map(GroupResponse::Assignment),
        GroupRequest::Leave(r) => leave(core, r).await.map(GroupResponse::Result),
        GroupRequest::Commit(r) => commit(core, r, None).await.map(GroupResponse::Commit),
        GroupRequest::TxnCommit { request, producer } => commit(core, request, Some(*producer))
            .await
            .map(GroupResponse::Commit),
        GroupRequest::Fetch(r) => Ok(GroupResponse::Fetch(fetch_offsets(core, r))),
        GroupRequest::FetchStable(r) => Ok(GroupResponse::FetchStable(
            fetch_offsets(core, r),
            pending_offsets(core, &r.group),
        )),
        GroupRequest::Describe(r) => describe(core, r).map(GroupResponse::Describe),
        GroupRequest::DescribeWithBytes(r) => describe(core, r).map(|d| {
            let bytes = classic_member_bytes(core, &r.group);
            GroupResponse::DescribeWithBytes(d, bytes)
        }),
        GroupRequest::Delete(r) => delete(core, r).await.map(GroupResponse::Result),
        GroupRequest::List => Ok(GroupResponse::List(list(core))),
        GroupRequest::ConsumerHeartbeat { group, heartbeat } => {
            return consumer_heartbeat(core, group, heartbeat.clone()).await
        }
        GroupRequest::ClassicJoin { group, request } => {
            return classic_service::join(core, group, request.clone()).await
        }
        GroupRequest::ClassicSync { group, request } => {
            return classic_service::sync(core, group, request.clone()).await
        }
        GroupRequest::ClassicHeartbeat {
            group,
            member_id,
            instance_id,
            generation,
        } => {
            return classic_service::heartbeat(
                core,
                group,
                member_id,
                instance_id.as_deref(),
                *generation,
            )
            .await
        }
        GroupRequest::ClassicLeave { group, members } => {
            return classic_service::leave(core, group, members).await
        }
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

/// Partition counts as the group state machine asks for them.
fn counts_of(core: &Core) -> impl Fn(&str) -> Option<u32> + '_ {
    let view = core.metadata();
    move |t| view.get(t).map(|s| s.partitions())
}

fn refusal(e: GroupError) -> Refusal {
    let code = match &e {
        GroupError::UnknownMember(_) => ErrorCode::UnknownMemberId,
        GroupError::FencedMemberEpoch(_) => ErrorCode::FencedMemberEpoch,
        GroupError::StaleMemberEpoch(_) => ErrorCode::StaleMemberEpoch,
        GroupError::UnsupportedAssignor(_) => ErrorCode::InconsistentAssignor,
        GroupError::InvalidSessionTimeout(_) => ErrorCode::InvalidSessionTimeout,
        GroupError::InvalidRequest(_) => ErrorCode::InvalidRequest,
        GroupError::GroupMaxSize(_) => ErrorCode::PolicyViolation,
        GroupError::UnreleasedInstanceId(_) => ErrorCode::InvalidRequest,
    };
    Refusal(code.as_u16(), e.message().to_string())
}

fn storage_refusal(e: &BrokerError) -> Refusal {
    let (code, message) = e.wire();
    Refusal(code, message)
}

/// A new member's id: the client id, the core, a counter and the time.
fn fresh_member_id(core: &Core, client_id: &str) -> String {
    let n = core.groups.next_member.get();
    core.groups.next_member.set(n + 1);
    let client = if client_id.is_empty() {
        "member"
    } else {
        client_id
    };
    let client: String = client.chars().take(200).collect();
    format!("{client}-{}-{n}-{:x}", core.id, core.storage.now_ms())
}

/// One heartbeat step of a consumer group (KIP-848 semantics), under the
/// group's lock, stored before it returns. `create`: the group may be
/// created (a join).
async fn step(core: &Rc<Core>, name: &str, hb: Heartbeat, create: bool) -> Result<Answer, Refusal> {
    step_kip848(core, name, hb, create).await?.map_err(refusal)
}

/// [`step`], with the state machine's own error apart from refusals of
/// the coordinator (storage failure, a classic group).
async fn step_kip848(
    core: &Rc<Core>,
    name: &str,
    hb: Heartbeat,
    create: bool,
) -> Result<Result<Answer, GroupError>, Refusal> {
    let _lock = core.groups.lock(name).await;
    let answer = {
        let mut groups = core.groups.groups.borrow_mut();
        if !create && !groups.contains_key(name) {
            return Ok(Err(GroupError::UnknownMember(format!(
                "group `{name}` has no member `{}`: rejoin",
                hb.member_id
            ))));
        }
        let g = groups.entry(name.to_string()).or_default();
        if let Some(c) = &g.classic {
            if c.members().next().is_some() {
                return Err(Refusal(
                    ErrorCode::InconsistentAssignor.as_u16(),
                    format!(
                        "group `{name}` is a classic group with members (Kafka \
                         JoinGroup/SyncGroup): a consumer-protocol member cannot join it"
                    ),
                ));
            }
            if create {
                // An empty classic group becomes a consumer group.
                g.classic = None;
                g.classic_dropped = true;
            }
        }
        let client_id = hb.client_id.clone();
        let mut fresh = || fresh_member_id(core, &client_id);
        let r = g
            .consumer
            .heartbeat(mono_ms(), hb, &mut fresh, &counts_of(core));
        if !g.has_members()
            && g.offsets.is_empty()
            && g.consumer.group_epoch == 0
            && g.classic.is_none()
            && !g.classic_dropped
        {
            // A refused first join leaves nothing behind.
            groups.remove(name);
        }
        r
    };
    persist(core, name).await?;
    Ok(answer)
}

/// KIP-848 `ConsumerGroupHeartbeat`: a join (epoch 0) creates the group.
async fn consumer_heartbeat(core: &Rc<Core>, name: &str, hb: Heartbeat) -> GroupResponse {
    let create = hb.member_epoch == JOIN_EPOCH;
    match step_kip848(core, name, hb, create).await {
        Ok(r) => GroupResponse::ConsumerHeartbeat(r),
        Err(e) => GroupResponse::Refused(e.0, e.1),
    }
}

fn to_native(a: Answer, assignor: String) -> GroupAssignment {
    GroupAssignment {
        error: 0,
        message: None,
        member_id: a.member_id,
        generation: a.member_epoch,
        assignor,
        assignment: to_wire(&a.assignment),
        heartbeat_interval_ms: a.heartbeat_interval_ms,
    }
}

fn assignor_of(core: &Core, group: &str) -> String {
    core.groups
        .groups
        .borrow()
        .get(group)
        .map(|g| g.consumer.assignor.clone())
        .unwrap_or_default()
}

/// The native join: a KIP-848 join (epoch 0) with the native fields; the
/// poll interval is the member's rebalance timeout. A join with a known
/// member id updates its subscription.
async fn join(core: &Rc<Core>, r: &JoinGroupRequest) -> Result<GroupAssignment, Refusal> {
    if r.topics.is_empty() || r.topics.len() > MEMBER_TOPICS_MAX {
        return Err(Refusal(
            ErrorCode::InvalidRequest.as_u16(),
            format!("a member must subscribe to 1 to {MEMBER_TOPICS_MAX} topics"),
        ));
    }
    let mut hb = Heartbeat {
        member_id: r.member_id.clone(),
        member_epoch: JOIN_EPOCH,
        instance_id: None,
        client_id: r.client_id.clone(),
        rebalance_timeout_ms: Some(r.max_poll_interval_ms),
        session_timeout_ms: Some(r.session_timeout_ms),
        topics: Some(r.topics.iter().cloned().collect()),
        assignor: Some(r.assignor.clone()),
        owned: None,
    };
    if !r.member_id.is_empty() {
        // Only a member the group knows may name itself.
        let epoch = core
            .groups
            .groups
            .borrow()
            .get(&r.group)
            .and_then(|g| g.consumer.members.get(&r.member_id).map(|m| m.epoch))
            .ok_or_else(|| unknown_member(&r.group, &r.member_id))?;
        hb.member_epoch = epoch;
    }
    let a = step(core, &r.group, hb, r.member_id.is_empty()).await?;
    Ok(to_native(a, assignor_of(core, &r.group)))
}

/// The native heartbeat: the member's epoch in `generation`, the
/// partitions it owns (releasing those it was asked to revoke), held up to
/// `wait_ms` while the answer would not change what it owns.
async fn heartbeat(core: &Rc<Core>, r: &HeartbeatRequest) -> Result<GroupAssignment, Refusal> {
    let owned = from_wire(&r.owned);
    let poll_limit = core
        .groups
        .groups
        .borrow()
        .get(&r.group)
        .and_then(|g| g.consumer.members.get(&r.member_id))
        .map(|m| m.rebalance_timeout_ms)
        .ok_or_else(|| unknown_member(&r.group, &r.member_id))?;
    if r.since_poll_ms > poll_limit {
        let leave = Heartbeat {
            member_id: r.member_id.clone(),
            member_epoch: LEAVE_EPOCH,
            ..Default::default()
        };
        step(core, &r.group, leave, false).await?;
        return Err(Refusal(
            ErrorCode::UnknownMemberId.as_u16(),
            format!(
                "member `{}` expelled from group `{}`: its application did not poll for \
                 {} ms (max_poll_interval_ms {poll_limit}); rejoin",
                r.member_id, r.group, r.since_poll_ms
            ),
        ));
    }
    let deadline = Instant::now() + Duration::from_millis(r.wait_ms.into());
    let mut epoch = r.generation;
    // After a hold that ended without a change, one more step answers
    // (and refreshes the session).
    let mut last = false;
    loop {
        let hb = Heartbeat {
            member_id: r.member_id.clone(),
            member_epoch: epoch,
            owned: Some(owned.clone()),
            ..Default::default()
        };
        let a = step(core, &r.group, hb, false).await?;
        let unchanged = a.member_epoch == r.generation && a.assignment == owned;
        let hold = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(
                u64::from(a.heartbeat_interval_ms) * 3 / 2,
            ));
        if last || !unchanged || hold.is_zero() || core.shared.stopping() {
            return Ok(to_native(a, assignor_of(core, &r.group)));
        }
        epoch = a.member_epoch;
        // Held until the group changes (or the hold ends).
        let rx = {
            let mut groups = core.groups.groups.borrow_mut();
            let Some(g) = groups.get_mut(&r.group) else {
                return Err(unknown_member(&r.group, &r.member_id));
            };
            let (tx, rx) = oneshot::channel();
            if let Some(older) = g.waiters.insert(r.member_id.clone(), tx) {
                // A newer heartbeat of the member is held now: the older
                // one is answered at once (were it held again, the two
                // would end each other in a busy loop).
                let _ = older.send(false);
            }
            rx
        };
        let woken = futures_lite::future::or(async { rx.await.unwrap_or(false) }, async {
            let end = Instant::now() + hold;
            while Instant::now() < end && !core.shared.stopping() {
                let step = end.saturating_duration_since(Instant::now());
                glommio::timer::sleep(step.min(Duration::from_millis(50))).await;
            }
            false
        })
        .await;
        // The hold ended, or a newer heartbeat replaced this one.
        last = !woken;
    }
}

async fn leave(core: &Rc<Core>, r: &LeaveGroupRequest) -> Result<GroupResult, Refusal> {
    let hb = Heartbeat {
        member_id: r.member_id.clone(),
        member_epoch: LEAVE_EPOCH,
        ..Default::default()
    };
    step(core, &r.group, hb, false).await?;
    Ok(GroupResult::default())
}

/// Log end offsets of partitions, asking each owner core once. A
/// partition of another node is not asked (`u64::MAX`: a commit to it is
/// not checked against its log end, as Kafka never checks).
async fn log_ends(core: &Rc<Core>, tps: &[Tp]) -> Vec<Result<u64, BrokerError>> {
    let mut by_core: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut out: Vec<Result<u64, BrokerError>> = Vec::with_capacity(tps.len());
    for (i, (t, p)) in tps.iter().enumerate() {
        match core.locate(t, *p) {
            Ok(c) => {
                by_core.entry(c).or_default().push(i);
                out.push(Ok(0));
            }
            Err(BrokerError::NotLeader { .. }) => out.push(Ok(u64::MAX)),
            Err(e) => out.push(Err(e)),
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
            if let Some(e) = end.as_ref().ok().filter(|&&e| e != u64::MAX) {
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

/// OffsetCommit; with `txn`, TxnOffsetCommit: the offsets are written as
/// part of producer (id, epoch)'s transaction and held pending until its
/// marker commits them ([`end_txn`]).
async fn commit(
    core: &Rc<Core>,
    r: &OffsetCommitRequest,
    txn: Option<(i64, i16)>,
) -> Result<OffsetCommitResponse, Refusal> {
    if r.offsets.len() > COMMIT_OFFSETS_MAX {
        return Err(Refusal(
            ErrorCode::InvalidRequest.as_u16(),
            format!(
                "a commit of {} offsets; at most {COMMIT_OFFSETS_MAX}",
                r.offsets.len()
            ),
        ));
    }
    // Under the group's lock from its checks to its append: no check is
    // stale when the record lands, and records land in the order they
    // were checked.
    let _lock = core.groups.lock(&r.group).await;
    commit_checked(core, r, txn).await
}

/// Producer `producer_id`'s transaction ended in `__consumer_offsets`
/// partition `p` (its marker is durable there): the offsets it committed
/// for the groups of `p` are committed, or dropped.
pub fn end_txn(core: &Core, p: u32, producer_id: i64, commit: bool) {
    let n = core
        .metadata()
        .get(OFFSETS_TOPIC)
        .map_or(0, |t| t.partitions());
    if n > 0 {
        core.groups.end_txn(p, n, producer_id, commit);
    }
}

/// The member's right to commit, checked under the group's lock.
fn check_member(
    core: &Core,
    r: &OffsetCommitRequest,
    tps: &[Tp],
    errors: &mut [Option<(u16, String)>],
) -> Result<(), Refusal> {
    let groups = core.groups.groups.borrow();
    let g = groups.get(&r.group);
    if let Some(c) = g.and_then(|g| g.classic.as_ref()) {
        // A classic group: Kafka's rule (the exact generation of a current
        // member; a negative one only while the group is empty).
        return c
            .validate_commit(&r.member_id, None, r.generation)
            .map_err(|e| classic_service::refusal(&e));
    }
    if r.member_id.is_empty() && r.generation < 0 {
        // An admin commit (e.g. `weir group reset`): only without
        // active members.
        if let Some(g) = g.filter(|g| !g.consumer.members.is_empty()) {
            return Err(Refusal(
                ErrorCode::GroupNotEmpty.as_u16(),
                format!(
                    "group `{}` has {} active members: stop them before changing its offsets",
                    r.group,
                    g.consumer.members.len()
                ),
            ));
        }
        return Ok(());
    }
    let g = g.ok_or_else(|| unknown_member(&r.group, &r.member_id))?;
    let per_partition = g
        .consumer
        .validate_commit(&r.member_id, r.generation, tps)
        .map_err(refusal)?;
    for (slot, e) in errors.iter_mut().zip(per_partition) {
        if let Some(e) = e {
            let e = refusal(e);
            slot.get_or_insert((e.0, e.1));
        }
    }
    Ok(())
}

async fn commit_checked(
    core: &Rc<Core>,
    r: &OffsetCommitRequest,
    txn: Option<(i64, i16)>,
) -> Result<OffsetCommitResponse, Refusal> {
    let tps: Vec<Tp> = r
        .offsets
        .iter()
        .map(|o| (o.topic.clone(), o.partition))
        .collect();
    // Per offset: an error, or None if it may be written.
    let mut errors: Vec<Option<(u16, String)>> = vec![None; tps.len()];
    // A transactional commit without a member (TxnOffsetCommit v0–2, or a
    // producer outside the group) is not checked against the members.
    if txn.is_none() || (!r.member_id.is_empty() && r.generation >= 0) {
        check_member(core, r, &tps, &mut errors)?;
    }
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
    // (Nothing changes the group while the lookup waits: its lock is
    // held.)
    let ends = checked_log_ends(core, &r.offsets, &tps).await;
    let ts = core.storage.now_ms();
    let mut records = Vec::new();
    let mut accepted = Vec::new();
    for (i, (o, end)) in r.offsets.iter().zip(ends).enumerate() {
        if errors[i].is_some() {
            continue;
        }
        match end {
            Err(e) => errors[i] = Some(e.wire()),
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
        let written = match txn {
            None => store::write_records(core, &r.group, records).await,
            Some(producer) => {
                store::write_records_transactional(core, &r.group, records, producer).await
            }
        };
        match written {
            Ok(()) => {
                let mut groups = core.groups.groups.borrow_mut();
                let g = groups.entry(r.group.clone()).or_default();
                let into = match txn {
                    None => &mut g.offsets,
                    Some((pid, _)) => g.pending_txn.entry(pid).or_default(),
                };
                for (i, v) in accepted {
                    into.insert(tps[i].clone(), v);
                }
            }
            Err(e) => {
                for (i, _) in accepted {
                    errors[i] = Some(e.wire());
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

/// The partitions with offsets of `group` pending in an open
/// transaction.
fn pending_offsets(core: &Core, group: &str) -> Vec<(String, u32)> {
    let groups = core.groups.groups.borrow();
    let mut out: Vec<(String, u32)> = groups
        .get(group)
        .map(|g| {
            g.pending_txn
                .values()
                .flat_map(|offsets| offsets.keys().cloned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out.dedup();
    out
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
    let Some(g) = groups.get(&r.group) else {
        return describe_share(core, r).ok_or_else(|| not_found(&r.group));
    };
    if let Some(c) = &g.classic {
        let generation = c.generation();
        return Ok(DescribeGroupResponse {
            error: 0,
            message: None,
            group: r.group.clone(),
            kind: "classic".into(),
            state: c.state().name().into(),
            generation,
            assignment_epoch: generation,
            assignor: c.protocol_name().unwrap_or_default().to_string(),
            coordinator_core: core.id as u32,
            // Subscriptions and assignments of classic members are the
            // clients' opaque bytes.
            members: c
                .members()
                .map(|m| MemberDescription {
                    member_id: m.member_id.to_string(),
                    client_id: m.client_id.to_string(),
                    instance_id: m.group_instance_id.map(str::to_string),
                    member_epoch: generation,
                    topics: Vec::new(),
                    assignment: Vec::new(),
                    owned: Vec::new(),
                    revoking: Vec::new(),
                })
                .collect(),
            offsets: committed(g, None),
        });
    }
    let c = &g.consumer;
    let keys = |m: &BTreeMap<Tp, i32>| to_wire(&m.keys().cloned().collect());
    Ok(DescribeGroupResponse {
        error: 0,
        message: None,
        group: r.group.clone(),
        kind: "consumer".into(),
        state: c.state().into(),
        generation: c.group_epoch,
        assignment_epoch: c.assignment_epoch,
        assignor: c.assignor.clone(),
        coordinator_core: core.id as u32,
        members: c
            .members
            .iter()
            .map(|(id, m)| MemberDescription {
                member_id: id.clone(),
                client_id: m.client_id.clone(),
                instance_id: m.instance_id.clone(),
                member_epoch: m.epoch,
                topics: m.topics.iter().cloned().collect(),
                assignment: to_wire(&m.target),
                owned: keys(&m.assigned),
                revoking: keys(&m.revoking),
            })
            .collect(),
        offsets: committed(g, None),
    })
}

/// A share group this core coordinates (KIP-932), as a group
/// description: its members and the partitions each reads (shared with
/// the others). The share partitions' offsets are not the coordinator's:
/// the listener adds them from `__share_group_state`.
fn describe_share(core: &Core, r: &DescribeGroupRequest) -> Option<DescribeGroupResponse> {
    let shares = core.shares.groups.borrow();
    let g = shares.get(&r.group)?;
    Some(DescribeGroupResponse {
        error: 0,
        message: None,
        group: r.group.clone(),
        kind: "share".into(),
        state: if g.is_empty() { "Empty" } else { "Stable" }.into(),
        generation: g.epoch(),
        assignment_epoch: g.epoch(),
        assignor: "simple".into(),
        coordinator_core: core.id as u32,
        members: g
            .members()
            .map(|m| MemberDescription {
                member_id: m.id.clone(),
                client_id: String::new(),
                instance_id: None,
                member_epoch: m.epoch,
                topics: m.subscribed.iter().cloned().collect(),
                assignment: to_wire(&m.assigned),
                owned: to_wire(&m.assigned),
                revoking: Vec::new(),
            })
            .collect(),
        offsets: Vec::new(),
    })
}

/// The opaque bytes of a classic group's members, in the order
/// [`describe`] lists them; empty for other groups.
fn classic_member_bytes(core: &Core, group: &str) -> Vec<ClassicMemberBytes> {
    let groups = core.groups.groups.borrow();
    let Some(c) = groups.get(group).and_then(|g| g.classic.as_ref()) else {
        return Vec::new();
    };
    c.members()
        .map(|m| ClassicMemberBytes {
            member_id: m.member_id.to_string(),
            client_host: m.client_host.to_string(),
            metadata: m.metadata.cloned().unwrap_or_default(),
            assignment: m.assignment.clone(),
        })
        .collect()
}

fn not_found(group: &str) -> Refusal {
    Refusal(
        ErrorCode::GroupIdNotFound.as_u16(),
        format!("no group `{group}` (no members, commits or metadata)"),
    )
}

async fn delete(core: &Rc<Core>, r: &DeleteGroupRequest) -> Result<GroupResult, Refusal> {
    let _lock = core.groups.lock(&r.group).await;
    let keys: Vec<(RecordKey, Option<Bytes>)> = {
        let groups = core.groups.groups.borrow();
        let g = groups.get(&r.group).ok_or_else(|| not_found(&r.group))?;
        if g.has_members() {
            return Err(Refusal(
                ErrorCode::GroupNotEmpty.as_u16(),
                format!("group `{}` has active members: stop them first", r.group),
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
        if g.classic.is_some() {
            keys.push((
                RecordKey::Classic {
                    group: r.group.clone(),
                },
                None,
            ));
        }
        keys
    };
    store::write_records(core, &r.group, keys)
        .await
        .map_err(|e| storage_refusal(&e))?;
    if let Some(mut g) = core.groups.groups.borrow_mut().remove(&r.group) {
        if let Some(c) = g.classic.as_mut() {
            classic_service::dispatch(core, c.mark_dead());
        }
    }
    Ok(GroupResult::default())
}

fn list(core: &Core) -> Vec<(GroupListing, &'static str)> {
    core.groups
        .groups
        .borrow()
        .iter()
        .map(|(name, g)| {
            let (kind, state, members, assignor) = match &g.classic {
                Some(c) => (
                    "classic",
                    c.state().name().into(),
                    c.members().count() as u32,
                    c.protocol_name().unwrap_or_default().to_string(),
                ),
                None => (
                    "consumer",
                    g.consumer.state().into(),
                    g.consumer.members.len() as u32,
                    g.consumer.assignor.clone(),
                ),
            };
            let listing = GroupListing {
                group: name.clone(),
                state,
                members,
                assignor,
            };
            (listing, kind)
        })
        .chain(core.shares.groups.borrow().iter().map(|(name, g)| {
            // Share groups (KIP-932) this core coordinates: their members;
            // one that lost them all is forgotten (its share partitions'
            // state stays in `__share_group_state`).
            let listing = GroupListing {
                group: name.clone(),
                state: if g.is_empty() { "Empty" } else { "Stable" }.into(),
                members: g.members().count() as u32,
                assignor: "simple".into(),
            };
            (listing, "share")
        }))
        .collect()
}

/// Every [`EXPIRY_CHECK_MS`], until the broker stops: expels members
/// whose session ended, fences members that did not release partitions
/// within their rebalance timeout, reassigns when a subscribed topic's
/// partition count changed (each group under its lock, its changes stored),
/// and removes empty groups past their retention.
pub async fn expiry_loop(core: Rc<Core>) {
    // Partition counts only change with the metadata: groups' subscribed
    // counts are compared again only when its version moved (a group
    // ticking meanwhile compares them in its tick).
    let mut seen_version = 0;
    while !core.shared.stopping() {
        glommio::timer::sleep(Duration::from_millis(EXPIRY_CHECK_MS)).await;
        let now = mono_ms();
        let version = core.metadata().version;
        let metadata_moved = version != seen_version;
        seen_version = version;
        let due: Vec<String> = {
            let counts = counts_of(&core);
            let mut groups = core.groups.groups.borrow_mut();
            groups
                .iter_mut()
                .filter(|(_, g)| {
                    let consumer = !g.consumer.members.is_empty()
                        && (g.consumer.next_deadline().is_some_and(|d| d <= now)
                            || (metadata_moved && g.consumer.counts_changed(&counts)));
                    let classic = g
                        .classic
                        .as_ref()
                        .and_then(|c| c.next_deadline())
                        .is_some_and(|d| d <= now);
                    !g.ticking && (consumer || classic)
                })
                .map(|(name, g)| {
                    g.ticking = true;
                    name.clone()
                })
                .collect()
        };
        for name in due {
            let core = core.clone();
            glommio::spawn_local(async move {
                let _lock = core.groups.lock(&name).await;
                let released = {
                    let mut groups = core.groups.groups.borrow_mut();
                    let Some(g) = groups.get_mut(&name) else {
                        return;
                    };
                    g.ticking = false;
                    let now = mono_ms();
                    for (member, why) in g.consumer.tick(now, &counts_of(&core)) {
                        tracing::info!(group = %name, member = %member, "member expelled: {why}");
                    }
                    g.classic.as_mut().map(|c| c.tick(now)).unwrap_or_default()
                };
                match persist(&core, &name).await {
                    Ok(()) => classic_service::dispatch(&core, released),
                    Err(e) => {
                        tracing::warn!(group = %name, error = %e.1, "storing expired members failed");
                        // Held classic requests get their answer at the
                        // next tick instead.
                        drop(released);
                    }
                }
            })
            .detach();
        }
        let expired = {
            let mut groups = core.groups.groups.borrow_mut();
            expired_groups(&core, &mut groups)
        };
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
        if g.has_members() {
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
