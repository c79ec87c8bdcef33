//! API keys of the native protocol and the versions this build supports.
//!
//! Every request frame names its API (`api_key`) and the version of that
//! API's body (`api_version`). Keys are stable and never reused; versions
//! start at 0 and grow when an API's body changes shape. A server answers a
//! version outside [`ApiKey::min_version`]`..=`[`ApiKey::max_version`] with
//! [`crate::error_code::ErrorCode::UnsupportedVersion`] and an unknown key
//! with [`crate::error_code::ErrorCode::UnsupportedApi`]; a client learns the
//! ranges with an `ApiVersions` request.

use std::fmt;

use crate::messages::ApiVersionRange;

/// An API of the native protocol. The discriminant is the key on the wire.
///
/// Stable: a key keeps its meaning forever and is never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
#[non_exhaustive]
pub enum ApiKey {
    /// Which APIs and versions the server supports.
    ApiVersions = 0,
    /// Cores (listeners) and topics with their partitions' owning cores.
    Metadata = 1,
    /// Create topics.
    CreateTopics = 2,
    /// Delete topics.
    DeleteTopics = 3,
    /// Read topic configs and partition sizes/offsets.
    DescribeConfigs = 4,
    /// Change topic configs.
    AlterConfigs = 5,
    /// Grow topics' partition counts.
    CreatePartitions = 6,
    /// Append record batches.
    Produce = 7,
    /// Read record batches.
    Fetch = 8,
    /// Look up offsets (earliest, latest, by timestamp).
    ListOffsets = 9,
    /// Hands out an idempotent producer's id and epoch.
    InitProducerId = 10,
    /// Runs a cleaner pass on a compacted topic now, or reports where
    /// compaction stands (dirty ratios).
    Compact = 11,
    /// Joins a consumer group (or updates a member's subscription).
    JoinGroup = 12,
    /// Keeps a group member alive, reports the partitions it owns and
    /// answers with the partitions it may own (Kafka's SyncGroup folded in:
    /// the broker computes assignments).
    Heartbeat = 13,
    /// Leaves a consumer group.
    LeaveGroup = 14,
    /// Commits offsets of a group.
    OffsetCommit = 15,
    /// Reads a group's committed offsets.
    OffsetFetch = 16,
    /// Lists the consumer groups.
    ListGroups = 17,
    /// Describes one consumer group: state, members, committed offsets.
    DescribeGroup = 18,
    /// Deletes an empty consumer group and its committed offsets.
    DeleteGroup = 19,
    /// The cluster as the answering node sees it: nodes, controller
    /// leader, metadata version.
    DescribeCluster = 20,
    /// Adds a node to the controller voters, or removes one.
    ChangeVoters = 21,
    /// Where a consumer group's coordinator is: the node and core holding
    /// its partition of `__consumer_offsets`.
    FindCoordinator = 22,
    /// Moves partitions' replicas to other nodes.
    ReassignPartitions = 23,
    /// Lists users and the SCRAM mechanisms they have credentials for.
    DescribeUsers = 24,
    /// Sets and removes users' SCRAM credentials.
    AlterUsers = 25,
    /// Lists the ACLs a filter matches.
    DescribeAcls = 26,
    /// Adds ACLs.
    CreateAcls = 27,
    /// Removes the ACLs filters match.
    DeleteAcls = 28,
    /// Chooses the SASL mechanism of a login (SASL_* listeners).
    SaslHandshake = 29,
    /// One step of a SASL login.
    SaslAuthenticate = 30,
    /// Lists the client quotas a filter matches.
    DescribeClientQuotas = 31,
    /// Sets and removes client quotas.
    AlterClientQuotas = 32,
    /// The transactions this node coordinates (all, or the ids asked for).
    ListTransactions = 33,
    /// Aborts a transactional id's open transaction (an operator's
    /// `weir txn abort`), fencing its producer.
    AbortTransaction = 34,
    /// The producers a partition's leader remembers (ids, epochs, last
    /// sequences, open transactions).
    DescribeProducers = 35,
    /// Adds partitions to a transactional producer's open transaction.
    AddPartitionsToTxn = 36,
    /// Adds a group's offsets to the open transaction.
    AddOffsetsToTxn = 37,
    /// Commits or aborts the open transaction.
    EndTxn = 38,
    /// Commits offsets as part of the open transaction.
    TxnOffsetCommit = 39,
    /// A share group member's heartbeat: joins, keeps alive, leaves
    /// (epoch -1), and answers the partitions it reads (KIP-932).
    ShareGroupHeartbeat = 40,
    /// Acquires records of a share group's partitions on the core that
    /// owns them (acknowledging earlier ones on the way).
    ShareFetch = 41,
    /// Acknowledges acquired records (accept, release, reject) without
    /// acquiring more.
    ShareAcknowledge = 42,
    /// Moves or forgets an empty share group's share-partition starts
    /// (Kafka's AlterShareGroupOffsets / DeleteShareGroupOffsets).
    AlterShareOffsets = 43,
}

impl ApiKey {
    /// Every API, in key order.
    pub const ALL: [ApiKey; 44] = [
        ApiKey::ApiVersions,
        ApiKey::Metadata,
        ApiKey::CreateTopics,
        ApiKey::DeleteTopics,
        ApiKey::DescribeConfigs,
        ApiKey::AlterConfigs,
        ApiKey::CreatePartitions,
        ApiKey::Produce,
        ApiKey::Fetch,
        ApiKey::ListOffsets,
        ApiKey::InitProducerId,
        ApiKey::Compact,
        ApiKey::JoinGroup,
        ApiKey::Heartbeat,
        ApiKey::LeaveGroup,
        ApiKey::OffsetCommit,
        ApiKey::OffsetFetch,
        ApiKey::ListGroups,
        ApiKey::DescribeGroup,
        ApiKey::DeleteGroup,
        ApiKey::DescribeCluster,
        ApiKey::ChangeVoters,
        ApiKey::FindCoordinator,
        ApiKey::ReassignPartitions,
        ApiKey::DescribeUsers,
        ApiKey::AlterUsers,
        ApiKey::DescribeAcls,
        ApiKey::CreateAcls,
        ApiKey::DeleteAcls,
        ApiKey::SaslHandshake,
        ApiKey::SaslAuthenticate,
        ApiKey::DescribeClientQuotas,
        ApiKey::AlterClientQuotas,
        ApiKey::ListTransactions,
        ApiKey::AbortTransaction,
        ApiKey::DescribeProducers,
        ApiKey::AddPartitionsToTxn,
        ApiKey::AddOffsetsToTxn,
        ApiKey::EndTxn,
        ApiKey::TxnOffsetCommit,
        ApiKey::ShareGroupHeartbeat,
        ApiKey::ShareFetch,
        ApiKey::ShareAcknowledge,
        ApiKey::AlterShareOffsets,
    ];

    /// The key on the wire.
    pub const fn as_u16(self) -> u16 {
        self as u16
    }

    /// The API for a key read from the wire; `None` for a key this build
    /// does not know.
    pub const fn from_u16(key: u16) -> Option<ApiKey> {
        Some(match key {
            0 => ApiKey::ApiVersions,
            1 => ApiKey::Metadata,
            2 => ApiKey::CreateTopics,
            3 => ApiKey::DeleteTopics,
            4 => ApiKey::DescribeConfigs,
            5 => ApiKey::AlterConfigs,
            6 => ApiKey::CreatePartitions,
            7 => ApiKey::Produce,
            8 => ApiKey::Fetch,
            9 => ApiKey::ListOffsets,
            10 => ApiKey::InitProducerId,
            11 => ApiKey::Compact,
            12 => ApiKey::JoinGroup,
            13 => ApiKey::Heartbeat,
            14 => ApiKey::LeaveGroup,
            15 => ApiKey::OffsetCommit,
            16 => ApiKey::OffsetFetch,
            17 => ApiKey::ListGroups,
            18 => ApiKey::DescribeGroup,
            19 => ApiKey::DeleteGroup,
            20 => ApiKey::DescribeCluster,
            21 => ApiKey::ChangeVoters,
            22 => ApiKey::FindCoordinator,
            23 => ApiKey::ReassignPartitions,
            24 => ApiKey::DescribeUsers,
            25 => ApiKey::AlterUsers,
            26 => ApiKey::DescribeAcls,
            27 => ApiKey::CreateAcls,
            28 => ApiKey::DeleteAcls,
            29 => ApiKey::SaslHandshake,
            30 => ApiKey::SaslAuthenticate,
            31 => ApiKey::DescribeClientQuotas,
            32 => ApiKey::AlterClientQuotas,
            33 => ApiKey::ListTransactions,
            34 => ApiKey::AbortTransaction,
            35 => ApiKey::DescribeProducers,
            36 => ApiKey::AddPartitionsToTxn,
            37 => ApiKey::AddOffsetsToTxn,
            38 => ApiKey::EndTxn,
            39 => ApiKey::TxnOffsetCommit,
            40 => ApiKey::ShareGroupHeartbeat,
            41 => ApiKey::ShareFetch,
            42 => ApiKey::ShareAcknowledge,
            43 => ApiKey::AlterShareOffsets,
            _ => return None,
        })
    }

    /// The API's name, e.g. `"Produce"`.
    pub const fn name(self) -> &'static str {
        match self {
            ApiKey::ApiVersions => "ApiVersions",
            ApiKey::Metadata => "Metadata",
            ApiKey::CreateTopics => "CreateTopics",
            ApiKey::DeleteTopics => "DeleteTopics",
            ApiKey::DescribeConfigs => "DescribeConfigs",
            ApiKey::AlterConfigs => "AlterConfigs",
            ApiKey::CreatePartitions => "CreatePartitions",
            ApiKey::Produce => "Produce",
            ApiKey::Fetch => "Fetch",
            ApiKey::ListOffsets => "ListOffsets",
            ApiKey::InitProducerId => "InitProducerId",
            ApiKey::Compact => "Compact",
            ApiKey::JoinGroup => "JoinGroup",
            ApiKey::Heartbeat => "Heartbeat",
            ApiKey::LeaveGroup => "LeaveGroup",
            ApiKey::OffsetCommit => "OffsetCommit",
            ApiKey::OffsetFetch => "OffsetFetch",
            ApiKey::ListGroups => "ListGroups",
            ApiKey::DescribeGroup => "DescribeGroup",
            ApiKey::DeleteGroup => "DeleteGroup",
            ApiKey::DescribeCluster => "DescribeCluster",
            ApiKey::ChangeVoters => "ChangeVoters",
            ApiKey::FindCoordinator => "FindCoordinator",
            ApiKey::ReassignPartitions => "ReassignPartitions",
            ApiKey::DescribeUsers => "DescribeUsers",
            ApiKey::AlterUsers => "AlterUsers",
            ApiKey::DescribeAcls => "DescribeAcls",
            ApiKey::CreateAcls => "CreateAcls",
            ApiKey::DeleteAcls => "DeleteAcls",
            ApiKey::SaslHandshake => "SaslHandshake",
            ApiKey::SaslAuthenticate => "SaslAuthenticate",
            ApiKey::DescribeClientQuotas => "DescribeClientQuotas",
            ApiKey::AlterClientQuotas => "AlterClientQuotas",
            ApiKey::ListTransactions => "ListTransactions",
            ApiKey::AbortTransaction => "AbortTransaction",
            ApiKey::DescribeProducers => "DescribeProducers",
            ApiKey::AddPartitionsToTxn => "AddPartitionsToTxn",
            ApiKey::AddOffsetsToTxn => "AddOffsetsToTxn",
            ApiKey::EndTxn => "EndTxn",
            ApiKey::TxnOffsetCommit => "TxnOffsetCommit",
            ApiKey::ShareGroupHeartbeat => "ShareGroupHeartbeat",
            ApiKey::ShareFetch => "ShareFetch",
            ApiKey::ShareAcknowledge => "ShareAcknowledge",
            ApiKey::AlterShareOffsets => "AlterShareOffsets",
        }
    }

    /// The one version of this API this build speaks: an API whose body
    /// changes shape moves to the next version and drops the older
    /// (pre-1.0: client and broker ship together).
    pub const fn version(self) -> u16 {
        match self {
            // DescribeGroup v1: members with epochs and revoking
            // partitions. CreateTopics v1: a replication factor per topic.
            // ListOffsets v1: read_committed (the last stable offset).
            // FindCoordinator,
            // InitProducerId and Produce v1: transactional ids.
            ApiKey::DescribeGroup
            | ApiKey::CreateTopics
            | ApiKey::ListOffsets
            | ApiKey::FindCoordinator
            | ApiKey::InitProducerId
            | ApiKey::Produce => 1,
            // v1: leader, epoch, replicas and ISR per partition; v2: the
            // target of a reassignment under way; v3: the local log start
            // and the remote tier's bytes and segments (tiered storage).
            ApiKey::DescribeConfigs => 3,
            // v1: the acquire mode (KIP-1206's record_limit); v2:
            // acknowledgements answered later (`acks_later`).
            ApiKey::ShareFetch => 2,
            // v1: read_committed, the last stable offset and the aborted
            // transactions; v2: `FetchPartition::CONTINUE` and the offset
            // each partition was read from.
            ApiKey::Fetch => 2,
            _ => 0,
        }
    }

    /// Oldest version of this API this build speaks ([`ApiKey::version`]).
    pub const fn min_version(self) -> u16 {
        self.version()
    }

    /// Newest version of this API this build speaks ([`ApiKey::version`]).
    pub const fn max_version(self) -> u16 {
        self.version()
    }

    /// Whether this build speaks `version` of this API.
    pub const fn supports(self, version: u16) -> bool {
        version >= self.min_version() && version <= self.max_version()
    }

    /// This API's supported range, as an `ApiVersions` response lists it.
    pub fn version_range(self) -> ApiVersionRange {
        ApiVersionRange {
            api_key: self.as_u16(),
            min: self.min_version(),
            max: self.max_version(),
        }
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The supported version range of every API, in key order: the body of the
/// `ApiVersions` response this build sends.
pub fn supported_apis() -> Vec<ApiVersionRange> {
    ApiKey::ALL.iter().map(|k| k.version_range()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_ordered_and_round_trip() {
        for w in ApiKey::ALL.windows(2) {
            assert!(w[0].as_u16() < w[1].as_u16());
        }
        for k in ApiKey::ALL {
            assert_eq!(ApiKey::from_u16(k.as_u16()), Some(k));
        }
        let last = ApiKey::ALL[ApiKey::ALL.len() - 1].as_u16();
        for key in 0..=last + 1 {
            if let Some(k) = ApiKey::from_u16(key) {
                assert!(ApiKey::ALL.contains(&k));
            }
        }
        assert_eq!(ApiKey::from_u16(last + 1), None);
        assert_eq!(ApiKey::from_u16(u16::MAX), None);
    }
}
