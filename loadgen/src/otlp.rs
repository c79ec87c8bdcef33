//! The `--driver otlp-grpc` / `--driver otlp-http` side of `weir-bench`:
//! the workload's records as OpenTelemetry spans sent to a broker's OTLP
//! receiver, as an instrumented service's exporter sends them.
//!
//! Each record becomes one span whose `payload` attribute holds the
//! record's value (so a span is about the workload's `messageSize`, plus
//! ~80 bytes of ids, times and names). A producer gathers spans into
//! trace exports of `driver.otlpSpansPerExport` (default 512, the
//! OpenTelemetry SDK's `BatchSpanProcessor` batch) or what `lingerMs`
//! gathered, and has up to `maxInFlight` exports outstanding (OTLP/gRPC:
//! streams of one HTTP/2 connection; OTLP/HTTP: that many HTTP/1.1
//! connections). A span's latency runs from its intended send time to its
//! export's answer — success only once the broker has it durably.
//!
//! The resource of every export carries `weir.topic` = the workload's
//! topic: a broker started with `--otlp-topic-from-attribute weir.topic`
//! writes the spans there (without it, to its traces topic).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use weir_otlp::wire::{put_len, put_nested, put_tag, put_varint_field, FIXED64};

/// Which OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// OTLP/gRPC (HTTP/2).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (HTTP/1.1).
    Http,
}

/// What a producer's exports report: per span, its intended send time
/// (µs), its payload size and the outcome.
pub type OnSpan = Arc<dyn Fn(u64, u64, Result<(), String>) + Send + Sync>;

const TRACE_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// One producer: its pending export and its connections.
pub struct OtlpProducer {
    transport: Transport,
    addr: std::net::SocketAddr,
    topic: String,
    spans_per_export: usize,
    linger: Duration,
    slots: Arc<Semaphore>,
    max_in_flight: u32,
    pending: Mutex<Pending>,
    grpc: Option<hyper::client::conn::http2::SendRequest<Full<Bytes>>>,
    http: Arc<Mutex<Vec<hyper::client::conn::http1::SendRequest<Full<Bytes>>>>>,
    on_span: OnSpan,
    next_id: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Pending {
    spans: Vec<u8>,
    count: usize,
    /// (intended µs, payload bytes) of each span.
    sent: Vec<(u64, u64)>,
    since: Option<Instant>,
}

impl OtlpProducer {
    /// Connects (OTLP/gRPC: the HTTP/2 connection; OTLP/HTTP connects as
    /// exports need).
    pub async fn connect(
        transport: Transport,
        addr: std::net::SocketAddr,
        topic: &str,
        spans_per_export: usize,
        linger: Duration,
        max_in_flight: usize,
        on_span: OnSpan,
    ) -> anyhow::Result<OtlpProducer> {
        if spans_per_export == 0 {
            bail!("driver.otlpSpansPerExport must be at least 1");
        }
        let grpc = match transport {
            Transport::Grpc => {
                let tcp = TcpStream::connect(addr)
                    .await
                    .with_context(|| format!("connecting to the OTLP/gRPC receiver {addr}"))?;
                let _ = tcp.set_nodelay(true);
                let (send, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                        .await
                        .with_context(|| format!("HTTP/2 with {addr}"))?;
                tokio::spawn(conn);
                Some(send)
            }
            Transport::Http => None,
        };
        let max_in_flight = max_in_flight.clamp(1, 1024) as u32;
        Ok(OtlpProducer {
            transport,
            addr,
            topic: topic.to_string(),
            spans_per_export,
            linger,
            slots: Arc::new(Semaphore::new(max_in_flight as usize)),
            max_in_flight,
            pending: Mutex::new(Pending::default()),
            grpc,
            http: Arc::new(Mutex::new(Vec::new())),
            on_span,
            next_id: std::sync::atomic::AtomicU64::new(1),
        })
    }

    /// Adds a span carrying `payload`; sends the export once it is full
    /// (or lingered), waiting for a free slot.
    pub async fn send(&self, payload: &[u8], intended_us: u64) {
        let n = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ready = {
            let mut p = self.pending.lock().expect("pending");
            encode_span(&mut p.spans, n, payload);
            p.count += 1;
            p.sent.push((intended_us, payload.len() as u64));
            let since = *p.since.get_or_insert_with(Instant::now);
            (p.count >= self.spans_per_export || since.elapsed() >= self.linger)
                .then(|| std::mem::take(&mut *p))
        };
        if let Some(batch) = ready {
            self.export(batch).await;
        }
    }

    /// Sends what is pending and waits for every export's answer.
    pub async fn flush(&self) {
        let batch = std::mem::take(&mut *self.pending.lock().expect("pending"));
        if batch.count > 0 {
            self.export(batch).await;
        }
        // Every slot free: every export answered.
        if let Ok(all) = self.slots.acquire_many(self.max_in_flight).await {
            drop(all);
        }
    }

    async fn export(&self, batch: Pending) {
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let body = self.request(&batch.spans);
        let on_span = self.on_span.clone();
        let (transport, addr) = (self.transport, self.addr);
        let grpc = self.grpc.clone();
        let http = self.http.clone();
        tokio::spawn(async move {
            let outcome = match transport {
                Transport::Grpc => match grpc {
                    Some(g) => export_grpc(g, body).await,
                    None => Err("no HTTP/2 connection".to_string()),
                },
                Transport::Http => export_http(&http, addr, body).await,
            };
            for (intended, bytes) in batch.sent {
                on_span(intended, bytes, outcome.clone());
            }
            drop(permit);
        });
    }

    /// An `ExportTraceServiceRequest` of one resource and scope.
    fn request(&self, spans: &[u8]) -> Vec<u8> {
        let mut req = Vec::with_capacity(spans.len() + 128);
        put_nested(&mut req, 1, |rs| {
            put_nested(rs, 1, |res| {
                attribute(res, 1, "service.name", b"weir-bench");
                attribute(res, 1, "weir.topic", self.topic.as_bytes());
            });
            put_nested(rs, 2, |ss| {
                put_nested(ss, 1, |scope| put_len(scope, 1, b"weir-bench"));
                ss.extend_from_slice(spans);
            });
        });
        req
    }
}

fn attribute(out: &mut Vec<u8>, field: u32, key: &str, value: &[u8]) {
    put_nested(out, field, |kv| {
        put_len(kv, 1, key.as_bytes());
        put_nested(kv, 2, |v| put_len(v, 1, value));
    });
}

/// Appends span `n` (as field 2 of a `ScopeSpans`): its own trace, the
/// payload as a bytes attribute.
fn encode_span(out: &mut Vec<u8>, n: u64, payload: &[u8]) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // Spread trace ids (a keyed topic's partitions all get traces).
    let mixed = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    put_nested(out, 2, |span| {
        let mut trace = [0u8; 16];
        trace[..8].copy_from_slice(&mixed.to_be_bytes());
        trace[8..].copy_from_slice(&u64::from(std::process::id()).to_be_bytes());
        put_len(span, 1, &trace);
        put_len(span, 2, &n.max(1).to_be_bytes());
        put_len(span, 5, b"weir-bench");
        put_varint_field(span, 6, 1);
        put_tag(span, 7, FIXED64);
        span.extend_from_slice(&now.to_le_bytes());
        put_tag(span, 8, FIXED64);
        span.extend_from_slice(&now.to_le_bytes());
        put_nested(span, 9, |kv| {
            put_len(kv, 1, b"payload");
            put_nested(kv, 2, |v| put_len(v, 7, payload));
        });
    });
}

async fn export_grpc(
    mut g: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    body: Vec<u8>,
) -> Result<(), String> {
    let framed = weir_otlp::grpc::frame(&body);
    let req = http::Request::post(TRACE_PATH)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from(framed)))
        .map_err(|e| e.to_string())?;
    g.ready().await.map_err(|e| e.to_string())?;
    let resp = g.send_request(req).await.map_err(|e| e.to_string())?;
    let status_in_headers = grpc_status(resp.headers());
    let collected = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    let status = status_in_headers.or_else(|| collected.trailers().and_then(grpc_status));
    match status {
        Some((0, _)) => Ok(()),
        Some((code, message)) => Err(format!("gRPC status {code}: {message}")),
        None => Err("no grpc-status".to_string()),
    }
}

fn grpc_status(h: &http::HeaderMap) -> Option<(i32, String)> {
    let code = h.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = h
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or("")
        .to_string();
    Some((code, message))
}

async fn export_http(
    pool: &Mutex<Vec<hyper::client::conn::http1::SendRequest<Full<Bytes>>>>,
    addr: std::net::SocketAddr,
    body: Vec<u8>,
) -> Result<(), String> {
    let conn = pool.lock().expect("pool").pop();
    let mut conn = match conn {
        Some(c) if !c.is_closed() => c,
        _ => {
            let tcp = TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connecting to {addr}: {e}"))?;
            let _ = tcp.set_nodelay(true);
            let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            send
        }
    };
    let req = http::Request::post("/v1/traces")
        .header("host", addr.to_string())
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    conn.ready().await.map_err(|e| e.to_string())?;
    let resp = conn.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    pool.lock().expect("pool").push(conn);
    if status.is_success() {
        Ok(())
    } else {
        Err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body)
                .chars()
                .take(200)
                .collect::<String>()
        ))
    }
}
