//! A queue checker in the manner of Jepsen's: a history of what producers
//! were told and what consumers saw, the final logs of every replica, and
//! every anomaly among them counted and shown with the history around it.
//!
//! The workload writes records whose value names them: [`Rec`], a key and
//! a sequence number that one producer raises by one per record of that
//! key and sends in order (an idempotent producer keeps that order). The
//! history records, in the order they happened:
//!
//! - [`Event::Ack`]: a producer was told `rec` is at `partition/offset`;
//! - [`Event::Assigned`]: a reader starts a new run of polls of a
//!   partition (a group member given it, an assign-mode reader seeking),
//!   from a position if it knows one (a committed offset, a seek);
//! - [`Event::Polled`]: a reader was handed `rec` at `partition/offset`.
//!
//! After the run, [`Final`] holds each replica's whole log of each
//! partition, read once the cluster is whole again. [`check`] then reports
//! (see [`Anomaly`]): acknowledged records lost, records seen by a
//! consumer but gone from the log (visible before they were durable),
//! duplicates, records of one key out of order, one offset holding two
//! records anywhere, polls that skip records or go backwards within a run,
//! and replicas that differ.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// A partition's number.
pub type Partition = u32;
/// An offset in a partition.
pub type Offset = u64;

/// A record of the workload: the `seq`-th value of `key` (seq from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rec {
    /// The key (one producer writes each key).
    pub key: u32,
    /// Its place among the key's records, as sent.
    pub seq: u64,
}

impl Rec {
    /// The value bytes that carry it: `"KEY:SEQ"`.
    pub fn encode(&self) -> String {
        format!("{}:{}", self.key, self.seq)
    }

    /// The record a value carries, if it is one of the workload's.
    pub fn parse(value: &[u8]) -> Option<Rec> {
        let s = std::str::from_utf8(value).ok()?;
        let (k, q) = s.split_once(':')?;
        Some(Rec {
            key: k.parse().ok()?,
            seq: q.parse().ok()?,
        })
    }
}

impl fmt::Display for Rec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.key, self.seq)
    }
}

/// One thing that happened, in history order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A producer was acknowledged `rec` at `partition/offset`.
    Ack {
        /// Which producer.
        producer: u32,
        /// The partition.
        partition: Partition,
        /// The offset the acknowledgement named.
        offset: Offset,
        /// The record.
        rec: Rec,
    },
    /// Reader `reader` starts run `run` of polls of `partition`, at `from`
    /// if it knows where (a committed offset or a seek; `None`: wherever
    /// the reset policy puts it).
    Assigned {
        /// Which reader (a group member or an assign-mode reader).
        reader: u32,
        /// Its run of `partition` (new whenever the partition is given
        /// to it again or it seeks).
        run: u32,
        /// The partition.
        partition: Partition,
        /// Where the run starts, if known.
        from: Option<Offset>,
    },
    /// Reader `reader` was handed `rec` at `partition/offset` in run `run`.
    Polled {
        /// Which reader.
        reader: u32,
        /// Its run (see [`Event::Assigned`]).
        run: u32,
        /// The partition.
        partition: Partition,
        /// The record's offset.
        offset: Offset,
        /// The record.
        rec: Rec,
    },
}

impl Event {
    fn partition(&self) -> Partition {
        match self {
            Event::Ack { partition, .. }
            | Event::Assigned { partition, .. }
            | Event::Polled { partition, .. } => *partition,
        }
    }

    fn offset(&self) -> Option<Offset> {
        match self {
            Event::Ack { offset, .. } | Event::Polled { offset, .. } => Some(*offset),
            Event::Assigned { from, .. } => *from,
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Ack {
                producer,
                partition,
                offset,
                rec,
            } => write!(f, "producer {producer} acked {rec} at {partition}/{offset}"),
            Event::Assigned {
                reader,
                run,
                partition,
                from,
            } => match from {
                Some(o) => write!(f, "reader {reader} run {run} starts {partition} at {o}"),
                None => write!(f, "reader {reader} run {run} starts {partition}"),
            },
            Event::Polled {
                reader,
                run,
                partition,
                offset,
                rec,
            } => write!(
                f,
                "reader {reader} run {run} polled {rec} at {partition}/{offset}"
            ),
        }
    }
}

/// What happened, in order; shared by the workload's tasks.
#[derive(Debug, Default)]
pub struct History {
    events: std::sync::Mutex<Vec<Event>>,
}

impl History {
    /// Appends `e` (its place is its time).
    pub fn push(&self, e: Event) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(e);
    }

    /// Every event so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How many acknowledgements it holds.
    pub fn acks(&self) -> usize {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|e| matches!(e, Event::Ack { .. }))
            .count()
    }
}

/// The replicas' logs after the run: replica (node id) → partition →
/// offset → record. A value that is not a [`Rec`] is left out by whoever
/// reads the logs.
pub type Final = BTreeMap<u64, BTreeMap<Partition, BTreeMap<Offset, Rec>>>;

/// The kinds of anomaly, in the order a report lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Anomaly {
    /// Acknowledged, and on no replica's log of its partition.
    Lost,
    /// Acknowledged at an offset that holds another record (or nothing)
    /// on a replica, though it is elsewhere in the log.
    AckedElsewhere,
    /// Handed to a consumer, and on no replica's log: visible before it
    /// was durable.
    Premature,
    /// At two offsets of one replica's log.
    Duplicated,
    /// Later than a record of the same key with a higher seq in a log.
    Reordered,
    /// Two records at one offset, between any two observations (acks,
    /// polls, replicas).
    InconsistentOffset,
    /// A run of polls went over an offset the log holds.
    PollSkip,
    /// A run of polls went back, or stood still.
    NonMonotonicPoll,
    /// Two replicas' logs of a partition differ.
    DivergentReplicas,
}

impl Anomaly {
    /// Every kind.
    pub const ALL: [Anomaly; 9] = [
        Anomaly::Lost,
        Anomaly::AckedElsewhere,
        Anomaly::Premature,
        Anomaly::Duplicated,
        Anomaly::Reordered,
        Anomaly::InconsistentOffset,
        Anomaly::PollSkip,
        Anomaly::NonMonotonicPoll,
        Anomaly::DivergentReplicas,
    ];

    fn name(self) -> &'static str {
        match self {
            Anomaly::Lost => "acknowledged but lost",
            Anomaly::AckedElsewhere => "acknowledged at another offset",
            Anomaly::Premature => "visible before durable (polled, then lost)",
            Anomaly::Duplicated => "duplicated",
            Anomaly::Reordered => "reordered within a key",
            Anomaly::InconsistentOffset => "inconsistent offset",
            Anomaly::PollSkip => "poll skip",
            Anomaly::NonMonotonicPoll => "non-monotonic poll",
            Anomaly::DivergentReplicas => "divergent replicas",
        }
    }
}

/// One anomaly found: its kind, where, and what the history and the
/// replicas say around it.
#[derive(Debug, Clone)]
pub struct Found {
    /// The kind.
    pub kind: Anomaly,
    /// The partition.
    pub partition: Partition,
    /// The offset it is about.
    pub offset: Offset,
    /// What it is, in a line.
    pub what: String,
    /// The history and the replicas around `partition/offset`.
    pub context: String,
}

/// What [`check`] found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Acknowledgements in the history.
    pub acked: usize,
    /// Records polled.
    pub polled: usize,
    /// Records in the longest replica log, summed over partitions.
    pub logged: usize,
    /// Every anomaly, in the order of [`Anomaly::ALL`], then partition and
    /// offset.
    pub found: Vec<Found>,
}

impl Report {
    /// How many of `kind` were found.
    pub fn count(&self, kind: Anomaly) -> usize {
        self.found.iter().filter(|f| f.kind == kind).count()
    }

    /// Whether nothing was found.
    pub fn is_clean(&self) -> bool {
        self.found.is_empty()
    }

    /// Panics with the whole report unless it is clean.
    pub fn assert_clean(&self) {
        assert!(self.is_clean(), "the checker found anomalies:\n{self}");
    }
}

/// At most this many anomalies of one kind are shown in full.
const SHOWN_PER_KIND: usize = 5;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "acknowledged {}, polled {}, in the log {}",
            self.acked, self.polled, self.logged
        )?;
        for kind in Anomaly::ALL {
            writeln!(f, "  {:<44} {}", kind.name(), self.count(kind))?;
        }
        for kind in Anomaly::ALL {
            for a in self
                .found
                .iter()
                .filter(|a| a.kind == kind)
                .take(SHOWN_PER_KIND)
            {
                writeln!(
                    f,
                    "\n{} at {}/{}: {}\n{}",
                    kind.name(),
                    a.partition,
                    a.offset,
                    a.what,
                    a.context
                )?;
            }
        }
        Ok(())
    }
}

/// How many offsets either side of an anomaly its context shows.
const AROUND: u64 = 3;

/// Checks `history` against the replicas' logs `logs`; see [`Anomaly`].
pub fn check(history: &[Event], logs: &Final) -> Report {
    let mut found = Vec::new();
    let partitions: BTreeSet<Partition> = history
        .iter()
        .map(Event::partition)
        .chain(logs.values().flat_map(|ps| ps.keys().copied()))
        .collect();
    let empty = BTreeMap::new();
    let log_of = |replica: &u64, p: Partition| logs[replica].get(&p).unwrap_or(&empty);
    // Where each record is, on any replica: partition → rec → offsets.
    let mut anywhere: HashMap<(Partition, Rec), BTreeSet<Offset>> = HashMap::new();
    for ps in logs.values() {
        for (p, log) in ps {
            for (o, r) in log {
                anywhere.entry((*p, *r)).or_default().insert(*o);
            }
        }
    }
    let context = |p: Partition, o: Offset| -> String {
        let lo = o.saturating_sub(AROUND);
        let hi = o + AROUND;
        let mut s = String::new();
        for e in history {
            if e.partition() == p && e.offset().is_some_and(|x| (lo..=hi).contains(&x)) {
                s.push_str(&format!("    history: {e}\n"));
            }
        }
        for replica in logs.keys() {
            let around: Vec<String> = log_of(replica, p)
                .range(lo..=hi)
                .map(|(o, r)| format!("{o}={r}"))
                .collect();
            s.push_str(&format!(
                "    replica {replica}: {}\n",
                if around.is_empty() {
                    "(nothing)".to_string()
                } else {
                    around.join(" ")
                }
            ));
        }
        s
    };
    let mut add = |kind, p, o, what: String| {
        found.push(Found {
            kind,
            partition: p,
            offset: o,
            what,
            context: context(p, o),
        })
    };

    // Acknowledged: on every replica at its offset.
    for e in history {
        if let Event::Ack {
            partition: p,
            offset: o,
            rec,
            ..
        } = e
        {
            if !anywhere.contains_key(&(*p, *rec)) {
                add(Anomaly::Lost, *p, *o, format!("{rec} is on no replica"));
                continue;
            }
            let misplaced: Vec<String> = logs
                .keys()
                .filter(|r| log_of(r, *p).get(o) != Some(rec))
                .map(|r| format!("replica {r}"))
                .collect();
            if !misplaced.is_empty() {
                add(
                    Anomaly::AckedElsewhere,
                    *p,
                    *o,
                    format!("{rec} is not at its offset on {}", misplaced.join(", ")),
                );
            }
        }
    }
    // Polled: on some replica (else it was visible before it was durable).
    let mut polled = 0;
    for e in history {
        if let Event::Polled {
            reader,
            partition: p,
            offset: o,
            rec,
            ..
        } = e
        {
            polled += 1;
            if !anywhere.contains_key(&(*p, *rec)) {
                add(
                    Anomaly::Premature,
                    *p,
                    *o,
                    format!("reader {reader} saw {rec}, which no replica holds"),
                );
            }
        }
    }
    // Within each replica's log: no record twice, each key's in order.
    for (replica, ps) in logs {
        for (p, log) in ps {
            let mut at: HashMap<Rec, Offset> = HashMap::new();
            let mut last_of_key: HashMap<u32, (Rec, Offset)> = HashMap::new();
            for (o, r) in log {
                if let Some(first) = at.insert(*r, *o) {
                    add(
                        Anomaly::Duplicated,
                        *p,
                        *o,
                        format!("{r} on replica {replica} at {first} and {o}"),
                    );
                }
                if let Some((prev, po)) = last_of_key.get(&r.key) {
                    if prev.seq > r.seq {
                        add(
                            Anomaly::Reordered,
                            *p,
                            *o,
                            format!("on replica {replica}, {r} at {o} after {prev} at {po}"),
                        );
                    }
                }
                last_of_key.insert(r.key, (*r, *o));
            }
        }
    }
    // Every observation of an offset names one record.
    let mut seen: BTreeMap<(Partition, Offset), BTreeMap<Rec, Vec<String>>> = BTreeMap::new();
    let mut note = |p: Partition, o: Offset, r: Rec, by: String| {
        seen.entry((p, o))
            .or_default()
            .entry(r)
            .or_default()
            .push(by)
    };
    for e in history {
        match e {
            Event::Ack {
                producer,
                partition,
                offset,
                rec,
            } => note(
                *partition,
                *offset,
                *rec,
                format!("producer {producer}'s ack"),
            ),
            Event::Polled {
                reader,
                partition,
                offset,
                rec,
                ..
            } => note(*partition, *offset, *rec, format!("reader {reader}'s poll")),
            Event::Assigned { .. } => {}
        }
    }
    for (replica, ps) in logs {
        for (p, log) in ps {
            for (o, r) in log {
                note(*p, *o, *r, format!("replica {replica}"));
            }
        }
    }
    for ((p, o), recs) in &seen {
        if recs.len() > 1 {
            let what: Vec<String> = recs
                .iter()
                .map(|(r, by)| format!("{r} (by {})", by.join(", ")))
                .collect();
            add(
                Anomaly::InconsistentOffset,
                *p,
                *o,
                format!("{} records: {}", recs.len(), what.join("; ")),
            );
        }
    }
    // Runs of polls: forward only, over nothing the log holds.
    let union: BTreeMap<Partition, BTreeSet<Offset>> = partitions
        .iter()
        .map(|p| {
            let offsets = logs
                .keys()
                .flat_map(|r| log_of(r, *p).keys().copied())
                .collect();
            (*p, offsets)
        })
        .collect();
    // (reader, run, partition) → (where the run started, its last offset).
    type Run = (Option<Offset>, Option<Offset>);
    let mut runs: BTreeMap<(u32, u32, Partition), Run> = BTreeMap::new();
    for e in history {
        match e {
            Event::Assigned {
                reader,
                run,
                partition,
                from,
            } => {
                runs.insert((*reader, *run, *partition), (*from, None));
            }
            Event::Polled {
                reader,
                run,
                partition: p,
                offset: o,
                ..
            } => {
                let (from, last) = runs.entry((*reader, *run, *p)).or_insert((None, None));
                match *last {
                    Some(l) if *o <= l => add(
                        Anomaly::NonMonotonicPoll,
                        *p,
                        *o,
                        format!("reader {reader} run {run} polled {o} after {l}"),
                    ),
                    _ => {
                        // What the run passed over: after the last poll,
                        // or from where the run started.
                        let start = match (*last, *from) {
                            (Some(l), _) => Some(l + 1),
                            (None, f) => f,
                        };
                        if let Some(s) = start {
                            let skipped: Vec<Offset> =
                                union[p].range(s..*o).copied().take(5).collect();
                            if !skipped.is_empty() {
                                add(
                                    Anomaly::PollSkip,
                                    *p,
                                    *o,
                                    format!(
                                        "reader {reader} run {run} went from {s} to {o} over {skipped:?}"
                                    ),
                                );
                            }
                        }
                        *last = Some(*o);
                    }
                }
            }
            Event::Ack { .. } => {}
        }
    }
    // Replicas: the same log.
    for p in &partitions {
        let mut replicas = logs.keys();
        let Some(first) = replicas.next() else { break };
        for other in replicas {
            let (a, b) = (log_of(first, *p), log_of(other, *p));
            let differ = a
                .iter()
                .zip(b.iter())
                .find(|(x, y)| x != y)
                .map(|((o, _), _)| *o)
                .or_else(|| {
                    (a.len() != b.len()).then(|| {
                        a.keys()
                            .nth(a.len().min(b.len()))
                            .or_else(|| b.keys().nth(a.len().min(b.len())))
                            .copied()
                            .unwrap_or(0)
                    })
                });
            if let Some(o) = differ {
                add(
                    Anomaly::DivergentReplicas,
                    *p,
                    o,
                    format!(
                        "replicas {first} ({} records) and {other} ({} records) differ from {o}",
                        a.len(),
                        b.len()
                    ),
                );
            }
        }
    }

    found.sort_by_key(|f| (f.kind, f.partition, f.offset));
    Report {
        acked: history
            .iter()
            .filter(|e| matches!(e, Event::Ack { .. }))
            .count(),
        polled,
        logged: partitions
            .iter()
            .map(|p| logs.keys().map(|r| log_of(r, *p).len()).max().unwrap_or(0))
            .sum(),
        found,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(key: u32, seq: u64) -> Rec {
        Rec { key, seq }
    }

    fn ack(partition: Partition, offset: Offset, r: Rec) -> Event {
        Event::Ack {
            producer: 0,
            partition,
            offset,
            rec: r,
        }
    }

    fn polled(run: u32, partition: Partition, offset: Offset, r: Rec) -> Event {
        Event::Polled {
            reader: 7,
            run,
            partition,
            offset,
            rec: r,
        }
    }

    fn assigned(run: u32, partition: Partition, from: Option<Offset>) -> Event {
        Event::Assigned {
            reader: 7,
            run,
            partition,
            from,
        }
    }

    /// Partition 0 holding `recs` at offsets 0.. on replicas 1, 2, 3.
    fn logs(recs: &[Rec]) -> Final {
        let log: BTreeMap<Offset, Rec> = recs
            .iter()
            .enumerate()
            .map(|(o, r)| (o as u64, *r))
            .collect();
        (1..=3)
            .map(|n| (n, BTreeMap::from([(0, log.clone())])))
            .collect()
    }

    /// Three records of key 1 acknowledged, the log holding them, a reader
    /// polling them all from 0.
    fn clean() -> (Vec<Event>, Final) {
        let recs = [rec(1, 0), rec(1, 1), rec(1, 2)];
        let mut h: Vec<Event> = recs
            .iter()
            .enumerate()
            .map(|(o, r)| ack(0, o as u64, *r))
            .collect();
        h.push(assigned(0, 0, Some(0)));
        h.extend(
            recs.iter()
                .enumerate()
                .map(|(o, r)| polled(0, 0, o as u64, *r)),
        );
        (h, logs(&recs))
    }

    fn only(report: &Report, kind: Anomaly) {
        assert!(report.count(kind) > 0, "{kind:?} not found:\n{report}");
        for other in Anomaly::ALL {
            if other != kind {
                assert_eq!(report.count(other), 0, "{other:?} too:\n{report}");
            }
        }
    }

    #[test]
    fn a_clean_history_is_clean() {
        let (h, l) = clean();
        let r = check(&h, &l);
        r.assert_clean();
        assert_eq!((r.acked, r.polled, r.logged), (3, 3, 3));
        assert_eq!(Rec::parse(rec(4, 9).encode().as_bytes()), Some(rec(4, 9)));
        assert_eq!(Rec::parse(b"nope"), None);
    }

    #[test]
    fn an_acknowledged_record_missing_everywhere_is_lost() {
        let (mut h, l) = clean();
        h.push(ack(0, 3, rec(1, 3)));
        let r = check(&h, &l);
        only(&r, Anomaly::Lost);
        assert!(r.to_string().contains("producer 0 acked 1:3 at 0/3"), "{r}");
    }

    #[test]
    fn a_polled_record_no_replica_holds_was_premature() {
        let (mut h, l) = clean();
        h.push(polled(0, 0, 3, rec(1, 3)));
        only(&check(&h, &l), Anomaly::Premature);
    }

    #[test]
    fn a_record_twice_in_a_log_is_duplicated() {
        let recs = [rec(1, 0), rec(1, 1), rec(1, 1), rec(1, 2)];
        let r = check(&[], &logs(&recs));
        only(&r, Anomaly::Duplicated);
        assert_eq!(r.count(Anomaly::Duplicated), 3, "once per replica");
    }

    #[test]
    fn a_key_out_of_order_is_reordered() {
        let recs = [rec(1, 0), rec(1, 2), rec(1, 1), rec(2, 0)];
        only(&check(&[], &logs(&recs)), Anomaly::Reordered);
    }

    #[test]
    fn two_records_at_one_offset_are_inconsistent() {
        let (mut h, l) = clean();
        // A reader saw another record at offset 1, which the log holds at 3.
        let mut l2 = l.clone();
        for ps in l2.values_mut() {
            ps.get_mut(&0).unwrap().insert(3, rec(2, 0));
        }
        h.push(assigned(1, 0, Some(1)));
        h.push(polled(1, 0, 1, rec(2, 0)));
        let r = check(&h, &l2);
        only(&r, Anomaly::InconsistentOffset);
        assert!(r.to_string().contains("reader 7's poll"), "{r}");
    }

    #[test]
    fn an_ack_naming_another_offset_than_the_log_is_found() {
        let (mut h, l) = clean();
        h[1] = ack(0, 5, rec(1, 1));
        let r = check(&h, &l);
        assert!(r.count(Anomaly::AckedElsewhere) > 0, "{r}");
        assert!(r.count(Anomaly::Lost) == 0, "{r}");
    }

    #[test]
    fn a_run_of_polls_that_jumps_over_the_log_skips() {
        let (mut h, l) = clean();
        h.retain(|e| !matches!(e, Event::Polled { offset: 1, .. }));
        only(&check(&h, &l), Anomaly::PollSkip);
        // From a known start: the first poll must be the first record.
        let (mut h, l) = clean();
        h.retain(|e| !matches!(e, Event::Polled { offset: 0, .. }));
        only(&check(&h, &l), Anomaly::PollSkip);
        // A new run from where the reader seeks skips nothing.
        let (mut h, l) = clean();
        h.push(assigned(1, 0, Some(2)));
        h.push(polled(1, 0, 2, rec(1, 2)));
        check(&h, &l).assert_clean();
    }

    #[test]
    fn a_run_of_polls_that_goes_back_is_non_monotonic() {
        let (mut h, l) = clean();
        h.push(polled(0, 0, 1, rec(1, 1)));
        only(&check(&h, &l), Anomaly::NonMonotonicPoll);
    }

    #[test]
    fn replicas_that_differ_or_end_apart_diverge() {
        let recs = [rec(1, 0), rec(1, 1)];
        let mut l = logs(&recs);
        l.get_mut(&2).unwrap().get_mut(&0).unwrap().remove(&1);
        let r = check(&[], &l);
        only(&r, Anomaly::DivergentReplicas);
        assert!(r
            .to_string()
            .contains("replicas 1 (2 records) and 2 (1 records)"));
        let mut l = logs(&recs);
        l.get_mut(&3)
            .unwrap()
            .get_mut(&0)
            .unwrap()
            .insert(1, rec(5, 0));
        let r = check(&[], &l);
        assert!(r.count(Anomaly::DivergentReplicas) > 0, "{r}");
        assert!(r.count(Anomaly::InconsistentOffset) > 0, "{r}");
    }
}
