//! What one core holds of share groups: the groups it coordinates, the
//! share partitions of the topic partitions it owns, and the members'
//! share sessions with it. What acts on it is [`super::service`].

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use std::collections::BTreeMap;
use std::rc::Rc;

use weir_share::group::ShareGroup;
use weir_share::partition::{SharePartition, ShareSnapshot};
use weir_share::records::ShareKey;

use crate::coordinator::hosting::Hosting;

/// A member's share session with one core: the partitions it fetches
/// here and the epoch its next request must carry.
#[derive(Debug, Clone, Default)]
pub struct Session {
    /// The next request's epoch.
    pub epoch: i32,
    /// The partitions of the session.
    pub partitions: BTreeSet<(String, u32)>,
    /// When it was last used (ms since the epoch).
    pub used_ms: i64,
}

/// What one core holds of share groups.
#[derive(Default)]
pub struct Shares {
    /// The share groups this core coordinates.
    pub(crate) groups: RefCell<HashMap<String, ShareGroup>>,
    /// The share partitions of the topic partitions this core owns, with
    /// the partition's leader epoch they were loaded at.
    pub(crate) parts: RefCell<HashMap<ShareKey, (u32, SharePartition)>>,
    /// Share sessions with this core, by (group, member).
    pub(crate) sessions: RefCell<HashMap<(String, String), Session>>,
    /// One store of a share partition's state at a time (each snapshot
    /// is taken under it, so stores land in the order of the changes).
    pub(crate) store_locks: RefCell<HashMap<ShareKey, Rc<glommio::sync::Semaphore>>>,
    /// The durable states this core keeps (the `__share_group_state`
    /// partitions it leads).
    pub states: ShareStates,
}

/// The machine of `__share_group_state` on one core: the latest
/// snapshot of each share partition stored in the partitions this core
/// leads.
#[derive(Default)]
pub struct ShareStates {
    /// What the runtime keeps for the machine.
    pub hosting: Hosting,
    /// By `__share_group_state` partition.
    pub parts: RefCell<BTreeMap<u32, HashMap<ShareKey, ShareSnapshot>>>,
}

impl Shares {
    /// The store lock of share partition `k`.
    pub(crate) fn store_lock(&self, k: &ShareKey) -> Rc<glommio::sync::Semaphore> {
        self.store_locks
            .borrow_mut()
            .entry(k.clone())
            .or_insert_with(|| Rc::new(glommio::sync::Semaphore::new(1)))
            .clone()
    }
}
