//! The SDK's statistics reach the `metrics` facade: a recorder installed
//! by the application (here a small one of the test's own) sees the
//! producer's and the consumer's counters, gauges and histograms as they
//! change. The recorder is process-global and the SDK's producer reports
//! from a thread of its own, so the test runs in a process of its own: it
//! runs itself again, alone, in a child process of this test binary
//! (otherwise, in one process with other tests of this binary, as under
//! `cargo test`, the recorder would count their records too).

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::broker::start_broker;
use metrics::{Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName};
use metrics::{Metadata, Recorder, SharedString, Unit};
use weir_client::{Client, Consumer, Producer, ProducerRecord};

/// One metric's value: a counter's total, a gauge's value (as f64 bits),
/// a histogram's sample count.
#[derive(Default)]
struct Cell(AtomicU64);

impl CounterFn for Cell {
    fn increment(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    fn absolute(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }
}

impl GaugeFn for Cell {
    fn increment(&self, v: f64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some((f64::from_bits(b) + v).to_bits())
            });
    }
    fn decrement(&self, v: f64) {
        GaugeFn::increment(self, -v);
    }
    fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
}

impl HistogramFn for Cell {
    fn record(&self, _: f64) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Every metric by its key as text (`name` or `name{label=value}`).
#[derive(Default, Clone)]
struct Store(Arc<Mutex<HashMap<String, Arc<Cell>>>>);

impl Store {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let mut name = key.name().to_string();
        for l in key.labels() {
            name.push_str(&format!("{{{}={}}}", l.key(), l.value()));
        }
        self.0.lock().unwrap().entry(name).or_default().clone()
    }

    fn get(&self, name: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |c| c.0.load(Ordering::Relaxed))
    }

    fn gauge(&self, name: &str) -> f64 {
        f64::from_bits(self.get(name))
    }
}

impl Recorder for Store {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.cell(key))
    }
}

/// Set in the child process that runs the test.
const CHILD_VAR: &str = "WEIR_METRICS_FACADE_CHILD";
/// The child's last line: the test ran in it, to its end.
const CHECKED: &str = "METRICS FACADE CHECKED";

#[test]
fn producer_and_consumer_figures_reach_an_installed_recorder() {
    if std::env::var_os(CHILD_VAR).is_none() {
        return run_alone("producer_and_consumer_figures_reach_an_installed_recorder");
    }
    let store = Store::default();
    metrics::set_global_recorder(store.clone()).expect("the only recorder of this binary");
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(dir.path(), 1, 0);
    let bootstrap = broker.listen.to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let admin = Client::connect(broker.listen).await.unwrap();
        admin.create_topic("facade", 2, vec![]).await.unwrap();
        let producer = Producer::builder()
            .bootstrap(bootstrap.as_str())
            .build()
            .await
            .unwrap();
        for i in 0..1000 {
            let r = ProducerRecord::new("facade", format!("v{i}"));
            let _ack = producer.send(r).await.unwrap();
        }
        producer.flush().await;
        let stats = producer.statistics();
        assert_eq!(stats.records_sent, 1000);
        assert_eq!(store.get("weir_client_producer_records_sent_total"), 1000);
        assert_eq!(
            store.get("weir_client_producer_bytes_sent_total"),
            stats.bytes_sent
        );
        assert_eq!(
            store.get("weir_client_producer_batch_bytes"),
            stats.batches_sent,
            "one batch-size sample per batch"
        );
        assert_eq!(
            store.get("weir_client_producer_request_latency_seconds"),
            stats.requests,
            "one latency sample per request"
        );
        assert_eq!(store.gauge("weir_client_producer_records_in_flight"), 0.0);
        assert_eq!(store.gauge("weir_client_producer_requests_in_flight"), 0.0);

        let mut consumer = Consumer::builder()
            .bootstrap(bootstrap.as_str())
            .from_config([("auto.offset.reset", "earliest")])
            .topics(["facade"])
            .build()
            .await
            .unwrap();
        let mut got = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while got < 1000 {
            assert!(tokio::time::Instant::now() < deadline, "read {got} of 1000");
            got += consumer
                .poll(Duration::from_millis(200))
                .await
                .unwrap()
                .len();
        }
        let c = consumer.statistics();
        assert_eq!(store.get("weir_client_consumer_records_total"), 1000);
        assert_eq!(store.get("weir_client_consumer_polls_total"), c.polls);
        assert_eq!(store.get("weir_client_consumer_fetches_total"), c.fetches);
        assert_eq!(
            store.get("weir_client_consumer_fetch_bytes_total"),
            c.fetch_bytes
        );
    });
    // After the harness's "test … " (no newline), on a line of its own.
    println!("\n{CHECKED}");
}

/// Runs the test `test` of this module in a child process (this test
/// binary, that test only) and checks that it ran there and passed: an
/// `--exact` name of no test would run nothing and succeed.
fn run_alone(test: &str) {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let name = format!("{module}::{test}");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &name, "--nocapture", "--test-threads", "1"])
        .env(CHILD_VAR, "1")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("the child starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().any(|l| l == CHECKED),
        "{name} in a child process ({}): {stdout}",
        out.status
    );
}
