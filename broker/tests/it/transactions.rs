//! Kafka transactions with an unchanged client (confluent-kafka's
//! librdkafka, `broker/tests/kafka/transactions.py`): commits and aborts
//! seen right by read_committed and read_uncommitted consumers, a zombie
//! fenced by a new instance with the same transactional id, and a
//! consume-transform-produce loop whose offsets commit with its output.

use crate::common::{self, Broker};
use crate::kafka_clients::python_script;

/// Runs `transactions.py` with confluent-kafka against `b`'s Kafka
/// listener (`args`: the topic, then the mode and its arguments), which
/// must end with `done`.
fn confluent(b: &Broker, args: &[&str]) {
    let kafka = b.kafka.to_string();
    let mut all = vec!["confluent-kafka", kafka.as_str()];
    all.extend_from_slice(args);
    let out = python_script("transactions.py", &all);
    assert!(out.contains("\ndone"), "{out}");
}

#[test]
fn confluent_kafka_commits_aborts_and_a_new_instance_fences_the_zombie() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &["--group-initial-rebalance-delay-ms", "0"]);
    confluent(&b, &["tx"]);
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
    // The Weir SDK's consumer reads the same: read_committed the 160
    // committed records (the aborted ones and the markers skipped),
    // read_uncommitted all 280 written.
    let committed = sdk_read(&b, "tx", 4, weir_client::IsolationLevel::ReadCommitted, 160);
    assert_eq!(committed.len(), 160, "{committed:?}");
    assert!(
        committed
            .iter()
            .all(|v| !v.starts_with('a') && !v.starts_with('z')),
        "{committed:?}"
    );
    let mut sorted = committed.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 160, "each committed record once");
    let all = sdk_read(
        &b,
        "tx",
        4,
        weir_client::IsolationLevel::ReadUncommitted,
        280,
    );
    assert_eq!(all.len(), 280, "{all:?}");
    // And `weir consume --read-committed`.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["consume", "tx", "--read-committed", "--max-records", "161"])
        .args(["--timeout-ms", "1000", "--bootstrap", &b.listen.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.lines().count(), 160, "{text}");
    assert!(text
        .lines()
        .all(|v| !v.starts_with('a') && !v.starts_with('z')));
    b.stop();
}

/// Every value of `topic`'s `partitions` as a Weir SDK consumer at
/// `isolation` reads them from the start, until `expect` arrived and every
/// partition's end was reached (or 30 s).
fn sdk_read(
    b: &Broker,
    topic: &str,
    partitions: u32,
    isolation: weir_client::IsolationLevel,
    expect: usize,
) -> Vec<String> {
    use weir_client::{Client, Consumer, ConsumerConfig};
    weir_testkit::runtime().block_on(async {
        let mut config = ConsumerConfig::default();
        config.isolation_level = isolation;
        let mut c = Consumer::new(Client::connect(b.listen).await.unwrap(), config);
        let all: Vec<(String, u32)> = (0..partitions).map(|p| (topic.to_string(), p)).collect();
        c.assign(all.clone());
        c.seek_to_beginning(&all).await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut got = Vec::new();
        while got.len() < expect && std::time::Instant::now() < deadline {
            for r in c.poll(std::time::Duration::from_millis(200)).await.unwrap() {
                got.push(String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned());
            }
        }
        // Nothing more after the expected count.
        for r in c.poll(std::time::Duration::from_millis(300)).await.unwrap() {
            got.push(String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned());
        }
        got
    })
}

#[test]
fn confluent_kafka_consume_transform_produce_commits_output_and_offsets_together() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start_with(dir.path(), 2, &["--group-initial-rebalance-delay-ms", "0"]);
    confluent(&b, &["ctp", "ctp"]);
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
    confluent(&b, &["dead", "timeout"]);
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
    confluent(
        &b,
        &[
            "hung",
            "hang",
            env!("CARGO_BIN_EXE_weir"),
            &b.listen.to_string(),
        ],
    );
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
    confluent(&b, &["kill", "ctp-kill"]);
    b.stop();
}

/// Bad transactional input on the Kafka listener: a transactional batch
/// to a partition not added to the producer's transaction, and a commit
/// marker sent as a producer's batch, are refused and nothing is
/// appended; hostile counts in DescribeTransactions and DescribeProducers
/// get INVALID_REQUEST per entry, nothing allocated on their word.
#[test]
fn transactional_bad_input_is_refused_and_nothing_is_appended() {
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::ResponseError;
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let mut admin = b.client();
    assert_eq!(admin.create_topic("bad", 1, &[]).error, 0);
    let mut k = common::KafkaConn::connect(b.kafka);
    // A transactional producer's id (its coordinator may be either core:
    // retried on NOT_COORDINATOR through the core that coordinates it).
    let init = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("bad-tx"))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let mut init_on = |port: std::net::SocketAddr| {
        let mut k = common::KafkaConn::connect(port);
        k.send(ApiKey::InitProducerId, 4, &init);
        k.read::<InitProducerIdResponse>(4)
    };
    let r = std::iter::once(b.kafka)
        .chain(
            b.kafka_core_ports
                .iter()
                .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], *p))),
        )
        .map(&mut init_on)
        .find(|r| r.error_code == 0)
        .expect("some core coordinates bad-tx");
    let (pid, epoch) = (r.producer_id.0, r.producer_epoch);

    let produce = |k: &mut common::KafkaConn, data: bytes::Bytes| -> i16 {
        k.produce("bad", data, -1, Some("bad-tx"))
    };
    // Transactional, but bad-0 was never added to the transaction.
    let tx = common::batch_of_values(&["t"], Some((pid, epoch, 0, true)));
    let code = produce(&mut k, tx);
    assert_ne!(
        code, 0,
        "a transactional write to a partition not in the transaction"
    );
    // A commit marker sent as a producer's batch.
    let marker = weir_storage::txn::marker_batch(
        pid,
        epoch,
        weir_storage::txn::Marker {
            kind: weir_storage::txn::MarkerKind::Commit,
            coordinator_epoch: 0,
        },
        1,
    );
    let code = produce(&mut k, marker.freeze());
    assert_ne!(code, 0, "a producer's control batch");
    let (ends, _) = admin.ok(
        &weir_proto::messages::ListOffsetsRequest {
            read_committed: false,
            partitions: vec![weir_proto::messages::ListOffsetsPartition {
                topic: "bad".into(),
                partition: 0,
                spec: weir_proto::messages::OffsetSpec::Latest,
            }],
        },
        &[],
    );
    assert_eq!(ends.partitions[0].offset, Some(0), "nothing appended");

    // Hostile counts.
    let ids: Vec<TransactionalId> = (0..10_001)
        .map(|i| TransactionalId(StrBytes::from_string(format!("id-{i}"))))
        .collect();
    k.send(
        ApiKey::DescribeTransactions,
        0,
        &DescribeTransactionsRequest::default().with_transactional_ids(ids),
    );
    let r: DescribeTransactionsResponse = k.read(0);
    assert_eq!(r.transaction_states.len(), 10_001);
    assert!(r
        .transaction_states
        .iter()
        .all(|s| s.error_code == ResponseError::InvalidRequest.code()));
    k.send(
        ApiKey::DescribeProducers,
        0,
        &DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
            .with_name(TopicName(StrBytes::from_static_str("bad")))
            .with_partition_indexes((0..10_001).collect())]),
    );
    let r: DescribeProducersResponse = k.read(0);
    let parts = &r.topics[0].partitions;
    assert_eq!(parts.len(), 10_001);
    assert!(parts
        .iter()
        .all(|p| p.error_code == ResponseError::InvalidRequest.code()));
    // The listener still serves: a partition's producers, none yet.
    k.send(
        ApiKey::DescribeProducers,
        0,
        &DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
            .with_name(TopicName(StrBytes::from_static_str("bad")))
            .with_partition_indexes(vec![0])]),
    );
    let r: DescribeProducersResponse = k.read(0);
    let p = &r.topics[0].partitions[0];
    assert_eq!(p.error_code, 0);
    assert!(p.active_producers.is_empty(), "{p:?}");
    b.stop();
}

/// The Weir SDK's transactional producer on the native protocol: a commit
/// with offsets, an abort (its offsets dropped), a zombie fenced by a new
/// instance (its commit fails `ProducerFenced`, its records never
/// visible); read_committed readers (the SDK and kcat through the Kafka
/// listener) see exactly the committed records, the group the committed
/// offsets.
#[test]
fn the_sdk_transactional_producer_commits_aborts_and_is_fenced() {
    use weir_client::transactional::TransactionalProducer;
    use weir_client::{Client, ClientConfig, ClientError, ProducerConfig, ProducerRecord};
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let mut admin = b.client();
    assert_eq!(admin.create_topic("sdk-tx", 4, &[]).error, 0);
    assert_eq!(admin.create_topic("sdk-in", 1, &[]).error, 0);
    let connect = || {
        TransactionalProducer::connect(
            b.listen,
            ClientConfig::default(),
            ProducerConfig::default(),
            "sdk-app",
        )
    };
    /// Sends `n` records and waits for them to be written.
    async fn send(p: &TransactionalProducer, prefix: &str, n: u32) {
        let mut acks = Vec::new();
        for i in 0..n {
            let r = ProducerRecord::new("sdk-tx", format!("{prefix}{i}")).partition(i % 4);
            acks.push(p.send(r).await.unwrap());
        }
        for a in acks {
            a.await.unwrap();
        }
    }
    let offsets = weir_testkit::runtime().block_on(async {
        // The input the offsets are of.
        let input = weir_client::Producer::new(
            Client::connect(b.listen).await.unwrap(),
            ProducerConfig::default(),
        );
        for i in 0..100 {
            let r = ProducerRecord::new("sdk-in", format!("in{i}")).partition(0);
            drop(input.send(r).await.unwrap());
        }
        input.close().await;
        let p = connect().await.unwrap();
        // Before init_transactions, and outside a transaction: refused.
        assert!(p.begin_transaction().is_err());
        p.init_transactions().await.unwrap();
        let (pid, epoch) = p.producer_identity().unwrap();
        assert!(pid >= 0 && epoch >= 0);
        assert!(p
            .send(ProducerRecord::new("sdk-tx", "outside"))
            .await
            .is_err());

        p.begin_transaction().unwrap();
        send(&p, "c", 100).await;
        p.send_offsets_to_transaction(&[("sdk-in".into(), 0, 42)], "sdk-group")
            .await
            .unwrap();
        p.commit_transaction().await.unwrap();

        p.begin_transaction().unwrap();
        send(&p, "a", 50).await;
        p.send_offsets_to_transaction(&[("sdk-in".into(), 0, 99)], "sdk-group")
            .await
            .unwrap();
        p.abort_transaction().await.unwrap();

        // A zombie: its transaction written, then a new instance with the
        // same id fences it (and aborts what it wrote).
        p.begin_transaction().unwrap();
        send(&p, "z", 10).await;
        // The new instance from Kafka's property names.
        let fresh = weir_client::Producer::builder()
            .bootstrap(b.listen.to_string())
            .from_config([
                ("transactional.id", "sdk-app"),
                ("transaction.timeout.ms", "30000"),
            ])
            .build_transactional()
            .await
            .unwrap();
        fresh.init_transactions().await.unwrap();
        assert!(fresh.producer_identity().unwrap().1 > epoch, "a new epoch");
        let e = p.commit_transaction().await.unwrap_err();
        assert!(matches!(e, ClientError::ProducerFenced(_)), "{e}");
        fresh.begin_transaction().unwrap();
        send(&fresh, "f", 10).await;
        fresh.commit_transaction().await.unwrap();
        fresh.close().await;
        p.close().await;

        let c = Client::connect(b.listen).await.unwrap();
        c.committed_offsets("sdk-group", None).await.unwrap()
    });
    assert_eq!(offsets.len(), 1, "{offsets:?}");
    assert_eq!(
        offsets[0].offset, 42,
        "the aborted transaction's offsets dropped"
    );

    let committed = sdk_read(
        &b,
        "sdk-tx",
        4,
        weir_client::IsolationLevel::ReadCommitted,
        110,
    );
    assert_eq!(committed.len(), 110, "{committed:?}");
    assert!(
        committed
            .iter()
            .all(|v| v.starts_with('c') || v.starts_with('f')),
        "{committed:?}"
    );
    let all = sdk_read(
        &b,
        "sdk-tx",
        4,
        weir_client::IsolationLevel::ReadUncommitted,
        170,
    );
    assert_eq!(all.len(), 170, "{all:?}");
    let listed = common::kcat(
        b.kafka,
        &[
            "-C",
            "-t",
            "sdk-tx",
            "-e",
            "-X",
            "isolation.level=read_committed",
            "-f",
            "%s\n",
        ],
        b"",
    );
    assert_eq!(String::from_utf8_lossy(&listed.stdout).lines().count(), 110);
    b.stop();
}

/// KIP-890's v2 protocol as a Java 4.x client speaks it once ApiVersions
/// finalizes `transaction.version` 2 (no such client in the suite: the
/// requests by hand): no AddPartitionsToTxn or AddOffsetsToTxn — Produce
/// v12 and TxnOffsetCommit v5 add their partitions —, EndTxn v5 answers
/// the bumped epoch the next transaction is written at (sequence from 0),
/// the old epoch is a zombie everywhere, and a late write of an aborted
/// transaction is refused.
#[test]
fn a_v2_client_adds_partitions_by_writing_and_each_end_bumps_the_epoch() {
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::ResponseError;
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let mut admin = b.client();
    assert_eq!(admin.create_topic("v2", 2, &[]).error, 0);
    assert_eq!(admin.create_topic("v2-in", 1, &[]).error, 0);
    let ports: Vec<std::net::SocketAddr> = std::iter::once(b.kafka)
        .chain(
            b.kafka_core_ports
                .iter()
                .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], *p))),
        )
        .collect();
    // The broker finalizes transaction.version 2.
    let mut k = common::KafkaConn::connect(b.kafka);
    k.send(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    let versions: ApiVersionsResponse = k.read(3);
    assert!(
        versions
            .finalized_features
            .iter()
            .any(|f| f.name.as_str() == "transaction.version" && f.max_version_level >= 2),
        "{versions:?}"
    );
    /// `req` (key `key`, version `v`) sent to each port in turn until one
    /// is the coordinator (`code` of the answer not NOT_COORDINATOR).
    fn at_coordinator<Q, R>(
        ports: &[std::net::SocketAddr],
        key: ApiKey,
        v: i16,
        req: &Q,
        code: impl Fn(&R) -> i16,
    ) -> R
    where
        Q: kafka_protocol::protocol::Encodable + kafka_protocol::protocol::HeaderVersion,
        R: kafka_protocol::protocol::Decodable + kafka_protocol::protocol::HeaderVersion,
    {
        let mut last = None;
        for port in ports {
            let mut k = common::KafkaConn::connect(*port);
            k.send(key, v, req);
            let r: R = k.read(v);
            if code(&r) != ResponseError::NotCoordinator.code() {
                return r;
            }
            last = Some(code(&r));
        }
        panic!("no port coordinates it: {last:?}")
    }
    let init = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("v2-tx"))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let r: InitProducerIdResponse = at_coordinator(
        &ports,
        ApiKey::InitProducerId,
        5,
        &init,
        |r: &InitProducerIdResponse| r.error_code,
    );
    assert_eq!(r.error_code, 0, "{r:?}");
    let (pid, e0) = (r.producer_id.0, r.producer_epoch);

    let batch = |epoch: i16, seq: i32, value: &str| {
        common::batch_of_values(&[value], Some((pid, epoch, seq, true)))
    };
    // Produce v12 of one batch to v2-`p` on the shared port: its code.
    let produce = |p: i32, data: bytes::Bytes| -> i16 {
        use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
        let req = ProduceRequest::default()
            .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("v2-tx"))))
            .with_acks(-1)
            .with_timeout_ms(5_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str("v2")))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(p)
                    .with_records(Some(data))])]);
        let mut k = common::KafkaConn::connect(b.kafka);
        k.send(ApiKey::Produce, 12, &req);
        let r: ProduceResponse = k.read(12);
        r.responses[0].partition_responses[0].error_code
    };
    let end = |epoch: i16, commit: bool| -> EndTxnResponse {
        let req = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_static_str("v2-tx")))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_committed(commit);
        at_coordinator(&ports, ApiKey::EndTxn, 5, &req, |r: &EndTxnResponse| {
            r.error_code
        })
    };

    // The input the offsets are of.
    let input: Vec<String> = (0..10).map(|i| format!("in{i}")).collect();
    let input: Vec<&str> = input.iter().map(String::as_str).collect();
    assert_eq!(
        k.produce("v2-in", common::batch_of_values(&input, None), -1, None),
        0
    );

    // Transaction 1: two partitions and the group's offsets, none added
    // by hand; committed.
    assert_eq!(produce(0, batch(e0, 0, "one-0")), 0, "an implicit add");
    assert_eq!(produce(1, batch(e0, 0, "one-1")), 0);
    let offsets = TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(StrBytes::from_static_str("v2-tx")))
        .with_group_id(GroupId(StrBytes::from_static_str("v2-group")))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(e0)
        .with_generation_id(-1)
        .with_member_id(StrBytes::from_static_str(""))
        .with_topics(vec![TxnOffsetCommitRequestTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("v2-in")))
            .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(7)])]);
    let r: TxnOffsetCommitResponse = at_coordinator(
        &ports,
        ApiKey::TxnOffsetCommit,
        5,
        &offsets,
        |r: &TxnOffsetCommitResponse| r.topics[0].partitions[0].error_code,
    );
    assert_eq!(r.topics[0].partitions[0].error_code, 0, "{r:?}");
    let r = end(e0, true);
    assert_eq!(r.error_code, 0, "{r:?}");
    let e1 = r.producer_epoch;
    assert_eq!(
        (r.producer_id.0, e1),
        (pid, e0 + 1),
        "the end bumps the epoch"
    );
    // A retry of that end (the client lost the answer) is answered the same.
    let r = end(e0, true);
    assert_eq!((r.error_code, r.producer_epoch), (0, e1), "{r:?}");

    // Transaction 2 at the new epoch (sequence from 0); aborted.
    assert_eq!(produce(0, batch(e1, 0, "two-0")), 0);
    let r = end(e1, false);
    assert_eq!(r.error_code, 0, "{r:?}");
    let e2 = r.producer_epoch;
    assert_eq!(e2, e1 + 1);

    // The zombie (the first epoch) and a late write of the aborted
    // transaction: refused, nothing appended; the zombie cannot end.
    let code = produce(1, batch(e0, 1, "zombie"));
    assert!(
        code == ResponseError::InvalidProducerEpoch.code()
            || code == ResponseError::ProducerFenced.code(),
        "the zombie's write: {code}"
    );
    let code = produce(0, batch(e1, 1, "late"));
    assert!(
        code == ResponseError::InvalidProducerEpoch.code()
            || code == ResponseError::ProducerFenced.code(),
        "the aborted transaction's late write: {code}"
    );
    let r = end(e0, true);
    assert_eq!(r.error_code, ResponseError::ProducerFenced.code(), "{r:?}");

    // Transaction 3 commits after all that.
    assert_eq!(produce(1, batch(e2, 0, "three-1")), 0);
    let r = end(e2, true);
    assert_eq!(r.error_code, 0);
    let e3 = r.producer_epoch;

    // Transaction 4 ends twice at once (a client that retried before its
    // first answer came): the second EndTxn arrives while the first's
    // markers are being written, and is answered the same once the
    // transaction has completed — or told to retry, never refused.
    assert_eq!(produce(0, batch(e3, 0, "four-0")), 0);
    assert_eq!(produce(1, batch(e3, 0, "four-1")), 0);
    let end4 = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(StrBytes::from_static_str("v2-tx")))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(e3)
        .with_committed(true);
    let coordinator = *ports
        .iter()
        .find(|p| {
            let mut k = common::KafkaConn::connect(**p);
            let req = DescribeTransactionsRequest::default()
                .with_transactional_ids(vec![TransactionalId(StrBytes::from_static_str("v2-tx"))]);
            k.send(ApiKey::DescribeTransactions, 0, &req);
            let r: DescribeTransactionsResponse = k.read(0);
            r.transaction_states[0].error_code == 0
        })
        .expect("a port coordinates v2-tx");
    let mut first = common::KafkaConn::connect(coordinator);
    let mut second = common::KafkaConn::connect(coordinator);
    first.send(ApiKey::EndTxn, 5, &end4);
    second.send(ApiKey::EndTxn, 5, &end4);
    let answers: Vec<EndTxnResponse> = vec![first.read(5), second.read(5)];
    for r in &answers {
        assert!(
            r.error_code == 0 || r.error_code == ResponseError::ConcurrentTransactions.code(),
            "a doubled EndTxn: {r:?}"
        );
    }
    assert!(answers.iter().any(|r| r.error_code == 0), "{answers:?}");
    let e4 = e3 + 1;
    for r in answers.iter().filter(|r| r.error_code == 0) {
        assert_eq!((r.producer_id.0, r.producer_epoch), (pid, e4), "{r:?}");
    }
    // Told to retry: the retry, once the transaction completed, is
    // answered as the end was.
    if answers.iter().any(|r| r.error_code != 0) {
        let r = end(e3, true);
        assert_eq!((r.error_code, r.producer_epoch), (0, e4), "{r:?}");
    }

    let mut committed = sdk_read(&b, "v2", 2, weir_client::IsolationLevel::ReadCommitted, 5);
    committed.sort();
    assert_eq!(committed, ["four-0", "four-1", "one-0", "one-1", "three-1"]);
    let mut all = sdk_read(&b, "v2", 2, weir_client::IsolationLevel::ReadUncommitted, 6);
    all.sort();
    assert_eq!(
        all,
        ["four-0", "four-1", "one-0", "one-1", "three-1", "two-0"]
    );
    let offsets = weir_testkit::runtime().block_on(async {
        let c = weir_client::Client::connect(b.listen).await.unwrap();
        c.committed_offsets("v2-group", None).await.unwrap()
    });
    assert_eq!(offsets.len(), 1, "{offsets:?}");
    assert_eq!(offsets[0].offset, 7);
    b.stop();
}
