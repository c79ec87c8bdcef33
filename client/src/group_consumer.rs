//! A [`GroupConsumer`]: a [`Consumer`] whose partitions come from a
//! consumer group, with committed offsets.
//!
//! [`GroupConsumer::subscribe`] joins the group; the broker's coordinator
//! assigns the subscribed topics' partitions among the members with the
//! group's assignor (range, round-robin or cooperative-sticky) and
//! rebalances when members join, leave or die. Every partition is
//! consumed by exactly one member at a time; members beyond the number of
//! partitions get nothing and stay idle.
//!
//! ## Heartbeats and polling
//!
//! A background tokio task (on its own connection) heartbeats with the
//! partitions the consumer owns. The coordinator holds a heartbeat whose
//! answer would change nothing for up to
//! [`GroupConsumerConfig::heartbeat_interval`] and answers as soon as the
//! assignment changes, so rebalances propagate without polling delay.
//! Assignment changes are applied inside [`GroupConsumer::poll`]:
//! revoked partitions first ([`RebalanceListener::on_revoked`]), then
//! new ones ([`RebalanceListener::on_assigned`]), which start at the
//! group's committed offset (or per
//! [`ConsumerConfig::auto_offset_reset`] without one). A partition is
//! handed to its new owner only after the old owner reported it released.
//! With an eager assignor (range, round-robin) a new generation revokes
//! everything first; with cooperative-sticky only what moves is revoked.
//!
//! If the application does not call `poll` for
//! [`GroupConsumerConfig::max_poll_interval`], the consumer leaves the
//! group (and the coordinator expels it too); without heartbeats for
//! [`GroupConsumerConfig::session_timeout`] (a dead process) the
//! coordinator expels it. Either way its partitions go to the others;
//! the next `poll` reports them through [`RebalanceListener::on_lost`]
//! and rejoins.
//!
//! ## Commits
//!
//! Nothing is committed unless asked: [`GroupConsumer::commit_sync`] (the
//! positions, i.e. everything `poll` returned), [`GroupConsumer::commit_offsets`]
//! (given offsets, with optional metadata), [`GroupConsumer::commit_async`].
//! A commit from a member that was expelled, or for a partition it no
//! longer owns, is refused (`UnknownMemberId` / `IllegalGeneration`).
//! With [`GroupConsumerConfig::enable_auto_commit`] the positions are
//! committed every `auto_commit_interval` from inside `poll`, before
//! partitions are revoked, and on `close`. **Auto-commit can skip records
//! after a crash**: it commits what `poll` returned, so records handed to
//! other tasks and not yet processed when the commit happens are lost if
//! the process dies. Commit after processing for at-least-once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use weir_proto::error_code::ErrorCode;
use weir_proto::messages::{CommitOffset, CommittedOffset, HeartbeatRequest, JoinGroupRequest};

use crate::groups::{from_wire, to_wire, TopicPartition};
use crate::{Client, ClientError, Consumer, ConsumerConfig, ConsumerRecord, Result};

/// How a group spreads partitions over its members (every member of a
/// group must use the same one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GroupAssignor {
    /// Per topic, contiguous ranges in member order (Kafka's `range`).
    /// Eager: a rebalance revokes everything.
    Range,
    /// All partitions dealt round-robin (Kafka's `roundrobin`). Eager.
    RoundRobin,
    /// Balanced and sticky: only partitions that must move are revoked
    /// (Kafka's `cooperative-sticky`). The default.
    #[default]
    CooperativeSticky,
}

impl GroupAssignor {
    /// The name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            GroupAssignor::Range => "range",
            GroupAssignor::RoundRobin => "roundrobin",
            GroupAssignor::CooperativeSticky => "cooperative-sticky",
        }
    }

    /// Whether a new generation revokes every partition.
    pub fn is_eager(self) -> bool {
        self != GroupAssignor::CooperativeSticky
    }
}

impl std::str::FromStr for GroupAssignor {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "range" => Ok(GroupAssignor::Range),
            "roundrobin" => Ok(GroupAssignor::RoundRobin),
            "cooperative-sticky" => Ok(GroupAssignor::CooperativeSticky),
            _ => Err(format!(
                "unknown assignor `{s}`: use range, roundrobin or cooperative-sticky"
            )),
        }
    }
}

/// Settings of a [`GroupConsumer`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GroupConsumerConfig {
    /// The group id.
    pub group_id: String,
    /// Shown by `weir group describe`; the start of the member id.
    /// Default `"weir-client"`.
    pub client_id: String,
    /// The assignor. Default [`GroupAssignor::CooperativeSticky`].
    pub assignor: GroupAssignor,
    /// The member is expelled after this long without a heartbeat.
    /// Default 10 s.
    pub session_timeout: Duration,
    /// Longest the coordinator holds a heartbeat (the member heartbeats
    /// at least this often). Default 3 s (at most a third of the session
    /// timeout is used).
    pub heartbeat_interval: Duration,
    /// The member leaves the group if the application does not poll for
    /// this long. Default 300 s.
    pub max_poll_interval: Duration,
    /// Commit positions automatically (see the module docs). Default
    /// false.
    pub enable_auto_commit: bool,
    /// How often auto-commit commits. Default 5 s.
    pub auto_commit_interval: Duration,
    /// Fetch settings; `auto_offset_reset` applies to partitions without a
    /// committed offset.
    pub consumer: ConsumerConfig,
}

impl GroupConsumerConfig {
    /// The defaults for `group_id`.
    pub fn new(group_id: impl Into<String>) -> GroupConsumerConfig {
        GroupConsumerConfig {
            group_id: group_id.into(),
            client_id: "weir-client".into(),
            assignor: GroupAssignor::default(),
            session_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(3),
            max_poll_interval: Duration::from_secs(300),
            enable_auto_commit: false,
            auto_commit_interval: Duration::from_secs(5),
            consumer: ConsumerConfig::default(),
        }
    }
}

/// Called from [`GroupConsumer::poll`] (and `close`) when the consumer's
/// partitions change. The default methods do nothing.
pub trait RebalanceListener: Send {
    /// These partitions are now the consumer's (they start at the
    /// committed offsets).
    fn on_assigned(&mut self, partitions: &[TopicPartition]) {
        let _ = partitions;
    }
    /// These partitions are taken away in an orderly rebalance (or on
    /// `close`); the group still accepts commits for them until this
    /// returns and the consumer reports them released.
    fn on_revoked(&mut self, partitions: &[TopicPartition]) {
        let _ = partitions;
    }
    /// The membership was lost (expelled after a session or poll timeout):
    /// these partitions may already be consumed by other members, and
    /// commits for them are refused.
    fn on_lost(&mut self, partitions: &[TopicPartition]) {
        let _ = partitions;
    }
}

/// State shared by the consumer and its heartbeat task.
#[derive(Debug)]
struct Membership {
    member_id: String,
    generation: i32,
    /// The partitions the coordinator last said the member may own.
    assignment: BTreeSet<TopicPartition>,
    /// What the consumer owns (set by `poll`).
    owned: BTreeSet<TopicPartition>,
    last_poll: Instant,
    /// Why the membership was lost, until `poll` handles it.
    lost: Option<String>,
    /// An error that ends the membership for good (bad configuration).
    fatal: Option<String>,
}

/// What the heartbeat task needs.
#[derive(Clone)]
struct Shared {
    client: Arc<Client>,
    config: GroupConsumerConfig,
    topics: Vec<String>,
    state: Arc<Mutex<Membership>>,
    /// Heartbeat task → `poll`: the assignment changed.
    assignment_changed: Arc<Notify>,
    /// `poll` → heartbeat task: what the consumer owns changed (or it
    /// polled again after a poll timeout).
    owned_changed: Arc<Notify>,
}

/// A consumer in a group. See the [module docs](self).
pub struct GroupConsumer {
    /// Commits and committed-offset lookups, on their own connection: the
    /// fetch connection may still carry a long poll that `poll` abandoned
    /// when the assignment changed, and the broker answers a connection's
    /// requests in order.
    client: Arc<Client>,
    inner: Consumer,
    shared: Shared,
    task: Option<tokio::task::JoinHandle<()>>,
    /// In a mutex only so that the consumer is `Sync` (it is used through
    /// `&mut self`).
    listener: Option<Mutex<Box<dyn RebalanceListener>>>,
    owned: BTreeSet<TopicPartition>,
    applied_generation: i32,
    last_auto_commit: Instant,
}

impl std::fmt::Debug for GroupConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupConsumer")
            .field("group", &self.shared.config.group_id)
            .field("owned", &self.owned)
            .finish()
    }
}

fn lock(m: &Mutex<Membership>) -> std::sync::MutexGuard<'_, Membership> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl GroupConsumer {
    /// A consumer for `config.group_id` reading through `client` (its
    /// heartbeats and the commits each use another connection to the same
    /// address). Call [`GroupConsumer::subscribe`] to join.
    pub fn new(client: impl Into<Arc<Client>>, config: GroupConsumerConfig) -> GroupConsumer {
        let client: Arc<Client> = client.into();
        let other = || Arc::new(Client::connect_lazy(client.addr(), client.config().clone()));
        let (hb, commits) = (other(), other());
        let inner = Consumer::new(client, config.consumer.clone());
        GroupConsumer {
            client: commits,
            inner,
            shared: Shared {
                client: hb,
                config,
                topics: Vec::new(),
                state: Arc::new(Mutex::new(Membership {
                    member_id: String::new(),
                    generation: -1,
                    assignment: BTreeSet::new(),
                    owned: BTreeSet::new(),
                    last_poll: Instant::now(),
                    lost: None,
                    fatal: None,
                })),
                assignment_changed: Arc::new(Notify::new()),
                owned_changed: Arc::new(Notify::new()),
            },
            task: None,
            listener: None,
            owned: BTreeSet::new(),
            applied_generation: -1,
            last_auto_commit: Instant::now(),
        }
    }

    /// Sets the callbacks for assignment changes.
    pub fn set_rebalance_listener(&mut self, listener: impl RebalanceListener + 'static) {
        self.listener = Some(Mutex::new(Box::new(listener)));
    }

    /// Calls the rebalance listener, if there is one.
    fn tell(&mut self, f: impl FnOnce(&mut dyn RebalanceListener)) {
        if let Some(l) = self.listener.as_mut() {
            f(l.get_mut().unwrap_or_else(|e| e.into_inner()).as_mut());
        }
    }

    /// The settings.
    pub fn config(&self) -> &GroupConsumerConfig {
        &self.shared.config
    }

    /// Joins the group subscribed to `topics` (or changes the
    /// subscription) and starts heartbeating. Partitions arrive in the
    /// next [`GroupConsumer::poll`]s.
    pub async fn subscribe(&mut self, topics: &[&str]) -> Result<()> {
        if topics.is_empty() {
            return Err(ClientError::InvalidArgument(
                "subscribe to at least one topic".into(),
            ));
        }
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.shared.topics = topics.iter().map(|t| t.to_string()).collect();
        let member_id = lock(&self.shared.state).member_id.clone();
        let a = self
            .shared
            .client
            .join_group(join_request(&self.shared, member_id))
            .await?;
        self.shared.apply(&a);
        let shared = self.shared.clone();
        self.task = Some(tokio::spawn(heartbeat_loop(shared)));
        Ok(())
    }

    /// The member id (empty before joining or after losing the
    /// membership).
    pub fn member_id(&self) -> String {
        lock(&self.shared.state).member_id.clone()
    }

    /// The group generation the member last received.
    pub fn generation(&self) -> i32 {
        lock(&self.shared.state).generation
    }

    /// The partitions the consumer owns now.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.owned.iter().cloned().collect()
    }

    /// Sets the next offset `poll` returns for an owned partition (until
    /// the partition is revoked; a committed offset is not changed).
    pub fn seek(&mut self, topic: &str, partition: u32, offset: u64) -> Result<()> {
        self.inner.seek(topic, partition, offset)
    }

    /// The next offset `poll` returns for an owned partition.
    pub fn position(&self, topic: &str, partition: u32) -> Option<u64> {
        self.inner.position(topic, partition)
    }

    /// A snapshot of the fetch statistics (see [`Consumer::statistics`]).
    pub fn statistics(&self) -> crate::stats::ConsumerStats {
        self.inner.statistics()
    }

    /// A partition's log start offset (see [`Consumer::beginning_offset`]).
    pub async fn beginning_offset(&self, topic: &str, partition: u32) -> Result<u64> {
        self.inner.beginning_offset(topic, partition).await
    }

    /// A partition's log end offset (see [`Consumer::end_offset`]).
    pub async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64> {
        self.inner.end_offset(topic, partition).await
    }

    /// Records of an owned partition after the consumer's position (see
    /// [`Consumer::lag`]); `None` without a position. For the lag of the
    /// group's committed offsets see [`Client::group_lag`].
    pub async fn lag(&self, topic: &str, partition: u32) -> Result<Option<u64>> {
        self.inner.lag(topic, partition).await
    }

    /// Applies assignment changes, then returns up to `max_poll_records`
    /// records of the owned partitions (see [`Consumer::poll`]); waits up
    /// to `timeout` for some. Returns early, possibly empty, when the
    /// assignment changes. Fails if the group refused the member for good
    /// (e.g. an inconsistent assignor) or a fetch failed.
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>> {
        let deadline = Instant::now() + timeout;
        {
            let mut st = lock(&self.shared.state);
            st.last_poll = Instant::now();
            if st.member_id.is_empty() {
                // After a poll timeout: let the heartbeat task rejoin.
                self.shared.owned_changed.notify_one();
            }
        }
        loop {
            self.reconcile().await?;
            self.maybe_auto_commit().await?;
            let changed = self.shared.assignment_changed.clone();
            if self.owned.is_empty() {
                if tokio::time::timeout_at(deadline, changed.notified())
                    .await
                    .is_err()
                {
                    return Ok(Vec::new());
                }
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::select! {
                r = self.inner.poll(left) => {
                    let records = r?;
                    if !records.is_empty() || Instant::now() >= deadline {
                        return Ok(records);
                    }
                }
                _ = changed.notified() => {}
            }
            if Instant::now() >= deadline {
                return Ok(Vec::new());
            }
        }
    }

    /// Revokes, loses and assigns partitions as the coordinator's last
    /// answer says; reports the result to the heartbeat task.
    async fn reconcile(&mut self) -> Result<()> {
        let (generation, assignment, lost, fatal) = {
            let mut st = lock(&self.shared.state);
            (
                st.generation,
                st.assignment.clone(),
                st.lost.take(),
                st.fatal.clone(),
            )
        };
        if let Some(f) = fatal {
            return Err(ClientError::Group {
                group: self.shared.config.group_id.clone(),
                code: ErrorCode::InvalidRequest,
                message: f,
            });
        }
        let mut touched = false;
        if lost.is_some() && !self.owned.is_empty() {
            let gone: Vec<TopicPartition> = std::mem::take(&mut self.owned).into_iter().collect();
            self.tell(|l| l.on_lost(&gone));
            touched = true;
        }
        let mut revoke: Vec<TopicPartition> = self.owned.difference(&assignment).cloned().collect();
        if self.shared.config.assignor.is_eager() && generation != self.applied_generation {
            revoke = self.owned.iter().cloned().collect();
        }
        if !revoke.is_empty() {
            if self.shared.config.enable_auto_commit {
                if let Err(e) = self.commit_positions(&revoke).await {
                    debug_note(&format!("auto-commit before revocation failed: {e}"));
                }
            }
            self.tell(|l| l.on_revoked(&revoke));
            for tp in &revoke {
                self.owned.remove(tp);
            }
            touched = true;
        }
        let add: Vec<TopicPartition> = assignment.difference(&self.owned).cloned().collect();
        let mut committed = Vec::new();
        if !add.is_empty() {
            committed = self
                .client
                .committed_offsets(&self.shared.config.group_id, Some(&add))
                .await?;
            self.owned.extend(add.iter().cloned());
            touched = true;
        }
        if touched {
            // Kept partitions keep their positions; new ones start at the
            // committed offset (or per auto_offset_reset).
            self.inner.assign(self.owned.iter().cloned().collect());
            for c in &committed {
                self.inner.seek(&c.topic, c.partition, c.offset)?;
            }
            lock(&self.shared.state).owned = self.owned.clone();
            self.shared.owned_changed.notify_one();
            if !add.is_empty() {
                self.tell(|l| l.on_assigned(&add));
            }
        }
        self.applied_generation = generation;
        Ok(())
    }

    async fn maybe_auto_commit(&mut self) -> Result<()> {
        let c = &self.shared.config;
        if !c.enable_auto_commit || self.last_auto_commit.elapsed() < c.auto_commit_interval {
            return Ok(());
        }
        self.last_auto_commit = Instant::now();
        let owned: Vec<TopicPartition> = self.owned.iter().cloned().collect();
        if let Err(e) = self.commit_positions(&owned).await {
            debug_note(&format!("auto-commit failed: {e}"));
        }
        Ok(())
    }

    fn positions(&self, partitions: &[TopicPartition]) -> Vec<CommitOffset> {
        partitions
            .iter()
            .filter_map(|(t, p)| {
                self.inner.position(t, *p).map(|offset| CommitOffset {
                    topic: t.clone(),
                    partition: *p,
                    offset,
                    metadata: None,
                })
            })
            .collect()
    }

    async fn commit_positions(&self, partitions: &[TopicPartition]) -> Result<()> {
        let offsets = self.positions(partitions);
        if offsets.is_empty() {
            return Ok(());
        }
        self.commit_offsets(offsets).await
    }

    /// Commits the positions of every owned partition (everything `poll`
    /// returned so far) and waits until the commit is durable.
    pub async fn commit_sync(&self) -> Result<()> {
        let owned: Vec<TopicPartition> = self.owned.iter().cloned().collect();
        self.commit_positions(&owned).await
    }

    /// Commits the given offsets (the next offset to consume, with
    /// optional metadata) and waits until the commit is durable. Fails
    /// with [`ClientError::Group`] (`UnknownMemberId`,
    /// `IllegalGeneration`) if the member was fenced, and with
    /// [`ClientError::Partition`] for a partition not owned or an offset
    /// beyond the log end.
    pub async fn commit_offsets(&self, offsets: Vec<CommitOffset>) -> Result<()> {
        let (member, generation) = {
            let st = lock(&self.shared.state);
            (st.member_id.clone(), st.generation)
        };
        if member.is_empty() {
            return Err(ClientError::Group {
                group: self.shared.config.group_id.clone(),
                code: ErrorCode::UnknownMemberId,
                message: "not a member of the group (not joined yet, or expelled): nothing \
                          committed"
                    .into(),
            });
        }
        self.client
            .commit_offsets(&self.shared.config.group_id, &member, generation, offsets)
            .await
    }

    /// Commits the positions of every owned partition without waiting:
    /// the returned handle resolves with the outcome.
    pub fn commit_async(&self) -> tokio::task::JoinHandle<Result<()>> {
        let owned: Vec<TopicPartition> = self.owned.iter().cloned().collect();
        let offsets = self.positions(&owned);
        let client = self.client.clone();
        let group = self.shared.config.group_id.clone();
        let (member, generation) = {
            let st = lock(&self.shared.state);
            (st.member_id.clone(), st.generation)
        };
        tokio::spawn(async move {
            if offsets.is_empty() {
                return Ok(());
            }
            client
                .commit_offsets(&group, &member, generation, offsets)
                .await
        })
    }

    /// The group's committed offsets of `partitions` (all partitions with
    /// a commit for `None`).
    pub async fn committed(
        &self,
        partitions: Option<&[TopicPartition]>,
    ) -> Result<Vec<CommittedOffset>> {
        self.client
            .committed_offsets(&self.shared.config.group_id, partitions)
            .await
    }

    /// Leaves the group gracefully: commits the positions if auto-commit
    /// is on (nothing otherwise), reports the owned partitions revoked,
    /// stops heartbeating and leaves (the others take the partitions over
    /// at once, without waiting for the session timeout).
    pub async fn close(mut self) -> Result<()> {
        let mut first_err = None;
        if self.shared.config.enable_auto_commit {
            if let Err(e) = self.commit_sync().await {
                first_err = Some(e);
            }
        }
        if !self.owned.is_empty() {
            let gone: Vec<TopicPartition> = std::mem::take(&mut self.owned).into_iter().collect();
            self.tell(|l| l.on_revoked(&gone));
        }
        if let Some(t) = self.task.take() {
            t.abort();
        }
        let member = std::mem::take(&mut lock(&self.shared.state).member_id);
        if !member.is_empty() {
            if let Err(e) = self
                .shared
                .client
                .leave_group(&self.shared.config.group_id, &member)
                .await
            {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for GroupConsumer {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Errors the application cannot act on are reported on stderr when the
/// `WEIR_CLIENT_DEBUG` variable is set (the client has no logger).
fn debug_note(msg: &str) {
    if std::env::var_os("WEIR_CLIENT_DEBUG").is_some() {
        eprintln!("weir-client: {msg}");
    }
}

fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

fn join_request(s: &Shared, member_id: String) -> JoinGroupRequest {
    JoinGroupRequest {
        group: s.config.group_id.clone(),
        member_id,
        client_id: s.config.client_id.clone(),
        topics: s.topics.clone(),
        assignor: s.config.assignor.name().into(),
        session_timeout_ms: millis(s.config.session_timeout),
        max_poll_interval_ms: millis(s.config.max_poll_interval),
    }
}

impl Shared {
    /// Takes in a join or heartbeat answer; wakes `poll` if it changes
    /// anything.
    fn apply(&self, a: &weir_proto::messages::GroupAssignment) {
        let assignment: BTreeSet<TopicPartition> = from_wire(&a.assignment).into_iter().collect();
        let mut st = lock(&self.state);
        let changed = st.generation != a.generation
            || st.assignment != assignment
            || st.member_id != a.member_id;
        st.member_id = a.member_id.clone();
        st.generation = a.generation;
        st.assignment = assignment;
        if changed {
            self.assignment_changed.notify_one();
        }
    }

    /// The membership is gone (expelled, or the coordinator forgot it).
    fn lose(&self, why: String) {
        let mut st = lock(&self.state);
        st.member_id.clear();
        st.assignment.clear();
        st.lost = Some(why);
        self.assignment_changed.notify_one();
    }
}

/// Sends heartbeats until aborted: rejoins after losing the membership,
/// leaves after a poll timeout.
async fn heartbeat_loop(s: Shared) {
    // At least three heartbeats per session timeout, whatever the settings.
    let interval = s
        .config
        .heartbeat_interval
        .min(s.config.session_timeout / 3)
        .max(Duration::from_millis(10));
    let mut last_ok = Instant::now();
    loop {
        let (member_id, generation, owned, last_poll, settled) = {
            let st = lock(&s.state);
            (
                st.member_id.clone(),
                st.generation,
                st.owned.clone(),
                st.last_poll,
                st.owned == st.assignment,
            )
        };
        let poll_deadline = last_poll + s.config.max_poll_interval;
        let polled_late = Instant::now() >= poll_deadline;
        if member_id.is_empty() {
            if polled_late {
                // Rejoin once the application polls again.
                let _ = tokio::time::timeout(interval, s.owned_changed.notified()).await;
                continue;
            }
            match s.client.join_group(join_request(&s, String::new())).await {
                Ok(a) => {
                    last_ok = Instant::now();
                    s.apply(&a);
                }
                Err(e) => {
                    if matches!(
                        e.code(),
                        Some(
                            ErrorCode::InconsistentAssignor
                                | ErrorCode::InvalidSessionTimeout
                                | ErrorCode::InvalidGroupId
                                | ErrorCode::InvalidRequest
                        )
                    ) {
                        lock(&s.state).fatal = Some(e.to_string());
                        s.assignment_changed.notify_one();
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            continue;
        }
        if polled_late {
            let _ = s.client.leave_group(&s.config.group_id, &member_id).await;
            s.lose(format!(
                "no poll for max_poll_interval ({:?}): left the group",
                s.config.max_poll_interval
            ));
            continue;
        }
        let req = HeartbeatRequest {
            group: s.config.group_id.clone(),
            member_id: member_id.clone(),
            generation,
            owned: to_wire(&owned.iter().cloned().collect::<Vec<_>>()),
            since_poll_ms: millis(last_poll.elapsed()),
            wait_ms: if settled { millis(interval) } else { 0 },
        };
        tokio::select! {
            r = s.client.heartbeat(req) => match r {
                Ok(a) => {
                    last_ok = Instant::now();
                    s.apply(&a);
                }
                Err(e) if matches!(
                    e.code(),
                    Some(
                        ErrorCode::UnknownMemberId
                            | ErrorCode::IllegalGeneration
                            | ErrorCode::FencedMemberEpoch
                    )
                ) => {
                    s.lose(e.to_string());
                    continue;
                }
                Err(_) => {
                    if last_ok.elapsed() > s.config.session_timeout {
                        s.lose("no heartbeat answered within the session timeout".into());
                    } else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            // The consumer's partitions changed: report them now.
            _ = s.owned_changed.notified() => continue,
            _ = tokio::time::sleep_until(poll_deadline) => continue,
        }
        let settled = {
            let st = lock(&s.state);
            st.owned == st.assignment
        };
        if !settled {
            // Wait for `poll` to apply the answer (and keep the session
            // alive meanwhile).
            tokio::select! {
                _ = s.owned_changed.notified() => {}
                _ = tokio::time::sleep(interval) => {}
                _ = tokio::time::sleep_until(poll_deadline) => {}
            }
        }
    }
}
