//! Share groups (KIP-932: several members read one partition, each record
//! acknowledged on its own) on the broker, hosting `weir-share`'s
//! machines:
//!
//! * **membership** ([`service::heartbeat`]) on the group's coordinator core — the
//!   core leading the group's `__consumer_offsets` partition, as for
//!   consumer groups (FindCoordinator names it);
//! * **share partitions** ([`service::fetch`], which serves ShareAcknowledge too) on the core that
//!   owns the topic partition: Kafka's clients send ShareFetch and
//!   ShareAcknowledge to the partition's leader, which on Weir is a core;
//! * **share sessions** (the partitions a member fetches from one core,
//!   and the session epoch) beside them.
//!
//! [`registry`] is the state a core holds; [`service`] acts on it.
//!
//! A share partition's state is durable in `__share_group_state`
//! ([`state`]): stored before an acknowledgement is answered (a native
//! fetch may ask to be answered first; its session's next ShareAcknowledge
//! then waits for the store), loaded when a core first serves the share
//! partition (after a restart or a change of leader). Membership is not
//! stored: members join again.

pub mod registry;
pub mod service;
pub mod state;

pub use service::STORE_GATE_ENV;
