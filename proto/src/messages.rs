//! Request and response bodies of the native protocol.
//!
//! Each body is an rkyv archive (little endian, naturally aligned
//! primitives, 32-bit relative pointers), validated before it is
//! deserialized. Every request type implements [`Request`], which names its
//! [`ApiKey`] and its response type; every body type implements
//! [`Message`].
//!
//! `error` fields are [`ErrorCode`] numbers (`ErrorCode::from_u16` reads
//! them). Topic names are `String`s, partitions and cores `u32`s, offsets
//! `u64`s, timestamps `i64` milliseconds since the Unix epoch.
//!
//! Record batches are not part of a body: they travel in the frame's
//! payload, and a body names each partition's batches by a
//! `(payload_offset, payload_len)` range relative to the payload's start
//! (see [`crate::frame::payload_slice`]).
//!
//! [`ErrorCode`]: crate::error_code::ErrorCode

use rkyv::{Archive, Deserialize, Serialize};

use crate::api::ApiKey;
use crate::frame::{rkyv_decode, rkyv_encode, FrameError, Message, RequestHeader, ResponseHeader};

/// A request type: its API key and the type of its response body.
pub trait Request: Message {
    /// The API this request belongs to.
    const API_KEY: ApiKey;
    /// The response body a successful answer carries.
    type Response: Message;
}

/// A `(key, value)` configuration entry.
pub type ConfigEntry = (String, String);

// --- frame-level error -----------------------------------------------------

/// Body of a response whose frame-level `error_code` is not 0.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Human-readable detail.
    pub message: String,
}

// --- ApiVersions (0) --------------------------------------------------------

/// Asks which APIs and versions the server supports.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ApiVersionsRequest {}

/// The version range the server supports for one API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ApiVersionRange {
    /// The API's key.
    pub api_key: u16,
    /// Oldest supported version.
    pub min: u16,
    /// Newest supported version.
    pub max: u16,
}

/// Every API the server supports.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ApiVersionsResponse {
    /// One entry per supported API.
    pub apis: Vec<ApiVersionRange>,
}

impl ApiVersionsResponse {
    /// The response this build sends: [`crate::api::supported_apis`].
    pub fn supported() -> ApiVersionsResponse {
        ApiVersionsResponse {
            apis: crate::api::supported_apis(),
        }
    }
}

// --- Metadata (1) -------------------------------------------------------------

/// Asks for the cluster's cores and topics.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct MetadataRequest {
    /// Topics to describe; `None` for all of them.
    pub topics: Option<Vec<String>>,
}

/// One core (shard) and the address it listens on.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct CoreInfo {
    /// The core's id.
    pub core: u32,
    /// Host to connect to.
    pub host: String,
    /// Port to connect to.
    pub port: u16,
}

/// One partition of a topic and the core that owns it.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct PartitionMetadata {
    /// The partition's index.
    pub partition: u32,
    /// The core that owns it.
    pub core: u32,
    /// Error code for this partition (0 = none).
    pub error: u16,
}

/// One topic and its partitions.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct TopicMetadata {
    /// The topic's name.
    pub name: String,
    /// Error code for this topic (e.g. `UnknownTopicOrPartition`).
    pub error: u16,
    /// Its partitions.
    pub partitions: Vec<PartitionMetadata>,
}

/// The cluster's cores and the requested topics.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct MetadataResponse {
    /// Every core and its listener.
    pub cores: Vec<CoreInfo>,
    /// The requested topics (all, if the request named none).
    pub topics: Vec<TopicMetadata>,
}

// --- shared result ----------------------------------------------------------

/// Outcome of an admin operation on one topic.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct TopicResult {
    /// The topic's name.
    pub name: String,
    /// Error code (0 = success).
    pub error: u16,
    /// Optional detail for the error.
    pub message: Option<String>,
}

// --- CreateTopics (2) -----------------------------------------------------------

/// A topic to create.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct NewTopic {
    /// The topic's name.
    pub name: String,
    /// Number of partitions.
    pub partitions: u32,
    /// Config overrides.
    pub configs: Vec<ConfigEntry>,
    /// Replicas of each partition, on distinct nodes (0: 1).
    pub replication_factor: u32,
}

/// Creates topics.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct CreateTopicsRequest {
    /// The topics to create.
    pub topics: Vec<NewTopic>,
}

/// One result per requested topic.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct CreateTopicsResponse {
    /// Per-topic outcome.
    pub topics: Vec<TopicResult>,
}

// --- DeleteTopics (3) -----------------------------------------------------------

/// Deletes topics.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DeleteTopicsRequest {
    /// Names of the topics to delete.
    pub names: Vec<String>,
}

/// One result per requested topic.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DeleteTopicsResponse {
    /// Per-topic outcome.
    pub topics: Vec<TopicResult>,
}

// --- DescribeConfigs (4) --------------------------------------------------------

/// Reads topics' configs and partitions' state.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DescribeConfigsRequest {
    /// Names of the topics to describe.
    pub topics: Vec<String>,
}

/// State of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct PartitionDescription {
    /// The partition's index.
    pub partition: u32,
    /// The core that owns it (on its leader's node).
    pub core: u32,
    /// First offset still in the log (in the remote tier, for a tiered
    /// partition with remote segments).
    pub log_start_offset: u64,
    /// Offset the next appended record gets.
    pub log_end_offset: u64,
    /// Bytes on local disk.
    pub size_bytes: u64,
    /// First offset on local disk (`log_start_offset` unless tiered).
    pub local_log_start_offset: u64,
    /// Bytes in the remote tier (tiered storage; readable segments).
    pub remote_bytes: u64,
    /// Segments in the remote tier.
    pub remote_segments: u32,
    /// The leading node (0: no live leader).
    pub leader: u64,
    /// The leader epoch (bumped at every leader change).
    pub leader_epoch: u32,
    /// The nodes holding a replica, the preferred leader first.
    pub replicas: Vec<u64>,
    /// The in-sync replicas.
    pub isr: Vec<u64>,
    /// The nodes a reassignment under way moves it to, the preferred
    /// leader first (empty: none under way; `replicas` holds these and
    /// the old in-sync ones meanwhile).
    pub target: Vec<u64>,
    /// Whether the answering node leads it: the offsets and size are only
    /// known there (zero otherwise).
    pub here: bool,
}

/// One topic's effective configs and partitions.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct TopicConfigs {
    /// The topic's name.
    pub name: String,
    /// Error code (0 = none).
    pub error: u16,
    /// Effective configs.
    pub configs: Vec<ConfigEntry>,
    /// Its partitions.
    pub partitions: Vec<PartitionDescription>,
}

/// One entry per requested topic.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DescribeConfigsResponse {
    /// Per-topic configs.
    pub topics: Vec<TopicConfigs>,
}

// --- AlterConfigs (5) -----------------------------------------------------------

/// Changes topics' configs: `(topic, entries to set)`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AlterConfigsRequest {
    /// Per topic, the entries to set.
    pub topics: Vec<(String, Vec<ConfigEntry>)>,
}

/// One result per requested topic.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AlterConfigsResponse {
    /// Per-topic outcome.
    pub topics: Vec<TopicResult>,
}

// --- CreatePartitions (6) -------------------------------------------------------

/// Grows topics: `(topic, new total partition count)`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct CreatePartitionsRequest {
    /// Per topic, the new total number of partitions.
    pub topics: Vec<(String, u32)>,
}

/// One result per requested topic.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct CreatePartitionsResponse {
    /// Per-topic outcome.
    pub topics: Vec<TopicResult>,
}

// --- Produce (7) ------------------------------------------------------------------

/// One partition's batches in a produce request.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ProducePartition {
    /// The topic's name.
    pub topic: String,
    /// The partition's index.
    pub partition: u32,
    /// Start of its record batches, relative to the payload's start.
    pub payload_offset: u32,
    /// Bytes of its record batches.
    pub payload_len: u32,
}

/// Appends record batches; the batches are in the frame's payload.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ProduceRequest {
    /// Acknowledgement mode: 0 = none (no response is sent), 1 = after the
    /// owning core appended, -1 = after the write is durable/replicated.
    pub acks: i8,
    /// How long the server may wait for `acks`.
    pub timeout_ms: u32,
    /// One entry per partition written.
    pub partitions: Vec<ProducePartition>,
    /// v1: a transactional producer's transactional id (its transactional
    /// batches must be of a partition added to its open transaction).
    pub transactional_id: Option<String>,
}

/// Outcome of one partition's append.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ProducePartitionResult {
    /// The topic's name.
    pub topic: String,
    /// The partition's index.
    pub partition: u32,
    /// Error code (0 = appended).
    pub error: u16,
    /// Optional detail for the error.
    pub message: Option<String>,
    /// Offset given to the first record appended.
    pub base_offset: u64,
    /// The partition's first offset after the append.
    pub log_start_offset: u64,
}

/// One result per produced partition.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ProduceResponse {
    /// Per-partition outcome.
    pub partitions: Vec<ProducePartitionResult>,
}

// --- Fetch (8) --------------------------------------------------------------------

/// One partition to read.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct FetchPartition {
    /// The topic's name.
    pub topic: String,
    /// The partition's index.
    pub partition: u32,
    /// First offset wanted, or [`FetchPartition::CONTINUE`].
    pub offset: u64,
    /// Most bytes of batches to return for this partition.
    pub max_bytes: u32,
}

impl FetchPartition {
    /// v2: an `offset` that means "where this connection's previous fetch
    /// of the partition ended" (after its last batch; where it was read
    /// from if it found none). A connection's requests are served in
    /// order, so a client can keep a second fetch of a partition in flight
    /// before the first is answered. A partition the connection has not
    /// fetched (or whose last fetch failed) is answered `InvalidRequest`;
    /// [`FetchPartitionResult::fetch_offset`] says where it was read from.
    pub const CONTINUE: u64 = u64::MAX;
}

/// Reads record batches.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct FetchRequest {
    /// How long the server may wait for `min_bytes` to be available.
    pub max_wait_ms: u32,
    /// Bytes to wait for before answering.
    pub min_bytes: u32,
    /// Most bytes of batches in the whole response.
    pub max_bytes: u32,
    /// The partitions to read.
    pub partitions: Vec<FetchPartition>,
    /// v1: read committed only (Kafka's `isolation.level=read_committed`):
    /// batches below each partition's last stable offset, with the aborted
    /// transactions among them named (the reader skips their batches).
    pub read_committed: bool,
}

/// A transaction aborted within a fetched range: the reader skips its
/// producer's transactional batches from `first_offset` up to the
/// producer's abort marker.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct AbortedTransaction {
    /// Its producer.
    pub producer_id: i64,
    /// Offset of its first batch.
    pub first_offset: u64,
}

/// One partition's batches in a fetch response.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct FetchPartitionResult {
    /// The topic's name.
    pub topic: String,
    /// The partition's index.
    pub partition: u32,
    /// Error code (0 = none).
    pub error: u16,
    /// Optional detail for the error.
    pub message: Option<String>,
    /// Offset the next appended record gets.
    pub high_watermark: u64,
    /// First offset still in the log.
    pub log_start_offset: u64,
    /// Start of its record batches, relative to the payload's start.
    pub payload_offset: u32,
    /// Bytes of its record batches (0 if none).
    pub payload_len: u32,
    /// v1: the last stable offset (the end a read_committed reader sees).
    pub last_stable_offset: u64,
    /// v1, read_committed: the aborted transactions in the fetched range,
    /// by first offset (empty otherwise).
    pub aborted: Vec<AbortedTransaction>,
    /// v2: the offset the partition was read from — the request's, or for
    /// [`FetchPartition::CONTINUE`] where the connection's previous fetch
    /// of it ended.
    pub fetch_offset: u64,
}

/// One result per fetched partition; the batches are in the frame's
/// payload.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct FetchResponse {
    /// Per-partition outcome.
    pub partitions: Vec<FetchPartitionResult>,
}

// --- ListOffsets (9) -------------------------------------------------------------

/// Which offset to look up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub enum OffsetSpec {
    /// The log start offset.
    Earliest,
    /// The log end offset (the next offset to be written).
    Latest,
    /// The first offset whose timestamp is at or after this one (ms).
    Timestamp(i64),
}

/// One partition to look up.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ListOffsetsPartition {
    /// The topic's name.
    pub topic: String,
    /// The partition's index.
    pub partition: u32,
    /// What to look up.
    pub spec: OffsetSpec,
}

/// Looks up offsets.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ListOffsetsRequest {
    /// The partitions to look up.
    pub partitions: Vec<ListOffsetsPartition>,
    /// v1: [`OffsetSpec::Latest`] is the last stable offset (what a
    /// read_committed reader's end is), not the high watermark.
    pub read_committed: bool,
}

/// Result of one lookup.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ListOffsetsResult {
    /// The topic's name.
    pub topic: String,
    /// The partition's index.
    pub partition: u32,
    /// Error code (0 = none).
    pub error: u16,
    /// The offset found; `None` if no record matches (a timestamp after
    /// every record).
    pub offset: Option<u64>,
    /// The timestamp of the record at `offset`, for a timestamp lookup.
    pub timestamp: Option<i64>,
}

/// One result per requested partition.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ListOffsetsResponse {
    /// Per-partition results.
    pub partitions: Vec<ListOffsetsResult>,
}

// --- InitProducerId (10) ----------------------------------------------------------

/// Asks for a new idempotent-producer identity. Every call hands out a
/// fresh producer id (unique for the life of the data directory) with
/// epoch 0. v1: with a transactional id, sent to its coordinator, the
/// id's producer (a new epoch: an older instance is fenced, its open
/// transaction aborted).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct InitProducerIdRequest {
    /// v1: the transactional id (`None`: an idempotent producer).
    pub transactional_id: Option<String>,
    /// v1: `transaction.timeout.ms` (at most the broker's
    /// `transaction.max.timeout.ms`).
    pub transaction_timeout_ms: u32,
    /// v1: the producer id the client had (-1: none), to bump its epoch
    /// (KIP-360).
    pub producer_id: i64,
    /// v1: its epoch (-1: none).
    pub producer_epoch: i16,
}

impl Default for InitProducerIdRequest {
    fn default() -> Self {
        InitProducerIdRequest {
            transactional_id: None,
            transaction_timeout_ms: 60_000,
            producer_id: -1,
            producer_epoch: -1,
        }
    }
}

/// The identity an idempotent producer stamps on its batches.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct InitProducerIdResponse {
    /// Error code (0 = none).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// The producer id (non-negative).
    pub producer_id: i64,
    /// The producer epoch.
    pub producer_epoch: i16,
}

// --- Compact (11) ------------------------------------------------------------------

/// Runs a cleaner pass now on every partition of a compacted topic
/// (`run`), or only reports each partition's dirty ratio.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct CompactRequest {
    /// The topic.
    pub topic: String,
    /// Run a pass (whatever the dirty ratio); false: report only.
    pub run: bool,
}

/// What a cleaner pass did on one partition.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct CompactPass {
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Records looked at.
    pub records_read: u64,
    /// Records removed (superseded, expired tombstones, without a key).
    pub records_removed: u64,
    /// Of those, expired tombstones.
    pub tombstones_removed: u64,
    /// Segments rewritten.
    pub segments_before: u32,
    /// Segments they became.
    pub segments_after: u32,
    /// Log bytes before.
    pub size_before: u64,
    /// Log bytes after.
    pub size_after: u64,
    /// Dirty ratio before, parts per million.
    pub dirty_ratio_before_ppm: u32,
    /// Dirty ratio after, parts per million.
    pub dirty_ratio_after_ppm: u32,
    /// The clean part ends here now.
    pub first_dirty: u64,
    /// The cleaner's key map filled: the next pass goes on from `first_dirty`.
    pub map_full: bool,
    /// Duration, µs.
    pub duration_us: u64,
}

/// One partition's compaction state (and pass, if one ran).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct CompactPartitionResult {
    /// The partition.
    pub partition: u32,
    /// Error code (0 = none).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// Dirty ratio now (after the pass, if one ran), parts per million.
    pub dirty_ratio_ppm: u32,
    /// The pass, if one ran (none when nothing was cleanable).
    pub pass: Option<CompactPass>,
}

/// The topic's outcome and one entry per partition.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct CompactResponse {
    /// Error code (0 = none): unknown topic, or a topic whose
    /// `cleanup.policy` does not compact (`InvalidConfig`).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// Per partition, in order.
    pub partitions: Vec<CompactPartitionResult>,
}

// --- Consumer groups (12–19) ---------------------------------------------------------

/// Partitions of one topic.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct TopicPartitions {
    /// The topic's name.
    pub topic: String,
    /// Partition indexes, ascending.
    pub partitions: Vec<u32>,
}

impl TopicPartitions {
    /// `(topic, partition)` pairs grouped by topic (topics and partitions
    /// ascending, duplicates dropped): how the group APIs list partitions.
    pub fn group<'a>(pairs: impl IntoIterator<Item = &'a (String, u32)>) -> Vec<TopicPartitions> {
        let mut sorted: Vec<&(String, u32)> = pairs.into_iter().collect();
        sorted.sort();
        sorted.dedup();
        let mut out: Vec<TopicPartitions> = Vec::new();
        for (t, p) in sorted {
            match out.last_mut() {
                Some(last) if last.topic == *t => last.partitions.push(*p),
                _ => out.push(TopicPartitions {
                    topic: t.clone(),
                    partitions: vec![*p],
                }),
            }
        }
        out
    }

    /// The `(topic, partition)` pairs of a list, in order.
    pub fn pairs(list: &[TopicPartitions]) -> impl Iterator<Item = (String, u32)> + '_ {
        list.iter()
            .flat_map(|t| t.partitions.iter().map(move |p| (t.topic.clone(), *p)))
    }
}

/// Joins a group (an empty `member_id`) or updates a member's
/// subscription (its `member_id`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct JoinGroupRequest {
    /// The group id.
    pub group: String,
    /// Empty to join as a new member; the member's id to update it.
    pub member_id: String,
    /// Free text naming the client (shown by describe).
    pub client_id: String,
    /// Topics the member subscribes to.
    pub topics: Vec<String>,
    /// `range`, `roundrobin` or `cooperative-sticky`; every member of a
    /// group must ask for the same one.
    pub assignor: String,
    /// The member is expelled if no heartbeat arrives for this long.
    pub session_timeout_ms: u32,
    /// The member is expelled if it reports more time than this since its
    /// application last polled.
    pub max_poll_interval_ms: u32,
}

/// A member's liveness report: what it owns now and how long ago its
/// application polled.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    /// The group id.
    pub group: String,
    /// The member's id (from its join).
    pub member_id: String,
    /// The generation the member last received.
    pub generation: i32,
    /// The partitions the member owns (has not revoked).
    pub owned: Vec<TopicPartitions>,
    /// Milliseconds since the member's application last polled.
    pub since_poll_ms: u32,
    /// If the answer would not change what the member owns, the
    /// coordinator may hold the heartbeat up to this long (capped at half
    /// the session timeout) and answer as soon as the assignment changes.
    pub wait_ms: u32,
}

/// The answer to a join or heartbeat: the partitions the member may own
/// now.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct GroupAssignment {
    /// Error code (0 = none).
    pub error: u16,
    /// Optional detail for the error.
    pub message: Option<String>,
    /// The member's id.
    pub member_id: String,
    /// The group's generation (grows with every change of the target
    /// assignment).
    pub generation: i32,
    /// The group's assignor.
    pub assignor: String,
    /// The partitions the member may own: its target assignment minus the
    /// partitions another member still owns.
    pub assignment: Vec<TopicPartitions>,
    /// How often the member should heartbeat at most.
    pub heartbeat_interval_ms: u32,
}

/// Leaves a group.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct LeaveGroupRequest {
    /// The group id.
    pub group: String,
    /// The member's id.
    pub member_id: String,
}

/// Outcome of a group operation without other results.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct GroupResult {
    /// Error code (0 = none).
    pub error: u16,
    /// Optional detail for the error.
    pub message: Option<String>,
}

/// One offset to commit.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct CommitOffset {
    /// The topic's name.
    pub topic: String,
    /// The partition's index.
    pub partition: u32,
    /// The next offset to consume (at most the log end offset).
    pub offset: u64,
    /// Free text stored with the offset.
    pub metadata: Option<String>,
}

/// Commits offsets of a group. A member commits with its id and
/// generation; an admin tool commits to a group without members with an
/// empty `member_id` and generation -1.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct OffsetCommitRequest {
    /// The group id.
    pub group: String,
    /// The member's id, or empty (admin commit to an empty group).
    pub member_id: String,
    /// The member's generation, or -1 (admin commit).
    pub generation: i32,
    /// The offsets.
    pub offsets: Vec<CommitOffset>,
}

/// Outcome of one partition's commit.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct CommitResult {
    /// The topic's name.
    pub topic: String,
    /// The partition's index.
    pub partition: u32,
    /// Error code (0 = committed).
    pub error: u16,
    /// Optional detail for the error.
    pub message: Option<String>,
}

/// The outcome of a commit: a group-level error, or one result per offset.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct OffsetCommitResponse {
    /// Group-level error (0 = none; then see `partitions`).
    pub error: u16,
    /// Optional detail for the error.
    pub message: Option<String>,
    /// Per-partition outcome, in request order.
    pub partitions: Vec<CommitResult>,
}

/// Reads committed offsets.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct OffsetFetchRequest {
    /// The group id.
    pub group: String,
    /// The partitions to read; `None` for every partition with a commit.
    pub partitions: Option<Vec<TopicPartitions>>,
}

/// One committed offset.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct CommittedOffset {
    /// The topic's name.
    pub topic: String,
    /// The partition's index.
    pub partition: u32,
    /// The committed offset (the next record to consume).
    pub offset: u64,
    /// The metadata committed with it.
    pub metadata: Option<String>,
    /// When it was committed (ms since the epoch, broker clock).
    pub commit_timestamp: i64,
}

/// Committed offsets of a group (partitions without a commit are left
/// out).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct OffsetFetchResponse {
    /// Error code (0 = none).
    pub error: u16,
    /// Optional detail for the error.
    pub message: Option<String>,
    /// The committed offsets, sorted by topic and partition.
    pub offsets: Vec<CommittedOffset>,
}

// --- cluster ------------------------------------------------------------------

/// Describes the cluster as the answering node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DescribeClusterRequest {}

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct NodeDescription {
    /// Node id.
    pub id: u64,
    /// Rack (empty: none).
    pub rack: String,
    /// Number of cores.
    pub cores: u32,
    /// Native protocol address.
    pub native: String,
    /// Per-core native ports.
    pub core_ports: Vec<u16>,
    /// Kafka protocol address (empty: off).
    pub kafka: String,
    /// Node-to-node (QUIC) address.
    pub replication: String,
    /// Metrics address.
    pub metrics: String,
    /// Broker epoch (bumped at every registration and fencing).
    pub broker_epoch: u64,
    /// Fenced: its heartbeats lapsed; it leads nothing until it registers again.
    pub fenced: bool,
    /// A voter of the controller quorum.
    pub voter: bool,
}

/// The cluster as the answering node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DescribeClusterResponse {
    /// The cluster id.
    pub cluster_id: String,
    /// The answering node.
    pub node_id: u64,
    /// The controller leader as the answering node knows it (0: none).
    pub controller_leader: u64,
    /// The metadata version (Raft log index) applied on the answering node.
    pub metadata_version: u64,
    /// A checksum of the metadata the answering node has applied: nodes
    /// at the same version must show the same one.
    pub metadata_digest: u32,
    /// Every registered node, by id.
    pub nodes: Vec<NodeDescription>,
}

/// Adds a node to the controller voters (it first catches up as a
/// learner), or removes one. Served by the controller leader; another node
/// answers `NotLeader` with the leader's id.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ChangeVotersRequest {
    /// The node.
    pub node_id: u64,
    /// Add (true) or remove (false).
    pub add: bool,
    /// For an addition: the node's replication address (`host:port`).
    pub replication: String,
}

/// Where `group`'s coordinator is: the node and core holding the group's
/// partition of `__consumer_offsets`. Every node answers. Group requests
/// sent to another node are refused with `NotCoordinator`; on the
/// coordinator's node any core serves them (it forwards to the
/// coordinator's core), the coordinator's own port saves that hop.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct FindCoordinatorRequest {
    /// The group id (or, with `transaction`, the transactional id).
    pub group: String,
    /// v1: `group` is a transactional id: where its transaction
    /// coordinator is (its partition of `__transaction_state`).
    pub transaction: bool,
}

/// The answer to a [`FindCoordinatorRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct FindCoordinatorResponse {
    /// Error code (0 = none; `InvalidGroupId`; `NotCoordinator`: the
    /// group's partition has no live leader right now, retry).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// The coordinator's node.
    pub node_id: u64,
    /// Its cluster-wide core index (as in `Metadata`).
    pub core: u32,
    /// The host of that core's listener.
    pub host: String,
    /// That core's own port.
    pub port: u16,
}

/// The outcome of a [`ChangeVotersRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ChangeVotersResponse {
    /// Error code (0 = none; `NotLeader`: ask `leader`).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// The controller leader as the answering node knows it (0: none).
    pub leader: u64,
    /// The voters after the change.
    pub voters: Vec<u64>,
}

/// Lists users (`None`: every user) and their SCRAM mechanisms (Kafka's
/// DescribeUserScramCredentials).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DescribeUsersRequest {
    /// Users to describe; `None` for all.
    pub users: Option<Vec<String>>,
}

/// One SCRAM credential as described: never its keys.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct CredentialInfo {
    /// Kafka's mechanism number (1: SCRAM-SHA-256, 2: SCRAM-SHA-512).
    pub mechanism: i8,
    /// PBKDF2 iterations.
    pub iterations: i32,
}

/// One user's result.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct UserResult {
    /// User.
    pub user: String,
    /// Error code (0 = none; `ResourceNotFound`, `DuplicateResource`,
    /// `UnacceptableCredential`, `UnsupportedSaslMechanism`).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// Its credentials (DescribeUsers).
    pub credentials: Vec<CredentialInfo>,
}

/// The answer to a [`DescribeUsersRequest`] or an [`AlterUsersRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct UsersResponse {
    /// One per user.
    pub results: Vec<UserResult>,
}

/// A SCRAM credential to set; the client salted the password (Kafka's
/// AlterUserScramCredentials upsertion).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ScramUpsertion {
    /// User.
    pub user: String,
    /// Kafka's mechanism number.
    pub mechanism: i8,
    /// PBKDF2 iterations (4096 to 16384).
    pub iterations: i32,
    /// Salt.
    pub salt: Vec<u8>,
    /// `Hi(password, salt, iterations)`.
    pub salted_password: Vec<u8>,
}

/// A SCRAM credential to remove.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ScramDeletion {
    /// User.
    pub user: String,
    /// Kafka's mechanism number.
    pub mechanism: i8,
}

/// Sets and removes users' SCRAM credentials (Kafka's
/// AlterUserScramCredentials): answered once the cluster metadata holds
/// the change.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AlterUsersRequest {
    /// Credentials to remove.
    pub deletions: Vec<ScramDeletion>,
    /// Credentials to set.
    pub upsertions: Vec<ScramUpsertion>,
}

/// One ACL (Kafka's `AclBinding`, Kafka's codes): resource type (2 topic,
/// 3 group, 4 cluster, 5 transactional id), pattern type (3 literal, 4
/// prefixed), principal (`User:name`), host (`*` for any), operation (2
/// All, 3 Read, 4 Write, 5 Create, 6 Delete, 7 Alter, 8 Describe, 9
/// ClusterAction, 10 DescribeConfigs, 11 AlterConfigs, 12
/// IdempotentWrite), permission (2 deny, 3 allow).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AclEntry {
    /// Resource type.
    pub resource_type: i8,
    /// Resource name.
    pub resource_name: String,
    /// Pattern type.
    pub pattern_type: i8,
    /// Principal.
    pub principal: String,
    /// Host.
    pub host: String,
    /// Operation.
    pub operation: i8,
    /// Permission.
    pub permission: i8,
}

/// Which ACLs (Kafka's `AclBindingFilter`): `None` and the codes 1 (any)
/// match everything; pattern type 2 (match) takes every binding that
/// applies to the name.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AclFilterEntry {
    /// Resource type, or 1.
    pub resource_type: i8,
    /// Resource name, or any.
    pub resource_name: Option<String>,
    /// Pattern type, 1 or 2.
    pub pattern_type: i8,
    /// Principal, or any.
    pub principal: Option<String>,
    /// Host, or any.
    pub host: Option<String>,
    /// Operation, or 1.
    pub operation: i8,
    /// Permission, or 1.
    pub permission: i8,
}

/// Lists the ACLs `filter` matches.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DescribeAclsRequest {
    /// The filter.
    pub filter: AclFilterEntry,
}

/// Adds ACLs (answered once the cluster metadata holds them).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct CreateAclsRequest {
    /// The bindings.
    pub acls: Vec<AclEntry>,
}

/// Removes what each filter matches.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DeleteAclsRequest {
    /// The filters.
    pub filters: Vec<AclFilterEntry>,
}

/// One result: per binding created, per filter deleted (the bindings it
/// removed), or the one of a describe (the bindings matched).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AclResult {
    /// Error code (0 = none; `SecurityDisabled`, `InvalidRequest`).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// The bindings.
    pub acls: Vec<AclEntry>,
}

/// The answer to an ACL request.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AclsResponse {
    /// Results, in the request's order.
    pub results: Vec<AclResult>,
}

/// Chooses the SASL mechanism of a login, on a SASL_* listener (Kafka's
/// SaslHandshake v1: the tokens follow in [`SaslAuthenticateRequest`]s).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct SaslHandshakeRequest {
    /// `SCRAM-SHA-512`, `SCRAM-SHA-256` or `PLAIN`.
    pub mechanism: String,
}

/// The answer to a [`SaslHandshakeRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct SaslHandshakeResponse {
    /// 0, or `UnsupportedSaslMechanism`.
    pub error: u16,
    /// The mechanisms the listener offers.
    pub mechanisms: Vec<String>,
}

/// One step of a SASL login: the mechanism's next client message.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct SaslAuthenticateRequest {
    /// The client's token.
    pub auth_bytes: Vec<u8>,
}

/// The answer to a [`SaslAuthenticateRequest`]: the server's next token;
/// a failure closes the connection after it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct SaslAuthenticateResponse {
    /// 0, or `SaslAuthenticationFailed`.
    pub error: u16,
    /// Why it failed.
    pub message: Option<String>,
    /// The server's token.
    pub auth_bytes: Vec<u8>,
    /// Once logged in: how long the login holds (0: for the connection's
    /// life; KIP-368).
    pub session_lifetime_ms: i64,
}

/// One part of a client-quota entity: its type (`user` or `client-id`)
/// and name (`None`: the type's default).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct QuotaEntityEntry {
    /// `user` or `client-id`.
    pub entity_type: String,
    /// The name, or `None` for the default.
    pub name: Option<String>,
}

/// One quota value: Kafka's key (`producer_byte_rate`,
/// `consumer_byte_rate`, `request_percentage`) and its value (bytes per
/// second, or percent of a core), carried as the `f64`'s bits.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct QuotaValue {
    /// The key.
    pub key: String,
    /// The value's bits ([`QuotaValue::value`]).
    pub value_bits: u64,
}

impl QuotaValue {
    /// A value for `key`.
    pub fn new(key: impl Into<String>, value: f64) -> QuotaValue {
        QuotaValue {
            key: key.into(),
            value_bits: value.to_bits(),
        }
    }

    /// The value.
    pub fn value(&self) -> f64 {
        f64::from_bits(self.value_bits)
    }
}

/// One component of a quota filter (Kafka's): match type 0 exact (`name`
/// set), 1 the type's default, 2 any entity with the type.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct QuotaComponentEntry {
    /// `user` or `client-id`.
    pub entity_type: String,
    /// 0, 1 or 2.
    pub match_type: i8,
    /// The name, for match type 0.
    pub name: Option<String>,
}

/// Lists the client quotas whose entities every component matches
/// (`strict`: and that have no other part).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DescribeClientQuotasRequest {
    /// The components.
    pub components: Vec<QuotaComponentEntry>,
    /// Whether entities may have parts no component names.
    pub strict: bool,
}

/// One entity's quotas.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct QuotaEntryInfo {
    /// The entity, parts sorted by type.
    pub entity: Vec<QuotaEntityEntry>,
    /// Its values.
    pub values: Vec<QuotaValue>,
}

/// The answer to a [`DescribeClientQuotasRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DescribeClientQuotasResponse {
    /// 0, or `InvalidRequest` (a bad filter).
    pub error: u16,
    /// Why it failed.
    pub message: Option<String>,
    /// The entities matched.
    pub entries: Vec<QuotaEntryInfo>,
}

/// A change to one entity's quotas.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct QuotaChange {
    /// The entity.
    pub entity: Vec<QuotaEntityEntry>,
    /// Values to set.
    pub set: Vec<QuotaValue>,
    /// Keys to remove.
    pub remove: Vec<String>,
}

/// Sets and removes client quotas (Kafka's AlterClientQuotas): answered
/// once the cluster metadata holds the change.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AlterClientQuotasRequest {
    /// The changes.
    pub changes: Vec<QuotaChange>,
    /// Check the changes, make none.
    pub validate_only: bool,
}

/// One change's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct QuotaResult {
    /// 0, or `InvalidRequest`.
    pub error: u16,
    /// Why it failed.
    pub message: Option<String>,
}

/// The answer to an [`AlterClientQuotasRequest`]: one result per change.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AlterClientQuotasResponse {
    /// Results, in the request's order.
    pub results: Vec<QuotaResult>,
}

/// Lists the groups.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ListGroupsRequest {}

/// One group in a listing.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct GroupListing {
    /// The group id.
    pub group: String,
    /// `Empty`, `Stable` or `Reconciling`.
    pub state: String,
    /// Active members.
    pub members: u32,
    /// The group's assignor (empty for a group that never had members).
    pub assignor: String,
}

/// Every group, sorted by id.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ListGroupsResponse {
    /// The groups.
    pub groups: Vec<GroupListing>,
}

/// Describes one group.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DescribeGroupRequest {
    /// The group id.
    pub group: String,
}

/// One member of a group.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct MemberDescription {
    /// The member's id.
    pub member_id: String,
    /// The client id it joined with.
    pub client_id: String,
    /// Its static membership id, if any.
    pub instance_id: Option<String>,
    /// Its member epoch (classic groups: the group's generation).
    pub member_epoch: i32,
    /// Its subscription.
    pub topics: Vec<String>,
    /// Its target assignment.
    pub assignment: Vec<TopicPartitions>,
    /// The partitions it holds now (assigned to it).
    pub owned: Vec<TopicPartitions>,
    /// The partitions it must release (pending revocation): nobody else
    /// gets them until it does, or its rebalance timeout fences it.
    pub revoking: Vec<TopicPartitions>,
}

/// A group's state, members and committed offsets.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DescribeGroupResponse {
    /// Error code (0 = none).
    pub error: u16,
    /// Optional detail for the error.
    pub message: Option<String>,
    /// The group id.
    pub group: String,
    /// `consumer` (KIP-848 epochs: native and `ConsumerGroupHeartbeat`
    /// members) or `classic` (Kafka's JoinGroup/SyncGroup).
    pub kind: String,
    /// Consumer groups: `Empty`, `Stable` or `Reconciling`; classic
    /// groups: `Empty`, `PreparingRebalance`, `CompletingRebalance` or
    /// `Stable`.
    pub state: String,
    /// The group epoch (classic groups: the generation).
    pub generation: i32,
    /// The epoch of the target assignment (classic groups: the
    /// generation).
    pub assignment_epoch: i32,
    /// The group's assignor (classic groups: the chosen protocol).
    pub assignor: String,
    /// The core that coordinates the group.
    pub coordinator_core: u32,
    /// Active members, sorted by id.
    pub members: Vec<MemberDescription>,
    /// Committed offsets, sorted by topic and partition.
    pub offsets: Vec<CommittedOffset>,
}

/// Deletes a group without active members, with its committed offsets.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DeleteGroupRequest {
    /// The group id.
    pub group: String,
}

// --- ReassignPartitions (23) ----------------------------------------------------------

/// One partition to move.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct PartitionReassignment {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// The nodes to hold its replicas, the preferred leader first.
    pub replicas: Vec<u64>,
}

/// Moves partitions' replicas to other nodes (Kafka's
/// AlterPartitionReassignments): the new replicas copy the log, join the
/// ISR, and then the old ones leave.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ReassignPartitionsRequest {
    /// The partitions, each at most once.
    pub partitions: Vec<PartitionReassignment>,
}

/// The outcome for one partition: the move started (or was refused).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ReassignmentResult {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Error code (0 = started; `InvalidReplicaAssignment`,
    /// `UnknownTopicOrPartition`).
    pub error: u16,
    /// Why it was refused.
    pub message: Option<String>,
}

/// One result per partition asked for, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ReassignPartitionsResponse {
    /// Per-partition outcome.
    pub partitions: Vec<ReassignmentResult>,
}

// --- ListTransactions (33) -------------------------------------------------------

/// The transactions a node coordinates. Each node answers for the
/// transactional ids it coordinates: ask every node for the cluster's.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ListTransactionsRequest {
    /// Only these transactional ids (empty: all).
    pub ids: Vec<String>,
    /// Only transactions in these states (`Ongoing`, `PrepareCommit`, …;
    /// empty: all).
    pub states: Vec<String>,
}

/// One partition of a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct TxnPartition {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
}

/// A transactional id as its coordinator knows it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct TransactionInfo {
    /// The transactional id.
    pub transactional_id: String,
    /// Its producer id.
    pub producer_id: i64,
    /// Its producer epoch.
    pub producer_epoch: i16,
    /// `Empty`, `Ongoing`, `PrepareCommit`, `PrepareAbort`,
    /// `CompleteCommit`, `CompleteAbort` or `Dead`.
    pub state: String,
    /// `transaction.timeout.ms`.
    pub timeout_ms: u32,
    /// When its transaction began (ms since the epoch; -1: none open).
    pub start_ms: i64,
    /// The partitions of its transaction.
    pub partitions: Vec<TxnPartition>,
}

/// The answer to a [`ListTransactionsRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ListTransactionsResponse {
    /// Error code (0 = none; `Recovering`: a partition of
    /// `__transaction_state` is still loading, the list may be short).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// The answering node.
    pub node_id: u64,
    /// Its transactions, by transactional id.
    pub transactions: Vec<TransactionInfo>,
}

// --- AbortTransaction (34) -------------------------------------------------------

/// Aborts a transactional id's open transaction now (its producer fenced),
/// at its coordinator (`NotCoordinator` elsewhere).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AbortTransactionRequest {
    /// The transactional id.
    pub transactional_id: String,
}

/// The answer to an [`AbortTransactionRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AbortTransactionResponse {
    /// Error code (0 = none; `NotCoordinator`, `TransactionalIdNotFound`,
    /// `InvalidTxnState`: nothing open, `ConcurrentTransactions`: already
    /// ending).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// The producer id after the abort.
    pub producer_id: i64,
    /// The (bumped) producer epoch after the abort.
    pub producer_epoch: i16,
}

// --- DescribeProducers (35) ------------------------------------------------------

/// The producers a partition's leader remembers.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DescribeProducersRequest {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
}

/// One producer of a partition.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ProducerInfo {
    /// Its id.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i16,
    /// Sequence of its last record (-1: none).
    pub last_sequence: i32,
    /// Largest timestamp of its last batch (ms).
    pub last_timestamp: i64,
    /// First offset of its open transaction (-1: none open).
    pub txn_start_offset: i64,
}

/// The answer to a [`DescribeProducersRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct DescribeProducersResponse {
    /// Error code (0 = none; `NotLeader`, `NotOwner`,
    /// `UnknownTopicOrPartition`).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// The producers, by id.
    pub producers: Vec<ProducerInfo>,
}

// --- AddPartitionsToTxn (36) … TxnOffsetCommit (39) --------------------------------

/// Adds partitions to a transactional producer's open transaction (opening
/// it), at the id's coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AddPartitionsToTxnRequest {
    /// The transactional id.
    pub transactional_id: String,
    /// Its producer id.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i16,
    /// The partitions.
    pub partitions: Vec<TxnPartition>,
}

/// Adds a group's offsets to the open transaction (its partition of
/// `__consumer_offsets`), at the id's coordinator; then
/// [`TxnOffsetCommitRequest`] at the group's.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AddOffsetsToTxnRequest {
    /// The transactional id.
    pub transactional_id: String,
    /// Its producer id.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i16,
    /// The consumer group.
    pub group: String,
}

/// The answer to [`AddPartitionsToTxnRequest`] and
/// [`AddOffsetsToTxnRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct TxnResult {
    /// Error code (0 = none; `InvalidProducerEpoch`: fenced,
    /// `NotCoordinator`, `ConcurrentTransactions`: retry).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
}

/// Commits or aborts the open transaction, at the id's coordinator;
/// answered once the markers are written (at most 10 s, then once the
/// decision is durable).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct EndTxnRequest {
    /// The transactional id.
    pub transactional_id: String,
    /// Its producer id.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i16,
    /// Commit (else abort).
    pub commit: bool,
}

/// The answer to an [`EndTxnRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct EndTxnResponse {
    /// Error code (0 = none).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// The producer id to go on with.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i16,
}

/// Offsets committed in the transaction, at the group's coordinator:
/// visible when it commits, dropped when it aborts.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct TxnOffsetCommitRequest {
    /// The transactional id.
    pub transactional_id: String,
    /// Its producer id.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i16,
    /// The offsets (a member id and generation if the producer is a
    /// member, else empty and -1).
    pub commit: OffsetCommitRequest,
}

// --- Share groups (40–42) ------------------------------------------------------------

/// A share group member's heartbeat, at the group's coordinator: epoch 0
/// joins (with a member id the client made, a UUID), -1 leaves; the
/// answer names the partitions the member reads (shared with other
/// members: a share group spreads each partition's records, not the
/// partitions).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ShareGroupHeartbeatRequest {
    /// The share group.
    pub group: String,
    /// The member id (made by the client, stable for its life).
    pub member_id: String,
    /// 0 to join, the last epoch answered, -1 to leave.
    pub member_epoch: i32,
    /// The topics it subscribes to (`None`: unchanged).
    pub topics: Option<Vec<String>>,
}

/// The answer to a [`ShareGroupHeartbeatRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ShareGroupHeartbeatResponse {
    /// Error code (0 = none; `NotCoordinator`: find it again;
    /// `UnknownMemberId`, `FencedMemberEpoch`: join again with epoch 0).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// The member's epoch now.
    pub member_epoch: i32,
    /// Heartbeat at least this often.
    pub heartbeat_interval_ms: u32,
    /// The partitions it reads, if they changed (`None`: as before).
    pub assignment: Option<Vec<TopicPartitions>>,
}

/// Acknowledgements of a range of acquired records: one type for all of
/// them, or one per offset. Types: 0 gap (no record at that offset),
/// 1 accept, 2 release (deliver again), 3 reject (never again), 4 renew
/// (keep holding: the lock starts again, KIP-1222).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ShareAckBatch {
    /// First offset.
    pub first: u64,
    /// Last offset (inclusive).
    pub last: u64,
    /// One type, or `last - first + 1` of them.
    pub types: Vec<u8>,
}

/// One partition of a share fetch or acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct SharePartitionRequest {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// Acknowledgements of records acquired before (applied first,
    /// all or nothing).
    pub acks: Vec<ShareAckBatch>,
}

/// Acquires records of a share group's partitions, at the core that owns
/// them, in the member's share session with that core (epoch 0 opens it
/// with the partitions named, then 1, 2, …; a fetch adds the partitions
/// it names; -1 closes it, releasing what the member holds there).
/// Batches are answered as stored, in the frame's payload; the records
/// acquired are named by range (others in those batches are not the
/// member's).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ShareFetchRequest {
    /// The share group.
    pub group: String,
    /// The member id.
    pub member_id: String,
    /// The share session's epoch.
    pub session_epoch: i32,
    /// How long to wait when nothing can be acquired.
    pub max_wait_ms: u32,
    /// Records to acquire (0: 500): about, in whole batches, or at most
    /// (`acquire_mode`).
    pub max_records: u32,
    /// How `max_records` bounds the records acquired (v1, Kafka's
    /// `ShareAcquireMode`, KIP-1206): 0 batch_optimized (whole batches,
    /// the last may pass it), 1 record_limit (never more, a batch then
    /// acquired in part). Others are refused.
    pub acquire_mode: u8,
    /// Bytes to read per partition, at most.
    pub max_bytes: u32,
    /// (v2) Answer without waiting for this request's acknowledgements
    /// to be stored: the records acquired come back at once, a store
    /// that fails is named in a later answer of the session (that
    /// partition's `ack_error`), and a ShareAcknowledge — or the
    /// session's close — is answered only once all of them are stored.
    /// Until then a failover may deliver those records again.
    pub acks_later: bool,
    /// Partitions named (added to the session), with acknowledgements.
    pub partitions: Vec<SharePartitionRequest>,
    /// Partitions leaving the session.
    pub forgotten: Vec<TopicPartitions>,
}

/// Acknowledges acquired records without acquiring more, in the share
/// session (its epoch moves on as with a fetch).
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ShareAcknowledgeRequest {
    /// The share group.
    pub group: String,
    /// The member id.
    pub member_id: String,
    /// The share session's epoch (-1 closes it once applied).
    pub session_epoch: i32,
    /// The acknowledgements, by partition.
    pub partitions: Vec<SharePartitionRequest>,
}

/// Records acquired: offsets `first..=last`, delivered for the
/// `delivery_count`th time.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct AcquiredRange {
    /// First offset.
    pub first: u64,
    /// Last offset (inclusive).
    pub last: u64,
    /// How many times these records were delivered, this one included.
    pub delivery_count: u16,
}

/// One partition of a share fetch's or acknowledgement's answer.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct SharePartitionResult {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// Error code of the read (0 = none; `NotOwner`/`NotLeader`: ask
    /// another core).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// Error code of the request's acknowledgements here (0 = applied;
    /// `InvalidRecordState`: not this member's acquired records, nothing
    /// applied).
    pub ack_error: u16,
    /// Why they were refused, if they were.
    pub ack_message: Option<String>,
    /// The records acquired.
    pub acquired: Vec<AcquiredRange>,
    /// Start of its batches, relative to the payload's start.
    pub payload_offset: u32,
    /// Bytes of its batches (0 if none).
    pub payload_len: u32,
}

/// One partition's new share-partition start in an
/// [`AlterShareOffsetsRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ShareStartChange {
    /// The partition.
    pub partition: u32,
    /// Its new start offset (within the log); `None`: forget the group's
    /// state there (it starts again as `--share-auto-offset-reset` says).
    pub start: Option<u64>,
}

/// Moves (or forgets) the share-partition starts of a share group with no
/// members on partitions of one topic — Kafka's AlterShareGroupOffsets
/// and DeleteShareGroupOffsets; `weir group reset --share`. With
/// `validate_only` nothing changes and the answer gives the starts as
/// stored.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AlterShareOffsetsRequest {
    /// The share group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The partitions and their new starts.
    pub partitions: Vec<ShareStartChange>,
    /// Only read the stored starts.
    pub validate_only: bool,
}

/// One partition of an [`AlterShareOffsetsResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ShareStartResult {
    /// The partition.
    pub partition: u32,
    /// Error code (0: changed, or read with `validate_only`).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// The start stored before the change (`None`: nothing stored).
    pub old_start: Option<u64>,
}

/// The answer to an [`AlterShareOffsetsRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct AlterShareOffsetsResponse {
    /// Error code of the whole request (`NonEmptyGroup` while the group
    /// has members, `NotCoordinator`, …).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// Per partition, in the request's order.
    pub partitions: Vec<ShareStartResult>,
}

/// The answer to a [`ShareFetchRequest`] or [`ShareAcknowledgeRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
pub struct ShareFetchResponse {
    /// Error code of the whole request (0 = none;
    /// `ShareSessionNotFound`, `InvalidShareSessionEpoch`: open a new
    /// session, epoch 0).
    pub error: u16,
    /// Why it failed, if it did.
    pub message: Option<String>,
    /// How long acquired records stay locked to the member.
    pub lock_timeout_ms: u32,
    /// The partitions answered.
    pub partitions: Vec<SharePartitionResult>,
}

// --- trait impls -------------------------------------------------------------------

macro_rules! impl_message {
    ($($t:ty),* $(,)?) => {
        $(
            impl Message for $t {
                fn encode_body(&self, out: &mut bytes::BytesMut) -> Result<(), FrameError> {
                    rkyv_encode(self, out)
                }
                fn decode_body(body: &[u8]) -> Result<Self, FrameError> {
                    rkyv_decode(body)
                }
            }
        )*
    };
}

impl_message!(
    ErrorBody,
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    AlterConfigsRequest,
    AlterConfigsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    ProduceRequest,
    ProduceResponse,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    CompactRequest,
    CompactResponse,
    JoinGroupRequest,
    HeartbeatRequest,
    GroupAssignment,
    LeaveGroupRequest,
    GroupResult,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    ChangeVotersRequest,
    ChangeVotersResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    DeleteGroupRequest,
    ReassignPartitionsRequest,
    ReassignPartitionsResponse,
    DescribeUsersRequest,
    AlterUsersRequest,
    UsersResponse,
    DescribeAclsRequest,
    CreateAclsRequest,
    DeleteAclsRequest,
    AclsResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
    AbortTransactionRequest,
    AbortTransactionResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    AddPartitionsToTxnRequest,
    AddOffsetsToTxnRequest,
    TxnResult,
    EndTxnRequest,
    EndTxnResponse,
    TxnOffsetCommitRequest,
    ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse,
    ShareFetchRequest,
    ShareAcknowledgeRequest,
    ShareFetchResponse,
    AlterShareOffsetsRequest,
    AlterShareOffsetsResponse,
);

/// Defines the [`Request`] impls and the [`AnyRequest`] / [`AnyResponse`]
/// enums from one table, so the three cannot disagree.
macro_rules! requests {
    ($($variant:ident => $req:ident, $resp:ident;)*) => {
        $(
            impl Request for $req {
                const API_KEY: ApiKey = ApiKey::$variant;
                type Response = $resp;
            }
        )*

        /// Any request body, tagged by its API.
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[non_exhaustive]
        pub enum AnyRequest {
            $(
                #[doc = concat!("An `", stringify!($variant), "` request.")]
                $variant($req),
            )*
        }

        impl AnyRequest {
            /// The request's API.
            pub fn api_key(&self) -> ApiKey {
                match self {
                    $(AnyRequest::$variant(_) => ApiKey::$variant,)*
                }
            }

            /// Decodes the body of a request frame, after checking that
            /// this build supports the header's API and version
            /// ([`FrameError::UnsupportedApi`],
            /// [`FrameError::UnsupportedVersion`]).
            pub fn decode(header: &RequestHeader, body: &[u8]) -> Result<AnyRequest, FrameError> {
                match header.check_supported()? {
                    $(ApiKey::$variant => <$req>::decode_body(body).map(AnyRequest::$variant),)*
                }
            }

            /// Appends the body's archive to `out` (see
            /// [`Message::encode_body`]).
            pub fn encode_body(&self, out: &mut bytes::BytesMut) -> Result<(), FrameError> {
                match self {
                    $(AnyRequest::$variant(r) => r.encode_body(out),)*
                }
            }
        }

        /// Any response body, tagged by its API, or the body of a
        /// frame-level error.
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[non_exhaustive]
        pub enum AnyResponse {
            /// The frame carried a frame-level error.
            Error(ErrorBody),
            $(
                #[doc = concat!("An `", stringify!($variant), "` response.")]
                $variant($resp),
            )*
        }

        impl AnyResponse {
            /// Decodes the body of a response frame to a request of API
            /// `api` (which the client knows from the correlation id).
            /// When the header carries a frame-level error, the body is an
            /// [`ErrorBody`].
            pub fn decode(api: ApiKey, header: &ResponseHeader, body: &[u8]) -> Result<AnyResponse, FrameError> {
                if !header.error.is_none() {
                    return ErrorBody::decode_body(body).map(AnyResponse::Error);
                }
                match api {
                    $(ApiKey::$variant => <$resp>::decode_body(body).map(AnyResponse::$variant),)*
                }
            }

            /// Appends the body's archive to `out` (see
            /// [`Message::encode_body`]).
            pub fn encode_body(&self, out: &mut bytes::BytesMut) -> Result<(), FrameError> {
                match self {
                    AnyResponse::Error(e) => e.encode_body(out),
                    $(AnyResponse::$variant(r) => r.encode_body(out),)*
                }
            }
        }
    };
}

requests! {
    ApiVersions => ApiVersionsRequest, ApiVersionsResponse;
    Metadata => MetadataRequest, MetadataResponse;
    CreateTopics => CreateTopicsRequest, CreateTopicsResponse;
    DeleteTopics => DeleteTopicsRequest, DeleteTopicsResponse;
    DescribeConfigs => DescribeConfigsRequest, DescribeConfigsResponse;
    AlterConfigs => AlterConfigsRequest, AlterConfigsResponse;
    CreatePartitions => CreatePartitionsRequest, CreatePartitionsResponse;
    Produce => ProduceRequest, ProduceResponse;
    Fetch => FetchRequest, FetchResponse;
    ListOffsets => ListOffsetsRequest, ListOffsetsResponse;
    InitProducerId => InitProducerIdRequest, InitProducerIdResponse;
    Compact => CompactRequest, CompactResponse;
    JoinGroup => JoinGroupRequest, GroupAssignment;
    Heartbeat => HeartbeatRequest, GroupAssignment;
    LeaveGroup => LeaveGroupRequest, GroupResult;
    OffsetCommit => OffsetCommitRequest, OffsetCommitResponse;
    OffsetFetch => OffsetFetchRequest, OffsetFetchResponse;
    ListGroups => ListGroupsRequest, ListGroupsResponse;
    DescribeGroup => DescribeGroupRequest, DescribeGroupResponse;
    DeleteGroup => DeleteGroupRequest, GroupResult;
    DescribeCluster => DescribeClusterRequest, DescribeClusterResponse;
    ChangeVoters => ChangeVotersRequest, ChangeVotersResponse;
    FindCoordinator => FindCoordinatorRequest, FindCoordinatorResponse;
    ReassignPartitions => ReassignPartitionsRequest, ReassignPartitionsResponse;
    DescribeUsers => DescribeUsersRequest, UsersResponse;
    AlterUsers => AlterUsersRequest, UsersResponse;
    DescribeAcls => DescribeAclsRequest, AclsResponse;
    CreateAcls => CreateAclsRequest, AclsResponse;
    DeleteAcls => DeleteAclsRequest, AclsResponse;
    SaslHandshake => SaslHandshakeRequest, SaslHandshakeResponse;
    SaslAuthenticate => SaslAuthenticateRequest, SaslAuthenticateResponse;
    DescribeClientQuotas => DescribeClientQuotasRequest, DescribeClientQuotasResponse;
    AlterClientQuotas => AlterClientQuotasRequest, AlterClientQuotasResponse;
    ListTransactions => ListTransactionsRequest, ListTransactionsResponse;
    AbortTransaction => AbortTransactionRequest, AbortTransactionResponse;
    DescribeProducers => DescribeProducersRequest, DescribeProducersResponse;
    AddPartitionsToTxn => AddPartitionsToTxnRequest, TxnResult;
    AddOffsetsToTxn => AddOffsetsToTxnRequest, TxnResult;
    EndTxn => EndTxnRequest, EndTxnResponse;
    TxnOffsetCommit => TxnOffsetCommitRequest, OffsetCommitResponse;
    ShareGroupHeartbeat => ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse;
    ShareFetch => ShareFetchRequest, ShareFetchResponse;
    ShareAcknowledge => ShareAcknowledgeRequest, ShareFetchResponse;
    AlterShareOffsets => AlterShareOffsetsRequest, AlterShareOffsetsResponse;
}
