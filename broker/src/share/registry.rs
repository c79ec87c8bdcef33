//! What one core holds of share groups: the groups it coordinates, the
//! share partitions of the topic partitions it owns, and the members'
//! share sessions with it. What acts on it is [`super::service`].

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use weir_share::group::ShareGroup;
use weir_share::partition::SharePartition;
use weir_share::records::ShareKey;

/// A member's share session with one core: the partitions it fetches
/// here and the epoch its next request must carry.
#[derive(Debug, Clone, Default)]
pub struct Session {
    /// The next request's epoch.
    pub epoch: i32,
    /// The partitions of the session.
    pub partitions: BTreeSet<(String, u32)>,
}

/// What one core holds of share groups.
#[derive(Default)]
pub struct Shares {
    /// The share groups this core coordinates.
    pub(crate) groups: RefCell<HashMap<String, ShareGroup>>,
    /// The share partitions of the topic partitions this core owns.
    pub(crate) parts: RefCell<HashMap<ShareKey, SharePartition>>,
    /// Share sessions with this core, by (group, member).
    pub(crate) sessions: RefCell<HashMap<(String, String), Session>>,
}
