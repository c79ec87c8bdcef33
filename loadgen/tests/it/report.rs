//! Report side of weir-bench: percentiles, JSON, summary, timestamps, charts.

use std::time::{Duration, UNIX_EPOCH};

use hdrhistogram::Histogram;
use weir_loadgen::plot::{
    write_charts, LATENCY_DISTRIBUTION_TITLE, LATENCY_OVER_TIME_TITLE, THROUGHPUT_TITLE,
};
use weir_loadgen::report::{
    format_ms, rfc3339_utc, Interval, Machine, Percentiles, Report, Totals, CURVE_QUANTILES, TOOL,
};

fn histogram_1_to_100k() -> Histogram<u64> {
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    for v in 1..=100_000u64 {
        h.record(v).unwrap();
    }
    h
}

/// Within hdrhistogram's 3-significant-digit precision (0.1%), plus a little.
fn close(actual: f64, expected: f64) -> bool {
    (actual - expected).abs() <= expected.abs() * 0.0011
}

fn assert_close(what: &str, actual: f64, expected: f64) {
    assert!(
        close(actual, expected),
        "{what}: {actual} vs expected {expected}"
    );
}

#[test]
fn percentiles_of_known_histogram() {
    let p = Percentiles::from_histogram(&histogram_1_to_100k());
    assert_eq!(p.count, 100_000);
    assert_close("mean", p.mean_ms, 50.0005);
    assert_close("p50", p.p50_ms, 50.0);
    assert_close("p75", p.p75_ms, 75.0);
    assert_close("p95", p.p95_ms, 95.0);
    assert_close("p99", p.p99_ms, 99.0);
    assert_close("p99.9", p.p999_ms, 99.9);
    assert_close("p99.99", p.p9999_ms, 99.99);
    assert_close("max", p.max_ms, 100.0);

    assert_eq!(p.curve.len(), CURVE_QUANTILES.len());
    for (&(q, ms), &expected_q) in p.curve.iter().zip(CURVE_QUANTILES.iter()) {
        assert_eq!(q, expected_q);
        assert_close(&format!("curve at {q}"), ms, 100.0 * q);
    }
    assert!(p.curve.windows(2).all(|w| w[0].1 <= w[1].1));
    assert_eq!(p.curve.last().unwrap().1, p.max_ms);
}

#[test]
fn percentiles_of_empty_histogram() {
    let h = Histogram::<u64>::new(3).unwrap();
    let p = Percentiles::from_histogram(&h);
    assert_eq!(p, Percentiles::default());
    assert_eq!(p.count, 0);
    assert_eq!(p.max_ms, 0.0);
    assert!(p.curve.is_empty());
}

fn sample_report() -> Report {
    let mut e2e = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    for v in [800u64, 1_200, 1_500, 2_000, 25_000] {
        e2e.record(v).unwrap();
    }
    let intervals = (1..=10)
        .map(|t| Interval {
            t_s: t as f64,
            warmup: t <= 3,
            publish_rate: 10_000.0 + 100.0 * t as f64,
            publish_mb_s: 9.5,
            publish_error_rate: 0.0,
            consume_rate: 9_900.0 + 50.0 * t as f64,
            consume_mb_s: 9.25,
            backlog: 100 - t,
            publish_latency_p50_ms: 1.5,
            publish_latency_p99_ms: 4.0 + t as f64 / 4.0,
            end_to_end_latency_p50_ms: 2.0,
            end_to_end_latency_p99_ms: 6.5,
        })
        .collect();
    Report {
        tool: TOOL.to_string(),
        started_at: rfc3339_utc(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
        mode: "end-to-end".to_string(),
        target: "embedded".to_string(),
        workload: serde_json::json!({"name": "1-topic-1-partition-1kb", "partitionsPerTopic": 1, "messageSize": 1024}),
        machine: Machine::detect(),
        producer_stages: None,
        broker_stages: None,
        intervals,
        totals: Totals {
            published: 70_700,
            publish_errors: 3,
            consumed: 70_650,
            published_bytes: 70_700 * 1024,
            consumed_bytes: 70_650 * 1024,
            measured_seconds: 7.0,
            publish_rate: 10_100.0,
            publish_mb_s: 9.5,
            consume_rate: 10_092.5,
            consume_mb_s: 9.25,
            acknowledged_all: 80_000,
            consumed_all: 79_950,
        },
        publish_latency: Percentiles::from_histogram(&histogram_1_to_100k()),
        publish_delay: Percentiles::default(),
        end_to_end_latency: Percentiles::from_histogram(&e2e),
        stopped_early: true,
        notes: vec!["a note".to_string()],
    }
}

#[test]
fn json_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dir/report.json");
    let report = sample_report();
    report.write_json(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\n  \"tool\""), "pretty printed: {text}");
    let back = Report::read_json(&path).unwrap();
    assert_eq!(back, report);
}

#[test]
fn read_json_errors_mention_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let err = format!("{:#}", Report::read_json(&missing).unwrap_err());
    assert!(err.contains("missing.json"), "{err}");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{").unwrap();
    let err = format!("{:#}", Report::read_json(&bad).unwrap_err());
    assert!(err.contains("bad.json"), "{err}");
}

#[test]
fn summary_table_contains_numbers() {
    let report = sample_report();
    let s = report.summary_table();
    println!("{s}");
    for needle in [
        "10100.0", "9.50", "10092.5", "9.25", "70700", "70650", "3 errors", "a note",
    ] {
        assert!(s.contains(needle), "missing {needle:?} in\n{s}");
    }
    for header in ["p50", "p75", "p95", "p99", "p99.9", "p99.99", "max"] {
        assert!(s.contains(header), "missing header {header:?} in\n{s}");
    }
    assert!(s.contains("publish latency"));
    assert!(s.contains("end-to-end latency"));
    assert!(
        !s.contains("publish delay"),
        "empty distribution shown:\n{s}"
    );
    let p = &report.publish_latency;
    for v in [
        p.p50_ms, p.p75_ms, p.p95_ms, p.p99_ms, p.p999_ms, p.p9999_ms, p.max_ms,
    ] {
        assert!(s.contains(&format_ms(v)), "missing {v} in\n{s}");
    }
    let e = &report.end_to_end_latency;
    assert!(s.contains(&format_ms(e.p50_ms)) && s.contains(&format_ms(e.max_ms)));

    // Columns are aligned: the latency rows and the header have equal width
    // up to the last column's end.
    let lines: Vec<&str> = s
        .lines()
        .skip_while(|l| !l.starts_with("latency (ms)"))
        .take(3)
        .collect();
    assert_eq!(lines.len(), 3, "{s}");
    let ends: Vec<usize> = lines.iter().map(|l| l.len()).collect();
    assert!(ends.iter().all(|&e| e == ends[0]), "misaligned:\n{s}");
    let max_col = lines[0].find("max").unwrap() + 3;
    assert_eq!(max_col, ends[0]);
}

#[test]
fn summary_table_without_samples() {
    let mut report = sample_report();
    report.publish_latency = Percentiles::default();
    report.end_to_end_latency = Percentiles::default();
    let s = report.summary_table();
    assert!(!s.contains("p99.99"), "{s}");
    assert!(s.contains("no latency samples"), "{s}");
}

#[test]
fn rfc3339_known_instants() {
    let at = |s: u64| rfc3339_utc(UNIX_EPOCH + Duration::from_secs(s));
    assert_eq!(at(0), "1970-01-01T00:00:00Z");
    assert_eq!(at(1_700_000_000), "2023-11-14T22:13:20Z");
    // Leap day.
    assert_eq!(at(1_709_208_000), "2024-02-29T12:00:00Z");
    assert_eq!(at(1_709_208_000 + 12 * 3600), "2024-03-01T00:00:00Z");
    assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
}

#[test]
fn charts_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("charts");
    let paths = write_charts(&sample_report(), &out).unwrap();
    let names: Vec<String> = paths
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "throughput.svg",
            "latency-over-time.svg",
            "latency-distribution.svg"
        ]
    );
    for (path, title) in paths.iter().zip([
        THROUGHPUT_TITLE,
        LATENCY_OVER_TIME_TITLE,
        LATENCY_DISTRIBUTION_TITLE,
    ]) {
        assert!(path.starts_with(&out));
        let svg = std::fs::read_to_string(path).unwrap();
        assert!(!svg.is_empty());
        assert!(
            svg.starts_with("<svg"),
            "{}: {}",
            path.display(),
            &svg[..80.min(svg.len())]
        );
        assert!(svg.contains(title), "{} lacks {title:?}", path.display());
        assert!(svg.contains("(ms)") || svg.contains("records/s"));
    }
    let dist = std::fs::read_to_string(&paths[2]).unwrap();
    assert!(
        dist.contains("99.9") && dist.contains("max"),
        "nines labels"
    );
}

#[test]
fn charts_of_empty_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut report = sample_report();
    report.intervals.clear();
    report.publish_latency = Percentiles::default();
    report.end_to_end_latency = Percentiles::default();
    report.mode = "produce".to_string();
    let paths = write_charts(&report, dir.path()).unwrap();
    assert_eq!(paths.len(), 3);
    for p in paths {
        assert!(std::fs::read_to_string(p).unwrap().starts_with("<svg"));
    }
}

#[test]
fn chart_errors_mention_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let err = format!("{:#}", write_charts(&sample_report(), &file).unwrap_err());
    assert!(err.contains("not-a-dir"), "{err}");
}

#[test]
fn machine_detect() {
    let m = Machine::detect();
    assert!(m.cores >= 1);
    if std::path::Path::new("/proc/meminfo").exists() {
        assert!(m.memory_bytes > 0);
        assert!(!m.kernel.is_empty());
    }
}
