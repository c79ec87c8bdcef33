//! The consumer against a fake in-memory log (positions, resets, limits,
//! CRC checks, compression) and, once, a real `Client` against a scripted
//! in-process server.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use weir_client::consumer::{ConsumerBackend, IsolationLevel};
use weir_client::producer::BoxFuture;
use weir_client::{
    Client, ClientError, Consumer, ConsumerConfig, ConsumerRecord, FetchedBatches, OffsetReset,
};
use weir_proto::api::ApiKey;
use weir_proto::batch::{set_base_offset, BatchError, BatchHeader, Compression};
use weir_proto::builder::BatchBuilder;
use weir_proto::error_code::ErrorCode;
use weir_proto::frame::{self, ResponseHeader};
use weir_proto::messages::*;
use weir_proto::reader::RecordBatch;
use weir_proto::record::RecordData;

const T: &str = "t";

/// Timestamp of the record at `offset` in every fake log.
fn ts(offset: u64) -> i64 {
    1_000 + 10 * offset as i64
}

fn value(partition: u32, offset: u64) -> Bytes {
    Bytes::from(format!("p{partition}-{offset}"))
}

/// A batch of `n` records at `base` for `partition`, each with a key, a
/// value and one header.
fn batch(codec: Compression, partition: u32, base: u64, n: u64) -> Bytes {
    let mut b = BatchBuilder::new(codec).unwrap();
    for o in base..base + n {
        b.push(&RecordData {
            key: Some(Bytes::from(format!("k{o}"))),
            value: Some(value(partition, o)),
            headers: vec![("h".into(), Some(Bytes::from_static(b"x")))],
            timestamp: ts(o),
        })
        .unwrap();
    }
    let mut out = b.build().unwrap();
    set_base_offset(&mut out, base as i64);
    out.freeze()
}

#[derive(Default)]
struct Log {
    start: u64,
    end: u64,
    batches: Vec<Bytes>,
}

/// An in-memory broker: per-partition logs, recorded fetches, and where
/// the last fetch of each partition ended (for `FetchPartition::CONTINUE`,
/// as the broker keeps per connection).
#[derive(Default)]
struct Fake {
    logs: Mutex<HashMap<u32, Log>>,
    fetches: Mutex<Vec<Vec<FetchPartition>>>,
    ends: Mutex<HashMap<u32, u64>>,
}

impl Fake {
    fn new() -> Arc<Fake> {
        Arc::new(Fake::default())
    }

    /// Appends `n` records to partition `p` as one batch.
    fn append(&self, p: u32, n: u64, codec: Compression) {
        let mut logs = self.logs.lock().unwrap();
        let log = logs.entry(p).or_default();
        log.batches.push(batch(codec, p, log.end, n));
        log.end += n;
    }

    /// Appends a raw (possibly corrupt) batch spanning `n` offsets.
    fn append_raw(&self, p: u32, n: u64, b: Bytes) {
        let mut logs = self.logs.lock().unwrap();
        let log = logs.entry(p).or_default();
        log.batches.push(b);
        log.end += n;
    }

    /// Retention: the log now starts at `start` (whole batches below it go).
    fn truncate(&self, p: u32, start: u64) {
        let mut logs = self.logs.lock().unwrap();
        let log = logs.get_mut(&p).unwrap();
        log.batches
            .retain(|b| BatchHeader::peek(b).unwrap().last_offset() >= start as i64);
        log.start = start;
    }

    fn fetch_count(&self) -> usize {
        self.fetches.lock().unwrap().len()
    }
}

fn last_offset(b: &Bytes) -> u64 {
    BatchHeader::peek(b).unwrap().last_offset() as u64
}

impl ConsumerBackend for Fake {
    fn fetch_many(
        &self,
        _isolation: IsolationLevel,
        _max_wait_ms: u32,
        _max_bytes: u32,
        partitions: Vec<FetchPartition>,
    ) -> BoxFuture<'_, weir_client::Result<Vec<weir_client::Result<FetchedBatches>>>> {
        Box::pin(async move {
            self.fetches.lock().unwrap().push(partitions.clone());
            let logs = self.logs.lock().unwrap();
            let out = partitions
                .iter()
                .map(|t| {
                    let empty = Log::default();
                    let log = logs.get(&t.partition).unwrap_or(&empty);
                    let mut ends = self.ends.lock().unwrap();
                    let mut t = t.clone();
                    if t.offset == FetchPartition::CONTINUE {
                        let Some(&end) = ends.get(&t.partition) else {
                            return Err(ClientError::Partition {
                                topic: t.topic.clone(),
                                partition: t.partition,
                                code: ErrorCode::InvalidRequest,
                                message: "nothing to continue from".into(),
                            });
                        };
                        t.offset = end;
                    }
                    ends.remove(&t.partition);
                    if t.offset < log.start || t.offset > log.end {
                        return Err(ClientError::Partition {
                            topic: t.topic.clone(),
                            partition: t.partition,
                            code: ErrorCode::OffsetOutOfRange,
                            message: "offset out of range".into(),
                        });
                    }
                    let mut batches = Vec::new();
                    let mut size = 0;
                    for b in log.batches.iter().filter(|b| last_offset(b) >= t.offset) {
                        if !batches.is_empty() && size + b.len() > t.max_bytes as usize {
                            break;
                        }
                        size += b.len();
                        batches.push(b.clone());
                    }
                    let end = batches.last().map_or(t.offset, |b| last_offset(b) + 1);
                    ends.insert(t.partition, end.max(t.offset));
                    Ok(FetchedBatches {
                        batches,
                        high_watermark: log.end,
                        log_start_offset: log.start,
                        last_stable_offset: log.end,
                        aborted: Vec::new(),
                        fetch_offset: t.offset,
                    })
                })
                .collect();
            Ok(out)
        })
    }

    fn list_offsets<'a>(
        &'a self,
        _isolation: IsolationLevel,
        _topic: &'a str,
        partition: u32,
        spec: OffsetSpec,
    ) -> BoxFuture<'a, weir_client::Result<Option<u64>>> {
        Box::pin(async move {
            let logs = self.logs.lock().unwrap();
            let empty = Log::default();
            let log = logs.get(&partition).unwrap_or(&empty);
            Ok(match spec {
                OffsetSpec::Earliest => Some(log.start),
                OffsetSpec::Latest => Some(log.end),
                OffsetSpec::Timestamp(t) => log.batches.iter().find_map(|b| {
                    let rb = RecordBatch::parse(b).ok()?;
                    let records = rb.records().ok()?;
                    let found = records
                        .iter()
                        .map(Result::unwrap)
                        .find(|r| r.timestamp >= t && r.offset as u64 >= log.start)
                        .map(|r| r.offset as u64);
                    found
                }),
            })
        })
    }
}

fn config(reset: OffsetReset) -> ConsumerConfig {
    let mut c = ConsumerConfig::default();
    c.auto_offset_reset = reset;
    c
}

fn consumer(fake: &Arc<Fake>, c: ConsumerConfig, partitions: &[u32]) -> Consumer {
    let mut consumer = Consumer::with_backend(fake.clone(), c);
    consumer.assign(partitions.iter().map(|&p| (T.to_string(), p)).collect());
    consumer
}

/// (partition, offset) of each record.
fn ids(records: &[ConsumerRecord]) -> Vec<(u32, u64)> {
    records.iter().map(|r| (r.partition, r.offset)).collect()
}

/// Checks every field against what [`batch`] wrote.
fn check_contents(records: &[ConsumerRecord]) {
    for r in records {
        assert_eq!(&*r.topic, T);
        assert_eq!(r.value, Some(value(r.partition, r.offset)));
        assert_eq!(r.key, Some(Bytes::from(format!("k{}", r.offset))));
        assert_eq!(r.timestamp, ts(r.offset));
        assert_eq!(
            r.headers,
            vec![("h".to_string(), Some(Bytes::from_static(b"x")))]
        );
    }
}

const WAIT: Duration = Duration::from_secs(2);

#[tokio::test]
async fn poll_returns_records_in_order_across_two_partitions() {
    let fake = Fake::new();
    fake.append(0, 3, Compression::None);
    fake.append(1, 2, Compression::None);
    fake.append(0, 2, Compression::None);
    let mut c = consumer(&fake, config(OffsetReset::Earliest), &[0, 1]);
    assert_eq!(c.position(T, 0), None);
    let got = c.poll(WAIT).await.unwrap();
    check_contents(&got);
    let p0: Vec<u64> = got
        .iter()
        .filter(|r| r.partition == 0)
        .map(|r| r.offset)
        .collect();
    let p1: Vec<u64> = got
        .iter()
        .filter(|r| r.partition == 1)
        .map(|r| r.offset)
        .collect();
    assert_eq!(p0, vec![0, 1, 2, 3, 4]);
    assert_eq!(p1, vec![0, 1]);
    let fetches = fake.fetches.lock().unwrap().clone();
    assert_eq!(fetches.len(), 1, "one request for both partitions");
    assert_eq!(fetches[0].len(), 2);
    assert_eq!((c.position(T, 0), c.position(T, 1)), (Some(5), Some(2)));

    // New data continues where the last poll ended.
    fake.append(0, 1, Compression::None);
    let got = c.poll(WAIT).await.unwrap();
    assert_eq!(ids(&got), vec![(0, 5)]);
    assert_eq!(fake.fetches.lock().unwrap()[1][0].offset, 5);
    assert!(c.poll(Duration::ZERO).await.unwrap().is_empty());
}

#[tokio::test]
async fn max_poll_records_leaves_the_rest_for_the_next_poll() {
    let fake = Fake::new();
    fake.append(0, 4, Compression::None);
    fake.append(1, 3, Compression::None);
    let mut cfg = config(OffsetReset::Earliest);
    cfg.max_poll_records = 3;
    let mut c = consumer(&fake, cfg, &[0, 1]);
    let mut all = Vec::new();
    loop {
        let got = c.poll(Duration::ZERO).await.unwrap();
        if got.is_empty() {
            break;
        }
        assert!(got.len() <= 3);
        all.extend(got);
    }
    assert_eq!(fake.fetch_count(), 2, "leftovers come from the buffer");
    check_contents(&all);
    for p in [0, 1] {
        let offsets: Vec<u64> = all
            .iter()
            .filter(|r| r.partition == p)
            .map(|r| r.offset)
            .collect();
        let n = if p == 0 { 4 } else { 3 };
        assert_eq!(offsets, (0..n).collect::<Vec<_>>());
    }
    assert_eq!((c.position(T, 0), c.position(T, 1)), (Some(4), Some(3)));
}

#[tokio::test]
async fn first_poll_stops_at_the_limit_and_position_follows() {
    let fake = Fake::new();
    fake.append(0, 5, Compression::None);
    let mut cfg = config(OffsetReset::Earliest);
    cfg.max_poll_records = 2;
    let mut c = consumer(&fake, cfg, &[0]);
    assert_eq!(ids(&c.poll(WAIT).await.unwrap()), vec![(0, 0), (0, 1)]);
    assert_eq!((c.position(T, 0), c.buffered()), (Some(2), 3));
    assert_eq!(ids(&c.poll(WAIT).await.unwrap()), vec![(0, 2), (0, 3)]);
    assert_eq!(ids(&c.poll(WAIT).await.unwrap()), vec![(0, 4)]);
    assert_eq!(fake.fetch_count(), 1);
}

#[tokio::test]
async fn seeks() {
    let fake = Fake::new();
    fake.append(0, 10, Compression::None);
    let mut c = consumer(&fake, config(OffsetReset::None), &[0]);

    // Into the middle of a batch: the records below are skipped.
    c.seek(T, 0, 5).unwrap();
    assert_eq!(c.position(T, 0), Some(5));
    let got = c.poll(WAIT).await.unwrap();
    assert_eq!(ids(&got), (5..10).map(|o| (0, o)).collect::<Vec<_>>());
    check_contents(&got);

    c.seek_to_beginning(&[(T.into(), 0)]).await.unwrap();
    assert_eq!(c.position(T, 0), Some(0));
    assert_eq!(c.poll(WAIT).await.unwrap().len(), 10);

    c.seek(T, 0, 3).unwrap();
    c.seek_to_end(&[(T.into(), 0)]).await.unwrap();
    assert_eq!(c.position(T, 0), Some(10));
    assert!(c.poll(Duration::ZERO).await.unwrap().is_empty());

    assert_eq!(c.seek_to_timestamp(T, 0, ts(7) - 1).await.unwrap(), 7);
    assert_eq!(c.position(T, 0), Some(7));
    assert_eq!(
        ids(&c.poll(WAIT).await.unwrap()),
        vec![(0, 7), (0, 8), (0, 9)]
    );
    // No record that new: the end.
    c.seek(T, 0, 0).unwrap();
    assert_eq!(c.seek_to_timestamp(T, 0, ts(100)).await.unwrap(), 10);
    assert_eq!(c.position(T, 0), Some(10));

    // A seek drops buffered records.
    let mut cfg = config(OffsetReset::Earliest);
    cfg.max_poll_records = 1;
    let mut c = consumer(&fake, cfg, &[0]);
    assert_eq!(ids(&c.poll(WAIT).await.unwrap()), vec![(0, 0)]);
    c.seek(T, 0, 8).unwrap();
    assert_eq!(c.buffered(), 0);
    assert_eq!(ids(&c.poll(WAIT).await.unwrap()), vec![(0, 8)]);

    let e = c.seek(T, 9, 0).unwrap_err();
    assert!(matches!(e, ClientError::InvalidArgument(_)), "{e}");
    assert!(c.seek_to_timestamp(T, 9, 0).await.is_err());
}

#[tokio::test]
async fn the_next_fetch_is_sent_while_the_application_works() {
    let fake = Fake::new();
    fake.append(0, 4, Compression::None);
    let mut c = consumer(&fake, config(OffsetReset::Earliest), &[0]);
    assert_eq!(c.poll(WAIT).await.unwrap().len(), 4);
    // poll returned with nothing buffered: the next fetch is on its way.
    fake.append(0, 3, Compression::None);
    let got = c.poll(WAIT).await.unwrap();
    // The fetch sent ahead saw the log before the append; the one after it
    // brings the new records (or it already did).
    let mut all = got;
    while all.len() < 3 {
        all.extend(c.poll(WAIT).await.unwrap());
    }
    assert_eq!(ids(&all), vec![(0, 4), (0, 5), (0, 6)]);
    assert!(fake.fetch_count() >= 2, "a fetch was sent ahead");

    // A seek drops what the fetch sent ahead brings for that partition.
    let mut c = consumer(&fake, config(OffsetReset::Earliest), &[0]);
    assert_eq!(c.poll(WAIT).await.unwrap().len(), 7);
    c.seek(T, 0, 2).unwrap();
    assert_eq!(ids(&c.poll(WAIT).await.unwrap())[0], (0, 2));
}

/// While records flow the consumer keeps a second fetch out that
/// continues where the first ends (`FetchPartition::CONTINUE`): every
/// record comes once, in order, per partition; a seek in the middle drops
/// the continuing fetches out (their answers start elsewhere) and reading
/// goes on from the sought offset, nothing skipped or repeated.
#[tokio::test]
async fn continuing_fetches_keep_order_and_yield_to_a_seek() {
    let fake = Fake::new();
    for _ in 0..30 {
        fake.append(0, 5, Compression::None);
        fake.append(1, 5, Compression::Lz4);
    }
    let mut cfg = config(OffsetReset::Earliest);
    // One batch per partition per fetch, a few records per poll.
    cfg.max_partition_fetch_bytes = 1;
    cfg.max_poll_records = 3;
    let mut c = consumer(&fake, cfg, &[0, 1]);
    let mut got: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut sought = false;
    while got.values().map(Vec::len).sum::<usize>() < 300 + 40 {
        let records = c.poll(WAIT).await.unwrap();
        assert!(!records.is_empty(), "records stopped coming: {got:?}");
        check_contents(&records);
        for (p, o) in ids(&records) {
            got.entry(p).or_default().push(o);
        }
        if !sought && got.get(&0).is_some_and(|v| v.len() >= 60) {
            // Partition 0 goes back 40 records.
            let at = *got[&0].last().unwrap() + 1 - 40;
            c.seek(T, 0, at).unwrap();
            sought = true;
        }
    }
    let p0 = &got[&0];
    let back = p0.windows(2).position(|w| w[1] != w[0] + 1).unwrap();
    assert_eq!(p0[..=back], (0..=p0[back]).collect::<Vec<_>>()[..]);
    assert_eq!(p0[back + 1], p0[back] + 1 - 40, "read on from the seek");
    assert!(p0[back + 1..].windows(2).all(|w| w[1] == w[0] + 1));
    assert_eq!(*p0.last().unwrap(), 149);
    assert_eq!(got[&1], (0..150).collect::<Vec<_>>());
    let continuing = fake
        .fetches
        .lock()
        .unwrap()
        .iter()
        .filter(|f| f.iter().all(|p| p.offset == FetchPartition::CONTINUE))
        .count();
    assert!(continuing >= 20, "{continuing} continuing fetches");
}

#[tokio::test]
async fn auto_offset_reset_without_a_position() {
    let fake = Fake::new();
    fake.append(0, 4, Compression::None);
    fake.truncate(0, 0);

    let mut c = consumer(&fake, config(OffsetReset::Earliest), &[0]);
    assert_eq!(c.poll(WAIT).await.unwrap().len(), 4);

    let mut c = consumer(&fake, ConsumerConfig::default(), &[0]);
    assert_eq!(
        ConsumerConfig::default().auto_offset_reset,
        OffsetReset::Latest
    );
    assert!(c.poll(Duration::ZERO).await.unwrap().is_empty());
    assert_eq!(c.position(T, 0), Some(4));
    fake.append(0, 2, Compression::None);
    assert_eq!(ids(&c.poll(WAIT).await.unwrap()), vec![(0, 4), (0, 5)]);
    assert_eq!(c.skipped(T, 0), 0, "a first reset skips nothing");

    let mut c = consumer(&fake, config(OffsetReset::None), &[0]);
    let before = fake.fetch_count();
    let e = c.poll(WAIT).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::OffsetOutOfRange));
    assert!(e.to_string().contains("t-0"), "{e}");
    assert_eq!(
        fake.fetch_count(),
        before,
        "nothing fetched without a position"
    );
    c.seek(T, 0, 1).unwrap();
    assert_eq!(c.poll(WAIT).await.unwrap().len(), 5);
}

/// 10 records in batches of 2; the consumer is at 2; retention then
/// removes offsets below 6.
async fn out_of_range(reset: OffsetReset) -> (Arc<Fake>, Consumer) {
    let fake = Fake::new();
    for _ in 0..5 {
        fake.append(0, 2, Compression::None);
    }
    let mut c = consumer(&fake, config(reset), &[0]);
    c.seek(T, 0, 2).unwrap();
    fake.truncate(0, 6);
    (fake, c)
}

#[tokio::test]
async fn out_of_range_below_the_log_start_resets_and_reports() {
    let (_, mut c) = out_of_range(OffsetReset::Earliest).await;
    let got = c.poll(WAIT).await.unwrap();
    assert_eq!(ids(&got), (6..10).map(|o| (0, o)).collect::<Vec<_>>());
    assert_eq!(c.skipped(T, 0), 4, "offsets 2..6 were removed unread");

    let (fake, mut c) = out_of_range(OffsetReset::Latest).await;
    assert!(c.poll(Duration::ZERO).await.unwrap().is_empty());
    assert_eq!(c.position(T, 0), Some(10));
    assert_eq!(c.skipped(T, 0), 8, "2..10 jumped over");
    fake.append(0, 1, Compression::None);
    assert_eq!(ids(&c.poll(WAIT).await.unwrap()), vec![(0, 10)]);
    assert_eq!(c.skipped(T, 0), 8);

    let (_, mut c) = out_of_range(OffsetReset::None).await;
    let e = c.poll(WAIT).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::OffsetOutOfRange));
    let msg = e.to_string();
    assert!(
        msg.contains("t-0") && msg.contains("offset 2") && msg.contains("6..10"),
        "{msg}"
    );
    assert_eq!((c.position(T, 0), c.skipped(T, 0)), (Some(2), 0));
    // The application decides: here, to the log start.
    c.seek_to_beginning(&[(T.into(), 0)]).await.unwrap();
    assert_eq!(c.poll(WAIT).await.unwrap().len(), 4);
}

#[tokio::test]
async fn a_corrupt_batch_is_an_error_not_data() {
    let fake = Fake::new();
    fake.append(0, 3, Compression::None);
    let mut bad = batch(Compression::None, 0, 3, 2).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0xff; // in the records: the CRC no longer matches
    fake.append_raw(0, 2, Bytes::from(bad));
    fake.append(0, 1, Compression::None);
    let mut c = consumer(&fake, config(OffsetReset::Earliest), &[0]);
    let e = c.poll(WAIT).await.unwrap_err();
    assert!(
        matches!(e, ClientError::CorruptBatch(BatchError::BadCrc { .. })),
        "{e:?}"
    );
    // The records before the bad batch are valid and still delivered...
    assert_eq!(
        ids(&c.poll(WAIT).await.unwrap()),
        vec![(0, 0), (0, 1), (0, 2)]
    );
    // ...but nothing at or past it.
    for _ in 0..2 {
        assert!(matches!(
            c.poll(WAIT).await,
            Err(ClientError::CorruptBatch(_))
        ));
        assert_eq!(c.position(T, 0), Some(3));
    }
}

#[tokio::test]
async fn compressed_batches_decode() {
    let fake = Fake::new();
    fake.append(0, 3, Compression::Lz4);
    fake.append(0, 3, Compression::Zstd);
    fake.append(1, 4, Compression::Zstd);
    let mut c = consumer(&fake, config(OffsetReset::Earliest), &[0, 1]);
    c.seek(T, 1, 2).unwrap(); // mid-batch in a compressed batch
    let got = c.poll(WAIT).await.unwrap();
    check_contents(&got);
    let mut want: Vec<(u32, u64)> = (0..6).map(|o| (0, o)).collect();
    want.extend([(1, 2), (1, 3)]);
    let mut have = ids(&got);
    have.sort();
    assert_eq!(have, want);
}

/// The `Client` backend: fetch and list_offsets over TCP to a scripted
/// server.
#[tokio::test]
async fn through_a_client() {
    let b0 = batch(Compression::Zstd, 0, 5, 3);
    let served = b0.clone();
    let listener = TcpListener::bind((weir_testkit::ports::private_loopback(), 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let fetches = Arc::new(AtomicUsize::new(0));
    let counter = fetches.clone();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        loop {
            let Some(f) = common::read_frame(&mut s).await else {
                return;
            };
            let (h, body, _) = frame::decode_request(&f).unwrap();
            let rh = ResponseHeader::ok(h.correlation_id);
            let out = match h.api().unwrap() {
                ApiKey::ListOffsets => {
                    let req = frame::decode_body::<ListOffsetsRequest>(body).unwrap();
                    assert_eq!(req.partitions[0].spec, OffsetSpec::Earliest);
                    let res = ListOffsetsResponse {
                        partitions: vec![ListOffsetsResult {
                            topic: T.into(),
                            partition: 0,
                            error: 0,
                            offset: Some(5),
                            timestamp: None,
                        }],
                    };
                    frame::encode_response_with_payload(&rh, &res, &[])
                }
                ApiKey::Fetch => {
                    let req = frame::decode_body::<FetchRequest>(body).unwrap();
                    assert_eq!(req.partitions[0].offset, 5);
                    assert!(req.max_wait_ms <= 500);
                    counter.fetch_add(1, Ordering::SeqCst);
                    let res = FetchResponse {
                        partitions: vec![FetchPartitionResult {
                            topic: T.into(),
                            partition: 0,
                            error: 0,
                            message: None,
                            high_watermark: 8,
                            log_start_offset: 5,
                            payload_offset: 0,
                            payload_len: served.len() as u32,
                            last_stable_offset: 8,
                            aborted: Vec::new(),
                            fetch_offset: 5,
                        }],
                    };
                    frame::encode_response_with_payload(&rh, &res, &[&served])
                }
                other => panic!("unexpected {other}"),
            };
            s.write_all(&out.unwrap()).await.unwrap();
        }
    });
    let client = Client::connect(addr).await.unwrap();
    // Everything through the one connection (no metadata, no per-core
    // connections).
    let mut cfg = config(OffsetReset::Earliest);
    cfg.shard_aware = false;
    let mut c = Consumer::new(client, cfg);
    c.assign(vec![(T.into(), 0)]);
    let got = c.poll(WAIT).await.unwrap();
    assert_eq!(ids(&got), vec![(0, 5), (0, 6), (0, 7)]);
    check_contents(&got);
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    assert_eq!(c.position(T, 0), Some(8));
}

#[tokio::test]
async fn statistics_count_polls_records_fetches_resets_and_errors() {
    let (_, mut c) = out_of_range(OffsetReset::Earliest).await;
    let got = c.poll(WAIT).await.unwrap();
    assert_eq!(got.len(), 4);
    let s = c.statistics();
    assert_eq!((s.polls, s.records), (1, 4));
    assert_eq!(
        s.record_bytes,
        got.iter()
            .map(|r| r.value.as_ref().map_or(0, |v| v.len()) + r.key.as_ref().map_or(0, |k| k.len()))
            .sum::<usize>() as u64
    );
    assert!(
        s.fetches >= 2,
        "the refused fetch and the one after the reset"
    );
    assert!(s.fetch_bytes > 0);
    assert_eq!((s.offset_resets, s.skipped), (1, 4));
    assert!(s.errors.is_empty());

    let (_, mut c) = out_of_range(OffsetReset::None).await;
    c.poll(WAIT).await.unwrap_err();
    let s = c.statistics();
    assert_eq!(s.errors.get("OffsetOutOfRange"), Some(&1));
    assert!(s.last_error.unwrap().contains("out of range"));
}

#[tokio::test]
async fn the_consumer_as_a_stream_yields_every_record_in_order_and_gives_itself_back() {
    use futures_lite::StreamExt;
    let fake = Fake::new();
    for _ in 0..3 {
        fake.append(0, 4, Compression::None);
    }
    let mut c = consumer(&fake, config(OffsetReset::Earliest), &[0]);
    c.seek(T, 0, 0).unwrap();
    let mut stream = c.into_stream(WAIT);
    let mut got = Vec::new();
    while got.len() < 12 {
        got.push(stream.next().await.unwrap().unwrap());
    }
    assert_eq!(ids(&got), (0..12).map(|o| (0, o)).collect::<Vec<_>>());
    check_contents(&got);
    let (c, rest) = stream.into_inner().map_err(|_| "polling").unwrap();
    assert!(rest.is_empty());
    assert_eq!(c.position(T, 0), Some(12));
    assert_eq!(c.end_offset(T, 0).await.unwrap(), 12);
    assert_eq!(c.beginning_offset(T, 0).await.unwrap(), 0);
    assert_eq!(c.lag(T, 0).await.unwrap(), Some(0));
}
