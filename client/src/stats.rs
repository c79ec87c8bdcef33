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
//! The same figures go to the [`metrics`] facade as they change, so an
//! application that installs a recorder (Prometheus, StatsD, …) exports
//! them with no code of its own; without a recorder this costs a load of
//! a global. Names (counters end in `_total`; `kind` labels errors):
//!
//! | producer | consumer |
//! |---|---|
//! | `weir_client_producer_records_sent_total`, `…_records_failed_total`, `…_bytes_sent_total`, `…_batches_total`, `…_requests_total`, `…_retries_total`, `…_metadata_failures_total`, `…_errors_total{kind}` | `weir_client_consumer_polls_total`, `…_records_total`, `…_record_bytes_total`, `…_fetches_total`, `…_fetch_bytes_total`, `…_offset_resets_total`, `…_skipped_offsets_total`, `…_errors_total{kind}` |
//! | gauges `weir_client_producer_records_in_flight`, `…_requests_in_flight` | |
//! | histograms `weir_client_producer_batch_bytes`, `…_request_latency_seconds` | |
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
    /// Mean time a batch was open, from its first record until it was
    /// closed (full, linger passed, flush): where records wait to be
    /// batched.
    pub batch_open_mean: Duration,
    /// Mean time from closing a batch to its first send: where batches wait
    /// for room in flight (`max_in_flight`) or for a producer id.
    pub batch_queued_mean: Duration,
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
    /// Notes a `poll` that returned `records` records of `bytes` bytes.
    pub(crate) fn poll(&mut self, records: usize, bytes: u64) {
        self.polls += 1;
        self.records += records as u64;
        self.record_bytes += bytes;
        metrics::counter!("weir_client_consumer_polls_total").increment(1);
        metrics::counter!("weir_client_consumer_records_total").increment(records as u64);
        metrics::counter!("weir_client_consumer_record_bytes_total").increment(bytes);
    }

    /// Notes a fetch request sent.
    pub(crate) fn fetch(&mut self) {
        self.fetches += 1;
        metrics::counter!("weir_client_consumer_fetches_total").increment(1);
    }

    /// Notes `bytes` of record batches fetched.
    pub(crate) fn fetched(&mut self, bytes: u64) {
        self.fetch_bytes += bytes;
        metrics::counter!("weir_client_consumer_fetch_bytes_total").increment(bytes);
    }

    /// Notes a position reset that jumped over `skipped` offsets.
    pub(crate) fn reset(&mut self, skipped: u64) {
        self.offset_resets += 1;
        self.skipped += skipped;
        metrics::counter!("weir_client_consumer_offset_resets_total").increment(1);
        metrics::counter!("weir_client_consumer_skipped_offsets_total").increment(skipped);
    }

    /// Notes an error `poll` returns.
    pub(crate) fn error(&mut self, e: &ClientError) {
        let kind = error_kind(e);
        metrics::counter!("weir_client_consumer_errors_total", "kind" => kind).increment(1);
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
        ClientError::Tls(_) => "tls",
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
    stage_count: AtomicU64,
    open_sum_us: AtomicU64,
    queued_sum_us: AtomicU64,
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

    /// Notes a record accepted by `send`.
    pub(crate) fn accepted(&self) {
        Self::add(&self.records_in_flight, 1);
        metrics::gauge!("weir_client_producer_records_in_flight").increment(1.0);
    }

    /// Notes `n` records acknowledged (`ok`) or failed for good.
    pub(crate) fn completed(&self, n: u64, ok: bool) {
        if ok {
            Self::add(&self.records_sent, n);
            metrics::counter!("weir_client_producer_records_sent_total").increment(n);
        } else {
            Self::add(&self.records_failed, n);
            metrics::counter!("weir_client_producer_records_failed_total").increment(n);
        }
        Self::sub(&self.records_in_flight, n);
        metrics::gauge!("weir_client_producer_records_in_flight").decrement(n as f64);
    }

    /// Notes an acknowledged batch of `bytes`.
    pub(crate) fn acked_bytes(&self, bytes: u64) {
        Self::add(&self.bytes_sent, bytes);
        metrics::counter!("weir_client_producer_bytes_sent_total").increment(bytes);
    }

    /// Notes a produce request sent.
    pub(crate) fn request_sent(&self) {
        Self::add(&self.requests, 1);
        Self::add(&self.requests_in_flight, 1);
        metrics::counter!("weir_client_producer_requests_total").increment(1);
        metrics::gauge!("weir_client_producer_requests_in_flight").increment(1.0);
    }

    /// Notes a produce request answered (or failed).
    pub(crate) fn request_done(&self) {
        Self::sub(&self.requests_in_flight, 1);
        metrics::gauge!("weir_client_producer_requests_in_flight").decrement(1.0);
    }

    /// Notes a batch queued again after a retriable error.
    pub(crate) fn retry(&self) {
        Self::add(&self.retries, 1);
        metrics::counter!("weir_client_producer_retries_total").increment(1);
    }

    /// Notes a failed metadata lookup.
    pub(crate) fn metadata_failure(&self, e: &ClientError) {
        Self::add(&self.metadata_failures, 1);
        metrics::counter!("weir_client_producer_metadata_failures_total").increment(1);
        self.error(e);
    }

    /// Notes an error (retried or not).
    pub(crate) fn error(&self, e: &ClientError) {
        let kind = error_kind(e);
        metrics::counter!("weir_client_producer_errors_total", "kind" => kind).increment(1);
        let mut g = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.len() < ERROR_KINDS_MAX || g.0.contains_key(kind) {
            *g.0.entry(kind).or_insert(0) += 1;
        }
        g.1 = Some(e.to_string());
    }

    /// Notes a sent batch of `bytes`.
    pub(crate) fn batch(&self, bytes: usize) {
        Self::add(&self.batches_sent, 1);
        metrics::counter!("weir_client_producer_batches_total").increment(1);
        metrics::histogram!("weir_client_producer_batch_bytes").record(bytes as f64);
        self.batch_bytes_max
            .fetch_max(bytes as u64, Ordering::Relaxed);
    }

    /// Notes a batch's first send: how long it was open, then closed but
    /// not sent.
    pub(crate) fn batch_stages(&self, open: Duration, queued: Duration) {
        metrics::histogram!("weir_client_producer_batch_open_seconds").record(open.as_secs_f64());
        metrics::histogram!("weir_client_producer_batch_queued_seconds")
            .record(queued.as_secs_f64());
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        Self::add(&self.stage_count, 1);
        Self::add(&self.open_sum_us, us(open));
        Self::add(&self.queued_sum_us, us(queued));
    }

    /// Notes a produce request's round trip.
    pub(crate) fn latency(&self, d: Duration) {
        metrics::histogram!("weir_client_producer_request_latency_seconds").record(d.as_secs_f64());
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
            batch_open_mean: Duration::from_micros(
                get(&self.open_sum_us)
                    .checked_div(get(&self.stage_count))
                    .unwrap_or(0),
            ),
            batch_queued_mean: Duration::from_micros(
                get(&self.queued_sum_us)
                    .checked_div(get(&self.stage_count))
                    .unwrap_or(0),
            ),
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
