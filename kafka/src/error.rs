//! Kafka error codes. The codes themselves are `kafka-protocol`'s
//! [`ResponseError`] (generated from Kafka's own list); this module holds
//! the mapping from Weir's protocol-neutral [`ErrorCode`] — what the group
//! coordinator and the offset store answer with, the same codes the native
//! protocol sends — to the Kafka code a Kafka client acts on.
//!
//! The match is exhaustive: a new [`ErrorCode`] does not compile until it
//! says what a Kafka client sees.

use kafka_protocol::ResponseError;
use weir_proto::error_code::ErrorCode;

/// Kafka's UNSUPPORTED_VERSION error code.
pub const UNSUPPORTED_VERSION: i16 = ResponseError::UnsupportedVersion.code();

/// The Kafka error a coordinator answer with Weir's `code` becomes (`None`
/// for [`ErrorCode::None`]).
///
/// Codes a coordinator does not answer with today (they come from the data
/// path, whose errors the listener maps from the service's error itself)
/// still get their closest Kafka meaning, so that no code is ever sent as
/// a number a client does not know.
pub fn coordinator_error(code: ErrorCode) -> Option<ResponseError> {
    use ResponseError as K;
    Some(match code {
        ErrorCode::None => return None,
        ErrorCode::Unknown => K::UnknownServerError,
        ErrorCode::CorruptMessage => K::CorruptMessage,
        ErrorCode::UnknownTopicOrPartition => K::UnknownTopicOrPartition,
        ErrorCode::OffsetOutOfRange => K::OffsetOutOfRange,
        ErrorCode::MessageTooLarge => K::MessageTooLarge,
        ErrorCode::InvalidRequest => K::InvalidRequest,
        ErrorCode::UnsupportedVersion => K::UnsupportedVersion,
        ErrorCode::UnsupportedApi => K::InvalidRequest,
        ErrorCode::FrameTooLarge => K::InvalidRequest,
        ErrorCode::TopicAlreadyExists => K::TopicAlreadyExists,
        ErrorCode::InvalidConfig => K::InvalidConfig,
        ErrorCode::InvalidPartitions => K::InvalidPartitions,
        ErrorCode::NotOwner => K::NotLeaderOrFollower,
        ErrorCode::RequestTimedOut => K::RequestTimedOut,
        // The coordinator's log could not be written or read: the client
        // looks the coordinator up again and retries.
        ErrorCode::StorageError => K::CoordinatorNotAvailable,
        ErrorCode::NotEnoughReplicas => K::NotEnoughReplicas,
        ErrorCode::PolicyViolation => K::PolicyViolation,
        ErrorCode::InvalidTopic => K::InvalidTopicException,
        // The coordinator is replaying its partition of __consumer_offsets.
        ErrorCode::Recovering => K::CoordinatorLoadInProgress,
        ErrorCode::OutOfOrderSequence => K::OutOfOrderSequenceNumber,
        ErrorCode::InvalidProducerEpoch => K::InvalidProducerEpoch,
        ErrorCode::UnknownProducerId => K::UnknownProducerId,
        ErrorCode::InvalidRecord => K::InvalidRecord,
        ErrorCode::UnknownMemberId => K::UnknownMemberId,
        ErrorCode::IllegalGeneration => K::IllegalGeneration,
        ErrorCode::GroupNotEmpty => K::NonEmptyGroup,
        ErrorCode::GroupIdNotFound => K::GroupIdNotFound,
        ErrorCode::InvalidGroupId => K::InvalidGroupId,
        ErrorCode::InconsistentAssignor => K::InconsistentGroupProtocol,
        ErrorCode::InvalidSessionTimeout => K::InvalidSessionTimeout,
        ErrorCode::FencedMemberEpoch => K::FencedMemberEpoch,
        ErrorCode::StaleMemberEpoch => K::StaleMemberEpoch,
        ErrorCode::RebalanceInProgress => K::RebalanceInProgress,
        ErrorCode::FencedInstanceId => K::FencedInstanceId,
        ErrorCode::NotLeader => K::NotLeaderOrFollower,
        ErrorCode::NotCoordinator => K::NotCoordinator,
        ErrorCode::InvalidReplicationFactor => K::InvalidReplicationFactor,
        ErrorCode::InvalidReplicaAssignment => K::InvalidReplicaAssignment,
        ErrorCode::ResourceNotFound => K::ResourceNotFound,
        ErrorCode::DuplicateResource => K::DuplicateResource,
        ErrorCode::UnacceptableCredential => K::UnacceptableCredential,
        ErrorCode::UnsupportedSaslMechanism => K::UnsupportedSaslMechanism,
        ErrorCode::TopicAuthorizationFailed => K::TopicAuthorizationFailed,
        ErrorCode::GroupAuthorizationFailed => K::GroupAuthorizationFailed,
        ErrorCode::ClusterAuthorizationFailed => K::ClusterAuthorizationFailed,
        ErrorCode::SecurityDisabled => K::SecurityDisabled,
        ErrorCode::SaslAuthenticationFailed => K::SaslAuthenticationFailed,
        ErrorCode::InvalidTxnState => K::InvalidTxnState,
        ErrorCode::TransactionalIdNotFound => K::TransactionalIdNotFound,
        ErrorCode::ConcurrentTransactions => K::ConcurrentTransactions,
        ErrorCode::ShareSessionNotFound => K::ShareSessionNotFound,
        ErrorCode::InvalidShareSessionEpoch => K::InvalidShareSessionEpoch,
        ErrorCode::ShareSessionLimitReached => K::ShareSessionLimitReached,
        ErrorCode::InvalidRecordState => K::InvalidRecordState,
        ErrorCode::GroupMaxSizeReached => K::GroupMaxSizeReached,
        ErrorCode::InconsistentGroupProtocol => K::InconsistentGroupProtocol,
        ErrorCode::RemoteStorageError => K::KafkaStorageError,
    })
}

/// [`coordinator_error`] as the `i16` on the wire (0 for no error).
pub fn coordinator_code(code: ErrorCode) -> i16 {
    coordinator_error(code).map_or(0, |e| e.code())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every Weir code that is an error maps to a Kafka code a client
    /// knows (not `Unknown(n)`), and only `None` maps to "no error".
    #[test]
    fn every_weir_code_maps_to_a_known_kafka_code() {
        for n in 0..=u16::from(u8::MAX) {
            let code = ErrorCode::from_u16(n);
            if code == ErrorCode::Unknown && n != ErrorCode::Unknown as u16 {
                continue; // not a code of this build
            }
            match coordinator_error(code) {
                None => assert_eq!(code, ErrorCode::None),
                Some(ResponseError::Unknown(k)) => panic!("{code:?} maps to unknown {k}"),
                Some(k) => assert_ne!(k.code(), 0, "{code:?}"),
            }
        }
    }

    /// The codes the coordinator answered with before this module existed
    /// keep their Kafka meaning.
    #[test]
    fn coordinator_answers_keep_their_kafka_codes() {
        let kept = [
            (ErrorCode::Recovering, 14),
            (ErrorCode::StorageError, 15),
            (ErrorCode::NotCoordinator, 16),
            (ErrorCode::UnknownMemberId, 25),
            (ErrorCode::IllegalGeneration, 22),
            (ErrorCode::GroupNotEmpty, 68),
            (ErrorCode::GroupIdNotFound, 69),
            (ErrorCode::InconsistentAssignor, 23),
            (ErrorCode::FencedMemberEpoch, 110),
            (ErrorCode::StaleMemberEpoch, 113),
            (ErrorCode::FencedInstanceId, 82),
            (ErrorCode::RebalanceInProgress, 27),
        ];
        for (code, kafka) in kept {
            assert_eq!(coordinator_code(code), kafka, "{code:?}");
        }
    }
}
