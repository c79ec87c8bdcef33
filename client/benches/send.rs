//! The producer's own cost per record, without a broker: `Producer::send`
//! into a backend that acknowledges every request at once (no network, no
//! disk), from one task, with 100-byte and 1 KiB records over 16
//! partitions, to a one-letter topic and to one named as weir-bench names
//! its topics (62 characters: the batching maps hash the name per record).
//!
//! ```text
//! cargo bench -p weir-client --bench send -- [--seconds S]
//! ```

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use weir_client::producer::{BoxFuture, DefaultPartitioner, ProducerBackend, Route, TopicLayout};
use weir_client::{Acks, DeliveryFuture, Producer, ProducerConfig, ProducerRecord, Result};

/// Acknowledges everything, with made-up offsets.
struct Null;

impl ProducerBackend for Null {
    fn produce(
        &self,
        _route: Route,
        _acks: Acks,
        batches: Vec<(String, u32, Bytes)>,
    ) -> BoxFuture<'_, Result<Vec<Result<Option<u64>>>>> {
        Box::pin(async move { Ok(batches.iter().map(|_| Ok(Some(0))).collect()) })
    }

    fn layout<'a>(&'a self, _topic: &'a str) -> BoxFuture<'a, Result<TopicLayout>> {
        Box::pin(async {
            Ok(TopicLayout {
                partitions: 16,
                owners: (0..16).map(|p| p % 2).collect(),
            })
        })
    }

    fn init_producer_id(&self) -> BoxFuture<'_, Result<(i64, i16)>> {
        Box::pin(async { Ok((1, 0)) })
    }
}

async fn run(topic: &str, record_bytes: usize, secs: f64) -> f64 {
    let mut c = ProducerConfig::default();
    c.batch_size = 256 << 10;
    c.buffer_memory = 128 << 20;
    // Batches fill as they did before adaptive linger: a backend that
    // answers at once would otherwise make every batch a few records.
    c.linger_adaptive = false;
    let p = Producer::with_backend(Arc::new(Null), c, Arc::new(DefaultPartitioner));
    let topic: Arc<str> = topic.into();
    let value = Bytes::from(vec![b'x'; record_bytes]);
    let mut waiting: VecDeque<DeliveryFuture> = VecDeque::new();
    let mut n: u64 = 0;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        for _ in 0..1024 {
            let r = ProducerRecord {
                topic: topic.clone(),
                partition: Some((n % 16) as u32),
                value: Some(value.clone()),
                ..ProducerRecord::default()
            };
            n += 1;
            waiting.push_back(p.send(r).await.unwrap());
        }
        while let Some(o) = waiting.front_mut().and_then(DeliveryFuture::try_outcome) {
            o.unwrap();
            waiting.pop_front();
        }
    }
    p.flush().await;
    let s = start.elapsed().as_secs_f64();
    p.close().await;
    n as f64 / s
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(3.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let long = "Max-rate-1-producer-on-1-topic-1-partition-1000b-0-1a24d462d55";
    for topic in ["t", long] {
        for bytes in [100usize, 1024] {
            let rps = rt.block_on(run(topic, bytes, secs));
            println!(
                "send() {bytes:>5} B records to a {:>2}-character topic into a null backend: {:>10.0} records/s ({:.0} ns/record)",
                topic.len(),
                rps,
                1e9 / rps
            );
        }
    }
}
