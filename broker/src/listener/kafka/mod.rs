//! The Kafka listener: Apache Kafka's wire protocol onto the same service
//! layer as the native protocol ([`crate::service`]) and the same group
//! coordinator ([`crate::groups::coordinator`]).
//!
//! [`codec`](weir_kafka::codec) decodes a request frame into
//! `kafka-protocol`'s typed request (record batches stay the frame's bytes)
//! and encodes answers (a Fetch answer's batches are the cache's bytes, not
//! copied, when a partition's answer is one batch). This module maps each
//! API onto the service and maps errors onto Kafka's codes.
//!
//! One file per API family, each mapping its requests onto `service/` (or
//! the group coordinator) and their results onto Kafka's answers:
//!
//! | file | APIs |
//! |---|---|
//! | `dispatch.rs` | the [`Protocol`](crate::listener::connection::Protocol) of the connection pipeline: frame lengths, each request to its family |
//! | `cluster.rs` | Metadata, FindCoordinator, DescribeCluster, InitProducerId; leader epochs and the endpoints refusals name |
//! | `data.rs` | Produce, Fetch, ListOffsets, OffsetForLeaderEpoch |
//! | `groups.rs` | JoinGroup … DeleteGroups, OffsetCommit/Fetch, ConsumerGroupHeartbeat/Describe |
//! | `topics.rs` | CreateTopics, DeleteTopics, CreatePartitions, DeleteRecords, DescribeConfigs, IncrementalAlterConfigs |
//! | `authz.rs` | what each request needs of the ACLs, and its refusal |
//! | `security.rs` | SaslHandshake, SaslAuthenticate, Describe/AlterUserScramCredentials, Create/Describe/DeleteAcls |
//! | `quotas.rs` | DescribeClientQuotas, AlterClientQuotas |
//! | `errors.rs` | `BrokerError` → Kafka code, exhaustive |
//! | `common.rs` | the imports every family speaks in, building answers |
//!
//! A new Kafka API: its version range in `weir_kafka::codec::SUPPORTED`, its
//! decoding there, its handler in the family's file, one arm in
//! `dispatch.rs`. Kafka clients know nothing of cores: a partition of
//! another core is served through the mesh, as on the native shared port.

mod authz;
mod cluster;
mod common;
mod data;
mod dispatch;
mod errors;
mod groups;
mod quotas;
mod security;
mod share;
mod topics;
mod txn;

pub use dispatch::Kafka;
pub use errors::broker_error_code;
