//! The pace of uploads (Kafka's `remote.log.manager.copy.max.bytes.per.second`,
//! KIP-956): a node's copies to the remote tier, every core's together, at
//! most a given number of bytes per second. Sans-IO: [`CopyPace::delay`]
//! says how long to wait before sending; the caller sleeps on its own
//! executor.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A byte rate shared by every core of a node.
#[derive(Debug)]
pub struct CopyPace {
    bytes_per_sec: u64,
    /// When the bytes already let through have been paid for: a send may
    /// start then at the earliest.
    free_at: Mutex<Option<Instant>>,
}

impl CopyPace {
    /// A pace of `bytes_per_sec` (at least 1).
    pub fn new(bytes_per_sec: u64) -> CopyPace {
        CopyPace {
            bytes_per_sec: bytes_per_sec.max(1),
            free_at: Mutex::new(None),
        }
    }

    /// The rate, bytes per second.
    pub fn bytes_per_sec(&self) -> u64 {
        self.bytes_per_sec
    }

    /// How long to wait, from `now`, before sending `bytes`; the bytes are
    /// counted as sent then. Sends follow each other at the rate; time
    /// left idle is not saved up for a burst.
    pub fn delay(&self, now: Instant, bytes: u64) -> Duration {
        let mut free_at = self.free_at.lock().unwrap_or_else(|e| e.into_inner());
        let start = match *free_at {
            Some(t) if t > now => t,
            _ => now,
        };
        let cost = Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec as f64);
        *free_at = Some(start + cost);
        start - now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_follow_each_other_at_the_rate_and_idle_time_is_not_saved() {
        let p = CopyPace::new(1 << 20);
        let t0 = Instant::now();
        // The first send goes at once; the next waits for the first's
        // megabyte to be paid for, the one after for both.
        assert_eq!(p.delay(t0, 1 << 20), Duration::ZERO);
        assert_eq!(p.delay(t0, 512 << 10), Duration::from_secs(1));
        assert_eq!(p.delay(t0, 1 << 20), Duration::from_millis(1500));
        // Half a second later, a second less to wait.
        let later = t0 + Duration::from_millis(500);
        assert_eq!(p.delay(later, 0), Duration::from_millis(2000));
        // Long idle: no credit, the next send goes at once and the one
        // after waits for it.
        let idle = t0 + Duration::from_secs(60);
        assert_eq!(p.delay(idle, 2 << 20), Duration::ZERO);
        assert_eq!(p.delay(idle, 1), Duration::from_secs(2));
    }

    #[test]
    fn a_zero_rate_is_one_byte_per_second_not_a_division_by_zero() {
        let p = CopyPace::new(0);
        let t0 = Instant::now();
        assert_eq!(p.bytes_per_sec(), 1);
        assert_eq!(p.delay(t0, 3), Duration::ZERO);
        assert_eq!(p.delay(t0, 1), Duration::from_secs(3));
    }
}
