//! Wall-clock time, injectable for tests.
//!
//! Retention and segment age are decided on milliseconds since the Unix
//! epoch, like Kafka. Tests use [`ManualClock`] to move time without sleeping.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of milliseconds since the Unix epoch.
pub trait Clock {
    /// Now, in ms since the epoch.
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to.
#[derive(Debug, Default, Clone)]
pub struct ManualClock(Rc<Cell<i64>>);

impl ManualClock {
    /// A clock reading `now_ms`.
    pub fn new(now_ms: i64) -> Self {
        ManualClock(Rc::new(Cell::new(now_ms)))
    }
    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: i64) {
        self.0.set(self.0.get() + ms);
    }
    /// Sets the clock.
    pub fn set(&self, now_ms: i64) {
        self.0.set(now_ms);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.get()
    }
}
