//! Error codes of the native protocol.
//!
//! An [`ErrorCode`] travels as a `u16`: in a response frame's header (a
//! frame-level error, see [`crate::frame`]) and in the `error` field of each
//! per-topic or per-partition result of a response body
//! (see [`crate::messages`]).
//!
//! The numbers are part of the wire format: they are stable, and a number is
//! never reused for another meaning, even after the code it named is retired.
//! A receiver maps a number it does not know to [`ErrorCode::Unknown`]
//! ([`ErrorCode::from_u16`] never fails), so a newer peer can add codes
//! without breaking an older one.

use std::fmt;

/// A protocol error code. The discriminant is the number on the wire.
///
/// Stable: a number keeps its meaning forever and is never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// No error.
    None = 0,
    /// An error the server could not classify, or a number this build does
    /// not know.
    Unknown = 1,
    /// A record batch failed validation (bad CRC, bad length, bad magic …).
    CorruptMessage = 2,
    /// The topic or partition does not exist.
    UnknownTopicOrPartition = 3,
    /// The requested offset is outside the log's range.
    OffsetOutOfRange = 4,
    /// A batch or a request is larger than the configured limit.
    MessageTooLarge = 5,
    /// The request is malformed (bad body, bad payload range, …).
    InvalidRequest = 6,
    /// The API is known but not at the requested version.
    UnsupportedVersion = 7,
    /// The API key is not known to the server.
    UnsupportedApi = 8,
    /// The frame is larger than the server's maximum frame size.
    FrameTooLarge = 9,
    /// A topic with that name already exists.
    TopicAlreadyExists = 10,
    /// A configuration key or value is invalid.
    InvalidConfig = 11,
    /// The partition count is invalid (zero, or not larger than the current
    /// one when adding partitions).
    InvalidPartitions = 12,
    /// The partition lives on another core: reconnect to the core the
    /// metadata names.
    NotOwner = 13,
    /// The request did not complete before its timeout.
    RequestTimedOut = 14,
    /// The storage layer failed (I/O error, disk full, …).
    StorageError = 15,
    /// Reserved for replication: too few in-sync replicas.
    NotEnoughReplicas = 16,
    /// The request is valid but refused by a server policy.
    PolicyViolation = 17,
    /// The topic name is invalid.
    InvalidTopic = 18,
    /// The partition is recovering (e.g. replaying its log after a restart);
    /// retry later.
    Recovering = 19,
    /// An idempotent producer's batch does not follow the last sequence
    /// the partition holds for it (a gap): the batch was not appended.
    OutOfOrderSequence = 20,
    /// An idempotent producer's epoch is older than the partition's: a
    /// newer instance of the producer took over (fenced).
    InvalidProducerEpoch = 21,
    /// The partition holds no state for this producer id and the batch
    /// does not start a sequence (its base sequence is not 0).
    UnknownProducerId = 22,
    /// A record of the batch breaks a rule of the topic, e.g. a record
    /// without a key in a compacted topic: nothing was appended.
    InvalidRecord = 23,
    // 24..=29 are reserved (log compaction).
    /// The group has no member with this id (it left, was expelled after
    /// its session or poll timeout, or the coordinator restarted): rejoin.
    UnknownMemberId = 30,
    /// The generation is not the member's current one, or the partition is
    /// not assigned to the member (a fenced zombie): rejoin.
    IllegalGeneration = 31,
    /// The operation needs a group without active members.
    GroupNotEmpty = 32,
    /// The group does not exist.
    GroupIdNotFound = 33,
    /// The group id is empty or too long.
    InvalidGroupId = 34,
    /// The member asks for an assignor other than the group's.
    InconsistentAssignor = 35,
    /// The session timeout or poll interval is outside the broker's range.
    InvalidSessionTimeout = 36,
    /// The member's epoch is ahead of the coordinator's or too far behind:
    /// it was fenced (its partitions may have moved): rejoin with epoch 0.
    FencedMemberEpoch = 37,
    /// A commit's member epoch is newer than the member's, or the
    /// partition was not assigned to the member at that epoch.
    StaleMemberEpoch = 38,
    /// A classic group is rebalancing: rejoin before committing.
    RebalanceInProgress = 39,
    /// A newer member holds this static instance id: this one is fenced.
    FencedInstanceId = 40,
    /// The partition is served by another node of the cluster (or by no
    /// live node right now): refresh the metadata and retry there.
    NotLeader = 41,
    /// The consumer group is coordinated by another node of the cluster:
    /// find its coordinator (`FindCoordinator`) and ask there.
    NotCoordinator = 42,
    /// A topic's replication factor is more than the live nodes, or 0.
    InvalidReplicationFactor = 43,
    /// A partition reassignment names replicas the cluster cannot take
    /// (an unknown or down node, a node twice, none at all).
    InvalidReplicaAssignment = 44,
    /// No such user, or no credential of that mechanism.
    ResourceNotFound = 45,
    /// The same user (and mechanism) is named twice in one request.
    DuplicateResource = 46,
    /// A credential the broker does not accept (iterations out of range, an
    /// empty salt or user name).
    UnacceptableCredential = 47,
    /// A SASL mechanism the broker does not serve.
    UnsupportedSaslMechanism = 48,
    /// The principal may not do this to the topic (ACLs).
    TopicAuthorizationFailed = 49,
    /// The principal may not do this to the consumer group (ACLs).
    GroupAuthorizationFailed = 50,
    /// The principal may not do this to the cluster (ACLs).
    ClusterAuthorizationFailed = 51,
    /// ACLs cannot be changed: the broker runs without an authorizer.
    SecurityDisabled = 52,
    /// A SASL login failed (wrong user or password, a malformed token).
    SaslAuthenticationFailed = 53,
    /// The request does not fit the transaction's state (nothing open to
    /// abort, …).
    InvalidTxnState = 54,
    /// No transactional id of that name.
    TransactionalIdNotFound = 55,
    /// The transactional id's previous transaction is still ending: retry.
    ConcurrentTransactions = 56,
    /// No share session of this member with this core: open one (epoch 0).
    ShareSessionNotFound = 57,
    /// The share session's epoch is another.
    InvalidShareSessionEpoch = 58,
    /// The core keeps as many share sessions as it may: retry later.
    ShareSessionLimitReached = 59,
    /// An acknowledgement of records not acquired by this member (never acquired, acquired by another, or whose lock expired): nothing of it applied.
    InvalidRecordState = 60,
    /// The group has as many members as it may.
    GroupMaxSizeReached = 61,
    /// The group id is another kind of group's (a share group's id used by a consumer group, or the reverse).
    InconsistentGroupProtocol = 62,
    /// A read from the remote tier (tiered storage) failed or timed out:
    /// retry (Kafka's KAFKA_STORAGE_ERROR for such a read).
    RemoteStorageError = 63,
}

impl ErrorCode {
    /// Every code, in numeric order.
    pub const ALL: [ErrorCode; 58] = [
        ErrorCode::None,
        ErrorCode::Unknown,
        ErrorCode::CorruptMessage,
        ErrorCode::UnknownTopicOrPartition,
        ErrorCode::OffsetOutOfRange,
        ErrorCode::MessageTooLarge,
        ErrorCode::InvalidRequest,
        ErrorCode::UnsupportedVersion,
        ErrorCode::UnsupportedApi,
        ErrorCode::FrameTooLarge,
        ErrorCode::TopicAlreadyExists,
        ErrorCode::InvalidConfig,
        ErrorCode::InvalidPartitions,
        ErrorCode::NotOwner,
        ErrorCode::RequestTimedOut,
        ErrorCode::StorageError,
        ErrorCode::NotEnoughReplicas,
        ErrorCode::PolicyViolation,
        ErrorCode::InvalidTopic,
        ErrorCode::Recovering,
        ErrorCode::OutOfOrderSequence,
        ErrorCode::InvalidProducerEpoch,
        ErrorCode::UnknownProducerId,
        ErrorCode::InvalidRecord,
        ErrorCode::UnknownMemberId,
        ErrorCode::IllegalGeneration,
        ErrorCode::GroupNotEmpty,
        ErrorCode::GroupIdNotFound,
        ErrorCode::InvalidGroupId,
        ErrorCode::InconsistentAssignor,
        ErrorCode::InvalidSessionTimeout,
        ErrorCode::FencedMemberEpoch,
        ErrorCode::StaleMemberEpoch,
        ErrorCode::RebalanceInProgress,
        ErrorCode::FencedInstanceId,
        ErrorCode::NotLeader,
        ErrorCode::NotCoordinator,
        ErrorCode::InvalidReplicationFactor,
        ErrorCode::InvalidReplicaAssignment,
        ErrorCode::ResourceNotFound,
        ErrorCode::DuplicateResource,
        ErrorCode::UnacceptableCredential,
        ErrorCode::UnsupportedSaslMechanism,
        ErrorCode::TopicAuthorizationFailed,
        ErrorCode::GroupAuthorizationFailed,
        ErrorCode::ClusterAuthorizationFailed,
        ErrorCode::SecurityDisabled,
        ErrorCode::SaslAuthenticationFailed,
        ErrorCode::InvalidTxnState,
        ErrorCode::TransactionalIdNotFound,
        ErrorCode::ConcurrentTransactions,
        ErrorCode::ShareSessionNotFound,
        ErrorCode::InvalidShareSessionEpoch,
        ErrorCode::ShareSessionLimitReached,
        ErrorCode::InvalidRecordState,
        ErrorCode::GroupMaxSizeReached,
        ErrorCode::InconsistentGroupProtocol,
        ErrorCode::RemoteStorageError,
    ];

    /// The number on the wire.
    pub const fn as_u16(self) -> u16 {
        self as u16
    }

    /// The code for a number read from the wire. Numbers this build does
    /// not know map to [`ErrorCode::Unknown`]; never panics.
    pub const fn from_u16(n: u16) -> ErrorCode {
        match n {
            0 => ErrorCode::None,
            2 => ErrorCode::CorruptMessage,
            3 => ErrorCode::UnknownTopicOrPartition,
            4 => ErrorCode::OffsetOutOfRange,
            5 => ErrorCode::MessageTooLarge,
            6 => ErrorCode::InvalidRequest,
            7 => ErrorCode::UnsupportedVersion,
            8 => ErrorCode::UnsupportedApi,
            9 => ErrorCode::FrameTooLarge,
            10 => ErrorCode::TopicAlreadyExists,
            11 => ErrorCode::InvalidConfig,
            12 => ErrorCode::InvalidPartitions,
            13 => ErrorCode::NotOwner,
            14 => ErrorCode::RequestTimedOut,
            15 => ErrorCode::StorageError,
            16 => ErrorCode::NotEnoughReplicas,
            17 => ErrorCode::PolicyViolation,
            18 => ErrorCode::InvalidTopic,
            19 => ErrorCode::Recovering,
            20 => ErrorCode::OutOfOrderSequence,
            21 => ErrorCode::InvalidProducerEpoch,
            22 => ErrorCode::UnknownProducerId,
            23 => ErrorCode::InvalidRecord,
            30 => ErrorCode::UnknownMemberId,
            31 => ErrorCode::IllegalGeneration,
            32 => ErrorCode::GroupNotEmpty,
            33 => ErrorCode::GroupIdNotFound,
            34 => ErrorCode::InvalidGroupId,
            35 => ErrorCode::InconsistentAssignor,
            36 => ErrorCode::InvalidSessionTimeout,
            37 => ErrorCode::FencedMemberEpoch,
            38 => ErrorCode::StaleMemberEpoch,
            39 => ErrorCode::RebalanceInProgress,
            40 => ErrorCode::FencedInstanceId,
            41 => ErrorCode::NotLeader,
            42 => ErrorCode::NotCoordinator,
            43 => ErrorCode::InvalidReplicationFactor,
            44 => ErrorCode::InvalidReplicaAssignment,
            45 => ErrorCode::ResourceNotFound,
            46 => ErrorCode::DuplicateResource,
            47 => ErrorCode::UnacceptableCredential,
            48 => ErrorCode::UnsupportedSaslMechanism,
            49 => ErrorCode::TopicAuthorizationFailed,
            50 => ErrorCode::GroupAuthorizationFailed,
            51 => ErrorCode::ClusterAuthorizationFailed,
            52 => ErrorCode::SecurityDisabled,
            53 => ErrorCode::SaslAuthenticationFailed,
            54 => ErrorCode::InvalidTxnState,
            55 => ErrorCode::TransactionalIdNotFound,
            56 => ErrorCode::ConcurrentTransactions,
            57 => ErrorCode::ShareSessionNotFound,
            58 => ErrorCode::InvalidShareSessionEpoch,
            59 => ErrorCode::ShareSessionLimitReached,
            60 => ErrorCode::InvalidRecordState,
            61 => ErrorCode::GroupMaxSizeReached,
            62 => ErrorCode::InconsistentGroupProtocol,
            63 => ErrorCode::RemoteStorageError,
            _ => ErrorCode::Unknown,
        }
    }

    /// `true` for [`ErrorCode::None`].
    pub const fn is_none(self) -> bool {
        matches!(self, ErrorCode::None)
    }

    /// Whether the same request may succeed if sent again later, unchanged
    /// (possibly to another core, for [`ErrorCode::NotOwner`], after
    /// refreshing metadata).
    pub const fn is_retriable(self) -> bool {
        matches!(
            self,
            ErrorCode::NotOwner
                | ErrorCode::NotLeader
                | ErrorCode::NotCoordinator
                | ErrorCode::RequestTimedOut
                | ErrorCode::NotEnoughReplicas
                | ErrorCode::Recovering
                | ErrorCode::ConcurrentTransactions
                | ErrorCode::ShareSessionLimitReached
                | ErrorCode::RemoteStorageError
        )
    }

    /// The variant's name, e.g. `"UnknownTopicOrPartition"`.
    pub const fn name(self) -> &'static str {
        match self {
            ErrorCode::None => "None",
            ErrorCode::Unknown => "Unknown",
            ErrorCode::CorruptMessage => "CorruptMessage",
            ErrorCode::UnknownTopicOrPartition => "UnknownTopicOrPartition",
            ErrorCode::OffsetOutOfRange => "OffsetOutOfRange",
            ErrorCode::MessageTooLarge => "MessageTooLarge",
            ErrorCode::InvalidRequest => "InvalidRequest",
            ErrorCode::UnsupportedVersion => "UnsupportedVersion",
            ErrorCode::UnsupportedApi => "UnsupportedApi",
            ErrorCode::FrameTooLarge => "FrameTooLarge",
            ErrorCode::TopicAlreadyExists => "TopicAlreadyExists",
            ErrorCode::InvalidConfig => "InvalidConfig",
            ErrorCode::InvalidPartitions => "InvalidPartitions",
            ErrorCode::NotOwner => "NotOwner",
            ErrorCode::NotLeader => "NotLeader",
            ErrorCode::NotCoordinator => "NotCoordinator",
            ErrorCode::InvalidReplicationFactor => "InvalidReplicationFactor",
            ErrorCode::InvalidReplicaAssignment => "InvalidReplicaAssignment",
            ErrorCode::ResourceNotFound => "ResourceNotFound",
            ErrorCode::DuplicateResource => "DuplicateResource",
            ErrorCode::UnacceptableCredential => "UnacceptableCredential",
            ErrorCode::UnsupportedSaslMechanism => "UnsupportedSaslMechanism",
            ErrorCode::TopicAuthorizationFailed => "TopicAuthorizationFailed",
            ErrorCode::GroupAuthorizationFailed => "GroupAuthorizationFailed",
            ErrorCode::ClusterAuthorizationFailed => "ClusterAuthorizationFailed",
            ErrorCode::SecurityDisabled => "SecurityDisabled",
            ErrorCode::SaslAuthenticationFailed => "SaslAuthenticationFailed",
            ErrorCode::RequestTimedOut => "RequestTimedOut",
            ErrorCode::StorageError => "StorageError",
            ErrorCode::NotEnoughReplicas => "NotEnoughReplicas",
            ErrorCode::PolicyViolation => "PolicyViolation",
            ErrorCode::InvalidTopic => "InvalidTopic",
            ErrorCode::Recovering => "Recovering",
            ErrorCode::OutOfOrderSequence => "OutOfOrderSequence",
            ErrorCode::InvalidProducerEpoch => "InvalidProducerEpoch",
            ErrorCode::UnknownProducerId => "UnknownProducerId",
            ErrorCode::InvalidRecord => "InvalidRecord",
            ErrorCode::UnknownMemberId => "UnknownMemberId",
            ErrorCode::IllegalGeneration => "IllegalGeneration",
            ErrorCode::GroupNotEmpty => "GroupNotEmpty",
            ErrorCode::GroupIdNotFound => "GroupIdNotFound",
            ErrorCode::InvalidGroupId => "InvalidGroupId",
            ErrorCode::InconsistentAssignor => "InconsistentAssignor",
            ErrorCode::InvalidSessionTimeout => "InvalidSessionTimeout",
            ErrorCode::FencedMemberEpoch => "FencedMemberEpoch",
            ErrorCode::StaleMemberEpoch => "StaleMemberEpoch",
            ErrorCode::RebalanceInProgress => "RebalanceInProgress",
            ErrorCode::FencedInstanceId => "FencedInstanceId",
            ErrorCode::InvalidTxnState => "InvalidTxnState",
            ErrorCode::TransactionalIdNotFound => "TransactionalIdNotFound",
            ErrorCode::ConcurrentTransactions => "ConcurrentTransactions",
            ErrorCode::ShareSessionNotFound => "ShareSessionNotFound",
            ErrorCode::InvalidShareSessionEpoch => "InvalidShareSessionEpoch",
            ErrorCode::ShareSessionLimitReached => "ShareSessionLimitReached",
            ErrorCode::InvalidRecordState => "InvalidRecordState",
            ErrorCode::GroupMaxSizeReached => "GroupMaxSizeReached",
            ErrorCode::InconsistentGroupProtocol => "InconsistentGroupProtocol",
            ErrorCode::RemoteStorageError => "RemoteStorageError",
        }
    }

    /// A short, human-readable description.
    pub const fn description(self) -> &'static str {
        match self {
            ErrorCode::None => "no error",
            ErrorCode::Unknown => "unknown error",
            ErrorCode::CorruptMessage => "corrupt record batch",
            ErrorCode::UnknownTopicOrPartition => "unknown topic or partition",
            ErrorCode::OffsetOutOfRange => "offset out of range",
            ErrorCode::MessageTooLarge => "message too large",
            ErrorCode::InvalidRequest => "invalid request",
            ErrorCode::UnsupportedVersion => "unsupported api version",
            ErrorCode::UnsupportedApi => "unsupported api",
            ErrorCode::FrameTooLarge => "frame too large",
            ErrorCode::TopicAlreadyExists => "topic already exists",
            ErrorCode::InvalidConfig => "invalid config",
            ErrorCode::InvalidPartitions => "invalid partition count",
            ErrorCode::NotOwner => "partition owned by another core",
            ErrorCode::NotLeader => "partition served by another node",
            ErrorCode::NotCoordinator => "group coordinated by another node",
            ErrorCode::InvalidReplicationFactor => "invalid replication factor",
            ErrorCode::InvalidReplicaAssignment => "invalid replica assignment",
            ErrorCode::ResourceNotFound => "resource not found",
            ErrorCode::DuplicateResource => "duplicate resource",
            ErrorCode::UnacceptableCredential => "unacceptable credential",
            ErrorCode::UnsupportedSaslMechanism => "unsupported SASL mechanism",
            ErrorCode::TopicAuthorizationFailed => "topic authorization failed",
            ErrorCode::GroupAuthorizationFailed => "group authorization failed",
            ErrorCode::ClusterAuthorizationFailed => "cluster authorization failed",
            ErrorCode::SecurityDisabled => "security disabled",
            ErrorCode::SaslAuthenticationFailed => "SASL authentication failed",
            ErrorCode::RequestTimedOut => "request timed out",
            ErrorCode::StorageError => "storage error",
            ErrorCode::NotEnoughReplicas => "not enough replicas",
            ErrorCode::PolicyViolation => "policy violation",
            ErrorCode::InvalidTopic => "invalid topic name",
            ErrorCode::Recovering => "partition is recovering",
            ErrorCode::OutOfOrderSequence => "out-of-order sequence number",
            ErrorCode::InvalidProducerEpoch => "producer fenced by a newer epoch",
            ErrorCode::UnknownProducerId => "unknown producer id",
            ErrorCode::InvalidRecord => "invalid record",
            ErrorCode::UnknownMemberId => "unknown group member",
            ErrorCode::IllegalGeneration => "stale generation or partition not assigned",
            ErrorCode::GroupNotEmpty => "the group has active members",
            ErrorCode::GroupIdNotFound => "unknown group",
            ErrorCode::InvalidGroupId => "invalid group id",
            ErrorCode::InconsistentAssignor => "assignor differs from the group's",
            ErrorCode::InvalidSessionTimeout => "invalid session timeout",
            ErrorCode::FencedMemberEpoch => "fenced member epoch",
            ErrorCode::StaleMemberEpoch => "stale member epoch",
            ErrorCode::RebalanceInProgress => "rebalance in progress",
            ErrorCode::FencedInstanceId => "fenced instance id",
            ErrorCode::InvalidTxnState => "invalid transaction state",
            ErrorCode::TransactionalIdNotFound => "unknown transactional id",
            ErrorCode::ConcurrentTransactions => "the previous transaction is still ending",
            ErrorCode::ShareSessionNotFound => "no share session",
            ErrorCode::InvalidShareSessionEpoch => "invalid share session epoch",
            ErrorCode::ShareSessionLimitReached => "share session limit reached",
            ErrorCode::InvalidRecordState => "records not acquired by this member",
            ErrorCode::GroupMaxSizeReached => "group full",
            ErrorCode::InconsistentGroupProtocol => "group of another type",
            ErrorCode::RemoteStorageError => "the remote tier could not be read",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

impl From<ErrorCode> for u16 {
    fn from(code: ErrorCode) -> u16 {
        code.as_u16()
    }
}

impl From<u16> for ErrorCode {
    fn from(n: u16) -> ErrorCode {
        ErrorCode::from_u16(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_numeric_order_and_round_trips() {
        for w in ErrorCode::ALL.windows(2) {
            assert!(w[0].as_u16() < w[1].as_u16());
        }
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_u16(code.as_u16()), code);
        }
        // Reserved and unknown numbers read as Unknown.
        assert_eq!(ErrorCode::from_u16(24), ErrorCode::Unknown);
        assert_eq!(ErrorCode::from_u16(1000), ErrorCode::Unknown);
    }
}
