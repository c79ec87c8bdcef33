//! The runner against an embedded broker and against the discard broker:
//! counts that match what the broker holds, rate limiting, and
//! coordinated-omission correction under a stalled broker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_client::Client;
use weir_loadgen::discard::{DiscardBroker, Stall};
use weir_loadgen::embedded::Embedded;
use weir_loadgen::report::Report;
use weir_loadgen::run::{run, Driver, Mode, Pacing, RunOptions};
use weir_loadgen::workload::Workload;
use weir_testkit::runtime;

fn workload(yaml_overrides: &[(&str, &str)]) -> Workload {
    let mut w = Workload::from_yaml(
        "name: test\ntopics: 1\npartitionsPerTopic: 4\nmessageSize: 256\nproducersPerTopic: 1\n\
         subscriptionsPerTopic: 1\nconsumerPerSubscription: 2\nproducerRate: 5000\n\
         testDurationMinutes: 0.05\nwarmupDurationMinutes: 0.01\n",
    )
    .unwrap();
    w.set_all(yaml_overrides.iter().map(|(k, v)| (*k, *v)))
        .unwrap();
    w
}

/// Records the broker holds in `topic` (the sum of its log ends).
async fn held_records(addr: std::net::SocketAddr, topic: &str) -> u64 {
    let c = Client::connect(addr).await.unwrap();
    let t = c.describe_topic(topic).await.unwrap();
    t.partitions.iter().map(|p| p.log_end_offset).sum()
}

fn options(mode: Mode, bootstrap: std::net::SocketAddr, id: &str) -> RunOptions {
    RunOptions {
        client: weir_client::ClientConfig::default(),
        mode,
        driver: Driver::Weir,
        bootstrap,
        kafka_config: Vec::new(),
        otlp: None,
        target: "test".into(),
        progress: false,
        stop: Arc::new(AtomicBool::new(false)),
        run_id: id.into(),
        workload_dir: std::env::temp_dir(),
        broker_metrics: None,
        replication_factor: 1,
        pacing: Pacing::default(),
    }
}

#[test]
fn an_embedded_end_to_end_run_reports_what_the_broker_holds() {
    let broker = Embedded::start(1, None).unwrap();
    let rt = runtime();
    let w = workload(&[]);
    let mut opts = options(Mode::EndToEnd, broker.addr, "e2e");
    opts.broker_metrics = Some(broker.metrics);
    let report = rt.block_on(run(&w, &opts)).unwrap();
    // The JSON report round-trips.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    report.write_json(&path).unwrap();
    let back = Report::read_json(&path).unwrap();
    assert_eq!(back.totals, report.totals);
    assert_eq!(back.mode, "end-to-end");
    assert!(
        report.notes.iter().all(|n| !n.contains("failed")),
        "{:?}",
        report.notes
    );
    // Every acknowledged record is in the broker, and nothing else.
    let held = rt.block_on(held_records(broker.addr, "test-0-e2e"));
    assert_eq!(held, report.totals.acknowledged_all);
    assert!(report.totals.published > 0 && report.totals.published <= held);
    assert_eq!(report.totals.publish_errors, 0);
    // The subscription (a group of two members) read what was produced
    // while it ran (it joined the fresh topic before the producer began).
    assert!(report.totals.consumed_all <= held);
    assert!(
        report.totals.consumed_all * 10 >= held * 9,
        "consumed {} of {held}",
        report.totals.consumed_all
    );
    assert!(report.end_to_end_latency.count > 0);
    assert!(report.publish_latency.count > 0);
    assert!(!report.intervals.is_empty());
    assert!(report.intervals[0].warmup);
    // Where publish latency went, on both sides, over the measured phase.
    let p = report.producer_stages.as_ref().expect("producer stages");
    assert!(p.batches > 0 && p.requests > 0, "{p:?}");
    assert!(p.records_per_batch >= 1.0, "{p:?}");
    assert!(p.request_ms_mean > 0.0, "{p:?}");
    let b = report.broker_stages.as_ref().expect("broker stages");
    for stage in ["append", "write", "sync", "request", "fdatasync"] {
        let s = b
            .get(stage)
            .unwrap_or_else(|| panic!("no `{stage}` in {b:?}"));
        assert!(s.count > 0 && s.mean_ms > 0.0, "{stage}: {s:?}");
        assert!(s.p50_ms <= s.p99_ms, "{stage}: {s:?}");
    }
    assert_eq!(back.broker_stages, report.broker_stages);
    drop(rt);
    broker.stop().unwrap();
}

/// A share-group subscription (4 members on 2 partitions, each record
/// costing 200 µs of work): the members read what was produced, each
/// record once (no more consumed than the broker holds); with the Kafka
/// driver it is refused with a clear error.
#[test]
fn a_share_group_subscription_reads_every_record_once() {
    let broker = Embedded::start(1, None).unwrap();
    let rt = runtime();
    let w = workload(&[
        ("partitionsPerTopic", "2"),
        ("consumerPerSubscription", "4"),
        ("subscriptionType", "share"),
        ("consumerProcessingMicros", "200"),
        ("producerRate", "2000"),
    ]);
    let report = rt
        .block_on(run(&w, &options(Mode::EndToEnd, broker.addr, "share")))
        .unwrap();
    assert!(
        report.notes.iter().all(|n| !n.contains("failed")),
        "{:?}",
        report.notes
    );
    let held = rt.block_on(held_records(broker.addr, "test-0-share"));
    assert!(
        report.totals.consumed_all <= held,
        "{} of {held}",
        report.totals.consumed_all
    );
    assert!(
        report.totals.consumed_all * 10 >= held * 9,
        "consumed {} of {held}",
        report.totals.consumed_all
    );
    let mut opts = options(Mode::EndToEnd, broker.addr, "share-kafka");
    opts.driver = Driver::Kafka;
    let e = rt.block_on(run(&w, &opts)).unwrap_err().to_string();
    assert!(e.contains("subscriptionType share"), "{e}");
    drop(rt);
    broker.stop().unwrap();
}

/// The same workload through librdkafka on the embedded broker's Kafka
/// listener: the topic made with CreateTopics, every acknowledged record in
/// the broker, the group of two librdkafka consumers reading them.
#[test]
fn the_kafka_driver_runs_a_workload_through_librdkafka() {
    let broker = Embedded::start(1, None).unwrap();
    let rt = runtime();
    let w = workload(&[]);
    let mut opts = options(Mode::EndToEnd, broker.kafka.unwrap(), "kafka");
    opts.driver = Driver::Kafka;
    let report = rt.block_on(run(&w, &opts)).unwrap();
    assert!(
        report.notes.iter().all(|n| !n.contains("failed")),
        "{:?}",
        report.notes
    );
    let (held, partitions) = rt.block_on(async {
        let c = Client::connect(broker.addr).await.unwrap();
        let t = c.describe_topic("test-0-kafka").await.unwrap();
        let held: u64 = t.partitions.iter().map(|p| p.log_end_offset).sum();
        (held, t.partitions.len())
    });
    assert_eq!(partitions, 4);
    assert_eq!(held, report.totals.acknowledged_all);
    assert!(report.totals.published > 0 && report.totals.publish_errors == 0);
    assert!(
        report.totals.consumed_all * 10 >= held * 9 && report.totals.consumed_all <= held,
        "consumed {} of {held}",
        report.totals.consumed_all
    );
    assert!(report.end_to_end_latency.count > 0);
    assert_eq!(report.producer_stages, None, "librdkafka has no SDK stages");
    drop(rt);
    broker.stop().unwrap();
}

/// A transactional workload through either driver (the Weir SDK's
/// transactional producer, librdkafka's): every record committed in
/// transactions of 100, read back read_committed; the log holds the
/// records and one commit marker per partition per transaction.
fn transactional_run(driver: Driver, id: &str) {
    let broker = Embedded::start(1, None).unwrap();
    let rt = runtime();
    let w = workload(&[
        ("driver.transactionRecords", "100"),
        ("driver.isolationLevel", "read_committed"),
    ]);
    let addr = match driver {
        Driver::Kafka => broker.kafka.unwrap(),
        Driver::Weir | Driver::Otlp(_) => broker.addr,
    };
    let mut opts = options(Mode::EndToEnd, addr, id);
    opts.driver = driver;
    let report = rt.block_on(run(&w, &opts)).unwrap();
    assert!(
        report.notes.iter().all(|n| !n.contains("failed")),
        "{:?}",
        report.notes
    );
    assert_eq!(report.totals.publish_errors, 0, "{:?}", report.notes);
    let committed: u64 = report
        .notes
        .iter()
        .find_map(|n| {
            n.strip_suffix(" transactions of 100 records committed (whole run, warm-up included)")
        })
        .unwrap_or_else(|| panic!("no transaction count in {:?}", report.notes))
        .parse()
        .unwrap();
    let acked = report.totals.acknowledged_all;
    // Whole transactions of 100, and the last one (shorter) at the end.
    assert_eq!(committed, acked.div_ceil(100), "acknowledged {acked}");
    let held = rt.block_on(held_records(broker.addr, &format!("test-0-{id}")));
    // Each transaction wrote to the 4 partitions (records go round robin):
    // a commit marker in each. The last, shorter transaction touched only as
    // many partitions as it had records, when that is fewer than 4.
    assert!(committed > 0, "no transaction committed");
    let last = acked - 100 * (committed - 1);
    let markers = 4 * (committed - 1) + last.min(4);
    assert_eq!(
        held,
        acked + markers,
        "{committed} transactions, the last of {last} records"
    );
    // read_committed consumers saw the committed records (not the markers).
    assert!(
        report.totals.consumed_all <= acked && report.totals.consumed_all * 10 >= acked * 9,
        "consumed {} of {acked}",
        report.totals.consumed_all
    );
    drop(rt);
    broker.stop().unwrap();
}

#[test]
fn the_kafka_driver_commits_transactions_and_reads_them_committed() {
    transactional_run(Driver::Kafka, "txn-kafka");
}

#[test]
fn the_weir_driver_commits_transactions_and_reads_them_committed() {
    transactional_run(Driver::Weir, "txn-weir");
}

#[test]
fn rate_limited_producers_hold_the_rate_sleeping() {
    producers_hold_the_rate(Pacing::Sleep);
}

#[test]
fn rate_limited_producers_hold_the_rate_spinning() {
    producers_hold_the_rate(Pacing::Spin);
}

fn producers_hold_the_rate(pacing: Pacing) {
    let rt = runtime();
    let report = rt.block_on(async {
        let d = DiscardBroker::start(None).await.unwrap();
        let w = workload(&[
            ("subscriptionsPerTopic", "0"),
            ("producerRate", "20000"),
            ("testDurationMinutes", "0.05"),
        ]);
        let mut opts = options(Mode::Produce, d.addr, "rate");
        opts.pacing = pacing;
        let r = run(&w, &opts).await.unwrap();
        assert_eq!(
            d.received.records.load(Ordering::Relaxed),
            r.totals.acknowledged_all,
            "what the broker acknowledged is what the report counts"
        );
        r
    });
    let rate = report.totals.publish_rate;
    assert!(
        (rate - 20_000.0).abs() / 20_000.0 < 0.05,
        "{pacing:?}: configured 20000/s, measured {rate:.0}/s"
    );
}

#[test]
fn a_stalled_broker_shows_in_latency_from_the_intended_send_time() {
    let rt = runtime();
    let report = rt.block_on(async {
        // The broker holds every answer for 1 s, 1 s into the run; the
        // producer's buffer is small (64 records), so `send` itself is held up: records
        // are sent late, and only measuring from the intended time sees it.
        let stall = Stall {
            after: Duration::from_millis(1000),
            duration: Duration::from_millis(1000),
        };
        let d = DiscardBroker::start(Some(stall)).await.unwrap();
        let w = workload(&[
            ("subscriptionsPerTopic", "0"),
            ("producerRate", "2000"),
            ("messageSize", "1024"),
            ("driver.bufferMemory", "65536"),
            ("driver.lingerMs", "0"),
            ("testDurationMinutes", "0.05"),
            ("warmupDurationMinutes", "0"),
        ]);
        run(&w, &options(Mode::Produce, d.addr, "stall"))
            .await
            .unwrap()
    });
    // Sends were delayed by up to the stall...
    assert!(
        report.publish_delay.max_ms >= 700.0,
        "publish delay max {} ms",
        report.publish_delay.max_ms
    );
    // ...and the records that should have gone out during the stall carry
    // it: about a third of the 3 s run, so p99 is far above normal.
    assert!(
        report.publish_latency.max_ms >= 900.0,
        "{:?}",
        report.publish_latency
    );
    assert!(
        report.publish_latency.p95_ms >= 300.0,
        "{:?}",
        report.publish_latency
    );
    // The rate still counts every intended record.
    assert!(
        (report.totals.acknowledged_all as f64) >= 2000.0 * 2.5,
        "{}",
        report.totals.acknowledged_all
    );
}

#[test]
fn values_come_from_the_payload_file() {
    let dir = tempfile::tempdir().unwrap();
    let payload: Vec<u8> = (0..64u8).collect();
    std::fs::write(dir.path().join("p.data"), &payload).unwrap();
    let broker = Embedded::start(1, None).unwrap();
    let rt = runtime();
    rt.block_on(async {
        let w = workload(&[
            ("subscriptionsPerTopic", "0"),
            ("messageSize", "64"),
            ("payloadFile", "p.data"),
            ("producerRate", "1000"),
            ("testDurationMinutes", "0.02"),
            ("warmupDurationMinutes", "0"),
        ]);
        let mut o = options(Mode::Produce, broker.addr, "payload");
        o.workload_dir = dir.path().to_path_buf();
        let r = run(&w, &o).await.unwrap();
        assert!(r.totals.acknowledged_all > 0);
        let mut c = weir_client::ConsumerConfig::default();
        c.auto_offset_reset = weir_client::OffsetReset::Earliest;
        let mut consumer =
            weir_client::Consumer::new(Client::connect(broker.addr).await.unwrap(), c);
        consumer.assign((0..4).map(|p| ("test-0-payload".to_string(), p)).collect());
        let got = consumer.poll(Duration::from_secs(5)).await.unwrap();
        assert!(!got.is_empty());
        for rec in &got {
            assert_eq!(rec.value.as_deref(), Some(&payload[..]));
        }
        // A file of the wrong size is refused before anything runs.
        std::fs::write(dir.path().join("p.data"), b"short").unwrap();
        let e = run(&w, &o).await.unwrap_err();
        assert!(format!("{e:#}").contains("messageSize"), "{e:#}");
    });
    drop(rt);
    broker.stop().unwrap();
}

/// Spans in every record of `topic` (each an OTLP trace export).
async fn held_spans(addr: std::net::SocketAddr, topic: &str, partitions: u32) -> u64 {
    let records = held_records(addr, topic).await;
    let mut config = weir_client::ConsumerConfig::default();
    config.auto_offset_reset = weir_client::OffsetReset::Earliest;
    let mut consumer = weir_client::Consumer::new(Client::connect(addr).await.unwrap(), config);
    consumer.assign((0..partitions).map(|p| (topic.to_string(), p)).collect());
    let (mut read, mut spans) = (0, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while read < records && std::time::Instant::now() < deadline {
        for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            read += 1;
            spans += weir_otlp::records::count_request_items(
                weir_otlp::Signal::Traces,
                &r.value.expect("a value"),
            )
            .unwrap();
        }
    }
    assert_eq!(read, records, "every record of {topic} read");
    spans
}

#[test]
fn the_otlp_drivers_send_spans_the_broker_keeps_in_the_run_topic() {
    let broker = Embedded::start(1, None).unwrap();
    let rt = runtime();
    for (driver, id) in [
        (
            Driver::Otlp(weir_loadgen::otlp::Transport::Grpc),
            "otlp-grpc",
        ),
        (
            Driver::Otlp(weir_loadgen::otlp::Transport::Http),
            "otlp-http",
        ),
    ] {
        let w = workload(&[
            ("subscriptionsPerTopic", "0"),
            ("partitionsPerTopic", "2"),
            ("driver.otlpSpansPerExport", "50"),
        ]);
        let mut opts = options(Mode::Produce, broker.addr, id);
        opts.driver = driver;
        opts.otlp = Some(match driver {
            Driver::Otlp(weir_loadgen::otlp::Transport::Grpc) => broker.otlp.0,
            _ => broker.otlp.1,
        });
        let report = rt.block_on(run(&w, &opts)).unwrap();
        assert_eq!(report.totals.publish_errors, 0, "{id}: {:?}", report.notes);
        assert!(report.totals.published > 0, "{id}");
        // Every acknowledged span is in the run's topic (routed there by
        // the resource's weir.topic), and nothing else.
        let held = rt.block_on(held_spans(broker.addr, &format!("test-0-{id}"), 2));
        assert_eq!(held, report.totals.acknowledged_all, "{id}");
    }
    broker.stop().unwrap();
}
