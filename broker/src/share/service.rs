//! Serving share groups on a core: membership (ShareGroupHeartbeat),
//! share fetches and acknowledgements, expiry ([`super`] says where each
//! runs).

use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use weir_share::group::{Heartbeat, HeartbeatAnswer, ShareGroup, ShareGroupError};
use weir_share::partition::{
    AckBatch, AcquireMode, Acquired, LogBatch, RecordState, ShareError, SharePartition,
    ShareSnapshot,
};
use weir_share::records::ShareKey;

use super::registry::Session;
use crate::error::BrokerError;
use crate::metrics::ShareStage;
use crate::shard::mesh::CoreMsg;
use crate::shard::Core;
use weir_proto::error_code::ErrorCode;

/// How often a core looks for expired locks and sessions.
pub const EXPIRY_CHECK_MS: u64 = 100;
/// Share sessions one core keeps (Kafka's `group.share.max.share.sessions`
/// is per broker; a core is one here). A new one beyond it is refused
/// SHARE_SESSION_LIMIT_REACHED.
pub const SESSIONS_MAX: usize = 2_000;
/// A share session unused this long is dropped (its member died without
/// closing it): its records are released. Kafka keeps a session as long
/// as its connection; here a session outlives its connection by this.
pub const SESSION_IDLE_MS: i64 = 120_000;

/// Why a share request was refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareRefusal {
    /// Another core or node coordinates the group: FindCoordinator.
    NotCoordinator(String),
    /// The membership machine's refusal.
    Group(ShareGroupError),
    /// The group id is a consumer group's.
    InconsistentGroupProtocol(String),
    /// No share session of this member with this core (epoch > 0).
    SessionNotFound(String),
    /// The session's epoch is another.
    InvalidSessionEpoch(String),
    /// Malformed.
    InvalidRequest(String),
    /// This core keeps [`SESSIONS_MAX`] share sessions.
    SessionLimitReached(String),
}

impl std::fmt::Display for ShareRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShareRefusal::Group(e) => write!(f, "{e}"),
            ShareRefusal::NotCoordinator(m)
            | ShareRefusal::InconsistentGroupProtocol(m)
            | ShareRefusal::SessionNotFound(m)
            | ShareRefusal::InvalidSessionEpoch(m)
            | ShareRefusal::InvalidRequest(m)
            | ShareRefusal::SessionLimitReached(m) => f.write_str(m),
        }
    }
}

/// ShareGroupHeartbeat, on the group's coordinator core (this one, or
/// `NotCoordinator`).
pub fn heartbeat(
    core: &Core,
    group: &str,
    hb: &Heartbeat,
) -> Result<HeartbeatAnswer, ShareRefusal> {
    if group.is_empty() {
        return Err(ShareRefusal::InvalidRequest("an empty group id".into()));
    }
    match crate::groups::coordinator::coordinator_of(core, group) {
        Ok(c) if c == core.id => {}
        Ok(c) => {
            return Err(ShareRefusal::NotCoordinator(format!(
                "share group {group} is coordinated by core {c}: ask FindCoordinator"
            )))
        }
        Err(e) => return Err(ShareRefusal::NotCoordinator(e.1)),
    }
    if core.groups.groups.borrow().contains_key(group) {
        return Err(ShareRefusal::InconsistentGroupProtocol(format!(
            "{group} is a consumer group, not a share group"
        )));
    }
    let now = core.storage.now_ms();
    let view = core.metadata();
    let partitions_of = |t: &str| view.get(t).map(|m| m.partitions());
    let mut groups = core.shares.groups.borrow_mut();
    let g = groups
        .entry(group.to_string())
        .or_insert_with(|| ShareGroup::new(core.shared.config.share_group));
    g.expire(now, &partitions_of);
    g.heartbeat(hb, &partitions_of, now)
        .map_err(ShareRefusal::Group)
}

/// One partition of a share fetch or acknowledgement.
#[derive(Debug, Clone)]
pub struct PartRequest {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Its acknowledgements (checked and applied before acquiring).
    pub acks: Vec<AckBatch>,
}

/// A share fetch or acknowledgement of one member with this core.
#[derive(Debug, Clone)]
pub struct ShareRequest {
    /// The share group.
    pub group: String,
    /// The member.
    pub member: String,
    /// Its session epoch: 0 opens a session, -1 closes it.
    pub epoch: i32,
    /// Partitions named (with acknowledgements).
    pub parts: Vec<PartRequest>,
    /// Partitions leaving the session (fetch only).
    pub forgotten: Vec<(String, u32)>,
    /// Records to acquire (about, or at most: `acquire_mode`); 0:
    /// acknowledge only.
    pub max_records: usize,
    /// How `max_records` bounds the records acquired.
    pub acquire_mode: AcquireMode,
    /// Bytes to read per partition, at most.
    pub max_bytes: u64,
    /// How long to wait when nothing can be acquired.
    pub max_wait_ms: u32,
    /// Answer a fetch without waiting for its acknowledgements to be
    /// stored (the native ShareFetch v2's `acks_later`): a store that
    /// fails is named in the session's next answer, and a request that
    /// only acknowledges (or closes the session) waits for them all.
    pub acks_later: bool,
}

impl ShareRequest {
    /// An acknowledgement (no records wanted) of `member` in its session
    /// at `epoch`; a fetch sets the acquisition fields on top.
    pub fn acknowledging(
        group: String,
        member: String,
        epoch: i32,
        parts: Vec<PartRequest>,
    ) -> ShareRequest {
        ShareRequest {
            group,
            member,
            epoch,
            parts,
            forgotten: Vec::new(),
            max_records: 0,
            acquire_mode: AcquireMode::BatchOptimized,
            max_bytes: 0,
            max_wait_ms: 0,
            acks_later: false,
        }
    }
}

/// The answer for one partition.
#[derive(Debug, Clone, Default)]
pub struct PartAnswer {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Why it was not read.
    pub error: Option<BrokerError>,
    /// Why its acknowledgements were refused (nothing of them applied).
    pub ack_error: Option<ShareError>,
    /// Its acknowledgements were applied but could not be stored (they
    /// hold while this core serves the share partition; a new leader
    /// may deliver those records again).
    pub store_error: Option<BrokerError>,
    /// Whether the request acknowledged something here.
    pub acked: bool,
    /// The batches holding the acquired records.
    pub batches: Vec<Bytes>,
    /// The records acquired.
    pub acquired: Vec<Acquired>,
}

/// ShareFetch (with `max_records > 0`) or ShareAcknowledge on this core:
/// the session checked and moved on, acknowledgements applied, records
/// acquired from the session's partitions (waiting up to `max_wait_ms`
/// when there is none). Answers the session's partitions that were
/// named, acknowledged or got records (all of them when it opened).
pub async fn fetch(core: &Rc<Core>, req: ShareRequest) -> Result<Vec<PartAnswer>, ShareRefusal> {
    if req.group.is_empty() || req.member.is_empty() {
        return Err(ShareRefusal::InvalidRequest(
            "a share fetch names its group and member".into(),
        ));
    }
    let limit = crate::server::limits::REQUEST_PARTITIONS_MAX;
    if req.parts.len() + req.forgotten.len() > limit {
        return Err(ShareRefusal::InvalidRequest(format!(
            "the request names {} partitions; at most {limit}",
            req.parts.len() + req.forgotten.len()
        )));
    }
    let key = (req.group.clone(), req.member.clone());
    let named: Vec<(String, u32)> = req
        .parts
        .iter()
        .map(|p| (p.topic.clone(), p.partition))
        .collect();
    // A request that only acknowledges, or closes the session, answers
    // once the acknowledgements its fetches answered early are stored.
    let acks_only = req.max_records == 0 || req.epoch == -1;
    let mut unstored = Vec::new();
    // The failures a closing session had not named yet.
    let mut close_failures = None;
    let partitions = {
        let mut sessions = core.shares.sessions.borrow_mut();
        match req.epoch {
            0 => {
                if !sessions.contains_key(&key) && sessions.len() >= SESSIONS_MAX {
                    return Err(ShareRefusal::SessionLimitReached(format!(
                        "{SESSIONS_MAX} share sessions on this core: retry later"
                    )));
                }
                // A session opened again keeps what the old one had not
                // stored yet.
                let mut old = sessions.remove(&key).unwrap_or_default();
                if acks_only {
                    unstored = old.unstored.drain().collect();
                }
                let s = Session {
                    epoch: 1,
                    partitions: named.iter().cloned().collect(),
                    used_ms: core.storage.now_ms(),
                    unstored: old.unstored,
                    store_failures: old.store_failures,
                };
                let all = s.partitions.clone();
                sessions.insert(key.clone(), s);
                all
            }
            e => {
                let Some(s) = sessions.get_mut(&key) else {
                    return Err(ShareRefusal::SessionNotFound(format!(
                        "member {} of {} has no share session with this broker: open one (epoch 0)",
                        req.member, req.group
                    )));
                };
                if e != -1 && e != s.epoch {
                    return Err(ShareRefusal::InvalidSessionEpoch(format!(
                        "share session epoch {e}; the session is at {}",
                        s.epoch
                    )));
                }
                // A fetch names the partitions it adds to the session; an
                // acknowledgement (no records wanted) leaves them as they are.
                if req.max_records > 0 {
                    let added: Vec<(String, u32)> = named
                        .iter()
                        .filter(|tp| !s.partitions.contains(*tp))
                        .cloned()
                        .collect();
                    s.partitions.extend(added.iter().cloned());
                    if s.partitions.len() > limit {
                        for tp in &added {
                            s.partitions.remove(tp);
                        }
                        return Err(ShareRefusal::InvalidRequest(format!(
                            "a share session of more than {limit} partitions"
                        )));
                    }
                }
                for f in &req.forgotten {
                    s.partitions.remove(f);
                }
                s.epoch = next_epoch(s.epoch);
                s.used_ms = core.storage.now_ms();
                let all = s.partitions.clone();
                if acks_only {
                    unstored = s.unstored.drain().collect();
                }
                if e == -1 {
                    let gone = sessions.remove(&key).unwrap_or_default();
                    close_failures = Some(gone.store_failures);
                }
                all
            }
        }
    };
    let member: Rc<str> = Rc::from(req.member.as_str());
    let closing = req.epoch == -1;
    tracing::debug!(group = %req.group, member = %req.member, epoch = req.epoch,
        fetch = req.max_records > 0, "share request");
    // Partitions forgotten, or the whole session when it closes: what
    // the member holds there goes back.
    let released: Vec<(String, u32)> = if closing {
        partitions.iter().cloned().collect()
    } else {
        req.forgotten.clone()
    };
    let now = || core.storage.now_ms();
    let mut answers: Vec<PartAnswer> = Vec::new();
    // Stores of acknowledged state, running while records are acquired
    // (the answer waits for them: durable before answered).
    let mut stores: Vec<(ShareKey, glommio::Task<Result<(), BrokerError>>)> = Vec::new();
    // Acknowledgements first, all of them, then the releases.
    for p in &req.parts {
        let mut a = PartAnswer {
            topic: p.topic.clone(),
            partition: p.partition,
            ..Default::default()
        };
        if !p.acks.is_empty() {
            a.acked = true;
            match ensure(core, &req.group, &p.topic, p.partition).await {
                Err(e) => a.error = Some(e),
                Ok(k) => {
                    let applied = {
                        let mut parts = core.shares.parts.borrow_mut();
                        let (_, sp) = parts.get_mut(&k).expect("made by ensure");
                        sp.acknowledge(&req.member, &p.acks, now())
                    };
                    if applied.is_ok() {
                        core.shares.wake();
                    }
                    match applied {
                        Err(e) => {
                            tracing::debug!(group = %req.group, member = %req.member, error = %e,
                                "share acknowledgement refused");
                            a.ack_error = Some(e);
                        }
                        // Durable before it is answered (or, asked so, before
                        // the session's next acknowledgement is).
                        Ok(true) => {
                            let seq = core.shares.changed(&k);
                            let epoch = core.shares.parts.borrow().get(&k).map_or(0, |(e, _)| *e);
                            if req.acks_later && !acks_only {
                                store_later(core, &key, k, seq, epoch);
                            } else {
                                let (core, key) = (core.clone(), k.clone());
                                let task = glommio::spawn_local(async move {
                                    persist(&core, &key, seq, epoch, false).await
                                });
                                stores.push((k, task));
                            }
                        }
                        Ok(false) => {}
                    }
                }
            }
        }
        answers.push(a);
    }
    for (topic, partition) in &released {
        let k = key_of(&req.group, topic, *partition);
        if let Some((_, sp)) = core.shares.parts.borrow_mut().get_mut(&k) {
            sp.release_member(&req.member);
        }
    }
    if !released.is_empty() {
        core.shares.wake();
    }
    if acks_only {
        settle(stores, &mut answers).await;
        let requeue = (!closing).then_some(&key);
        let stored = settle_unstored(core, unstored, requeue, &mut answers).await;
        name_store_failures(core, &key, close_failures, &stored, &mut answers);
        return Ok(answers);
    }
    let timed = |stage: ShareStage, since: Instant| {
        let now = Instant::now();
        core.metrics.share_stage(stage, now - since);
        now
    };
    let started = Instant::now();
    let acquired = acquire_all(core, &req, &member, &partitions, &mut answers).await;
    let mut at = timed(ShareStage::Acquire, started);
    if !acquired && req.max_wait_ms > 0 {
        // Stored first: a member waiting for records holds its
        // acknowledgements' answer no longer than their store.
        if !stores.is_empty() {
            settle(std::mem::take(&mut stores), &mut answers).await;
            at = timed(ShareStage::Store, at);
        } else {
            wait_for_records(core, &req.group, &partitions, req.max_wait_ms).await;
            at = timed(ShareStage::Wait, at);
            acquire_all(core, &req, &member, &partitions, &mut answers).await;
            at = timed(ShareStage::Acquire, at);
        }
    }
    if !stores.is_empty() {
        settle(stores, &mut answers).await;
        timed(ShareStage::Store, at);
    }
    name_store_failures(core, &key, None, &[], &mut answers);
    if req.epoch == 0 {
        // A new session answers every partition it holds.
        for (topic, partition) in &partitions {
            if !answers
                .iter()
                .any(|a| a.topic == *topic && a.partition == *partition)
            {
                answers.push(PartAnswer {
                    topic: topic.clone(),
                    partition: *partition,
                    ..Default::default()
                });
            }
        }
    }
    Ok(answers)
}

/// Stores share partition `k`'s change `seq` (acknowledgements of
/// `session`, answered before they are stored) in a task of its own: the
/// session notes the change unstored until then, and the failure if the
/// store fails. A store of such changes already waiting for the
/// partition's store line covers this one too: none is queued behind it.
fn store_later(core: &Rc<Core>, session: &(String, String), k: ShareKey, seq: u64, epoch: u32) {
    if let Some(s) = core.shares.sessions.borrow_mut().get_mut(session) {
        s.note_unstored(&k, epoch, seq);
    }
    let line = core.shares.store_line(&k);
    if line.later_queued.replace(true) {
        return;
    }
    let (core, session) = (core.clone(), session.clone());
    glommio::spawn_local(async move {
        let started = Instant::now();
        let outcome = persist(&core, &k, seq, epoch, true).await;
        core.metrics
            .share_stage(ShareStage::StoreLater, started.elapsed());
        let mut sessions = core.shares.sessions.borrow_mut();
        let Some(s) = sessions.get_mut(&session) else {
            return;
        };
        let at = (k, epoch);
        match outcome {
            Ok(()) => {
                // Stored, and every change of the partition at this epoch
                // before it (a failed store's too): unless a later one waits.
                s.store_failures.remove(&at);
                if s.unstored.get(&at).is_some_and(|covers| *covers <= seq) {
                    s.unstored.remove(&at);
                }
            }
            Err(e) => {
                tracing::debug!(share_partition = ?at.0, error = %e,
                    "acknowledgements answered early could not be stored");
                s.store_failures.insert(at, e);
            }
        }
    })
    .detach();
}

/// Waits for the stores of acknowledgements a session's fetches answered
/// early (`unstored`, taken from the session), storing what no store
/// covers yet; a failure is noted on its partition's answer and, unless
/// the session closed (`requeue`: the session), noted unstored again for
/// its next acknowledgement to store. Answers the share partitions now
/// stored.
async fn settle_unstored(
    core: &Rc<Core>,
    unstored: Vec<((ShareKey, u32), u64)>,
    requeue: Option<&(String, String)>,
    answers: &mut Vec<PartAnswer>,
) -> Vec<(ShareKey, u32)> {
    let mut stored = Vec::new();
    for ((k, epoch), seq) in unstored {
        match persist(core, &k, seq, epoch, false).await {
            Ok(()) => stored.push((k, epoch)),
            Err(e) => {
                note_store_failure(answers, &k, e);
                if let Some(r) = requeue {
                    if let Some(s) = core.shares.sessions.borrow_mut().get_mut(r) {
                        s.note_unstored(&k, epoch, seq);
                    }
                }
            }
        }
    }
    stored
}

/// Names in `answers` the stores of early-answered acknowledgements that
/// failed since the session's last answer (`closed`: those of the
/// session this request closed), but those `stored` since.
fn name_store_failures(
    core: &Core,
    session: &(String, String),
    closed: Option<HashMap<(ShareKey, u32), BrokerError>>,
    stored: &[(ShareKey, u32)],
    answers: &mut Vec<PartAnswer>,
) {
    let failures = closed.or_else(|| {
        core.shares
            .sessions
            .borrow_mut()
            .get_mut(session)
            .map(|s| std::mem::take(&mut s.store_failures))
    });
    for (at, e) in failures.into_iter().flatten() {
        if stored.contains(&at) {
            continue;
        }
        note_store_failure(answers, &at.0, e);
    }
}

/// Notes on share partition `k`'s answer (added if there is none) that
/// acknowledgements applied there could not be stored.
fn note_store_failure(answers: &mut Vec<PartAnswer>, k: &ShareKey, e: BrokerError) {
    match answers
        .iter_mut()
        .find(|a| a.topic == k.topic && a.partition == k.partition)
    {
        Some(a) => {
            a.store_error.get_or_insert(e);
        }
        None => answers.push(PartAnswer {
            topic: k.topic.clone(),
            partition: k.partition,
            store_error: Some(e),
            acked: true,
            ..Default::default()
        }),
    }
}

/// Waits for the stores of acknowledged state, noting a failed one on
/// its partition's answer.
async fn settle(
    stores: Vec<(ShareKey, glommio::Task<Result<(), BrokerError>>)>,
    answers: &mut [PartAnswer],
) {
    for (k, task) in stores {
        if let Err(e) = task.await {
            if let Some(a) = answers
                .iter_mut()
                .find(|a| a.topic == k.topic && a.partition == k.partition)
            {
                a.store_error = Some(e);
            }
        }
    }
}

/// The stored state of `group`'s share partitions on `partitions`: where
/// each starts (its first record not acknowledged) and how many records
/// past the start are acknowledged already; `None` where nothing is
/// stored (nothing was acknowledged yet).
pub async fn stored_starts(
    core: &Rc<Core>,
    group: &str,
    partitions: &[(String, u32)],
) -> Vec<Result<Option<(u64, u64)>, BrokerError>> {
    let mut out = Vec::with_capacity(partitions.len());
    for (topic, partition) in partitions {
        let k = key_of(group, topic, *partition);
        out.push(super::state::load(core, &k).await.map(|s| {
            s.map(|s| {
                let done: u64 = s
                    .runs
                    .iter()
                    .filter(|r| r.state.terminal())
                    .map(|r| r.last - r.first + 1)
                    .sum();
                (s.start, done)
            })
        }));
    }
    out
}

/// How many members share group `group` has, asked of its coordinator
/// (before its offsets are reset or its state deleted): 0 for a group it
/// does not know — share-group membership is not stored, so once its
/// members are gone only its share partitions' states remain. A consumer
/// group's id is `GroupIdNotFound` ("not a share group"); a refusal
/// (`NotCoordinator`, …) is passed on.
pub async fn share_group_members(core: &Rc<Core>, group: &str) -> Result<usize, (u16, String)> {
    use crate::groups::api::{GroupRequest, GroupResponse};
    let req = GroupRequest::Describe(weir_proto::messages::DescribeGroupRequest {
        group: group.to_string(),
    });
    match crate::groups::coordinator::serve(core, req).await {
        GroupResponse::Describe(x) if x.error == 0 && x.kind == "share" => Ok(x.members.len()),
        GroupResponse::Describe(x) if x.error == 0 => Err((
            ErrorCode::GroupIdNotFound.as_u16(),
            format!("group `{group}` is a consumer group, not a share group"),
        )),
        GroupResponse::Describe(x)
            if ErrorCode::from_u16(x.error) == ErrorCode::GroupIdNotFound =>
        {
            Ok(0)
        }
        GroupResponse::Describe(x) => Err((x.error, x.message.unwrap_or_default())),
        GroupResponse::Refused(code, why) => Err((code, why)),
        other => Err((
            ErrorCode::NotCoordinator.as_u16(),
            format!("group `{group}`: {other:?}"),
        )),
    }
}

/// Resets `group`'s share partition on `topic`-`partition` at the core
/// owning that partition, on this node or another: its start moved to
/// `start` (Kafka's AlterShareGroupOffsets), or (`None`) its state
/// deleted, so it starts again as `--share-auto-offset-reset` says
/// (DeleteShareGroupOffsets). The caller checks that the group has no
/// members. Whether the group had state there (or was served there).
pub async fn reset(
    core: &Rc<Core>,
    group: &str,
    (topic, partition): (&str, u32),
    start: Option<u64>,
) -> Result<bool, BrokerError> {
    let k = key_of(group, topic, partition);
    match core.locate(topic, partition) {
        Ok(c) if c == core.id => reset_here(core, k, start).await,
        Ok(c) => {
            core.call(c, std::time::Duration::ZERO, |reply| CoreMsg::ShareReset {
                key: k,
                start,
                reply,
            })
            .await?
        }
        Err(BrokerError::NotLeader { leader, .. })
            if leader != 0 && leader != core.shared.config.cluster.node_id =>
        {
            let at = (topic.to_string(), partition);
            let unavailable = super::state::on_node_failed(&at, leader);
            let link = crate::replica::link_to(core, leader, &at)
                .await
                .map_err(unavailable)?;
            let (r, had) = link
                .share_reset(weir_share::records::encode_key(&k), start)
                .await
                .map_err(|e| unavailable(e.chain().to_string()))?;
            let message = r.message.unwrap_or_default();
            match ErrorCode::from_u16(r.error) {
                ErrorCode::None => Ok(had),
                ErrorCode::OffsetOutOfRange => Err(BrokerError::Storage {
                    kind: crate::error::StorageFailure::OffsetOutOfRange,
                    message,
                }),
                ErrorCode::InvalidRequest => Err(BrokerError::InvalidRequest(message)),
                _ => Err(unavailable(message)),
            }
        }
        Err(e) => Err(e),
    }
}

/// Another node's reset of a share partition of a topic partition this
/// core owns ([`reset`]): the outcome, and whether there was state.
pub async fn serve_reset(
    core: &Rc<Core>,
    key: Vec<u8>,
    start: Option<u64>,
) -> (weir_replication::data::MarkerResult, bool) {
    let r = match weir_share::records::decode_key(&key) {
        Ok(k) => reset_here(core, k, start).await,
        Err(why) => Err(BrokerError::InvalidRequest(format!(
            "share state key: {why}"
        ))),
    };
    match r {
        Ok(had) => (Default::default(), had),
        Err(e) => (
            weir_replication::data::MarkerResult {
                error: e.code().as_u16(),
                message: Some(e.to_string()),
            },
            false,
        ),
    }
}

/// [`reset`] at the core owning the partition: stores the new state
/// (a start with nothing in flight and the state epoch bumped, or a
/// tombstone) after the share partition's pending stores, and drops the
/// copy this core serves, so the next fetch loads what was stored.
/// Records members still held are theirs no more (their
/// acknowledgements are refused). Whether there was state.
pub async fn reset_here(
    core: &Rc<Core>,
    k: ShareKey,
    start: Option<u64>,
) -> Result<bool, BrokerError> {
    let owner = core.locate(&k.topic, k.partition)?;
    if owner != core.id {
        return Err(crate::service::admin::not_owner(
            core,
            &k.topic,
            k.partition,
            owner,
        ));
    }
    if let Some(r) = core.replication.get(&k.topic, k.partition) {
        r.check_leader()?;
    }
    if let Some(at) = start {
        let log = core.owned_log(&k.topic, k.partition)?;
        let (first, end) = (
            log_start(core, &log, &k.topic, k.partition),
            log.high_watermark(),
        );
        if at < first || at > end {
            return Err(BrokerError::Storage {
                kind: crate::error::StorageFailure::OffsetOutOfRange,
                message: format!(
                    "start offset {at} is outside {}-{} ({first}..={end})",
                    k.topic, k.partition
                ),
            });
        }
    }
    // Deleting where the group has nothing (DeleteGroups looks on every
    // partition) leaves no trace: no store line is made for it.
    let nothing_here = || {
        !core.shares.parts.borrow().contains_key(&k)
            && !core.shares.store_lines.borrow().contains_key(&k)
    };
    if start.is_none() && nothing_here() {
        let stored = super::state::load(core, &k)
            .await
            .map_err(|e| unavailable(&k, e))?;
        if stored.is_none() && nothing_here() {
            return Ok(false);
        }
    }
    let line = core.shares.store_line(&k);
    let _one = line
        .lock
        .acquire_permit(1)
        .await
        .map_err(|_| unavailable(&k, BrokerError::TimedOut("store lock closed".into())))?;
    let stored = super::state::load(core, &k)
        .await
        .map_err(|e| unavailable(&k, e))?;
    let served = core
        .shares
        .parts
        .borrow_mut()
        .remove(&k)
        .map(|(_, sp)| sp.state_epoch());
    let had = stored.is_some() || served.is_some();
    if start.is_none() && !had {
        // Nothing to delete.
        return Ok(false);
    }
    let state_epoch = stored
        .as_ref()
        .map(|s| s.state_epoch)
        .into_iter()
        .chain(served)
        .max()
        .unwrap_or(0)
        .wrapping_add(1)
        .max(0);
    let snapshot = start.map(|at| ShareSnapshot {
        state_epoch,
        start: at,
        end: at,
        runs: Vec::new(),
    });
    super::state::store(core, &k, snapshot.as_ref())
        .await
        .map_err(|e| unavailable(&k, e))?;
    // A fetch may have loaded the old state while this one was stored.
    core.shares.parts.borrow_mut().remove(&k);
    if start.is_none() {
        // Forgotten: its store line goes too (a store under way keeps its
        // own handle).
        core.shares.store_lines.borrow_mut().remove(&k);
    }
    core.shares.wake();
    tracing::info!(
        group = %k.group,
        topic = %k.topic,
        partition = k.partition,
        start = ?start,
        "share partition reset"
    );
    Ok(had)
}

/// The session epoch after `e` (1 after the largest: 0 and -1 are
/// special).
fn next_epoch(e: i32) -> i32 {
    if !(1..i32::MAX).contains(&e) {
        1
    } else {
        e + 1
    }
}

fn key_of(group: &str, topic: &str, partition: u32) -> ShareKey {
    ShareKey {
        group: group.to_string(),
        topic: topic.to_string(),
        partition,
    }
}

/// The share partition of `group` on `topic`-`partition`, which this
/// core must own (and lead). Loaded from `__share_group_state` when this
/// core first serves it, or again once the partition's leader epoch
/// moved (another replica led it meanwhile: its state is the stored
/// one); made afresh if nothing is stored (at the log's end, or start
/// with `--share-auto-offset-reset earliest`).
async fn ensure(
    core: &Rc<Core>,
    group: &str,
    topic: &str,
    partition: u32,
) -> Result<ShareKey, BrokerError> {
    let owner = core.locate(topic, partition)?;
    if owner != core.id {
        return Err(crate::service::admin::not_owner(
            core, topic, partition, owner,
        ));
    }
    let epoch = match core.replication.get(topic, partition) {
        Some(r) => {
            r.check_leader()?;
            r.epoch()
        }
        None => 0,
    };
    let k = key_of(group, topic, partition);
    let log = core.owned_log(topic, partition)?;
    let current = core
        .shares
        .parts
        .borrow()
        .get(&k)
        .is_some_and(|(e, _)| *e == epoch);
    if !current {
        let stored = super::state::load(core, &k)
            .await
            .map_err(|e| unavailable(&k, e))?;
        let config = core.shared.config.share;
        let sp = match stored.map(|s| SharePartition::restore(&s, config)) {
            Some(Ok(sp)) => sp,
            Some(Err(why)) => {
                tracing::warn!(
                    group,
                    topic,
                    partition,
                    why,
                    "stored share state refused: starting afresh"
                );
                fresh(core, &log, topic, partition)
            }
            None => fresh(core, &log, topic, partition),
        };
        let mut parts = core.shares.parts.borrow_mut();
        // Another request may have loaded it meanwhile: the first stays.
        if parts.get(&k).is_none_or(|(e, _)| *e != epoch) {
            parts.insert(k.clone(), (epoch, sp));
        }
    }
    // Records retention removed can never be delivered.
    let start = log_start(core, &log, topic, partition);
    if let Some((_, sp)) = core.shares.parts.borrow_mut().get_mut(&k) {
        sp.truncate_below(start);
    }
    Ok(k)
}

/// Where a partition's records start: in the remote tier for a tiered
/// one (they are read from there), else the local log's start.
fn log_start(core: &Core, log: &weir_storage::PartitionLog, topic: &str, partition: u32) -> u64 {
    crate::tier::log_start(core, topic, partition, log.log_start_offset())
}

/// A share partition with nothing stored.
fn fresh(
    core: &Core,
    log: &weir_storage::PartitionLog,
    topic: &str,
    partition: u32,
) -> SharePartition {
    let start = if core.shared.config.share_from_earliest {
        log_start(core, log, topic, partition)
    } else {
        log.high_watermark()
    };
    SharePartition::new(start, core.shared.config.share)
}

/// A share state that could not be read or stored: retriable.
fn unavailable(k: &ShareKey, e: BrokerError) -> BrokerError {
    BrokerError::CoreUnavailable {
        core: 0,
        reason: format!(
            "the share state of {} on {}-{} is not available now ({e}): retry",
            k.group, k.topic, k.partition
        ),
    }
}

/// The share-store test hook: while the file this variable names
/// exists, every store of a share partition's state waits before it
/// writes (holding that partition's store line). For tests of what a
/// share request waits for; without the variable it costs nothing (read
/// once). Never set it on a production broker.
pub const STORE_GATE_ENV: &str = "WEIR_TEST_SHARE_STORE_GATE";

/// Waits while the share-store test hook's file exists ([`STORE_GATE_ENV`]).
async fn store_gate() {
    static GATE: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    while weir_storage::testing::file_hook_armed(&GATE, STORE_GATE_ENV) {
        glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Stores share partition `k`'s state, unless a store that finished
/// since covers change `seq` (then that store made it durable). The
/// snapshot is taken under the partition's store lock, so stores land in
/// the order of the changes.
async fn persist(
    core: &Rc<Core>,
    k: &ShareKey,
    seq: u64,
    epoch: u32,
    later: bool,
) -> Result<(), BrokerError> {
    let line = core.shares.store_line(k);
    let one = line.lock.acquire_permit(1).await;
    if later {
        // From here on a change needs another store.
        line.later_queued.set(false);
    }
    let _one =
        one.map_err(|_| unavailable(k, BrokerError::TimedOut("store lock closed".into())))?;
    // The change was made under the partition's leader epoch `epoch`: if
    // this core no longer leads it, or the share partition was loaded
    // again since (another leader served it meanwhile), its state is not
    // this core's to store, and the change may not be in it.
    let leading = match core.replication.get(&k.topic, k.partition) {
        Some(r) => r.check_leader().is_ok() && r.epoch() == epoch,
        None => true,
    };
    let current = core
        .shares
        .parts
        .borrow()
        .get(k)
        .is_some_and(|(e, _)| *e == epoch);
    if !leading || !current {
        return Err(unavailable(
            k,
            BrokerError::TimedOut("the partition's leadership moved before the store".into()),
        ));
    }
    if line.stored.get() >= seq {
        return Ok(());
    }
    let covers = line.changed.get();
    let snap = core
        .shares
        .parts
        .borrow()
        .get(k)
        .map(|(_, sp)| sp.snapshot());
    store_gate().await;
    if let Some(s) = snap {
        super::state::store(core, k, Some(&s))
            .await
            .map_err(|e| unavailable(k, e))?;
    }
    line.stored.set(line.stored.get().max(covers));
    Ok(())
}

/// Acquires records for `member` in each partition of its session;
/// whether any was acquired. Answers are added to (or merged into)
/// `answers`.
async fn acquire_all(
    core: &Rc<Core>,
    req: &ShareRequest,
    member: &Rc<str>,
    partitions: &BTreeSet<(String, u32)>,
    answers: &mut Vec<PartAnswer>,
) -> bool {
    let mut any = false;
    let mut budget = req.max_records;
    // Each fetch starts at another partition of the session (by its
    // epoch): one with a backlog does not starve the others of the
    // record budget.
    let all: Vec<&(String, u32)> = partitions.iter().collect();
    let first = if all.is_empty() {
        0
    } else {
        req.epoch.max(0) as usize % all.len()
    };
    for (topic, partition) in all[first..].iter().chain(all[..first].iter()).copied() {
        if budget == 0 {
            break;
        }
        let i = match answers
            .iter()
            .position(|a| a.topic == *topic && a.partition == *partition)
        {
            Some(i) => i,
            None => {
                answers.push(PartAnswer {
                    topic: topic.clone(),
                    partition: *partition,
                    ..Default::default()
                });
                answers.len() - 1
            }
        };
        if answers[i].error.is_some() || !answers[i].acquired.is_empty() {
            continue;
        }
        match acquire_one(
            core,
            &req.group,
            member,
            (topic, *partition),
            (budget, req.acquire_mode),
            req.max_bytes,
        )
        .await
        {
            Ok((batches, acquired)) => {
                let n: u64 = acquired.iter().map(|a| a.last - a.first + 1).sum();
                budget = budget.saturating_sub(n as usize);
                any |= !acquired.is_empty();
                answers[i].batches = batches;
                answers[i].acquired = acquired;
            }
            Err(e) => answers[i].error = Some(e),
        }
    }
    // Partitions with nothing to say are left out of an incremental answer.
    answers.retain(|a| a.error.is_some() || a.acked || !a.acquired.is_empty() || req.epoch == 0);
    any
}

/// Acquires up to `max_records` of one partition (about, or at most:
/// `mode`): the Available records
/// of its window, then new batches from the log.
async fn acquire_one(
    core: &Rc<Core>,
    group: &str,
    member: &Rc<str>,
    (topic, partition): (&str, u32),
    (max_records, mode): (usize, AcquireMode),
    max_bytes: u64,
) -> Result<(Vec<Bytes>, Vec<Acquired>), BrokerError> {
    let k = ensure(core, group, topic, partition).await?;
    let from = {
        let parts = core.shares.parts.borrow();
        let (_, sp) = &parts[&k];
        first_available(sp).unwrap_or(sp.end())
    };
    // From the remote tier below a tiered partition's local log start.
    let read =
        crate::tier::read::fetch_owned(core, topic, partition, from, max_bytes.max(1), 0).await;
    let batches = match read {
        Ok(f) => f.batches,
        // The window starts past the log's end (a reset, or a log cut
        // back): nothing to read now. Other storage failures (a remote
        // read that failed, a corrupt segment) are the partition's answer.
        Err(BrokerError::Storage {
            kind: crate::error::StorageFailure::OffsetOutOfRange,
            ..
        }) => Vec::new(),
        Err(e) => return Err(e),
    };
    let bounds: Vec<LogBatch> = batches
        .iter()
        .filter_map(|b| weir_proto::batch::BatchHeader::peek(b).ok())
        .map(|h| LogBatch {
            base: h.base_offset as u64,
            last: h.last_offset() as u64,
            control: h.attributes.is_control(),
        })
        .collect();
    let now = core.storage.now_ms();
    let acquired = {
        let mut parts = core.shares.parts.borrow_mut();
        let Some((_, sp)) = parts.get_mut(&k) else {
            return Ok((Vec::new(), Vec::new()));
        };
        sp.acquire_in(member, &bounds, max_records, mode, now)
    };
    // The batches holding an acquired record, as they are.
    let out: Vec<Bytes> = batches
        .into_iter()
        .zip(bounds.iter())
        .filter(|(_, b)| {
            acquired
                .iter()
                .any(|a| a.first <= b.last && b.base <= a.last)
        })
        .map(|(bytes, _)| bytes)
        .collect();
    Ok((out, acquired))
}

/// The first Available offset of the window.
fn first_available(sp: &SharePartition) -> Option<u64> {
    (sp.start()..sp.end()).find(|o| {
        sp.state_of(*o)
            .is_some_and(|(s, _)| s == RecordState::Available)
    })
}

/// Waits until a partition of the session has records past its share
/// partition's end, or `wait_ms`.
async fn wait_for_records(
    core: &Rc<Core>,
    group: &str,
    partitions: &BTreeSet<(String, u32)>,
    wait_ms: u32,
) {
    let wait_ms = wait_ms.min(crate::server::limits::FETCH_WAIT_MS_MAX);
    let sleep = || glommio::timer::sleep(std::time::Duration::from_millis(u64::from(wait_ms)));
    // A share partition whose window is full waits for its records to
    // free up (an acknowledgement, a release, an expiry), the others for
    // records past their end.
    let parts: Vec<crate::service::fetch::FetchPart> = partitions
        .iter()
        .filter_map(|(topic, partition)| {
            let k = key_of(group, topic, *partition);
            let end = core
                .shares
                .parts
                .borrow()
                .get(&k)
                .filter(|(_, sp)| sp.has_room())
                .map(|(_, sp)| sp.end())?;
            // A partition this core no longer owns, or whose window ends
            // past its log (cut back), would end the wait at once.
            let log = core.owned_log(topic, *partition).ok()?;
            if end > log.high_watermark() {
                return None;
            }
            Some(crate::service::fetch::FetchPart {
                topic: topic.clone(),
                partition: *partition,
                offset: end,
                max_bytes: 1,
            })
        })
        .collect();
    let (tx, rx) = futures_channel::oneshot::channel();
    if parts.len() < partitions.len() {
        let mut waiting = core.shares.waiting.borrow_mut();
        // (Those whose fetch has ended since go.)
        waiting.retain(|tx| !tx.is_canceled());
        waiting.push(tx);
    }
    let freed = async {
        // Never woken when no partition is full (its sender is dropped).
        if rx.await.is_err() {
            futures_lite::future::pending::<()>().await;
        }
    };
    if parts.is_empty() {
        futures_lite::future::or(freed, sleep()).await;
        return;
    }
    let params = crate::service::fetch::FetchParams {
        max_bytes: 1,
        min_bytes: 1,
        max_wait_ms: wait_ms,
        read_committed: false,
    };
    let arrived = async {
        let _ = crate::service::fetch::fetch(core, &parts, params, crate::service::Ctx::default())
            .await;
    };
    futures_lite::future::or(freed, arrived).await;
}

/// Every [`EXPIRY_CHECK_MS`]: releases the records whose locks expired,
/// and removes members whose sessions ended (of the groups this core
/// coordinates).
pub async fn expiry_loop(core: Rc<Core>) {
    while !core.shared.stopping() {
        glommio::timer::sleep(std::time::Duration::from_millis(EXPIRY_CHECK_MS)).await;
        let now = core.storage.now_ms();
        let mut expired = false;
        for (_, sp) in core.shares.parts.borrow_mut().values_mut() {
            // (`acquired` is kept, the deadline scan only where locks are.)
            if sp.acquired() > 0 && sp.next_deadline().is_some_and(|d| d <= now) {
                sp.expire(now);
                expired = true;
            }
        }
        expired |= drop_idle_sessions(&core, now);
        if expired {
            core.shares.wake();
        }
        let view = core.metadata();
        let partitions_of = |t: &str| view.get(t).map(|m| m.partitions());
        let mut groups = core.shares.groups.borrow_mut();
        for g in groups.values_mut() {
            if g.next_deadline().is_some_and(|d| d <= now) {
                g.expire(now, &partitions_of);
            }
        }
        groups.retain(|_, g| !g.is_empty());
    }
}

/// Drops the share sessions unused for [`SESSION_IDLE_MS`], releasing
/// what their members hold in them; whether it dropped one.
fn drop_idle_sessions(core: &Core, now: i64) -> bool {
    let idle: Vec<((String, String), Session)> = {
        let mut sessions = core.shares.sessions.borrow_mut();
        let keys: Vec<(String, String)> = sessions
            .iter()
            .filter(|(_, s)| now - s.used_ms >= SESSION_IDLE_MS)
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter()
            .filter_map(|k| sessions.remove(&k).map(|s| (k, s)))
            .collect()
    };
    let dropped = !idle.is_empty();
    let mut parts = core.shares.parts.borrow_mut();
    for ((group, member), s) in idle {
        for (topic, partition) in &s.partitions {
            if let Some((_, sp)) = parts.get_mut(&key_of(&group, topic, *partition)) {
                sp.release_member(&member);
            }
        }
    }
    dropped
}
