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
//! * [`api`]: the requests and answers that travel the mesh;
//! * [`admin`]: what operators ask (the transactions a node coordinates,
//!   the producers a partition remembers).
//!
//! Markers reach partitions led on this node (any core, through the
//! mesh) and partitions led by other nodes (node to node, over the
//! replication mesh's data requests).

pub mod admin;
pub mod api;
pub mod coordinator;
pub mod machine;
pub mod registry;

/// The internal topic of the transaction coordinator's state.
pub use crate::metadata::TXN_TOPIC;
/// Partitions of a new `__transaction_state` (Kafka's
/// `transaction.state.log.num.partitions`).
pub const TXN_TOPIC_PARTITIONS: u32 = 50;
