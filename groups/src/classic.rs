//! Kafka's classic consumer-group protocol (JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup) for **one** group, as a sans-I/O state machine.
//!
//! It follows Apache Kafka's `GroupMetadataManager` / `ClassicGroup` (the
//! KIP-848-era coordinator's classic path): the same states, the same
//! checks in the same order, the same error codes. It reads no clock and
//! does no I/O: every call takes `now_ms`, held requests are named by a
//! caller-chosen [`Token`], and answers come back as [`Output`]s.
//!
//! ## States
//! `Empty → PreparingRebalance → CompletingRebalance → Stable`, back to
//! `PreparingRebalance` on any membership or metadata change, to `Empty`
//! when a rebalance ends with nobody, and `Dead` once [`ClassicGroup::mark_dead`]
//! is called (unloaded or deleted). JoinGroup answers are held during
//! `PreparingRebalance`; followers' SyncGroup answers are held during
//! `CompletingRebalance` until the leader sends the assignment.
//!
//! ## Timers
//! One deadline per member or pending member (its session, or the
//! new-member join timeout), one for the join phase (rebalance timeout or
//! the initial delay) and one for the sync phase (rebalance timeout).
//! [`ClassicGroup::next_deadline`] says when to call [`ClassicGroup::tick`];
//! calling it late only delays expiry. Every timer that `tick` schedules
//! lies at least 1 ms after `now_ms` (or cannot fire twice), so one `tick`
//! always ends.
//!
//! ## Invariants
//! * the generation never decreases, and every increase marks the group
//!   dirty, so a caller that persists as described below never shows a
//!   client a generation a restart would take back;
//! * at most one member per `group.instance.id`;
//! * every held token is answered exactly once, unless [`ClassicGroup::cancel`]
//!   forgets it; held JoinGroups exist only in `PreparingRebalance`, held
//!   SyncGroups only in `CompletingRebalance`;
//! * the leader is a member whenever the group has members.
//!
//! ## Durability contract
//! Nothing here is durable by itself. After any call, if
//! [`ClassicGroup::take_dirty`] returns true (a generation began or
//! completed with its assignment, a member of a completed generation left or
//! expired, a static member was replaced, the group emptied), the caller
//! stores [`ClassicGroup::snapshot`] (encoded with [`Snapshot::encode`])
//! and only then releases that call's outputs. [`ClassicGroup::restore`]
//! rebuilds the group from the last stored snapshot; members get a fresh
//! session and held requests are gone (their connections went with the
//! process).
//!
//! ## Fault model
//! Inputs come from the network: every list and byte string is bounded by a
//! named constant and refused with `INVALID_REQUEST` beyond it; snapshot
//! decoding never panics and refuses anything inconsistent. A broken
//! invariant of the caller (a token reused while held, a `fresh_id` that
//! repeats) is an `assert!`.
//!
//! ## Left out
//! KIP-814's `skip_assignment` (JoinGroup v9+): a replaced static leader is
//! answered as Kafka answers pre-v9 clients. Join reasons, metrics and
//! DescribeGroups formatting are the caller's.

#![warn(missing_docs)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

use crate::limits::{
    ASSIGNMENT_BYTES_MAX, CLASSIC_MEMBER_ID_BYTES_MAX, FRESH_ID_BYTES_MAX, GROUP_MEMBERS_MAX,
    LEAVE_MEMBERS_MAX, MEMBER_METADATA_BYTES_MAX, NAME_BYTES_MAX, PROTOCOLS_MAX,
    REBALANCE_TIMEOUT_MS_MIN,
};

/// Names one held request (a JoinGroup or SyncGroup waiting for its answer).
pub type Token = u64;

/// The snapshot layout version [`Snapshot::encode`] writes.
pub const SNAPSHOT_VERSION: u8 = 1;

/// Group settings (Kafka's `group.*` broker configs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of
    /// an empty group waits for more members (extended while they arrive,
    /// up to the rebalance timeout).
    pub initial_rebalance_delay_ms: u64,
    /// `group.max.size`: most members; at least 1, at most [`GROUP_MEMBERS_MAX`].
    pub max_size: usize,
    /// `group.min.session.timeout.ms`; at least 1.
    pub session_timeout_min_ms: u32,
    /// `group.max.session.timeout.ms`.
    pub session_timeout_max_ms: u32,
    /// How long a new member's first held JoinGroup may wait before the
    /// member is dropped (Kafka's fixed 5 minutes); at least 1.
    pub new_member_join_timeout_ms: u64,
}

impl Default for Config {
    /// Kafka's defaults, with `max_size` capped at [`GROUP_MEMBERS_MAX`].
    fn default() -> Self {
        Config {
            initial_rebalance_delay_ms: 3_000,
            max_size: GROUP_MEMBERS_MAX,
            session_timeout_min_ms: 6_000,
            session_timeout_max_ms: 1_800_000,
            new_member_join_timeout_ms: 300_000,
        }
    }
}

/// The group's state (Kafka's `ClassicGroupState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// No members (offsets may remain).
    Empty,
    /// Waiting for members to (re)join.
    PreparingRebalance,
    /// Joined; waiting for the leader's assignment.
    CompletingRebalance,
    /// Assignment handed out.
    Stable,
    /// Unloaded or deleted; every request is refused.
    Dead,
}

impl State {
    /// The name Kafka reports (DescribeGroups, ListGroups).
    pub fn name(self) -> &'static str {
        match self {
            State::Empty => "Empty",
            State::PreparingRebalance => "PreparingRebalance",
            State::CompletingRebalance => "CompletingRebalance",
            State::Stable => "Stable",
            State::Dead => "Dead",
        }
    }
}

/// Why a request was refused; each maps to one Kafka error code.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClassicError {
    /// UNKNOWN_MEMBER_ID (25).
    UnknownMemberId,
    /// ILLEGAL_GENERATION (22).
    IllegalGeneration {
        /// The group's generation.
        current: i32,
        /// The generation the request named.
        requested: i32,
    },
    /// REBALANCE_IN_PROGRESS (27).
    RebalanceInProgress,
    /// MEMBER_ID_REQUIRED (79): rejoin with the member id in the response.
    MemberIdRequired,
    /// FENCED_INSTANCE_ID (82).
    FencedInstanceId,
    /// INCONSISTENT_GROUP_PROTOCOL (23).
    InconsistentGroupProtocol,
    /// GROUP_MAX_SIZE_REACHED (81).
    GroupMaxSizeReached {
        /// The configured maximum.
        max_size: usize,
    },
    /// INVALID_SESSION_TIMEOUT (26).
    InvalidSessionTimeout {
        /// What the member asked for.
        requested_ms: u32,
        /// The configured minimum.
        min_ms: u32,
        /// The configured maximum.
        max_ms: u32,
    },
    /// COORDINATOR_NOT_AVAILABLE (15): the group is dead.
    CoordinatorNotAvailable,
    /// NOT_COORDINATOR (16): the group was unloaded while the request waited.
    NotCoordinator,
    /// INVALID_REQUEST (42): a list or string over its bound.
    InvalidRequest {
        /// Which bound.
        reason: &'static str,
    },
}

impl ClassicError {
    /// The Kafka protocol error code.
    pub fn kafka_code(&self) -> i16 {
        match self {
            ClassicError::UnknownMemberId => 25,
            ClassicError::IllegalGeneration { .. } => 22,
            ClassicError::RebalanceInProgress => 27,
            ClassicError::MemberIdRequired => 79,
            ClassicError::FencedInstanceId => 82,
            ClassicError::InconsistentGroupProtocol => 23,
            ClassicError::GroupMaxSizeReached { .. } => 81,
            ClassicError::InvalidSessionTimeout { .. } => 26,
            ClassicError::CoordinatorNotAvailable => 15,
            ClassicError::NotCoordinator => 16,
            ClassicError::InvalidRequest { .. } => 42,
        }
    }

    /// A sentence for humans (the response's error message, logs).
    pub fn message(&self) -> String {
        match self {
            ClassicError::UnknownMemberId => {
                "The member id is not a member of this group; rejoin with an empty member id.".into()
            }
            ClassicError::IllegalGeneration { current, requested } => format!(
                "The request is for generation {requested} but the group is at generation {current}; rejoin the group."
            ),
            ClassicError::RebalanceInProgress => {
                "The group is rebalancing; rejoin to take part in the new generation.".into()
            }
            ClassicError::MemberIdRequired => {
                "A member id was assigned; send JoinGroup again with it.".into()
            }
            ClassicError::FencedInstanceId => {
                "A newer member holds this group.instance.id; this one is fenced.".into()
            }
            ClassicError::InconsistentGroupProtocol => {
                "The protocol type or protocols do not match what the group's members support.".into()
            }
            ClassicError::GroupMaxSizeReached { max_size } => {
                format!("The group already has its maximum of {max_size} members.")
            }
            ClassicError::InvalidSessionTimeout {
                requested_ms,
                min_ms,
                max_ms,
            } => format!(
                "Session timeout {requested_ms} ms is outside the broker's range [{min_ms}, {max_ms}] ms."
            ),
            ClassicError::CoordinatorNotAvailable => {
                "The group is not available on this coordinator; find the coordinator again.".into()
            }
            ClassicError::NotCoordinator => {
                "This broker stopped coordinating the group; find the coordinator again.".into()
            }
            ClassicError::InvalidRequest { reason } => format!("Invalid request: {reason}."),
        }
    }
}

impl fmt::Display for ClassicError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for ClassicError {}

/// A JoinGroup request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinRequest {
    /// Empty on a first join.
    pub member_id: String,
    /// `group.instance.id` of a static member.
    pub group_instance_id: Option<String>,
    /// The request header's client id.
    pub client_id: String,
    /// The client's address.
    pub client_host: String,
    /// Usually `consumer`.
    pub protocol_type: String,
    /// (name, metadata), most preferred first. A repeated name is ignored.
    pub protocols: Vec<(String, Bytes)>,
    /// How long the member may go without a heartbeat.
    pub session_timeout_ms: u32,
    /// How long a rebalance waits for this member (v0 callers pass the
    /// session timeout, as Kafka does).
    pub rebalance_timeout_ms: u32,
    /// JoinGroup v4+: a new dynamic member first gets MEMBER_ID_REQUIRED.
    pub require_known_member_id: bool,
}

/// One member as the leader sees it in its JoinGroup answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinedMember {
    /// Member id.
    pub member_id: String,
    /// Its `group.instance.id`.
    pub group_instance_id: Option<String>,
    /// Its metadata for the chosen protocol.
    pub metadata: Bytes,
}

/// A JoinGroup answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinResponse {
    /// `None` on success.
    pub error: Option<ClassicError>,
    /// The generation joined (-1 on error).
    pub generation_id: i32,
    /// The group's protocol type.
    pub protocol_type: Option<String>,
    /// The chosen protocol.
    pub protocol_name: Option<String>,
    /// The leader's member id (empty on error).
    pub leader: String,
    /// The member's id (the new one with MEMBER_ID_REQUIRED).
    pub member_id: String,
    /// Every member with its metadata, for the leader only.
    pub members: Vec<JoinedMember>,
}

impl JoinResponse {
    fn error(member_id: String, error: ClassicError) -> Self {
        JoinResponse {
            error: Some(error),
            generation_id: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            member_id,
            members: Vec::new(),
        }
    }
}

/// A SyncGroup request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncRequest {
    /// Member id.
    pub member_id: String,
    /// `group.instance.id` of a static member.
    pub group_instance_id: Option<String>,
    /// The generation from JoinGroup.
    pub generation_id: i32,
    /// v5+: checked against the group's when present.
    pub protocol_type: Option<String>,
    /// v5+: checked against the group's when present.
    pub protocol_name: Option<String>,
    /// (member id, assignment), sent by the leader only.
    pub assignments: Vec<(String, Bytes)>,
}

/// A SyncGroup answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncResponse {
    /// `None` on success.
    pub error: Option<ClassicError>,
    /// The group's protocol type (on success).
    pub protocol_type: Option<String>,
    /// The chosen protocol (on success).
    pub protocol_name: Option<String>,
    /// The member's assignment (empty on error).
    pub assignment: Bytes,
}

impl SyncResponse {
    fn error(error: ClassicError) -> Self {
        SyncResponse {
            error: Some(error),
            protocol_type: None,
            protocol_name: None,
            assignment: Bytes::new(),
        }
    }
}

/// An answer to a request, immediate or released from hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Answer to the JoinGroup given this token.
    Join(Token, JoinResponse),
    /// Answer to the SyncGroup given this token.
    Sync(Token, SyncResponse),
}

impl Output {
    /// The token answered.
    pub fn token(&self) -> Token {
        match self {
            Output::Join(t, _) | Output::Sync(t, _) => *t,
        }
    }
}

/// A member, as DescribeGroups shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberView<'a> {
    /// Member id.
    pub member_id: &'a str,
    /// `group.instance.id`.
    pub group_instance_id: Option<&'a str>,
    /// Client id.
    pub client_id: &'a str,
    /// Client host.
    pub client_host: &'a str,
    /// Session timeout.
    pub session_timeout_ms: u32,
    /// Rebalance timeout.
    pub rebalance_timeout_ms: u32,
    /// Last assignment (empty until the leader's SyncGroup).
    pub assignment: &'a Bytes,
    /// Metadata for the chosen protocol, if one is chosen and supported.
    pub metadata: Option<&'a Bytes>,
}

// ---------------------------------------------------------------------------
// Internals

/// A held request. `Held(None)`: its connection went away ([`ClassicGroup::cancel`])
/// but, as in Kafka, the request still counts (joined / awaiting sync).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Wait {
    #[default]
    No,
    Held(Option<Token>),
}

impl Wait {
    fn is_held(self) -> bool {
        matches!(self, Wait::Held(_))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Join,
    Sync,
}

#[derive(Clone, Debug)]
struct Member {
    id: String,
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout_ms: u32,
    rebalance_timeout_ms: u32,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    /// Added during the current join phase (Kafka's `isNew`): its session
    /// is the new-member join timeout, waiting does not keep it alive, and
    /// it is not part of a snapshot.
    is_new: bool,
    join: Wait,
    sync: Wait,
}

impl Member {
    fn metadata(&self, protocol: &str) -> Option<&Bytes> {
        self.protocols
            .iter()
            .find(|(name, _)| name == protocol)
            .map(|(_, m)| m)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum TimerKey {
    Join,
    Sync,
    /// A member's or pending member's session (Kafka's heartbeat key).
    Session(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JoinTimer {
    /// Kafka's `InitialDelayedJoin`.
    Initial { delay_ms: u64, remaining_ms: u64 },
    /// Rebalance timeout.
    Rebalance,
}

#[derive(Clone, Debug, Default)]
struct Timers {
    queue: BTreeSet<(u64, TimerKey)>,
    at: HashMap<TimerKey, u64>,
}

impl Timers {
    fn schedule(&mut self, key: TimerKey, at: u64) {
        if let Some(old) = self.at.insert(key.clone(), at) {
            self.queue.remove(&(old, key.clone()));
        }
        self.queue.insert((at, key));
    }

    fn cancel(&mut self, key: &TimerKey) {
        if let Some(old) = self.at.remove(key) {
            self.queue.remove(&(old, key.clone()));
        }
    }

    fn next(&self) -> Option<u64> {
        self.queue.first().map(|(at, _)| *at)
    }

    fn pop_due(&mut self, now_ms: u64) -> Option<TimerKey> {
        if self.next()? > now_ms {
            return None;
        }
        let (_, key) = self.queue.pop_first()?;
        self.at.remove(&key);
        Some(key)
    }

    fn clear(&mut self) {
        self.queue.clear();
        self.at.clear();
    }
}

fn check_len(s: &str, max: usize, reason: &'static str) -> Result<(), ClassicError> {
    if s.len() > max {
        return Err(ClassicError::InvalidRequest { reason });
    }
    Ok(())
}

fn check_join(req: &JoinRequest) -> Result<(), ClassicError> {
    if req.protocols.len() > PROTOCOLS_MAX {
        return Err(ClassicError::InvalidRequest {
            reason: "more than PROTOCOLS_MAX protocols",
        });
    }
    let metadata: usize = req.protocols.iter().map(|(_, m)| m.len()).sum();
    if metadata > MEMBER_METADATA_BYTES_MAX {
        return Err(ClassicError::InvalidRequest {
            reason: "protocol metadata over MEMBER_METADATA_BYTES_MAX",
        });
    }
    check_len(
        &req.member_id,
        CLASSIC_MEMBER_ID_BYTES_MAX,
        "member id over CLASSIC_MEMBER_ID_BYTES_MAX",
    )?;
    let long_name = "a name over NAME_BYTES_MAX";
    check_len(&req.client_id, NAME_BYTES_MAX, long_name)?;
    check_len(&req.client_host, NAME_BYTES_MAX, long_name)?;
    check_len(&req.protocol_type, NAME_BYTES_MAX, long_name)?;
    for (name, _) in &req.protocols {
        check_len(name, NAME_BYTES_MAX, long_name)?;
    }
    if let Some(instance) = &req.group_instance_id {
        check_len(instance, NAME_BYTES_MAX, long_name)?;
        if instance.is_empty() {
            return Err(ClassicError::InvalidRequest {
                reason: "empty group.instance.id",
            });
        }
    }
    Ok(())
}

/// Keeps the first of each protocol name (Kafka counts support per entry;
/// a repeated name would count twice).
fn dedupe_protocols(protocols: &mut Vec<(String, Bytes)>) {
    let mut seen = BTreeSet::new();
    protocols.retain(|(name, _)| seen.insert(name.clone()));
}

fn inconsistent(requested: Option<&str>, group: Option<&str>) -> bool {
    matches!((requested, group), (Some(r), Some(g)) if r != g)
}

/// One classic consumer group.
#[derive(Clone, Debug)]
pub struct ClassicGroup {
    config: Config,
    state: State,
    /// `PreparingRebalance` was entered from `Empty` (Kafka's
    /// `previousState == EMPTY`): the join phase ends only by its timer.
    initial_rebalance: bool,
    /// A member was added during the initial delay (Kafka's `newMemberAdded`).
    new_member_added: bool,
    generation: i32,
    protocol_type: Option<String>,
    protocol_name: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// group.instance.id → member id.
    static_members: BTreeMap<String, String>,
    /// Ids handed out with MEMBER_ID_REQUIRED, not yet joined.
    pending_members: BTreeSet<String>,
    /// Members of this generation that have not sent SyncGroup.
    pending_sync: BTreeSet<String>,
    /// Members whose `join` is held.
    awaiting_join: usize,
    /// Protocol name → how many members list it.
    supported: HashMap<String, usize>,
    /// Every live token, and whose request it is.
    held: HashMap<Token, (Kind, String)>,
    timers: Timers,
    join_timer: JoinTimer,
    sync_generation: i32,
    dirty: bool,
}

impl ClassicGroup {
    /// A new, empty group at generation 0.
    ///
    /// # Panics
    /// If `config` is out of range (see [`Config`]'s fields).
    pub fn new(config: Config) -> Self {
        assert!(
            (1..=GROUP_MEMBERS_MAX).contains(&config.max_size),
            "max_size must be in 1..=GROUP_MEMBERS_MAX"
        );
        assert!(config.session_timeout_min_ms >= 1);
        assert!(config.session_timeout_min_ms <= config.session_timeout_max_ms);
        assert!(config.new_member_join_timeout_ms >= 1);
        ClassicGroup {
            config,
            state: State::Empty,
            initial_rebalance: false,
            new_member_added: false,
            generation: 0,
            protocol_type: None,
            protocol_name: None,
            leader: None,
            members: BTreeMap::new(),
            static_members: BTreeMap::new(),
            pending_members: BTreeSet::new(),
            pending_sync: BTreeSet::new(),
            awaiting_join: 0,
            supported: HashMap::new(),
            held: HashMap::new(),
            timers: Timers::default(),
            join_timer: JoinTimer::Rebalance,
            sync_generation: 0,
            dirty: false,
        }
    }

    // ----- accessors -----------------------------------------------------

    /// Current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Current generation (0 before the first rebalance).
    pub fn generation(&self) -> i32 {
        self.generation
    }

    /// The group's protocol type (kept while `Empty`, as Kafka does).
    pub fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }

    /// The protocol chosen for the current generation.
    pub fn protocol_name(&self) -> Option<&str> {
        self.protocol_name.as_deref()
    }

    /// The leader's member id.
    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }

    /// Members in member-id order (pending members are not members).
    pub fn members(&self) -> impl Iterator<Item = MemberView<'_>> + '_ {
        let protocol = self.protocol_name.as_deref();
        self.members.values().map(move |m| MemberView {
            member_id: &m.id,
            group_instance_id: m.instance_id.as_deref(),
            client_id: &m.client_id,
            client_host: &m.client_host,
            session_timeout_ms: m.session_timeout_ms,
            rebalance_timeout_ms: m.rebalance_timeout_ms,
            assignment: &m.assignment,
            metadata: protocol.and_then(|p| m.metadata(p)),
        })
    }

    /// How many requests are held (tokens not yet answered or cancelled).
    pub fn held_requests(&self) -> usize {
        self.held.len()
    }

    /// Whether durable state changed since the last call (see the module's
    /// durability contract); resets the flag.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// When [`ClassicGroup::tick`] should next be called.
    pub fn next_deadline(&self) -> Option<u64> {
        if self.state == State::Dead {
            return None;
        }
        self.timers.next()
    }

    // ----- requests ------------------------------------------------------

    /// Handles a JoinGroup. The answer for `token` is in the outputs now, or
    /// comes later from another call; other held requests may be released.
    /// `fresh_id` is called at most once, for a new member id's unique part
    /// (a UUID in production).
    ///
    /// # Panics
    /// If `token` is already held, or `fresh_id` returns more than
    /// [`FRESH_ID_BYTES_MAX`] bytes or an id already in use.
    pub fn join(
        &mut self,
        now_ms: u64,
        token: Token,
        mut req: JoinRequest,
        fresh_id: impl FnOnce() -> String,
    ) -> Vec<Output> {
        assert!(
            !self.held.contains_key(&token),
            "token {token} is already held"
        );
        let mut out = Vec::new();
        if let Err(e) = check_join(&req) {
            out.push(Output::Join(token, JoinResponse::error(req.member_id, e)));
            return out;
        }
        dedupe_protocols(&mut req.protocols);
        if req.session_timeout_ms < self.config.session_timeout_min_ms
            || req.session_timeout_ms > self.config.session_timeout_max_ms
        {
            let e = ClassicError::InvalidSessionTimeout {
                requested_ms: req.session_timeout_ms,
                min_ms: self.config.session_timeout_min_ms,
                max_ms: self.config.session_timeout_max_ms,
            };
            out.push(Output::Join(token, JoinResponse::error(req.member_id, e)));
            return out;
        }
        if self.state == State::Dead {
            let e = ClassicError::CoordinatorNotAvailable;
            out.push(Output::Join(token, JoinResponse::error(req.member_id, e)));
            return out;
        }
        if !self.accepts_joining(&req) {
            // Kafka removes a refused known member (it is not awaiting join).
            if self.members.contains_key(&req.member_id)
                || self.pending_members.contains(&req.member_id)
            {
                self.remove_member(&req.member_id, &mut out);
            }
            let e = ClassicError::GroupMaxSizeReached {
                max_size: self.config.max_size,
            };
            out.push(Output::Join(token, JoinResponse::error(String::new(), e)));
            return out;
        }
        if req.member_id.is_empty() {
            self.join_new_member(now_ms, token, req, fresh_id, &mut out);
        } else {
            self.join_existing_member(now_ms, token, req, &mut out);
        }
        out
    }

    /// Handles a SyncGroup. The answer for `token` is in the outputs now
    /// (errors, the leader, any member once Stable) or when the leader syncs.
    ///
    /// # Panics
    /// If `token` is already held.
    pub fn sync(&mut self, now_ms: u64, token: Token, req: SyncRequest) -> Vec<Output> {
        assert!(
            !self.held.contains_key(&token),
            "token {token} is already held"
        );
        let mut out = Vec::new();
        if let Err(e) = self.check_sync(&req) {
            out.push(Output::Sync(token, SyncResponse::error(e)));
            return out;
        }
        if self.state == State::Empty {
            let e = ClassicError::UnknownMemberId;
            out.push(Output::Sync(token, SyncResponse::error(e)));
            return out;
        }
        if let Err(e) = self.validate_sync(&req) {
            out.push(Output::Sync(token, SyncResponse::error(e)));
            return out;
        }
        let id = req.member_id;
        match self.state {
            State::PreparingRebalance => {
                let e = ClassicError::RebalanceInProgress;
                out.push(Output::Sync(token, SyncResponse::error(e)));
            }
            State::CompletingRebalance => {
                self.hold_sync(&id, token, &mut out);
                self.remove_pending_sync(&id);
                if self.leader.as_deref() == Some(id.as_str()) {
                    let assignments: HashMap<String, Bytes> = req.assignments.into_iter().collect();
                    for m in self.members.values_mut() {
                        m.assignment = assignments.get(&m.id).cloned().unwrap_or_default();
                    }
                    self.propagate_assignment(now_ms, None, &mut out);
                    self.state = State::Stable;
                    self.dirty = true;
                }
            }
            State::Stable => {
                self.remove_pending_sync(&id);
                let m = &self.members[&id];
                out.push(Output::Sync(
                    token,
                    SyncResponse {
                        error: None,
                        protocol_type: self.protocol_type.clone(),
                        protocol_name: self.protocol_name.clone(),
                        assignment: m.assignment.clone(),
                    },
                ));
            }
            State::Empty | State::Dead => unreachable!("checked above"),
        }
        out
    }

    /// Handles a Heartbeat (always answered at once).
    pub fn heartbeat(
        &mut self,
        now_ms: u64,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
    ) -> Result<(), ClassicError> {
        if self.state == State::Dead {
            return Err(ClassicError::CoordinatorNotAvailable);
        }
        self.validate_member(member_id, instance_id)?;
        if generation != self.generation {
            return Err(ClassicError::IllegalGeneration {
                current: self.generation,
                requested: generation,
            });
        }
        match self.state {
            State::Empty => Err(ClassicError::UnknownMemberId),
            State::PreparingRebalance => {
                self.reschedule_session(now_ms, member_id);
                Err(ClassicError::RebalanceInProgress)
            }
            State::CompletingRebalance | State::Stable => {
                self.reschedule_session(now_ms, member_id);
                Ok(())
            }
            State::Dead => unreachable!("checked above"),
        }
    }

    /// Handles a LeaveGroup (v3+ batch): one result per (member id,
    /// group instance id), in order. An empty member id with an instance id
    /// removes that static member (admin removal). On a dead group every
    /// result is COORDINATOR_NOT_AVAILABLE (Kafka's top-level error).
    pub fn leave(
        &mut self,
        now_ms: u64,
        members: &[(String, Option<String>)],
    ) -> (Vec<Result<(), ClassicError>>, Vec<Output>) {
        let mut out = Vec::new();
        if members.len() > LEAVE_MEMBERS_MAX {
            let e = ClassicError::InvalidRequest {
                reason: "more than LEAVE_MEMBERS_MAX members",
            };
            return (vec![Err(e); members.len()], out);
        }
        if self.state == State::Dead {
            let e = ClassicError::CoordinatorNotAvailable;
            return (vec![Err(e); members.len()], out);
        }
        let mut results = Vec::with_capacity(members.len());
        for (member_id, instance_id) in members {
            let result = if member_id.is_empty() {
                match instance_id
                    .as_ref()
                    .and_then(|i| self.static_members.get(i))
                {
                    Some(id) => {
                        let id = id.clone();
                        self.remove_member(&id, &mut out);
                        Ok(())
                    }
                    None => Err(ClassicError::UnknownMemberId),
                }
            } else if self.pending_members.contains(member_id) {
                self.remove_member(member_id, &mut out);
                Ok(())
            } else {
                match self.validate_member(member_id, instance_id.as_deref()) {
                    Ok(()) => {
                        self.remove_member(member_id, &mut out);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            };
            results.push(result);
        }
        if results.iter().any(Result::is_ok) {
            match self.state {
                State::Stable | State::CompletingRebalance => {
                    self.maybe_prepare_rebalance_or_complete_join(now_ms, &mut out)
                }
                State::PreparingRebalance => self.maybe_complete_join_phase(now_ms, &mut out),
                State::Empty | State::Dead => {}
            }
        }
        (results, out)
    }

    /// Fires every timer due at `now_ms`: expired sessions and pending
    /// members, the end of the join phase (rebalance timeout or initial
    /// delay), the sync deadline. Returns the answers released.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Output> {
        let mut out = Vec::new();
        if self.state == State::Dead {
            return out;
        }
        // Ends: timers scheduled here lie at now_ms + 1 or later, except the
        // initial-delay timer with a zero delay, which clears
        // `new_member_added` before it reschedules itself.
        while let Some(key) = self.timers.pop_due(now_ms) {
            match key {
                TimerKey::Join => self.on_join_timer(now_ms, &mut out),
                TimerKey::Sync => self.expire_pending_sync(now_ms, &mut out),
                TimerKey::Session(id) => self.expire_session(now_ms, &id, &mut out),
            }
        }
        out
    }

    /// The connection waiting on `token` went away: its answer will not be
    /// produced. The request still counts (the member stays joined or
    /// awaiting sync) and the member stays until its session expires, as in
    /// Kafka. An unknown token is ignored.
    pub fn cancel(&mut self, token: Token) {
        let Some((kind, id)) = self.held.remove(&token) else {
            return;
        };
        let m = self
            .members
            .get_mut(&id)
            .expect("a held token belongs to a member");
        let wait = match kind {
            Kind::Join => &mut m.join,
            Kind::Sync => &mut m.sync,
        };
        assert_eq!(*wait, Wait::Held(Some(token)));
        *wait = Wait::Held(None);
    }

    /// Kafka's OffsetCommit check for a classic group (non-transactional).
    /// Allowed: a negative generation while `Empty` (admin or simple
    /// consumer); otherwise a current member (and instance id) with the
    /// exact generation, while `Stable` or `PreparingRebalance` — Kafka
    /// answers REBALANCE_IN_PROGRESS in `CompletingRebalance` only, so
    /// members can commit before rejoining.
    pub fn validate_commit(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
    ) -> Result<(), ClassicError> {
        if self.state == State::Dead {
            return Err(ClassicError::CoordinatorNotAvailable);
        }
        if generation < 0 && self.state == State::Empty {
            return Ok(());
        }
        if generation >= 0 || !member_id.is_empty() || instance_id.is_some() {
            self.validate_member(member_id, instance_id)?;
            if generation != self.generation {
                return Err(ClassicError::IllegalGeneration {
                    current: self.generation,
                    requested: generation,
                });
            }
        } else if self.state != State::Empty {
            return Err(ClassicError::UnknownMemberId);
        }
        if self.state == State::CompletingRebalance {
            return Err(ClassicError::RebalanceInProgress);
        }
        Ok(())
    }

    /// The group was unloaded or deleted: held JoinGroups and SyncGroups are
    /// answered NOT_COORDINATOR (as Kafka's `onUnloaded`), timers stop, and
    /// every later request is refused with COORDINATOR_NOT_AVAILABLE.
    pub fn mark_dead(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let e = ClassicError::NotCoordinator;
            self.answer_join(&id, JoinResponse::error(id.clone(), e.clone()), &mut out);
            self.answer_sync(&id, SyncResponse::error(e), &mut out);
        }
        self.timers.clear();
        self.state = State::Dead;
        out
    }

    // ----- snapshot --------------------------------------------------------

    /// The group's durable state: generation, protocol, leader and the
    /// members of completed generations with their assignments (members
    /// still joining for the first time are left out).
    pub fn snapshot(&self) -> Snapshot {
        let protocol = self.protocol_name.as_deref();
        let members: Vec<SnapshotMember> = self
            .members
            .values()
            .filter(|m| !m.is_new)
            .map(|m| SnapshotMember {
                member_id: m.id.clone(),
                group_instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                session_timeout_ms: m.session_timeout_ms,
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                metadata: protocol
                    .and_then(|p| m.metadata(p))
                    .cloned()
                    .unwrap_or_default(),
                assignment: m.assignment.clone(),
            })
            .collect();
        if members.is_empty() {
            return Snapshot {
                generation: self.generation,
                state: SnapshotState::Empty,
                protocol_type: self.protocol_type.clone(),
                protocol_name: None,
                leader: None,
                members,
            };
        }
        let state = match self.state {
            State::Stable => SnapshotState::Stable,
            State::CompletingRebalance => SnapshotState::CompletingRebalance,
            State::Empty | State::PreparingRebalance | State::Dead => {
                SnapshotState::PreparingRebalance
            }
        };
        let leader = match &self.leader {
            Some(l) if members.iter().any(|m| &m.member_id == l) => l.clone(),
            _ => members[0].member_id.clone(),
        };
        Snapshot {
            generation: self.generation,
            state,
            protocol_type: self.protocol_type.clone(),
            protocol_name: Some(
                self.protocol_name
                    .clone()
                    .expect("members of a completed generation imply a chosen protocol"),
            ),
            leader: Some(leader),
            members,
        }
    }

    /// Rebuilds a group from a snapshot. Members get a session starting at
    /// `now_ms`; a snapshot taken while rebalancing (or with more members
    /// than `config.max_size`) restarts the rebalance; one taken while
    /// completing waits for SyncGroups again.
    ///
    /// # Panics
    /// If the snapshot is inconsistent ([`Snapshot::decode`] never returns
    /// one) or `config` is out of range.
    pub fn restore(snapshot: Snapshot, config: Config, now_ms: u64) -> Self {
        if let Err(e) = snapshot.check() {
            panic!("restore of an inconsistent snapshot: {e}");
        }
        let mut g = ClassicGroup::new(config);
        g.generation = snapshot.generation;
        g.protocol_type = snapshot.protocol_type;
        if snapshot.members.is_empty() {
            return g;
        }
        let protocol = snapshot
            .protocol_name
            .expect("checked: members imply a protocol");
        for sm in snapshot.members {
            if let Some(i) = &sm.group_instance_id {
                g.static_members.insert(i.clone(), sm.member_id.clone());
            }
            *g.supported.entry(protocol.clone()).or_default() += 1;
            g.timers.schedule(
                TimerKey::Session(sm.member_id.clone()),
                now_ms.saturating_add(u64::from(sm.session_timeout_ms)),
            );
            let m = Member {
                id: sm.member_id,
                instance_id: sm.group_instance_id,
                client_id: sm.client_id,
                client_host: sm.client_host,
                session_timeout_ms: sm.session_timeout_ms,
                rebalance_timeout_ms: sm.rebalance_timeout_ms,
                protocols: vec![(protocol.clone(), sm.metadata)],
                assignment: sm.assignment,
                is_new: false,
                join: Wait::No,
                sync: Wait::No,
            };
            g.members.insert(m.id.clone(), m);
        }
        g.protocol_name = Some(protocol);
        g.leader = snapshot.leader;
        g.state = State::Stable;
        let mut out = Vec::new();
        match snapshot.state {
            SnapshotState::Stable | SnapshotState::Empty => {}
            SnapshotState::CompletingRebalance => {
                g.state = State::CompletingRebalance;
                g.pending_sync = g.members.keys().cloned().collect();
                g.schedule_sync(now_ms);
            }
            SnapshotState::PreparingRebalance => g.prepare_rebalance(now_ms, &mut out),
        }
        if g.members.len() > g.config.max_size && g.state != State::PreparingRebalance {
            g.prepare_rebalance(now_ms, &mut out);
        }
        assert!(out.is_empty(), "a restored group holds no requests");
        g.dirty = false;
        g
    }

    // ----- join internals ------------------------------------------------------

    /// Kafka's `acceptJoiningMember`, except that a static member replacing
    /// its own old member id is never refused for size (it adds nobody).
    fn accepts_joining(&self, req: &JoinRequest) -> bool {
        let replaces_static = req.member_id.is_empty()
            && req
                .group_instance_id
                .as_ref()
                .is_some_and(|i| self.static_members.contains_key(i));
        let max = self.config.max_size;
        match self.state {
            State::Empty | State::Dead => true,
            State::PreparingRebalance => {
                replaces_static
                    || self
                        .members
                        .get(&req.member_id)
                        .is_some_and(|m| m.join.is_held())
                    || self.awaiting_join < max
            }
            State::CompletingRebalance | State::Stable => {
                replaces_static
                    || self.members.contains_key(&req.member_id)
                    || self.members.len() < max
            }
        }
    }

    fn supports_protocols(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.state == State::Empty {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols.iter().any(|(name, _)| {
                self.supported.get(name).copied().unwrap_or(0) == self.members.len()
            })
    }

    fn new_member_id(&self, prefix: &str, fresh_id: impl FnOnce() -> String) -> String {
        let fresh = fresh_id();
        assert!(
            fresh.len() <= FRESH_ID_BYTES_MAX,
            "fresh_id over FRESH_ID_BYTES_MAX"
        );
        let id = format!("{prefix}-{fresh}");
        assert!(
            !self.members.contains_key(&id) && !self.pending_members.contains(&id),
            "fresh_id repeated an id in use: {id}"
        );
        id
    }

    fn join_new_member(
        &mut self,
        now_ms: u64,
        token: Token,
        req: JoinRequest,
        fresh_id: impl FnOnce() -> String,
        out: &mut Vec<Output>,
    ) {
        if !self.supports_protocols(&req.protocol_type, &req.protocols) {
            let e = ClassicError::InconsistentGroupProtocol;
            out.push(Output::Join(token, JoinResponse::error(String::new(), e)));
            return;
        }
        if let Some(instance) = req.group_instance_id.clone() {
            let new_id = self.new_member_id(&instance, fresh_id);
            match self.static_members.get(&instance).cloned() {
                Some(old_id) => self.update_static_member(now_ms, token, req, &old_id, new_id, out),
                None => self.add_member_then_rebalance(now_ms, token, req, new_id, out),
            }
        } else if req.require_known_member_id {
            if self.pending_members.len() >= self.config.max_size {
                // Not in Kafka: pending ids are bounded like members.
                let e = ClassicError::GroupMaxSizeReached {
                    max_size: self.config.max_size,
                };
                out.push(Output::Join(token, JoinResponse::error(String::new(), e)));
                return;
            }
            let new_id = self.new_member_id(&req.client_id, fresh_id);
            self.pending_members.insert(new_id.clone());
            self.timers.schedule(
                TimerKey::Session(new_id.clone()),
                now_ms.saturating_add(u64::from(req.session_timeout_ms)),
            );
            let e = ClassicError::MemberIdRequired;
            out.push(Output::Join(token, JoinResponse::error(new_id, e)));
        } else {
            let new_id = self.new_member_id(&req.client_id, fresh_id);
            self.add_member_then_rebalance(now_ms, token, req, new_id, out);
        }
    }

    fn join_existing_member(
        &mut self,
        now_ms: u64,
        token: Token,
        req: JoinRequest,
        out: &mut Vec<Output>,
    ) {
        let id = req.member_id.clone();
        if !self.supports_protocols(&req.protocol_type, &req.protocols) {
            let e = ClassicError::InconsistentGroupProtocol;
            out.push(Output::Join(token, JoinResponse::error(id, e)));
            return;
        }
        // Pending members are dynamic; with an instance id the request is
        // checked as an existing member's (Kafka throws here).
        if req.group_instance_id.is_none() && self.pending_members.contains(&id) {
            self.add_member_then_rebalance(now_ms, token, req, id, out);
            return;
        }
        if let Err(e) = self.validate_member(&id, req.group_instance_id.as_deref()) {
            out.push(Output::Join(token, JoinResponse::error(id, e)));
            return;
        }
        let same_metadata = self.members[&id].protocols == req.protocols;
        let is_leader = self.leader.as_deref() == Some(id.as_str());
        match self.state {
            State::PreparingRebalance => self.update_member_then_rebalance(now_ms, token, req, out),
            State::CompletingRebalance if same_metadata => {
                // It probably lost the first answer: send it again.
                let resp = self.current_join_response(&id, is_leader);
                out.push(Output::Join(token, resp));
            }
            State::Stable if same_metadata && !is_leader => {
                let resp = self.current_join_response(&id, false);
                out.push(Output::Join(token, resp));
            }
            // Changed metadata, or the leader asking for a rebalance.
            State::CompletingRebalance | State::Stable => {
                self.update_member_then_rebalance(now_ms, token, req, out)
            }
            State::Empty | State::Dead => {
                let e = ClassicError::UnknownMemberId;
                out.push(Output::Join(token, JoinResponse::error(id, e)));
            }
        }
    }

    fn current_join_response(&self, member_id: &str, with_members: bool) -> JoinResponse {
        JoinResponse {
            error: None,
            generation_id: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            leader: self.leader.clone().unwrap_or_default(),
            member_id: member_id.to_string(),
            members: if with_members {
                self.joined_members()
            } else {
                Vec::new()
            },
        }
    }

    fn joined_members(&self) -> Vec<JoinedMember> {
        let protocol = self.protocol_name.as_deref().unwrap_or("");
        self.members
            .values()
            .map(|m| JoinedMember {
                member_id: m.id.clone(),
                group_instance_id: m.instance_id.clone(),
                metadata: m.metadata(protocol).cloned().unwrap_or_default(),
            })
            .collect()
    }

    fn add_member_then_rebalance(
        &mut self,
        now_ms: u64,
        token: Token,
        req: JoinRequest,
        id: String,
        out: &mut Vec<Output>,
    ) {
        if self.state == State::PreparingRebalance && self.initial_rebalance {
            self.new_member_added = true;
        }
        if let Some(i) = &req.group_instance_id {
            let previous = self.static_members.insert(i.clone(), id.clone());
            assert!(previous.is_none(), "one member per group.instance.id");
        }
        if self.members.is_empty() {
            self.protocol_type = Some(req.protocol_type.clone());
        }
        if self.leader.is_none() {
            self.leader = Some(id.clone());
        }
        for (name, _) in &req.protocols {
            *self.supported.entry(name.clone()).or_default() += 1;
        }
        self.awaiting_join += 1;
        self.pending_members.remove(&id);
        self.held.insert(token, (Kind::Join, id.clone()));
        self.timers.schedule(
            TimerKey::Session(id.clone()),
            now_ms.saturating_add(self.config.new_member_join_timeout_ms),
        );
        let m = Member {
            id: id.clone(),
            instance_id: req.group_instance_id,
            client_id: req.client_id,
            client_host: req.client_host,
            session_timeout_ms: req.session_timeout_ms,
            rebalance_timeout_ms: req.rebalance_timeout_ms,
            protocols: req.protocols,
            assignment: Bytes::new(),
            is_new: true,
            join: Wait::Held(Some(token)),
            sync: Wait::No,
        };
        self.members.insert(id, m);
        self.maybe_prepare_rebalance_or_complete_join(now_ms, out);
    }

    /// Kafka's `updateMember` with a new join future; a join already held
    /// for this member is answered REBALANCE_IN_PROGRESS (Kafka drops it).
    fn update_member(&mut self, token: Token, req: JoinRequest, id: &str, out: &mut Vec<Output>) {
        let m = self.members.get_mut(id).expect("updated member exists");
        for (name, _) in &m.protocols {
            decrement(&mut self.supported, name);
        }
        for (name, _) in &req.protocols {
            *self.supported.entry(name.clone()).or_default() += 1;
        }
        m.protocols = req.protocols;
        m.rebalance_timeout_ms = req.rebalance_timeout_ms;
        m.session_timeout_ms = req.session_timeout_ms;
        match m.join {
            Wait::No => self.awaiting_join += 1,
            Wait::Held(None) => {}
            Wait::Held(Some(old)) => {
                self.held.remove(&old);
                let e = ClassicError::RebalanceInProgress;
                out.push(Output::Join(old, JoinResponse::error(id.to_string(), e)));
            }
        }
        m.join = Wait::Held(Some(token));
        self.held.insert(token, (Kind::Join, id.to_string()));
    }

    fn update_member_then_rebalance(
        &mut self,
        now_ms: u64,
        token: Token,
        req: JoinRequest,
        out: &mut Vec<Output>,
    ) {
        let id = req.member_id.clone();
        self.update_member(token, req, &id, out);
        self.maybe_prepare_rebalance_or_complete_join(now_ms, out);
    }

    /// A known static member joins with an unknown member id: the new id
    /// takes the old one's place (and assignment); the old id's held
    /// requests are answered FENCED_INSTANCE_ID.
    fn update_static_member(
        &mut self,
        now_ms: u64,
        token: Token,
        mut req: JoinRequest,
        old_id: &str,
        new_id: String,
        out: &mut Vec<Output>,
    ) {
        let current_leader = self.leader.clone().unwrap_or_default();
        let fenced = JoinResponse::error(old_id.to_string(), ClassicError::FencedInstanceId);
        self.answer_join(old_id, fenced, out);
        self.answer_sync(
            old_id,
            SyncResponse::error(ClassicError::FencedInstanceId),
            out,
        );
        let mut m = self.members.remove(old_id).expect("static member exists");
        m.id = new_id.clone();
        let session_timeout_ms = m.session_timeout_ms;
        self.members.insert(new_id.clone(), m);
        if self.leader.as_deref() == Some(old_id) {
            self.leader = Some(new_id.clone());
        }
        let instance = req.group_instance_id.clone().expect("static member");
        self.static_members.insert(instance, new_id.clone());
        if self.pending_sync.remove(old_id) {
            self.pending_sync.insert(new_id.clone());
        }
        self.timers.cancel(&TimerKey::Session(old_id.to_string()));
        self.timers.schedule(
            TimerKey::Session(new_id.clone()),
            now_ms.saturating_add(u64::from(session_timeout_ms)),
        );
        self.dirty = true;
        req.member_id = new_id.clone();
        self.update_member(token, req, &new_id, out);
        match self.state {
            State::Stable => {
                if self.protocol_name.as_deref() == Some(self.select_protocol().as_str()) {
                    // No rebalance: the new id keeps the old assignment. The
                    // leader is named as it was, so a replaced leader acts as
                    // a follower (Kafka's answer to pre-v9 clients).
                    let resp = JoinResponse {
                        error: None,
                        generation_id: self.generation,
                        protocol_type: self.protocol_type.clone(),
                        protocol_name: self.protocol_name.clone(),
                        leader: current_leader,
                        member_id: new_id.clone(),
                        members: Vec::new(),
                    };
                    self.answer_join(&new_id, resp, out);
                } else {
                    self.maybe_prepare_rebalance_or_complete_join(now_ms, out);
                }
            }
            // The leader may already hold the old id in its assignment.
            State::CompletingRebalance => self.prepare_rebalance(now_ms, out),
            State::PreparingRebalance => self.maybe_complete_join_phase(now_ms, out),
            State::Empty | State::Dead => unreachable!("a static member implies members, not dead"),
        }
    }

    fn maybe_prepare_rebalance_or_complete_join(&mut self, now_ms: u64, out: &mut Vec<Output>) {
        match self.state {
            State::Stable | State::CompletingRebalance | State::Empty => {
                self.prepare_rebalance(now_ms, out)
            }
            State::PreparingRebalance | State::Dead => self.maybe_complete_join_phase(now_ms, out),
        }
    }

    fn prepare_rebalance(&mut self, now_ms: u64, out: &mut Vec<Output>) {
        if self.state == State::CompletingRebalance {
            for m in self.members.values_mut() {
                m.assignment = Bytes::new();
            }
            self.propagate_assignment(now_ms, Some(ClassicError::RebalanceInProgress), out);
        }
        self.pending_sync.clear();
        self.timers.cancel(&TimerKey::Sync);
        let initial = self.state == State::Empty;
        self.state = State::PreparingRebalance;
        self.initial_rebalance = initial;
        if initial {
            let delay_ms = self.config.initial_rebalance_delay_ms;
            let remaining_ms = self.rebalance_timeout_ms().saturating_sub(delay_ms);
            self.new_member_added = false;
            self.schedule_join(
                now_ms,
                delay_ms,
                JoinTimer::Initial {
                    delay_ms,
                    remaining_ms,
                },
            );
        } else {
            self.maybe_complete_join_else_schedule(now_ms, out);
        }
    }

    fn maybe_complete_join_else_schedule(&mut self, now_ms: u64, out: &mut Vec<Output>) {
        if self.all_members_joined() {
            self.complete_join(now_ms, out);
        } else {
            self.schedule_join(now_ms, self.rebalance_timeout_ms(), JoinTimer::Rebalance);
        }
    }

    /// Completes the join phase if every member rejoined, except during the
    /// initial delay (only its timer ends that).
    fn maybe_complete_join_phase(&mut self, now_ms: u64, out: &mut Vec<Output>) {
        if self.state == State::PreparingRebalance
            && !self.initial_rebalance
            && self.all_members_joined()
        {
            self.complete_join(now_ms, out);
        }
    }

    fn all_members_joined(&self) -> bool {
        self.members.len() == self.awaiting_join && self.pending_members.is_empty()
    }

    /// The group's rebalance timeout: the largest of its members'.
    fn rebalance_timeout_ms(&self) -> u64 {
        let max = self
            .members
            .values()
            .map(|m| m.rebalance_timeout_ms)
            .max()
            .unwrap_or(0);
        u64::from(max.max(REBALANCE_TIMEOUT_MS_MIN))
    }

    fn schedule_join(&mut self, now_ms: u64, after_ms: u64, kind: JoinTimer) {
        self.join_timer = kind;
        self.timers
            .schedule(TimerKey::Join, now_ms.saturating_add(after_ms));
    }

    fn schedule_sync(&mut self, now_ms: u64) {
        self.sync_generation = self.generation;
        let at = now_ms.saturating_add(self.rebalance_timeout_ms());
        self.timers.schedule(TimerKey::Sync, at);
    }

    fn on_join_timer(&mut self, now_ms: u64, out: &mut Vec<Output>) {
        match self.join_timer {
            JoinTimer::Initial {
                delay_ms,
                remaining_ms,
            } if self.new_member_added && remaining_ms != 0 => {
                self.new_member_added = false;
                let next_delay_ms = self.config.initial_rebalance_delay_ms.min(remaining_ms);
                let next_remaining_ms = remaining_ms.saturating_sub(delay_ms);
                self.schedule_join(
                    now_ms,
                    next_delay_ms,
                    JoinTimer::Initial {
                        delay_ms: next_delay_ms,
                        remaining_ms: next_remaining_ms,
                    },
                );
            }
            JoinTimer::Initial { .. } | JoinTimer::Rebalance => self.complete_join(now_ms, out),
        }
    }

    /// Ends the join phase: dynamic members that did not rejoin are removed,
    /// a leader is elected among those who did, the generation advances and
    /// every joined member gets its answer.
    fn complete_join(&mut self, now_ms: u64, out: &mut Vec<Output>) {
        self.timers.cancel(&TimerKey::Join);
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| !m.join.is_held() && m.instance_id.is_none())
            .map(|m| m.id.clone())
            .collect();
        for id in gone {
            self.remove_member(&id, out);
        }
        if !self.elect_joined_leader() && !self.members.is_empty() {
            // Only static members that did not rejoin: wait for their
            // sessions to expire.
            self.schedule_join(now_ms, self.rebalance_timeout_ms(), JoinTimer::Rebalance);
            return;
        }
        self.generation = self.generation.saturating_add(1);
        self.pending_sync.clear();
        self.dirty = true;
        if self.members.is_empty() {
            self.protocol_name = None;
            self.state = State::Empty;
            return;
        }
        self.protocol_name = Some(self.select_protocol());
        self.state = State::CompletingRebalance;
        let leader = self.leader.clone().expect("elected above");
        let mut everyone = Some(self.joined_members());
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let members = if id == leader {
                everyone.take().unwrap_or_default()
            } else {
                Vec::new()
            };
            let resp = JoinResponse {
                error: None,
                generation_id: self.generation,
                protocol_type: self.protocol_type.clone(),
                protocol_name: self.protocol_name.clone(),
                leader: leader.clone(),
                member_id: id.clone(),
                members,
            };
            self.answer_join(&id, resp, out);
            self.reschedule_session(now_ms, &id);
            self.members.get_mut(&id).expect("listed").is_new = false;
            self.pending_sync.insert(id);
        }
        self.schedule_sync(now_ms);
    }

    /// Keeps the leader if it rejoined, else picks the first member that
    /// did. False if nobody rejoined.
    fn elect_joined_leader(&mut self) -> bool {
        let Some(leader) = &self.leader else {
            return false;
        };
        if self.members.get(leader).is_some_and(|m| m.join.is_held()) {
            return true;
        }
        match self.members.values().find(|m| m.join.is_held()) {
            Some(m) => {
                self.leader = Some(m.id.clone());
                true
            }
            None => false,
        }
    }

    /// Kafka's vote: among the protocols every member supports, each member
    /// votes for the first it lists; most votes wins (a tie goes to the
    /// name that sorts first).
    fn select_protocol(&self) -> String {
        let n = self.members.len();
        let candidates: BTreeSet<&str> = self
            .supported
            .iter()
            .filter(|(_, count)| **count == n)
            .map(|(name, _)| name.as_str())
            .collect();
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            let vote = m
                .protocols
                .iter()
                .map(|(name, _)| name.as_str())
                .find(|name| candidates.contains(name))
                .expect("every member supports a common protocol");
            *votes.entry(vote).or_default() += 1;
        }
        votes
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(name, _)| name.to_string())
            .expect("a group with members has a protocol")
    }

    // ----- sync internals ------------------------------------------------

    fn check_sync(&self, req: &SyncRequest) -> Result<(), ClassicError> {
        check_len(
            &req.member_id,
            CLASSIC_MEMBER_ID_BYTES_MAX,
            "member id over CLASSIC_MEMBER_ID_BYTES_MAX",
        )?;
        if req.assignments.len() > self.members.len() {
            return Err(ClassicError::InvalidRequest {
                reason: "more assignments than members",
            });
        }
        if req
            .assignments
            .iter()
            .any(|(_, a)| a.len() > ASSIGNMENT_BYTES_MAX)
        {
            return Err(ClassicError::InvalidRequest {
                reason: "an assignment over ASSIGNMENT_BYTES_MAX",
            });
        }
        Ok(())
    }

    fn validate_sync(&self, req: &SyncRequest) -> Result<(), ClassicError> {
        if self.state == State::Dead {
            return Err(ClassicError::CoordinatorNotAvailable);
        }
        self.validate_member(&req.member_id, req.group_instance_id.as_deref())?;
        if req.generation_id != self.generation {
            return Err(ClassicError::IllegalGeneration {
                current: self.generation,
                requested: req.generation_id,
            });
        }
        if inconsistent(req.protocol_type.as_deref(), self.protocol_type.as_deref())
            || inconsistent(req.protocol_name.as_deref(), self.protocol_name.as_deref())
        {
            return Err(ClassicError::InconsistentGroupProtocol);
        }
        Ok(())
    }

    /// Holds a member's SyncGroup; one already held is answered
    /// REBALANCE_IN_PROGRESS (Kafka drops it).
    fn hold_sync(&mut self, id: &str, token: Token, out: &mut Vec<Output>) {
        let m = self.members.get_mut(id).expect("validated member");
        if let Wait::Held(Some(old)) = m.sync {
            self.held.remove(&old);
            out.push(Output::Sync(
                old,
                SyncResponse::error(ClassicError::RebalanceInProgress),
            ));
        }
        m.sync = Wait::Held(Some(token));
        self.held.insert(token, (Kind::Sync, id.to_string()));
    }

    fn remove_pending_sync(&mut self, id: &str) {
        self.pending_sync.remove(id);
        let all_synced = self.pending_sync.is_empty();
        let cancel = match self.state {
            State::Dead | State::Empty | State::PreparingRebalance => true,
            State::CompletingRebalance | State::Stable => all_synced,
        };
        if cancel {
            self.timers.cancel(&TimerKey::Sync);
        }
    }

    /// Answers every held SyncGroup with its member's assignment (or the
    /// error) and restarts those members' sessions.
    fn propagate_assignment(
        &mut self,
        now_ms: u64,
        error: Option<ClassicError>,
        out: &mut Vec<Output>,
    ) {
        let ids: Vec<String> = self
            .members
            .values()
            .filter(|m| m.sync.is_held())
            .map(|m| m.id.clone())
            .collect();
        for id in ids {
            let resp = SyncResponse {
                error: error.clone(),
                protocol_type: if error.is_none() {
                    self.protocol_type.clone()
                } else {
                    None
                },
                protocol_name: if error.is_none() {
                    self.protocol_name.clone()
                } else {
                    None
                },
                assignment: self.members[&id].assignment.clone(),
            };
            if self.answer_sync(&id, resp, out) {
                self.reschedule_session(now_ms, &id);
            }
        }
    }

    // ----- expiry ----------------------------------------------------------

    fn expire_pending_sync(&mut self, now_ms: u64, out: &mut Vec<Output>) {
        if self.sync_generation != self.generation {
            return;
        }
        if matches!(self.state, State::CompletingRebalance | State::Stable)
            && !self.pending_sync.is_empty()
        {
            let late: Vec<String> = self.pending_sync.iter().cloned().collect();
            for id in late {
                self.remove_member(&id, out);
            }
            self.prepare_rebalance(now_ms, out);
        }
    }

    fn expire_session(&mut self, now_ms: u64, id: &str, out: &mut Vec<Output>) {
        if self.pending_members.remove(id) {
            if self.state == State::PreparingRebalance && self.all_members_joined() {
                self.complete_join(now_ms, out);
            }
            return;
        }
        let Some(m) = self.members.get(id) else {
            return;
        };
        // Waiting for a rebalance counts as a heartbeat, except for members
        // still joining for the first time.
        let satisfied = !m.is_new && (m.join.is_held() || m.sync.is_held());
        if satisfied {
            return;
        }
        self.remove_member(id, out);
        match self.state {
            State::Stable | State::CompletingRebalance => {
                self.maybe_prepare_rebalance_or_complete_join(now_ms, out)
            }
            State::PreparingRebalance if self.all_members_joined() => {
                self.complete_join(now_ms, out)
            }
            _ => {}
        }
    }

    // ----- membership primitives -------------------------------------------

    fn validate_member(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<(), ClassicError> {
        if let Some(instance) = instance_id {
            match self.static_members.get(instance) {
                None => return Err(ClassicError::UnknownMemberId),
                Some(current) if current != member_id => {
                    return Err(ClassicError::FencedInstanceId)
                }
                Some(_) => {}
            }
        }
        if !self.members.contains_key(member_id) {
            return Err(ClassicError::UnknownMemberId);
        }
        Ok(())
    }

    fn reschedule_session(&mut self, now_ms: u64, id: &str) {
        let timeout = u64::from(self.members[id].session_timeout_ms);
        self.timers.schedule(
            TimerKey::Session(id.to_string()),
            now_ms.saturating_add(timeout),
        );
    }

    /// Removes a member or pending member. Its held JoinGroup is answered
    /// UNKNOWN_MEMBER_ID (as Kafka does), and so is a held SyncGroup.
    fn remove_member(&mut self, id: &str, out: &mut Vec<Output>) {
        let e = ClassicError::UnknownMemberId;
        self.answer_join(id, JoinResponse::error(String::new(), e.clone()), out);
        self.answer_sync(id, SyncResponse::error(e), out);
        if let Some(m) = self.members.remove(id) {
            for (name, _) in &m.protocols {
                decrement(&mut self.supported, name);
            }
            if let Some(i) = &m.instance_id {
                self.static_members.remove(i);
            }
            if !m.is_new {
                self.dirty = true;
            }
        }
        if self.leader.as_deref() == Some(id) {
            self.leader = self.members.keys().next().cloned();
        }
        self.pending_members.remove(id);
        self.pending_sync.remove(id);
        self.timers.cancel(&TimerKey::Session(id.to_string()));
    }

    /// Answers a member's held JoinGroup; false if none was held.
    fn answer_join(&mut self, id: &str, resp: JoinResponse, out: &mut Vec<Output>) -> bool {
        let Some(m) = self.members.get_mut(id) else {
            return false;
        };
        let Wait::Held(token) = std::mem::take(&mut m.join) else {
            return false;
        };
        self.awaiting_join -= 1;
        if let Some(token) = token {
            self.held.remove(&token);
            out.push(Output::Join(token, resp));
        }
        true
    }

    /// Answers a member's held SyncGroup; false if none was held.
    fn answer_sync(&mut self, id: &str, resp: SyncResponse, out: &mut Vec<Output>) -> bool {
        let Some(m) = self.members.get_mut(id) else {
            return false;
        };
        let Wait::Held(token) = std::mem::take(&mut m.sync) else {
            return false;
        };
        if let Some(token) = token {
            self.held.remove(&token);
            out.push(Output::Sync(token, resp));
        }
        true
    }

    #[cfg(test)]
    fn assert_invariants(&self) {
        let joins = self.members.values().filter(|m| m.join.is_held()).count();
        assert_eq!(joins, self.awaiting_join, "awaiting_join count");
        let mut supported: HashMap<String, usize> = HashMap::new();
        for m in self.members.values() {
            for (name, _) in &m.protocols {
                *supported.entry(name.clone()).or_default() += 1;
            }
        }
        assert_eq!(supported, self.supported, "supported protocol counts");
        let statics: BTreeMap<String, String> = self
            .members
            .values()
            .filter_map(|m| m.instance_id.clone().map(|i| (i, m.id.clone())))
            .collect();
        assert_eq!(statics, self.static_members, "static member map");
        for (token, (kind, id)) in &self.held {
            let m = &self.members[id];
            let wait = match kind {
                Kind::Join => m.join,
                Kind::Sync => m.sync,
            };
            assert_eq!(wait, Wait::Held(Some(*token)));
        }
        for m in self.members.values() {
            for (wait, kind) in [(m.join, Kind::Join), (m.sync, Kind::Sync)] {
                if let Wait::Held(Some(t)) = wait {
                    assert_eq!(self.held.get(&t), Some(&(kind, m.id.clone())));
                }
            }
            if m.join.is_held() && self.state != State::Dead {
                assert_eq!(
                    self.state,
                    State::PreparingRebalance,
                    "held join outside PreparingRebalance"
                );
            }
            if m.sync.is_held() && self.state != State::Dead {
                assert_eq!(
                    self.state,
                    State::CompletingRebalance,
                    "held sync outside CompletingRebalance"
                );
            }
            if matches!(self.state, State::Stable | State::CompletingRebalance) {
                assert!(!m.is_new, "new member outside a join phase");
            }
        }
        match &self.leader {
            Some(l) => assert!(self.members.contains_key(l), "leader is a member"),
            None => assert!(self.members.is_empty(), "members imply a leader"),
        }
        if self.state == State::Empty {
            assert!(self.members.is_empty(), "Empty has no members");
        }
        assert!(self
            .pending_sync
            .iter()
            .all(|id| self.members.contains_key(id)));
        assert!(self
            .pending_members
            .iter()
            .all(|id| !self.members.contains_key(id)));
        assert!(self.pending_members.len() <= self.config.max_size);
    }
}

fn decrement(supported: &mut HashMap<String, usize>, name: &str) {
    if let Some(count) = supported.get_mut(name) {
        *count -= 1;
        if *count == 0 {
            supported.remove(name);
        }
    }
}

// ---------------------------------------------------------------------------
// Snapshot

/// The state a snapshot was taken in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotState {
    /// No members.
    Empty,
    /// A rebalance had begun; restore starts a new one.
    PreparingRebalance,
    /// Joined, assignment not yet stored; restore waits for SyncGroups.
    CompletingRebalance,
    /// Assignment stored.
    Stable,
}

/// A member in a [`Snapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotMember {
    /// Member id.
    pub member_id: String,
    /// `group.instance.id`.
    pub group_instance_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
    /// Session timeout.
    pub session_timeout_ms: u32,
    /// Rebalance timeout.
    pub rebalance_timeout_ms: u32,
    /// Metadata for the chosen protocol.
    pub metadata: Bytes,
    /// Assignment.
    pub assignment: Bytes,
}

/// The durable part of a group (Kafka's `GroupMetadataValue`).
///
/// Encoding, all integers big-endian:
/// ```text
/// u8  version (= 1)
/// i32 generation (>= 0)
/// u8  state: 0 Empty, 1 PreparingRebalance, 2 CompletingRebalance, 3 Stable
/// opt protocol_type      opt = u8 0 (absent) | u8 1, str
/// opt protocol_name      str = u16 length, UTF-8 bytes
/// opt leader             blob = u32 length, bytes
/// u32 member count (<= GROUP_MEMBERS_MAX), then per member:
///     str member_id, opt group_instance_id, str client_id, str client_host,
///     u32 session_timeout_ms, u32 rebalance_timeout_ms,
///     blob metadata (<= MEMBER_METADATA_BYTES_MAX),
///     blob assignment (<= ASSIGNMENT_BYTES_MAX)
/// ```
/// Nothing may follow. Members are present iff the state is not Empty; then
/// protocol type, name and leader are present and the leader is a member;
/// member ids and instance ids are unique.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Generation.
    pub generation: i32,
    /// State at the time.
    pub state: SnapshotState,
    /// Protocol type.
    pub protocol_type: Option<String>,
    /// Chosen protocol.
    pub protocol_name: Option<String>,
    /// Leader's member id.
    pub leader: Option<String>,
    /// Members.
    pub members: Vec<SnapshotMember>,
}

/// Why bytes are not a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The bytes end at `offset` before the field `what`.
    Truncated {
        /// Where the bytes ran out.
        offset: usize,
        /// The field being read.
        what: &'static str,
    },
    /// A version this code does not read.
    UnknownVersion {
        /// The version byte.
        version: u8,
    },
    /// A field holds an impossible value.
    BadField {
        /// Where the field starts.
        offset: usize,
        /// The field.
        what: &'static str,
    },
    /// Bytes after the last member.
    TrailingBytes {
        /// How many.
        len: usize,
    },
    /// The fields disagree with each other.
    Inconsistent {
        /// How.
        reason: &'static str,
    },
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Truncated { offset, what } => {
                write!(
                    f,
                    "group snapshot truncated at byte {offset} reading {what}"
                )
            }
            SnapshotError::UnknownVersion { version } => {
                write!(f, "group snapshot has unknown version {version}")
            }
            SnapshotError::BadField { offset, what } => {
                write!(f, "group snapshot has an invalid {what} at byte {offset}")
            }
            SnapshotError::TrailingBytes { len } => {
                write!(f, "group snapshot has {len} bytes after its end")
            }
            SnapshotError::Inconsistent { reason } => {
                write!(f, "group snapshot is inconsistent: {reason}")
            }
        }
    }
}

impl std::error::Error for SnapshotError {}

/// The fewest bytes one encoded member takes.
const SNAPSHOT_MEMBER_BYTES_MIN: usize = 2 + 1 + 2 + 2 + 4 + 4 + 4 + 4;

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], SnapshotError> {
        let truncated = SnapshotError::Truncated {
            offset: self.pos,
            what,
        };
        let end = self.pos.checked_add(n).ok_or(truncated.clone())?;
        let bytes = self.buf.get(self.pos..end).ok_or(truncated)?;
        self.pos = end;
        Ok(bytes)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, SnapshotError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, SnapshotError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, SnapshotError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i32(&mut self, what: &'static str) -> Result<i32, SnapshotError> {
        Ok(self.u32(what)? as i32)
    }

    fn str(&mut self, max: usize, what: &'static str) -> Result<String, SnapshotError> {
        let start = self.pos;
        let len = usize::from(self.u16(what)?);
        if len > max {
            return Err(SnapshotError::BadField {
                offset: start,
                what,
            });
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| SnapshotError::BadField {
            offset: start,
            what,
        })
    }

    fn opt_str(&mut self, max: usize, what: &'static str) -> Result<Option<String>, SnapshotError> {
        let start = self.pos;
        match self.u8(what)? {
            0 => Ok(None),
            1 => Ok(Some(self.str(max, what)?)),
            _ => Err(SnapshotError::BadField {
                offset: start,
                what,
            }),
        }
    }

    fn blob(&mut self, max: usize, what: &'static str) -> Result<Bytes, SnapshotError> {
        let start = self.pos;
        let len = self.u32(what)? as usize;
        if len > max {
            return Err(SnapshotError::BadField {
                offset: start,
                what,
            });
        }
        Ok(Bytes::copy_from_slice(self.take(len, what)?))
    }
}

fn put_str(buf: &mut BytesMut, s: &str) {
    let len = u16::try_from(s.len()).expect("names are bounded below u16::MAX");
    buf.put_u16(len);
    buf.put_slice(s.as_bytes());
}

fn put_opt_str(buf: &mut BytesMut, s: Option<&str>) {
    match s {
        None => buf.put_u8(0),
        Some(s) => {
            buf.put_u8(1);
            put_str(buf, s);
        }
    }
}

fn put_blob(buf: &mut BytesMut, b: &[u8]) {
    let len = u32::try_from(b.len()).expect("blobs are bounded below u32::MAX");
    buf.put_u32(len);
    buf.put_slice(b);
}

impl Snapshot {
    /// Encodes the layout documented on [`Snapshot`].
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::with_capacity(64 + self.members.len() * 64);
        buf.put_u8(SNAPSHOT_VERSION);
        buf.put_i32(self.generation);
        buf.put_u8(match self.state {
            SnapshotState::Empty => 0,
            SnapshotState::PreparingRebalance => 1,
            SnapshotState::CompletingRebalance => 2,
            SnapshotState::Stable => 3,
        });
        put_opt_str(&mut buf, self.protocol_type.as_deref());
        put_opt_str(&mut buf, self.protocol_name.as_deref());
        put_opt_str(&mut buf, self.leader.as_deref());
        let count = u32::try_from(self.members.len()).expect("members are bounded");
        buf.put_u32(count);
        for m in &self.members {
            put_str(&mut buf, &m.member_id);
            put_opt_str(&mut buf, m.group_instance_id.as_deref());
            put_str(&mut buf, &m.client_id);
            put_str(&mut buf, &m.client_host);
            buf.put_u32(m.session_timeout_ms);
            buf.put_u32(m.rebalance_timeout_ms);
            put_blob(&mut buf, &m.metadata);
            put_blob(&mut buf, &m.assignment);
        }
        buf.freeze()
    }

    /// Decodes and checks a snapshot; never panics, whatever the bytes.
    pub fn decode(b: &[u8]) -> Result<Snapshot, SnapshotError> {
        let mut r = Reader { buf: b, pos: 0 };
        let version = r.u8("version")?;
        if version != SNAPSHOT_VERSION {
            return Err(SnapshotError::UnknownVersion { version });
        }
        let generation = r.i32("generation")?;
        let state_at = r.pos;
        let state = match r.u8("state")? {
            0 => SnapshotState::Empty,
            1 => SnapshotState::PreparingRebalance,
            2 => SnapshotState::CompletingRebalance,
            3 => SnapshotState::Stable,
            _ => {
                return Err(SnapshotError::BadField {
                    offset: state_at,
                    what: "state",
                })
            }
        };
        let protocol_type = r.opt_str(NAME_BYTES_MAX, "protocol type")?;
        let protocol_name = r.opt_str(NAME_BYTES_MAX, "protocol name")?;
        let leader = r.opt_str(CLASSIC_MEMBER_ID_BYTES_MAX, "leader")?;
        let count_at = r.pos;
        let count = r.u32("member count")? as usize;
        if count > GROUP_MEMBERS_MAX {
            return Err(SnapshotError::BadField {
                offset: count_at,
                what: "member count",
            });
        }
        let room = (b.len() - r.pos) / SNAPSHOT_MEMBER_BYTES_MIN;
        let mut members = Vec::with_capacity(count.min(room));
        for _ in 0..count {
            members.push(SnapshotMember {
                member_id: r.str(CLASSIC_MEMBER_ID_BYTES_MAX, "member id")?,
                group_instance_id: r.opt_str(NAME_BYTES_MAX, "group instance id")?,
                client_id: r.str(NAME_BYTES_MAX, "client id")?,
                client_host: r.str(NAME_BYTES_MAX, "client host")?,
                session_timeout_ms: r.u32("session timeout")?,
                rebalance_timeout_ms: r.u32("rebalance timeout")?,
                metadata: r.blob(MEMBER_METADATA_BYTES_MAX, "metadata")?,
                assignment: r.blob(ASSIGNMENT_BYTES_MAX, "assignment")?,
            });
        }
        if r.pos != b.len() {
            return Err(SnapshotError::TrailingBytes {
                len: b.len() - r.pos,
            });
        }
        let snapshot = Snapshot {
            generation,
            state,
            protocol_type,
            protocol_name,
            leader,
            members,
        };
        snapshot.check()?;
        Ok(snapshot)
    }

    /// The snapshot, if the relations documented on [`Snapshot`] hold.
    pub fn checked(self) -> Result<Snapshot, SnapshotError> {
        self.check()?;
        Ok(self)
    }

    /// Checks the relations documented on [`Snapshot`].
    fn check(&self) -> Result<(), SnapshotError> {
        let bad = |reason| Err(SnapshotError::Inconsistent { reason });
        if self.generation < 0 {
            return bad("negative generation");
        }
        if self.members.len() > GROUP_MEMBERS_MAX {
            return bad("more than GROUP_MEMBERS_MAX members");
        }
        if self.members.is_empty() != (self.state == SnapshotState::Empty) {
            return bad("members present iff the state is not Empty");
        }
        if self.members.is_empty() {
            if self.protocol_name.is_some() || self.leader.is_some() {
                return bad("an empty group has no protocol name or leader");
            }
            return Ok(());
        }
        if self.protocol_type.is_none() || self.protocol_name.is_none() {
            return bad("members imply a protocol type and name");
        }
        let mut ids = BTreeSet::new();
        let mut instances = BTreeSet::new();
        for m in &self.members {
            if !ids.insert(m.member_id.as_str()) {
                return bad("repeated member id");
            }
            if let Some(i) = &m.group_instance_id {
                if !instances.insert(i.as_str()) {
                    return bad("repeated group instance id");
                }
            }
            if m.member_id.len() > CLASSIC_MEMBER_ID_BYTES_MAX
                || m.group_instance_id
                    .as_ref()
                    .is_some_and(|i| i.len() > NAME_BYTES_MAX)
                || m.client_id.len() > NAME_BYTES_MAX
                || m.client_host.len() > NAME_BYTES_MAX
                || m.metadata.len() > MEMBER_METADATA_BYTES_MAX
                || m.assignment.len() > ASSIGNMENT_BYTES_MAX
            {
                return bad("a member field over its bound");
            }
        }
        if !self.leader.as_deref().is_some_and(|l| ids.contains(l)) {
            return bad("the leader is not a member");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    const T0: u64 = 1_000_000;

    fn config() -> Config {
        Config {
            initial_rebalance_delay_ms: 0,
            max_size: 50,
            session_timeout_min_ms: 100,
            session_timeout_max_ms: 60_000,
            new_member_join_timeout_ms: 300_000,
        }
    }

    fn meta(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn join_req(member_id: &str, client: &str) -> JoinRequest {
        JoinRequest {
            member_id: member_id.into(),
            group_instance_id: None,
            client_id: client.into(),
            client_host: "/127.0.0.1".into(),
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), meta(client))],
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            require_known_member_id: true,
        }
    }

    fn static_req(member_id: &str, client: &str, instance: &str) -> JoinRequest {
        JoinRequest {
            group_instance_id: Some(instance.into()),
            ..join_req(member_id, client)
        }
    }

    fn sync_req(
        member_id: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncRequest {
        SyncRequest {
            member_id: member_id.into(),
            group_instance_id: None,
            generation_id: generation,
            protocol_type: Some("consumer".into()),
            protocol_name: None,
            assignments,
        }
    }

    fn code(e: &Option<ClassicError>) -> i16 {
        e.as_ref().map_or(0, ClassicError::kafka_code)
    }

    fn err_code(r: Result<(), ClassicError>) -> i16 {
        r.err().map_or(0, |e| e.kafka_code())
    }

    fn join_answer(out: &[Output], token: Token) -> &JoinResponse {
        out.iter()
            .find_map(|o| match o {
                Output::Join(t, r) if *t == token => Some(r),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no join answer for token {token} in {out:?}"))
    }

    fn sync_answer(out: &[Output], token: Token) -> &SyncResponse {
        out.iter()
            .find_map(|o| match o {
                Output::Sync(t, r) if *t == token => Some(r),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no sync answer for token {token} in {out:?}"))
    }

    /// A group and a clock, with invariants checked after every call.
    struct H {
        g: ClassicGroup,
        now: u64,
        token: Token,
        ids: u64,
    }

    impl H {
        fn new(config: Config) -> Self {
            H {
                g: ClassicGroup::new(config),
                now: T0,
                token: 0,
                ids: 0,
            }
        }

        fn next_token(&mut self) -> Token {
            self.token += 1;
            self.token
        }

        fn join(&mut self, req: JoinRequest) -> (Token, Vec<Output>) {
            let t = self.next_token();
            self.ids += 1;
            let fresh = format!("{:04}", self.ids);
            let out = self.g.join(self.now, t, req, move || fresh);
            self.g.assert_invariants();
            (t, out)
        }

        fn sync(&mut self, req: SyncRequest) -> (Token, Vec<Output>) {
            let t = self.next_token();
            let out = self.g.sync(self.now, t, req);
            self.g.assert_invariants();
            (t, out)
        }

        fn heartbeat(&mut self, member_id: &str, generation: i32) -> Result<(), ClassicError> {
            let r = self.g.heartbeat(self.now, member_id, None, generation);
            self.g.assert_invariants();
            r
        }

        fn tick(&mut self, after_ms: u64) -> Vec<Output> {
            self.now += after_ms;
            let out = self.g.tick(self.now);
            self.g.assert_invariants();
            out
        }

        /// First half of a two-step join: the member id handed out.
        fn member_id_for(&mut self, req: JoinRequest) -> String {
            let (t, out) = self.join(req);
            assert_eq!(out.len(), 1);
            let r = join_answer(&out, t);
            assert_eq!(r.error, Some(ClassicError::MemberIdRequired));
            assert!(r
                .member_id
                .starts_with(&format!("{}-", r.member_id.split('-').next().unwrap())));
            r.member_id.clone()
        }

        /// Joins every request (two steps for dynamic members), ends the
        /// join phase, has everyone sync, and returns the member ids (in
        /// request order) with the generation.
        fn form(&mut self, reqs: Vec<JoinRequest>) -> (Vec<String>, i32) {
            let mut tokens = Vec::new();
            for mut req in reqs {
                if req.group_instance_id.is_none() {
                    req.member_id = self.member_id_for(req.clone());
                }
                let (t, out) = self.join(req);
                assert!(out.is_empty(), "joins are held during the initial delay");
                tokens.push(t);
            }
            let out = self.tick(0);
            let generation = self.g.generation();
            assert_eq!(self.g.state(), State::CompletingRebalance);
            let ids: Vec<String> = tokens
                .iter()
                .map(|t| {
                    let r = join_answer(&out, *t);
                    assert_eq!(r.error, None);
                    assert_eq!(r.generation_id, generation);
                    r.member_id.clone()
                })
                .collect();
            let leader = self.g.leader().unwrap().to_string();
            let assignments = ids
                .iter()
                .map(|id| (id.clone(), meta(&format!("to-{id}"))))
                .collect();
            let mut held = Vec::new();
            for id in ids.iter().filter(|id| **id != leader) {
                let (t, out) = self.sync(sync_req(id, generation, vec![]));
                assert!(out.is_empty(), "a follower waits for the leader");
                held.push((t, id.clone()));
            }
            let (t, out) = self.sync(sync_req(&leader, generation, assignments));
            held.push((t, leader));
            assert_eq!(out.len(), ids.len());
            for (t, id) in held {
                assert_eq!(sync_answer(&out, t).assignment, meta(&format!("to-{id}")));
            }
            assert_eq!(self.g.state(), State::Stable);
            (ids, generation)
        }
    }

    #[test]
    fn error_codes_match_kafka() {
        let cases = [
            (ClassicError::UnknownMemberId, 25),
            (
                ClassicError::IllegalGeneration {
                    current: 1,
                    requested: 0,
                },
                22,
            ),
            (ClassicError::RebalanceInProgress, 27),
            (ClassicError::MemberIdRequired, 79),
            (ClassicError::FencedInstanceId, 82),
            (ClassicError::InconsistentGroupProtocol, 23),
            (ClassicError::GroupMaxSizeReached { max_size: 1 }, 81),
            (
                ClassicError::InvalidSessionTimeout {
                    requested_ms: 1,
                    min_ms: 2,
                    max_ms: 3,
                },
                26,
            ),
            (ClassicError::CoordinatorNotAvailable, 15),
            (ClassicError::NotCoordinator, 16),
            (ClassicError::InvalidRequest { reason: "x" }, 42),
        ];
        for (e, c) in cases {
            assert_eq!(e.kafka_code(), c);
            assert!(e.message().ends_with('.'), "{}", e.message());
        }
    }

    #[test]
    fn two_step_join_hands_out_a_member_id_then_joins() {
        let mut h = H::new(config());
        let (t, out) = h.join(join_req("", "app"));
        let r = join_answer(&out, t);
        assert_eq!(code(&r.error), 79);
        assert_eq!(r.member_id, "app-0001");
        assert_eq!(
            h.g.state(),
            State::Empty,
            "a pending member is not a member"
        );
        assert_eq!(h.g.members().count(), 0);

        let (t, out) = h.join(join_req("app-0001", "app"));
        assert!(out.is_empty());
        assert_eq!(h.g.state(), State::PreparingRebalance);
        assert_eq!(h.g.held_requests(), 1);
        let out = h.tick(0);
        let r = join_answer(&out, t);
        assert_eq!(r.error, None);
        assert_eq!(r.generation_id, 1);
        assert_eq!(r.leader, "app-0001");
        assert_eq!(r.protocol_name.as_deref(), Some("range"));
        assert_eq!(r.members.len(), 1);
        assert_eq!(r.members[0].metadata, meta("app"));
        assert_eq!(h.g.state(), State::CompletingRebalance);
        assert!(h.g.take_dirty(), "a new generation is durable state");

        // A v3 client (no MEMBER_ID_REQUIRED) joins in one step.
        let (t, out) = h.join(JoinRequest {
            require_known_member_id: false,
            ..join_req("", "old")
        });
        assert!(out.is_empty());
        assert_eq!(h.g.state(), State::PreparingRebalance);
        assert!(h.g.members().any(|m| m.member_id.starts_with("old-")));
        // Not an initial rebalance: it ends as soon as everyone rejoined.
        let (t1, out) = h.join(join_req("app-0001", "app"));
        assert_eq!(join_answer(&out, t).generation_id, 2);
        assert_eq!(join_answer(&out, t1).generation_id, 2);
    }

    #[test]
    fn rejoin_with_same_metadata_during_completing_repeats_the_answer() {
        let mut h = H::new(config());
        let id = h.member_id_for(join_req("", "a"));
        let (_, _) = h.join(join_req(&id, "a"));
        let first = h.tick(0);
        let (t, out) = h.join(join_req(&id, "a"));
        let again = join_answer(&out, t);
        let Output::Join(_, original) = &first[0] else {
            panic!()
        };
        assert_eq!(again, original);
        assert_eq!(h.g.state(), State::CompletingRebalance);
    }

    #[test]
    fn followers_wait_for_the_leaders_assignment() {
        let mut h = H::new(config());
        let (ids, generation) = h.form(vec![
            join_req("", "a"),
            join_req("", "b"),
            join_req("", "c"),
        ]);
        assert_eq!(generation, 1);
        assert_eq!(
            h.g.leader(),
            Some(ids[0].as_str()),
            "the first member added leads"
        );
        assert!(h.g.take_dirty());
        for m in h.g.members() {
            assert_eq!(*m.assignment, meta(&format!("to-{}", m.member_id)));
        }
        // Stable: a SyncGroup is answered at once with the stored assignment.
        let (t, out) = h.sync(sync_req(&ids[1], generation, vec![]));
        assert_eq!(
            sync_answer(&out, t).assignment,
            meta(&format!("to-{}", ids[1]))
        );
        assert_eq!(h.heartbeat(&ids[2], generation), Ok(()));
    }

    #[test]
    fn sync_errors_follow_kafka() {
        let mut h = H::new(config());
        let (t, out) = h.sync(sync_req("nobody", 0, vec![]));
        assert_eq!(code(&sync_answer(&out, t).error), 25, "empty group");
        let (ids, generation) = h.form(vec![join_req("", "a"), join_req("", "b")]);
        let (t, out) = h.sync(sync_req(&ids[1], generation + 1, vec![]));
        assert_eq!(code(&sync_answer(&out, t).error), 22);
        let (t, out) = h.sync(sync_req("nobody", generation, vec![]));
        assert_eq!(code(&sync_answer(&out, t).error), 25);
        let (t, out) = h.sync(SyncRequest {
            protocol_name: Some("roundrobin".into()),
            ..sync_req(&ids[1], generation, vec![])
        });
        assert_eq!(code(&sync_answer(&out, t).error), 23);
        let (t, out) = h.sync(SyncRequest {
            protocol_type: Some("connect".into()),
            ..sync_req(&ids[1], generation, vec![])
        });
        assert_eq!(code(&sync_answer(&out, t).error), 23);
        // The leader rejoining starts a rebalance: SyncGroup is refused.
        let (_, out) = h.join(join_req(&ids[0], "a"));
        assert!(out.is_empty());
        let (t, out) = h.sync(sync_req(&ids[1], generation, vec![]));
        assert_eq!(code(&sync_answer(&out, t).error), 27);
    }

    #[test]
    fn heartbeat_answers_rebalance_in_progress_while_preparing() {
        let mut h = H::new(config());
        let (ids, generation) = h.form(vec![join_req("", "a"), join_req("", "b")]);
        assert_eq!(h.heartbeat(&ids[1], generation), Ok(()));
        assert_eq!(err_code(h.heartbeat(&ids[1], generation - 1)), 22);
        assert_eq!(err_code(h.heartbeat("nobody", generation)), 25);
        // A follower changes its metadata: rebalance.
        let mut req = join_req(&ids[1], "b");
        req.protocols = vec![("range".into(), meta("b2"))];
        let (tb, out) = h.join(req);
        assert!(out.is_empty());
        assert_eq!(h.g.state(), State::PreparingRebalance);
        assert_eq!(err_code(h.heartbeat(&ids[0], generation)), 27);
        // The leader rejoins: the join phase ends at once.
        let (ta, out) = h.join(join_req(&ids[0], "a"));
        assert_eq!(out.len(), 2);
        assert_eq!(join_answer(&out, ta).members.len(), 2);
        assert!(join_answer(&out, tb).members.is_empty());
        assert_eq!(join_answer(&out, tb).generation_id, generation + 1);
        // Kafka: heartbeats succeed in CompletingRebalance.
        assert_eq!(h.g.state(), State::CompletingRebalance);
        assert_eq!(h.heartbeat(&ids[0], generation + 1), Ok(()));
        assert_eq!(err_code(h.heartbeat(&ids[0], generation)), 22);
    }

    #[test]
    fn rebalance_timeout_removes_a_member_that_did_not_rejoin() {
        let mut h = H::new(config());
        let (ids, generation) = h.form(vec![join_req("", "a"), join_req("", "b")]);
        let (ta, out) = h.join(join_req(&ids[0], "a"));
        assert!(out.is_empty());
        // b keeps heartbeating but never rejoins.
        for _ in 0..5 {
            assert!(h.tick(5_000).is_empty());
            assert_eq!(err_code(h.heartbeat(&ids[1], generation)), 27);
        }
        let out = h.tick(5_000);
        let r = join_answer(&out, ta);
        assert_eq!(r.error, None);
        assert_eq!(r.generation_id, generation + 1);
        assert_eq!(r.members.len(), 1);
        assert_eq!(h.g.members().count(), 1);
        assert!(h.g.take_dirty());
        assert_eq!(err_code(h.heartbeat(&ids[1], generation + 1)), 25);
    }

    #[test]
    fn rebalance_elects_a_new_leader_when_the_leader_does_not_rejoin() {
        let mut h = H::new(config());
        let (ids, generation) = h.form(vec![join_req("", "a"), join_req("", "b")]);
        let mut req = join_req(&ids[1], "b");
        req.protocols = vec![("range".into(), meta("b2"))];
        let (tb, _) = h.join(req);
        let out = h.tick(30_000);
        let r = join_answer(&out, tb);
        assert_eq!(r.leader, ids[1]);
        assert_eq!(r.members.len(), 1);
        assert_eq!(r.generation_id, generation + 1);
        assert_eq!(h.g.leader(), Some(ids[1].as_str()));
    }

    #[test]
    fn initial_delay_waits_while_members_keep_arriving() {
        let mut h = H::new(Config {
            initial_rebalance_delay_ms: 3_000,
            ..config()
        });
        let mut req = join_req("", "a");
        req.rebalance_timeout_ms = 10_000;
        let a = h.member_id_for(req.clone());
        req.member_id = a;
        let (ta, out) = h.join(req);
        assert!(
            out.is_empty(),
            "even with everyone joined, the initial delay holds"
        );
        assert_eq!(h.g.next_deadline(), Some(h.now + 3_000));
        assert!(h.tick(2_000).is_empty());
        let b = h.member_id_for(join_req("", "b"));
        let (tb, out) = h.join(join_req(&b, "b"));
        assert!(out.is_empty());
        // The delay ends, but a member arrived: extended by another delay.
        assert!(h.tick(1_000).is_empty());
        assert_eq!(h.g.next_deadline(), Some(h.now + 3_000));
        assert!(h.tick(2_999).is_empty());
        let out = h.tick(1);
        assert_eq!(join_answer(&out, ta).generation_id, 1);
        assert_eq!(join_answer(&out, tb).generation_id, 1);
        assert_eq!(join_answer(&out, ta).members.len(), 2);
    }

    #[test]
    fn initial_delay_is_bounded_by_the_rebalance_timeout() {
        let mut h = H::new(Config {
            initial_rebalance_delay_ms: 3_000,
            ..config()
        });
        let mut req = join_req("", "c0");
        req.rebalance_timeout_ms = 7_000;
        req.require_known_member_id = false;
        let (t0, _) = h.join(req.clone());
        // A new member every 2.5 s would extend forever without the bound.
        let mut released = None;
        for i in 1..10 {
            let out = h.tick(2_500);
            if !out.is_empty() {
                released = Some((h.now - T0, out));
                break;
            }
            req.client_id = format!("c{i}");
            h.join(req.clone());
        }
        let (elapsed, out) = released.expect("the initial rebalance ends");
        assert!(elapsed <= 3_000 + 7_000 + 2_500, "ended after {elapsed} ms");
        assert_eq!(join_answer(&out, t0).error, None);
    }

    #[test]
    fn static_member_restart_replaces_its_id_without_rebalance() {
        let mut h = H::new(config());
        let (ids, generation) = h.form(vec![static_req("", "s", "inst-s"), join_req("", "d")]);
        let old = ids[0].clone();
        assert!(
            old.starts_with("inst-s-"),
            "static ids start with the instance id"
        );
        h.g.take_dirty();
        // The static member restarts: unknown (empty) member id, same instance.
        let (t, out) = h.join(static_req("", "s", "inst-s"));
        let r = join_answer(&out, t);
        assert_eq!(r.error, None);
        let new = r.member_id.clone();
        assert_ne!(new, old);
        assert_eq!(r.generation_id, generation, "no rebalance");
        assert_eq!(
            r.leader, old,
            "a replaced leader is told the old id, as Kafka tells pre-v9 clients"
        );
        assert_eq!(h.g.state(), State::Stable);
        assert_eq!(h.g.leader(), Some(new.as_str()));
        assert!(h.g.take_dirty(), "the new id is durable state");
        // It keeps its assignment.
        let (t, out) = h.sync(SyncRequest {
            group_instance_id: Some("inst-s".into()),
            ..sync_req(&new, generation, vec![])
        });
        assert_eq!(sync_answer(&out, t).assignment, meta(&format!("to-{old}")));
        // The old id is fenced everywhere.
        let fenced = h.g.heartbeat(h.now, &old, Some("inst-s"), generation);
        assert_eq!(err_code(fenced), 82);
        assert_eq!(
            err_code(h.g.validate_commit(&old, Some("inst-s"), generation)),
            82
        );
        let (t, out) = h.join(static_req(&old, "s", "inst-s"));
        assert_eq!(code(&join_answer(&out, t).error), 82);
        assert_eq!(
            h.g.heartbeat(h.now, &new, Some("inst-s"), generation),
            Ok(())
        );
        assert_eq!(
            h.g.members()
                .filter(|m| m.group_instance_id == Some("inst-s"))
                .count(),
            1
        );
    }

    #[test]
    fn static_member_restart_fences_the_old_held_sync_and_rebalances_while_completing() {
        let mut h = H::new(config());
        let d = h.member_id_for(join_req("", "d"));
        let (_, _) = h.join(join_req(&d, "d"));
        let (_, _) = h.join(static_req("", "s", "inst-s"));
        let out = h.tick(0);
        let old = out
            .iter()
            .find_map(|o| match o {
                Output::Join(_, r) if r.member_id.starts_with("inst-s") => {
                    Some(r.member_id.clone())
                }
                _ => None,
            })
            .unwrap();
        assert_eq!(h.g.leader(), Some(d.as_str()));
        let generation = h.g.generation();
        let (t_old_sync, out) = h.sync(SyncRequest {
            group_instance_id: Some("inst-s".into()),
            ..sync_req(&old, generation, vec![])
        });
        assert!(out.is_empty(), "the follower waits");
        let (t_new, out) = h.join(static_req("", "s", "inst-s"));
        let fenced = sync_answer(&out, t_old_sync);
        assert_eq!(code(&fenced.error), 82);
        assert_eq!(h.g.state(), State::PreparingRebalance);
        assert_eq!(h.g.held_requests(), 1, "only the new join is held");
        // The dynamic leader rejoins and the rebalance completes.
        let (_, out) = h.join(join_req(&d, "d"));
        let r = join_answer(&out, t_new);
        assert_eq!(r.generation_id, generation + 1);
        assert_ne!(r.member_id, old);
    }

    #[test]
    fn static_member_that_does_not_rejoin_stays_until_it_times_out() {
        let mut h = H::new(config());
        let quick = |mut r: JoinRequest| {
            r.rebalance_timeout_ms = 5_000;
            r
        };
        let (ids, generation) = h.form(vec![
            quick(join_req("", "d")),
            quick(static_req("", "s", "inst-s")),
        ]);
        // The dynamic leader rejoins; the static member is silent.
        let (td, _) = h.join(quick(join_req(&ids[0], "d")));
        let out = h.tick(5_000);
        let r = join_answer(&out, td);
        assert_eq!(r.generation_id, generation + 1);
        assert_eq!(
            r.members.len(),
            2,
            "a static member that did not rejoin stays"
        );
        let assignments = vec![(ids[0].clone(), meta("D")), (ids[1].clone(), meta("S"))];
        let (t, out) = h.sync(sync_req(&ids[0], generation + 1, assignments));
        assert_eq!(sync_answer(&out, t).assignment, meta("D"));
        assert_eq!(h.g.state(), State::Stable);
        // It never syncs: removed at the sync deadline, and a rebalance starts.
        assert!(h.tick(4_999).is_empty());
        assert_eq!(h.g.members().count(), 2);
        h.tick(1);
        assert_eq!(h.g.members().count(), 1);
        assert_eq!(h.g.state(), State::PreparingRebalance);
    }

    #[test]
    fn session_expiry_during_a_rebalance_ends_the_join_phase() {
        let mut h = H::new(config());
        let (ids, generation) = h.form(vec![static_req("", "s", "inst-s"), join_req("", "d")]);
        // The static leader rejoins with new metadata, then its connection
        // drops (its join still counts); d stays silent.
        let mut r = static_req(&ids[0], "s", "inst-s");
        r.protocols = vec![("range".into(), meta("s2"))];
        let (ts, _) = h.join(r);
        h.g.cancel(ts);
        let out = h.tick(10_000);
        assert!(out.is_empty());
        assert!(
            !h.g.members().any(|m| m.member_id == ids[1]),
            "d's session ended"
        );
        assert_eq!(h.g.generation(), generation + 1, "s counted as joined");
    }

    #[test]
    fn leave_group_batch_reports_each_member() {
        let mut h = H::new(config());
        let (ids, generation) = h.form(vec![
            join_req("", "a"),
            join_req("", "b"),
            static_req("", "c", "i3"),
            static_req("", "d", "i4"),
        ]);
        h.g.take_dirty();
        let (results, out) = h.g.leave(
            h.now,
            &[
                (ids[0].clone(), None),
                ("nobody".into(), None),
                (String::new(), Some("i3".into())),
                ("someone-else".into(), Some("i4".into())),
                (ids[1].clone(), Some("i9".into())),
            ],
        );
        h.g.assert_invariants();
        let codes: Vec<i16> = results.into_iter().map(err_code).collect();
        assert_eq!(codes, vec![0, 25, 0, 82, 25]);
        assert!(out.is_empty());
        assert!(h.g.take_dirty());
        let left: BTreeSet<&str> = h.g.members().map(|m| m.member_id).collect();
        assert_eq!(left, BTreeSet::from([ids[1].as_str(), ids[3].as_str()]));
        assert_eq!(h.g.state(), State::PreparingRebalance);
        assert_eq!(
            h.g.leader(),
            Some(ids[1].as_str()),
            "the leader left: the next member leads"
        );
        // Both remaining members rejoin: generation 2.
        let (_, _) = h.join(join_req(&ids[1], "b"));
        let (t, out) = h.join(static_req(&ids[3], "d", "i4"));
        assert_eq!(join_answer(&out, t).generation_id, generation + 1);
        // The last two leave: the group empties through a rebalance.
        let (results, _) = h.g.leave(
            h.now,
            &[(ids[1].clone(), None), (ids[3].clone(), Some("i4".into()))],
        );
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(h.g.state(), State::Empty);
        assert_eq!(h.g.generation(), generation + 2);
        assert_eq!(h.g.protocol_name(), None);
    }

    #[test]
    fn leaving_releases_a_held_join_with_unknown_member_id() {
        let mut h = H::new(config());
        let (ids, _) = h.form(vec![join_req("", "a"), join_req("", "b")]);
        let (ta, _) = h.join(join_req(&ids[0], "a"));
        let (results, out) = h.g.leave(h.now, &[(ids[0].clone(), None)]);
        assert_eq!(results, vec![Ok(())]);
        assert_eq!(code(&join_answer(&out, ta).error), 25);
        assert_eq!(h.g.held_requests(), 0);
    }

    #[test]
    fn protocol_vote_picks_the_most_preferred_common_protocol() {
        let mut h = H::new(config());
        let proto = |names: &[&str], who: &str| -> Vec<(String, Bytes)> {
            names
                .iter()
                .map(|n| (n.to_string(), meta(&format!("{who}:{n}"))))
                .collect()
        };
        let mut reqs = Vec::new();
        for (who, names) in [
            ("a", &["range", "roundrobin"][..]),
            ("b", &["roundrobin", "range"][..]),
            ("c", &["sticky", "roundrobin", "range"][..]),
        ] {
            let mut r = join_req("", who);
            r.protocols = proto(names, who);
            reqs.push(r);
        }
        let (ids, _) = h.form(reqs);
        // sticky is not common; roundrobin gets b's and c's votes.
        assert_eq!(h.g.protocol_name(), Some("roundrobin"));
        let metas: Vec<Bytes> = h.g.members().map(|m| m.metadata.unwrap().clone()).collect();
        assert!(metas.iter().all(|m| m.ends_with(b":roundrobin")));
        // A member sharing no protocol with the group is refused, first step
        // or not; so is another protocol type.
        let mut r = join_req("", "d");
        r.protocols = proto(&["sticky"], "d");
        let (t, out) = h.join(r);
        assert_eq!(code(&join_answer(&out, t).error), 23);
        let mut r = join_req("", "e");
        r.protocol_type = "connect".into();
        let (t, out) = h.join(r);
        assert_eq!(code(&join_answer(&out, t).error), 23);
        let mut r = join_req(&ids[0], "a");
        r.protocols = proto(&["sticky"], "a");
        let (t, out) = h.join(r);
        assert_eq!(code(&join_answer(&out, t).error), 23);
        assert_eq!(h.g.state(), State::Stable);
    }

    #[test]
    fn commit_validation_follows_kafka() {
        let mut h = H::new(config());
        assert_eq!(
            h.g.validate_commit("", None, -1),
            Ok(()),
            "admin commit to an empty group"
        );
        assert_eq!(h.g.validate_commit("whoever", None, -1), Ok(()));
        assert_eq!(err_code(h.g.validate_commit("x", None, 0)), 25);
        let (ids, generation) = h.form(vec![join_req("", "a"), static_req("", "b", "ib")]);
        assert_eq!(h.g.validate_commit(&ids[0], None, generation), Ok(()));
        assert_eq!(h.g.validate_commit(&ids[1], Some("ib"), generation), Ok(()));
        assert_eq!(
            err_code(h.g.validate_commit(&ids[0], None, generation + 1)),
            22
        );
        assert_eq!(
            err_code(h.g.validate_commit("nobody", None, generation)),
            25
        );
        assert_eq!(err_code(h.g.validate_commit("", None, -1)), 25, "not empty");
        assert_eq!(
            err_code(h.g.validate_commit(&ids[0], Some("ib"), generation)),
            82
        );
        assert_eq!(
            err_code(h.g.validate_commit(&ids[0], Some("ix"), generation)),
            25
        );
        // PreparingRebalance: the current generation may still commit.
        let (_, _) = h.join(join_req(&ids[0], "a"));
        assert_eq!(h.g.state(), State::PreparingRebalance);
        assert_eq!(h.g.validate_commit(&ids[1], Some("ib"), generation), Ok(()));
        // CompletingRebalance: REBALANCE_IN_PROGRESS.
        let (_, _) = h.join(static_req(&ids[1], "b", "ib"));
        assert_eq!(h.g.state(), State::CompletingRebalance);
        assert_eq!(
            err_code(h.g.validate_commit(&ids[0], None, generation + 1)),
            27
        );
        assert_eq!(err_code(h.g.validate_commit(&ids[0], None, generation)), 22);
        h.g.mark_dead();
        assert_eq!(
            err_code(h.g.validate_commit(&ids[0], None, generation + 1)),
            15
        );
    }

    #[test]
    fn session_expiry_removes_a_member_and_rebalances() {
        let mut h = H::new(config());
        let (ids, generation) = h.form(vec![join_req("", "a"), join_req("", "b")]);
        h.g.take_dirty();
        for _ in 0..2 {
            h.tick(4_000);
            assert_eq!(h.heartbeat(&ids[0], generation), Ok(()));
        }
        assert!(!h.g.take_dirty());
        h.tick(4_000);
        assert_eq!(
            err_code(h.heartbeat(&ids[0], generation)),
            27,
            "b's session ended"
        );
        assert_eq!(h.g.state(), State::PreparingRebalance);
        assert!(h.g.take_dirty());
        assert_eq!(h.g.members().count(), 1);
        let (t, out) = h.join(join_req(&ids[0], "a"));
        assert_eq!(join_answer(&out, t).generation_id, generation + 1);
    }

    #[test]
    fn last_member_expiring_empties_the_group() {
        let mut h = H::new(config());
        let (_, generation) = h.form(vec![join_req("", "a")]);
        h.g.take_dirty();
        h.tick(10_000);
        assert_eq!(h.g.state(), State::Empty);
        assert_eq!(h.g.generation(), generation + 1);
        assert_eq!(h.g.leader(), None);
        assert!(h.g.take_dirty());
        assert_eq!(h.g.next_deadline(), None);
        assert_eq!(
            h.g.protocol_type(),
            Some("consumer"),
            "kept while Empty, as Kafka"
        );
    }

    #[test]
    fn pending_member_expires_after_its_session_timeout() {
        let mut h = H::new(config());
        let id = h.member_id_for(join_req("", "a"));
        assert_eq!(h.g.next_deadline(), Some(h.now + 10_000));
        h.tick(10_000);
        assert_eq!(h.g.next_deadline(), None);
        let (t, out) = h.join(join_req(&id, "a"));
        assert_eq!(code(&join_answer(&out, t).error), 25);
    }

    #[test]
    fn pending_member_holds_back_a_rebalance_until_it_joins() {
        let mut h = H::new(config());
        let (ids, generation) = h.form(vec![join_req("", "a")]);
        let b = h.member_id_for(join_req("", "b"));
        let (ta, out) = h.join(join_req(&ids[0], "a"));
        assert!(out.is_empty(), "b is pending: the join phase waits");
        let (tb, out) = h.join(join_req(&b, "b"));
        assert_eq!(join_answer(&out, ta).generation_id, generation + 1);
        assert_eq!(join_answer(&out, tb).generation_id, generation + 1);
    }

    #[test]
    fn member_that_does_not_sync_is_removed_at_the_rebalance_timeout() {
        let mut h = H::new(config());
        let a = h.member_id_for(join_req("", "a"));
        let b = h.member_id_for(join_req("", "b"));
        h.join(join_req(&a, "a"));
        h.join(join_req(&b, "b"));
        h.tick(0);
        let generation = h.g.generation();
        let (t, out) = h.sync(sync_req(
            &a,
            generation,
            vec![(a.clone(), meta("x")), (b.clone(), meta("y"))],
        ));
        assert_eq!(sync_answer(&out, t).assignment, meta("x"));
        assert_eq!(h.g.state(), State::Stable);
        // b heartbeats but never syncs.
        for _ in 0..6 {
            h.tick(5_000);
            let _ = h.heartbeat(&b, generation);
            let _ = h.heartbeat(&a, generation);
        }
        assert_eq!(h.g.state(), State::PreparingRebalance);
        assert!(!h.g.members().any(|m| m.member_id == b));
    }

    #[test]
    fn group_max_size_refuses_extra_members() {
        let mut h = H::new(Config {
            max_size: 2,
            ..config()
        });
        let (ids, generation) = h.form(vec![join_req("", "a"), static_req("", "b", "ib")]);
        let (t, out) = h.join(join_req("", "c"));
        assert_eq!(
            code(&join_answer(&out, t).error),
            81,
            "refused before an id is handed out"
        );
        assert_eq!(h.g.state(), State::Stable);
        // A restarting static member is not refused (it adds nobody).
        let (t, out) = h.join(static_req("", "b", "ib"));
        assert_eq!(join_answer(&out, t).error, None);
        assert_eq!(join_answer(&out, t).generation_id, generation);
        // An existing member is not refused.
        let (t, out) = h.join(join_req(&ids[0], "a"));
        assert!(out.is_empty(), "the leader's join starts a rebalance");
        h.g.cancel(t);
        // While preparing, a new member counts against members awaiting join.
        let (t, out) = h.join(JoinRequest {
            require_known_member_id: false,
            ..join_req("", "c")
        });
        assert_eq!(out.len(), 0, "one awaiting of two: accepted");
        h.g.cancel(t);
        let (t, out) = h.join(JoinRequest {
            require_known_member_id: false,
            ..join_req("", "e")
        });
        assert_eq!(code(&join_answer(&out, t).error), 81);
    }

    #[test]
    fn session_timeout_out_of_bounds_is_refused() {
        let mut h = H::new(config());
        for ms in [99, 60_001] {
            let mut r = join_req("", "a");
            r.session_timeout_ms = ms;
            let (t, out) = h.join(r);
            assert_eq!(code(&join_answer(&out, t).error), 26);
        }
        assert_eq!(h.g.next_deadline(), None);
    }

    #[test]
    fn oversized_requests_are_refused() {
        let mut h = H::new(config());
        let mut r = join_req("", "a");
        r.protocols = (0..=PROTOCOLS_MAX)
            .map(|i| (format!("p{i}"), Bytes::new()))
            .collect();
        let (t, out) = h.join(r);
        assert_eq!(code(&join_answer(&out, t).error), 42);
        let mut r = join_req("", "a");
        r.protocols = vec![(
            "range".into(),
            Bytes::from(vec![0; MEMBER_METADATA_BYTES_MAX + 1]),
        )];
        let (t, out) = h.join(r);
        assert_eq!(code(&join_answer(&out, t).error), 42);
        let mut r = join_req("", "a");
        r.client_id = "x".repeat(NAME_BYTES_MAX + 1);
        let (t, out) = h.join(r);
        assert_eq!(code(&join_answer(&out, t).error), 42);
        let (ids, generation) = h.form(vec![join_req("", "a")]);
        let too_many = vec![(ids[0].clone(), Bytes::new()), ("x".into(), Bytes::new())];
        let (t, out) = h.sync(sync_req(&ids[0], generation, too_many));
        assert_eq!(code(&sync_answer(&out, t).error), 42);
        let big = vec![(
            ids[0].clone(),
            Bytes::from(vec![0; ASSIGNMENT_BYTES_MAX + 1]),
        )];
        let (t, out) = h.sync(sync_req(&ids[0], generation, big));
        assert_eq!(code(&sync_answer(&out, t).error), 42);
    }

    #[test]
    fn a_second_join_from_the_same_member_answers_the_first() {
        let mut h = H::new(config());
        let (ids, _) = h.form(vec![join_req("", "a"), join_req("", "b")]);
        let (t1, _) = h.join(join_req(&ids[0], "a"));
        let (t2, out) = h.join(join_req(&ids[0], "a"));
        assert_eq!(code(&join_answer(&out, t1).error), 27);
        assert_eq!(h.g.held_requests(), 1);
        let (_, out) = h.join(join_req(&ids[1], "b"));
        assert_eq!(join_answer(&out, t2).error, None);
    }

    #[test]
    fn cancelled_join_still_counts_and_the_member_expires_later() {
        let mut h = H::new(config());
        let (ids, generation) = h.form(vec![join_req("", "a"), join_req("", "b")]);
        let (ta, _) = h.join(join_req(&ids[0], "a"));
        h.g.cancel(ta);
        h.g.cancel(ta);
        h.g.cancel(12345);
        h.g.assert_invariants();
        assert_eq!(h.g.held_requests(), 0);
        let (tb, out) = h.join(join_req(&ids[1], "b"));
        assert_eq!(out.len(), 1, "a's answer is not produced");
        assert_eq!(join_answer(&out, tb).generation_id, generation + 1);
        assert!(h.g.members().any(|m| m.member_id == ids[0]), "a stays");
        // a never syncs: its session ends (or the sync deadline).
        h.tick(10_000);
        assert!(!h.g.members().any(|m| m.member_id == ids[0]));
    }

    #[test]
    fn mark_dead_answers_held_requests_with_not_coordinator() {
        let mut h = H::new(config());
        let (ids, generation) = h.form(vec![join_req("", "a"), join_req("", "b")]);
        let (ta, _) = h.join(join_req(&ids[0], "a"));
        let out = h.g.mark_dead();
        assert_eq!(code(&join_answer(&out, ta).error), 16);
        assert_eq!(h.g.held_requests(), 0);
        assert_eq!(h.g.state(), State::Dead);
        assert_eq!(h.g.next_deadline(), None);
        assert_eq!(
            err_code(h.g.heartbeat(h.now, &ids[1], None, generation)),
            15
        );
        let (t, out) = h.join(join_req("", "c"));
        assert_eq!(code(&join_answer(&out, t).error), 15);
        let (t, out) = h.sync(sync_req(&ids[1], generation, vec![]));
        assert_eq!(code(&sync_answer(&out, t).error), 15);
        let (results, _) = h.g.leave(h.now, &[(ids[1].clone(), None)]);
        assert_eq!(err_code(results[0].clone()), 15);
    }

    #[test]
    fn snapshot_round_trips_and_restores() {
        let mut h = H::new(config());
        let (ids, generation) = h.form(vec![join_req("", "a"), static_req("", "b", "ib")]);
        assert!(h.g.take_dirty());
        let snap = h.g.snapshot();
        assert_eq!(snap.state, SnapshotState::Stable);
        assert_eq!(snap.members.len(), 2);
        let bytes = snap.encode();
        assert_eq!(bytes[0], SNAPSHOT_VERSION);
        assert_eq!(Snapshot::decode(&bytes), Ok(snap.clone()));

        let later = h.now + 60_000;
        let mut g = ClassicGroup::restore(Snapshot::decode(&bytes).unwrap(), config(), later);
        g.assert_invariants();
        assert!(!g.take_dirty());
        assert_eq!(g.state(), State::Stable);
        assert_eq!(g.generation(), generation);
        assert_eq!(g.leader(), h.g.leader());
        assert_eq!(g.protocol_name(), Some("range"));
        let before: Vec<_> =
            h.g.members()
                .map(|m| (m.member_id.to_string(), m.assignment.clone()))
                .collect();
        let after: Vec<_> = g
            .members()
            .map(|m| (m.member_id.to_string(), m.assignment.clone()))
            .collect();
        assert_eq!(before, after);
        // Members carry on: fresh sessions from the restore time.
        assert_eq!(g.next_deadline(), Some(later + 10_000));
        assert_eq!(g.heartbeat(later, &ids[0], None, generation), Ok(()));
        let out = g.sync(later, 1, sync_req(&ids[1], generation, vec![]));
        assert_eq!(
            sync_answer(&out, 1).assignment,
            meta(&format!("to-{}", ids[1]))
        );
        assert_eq!(g.snapshot(), snap);

        // Taken while completing: restored members sync again.
        let (_, _) = h.join(join_req(&ids[0], "a"));
        let (_, _) = h.join(static_req(&ids[1], "b", "ib"));
        assert_eq!(h.g.state(), State::CompletingRebalance);
        assert!(h.g.take_dirty(), "a new generation is dirty");
        let snap = h.g.snapshot();
        assert_eq!(snap.state, SnapshotState::CompletingRebalance);
        let mut g =
            ClassicGroup::restore(Snapshot::decode(&snap.encode()).unwrap(), config(), later);
        assert_eq!(g.state(), State::CompletingRebalance);
        assert_eq!(g.generation(), generation + 1);
        let out = g.sync(later, 1, sync_req(&ids[1], generation + 1, vec![]));
        assert!(out.is_empty());
        let assignments = vec![(ids[0].clone(), meta("A")), (ids[1].clone(), meta("B"))];
        let out = g.sync(later, 2, sync_req(&ids[0], generation + 1, assignments));
        assert_eq!(sync_answer(&out, 1).assignment, meta("B"));
        assert_eq!(g.state(), State::Stable);
        g.assert_invariants();

        // Taken while preparing (a member left): restore rebalances.
        let (_, _) = h.g.leave(h.now, &[(ids[0].clone(), None)]);
        assert!(h.g.take_dirty());
        let snap = h.g.snapshot();
        assert_eq!(snap.state, SnapshotState::PreparingRebalance);
        let mut g =
            ClassicGroup::restore(Snapshot::decode(&snap.encode()).unwrap(), config(), later);
        g.assert_invariants();
        assert_eq!(g.state(), State::PreparingRebalance);
        assert_eq!(
            err_code(g.heartbeat(later, &ids[1], Some("ib"), generation + 1)),
            27
        );
        let out = g.join(later, 7, static_req(&ids[1], "b", "ib"), || unreachable!());
        assert_eq!(join_answer(&out, 7).generation_id, generation + 2);
    }

    #[test]
    fn snapshot_of_an_empty_group_keeps_generation_and_protocol_type() {
        let mut h = H::new(config());
        let (ids, _) = h.form(vec![join_req("", "a")]);
        h.g.leave(h.now, &[(ids[0].clone(), None)]);
        let snap = h.g.snapshot();
        assert_eq!(snap.state, SnapshotState::Empty);
        let g = ClassicGroup::restore(Snapshot::decode(&snap.encode()).unwrap(), config(), 0);
        assert_eq!(g.state(), State::Empty);
        assert_eq!(g.generation(), 2);
        assert_eq!(g.protocol_type(), Some("consumer"));
    }

    #[test]
    fn restore_rebalances_a_group_over_a_lowered_max_size() {
        let mut h = H::new(config());
        h.form(vec![
            join_req("", "a"),
            join_req("", "b"),
            join_req("", "c"),
        ]);
        let small = Config {
            max_size: 2,
            ..config()
        };
        let g = ClassicGroup::restore(h.g.snapshot(), small, 0);
        g.assert_invariants();
        assert_eq!(g.state(), State::PreparingRebalance);
    }

    #[test]
    fn truncated_or_corrupt_snapshots_are_errors() {
        let mut h = H::new(config());
        h.form(vec![join_req("", "a"), static_req("", "b", "ib")]);
        let bytes = h.g.snapshot().encode();
        for len in 0..bytes.len() {
            assert!(
                matches!(
                    Snapshot::decode(&bytes[..len]),
                    Err(SnapshotError::Truncated { .. })
                ),
                "prefix of {len} bytes"
            );
        }
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert_eq!(
            Snapshot::decode(&longer),
            Err(SnapshotError::TrailingBytes { len: 1 })
        );
        let mut wrong_version = bytes.to_vec();
        wrong_version[0] = 9;
        assert_eq!(
            Snapshot::decode(&wrong_version),
            Err(SnapshotError::UnknownVersion { version: 9 })
        );
        let mut negative = bytes.to_vec();
        negative[1] = 0x80;
        assert!(matches!(
            Snapshot::decode(&negative),
            Err(SnapshotError::Inconsistent { .. })
        ));
        let mut bad_state = bytes.to_vec();
        bad_state[5] = 7;
        assert!(matches!(
            Snapshot::decode(&bad_state),
            Err(SnapshotError::BadField { .. })
        ));
        let mut s = h.g.snapshot();
        s.leader = Some("nobody".into());
        assert!(matches!(
            Snapshot::decode(&s.encode()),
            Err(SnapshotError::Inconsistent { .. })
        ));
        let mut s = h.g.snapshot();
        s.members[1].group_instance_id = None;
        s.members[0].member_id = s.members[1].member_id.clone();
        assert!(matches!(
            Snapshot::decode(&s.encode()),
            Err(SnapshotError::Inconsistent { .. })
        ));
        // A huge member count is refused before any allocation.
        let huge = [
            SNAPSHOT_VERSION,
            0,
            0,
            0,
            1,
            3,
            0,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
        ];
        assert!(matches!(
            Snapshot::decode(&huge),
            Err(SnapshotError::BadField { .. })
        ));
    }

    proptest! {
        #[test]
        fn decode_never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Snapshot::decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_a_damaged_snapshot(
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        ) {
            let mut h = H::new(config());
            h.form(vec![join_req("", "a"), static_req("", "b", "ib")]);
            let mut bytes = h.g.snapshot().encode().to_vec();
            for (at, value) in flips {
                let i = at % bytes.len();
                bytes[i] = value;
            }
            if let Ok(s) = Snapshot::decode(&bytes) {
                // Whatever decodes can be restored.
                ClassicGroup::restore(s, config(), 0).assert_invariants();
            }
        }
    }

    // ----- simulation ------------------------------------------------------

    const CLIENTS: usize = 5;

    #[derive(Clone, Debug)]
    enum Op {
        /// `restart`: forget the member id (a static member restarting).
        Join {
            c: usize,
            restart: bool,
            alt: bool,
        },
        Sync {
            c: usize,
        },
        Heartbeat {
            c: usize,
        },
        Leave {
            c: usize,
            by_instance: bool,
        },
        Tick {
            ms: u32,
        },
        Cancel {
            pick: usize,
        },
        Restore,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (0..CLIENTS, (0..8u8).prop_map(|x| x == 0), (0..6u8).prop_map(|x| x == 0))
                .prop_map(|(c, restart, alt)| Op::Join { c, restart, alt }),
            8 => (0..CLIENTS).prop_map(|c| Op::Sync { c }),
            4 => (0..CLIENTS).prop_map(|c| Op::Heartbeat { c }),
            1 => (0..CLIENTS, any::<bool>())
                .prop_map(|(c, by_instance)| Op::Leave { c, by_instance }),
            4 => prop_oneof![0..50u32, 0..4_000u32, 0..20_000u32].prop_map(|ms| Op::Tick { ms }),
            1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
            1 => Just(Op::Restore),
        ]
    }

    #[derive(Clone, Debug, Default)]
    struct Client {
        member_id: String,
        generation: i32,
        leader: bool,
        peers: Vec<String>,
    }

    fn instance(c: usize) -> Option<String> {
        (c < 2).then(|| format!("i{c}"))
    }

    fn sim_config() -> Config {
        Config {
            initial_rebalance_delay_ms: 300,
            max_size: 4,
            session_timeout_min_ms: 100,
            session_timeout_max_ms: 60_000,
            new_member_join_timeout_ms: 20_000,
        }
    }

    struct Sim {
        g: ClassicGroup,
        now: u64,
        clients: Vec<Client>,
        outstanding: HashMap<Token, usize>,
        next_token: Token,
        next_id: u64,
        persisted: Bytes,
        max_generation: i32,
    }

    impl Sim {
        fn new() -> Self {
            let g = ClassicGroup::new(sim_config());
            let persisted = g.snapshot().encode();
            Sim {
                g,
                now: T0,
                clients: vec![Client::default(); CLIENTS],
                outstanding: HashMap::new(),
                next_token: 0,
                next_id: 0,
                persisted,
                max_generation: 0,
            }
        }

        fn token_for(&mut self, c: usize) -> Token {
            self.next_token += 1;
            self.outstanding.insert(self.next_token, c);
            self.next_token
        }

        /// Routes answers to their clients; each token exactly once.
        fn deliver(&mut self, out: Vec<Output>) -> i32 {
            let mut shown = i32::MIN;
            for o in out {
                let c = self
                    .outstanding
                    .remove(&o.token())
                    .unwrap_or_else(|| panic!("token {} answered twice or never held", o.token()));
                let client = &mut self.clients[c];
                match o {
                    Output::Join(_, r) => match r.error {
                        None => {
                            shown = shown.max(r.generation_id);
                            client.member_id = r.member_id.clone();
                            client.generation = r.generation_id;
                            client.leader = r.leader == r.member_id;
                            client.peers = r.members.iter().map(|m| m.member_id.clone()).collect();
                        }
                        Some(ClassicError::MemberIdRequired) => client.member_id = r.member_id,
                        Some(ClassicError::UnknownMemberId | ClassicError::FencedInstanceId) => {
                            client.member_id.clear()
                        }
                        Some(_) => {}
                    },
                    Output::Sync(_, r) => {
                        if matches!(
                            r.error,
                            Some(ClassicError::UnknownMemberId | ClassicError::FencedInstanceId)
                        ) {
                            client.member_id.clear();
                        }
                    }
                }
            }
            shown
        }

        fn request(&self, c: usize, alt: bool) -> JoinRequest {
            let protocols = match (alt, c) {
                (false, _) => vec![
                    ("range".to_string(), meta(&format!("c{c}"))),
                    ("roundrobin".to_string(), meta(&format!("c{c}"))),
                ],
                (true, 4) => vec![("sticky".to_string(), meta("c4"))],
                (true, _) => vec![("roundrobin".to_string(), meta(&format!("c{c}-alt")))],
            };
            JoinRequest {
                member_id: self.clients[c].member_id.clone(),
                group_instance_id: instance(c),
                client_id: format!("c{c}"),
                client_host: "/10.0.0.1".into(),
                protocol_type: "consumer".into(),
                protocols,
                session_timeout_ms: 3_000,
                rebalance_timeout_ms: 5_000,
                require_known_member_id: c != 3,
            }
        }

        fn step(&mut self, op: &Op) {
            let now = self.now;
            let mut shown = i32::MIN;
            match *op {
                Op::Join { c, restart, alt } => {
                    if restart {
                        self.clients[c].member_id.clear();
                    }
                    let req = self.request(c, alt);
                    let t = self.token_for(c);
                    self.next_id += 1;
                    let fresh = format!("{:06}", self.next_id);
                    let out = self.g.join(now, t, req, move || fresh);
                    shown = self.deliver(out);
                }
                Op::Sync { c } => {
                    let client = &self.clients[c];
                    let assignments = if client.leader {
                        client
                            .peers
                            .iter()
                            .map(|p| (p.clone(), meta(&format!("for-{p}"))))
                            .collect()
                    } else {
                        Vec::new()
                    };
                    let req = SyncRequest {
                        member_id: client.member_id.clone(),
                        group_instance_id: instance(c),
                        generation_id: client.generation,
                        protocol_type: Some("consumer".into()),
                        protocol_name: None,
                        assignments,
                    };
                    let t = self.token_for(c);
                    let out = self.g.sync(now, t, req);
                    shown = self.deliver(out);
                }
                Op::Heartbeat { c } => {
                    let client = &self.clients[c];
                    let r = self.g.heartbeat(
                        now,
                        &client.member_id,
                        instance(c).as_deref(),
                        client.generation,
                    );
                    if matches!(
                        r,
                        Err(ClassicError::UnknownMemberId | ClassicError::FencedInstanceId)
                    ) {
                        self.clients[c].member_id.clear();
                    }
                }
                Op::Leave { c, by_instance } => {
                    let who = match (by_instance, instance(c)) {
                        (true, Some(i)) => (String::new(), Some(i)),
                        (_, i) => (self.clients[c].member_id.clone(), i),
                    };
                    let (results, out) = self.g.leave(now, &[who]);
                    assert_eq!(results.len(), 1);
                    if results[0].is_ok() {
                        self.clients[c].member_id.clear();
                    }
                    shown = self.deliver(out);
                }
                Op::Tick { ms } => {
                    self.now += u64::from(ms);
                    let out = self.g.tick(self.now);
                    shown = self.deliver(out);
                }
                Op::Cancel { pick } => {
                    if !self.outstanding.is_empty() {
                        let mut tokens: Vec<Token> = self.outstanding.keys().copied().collect();
                        tokens.sort_unstable();
                        let t = tokens[pick % tokens.len()];
                        self.g.cancel(t);
                        self.outstanding.remove(&t);
                    }
                }
                Op::Restore => {
                    let snapshot =
                        Snapshot::decode(&self.persisted).expect("persisted snapshots decode");
                    self.g = ClassicGroup::restore(snapshot, sim_config(), self.now);
                    // The process died: so did every waiting connection.
                    self.outstanding.clear();
                }
            }
            self.check(shown);
        }

        fn check(&mut self, shown: i32) {
            self.g.assert_invariants();
            if self.g.take_dirty() {
                let snapshot = self.g.snapshot();
                self.persisted = snapshot.encode();
                assert_eq!(Snapshot::decode(&self.persisted).as_ref(), Ok(&snapshot));
            }
            let generation = self.g.generation();
            assert!(generation >= self.max_generation, "generation went back");
            self.max_generation = generation;
            let durable = Snapshot::decode(&self.persisted).unwrap().generation;
            assert!(
                shown <= durable,
                "generation {shown} shown before it was durable ({durable})"
            );
            assert_eq!(
                self.outstanding.len(),
                self.g.held_requests(),
                "held tokens"
            );
            let mut instances = HashSet::new();
            for m in self.g.members() {
                if let Some(i) = m.group_instance_id {
                    assert!(
                        instances.insert(i.to_string()),
                        "two members with instance {i}"
                    );
                }
            }
            for c in 0..CLIENTS {
                let client = self.clients[c].clone();
                let inst = instance(c);
                for generation in [client.generation, client.generation + 1, -1] {
                    self.check_commit(&client.member_id, inst.as_deref(), generation);
                    self.check_commit(&client.member_id, None, generation);
                }
            }
            self.check_commit("", None, -1);
        }

        fn check_commit(&self, member_id: &str, instance_id: Option<&str>, generation: i32) {
            let state = self.g.state();
            let is_member = self.g.members().any(|m| {
                m.member_id == member_id
                    && instance_id.is_none_or(|i| m.group_instance_id == Some(i))
            });
            let expected = (generation < 0 && state == State::Empty)
                || (is_member
                    && generation == self.g.generation()
                    && matches!(state, State::Stable | State::PreparingRebalance));
            let got = self.g.validate_commit(member_id, instance_id, generation);
            assert_eq!(
                got.is_ok(),
                expected,
                "commit({member_id}, {instance_id:?}, {generation}) in {state:?}: {got:?}"
            );
        }

        /// With every client gone quiet, the group must empty and answer
        /// everything it holds.
        fn drain(&mut self) {
            for _ in 0..10_000 {
                let Some(at) = self.g.next_deadline() else {
                    break;
                };
                self.now = self.now.max(at);
                let out = self.g.tick(self.now);
                let shown = self.deliver(out);
                self.check(shown);
            }
            assert_eq!(self.g.next_deadline(), None, "timers keep firing");
            assert_eq!(self.g.state(), State::Empty);
            assert_eq!(self.g.held_requests(), 0);
            assert!(self.outstanding.is_empty());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn simulation_keeps_invariants(ops in proptest::collection::vec(op(), 1..250)) {
            let mut sim = Sim::new();
            for op in &ops {
                sim.step(op);
            }
            sim.drain();
        }
    }

    #[test]
    fn simulation_reaches_stable_generations() {
        // A fixed, cooperative run: the simulation is not vacuous.
        let mut sim = Sim::new();
        let mut stable_seen = 0;
        for round in 0..40 {
            for c in 0..CLIENTS {
                sim.step(&Op::Join {
                    c,
                    restart: false,
                    alt: false,
                });
            }
            sim.step(&Op::Tick { ms: 400 });
            for c in 0..CLIENTS {
                sim.step(&Op::Join {
                    c,
                    restart: false,
                    alt: false,
                });
            }
            for c in 0..CLIENTS {
                sim.step(&Op::Sync { c });
            }
            if sim.g.state() == State::Stable {
                stable_seen += 1;
            }
            for c in 0..CLIENTS {
                sim.step(&Op::Heartbeat { c });
            }
            if round % 10 == 9 {
                sim.step(&Op::Restore);
            }
            sim.step(&Op::Tick { ms: 1_000 });
        }
        assert!(stable_seen > 20, "stable in {stable_seen} rounds");
        assert!(sim.g.generation() >= 1);
        sim.drain();
    }
}
