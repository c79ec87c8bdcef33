//! The client against a scripted in-process server (no broker): framing,
//! correlation, payload layout, error mapping, timeouts and reconnects.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use weir_client::{Acks, Client, ClientConfig, ClientError};
use weir_proto::api::ApiKey;
use weir_proto::batch::{set_base_offset, Compression};
use weir_proto::builder::BatchBuilder;
use weir_proto::error_code::ErrorCode;
use weir_proto::frame::{self, Message, RequestHeader, ResponseHeader};
use weir_proto::messages::*;
use weir_proto::record::RecordData;

/// What the script answers: a frame, or nothing.
type Script = dyn Fn(RequestHeader, &[u8], &[u8]) -> Option<Vec<u8>> + Send + Sync;

/// A server on loopback answering every request with `script`; counts
/// connections.
async fn serve(script: Arc<Script>) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((weir_testkit::ports::private_loopback(), 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let counter = conns.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            let script = script.clone();
            tokio::spawn(async move {
                loop {
                    let Some(f) = common::read_frame(&mut s).await else {
                        return;
                    };
                    let (h, body, payload) = frame::decode_request(&f).unwrap();
                    if let Some(out) = script(h, body, payload) {
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, conns)
}

fn answer<T: Message>(h: &RequestHeader, body: &T, payload: &[&[u8]]) -> Option<Vec<u8>> {
    let rh = ResponseHeader::ok(h.correlation_id);
    Some(
        frame::encode_response_with_payload(&rh, body, payload)
            .unwrap()
            .to_vec(),
    )
}

fn batch(n: usize, base: i64) -> Bytes {
    let mut b = BatchBuilder::new(Compression::None).unwrap();
    for i in 0..n {
        b.push(&RecordData {
            key: None,
            value: Some(Bytes::from(format!("v{i}"))),
            headers: Vec::new(),
            timestamp: 1_000 + i as i64,
        })
        .unwrap();
    }
    let mut out = b.build().unwrap();
    set_base_offset(&mut out, base);
    out.freeze()
}

fn config(timeout_ms: u64) -> ClientConfig {
    let mut c = ClientConfig::default();
    c.request_timeout = Duration::from_millis(timeout_ms);
    c
}

#[tokio::test]
async fn produce_many_groups_batches_per_partition_in_order() {
    let (b1, b2, b3) = (batch(3, 0), batch(2, 0), batch(4, 0));
    let (e1, e2, e3) = (b1.clone(), b2.clone(), b3.clone());
    let script: Arc<Script> = Arc::new(move |h, body, payload| {
        assert_eq!(h.api(), Some(ApiKey::Produce));
        let req = frame::decode_body::<ProduceRequest>(body).unwrap();
        assert_eq!(req.acks, 1);
        let ranges: Vec<_> = req
            .partitions
            .iter()
            .map(|p| {
                let data = frame::payload_slice(payload, p.payload_offset, p.payload_len).unwrap();
                (p.topic.clone(), p.partition, data.to_vec())
            })
            .collect();
        assert_eq!(
            ranges,
            vec![
                ("a".to_string(), 0, [&e1[..], &e3[..]].concat()),
                ("b".to_string(), 5, e2.to_vec()),
            ]
        );
        let res = ProduceResponse {
            partitions: vec![
                ProducePartitionResult {
                    topic: "a".into(),
                    partition: 0,
                    error: 0,
                    message: None,
                    base_offset: 100,
                    log_start_offset: 0,
                },
                ProducePartitionResult {
                    topic: "b".into(),
                    partition: 5,
                    error: ErrorCode::StorageError.as_u16(),
                    message: Some("disk on fire".into()),
                    base_offset: 0,
                    log_start_offset: 0,
                },
            ],
        };
        answer(&h, &res, &[])
    });
    let (addr, _) = serve(script).await;
    let c = Client::connect(addr).await.unwrap();
    let r = c
        .produce_many(
            Acks::Leader,
            vec![
                ("a".into(), 0, b1),
                ("b".into(), 5, b2),
                ("x".into(), 0, Bytes::from_static(b"not a batch")),
                ("a".into(), 0, b3),
            ],
        )
        .await
        .unwrap();
    assert_eq!(r.len(), 4);
    assert_eq!(r[0].as_ref().unwrap(), &Some(100));
    match &r[1] {
        Err(ClientError::Partition {
            topic,
            partition: 5,
            code: ErrorCode::StorageError,
            message,
        }) => assert_eq!((topic.as_str(), message.as_str()), ("b", "disk on fire")),
        other => panic!("{other:?}"),
    }
    assert!(matches!(r[2], Err(ClientError::CorruptBatch(_))));
    assert_eq!(r[3].as_ref().unwrap(), &Some(103), "after a-0's 3 records");
}

#[tokio::test]
async fn admin_errors_carry_the_server_message() {
    let script: Arc<Script> = Arc::new(|h, body, _| match h.api().unwrap() {
        ApiKey::CreateTopics => {
            let req = frame::decode_body::<CreateTopicsRequest>(body).unwrap();
            let t = &req.topics[0];
            assert_eq!((t.partitions, t.configs.len()), (3, 1));
            answer(
                &h,
                &CreateTopicsResponse {
                    topics: vec![TopicResult {
                        name: t.name.clone(),
                        error: ErrorCode::TopicAlreadyExists.as_u16(),
                        message: Some(format!("topic `{}` already exists", t.name)),
                    }],
                },
                &[],
            )
        }
        ApiKey::Metadata => answer(
            &h,
            &MetadataResponse {
                cores: vec![],
                topics: vec![
                    TopicMetadata {
                        name: "zz".into(),
                        error: 0,
                        partitions: vec![],
                    },
                    TopicMetadata {
                        name: "aa".into(),
                        error: 0,
                        partitions: vec![],
                    },
                ],
            },
            &[],
        ),
        ApiKey::ListOffsets => answer(
            &h,
            &ListOffsetsResponse {
                partitions: vec![ListOffsetsResult {
                    topic: "t".into(),
                    partition: 1,
                    error: ErrorCode::UnknownTopicOrPartition.as_u16(),
                    offset: None,
                    timestamp: None,
                }],
            },
            &[],
        ),
        other => panic!("unexpected {other}"),
    });
    let (addr, conns) = serve(script).await;
    let c = Client::connect(addr).await.unwrap();
    let e = c
        .create_topic("t", 3, vec![("retention.ms".into(), "1".into())])
        .await
        .unwrap_err();
    assert!(matches!(
        e,
        ClientError::Topic {
            code: ErrorCode::TopicAlreadyExists,
            ..
        }
    ));
    assert_eq!(
        e.to_string(),
        "topic `t` already exists [TopicAlreadyExists]"
    );
    assert_eq!(c.list_topics().await.unwrap(), vec!["aa", "zz"]);
    let e = c
        .list_offsets("t", 1, OffsetSpec::Latest)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::UnknownTopicOrPartition));
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "per-topic errors keep the connection"
    );
}

#[tokio::test]
async fn frame_errors_and_timeouts_drop_the_connection() {
    let script: Arc<Script> = Arc::new(|h, _, _| match h.api().unwrap() {
        ApiKey::ApiVersions => answer(&h, &ApiVersionsResponse::supported(), &[]),
        ApiKey::DeleteTopics => Some(
            frame::encode_error_response(h.correlation_id, ErrorCode::InvalidRequest, "bad body")
                .unwrap()
                .to_vec(),
        ),
        ApiKey::Metadata => None, // never answers
        other => panic!("unexpected {other}"),
    });
    let (addr, conns) = serve(script).await;
    let c = Client::connect_with(addr, config(200)).await.unwrap();
    assert_eq!(c.api_versions().await.unwrap().len(), ApiKey::ALL.len());
    match c.delete_topic("t").await.unwrap_err() {
        ClientError::Server { code, message } => {
            assert_eq!(
                (code, message.as_str()),
                (ErrorCode::InvalidRequest, "bad body")
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.api_versions().await.unwrap().len(), ApiKey::ALL.len());
    assert_eq!(
        conns.load(Ordering::SeqCst),
        2,
        "reconnected after the frame error"
    );
    assert!(matches!(
        c.metadata(None).await,
        Err(ClientError::Timeout(_))
    ));
    assert_eq!(c.api_versions().await.unwrap().len(), ApiKey::ALL.len());
    assert_eq!(
        conns.load(Ordering::SeqCst),
        3,
        "reconnected after the timeout"
    );
}

#[tokio::test]
async fn acks_zero_does_not_wait_and_a_late_answer_is_skipped() {
    let script: Arc<Script> = Arc::new(|h, body, _| match h.api().unwrap() {
        ApiKey::ApiVersions => answer(&h, &ApiVersionsResponse::supported(), &[]),
        ApiKey::Produce => {
            let req = frame::decode_body::<ProduceRequest>(body).unwrap();
            assert_eq!(req.acks, 0);
            // This server answers acks=0 anyway (as the broker does today).
            answer(&h, &ProduceResponse::default(), &[])
        }
        other => panic!("unexpected {other}"),
    });
    let (addr, conns) = serve(script).await;
    let c = Client::connect(addr).await.unwrap();
    for _ in 0..3 {
        assert_eq!(
            c.produce("t", 0, batch(2, 0), Acks::None).await.unwrap(),
            None
        );
    }
    assert_eq!(c.api_versions().await.unwrap().len(), ApiKey::ALL.len());
    assert_eq!(conns.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn fetch_many_slices_each_partitions_batches() {
    let (b0, b1, b2) = (batch(2, 10), batch(3, 12), batch(1, 7));
    let (e0, e1, e2) = (b0.clone(), b1.clone(), b2.clone());
    let script: Arc<Script> = Arc::new(move |h, body, _| {
        let req = frame::decode_body::<FetchRequest>(body).unwrap();
        assert_eq!(
            (req.max_wait_ms, req.min_bytes, req.partitions.len()),
            (50, 1, 3)
        );
        let r = |p: u32, off: usize, len: usize, error: u16| FetchPartitionResult {
            topic: "t".into(),
            partition: p,
            error,
            message: None,
            high_watermark: 15,
            log_start_offset: 0,
            payload_offset: off as u32,
            payload_len: len as u32,
            last_stable_offset: 15,
            aborted: Vec::new(),
            fetch_offset: 0,
        };
        let n01 = e0.len() + e1.len();
        let body = FetchResponse {
            partitions: vec![
                r(0, 0, n01, 0),
                r(1, n01, e2.len(), 0),
                r(2, n01 + e2.len(), 0, ErrorCode::OffsetOutOfRange.as_u16()),
            ],
        };
        answer(&h, &body, &[&e0, &e1, &e2])
    });
    let (addr, _) = serve(script).await;
    let c = Client::connect(addr).await.unwrap();
    let targets = (0..3)
        .map(|p| FetchPartition {
            topic: "t".into(),
            partition: p,
            offset: 0,
            max_bytes: 1 << 20,
        })
        .collect();
    let r = c.fetch_many(50, 1 << 20, targets).await.unwrap();
    let p0 = r[0].as_ref().unwrap();
    assert_eq!(p0.batches, vec![b0, b1]);
    assert_eq!((p0.high_watermark, p0.next_offset()), (15, Some(15)));
    assert_eq!(r[1].as_ref().unwrap().batches, vec![b2]);
    assert_eq!(
        r[2].as_ref().unwrap_err().code(),
        Some(ErrorCode::OffsetOutOfRange)
    );
}
