//! An export cut into Kafka records as the OpenTelemetry Collector's
//! Kafka exporter writes them, so that its Kafka receiver, Vector and
//! custom readers read Weir's topics unchanged: every record's value is
//! one whole `Export*ServiceRequest` (protobuf or OTLP/JSON);
//!
//! * no partitioning: one record per export, no key;
//! * by trace id (`partition_traces_by_id`, `partition_logs_by_trace_id`):
//!   one record per resource, scope and trace id, keyed by the trace id
//!   in lowercase hex (an export's spans without a trace id: an empty key
//!   for spans, none for logs);
//! * by resource attributes (`partition_metrics_by_resource_attributes`,
//!   `partition_logs_by_resource_attributes`): one record per resource,
//!   keyed by the 16 bytes of the Collector's `pdatautil.MapHash` of its
//!   attributes;
//! * a topic from a resource attribute (`topic_from_attribute`): one
//!   record (at least) per resource, each to the topic its attribute
//!   names (the configured topic when it has none).
//!
//! The cut works on the protobuf bytes: resources, scopes and items are
//! copied as they came, never decoded and re-encoded.

use std::collections::HashMap;

use bytes::Bytes;

use crate::codec::{hex, to_json};
use crate::schema::{self, Msg};
use crate::wire::{put_len, Reader, Value};
use crate::Error;

/// An OTLP signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    /// Spans (`/v1/traces`, `TraceService/Export`).
    Traces,
    /// Metrics (`/v1/metrics`, `MetricsService/Export`).
    Metrics,
    /// Log records (`/v1/logs`, `LogsService/Export`).
    Logs,
}

impl Signal {
    /// All three.
    pub const ALL: [Signal; 3] = [Signal::Traces, Signal::Metrics, Signal::Logs];

    /// The `Export*ServiceRequest` message.
    pub fn request(self) -> &'static Msg {
        match self {
            Signal::Traces => &schema::TRACES_REQUEST,
            Signal::Metrics => &schema::METRICS_REQUEST,
            Signal::Logs => &schema::LOGS_REQUEST,
        }
    }

    /// The Collector's Kafka exporter's default topic.
    pub fn default_topic(self) -> &'static str {
        match self {
            Signal::Traces => "otlp_spans",
            Signal::Metrics => "otlp_metrics",
            Signal::Logs => "otlp_logs",
        }
    }

    /// The short name (`traces`, `metrics`, `logs`): the OTLP/HTTP path's
    /// last part.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Traces => "traces",
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }

    /// The signal of an OTLP/HTTP path (`/v1/traces`, …).
    pub fn from_http_path(path: &str) -> Option<Signal> {
        Signal::ALL
            .into_iter()
            .find(|s| path.strip_prefix("/v1/") == Some(s.name()))
    }

    /// The signal of an OTLP/gRPC method path.
    pub fn from_grpc_path(path: &str) -> Option<Signal> {
        match path {
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export" => Some(Signal::Traces),
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export" => {
                Some(Signal::Metrics)
            }
            "/opentelemetry.proto.collector.logs.v1.LogsService/Export" => Some(Signal::Logs),
            _ => None,
        }
    }

    /// What one item is called in a partial success (`spans`,
    /// `data points`, `log records`).
    pub fn items(self) -> &'static str {
        match self {
            Signal::Traces => "spans",
            Signal::Metrics => "data points",
            Signal::Logs => "log records",
        }
    }
}

/// How an export's records are keyed (and so partitioned).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Partitioning {
    /// One record per export, without a key.
    #[default]
    None,
    /// By trace id (traces and logs).
    TraceId,
    /// By resource attributes (any signal).
    ResourceAttributes,
}

/// The value encoding of the records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encoding {
    /// `otlp_proto`: the request's protobuf encoding.
    #[default]
    Proto,
    /// `otlp_json`: OTLP/JSON.
    Json,
}

impl Encoding {
    /// The Collector's name of the encoding.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Proto => "otlp_proto",
            Encoding::Json => "otlp_json",
        }
    }
}

/// How one signal's exports become records.
#[derive(Clone, Debug, Default)]
pub struct Cut {
    /// Keying.
    pub partitioning: Partitioning,
    /// Value encoding.
    pub encoding: Encoding,
    /// A resource attribute whose (non-empty string) value names the
    /// topic of the resource's records.
    pub topic_from_attribute: Option<String>,
}

/// One record of an export.
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpRecord {
    /// The topic a resource attribute named (`None`: the signal's
    /// configured topic).
    pub topic: Option<String>,
    /// The key.
    pub key: Option<Vec<u8>>,
    /// One whole `Export*ServiceRequest`.
    pub value: Bytes,
    /// Spans, data points or log records in it.
    pub items: u64,
}

/// Cuts a (checked) protobuf `Export*ServiceRequest` into records. An
/// export without resources gives none.
/// Without partitioning or routing, the one record's protobuf value is
/// `request` itself (not copied).
pub fn cut(signal: Signal, request: &Bytes, how: &Cut) -> Result<Vec<OtlpRecord>, Error> {
    let resources = children(request, 1)?;
    if resources.is_empty() {
        return Ok(Vec::new());
    }
    let encode = |value: Vec<u8>| -> Result<Bytes, Error> {
        match how.encoding {
            Encoding::Proto => Ok(Bytes::from(value)),
            Encoding::Json => Ok(Bytes::from(to_json(signal.request(), &value)?)),
        }
    };
    if how.partitioning == Partitioning::None && how.topic_from_attribute.is_none() {
        let items = count_request_items(signal, request)?;
        let value = match how.encoding {
            Encoding::Proto => request.clone(),
            Encoding::Json => Bytes::from(to_json(signal.request(), request)?),
        };
        return Ok(vec![OtlpRecord {
            topic: None,
            key: None,
            value,
            items,
        }]);
    }
    let mut out = Vec::new();
    for r in resources {
        let attributes = resource_attributes(r)?;
        let topic = match &how.topic_from_attribute {
            Some(name) => attribute_str(&attributes, name)?,
            None => None,
        };
        match how.partitioning {
            Partitioning::TraceId if signal != Signal::Metrics => {
                for (trace_id, resource) in split_by_trace(signal, r)? {
                    let key = match (signal, trace_id.is_empty()) {
                        (Signal::Logs, true) => None,
                        _ => Some(hex(&trace_id).into_bytes()),
                    };
                    let items = count_items(signal, &resource)?;
                    out.push(OtlpRecord {
                        topic: topic.clone(),
                        key,
                        value: encode(wrap(&resource))?,
                        items,
                    });
                }
            }
            p => out.push(OtlpRecord {
                topic,
                key: (p == Partitioning::ResourceAttributes)
                    .then(|| map_hash(&attributes).map(|h| h.to_vec()))
                    .transpose()?,
                // A request of this one resource alone is the request
                // itself: not copied.
                value: if how.encoding == Encoding::Proto && is_only_field(request, r) {
                    request.clone()
                } else {
                    encode(wrap(r))?
                },
                items: count_items(signal, r)?,
            }),
        }
    }
    Ok(out)
}

/// Whether `request` is exactly one field 1 whose body is `r`.
fn is_only_field(request: &[u8], r: &[u8]) -> bool {
    let mut reader = Reader::new(request);
    match (reader.next_field(), reader.next_field()) {
        (Ok(Some(f)), Ok(None)) => f.number == 1 && f.value == Value::Len(r),
        _ => false,
    }
}

/// A request holding one resource.
fn wrap(resource: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(resource.len() + 6);
    put_len(&mut out, 1, resource);
    out
}

/// The bodies of every occurrence of length-delimited field `number`.
fn children(msg: &[u8], number: u32) -> Result<Vec<&[u8]>, Error> {
    let mut out = Vec::new();
    let mut r = Reader::new(msg);
    while let Some(f) = r.next_field()? {
        if f.number == number {
            if let Value::Len(b) = f.value {
                out.push(b);
            }
        }
    }
    Ok(out)
}

/// Spans, data points or log records of a whole request.
pub fn count_request_items(signal: Signal, request: &[u8]) -> Result<u64, Error> {
    let mut n = 0;
    for r in children(request, 1)? {
        n += count_items(signal, r)?;
    }
    Ok(n)
}

/// Spans, data points or log records of one `Resource*`.
pub fn count_items(signal: Signal, resource: &[u8]) -> Result<u64, Error> {
    let mut n = 0;
    for scope in children(resource, 2)? {
        for item in children(scope, 2)? {
            n += match signal {
                Signal::Traces | Signal::Logs => 1,
                // Gauge, Sum, Histogram, ExponentialHistogram, Summary:
                // each holds its points in field 1.
                Signal::Metrics => {
                    let mut points = 0;
                    for data in [5, 7, 9, 10, 11] {
                        for d in children(item, data)? {
                            points += children(d, 1)?.len() as u64;
                        }
                    }
                    points
                }
            };
        }
    }
    Ok(n)
}

/// A trace id and the `Resource*` holding its items of one scope.
type TracePart = (Vec<u8>, Vec<u8>);

/// Splits one `ResourceSpans`/`ResourceLogs` into one per scope and trace
/// id (in order of first appearance), each with the resource's and the
/// scope's other fields as they came.
fn split_by_trace(signal: Signal, resource: &[u8]) -> Result<Vec<TracePart>, Error> {
    let trace_field = match signal {
        Signal::Traces => 1, // Span.trace_id
        _ => 9,              // LogRecord.trace_id
    };
    let mut resource_rest = Vec::new();
    let mut scopes = Vec::new();
    let mut r = Reader::new(resource);
    while let Some(f) = r.next_field()? {
        match (f.number, f.value) {
            (2, Value::Len(b)) => scopes.push(b),
            _ => resource_rest.extend_from_slice(f.raw),
        }
    }
    let mut out = Vec::new();
    for scope in scopes {
        let mut scope_rest = Vec::new();
        // (trace id, items) in order of first appearance, and each trace
        // id's place (a map: an export may hold hundreds of thousands).
        let mut groups: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut group_of: HashMap<&[u8], usize> = HashMap::new();
        let mut r = Reader::new(scope);
        while let Some(f) = r.next_field()? {
            match (f.number, f.value) {
                (2, Value::Len(item)) => {
                    let mut id: &[u8] = &[];
                    let mut ir = Reader::new(item);
                    while let Some(g) = ir.next_field()? {
                        if let (n, Value::Len(b)) = (g.number, g.value) {
                            if n == trace_field {
                                id = b;
                            }
                        }
                    }
                    match group_of.get(id) {
                        Some(&g) => groups[g].1.extend_from_slice(f.raw),
                        None => {
                            group_of.insert(id, groups.len());
                            groups.push((id.to_vec(), f.raw.to_vec()));
                        }
                    }
                }
                _ => scope_rest.extend_from_slice(f.raw),
            }
        }
        for (id, items) in groups {
            let mut scope_msg = scope_rest.clone();
            scope_msg.extend_from_slice(&items);
            let mut res = resource_rest.clone();
            put_len(&mut res, 2, &scope_msg);
            out.push((id, res));
        }
    }
    Ok(out)
}

/// One attribute value, as much as hashing and routing need.
#[derive(Clone, Debug, PartialEq)]
enum Any<'a> {
    Empty,
    Str(&'a [u8]),
    Bool(bool),
    Int(u64),
    Double(u64),
    Array(Vec<Any<'a>>),
    Map(Vec<(&'a [u8], Any<'a>)>),
    Bytes(&'a [u8]),
}

fn resource_attributes(resource_x: &[u8]) -> Result<Vec<(&[u8], Any<'_>)>, Error> {
    let mut out = Vec::new();
    for resource in children(resource_x, 1)? {
        out = key_values(resource, 1, 0)?;
    }
    Ok(out)
}

fn key_values(msg: &[u8], field: u32, depth: usize) -> Result<Vec<(&[u8], Any<'_>)>, Error> {
    let mut out = Vec::new();
    for kv in children(msg, field)? {
        let mut key: &[u8] = &[];
        let mut value = Any::Empty;
        let mut r = Reader::new(kv);
        while let Some(f) = r.next_field()? {
            match (f.number, f.value) {
                (1, Value::Len(b)) => key = b,
                (2, Value::Len(b)) => value = any(b, depth + 1)?,
                _ => {}
            }
        }
        out.push((key, value));
    }
    Ok(out)
}

fn any(b: &[u8], depth: usize) -> Result<Any<'_>, Error> {
    if depth > crate::codec::DEPTH_MAX {
        return Err(Error::malformed("attribute values nested too deep"));
    }
    let mut v = Any::Empty;
    let mut r = Reader::new(b);
    while let Some(f) = r.next_field()? {
        v = match (f.number, f.value) {
            (1, Value::Len(s)) => Any::Str(s),
            (2, Value::Varint(x)) => Any::Bool(x != 0),
            (3, Value::Varint(x)) => Any::Int(x),
            (4, Value::Fixed64(x)) => Any::Double(x),
            (5, Value::Len(a)) => Any::Array(
                children(a, 1)?
                    .into_iter()
                    .map(|x| any(x, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            (6, Value::Len(m)) => Any::Map(key_values(m, 1, depth + 1)?),
            (7, Value::Len(x)) => Any::Bytes(x),
            _ => continue,
        };
    }
    Ok(v)
}

fn attribute_str(attributes: &[(&[u8], Any<'_>)], name: &str) -> Result<Option<String>, Error> {
    for (k, v) in attributes {
        if *k == name.as_bytes() {
            return Ok(match v {
                Any::Str(s) if !s.is_empty() => Some(
                    std::str::from_utf8(s)
                        .map_err(|_| Error::malformed("an attribute value is not UTF-8"))?
                        .to_string(),
                ),
                _ => None,
            });
        }
    }
    Ok(None)
}

/// The Collector's `pdatautil.MapHash` of a map: its entries sorted by
/// key, each written as `0xf4 key value` (values tagged by type), hashed
/// with xxHash64 twice — the buffer, then the buffer and `0xf3` — big
/// endian; an empty map hashes to zeros.
fn map_hash(attributes: &[(&[u8], Any<'_>)]) -> Result<[u8; 16], Error> {
    if attributes.is_empty() {
        return Ok([0; 16]);
    }
    let mut buf = Vec::new();
    write_map(&mut buf, attributes);
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&twox_hash::XxHash64::oneshot(0, &buf).to_be_bytes());
    buf.push(0xf3);
    out[8..].copy_from_slice(&twox_hash::XxHash64::oneshot(0, &buf).to_be_bytes());
    Ok(out)
}

fn write_map(buf: &mut Vec<u8>, m: &[(&[u8], Any<'_>)]) {
    // Entries by key (a stable sort: equal keys keep their order).
    let mut sorted: Vec<&(&[u8], Any<'_>)> = m.iter().collect();
    sorted.sort_by_key(|(k, _)| *k);
    let mut first = 0;
    for (i, (k, _)) in sorted.iter().enumerate() {
        // A map with a key twice answers its first value for it.
        if i == 0 || sorted[i - 1].0 != *k {
            first = i;
        }
        buf.push(0xf4);
        buf.extend_from_slice(k);
        write_any(buf, &sorted[first].1);
    }
}

fn write_any(buf: &mut Vec<u8>, v: &Any<'_>) {
    match v {
        Any::Str(s) => {
            buf.push(0xf7);
            buf.extend_from_slice(s);
        }
        Any::Bool(true) => buf.push(0xf8),
        Any::Bool(false) => buf.push(0xf9),
        Any::Int(x) => {
            buf.push(0xfa);
            buf.extend_from_slice(&x.to_le_bytes());
        }
        Any::Double(x) => {
            buf.push(0xfb);
            buf.extend_from_slice(&x.to_le_bytes());
        }
        Any::Map(m) => {
            buf.push(0xfc);
            write_map(buf, m);
            buf.push(0xfd);
        }
        Any::Array(a) => {
            buf.push(0xfe);
            for x in a {
                write_any(buf, x);
            }
            buf.push(0xff);
        }
        Any::Bytes(b) => {
            buf.push(0xf6);
            buf.extend_from_slice(b);
        }
        Any::Empty => buf.push(0xf5),
    }
}
