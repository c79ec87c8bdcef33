//! Wire error numbers used by the broker (mirrors `weir_proto`'s
//! `ErrorCode`; stable, never reused).
#![allow(missing_docs)]

pub const NONE: u16 = 0;
pub const UNKNOWN: u16 = 1;
pub const CORRUPT_MESSAGE: u16 = 2;
pub const UNKNOWN_TOPIC_OR_PARTITION: u16 = 3;
pub const OFFSET_OUT_OF_RANGE: u16 = 4;
pub const MESSAGE_TOO_LARGE: u16 = 5;
pub const INVALID_REQUEST: u16 = 6;
pub const UNSUPPORTED_VERSION: u16 = 7;
pub const UNSUPPORTED_API: u16 = 8;
pub const FRAME_TOO_LARGE: u16 = 9;
pub const TOPIC_ALREADY_EXISTS: u16 = 10;
pub const INVALID_CONFIG: u16 = 11;
pub const INVALID_PARTITIONS: u16 = 12;
pub const NOT_OWNER: u16 = 13;
pub const REQUEST_TIMED_OUT: u16 = 14;
pub const STORAGE_ERROR: u16 = 15;
pub const INVALID_TOPIC: u16 = 18;
pub const RECOVERING: u16 = 19;
pub const OUT_OF_ORDER_SEQUENCE: u16 = 20;
pub const INVALID_PRODUCER_EPOCH: u16 = 21;
pub const UNKNOWN_PRODUCER_ID: u16 = 22;
pub const INVALID_RECORD: u16 = 23;
pub const POLICY_VIOLATION: u16 = 17;
pub const UNKNOWN_MEMBER_ID: u16 = 30;
pub const ILLEGAL_GENERATION: u16 = 31;
pub const GROUP_NOT_EMPTY: u16 = 32;
pub const GROUP_ID_NOT_FOUND: u16 = 33;
pub const INVALID_GROUP_ID: u16 = 34;
pub const INCONSISTENT_ASSIGNOR: u16 = 35;
pub const INVALID_SESSION_TIMEOUT: u16 = 36;
