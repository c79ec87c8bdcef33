//! `weir-tier`: tiered storage's side that is not the broker's.
//!
//! - [`store`]: [`RemoteStore`], the object store (S3 or an S3-compatible
//!   store, Google Cloud Storage, Azure Blob Storage, or a local
//!   directory) through the `object_store` crate, on a
//!   runtime thread of its own, so that the broker's glommio cores only
//!   await its answers: timeouts, retries with backoff, multipart uploads
//!   of large segments, a bound on requests in flight.
//! - [`pace`]: the node's upload rate cap
//!   (`remote.log.manager.copy.max.bytes.per.second`).
//! - [`layout`]: where a remote segment's objects are (names, the leader
//!   epoch file), documented in `docs/storage-format.md`.
//!
//! What is remote and in which state is the cluster metadata's
//! (`weir_replication::remote`); what uploads, reads and deletes is the
//! broker's `tier/` room.

#![warn(missing_docs)]

pub mod layout;
pub mod pace;
pub mod store;

pub use pace::CopyPace;
pub use store::{RemoteConfig, RemoteStore, TierError, Upload};
