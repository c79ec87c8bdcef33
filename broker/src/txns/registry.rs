//! What a core keeps for the transactional ids it coordinates (plain
//! state; the coordinator acts on it).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;

use weir_txn::{Transactions, TxnConfig};

use crate::coordinator::hosting::Hosting;

/// The coordinator's bounds (Kafka's defaults of
/// `transaction.max.timeout.ms` and `transactional.id.expiration.ms`).
pub fn txn_config() -> TxnConfig {
    TxnConfig::default()
}

/// The transaction coordinator's state on one core.
#[derive(Default)]
pub struct Txns {
    /// What the runtime keeps for the machine.
    pub hosting: Hosting,
    /// The state machine of each partition of `__transaction_state` this
    /// core leads.
    pub parts: RefCell<BTreeMap<u32, Transactions>>,
    /// One step at a time per partition: a step's record is durable (a
    /// completion's: appended) before the next step of that partition
    /// starts.
    pub locks: RefCell<HashMap<u32, Rc<glommio::sync::Semaphore>>>,
    /// Completions by partition: how many were started (their records
    /// appended without waiting for durability) and up to which one
    /// all have ended (durable, or failed and the partition replayed).
    pub completions: RefCell<HashMap<u32, (u64, u64)>>,
    /// Producer ids taken from the cluster's allocator, handed to new
    /// transactional ids.
    pub ids: RefCell<VecDeque<i64>>,
    /// Each partition's generation: raised whenever its state machine is
    /// forgotten (another core leads it now, or it is replayed again). A
    /// markers task writes for the generation it was started in only: the
    /// replay starts the markers of what it finds prepared afresh.
    pub generations: RefCell<HashMap<u32, u64>>,
}

impl std::fmt::Debug for Txns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Txns")
            .field("partitions", &self.parts.borrow().len())
            .finish()
    }
}

impl Txns {
    /// Partition `p`'s generation now.
    pub fn generation(&self, p: u32) -> u64 {
        self.generations.borrow().get(&p).copied().unwrap_or(0)
    }

    /// Numbers a completion of partition `p` whose record is appended
    /// without waiting for it to be durable.
    pub fn completion_started(&self, p: u32) -> u64 {
        let mut c = self.completions.borrow_mut();
        let e = c.entry(p).or_default();
        e.0 += 1;
        e.0
    }

    /// Completion `seq` of partition `p` ended. Its record is in the log
    /// after the earlier ones', so they have ended too.
    pub fn completion_ended(&self, p: u32, seq: u64) {
        let mut c = self.completions.borrow_mut();
        let e = c.entry(p).or_default();
        e.1 = e.1.max(seq);
    }

    /// Completions of partition `p` started so far.
    pub fn completions_started(&self, p: u32) -> u64 {
        self.completions.borrow().get(&p).map_or(0, |e| e.0)
    }

    /// Up to which completion of partition `p` all have ended.
    pub fn completions_ended(&self, p: u32) -> u64 {
        self.completions.borrow().get(&p).map_or(0, |e| e.1)
    }

    /// The lock of partition `p`.
    pub fn lock(&self, p: u32) -> Rc<glommio::sync::Semaphore> {
        self.locks
            .borrow_mut()
            .entry(p)
            .or_insert_with(|| Rc::new(glommio::sync::Semaphore::new(1)))
            .clone()
    }
}
