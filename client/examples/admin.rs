//! Topic administration with [`weir_client::Client`]: create a topic with
//! config overrides (if it does not exist yet), list topics, describe the
//! topic (effective configs; per partition its owning core, offsets and size
//! on disk), alter a config, add partitions, and look up offsets (earliest,
//! latest, and the first record at or after a timestamp).
//!
//! A broker must be running, e.g. `cargo run --release -p weir-broker -- broker`.
//! Then:
//!
//! ```text
//! cargo run -p weir-client --example admin
//! ```
//!
//! The bootstrap list is the first argument, else `WEIR_BOOTSTRAP`, else
//! `127.0.0.1:9292`; the topic is `WEIR_TOPIC`, else `telemetry`. Exits
//! non-zero on the first error.

use std::error::Error;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use weir_client::{Client, ClientConfig, ConfigEntry, OffsetSpec};

/// The partition count the example grows the topic to.
const TARGET_PARTITIONS: u32 = 4;

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
    let client = Client::bootstrap(&bootstrap, ClientConfig::default())
        .await
        .map_err(|e| {
            format!("cannot connect to {bootstrap}: {e} (is a broker running? `cargo run --release -p weir-broker -- broker`)")
        })?;
    println!("connected to {}", client.addr());

    // The broker's cores and the ports they listen on.
    let md = client.metadata(None).await?;
    for c in &md.cores {
        println!("core {}: {}:{}", c.core, c.host, c.port);
    }

    // Create the topic unless it exists. Configs use Kafka's names.
    if client.list_topics().await?.contains(&topic) {
        println!("topic `{topic}` exists already");
    } else {
        let configs: Vec<ConfigEntry> = vec![
            ("retention.ms".into(), (7 * 24 * 3600 * 1000).to_string()), // 7 days
            ("segment.bytes".into(), (64 << 20).to_string()),            // 64 MiB
        ];
        client.create_topic(&topic, 2, configs).await?;
        println!("created topic `{topic}` with 2 partitions");
    }

    println!("topics: {:?}", client.list_topics().await?);
    describe(&client, &topic).await?;

    // Change one config; the others keep their values.
    client
        .alter_configs(&topic, vec![("retention.ms".into(), "86400000".into())])
        .await?;
    println!("set retention.ms=86400000 (1 day)");

    // Partitions can only be added, never removed.
    let current = client.topic_metadata(&topic).await?.partitions.len() as u32;
    if current < TARGET_PARTITIONS {
        client.create_partitions(&topic, TARGET_PARTITIONS).await?;
        println!("grew `{topic}` from {current} to {TARGET_PARTITIONS} partitions");
    } else {
        println!("`{topic}` has {current} partitions already (>= {TARGET_PARTITIONS})");
    }
    describe(&client, &topic).await?;

    // Offsets: log start, log end, and the first record of the last hour.
    let an_hour_ago = now_ms() - 3_600_000;
    let partitions = client.topic_metadata(&topic).await?.partitions;
    println!("offsets (earliest / latest / first at or after {an_hour_ago} ms):");
    for p in partitions {
        let earliest = client
            .list_offsets(&topic, p.partition, OffsetSpec::Earliest)
            .await?;
        let latest = client
            .list_offsets(&topic, p.partition, OffsetSpec::Latest)
            .await?;
        let at = client
            .list_offsets(&topic, p.partition, OffsetSpec::Timestamp(an_hour_ago))
            .await?;
        println!(
            "  partition {}: {} / {} / {}",
            p.partition,
            show(earliest),
            show(latest),
            // None: every record is older than the timestamp (or there are none).
            at.map_or_else(
                || "none (no record that recent)".to_string(),
                |o| o.to_string()
            )
        );
    }
    Ok(())
}

/// Prints a topic's effective configs and partitions.
async fn describe(client: &Client, topic: &str) -> Result<(), Box<dyn Error>> {
    let d = client.describe_topic(topic).await?;
    println!("topic `{}`:", d.name);
    let mut configs = d.configs.clone();
    configs.sort();
    for (k, v) in &configs {
        println!("  {k} = {v}");
    }
    println!("  partition  core  log_start  log_end  size_bytes");
    for p in &d.partitions {
        println!(
            "  {:>9}  {:>4}  {:>9}  {:>7}  {:>10}",
            p.partition, p.core, p.log_start_offset, p.log_end_offset, p.size_bytes
        );
    }
    Ok(())
}

fn show(o: Option<u64>) -> String {
    o.map_or_else(|| "-".to_string(), |o| o.to_string())
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
