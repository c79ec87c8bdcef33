//! Consumer-group calls on a [`Client`]: membership (join, heartbeat,
//! leave — normally driven by a [`crate::GroupConsumer`]), committed
//! offsets, and group administration (list, describe, lag, delete, reset).
//!
//! Group-level refusals are [`ClientError::Group`] with the server's code
//! (e.g. `UnknownMemberId`, `IllegalGeneration`, `GroupNotEmpty`);
//! per-partition refusals of a commit are [`ClientError::Partition`].

use std::collections::BTreeMap;
use std::time::Duration;

use weir_proto::error_code::ErrorCode;
use weir_proto::messages::{
    CommitOffset, CommittedOffset, DeleteGroupRequest, DescribeGroupRequest, DescribeGroupResponse,
    FetchPartition, GroupAssignment, GroupListing, HeartbeatRequest, JoinGroupRequest,
    LeaveGroupRequest, ListGroupsRequest, OffsetCommitRequest, OffsetFetchRequest, OffsetSpec,
    TopicPartitions,
};
use weir_proto::reader::RecordBatch;

use crate::{Client, ClientError, Result};

/// A partition: (topic, index).
pub type TopicPartition = (String, u32);

fn group_error(group: &str, code: u16, message: Option<String>) -> ClientError {
    let code = ErrorCode::from_u16(code);
    ClientError::Group {
        group: group.to_string(),
        code,
        message: message.unwrap_or_else(|| code.description().to_string()),
    }
}

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
        let a = self.request(&req).await?;
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
        let a = self
            .call(&req, &[], wait, true)
            .await?
            .expect("an answer was expected")
            .body;
        if a.error != 0 {
            return Err(group_error(&group, a.error, a.message));
        }
        Ok(a)
    }

    /// Leaves a group; its partitions are reassigned to the others.
    pub async fn leave_group(&self, group: &str, member_id: &str) -> Result<()> {
        let r = self
            .request(&LeaveGroupRequest {
                group: group.to_string(),
                member_id: member_id.to_string(),
            })
            .await?;
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
        let r = self
            .request(&OffsetCommitRequest {
                group: group.to_string(),
                member_id: member_id.to_string(),
                generation,
                offsets,
            })
            .await?;
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
        let r = self
            .request(&OffsetFetchRequest {
                group: group.to_string(),
                partitions: partitions.map(to_wire),
            })
            .await?;
        if r.error != 0 {
            return Err(group_error(group, r.error, r.message));
        }
        Ok(r.offsets)
    }

    /// Every group (id, state, member count, assignor), sorted by id.
    pub async fn list_groups(&self) -> Result<Vec<GroupListing>> {
        Ok(self.request(&ListGroupsRequest {}).await?.groups)
    }

    /// A group's state, generation, members (subscription, target
    /// assignment, owned partitions) and committed offsets.
    pub async fn describe_group(&self, group: &str) -> Result<DescribeGroupResponse> {
        let r = self
            .request(&DescribeGroupRequest {
                group: group.to_string(),
            })
            .await?;
        if r.error != 0 {
            return Err(group_error(group, r.error, r.message));
        }
        Ok(r)
    }

    /// Deletes a group without active members, with its committed offsets.
    pub async fn delete_group(&self, group: &str) -> Result<()> {
        let r = self
            .request(&DeleteGroupRequest {
                group: group.to_string(),
            })
            .await?;
        if r.error != 0 {
            return Err(group_error(group, r.error, r.message));
        }
        Ok(())
    }

    /// Per partition of the group (every partition with a commit or
    /// assigned to a member): committed offset, log end, lag in records
    /// and in seconds (now − the timestamp of the record at the committed
    /// offset; 0 when caught up), and the member it is assigned to. Sorted
    /// by topic and partition.
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
        for o in &group.offsets {
            rows.entry((o.topic.clone(), o.partition))
                .or_insert_with(|| blank(&o.topic, o.partition))
                .committed = Some(o.offset);
        }
        for m in &group.members {
            for (t, p) in from_wire(&m.assignment) {
                rows.entry((t.clone(), p))
                    .or_insert_with(|| blank(&t, p))
                    .consumer = Some(m.member_id.clone());
            }
        }
        for ((t, p), row) in rows.iter_mut() {
            row.log_end = self
                .list_offsets(t, *p, OffsetSpec::Latest)
                .await?
                .unwrap_or(0);
            let from = match row.committed {
                Some(c) => c,
                None => self
                    .list_offsets(t, *p, OffsetSpec::Earliest)
                    .await?
                    .unwrap_or(0),
            };
            row.lag = row.log_end.saturating_sub(from);
            if row.lag > 0 {
                if let Some(ts) = self.timestamp_at(t, *p, from).await? {
                    row.lag_seconds = ((now_ms - ts) as f64 / 1000.0).max(0.0);
                }
            }
        }
        Ok(rows.into_values().collect())
    }

    /// The timestamp of the first record at or after `offset`, if any.
    async fn timestamp_at(&self, topic: &str, partition: u32, offset: u64) -> Result<Option<i64>> {
        let target = FetchPartition {
            topic: topic.to_string(),
            partition,
            offset,
            max_bytes: 1,
        };
        let fetched = match self.fetch_many(0, 1, vec![target]).await?.pop() {
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
