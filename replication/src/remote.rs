//! Tiered storage's remote log metadata, part of the cluster metadata:
//! which segments of which partition are in the object store, their
//! offsets, timestamps and leader epochs, and where each is in its life
//! (copy started → copy finished → delete started → gone).
//!
//! **Why in the cluster metadata** (Kafka keeps it in the
//! `__remote_log_metadata` topic): every node already applies the quorum's
//! state in order, so a leader, a follower about to lead and the node
//! cleaning up a deleted topic all read the same committed list locally,
//! with no bootstrap of an internal topic whose own replicas would have to
//! be tiered around; the leader epoch that fences a deposed leader's ISR
//! changes fences its uploads the same way (a command names the epoch it
//! was computed at); and "visible once committed" is what the quorum
//! gives. The price is size: every node holds one entry (~100 bytes) per
//! remote segment, so a tiered topic is meant to have large segments
//! (`segment.bytes` of a GiB: 100 TB remote is ~100 000 entries, ~10 MB).
//! docs/storage-format.md ("Tiered storage") has the object layout.

use std::collections::BTreeMap;

use rkyv::{Archive, Deserialize, Serialize};

/// Where a remote segment is in its life.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteSegmentState {
    /// Its upload began: its objects may be partly written. Never read;
    /// cleaned up (its objects deleted) once its uploader is gone.
    CopyStarted,
    /// Every object is written: readable.
    CopyFinished,
    /// Being deleted (retention, DeleteRecords, a deleted topic): no longer
    /// read; removed from the metadata once its objects are gone.
    DeleteStarted,
}

/// One segment in the object store.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RemoteSegment {
    /// A unique id (random): part of every object name of the segment, so
    /// a retried or concurrent upload never overwrites another's objects.
    pub id: [u8; 16],
    /// Offset of its first record.
    pub base: u64,
    /// Offset after its last record.
    pub end: u64,
    /// Bytes of its `.log` object.
    pub bytes: u64,
    /// Largest record timestamp in it.
    pub max_timestamp: i64,
    /// The leader epoch of the uploader.
    pub leader_epoch: u32,
    /// The node that uploaded it.
    pub node: u64,
    /// Leader epochs of its records: (epoch, first offset), ascending.
    pub epochs: Vec<(u32, u64)>,
    /// Aborted transactions whose abort marker it holds (0: it has no
    /// `.txnindex` object).
    pub aborted_txns: u32,
    /// Life stage.
    pub state: RemoteSegmentState,
}

/// One topic's remote segments (by topic id: a deleted topic's segments
/// stay, marked, until their objects are gone, and a topic created again
/// under the same name is another id).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct RemoteTopic {
    /// The topic's name (for the operator; the id is the key).
    pub name: String,
    /// The topic was deleted: every segment is being deleted.
    pub deleted: bool,
    /// Each partition's segments, by base offset order.
    pub partitions: BTreeMap<u32, Vec<RemoteSegment>>,
    /// Each partition's log start raised by DeleteRecords, where it is
    /// above its first remote segment's base (records below it are no
    /// longer served).
    pub log_starts: BTreeMap<u32, u64>,
}

/// The remote log metadata of the cluster.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct RemoteState {
    /// Topics with remote segments, by topic id.
    pub topics: BTreeMap<[u8; 16], RemoteTopic>,
}

/// A leader's upload, as proposed (boxed in [`crate::meta::Command`] so
/// that the command's archived size does not grow).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RemoteCopy {
    /// Topic name.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// The proposing leader.
    pub leader: u64,
    /// Its leader epoch.
    pub leader_epoch: u32,
    /// The segment (its state is set by the command).
    pub segment: RemoteSegment,
}

impl RemoteState {
    /// The readable segments of a partition (copy finished), in offset
    /// order, contiguous.
    pub fn readable(&self, topic_id: &[u8; 16], partition: u32) -> Vec<&RemoteSegment> {
        self.segments(topic_id, partition)
            .iter()
            .filter(|s| s.state == RemoteSegmentState::CopyFinished)
            .collect()
    }

    /// Every segment of a partition, whatever its state.
    pub fn segments(&self, topic_id: &[u8; 16], partition: u32) -> &[RemoteSegment] {
        self.topics
            .get(topic_id)
            .and_then(|t| t.partitions.get(&partition))
            .map_or(&[], |v| v.as_slice())
    }

    /// Offset after the last readable segment of a partition (where the
    /// next upload must begin), if it has one.
    pub fn end(&self, topic_id: &[u8; 16], partition: u32) -> Option<u64> {
        self.readable(topic_id, partition).last().map(|s| s.end)
    }

    /// A copy begins: recorded as started, if the proposer still leads at
    /// its epoch (checked by the caller) and the segment continues the
    /// readable ones (no overlap, no gap).
    pub(crate) fn copy_started(
        &mut self,
        topic_id: [u8; 16],
        copy: &RemoteCopy,
    ) -> Result<(), String> {
        let s = &copy.segment;
        if s.end <= s.base {
            return Err(format!("remote segment {}..{} is empty", s.base, s.end));
        }
        if let Some(end) = self.end(&topic_id, copy.partition) {
            if s.base != end {
                return Err(format!(
                    "remote segment of {}-{} at {} does not continue the remote log, which ends at {end}",
                    copy.topic, copy.partition, s.base
                ));
            }
        }
        let topic = self.topics.entry(topic_id).or_default();
        topic.name.clone_from(&copy.topic);
        let list = topic.partitions.entry(copy.partition).or_default();
        if list.iter().any(|x| x.id == s.id) {
            return Err("remote segment id in use".into());
        }
        let mut seg = s.clone();
        seg.state = RemoteSegmentState::CopyStarted;
        list.push(seg);
        Ok(())
    }

    /// A copy is done: readable, if it still continues the readable ones.
    pub(crate) fn copy_finished(
        &mut self,
        topic_id: [u8; 16],
        partition: u32,
        id: [u8; 16],
    ) -> Result<(), String> {
        let end = self.end(&topic_id, partition);
        let list = self
            .topics
            .get_mut(&topic_id)
            .and_then(|t| t.partitions.get_mut(&partition))
            .ok_or("no such remote segment")?;
        let at = list
            .iter()
            .position(|x| x.id == id && x.state == RemoteSegmentState::CopyStarted)
            .ok_or("no such remote segment being copied")?;
        if end.is_some_and(|e| e != list[at].base) {
            return Err(format!(
                "remote segment at {} does not continue the remote log, which ends at {}",
                list[at].base,
                end.unwrap_or_default()
            ));
        }
        let mut seg = list.remove(at);
        seg.state = RemoteSegmentState::CopyFinished;
        // Kept in offset order among the readable ones: after the last.
        let after = list
            .iter()
            .rposition(|x| x.state == RemoteSegmentState::CopyFinished)
            .map_or(0, |i| i + 1);
        list.insert(after, seg);
        Ok(())
    }

    /// Segments to be deleted: no longer read. A readable segment may go
    /// only with every readable one before it (the remote log stays
    /// contiguous; retention deletes the oldest first).
    pub(crate) fn delete_started(
        &mut self,
        topic_id: [u8; 16],
        partition: u32,
        ids: &[[u8; 16]],
    ) -> Result<(), String> {
        let list = self
            .topics
            .get_mut(&topic_id)
            .and_then(|t| t.partitions.get_mut(&partition))
            .ok_or("no remote segments for this partition")?;
        let readable: Vec<usize> = list
            .iter()
            .enumerate()
            .filter(|(_, x)| x.state == RemoteSegmentState::CopyFinished)
            .map(|(i, _)| i)
            .collect();
        let doomed: Vec<usize> = readable
            .iter()
            .copied()
            .filter(|&i| ids.contains(&list[i].id))
            .collect();
        if doomed.iter().enumerate().any(|(k, &i)| readable[k] != i) {
            return Err("remote segments are deleted oldest first".into());
        }
        for x in list.iter_mut() {
            if ids.contains(&x.id) {
                x.state = RemoteSegmentState::DeleteStarted;
            }
        }
        Ok(())
    }

    /// Segments whose objects are gone (being deleted, or copies that
    /// never finished): removed. A deleted topic goes with its last one.
    pub(crate) fn delete_finished(&mut self, topic_id: [u8; 16], partition: u32, ids: &[[u8; 16]]) {
        let Some(topic) = self.topics.get_mut(&topic_id) else {
            return;
        };
        if let Some(list) = topic.partitions.get_mut(&partition) {
            list.retain(|x| x.state == RemoteSegmentState::CopyFinished || !ids.contains(&x.id));
            if list.is_empty() {
                topic.partitions.remove(&partition);
            }
        }
        if topic.partitions.is_empty() && (topic.deleted || topic.log_starts.is_empty()) {
            self.topics.remove(&topic_id);
        }
    }

    /// The log start of a partition (DeleteRecords): records below
    /// `offset` are no longer served, and the readable segments wholly
    /// below it are to be deleted. Never lowered.
    pub(crate) fn raise_log_start(
        &mut self,
        topic_id: [u8; 16],
        topic: &str,
        partition: u32,
        offset: u64,
    ) {
        let t = self.topics.entry(topic_id).or_default();
        if t.name.is_empty() {
            t.name = topic.to_string();
        }
        let start = t.log_starts.entry(partition).or_default();
        *start = (*start).max(offset);
        if let Some(list) = t.partitions.get_mut(&partition) {
            for x in list.iter_mut() {
                if x.state == RemoteSegmentState::CopyFinished && x.end <= offset {
                    x.state = RemoteSegmentState::DeleteStarted;
                }
            }
        }
    }

    /// A partition's log start as DeleteRecords raised it (0: never).
    pub fn log_start(&self, topic_id: &[u8; 16], partition: u32) -> u64 {
        self.topics
            .get(topic_id)
            .and_then(|t| t.log_starts.get(&partition))
            .copied()
            .unwrap_or(0)
    }

    /// A topic is deleted: every segment of it is being deleted.
    pub(crate) fn topic_deleted(&mut self, topic_id: [u8; 16]) {
        if let Some(t) = self.topics.get_mut(&topic_id) {
            t.deleted = true;
            for list in t.partitions.values_mut() {
                for x in list {
                    x.state = RemoteSegmentState::DeleteStarted;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(id: u8, base: u64, end: u64) -> RemoteSegment {
        RemoteSegment {
            id: [id; 16],
            base,
            end,
            bytes: end - base,
            max_timestamp: 0,
            leader_epoch: 1,
            node: 1,
            epochs: vec![(1, base)],
            aborted_txns: 0,
            state: RemoteSegmentState::CopyStarted,
        }
    }

    fn copy(s: RemoteSegment) -> RemoteCopy {
        RemoteCopy {
            topic: "t".into(),
            partition: 0,
            leader: 1,
            leader_epoch: 1,
            segment: s,
        }
    }

    const T: [u8; 16] = [7; 16];

    #[test]
    fn copies_become_readable_only_when_finished_and_contiguous() {
        let mut r = RemoteState::default();
        r.copy_started(T, &copy(seg(1, 100, 200))).unwrap();
        assert!(r.readable(&T, 0).is_empty(), "a started copy is not read");
        r.copy_finished(T, 0, [1; 16]).unwrap();
        assert_eq!(r.end(&T, 0), Some(200));
        // A gap, an overlap: refused.
        assert!(r.copy_started(T, &copy(seg(2, 250, 300))).is_err());
        assert!(r.copy_started(T, &copy(seg(2, 150, 300))).is_err());
        // Two leaders' copies of the same range: the first to finish wins.
        r.copy_started(T, &copy(seg(2, 200, 300))).unwrap();
        r.copy_started(T, &copy(seg(3, 200, 300))).unwrap();
        r.copy_finished(T, 0, [3; 16]).unwrap();
        assert!(r.copy_finished(T, 0, [2; 16]).is_err());
        let read: Vec<_> = r.readable(&T, 0).iter().map(|s| s.id[0]).collect();
        assert_eq!(read, vec![1, 3]);
        // The loser stays, started, until it is cleaned up.
        r.delete_finished(T, 0, &[[2; 16]]);
        assert_eq!(r.segments(&T, 0).len(), 2);
        assert!(
            r.copy_started(T, &copy(seg(3, 300, 400))).is_err(),
            "ids are unique"
        );
    }

    #[test]
    fn deletes_go_oldest_first_and_deleted_topics_are_forgotten_when_empty() {
        let mut r = RemoteState::default();
        for (id, b) in [(1u8, 0u64), (2, 10), (3, 20)] {
            r.copy_started(T, &copy(seg(id, b, b + 10))).unwrap();
            r.copy_finished(T, 0, [id; 16]).unwrap();
        }
        assert!(r.delete_started(T, 0, &[[2; 16]]).is_err(), "a hole");
        r.delete_started(T, 0, &[[1; 16], [2; 16]]).unwrap();
        assert_eq!(r.readable(&T, 0).len(), 1);
        r.delete_finished(T, 0, &[[1; 16], [2; 16], [3; 16]]);
        assert_eq!(
            r.segments(&T, 0).len(),
            1,
            "a readable one is never removed"
        );
        r.raise_log_start(T, "t", 0, 25);
        assert_eq!(r.log_start(&T, 0), 25);
        r.raise_log_start(T, "t", 0, 5);
        assert_eq!(r.log_start(&T, 0), 25, "never lowered");
        assert_eq!(r.readable(&T, 0).len(), 1, "20..30 holds 25: kept");
        r.topic_deleted(T);
        assert!(r.readable(&T, 0).is_empty());
        r.delete_finished(T, 0, &[[3; 16]]);
        assert!(r.topics.is_empty());
    }
}
