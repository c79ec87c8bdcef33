//! quinn on a core's glommio executor: the per-core replication endpoints.
//!
//! quinn asks its runtime for three things: to spawn its drivers, timers,
//! and UDP sockets that report readiness. glommio runs tasks but exposes no
//! readiness for a foreign file descriptor, and its timers are not `Send`
//! (quinn's must be); so the drivers run as tasks of the core's executor
//! (every quinn future of a core's endpoint is polled on that core), and
//! readiness and timers come from the core's own io_uring: a socket waits
//! for datagrams with a peek through glommio, and timers are glommio's, so
//! a datagram or a deadline wakes the core directly. glommio's sockets and
//! timers are not `Send`; they live in a table of the core's thread
//! ([`LOCAL`]) and quinn's `Send` halves carry only their key. (They came
//! from `async-io`'s reactor thread before: every timer reset and every
//! datagram after a quiet spell woke that thread, and it woke the core —
//! ~6 000 wake-ups per second per node at 20 MB/s replicated.) Waiting for
//! a full send buffer to drain, which is rare, still goes through
//! `async-io`. Datagrams are sent and received by the core itself, with
//! quinn-udp (GSO/GRO where the kernel has them).
//!
//! Why not a thread per core running tokio: every fetched batch would
//! cross a thread on its way to the log the core owns; here the bytes go
//! from the socket to the core's log with no hop.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::thread::ThreadId;
use std::time::Instant;

use async_io::Async;
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
        Box::pin(CoreTimer {
            key: next_key(),
            at,
            thread: std::thread::current().id(),
        })
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        glommio::spawn_local(future).detach();
    }

    fn wrap_udp_socket(&self, sock: std::net::UdpSocket) -> io::Result<Arc<dyn AsyncUdpSocket>> {
        Ok(Arc::new(UdpSocket {
            max_segments: self.max_segments,
            state: UdpSocketState::new((&sock).into())?,
            io: Async::new_nonblocking(sock)?,
            blocked: AtomicBool::new(false),
            key: next_key(),
            thread: std::thread::current().id(),
        }))
    }
}

thread_local! {
    /// The glommio halves of this core's quinn timers and sockets, by key.
    static LOCAL: RefCell<Local> = RefCell::new(Local::default());
}

/// See [`LOCAL`].
#[derive(Default)]
struct Local {
    /// A timer's glommio timer and the deadline it is armed for.
    timers: HashMap<u64, (Instant, glommio::timer::Timer)>,
    /// A socket's readiness: a glommio socket on a duplicate of its
    /// descriptor, and the peek under way.
    readable: HashMap<u64, Readable>,
}

struct Readable {
    socket: Rc<glommio::net::UdpSocket>,
    wait: Option<Peek>,
}

/// A socket's peek under way (a datagram is queued when it ends).
type Peek = Pin<Box<dyn Future<Output = glommio::Result<(), ()>>>>;

fn next_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Removes a timer's or socket's glommio half — only on the thread that
/// made it (quinn drops its halves on the core; were one dropped
/// elsewhere, its entry would stay until the core's thread ends), and not
/// while the table is in use or being torn down.
fn forget(thread: ThreadId, remove: impl FnOnce(&mut Local)) {
    if std::thread::current().id() != thread {
        return;
    }
    let _ = LOCAL.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            remove(&mut l);
        }
    });
}

/// A quinn timer on the core's glommio timers.
#[derive(Debug)]
struct CoreTimer {
    key: u64,
    at: Instant,
    thread: ThreadId,
}

impl AsyncTimer for CoreTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        // Re-armed at the next poll: quinn often resets without polling.
        self.at = at;
    }

    fn poll(self: Pin<&mut Self>, cx: &mut Context) -> Poll<()> {
        let now = Instant::now();
        if now >= self.at {
            let key = self.key;
            forget(self.thread, |l| drop(l.timers.remove(&key)));
            return Poll::Ready(());
        }
        let (key, at) = (self.key, self.at);
        LOCAL.with_borrow_mut(|l| {
            let (armed, timer) = l
                .timers
                .entry(key)
                .or_insert_with(|| (at, glommio::timer::Timer::new(at - now)));
            if *armed != at {
                timer.reset(at - now);
                *armed = at;
            }
            Pin::new(timer).poll(cx).map(|_| ())
        })
    }
}

impl Drop for CoreTimer {
    fn drop(&mut self) {
        let key = self.key;
        forget(self.thread, |l| drop(l.timers.remove(&key)));
    }
}

#[derive(Debug)]
struct UdpSocket {
    io: Async<std::net::UdpSocket>,
    state: UdpSocketState,
    /// A send found the socket's buffer full: wait for writability.
    blocked: AtomicBool,
    /// See [`GlommioRuntime::max_segments`].
    max_segments: usize,
    /// Its readiness in [`LOCAL`] of `thread`.
    key: u64,
    thread: ThreadId,
}

impl UdpSocket {
    /// Ready when a datagram is queued: a one-byte peek through the core's
    /// io_uring (made on the first wait).
    fn poll_readable(&self, cx: &mut Context) -> Poll<io::Result<()>> {
        LOCAL.with_borrow_mut(|l| {
            let r = match l.readable.entry(self.key) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let fd = self.io.get_ref().try_clone()?.into_raw_fd();
                    // SAFETY: `fd` is a new descriptor (a `dup`) that
                    // nothing else owns; the glommio socket closes it.
                    let socket = unsafe { glommio::net::UdpSocket::from_raw_fd(fd) };
                    v.insert(Readable {
                        socket: Rc::new(socket),
                        wait: None,
                    })
                }
            };
            let wait = r.wait.get_or_insert_with(|| {
                let socket = r.socket.clone();
                Box::pin(async move {
                    let mut byte = [0u8; 1];
                    socket.peek_from(&mut byte).await.map(|_| ())
                })
            });
            let outcome = ready!(wait.as_mut().poll(cx));
            r.wait = None;
            Poll::Ready(match outcome.map_err(io::Error::from) {
                Ok(()) => Ok(()),
                // An error the peek took off the socket (an ICMP answer to
                // an earlier send): the datagrams still come.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    Ok(())
                }
                Err(e) => Err(e),
            })
        })
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        let key = self.key;
        forget(self.thread, |l| drop(l.readable.remove(&key)));
    }
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
            self.blocked.store(true, Ordering::Release);
        }
        r
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [io::IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        // Read first, wait only when the socket is empty (a wait is an
        // io_uring operation; with datagrams queued it is not needed).
        loop {
            match self.state.recv((&self.io).into(), bufs, meta) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            ready!(self.poll_readable(cx))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn on_a_core(
        name: &str,
        f: impl FnOnce() -> Pin<Box<dyn Future<Output = ()>>> + Send + 'static,
    ) {
        glommio::LocalExecutorBuilder::default()
            .name(name)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap();
    }

    /// A quinn timer fires at its deadline, not before, follows resets
    /// (later, then earlier after firing), and leaves nothing in the
    /// core's table once dropped.
    #[test]
    fn timers_fire_at_their_deadline_and_follow_resets() {
        on_a_core("timers", || {
            Box::pin(async {
                let rt = GlommioRuntime::new(1452);
                let start = Instant::now();
                let mut t = rt.new_timer(start + Duration::from_millis(10));
                t.as_mut().reset(start + Duration::from_millis(30));
                std::future::poll_fn(|cx| t.as_mut().poll(cx)).await;
                assert!(
                    start.elapsed() >= Duration::from_millis(30),
                    "fired before its reset deadline"
                );
                let again = Instant::now();
                t.as_mut().reset(again + Duration::from_millis(5));
                std::future::poll_fn(|cx| t.as_mut().poll(cx)).await;
                let waited = again.elapsed();
                assert!(
                    waited >= Duration::from_millis(5),
                    "fired early: {waited:?}"
                );
                // Armed again, then dropped: its glommio timer goes too.
                t.as_mut().reset(Instant::now() + Duration::from_secs(60));
                assert!(std::future::poll_fn(|cx| Poll::Ready(t.as_mut().poll(cx)))
                    .await
                    .is_pending());
                assert_eq!(LOCAL.with_borrow(|l| l.timers.len()), 1);
                drop(t);
                assert_eq!(LOCAL.with_borrow(|l| l.timers.len()), 0);
            })
        });
    }

    /// A socket with nothing queued waits through the core's io_uring and
    /// wakes when a datagram arrives, which it then reads whole; dropped,
    /// it leaves nothing in the core's table.
    #[test]
    fn a_socket_waits_for_a_datagram_and_reads_it() {
        on_a_core("socket", || {
            Box::pin(async {
                let rt = GlommioRuntime::new(1452);
                let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                let addr = sock.local_addr().unwrap();
                let sock = rt.wrap_udp_socket(sock).unwrap();
                let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                let mut buf = vec![0u8; 65_536];
                let mut meta = [RecvMeta::default()];
                let mut waited = false;
                let n = std::future::poll_fn(|cx| {
                    let mut bufs = [io::IoSliceMut::new(&mut buf)];
                    let r = sock.poll_recv(cx, &mut bufs, &mut meta);
                    if r.is_pending() && !waited {
                        // The wait is in place: now the datagram comes.
                        waited = true;
                        sender.send_to(b"hello", addr).unwrap();
                    }
                    r
                })
                .await
                .unwrap();
                assert!(waited, "the socket never waited");
                assert_eq!(n, 1);
                assert_eq!(&buf[..meta[0].len], b"hello");
                assert_eq!(LOCAL.with_borrow(|l| l.readable.len()), 1);
                drop(sock);
                assert_eq!(LOCAL.with_borrow(|l| l.readable.len()), 0);
            })
        });
    }
}
