//! One mapping from the service's errors to Kafka codes (exhaustive).

use super::common::*;

/// The Kafka code of a service error. Exhaustive, here and in
/// `topic_error_code` (as is `BrokerError::code`, what the native
/// listener sends): a new variant does not compile until both listeners say
/// what it means.
pub fn broker_error_code(e: &BrokerError) -> i16 {
    match e {
        BrokerError::UnknownPartition { .. } => E::UnknownTopicOrPartition.code(),
        BrokerError::NotOwner { .. } | BrokerError::NotLeader { .. } => {
            E::NotLeaderOrFollower.code()
        }
        BrokerError::Topic(t) => topic_error_code(t),
        BrokerError::Storage { kind, .. } => match kind {
            StorageFailure::Corrupt => E::CorruptMessage.code(),
            StorageFailure::TooLarge => E::MessageTooLarge.code(),
            StorageFailure::OffsetOutOfRange => E::OffsetOutOfRange.code(),
            StorageFailure::Recovering => E::NotLeaderOrFollower.code(),
            StorageFailure::OutOfOrderSequence => E::OutOfOrderSequenceNumber.code(),
            StorageFailure::InvalidProducerEpoch => E::InvalidProducerEpoch.code(),
            StorageFailure::TransactionEnded => E::InvalidTxnState.code(),
            StorageFailure::UnknownProducerId => E::UnknownProducerId.code(),
            StorageFailure::InvalidRecord => E::InvalidRecord.code(),
            StorageFailure::Io => E::UnknownServerError.code(),
            // Kafka's answer to a remote read that failed: retriable.
            StorageFailure::RemoteUnavailable => E::KafkaStorageError.code(),
        },
        BrokerError::Corrupt(_) => E::CorruptMessage.code(),
        BrokerError::Policy(_) => E::PolicyViolation.code(),
        BrokerError::InvalidRequest(_) => E::InvalidRequest.code(),
        BrokerError::TimedOut(_) => E::RequestTimedOut.code(),
        BrokerError::NotEnoughReplicas { .. } => E::NotEnoughReplicas.code(),
        // The owning core did not answer (overloaded or stopping): a
        // retriable code, so that a Kafka client retries rather than fails.
        BrokerError::CoreUnavailable { .. } => E::NotEnoughReplicas.code(),
        BrokerError::Unauthorized { .. } => weir_kafka::error::coordinator_code(e.code()),
        // A refused transactional write: a fenced producer is told
        // INVALID_PRODUCER_EPOCH, as Kafka's Produce tells it (KIP-588).
        BrokerError::Transaction(crate::txns::api::TxnRefusal::Txn(
            weir_txn::TxnError::ProducerFenced(_),
        )) => E::InvalidProducerEpoch.code(),
        BrokerError::Transaction(r) => txn_code(r),
    }
}

/// The Kafka code of a transaction coordinator's refusal.
pub(super) fn txn_code(r: &crate::txns::api::TxnRefusal) -> i16 {
    use crate::txns::api::TxnRefusal as R;
    use weir_txn::TxnError as T;
    match r {
        R::Txn(T::ProducerFenced(_)) => E::ProducerFenced.code(),
        R::Txn(T::InvalidProducerIdMapping(_)) => E::InvalidProducerIdMapping.code(),
        R::Txn(T::ConcurrentTransactions(_)) => E::ConcurrentTransactions.code(),
        R::Txn(T::InvalidTxnState(_)) => E::InvalidTxnState.code(),
        R::Txn(T::InvalidTransactionTimeout(_)) => E::InvalidTransactionTimeout.code(),
        R::Txn(T::InvalidRequest(_)) => E::InvalidRequest.code(),
        R::Txn(T::TransactionalIdNotFound(_)) => E::TransactionalIdNotFound.code(),
        R::NotCoordinator(_) => E::NotCoordinator.code(),
        R::Loading(_) => E::CoordinatorLoadInProgress.code(),
        R::Storage(_) => E::CoordinatorNotAvailable.code(),
    }
}

/// The Kafka code of a Weir error code in a group or commit answer.
pub(super) fn group_code(c: u16) -> i16 {
    coordinator_code(ErrorCode::from_u16(c))
}

pub(super) fn topic_error_code(e: &TopicError) -> i16 {
    match e {
        TopicError::Exists(_) => E::TopicAlreadyExists.code(),
        TopicError::Unknown(_) => E::UnknownTopicOrPartition.code(),
        TopicError::Partitions { .. } => E::InvalidPartitions.code(),
        TopicError::ReplicationFactor { .. } => E::InvalidReplicationFactor.code(),
        TopicError::Config(_) => E::InvalidConfig.code(),
        TopicError::InvalidName(_) => E::InvalidTopicException.code(),
        TopicError::NotApplied(_) => E::UnknownServerError.code(),
        TopicError::Reassignment(_) => E::InvalidReplicaAssignment.code(),
    }
}
