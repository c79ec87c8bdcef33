//! The OTLP messages (opentelemetry-proto v1: common, resource, trace,
//! metrics, logs and the collector services' requests and responses) as
//! one table: field numbers, proto names and kinds. The protobuf checks,
//! the JSON decoder and the JSON encoder all walk it, so the three agree
//! on every field by construction.

/// What a field holds.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// A nested message.
    Message(&'static Msg),
    /// UTF-8 text.
    String,
    /// Bytes (base64 in JSON).
    Bytes,
    /// A trace (16 bytes) or span (8 bytes) id: hex in OTLP/JSON; empty
    /// means unset.
    Id(usize),
    /// `bool`.
    Bool,
    /// `int64` (varint; a string in JSON).
    Int64,
    /// `uint64` (varint; a string in JSON).
    Uint64,
    /// `uint32` (varint).
    Uint32,
    /// `sint32` (zigzag varint).
    Sint32,
    /// `fixed64` (a string in JSON).
    Fixed64,
    /// `sfixed64` (a string in JSON).
    Sfixed64,
    /// `fixed32`.
    Fixed32,
    /// `double`.
    Double,
    /// An enum: its names and values (JSON takes either; OTLP/JSON writes
    /// the number).
    Enum(&'static [(&'static str, i32)]),
}

/// One field of a message.
#[derive(Debug)]
pub struct FieldDef {
    /// Field number.
    pub number: u32,
    /// The proto (snake_case) name; JSON uses its lowerCamelCase form and
    /// accepts either.
    pub name: &'static str,
    /// What it holds.
    pub kind: Kind,
    /// `repeated`.
    pub repeated: bool,
}

/// One message type.
#[derive(Debug)]
pub struct Msg {
    /// Its full proto name (for error messages).
    pub name: &'static str,
    /// Its fields.
    pub fields: &'static [FieldDef],
}

impl Msg {
    /// The field with this number.
    pub fn by_number(&self, n: u32) -> Option<&'static FieldDef> {
        self.fields.iter().find(|f| f.number == n)
    }

    /// The field with this JSON name (lowerCamelCase or the proto name).
    pub fn by_json_name(&self, name: &str) -> Option<&'static FieldDef> {
        self.fields
            .iter()
            .find(|f| f.name == name || camel_eq(f.name, name))
    }
}

/// Whether `camel` is the lowerCamelCase form of `snake`.
fn camel_eq(snake: &str, camel: &str) -> bool {
    let mut c = camel.bytes();
    let mut up = false;
    for b in snake.bytes() {
        if b == b'_' {
            up = true;
            continue;
        }
        let want = if up { b.to_ascii_uppercase() } else { b };
        up = false;
        if c.next() != Some(want) {
            return false;
        }
    }
    c.next().is_none()
}

/// Appends the lowerCamelCase form of a proto name.
pub fn push_camel(out: &mut std::string::String, snake: &str) {
    let mut up = false;
    for ch in snake.chars() {
        if ch == '_' {
            up = true;
        } else if up {
            out.push(ch.to_ascii_uppercase());
            up = false;
        } else {
            out.push(ch);
        }
    }
}

const fn f(number: u32, name: &'static str, kind: Kind) -> FieldDef {
    FieldDef {
        number,
        name,
        kind,
        repeated: false,
    }
}

const fn r(number: u32, name: &'static str, kind: Kind) -> FieldDef {
    FieldDef {
        number,
        name,
        kind,
        repeated: true,
    }
}

use Kind::*;

const TRACE_ID: Kind = Id(16);
const SPAN_ID: Kind = Id(8);

// ---- common.proto, resource.proto

/// `opentelemetry.proto.common.v1.AnyValue`.
pub static ANY_VALUE: Msg = Msg {
    name: "AnyValue",
    fields: &[
        f(1, "string_value", String),
        f(2, "bool_value", Bool),
        f(3, "int_value", Int64),
        f(4, "double_value", Double),
        f(5, "array_value", Message(&ARRAY_VALUE)),
        f(6, "kvlist_value", Message(&KEY_VALUE_LIST)),
        f(7, "bytes_value", Bytes),
    ],
};
/// `ArrayValue`.
pub static ARRAY_VALUE: Msg = Msg {
    name: "ArrayValue",
    fields: &[r(1, "values", Message(&ANY_VALUE))],
};
/// `KeyValueList`.
pub static KEY_VALUE_LIST: Msg = Msg {
    name: "KeyValueList",
    fields: &[r(1, "values", Message(&KEY_VALUE))],
};
/// `KeyValue`.
pub static KEY_VALUE: Msg = Msg {
    name: "KeyValue",
    fields: &[f(1, "key", String), f(2, "value", Message(&ANY_VALUE))],
};
/// `InstrumentationScope`.
pub static SCOPE: Msg = Msg {
    name: "InstrumentationScope",
    fields: &[
        f(1, "name", String),
        f(2, "version", String),
        r(3, "attributes", Message(&KEY_VALUE)),
        f(4, "dropped_attributes_count", Uint32),
    ],
};
/// `EntityRef`.
pub static ENTITY_REF: Msg = Msg {
    name: "EntityRef",
    fields: &[
        f(1, "schema_url", String),
        f(2, "type", String),
        r(3, "id_keys", String),
        r(4, "description_keys", String),
    ],
};
/// `opentelemetry.proto.resource.v1.Resource`.
pub static RESOURCE: Msg = Msg {
    name: "Resource",
    fields: &[
        r(1, "attributes", Message(&KEY_VALUE)),
        f(2, "dropped_attributes_count", Uint32),
        r(3, "entity_refs", Message(&ENTITY_REF)),
    ],
};

// ---- trace.proto

const SPAN_KIND: &[(&str, i32)] = &[
    ("SPAN_KIND_UNSPECIFIED", 0),
    ("SPAN_KIND_INTERNAL", 1),
    ("SPAN_KIND_SERVER", 2),
    ("SPAN_KIND_CLIENT", 3),
    ("SPAN_KIND_PRODUCER", 4),
    ("SPAN_KIND_CONSUMER", 5),
];
const STATUS_CODE: &[(&str, i32)] = &[
    ("STATUS_CODE_UNSET", 0),
    ("STATUS_CODE_OK", 1),
    ("STATUS_CODE_ERROR", 2),
];

/// `ExportTraceServiceRequest` (and `TracesData`).
pub static TRACES_REQUEST: Msg = Msg {
    name: "ExportTraceServiceRequest",
    fields: &[r(1, "resource_spans", Message(&RESOURCE_SPANS))],
};
/// `ResourceSpans`.
pub static RESOURCE_SPANS: Msg = Msg {
    name: "ResourceSpans",
    fields: &[
        f(1, "resource", Message(&RESOURCE)),
        r(2, "scope_spans", Message(&SCOPE_SPANS)),
        f(3, "schema_url", String),
    ],
};
/// `ScopeSpans`.
pub static SCOPE_SPANS: Msg = Msg {
    name: "ScopeSpans",
    fields: &[
        f(1, "scope", Message(&SCOPE)),
        r(2, "spans", Message(&SPAN)),
        f(3, "schema_url", String),
    ],
};
/// `Span`.
pub static SPAN: Msg = Msg {
    name: "Span",
    fields: &[
        f(1, "trace_id", TRACE_ID),
        f(2, "span_id", SPAN_ID),
        f(3, "trace_state", String),
        f(4, "parent_span_id", SPAN_ID),
        f(16, "flags", Fixed32),
        f(5, "name", String),
        f(6, "kind", Enum(SPAN_KIND)),
        f(7, "start_time_unix_nano", Fixed64),
        f(8, "end_time_unix_nano", Fixed64),
        r(9, "attributes", Message(&KEY_VALUE)),
        f(10, "dropped_attributes_count", Uint32),
        r(11, "events", Message(&SPAN_EVENT)),
        f(12, "dropped_events_count", Uint32),
        r(13, "links", Message(&SPAN_LINK)),
        f(14, "dropped_links_count", Uint32),
        f(15, "status", Message(&STATUS)),
    ],
};
/// `Span.Event`.
pub static SPAN_EVENT: Msg = Msg {
    name: "Span.Event",
    fields: &[
        f(1, "time_unix_nano", Fixed64),
        f(2, "name", String),
        r(3, "attributes", Message(&KEY_VALUE)),
        f(4, "dropped_attributes_count", Uint32),
    ],
};
/// `Span.Link`.
pub static SPAN_LINK: Msg = Msg {
    name: "Span.Link",
    fields: &[
        f(1, "trace_id", TRACE_ID),
        f(2, "span_id", SPAN_ID),
        f(3, "trace_state", String),
        r(4, "attributes", Message(&KEY_VALUE)),
        f(5, "dropped_attributes_count", Uint32),
        f(6, "flags", Fixed32),
    ],
};
/// `Status`.
pub static STATUS: Msg = Msg {
    name: "Status",
    fields: &[f(2, "message", String), f(3, "code", Enum(STATUS_CODE))],
};

// ---- logs.proto

const SEVERITY: &[(&str, i32)] = &[
    ("SEVERITY_NUMBER_UNSPECIFIED", 0),
    ("SEVERITY_NUMBER_TRACE", 1),
    ("SEVERITY_NUMBER_TRACE2", 2),
    ("SEVERITY_NUMBER_TRACE3", 3),
    ("SEVERITY_NUMBER_TRACE4", 4),
    ("SEVERITY_NUMBER_DEBUG", 5),
    ("SEVERITY_NUMBER_DEBUG2", 6),
    ("SEVERITY_NUMBER_DEBUG3", 7),
    ("SEVERITY_NUMBER_DEBUG4", 8),
    ("SEVERITY_NUMBER_INFO", 9),
    ("SEVERITY_NUMBER_INFO2", 10),
    ("SEVERITY_NUMBER_INFO3", 11),
    ("SEVERITY_NUMBER_INFO4", 12),
    ("SEVERITY_NUMBER_WARN", 13),
    ("SEVERITY_NUMBER_WARN2", 14),
    ("SEVERITY_NUMBER_WARN3", 15),
    ("SEVERITY_NUMBER_WARN4", 16),
    ("SEVERITY_NUMBER_ERROR", 17),
    ("SEVERITY_NUMBER_ERROR2", 18),
    ("SEVERITY_NUMBER_ERROR3", 19),
    ("SEVERITY_NUMBER_ERROR4", 20),
    ("SEVERITY_NUMBER_FATAL", 21),
    ("SEVERITY_NUMBER_FATAL2", 22),
    ("SEVERITY_NUMBER_FATAL3", 23),
    ("SEVERITY_NUMBER_FATAL4", 24),
];

/// `ExportLogsServiceRequest` (and `LogsData`).
pub static LOGS_REQUEST: Msg = Msg {
    name: "ExportLogsServiceRequest",
    fields: &[r(1, "resource_logs", Message(&RESOURCE_LOGS))],
};
/// `ResourceLogs`.
pub static RESOURCE_LOGS: Msg = Msg {
    name: "ResourceLogs",
    fields: &[
        f(1, "resource", Message(&RESOURCE)),
        r(2, "scope_logs", Message(&SCOPE_LOGS)),
        f(3, "schema_url", String),
    ],
};
/// `ScopeLogs`.
pub static SCOPE_LOGS: Msg = Msg {
    name: "ScopeLogs",
    fields: &[
        f(1, "scope", Message(&SCOPE)),
        r(2, "log_records", Message(&LOG_RECORD)),
        f(3, "schema_url", String),
    ],
};
/// `LogRecord`.
pub static LOG_RECORD: Msg = Msg {
    name: "LogRecord",
    fields: &[
        f(1, "time_unix_nano", Fixed64),
        f(11, "observed_time_unix_nano", Fixed64),
        f(2, "severity_number", Enum(SEVERITY)),
        f(3, "severity_text", String),
        f(5, "body", Message(&ANY_VALUE)),
        r(6, "attributes", Message(&KEY_VALUE)),
        f(7, "dropped_attributes_count", Uint32),
        f(8, "flags", Fixed32),
        f(9, "trace_id", TRACE_ID),
        f(10, "span_id", SPAN_ID),
        f(12, "event_name", String),
    ],
};

// ---- metrics.proto

const TEMPORALITY: &[(&str, i32)] = &[
    ("AGGREGATION_TEMPORALITY_UNSPECIFIED", 0),
    ("AGGREGATION_TEMPORALITY_DELTA", 1),
    ("AGGREGATION_TEMPORALITY_CUMULATIVE", 2),
];

/// `ExportMetricsServiceRequest` (and `MetricsData`).
pub static METRICS_REQUEST: Msg = Msg {
    name: "ExportMetricsServiceRequest",
    fields: &[r(1, "resource_metrics", Message(&RESOURCE_METRICS))],
};
/// `ResourceMetrics`.
pub static RESOURCE_METRICS: Msg = Msg {
    name: "ResourceMetrics",
    fields: &[
        f(1, "resource", Message(&RESOURCE)),
        r(2, "scope_metrics", Message(&SCOPE_METRICS)),
        f(3, "schema_url", String),
    ],
};
/// `ScopeMetrics`.
pub static SCOPE_METRICS: Msg = Msg {
    name: "ScopeMetrics",
    fields: &[
        f(1, "scope", Message(&SCOPE)),
        r(2, "metrics", Message(&METRIC)),
        f(3, "schema_url", String),
    ],
};
/// `Metric`.
pub static METRIC: Msg = Msg {
    name: "Metric",
    fields: &[
        f(1, "name", String),
        f(2, "description", String),
        f(3, "unit", String),
        f(5, "gauge", Message(&GAUGE)),
        f(7, "sum", Message(&SUM)),
        f(9, "histogram", Message(&HISTOGRAM)),
        f(10, "exponential_histogram", Message(&EXP_HISTOGRAM)),
        f(11, "summary", Message(&SUMMARY)),
        r(12, "metadata", Message(&KEY_VALUE)),
    ],
};
/// `Gauge`.
pub static GAUGE: Msg = Msg {
    name: "Gauge",
    fields: &[r(1, "data_points", Message(&NUMBER_POINT))],
};
/// `Sum`.
pub static SUM: Msg = Msg {
    name: "Sum",
    fields: &[
        r(1, "data_points", Message(&NUMBER_POINT)),
        f(2, "aggregation_temporality", Enum(TEMPORALITY)),
        f(3, "is_monotonic", Bool),
    ],
};
/// `Histogram`.
pub static HISTOGRAM: Msg = Msg {
    name: "Histogram",
    fields: &[
        r(1, "data_points", Message(&HISTOGRAM_POINT)),
        f(2, "aggregation_temporality", Enum(TEMPORALITY)),
    ],
};
/// `ExponentialHistogram`.
pub static EXP_HISTOGRAM: Msg = Msg {
    name: "ExponentialHistogram",
    fields: &[
        r(1, "data_points", Message(&EXP_HISTOGRAM_POINT)),
        f(2, "aggregation_temporality", Enum(TEMPORALITY)),
    ],
};
/// `Summary`.
pub static SUMMARY: Msg = Msg {
    name: "Summary",
    fields: &[r(1, "data_points", Message(&SUMMARY_POINT))],
};
/// `NumberDataPoint`.
pub static NUMBER_POINT: Msg = Msg {
    name: "NumberDataPoint",
    fields: &[
        r(7, "attributes", Message(&KEY_VALUE)),
        f(2, "start_time_unix_nano", Fixed64),
        f(3, "time_unix_nano", Fixed64),
        f(4, "as_double", Double),
        f(6, "as_int", Sfixed64),
        r(5, "exemplars", Message(&EXEMPLAR)),
        f(8, "flags", Uint32),
    ],
};
/// `HistogramDataPoint`.
pub static HISTOGRAM_POINT: Msg = Msg {
    name: "HistogramDataPoint",
    fields: &[
        r(9, "attributes", Message(&KEY_VALUE)),
        f(2, "start_time_unix_nano", Fixed64),
        f(3, "time_unix_nano", Fixed64),
        f(4, "count", Fixed64),
        f(5, "sum", Double),
        r(6, "bucket_counts", Fixed64),
        r(7, "explicit_bounds", Double),
        r(8, "exemplars", Message(&EXEMPLAR)),
        f(10, "flags", Uint32),
        f(11, "min", Double),
        f(12, "max", Double),
    ],
};
/// `ExponentialHistogramDataPoint`.
pub static EXP_HISTOGRAM_POINT: Msg = Msg {
    name: "ExponentialHistogramDataPoint",
    fields: &[
        r(1, "attributes", Message(&KEY_VALUE)),
        f(2, "start_time_unix_nano", Fixed64),
        f(3, "time_unix_nano", Fixed64),
        f(4, "count", Fixed64),
        f(5, "sum", Double),
        f(6, "scale", Sint32),
        f(7, "zero_count", Fixed64),
        f(8, "positive", Message(&BUCKETS)),
        f(9, "negative", Message(&BUCKETS)),
        f(10, "flags", Uint32),
        r(11, "exemplars", Message(&EXEMPLAR)),
        f(12, "min", Double),
        f(13, "max", Double),
        f(14, "zero_threshold", Double),
    ],
};
/// `ExponentialHistogramDataPoint.Buckets`.
pub static BUCKETS: Msg = Msg {
    name: "Buckets",
    fields: &[f(1, "offset", Sint32), r(2, "bucket_counts", Uint64)],
};
/// `SummaryDataPoint`.
pub static SUMMARY_POINT: Msg = Msg {
    name: "SummaryDataPoint",
    fields: &[
        r(7, "attributes", Message(&KEY_VALUE)),
        f(2, "start_time_unix_nano", Fixed64),
        f(3, "time_unix_nano", Fixed64),
        f(4, "count", Fixed64),
        f(5, "sum", Double),
        r(6, "quantile_values", Message(&QUANTILE)),
        f(8, "flags", Uint32),
    ],
};
/// `SummaryDataPoint.ValueAtQuantile`.
pub static QUANTILE: Msg = Msg {
    name: "ValueAtQuantile",
    fields: &[f(1, "quantile", Double), f(2, "value", Double)],
};
/// `Exemplar`.
pub static EXEMPLAR: Msg = Msg {
    name: "Exemplar",
    fields: &[
        r(7, "filtered_attributes", Message(&KEY_VALUE)),
        f(2, "time_unix_nano", Fixed64),
        f(3, "as_double", Double),
        f(6, "as_int", Sfixed64),
        f(4, "span_id", SPAN_ID),
        f(5, "trace_id", TRACE_ID),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_names_are_camel_or_proto() {
        assert!(camel_eq("time_unix_nano", "timeUnixNano"));
        assert!(!camel_eq("time_unix_nano", "timeUnixNan"));
        assert!(!camel_eq("time_unix_nano", "timeunixnano"));
        assert!(SPAN.by_json_name("traceId").is_some());
        assert!(SPAN.by_json_name("trace_id").is_some());
        assert!(SPAN.by_json_name("traceid").is_none());
        let mut s = std::string::String::new();
        push_camel(&mut s, "observed_time_unix_nano");
        assert_eq!(s, "observedTimeUnixNano");
    }

    #[test]
    fn every_message_has_distinct_field_numbers_and_names() {
        let all: &[&Msg] = &[
            &ANY_VALUE,
            &ARRAY_VALUE,
            &KEY_VALUE_LIST,
            &KEY_VALUE,
            &SCOPE,
            &ENTITY_REF,
            &RESOURCE,
            &TRACES_REQUEST,
            &RESOURCE_SPANS,
            &SCOPE_SPANS,
            &SPAN,
            &SPAN_EVENT,
            &SPAN_LINK,
            &STATUS,
            &LOGS_REQUEST,
            &RESOURCE_LOGS,
            &SCOPE_LOGS,
            &LOG_RECORD,
            &METRICS_REQUEST,
            &RESOURCE_METRICS,
            &SCOPE_METRICS,
            &METRIC,
            &GAUGE,
            &SUM,
            &HISTOGRAM,
            &EXP_HISTOGRAM,
            &SUMMARY,
            &NUMBER_POINT,
            &HISTOGRAM_POINT,
            &EXP_HISTOGRAM_POINT,
            &BUCKETS,
            &SUMMARY_POINT,
            &QUANTILE,
            &EXEMPLAR,
        ];
        for m in all {
            for (i, a) in m.fields.iter().enumerate() {
                for b in &m.fields[i + 1..] {
                    assert_ne!(a.number, b.number, "{}", m.name);
                    assert_ne!(a.name, b.name, "{}", m.name);
                }
            }
        }
    }
}
