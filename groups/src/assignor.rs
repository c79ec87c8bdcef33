//! Partition assignors of consumer groups: `range`, `roundrobin` and
//! `cooperative-sticky`. Pure functions from the members' subscriptions
//! (and, for the sticky one, the previous assignment) to a target
//! assignment; the group coordinator runs them on its core.
//!
//! Every assignor gives each partition of the subscribed topics to exactly
//! one member that subscribes to its topic. With more members than
//! partitions the extra members get nothing (they stay idle until a member
//! leaves).

use std::collections::{BTreeMap, BTreeSet};

/// A partition: (topic, index).
pub type Tp = (String, u32);
/// Member id → its partitions.
pub type Assignment = BTreeMap<String, BTreeSet<Tp>>;

/// Which assignor a group uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignor {
    /// Kafka's `range`: per topic, contiguous ranges of partitions to the
    /// subscribing members in id order. Eager.
    Range,
    /// Kafka's `roundrobin`: all partitions in order dealt to the members in
    /// id order. Eager.
    RoundRobin,
    /// Kafka's `cooperative-sticky`: balanced, keeping every partition
    /// with its current owner when the balance allows; only partitions
    /// that must move are revoked.
    CooperativeSticky,
}

impl Assignor {
    /// Parses the name a client sends.
    pub fn parse(name: &str) -> Option<Assignor> {
        match name {
            "range" => Some(Assignor::Range),
            "roundrobin" => Some(Assignor::RoundRobin),
            "cooperative-sticky" => Some(Assignor::CooperativeSticky),
            _ => None,
        }
    }

    /// The name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Assignor::Range => "range",
            Assignor::RoundRobin => "roundrobin",
            Assignor::CooperativeSticky => "cooperative-sticky",
        }
    }

    /// Computes the target assignment. `subscriptions` maps each member to
    /// its topics, `partitions` each subscribed topic to its partition
    /// count (topics missing from it are skipped), `previous` is the
    /// current assignment (used by the sticky assignor only).
    pub fn assign(
        self,
        subscriptions: &BTreeMap<String, BTreeSet<String>>,
        partitions: &BTreeMap<String, u32>,
        previous: &Assignment,
    ) -> Assignment {
        let mut out: Assignment = subscriptions
            .keys()
            .map(|m| (m.clone(), BTreeSet::new()))
            .collect();
        match self {
            Assignor::Range => {
                for (topic, &count) in partitions {
                    let members: Vec<&String> = subscriptions
                        .iter()
                        .filter(|(_, t)| t.contains(topic))
                        .map(|(m, _)| m)
                        .collect();
                    if members.is_empty() {
                        continue;
                    }
                    let n = members.len() as u32;
                    let (each, extra) = (count / n, count % n);
                    let mut next = 0;
                    for (i, m) in members.iter().enumerate() {
                        let take = each + u32::from((i as u32) < extra);
                        let set = out.get_mut(*m).expect("every member has an entry");
                        for p in next..next + take {
                            set.insert((topic.clone(), p));
                        }
                        next += take;
                    }
                }
            }
            Assignor::RoundRobin => {
                let members: Vec<&String> = subscriptions.keys().collect();
                let mut turn = 0usize;
                for (topic, &count) in partitions {
                    for p in 0..count {
                        // The next member (cyclically) that subscribes.
                        for k in 0..members.len() {
                            let m = members[(turn + k) % members.len()];
                            if subscriptions[m].contains(topic) {
                                out.get_mut(m)
                                    .expect("every member has an entry")
                                    .insert((topic.clone(), p));
                                turn = (turn + k + 1) % members.len();
                                break;
                            }
                        }
                    }
                }
            }
            Assignor::CooperativeSticky => sticky(subscriptions, partitions, previous, &mut out),
        }
        out
    }

    /// Whether members revoke everything they own on every rebalance
    /// (`range`, `roundrobin`) rather than only what moves.
    pub fn is_eager(self) -> bool {
        !matches!(self, Assignor::CooperativeSticky)
    }
}

/// The sticky assignment: every member keeps what it had (if it still
/// subscribes and the partition exists) up to its quota; the rest goes to
/// the least-loaded subscribers.
fn sticky(
    subscriptions: &BTreeMap<String, BTreeSet<String>>,
    partitions: &BTreeMap<String, u32>,
    previous: &Assignment,
    out: &mut Assignment,
) {
    let all: BTreeSet<Tp> = partitions
        .iter()
        .filter(|(t, _)| subscriptions.values().any(|s| s.contains(*t)))
        .flat_map(|(t, &n)| (0..n).map(move |p| (t.clone(), p)))
        .collect();
    let members = subscriptions.len();
    if members == 0 {
        return;
    }
    // Quotas: `floor` each, and `extra` members may hold one more.
    let floor = all.len() / members;
    let mut extra = all.len() % members;
    // Members that had the most keep the most (fewest moves).
    let mut order: Vec<&String> = subscriptions.keys().collect();
    let had = |m: &String| previous.get(m).map_or(0, |s| s.len());
    order.sort_by(|a, b| had(b).cmp(&had(a)).then(a.cmp(b)));
    let mut taken: BTreeSet<Tp> = BTreeSet::new();
    for m in &order {
        let quota = if extra > 0 && had(m) > floor {
            extra -= 1;
            floor + 1
        } else {
            floor
        };
        let set = out.get_mut(*m).expect("every member has an entry");
        if let Some(prev) = previous.get(*m) {
            for tp in prev {
                if set.len() >= quota {
                    break;
                }
                if all.contains(tp) && subscriptions[*m].contains(&tp.0) && taken.insert(tp.clone())
                {
                    set.insert(tp.clone());
                }
            }
        }
    }
    // The rest, each to the least-loaded member that subscribes to it.
    for tp in &all {
        if taken.contains(tp) {
            continue;
        }
        let best = out
            .iter()
            .filter(|(m, _)| subscriptions[*m].contains(&tp.0))
            .min_by(|(a, sa), (b, sb)| sa.len().cmp(&sb.len()).then(a.cmp(b)))
            .map(|(m, _)| m.clone());
        if let Some(m) = best {
            out.get_mut(&m)
                .expect("every member has an entry")
                .insert(tp.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subs(members: &[&str], topics: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
        members
            .iter()
            .map(|m| {
                (
                    m.to_string(),
                    topics.iter().map(|t| t.to_string()).collect(),
                )
            })
            .collect()
    }

    fn counts(a: &Assignment) -> Vec<usize> {
        a.values().map(|s| s.len()).collect()
    }

    fn covers_once(a: &Assignment, topic: &str, n: u32) {
        let mut seen = BTreeSet::new();
        for s in a.values() {
            for tp in s {
                assert!(seen.insert(tp.clone()), "{tp:?} twice");
            }
        }
        let want: BTreeSet<Tp> = (0..n).map(|p| (topic.to_string(), p)).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn three_members_split_six_partitions_with_every_assignor() {
        let s = subs(&["a", "b", "c"], &["t"]);
        let parts = BTreeMap::from([("t".to_string(), 6)]);
        for a in [
            Assignor::Range,
            Assignor::RoundRobin,
            Assignor::CooperativeSticky,
        ] {
            let got = a.assign(&s, &parts, &Assignment::new());
            covers_once(&got, "t", 6);
            assert_eq!(counts(&got), vec![2, 2, 2], "{a:?}");
        }
        let r = Assignor::Range.assign(&s, &parts, &Assignment::new());
        assert_eq!(
            r["a"],
            BTreeSet::from([("t".to_string(), 0), ("t".to_string(), 1)])
        );
    }

    #[test]
    fn more_members_than_partitions_leaves_members_idle() {
        let s = subs(&["a", "b", "c", "d"], &["t"]);
        let parts = BTreeMap::from([("t".to_string(), 3)]);
        for a in [
            Assignor::Range,
            Assignor::RoundRobin,
            Assignor::CooperativeSticky,
        ] {
            let got = a.assign(&s, &parts, &Assignment::new());
            covers_once(&got, "t", 3);
            assert_eq!(got.values().filter(|s| s.is_empty()).count(), 1, "{a:?}");
        }
    }

    #[test]
    fn sticky_moves_only_what_must_move() {
        let parts = BTreeMap::from([("t".to_string(), 6)]);
        let two = Assignor::CooperativeSticky.assign(
            &subs(&["a", "b"], &["t"]),
            &parts,
            &Assignment::new(),
        );
        let three =
            Assignor::CooperativeSticky.assign(&subs(&["a", "b", "c"], &["t"]), &parts, &two);
        covers_once(&three, "t", 6);
        assert_eq!(counts(&three), vec![2, 2, 2]);
        // a and b each gave up exactly one partition; the rest stayed.
        for m in ["a", "b"] {
            assert_eq!(three[m].difference(&two[m]).count(), 0);
            assert_eq!(two[m].difference(&three[m]).count(), 1);
        }
        // A member leaving: the survivors keep theirs and split the rest.
        let mut s2 = subs(&["a", "b", "c"], &["t"]);
        s2.remove("b");
        let after = Assignor::CooperativeSticky.assign(&s2, &parts, &three);
        covers_once(&after, "t", 6);
        assert!(three["a"].is_subset(&after["a"]));
        assert!(three["c"].is_subset(&after["c"]));
    }

    #[test]
    fn members_only_get_topics_they_subscribe_to() {
        let mut s = subs(&["a"], &["x"]);
        s.insert("b".into(), BTreeSet::from(["y".to_string()]));
        let parts = BTreeMap::from([("x".to_string(), 2), ("y".to_string(), 2)]);
        for a in [
            Assignor::Range,
            Assignor::RoundRobin,
            Assignor::CooperativeSticky,
        ] {
            let got = a.assign(&s, &parts, &Assignment::new());
            assert!(got["a"].iter().all(|(t, _)| t == "x"), "{a:?}");
            assert!(got["b"].iter().all(|(t, _)| t == "y"), "{a:?}");
            assert_eq!(counts(&got), vec![2, 2]);
        }
    }
}
