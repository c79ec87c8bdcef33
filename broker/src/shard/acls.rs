//! The ACLs every core checks requests against, published from the
//! cluster metadata: core 0's metadata follower replaces them when a new
//! version changes them ([`Published::publish`]); each core keeps its own
//! copy and takes the new one only when the generation moved
//! ([`CoreAcls::current`]: one atomic load per check, no lock).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use weir_replication::meta::AclBinding;

/// The node's current ACLs.
#[derive(Debug, Default)]
pub struct Published {
    generation: AtomicU64,
    acls: RwLock<Arc<Vec<AclBinding>>>,
}

impl Published {
    /// Publishes `acls` if they differ from the current ones.
    pub fn publish(&self, acls: &[AclBinding]) {
        let mut current = self.acls.write().expect("not poisoned");
        if current.as_slice() != acls {
            *current = Arc::new(acls.to_vec());
            self.generation.fetch_add(1, Ordering::Release);
        }
    }
}

/// One core's copy.
#[derive(Debug, Default)]
pub struct CoreAcls {
    copy: RefCell<(u64, Arc<Vec<AclBinding>>)>,
}

impl CoreAcls {
    /// The current ACLs.
    pub fn current(&self, published: &Published) -> Arc<Vec<AclBinding>> {
        let generation = published.generation.load(Ordering::Acquire);
        let mut copy = self.copy.borrow_mut();
        if copy.0 != generation {
            *copy = (
                generation,
                published.acls.read().expect("not poisoned").clone(),
            );
        }
        copy.1.clone()
    }
}
