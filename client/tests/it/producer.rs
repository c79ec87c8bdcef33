//! The batching producer against a fake backend (batching, linger, sticky
//! partitions, buffer limits, compression, retries) and, for keyed records,
//! a real `Client` against a scripted in-process server.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::time::Instant;
use weir_client::partitioner::partition_for_key;
use weir_client::producer::{
    BoxFuture, Compression, DefaultPartitioner, ProducerBackend, Route, TopicLayout,
};
use weir_client::{
    Acks, Client, ClientError, DeliveryFuture, Producer, ProducerConfig, ProducerRecord,
};
use weir_proto::api::ApiKey;
use weir_proto::batch::Compression as Codec;
use weir_proto::error_code::ErrorCode;
use weir_proto::frame::{self, ResponseHeader};
use weir_proto::messages::*;
use weir_proto::reader::RecordBatch;

type Request = Vec<(String, u32, Bytes)>;
/// A stored batch: (producer id, first seq, last seq, base offset, records).
type Stored = (i64, i32, i32, u64, u64);

/// Records every produce request; assigns offsets per partition and, for
/// batches with a producer id, checks sequences as the broker does
/// (duplicates answered with the original offsets, gaps refused).
#[derive(Default)]
struct Fake {
    partitions: u32,
    /// Owning core of every partition (empty: no shard routing).
    owners: Mutex<Vec<u32>>,
    /// Never answers produce requests (after recording them).
    hang: bool,
    /// Holds produce answers (not the appends) until the test opens it:
    /// requests stay in flight meanwhile.
    gate: Option<tokio::sync::Semaphore>,
    /// How many produce requests fail with a (retriable) timeout first,
    /// without being applied.
    fail_first: AtomicUsize,
    /// Produce request numbers (0-based) that are applied but whose answer
    /// is lost (a retriable disconnect).
    lose_answers: Mutex<Vec<usize>>,
    requests: Mutex<Vec<Request>>,
    routes: Mutex<Vec<Route>>,
    /// Per partition: the stored batches as (producer id, first seq, last
    /// seq, base offset, records).
    log: Mutex<HashMap<(String, u32), Vec<Stored>>>,
    next_pid: AtomicI64,
    metadata_calls: AtomicUsize,
    /// How many layout lookups fail (with a retriable disconnect) next.
    layout_failures: AtomicUsize,
}

impl Fake {
    fn new(partitions: u32) -> Arc<Fake> {
        Arc::new(Fake {
            partitions,
            ..Fake::default()
        })
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// Record counts of every batch sent, in order.
    fn batch_sizes(&self) -> Vec<i32> {
        self.requests()
            .iter()
            .flatten()
            .map(|(_, _, b)| RecordBatch::parse(b).unwrap().header().records_count)
            .collect()
    }

    /// Records stored in a partition.
    fn stored(&self, topic: &str, partition: u32) -> u64 {
        self.log
            .lock()
            .unwrap()
            .get(&(topic.to_string(), partition))
            .map_or(0, |l| l.iter().map(|b| b.4).sum())
    }

    fn apply(
        &self,
        acks: Acks,
        topic: &str,
        partition: u32,
        b: &Bytes,
    ) -> weir_client::Result<Option<u64>> {
        let h = *RecordBatch::parse(b).unwrap().header();
        let n = h.records_count as u64;
        let mut log = self.log.lock().unwrap();
        let l = log.entry((topic.to_string(), partition)).or_default();
        let next = l.last().map_or(0, |x| x.3 + x.4);
        let last_seq = h.base_sequence.wrapping_add(h.last_offset_delta);
        if h.producer_id >= 0 {
            let mine: Vec<_> = l.iter().filter(|x| x.0 == h.producer_id).collect();
            if let Some(dup) = mine
                .iter()
                .find(|x| x.1 == h.base_sequence && x.2 == last_seq)
            {
                return Ok(Some(dup.3));
            }
            let expected = mine.last().map_or(0, |x| x.2 + 1);
            if h.base_sequence != expected {
                return Err(ClientError::Partition {
                    topic: topic.to_string(),
                    partition,
                    code: ErrorCode::OutOfOrderSequence,
                    message: format!("expected {expected}, got {}", h.base_sequence),
                });
            }
        }
        l.push((h.producer_id, h.base_sequence, last_seq, next, n));
        Ok((acks != Acks::None).then_some(next))
    }
}

impl ProducerBackend for Fake {
    fn produce(
        &self,
        route: Route,
        acks: Acks,
        batches: Vec<(String, u32, Bytes)>,
    ) -> BoxFuture<'_, weir_client::Result<Vec<weir_client::Result<Option<u64>>>>> {
        Box::pin(async move {
            let n = {
                let mut r = self.requests.lock().unwrap();
                r.push(batches.clone());
                r.len() - 1
            };
            self.routes.lock().unwrap().push(route);
            if self.hang {
                std::future::pending::<()>().await;
            }
            if self
                .fail_first
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(ClientError::Timeout(Duration::from_secs(1)));
            }
            let owners = self.owners.lock().unwrap().clone();
            let results = batches
                .iter()
                .map(|(t, p, b)| match route {
                    // A core's own port refuses partitions it does not own.
                    Route::Core(c) if owners.get(*p as usize) != Some(&c) => {
                        Err(ClientError::Partition {
                            topic: t.clone(),
                            partition: *p,
                            code: ErrorCode::NotOwner,
                            message: "owned by another core".into(),
                        })
                    }
                    _ => self.apply(acks, t, *p, b),
                })
                .collect();
            // Applied in the order sent (as a broker reading one
            // connection does); only the answer waits for the gate.
            if let Some(g) = &self.gate {
                g.acquire().await.expect("gate open").forget();
            }
            if self.lose_answers.lock().unwrap().contains(&n) {
                return Err(ClientError::Disconnected);
            }
            Ok(results)
        })
    }

    fn layout<'a>(&'a self, _topic: &'a str) -> BoxFuture<'a, weir_client::Result<TopicLayout>> {
        self.metadata_calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if self
                .layout_failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(ClientError::Disconnected);
            }
            Ok(TopicLayout {
                partitions: self.partitions,
                owners: self.owners.lock().unwrap().clone(),
            })
        })
    }

    fn init_producer_id(&self) -> BoxFuture<'_, weir_client::Result<(i64, i16)>> {
        Box::pin(async move { Ok((self.next_pid.fetch_add(1, Ordering::SeqCst) + 100, 0)) })
    }
}

fn producer(fake: &Arc<Fake>, config: ProducerConfig) -> Producer {
    Producer::with_backend(fake.clone(), config, Arc::new(DefaultPartitioner))
}

fn config(linger_ms: u64, batch_size: usize) -> ProducerConfig {
    let mut c = ProducerConfig::default();
    c.linger_ms = linger_ms;
    c.batch_size = batch_size;
    // Routes need layouts: most tests count layout lookups without them.
    c.shard_aware = false;
    // The sender as a task of the test's runtime, whose clock is paused.
    c.io_thread = false;
    c
}

fn value(i: usize, len: usize) -> Bytes {
    let mut v = format!("{i:04}").into_bytes();
    v.resize(len, b'.');
    Bytes::from(v)
}

async fn offsets(futures: Vec<DeliveryFuture>) -> Vec<(u32, Option<u64>)> {
    let mut out = Vec::new();
    for f in futures {
        let m = f.await.unwrap();
        out.push((m.partition, m.offset));
    }
    out
}

#[tokio::test(start_paused = true)]
async fn batches_are_sent_when_full_without_lingering() {
    let fake = Fake::new(1);
    let mut c = config(60_000, 1000);
    c.linger_adaptive = false;
    let p = producer(&fake, c);
    let start = Instant::now();
    let mut futures = Vec::new();
    for i in 0..20 {
        let r = ProducerRecord::new("t", value(i, 100)).partition(0);
        futures.push(p.send(r).await.unwrap());
    }
    let mut futures = futures.into_iter();
    let first = futures.next().unwrap().await.unwrap();
    assert_eq!((&*first.topic, first.offset), ("t", Some(0)));
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "a full batch does not linger"
    );
    assert_eq!(
        fake.batch_sizes(),
        vec![8, 8],
        "the third batch still lingers"
    );
    p.flush().await;
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "flush does not linger either"
    );
    let got = offsets(futures.collect()).await;
    assert_eq!(got, (1..20).map(|o| (0, Some(o))).collect::<Vec<_>>());
    assert_eq!(fake.batch_sizes(), vec![8, 8, 4]);
    for (_, _, b) in fake.requests().iter().flatten() {
        assert!(b.len() <= 1000, "{} bytes", b.len());
    }
    assert_eq!(fake.metadata_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_batch_is_sent_linger_ms_after_its_first_record() {
    let fake = Fake::new(1);
    let mut c = config(50, 1 << 20);
    c.linger_adaptive = false;
    let p = producer(&fake, c);
    let start = Instant::now();
    let mut futures = Vec::new();
    for i in 0..3 {
        let r = ProducerRecord::new("t", value(i, 10)).partition(0);
        futures.push(p.send(r).await.unwrap());
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(fake.requests().is_empty());
    let got = offsets(futures).await;
    assert_eq!(got, vec![(0, Some(0)), (0, Some(1)), (0, Some(2))]);
    assert_eq!(start.elapsed(), Duration::from_millis(50));
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(fake.batch_sizes(), vec![3]);
}

/// A delivery future tells when its outcome became known (a Kafka send
/// callback's time): not before, a time between sending and looking
/// after.
#[tokio::test]
async fn a_delivery_future_knows_when_it_was_acknowledged() {
    let fake = Fake::new(1);
    let mut c = config(20, 1 << 20);
    c.linger_adaptive = false;
    let p = producer(&fake, c);
    let before = std::time::SystemTime::now();
    let mut f = p
        .send(ProducerRecord::new("t", value(0, 10)).partition(0))
        .await
        .unwrap();
    assert_eq!(f.completed_at(), None, "lingering: not sent yet");
    let m = (&mut f).await.unwrap();
    assert_eq!(m.offset, Some(0));
    let at = f.completed_at().expect("acknowledged");
    assert!(before <= at && at <= std::time::SystemTime::now());
    // At least the linger after sending.
    assert!(at.duration_since(before).unwrap() >= Duration::from_millis(20));
}

/// With `linger_adaptive` (the default) a partition with nothing in
/// flight sends its batch at once, whatever `linger_ms`; while that request
/// is in flight the next records gather in one batch, sent when the answer
/// comes back — not `linger_ms` later; and keyless records stay on their
/// sticky partition when a batch leaves early.
#[tokio::test(start_paused = true)]
async fn an_idle_partition_sends_at_once_and_gathers_while_a_request_is_in_flight() {
    let fake = Arc::new(Fake {
        partitions: 4,
        gate: Some(tokio::sync::Semaphore::new(0)),
        ..Fake::default()
    });
    let p = producer(&fake, config(60_000, 1 << 20));
    let start = Instant::now();
    let first = p
        .send(ProducerRecord::new("t", value(0, 10)))
        .await
        .unwrap();
    // The sender is a task of this runtime, whose clock is paused: it runs
    // when this task yields, and no time passes unless something sleeps.
    for _ in 0..100 {
        if !fake.requests().is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        fake.requests().len(),
        1,
        "the idle partition's record is sent"
    );
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "the idle partition's record lingered"
    );
    // The answer is held: these gather in one open batch.
    let mut later = Vec::new();
    for i in 1..=10 {
        later.push(
            p.send(ProducerRecord::new("t", value(i, 10)))
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        fake.requests().len(),
        1,
        "sent while the first was in flight"
    );
    let answered = Instant::now();
    fake.gate.as_ref().unwrap().add_permits(1 << 20);
    let m = first.await.unwrap();
    let got = offsets(later).await;
    assert!(
        answered.elapsed() < Duration::from_millis(5),
        "the gathered batch waited {:?} after the answer",
        answered.elapsed()
    );
    assert_eq!(
        got,
        (1..=10).map(|o| (m.partition, Some(o))).collect::<Vec<_>>(),
        "keyless records stay on the sticky partition"
    );
    assert_eq!(fake.batch_sizes(), vec![1, 10]);
    p.close().await;
}

#[tokio::test(start_paused = true)]
async fn ready_batches_of_several_partitions_share_one_request() {
    let fake = Fake::new(3);
    let p = producer(&fake, config(20, 1 << 20));
    let mut futures = Vec::new();
    for i in 0..6 {
        let r = ProducerRecord::new("t", value(i, 10)).partition(i as u32 % 3);
        futures.push(p.send(r).await.unwrap());
    }
    let got = offsets(futures).await;
    assert_eq!(
        got,
        vec![
            (0, Some(0)),
            (1, Some(0)),
            (2, Some(0)),
            (0, Some(1)),
            (1, Some(1)),
            (2, Some(1))
        ]
    );
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    let mut parts: Vec<u32> = reqs[0].iter().map(|(_, p, _)| *p).collect();
    parts.sort();
    assert_eq!(parts, vec![0, 1, 2]);
}

#[tokio::test(start_paused = true)]
async fn null_keys_stick_to_a_partition_until_its_batch_is_sent() {
    let fake = Fake::new(4);
    let p = producer(&fake, config(60_000, 1000));
    let mut futures = Vec::new();
    for i in 0..24 {
        futures.push(
            p.send(ProducerRecord::new("t", value(i, 100)))
                .await
                .unwrap(),
        );
    }
    p.flush().await;
    let got = offsets(futures).await;
    let parts: Vec<u32> = got.iter().map(|(p, _)| *p).collect();
    for chunk in parts.chunks(8) {
        assert!(chunk.iter().all(|&p| p == chunk[0]), "{parts:?}");
    }
    assert_ne!(parts[0], parts[8], "{parts:?}");
    assert_ne!(parts[8], parts[16], "{parts:?}");
    assert!(parts.iter().all(|&p| p < 4));
    assert_eq!(fake.batch_sizes(), vec![8, 8, 8]);
    assert_eq!(
        fake.metadata_calls.load(Ordering::SeqCst),
        1,
        "the partition count is cached"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_buffer_blocks_send_then_fails_after_max_block_ms() {
    let fake = Arc::new(Fake {
        partitions: 1,
        hang: true,
        ..Fake::default()
    });
    let mut c = config(0, 1 << 20);
    c.buffer_memory = 1000;
    c.max_block_ms = 100;
    let p = producer(&fake, c);
    let mut futures = Vec::new();
    for i in 0..3 {
        // About 326 bytes each: three fit in 1000.
        let r = ProducerRecord::new("t", value(i, 300)).partition(0);
        futures.push(p.send(r).await.unwrap());
    }
    let start = Instant::now();
    let e = p
        .send(ProducerRecord::new("t", value(3, 300)).partition(0))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert!(
        matches!(e, ClientError::BufferFull { waited } if waited == Duration::from_millis(100)),
        "{e:?}"
    );
    assert!(e.to_string().contains("buffer full"), "{e}");
    assert!(
        !fake.requests().is_empty(),
        "the buffered records were sent"
    );
    let e = p
        .send(ProducerRecord::new("t", value(4, 2000)).partition(0))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::InvalidArgument(_)), "{e:?}");
    drop(futures);
}

#[tokio::test(start_paused = true)]
async fn compressed_batches_decode_back() {
    for (codec, want) in [
        (Compression::Lz4, Codec::Lz4),
        (Compression::Zstd { level: 3 }, Codec::Zstd),
    ] {
        let fake = Fake::new(1);
        let mut c = config(60_000, 1 << 20);
        c.compression = codec;
        let p = producer(&fake, c);
        let mut futures = Vec::new();
        for i in 0..10 {
            let r = ProducerRecord::new("t", value(i, 200))
                .partition(0)
                .key(format!("k{i}"))
                .header("h", Some(Bytes::from(format!("x{i}"))))
                .timestamp(1_000 + i as i64);
            futures.push(p.send(r).await.unwrap());
        }
        p.flush().await;
        assert_eq!(offsets(futures).await.len(), 10);
        let reqs = fake.requests();
        assert_eq!(reqs.len(), 1);
        let (_, _, b) = &reqs[0][0];
        let batch = RecordBatch::parse(b).unwrap();
        assert_eq!(batch.compression(), want);
        assert!(b.len() < 10 * 200, "compressed: {} bytes", b.len());
        let records = batch.records().unwrap();
        let mut n = 0;
        for (i, r) in records.iter().enumerate() {
            let r = r.unwrap();
            assert_eq!(r.offset, i as i64);
            assert_eq!(r.timestamp, 1_000 + i as i64);
            assert_eq!(r.record.key, Some(format!("k{i}").as_bytes()));
            assert_eq!(r.record.value, Some(&value(i, 200)[..]));
            let h: Vec<_> = r.record.headers().collect();
            assert_eq!(h.len(), 1);
            assert_eq!(
                (h[0].key, h[0].value),
                (&b"h"[..], Some(format!("x{i}").as_bytes()))
            );
            n += 1;
        }
        assert_eq!(n, 10);
        p.close().await;
    }
}

#[tokio::test(start_paused = true)]
async fn retriable_errors_are_retried_and_acks_zero_has_no_offsets() {
    let fake = Fake::new(1);
    fake.fail_first.store(2, Ordering::SeqCst);
    let p = producer(&fake, config(0, 1 << 20));
    let start = Instant::now();
    let f = p
        .send(ProducerRecord::new("t", "a").partition(0))
        .await
        .unwrap();
    assert_eq!(f.await.unwrap().offset, Some(0));
    assert_eq!(fake.requests().len(), 3);
    assert_eq!(start.elapsed(), Duration::from_millis(200), "two backoffs");

    let fake = Fake::new(1);
    fake.fail_first.store(5, Ordering::SeqCst);
    let mut c = config(0, 1 << 20);
    c.retries = 1;
    c.acks = Acks::None;
    let p = producer(&fake, c);
    let f = p
        .send(ProducerRecord::new("t", "a").partition(0))
        .await
        .unwrap();
    assert!(matches!(f.await, Err(ClientError::Timeout(_))));
    assert_eq!(fake.requests().len(), 2);
    let f = p
        .send(ProducerRecord::new("t", "b").partition(0))
        .await
        .unwrap();
    let f2 = p
        .send(ProducerRecord::new("t", "c").partition(0))
        .await
        .unwrap();
    p.close().await;
    assert!(
        matches!(f2.await, Err(ClientError::Timeout(_))),
        "3rd and 4th fail"
    );
    drop(f);
    let e = p.send(ProducerRecord::new("t", "d")).await.unwrap_err();
    assert!(e.to_string().contains("closed"), "{e}");

    let fake = Fake::new(1);
    let mut c = config(0, 1 << 20);
    c.acks = Acks::None;
    let p = producer(&fake, c);
    let f = p
        .send(ProducerRecord::new("t", "a").partition(0))
        .await
        .unwrap();
    assert_eq!(f.await.unwrap().offset, None);
}

/// A real `Client` against a scripted server: the topic has 7 partitions;
/// produce answers with per-partition offsets and records the batches.
#[tokio::test]
async fn keyed_records_land_on_their_murmur2_partition() {
    let listener = TcpListener::bind((weir_testkit::ports::private_loopback(), 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let received: Arc<Mutex<Vec<(u32, Bytes)>>> = Arc::default();
    let seen = received.clone();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut next: HashMap<u32, u64> = HashMap::new();
        loop {
            let Some(f) = common::read_frame(&mut s).await else {
                return;
            };
            let (h, body, payload) = frame::decode_request(&f).unwrap();
            let rh = ResponseHeader::ok(h.correlation_id);
            let out = match h.api().unwrap() {
                ApiKey::Metadata => {
                    let partitions = (0..7)
                        .map(|p| PartitionMetadata {
                            partition: p,
                            core: 0,
                            error: 0,
                        })
                        .collect();
                    let md = MetadataResponse {
                        cores: vec![],
                        topics: vec![TopicMetadata {
                            name: "k".into(),
                            error: 0,
                            partitions,
                        }],
                    };
                    frame::encode_response_with_payload(&rh, &md, &[]).unwrap()
                }
                ApiKey::Produce => {
                    let req = frame::decode_body::<ProduceRequest>(body).unwrap();
                    let mut res = ProduceResponse::default();
                    for p in req.partitions {
                        let data =
                            frame::payload_slice(payload, p.payload_offset, p.payload_len).unwrap();
                        let n = RecordBatch::parse(data).unwrap().header().records_count;
                        seen.lock()
                            .unwrap()
                            .push((p.partition, Bytes::copy_from_slice(data)));
                        let o = next.entry(p.partition).or_insert(0);
                        res.partitions.push(ProducePartitionResult {
                            topic: p.topic,
                            partition: p.partition,
                            error: 0,
                            message: None,
                            base_offset: *o,
                            log_start_offset: 0,
                        });
                        *o += n as u64;
                    }
                    frame::encode_response_with_payload(&rh, &res, &[]).unwrap()
                }
                ApiKey::InitProducerId => {
                    let r = InitProducerIdResponse {
                        error: 0,
                        message: None,
                        producer_id: 7,
                        producer_epoch: 0,
                    };
                    frame::encode_response_with_payload(&rh, &r, &[]).unwrap()
                }
                other => panic!("unexpected {other}"),
            };
            s.write_all(&out).await.unwrap();
        }
    });
    let client = Client::connect(addr).await.unwrap();
    let p = Producer::new(client, config(1, 1 << 20));
    let mut futures = Vec::new();
    for i in 0..30 {
        let key = format!("key-{i}");
        let r = ProducerRecord::new("k", value(i, 10)).key(key.clone());
        futures.push((key, p.send(r).await.unwrap()));
    }
    let mut per_partition: HashMap<u32, u64> = HashMap::new();
    for (key, f) in futures {
        let m = f.await.unwrap();
        assert_eq!(m.partition, partition_for_key(key.as_bytes(), 7), "{key}");
        let expected = per_partition.entry(m.partition).or_insert(0);
        assert_eq!(m.offset, Some(*expected), "{key}");
        *expected += 1;
    }
    assert!(per_partition.len() > 1);
    for (partition, b) in received.lock().unwrap().iter() {
        let batch = RecordBatch::parse(b).unwrap();
        for r in batch.records().unwrap().iter() {
            let key = r.unwrap().record.key.unwrap();
            assert_eq!(partition_for_key(key, 7), *partition);
        }
    }
    p.close().await;
}

#[tokio::test(start_paused = true)]
async fn batches_carry_the_producer_id_and_per_partition_sequences() {
    let fake = Fake::new(2);
    let p = producer(&fake, config(0, 1));
    let mut fs = Vec::new();
    for i in 0..6u32 {
        let r = ProducerRecord::new("t", value(i as usize, 10)).partition(i % 2);
        fs.push(p.send(r).await.unwrap());
        // One record per batch; let each go out before the next.
        tokio::task::yield_now().await;
    }
    p.close().await;
    for f in fs {
        f.await.unwrap();
    }
    let mut seqs: HashMap<u32, Vec<i32>> = HashMap::new();
    for (_, part, b) in fake.requests().into_iter().flatten() {
        let h = *RecordBatch::parse(&b).unwrap().header();
        assert_eq!((h.producer_id, h.producer_epoch), (100, 0));
        seqs.entry(part).or_default().push(h.base_sequence);
    }
    assert_eq!(seqs[&0], vec![0, 1, 2]);
    assert_eq!(seqs[&1], vec![0, 1, 2]);

    // Without acks=all there is no idempotence: no producer id.
    let fake = Fake::new(1);
    let mut c = config(0, 1 << 20);
    c.acks = Acks::Leader;
    let p = producer(&fake, c);
    assert!(!p.is_idempotent());
    let f = p
        .send(ProducerRecord::new("t", "x").partition(0))
        .await
        .unwrap();
    f.await.unwrap();
    let b = &fake.requests()[0][0].2;
    assert_eq!(RecordBatch::parse(b).unwrap().header().producer_id, -1);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_a_lost_answer_is_acknowledged_once_with_the_original_offset() {
    let fake = Fake::new(1);
    // Requests 0 and 2 are appended but their answers are lost.
    *fake.lose_answers.lock().unwrap() = vec![0, 2];
    let p = producer(&fake, config(0, 1));
    let mut fs = Vec::new();
    for i in 0..5 {
        fs.push(
            p.send(ProducerRecord::new("t", value(i, 10)).partition(0))
                .await
                .unwrap(),
        );
        tokio::task::yield_now().await;
    }
    p.close().await;
    let got = offsets(fs).await;
    assert_eq!(
        got,
        (0..5).map(|i| (0, Some(i))).collect::<Vec<_>>(),
        "every record once, in order"
    );
    assert_eq!(fake.stored("t", 0), 5, "no duplicate was stored");
    assert!(fake.requests().len() > 5, "lost answers were retried");
}

#[tokio::test(start_paused = true)]
async fn a_batch_failing_for_good_fails_the_partitions_later_batches_and_renews_the_id() {
    let fake = Fake::new(1);
    fake.fail_first.store(1000, Ordering::SeqCst);
    let mut c = config(0, 1);
    c.delivery_timeout_ms = 1000;
    let p = producer(&fake, c);
    let a = p
        .send(ProducerRecord::new("t", "a").partition(0))
        .await
        .unwrap();
    let e = a.await.unwrap_err();
    assert!(matches!(e, ClientError::Timeout(_)), "{e}");
    // The broker works again: the next record goes out under a new id
    // starting at sequence 0.
    fake.fail_first.store(0, Ordering::SeqCst);
    let b = p
        .send(ProducerRecord::new("t", "b").partition(0))
        .await
        .unwrap();
    assert_eq!(b.await.unwrap().offset, Some(0));
    let last = fake.requests().last().unwrap()[0].2.clone();
    let h = *RecordBatch::parse(&last).unwrap().header();
    assert_eq!((h.producer_id, h.base_sequence), (101, 0));
}

#[tokio::test(start_paused = true)]
async fn shard_aware_routes_follow_the_layout() {
    let fake = Arc::new(Fake {
        partitions: 2,
        owners: Mutex::new(vec![1, 0]),
        ..Fake::default()
    });
    let mut c = config(0, 1 << 20);
    c.shard_aware = true;
    let p = producer(&fake, c);
    let a = p
        .send(ProducerRecord::new("t", "a").partition(0))
        .await
        .unwrap();
    a.await.unwrap();
    let b = p
        .send(ProducerRecord::new("t", "b").partition(1))
        .await
        .unwrap();
    b.await.unwrap();
    assert_eq!(
        *fake.routes.lock().unwrap(),
        vec![Route::Core(1), Route::Core(0)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_not_owner_answer_makes_the_producer_learn_the_layout_again() {
    let fake = Arc::new(Fake {
        partitions: 2,
        owners: Mutex::new(vec![1, 0]),
        ..Fake::default()
    });
    let mut c = config(0, 1 << 20);
    c.shard_aware = true;
    let p = producer(&fake, c);
    let a = p
        .send(ProducerRecord::new("t", "a").partition(0))
        .await
        .unwrap();
    assert_eq!(a.await.unwrap().offset, Some(0));
    // Partition 0 moves to core 0 (say, the broker restarted with other
    // cores): the next batch is refused, the layout asked again, and the
    // batch sent to the new owner.
    *fake.owners.lock().unwrap() = vec![0, 0];
    let lookups = fake.metadata_calls.load(Ordering::SeqCst);
    let b = p
        .send(ProducerRecord::new("t", "b").partition(0))
        .await
        .unwrap();
    assert_eq!(b.await.unwrap().offset, Some(1));
    assert!(fake.metadata_calls.load(Ordering::SeqCst) > lookups);
    assert_eq!(
        *fake.routes.lock().unwrap(),
        vec![Route::Core(1), Route::Core(1), Route::Core(0)]
    );
    assert_eq!(fake.stored("t", 0), 2, "nothing was stored twice");
}

/// Issue 18: on a current-thread runtime a loop calling `send` without
/// otherwise yielding sent nothing until the whole buffer was full (the
/// first acknowledgement came after ~950 000 sends). The sender now runs on
/// the producer's own thread: the first acknowledgement comes within a few
/// batches, while the loop is still running.
#[tokio::test(flavor = "current_thread")]
async fn a_tight_send_loop_on_a_current_thread_runtime_is_acknowledged_within_a_few_batches() {
    const RECORDS: usize = 200_000;
    let fake = Fake::new(4);
    let mut c = ProducerConfig::default();
    c.shard_aware = false;
    assert!(c.io_thread, "the default");
    let records_per_batch = c.batch_size / 128;
    let p = producer(&fake, c);
    let sent = Arc::new(AtomicUsize::new(0));
    let first_ack_at = Arc::new(AtomicUsize::new(usize::MAX));
    let acked = Arc::new(AtomicUsize::new(0));
    for i in 0..RECORDS {
        let (sent_then, first, acked) = (sent.clone(), first_ack_at.clone(), acked.clone());
        p.send_with(
            ProducerRecord::new("t", value(i, 100)).partition(i as u32 % 4),
            move |r| {
                r.unwrap();
                let _ = first.compare_exchange(
                    usize::MAX,
                    sent_then.load(Ordering::SeqCst),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
                acked.fetch_add(1, Ordering::SeqCst);
            },
        )
        .await
        .unwrap();
        sent.store(i + 1, Ordering::SeqCst);
    }
    let first = first_ack_at.load(Ordering::SeqCst);
    assert!(
        first != usize::MAX,
        "no acknowledgement at all during {RECORDS} sends"
    );
    let full_buffer = ProducerConfig::default().buffer_memory / 128;
    eprintln!(
        "first acknowledgement after {first} sends ({:.1} batches of {records_per_batch} \
         records over 4 partitions; a full buffer is {full_buffer} records)",
        first as f64 / records_per_batch as f64
    );
    // The four partitions' first batches close together, after about
    // 4 batches' worth of sends.
    assert!(
        first <= 16 * records_per_batch,
        "first acknowledgement after {first} sends, more than 16 batches"
    );
    p.flush().await;
    assert_eq!(acked.load(Ordering::SeqCst), RECORDS);
    p.close().await;
}

#[tokio::test(start_paused = true)]
async fn delivery_callbacks_run_once_per_record_in_offset_order_before_flush_returns() {
    let fake = Fake::new(2);
    let p = producer(&fake, config(5, 200));
    let seen: Arc<Mutex<Vec<(usize, u32, u64)>>> = Arc::default();
    for i in 0..50 {
        let seen = seen.clone();
        p.send_with(
            ProducerRecord::new("t", value(i, 10)).partition(i as u32 % 2),
            move |r| {
                let m = r.unwrap();
                seen.lock()
                    .unwrap()
                    .push((i, m.partition, m.offset.unwrap()));
            },
        )
        .await
        .unwrap();
    }
    p.flush().await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        50,
        "every callback ran once, before flush returned"
    );
    for part in 0..2u32 {
        let mine: Vec<(usize, u64)> = seen
            .iter()
            .filter(|(_, p, _)| *p == part)
            .map(|(i, _, o)| (*i, *o))
            .collect();
        assert_eq!(mine.len(), 25);
        for (k, (i, o)) in mine.iter().enumerate() {
            assert_eq!(*o, k as u64, "partition {part}: offsets in order");
            assert_eq!(*i, 2 * k + part as usize, "the record sent k-th");
        }
    }
    p.close().await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_callback_does_not_stop_the_producer() {
    let fake = Fake::new(1);
    let p = producer(&fake, config(0, 1 << 20));
    p.send_with(ProducerRecord::new("t", "a").partition(0), |_| {
        panic!("an application bug")
    })
    .await
    .unwrap();
    p.flush().await;
    let f = p
        .send(ProducerRecord::new("t", "b").partition(0))
        .await
        .unwrap();
    assert_eq!(f.await.unwrap().offset, Some(1), "the sender still works");
    p.close().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_metadata_refresh_uses_the_cached_layout_and_a_first_lookup_is_retried() {
    let fake = Fake::new(3);
    let mut c = config(0, 1 << 20);
    // Every send asks for the layout again.
    c.metadata_max_age_ms = 0;
    let p = producer(&fake, c);
    let f = p.send(ProducerRecord::new("t", "a")).await.unwrap();
    f.await.unwrap();
    // The broker is away: refreshing fails, the cached layout is used and
    // no error reaches `send`.
    fake.layout_failures.store(1000, Ordering::SeqCst);
    let mut futures = Vec::new();
    for i in 0..10 {
        futures.push(p.send(ProducerRecord::new("t", value(i, 5))).await.unwrap());
    }
    let stats = p.statistics();
    assert!(stats.metadata_failures >= 1, "{stats:?}");
    assert_eq!(
        stats.errors.get("disconnected"),
        Some(&stats.metadata_failures)
    );
    let asked = fake.metadata_calls.load(Ordering::SeqCst);
    assert!(
        asked <= 3,
        "not asked again on every send while failing: {asked}"
    );
    for f in futures {
        f.await.unwrap();
    }
    // A topic never seen has no cached layout: `send` asks again every
    // retry_backoff_ms (100 ms) until it gets one.
    fake.layout_failures.store(3, Ordering::SeqCst);
    let start = Instant::now();
    let f = p.send(ProducerRecord::new("u", "x")).await.unwrap();
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(300),
        "three backoffs"
    );
    f.await.unwrap();
    // Until max_block_ms, then the error.
    let mut c = config(0, 1 << 20);
    c.max_block_ms = 1_000;
    let p2 = producer(&fake, c);
    fake.layout_failures.store(1000, Ordering::SeqCst);
    let e = p2.send(ProducerRecord::new("v", "x")).await.unwrap_err();
    assert!(matches!(e, ClientError::Disconnected), "{e}");
    p.close().await;
    p2.close().await;
}

#[tokio::test(start_paused = true)]
async fn statistics_count_records_requests_retries_and_errors() {
    let fake = Fake::new(1);
    fake.fail_first.store(2, Ordering::SeqCst);
    let p = producer(&fake, config(0, 1 << 20));
    let f = p
        .send(ProducerRecord::new("t", "abc").partition(0))
        .await
        .unwrap();
    let before = p.statistics();
    assert_eq!(before.records_in_flight, 1);
    assert!(before.buffered_bytes > 0);
    f.await.unwrap();
    p.flush().await;
    let s = p.statistics();
    assert_eq!(s.records_sent, 1);
    assert_eq!(s.records_failed, 0);
    assert_eq!(s.records_in_flight, 0);
    assert_eq!(s.buffered_bytes, 0);
    assert_eq!(s.batches_sent, 1);
    assert_eq!(s.requests, 3);
    assert_eq!(s.requests_in_flight, 0);
    assert_eq!(s.retries, 2);
    assert_eq!(s.errors.get("timeout"), Some(&2));
    assert!(s.last_error.unwrap().contains("timed out"));
    assert!(s.bytes_sent > 0 && s.bytes_sent == s.batch_bytes_max);
    p.close().await;
}

/// With `linger_ms = 0` a batch goes out at once while there is room in
/// flight; once the in-flight limit is reached, records join one open
/// batch until the partition can send again (Kafka's accumulator). The
/// producer used to close a batch per record and queue them behind the
/// limit: one record per request, a backlog of seconds at 50 000 records/s
/// (docs/benchmarks.md, "linger.ms=0": publish p50 3.1 s before).
#[tokio::test]
async fn linger_zero_batches_what_arrives_while_requests_are_in_flight() {
    const RECORDS: usize = 200;
    let fake = Arc::new(Fake {
        partitions: 1,
        gate: Some(tokio::sync::Semaphore::new(0)),
        ..Fake::default()
    });
    let mut c = config(0, 1 << 20);
    c.io_thread = true;
    let max_in_flight = c.max_in_flight;
    let p = producer(&fake, c);
    let mut deliveries = Vec::new();
    for i in 0..RECORDS {
        let d = p
            .send(ProducerRecord::new("t", value(i, 100)).partition(0))
            .await
            .unwrap();
        deliveries.push(d);
        if i < max_in_flight {
            // The first records go out one by one until the limit is
            // reached (the sender runs on its own thread).
            let want = i + 1;
            let deadline = Instant::now() + Duration::from_secs(10);
            while fake.requests().len() < want {
                assert!(Instant::now() < deadline, "request {want} never sent");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        } else {
            // Then a record now and then: each would be a batch of its own
            // if batches were closed as soon as their linger passed.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let in_flight_meanwhile = fake.requests().len();
    fake.gate.as_ref().unwrap().add_permits(1 << 20);
    for (i, d) in deliveries.into_iter().enumerate() {
        assert_eq!(d.await.unwrap().offset, Some(i as u64), "record {i}");
    }
    let sizes = fake.batch_sizes();
    assert_eq!(
        sizes.iter().sum::<i32>() as usize,
        RECORDS,
        "each record sent once"
    );
    assert_eq!(
        in_flight_meanwhile, max_in_flight,
        "only the limit was sent while answers were held"
    );
    // The limit's single records, the batch queued behind them, and the one
    // every later record joined.
    assert!(
        sizes.len() <= max_in_flight + 2,
        "{} batches for {RECORDS} records (sizes {:?}…): records did not join an open batch \
         while the in-flight limit was reached",
        sizes.len(),
        &sizes[..sizes.len().min(12)]
    );
    p.close().await;
}

/// A partition with several batches waiting sends them together: one
/// request carries them all (up to PARTITION_REQUEST_BYTES_MAX), at most
/// LANE_BATCHES_IN_FLIGHT_IDEMPOTENT of them in flight with idempotence,
/// and the rest follows as answers come — in order, each record on its
/// offset. Before, a request carried one batch per partition, so a lone
/// partition had at most max_in_flight batches in flight.
#[tokio::test(start_paused = true)]
async fn one_partitions_queued_batches_go_out_together_up_to_its_in_flight_limit() {
    let fake = Arc::new(Fake {
        partitions: 1,
        gate: Some(tokio::sync::Semaphore::new(0)),
        ..Fake::default()
    });
    // A batch per record, sent by a sender task of this runtime: it runs
    // only when the test yields.
    let c = config(0, 1);
    assert!(c.enable_idempotence);
    let cap = weir_client::producer::LANE_BATCHES_IN_FLIGHT_IDEMPOTENT;
    let p = producer(&fake, c);
    let mut deliveries = Vec::new();
    for i in 0..cap + 4 {
        deliveries.push(
            p.send(ProducerRecord::new("t", value(i, 100)).partition(0))
                .await
                .unwrap(),
        );
    }
    // Let the sender run until it waits for answers.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let in_flight: Vec<usize> = fake.requests().iter().map(Vec::len).collect();
    assert_eq!(
        in_flight,
        vec![cap],
        "one request with as many batches as may be in flight"
    );
    fake.gate.as_ref().unwrap().add_permits(1 << 20);
    for (i, d) in deliveries.into_iter().enumerate() {
        assert_eq!(d.await.unwrap().offset, Some(i as u64), "record {i}");
    }
    let sent: Vec<usize> = fake.requests().iter().map(Vec::len).collect();
    assert_eq!(sent, vec![cap, 4], "the rest once the first answer came");
    p.close().await;
}
