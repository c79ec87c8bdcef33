//! Statistics of a [`crate::Producer`]: counters the sender keeps as it
//! works, read as a [`ProducerStats`] snapshot with
//! [`crate::Producer::statistics`]; and of a [`crate::Consumer`]
//! ([`ConsumerStats`], [`crate::Consumer::statistics`]), kept by the
//! consumer itself (it is `&mut` while it works: plain counters).
//!
//! The counters are relaxed atomics bumped by the producer's sender (one
//! writer per counter, except `records_in_flight`, which `send` raises and
//! the sender lowers), so a snapshot is not one instant: counters read a
//! few nanoseconds apart may disagree by a batch. Every counter only grows
//! except the gauges (`records_in_flight`, `requests_in_flight`,
//! `buffered_bytes`).
//!
//! Errors are counted by kind ([`error_kind`]): the protocol code's name
//! for errors the broker sent (`NotOwner`, `OutOfOrderSequence`, …),
//! otherwise the client-side kind (`io`, `disconnected`, `timeout`, …).
//! The table is bounded: there are fewer kinds than
//! [`ERROR_KINDS_MAX`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::ClientError;

/// More error kinds than [`error_kind`] can return (protocol codes and
/// client-side kinds): the bound of [`ProducerStats::errors`].
pub const ERROR_KINDS_MAX: usize = 128;

/// A snapshot of a producer's statistics (see the [module docs](self)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProducerStats {
    /// Records the broker acknowledged.
    pub records_sent: u64,
    /// Bytes of acknowledged batches (as sent: after compression).
    pub bytes_sent: u64,
    /// Records that failed for good (their futures and callbacks got the
    /// error).
    pub records_failed: u64,
    /// Records accepted by `send` and not yet acknowledged or failed
    /// (buffered or in flight).
    pub records_in_flight: u64,
    /// Bytes of buffer memory held by those records (estimated, as counted
    /// against `buffer_memory`).
    pub buffered_bytes: u64,
    /// Batches sent (first sends, not retries).
    pub batches_sent: u64,
    /// Largest batch sent, in bytes.
    pub batch_bytes_max: u64,
    /// Produce requests sent (with retries).
    pub requests: u64,
    /// Produce requests awaiting their answer now.
    pub requests_in_flight: u64,
    /// Batches sent again after a retriable error.
    pub retries: u64,
    /// Metadata lookups that failed (the producer kept using the layout it
    /// had, or `send` waited and asked again).
    pub metadata_failures: u64,
    /// Failed produce attempts and metadata lookups by error kind (see
    /// the [module docs](self)); a batch retried three times counts three.
    pub errors: BTreeMap<String, u64>,
    /// The last error seen (retried or not), as displayed.
    pub last_error: Option<String>,
    /// Mean time from sending a produce request to its answer.
    pub request_latency_mean: Duration,
    /// Longest time from sending a produce request to its answer.
    pub request_latency_max: Duration,
}

/// A snapshot of a consumer's statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// Calls of `poll` (also those of the record stream).
    pub polls: u64,
    /// Records `poll` returned.
    pub records: u64,
    /// Bytes of keys and values of those records.
    pub record_bytes: u64,
    /// Fetch requests sent (long polls and fetches sent ahead).
    pub fetches: u64,
    /// Bytes of record batches fetched (as fetched: compressed).
    pub fetch_bytes: u64,
    /// Positions reset after `OffsetOutOfRange`.
    pub offset_resets: u64,
    /// Offsets jumped over by those resets (all partitions).
    pub skipped: u64,
    /// Errors `poll` returned, by kind (see [`error_kind`]).
    pub errors: BTreeMap<String, u64>,
    /// The last error `poll` returned, as displayed.
    pub last_error: Option<String>,
}

impl ConsumerStats {
    /// Notes an error `poll` returns.
    pub(crate) fn error(&mut self, e: &ClientError) {
        let kind = error_kind(e);
        if self.errors.len() < ERROR_KINDS_MAX || self.errors.contains_key(kind) {
            *self.errors.entry(kind.to_string()).or_insert(0) += 1;
        }
        self.last_error = Some(e.to_string());
    }
}

/// The kind an error is counted under: the protocol code's name, or the
/// client-side kind.
pub fn error_kind(e: &ClientError) -> &'static str {
    if let Some(code) = e.code() {
        return code.name();
    }
    match e {
        ClientError::Io(_) => "io",
        ClientError::Disconnected => "disconnected",
        ClientError::Timeout(_) => "timeout",
        ClientError::InvalidResponse(_) => "invalid_response",
        ClientError::CorruptBatch(_) => "corrupt_batch",
        ClientError::InvalidArgument(_) => "invalid_argument",
        ClientError::BufferFull { .. } => "buffer_full",
        _ => "other",
    }
}

/// The live counters behind [`ProducerStats`].
#[derive(Debug, Default)]
pub(crate) struct ProducerCounters {
    pub(crate) records_sent: AtomicU64,
    pub(crate) bytes_sent: AtomicU64,
    pub(crate) records_failed: AtomicU64,
    pub(crate) records_in_flight: AtomicU64,
    pub(crate) batches_sent: AtomicU64,
    pub(crate) batch_bytes_max: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) requests_in_flight: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) metadata_failures: AtomicU64,
    latency_count: AtomicU64,
    latency_sum_us: AtomicU64,
    latency_max_us: AtomicU64,
    /// Errors by kind, and the last one.
    errors: Mutex<(BTreeMap<&'static str, u64>, Option<String>)>,
}

impl ProducerCounters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn sub(counter: &AtomicU64, n: u64) {
        counter.fetch_sub(n, Ordering::Relaxed);
    }

    /// Notes an error (retried or not).
    pub(crate) fn error(&self, e: &ClientError) {
        let mut g = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        let kind = error_kind(e);
        if g.0.len() < ERROR_KINDS_MAX || g.0.contains_key(kind) {
            *g.0.entry(kind).or_insert(0) += 1;
        }
        g.1 = Some(e.to_string());
    }

    /// Notes a sent batch of `bytes`.
    pub(crate) fn batch(&self, bytes: usize) {
        Self::add(&self.batches_sent, 1);
        self.batch_bytes_max
            .fetch_max(bytes as u64, Ordering::Relaxed);
    }

    /// Notes a produce request's round trip.
    pub(crate) fn latency(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        Self::add(&self.latency_count, 1);
        Self::add(&self.latency_sum_us, us);
        self.latency_max_us.fetch_max(us, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, buffered_bytes: u64) -> ProducerStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (errors, last_error) = {
            let g = self.errors.lock().unwrap_or_else(|p| p.into_inner());
            (
                g.0.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                g.1.clone(),
            )
        };
        let n = get(&self.latency_count);
        ProducerStats {
            records_sent: get(&self.records_sent),
            bytes_sent: get(&self.bytes_sent),
            records_failed: get(&self.records_failed),
            records_in_flight: get(&self.records_in_flight),
            buffered_bytes,
            batches_sent: get(&self.batches_sent),
            batch_bytes_max: get(&self.batch_bytes_max),
            requests: get(&self.requests),
            requests_in_flight: get(&self.requests_in_flight),
            retries: get(&self.retries),
            metadata_failures: get(&self.metadata_failures),
            errors,
            last_error,
            request_latency_mean: Duration::from_micros(
                get(&self.latency_sum_us).checked_div(n).unwrap_or(0),
            ),
            request_latency_max: Duration::from_micros(get(&self.latency_max_us)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_proto::error_code::ErrorCode;

    #[test]
    fn errors_are_counted_by_kind_and_the_last_is_kept() {
        let c = ProducerCounters::default();
        c.error(&ClientError::Disconnected);
        c.error(&ClientError::Disconnected);
        c.error(&ClientError::partition(
            "t",
            0,
            ErrorCode::NotOwner.as_u16(),
            None,
        ));
        c.latency(Duration::from_millis(2));
        c.latency(Duration::from_millis(4));
        let s = c.snapshot(0);
        assert_eq!(s.errors["disconnected"], 2);
        assert_eq!(s.errors["NotOwner"], 1);
        assert!(s.last_error.unwrap().contains("NotOwner"));
        assert_eq!(s.request_latency_mean, Duration::from_millis(3));
        assert_eq!(s.request_latency_max, Duration::from_millis(4));
    }
}
