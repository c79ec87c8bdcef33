//! What the coordinator runtime keeps for one machine on one core (held in
//! the machine's state, so a leaf: plain data).

use std::cell::{Cell, RefCell};
use std::collections::HashSet;

/// What the runtime keeps for one machine on one core: whether the
/// start-up replay is done, and which partitions it leads but has not
/// replayed yet.
#[derive(Debug, Default)]
pub struct Hosting {
    loaded: Cell<bool>,
    loading: RefCell<HashSet<u32>>,
}

impl Hosting {
    /// Whether partition `p`'s state is served: the start-up replay is
    /// done and `p` is not being replayed.
    pub fn ready(&self, p: u32) -> bool {
        self.loaded.get() && !self.loading.borrow().contains(&p)
    }

    /// Whether the start-up replay is done.
    pub fn loaded(&self) -> bool {
        self.loaded.get()
    }

    /// The start-up replay is done.
    pub(crate) fn set_loaded(&self) {
        self.loaded.set(true);
    }

    /// Partition `p` is being replayed (`true`) or served (`false`).
    pub(crate) fn set_loading(&self, p: u32, loading: bool) {
        let mut set = self.loading.borrow_mut();
        if loading {
            set.insert(p);
        } else {
            set.remove(&p);
        }
    }
}
