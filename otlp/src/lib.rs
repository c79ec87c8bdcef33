//! Sans-IO OpenTelemetry (OTLP) ingestion for Weir: everything between
//! an OTLP export's bytes and the records it becomes, with no sockets and
//! no runtime, so that the broker's receivers stay thin and every rule is
//! tested (and fuzzed) here.
//!
//! * [`schema`]: the OTLP messages as one table;
//! * [`codec`]: protobuf checks, OTLP/JSON in and out, by the table;
//! * [`records`]: an export cut into records as the OpenTelemetry
//!   Collector's Kafka exporter writes them;
//! * [`grpc`]: unary gRPC framing and status details;
//! * [`decompress`], [`decode_export`] and the response encoders.

pub mod codec;
pub mod grpc;
pub mod records;
pub mod schema;
pub mod wire;

use std::io::Read;

use bytes::Bytes;

pub use records::{cut, Cut, Encoding, OtlpRecord, Partitioning, Signal};

use wire::{put_len, put_nested, put_varint_field};

/// Why an export is refused. Each kind maps to one OTLP answer: the
/// receivers choose the HTTP status and gRPC code from it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The protobuf does not decode as the request (400 /
    /// INVALID_ARGUMENT).
    #[error("malformed OTLP protobuf: {0}")]
    Malformed(String),
    /// The JSON does not decode as the request (400 / INVALID_ARGUMENT).
    #[error("malformed OTLP/JSON: {0}")]
    Json(String),
    /// Over a size limit (413 / RESOURCE_EXHAUSTED without RetryInfo:
    /// not retried).
    #[error("{0}")]
    TooLarge(String),
    /// A content type or encoding not served (415 / UNIMPLEMENTED).
    #[error("{0}")]
    Unsupported(String),
}

impl Error {
    /// A protobuf error.
    pub fn malformed(m: impl Into<String>) -> Self {
        Error::Malformed(m.into())
    }

    /// A JSON error.
    pub fn json(m: impl Into<String>) -> Self {
        Error::Json(m.into())
    }
}

/// The body's content: OTLP's two encodings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content {
    /// `application/x-protobuf` (and gRPC's messages).
    Protobuf,
    /// `application/json`.
    Json,
}

impl Content {
    /// The content of an OTLP/HTTP `Content-Type` (parameters ignored).
    pub fn from_content_type(ct: &str) -> Result<Content, Error> {
        let base = ct.split(';').next().unwrap_or("").trim();
        if base.eq_ignore_ascii_case("application/x-protobuf")
            || base.eq_ignore_ascii_case("application/protobuf")
        {
            Ok(Content::Protobuf)
        } else if base.eq_ignore_ascii_case("application/json") {
            Ok(Content::Json)
        } else {
            Err(Error::Unsupported(format!(
                "Content-Type {ct:?}: OTLP/HTTP takes application/x-protobuf or application/json"
            )))
        }
    }

    /// The `Content-Type` of an answer in this content.
    pub fn content_type(self) -> &'static str {
        match self {
            Content::Protobuf => "application/x-protobuf",
            Content::Json => "application/json",
        }
    }
}

/// Decompresses a body sent with `encoding` (`gzip`, `zstd`, or none:
/// `identity` or empty), refusing to produce more than `limit` bytes (a
/// decompression bomb stops at the limit, it is never inflated whole).
pub fn decompress(encoding: &str, body: Bytes, limit: usize) -> Result<Bytes, Error> {
    let too_large = || {
        Error::TooLarge(format!(
            "the request is larger than {limit} bytes once decompressed"
        ))
    };
    let read_limited = |mut r: Box<dyn Read + '_>| -> Result<Bytes, Error> {
        let mut out = Vec::new();
        (&mut r)
            .take(limit as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| Error::malformed(format!("the {encoding} body does not decode: {e}")))?;
        if out.len() > limit {
            return Err(too_large());
        }
        Ok(Bytes::from(out))
    };
    match encoding.trim().to_ascii_lowercase().as_str() {
        "" | "identity" => {
            if body.len() > limit {
                return Err(too_large());
            }
            Ok(body)
        }
        "gzip" | "x-gzip" => read_limited(Box::new(flate2::read::MultiGzDecoder::new(&body[..]))),
        "zstd" => {
            let d = zstd::stream::read::Decoder::new(&body[..])
                .map_err(|e| Error::malformed(format!("the zstd body does not decode: {e}")))?;
            read_limited(Box::new(d))
        }
        other => Err(Error::Unsupported(format!(
            "encoding {other:?}: gzip, zstd and identity are served"
        ))),
    }
}

/// A request body (decompressed) as checked protobuf: protobuf is
/// checked against the schema and kept as it came (not copied), JSON is
/// transcoded.
pub fn decode_export(signal: Signal, content: Content, body: Bytes) -> Result<Bytes, Error> {
    match content {
        Content::Protobuf => {
            codec::check(signal.request(), &body)?;
            Ok(body)
        }
        Content::Json => codec::from_json(signal.request(), &body).map(Bytes::from),
    }
}

/// An `Export*ServiceResponse`: empty on full success, with a
/// `partial_success` naming what was rejected and why otherwise.
pub fn export_response(signal: Signal, content: Content, rejected: u64, message: &str) -> Vec<u8> {
    let partial = rejected > 0 || !message.is_empty();
    match content {
        Content::Protobuf => {
            let mut out = Vec::new();
            if partial {
                put_nested(&mut out, 1, |p| {
                    if rejected > 0 {
                        put_varint_field(p, 1, rejected);
                    }
                    if !message.is_empty() {
                        put_len(p, 2, message.as_bytes());
                    }
                });
            }
            out
        }
        Content::Json => {
            if !partial {
                return b"{}".to_vec();
            }
            let field = match signal {
                Signal::Traces => "rejectedSpans",
                Signal::Metrics => "rejectedDataPoints",
                Signal::Logs => "rejectedLogRecords",
            };
            serde_json::json!({ "partialSuccess": { field: rejected.to_string(), "errorMessage": message } })
                .to_string()
                .into_bytes()
        }
    }
}

/// A `google.rpc.Status` body for an OTLP/HTTP failure (`code` is the
/// matching gRPC code).
pub fn status_body(content: Content, code: i32, message: &str) -> Vec<u8> {
    match content {
        Content::Protobuf => {
            let mut out = Vec::new();
            put_varint_field(&mut out, 1, code as i64 as u64);
            put_len(&mut out, 2, message.as_bytes());
            out
        }
        Content::Json => serde_json::json!({ "code": code, "message": message })
            .to_string()
            .into_bytes(),
    }
}

#[cfg(test)]
mod tests;
