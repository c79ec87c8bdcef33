//! SVG charts of a [`Report`]: throughput and latency over time, and the
//! latency percentile distributions.
//!
//! Charts are drawn with plotters' SVG backend, which emits `<text>`
//! elements and needs no system fonts.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::{Percentiles, Report};

/// Title of `throughput.svg`.
pub const THROUGHPUT_TITLE: &str = "Throughput (records/s)";
/// Title of `latency-over-time.svg`.
pub const LATENCY_OVER_TIME_TITLE: &str = "Latency over time (ms)";
/// Title of `latency-distribution.svg`.
pub const LATENCY_DISTRIBUTION_TITLE: &str = "Latency distribution (ms)";

const SIZE: (u32, u32) = (1000, 600);
const PUBLISH: RGBColor = RGBColor(31, 119, 180);
const PUBLISH_LIGHT: RGBColor = RGBColor(140, 190, 225);
const CONSUME: RGBColor = RGBColor(214, 39, 40);
const CONSUME_LIGHT: RGBColor = RGBColor(240, 150, 150);
const DELAY: RGBColor = RGBColor(44, 160, 44);
const WARMUP: RGBColor = RGBColor(225, 225, 225);

/// x position of quantile 1.0 (the maximum) on the "nines" axis, one step
/// past 99.999 (x = 5).
const MAX_X: f64 = 6.0;

/// Room above the data of the time charts, for the legend (upper right).
const TIME_HEADROOM: f64 = 1.35;

/// Draws one chart of a report into a file.
type DrawFn = fn(&Report, &Path) -> anyhow::Result<()>;

/// Writes `throughput.svg`, `latency-over-time.svg` and
/// `latency-distribution.svg` into `dir` (created if missing) and returns
/// their paths.
pub fn write_charts(report: &Report, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating directory {}", dir.display()))?;
    let charts: [(&str, DrawFn); 3] = [
        ("throughput.svg", throughput),
        ("latency-over-time.svg", latency_over_time),
        ("latency-distribution.svg", latency_distribution),
    ];
    let mut written = Vec::with_capacity(charts.len());
    for (name, draw) in charts {
        let path = dir.join(name);
        draw(report, &path).with_context(|| format!("writing chart {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// Whether the run published (anything but a consume-only run).
fn has_publish(report: &Report) -> bool {
    report.mode != "consume"
}

/// Whether the run consumed (anything but a produce-only run).
fn has_consume(report: &Report) -> bool {
    report.mode != "produce"
}

/// The x range of the time charts: 0 to the last interval's end.
fn time_range(report: &Report) -> std::ops::Range<f64> {
    let end = report
        .intervals
        .iter()
        .map(|i| i.t_s)
        .filter(|t| t.is_finite())
        .fold(0.0_f64, f64::max);
    0.0..if end > 0.0 { end } else { 1.0 }
}

/// A y range from 0 to `headroom` times the largest finite value.
fn y_range(values: impl Iterator<Item = f64>, headroom: f64) -> std::ops::Range<f64> {
    let max = values.filter(|v| v.is_finite()).fold(0.0_f64, f64::max);
    0.0..if max > 0.0 { max * headroom } else { 1.0 }
}

/// The span covered by warm-up intervals (each interval covers the second
/// before its `t_s`), if any.
fn warmup_span(report: &Report) -> Option<(f64, f64)> {
    let warm: Vec<f64> = report
        .intervals
        .iter()
        .filter(|i| i.warmup && i.t_s.is_finite())
        .map(|i| i.t_s)
        .collect();
    let end = warm.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let start = warm.iter().copied().fold(f64::INFINITY, f64::min);
    (end.is_finite()).then(|| ((start - 1.0).max(0.0), end))
}

/// A blank drawing area backed by an SVG file at `path`.
fn root_area(path: &Path) -> anyhow::Result<DrawingArea<SVGBackend<'_>, Shift>> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root)
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Shades the warm-up phase of a time chart.
fn shade_warmup(chart: &mut Chart<'_, '_>, report: &Report, y_max: f64) -> anyhow::Result<()> {
    if let Some((start, end)) = warmup_span(report) {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(start, 0.0), (end, y_max)],
                WARMUP.mix(0.6).filled(),
            )))?
            .label("warm-up")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], WARMUP.filled()));
    }
    Ok(())
}

/// Draws one line series of `(x, y)` points (non-finite points dropped)
/// with a legend entry.
fn line(
    chart: &mut Chart<'_, '_>,
    points: Vec<(f64, f64)>,
    color: RGBColor,
    width: u32,
    label: &str,
) -> anyhow::Result<()> {
    let points: Vec<(f64, f64)> = points
        .into_iter()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    chart
        .draw_series(LineSeries::new(points, color.stroke_width(width)))?
        .label(label)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(3)));
    Ok(())
}

fn legend<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn subtitle(report: &Report) -> String {
    format!("{}, {} against {}", report.tool, report.mode, report.target)
}

/// One line of a time-series chart: its value per interval, color, width
/// and legend label.
struct TimeLine {
    value: fn(&crate::report::Interval) -> f64,
    color: RGBColor,
    width: u32,
    label: &'static str,
}

/// A chart of per-interval values over time, the warm-up shaded; the
/// y axis fits the lines drawn.
fn time_chart(
    report: &Report,
    path: &Path,
    title: &str,
    (y_desc, y_label_area, whole_numbers): (&str, u32, bool),
    lines: &[TimeLine],
) -> anyhow::Result<()> {
    let root = root_area(path)?;
    let root = root.titled(title, ("sans-serif", 28))?;
    let x = time_range(report);
    let y = y_range(
        lines
            .iter()
            .flat_map(|l| report.intervals.iter().map(l.value)),
        TIME_HEADROOM,
    );
    let y_max = y.end;
    let mut chart = ChartBuilder::on(&root)
        .caption(subtitle(report), ("sans-serif", 16))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(y_label_area)
        .build_cartesian_2d(x, y)?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc("time since start (s)").y_desc(y_desc);
    let whole = |v: &f64| format!("{v:.0}");
    if whole_numbers {
        mesh.y_label_formatter(&whole);
    }
    mesh.draw()?;
    shade_warmup(&mut chart, report, y_max)?;
    for l in lines {
        let pts = report.intervals.iter().map(|i| (i.t_s, (l.value)(i)));
        line(&mut chart, pts.collect(), l.color, l.width, l.label)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}

/// The lines of a chart whose publish and consume sides are drawn only
/// when the run had producers / consumers.
fn sides(report: &Report, publish: Vec<TimeLine>, consume: Vec<TimeLine>) -> Vec<TimeLine> {
    let mut lines = Vec::new();
    if has_publish(report) {
        lines.extend(publish);
    }
    if has_consume(report) {
        lines.extend(consume);
    }
    lines
}

/// `throughput.svg`: publish and consume records/s per interval.
fn throughput(report: &Report, path: &Path) -> anyhow::Result<()> {
    let lines = sides(
        report,
        vec![TimeLine {
            value: |i| i.publish_rate,
            color: PUBLISH,
            width: 2,
            label: "publish (records/s)",
        }],
        vec![TimeLine {
            value: |i| i.consume_rate,
            color: CONSUME,
            width: 2,
            label: "consume (records/s)",
        }],
    );
    time_chart(
        report,
        path,
        THROUGHPUT_TITLE,
        ("throughput (records/s)", 90, true),
        &lines,
    )
}

/// `latency-over-time.svg`: publish and end-to-end p50 and p99 per interval.
fn latency_over_time(report: &Report, path: &Path) -> anyhow::Result<()> {
    let lines = sides(
        report,
        vec![
            TimeLine {
                value: |i| i.publish_latency_p50_ms,
                color: PUBLISH_LIGHT,
                width: 1,
                label: "publish p50 (ms)",
            },
            TimeLine {
                value: |i| i.publish_latency_p99_ms,
                color: PUBLISH,
                width: 2,
                label: "publish p99 (ms)",
            },
        ],
        vec![
            TimeLine {
                value: |i| i.end_to_end_latency_p50_ms,
                color: CONSUME_LIGHT,
                width: 1,
                label: "end-to-end p50 (ms)",
            },
            TimeLine {
                value: |i| i.end_to_end_latency_p99_ms,
                color: CONSUME,
                width: 2,
                label: "end-to-end p99 (ms)",
            },
        ],
    );
    time_chart(
        report,
        path,
        LATENCY_OVER_TIME_TITLE,
        ("latency (ms)", 80, false),
        &lines,
    )
}

/// Position of quantile `q` on the "nines" axis: `-log10(1 - q)`, with the
/// maximum (q = 1) at [`MAX_X`].
fn nines_x(q: f64) -> f64 {
    if q >= 1.0 {
        MAX_X
    } else {
        (-(1.0 - q).log10()).clamp(0.0, MAX_X)
    }
}

/// Label of a position on the "nines" axis: the percentile it stands for.
fn nines_label(x: f64) -> String {
    if x >= MAX_X - 1e-9 {
        return "max".to_string();
    }
    let pct = 100.0 * (1.0 - 10f64.powf(-x));
    let decimals = (x.ceil() as i64 - 2).clamp(0, 6) as usize;
    format!("{pct:.decimals$}")
}

/// `latency-distribution.svg`: the percentile curves of the distributions
/// that have samples, on a "nines" x axis.
fn latency_distribution(report: &Report, path: &Path) -> anyhow::Result<()> {
    let root = root_area(path)?;
    let root = root.titled(LATENCY_DISTRIBUTION_TITLE, ("sans-serif", 28))?;
    let dists: Vec<(&str, &Percentiles, RGBColor)> = [
        ("publish latency", &report.publish_latency, PUBLISH),
        ("publish delay", &report.publish_delay, DELAY),
        ("end-to-end latency", &report.end_to_end_latency, CONSUME),
    ]
    .into_iter()
    .filter(|(_, p, _)| p.count > 0)
    .collect();
    let y = y_range(
        dists
            .iter()
            .flat_map(|(_, p, _)| p.curve.iter().map(|&(_, ms)| ms).chain([p.max_ms])),
        1.1,
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(subtitle(report), ("sans-serif", 16))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..MAX_X, y)?;
    chart
        .configure_mesh()
        .x_labels(MAX_X as usize + 1)
        .x_label_formatter(&|x| nines_label(*x))
        .x_desc("percentile (%)")
        .y_desc("latency (ms)")
        .draw()?;
    for (name, p, color) in dists {
        let mut pts: Vec<(f64, f64)> = p.curve.iter().map(|&(q, ms)| (nines_x(q), ms)).collect();
        if pts.is_empty() {
            // A report written without curves: use the fixed percentiles.
            pts = [
                (0.5, p.p50_ms),
                (0.75, p.p75_ms),
                (0.95, p.p95_ms),
                (0.99, p.p99_ms),
                (0.999, p.p999_ms),
                (0.9999, p.p9999_ms),
                (1.0, p.max_ms),
            ]
            .into_iter()
            .map(|(q, ms)| (nines_x(q), ms))
            .collect();
        }
        chart.draw_series(
            pts.iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|&pt| Circle::new(pt, 3, color.filled())),
        )?;
        line(&mut chart, pts, color, 2, &format!("{name} (ms)"))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nines() {
        assert_eq!(nines_x(1.0), MAX_X);
        assert!((nines_x(0.99) - 2.0).abs() < 1e-9);
        assert_eq!(nines_label(1.0), "90");
        assert_eq!(nines_label(2.0), "99");
        assert_eq!(nines_label(3.0), "99.9");
        assert_eq!(nines_label(4.0), "99.99");
        assert_eq!(nines_label(5.0), "99.999");
        assert_eq!(nines_label(nines_x(0.5)), "50");
        assert_eq!(nines_label(0.0), "0");
        assert_eq!(nines_label(MAX_X), "max");
    }

    #[test]
    fn warmup_spans() {
        use crate::report::Interval;
        let mut r = Report {
            tool: String::new(),
            started_at: String::new(),
            mode: "produce".into(),
            target: String::new(),
            workload: serde_json::Value::Null,
            machine: Default::default(),
            producer_stages: None,
            broker_stages: None,
            intervals: (1..=5)
                .map(|t| Interval {
                    t_s: t as f64,
                    warmup: t <= 2,
                    ..Default::default()
                })
                .collect(),
            totals: Default::default(),
            publish_latency: Default::default(),
            publish_delay: Default::default(),
            end_to_end_latency: Default::default(),
            stopped_early: false,
            notes: vec![],
        };
        assert_eq!(warmup_span(&r), Some((0.0, 2.0)));
        assert_eq!(time_range(&r), 0.0..5.0);
        r.intervals.clear();
        assert_eq!(warmup_span(&r), None);
        assert_eq!(time_range(&r), 0.0..1.0);
    }
}
