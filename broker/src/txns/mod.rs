//! Transactions in the broker: the hosting of `weir-txn`'s transaction
//! coordinator (sans-IO: transactional ids, producer epochs, the states
//! of a transaction, the `__transaction_state` record) on the coordinator
//! runtime ([`crate::coordinator`]: it creates the topic, replays it,
//! writes durably).
//!
//! * [`coordinator`]: where a transactional id lives (its partition of
//!   `__transaction_state`, on the core leading it), the partition's lock,
//!   each step stored before it is answered, the markers written to the
//!   transaction's partitions (then the completion), timeouts;
//! * [`registry`]: what a core keeps (its partitions' state machines, a
//!   pool of producer ids);
//! * [`machine`]: the transactions as a machine of the runtime;
//! * [`api`]: the requests and answers that travel the mesh.
//!
//! Markers reach partitions led on this node (any core, through the
//! mesh); a partition led by another node gets its marker when that node
//! can be asked (not built yet: the transaction stays prepared, retried).

pub mod api;
pub mod coordinator;
pub mod machine;
pub mod registry;

/// The internal topic of the transaction coordinator's state.
pub use crate::metadata::TXN_TOPIC;
/// Partitions of a new `__transaction_state` (Kafka's
/// `transaction.state.log.num.partitions`).
pub const TXN_TOPIC_PARTITIONS: u32 = 50;
