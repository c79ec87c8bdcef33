//! Metrics: per-core counters, the `Send` snapshot of them that crosses
//! the mesh, and their Prometheus text rendering. A core takes its
//! snapshot in `shard::stats`; core 0 gathers every core's and serves
//! them at `GET /metrics` (`crate::listener::http`). Nothing here knows a
//! core.

use std::cell::Cell;
use std::fmt::Write as _;

use weir_proto::api::ApiKey;
use weir_storage::ShardStats;

/// Upper bounds of the request-latency histogram buckets, µs.
pub const LATENCY_BUCKETS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];
/// Upper bounds of the produce-stage histogram buckets, µs (finer than the
/// request buckets: a stage is a part of one request).
pub const STAGE_BUCKETS_US: [u64; 13] = [
    25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 250_000, 1_000_000,
];
/// Produce stages timed on the owner core, per batch, in order.
pub const PRODUCE_STAGES: [&str; 4] = ["append", "write", "sync", "replicate"];
/// Index of a stage in [`PRODUCE_STAGES`].
#[derive(Debug, Clone, Copy)]
pub enum Stage {
    /// The append call: the partition's append order, validation, the copy
    /// into the segment's write buffer.
    Append = 0,
    /// Appended until written to the segment file (waiting for the core's
    /// next flush round, then the direct-I/O write).
    Write = 1,
    /// Written until the flush policy is met (the fdatasync, by default).
    Sync = 2,
    /// `acks=all` to a replicated partition: durable here until durable on
    /// every in-sync replica (the high watermark passes it).
    Replicate = 3,
}
/// Share-fetch stages timed on the share partitions' core, per request.
pub const SHARE_FETCH_STAGES: [&str; 4] = ["acquire", "wait", "store", "store_later"];
/// Index of a stage in [`SHARE_FETCH_STAGES`].
#[derive(Debug, Clone, Copy)]
pub enum ShareStage {
    /// Acquiring records for the member and reading them (every pass).
    Acquire = 0,
    /// Nothing to acquire: waiting for records to arrive or free up.
    Wait = 1,
    /// Waiting for the stores of the acknowledgements the request carried
    /// to be durable, past what ran beside the acquisition.
    Store = 2,
    /// A fetch answered before its acknowledgements were stored
    /// (`acks_later`): their whole store, which no request waited for.
    StoreLater = 3,
}
/// Number of API keys counted.
pub const APIS: usize = ApiKey::ALL.len();
/// Largest HTTP request head read by the metrics endpoint.
pub const HTTP_HEAD_BYTES_MAX: usize = 8 << 10;

/// Counters of one API on one core: its requests (the latency
/// histogram's count) and errors.
#[derive(Debug, Default)]
pub struct ApiCounters {
    pub(crate) errors: Cell<u64>,
    pub(crate) latency: CellHist<{ LATENCY_BUCKETS_US.len() }>,
}

/// A latency histogram on one core: observations, their sum (µs) and
/// per-bucket counts over upper bounds given when observing.
#[derive(Debug)]
pub(crate) struct CellHist<const N: usize> {
    count: Cell<u64>,
    sum_us: Cell<u64>,
    buckets: [Cell<u64>; N],
}

impl<const N: usize> Default for CellHist<N> {
    fn default() -> Self {
        CellHist {
            count: Cell::new(0),
            sum_us: Cell::new(0),
            buckets: std::array::from_fn(|_| Cell::new(0)),
        }
    }
}

impl<const N: usize> CellHist<N> {
    fn observe(&self, bounds_us: &[u64; N], us: u64) {
        add(&self.count, 1);
        add(&self.sum_us, us);
        if let Some(i) = bounds_us.iter().position(|&b| us <= b) {
            add(&self.buckets[i], 1);
        }
    }

    pub(crate) fn read(&self) -> Hist {
        Hist {
            count: self.count.get(),
            sum_us: self.sum_us.get(),
            buckets: self.buckets.iter().map(Cell::get).collect(),
        }
    }
}

/// Per API counters, by key (more APIs than `Default` covers for arrays).
#[derive(Debug)]
pub(crate) struct ApiTable([ApiCounters; APIS]);

impl Default for ApiTable {
    fn default() -> Self {
        ApiTable(std::array::from_fn(|_| ApiCounters::default()))
    }
}

impl std::ops::Deref for ApiTable {
    type Target = [ApiCounters; APIS];
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// One core's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Per API: errors and latency.
    pub(crate) apis: ApiTable,
    /// Request bytes received.
    pub bytes_in: Cell<u64>,
    /// Response bytes sent.
    pub bytes_out: Cell<u64>,
    /// Connections accepted.
    pub connections: Cell<u64>,
    /// Connections closed at once because the core had
    /// `--max-connections-per-core` open.
    pub connections_refused: Cell<u64>,
    /// Connections closed because a frame did not arrive whole within
    /// `--frame-read-timeout-ms`.
    pub frame_timeouts: Cell<u64>,
    /// Connections closed because their TLS handshake failed or did not
    /// finish within `TLS_HANDSHAKE_TIMEOUT_MS`.
    pub tls_handshake_failures: Cell<u64>,
    /// SASL logins that succeeded (re-authentications too).
    pub sasl_authentications: Cell<u64>,
    /// SASL logins that failed: wrong credentials, a malformed or
    /// oversized token, no login within the deadline, a request before
    /// logging in.
    pub sasl_authentication_failures: Cell<u64>,
    /// OTLP counters per signal (indexed as [`OTLP_SIGNALS`]): exports
    /// answered success (a partial success too), spans / data points /
    /// log records written, exports refused for good (bad data, too
    /// large, not allowed), exports answered "retry later" (a full
    /// buffer, no leader, a deadline passed, a missing topic); record
    /// batches handed on to the node leading their partition.
    pub otlp: [[Cell<u64>; OTLP_SIGNALS.len()]; OTLP_COUNTERS.len()],
    /// Produce stages, per batch.
    pub(crate) stages: [CellHist<{ STAGE_BUCKETS_US.len() }>; PRODUCE_STAGES.len()],
    /// Share-fetch stages, per request.
    pub(crate) share_stages: [CellHist<{ STAGE_BUCKETS_US.len() }>; SHARE_FETCH_STAGES.len()],
    /// Bytes of batches this core's followers fetched from leaders.
    pub replication_in: Cell<u64>,
    /// Bytes of batches this core sent to followers.
    pub replication_out: Cell<u64>,
    /// The reactor's lateness and stalls (`crate::shard::stalls`).
    pub stalls: std::rc::Rc<crate::shard::stalls::Stalls>,
}

fn add(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

impl Metrics {
    /// Records one request of `api` that took `us` µs.
    pub fn record(&self, api: ApiKey, us: u64, error: bool) {
        // Counters are indexed by the API's place in `ApiKey::ALL` (keys
        // have gaps: reserved numbers).
        let Some(a) = ApiKey::ALL
            .iter()
            .position(|k| *k == api)
            .and_then(|i| self.apis.get(i))
        else {
            return;
        };
        if error {
            add(&a.errors, 1);
        }
        a.latency.observe(&LATENCY_BUCKETS_US, us);
    }

    /// Records how long one batch spent in a produce stage.
    pub fn stage(&self, stage: Stage, d: std::time::Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.stages[stage as usize].observe(&STAGE_BUCKETS_US, us);
    }

    /// Records how long one share fetch spent in a stage.
    pub fn share_stage(&self, stage: ShareStage, d: std::time::Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.share_stages[stage as usize].observe(&STAGE_BUCKETS_US, us);
    }

    /// Adds received bytes.
    pub fn add_in(&self, n: usize) {
        add(&self.bytes_in, n as u64);
    }

    /// Adds sent bytes.
    pub fn add_out(&self, n: usize) {
        add(&self.bytes_out, n as u64);
    }

    /// Adds bytes of batches fetched from leaders.
    pub fn replication_in(&self, n: u64) {
        add(&self.replication_in, n);
    }

    /// Adds bytes of batches sent to followers.
    pub fn replication_out(&self, n: u64) {
        add(&self.replication_out, n);
    }
}

/// A replicated partition this core leads, for the metrics.
#[derive(Debug, Clone)]
pub(crate) struct LeaderStats {
    pub(crate) topic: String,
    pub(crate) partition: u32,
    pub(crate) isr: usize,
    pub(crate) replicas: usize,
    pub(crate) min_isr: u32,
    /// Per follower node: records and bytes behind the leader's log end
    /// (as of its last fetch).
    pub(crate) lag: Vec<(u64, u64, u64)>,
}

/// A `Send` copy of one histogram: per-bucket counts (not cumulative),
/// the count and the sum in µs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Hist {
    pub(crate) count: u64,
    pub(crate) sum_us: u64,
    pub(crate) buckets: Vec<u64>,
}

impl Hist {
    /// Writes `NAME_bucket{LABELS,le=…}` lines over `bounds_us`
    /// (cumulative), `+Inf`, `NAME_sum` and `NAME_count`, in seconds.
    fn render(&self, o: &mut String, name: &str, labels: &str, bounds_us: &[u64]) {
        let mut cum = 0;
        for (b, n) in bounds_us.iter().zip(&self.buckets) {
            cum += n;
            let le = *b as f64 / 1e6;
            let _ = writeln!(o, "{name}_bucket{{{labels},le=\"{le}\"}} {cum}");
        }
        let (count, sum) = (self.count, self.sum_us as f64 / 1e6);
        let _ = writeln!(o, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let _ = writeln!(o, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(o, "{name}_count{{{labels}}} {count}");
    }
}

/// A `Send` copy of one core's metrics.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The core.
    pub core: usize,
    /// Per API: (errors, latency).
    pub(crate) apis: Vec<(u64, Hist)>,
    /// Per produce stage.
    pub(crate) stages: Vec<Hist>,
    /// Per share-fetch stage.
    pub(crate) share_stages: Vec<Hist>,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    pub(crate) connections: u64,
    pub(crate) connections_refused: u64,
    pub(crate) frame_timeouts: u64,
    pub(crate) tls_handshake_failures: u64,
    pub(crate) sasl_authentications: u64,
    pub(crate) sasl_authentication_failures: u64,
    pub(crate) otlp: [[u64; OTLP_SIGNALS.len()]; OTLP_COUNTERS.len()],
    pub(crate) open_connections: u64,
    pub(crate) pending_replies: u64,
    pub(crate) running_waits: u64,
    pub(crate) metadata_version: u64,
    pub(crate) storage: ShardStats,
    pub(crate) partitions: Vec<(String, u32, u64, u64, u64)>,
    /// Compacted partitions' dirty ratios.
    pub(crate) dirty: Vec<(String, u32, f64)>,
    pub(crate) replication_in: u64,
    pub(crate) replication_out: u64,
    pub(crate) leaders: Vec<LeaderStats>,
    /// The reactor: longest timer lateness (µs), longest stall (µs),
    /// stalls.
    pub(crate) reactor: (u64, u64, u64),
    /// Tiered storage: the counters of [`TIER_COUNTERS`], in its order.
    pub(crate) tier: Vec<u64>,
    /// Tiered storage: bytes of tiered partitions' logs this core holds
    /// not yet in the remote tier (upload lag; local disk they hold).
    pub(crate) tier_upload_lag_bytes: u64,
}

/// The `signal` label of the OTLP counters: an export's signal, or
/// `unknown` for a request refused before it names one (a wrong path).
pub const OTLP_SIGNALS: [&str; 4] = ["traces", "metrics", "logs", "unknown"];

/// The OTLP counters (per signal), in [`Metrics::otlp`]'s order.
pub const OTLP_COUNTERS: [(&str, &str); 5] = [
    (
        "weir_otlp_exports_total",
        "OTLP exports answered success (partial successes too).",
    ),
    (
        "weir_otlp_items_total",
        "Spans, metric data points and log records OTLP exports wrote.",
    ),
    (
        "weir_otlp_refused_total",
        "OTLP exports refused for good: malformed, too large, not allowed (not retried by exporters).",
    ),
    (
        "weir_otlp_retry_later_total",
        "OTLP exports answered retry-later: a full buffer, no leader or in-sync replicas, a deadline, a missing topic, a quota.",
    ),
    (
        "weir_otlp_forwarded_batches_total",
        "Record batches of OTLP exports handed on to the node leading their partition.",
    ),
];

/// Indexes of [`OTLP_COUNTERS`].
pub mod otlp_counter {
    /// Exports answered success.
    pub const EXPORTS: usize = 0;
    /// Items written.
    pub const ITEMS: usize = 1;
    /// Exports refused for good.
    pub const REFUSED: usize = 2;
    /// Exports answered retry-later.
    pub const RETRY_LATER: usize = 3;
    /// Batches handed on.
    pub const FORWARDED: usize = 4;
}

impl Metrics {
    /// Adds `n` to OTLP counter `counter` (an [`otlp_counter`] index) of
    /// `signal` (`None`: not known).
    pub fn otlp_add(&self, counter: usize, signal: Option<weir_otlp::Signal>, n: u64) {
        let j = match signal {
            Some(weir_otlp::Signal::Traces) => 0,
            Some(weir_otlp::Signal::Metrics) => 1,
            Some(weir_otlp::Signal::Logs) => 2,
            None => 3,
        };
        let c = &self.otlp[counter][j];
        c.set(c.get() + n);
    }
}

/// Tiered storage's counters: name, help.
pub const TIER_COUNTERS: [(&str, &str); 12] = [
    ("weir_remote_uploads_total", "Segments uploaded to the remote tier (metadata committed)."),
    ("weir_remote_uploaded_bytes_total", "Bytes of segments uploaded to the remote tier."),
    ("weir_remote_upload_errors_total", "Uploads to the remote tier that failed (retried at the next pass)."),
    ("weir_remote_deletes_total", "Remote segments deleted by retention."),
    ("weir_remote_delete_errors_total", "Deletions of remote objects that failed."),
    ("weir_remote_fetches_total", "Fetches served from the remote tier."),
    ("weir_remote_fetch_bytes_total", "Bytes of batches served from the remote tier."),
    ("weir_remote_fetch_errors_total", "Fetches from the remote tier that failed (answered retriable)."),
    ("weir_remote_fetch_seconds_total", "Time spent serving fetches from the remote tier (divide by weir_remote_fetches_total for the mean)."),
    ("weir_remote_chunks_read_total", "Chunks of remote segments read from the object store (misses and read-ahead)."),
    ("weir_remote_copy_throttle_seconds_total", "Time uploads to the remote tier waited for --remote-log-manager-copy-max-bytes-per-second."),
    ("weir_remote_orphans_deleted_total", "Remote objects no remote log metadata named, deleted by the sweep (a deposed leader's late writes)."),
];

/// A one-sample-per-core metric: name, type, help, value.
type Simple = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Snapshot) -> f64,
);

/// A per-partition metric of the replicated partitions a core leads:
/// name, help, value.
type PerLeader = (&'static str, &'static str, fn(&LeaderStats) -> u64);

/// Renders every core's snapshot as Prometheus text.
pub fn render(snaps: &[Snapshot]) -> String {
    let mut o = String::new();
    let family = |name: &str, kind: &str, help: &str, o: &mut String| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    family(
        "weir_requests_total",
        "counter",
        "Requests handled, by API and core.",
        &mut o,
    );
    for s in snaps {
        for (i, a) in s.apis.iter().enumerate() {
            let _ = writeln!(
                o,
                "weir_requests_total{{api=\"{}\",core=\"{}\"}} {}",
                api_name(i),
                s.core,
                a.1.count
            );
        }
    }
    family(
        "weir_request_errors_total",
        "counter",
        "Requests answered with a frame-level error.",
        &mut o,
    );
    for s in snaps {
        for (i, a) in s.apis.iter().enumerate() {
            let _ = writeln!(
                o,
                "weir_request_errors_total{{api=\"{}\",core=\"{}\"}} {}",
                api_name(i),
                s.core,
                a.0
            );
        }
    }
    family(
        "weir_request_duration_seconds",
        "histogram",
        "Request latency on the broker, by API and core.",
        &mut o,
    );
    for s in snaps {
        for (i, a) in s.apis.iter().enumerate() {
            let labels = format!("api=\"{}\",core=\"{}\"", api_name(i), s.core);
            a.1.render(
                &mut o,
                "weir_request_duration_seconds",
                &labels,
                &LATENCY_BUCKETS_US,
            );
        }
    }
    let stage_family = |o: &mut String,
                        name: &str,
                        help: &str,
                        stages: &[&str],
                        pick: fn(&Snapshot) -> &[Hist]| {
        family(name, "histogram", help, o);
        for s in snaps {
            for (stage, h) in stages.iter().zip(pick(s)) {
                let labels = format!("stage=\"{stage}\",core=\"{}\"", s.core);
                h.render(o, name, &labels, &STAGE_BUCKETS_US);
            }
        }
    };
    stage_family(
        &mut o,
        "weir_produce_stage_seconds",
        "Time a produced batch spent in each stage on its owner core: append (order, \
         validation, copy), write (until written to its segment), sync (until its flush \
         policy is met). The rest of a produce's weir_request_duration_seconds is decoding, \
         routing and the answer.",
        &PRODUCE_STAGES,
        |s| &s.stages,
    );
    stage_family(
        &mut o,
        "weir_share_fetch_stage_seconds",
        "Time a share fetch (Kafka's ShareFetch or the native one) spent in each stage on \
         its partitions' core: acquire (acquiring records and reading them), wait (nothing \
         to acquire: waiting for records to arrive or free up), store (waiting for its \
         acknowledgements to be durable, past what ran beside the acquisition). The rest of \
         its weir_request_duration_seconds is decoding, routing, the answer and the wait \
         for the connection's writer.",
        &SHARE_FETCH_STAGES,
        |s| &s.share_stages,
    );
    let simple: [Simple; 33] = [
        (
            "weir_replication_bytes_in_total",
            "counter",
            "Bytes of batches this core's followers fetched from leaders.",
            |s| s.replication_in as f64,
        ),
        (
            "weir_replication_bytes_out_total",
            "counter",
            "Bytes of batches this core sent to followers.",
            |s| s.replication_out as f64,
        ),
        (
            "weir_mesh_running_waits",
            "gauge",
            "Requests from other cores in a long wait (long polls, held heartbeats) on this core.",
            |s| s.running_waits as f64,
        ),
        (
            "weir_connections_refused_total",
            "counter",
            "Connections closed at once: the core had --max-connections-per-core open.",
            |s| s.connections_refused as f64,
        ),
        (
            "weir_frame_read_timeouts_total",
            "counter",
            "Connections closed: a frame did not arrive whole within --frame-read-timeout-ms.",
            |s| s.frame_timeouts as f64,
        ),
        (
            "weir_tls_handshake_failures_total",
            "counter",
            "Connections closed: their TLS handshake failed or did not finish in time.",
            |s| s.tls_handshake_failures as f64,
        ),
        (
            "weir_sasl_authentications_total",
            "counter",
            "SASL logins that succeeded (re-authentications too).",
            |s| s.sasl_authentications as f64,
        ),
        (
            "weir_sasl_authentication_failures_total",
            "counter",
            "SASL logins that failed: bad credentials or tokens, no login in time, requests before one.",
            |s| s.sasl_authentication_failures as f64,
        ),
        (
            "weir_connections_open",
            "gauge",
            "Connections open now.",
            |s| s.open_connections as f64,
        ),
        (
            "weir_mesh_pending_replies",
            "gauge",
            "Cross-core requests this core sent that wait for an answer.",
            |s| s.pending_replies as f64,
        ),
        (
            "weir_metadata_version",
            "gauge",
            "Version of the metadata view this core applied.",
            |s| s.metadata_version as f64,
        ),
        (
            "weir_cleaner_passes_total",
            "counter",
            "Cleaner passes that rewrote segments of compacted partitions.",
            |s| s.storage.cleaner_passes as f64,
        ),
        (
            "weir_cleaner_read_bytes_total",
            "counter",
            "Bytes the cleaner read.",
            |s| s.storage.cleaner_bytes_read as f64,
        ),
        (
            "weir_cleaner_written_bytes_total",
            "counter",
            "Bytes the cleaner wrote.",
            |s| s.storage.cleaner_bytes_written as f64,
        ),
        (
            "weir_cleaner_removed_records_total",
            "counter",
            "Records the cleaner removed (superseded, expired tombstones, without a key).",
            |s| s.storage.cleaner_records_removed as f64,
        ),
        (
            "weir_cleaner_seconds_total",
            "counter",
            "Time spent in cleaner passes.",
            |s| s.storage.cleaner_micros as f64 / 1e6,
        ),
        (
            "weir_read_ahead_bytes_total",
            "counter",
            "Bytes read from disk ahead of sequential readers (into the batch cache).",
            |s| s.storage.read_ahead_bytes as f64,
        ),
        (
            "weir_recovery_scanned_segments_total",
            "counter",
            "Segments scanned by recovery at start-up (0 after a clean shutdown).",
            |s| s.storage.recovery_scanned_segments as f64,
        ),
        (
            "weir_recovery_truncated_bytes_total",
            "counter",
            "Bytes of torn or corrupt tails cut by recovery.",
            |s| s.storage.recovery_truncated_bytes as f64,
        ),
        (
            "weir_bytes_in_total",
            "counter",
            "Request bytes received.",
            |s| s.bytes_in as f64,
        ),
        (
            "weir_bytes_out_total",
            "counter",
            "Response bytes sent.",
            |s| s.bytes_out as f64,
        ),
        (
            "weir_connections_total",
            "counter",
            "Connections accepted.",
            |s| s.connections as f64,
        ),
        (
            "weir_cache_hits_total",
            "counter",
            "Batch cache hits.",
            |s| s.storage.cache.hits as f64,
        ),
        (
            "weir_cache_misses_total",
            "counter",
            "Batch cache misses (reads from disk).",
            |s| s.storage.cache.misses as f64,
        ),
        (
            "weir_cache_bytes",
            "gauge",
            "Bytes held by the batch cache.",
            |s| s.storage.cache.bytes as f64,
        ),
        (
            "weir_fsync_total",
            "counter",
            "Sync calls: fdatasyncs, and syncfs calls that each made several files durable.",
            |s| s.storage.fdatasyncs as f64,
        ),
        (
            "weir_fsync_shared_total",
            "counter",
            "Syncs that made several files durable at once (one syncfs for a flush round's files).",
            |s| s.storage.shared_syncs as f64,
        ),
        (
            "weir_fsync_seconds_total",
            "counter",
            "Time spent in fdatasync.",
            |s| s.storage.fdatasync_micros as f64 / 1e6,
        ),
        (
            "weir_fsync_seconds_max",
            "gauge",
            "Longest fdatasync.",
            |s| s.storage.fdatasync_micros_max as f64 / 1e6,
        ),
        (
            "weir_flush_rounds_total",
            "counter",
            "Group-commit flush rounds.",
            |s| s.storage.flush_rounds as f64,
        ),
        (
            "weir_reactor_timer_lateness_seconds_max",
            "gauge",
            "Longest a due timer of the core waited to fire (busy or stalled), since the start.",
            |s| s.reactor.0 as f64 / 1e6,
        ),
        (
            "weir_reactor_stall_seconds_max",
            "gauge",
            "Longest stall with work pending: the reactor slept past a due timer (at least 100 ms, the executor idle), since the start.",
            |s| s.reactor.1 as f64 / 1e6,
        ),
        (
            "weir_reactor_stalls_total",
            "counter",
            "Stalls with work pending (see weir_reactor_stall_seconds_max).",
            |s| s.reactor.2 as f64,
        ),
    ];
    for (name, kind, help, f) in simple {
        family(name, kind, help, &mut o);
        for s in snaps {
            let _ = writeln!(o, "{name}{{core=\"{}\"}} {}", s.core, f(s));
        }
    }
    for (i, (name, help)) in OTLP_COUNTERS.iter().enumerate() {
        family(name, "counter", help, &mut o);
        for s in snaps {
            for (j, signal) in OTLP_SIGNALS.iter().enumerate() {
                let v = s.otlp[i][j];
                let _ = writeln!(o, "{name}{{signal=\"{signal}\",core=\"{}\"}} {v}", s.core);
            }
        }
    }
    for (i, (name, help)) in TIER_COUNTERS.iter().enumerate() {
        family(name, "counter", help, &mut o);
        for s in snaps {
            let v = s.tier.get(i).copied().unwrap_or(0);
            // The time counters are kept in µs.
            let v = if name.ends_with("_seconds_total") {
                v as f64 / 1e6
            } else {
                v as f64
            };
            let _ = writeln!(o, "{name}{{core=\"{}\"}} {v}", s.core);
        }
    }
    family(
        "weir_remote_upload_lag_bytes",
        "gauge",
        "Bytes of tiered partitions' logs not yet in the remote tier (held on local disk until uploaded).",
        &mut o,
    );
    for s in snaps {
        let _ = writeln!(
            o,
            "weir_remote_upload_lag_bytes{{core=\"{}\"}} {}",
            s.core, s.tier_upload_lag_bytes
        );
    }
    family(
        "weir_fsync_duration_seconds",
        "histogram",
        "fdatasync latency of segment files, by core.",
        &mut o,
    );
    for s in snaps {
        let st = &s.storage;
        let h = Hist {
            count: st.fdatasyncs,
            sum_us: st.fdatasync_micros,
            buckets: st.fdatasync_buckets.to_vec(),
        };
        h.render(
            &mut o,
            "weir_fsync_duration_seconds",
            &format!("core=\"{}\"", s.core),
            &weir_storage::shard::FSYNC_BUCKETS_US,
        );
    }
    family(
        "weir_cache_hit_ratio",
        "gauge",
        "Cache hits / lookups.",
        &mut o,
    );
    for s in snaps {
        let c = s.storage.cache;
        let ratio = if c.hits + c.misses == 0 {
            0.0
        } else {
            c.hits as f64 / (c.hits + c.misses) as f64
        };
        let _ = writeln!(o, "weir_cache_hit_ratio{{core=\"{}\"}} {ratio}", s.core);
    }
    for (name, help, idx) in [
        (
            "weir_partition_log_end_offset",
            "Offset the next record gets.",
            0,
        ),
        (
            "weir_partition_log_start_offset",
            "First readable offset.",
            1,
        ),
        ("weir_partition_size_bytes", "Bytes of log on disk.", 2),
    ] {
        family(name, "gauge", help, &mut o);
        for s in snaps {
            for (t, p, leo, start, size) in &s.partitions {
                let v = [leo, start, size][idx];
                let _ = writeln!(
                    o,
                    "{name}{{topic=\"{t}\",partition=\"{p}\",core=\"{}\"}} {v}",
                    s.core
                );
            }
        }
    }
    let per_leader: [PerLeader; 3] = [
        (
            "weir_partition_isr_size",
            "In-sync replicas of a replicated partition this core leads.",
            |l| l.isr as u64,
        ),
        (
            "weir_partition_under_replicated",
            "1 if the partition's ISR is smaller than its replicas.",
            |l| u64::from(l.isr < l.replicas),
        ),
        (
            "weir_partition_under_min_isr",
            "1 if the partition's ISR is smaller than min.insync.replicas (acks=all refused).",
            |l| u64::from((l.isr as u32) < l.min_isr),
        ),
    ];
    for (name, help, value) in per_leader {
        family(name, "gauge", help, &mut o);
        for s in snaps {
            for l in &s.leaders {
                let _ = writeln!(
                    o,
                    "{name}{{topic=\"{}\",partition=\"{}\",core=\"{}\"}} {}",
                    l.topic,
                    l.partition,
                    s.core,
                    value(l)
                );
            }
        }
    }
    for (name, help, bytes) in [
        (
            "weir_follower_lag_records",
            "Records a follower is behind its leader's log end (as of its last fetch), by follower node.",
            false,
        ),
        (
            "weir_follower_lag_bytes",
            "Bytes of log a follower has still to fetch (as of its last fetch; from the index entry at or below its offset), by follower node.",
            true,
        ),
    ] {
        family(name, "gauge", help, &mut o);
        for s in snaps {
            for l in &s.leaders {
                for (node, records, size) in &l.lag {
                    let behind = if bytes { size } else { records };
                    let _ = writeln!(
                        o,
                        "{name}{{topic=\"{}\",partition=\"{}\",follower=\"{node}\",core=\"{}\"}} {behind}",
                        l.topic, l.partition, s.core
                    );
                }
            }
        }
    }
    family(
        "weir_partition_dirty_ratio",
        "gauge",
        "Compacted partitions: share of the cleanable log not compacted yet.",
        &mut o,
    );
    for s in snaps {
        for (t, p, r) in &s.dirty {
            let _ = writeln!(
                o,
                "weir_partition_dirty_ratio{{topic=\"{t}\",partition=\"{p}\",core=\"{}\"}} {r}",
                s.core
            );
        }
    }
    o
}

fn api_name(i: usize) -> String {
    ApiKey::ALL
        .get(i)
        .map(|a| format!("{a:?}"))
        .unwrap_or_else(|| i.to_string())
}
