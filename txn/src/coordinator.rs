//! The transaction coordinator of one partition of `__transaction_state`:
//! every transactional id placed there, its producer id and epoch, its
//! state and the partitions of its open transaction.
//!
//! **States** (Kafka's): `Empty` (no transaction since the last
//! InitProducerId), `Ongoing` (partitions added), `PrepareCommit` /
//! `PrepareAbort` (the end decided and durable; markers being written),
//! `CompleteCommit` / `CompleteAbort` (every marker written), `Dead`
//! (expired; its record is a tombstone).
//!
//! **A step** changes the state at once and hands back, in [`Step`], the
//! record to store (the transactional id's whole metadata, or a
//! tombstone) and the markers to write. The host stores the record and
//! answers only once it is durable (a failed write: the host forgets and
//! replays the partition, as for groups); it writes the markers only
//! after that, to every partition of the transaction, and calls
//! [`Transactions::markers_written`] when all are durable, which completes
//! the transaction with another record. A host that took the partition
//! over replays its records ([`Transactions::replay`]) and writes the
//! markers of every transaction left prepared
//! ([`Transactions::pending_markers`]).
//!
//! **Fencing.** A producer is its producer id and epoch; a request of
//! another epoch (or another id) than the transactional id's current one
//! is refused `ProducerFenced` (`InvalidProducerIdMapping` for an id the
//! coordinator never gave this transactional id). InitProducerId bumps
//! the epoch, so the previous instance of an application is fenced, and
//! aborts a transaction it left open. With the v2 protocol (KIP-890) the
//! epoch is also bumped at every transaction's end: the markers carry the
//! new epoch, so a zombie's late write to a partition of the ended
//! transaction is refused by the partition itself. A timed-out transaction
//! is aborted with a bumped epoch, fencing its producer.
//!
//! **Epoch exhaustion.** An epoch never passes `i16::MAX`: InitProducerId
//! gives a new producer id (epoch 0) once the epoch is near the end, and
//! a v2 transaction whose end bumps the epoch to `i16::MAX` hands the
//! client a new producer id (taken when it is prepared) that becomes
//! current when the transaction completes.

use std::collections::{BTreeMap, BTreeSet};

/// A topic partition.
pub type Tp = (String, u32);

/// Longest transactional id, bytes.
pub const TRANSACTIONAL_ID_BYTES_MAX: usize = 1024;
/// Most partitions in one transaction (a bound on hostile requests and on
/// the record's size).
pub const TXN_PARTITIONS_MAX: usize = 10_000;
/// Longest topic name, bytes (Kafka's 249).
pub const TOPIC_BYTES_MAX: usize = 249;

/// Bounds and timeouts (Kafka's settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnConfig {
    /// `transaction.max.timeout.ms`: the longest `transaction.timeout.ms`
    /// a producer may ask for.
    pub max_timeout_ms: u32,
    /// `transactional.id.expiration.ms`: a transactional id without a
    /// transaction for this long is forgotten.
    pub id_expiration_ms: i64,
}

impl Default for TxnConfig {
    fn default() -> Self {
        TxnConfig {
            max_timeout_ms: 900_000,
            id_expiration_ms: 7 * 24 * 3_600_000,
        }
    }
}

/// Which protocol a transactional id's producer speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TransactionVersion {
    /// KIP-98's: the client adds partitions, the epoch is bumped only by
    /// InitProducerId.
    V1,
    /// KIP-890's: the epoch is bumped at every transaction's end.
    V2,
}

/// A transactional id's state (Kafka's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TxnState {
    /// No transaction since the producer id was given.
    Empty,
    /// A transaction is open: partitions were added.
    Ongoing,
    /// Commit decided; markers being written.
    PrepareCommit,
    /// Abort decided; markers being written.
    PrepareAbort,
    /// The last transaction committed.
    CompleteCommit,
    /// The last transaction aborted.
    CompleteAbort,
    /// Expired.
    Dead,
}

impl TxnState {
    /// Kafka's name (DescribeTransactions, ListTransactions).
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::Dead => "Dead",
        }
    }

    /// Whether markers are being written.
    pub fn preparing(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }
}

/// What the coordinator keeps of a transactional id (its record's value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnMetadata {
    /// The transactional id.
    pub transactional_id: String,
    /// Its current producer id.
    pub producer_id: i64,
    /// The producer id before the last change of id (-1: none): a retry
    /// of the request that changed it is recognised.
    pub previous_producer_id: i64,
    /// The producer id a prepared transaction hands over to when it
    /// completes (its end exhausted the epoch), else -1.
    pub next_producer_id: i64,
    /// Its current epoch (the markers' while prepared).
    pub producer_epoch: i16,
    /// The epoch before the last bump (-1: none): a retry of the request
    /// that bumped it is recognised.
    pub last_producer_epoch: i16,
    /// `transaction.timeout.ms`.
    pub timeout_ms: u32,
    /// Its state.
    pub state: TxnState,
    /// The partitions of the open (or prepared) transaction.
    pub partitions: BTreeSet<Tp>,
    /// When the open transaction began (its first partition), ms; -1 when
    /// none is open.
    pub start_ms: i64,
    /// Its last change, ms.
    pub update_ms: i64,
    /// The protocol its producer speaks.
    pub version: TransactionVersion,
}

/// Markers to write: one to each partition, for the producer id and epoch
/// given (the partitions' logs take them as a commit or an abort).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Markers {
    /// The transactional id whose transaction they end.
    pub transactional_id: String,
    /// The producer id of the transaction's batches.
    pub producer_id: i64,
    /// The epoch the markers carry.
    pub producer_epoch: i16,
    /// Commit (else abort).
    pub commit: bool,
    /// Where.
    pub partitions: Vec<Tp>,
}

/// A record of `__transaction_state`: the transactional id, and its
/// metadata (`None`: a tombstone).
pub type Record = (String, Option<TxnMetadata>);

/// What a step decided (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Step<T> {
    /// To store, durably, before answering.
    pub record: Option<Record>,
    /// To write once the record is durable.
    pub markers: Option<Markers>,
    /// The answer.
    pub answer: Result<T, TxnError>,
}

impl<T> Step<T> {
    fn refused(e: TxnError) -> Self {
        Step {
            record: None,
            markers: None,
            answer: Err(e),
        }
    }

    fn answered(answer: T) -> Self {
        Step {
            record: None,
            markers: None,
            answer: Ok(answer),
        }
    }
}

/// Why a request was refused (each maps to Kafka's error of that name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnError {
    /// Another epoch of the producer is current: this one is a zombie.
    ProducerFenced(String),
    /// The producer id is not this transactional id's.
    InvalidProducerIdMapping(String),
    /// The transactional id's previous transaction is still ending:
    /// retry.
    ConcurrentTransactions(String),
    /// The request does not fit the transaction's state.
    InvalidTxnState(String),
    /// `transaction.timeout.ms` out of bounds.
    InvalidTransactionTimeout(String),
    /// Malformed or oversized.
    InvalidRequest(String),
    /// No such transactional id (an operator's abort of an unknown id).
    TransactionalIdNotFound(String),
}

impl TxnError {
    /// The human-readable detail.
    pub fn message(&self) -> &str {
        match self {
            TxnError::ProducerFenced(m)
            | TxnError::InvalidProducerIdMapping(m)
            | TxnError::ConcurrentTransactions(m)
            | TxnError::InvalidTxnState(m)
            | TxnError::InvalidTransactionTimeout(m)
            | TxnError::InvalidRequest(m)
            | TxnError::TransactionalIdNotFound(m) => m,
        }
    }
}

impl std::fmt::Display for TxnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for TxnError {}

/// The epoch after `e`, if the epoch has room.
fn bumped(e: i16) -> Option<i16> {
    e.checked_add(1)
}

/// InitProducerId gives a new producer id from this epoch on, so that the
/// bumps of a transaction's end and of a fence still fit.
const EPOCH_ROTATE_AT: i16 = i16::MAX - 2;

/// The transactional ids of one partition of `__transaction_state`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transactions {
    config: TxnConfig,
    txns: BTreeMap<String, TxnMetadata>,
}

impl Transactions {
    /// An empty partition.
    pub fn new(config: TxnConfig) -> Self {
        Transactions {
            config,
            txns: BTreeMap::new(),
        }
    }

    /// A transactional id's metadata.
    pub fn get(&self, transactional_id: &str) -> Option<&TxnMetadata> {
        self.txns.get(transactional_id)
    }

    /// Every transactional id's metadata, by id.
    pub fn all(&self) -> impl Iterator<Item = &TxnMetadata> {
        self.txns.values()
    }

    /// Applies a durable record (oldest first; the latest of a key wins, a
    /// tombstone removes it).
    pub fn replay(&mut self, record: Record) {
        match record {
            (id, Some(m)) if m.state != TxnState::Dead => {
                self.txns.insert(id, m);
            }
            (id, _) => {
                self.txns.remove(&id);
            }
        }
    }

    /// The markers of every prepared transaction (to write again after a
    /// replay: the previous host may have written some, or none).
    pub fn pending_markers(&self) -> Vec<Markers> {
        self.txns
            .values()
            .filter(|m| m.state.preparing())
            .map(markers_of)
            .collect()
    }

    /// Whether `markers` are still to be written: their transaction is
    /// prepared with them (not completed, nor replaced by a later one).
    pub fn is_pending(&self, markers: &Markers) -> bool {
        self.txns
            .get(&markers.transactional_id)
            .is_some_and(|m| m.state.preparing() && markers_of(m) == *markers)
    }

    /// InitProducerId for `transactional_id`: a producer id and epoch for
    /// a new instance of the producer, fencing the previous one (its open
    /// transaction is aborted first: the answer is then
    /// `ConcurrentTransactions`, to retry once the abort completed).
    /// `expected`: KIP-360's producer id and epoch the client had (a
    /// retry of an answer it lost is answered the same; another instance's
    /// is fenced). `new_producer_id` hands out a fresh id when one is
    /// needed.
    pub fn init_producer_id(
        &mut self,
        transactional_id: &str,
        timeout_ms: i64,
        expected: Option<(i64, i16)>,
        version: TransactionVersion,
        now_ms: i64,
        new_producer_id: &mut dyn FnMut() -> i64,
    ) -> Step<(i64, i16)> {
        if let Err(e) = check_id(transactional_id) {
            return Step::refused(e);
        }
        if timeout_ms <= 0 || timeout_ms > i64::from(self.config.max_timeout_ms) {
            return Step::refused(TxnError::InvalidTransactionTimeout(format!(
                "transaction.timeout.ms {timeout_ms} is not within 1..={} (transaction.max.timeout.ms)",
                self.config.max_timeout_ms
            )));
        }
        let timeout_ms = timeout_ms as u32;
        let Some(m) = self.txns.get(transactional_id).cloned() else {
            let m = TxnMetadata {
                transactional_id: transactional_id.to_string(),
                producer_id: new_producer_id(),
                previous_producer_id: -1,
                next_producer_id: -1,
                producer_epoch: 0,
                last_producer_epoch: -1,
                timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                start_ms: -1,
                update_ms: now_ms,
                version,
            };
            let answer = (m.producer_id, m.producer_epoch);
            return self.store(m, None, Ok(answer));
        };
        if let Some((pid, epoch)) = expected {
            let current = (m.producer_id, m.producer_epoch);
            let retried = (pid == m.previous_producer_id && m.state == TxnState::Empty)
                || (pid == m.producer_id && epoch == m.last_producer_epoch);
            if (pid, epoch) != current {
                return if retried && !m.state.preparing() && m.state != TxnState::Ongoing {
                    Step::answered(current)
                } else {
                    Step::refused(TxnError::ProducerFenced(format!(
                        "producer {pid} epoch {epoch} of `{transactional_id}` was fenced: \
                         producer {} epoch {} is current",
                        m.producer_id, m.producer_epoch
                    )))
                };
            }
        }
        match m.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => Step::refused(still_ending(&m)),
            TxnState::Ongoing => {
                // The previous instance left a transaction open: abort it
                // with a bumped epoch (it is fenced), then retry.
                let mut step = self.prepare(m, false, true, now_ms, new_producer_id);
                step.answer = Err(TxnError::ConcurrentTransactions(format!(
                    "`{transactional_id}`'s open transaction is being aborted: retry"
                )));
                step
            }
            TxnState::Empty
            | TxnState::CompleteCommit
            | TxnState::CompleteAbort
            | TxnState::Dead => {
                let mut next = m;
                if next.producer_epoch >= EPOCH_ROTATE_AT {
                    next.previous_producer_id = next.producer_id;
                    next.producer_id = new_producer_id();
                    next.last_producer_epoch = -1;
                    next.producer_epoch = 0;
                } else {
                    next.last_producer_epoch = next.producer_epoch;
                    next.producer_epoch += 1;
                }
                next.state = TxnState::Empty;
                next.partitions.clear();
                next.start_ms = -1;
                next.timeout_ms = timeout_ms;
                next.version = version;
                next.update_ms = now_ms;
                let answer = (next.producer_id, next.producer_epoch);
                self.store(next, None, Ok(answer))
            }
        }
    }

    /// AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets
    /// partition; and KIP-890's implicit add of a v2 producer's first
    /// write to a partition): the partitions join the transaction, which
    /// opens if none is.
    pub fn add_partitions(
        &mut self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[Tp],
        version: TransactionVersion,
        now_ms: i64,
    ) -> Step<()> {
        let m = match self.current(transactional_id, producer_id, producer_epoch) {
            Ok(m) => m.clone(),
            Err(e) => return Step::refused(e),
        };
        if m.state.preparing() {
            return Step::refused(still_ending(&m));
        }
        if let Some((t, _)) = partitions
            .iter()
            .find(|(t, _)| t.is_empty() || t.len() > TOPIC_BYTES_MAX)
        {
            return Step::refused(TxnError::InvalidRequest(format!(
                "topic name of {} bytes",
                t.len()
            )));
        }
        let new: BTreeSet<&Tp> = partitions
            .iter()
            .filter(|tp| !m.partitions.contains(*tp))
            .collect();
        if m.state == TxnState::Ongoing && new.is_empty() {
            return Step::answered(());
        }
        if m.partitions.len() + new.len() > TXN_PARTITIONS_MAX {
            return Step::refused(TxnError::InvalidRequest(format!(
                "a transaction of more than {TXN_PARTITIONS_MAX} partitions"
            )));
        }
        let mut next = m;
        if next.state != TxnState::Ongoing {
            next.state = TxnState::Ongoing;
            next.partitions.clear();
            next.start_ms = now_ms;
        }
        // The protocol of the request that adds decides the end's (a
        // KIP-890 client's implicit adds are v2; Kafka keeps it the same
        // way, per request).
        next.version = version;
        next.partitions.extend(new.into_iter().cloned());
        next.update_ms = now_ms;
        self.store(next, None, Ok(()))
    }

    /// KIP-890's check before a transactional write lands: is `tp` in the
    /// open transaction of this producer?
    pub fn verify(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        tp: &Tp,
    ) -> Result<(), TxnError> {
        let m = self.current(transactional_id, producer_id, producer_epoch)?;
        if m.state == TxnState::Ongoing && m.partitions.contains(tp) {
            Ok(())
        } else {
            Err(TxnError::InvalidTxnState(format!(
                "{}-{} is not in an open transaction of `{transactional_id}` ({})",
                tp.0,
                tp.1,
                m.state.name()
            )))
        }
    }

    /// EndTxn: commit or abort the open transaction. Answered (with the
    /// producer id and epoch the client goes on with: a v2 transaction
    /// bumps the epoch) once the decision is durable; the markers follow.
    /// A retry of an end already decided is answered the same.
    pub fn end_txn(
        &mut self,
        transactional_id: &str,
        (producer_id, producer_epoch): (i64, i16),
        commit: bool,
        version: TransactionVersion,
        now_ms: i64,
        new_producer_id: &mut dyn FnMut() -> i64,
    ) -> Step<(i64, i16)> {
        let what = if commit { "commit" } else { "abort" };
        let Some(m) = self.txns.get(transactional_id).cloned() else {
            return Step::refused(unknown_id(transactional_id));
        };
        let decided = if commit {
            (TxnState::PrepareCommit, TxnState::CompleteCommit)
        } else {
            (TxnState::PrepareAbort, TxnState::CompleteAbort)
        };
        // A v2 retry: the end already bumped the epoch the client still has.
        let retry = version == TransactionVersion::V2
            && producer_epoch == m.last_producer_epoch
            && (producer_id == m.producer_id || producer_id == m.previous_producer_id);
        if retry {
            return if m.state == decided.1 {
                Step::answered((m.producer_id, m.producer_epoch))
            } else if m.state == decided.0 {
                Step::answered(continue_with(&m))
            } else {
                Step::refused(wrong_state(&m, what))
            };
        }
        if let Err(e) = self.current(transactional_id, producer_id, producer_epoch) {
            return Step::refused(e);
        }
        match m.state {
            TxnState::Ongoing => {
                let mut m = m;
                m.version = version;
                self.prepare(m, commit, false, now_ms, new_producer_id)
            }
            s if s == decided.0 => Step::answered(continue_with(&m)),
            s if s == decided.1 && version == TransactionVersion::V1 => {
                Step::answered((m.producer_id, m.producer_epoch))
            }
            TxnState::Empty if !commit && version == TransactionVersion::V2 => {
                // Nothing to abort: the epoch moves on all the same, so
                // the client's view matches a real end's.
                let mut next = m;
                next.last_producer_epoch = next.producer_epoch;
                next.producer_epoch += 1;
                next.version = version;
                next.state = TxnState::CompleteAbort;
                next.update_ms = now_ms;
                let answer = (next.producer_id, next.producer_epoch);
                self.store(next, None, Ok(answer))
            }
            _ => Step::refused(wrong_state(&m, what)),
        }
    }

    /// Every marker of `transactional_id`'s prepared transaction is
    /// durable: it completes (another record). `None` if it is not
    /// prepared (completed already, or replaced).
    pub fn markers_written(&mut self, markers: &Markers, now_ms: i64) -> Option<Record> {
        let m = self.txns.get(&markers.transactional_id)?;
        if !m.state.preparing() || markers_of(m) != *markers {
            return None;
        }
        let mut next = m.clone();
        next.state = if markers.commit {
            TxnState::CompleteCommit
        } else {
            TxnState::CompleteAbort
        };
        next.partitions.clear();
        next.start_ms = -1;
        next.update_ms = now_ms;
        if next.next_producer_id >= 0 {
            // The epoch before the end stays the last one: the client's
            // retry of its EndTxn (previous id, that epoch) is recognised.
            next.previous_producer_id = next.producer_id;
            next.producer_id = next.next_producer_id;
            next.next_producer_id = -1;
            next.producer_epoch = 0;
        }
        self.store(next, None, Ok(())).record
    }

    /// An operator's abort (`weir txn abort`): `transactional_id`'s open
    /// transaction is aborted now, its producer fenced by an epoch bump (as
    /// a timeout does). Refused unless a transaction is open.
    pub fn abort(
        &mut self,
        transactional_id: &str,
        now_ms: i64,
        new_producer_id: &mut dyn FnMut() -> i64,
    ) -> Step<(i64, i16)> {
        let m = match self.txns.get(transactional_id) {
            None => {
                return Step::refused(TxnError::TransactionalIdNotFound(format!(
                    "no transactional id `{transactional_id}` is known to its coordinator"
                )))
            }
            Some(m) => m.clone(),
        };
        match m.state {
            TxnState::Ongoing => self.prepare(m, false, true, now_ms, new_producer_id),
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                Step::refused(TxnError::ConcurrentTransactions(format!(
                    "`{transactional_id}`'s transaction is already ending ({}): its markers \
                     are being written",
                    m.state.name()
                )))
            }
            s => Step::refused(TxnError::InvalidTxnState(format!(
                "`{transactional_id}` has no open transaction ({})",
                s.name()
            ))),
        }
    }

    /// Timers at `now_ms`: an open transaction past its timeout is aborted
    /// (its producer fenced by an epoch bump); a transactional id idle for
    /// `transactional.id.expiration.ms` is forgotten (a tombstone).
    pub fn expire(
        &mut self,
        now_ms: i64,
        new_producer_id: &mut dyn FnMut() -> i64,
    ) -> Vec<Step<()>> {
        let timed_out: Vec<TxnMetadata> = self
            .txns
            .values()
            .filter(|m| {
                m.state == TxnState::Ongoing && m.start_ms + i64::from(m.timeout_ms) <= now_ms
            })
            .cloned()
            .collect();
        let idle: Vec<String> = self
            .txns
            .values()
            .filter(|m| {
                matches!(
                    m.state,
                    TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
                ) && m.update_ms + self.config.id_expiration_ms <= now_ms
            })
            .map(|m| m.transactional_id.clone())
            .collect();
        let mut out = Vec::new();
        for m in timed_out {
            out.push(
                self.prepare(m, false, true, now_ms, new_producer_id)
                    .map_answer(),
            );
        }
        for id in idle {
            self.txns.remove(&id);
            out.push(Step {
                record: Some((id, None)),
                markers: None,
                answer: Ok(()),
            });
        }
        out
    }

    /// The metadata of `transactional_id` if (`producer_id`,
    /// `producer_epoch`) is its current producer.
    fn current(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
    ) -> Result<&TxnMetadata, TxnError> {
        let m = self
            .txns
            .get(transactional_id)
            .ok_or_else(|| unknown_id(transactional_id))?;
        if producer_id != m.producer_id {
            return Err(TxnError::InvalidProducerIdMapping(format!(
                "producer {producer_id} is not `{transactional_id}`'s (producer {} is)",
                m.producer_id
            )));
        }
        if producer_epoch != m.producer_epoch {
            return Err(TxnError::ProducerFenced(format!(
                "producer {producer_id} epoch {producer_epoch} of `{transactional_id}` was \
                 fenced: epoch {} is current",
                m.producer_epoch
            )));
        }
        Ok(m)
    }

    /// Decides the end of `m`'s open transaction: prepared, its markers to
    /// write. `fence` (an abort the coordinator decides: a timeout, a new
    /// instance) bumps the epoch, as does every end of a v2 transaction.
    fn prepare(
        &mut self,
        m: TxnMetadata,
        commit: bool,
        fence: bool,
        now_ms: i64,
        new_producer_id: &mut dyn FnMut() -> i64,
    ) -> Step<(i64, i16)> {
        let mut next = m;
        if fence || next.version == TransactionVersion::V2 {
            if let Some(e) = bumped(next.producer_epoch) {
                next.last_producer_epoch = next.producer_epoch;
                next.producer_epoch = e;
                if e == i16::MAX {
                    next.next_producer_id = new_producer_id();
                }
            }
        }
        next.state = if commit {
            TxnState::PrepareCommit
        } else {
            TxnState::PrepareAbort
        };
        next.update_ms = now_ms;
        let markers = markers_of(&next);
        let answer = continue_with(&next);
        self.store(next, Some(markers), Ok(answer))
    }

    /// Keeps `m` and hands back its record.
    fn store<T>(
        &mut self,
        m: TxnMetadata,
        markers: Option<Markers>,
        answer: Result<T, TxnError>,
    ) -> Step<T> {
        let record = (m.transactional_id.clone(), Some(m.clone()));
        self.txns.insert(m.transactional_id.clone(), m);
        Step {
            record: Some(record),
            markers,
            answer,
        }
    }
}

impl<T> Step<T> {
    /// The same step answering `()` (the answer's error kept).
    fn map_answer(self) -> Step<()> {
        Step {
            record: self.record,
            markers: self.markers,
            answer: self.answer.map(|_| ()),
        }
    }
}

/// The markers of a prepared transaction.
fn markers_of(m: &TxnMetadata) -> Markers {
    Markers {
        transactional_id: m.transactional_id.clone(),
        producer_id: m.producer_id,
        producer_epoch: m.producer_epoch,
        commit: m.state == TxnState::PrepareCommit,
        partitions: m.partitions.iter().cloned().collect(),
    }
}

/// The producer id and epoch a client goes on with after `m`'s end.
fn continue_with(m: &TxnMetadata) -> (i64, i16) {
    if m.next_producer_id >= 0 {
        (m.next_producer_id, 0)
    } else {
        (m.producer_id, m.producer_epoch)
    }
}

fn check_id(id: &str) -> Result<(), TxnError> {
    if id.is_empty() || id.len() > TRANSACTIONAL_ID_BYTES_MAX {
        return Err(TxnError::InvalidRequest(format!(
            "a transactional id of {} bytes (1..={TRANSACTIONAL_ID_BYTES_MAX})",
            id.len()
        )));
    }
    Ok(())
}

fn unknown_id(id: &str) -> TxnError {
    TxnError::InvalidProducerIdMapping(format!(
        "`{id}` has no producer id here: InitProducerId first"
    ))
}

fn still_ending(m: &TxnMetadata) -> TxnError {
    TxnError::ConcurrentTransactions(format!(
        "`{}`'s transaction is still ending ({}): retry",
        m.transactional_id,
        m.state.name()
    ))
}

fn wrong_state(m: &TxnMetadata, what: &str) -> TxnError {
    TxnError::InvalidTxnState(format!(
        "cannot {what} `{}`'s transaction: it is {}",
        m.transactional_id,
        m.state.name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use TransactionVersion::{V1, V2};

    fn tp(t: &str, p: u32) -> Tp {
        (t.to_string(), p)
    }

    /// A coordinator and a producer id counter from 1000.
    fn coordinator() -> (Transactions, impl FnMut() -> i64) {
        let mut next = 999;
        (Transactions::new(TxnConfig::default()), move || {
            next += 1;
            next
        })
    }

    #[test]
    fn a_v1_transaction_commits_through_its_markers() {
        let (mut c, mut ids) = coordinator();
        let s = c.init_producer_id("app", 60_000, None, V1, 0, &mut ids);
        assert_eq!(s.answer, Ok((1000, 0)));
        assert!(s.record.is_some() && s.markers.is_none());
        let s = c.add_partitions("app", 1000, 0, &[tp("out", 0), tp("out", 1)], V1, 10);
        assert_eq!(s.answer, Ok(()));
        assert_eq!(c.get("app").unwrap().state, TxnState::Ongoing);
        // The same partitions again: nothing to store.
        let s = c.add_partitions("app", 1000, 0, &[tp("out", 1)], V1, 11);
        assert_eq!((s.answer, s.record), (Ok(()), None));
        assert_eq!(c.verify("app", 1000, 0, &tp("out", 1)), Ok(()));
        assert!(c.verify("app", 1000, 0, &tp("out", 2)).is_err());
        let s = c.end_txn("app", (1000, 0), true, V1, 20, &mut ids);
        assert_eq!(s.answer, Ok((1000, 0)), "v1: the epoch stays");
        let m = s.markers.unwrap();
        assert_eq!(
            (
                m.producer_id,
                m.producer_epoch,
                m.commit,
                m.partitions.clone()
            ),
            (1000, 0, true, vec![tp("out", 0), tp("out", 1)])
        );
        // While the markers are written: retry later.
        let s = c.add_partitions("app", 1000, 0, &[tp("out", 3)], V1, 21);
        assert!(matches!(s.answer, Err(TxnError::ConcurrentTransactions(_))));
        let r = c.markers_written(&m, 30).unwrap();
        assert_eq!(r.1.unwrap().state, TxnState::CompleteCommit);
        assert_eq!(c.markers_written(&m, 31), None, "once");
        // A retried EndTxn (v1) is answered the same; the other end is not.
        let s = c.end_txn("app", (1000, 0), true, V1, 32, &mut ids);
        assert_eq!((s.answer, s.record), (Ok((1000, 0)), None));
        let s = c.end_txn("app", (1000, 0), false, V1, 33, &mut ids);
        assert!(matches!(s.answer, Err(TxnError::InvalidTxnState(_))));
        // The next transaction reopens.
        let s = c.add_partitions("app", 1000, 0, &[tp("out", 5)], V1, 40);
        assert_eq!(s.answer, Ok(()));
        assert_eq!(c.get("app").unwrap().partitions.len(), 1);
        assert_eq!(c.get("app").unwrap().start_ms, 40);
        // The client's own abort (v1) keeps the epoch.
        let s = c.end_txn("app", (1000, 0), false, V1, 41, &mut ids);
        assert_eq!(s.answer, Ok((1000, 0)));
        assert_eq!(s.markers.as_ref().unwrap().producer_epoch, 0);
        let _ = c.markers_written(&s.markers.unwrap(), 42).unwrap();
        let s = c.add_partitions("app", 1000, 0, &[tp("out", 6)], V1, 43);
        assert_eq!(s.answer, Ok(()));
    }

    #[test]
    fn v2_bumps_the_epoch_at_every_end_and_fences_the_old_one() {
        let (mut c, mut ids) = coordinator();
        let _ = c.init_producer_id("app", 60_000, None, V2, 0, &mut ids);
        let _ = c.add_partitions("app", 1000, 0, &[tp("out", 0)], V2, 1);
        let s = c.end_txn("app", (1000, 0), false, V2, 2, &mut ids);
        assert_eq!(s.answer, Ok((1000, 1)));
        let m = s.markers.unwrap();
        assert_eq!((m.producer_epoch, m.commit), (1, false));
        // A retry with the old epoch, before and after the markers.
        let s = c.end_txn("app", (1000, 0), false, V2, 3, &mut ids);
        assert_eq!((s.answer, s.record), (Ok((1000, 1)), None));
        let _ = c.markers_written(&m, 4).unwrap();
        let s = c.end_txn("app", (1000, 0), false, V2, 5, &mut ids);
        assert_eq!(s.answer, Ok((1000, 1)));
        // The old epoch is a zombie for anything else.
        let s = c.add_partitions("app", 1000, 0, &[tp("out", 0)], V2, 6);
        assert!(matches!(s.answer, Err(TxnError::ProducerFenced(_))));
        let s = c.add_partitions("app", 1000, 1, &[tp("out", 0)], V2, 7);
        assert_eq!(s.answer, Ok(()));
        // Aborting nothing still moves the epoch (v2).
        let _ = c.add_partitions("app", 1000, 1, &[tp("out", 1)], V2, 8);
        let s = c.end_txn("app", (1000, 1), true, V2, 9, &mut ids);
        let _ = c.markers_written(&s.markers.unwrap(), 10);
        let s = c.end_txn("app", (1000, 2), false, V2, 11, &mut ids);
        assert!(
            matches!(s.answer, Err(TxnError::InvalidTxnState(_))),
            "{:?}",
            s.answer
        );
    }

    #[test]
    fn the_protocol_of_the_requests_decides_the_end() {
        // Kafka's InitProducerId does not say which protocol the client
        // speaks; its adds and ends do.
        let (mut c, mut ids) = coordinator();
        let _ = c.init_producer_id("app", 60_000, None, V1, 0, &mut ids);
        let _ = c.add_partitions("app", 1000, 0, &[tp("out", 0)], V2, 1);
        let s = c.end_txn("app", (1000, 0), true, V2, 2, &mut ids);
        assert_eq!(s.answer, Ok((1000, 1)), "a v2 end bumps the epoch");
        let _ = c.markers_written(&s.markers.unwrap(), 3).unwrap();
        // The same client goes on at its new epoch; a v1 end keeps it.
        let _ = c.add_partitions("app", 1000, 1, &[tp("out", 1)], V1, 4);
        let s = c.end_txn("app", (1000, 1), true, V1, 5, &mut ids);
        assert_eq!(s.answer, Ok((1000, 1)));
        assert_eq!(s.markers.unwrap().producer_epoch, 1);
    }

    #[test]
    fn a_new_instance_fences_the_old_and_aborts_what_it_left_open() {
        let (mut c, mut ids) = coordinator();
        let _ = c.init_producer_id("app", 60_000, None, V1, 0, &mut ids);
        let _ = c.add_partitions("app", 1000, 0, &[tp("out", 0)], V1, 1);
        // The new instance: the open transaction is aborted first.
        let s = c.init_producer_id("app", 60_000, None, V1, 2, &mut ids);
        assert!(matches!(s.answer, Err(TxnError::ConcurrentTransactions(_))));
        let m = s.markers.unwrap();
        assert_eq!((m.producer_epoch, m.commit), (1, false));
        let s = c.init_producer_id("app", 60_000, None, V1, 3, &mut ids);
        assert!(matches!(s.answer, Err(TxnError::ConcurrentTransactions(_))));
        let _ = c.markers_written(&m, 4).unwrap();
        let s = c.init_producer_id("app", 60_000, None, V1, 5, &mut ids);
        assert_eq!(s.answer, Ok((1000, 2)));
        // The zombie: fenced everywhere.
        let s = c.end_txn("app", (1000, 0), true, V1, 6, &mut ids);
        assert!(matches!(s.answer, Err(TxnError::ProducerFenced(_))));
        let s = c.add_partitions("app", 1000, 1, &[tp("out", 0)], V1, 7);
        assert!(matches!(s.answer, Err(TxnError::ProducerFenced(_))));
        // KIP-360: the current instance retrying its init gets the same;
        // another's expectation is fenced.
        let s = c.init_producer_id("app", 60_000, Some((1000, 1)), V1, 8, &mut ids);
        assert_eq!((s.answer, s.record), (Ok((1000, 2)), None));
        let s = c.init_producer_id("app", 60_000, Some((1000, 0)), V1, 9, &mut ids);
        assert!(matches!(s.answer, Err(TxnError::ProducerFenced(_))));
        let s = c.init_producer_id("app", 60_000, Some((1000, 2)), V1, 10, &mut ids);
        assert_eq!(s.answer, Ok((1000, 3)));
    }

    #[test]
    fn timeouts_abort_and_idle_ids_expire() {
        let (mut c, mut ids) = coordinator();
        let _ = c.init_producer_id("slow", 1_000, None, V2, 0, &mut ids);
        let _ = c.init_producer_id("idle", 1_000, None, V2, 0, &mut ids);
        let _ = c.add_partitions("slow", 1000, 0, &[tp("out", 0)], V2, 100);
        assert!(c.expire(1_099, &mut ids).is_empty());
        let steps = c.expire(1_100, &mut ids);
        assert_eq!(steps.len(), 1);
        let m = steps[0].markers.clone().unwrap();
        assert_eq!(
            (m.transactional_id.as_str(), m.commit, m.producer_epoch),
            ("slow", false, 1)
        );
        assert_eq!(c.get("slow").unwrap().state, TxnState::PrepareAbort);
        let s = c.end_txn("slow", (1000, 0), true, V2, 1_200, &mut ids);
        assert!(s.answer.is_err(), "the producer was fenced");
        let week = TxnConfig::default().id_expiration_ms;
        let steps = c.expire(week, &mut ids);
        assert_eq!(steps.len(), 1, "the prepared one stays");
        assert_eq!(steps[0].record, Some(("idle".to_string(), None)));
        assert!(c.get("idle").is_none());
    }

    #[test]
    fn epochs_never_overflow_and_hand_over_to_a_new_producer_id() {
        let (mut c, mut ids) = coordinator();
        let _ = c.init_producer_id("app", 60_000, None, V2, 0, &mut ids);
        // Near the end of the epochs (as if after many transactions).
        let mut m = c.get("app").unwrap().clone();
        m.producer_epoch = i16::MAX - 1;
        c.replay(("app".into(), Some(m)));
        let _ = c.add_partitions("app", 1000, i16::MAX - 1, &[tp("out", 0)], V2, 1);
        let s = c.end_txn("app", (1000, i16::MAX - 1), true, V2, 2, &mut ids);
        assert_eq!(s.answer, Ok((1001, 0)), "the next producer id");
        let mk = s.markers.unwrap();
        assert_eq!((mk.producer_id, mk.producer_epoch), (1000, i16::MAX));
        let _ = c.markers_written(&mk, 3).unwrap();
        let now = c.get("app").unwrap();
        assert_eq!((now.producer_id, now.producer_epoch), (1001, 0));
        // Its retry still gets the new id.
        let s = c.end_txn("app", (1000, i16::MAX - 1), true, V2, 4, &mut ids);
        assert_eq!((s.answer, s.record), (Ok((1001, 0)), None));
        // InitProducerId rotates before the end too.
        let mut m = c.get("app").unwrap().clone();
        m.producer_epoch = EPOCH_ROTATE_AT;
        c.replay(("app".into(), Some(m)));
        let s = c.init_producer_id("app", 60_000, None, V2, 5, &mut ids);
        assert_eq!(s.answer, Ok((1002, 0)));
    }

    #[test]
    fn bad_requests_are_refused_with_nothing_stored() {
        let (mut c, mut ids) = coordinator();
        for (id, timeout) in [("", 1000), ("x", 0), ("x", 900_001)] {
            let s = c.init_producer_id(id, timeout, None, V2, 0, &mut ids);
            assert!(s.answer.is_err() && s.record.is_none(), "{id} {timeout}");
        }
        let long = "x".repeat(TRANSACTIONAL_ID_BYTES_MAX + 1);
        assert!(c
            .init_producer_id(&long, 1000, None, V2, 0, &mut ids)
            .answer
            .is_err());
        let s = c.add_partitions("nobody", 1, 0, &[tp("t", 0)], V2, 0);
        assert!(matches!(
            s.answer,
            Err(TxnError::InvalidProducerIdMapping(_))
        ));
        let _ = c.init_producer_id("x", 1000, None, V2, 0, &mut ids);
        let s = c.add_partitions("x", 77, 0, &[tp("t", 0)], V2, 0);
        assert!(matches!(
            s.answer,
            Err(TxnError::InvalidProducerIdMapping(_))
        ));
        let many: Vec<Tp> = (0..=TXN_PARTITIONS_MAX as u32)
            .map(|p| tp("t", p))
            .collect();
        let s = c.add_partitions("x", 1000, 0, &many, V2, 0);
        assert!(matches!(s.answer, Err(TxnError::InvalidRequest(_))) && s.record.is_none());
        let s = c.add_partitions("x", 1000, 0, &[tp("", 0)], V2, 0);
        assert!(s.answer.is_err());
        let s = c.end_txn("x", (1000, 0), true, V2, 0, &mut ids);
        assert!(
            matches!(s.answer, Err(TxnError::InvalidTxnState(_))),
            "commit of nothing"
        );
        assert_eq!(c.get("x").unwrap().state, TxnState::Empty);
    }
}
