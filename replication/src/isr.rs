//! The in-sync replicas and the high watermark of one replicated
//! partition, as its leader keeps them — sans-IO: time comes in as an
//! argument, ISR changes go out as [`Proposal`]s for the caller to send to
//! the controller, and a raised high watermark is returned for the caller
//! to answer the waits it passes. The broker's `replica/` does the I/O
//! (follower fetches over QUIC, the controller, `acks=all` waits).
//!
//! **High watermark:** the smallest fdatasync'd offset over the ISR, the
//! leader's own included (and a follower proposed back into the ISR, from
//! the proposal on: the controller may commit it before the leader hears
//! of it). It never goes down while the replica leads, so an acknowledged
//! or consumed record is on disk on every ISR member.
//!
//! **Shrinking:** a follower of the ISR that has not caught up with the
//! leader's log end for `replica.lag.time.max.ms`, or is behind and has
//! sent no fetch for the silence bound, is proposed out of it.
//!
//! **Expanding:** a follower out of the ISR that has fetched (and
//! fdatasync'd) everything up to the high watermark — and the floor set
//! when the partition gained replicas — is proposed back in.
//!
//! One proposal at a time: none is made while one is pending; a committed
//! ISR (from the metadata) or a refusal ends it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A follower's progress as its leader sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The next offset it asked for (its log end).
    pub fetch_offset: u64,
    /// Below this, its log is fdatasync'd.
    pub durable: u64,
    /// When it last had everything the leader had.
    pub caught_up: Instant,
    /// The leader's log end at its previous fetch.
    last_fetch_leo: u64,
    /// When it last fetched.
    pub last_fetch_at: Instant,
}

/// When a follower leaves the ISR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LagBounds {
    /// Not caught up for this long (`replica.lag.time.max.ms`).
    pub lag: Duration,
    /// Behind and no fetch for this long (`None`: not checked).
    pub silence: Option<Duration>,
}

/// An ISR change for the controller (`AlterPartition`): from the ISR the
/// leader knows to the new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// The ISR now.
    pub from: Vec<u64>,
    /// The ISR proposed.
    pub isr: Vec<u64>,
}

/// The ISR and high watermark of one partition on one node.
#[derive(Debug, Clone)]
pub struct Isr {
    /// This node.
    me: u64,
    /// The in-sync replicas (nodes), as the metadata says.
    isr: Vec<u64>,
    /// `min.insync.replicas`.
    min_isr: u32,
    /// The high watermark (leader: computed; follower: the leader's last
    /// answer, at most the local log end).
    hw: u64,
    /// Leader: each follower's progress.
    followers: HashMap<u64, Progress>,
    /// Leader: when it took over (a follower that never fetched since is
    /// measured from here).
    since: Instant,
    /// Leader: an ISR change is being proposed.
    pending: bool,
    /// Leader: a follower proposed back into the ISR; counted in the high
    /// watermark from the proposal on.
    joining: Option<u64>,
    /// Leader: a follower joins the ISR only once it holds (durably)
    /// everything below this — the log end when the partition gained
    /// replicas: what a single replica acknowledged on its own flush until
    /// then may be above the high watermark.
    join_floor: u64,
}

impl Isr {
    /// The state of a new replica on node `me` (no ISR yet, high
    /// watermark 0).
    pub fn new(me: u64, now: Instant) -> Isr {
        Isr {
            me,
            isr: Vec::new(),
            min_isr: 1,
            hw: 0,
            followers: HashMap::new(),
            since: now,
            pending: false,
            joining: None,
            join_floor: 0,
        }
    }

    /// The ISR and `min.insync.replicas` the metadata gives: a changed ISR
    /// ends the pending proposal (committed, or overtaken).
    pub fn set_isr(&mut self, isr: &[u64], min_isr: u32) {
        if self.isr != isr {
            self.pending = false;
            self.joining = None;
            self.isr = isr.to_vec();
        }
        self.min_isr = min_isr;
    }

    /// This replica starts leading at `now`, its log ending at `log_end`:
    /// followers are measured from now, and the high watermark is never
    /// above what it holds.
    pub fn lead(&mut self, now: Instant, log_end: u64) {
        self.followers.clear();
        self.since = now;
        self.pending = false;
        self.joining = None;
        self.hw = self.hw.min(log_end);
    }

    /// The partition gained replicas while this replica leads, its log
    /// ending at `log_end`: followers join the ISR only once they hold it.
    pub fn set_join_floor(&mut self, log_end: u64) {
        self.join_floor = log_end;
    }

    /// Follower: the leader's high watermark, at most what this replica
    /// holds.
    pub fn follow_hw(&mut self, leader_hw: u64, log_end: u64) {
        self.hw = leader_hw.min(log_end);
    }

    /// The in-sync replicas.
    pub fn isr(&self) -> &[u64] {
        &self.isr
    }

    /// `min.insync.replicas`.
    pub fn min_isr(&self) -> u32 {
        self.min_isr
    }

    /// Whether the ISR is at least `min.insync.replicas`.
    pub fn enough(&self) -> bool {
        self.isr.len() as u32 >= self.min_isr
    }

    /// The high watermark.
    pub fn hw(&self) -> u64 {
        self.hw
    }

    /// A mutation, for the tests that prove the fault checker sees lost
    /// records (never in a real broker): raises the high watermark to
    /// `local_durable` as if this replica were alone in the ISR.
    #[doc(hidden)]
    pub fn raise_hw_ignoring_followers(&mut self, local_durable: u64) -> Option<u64> {
        (local_durable > self.hw).then(|| {
            self.hw = local_durable;
            local_durable
        })
    }

    /// A follower's progress, if it fetched since this replica leads.
    pub fn follower(&self, node: u64) -> Option<&Progress> {
        self.followers.get(&node)
    }

    /// Leader: raises the high watermark to the smallest fdatasync'd offset
    /// over the ISR (this replica's is `local_durable`); returns it if it
    /// went up.
    pub fn raise_hw(&mut self, local_durable: u64) -> Option<u64> {
        let mut hw = local_durable;
        for n in self.isr.iter().chain(self.joining.iter()) {
            if *n != self.me {
                hw = hw.min(self.followers.get(n).map_or(0, |p| p.durable));
            }
        }
        (hw > self.hw).then(|| {
            self.hw = hw;
            hw
        })
    }

    /// Leader: follower `node` fetched at `now`, asking for `fetch_offset`
    /// with its log fdatasync'd below `durable`, while the leader's log
    /// ended at `leo` and its latest epoch began at `epoch_start`. Its
    /// progress is noted Kafka's way (caught up now if it asked for the log
    /// end, or as of its previous fetch if it asked for what the log end
    /// was then); a follower out of the ISR that holds everything up to the
    /// high watermark is proposed back in.
    pub fn fetched(
        &mut self,
        node: u64,
        fetch_offset: u64,
        durable: u64,
        leo: u64,
        epoch_start: u64,
        now: Instant,
    ) -> Option<Proposal> {
        let since = self.since;
        let p = self.followers.entry(node).or_insert(Progress {
            fetch_offset,
            durable,
            caught_up: since,
            last_fetch_leo: 0,
            last_fetch_at: since,
        });
        if fetch_offset >= leo {
            p.caught_up = now;
        } else if fetch_offset >= p.last_fetch_leo {
            p.caught_up = p.caught_up.max(p.last_fetch_at);
        }
        p.fetch_offset = fetch_offset;
        p.durable = durable.min(fetch_offset);
        p.last_fetch_leo = leo;
        p.last_fetch_at = now;
        let floor = self.hw.max(self.join_floor);
        let back = !self.isr.contains(&node)
            && !self.pending
            && fetch_offset >= floor.max(epoch_start)
            && p.durable >= floor;
        back.then(|| {
            self.joining = Some(node);
            let mut isr = self.isr.clone();
            isr.push(node);
            isr.sort_unstable();
            self.propose(isr)
        })
    }

    /// Leader, at `now` with its log ending at `leo`: the ISR members that
    /// fell behind or went silent, proposed out (none while a proposal is
    /// pending).
    pub fn shrink(&mut self, leo: u64, now: Instant, bounds: LagBounds) -> Option<Proposal> {
        if self.pending {
            return None;
        }
        let keep: Vec<u64> = self
            .isr
            .iter()
            .copied()
            .filter(|n| {
                *n == self.me || {
                    let p = self.followers.get(n);
                    let caught = p.map_or(self.since, |p| p.caught_up);
                    let silent = p.zip(bounds.silence).is_some_and(|(p, silence)| {
                        p.fetch_offset < leo && now.duration_since(p.last_fetch_at) > silence
                    });
                    now.duration_since(caught) < bounds.lag && !silent
                }
            })
            .collect();
        (keep.len() < self.isr.len()).then(|| self.propose(keep))
    }

    fn propose(&mut self, isr: Vec<u64>) -> Proposal {
        self.pending = true;
        Proposal {
            from: self.isr.clone(),
            isr,
        }
    }

    /// The controller refused the pending proposal (or it was not made):
    /// another may be made.
    pub fn proposal_failed(&mut self) {
        self.pending = false;
        self.joining = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAG: LagBounds = LagBounds {
        lag: Duration::from_secs(10),
        silence: Some(Duration::from_secs(2)),
    };

    fn leader(now: Instant) -> Isr {
        let mut s = Isr::new(1, now);
        s.set_isr(&[1, 2, 3], 2);
        s.lead(now, 0);
        s
    }

    #[test]
    fn the_high_watermark_is_the_least_durable_offset_over_the_isr_and_never_goes_down() {
        let t = Instant::now();
        let mut s = leader(t);
        assert_eq!(s.raise_hw(100), None, "followers have fetched nothing");
        s.fetched(2, 80, 70, 100, 0, t);
        s.fetched(3, 100, 90, 100, 0, t);
        assert_eq!(s.raise_hw(100), Some(70));
        assert_eq!(s.raise_hw(60), None, "never down");
        assert_eq!(s.hw(), 70);
        s.fetched(2, 100, 100, 100, 0, t);
        assert_eq!(
            s.raise_hw(95),
            Some(90),
            "the leader's own durability counts"
        );
    }

    #[test]
    fn a_follower_reports_no_more_durable_than_it_asked_for() {
        let t = Instant::now();
        let mut s = leader(t);
        s.fetched(2, 50, 80, 100, 0, t);
        assert_eq!(s.follower(2).unwrap().durable, 50);
    }

    #[test]
    fn a_follower_behind_for_the_lag_bound_is_proposed_out_once() {
        let t = Instant::now();
        let mut s = leader(t);
        s.fetched(2, 100, 100, 100, 0, t);
        s.fetched(3, 100, 100, 100, 0, t);
        let later = t + Duration::from_secs(5);
        s.fetched(2, 100, 100, 100, 0, later);
        s.fetched(3, 50, 50, 100, 0, later); // behind, but fetching
        assert_eq!(s.shrink(100, later, LAG), None, "within the lag bound");
        let much_later = t + Duration::from_secs(11);
        s.fetched(2, 100, 100, 100, 0, much_later);
        s.fetched(3, 50, 50, 100, 0, much_later);
        let p = s.shrink(100, much_later, LAG).expect("3 is out");
        assert_eq!(
            p,
            Proposal {
                from: vec![1, 2, 3],
                isr: vec![1, 2]
            }
        );
        assert_eq!(
            s.shrink(100, much_later, LAG),
            None,
            "one proposal at a time"
        );
        s.set_isr(&[1, 2], 2);
        assert_eq!(s.shrink(100, much_later, LAG), None, "committed");
    }

    #[test]
    fn a_silent_follower_that_is_behind_leaves_before_the_lag_bound() {
        let t = Instant::now();
        let mut s = leader(t);
        s.fetched(2, 100, 100, 100, 0, t);
        s.fetched(3, 100, 100, 100, 0, t);
        let later = t + Duration::from_secs(3);
        s.fetched(2, 120, 120, 120, 0, later);
        // 3 last fetched at t, and the log grew past it.
        let p = s.shrink(120, later, LAG).expect("3 went silent");
        assert_eq!(p.isr, vec![1, 2]);
        // Not behind: silence alone is no reason.
        let mut s = leader(t);
        s.fetched(2, 100, 100, 100, 0, t);
        s.fetched(3, 100, 100, 100, 0, t);
        assert_eq!(s.shrink(100, later, LAG), None);
    }

    #[test]
    fn a_follower_rejoins_once_it_holds_the_high_watermark_and_counts_from_the_proposal() {
        let t = Instant::now();
        let mut s = leader(t);
        s.set_isr(&[1, 2], 2);
        s.fetched(2, 100, 100, 100, 0, t);
        assert_eq!(s.raise_hw(100), Some(100));
        assert_eq!(
            s.fetched(3, 90, 90, 110, 0, t),
            None,
            "below the high watermark"
        );
        let p = s.fetched(3, 100, 100, 110, 0, t).expect("caught up");
        assert_eq!(p.isr, vec![1, 2, 3]);
        // Joining: its durability bounds the high watermark already.
        s.fetched(2, 110, 110, 110, 0, t);
        assert_eq!(s.raise_hw(110), None, "3 holds only 100");
        s.proposal_failed();
        assert_eq!(s.raise_hw(110), Some(110), "refused: no longer counted");
    }

    #[test]
    fn a_follower_joins_only_above_the_floor_set_when_replicas_were_added() {
        let t = Instant::now();
        let mut s = Isr::new(1, t);
        s.set_isr(&[1], 1);
        s.lead(t, 500);
        s.set_join_floor(500);
        assert_eq!(s.fetched(2, 400, 400, 500, 0, t), None);
        assert!(s.fetched(2, 500, 500, 500, 0, t).is_some());
    }

    #[test]
    fn leading_again_caps_the_high_watermark_at_the_log_end() {
        let t = Instant::now();
        let mut s = Isr::new(1, t);
        s.follow_hw(300, 200);
        assert_eq!(s.hw(), 200);
        s.lead(t, 150);
        assert_eq!(s.hw(), 150);
        assert!(!s.enough(), "an empty ISR is below min.insync.replicas 1");
    }
}
