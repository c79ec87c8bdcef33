//! The SDK against a real `weir broker` process under faults: a restart
//! under a producer that only knows a host name, and SIGKILL with the
//! acknowledgements recorded by delivery callbacks (the oracle counts every
//! acknowledged record). See `weir_testkit::weir_bin` for how the binary is
//! found.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::broker::start_broker;
use tokio::sync::Notify;
use weir_client::{Client, Consumer, ConsumerRecord, Producer, ProducerRecord};

/// A one-thread runtime, as the SDK's examples use: the producer must send
/// from its own thread while this one is busy.
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Reads every record of the `partitions` partitions of `topic`, from the
/// log start to the log end offsets the broker reports now (bounded by a
/// 60 s deadline).
async fn read_back(bootstrap: &str, topic: &str, partitions: u32) -> Vec<ConsumerRecord> {
    let mut consumer = Consumer::builder()
        .bootstrap(bootstrap)
        .from_config([
            ("auto.offset.reset", "earliest"),
            ("fetch.max.wait.ms", "100"),
        ])
        .topics([topic])
        .build()
        .await
        .unwrap();
    let mut ends = Vec::new();
    for p in 0..partitions {
        ends.push(consumer.end_offset(topic, p).await.unwrap());
    }
    let done = |c: &Consumer| {
        (0..partitions).all(|p| c.position(topic, p).unwrap_or(0) >= ends[p as usize])
    };
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done(&consumer) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "read back {} records, not up to the end offsets {ends:?}",
            out.len()
        );
        out.extend(consumer.poll(Duration::from_millis(200)).await.unwrap());
    }
    out
}

fn id_of(r: &ConsumerRecord) -> usize {
    let v = std::str::from_utf8(r.value.as_deref().unwrap()).unwrap();
    v.strip_prefix('r').unwrap().parse().unwrap()
}

/// Counts acknowledgements and wakes a waiter on each.
#[derive(Default)]
struct Acks {
    per_record: Vec<AtomicU32>,
    total: AtomicUsize,
    errors: Mutex<Vec<String>>,
    changed: Notify,
}

impl Acks {
    fn new(n: usize) -> Arc<Acks> {
        Arc::new(Acks {
            per_record: (0..n).map(|_| AtomicU32::new(0)).collect(),
            ..Acks::default()
        })
    }

    async fn wait_for(&self, n: usize) {
        loop {
            let changed = self.changed.notified();
            if self.total.load(Ordering::SeqCst) >= n {
                return;
            }
            changed.await;
        }
    }
}

#[test]
fn a_broker_restart_under_a_producer_built_from_a_host_name_reaches_no_caller_and_acks_each_record_once(
) {
    const RECORDS: usize = 20_000;
    const PARTITIONS: u32 = 4;
    let dir = tempfile::tempdir().unwrap();
    // Fixed: the broker comes back on it.
    let port = weir_testkit::ports::run(weir_testkit::ports::Proto::Tcp, 0);
    let broker = start_broker(dir.path(), 2, port);
    let bootstrap = format!("localhost:{port}");
    current_thread().block_on(async {
        let admin = Client::connect(broker.listen).await.unwrap();
        admin
            .create_topic("restart", PARTITIONS, vec![])
            .await
            .unwrap();
        drop(admin);
        let producer = Producer::builder()
            .bootstrap(bootstrap.as_str())
            .from_config([
                ("linger.ms", "2"),
                ("batch.size", "16384"),
                ("retry.backoff.ms", "50"),
            ])
            .build()
            .await
            .unwrap();
        let acks = Acks::new(RECORDS);
        let send = |i: usize| {
            let acks = acks.clone();
            let record = ProducerRecord::new("restart", format!("r{i}")).key(format!("k{i}"));
            let p = &producer;
            async move {
                p.send_with(record, move |r| {
                    match r {
                        Ok(_) => {
                            acks.per_record[i].fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => acks.errors.lock().unwrap().push(format!("r{i}: {e}")),
                    }
                    acks.total.fetch_add(1, Ordering::SeqCst);
                    acks.changed.notify_waiters();
                })
                .await
            }
        };
        for i in 0..RECORDS / 2 {
            send(i).await.expect("send before the restart");
        }
        // Stop the broker while the first half is being acknowledged.
        acks.wait_for(RECORDS / 8).await;
        broker.stop();
        // The second half is sent while the broker is down and while it
        // starts again: `send` only buffers.
        for i in RECORDS / 2..RECORDS {
            send(i).await.expect("send while the broker is down");
        }
        let broker = start_broker(dir.path(), 2, port);
        producer.flush().await;
        let errors = acks.errors.lock().unwrap().clone();
        assert!(errors.is_empty(), "no error reaches the caller: {errors:?}");
        for (i, n) in acks.per_record.iter().enumerate() {
            assert_eq!(n.load(Ordering::SeqCst), 1, "record {i} acknowledged once");
        }
        let stats = producer.statistics();
        assert_eq!(stats.records_sent, RECORDS as u64);
        assert_eq!(stats.records_failed, 0);
        assert_eq!(stats.records_in_flight, 0);
        assert!(
            stats.retries > 0,
            "the restart was ridden out by retries: {stats:?}"
        );
        assert!(!stats.errors.is_empty(), "{stats:?}");
        producer.close().await;

        let got = read_back(&bootstrap, "restart", PARTITIONS).await;
        assert_eq!(got.len(), RECORDS, "nothing lost, nothing duplicated");
        let mut seen = vec![0u32; RECORDS];
        for r in &got {
            seen[id_of(r)] += 1;
        }
        let wrong: Vec<(usize, u32)> = seen
            .iter()
            .enumerate()
            .filter(|(_, n)| **n != 1)
            .map(|(i, n)| (i, *n))
            .take(10)
            .collect();
        assert!(
            wrong.is_empty(),
            "records stored other than once: {wrong:?}"
        );
        drop(broker);
    });
}

#[test]
fn records_acknowledged_to_delivery_callbacks_survive_a_broker_sigkill() {
    const PARTITIONS: u32 = 2;
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(dir.path(), 2, 0);
    let bootstrap = broker.listen.to_string();
    // Every acknowledgement, as the callback got it: (record id, partition,
    // offset).
    let (tx, rx) = std::sync::mpsc::channel::<(usize, u32, u64)>();
    let stop = Arc::new(AtomicBool::new(false));
    let producing = {
        let (bootstrap, stop) = (bootstrap.clone(), stop.clone());
        std::thread::spawn(move || {
            current_thread().block_on(async move {
                let admin = Client::connect(bootstrap.as_str()).await.unwrap();
                admin
                    .create_topic("durable", PARTITIONS, vec![])
                    .await
                    .unwrap();
                let producer = Producer::builder()
                    .bootstrap(bootstrap)
                    .from_config([
                        ("acks", "all"),
                        ("linger.ms", "1"),
                        ("batch.size", "4096"),
                        // Unacknowledged batches fail soon after the kill,
                        // so that `close` returns.
                        ("delivery.timeout.ms", "3000"),
                        ("retry.backoff.ms", "50"),
                    ])
                    .build()
                    .await
                    .unwrap();
                let mut i = 0usize;
                while !stop.load(Ordering::SeqCst) && i < 1_000_000 {
                    let tx = tx.clone();
                    let record =
                        ProducerRecord::new("durable", format!("r{i}")).partition(i as u32 % 2);
                    let sent = producer
                        .send_with(record, move |r| {
                            if let Ok(m) = r {
                                let _ = tx.send((i, m.partition, m.offset.unwrap()));
                            }
                        })
                        .await;
                    if sent.is_err() {
                        break;
                    }
                    i += 1;
                    if i % 64 == 0 {
                        // Let the test's thread see the flag between bursts.
                        tokio::task::yield_now().await;
                    }
                }
                producer.close().await;
            })
        })
    };
    let mut acked: HashMap<(u32, u64), usize> = HashMap::new();
    while acked.len() < 3_000 {
        let (i, p, o) = rx.recv().unwrap();
        acked.insert((p, o), i);
    }
    broker.kill();
    stop.store(true, Ordering::SeqCst);
    producing.join().unwrap();
    for (i, p, o) in rx.try_iter() {
        assert!(
            acked.insert((p, o), i).is_none(),
            "offset {p}@{o} acknowledged twice"
        );
    }
    let broker = start_broker(dir.path(), 2, 0);
    current_thread().block_on(async {
        let got = read_back(&broker.listen.to_string(), "durable", PARTITIONS).await;
        let stored: HashMap<(u32, u64), usize> = got
            .iter()
            .map(|r| ((r.partition, r.offset), id_of(r)))
            .collect();
        for (&(p, o), &i) in &acked {
            assert_eq!(
                stored.get(&(p, o)),
                Some(&i),
                "record r{i}, acknowledged at {p}@{o}, is there after the kill"
            );
        }
        for p in 0..PARTITIONS {
            let mut offsets: Vec<u64> = got
                .iter()
                .filter(|r| r.partition == p)
                .map(|r| r.offset)
                .collect();
            offsets.sort_unstable();
            for (k, o) in offsets.iter().enumerate() {
                assert_eq!(*o, k as u64, "partition {p}: offsets are contiguous");
            }
        }
    });
}
