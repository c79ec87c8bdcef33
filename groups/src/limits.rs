//! Every bound of the group coordinator, in one place (the broker's own are
//! in `server::limits`), with the relations between them checked by the
//! compiler. Both protocols share the group bounds; member ids differ
//! because they are made differently: a classic member id is made by the
//! coordinator from a client-chosen name, a KIP-848 member id is chosen by
//! the client.

/// Most members of one group, in either protocol (a classic group's
/// `Config::max_size` may only be lower).
pub const GROUP_MEMBERS_MAX: usize = 10_000;

// --- the classic protocol (JoinGroup/SyncGroup) ------------------------------

/// Most protocols one JoinGroup may list.
pub const PROTOCOLS_MAX: usize = 64;
/// Most bytes of protocol metadata one member may send, all protocols together.
pub const MEMBER_METADATA_BYTES_MAX: usize = 1 << 20;
/// Most bytes of one member's assignment.
pub const ASSIGNMENT_BYTES_MAX: usize = 1 << 20;
/// Longest client id, client host, group instance id, protocol type or name
/// of a classic member.
pub const NAME_BYTES_MAX: usize = 1024;
/// Longest string a classic group's `fresh_id` function may return.
pub const FRESH_ID_BYTES_MAX: usize = 64;
/// Longest classic member id (`{client id or instance id}-{fresh id}`),
/// made by the coordinator.
pub const CLASSIC_MEMBER_ID_BYTES_MAX: usize = NAME_BYTES_MAX + 1 + FRESH_ID_BYTES_MAX;
/// Most members one LeaveGroup may name.
pub const LEAVE_MEMBERS_MAX: usize = GROUP_MEMBERS_MAX;
/// Shortest rebalance (and sync) timeout the group uses, whatever members ask.
pub const REBALANCE_TIMEOUT_MS_MIN: u32 = 1;

// --- KIP-848 (ConsumerGroupHeartbeat) -----------------------------------------

/// Shortest session timeout a member may ask for.
pub const SESSION_TIMEOUT_MS_MIN: u32 = 100;
/// Longest session (and rebalance) timeout a member may ask for.
pub const SESSION_TIMEOUT_MS_MAX: u32 = 30 * 60 * 1000;
/// Most topics one member may subscribe to.
pub const MEMBER_TOPICS_MAX: usize = 10_000;
/// Longest KIP-848 member id, client id or instance id, bytes (chosen by
/// the client: a UUID in Kafka's clients).
pub const CONSUMER_MEMBER_ID_BYTES_MAX: usize = 255;
/// Most partitions a member may report owning in one heartbeat.
pub const OWNED_PARTITIONS_MAX: usize = 100_000;
/// Longest heartbeat interval answered.
pub const HEARTBEAT_INTERVAL_MS_MAX: u32 = 3000;

// Lengths are encoded as u16 in the group snapshot and u32 counts elsewhere.
const _: () = assert!(CLASSIC_MEMBER_ID_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(CONSUMER_MEMBER_ID_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(NAME_BYTES_MAX <= CLASSIC_MEMBER_ID_BYTES_MAX);
const _: () = assert!(MEMBER_METADATA_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(ASSIGNMENT_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(GROUP_MEMBERS_MAX <= u32::MAX as usize);
const _: () = assert!(LEAVE_MEMBERS_MAX >= GROUP_MEMBERS_MAX);
const _: () = assert!(SESSION_TIMEOUT_MS_MIN <= SESSION_TIMEOUT_MS_MAX);
// A member heartbeats several times per session, even the shortest.
const _: () = assert!(HEARTBEAT_INTERVAL_MS_MAX <= SESSION_TIMEOUT_MS_MAX / 3);
