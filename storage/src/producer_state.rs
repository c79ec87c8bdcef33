//! Idempotent-producer state of one partition: which batches each producer
//! last appended, to reject sequence gaps and fenced epochs and to answer a
//! retried batch with its original offsets instead of appending it twice
//! (Kafka's idempotent producer, without transactions).
//!
//! ## Rules (checked by [`ProducerStateTable::check`])
//! A batch with `producer_id >= 0` carries `producer_epoch` and
//! `base_sequence`; its last sequence is `base_sequence + last_offset_delta`,
//! wrapping from `i32::MAX` to 0. For a producer id:
//! * unknown: accepted if `base_sequence == 0`, else
//!   [`StorageError::UnknownProducerId`];
//! * epoch lower than the one recorded: [`StorageError::InvalidProducerEpoch`]
//!   (a newer instance of the producer fenced it);
//! * epoch higher: accepted if `base_sequence == 0` (a new epoch restarts
//!   the sequences), else [`StorageError::OutOfOrderSequence`];
//! * same epoch and the same `(first, last)` sequences as one of the
//!   [`PRODUCER_BATCHES_RETAINED`] batches remembered: a **duplicate**, not
//!   appended again ([`Verdict::Duplicate`] carries the original offsets);
//! * same epoch and `base_sequence` = last sequence + 1: accepted;
//! * anything else: [`StorageError::OutOfOrderSequence`].
//!
//! Batches with `producer_id < 0` are neither checked nor recorded.
//!
//! ## Transactions
//! A transactional batch (the attribute bit) of a producer with no open
//! transaction opens one at its base offset; a control batch (a commit or
//! abort marker, [`crate::txn`]) of that producer closes it. The
//! partition's *last stable offset* is the first offset of the oldest open
//! transaction ([`ProducerStateTable::first_unstable_offset`]; the log
//! caps it at the high watermark). A marker is not a batch of the
//! producer's sequence: it is not remembered for duplicates, but a marker
//! of a newer epoch (KIP-890 bumps the epoch at every transaction's end)
//! makes that epoch the producer's, its sequence starting again at 0.
//! A producer with an open transaction is never evicted.
//!
//! ## Invariants
//! * Every entry remembers 0..=[`PRODUCER_BATCHES_RETAINED`] batches, all of
//!   its current epoch, in offset order (none only after a marker of a new
//!   epoch); its age is the last offset of its last batch or marker.
//! * The state covers exactly the batches below some log offset: the log
//!   calls [`ProducerStateTable::check`] and [`ProducerStateTable::record`]
//!   under its append lock, atomically with offset assignment, and
//!   [`ProducerStateTable::truncate`] when the log is cut.
//! * At most `max_producers` ([`PRODUCERS_PER_PARTITION_MAX`]) entries: a
//!   new producer beyond that evicts the one whose last append is oldest
//!   (lowest last offset). An evicted producer that comes back is unknown:
//!   its next batch is refused with `UnknownProducerId` unless it starts a
//!   sequence at 0.
//! * Retention does not remove entries; truncation drops the batches at or
//!   after the new log end (and entries left with none). A producer whose
//!   remembered batches were all truncated is therefore unknown afterwards,
//!   even if older batches of it remain in the log.
//!
//! ## Snapshot file (`producer.snapshot`)
//! The table as of a log offset, written atomically (temporary file, fsync,
//! rename, directory fsync) and CRC-protected; see
//! `docs/storage-format.md`. It is written only once every batch below its
//! offset is fdatasync'd, so after a crash it never describes batches the
//! log no longer has. Fault model: a missing, torn or corrupt snapshot is
//! ignored (the table is rebuilt from the batches in the log); a snapshot
//! above the recovered log end is ignored and removed.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;

use weir_proto::batch::BatchHeader;

use crate::checkpoint;
use crate::error::{Result, StorageError};

/// Most producers remembered per partition; beyond it the one with the
/// oldest last append is evicted.
pub const PRODUCERS_PER_PARTITION_MAX: usize = 100_000;
/// Batches remembered per producer for duplicate detection: Kafka
/// remembers 5 (its clients' in-flight requests per connection); the Weir
/// SDK sends several batches of a partition per request and keeps up to
/// this many in flight (`LANE_BATCHES_IN_FLIGHT_IDEMPOTENT`).
pub const PRODUCER_BATCHES_RETAINED: usize = 16;
/// A snapshot of the table is taken after this many appended bytes (and at
/// every segment roll).
pub const PRODUCER_SNAPSHOT_INTERVAL_BYTES: u64 = 64 << 20;
/// File name of the snapshot in the partition directory.
pub const PRODUCER_SNAPSHOT_FILE: &str = "producer.snapshot";

const SNAPSHOT_MAGIC: &[u8; 8] = b"WEIRPSNP";
/// Version 2 adds each entry's age and open transaction; version 1 (no
/// transactions) is still read.
const SNAPSHOT_VERSION: u32 = 2;
/// Bytes before the first entry: magic, version, offset, producer count,
/// flags (version 2: bit 0, a transaction was seen).
const SNAPSHOT_HEADER_BYTES: usize = 28;
/// Bytes of an entry before its batches: id, epoch, last timestamp, age,
/// open transaction's first offset (-1: none), count.
const SNAPSHOT_ENTRY_BYTES: usize = 35;
/// Bytes of one remembered batch.
const SNAPSHOT_BATCH_BYTES: usize = 24;
/// Largest snapshot: every producer with every batch remembered.
pub const PRODUCER_SNAPSHOT_BYTES_MAX: usize = SNAPSHOT_HEADER_BYTES
    + PRODUCERS_PER_PARTITION_MAX
        * (SNAPSHOT_ENTRY_BYTES + PRODUCER_BATCHES_RETAINED * SNAPSHOT_BATCH_BYTES)
    + 4;

const _: () =
    assert!(PRODUCER_BATCHES_RETAINED >= 1 && PRODUCER_BATCHES_RETAINED <= u8::MAX as usize);
const _: () = assert!(PRODUCERS_PER_PARTITION_MAX <= u32::MAX as usize);
const _: () = assert!(PRODUCER_SNAPSHOT_BYTES_MAX < 64 << 20);

/// Sequence numbers run from 0 to `i32::MAX`, then wrap to 0.
const SEQUENCE_MODULUS: i64 = i32::MAX as i64 + 1;

/// `seq + n` in sequence space (wrapping from `i32::MAX` to 0).
pub fn sequence_add(seq: i32, n: i32) -> i32 {
    (seq as i64 + n as i64).rem_euclid(SEQUENCE_MODULUS) as i32
}

/// The last sequence number of a batch.
pub fn last_sequence(h: &BatchHeader) -> i32 {
    sequence_add(h.base_sequence, h.last_offset_delta)
}

/// One batch remembered for a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMetadata {
    /// Sequence of its first record.
    pub first_seq: i32,
    /// Sequence of its last record.
    pub last_seq: i32,
    /// Offset of its first record.
    pub base_offset: u64,
    /// Offset of its last record.
    pub last_offset: u64,
}

/// One producer as a partition's leader describes it (Kafka's
/// DescribeProducers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveProducer {
    /// Its id.
    pub producer_id: i64,
    /// Its current epoch.
    pub epoch: i16,
    /// Sequence of its last record (-1: none remembered).
    pub last_sequence: i32,
    /// Largest timestamp of its last batch (ms).
    pub last_timestamp: i64,
    /// First offset of its open transaction, if one is open.
    pub txn_first_offset: Option<u64>,
}

/// What the table knows about one producer id. Equal entries hold the
/// same state a snapshot or a rebuild restores (`markers`, a count of
/// this process's, is left out).
#[derive(Debug, Clone)]
pub struct ProducerEntry {
    /// The producer's current epoch.
    pub epoch: i16,
    /// Largest timestamp of its last batch (ms).
    pub last_timestamp: i64,
    /// Its last batches (0..=[`PRODUCER_BATCHES_RETAINED`]), oldest first.
    batches: VecDeque<BatchMetadata>,
    /// Last offset of its last batch or marker (the eviction order).
    age: u64,
    /// First offset of its open transaction, if one is open.
    pub txn_first_offset: Option<u64>,
    /// Markers recorded for it since the table was built (not stored):
    /// a write verified against its coordinator checks that none came
    /// between the verification and the append ([`TxnGuard`]).
    pub markers: u64,
}

/// What a transactional write saw of its producer on the partition before
/// it was verified with the coordinator: a marker after it (the
/// transaction ended meanwhile) makes a write that would open a
/// transaction a late one, refused — else it would open a transaction
/// that nothing ends (KIP-890's hanging transaction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnGuard {
    /// The producer.
    pub producer_id: i64,
    /// Its markers then.
    pub markers: u64,
}

impl PartialEq for ProducerEntry {
    fn eq(&self, other: &Self) -> bool {
        self.epoch == other.epoch
            && self.last_timestamp == other.last_timestamp
            && self.batches == other.batches
            && self.age == other.age
            && self.txn_first_offset == other.txn_first_offset
    }
}

impl Eq for ProducerEntry {}

impl ProducerEntry {
    /// Its remembered batches, oldest first.
    pub fn batches(&self) -> impl Iterator<Item = &BatchMetadata> {
        self.batches.iter()
    }

    /// Its last batch (`None` after a marker of a new epoch).
    pub fn last_batch(&self) -> Option<&BatchMetadata> {
        self.batches.back()
    }
}

/// What [`ProducerStateTable::check`] decided for an acceptable batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Append it (then [`ProducerStateTable::record`] it).
    Append,
    /// A retry of this batch, already in the log: do not append it.
    Duplicate(BatchMetadata),
}

/// The producer state of one partition (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerStateTable {
    producers: HashMap<i64, ProducerEntry>,
    /// Producers by their age (unique: batches do not overlap), oldest
    /// first: the eviction order.
    by_age: BTreeMap<u64, i64>,
    /// Open transactions by first offset (unique, as ages are).
    open: BTreeMap<u64, i64>,
    /// A transactional batch or a marker was ever recorded.
    transactional: bool,
    max_producers: usize,
}

impl Default for ProducerStateTable {
    fn default() -> Self {
        Self::new()
    }
}

impl ProducerStateTable {
    /// An empty table holding at most [`PRODUCERS_PER_PARTITION_MAX`] producers.
    pub fn new() -> Self {
        Self::with_max_producers(PRODUCERS_PER_PARTITION_MAX)
    }

    /// An empty table holding at most `max` producers (at least 1).
    pub fn with_max_producers(max: usize) -> Self {
        ProducerStateTable {
            producers: HashMap::new(),
            by_age: BTreeMap::new(),
            open: BTreeMap::new(),
            transactional: false,
            max_producers: max.max(1),
        }
    }

    /// First offset of the oldest open transaction (`None`: none open):
    /// the last stable offset, below the high watermark.
    pub fn first_unstable_offset(&self) -> Option<u64> {
        self.open.keys().next().copied()
    }

    /// The open transactions: `(producer id, first offset)`, oldest first.
    pub fn open_transactions(&self) -> impl Iterator<Item = (i64, u64)> + '_ {
        self.open.iter().map(|(&first, &pid)| (pid, first))
    }

    /// Producers remembered.
    pub fn len(&self) -> usize {
        self.producers.len()
    }

    /// Whether no producer is remembered.
    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// The guard of a transactional write of `producer_id` about to be
    /// verified ([`TxnGuard`]).
    pub fn txn_guard(&self, producer_id: i64) -> TxnGuard {
        TxnGuard {
            producer_id,
            markers: self.producers.get(&producer_id).map_or(0, |e| e.markers),
        }
    }

    /// Whether a transactional batch written under `guard` may be
    /// appended: it continues the producer's open transaction, or no
    /// marker of the producer came since the guard was taken.
    pub fn guard_holds(&self, guard: &TxnGuard) -> bool {
        match self.producers.get(&guard.producer_id) {
            Some(e) => e.txn_first_offset.is_some() || e.markers == guard.markers,
            None => guard.markers == 0,
        }
    }

    /// Every producer remembered, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (i64, &ProducerEntry)> {
        self.producers.iter().map(|(&pid, e)| (pid, e))
    }

    /// The entry of a producer id.
    pub fn get(&self, producer_id: i64) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    /// Checks a batch against the rules of the module docs, without changing
    /// anything. `partition` names the log in errors.
    pub fn check(&self, partition: &str, h: &BatchHeader) -> Result<Verdict> {
        let pid = h.producer_id;
        if pid < 0 {
            return Ok(Verdict::Append);
        }
        let first = h.base_sequence;
        let Some(e) = self.producers.get(&pid) else {
            return if first == 0 {
                Ok(Verdict::Append)
            } else {
                Err(StorageError::UnknownProducerId {
                    partition: partition.to_string(),
                    producer_id: pid,
                })
            };
        };
        let out_of_order = |expected: i32| StorageError::OutOfOrderSequence {
            partition: partition.to_string(),
            producer_id: pid,
            expected,
            got: first,
        };
        if h.producer_epoch < e.epoch {
            return Err(StorageError::InvalidProducerEpoch {
                partition: partition.to_string(),
                producer_id: pid,
                epoch: h.producer_epoch,
                current: e.epoch,
            });
        }
        if h.producer_epoch > e.epoch {
            return if first == 0 {
                Ok(Verdict::Append)
            } else {
                Err(out_of_order(0))
            };
        }
        if first >= 0 {
            let last = last_sequence(h);
            if let Some(b) = e
                .batches
                .iter()
                .find(|b| b.first_seq == first && b.last_seq == last)
            {
                return Ok(Verdict::Duplicate(*b));
            }
        }
        let expected = e.last_batch().map_or(0, |b| sequence_add(b.last_seq, 1));
        if first == expected {
            Ok(Verdict::Append)
        } else {
            Err(out_of_order(expected))
        }
    }

    /// Records an appended batch (`h.base_offset` is its assigned offset)
    /// without checking it: after [`ProducerStateTable::check`] accepted it,
    /// or when rebuilding the table from the log. A batch of another epoch
    /// than the entry's starts the entry afresh.
    ///
    /// A transactional batch opens its producer's transaction if none is
    /// open; a control batch (`h` of a marker: see [`crate::txn`]) is
    /// recorded with [`ProducerStateTable::record_marker`] instead.
    pub fn record(&mut self, h: &BatchHeader) {
        let pid = h.producer_id;
        if pid < 0 {
            return;
        }
        let b = BatchMetadata {
            first_seq: h.base_sequence,
            last_seq: last_sequence(h),
            base_offset: h.base_offset as u64,
            last_offset: h.last_offset() as u64,
        };
        let mut e = self.take(pid).unwrap_or(ProducerEntry {
            epoch: h.producer_epoch,
            last_timestamp: h.max_timestamp,
            batches: VecDeque::new(),
            age: 0,
            txn_first_offset: None,
            markers: 0,
        });
        if e.epoch != h.producer_epoch {
            e.epoch = h.producer_epoch;
            e.batches.clear();
        }
        e.last_timestamp = h.max_timestamp;
        e.batches.push_back(b);
        while e.batches.len() > PRODUCER_BATCHES_RETAINED {
            e.batches.pop_front();
        }
        e.age = b.last_offset;
        if h.attributes.is_transactional() {
            self.transactional = true;
            e.txn_first_offset.get_or_insert(b.base_offset);
        }
        self.insert(pid, e);
    }

    /// Records a batch read back from the log (`bytes`, its header `h`):
    /// a data batch with [`ProducerStateTable::record`], a transaction
    /// marker with [`ProducerStateTable::record_marker`] (Kafka's other
    /// control records carry no transaction and change nothing). How a
    /// snapshot at a segment's end is built from the one at its start.
    pub fn record_read(&mut self, h: &BatchHeader, bytes: &[u8]) {
        if !h.attributes.is_control() {
            self.record(h);
        } else if crate::txn::marker_of(bytes).is_ok() {
            self.record_marker(h.producer_id, h.producer_epoch, h.base_offset as u64);
        }
    }

    /// Records a transaction marker of producer `pid` at `offset`: its open
    /// transaction (if any) ends; returns that transaction's first offset.
    /// A marker of a newer epoch makes it the producer's (its sequence
    /// starts again at 0).
    pub fn record_marker(&mut self, pid: i64, epoch: i16, offset: u64) -> Option<u64> {
        if pid < 0 {
            return None;
        }
        self.transactional = true;
        let mut e = self.take(pid).unwrap_or(ProducerEntry {
            epoch,
            last_timestamp: -1,
            batches: VecDeque::new(),
            age: 0,
            txn_first_offset: None,
            markers: 0,
        });
        if epoch > e.epoch {
            e.epoch = epoch;
            e.batches.clear();
        }
        e.age = offset;
        e.markers += 1;
        let first = e.txn_first_offset.take();
        self.insert(pid, e);
        first
    }

    /// Removes an entry from every index; the caller inserts it again.
    fn take(&mut self, pid: i64) -> Option<ProducerEntry> {
        let e = self.producers.remove(&pid)?;
        self.by_age.remove(&e.age);
        if let Some(first) = e.txn_first_offset {
            self.open.remove(&first);
        }
        Some(e)
    }

    /// Inserts an entry (not present), evicting the oldest producers
    /// without an open transaction beyond the limit.
    fn insert(&mut self, pid: i64, entry: ProducerEntry) {
        if let Some(other) = self.by_age.insert(entry.age, pid) {
            // Batches of a log never overlap; should a log hold overlapping
            // producer batches nonetheless, the newer producer wins.
            if let Some(o) = self.producers.remove(&other) {
                if let Some(first) = o.txn_first_offset {
                    self.open.remove(&first);
                }
            }
        }
        if let Some(first) = entry.txn_first_offset {
            if let Some(other) = self.open.insert(first, pid) {
                if other != pid {
                    if let Some(mut o) = self.producers.remove(&other) {
                        self.by_age.remove(&o.age);
                        o.txn_first_offset = None;
                        self.by_age.insert(o.age, other);
                        self.producers.insert(other, o);
                    }
                }
            }
        }
        self.producers.insert(pid, entry);
        while self.producers.len() > self.max_producers {
            let Some((age, oldest)) = self
                .by_age
                .iter()
                .map(|(&a, &p)| (a, p))
                .find(|(_, p)| self.producers[p].txn_first_offset.is_none())
            else {
                // Every producer has a transaction open: none is dropped.
                break;
            };
            self.by_age.remove(&age);
            self.producers.remove(&oldest);
        }
    }

    /// Forgets every batch at or after `log_end` (the log was cut there);
    /// producers left with no batch are removed.
    ///
    /// Transactions whose markers were cut are not reopened: a log that
    /// holds transactions rebuilds its table from a snapshot below the cut
    /// instead (see the log's truncation).
    pub fn truncate(&mut self, log_end: u64) {
        let doomed: Vec<i64> = self.by_age.range(log_end..).map(|(_, &p)| p).collect();
        for pid in doomed {
            let mut e = self.take(pid).expect("indexed producer");
            while e.batches.back().is_some_and(|b| b.last_offset >= log_end) {
                e.batches.pop_back();
            }
            if e.txn_first_offset.is_some_and(|f| f >= log_end) {
                e.txn_first_offset = None;
            }
            if let Some(b) = e.batches.back() {
                e.age = b.last_offset;
                self.insert(pid, e);
            } else if let Some(first) = e.txn_first_offset {
                e.age = first;
                self.insert(pid, e);
            }
        }
    }

    /// Whether a transactional batch or a marker was ever recorded here
    /// (kept in the snapshot): cutting the log may then reopen a
    /// transaction, which [`ProducerStateTable::truncate`] cannot do.
    pub fn transactional(&self) -> bool {
        self.transactional
    }

    /// The snapshot file's bytes for this table as of `snapshot_offset`
    /// (every batch recorded is below it).
    pub fn encode(&self, snapshot_offset: u64) -> Vec<u8> {
        let n: usize = self.producers.values().map(|e| e.batches.len()).sum();
        let mut out = Vec::with_capacity(
            SNAPSHOT_HEADER_BYTES
                + self.producers.len() * SNAPSHOT_ENTRY_BYTES
                + n * SNAPSHOT_BATCH_BYTES
                + 4,
        );
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_be_bytes());
        out.extend_from_slice(&snapshot_offset.to_be_bytes());
        out.extend_from_slice(&(self.producers.len() as u32).to_be_bytes());
        out.extend_from_slice(&u32::from(self.transactional).to_be_bytes());
        // Oldest first, so that decoding re-creates the eviction order.
        for pid in self.by_age.values() {
            let e = &self.producers[pid];
            out.extend_from_slice(&pid.to_be_bytes());
            out.extend_from_slice(&e.epoch.to_be_bytes());
            out.extend_from_slice(&e.last_timestamp.to_be_bytes());
            out.extend_from_slice(&e.age.to_be_bytes());
            let txn = e.txn_first_offset.map_or(-1, |f| f as i64);
            out.extend_from_slice(&txn.to_be_bytes());
            out.push(e.batches.len() as u8);
            for b in &e.batches {
                out.extend_from_slice(&b.first_seq.to_be_bytes());
                out.extend_from_slice(&b.last_seq.to_be_bytes());
                out.extend_from_slice(&b.base_offset.to_be_bytes());
                out.extend_from_slice(&b.last_offset.to_be_bytes());
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    /// Parses snapshot bytes into `(snapshot_offset, table)`, checking the
    /// CRC and that every field is plausible; `Err` says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<(u64, ProducerStateTable), String> {
        // A version 1 header is 4 bytes shorter (no flags).
        if bytes.len() < SNAPSHOT_HEADER_BYTES || bytes.len() > PRODUCER_SNAPSHOT_BYTES_MAX {
            return Err(format!("size {} is not a snapshot's", bytes.len()));
        }
        if &bytes[..8] != SNAPSHOT_MAGIC {
            return Err("bad magic".to_string());
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().expect("4 bytes")) {
            return Err("checksum mismatch".to_string());
        }
        let mut r = Reader { buf: body, at: 8 };
        let version = r.u32()?;
        if version != 1 && version != SNAPSHOT_VERSION {
            return Err(format!("unsupported version {version}"));
        }
        let offset = r.u64()?;
        let count = r.u32()? as usize;
        if count > PRODUCERS_PER_PARTITION_MAX {
            return Err(format!("{count} producers exceed the limit"));
        }
        let mut table = ProducerStateTable::new();
        if version >= 2 {
            table.transactional = match r.u32()? {
                0 => false,
                1 => true,
                f => return Err(format!("unknown flags {f:#x}")),
            };
        }
        for _ in 0..count {
            let pid = r.u64()? as i64;
            let epoch = r.u16()? as i16;
            let last_timestamp = r.u64()? as i64;
            let (age, txn) = if version >= 2 {
                (Some(r.u64()?), r.u64()? as i64)
            } else {
                (None, -1)
            };
            let n = r.u8()? as usize;
            if pid < 0 || (n == 0 && age.is_none()) || n > PRODUCER_BATCHES_RETAINED {
                return Err(format!("bad entry for producer {pid} ({n} batches)"));
            }
            let txn_first_offset = match txn {
                -1 => None,
                f if f >= 0 && (f as u64) < offset => Some(f as u64),
                f => return Err(format!("bad open transaction {f} for producer {pid}")),
            };
            let mut batches = VecDeque::with_capacity(n);
            let mut min_base = 0u64;
            for _ in 0..n {
                let b = BatchMetadata {
                    first_seq: r.u32()? as i32,
                    last_seq: r.u32()? as i32,
                    base_offset: r.u64()?,
                    last_offset: r.u64()?,
                };
                if b.base_offset < min_base
                    || b.last_offset < b.base_offset
                    || b.last_offset >= offset
                {
                    return Err(format!("bad batch offsets for producer {pid}"));
                }
                min_base = b.last_offset + 1;
                batches.push_back(b);
            }
            let age = match (age, batches.back()) {
                (Some(a), _) if a < offset && a >= min_base.saturating_sub(1) => a,
                (Some(a), _) => return Err(format!("bad age {a} for producer {pid}")),
                (None, b) => b.expect("n >= 1").last_offset,
            };
            let opened_twice = txn_first_offset.is_some_and(|f| table.open.contains_key(&f));
            if table.producers.contains_key(&pid) || table.by_age.contains_key(&age) || opened_twice
            {
                return Err(format!("producer {pid} or its last offset appears twice"));
            }
            table.insert(
                pid,
                ProducerEntry {
                    epoch,
                    last_timestamp,
                    batches,
                    age,
                    txn_first_offset,
                    markers: 0,
                },
            );
        }
        if r.at != body.len() {
            return Err(format!("{} bytes after the last entry", body.len() - r.at));
        }
        Ok((offset, table))
    }

    /// Writes `dir/producer.snapshot` atomically and durably (blocking).
    pub fn store(&self, dir: &Path, snapshot_offset: u64) -> Result<()> {
        checkpoint::write_atomic(dir, PRODUCER_SNAPSHOT_FILE, &self.encode(snapshot_offset))
    }

    /// Reads `dir/producer.snapshot` (blocking): `Ok(None)` if there is
    /// none, `Err(Corrupt)` if it cannot be used.
    pub fn load(dir: &Path) -> Result<Option<(u64, ProducerStateTable)>> {
        let path = dir.join(PRODUCER_SNAPSHOT_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StorageError::io("read", &path, e)),
        };
        ProducerStateTable::decode(&bytes)
            .map(Some)
            .map_err(|reason| StorageError::Corrupt { path, reason })
    }

    /// Removes `dir/producer.snapshot` durably, if present (blocking).
    pub fn remove_snapshot(dir: &Path) -> Result<()> {
        let path = dir.join(PRODUCER_SNAPSHOT_FILE);
        if checkpoint::remove_file(&path)? {
            checkpoint::sync_dir(dir)?;
        }
        Ok(())
    }
}

/// Big-endian reads with bounds checks.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let end = self.at + N;
        let b = self
            .buf
            .get(self.at..end)
            .ok_or_else(|| format!("truncated at byte {}", self.at))?;
        self.at = end;
        Ok(b.try_into().expect("N bytes"))
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        self.take().map(u16::from_be_bytes)
    }
    fn u32(&mut self) -> Result<u32, String> {
        self.take().map(u32::from_be_bytes)
    }
    fn u64(&mut self) -> Result<u64, String> {
        self.take().map(u64::from_be_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "t-0";

    /// A header of a batch of `records` records from producer `pid`.
    fn h(pid: i64, epoch: i16, seq: i32, records: i32, base_offset: u64) -> BatchHeader {
        BatchHeader {
            base_offset: base_offset as i64,
            batch_length: 49,
            partition_leader_epoch: 0,
            magic: 2,
            crc: 0,
            attributes: weir_proto::batch::Attributes(0),
            last_offset_delta: records - 1,
            base_timestamp: 1,
            max_timestamp: base_offset as i64,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            records_count: records,
        }
    }

    /// Checks and records like the log does; returns the verdict.
    fn append(t: &mut ProducerStateTable, b: BatchHeader) -> Result<Verdict> {
        let v = t.check(P, &b)?;
        if v == Verdict::Append {
            t.record(&b);
        }
        Ok(v)
    }

    /// A transactional batch.
    fn tx(pid: i64, epoch: i16, seq: i32, records: i32, base_offset: u64) -> BatchHeader {
        let mut b = h(pid, epoch, seq, records, base_offset);
        b.attributes = weir_proto::batch::Attributes(weir_proto::batch::Attributes::TRANSACTIONAL);
        b
    }

    #[test]
    fn transactions_open_at_their_first_batch_and_close_at_their_marker() {
        let mut t = ProducerStateTable::new();
        append(&mut t, h(1, 0, 0, 2, 0)).unwrap();
        assert_eq!(t.first_unstable_offset(), None);
        append(&mut t, tx(7, 0, 0, 3, 2)).unwrap();
        append(&mut t, tx(8, 0, 0, 1, 5)).unwrap();
        append(&mut t, tx(7, 0, 3, 1, 6)).unwrap();
        assert_eq!(t.first_unstable_offset(), Some(2));
        assert_eq!(t.open_transactions().collect::<Vec<_>>(), [(7, 2), (8, 5)]);
        // Producer 7's marker (a new epoch, as KIP-890 bumps it): closed,
        // and its sequence starts again at 0 in that epoch.
        assert_eq!(t.record_marker(7, 1, 7), Some(2));
        assert_eq!(t.first_unstable_offset(), Some(5));
        assert!(t.get(7).unwrap().last_batch().is_none());
        let e = t.check(P, &tx(7, 1, 4, 1, 8)).unwrap_err();
        assert!(
            matches!(e, StorageError::OutOfOrderSequence { expected: 0, .. }),
            "{e}"
        );
        // The old epoch is fenced.
        let e = t.check(P, &tx(7, 0, 4, 1, 8)).unwrap_err();
        assert!(
            matches!(e, StorageError::InvalidProducerEpoch { .. }),
            "{e}"
        );
        append(&mut t, tx(7, 1, 0, 1, 8)).unwrap();
        assert_eq!(t.open_transactions().collect::<Vec<_>>(), [(8, 5), (7, 8)]);
        // A marker of the same epoch (the v1 protocol) keeps the sequence.
        assert_eq!(t.record_marker(8, 0, 9), Some(5));
        append(&mut t, tx(8, 0, 1, 1, 10)).unwrap();
        // A marker with nothing open closes nothing.
        assert_eq!(t.record_marker(9, 0, 11), None);
        // The snapshot keeps the open transactions and the ages.
        let (at, back) = ProducerStateTable::decode(&t.encode(12)).unwrap();
        assert_eq!(at, 12);
        assert_eq!(back, t);
        // Cut below producer 7's new transaction: it is no longer open.
        t.truncate(8);
        assert_eq!(
            t.open_transactions().collect::<Vec<_>>(),
            [] as [(i64, u64); 0]
        );
        assert!(t.get(7).is_none() || t.get(7).unwrap().txn_first_offset.is_none());
    }

    #[test]
    fn producers_with_an_open_transaction_are_not_evicted() {
        let mut t = ProducerStateTable::with_max_producers(2);
        append(&mut t, tx(1, 0, 0, 1, 0)).unwrap();
        append(&mut t, h(2, 0, 0, 1, 1)).unwrap();
        append(&mut t, h(3, 0, 0, 1, 2)).unwrap();
        assert!(t.get(1).is_some(), "the open transaction's producer stays");
        assert!(t.get(2).is_none());
        assert_eq!(t.first_unstable_offset(), Some(0));
    }

    #[test]
    fn a_version_1_snapshot_is_read() {
        let mut t = ProducerStateTable::new();
        append(&mut t, h(7, 0, 0, 5, 0)).unwrap();
        append(&mut t, h(9, 2, 0, 1, 5)).unwrap();
        // Version 1: no age, no transaction in an entry.
        let mut v1 = Vec::new();
        v1.extend_from_slice(SNAPSHOT_MAGIC);
        v1.extend_from_slice(&1u32.to_be_bytes());
        v1.extend_from_slice(&6u64.to_be_bytes());
        v1.extend_from_slice(&2u32.to_be_bytes());
        for (pid, epoch, seq, base, last) in
            [(7i64, 0i16, (0i32, 4i32), 0u64, 4u64), (9, 2, (0, 0), 5, 5)]
        {
            v1.extend_from_slice(&pid.to_be_bytes());
            v1.extend_from_slice(&epoch.to_be_bytes());
            // `h` stamps the base offset as the batch's timestamp.
            v1.extend_from_slice(&(base as i64).to_be_bytes());
            v1.push(1);
            v1.extend_from_slice(&seq.0.to_be_bytes());
            v1.extend_from_slice(&seq.1.to_be_bytes());
            v1.extend_from_slice(&base.to_be_bytes());
            v1.extend_from_slice(&last.to_be_bytes());
        }
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_be_bytes());
        let (at, back) = ProducerStateTable::decode(&v1).unwrap();
        assert_eq!(at, 6);
        assert_eq!(back, t);
    }

    #[test]
    fn unknown_producer_must_start_at_zero() {
        let mut t = ProducerStateTable::new();
        let e = t.check(P, &h(7, 0, 3, 1, 0)).unwrap_err();
        assert!(
            matches!(e, StorageError::UnknownProducerId { producer_id: 7, .. }),
            "{e}"
        );
        assert_eq!(e.to_string(), "unknown producer id 7 on t-0");
        assert_eq!(append(&mut t, h(7, 0, 0, 3, 0)).unwrap(), Verdict::Append);
        assert_eq!(t.get(7).unwrap().last_batch().unwrap().last_seq, 2);
        // No producer id: never checked, never recorded.
        assert_eq!(
            append(&mut t, h(-1, -1, -1, 1, 3)).unwrap(),
            Verdict::Append
        );
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn in_order_sequences_are_accepted_and_gaps_rejected() {
        let mut t = ProducerStateTable::new();
        append(&mut t, h(7, 0, 0, 5, 0)).unwrap();
        append(&mut t, h(7, 0, 5, 2, 5)).unwrap();
        let e = t.check(P, &h(7, 0, 9, 1, 7)).unwrap_err();
        assert!(
            matches!(
                e,
                StorageError::OutOfOrderSequence {
                    producer_id: 7,
                    expected: 7,
                    got: 9,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "out-of-order sequence for producer 7 on t-0: expected 7, got 9"
        );
        // Going back to 0 within an epoch is out of order too.
        assert!(t.check(P, &h(7, 0, 0, 1, 7)).is_err());
        assert_eq!(append(&mut t, h(7, 0, 7, 1, 7)).unwrap(), Verdict::Append);
    }

    #[test]
    fn retries_of_the_last_retained_batches_are_duplicates() {
        let mut t = ProducerStateTable::new();
        let n = PRODUCER_BATCHES_RETAINED as u64;
        let total = n + 2;
        for i in 0..total {
            append(&mut t, h(7, 0, (i * 2) as i32, 2, 100 + i * 2)).unwrap();
        }
        // The last n batches are remembered; each retry returns its
        // original offsets.
        for i in total - n..total {
            let v = t.check(P, &h(7, 0, (i * 2) as i32, 2, 0)).unwrap();
            let Verdict::Duplicate(b) = v else {
                panic!("batch {i}: {v:?}")
            };
            assert_eq!((b.base_offset, b.last_offset), (100 + i * 2, 101 + i * 2));
        }
        // Batch 1 is forgotten: its retry is out of order.
        let expected = (total * 2) as i32;
        assert!(matches!(
            t.check(P, &h(7, 0, 2, 2, 0)),
            Err(StorageError::OutOfOrderSequence { expected: e, .. }) if e == expected
        ));
        // Same first sequence, different length: not the same batch.
        let last_first = ((total - 1) * 2) as i32;
        assert!(t.check(P, &h(7, 0, last_first, 1, 0)).is_err());
        assert_eq!(
            t.get(7).unwrap().batches().count(),
            PRODUCER_BATCHES_RETAINED
        );
    }

    #[test]
    fn epochs_fence_and_restart_sequences() {
        let mut t = ProducerStateTable::new();
        append(&mut t, h(7, 3, 0, 5, 0)).unwrap();
        let e = t.check(P, &h(7, 2, 5, 1, 5)).unwrap_err();
        assert!(
            matches!(
                e,
                StorageError::InvalidProducerEpoch {
                    producer_id: 7,
                    epoch: 2,
                    current: 3,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "producer 7 on t-0 is fenced: epoch 2 is older than the current epoch 3"
        );
        // A new epoch must restart at 0.
        assert!(matches!(
            t.check(P, &h(7, 4, 5, 1, 5)),
            Err(StorageError::OutOfOrderSequence {
                expected: 0,
                got: 5,
                ..
            })
        ));
        assert_eq!(append(&mut t, h(7, 4, 0, 1, 5)).unwrap(), Verdict::Append);
        let e = t.get(7).unwrap();
        assert_eq!(e.epoch, 4);
        assert_eq!(
            e.batches().count(),
            1,
            "a new epoch forgets the old batches"
        );
        // The old epoch is fenced now, retries of its batches included.
        assert!(matches!(
            t.check(P, &h(7, 3, 0, 5, 0)),
            Err(StorageError::InvalidProducerEpoch { .. })
        ));
    }

    #[test]
    fn sequences_wrap_from_max_to_zero() {
        assert_eq!(sequence_add(i32::MAX, 1), 0);
        assert_eq!(sequence_add(i32::MAX - 1, 3), 1);
        let mut t = ProducerStateTable::new();
        append(&mut t, h(7, 0, 0, 1, 0)).unwrap();
        // Rebuilt state (no check) just before the wrap.
        t.record(&h(7, 0, i32::MAX - 2, 2, 1));
        assert_eq!(
            t.get(7).unwrap().last_batch().unwrap().last_seq,
            i32::MAX - 1
        );
        // This batch spans the wrap: sequences MAX, 0, 1.
        let wrap = h(7, 0, i32::MAX, 3, 3);
        assert_eq!(last_sequence(&wrap), 1);
        assert_eq!(append(&mut t, wrap).unwrap(), Verdict::Append);
        assert!(matches!(
            t.check(P, &wrap).unwrap(),
            Verdict::Duplicate(b) if b.base_offset == 3 && b.last_offset == 5
        ));
        assert_eq!(append(&mut t, h(7, 0, 2, 1, 6)).unwrap(), Verdict::Append);
        assert!(matches!(
            t.check(P, &h(7, 0, 4, 1, 7)),
            Err(StorageError::OutOfOrderSequence {
                expected: 3,
                got: 4,
                ..
            })
        ));
    }

    #[test]
    fn negative_sequences_of_a_producer_are_rejected() {
        let mut t = ProducerStateTable::new();
        assert!(matches!(
            t.check(P, &h(7, 0, -1, 1, 0)),
            Err(StorageError::UnknownProducerId { .. })
        ));
        append(&mut t, h(7, 0, 0, 1, 0)).unwrap();
        assert!(matches!(
            t.check(P, &h(7, 0, -1, 1, 1)),
            Err(StorageError::OutOfOrderSequence { expected: 1, .. })
        ));
    }

    #[test]
    fn truncate_forgets_batches_at_or_after_the_end() {
        let mut t = ProducerStateTable::new();
        append(&mut t, h(1, 0, 0, 2, 0)).unwrap(); // 0..=1
        append(&mut t, h(2, 0, 0, 2, 2)).unwrap(); // 2..=3
        append(&mut t, h(1, 0, 2, 2, 4)).unwrap(); // 4..=5
        append(&mut t, h(2, 0, 2, 2, 6)).unwrap(); // 6..=7
        t.truncate(4);
        assert_eq!(t.get(1).unwrap().last_batch().unwrap().last_offset, 1);
        assert_eq!(t.get(2).unwrap().last_batch().unwrap().last_offset, 3);
        // The truncated batch is accepted again, not a duplicate.
        assert_eq!(append(&mut t, h(1, 0, 2, 2, 4)).unwrap(), Verdict::Append);
        t.truncate(2);
        assert!(t.get(2).is_none(), "no batch left: removed");
        assert_eq!(t.len(), 1);
        t.truncate(0);
        assert!(t.is_empty());
        assert!(t.by_age.is_empty());
    }

    #[test]
    fn the_oldest_producer_is_evicted_beyond_the_limit() {
        let mut t = ProducerStateTable::with_max_producers(3);
        append(&mut t, h(1, 0, 0, 1, 0)).unwrap();
        append(&mut t, h(2, 0, 0, 1, 1)).unwrap();
        append(&mut t, h(3, 0, 0, 1, 2)).unwrap();
        // Producer 1 appends again: 2 is now the oldest.
        append(&mut t, h(1, 0, 1, 1, 3)).unwrap();
        append(&mut t, h(4, 0, 0, 1, 4)).unwrap();
        assert_eq!(t.len(), 3);
        assert!(t.get(2).is_none());
        assert!(t.get(1).is_some() && t.get(3).is_some() && t.get(4).is_some());
        assert!(matches!(
            t.check(P, &h(2, 0, 1, 1, 5)),
            Err(StorageError::UnknownProducerId { .. })
        ));
    }

    #[test]
    fn snapshot_round_trips_and_detects_damage() {
        let mut t = ProducerStateTable::new();
        for i in 0..8u64 {
            append(&mut t, h(1, 2, i as i32, 1, i * 3)).unwrap();
            append(&mut t, h(1000 + i as i64, 0, 0, 1, i * 3 + 1)).unwrap();
        }
        let bytes = t.encode(24);
        let (off, back) = ProducerStateTable::decode(&bytes).unwrap();
        assert_eq!(off, 24);
        assert_eq!(back, t);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(ProducerStateTable::decode(&b).is_err(), "flip at {i}");
        }
        for n in 0..bytes.len() {
            assert!(
                ProducerStateTable::decode(&bytes[..n]).is_err(),
                "cut at {n}"
            );
        }
        // A batch at or above the snapshot offset is not plausible.
        assert!(ProducerStateTable::decode(&t.encode(20)).is_err());
        // The empty table.
        let e = ProducerStateTable::new();
        assert_eq!(ProducerStateTable::decode(&e.encode(0)).unwrap(), (0, e));
    }

    #[test]
    fn snapshot_file_store_load_remove() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(ProducerStateTable::load(d.path()).unwrap(), None);
        let mut t = ProducerStateTable::new();
        append(&mut t, h(5, 1, 0, 4, 10)).unwrap();
        t.store(d.path(), 14).unwrap();
        assert_eq!(ProducerStateTable::load(d.path()).unwrap(), Some((14, t)));
        let p = d.path().join(PRODUCER_SNAPSHOT_FILE);
        let mut b = std::fs::read(&p).unwrap();
        b[30] ^= 1;
        std::fs::write(&p, b).unwrap();
        assert!(matches!(
            ProducerStateTable::load(d.path()),
            Err(StorageError::Corrupt { .. })
        ));
        ProducerStateTable::remove_snapshot(d.path()).unwrap();
        ProducerStateTable::remove_snapshot(d.path()).unwrap();
        assert_eq!(ProducerStateTable::load(d.path()).unwrap(), None);
    }
}
