//! Waiting for a condition, with a deadline.
//!
//! Tests synchronise on what they can observe — a metric, a partition's
//! row, a process's exit — by polling it: never by sleeping for a while
//! and hoping. [`wait_until`] polls until a condition holds and fails the
//! test naming what it waited for; [`poll_until`] returns the last failed
//! look instead, for callers that gather more to report or go another way.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// How long a poller sleeps between two looks.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// What one look at a condition polled by [`wait_until`] returns.
///
/// - `bool`: whether it holds;
/// - `Option<T>`: `Some(value)` once it holds, the value returned;
/// - `Result<T, E>`: `Ok(value)` once it holds; `Err(seen)`, what was
///   seen instead, is reported if time runs out.
pub trait Outcome {
    /// What [`wait_until`] returns once the condition holds.
    type Value;
    /// `Ok` once the condition holds; `Err` with what was seen, if
    /// anything is worth reporting, while it does not.
    fn into_result(self) -> Result<Self::Value, Option<String>>;
}

impl Outcome for bool {
    type Value = ();
    fn into_result(self) -> Result<(), Option<String>> {
        if self {
            Ok(())
        } else {
            Err(None)
        }
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn into_result(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: Display> Outcome for Result<T, E> {
    type Value = T;
    fn into_result(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(e.to_string()))
    }
}

/// Calls `condition` every [`POLL_INTERVAL`] until it returns `Ok`, and
/// returns that; once `deadline` has passed, returns its last `Err`. It is
/// called at least once, and once more at the deadline.
pub fn poll_until<T, E>(
    deadline: Instant,
    mut condition: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    loop {
        let look = condition();
        let now = Instant::now();
        if look.is_ok() || now >= deadline {
            return look;
        }
        std::thread::sleep(POLL_INTERVAL.min(deadline - now));
    }
}

/// Polls `condition` (see [`Outcome`]) until it holds and returns its
/// value; panics naming `what` (what the test waits for, e.g. "the ISR is
/// full") and the last thing seen if it does not hold by `deadline`.
pub fn wait_until<O: Outcome>(
    deadline: Instant,
    what: impl Display,
    mut condition: impl FnMut() -> O,
) -> O::Value {
    let since = Instant::now();
    match poll_until(deadline, || condition().into_result()) {
        Ok(value) => value,
        Err(seen) => panic!(
            "timed out after {:?} waiting until {what}{}",
            since.elapsed(),
            seen.map(|s| format!(": {s}")).unwrap_or_default()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_value_once_the_condition_holds() {
        let mut n = 0;
        let got = wait_until(
            Instant::now() + Duration::from_secs(5),
            "n reaches 3",
            || {
                n += 1;
                (n >= 3).then_some(n)
            },
        );
        assert_eq!(got, 3);
    }

    #[test]
    fn poll_until_returns_the_last_look_at_the_deadline() {
        let mut n = 0;
        let start = Instant::now();
        let got: Result<(), u32> = poll_until(start + Duration::from_millis(100), || {
            n += 1;
            Err(n)
        });
        assert!(start.elapsed() >= Duration::from_millis(100));
        assert_eq!(got, Err(n));
        assert!(n >= 2, "looked at again at the deadline");
    }

    #[test]
    #[should_panic(expected = "waiting until the sky falls: still up")]
    fn names_what_it_waited_for_and_what_it_saw() {
        wait_until(
            Instant::now() + Duration::from_millis(50),
            "the sky falls",
            || Err::<(), _>("still up"),
        );
    }
}
