//! Outgoing node links: one QUIC connection per peer, opened on first use
//! (TLS handshake both ways, then a hello naming this node's cluster and
//! id) and reused; each call is one bidirectional stream. A failed call
//! drops the connection, so the next one reconnects.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context};

use crate::tls::node_server_name;
use crate::wire::{decode, encode, read_frame, write_frame, Request, Response};

/// The longest a call to a peer may take, connection set-up included.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

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
    pub async fn call(
        &self,
        target: u64,
        addr: &str,
        request: &Request,
    ) -> anyhow::Result<Response> {
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
    ) -> anyhow::Result<Response> {
        let limit = limit.min(CALL_TIMEOUT);
        match tokio::time::timeout(limit, self.call_inner(target, addr, request)).await {
            Ok(r) => r,
            Err(_) => {
                self.inner
                    .conns
                    .lock()
                    .expect("not poisoned")
                    .remove(&target);
                bail!("node {target} at {addr} did not answer within {limit:?}")
            }
        }
    }

    async fn call_inner(
        &self,
        target: u64,
        addr: &str,
        request: &Request,
    ) -> anyhow::Result<Response> {
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

    async fn connection(&self, target: u64, addr: &str) -> anyhow::Result<quinn::Connection> {
        if let Some(c) = self.inner.conns.lock().expect("not poisoned").get(&target) {
            if c.close_reason().is_none() {
                return Ok(c.clone());
            }
        }
        let sock: SocketAddr = tokio::net::lookup_host(addr)
            .await
            .with_context(|| format!("resolving node {target}'s address `{addr}`"))?
            .next()
            .ok_or_else(|| anyhow!("node {target}'s address `{addr}` resolves to nothing"))?;
        let conn = self
            .inner
            .endpoint
            .connect(sock, &node_server_name(target))
            .with_context(|| format!("connecting to node {target} at {addr}"))?
            .await
            .with_context(|| format!("TLS handshake with node {target} at {addr}"))?;
        let hello = Request::Hello {
            cluster_id: self.inner.cluster_id.clone(),
            node_id: self.inner.node_id,
        };
        match exchange(&conn, &hello).await? {
            Response::HelloOk => {}
            Response::Refused(why) => {
                conn.close(1u32.into(), b"refused");
                bail!("node {target} at {addr} refused this node: {why}");
            }
            other => bail!("node {target} answered a hello with {other:?}"),
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
pub async fn exchange(conn: &quinn::Connection, request: &Request) -> anyhow::Result<Response> {
    let (mut send, mut recv) = conn.open_bi().await?;
    write_frame(&mut send, &encode(request)).await?;
    let body = read_frame(&mut recv).await?;
    decode(&body).map_err(|e| anyhow!("answer from {}: {e}", conn.remote_address()))
}
