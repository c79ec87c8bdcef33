use weir_client::{Client, ClientConfig, ErrorCode, Producer, ProducerRecord};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let admin = Client::bootstrap("localhost:9292", ClientConfig::default()).await?;
    match admin.create_topic("greetings", 3, vec![]).await {
        Err(e) if e.code() != Some(ErrorCode::TopicAlreadyExists) => return Err(e.into()),
        _ => {}
    }
    let producer = Producer::builder()
        .bootstrap("localhost:9292")
        .from_config([("linger.ms", "5"), ("acks", "all")])
        .build()
        .await?;
    for i in 0..1000 {
        let record = ProducerRecord::new("greetings", format!("hello #{i}"));
        // Called once the broker stored the record (or it failed for good).
        producer
            .send_with(record, |outcome| println!("{outcome:?}"))
            .await?;
    }
    producer.close().await; // delivers what is buffered; every callback has run
    Ok(())
}
