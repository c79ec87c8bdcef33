//! A broker that discards data: it speaks just enough of the native
//! protocol for a producer (metadata, topic creation, producer ids,
//! produce) and acknowledges every batch at once without storing it. It
//! measures the load generator itself (`weir-bench --discard`), and can
//! stall its answers for a while to test coordinated-omission correction.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use weir_proto::api::ApiKey;
use weir_proto::batch::BatchHeader;
use weir_proto::frame::{self, ResponseHeader, FRAME_BYTES_MAX_DEFAULT};
use weir_proto::messages::*;

/// When to stop answering, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct Stall {
    /// Time after the first produce request.
    pub after: Duration,
    /// How long produce answers are held back.
    pub duration: Duration,
}

/// What the discard broker received.
#[derive(Debug, Default)]
pub struct Received {
    /// Records in acknowledged batches.
    pub records: AtomicU64,
    /// Bytes of acknowledged batches.
    pub bytes: AtomicU64,
}

#[derive(Default)]
struct State {
    topics: HashMap<String, u32>,
    next_offset: HashMap<(String, u32), u64>,
    next_pid: i64,
    first_produce: Option<Instant>,
}

/// A running discard broker.
#[derive(Debug)]
pub struct DiscardBroker {
    /// Its address.
    pub addr: SocketAddr,
    /// What it received.
    pub received: Arc<Received>,
}

impl DiscardBroker {
    /// Starts one on a free loopback port, on the current tokio runtime.
    pub async fn start(stall: Option<Stall>) -> anyhow::Result<DiscardBroker> {
        let l = TcpListener::bind("127.0.0.1:0").await?;
        let addr = l.local_addr()?;
        let received = Arc::new(Received::default());
        let state = Arc::new(Mutex::new(State::default()));
        let rec = received.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let _ = s.set_nodelay(true);
                tokio::spawn(serve(s, state.clone(), rec.clone(), stall));
            }
        });
        Ok(DiscardBroker { addr, received })
    }
}

async fn read_frame(s: &mut TcpStream) -> Option<Bytes> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.ok()?;
    let total = frame::peek_frame_len(&len, FRAME_BYTES_MAX_DEFAULT).ok()??;
    // Read into spare capacity: no zeroing of large produce requests.
    let mut buf = BytesMut::with_capacity(total);
    buf.extend_from_slice(&len);
    while buf.len() < total {
        let want = total - buf.len();
        if s.read_buf(&mut (&mut buf).limit(want)).await.ok()? == 0 {
            return None;
        }
    }
    Some(buf.freeze())
}

async fn serve(
    mut s: TcpStream,
    state: Arc<Mutex<State>>,
    received: Arc<Received>,
    stall: Option<Stall>,
) {
    while let Some(f) = read_frame(&mut s).await {
        let Ok((h, body, payload)) = frame::decode_request(&f) else {
            return;
        };
        let rh = ResponseHeader::ok(h.correlation_id);
        let out = match h.api() {
            Some(ApiKey::ApiVersions) => {
                frame::encode_response_with_payload(&rh, &ApiVersionsResponse::supported(), &[])
            }
            Some(ApiKey::Metadata) => {
                let Ok(req) = frame::decode_body::<MetadataRequest>(body) else {
                    return;
                };
                let st = state.lock().expect("state");
                let names: Vec<String> = req
                    .topics
                    .unwrap_or_else(|| st.topics.keys().cloned().collect());
                let topics = names
                    .into_iter()
                    .map(|name| match st.topics.get(&name) {
                        Some(&n) => TopicMetadata {
                            name,
                            error: 0,
                            partitions: (0..n)
                                .map(|p| PartitionMetadata {
                                    partition: p,
                                    core: 0,
                                    error: 0,
                                })
                                .collect(),
                        },
                        None => TopicMetadata {
                            name,
                            error: 3,
                            partitions: Vec::new(),
                        },
                    })
                    .collect();
                let md = MetadataResponse {
                    cores: Vec::new(),
                    topics,
                };
                frame::encode_response_with_payload(&rh, &md, &[])
            }
            Some(ApiKey::CreateTopics) => {
                let Ok(req) = frame::decode_body::<CreateTopicsRequest>(body) else {
                    return;
                };
                let mut st = state.lock().expect("state");
                let topics = req
                    .topics
                    .into_iter()
                    .map(|t| {
                        st.topics.insert(t.name.clone(), t.partitions.max(1));
                        TopicResult {
                            name: t.name,
                            error: 0,
                            message: None,
                        }
                    })
                    .collect();
                frame::encode_response_with_payload(&rh, &CreateTopicsResponse { topics }, &[])
            }
            Some(ApiKey::InitProducerId) => {
                let mut st = state.lock().expect("state");
                st.next_pid += 1;
                let r = InitProducerIdResponse {
                    error: 0,
                    message: None,
                    producer_id: st.next_pid,
                    producer_epoch: 0,
                };
                frame::encode_response_with_payload(&rh, &r, &[])
            }
            Some(ApiKey::Produce) => {
                let Ok(req) = frame::decode_body::<ProduceRequest>(body) else {
                    return;
                };
                let started = {
                    let mut st = state.lock().expect("state");
                    *st.first_produce.get_or_insert_with(Instant::now)
                };
                if let Some(stall) = stall {
                    let from = started + stall.after;
                    let to = from + stall.duration;
                    let now = Instant::now();
                    if now >= from && now < to {
                        tokio::time::sleep_until(to.into()).await;
                    }
                }
                let mut res = ProduceResponse::default();
                for p in req.partitions {
                    let data = frame::payload_slice(payload, p.payload_offset, p.payload_len)
                        .unwrap_or_default();
                    let mut records = 0u64;
                    let mut at = 0;
                    while at < data.len() {
                        let Ok(h) = BatchHeader::parse_framed(&data[at..]) else {
                            break;
                        };
                        records += h.records_count.max(0) as u64;
                        at += h.total_len();
                    }
                    received.records.fetch_add(records, Ordering::Relaxed);
                    received
                        .bytes
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                    let base = {
                        let mut st = state.lock().expect("state");
                        let o = st
                            .next_offset
                            .entry((p.topic.clone(), p.partition))
                            .or_insert(0);
                        let base = *o;
                        *o += records;
                        base
                    };
                    res.partitions.push(ProducePartitionResult {
                        topic: p.topic,
                        partition: p.partition,
                        error: 0,
                        message: None,
                        base_offset: base,
                        log_start_offset: 0,
                    });
                }
                frame::encode_response_with_payload(&rh, &res, &[])
            }
            _ => frame::encode_error_response(
                h.correlation_id,
                weir_proto::error_code::ErrorCode::UnsupportedApi,
                "the discard broker serves metadata, topic creation and produce only",
            ),
        };
        let Ok(out) = out else { return };
        if s.write_all(&out).await.is_err() {
            return;
        }
    }
}
