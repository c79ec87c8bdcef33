//! Consumer-group calls on a [`Client`]: membership (join, heartbeat,
//! leave — normally driven by a [`crate::GroupConsumer`]), committed
//! offsets, and group administration (list, describe, lag, delete, reset).
//!
//! Group-level refusals are [`ClientError::Group`] with the server's code
//! (e.g. `UnknownMemberId`, `IllegalGeneration`, `GroupNotEmpty`);
//! per-partition refusals of a commit are [`ClientError::Partition`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use weir_proto::error_code::ErrorCode;
use weir_proto::messages::Request;
use weir_proto::messages::{
    AlterShareOffsetsRequest, AlterShareOffsetsResponse, ShareStartChange, ShareStartResult,
};
use weir_proto::messages::{
    CommitOffset, CommittedOffset, DeleteGroupRequest, DescribeGroupRequest, DescribeGroupResponse,
    FetchPartition, FindCoordinatorRequest, FindCoordinatorResponse, GroupAssignment, GroupListing,
    GroupResult, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, ListGroupsRequest,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, OffsetSpec,
    TopicPartitions,
};
use weir_proto::messages::{
    EndTxnResponse, InitProducerIdResponse, ShareGroupHeartbeatResponse, TxnResult,
};
use weir_proto::reader::RecordBatch;

use crate::consumer::{ConsumerBackend, IsolationLevel};
use crate::{Client, ClientError, Result};

/// A partition: (topic, index).
pub type TopicPartition = (String, u32);

pub(crate) fn group_error(group: &str, code: u16, message: Option<String>) -> ClientError {
    let code = ErrorCode::from_u16(code);
    ClientError::Group {
        group: group.to_string(),
        code,
        message: message.unwrap_or_else(|| code.description().to_string()),
    }
}

/// An answer of a group request: its error code.
/// What a coordinator coordinates: a consumer group or a transactional id.
pub(crate) enum Coordinated<'a> {
    Group(&'a str),
    Transaction(&'a str),
}

impl Coordinated<'_> {
    /// Its entry in the client's coordinator cache (transactional ids
    /// under a NUL-framed prefix: apart from any group id in practice; a
    /// wrong entry would only cost a `NotCoordinator` and a lookup).
    fn slot(&self) -> String {
        match self {
            Coordinated::Group(g) => g.to_string(),
            Coordinated::Transaction(t) => format!("\0txn\0{t}"),
        }
    }
}

pub(crate) trait GroupAnswer {
    fn error(&self) -> u16;
}

macro_rules! group_answers {
    ($($t:ty),*) => {$(
        impl GroupAnswer for $t {
            fn error(&self) -> u16 {
                self.error
            }
        }
    )*};
}

group_answers!(
    ShareGroupHeartbeatResponse,
    GroupAssignment,
    GroupResult,
    OffsetCommitResponse,
    OffsetFetchResponse,
    DescribeGroupResponse,
    InitProducerIdResponse,
    TxnResult,
    EndTxnResponse,
    AlterShareOffsetsResponse
);

/// Partitions as the wire lists them (grouped by topic, sorted).
pub fn to_wire(partitions: &[TopicPartition]) -> Vec<TopicPartitions> {
    TopicPartitions::group(partitions)
}

/// Partitions from the wire's lists.
pub fn from_wire(list: &[TopicPartitions]) -> Vec<TopicPartition> {
    TopicPartitions::pairs(list).collect()
}

/// One partition's consumption state in a group, as `weir group describe`
/// shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionLag {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The committed offset (`None`: nothing committed).
    pub committed: Option<u64>,
    /// The log end offset.
    pub log_end: u64,
    /// Records not consumed yet: log end − committed (the whole log from
    /// its start when nothing is committed).
    pub lag: u64,
    /// Now − the timestamp of the next unconsumed record, in seconds; 0
    /// when caught up.
    pub lag_seconds: f64,
    /// The member the partition is assigned to, if any.
    pub consumer: Option<String>,
}

impl Client {
    /// Joins `group` as a new member (empty `member_id`) or updates a
    /// member's subscription. Normally called by a
    /// [`crate::GroupConsumer`].
    pub async fn join_group(&self, req: JoinGroupRequest) -> Result<GroupAssignment> {
        let group = req.group.clone();
        let a = self.group_call(&group, &req, Duration::ZERO).await?;
        if a.error != 0 {
            return Err(group_error(&group, a.error, a.message));
        }
        Ok(a)
    }

    /// Sends a member's heartbeat; the coordinator may hold it up to
    /// `req.wait_ms` (see [`HeartbeatRequest`]).
    pub async fn heartbeat(&self, req: HeartbeatRequest) -> Result<GroupAssignment> {
        let group = req.group.clone();
        let wait = Duration::from_millis(req.wait_ms.into());
        let a = self.group_call(&group, &req, wait).await?;
        if a.error != 0 {
            return Err(group_error(&group, a.error, a.message));
        }
        Ok(a)
    }

    /// Leaves a group; its partitions are reassigned to the others.
    pub async fn leave_group(&self, group: &str, member_id: &str) -> Result<()> {
        let req = LeaveGroupRequest {
            group: group.to_string(),
            member_id: member_id.to_string(),
        };
        let r = self.group_call(group, &req, Duration::ZERO).await?;
        if r.error != 0 {
            return Err(group_error(group, r.error, r.message));
        }
        Ok(())
    }

    /// Commits offsets (the next offset to consume per partition, with
    /// optional metadata) for a member of `group` at `generation`, or — with
    /// an empty `member_id` and generation -1 — for a group without active
    /// members (what `weir group reset` does). Returns once the commit is
    /// durable. The first refused partition fails the call (the others may
    /// be committed).
    pub async fn commit_offsets(
        &self,
        group: &str,
        member_id: &str,
        generation: i32,
        offsets: Vec<CommitOffset>,
    ) -> Result<()> {
        let req = OffsetCommitRequest {
            group: group.to_string(),
            member_id: member_id.to_string(),
            generation,
            offsets,
        };
        let r = self.group_call(group, &req, Duration::ZERO).await?;
        if r.error != 0 {
            return Err(group_error(group, r.error, r.message));
        }
        match r.partitions.into_iter().find(|p| p.error != 0) {
            Some(p) => Err(ClientError::partition(
                &p.topic,
                p.partition,
                p.error,
                p.message,
            )),
            None => Ok(()),
        }
    }

    /// The committed offsets of a group: of `partitions`, or of every
    /// partition with a commit (`None`). Partitions without a commit are
    /// left out; an unknown group has none.
    pub async fn committed_offsets(
        &self,
        group: &str,
        partitions: Option<&[TopicPartition]>,
    ) -> Result<Vec<CommittedOffset>> {
        let req = OffsetFetchRequest {
            group: group.to_string(),
            partitions: partitions.map(to_wire),
        };
        let r = self.group_call(group, &req, Duration::ZERO).await?;
        if r.error != 0 {
            return Err(group_error(group, r.error, r.message));
        }
        Ok(r.offsets)
    }

    /// Where `group`'s coordinator is: its node, cluster-wide core index
    /// and that core's address. Any node answers.
    pub async fn find_coordinator(&self, group: &str) -> Result<FindCoordinatorResponse> {
        self.find_coordinator_of(&Coordinated::Group(group)).await
    }

    /// Where the coordinator of a group or transactional id is.
    pub(crate) async fn find_coordinator_of(
        &self,
        key: &Coordinated<'_>,
    ) -> Result<FindCoordinatorResponse> {
        let (name, transaction) = match key {
            Coordinated::Group(g) => (g, false),
            Coordinated::Transaction(t) => (t, true),
        };
        let r = self
            .request(&FindCoordinatorRequest {
                group: name.to_string(),
                transaction,
            })
            .await?;
        if r.error != 0 {
            return Err(group_error(name, r.error, r.message));
        }
        Ok(r)
    }

    /// Sends a request of `group` to its coordinator: to the node this
    /// client talks to until that node answers `NotCoordinator`, then to
    /// the coordinator it names (found with `FindCoordinator` and
    /// remembered; found again when it moves or its connection fails).
    pub(crate) async fn group_call<R: Request>(
        &self,
        group: &str,
        req: &R,
        extra_wait: Duration,
    ) -> Result<R::Response>
    where
        R::Response: GroupAnswer,
    {
        self.coordinator_call(&Coordinated::Group(group), req, extra_wait)
            .await
    }

    /// [`Client::group_call`] for a group's or a transactional id's
    /// coordinator.
    pub(crate) async fn coordinator_call<R: Request>(
        &self,
        key: &Coordinated<'_>,
        req: &R,
        extra_wait: Duration,
    ) -> Result<R::Response>
    where
        R::Response: GroupAnswer,
    {
        let slot = key.slot();
        let cached = || {
            self.coordinators
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&slot)
                .cloned()
        };
        let forget = || {
            self.coordinators
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&slot);
        };
        let mut via = cached();
        let mut tries = 0;
        loop {
            tries += 1;
            let sent = match &via {
                Some(c) => c.call(req, &[], extra_wait, true).await,
                None => self.call(req, &[], extra_wait, true).await,
            };
            let answer = match sent {
                Ok(a) => a.expect("an answer was expected").body,
                Err(e) => {
                    // The coordinator's node may be gone: ask afresh next time.
                    if via.is_some() {
                        forget();
                    }
                    return Err(e);
                }
            };
            if answer.error() != ErrorCode::NotCoordinator.as_u16() || tries >= 3 {
                return Ok(answer);
            }
            forget();
            let found = match self.find_coordinator_of(key).await {
                Ok(f) => f,
                // No live coordinator right now: the caller retries.
                Err(_) => return Ok(answer),
            };
            let addr = crate::resolve_advertised(&found.host, found.port, self.addr.ip()).await;
            let config = crate::config_for_host(&self.config, &found.host);
            let client = Arc::new(Client::connect_lazy(addr, config));
            self.coordinators
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(slot.clone(), client.clone());
            via = Some(client);
        }
    }

    /// Every group (id, state, member count, assignor), sorted by id: of
    /// every node of the cluster that answers (each lists the groups it
    /// coordinates).
    pub async fn list_groups(&self) -> Result<Vec<GroupListing>> {
        let mine = self.request(&ListGroupsRequest {}).await?.groups;
        let mut all: BTreeMap<String, GroupListing> =
            mine.into_iter().map(|g| (g.group.clone(), g)).collect();
        for other in self.other_nodes().await {
            if let Ok(r) = other.request(&ListGroupsRequest {}).await {
                for g in r.groups {
                    all.entry(g.group.clone()).or_insert(g);
                }
            }
        }
        Ok(all.into_values().collect())
    }

    /// One (lazily connecting) client per other node of the cluster, as
    /// DescribeCluster names them; none if the cluster cannot be
    /// described.
    pub(crate) async fn other_nodes(&self) -> Vec<Client> {
        let mut out = Vec::new();
        let Ok(cluster) = self.describe_cluster().await else {
            return out;
        };
        for n in &cluster.nodes {
            let Some(addr) = crate::node_addr(&n.native, self.addr.ip()).await else {
                continue;
            };
            if addr == self.addr {
                continue;
            }
            let config = crate::config_for_host(&self.config, crate::host_of(&n.native));
            out.push(Client::connect_lazy(addr, config));
        }
        out
    }

    /// A group's state, generation, members (subscription, target
    /// assignment, owned partitions) and committed offsets.
    pub async fn describe_group(&self, group: &str) -> Result<DescribeGroupResponse> {
        let req = DescribeGroupRequest {
            group: group.to_string(),
        };
        let r = self.group_call(group, &req, Duration::ZERO).await?;
        if r.error != 0 {
            return Err(group_error(group, r.error, r.message));
        }
        Ok(r)
    }

    /// Moves (`Some`) or forgets (`None`) the share-partition starts of
    /// share group `group`, which must have no members, on partitions of
    /// `topic` (Kafka's AlterShareGroupOffsets / DeleteShareGroupOffsets:
    /// records from a new start on are delivered again, those below
    /// never); with `validate_only` only reads them. Per partition, in
    /// order: the start stored before, or its refusal.
    pub async fn alter_share_offsets(
        &self,
        group: &str,
        topic: &str,
        partitions: Vec<ShareStartChange>,
        validate_only: bool,
    ) -> Result<Vec<ShareStartResult>> {
        let req = AlterShareOffsetsRequest {
            group: group.to_string(),
            topic: topic.to_string(),
            partitions,
            validate_only,
        };
        let r = self.group_call(group, &req, Duration::ZERO).await?;
        if r.error != 0 {
            return Err(group_error(group, r.error, r.message));
        }
        Ok(r.partitions)
    }

    /// Deletes a group without active members, with its committed offsets.
    pub async fn delete_group(&self, group: &str) -> Result<()> {
        let req = DeleteGroupRequest {
            group: group.to_string(),
        };
        let r = self.group_call(group, &req, Duration::ZERO).await?;
        if r.error != 0 {
            return Err(group_error(group, r.error, r.message));
        }
        Ok(())
    }

    /// Per partition of the group (every partition with a commit or
    /// assigned to a member): committed offset, log end, lag in records
    /// and in seconds (now − the timestamp of the record at the committed
    /// offset; 0 when caught up), and the member it is assigned to. Sorted
    /// by topic and partition. A share group's "committed" offset is its
    /// share partition's start (the first record not acknowledged), its
    /// lag the records not acknowledged from there to the log's end, and
    /// a partition several members read shows how many.
    pub async fn group_lag(
        &self,
        group: &DescribeGroupResponse,
        now_ms: i64,
    ) -> Result<Vec<PartitionLag>> {
        let mut rows: BTreeMap<TopicPartition, PartitionLag> = BTreeMap::new();
        let blank = |t: &str, p: u32| PartitionLag {
            topic: t.to_string(),
            partition: p,
            committed: None,
            log_end: 0,
            lag: 0,
            lag_seconds: 0.0,
            consumer: None,
        };
        let share = group.kind == "share";
        // A share group's records past its start already acknowledged
        // (its offsets' metadata: "N acknowledged past the start").
        let mut done: BTreeMap<TopicPartition, u64> = BTreeMap::new();
        for o in &group.offsets {
            rows.entry((o.topic.clone(), o.partition))
                .or_insert_with(|| blank(&o.topic, o.partition))
                .committed = Some(o.offset);
            if share {
                let n = o
                    .metadata
                    .as_deref()
                    .and_then(|m| m.split(' ').next()?.parse().ok());
                done.insert((o.topic.clone(), o.partition), n.unwrap_or(0));
            }
        }
        let mut readers: BTreeMap<TopicPartition, Vec<&str>> = BTreeMap::new();
        for m in &group.members {
            for (t, p) in from_wire(&m.assignment) {
                rows.entry((t.clone(), p)).or_insert_with(|| blank(&t, p));
                readers.entry((t, p)).or_default().push(&m.member_id);
            }
        }
        // A share group's partition is read by several members.
        for (tp, ids) in readers {
            if let Some(row) = rows.get_mut(&tp) {
                row.consumer = Some(match ids.as_slice() {
                    [one] => one.to_string(),
                    many => format!("{} members", many.len()),
                });
            }
        }
        // Each partition is asked of the node and core that holds it.
        let router = crate::ShardRouter::new(Arc::new(self.reopen_lazy()));
        for ((t, p), row) in rows.iter_mut() {
            row.log_end = router
                .list_offsets(IsolationLevel::ReadUncommitted, t, *p, OffsetSpec::Latest)
                .await?
                .unwrap_or(0);
            let from = match row.committed {
                Some(c) => c,
                None => router
                    .list_offsets(IsolationLevel::ReadUncommitted, t, *p, OffsetSpec::Earliest)
                    .await?
                    .unwrap_or(0),
            };
            row.lag = row.log_end.saturating_sub(from);
            if let Some(d) = done.get(&(t.clone(), *p)) {
                row.lag = row.lag.saturating_sub(*d);
            }
            if row.lag > 0 {
                if let Some(ts) = timestamp_at(&router, t, *p, from).await? {
                    row.lag_seconds = ((now_ms - ts) as f64 / 1000.0).max(0.0);
                }
            }
        }
        Ok(rows.into_values().collect())
    }
}

/// The timestamp of the first record at or after `offset`, if any.
async fn timestamp_at(
    from: &dyn ConsumerBackend,
    topic: &str,
    partition: u32,
    offset: u64,
) -> Result<Option<i64>> {
    let target = FetchPartition {
        topic: topic.to_string(),
        partition,
        offset,
        max_bytes: 1,
    };
    {
        let fetched = match from
            .fetch_many(IsolationLevel::ReadUncommitted, 0, 1, vec![target])
            .await?
            .pop()
        {
            Some(Ok(f)) => f,
            Some(Err(e)) if e.code() == Some(ErrorCode::OffsetOutOfRange) => return Ok(None),
            Some(Err(e)) => return Err(e),
            None => return Ok(None),
        };
        for b in &fetched.batches {
            let rb = RecordBatch::parse(b)?;
            for r in rb.records()?.iter() {
                let r = r?;
                if r.offset as u64 >= offset {
                    return Ok(Some(r.timestamp));
                }
            }
        }
        Ok(None)
    }
}
