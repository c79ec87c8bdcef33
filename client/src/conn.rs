//! The client's connection: one TCP connection to a broker, shared by
//! concurrent calls (pipelined).
//!
//! A [`Pipeline`] holds the current connection (or none: the next call
//! opens one) behind a tokio [`Mutex`], whose FIFO queue orders the
//! requests. A call takes the lock (its first await), a slot of the
//! connection's in-flight budget ([`ClientConfig::max_in_flight`]) and a
//! correlation id, registers a waiter for its answer, writes its frame
//! (head and payload pieces, with vectored writes, without copying them)
//! and releases the lock; then it waits for its answer. A reader task per
//! connection reads whole frames and hands each to the waiter of its
//! correlation id; answers nobody waits for (acks=0 produce requests,
//! cancelled calls) are dropped.
//!
//! Once a connection fails (I/O or protocol error, a timeout, half a frame
//! written) every waiter on it gets an error, and the next call opens a new
//! connection.

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::{Arc, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::tls::{ReadHalf, TlsSettings, WriteHalf};
use tokio::sync::{oneshot, Mutex, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use weir_proto::error_code::ErrorCode;
use weir_proto::frame::{self, Message, RequestHeader, FRAME_LEN_BYTES};
use weir_proto::messages::{
    Request, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
};
use weir_proto::sasl::{Mechanism, ScramClient};

use crate::error::{ClientError, Result};
use crate::ClientConfig;

/// Most slices handed to one `writev` (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// Read buffer of a connection.
const READ_BUFFER_BYTES: usize = 64 << 10;

/// Offset of a request frame's correlation id.
const OFF_REQUEST_CORRELATION_ID: usize = 8;

/// What an answer's waiter receives: the whole frame, or why the
/// connection failed.
type Reply = Result<Bytes>;

/// The connection of a [`crate::Client`]: opened on first use, reopened on
/// the next call after a failure.
pub(crate) struct Pipeline {
    addr: SocketAddr,
    /// TLS: its configuration (or why there is none), and its settings.
    tls: Option<(
        std::result::Result<Arc<rustls::ClientConfig>, String>,
        TlsSettings,
    )>,
    /// SASL: who logs in on each new connection (or why nobody can).
    sasl: Option<std::result::Result<crate::sasl::SaslSettings, String>>,
    connect_timeout: Duration,
    max_frame_bytes: usize,
    max_in_flight: usize,
    slot: Arc<Mutex<Slot>>,
    /// When the login should be renewed (KIP-368: the broker's session
    /// lifetime, 85 % of it), if the broker gave one.
    reauth_at: std::sync::Mutex<Option<Instant>>,
    /// A re-authentication is under way.
    reauthing: std::sync::atomic::AtomicBool,
}

/// When to log in again, for a login that holds `lifetime`: at 85 % of
/// it (Kafka's clients pick 85–95 %), so that the new login is in before
/// the broker closes the connection.
fn renew_at(lifetime: Option<Duration>) -> Option<Instant> {
    lifetime.map(|l| Instant::now() + l.mul_f64(0.85))
}

/// The state behind the pipeline's lock.
struct Slot {
    /// The correlation id of the next request (across connections).
    next_corr: u32,
    /// `None` before the first call and after a failure was noticed.
    conn: Option<Conn>,
}

/// One open connection: its write half (used under the pipeline's lock)
/// and what it shares with its reader task and its callers.
struct Conn {
    write: WriteHalf,
    shared: Arc<Shared>,
}

impl Drop for Conn {
    /// Dropping the connection fails whatever still waits on it and stops
    /// its reader (which drops the read half: the socket is closed).
    fn drop(&mut self) {
        self.shared.fail(ClientError::Disconnected);
    }
}

/// What a connection's callers and its reader task share.
struct Shared {
    routes: std::sync::Mutex<Routes>,
    /// One permit per request that may await an answer at once.
    slots: Arc<Semaphore>,
    /// Tells the reader task to stop (stored if it is not waiting).
    stop: Notify,
}

struct Routes {
    /// Callers waiting for an answer, by correlation id. Each holds one of
    /// the connection's slots until its answer arrives, even if the caller
    /// went away.
    waiting: HashMap<u32, Waiter>,
    /// One past the last correlation id sent: an answer to a later one is a
    /// protocol violation.
    next_corr: u32,
    /// Set once the connection failed: nothing more is sent on it.
    failed: bool,
}

struct Waiter {
    tx: oneshot::Sender<Reply>,
    _slot: OwnedSemaphorePermit,
}

/// The connection failed while a call was getting ready to send on it.
struct Failed;

impl Shared {
    fn new(max_in_flight: usize, next_corr: u32) -> Shared {
        Shared {
            routes: std::sync::Mutex::new(Routes {
                waiting: HashMap::new(),
                next_corr,
                failed: false,
            }),
            slots: Arc::new(Semaphore::new(
                max_in_flight.clamp(1, Semaphore::MAX_PERMITS),
            )),
            stop: Notify::new(),
        }
    }

    fn routes(&self) -> MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_failed(&self) -> bool {
        self.routes().failed
    }

    /// Notes that `corr` is about to be sent and, with a slot, registers a
    /// waiter for its answer.
    fn register(
        &self,
        corr: u32,
        slot: Option<OwnedSemaphorePermit>,
    ) -> std::result::Result<Option<oneshot::Receiver<Reply>>, Failed> {
        let mut r = self.routes();
        if r.failed {
            return Err(Failed);
        }
        r.next_corr = corr.wrapping_add(1);
        Ok(slot.map(|slot| {
            let (tx, rx) = oneshot::channel();
            r.waiting.insert(corr, Waiter { tx, _slot: slot });
            rx
        }))
    }

    /// Hands an answer to its waiter, or drops it if nobody waits for it
    /// (acks=0, a cancelled call). An answer to a request not sent yet is
    /// an error.
    fn deliver(&self, frame: Bytes) -> Result<()> {
        let corr = response_correlation_id(&frame)
            .ok_or_else(|| ClientError::InvalidResponse("answer shorter than its header".into()))?;
        let mut r = self.routes();
        if let Some(w) = r.waiting.remove(&corr) {
            let _ = w.tx.send(Ok(frame));
            Ok(())
        } else if is_earlier(corr, r.next_corr) {
            Ok(())
        } else {
            Err(ClientError::InvalidResponse(format!(
                "answer with correlation id {corr}, which was not sent"
            )))
        }
    }

    /// Whether the answer to `corr` is still awaited.
    fn is_waiting(&self, corr: u32) -> bool {
        self.routes().waiting.contains_key(&corr)
    }

    /// Stops waiting for the answer to `corr`.
    fn forget(&self, corr: u32) {
        self.routes().waiting.remove(&corr);
    }

    /// Marks the connection failed: every waiter gets (a copy of) `e`, no
    /// caller waits for a slot any more, the reader task stops. Only the
    /// first call has an effect.
    fn fail(&self, e: ClientError) {
        let waiting = {
            let mut r = self.routes();
            if r.failed {
                return;
            }
            r.failed = true;
            std::mem::take(&mut r.waiting)
        };
        for (_, w) in waiting {
            let _ = w.tx.send(Err(e.duplicate()));
        }
        self.slots.close();
        self.stop.notify_one();
    }
}

/// Fails the connection if dropped armed: a call dropped while writing its
/// frame leaves half a frame on the connection.
struct FailOnDrop<'a>(Option<&'a Shared>);

impl Drop for FailOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(shared) = self.0 {
            shared.fail(ClientError::Disconnected);
        }
    }
}

/// Armed while a call waits for its answer. If the call is dropped, its
/// answer is discarded when it arrives; if none arrives by the call's
/// deadline the connection is failed, as if the call had timed out (so
/// that abandoned requests cannot hold the connection's slots forever).
struct Abandoned {
    shared: Option<Arc<Shared>>,
    corr: u32,
    deadline: Instant,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        if !shared.is_waiting(self.corr) {
            return;
        }
        let (corr, deadline) = (self.corr, self.deadline);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    tokio::time::sleep_until(deadline).await;
                    if shared.is_waiting(corr) {
                        shared.fail(ClientError::Disconnected);
                    }
                });
            }
            // No runtime to watch the deadline on: give the connection up.
            Err(_) => shared.fail(ClientError::Disconnected),
        }
    }
}

impl Pipeline {
    /// A pipeline to `addr` that connects on first use.
    pub(crate) fn new(addr: SocketAddr, config: &ClientConfig) -> Pipeline {
        let tls = config
            .security_protocol
            .tls()
            .then(|| (config.tls_built.get(&config.tls), config.tls.clone()));
        Pipeline {
            addr,
            tls,
            sasl: config.sasl(),
            connect_timeout: config.connect_timeout,
            max_frame_bytes: config.max_frame_bytes,
            max_in_flight: config.max_in_flight,
            slot: Arc::new(Mutex::new(Slot {
                next_corr: 1,
                conn: None,
            })),
            reauth_at: std::sync::Mutex::new(None),
            reauthing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// KIP-368: once the login is due for renewal, logs in again on the
    /// open connection, in the background (its messages go through the
    /// pipeline like any request, so nothing waits and nothing is
    /// reordered). A renewal that fails is logged; the broker then closes
    /// the connection when the login expires and the next call opens a
    /// new one (and logs in there). Synchronous: the caller keeps its
    /// place in the pipeline.
    pub(crate) fn reauthenticate_if_due(self: &Arc<Self>) {
        // Every call passes here: nothing to look at without SASL.
        let Some(Ok(settings)) = &self.sasl else {
            return;
        };
        let due = self
            .reauth_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|t| Instant::now() >= t);
        if !due
            || self
                .reauthing
                .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        let settings = settings.clone();
        let p = self.clone();
        let run = async move {
            let mut wire = Piped { p: &p };
            let renewed = sasl_login(&mut wire, &settings).await;
            let next = match renewed {
                Ok(lifetime) => renew_at(lifetime),
                Err(e) => {
                    tracing::warn!(broker = %p.addr, error = %e, "SASL re-authentication failed");
                    None
                }
            };
            *p.reauth_at.lock().unwrap_or_else(PoisonError::into_inner) = next;
            p.reauthing
                .store(false, std::sync::atomic::Ordering::Release);
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(run);
        } else {
            self.reauthing
                .store(false, std::sync::atomic::Ordering::Release);
        }
    }

    /// Opens the connection now unless one is open.
    pub(crate) async fn connect(&self) -> Result<()> {
        let mut slot = self.slot.lock().await;
        if slot.conn.as_ref().is_none_or(|c| c.shared.is_failed()) {
            slot.conn = None;
            let conn = self.open(slot.next_corr).await?;
            slot.conn = Some(conn);
        }
        Ok(())
    }

    async fn open(&self, next_corr: u32) -> Result<Conn> {
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(self.addr))
            .await
            .map_err(|_| ClientError::Timeout(self.connect_timeout))??;
        stream.set_nodelay(true)?;
        let (read, write) = match &self.tls {
            None => crate::tls::plain(stream),
            Some((Err(why), _)) => return Err(ClientError::Tls(why.clone())),
            Some((Ok(config), settings)) => {
                let handshake =
                    crate::tls::connect(config.clone(), settings, self.addr.ip(), stream);
                tokio::time::timeout(self.connect_timeout, handshake)
                    .await
                    .map_err(|_| ClientError::Timeout(self.connect_timeout))??
            }
        };
        let (mut write, mut read) = (write, BufReader::with_capacity(READ_BUFFER_BYTES, read));
        match &self.sasl {
            None => {}
            Some(Err(why)) => return Err(ClientError::Authentication(why.clone())),
            Some(Ok(s)) => {
                let mut wire = Raw {
                    r: &mut read,
                    w: &mut write,
                    corr: next_corr,
                    max_frame_bytes: self.max_frame_bytes,
                };
                let login = sasl_login(&mut wire, s);
                let lifetime = tokio::time::timeout(self.connect_timeout, login)
                    .await
                    .map_err(|_| ClientError::Timeout(self.connect_timeout))??;
                *self
                    .reauth_at
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = renew_at(lifetime);
            }
        }
        let shared = Arc::new(Shared::new(self.max_in_flight, next_corr));
        tokio::spawn(read_answers(
            read,
            shared.clone(),
            Arc::downgrade(&self.slot),
            self.max_frame_bytes,
        ));
        Ok(Conn { write, shared })
    }

    /// Sends a request (`head`, encoded with any correlation id, then the
    /// `payload` pieces) and, if `expect_answer`, waits for its answer and
    /// decodes it with `decode`. `limit` bounds the exchange from when the
    /// request starts being written.
    ///
    /// Requests are sent in the order the calls reached the connection:
    /// taking the pipeline's lock is this function's first await, and the
    /// lock's queue is FIFO.
    pub(crate) async fn exchange<T>(
        &self,
        mut head: BytesMut,
        payload: &[Bytes],
        limit: Duration,
        expect_answer: bool,
        decode: impl FnOnce(Bytes) -> Result<T>,
    ) -> Result<Option<T>> {
        let mut slot = self.slot.lock().await;
        // A live connection, a slot on it, a correlation id, a waiter. If
        // the connection fails meanwhile nothing was sent yet: start over
        // on a new one.
        let (corr, shared, answer) = loop {
            if slot.conn.as_ref().is_none_or(|c| c.shared.is_failed()) {
                slot.conn = None;
                let conn = self.open(slot.next_corr).await?;
                slot.conn = Some(conn);
            }
            let shared = slot.conn.as_ref().expect("connected").shared.clone();
            let permit = if expect_answer {
                match shared.slots.clone().acquire_owned().await {
                    Ok(p) => Some(p),
                    Err(_) => continue,
                }
            } else {
                None
            };
            let corr = slot.next_corr;
            if let Ok(answer) = shared.register(corr, permit) {
                slot.next_corr = corr.wrapping_add(1);
                break (corr, shared, answer);
            }
        };
        set_correlation_id(&mut head, corr);
        let deadline = Instant::now() + limit;
        let conn = slot.conn.as_mut().expect("connected");
        let mut partial = FailOnDrop(Some(&shared));
        let written =
            tokio::time::timeout_at(deadline, write_frame(&mut conn.write, &head, payload)).await;
        partial.0 = None;
        let failure = match written {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(ClientError::Io(e)),
            Err(_) => Some(ClientError::Timeout(limit)),
        };
        if let Some(e) = failure {
            shared.forget(corr);
            shared.fail(match e {
                ClientError::Timeout(_) => ClientError::Disconnected,
                ref e => e.duplicate(),
            });
            slot.conn = None;
            return Err(e);
        }
        if shared.is_failed() {
            slot.conn = None;
        }
        drop(slot);

        let Some(answer) = answer else {
            return Ok(None);
        };
        let mut abandoned = Abandoned {
            shared: Some(shared.clone()),
            corr,
            deadline,
        };
        let got = tokio::time::timeout_at(deadline, answer).await;
        abandoned.shared = None;
        let frame = match got {
            Ok(Ok(reply)) => reply?,
            Ok(Err(_)) => return Err(ClientError::Disconnected),
            Err(_) => {
                shared.forget(corr);
                shared.fail(ClientError::Disconnected);
                return Err(ClientError::Timeout(limit));
            }
        };
        decode(frame).map(Some).inspect_err(|_| {
            // An answer that cannot be decoded: the connection is not to
            // be trusted any more.
            shared.fail(ClientError::Disconnected);
        })
    }
}

/// A connection's reader: routes every answer to its waiter until the
/// connection fails or is dropped, then closes it.
async fn read_answers(
    mut r: BufReader<ReadHalf>,
    shared: Arc<Shared>,
    slot: Weak<Mutex<Slot>>,
    max_frame_bytes: usize,
) {
    loop {
        let got = tokio::select! {
            biased;
            () = shared.stop.notified() => break,
            f = read_frame(&mut r, max_frame_bytes) => f.and_then(|f| shared.deliver(f)),
        };
        if let Err(e) = got {
            shared.fail(e);
            break;
        }
    }
    drop(r);
    // Drop the write half too (unless a caller already replaced the
    // connection), so the socket is closed without waiting for a call.
    if let Some(slot) = slot.upgrade() {
        let mut slot = slot.lock().await;
        if slot
            .conn
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(&c.shared, &shared))
        {
            slot.conn = None;
        }
    }
}

/// Sets the correlation id of an encoded request frame.
fn set_correlation_id(head: &mut [u8], corr: u32) {
    head[OFF_REQUEST_CORRELATION_ID..OFF_REQUEST_CORRELATION_ID + 4]
        .copy_from_slice(&corr.to_be_bytes());
}

/// Writes `head` then every `payload` piece, without copying them.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    head: &[u8],
    payload: &[Bytes],
) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = std::iter::once(head)
        .chain(payload.iter().map(|b| &b[..]))
        .filter(|s| !s.is_empty())
        .map(IoSlice::new)
        .collect();
    let mut bufs = &mut slices[..];
    while !bufs.is_empty() {
        let k = bufs.len().min(IOV_MAX);
        let n = w.write_vectored(&bufs[..k]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "connection accepted no more bytes",
            ));
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    w.flush().await
}

fn eof_to_disconnected(e: io::Error) -> ClientError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ClientError::Disconnected
    } else {
        ClientError::Io(e)
    }
}

/// Reads one whole frame (length field included). A `frame_len` over
/// `max_frame_bytes` is an error before anything else is read.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max_frame_bytes: usize,
) -> Result<Bytes> {
    let mut len = [0u8; FRAME_LEN_BYTES];
    r.read_exact(&mut len).await.map_err(eof_to_disconnected)?;
    let total = frame::peek_frame_len(&len, max_frame_bytes)?
        .expect("four bytes are enough to read the length");
    // Read into the spare capacity (no zeroing of large fetch answers).
    let mut buf = BytesMut::with_capacity(total);
    buf.extend_from_slice(&len);
    while buf.len() < total {
        let want = total - buf.len();
        let n = r
            .read_buf(&mut (&mut buf).limit(want))
            .await
            .map_err(eof_to_disconnected)?;
        if n == 0 {
            return Err(ClientError::Disconnected);
        }
    }
    Ok(buf.freeze())
}

/// The correlation id of a response frame (bytes 4..8).
pub(crate) fn response_correlation_id(frame: &[u8]) -> Option<u32> {
    frame
        .get(4..8)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
}

/// Whether correlation id `got` was sent before `expected` (ids increase,
/// wrapping; "before" means less than 2^31 steps behind).
pub(crate) fn is_earlier(got: u32, expected: u32) -> bool {
    let behind = expected.wrapping_sub(got);
    behind != 0 && behind < (1 << 31)
}

// --- SASL login (crate::sasl): on a new connection before its reader
// starts (`Raw`), or re-authenticating an open one (`Piped`) ---

/// The body of a SASL answer, or the error it carries.
fn sasl_answer<T: Request>(answer: &[u8]) -> Result<T::Response> {
    let (h, body, _) = frame::decode_response(answer).map_err(ClientError::Protocol)?;
    if !h.error.is_none() {
        let code = h.error;
        let message = weir_proto::messages::ErrorBody::decode_body(body)
            .map(|e| e.message)
            .unwrap_or_default();
        return Err(match code {
            ErrorCode::SaslAuthenticationFailed => ClientError::Authentication(message),
            code => ClientError::Server { code, message },
        });
    }
    T::Response::decode_body(body).map_err(ClientError::Protocol)
}

/// How a login's messages travel.
trait SaslWire {
    /// Sends `req`, waits for its answer.
    async fn call<T: Request>(&mut self, req: &T) -> Result<T::Response>;
}

/// A new connection, before anything else is sent on it.
struct Raw<'a, R, W> {
    r: &'a mut R,
    w: &'a mut W,
    corr: u32,
    max_frame_bytes: usize,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> SaslWire for Raw<'_, R, W> {
    async fn call<T: Request>(&mut self, req: &T) -> Result<T::Response> {
        let head = frame::encode_request(&RequestHeader::of::<T>(self.corr), req, 0)
            .map_err(ClientError::Protocol)?;
        write_frame(self.w, &head, &[]).await?;
        let answer: Bytes = read_frame(self.r, self.max_frame_bytes).await?;
        sasl_answer::<T>(&answer)
    }
}

/// An open connection: the messages are requests of its pipeline.
struct Piped<'a> {
    p: &'a Pipeline,
}

impl SaslWire for Piped<'_> {
    async fn call<T: Request>(&mut self, req: &T) -> Result<T::Response> {
        let head = frame::encode_request(&RequestHeader::of::<T>(0), req, 0)
            .map_err(ClientError::Protocol)?;
        let answer = self
            .p
            .exchange(head, &[], self.p.connect_timeout, true, |frame| {
                sasl_answer::<T>(&frame)
            })
            .await?;
        answer.ok_or(ClientError::Disconnected)
    }
}

async fn sasl_step(wire: &mut impl SaslWire, bytes: Vec<u8>) -> Result<SaslAuthenticateResponse> {
    wire.call(&SaslAuthenticateRequest { auth_bytes: bytes })
        .await
}

/// Logs in; how long the login holds, if the broker limits it.
async fn sasl_login(
    wire: &mut impl SaslWire,
    s: &crate::sasl::SaslSettings,
) -> Result<Option<Duration>> {
    let hs = wire
        .call(&SaslHandshakeRequest {
            mechanism: s.mechanism.name().to_string(),
        })
        .await?;
    if hs.error != 0 {
        return Err(ClientError::Authentication(format!(
            "the broker does not offer {} (it offers {})",
            s.mechanism,
            if hs.mechanisms.is_empty() {
                "no SASL login: is it a SASL_* listener?".to_string()
            } else {
                hs.mechanisms.join(", ")
            }
        )));
    }
    let failed = |a: &SaslAuthenticateResponse| {
        ClientError::Authentication(a.message.clone().unwrap_or_else(|| "refused".into()))
    };
    let done = match s.mechanism {
        Mechanism::OAuthBearer => {
            let file = s.token_file.as_deref().unwrap_or(std::path::Path::new(""));
            let token = std::fs::read_to_string(file).map_err(|e| {
                ClientError::Authentication(format!(
                    "reading the OAUTHBEARER token file {}: {e}",
                    file.display()
                ))
            })?;
            let message = weir_proto::sasl::oauthbearer_message(token.trim());
            let a = sasl_step(wire, message).await?;
            if a.error != 0 {
                return Err(failed(&a));
            }
            a
        }
        Mechanism::Plain => {
            let a = sasl_step(
                wire,
                weir_proto::sasl::plain_token(&s.username, &s.password),
            )
            .await?;
            if a.error != 0 {
                return Err(failed(&a));
            }
            a
        }
        m => {
            let (mut client, first) = ScramClient::start(m, &s.username, &s.password);
            let a = sasl_step(wire, first).await?;
            if a.error != 0 {
                return Err(failed(&a));
            }
            let last = client
                .server_first(&a.auth_bytes)
                .map_err(|e| ClientError::Authentication(e.to_string()))?;
            let a = sasl_step(wire, last).await?;
            if a.error != 0 {
                return Err(failed(&a));
            }
            client
                .server_final(&a.auth_bytes)
                .map_err(|e| ClientError::Authentication(e.to_string()))?;
            a
        }
    };
    Ok((done.session_lifetime_ms > 0)
        .then(|| Duration::from_millis(done.session_lifetime_ms as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_proto::frame::{encode_response_with_payload, ResponseHeader};
    use weir_proto::messages::ErrorBody;

    fn response(corr: u32, payload: &[u8]) -> Vec<u8> {
        let body = ErrorBody {
            message: String::new(),
        };
        encode_response_with_payload(&ResponseHeader::ok(corr), &body, &[payload])
            .unwrap()
            .to_vec()
    }

    #[test]
    fn earlier_wraps() {
        assert!(is_earlier(1, 2));
        assert!(!is_earlier(2, 2));
        assert!(!is_earlier(3, 2));
        assert!(is_earlier(u32::MAX, 0));
        assert!(!is_earlier(0, u32::MAX));
    }

    #[tokio::test]
    async fn writes_head_and_pieces_in_order() {
        let (mut a, mut b) = tokio::io::duplex(7);
        let pieces: Vec<Bytes> = (0..2000u32)
            .map(|i| Bytes::from(i.to_be_bytes().to_vec()))
            .collect();
        let writer = tokio::spawn(async move {
            write_frame(&mut a, b"head", &pieces).await.unwrap();
        });
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(&got[..4], b"head");
        let want: Vec<u8> = (0..2000u32).flat_map(|i| i.to_be_bytes()).collect();
        assert_eq!(&got[4..], &want[..]);
    }

    #[test]
    fn routes_answers_and_rejects_unsent_ids() {
        let shared = Shared::new(4, 5);
        let slot = || Some(shared.slots.clone().try_acquire_owned().unwrap());
        assert!(
            matches!(shared.register(5, None), Ok(None)),
            "acks=0: no waiter"
        );
        let mut six = shared.register(6, slot()).ok().unwrap().unwrap();
        let mut seven = shared.register(7, slot()).ok().unwrap().unwrap();
        assert_eq!(shared.slots.available_permits(), 2);
        // An answer nobody waits for (acks=0) is dropped; answers are routed
        // by correlation id, whatever their order.
        shared.deliver(Bytes::from(response(5, b"old"))).unwrap();
        shared.deliver(Bytes::from(response(7, b"seven"))).unwrap();
        assert!(six.try_recv().is_err());
        let f = seven.try_recv().unwrap().unwrap();
        assert_eq!(frame::decode_response(&f).unwrap().2, b"seven");
        assert_eq!(shared.slots.available_permits(), 3, "answered: slot back");
        // An answer to a request never sent is a protocol violation.
        assert!(matches!(
            shared.deliver(Bytes::from(response(8, b""))),
            Err(ClientError::InvalidResponse(_))
        ));
        shared.fail(ClientError::Disconnected);
        assert!(matches!(six.try_recv(), Ok(Err(ClientError::Disconnected))));
        assert!(shared.register(8, None).is_err());
        assert!(shared.slots.clone().try_acquire_owned().is_err());
    }

    #[test]
    fn sets_the_correlation_id_in_place() {
        use weir_proto::frame::RequestHeader;
        use weir_proto::messages::ApiVersionsRequest;
        let enc = |corr| {
            frame::encode_request(
                &RequestHeader::of::<ApiVersionsRequest>(corr),
                &ApiVersionsRequest {},
                3,
            )
            .unwrap()
        };
        let mut head = enc(0);
        set_correlation_id(&mut head, 0xdead_beef);
        assert_eq!(head, enc(0xdead_beef));
    }

    #[tokio::test]
    async fn limits_and_eof() {
        let input = response(1, &[0u8; 100]);
        let mut r = &input[..];
        assert!(matches!(
            read_frame(&mut r, 50).await,
            Err(ClientError::Protocol(frame::FrameError::TooLarge { .. }))
        ));
        let mut r = &input[..input.len() - 1];
        assert!(matches!(
            read_frame(&mut r, 1 << 20).await,
            Err(ClientError::Disconnected)
        ));
    }
}
