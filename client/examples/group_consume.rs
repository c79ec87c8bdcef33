//! A [`weir_client::GroupConsumer`]: joins the consumer group `WEIR_GROUP`
//! (else `telemetry-readers`), prints its partition changes and the records
//! of the partitions it is given, and commits after processing each poll
//! (at-least-once). Run it in two or three terminals to watch the group
//! split the partitions and take over when one is stopped; it leaves the
//! group after 10 s without a record (or on Ctrl-C, which a killed member
//! does not: the others then wait for its session timeout).
//!
//! A broker must be running, e.g. `cargo run --release -p weir-broker -- broker`,
//! and the topic must exist (run the `produce` example first). Then:
//!
//! ```text
//! cargo run -p weir-client --example group_consume
//! weir group describe telemetry-readers
//! ```
//!
//! The bootstrap list is the first argument, else `WEIR_BOOTSTRAP`, else
//! `127.0.0.1:9292`; the topic is `WEIR_TOPIC`, else `telemetry`. Exits
//! non-zero on the first error.

use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use weir_client::{Consumer, RebalanceListener, TopicPartition};

/// Stop after this long without a record.
const IDLE: Duration = Duration::from_secs(10);

/// Prints the consumer's partition changes.
struct Printer;

impl RebalanceListener for Printer {
    fn on_assigned(&mut self, partitions: &[TopicPartition]) {
        println!("assigned: {partitions:?}");
    }
    fn on_revoked(&mut self, partitions: &[TopicPartition]) {
        println!("revoked: {partitions:?}");
    }
    fn on_lost(&mut self, partitions: &[TopicPartition]) {
        println!("lost (expelled from the group): {partitions:?}");
    }
}

#[tokio::main]
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
    let bootstrap = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("WEIR_BOOTSTRAP").ok())
        .unwrap_or_else(|| "127.0.0.1:9292".to_string());
    let topic = std::env::var("WEIR_TOPIC").unwrap_or_else(|_| "telemetry".to_string());
    let group = std::env::var("WEIR_GROUP").unwrap_or_else(|_| "telemetry-readers".to_string());
    // Built from a bootstrap list and Kafka property names; connecting is
    // retried for up to 60 s.
    let mut consumer = Consumer::builder()
        .bootstrap(bootstrap.as_str())
        .group_id(group)
        .from_config([
            ("client.id", "group-consume-example"),
            // Partitions without a committed offset start at the beginning.
            ("auto.offset.reset", "earliest"),
        ])
        .build_group()
        .await
        .map_err(|e| {
            format!("cannot connect to {bootstrap}: {e} (is a broker running? `cargo run --release -p weir-broker -- broker`)")
        })?;
    consumer.set_rebalance_listener(Printer);
    consumer.subscribe(&[topic.as_str()]).await?;
    println!("joined as {}", consumer.member_id());

    let mut last = Instant::now();
    let mut total = 0u64;
    while last.elapsed() < IDLE {
        let records = consumer.poll(Duration::from_millis(500)).await?;
        if records.is_empty() {
            continue;
        }
        last = Instant::now();
        for r in &records {
            let value = r.value.as_deref().map(String::from_utf8_lossy);
            println!(
                "{}-{}@{}: {}",
                r.topic,
                r.partition,
                r.offset,
                value.unwrap_or_default()
            );
        }
        total += records.len() as u64;
        // Processed: commit (durable when this returns).
        consumer.commit_sync().await?;
    }
    let committed = consumer.committed(None).await?;
    println!("{total} records; committed offsets:");
    for c in committed {
        println!("  {}-{}: {}", c.topic, c.partition, c.offset);
    }
    // Leave the group so the others take over at once.
    consumer.close().await?;
    Ok(())
}
