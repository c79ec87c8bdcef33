//! One share partition: a share group's view of one topic partition
//! (KIP-932), as a pure state machine. The broker keeps it on the core
//! leading the partition, feeds it the log's batch bounds and the time,
//! and stores its [`SharePartition::snapshot`] before answering an
//! acknowledgement.
//!
//! **The window.** Records below the *start offset* (Kafka's SPSO) are
//! done; records from the *end offset* (SPEO) on were never acquired.
//! Between them every offset has a slot: its [`RecordState`], its delivery
//! count and, while Acquired, the member holding it and the deadline of
//! its lock. The start offset moves past slots as soon as they are
//! Acknowledged or Archived; the window holds at most
//! [`ShareConfig::max_in_flight`] slots (`group.share.partition.max.record.locks`),
//! so one record nobody acknowledges bounds how far a group runs ahead.
//!
//! **Acquisition** ([`SharePartition::acquire`]) hands a member, in offset
//! order, first the Available records of the window (released, or whose
//! lock expired), then whole batches of the log from the end offset (in
//! [`AcquireMode::RecordLimit`], KIP-1206, no more records than asked: the
//! last batch in part, its rest left for the next fetch). Each
//! acquisition counts a delivery. Control batches (transaction markers)
//! are archived, never delivered; offsets between two batches (compacted
//! away) are archived too.
//!
//! **Acknowledgement** ([`SharePartition::acknowledge`]): ACCEPT makes a
//! record Acknowledged, REJECT and GAP Archived, RELEASE Available again
//! (Archived if it reached the delivery limit), RENEW extends the lock
//! (KIP-1222). Only records the member holds, under a lock not yet
//! expired, can be acknowledged; a request partition is checked whole
//! before anything changes. A lock that expires ([`SharePartition::expire`])
//! or a member that leaves ([`SharePartition::release_member`]) releases
//! records the same way.
//!
//! **Durability.** The snapshot is the start offset, the end offset and
//! the slots that are not plain (Available, never delivered), as runs.
//! Acquired slots are stored as Available with their delivery count: a
//! restored share partition (a new leader, a restart) delivers again
//! exactly the records acquired and not acknowledged, and a record that
//! keeps failing still reaches its delivery limit.

use std::collections::VecDeque;
use std::rc::Rc;

use crate::limits::{
    ACK_BATCHES_MAX, DELIVERY_COUNT_LIMIT_DEFAULT, PARTITION_MAX_RECORD_LOCKS_DEFAULT,
    RECORD_LOCK_DURATION_MS_DEFAULT,
};

/// Kafka's acknowledgement types (`AcknowledgeTypes` bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckType {
    /// 0: an offset without a record (compacted away, a control batch).
    Gap,
    /// 1: processed.
    Accept,
    /// 2: deliver again (to any member).
    Release,
    /// 3: never deliver again.
    Reject,
    /// 4: keep holding it: the lock is extended (KIP-1222).
    Renew,
}

impl AckType {
    /// The type of Kafka's byte.
    pub fn from_byte(b: u8) -> Option<AckType> {
        Some(match b {
            0 => AckType::Gap,
            1 => AckType::Accept,
            2 => AckType::Release,
            3 => AckType::Reject,
            4 => AckType::Renew,
            _ => return None,
        })
    }

    /// Kafka's byte.
    pub fn byte(self) -> u8 {
        match self {
            AckType::Gap => 0,
            AckType::Accept => 1,
            AckType::Release => 2,
            AckType::Reject => 3,
            AckType::Renew => 4,
        }
    }
}

/// The state of a record in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// May be acquired.
    Available,
    /// Held by a member until its lock's deadline.
    Acquired,
    /// Accepted: done.
    Acknowledged,
    /// Rejected, over its delivery limit, or no record: done, never
    /// delivered again.
    Archived,
}

impl RecordState {
    /// Done: the start offset may move past it.
    pub fn terminal(self) -> bool {
        matches!(self, RecordState::Acknowledged | RecordState::Archived)
    }
}

/// How a fetch's `max_records` bounds what it acquires (Kafka's
/// `share.acquire.mode`, KIP-1206).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AcquireMode {
    /// `batch_optimized` (Kafka's default): records from the log are
    /// acquired in whole batches, so a fetch may take past `max_records`
    /// to the end of the batch it reached.
    #[default]
    BatchOptimized,
    /// `record_limit`: at most `max_records` records; a batch is then
    /// acquired in part and the rest of it stays for the next fetch (of
    /// this member or another). The whole batch is still sent, so its
    /// bytes may go to several members.
    RecordLimit,
}

impl AcquireMode {
    /// The mode of Kafka's byte (`ShareAcquireMode`: 0 batch_optimized,
    /// 1 record_limit).
    pub fn from_byte(b: u8) -> Option<AcquireMode> {
        match b {
            0 => Some(AcquireMode::BatchOptimized),
            1 => Some(AcquireMode::RecordLimit),
            _ => None,
        }
    }

    /// Kafka's byte.
    pub fn byte(self) -> u8 {
        match self {
            AcquireMode::BatchOptimized => 0,
            AcquireMode::RecordLimit => 1,
        }
    }

    /// Kafka's config value (`batch_optimized`, `record_limit`).
    pub fn name(self) -> &'static str {
        match self {
            AcquireMode::BatchOptimized => "batch_optimized",
            AcquireMode::RecordLimit => "record_limit",
        }
    }

    /// The mode named by Kafka's config value.
    pub fn from_name(s: &str) -> Option<AcquireMode> {
        match s {
            "batch_optimized" => Some(AcquireMode::BatchOptimized),
            "record_limit" => Some(AcquireMode::RecordLimit),
            _ => None,
        }
    }
}

/// A share partition's settings (the group's `group.share.*` configs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareConfig {
    /// `group.share.record.lock.duration.ms`.
    pub lock_ms: i64,
    /// `group.share.delivery.count.limit`.
    pub delivery_limit: u16,
    /// `group.share.partition.max.record.locks`: slots in the window.
    pub max_in_flight: usize,
}

impl Default for ShareConfig {
    fn default() -> Self {
        ShareConfig {
            lock_ms: RECORD_LOCK_DURATION_MS_DEFAULT,
            delivery_limit: DELIVERY_COUNT_LIMIT_DEFAULT,
            max_in_flight: PARTITION_MAX_RECORD_LOCKS_DEFAULT,
        }
    }
}

/// A batch of the log, as acquisition sees it: its first and last
/// offsets, and whether it is a control batch (a transaction marker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogBatch {
    /// Offset of its first record.
    pub base: u64,
    /// Offset of its last record.
    pub last: u64,
    /// A control batch: archived, never delivered.
    pub control: bool,
}

/// Records handed to a member: offsets `first..=last`, each delivered
/// `delivery_count` times now (Kafka's AcquiredRecords).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// First offset.
    pub first: u64,
    /// Last offset.
    pub last: u64,
    /// Deliveries of these records, this one included.
    pub delivery_count: u16,
}

/// One acknowledgement batch: offsets `first..=last` with one type for
/// all, or one type per offset (Kafka's AcknowledgementBatch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckBatch {
    /// First offset.
    pub first: u64,
    /// Last offset.
    pub last: u64,
    /// One type, or `last - first + 1`.
    pub types: Vec<AckType>,
}

/// Why an acknowledgement was refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareError {
    /// A record is not acquired by this member, or its lock expired
    /// (Kafka's INVALID_RECORD_STATE).
    InvalidRecordState(String),
    /// Malformed: offsets out of order, a count of types that does not
    /// match, overlapping batches, too many batches (INVALID_REQUEST).
    InvalidRequest(String),
}

impl ShareError {
    /// The human-readable detail.
    pub fn message(&self) -> &str {
        match self {
            ShareError::InvalidRecordState(m) | ShareError::InvalidRequest(m) => m,
        }
    }
}

impl std::fmt::Display for ShareError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for ShareError {}

/// One offset of the window.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    state: RecordState,
    delivery_count: u16,
    /// The member holding it (Acquired only).
    owner: Option<Rc<str>>,
    /// When its lock expires (Acquired only).
    deadline_ms: i64,
}

impl Slot {
    fn available(delivery_count: u16) -> Slot {
        Slot {
            state: RecordState::Available,
            delivery_count,
            owner: None,
            deadline_ms: 0,
        }
    }

    fn archived(delivery_count: u16) -> Slot {
        Slot {
            state: RecordState::Archived,
            ..Slot::available(delivery_count)
        }
    }
}

/// A run of slots in the durable form: offsets `first..=last` in `state`
/// (never Acquired), each delivered `delivery_count` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateRun {
    /// First offset.
    pub first: u64,
    /// Last offset.
    pub last: u64,
    /// Available, Acknowledged or Archived.
    pub state: RecordState,
    /// Deliveries so far.
    pub delivery_count: u16,
}

/// A share partition's durable state (what `__share_group_state` holds):
/// the window's bounds and its slots that are not Available-and-never-
/// delivered, as runs in offset order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareSnapshot {
    /// Bumped by every reset of the start offset (an operator's
    /// AlterShareGroupOffsets), so a late write of the old state is told
    /// apart.
    pub state_epoch: i32,
    /// The start offset.
    pub start: u64,
    /// The end offset.
    pub end: u64,
    /// The slots, as runs.
    pub runs: Vec<StateRun>,
}

/// A group's view of one topic partition.
#[derive(Debug, Clone)]
pub struct SharePartition {
    config: ShareConfig,
    state_epoch: i32,
    start: u64,
    /// `slots[i]` is offset `start + i`; the end offset is `start + len`.
    slots: VecDeque<Slot>,
    acquired: usize,
}

impl SharePartition {
    /// A share partition that starts at `start` (Kafka's
    /// `share.auto.offset.reset`: the log's end, or its start).
    pub fn new(start: u64, config: ShareConfig) -> SharePartition {
        SharePartition {
            config,
            state_epoch: 0,
            start,
            slots: VecDeque::new(),
            acquired: 0,
        }
    }

    /// The share partition its snapshot describes: what was acquired and
    /// not acknowledged is Available again (its delivery count kept).
    /// A damaged snapshot (runs out of order or outside its window, a
    /// window wider than `config` allows) is refused.
    pub fn restore(s: &ShareSnapshot, config: ShareConfig) -> Result<SharePartition, String> {
        if s.end < s.start {
            return Err(format!("end offset {} before start {}", s.end, s.start));
        }
        let len = s.end - s.start;
        // A window restored under a smaller limit than it was built with
        // is kept whole (no acquisition past it until it shrinks).
        if len > (crate::limits::PARTITION_MAX_RECORD_LOCKS_MAX as u64) {
            return Err(format!("a window of {len} records"));
        }
        let mut slots: VecDeque<Slot> = (0..len).map(|_| Slot::available(0)).collect();
        let mut at = s.start;
        for r in &s.runs {
            if r.first < at || r.last < r.first || r.last >= s.end {
                return Err(format!(
                    "run {}..={} out of order or outside {}..{}",
                    r.first, r.last, s.start, s.end
                ));
            }
            if r.state == RecordState::Acquired {
                return Err("an Acquired run".into());
            }
            for o in r.first..=r.last {
                slots[(o - s.start) as usize] = Slot {
                    state: r.state,
                    ..Slot::available(r.delivery_count)
                };
            }
            at = r.last + 1;
        }
        let mut p = SharePartition {
            config,
            state_epoch: s.state_epoch,
            start: s.start,
            slots,
            acquired: 0,
        };
        p.advance();
        Ok(p)
    }

    /// The durable form of the share partition now.
    pub fn snapshot(&self) -> ShareSnapshot {
        let mut runs: Vec<StateRun> = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            // An acquired record is stored as its lock's expiry would
            // leave it: Available, or Archived at the delivery limit.
            let state = match s.state {
                RecordState::Acquired => {
                    released(s.delivery_count, self.config.delivery_limit).state
                }
                st => st,
            };
            if state == RecordState::Available && s.delivery_count == 0 {
                continue;
            }
            let o = self.start + i as u64;
            match runs.last_mut() {
                Some(r)
                    if r.last + 1 == o
                        && r.state == state
                        && r.delivery_count == s.delivery_count =>
                {
                    r.last = o
                }
                _ => runs.push(StateRun {
                    first: o,
                    last: o,
                    state,
                    delivery_count: s.delivery_count,
                }),
            }
        }
        ShareSnapshot {
            state_epoch: self.state_epoch,
            start: self.start,
            end: self.end(),
            runs,
        }
    }

    /// The settings.
    pub fn config(&self) -> ShareConfig {
        self.config
    }

    /// Applies new settings (a changed group config): locks already
    /// taken keep their deadlines.
    pub fn set_config(&mut self, config: ShareConfig) {
        self.config = config;
    }

    /// The start offset (SPSO): every record below it is done.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The end offset (SPEO): records from here on were never acquired.
    pub fn end(&self) -> u64 {
        self.start + self.slots.len() as u64
    }

    /// The state epoch (see [`ShareSnapshot::state_epoch`]).
    pub fn state_epoch(&self) -> i32 {
        self.state_epoch
    }

    /// Records held by members now.
    pub fn acquired(&self) -> usize {
        self.acquired
    }

    /// Records in the window not done yet (Available or Acquired).
    pub fn in_flight(&self) -> usize {
        self.slots.iter().filter(|s| !s.state.terminal()).count()
    }

    /// The state and delivery count of `offset` (`None` outside the
    /// window: below it done, above it never acquired).
    pub fn state_of(&self, offset: u64) -> Option<(RecordState, u16)> {
        let i = offset.checked_sub(self.start)?;
        self.slots
            .get(i as usize)
            .map(|s| (s.state, s.delivery_count))
    }

    /// Whether the window has room for records acquired from the log.
    pub fn has_room(&self) -> bool {
        self.slots.len() < self.config.max_in_flight
    }

    /// Whether some record of the window may be acquired now.
    pub fn has_available(&self) -> bool {
        self.slots.iter().any(|s| s.state == RecordState::Available)
    }

    /// The earliest lock deadline, if any record is acquired.
    pub fn next_deadline(&self) -> Option<i64> {
        self.slots
            .iter()
            .filter(|s| s.state == RecordState::Acquired)
            .map(|s| s.deadline_ms)
            .min()
    }

    /// [`SharePartition::acquire_in`] with [`AcquireMode::BatchOptimized`].
    pub fn acquire(
        &mut self,
        member: &Rc<str>,
        batches: &[LogBatch],
        max_records: usize,
        now_ms: i64,
    ) -> Vec<Acquired> {
        self.acquire_in(
            member,
            batches,
            max_records,
            AcquireMode::BatchOptimized,
            now_ms,
        )
    }

    /// Hands `member` up to `max_records` records of `batches`, the log's
    /// batches the member is sent (in offset order): first the window's
    /// Available records they hold, then records from the end offset on.
    /// In [`AcquireMode::BatchOptimized`] the log's records are taken in
    /// whole batches (the last may take it past `max_records`); in
    /// [`AcquireMode::RecordLimit`] never more than `max_records`, the last
    /// batch then in part. The window's bound is never passed (a batch is
    /// then acquired in part). Every record acquired counts a delivery and
    /// is locked until `now_ms + lock_ms`. Returns the ranges acquired, in
    /// offset order.
    pub fn acquire_in(
        &mut self,
        member: &Rc<str>,
        batches: &[LogBatch],
        max_records: usize,
        mode: AcquireMode,
        now_ms: i64,
    ) -> Vec<Acquired> {
        let max_records = max_records.max(1);
        let deadline = now_ms.saturating_add(self.config.lock_ms);
        let mut out: Vec<Acquired> = Vec::new();
        let mut taken = 0usize;
        let take = |slot: &mut Slot, o: u64, out: &mut Vec<Acquired>| {
            slot.state = RecordState::Acquired;
            slot.delivery_count = slot.delivery_count.saturating_add(1);
            slot.owner = Some(member.clone());
            slot.deadline_ms = deadline;
            match out.last_mut() {
                Some(a) if a.last + 1 == o && a.delivery_count == slot.delivery_count => a.last = o,
                _ => out.push(Acquired {
                    first: o,
                    last: o,
                    delivery_count: slot.delivery_count,
                }),
            }
        };
        // Released or expired records first, oldest first — those whose
        // batch the member is sent (`batches` covers them: a record
        // acquired but not sent would count a delivery nobody got).
        // One walk of the batches over the window: each slot is looked at
        // once.
        let window_end = self.end();
        'window: for b in batches.iter().filter(|b| !b.control) {
            for o in b.base.max(self.start)..b.last.saturating_add(1).min(window_end) {
                if taken >= max_records {
                    break 'window;
                }
                let i = (o - self.start) as usize;
                if self.slots[i].state == RecordState::Available {
                    take(&mut self.slots[i], o, &mut out);
                    taken += 1;
                }
            }
        }
        // Then the log, whole batches, while the window has room.
        for b in batches {
            if taken >= max_records || !self.has_room() {
                break;
            }
            let end = self.end();
            if b.last < end || b.last < b.base {
                continue;
            }
            // Offsets between the end and this batch hold no record.
            let first = b.base.max(end);
            for _ in end..first {
                if !self.has_room() {
                    break;
                }
                self.slots.push_back(Slot::archived(0));
            }
            // The window is a hard bound: a batch may be acquired in part
            // (the member is sent the whole batch and delivers only the
            // acquired offsets, as Kafka's clients do).
            let room = (self.config.max_in_flight - self.slots.len().min(self.config.max_in_flight))
                as u64;
            let mut last = b
                .last
                .min(self.end().saturating_add(room).saturating_sub(1));
            if mode == AcquireMode::RecordLimit && !b.control {
                // `taken < max_records` here: at least one is left.
                last = last.min(first.saturating_add((max_records - taken) as u64 - 1));
            }
            if self.end() != first || room == 0 {
                break;
            }
            for o in first..=last {
                if b.control {
                    self.slots.push_back(Slot::archived(0));
                } else {
                    self.slots.push_back(Slot::available(0));
                    let i = self.slots.len() - 1;
                    take(&mut self.slots[i], o, &mut out);
                    taken += 1;
                }
            }
        }
        self.acquired += taken;
        self.advance();
        out
    }

    /// Applies `member`'s acknowledgements of this partition, all or
    /// nothing: every offset named must be in the window, held by the
    /// member under a lock that has not expired at `now_ms`. Returns
    /// whether the durable state changed (the snapshot must be stored
    /// before the acknowledgement is answered).
    pub fn acknowledge(
        &mut self,
        member: &str,
        batches: &[AckBatch],
        now_ms: i64,
    ) -> Result<bool, ShareError> {
        if batches.len() > ACK_BATCHES_MAX {
            return Err(ShareError::InvalidRequest(format!(
                "{} acknowledgement batches (at most {ACK_BATCHES_MAX})",
                batches.len()
            )));
        }
        let mut after: Option<u64> = None;
        for b in batches {
            if b.last < b.first {
                return Err(ShareError::InvalidRequest(format!(
                    "acknowledgement batch {}..={} ends before it starts",
                    b.first, b.last
                )));
            }
            if after.is_some_and(|a| b.first <= a) {
                return Err(ShareError::InvalidRequest(format!(
                    "acknowledgement batch {}..={} overlaps or precedes the one before",
                    b.first, b.last
                )));
            }
            after = Some(b.last);
            let n = b.last - b.first + 1;
            if b.types.is_empty() || (b.types.len() != 1 && b.types.len() as u64 != n) {
                return Err(ShareError::InvalidRequest(format!(
                    "{} acknowledgement types for the {n} offsets {}..={} (1 or {n})",
                    b.types.len(),
                    b.first,
                    b.last
                )));
            }
            if b.first < self.start || b.last >= self.end() {
                return Err(ShareError::InvalidRecordState(format!(
                    "offsets {}..={} are not in flight (in flight: {}..{})",
                    b.first,
                    b.last,
                    self.start,
                    self.end()
                )));
            }
            for o in b.first..=b.last {
                let s = &self.slots[(o - self.start) as usize];
                let mine = s.state == RecordState::Acquired
                    && s.owner.as_deref() == Some(member)
                    && s.deadline_ms > now_ms;
                if !mine {
                    return Err(ShareError::InvalidRecordState(format!(
                        "offset {o} is not acquired by {member} ({})",
                        match s.state {
                            RecordState::Acquired if s.owner.as_deref() == Some(member) =>
                                "its lock expired".to_string(),
                            RecordState::Acquired => "another member holds it".to_string(),
                            st => format!("{st:?}"),
                        }
                    )));
                }
            }
        }
        let mut changed = false;
        for b in batches {
            for (k, o) in (b.first..=b.last).enumerate() {
                let t = if b.types.len() == 1 {
                    b.types[0]
                } else {
                    b.types[k]
                };
                let i = (o - self.start) as usize;
                changed |= self.ack_one(i, t, now_ms);
            }
        }
        self.advance();
        Ok(changed)
    }

    /// One acknowledgement of the acquired slot `i`; whether the durable
    /// state changed.
    fn ack_one(&mut self, i: usize, t: AckType, now_ms: i64) -> bool {
        let limit = self.config.delivery_limit;
        let lock_ms = self.config.lock_ms;
        let s = &mut self.slots[i];
        match t {
            AckType::Renew => {
                s.deadline_ms = now_ms.saturating_add(lock_ms);
                false
            }
            AckType::Accept => {
                *s = Slot {
                    state: RecordState::Acknowledged,
                    ..Slot::available(s.delivery_count)
                };
                self.acquired -= 1;
                true
            }
            AckType::Reject | AckType::Gap => {
                *s = Slot::archived(s.delivery_count);
                self.acquired -= 1;
                true
            }
            AckType::Release => {
                *s = released(s.delivery_count, limit);
                self.acquired -= 1;
                true
            }
        }
    }

    /// Releases every lock that expired at `now_ms`: the records are
    /// Available again (Archived at the delivery limit). Whether anything
    /// changed.
    pub fn expire(&mut self, now_ms: i64) -> bool {
        self.release_where(|s| s.deadline_ms <= now_ms)
    }

    /// Releases every record `member` holds (it left, or its session
    /// expired), as an expired lock would be. Whether anything changed.
    pub fn release_member(&mut self, member: &str) -> bool {
        self.release_where(|s| s.owner.as_deref() == Some(member))
    }

    fn release_where(&mut self, f: impl Fn(&Slot) -> bool) -> bool {
        if self.acquired == 0 {
            return false;
        }
        let limit = self.config.delivery_limit;
        let mut n = 0;
        for s in self.slots.iter_mut() {
            if s.state == RecordState::Acquired && f(s) {
                *s = released(s.delivery_count, limit);
                n += 1;
            }
        }
        self.acquired -= n;
        self.advance();
        n > 0
    }

    /// Moves the start offset to `start` (an operator's
    /// AlterShareGroupOffsets, or a start below the log's after
    /// retention): the window is emptied and the state epoch bumped.
    /// Locks held are dropped (their acknowledgements are then refused).
    pub fn reset(&mut self, start: u64) {
        self.start = start;
        self.slots.clear();
        self.acquired = 0;
        self.state_epoch = self.state_epoch.wrapping_add(1).max(0);
    }

    /// Drops the slots below `log_start` (retention or DeleteRecords took
    /// them): they can never be delivered.
    pub fn truncate_below(&mut self, log_start: u64) -> bool {
        if log_start <= self.start {
            return false;
        }
        let n = ((log_start - self.start) as usize).min(self.slots.len());
        for s in self.slots.drain(..n) {
            if s.state == RecordState::Acquired {
                self.acquired -= 1;
            }
        }
        self.start = log_start;
        true
    }

    /// Moves the start offset past the done slots at the front.
    fn advance(&mut self) {
        while self.slots.front().is_some_and(|s| s.state.terminal()) {
            self.slots.pop_front();
            self.start += 1;
        }
    }
}

/// A released record: Available again, Archived at the delivery limit.
fn released(delivery_count: u16, limit: u16) -> Slot {
    if delivery_count >= limit {
        Slot::archived(delivery_count)
    } else {
        Slot::available(delivery_count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: &str) -> Rc<str> {
        Rc::from(id)
    }

    fn batch(base: u64, last: u64) -> LogBatch {
        LogBatch {
            base,
            last,
            control: false,
        }
    }

    fn ack(first: u64, last: u64, t: AckType) -> AckBatch {
        AckBatch {
            first,
            last,
            types: vec![t],
        }
    }

    fn acq(first: u64, last: u64, delivery_count: u16) -> Acquired {
        Acquired {
            first,
            last,
            delivery_count,
        }
    }

    #[test]
    fn members_share_a_partition_and_accepted_records_are_done() {
        let mut p = SharePartition::new(0, ShareConfig::default());
        let log = [batch(0, 9), batch(10, 19), batch(20, 29)];
        let (a, b) = (m("a"), m("b"));
        // Whole batches: a asks for 5 and gets the first batch of 10.
        assert_eq!(p.acquire(&a, &log, 5, 0), [acq(0, 9, 1)]);
        assert_eq!(p.acquire(&b, &log, 15, 0), [acq(10, 29, 1)]);
        assert_eq!((p.start(), p.end(), p.acquired()), (0, 30, 30));
        // b accepts its records: the start stays (0..9 are a's, in flight).
        assert_eq!(
            p.acknowledge("b", &[ack(10, 29, AckType::Accept)], 1),
            Ok(true)
        );
        assert_eq!(p.start(), 0);
        assert_eq!(
            p.acknowledge("a", &[ack(0, 9, AckType::Accept)], 1),
            Ok(true)
        );
        assert_eq!((p.start(), p.end(), p.in_flight()), (30, 30, 0));
        // Nothing more to hand out until the log grows.
        assert!(p.acquire(&a, &log, 10, 2).is_empty());
    }

    #[test]
    fn record_limit_takes_part_of_a_batch_and_leaves_the_rest_for_another_member() {
        let mut p = SharePartition::new(0, ShareConfig::default());
        let control = LogBatch {
            base: 10,
            last: 10,
            control: true,
        };
        let log = [batch(0, 9), control, batch(11, 20)];
        let (a, b) = (m("a"), m("b"));
        let strict = AcquireMode::RecordLimit;
        // a asks for 4: the first 4 of the first batch, no more.
        assert_eq!(p.acquire_in(&a, &log, 4, strict, 0), [acq(0, 3, 1)]);
        assert_eq!((p.end(), p.acquired()), (4, 4));
        // b is sent the same batch and takes on from 4; the control batch
        // is archived without counting, and the next batch is cut at 8
        // records in all.
        assert_eq!(
            p.acquire_in(&b, &log, 8, strict, 0),
            [acq(4, 9, 1), acq(11, 12, 1)]
        );
        assert_eq!((p.end(), p.acquired()), (13, 12));
        // a releases 1..=2: they come first (Available in the window),
        // then the log from the end, 3 in all.
        assert_eq!(
            p.acknowledge("a", &[ack(1, 2, AckType::Release)], 1),
            Ok(true)
        );
        assert_eq!(
            p.acquire_in(&b, &log, 3, strict, 1),
            [acq(1, 2, 2), acq(13, 13, 1)]
        );
        // Batch-optimized from a batch taken in part: its rest, whole.
        assert_eq!(p.acquire(&a, &log, 1, 1), [acq(14, 20, 1)]);
        assert_eq!((p.end(), p.acquired()), (21, 20));
        for mode in [AcquireMode::BatchOptimized, AcquireMode::RecordLimit] {
            assert_eq!(AcquireMode::from_byte(mode.byte()), Some(mode));
            assert_eq!(AcquireMode::from_name(mode.name()), Some(mode));
        }
        assert_eq!(AcquireMode::from_byte(2), None);
    }

    #[test]
    fn released_and_expired_records_go_to_another_member_and_reach_the_limit() {
        let config = ShareConfig {
            lock_ms: 100,
            delivery_limit: 3,
            ..ShareConfig::default()
        };
        let mut p = SharePartition::new(0, config);
        let log = [batch(0, 4)];
        let (a, b) = (m("a"), m("b"));
        assert_eq!(p.acquire(&a, &log, 10, 0), [acq(0, 4, 1)]);
        // a releases 1..=2, accepts the rest.
        let per_offset = AckBatch {
            first: 0,
            last: 4,
            types: vec![
                AckType::Accept,
                AckType::Release,
                AckType::Release,
                AckType::Accept,
                AckType::Accept,
            ],
        };
        assert_eq!(p.acknowledge("a", &[per_offset], 10), Ok(true));
        assert_eq!(p.start(), 1);
        // b gets them, second delivery; its lock expires.
        assert_eq!(p.acquire(&b, &log, 10, 20), [acq(1, 2, 2)]);
        assert!(!p.expire(119));
        assert!(p.expire(120));
        // b's late acknowledgement is refused, nothing changed.
        let e = p.acknowledge("b", &[ack(1, 2, AckType::Accept)], 121);
        assert!(matches!(e, Err(ShareError::InvalidRecordState(_))), "{e:?}");
        // Third delivery is the last: released again, they are archived.
        assert_eq!(p.acquire(&a, &log, 10, 130), [acq(1, 2, 3)]);
        assert_eq!(
            p.acknowledge("a", &[ack(1, 2, AckType::Release)], 131),
            Ok(true)
        );
        assert_eq!(p.state_of(1), None, "archived, and the start moved past");
        assert_eq!((p.start(), p.in_flight()), (5, 0));
    }

    #[test]
    fn only_the_holder_acknowledges_and_a_refused_request_changes_nothing() {
        let mut p = SharePartition::new(100, ShareConfig::default());
        let (a, b) = (m("a"), m("b"));
        p.acquire(&a, &[batch(100, 104)], 10, 0);
        p.acquire(&b, &[batch(105, 109)], 10, 0);
        let before = p.snapshot();
        for (who, acks) in [
            // Another member's records.
            ("a", vec![ack(105, 105, AckType::Accept)]),
            // One good batch, one bad: all refused.
            (
                "a",
                vec![
                    ack(100, 101, AckType::Accept),
                    ack(107, 107, AckType::Accept),
                ],
            ),
            // Never acquired, below and above the window.
            ("a", vec![ack(99, 100, AckType::Accept)]),
            ("a", vec![ack(110, 110, AckType::Accept)]),
            ("nobody", vec![ack(100, 100, AckType::Reject)]),
        ] {
            let e = p.acknowledge(who, &acks, 1);
            assert!(
                matches!(e, Err(ShareError::InvalidRecordState(_))),
                "{acks:?}: {e:?}"
            );
        }
        for acks in [
            vec![ack(101, 100, AckType::Accept)],
            vec![
                ack(100, 101, AckType::Accept),
                ack(101, 102, AckType::Accept),
            ],
            vec![AckBatch {
                first: 100,
                last: 102,
                types: vec![AckType::Accept, AckType::Accept],
            }],
            vec![AckBatch {
                first: 100,
                last: 100,
                types: vec![],
            }],
        ] {
            let e = p.acknowledge("a", &acks, 1);
            assert!(
                matches!(e, Err(ShareError::InvalidRequest(_))),
                "{acks:?}: {e:?}"
            );
        }
        let many = vec![ack(100, 100, AckType::Accept); ACK_BATCHES_MAX + 1];
        assert!(matches!(
            p.acknowledge("a", &many, 1),
            Err(ShareError::InvalidRequest(_))
        ));
        assert_eq!(p.snapshot(), before);
        assert_eq!(p.acquired(), 10);
    }

    #[test]
    fn renew_extends_the_lock_and_reject_archives() {
        let config = ShareConfig {
            lock_ms: 100,
            ..ShareConfig::default()
        };
        let mut p = SharePartition::new(0, config);
        let a = m("a");
        p.acquire(&a, &[batch(0, 1)], 10, 0);
        assert_eq!(
            p.acknowledge("a", &[ack(0, 1, AckType::Renew)], 90),
            Ok(false)
        );
        assert!(!p.expire(150), "renewed at 90: held until 190");
        assert_eq!(
            p.acknowledge("a", &[ack(0, 0, AckType::Reject)], 180),
            Ok(true)
        );
        assert_eq!(p.state_of(0), None);
        assert!(p.expire(190));
        assert_eq!(p.state_of(1), Some((RecordState::Available, 1)));
        // Rejected is never delivered again.
        assert_eq!(p.acquire(&a, &[batch(0, 1)], 10, 200), [acq(1, 1, 2)]);
    }

    #[test]
    fn only_records_whose_batch_is_sent_are_acquired_again() {
        let mut p = SharePartition::new(0, ShareConfig::default());
        let (a, b) = (m("a"), m("b"));
        p.acquire(&a, &[batch(0, 9), batch(10, 19)], 100, 0);
        assert!(p.release_member("a"));
        // b is sent only the first batch (a fetch's byte budget): only its
        // records are acquired; the others stay Available.
        assert_eq!(p.acquire(&b, &[batch(0, 9)], 100, 1), [acq(0, 9, 2)]);
        assert_eq!(p.state_of(10), Some((RecordState::Available, 1)));
        assert!(p.acquire(&b, &[], 100, 2).is_empty());
        assert_eq!(p.acquire(&b, &[batch(10, 19)], 100, 3), [acq(10, 19, 2)]);
    }

    #[test]
    fn control_batches_and_gaps_are_never_delivered() {
        let mut p = SharePartition::new(0, ShareConfig::default());
        let a = m("a");
        let log = [
            batch(0, 2),
            LogBatch {
                base: 3,
                last: 3,
                control: true,
            },
            // 4..=6 compacted away.
            batch(7, 8),
        ];
        assert_eq!(p.acquire(&a, &log, 100, 0), [acq(0, 2, 1), acq(7, 8, 1)]);
        assert_eq!(p.state_of(3), Some((RecordState::Archived, 0)));
        assert_eq!(p.state_of(5), Some((RecordState::Archived, 0)));
        assert_eq!(p.end(), 9);
        p.acknowledge("a", &[ack(0, 2, AckType::Accept)], 1)
            .unwrap();
        assert_eq!(p.start(), 7, "the archived offsets are passed too");
    }

    #[test]
    fn the_window_bounds_what_is_in_flight() {
        let config = ShareConfig {
            max_in_flight: 100,
            ..ShareConfig::default()
        };
        let mut p = SharePartition::new(0, config);
        let a = m("a");
        let log: Vec<LogBatch> = (0..30).map(|i| batch(i * 10, i * 10 + 9)).collect();
        let got = p.acquire(&a, &log, 10_000, 0);
        assert_eq!(got, [acq(0, 99, 1)]);
        assert!(!p.has_room());
        assert!(p.acquire(&a, &log, 10, 1).is_empty());
        // Offset 0 stuck: accepting the rest does not make room.
        p.acknowledge("a", &[ack(1, 99, AckType::Accept)], 2)
            .unwrap();
        assert!(p.acquire(&a, &log, 10, 3).is_empty());
        p.acknowledge("a", &[ack(0, 0, AckType::Accept)], 4)
            .unwrap();
        assert_eq!(p.acquire(&a, &log, 10, 5), [acq(100, 109, 1)]);
    }

    #[test]
    fn a_restored_partition_delivers_again_only_what_was_not_acknowledged() {
        let mut p = SharePartition::new(0, ShareConfig::default());
        let (a, b) = (m("a"), m("b"));
        p.acquire(&a, &[batch(0, 9)], 10, 0);
        p.acquire(&b, &[batch(10, 19)], 10, 0);
        p.acknowledge("a", &[ack(0, 4, AckType::Accept)], 1)
            .unwrap();
        p.acknowledge(
            "b",
            &[ack(12, 12, AckType::Reject), ack(15, 19, AckType::Accept)],
            1,
        )
        .unwrap();
        let snap = p.snapshot();
        let back = crate::records::decode_value(&crate::records::encode_value(&snap)).unwrap();
        assert_eq!(back, snap);
        let mut q = SharePartition::restore(&back, ShareConfig::default()).unwrap();
        assert_eq!((q.start(), q.end(), q.acquired()), (5, 20, 0));
        let c = m("c");
        // Acquired and not acknowledged: 5..=9 and 10..=11, 13..=14, a
        // second delivery each; nothing else.
        assert_eq!(
            q.acquire(&c, &[batch(0, 9), batch(10, 19)], 100, 2),
            [acq(5, 11, 2), acq(13, 14, 2)]
        );
        assert!(SharePartition::restore(
            &ShareSnapshot {
                state_epoch: 0,
                start: 10,
                end: 5,
                runs: vec![]
            },
            ShareConfig::default()
        )
        .is_err());
    }

    #[test]
    fn a_member_that_leaves_releases_what_it_holds_and_a_reset_empties_the_window() {
        let mut p = SharePartition::new(0, ShareConfig::default());
        let (a, b) = (m("a"), m("b"));
        p.acquire(&a, &[batch(0, 4)], 10, 0);
        p.acquire(&b, &[batch(5, 9)], 10, 0);
        assert!(p.release_member("a"));
        assert!(!p.release_member("a"));
        assert_eq!(p.acquired(), 5);
        assert_eq!(p.acquire(&b, &[batch(0, 4)], 10, 1), [acq(0, 4, 2)]);
        p.reset(50);
        assert_eq!(
            (p.start(), p.end(), p.acquired(), p.state_epoch()),
            (50, 50, 0, 1)
        );
        assert!(matches!(
            p.acknowledge("b", &[ack(0, 4, AckType::Accept)], 2),
            Err(ShareError::InvalidRecordState(_))
        ));
        assert!(p.truncate_below(60));
        assert_eq!(p.start(), 60);
    }
}
