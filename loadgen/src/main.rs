//! `weir-bench`: runs an OpenMessaging-Benchmark-style workload against a
//! Weir broker and reports throughput and coordinated-omission-free
//! latency percentiles (see `docs/benchmarks.md` and the crate docs).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Parser;
use weir_loadgen::run::{Driver, Mode, Pacing, RunOptions};
use weir_loadgen::workload::Workload;

/// The workloads shipped in `loadgen/workloads/`, built into the binary.
const SHIPPED: &[(&str, &str)] = &[
    (
        "1-topic-1-partition-1kb",
        include_str!("../workloads/1-topic-1-partition-1kb.yaml"),
    ),
    (
        "1-topic-16-partitions-1kb",
        include_str!("../workloads/1-topic-16-partitions-1kb.yaml"),
    ),
    (
        "1-topic-100-partitions-1kb-4p-4c-500k",
        include_str!("../workloads/1-topic-100-partitions-1kb-4p-4c-500k.yaml"),
    ),
    (
        "backlog-1-topic-16-partitions-1kb",
        include_str!("../workloads/backlog-1-topic-16-partitions-1kb.yaml"),
    ),
    (
        "max-rate-1-topic-16-partitions-100b",
        include_str!("../workloads/max-rate-1-topic-16-partitions-100b.yaml"),
    ),
    (
        "share-1-topic-2-partitions-1kb",
        include_str!("../workloads/share-1-topic-2-partitions-1kb.yaml"),
    ),
    (
        "tiered-backlog-1-topic-1-partition-1000b-2gb",
        include_str!("../workloads/tiered-backlog-1-topic-1-partition-1000b-2gb.yaml"),
    ),
    (
        "transactions-1-topic-16-partitions-1kb",
        include_str!("../workloads/transactions-1-topic-16-partitions-1kb.yaml"),
    ),
    (
        "max-rate-1-topic-1-partition-1000b",
        include_str!("../workloads/max-rate-1-topic-1-partition-1000b.yaml"),
    ),
    (
        "max-rate-1-topic-1-partition-100b",
        include_str!("../workloads/max-rate-1-topic-1-partition-100b.yaml"),
    ),
    (
        "backlog-1-topic-1-partition-1000b-2gb",
        include_str!("../workloads/backlog-1-topic-1-partition-1000b-2gb.yaml"),
    ),
    (
        "backlog-1-topic-1-partition-1000b-cached",
        include_str!("../workloads/backlog-1-topic-1-partition-1000b-cached.yaml"),
    ),
    (
        "latency-1-topic-1-partition-1000b-50mbs",
        include_str!("../workloads/latency-1-topic-1-partition-1000b-50mbs.yaml"),
    ),
    (
        "latency-1-topic-1-partition-1000b-linger0",
        include_str!("../workloads/latency-1-topic-1-partition-1000b-linger0.yaml"),
    ),
    (
        "latency-1-topic-1-partition-1000b-200k-linger1",
        include_str!("../workloads/latency-1-topic-1-partition-1000b-200k-linger1.yaml"),
    ),
];

#[derive(Parser, Debug)]
#[command(
    name = "weir-bench",
    version,
    about = "Load generator for Weir: OpenMessaging Benchmark workloads, latency from intended send times",
    after_help = "Examples:\n  weir-bench --embedded 1-topic-16-partitions-1kb --duration 30\n  weir-bench --bootstrap 127.0.0.1:9292 my-workload.yaml --json out.json --plot charts/\n  weir-bench --discard max-rate-1-topic-16-partitions-100b --mode produce\n  weir-bench --list"
)]
struct Args {
    /// A workload file (YAML, OpenMessaging Benchmark vocabulary) or the
    /// name of a shipped workload (see --list).
    #[arg(default_value = "1-topic-16-partitions-1kb")]
    workload: String,
    /// Start a broker inside this process over a temporary directory.
    #[arg(long, conflicts_with_all = ["bootstrap", "discard"])]
    embedded: bool,
    /// Cores of the embedded broker (default: all).
    #[arg(long, requires = "embedded")]
    cores: Option<usize>,
    /// Data directory of the embedded broker (default: a temporary one,
    /// removed afterwards).
    #[arg(long, requires = "embedded")]
    data_dir: Option<PathBuf>,
    /// Start an in-process broker that acknowledges and discards
    /// everything (measures the tool itself; produce mode only).
    #[arg(long, conflicts_with = "bootstrap")]
    discard: bool,
    /// A running broker: its native listener (driver weir) or a Kafka
    /// listener (driver kafka: Weir's, Apache Kafka's, Redpanda's).
    #[arg(long, value_name = "HOST:PORT")]
    bootstrap: Option<String>,
    /// Replicas of each partition of the topics the run creates (on
    /// distinct nodes of the cluster at --bootstrap).
    #[arg(long, default_value_t = 1)]
    replication_factor: u32,
    /// The client library: weir (the Weir SDK, native protocol), kafka
    /// (librdkafka, Kafka protocol; with --embedded, the embedded broker's
    /// Kafka listener), or otlp-grpc / otlp-http (OpenTelemetry trace
    /// exports to --otlp-endpoint, each record one span; produce only;
    /// --bootstrap is the native listener, where the topics are made).
    #[arg(long, default_value = "weir", value_parser = parse_driver)]
    driver: Driver,
    /// The OTLP receiver of --driver otlp-grpc|otlp-http (the broker's
    /// --otlp-grpc-listen or --otlp-http-listen address; run it with
    /// --otlp-topic-from-attribute weir.topic to write the run's topics).
    #[arg(long, value_name = "HOST:PORT")]
    otlp_endpoint: Option<String>,
    /// A librdkafka property for --driver kafka, set over weir-bench's own
    /// (e.g. --kafka-config message.max.bytes=8388608); repeatable.
    #[arg(long = "kafka-config", value_name = "NAME=VALUE")]
    kafka_config: Vec<String>,
    /// A Kafka-style properties file of connection settings for either
    /// driver (`security.protocol=SSL`, `ssl.ca.location=…`,
    /// `ssl.certificate.location=…`, `ssl.key.location=…`): the Weir SDK
    /// reads them, and librdkafka gets them as --kafka-config.
    #[arg(long, value_name = "FILE")]
    command_config: Option<PathBuf>,
    /// The broker's metrics endpoint (its --metrics-listen): its produce
    /// stages over the measured phase go into the report (automatic with
    /// --embedded).
    #[arg(long, value_name = "HOST:PORT")]
    broker_metrics: Option<String>,
    /// produce, consume (from a prepared backlog) or end-to-end. Default:
    /// end-to-end if the workload has producers and subscriptions.
    #[arg(long, value_parser = parse_mode)]
    mode: Option<Mode>,
    /// Override a workload field by its YAML name (driver settings as
    /// driver.NAME), e.g. --set partitionsPerTopic=4 --set driver.acks=1.
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    sets: Vec<String>,
    /// Measured duration in seconds (overrides testDurationMinutes).
    #[arg(long)]
    duration: Option<f64>,
    /// Warm-up in seconds (overrides warmupDurationMinutes).
    #[arg(long)]
    warmup: Option<f64>,
    /// Records/s over all producers, 0 = as fast as possible (overrides
    /// producerRate).
    #[arg(long)]
    rate: Option<f64>,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write SVG charts into this directory.
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
    /// How a rate-limited producer waits for its next record: sleep (on a
    /// thread of its own; leaves the CPUs to a broker on the same machine)
    /// or spin (yielding each turn; for a load generator given CPUs of its
    /// own with taskset).
    #[arg(long, default_value = "sleep")]
    pacing: Pacing,
    /// No live progress line.
    #[arg(long)]
    no_progress: bool,
    /// List the shipped workloads and exit.
    #[arg(long)]
    list: bool,
}

fn parse_driver(s: &str) -> Result<Driver, String> {
    match s {
        "weir" => Ok(Driver::Weir),
        "kafka" => Ok(Driver::Kafka),
        "otlp-grpc" => Ok(Driver::Otlp(weir_loadgen::otlp::Transport::Grpc)),
        "otlp-http" => Ok(Driver::Otlp(weir_loadgen::otlp::Transport::Http)),
        _ => Err(format!("`{s}`: use weir, kafka, otlp-grpc or otlp-http")),
    }
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    match s {
        "produce" => Ok(Mode::Produce),
        "consume" => Ok(Mode::Consume),
        "end-to-end" | "e2e" => Ok(Mode::EndToEnd),
        _ => Err(format!("`{s}`: use produce, consume or end-to-end")),
    }
}

fn load(spec: &str) -> anyhow::Result<Workload> {
    let path = std::path::Path::new(spec);
    if path.exists() {
        return Workload::load(path);
    }
    match SHIPPED
        .iter()
        .find(|(n, _)| *n == spec.trim_end_matches(".yaml"))
    {
        Some((name, text)) => {
            Workload::from_yaml(text).with_context(|| format!("shipped workload {name}"))
        }
        None => bail!(
            "`{spec}` is neither a workload file nor a shipped workload ({})",
            SHIPPED
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("weir-bench: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.list {
        for (name, text) in SHIPPED {
            let w = Workload::from_yaml(text)?;
            println!(
                "{name:<40} {} topic(s) x {} partitions, {} B, rate {}, {}p/{}s x {}c",
                w.topics,
                w.partitions_per_topic,
                w.message_size,
                if w.producer_rate > 0.0 {
                    format!("{}", w.producer_rate)
                } else {
                    "max".into()
                },
                w.producers_per_topic,
                w.subscriptions_per_topic,
                w.consumer_per_subscription
            );
        }
        return Ok(());
    }
    let mut w = load(&args.workload)?;
    let mut overrides = Vec::new();
    for s in &args.sets {
        overrides.push(pair(s, "--set", "FIELD=VALUE")?);
    }
    if let Some(d) = args.duration {
        overrides.push(("testDurationMinutes".into(), (d / 60.0).to_string()));
    }
    if let Some(d) = args.warmup {
        overrides.push(("warmupDurationMinutes".into(), (d / 60.0).to_string()));
    }
    if let Some(r) = args.rate {
        overrides.push(("producerRate".into(), r.to_string()));
    }
    w.set_all(overrides)?;
    let mode = args.mode.unwrap_or(
        if w.producers_per_topic > 0 && w.subscriptions_per_topic > 0 {
            Mode::EndToEnd
        } else if w.producers_per_topic > 0 {
            Mode::Produce
        } else {
            Mode::Consume
        },
    );
    if args.discard && mode != Mode::Produce {
        bail!("--discard keeps nothing to consume: use --mode produce");
    }
    if args.discard && args.driver == Driver::Kafka {
        bail!("--discard speaks only Weir's native protocol: use --driver weir");
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let mut embedded = None;
    let mut discard = None;
    let (bootstrap, target) = if args.embedded {
        let cores = args.cores.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        let e = weir_loadgen::embedded::Embedded::start(cores, args.data_dir.clone())?;
        let a = match args.driver {
            Driver::Weir | Driver::Otlp(_) => e.addr,
            Driver::Kafka => e
                .kafka
                .context("the embedded broker has no Kafka listener")?,
        };
        embedded = Some(e);
        (a, format!("embedded ({cores} cores)"))
    } else if args.discard {
        let d = rt.block_on(weir_loadgen::discard::DiscardBroker::start(None))?;
        let a = d.addr;
        discard = Some(d);
        (a, "discard".to_string())
    } else {
        let Some(b) = &args.bootstrap else {
            bail!("say where the broker is: --bootstrap HOST:PORT, or --embedded, or --discard");
        };
        (resolve(b, "--bootstrap")?, b.clone())
    };
    let target = format!(
        "{target}, driver {}, pacing {}",
        args.driver.name(),
        args.pacing.name()
    );
    let mut kafka_config = Vec::new();
    for kv in &args.kafka_config {
        kafka_config.push(pair(kv, "--kafka-config", "NAME=VALUE")?);
    }
    if !kafka_config.is_empty() && args.driver != Driver::Kafka {
        bail!("--kafka-config applies to --driver kafka only");
    }
    let mut client = weir_client::ClientConfig::default();
    if let Some(path) = &args.command_config {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --command-config {}", path.display()))?;
        let props = weir_client::Properties::parse(&text)
            .with_context(|| format!("--command-config {}", path.display()))?;
        client = weir_client::ClientConfig::from_properties(props.iter())
            .with_context(|| format!("--command-config {}", path.display()))?;
        // librdkafka takes the same names, before --kafka-config's.
        let mut all: Vec<(String, String)> = props
            .iter()
            .filter(|(k, _)| !k.starts_with("weir."))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        all.append(&mut kafka_config);
        kafka_config = all;
    }
    let broker_metrics = match (&args.broker_metrics, &embedded) {
        (Some(m), _) => Some(resolve(m, "--broker-metrics")?),
        (None, Some(e)) => Some(e.metrics),
        (None, None) => None,
    };
    let embedded_otlp = embedded.as_ref().map(|e| match args.driver {
        Driver::Otlp(weir_loadgen::otlp::Transport::Grpc) => e.otlp.0,
        _ => e.otlp.1,
    });
    let otlp = match (&args.otlp_endpoint, args.driver) {
        (Some(a), Driver::Otlp(_)) => Some(resolve(a, "--otlp-endpoint")?),
        (None, Driver::Otlp(_)) if embedded_otlp.is_some() => embedded_otlp,
        (None, Driver::Otlp(_)) => {
            bail!("--driver otlp-grpc|otlp-http sends to --otlp-endpoint HOST:PORT (the broker's OTLP receiver)")
        }
        (Some(_), _) => bail!("--otlp-endpoint applies to --driver otlp-grpc|otlp-http only"),
        (None, _) => None,
    };
    let opts = RunOptions {
        otlp,
        client,
        broker_metrics,
        replication_factor: args.replication_factor,
        pacing: args.pacing,
        mode,
        driver: args.driver,
        bootstrap,
        kafka_config,
        target,
        progress: !args.no_progress,
        stop,
        workload_dir: std::path::Path::new(&args.workload)
            .parent()
            .filter(|p| std::path::Path::new(&args.workload).is_file() && !p.as_os_str().is_empty())
            .map(std::path::Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
        run_id: format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0)
        ),
    };
    eprintln!(
        "weir-bench: workload {} ({}), mode {}, target {}, warm-up {:?}, measured {:?}",
        w.name,
        args.workload,
        mode.name(),
        opts.target,
        w.warmup(),
        w.duration()
    );
    let mut report = rt.block_on(weir_loadgen::run::run(&w, &opts))?;
    if let Some(d) = &discard {
        report.notes.push(format!(
            "the discard broker acknowledged {} records",
            d.received
                .records
                .load(std::sync::atomic::Ordering::Relaxed)
        ));
    }
    println!("{}", report.summary_table());
    if let Some(path) = &args.json {
        report.write_json(path)?;
        eprintln!("weir-bench: report written to {}", path.display());
    }
    if let Some(dir) = &args.plot {
        for p in weir_loadgen::plot::write_charts(&report, dir)? {
            eprintln!("weir-bench: chart {}", p.display());
        }
    }
    drop(rt);
    if let Some(e) = embedded {
        e.stop()?;
    }
    Ok(())
}

/// `KEY=VALUE` of a repeatable option, trimmed; `shape` names the form in
/// the error.
fn pair(s: &str, flag: &str, shape: &str) -> anyhow::Result<(String, String)> {
    let (k, v) = s
        .split_once('=')
        .with_context(|| format!("{flag} `{s}`: expected {shape}"))?;
    Ok((k.trim().to_string(), v.trim().to_string()))
}

/// The first address `HOST:PORT` resolves to.
fn resolve(addr: &str, flag: &str) -> anyhow::Result<std::net::SocketAddr> {
    std::net::ToSocketAddrs::to_socket_addrs(addr)
        .with_context(|| format!("{flag}: resolving {addr}"))?
        .next()
        .with_context(|| format!("{flag}: {addr} resolved to nothing"))
}
