//! Kafka transactions with an unchanged client (confluent-kafka's
//! librdkafka, `broker/tests/kafka/transactions.py`): commits and aborts
//! seen right by read_committed and read_uncommitted consumers, a zombie
//! fenced by a new instance with the same transactional id, and a
//! consume-transform-produce loop whose offsets commit with its output.

use crate::common::{self, Broker};
use crate::kafka_clients::python_script;

#[test]
fn confluent_kafka_commits_aborts_and_a_new_instance_fences_the_zombie() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &["--group-initial-rebalance-delay-ms", "0"]);
    let out = python_script(
        "transactions.py",
        &["confluent-kafka", &b.kafka.to_string(), "tx"],
    );
    assert!(out.contains("\ndone"), "{out}");
    // The transactions' state and markers survive a restart: the log
    // holds what the coordinator decided.
    b.stop();
    let b = Broker::start_with(dir.path(), 2, &["--group-initial-rebalance-delay-ms", "0"]);
    let listed = common::kcat(
        b.kafka,
        &[
            "-C",
            "-t",
            "tx",
            "-e",
            "-X",
            "isolation.level=read_committed",
            "-f",
            "%s\n",
        ],
        b"",
    );
    let text = String::from_utf8_lossy(&listed.stdout);
    let values: Vec<&str> = text.lines().collect();
    assert_eq!(values.len(), 160, "{text}");
    assert!(
        values
            .iter()
            .all(|v| !v.starts_with('a') && !v.starts_with('z')),
        "{text}"
    );
    b.stop();
}

#[test]
fn confluent_kafka_consume_transform_produce_commits_output_and_offsets_together() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &["--group-initial-rebalance-delay-ms", "0"]);
    let out = python_script(
        "transactions.py",
        &["confluent-kafka", &b.kafka.to_string(), "ctp", "ctp"],
    );
    assert!(out.contains("\ndone"), "{out}");
    // The offsets committed in transactions survive a restart (replayed
    // with their markers).
    b.stop();
    let b = Broker::start_with(dir.path(), 2, &["--group-initial-rebalance-delay-ms", "0"]);
    let described = common::weir_at(b.listen, &["group", "describe", "ctp-ctp"], b"");
    let text = String::from_utf8_lossy(&described.stdout);
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("ctp-in")).collect();
    assert_eq!(rows.len(), 4, "{text}");
    assert!(
        rows.iter()
            .all(|r| r.split_whitespace().any(|w| w == "500")),
        "{text}"
    );
    b.stop();
}

#[test]
fn a_transaction_left_open_by_a_dead_producer_is_aborted_after_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let out = python_script(
        "transactions.py",
        &["confluent-kafka", &b.kafka.to_string(), "dead", "timeout"],
    );
    assert!(out.contains("\ndone"), "{out}");
    b.stop();
}

/// A transaction left hanging by a dead producer (a 10 minute timeout):
/// `weir txn list|describe|producers` and kafka-python's admin
/// (ListTransactions, DescribeTransactions, DescribeProducers) show it;
/// `weir txn abort` ends it at once and the last stable offsets move.
#[test]
fn an_operator_sees_and_aborts_a_hanging_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let out = python_script(
        "transactions.py",
        &[
            "confluent-kafka",
            &b.kafka.to_string(),
            "hung",
            "hang",
            env!("CARGO_BIN_EXE_weir"),
            &b.listen.to_string(),
        ],
    );
    assert!(out.contains("\ndone"), "{out}");
    b.stop();
}

/// kafka-python and aiokafka (`broker/tests/kafka/transactions_py.py`):
/// commit, abort, commit seen right by read_committed and
/// read_uncommitted consumers; a zombie's commit refused as fenced.
fn python_client_transactions(client: &str, topic: &str) {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let out = python_script("transactions_py.py", &[client, &b.kafka.to_string(), topic]);
    assert!(out.contains("\ndone"), "{out}");
    b.stop();
}

#[test]
fn kafka_python_commits_aborts_and_is_fenced_as_a_zombie() {
    python_client_transactions("kafka-python", "kp");
}

#[test]
fn aiokafka_commits_aborts_and_is_fenced_as_a_zombie() {
    python_client_transactions("aiokafka", "ak");
}

/// The acceptance's consume-transform-produce: 20 000 records in
/// transactions of up to 500 with `send_offsets_to_transaction`, the
/// worker process SIGKILLed three times inside a transaction and started
/// again with the same transactional id (its open transaction aborted by
/// the new instance): read_committed, every input record's output exactly
/// once, and the group's offsets at the input's ends.
#[test]
fn consume_transform_produce_survives_three_sigkills_of_the_worker_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let out = python_script(
        "transactions.py",
        &["confluent-kafka", &b.kafka.to_string(), "kill", "ctp-kill"],
    );
    assert!(out.contains("\ndone"), "{out}");
    b.stop();
}
