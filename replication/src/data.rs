//! The data plane between nodes: followers fetch from leaders, core to
//! core, over QUIC (per-core endpoints on each core's executor, see
//! [`crate::glommio_rt`]).
//!
//! A follower's core keeps one connection to each (node, core) it follows
//! partitions of, opened with a [`DataRequest::Hello`] (mutual TLS against
//! the cluster CA, as the controller's connections; another cluster id is
//! refused). Each fetch is one bidirectional stream: the request frame
//! (the 8-byte header of [`crate::wire`] and an rkyv body), then the
//! answer frame followed by the fetched batches as raw bytes, partition
//! after partition (`payload_len` each), appended by the follower byte for
//! byte. One fetch is out per connection at a time and asks at most
//! `max_bytes`, so a slow follower holds at most that much of its
//! leader's memory.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use rkyv::{Archive, Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::tls::{node_server_name, NodeTls};
pub use crate::wire::write_frame_with_payload;
use crate::wire::{decode, encode, read_frame};

/// A request on a data connection.
#[derive(Archive, Serialize, Deserialize, Debug, Clone)]
pub enum DataRequest {
    /// The first message of a connection.
    Hello {
        /// The sender's cluster id.
        cluster_id: String,
        /// The sender's node id.
        node_id: u64,
    },
    /// A follower fetches.
    Fetch(ReplicaFetch),
    /// A transaction coordinator on another node writes the markers of a
    /// decided transaction to partitions this core leads.
    Markers(MarkerWrite),
    /// A partition leader on another node asks this core, the transaction
    /// coordinator of `id`, whether the partition is in the producer's
    /// open transaction (KIP-890's verification).
    VerifyTxn {
        /// The transactional id.
        id: String,
        /// Its producer id.
        producer_id: i64,
        /// Its epoch.
        producer_epoch: i16,
        /// The partition written.
        tp: (String, u32),
        /// Add the partition to the transaction (KIP-890 v2's implicit
        /// add) rather than check it.
        add: bool,
    },
    /// A share partition's durable state (KIP-932), asked of or stored
    /// at the core leading its `__share_group_state` partition: read
    /// (`write` false) or written (`value`: the record's value, `None` a
    /// tombstone), answered once durable.
    ShareState {
        /// The record's key.
        key: Vec<u8>,
        /// The value to store.
        value: Option<Vec<u8>>,
        /// Store (else read).
        write: bool,
    },
    /// A node that took records for a partition this core leads (an
    /// OTLP export: its exporter cannot be sent elsewhere, as a Kafka
    /// client can) hands them on: one record batch, `payload_len` bytes
    /// after the frame, appended as an acks=all produce and answered
    /// once acknowledged or after `timeout_ms`.
    Produce {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Longest the leader waits for the acknowledgements.
        timeout_ms: u32,
        /// Bytes of the record batch after the frame (at most
        /// [`PRODUCE_BYTES_MAX`]).
        payload_len: u32,
    },
    /// A share partition (KIP-932) reset by an operator at the core that
    /// owns its topic partition (Kafka's AlterShareGroupOffsets,
    /// DeleteShareGroupOffsets): its start moved to `start`, or (`None`)
    /// its state deleted; answered once stored.
    ShareReset {
        /// The share partition's `__share_group_state` key.
        key: Vec<u8>,
        /// The new start offset (`None`: delete the state).
        start: Option<u64>,
    },
}

/// Largest record batch one [`DataRequest::Produce`] may carry (a
/// leader refuses more).
pub const PRODUCE_BYTES_MAX: usize = 64 << 20;

/// Markers ending producer `producer_id`'s transaction, one per partition.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Default)]
pub struct MarkerWrite {
    /// The transaction's producer id.
    pub producer_id: i64,
    /// The epoch the markers carry.
    pub producer_epoch: i16,
    /// Commit (else abort).
    pub commit: bool,
    /// The coordinator's epoch.
    pub coordinator_epoch: i32,
    /// (topic, partition) of each marker.
    pub partitions: Vec<(String, u32)>,
}

/// One marker's outcome, in request order.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct MarkerResult {
    /// Error code of the native protocol (0: written and durable).
    pub error: u16,
    /// Why, if it failed.
    pub message: Option<String>,
}

/// Most partitions one [`ReplicaFetch`] may name (a leader refuses more).
pub const FETCH_PARTITIONS_MAX: usize = 10_000;

/// A follower's fetch of the partitions it follows on one leader core.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Default)]
pub struct ReplicaFetch {
    /// The follower's node.
    pub replica: u64,
    /// Longest the leader waits for a new batch when it has none.
    pub max_wait_ms: u32,
    /// Most bytes of batches in the answer (at least one batch of the
    /// first partition with data is sent).
    pub max_bytes: u32,
    /// The partitions.
    pub partitions: Vec<FetchPart>,
}

/// One partition of a [`ReplicaFetch`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FetchPart {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// The leader epoch the follower knows (from the metadata).
    pub leader_epoch: u32,
    /// The follower's log end: the next offset it needs.
    pub fetch_offset: u64,
    /// The epoch of the follower's last batch (`None`: empty log, or no
    /// epochs known), for the divergence check.
    pub last_fetched_epoch: Option<u32>,
    /// Every batch below this is fdatasync'd on the follower.
    pub durable_offset: u64,
}

/// The answer to a [`DataRequest`].
#[derive(Archive, Serialize, Deserialize, Debug, Clone)]
pub enum DataResponse {
    /// Hello accepted.
    HelloOk,
    /// Refused (another cluster, a malformed request).
    Refused(String),
    /// Fetched batches follow the frame.
    Fetched(Vec<FetchedPart>),
    /// The markers' outcomes.
    Marked(Vec<MarkerResult>),
    /// A verification's outcome (error 0: the partition is in the open
    /// transaction).
    Verified(MarkerResult),
    /// A share state's read or write: its outcome, and the value read.
    ShareState(MarkerResult, Option<Vec<u8>>),
    /// A handed-on produce's outcome (error 0: appended and acknowledged).
    Produced(MarkerResult),
    /// A share partition reset's outcome (error 0: stored), and whether
    /// the group had state there.
    ShareReset(MarkerResult, bool),
}

/// One partition's answer, in request order.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct FetchedPart {
    /// Error code of the native protocol (0: none; `NotLeader`: this
    /// core does not lead it at the follower's epoch).
    pub error: u16,
    /// Why, if it failed.
    pub message: Option<String>,
    /// The leader's epoch.
    pub leader_epoch: u32,
    /// The leader's high watermark.
    pub high_watermark: u64,
    /// The leader's log start offset.
    pub log_start_offset: u64,
    /// The leader's log end offset.
    pub log_end_offset: u64,
    /// The follower's log diverges: truncate to where this epoch ends
    /// (`(epoch, end offset)`, the leader's answer for the follower's
    /// last fetched epoch), then fetch again. No batches then.
    pub diverging: Option<(u32, u64)>,
    /// Bytes of batches of this partition after the frame.
    pub payload_len: u32,
}

/// A follower core's connection to one leader core.
#[derive(Debug, Clone)]
pub struct DataLink {
    conn: quinn::Connection,
}

impl DataLink {
    /// Connects from `endpoint` to node `target`'s core endpoint at
    /// `addr` and says hello.
    pub async fn connect(
        endpoint: &quinn::Endpoint,
        target: u64,
        addr: SocketAddr,
        cluster_id: &str,
        node_id: u64,
    ) -> Result<DataLink> {
        let conn = endpoint
            .connect(addr, &node_server_name(target))
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
        let hello = DataRequest::Hello {
            cluster_id: cluster_id.to_string(),
            node_id,
        };
        let (mut send, mut recv) = conn.open_bi().await.map_err(open_stream)?;
        write_frame_with_payload(&mut send, &encode(&hello), &[]).await?;
        match decode::<DataResponse>(&read_frame(&mut recv).await?).map_err(malformed)? {
            DataResponse::HelloOk => Ok(DataLink { conn }),
            DataResponse::Refused(why) => {
                conn.close(1u32.into(), b"refused");
                Err(Error::Refused {
                    node: target,
                    addr: addr.to_string(),
                    reason: why,
                })
            }
            other => Err(Error::Unexpected {
                message: format!("node {target} answered a hello with {other:?}"),
            }),
        }
    }

    /// The connection's statistics (path MTU, losses, datagrams).
    pub fn stats(&self) -> quinn::ConnectionStats {
        self.conn.stats()
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.conn.close_reason().is_some()
    }

    /// Writes transaction markers on the linked core; each one's outcome.
    pub async fn markers(&self, req: &MarkerWrite) -> Result<Vec<MarkerResult>> {
        let (mut send, mut recv) = self.conn.open_bi().await.map_err(open_stream)?;
        let body = encode(&DataRequest::Markers(req.clone()));
        write_frame_with_payload(&mut send, &body, &[]).await?;
        match decode::<DataResponse>(&read_frame(&mut recv).await?).map_err(malformed)? {
            DataResponse::Marked(r) if r.len() == req.partitions.len() => Ok(r),
            DataResponse::Refused(why) => Err(Error::FetchRefused { reason: why }),
            other => Err(Error::Unexpected {
                message: format!("markers answered with {other:?}"),
            }),
        }
    }

    /// Asks the linked core (a transaction coordinator) whether `tp` is in
    /// producer (id, epoch)'s open transaction of `id` (with `add`: to add
    /// it, KIP-890 v2).
    pub async fn verify_txn(
        &self,
        id: &str,
        producer: (i64, i16),
        tp: (String, u32),
        add: bool,
    ) -> Result<MarkerResult> {
        let (mut send, mut recv) = self.conn.open_bi().await.map_err(open_stream)?;
        let req = DataRequest::VerifyTxn {
            id: id.to_string(),
            producer_id: producer.0,
            producer_epoch: producer.1,
            tp,
            add,
        };
        write_frame_with_payload(&mut send, &encode(&req), &[]).await?;
        match decode::<DataResponse>(&read_frame(&mut recv).await?).map_err(malformed)? {
            DataResponse::Verified(r) => Ok(r),
            DataResponse::Refused(why) => Err(Error::FetchRefused { reason: why }),
            other => Err(Error::Unexpected {
                message: format!("a verification answered with {other:?}"),
            }),
        }
    }

    /// Resets the share partition under `key` at the linked core (the
    /// one owning its topic partition): its start moved to `start`, or
    /// its state deleted; the outcome, and whether there was state.
    pub async fn share_reset(
        &self,
        key: Vec<u8>,
        start: Option<u64>,
    ) -> Result<(MarkerResult, bool)> {
        let (mut send, mut recv) = self.conn.open_bi().await.map_err(open_stream)?;
        let req = DataRequest::ShareReset { key, start };
        write_frame_with_payload(&mut send, &encode(&req), &[]).await?;
        match decode::<DataResponse>(&read_frame(&mut recv).await?).map_err(malformed)? {
            DataResponse::ShareReset(r, had) => Ok((r, had)),
            DataResponse::Refused(why) => Err(Error::FetchRefused { reason: why }),
            other => Err(Error::Unexpected {
                message: format!("a share reset answered with {other:?}"),
            }),
        }
    }

    /// Reads (`write` false) or stores the share state under `key` at the
    /// linked core (the leader of its `__share_group_state` partition):
    /// the outcome, and the value read.
    pub async fn share_state(
        &self,
        key: Vec<u8>,
        value: Option<Vec<u8>>,
        write: bool,
    ) -> Result<(MarkerResult, Option<Vec<u8>>)> {
        let (mut send, mut recv) = self.conn.open_bi().await.map_err(open_stream)?;
        let req = DataRequest::ShareState { key, value, write };
        write_frame_with_payload(&mut send, &encode(&req), &[]).await?;
        match decode::<DataResponse>(&read_frame(&mut recv).await?).map_err(malformed)? {
            DataResponse::ShareState(r, v) => Ok((r, v)),
            DataResponse::Refused(why) => Err(Error::FetchRefused { reason: why }),
            other => Err(Error::Unexpected {
                message: format!("a share state answered with {other:?}"),
            }),
        }
    }

    /// Hands `batch` (one record batch) to the linked core, the leader of
    /// `topic`-`partition`, as an acks=all produce waiting at most
    /// `timeout_ms`; its outcome.
    pub async fn produce(
        &self,
        (topic, partition): (&str, u32),
        batch: Bytes,
        timeout_ms: u32,
    ) -> Result<MarkerResult> {
        let (mut send, mut recv) = self.conn.open_bi().await.map_err(open_stream)?;
        let req = DataRequest::Produce {
            topic: topic.to_string(),
            partition,
            timeout_ms,
            payload_len: batch.len() as u32,
        };
        write_frame_with_payload(&mut send, &encode(&req), &[batch]).await?;
        match decode::<DataResponse>(&read_frame(&mut recv).await?).map_err(malformed)? {
            DataResponse::Produced(r) => Ok(r),
            DataResponse::Refused(why) => Err(Error::FetchRefused { reason: why }),
            other => Err(Error::Unexpected {
                message: format!("a produce answered with {other:?}"),
            }),
        }
    }

    /// Sends a fetch; returns each partition's answer with its batches
    /// (copied once, out of QUIC's packets: a batch the caller splits off
    /// with [`BytesMut::split_to`] is its own buffer without another copy).
    pub async fn fetch(&self, req: &ReplicaFetch) -> Result<Vec<(FetchedPart, BytesMut)>> {
        let (mut send, mut recv) = self.conn.open_bi().await.map_err(open_stream)?;
        write_frame_with_payload(&mut send, &encode(&DataRequest::Fetch(req.clone())), &[]).await?;
        let parts =
            match decode::<DataResponse>(&read_frame(&mut recv).await?).map_err(malformed)? {
                DataResponse::Fetched(parts) => parts,
                DataResponse::Refused(why) => return Err(Error::FetchRefused { reason: why }),
                other => {
                    return Err(Error::Unexpected {
                        message: format!("a fetch answered with {other:?}"),
                    })
                }
            };
        if parts.len() != req.partitions.len() {
            return Err(malformed(format!(
                "a fetch of {} partitions answered for {}",
                req.partitions.len(),
                parts.len()
            )));
        }
        // Room is made for what arrives, not for what the answer claims:
        // at most what the fetch asked for at first (a partition's answer
        // may pass it by a batch; the buffer grows as the bytes come).
        let asked = req.max_bytes.max(1) as usize;
        let mut out = Vec::with_capacity(parts.len());
        for p in parts {
            let len = p.payload_len as usize;
            let mut buf = BytesMut::with_capacity(len.min(asked));
            while buf.len() < len {
                let source = match recv.read_chunk(len - buf.len(), true).await {
                    Ok(Some(chunk)) => {
                        buf.extend_from_slice(&chunk.bytes);
                        continue;
                    }
                    Ok(None) => quinn::ReadExactError::FinishedEarly(buf.len()),
                    Err(e) => quinn::ReadExactError::ReadError(e),
                };
                return Err(Error::Read {
                    action: "reading fetched batches",
                    source,
                });
            }
            out.push((p, buf));
        }
        Ok(out)
    }
}

/// How a core's replication endpoint uses its UDP socket.
#[derive(Debug, Clone, Copy)]
pub struct UdpSettings {
    /// Receive and send buffer asked of the socket (see [`size_udp_buffers`]).
    pub buffer_bytes: usize,
    /// Largest UDP payload: what peers may send this endpoint, and how far
    /// path MTU discovery searches (it settles on what the path carries,
    /// 1452 on Ethernet's 1500; loopback and jumbo-frame networks take
    /// more). At least 1200 (QUIC's minimum).
    pub max_payload: u16,
}

/// A core's replication endpoint on `addr`, on the calling glommio
/// executor: serves [`DataRequest`]s (mutual TLS) and connects to other
/// nodes' cores, its socket set up as `udp` says.
pub fn core_endpoint(tls: &NodeTls, addr: SocketAddr, udp: UdpSettings) -> Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind(addr).map_err(|source| Error::Endpoint {
        action: format!("binding the replication endpoint on {addr}"),
        source,
    })?;
    size_udp_buffers(&socket, udp.buffer_bytes).map_err(|source| Error::Endpoint {
        action: format!("sizing the replication socket's buffers on {addr}"),
        source,
    })?;
    let max_payload = udp.max_payload.max(1200);
    let mut config = quinn::EndpointConfig::default();
    config
        .max_udp_payload_size(max_payload)
        .map_err(|e| Error::Endpoint {
            action: format!("setting the replication endpoint's UDP payload to {max_payload}"),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
        })?;
    let transport = crate::tls::transport_with_mtu(max_payload);
    let mut server = tls.server_config()?;
    server.transport_config(transport.clone());
    let mut client = tls.client_config()?;
    client.transport_config(transport);
    let mut endpoint = quinn::Endpoint::new(
        config,
        Some(server),
        socket,
        Arc::new(crate::glommio_rt::GlommioRuntime::new(max_payload)),
    )
    .map_err(|source| Error::Endpoint {
        action: "starting the replication endpoint".to_string(),
        source,
    })?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}

/// Asks for `bytes` of receive and send buffer on a replication socket.
/// A follower's fetch answer leaves the leader in bursts of up to 64
/// datagrams per send; at the kernel's default receive buffer (208 KiB)
/// the follower's socket overflows, every drop is a congestion event and
/// the stream crawls. Returns the receive buffer the kernel granted; a
/// grant below the ask (capped by `net.core.rmem_max` / `wmem_max`) is
/// logged once with the fix.
pub fn size_udp_buffers(socket: &std::net::UdpSocket, bytes: usize) -> std::io::Result<usize> {
    let sock = socket2::SockRef::from(socket);
    sock.set_recv_buffer_size(bytes)?;
    sock.set_send_buffer_size(bytes)?;
    let (rcv, snd) = (sock.recv_buffer_size()?, sock.send_buffer_size()?);
    // Linux reports twice what was granted (its bookkeeping overhead).
    let factor = if cfg!(target_os = "linux") { 2 } else { 1 };
    if rcv < bytes * factor || snd < bytes * factor {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                asked = bytes,
                receive = rcv / factor,
                send = snd / factor,
                "the replication socket's buffers are smaller than asked (capped by the kernel): \
                 follower streams may drop datagrams and slow down under load; raise the caps \
                 with `sysctl -w net.core.rmem_max={bytes} net.core.wmem_max={bytes}`"
            )
        });
    }
    Ok(rcv / factor)
}

/// Reads a data connection's hello: `Ok(node)` for a node of
/// `cluster_id` (answered `HelloOk`), else refuses it and fails.
pub async fn accept_hello(conn: &quinn::Connection, cluster_id: &str) -> Result<u64> {
    let (mut send, mut recv) = conn.accept_bi().await.map_err(|source| Error::Connection {
        action: "accepting a stream",
        source,
    })?;
    let hello = decode::<DataRequest>(&read_frame(&mut recv).await?).map_err(malformed)?;
    match hello {
        DataRequest::Hello {
            cluster_id: theirs,
            node_id,
        } if theirs == cluster_id => {
            if let Err(e) = crate::tls::check_peer_is(conn, node_id) {
                let why = e.chain().to_string();
                write_frame_with_payload(&mut send, &encode(&DataResponse::Refused(why)), &[])
                    .await?;
                let _ = send.stopped().await;
                conn.close(1u32.into(), b"not that node");
                return Err(Error::PeerRejected {
                    source: Box::new(e),
                });
            }
            write_frame_with_payload(&mut send, &encode(&DataResponse::HelloOk), &[]).await?;
            Ok(node_id)
        }
        DataRequest::Hello {
            cluster_id: theirs,
            node_id,
        } => {
            let why = format!("cluster id `{theirs}` is not this cluster's (`{cluster_id}`)");
            write_frame_with_payload(&mut send, &encode(&DataResponse::Refused(why)), &[]).await?;
            let _ = send.stopped().await;
            conn.close(1u32.into(), b"wrong cluster");
            Err(Error::WrongCluster {
                node: node_id,
                cluster_id: theirs,
            })
        }
        DataRequest::Fetch(_)
        | DataRequest::Markers(_)
        | DataRequest::VerifyTxn { .. }
        | DataRequest::ShareState { .. }
        | DataRequest::ShareReset { .. }
        | DataRequest::Produce { .. } => {
            conn.close(1u32.into(), b"hello first");
            Err(Error::NoHello)
        }
    }
}

fn open_stream(source: quinn::ConnectionError) -> Error {
    Error::Connection {
        action: "opening a stream",
        source,
    }
}

fn malformed(message: String) -> Error {
    Error::Malformed { message }
}
