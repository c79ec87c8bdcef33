//! What one core holds of share groups: the groups it coordinates, the
//! share partitions of the topic partitions it owns, and the members'
//! share sessions with it. What acts on it is [`super::service`].

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};

use std::collections::BTreeMap;
use std::rc::Rc;

use weir_share::group::ShareGroup;
use weir_share::partition::{SharePartition, ShareSnapshot};
use weir_share::records::ShareKey;

use crate::coordinator::hosting::Hosting;
use crate::error::BrokerError;

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
    /// Acknowledgements answered before they were stored (fetches that
    /// asked for it, `acks_later`), by share partition and the
    /// partition's leader epoch they were made under: the change a store
    /// must cover. A request that only acknowledges, and the session's
    /// close, wait for them (a change of another epoch is not covered by
    /// this epoch's stores: kept apart, it fails alone).
    pub unstored: HashMap<(ShareKey, u32), u64>,
    /// Stores of those that failed, named in the session's next answer.
    pub store_failures: HashMap<(ShareKey, u32), BrokerError>,
}

impl Session {
    /// Notes share partition `k`'s change `seq` (made at leader epoch
    /// `epoch`) answered before it was stored.
    pub fn note_unstored(&mut self, k: &ShareKey, epoch: u32, seq: u64) {
        let at = self.unstored.entry((k.clone(), epoch)).or_insert(seq);
        *at = (*at).max(seq);
    }
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
    /// Share fetches waiting for records to become acquirable in share
    /// partitions whose window is full (woken by any acknowledgement,
    /// release or expiry on this core).
    pub(crate) waiting: RefCell<Vec<futures_channel::oneshot::Sender<()>>>,
    /// The stores of each share partition's state.
    pub(crate) store_lines: RefCell<HashMap<ShareKey, Rc<StoreLine>>>,
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

/// The stores of one share partition's state: one at a time (each
/// snapshot is taken under the lock, so stores land in the order of the
/// changes), and a change that a store finished since covers is not
/// stored again — acknowledgements of many members arriving together
/// share one write (a group commit).
pub(crate) struct StoreLine {
    /// Held while a snapshot is taken and stored.
    pub(crate) lock: glommio::sync::Semaphore,
    /// Changes made to the share partition (counted).
    pub(crate) changed: Cell<u64>,
    /// Changes covered by a finished store.
    pub(crate) stored: Cell<u64>,
    /// A store of acknowledgements answered early waits for the lock and
    /// has not taken its snapshot yet: it will cover changes made until
    /// then, so no other is queued (stores do not pile up while one is
    /// slow or failing).
    pub(crate) later_queued: Cell<bool>,
}

impl Shares {
    /// The store line of share partition `k`.
    pub(crate) fn store_line(&self, k: &ShareKey) -> Rc<StoreLine> {
        self.store_lines
            .borrow_mut()
            .entry(k.clone())
            .or_insert_with(|| {
                Rc::new(StoreLine {
                    lock: glommio::sync::Semaphore::new(1),
                    changed: Cell::new(0),
                    stored: Cell::new(0),
                    later_queued: Cell::new(false),
                })
            })
            .clone()
    }

    /// Wakes the share fetches waiting for records to free up.
    pub(crate) fn wake(&self) {
        for tx in self.waiting.borrow_mut().drain(..) {
            let _ = tx.send(());
        }
    }

    /// Counts a change of share partition `k`'s durable state (made just
    /// now): the number a store must cover for it.
    pub(crate) fn changed(&self, k: &ShareKey) -> u64 {
        let line = self.store_line(k);
        line.changed.set(line.changed.get() + 1);
        line.changed.get()
    }
}
