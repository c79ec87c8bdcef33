//! The broker's one error enum, [`BrokerError`]: why a request, or one
//! partition of it, failed — in every room (the shard, replication, the
//! coordinator runtime, the service), with Weir's protocol-neutral code
//! ([`BrokerError::code`]). Each listener maps it to its own wire codes,
//! exhaustively. A leaf: it names nothing of the broker above
//! `crate::metadata`'s [`TopicError`].

use weir_proto::error_code::ErrorCode;
use weir_storage::StorageError;

use crate::metadata::TopicError;
use crate::txns::api::TxnRefusal;

/// What kind of storage failure a [`BrokerError::Storage`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFailure {
    /// A batch failed validation (CRC, length, magic, trailing bytes).
    Corrupt,
    /// A batch is larger than the partition accepts.
    TooLarge,
    /// The offset is outside the log.
    OffsetOutOfRange,
    /// The partition is recovering; retry.
    Recovering,
    /// An idempotent producer's sequence has a gap.
    OutOfOrderSequence,
    /// An idempotent producer was fenced by a newer epoch.
    InvalidProducerEpoch,
    /// No state for the producer and the batch does not start a sequence.
    UnknownProducerId,
    /// A transactional write came after its transaction ended.
    TransactionEnded,
    /// A record breaks a rule of the topic (a keyless record in a
    /// compacted topic).
    InvalidRecord,
    /// I/O or another failure of the storage engine.
    Io,
    /// The remote tier (tiered storage) did not answer a read in time, or
    /// failed it: retriable.
    RemoteUnavailable,
}

/// Why a request, or one partition of it, failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    /// The topic or partition does not exist.
    #[error("unknown topic or partition {topic}-{partition}")]
    UnknownPartition {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
    },
    /// The partition lives on another core and this connection may only
    /// serve its own core's partitions (a core's own port).
    #[error(
        "{topic}-{partition} is owned by core {owner} (port {owner_port}); this connection is \
         on core {core}'s port {port}: refresh metadata, or use the shared port"
    )]
    NotOwner {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// The owner core.
        owner: usize,
        /// The owner core's own port.
        owner_port: u16,
        /// This connection's core.
        core: usize,
        /// This connection's port.
        port: u16,
    },
    /// The partition lives on another node of the cluster (or on none
    /// live right now).
    #[error(
        "{topic}-{partition} is served by {}: refresh the metadata",
        if *leader == 0 { "no live node right now".to_string() } else { format!("node {leader}") }
    )]
    NotLeader {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// The leading node (0: none).
        leader: u64,
    },
    /// A topic operation was refused.
    #[error(transparent)]
    Topic(#[from] TopicError),
    /// The storage engine refused or failed.
    #[error("{message}")]
    Storage {
        /// The kind, for the listener's error code.
        kind: StorageFailure,
        /// The storage engine's explanation.
        message: String,
    },
    /// A batch in a produce payload could not be framed, or the payload
    /// is empty.
    #[error("{0}")]
    Corrupt(String),
    /// The request breaks a broker policy (e.g. writing the internal
    /// topic).
    #[error("{0}")]
    Policy(String),
    /// The request is malformed or over a named limit.
    #[error("{0}")]
    InvalidRequest(String),
    /// Not done within the request's timeout.
    #[error("{0}")]
    TimedOut(String),
    /// `acks=all` to a partition with fewer in-sync replicas than its
    /// `min.insync.replicas`: nothing was appended.
    #[error(
        "{topic}-{partition} has {isr} in-sync replica(s), fewer than min.insync.replicas={min}: \
         nothing appended"
    )]
    NotEnoughReplicas {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// In-sync replicas now.
        isr: usize,
        /// The topic's `min.insync.replicas`.
        min: u32,
    },
    /// The core owning the partition (or the metadata writer) did not
    /// answer: it is overloaded, or stopping.
    #[error("core {core} did not answer: {reason}")]
    CoreUnavailable {
        /// The core asked.
        core: usize,
        /// Why (timeout, dropped, stopping).
        reason: String,
    },
    /// The ACLs do not let the connection's principal do this.
    #[error("{principal} may not {operation} {resource}")]
    Unauthorized {
        /// What kind of resource: topic, group or cluster.
        kind: Denied,
        /// The principal.
        principal: String,
        /// The operation, e.g. `Write`.
        operation: &'static str,
        /// The resource, e.g. `topic telemetry.cpu`.
        resource: String,
    },
    /// The transaction coordinator refused (or could not serve) a
    /// transactional request or write.
    #[error("{0}")]
    Transaction(crate::txns::api::TxnRefusal),
}

/// The kind of resource an authorization failed for (its error code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// A topic (`TopicAuthorizationFailed`).
    Topic,
    /// A consumer group (`GroupAuthorizationFailed`).
    Group,
    /// The cluster (`ClusterAuthorizationFailed`).
    Cluster,
}

impl BrokerError {
    /// The error for a topic or partition that does not exist.
    pub fn unknown(topic: &str, partition: u32) -> BrokerError {
        BrokerError::UnknownPartition {
            topic: topic.to_string(),
            partition,
        }
    }

    /// The error for a cross-core request that got no answer.
    pub fn unavailable(core: usize, reason: impl Into<String>) -> BrokerError {
        BrokerError::CoreUnavailable {
            core,
            reason: reason.into(),
        }
    }
}

impl BrokerError {
    /// Weir's protocol-neutral code of this error: what the native protocol
    /// sends, and what the group coordinator answers with. Exhaustive, like
    /// the Kafka listener's `broker_error_code`: a new variant does not
    /// compile until both listeners say what it means.
    pub fn code(&self) -> ErrorCode {
        match self {
            BrokerError::UnknownPartition { .. } => ErrorCode::UnknownTopicOrPartition,
            BrokerError::NotOwner { .. } => ErrorCode::NotOwner,
            BrokerError::NotLeader { .. } => ErrorCode::NotLeader,
            BrokerError::Topic(t) => topic_code(t),
            BrokerError::Storage { kind, .. } => match kind {
                StorageFailure::Corrupt => ErrorCode::CorruptMessage,
                StorageFailure::TooLarge => ErrorCode::MessageTooLarge,
                StorageFailure::OffsetOutOfRange => ErrorCode::OffsetOutOfRange,
                StorageFailure::Recovering => ErrorCode::Recovering,
                StorageFailure::OutOfOrderSequence => ErrorCode::OutOfOrderSequence,
                StorageFailure::InvalidProducerEpoch => ErrorCode::InvalidProducerEpoch,
                StorageFailure::TransactionEnded => ErrorCode::InvalidTxnState,
                StorageFailure::UnknownProducerId => ErrorCode::UnknownProducerId,
                StorageFailure::InvalidRecord => ErrorCode::InvalidRecord,
                StorageFailure::Io => ErrorCode::StorageError,
                StorageFailure::RemoteUnavailable => ErrorCode::RemoteStorageError,
            },
            BrokerError::Corrupt(_) => ErrorCode::CorruptMessage,
            BrokerError::Policy(_) => ErrorCode::PolicyViolation,
            BrokerError::InvalidRequest(_) => ErrorCode::InvalidRequest,
            BrokerError::TimedOut(_) => ErrorCode::RequestTimedOut,
            BrokerError::NotEnoughReplicas { .. } => ErrorCode::NotEnoughReplicas,
            // The owning core did not answer (overloaded or stopping): retriable.
            BrokerError::CoreUnavailable { .. } => ErrorCode::StorageError,
            BrokerError::Unauthorized { kind, .. } => match kind {
                Denied::Topic => ErrorCode::TopicAuthorizationFailed,
                Denied::Group => ErrorCode::GroupAuthorizationFailed,
                Denied::Cluster => ErrorCode::ClusterAuthorizationFailed,
            },
            BrokerError::Transaction(r) => match r {
                TxnRefusal::Txn(weir_txn::TxnError::ProducerFenced(_)) => {
                    ErrorCode::InvalidProducerEpoch
                }
                TxnRefusal::Txn(weir_txn::TxnError::InvalidTxnState(_)) => {
                    ErrorCode::InvalidTxnState
                }
                TxnRefusal::Txn(weir_txn::TxnError::ConcurrentTransactions(_)) => {
                    ErrorCode::ConcurrentTransactions
                }
                TxnRefusal::Txn(weir_txn::TxnError::InvalidProducerIdMapping(_)) => {
                    ErrorCode::UnknownProducerId
                }
                TxnRefusal::Txn(weir_txn::TxnError::TransactionalIdNotFound(_)) => {
                    ErrorCode::TransactionalIdNotFound
                }
                TxnRefusal::NotCoordinator(_) => ErrorCode::NotCoordinator,
                TxnRefusal::Loading(_) => ErrorCode::Recovering,
                TxnRefusal::Storage(_) => ErrorCode::StorageError,
                TxnRefusal::Txn(_) => ErrorCode::InvalidRequest,
            },
        }
    }

    /// The native wire code and message of this error.
    pub fn wire(&self) -> (u16, String) {
        (self.code().as_u16(), self.to_string())
    }
}

/// Weir's protocol-neutral code of a topic operation's refusal (exhaustive).
pub fn topic_code(e: &TopicError) -> ErrorCode {
    match e {
        TopicError::InvalidName(_) => ErrorCode::InvalidTopic,
        TopicError::Exists(_) => ErrorCode::TopicAlreadyExists,
        TopicError::Unknown(_) => ErrorCode::UnknownTopicOrPartition,
        TopicError::Partitions { .. } => ErrorCode::InvalidPartitions,
        TopicError::ReplicationFactor { .. } => ErrorCode::InvalidReplicationFactor,
        TopicError::Config(_) => ErrorCode::InvalidConfig,
        TopicError::NotApplied(_) => ErrorCode::StorageError,
        TopicError::Reassignment(_) => ErrorCode::InvalidReplicaAssignment,
    }
}

impl From<&StorageError> for BrokerError {
    fn from(e: &StorageError) -> BrokerError {
        let kind = match e {
            StorageError::InvalidBatch { .. } | StorageError::TrailingBytes { .. } => {
                StorageFailure::Corrupt
            }
            StorageError::BatchTooLarge { .. } => StorageFailure::TooLarge,
            StorageError::OffsetOutOfRange { .. } => StorageFailure::OffsetOutOfRange,
            StorageError::Recovering { .. } => StorageFailure::Recovering,
            StorageError::OutOfOrderSequence { .. } => StorageFailure::OutOfOrderSequence,
            StorageError::InvalidProducerEpoch { .. } => StorageFailure::InvalidProducerEpoch,
            StorageError::TransactionEnded { .. } => StorageFailure::TransactionEnded,
            StorageError::UnknownProducerId { .. } => StorageFailure::UnknownProducerId,
            StorageError::KeyRequired { .. } => StorageFailure::InvalidRecord,
            _ => StorageFailure::Io,
        };
        BrokerError::Storage {
            kind,
            message: e.to_string(),
        }
    }
}

impl From<StorageError> for BrokerError {
    fn from(e: StorageError) -> BrokerError {
        BrokerError::from(&e)
    }
}

/// Result of a partition operation.
pub type Result<T> = std::result::Result<T, BrokerError>;
