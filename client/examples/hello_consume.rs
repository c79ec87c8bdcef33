use std::time::Duration;

use futures_lite::StreamExt;
use weir_client::Consumer;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut records = Consumer::builder()
        .bootstrap("localhost:9292")
        .from_config([("auto.offset.reset", "earliest")])
        .topics(["greetings"]) // every partition of the topic, no group
        .build()
        .await?
        .into_stream(Duration::from_millis(500));
    while let Some(record) = records.next().await {
        let r = record?;
        let value = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default());
        println!("{}-{}@{}: {value}", r.topic, r.partition, r.offset);
    }
    Ok(())
}
