//! Where publish latency goes: the Weir SDK producers' own stages (a batch
//! open, closed but not yet sent, the request's round trip) and, when the
//! broker's metrics endpoint is known, the broker's produce stages
//! (`weir_produce_stage_seconds`, `weir_request_duration_seconds` of
//! Produce, `weir_fsync_duration_seconds`), each over the measured phase
//! only (the difference of two readings).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_client::Producer;

/// Largest metrics page read (the broker's is a few tens of KiB).
const METRICS_PAGE_BYTES_MAX: usize = 16 << 20;
/// How long one reading of the metrics page may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// The SDK producers' stages over the measured phase (means per batch).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProducerStages {
    /// Batches first sent.
    pub batches: u64,
    /// Produce requests sent (with retries).
    pub requests: u64,
    /// Records acknowledged per batch sent, on average.
    pub records_per_batch: f64,
    /// Mean time from a batch's first record to its closing (full, linger
    /// passed, flush).
    pub batch_open_ms_mean: f64,
    /// Mean time from closing a batch to its first send (room in flight).
    pub batch_queued_ms_mean: f64,
    /// Mean time from sending a produce request to its answer.
    pub request_ms_mean: f64,
}

/// Cumulative figures of the SDK producers at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProducerReading {
    batches: u64,
    requests: u64,
    records: u64,
    open_us: f64,
    queued_us: f64,
    request_us: f64,
}

/// Reads the producers' statistics (sums rebuilt from their means).
pub fn read_producers(producers: &[Arc<Producer>]) -> ProducerReading {
    let mut r = ProducerReading::default();
    for p in producers {
        let s = p.statistics();
        r.batches += s.batches_sent;
        r.requests += s.requests;
        r.records += s.records_sent;
        r.open_us += s.batch_open_mean.as_micros() as f64 * s.batches_sent as f64;
        r.queued_us += s.batch_queued_mean.as_micros() as f64 * s.batches_sent as f64;
        r.request_us += s.request_latency_mean.as_micros() as f64 * s.requests as f64;
    }
    r
}

/// The stages between two readings; `None` without batches.
pub fn producer_stages(start: ProducerReading, end: ProducerReading) -> Option<ProducerStages> {
    let batches = end.batches.saturating_sub(start.batches);
    let requests = end.requests.saturating_sub(start.requests);
    if batches == 0 {
        return None;
    }
    let per = |a: f64, b: f64, n: u64| ((b - a) / n.max(1) as f64 / 1e3).max(0.0);
    Some(ProducerStages {
        batches,
        requests,
        records_per_batch: end.records.saturating_sub(start.records) as f64 / batches as f64,
        batch_open_ms_mean: per(start.open_us, end.open_us, batches),
        batch_queued_ms_mean: per(start.queued_us, end.queued_us, batches),
        request_ms_mean: per(start.request_us, end.request_us, requests),
    })
}

/// One broker stage over the measured phase, all cores together.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StageFigures {
    /// Observations (batches for the produce stages, requests for
    /// `request`, calls for `fdatasync`).
    pub count: u64,
    /// Mean, ms.
    pub mean_ms: f64,
    /// Median, ms: the upper bound of the histogram bucket it falls in.
    pub p50_ms: f64,
    /// 99th percentile, ms, likewise.
    pub p99_ms: f64,
}

/// Histograms read off a metrics page: (count, sum s, [(le s, cumulative)])
/// per stage, cores added up.
#[derive(Debug, Clone, Default)]
pub struct BrokerReading {
    stages: BTreeMap<String, (u64, f64, BTreeMap<u64, u64>)>,
}

/// Reads the broker's metrics page at `addr` (`GET /metrics`).
pub async fn read_broker(addr: SocketAddr) -> anyhow::Result<BrokerReading> {
    let page = tokio::time::timeout(SCRAPE_TIMEOUT, fetch_page(addr))
        .await
        .with_context(|| format!("reading http://{addr}/metrics took over {SCRAPE_TIMEOUT:?}"))??;
    Ok(parse(&page))
}

/// The sum of every series of metric `name` on the broker's `/metrics`
/// whose labels contain `label` (all of them for `""`).
pub async fn read_sum(addr: SocketAddr, name: &str, label: &str) -> anyhow::Result<f64> {
    let page = tokio::time::timeout(SCRAPE_TIMEOUT, fetch_page(addr))
        .await
        .with_context(|| format!("reading http://{addr}/metrics took over {SCRAPE_TIMEOUT:?}"))??;
    Ok(page
        .lines()
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, labels) = series.split_once('{').unwrap_or((series, ""));
            (n == name && labels.contains(label)).then(|| value.parse::<f64>().ok())?
        })
        .sum())
}

async fn fetch_page(addr: SocketAddr) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the broker's metrics at {addr}"))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: weir\r\n\r\n")
        .await?;
    let mut body = Vec::new();
    (&mut s)
        .take(METRICS_PAGE_BYTES_MAX as u64)
        .read_to_end(&mut body)
        .await?;
    let text = String::from_utf8_lossy(&body).into_owned();
    let (head, page) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("http://{addr}/metrics: not an HTTP answer"))?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.") && head.split(' ').nth(1) == Some("200"),
        "http://{addr}/metrics answered `{}`",
        head.lines().next().unwrap_or("")
    );
    Ok(page.to_string())
}

/// The stage a histogram line belongs to, if it is one we report.
fn stage_of(name: &str, labels: &str) -> Option<String> {
    let label = |k: &str| {
        labels
            .split(',')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
            .and_then(|v| v.strip_suffix('"'))
            .map(str::to_string)
    };
    match name {
        "weir_produce_stage_seconds" => label("stage"),
        "weir_request_duration_seconds" if label("api").as_deref() == Some("Produce") => {
            Some("request".into())
        }
        "weir_fsync_duration_seconds" => Some("fdatasync".into()),
        _ => None,
    }
}

fn parse(page: &str) -> BrokerReading {
    let mut r = BrokerReading::default();
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        let (base, part) = if let Some(b) = name.strip_suffix("_bucket") {
            (b, "bucket")
        } else if let Some(b) = name.strip_suffix("_sum") {
            (b, "sum")
        } else if let Some(b) = name.strip_suffix("_count") {
            (b, "count")
        } else {
            continue;
        };
        let Some(stage) = stage_of(base, labels) else {
            continue;
        };
        let e = r.stages.entry(stage).or_default();
        match part {
            "sum" => e.1 += value,
            "count" => e.0 += value as u64,
            _ => {
                let le = labels
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("le=\""))
                    .and_then(|v| v.strip_suffix('"'))
                    .and_then(|v| v.parse::<f64>().ok());
                // `+Inf` is the count; bounds kept in ns for exact keys.
                if let Some(le) = le.filter(|l| l.is_finite()) {
                    *e.2.entry((le * 1e9).round() as u64).or_default() += value as u64;
                }
            }
        }
    }
    r
}

/// The broker's stages between two readings (stages without observations
/// left out).
pub fn broker_stages(start: &BrokerReading, end: &BrokerReading) -> BTreeMap<String, StageFigures> {
    let mut out = BTreeMap::new();
    for (stage, (count, sum, buckets)) in &end.stages {
        let (c0, s0, b0) = start.stages.get(stage).cloned().unwrap_or_default();
        let n = count.saturating_sub(c0);
        if n == 0 {
            continue;
        }
        let quantile = |q: f64| {
            let want = (q * n as f64).ceil() as u64;
            buckets
                .iter()
                .map(|(le, cum)| (*le, cum.saturating_sub(b0.get(le).copied().unwrap_or(0))))
                .find(|(_, cum)| *cum >= want)
                // Past the last finite bound: reported as that bound.
                .or_else(|| buckets.keys().next_back().map(|le| (*le, n)))
                .map_or(0.0, |(le, _)| le as f64 / 1e6)
        };
        out.insert(
            stage.clone(),
            StageFigures {
                count: n,
                mean_ms: (sum - s0).max(0.0) / n as f64 * 1e3,
                p50_ms: quantile(0.5),
                p99_ms: quantile(0.99),
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE_A: &str = "\
# TYPE weir_produce_stage_seconds histogram
weir_produce_stage_seconds_bucket{stage=\"sync\",core=\"0\",le=\"0.0001\"} 1
weir_produce_stage_seconds_bucket{stage=\"sync\",core=\"0\",le=\"0.001\"} 2
weir_produce_stage_seconds_bucket{stage=\"sync\",core=\"0\",le=\"+Inf\"} 2
weir_produce_stage_seconds_sum{stage=\"sync\",core=\"0\"} 0.0006
weir_produce_stage_seconds_count{stage=\"sync\",core=\"0\"} 2
weir_request_duration_seconds_bucket{api=\"Fetch\",core=\"0\",le=\"0.001\"} 7
weir_request_duration_seconds_count{api=\"Fetch\",core=\"0\"} 7
";

    const PAGE_B: &str = "\
weir_produce_stage_seconds_bucket{stage=\"sync\",core=\"0\",le=\"0.0001\"} 1
weir_produce_stage_seconds_bucket{stage=\"sync\",core=\"0\",le=\"0.001\"} 52
weir_produce_stage_seconds_bucket{stage=\"sync\",core=\"0\",le=\"+Inf\"} 102
weir_produce_stage_seconds_sum{stage=\"sync\",core=\"0\"} 0.3606
weir_produce_stage_seconds_count{stage=\"sync\",core=\"0\"} 102
weir_produce_stage_seconds_bucket{stage=\"sync\",core=\"1\",le=\"0.0001\"} 0
weir_produce_stage_seconds_bucket{stage=\"sync\",core=\"1\",le=\"0.001\"} 0
weir_produce_stage_seconds_count{stage=\"sync\",core=\"1\"} 0
weir_produce_stage_seconds_sum{stage=\"sync\",core=\"1\"} 0
";

    #[test]
    fn broker_stages_are_the_difference_of_two_pages_over_all_cores() {
        let s = broker_stages(&parse(PAGE_A), &parse(PAGE_B));
        assert_eq!(
            s.len(),
            1,
            "Fetch latencies and empty stages left out: {s:?}"
        );
        let sync = &s["sync"];
        assert_eq!(sync.count, 100);
        assert!((sync.mean_ms - 3.6).abs() < 1e-9, "{}", sync.mean_ms);
        // 50 of the 100 new observations fell at or below 1 ms.
        assert_eq!(sync.p50_ms, 1.0);
        // The rest are past the last finite bound: reported as that bound.
        assert_eq!(sync.p99_ms, 1.0);
    }

    #[test]
    fn producer_stages_are_means_over_the_measured_phase() {
        let a = ProducerReading {
            batches: 10,
            requests: 10,
            records: 100,
            open_us: 10_000.0,
            queued_us: 0.0,
            request_us: 5_000.0,
        };
        let b = ProducerReading {
            batches: 30,
            requests: 20,
            records: 500,
            open_us: 50_000.0,
            queued_us: 4_000.0,
            request_us: 25_000.0,
        };
        let s = producer_stages(a, b).unwrap();
        assert_eq!(s.batches, 20);
        assert_eq!(s.records_per_batch, 20.0);
        assert_eq!(s.batch_open_ms_mean, 2.0);
        assert_eq!(s.batch_queued_ms_mean, 0.2);
        assert_eq!(s.request_ms_mean, 2.0);
        assert_eq!(producer_stages(b, b), None);
    }
}
