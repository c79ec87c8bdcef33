//! # weir-client
//!
//! An async client for Weir's native protocol, for ordinary
//! [tokio](https://tokio.rs) applications (it does not use glommio).
//!
//! Applications start from one builder per role:
//! [`Producer::builder`] and [`Consumer::builder`] take a bootstrap list of
//! host names (`"broker1:9292,broker2:9292"`, connected with retries, see
//! [`Client::bootstrap`]) and settings by Kafka's property names
//! ([`properties`]). The producer sends from a thread of its own, so it
//! works on any runtime flavour; [`Producer::send_with`] calls back once
//! per record, [`Producer::statistics`] counts what it did. Every type the
//! API uses is reachable from this crate ([`ErrorCode`], [`OffsetSpec`],
//! …; the protocol crate as [`proto`]).
//!
//! A [`Client`] holds one TCP connection to one broker listener. The broker
//! routes every request to the cores that own its partitions, so one
//! connection to the bootstrap address reaches every partition.
//! [`Client::connect_lazy`] makes a client that connects on its first call.
//!
//! * admin: [`Client::create_topic`], [`Client::delete_topic`],
//!   [`Client::list_topics`], [`Client::describe_topic`],
//!   [`Client::alter_configs`], [`Client::create_partitions`],
//!   [`Client::metadata`];
//! * data: [`Client::produce`] / [`Client::produce_many`] (record batches,
//!   e.g. from [`weir_proto::builder::BatchBuilder`], sent without copying),
//!   [`Client::fetch`] / [`Client::fetch_many`] (whole batches, sliced from
//!   the response without copying), [`Client::list_offsets`];
//! * idempotence: [`Client::init_producer_id`];
//! * consumer groups ([`groups`]): [`Client::commit_offsets`],
//!   [`Client::committed_offsets`], [`Client::list_groups`],
//!   [`Client::describe_group`], [`Client::group_lag`],
//!   [`Client::delete_group`], and the membership calls a
//!   [`GroupConsumer`] makes.
//!
//! Per-topic and per-partition failures become [`ClientError::Topic`] and
//! [`ClientError::Partition`] with the server's code and message.
//!
//! ## Concurrency
//!
//! Concurrent calls on one `Client` (from several tasks sharing an
//! `Arc<Client>`, or futures joined in one task) are pipelined on its one
//! connection: each call writes its request as soon as it reaches the
//! connection, without waiting for the answers to earlier ones, and a
//! reader task hands every answer to its caller by correlation id. The
//! broker starts the requests of a connection in order and answers them in
//! order, up to 32 at a time; [`ClientConfig::max_in_flight`] (default 32)
//! bounds how many requests of one connection await their answers at once.
//! Further calls wait for a slot, in order.
//!
//! **Requests are sent in the order the calls reached the connection.** A
//! call reaches it at its first `.await` point, when its future is first
//! polled: every method goes straight to a fair (FIFO) lock, with no await
//! before it. So calls started one after the other from one task are sent,
//! and started by the broker, in that order — e.g. `produce_many` A then B
//! in `tokio::join!(a, b)`, or futures pushed in order into something that
//! polls them in order. Calls from different tasks are ordered by when
//! those tasks first run, which is the scheduler's choice (tasks spawned in
//! order need not start in that order on a multi-thread runtime).
//!
//! ## Failures and cancellation
//!
//! Every call is bounded by [`ClientConfig::request_timeout`] (plus the
//! long-poll wait for fetches), counted from when its request starts being
//! written; waiting for the connection lock or an in-flight slot is not
//! counted, and connecting is bounded by [`ClientConfig::connect_timeout`].
//!
//! * An I/O error, an answer that cannot be decoded or is a frame-level
//!   error ([`ClientError::Protocol`], [`ClientError::Server`]), an answer to
//!   a request that was not sent, or the server closing the connection
//!   fails the connection: the call gets its error, every other call waiting
//!   for an answer on it gets [`ClientError::Disconnected`] (or the same
//!   I/O error), the connection is closed, and the next call opens a new
//!   one.
//! * A call that times out gets [`ClientError::Timeout`] and closes the
//!   connection too (as Kafka's client does), failing the others in flight
//!   on it with [`ClientError::Disconnected`].
//! * A call whose future is dropped before its request is sent sends
//!   nothing. Dropped while its request is being written, it leaves half a
//!   frame: the connection is failed as above. Dropped after its request
//!   was written, its answer is discarded when it arrives and the
//!   connection stays (if no answer arrives within the call's timeout, the
//!   connection is closed as if the call had timed out, so abandoned
//!   requests cannot hold the in-flight slots forever).
//!
//! Calls are never retried automatically: after
//! [`ClientError::Disconnected`] or a timeout, the request may or may not
//! have been carried out. Per-topic and per-partition errors leave the
//! connection open.
//!
//! ```no_run
//! # async fn demo() -> weir_client::Result<()> {
//! use bytes::Bytes;
//! use weir_client::proto::batch::Compression;
//! use weir_client::proto::builder::BatchBuilder;
//! use weir_client::proto::record::RecordData;
//! use weir_client::{Acks, Client, ClientConfig};
//!
//! let client = Client::bootstrap("localhost:9292", ClientConfig::default()).await?;
//! client.create_topic("events", 4, vec![]).await?;
//! let mut b = BatchBuilder::new(Compression::None)?;
//! b.push(&RecordData { value: Some(Bytes::from("hello")), timestamp: 0, ..Default::default() })?;
//! let offset = client.produce("events", 0, b.build()?.freeze(), Acks::All).await?;
//! let fetched = client.fetch("events", 0, 0, 1 << 20, 500).await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod batches;
mod bootstrap;
mod builder;
mod conn;
pub mod consumer;
mod error;
pub mod group_consumer;
pub mod groups;
pub mod partitioner;
pub mod producer;
pub mod properties;
pub mod sasl;
pub mod share_consumer;
pub mod stats;
pub mod tls;
pub mod transactional;
pub mod txns;

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::ToSocketAddrs;
use weir_proto::batch::BatchHeader;
use weir_proto::frame::{self, RequestHeader, FRAME_BYTES_MAX_DEFAULT};
use weir_proto::messages::{
    AlterConfigsRequest, ApiVersionsRequest, CompactRequest, CreatePartitionsRequest,
    CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest, ErrorBody, FetchRequest,
    InitProducerIdRequest, ListOffsetsPartition, ListOffsetsRequest, MetadataRequest, NewTopic,
    PartitionReassignment, ProducePartition, ProduceRequest, ReassignPartitionsRequest, Request,
    TopicResult,
};

pub use batches::{split_batches, FetchedBatches};
pub use bootstrap::Bootstrap;
pub use builder::{ConsumerBuilder, ProducerBuilder, ShareConsumerBuilder};
pub use consumer::{Consumer, ConsumerConfig, ConsumerRecord, IsolationLevel, OffsetReset};
pub use error::{ClientError, Result};
pub use group_consumer::{GroupAssignor, GroupConsumer, GroupConsumerConfig, RebalanceListener};
pub use groups::{PartitionLag, TopicPartition};
pub use producer::{
    Compression, DeliveryCallback, DeliveryFuture, Partitioner, Producer, ProducerConfig,
    ProducerRecord, RecordMetadata, ShardRouter,
};
pub use properties::{Properties, PropertyError};
pub use share_consumer::{
    AcknowledgeType, AcknowledgementMode, AcquireMode, ShareConsumer, ShareConsumerConfig,
    ShareRecord,
};
pub use stats::{ConsumerStats, ProducerStats};
pub use tls::{SecurityProtocol, TlsSettings};

/// The protocol crate the client speaks, for what this crate does not
/// re-export by name (raw batch building and reading).
pub use weir_proto as proto;
/// Error codes the broker answers with ([`ClientError::code`]).
pub use weir_proto::error_code::ErrorCode;
/// Types of the protocol that appear in this crate's API.
pub use weir_proto::messages::{
    ApiVersionRange, CompactPartitionResult, ConfigEntry, FetchPartition, MetadataResponse,
    OffsetSpec, TopicConfigs, TopicMetadata,
};

/// Settings of a [`Client`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Longest wait for one answer (a fetch may also wait its
    /// `max_wait_ms`); also sent as a produce request's `timeout_ms`.
    /// Default 30 s.
    pub request_timeout: Duration,
    /// Longest wait to establish the TCP connection. Default 10 s.
    pub connect_timeout: Duration,
    /// Largest response frame accepted. Default
    /// [`FRAME_BYTES_MAX_DEFAULT`] (100 MiB).
    pub max_frame_bytes: usize,
    /// Most requests of the connection awaiting their answers at once;
    /// further calls wait (in order) until an answer frees a slot.
    /// Requests that get no answer ([`Acks::None`]) take no slot. 0 counts
    /// as 1. Default 32 (what the broker works on per connection).
    pub max_in_flight: usize,
    /// [`Client::bootstrap`]: first wait after a round of the bootstrap
    /// servers all failed to connect; it doubles after each round up to
    /// `reconnect_backoff_max` (Kafka's `reconnect.backoff.ms`). Default
    /// 50 ms.
    pub reconnect_backoff: Duration,
    /// [`Client::bootstrap`]: longest wait between rounds (Kafka's
    /// `reconnect.backoff.max.ms`). Default 1 s.
    pub reconnect_backoff_max: Duration,
    /// [`Client::bootstrap`]: how long it keeps trying before it returns
    /// the last error. Default 60 s.
    pub bootstrap_timeout: Duration,
    /// Plain TCP or TLS (`security.protocol`). Default plaintext.
    pub security_protocol: SecurityProtocol,
    /// The CA, client certificate and server name of TLS connections
    /// (`ssl.*`; used with [`SecurityProtocol::Ssl`]).
    pub tls: TlsSettings,
    /// `sasl.mechanism` of SASL_* connections (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN).
    pub sasl_mechanism: Option<weir_proto::sasl::Mechanism>,
    /// `sasl.username`.
    pub sasl_username: Option<String>,
    /// `sasl.password`.
    pub sasl_password: Option<String>,
    /// OAUTHBEARER: the file holding the JWT to present
    /// (`weir.sasl.oauthbearer.token.file`), read again at every login so
    /// that whatever refreshes it (an agent, a sidecar) is followed.
    pub sasl_oauthbearer_token_file: Option<std::path::PathBuf>,
    /// The transactional id every produce request carries (set by
    /// [`crate::transactional::TransactionalProducer`] on its own
    /// connections; `None`: plain and idempotent producers).
    pub transactional_id: Option<String>,
    /// The rustls configuration `tls` describes, once built.
    tls_built: tls::Built,
}

impl ClientConfig {
    /// The SASL login of SASL_* connections, or why it is incomplete.
    pub(crate) fn sasl(&self) -> Option<std::result::Result<sasl::SaslSettings, String>> {
        if !self.security_protocol.sasl() {
            return None;
        }
        Some(
            match (&self.sasl_mechanism, &self.sasl_username, &self.sasl_password) {
                (Some(weir_proto::sasl::Mechanism::OAuthBearer), _, _) => {
                    match &self.sasl_oauthbearer_token_file {
                        Some(f) => Ok(sasl::SaslSettings {
                            mechanism: weir_proto::sasl::Mechanism::OAuthBearer,
                            username: String::new(),
                            password: String::new(),
                            token_file: Some(f.clone()),
                        }),
                        None => Err("sasl.mechanism OAUTHBEARER needs weir.sasl.oauthbearer.token.file (the JWT to present)".into()),
                    }
                }
                (Some(m), Some(u), Some(p)) => Ok(sasl::SaslSettings {
                    mechanism: *m,
                    username: u.clone(),
                    password: p.clone(),
                    token_file: None,
                }),
                _ => Err("security.protocol SASL_* needs sasl.mechanism, sasl.username and sasl.password".into()),
            },
        )
    }
}

impl ClientConfig {
    /// The connection settings among Kafka-style properties:
    /// `security.protocol`, `ssl.ca.location`, `ssl.certificate.location`,
    /// `ssl.key.location`, `request.timeout.ms`,
    /// `socket.connection.setup.timeout.ms`, `reconnect.backoff(.max).ms`,
    /// `weir.bootstrap.timeout.ms`. Other names are skipped (they are the
    /// producer's or consumer's: see [`ProducerBuilder::from_config`]); a
    /// bad value is an error.
    pub fn from_properties<K: AsRef<str>, V: AsRef<str>>(
        properties: impl IntoIterator<Item = (K, V)>,
    ) -> std::result::Result<ClientConfig, PropertyError> {
        let mut c = ClientConfig::default();
        for (k, v) in properties {
            properties::apply_client(&mut c, k.as_ref(), v.as_ref())?;
        }
        Ok(c)
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            max_frame_bytes: FRAME_BYTES_MAX_DEFAULT,
            max_in_flight: 32,
            reconnect_backoff: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_secs(1),
            bootstrap_timeout: Duration::from_secs(60),
            security_protocol: SecurityProtocol::Plaintext,
            tls: TlsSettings::default(),
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: None,
            sasl_oauthbearer_token_file: None,
            transactional_id: None,
            tls_built: tls::Built::default(),
        }
    }
}

/// When the broker acknowledges a produce request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Acks {
    /// Fire and forget (`acks=0`): the client does not wait for an answer,
    /// so it learns neither offsets nor errors.
    None,
    /// After the owning core appended the batches (`acks=1`).
    Leader,
    /// After the batches are durable (and, later, replicated) (`acks=all`,
    /// `-1`). The default.
    #[default]
    All,
}

impl Acks {
    /// The value on the wire: 0, 1 or -1.
    pub fn as_i8(self) -> i8 {
        match self {
            Acks::None => 0,
            Acks::Leader => 1,
            Acks::All => -1,
        }
    }
}

impl FromStr for Acks {
    type Err = String;

    /// Parses `0`, `1`, `all` or `-1`.
    fn from_str(s: &str) -> std::result::Result<Acks, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "0" | "none" => Ok(Acks::None),
            "1" | "leader" => Ok(Acks::Leader),
            "all" | "-1" => Ok(Acks::All),
            other => Err(format!("invalid acks `{other}`: use 0, 1 or all")),
        }
    }
}

impl fmt::Display for Acks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Acks::None => "0",
            Acks::Leader => "1",
            Acks::All => "all",
        })
    }
}

/// A broker's advertised `host` and `port` as an address: an IP as it is
/// (the unspecified address, a broker listening on every interface:
/// `fallback`, the IP the client reached it at), a host name resolved to
/// its first address (`fallback` if it resolves to nothing).
pub(crate) async fn resolve_advertised(host: &str, port: u16, fallback: IpAddr) -> SocketAddr {
    if let Ok(ip) = host.parse::<IpAddr>() {
        let ip = if ip.is_unspecified() { fallback } else { ip };
        return SocketAddr::new(ip, port);
    }
    if !host.is_empty() {
        if let Ok(mut addrs) = tokio::net::lookup_host((host, port)).await {
            if let Some(a) = addrs.next() {
                return a;
            }
        }
    }
    SocketAddr::new(fallback, port)
}

/// The configuration of a connection to a broker known as `host` (a
/// bootstrap entry's, or what the broker advertises): over TLS its
/// certificate must name that host, as Kafka clients check it (unless
/// `weir.ssl.server.name` names another); an IP address is checked as the
/// address connected to.
pub(crate) fn config_for_host(config: &ClientConfig, host: &str) -> ClientConfig {
    let mut c = config.clone();
    let host = host.trim_matches(['[', ']']);
    let named = !host.is_empty() && host.parse::<IpAddr>().is_err();
    if c.security_protocol.tls() && c.tls.server_name.is_none() && named {
        c.tls.server_name = Some(host.to_string());
    }
    c
}

/// The host of a `host:port` (the whole text if it has no port).
pub(crate) fn host_of(host_port: &str) -> &str {
    host_port.rsplit_once(':').map_or(host_port, |(h, _)| h)
}

/// A node's advertised `host:port` (as `DescribeCluster` lists it) as an
/// address; `None` if it is not `host:port`.
pub(crate) async fn node_addr(advertised: &str, fallback: IpAddr) -> Option<SocketAddr> {
    let (host, port) = advertised.rsplit_once(':')?;
    let port = port.parse::<u16>().ok()?;
    Some(resolve_advertised(host.trim_matches(['[', ']']), port, fallback).await)
}

/// How long [`Client::describe_topic`] waits for another node's view of
/// the partitions that node leads.
pub const DESCRIBE_ELSEWHERE_WITHIN: Duration = Duration::from_secs(3);

/// A connection to a Weir broker, shared by concurrent calls (pipelined).
/// See the [crate docs](crate) for the concurrency and failure model.
pub struct Client {
    addr: SocketAddr,
    config: ClientConfig,
    conn: std::sync::Arc<conn::Pipeline>,
    /// Groups coordinated by another node (learned from `NotCoordinator`
    /// answers): group id → a connection to its coordinator's core.
    coordinators: std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Client>>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("addr", &self.addr).finish()
    }
}

/// A decoded answer: its body and its payload (a slice of the frame).
struct Answer<T> {
    body: T,
    payload: Bytes,
}

impl Client {
    /// Connects to a broker listener with the default [`ClientConfig`].
    pub async fn connect(addr: impl ToSocketAddrs) -> Result<Client> {
        Client::connect_with(addr, ClientConfig::default()).await
    }

    /// Connects to a broker listener (the first address of `addr` that
    /// accepts).
    pub async fn connect_with(addr: impl ToSocketAddrs, config: ClientConfig) -> Result<Client> {
        let mut last = None;
        for a in tokio::net::lookup_host(addr).await? {
            let client = Client::connect_lazy(a, config.clone());
            match client.conn.connect().await {
                Ok(()) => return Ok(client),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the address resolved to nothing",
            ))
        }))
    }

    /// A client for the broker listener at `addr` that does not connect
    /// until its first call (which fails if connecting fails; the next one
    /// tries again). Needs no runtime until then.
    pub fn connect_lazy(addr: SocketAddr, config: ClientConfig) -> Client {
        Client {
            addr,
            conn: std::sync::Arc::new(conn::Pipeline::new(addr, &config)),
            config,
            coordinators: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Connects to the first reachable server of a bootstrap list
    /// (`"broker1:9292,broker2:9292"`, host names or IP addresses; see
    /// [`Bootstrap`]), trying every address each name resolves to, round
    /// after round with a growing wait ([`ClientConfig::reconnect_backoff`]
    /// doubling up to [`ClientConfig::reconnect_backoff_max`]), for up to
    /// [`ClientConfig::bootstrap_timeout`]; then fails with the last
    /// error. Names are resolved again in each round. Once connected, the
    /// client keeps the address that answered: after a failure its next
    /// call connects there again.
    ///
    /// ```no_run
    /// # async fn demo() -> weir_client::Result<()> {
    /// use weir_client::{Client, ClientConfig};
    ///
    /// let client = Client::bootstrap("localhost:9292", ClientConfig::default()).await?;
    /// println!("topics: {:?}", client.list_topics().await?);
    /// # Ok(()) }
    /// ```
    pub async fn bootstrap(servers: &str, config: ClientConfig) -> Result<Client> {
        let servers: Bootstrap = servers.parse()?;
        servers.connect(config).await
    }

    /// The broker address this client talks to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client for the same address and settings that connects on its
    /// first call (from whichever runtime makes it).
    pub(crate) fn reopen_lazy(&self) -> Client {
        Client::connect_lazy(self.addr, self.config.clone())
    }

    /// The client's settings.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Sends `req` followed by `payload`; waits for the answer unless
    /// `expect_answer` is false. `extra_wait` is added to the timeout.
    ///
    /// No await comes before the connection's lock (see
    /// [`conn::Pipeline::exchange`]): that is what sends requests in the
    /// order the calls reached the connection.
    async fn call<R: Request>(
        &self,
        req: &R,
        payload: &[Bytes],
        extra_wait: Duration,
        expect_answer: bool,
    ) -> Result<Option<Answer<R::Response>>> {
        let payload_len = payload.iter().map(|p| p.len()).sum();
        // The connection sets the correlation id when the request's turn
        // comes.
        let head = frame::encode_request(&RequestHeader::of::<R>(0), req, payload_len)?;
        let limit = self.config.request_timeout + extra_wait;
        // A login due for renewal (KIP-368) is renewed beside this call.
        self.conn.reauthenticate_if_due();
        self.conn
            .exchange(head, payload, limit, expect_answer, |frame| {
                decode_answer::<R>(&frame)
            })
            .await
    }

    /// [`Client::call`] for requests that always get an answer.
    async fn request<R: Request>(&self, req: &R) -> Result<R::Response> {
        let answer = self.call(req, &[], Duration::ZERO, true).await?;
        Ok(answer.expect("an answer was expected").body)
    }

    /// The cluster as the answering node sees it: nodes, controller
    /// leader, the metadata version it has applied.
    pub async fn describe_cluster(&self) -> Result<weir_proto::messages::DescribeClusterResponse> {
        self.request(&weir_proto::messages::DescribeClusterRequest {})
            .await
    }

    /// Adds node `node_id` (reachable at `replication`) to the controller
    /// voters, or removes it (`replication` ignored). Must reach the
    /// controller leader: another node answers with `error = NotLeader`
    /// and the leader's id, which the caller asks instead.
    pub async fn change_voters(
        &self,
        node_id: u64,
        add: bool,
        replication: &str,
    ) -> Result<weir_proto::messages::ChangeVotersResponse> {
        self.request(&weir_proto::messages::ChangeVotersRequest {
            node_id,
            add,
            replication: replication.to_string(),
        })
        .await
    }

    /// Adds ACLs (Kafka's CreateAcls); one result per binding.
    pub async fn create_acls(
        &self,
        acls: Vec<weir_proto::messages::AclEntry>,
    ) -> Result<Vec<weir_proto::messages::AclResult>> {
        let r = self
            .request(&weir_proto::messages::CreateAclsRequest { acls })
            .await?;
        Ok(r.results)
    }

    /// The ACLs `filter` matches (Kafka's DescribeAcls).
    pub async fn describe_acls(
        &self,
        filter: weir_proto::messages::AclFilterEntry,
    ) -> Result<weir_proto::messages::AclResult> {
        let r = self
            .request(&weir_proto::messages::DescribeAclsRequest { filter })
            .await?;
        r.results
            .into_iter()
            .next()
            .ok_or_else(|| ClientError::InvalidResponse("DescribeAcls answered no result".into()))
    }

    /// Removes what each filter matches (Kafka's DeleteAcls); per filter,
    /// the bindings removed.
    pub async fn delete_acls(
        &self,
        filters: Vec<weir_proto::messages::AclFilterEntry>,
    ) -> Result<Vec<weir_proto::messages::AclResult>> {
        let r = self
            .request(&weir_proto::messages::DeleteAclsRequest { filters })
            .await?;
        Ok(r.results)
    }

    /// The client quotas whose entities match every component (`strict`:
    /// and have no other part), Kafka's DescribeClientQuotas.
    pub async fn describe_client_quotas(
        &self,
        components: Vec<weir_proto::messages::QuotaComponentEntry>,
        strict: bool,
    ) -> Result<weir_proto::messages::DescribeClientQuotasResponse> {
        self.request(&weir_proto::messages::DescribeClientQuotasRequest { components, strict })
            .await
    }

    /// Sets and removes client quotas (Kafka's AlterClientQuotas); one
    /// result per change.
    pub async fn alter_client_quotas(
        &self,
        changes: Vec<weir_proto::messages::QuotaChange>,
    ) -> Result<Vec<weir_proto::messages::QuotaResult>> {
        let r = self
            .request(&weir_proto::messages::AlterClientQuotasRequest {
                changes,
                validate_only: false,
            })
            .await?;
        Ok(r.results)
    }

    /// Users (`None`: all) and the SCRAM mechanisms they have credentials
    /// for; a user not found is a result with `ResourceNotFound`.
    pub async fn describe_users(
        &self,
        users: Option<Vec<String>>,
    ) -> Result<Vec<weir_proto::messages::UserResult>> {
        let r = self
            .request(&weir_proto::messages::DescribeUsersRequest { users })
            .await?;
        Ok(r.results)
    }

    /// Sets `user`'s SCRAM credential for `mechanism` from `password`,
    /// salted here with a fresh salt (the password never leaves this
    /// process; the broker stores the salted keys). One result.
    pub async fn set_user_password(
        &self,
        user: &str,
        mechanism: weir_proto::sasl::Mechanism,
        password: &str,
        iterations: u32,
    ) -> Result<weir_proto::messages::UserResult> {
        let salt = weir_proto::sasl::random_bytes(32);
        let salted =
            weir_proto::sasl::salted_password(mechanism, password.as_bytes(), &salt, iterations)
                .map_err(|e| ClientError::InvalidArgument(e.to_string()))?;
        let upsertion = weir_proto::messages::ScramUpsertion {
            user: user.to_string(),
            mechanism: mechanism.scram_type().ok_or_else(|| {
                ClientError::InvalidArgument("PLAIN has no stored credential".into())
            })?,
            iterations: iterations as i32,
            salt,
            salted_password: salted,
        };
        self.alter_users(Vec::new(), vec![upsertion])
            .await
            .map(first_result)
    }

    /// Removes `user`'s credential for `mechanism`. One result.
    pub async fn remove_user_credential(
        &self,
        user: &str,
        mechanism: weir_proto::sasl::Mechanism,
    ) -> Result<weir_proto::messages::UserResult> {
        let deletion = weir_proto::messages::ScramDeletion {
            user: user.to_string(),
            mechanism: mechanism.scram_type().ok_or_else(|| {
                ClientError::InvalidArgument("PLAIN has no stored credential".into())
            })?,
        };
        self.alter_users(vec![deletion], Vec::new())
            .await
            .map(first_result)
    }

    /// Removes and sets SCRAM credentials (Kafka's
    /// AlterUserScramCredentials); one result per user.
    pub async fn alter_users(
        &self,
        deletions: Vec<weir_proto::messages::ScramDeletion>,
        upsertions: Vec<weir_proto::messages::ScramUpsertion>,
    ) -> Result<Vec<weir_proto::messages::UserResult>> {
        let r = self
            .request(&weir_proto::messages::AlterUsersRequest {
                deletions,
                upsertions,
            })
            .await?;
        Ok(r.results)
    }

    /// The APIs and version ranges the broker supports.
    pub async fn api_versions(&self) -> Result<Vec<ApiVersionRange>> {
        Ok(self.request(&ApiVersionsRequest {}).await?.apis)
    }

    /// A new idempotent-producer identity: `(producer_id, producer_epoch)`.
    /// Every call hands out a fresh id. A refusal is
    /// [`ClientError::Server`] with the server's code and message.
    pub async fn init_producer_id(&self) -> Result<(i64, i16)> {
        let r = self.request(&InitProducerIdRequest::default()).await?;
        if r.error != 0 {
            let code = ErrorCode::from_u16(r.error);
            return Err(ClientError::Server {
                code,
                message: r.message.unwrap_or_else(|| code.description().to_string()),
            });
        }
        Ok((r.producer_id, r.producer_epoch))
    }

    /// The broker's cores and the given topics (all topics for `None`).
    /// Unknown topics are listed with their error code, not turned into an
    /// error (see [`Client::topic_metadata`]).
    pub async fn metadata(&self, topics: Option<Vec<String>>) -> Result<MetadataResponse> {
        self.request(&MetadataRequest { topics }).await
    }

    /// One topic's partitions and their owning cores;
    /// [`ClientError::Topic`] if it does not exist.
    pub async fn topic_metadata(&self, name: &str) -> Result<TopicMetadata> {
        let md = self.metadata(Some(vec![name.to_string()])).await?;
        let t = md
            .topics
            .into_iter()
            .find(|t| t.name == name)
            .ok_or_else(|| missing("topic", name))?;
        if t.error != 0 {
            return Err(ClientError::topic(name, t.error, None));
        }
        Ok(t)
    }

    /// The names of all topics, sorted.
    pub async fn list_topics(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .metadata(None)
            .await?
            .topics
            .into_iter()
            .map(|t| t.name)
            .collect();
        names.sort();
        Ok(names)
    }

    /// Creates a topic with `partitions` partitions (one replica each) and
    /// config overrides.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        configs: Vec<ConfigEntry>,
    ) -> Result<()> {
        self.create_replicated_topic(name, partitions, 1, configs)
            .await
    }

    /// Creates a topic with `partitions` partitions of
    /// `replication_factor` replicas each (on distinct nodes; more than
    /// the live nodes is refused with `InvalidReplicationFactor`).
    pub async fn create_replicated_topic(
        &self,
        name: &str,
        partitions: u32,
        replication_factor: u32,
        configs: Vec<ConfigEntry>,
    ) -> Result<()> {
        let req = CreateTopicsRequest {
            topics: vec![NewTopic {
                name: name.to_string(),
                partitions,
                configs,
                replication_factor,
            }],
        };
        topic_outcome(name, self.request(&req).await?.topics)
    }

    /// Deletes a topic and its data.
    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        let req = DeleteTopicsRequest {
            names: vec![name.to_string()],
        };
        topic_outcome(name, self.request(&req).await?.topics)
    }

    /// A topic's effective configs and, per partition, its leader (node,
    /// epoch, core), replicas, ISR, offsets and size on disk. In a cluster
    /// the offsets and size of a partition are asked of the node leading
    /// it (left zero, `here` false, if that node does not answer within
    /// [`DESCRIBE_ELSEWHERE_WITHIN`]).
    pub async fn describe_topic(&self, name: &str) -> Result<TopicConfigs> {
        let mut t = self.describe_topic_here(name).await?;
        let elsewhere: std::collections::BTreeSet<u64> = t
            .partitions
            .iter()
            .filter(|p| !p.here && p.leader != 0)
            .map(|p| p.leader)
            .collect();
        if elsewhere.is_empty() {
            return Ok(t);
        }
        let Ok(cluster) = self.describe_cluster().await else {
            return Ok(t);
        };
        for n in cluster.nodes.iter().filter(|n| elsewhere.contains(&n.id)) {
            let Some(addr) = node_addr(&n.native, self.addr.ip()).await else {
                continue;
            };
            let config = config_for_host(&self.config, host_of(&n.native));
            let other = Client::connect_lazy(addr, config);
            // A node paused or cut off must not hold the answer for a whole
            // request timeout: its partitions are left as this node sees
            // them.
            let asked =
                tokio::time::timeout(DESCRIBE_ELSEWHERE_WITHIN, other.describe_topic_here(name));
            let Ok(Ok(theirs)) = asked.await else {
                continue;
            };
            for p in theirs.partitions.into_iter().filter(|p| p.here) {
                if let Some(mine) = t.partitions.iter_mut().find(|m| m.partition == p.partition) {
                    *mine = p;
                }
            }
        }
        Ok(t)
    }

    /// [`Client::describe_topic`] as the answering node alone knows it.
    async fn describe_topic_here(&self, name: &str) -> Result<TopicConfigs> {
        let req = DescribeConfigsRequest {
            topics: vec![name.to_string()],
        };
        let t = self
            .request(&req)
            .await?
            .topics
            .into_iter()
            .find(|t| t.name == name)
            .ok_or_else(|| missing("topic", name))?;
        if t.error != 0 {
            return Err(ClientError::topic(name, t.error, None));
        }
        Ok(t)
    }

    /// Runs a cleaner pass now on every partition of a compacted topic
    /// (`run`), whatever its dirty ratio, or (with `run` false) only reports
    /// each partition's dirty ratio. Fails for an unknown topic or one
    /// whose `cleanup.policy` does not compact; a partition that failed
    /// carries its error in its entry.
    pub async fn compact(&self, topic: &str, run: bool) -> Result<Vec<CompactPartitionResult>> {
        let req = CompactRequest {
            topic: topic.to_string(),
            run,
        };
        let r = self.request(&req).await?;
        if r.error != 0 {
            return Err(ClientError::topic(topic, r.error, r.message));
        }
        Ok(r.partitions)
    }

    /// Sets config entries of a topic (others keep their values).
    pub async fn alter_configs(&self, name: &str, configs: Vec<ConfigEntry>) -> Result<()> {
        let req = AlterConfigsRequest {
            topics: vec![(name.to_string(), configs)],
        };
        topic_outcome(name, self.request(&req).await?.topics)
    }

    /// Grows a topic to `total` partitions.
    pub async fn create_partitions(&self, name: &str, total: u32) -> Result<()> {
        let req = CreatePartitionsRequest {
            topics: vec![(name.to_string(), total)],
        };
        topic_outcome(name, self.request(&req).await?.topics)
    }

    /// Moves partitions' replicas to other nodes, each to the node ids
    /// given (the preferred leader first): the new replicas copy the log
    /// and join the ISR, then the old ones leave and delete their copy.
    /// One result per partition, in order: `Ok` once the move has started
    /// (watch it complete with [`Client::describe_topic`]: a partition's
    /// `target` empties), or why it was refused
    /// (`InvalidReplicaAssignment`: an unknown or down node, a node twice).
    pub async fn reassign_partitions(
        &self,
        moves: Vec<(String, u32, Vec<u64>)>,
    ) -> Result<Vec<Result<()>>> {
        let req = ReassignPartitionsRequest {
            partitions: moves
                .into_iter()
                .map(|(topic, partition, replicas)| PartitionReassignment {
                    topic,
                    partition,
                    replicas,
                })
                .collect(),
        };
        Ok(self
            .request(&req)
            .await?
            .partitions
            .into_iter()
            .map(|r| {
                if r.error == 0 {
                    Ok(())
                } else {
                    let name = format!("{}-{}", r.topic, r.partition);
                    Err(ClientError::topic(&name, r.error, r.message))
                }
            })
            .collect())
    }

    /// Appends one record batch to a partition. Returns the offset the
    /// broker gave its first record, or `None` with [`Acks::None`].
    pub async fn produce(
        &self,
        topic: &str,
        partition: u32,
        batch: Bytes,
        acks: Acks,
    ) -> Result<Option<u64>> {
        self.produce_many(acks, vec![(topic.to_string(), partition, batch)])
            .await?
            .pop()
            .expect("one result per batch")
    }

    /// Appends record batches to partitions in one request: one result per
    /// batch, in the order given (`Ok(None)` with [`Acks::None`]).
    ///
    /// The batches are sent as the frame's payload without being copied.
    /// Batches for the same partition are sent as one contiguous range, in
    /// the order given, so they are appended in that order; if one of them
    /// fails, they all report the error (the ones before it may have been
    /// appended). A batch whose framing is invalid fails alone, before
    /// anything is sent. The outer error is for the request as a whole.
    pub async fn produce_many(
        &self,
        acks: Acks,
        batches: Vec<(String, u32, Bytes)>,
    ) -> Result<Vec<Result<Option<u64>>>> {
        let mut results: Vec<Option<Result<Option<u64>>>> = Vec::with_capacity(batches.len());
        // (topic, partition) -> index in `groups`; groups keep first-seen order.
        let mut index: HashMap<(&str, u32), usize> = HashMap::new();
        let mut groups: Vec<Group<'_>> = Vec::new();
        for (i, (topic, partition, batch)) in batches.iter().enumerate() {
            let span = match BatchHeader::parse_framed(batch) {
                Ok(h) if h.total_len() == batch.len() => h.offset_span(),
                Ok(h) => {
                    results.push(Some(Err(ClientError::InvalidArgument(format!(
                        "batch {i} is {} bytes but its header says {}",
                        batch.len(),
                        h.total_len()
                    )))));
                    continue;
                }
                Err(e) => {
                    results.push(Some(Err(ClientError::CorruptBatch(e))));
                    continue;
                }
            };
            results.push(None);
            let g = *index.entry((topic, *partition)).or_insert_with(|| {
                groups.push(Group {
                    topic,
                    partition: *partition,
                    members: Vec::new(),
                });
                groups.len() - 1
            });
            groups[g].members.push((i, span));
        }
        let mut payload = Vec::new();
        let mut partitions = Vec::with_capacity(groups.len());
        let mut at: u64 = 0;
        for g in &groups {
            let start = at;
            for &(i, _) in &g.members {
                at += batches[i].2.len() as u64;
                payload.push(batches[i].2.clone());
            }
            let (Ok(payload_offset), Ok(payload_len)) =
                (u32::try_from(start), u32::try_from(at - start))
            else {
                return Err(ClientError::InvalidArgument(
                    "produce request payload over 4 GiB".into(),
                ));
            };
            partitions.push(ProducePartition {
                topic: g.topic.to_string(),
                partition: g.partition,
                payload_offset,
                payload_len,
            });
        }
        if !groups.is_empty() {
            let req = ProduceRequest {
                acks: acks.as_i8(),
                timeout_ms: millis_u32(self.config.request_timeout),
                partitions,
                transactional_id: self.config.transactional_id.clone(),
            };
            let answer = self
                .call(&req, &payload, Duration::ZERO, acks != Acks::None)
                .await?;
            match answer {
                None => {
                    for g in &groups {
                        for &(i, _) in &g.members {
                            results[i] = Some(Ok(None));
                        }
                    }
                }
                Some(a) => {
                    if a.body.partitions.len() != groups.len() {
                        return Err(ClientError::InvalidResponse(format!(
                            "{} produce results for {} partitions",
                            a.body.partitions.len(),
                            groups.len()
                        )));
                    }
                    for (g, r) in groups.iter().zip(a.body.partitions) {
                        if r.topic != g.topic || r.partition != g.partition {
                            return Err(ClientError::InvalidResponse(format!(
                                "produce result for {}-{} where {}-{} was expected",
                                r.topic, r.partition, g.topic, g.partition
                            )));
                        }
                        let mut next = r.base_offset;
                        for &(i, span) in &g.members {
                            results[i] = Some(if r.error == 0 {
                                Ok(Some(next))
                            } else {
                                Err(ClientError::partition(
                                    g.topic,
                                    g.partition,
                                    r.error,
                                    r.message.clone(),
                                ))
                            });
                            next += span;
                        }
                    }
                }
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every batch has a result"))
            .collect())
    }

    /// Reads batches of one partition from `offset`: up to `max_bytes`
    /// (always at least one whole batch if there is one), waiting up to
    /// `max_wait_ms` for data when `offset` is the end of the log.
    pub async fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_wait_ms: u32,
    ) -> Result<FetchedBatches> {
        let target = FetchPartition {
            topic: topic.to_string(),
            partition,
            offset,
            max_bytes,
        };
        self.fetch_many(max_wait_ms, max_bytes, vec![target])
            .await?
            .pop()
            .expect("one result per partition")
    }

    /// Reads several partitions in one request: one result per entry of
    /// `partitions`, in order. `max_bytes` bounds the whole response (each
    /// entry's `max_bytes` its partition). The broker waits up to
    /// `max_wait_ms` for each partition that is at the end of its log.
    pub async fn fetch_many(
        &self,
        max_wait_ms: u32,
        max_bytes: u32,
        partitions: Vec<FetchPartition>,
    ) -> Result<Vec<Result<FetchedBatches>>> {
        self.fetch_many_at(
            IsolationLevel::ReadUncommitted,
            max_wait_ms,
            max_bytes,
            partitions,
        )
        .await
    }

    /// [`Client::fetch_many`] at an isolation level: read committed, each
    /// partition's batches end at its last stable offset and the
    /// transactions aborted among them are named
    /// ([`FetchedBatches::aborted`]; [`crate::consumer::Consumer`] skips
    /// their records).
    pub async fn fetch_many_at(
        &self,
        isolation: IsolationLevel,
        max_wait_ms: u32,
        max_bytes: u32,
        partitions: Vec<FetchPartition>,
    ) -> Result<Vec<Result<FetchedBatches>>> {
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        let wanted: Vec<(String, u32)> = partitions
            .iter()
            .map(|p| (p.topic.clone(), p.partition))
            .collect();
        let req = FetchRequest {
            max_wait_ms,
            min_bytes: 1,
            max_bytes,
            partitions,
            read_committed: isolation == IsolationLevel::ReadCommitted,
        };
        let wait = Duration::from_millis(max_wait_ms.into());
        let a = self
            .call(&req, &[], wait, true)
            .await?
            .expect("an answer was expected");
        if a.body.partitions.len() != wanted.len() {
            return Err(ClientError::InvalidResponse(format!(
                "{} fetch results for {} partitions",
                a.body.partitions.len(),
                wanted.len()
            )));
        }
        let mut out = Vec::with_capacity(wanted.len());
        for ((topic, partition), r) in wanted.iter().zip(a.body.partitions) {
            if &r.topic != topic || r.partition != *partition {
                return Err(ClientError::InvalidResponse(format!(
                    "fetch result for {}-{} where {topic}-{partition} was expected",
                    r.topic, r.partition
                )));
            }
            if r.error != 0 {
                out.push(Err(ClientError::partition(
                    topic, *partition, r.error, r.message,
                )));
                continue;
            }
            let data = frame::payload_slice(&a.payload, r.payload_offset, r.payload_len)?;
            let batches = split_batches(&a.payload.slice_ref(data))?;
            out.push(Ok(FetchedBatches {
                batches,
                high_watermark: r.high_watermark,
                log_start_offset: r.log_start_offset,
                last_stable_offset: r.last_stable_offset,
                aborted: r
                    .aborted
                    .into_iter()
                    .map(|a| (a.producer_id, a.first_offset))
                    .collect(),
                fetch_offset: r.fetch_offset,
            }));
        }
        Ok(out)
    }

    /// Looks up an offset of a partition: the log start
    /// ([`OffsetSpec::Earliest`]), the log end ([`OffsetSpec::Latest`]), or
    /// the first record at or after a timestamp
    /// ([`OffsetSpec::Timestamp`], ms; `None` if every record is older).
    pub async fn list_offsets(
        &self,
        topic: &str,
        partition: u32,
        spec: OffsetSpec,
    ) -> Result<Option<u64>> {
        self.list_offsets_at(IsolationLevel::ReadUncommitted, topic, partition, spec)
            .await
    }

    /// [`Client::list_offsets`] at an isolation level: read committed, the
    /// log end ([`OffsetSpec::Latest`]) is the last stable offset.
    pub async fn list_offsets_at(
        &self,
        isolation: IsolationLevel,
        topic: &str,
        partition: u32,
        spec: OffsetSpec,
    ) -> Result<Option<u64>> {
        let req = ListOffsetsRequest {
            partitions: vec![ListOffsetsPartition {
                topic: topic.to_string(),
                partition,
                spec,
            }],
            read_committed: isolation == IsolationLevel::ReadCommitted,
        };
        let r = self
            .request(&req)
            .await?
            .partitions
            .into_iter()
            .find(|r| r.topic == topic && r.partition == partition)
            .ok_or_else(|| missing("partition", &format!("{topic}-{partition}")))?;
        if r.error != 0 {
            return Err(ClientError::partition(topic, partition, r.error, None));
        }
        Ok(r.offset)
    }
}

/// A partition's batches within a produce request.
struct Group<'a> {
    topic: &'a str,
    partition: u32,
    /// (index in the caller's list, records' offset span)
    members: Vec<(usize, u64)>,
}

fn millis_u32(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

fn missing(what: &str, name: &str) -> ClientError {
    ClientError::InvalidResponse(format!("no result for {what} `{name}`"))
}

/// The outcome of an admin operation on `name`.
fn topic_outcome(name: &str, results: Vec<TopicResult>) -> Result<()> {
    let r = results
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| missing("topic", name))?;
    if r.error != 0 {
        return Err(ClientError::topic(name, r.error, r.message));
    }
    Ok(())
}

/// Decodes a response frame: its body, or the frame-level error.
fn decode_answer<R: Request>(frame: &Bytes) -> Result<Answer<R::Response>> {
    let (h, body, payload) = frame::decode_response(frame)?;
    if h.error != ErrorCode::None {
        let message = frame::decode_body::<ErrorBody>(body)
            .map(|b| b.message)
            .unwrap_or_else(|_| h.error.description().to_string());
        return Err(ClientError::Server {
            code: h.error,
            message,
        });
    }
    Ok(Answer {
        body: frame::decode_body::<R::Response>(body)?,
        payload: frame.slice_ref(payload),
    })
}

/// The one result of a one-user change (an empty answer is a protocol error
/// the caller sees as an unknown-code result).
fn first_result(
    mut results: Vec<weir_proto::messages::UserResult>,
) -> weir_proto::messages::UserResult {
    if results.is_empty() {
        return weir_proto::messages::UserResult {
            error: ErrorCode::Unknown.as_u16(),
            message: Some("the broker answered no result".into()),
            ..Default::default()
        };
    }
    results.swap_remove(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_parse_and_print() {
        for (s, a, wire) in [
            ("0", Acks::None, 0),
            ("1", Acks::Leader, 1),
            ("all", Acks::All, -1),
            ("-1", Acks::All, -1),
            ("ALL", Acks::All, -1),
        ] {
            let got: Acks = s.parse().unwrap();
            assert_eq!(got, a);
            assert_eq!(got.as_i8(), wire);
            assert_eq!(got.to_string().parse::<Acks>().unwrap(), a);
        }
        assert!("2".parse::<Acks>().is_err());
        assert_eq!(Acks::default(), Acks::All);
    }
}
