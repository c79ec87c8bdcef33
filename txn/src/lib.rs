//! Kafka transactions (KIP-98, with KIP-890's v2 protocol) as a pure state
//! machine: the transaction coordinator's view of every transactional id
//! of one partition of `__transaction_state`. No I/O, no runtime, no
//! clock: time comes in as `now_ms`, producer ids from the caller, and
//! every step hands back the record to store before it is answered and
//! the markers to write once that record is durable. The broker hosts it
//! on its coordinator runtime (one instance per partition of
//! `__transaction_state`, on the core leading it) and maps Kafka's APIs
//! onto it; no protocol's types appear here (`cargo tree -p weir-txn -e
//! normal`: nothing).
//!
//! * [`coordinator`]: the transactional ids, their states and the rules
//!   of InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, the
//!   markers' completion, timeouts and expiry;
//! * [`records`]: the `__transaction_state` record (Weir's own layout,
//!   `docs/storage-format.md`).
//!
//! A simulation drives it with current and zombie producers, markers
//! completing in any order, timeouts and replays (`model_tests`).
#![warn(missing_docs)]

pub mod coordinator;
pub mod records;

#[cfg(test)]
mod model_tests;

pub use coordinator::{
    Markers, Step, Tp, TransactionVersion, Transactions, TxnConfig, TxnError, TxnMetadata, TxnState,
};
