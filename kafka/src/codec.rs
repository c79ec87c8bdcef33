//! The Kafka codec: request frames in, typed requests out; typed
//! responses in, frames out. Pure: no I/O, no async.
//!
//! Built on the `kafka-protocol` crate (schemas of Kafka 4.1, flexible
//! versions, tagged fields). What this module adds around it:
//!
//! * **Version policy.** [`SUPPORTED`] is the one table of what the listener
//!   advertises and accepts; every other API or version is refused before its
//!   body is read ([`DecodeError::UnsupportedApi`],
//!   [`DecodeError::UnsupportedVersion`]). [`error_response`] builds the answer
//!   Kafka gives where it gives one (the ApiVersions v0 fallback, top-level
//!   error codes), else the caller closes the connection, as Kafka does.
//! * **Hostile input.** `kafka-protocol` reserves `Vec::with_capacity(n)` for
//!   an array from the length on the wire (`i32` or unsigned varint), before
//!   reading any element: a 20-byte frame could make it reserve hundreds of
//!   GiB, and a failed allocation aborts the process. Strings and bytes are
//!   not a problem (they are checked slices of the frame). The frame is
//!   therefore decoded through `Guarded`, a buffer that sees every length
//!   before the decoder acts on it: no array can be declared longer than the
//!   bytes left in the frame (plus [`VARINT_LENGTH_SLACK`] in flexible
//!   versions), so an array reserves at most that many elements (of at most
//!   ~120 bytes each in the served requests), and the frame is bounded by
//!   [`MAX_REQUEST_FRAME_BYTES`]. No decode path panics.
//! * **Zero copy.** Produce record batches come out as `Bytes` slices of the
//!   request frame; a Fetch response is encoded as segments in which every
//!   partition's records are the caller's `Bytes`, untouched
//!   ([`encode_fetch_response`]).
//!
//! Frames here are the bytes after Kafka's 4-byte size prefix on the way in;
//! encoded responses include the prefix.

use std::fmt;
use std::ops::Range;

use bytes::buf::UninitSlice;
use bytes::{Buf, BufMut, Bytes, BytesMut, TryGetError};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, EndTxnRequest, EndTxnResponse, TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
};
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse,
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteGroupsRequest, DeleteGroupsResponse, DeleteRecordsRequest, DeleteRecordsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse, DescribeClusterRequest, DescribeClusterResponse,
    DescribeConfigsRequest, DescribeConfigsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    FetchRequest, FetchResponse, FindCoordinatorRequest, FindCoordinatorResponse, HeartbeatRequest,
    HeartbeatResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
    InitProducerIdRequest, InitProducerIdResponse, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse,
    ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, ProduceRequest, ProduceResponse,
    RequestHeader, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::messages::{
    DescribeProducersRequest, DescribeProducersResponse, DescribeTransactionsRequest,
    DescribeTransactionsResponse, ListTransactionsRequest, ListTransactionsResponse,
};
use kafka_protocol::messages::{
    DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsResponse, ShareGroupDescribeRequest,
    ShareGroupDescribeResponse,
};
use kafka_protocol::messages::{
    ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest, ShareFetchResponse,
    ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse,
};
use kafka_protocol::protocol::buf::{ByteBuf, ByteBufMut};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion};
use kafka_protocol::ResponseError;

use crate::legacy::{self, Legacy};

// ---------------------------------------------------------------------------
// Bounds
// ---------------------------------------------------------------------------

/// The largest request frame accepted (bytes after the size prefix): Kafka's
/// `socket.request.max.bytes` default (not above the broker's
/// `--max-frame-bytes` default: the broker's `server::limits` checks it).
/// Everything a decode reserves is bounded by the frame's size.
pub const MAX_REQUEST_FRAME_BYTES: usize = 100 << 20;
/// The largest response frame (bytes after the size prefix): the prefix is
/// an `i32`.
pub const MAX_RESPONSE_FRAME_BYTES: usize = i32::MAX as usize;
/// Bytes of the size prefix in front of every frame.
pub const SIZE_PREFIX_BYTES: usize = 4;
/// The shortest request frame: api key, api version, correlation id and the
/// client id's length (request header v1; v0 is not spoken).
pub const MIN_REQUEST_FRAME_BYTES: usize = 10;
/// How far an unsigned varint may exceed the bytes left in the frame.
///
/// In flexible versions every varint is a length, a tagged-field count, a
/// tag or a tagged-field size, and only a tag may legitimately exceed the
/// bytes that follow it (Kafka's tags are below 10 today). A varint over the
/// bytes left plus this slack fails the decode; so an array reserves at most
/// `(bytes left + slack)` elements.
pub const VARINT_LENGTH_SLACK: usize = 1024;

pub use crate::error::UNSUPPORTED_VERSION;
/// Kafka's INVALID_REQUEST error code.
pub const INVALID_REQUEST: i16 = ResponseError::InvalidRequest.code();

/// Offset of the correlation id in a request frame (a plain `i32`, never a
/// length).
const CORRELATION_ID_OFFSET: usize = 4;
/// What [`Guarded`] hands the decoder instead of an `i32` that cannot be a
/// length: negative and not -1 (null), so an array or bytes length fails.
const POISON_LENGTH: i32 = -2;

// ---------------------------------------------------------------------------
// Advertised versions
// ---------------------------------------------------------------------------

/// Every API the listener serves, as `(api key, min version, max version)`:
/// what ApiVersions advertises and what [`decode_request`] accepts.
///
/// Floors are the lowest version a client in the field still sends: Kafka
/// 4's floors (KIP-896 dropped the pre-2.1 versions, `kafka-protocol`'s
/// floors), lower where an old version differs only in shape and old
/// clients still send it (served through `kafka_legacy`). Ceilings are the highest version a current client
/// negotiates: Kafka 4.1's stable latest (a Java 4.1 client uses it), capped
/// where `kafka-protocol` (generated from 4.1.0, unstable versions included)
/// goes past a stable version. Clients checked: librdkafka 2.0–2.15 (Debian
/// 12's kcat 1.7.1 runs on 2.0.2; confluent-kafka), kafka-python 2.0–2.3
/// (Debian 12 has 2.0.2), aiokafka 0.12–0.14, Java 3.x/4.x. Transactions:
/// the v1 client flow (no KIP-890 v2 EndTxn).
pub const SUPPORTED: &[(i16, i16, i16)] = &[
    // v0 is what kafka-python 2.0 and aiokafka send first; librdkafka sends
    // v3 (2.x), Java 4.x and kafka-python 2.1+ v4. Above 4 gets the v0
    // fallback (see `error_response`).
    (ApiKey::ApiVersions as i16, 0, 4),
    // aiokafka 0.12 bootstraps with v0 and then uses v1, kafka-python 2.0
    // v1; librdkafka 2.0 up to 4, 2.3+ up to 12 (topic ids from v10, needed
    // for its Fetch v13+), 2.15 13; v13 adds a top-level error (KIP-1102).
    (ApiKey::Metadata as i16, 0, 13),
    // v3 is the first with record batch v2 (librdkafka's MSGVER2 needs
    // Produce 3+, its ZSTD feature 7+); kafka-python/aiokafka send v7,
    // librdkafka 2.0–2.3 up to 7, 2.6+ up to 10. v13 (Java 4.1+) names
    // topics by id (KIP-516). Advertised from v0 (KAFKA-18659, see
    // `kafka_legacy`); v0–2 are refused partition by partition.
    (ApiKey::Produce as i16, 3, 13),
    // v4 is what kafka-python 2.0 and aiokafka 0.12 send (and Kafka 4's
    // floor); librdkafka 2.0–2.4 up to 11, 2.5+ up to 16 (v13+ by topic id);
    // v18 is Kafka 4.1's latest (Java 4.1).
    (ApiKey::Fetch as i16, 4, 18),
    // kafka-python/aiokafka send v1 (librdkafka's OFFSET_TIME needs 1+,
    // it uses up to 7); v10 is Kafka 4.1's latest and kafka-protocol's. v0
    // (sarama before its V0_10_1_0) is served through `kafka_legacy`.
    (ApiKey::ListOffsets as i16, 0, 10),
    // kafka-python 2.0 v0, aiokafka v0/v1, librdkafka up to 2; v4+ batches
    // keys, v6 (Java 4.x) adds share groups' key type.
    (ApiKey::FindCoordinator as i16, 0, 6),
    // kafka-python 2.0 v0–2, aiokafka v0–3, librdkafka up to 5; Kafka 4.1
    // re-allowed v0/v1 (KAFKA-19444); v9 is the latest.
    (ApiKey::JoinGroup as i16, 0, 9),
    // kafka-python v0/v1, aiokafka up to 2, librdkafka up to 3, Java 5.
    (ApiKey::SyncGroup as i16, 0, 5),
    // kafka-python/aiokafka v0/v1, librdkafka up to 3, Java 4.
    (ApiKey::Heartbeat as i16, 0, 4),
    // kafka-python/aiokafka v0/v1, librdkafka up to 1, Java 5 (batched
    // members, KIP-345).
    (ApiKey::LeaveGroup as i16, 0, 5),
    // kafka-python/aiokafka v2; librdkafka's KIP-848 consumer needs v9
    // (member epoch), Java 4.x uses 9. v10 (topic ids) is unstable in 4.1,
    // and kafka-protocol's v10 is that unstable schema: not advertised.
    // v0–1 (sarama sends v1 whatever its version setting) are served
    // through `kafka_legacy`.
    (ApiKey::OffsetCommit as i16, 0, 9),
    // kafka-python/aiokafka v1; v8 batches groups, v9 (KIP-848) is required
    // by librdkafka's new consumer. v10 unstable in 4.1, as OffsetCommit.
    // v0 is v1's shape, served through `kafka_legacy`.
    (ApiKey::OffsetFetch as i16, 0, 9),
    // librdkafka's rd_kafka_list_groups() sends v0, its admin API up to 5.
    (ApiKey::ListGroups as i16, 0, 5),
    // librdkafka's rd_kafka_list_groups() sends v0; v6 (KIP-1043) is 4.x's.
    (ApiKey::DescribeGroups as i16, 0, 6),
    // librdkafka v0–1 (newer up to 2), Java 2.
    (ApiKey::DeleteGroups as i16, 0, 2),
    // Kafka 4 and kafka-protocol start at 2; librdkafka uses up to 4,
    // kafka-python 2.0 up to 3, Java 7.
    (ApiKey::CreateTopics as i16, 2, 7),
    // Floor 1 (Kafka 4, kafka-protocol); librdkafka 2.0 sends 0–1 (picks 1),
    // v6 deletes by topic id.
    (ApiKey::DeleteTopics as i16, 1, 6),
    // librdkafka 2.x sends v0 (newer up to 2), Java 3.
    (ApiKey::CreatePartitions as i16, 0, 3),
    // Floor 1 (Kafka 4); librdkafka sends 0–1 (picks 1), kafka-python up to
    // 2, Java 4.
    (ApiKey::DescribeConfigs as i16, 1, 4),
    // librdkafka and Java up to 1.
    (ApiKey::IncrementalAlterConfigs as i16, 0, 1),
    // librdkafka up to 1 (newer 2), Java 2.
    (ApiKey::DeleteRecords as i16, 0, 2),
    // librdkafka's idempotent producer needs any version (KIP-98) and 3–4 to
    // recover a fenced epoch (KIP-360); kafka-python/aiokafka v0; Java up to
    // 5. v6 (KIP-939, two-phase commit) is unstable in 4.1: not advertised.
    (ApiKey::InitProducerId as i16, 0, 5),
    // librdkafka validates positions with exactly v2 (KIP-320); Kafka 4's
    // floor is 2; Java up to 4.
    (ApiKey::OffsetForLeaderEpoch as i16, 2, 4),
    // Java's Admin.describeCluster (librdkafka uses Metadata); v2 (4.x)
    // reports fenced brokers.
    (ApiKey::DescribeCluster as i16, 0, 2),
    // KIP-848: librdkafka 2.10+ sends exactly v1 (2.6–2.8 previews v0; its
    // feature check needs this API with OffsetCommit/OffsetFetch 9+); Java
    // 4.x v1, 3.7–3.9 v0.
    (ApiKey::ConsumerGroupHeartbeat as i16, 0, 1),
    // librdkafka v0, Java 4.x v1.
    (ApiKey::ConsumerGroupDescribe as i16, 0, 1),
    // v1: SASL tokens then travel in SaslAuthenticate, what every client
    // in use sends when the broker lists it. v0 (bare size-prefixed tokens
    // after it) must be listed too: librdkafka enables SASL only when the
    // broker lists SaslHandshake v0.
    (ApiKey::SaslHandshake as i16, 0, 1),
    // v1 answers the session lifetime (KIP-368 re-authentication), v2 is
    // v1 with flexible fields.
    (ApiKey::SaslAuthenticate as i16, 0, 2),
    // Kafka 2.7+ (KIP-554): users' SCRAM credentials.
    (ApiKey::DescribeUserScramCredentials as i16, 0, 0),
    (ApiKey::AlterUserScramCredentials as i16, 0, 0),
    // Kafka 4's floor is 1 (pattern types); librdkafka and Java up to 3.
    (ApiKey::DescribeAcls as i16, 1, 3),
    (ApiKey::CreateAcls as i16, 1, 3),
    (ApiKey::DeleteAcls as i16, 1, 3),
    // Kafka 2.6+ (KIP-546); librdkafka and Java up to 1 (flexible).
    (ApiKey::DescribeClientQuotas as i16, 0, 1),
    (ApiKey::AlterClientQuotas as i16, 0, 1),
    // Transactions, the client's flow: v4–5 are broker-to-broker
    // (KIP-890 verification), not a client's (Weir's brokers verify over
    // their own mesh).
    (ApiKey::AddPartitionsToTxn as i16, 0, 3),
    // v5 is KIP-890's v2: the epoch bumped at every end, answered.
    (ApiKey::EndTxn as i16, 0, 5),
    // v4 is KIP-890's (TRANSACTION_ABORTABLE, which Weir does not send).
    (ApiKey::AddOffsetsToTxn as i16, 0, 4),
    // v3 adds the member's id and generation (KIP-447); v5 is KIP-890's
    // v2 (the offsets partition added implicitly).
    (ApiKey::TxnOffsetCommit as i16, 0, 5),
    // Kafka 3.0+ (KIP-664): kafka-transactions.sh and Admin's
    // describeProducers/describeTransactions/listTransactions. ListTransactions
    // v1 adds the duration filter; v2's id pattern (4.1) is not served.
    (ApiKey::DescribeProducers as i16, 0, 0),
    (ApiKey::DescribeTransactions as i16, 0, 0),
    (ApiKey::ListTransactions as i16, 0, 1),
    // Share groups (KIP-932): v1 is Kafka 4.1's and librdkafka's (its
    // ShareConsumer, confluent-kafka 2.16's preview); v0 was 4.0's early
    // access.
    (ApiKey::ShareGroupHeartbeat as i16, 1, 1),
    (ApiKey::ShareFetch as i16, 1, 1),
    (ApiKey::ShareAcknowledge as i16, 1, 1),
    (ApiKey::ShareGroupDescribe as i16, 1, 1),
    (ApiKey::DescribeShareGroupOffsets as i16, 0, 0),
    (ApiKey::AlterShareGroupOffsets as i16, 0, 0),
    (ApiKey::DeleteShareGroupOffsets as i16, 0, 0),
];

/// The advertised `(min, max)` versions of an API, if it is served.
pub fn supported_versions(api_key: i16) -> Option<(i16, i16)> {
    SUPPORTED
        .iter()
        .find(|(key, _, _)| *key == api_key)
        .map(|&(_, min, max)| (min, max))
}

/// Whether `api_version` of `api_key` is served.
pub fn is_supported(api_key: i16, api_version: i16) -> bool {
    supported_versions(api_key).is_some_and(|(min, max)| (min..=max).contains(&api_version))
}

/// The feature levels Weir finalizes (ApiVersions v3+): `transaction.version`
/// 2 is KIP-890's v2 transaction protocol, which Kafka's clients (Java
/// 4.0+) use only when the broker finalizes it. `(name, min, max)`.
pub const FINALIZED_FEATURES: &[(&str, i16, i16)] = &[("transaction.version", 2, 2)];

/// The features' epoch: Weir's levels are fixed (they move with the
/// binary, not with a cluster-wide upgrade), so it never changes.
pub const FINALIZED_FEATURES_EPOCH: i64 = 1;

/// A successful ApiVersions response listing [`SUPPORTED`], in api key
/// order, and [`FINALIZED_FEATURES`] (supported from 0: a client may
/// speak an older level). The caller adds throttling if it has any.
pub fn api_versions_response() -> ApiVersionsResponse {
    use kafka_protocol::messages::api_versions_response::{
        FinalizedFeatureKey, SupportedFeatureKey,
    };
    use kafka_protocol::protocol::StrBytes;
    let mut api_keys: Vec<ApiVersion> = SUPPORTED
        .iter()
        .map(|&(key, min, max)| {
            let min = ApiKey::try_from(key)
                .ok()
                .and_then(legacy::advertised_min)
                .unwrap_or(min);
            api_version_entry(key, min, max)
        })
        .collect();
    api_keys.sort_by_key(|a| a.api_key);
    let mut response = ApiVersionsResponse::default();
    response.api_keys = api_keys;
    response.supported_features = FINALIZED_FEATURES
        .iter()
        .map(|&(name, _, max)| {
            SupportedFeatureKey::default()
                .with_name(StrBytes::from_static_str(name))
                .with_min_version(0)
                .with_max_version(max)
        })
        .collect();
    response.finalized_features = FINALIZED_FEATURES
        .iter()
        .map(|&(name, min, max)| {
            FinalizedFeatureKey::default()
                .with_name(StrBytes::from_static_str(name))
                .with_min_version_level(min)
                .with_max_version_level(max)
        })
        .collect();
    response.finalized_features_epoch = FINALIZED_FEATURES_EPOCH;
    response
}

fn api_version_entry(api_key: i16, min: i16, max: i16) -> ApiVersion {
    let mut entry = ApiVersion::default();
    entry.api_key = api_key;
    entry.min_version = min;
    entry.max_version = max;
    entry
}

// ---------------------------------------------------------------------------
// Typed messages
// ---------------------------------------------------------------------------

macro_rules! kafka_apis {
    ($($name:ident: $req:ident => $resp:ident,)*) => {
        /// A decoded request body, one variant per served API.
        #[derive(Debug, Clone, PartialEq)]
        #[allow(clippy::large_enum_variant)]
        pub enum KafkaRequest {
            $(
                #[doc = concat!("`", stringify!($req), "`")]
                $name($req),
            )*
        }

        /// A response body to encode, one variant per served API.
        #[derive(Debug, Clone, PartialEq)]
        #[allow(clippy::large_enum_variant)]
        pub enum KafkaResponse {
            $(
                #[doc = concat!("`", stringify!($resp), "`")]
                $name($resp),
            )*
        }

        $(
            impl From<$req> for KafkaRequest {
                fn from(m: $req) -> Self {
                    KafkaRequest::$name(m)
                }
            }

            impl From<$resp> for KafkaResponse {
                fn from(m: $resp) -> Self {
                    KafkaResponse::$name(m)
                }
            }
        )*

        impl KafkaRequest {
            /// The API key of this request.
            pub fn api_key(&self) -> i16 {
                match self {
                    $(KafkaRequest::$name(_) => ApiKey::$name as i16,)*
                }
            }

            /// Encodes the body (tests build frames with it).
            #[cfg(test)]
            fn encode_body(&self, buf: &mut BytesMut, version: i16) -> Result<(), String> {
                match self {
                    $(KafkaRequest::$name(m) => m.encode(buf, version).map_err(|e| format!("{e:#}")),)*
                }
            }

            /// A default body of an API (tests).
            #[cfg(test)]
            fn default_of(api: ApiKey) -> Option<KafkaRequest> {
                match api {
                    $(ApiKey::$name => Some(KafkaRequest::$name(Default::default())),)*
                    _ => None,
                }
            }
        }

        impl KafkaResponse {
            /// The API key of this response.
            pub fn api_key(&self) -> i16 {
                match self {
                    $(KafkaResponse::$name(_) => ApiKey::$name as i16,)*
                }
            }

            /// The response header version for `version` of this API.
            fn header_version(&self, version: i16) -> i16 {
                match self {
                    $(KafkaResponse::$name(_) => <$resp as HeaderVersion>::header_version(version),)*
                }
            }

            fn compute_size(&self, version: i16) -> Result<usize, String> {
                match self {
                    $(KafkaResponse::$name(m) => m.compute_size(version).map_err(|e| format!("{e:#}")),)*
                }
            }

            fn encode_body<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> Result<(), String> {
                match self {
                    $(KafkaResponse::$name(m) => m.encode(buf, version).map_err(|e| format!("{e:#}")),)*
                }
            }

            /// Decodes a body (tests check encoded responses with it).
            #[cfg(test)]
            fn decode_body(api: ApiKey, buf: &mut Bytes, version: i16) -> Result<KafkaResponse, String> {
                match api {
                    $(ApiKey::$name => <$resp as Decodable>::decode(buf, version)
                        .map(KafkaResponse::$name)
                        .map_err(|e| format!("{e:#}")),)*
                    _ => Err(format!("api {api:?} is not served")),
                }
            }

            /// A default body of an API (tests).
            #[cfg(test)]
            fn default_of(api: ApiKey) -> Option<KafkaResponse> {
                match api {
                    $(ApiKey::$name => Some(KafkaResponse::$name(Default::default())),)*
                    _ => None,
                }
            }
        }

        /// Decodes the body of a served API.
        fn decode_body<B: ByteBuf>(api: ApiKey, buf: &mut B, version: i16) -> Result<KafkaRequest, String> {
            match api {
                $(ApiKey::$name => <$req as Decodable>::decode(buf, version)
                    .map(KafkaRequest::$name)
                    .map_err(|e| format!("{e:#}")),)*
                _ => Err(format!("api {api:?} is not served")),
            }
        }
    };
}

kafka_apis! {
    ApiVersions: ApiVersionsRequest => ApiVersionsResponse,
    Metadata: MetadataRequest => MetadataResponse,
    Produce: ProduceRequest => ProduceResponse,
    Fetch: FetchRequest => FetchResponse,
    ListOffsets: ListOffsetsRequest => ListOffsetsResponse,
    FindCoordinator: FindCoordinatorRequest => FindCoordinatorResponse,
    JoinGroup: JoinGroupRequest => JoinGroupResponse,
    SyncGroup: SyncGroupRequest => SyncGroupResponse,
    Heartbeat: HeartbeatRequest => HeartbeatResponse,
    LeaveGroup: LeaveGroupRequest => LeaveGroupResponse,
    OffsetCommit: OffsetCommitRequest => OffsetCommitResponse,
    OffsetFetch: OffsetFetchRequest => OffsetFetchResponse,
    ListGroups: ListGroupsRequest => ListGroupsResponse,
    DescribeGroups: DescribeGroupsRequest => DescribeGroupsResponse,
    DeleteGroups: DeleteGroupsRequest => DeleteGroupsResponse,
    CreateTopics: CreateTopicsRequest => CreateTopicsResponse,
    DeleteTopics: DeleteTopicsRequest => DeleteTopicsResponse,
    CreatePartitions: CreatePartitionsRequest => CreatePartitionsResponse,
    DescribeConfigs: DescribeConfigsRequest => DescribeConfigsResponse,
    IncrementalAlterConfigs: IncrementalAlterConfigsRequest => IncrementalAlterConfigsResponse,
    DeleteRecords: DeleteRecordsRequest => DeleteRecordsResponse,
    InitProducerId: InitProducerIdRequest => InitProducerIdResponse,
    OffsetForLeaderEpoch: OffsetForLeaderEpochRequest => OffsetForLeaderEpochResponse,
    DescribeCluster: DescribeClusterRequest => DescribeClusterResponse,
    ConsumerGroupHeartbeat: ConsumerGroupHeartbeatRequest => ConsumerGroupHeartbeatResponse,
    ConsumerGroupDescribe: ConsumerGroupDescribeRequest => ConsumerGroupDescribeResponse,
    SaslHandshake: SaslHandshakeRequest => SaslHandshakeResponse,
    SaslAuthenticate: SaslAuthenticateRequest => SaslAuthenticateResponse,
    DescribeUserScramCredentials: DescribeUserScramCredentialsRequest => DescribeUserScramCredentialsResponse,
    AlterUserScramCredentials: AlterUserScramCredentialsRequest => AlterUserScramCredentialsResponse,
    DescribeAcls: DescribeAclsRequest => DescribeAclsResponse,
    CreateAcls: CreateAclsRequest => CreateAclsResponse,
    DeleteAcls: DeleteAclsRequest => DeleteAclsResponse,
    DescribeClientQuotas: DescribeClientQuotasRequest => DescribeClientQuotasResponse,
    AlterClientQuotas: AlterClientQuotasRequest => AlterClientQuotasResponse,
    AddPartitionsToTxn: AddPartitionsToTxnRequest => AddPartitionsToTxnResponse,
    EndTxn: EndTxnRequest => EndTxnResponse,
    AddOffsetsToTxn: AddOffsetsToTxnRequest => AddOffsetsToTxnResponse,
    TxnOffsetCommit: TxnOffsetCommitRequest => TxnOffsetCommitResponse,
    DescribeProducers: DescribeProducersRequest => DescribeProducersResponse,
    DescribeTransactions: DescribeTransactionsRequest => DescribeTransactionsResponse,
    ListTransactions: ListTransactionsRequest => ListTransactionsResponse,
    ShareGroupHeartbeat: ShareGroupHeartbeatRequest => ShareGroupHeartbeatResponse,
    ShareFetch: ShareFetchRequest => ShareFetchResponse,
    ShareAcknowledge: ShareAcknowledgeRequest => ShareAcknowledgeResponse,
    ShareGroupDescribe: ShareGroupDescribeRequest => ShareGroupDescribeResponse,
    DescribeShareGroupOffsets: DescribeShareGroupOffsetsRequest => DescribeShareGroupOffsetsResponse,
    AlterShareGroupOffsets: AlterShareGroupOffsetsRequest => AlterShareGroupOffsetsResponse,
    DeleteShareGroupOffsets: DeleteShareGroupOffsetsRequest => DeleteShareGroupOffsetsResponse,
}

/// What identifies a request for its answer: readable from the first 8
/// bytes of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeaderInfo {
    /// The request's API key.
    pub api_key: i16,
    /// The request's API version.
    pub api_version: i16,
    /// The request's correlation id, echoed in the response.
    pub correlation_id: i32,
}

/// A decoded request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestFrame {
    /// The API key (equals `body.api_key()`).
    pub api_key: i16,
    /// The API version the body was decoded at (and the response's).
    pub api_version: i16,
    /// The correlation id.
    pub correlation_id: i32,
    /// The client id (`None` when the client sent null; Kafka treats that as
    /// empty).
    pub client_id: Option<String>,
    /// The body.
    pub body: KafkaRequest,
}

impl RequestFrame {
    /// What the response is encoded for.
    pub fn header(&self) -> RequestHeaderInfo {
        RequestHeaderInfo {
            api_key: self.api_key,
            api_version: self.api_version,
            correlation_id: self.correlation_id,
        }
    }
}

/// Why a request frame was not decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// An API key that is not in [`SUPPORTED`] (Kafka closes the connection).
    UnsupportedApi {
        /// The frame's header.
        header: RequestHeaderInfo,
    },
    /// A served API at a version outside its [`SUPPORTED`] range: answer
    /// with [`error_response`] (the ApiVersions fallback), or close.
    UnsupportedVersion {
        /// The frame's header.
        header: RequestHeaderInfo,
    },
    /// A version not served whose body was read to refuse each of its
    /// parts: `answer` is the whole response frame to send.
    Refused {
        /// The frame's header.
        header: RequestHeaderInfo,
        /// The refusal, size prefix included.
        answer: Bytes,
    },
    /// A frame too short, too long, or whose header or body does not parse.
    Malformed {
        /// The header, if the first 8 bytes were there.
        header: Option<RequestHeaderInfo>,
        /// What was wrong.
        reason: String,
    },
}

impl DecodeError {
    /// The header, when it was readable.
    pub fn header(&self) -> Option<RequestHeaderInfo> {
        match self {
            DecodeError::UnsupportedApi { header }
            | DecodeError::UnsupportedVersion { header }
            | DecodeError::Refused { header, .. } => Some(*header),
            DecodeError::Malformed { header, .. } => *header,
        }
    }

    /// The correlation id, when it was readable.
    pub fn correlation_id(&self) -> Option<i32> {
        self.header().map(|h| h.correlation_id)
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::UnsupportedApi { header } => {
                write!(f, "unsupported api key {}", header.api_key)
            }
            DecodeError::UnsupportedVersion { header } | DecodeError::Refused { header, .. } => {
                write!(
                    f,
                    "unsupported version {} of api key {}",
                    header.api_version, header.api_key
                )
            }
            DecodeError::Malformed { reason, .. } => write!(f, "malformed request: {reason}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why a response was not encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodeError {
    /// The response is of another API than the request it answers.
    ApiMismatch {
        /// The request's API key.
        request: i16,
        /// The response's API key.
        response: i16,
    },
    /// `kafka-protocol` refused the message at this version (a field set that
    /// the version does not have, an unknown version, a string too long).
    Invalid {
        /// Its reason.
        reason: String,
    },
    /// Over [`MAX_RESPONSE_FRAME_BYTES`].
    TooLarge {
        /// Bytes after the size prefix.
        len: usize,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::ApiMismatch { request, response } => write!(
                f,
                "response of api key {response} for a request of api key {request}"
            ),
            EncodeError::Invalid { reason } => write!(f, "cannot encode response: {reason}"),
            EncodeError::TooLarge { len } => write!(
                f,
                "response of {len} bytes is over {MAX_RESPONSE_FRAME_BYTES}"
            ),
        }
    }
}

impl std::error::Error for EncodeError {}

/// Why a size prefix was refused (the connection must be closed: its framing
/// cannot be trusted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameLenError {
    /// A negative size.
    Negative(i32),
    /// Under [`MIN_REQUEST_FRAME_BYTES`].
    TooShort(usize),
    /// Over the limit given.
    TooLarge {
        /// The declared size.
        len: usize,
        /// The limit.
        max: usize,
    },
}

impl fmt::Display for FrameLenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameLenError::Negative(n) => write!(f, "negative frame size {n}"),
            FrameLenError::TooShort(n) => write!(f, "frame of {n} bytes is too short"),
            FrameLenError::TooLarge { len, max } => {
                write!(f, "frame of {len} bytes is over {max}")
            }
        }
    }
}

impl std::error::Error for FrameLenError {}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

/// The length of the whole first frame in `buf` (size prefix included) once
/// the 4-byte prefix is there, `None` before. A size under
/// [`MIN_REQUEST_FRAME_BYTES`] or over `max_frame_bytes` (capped at
/// [`MAX_REQUEST_FRAME_BYTES`]) is an error, known from the prefix alone.
pub fn peek_request_frame_len(
    buf: &[u8],
    max_frame_bytes: usize,
) -> Result<Option<usize>, FrameLenError> {
    let Some(prefix) = buf.first_chunk::<SIZE_PREFIX_BYTES>() else {
        return Ok(None);
    };
    let size = i32::from_be_bytes(*prefix);
    let Ok(len) = usize::try_from(size) else {
        return Err(FrameLenError::Negative(size));
    };
    let max = max_frame_bytes.min(MAX_REQUEST_FRAME_BYTES);
    if len > max {
        return Err(FrameLenError::TooLarge { len, max });
    }
    if len < MIN_REQUEST_FRAME_BYTES {
        return Err(FrameLenError::TooShort(len));
    }
    Ok(Some(len + SIZE_PREFIX_BYTES))
}

/// Decodes one request frame (the bytes after the size prefix).
///
/// Produce records in the result are slices of `frame` (no copy). Bytes
/// after the body are ignored, as Kafka ignores them. A non-flexible request
/// with an `int32` field larger than the bytes after it (a Fetch's
/// `max_bytes`, a timeout) is decoded twice (see `Guarded`); flexible
/// requests, what current clients send, once.
pub fn decode_request(frame: Bytes) -> Result<RequestFrame, DecodeError> {
    let Some(fixed) = frame.first_chunk::<8>() else {
        return Err(DecodeError::Malformed {
            header: None,
            reason: format!("frame of {} bytes has no request header", frame.len()),
        });
    };
    let header = RequestHeaderInfo {
        api_key: i16::from_be_bytes([fixed[0], fixed[1]]),
        api_version: i16::from_be_bytes([fixed[2], fixed[3]]),
        correlation_id: i32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]),
    };
    if frame.len() > MAX_REQUEST_FRAME_BYTES {
        return Err(DecodeError::Malformed {
            header: Some(header),
            reason: format!(
                "frame of {} bytes is over {MAX_REQUEST_FRAME_BYTES}",
                frame.len()
            ),
        });
    }
    let api = match ApiKey::try_from(header.api_key) {
        Ok(api) if supported_versions(header.api_key).is_some() => api,
        _ => return Err(DecodeError::UnsupportedApi { header }),
    };
    let malformed = |reason: String| DecodeError::Malformed {
        header: Some(header),
        reason,
    };
    let legacy = legacy::legacy(api, header.api_version);
    if legacy.is_none() && !is_supported(header.api_key, header.api_version) {
        return Err(DecodeError::UnsupportedVersion { header });
    }
    // A version below `kafka-protocol`'s floor: its body rewritten into the
    // bytes of the version it is decoded at (see `kafka_legacy`).
    let (frame, decode_version) = match legacy {
        None => (frame, header.api_version),
        Some(Legacy::Served { as_version } | Legacy::Refused { as_version }) => {
            // Request header v1: the fixed 8 bytes and the client id.
            let id_len = frame
                .get(8..10)
                .map(|b| i16::from_be_bytes([b[0], b[1]]).max(0) as usize)
                .ok_or_else(|| malformed("no client id".into()))?;
            let body_at = 10 + id_len;
            let body = frame
                .get(body_at..)
                .ok_or_else(|| malformed("client id past the end".into()))?;
            let body = legacy::rewrite_body(api, header.api_version, body).map_err(malformed)?;
            let mut rewritten = BytesMut::with_capacity(body_at + body.len());
            rewritten.put_slice(&frame[..body_at]);
            rewritten.put_slice(&body);
            (rewritten.freeze(), as_version)
        }
    };
    let header_version = api.request_header_version(decode_version);

    // Pass 1: an `i32` that cannot be a length (more than the bytes left) is
    // handed over as -2, so if it was one the decode fails without
    // allocating; if it was a plain field (a timeout, `max_bytes`) the
    // decode goes on, having read a wrong value there.
    let mut trusted = vec![CORRELATION_ID_OFFSET];
    let (first, suspects) =
        decode_guarded(&frame, api, decode_version, header_version, &trusted, true);
    let Decoded { client_id, body } = match first {
        Err(reason) => return Err(malformed(reason)),
        Ok(decoded) if suspects.is_empty() => decoded,
        // Pass 2: those `i32`s were plain fields (a length that large would
        // have failed pass 1, and plain fields do not steer the decode, so
        // the same reads happen at the same offsets): read them as they are.
        Ok(_) => {
            trusted.extend(suspects);
            trusted.sort_unstable();
            decode_guarded(&frame, api, decode_version, header_version, &trusted, false)
                .0
                .map_err(malformed)?
        }
    };
    if let (Some(Legacy::Refused { .. }), KafkaRequest::Produce(p)) = (legacy, &body) {
        let topics: Vec<(String, Vec<i32>)> = p
            .topic_data
            .iter()
            .map(|t| {
                let parts = t.partition_data.iter().map(|d| d.index).collect();
                (t.name.0.to_string(), parts)
            })
            .collect();
        let answer = legacy::produce_refusal_body(header.api_version, &topics);
        return Err(DecodeError::Refused {
            header,
            answer: frame_of(header.correlation_id, &answer)
                .map_err(|e| malformed(e.to_string()))?,
        });
    }
    Ok(RequestFrame {
        api_key: header.api_key,
        api_version: header.api_version,
        correlation_id: header.correlation_id,
        client_id,
        body,
    })
}

/// A response frame (size prefix, response header v0) around `body`.
fn frame_of(correlation_id: i32, body: &[u8]) -> Result<Bytes, EncodeError> {
    check_size(body.len())?;
    let mut buf = BytesMut::with_capacity(SIZE_PREFIX_BYTES + 4 + body.len());
    buf.put_i32(0);
    put_response_header(&mut buf, correlation_id, 0);
    buf.put_slice(body);
    let total = buf.len();
    patch_size_prefix(&mut buf, total)?;
    Ok(buf.freeze())
}

/// A decoded client id and body.
struct Decoded {
    client_id: Option<String>,
    body: KafkaRequest,
}

/// One decode of header and body through [`Guarded`]; also returns the
/// offsets of the `i32`s that were replaced.
fn decode_guarded(
    frame: &Bytes,
    api: ApiKey,
    version: i16,
    header_version: i16,
    trusted: &[usize],
    probing: bool,
) -> (Result<Decoded, String>, Vec<usize>) {
    let mut buf = Guarded::new(frame.clone(), header_version >= 2, trusted, probing);
    let result = RequestHeader::decode(&mut buf, header_version)
        .map_err(|e| format!("request header: {e:#}"))
        .and_then(|h| {
            let body = decode_body(api, &mut buf, version)?;
            Ok(Decoded {
                client_id: h.client_id.map(|c| c.to_string()),
                body,
            })
        });
    (result, buf.suspects)
}

/// The buffer a request is decoded from: the frame, plus a check of every
/// value that `kafka-protocol` may take as an array length before it
/// reserves that many elements.
///
/// It relies on how `kafka-protocol` 0.18 reads (its `protocol::types`):
/// `Int32` through `try_get_i32`, unsigned varints one `try_get_u8` at a
/// time, and arrays, bytes and strings as a length followed by that many
/// elements or bytes. The hostile-input tests fail if that changes.
///
/// * Non-flexible versions have no varints; their lengths are `i32`s. An
///   `i32` over the bytes left cannot be a length that decodes (every element
///   takes at least a byte), but can be a plain field: it is replaced by -2
///   and its offset recorded (see [`decode_request`]'s two passes).
/// * Flexible versions have no `i32` lengths; every varint there is a length,
///   a tag, or a tagged-field count or size. One over the bytes left plus
///   [`VARINT_LENGTH_SLACK`] fails the read, before the decoder sees it.
struct Guarded<'a> {
    buf: Bytes,
    frame_len: usize,
    flexible: bool,
    /// Offsets of `i32`s known to be plain fields (sorted).
    trusted: &'a [usize],
    /// Record replaced `i32`s (pass 1), or just replace them (pass 2).
    probing: bool,
    suspects: Vec<usize>,
    /// The varint being read: value so far and next shift.
    varint: Option<(u64, u32)>,
}

impl<'a> Guarded<'a> {
    fn new(buf: Bytes, flexible: bool, trusted: &'a [usize], probing: bool) -> Self {
        Guarded {
            frame_len: buf.len(),
            buf,
            flexible,
            trusted,
            probing,
            suspects: Vec::new(),
            varint: None,
        }
    }
}

impl Buf for Guarded<'_> {
    fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn chunk(&self) -> &[u8] {
        &self.buf
    }

    fn advance(&mut self, cnt: usize) {
        self.varint = None;
        let cnt = cnt.min(self.buf.len());
        self.buf.advance(cnt);
    }

    fn try_get_u8(&mut self) -> Result<u8, TryGetError> {
        let b = self.buf.try_get_u8()?;
        if !self.flexible {
            return Ok(b);
        }
        let (mut value, mut shift) = self.varint.take().unwrap_or((0, 0));
        value |= u64::from(b & 0x7f) << shift;
        shift += 7;
        // kafka-protocol reads at most 5 bytes and keeps the low 32 bits.
        if b & 0x80 != 0 && shift < 35 {
            self.varint = Some((value, shift));
            return Ok(b);
        }
        let decoded = (value & u64::from(u32::MAX)) as usize;
        let left = self.buf.len();
        if decoded > left + 1 + VARINT_LENGTH_SLACK {
            return Err(TryGetError {
                requested: decoded - 1,
                available: left,
            });
        }
        Ok(b)
    }

    fn try_get_i32(&mut self) -> Result<i32, TryGetError> {
        self.varint = None;
        let at = self.frame_len - self.buf.len();
        let v = self.buf.try_get_i32()?;
        let fits = usize::try_from(v).map_or(true, |n| n <= self.buf.len());
        if self.flexible || fits || self.trusted.binary_search(&at).is_ok() {
            return Ok(v);
        }
        if self.probing {
            self.suspects.push(at);
        }
        Ok(POISON_LENGTH)
    }
}

impl ByteBuf for Guarded<'_> {
    fn peek_bytes(&mut self, r: Range<usize>) -> Bytes {
        if r.start <= r.end && r.end <= self.buf.len() {
            self.buf.slice(r)
        } else {
            Bytes::new()
        }
    }

    fn get_bytes(&mut self, size: usize) -> Bytes {
        self.varint = None;
        let size = size.min(self.buf.len());
        self.buf.split_to(size)
    }
}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

/// Encodes a response to the request `header` names, size prefix included.
///
/// The header version follows the API and version (ApiVersions: always v0).
/// Tagged fields at their default values are left out (`kafka-protocol`
/// compares each with its schema default). Fields the version does not have
/// are left out too, so a response may carry both a topic's name and its id.
/// Fetch record batches are copied here; [`encode_fetch_response`] does not
/// copy them.
pub fn encode_response(
    header: &RequestHeaderInfo,
    response: &KafkaResponse,
) -> Result<BytesMut, EncodeError> {
    check_api(header, response)?;
    let mut version = header.api_version;
    if let Ok(api) = ApiKey::try_from(header.api_key) {
        match (legacy::legacy(api, version), response) {
            (Some(_), KafkaResponse::ListOffsets(r)) => {
                let body = legacy::list_offsets_v0_body(r);
                return frame_of(header.correlation_id, &body).map(|b| BytesMut::from(&b[..]));
            }
            (Some(Legacy::Served { as_version }), _) => version = as_version,
            _ => {}
        }
    }
    let header_version = response.header_version(version);
    let size = response
        .compute_size(version)
        .map_err(|reason| EncodeError::Invalid { reason })?;
    check_size(size)?;
    let mut buf = BytesMut::with_capacity(SIZE_PREFIX_BYTES + 5 + size);
    buf.put_i32(0);
    put_response_header(&mut buf, header.correlation_id, header_version);
    response
        .encode_body(&mut buf, version)
        .map_err(|reason| EncodeError::Invalid { reason })?;
    let total = buf.len();
    patch_size_prefix(&mut buf, total)?;
    Ok(buf)
}

/// A response as segments for a vectored write: `head` (size prefix,
/// header, and the body up to the first record batch), then `payload` in
/// order (record batches as the caller gave them, and the bytes between).
#[derive(Debug, Clone)]
pub struct ResponseSegments {
    /// Size prefix, response header and the body's first bytes.
    pub head: BytesMut,
    /// The rest, in order.
    pub payload: Vec<Bytes>,
}

impl ResponseSegments {
    /// Bytes of the whole frame, size prefix included.
    pub fn total_len(&self) -> usize {
        self.head.len() + self.payload.iter().map(Bytes::len).sum::<usize>()
    }

    /// All segments in order.
    pub fn into_segments(self) -> Vec<Bytes> {
        let mut all = Vec::with_capacity(self.payload.len() + 1);
        all.push(self.head.freeze());
        all.extend(self.payload);
        all
    }
}

/// Bytes a partition's several batches may add up to and still be answered
/// without a copy ([`FetchBatches::records`]); a larger record set is
/// concatenated.
pub const FETCH_STAND_IN_MAX_BYTES: usize = 64 << 20;

/// What the encoder is given in place of several batches: zeros it never
/// reads, only their address and length, by which [`encode_fetch_response`]
/// recognizes them. Allocated once, zeroed by the allocator's fresh mapping
/// (untouched pages cost no memory); not a `static` array, which would put
/// 64 MiB of zeros into the binary's read-only data.
static FETCH_STAND_IN: std::sync::OnceLock<&'static [u8]> = std::sync::OnceLock::new();

/// A Fetch answer's partitions that carry several record batches, in the
/// order the encoder writes them, so that they are sent as they are: one
/// segment per batch (runs of short batches joined,
/// [`segments`](weir_proto::segments::segments)), not concatenated
/// into a copy.
#[derive(Debug, Default)]
pub struct FetchBatches {
    spans: Vec<Vec<Bytes>>,
}

impl FetchBatches {
    /// What to put in a partition's `records` for these batches: nothing,
    /// one segment itself, or for several segments a stand-in of their
    /// added length (remembered here; the segments take its place when
    /// [`encode_fetch_response`] meets it). Called in the order the
    /// partitions appear in the response.
    pub fn records(&mut self, batches: &[Bytes]) -> Bytes {
        let len: usize = batches.iter().map(Bytes::len).sum();
        if len > FETCH_STAND_IN_MAX_BYTES {
            return batches.concat().into();
        }
        let mut segments = weir_proto::segments::segments(batches);
        if segments.len() <= 1 {
            return segments.pop().unwrap_or_default();
        }
        self.spans.push(segments);
        let zeros: &'static [u8] = FETCH_STAND_IN
            .get_or_init(|| Box::leak(vec![0u8; FETCH_STAND_IN_MAX_BYTES].into_boxed_slice()));
        Bytes::from_static(&zeros[..len])
    }
}

fn is_stand_in(records: &Bytes) -> bool {
    FETCH_STAND_IN
        .get()
        .is_some_and(|zeros| records.as_ptr() == zeros.as_ptr())
}

/// Encodes a Fetch response without copying its record batches: each
/// partition's non-empty `records` becomes a segment of its own, the same
/// `Bytes` (same memory) as given, behind the length prefix of that version
/// (`i32` before v12, unsigned varint of length + 1 from v12); a stand-in of
/// `batches` becomes those batches, a segment each.
pub fn encode_fetch_response(
    header: &RequestHeaderInfo,
    response: &FetchResponse,
    batches: FetchBatches,
) -> Result<ResponseSegments, EncodeError> {
    if header.api_key != ApiKey::Fetch as i16 {
        return Err(EncodeError::ApiMismatch {
            request: header.api_key,
            response: ApiKey::Fetch as i16,
        });
    }
    let version = header.api_version;
    let mut spans = batches.spans.into_iter();
    let mut records: Vec<(Bytes, Vec<Bytes>)> = Vec::new();
    for r in response
        .responses
        .iter()
        .flat_map(|t| t.partitions.iter())
        .filter_map(|p| p.records.as_ref())
        .filter(|r| !r.is_empty())
    {
        let sent = if is_stand_in(r) {
            match spans.next() {
                Some(span) if span.iter().map(Bytes::len).sum::<usize>() == r.len() => span,
                _ => {
                    return Err(EncodeError::Invalid {
                        reason: "a partition's stand-in records match no batches".into(),
                    })
                }
            }
        } else {
            vec![r.clone()]
        };
        records.push((r.clone(), sent));
    }
    if spans.next().is_some() {
        return Err(EncodeError::Invalid {
            reason: "batches given for no partition's records".into(),
        });
    }
    let records_len: usize = records.iter().map(|(r, _)| r.len()).sum();
    let size = response
        .compute_size(version)
        .map_err(|e| EncodeError::Invalid {
            reason: format!("{e:#}"),
        })?;
    check_size(size)?;
    let mut head =
        BytesMut::with_capacity(SIZE_PREFIX_BYTES + 5 + size.saturating_sub(records_len));
    head.put_i32(0);
    put_response_header(
        &mut head,
        header.correlation_id,
        FetchResponse::header_version(version),
    );
    let mut w = SegmentWriter {
        head,
        tail: None,
        payload: Vec::new(),
        payload_len: 0,
        records,
        next: 0,
        scratch: Vec::new(),
        broken: false,
    };
    response
        .encode(&mut w, version)
        .map_err(|e| EncodeError::Invalid {
            reason: format!("{e:#}"),
        })?;
    if w.broken {
        return Err(EncodeError::Invalid {
            reason: "the encoder moved back across a record batch".into(),
        });
    }
    if w.next != w.records.len() {
        // A stand-in not diverted would have been copied as zeros.
        return Err(EncodeError::Invalid {
            reason: "the encoder wrote a partition's records other than as given".into(),
        });
    }
    let total = w.offset();
    let SegmentWriter {
        mut head,
        tail,
        mut payload,
        ..
    } = w;
    if let Some(tail) = tail.filter(|t| !t.is_empty()) {
        payload.push(tail.freeze());
    }
    patch_size_prefix(&mut head, total)?;
    Ok(ResponseSegments { head, payload })
}

/// The answer to a request that is not served as asked (an unsupported
/// version, or a body that does not decode), carrying `error_code`, where
/// Kafka's schema lets one be built from the header alone; `None` where it
/// does not (the caller closes the connection, as Kafka does).
///
/// * ApiVersions at a version not served: a v0 body with the error and, for
///   UNSUPPORTED_VERSION, the ApiVersions entry of [`SUPPORTED`] — Kafka's
///   answer (`ApiVersionsRequest.getErrorResponse`, KIP-511); the client
///   retries at the highest version it finds there. At a served version:
///   that version, with the error.
/// * Other served APIs: at versions whose response has a top-level error
///   code (Fetch 7+, Metadata 13, FindCoordinator 0–3, JoinGroup, SyncGroup,
///   Heartbeat, LeaveGroup, ListGroups, OffsetFetch 2–7, InitProducerId,
///   DescribeCluster, ConsumerGroupHeartbeat, the share-group APIs), the
///   response with only that
///   code set. The others report errors per topic or partition, which needs
///   the request's body: `None`.
/// * APIs not served: `None` (Kafka closes the connection).
pub fn error_response(header: &RequestHeaderInfo, error_code: i16) -> Option<Bytes> {
    let (key, v) = (header.api_key, header.api_version);
    let api = ApiKey::try_from(key).ok()?;
    supported_versions(key)?;
    let in_range = |range: Range<i16>| range.contains(&v);
    macro_rules! with_error {
        ($t:ident) => {{
            let mut r = $t::default();
            r.error_code = error_code;
            KafkaResponse::from(r)
        }};
    }
    let response: KafkaResponse = match api {
        ApiKey::ApiVersions => {
            let mut r = ApiVersionsResponse::default();
            r.error_code = error_code;
            if error_code == UNSUPPORTED_VERSION {
                let (min, max) = supported_versions(key)?;
                r.api_keys = vec![api_version_entry(key, min, max)];
            }
            let version = if is_supported(key, v) { v } else { 0 };
            let fallback = RequestHeaderInfo {
                api_version: version,
                ..*header
            };
            return encode_response(&fallback, &r.into())
                .ok()
                .map(BytesMut::freeze);
        }
        ApiKey::Fetch if in_range(7..19) => with_error!(FetchResponse),
        ApiKey::Metadata if in_range(13..14) => with_error!(MetadataResponse),
        ApiKey::FindCoordinator if in_range(0..4) => with_error!(FindCoordinatorResponse),
        ApiKey::JoinGroup if in_range(0..10) => with_error!(JoinGroupResponse),
        ApiKey::SyncGroup if in_range(0..6) => with_error!(SyncGroupResponse),
        ApiKey::Heartbeat if in_range(0..5) => with_error!(HeartbeatResponse),
        ApiKey::LeaveGroup if in_range(0..6) => with_error!(LeaveGroupResponse),
        ApiKey::ListGroups if in_range(0..6) => with_error!(ListGroupsResponse),
        ApiKey::OffsetFetch if in_range(2..8) => with_error!(OffsetFetchResponse),
        ApiKey::InitProducerId if in_range(0..7) => with_error!(InitProducerIdResponse),
        ApiKey::DescribeCluster if in_range(0..3) => with_error!(DescribeClusterResponse),
        ApiKey::DescribeAcls if in_range(1..4) => with_error!(DescribeAclsResponse),
        ApiKey::DescribeClientQuotas if in_range(0..2) => {
            with_error!(DescribeClientQuotasResponse)
        }
        ApiKey::ConsumerGroupHeartbeat if in_range(0..2) => {
            with_error!(ConsumerGroupHeartbeatResponse)
        }
        ApiKey::ShareGroupHeartbeat if in_range(1..2) => {
            with_error!(ShareGroupHeartbeatResponse)
        }
        ApiKey::ShareFetch if in_range(1..2) => with_error!(ShareFetchResponse),
        ApiKey::ShareAcknowledge if in_range(1..2) => with_error!(ShareAcknowledgeResponse),
        _ => return None,
    };
    encode_response(header, &response)
        .ok()
        .map(BytesMut::freeze)
}

fn check_api(header: &RequestHeaderInfo, response: &KafkaResponse) -> Result<(), EncodeError> {
    if response.api_key() == header.api_key {
        Ok(())
    } else {
        Err(EncodeError::ApiMismatch {
            request: header.api_key,
            response: response.api_key(),
        })
    }
}

/// Refuses a body that cannot fit a frame, before anything is allocated for
/// it.
fn check_size(body: usize) -> Result<(), EncodeError> {
    // Header: correlation id and at most one tagged-fields byte.
    let len = body.saturating_add(5);
    if len > MAX_RESPONSE_FRAME_BYTES {
        return Err(EncodeError::TooLarge { len });
    }
    Ok(())
}

/// Response header v0 (correlation id) or v1 (and no tagged fields).
fn put_response_header(buf: &mut BytesMut, correlation_id: i32, header_version: i16) {
    buf.put_i32(correlation_id);
    if header_version >= 1 {
        buf.put_u8(0);
    }
}

/// Writes the size prefix of a frame of `total` bytes (prefix included)
/// into the first 4 bytes of `head`.
fn patch_size_prefix(head: &mut BytesMut, total: usize) -> Result<(), EncodeError> {
    let len = total - SIZE_PREFIX_BYTES;
    let size = i32::try_from(len).map_err(|_| EncodeError::TooLarge { len })?;
    head[..SIZE_PREFIX_BYTES].copy_from_slice(&size.to_be_bytes());
    Ok(())
}

/// The buffer a Fetch response is encoded into: bytes go to `head`, then,
/// from the first record batch on, to `tail`; a `put_slice` of exactly the
/// next expected record batch (same memory, same length) becomes a payload
/// segment of that `Bytes` instead of a copy.
struct SegmentWriter {
    head: BytesMut,
    /// Set once the first batch is diverted; shares `head`'s allocation.
    tail: Option<BytesMut>,
    payload: Vec<Bytes>,
    payload_len: usize,
    /// The records to divert, in the order the encoder writes them, each
    /// with the batches sent in its place (itself, or a stand-in's batches).
    records: Vec<(Bytes, Vec<Bytes>)>,
    next: usize,
    /// What `range` returns for a range it cannot serve (never, for the
    /// messages encoded here), so that no caller panics.
    scratch: Vec<u8>,
    broken: bool,
}

impl SegmentWriter {
    fn active(&mut self) -> &mut BytesMut {
        match &mut self.tail {
            Some(tail) => tail,
            None => &mut self.head,
        }
    }

    fn active_start(&self) -> usize {
        match &self.tail {
            Some(_) => self.head.len() + self.payload_len,
            None => 0,
        }
    }

    fn divert(&mut self, batches: Vec<Bytes>) {
        match &mut self.tail {
            Some(tail) => {
                if !tail.is_empty() {
                    let bytes = tail.split().freeze();
                    self.payload_len += bytes.len();
                    self.payload.push(bytes);
                }
            }
            None => {
                let len = self.head.len();
                self.tail = Some(self.head.split_off(len));
            }
        }
        for batch in batches {
            self.payload_len += batch.len();
            self.payload.push(batch);
        }
    }
}

// SAFETY: every method delegates to the active `BytesMut`, which changes
// only in `put_slice` (never between a `chunk_mut` and its `advance_mut`),
// so `advance_mut` always advances the buffer whose chunk was written.
unsafe impl BufMut for SegmentWriter {
    fn remaining_mut(&self) -> usize {
        usize::MAX - self.offset()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller initialized `cnt` bytes of the active buffer's
        // `chunk_mut`.
        unsafe { self.active().advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.active().chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        if let Some((given, _)) = self.records.get(self.next) {
            if !src.is_empty() && src.as_ptr() == given.as_ptr() && src.len() == given.len() {
                let sent = std::mem::take(&mut self.records[self.next].1);
                self.next += 1;
                self.divert(sent);
                return;
            }
        }
        self.active().put_slice(src);
    }
}

impl ByteBufMut for SegmentWriter {
    fn offset(&self) -> usize {
        self.head.len() + self.payload_len + self.tail.as_ref().map_or(0, BytesMut::len)
    }

    fn seek(&mut self, offset: usize) {
        let start = self.active_start();
        match offset.checked_sub(start) {
            Some(at) => self.active().resize(at, 0),
            None => self.broken = true,
        }
    }

    fn range(&mut self, r: Range<usize>) -> &mut [u8] {
        let start = self.active_start();
        let end = self.offset();
        if r.start >= start && r.start <= r.end && r.end <= end {
            let (a, b) = (r.start - start, r.end - start);
            return &mut self.active()[a..b];
        }
        self.broken = true;
        self.scratch.clear();
        self.scratch.resize(r.len(), 0);
        &mut self.scratch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions;
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponseTopic,
    };
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::offset_fetch_request::{
        OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
    };
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::produce_response::{
        PartitionProduceResponse, TopicProduceResponse,
    };
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::{BrokerId, GroupId, ResponseHeader, TopicName};
    use kafka_protocol::protocol::{Message, StrBytes};
    use proptest::prelude::*;

    // -- a counting allocator, on only for the thread that asks --------------

    struct Counting;

    static LARGEST: AtomicUsize = AtomicUsize::new(0);

    thread_local! {
        static COUNTING: Cell<bool> = const { Cell::new(false) };
    }

    fn note(size: usize) {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            LARGEST.fetch_max(size, Ordering::Relaxed);
        }
    }

    // SAFETY: delegates to the system allocator, only recording sizes.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: same contract as ours.
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: same contract as ours (the system's zeroed pages, not
            // the default's alloc-then-write).
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: same contract as ours.
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            note(new_size);
            // SAFETY: same contract as ours.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    // Test-only, for this crate's test binary. If the crate this module
    // lives in has a global allocator of its own in its unit tests, move the
    // allocation assertions to an integration test.
    #[global_allocator]
    static ALLOC: Counting = Counting;

    /// The result of `f` and the largest single allocation it made on this
    /// thread (other tests do not count).
    fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        LARGEST.store(0, Ordering::Relaxed);
        COUNTING.with(|c| c.set(true));
        let out = f();
        COUNTING.with(|c| c.set(false));
        (out, LARGEST.load(Ordering::Relaxed))
    }

    // -- helpers --------------------------------------------------------------

    /// A topic id whose 16 bytes are all `$n` (the `uuid` crate is not a
    /// dependency: the value comes out of a decoded message).
    macro_rules! uuid {
        ($n:expr) => {{
            let mut b = BytesMut::new();
            b.put_slice(&[$n; 16]);
            b.put_u8(1); // no partitions
            b.put_u8(0); // no tagged fields
            FetchTopic::decode(&mut b.freeze(), 13).unwrap().topic_id
        }};
    }

    fn api(key: i16) -> ApiKey {
        ApiKey::try_from(key).unwrap()
    }

    fn s(v: &str) -> StrBytes {
        StrBytes::from_string(v.to_string())
    }

    /// The lowest served version `kafka-protocol` itself encodes (the ones
    /// below are `kafka_legacy`'s, tested on their own).
    fn crate_min(key: i16, min: i16) -> i16 {
        min.max(api(key).valid_versions().min)
    }

    fn header(key: i16, version: i16, correlation_id: i32) -> RequestHeaderInfo {
        RequestHeaderInfo {
            api_key: key,
            api_version: version,
            correlation_id,
        }
    }

    fn records(tag: u8, len: usize) -> Bytes {
        Bytes::from(
            (0..len)
                .map(|i| tag.wrapping_add(i as u8))
                .collect::<Vec<u8>>(),
        )
    }

    /// A request frame (no size prefix) as a client builds it with
    /// kafka-protocol.
    fn request_frame(body: &KafkaRequest, version: i16, correlation_id: i32) -> Bytes {
        let key = body.api_key();
        let mut h = RequestHeader::default();
        h.request_api_key = key;
        h.request_api_version = version;
        h.correlation_id = correlation_id;
        h.client_id = Some(s("weir-test"));
        let mut buf = BytesMut::new();
        h.encode(&mut buf, api(key).request_header_version(version))
            .unwrap();
        body.encode_body(&mut buf, version).unwrap();
        buf.freeze()
    }

    /// Checks the size prefix, reads the header at the version
    /// kafka-protocol gives, decodes the body with kafka-protocol.
    fn parse_response(frame: &[u8], key: i16, version: i16) -> (i32, KafkaResponse) {
        let mut buf = Bytes::copy_from_slice(frame);
        let size = buf.get_i32() as usize;
        assert_eq!(size, buf.len(), "size prefix");
        let header_version = api(key).response_header_version(version);
        let h = ResponseHeader::decode(&mut buf, header_version).unwrap();
        let body = KafkaResponse::decode_body(api(key), &mut buf, version).unwrap();
        assert!(buf.is_empty(), "{} bytes left after the body", buf.len());
        (h.correlation_id, body)
    }

    fn concat(segments: &ResponseSegments) -> Vec<u8> {
        let mut all = segments.head.to_vec();
        for p in &segments.payload {
            all.extend_from_slice(p);
        }
        all
    }

    /// A request with content in its main fields, valid at `version`.
    fn sample_request(key: i16, version: i16) -> KafkaRequest {
        match api(key) {
            ApiKey::Produce => {
                let mut p = PartitionProduceData::default();
                p.index = 3;
                p.records = Some(records(7, 300));
                let mut t = TopicProduceData::default();
                if version >= 13 {
                    t.topic_id = uuid!(1);
                } else {
                    t.name = TopicName(s("orders"));
                }
                t.partition_data = vec![p];
                let mut r = ProduceRequest::default();
                r.acks = -1;
                r.timeout_ms = 30_000;
                r.topic_data = vec![t];
                r.into()
            }
            ApiKey::Fetch => {
                let mut p = FetchPartition::default();
                p.partition = 2;
                p.fetch_offset = 1234;
                p.partition_max_bytes = 1 << 20;
                let mut t = FetchTopic::default();
                if version >= 13 {
                    t.topic_id = uuid!(2);
                } else {
                    t.topic = TopicName(s("orders"));
                }
                t.partitions = vec![p];
                let mut r = FetchRequest::default();
                r.max_wait_ms = 500;
                r.min_bytes = 1;
                r.max_bytes = i32::MAX;
                if version >= 7 {
                    r.session_id = 0x1234_5678;
                    r.session_epoch = 9;
                }
                r.topics = vec![t];
                r.into()
            }
            ApiKey::Metadata => {
                let mut t = MetadataRequestTopic::default();
                t.name = Some(TopicName(s("orders")));
                let mut r = MetadataRequest::default();
                r.topics = Some(vec![t]);
                r.into()
            }
            ApiKey::ListOffsets => {
                let mut p = ListOffsetsPartition::default();
                p.partition_index = 1;
                p.timestamp = -1;
                let mut t = ListOffsetsTopic::default();
                t.name = TopicName(s("orders"));
                t.partitions = vec![p];
                let mut r = ListOffsetsRequest::default();
                r.replica_id = BrokerId(-1);
                r.topics = vec![t];
                r.into()
            }
            ApiKey::JoinGroup => {
                let mut p = JoinGroupRequestProtocol::default();
                p.name = s("range");
                p.metadata = records(1, 40);
                let mut r = JoinGroupRequest::default();
                r.group_id = GroupId(s("g"));
                r.session_timeout_ms = 45_000;
                if version >= 1 {
                    r.rebalance_timeout_ms = 300_000;
                }
                r.protocol_type = s("consumer");
                r.protocols = vec![p];
                r.into()
            }
            ApiKey::SyncGroup => {
                let mut a = SyncGroupRequestAssignment::default();
                a.member_id = s("m-1");
                a.assignment = records(2, 24);
                let mut r = SyncGroupRequest::default();
                r.group_id = GroupId(s("g"));
                r.generation_id = 4;
                r.member_id = s("m-1");
                r.assignments = vec![a];
                r.into()
            }
            ApiKey::OffsetCommit => {
                let mut p = OffsetCommitRequestPartition::default();
                p.committed_offset = 99;
                let mut t = OffsetCommitRequestTopic::default();
                t.name = TopicName(s("orders"));
                t.partitions = vec![p];
                let mut r = OffsetCommitRequest::default();
                r.group_id = GroupId(s("g"));
                r.generation_id_or_member_epoch = 4;
                r.member_id = s("m-1");
                r.topics = vec![t];
                r.into()
            }
            ApiKey::OffsetFetch => {
                let mut r = OffsetFetchRequest::default();
                if version >= 8 {
                    let mut t = OffsetFetchRequestTopics::default();
                    t.name = TopicName(s("orders"));
                    t.partition_indexes = vec![0, 1];
                    let mut g = OffsetFetchRequestGroup::default();
                    g.group_id = GroupId(s("g"));
                    g.topics = Some(vec![t]);
                    r.groups = vec![g];
                } else {
                    let mut t = OffsetFetchRequestTopic::default();
                    t.name = TopicName(s("orders"));
                    t.partition_indexes = vec![0, 1];
                    r.group_id = GroupId(s("g"));
                    r.topics = Some(vec![t]);
                }
                r.into()
            }
            ApiKey::CreateTopics => {
                let mut t = CreatableTopic::default();
                t.name = TopicName(s("orders"));
                t.num_partitions = 3;
                t.replication_factor = 1;
                let mut r = CreateTopicsRequest::default();
                r.topics = vec![t];
                r.timeout_ms = 60_000;
                r.into()
            }
            ApiKey::ConsumerGroupHeartbeat => {
                let mut tp = TopicPartitions::default();
                tp.topic_id = uuid!(3);
                tp.partitions = vec![0, 1, 2];
                let mut r = ConsumerGroupHeartbeatRequest::default();
                r.group_id = GroupId(s("g"));
                r.member_id = s("member-uuid");
                r.rebalance_timeout_ms = 300_000;
                r.subscribed_topic_names = Some(vec![TopicName(s("orders"))]);
                r.topic_partitions = Some(vec![tp]);
                r.into()
            }
            other => KafkaRequest::default_of(other).unwrap(),
        }
    }

    /// A Fetch response with two topics: a batch, a null, an empty and a
    /// second batch.
    fn sample_fetch_response(version: i16) -> FetchResponse {
        let partition = |index: i32, recs: Option<Bytes>| {
            let mut p = PartitionData::default();
            p.partition_index = index;
            p.high_watermark = 1000 + i64::from(index);
            p.records = recs;
            p
        };
        let topic = |n: u8, name: &str, partitions: Vec<PartitionData>| {
            let mut t = FetchableTopicResponse::default();
            if version >= 13 {
                t.topic_id = uuid!(n);
            } else {
                t.topic = TopicName(s(name));
            }
            t.partitions = partitions;
            t
        };
        let mut r = FetchResponse::default();
        r.responses = vec![
            topic(
                1,
                "orders",
                vec![
                    partition(0, Some(records(10, 5000))),
                    partition(1, None),
                    partition(2, Some(Bytes::new())),
                ],
            ),
            topic(2, "audit", vec![partition(0, Some(records(20, 700)))]),
        ];
        r
    }

    /// Frames of every served API at its floor and ceiling (default and
    /// sample bodies).
    fn sample_frames() -> Vec<(i16, i16, Bytes)> {
        let mut frames = Vec::new();
        for &(key, min, max) in SUPPORTED {
            for v in [crate_min(key, min), max] {
                let default = KafkaRequest::default_of(api(key)).unwrap();
                frames.push((key, v, request_frame(&default, v, 7)));
                frames.push((key, v, request_frame(&sample_request(key, v), v, 8)));
            }
        }
        frames
    }

    fn is_malformed(r: &Result<RequestFrame, DecodeError>) -> bool {
        matches!(r, Err(DecodeError::Malformed { .. }))
    }

    // -- the version table ------------------------------------------------

    #[test]
    fn supported_table_is_within_kafka_protocol() {
        let mut keys: Vec<i16> = SUPPORTED.iter().map(|&(k, _, _)| k).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), SUPPORTED.len(), "an api listed twice");
        assert_eq!(SUPPORTED.len(), 49);
        for &(key, min, max) in SUPPORTED {
            let range = api(key).valid_versions();
            assert!(
                range.min <= crate_min(key, min) && min <= max && max <= range.max,
                "{key}: {min}..={max} outside kafka-protocol's {range}"
            );
            // Below the crate's floor only what `kafka_legacy` serves.
            for v in min..range.min {
                assert!(
                    matches!(legacy::legacy(api(key), v), Some(Legacy::Served { .. })),
                    "{key} v{v}"
                );
            }
        }
        // Transactions: both client flows (KIP-890's v2: EndTxn v5,
        // TxnOffsetCommit v5), no broker-to-broker markers or verification.
        assert_eq!(
            supported_versions(ApiKey::AddPartitionsToTxn as i16),
            Some((0, 3))
        );
        assert_eq!(supported_versions(ApiKey::EndTxn as i16), Some((0, 5)));
        assert_eq!(
            supported_versions(ApiKey::TxnOffsetCommit as i16),
            Some((0, 5))
        );
        let features = api_versions_response();
        assert!(features
            .finalized_features
            .iter()
            .any(|f| f.name.as_str() == "transaction.version" && f.max_version_level == 2));
        assert!(supported_versions(ApiKey::WriteTxnMarkers as i16).is_none());
        assert_eq!(supported_versions(ApiKey::Produce as i16), Some((3, 13)));
        // What old clients send (KIP-896 removed them from Kafka 4).
        assert!(is_supported(ApiKey::OffsetCommit as i16, 1));
        assert!(is_supported(ApiKey::OffsetFetch as i16, 0));
        assert!(is_supported(ApiKey::ListOffsets as i16, 0));
        // What librdkafka's KIP-848 consumer checks for.
        assert!(is_supported(ApiKey::ConsumerGroupHeartbeat as i16, 1));
        assert!(is_supported(ApiKey::OffsetCommit as i16, 9));
        assert!(is_supported(ApiKey::OffsetFetch as i16, 9));
    }

    #[test]
    fn api_versions_response_lists_the_table() {
        let r = api_versions_response();
        assert_eq!(r.api_keys.len(), SUPPORTED.len());
        assert!(r.api_keys.windows(2).all(|w| w[0].api_key < w[1].api_key));
        for a in &r.api_keys {
            let (min, max) = supported_versions(a.api_key).unwrap();
            let min = legacy::advertised_min(api(a.api_key)).unwrap_or(min);
            assert_eq!((min, max), (a.min_version, a.max_version));
        }
        // KAFKA-18659: librdkafka up to 2.11 compresses with gzip, snappy
        // and lz4 only if Produce v0 is advertised.
        let produce = r.api_keys.iter().find(|a| a.api_key == 0).unwrap();
        assert_eq!((produce.min_version, produce.max_version), (0, 13));
        for v in 0..=4 {
            let h = header(ApiKey::ApiVersions as i16, v, 11);
            let bytes = encode_response(&h, &r.clone().into()).unwrap();
            let (corr, body) = parse_response(&bytes, h.api_key, v);
            assert_eq!(corr, 11);
            assert_eq!(body, KafkaResponse::ApiVersions(features_at(r.clone(), v)));
        }
    }

    /// `r` as version `v` carries it: the features are v3's (tagged).
    fn features_at(mut r: ApiVersionsResponse, v: i16) -> ApiVersionsResponse {
        if v < 3 {
            r.supported_features.clear();
            r.finalized_features.clear();
            r.finalized_features_epoch = -1;
        }
        r
    }

    // -- round trips ----------------------------------------------------------

    #[test]
    fn requests_round_trip_at_every_served_version() {
        for &(key, min, max) in SUPPORTED {
            for v in crate_min(key, min)..=max {
                let bodies = [
                    KafkaRequest::default_of(api(key)).unwrap(),
                    sample_request(key, v),
                ];
                for body in bodies {
                    let frame = request_frame(&body, v, 0x0102_0304);
                    let got = decode_request(frame).unwrap_or_else(|e| panic!("{key} v{v}: {e}"));
                    assert_eq!(got.api_key, key);
                    assert_eq!(got.api_version, v);
                    assert_eq!(got.correlation_id, 0x0102_0304);
                    assert_eq!(got.client_id.as_deref(), Some("weir-test"));
                    assert_eq!(got.body, body, "{key} v{v}");
                    assert_eq!(got.header(), header(key, v, 0x0102_0304));
                }
            }
        }
    }

    fn sample_response(key: i16, version: i16) -> KafkaResponse {
        match api(key) {
            ApiKey::Produce => {
                let mut p = PartitionProduceResponse::default();
                p.index = 3;
                p.base_offset = 42;
                let mut t = TopicProduceResponse::default();
                if version >= 13 {
                    t.topic_id = uuid!(4);
                } else {
                    t.name = TopicName(s("orders"));
                }
                t.partition_responses = vec![p];
                let mut r = ProduceResponse::default();
                r.responses = vec![t];
                r.into()
            }
            ApiKey::Fetch => sample_fetch_response(version).into(),
            ApiKey::Metadata => {
                let mut b = MetadataResponseBroker::default();
                b.node_id = BrokerId(1);
                b.host = s("127.0.0.1");
                b.port = 9092;
                let mut t = MetadataResponseTopic::default();
                t.name = Some(TopicName(s("orders")));
                if version >= 10 {
                    t.topic_id = uuid!(5);
                }
                let mut r = MetadataResponse::default();
                r.brokers = vec![b];
                r.topics = vec![t];
                r.into()
            }
            ApiKey::ApiVersions => features_at(api_versions_response(), version).into(),
            other => KafkaResponse::default_of(other).unwrap(),
        }
    }

    #[test]
    fn responses_round_trip_at_every_served_version() {
        for &(key, min, max) in SUPPORTED {
            for v in crate_min(key, min)..=max {
                let bodies = [
                    KafkaResponse::default_of(api(key)).unwrap(),
                    sample_response(key, v),
                ];
                for body in bodies {
                    let h = header(key, v, -5);
                    let bytes =
                        encode_response(&h, &body).unwrap_or_else(|e| panic!("{key} v{v}: {e}"));
                    let (corr, got) = parse_response(&bytes, key, v);
                    assert_eq!(corr, -5);
                    assert_eq!(got, body, "{key} v{v}");
                }
            }
        }
    }

    #[test]
    fn header_versions() {
        let av = ApiKey::ApiVersions as i16;
        // ApiVersions: request header v2 from v3, response header always v0.
        assert_eq!(api(av).request_header_version(2), 1);
        assert_eq!(api(av).request_header_version(3), 2);
        for v in 0..=4 {
            let bytes =
                encode_response(&header(av, v, 3), &ApiVersionsResponse::default().into()).unwrap();
            // Size, correlation id, then at once the error code (no tagged
            // fields byte), then the api keys array.
            assert_eq!(&bytes[4..8], &3i32.to_be_bytes());
            assert_eq!(&bytes[8..10], &[0, 0]);
            let array_len = if v >= 3 { 1 } else { 4 };
            let throttle = if v >= 1 { 4 } else { 0 };
            let tags = if v >= 3 { 1 } else { 0 };
            assert_eq!(bytes.len(), 10 + array_len + throttle + tags, "v{v}");
        }
        // Others: header v1 (a tagged-fields byte after the correlation id)
        // exactly from their first flexible version.
        let cases = [
            (ApiKey::Fetch, 11, 0),
            (ApiKey::Fetch, 12, 1),
            (ApiKey::Metadata, 8, 0),
            (ApiKey::Metadata, 9, 1),
            (ApiKey::Produce, 8, 0),
            (ApiKey::Produce, 9, 1),
            (ApiKey::ConsumerGroupHeartbeat, 0, 1),
        ];
        for (a, v, hv) in cases {
            let key = a as i16;
            assert_eq!(a.response_header_version(v), hv);
            assert_eq!(a.request_header_version(v), hv + 1);
            let body = KafkaResponse::default_of(a).unwrap();
            let bytes = encode_response(&header(key, v, 77), &body).unwrap();
            let mut plain = BytesMut::new();
            body.encode_body(&mut plain, v).unwrap();
            assert_eq!(bytes.len(), 8 + hv as usize + plain.len(), "{a:?} v{v}");
            assert_eq!(&bytes[8 + hv as usize..], &plain[..]);
            if hv == 1 {
                assert_eq!(bytes[8], 0, "empty tagged fields in the header");
            }
            // And a request frame built with that header version decodes.
            let frame = request_frame(&sample_request(key, v), v, 1);
            assert!(decode_request(frame).is_ok(), "{a:?} v{v}");
        }
    }

    // -- ApiVersions fallback and error responses ----------------------------

    #[test]
    fn api_versions_fallback_bytes() {
        // A client newer than us: ApiVersions v9, header v2, a body we do not
        // know.
        let mut frame = BytesMut::new();
        frame.put_i16(18);
        frame.put_i16(9);
        frame.put_i32(0x0A0B_0C0D);
        frame.put_i16(3);
        frame.put_slice(b"cli");
        frame.put_u8(0);
        frame.put_slice(&[0x42; 13]);
        let err = decode_request(frame.freeze()).unwrap_err();
        let h = header(18, 9, 0x0A0B_0C0D);
        assert_eq!(err, DecodeError::UnsupportedVersion { header: h });
        assert_eq!(err.correlation_id(), Some(0x0A0B_0C0D));

        let bytes = error_response(&h, UNSUPPORTED_VERSION).unwrap();
        let expected: &[u8] = &[
            0, 0, 0, 16, // size
            0x0A, 0x0B, 0x0C, 0x0D, // correlation id, header v0
            0, 35, // UNSUPPORTED_VERSION
            0, 0, 0, 1, // one api key (int32 count: v0 body)
            0, 18, 0, 0, 0, 4, // ApiVersions 0..=4
        ];
        assert_eq!(&bytes[..], expected);
        // What a client reads: a v0 body.
        let (corr, body) = parse_response(&bytes, 18, 0);
        assert_eq!(corr, 0x0A0B_0C0D);
        let KafkaResponse::ApiVersions(r) = body else {
            panic!("not ApiVersions")
        };
        assert_eq!(r.error_code, UNSUPPORTED_VERSION);
        assert_eq!(r.api_keys[0].max_version, 4);

        // The same for negative versions.
        let neg = error_response(&header(18, -1, 1), UNSUPPORTED_VERSION).unwrap();
        assert_eq!(neg.len(), expected.len());
    }

    #[test]
    fn error_responses_where_kafka_has_a_top_level_error() {
        let top_level: &[(ApiKey, Range<i16>)] = &[
            (ApiKey::Fetch, 7..19),
            (ApiKey::Metadata, 13..14),
            (ApiKey::FindCoordinator, 0..4),
            (ApiKey::JoinGroup, 0..10),
            (ApiKey::SyncGroup, 0..6),
            (ApiKey::Heartbeat, 0..5),
            (ApiKey::LeaveGroup, 0..6),
            (ApiKey::ListGroups, 0..6),
            (ApiKey::OffsetFetch, 2..8),
            (ApiKey::InitProducerId, 0..7),
            (ApiKey::DescribeCluster, 0..3),
            (ApiKey::ConsumerGroupHeartbeat, 0..2),
            (ApiKey::ShareGroupHeartbeat, 1..2),
            (ApiKey::ShareFetch, 1..2),
            (ApiKey::ShareAcknowledge, 1..2),
            (ApiKey::DescribeAcls, 1..4),
            (ApiKey::DescribeClientQuotas, 0..2),
        ];
        for &(key, _, max) in SUPPORTED {
            let a = api(key);
            for v in -1..=max + 2 {
                let got = error_response(&header(key, v, 5), INVALID_REQUEST);
                if a == ApiKey::ApiVersions {
                    let bytes = got.expect("ApiVersions always answers");
                    let at = if is_supported(key, v) { v } else { 0 };
                    let (_, body) = parse_response(&bytes, key, at);
                    let KafkaResponse::ApiVersions(r) = body else {
                        panic!()
                    };
                    assert_eq!(r.error_code, INVALID_REQUEST);
                    assert!(r.api_keys.is_empty());
                    continue;
                }
                let expected = top_level
                    .iter()
                    .any(|(k, range)| *k == a && range.contains(&v));
                assert_eq!(got.is_some(), expected, "{a:?} v{v}");
                if let Some(bytes) = got {
                    let (corr, body) = parse_response(&bytes, key, v);
                    assert_eq!(corr, 5);
                    let mut expected = KafkaResponse::default_of(a).unwrap();
                    set_error(&mut expected, INVALID_REQUEST);
                    assert_eq!(body, expected, "{a:?} v{v}");
                }
            }
        }
        // Not served: nothing (the caller closes).
        for key in [17, 27, 36, 999, -1] {
            assert_eq!(
                error_response(&header(key, 0, 1), UNSUPPORTED_VERSION),
                None
            );
        }
    }

    fn set_error(r: &mut KafkaResponse, code: i16) {
        match r {
            KafkaResponse::Fetch(m) => m.error_code = code,
            KafkaResponse::Metadata(m) => m.error_code = code,
            KafkaResponse::FindCoordinator(m) => m.error_code = code,
            KafkaResponse::JoinGroup(m) => m.error_code = code,
            KafkaResponse::SyncGroup(m) => m.error_code = code,
            KafkaResponse::Heartbeat(m) => m.error_code = code,
            KafkaResponse::LeaveGroup(m) => m.error_code = code,
            KafkaResponse::ListGroups(m) => m.error_code = code,
            KafkaResponse::OffsetFetch(m) => m.error_code = code,
            KafkaResponse::InitProducerId(m) => m.error_code = code,
            KafkaResponse::DescribeCluster(m) => m.error_code = code,
            KafkaResponse::ConsumerGroupHeartbeat(m) => m.error_code = code,
            KafkaResponse::ShareGroupHeartbeat(m) => m.error_code = code,
            KafkaResponse::ShareFetch(m) => m.error_code = code,
            KafkaResponse::ShareAcknowledge(m) => m.error_code = code,
            KafkaResponse::DescribeAcls(m) => m.error_code = code,
            KafkaResponse::DescribeClientQuotas(m) => m.error_code = code,
            other => panic!("no top-level error in {other:?}"),
        }
    }

    #[test]
    fn unsupported_apis_and_versions_carry_the_header() {
        let cases: &[(i16, i16, bool)] = &[
            (27, 1, true),  // WriteTxnMarkers: not served
            (57, 1, true),  // UpdateFeatures: not served
            (17, 2, false), // SaslHandshake v2
            (999, 0, true), // unknown
            (0, 14, false), // Produce v14
            (8, 10, false), // OffsetCommit v10 (unstable in 4.1)
            (22, 6, false), // InitProducerId v6 (unstable in 4.1)
            (1, 3, false),  // Fetch v3
        ];
        for &(key, v, api_err) in cases {
            let mut frame = BytesMut::new();
            frame.put_i16(key);
            frame.put_i16(v);
            frame.put_i32(-77);
            frame.put_i16(-1);
            let err = decode_request(frame.freeze()).unwrap_err();
            let h = header(key, v, -77);
            if api_err {
                assert_eq!(err, DecodeError::UnsupportedApi { header: h });
            } else {
                assert_eq!(err, DecodeError::UnsupportedVersion { header: h });
            }
            assert_eq!(err.correlation_id(), Some(-77));
        }
        // Too short for a header.
        let err = decode_request(Bytes::from_static(&[0, 3, 0, 1, 0])).unwrap_err();
        assert_eq!(err.correlation_id(), None);
        // A header but no client id.
        let err = decode_request(Bytes::from_static(&[0, 3, 0, 1, 0, 0, 0, 9])).unwrap_err();
        assert!(matches!(
            err,
            DecodeError::Malformed {
                header: Some(RequestHeaderInfo {
                    correlation_id: 9,
                    ..
                }),
                ..
            }
        ));
    }

    #[test]
    fn oversized_frames_are_refused() {
        let mut frame = BytesMut::zeroed(MAX_REQUEST_FRAME_BYTES + 1);
        frame[..8].copy_from_slice(&[0, 18, 0, 0, 0, 0, 0, 5]);
        let err = decode_request(frame.freeze()).unwrap_err();
        assert!(matches!(err, DecodeError::Malformed { .. }));
        assert_eq!(err.correlation_id(), Some(5));
    }

    #[test]
    fn peek_frame_len() {
        assert_eq!(peek_request_frame_len(&[0, 0, 0], 1000), Ok(None));
        assert_eq!(
            peek_request_frame_len(&[0, 0, 0, 20, 1], 1000),
            Ok(Some(24))
        );
        assert_eq!(
            peek_request_frame_len(&[0xff, 0xff, 0xff, 0xff], 1000),
            Err(FrameLenError::Negative(-1))
        );
        assert_eq!(
            peek_request_frame_len(&[0, 0, 0, 9], 1000),
            Err(FrameLenError::TooShort(9))
        );
        assert_eq!(
            peek_request_frame_len(&[0, 0, 4, 0], 1000),
            Err(FrameLenError::TooLarge {
                len: 1024,
                max: 1000
            })
        );
        assert_eq!(
            peek_request_frame_len(&[0x7f, 0, 0, 0], usize::MAX),
            Err(FrameLenError::TooLarge {
                len: 0x7f00_0000,
                max: MAX_REQUEST_FRAME_BYTES
            })
        );
    }

    #[test]
    fn encode_errors() {
        let body: KafkaResponse = HeartbeatResponse::default().into();
        assert_eq!(
            encode_response(&header(ApiKey::Fetch as i16, 4, 1), &body).unwrap_err(),
            EncodeError::ApiMismatch {
                request: 1,
                response: 12
            }
        );
        assert!(matches!(
            encode_response(&header(12, 99, 1), &body),
            Err(EncodeError::Invalid { .. })
        ));
        assert!(matches!(
            encode_fetch_response(
                &header(12, 4, 1),
                &FetchResponse::default(),
                FetchBatches::default()
            ),
            Err(EncodeError::ApiMismatch { .. })
        ));
        // Fields a version lacks are left out, not refused (kafka-protocol
        // checks only non-ignorable ones): a response may carry both a
        // topic's name and its id, and each version writes its own.
        let mut both = sample_fetch_response(13);
        for t in &mut both.responses {
            t.topic = TopicName(s("named"));
        }
        for v in [12, 13] {
            let bytes = encode_response(&header(1, v, 1), &both.clone().into()).unwrap();
            let (_, KafkaResponse::Fetch(got)) = parse_response(&bytes, 1, v) else {
                panic!()
            };
            assert_eq!(
                got.responses[0].topic.0.as_str(),
                if v < 13 { "named" } else { "" }
            );
            assert_eq!(
                got.responses[0].topic_id == both.responses[0].topic_id,
                v >= 13
            );
        }
    }

    // -- tagged fields --------------------------------------------------------

    #[test]
    fn tagged_fields_at_defaults_are_left_out() {
        // ApiVersions v3: SupportedFeatures, FinalizedFeaturesEpoch,
        // FinalizedFeatures and ZkMigrationReady are tagged; at their
        // defaults none is written.
        let mut r = ApiVersionsResponse::default();
        r.api_keys = vec![api_version_entry(18, 0, 4)];
        let bytes = encode_response(&header(18, 3, 1), &r.clone().into()).unwrap();
        let body: &[u8] = &[
            0, 0, // error code
            2, // one api key (compact)
            0, 18, 0, 0, 0, 4, 0, // key, min, max, no tagged fields
            0, 0, 0, 0, // throttle
            0, // no tagged fields
        ];
        assert_eq!(&bytes[8..], body);
        // Set one and it is written (tag 1, 8 bytes).
        r.finalized_features_epoch = 5;
        let bytes = encode_response(&header(18, 3, 1), &r.into()).unwrap();
        assert_eq!(
            &bytes[8 + body.len() - 1..],
            &[1, 1, 8, 0, 0, 0, 0, 0, 0, 0, 5]
        );

        // Fetch v12: a partition's DivergingEpoch, CurrentLeader and
        // SnapshotId are tagged.
        let mut p = PartitionData::default();
        p.partition_index = 0;
        p.last_stable_offset = -1;
        p.log_start_offset = -1;
        p.aborted_transactions = None;
        p.preferred_read_replica = BrokerId(-1);
        p.records = None;
        let mut t = FetchableTopicResponse::default();
        t.topic = TopicName(s("t"));
        t.partitions = vec![p.clone()];
        let mut f = FetchResponse::default();
        f.responses = vec![t.clone()];
        let bytes = encode_response(&header(1, 12, 1), &f.into()).unwrap();
        let mut body = vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0]; // throttle, error, session
        body.extend_from_slice(&[2, 2, b't', 2]); // 1 topic "t", 1 partition
        body.extend_from_slice(&[0, 0, 0, 0, 0, 0]); // index, error
        body.extend_from_slice(&[0; 8]); // high watermark
        body.extend_from_slice(&[0xff; 16]); // last stable, log start
        body.push(0); // aborted transactions: null
        body.extend_from_slice(&[0xff; 4]); // preferred read replica
        body.push(0); // records: null
        body.extend_from_slice(&[0, 0, 0]); // partition, topic, response: no tagged fields
        assert_eq!(&bytes[9..], &body[..]);
        // A non-default one is written.
        p.diverging_epoch.epoch = 3;
        t.partitions = vec![p];
        let mut f = FetchResponse::default();
        f.responses = vec![t];
        let with = encode_response(&header(1, 12, 1), &f.into()).unwrap();
        assert!(with.len() > bytes.len());
    }

    // -- zero copy ------------------------------------------------------------

    #[test]
    fn produce_records_are_slices_of_the_frame() {
        for v in [3, 8, 9, 12, 13] {
            let frame = request_frame(&sample_request(0, v), v, 1);
            let range = frame.as_ptr_range();
            let got = decode_request(frame.clone()).unwrap();
            let KafkaRequest::Produce(p) = got.body else {
                panic!("not produce")
            };
            let recs = p.topic_data[0].partition_data[0].records.clone().unwrap();
            assert_eq!(recs, records(7, 300));
            let r = recs.as_ptr_range();
            assert!(
                range.start <= r.start && r.end <= range.end,
                "v{v}: records copied out of the frame"
            );
        }
    }

    #[test]
    fn fetch_response_segments_are_the_callers_batches() {
        for v in 4..=18 {
            let response = sample_fetch_response(v);
            let h = header(1, v, 99);
            let segments = encode_fetch_response(&h, &response, FetchBatches::default()).unwrap();
            // The two non-empty batches are segments of their own, the
            // caller's memory.
            let given: Vec<&Bytes> = response
                .responses
                .iter()
                .flat_map(|t| &t.partitions)
                .filter_map(|p| p.records.as_ref())
                .filter(|r| !r.is_empty())
                .collect();
            let same: Vec<&Bytes> = segments
                .payload
                .iter()
                .filter(|seg| {
                    given
                        .iter()
                        .any(|g| g.as_ptr() == seg.as_ptr() && g.len() == seg.len())
                })
                .collect();
            assert_eq!(same.len(), 2, "v{v}");
            // The bytes are those of the copying encoder, and decode back.
            let all = concat(&segments);
            assert_eq!(all.len(), segments.total_len());
            let copied = encode_response(&h, &response.clone().into()).unwrap();
            assert_eq!(&all[..], &copied[..], "v{v}");
            let (corr, body) = parse_response(&all, 1, v);
            assert_eq!(corr, 99);
            assert_eq!(body, KafkaResponse::Fetch(response.clone()), "v{v}");
            assert_eq!(
                segments.clone().into_segments().len(),
                segments.payload.len() + 1
            );
        }
        // Large batches keep their length prefix right (varint of 3 bytes).
        let mut r = sample_fetch_response(16);
        r.responses[0].partitions[0].records = Some(records(3, 3 << 20));
        let segments =
            encode_fetch_response(&header(1, 16, 1), &r, FetchBatches::default()).unwrap();
        let (_, body) = parse_response(&concat(&segments), 1, 16);
        assert_eq!(body, KafkaResponse::Fetch(r));
        // No batches: one segment.
        let segments = encode_fetch_response(
            &header(1, 18, 1),
            &FetchResponse::default(),
            FetchBatches::default(),
        )
        .unwrap();
        assert!(segments.payload.is_empty());
    }

    #[test]
    fn several_batches_of_a_partition_are_sent_as_they_are_not_copied() {
        let big = weir_proto::segments::SEGMENT_MIN_BYTES;
        let (a, b, c, d) = (
            records(1, big),
            records(2, big + 7000),
            records(3, 3 * big),
            records(4, big + 1),
        );
        let (s1, s2) = (records(5, 500), records(6, 90));
        for v in 4..=18 {
            let h = header(1, v, 7);
            let mut response = sample_fetch_response(v);
            let mut batches = FetchBatches::default();
            // A short batch alone between long ones (`single`, 5000 bytes),
            // and two short ones together.
            let single = response.responses[0].partitions[0].records.clone().unwrap();
            let first = [a.clone(), s1.clone(), s2.clone(), b.clone(), c.clone()];
            let second = [d.clone(), single.clone()];
            response.responses[0].partitions[0].records = Some(batches.records(&first));
            response.responses[1].partitions[0].records = Some(batches.records(&second));
            let segments = encode_fetch_response(&h, &response, batches).unwrap();
            // Every long batch, and the short one alone, is a segment of
            // its own, the caller's memory; the two short neighbours are one
            // segment.
            let is_segment = |batch: &Bytes| {
                segments
                    .payload
                    .iter()
                    .any(|seg| seg.as_ptr() == batch.as_ptr() && seg.len() == batch.len())
            };
            for batch in [&a, &b, &c, &d, &single] {
                assert!(is_segment(batch), "v{v}: a batch was copied");
            }
            assert!(!is_segment(&s1) && !is_segment(&s2), "v{v}");
            let joined_short = [s1.clone(), s2.clone()].concat();
            assert!(
                segments
                    .payload
                    .iter()
                    .any(|seg| seg[..] == joined_short[..]),
                "v{v}: short neighbours not one segment"
            );
            // The bytes are those of the same answer with the batches
            // concatenated, and decode back to it.
            let mut joined = response.clone();
            joined.responses[0].partitions[0].records = Some(first.concat().into());
            joined.responses[1].partitions[0].records = Some(second.concat().into());
            let copied = encode_response(&h, &joined.clone().into()).unwrap();
            let all = concat(&segments);
            assert_eq!(&all[..], &copied[..], "v{v}");
            let (_, body) = parse_response(&all, 1, v);
            assert_eq!(body, KafkaResponse::Fetch(joined), "v{v}");
        }
        // Only short batches: one joined copy, no stand-in; nothing (or only
        // empty batches): empty records.
        let mut batches = FetchBatches::default();
        assert_eq!(
            batches.records(&[s1.clone(), s2.clone()])[..],
            [s1.clone(), s2.clone()].concat()[..]
        );
        assert!(batches.records(&[Bytes::new(), Bytes::new()]).is_empty());
        assert!(batches.records(&[]).is_empty());
        assert!(batches.spans.is_empty());
        // A stand-in whose batches are missing, or batches for no
        // partition, are refused: never zeros on the wire.
        let h = header(1, 16, 7);
        let mut response = sample_fetch_response(16);
        let mut batches = FetchBatches::default();
        response.responses[0].partitions[0].records =
            Some(batches.records(&[a.clone(), b.clone()]));
        assert!(encode_fetch_response(&h, &response, FetchBatches::default()).is_err());
        let mut other = FetchBatches::default();
        other.records(&[a.clone(), c.clone()]);
        assert!(encode_fetch_response(&h, &response, other).is_err());
        let mut extra = FetchBatches::default();
        extra.records(&[c.clone(), d.clone()]);
        assert!(encode_fetch_response(&h, &sample_fetch_response(16), extra).is_err());
        assert!(encode_fetch_response(&h, &response, batches).is_ok());
    }

    // -- hostile input --------------------------------------------------------

    #[test]
    fn every_truncation_fails() {
        for (key, v, frame) in sample_frames() {
            for cut in 0..frame.len() {
                let r = decode_request(frame.slice(..cut));
                assert!(r.is_err(), "{key} v{v} cut at {cut} of {}", frame.len());
            }
            assert!(decode_request(frame).is_ok());
        }
    }

    /// Decodes a hostile frame: an error, fast, without a large allocation.
    fn assert_refused(frame: Bytes, what: &str) {
        let start = Instant::now();
        let (r, largest) = largest_allocation(|| decode_request(frame));
        assert!(is_malformed(&r), "{what}: {r:?}");
        assert!(largest <= 64 << 10, "{what}: allocated {largest} bytes");
        assert!(start.elapsed() < Duration::from_secs(1), "{what}: slow");
    }

    fn head(key: ApiKey, version: i16) -> BytesMut {
        let mut b = BytesMut::new();
        b.put_i16(key as i16);
        b.put_i16(version);
        b.put_i32(1);
        b.put_i16(1);
        b.put_u8(b'c');
        if key.request_header_version(version) >= 2 {
            b.put_u8(0);
        }
        b
    }

    #[test]
    fn hostile_lengths_fail_without_allocating() {
        // Metadata v1: topics array of i32::MAX.
        let mut f = head(ApiKey::Metadata, 1);
        f.put_i32(i32::MAX);
        f.put_slice(&[0; 16]);
        assert_refused(f.freeze(), "array i32::MAX");

        // Metadata v12: topics compact array of u32::MAX - 1 elements.
        let mut f = head(ApiKey::Metadata, 12);
        f.put_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        f.put_slice(&[0; 16]);
        assert_refused(f.freeze(), "compact array u32::MAX");

        // Every 5-byte varint prefix shape (continuation bits set).
        let mut f = head(ApiKey::Metadata, 12);
        f.put_slice(&[0x80, 0x80, 0x80, 0x80, 0x08]);
        assert_refused(f.freeze(), "compact array 2^31");

        // Fetch v4: one topic, then partitions of i32::MAX.
        let mut f = head(ApiKey::Fetch, 4);
        f.put_i32(-1); // replica
        f.put_i32(500); // max wait
        f.put_i32(1); // min bytes
        f.put_i32(i32::MAX); // max bytes (a plain field: allowed)
        f.put_i8(0); // isolation
        f.put_i32(1); // topics
        f.put_i16(1);
        f.put_u8(b't');
        f.put_i32(i32::MAX); // partitions
        f.put_slice(&[0; 28]);
        assert_refused(f.freeze(), "nested array i32::MAX");

        // Fetch v12: nested compact array.
        let mut f = head(ApiKey::Fetch, 12);
        f.put_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 0]);
        f.put_slice(&[0; 13]);
        assert_refused(f.freeze(), "fetch v12 garbage");

        // Client id longer than the frame.
        let mut f = BytesMut::new();
        f.put_i16(3);
        f.put_i16(1);
        f.put_i32(1);
        f.put_i16(i16::MAX);
        f.put_slice(b"abc");
        assert_refused(f.freeze(), "client id over the frame");

        // A compact string longer than the frame (topic name).
        let mut f = head(ApiKey::Metadata, 12);
        f.put_u8(2); // one topic
        f.put_slice(&[0; 16]); // topic id
        f.put_slice(&[0xfe, 0xff, 0xff, 0x7f]); // name length
        f.put_slice(b"abc");
        assert_refused(f.freeze(), "compact string over the frame");

        // Produce v3 and v9: records longer than the frame.
        for (v, len) in [
            (3, &i32::MAX.to_be_bytes()[..]),
            (9, &[0xff, 0xff, 0xff, 0xff, 0x0f][..]),
        ] {
            let frame = request_frame(&sample_request(0, v), v, 1);
            let mut f = BytesMut::from(&frame[..]);
            // The records' length sits right before the 300 record bytes.
            let at = frame.len() - 300 - if v >= 9 { 2 + 1 + 1 + 1 } else { 4 };
            let old = if v >= 9 { 2 } else { 4 };
            let mut patched = BytesMut::from(&f[..at]);
            patched.put_slice(len);
            patched.put_slice(&f.split_off(at + old));
            assert_refused(patched.freeze(), "records over the frame");
        }

        // Tagged fields: a count of u32::MAX.
        let mut f = head(ApiKey::ApiVersions, 3);
        f.put_u8(1); // software name ""
        f.put_u8(1); // software version ""
        f.put_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_refused(f.freeze(), "tag count u32::MAX");
    }

    #[test]
    fn lengths_up_to_the_bytes_left_stay_bounded() {
        // The most an array may declare: the bytes left. A frame of 4 KiB
        // declaring that many topics reserves elements for them, no more.
        for v in [1, 12] {
            let mut f = head(ApiKey::Metadata, v);
            let left = 4096;
            if v >= 9 {
                let mut n = left as u32 + 1;
                while n >= 0x80 {
                    f.put_u8((n as u8) | 0x80);
                    n >>= 7;
                }
                f.put_u8(n as u8);
            } else {
                f.put_i32(left as i32);
            }
            f.put_slice(&vec![0xee; left]);
            let (r, largest) = largest_allocation(|| decode_request(f.freeze()));
            assert!(is_malformed(&r));
            let element = std::mem::size_of::<MetadataRequestTopic>();
            assert!(
                largest <= (left + VARINT_LENGTH_SLACK) * element,
                "{largest}"
            );
        }
    }

    #[test]
    fn large_plain_i32_fields_decode() {
        // Non-flexible requests whose int32 fields exceed the bytes left:
        // decoded twice (see decode_request), to the same values.
        let mut fetch = FetchRequest::default();
        let mut p = FetchPartition::default();
        p.partition = i32::MAX;
        p.partition_max_bytes = i32::MAX;
        let mut t = FetchTopic::default();
        t.topic = TopicName(s("t"));
        t.partitions = vec![p];
        fetch.max_wait_ms = i32::MAX;
        fetch.min_bytes = i32::MAX;
        fetch.max_bytes = i32::MAX;
        fetch.session_id = i32::MAX;
        fetch.session_epoch = 0x7000_0000;
        fetch.topics = vec![t];
        let body: KafkaRequest = fetch.into();
        for v in [4, 7, 11, 12, 18] {
            let frame = request_frame(&body, v, i32::MAX);
            let got = decode_request(frame).unwrap();
            let KafkaRequest::Fetch(got_fetch) = &got.body else {
                panic!()
            };
            let KafkaRequest::Fetch(want) = &body else {
                panic!()
            };
            assert_eq!(got_fetch.max_bytes, want.max_bytes, "v{v}");
            assert_eq!(
                got_fetch.topics[0].partitions, want.topics[0].partitions,
                "v{v}"
            );
            if v >= 7 {
                assert_eq!(got_fetch.session_id, want.session_id);
            }
            assert_eq!(got.correlation_id, i32::MAX);
        }
    }

    #[test]
    fn unknown_tagged_fields_are_skipped() {
        // Metadata v12 with an unknown top-level tag 7 (2 bytes).
        let frame = request_frame(&sample_request(3, 12), 12, 1);
        let mut f = BytesMut::from(&frame[..frame.len() - 1]);
        f.put_slice(&[1, 7, 2, 0xab, 0xcd]);
        let got = decode_request(f.freeze()).unwrap();
        let KafkaRequest::Metadata(m) = got.body else {
            panic!()
        };
        assert_eq!(
            m.unknown_tagged_fields.get(&7).map(|b| &b[..]),
            Some(&[0xab, 0xcd][..])
        );
        // A tag number beyond the bytes left plus the slack is refused (the
        // price of checking varints before kafka-protocol reserves).
        let mut f = BytesMut::from(&frame[..frame.len() - 1]);
        f.put_slice(&[1, 0x80, 0x40, 0]); // tag 8192, size 0
        assert!(is_malformed(&decode_request(f.freeze())));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_request(Bytes::from(bytes));
        }

        #[test]
        fn random_bodies_of_served_apis(
            idx in 0..SUPPORTED.len(),
            pick in any::<u16>(),
            corr in any::<i32>(),
            body in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let (key, min, max) = SUPPORTED[idx];
            let v = min + (pick % (max - min + 1) as u16) as i16;
            let mut f = head(api(key), v);
            f[4..8].copy_from_slice(&corr.to_be_bytes());
            f.put_slice(&body);
            let len = f.len();
            let (r, largest) = largest_allocation(|| decode_request(f.freeze()));
            if let Err(e) = &r {
                prop_assert_eq!(e.correlation_id(), Some(corr));
            }
            prop_assert!(largest <= (len + VARINT_LENGTH_SLACK) * 256, "{} bytes", largest);
        }

        #[test]
        fn mutated_frames_never_panic(
            idx in any::<prop::sample::Index>(),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        ) {
            let frames = sample_frames();
            let (_, _, frame) = &frames[idx.index(frames.len())];
            let mut f = frame.to_vec();
            for (at, b) in edits {
                let i = at.index(f.len());
                f[i] = b;
            }
            let _ = decode_request(Bytes::from(f));
        }
    }

    /// A frame with request header v1 (client id "old") and `body`.
    fn legacy_frame(key: ApiKey, version: i16, body: &[u8]) -> Bytes {
        let mut f = BytesMut::new();
        f.put_i16(key as i16);
        f.put_i16(version);
        f.put_i32(31);
        f.put_i16(3);
        f.put_slice(b"old");
        f.put_slice(body);
        f.freeze()
    }

    fn put_str16(b: &mut BytesMut, v: &str) {
        b.put_i16(v.len() as i16);
        b.put_slice(v.as_bytes());
    }

    #[test]
    fn old_versions_kafka_4_removed_are_served_in_their_own_shape() {
        // OffsetCommit v1 as sarama 1.22 sends it.
        let mut body = BytesMut::new();
        put_str16(&mut body, "g");
        body.put_i32(3); // generation
        put_str16(&mut body, "m");
        body.put_i32(1);
        put_str16(&mut body, "t");
        body.put_i32(1);
        body.put_i32(2); // partition
        body.put_i64(30); // offset
        body.put_i64(-1); // commit timestamp
        put_str16(&mut body, "meta");
        let req = decode_request(legacy_frame(ApiKey::OffsetCommit, 1, &body)).unwrap();
        assert_eq!(
            (req.api_version, req.client_id.as_deref()),
            (1, Some("old"))
        );
        let KafkaRequest::OffsetCommit(c) = &req.body else {
            panic!("{req:?}")
        };
        assert_eq!(
            (
                c.group_id.0.as_str(),
                c.generation_id_or_member_epoch,
                c.member_id.as_str()
            ),
            ("g", 3, "m")
        );
        let p = &c.topics[0].partitions[0];
        assert_eq!(c.topics[0].name.0.as_str(), "t");
        assert_eq!(
            (
                p.partition_index,
                p.committed_offset,
                p.committed_metadata.as_deref()
            ),
            (2, 30, Some("meta"))
        );
        // The answer is v2's shape, which is v0's and v1's.
        let answer = encode_response(
            &req.header(),
            &KafkaResponse::default_of(ApiKey::OffsetCommit).unwrap(),
        )
        .unwrap();
        let (corr, _) = parse_response(&answer, 8, 2);
        assert_eq!(corr, 31);

        // ListOffsets v0: one offset in `old_style_offsets`.
        let mut body = BytesMut::new();
        body.put_i32(-1);
        body.put_i32(1);
        put_str16(&mut body, "t");
        body.put_i32(1);
        body.put_i32(0);
        body.put_i64(-1); // latest
        body.put_i32(1); // max offsets
        let req = decode_request(legacy_frame(ApiKey::ListOffsets, 0, &body)).unwrap();
        let KafkaRequest::ListOffsets(l) = &req.body else {
            panic!("{req:?}")
        };
        assert_eq!(l.topics[0].partitions[0].timestamp, -1);
        let mut part =
            kafka_protocol::messages::list_offsets_response::ListOffsetsPartitionResponse::default(
            );
        part.partition_index = 0;
        part.offset = 250;
        let mut topic =
            kafka_protocol::messages::list_offsets_response::ListOffsetsTopicResponse::default();
        topic.name = TopicName(s("t"));
        topic.partitions = vec![part];
        let mut resp = ListOffsetsResponse::default();
        resp.topics = vec![topic];
        let answer = encode_response(&req.header(), &resp.into()).unwrap();
        let mut want = BytesMut::new();
        want.put_i32(0); // size, patched below
        want.put_i32(31);
        want.put_i32(1);
        put_str16(&mut want, "t");
        want.put_i32(1);
        want.put_i32(0);
        want.put_i16(0);
        want.put_i32(1);
        want.put_i64(250);
        let len = (want.len() - 4) as i32;
        want[..4].copy_from_slice(&len.to_be_bytes());
        assert_eq!(&answer[..], &want[..]);
    }

    #[test]
    fn produce_below_v3_is_refused_partition_by_partition() {
        for version in 0..=2 {
            let mut body = BytesMut::new();
            body.put_i16(-1); // acks
            body.put_i32(1000);
            body.put_i32(1);
            put_str16(&mut body, "t");
            body.put_i32(2);
            for p in [4, 5] {
                body.put_i32(p);
                body.put_i32(3);
                body.put_slice(b"xyz"); // a message set: never read
            }
            let err = decode_request(legacy_frame(ApiKey::Produce, version, &body)).unwrap_err();
            let DecodeError::Refused { answer, .. } = err else {
                panic!("{err:?}")
            };
            let mut want = BytesMut::new();
            want.put_i32(0);
            want.put_i32(31);
            want.put_i32(1);
            put_str16(&mut want, "t");
            want.put_i32(2);
            for p in [4, 5] {
                want.put_i32(p);
                want.put_i16(UNSUPPORTED_VERSION);
                want.put_i64(-1);
                if version >= 2 {
                    want.put_i64(-1);
                }
            }
            if version >= 1 {
                want.put_i32(0);
            }
            let len = (want.len() - 4) as i32;
            want[..4].copy_from_slice(&len.to_be_bytes());
            assert_eq!(&answer[..], &want[..], "v{version}");
        }
        // A body that does not parse is malformed, as at any version.
        let err = decode_request(legacy_frame(ApiKey::Produce, 2, &[0, 1])).unwrap_err();
        assert!(matches!(err, DecodeError::Malformed { .. }), "{err:?}");
    }

    #[test]
    fn known_versions_cover_the_table() {
        // The response types know every advertised version.
        fn known<M: Message>(v: i16) -> bool {
            (M::VERSIONS.min..=M::VERSIONS.max).contains(&v)
        }
        for v in 4..=18 {
            assert!(known::<FetchResponse>(v));
        }
        assert!(known::<ApiVersionsResponse>(0));
    }
}
