//! The OTLP receivers: OTLP/gRPC (HTTP/2, `--otlp-grpc-listen`) and
//! OTLP/HTTP (HTTP/1.1, protobuf or JSON bodies, `--otlp-http-listen`),
//! on every core (the addresses are shared, SO_REUSEPORT), served by
//! hyper on the core's glommio executor: no second runtime, no thread
//! hop. An export is checked and cut into records by `weir-otlp`, its
//! records go through the same produce path as a Kafka or native
//! produce with acks=all, and it is answered success only once every
//! record is acknowledged that durably.
//!
//! The answers follow OTLP's retry rules: bad data is refused for good
//! (400 / INVALID_ARGUMENT), "retry later" (a full node buffer, a
//! partition without a leader or enough in-sync replicas, an
//! acknowledgement past the deadline) is 429 or 503 with `Retry-After` /
//! UNAVAILABLE or RESOURCE_EXHAUSTED with `RetryInfo`, and records a
//! topic refuses for good (too large, a policy) are counted in
//! `partial_success` when the rest of the export was written.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpListener;
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use weir_otlp::grpc::{self, code};
use weir_otlp::{Content, Error as OtlpError, OtlpRecord, Signal};
use weir_proto::builder::BatchBuilder;
use weir_proto::record::RecordData;

use super::accept_or_stop;
use crate::metadata::{writer, Change, TopicError, TopicSpec};
use crate::metrics::otlp_counter;
use crate::server::tls::{handshake, SecurityProtocol, ServerTls};
use crate::service::acl::{self, Op, Resource};
use crate::service::auth::Session;
use crate::service::produce::{produce, ProducePart};
use crate::service::quota;
use crate::service::{BrokerError, Ctx};
use crate::shard::Core;

/// Which receiver a connection came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Receiver {
    /// OTLP/gRPC.
    Grpc,
    /// OTLP/HTTP.
    Http,
}

impl Receiver {
    fn name(self) -> &'static str {
        match self {
            Receiver::Grpc => "OTLP/gRPC",
            Receiver::Http => "OTLP/HTTP",
        }
    }
}

/// How long a "retry later" answer asks the exporter to wait.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// Serves one receiver's connections on this core, over TLS if `tls`.
pub async fn serve_otlp(
    core: Rc<Core>,
    listener: TcpListener,
    receiver: Receiver,
    security: SecurityProtocol,
    tls: Option<Arc<ServerTls>>,
) {
    loop {
        let accepted = accept_or_stop(&core, &listener).await;
        let Some(Ok(stream)) = accepted else {
            if core.shared.stopping() {
                return;
            }
            continue;
        };
        // OTLP connections count against the core's
        // --max-connections-per-core with the client listeners'.
        if super::at_connection_limit(&core, receiver.name()) {
            continue;
        }
        let _ = stream.set_nodelay(true);
        let core = core.clone();
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        glommio::spawn_local(async move {
            let _open = Open::count(&core);
            let idle = Duration::from_millis(core.shared.config.otlp.idle_timeout_ms);
            let peer = stream
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into());
            let Some(acceptor) = acceptor else {
                let session = Session::new(peer, security, Duration::ZERO);
                return serve_connection(core, Io::new(stream, idle), receiver, session).await;
            };
            let failures = &core.metrics.tls_handshake_failures;
            let Some(stream) = handshake(acceptor, stream, &peer, failures).await else {
                return;
            };
            // A client certificate names the principal, as on the client
            // listeners (--ssl-principal-mapping-rules).
            let Some(certificate) = crate::server::principal::admit(
                &core.shared.config.ssl_principal_rules,
                stream.get_ref().1.peer_certificates(),
                failures,
                &peer,
                "OTLP",
            ) else {
                return;
            };
            let session = Session::with_principal(peer, security, Duration::ZERO, certificate);
            serve_connection(core, Io::new(stream, idle), receiver, session).await
        })
        .detach();
    }
}

/// One open connection of the core's count, given back on drop.
struct Open(Rc<Core>);

impl Open {
    fn count(core: &Rc<Core>) -> Open {
        core.connections.set(core.connections.get() + 1);
        let m = &core.metrics.connections;
        m.set(m.get() + 1);
        Open(core.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let c = &self.0.connections;
        c.set(c.get().saturating_sub(1));
    }
}

async fn serve_connection<S>(core: Rc<Core>, io: Io<S>, receiver: Receiver, session: Rc<Session>)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let (core, session) = (core.clone(), session.clone());
        async move { Ok::<_, Infallible>(answer(&core, receiver, &session, req).await) }
    });
    let served = match receiver {
        // Windows that let a whole export (hundreds of KiB) arrive
        // without waiting for WINDOW_UPDATEs (h2's default is 64 KiB).
        Receiver::Grpc => {
            hyper::server::conn::http2::Builder::new(LocalExec)
                .initial_stream_window_size(H2_STREAM_WINDOW)
                .initial_connection_window_size(H2_CONNECTION_WINDOW)
                .max_frame_size(H2_MAX_FRAME)
                .serve_connection(io, service)
                .await
        }
        Receiver::Http => {
            hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await
        }
    };
    if let Err(e) = served {
        tracing::debug!(receiver = receiver.name(), error = %e, "OTLP connection ended");
    }
}

/// The OTLP/gRPC receiver's HTTP/2 flow-control window per stream.
const H2_STREAM_WINDOW: u32 = 8 << 20;
/// … and per connection.
const H2_CONNECTION_WINDOW: u32 = 32 << 20;
/// The largest HTTP/2 frame the receiver accepts.
const H2_MAX_FRAME: u32 = 1 << 20;

/// Runs hyper's HTTP/2 stream tasks on this core.
#[derive(Clone, Copy)]
struct LocalExec;

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: Future + 'static,
    F::Output: 'static,
{
    fn execute(&self, fut: F) {
        glommio::spawn_local(fut).detach();
    }
}

/// A connection as hyper reads and writes it: the stream (plain or TLS),
/// a read buffer, and the idle limit — a client that sends nothing for
/// `idle` is cut off (a slow or stuck client holds nothing for long).
struct Io<S> {
    stream: S,
    buf: Box<[u8]>,
    idle: Duration,
    /// Runs from the first read that finds nothing; one timer for the
    /// connection's life, reset rather than made again.
    idle_timer: glommio::timer::Timer,
    /// `idle_timer` runs (no byte since it was reset).
    waiting: bool,
}

impl<S> Io<S> {
    fn new(stream: S, idle: Duration) -> Self {
        Io {
            stream,
            buf: vec![0; 64 << 10].into_boxed_slice(),
            idle,
            idle_timer: glommio::timer::Timer::new(idle),
            waiting: false,
        }
    }
}

impl<S: AsyncRead + Unpin> hyper::rt::Read for Io<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut cursor: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let n = cursor.remaining().min(this.buf.len());
        match Pin::new(&mut this.stream).poll_read(cx, &mut this.buf[..n]) {
            Poll::Ready(Ok(k)) => {
                cursor.put_slice(&this.buf[..k]);
                this.waiting = false;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let idle = this.idle;
                if !this.waiting {
                    this.idle_timer.reset(idle);
                    this.waiting = true;
                }
                match Pin::new(&mut this.idle_timer).poll(cx) {
                    Poll::Ready(_) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client sent nothing for {idle:?}"),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> hyper::rt::Write for Io<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_close(cx)
    }
}

/// An answer's body: at most one data frame, then (gRPC) trailers.
pub struct Reply {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(d) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match (&self.data, &self.trailers) {
            (Some(d), None) => http_body::SizeHint::with_exact(d.len() as u64),
            (None, None) => http_body::SizeHint::with_exact(0),
            _ => http_body::SizeHint::default(),
        }
    }
}

/// Why an export was not (wholly) taken; each maps to one HTTP status and
/// one gRPC code.
#[derive(Debug)]
enum Refusal {
    /// Bad data or a bad request: not retried.
    Invalid(String),
    /// Over a size limit: not retried.
    TooLarge(String),
    /// A content type, encoding, method or path not served.
    Unsupported(String),
    /// No such path (HTTP) or method (gRPC).
    NotFound(String),
    /// An HTTP method other than POST.
    NotAllowed(String),
    /// The node's buffer is full: retried after [`RETRY_DELAY`].
    Busy(String),
    /// Not now (no leader, too few in-sync replicas, a deadline passed,
    /// a missing topic): retried after [`RETRY_DELAY`].
    Unavailable(String),
    /// The body did not arrive in time.
    Timeout(String),
    /// The principal is over its `producer_byte_rate` quota: retried
    /// after the time its budget takes to be back within the rate.
    Throttled(String, Duration),
    /// A bearer token that does not verify: not retried.
    Unauthenticated(String),
    /// The ACLs refuse the principal Write on a topic: not retried.
    Denied(String),
}

impl Refusal {
    fn message(&self) -> &str {
        match self {
            Refusal::Invalid(m)
            | Refusal::TooLarge(m)
            | Refusal::Unsupported(m)
            | Refusal::NotFound(m)
            | Refusal::NotAllowed(m)
            | Refusal::Busy(m)
            | Refusal::Unavailable(m)
            | Refusal::Timeout(m)
            | Refusal::Unauthenticated(m)
            | Refusal::Denied(m)
            | Refusal::Throttled(m, _) => m,
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Refusal::Invalid(_) => StatusCode::BAD_REQUEST,
            Refusal::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::Unsupported(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Refusal::NotFound(_) => StatusCode::NOT_FOUND,
            Refusal::NotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Refusal::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
            Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            Refusal::Throttled(..) => StatusCode::TOO_MANY_REQUESTS,
            Refusal::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Refusal::Denied(_) => StatusCode::FORBIDDEN,
        }
    }

    /// The gRPC code, and whether a `RetryInfo` goes with it.
    fn grpc(&self) -> (i32, bool) {
        match self {
            Refusal::Invalid(_) => (code::INVALID_ARGUMENT, false),
            Refusal::TooLarge(_) => (code::RESOURCE_EXHAUSTED, false),
            Refusal::Unsupported(_) | Refusal::NotFound(_) | Refusal::NotAllowed(_) => {
                (code::UNIMPLEMENTED, false)
            }
            Refusal::Busy(_) => (code::RESOURCE_EXHAUSTED, true),
            Refusal::Unavailable(_) => (code::UNAVAILABLE, true),
            Refusal::Timeout(_) => (code::DEADLINE_EXCEEDED, false),
            Refusal::Throttled(..) => (code::RESOURCE_EXHAUSTED, true),
            Refusal::Unauthenticated(_) => (code::UNAUTHENTICATED, false),
            Refusal::Denied(_) => (code::PERMISSION_DENIED, false),
        }
    }

    fn retried(&self) -> bool {
        matches!(
            self,
            Refusal::Busy(_) | Refusal::Unavailable(_) | Refusal::Throttled(..)
        )
    }

    /// How long a "retry later" asks the exporter to wait.
    fn retry_after(&self) -> Duration {
        match self {
            Refusal::Throttled(_, d) => (*d).max(Duration::from_millis(1)),
            _ => RETRY_DELAY,
        }
    }
}

impl From<OtlpError> for Refusal {
    fn from(e: OtlpError) -> Self {
        match e {
            OtlpError::Malformed(_) | OtlpError::Json(_) => Refusal::Invalid(e.to_string()),
            OtlpError::TooLarge(m) => Refusal::TooLarge(m),
            OtlpError::Unsupported(m) => Refusal::Unsupported(m),
        }
    }
}

/// What an export came to: items refused for good (with why), if any.
#[derive(Debug, Default)]
struct Taken {
    rejected: u64,
    message: String,
}

async fn answer(
    core: &Rc<Core>,
    receiver: Receiver,
    connection: &Rc<Session>,
    req: Request<Incoming>,
) -> Response<Reply> {
    let path = req.uri().path();
    let signal = match receiver {
        Receiver::Grpc => Signal::from_grpc_path(path),
        Receiver::Http => Signal::from_http_path(path),
    };
    let r = match request_session(core, connection, req.headers()) {
        Err(refusal) => Err((Content::Protobuf, refusal)),
        Ok(session) => match receiver {
            Receiver::Grpc => grpc_answer(core, &session, req).await,
            Receiver::Http => http_answer(core, &session, req).await,
        },
    };
    if let Err((_, refusal)) = &r {
        let counter = if refusal.retried() {
            otlp_counter::RETRY_LATER
        } else {
            otlp_counter::REFUSED
        };
        core.metrics.otlp_add(counter, signal, 1);
        if refusal.retried() {
            tracing::debug!(
                receiver = receiver.name(),
                reason = refusal.message(),
                "OTLP export refused for now"
            );
        } else {
            tracing::info!(
                receiver = receiver.name(),
                reason = refusal.message(),
                "OTLP export refused"
            );
        }
    }
    match r {
        Ok(resp) => resp,
        Err((content, refusal)) => match receiver {
            Receiver::Grpc => grpc_refusal(&refusal),
            Receiver::Http => http_refusal(content, &refusal),
        },
    }
}

type Answer = Result<Response<Reply>, (Content, Refusal)>;

/// The request's principal: a bearer token's subject (checked against
/// `--sasl-oauthbearer-jwks-file`), else the connection's (its client
/// certificate's, or `User:ANONYMOUS`).
fn request_session(
    core: &Core,
    connection: &Rc<Session>,
    headers: &HeaderMap,
) -> Result<Rc<Session>, Refusal> {
    let Some(auth) = header(headers, http::header::AUTHORIZATION.as_str()) else {
        return Ok(connection.clone());
    };
    let token = match auth.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
        _ => {
            return Err(Refusal::Unauthenticated(
                "Authorization: only `Bearer <token>` is taken".into(),
            ))
        }
    };
    let Some(keys) = &core.shared.oauth else {
        return Err(Refusal::Unauthenticated(
            "a bearer token, but the broker checks none (--sasl-oauthbearer-jwks-file)".into(),
        ));
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match keys.verify(token, now) {
        Ok(v) => Ok(Session::with_principal(
            connection.peer.clone(),
            connection.protocol,
            Duration::ZERO,
            Some(format!("User:{}", v.subject)),
        )),
        Err(why) => {
            tracing::info!(peer = %connection.peer, why, "OTLP bearer token refused");
            Err(Refusal::Unauthenticated(
                "the bearer token was not accepted".into(),
            ))
        }
    }
}

async fn http_answer(core: &Rc<Core>, session: &Session, req: Request<Incoming>) -> Answer {
    let cfg = &core.shared.config.otlp;
    let deadline = Instant::now() + Duration::from_millis(cfg.timeout_ms);
    let fail = |r: Refusal| (Content::Protobuf, r);
    let path = req.uri().path().to_string();
    let Some(signal) = Signal::from_http_path(&path) else {
        return Err(fail(Refusal::NotFound(format!(
            "no OTLP endpoint at {path}: /v1/traces, /v1/metrics and /v1/logs"
        ))));
    };
    if req.method() != Method::POST {
        return Err(fail(Refusal::NotAllowed(format!(
            "{} {path}: OTLP exports are POSTed",
            req.method()
        ))));
    }
    let content_type = header(req.headers(), CONTENT_TYPE.as_str()).unwrap_or_default();
    let content = Content::from_content_type(&content_type).map_err(|e| fail(e.into()))?;
    let fail = |r: Refusal| (content, r);
    let encoding = header(req.headers(), CONTENT_ENCODING.as_str()).unwrap_or_default();
    let metadata = metadata_headers(req.headers(), &cfg.include_metadata_keys);
    let body = read_body(req, cfg.max_request_bytes, deadline)
        .await
        .map_err(fail)?;
    core.metrics.add_in(body.len());
    let body = weir_otlp::decompress(&encoding, body, cfg.max_request_bytes)
        .map_err(|e| fail(e.into()))?;
    let request = weir_otlp::decode_export(signal, content, body).map_err(|e| fail(e.into()))?;
    let taken = export(core, session, signal, &request, metadata, deadline)
        .await
        .map_err(fail)?;
    let body = weir_otlp::export_response(signal, content, taken.rejected, &taken.message);
    core.metrics.add_out(body.len());
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, content.content_type())
        .body(Reply {
            data: Some(body.into()),
            trailers: None,
        })
        .expect("a valid response"))
}

fn http_refusal(content: Content, r: &Refusal) -> Response<Reply> {
    let body = weir_otlp::status_body(content, r.grpc().0, r.message());
    let mut b = Response::builder()
        .status(r.status())
        .header(CONTENT_TYPE, content.content_type());
    if r.retried() {
        // Whole seconds, rounded up (HTTP's Retry-After).
        let secs = r.retry_after().as_secs_f64().ceil().max(1.0) as u64;
        b = b.header(RETRY_AFTER, secs);
    }
    if matches!(r, Refusal::NotAllowed(_)) {
        b = b.header(http::header::ALLOW, "POST");
    }
    b.body(Reply {
        data: Some(body.into()),
        trailers: None,
    })
    .expect("a valid response")
}

async fn grpc_answer(core: &Rc<Core>, session: &Session, req: Request<Incoming>) -> Answer {
    let cfg = &core.shared.config.otlp;
    // The client's own deadline, when it sends one and it is sooner: past
    // it, the client has stopped waiting for the answer.
    let timeout = header(req.headers(), "grpc-timeout")
        .and_then(|t| grpc::parse_timeout(&t))
        .map_or(Duration::from_millis(cfg.timeout_ms), |t| {
            t.min(Duration::from_millis(cfg.timeout_ms))
        });
    let deadline = Instant::now() + timeout;
    let fail = |r: Refusal| (Content::Protobuf, r);
    let content_type = header(req.headers(), CONTENT_TYPE.as_str()).unwrap_or_default();
    if !content_type.starts_with("application/grpc") {
        return Err(fail(Refusal::Unsupported(format!(
            "content-type {content_type:?}: OTLP/gRPC takes application/grpc"
        ))));
    }
    let path = req.uri().path().to_string();
    let Some(signal) = Signal::from_grpc_path(&path) else {
        return Err(fail(Refusal::NotFound(format!("no gRPC method {path}"))));
    };
    let encoding = header(req.headers(), "grpc-encoding").unwrap_or_default();
    let metadata = metadata_headers(req.headers(), &cfg.include_metadata_keys);
    let body = read_body(req, cfg.max_request_bytes + 5, deadline)
        .await
        .map_err(fail)?;
    core.metrics.add_in(body.len());
    let (compressed, _) = grpc::unframe(&body).map_err(|e| fail(e.into()))?;
    let message = body.slice(5..);
    let message = if compressed {
        if encoding.is_empty() || encoding == "identity" {
            return Err(fail(Refusal::Invalid(
                "a compressed gRPC message without a grpc-encoding".into(),
            )));
        }
        weir_otlp::decompress(&encoding, message, cfg.max_request_bytes)
    } else {
        weir_otlp::decompress("", message, cfg.max_request_bytes)
    }
    .map_err(|e| fail(e.into()))?;
    let request =
        weir_otlp::decode_export(signal, Content::Protobuf, message).map_err(|e| fail(e.into()))?;
    let taken = export(core, session, signal, &request, metadata, deadline)
        .await
        .map_err(fail)?;
    let reply =
        weir_otlp::export_response(signal, Content::Protobuf, taken.rejected, &taken.message);
    core.metrics.add_out(reply.len() + 5);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(code::OK));
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, "application/grpc")
        .body(Reply {
            data: Some(grpc::frame(&reply).into()),
            trailers: Some(trailers),
        })
        .expect("a valid response"))
}

/// A gRPC failure as a Trailers-Only answer: the status in the headers,
/// no body.
fn grpc_refusal(r: &Refusal) -> Response<Reply> {
    let (code, retry) = r.grpc();
    let mut b = Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, "application/grpc")
        .header("grpc-status", code)
        .header("grpc-message", grpc::percent_encode(r.message()));
    if matches!(r, Refusal::Unsupported(_)) {
        b = b.header("grpc-accept-encoding", "gzip,zstd,identity");
    }
    if retry {
        b = b.header(
            "grpc-status-details-bin",
            grpc::status_details(code, r.message(), Some(r.retry_after())),
        );
    }
    b.body(Reply {
        data: None,
        trailers: None,
    })
    .expect("a valid response")
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
}

/// The request headers `--otlp-include-metadata-keys` names, as record
/// headers (one per value, in the configured order).
fn metadata_headers(h: &HeaderMap, keys: &[String]) -> Vec<(String, Option<Bytes>)> {
    let mut out = Vec::new();
    for k in keys {
        for v in h.get_all(k.as_str()) {
            out.push((k.clone(), Some(Bytes::copy_from_slice(v.as_bytes()))));
        }
    }
    out
}

/// The whole body, at most `limit` bytes, by `deadline`.
async fn read_body(
    req: Request<Incoming>,
    limit: usize,
    deadline: Instant,
) -> Result<Bytes, Refusal> {
    let too_large = || Refusal::TooLarge(format!("the request body is larger than {limit} bytes"));
    let mut announced = 0;
    if let Some(len) = header(req.headers(), CONTENT_LENGTH.as_str()) {
        match len.parse::<u64>() {
            Ok(n) if n <= limit as u64 => announced = n as usize,
            _ => return Err(too_large()),
        }
    }
    let mut body = req.into_body();
    // A body that came in one frame is kept as it came (not copied).
    let mut first: Option<Bytes> = None;
    let mut out = bytes::BytesMut::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = futures_lite::future::or(async { Some(body.frame().await) }, async {
            glommio::timer::sleep(left).await;
            None
        })
        .await;
        match next {
            None => {
                return Err(Refusal::Timeout(
                    "the request body did not arrive before the export's deadline \
                     (--otlp-timeout-ms)"
                        .into(),
                ))
            }
            Some(None) => {
                return Ok(match first {
                    Some(only) if out.is_empty() => only,
                    _ => out.freeze(),
                })
            }
            Some(Some(Err(e))) => {
                return Err(Refusal::Invalid(format!("reading the request body: {e}")))
            }
            Some(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    let held = out.len() + first.as_ref().map_or(0, Bytes::len);
                    if held + data.len() > limit {
                        return Err(too_large());
                    }
                    match first.take() {
                        None if out.is_empty() => first = Some(data),
                        earlier => {
                            if out.is_empty() {
                                out.reserve(announced.max(held + data.len()));
                            }
                            if let Some(e) = earlier {
                                out.extend_from_slice(&e);
                            }
                            out.extend_from_slice(&data);
                        }
                    }
                }
            }
        }
    }
}

thread_local! {
    /// Export bytes this core holds (decoded, waiting for acknowledgement).
    static HELD: Cell<usize> = const { Cell::new(0) };
    /// The partition of the next export's unkeyed records, per topic
    /// (round-robin over exports).
    static NEXT_UNKEYED: Cell<u32> = const { Cell::new(0) };
}

/// Bytes of the node's buffer an export holds, given back on drop.
struct Held(usize);

impl Held {
    fn take(core: &Core, bytes: usize) -> Result<Held, Refusal> {
        let cfg = &core.shared.config.otlp;
        let budget = cfg.buffer_bytes / core.shared.config.cores.max(1);
        let held = HELD.with(Cell::get);
        // One export larger than the whole budget is still taken when
        // nothing else is held (else it could never be).
        if held > 0 && held + bytes > budget {
            return Err(Refusal::Busy(format!(
                "the node's OTLP buffer is full ({held} of {budget} bytes on this core held)"
            )));
        }
        HELD.with(|h| h.set(held + bytes));
        Ok(Held(bytes))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get().saturating_sub(self.0)));
    }
}

/// One partition's records of an export.
struct Part {
    topic: String,
    partition: u32,
    builder: BatchBuilder,
    items: u64,
}

/// Cuts a checked request into records, writes them with acks=all and
/// waits for their acknowledgements.
async fn export(
    core: &Rc<Core>,
    session: &Session,
    signal: Signal,
    request: &Bytes,
    headers: Vec<(String, Option<Bytes>)>,
    deadline: Instant,
) -> Result<Taken, Refusal> {
    let cfg = &core.shared.config.otlp;
    let (default_topic, cut) = cfg.of(signal);
    // Over its produce quota, a principal is told to retry later (an
    // exporter has no throttle time to honour, as a Kafka client has).
    let debt = quota::produce_debt(core, session);
    if !debt.is_zero() {
        let who = session.principal().unwrap_or_default();
        return Err(Refusal::Throttled(
            format!("{who} is over its producer_byte_rate quota for another {debt:?}"),
            debt,
        ));
    }
    let _held = Held::take(core, request.len() * 2)?;
    let records = weir_otlp::cut(signal, request, cut)?;
    if records.is_empty() {
        return Ok(Taken::default());
    }
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let unkeyed = NEXT_UNKEYED.with(|n| {
        let v = n.get();
        n.set(v.wrapping_add(1));
        v
    });
    let mut parts: Vec<Part> = Vec::new();
    // Per export: each topic's ACL check and partition count once, each
    // (topic, partition)'s batch found without a scan.
    let mut topics: HashMap<String, u32> = HashMap::new();
    let mut part_of: HashMap<(String, u32), usize> = HashMap::new();
    for OtlpRecord {
        topic,
        key,
        value,
        items,
    } in records
    {
        let topic = topic.unwrap_or_else(|| default_topic.to_string());
        let partitions = match topics.get(&topic) {
            Some(&n) => n,
            None => {
                acl::check(core, session, Op::Write, Resource::Topic(&topic))
                    .map_err(|e| Refusal::Denied(e.to_string()))?;
                let n = topic_partitions(core, session, &topic).await?;
                topics.insert(topic.clone(), n);
                n
            }
        };
        let partition = match &key {
            Some(k) => weir_client::partitioner::partition_for_key(k, partitions),
            None => unkeyed % partitions,
        };
        let record = RecordData {
            key: key.map(Bytes::from),
            value: Some(value),
            headers: headers.clone(),
            timestamp: now_ms,
        };
        let i = match part_of.get(&(topic.clone(), partition)) {
            Some(&i) => i,
            None => {
                let builder = BatchBuilder::new(cfg.compression)
                    .map_err(|e| Refusal::Invalid(format!("record batch: {e}")))?;
                part_of.insert((topic.clone(), partition), parts.len());
                parts.push(Part {
                    topic,
                    partition,
                    builder,
                    items: 0,
                });
                parts.len() - 1
            }
        };
        parts[i]
            .builder
            .push(&record)
            .map_err(|e| Refusal::TooLarge(format!("a record of the export: {e}")))?;
        parts[i].items += items;
    }
    let mut items = Vec::with_capacity(parts.len());
    let mut produce_parts = Vec::with_capacity(parts.len());
    for p in parts {
        let data = p
            .builder
            .finish()
            .map_err(|e| Refusal::TooLarge(format!("the export's record batch: {e}")))?
            .freeze();
        items.push(p.items);
        produce_parts.push(ProducePart {
            topic: p.topic,
            partition: p.partition,
            data: Ok(data),
            transaction: None,
            adds_to_txn: false,
        });
    }
    // The export's batches spend the principal's produce budget, as a
    // produce request's do (those handed on to other nodes too: the
    // principal's quota is this node's to keep).
    quota::spend_produce(core, session, &produce_parts);
    let timeout = deadline.saturating_duration_since(Instant::now());
    // A partition another node leads: its batch is handed on to that
    // node (an exporter, unlike a Kafka client, cannot be told to go
    // there); the rest are written here.
    let me = core.shared.config.cluster.node_id;
    let (mut here, mut here_items) = (Vec::new(), Vec::new());
    let mut handed_on = Vec::new();
    for (p, n) in produce_parts.into_iter().zip(items) {
        match core.locate(&p.topic, p.partition) {
            Err(BrokerError::NotLeader { leader, .. }) if leader != 0 && leader != me => {
                let core = core.clone();
                handed_on.push(glommio::spawn_local(async move {
                    let r = hand_on(&core, signal, leader, p, timeout).await;
                    (r, n)
                }));
            }
            _ => {
                here.push(p);
                here_items.push(n);
            }
        }
    }
    let acked = produce(core, here, -1, Some(timeout), Ctx { owner_only: false })
        .await
        .map_err(|e| refusal_of(&e))?;
    let mut outcomes: Vec<(PartOutcome, u64)> = acked
        .await
        .into_iter()
        .zip(here_items)
        .map(|((topic, partition, r), n)| {
            let r = r.map(|_| ()).map_err(|e| PartError {
                retriable: e.code().is_retriable(),
                message: format!("{topic}-{partition}: {e}"),
            });
            (r, n)
        })
        .collect();
    for t in handed_on {
        outcomes.push(t.await);
    }
    let mut taken = Taken::default();
    let mut retry: Option<String> = None;
    let written: u64 = outcomes.iter().map(|(_, n)| n).sum();
    for (r, n) in outcomes {
        let Err(e) = r else { continue };
        if e.retriable {
            retry.get_or_insert(e.message);
        } else {
            taken.rejected += n;
            if taken.message.is_empty() {
                taken.message = e.message;
            }
        }
    }
    // A part that may succeed later fails the whole export: the exporter
    // sends it again (OTLP is at-least-once; written parts come twice).
    if let Some(why) = retry {
        return Err(Refusal::Unavailable(why));
    }
    let total: u64 = weir_otlp::records::count_request_items(signal, request)?;
    if taken.rejected > 0 && taken.rejected >= total {
        return Err(Refusal::Invalid(taken.message));
    }
    let m = &core.metrics;
    m.otlp_add(otlp_counter::EXPORTS, Some(signal), 1);
    let items = written.saturating_sub(taken.rejected);
    m.otlp_add(otlp_counter::ITEMS, Some(signal), items);
    Ok(taken)
}

/// Why one partition's batch of an export was not written.
struct PartError {
    /// It may be written later: the exporter is told to send the export
    /// again.
    retriable: bool,
    message: String,
}

type PartOutcome = Result<(), PartError>;

/// Hands one partition's batch on to `node`, its leader, over the
/// replication data plane (`DataRequest::Produce`), waiting at most
/// `timeout` for its acknowledgement there.
async fn hand_on(
    core: &Rc<Core>,
    signal: Signal,
    node: u64,
    p: ProducePart,
    timeout: Duration,
) -> PartOutcome {
    let tp = (p.topic, p.partition);
    let failed = |retriable: bool, why: String| PartError {
        retriable,
        message: format!("{}-{} (led by node {node}): {why}", tp.0, tp.1),
    };
    let Ok(batch) = p.data else {
        return Err(failed(false, "no batch".into()));
    };
    if batch.len() > weir_replication::data::PRODUCE_BYTES_MAX {
        return Err(failed(
            false,
            format!(
                "a batch of {} bytes is more than the {} one node hands another",
                batch.len(),
                weir_replication::data::PRODUCE_BYTES_MAX
            ),
        ));
    }
    core.metrics
        .otlp_add(otlp_counter::FORWARDED, Some(signal), 1);
    let timeout_ms = timeout.as_millis().min(u128::from(u32::MAX)) as u32;
    let sent = async {
        let link = crate::replica::link_to(core, node, &tp)
            .await
            .map_err(|why| failed(true, why))?;
        link.produce((&tp.0, tp.1), batch, timeout_ms)
            .await
            .map_err(|e| failed(true, e.chain().to_string()))
    };
    // The leader answers within `timeout`; a node gone silent is waited
    // for a second longer, then the export is retried.
    let gone = async {
        glommio::timer::sleep(timeout + Duration::from_secs(1)).await;
        Err(failed(true, format!("no answer within {timeout:?}")))
    };
    let r = futures_lite::future::or(sent, gone).await?;
    if r.error == 0 {
        return Ok(());
    }
    let code = weir_proto::error_code::ErrorCode::from_u16(r.error);
    Err(failed(
        code.is_retriable(),
        r.message.unwrap_or_else(|| format!("{code:?}")),
    ))
}

fn refusal_of(e: &BrokerError) -> Refusal {
    if e.code().is_retriable() {
        Refusal::Unavailable(e.to_string())
    } else {
        Refusal::Invalid(e.to_string())
    }
}

/// The partitions of an OTLP topic, created first if it is missing,
/// `--otlp-create-topics` is on and the principal may create it (Create
/// on the cluster or the topic, as Kafka's auto-creation asks).
async fn topic_partitions(core: &Rc<Core>, session: &Session, topic: &str) -> Result<u32, Refusal> {
    if let Some(m) = core.metadata().get(topic) {
        return Ok(m.partitions().max(1));
    }
    let Some(partitions) = core.shared.config.otlp.create_topics else {
        return Err(Refusal::Unavailable(format!(
            "topic {topic} does not exist: create it (`weir topic create {topic}`), or start \
             the broker with --otlp-create-topics true"
        )));
    };
    if !acl::allowed(core, session, Op::Create, Resource::Cluster) {
        acl::check(core, session, Op::Create, Resource::Topic(topic)).map_err(|e| {
            Refusal::Denied(format!(
                "topic {topic} does not exist, and creating it: {e}"
            ))
        })?;
    }
    let spec = TopicSpec::new(partitions, BTreeMap::new());
    match writer::submit(core, Change::Create(topic.into(), spec)).await {
        Ok(_) | Err(TopicError::Exists(_)) => {}
        Err(TopicError::InvalidName(e)) => {
            return Err(Refusal::Invalid(format!("topic {topic}: {e}")))
        }
        Err(e) => return Err(Refusal::Unavailable(format!("creating topic {topic}: {e}"))),
    }
    match core.metadata().get(topic) {
        Some(m) => Ok(m.partitions().max(1)),
        None => Err(Refusal::Unavailable(format!(
            "topic {topic} is being created"
        ))),
    }
}
