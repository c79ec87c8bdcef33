//! A [`weir_client::Consumer`] reading a whole topic: it assigns every
//! partition, seeks each to its beginning (or, given a second argument in
//! milliseconds since the Unix epoch, to the first record at or after that
//! time), then polls until nothing arrived for 2 s, printing each record.
//! At the end it prints each partition's position (the next offset it would
//! return) and `skipped()` (offsets jumped over by out-of-range resets).
//!
//! A broker must be running, e.g. `cargo run --release -p weir-broker -- broker`,
//! and the topic must exist (run the `produce` example first). Then:
//!
//! ```text
//! cargo run -p weir-client --example consume -- 127.0.0.1:9292
//! cargo run -p weir-client --example consume -- 127.0.0.1:9292 1767225600000
//! ```
//!
//! The bootstrap address is the first argument, else `WEIR_BOOTSTRAP`, else
//! `127.0.0.1:9292`; the topic is `WEIR_TOPIC`, else `telemetry`. Exits
//! non-zero on the first error.

use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use weir_client::{Client, Consumer, ConsumerConfig, ConsumerRecord, OffsetReset};

/// Stop after this long without a record.
const IDLE: Duration = Duration::from_secs(2);

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
    let from_ts = match std::env::args().nth(2) {
        None => None,
        Some(s) => Some(s.parse::<i64>().map_err(|e| {
            format!("`{s}` is not a timestamp in milliseconds since the Unix epoch ({e})")
        })?),
    };
    let topic = std::env::var("WEIR_TOPIC").unwrap_or_else(|_| "telemetry".to_string());
    let client = Client::connect(bootstrap.as_str()).await.map_err(|e| {
        format!("cannot connect to {bootstrap}: {e} (is a broker running? `cargo run --release -p weir-broker -- broker`)")
    })?;

    // Assign every partition of the topic (no consumer groups: the
    // application picks the partitions).
    let count = client.topic_metadata(&topic).await?.partitions.len() as u32;
    let partitions: Vec<(String, u32)> = (0..count).map(|p| (topic.clone(), p)).collect();

    // ConsumerConfig is #[non_exhaustive]: start from the defaults.
    let mut config = ConsumerConfig::default();
    config.max_poll_records = 1000;
    // Where a partition starts if it has no position, or after the broker
    // answered OffsetOutOfRange (retention removed the records).
    config.auto_offset_reset = OffsetReset::Earliest;
    let mut consumer = Consumer::new(client, config);
    consumer.assign(partitions.clone());

    match from_ts {
        None => {
            consumer.seek_to_beginning(&partitions).await?;
            println!("reading `{topic}` ({count} partitions) from the beginning");
        }
        Some(ts) => {
            println!("reading `{topic}` ({count} partitions) from {ts} ms");
            for (t, p) in &partitions {
                // The log end if every record of the partition is older.
                let at = consumer.seek_to_timestamp(t, *p, ts).await?;
                println!("  partition {p}: starts at offset {at}");
            }
        }
    }

    let mut total = 0u64;
    let mut last_record = Instant::now();
    loop {
        let left = IDLE.saturating_sub(last_record.elapsed());
        if left.is_zero() {
            break;
        }
        // Returns what is buffered at once, else long-polls up to `left`;
        // an empty vector means nothing arrived in time.
        let records = consumer.poll(left).await?;
        if records.is_empty() {
            continue;
        }
        last_record = Instant::now();
        for r in &records {
            print_record(r);
        }
        total += records.len() as u64;
    }

    println!("{total} records consumed; nothing new for {IDLE:?}");
    for (t, p) in &partitions {
        let position = consumer
            .position(t, *p)
            .map_or_else(|| "none".to_string(), |o| o.to_string());
        println!(
            "  partition {p}: position {position}, skipped {}",
            consumer.skipped(t, *p)
        );
    }
    Ok(())
}

fn print_record(r: &ConsumerRecord) {
    let text = |b: &Option<bytes::Bytes>| {
        b.as_ref().map_or_else(
            || "null".to_string(),
            |b| String::from_utf8_lossy(b).into_owned(),
        )
    };
    let headers: Vec<String> = r
        .headers
        .iter()
        .map(|(k, v)| format!("{k}={}", text(v)))
        .collect();
    println!(
        "{}-{}@{} ts={} key={} value={} headers=[{}]",
        r.topic,
        r.partition,
        r.offset,
        r.timestamp,
        text(&r.key),
        text(&r.value),
        headers.join(", ")
    );
}

/// The first argument, else `WEIR_BOOTSTRAP`, else `127.0.0.1:9292`.
fn bootstrap() -> String {
    std::env::args()
        .nth(1)
        .or_else(|| std::env::var("WEIR_BOOTSTRAP").ok())
        .unwrap_or_else(|| "127.0.0.1:9292".to_string())
}
