//! The OTLP receivers' settings: flags (`--otlp-*`), the config file's
//! `[otlp]` table, and what they resolve to. docs/otlp.md lists them.

use std::net::SocketAddr;

use anyhow::{bail, Context};
use serde::Deserialize;
use weir_otlp::{Cut, Encoding, Partitioning, Signal};
use weir_proto::batch::Compression;

use super::tls::{split_listener, SecurityProtocol};

/// Default OTLP/gRPC address (OTLP's port).
pub const OTLP_GRPC_DEFAULT: &str = "127.0.0.1:4317";
/// Default OTLP/HTTP address (OTLP's port).
pub const OTLP_HTTP_DEFAULT: &str = "127.0.0.1:4318";
/// Default largest request body, compressed or not, bytes.
pub const OTLP_MAX_REQUEST_BYTES_DEFAULT: usize = 16 << 20;
/// Default export bytes a node holds at once (decoded, waiting for their
/// acknowledgements), over all its cores.
pub const OTLP_BUFFER_BYTES_DEFAULT: usize = 256 << 20;
/// Default deadline of one export (its body's arrival and its
/// acknowledgement), ms.
pub const OTLP_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default time a connection may wait for its client's next bytes, ms.
pub const OTLP_IDLE_TIMEOUT_MS_DEFAULT: u64 = 60_000;

/// The OTLP flags (each also a key of the config file's `[otlp]` table,
/// without the `otlp-` prefix and with `_`).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct OtlpArgs {
    /// OTLP/gRPC address (all cores, SO_REUSEPORT); `SSL://host:port`
    /// for TLS; `off` for none [default: 127.0.0.1:4317].
    #[arg(long, env = "WEIR_OTLP_GRPC_LISTEN")]
    pub otlp_grpc_listen: Option<String>,
    /// OTLP/HTTP address (`/v1/traces`, `/v1/metrics`, `/v1/logs`;
    /// protobuf or JSON bodies); `SSL://host:port` for TLS; `off` for
    /// none [default: 127.0.0.1:4318].
    #[arg(long, env = "WEIR_OTLP_HTTP_LISTEN")]
    pub otlp_http_listen: Option<String>,
    /// Topic of spans [default: otlp_spans].
    #[arg(long, env = "WEIR_OTLP_TRACES_TOPIC")]
    pub otlp_traces_topic: Option<String>,
    /// Topic of metrics [default: otlp_metrics].
    #[arg(long, env = "WEIR_OTLP_METRICS_TOPIC")]
    pub otlp_metrics_topic: Option<String>,
    /// Topic of logs [default: otlp_logs].
    #[arg(long, env = "WEIR_OTLP_LOGS_TOPIC")]
    pub otlp_logs_topic: Option<String>,
    /// Record value encoding: otlp_proto or otlp_json [default: otlp_proto].
    #[arg(long, env = "WEIR_OTLP_ENCODING")]
    pub otlp_encoding: Option<String>,
    /// One record per trace, keyed by its id (the Collector's
    /// `partition_traces_by_id`) [default: false].
    #[arg(long, env = "WEIR_OTLP_PARTITION_TRACES_BY_ID")]
    pub otlp_partition_traces_by_id: Option<bool>,
    /// One record per resource, keyed by its attributes
    /// (`partition_metrics_by_resource_attributes`) [default: false].
    #[arg(long, env = "WEIR_OTLP_PARTITION_METRICS_BY_RESOURCE_ATTRIBUTES")]
    pub otlp_partition_metrics_by_resource_attributes: Option<bool>,
    /// One record per resource, keyed by its attributes
    /// (`partition_logs_by_resource_attributes`) [default: false].
    #[arg(long, env = "WEIR_OTLP_PARTITION_LOGS_BY_RESOURCE_ATTRIBUTES")]
    pub otlp_partition_logs_by_resource_attributes: Option<bool>,
    /// One record per trace, keyed by its id (`partition_logs_by_trace_id`)
    /// [default: false].
    #[arg(long, env = "WEIR_OTLP_PARTITION_LOGS_BY_TRACE_ID")]
    pub otlp_partition_logs_by_trace_id: Option<bool>,
    /// A resource attribute naming the topic of its resource's records
    /// (`topic_from_attribute`) [default: none].
    #[arg(long, env = "WEIR_OTLP_TOPIC_FROM_ATTRIBUTE")]
    pub otlp_topic_from_attribute: Option<String>,
    /// Request headers (gRPC metadata) copied into every record of the
    /// export as record headers, comma-separated (`include_metadata_keys`)
    /// [default: none].
    #[arg(long, env = "WEIR_OTLP_INCLUDE_METADATA_KEYS")]
    pub otlp_include_metadata_keys: Option<String>,
    /// Create a missing OTLP topic on the first export to it (independent
    /// of --auto-create-topics) [default: false].
    #[arg(long, env = "WEIR_OTLP_CREATE_TOPICS")]
    pub otlp_create_topics: Option<bool>,
    /// Partitions of topics --otlp-create-topics creates [default: 1].
    #[arg(long, env = "WEIR_OTLP_TOPIC_PARTITIONS")]
    pub otlp_topic_partitions: Option<u32>,
    /// Record batch compression: none, lz4 or zstd [default: none].
    #[arg(long, env = "WEIR_OTLP_COMPRESSION")]
    pub otlp_compression: Option<String>,
    /// Largest request body, bytes, before and after decompression
    /// [default: 16777216].
    #[arg(long, env = "WEIR_OTLP_MAX_REQUEST_BYTES")]
    pub otlp_max_request_bytes: Option<usize>,
    /// Export bytes the node holds at once before it answers "retry later"
    /// (429 / UNAVAILABLE) [default: 268435456].
    #[arg(long, env = "WEIR_OTLP_BUFFER_BYTES")]
    pub otlp_buffer_bytes: Option<usize>,
    /// Deadline of one export: its body's arrival and its durable
    /// acknowledgement, ms [default: 10000].
    #[arg(long, env = "WEIR_OTLP_TIMEOUT_MS")]
    pub otlp_timeout_ms: Option<u64>,
    /// A connection whose client sends nothing for this long is closed, ms
    /// [default: 60000].
    #[arg(long, env = "WEIR_OTLP_IDLE_TIMEOUT_MS")]
    pub otlp_idle_timeout_ms: Option<u64>,
}

/// The config file's `[otlp]` table.
#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct OtlpFile {
    grpc_listen: Option<String>,
    http_listen: Option<String>,
    traces_topic: Option<String>,
    metrics_topic: Option<String>,
    logs_topic: Option<String>,
    encoding: Option<String>,
    partition_traces_by_id: Option<bool>,
    partition_metrics_by_resource_attributes: Option<bool>,
    partition_logs_by_resource_attributes: Option<bool>,
    partition_logs_by_trace_id: Option<bool>,
    topic_from_attribute: Option<String>,
    #[serde(default)]
    include_metadata_keys: Vec<String>,
    create_topics: Option<bool>,
    topic_partitions: Option<u32>,
    compression: Option<String>,
    max_request_bytes: Option<usize>,
    buffer_bytes: Option<usize>,
    timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
}

/// One receiver's address and security protocol.
#[derive(Debug, Clone, Copy)]
pub struct OtlpListener {
    /// The address (all cores bind it, SO_REUSEPORT).
    pub addr: SocketAddr,
    /// PLAINTEXT or SSL.
    pub protocol: SecurityProtocol,
}

/// The resolved OTLP settings.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    /// OTLP/gRPC (`None`: off).
    pub grpc: Option<OtlpListener>,
    /// OTLP/HTTP (`None`: off).
    pub http: Option<OtlpListener>,
    /// Topic of each signal: traces, metrics, logs.
    pub topics: [String; 3],
    /// How each signal's exports become records: traces, metrics, logs.
    pub cuts: [Cut; 3],
    /// Request headers copied into records (lowercase).
    pub include_metadata_keys: Vec<String>,
    /// Create missing topics, with this many partitions (`None`: never).
    pub create_topics: Option<u32>,
    /// Record batch compression.
    pub compression: Compression,
    /// Largest request body, bytes (before and after decompression).
    pub max_request_bytes: usize,
    /// Export bytes held at once, per node.
    pub buffer_bytes: usize,
    /// Deadline of one export, ms.
    pub timeout_ms: u64,
    /// Idle connection limit, ms.
    pub idle_timeout_ms: u64,
}

impl OtlpConfig {
    /// Both receivers off (embedded brokers and tests that do not ask).
    pub fn off() -> OtlpConfig {
        OtlpConfig {
            grpc: None,
            http: None,
            ..OtlpConfig::resolve(&OtlpArgs::default(), &OtlpFile::default())
                .expect("the defaults resolve")
        }
    }

    /// An embedded broker's (`weir-bench --embedded`): both receivers on
    /// free loopback ports, spans routed by their resource's `weir.topic`
    /// (weir-bench's OTLP drivers name the run's topic there).
    pub fn embedded() -> OtlpConfig {
        let args = OtlpArgs {
            otlp_grpc_listen: Some("127.0.0.1:0".into()),
            otlp_http_listen: Some("127.0.0.1:0".into()),
            otlp_topic_from_attribute: Some("weir.topic".into()),
            ..OtlpArgs::default()
        };
        OtlpConfig::resolve(&args, &OtlpFile::default()).expect("the embedded settings resolve")
    }

    /// The topic and cut of a signal.
    pub fn of(&self, s: Signal) -> (&str, &Cut) {
        let i = match s {
            Signal::Traces => 0,
            Signal::Metrics => 1,
            Signal::Logs => 2,
        };
        (&self.topics[i], &self.cuts[i])
    }

    /// Flags over the file over the defaults.
    pub fn resolve(a: &OtlpArgs, f: &OtlpFile) -> anyhow::Result<OtlpConfig> {
        let listener = |flag: &str, arg: &Option<String>, file: &Option<String>, d: &str| {
            let v = arg
                .clone()
                .or(file.clone())
                .unwrap_or_else(|| d.to_string());
            if v.eq_ignore_ascii_case("off") {
                return Ok(None);
            }
            let (protocol, addr) = split_listener(flag, &v)?;
            if !matches!(
                protocol,
                SecurityProtocol::Plaintext | SecurityProtocol::Ssl
            ) {
                bail!("{flag} `{v}`: OTLP receivers take PLAINTEXT:// or SSL:// (SASL is Kafka's)");
            }
            let addr: SocketAddr = addr
                .parse()
                .with_context(|| format!("{flag} `{v}` is not an address like {d}"))?;
            anyhow::Ok(Some(OtlpListener { addr, protocol }))
        };
        let grpc = listener(
            "--otlp-grpc-listen",
            &a.otlp_grpc_listen,
            &f.grpc_listen,
            OTLP_GRPC_DEFAULT,
        )?;
        let http = listener(
            "--otlp-http-listen",
            &a.otlp_http_listen,
            &f.http_listen,
            OTLP_HTTP_DEFAULT,
        )?;
        let topic = |arg: &Option<String>, file: &Option<String>, s: Signal| {
            let t = arg
                .clone()
                .or(file.clone())
                .unwrap_or_else(|| s.default_topic().to_string());
            if t.is_empty() {
                bail!("the OTLP {} topic is empty", s.name());
            }
            anyhow::Ok(t)
        };
        let topics = [
            topic(&a.otlp_traces_topic, &f.traces_topic, Signal::Traces)?,
            topic(&a.otlp_metrics_topic, &f.metrics_topic, Signal::Metrics)?,
            topic(&a.otlp_logs_topic, &f.logs_topic, Signal::Logs)?,
        ];
        let encoding = match a
            .otlp_encoding
            .clone()
            .or(f.encoding.clone())
            .as_deref()
            .unwrap_or("otlp_proto")
        {
            "otlp_proto" => Encoding::Proto,
            "otlp_json" => Encoding::Json,
            other => bail!("--otlp-encoding `{other}`: otlp_proto or otlp_json"),
        };
        let flag = |arg: Option<bool>, file: Option<bool>| arg.or(file).unwrap_or(false);
        let traces_by_id = flag(a.otlp_partition_traces_by_id, f.partition_traces_by_id);
        let metrics_by_res = flag(
            a.otlp_partition_metrics_by_resource_attributes,
            f.partition_metrics_by_resource_attributes,
        );
        let logs_by_res = flag(
            a.otlp_partition_logs_by_resource_attributes,
            f.partition_logs_by_resource_attributes,
        );
        let logs_by_trace = flag(
            a.otlp_partition_logs_by_trace_id,
            f.partition_logs_by_trace_id,
        );
        if logs_by_res && logs_by_trace {
            bail!(
                "--otlp-partition-logs-by-resource-attributes and \
                 --otlp-partition-logs-by-trace-id exclude each other"
            );
        }
        let topic_from_attribute = a
            .otlp_topic_from_attribute
            .clone()
            .or(f.topic_from_attribute.clone())
            .filter(|s| !s.is_empty());
        let cut = |p: Partitioning| Cut {
            partitioning: p,
            encoding,
            topic_from_attribute: topic_from_attribute.clone(),
        };
        let pick = |on: bool, p: Partitioning| if on { p } else { Partitioning::None };
        let cuts = [
            cut(pick(traces_by_id, Partitioning::TraceId)),
            cut(pick(metrics_by_res, Partitioning::ResourceAttributes)),
            cut(if logs_by_trace {
                Partitioning::TraceId
            } else {
                pick(logs_by_res, Partitioning::ResourceAttributes)
            }),
        ];
        let include_metadata_keys = match &a.otlp_include_metadata_keys {
            Some(s) => s
                .split(',')
                .map(|k| k.trim().to_ascii_lowercase())
                .filter(|k| !k.is_empty())
                .collect(),
            None => f
                .include_metadata_keys
                .iter()
                .map(|k| k.to_ascii_lowercase())
                .collect(),
        };
        let partitions = a.otlp_topic_partitions.or(f.topic_partitions).unwrap_or(1);
        if partitions == 0 {
            bail!("--otlp-topic-partitions must be at least 1");
        }
        let create_topics = flag(a.otlp_create_topics, f.create_topics).then_some(partitions);
        let compression = match a
            .otlp_compression
            .clone()
            .or(f.compression.clone())
            .as_deref()
            .unwrap_or("none")
        {
            "none" => Compression::None,
            "lz4" => Compression::Lz4,
            "zstd" => Compression::Zstd,
            other => bail!("--otlp-compression `{other}`: none, lz4 or zstd"),
        };
        let max_request_bytes = a
            .otlp_max_request_bytes
            .or(f.max_request_bytes)
            .unwrap_or(OTLP_MAX_REQUEST_BYTES_DEFAULT);
        if max_request_bytes < 1024 {
            bail!("--otlp-max-request-bytes {max_request_bytes}: at least 1024");
        }
        let buffer_bytes = a
            .otlp_buffer_bytes
            .or(f.buffer_bytes)
            .unwrap_or(OTLP_BUFFER_BYTES_DEFAULT);
        let timeout_ms = a
            .otlp_timeout_ms
            .or(f.timeout_ms)
            .unwrap_or(OTLP_TIMEOUT_MS_DEFAULT);
        let idle_timeout_ms = a
            .otlp_idle_timeout_ms
            .or(f.idle_timeout_ms)
            .unwrap_or(OTLP_IDLE_TIMEOUT_MS_DEFAULT);
        if timeout_ms == 0 || idle_timeout_ms == 0 {
            bail!("--otlp-timeout-ms and --otlp-idle-timeout-ms must be positive");
        }
        Ok(OtlpConfig {
            grpc,
            http,
            topics,
            cuts,
            include_metadata_keys,
            create_topics,
            compression,
            max_request_bytes,
            buffer_bytes,
            timeout_ms,
            idle_timeout_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_collectors_and_otlps() {
        let c = OtlpConfig::resolve(&OtlpArgs::default(), &OtlpFile::default()).unwrap();
        assert_eq!(c.grpc.unwrap().addr.to_string(), "127.0.0.1:4317");
        assert_eq!(c.http.unwrap().addr.to_string(), "127.0.0.1:4318");
        assert_eq!(c.topics, ["otlp_spans", "otlp_metrics", "otlp_logs"]);
        assert!(c
            .cuts
            .iter()
            .all(|c| c.partitioning == Partitioning::None && c.encoding == Encoding::Proto));
        assert_eq!(c.create_topics, None);
        let off = OtlpConfig::off();
        assert!(off.grpc.is_none() && off.http.is_none());
    }

    #[test]
    fn flags_override_the_file_and_bad_values_say_which() {
        let f: OtlpFile = toml::from_str(
            "grpc_listen = \"off\"\nencoding = \"otlp_json\"\ninclude_metadata_keys = [\"X-Tenant\"]\n\
             partition_logs_by_trace_id = true\ncreate_topics = true\ntopic_partitions = 4\n",
        )
        .unwrap();
        let a = OtlpArgs {
            otlp_http_listen: Some("SSL://127.0.0.1:0".into()),
            otlp_partition_traces_by_id: Some(true),
            ..OtlpArgs::default()
        };
        let c = OtlpConfig::resolve(&a, &f).unwrap();
        assert!(c.grpc.is_none());
        assert_eq!(c.http.unwrap().protocol, SecurityProtocol::Ssl);
        assert_eq!(c.of(Signal::Traces).1.partitioning, Partitioning::TraceId);
        assert_eq!(c.of(Signal::Logs).1.partitioning, Partitioning::TraceId);
        assert_eq!(c.of(Signal::Metrics).1.encoding, Encoding::Json);
        assert_eq!(c.include_metadata_keys, ["x-tenant"]);
        assert_eq!(c.create_topics, Some(4));
        for (a, want) in [
            (
                OtlpArgs {
                    otlp_encoding: Some("avro".into()),
                    ..OtlpArgs::default()
                },
                "otlp_proto or otlp_json",
            ),
            (
                OtlpArgs {
                    otlp_grpc_listen: Some("SASL_SSL://127.0.0.1:1".into()),
                    ..OtlpArgs::default()
                },
                "PLAINTEXT:// or SSL://",
            ),
            (
                OtlpArgs {
                    otlp_partition_logs_by_resource_attributes: Some(true),
                    otlp_partition_logs_by_trace_id: Some(true),
                    ..OtlpArgs::default()
                },
                "exclude each other",
            ),
        ] {
            let e = OtlpConfig::resolve(&a, &OtlpFile::default()).unwrap_err();
            assert!(format!("{e:#}").contains(want), "{e:#}");
        }
        assert!(toml::from_str::<OtlpFile>("bogus = 1").is_err());
    }
}
