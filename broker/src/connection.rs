//! One native-protocol connection: read whole frames (bounded by
//! `max_frame_bytes`), dispatch each request, write the answer.
//!
//! Requests on one connection are started and answered in order, and up to
//! [`PIPELINE_MAX`] of them can be in progress at once. A frame that is too
//! large or cannot be parsed gets an error answer and the connection is
//! closed (its framing can no longer be trusted); a request with a bad body,
//! an unknown API or version gets an error answer and the connection stays
//! open. Nothing here can affect another connection.

use std::cell::Cell;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use weir_proto::error_code::ErrorCode;
use weir_proto::frame::{self, FrameError};

use glommio::channels::local_channel;

use crate::core::Core;
use crate::router::{Ctx, Pending};

/// Bytes read from the socket at a time.
pub const READ_CHUNK_BYTES: usize = 64 << 10;

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

    /// A frame-level error.
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

/// The correlation id of a (possibly partial) request frame, 0 if not there yet.
pub fn correlation_id_of(buf: &[u8]) -> u32 {
    buf.get(8..12)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
        .unwrap_or(0)
}

/// Requests of one connection in progress at once (read, not yet
/// answered). Beyond this the connection is not read until the oldest is
/// answered.
pub const PIPELINE_MAX: usize = 32;

/// A request whose answer the writer waits for.
struct InFlight {
    pending: Pending,
    api: Option<weir_proto::api::ApiKey>,
    started: std::time::Instant,
    /// The request's share of the core's in-flight budget, released once
    /// answered.
    permit: Option<glommio::sync::StaticPermit>,
}

/// Serves one connection until it closes. `ctx` says which listener it came
/// through.
///
/// Requests are read and started in order (a produce's batches are
/// appended before the next request is read); their answers are awaited
/// concurrently, up to [`PIPELINE_MAX`] at a time, and written in request
/// order by a writer task.
pub async fn serve(core: Rc<Core>, stream: TcpStream, active: Rc<Cell<usize>>, ctx: Ctx) {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let _ = stream.set_nodelay(true);
    core.metrics
        .connections
        .set(core.metrics.connections.get() + 1);
    let (mut reader, writer) = futures_lite::io::split(stream);
    let (tx, rx) = local_channel::new_bounded::<InFlight>(PIPELINE_MAX);
    let write_task = glommio::spawn_local(write_answers(
        core.clone(),
        writer,
        rx,
        active.clone(),
        peer.clone(),
    ));
    let max = core.shared.config.max_frame_bytes as usize;
    let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    'requests: loop {
        // Read until one whole frame is buffered. Its size is taken from the
        // core's in-flight budget first (waiting if other connections hold
        // it), so a burst of large requests cannot exhaust memory.
        let mut permit = None;
        let need = loop {
            match frame::peek_frame_len(&buf, max) {
                Ok(Some(n)) => {
                    if permit.is_none() {
                        match core.inflight.acquire_static_permit(n as u64).await {
                            Ok(p) => permit = Some(p),
                            Err(_) => break None,
                        }
                    }
                    if buf.len() >= n {
                        break Some(n);
                    }
                    buf.reserve(n - buf.len());
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "closing connection: bad frame");
                    let a = Answer::error(
                        correlation_id_of(&buf),
                        e.error_code(),
                        &e.to_string(),
                        true,
                    );
                    active.set(active.get() + 1);
                    let _ = tx
                        .send(InFlight {
                            pending: Pending::Ready(a),
                            api: None,
                            started: std::time::Instant::now(),
                            permit: None,
                        })
                        .await;
                    break None;
                }
            }
            if core.shared.stopping() {
                break None;
            }
            match reader.read(&mut chunk).await {
                Ok(0) => break None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "connection read failed");
                    break None;
                }
            }
        };
        let Some(need) = need else { break 'requests };
        let request = buf.split_to(need).freeze();
        core.metrics.add_in(request.len());
        let api = request
            .get(4..6)
            .and_then(|b| weir_proto::api::ApiKey::from_u16(u16::from_be_bytes([b[0], b[1]])));
        let started = std::time::Instant::now();
        active.set(active.get() + 1);
        let pending = crate::router::dispatch(&core, request, ctx).await;
        let item = InFlight {
            pending,
            api,
            started,
            permit,
        };
        if tx.send(item).await.is_err() {
            // The writer stopped (write failed, or an answer closed the
            // connection).
            active.set(active.get() - 1);
            break 'requests;
        }
    }
    drop(tx);
    write_task.await;
}

/// Writes answers in request order until the reader is done or a write
/// fails.
async fn write_answers(
    core: Rc<Core>,
    mut writer: futures_lite::io::WriteHalf<TcpStream>,
    rx: local_channel::LocalReceiver<InFlight>,
    active: Rc<Cell<usize>>,
    peer: String,
) {
    let mut failed = false;
    while let Some(item) = rx.recv().await {
        let answer = item.pending.answer().await;
        active.set(active.get() - 1);
        if failed {
            continue;
        }
        if let Some(api) = item.api {
            let error = answer.head.get(8..10).is_some_and(|e| e != [0, 0]);
            core.metrics
                .record(api, item.started.elapsed().as_micros() as u64, error);
        }
        core.metrics
            .add_out(answer.head.len() + answer.payload.iter().map(|p| p.len()).sum::<usize>());
        let close = answer.close;
        if let Err(e) = send(&mut writer, answer).await {
            tracing::debug!(%peer, error = %e, "connection write failed");
            failed = true;
        }
        drop(item.permit);
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

/// Turns a body decoding failure into an answer that keeps the connection.
pub fn bad_body(correlation_id: u32, e: &FrameError) -> Answer {
    Answer::error(correlation_id, e.error_code(), &e.to_string(), false)
}
