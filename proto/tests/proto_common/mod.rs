//! Strategies and helpers shared by the native-protocol tests.
#![allow(dead_code)]

use proptest::prelude::*;
use weir_proto::api::ApiKey;
use weir_proto::frame::{
    decode_body, decode_request, decode_response, payload_slice, peek_frame_len,
    FRAME_BYTES_MAX_DEFAULT,
};
use weir_proto::messages::*;

pub fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9._-]{0,16}",
        1 => ".{0,8}",
    ]
}

pub fn error() -> impl Strategy<Value = u16> {
    prop_oneof![3 => Just(0u16), 2 => 0u16..25, 1 => any::<u16>()]
}

pub fn message() -> impl Strategy<Value = Option<String>> {
    prop::option::of(".{0,24}")
}

pub fn configs() -> impl Strategy<Value = Vec<ConfigEntry>> {
    prop::collection::vec((name(), ".{0,12}"), 0..4)
}

pub fn topic_result() -> impl Strategy<Value = TopicResult> {
    (name(), error(), message()).prop_map(|(name, error, message)| TopicResult {
        name,
        error,
        message,
    })
}

pub fn topic_results() -> impl Strategy<Value = Vec<TopicResult>> {
    prop::collection::vec(topic_result(), 0..5)
}

/// Per-partition byte strings, laid out back to back in a payload; returns
/// `(payload, ranges)`.
pub fn lay_out(chunks: &[Vec<u8>]) -> (Vec<u8>, Vec<(u32, u32)>) {
    let mut payload = Vec::new();
    let mut ranges = Vec::new();
    for c in chunks {
        ranges.push((payload.len() as u32, c.len() as u32));
        payload.extend_from_slice(c);
    }
    (payload, ranges)
}

fn chunks() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..5)
}

// --- requests -------------------------------------------------------------------

pub fn api_versions_request() -> impl Strategy<Value = ApiVersionsRequest> {
    Just(ApiVersionsRequest {})
}

pub fn metadata_request() -> impl Strategy<Value = MetadataRequest> {
    prop::option::of(prop::collection::vec(name(), 0..5))
        .prop_map(|topics| MetadataRequest { topics })
}

pub fn create_topics_request() -> impl Strategy<Value = CreateTopicsRequest> {
    prop::collection::vec(
        (name(), any::<u32>(), configs()).prop_map(|(name, partitions, configs)| NewTopic {
            name,
            partitions,
            configs,
            replication_factor: partitions % 4,
        }),
        0..4,
    )
    .prop_map(|topics| CreateTopicsRequest { topics })
}

pub fn delete_topics_request() -> impl Strategy<Value = DeleteTopicsRequest> {
    prop::collection::vec(name(), 0..5).prop_map(|names| DeleteTopicsRequest { names })
}

pub fn describe_configs_request() -> impl Strategy<Value = DescribeConfigsRequest> {
    prop::collection::vec(name(), 0..5).prop_map(|topics| DescribeConfigsRequest { topics })
}

pub fn alter_configs_request() -> impl Strategy<Value = AlterConfigsRequest> {
    prop::collection::vec((name(), configs()), 0..4)
        .prop_map(|topics| AlterConfigsRequest { topics })
}

pub fn create_partitions_request() -> impl Strategy<Value = CreatePartitionsRequest> {
    prop::collection::vec((name(), any::<u32>()), 0..5)
        .prop_map(|topics| CreatePartitionsRequest { topics })
}

/// A produce request and the payload its ranges point into.
pub fn produce_request() -> impl Strategy<Value = (ProduceRequest, Vec<u8>)> {
    (
        prop::sample::select(vec![0i8, 1, -1]),
        any::<u32>(),
        chunks(),
        prop::collection::vec((name(), any::<u32>()), 5),
    )
        .prop_map(|(acks, timeout_ms, chunks, targets)| {
            let (payload, ranges) = lay_out(&chunks);
            let partitions = ranges
                .iter()
                .zip(targets)
                .map(
                    |(&(payload_offset, payload_len), (topic, partition))| ProducePartition {
                        topic,
                        partition,
                        payload_offset,
                        payload_len,
                    },
                )
                .collect();
            (
                ProduceRequest {
                    transactional_id: None,
                    acks,
                    timeout_ms,
                    partitions,
                },
                payload,
            )
        })
}

pub fn fetch_request() -> impl Strategy<Value = FetchRequest> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        prop::collection::vec(
            (name(), any::<u32>(), any::<u64>(), any::<u32>()).prop_map(
                |(topic, partition, offset, max_bytes)| FetchPartition {
                    topic,
                    partition,
                    offset,
                    max_bytes,
                },
            ),
            0..5,
        ),
    )
        .prop_map(
            |(max_wait_ms, min_bytes, max_bytes, partitions)| FetchRequest {
                read_committed: max_wait_ms % 2 == 0,
                max_wait_ms,
                min_bytes,
                max_bytes,
                partitions,
            },
        )
}

pub fn offset_spec() -> impl Strategy<Value = OffsetSpec> {
    prop_oneof![
        Just(OffsetSpec::Earliest),
        Just(OffsetSpec::Latest),
        any::<i64>().prop_map(OffsetSpec::Timestamp),
    ]
}

pub fn list_offsets_request() -> impl Strategy<Value = ListOffsetsRequest> {
    prop::collection::vec(
        (name(), any::<u32>(), offset_spec()).prop_map(|(topic, partition, spec)| {
            ListOffsetsPartition {
                topic,
                partition,
                spec,
            }
        }),
        0..5,
    )
    .prop_map(|partitions| ListOffsetsRequest {
        partitions,
        read_committed: false,
    })
}

// --- responses --------------------------------------------------------------------

pub fn api_versions_response() -> impl Strategy<Value = ApiVersionsResponse> {
    prop::collection::vec(
        (any::<u16>(), any::<u16>(), any::<u16>())
            .prop_map(|(api_key, min, max)| ApiVersionRange { api_key, min, max }),
        0..12,
    )
    .prop_map(|apis| ApiVersionsResponse { apis })
}

pub fn metadata_response() -> impl Strategy<Value = MetadataResponse> {
    let cores = prop::collection::vec(
        (any::<u32>(), name(), any::<u16>()).prop_map(|(core, host, port)| CoreInfo {
            core,
            host,
            port,
        }),
        0..4,
    );
    let partitions = prop::collection::vec(
        (any::<u32>(), any::<u32>(), error()).prop_map(|(partition, core, error)| {
            PartitionMetadata {
                partition,
                core,
                error,
            }
        }),
        0..4,
    );
    let topics = prop::collection::vec(
        (name(), error(), partitions).prop_map(|(name, error, partitions)| TopicMetadata {
            name,
            error,
            partitions,
        }),
        0..4,
    );
    (cores, topics).prop_map(|(cores, topics)| MetadataResponse { cores, topics })
}

pub fn create_topics_response() -> impl Strategy<Value = CreateTopicsResponse> {
    topic_results().prop_map(|topics| CreateTopicsResponse { topics })
}

pub fn delete_topics_response() -> impl Strategy<Value = DeleteTopicsResponse> {
    topic_results().prop_map(|topics| DeleteTopicsResponse { topics })
}

pub fn describe_configs_response() -> impl Strategy<Value = DescribeConfigsResponse> {
    let partitions = prop::collection::vec(
        (
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
        )
            .prop_map(
                |(partition, core, log_start_offset, log_end_offset, size_bytes)| {
                    PartitionDescription {
                        partition,
                        core,
                        log_start_offset,
                        log_end_offset,
                        size_bytes,
                        local_log_start_offset: log_start_offset / 2,
                        remote_bytes: size_bytes / 3,
                        remote_segments: partition / 5,
                        leader: u64::from(core) + 1,
                        leader_epoch: partition,
                        replicas: vec![1, 2, 3],
                        isr: vec![1, 3],
                        target: if partition % 3 == 0 {
                            vec![2, 3]
                        } else {
                            vec![]
                        },
                        here: core % 2 == 0,
                    }
                },
            ),
        0..4,
    );
    prop::collection::vec(
        (name(), error(), configs(), partitions).prop_map(|(name, error, configs, partitions)| {
            TopicConfigs {
                name,
                error,
                configs,
                partitions,
            }
        }),
        0..4,
    )
    .prop_map(|topics| DescribeConfigsResponse { topics })
}

pub fn alter_configs_response() -> impl Strategy<Value = AlterConfigsResponse> {
    topic_results().prop_map(|topics| AlterConfigsResponse { topics })
}

pub fn create_partitions_response() -> impl Strategy<Value = CreatePartitionsResponse> {
    topic_results().prop_map(|topics| CreatePartitionsResponse { topics })
}

pub fn produce_response() -> impl Strategy<Value = ProduceResponse> {
    prop::collection::vec(
        (
            name(),
            any::<u32>(),
            error(),
            message(),
            any::<u64>(),
            any::<u64>(),
        )
            .prop_map(
                |(topic, partition, error, message, base_offset, log_start_offset)| {
                    ProducePartitionResult {
                        topic,
                        partition,
                        error,
                        message,
                        base_offset,
                        log_start_offset,
                    }
                },
            ),
        0..5,
    )
    .prop_map(|partitions| ProduceResponse { partitions })
}

/// A fetch response and the payload its ranges point into.
pub fn fetch_response() -> impl Strategy<Value = (FetchResponse, Vec<u8>)> {
    (
        chunks(),
        prop::collection::vec(
            (
                name(),
                any::<u32>(),
                error(),
                message(),
                any::<u64>(),
                any::<u64>(),
            ),
            5,
        ),
    )
        .prop_map(|(chunks, meta)| {
            let (payload, ranges) = lay_out(&chunks);
            let partitions = ranges
                .iter()
                .zip(meta)
                .map(
                    |(
                        &(payload_offset, payload_len),
                        (topic, partition, error, message, high_watermark, log_start_offset),
                    )| FetchPartitionResult {
                        topic,
                        partition,
                        error,
                        message,
                        high_watermark,
                        log_start_offset,
                        payload_offset,
                        payload_len,
                        last_stable_offset: high_watermark,
                        aborted: vec![AbortedTransaction {
                            producer_id: partition as i64,
                            first_offset: log_start_offset,
                        }],
                        fetch_offset: high_watermark ^ log_start_offset,
                    },
                )
                .collect();
            (FetchResponse { partitions }, payload)
        })
}

pub fn list_offsets_response() -> impl Strategy<Value = ListOffsetsResponse> {
    prop::collection::vec(
        (
            name(),
            any::<u32>(),
            error(),
            prop::option::of(any::<u64>()),
            prop::option::of(any::<i64>()),
        )
            .prop_map(
                |(topic, partition, error, offset, timestamp)| ListOffsetsResult {
                    topic,
                    partition,
                    error,
                    offset,
                    timestamp,
                },
            ),
        0..5,
    )
    .prop_map(|partitions| ListOffsetsResponse { partitions })
}

pub fn topic_partitions() -> impl Strategy<Value = Vec<TopicPartitions>> {
    prop::collection::vec(
        (name(), prop::collection::vec(any::<u32>(), 0..5))
            .prop_map(|(topic, partitions)| TopicPartitions { topic, partitions }),
        0..4,
    )
}

pub fn join_group_request() -> impl Strategy<Value = JoinGroupRequest> {
    (
        name(),
        name(),
        name(),
        prop::collection::vec(name(), 0..4),
        name(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(
            |(group, member_id, client_id, topics, assignor, session, poll)| JoinGroupRequest {
                group,
                member_id,
                client_id,
                topics,
                assignor,
                session_timeout_ms: session,
                max_poll_interval_ms: poll,
            },
        )
}

pub fn heartbeat_request() -> impl Strategy<Value = HeartbeatRequest> {
    (
        name(),
        name(),
        any::<i32>(),
        topic_partitions(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(
            |(group, member_id, generation, owned, since_poll_ms, wait_ms)| HeartbeatRequest {
                group,
                member_id,
                generation,
                owned,
                since_poll_ms,
                wait_ms,
            },
        )
}

pub fn group_assignment() -> impl Strategy<Value = GroupAssignment> {
    (
        error(),
        message(),
        name(),
        any::<i32>(),
        name(),
        topic_partitions(),
        any::<u32>(),
    )
        .prop_map(
            |(error, message, member_id, generation, assignor, assignment, interval)| {
                GroupAssignment {
                    error,
                    message,
                    member_id,
                    generation,
                    assignor,
                    assignment,
                    heartbeat_interval_ms: interval,
                }
            },
        )
}

pub fn offset_commit_request() -> impl Strategy<Value = OffsetCommitRequest> {
    (
        name(),
        name(),
        any::<i32>(),
        prop::collection::vec(
            (name(), any::<u32>(), any::<u64>(), message()).prop_map(
                |(topic, partition, offset, metadata)| CommitOffset {
                    topic,
                    partition,
                    offset,
                    metadata,
                },
            ),
            0..5,
        ),
    )
        .prop_map(
            |(group, member_id, generation, offsets)| OffsetCommitRequest {
                group,
                member_id,
                generation,
                offsets,
            },
        )
}

pub fn committed_offsets() -> impl Strategy<Value = Vec<CommittedOffset>> {
    prop::collection::vec(
        (name(), any::<u32>(), any::<u64>(), message(), any::<i64>()).prop_map(
            |(topic, partition, offset, metadata, commit_timestamp)| CommittedOffset {
                topic,
                partition,
                offset,
                metadata,
                commit_timestamp,
            },
        ),
        0..5,
    )
}

pub fn describe_group_response() -> impl Strategy<Value = DescribeGroupResponse> {
    let member = (
        (name(), name(), prop::option::of(name()), any::<i32>()),
        prop::collection::vec(name(), 0..3),
        topic_partitions(),
        topic_partitions(),
        topic_partitions(),
    )
        .prop_map(
            |(
                (member_id, client_id, instance_id, member_epoch),
                topics,
                assignment,
                owned,
                revoking,
            )| {
                MemberDescription {
                    member_id,
                    client_id,
                    instance_id,
                    member_epoch,
                    topics,
                    assignment,
                    owned,
                    revoking,
                }
            },
        );
    (
        (error(), message(), name(), name(), name()),
        (any::<i32>(), any::<i32>(), name(), any::<u32>()),
        prop::collection::vec(member, 0..4),
        committed_offsets(),
    )
        .prop_map(
            |(
                (error, message, group, kind, state),
                (generation, assignment_epoch, assignor, core),
                members,
                offsets,
            )| {
                DescribeGroupResponse {
                    error,
                    message,
                    group,
                    kind,
                    state,
                    generation,
                    assignment_epoch,
                    assignor,
                    coordinator_core: core,
                    members,
                    offsets,
                }
            },
        )
}

pub fn error_body() -> impl Strategy<Value = ErrorBody> {
    ".{0,40}".prop_map(|message| ErrorBody { message })
}

// --- decoding everything ----------------------------------------------------------

/// Decodes `body` as every message type; results are ignored.
pub fn decode_as_every_type(body: &[u8]) {
    std::hint::black_box(decode_body::<ErrorBody>(body).ok());
    std::hint::black_box(decode_body::<ApiVersionsRequest>(body).ok());
    std::hint::black_box(decode_body::<ApiVersionsResponse>(body).ok());
    std::hint::black_box(decode_body::<MetadataRequest>(body).ok());
    std::hint::black_box(decode_body::<MetadataResponse>(body).ok());
    std::hint::black_box(decode_body::<CreateTopicsRequest>(body).ok());
    std::hint::black_box(decode_body::<CreateTopicsResponse>(body).ok());
    std::hint::black_box(decode_body::<DeleteTopicsRequest>(body).ok());
    std::hint::black_box(decode_body::<DeleteTopicsResponse>(body).ok());
    std::hint::black_box(decode_body::<DescribeConfigsRequest>(body).ok());
    std::hint::black_box(decode_body::<DescribeConfigsResponse>(body).ok());
    std::hint::black_box(decode_body::<AlterConfigsRequest>(body).ok());
    std::hint::black_box(decode_body::<AlterConfigsResponse>(body).ok());
    std::hint::black_box(decode_body::<CreatePartitionsRequest>(body).ok());
    std::hint::black_box(decode_body::<CreatePartitionsResponse>(body).ok());
    std::hint::black_box(decode_body::<ProduceRequest>(body).ok());
    std::hint::black_box(decode_body::<ProduceResponse>(body).ok());
    std::hint::black_box(decode_body::<FetchRequest>(body).ok());
    std::hint::black_box(decode_body::<FetchResponse>(body).ok());
    std::hint::black_box(decode_body::<ListOffsetsRequest>(body).ok());
    std::hint::black_box(decode_body::<ListOffsetsResponse>(body).ok());
    std::hint::black_box(decode_body::<JoinGroupRequest>(body).ok());
    std::hint::black_box(decode_body::<HeartbeatRequest>(body).ok());
    std::hint::black_box(decode_body::<GroupAssignment>(body).ok());
    std::hint::black_box(decode_body::<OffsetCommitRequest>(body).ok());
    std::hint::black_box(decode_body::<OffsetCommitResponse>(body).ok());
    std::hint::black_box(decode_body::<OffsetFetchResponse>(body).ok());
    std::hint::black_box(decode_body::<DescribeGroupResponse>(body).ok());
    std::hint::black_box(decode_body::<ListGroupsResponse>(body).ok());
}

/// Runs every decoder over `buf` (as a server and as a client would),
/// following payload ranges; results are ignored. Must never panic.
pub fn exercise(buf: &[u8]) {
    let _ = peek_frame_len(buf, FRAME_BYTES_MAX_DEFAULT);
    let _ = peek_frame_len(buf, 64);
    if let Ok((header, body, payload)) = decode_request(buf) {
        let _ = header.check_supported();
        if let Ok(AnyRequest::Produce(p)) = AnyRequest::decode(&header, body) {
            for part in &p.partitions {
                let _ = payload_slice(payload, part.payload_offset, part.payload_len);
            }
        }
        decode_as_every_type(body);
    }
    if let Ok((header, body, payload)) = decode_response(buf) {
        for api in ApiKey::ALL {
            if let Ok(AnyResponse::Fetch(f)) = AnyResponse::decode(api, &header, body) {
                for part in &f.partitions {
                    let _ = payload_slice(payload, part.payload_offset, part.payload_len);
                }
            }
        }
        decode_as_every_type(body);
    }
    // The raw bytes as a body, at both alignments.
    decode_as_every_type(buf);
    if buf.len() > 1 {
        decode_as_every_type(&buf[1..]);
    }
}
