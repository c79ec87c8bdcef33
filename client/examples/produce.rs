//! A telemetry-style [`weir_client::Producer`]: 20 devices send 500
//! readings each. Every record is keyed by its device id (so one device's
//! readings land on one partition, in order), carries headers and its
//! sample time as timestamp, and travels in lz4-compressed batches (linger
//! and batch size set explicitly). The example awaits every delivery
//! future, then prints how many records were acknowledged and, per
//! partition, the range of offsets they got; it flushes and closes the
//! producer. The topic is created with 4 partitions if it does not exist.
//!
//! A broker must be running, e.g. `cargo run --release -p weir-broker -- broker`.
//! Then:
//!
//! ```text
//! cargo run -p weir-client --example produce -- 127.0.0.1:9292
//! ```
//!
//! The bootstrap address is the first argument, else `WEIR_BOOTSTRAP`, else
//! `127.0.0.1:9292`; the topic is `WEIR_TOPIC`, else `telemetry`. Exits
//! non-zero if connecting fails or any record is not acknowledged.

use std::collections::BTreeMap;
use std::error::Error;
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use weir_client::producer::Compression;
use weir_client::{Client, DeliveryFuture, Producer, ProducerConfig, ProducerRecord};
use weir_proto::error_code::ErrorCode;

const DEVICES: u32 = 20;
const READINGS: u32 = 500;

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
    let client = Client::connect(bootstrap.as_str()).await.map_err(|e| {
        format!("cannot connect to {bootstrap}: {e} (is a broker running? `cargo run --release -p weir-broker -- broker`)")
    })?;
    match client.create_topic(&topic, 4, vec![]).await {
        Ok(()) => println!("created topic `{topic}` with 4 partitions"),
        Err(e) if e.code() == Some(ErrorCode::TopicAlreadyExists) => {}
        Err(e) => return Err(e.into()),
    }

    // ProducerConfig is #[non_exhaustive]: start from the defaults.
    let mut config = ProducerConfig::default();
    config.compression = Compression::Lz4;
    config.linger_ms = 20; // wait up to 20 ms for a batch to fill
    config.batch_size = 64 << 10; // close a batch at 64 KiB
    let producer = Producer::new(client, config);
    println!(
        "producing {} readings to `{topic}` (acks={}, idempotent: {})",
        DEVICES * READINGS,
        producer.config().acks,
        producer.is_idempotent()
    );

    let started = Instant::now();
    // One reading per device per second, the last one now.
    let first_sample = now_ms() - i64::from(READINGS) * 1000;
    let mut deliveries: Vec<DeliveryFuture> = Vec::with_capacity((DEVICES * READINGS) as usize);
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
            // `send` only buffers the record (it waits if the buffer is
            // full); the future resolves once the broker acknowledged it.
            deliveries.push(producer.send(record).await?);
        }
    }
    // Send whatever is still lingering now, and wait for it.
    producer.flush().await;

    let mut acked = 0u64;
    let mut first_error = None;
    // partition -> (records, lowest offset, highest offset)
    let mut ranges: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
    let sent = deliveries.len();
    for delivery in deliveries {
        match delivery.await {
            Ok(meta) => {
                acked += 1;
                if let Some(o) = meta.offset {
                    let r = ranges.entry(meta.partition).or_insert((0, o, o));
                    r.0 += 1;
                    r.1 = r.1.min(o);
                    r.2 = r.2.max(o);
                }
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    producer.close().await;

    println!(
        "{acked} of {sent} records acknowledged in {:.0?}",
        started.elapsed()
    );
    for (p, (n, lo, hi)) in &ranges {
        println!("  partition {p}: {n} records, offsets {lo}..={hi}");
    }
    if let Some(e) = first_error {
        return Err(format!("{} records failed; first error: {e}", sent as u64 - acked).into());
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
