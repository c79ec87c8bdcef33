//! What every core checks requests against, published from the cluster
//! metadata — the ACLs and the client quotas: core 0's metadata follower
//! replaces them when a new version changes them ([`Published::publish`]);
//! each core keeps its own copy and takes the new one only when the
//! generation moved ([`CoreCopy::current`]: one atomic load per check, no
//! lock).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The node's current list.
#[derive(Debug)]
pub struct Published<T> {
    generation: AtomicU64,
    items: RwLock<Arc<Vec<T>>>,
}

impl<T> Default for Published<T> {
    fn default() -> Self {
        Published {
            generation: AtomicU64::new(0),
            items: RwLock::new(Arc::new(Vec::new())),
        }
    }
}

impl<T: Clone + PartialEq> Published<T> {
    /// Publishes `items` if they differ from the current ones.
    pub fn publish(&self, items: &[T]) {
        let mut current = self.items.write().expect("not poisoned");
        if current.as_slice() != items {
            *current = Arc::new(items.to_vec());
            self.generation.fetch_add(1, Ordering::Release);
        }
    }

    /// The generation: moves with every change.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

/// One core's copy.
#[derive(Debug)]
pub struct CoreCopy<T> {
    copy: RefCell<(u64, Arc<Vec<T>>)>,
}

impl<T> Default for CoreCopy<T> {
    fn default() -> Self {
        CoreCopy {
            copy: RefCell::new((0, Arc::new(Vec::new()))),
        }
    }
}

impl<T> CoreCopy<T> {
    /// The current list.
    pub fn current(&self, published: &Published<T>) -> Arc<Vec<T>> {
        let generation = published.generation.load(Ordering::Acquire);
        let mut copy = self.copy.borrow_mut();
        if copy.0 != generation {
            *copy = (
                generation,
                published.items.read().expect("not poisoned").clone(),
            );
        }
        copy.1.clone()
    }
}
