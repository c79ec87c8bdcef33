//! The cross-core mesh: the messages one core sends another, and how their
//! answers come back.
//!
//! **Two meshes.** Requests ([`CoreMsg`]) and answers ([`ReplyMsg`]) travel
//! on separate bounded glommio channel meshes, so an answer never waits
//! behind requests: a core whose request handlers are all busy still
//! receives the answers they wait for.
//!
//! **Credits.** Before a core sends a request to another it takes one of
//! [`MESH_CREDITS_PER_PEER`] credits for that peer; the credit comes back
//! when the answer arrives or the wait for it ends. So a core never has
//! more than that many requests outstanding at one peer, and a flood of
//! cross-core work waits at its source instead of piling up as tasks at
//! its destination.
//!
//! **Answers.** A request carries a [`ReplyTo`] (the asking core and a
//! request number, nothing else: `Send`, but no waker crosses threads).
//! The handler answers through it; a `ReplyTo` dropped without an answer
//! answers "dropped" by itself, so the asker never waits for an answer
//! that cannot come. The asker waits on a [`ReplyWait`] — deliberately not
//! `Send`: it lives in its core's reply table and is woken only by that
//! core's mesh receiver (glommio's wake-up of a task from a foreign thread
//! races with the task completing; see the history of this module). A
//! `ReplyWait` gives up after [`MESH_REPLY_TIMEOUT_MS`] (plus the wait the
//! request itself asks for), and removes its table entry when dropped, so
//! the table holds only requests that are really waiting.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use glommio::channels::channel_mesh::{Receivers, Senders};

use super::answers::{CompactOk, FetchOk, OffsetsOk, ProduceOk};
use crate::error::BrokerError;
use crate::groups::api::{GroupRequest, GroupResponse};
use crate::metadata::Change;
use crate::metadata::{MetadataView, TopicError};
use crate::server::limits::{MESH_CREDITS_PER_PEER, MESH_REPLY_TIMEOUT_MS};
use crate::txns::api::{TxnRequest, TxnResponse};

/// Messages from one core to another. Everything in them is `Send`;
/// batches travel as `Bytes` (a reference count, not a copy).
#[derive(Debug)]
pub enum CoreMsg {
    /// Append a request's batches to a partition this core owns (in
    /// order, together): answer `appended` once they are queued (or
    /// refused), then `reply` once they may be acknowledged as `acks` says.
    Produce {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// One or more whole record batches.
        batches: Bytes,
        /// 0, 1 or -1 (all).
        acks: i8,
        /// A transactional producer's batches: its transactional id and
        /// (producer id, epoch), verified with its coordinator here, on
        /// the owner core (so that the verification and the append cannot
        /// be split by a marker).
        transaction: Option<crate::txns::api::TxnWrite>,
        /// Whether the batch was queued.
        appended: ReplyTo<Result<(), BrokerError>>,
        /// The acknowledgement.
        reply: ReplyTo<Result<ProduceOk, BrokerError>>,
    },
    /// Read from a partition this core owns.
    Fetch {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// First offset wanted.
        offset: u64,
        /// Byte budget (0: only the watermarks).
        max_bytes: u64,
        /// If there is nothing at `offset` yet, wait up to this long for it.
        wait_ms: u32,
        /// Where the answer goes.
        reply: ReplyTo<Result<FetchOk, BrokerError>>,
    },
    /// Offsets of a partition this core owns.
    Offsets {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Timestamp to look up, if any.
        timestamp: Option<i64>,
        /// Where the answer goes.
        reply: ReplyTo<Result<OffsetsOk, BrokerError>>,
    },
    /// Raise the log start offset of a partition this core owns
    /// (DeleteRecords).
    DeleteRecords {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// The new log start offset; -1: the high watermark.
        before: i64,
        /// The log start offset after, or why not.
        reply: ReplyTo<Result<u64, BrokerError>>,
    },
    /// Run a cleaner pass on (or report the dirty ratio of) a partition
    /// this core owns.
    Compact {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Run a pass (true) or only report.
        run: bool,
        /// Where the answer goes.
        reply: ReplyTo<Result<CompactOk, BrokerError>>,
    },
    /// A topic change for the metadata writer (core 0).
    Metadata {
        /// The change.
        change: Change,
        /// The version it got, or why it was refused.
        reply: ReplyTo<Result<u64, TopicError>>,
    },
    /// A new metadata view (from the writer): open, close or delete logs
    /// to match, then answer.
    ApplyMetadata {
        /// The view.
        view: Arc<MetadataView>,
        /// Partitions deleted by the change (their files go).
        deleted: Vec<(String, u32)>,
        /// Done, or why not.
        reply: ReplyTo<Result<(), String>>,
    },
    /// Hand out a producer id (sent to core 0, which owns the allocator).
    InitProducerId {
        /// Where the id goes.
        reply: ReplyTo<Result<i64, BrokerError>>,
    },
    /// This core's metrics.
    Metrics {
        /// Where the snapshot goes.
        reply: ReplyTo<crate::metrics::Snapshot>,
    },
    /// A consumer-group request for a group this core coordinates.
    Group {
        /// The request.
        request: GroupRequest,
        /// Where the answer goes.
        reply: ReplyTo<GroupResponse>,
    },
    /// A share partition of a topic partition this core owns, reset by
    /// an operator: its start moved to `start`, or (`None`) its state
    /// deleted.
    ShareReset {
        /// The share partition.
        key: weir_share::records::ShareKey,
        /// The new start offset.
        start: Option<u64>,
        /// Where the answer goes: whether there was state.
        reply: ReplyTo<Result<bool, BrokerError>>,
    },
    /// A share partition's durable state, read or stored in a
    /// `__share_group_state` partition this core leads.
    ShareState {
        /// The partition of `__share_group_state`.
        partition: u32,
        /// The share partition.
        key: weir_share::records::ShareKey,
        /// The value to store (`Some(None)`: a tombstone).
        value: Option<Option<Vec<u8>>>,
        /// Store (else read).
        write: bool,
        /// Where the answer goes: the value read.
        reply: ReplyTo<Result<Option<Vec<u8>>, BrokerError>>,
    },
    /// A transaction request for a transactional id this core
    /// coordinates.
    Txn {
        /// The request.
        request: TxnRequest,
        /// Where the answer goes.
        reply: ReplyTo<TxnResponse>,
    },
    /// The transactional ids this core coordinates (only these, if
    /// given).
    TxnStates {
        /// The ids asked for (`None`: all).
        ids: Option<Vec<String>>,
        /// Where the answer goes.
        reply: ReplyTo<Vec<weir_txn::TxnMetadata>>,
    },
    /// The producers a partition this core owns remembers.
    Producers {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Where the answer goes.
        reply: ReplyTo<Result<Vec<weir_storage::ActiveProducer>, BrokerError>>,
    },
    /// Append a transaction marker to a partition this core owns and
    /// answer once it may be acknowledged (acks=all).
    Marker {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// The transaction's producer id.
        producer_id: i64,
        /// The epoch the marker carries.
        epoch: i16,
        /// Commit (else abort).
        commit: bool,
        /// The transaction coordinator's epoch.
        coordinator_epoch: i32,
        /// Durable, or why not.
        reply: ReplyTo<Result<(), BrokerError>>,
    },
    /// Log end offsets (high watermarks) of partitions this core owns.
    LogEnds {
        /// (topic, partition) pairs.
        partitions: Vec<(String, u32)>,
        /// One result per partition, in order.
        reply: ReplyTo<Vec<Result<u64, BrokerError>>>,
    },
    /// The asking core stopped waiting for request `id` (its connection
    /// closed): stop the wait it may be in (a long poll, a held heartbeat).
    Cancel {
        /// The asking core.
        from: usize,
        /// The request's number there.
        id: u64,
    },
}

impl CoreMsg {
    /// The (asking core, request number) of a request that may wait for
    /// long and is cancelled when its asker stops waiting: a fetch (long
    /// poll) or a group request (held heartbeat). Appends are never
    /// cancelled.
    fn cancel_key(&self) -> Option<(usize, u64)> {
        match self {
            CoreMsg::Fetch { reply, .. } => Some((reply.core, reply.id)),
            CoreMsg::Group { reply, .. } => Some((reply.core, reply.id)),
            _ => None,
        }
    }
}

/// An answer on its way back to the asking core.
#[derive(Debug)]
pub struct ReplyMsg {
    id: u64,
    value: ReplyValue,
}

/// An answer in transit (its type is known to the waiting request); `None`
/// when the handler dropped the request without answering.
pub struct ReplyValue(Option<Box<dyn Any + Send>>);

impl std::fmt::Debug for ReplyValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ReplyValue"
        } else {
            "ReplyValue(dropped)"
        })
    }
}

thread_local! {
    /// The core running on this thread (set at its start): where a dropped
    /// [`ReplyTo`] sends its "dropped" answer from.
    static CURRENT: RefCell<Weak<Mesh>> = const { RefCell::new(Weak::new()) };
}

/// Where the answer to a cross-core request goes: the asking core and the
/// request's number. Answer with [`ReplyTo::send`]; dropped unanswered, it
/// answers "dropped".
pub struct ReplyTo<T> {
    core: usize,
    id: u64,
    answered: bool,
    _t: PhantomData<fn(T)>,
}

impl<T> std::fmt::Debug for ReplyTo<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReplyTo(core {}, #{})", self.core, self.id)
    }
}

impl<T: Send + 'static> ReplyTo<T> {
    /// Sends the answer (from the core that handled the request).
    pub async fn send(mut self, from: &Mesh, value: T) {
        self.answered = true;
        let value = ReplyValue(Some(Box::new(value)));
        deliver_to(from, self.core, self.id, value).await;
    }
}

async fn deliver_to(from: &Mesh, core: usize, id: u64, value: ReplyValue) {
    if core == from.id {
        from.deliver(id, value);
        return;
    }
    let peer = from.peer(core);
    if from
        .replies_out
        .send_to(peer, ReplyMsg { id, value })
        .await
        .is_err()
    {
        tracing::debug!(core, "an answer could not be delivered");
    }
}

impl<T> Drop for ReplyTo<T> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let Some(from) = CURRENT.with(|c| c.borrow().upgrade()) else {
            return;
        };
        let (core, id) = (self.core, self.id);
        if core == from.id {
            from.deliver(id, ReplyValue(None));
            return;
        }
        let msg = ReplyMsg {
            id,
            value: ReplyValue(None),
        };
        if from.replies_out.try_send_to(from.peer(core), msg).is_err() {
            // The channel is full (or closing): send when there is room.
            glommio::spawn_local(async move {
                let msg = ReplyMsg {
                    id,
                    value: ReplyValue(None),
                };
                let _ = from.replies_out.send_to(from.peer(core), msg).await;
            })
            .detach();
        }
    }
}

/// One waiting request's slot in its core's reply table.
#[derive(Default)]
struct Slot {
    value: Option<ReplyValue>,
    waker: Option<Waker>,
}

/// The table of requests this core sent and waits answers for.
#[derive(Default)]
pub struct Replies {
    slots: RefCell<HashMap<u64, Rc<RefCell<Slot>>>>,
    next: std::cell::Cell<u64>,
}

impl Replies {
    /// Requests waiting for an answer.
    pub fn len(&self) -> usize {
        self.slots.borrow().len()
    }

    /// Whether none is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Gives a credit back when dropped.
struct Credit(Option<Rc<glommio::sync::Semaphore>>);

impl Drop for Credit {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.signal(1);
        }
    }
}

/// The asking side of a cross-core request: resolves with the answer, or
/// with [`BrokerError::CoreUnavailable`] if the handler dropped it.
/// Not `Send`; dropping it forgets the request.
pub struct ReplyWait<T> {
    core: Weak<Mesh>,
    target: usize,
    id: u64,
    slot: Rc<RefCell<Slot>>,
    _credit: Credit,
    _t: PhantomData<T>,
}

impl<T: 'static> Future for ReplyWait<T> {
    type Output = Result<T, BrokerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.slot.borrow_mut();
        match slot.value.take() {
            Some(ReplyValue(Some(v))) => Poll::Ready(
                v.downcast::<T>()
                    .map(|b| *b)
                    .map_err(|_| BrokerError::unavailable(self.target, "answer of the wrong type")),
            ),
            Some(ReplyValue(None)) => Poll::Ready(Err(BrokerError::unavailable(
                self.target,
                "it dropped the request",
            ))),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<T> Drop for ReplyWait<T> {
    fn drop(&mut self) {
        let Some(core) = self.core.upgrade() else {
            return;
        };
        let waiting = core.replies.slots.borrow_mut().remove(&self.id).is_some();
        if waiting && self.target != core.id {
            // Nobody waits for the answer any more: let the target stop
            // working on it (best effort; it ignores unknown requests).
            let cancel = CoreMsg::Cancel {
                from: core.id,
                id: self.id,
            };
            let _ = core.requests.try_send_to(core.peer(self.target), cancel);
        }
    }
}

/// The mesh peer id of a core whose executor has ended (it failed to
/// start, or stopped): requests to it fail at once, and waits for its
/// answers end.
pub const GONE: usize = usize::MAX;

/// How often a long wait for another core's answer checks whether that
/// core is [`GONE`].
const GONE_CHECK: Duration = Duration::from_millis(100);

/// One core's ends of the mesh: where its requests and answers go, the
/// answers it waits for, the requests it serves that may wait long, and
/// its credits at each peer.
pub struct Mesh {
    /// This core's number.
    id: usize,
    /// The mesh peer id of each core (filled in as cores join).
    peers: Arc<[AtomicUsize]>,
    /// Requests to other cores (by mesh peer id).
    requests: Senders<CoreMsg>,
    /// Answers to other cores.
    replies_out: Senders<ReplyMsg>,
    /// Requests this core sent and waits answers for.
    pub replies: Replies,
    /// Requests from other cores in a long wait, cancellable.
    pub running: Running,
    /// Credits for requests to each core.
    credits: Vec<Rc<glommio::sync::Semaphore>>,
}

impl Mesh {
    /// The mesh of core `id` (one per thread: answers dropped unanswered
    /// on this thread are sent from it).
    pub fn new(
        id: usize,
        peers: Arc<[AtomicUsize]>,
        requests: Senders<CoreMsg>,
        replies_out: Senders<ReplyMsg>,
    ) -> Rc<Mesh> {
        let credits = (0..peers.len())
            .map(|_| Rc::new(glommio::sync::Semaphore::new(MESH_CREDITS_PER_PEER)))
            .collect();
        let mesh = Rc::new(Mesh {
            id,
            peers,
            requests,
            replies_out,
            replies: Replies::default(),
            running: Running::default(),
            credits,
        });
        CURRENT.with(|c| *c.borrow_mut() = Rc::downgrade(&mesh));
        mesh
    }

    /// The mesh peer id of a core.
    fn peer(&self, core: usize) -> usize {
        self.peers[core].load(Ordering::Acquire)
    }

    /// A reply address for a request to core `target`, and the wait for
    /// its answer. Takes a credit for `target` (waiting for one if all are
    /// out, at most [`MESH_REPLY_TIMEOUT_MS`]).
    pub async fn expect_reply<T: 'static>(
        self: &Rc<Self>,
        target: usize,
    ) -> Result<(ReplyTo<T>, ReplyWait<T>), BrokerError> {
        let credit = if target == self.id {
            Credit(None)
        } else {
            let sem = self.credits[target].clone();
            let got = futures_lite::future::or(async { sem.acquire(1).await.is_ok() }, async {
                glommio::timer::sleep(Duration::from_millis(MESH_REPLY_TIMEOUT_MS)).await;
                false
            })
            .await;
            if !got {
                return Err(BrokerError::unavailable(
                    target,
                    format!("no credit for a request to it within {MESH_REPLY_TIMEOUT_MS} ms"),
                ));
            }
            Credit(Some(sem))
        };
        let id = self.replies.next.get();
        self.replies.next.set(id + 1);
        let slot = Rc::new(RefCell::new(Slot::default()));
        self.replies.slots.borrow_mut().insert(id, slot.clone());
        let to = ReplyTo {
            core: self.id,
            id,
            answered: false,
            _t: PhantomData,
        };
        let wait = ReplyWait {
            core: Rc::downgrade(self),
            target,
            id,
            slot,
            _credit: credit,
            _t: PhantomData,
        };
        Ok((to, wait))
    }

    /// Hands an answer to its waiting request (on this core, so the wake-up
    /// is local). An answer nobody waits for any more is dropped.
    pub fn deliver(&self, id: u64, value: ReplyValue) {
        let slot = self.replies.slots.borrow_mut().remove(&id);
        if let Some(slot) = slot {
            let mut s = slot.borrow_mut();
            s.value = Some(value);
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        }
    }

    /// Sends a request to another core.
    pub async fn send_to(&self, core: usize, msg: CoreMsg) -> Result<(), BrokerError> {
        self.requests
            .send_to(self.peer(core), msg)
            .await
            .map_err(|_| BrokerError::unavailable(core, "it is not accepting messages"))
    }

    /// `wait` for an answer from core `target`, or `CoreUnavailable` after
    /// [`MESH_REPLY_TIMEOUT_MS`] plus `extra` — or as soon as `target` is
    /// [`GONE`] (checked every [`GONE_CHECK`] of a long wait): a core that
    /// failed to start answers nothing, and the others must not wait a
    /// minute to find out.
    pub async fn within<T>(
        &self,
        target: usize,
        extra: Duration,
        wait: impl Future<Output = Result<T, BrokerError>>,
    ) -> Result<T, BrokerError> {
        let limit = Duration::from_millis(MESH_REPLY_TIMEOUT_MS) + extra;
        let deadline = std::time::Instant::now() + limit;
        futures_lite::future::or(wait, async move {
            loop {
                if self.peer(target) == GONE {
                    return Err(BrokerError::unavailable(target, "it has stopped"));
                }
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Err(BrokerError::unavailable(
                        target,
                        format!("no answer within {} ms", limit.as_millis()),
                    ));
                }
                glommio::timer::sleep(left.min(GONE_CHECK)).await;
            }
        })
        .await
    }

    /// Sends a request to core `target` and waits for its answer, at most
    /// [`MESH_REPLY_TIMEOUT_MS`] plus `extra_wait` (the wait the request
    /// itself asks for).
    pub async fn call<T: Send + 'static>(
        self: &Rc<Self>,
        target: usize,
        extra_wait: Duration,
        msg: impl FnOnce(ReplyTo<T>) -> CoreMsg,
    ) -> Result<T, BrokerError> {
        let (to, wait) = self.expect_reply::<T>(target).await?;
        self.send_to(target, msg(to)).await?;
        self.within(target, extra_wait, wait).await
    }
}

/// The mesh ends of one core.
pub struct MeshEnds {
    /// Requests to other cores.
    pub requests: Senders<CoreMsg>,
    /// Requests from other cores.
    pub requests_in: Receivers<CoreMsg>,
    /// Answers to other cores.
    pub replies: Senders<ReplyMsg>,
    /// Answers from other cores.
    pub replies_in: Receivers<ReplyMsg>,
}

/// Requests from other cores that may wait long (long polls, held
/// heartbeats), by (asking core, request number): dropping the sender
/// ends the wait.
#[derive(Default)]
pub struct Running {
    stops: RefCell<HashMap<(usize, u64), glommio::channels::local_channel::LocalSender<()>>>,
}

impl Running {
    /// Waits being served now.
    pub fn len(&self) -> usize {
        self.stops.borrow().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Receives requests and answers from every peer: answers are delivered at
/// once; each request runs as its own task, `handle(ctx, msg)` (their
/// number is bounded by the senders' credits); a request that may wait
/// long ends early when its asker sends [`CoreMsg::Cancel`]. The handler is the
/// service's (`crate::service::remote::handle`, with the core as `ctx`):
/// the mesh only carries messages.
pub fn serve<C, F, Fut>(
    mesh: Rc<Mesh>,
    ctx: C,
    mut requests: Receivers<CoreMsg>,
    mut replies: Receivers<ReplyMsg>,
    handle: F,
) where
    C: Clone + 'static,
    F: Fn(C, CoreMsg) -> Fut + Clone + 'static,
    Fut: Future<Output = ()> + 'static,
{
    for (_, rx) in replies.streams() {
        let mesh = mesh.clone();
        glommio::spawn_local(async move {
            while let Some(m) = rx.recv().await {
                mesh.deliver(m.id, m.value);
            }
        })
        .detach();
    }
    for (_, rx) in requests.streams() {
        let (core, ctx, handle) = (mesh.clone(), ctx.clone(), handle.clone());
        glommio::spawn_local(async move {
            while let Some(msg) = rx.recv().await {
                if let CoreMsg::Cancel { from, id } = msg {
                    // Dropping the sender wakes the request's stop signal.
                    core.running.stops.borrow_mut().remove(&(from, id));
                    continue;
                }
                let Some(key) = msg.cancel_key() else {
                    glommio::spawn_local(handle(ctx.clone(), msg)).detach();
                    continue;
                };
                let (stop_tx, stop_rx) = glommio::channels::local_channel::new_bounded::<()>(1);
                core.running.stops.borrow_mut().insert(key, stop_tx);
                let work = handle(ctx.clone(), msg);
                let core = core.clone();
                glommio::spawn_local(async move {
                    // The work, or until cancelled (its ReplyTo, dropped
                    // with it, answers "dropped" to nobody).
                    futures_lite::future::or(work, async {
                        let _ = stop_rx.recv().await;
                    })
                    .await;
                    core.running.stops.borrow_mut().remove(&key);
                })
                .detach();
            }
        })
        .detach();
    }
}
