//! Outgoing node links: one QUIC connection per peer, opened on first use
//! (TLS handshake both ways, then a hello naming this node's cluster and
//! id) and reused; each call is one bidirectional stream. A failed call
//! drops the connection, so the next one reconnects.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::tls::node_server_name;
use crate::wire::{decode, encode, read_frame, write_frame, Request, Response};

/// The longest a call to a peer may take, connection set-up included.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(500);

/// A boxed call in flight.
pub type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<Response>> + Send + 'a>>;

/// How the controller reaches its peers: the QUIC [`Links`] in a node; a
/// simulated network in the controller's simulation tests.
pub trait Transport: Send + Sync + 'static {
    /// Sends `request` to node `target` at `addr` and returns its answer,
    /// or an error after `limit` (at most [`CALL_TIMEOUT`]).
    fn call_within<'a>(
        &'a self,
        target: u64,
        addr: &'a str,
        request: &'a Request,
        limit: Duration,
    ) -> CallFuture<'a>;

    /// [`Transport::call_within`] with [`CALL_TIMEOUT`].
    fn call<'a>(&'a self, target: u64, addr: &'a str, request: &'a Request) -> CallFuture<'a> {
        self.call_within(target, addr, request, CALL_TIMEOUT)
    }
}

impl Transport for Links {
    fn call_within<'a>(
        &'a self,
        target: u64,
        addr: &'a str,
        request: &'a Request,
        limit: Duration,
    ) -> CallFuture<'a> {
        Box::pin(Links::call_within(self, target, addr, request, limit))
    }
}

/// This node's outgoing connections. Cheap to clone.
#[derive(Clone)]
pub struct Links {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: quinn::Endpoint,
    cluster_id: String,
    node_id: u64,
    conns: Mutex<HashMap<u64, quinn::Connection>>,
}

impl Links {
    /// Links from `endpoint` (whose default client config presents this
    /// node's certificate).
    pub fn new(endpoint: quinn::Endpoint, cluster_id: String, node_id: u64) -> Self {
        Self {
            inner: Arc::new(Inner {
                endpoint,
                cluster_id,
                node_id,
                conns: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Sends `request` to node `target` at `addr` and returns its answer,
    /// or an error after [`CALL_TIMEOUT`] (a peer killed without closing
    /// its connections would otherwise hold the call for QUIC's idle
    /// timeout).
    pub async fn call(&self, target: u64, addr: &str, request: &Request) -> Result<Response> {
        self.call_within(target, addr, request, CALL_TIMEOUT).await
    }

    /// [`Links::call`] with a time limit of the caller's (at most
    /// [`CALL_TIMEOUT`]). A call that times out drops the connection
    /// whatever the limit: a restarted peer's old connection would
    /// otherwise be kept, and fail every call, until QUIC's idle timeout
    /// (Raft's calls have limits shorter than `CALL_TIMEOUT`, and a
    /// restarted node that hears no leader for an election timeout starts
    /// elections).
    pub async fn call_within(
        &self,
        target: u64,
        addr: &str,
        request: &Request,
        limit: std::time::Duration,
    ) -> Result<Response> {
        let limit = limit.min(CALL_TIMEOUT);
        match tokio::time::timeout(limit, self.call_inner(target, addr, request)).await {
            Ok(r) => r,
            Err(_) => {
                self.inner
                    .conns
                    .lock()
                    .expect("not poisoned")
                    .remove(&target);
                Err(Error::Timeout {
                    node: target,
                    addr: addr.to_string(),
                    limit,
                })
            }
        }
    }

    async fn call_inner(&self, target: u64, addr: &str, request: &Request) -> Result<Response> {
        let conn = self.connection(target, addr).await?;
        match exchange(&conn, request).await {
            Ok(r) => Ok(r),
            Err(e) => {
                self.forget(target, &conn);
                Err(e)
            }
        }
    }

    fn forget(&self, target: u64, conn: &quinn::Connection) {
        let mut conns = self.inner.conns.lock().expect("not poisoned");
        if conns
            .get(&target)
            .is_some_and(|c| c.stable_id() == conn.stable_id())
        {
            conns.remove(&target);
        }
    }

    async fn connection(&self, target: u64, addr: &str) -> Result<quinn::Connection> {
        if let Some(c) = self.inner.conns.lock().expect("not poisoned").get(&target) {
            if c.close_reason().is_none() {
                return Ok(c.clone());
            }
        }
        let sock: SocketAddr = tokio::net::lookup_host(addr)
            .await
            .map_err(|source| Error::Resolve {
                node: target,
                addr: addr.to_string(),
                source,
            })?
            .next()
            .ok_or_else(|| Error::Unresolved {
                node: target,
                addr: addr.to_string(),
            })?;
        let conn = self
            .inner
            .endpoint
            .connect(sock, &node_server_name(target))
            .map_err(|source| Error::Connect {
                node: target,
                addr: addr.to_string(),
                source,
            })?
            .await
            .map_err(|source| Error::Handshake {
                node: target,
                addr: addr.to_string(),
                source,
            })?;
        let hello = Request::Hello {
            cluster_id: self.inner.cluster_id.clone(),
            node_id: self.inner.node_id,
        };
        match exchange(&conn, &hello).await? {
            Response::HelloOk => {}
            Response::Refused(why) => {
                conn.close(1u32.into(), b"refused");
                return Err(Error::Refused {
                    node: target,
                    addr: addr.to_string(),
                    reason: why,
                });
            }
            other => {
                return Err(Error::Unexpected {
                    message: format!("node {target} answered a hello with {other:?}"),
                })
            }
        }
        self.inner
            .conns
            .lock()
            .expect("not poisoned")
            .insert(target, conn.clone());
        Ok(conn)
    }
}

/// One request and its answer on a new stream of `conn`.
pub async fn exchange(conn: &quinn::Connection, request: &Request) -> Result<Response> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|source| Error::Connection {
        action: "opening a stream",
        source,
    })?;
    write_frame(&mut send, &encode(request)).await?;
    let body = read_frame(&mut recv).await?;
    decode(&body).map_err(|e| Error::Malformed {
        message: format!("answer from {}: {e}", conn.remote_address()),
    })
}
