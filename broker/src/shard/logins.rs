//! Failed SASL logins per source address, on one core: after
//! [`SASL_FAILURES_BEFORE_DELAY`] failures from one address, its next
//! failures are answered later and later (doubling up to
//! [`SASL_FAILURE_DELAY_MS_MAX`]); at most [`SASL_FAILURE_SOURCES_MAX`]
//! addresses are remembered.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::server::limits::{
    SASL_FAILURES_BEFORE_DELAY, SASL_FAILURE_DELAY_MS_MAX, SASL_FAILURE_SOURCES_MAX,
};

/// Failed logins per source address, on one core.
#[derive(Debug, Default)]
pub struct Logins {
    failures: RefCell<HashMap<IpAddr, (u32, Instant)>>,
}

/// A source's failures are forgotten this long after its last one.
const FAILURES_FORGOTTEN_AFTER: Duration = Duration::from_secs(60);

impl Logins {
    /// Records a failure from `ip`; the delay its answer gets.
    pub fn failed(&self, ip: IpAddr) -> Duration {
        let mut map = self.failures.borrow_mut();
        let now = Instant::now();
        if map.len() >= SASL_FAILURE_SOURCES_MAX {
            map.retain(|_, (_, last)| now.duration_since(*last) < FAILURES_FORGOTTEN_AFTER);
            if map.len() >= SASL_FAILURE_SOURCES_MAX {
                // Still full: forget everyone rather than grow.
                map.clear();
            }
        }
        let e = map.entry(ip).or_insert((0, now));
        if now.duration_since(e.1) >= FAILURES_FORGOTTEN_AFTER {
            e.0 = 0;
        }
        e.0 = e.0.saturating_add(1);
        e.1 = now;
        failure_delay(e.0)
    }

    /// A login from `ip` succeeded: its failures are forgotten.
    pub fn succeeded(&self, ip: IpAddr) {
        self.failures.borrow_mut().remove(&ip);
    }
}

/// The delay of the `n`th failure in a row from one address.
fn failure_delay(n: u32) -> Duration {
    if n <= SASL_FAILURES_BEFORE_DELAY {
        return Duration::ZERO;
    }
    let doublings = (n - SASL_FAILURES_BEFORE_DELAY - 1).min(16);
    Duration::from_millis((100u64 << doublings).min(SASL_FAILURE_DELAY_MS_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_slowed_down_after_a_few() {
        let delays: Vec<u64> = (1..=10)
            .map(|n| failure_delay(n).as_millis() as u64)
            .collect();
        assert_eq!(&delays[..3], &[0, 0, 0]);
        assert_eq!(&delays[3..6], &[100, 200, 400]);
        assert_eq!(delays[9], SASL_FAILURE_DELAY_MS_MAX.min(100 << 6));
        assert_eq!(
            failure_delay(1000).as_millis() as u64,
            SASL_FAILURE_DELAY_MS_MAX
        );
    }
}
