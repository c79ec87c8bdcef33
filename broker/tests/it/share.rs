//! Share groups (KIP-932) with an unchanged client: confluent-kafka's
//! ShareConsumer (`broker/tests/kafka/share.py`) against a broker that
//! starts share groups at the log's start, with short record locks and
//! member sessions so that expiries happen within the test.

use crate::common::Broker;
use crate::kafka_clients::python_script;

/// The broker's share-group flags in these tests.
const FLAGS: [&str; 6] = [
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
