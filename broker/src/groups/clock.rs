//! The coordinator's clock: monotonic milliseconds since the process began.
//! The group state machines take time as an argument; this is where the
//! coordinator reads it.

use std::time::Instant;

/// Milliseconds on a monotonic clock (sessions and timeouts; never the
/// wall clock, which may jump).
pub fn mono_ms() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_millis() as u64
}
