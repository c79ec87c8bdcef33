//! A [`ShareConsumer`]: a member of a share group (KIP-932's queues on
//! the log).
//!
//! Where a consumer group gives each partition to one member, a share
//! group lets every member read every partition: the broker hands out
//! records, not partitions. Each record a poll returns is *acquired* by
//! this member for the group's lock duration (30 s by default,
//! [`ShareConsumer::lock_timeout`]); the member then acknowledges it:
//!
//! * [`AcknowledgeType::Accept`]: processed, never delivered again;
//! * [`AcknowledgeType::Release`]: give it to any member again (its
//!   delivery count grows; past the group's delivery limit, 5 by
//!   default, it is archived — a poison record stops there);
//! * [`AcknowledgeType::Reject`]: never deliver it again (archived);
//! * [`AcknowledgeType::Renew`]: keep holding it, the lock starts again.
//!
//! A record not acknowledged before its lock expires (the member died,
//! or is too slow) becomes available to the others. Acknowledgements are
//! stored by the partition's leader before `commit_sync` (or `close`) is
//! answered: a leader failover or restart loses none of those, and
//! delivers again only records that were acquired and not acknowledged.
//! Acknowledgements that travel with a poll's fetch do not hold its
//! records back: the broker answers the fetch at once and stores them
//! meanwhile (native ShareFetch v2's `acks_later`); a store that fails
//! meanwhile is named in a later fetch's answer (a poll that brings no
//! records returns it; one that does logs it), and a failover before they
//! are stored may deliver those records again (at least once).
//! `commit_sync` waits until every acknowledgement so far is stored
//! (storing again what failed) and returns a failure: call it where that
//! matters.
//!
//! ## Implicit and explicit acknowledgement
//!
//! [`AcknowledgementMode::Implicit`] (the default, Kafka's `implicit`):
//! every record a poll returned is accepted by the next poll,
//! [`ShareConsumer::commit_sync`] or [`ShareConsumer::close`].
//! [`AcknowledgementMode::Explicit`]: each record is acknowledged with
//! [`ShareConsumer::acknowledge`]; a record the application did not
//! acknowledge stays acquired until its lock expires.
//!
//! Acknowledgements travel with the next fetch (or with `commit_sync`,
//! which waits until they and every earlier one are stored, and reports a
//! refusal).
//!
//! ## Connections
//!
//! Membership heartbeats go to the group's coordinator (a background
//! task); fetches go to the core that owns each partition, one share
//! session per core, all of them in parallel.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use weir_proto::error_code::ErrorCode;
use weir_proto::frame;
use weir_proto::messages::{
    ShareAckBatch, ShareAcknowledgeRequest, ShareFetchRequest, ShareFetchResponse,
    ShareGroupHeartbeatRequest, SharePartitionRequest, TopicPartitions,
};
use weir_proto::reader::RecordBatch;
pub use weir_share::partition::AcquireMode;

use crate::groups::{group_error, TopicPartition};
use crate::{Client, ClientError, ConsumerRecord, Result, ShardRouter};

/// What a member says of a record it acquired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AcknowledgeType {
    /// Processed: never delivered again.
    Accept,
    /// Deliver it again, to any member.
    Release,
    /// Never deliver it again (archived).
    Reject,
    /// Keep holding it: its lock starts again (KIP-1222).
    Renew,
}

impl AcknowledgeType {
    /// The byte on the wire (Kafka's).
    fn byte(self) -> u8 {
        match self {
            AcknowledgeType::Accept => 1,
            AcknowledgeType::Release => 2,
            AcknowledgeType::Reject => 3,
            AcknowledgeType::Renew => 4,
        }
    }
}

impl std::str::FromStr for AcknowledgeType {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "accept" => Ok(AcknowledgeType::Accept),
            "release" => Ok(AcknowledgeType::Release),
            "reject" => Ok(AcknowledgeType::Reject),
            "renew" => Ok(AcknowledgeType::Renew),
            _ => Err(format!(
                "unknown acknowledge type `{s}`: use accept, release, reject or renew"
            )),
        }
    }
}

/// How records are acknowledged (Kafka's `share.acknowledgement.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AcknowledgementMode {
    /// What a poll returned is accepted by the next poll, `commit_sync`
    /// or `close`.
    #[default]
    Implicit,
    /// Each record is acknowledged with [`ShareConsumer::acknowledge`].
    Explicit,
}

/// Settings of a [`ShareConsumer`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ShareConsumerConfig {
    /// The share group.
    pub group_id: String,
    /// Implicit (default) or explicit acknowledgement.
    pub acknowledgement_mode: AcknowledgementMode,
    /// Records to acquire per poll, shared among the cores fetched from:
    /// about (whole batches) or at most, as `acquire_mode` says (with
    /// fewer than the cores fetched, one from each). Default 500 (Kafka's
    /// `max.poll.records`).
    pub max_records: u32,
    /// Whole batches (default) or at most `max_records` (Kafka's
    /// `share.acquire.mode`).
    pub acquire_mode: AcquireMode,
    /// Longest a fetch waits for records. Default 500 ms.
    pub max_wait: Duration,
    /// Most bytes read from one partition per fetch. Default 1 MiB.
    pub max_partition_bytes: u32,
}

impl ShareConsumerConfig {
    /// The defaults for `group_id`.
    pub fn new(group_id: impl Into<String>) -> ShareConsumerConfig {
        ShareConsumerConfig {
            group_id: group_id.into(),
            acknowledgement_mode: AcknowledgementMode::Implicit,
            max_records: MAX_RECORDS_DEFAULT,
            acquire_mode: AcquireMode::BatchOptimized,
            max_wait: Duration::from_millis(500),
            max_partition_bytes: 1 << 20,
        }
    }
}

/// A poll's `max_records` shared among `cores` fetches, each at least 1
/// (0 on the wire would mean the broker's default): whole batches are
/// about, so each asks for its rounded-up share; at most (`record_limit`)
/// splits it exactly (the first ones take the remainder).
fn per_core_records(max_records: u32, mode: AcquireMode, cores: usize) -> Vec<u32> {
    let n = cores.max(1) as u32;
    (0..n)
        .map(|i| match mode {
            AcquireMode::BatchOptimized => max_records.div_ceil(n),
            AcquireMode::RecordLimit => max_records / n + u32::from(i < max_records % n),
        })
        .map(|r| r.max(1))
        .collect()
}

/// Records a poll acquires by default (Kafka's `max.poll.records`).
pub const MAX_RECORDS_DEFAULT: u32 = 500;

/// The pause before fetching again after a retriable failure (a node
/// down, a leader moving).
const RETRY_BACKOFF: Duration = Duration::from_millis(50);
/// Offsets one partition's answer may acquire: a share partition's window
/// holds at most this many (the upper bound of
/// `group.share.partition.max.record.locks`, Kafka's and Weir's), so an
/// answer naming more is refused before its offsets are walked one by one.
const ACQUIRED_PER_PARTITION_MAX: u64 = 10_000;

/// A record a poll returned: acquired by this member until it
/// acknowledges it or its lock expires.
#[derive(Debug, Clone)]
pub struct ShareRecord {
    /// The record.
    pub record: ConsumerRecord,
    /// How many times it was delivered, this time included (more than 1:
    /// another member released it, or its lock expired).
    pub delivery_count: u16,
}

/// The membership, shared with the heartbeat task.
#[derive(Debug, Default)]
struct Membership {
    epoch: i32,
    topics: Vec<String>,
    /// Send the subscription with the next heartbeat.
    topics_changed: bool,
    assignment: BTreeSet<TopicPartition>,
    /// The last refusal that is not retried (shown by `poll`).
    fatal: Option<ClientError>,
    leaving: bool,
}

/// A share session with one core.
#[derive(Debug)]
struct Session {
    client: Arc<Client>,
    epoch: i32,
    partitions: BTreeSet<TopicPartition>,
    /// Acknowledgements sent with a fetch, answered before the broker
    /// stored them: `commit_sync` waits for them (a ShareAcknowledge
    /// answers once they are stored).
    unstored: bool,
}

/// A share group member. See the [module docs](self).
pub struct ShareConsumer {
    config: ShareConsumerConfig,
    bootstrap: Arc<Client>,
    router: Arc<ShardRouter>,
    member_id: String,
    membership: Arc<Mutex<Membership>>,
    /// Wakes the heartbeat task (subscription changed, leaving).
    wake: Arc<Notify>,
    /// Signalled when an assignment arrives.
    assigned: Arc<Notify>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
    sessions: HashMap<SocketAddr, Session>,
    /// Records acquired and not yet acknowledged to the broker: per
    /// partition, the session it was acquired in and each offset's
    /// acknowledgement (`None`: not yet given).
    in_flight: BTreeMap<TopicPartition, (SocketAddr, BTreeMap<u64, Option<u8>>)>,
    /// The group's lock duration, as the broker last said.
    lock_timeout: Duration,
    /// The fetch that is out, if one is (a poll's that timed out).
    out: Option<Round>,
    /// Records fetched and not yet handed out (a fetch `commit_sync`
    /// waited for).
    buffered: Vec<(SocketAddr, ShareRecord)>,
    /// Cores whose session was lost (an error) while acknowledgements it
    /// carried were not known to be stored: the next `commit_sync` (or
    /// `close`) says so instead of answering that all is stored.
    unconfirmed: BTreeSet<SocketAddr>,
}

/// Each core's answer to a round of fetches.
type RoundAnswers = Vec<(SocketAddr, Result<(ShareFetchResponse, bytes::Bytes)>)>;
/// A round of fetches under way.
type Round = tokio::task::JoinHandle<RoundAnswers>;

impl std::fmt::Debug for ShareConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShareConsumer")
            .field("group", &self.config.group_id)
            .field("member_id", &self.member_id)
            .finish()
    }
}

/// A fresh member id: 128 random bits as a UUID-shaped string.
fn new_member_id() -> String {
    let mut halves = [0u64; 2];
    for (i, h) in halves.iter_mut().enumerate() {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        hasher.write_u32(std::process::id());
        hasher.write_usize(i);
        *h = hasher.finish();
    }
    let x = (u128::from(halves[0]) << 64) | u128::from(halves[1]);
    let s = format!("{x:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &s[0..8],
        &s[8..12],
        &s[12..16],
        &s[16..20],
        &s[20..32]
    )
}

impl ShareConsumer {
    /// A builder: bootstrap servers and settings by Kafka's names
    /// ([`crate::ShareConsumerBuilder`]).
    pub fn builder() -> crate::ShareConsumerBuilder {
        crate::ShareConsumerBuilder::default()
    }

    /// A member of `config.group_id` through `client`'s broker (it joins
    /// on [`ShareConsumer::subscribe`]).
    pub fn new(client: impl Into<Arc<Client>>, config: ShareConsumerConfig) -> ShareConsumer {
        let bootstrap: Arc<Client> = client.into();
        ShareConsumer {
            router: Arc::new(ShardRouter::new(bootstrap.clone())),
            bootstrap,
            config,
            member_id: new_member_id(),
            membership: Arc::new(Mutex::new(Membership::default())),
            wake: Arc::new(Notify::new()),
            assigned: Arc::new(Notify::new()),
            heartbeat: None,
            sessions: HashMap::new(),
            in_flight: BTreeMap::new(),
            lock_timeout: Duration::from_secs(30),
            out: None,
            buffered: Vec::new(),
            unconfirmed: BTreeSet::new(),
        }
    }

    /// The member id (made by the client, as Kafka's share consumers do).
    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    /// The settings.
    pub fn config(&self) -> &ShareConsumerConfig {
        &self.config
    }

    /// How long acquired records stay locked to this member (the group's
    /// `record.lock.duration.ms`, learned from the first fetch).
    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// The partitions this member reads now (shared with other members).
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.lock().assignment.iter().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Membership> {
        self.membership.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Subscribes to `topics` (replacing the subscription), joining the
    /// group on first call. Records come with the next polls.
    pub fn subscribe(&mut self, topics: &[&str]) -> Result<()> {
        if topics.is_empty() {
            return Err(ClientError::InvalidArgument(
                "subscribe to at least one topic".into(),
            ));
        }
        {
            let mut m = self.lock();
            m.topics = topics.iter().map(|t| t.to_string()).collect();
            m.topics.sort();
            m.topics.dedup();
            m.topics_changed = true;
        }
        if self.heartbeat.is_none() {
            self.heartbeat = Some(tokio::spawn(heartbeat_loop(
                self.bootstrap.clone(),
                self.config.group_id.clone(),
                self.member_id.clone(),
                self.membership.clone(),
                self.wake.clone(),
                self.assigned.clone(),
            )));
        } else {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Acknowledges one record a poll returned (explicit mode; in
    /// implicit mode it overrides the accept). Sent with the next poll or
    /// [`ShareConsumer::commit_sync`]. Refused for a record this member
    /// does not hold.
    pub fn acknowledge(&mut self, record: &ShareRecord, kind: AcknowledgeType) -> Result<()> {
        let r = &record.record;
        let slot = self
            .in_flight
            .get_mut(&(r.topic.to_string(), r.partition))
            .and_then(|(_, offsets)| offsets.get_mut(&r.offset));
        match slot {
            Some(s) => {
                *s = Some(kind.byte());
                Ok(())
            }
            None => Err(ClientError::InvalidArgument(format!(
                "{}-{} offset {} is not held by this member (acknowledged already, or never returned)",
                r.topic, r.partition, r.offset
            ))),
        }
    }

    /// In implicit mode: accepts every record returned and not
    /// acknowledged otherwise.
    fn accept_implicitly(&mut self) {
        if self.config.acknowledgement_mode != AcknowledgementMode::Implicit {
            return;
        }
        for (_, offsets) in self.in_flight.values_mut() {
            for a in offsets.values_mut() {
                a.get_or_insert(AcknowledgeType::Accept.byte());
            }
        }
    }

    /// Takes the acknowledgements given, by session and partition, as
    /// ack batches (runs of consecutive offsets).
    fn take_acks(&mut self) -> HashMap<SocketAddr, Vec<SharePartitionRequest>> {
        let mut out: HashMap<SocketAddr, Vec<SharePartitionRequest>> = HashMap::new();
        for ((topic, partition), (addr, offsets)) in self.in_flight.iter_mut() {
            let given: Vec<(u64, u8)> = offsets
                .iter()
                .filter_map(|(o, a)| a.map(|a| (*o, a)))
                .collect();
            if given.is_empty() {
                continue;
            }
            for (o, _) in &given {
                offsets.remove(o);
            }
            let mut batches: Vec<ShareAckBatch> = Vec::new();
            for (o, a) in given {
                match batches.last_mut() {
                    Some(b) if b.last + 1 == o => {
                        b.last = o;
                        b.types.push(a);
                    }
                    _ => batches.push(ShareAckBatch {
                        first: o,
                        last: o,
                        types: vec![a],
                    }),
                }
            }
            // One type for a run of one kind.
            for b in &mut batches {
                if b.types.windows(2).all(|w| w[0] == w[1]) {
                    b.types.truncate(1);
                }
            }
            out.entry(*addr).or_default().push(SharePartitionRequest {
                topic: topic.clone(),
                partition: *partition,
                acks: batches,
            });
        }
        self.in_flight.retain(|_, (_, o)| !o.is_empty());
        out
    }

    /// Returns records acquired for this member, waiting up to `timeout`
    /// for some (an empty result when none came). Acknowledgements given
    /// since the last poll (and, in implicit mode, the acceptance of the
    /// last poll's records) travel with its fetch.
    ///
    /// A fetch still out when `timeout` passes (the broker holds it up to
    /// [`ShareConsumerConfig::max_wait`]) is not abandoned: the next poll
    /// takes its answer (acknowledgements given meanwhile wait for the
    /// fetch after it). Retriable failures (a node down, a leader moving)
    /// are retried within `timeout`, the partitions' leaders looked up
    /// again; other errors are returned.
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ShareRecord>> {
        let deadline = Instant::now() + timeout;
        self.accept_implicitly();
        if !self.buffered.is_empty() {
            let records = std::mem::take(&mut self.buffered);
            return Ok(self.hand_out(records));
        }
        loop {
            if let Some(e) = self.lock().fatal.take() {
                return Err(e);
            }
            if let Some(pending) = self.out.as_mut() {
                let left = deadline.saturating_duration_since(Instant::now());
                let Ok(joined) = tokio::time::timeout(left, pending).await else {
                    // Still out: the next poll takes its answer.
                    return Ok(Vec::new());
                };
                self.out = None;
                let answers = joined
                    .map_err(|e| ClientError::InvalidResponse(format!("share fetch task: {e}")))?;
                let records = match self.take_round(answers) {
                    Ok(records) => records,
                    // A node down, a leader moving: fetched again (from
                    // where the metadata says now) after a moment.
                    Err(e)
                        if e.is_retriable()
                            || matches!(
                                e.code(),
                                Some(
                                    ErrorCode::ShareSessionNotFound
                                        | ErrorCode::InvalidShareSessionEpoch
                                )
                            ) =>
                    {
                        tracing::debug!(error = %e, "share fetch failed: retrying");
                        let left = deadline.saturating_duration_since(Instant::now());
                        tokio::time::sleep(RETRY_BACKOFF.min(left)).await;
                        Vec::new()
                    }
                    Err(e) => return Err(e),
                };
                if !records.is_empty() {
                    return Ok(self.hand_out(records));
                }
                if Instant::now() >= deadline {
                    return Ok(Vec::new());
                }
            }
            let idle = self.lock().assignment.is_empty() && !self.has_acks();
            if idle {
                let now = Instant::now();
                if now >= deadline {
                    return Ok(Vec::new());
                }
                let _ = tokio::time::timeout(deadline - now, self.assigned.notified()).await;
                continue;
            }
            self.send_out().await?;
        }
    }

    /// Whether acknowledgements wait to be sent.
    fn has_acks(&self) -> bool {
        self.in_flight
            .values()
            .any(|(_, offsets)| offsets.values().any(|a| a.is_some()))
    }

    /// Records handed to the application: held (in flight) until
    /// acknowledged.
    fn hand_out(&mut self, records: Vec<(SocketAddr, ShareRecord)>) -> Vec<ShareRecord> {
        records
            .into_iter()
            .map(|(addr, r)| {
                let slot = self
                    .in_flight
                    .entry((r.record.topic.to_string(), r.record.partition))
                    .or_insert_with(|| (addr, BTreeMap::new()));
                slot.0 = addr;
                slot.1.insert(r.record.offset, None);
                r
            })
            .collect()
    }

    /// Sends a fetch to every core (with the acknowledgements given so
    /// far), unless one is out already.
    async fn send_out(&mut self) -> Result<()> {
        if self.out.is_some() {
            return Ok(());
        }
        let assignment: BTreeSet<TopicPartition> = self.lock().assignment.clone();
        let mut acks = self.take_acks();
        let wait = self.config.max_wait;
        self.out = Some(self.send_round(&assignment, &mut acks, wait).await?);
        Ok(())
    }

    /// Waits for the fetch that is out, keeping its records for the next
    /// poll (before a request that must follow it on the sessions).
    async fn settle_out(&mut self) -> Result<()> {
        if let Some(pending) = self.out.take() {
            let answers = pending
                .await
                .map_err(|e| ClientError::InvalidResponse(format!("share fetch task: {e}")))?;
            let records = self.take_round(answers)?;
            self.buffered.extend(records);
        }
        Ok(())
    }

    /// Sends one fetch per core whose partitions this member reads (or
    /// holds acknowledgements for), in parallel, in a task; every answer
    /// is awaited (an abandoned share fetch would leave records locked
    /// and the session's epoch unknown).
    async fn send_round(
        &mut self,
        assignment: &BTreeSet<TopicPartition>,
        acks: &mut HashMap<SocketAddr, Vec<SharePartitionRequest>>,
        wait: Duration,
    ) -> Result<Round> {
        // Where each assigned partition lives now.
        let mut wanted: HashMap<SocketAddr, (Arc<Client>, BTreeSet<TopicPartition>)> =
            HashMap::new();
        for (t, p) in assignment {
            let c = self.router.client_of(t, *p).await;
            wanted
                .entry(c.addr())
                .or_insert_with(|| (c.clone(), BTreeSet::new()))
                .1
                .insert((t.clone(), *p));
        }
        // Acknowledgements for a core no partition is fetched from now
        // go alone.
        let lone: Vec<SocketAddr> = acks
            .keys()
            .filter(|a| !wanted.contains_key(a))
            .copied()
            .collect();
        for addr in lone {
            let parts = acks.remove(&addr).unwrap_or_default();
            // One core's refusal must not keep the others' from going.
            if let Err(e) = self.acknowledge_at(addr, parts, false).await {
                tracing::debug!(error = %e, "share acknowledgement refused");
            }
        }
        let mut requests = Vec::new();
        // `max_records` is the poll's: shared among the cores fetched.
        let shares = per_core_records(
            self.config.max_records,
            self.config.acquire_mode,
            wanted.len(),
        );
        for ((addr, (client, parts)), per_core) in wanted.into_iter().zip(shares) {
            let session = self.sessions.entry(addr).or_insert_with(|| Session {
                client: client.clone(),
                epoch: 0,
                partitions: BTreeSet::new(),
                unstored: false,
            });
            let mut ack_parts = acks.remove(&addr).unwrap_or_default();
            // A new session names all its partitions; a running one those
            // it adds, and those with acknowledgements.
            let mut named: BTreeSet<TopicPartition> = if session.epoch == 0 {
                parts.clone()
            } else {
                parts.difference(&session.partitions).cloned().collect()
            };
            let forgotten: Vec<TopicPartition> = if session.epoch == 0 {
                Vec::new()
            } else {
                session.partitions.difference(&parts).cloned().collect()
            };
            for a in &ack_parts {
                named.remove(&(a.topic.clone(), a.partition));
            }
            session.unstored |= ack_parts.iter().any(|p| !p.acks.is_empty());
            ack_parts.extend(
                named
                    .into_iter()
                    .map(|(topic, partition)| SharePartitionRequest {
                        topic,
                        partition,
                        acks: Vec::new(),
                    }),
            );
            let req = ShareFetchRequest {
                group: self.config.group_id.clone(),
                member_id: self.member_id.clone(),
                session_epoch: session.epoch,
                max_wait_ms: crate::millis_u32(wait),
                max_records: per_core,
                acquire_mode: self.config.acquire_mode.byte(),
                max_bytes: self.config.max_partition_bytes,
                // A poll's acknowledgements do not hold its records back:
                // `commit_sync` is what waits for them to be stored.
                acks_later: true,
                partitions: ack_parts,
                forgotten: TopicPartitions::group(forgotten.iter()),
            };
            // The session as it will be once answered: a partition named
            // only for its acknowledgements joins it too (and is forgotten
            // by the next fetch).
            let acked_only: Vec<TopicPartition> = req
                .partitions
                .iter()
                .map(|p| (p.topic.clone(), p.partition))
                .filter(|tp| !parts.contains(tp))
                .collect();
            session.partitions = parts;
            session.partitions.extend(acked_only);
            session.epoch = next_epoch(session.epoch);
            requests.push((addr, session.client.clone(), req));
        }
        Ok(tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for (addr, client, req) in requests {
                tasks.spawn(async move { (addr, client.share_fetch(&req, wait).await) });
            }
            let mut out = Vec::new();
            while let Some(done) = tasks.join_next().await {
                match done {
                    Ok(answer) => out.push(answer),
                    Err(e) => tracing::warn!(error = %e, "a share fetch task failed"),
                }
            }
            out
        }))
    }

    /// Reads the answers of a round: the records acquired (not yet handed
    /// out), sessions and errors.
    fn take_round(&mut self, answers: RoundAnswers) -> Result<Vec<(SocketAddr, ShareRecord)>> {
        let mut records = Vec::new();
        let mut first_error = None;
        for (addr, r) in answers {
            match r {
                Ok((body, payload)) => {
                    if let Err(e) = self.take_answer(addr, body, &payload, &mut records, false) {
                        first_error.get_or_insert(e);
                    }
                }
                Err(e) => {
                    // Whether the broker served it is unknown: a new
                    // session; and where its partitions live is asked again.
                    if let Some(s) = self.drop_session(addr) {
                        for (topic, _) in &s.partitions {
                            self.router.forget_topic(topic);
                        }
                    }
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if records.is_empty() => Err(e),
            Some(e) => {
                tracing::debug!(error = %e, "share fetch of one core failed");
                Ok(records)
            }
            None => Ok(records),
        }
    }

    /// Reads one core's answer: its records (those acquired), the
    /// acquired offsets without a record (acknowledged as gaps), errors.
    fn take_answer(
        &mut self,
        addr: SocketAddr,
        body: ShareFetchResponse,
        payload: &bytes::Bytes,
        records: &mut Vec<(SocketAddr, ShareRecord)>,
        acking: bool,
    ) -> Result<()> {
        if body.error != 0 {
            // The whole request was refused (its acknowledgements too);
            // a new session is opened by the next fetch.
            self.drop_session(addr);
            return Err(group_error(&self.config.group_id, body.error, body.message));
        }
        if body.lock_timeout_ms > 0 {
            self.lock_timeout = Duration::from_millis(body.lock_timeout_ms.into());
        }
        let mut first_error = None;
        for p in body.partitions {
            if p.ack_error != 0 {
                first_error.get_or_insert(ClientError::partition(
                    &p.topic,
                    p.partition,
                    p.ack_error,
                    p.ack_message.clone(),
                ));
            }
            if p.error != 0 {
                let code = ErrorCode::from_u16(p.error);
                if matches!(
                    code,
                    ErrorCode::NotOwner | ErrorCode::NotLeader | ErrorCode::UnknownTopicOrPartition
                ) {
                    // Fetched from its owner next time (it stays in this
                    // session until the next fetch here forgets it).
                    self.router.forget_topic(&p.topic);
                    if acking {
                        first_error.get_or_insert(ClientError::partition(
                            &p.topic,
                            p.partition,
                            p.error,
                            p.message,
                        ));
                    }
                } else {
                    first_error.get_or_insert(ClientError::partition(
                        &p.topic,
                        p.partition,
                        p.error,
                        p.message,
                    ));
                }
                continue;
            }
            if p.acquired.is_empty() {
                continue;
            }
            let data = frame::payload_slice(payload, p.payload_offset, p.payload_len)?;
            let batches = crate::split_batches(&payload.slice_ref(data))?;
            let topic: Arc<str> = Arc::from(p.topic.as_str());
            let mut got: Vec<ConsumerRecord> = Vec::new();
            // The acquired ranges in order (the broker answers them so,
            // apart): a record's range found by a binary search, not a scan
            // per record.
            let mut ranges = p.acquired.clone();
            ranges.sort_unstable_by_key(|a| a.first);
            let range_of = |o: u64| {
                let i = ranges.partition_point(|a| a.last < o);
                ranges.get(i).filter(|a| a.first <= o)
            };
            let held = |o: u64| range_of(o).is_some();
            let parsed = batches
                .iter()
                .map(|b| RecordBatch::parse(b))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let span = parsed
                .iter()
                .map(|rb| {
                    (
                        rb.header().base_offset as u64,
                        rb.header().last_offset() as u64,
                    )
                })
                .reduce(|(a, z), (lo, hi)| (a.min(lo), z.max(hi)));
            check_acquired(&ranges, span).map_err(|why| {
                ClientError::InvalidResponse(format!("{}-{}: {why}", p.topic, p.partition))
            })?;
            for (b, rb) in batches.iter().zip(&parsed) {
                if rb.header().attributes.is_control() {
                    continue;
                }
                crate::consumer::decode_records(b, rb, &topic, p.partition, held, &mut got)?;
            }
            let (_, offsets) = self
                .in_flight
                .entry((p.topic.clone(), p.partition))
                .or_insert_with(|| (addr, BTreeMap::new()));
            let mut present = Vec::with_capacity(got.len());
            for r in got {
                present.push(r.offset);
                let delivery_count = range_of(r.offset).map_or(1, |a| a.delivery_count);
                records.push((
                    addr,
                    ShareRecord {
                        record: r,
                        delivery_count,
                    },
                ));
            }
            // Offsets acquired without a record (compacted away, control
            // records): gaps, found by walking the ranges and the records'
            // offsets together.
            present.sort_unstable();
            let mut next = present.iter().peekable();
            for a in &ranges {
                for o in a.first..=a.last {
                    while next.next_if(|&&x| x < o).is_some() {}
                    if next.peek() != Some(&&o) {
                        offsets.insert(o, Some(0));
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Sends acknowledgements to one core's session and waits for the
    /// answer (closing the session with `close`).
    async fn acknowledge_at(
        &mut self,
        addr: SocketAddr,
        partitions: Vec<SharePartitionRequest>,
        close: bool,
    ) -> Result<()> {
        let Some(session) = self.sessions.get_mut(&addr) else {
            if partitions.iter().all(|p| p.acks.is_empty()) {
                return Ok(());
            }
            // Its session failed: these records come back to the group
            // once their locks expire.
            return Err(ClientError::Disconnected);
        };
        if session.epoch == 0 || (partitions.is_empty() && !close && !session.unstored) {
            return Ok(());
        }
        let req = ShareAcknowledgeRequest {
            group: self.config.group_id.clone(),
            member_id: self.member_id.clone(),
            session_epoch: if close { -1 } else { session.epoch },
            partitions,
        };
        session.epoch = next_epoch(session.epoch);
        let client = session.client.clone();
        if close {
            self.sessions.remove(&addr);
        }
        match client.share_acknowledge(&req).await {
            Ok(body) => {
                // Answered without a failure: everything acknowledged
                // before is stored (a failure named here is stored again
                // by the next acknowledgement).
                if body.error == 0 && body.partitions.iter().all(|p| p.ack_error == 0) {
                    if let Some(s) = self.sessions.get_mut(&addr) {
                        s.unstored = false;
                    }
                }
                let mut ignored = Vec::new();
                self.take_answer(addr, body, &bytes::Bytes::new(), &mut ignored, true)
            }
            Err(e) => {
                self.drop_session(addr);
                Err(e)
            }
        }
    }

    /// Forgets the session with `addr` (a new one is opened by the next
    /// fetch there), noting when acknowledgements it carried were not
    /// known to be stored.
    fn drop_session(&mut self, addr: SocketAddr) -> Option<Session> {
        let s = self.sessions.remove(&addr)?;
        if s.unstored {
            self.unconfirmed.insert(addr);
        }
        Some(s)
    }

    /// The error for sessions lost with acknowledgements not known to be
    /// stored (once: they are forgotten).
    fn take_unconfirmed(&mut self) -> Option<ClientError> {
        if self.unconfirmed.is_empty() {
            return None;
        }
        let lost: Vec<String> = std::mem::take(&mut self.unconfirmed)
            .iter()
            .map(SocketAddr::to_string)
            .collect();
        Some(ClientError::Group {
            group: self.config.group_id.clone(),
            code: ErrorCode::ShareSessionNotFound,
            message: format!(
                "acknowledgements sent with earlier polls to {} may not be stored: that share \
                 session was lost; their records may be delivered again",
                lost.join(", ")
            ),
        })
    }

    /// Sends the acknowledgements given (in implicit mode, the acceptance
    /// of every record returned) and waits until the broker stored them
    /// and those earlier polls sent (a poll's fetch is answered before
    /// its acknowledgements are stored); the first refusal or failure is
    /// returned (`InvalidRecordState`: the records' lock expired, or they
    /// were never this member's; `ShareSessionNotFound`: a session that
    /// carried acknowledgements was lost before they were known stored).
    pub async fn commit_sync(&mut self) -> Result<()> {
        self.settle_out().await?;
        self.accept_implicitly();
        let mut acks = self.take_acks();
        // Sessions whose fetches carried acknowledgements not yet stored
        // are asked too (with none of their own).
        for (addr, s) in &self.sessions {
            if s.unstored {
                acks.entry(*addr).or_default();
            }
        }
        let mut first = None;
        for (addr, parts) in acks {
            if let Err(e) = self.acknowledge_at(addr, parts, false).await {
                first.get_or_insert(e);
            }
        }
        first
            .or_else(|| self.take_unconfirmed())
            .map_or(Ok(()), Err)
    }

    /// Leaves the group: acknowledges what was given (implicit mode:
    /// accepts what was returned), closes the share sessions (records
    /// still held go back to the others at once) and stops heartbeating.
    pub async fn close(mut self) -> Result<()> {
        // Records fetched and not handed out go back with the
        // sessions' close.
        let settled = self.settle_out().await;
        self.buffered.clear();
        self.accept_implicitly();
        let mut acks = self.take_acks();
        let addrs: Vec<SocketAddr> = self.sessions.keys().copied().collect();
        let mut first = None;
        for addr in addrs {
            let parts = acks.remove(&addr).unwrap_or_default();
            if let Err(e) = self.acknowledge_at(addr, parts, true).await {
                first.get_or_insert(e);
            }
        }
        self.lock().leaving = true;
        self.wake.notify_one();
        if let Some(h) = self.heartbeat.take() {
            let _ = h.await;
        }
        settled?;
        first
            .or_else(|| self.take_unconfirmed())
            .map_or(Ok(()), Err)
    }
}

impl Drop for ShareConsumer {
    fn drop(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }
}

/// Refuses acquired ranges (sorted) that the walk of an answer's gaps must
/// not follow: outside the batches answered (`span`: their first and last
/// offsets; the broker acquires from whole batches), or more offsets than
/// a share partition's window holds.
fn check_acquired(
    ranges: &[weir_proto::messages::AcquiredRange],
    span: Option<(u64, u64)>,
) -> std::result::Result<(), String> {
    let mut total = 0u64;
    for a in ranges {
        if !span.is_some_and(|(lo, hi)| lo <= a.first && a.last <= hi) {
            return Err(format!(
                "offsets {}..={} acquired outside the batches answered ({span:?})",
                a.first, a.last
            ));
        }
        total = total.saturating_add(a.last.saturating_add(1).saturating_sub(a.first));
    }
    if total > ACQUIRED_PER_PARTITION_MAX {
        return Err(format!(
            "{total} offsets acquired at once; a share partition holds at most {ACQUIRED_PER_PARTITION_MAX}"
        ));
    }
    Ok(())
}

/// The share session epoch after `e` (1 after the largest).
fn next_epoch(e: i32) -> i32 {
    if !(0..i32::MAX).contains(&e) {
        1
    } else {
        e + 1
    }
}

/// Heartbeats the member to its group's coordinator until it leaves:
/// joins (epoch 0), learns its partitions, joins again when fenced.
async fn heartbeat_loop(
    client: Arc<Client>,
    group: String,
    member_id: String,
    membership: Arc<Mutex<Membership>>,
    wake: Arc<Notify>,
    assigned: Arc<Notify>,
) {
    let lock = || membership.lock().unwrap_or_else(|e| e.into_inner());
    let mut interval: Duration;
    loop {
        let (epoch, topics, leaving) = {
            let m = lock();
            let topics = (m.topics_changed || m.epoch == 0).then(|| m.topics.clone());
            (if m.leaving { -1 } else { m.epoch }, topics, m.leaving)
        };
        let req = ShareGroupHeartbeatRequest {
            group: group.clone(),
            member_id: member_id.clone(),
            member_epoch: epoch,
            topics,
        };
        let answer = client.share_group_heartbeat(&req).await;
        if leaving {
            return;
        }
        match answer {
            Ok(a) if a.error == 0 => {
                interval = Duration::from_millis(a.heartbeat_interval_ms.max(100).into());
                let mut m = lock();
                m.epoch = a.member_epoch;
                // The subscription sent is known (a change made since is
                // sent next time).
                if req.topics.as_ref() == Some(&m.topics) {
                    m.topics_changed = false;
                }
                if let Some(tps) = a.assignment {
                    m.assignment = TopicPartitions::pairs(&tps).collect();
                    assigned.notify_waiters();
                    assigned.notify_one();
                }
            }
            Ok(a) => {
                let code = ErrorCode::from_u16(a.error);
                let mut m = lock();
                match code {
                    // Expelled: join again.
                    ErrorCode::UnknownMemberId | ErrorCode::FencedMemberEpoch => {
                        m.epoch = 0;
                        m.assignment.clear();
                        interval = Duration::from_millis(100);
                    }
                    ErrorCode::NotCoordinator | ErrorCode::Recovering | ErrorCode::StorageError => {
                        interval = Duration::from_millis(200);
                    }
                    _ => {
                        m.fatal = Some(group_error(&group, a.error, a.message));
                        interval = Duration::from_secs(1);
                    }
                }
            }
            Err(e) => {
                tracing::debug!(group, error = %e, "share heartbeat failed: retrying");
                interval = Duration::from_millis(200);
            }
        }
        let _ = tokio::time::timeout(interval, wake.notified()).await;
    }
}

impl Client {
    /// Sends a share group member's heartbeat to the group's coordinator
    /// (found as for consumer groups). The answer's `error` is not
    /// turned into an `Err`. Normally sent by a [`ShareConsumer`].
    pub async fn share_group_heartbeat(
        &self,
        req: &ShareGroupHeartbeatRequest,
    ) -> Result<weir_proto::messages::ShareGroupHeartbeatResponse> {
        self.group_call(&req.group, req, Duration::ZERO).await
    }

    /// Sends a share fetch to this connection's core and returns its
    /// answer and payload (each partition's batches at its
    /// `payload_offset`). Errors in the answer are not turned into an
    /// `Err`. Normally sent by a [`ShareConsumer`].
    pub async fn share_fetch(
        &self,
        req: &ShareFetchRequest,
        wait: Duration,
    ) -> Result<(ShareFetchResponse, bytes::Bytes)> {
        let a = self
            .call(req, &[], wait, true)
            .await?
            .expect("an answer was expected");
        Ok((a.body, a.payload))
    }

    /// Sends share acknowledgements to this connection's core. Errors in
    /// the answer are not turned into an `Err`. Normally sent by a
    /// [`ShareConsumer`].
    pub async fn share_acknowledge(
        &self,
        req: &ShareAcknowledgeRequest,
    ) -> Result<ShareFetchResponse> {
        self.request(req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_polls_records_are_shared_among_the_cores_it_fetches_from() {
        use AcquireMode::{BatchOptimized, RecordLimit};
        // About: each core asks for its rounded-up share.
        assert_eq!(per_core_records(500, BatchOptimized, 3), [167, 167, 167]);
        // At most: the shares add up to the poll's, never past it…
        assert_eq!(per_core_records(500, RecordLimit, 3), [167, 167, 166]);
        assert_eq!(per_core_records(7, RecordLimit, 1), [7]);
        // …unless there are fewer records than cores: one each (0 would
        // ask for the broker's default).
        assert_eq!(per_core_records(1, RecordLimit, 2), [1, 1]);
        assert_eq!(per_core_records(5, BatchOptimized, 0), [5]);
        for mode in [BatchOptimized, RecordLimit] {
            assert_eq!(AcquireMode::from_name(mode.name()), Some(mode));
        }
        assert_eq!(AcquireMode::from_name("strict"), None);
    }

    #[test]
    fn member_ids_are_uuid_shaped_and_differ() {
        let a = new_member_id();
        let b = new_member_id();
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
        assert_ne!(a, b);
    }

    #[test]
    fn acquired_ranges_outside_the_batches_or_past_a_window_are_refused() {
        use weir_proto::messages::AcquiredRange;
        let r = |first, last| AcquiredRange {
            first,
            last,
            delivery_count: 1,
        };
        assert_eq!(
            check_acquired(&[r(10, 19), r(30, 39)], Some((10, 49))),
            Ok(())
        );
        let outside = check_acquired(&[r(10, 19), r(45, 60)], Some((10, 49))).unwrap_err();
        assert!(outside.contains("45..=60"), "{outside}");
        assert!(check_acquired(&[r(0, 0)], None).is_err());
        assert_eq!(check_acquired(&[r(0, 9_999)], Some((0, u64::MAX))), Ok(()));
        let wide = check_acquired(&[r(0, 1 << 40)], Some((0, u64::MAX))).unwrap_err();
        assert!(wide.contains("at most 10000"), "{wide}");
    }

    #[test]
    fn session_epochs_wrap_to_one() {
        assert_eq!(next_epoch(0), 1);
        assert_eq!(next_epoch(7), 8);
        assert_eq!(next_epoch(i32::MAX), 1);
        assert_eq!(next_epoch(-1), 1);
    }
}
