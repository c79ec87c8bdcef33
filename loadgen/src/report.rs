//! The benchmark report: latency percentiles, per-second intervals, totals,
//! machine description, JSON (de)serialization and the human summary printed
//! at the end of a run.
//!
//! Latency histograms are [`hdrhistogram::Histogram<u64>`] recorded in
//! microseconds; everything in the report is in milliseconds.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use serde::{Deserialize, Deserializer, Serialize};

/// Name and version of the tool, as recorded in [`Report::tool`].
pub const TOOL: &str = concat!("weir-bench ", env!("CARGO_PKG_VERSION"));

/// Quantiles at which [`Percentiles::curve`] samples a histogram.
pub const CURVE_QUANTILES: [f64; 11] = [
    0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99999, 1.0,
];

/// Reads an `f64` that may have been written as `null`: `serde_json` writes
/// non-finite floats (NaN, infinities) as `null`, which would otherwise make
/// a report unreadable. `null` reads back as NaN.
fn f64_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Microseconds (the histograms' unit) to milliseconds.
fn us_to_ms(us: f64) -> f64 {
    us / 1000.0
}

/// Summary of one latency distribution, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Number of samples.
    pub count: u64,
    /// Mean latency (ms).
    #[serde(deserialize_with = "f64_or_nan")]
    pub mean_ms: f64,
    /// Median (ms).
    #[serde(deserialize_with = "f64_or_nan")]
    pub p50_ms: f64,
    /// 75th percentile (ms).
    #[serde(deserialize_with = "f64_or_nan")]
    pub p75_ms: f64,
    /// 95th percentile (ms).
    #[serde(deserialize_with = "f64_or_nan")]
    pub p95_ms: f64,
    /// 99th percentile (ms).
    #[serde(deserialize_with = "f64_or_nan")]
    pub p99_ms: f64,
    /// 99.9th percentile (ms).
    #[serde(deserialize_with = "f64_or_nan")]
    pub p999_ms: f64,
    /// 99.99th percentile (ms).
    #[serde(deserialize_with = "f64_or_nan")]
    pub p9999_ms: f64,
    /// Maximum (ms).
    #[serde(deserialize_with = "f64_or_nan")]
    pub max_ms: f64,
    /// The percentile curve: `(quantile, latency ms)` at each of
    /// [`CURVE_QUANTILES`]; empty when `count == 0`.
    #[serde(default)]
    pub curve: Vec<(f64, f64)>,
}

impl Percentiles {
    /// Summarizes a histogram recorded in microseconds (values are
    /// converted to milliseconds, within the histogram's precision).
    /// An empty histogram gives all zeros, `count == 0` and an empty curve.
    pub fn from_histogram(h: &hdrhistogram::Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        let q = |q: f64| us_to_ms(h.value_at_quantile(q) as f64);
        Percentiles {
            count: h.len(),
            mean_ms: us_to_ms(h.mean()),
            p50_ms: q(0.5),
            p75_ms: q(0.75),
            p95_ms: q(0.95),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            p9999_ms: q(0.9999),
            max_ms: us_to_ms(h.max() as f64),
            curve: CURVE_QUANTILES.iter().map(|&x| (x, q(x))).collect(),
        }
    }
}

/// One second of the run (warm-up intervals included, flagged).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Seconds since the start of the run, at the end of the interval.
    #[serde(deserialize_with = "f64_or_nan")]
    pub t_s: f64,
    /// Whether the interval belongs to the warm-up phase.
    pub warmup: bool,
    /// Records acknowledged per second in the interval.
    #[serde(deserialize_with = "f64_or_nan")]
    pub publish_rate: f64,
    /// Payload megabytes acknowledged per second in the interval.
    #[serde(deserialize_with = "f64_or_nan")]
    pub publish_mb_s: f64,
    /// Failed publishes per second in the interval.
    #[serde(deserialize_with = "f64_or_nan")]
    pub publish_error_rate: f64,
    /// Records consumed per second in the interval.
    #[serde(deserialize_with = "f64_or_nan")]
    pub consume_rate: f64,
    /// Payload megabytes consumed per second in the interval.
    #[serde(deserialize_with = "f64_or_nan")]
    pub consume_mb_s: f64,
    /// Records produced minus consumed (per subscription) at the end of the
    /// interval.
    pub backlog: i64,
    /// Median publish latency in the interval (ms).
    #[serde(deserialize_with = "f64_or_nan")]
    pub publish_latency_p50_ms: f64,
    /// 99th percentile publish latency in the interval (ms).
    #[serde(deserialize_with = "f64_or_nan")]
    pub publish_latency_p99_ms: f64,
    /// Median end-to-end latency in the interval (ms).
    #[serde(deserialize_with = "f64_or_nan")]
    pub end_to_end_latency_p50_ms: f64,
    /// 99th percentile end-to-end latency in the interval (ms).
    #[serde(deserialize_with = "f64_or_nan")]
    pub end_to_end_latency_p99_ms: f64,
}

/// The machine the benchmark ran on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Available parallelism (0 if unknown).
    pub cores: usize,
    /// Total memory in bytes (0 if unknown).
    pub memory_bytes: u64,
    /// Kernel release (empty if unknown).
    pub kernel: String,
    /// Host name (empty if unknown).
    pub hostname: String,
}

impl Machine {
    /// Describes the current machine from `std::thread::available_parallelism`
    /// and `/proc`. Never panics: what cannot be found is 0 or empty.
    pub fn detect() -> Machine {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        Machine {
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            memory_bytes: std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|s| parse_mem_total(&s))
                .unwrap_or(0),
            kernel: read("/proc/sys/kernel/osrelease"),
            hostname: read("/proc/sys/kernel/hostname"),
        }
    }
}

/// Parses the `MemTotal:  <n> kB` line of `/proc/meminfo` into bytes.
fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut parts = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    let mult = match parts.next().map(|u| u.to_ascii_lowercase()) {
        None => 1,
        Some(u) if u == "b" => 1,
        Some(u) if u == "kb" => 1024,
        Some(u) if u == "mb" => 1024 * 1024,
        Some(u) if u == "gb" => 1024 * 1024 * 1024,
        Some(_) => return None,
    };
    n.checked_mul(mult)
}

/// Totals over the measured phase (warm-up excluded).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Records acknowledged.
    pub published: u64,
    /// Failed publishes.
    pub publish_errors: u64,
    /// Records consumed.
    pub consumed: u64,
    /// Payload bytes acknowledged.
    pub published_bytes: u64,
    /// Payload bytes consumed.
    pub consumed_bytes: u64,
    /// Length of the measured phase in seconds.
    #[serde(deserialize_with = "f64_or_nan")]
    pub measured_seconds: f64,
    /// Records acknowledged per second.
    #[serde(deserialize_with = "f64_or_nan")]
    pub publish_rate: f64,
    /// Payload megabytes acknowledged per second.
    #[serde(deserialize_with = "f64_or_nan")]
    pub publish_mb_s: f64,
    /// Records consumed per second.
    #[serde(deserialize_with = "f64_or_nan")]
    pub consume_rate: f64,
    /// Payload megabytes consumed per second.
    #[serde(deserialize_with = "f64_or_nan")]
    pub consume_mb_s: f64,
    /// Every record acknowledged during the run — warm-up, measured phase
    /// and the drain after it (what the broker should hold).
    #[serde(default)]
    pub acknowledged_all: u64,
    /// Every record consumed during the run (all subscriptions).
    #[serde(default)]
    pub consumed_all: u64,
}

/// The result of one benchmark run, written as JSON and summarized on the
/// terminal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// `"weir-bench <version>"` (see [`TOOL`]).
    pub tool: String,
    /// Start of the run, RFC 3339 UTC (see [`rfc3339_utc`]).
    pub started_at: String,
    /// `"produce"`, `"consume"` or `"end-to-end"`.
    pub mode: String,
    /// `"embedded"` or the bootstrap address.
    pub target: String,
    /// The workload's parameters as given.
    pub workload: serde_json::Value,
    /// The machine the run happened on.
    pub machine: Machine,
    /// One entry per second of the run, warm-up included (flagged).
    pub intervals: Vec<Interval>,
    /// Totals of the measured phase (warm-up excluded).
    pub totals: Totals,
    /// From intended send time to acknowledgement (coordinated-omission
    /// free).
    pub publish_latency: Percentiles,
    /// Actual send time minus intended send time (OpenMessaging Benchmark's
    /// "publish delay").
    pub publish_delay: Percentiles,
    /// Consume time minus record timestamp.
    pub end_to_end_latency: Percentiles,
    /// Where publish latency went in the Weir SDK producers (measured
    /// phase; not for `--driver kafka`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer_stages: Option<crate::stages::ProducerStages>,
    /// The broker's produce stages over the measured phase, by stage
    /// (`append`, `write`, `sync`, `request`, `fdatasync`), when its
    /// metrics endpoint was known (`--broker-metrics`, `--embedded`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_stages: Option<std::collections::BTreeMap<String, crate::stages::StageFigures>>,
    /// Whether the run was interrupted (Ctrl-C).
    #[serde(default)]
    pub stopped_early: bool,
    /// Free-form remarks (warnings, settings worth knowing).
    #[serde(default)]
    pub notes: Vec<String>,
}

impl Report {
    /// Writes the report as pretty-printed JSON, creating parent
    /// directories as needed.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating directory {}", parent.display()))?;
        }
        let mut json = serde_json::to_string_pretty(self)
            .with_context(|| format!("serializing report for {}", path.display()))?;
        json.push('\n');
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))
    }

    /// Reads a report written by [`Report::write_json`].
    pub fn read_json(path: &Path) -> anyhow::Result<Report> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// The human summary printed at the end of a run: rates, totals and a
    /// table of the latency distributions (ms) that have samples.
    pub fn summary_table(&self) -> String {
        let mut out = String::new();
        let t = &self.totals;
        let _ = writeln!(
            out,
            "{} | {} against {} | started {}",
            self.tool, self.mode, self.target, self.started_at
        );
        let _ = writeln!(
            out,
            "measured {:.1} s (warm-up excluded){}",
            t.measured_seconds,
            if self.stopped_early {
                ", stopped early (interrupted)"
            } else {
                ""
            }
        );
        let show_publish = self.mode != "consume" || t.published > 0 || t.publish_errors > 0;
        let show_consume = self.mode != "produce" || t.consumed > 0;
        if show_publish {
            let _ = writeln!(
                out,
                "publish: {:>12.1} records/s {:>10.2} MB/s | {} records, {} bytes, {} errors",
                t.publish_rate, t.publish_mb_s, t.published, t.published_bytes, t.publish_errors
            );
        }
        if show_consume {
            let _ = writeln!(
                out,
                "consume: {:>12.1} records/s {:>10.2} MB/s | {} records, {} bytes",
                t.consume_rate, t.consume_mb_s, t.consumed, t.consumed_bytes
            );
        }

        let rows: Vec<(&str, &Percentiles)> = [
            ("publish latency", &self.publish_latency),
            ("publish delay", &self.publish_delay),
            ("end-to-end latency", &self.end_to_end_latency),
        ]
        .into_iter()
        .filter(|(_, p)| p.count > 0)
        .collect();
        out.push('\n');
        if rows.is_empty() {
            out.push_str("no latency samples\n");
        } else {
            let header = [
                "latency (ms)",
                "count",
                "mean",
                "p50",
                "p75",
                "p95",
                "p99",
                "p99.9",
                "p99.99",
                "max",
            ];
            let mut table: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
            for (name, p) in rows {
                let mut row = vec![name.to_string(), p.count.to_string()];
                row.extend(
                    [
                        p.mean_ms, p.p50_ms, p.p75_ms, p.p95_ms, p.p99_ms, p.p999_ms, p.p9999_ms,
                        p.max_ms,
                    ]
                    .iter()
                    .map(|&v| format_ms(v)),
                );
                table.push(row);
            }
            let widths: Vec<usize> = (0..header.len())
                .map(|c| table.iter().map(|r| r[c].len()).max().unwrap_or(0))
                .collect();
            for row in &table {
                let mut line = String::new();
                for (c, cell) in row.iter().enumerate() {
                    if c == 0 {
                        let _ = write!(line, "{:<w$}", cell, w = widths[c]);
                    } else {
                        let _ = write!(line, "  {:>w$}", cell, w = widths[c]);
                    }
                }
                out.push_str(line.trim_end());
                out.push('\n');
            }
        }
        if let Some(p) = &self.producer_stages {
            let _ = writeln!(
                out,
                "\nproducer stages (mean per batch): open {} ms, closed before sent {} ms, \
                 request {} ms; {} batches of {:.1} records, {} requests",
                format_ms(p.batch_open_ms_mean),
                format_ms(p.batch_queued_ms_mean),
                format_ms(p.request_ms_mean),
                p.batches,
                p.records_per_batch,
                p.requests
            );
        }
        if let Some(b) = self.broker_stages.as_ref().filter(|b| !b.is_empty()) {
            out.push_str("broker stages (ms; append/write/sync per batch, request per Produce):\n");
            for (stage, f) in b {
                let _ = writeln!(
                    out,
                    "  {stage:<10} count {:>9}  mean {:>8}  p50 ≤ {:>8}  p99 ≤ {:>8}",
                    f.count,
                    format_ms(f.mean_ms),
                    format_ms(f.p50_ms),
                    format_ms(f.p99_ms)
                );
            }
        }
        if !self.notes.is_empty() {
            out.push_str("\nnotes:\n");
            for note in &self.notes {
                let _ = writeln!(out, "  - {note}");
            }
        }
        out
    }
}

/// Formats a latency in milliseconds as the summary table shows it: three
/// decimals below 100 ms, two above.
pub fn format_ms(ms: f64) -> String {
    if ms.abs() < 100.0 {
        format!("{ms:.3}")
    } else {
        format!("{ms:.2}")
    }
}

/// Formats a point in time as RFC 3339 UTC with whole seconds, e.g.
/// `2023-11-14T22:13:20Z` (sub-second parts are truncated).
pub fn rfc3339_utc(t: SystemTime) -> String {
    let secs: i64 = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => {
            // Before the epoch: round towards negative infinity.
            let d = e.duration();
            let s = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            if d.subsec_nanos() > 0 {
                -s.saturating_add(1)
            } else {
                -s
            }
        }
    };
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day)
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32; // [1, 31]
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32; // [1, 12]
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> String {
        rfc3339_utc(UNIX_EPOCH + Duration::from_secs(secs))
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(11_017), (2000, 3, 1));
    }

    #[test]
    fn rfc3339_edges() {
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(86_399), "1970-01-01T23:59:59Z");
        // 2100 is not a leap year, 2000 was.
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59Z");
        assert_eq!(at(4_107_542_400), "2100-03-01T00:00:00Z");
        assert_eq!(
            rfc3339_utc(UNIX_EPOCH + Duration::from_millis(1_700_000_000_999)),
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(
            rfc3339_utc(UNIX_EPOCH - Duration::from_secs(1)),
            "1969-12-31T23:59:59Z"
        );
        assert_eq!(
            rfc3339_utc(UNIX_EPOCH - Duration::from_millis(500)),
            "1969-12-31T23:59:59Z"
        );
    }

    #[test]
    fn meminfo() {
        let s = "MemTotal:       16318412 kB\nMemFree:         1000 kB\n";
        assert_eq!(parse_mem_total(s), Some(16_318_412 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB"), None);
        assert_eq!(parse_mem_total("MemTotal: x kB"), None);
    }

    #[test]
    fn null_floats_read_as_nan() {
        let mut v = serde_json::to_value(Interval::default()).unwrap();
        v["publish_rate"] = serde_json::Value::Null;
        let i: Interval = serde_json::from_value(v).unwrap();
        assert!(i.publish_rate.is_nan());
    }

    #[test]
    fn ms_format() {
        assert_eq!(format_ms(1.23456), "1.235");
        assert_eq!(format_ms(123.456), "123.46");
    }
}
