//! Bad input on the Kafka listener gets what bad input on the native
//! port gets: an error answer or a closed connection, never a crash, a
//! stall of other clients, or an allocation on the input's word.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Broker;

use common::kafka_frame as frame;

fn connect(b: &Broker) -> TcpStream {
    let s = TcpStream::connect(b.kafka).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// The next response frame (after its size prefix), or `None` once the
/// broker closed the connection.
fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut size = [0u8; 4];
    if s.read_exact(&mut size).is_err() {
        return None;
    }
    let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

/// ApiVersions v0 works on a new connection: the broker is alive.
fn alive(b: &Broker) {
    let mut s = connect(b);
    s.write_all(&frame(18, 0, 7, &[])).unwrap();
    let r = read_frame(&mut s).expect("an ApiVersions answer");
    assert_eq!(&r[..4], &7i32.to_be_bytes());
    assert_eq!(&r[4..6], &0i16.to_be_bytes(), "error code");
}

#[test]
fn bad_frames_get_errors_or_a_closed_connection_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    // A size over the frame limit, a negative one, a tiny one: closed.
    for size in [i32::MAX, -5, 3] {
        let mut s = connect(&b);
        s.write_all(&size.to_be_bytes()).unwrap();
        assert_eq!(read_frame(&mut s), None, "size {size}");
    }
    // A Metadata request declaring 9 MiB (requests other than Produce are
    // capped at 8 MiB): closed before it is buffered.
    let mut s = connect(&b);
    let mut head = (9i32 << 20).to_be_bytes().to_vec();
    head.extend_from_slice(&3i16.to_be_bytes());
    s.write_all(&head).unwrap();
    assert_eq!(read_frame(&mut s), None);
    // An unknown API: closed, as Kafka does.
    let mut s = connect(&b);
    s.write_all(&frame(999, 0, 1, &[])).unwrap();
    assert_eq!(read_frame(&mut s), None);
    // ApiVersions at a version the broker does not know: Kafka's fallback
    // (a v0 answer, UNSUPPORTED_VERSION, and the ApiVersions range).
    let mut s = connect(&b);
    s.write_all(&frame(18, 99, 2, &[])).unwrap();
    let r = read_frame(&mut s).expect("the fallback answer");
    assert_eq!(&r[..4], &2i32.to_be_bytes());
    assert_eq!(&r[4..6], &35i16.to_be_bytes());
    // A Metadata v1 body declaring i32::MAX topics with none sent: an
    // error or a close, promptly, and no allocation on its word (the
    // broker would abort).
    let mut s = connect(&b);
    s.write_all(&frame(3, 1, 3, &i32::MAX.to_be_bytes()))
        .unwrap();
    if let Some(r) = read_frame(&mut s) {
        assert_eq!(&r[..4], &3i32.to_be_bytes());
    }
    // A frame that declares more bytes than it sends, then stalls: other
    // clients are served meanwhile.
    let mut stalled = connect(&b);
    stalled.write_all(&1000i32.to_be_bytes()).unwrap();
    stalled.write_all(&[0u8; 10]).unwrap();
    alive(&b);
    // Random bytes after a valid header of every served API and version
    // range edge: answers or closes, never a crash.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // Fifty connections at a time: a connection closed for a bad frame
    // is closed after a linger (`CLOSE_LINGER_MS`), which one at a time
    // would cost 100 ms each.
    for round in 0..6 {
        let mut open: Vec<TcpStream> = (0..50)
            .map(|j| {
                let key = [
                    0i16, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 19, 20, 22, 32, 37, 42, 44,
                    60, 68,
                ][(rnd() % 22) as usize];
                let version = (rnd() % 14) as i16;
                let body: Vec<u8> = (0..(rnd() % 64)).map(|_| rnd() as u8).collect();
                let mut s = connect(&b);
                s.write_all(&frame(key, version, round * 50 + j, &body))
                    .unwrap();
                s
            })
            .collect();
        for s in &mut open {
            let _ = read_frame(s);
        }
    }
    alive(&b);
    drop(stalled);
    assert!(
        b.stop().success(),
        "the broker stops cleanly after all that"
    );
}

// --- every service error through both listeners --------------------------------

/// A record batch of `values` (keyed `keys`), stamped with producer
/// `(id, epoch, first sequence)` when given, CRC recomputed.
fn batch(values: &[&str], keyed: bool, producer: Option<(i64, i16, i32)>) -> bytes::Bytes {
    let mut b =
        weir_proto::builder::BatchBuilder::new(weir_proto::batch::Compression::None).unwrap();
    for v in values {
        b.push(&weir_proto::record::RecordData {
            key: keyed.then(|| bytes::Bytes::from(format!("k-{v}"))),
            value: Some(bytes::Bytes::from(v.to_string())),
            headers: Vec::new(),
            timestamp: 1_700_000_000_000,
        })
        .unwrap();
    }
    let mut out = b.build().unwrap();
    if let Some((id, epoch, seq)) = producer {
        // Record batch v2: producerId at 43, producerEpoch at 51,
        // baseSequence at 53; the CRC (at 17) covers bytes 21 onwards.
        out[43..51].copy_from_slice(&id.to_be_bytes());
        out[51..53].copy_from_slice(&epoch.to_be_bytes());
        out[53..57].copy_from_slice(&seq.to_be_bytes());
        let crc = crc32c::crc32c(&out[21..]);
        out[17..21].copy_from_slice(&crc.to_be_bytes());
    }
    out.freeze()
}

/// The native code of producing `data` to `topic`-0 through `port`.
fn native_produce(port: std::net::SocketAddr, topic: &str, data: &[u8], acks: i8) -> u16 {
    use weir_proto::messages::{ProducePartition, ProduceRequest};
    let mut c = common::Client::connect(port);
    let req = ProduceRequest {
        transactional_id: None,
        acks,
        timeout_ms: 5_000,
        partitions: vec![ProducePartition {
            topic: topic.into(),
            partition: 0,
            payload_offset: 0,
            payload_len: data.len() as u32,
        }],
    };
    match c.call(&req, &[data]) {
        (_, Ok(r), _) => r.partitions[0].error,
        (h, Err(_), _) => h.error.as_u16(),
    }
}

/// The Kafka code of producing `data` to `topic`-0 (Produce v9) through
/// `port`.
fn kafka_produce(port: std::net::SocketAddr, topic: &str, data: bytes::Bytes, acks: i16) -> i16 {
    common::KafkaConn::connect(port).produce(topic, data, acks, None)
}

/// Every variant of the service's error (`BrokerError`, and each kind of
/// storage failure) that one broker can be made to show, caused by one
/// request through the native listener and one through the Kafka listener:
/// each answers with the code its mapping gives. Shown elsewhere, as they
/// need a cluster or a fault: `NotLeader` (cluster.rs, both listeners),
/// `NotEnoughReplicas` (cluster.rs: a broker without replication has no
/// in-sync set to fall short of), `TimedOut`, `CoreUnavailable`, storage
/// `Io` and `Recovering`; the mappings of those are exhaustive matches the
/// compiler checks.
#[test]
fn every_service_error_reaches_both_listeners_with_its_code() {
    use weir_proto::error_code::ErrorCode as N;
    use weir_proto::messages::{FetchPartition, FetchRequest};

    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    let mut c = b.client();
    let topics = [
        ("t", vec![]),
        ("tiny", vec![("max.message.bytes", "100")]),
        ("compact", vec![("cleanup.policy", "compact")]),
    ];
    for (name, configs) in &topics {
        let r = c.create_topic(name, 1, configs);
        assert_eq!(r.error, 0, "creating {name}: {:?}", r.message);
    }

    // (what, topic, batch, acks, native code, Kafka code); each listener
    // gets its own producer ids so the two do not share sequence state.
    let big = "x".repeat(300);
    let cases = |pid: i64| {
        vec![
            (
                "UnknownPartition",
                "nope",
                batch(&["a"], false, None),
                1,
                N::UnknownTopicOrPartition,
                3,
            ),
            (
                "Corrupt (empty payload)",
                "t",
                bytes::Bytes::new(),
                1,
                N::CorruptMessage,
                2,
            ),
            (
                "Policy",
                "__consumer_offsets",
                batch(&["a"], false, None),
                1,
                N::PolicyViolation,
                44,
            ),
            (
                "InvalidRequest (acks 5)",
                "t",
                batch(&["a"], false, None),
                5,
                N::InvalidRequest,
                42,
            ),
            (
                "Storage TooLarge",
                "tiny",
                batch(&[&big], false, None),
                1,
                N::MessageTooLarge,
                10,
            ),
            (
                "Storage InvalidRecord",
                "compact",
                batch(&["a"], false, None),
                1,
                N::InvalidRecord,
                87,
            ),
            (
                "Storage UnknownProducerId",
                "t",
                batch(&["a"], false, Some((pid, 0, 5))),
                1,
                N::UnknownProducerId,
                59,
            ),
            // Starts producer pid+1 at epoch 1, then: an older epoch, a gap.
            (
                "(producer starts)",
                "t",
                batch(&["a"], false, Some((pid + 1, 1, 0))),
                1,
                N::None,
                0,
            ),
            (
                "Storage InvalidProducerEpoch",
                "t",
                batch(&["b"], false, Some((pid + 1, 0, 1))),
                1,
                N::InvalidProducerEpoch,
                47,
            ),
            (
                "Storage OutOfOrderSequence",
                "t",
                batch(&["b"], false, Some((pid + 1, 1, 7))),
                1,
                N::OutOfOrderSequence,
                45,
            ),
        ]
    };
    for (what, topic, data, acks, native, _) in cases(1_000) {
        let got = native_produce(b.listen, topic, &data, acks as i8);
        assert_eq!(N::from_u16(got), native, "native listener, {what}");
    }
    for (what, topic, data, acks, _, kafka) in cases(2_000) {
        assert_eq!(
            kafka_produce(b.kafka, topic, data, acks),
            kafka,
            "Kafka listener, {what}"
        );
    }

    // Storage Corrupt: a batch whose CRC does not match.
    let mut bad = batch(&["a"], false, None).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    let got = native_produce(b.listen, "t", &bad, 1);
    assert_eq!(
        N::from_u16(got),
        N::CorruptMessage,
        "native listener, Storage Corrupt"
    );
    let got = kafka_produce(b.kafka, "t", bytes::Bytes::from(bad), 1);
    assert_eq!(got, 2, "Kafka listener, Storage Corrupt");

    // NotOwner: a core's own native port refuses a partition of the other
    // core. (A core's own Kafka port serves other cores' partitions through
    // the mesh, as Kafka clients know nothing of cores: NotOwner is native
    // only.)
    let codes: Vec<N> = b
        .core_ports
        .iter()
        .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], *p)))
        .map(|a| N::from_u16(native_produce(a, "t", &batch(&["a"], false, None), 1)))
        .collect();
    assert!(
        codes.contains(&N::None),
        "the owner's port takes it: {codes:?}"
    );
    assert!(
        codes.contains(&N::NotOwner),
        "native listener, NotOwner: {codes:?}"
    );

    // Storage OffsetOutOfRange: a fetch far past the end.
    let (r, _) = c.ok(
        &FetchRequest {
            read_committed: false,
            max_wait_ms: 0,
            min_bytes: 1,
            max_bytes: 1 << 20,
            partitions: vec![FetchPartition {
                topic: "t".into(),
                partition: 0,
                offset: 1_000_000,
                max_bytes: 1 << 20,
            }],
        },
        &[],
    );
    assert_eq!(
        N::from_u16(r.partitions[0].error),
        N::OffsetOutOfRange,
        "native listener"
    );
    {
        use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
        use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, TopicName};
        let mut k = common::KafkaConn::connect(b.kafka);
        let req = FetchRequest::default()
            .with_max_wait_ms(0)
            .with_max_bytes(1 << 20)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(
                    kafka_protocol::protocol::StrBytes::from_static_str("t"),
                ))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(1_000_000)
                    .with_partition_max_bytes(1 << 20)])]);
        k.send(ApiKey::Fetch, 11, &req);
        let r: FetchResponse = k.read(11);
        assert_eq!(
            r.responses[0].partitions[0].error_code, 1,
            "Kafka listener, OffsetOutOfRange"
        );
    }

    // Topic (Exists): creating a topic that exists.
    let r = c.create_topic("t", 1, &[]);
    assert_eq!(
        N::from_u16(r.error),
        N::TopicAlreadyExists,
        "native listener"
    );
    {
        use kafka_protocol::messages::create_topics_request::CreatableTopic;
        use kafka_protocol::messages::{
            ApiKey, CreateTopicsRequest, CreateTopicsResponse, TopicName,
        };
        let mut k = common::KafkaConn::connect(b.kafka);
        let req = CreateTopicsRequest::default()
            .with_timeout_ms(5_000)
            .with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(
                    kafka_protocol::protocol::StrBytes::from_static_str("t"),
                ))
                .with_num_partitions(1)
                .with_replication_factor(1)]);
        k.send(ApiKey::CreateTopics, 7, &req);
        let r: CreateTopicsResponse = k.read(7);
        assert_eq!(
            r.topics[0].error_code, 36,
            "Kafka listener, TopicAlreadyExists"
        );
    }
    assert!(b.stop().success(), "the broker stops cleanly");
}
