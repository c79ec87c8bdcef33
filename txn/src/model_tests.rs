//! The coordinator under random requests from current and zombie
//! producers, markers completing in any order, timeouts and restarts
//! (a replay of every record stored so far). Checked after every step:
//! a zombie's write is never accepted; every record survives its codec;
//! the markers of a transaction name exactly the partitions added to it;
//! a replay of the records rebuilds the same state.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use crate::coordinator::*;
use crate::records;

#[derive(Debug, Clone)]
enum Op {
    Init { id: u8, v2: bool, expect: bool },
    Add { id: u8, who: u8, parts: Vec<u8> },
    End { id: u8, who: u8, commit: bool },
    MarkersDone { which: u8 },
    Tick { ms: u16 },
    Abort { id: u8 },
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3u8, any::<bool>(), any::<bool>()).prop_map(|(id, v2, expect)| Op::Init {
            id,
            v2,
            expect
        }),
        (0..3u8, 0..4u8, prop::collection::vec(0..4u8, 1..3))
            .prop_map(|(id, who, parts)| Op::Add { id, who, parts }),
        (0..3u8, 0..4u8, any::<bool>()).prop_map(|(id, who, commit)| Op::End { id, who, commit }),
        (0..4u8).prop_map(|which| Op::MarkersDone { which }),
        (0..3000u16).prop_map(|ms| Op::Tick { ms }),
        (0..3u8).prop_map(|id| Op::Abort { id }),
        Just(Op::Restart),
    ]
}

struct Model {
    c: Transactions,
    log: Vec<Record>,
    pending: Vec<Markers>,
    /// Producer (id, epoch) pairs each transactional id handed out, newest
    /// last: the clients, current and zombies.
    given: BTreeMap<String, Vec<(i64, i16)>>,
    /// Partitions added to each id's open transaction, as the model saw.
    added: BTreeMap<String, BTreeSet<Tp>>,
    now: i64,
    next_pid: i64,
    /// The protocol each id's client speaks.
    versions: BTreeMap<String, TransactionVersion>,
}

impl Model {
    fn keep<T>(&mut self, s: &Step<T>) {
        if let Some(r) = &s.record {
            let (k, v) = records::encode(r);
            let back = records::decode(&k, v.as_deref()).expect("decodes");
            assert_eq!(&back, r, "the codec keeps the record");
            self.log.push(r.clone());
        }
        if let Some(m) = &s.markers {
            let added = self.added.remove(&m.transactional_id).unwrap_or_default();
            let named: BTreeSet<Tp> = m.partitions.iter().cloned().collect();
            assert_eq!(named, added, "markers name the transaction's partitions");
            self.pending.push(m.clone());
        }
    }

    /// A client of `id`: the `who`-th newest producer it handed out (0:
    /// the current one, others: zombies).
    fn client(&self, id: &str, who: u8) -> Option<(i64, i16)> {
        self.given
            .get(id)
            .and_then(|g| g.iter().rev().nth(who as usize))
            .copied()
    }

    /// The protocol `id`'s client speaks (that of its last init).
    fn version(&self, id: &str) -> TransactionVersion {
        self.versions
            .get(id)
            .copied()
            .unwrap_or(TransactionVersion::V1)
    }

    fn current(&self, id: &str) -> Option<(i64, i16)> {
        self.c.get(id).map(|m| (m.producer_id, m.producer_epoch))
    }
}

fn run(ops: Vec<Op>) {
    let config = TxnConfig {
        max_timeout_ms: 10_000,
        id_expiration_ms: 20_000,
    };
    let mut m = Model {
        c: Transactions::new(config),
        log: Vec::new(),
        pending: Vec::new(),
        given: BTreeMap::new(),
        added: BTreeMap::new(),
        now: 0,
        next_pid: 100,
        versions: BTreeMap::new(),
    };
    for op in ops {
        let mut next_pid = m.next_pid;
        let mut alloc = || {
            next_pid += 1;
            next_pid
        };
        match op {
            Op::Init { id, v2, expect } => {
                let id = format!("t{id}");
                let v = if v2 {
                    TransactionVersion::V2
                } else {
                    TransactionVersion::V1
                };
                let expected = if expect { m.current(&id) } else { None };
                let was_ongoing = m.c.get(&id).is_some_and(|t| t.state == TxnState::Ongoing);
                let before = m.current(&id);
                let s =
                    m.c.init_producer_id(&id, 5_000, expected, v, m.now, &mut alloc);
                m.versions.insert(id.clone(), v);
                if was_ongoing {
                    let mk = s.markers.as_ref().expect("an open transaction is aborted");
                    assert!(!mk.commit);
                    assert!(mk.producer_epoch > before.unwrap().1, "the abort fences");
                }
                m.keep(&s);
                if let Ok(pair) = s.answer {
                    m.given.entry(id.clone()).or_default().push(pair);
                }
            }
            Op::Add { id, who, parts } => {
                let id = format!("t{id}");
                let Some(pair) = m.client(&id, who) else {
                    continue;
                };
                let before = m.current(&id);
                let parts: Vec<Tp> = parts
                    .iter()
                    .map(|p| ("out".to_string(), *p as u32))
                    .collect();
                let v = m.version(&id);
                let s = m.c.add_partitions(&id, pair.0, pair.1, &parts, v, m.now);
                if s.answer.is_ok() {
                    assert_eq!(Some(pair), before, "only the current producer adds");
                    m.added.entry(id.clone()).or_default().extend(parts);
                }
                m.keep(&s);
            }
            Op::End { id, who, commit } => {
                let id = format!("t{id}");
                let Some(pair) = m.client(&id, who) else {
                    continue;
                };
                let was_ongoing = m.c.get(&id).is_some_and(|t| t.state == TxnState::Ongoing);
                let before = m.current(&id);
                let v = m.version(&id);
                let s = m.c.end_txn(&id, pair, commit, v, m.now, &mut alloc);
                if let Some(mk) = &s.markers {
                    assert!(
                        was_ongoing && Some(pair) == before,
                        "only the current producer ends"
                    );
                    if m.c.get(&id).unwrap().version == TransactionVersion::V2 {
                        assert!(mk.producer_epoch > pair.1, "a v2 end bumps the epoch");
                    }
                }
                m.keep(&s);
                if let Ok(p) = s.answer {
                    let g = m.given.entry(id.clone()).or_default();
                    if g.last() != Some(&p) {
                        g.push(p);
                    }
                }
            }
            Op::MarkersDone { which } => {
                if m.pending.is_empty() {
                    continue;
                }
                let mk = m.pending.remove(which as usize % m.pending.len());
                if let Some(r) = m.c.markers_written(&mk, m.now) {
                    let state = r.1.as_ref().unwrap().state;
                    assert!(matches!(
                        state,
                        TxnState::CompleteCommit | TxnState::CompleteAbort
                    ));
                    m.log.push(r);
                }
            }
            Op::Tick { ms } => {
                m.now += i64::from(ms);
                for s in m.c.expire(m.now, &mut alloc) {
                    if let Some((id, None)) = &s.record {
                        m.given.remove(id);
                    }
                    m.keep(&s);
                }
            }
            Op::Abort { id } => {
                let id = format!("t{id}");
                let was_ongoing = m.c.get(&id).is_some_and(|t| t.state == TxnState::Ongoing);
                let before = m.current(&id);
                let s = m.c.abort(&id, m.now, &mut alloc);
                assert_eq!(s.answer.is_ok(), was_ongoing, "only an open transaction");
                if let Some(mk) = &s.markers {
                    assert!(!mk.commit);
                    assert!(mk.producer_epoch > before.unwrap().1, "the abort fences");
                }
                m.keep(&s);
                if let Ok(p) = s.answer {
                    m.given.entry(id.clone()).or_default().push(p);
                }
            }
            Op::Restart => {
                let mut fresh = Transactions::new(config);
                for r in &m.log {
                    fresh.replay(r.clone());
                }
                assert_eq!(fresh, m.c, "a replay rebuilds the state");
                // The new host writes the prepared transactions' markers.
                m.pending = fresh.pending_markers();
                m.c = fresh;
            }
        }
        m.next_pid = next_pid;
        for t in m.c.all() {
            assert!(t.producer_epoch >= 0);
            if t.state == TxnState::Ongoing {
                assert!(!t.partitions.is_empty());
            }
            if !matches!(t.state, TxnState::Ongoing) {
                m.added.remove(&t.transactional_id);
            }
        }
    }
    let mut fresh = Transactions::new(config);
    for r in &m.log {
        fresh.replay(r.clone());
    }
    assert_eq!(fresh, m.c, "a replay rebuilds the state");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn the_coordinator_holds_its_rules_under_random_requests(ops in prop::collection::vec(op(), 1..80)) {
        run(ops);
    }
}
