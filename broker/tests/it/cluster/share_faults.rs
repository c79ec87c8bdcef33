//! Share groups under a leader's SIGKILL (issue 33's acceptance, by hand
//! at the protocol level so each step is known): three nodes, a topic of
//! one partition with RF 3; a member acquires 100 records and accepts the
//! first 50; the partition's leader is SIGKILLed. The new leader loads the
//! share partition from `__share_group_state` (stored on whichever node
//! leads the key's partition of it: this node, another one, or the killed
//! one, whose replicas take over) and hands a new member exactly the 50
//! records that were acquired and not acknowledged, each delivered a
//! second time — none of the accepted ones again.

use std::time::{Duration, Instant};

use kafka_protocol::messages::share_acknowledge_request::{
    AcknowledgePartition, AcknowledgeTopic, AcknowledgementBatch,
};
use kafka_protocol::messages::share_fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::{leader_and_followers, serial, Cluster};
use crate::common::{self, wait_until, KafkaConn};

/// A connection to the core that leads `q`-0 (the broker its Metadata
/// names: Kafka clients send share requests there), asked of `node`; and
/// the topic's id.
fn partition_leader(node: std::net::SocketAddr) -> (KafkaConn, uuid::Uuid) {
    let mut conn = KafkaConn::connect(node);
    let req = MetadataRequest::default()
        .with_topics(Some(vec![metadata_request::MetadataRequestTopic::default(
        )
        .with_name(Some(TopicName(StrBytes::from_static_str("q"))))]));
    conn.send(ApiKey::Metadata, 12, &req);
    let meta: MetadataResponse = conn.read(12);
    let t = &meta.topics[0];
    let leader = t.partitions[0].leader_id;
    let b = meta
        .brokers
        .iter()
        .find(|b| b.node_id == leader)
        .unwrap_or_else(|| panic!("q-0's leader {leader:?} is not among {:?}", meta.brokers));
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], b.port as u16));
    (KafkaConn::connect(addr), t.topic_id)
}

/// The records member `member` acquires from `topic_id`-0 at `conn` with
/// a new share session: (first, last, delivery count) ranges.
fn acquire(conn: &mut KafkaConn, topic_id: uuid::Uuid, member: &str) -> Vec<(i64, i64, i16)> {
    acquire_in(conn, "workers", topic_id, member)
}

/// [`acquire`] for the share group `group`.
fn acquire_in(
    conn: &mut KafkaConn,
    group: &str,
    topic_id: uuid::Uuid,
    member: &str,
) -> Vec<(i64, i64, i16)> {
    let req = ShareFetchRequest::default()
        .with_group_id(Some(GroupId(StrBytes::from_string(group.into()))))
        .with_member_id(Some(StrBytes::from_string(member.into())))
        .with_share_session_epoch(0)
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_max_records(1_000)
        .with_batch_size(1_000)
        .with_topics(vec![FetchTopic::default()
            .with_topic_id(topic_id)
            .with_partitions(vec![FetchPartition::default()
                .with_partition_index(0)
                .with_partition_max_bytes(1 << 20)])]);
    conn.send(ApiKey::ShareFetch, 1, &req);
    let r: ShareFetchResponse = conn.read(1);
    assert_eq!(r.error_code, 0, "{r:?}");
    let p = &r.responses[0].partitions[0];
    assert_eq!(p.error_code, 0, "{p:?}");
    p.acquired_records
        .iter()
        .map(|a| (a.first_offset, a.last_offset, a.delivery_count))
        .collect()
}

#[test]
fn acknowledgements_survive_the_share_partition_leaders_sigkill() {
    let _serial = serial();
    let mut c = Cluster::three();
    c.replicated_topic("q", 1);
    let (leader, _) = leader_and_followers(&c.partition_rows("q")[0]);
    let (mut conn, topic_id) = partition_leader(c.nodes[&leader].kafka);
    // The group's share partition starts at the log's end (the default
    // `share.auto.offset.reset`): the records come after its first fetch.
    assert_eq!(acquire(&mut conn, topic_id, "first"), []);
    let values: Vec<String> = (0..100).map(|i| i.to_string()).collect();
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    let mut producer = KafkaConn::connect(c.nodes[&leader].kafka);
    assert_eq!(
        producer.produce("q", common::batch_of_values(&values, None), -1, None),
        0
    );
    assert_eq!(acquire(&mut conn, topic_id, "first"), [(0, 99, 1)]);
    let ack = ShareAcknowledgeRequest::default()
        .with_group_id(Some(GroupId(StrBytes::from_static_str("workers"))))
        .with_member_id(Some(StrBytes::from_static_str("first")))
        .with_share_session_epoch(1)
        .with_topics(vec![AcknowledgeTopic::default()
            .with_topic_id(topic_id)
            .with_partitions(vec![AcknowledgePartition::default()
                .with_partition_index(0)
                .with_acknowledgement_batches(vec![
                    AcknowledgementBatch::default()
                        .with_first_offset(0)
                        .with_last_offset(49)
                        .with_acknowledge_types(vec![1]),
                ])])]);
    conn.send(ApiKey::ShareAcknowledge, 1, &ack);
    let r: ShareAcknowledgeResponse = conn.read(1);
    assert_eq!(r.error_code, 0, "{r:?}");
    assert_eq!(r.responses[0].partitions[0].error_code, 0, "{r:?}");

    c.nodes.remove(&leader).unwrap().kill();
    let other = wait_until(
        Instant::now() + Duration::from_secs(30),
        "another node leads q-0",
        || {
            let row = c.partition_rows("q")[0].clone();
            match row[1].parse::<u64>() {
                Ok(l) if l != leader && l != 0 => Ok(l),
                _ => Err(format!("no failover: {row:?}")),
            }
        },
    );
    // The new leader loads the share partition (its store may still be
    // moving: a retriable partition error is asked again).
    let got = wait_until(
        Instant::now() + Duration::from_secs(30),
        "the new leader hands out the unacknowledged records",
        || {
            let req_ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let (mut conn, id) = partition_leader(c.nodes[&other].kafka);
                assert_eq!(id, topic_id);
                acquire(&mut conn, topic_id, "second")
            }));
            match req_ok {
                Ok(r) if !r.is_empty() => Ok(r),
                Ok(r) => Err(format!("nothing acquired yet: {r:?}")),
                Err(_) => Err("refused (retriable)".to_string()),
            }
        },
    );
    assert_eq!(
        got,
        [(50, 99, 2)],
        "exactly the acquired and unacknowledged records, a second delivery each"
    );
    c.start(leader);
    c.isr_full("q", 3, Duration::from_secs(30));
}

/// The same through the Weir SDK's `ShareConsumer` (native protocol): a
/// member accepts 50 of the 100 records it holds, the partition's leader
/// is SIGKILLed, and a new member (bootstrapped on a surviving node) is
/// handed exactly the other 50, each a second time.
#[test]
fn sdk_share_consumers_keep_acknowledgements_across_the_leaders_sigkill() {
    use weir_client::{
        AcknowledgeType, AcknowledgementMode, Client, Producer, ProducerConfig, ProducerRecord,
        ShareConsumer, ShareConsumerConfig,
    };
    let _serial = serial();
    let mut c = Cluster::three();
    c.replicated_topic("q", 1);
    let (leader, followers) = leader_and_followers(&c.partition_rows("q")[0]);
    let at_leader = c.nodes[&leader].listen;
    let at_follower = c.nodes[&followers[0]].listen;
    let config = || {
        let mut s = ShareConsumerConfig::new("sdk-workers");
        s.acknowledgement_mode = AcknowledgementMode::Explicit;
        s.max_wait = Duration::from_millis(200);
        s
    };
    let rt = common::runtime();
    let held = rt.block_on(async {
        let mut first = ShareConsumer::new(Client::connect(at_leader).await.unwrap(), config());
        first.subscribe(&["q"]).unwrap();
        // Its first fetch starts the share partition at the log's end.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while first.assignment().is_empty() {
            assert!(first
                .poll(Duration::from_millis(200))
                .await
                .unwrap()
                .is_empty());
            assert!(tokio::time::Instant::now() < deadline, "never assigned");
        }
        assert!(first
            .poll(Duration::from_millis(200))
            .await
            .unwrap()
            .is_empty());
        let p = Producer::new(
            Client::connect(at_leader).await.unwrap(),
            ProducerConfig::default(),
        );
        let mut acks = Vec::new();
        for i in 0..100u32 {
            acks.push(
                p.send(ProducerRecord::new("q", i.to_string()))
                    .await
                    .unwrap(),
            );
        }
        for a in acks {
            a.await.unwrap();
        }
        p.close().await;
        let mut held = Vec::new();
        while held.len() < 100 {
            held.extend(first.poll(Duration::from_millis(500)).await.unwrap());
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of 100 acquired",
                held.len()
            );
        }
        held.sort_by_key(|r| r.record.offset);
        for r in &held[..50] {
            first.acknowledge(r, AcknowledgeType::Accept).unwrap();
        }
        // Stored before answered.
        first.commit_sync().await.unwrap();
        // The member vanishes with the node (no goodbye).
        drop(first);
        held.iter().map(|r| r.record.offset).collect::<Vec<u64>>()
    });
    assert_eq!(held, (0..100).collect::<Vec<u64>>());

    c.nodes.remove(&leader).unwrap().kill();
    let got: Vec<(u64, u16)> = rt.block_on(async {
        let mut second = ShareConsumer::new(Client::connect(at_follower).await.unwrap(), config());
        second.subscribe(&["q"]).unwrap();
        let mut got = Vec::new();
        // Failover, the coordinator and the share state moving: a
        // retriable refusal is polled again.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while got.len() < 50 && tokio::time::Instant::now() < deadline {
            match second.poll(Duration::from_millis(500)).await {
                Ok(records) => {
                    for r in records {
                        second.acknowledge(&r, AcknowledgeType::Accept).unwrap();
                        got.push((r.record.offset, r.delivery_count));
                    }
                }
                Err(e) => {
                    assert!(e.is_retriable() || e.code().is_none(), "{e}")
                }
            }
        }
        // Nothing more: none of the accepted 50 comes back.
        let _ = second.commit_sync().await;
        if let Ok(late) = second.poll(Duration::from_millis(500)).await {
            got.extend(late.iter().map(|r| (r.record.offset, r.delivery_count)));
        }
        got.sort_unstable();
        got
    });
    assert_eq!(
        got,
        (50..100).map(|o| (o, 2)).collect::<Vec<_>>(),
        "exactly the acquired and unacknowledged records, a second delivery each"
    );
    drop(rt);
    c.start(leader);
    c.isr_full("q", 3, Duration::from_secs(30));
}

/// AlterShareGroupOffsets asked of a node that does not lead the
/// partition: the reset is done at the leader's owning core (node to
/// node), which then hands out records from the new start; a start past
/// the log is refused there with OFFSET_OUT_OF_RANGE.
#[test]
fn a_share_group_reset_asked_of_another_node_moves_the_leaders_share_partition() {
    let _serial = serial();
    let c = Cluster::three();
    c.replicated_topic("q", 1);
    let (leader, followers) = leader_and_followers(&c.partition_rows("q")[0]);
    let values: Vec<String> = (0..100).map(|i| i.to_string()).collect();
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    let mut producer = KafkaConn::connect(c.nodes[&leader].kafka);
    assert_eq!(
        producer.produce("q", common::batch_of_values(&values, None), -1, None),
        0
    );
    // A group coordinated by another node than the partition's leader:
    // Kafka clients ask the coordinator, which resets at the leader.
    let mut any = KafkaConn::connect(c.nodes[&followers[0]].kafka);
    let (group, port) = (0..64)
        .find_map(|i| {
            let g = format!("workers-{i}");
            let find = FindCoordinatorRequest::default()
                .with_key_type(0)
                .with_coordinator_keys(vec![StrBytes::from_string(g.clone())]);
            any.send(ApiKey::FindCoordinator, 4, &find);
            let found: FindCoordinatorResponse = any.read(4);
            let at = &found.coordinators[0];
            (at.error_code == 0 && at.node_id.0 as u64 != leader).then_some((g, at.port as u16))
        })
        .expect("a group coordinated away from the partition's leader");
    let mut elsewhere = KafkaConn::connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    let alter = |conn: &mut KafkaConn, start: i64| {
        let r = conn.alter_share_start(&group, ("q", 0), start);
        assert_eq!(r.error_code, 0, "{r:?}");
        r.responses[0].partitions[0].error_code
    };
    assert_eq!(
        alter(&mut elsewhere, 101),
        kafka_protocol::ResponseError::OffsetOutOfRange.code()
    );
    assert_eq!(alter(&mut elsewhere, 40), 0);
    // Without the reset the group would start at the log's end (100).
    let (mut conn, topic_id) = partition_leader(c.nodes[&leader].kafka);
    assert_eq!(acquire_in(&mut conn, &group, topic_id, "m"), [(40, 99, 1)]);
}
