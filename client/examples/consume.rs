//! A [`weir_client::Consumer`] reading a whole topic: it assigns every
//! partition, seeks each to its beginning (or, given a second argument in
//! milliseconds since the Unix epoch, to the first record at or after that
//! time), prints each partition's beginning and end offsets and the
//! consumer's lag, then reads the records as a `Stream` until nothing
//! arrived for 2 s, printing each one.
//!
//! A broker must be running, e.g. `cargo run --release -p weir-broker -- broker`,
//! and the topic must exist (run the `produce` example first). Then:
//!
//! ```text
//! cargo run -p weir-client --example consume
//! cargo run -p weir-client --example consume -- localhost:9292 1767225600000
//! ```
//!
//! The bootstrap list is the first argument, else `WEIR_BOOTSTRAP`, else
//! `127.0.0.1:9292`; the topic is `WEIR_TOPIC`, else `telemetry`. Exits
//! non-zero on the first error.

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use futures_lite::StreamExt;
use weir_client::{Client, ClientConfig, Consumer, ConsumerRecord};

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
    let admin = Client::bootstrap(&bootstrap, ClientConfig::default())
        .await
        .map_err(|e| {
            format!("cannot connect to {bootstrap}: {e} (is a broker running? `cargo run --release -p weir-broker -- broker`)")
        })?;
    // Assign every partition of the topic (no consumer groups: the
    // application picks the partitions).
    let count = admin.topic_metadata(&topic).await?.partitions.len() as u32;
    let partitions: Vec<(String, u32)> = (0..count).map(|p| (topic.clone(), p)).collect();

    let mut consumer = Consumer::builder()
        .bootstrap(bootstrap.as_str())
        .from_config([
            ("max.poll.records", "1000"),
            // Where a partition starts if it has no position, or after the
            // broker answered OffsetOutOfRange (retention removed records).
            ("auto.offset.reset", "earliest"),
        ])
        .build()
        .await?;
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
    let mut lag_total = 0;
    for (t, p) in &partitions {
        let (first, end) = (
            consumer.beginning_offset(t, *p).await?,
            consumer.end_offset(t, *p).await?,
        );
        let lag = consumer.lag(t, *p).await?.unwrap_or(0);
        lag_total += lag;
        println!("  partition {p}: offsets {first}..{end}, {lag} records to read");
    }

    // The consumer as a Stream of records (it polls underneath).
    let mut records = consumer.into_stream(Duration::from_millis(500));
    let mut total = 0u64;
    while let Ok(Some(record)) = tokio::time::timeout(IDLE, records.next()).await {
        print_record(&record?);
        total += 1;
    }
    println!(
        "{total} records consumed ({lag_total} were behind at the start); nothing new for {IDLE:?}"
    );
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
