//! One connection, whatever its protocol: read whole frames, dispatch
//! each request through the protocol's codec ([`Protocol`]), write the
//! answers in request order.
//!
//! Requests on one connection are started and answered in order, and up to
//! [`PIPELINE_MAX`] of them can be in progress at once. A frame that is too
//! large or cannot be parsed gets an error answer and the connection is
//! closed (its framing can no longer be trusted); a request with a bad body,
//! an unknown API or version gets an error answer and the connection stays
//! open. Nothing here can affect another connection.
//!
//! **Bounds.** Bytes are taken from the core's in-flight budget
//! ([`INFLIGHT_BYTES_PER_CORE`](crate::server::limits::INFLIGHT_BYTES_PER_CORE))
//! as they arrive — [`READ_CHUNK_BYTES`] before each read — never for a
//! frame's declared length up front, so a client that declares a large
//! frame and sends nothing holds one chunk, not the frame. Once a frame's
//! first byte has arrived, the rest must arrive within
//! `--frame-read-timeout-ms`, or the connection is closed. When the client
//! closes its side, long polls in progress are dropped (cancelled) instead
//! of waited for.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::sync::Semaphore;
use weir_proto::api::ApiKey;
use weir_proto::error_code::ErrorCode;
use weir_proto::frame;

use crate::server::limits::{
    CLOSE_LINGER_MS, FRAME_RESERVE_AHEAD_BYTES, PIPELINE_MAX, READ_CHUNK_BYTES,
};
use crate::service::auth::Session;
use crate::service::quota;
use crate::service::Ctx;
use crate::shard::quotas::Kind;
use crate::shard::Core;

/// What to send back: the frame head and any payload pieces (cached
/// batches, sent without copying).
pub struct Answer {
    /// Header and body.
    pub head: BytesMut,
    /// Payload pieces, in order.
    pub payload: Vec<Bytes>,
    /// Close the connection after sending.
    pub close: bool,
}

impl Answer {
    /// An answer without payload.
    pub fn plain(head: BytesMut) -> Answer {
        Answer {
            head,
            payload: Vec::new(),
            close: false,
        }
    }

    /// A frame-level error (native protocol).
    pub fn error(correlation_id: u32, code: ErrorCode, message: &str, close: bool) -> Answer {
        let head = frame::encode_error_response(correlation_id, code, message)
            .unwrap_or_else(|_| BytesMut::new());
        Answer {
            head,
            payload: Vec::new(),
            close,
        }
    }
}

/// A request in progress.
pub enum Pending {
    /// Answered.
    Ready(Answer),
    /// Still running (a produce waiting for acknowledgements, a fetch).
    Later(glommio::Task<Answer>),
    /// Computed when its turn to be written comes, after every earlier
    /// answer of the connection: for answers that describe the cluster
    /// (Metadata, FindCoordinator), which must be as of sending — one
    /// computed on arrival and held behind a slow `acks=all` produce could
    /// name a leader deposed meanwhile, and a client cannot tell it from a
    /// fresh one. Kafka gets the same by serving a connection's requests
    /// one at a time.
    AtTurn(Box<dyn FnOnce() -> LocalBoxFuture<Answer>>),
}

/// A future on this core.
pub type LocalBoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T>>>;

impl Pending {
    /// The answer, once there is one.
    pub async fn answer(self) -> Answer {
        match self {
            Pending::Ready(a) => a,
            Pending::Later(t) => t.await,
            Pending::AtTurn(f) => f().await,
        }
    }
}

/// A wire protocol: how to find a frame in the bytes read, and how to
/// serve one.
pub trait Protocol: Copy + 'static {
    /// The length of the first frame in `buf` once its header is there
    /// (`None`: not yet), or the answer that closes the connection (bad
    /// framing, too large).
    fn frame_len(&self, buf: &[u8], max: usize) -> Result<Option<usize>, (u32, Answer)>;
    /// The API of a whole frame, for metrics (and for long polls, which a
    /// closing connection cancels).
    fn api_of(&self, frame: &[u8]) -> Option<ApiKey>;
    /// Whether an answer reports an error, for metrics.
    fn is_error(&self, answer: &Answer) -> bool;
    /// Decodes one request and starts serving it (see
    /// [`crate::listener::native::dispatch`]).
    fn dispatch(
        &self,
        core: &Rc<Core>,
        request: Bytes,
        ctx: Ctx,
        session: &Rc<Session>,
    ) -> impl std::future::Future<Output = Pending>;
}

/// Bytes of a core's in-flight budget held by one connection or request;
/// given back when dropped.
struct Held {
    sem: Rc<Semaphore>,
    bytes: u64,
}

impl Held {
    fn new(sem: &Rc<Semaphore>) -> Held {
        Held {
            sem: sem.clone(),
            bytes: 0,
        }
    }

    /// Takes `n` more bytes (waits while the core's budget is spent).
    async fn grow(&mut self, n: u64) -> bool {
        if self.sem.acquire(n).await.is_err() {
            return false;
        }
        self.bytes += n;
        true
    }

    /// Moves `n` of the held bytes (at most all) to a new holder.
    fn split(&mut self, n: u64) -> Held {
        let n = n.min(self.bytes);
        self.bytes -= n;
        Held {
            sem: self.sem.clone(),
            bytes: n,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.sem.signal(self.bytes);
        }
    }
}

/// A request whose answer the writer waits for.
struct InFlight {
    pending: Pending,
    api: Option<ApiKey>,
    started: Instant,
    /// The request's share of the core's in-flight budget, given back once
    /// answered.
    _held: Option<Held>,
}

/// Serves one connection until it closes. `ctx` says which listener it came
/// through, `session` who the client is (on a SASL_* listener, a client
/// that has not logged in within the deadline is closed).
///
/// Requests are read and started in order (a produce's batches are
/// appended before the next request is read); their answers are awaited
/// concurrently, up to [`PIPELINE_MAX`] at a time, and written in request
/// order by a writer task.
pub async fn serve<P: Protocol, S>(
    core: Rc<Core>,
    proto: P,
    stream: S,
    session: Rc<Session>,
    active: Rc<Cell<usize>>,
    ctx: Ctx,
) where
    S: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin + 'static,
{
    let peer = session.peer.clone();
    let (mut reader, writer) = futures_lite::io::split(stream);
    let (tx, rx) = local_channel::new_bounded::<InFlight>(PIPELINE_MAX);
    // Closed when the client's side ends: the writer then drops long polls.
    let closed = Rc::new(Semaphore::new(0));
    let write_task = glommio::spawn_local(write_answers(
        core.clone(),
        proto,
        writer,
        rx,
        active.clone(),
        closed.clone(),
        peer.clone(),
    ));
    let max = core.shared.config.max_frame_bytes as usize;
    let frame_timeout = Duration::from_millis(core.shared.config.frame_read_timeout_ms);
    let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let mut held = Held::new(&core.inflight);
    'requests: loop {
        // Read until one whole frame is buffered, taking budget as bytes
        // arrive. The frame's deadline starts with its first byte.
        let mut frame_start = (!buf.is_empty()).then(Instant::now);
        let need = loop {
            match proto.frame_len(&buf, max) {
                Ok(Some(n)) if buf.len() >= n => break Some(n),
                Ok(Some(n)) => {
                    // Room for the frame, at most FRAME_RESERVE_AHEAD_BYTES
                    // beyond what arrived: a typical request is read without
                    // reallocating, a large declared length costs nothing
                    // until its bytes come.
                    let want = n.min(buf.len() + FRAME_RESERVE_AHEAD_BYTES);
                    if buf.capacity() < want {
                        buf.reserve(want - buf.len());
                    }
                }
                Ok(None) => {}
                Err((_, answer)) => {
                    tracing::warn!(%peer, "closing connection: bad frame");
                    active.set(active.get() + 1);
                    let _ = tx
                        .send(InFlight {
                            pending: Pending::Ready(answer),
                            api: None,
                            started: Instant::now(),
                            _held: None,
                        })
                        .await;
                    break None;
                }
            }
            if core.shared.stopping() {
                break None;
            }
            if held.bytes < (buf.len() + READ_CHUNK_BYTES) as u64
                && !held.grow(READ_CHUNK_BYTES as u64).await
            {
                break None;
            }
            // The frame's deadline, and the login's while there is none.
            let frame_deadline = frame_start.map(|t0| t0 + frame_timeout);
            let login_deadline = session.login_deadline();
            let deadline = match (frame_deadline, login_deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let read = match deadline {
                None => Some(reader.read(&mut chunk).await),
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    futures_lite::future::or(async { Some(reader.read(&mut chunk).await) }, async {
                        glommio::timer::sleep(left).await;
                        None
                    })
                    .await
                }
            };
            match read {
                None if login_deadline.is_some_and(|l| Some(l) == deadline) => {
                    session.failed(
                        &core,
                        "no SASL login within --sasl-login-timeout-ms of connecting",
                    );
                    break None;
                }
                None => {
                    core.metrics
                        .frame_timeouts
                        .set(core.metrics.frame_timeouts.get() + 1);
                    tracing::warn!(
                        %peer,
                        buffered = buf.len(),
                        timeout_ms = frame_timeout.as_millis() as u64,
                        "closing connection: a frame did not arrive whole within the frame read timeout"
                    );
                    break None;
                }
                Some(Ok(0)) => break None,
                Some(Ok(n)) => {
                    buf.extend_from_slice(&chunk[..n]);
                    frame_start.get_or_insert_with(Instant::now);
                }
                Some(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "connection read failed");
                    break None;
                }
            }
        };
        let Some(need) = need else { break 'requests };
        let request = buf.split_to(need).freeze();
        let share = held.split(need as u64);
        core.metrics.add_in(request.len());
        let api = proto.api_of(&request);
        // A throttled client (over a quota) is served nothing until its
        // throttle time has passed.
        if let Some(until) = session.quotas.muted_until() {
            glommio::timer::sleep(until.saturating_duration_since(Instant::now())).await;
        }
        let started = Instant::now();
        active.set(active.get() + 1);
        let pending = proto.dispatch(&core, request, ctx, &session).await;
        // The core's time on the request: reading, checking, starting it
        // (a produce's appends; not a fetch's wait).
        quota::record(
            &core,
            &session,
            Kind::Request,
            started.elapsed().as_micros() as f64,
        );
        // An answer that closes the connection (a failed login, a request
        // before one): nothing after it is read.
        let last = matches!(&pending, Pending::Ready(a) if a.close);
        let item = InFlight {
            pending,
            api,
            started,
            _held: Some(share),
        };
        if tx.send(item).await.is_err() {
            // The writer stopped (write failed, or an answer closed the
            // connection).
            active.set(active.get() - 1);
            break 'requests;
        }
        if last {
            break 'requests;
        }
    }
    closed.close();
    drop(tx);
    write_task.await;
}

/// Writes answers in request order until the reader is done or a write
/// fails. Once the client's side is closed, a long poll still waiting is
/// dropped (its waits cancelled) rather than waited for.
async fn write_answers<P: Protocol, S: futures_lite::AsyncWrite + Unpin>(
    core: Rc<Core>,
    proto: P,
    mut writer: futures_lite::io::WriteHalf<S>,
    rx: local_channel::LocalReceiver<InFlight>,
    active: Rc<Cell<usize>>,
    closed: Rc<Semaphore>,
    peer: String,
) {
    let mut failed = false;
    while let Some(item) = rx.recv().await {
        let cancellable = item.api == Some(ApiKey::Fetch);
        let answer = if cancellable {
            futures_lite::future::or(async { Some(item.pending.answer().await) }, async {
                // Resolves once the reader closed the semaphore.
                let _ = closed.acquire(1).await;
                None
            })
            .await
        } else {
            Some(item.pending.answer().await)
        };
        active.set(active.get() - 1);
        let Some(answer) = answer else {
            continue;
        };
        if failed {
            continue;
        }
        if let Some(api) = item.api {
            core.metrics.record(
                api,
                item.started.elapsed().as_micros() as u64,
                proto.is_error(&answer),
            );
        }
        core.metrics
            .add_out(answer.head.len() + answer.payload.iter().map(|p| p.len()).sum::<usize>());
        let close = answer.close;
        if let Err(e) = send(&mut writer, answer).await {
            tracing::debug!(%peer, error = %e, "connection write failed");
            failed = true;
        }
        if close && !failed {
            // Let the client read the answer before the close reaches it
            // (kafka-python drops what it has not read when a TLS close
            // arrives with it).
            glommio::timer::sleep(Duration::from_millis(CLOSE_LINGER_MS)).await;
        }
        if close {
            failed = true;
        }
        if failed {
            // Shut the socket so that the reader stops too; requests already
            // started still finish (their effects are not undone).
            let _ = writer.close().await;
        }
    }
}

async fn send<W: futures_lite::AsyncWrite + Unpin>(
    stream: &mut W,
    a: Answer,
) -> std::io::Result<()> {
    stream.write_all(&a.head).await?;
    for p in &a.payload {
        stream.write_all(p).await?;
    }
    stream.flush().await
}
