//! Broker configuration: embedded defaults, a TOML file (`--config`),
//! `WEIR_*` environment variables and command-line flags, in increasing
//! order of precedence. Every option can be set all four ways.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use super::tls::{split_listener, ClientAuth, SecurityProtocol, SslSettings};
use serde::Deserialize;
use weir_proto::sasl::Mechanism;

use super::limits::{
    CONNECTIONS_PER_CORE_MAX_DEFAULT, FRAME_BYTES_MAX_DEFAULT, FRAME_READ_TIMEOUT_MS_DEFAULT,
    INFLIGHT_BYTES_PER_CORE,
};

/// Default native-protocol address.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:9292";
/// Default first per-core port (core N listens on this + N).
pub const CORE_PORT_BASE_DEFAULT: u16 = 9300;
/// Default metrics and admin HTTP address.
pub const METRICS_LISTEN_DEFAULT: &str = "127.0.0.1:9644";
/// Default Kafka protocol address.
pub const KAFKA_LISTENER_DEFAULT: &str = "127.0.0.1:9092";
/// Default first per-core Kafka port (core N: this + N).
pub const KAFKA_CORE_PORT_BASE_DEFAULT: u16 = 9500;
/// Default data directory.
pub const DATA_DIR_DEFAULT: &str = "./weir-data";
/// Default retention interval (Kafka's `log.retention.check.interval.ms`).
pub const RETENTION_CHECK_MS_DEFAULT: u64 = 300_000;
/// Default `--remote-log-task-interval-ms`.
pub const REMOTE_LOG_TASK_INTERVAL_MS_DEFAULT: u64 = 5_000;
/// Default `--remote-log-orphan-sweep-ms`.
pub const REMOTE_LOG_ORPHAN_SWEEP_MS_DEFAULT: u64 = 3_600_000;
/// Default partition count of `__consumer_offsets` (used when the broker
/// creates it; fixed afterwards).
pub const OFFSETS_PARTITIONS_DEFAULT: u32 = 16;
/// Default retention of empty groups and their offsets (Kafka's
/// `offsets.retention.minutes` = 10080).
pub const OFFSETS_RETENTION_MS_DEFAULT: u64 = 7 * 24 * 3600 * 1000;
/// Default segment size of `__consumer_offsets` (Kafka's).
pub const OFFSETS_SEGMENT_BYTES_DEFAULT: u64 = 100 << 20;
/// Default initial rebalance delay of classic groups, ms (Kafka's).
pub const GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT: u64 = 3000;
/// Most partitions of `__consumer_offsets`.
pub const OFFSETS_PARTITIONS_MAX: u32 = 1000;

/// SASL of the SASL_PLAINTEXT:// and SASL_SSL:// listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslSettings {
    /// Mechanisms offered, in the order SaslHandshake lists them.
    pub mechanisms: Vec<Mechanism>,
    /// `connections.max.reauth.ms` (0: a login holds for the connection's life).
    pub reauth_ms: u64,
    /// A connection must log in within this long of connecting.
    pub login_timeout_ms: u64,
    /// OAUTHBEARER's keys and checks (`None`: not offered).
    pub oauth: Option<crate::server::oauth::OAuthSettings>,
}

/// Default of `--sasl-login-timeout-ms`.
pub const SASL_LOGIN_TIMEOUT_MS_DEFAULT: u64 = 10_000;

impl Default for SaslSettings {
    fn default() -> Self {
        SaslSettings {
            mechanisms: Mechanism::ALL.to_vec(),
            reauth_ms: 0,
            login_timeout_ms: SASL_LOGIN_TIMEOUT_MS_DEFAULT,
            oauth: None,
        }
    }
}

/// Who may do what: the ACL authorizer's settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuthorizationSettings {
    /// `--authorizer acl`: requests are checked against the ACLs.
    pub enabled: bool,
    /// `super.users`: principals allowed everything.
    pub super_users: Vec<String>,
    /// `allow.everyone.if.no.acl.found`.
    pub allow_if_no_acl: bool,
}

/// `--super-users`: `User:name` principals, `;`-separated.
fn parse_principals(v: &str) -> anyhow::Result<Vec<String>> {
    v.split(';')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once(':') {
            Some((t, n)) if !t.is_empty() && !n.is_empty() => Ok(p.to_string()),
            _ => bail!("--super-users: `{p}` is not a principal like User:admin"),
        })
        .collect()
}

/// `--sasl-enabled-mechanisms`: names, comma-separated, at least one.
fn parse_mechanisms(v: &str) -> anyhow::Result<Vec<Mechanism>> {
    let mut out = Vec::new();
    for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let m = Mechanism::from_name(&name.to_ascii_uppercase()).with_context(|| {
            format!(
                "--sasl-enabled-mechanisms: `{name}` is not served (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN, OAUTHBEARER)"
            )
        })?;
        if !out.contains(&m) {
            out.push(m);
        }
    }
    if out.is_empty() {
        bail!("--sasl-enabled-mechanisms names no mechanism");
    }
    Ok(out)
}

/// Options of `weir broker`, from flags or `WEIR_*` variables.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct BrokerArgs {
    /// TOML file with any of the options below (keys as the flags, with `_`).
    #[arg(long, env = "WEIR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Where partitions and the topic registry live [default: ./weir-data].
    #[arg(long, env = "WEIR_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Native protocol address shared by all cores (SO_REUSEPORT);
    /// `SSL://host:port` for TLS, `host:port` or `PLAINTEXT://host:port`
    /// without; several listeners comma-separated, one per security
    /// protocol (the first is the primary; each further one's per-core
    /// ports follow the one before's) [default: 127.0.0.1:9292].
    #[arg(long, env = "WEIR_LISTEN")]
    pub listen: Option<String>,
    /// Core N also listens on this port + N; 0 picks free ports [default: 9300].
    #[arg(long, env = "WEIR_CORE_PORT_BASE")]
    pub core_port_base: Option<u16>,
    /// Number of cores (pinned executors) [default: all available].
    #[arg(long, env = "WEIR_CORES")]
    pub cores: Option<usize>,
    /// Metrics (Prometheus text at /metrics) address [default: 127.0.0.1:9644].
    #[arg(long, env = "WEIR_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// A file holding the token `GET /metrics` must carry
    /// (`Authorization: Bearer TOKEN`) [default: none needed].
    #[arg(long, env = "WEIR_METRICS_BEARER_TOKEN_FILE", value_name = "FILE")]
    pub metrics_bearer_token_file: Option<PathBuf>,
    /// A file of `user:password` lines; `GET /metrics` with HTTP basic
    /// auth as one of them is served (Prometheus' `basic_auth`) [default:
    /// none needed].
    #[arg(long, env = "WEIR_METRICS_BASIC_AUTH_FILE", value_name = "FILE")]
    pub metrics_basic_auth_file: Option<PathBuf>,
    /// Kafka protocol address shared by all cores (SO_REUSEPORT);
    /// `SSL://host:port` for TLS; several listeners comma-separated, one
    /// per security protocol (e.g. `PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093`);
    /// `off` for none [default: 127.0.0.1:9092].
    #[arg(long, env = "WEIR_KAFKA_LISTENER")]
    pub kafka_listener: Option<String>,
    /// PEM certificate chain (leaf first) of the SSL:// listeners.
    #[arg(long, env = "WEIR_SSL_CERTIFICATE_FILE")]
    pub ssl_certificate_file: Option<PathBuf>,
    /// PEM private key of that certificate.
    #[arg(long, env = "WEIR_SSL_KEY_FILE")]
    pub ssl_key_file: Option<PathBuf>,
    /// PEM certificates client certificates must chain to.
    #[arg(long, env = "WEIR_SSL_CA_FILE")]
    pub ssl_ca_file: Option<PathBuf>,
    /// Client certificates on SSL:// listeners (Kafka's
    /// `ssl.client.auth`): none, requested or required [default: none].
    #[arg(long, env = "WEIR_SSL_CLIENT_AUTH")]
    pub ssl_client_auth: Option<String>,
    /// How a client certificate's subject becomes a principal (Kafka's
    /// `ssl.principal.mapping.rules`: `RULE:pattern/replacement/[LU]`
    /// and `DEFAULT`, comma-separated) [default: DEFAULT, the whole DN].
    #[arg(long, env = "WEIR_SSL_PRINCIPAL_MAPPING_RULES")]
    pub ssl_principal_mapping_rules: Option<String>,
    /// SASL mechanisms the SASL_PLAINTEXT:// and SASL_SSL:// listeners
    /// offer, comma-separated (Kafka's `sasl.enabled.mechanisms`)
    /// [default: SCRAM-SHA-512,SCRAM-SHA-256,PLAIN].
    #[arg(long, env = "WEIR_SASL_ENABLED_MECHANISMS")]
    pub sasl_enabled_mechanisms: Option<String>,
    /// A SASL login holds this long; a client must authenticate again on
    /// the same connection before then (KIP-368), or it is closed at its
    /// next request; 0: forever (Kafka's `connections.max.reauth.ms`)
    /// [default: 0].
    #[arg(long, env = "WEIR_CONNECTIONS_MAX_REAUTH_MS")]
    pub connections_max_reauth_ms: Option<u64>,
    /// A connection to a SASL_* listener that has not logged in this long
    /// after connecting (TLS handshake included) is closed [default: 10000].
    #[arg(long, env = "WEIR_SASL_LOGIN_TIMEOUT_MS")]
    pub sasl_login_timeout_ms: Option<u64>,
    /// OAUTHBEARER: the JWKS file (`{"keys": [...]}`, public keys) JWTs
    /// are checked against, re-read when it changes; offering OAUTHBEARER
    /// needs it (Kafka's `sasl.oauthbearer.jwks.endpoint.url` with a
    /// `file:` URL).
    #[arg(long, env = "WEIR_SASL_OAUTHBEARER_JWKS_FILE")]
    pub sasl_oauthbearer_jwks_file: Option<PathBuf>,
    /// OAUTHBEARER: the `iss` a token must carry [default: any].
    #[arg(long, env = "WEIR_SASL_OAUTHBEARER_EXPECTED_ISSUER")]
    pub sasl_oauthbearer_expected_issuer: Option<String>,
    /// OAUTHBEARER: audiences, comma-separated; a token's `aud` must name
    /// one [default: any].
    #[arg(long, env = "WEIR_SASL_OAUTHBEARER_EXPECTED_AUDIENCE")]
    pub sasl_oauthbearer_expected_audience: Option<String>,
    /// OAUTHBEARER: the claim naming the principal [default: sub].
    #[arg(long, env = "WEIR_SASL_OAUTHBEARER_SUB_CLAIM_NAME")]
    pub sasl_oauthbearer_sub_claim_name: Option<String>,
    /// OAUTHBEARER: leeway on a token's `exp` and `nbf`, seconds
    /// [default: 30].
    #[arg(long, env = "WEIR_SASL_OAUTHBEARER_CLOCK_SKEW_SECONDS")]
    pub sasl_oauthbearer_clock_skew_seconds: Option<u64>,
    /// `acl`: every request is checked against the ACLs in the cluster
    /// metadata (Kafka's `StandardAuthorizer`); `none`: everything is
    /// allowed [default: none].
    #[arg(long, env = "WEIR_AUTHORIZER")]
    pub authorizer: Option<String>,
    /// Principals allowed everything, `;`-separated (Kafka's
    /// `super.users`), e.g. `User:admin;User:ANONYMOUS`.
    #[arg(long, env = "WEIR_SUPER_USERS")]
    pub super_users: Option<String>,
    /// Allow what no ACL covers (Kafka's
    /// `allow.everyone.if.no.acl.found`) [default: false].
    #[arg(long, env = "WEIR_ALLOW_EVERYONE_IF_NO_ACL_FOUND")]
    pub allow_everyone_if_no_acl_found: Option<bool>,
    /// The `host:port` Kafka clients are told to connect to (Metadata,
    /// FindCoordinator); with several listeners, comma-separated
    /// `NAME://host:port` (or bare, in the listeners' order): a client is
    /// told its listener's [default: the Kafka listener's address].
    #[arg(long, env = "WEIR_KAFKA_ADVERTISED_LISTENER")]
    pub kafka_advertised_listener: Option<String>,
    /// Core N also serves Kafka clients on this port + N and Metadata
    /// names each core a broker (node id N) leading the partitions it
    /// owns, so clients send each partition to its core; 0 picks free
    /// ports; `off`: one broker (node 0) on the Kafka listener only
    /// [default: 9500, or free ports when the Kafka listener's port is 0].
    #[arg(long, env = "WEIR_KAFKA_CORE_PORT_BASE")]
    pub kafka_core_port_base: Option<String>,
    /// Largest request frame accepted, bytes [default: 104857600].
    #[arg(long, env = "WEIR_MAX_FRAME_BYTES")]
    pub max_frame_bytes: Option<u32>,
    /// Create unknown topics on produce/metadata (`auto.create.topics.enable`) [default: false].
    #[arg(long, env = "WEIR_AUTO_CREATE_TOPICS")]
    pub auto_create_topics: Option<bool>,
    /// Partitions of auto-created topics [default: 1].
    #[arg(long, env = "WEIR_DEFAULT_PARTITIONS")]
    pub default_partitions: Option<u32>,
    /// Batch cache budget per core, bytes [default: 268435456].
    #[arg(long, env = "WEIR_CACHE_BYTES_PER_CORE")]
    pub cache_bytes_per_core: Option<u64>,
    /// How often retention runs, ms (`log.retention.check.interval.ms`) [default: 300000].
    #[arg(long, env = "WEIR_RETENTION_CHECK_MS")]
    pub retention_check_ms: Option<u64>,
    /// Tiered storage's object store: `s3://bucket[/prefix]` (credentials,
    /// region and endpoint from the `AWS_*` variables or
    /// `--remote-storage-option`), `gs://bucket[/prefix]` (Google Cloud
    /// Storage, `GOOGLE_*`), `az://container[/prefix]` (Azure Blob
    /// Storage, `AZURE_*`) or `file:///path`. Topics with
    /// `remote.storage.enable=true` need it [default: none].
    #[arg(long, env = "WEIR_REMOTE_STORAGE")]
    pub remote_storage: Option<String>,
    /// An option of `--remote-storage`'s store, `KEY=VALUE` by
    /// object_store's names (S3: `endpoint=http://127.0.0.1:9000`,
    /// `region=eu-west-1`, `access_key_id=…`; GCS:
    /// `service_account_key=…`; Azure: `account_name=…`, `access_key=…`);
    /// repeatable.
    #[arg(long = "remote-storage-option", value_name = "KEY=VALUE")]
    pub remote_storage_options: Vec<String>,
    /// How often a core looks for segments to upload, remote segments to
    /// delete and uploads left unfinished, ms
    /// (`remote.log.manager.task.interval.ms`) [default: 5000].
    #[arg(long, env = "WEIR_REMOTE_LOG_TASK_INTERVAL_MS")]
    pub remote_log_task_interval_ms: Option<u64>,
    /// How often a partition's leader lists its remote folder and deletes
    /// the objects no remote log metadata names (written by a deposed
    /// leader after its upload was cleaned up), once they are 10 minutes
    /// old; 0 = never, ms [default: 3600000].
    #[arg(long, env = "WEIR_REMOTE_LOG_ORPHAN_SWEEP_MS")]
    pub remote_log_orphan_sweep_ms: Option<u64>,
    /// A read from the remote tier fails (retriable) after this long,
    /// retries included, ms [default: 10000].
    #[arg(long, env = "WEIR_REMOTE_READ_TIMEOUT_MS")]
    pub remote_read_timeout_ms: Option<u64>,
    /// One request to the object store fails after this long (then it
    /// is retried with backoff), ms [default: 30000].
    #[arg(long, env = "WEIR_REMOTE_REQUEST_TIMEOUT_MS")]
    pub remote_request_timeout_ms: Option<u64>,
    /// A request's retries stop this long after its first attempt (an
    /// upload then fails and is tried again at the next pass), ms
    /// [default: 60000].
    #[arg(long, env = "WEIR_REMOTE_RETRY_TIMEOUT_MS")]
    pub remote_retry_timeout_ms: Option<u64>,
    /// Bytes of segments copied to the remote tier per second at most,
    /// every core's uploads together; 0 = no cap
    /// (`remote.log.manager.copy.max.bytes.per.second`) [default: 0].
    #[arg(long, env = "WEIR_REMOTE_LOG_MANAGER_COPY_MAX_BYTES_PER_SECOND")]
    pub remote_log_manager_copy_max_bytes_per_second: Option<u64>,
    /// How long a core's cleaner sleeps between looks at its compacted
    /// partitions, ms (`log.cleaner.backoff.ms`) [default: 15000].
    #[arg(long, env = "WEIR_LOG_CLEANER_BACKOFF_MS")]
    pub log_cleaner_backoff_ms: Option<u64>,
    /// Memory of one core's cleaner key map, bytes (`log.cleaner.dedupe.buffer.size`,
    /// per core; about 32 bytes per distinct key) [default: 67108864].
    #[arg(long, env = "WEIR_LOG_CLEANER_DEDUPE_BUFFER_SIZE")]
    pub log_cleaner_dedupe_buffer_size: Option<u64>,
    /// Cap of one core's cleaner I/O (read + written), bytes/s; 0 = no cap
    /// (`log.cleaner.io.max.bytes.per.second`) [default: 0].
    #[arg(long, env = "WEIR_LOG_CLEANER_IO_MAX_BYTES_PER_SECOND")]
    pub log_cleaner_io_max_bytes_per_second: Option<u64>,
    /// Cap of one core's cleaner I/O while that core is appending (an
    /// append in the last 200 ms), bytes/s; 0 = no cap [default: 104857600].
    #[arg(long, env = "WEIR_LOG_CLEANER_IO_BUSY_BYTES_PER_SECOND")]
    pub log_cleaner_io_busy_bytes_per_second: Option<u64>,
    /// A flush round that appends at least this many bytes to a partition
    /// that syncs every round (`flush.messages` 1, the default) writes them
    /// through an O_DSYNC descriptor instead of write + fdatasync; 0 = never
    /// [default: 524288].
    #[arg(long, env = "WEIR_LOG_WRITE_THROUGH_BYTES")]
    pub log_write_through_bytes: Option<u64>,
    /// A flush round of a core that writes one log only (one partition
    /// busy on the core), of fewer bytes than this, is written through
    /// O_DSYNC too: one I/O instead of a write and an fdatasync; rounds of
    /// several logs, and rounds between this and --log-write-through-bytes,
    /// keep write + fdatasync. Needs --log-write-through-bytes above 0;
    /// 0 = off [default: 131072].
    #[arg(long, env = "WEIR_LOG_WRITE_THROUGH_ALONE_BYTES")]
    pub log_write_through_alone_bytes: Option<u64>,
    /// The fdatasyncs a core's flush round asks for at about the same time
    /// share one sync: one file is fdatasync'd, several are made durable
    /// by one syncfs(2) of their file system; false = each file its own
    /// fdatasync [default: true].
    #[arg(long, env = "WEIR_LOG_SYNC_GROUP")]
    pub log_sync_group: Option<bool>,
    /// Partitions of the internal `__consumer_offsets` topic, used when it is created at the first start [default: 16].
    #[arg(long, env = "WEIR_OFFSETS_PARTITIONS")]
    pub offsets_partitions: Option<u32>,
    /// Replicas of each `__consumer_offsets` partition when it is created
    /// (at most the live nodes then; Kafka's
    /// `offsets.topic.replication.factor`) [default: 3].
    #[arg(long, env = "WEIR_OFFSETS_REPLICATION_FACTOR")]
    pub offsets_replication_factor: Option<u32>,
    /// Segment size of `__consumer_offsets` (Kafka's
    /// `offsets.topic.segment.bytes`); applied at every start. Only closed
    /// segments are compacted [default: 104857600].
    #[arg(long, env = "WEIR_OFFSETS_SEGMENT_BYTES")]
    pub offsets_segment_bytes: Option<u64>,
    /// A group without members and without a commit for this long is
    /// removed with its committed offsets (Kafka's
    /// `offsets.retention.minutes`, here in ms) [default: 604800000, 7 days].
    #[arg(long, env = "WEIR_OFFSETS_RETENTION_MS")]
    pub offsets_retention_ms: Option<u64>,
    /// How long the first rebalance of an empty classic (Kafka JoinGroup)
    /// group waits for more members, extended while they keep arriving
    /// (Kafka's `group.initial.rebalance.delay.ms`) [default: 3000].
    #[arg(long, env = "WEIR_GROUP_INITIAL_REBALANCE_DELAY_MS")]
    pub group_initial_rebalance_delay_ms: Option<u64>,
    /// Where a share group starts reading a partition it has no state of
    /// (Kafka's `share.auto.offset.reset`): `latest` (the log's end) or
    /// `earliest` (its start) [default: latest].
    #[arg(long, env = "WEIR_SHARE_AUTO_OFFSET_RESET")]
    pub share_auto_offset_reset: Option<String>,
    /// How long a share-group member holds the records it acquired
    /// (Kafka's `group.share.record.lock.duration.ms`, 1000..=3600000)
    /// [default: 30000].
    #[arg(long, env = "WEIR_GROUP_SHARE_RECORD_LOCK_DURATION_MS")]
    pub group_share_record_lock_duration_ms: Option<u64>,
    /// Deliveries of a record to share-group members before it is
    /// archived (Kafka's `group.share.delivery.count.limit`, 2..=10)
    /// [default: 5].
    #[arg(long, env = "WEIR_GROUP_SHARE_DELIVERY_COUNT_LIMIT")]
    pub group_share_delivery_count_limit: Option<u16>,
    /// Records in flight in one share partition (from its first record
    /// not yet acknowledged to the last acquired): no more are acquired
    /// beyond it (Kafka's `group.share.partition.max.record.locks`,
    /// 100..=10000) [default: 2000].
    #[arg(long, env = "WEIR_GROUP_SHARE_PARTITION_MAX_RECORD_LOCKS")]
    pub group_share_partition_max_record_locks: Option<usize>,
    /// A share-group member that does not heartbeat for this long is
    /// removed and its partitions go to the others (Kafka's
    /// `group.share.session.timeout.ms`, 1000..=3600000) [default: 45000].
    #[arg(long, env = "WEIR_GROUP_SHARE_SESSION_TIMEOUT_MS")]
    pub group_share_session_timeout_ms: Option<u64>,
    /// Once a request's first byte has arrived, the whole frame must arrive
    /// within this many ms or the connection is closed [default: 30000].
    #[arg(long, env = "WEIR_FRAME_READ_TIMEOUT_MS")]
    pub frame_read_timeout_ms: Option<u64>,
    /// Open connections per core (shared and own port together); more are
    /// closed at once [default: 10000].
    #[arg(long, env = "WEIR_MAX_CONNECTIONS_PER_CORE")]
    pub max_connections_per_core: Option<usize>,
    /// The native `host:port` clients and other nodes are told to use
    /// (cluster metadata, `weir cluster status`); with several listeners,
    /// comma-separated `NAME://host:port` (or bare, in the listeners'
    /// order) [default: the --listen address].
    #[arg(long, env = "WEIR_ADVERTISED_LISTEN")]
    pub advertised_listen: Option<String>,
    /// This node's id in the cluster, 1 or more [default: 1].
    #[arg(long, env = "WEIR_NODE_ID")]
    pub node_id: Option<u64>,
    /// The cluster's id; every node of a cluster must name the same one,
    /// and a node of another cluster is refused [default: generated at the
    /// first start of a one-node cluster and kept in the data directory].
    #[arg(long, env = "WEIR_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    /// Node-to-node (QUIC, udp) address [default: the --listen address's
    /// IP, port 9293; a free port when --listen's port is 0].
    #[arg(long, env = "WEIR_REPLICATION_LISTEN")]
    pub replication_listen: Option<String>,
    /// The `host:port` other nodes reach this one's replication address
    /// at [default: the bound replication address].
    #[arg(long, env = "WEIR_REPLICATION_ADVERTISED")]
    pub replication_advertised: Option<String>,
    /// The initial controller voters, `ID@HOST:PORT,…` (replication
    /// addresses), this node among them; read at the first start of a new
    /// cluster only [default: this node alone, a one-node cluster].
    #[arg(long, env = "WEIR_VOTERS")]
    pub voters: Option<String>,
    /// Directory with `ca.pem`, `node-<id>.pem` and `node-<id>.key` (from
    /// `weir cluster certs`) [default: <data-dir>/certs, created for a
    /// one-node cluster].
    #[arg(long, env = "WEIR_CERTS_DIR")]
    pub certs_dir: Option<PathBuf>,
    /// Rack or zone of this node, for spreading replicas [default: none].
    #[arg(long, env = "WEIR_RACK")]
    pub rack: Option<String>,
    /// A node whose heartbeats stop for this long is fenced (its
    /// partitions' leadership moves), ms [default: 6000].
    #[arg(long, env = "WEIR_SESSION_TIMEOUT_MS")]
    pub session_timeout_ms: Option<u64>,
    /// First port of the cores' replication (QUIC, udp) endpoints: core N
    /// listens on BASE + N at the replication address's IP [default: the
    /// replication port + 1; 0: free ports].
    #[arg(long, env = "WEIR_REPLICATION_CORE_PORT_BASE")]
    pub replication_core_port_base: Option<u16>,
    /// Receive and send buffer of each core's replication (udp) socket,
    /// bytes: a follower stream's bursts must fit, or datagrams are
    /// dropped and QUIC's congestion control halves its window. The
    /// kernel caps it at `net.core.rmem_max` / `wmem_max` (a warning says
    /// so) [default: 4194304].
    #[arg(long, env = "WEIR_REPLICATION_UDP_BUFFER_BYTES")]
    pub replication_udp_buffer_bytes: Option<usize>,
    /// Largest UDP payload of the cores' replication (QUIC) packets, bytes
    /// (1200–65507): what other nodes may send, and how far path MTU
    /// discovery searches — it settles on what the path carries (1452 on
    /// a 1500-byte Ethernet MTU; more on jumbo frames or loopback). Fewer,
    /// larger packets cost less CPU per replicated byte [default: 8952].
    #[arg(long, env = "WEIR_REPLICATION_MAX_UDP_PAYLOAD", value_parser = clap::value_parser!(u16).range(1200..=65507))]
    pub replication_max_udp_payload: Option<u16>,
    /// A follower that has not caught up with its leader's log end for
    /// this long leaves the ISR (Kafka's `replica.lag.time.max.ms`), ms
    /// [default: 30000].
    #[arg(long, env = "WEIR_REPLICA_LAG_TIME_MAX_MS")]
    pub replica_lag_time_max_ms: Option<u64>,
    /// A follower of the ISR that is behind and has sent no fetch for this
    /// long leaves the ISR at once (it is dead or cut off: a live one always
    /// has a fetch at its leader), ms; 0 turns it off [default: 1500].
    #[arg(long, env = "WEIR_REPLICA_SILENCE_MAX_MS")]
    pub replica_silence_max_ms: Option<u64>,
    /// How often the controller leader moves leadership back to each
    /// partition's preferred replica (its first) when that one is live and
    /// in sync (Kafka's auto leader rebalance), ms; 0 turns it off
    /// [default: 300000].
    #[arg(long, env = "WEIR_LEADER_REBALANCE_INTERVAL_MS")]
    pub leader_rebalance_interval_ms: Option<u64>,
    /// Test only: the core owning a partition of this topic panics when a
    /// batch is produced to it (to test crash-only behaviour).
    #[arg(long, hide = true)]
    pub test_panic_on_produce_to: Option<String>,
    /// The OTLP receivers.
    #[command(flatten)]
    pub otlp: super::otlp_config::OtlpArgs,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    listen: Option<String>,
    core_port_base: Option<u16>,
    cores: Option<usize>,
    metrics_listen: Option<String>,
    metrics_bearer_token_file: Option<PathBuf>,
    metrics_basic_auth_file: Option<PathBuf>,
    kafka_listener: Option<String>,
    ssl_certificate_file: Option<PathBuf>,
    ssl_key_file: Option<PathBuf>,
    ssl_ca_file: Option<PathBuf>,
    ssl_client_auth: Option<String>,
    ssl_principal_mapping_rules: Option<String>,
    sasl_enabled_mechanisms: Option<String>,
    connections_max_reauth_ms: Option<u64>,
    sasl_login_timeout_ms: Option<u64>,
    sasl_oauthbearer_jwks_file: Option<PathBuf>,
    sasl_oauthbearer_expected_issuer: Option<String>,
    sasl_oauthbearer_expected_audience: Option<String>,
    sasl_oauthbearer_sub_claim_name: Option<String>,
    sasl_oauthbearer_clock_skew_seconds: Option<u64>,
    authorizer: Option<String>,
    super_users: Option<String>,
    allow_everyone_if_no_acl_found: Option<bool>,
    kafka_advertised_listener: Option<String>,
    kafka_core_port_base: Option<String>,
    max_frame_bytes: Option<u32>,
    auto_create_topics: Option<bool>,
    default_partitions: Option<u32>,
    cache_bytes_per_core: Option<u64>,
    retention_check_ms: Option<u64>,
    remote_storage: Option<String>,
    #[serde(default)]
    remote_storage_options: Vec<String>,
    remote_log_task_interval_ms: Option<u64>,
    remote_log_orphan_sweep_ms: Option<u64>,
    remote_read_timeout_ms: Option<u64>,
    remote_request_timeout_ms: Option<u64>,
    remote_retry_timeout_ms: Option<u64>,
    remote_log_manager_copy_max_bytes_per_second: Option<u64>,
    log_cleaner_backoff_ms: Option<u64>,
    log_cleaner_dedupe_buffer_size: Option<u64>,
    log_cleaner_io_max_bytes_per_second: Option<u64>,
    log_cleaner_io_busy_bytes_per_second: Option<u64>,
    log_write_through_bytes: Option<u64>,
    log_write_through_alone_bytes: Option<u64>,
    log_sync_group: Option<bool>,
    offsets_partitions: Option<u32>,
    offsets_replication_factor: Option<u32>,
    offsets_segment_bytes: Option<u64>,
    offsets_retention_ms: Option<u64>,
    group_initial_rebalance_delay_ms: Option<u64>,
    share_auto_offset_reset: Option<String>,
    group_share_record_lock_duration_ms: Option<u64>,
    group_share_delivery_count_limit: Option<u16>,
    group_share_partition_max_record_locks: Option<usize>,
    group_share_session_timeout_ms: Option<u64>,
    frame_read_timeout_ms: Option<u64>,
    max_connections_per_core: Option<usize>,
    advertised_listen: Option<String>,
    node_id: Option<u64>,
    cluster_id: Option<String>,
    replication_listen: Option<String>,
    replication_advertised: Option<String>,
    voters: Option<String>,
    certs_dir: Option<PathBuf>,
    rack: Option<String>,
    session_timeout_ms: Option<u64>,
    replica_lag_time_max_ms: Option<u64>,
    replica_silence_max_ms: Option<u64>,
    leader_rebalance_interval_ms: Option<u64>,
    replication_core_port_base: Option<u16>,
    replication_udp_buffer_bytes: Option<usize>,
    replication_max_udp_payload: Option<u16>,
    #[serde(default)]
    otlp: super::otlp_config::OtlpFile,
}

/// Default node-to-node (QUIC) port.
pub const REPLICATION_PORT_DEFAULT: u16 = 9293;
/// Default session timeout, ms (a node silent this long is fenced).
pub const SESSION_TIMEOUT_MS_DEFAULT: u64 = 6000;
/// Default `replica.lag.time.max.ms`.
pub const REPLICA_LAG_TIME_MAX_MS_DEFAULT: u64 = 30_000;
/// Default `--replica-silence-max-ms`: three of a follower's long polls.
pub const REPLICA_SILENCE_MAX_MS_DEFAULT: u64 = 1_500;
/// Default preferred-leader rebalance interval (Kafka's
/// `leader.imbalance.check.interval.seconds`, 300).
pub const LEADER_REBALANCE_INTERVAL_MS_DEFAULT: u64 = 300_000;
/// Default `--replication-udp-buffer-bytes`: 4 MiB, what an 8 MiB fetch
/// answer's bursts need on a fast link without loss (at the kernel's
/// default 208 KiB, 1 GB of catch-up on loopback lost ~2 100 datagrams
/// and QUIC's window stayed near 170 KB).
pub const REPLICATION_UDP_BUFFER_BYTES_DEFAULT: usize = 4 << 20;
/// Default `--replication-max-udp-payload`: a 9000-byte (jumbo) MTU less
/// the IPv6 and UDP headers. Where the path carries less, MTU discovery
/// stops lower; on loopback it cut a follower stream's CPU per MB by ~40 %
/// against quinn's 1452.
pub const REPLICATION_MAX_UDP_PAYLOAD_DEFAULT: u16 = 8952;

/// A node's place in the cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Node id (≥ 1).
    pub node_id: u64,
    /// The native address clients are told (`None`: the bound one).
    pub advertised_listen: Option<String>,
    /// Cluster id (`None`: a one-node cluster's own, kept in the data directory).
    pub cluster_id: Option<String>,
    /// Node-to-node (QUIC) address to bind.
    pub replication_listen: SocketAddr,
    /// The address other nodes use (`None`: the bound one).
    pub replication_advertised: Option<String>,
    /// Initial voters (id → replication address); empty: this node alone.
    pub voters: std::collections::BTreeMap<u64, String>,
    /// Certificates (`None`: `<data_dir>/certs`, created when missing for
    /// a one-node cluster).
    pub certs_dir: Option<PathBuf>,
    /// Rack.
    pub rack: String,
    /// Session timeout, ms.
    pub session_timeout_ms: u64,
    /// `replica.lag.time.max.ms`.
    pub replica_lag_time_max_ms: u64,
    /// `--replica-silence-max-ms` (0: off).
    pub replica_silence_max_ms: u64,
    /// Preferred-leader rebalance interval, ms (0: off).
    pub leader_rebalance_interval_ms: u64,
    /// First per-core replication port (`None`: replication port + 1;
    /// `Some(0)`: free ports).
    pub replication_core_port_base: Option<u16>,
    /// `--replication-udp-buffer-bytes`.
    pub replication_udp_buffer_bytes: usize,
    /// `--replication-max-udp-payload`.
    pub replication_max_udp_payload: u16,
}

impl ClusterConfig {
    /// A one-node cluster whose replication endpoint takes a free loopback port.
    pub fn single() -> Self {
        Self {
            node_id: 1,
            advertised_listen: None,
            cluster_id: None,
            replication_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            replication_advertised: None,
            voters: Default::default(),
            certs_dir: None,
            rack: String::new(),
            session_timeout_ms: SESSION_TIMEOUT_MS_DEFAULT,
            replica_lag_time_max_ms: REPLICA_LAG_TIME_MAX_MS_DEFAULT,
            replica_silence_max_ms: REPLICA_SILENCE_MAX_MS_DEFAULT,
            leader_rebalance_interval_ms: LEADER_REBALANCE_INTERVAL_MS_DEFAULT,
            replication_core_port_base: None,
            replication_udp_buffer_bytes: REPLICATION_UDP_BUFFER_BYTES_DEFAULT,
            replication_max_udp_payload: REPLICATION_MAX_UDP_PAYLOAD_DEFAULT,
        }
    }
}

/// Parses `ID@HOST:PORT,…`.
pub fn parse_voters(v: &str) -> anyhow::Result<std::collections::BTreeMap<u64, String>> {
    let mut voters = std::collections::BTreeMap::new();
    for item in v.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (id, addr) = item
            .split_once('@')
            .with_context(|| format!("--voters: `{item}` is not ID@HOST:PORT"))?;
        let id: u64 = id
            .parse()
            .ok()
            .filter(|i| *i > 0)
            .with_context(|| format!("--voters: `{id}` is not a node id (1 or more)"))?;
        if addr.rsplit_once(':').is_none() {
            bail!("--voters: `{addr}` is not HOST:PORT");
        }
        if voters.insert(id, addr.to_string()).is_some() {
            bail!("--voters names node {id} twice");
        }
    }
    Ok(voters)
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Data directory.
    pub data_dir: PathBuf,
    /// Shared native-protocol address.
    pub listen: SocketAddr,
    /// The native listener's security protocol (its per-core ports too).
    pub listen_protocol: SecurityProtocol,
    /// Further native listeners, each with a security protocol of its own.
    pub listen_more: Vec<MoreListener>,
    /// First per-core port (0: free ports).
    pub core_port_base: u16,
    /// Number of cores.
    pub cores: usize,
    /// Metrics address.
    pub metrics_listen: SocketAddr,
    /// The metrics endpoint's security protocol.
    pub metrics_protocol: SecurityProtocol,
    /// The token `GET /metrics` must carry, if any.
    pub metrics_bearer_token: Option<String>,
    /// `user:password` pairs `GET /metrics` may log in with (HTTP basic
    /// auth), if any.
    pub metrics_basic_auth: Vec<(String, String)>,
    /// Kafka protocol address (`None`: no Kafka listener).
    pub kafka_listener: Option<SocketAddr>,
    /// The Kafka listener's security protocol (its per-core ports too).
    pub kafka_protocol: SecurityProtocol,
    /// Further Kafka listeners, each with a security protocol of its own.
    pub kafka_more: Vec<MoreListener>,
    /// TLS of the SSL:// listeners (`None`: no certificate configured).
    pub ssl: Option<SslSettings>,
    /// SASL of the SASL_* listeners.
    pub sasl: SaslSettings,
    /// Who may do what.
    pub authorization: AuthorizationSettings,
    /// How client certificates' subjects become principals.
    pub ssl_principal_rules: super::principal::PrincipalRules,
    /// What Kafka clients are told to connect to (`None`: the listener's
    /// bound address).
    pub kafka_advertised_listener: Option<(String, u16)>,
    /// First per-core Kafka port (0: free ports; `None`: no per-core
    /// Kafka brokers).
    pub kafka_core_port_base: Option<u16>,
    /// Largest request frame.
    pub max_frame_bytes: u32,
    /// `auto.create.topics.enable`.
    pub auto_create_topics: bool,
    /// Partitions of auto-created topics.
    pub default_partitions: u32,
    /// Cache budget per core.
    pub cache_bytes_per_core: u64,
    /// Retention interval, ms.
    pub retention_check_ms: u64,
    /// Tiered storage's object store, if any.
    pub remote_storage: Option<weir_tier::RemoteConfig>,
    /// How often the tiering task runs on each core, ms.
    pub remote_log_task_interval_ms: u64,
    /// How often a tiered partition's remote folder is swept of orphaned
    /// objects, ms (0: never).
    pub remote_log_orphan_sweep_ms: u64,
    /// Cleaner back-off, ms.
    pub log_cleaner_backoff_ms: u64,
    /// Cleaner key-map memory per core, bytes.
    pub log_cleaner_dedupe_buffer_size: u64,
    /// Cap of a core's cleaner I/O, bytes/s (`None`: none).
    pub log_cleaner_io_max_bytes_per_second: Option<u64>,
    /// Cap of a core's cleaner I/O while the core appends (`None`: none).
    pub log_cleaner_io_busy_bytes_per_second: Option<u64>,
    /// Rounds at least this large are written through O_DSYNC (0: never).
    pub log_write_through_bytes: u64,
    /// A round of a core that writes one log only, smaller than this, is
    /// written through (0: off).
    pub log_write_through_alone_bytes: u64,
    /// A core's syncs of several files share one syncfs.
    pub log_sync_group: bool,
    /// Partitions of `__consumer_offsets` when it is created.
    pub offsets_partitions: u32,
    /// Replicas of each `__consumer_offsets` partition when it is created
    /// (at most the live nodes).
    pub offsets_replication_factor: u32,
    /// Segment size of `__consumer_offsets`.
    pub offsets_segment_bytes: u64,
    /// Retention of empty groups and their offsets, ms.
    pub offsets_retention_ms: u64,
    /// Initial rebalance delay of classic groups, ms.
    pub group_initial_rebalance_delay_ms: u64,
    /// Share groups start at the log's start (`true`) or end.
    pub share_from_earliest: bool,
    /// Share partitions' settings (lock duration, delivery limit).
    pub share: weir_share::partition::ShareConfig,
    /// Share groups' settings (session timeout, heartbeat interval).
    pub share_group: weir_share::group::GroupConfig,
    /// Frame read deadline, ms.
    pub frame_read_timeout_ms: u64,
    /// Open connections per core.
    pub max_connections_per_core: usize,
    /// Test only: panic when producing to this topic.
    pub test_panic_on_produce_to: Option<String>,
    /// The OTLP receivers.
    pub otlp: super::otlp_config::OtlpConfig,
    /// The node's place in the cluster.
    pub cluster: ClusterConfig,
}

/// A client listener after the first of its family: `--listen` and
/// `--kafka-listener` take several, comma-separated, each with a security
/// protocol of its own (which is also its name, as in Kafka without a
/// `listener.security.protocol.map`: one listener per protocol). Clients
/// are told the addresses of the listener they came in on.
#[derive(Debug, Clone)]
pub struct MoreListener {
    /// Its security protocol.
    pub protocol: SecurityProtocol,
    /// Where it listens (port 0: a free port).
    pub addr: SocketAddr,
    /// What clients are told to connect to (`None`: the bound address).
    pub advertised: Option<(String, u16)>,
}

/// `host:port`, with an IPv6 host in brackets.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Splits a listener flag (`--listen`, `--kafka-listener`) into its first
/// listener (protocol, address text) and the others; the protocols must
/// differ (they name the listeners).
fn listener_list(
    flag: &str,
    value: &str,
) -> anyhow::Result<((SecurityProtocol, String), Vec<MoreListener>)> {
    let mut parts = value.split(',').map(str::trim);
    let first = split_listener(flag, parts.next().unwrap_or_default())?;
    let mut seen = vec![first.0];
    let mut more = Vec::new();
    for part in parts {
        let (protocol, a) = split_listener(flag, part)?;
        if a == "off" {
            bail!("{flag}: `off` cannot stand beside other listeners");
        }
        if seen.contains(&protocol) {
            bail!(
                "{flag} `{value}`: two {} listeners (a listener is named by its security \
                 protocol: one of each at most)",
                protocol.name()
            );
        }
        seen.push(protocol);
        let addr = a
            .parse()
            .with_context(|| format!("{flag} `{part}` is not an address like 127.0.0.1:9292"))?;
        more.push(MoreListener {
            protocol,
            addr,
            advertised: None,
        });
    }
    Ok((first, more))
}

/// An advertised-address flag's `value` applied to a family's listeners
/// (the first one's protocol, the others): the others' are filled in, the
/// first one's returned.
fn advertise(
    flag: &str,
    value: Option<String>,
    first: SecurityProtocol,
    more: &mut [MoreListener],
) -> anyhow::Result<Option<(String, u16)>> {
    let Some(value) = value else {
        return Ok(None);
    };
    let protocols: Vec<_> = std::iter::once(first)
        .chain(more.iter().map(|l| l.protocol))
        .collect();
    let mut told = advertised_list(flag, &value, &protocols)?;
    for (l, a) in more.iter_mut().zip(told.drain(1..)) {
        l.advertised = a;
    }
    Ok(told.remove(0))
}

/// What an advertised-address flag tells the clients of each listener
/// (`protocols`, in the listener flag's order): comma-separated
/// `NAME://host:port` entries go to the listener of that name, bare
/// `host:port` ones to the listener in the same place.
fn advertised_list(
    flag: &str,
    value: &str,
    protocols: &[SecurityProtocol],
) -> anyhow::Result<Vec<Option<(String, u16)>>> {
    let mut out = vec![None; protocols.len()];
    for (i, part) in value.split(',').map(str::trim).enumerate() {
        let (at, addr) = match part.split_once("://") {
            Some((name, a)) => {
                let at = protocols
                    .iter()
                    .position(|p| p.name().eq_ignore_ascii_case(name))
                    .with_context(|| format!("{flag} `{part}`: there is no {name} listener"))?;
                (at, a)
            }
            None if i < protocols.len() => (i, part),
            None => bail!(
                "{flag} `{value}` names more addresses than there are listeners ({})",
                protocols.len()
            ),
        };
        let (host, port) = addr
            .rsplit_once(':')
            .with_context(|| format!("{flag} `{part}` is not host:port"))?;
        let port: u16 = port
            .parse()
            .with_context(|| format!("{flag} `{part}`: bad port"))?;
        let host = host.trim_matches(['[', ']']);
        if host.is_empty() {
            bail!("{flag} `{part}`: no host");
        }
        if out[at].replace((host.to_string(), port)).is_some() {
            bail!(
                "{flag} `{value}` names the {} listener twice",
                protocols[at].name()
            );
        }
    }
    Ok(out)
}

fn load_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))
}

impl BrokerConfig {
    /// The embedded defaults for a broker inside another program (e.g.
    /// `weir-bench --embedded`): data in `data_dir`, `cores` cores, every
    /// listener on a free loopback port.
    pub fn embedded(data_dir: PathBuf, cores: usize) -> BrokerConfig {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        BrokerConfig {
            data_dir,
            listen: loopback,
            listen_protocol: SecurityProtocol::Plaintext,
            listen_more: Vec::new(),
            core_port_base: 0,
            cores: cores.max(1),
            metrics_listen: loopback,
            metrics_protocol: SecurityProtocol::Plaintext,
            metrics_bearer_token: None,
            metrics_basic_auth: Vec::new(),
            kafka_listener: Some(loopback),
            kafka_protocol: SecurityProtocol::Plaintext,
            kafka_more: Vec::new(),
            ssl: None,
            sasl: SaslSettings::default(),
            authorization: AuthorizationSettings::default(),
            ssl_principal_rules: Default::default(),
            kafka_advertised_listener: None,
            kafka_core_port_base: Some(0),
            max_frame_bytes: FRAME_BYTES_MAX_DEFAULT,
            auto_create_topics: false,
            default_partitions: 1,
            cache_bytes_per_core: weir_storage::CACHE_BYTES_PER_CORE_DEFAULT,
            retention_check_ms: RETENTION_CHECK_MS_DEFAULT,
            remote_storage: None,
            remote_log_task_interval_ms: REMOTE_LOG_TASK_INTERVAL_MS_DEFAULT,
            remote_log_orphan_sweep_ms: REMOTE_LOG_ORPHAN_SWEEP_MS_DEFAULT,
            log_cleaner_backoff_ms: weir_storage::cleaner::CLEANER_BACKOFF_MS_DEFAULT,
            log_cleaner_dedupe_buffer_size: weir_storage::cleaner::DEDUPE_BUFFER_BYTES_DEFAULT,
            log_cleaner_io_max_bytes_per_second: None,
            log_cleaner_io_busy_bytes_per_second: Some(
                weir_storage::cleaner::CLEANER_IO_BUSY_BYTES_PER_SEC_DEFAULT,
            ),
            log_write_through_bytes: weir_storage::shard::WRITE_THROUGH_BYTES_MIN_DEFAULT,
            log_write_through_alone_bytes:
                weir_storage::shard::WRITE_THROUGH_ALONE_BYTES_MAX_DEFAULT,
            log_sync_group: true,
            offsets_partitions: OFFSETS_PARTITIONS_DEFAULT,
            offsets_replication_factor: 3,
            offsets_segment_bytes: OFFSETS_SEGMENT_BYTES_DEFAULT,
            offsets_retention_ms: OFFSETS_RETENTION_MS_DEFAULT,
            group_initial_rebalance_delay_ms: GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT,
            share_from_earliest: false,
            share: weir_share::partition::ShareConfig::default(),
            share_group: weir_share::group::GroupConfig::default(),
            frame_read_timeout_ms: FRAME_READ_TIMEOUT_MS_DEFAULT,
            max_connections_per_core: CONNECTIONS_PER_CORE_MAX_DEFAULT,
            test_panic_on_produce_to: None,
            otlp: super::otlp_config::OtlpConfig::embedded(),
            cluster: ClusterConfig::single(),
        }
    }

    /// Resolves flags/env over the file over the defaults.
    pub fn resolve(args: &BrokerArgs) -> anyhow::Result<BrokerConfig> {
        let file = match &args.config {
            Some(p) => load_file(p)?,
            None => FileConfig::default(),
        };
        let available = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let cores = args.cores.or(file.cores).unwrap_or(available);
        if cores == 0 {
            bail!("--cores must be at least 1");
        }
        let addr = |what: &str, v: Option<String>, d: &str| -> anyhow::Result<SocketAddr> {
            let s = v.unwrap_or_else(|| d.to_string());
            s.parse()
                .with_context(|| format!("{what} `{s}` is not an address like 127.0.0.1:9292"))
        };
        // A listener: the flag's value, the file's, or the default, split
        // into its security protocol and address.
        let listener = |flag: &str, arg: &Option<String>, file: &Option<String>, default: &str| {
            let v = arg.clone().or(file.clone());
            split_listener(flag, v.as_deref().unwrap_or(default))
        };
        let native = args.listen.clone().or(file.listen.clone());
        let ((listen_protocol, listen), mut listen_more) =
            listener_list("--listen", native.as_deref().unwrap_or(LISTEN_DEFAULT))?;
        let ((kafka_protocol, kafka_listener), mut kafka_more) =
            match args.kafka_listener.clone().or(file.kafka_listener.clone()) {
                Some(v) => {
                    let (first, more) = listener_list("--kafka-listener", &v)?;
                    ((first.0, Some(first.1)), more)
                }
                None => ((SecurityProtocol::Plaintext, None), Vec::new()),
            };
        // What each listener tells clients, matched by name or by place.
        let native_advertised = advertise(
            "--advertised-listen",
            args.advertised_listen
                .clone()
                .or(file.advertised_listen.clone()),
            listen_protocol,
            &mut listen_more,
        )?;
        let kafka_advertised = advertise(
            "--kafka-advertised-listener",
            args.kafka_advertised_listener
                .clone()
                .or(file.kafka_advertised_listener.clone()),
            kafka_protocol,
            &mut kafka_more,
        )?;
        let (metrics_protocol, metrics_listen) = listener(
            "--metrics-listen",
            &args.metrics_listen,
            &file.metrics_listen,
            METRICS_LISTEN_DEFAULT,
        )?;
        let metrics_bearer_token = match args
            .metrics_bearer_token_file
            .clone()
            .or(file.metrics_bearer_token_file.clone())
        {
            None => None,
            Some(path) => {
                let token = std::fs::read_to_string(&path).with_context(|| {
                    format!("reading --metrics-bearer-token-file {}", path.display())
                })?;
                let token = token.trim().to_string();
                if token.is_empty() {
                    bail!("--metrics-bearer-token-file {} is empty", path.display());
                }
                Some(token)
            }
        };
        let metrics_basic_auth = match args
            .metrics_basic_auth_file
            .clone()
            .or(file.metrics_basic_auth_file.clone())
        {
            None => Vec::new(),
            Some(path) => {
                let text = std::fs::read_to_string(&path).with_context(|| {
                    format!("reading --metrics-basic-auth-file {}", path.display())
                })?;
                let mut pairs = Vec::new();
                for (i, line) in text.lines().enumerate() {
                    let line = line.trim();
                    if line.is_empty() || line.starts_with('#') {
                        continue;
                    }
                    match line.split_once(':') {
                        Some((u, p)) if !u.is_empty() && !p.is_empty() => {
                            pairs.push((u.to_string(), p.to_string()))
                        }
                        _ => bail!(
                            "--metrics-basic-auth-file {} line {}: not `user:password`",
                            path.display(),
                            i + 1
                        ),
                    }
                }
                if pairs.is_empty() {
                    bail!("--metrics-basic-auth-file {} names no user", path.display());
                }
                pairs
            }
        };
        let client_auth: ClientAuth = args
            .ssl_client_auth
            .clone()
            .or(file.ssl_client_auth.clone())
            .map(|v| v.parse())
            .transpose()?
            .unwrap_or_default();
        let ssl = match (
            args.ssl_certificate_file
                .clone()
                .or(file.ssl_certificate_file.clone()),
            args.ssl_key_file.clone().or(file.ssl_key_file.clone()),
        ) {
            (Some(certificate), Some(key)) => Some(SslSettings {
                certificate,
                key,
                ca: args.ssl_ca_file.clone().or(file.ssl_ca_file.clone()),
                client_auth,
            }),
            (None, None) => None,
            _ => bail!("--ssl-certificate-file and --ssl-key-file go together"),
        };
        let wants_ssl = [listen_protocol, kafka_protocol, metrics_protocol]
            .iter()
            .chain(listen_more.iter().map(|l| &l.protocol))
            .chain(kafka_more.iter().map(|l| &l.protocol))
            .any(|p| p.tls());
        if wants_ssl && ssl.is_none() {
            bail!(
                "an SSL:// or SASL_SSL:// listener needs --ssl-certificate-file and --ssl-key-file (PEM files)"
            );
        }
        if metrics_protocol.sasl() {
            bail!(
                "--metrics-listen takes PLAINTEXT:// or SSL:// (with --metrics-bearer-token-file), not {}",
                metrics_protocol.name()
            );
        }
        let oauth = args
            .sasl_oauthbearer_jwks_file
            .clone()
            .or(file.sasl_oauthbearer_jwks_file.clone())
            .map(|f| crate::server::oauth::OAuthSettings {
                // Kafka's endpoint URL form is taken too.
                jwks_file: f
                    .to_str()
                    .and_then(|t| t.strip_prefix("file://"))
                    .map_or(f.clone(), PathBuf::from),
                expected_issuer: args
                    .sasl_oauthbearer_expected_issuer
                    .clone()
                    .or(file.sasl_oauthbearer_expected_issuer.clone()),
                expected_audience: args
                    .sasl_oauthbearer_expected_audience
                    .clone()
                    .or(file.sasl_oauthbearer_expected_audience.clone())
                    .map(|a| {
                        a.split(',')
                            .map(str::trim)
                            .filter(|a| !a.is_empty())
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default(),
                sub_claim_name: args
                    .sasl_oauthbearer_sub_claim_name
                    .clone()
                    .or(file.sasl_oauthbearer_sub_claim_name.clone())
                    .unwrap_or_else(|| "sub".into()),
                clock_skew_s: args
                    .sasl_oauthbearer_clock_skew_seconds
                    .or(file.sasl_oauthbearer_clock_skew_seconds)
                    .unwrap_or(crate::server::oauth::CLOCK_SKEW_S_DEFAULT),
            });
        let mechanisms = match args
            .sasl_enabled_mechanisms
            .clone()
            .or(file.sasl_enabled_mechanisms.clone())
        {
            None => {
                let mut m = SaslSettings::default().mechanisms;
                if oauth.is_some() {
                    m.push(Mechanism::OAuthBearer);
                }
                m
            }
            Some(v) => parse_mechanisms(&v)?,
        };
        if mechanisms.contains(&Mechanism::OAuthBearer) && oauth.is_none() {
            bail!("OAUTHBEARER needs --sasl-oauthbearer-jwks-file: the public keys its tokens are checked against");
        }
        let sasl = SaslSettings {
            mechanisms,
            oauth,
            reauth_ms: args
                .connections_max_reauth_ms
                .or(file.connections_max_reauth_ms)
                .unwrap_or(0),
            login_timeout_ms: args
                .sasl_login_timeout_ms
                .or(file.sasl_login_timeout_ms)
                .unwrap_or(SASL_LOGIN_TIMEOUT_MS_DEFAULT)
                .max(1),
        };
        let max_frame_bytes = args
            .max_frame_bytes
            .or(file.max_frame_bytes)
            .unwrap_or(FRAME_BYTES_MAX_DEFAULT);
        if (max_frame_bytes as usize) < weir_proto::batch::HEADER_BYTES + 64 {
            bail!("--max-frame-bytes {max_frame_bytes} is too small");
        }
        if max_frame_bytes as u64 > INFLIGHT_BYTES_PER_CORE {
            bail!(
                "--max-frame-bytes {max_frame_bytes} is larger than a core's in-flight budget ({})",
                INFLIGHT_BYTES_PER_CORE
            );
        }
        let default_partitions = args
            .default_partitions
            .or(file.default_partitions)
            .unwrap_or(1);
        if default_partitions == 0 {
            bail!("--default-partitions must be at least 1");
        }
        let offsets_partitions = args
            .offsets_partitions
            .or(file.offsets_partitions)
            .unwrap_or(OFFSETS_PARTITIONS_DEFAULT);
        if !(1..=OFFSETS_PARTITIONS_MAX).contains(&offsets_partitions) {
            bail!("--offsets-partitions must be 1 to {OFFSETS_PARTITIONS_MAX}");
        }
        let kafka_core_port_base = args
            .kafka_core_port_base
            .clone()
            .or(file.kafka_core_port_base.clone());
        let mut config = BrokerConfig {
            data_dir: args
                .data_dir
                .clone()
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from(DATA_DIR_DEFAULT)),
            listen: addr("--listen", Some(listen), LISTEN_DEFAULT)?,
            listen_protocol,
            listen_more,
            core_port_base: args
                .core_port_base
                .or(file.core_port_base)
                .unwrap_or(CORE_PORT_BASE_DEFAULT),
            cores,
            metrics_listen: addr(
                "--metrics-listen",
                Some(metrics_listen),
                METRICS_LISTEN_DEFAULT,
            )?,
            metrics_protocol,
            metrics_bearer_token,
            metrics_basic_auth,
            kafka_listener: match kafka_listener {
                Some(v) if v == "off" || v.is_empty() => {
                    if !kafka_more.is_empty() {
                        bail!("--kafka-listener: `off` cannot stand beside other listeners");
                    }
                    None
                }
                v => Some(addr("--kafka-listener", v, KAFKA_LISTENER_DEFAULT)?),
            },
            kafka_protocol,
            kafka_more,
            ssl: ssl.clone(),
            sasl,
            ssl_principal_rules: match args
                .ssl_principal_mapping_rules
                .clone()
                .or(file.ssl_principal_mapping_rules.clone())
            {
                None => Default::default(),
                Some(v) => super::principal::PrincipalRules::parse(&v)
                    .context("--ssl-principal-mapping-rules")?,
            },
            authorization: AuthorizationSettings {
                enabled: match args
                    .authorizer
                    .clone()
                    .or(file.authorizer.clone())
                    .as_deref()
                {
                    None | Some("none") => false,
                    Some("acl") => true,
                    Some(other) => bail!("--authorizer `{other}`: acl or none"),
                },
                super_users: args
                    .super_users
                    .clone()
                    .or(file.super_users.clone())
                    .map(|v| parse_principals(&v))
                    .transpose()?
                    .unwrap_or_default(),
                allow_if_no_acl: args
                    .allow_everyone_if_no_acl_found
                    .or(file.allow_everyone_if_no_acl_found)
                    .unwrap_or(false),
            },
            kafka_advertised_listener: kafka_advertised,
            max_frame_bytes,
            auto_create_topics: args
                .auto_create_topics
                .or(file.auto_create_topics)
                .unwrap_or(false),
            default_partitions,
            cache_bytes_per_core: args
                .cache_bytes_per_core
                .or(file.cache_bytes_per_core)
                .unwrap_or(weir_storage::CACHE_BYTES_PER_CORE_DEFAULT),
            retention_check_ms: args
                .retention_check_ms
                .or(file.retention_check_ms)
                .unwrap_or(RETENTION_CHECK_MS_DEFAULT)
                .max(1),
            remote_storage: match args.remote_storage.clone().or(file.remote_storage.clone()) {
                None => {
                    if !args.remote_storage_options.is_empty() {
                        bail!("--remote-storage-option needs --remote-storage");
                    }
                    for (flag, given) in [
                        (
                            "--remote-log-manager-copy-max-bytes-per-second",
                            args.remote_log_manager_copy_max_bytes_per_second,
                        ),
                        (
                            "--remote-request-timeout-ms",
                            args.remote_request_timeout_ms,
                        ),
                        ("--remote-retry-timeout-ms", args.remote_retry_timeout_ms),
                    ] {
                        if given.is_some() {
                            bail!("{flag} needs --remote-storage");
                        }
                    }
                    None
                }
                Some(url) => {
                    let mut c = weir_tier::RemoteConfig::new(url);
                    let given = file
                        .remote_storage_options
                        .iter()
                        .chain(&args.remote_storage_options);
                    for kv in given {
                        let Some((k, v)) = kv.split_once('=') else {
                            bail!("--remote-storage-option {kv}: use KEY=VALUE");
                        };
                        c.options.push((k.trim().to_string(), v.trim().to_string()));
                    }
                    let timeout = |flag: &str, given: Option<u64>, into: &mut Duration| {
                        match given {
                            Some(0) => bail!("{flag} 0: use at least 1"),
                            Some(ms) => *into = Duration::from_millis(ms),
                            None => {}
                        }
                        Ok(())
                    };
                    timeout(
                        "--remote-read-timeout-ms",
                        args.remote_read_timeout_ms.or(file.remote_read_timeout_ms),
                        &mut c.read_timeout,
                    )?;
                    timeout(
                        "--remote-request-timeout-ms",
                        args.remote_request_timeout_ms
                            .or(file.remote_request_timeout_ms),
                        &mut c.request_timeout,
                    )?;
                    timeout(
                        "--remote-retry-timeout-ms",
                        args.remote_retry_timeout_ms
                            .or(file.remote_retry_timeout_ms),
                        &mut c.retry_timeout,
                    )?;
                    c.copy_max_bytes_per_sec = args
                        .remote_log_manager_copy_max_bytes_per_second
                        .or(file.remote_log_manager_copy_max_bytes_per_second)
                        .filter(|&b| b > 0);
                    Some(c)
                }
            },
            remote_log_task_interval_ms: args
                .remote_log_task_interval_ms
                .or(file.remote_log_task_interval_ms)
                .unwrap_or(REMOTE_LOG_TASK_INTERVAL_MS_DEFAULT)
                .max(10),
            remote_log_orphan_sweep_ms: args
                .remote_log_orphan_sweep_ms
                .or(file.remote_log_orphan_sweep_ms)
                .unwrap_or(REMOTE_LOG_ORPHAN_SWEEP_MS_DEFAULT),
            log_cleaner_backoff_ms: args
                .log_cleaner_backoff_ms
                .or(file.log_cleaner_backoff_ms)
                .unwrap_or(weir_storage::cleaner::CLEANER_BACKOFF_MS_DEFAULT)
                .max(1),
            log_cleaner_dedupe_buffer_size: args
                .log_cleaner_dedupe_buffer_size
                .or(file.log_cleaner_dedupe_buffer_size)
                .unwrap_or(weir_storage::cleaner::DEDUPE_BUFFER_BYTES_DEFAULT)
                .max(weir_storage::cleaner::MAP_BYTES_PER_KEY),
            log_cleaner_io_max_bytes_per_second: args
                .log_cleaner_io_max_bytes_per_second
                .or(file.log_cleaner_io_max_bytes_per_second)
                .filter(|&v| v > 0),
            log_write_through_bytes: args
                .log_write_through_bytes
                .or(file.log_write_through_bytes)
                .unwrap_or(weir_storage::shard::WRITE_THROUGH_BYTES_MIN_DEFAULT),
            log_write_through_alone_bytes: args
                .log_write_through_alone_bytes
                .or(file.log_write_through_alone_bytes)
                .unwrap_or(weir_storage::shard::WRITE_THROUGH_ALONE_BYTES_MAX_DEFAULT),
            log_sync_group: args.log_sync_group.or(file.log_sync_group).unwrap_or(true),
            log_cleaner_io_busy_bytes_per_second: Some(
                args.log_cleaner_io_busy_bytes_per_second
                    .or(file.log_cleaner_io_busy_bytes_per_second)
                    .unwrap_or(weir_storage::cleaner::CLEANER_IO_BUSY_BYTES_PER_SEC_DEFAULT),
            )
            .filter(|&v| v > 0),
            offsets_partitions,
            offsets_replication_factor: args
                .offsets_replication_factor
                .or(file.offsets_replication_factor)
                .unwrap_or(3)
                .max(1),
            offsets_segment_bytes: {
                let v = args
                    .offsets_segment_bytes
                    .or(file.offsets_segment_bytes)
                    .unwrap_or(OFFSETS_SEGMENT_BYTES_DEFAULT);
                let range = weir_storage::config::SEGMENT_BYTES_MIN
                    ..=weir_storage::config::SEGMENT_BYTES_MAX;
                if !range.contains(&v) {
                    anyhow::bail!(
                        "--offsets-segment-bytes {v} is not within {}..={}",
                        range.start(),
                        range.end()
                    );
                }
                v
            },
            offsets_retention_ms: args
                .offsets_retention_ms
                .or(file.offsets_retention_ms)
                .unwrap_or(OFFSETS_RETENTION_MS_DEFAULT)
                .max(1),
            group_initial_rebalance_delay_ms: args
                .group_initial_rebalance_delay_ms
                .or(file.group_initial_rebalance_delay_ms)
                .unwrap_or(GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT),
            share_from_earliest: match args
                .share_auto_offset_reset
                .as_deref()
                .or(file.share_auto_offset_reset.as_deref())
                .unwrap_or("latest")
            {
                "latest" => false,
                "earliest" => true,
                other => {
                    bail!("--share-auto-offset-reset {other:?}: use latest or earliest")
                }
            },
            share: {
                use weir_share::limits::*;
                let lock_ms = args
                    .group_share_record_lock_duration_ms
                    .or(file.group_share_record_lock_duration_ms)
                    .map_or(RECORD_LOCK_DURATION_MS_DEFAULT, |v| v as i64);
                if !(RECORD_LOCK_DURATION_MS_MIN..=RECORD_LOCK_DURATION_MS_MAX).contains(&lock_ms) {
                    bail!(
                        "--group-share-record-lock-duration-ms {lock_ms}: use \
                         {RECORD_LOCK_DURATION_MS_MIN}..={RECORD_LOCK_DURATION_MS_MAX}"
                    );
                }
                let delivery_limit = args
                    .group_share_delivery_count_limit
                    .or(file.group_share_delivery_count_limit)
                    .unwrap_or(DELIVERY_COUNT_LIMIT_DEFAULT);
                if !(DELIVERY_COUNT_LIMIT_MIN..=DELIVERY_COUNT_LIMIT_MAX).contains(&delivery_limit)
                {
                    bail!(
                        "--group-share-delivery-count-limit {delivery_limit}: use \
                         {DELIVERY_COUNT_LIMIT_MIN}..={DELIVERY_COUNT_LIMIT_MAX}"
                    );
                }
                let max_in_flight = args
                    .group_share_partition_max_record_locks
                    .or(file.group_share_partition_max_record_locks)
                    .unwrap_or(PARTITION_MAX_RECORD_LOCKS_DEFAULT);
                if !(PARTITION_MAX_RECORD_LOCKS_MIN..=PARTITION_MAX_RECORD_LOCKS_MAX)
                    .contains(&max_in_flight)
                {
                    bail!(
                        "--group-share-partition-max-record-locks {max_in_flight}: use \
                         {PARTITION_MAX_RECORD_LOCKS_MIN}..={PARTITION_MAX_RECORD_LOCKS_MAX}"
                    );
                }
                weir_share::partition::ShareConfig {
                    lock_ms,
                    delivery_limit,
                    max_in_flight,
                }
            },
            share_group: {
                let session = args
                    .group_share_session_timeout_ms
                    .or(file.group_share_session_timeout_ms)
                    .map_or(weir_share::limits::SESSION_TIMEOUT_MS_DEFAULT, |v| v as i64);
                if !(1_000..=3_600_000).contains(&session) {
                    bail!("--group-share-session-timeout-ms {session}: use 1000..=3600000");
                }
                weir_share::group::GroupConfig {
                    session_timeout_ms: session,
                    // Kafka's default ratio (45 s / 5 s), at most 5 s.
                    heartbeat_interval_ms: (session / 9).clamp(100, 5_000),
                    ..weir_share::group::GroupConfig::default()
                }
            },
            frame_read_timeout_ms: args
                .frame_read_timeout_ms
                .or(file.frame_read_timeout_ms)
                .unwrap_or(FRAME_READ_TIMEOUT_MS_DEFAULT)
                .max(1),
            max_connections_per_core: args
                .max_connections_per_core
                .or(file.max_connections_per_core)
                .unwrap_or(CONNECTIONS_PER_CORE_MAX_DEFAULT)
                .max(1),
            test_panic_on_produce_to: args.test_panic_on_produce_to.clone(),
            otlp: super::otlp_config::OtlpConfig::resolve(&args.otlp, &file.otlp)?,
            kafka_core_port_base: None,
            cluster: ClusterConfig::single(),
        };
        let node_id = args.node_id.or(file.node_id).unwrap_or(1);
        if node_id == 0 {
            bail!("--node-id must be 1 or more");
        }
        let replication_default = SocketAddr::new(
            config.listen.ip(),
            if config.listen.port() == 0 {
                0
            } else {
                REPLICATION_PORT_DEFAULT
            },
        );
        let voters = match args.voters.clone().or(file.voters) {
            Some(v) => parse_voters(&v)?,
            None => Default::default(),
        };
        config.cluster = ClusterConfig {
            node_id,
            advertised_listen: native_advertised.map(|(h, p)| host_port(&h, p)),
            cluster_id: args.cluster_id.clone().or(file.cluster_id),
            replication_listen: match args.replication_listen.clone().or(file.replication_listen) {
                Some(v) => v.parse().with_context(|| {
                    format!("--replication-listen `{v}` is not an address like 127.0.0.1:9293")
                })?,
                None => replication_default,
            },
            replication_advertised: args
                .replication_advertised
                .clone()
                .or(file.replication_advertised),
            voters,
            certs_dir: args.certs_dir.clone().or(file.certs_dir),
            rack: args.rack.clone().or(file.rack).unwrap_or_default(),
            session_timeout_ms: args
                .session_timeout_ms
                .or(file.session_timeout_ms)
                .unwrap_or(SESSION_TIMEOUT_MS_DEFAULT)
                .max(100),
            replica_lag_time_max_ms: args
                .replica_lag_time_max_ms
                .or(file.replica_lag_time_max_ms)
                .unwrap_or(REPLICA_LAG_TIME_MAX_MS_DEFAULT)
                .max(100),
            replica_silence_max_ms: args
                .replica_silence_max_ms
                .or(file.replica_silence_max_ms)
                .unwrap_or(REPLICA_SILENCE_MAX_MS_DEFAULT),
            leader_rebalance_interval_ms: args
                .leader_rebalance_interval_ms
                .or(file.leader_rebalance_interval_ms)
                .unwrap_or(LEADER_REBALANCE_INTERVAL_MS_DEFAULT),
            replication_core_port_base: args
                .replication_core_port_base
                .or(file.replication_core_port_base),
            replication_udp_buffer_bytes: args
                .replication_udp_buffer_bytes
                .or(file.replication_udp_buffer_bytes)
                .unwrap_or(REPLICATION_UDP_BUFFER_BYTES_DEFAULT),
            replication_max_udp_payload: args
                .replication_max_udp_payload
                .or(file.replication_max_udp_payload)
                .unwrap_or(REPLICATION_MAX_UDP_PAYLOAD_DEFAULT)
                .clamp(1200, 65507),
        };
        if !config.cluster.voters.is_empty() {
            if config.cluster.cluster_id.is_none() {
                bail!("--voters names a multi-node cluster: set --cluster-id too (the same on every node)");
            }
            if config.cluster.certs_dir.is_none() {
                bail!("--voters names a multi-node cluster: set --certs-dir to the node certificates from `weir cluster certs`");
            }
        }
        config.kafka_core_port_base = match kafka_core_port_base {
            Some(v) if v == "off" => None,
            Some(v) => Some(v.parse::<u16>().with_context(|| {
                format!("--kafka-core-port-base `{v}`: a port (0: free ports) or `off`")
            })?),
            None => match config.kafka_listener {
                Some(a) if a.port() == 0 => Some(0),
                _ => Some(KAFKA_CORE_PORT_BASE_DEFAULT),
            },
        };
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_override_defaults() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("weir.toml");
        std::fs::write(&f, "cores = 3\nlisten = \"127.0.0.1:7000\"\n").unwrap();
        let args = BrokerArgs {
            config: Some(f.clone()),
            cores: Some(2),
            ..Default::default()
        };
        let c = BrokerConfig::resolve(&args).unwrap();
        assert_eq!(c.cores, 2);
        assert_eq!(c.listen.port(), 7000);
        assert_eq!(c.data_dir, PathBuf::from(DATA_DIR_DEFAULT));
        std::fs::write(&f, "nope = 1\n").unwrap();
        let e = format!("{:#}", BrokerConfig::resolve(&args).unwrap_err());
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn the_remote_storage_flags_need_it_and_refuse_zero_timeouts() {
        let e = format!(
            "{:#}",
            BrokerConfig::resolve(&BrokerArgs {
                remote_log_manager_copy_max_bytes_per_second: Some(1 << 20),
                ..Default::default()
            })
            .unwrap_err()
        );
        assert!(e.contains("needs --remote-storage"), "{e}");
        let cap = |n| {
            BrokerConfig::resolve(&BrokerArgs {
                remote_storage: Some("file:///tmp/weir-remote".into()),
                remote_log_manager_copy_max_bytes_per_second: Some(n),
                ..Default::default()
            })
            .unwrap()
            .remote_storage
            .unwrap()
            .copy_max_bytes_per_sec
        };
        assert_eq!(cap(1 << 20), Some(1 << 20));
        assert_eq!(cap(0), None);
        let remote = |request, retry| {
            BrokerConfig::resolve(&BrokerArgs {
                remote_storage: Some("file:///tmp/weir-remote".into()),
                remote_request_timeout_ms: Some(request),
                remote_retry_timeout_ms: Some(retry),
                ..Default::default()
            })
        };
        let c = remote(1_000, 2_000).unwrap().remote_storage.unwrap();
        assert_eq!(c.request_timeout, Duration::from_secs(1));
        assert_eq!(c.retry_timeout, Duration::from_secs(2));
        let e = format!("{:#}", remote(0, 2_000).unwrap_err());
        assert!(e.contains("--remote-request-timeout-ms 0"), "{e}");
    }

    fn resolved(args: BrokerArgs) -> anyhow::Result<BrokerConfig> {
        let d = tempfile::tempdir().unwrap();
        let (cert, key) = (d.path().join("c.pem"), d.path().join("k.pem"));
        BrokerConfig::resolve(&BrokerArgs {
            ssl_certificate_file: Some(cert),
            ssl_key_file: Some(key),
            ..args
        })
    }

    #[test]
    fn several_listeners_each_with_its_advertised_address() {
        let c = resolved(BrokerArgs {
            listen: Some("PLAINTEXT://127.0.0.1:9292, SSL://0.0.0.0:9392".into()),
            advertised_listen: Some("SSL://public.example:9392".into()),
            kafka_listener: Some("PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093".into()),
            kafka_advertised_listener: Some("localhost:9092,SASL_SSL://[2001:db8::1]:19093".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.listen_protocol, SecurityProtocol::Plaintext);
        assert_eq!(c.cluster.advertised_listen, None);
        assert_eq!(c.listen_more.len(), 1);
        assert_eq!(c.listen_more[0].protocol, SecurityProtocol::Ssl);
        assert_eq!(c.listen_more[0].addr.to_string(), "0.0.0.0:9392");
        assert_eq!(
            c.listen_more[0].advertised,
            Some(("public.example".into(), 9392))
        );
        assert_eq!(
            c.kafka_advertised_listener,
            Some(("localhost".into(), 9092))
        );
        assert_eq!(c.kafka_more[0].protocol, SecurityProtocol::SaslSsl);
        assert_eq!(
            c.kafka_more[0].advertised,
            Some(("2001:db8::1".into(), 19093))
        );
        assert_eq!(host_port("2001:db8::1", 1), "[2001:db8::1]:1");
    }

    #[test]
    fn listener_lists_that_cannot_be_served_are_refused() {
        let refused = |args: BrokerArgs| format!("{:#}", resolved(args).unwrap_err());
        let e = refused(BrokerArgs {
            kafka_listener: Some("SSL://127.0.0.1:1,SSL://127.0.0.1:2".into()),
            ..Default::default()
        });
        assert!(e.contains("two SSL listeners"), "{e}");
        let e = refused(BrokerArgs {
            kafka_listener: Some("off,SSL://127.0.0.1:2".into()),
            ..Default::default()
        });
        assert!(e.contains("`off` cannot stand beside"), "{e}");
        let e = refused(BrokerArgs {
            listen: Some("127.0.0.1:1,SSL://127.0.0.1:2".into()),
            advertised_listen: Some("SASL_SSL://h:1".into()),
            ..Default::default()
        });
        assert!(e.contains("there is no SASL_SSL listener"), "{e}");
        let e = refused(BrokerArgs {
            listen: Some("127.0.0.1:1".into()),
            advertised_listen: Some("a:1,b:2".into()),
            ..Default::default()
        });
        assert!(e.contains("more addresses than there are listeners"), "{e}");
        let e = refused(BrokerArgs {
            listen: Some("127.0.0.1:1,SSL://127.0.0.1:2".into()),
            advertised_listen: Some("a:1,PLAINTEXT://b:2".into()),
            ..Default::default()
        });
        assert!(e.contains("names the PLAINTEXT listener twice"), "{e}");
        // An SSL listener among several still needs a certificate.
        let e = format!(
            "{:#}",
            BrokerConfig::resolve(&BrokerArgs {
                listen: Some("127.0.0.1:1,SSL://127.0.0.1:2".into()),
                ..Default::default()
            })
            .unwrap_err()
        );
        assert!(e.contains("needs --ssl-certificate-file"), "{e}");
    }
}
