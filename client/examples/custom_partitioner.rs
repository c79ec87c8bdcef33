//! A custom [`Partitioner`]: keys look like `region/device` (e.g.
//! `eu-west/device-007`), and every record of a region goes to the same
//! partition — Kafka's murmur2 of the *region* rather than of the whole key.
//! Keys without a region fall back to murmur2 of the whole key; records
//! without a key are left to the producer's sticky partition (`None`).
//!
//! The producer is built with [`Producer::builder`] and
//! [`weir_client::ProducerBuilder::partitioner`]; batches still go straight
//! to each partition's owning broker core (shard-aware routing, the
//! default). The example prints
//! where each region's records landed and exits non-zero if a region was
//! split over several partitions. The topic is created with 4 partitions if
//! it does not exist.
//!
//! A broker must be running, e.g. `cargo run --release -p weir-broker -- broker`.
//! Then:
//!
//! ```text
//! cargo run -p weir-client --example custom_partitioner
//! ```
//!
//! The bootstrap list is the first argument, else `WEIR_BOOTSTRAP`, else
//! `127.0.0.1:9292`; the topic is `WEIR_TOPIC`, else `telemetry`.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::process::ExitCode;
use weir_client::partitioner::partition_for_key;
use weir_client::{Client, ClientConfig, ErrorCode, Partitioner, Producer, ProducerRecord};

const REGIONS: [&str; 3] = ["us-east", "eu-west", "ap-south"];

/// Routes by the part of the key before the first `/`.
struct RegionPartitioner;

impl Partitioner for RegionPartitioner {
    fn partition(&self, _topic: &str, key: Option<&[u8]>, partitions: u32) -> Option<u32> {
        // `None`: no key, so the topic's sticky partition.
        let key = key?;
        let region = match key.iter().position(|&b| b == b'/') {
            Some(i) => &key[..i],
            None => key,
        };
        // Must be below `partitions`, or `send` fails with InvalidArgument.
        Some(partition_for_key(region, partitions))
    }
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
    let client = Client::bootstrap(&bootstrap, ClientConfig::default())
        .await
        .map_err(|e| {
            format!("cannot connect to {bootstrap}: {e} (is a broker running? `cargo run --release -p weir-broker -- broker`)")
        })?;
    match client.create_topic(&topic, 4, vec![]).await {
        Ok(()) => println!("created topic `{topic}` with 4 partitions"),
        Err(e) if e.code() == Some(ErrorCode::TopicAlreadyExists) => {}
        Err(e) => return Err(e.into()),
    }

    drop(client);
    let producer = Producer::builder()
        .bootstrap(bootstrap.as_str())
        .partitioner(RegionPartitioner)
        .build()
        .await?;

    let mut deliveries = Vec::new();
    for region in REGIONS {
        for d in 0..10 {
            let key = format!("{region}/device-{d:03}");
            let record = ProducerRecord::new(topic.as_str(), format!("reading of {key}")).key(key);
            deliveries.push((Some(region), producer.send(record).await?));
        }
    }
    // Unkeyed records: the partitioner returns None, so they go to the
    // topic's sticky partition.
    for i in 0..5 {
        let record = ProducerRecord::new(topic.as_str(), format!("heartbeat {i}"));
        deliveries.push((None, producer.send(record).await?));
    }

    let mut by_region: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    let mut unkeyed: BTreeSet<u32> = BTreeSet::new();
    let mut first_error = None;
    let sent = deliveries.len();
    let mut acked = 0;
    for (region, delivery) in deliveries {
        match delivery.await {
            Ok(meta) => {
                acked += 1;
                match region {
                    Some(r) => by_region.entry(r).or_default().insert(meta.partition),
                    None => unkeyed.insert(meta.partition),
                };
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    producer.close().await;

    println!("{acked} of {sent} records acknowledged");
    for (region, parts) in &by_region {
        println!("  region {region}: partition(s) {parts:?}");
    }
    println!("  unkeyed: partition(s) {unkeyed:?}");
    if let Some(e) = first_error {
        return Err(format!("{} records failed; first error: {e}", sent - acked).into());
    }
    if let Some((region, parts)) = by_region.iter().find(|(_, p)| p.len() > 1) {
        return Err(format!("region {region} was split over partitions {parts:?}").into());
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
