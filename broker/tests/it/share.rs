//! Share groups (KIP-932) with an unchanged client: confluent-kafka's
//! ShareConsumer (`broker/tests/kafka/share.py`) against a broker that
//! starts share groups at the log's start, with short record locks and
//! member sessions so that expiries happen within the test.

use crate::common::Broker;
use crate::kafka_clients::python_script;

/// The broker's share-group flags in these tests.
pub(crate) const FLAGS: [&str; 6] = [
    "--share-auto-offset-reset",
    "earliest",
    "--group-share-record-lock-duration-ms",
    "2000",
    "--group-share-session-timeout-ms",
    "3000",
];

/// Runs `share.py` in `mode` on a fresh broker; it must end with `done`.
fn share(mode: &str) {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &FLAGS);
    let kafka = b.kafka.to_string();
    let topic = format!("share-{mode}");
    let out = python_script("share.py", &[kafka.as_str(), &topic, mode]);
    assert!(out.contains("\ndone"), "{out}");
    b.stop();
}

/// 8 members, 2 partitions, 20 000 records: each delivered exactly once.
#[test]
fn eight_share_consumers_get_every_record_exactly_once() {
    share("all");
}

/// Released records come back (delivery count 2), rejected ones never.
#[test]
fn released_records_come_back_and_rejected_ones_never() {
    share("acks");
}

/// A record released every time is archived after 5 deliveries.
#[test]
fn a_poison_record_is_archived_at_the_delivery_limit() {
    share("poison");
}

/// A member SIGKILLed holding records: they go to another member once
/// their locks expire, none lost, none twice.
#[test]
fn records_held_by_a_killed_member_are_delivered_again_after_their_lock() {
    share("kill");
}

/// Acknowledgements are durable (`__share_group_state`): the broker
/// SIGKILLed and restarted, no accepted record comes back and every other
/// one is delivered exactly once.
#[test]
fn acknowledgements_survive_a_broker_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let accepted = dir.path().join("accepted.txt");
    let data = dir.path().join("data");
    let path = accepted.to_str().unwrap();
    let b = Broker::start_with(&data, 2, &FLAGS);
    let out = python_script(
        "share.py",
        &[&b.kafka.to_string(), "restart", "restart-1", path],
    );
    assert!(out.contains("\ndone"), "{out}");
    b.kill();
    let b = Broker::start_with(&data, 2, &FLAGS);
    let out = python_script(
        "share.py",
        &[&b.kafka.to_string(), "restart", "restart-2", path],
    );
    assert!(out.contains("\ndone"), "{out}");
    b.stop();
}

/// A Kafka connection to `group`'s coordinator (found by FindCoordinator
/// on the broker's Kafka listener).
pub(crate) fn coordinator_of(b: &Broker, group: &'static str) -> crate::common::KafkaConn {
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;
    let mut k = crate::common::KafkaConn::connect(b.kafka);
    let find = FindCoordinatorRequest::default()
        .with_key_type(0)
        .with_coordinator_keys(vec![StrBytes::from_static_str(group)]);
    k.send(ApiKey::FindCoordinator, 4, &find);
    let found: FindCoordinatorResponse = k.read(4);
    let port = found.coordinators[0].port as u16;
    crate::common::KafkaConn::connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
}

/// A share group is listed with its type (Kafka's ListGroups v5, types
/// filter `share`) while it has members, and not as a consumer group;
/// ShareGroupDescribe and DescribeShareGroupOffsets describe it.
#[test]
fn share_groups_are_listed_with_their_type() {
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &FLAGS);
    let mut admin = b.client();
    assert_eq!(admin.create_topic("listed", 1, &[]).error, 0);
    // The member joins at the group's coordinator (FindCoordinator).
    let mut k = crate::common::KafkaConn::connect(b.kafka);
    let mut at = coordinator_of(&b, "pool");
    let join = ShareGroupHeartbeatRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("pool")))
        .with_member_id(StrBytes::from_static_str("worker-1"))
        .with_member_epoch(0)
        .with_subscribed_topic_names(Some(vec![TopicName(StrBytes::from_static_str("listed"))]));
    at.send(ApiKey::ShareGroupHeartbeat, 1, &join);
    let joined: ShareGroupHeartbeatResponse = at.read(1);
    assert_eq!(joined.error_code, 0, "{joined:?}");
    assert!(joined.member_epoch > 0);
    let parts: Vec<i32> = joined
        .assignment
        .unwrap()
        .topic_partitions
        .into_iter()
        .flat_map(|t| t.partitions)
        .collect();
    assert_eq!(parts, [0]);
    let mut list = |types: &[&'static str]| -> Vec<(String, String)> {
        let req = ListGroupsRequest::default()
            .with_types_filter(types.iter().map(|t| StrBytes::from_static_str(t)).collect());
        k.send(ApiKey::ListGroups, 5, &req);
        let r: ListGroupsResponse = k.read(5);
        assert_eq!(r.error_code, 0);
        r.groups
            .into_iter()
            .map(|g| (g.group_id.to_string(), g.group_type.to_string()))
            .collect()
    };
    assert_eq!(
        list(&["share"]),
        [("pool".to_string(), "share".to_string())]
    );
    assert!(list(&["consumer"]).is_empty());
    // Its id is not a consumer group's.
    let consumer = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("pool")))
        .with_member_id(StrBytes::from_static_str("c-1"))
        .with_member_epoch(0)
        .with_rebalance_timeout_ms(30_000)
        .with_subscribed_topic_names(Some(vec![TopicName(StrBytes::from_static_str("listed"))]))
        .with_topic_partitions(Some(Vec::new()));
    at.send(ApiKey::ConsumerGroupHeartbeat, 1, &consumer);
    let refused: ConsumerGroupHeartbeatResponse = at.read(1);
    assert_eq!(
        refused.error_code,
        kafka_protocol::ResponseError::GroupIdNotFound.code(),
        "{refused:?}"
    );
    // Described (ShareGroupDescribe v1): the member and its partition.
    let describe = ShareGroupDescribeRequest::default()
        .with_group_ids(vec![GroupId(StrBytes::from_static_str("pool"))]);
    at.send(ApiKey::ShareGroupDescribe, 1, &describe);
    let d: ShareGroupDescribeResponse = at.read(1);
    let g = &d.groups[0];
    assert_eq!(
        (g.error_code, g.group_state.as_str()),
        (0, "Stable"),
        "{d:?}"
    );
    assert_eq!(g.members.len(), 1);
    assert_eq!(g.members[0].member_id.as_str(), "worker-1");
    assert_eq!(g.members[0].assignment.topic_partitions[0].partitions, [0]);
    // Nothing acknowledged yet: no start offset stored (-1).
    let offsets = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
        describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup::default()
            .with_group_id(GroupId(StrBytes::from_static_str("pool")))
            .with_topics(None),
    ]);
    at.send(ApiKey::DescribeShareGroupOffsets, 0, &offsets);
    let o: DescribeShareGroupOffsetsResponse = at.read(0);
    assert_eq!(o.groups[0].error_code, 0, "{o:?}");
    let t = &o.groups[0].topics[0];
    assert_eq!(t.topic_name.as_str(), "listed", "{o:?}");
    assert_eq!(
        (
            t.partitions[0].partition_index,
            t.partitions[0].start_offset
        ),
        (0, -1)
    );
    b.stop();
}
