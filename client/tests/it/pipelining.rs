//! The client's pipelined connection against fake servers that the tests
//! drive frame by frame: routing by correlation id, requests in flight at
//! once, the in-flight limit, the order of requests, failures, cancellation,
//! lazy connections, InitProducerId.

use crate::common;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use weir_client::{Acks, Client, ClientConfig, ClientError};
use weir_proto::api::ApiKey;
use weir_proto::batch::Compression;
use weir_proto::builder::BatchBuilder;
use weir_proto::error_code::ErrorCode;
use weir_proto::frame::{self, Message, RequestHeader, ResponseHeader};
use weir_proto::messages::*;
use weir_proto::record::RecordData;

/// Upper bound on any wait of these tests: reached only if they fail.
const BOUND: Duration = Duration::from_secs(20);

async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// A listener on loopback handing every accepted connection to the test.
async fn listen() -> (SocketAddr, mpsc::UnboundedReceiver<TcpStream>) {
    let listener = TcpListener::bind((weir_testkit::ports::private_loopback(), 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            if tx.send(s).is_err() {
                return;
            }
        }
    });
    (addr, rx)
}

async fn accept(conns: &mut mpsc::UnboundedReceiver<TcpStream>) -> TcpStream {
    bounded("a connection", conns.recv()).await.unwrap()
}

/// A request the server read: its header and the frame.
struct Req {
    header: RequestHeader,
    frame: Vec<u8>,
}

impl Req {
    fn corr(&self) -> u32 {
        self.header.correlation_id
    }

    fn body<T: Message>(&self) -> T {
        let (_, body, _) = frame::decode_request(&self.frame).unwrap();
        frame::decode_body::<T>(body).unwrap()
    }

    /// The partition of a ListOffsets request.
    fn partition(&self) -> u32 {
        assert_eq!(self.header.api(), Some(ApiKey::ListOffsets));
        self.body::<ListOffsetsRequest>().partitions[0].partition
    }
}

async fn read_req(s: &mut TcpStream) -> Req {
    let frame = bounded("a request", common::read_frame(s))
        .await
        .expect("a request, not the end of the connection");
    let (header, _, _) = frame::decode_request(&frame).unwrap();
    Req { header, frame }
}

fn answer<T: Message>(corr: u32, body: &T) -> Vec<u8> {
    frame::encode_response_with_payload(&ResponseHeader::ok(corr), body, &[])
        .unwrap()
        .to_vec()
}

/// The answer to a ListOffsets request for `partition`: offset
/// `offset_of(partition)`.
fn offsets_answer(req: &Req) -> Vec<u8> {
    let partition = req.partition();
    answer(
        req.corr(),
        &ListOffsetsResponse {
            partitions: vec![ListOffsetsResult {
                topic: "t".into(),
                partition,
                error: 0,
                offset: Some(offset_of(partition)),
                timestamp: None,
            }],
        },
    )
}

fn offset_of(partition: u32) -> u64 {
    1_000 + u64::from(partition)
}

/// A call whose answer tells which request it answers: the latest offset
/// of partition `p` of topic `t`.
fn lookup(client: &Arc<Client>, p: u32) -> tokio::task::JoinHandle<weir_client::Result<u64>> {
    let client = client.clone();
    tokio::spawn(async move {
        let o = client
            .list_offsets("t", p, OffsetSpec::Latest)
            .await?
            .expect("an offset");
        Ok(o)
    })
}

fn config(f: impl FnOnce(&mut ClientConfig)) -> ClientConfig {
    let mut c = ClientConfig::default();
    f(&mut c);
    c
}

fn batch(value_bytes: usize) -> Bytes {
    let mut b = BatchBuilder::new(Compression::None).unwrap();
    b.push(&RecordData {
        key: None,
        value: Some(Bytes::from(vec![7u8; value_bytes])),
        headers: Vec::new(),
        timestamp: 1_000,
    })
    .unwrap();
    b.build().unwrap().freeze()
}

#[tokio::test]
async fn answers_are_routed_by_correlation_id_in_any_order() {
    let (addr, mut conns) = listen().await;
    let client = Arc::new(Client::connect(addr).await.unwrap());
    let mut s = accept(&mut conns).await;
    const N: u32 = 16;
    let calls: Vec<_> = (0..N).map(|p| lookup(&client, p)).collect();
    // The whole burst is read before anything is answered (a client that
    // waited for answers would never send the second request)...
    let mut burst = Vec::new();
    for _ in 0..N {
        burst.push(read_req(&mut s).await);
    }
    let mut parts: Vec<u32> = burst.iter().map(Req::partition).collect();
    parts.sort_unstable();
    assert_eq!(parts, (0..N).collect::<Vec<_>>());
    // ... and answered in reverse: each caller still gets its own answer.
    for req in burst.iter().rev() {
        s.write_all(&offsets_answer(req)).await.unwrap();
    }
    for (p, call) in calls.into_iter().enumerate() {
        let got = bounded("an answer", call).await.unwrap().unwrap();
        assert_eq!(got, offset_of(p as u32));
    }
    assert!(conns.try_recv().is_err(), "one connection");
}

#[tokio::test]
async fn a_full_window_of_requests_is_in_flight_at_once() {
    let (addr, mut conns) = listen().await;
    let client = Arc::new(Client::connect(addr).await.unwrap());
    assert_eq!(client.config().max_in_flight, 32, "the default");
    let mut s = accept(&mut conns).await;
    let n = client.config().max_in_flight as u32;
    let calls: Vec<_> = (0..n).map(|p| lookup(&client, p)).collect();
    // The server holds every answer until it has read all `n` requests:
    // this only completes if they are all in flight together.
    let mut burst = Vec::new();
    for _ in 0..n {
        burst.push(read_req(&mut s).await);
    }
    let corrs: Vec<u32> = burst.iter().map(Req::corr).collect();
    assert!(
        corrs.windows(2).all(|w| w[0] < w[1]),
        "correlation ids increase in the order sent: {corrs:?}"
    );
    for req in &burst {
        s.write_all(&offsets_answer(req)).await.unwrap();
    }
    for (p, call) in calls.into_iter().enumerate() {
        assert_eq!(
            bounded("an answer", call).await.unwrap().unwrap(),
            offset_of(p as u32)
        );
    }
}

#[tokio::test]
async fn max_in_flight_bounds_unanswered_requests() {
    let (addr, mut conns) = listen().await;
    let client = Arc::new(
        Client::connect_with(addr, config(|c| c.max_in_flight = 2))
            .await
            .unwrap(),
    );
    let mut s = accept(&mut conns).await;
    const N: u32 = 6;
    let calls: Vec<_> = (0..N).map(|p| lookup(&client, p)).collect();
    let mut unanswered = std::collections::VecDeque::new();
    unanswered.push_back(read_req(&mut s).await);
    unanswered.push_back(read_req(&mut s).await);
    // With two unanswered, nothing more comes. (The one timed wait of
    // these tests: it can only let a broken limit pass, never fail a
    // working one.)
    let more = tokio::time::timeout(Duration::from_millis(300), common::read_frame(&mut s)).await;
    assert!(more.is_err(), "a third request while two are unanswered");
    // Each answer lets exactly one more request through.
    let mut seen = 2;
    while let Some(req) = unanswered.pop_front() {
        s.write_all(&offsets_answer(&req)).await.unwrap();
        if seen < N {
            unanswered.push_back(read_req(&mut s).await);
            seen += 1;
        }
    }
    for (p, call) in calls.into_iter().enumerate() {
        assert_eq!(
            bounded("an answer", call).await.unwrap().unwrap(),
            offset_of(p as u32)
        );
    }
}

#[tokio::test]
async fn requests_are_sent_in_the_order_the_calls_reached_the_connection() {
    let (addr, mut conns) = listen().await;
    // A window of 2, so that later calls also queue for a slot.
    let client = Client::connect_with(addr, config(|c| c.max_in_flight = 2))
        .await
        .unwrap();
    let mut s = accept(&mut conns).await;
    let server = tokio::spawn(async move {
        let mut topics = Vec::new();
        for _ in 0..5 {
            let req = read_req(&mut s).await;
            let body = req.body::<ProduceRequest>();
            let p = &body.partitions[0];
            topics.push(p.topic.clone());
            let res = ProduceResponse {
                partitions: vec![ProducePartitionResult {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    error: 0,
                    message: None,
                    base_offset: topics.len() as u64,
                    log_start_offset: 0,
                }],
            };
            s.write_all(&answer(req.corr(), &res)).await.unwrap();
        }
        topics
    });
    let produce = |topic: &'static str| client.produce(topic, 0, batch(10), Acks::All);
    // Futures created, then polled in this order by one task.
    let (a, b, c, d, e) = tokio::join!(
        produce("a"),
        produce("b"),
        produce("c"),
        produce("d"),
        produce("e")
    );
    let offsets: Vec<_> = [a, b, c, d, e]
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    assert_eq!(offsets, vec![1, 2, 3, 4, 5]);
    assert_eq!(
        bounded("the server", server).await.unwrap(),
        vec!["a", "b", "c", "d", "e"]
    );
}

#[tokio::test]
async fn the_server_closing_fails_every_waiting_call_and_the_next_call_reconnects() {
    let (addr, mut conns) = listen().await;
    let client = Arc::new(Client::connect(addr).await.unwrap());
    let mut s = accept(&mut conns).await;
    let calls: Vec<_> = (0..5).map(|p| lookup(&client, p)).collect();
    for _ in 0..5 {
        read_req(&mut s).await;
    }
    drop(s);
    for call in calls {
        let e = bounded("a failure", call).await.unwrap().unwrap_err();
        assert!(matches!(e, ClientError::Disconnected), "{e:?}");
        assert!(e.is_retriable());
    }
    // The next call opens a new connection.
    let call = lookup(&client, 9);
    let mut s = accept(&mut conns).await;
    let req = read_req(&mut s).await;
    s.write_all(&offsets_answer(&req)).await.unwrap();
    assert_eq!(bounded("an answer", call).await.unwrap().unwrap(), 1_009);
}

#[tokio::test]
async fn a_timeout_closes_the_connection_and_fails_the_others() {
    let (addr, mut conns) = listen().await;
    let client = Arc::new(
        Client::connect_with(
            addr,
            config(|c| c.request_timeout = Duration::from_millis(200)),
        )
        .await
        .unwrap(),
    );
    let mut s = accept(&mut conns).await;
    // A long poll (its own deadline 60 s away), then a lookup that times
    // out: the long poll fails right away with it.
    let poll = {
        let client = client.clone();
        tokio::spawn(async move { client.fetch("t", 0, 0, 1 << 20, 60_000).await })
    };
    assert_eq!(read_req(&mut s).await.header.api(), Some(ApiKey::Fetch));
    let call = lookup(&client, 1);
    read_req(&mut s).await;
    let e = bounded("the timeout", call).await.unwrap().unwrap_err();
    assert!(matches!(e, ClientError::Timeout(_)), "{e:?}");
    let e = bounded("the long poll", poll).await.unwrap().unwrap_err();
    assert!(matches!(e, ClientError::Disconnected), "{e:?}");
    // The client closed its end.
    assert!(bounded("the close", common::read_frame(&mut s))
        .await
        .is_none());
    // Nothing is retried; the next call reconnects.
    let call = lookup(&client, 2);
    let mut s = accept(&mut conns).await;
    let req = read_req(&mut s).await;
    assert_eq!(req.partition(), 2);
    s.write_all(&offsets_answer(&req)).await.unwrap();
    assert_eq!(bounded("an answer", call).await.unwrap().unwrap(), 1_002);
}

#[tokio::test]
async fn a_call_dropped_after_sending_leaves_the_connection_working() {
    let (addr, mut conns) = listen().await;
    let client = Arc::new(Client::connect(addr).await.unwrap());
    let mut s = accept(&mut conns).await;
    let dropped = lookup(&client, 1);
    let first = read_req(&mut s).await;
    dropped.abort();
    assert!(bounded("the abort", dropped)
        .await
        .unwrap_err()
        .is_cancelled());
    let call = lookup(&client, 2);
    let second = read_req(&mut s).await;
    assert_eq!(second.partition(), 2);
    // The late answer to the dropped call is discarded.
    s.write_all(&offsets_answer(&first)).await.unwrap();
    s.write_all(&offsets_answer(&second)).await.unwrap();
    assert_eq!(bounded("an answer", call).await.unwrap().unwrap(), 1_002);
    let call = lookup(&client, 3);
    let third = read_req(&mut s).await;
    s.write_all(&offsets_answer(&third)).await.unwrap();
    assert_eq!(bounded("an answer", call).await.unwrap().unwrap(), 1_003);
    assert!(conns.try_recv().is_err(), "still one connection");
}

#[tokio::test]
async fn a_call_dropped_before_sending_sends_nothing() {
    let (addr, mut conns) = listen().await;
    let client = Arc::new(
        Client::connect_with(addr, config(|c| c.max_in_flight = 1))
            .await
            .unwrap(),
    );
    let mut s = accept(&mut conns).await;
    let first = lookup(&client, 1);
    let req = read_req(&mut s).await;
    // Waits for the only slot (it runs up to there while this task
    // yields), then is dropped.
    let dropped = lookup(&client, 2);
    tokio::task::yield_now().await;
    dropped.abort();
    assert!(bounded("the abort", dropped)
        .await
        .unwrap_err()
        .is_cancelled());
    s.write_all(&offsets_answer(&req)).await.unwrap();
    assert_eq!(bounded("an answer", first).await.unwrap().unwrap(), 1_001);
    let call = lookup(&client, 3);
    let next = read_req(&mut s).await;
    assert_eq!(
        next.partition(),
        3,
        "the dropped call's request was not sent"
    );
    s.write_all(&offsets_answer(&next)).await.unwrap();
    assert_eq!(bounded("an answer", call).await.unwrap().unwrap(), 1_003);
    assert!(conns.try_recv().is_err(), "still one connection");
}

#[tokio::test]
async fn requests_abandoned_without_an_answer_do_not_hold_the_slots_forever() {
    let (addr, mut conns) = listen().await;
    let client = Arc::new(
        Client::connect_with(
            addr,
            config(|c| {
                c.max_in_flight = 1;
                c.request_timeout = Duration::from_millis(200);
            }),
        )
        .await
        .unwrap(),
    );
    let mut s = accept(&mut conns).await;
    let dropped = lookup(&client, 1);
    read_req(&mut s).await;
    dropped.abort();
    assert!(bounded("the abort", dropped)
        .await
        .unwrap_err()
        .is_cancelled());
    // The server never answers. The next call waits for the slot; once the
    // dropped call's deadline passes the connection is closed, and the call
    // goes out on a new one.
    let call = lookup(&client, 2);
    assert!(bounded("the close", common::read_frame(&mut s))
        .await
        .is_none());
    let mut s = accept(&mut conns).await;
    let req = read_req(&mut s).await;
    assert_eq!(req.partition(), 2);
    s.write_all(&offsets_answer(&req)).await.unwrap();
    assert_eq!(bounded("an answer", call).await.unwrap().unwrap(), 1_002);
}

#[tokio::test]
async fn a_call_dropped_mid_write_closes_the_connection_only() {
    let (addr, mut conns) = listen().await;
    let client = Arc::new(Client::connect(addr).await.unwrap());
    let mut s = accept(&mut conns).await;
    // Far more than the socket buffers hold while the server reads nothing.
    let big = batch(32 << 20);
    let producing = {
        let client = client.clone();
        tokio::spawn(async move { client.produce("t", 0, big, Acks::All).await })
    };
    let mut start = vec![0u8; 64 << 10];
    bounded("the start of the frame", s.read_exact(&mut start))
        .await
        .unwrap();
    let frame_len = u32::from_be_bytes(start[..4].try_into().unwrap()) as usize + 4;
    producing.abort();
    assert!(bounded("the abort", producing)
        .await
        .unwrap_err()
        .is_cancelled());
    // The client closes the connection: the server gets a cut frame.
    let mut rest = Vec::new();
    let _ = bounded("the close", s.read_to_end(&mut rest)).await;
    assert!(start.len() + rest.len() < frame_len, "the frame was cut");
    // The client still works, on a new connection.
    let call = lookup(&client, 4);
    let mut s = accept(&mut conns).await;
    let req = read_req(&mut s).await;
    s.write_all(&offsets_answer(&req)).await.unwrap();
    assert_eq!(bounded("an answer", call).await.unwrap().unwrap(), 1_004);
}

#[tokio::test]
async fn connect_lazy_connects_on_the_first_call_and_again_after_a_failure() {
    // A port nobody listens on (yet).
    let addr = TcpListener::bind((weir_testkit::ports::private_loopback(), 0))
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let client = Arc::new(Client::connect_lazy(addr, ClientConfig::default()));
    assert_eq!(client.addr(), addr);
    let e = client.api_versions().await.unwrap_err();
    assert!(matches!(e, ClientError::Io(_)), "{e:?}");

    let listener = TcpListener::bind(addr).await.unwrap();
    let call = lookup(&client, 5);
    let (mut s, _) = bounded("a connection", listener.accept()).await.unwrap();
    let req = read_req(&mut s).await;
    s.write_all(&offsets_answer(&req)).await.unwrap();
    assert_eq!(bounded("an answer", call).await.unwrap().unwrap(), 1_005);
}

#[tokio::test]
async fn init_producer_id_returns_the_identity_or_the_servers_error() {
    let (addr, mut conns) = listen().await;
    let client = Arc::new(Client::connect(addr).await.unwrap());
    let mut s = accept(&mut conns).await;
    let server = tokio::spawn(async move {
        let req = read_req(&mut s).await;
        assert_eq!(req.header.api(), Some(ApiKey::InitProducerId));
        req.body::<InitProducerIdRequest>();
        let ok = InitProducerIdResponse {
            error: 0,
            message: None,
            producer_id: 42,
            producer_epoch: 3,
        };
        s.write_all(&answer(req.corr(), &ok)).await.unwrap();
        let req = read_req(&mut s).await;
        let refused = InitProducerIdResponse {
            error: ErrorCode::StorageError.as_u16(),
            message: Some("cannot persist the id block".into()),
            producer_id: -1,
            producer_epoch: -1,
        };
        s.write_all(&answer(req.corr(), &refused)).await.unwrap();
        let req = read_req(&mut s).await;
        s.write_all(&offsets_answer(&req)).await.unwrap();
    });
    assert_eq!(client.init_producer_id().await.unwrap(), (42, 3));
    match client.init_producer_id().await.unwrap_err() {
        ClientError::Server { code, message } => assert_eq!(
            (code, message.as_str()),
            (ErrorCode::StorageError, "cannot persist the id block")
        ),
        other => panic!("{other:?}"),
    }
    // A refusal in the body is an answer: the connection stays.
    assert_eq!(
        bounded("an answer", lookup(&client, 0))
            .await
            .unwrap()
            .unwrap(),
        1_000
    );
    bounded("the server", server).await.unwrap();
    assert!(conns.try_recv().is_err(), "one connection");
}
