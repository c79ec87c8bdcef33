//! quinn on a core's glommio executor: the per-core replication endpoints.
//!
//! quinn asks its runtime for three things: to spawn its drivers, timers,
//! and UDP sockets that report readiness. glommio runs tasks but exposes no
//! readiness for a foreign file descriptor, and its timers are not `Send`
//! (quinn's must be); so the drivers run as tasks of the core's executor
//! (every quinn future of a core's endpoint is polled on that core), and
//! readiness and timers come from `async-io`'s reactor (one shared thread
//! that only wakes the core's tasks). Datagrams are sent and received by
//! the core itself, with quinn-udp (GSO/GRO where the kernel has them).
//!
//! Why not a thread per core running tokio: every fetched batch would
//! cross a thread on its way to the log the core owns; here the bytes go
//! from the socket to the core's log with no hop.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use async_io::{Async, Timer};
use quinn::udp::{RecvMeta, Transmit, UdpSocketState};
use quinn::{AsyncTimer, AsyncUdpSocket, Runtime, UdpPoller};

/// quinn's runtime on the calling thread's glommio executor. Must only be
/// used (endpoints made, connections driven) on that executor's thread.
#[derive(Debug, Clone, Copy)]
pub struct GlommioRuntime {
    /// Datagrams one GSO send may carry: the kernel refuses a send whose
    /// segments add up to more than a UDP datagram (65 507 bytes), and
    /// quinn (0.11) batches up to 10 segments of the path's MTU whatever
    /// it is — at an MTU of 8952 every such send failed, the losses
    /// looked like a black hole and the MTU fell back to 1200.
    max_segments: usize,
}

/// Largest UDP payload over IPv4 (65 535 less the IP and UDP headers).
const UDP_PAYLOAD_MAX: usize = 65_507;

impl GlommioRuntime {
    /// A runtime whose sockets batch at most as many datagrams of
    /// `max_payload` bytes per send as fit in one UDP datagram.
    pub fn new(max_payload: u16) -> Self {
        Self {
            max_segments: (UDP_PAYLOAD_MAX / usize::from(max_payload.max(1))).max(1),
        }
    }
}

impl Runtime for GlommioRuntime {
    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        Box::pin(GlommioTimer(Timer::at(at)))
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        glommio::spawn_local(future).detach();
    }

    fn wrap_udp_socket(&self, sock: std::net::UdpSocket) -> io::Result<Arc<dyn AsyncUdpSocket>> {
        Ok(Arc::new(UdpSocket {
            max_segments: self.max_segments,
            state: UdpSocketState::new((&sock).into())?,
            io: Async::new_nonblocking(sock)?,
            blocked: std::sync::atomic::AtomicBool::new(false),
        }))
    }
}

/// An `async-io` timer (quinn implements its timer trait for it only
/// with quinn's own async-io runtimes).
#[derive(Debug)]
struct GlommioTimer(Timer);

impl AsyncTimer for GlommioTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        self.0.set_at(at)
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

#[derive(Debug)]
struct UdpSocket {
    io: Async<std::net::UdpSocket>,
    state: UdpSocketState,
    /// A send found the socket's buffer full: wait for writability.
    blocked: std::sync::atomic::AtomicBool,
    /// See [`GlommioRuntime::max_segments`].
    max_segments: usize,
}

/// Waits for the socket to be writable again after a full send buffer.
/// Every connection of an endpoint has one and they share the socket, so
/// each waits on its own `writable()` future: async-io keeps a waker per
/// such future, while `poll_writable` has a single slot that the pollers
/// would keep taking from one another (measured: 75 ms per request round
/// trip instead of 80 µs).
struct Writable {
    socket: Arc<UdpSocket>,
    wait: Option<Pin<Box<dyn Future<Output = io::Result<()>> + Send + Sync>>>,
}

impl std::fmt::Debug for Writable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writable").finish_non_exhaustive()
    }
}

impl UdpPoller for Writable {
    fn poll_writable(mut self: Pin<&mut Self>, cx: &mut Context) -> Poll<io::Result<()>> {
        use std::sync::atomic::Ordering;
        // quinn asks before every send: the socket is writable unless a
        // send said otherwise (asking the reactor each time costs a
        // round trip through its thread per datagram).
        if !self.socket.blocked.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        if self.wait.is_none() {
            let socket = self.socket.clone();
            self.wait = Some(Box::pin(async move { socket.io.writable().await }));
        }
        let r = self.wait.as_mut().expect("set above").as_mut().poll(cx);
        if r.is_ready() {
            self.wait = None;
            self.socket.blocked.store(false, Ordering::Release);
        }
        r
    }
}

impl AsyncUdpSocket for UdpSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(Writable {
            socket: self,
            wait: None,
        })
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        let r = self.state.send((&self.io).into(), transmit);
        if matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            self.blocked
                .store(true, std::sync::atomic::Ordering::Release);
        }
        r
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [io::IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        // Read first, wait only when the socket is empty: async-io's
        // readiness is edge-like (a new event per wait), so waiting first
        // would cost a round trip through its thread per batch of
        // datagrams even with more queued (measured: 15 MB/s vs 300).
        loop {
            match self.state.recv((&self.io).into(), bufs, meta) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            ready!(self.io.poll_readable(cx))?;
        }
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.io.as_ref().local_addr()
    }

    fn may_fragment(&self) -> bool {
        self.state.may_fragment()
    }

    fn max_transmit_segments(&self) -> usize {
        self.state.max_gso_segments().min(self.max_segments)
    }

    fn max_receive_segments(&self) -> usize {
        self.state.gro_segments()
    }
}
