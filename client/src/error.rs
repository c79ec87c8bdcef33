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
/// [`ClientError::Protocol`], [`ClientError::Timeout`],
/// [`ClientError::Server`], an answer with the wrong correlation id) the
/// client drops its
/// connection and opens a new one on the next call; per-topic and
/// per-partition errors leave it open.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Connecting, reading or writing failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The server closed the connection before answering.
    #[error("connection closed by the server")]
    Disconnected,
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
    /// The server answered the whole request with a frame-level error.
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
    /// No answer within the request timeout.
    #[error("request timed out after {0:?}")]
    Timeout(Duration),
    /// The call's arguments are invalid (checked before sending).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A [`crate::producer::Producer`]'s buffer stayed full: `send` waited
    /// `max_block_ms` for earlier records to be delivered and gave up.
    #[error("producer buffer full: no space freed up within {waited:?} (see ProducerConfig::buffer_memory and max_block_ms)")]
    BufferFull {
        /// How long `send` waited for buffer space.
        waited: Duration,
    },
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
    }
}
