//! A telemetry-style [`weir_client::Producer`]: 20 devices send 500
//! readings each. Every record is keyed by its device id (so one device's
//! readings land on one partition, in order), carries headers and its
//! sample time as timestamp, and travels in lz4-compressed batches. The
//! producer is built from a bootstrap list and Kafka property names; a
//! delivery callback records every acknowledgement (no futures kept). At
//! the end the example prints, per partition, the range of offsets the
//! records got, and the producer's statistics. The topic is created with 4
//! partitions if it does not exist.
//!
//! A broker must be running, e.g. `cargo run --release -p weir-broker -- broker`.
//! Then:
//!
//! ```text
//! cargo run -p weir-client --example produce
//! ```
//!
//! The bootstrap list is the first argument, else `WEIR_BOOTSTRAP`, else
//! `127.0.0.1:9292` (host names and lists work: `localhost:9292,other:9292`);
//! the topic is `WEIR_TOPIC`, else `telemetry`. Connecting is retried for
//! up to 60 s. Exits non-zero if connecting fails or any record is not
//! acknowledged.

use std::collections::BTreeMap;
use std::error::Error;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use weir_client::{Client, ClientConfig, ErrorCode, Producer, ProducerRecord};

const DEVICES: u32 = 20;
const READINGS: u32 = 500;

/// What the delivery callbacks saw: per partition (records, lowest offset,
/// highest offset), and the failures.
#[derive(Default)]
struct Outcomes {
    ranges: BTreeMap<u32, (u64, u64, u64)>,
    failed: u64,
    first_error: Option<String>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn Error>> {
    let bootstrap = bootstrap();
    let topic = std::env::var("WEIR_TOPIC").unwrap_or_else(|_| "telemetry".to_string());
    let admin = Client::bootstrap(&bootstrap, ClientConfig::default())
        .await
        .map_err(|e| {
            format!("cannot connect to {bootstrap}: {e} (is a broker running? `cargo run --release -p weir-broker -- broker`)")
        })?;
    match admin.create_topic(&topic, 4, vec![]).await {
        Ok(()) => println!("created topic `{topic}` with 4 partitions"),
        Err(e) if e.code() == Some(ErrorCode::TopicAlreadyExists) => {}
        Err(e) => return Err(e.into()),
    }

    let producer = Producer::builder()
        .bootstrap(bootstrap.as_str())
        .from_config([
            ("compression.type", "lz4"),
            ("linger.ms", "20"),     // wait up to 20 ms for a batch to fill
            ("batch.size", "65536"), // close a batch at 64 KiB
            ("acks", "all"),
        ])
        .build()
        .await?;
    println!(
        "producing {} readings to `{topic}` (acks={}, idempotent: {})",
        DEVICES * READINGS,
        producer.config().acks,
        producer.is_idempotent()
    );

    let started = Instant::now();
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    // One reading per device per second, the last one now.
    let first_sample = now_ms() - i64::from(READINGS) * 1000;
    for seq in 0..READINGS {
        for d in 0..DEVICES {
            let device = format!("device-{d:03}");
            let ts = first_sample + i64::from(seq) * 1000;
            let temp = 20.0 + f64::from((d * 7 + seq) % 50) / 10.0;
            let value = format!(r#"{{"device":"{device}","seq":{seq},"temp_c":{temp:.1}}}"#);
            let record = ProducerRecord::new(topic.as_str(), value)
                .key(device)
                .timestamp(ts)
                .header(
                    "content-type",
                    Some(Bytes::from_static(b"application/json")),
                )
                .header("schema", Some(Bytes::from_static(b"telemetry.v1")));
            // `send_with` only buffers the record (it waits if the buffer
            // is full); the callback runs once the broker acknowledged it,
            // on the producer's own thread: keep it short.
            let outcomes = outcomes.clone();
            producer
                .send_with(record, move |outcome| {
                    let mut o = outcomes.lock().unwrap();
                    match outcome {
                        Ok(meta) => {
                            let at = meta.offset.unwrap_or(0);
                            let r = o.ranges.entry(meta.partition).or_insert((0, at, at));
                            r.0 += 1;
                            r.1 = r.1.min(at);
                            r.2 = r.2.max(at);
                        }
                        Err(e) => {
                            o.failed += 1;
                            o.first_error.get_or_insert(e.to_string());
                        }
                    }
                })
                .await?;
        }
    }
    // Send whatever is still lingering now; every callback has run when
    // `flush` returns.
    producer.flush().await;
    let stats = producer.statistics();
    producer.close().await;

    let o = outcomes.lock().unwrap();
    let acked: u64 = o.ranges.values().map(|r| r.0).sum();
    println!(
        "{acked} of {} records acknowledged in {:.0?}",
        DEVICES * READINGS,
        started.elapsed()
    );
    for (p, (n, lo, hi)) in &o.ranges {
        println!("  partition {p}: {n} records, offsets {lo}..={hi}");
    }
    println!(
        "statistics: {} batches ({} bytes sent, largest {} B), {} requests, {} retries, mean request latency {:?}",
        stats.batches_sent,
        stats.bytes_sent,
        stats.batch_bytes_max,
        stats.requests,
        stats.retries,
        stats.request_latency_mean
    );
    if let Some(e) = &o.first_error {
        return Err(format!("{} records failed; first error: {e}", o.failed).into());
    }
    Ok(())
}

/// The first argument, else `WEIR_BOOTSTRAP`, else `127.0.0.1:9292`.
fn bootstrap() -> String {
    std::env::args()
        .nth(1)
        .or_else(|| std::env::var("WEIR_BOOTSTRAP").ok())
        .unwrap_or_else(|| "127.0.0.1:9292".to_string())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
