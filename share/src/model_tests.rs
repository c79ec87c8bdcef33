//! A simulation of one share partition: members acquire from a growing
//! log, acknowledge (well and badly), let locks expire, leave; the
//! partition is restored from its durable record now and then (a new
//! leader). Checked after every step against a model of what each
//! member holds: no record is held by two members, none accepted is
//! delivered again, no delivery goes past the limit, nothing below the
//! start offset is still owed; and at the end, once members accept
//! everything, every record was accepted exactly once or archived.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use proptest::prelude::*;

use crate::partition::{
    AckBatch, AckType, AcquireMode, Acquired, LogBatch, RecordState, ShareConfig, SharePartition,
};
use crate::records;

#[derive(Debug, Clone)]
enum Op {
    /// The log grows by a batch of `n` records (a control batch if `control`).
    Append { n: u8, control: bool },
    /// Member `who` acquires up to `max` records, sent the first `take`
    /// batches from the window's start (a fetch's byte budget).
    Acquire {
        who: u8,
        max: u8,
        take: u8,
        strict: bool,
    },
    /// Member `who` acknowledges its `k`-th held range (or an arbitrary
    /// range, which may be refused) with `t`.
    Ack {
        who: u8,
        k: u8,
        t: u8,
        arbitrary: Option<(u8, u8)>,
    },
    /// Time passes.
    Tick { ms: u16 },
    /// Member `who` leaves.
    Leave { who: u8 },
    /// The partition is restored from its stored record.
    Restore,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u8..20, prop::bool::weighted(0.1)).prop_map(|(n, control)| Op::Append { n, control }),
        4 => (0u8..3, 1u8..30, 1u8..8, any::<bool>()).prop_map(|(who, max, take, strict)| Op::Acquire {
            who,
            max,
            take,
            strict
        }),
        5 => (0u8..3, any::<u8>(), 0u8..5, prop::option::weighted(0.15, (0u8..60, 0u8..10)))
            .prop_map(|(who, k, t, arbitrary)| Op::Ack { who, k, t, arbitrary }),
        1 => (1u16..300).prop_map(|ms| Op::Tick { ms }),
        1 => (0u8..3).prop_map(|who| Op::Leave { who }),
        1 => Just(Op::Restore),
    ]
}

struct Model {
    p: SharePartition,
    log: Vec<LogBatch>,
    log_end: u64,
    /// What each member holds now: offset → lock deadline.
    held: BTreeMap<u8, BTreeMap<u64, i64>>,
    accepted: BTreeSet<u64>,
    /// Offsets a member rejected (or acknowledged as a gap).
    rejected: BTreeSet<u64>,
    /// The highest delivery count each offset was acquired with.
    deliveries: BTreeMap<u64, u16>,
    now: i64,
    config: ShareConfig,
}

impl Model {
    fn member(who: u8) -> Rc<str> {
        Rc::from(format!("m{who}").as_str())
    }

    fn check(&self) {
        // No offset held twice; held offsets are Acquired in the window.
        let mut all = BTreeSet::new();
        for offs in self.held.values() {
            for o in offs.keys() {
                assert!(all.insert(*o), "offset {o} held by two members");
                assert_eq!(
                    self.p.state_of(*o).map(|s| s.0),
                    Some(RecordState::Acquired),
                    "held offset {o}"
                );
            }
        }
        assert_eq!(all.len(), self.p.acquired());
        assert!(self.p.end() - self.p.start() <= self.config.max_in_flight as u64);
        assert!(self.p.end() <= self.log_end);
    }

    fn acquired(&mut self, who: u8, got: &[Acquired], sent: &[LogBatch]) {
        let deadline = self.now + self.config.lock_ms;
        for a in got {
            assert!(a.delivery_count >= 1 && a.delivery_count <= self.config.delivery_limit);
            for o in a.first..=a.last {
                assert!(
                    sent.iter().any(|b| b.base <= o && o <= b.last),
                    "offset {o} acquired without its batch sent"
                );
                assert!(
                    !self.accepted.contains(&o),
                    "accepted offset {o} delivered again"
                );
                let control = self
                    .log
                    .iter()
                    .any(|b| b.control && b.base <= o && o <= b.last);
                assert!(!control, "control offset {o} delivered");
                let d = self.deliveries.entry(o).or_default();
                assert!(
                    a.delivery_count > *d,
                    "offset {o}: delivery counts only grow"
                );
                *d = a.delivery_count;
                self.held.entry(who).or_default().insert(o, deadline);
            }
        }
    }
}

fn run(ops: Vec<Op>) {
    let config = ShareConfig {
        lock_ms: 500,
        delivery_limit: 3,
        max_in_flight: 40,
    };
    let mut m = Model {
        p: SharePartition::new(0, config),
        log: Vec::new(),
        log_end: 0,
        held: BTreeMap::new(),
        accepted: BTreeSet::new(),
        rejected: BTreeSet::new(),
        deliveries: BTreeMap::new(),
        now: 0,
        config,
    };
    for op in ops {
        match op {
            Op::Append { n, control } => {
                let base = m.log_end;
                let last = base + if control { 0 } else { u64::from(n) - 1 };
                m.log.push(LogBatch {
                    base,
                    last,
                    control,
                });
                m.log_end = last + 1;
            }
            Op::Acquire {
                who,
                max,
                take,
                strict,
            } => {
                // The batches a fetch would send: from the window's start
                // (its Available records) on, as many as its budget takes.
                let from = m.p.start();
                let batches: Vec<LogBatch> = m
                    .log
                    .iter()
                    .filter(|b| b.last >= from)
                    .take(take as usize)
                    .copied()
                    .collect();
                let mode = if strict {
                    AcquireMode::RecordLimit
                } else {
                    AcquireMode::BatchOptimized
                };
                let got =
                    m.p.acquire_in(&Model::member(who), &batches, max as usize, mode, m.now);
                if strict {
                    let n: u64 = got.iter().map(|a| a.last - a.first + 1).sum();
                    assert!(n <= u64::from(max), "{n} acquired, {max} asked");
                }
                m.acquired(who, &got, &batches);
            }
            Op::Ack {
                who,
                k,
                t,
                arbitrary,
            } => {
                let t = AckType::from_byte(t).unwrap();
                let held = m.held.entry(who).or_default();
                let (first, last) = match arbitrary {
                    Some((a, len)) => (u64::from(a), u64::from(a) + u64::from(len)),
                    None => {
                        if held.is_empty() {
                            continue;
                        }
                        let o = *held.keys().nth(k as usize % held.len()).unwrap();
                        (o, o)
                    }
                };
                let valid = (first..=last).all(|o| held.get(&o).is_some_and(|d| *d > m.now));
                let ack = AckBatch {
                    first,
                    last,
                    types: vec![t],
                };
                let r = m.p.acknowledge(&format!("m{who}"), &[ack], m.now);
                assert_eq!(r.is_ok(), valid, "{first}..={last} {t:?}: {r:?}");
                if valid && t != AckType::Renew {
                    for o in first..=last {
                        held.remove(&o);
                        if t == AckType::Accept {
                            assert!(m.accepted.insert(o), "offset {o} accepted twice");
                        }
                        if matches!(t, AckType::Reject | AckType::Gap) {
                            m.rejected.insert(o);
                        }
                    }
                } else if valid {
                    for o in first..=last {
                        held.insert(o, m.now + m.config.lock_ms);
                    }
                }
            }
            Op::Tick { ms } => {
                m.now += i64::from(ms);
                m.p.expire(m.now);
                let now = m.now;
                for offs in m.held.values_mut() {
                    offs.retain(|_, d| *d > now);
                }
            }
            Op::Leave { who } => {
                m.p.release_member(&format!("m{who}"));
                m.held.remove(&who);
            }
            Op::Restore => {
                let bytes = records::encode_value(&m.p.snapshot());
                let snap = records::decode_value(&bytes).unwrap();
                m.p = SharePartition::restore(&snap, config).unwrap();
                m.held.clear();
            }
        }
        m.check();
    }
    // Drain: everyone leaves, one member accepts everything left.
    for who in 0..3 {
        m.p.release_member(&format!("m{who}"));
    }
    m.held.clear();
    let drainer = Model::member(9);
    for _ in 0..10_000 {
        let from = m.p.start();
        let batches: Vec<LogBatch> = m.log.iter().filter(|b| b.last >= from).copied().collect();
        let got = m.p.acquire(&drainer, &batches, 50, m.now);
        if got.is_empty() {
            break;
        }
        m.acquired(9, &got, &batches);
        let acks: Vec<AckBatch> = got
            .iter()
            .map(|a| AckBatch {
                first: a.first,
                last: a.last,
                types: vec![AckType::Accept],
            })
            .collect();
        m.p.acknowledge("m9", &acks, m.now).unwrap();
        for a in &got {
            for o in a.first..=a.last {
                assert!(m.accepted.insert(o), "offset {o} accepted twice");
            }
        }
        m.held.clear();
    }
    assert_eq!(m.p.start(), m.log_end, "everything done");
    // Every data record was accepted exactly once, or archived (rejected,
    // a gap, or its delivery limit reached) — never lost in between.
    for b in m.log.iter().filter(|b| !b.control) {
        for o in b.base..=b.last {
            let accepted = m.accepted.contains(&o);
            let archived =
                m.rejected.contains(&o) || m.deliveries.get(&o) == Some(&config.delivery_limit);
            assert!(
                accepted != archived || (accepted && archived && !m.rejected.contains(&o)),
                "offset {o}: accepted {accepted}, rejected {}, deliveries {:?}",
                m.rejected.contains(&o),
                m.deliveries.get(&o)
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, .. ProptestConfig::default() })]

    #[test]
    fn a_share_partition_never_delivers_twice_what_was_accepted(
        ops in prop::collection::vec(op(), 1..200)
    ) {
        run(ops);
    }
}
