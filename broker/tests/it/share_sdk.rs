//! Share groups through the Weir SDK (`weir_client::ShareConsumer`, the
//! native protocol): the scenarios `share.rs` runs with confluent-kafka's
//! ShareConsumer, records written by Kafka clients read by the SDK and
//! the reverse, and bad acknowledgements refused with nothing changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use weir_client::{
    AcknowledgeType, AcknowledgementMode, Client, ErrorCode, Producer, ProducerConfig,
    ProducerRecord, ShareConsumer, ShareConsumerConfig,
};
use weir_proto::messages::{
    ShareAckBatch, ShareAcknowledgeRequest, ShareFetchRequest, ShareGroupHeartbeatRequest,
    SharePartitionRequest,
};

use crate::common::{runtime, Broker};
use crate::kafka_clients::python_script;
use crate::share::FLAGS;

/// Writes values `from..to` (as text) round-robin over `partitions`.
async fn produce_over(
    addr: std::net::SocketAddr,
    topic: &str,
    from: u32,
    to: u32,
    partitions: u32,
) {
    let mut c = ProducerConfig::default();
    c.linger_ms = 2;
    let p = Producer::new(Client::connect(addr).await.unwrap(), c);
    let mut acks = Vec::new();
    for i in from..to {
        let r = ProducerRecord::new(topic, Bytes::from(i.to_string())).partition(i % partitions);
        acks.push(p.send(r).await.unwrap());
    }
    for a in acks {
        a.await.unwrap();
    }
    p.close().await;
}

/// [`produce_over`] 2 partitions.
async fn produce(addr: std::net::SocketAddr, topic: &str, from: u32, to: u32) {
    produce_over(addr, topic, from, to, 2).await
}

fn member(group: &str, explicit: bool) -> ShareConsumerConfig {
    let mut c = ShareConsumerConfig::new(group);
    c.max_wait = Duration::from_millis(200);
    if explicit {
        c.acknowledgement_mode = AcknowledgementMode::Explicit;
    }
    c
}

fn value(r: &weir_client::ShareRecord) -> u32 {
    std::str::from_utf8(r.record.value.as_ref().unwrap())
        .unwrap()
        .parse()
        .unwrap()
}

/// 8 SDK members on 2 partitions, 20 000 records — half written by
/// confluent-kafka's producer, half by the SDK: every record delivered
/// exactly once, to more than one member. Then records the SDK wrote
/// are read by confluent-kafka's ShareConsumer, each exactly once.
#[test]
fn eight_sdk_share_consumers_get_every_record_exactly_once_whoever_wrote_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &FLAGS);
    let kafka = b.kafka.to_string();
    let out = python_script("share.py", &[&kafka, "mixed", "produce", "10000"]);
    assert!(out.contains("\ndone"), "{out}");
    let addr = b.listen;
    runtime().block_on(async move {
        produce(addr, "mixed", 10_000, 20_000).await;
        let n = 20_000usize;
        let got: Arc<Mutex<Vec<(u32, usize)>>> = Arc::default();
        let mut tasks = Vec::new();
        for i in 0..8usize {
            let got = got.clone();
            tasks.push(tokio::spawn(async move {
                let client = Client::connect(addr).await.unwrap();
                let mut c = ShareConsumer::new(client, member("sdk-all", false));
                c.subscribe(&["mixed"]).unwrap();
                let deadline = Instant::now() + Duration::from_secs(60);
                while Instant::now() < deadline && got.lock().unwrap().len() < n {
                    for r in c.poll(Duration::from_millis(300)).await.unwrap() {
                        got.lock().unwrap().push((value(&r), i));
                    }
                }
                c.commit_sync().await.unwrap();
                c.close().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let got = got.lock().unwrap().clone();
        let distinct: BTreeSet<u32> = got.iter().map(|(v, _)| *v).collect();
        assert_eq!(got.len(), n, "deliveries");
        assert_eq!(distinct.len(), n, "each record exactly once");
        let members: BTreeSet<usize> = got.iter().map(|(_, m)| *m).collect();
        assert!(members.len() > 1, "{} members got records", members.len());
        Client::connect(addr)
            .await
            .unwrap()
            .create_topic("sdk-made", 2, vec![])
            .await
            .unwrap();
        produce(addr, "sdk-made", 0, 2_000).await;
    });
    // The broker timed the fetches' stages: acquisitions, and the stores
    // of the acceptances they carried (answered before them: the SDK's
    // polls ask so).
    let text = crate::common::scrape(b.metrics);
    let count = |stage: &str| {
        let prefix = format!("weir_share_fetch_stage_seconds_count{{stage=\"{stage}\",");
        crate::common::samples(&text, &prefix)
    };
    assert!(
        count("acquire") > 0.0 && count("store_later") > 0.0,
        "{text}"
    );
    let out = python_script("share.py", &[&kafka, "sdk-made", "read", "2000"]);
    assert!(out.contains("\ndone"), "{out}");
    b.stop();
}

/// Explicit acknowledgement: multiples of 7 released the first time come
/// back (delivery count 2) and are accepted; multiples of 11 rejected
/// never come back; a record released every time is delivered exactly 5
/// times (the delivery limit) and then archived.
#[test]
fn sdk_released_records_come_back_rejected_never_and_a_poison_one_is_archived() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &FLAGS);
    let addr = b.listen;
    runtime().block_on(async move {
        let admin = Client::connect(addr).await.unwrap();
        admin.create_topic("acks", 2, vec![]).await.unwrap();
        produce(addr, "acks", 0, 2_000).await;
        // value → delivery counts seen, and what was done.
        let seen: Arc<Mutex<BTreeMap<u32, Vec<u16>>>> = Arc::default();
        let accepted: Arc<Mutex<Vec<u32>>> = Arc::default();
        let rejected: Arc<Mutex<BTreeSet<u32>>> = Arc::default();
        let expected = (0..2_000u32).filter(|v| v % 7 == 0 || v % 11 != 0).count();
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let (seen, accepted, rejected) = (seen.clone(), accepted.clone(), rejected.clone());
            tasks.push(tokio::spawn(async move {
                let client = Client::connect(addr).await.unwrap();
                let mut c = ShareConsumer::new(client, member("sdk-acks", true));
                c.subscribe(&["acks"]).unwrap();
                let deadline = Instant::now() + Duration::from_secs(60);
                while Instant::now() < deadline && accepted.lock().unwrap().len() < expected {
                    for r in c.poll(Duration::from_millis(300)).await.unwrap() {
                        let v = value(&r);
                        seen.lock()
                            .unwrap()
                            .entry(v)
                            .or_default()
                            .push(r.delivery_count);
                        let kind = if v % 7 == 0 && r.delivery_count == 1 {
                            AcknowledgeType::Release
                        } else if v % 7 != 0 && v % 11 == 0 {
                            rejected.lock().unwrap().insert(v);
                            AcknowledgeType::Reject
                        } else {
                            accepted.lock().unwrap().push(v);
                            AcknowledgeType::Accept
                        };
                        c.acknowledge(&r, kind).unwrap();
                    }
                    c.commit_sync().await.unwrap();
                }
                // Nothing more comes to anyone.
                let late = c.poll(Duration::from_millis(500)).await.unwrap();
                assert!(
                    late.is_empty(),
                    "{} records after all were acknowledged",
                    late.len()
                );
                c.close().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let seen = seen.lock().unwrap().clone();
        let accepted = accepted.lock().unwrap().clone();
        let distinct: BTreeSet<u32> = accepted.iter().copied().collect();
        assert_eq!(accepted.len(), expected, "each accepted once");
        assert_eq!(distinct.len(), expected);
        for (v, counts) in seen.iter() {
            if v % 7 == 0 {
                assert_eq!(counts, &vec![1, 2], "released {v}: delivered again once");
            } else {
                assert_eq!(counts, &vec![1], "{v} delivered once");
            }
        }
        assert!(rejected.lock().unwrap().iter().all(|v| seen[v].len() == 1));

        // A poison record: released by every member every time.
        admin.create_topic("poison", 2, vec![]).await.unwrap();
        produce(addr, "poison", 0, 10).await;
        let mut c = ShareConsumer::new(
            Client::connect(addr).await.unwrap(),
            member("sdk-poison", true),
        );
        c.subscribe(&["poison"]).unwrap();
        let mut poison_counts = Vec::new();
        let mut others = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && (others.len() < 9 || poison_counts.len() < 5) {
            for r in c.poll(Duration::from_millis(300)).await.unwrap() {
                if value(&r) == 3 {
                    poison_counts.push(r.delivery_count);
                    c.acknowledge(&r, AcknowledgeType::Release).unwrap();
                } else {
                    others.push(value(&r));
                    c.acknowledge(&r, AcknowledgeType::Accept).unwrap();
                }
            }
            c.commit_sync().await.unwrap();
        }
        assert!(c.poll(Duration::from_millis(500)).await.unwrap().is_empty());
        assert_eq!(
            poison_counts,
            vec![1, 2, 3, 4, 5],
            "archived after 5 deliveries"
        );
        others.sort_unstable();
        assert_eq!(others, vec![0, 1, 2, 4, 5, 6, 7, 8, 9]);
        c.close().await.unwrap();
    });
    b.stop();
}

/// A member that vanishes holding records (dropped: no acknowledgement,
/// no goodbye): another member gets them once their locks expire, with
/// delivery count 2, and every record is accepted exactly once.
#[test]
fn records_held_by_a_vanished_sdk_member_come_back_after_their_lock() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &FLAGS);
    let addr = b.listen;
    runtime().block_on(async move {
        let admin = Client::connect(addr).await.unwrap();
        admin.create_topic("held", 2, vec![]).await.unwrap();
        produce(addr, "held", 0, 1_000).await;
        let mut holder = ShareConsumer::new(
            Client::connect(addr).await.unwrap(),
            member("sdk-held", true),
        );
        holder.subscribe(&["held"]).unwrap();
        let mut held = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while held.is_empty() && Instant::now() < deadline {
            held.extend(
                holder
                    .poll(Duration::from_millis(300))
                    .await
                    .unwrap()
                    .iter()
                    .map(value),
            );
        }
        assert!(!held.is_empty());
        drop(holder);

        let mut c = ShareConsumer::new(
            Client::connect(addr).await.unwrap(),
            member("sdk-held", false),
        );
        c.subscribe(&["held"]).unwrap();
        let mut got: Vec<(u32, u16)> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.len() < 1_000 && Instant::now() < deadline {
            got.extend(
                c.poll(Duration::from_millis(300))
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| (value(r), r.delivery_count)),
            );
        }
        c.commit_sync().await.unwrap();
        let values: BTreeSet<u32> = got.iter().map(|(v, _)| *v).collect();
        assert_eq!(got.len(), 1_000, "every record once");
        assert_eq!(values.len(), 1_000);
        for (v, count) in &got {
            let want = if held.contains(v) { 2 } else { 1 };
            assert_eq!(*count, want, "record {v}");
        }
        // Described as `weir group describe` does: one member reading
        // both partitions, every record acknowledged (each share
        // partition starts at its log's end), no lag.
        let d = admin.describe_group("sdk-held").await.unwrap();
        assert_eq!((d.kind.as_str(), d.members.len()), ("share", 1), "{d:?}");
        let starts: Vec<(u32, u64)> = d.offsets.iter().map(|o| (o.partition, o.offset)).collect();
        assert_eq!(starts, vec![(0, 500), (1, 500)], "{d:?}");
        let lag = admin.group_lag(&d, 0).await.unwrap();
        assert_eq!(lag.iter().map(|l| l.lag).sum::<u64>(), 0, "{lag:?}");
        c.close().await.unwrap();
    });
    b.stop();
}

/// Acknowledgements of offsets never acquired, of another member's
/// records, of records whose lock expired, or of an unknown type are
/// refused (InvalidRecordState / InvalidRequest) and change nothing;
/// hostile counts are bounded.
#[test]
fn bad_share_acknowledgements_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 1, &FLAGS);
    let addr = b.listen;
    runtime().block_on(async move {
        let client = Client::connect(addr).await.unwrap();
        client.create_topic("bad", 1, vec![]).await.unwrap();
        produce_over(addr, "bad", 0, 10, 1).await;
        for m in ["m1", "m2"] {
            let a = client
                .share_group_heartbeat(&ShareGroupHeartbeatRequest {
                    group: "g".into(),
                    member_id: m.into(),
                    member_epoch: 0,
                    topics: Some(vec!["bad".into()]),
                })
                .await
                .unwrap();
            assert_eq!(a.error, 0, "{:?}", a.message);
        }
        let part = |acks: Vec<ShareAckBatch>| SharePartitionRequest {
            topic: "bad".into(),
            partition: 0,
            acks,
        };
        let fetch = |member: &str, epoch: i32, acks: Vec<ShareAckBatch>| ShareFetchRequest {
            group: "g".into(),
            member_id: member.into(),
            session_epoch: epoch,
            max_wait_ms: 500,
            max_records: u32::MAX,
            acquire_mode: 0,
            max_bytes: u32::MAX,
            acks_later: false,
            partitions: vec![part(acks)],
            forgotten: vec![],
        };
        let ack = |first: u64, last: u64, t: u8| ShareAckBatch {
            first,
            last,
            types: vec![t],
        };
        // m1 acquires all 10 (a hostile max_records and max_bytes are
        // bounded, not refused).
        let (a, _) = client
            .share_fetch(&fetch("m1", 0, vec![]), Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(a.error, 0, "{:?}", a.message);
        let acquired: u64 = a.partitions[0]
            .acquired
            .iter()
            .map(|r| r.last - r.first + 1)
            .sum();
        assert_eq!(acquired, 10);
        let ack_req =
            |member: &str, epoch: i32, acks: Vec<ShareAckBatch>| ShareAcknowledgeRequest {
                group: "g".into(),
                member_id: member.into(),
                session_epoch: epoch,
                partitions: vec![part(acks)],
            };
        // Offsets never acquired: refused, nothing applied (the batch
        // also names m1's offset 9).
        let r = client
            .share_acknowledge(&ack_req("m1", 1, vec![ack(9, 20, 1)]))
            .await
            .unwrap();
        assert_eq!(
            r.partitions[0].ack_error,
            ErrorCode::InvalidRecordState.as_u16(),
            "{r:?}"
        );
        // An unknown acknowledge type.
        let r = client
            .share_acknowledge(&ack_req("m1", 2, vec![ack(0, 0, 9)]))
            .await
            .unwrap();
        assert_eq!(
            r.partitions[0].ack_error,
            ErrorCode::InvalidRequest.as_u16()
        );
        // m2 acknowledging m1's records.
        let (r, _) = client
            .share_fetch(&fetch("m2", 0, vec![ack(0, 4, 1)]), Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(
            r.partitions[0].ack_error,
            ErrorCode::InvalidRecordState.as_u16()
        );
        // An unknown acquire mode refuses the whole request before its
        // acknowledgements apply (and the session's epoch stays: m1's
        // next request, at epoch 3, is taken below).
        let mut bad_mode = fetch("m1", 3, vec![ack(0, 4, 1)]);
        bad_mode.acquire_mode = 7;
        let (r, _) = client.share_fetch(&bad_mode, Duration::ZERO).await.unwrap();
        assert_eq!(r.error, ErrorCode::InvalidRequest.as_u16(), "{r:?}");
        assert!(
            r.message
                .as_deref()
                .unwrap_or("")
                .contains("acquire mode 7"),
            "{r:?}"
        );
        // A wrong session epoch refuses the whole request.
        let r = client
            .share_acknowledge(&ack_req("m1", 77, vec![ack(0, 0, 1)]))
            .await
            .unwrap();
        assert_eq!(r.error, ErrorCode::InvalidShareSessionEpoch.as_u16());
        // Too many partitions named.
        let mut huge = fetch("m3", 0, vec![]);
        huge.partitions = (0..10_001)
            .map(|p| SharePartitionRequest {
                topic: "bad".into(),
                partition: p,
                acks: vec![],
            })
            .collect();
        let (r, _) = client.share_fetch(&huge, Duration::ZERO).await.unwrap();
        assert_eq!(r.error, ErrorCode::InvalidRequest.as_u16());
        // Nothing changed: m1 still holds all 10 and accepts 0..=4.
        let r = client
            .share_acknowledge(&ack_req("m1", 3, vec![ack(0, 4, 1)]))
            .await
            .unwrap();
        assert_eq!(r.partitions[0].ack_error, 0, "{r:?}");
        // m1's locks on 5..=9 expire (2 s): m2 acquires them, delivery
        // count 2 (awaited by fetching, not by sleeping).
        let mut epoch = 1;
        let deadline = Instant::now() + Duration::from_secs(15);
        let again = loop {
            let (r, _) = client
                .share_fetch(&fetch("m2", epoch, vec![]), Duration::ZERO)
                .await
                .unwrap();
            assert_eq!(r.error, 0, "{:?}", r.message);
            epoch += 1;
            if let Some(p) = r.partitions.iter().find(|p| !p.acquired.is_empty()) {
                break p.acquired.clone();
            }
            assert!(
                Instant::now() < deadline,
                "m1's expired records never came back"
            );
        };
        assert_eq!(again.len(), 1);
        assert_eq!(
            (again[0].first, again[0].last, again[0].delivery_count),
            (5, 9, 2)
        );
        // m1's late acknowledgement of them is refused.
        let r = client
            .share_acknowledge(&ack_req("m1", 4, vec![ack(5, 9, 1)]))
            .await
            .unwrap();
        assert_eq!(
            r.partitions[0].ack_error,
            ErrorCode::InvalidRecordState.as_u16()
        );
    });
    b.stop();
}

/// The share group's start offset of `topic`-0 (DescribeShareGroupOffsets
/// at the group's coordinator, over the Kafka listener); -1: none stored.
/// KIP-1206's `record_limit`: a fetch acquires at most `max_records`,
/// part of a batch, and the rest of that batch goes to the next fetch —
/// of the same member or another. Over the native protocol (raw, then
/// two SDK members polling in turn): no poll returns more than asked,
/// every record is delivered exactly once.
#[test]
fn record_limit_acquires_part_of_a_batch_and_leaves_the_rest_to_others() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 1, &FLAGS);
    let addr = b.listen;
    runtime().block_on(async move {
        let client = Client::connect(addr).await.unwrap();
        client.create_topic("strict", 1, vec![]).await.unwrap();
        // 100 records in one batch: sent under a long linger (not the
        // adaptive one, which sends a first record at once), then flushed.
        let mut pc = ProducerConfig::default();
        pc.linger_ms = 60_000;
        pc.linger_adaptive = false;
        let p = Producer::new(Client::connect(addr).await.unwrap(), pc);
        let mut acks = Vec::new();
        for i in 0..100u32 {
            acks.push(
                p.send(ProducerRecord::new("strict", Bytes::from(i.to_string())).partition(0))
                    .await
                    .unwrap(),
            );
        }
        p.flush().await;
        for a in acks {
            a.await.unwrap();
        }
        p.close().await;
        let hb = client
            .share_group_heartbeat(&ShareGroupHeartbeatRequest {
                group: "strict-g".into(),
                member_id: "raw".into(),
                member_epoch: 0,
                topics: Some(vec!["strict".into()]),
            })
            .await
            .unwrap();
        assert_eq!(hb.error, 0, "{:?}", hb.message);
        let req = ShareFetchRequest {
            group: "strict-g".into(),
            member_id: "raw".into(),
            session_epoch: 0,
            max_wait_ms: 500,
            max_records: 7,
            acquire_mode: 1,
            max_bytes: 1 << 20,
            acks_later: false,
            partitions: vec![SharePartitionRequest {
                topic: "strict".into(),
                partition: 0,
                acks: vec![],
            }],
            forgotten: vec![],
        };
        let (r, payload) = client.share_fetch(&req, Duration::ZERO).await.unwrap();
        assert_eq!(r.error, 0, "{:?}", r.message);
        let acquired: Vec<(u64, u64)> = r.partitions[0]
            .acquired
            .iter()
            .map(|a| (a.first, a.last))
            .collect();
        assert_eq!(acquired, [(0, 6)], "{r:?}");
        // The batch is sent whole: it holds the 100 records.
        let h = weir_proto::batch::BatchHeader::peek(&payload).unwrap();
        assert_eq!((h.base_offset, h.last_offset()), (0, 99));
        // Accepted at once: the short lock of these tests never expires
        // them into the members' polls below.
        let r = client
            .share_acknowledge(&ShareAcknowledgeRequest {
                group: "strict-g".into(),
                member_id: "raw".into(),
                session_epoch: 1,
                partitions: vec![SharePartitionRequest {
                    topic: "strict".into(),
                    partition: 0,
                    acks: vec![ShareAckBatch {
                        first: 0,
                        last: 6,
                        types: vec![1],
                    }],
                }],
            })
            .await
            .unwrap();
        assert_eq!(r.partitions[0].ack_error, 0, "{r:?}");
        // Its rest goes to two SDK members, at most 7 per poll.
        // Set by Kafka's names (the builder), the way a Kafka
        // ShareConsumer's properties would be.
        let mut members = Vec::new();
        for _ in 0..2 {
            let m = ShareConsumer::builder()
                .bootstrap(addr.to_string())
                .topics(["strict"])
                .from_config([
                    ("group.id", "strict-g"),
                    ("share.acquire.mode", "record_limit"),
                    ("max.poll.records", "7"),
                    ("fetch.max.wait.ms", "200"),
                ])
                .build()
                .await
                .unwrap();
            members.push(m);
        }
        // A bad value fails the build, before any connection.
        let e = match ShareConsumer::builder()
            .bootstrap(addr.to_string())
            .from_config([("group.id", "g"), ("share.acquire.mode", "strict")])
            .build()
            .await
        {
            Ok(_) => panic!("an unknown acquire mode was taken"),
            Err(e) => e,
        };
        assert!(e.to_string().contains("share.acquire.mode"), "{e}");
        let mut got: BTreeMap<u32, usize> = BTreeMap::new();
        let mut by_member = [0usize; 2];
        let deadline = Instant::now() + Duration::from_secs(60);
        while got.len() < 93 {
            assert!(Instant::now() < deadline, "{} of 93 delivered", got.len());
            for (i, m) in members.iter_mut().enumerate() {
                let records = m.poll(Duration::from_millis(200)).await.unwrap();
                assert!(records.len() <= 7, "a poll of {} records", records.len());
                by_member[i] += records.len();
                for r in &records {
                    assert!(
                        got.insert(value(r), i).is_none(),
                        "{} delivered twice",
                        value(r)
                    );
                }
            }
        }
        assert_eq!(
            got.keys().copied().collect::<Vec<_>>(),
            (7..100).collect::<Vec<_>>()
        );
        assert!(by_member.iter().all(|n| *n > 0), "{by_member:?}");
        for mut m in members {
            m.commit_sync().await.unwrap();
            m.close().await.unwrap();
        }
    });
    b.stop();
}

/// Kafka's AlterShareGroupOffsets and DeleteShareGroupOffsets: refused
/// while the share group has members (NON_EMPTY_GROUP), for a consumer
/// group (GROUP_ID_NOT_FOUND), out of the log (OFFSET_OUT_OF_RANGE) or
/// for an unknown topic; once its members are gone, the start moves back
/// (records past it are delivered again, those below never) and deleting
/// the state starts the group over (`--share-auto-offset-reset
/// earliest`); DeleteGroups deletes an empty share group's state.
#[test]
fn an_empty_share_groups_start_is_moved_and_its_state_deleted() {
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::ResponseError as E;
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &FLAGS);
    let addr = b.listen;
    let mut k = crate::common::KafkaConn::connect(b.kafka);
    let alter = |k: &mut crate::common::KafkaConn, group: &'static str, start: i64| {
        let r = k.alter_share_start(group, ("again", 0), start);
        if r.error_code != 0 {
            return r.error_code;
        }
        r.responses[0].partitions[0].error_code
    };
    let delete = |k: &mut crate::common::KafkaConn, topic: &'static str| {
        let req = DeleteShareGroupOffsetsRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("redo")))
            .with_topics(vec![
                delete_share_group_offsets_request::DeleteShareGroupOffsetsRequestTopic::default()
                    .with_topic_name(TopicName(StrBytes::from_static_str(topic))),
            ]);
        k.send(ApiKey::DeleteShareGroupOffsets, 0, &req);
        let r: DeleteShareGroupOffsetsResponse = k.read(0);
        assert_eq!(r.error_code, 0, "{r:?}");
        r.responses[0].error_code
    };
    let start = |k: &mut crate::common::KafkaConn| {
        let req = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
            describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup::default()
                .with_group_id(GroupId(StrBytes::from_static_str("redo")))
                .with_topics(Some(vec![
                    describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestTopic::default()
                        .with_topic_name(TopicName(StrBytes::from_static_str("again")))
                        .with_partitions(vec![0]),
                ])),
        ]);
        k.send(ApiKey::DescribeShareGroupOffsets, 0, &req);
        let r: DescribeShareGroupOffsetsResponse = k.read(0);
        r.groups[0].topics[0].partitions[0].start_offset
    };
    // Reads all it can get (accepted), until `n` or 15 s.
    let read = |n: usize| async move {
        let mut c = ShareConsumer::new(Client::connect(addr).await.unwrap(), member("redo", false));
        c.subscribe(&["again"]).unwrap();
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(15);
        while got.len() < n && Instant::now() < deadline {
            got.extend(
                c.poll(Duration::from_millis(200))
                    .await
                    .unwrap()
                    .iter()
                    .map(value),
            );
        }
        (c, got)
    };
    let rt = runtime();
    rt.block_on(async {
        let client = Client::connect(addr).await.unwrap();
        client.create_topic("again", 1, vec![]).await.unwrap();
        produce_over(addr, "again", 0, 10, 1).await;
    });
    let (mut c, got) = rt.block_on(read(10));
    assert_eq!(got, (0..10).collect::<Vec<_>>());
    // A member holds the group: nothing moves.
    assert_eq!(alter(&mut k, "redo", 0), E::NonEmptyGroup.code());
    rt.block_on(async {
        c.commit_sync().await.unwrap();
        c.close().await.unwrap();
    });
    assert_eq!(start(&mut k), 10);
    // Out of the log, or a consumer group's id: refused.
    assert_eq!(alter(&mut k, "redo", 11), E::OffsetOutOfRange.code());
    rt.block_on(async {
        let client = Client::connect(addr).await.unwrap();
        client
            .commit_offsets(
                "plain",
                "",
                -1,
                vec![weir_proto::messages::CommitOffset {
                    topic: "again".into(),
                    partition: 0,
                    offset: 1,
                    metadata: None,
                }],
            )
            .await
            .unwrap();
    });
    assert_eq!(alter(&mut k, "plain", 0), E::GroupIdNotFound.code());
    assert_eq!(start(&mut k), 10, "refusals change nothing");
    // Back to 3: 3..=9 are delivered again (first deliveries of the new
    // state), 0..=2 never.
    assert_eq!(alter(&mut k, "redo", 3), 0);
    assert_eq!(start(&mut k), 3);
    let (mut c, got) = rt.block_on(read(7));
    assert_eq!(got, (3..10).collect::<Vec<_>>());
    rt.block_on(async {
        c.commit_sync().await.unwrap();
        c.close().await.unwrap();
    });
    assert_eq!(start(&mut k), 10);
    // Deleted: the group starts over at the log's start.
    assert_eq!(delete(&mut k, "nowhere"), E::UnknownTopicOrPartition.code());
    assert_eq!(delete(&mut k, "again"), 0);
    assert_eq!(start(&mut k), -1);
    let (mut c, got) = rt.block_on(read(10));
    assert_eq!(got, (0..10).collect::<Vec<_>>());
    // DeleteGroups of the share group: refused while it has a member,
    // then its state is gone; a second delete finds nothing.
    let delete_group = |k: &mut crate::common::KafkaConn| {
        let req = DeleteGroupsRequest::default()
            .with_groups_names(vec![GroupId(StrBytes::from_static_str("redo"))]);
        k.send(ApiKey::DeleteGroups, 2, &req);
        let r: DeleteGroupsResponse = k.read(2);
        r.results[0].error_code
    };
    assert_eq!(delete_group(&mut k), E::NonEmptyGroup.code());
    // `weir group reset --share` refuses too while the member is there.
    let weir = |args: &[&str]| crate::common::weir(&b, args, b"");
    let reset = [
        "group",
        "reset",
        "redo",
        "--topic",
        "again",
        "--share",
        "--to-offset",
        "6",
    ];
    let out = weir(&reset);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("active members"));
    rt.block_on(async {
        c.commit_sync().await.unwrap();
        c.close().await.unwrap();
    });
    assert_eq!(start(&mut k), 10);
    // A dry run shows the plan and changes nothing; --execute moves it.
    let out = weir(&reset);
    let plan = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Vec<&str>> = plan
        .lines()
        .filter(|l| l.trim_start().starts_with("again"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows, [["again", "0", "10", "6"]], "{plan}");
    assert_eq!(start(&mut k), 10, "a dry run changes nothing");
    let mut exec = reset.to_vec();
    exec.push("--execute");
    let out = weir(&exec);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(start(&mut k), 6);
    // A consumer group is not reset as a share group.
    let out = weir(&[
        "group",
        "reset",
        "plain",
        "--topic",
        "again",
        "--share",
        "--to-earliest",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a share group"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(delete_group(&mut k), 0);
    assert_eq!(start(&mut k), -1);
    assert_eq!(delete_group(&mut k), E::GroupIdNotFound.code());
    // Each group not known as a consumer group is looked for on every
    // partition: a request looks for 16 at most.
    let names: Vec<GroupId> = (0..17)
        .map(|i| GroupId(StrBytes::from_string(format!("nobody-{i}"))))
        .collect();
    k.send(
        ApiKey::DeleteGroups,
        2,
        &DeleteGroupsRequest::default().with_groups_names(names),
    );
    let r: DeleteGroupsResponse = k.read(2);
    let codes: Vec<i16> = r.results.iter().map(|g| g.error_code).collect();
    let mut want = vec![E::GroupIdNotFound.code(); 16];
    want.push(E::InvalidRequest.code());
    assert_eq!(codes, want);
    b.stop();
}

fn share_start_offset(b: &Broker, group: &'static str, topic: &str) -> i64 {
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;
    let mut at = crate::share::coordinator_of(b, group);
    let offsets = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
        describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup::default()
            .with_group_id(GroupId(StrBytes::from_static_str(group)))
            .with_topics(None),
    ]);
    at.send(ApiKey::DescribeShareGroupOffsets, 0, &offsets);
    let o: DescribeShareGroupOffsetsResponse = at.read(0);
    assert_eq!(o.groups[0].error_code, 0, "{o:?}");
    let t = o.groups[0]
        .topics
        .iter()
        .find(|t| t.topic_name.as_str() == topic)
        .unwrap_or_else(|| panic!("no {topic} in {o:?}"));
    t.partitions[0].start_offset
}

/// Offsets compaction removed from inside a batch are acquired with the
/// batch's records: the SDK acknowledges them as gaps, so once every
/// record left is consumed the group's start offset is the log's end.
#[test]
fn offsets_compacted_away_are_acknowledged_as_gaps() {
    use weir_client::{Consumer, ConsumerConfig};
    let dir = tempfile::tempdir().unwrap();
    // Only `weir topic compact` cleans here.
    let mut flags = FLAGS.to_vec();
    flags.extend(["--log-cleaner-backoff-ms", "3600000"]);
    let b = Broker::start_with(dir.path(), 2, &flags);
    let mut admin = b.client();
    let configs = [("cleanup.policy", "compact"), ("segment.bytes", "4096")];
    assert_eq!(admin.create_topic("cs", 1, &configs).error, 0);
    let addr = b.listen;
    const N: u64 = 2_000;
    runtime().block_on(async {
        // 2 000 records of 40 keys in batches of ~30 records, 4 KiB
        // segments (the active one is not compacted).
        let mut c = ProducerConfig::default();
        c.linger_ms = 20;
        c.batch_size = 1024;
        let p = Producer::new(Client::connect(addr).await.unwrap(), c);
        let mut acks = Vec::new();
        for i in 0..N {
            let r = ProducerRecord::new("cs", Bytes::from(i.to_string()))
                .key(format!("k{}", i % 40))
                .partition(0);
            acks.push(p.send(r).await.unwrap());
        }
        for a in acks {
            a.await.unwrap();
        }
        p.close().await;
    });
    let out = crate::common::weir_at(addr, &["topic", "compact", "cs"], b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    runtime().block_on(async {
        // What is left, read by a plain consumer.
        let mut plain = Consumer::new(
            Client::connect(addr).await.unwrap(),
            ConsumerConfig::default(),
        );
        plain.assign(vec![("cs".to_string(), 0)]);
        plain.seek("cs", 0, 0).unwrap();
        let mut left = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = plain.poll(Duration::from_millis(300)).await.unwrap();
            if got.is_empty() && !left.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline);
            left.extend(got.iter().map(|r| r.offset));
        }
        assert!(
            (left.len() as u64) < N / 2 && left.contains(&(N - 1)),
            "compaction left {} records",
            left.len()
        );
        let mut c = ShareConsumer::new(
            Client::connect(addr).await.unwrap(),
            member("cs-gaps", false),
        );
        c.subscribe(&["cs"]).unwrap();
        let mut got = BTreeSet::new();
        while got.len() < left.len() {
            assert!(
                Instant::now() < deadline,
                "got {} of {}",
                got.len(),
                left.len()
            );
            for r in c.poll(Duration::from_millis(300)).await.unwrap() {
                assert!(
                    got.insert(r.record.offset),
                    "offset {} twice",
                    r.record.offset
                );
            }
        }
        c.commit_sync().await.unwrap();
        assert_eq!(got, left);
        assert_eq!(share_start_offset(&b, "cs-gaps", "cs"), N as i64);
        c.close().await.unwrap();
    });
    b.stop();
}

/// Transaction markers sit between a share partition's records: the
/// broker archives them (never delivered), so once every record is
/// consumed the group's start offset is the log's end, not the first
/// marker's offset.
#[test]
fn transaction_markers_do_not_hold_back_a_share_groups_start_offset() {
    use weir_client::transactional::TransactionalProducer;
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &FLAGS);
    let mut admin = b.client();
    assert_eq!(admin.create_topic("txed", 1, &[]).error, 0);
    let addr = b.listen;
    runtime().block_on(async {
        let p = TransactionalProducer::connect(
            addr,
            weir_client::ClientConfig::default(),
            ProducerConfig::default(),
            "txed-app",
        )
        .await
        .unwrap();
        p.init_transactions().await.unwrap();
        // Three transactions of 10: records at 0–9, 11–20, 22–31, their
        // commit markers at 10, 21 and 32.
        for t in 0..3u32 {
            p.begin_transaction().unwrap();
            let mut acks = Vec::new();
            for i in 0..10u32 {
                let r =
                    ProducerRecord::new("txed", Bytes::from((t * 10 + i).to_string())).partition(0);
                acks.push(p.send(r).await.unwrap());
            }
            for a in acks {
                a.await.unwrap();
            }
            p.commit_transaction().await.unwrap();
        }
        p.close().await;
        let mut c = ShareConsumer::new(Client::connect(addr).await.unwrap(), member("gaps", false));
        c.subscribe(&["txed"]).unwrap();
        let mut got = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.len() < 30 {
            assert!(Instant::now() < deadline, "got {got:?}");
            for r in c.poll(Duration::from_millis(300)).await.unwrap() {
                assert!(got.insert(value(&r)), "{} twice", value(&r));
            }
        }
        c.commit_sync().await.unwrap();
        assert_eq!(got, (0..30).collect::<BTreeSet<u32>>());
        // While the member is in the group (its subscription names the
        // topic).
        assert_eq!(share_start_offset(&b, "gaps", "txed"), 33);
        c.close().await.unwrap();
    });
    b.stop();
}

/// The broker's share-store test hook, as a test holds it: while shut,
/// every store of a share partition's state waits.
struct StoreGate {
    file: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl StoreGate {
    /// Holds every share-state store from now on.
    fn shut(&self) {
        std::fs::write(&self.file, b"").unwrap();
    }

    /// Asserts `task` (answered only once the stores held are done) is
    /// still waiting a moment after the gate shut, opens it, and returns
    /// what the task gives then.
    async fn hold_then_open<T>(&self, task: tokio::task::JoinHandle<T>, what: &str) -> T {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !task.is_finished(),
            "{what} answered before the store was done"
        );
        std::fs::remove_file(&self.file).unwrap();
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .unwrap_or_else(|_| panic!("{what} answered once the store is done"))
            .unwrap()
    }
}

/// A one-core broker over `dir` with the share-store test hook (open).
fn start_gated(dir: &std::path::Path) -> (Broker, StoreGate) {
    let hooks = tempfile::tempdir().unwrap();
    let file = hooks.path().join("share-store-gate");
    let b = Broker::start_with_env(
        dir,
        1,
        &FLAGS,
        &[(weir_broker::share::STORE_GATE_ENV, file.as_path())],
    );
    (b, StoreGate { file, _dir: hooks })
}

/// A fetch that asks for its acknowledgements to be answered later
/// (native ShareFetch v2's `acks_later`, what the SDK's polls send) gets
/// its records while the share state's store is held back (the broker's
/// share-store test hook); the session's next ShareAcknowledge — empty,
/// as `commit_sync` sends when a poll carried everything — is answered
/// only once that store is done; and then the acknowledgements survive
/// the broker's SIGKILL: a new member is handed exactly the records not
/// acknowledged.
#[test]
fn acknowledgements_answered_later_are_stored_before_the_sessions_next_acknowledgement() {
    let dir = tempfile::tempdir().unwrap();
    let (b, gate) = start_gated(dir.path());
    let addr = b.listen;
    let rt = runtime();
    rt.block_on(async {
        let client = Arc::new(Client::connect(addr).await.unwrap());
        client.create_topic("later", 1, vec![]).await.unwrap();
        produce_over(addr, "later", 0, 20, 1).await;
        let hb = client
            .share_group_heartbeat(&ShareGroupHeartbeatRequest {
                group: "later-g".into(),
                member_id: "m1".into(),
                member_epoch: 0,
                topics: Some(vec!["later".into()]),
            })
            .await
            .unwrap();
        assert_eq!(hb.error, 0, "{:?}", hb.message);
        let fetch = |epoch: i32, acks: Vec<ShareAckBatch>| ShareFetchRequest {
            group: "later-g".into(),
            member_id: "m1".into(),
            session_epoch: epoch,
            max_wait_ms: 500,
            max_records: 10,
            acquire_mode: 1,
            max_bytes: 1 << 20,
            acks_later: true,
            partitions: vec![SharePartitionRequest {
                topic: "later".into(),
                partition: 0,
                acks,
            }],
            forgotten: vec![],
        };
        let ranges = |r: &weir_proto::messages::ShareFetchResponse| -> Vec<(u64, u64)> {
            r.partitions
                .iter()
                .flat_map(|p| p.acquired.iter().map(|a| (a.first, a.last)))
                .collect()
        };
        let (r, _) = client
            .share_fetch(&fetch(0, vec![]), Duration::ZERO)
            .await
            .unwrap();
        assert_eq!((r.error, ranges(&r)), (0, vec![(0, 9)]), "{r:?}");
        // Stores held back: the fetch that accepts 0..=9 is answered with
        // the next ten all the same.
        gate.shut();
        let accept = vec![ShareAckBatch {
            first: 0,
            last: 9,
            types: vec![1],
        }];
        let (r, _) = tokio::time::timeout(
            Duration::from_secs(20),
            client.share_fetch(&fetch(1, accept), Duration::ZERO),
        )
        .await
        .expect("a fetch with acks_later is answered while its store waits")
        .unwrap();
        assert_eq!((r.error, ranges(&r)), (0, vec![(10, 19)]), "{r:?}");
        assert_eq!(r.partitions[0].ack_error, 0, "{r:?}");
        // The session's acknowledgement waits for the store.
        let acking = {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .share_acknowledge(&ShareAcknowledgeRequest {
                        group: "later-g".into(),
                        member_id: "m1".into(),
                        session_epoch: 2,
                        partitions: vec![],
                    })
                    .await
            })
        };
        let r = gate
            .hold_then_open(acking, "the session's acknowledgement")
            .await
            .unwrap();
        assert_eq!(r.error, 0, "{r:?}");
        assert!(r.partitions.iter().all(|p| p.ack_error == 0), "{r:?}");
    });
    b.kill();
    let b = Broker::start_with(dir.path(), 1, &FLAGS);
    let addr = b.listen;
    let got = rt.block_on(async {
        let mut m2 = ShareConsumer::new(
            Client::connect(addr).await.unwrap(),
            member("later-g", false),
        );
        m2.subscribe(&["later"]).unwrap();
        let mut got = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.len() < 10 && Instant::now() < deadline {
            for r in m2.poll(Duration::from_millis(500)).await.unwrap() {
                assert!(got.insert(r.record.offset), "{} twice", r.record.offset);
            }
        }
        // Nothing more comes.
        m2.commit_sync().await.unwrap();
        for r in m2.poll(Duration::from_millis(500)).await.unwrap() {
            got.insert(r.record.offset);
        }
        m2.close().await.unwrap();
        got
    });
    assert_eq!(got, (10..20).collect::<BTreeSet<u64>>());
    b.stop();
}

/// The SDK's side of acknowledgements answered later: a poll carries the
/// last poll's acceptances and is answered while their store is held
/// back; `commit_sync` (with no acknowledgement of its own left) waits
/// for that store; after it, the broker's SIGKILL loses none of them.
#[test]
fn sdk_commit_sync_waits_for_the_acknowledgements_its_polls_carried() {
    let dir = tempfile::tempdir().unwrap();
    let (b, gate) = start_gated(dir.path());
    let addr = b.listen;
    let rt = runtime();
    rt.block_on(async {
        Client::connect(addr)
            .await
            .unwrap()
            .create_topic("later-sdk", 1, vec![])
            .await
            .unwrap();
        produce_over(addr, "later-sdk", 0, 20, 1).await;
        let mut c = ShareConsumer::new(
            Client::connect(addr).await.unwrap(),
            member("later-sdk-g", false),
        );
        c.subscribe(&["later-sdk"]).unwrap();
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        while got < 20 && Instant::now() < deadline {
            got += c.poll(Duration::from_millis(500)).await.unwrap().len();
        }
        assert_eq!(got, 20);
        // This poll's fetch accepts the 20; their store is held back and
        // the poll is answered all the same.
        gate.shut();
        let more =
            tokio::time::timeout(Duration::from_secs(20), c.poll(Duration::from_millis(200)))
                .await
                .expect("a poll is not held back by its acknowledgements' store")
                .unwrap();
        assert!(more.is_empty(), "{more:?}");
        let committing = tokio::spawn(async move {
            let r = c.commit_sync().await;
            (c, r)
        });
        let (c, r) = gate.hold_then_open(committing, "commit_sync").await;
        r.unwrap();
        // Dropped without a goodbye: nothing is left to store.
        drop(c);
    });
    b.kill();
    let b = Broker::start_with(dir.path(), 1, &FLAGS);
    let addr = b.listen;
    let again = rt.block_on(async {
        let mut c = ShareConsumer::new(
            Client::connect(addr).await.unwrap(),
            member("later-sdk-g", false),
        );
        c.subscribe(&["later-sdk"]).unwrap();
        // A record written after the restart: once it comes, anything
        // of the first 20 would have come before it.
        produce_over(addr, "later-sdk", 20, 21, 1).await;
        let mut again = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !again.contains(&20) && Instant::now() < deadline {
            for r in c.poll(Duration::from_millis(500)).await.unwrap() {
                again.push(r.record.offset);
            }
        }
        c.close().await.unwrap();
        again
    });
    assert_eq!(again, vec![20], "only the new record, none delivered again");
    b.stop();
}
