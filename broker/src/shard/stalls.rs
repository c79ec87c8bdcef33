//! A watch on each core's reactor: how late its timers fire, and whether
//! the executor was asleep meanwhile — a *stall with work pending* (the
//! timer was due; nothing ran).
//!
//! A task sleeps [`TICK`] over and over. Its wake-up is late by `L` when
//! the core ran something else for that long (a busy core) or when the
//! reactor slept past the timer's deadline (a missed wake-up: glommio 0.9
//! was seen asleep in `io_uring_enter` with finished blocking-pool work,
//! see `docs/reliability.md`). glommio's executor statistics tell them
//! apart: the time the executor spent running tasks since the previous
//! tick. A lateness of at least [`STALL_MIN`] during which the executor
//! ran tasks for less than half of it is a stall. `/metrics` shows, per
//! core, the longest lateness and the longest stall since the start, and
//! how many stalls there were.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How often the watch wakes.
pub const TICK: Duration = Duration::from_millis(10);

/// The least lateness counted as a stall (when the executor was idle).
pub const STALL_MIN: Duration = Duration::from_millis(100);

/// One core's reactor lateness and stalls (monotonic maxima and count).
#[derive(Debug, Default)]
pub struct Stalls {
    /// Longest lateness of a due timer, µs.
    pub late_max_us: Cell<u64>,
    /// Longest stall (late, executor idle), µs.
    pub stall_max_us: Cell<u64>,
    /// Stalls seen.
    pub stalls: Cell<u64>,
}

impl Stalls {
    /// Records one wake-up `late` after its deadline, during which the
    /// executor ran tasks for `ran`; whether it was a stall.
    pub fn record(&self, late: Duration, ran: Duration) -> bool {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.late_max_us.set(self.late_max_us.get().max(us(late)));
        let stalled = late >= STALL_MIN && ran < late / 2;
        if stalled {
            self.stalls.set(self.stalls.get() + 1);
            self.stall_max_us.set(self.stall_max_us.get().max(us(late)));
        }
        stalled
    }
}

/// Watches the current core until `stopping` says so. Must run on a
/// glommio executor; it is the only reader of the executor's statistics
/// (reading them resets them).
pub async fn watch(core: usize, stalls: Rc<Stalls>, stopping: impl Fn() -> bool) {
    let _ = glommio::executor().executor_stats();
    while !stopping() {
        let due = Instant::now() + TICK;
        glommio::timer::sleep(TICK).await;
        let late = Instant::now().saturating_duration_since(due);
        let ran = glommio::executor().executor_stats().executor_runtime();
        if stalls.record(late, ran) {
            tracing::warn!(
                core,
                late_ms = late.as_millis() as u64,
                ran_ms = ran.as_millis() as u64,
                "the core's reactor slept past a due timer (a stall with work pending)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_wake_up_is_a_stall_only_when_the_executor_was_idle() {
        let s = Stalls::default();
        let ms = Duration::from_millis;
        assert!(!s.record(ms(3), ms(0)), "on time");
        assert!(!s.record(ms(300), ms(290)), "busy, not stalled");
        assert!(s.record(ms(250), ms(10)), "asleep past the deadline");
        assert!(!s.record(ms(50), ms(0)), "too short to count");
        assert_eq!(s.stalls.get(), 1);
        assert_eq!(s.stall_max_us.get(), 250_000);
        assert_eq!(s.late_max_us.get(), 300_000);
    }
}
