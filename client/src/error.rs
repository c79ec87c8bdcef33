//! [`ClientError`], the error of every client call.

use std::time::Duration;

use weir_proto::batch::BatchError;
use weir_proto::error_code::ErrorCode;
use weir_proto::frame::FrameError;

/// The result of a client call.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Why a client call failed.
///
/// After a failure of the exchange itself (I/O, [`ClientError::Disconnected`],
/// [`ClientError::Protocol`], [`ClientError::Timeout`], a frame-level
/// [`ClientError::Server`] error, an answer to a request that was not sent)
/// the client closes its connection — every other call waiting for an
/// answer on it fails with [`ClientError::Disconnected`] (or the same I/O
/// error) — and opens a new one on the next call; per-topic and
/// per-partition errors leave it open. See the [crate docs](crate).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Connecting, reading or writing failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The connection was closed before the answer arrived: by the server,
    /// or by the client because another call on the same connection failed
    /// or timed out (or was dropped while its request was half written).
    /// The request may or may not have been carried out.
    #[error("connection closed before the answer arrived")]
    Disconnected,
    /// TLS could not be set up: its files, or the handshake (an untrusted
    /// or misnamed broker certificate, a refused client certificate).
    #[error("TLS: {0}")]
    Tls(String),
    /// The broker refused the SASL login (a wrong user or password, a
    /// mechanism it does not offer), or `security.protocol=SASL_*` came
    /// without `sasl.mechanism`, `sasl.username` and `sasl.password`.
    #[error("SASL authentication failed: {0}")]
    Authentication(String),
    /// A frame or a body could not be encoded or decoded.
    #[error("protocol error: {0}")]
    Protocol(FrameError),
    /// The response is well-formed but does not answer the request (wrong
    /// correlation id, missing or extra results).
    #[error("invalid response: {0}")]
    InvalidResponse(String),
    /// A record batch (given to produce, or fetched) is malformed.
    #[error("corrupt record batch: {0}")]
    CorruptBatch(BatchError),
    /// The server refused the whole request: a frame-level error, or the
    /// error of a request that is about no topic or partition (e.g.
    /// [`crate::Client::init_producer_id`]).
    #[error("server error: {message} [{}]", code.name())]
    Server {
        /// The frame's error code.
        code: ErrorCode,
        /// The server's message.
        message: String,
    },
    /// An admin operation failed for a topic (or the topic is unknown).
    #[error("{} [{}]", with_subject(&format!("topic `{topic}`"), topic, message), code.name())]
    Topic {
        /// The topic.
        topic: String,
        /// The topic's error code.
        code: ErrorCode,
        /// The server's message (or the code's description if it sent none).
        message: String,
    },
    /// A produce, fetch or offset lookup failed for one partition.
    #[error("{} [{}]", with_subject(&format!("partition {topic}-{partition}"), &format!("{topic}-{partition}"), message), code.name())]
    Partition {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The partition's error code.
        code: ErrorCode,
        /// The server's message (or the code's description if it sent none).
        message: String,
    },
    /// A consumer-group call was refused for the group as a whole (e.g.
    /// `UnknownMemberId` after an expulsion, `IllegalGeneration` for a
    /// fenced member, `GroupNotEmpty`).
    #[error("{} [{}]", with_subject(&format!("group `{group}`"), group, message), code.name())]
    Group {
        /// The group id.
        group: String,
        /// The error code.
        code: ErrorCode,
        /// The server's message (or the code's description if it sent none).
        message: String,
    },
    /// No answer within the request timeout.
    #[error("request timed out after {0:?}")]
    Timeout(Duration),
    /// The call's arguments are invalid (checked before sending).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A setting given by name ([`crate::Properties`]) is unknown or
    /// invalid.
    #[error("configuration: {0}")]
    Config(#[from] crate::properties::PropertyError),
    /// A [`crate::producer::Producer`]'s buffer stayed full: `send` waited
    /// `max_block_ms` for earlier records to be delivered and gave up.
    #[error("producer buffer full: no space freed up within {waited:?} (see ProducerConfig::buffer_memory and max_block_ms)")]
    BufferFull {
        /// How long `send` waited for buffer space.
        waited: Duration,
    },
    /// A transactional producer was fenced: another instance initialized
    /// the same transactional id (or its transaction timed out, or an
    /// operator aborted it). Fatal for this producer: close it; a new one
    /// with the same id takes over.
    #[error("producer fenced: {0}")]
    ProducerFenced(String),
    /// The transaction cannot commit (a record of it failed, or a call
    /// came out of order): abort it, then go on.
    #[error("transaction must be aborted: {0}")]
    TransactionAbortable(String),
}

// `Protocol` and `CorruptBatch` show their cause in their message, so they
// do not also report it as `source()` (error chains would print it twice).
impl From<FrameError> for ClientError {
    fn from(e: FrameError) -> ClientError {
        ClientError::Protocol(e)
    }
}

impl From<BatchError> for ClientError {
    fn from(e: BatchError) -> ClientError {
        ClientError::CorruptBatch(e)
    }
}

/// `message` alone if it already names `needle`, else `subject: message`.
fn with_subject(subject: &str, needle: &str, message: &str) -> String {
    if message.contains(needle) {
        message.to_string()
    } else {
        format!("{subject}: {message}")
    }
}

impl ClientError {
    /// The protocol error code, for server-side errors.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. }
            | ClientError::Topic { code, .. }
            | ClientError::Group { code, .. }
            | ClientError::Partition { code, .. } => Some(*code),
            ClientError::Protocol(e) => Some(e.error_code()),
            _ => None,
        }
    }

    /// Whether the same call may succeed if made again later: I/O errors,
    /// timeouts, a closed connection, and retriable server codes (see
    /// [`ErrorCode::is_retriable`]).
    pub fn is_retriable(&self) -> bool {
        match self {
            ClientError::Io(_) | ClientError::Disconnected | ClientError::Timeout(_) => true,
            ClientError::Server { code, .. }
            | ClientError::Topic { code, .. }
            | ClientError::Partition { code, .. } => code.is_retriable(),
            _ => false,
        }
    }

    /// A copy of this error, to report one failure to several callers (an
    /// I/O error keeps its kind and message, not its source).
    pub(crate) fn duplicate(&self) -> ClientError {
        match self {
            ClientError::Io(io) => ClientError::Io(std::io::Error::new(io.kind(), io.to_string())),
            ClientError::Disconnected => ClientError::Disconnected,
            ClientError::Tls(m) => ClientError::Tls(m.clone()),
            ClientError::Authentication(m) => ClientError::Authentication(m.clone()),
            ClientError::Protocol(f) => ClientError::Protocol(f.clone()),
            ClientError::InvalidResponse(m) => ClientError::InvalidResponse(m.clone()),
            ClientError::CorruptBatch(b) => ClientError::CorruptBatch(b.clone()),
            ClientError::Server { code, message } => ClientError::Server {
                code: *code,
                message: message.clone(),
            },
            ClientError::Topic {
                topic,
                code,
                message,
            } => ClientError::Topic {
                topic: topic.clone(),
                code: *code,
                message: message.clone(),
            },
            ClientError::Partition {
                topic,
                partition,
                code,
                message,
            } => ClientError::Partition {
                topic: topic.clone(),
                partition: *partition,
                code: *code,
                message: message.clone(),
            },
            ClientError::Group {
                group,
                code,
                message,
            } => ClientError::Group {
                group: group.clone(),
                code: *code,
                message: message.clone(),
            },
            ClientError::Timeout(d) => ClientError::Timeout(*d),
            ClientError::InvalidArgument(m) => ClientError::InvalidArgument(m.clone()),
            ClientError::BufferFull { waited } => ClientError::BufferFull { waited: *waited },
            ClientError::Config(e) => ClientError::Config(e.clone()),
            ClientError::ProducerFenced(m) => ClientError::ProducerFenced(m.clone()),
            ClientError::TransactionAbortable(m) => ClientError::TransactionAbortable(m.clone()),
        }
    }

    pub(crate) fn topic(topic: &str, code: u16, message: Option<String>) -> ClientError {
        let code = ErrorCode::from_u16(code);
        ClientError::Topic {
            topic: topic.to_string(),
            code,
            message: message.unwrap_or_else(|| code.description().to_string()),
        }
    }

    pub(crate) fn partition(
        topic: &str,
        partition: u32,
        code: u16,
        message: Option<String>,
    ) -> ClientError {
        let code = ErrorCode::from_u16(code);
        ClientError::Partition {
            topic: topic.to_string(),
            partition,
            code,
            message: message.unwrap_or_else(|| code.description().to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_their_subject_once() {
        let e = ClientError::topic("orders", 10, Some("topic `orders` already exists".into()));
        assert_eq!(
            e.to_string(),
            "topic `orders` already exists [TopicAlreadyExists]"
        );
        let e = ClientError::topic("orders", 3, None);
        assert_eq!(
            e.to_string(),
            "topic `orders`: unknown topic or partition [UnknownTopicOrPartition]"
        );
        let e = ClientError::partition("t", 2, 4, None);
        assert_eq!(
            e.to_string(),
            "partition t-2: offset out of range [OffsetOutOfRange]"
        );
        let e = ClientError::partition("t", 2, 3, Some("unknown topic or partition t-2".into()));
        assert_eq!(
            e.to_string(),
            "unknown topic or partition t-2 [UnknownTopicOrPartition]"
        );
        assert_eq!(e.code(), Some(ErrorCode::UnknownTopicOrPartition));
    }

    #[test]
    fn retriable() {
        assert!(ClientError::Timeout(Duration::from_secs(1)).is_retriable());
        assert!(ClientError::partition("t", 0, ErrorCode::NotOwner.as_u16(), None).is_retriable());
        assert!(
            !ClientError::topic("t", ErrorCode::TopicAlreadyExists.as_u16(), None).is_retriable()
        );
        // An idempotent producer's sequence and epoch errors need the
        // producer to act (new id, fail the batch), not a plain resend.
        for code in [
            ErrorCode::OutOfOrderSequence,
            ErrorCode::InvalidProducerEpoch,
            ErrorCode::UnknownProducerId,
        ] {
            assert!(!ClientError::partition("t", 0, code.as_u16(), None).is_retriable());
            let e = ClientError::Server {
                code,
                message: String::new(),
            };
            assert!(!e.is_retriable(), "{code:?}");
        }
    }

    #[test]
    fn duplicates_keep_kind_and_message() {
        let e = ClientError::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        ));
        match e.duplicate() {
            ClientError::Io(io) => assert_eq!(
                (io.kind(), io.to_string()),
                (std::io::ErrorKind::ConnectionReset, "reset".to_string())
            ),
            other => panic!("{other:?}"),
        }
        let e = ClientError::partition("t", 1, 13, Some("moved".into()));
        assert_eq!(e.duplicate().to_string(), e.to_string());
        assert!(matches!(
            ClientError::Disconnected.duplicate(),
            ClientError::Disconnected
        ));
    }
}
