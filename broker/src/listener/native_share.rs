//! Share groups on the native protocol (APIs 40–42): the same service as
//! the Kafka listener's ([`crate::share::service`]) — a heartbeat on the
//! group's coordinator core, fetches and acknowledgements on the core
//! that owns each partition — with batches answered as stored, in the
//! frame's payload (no copy).

use std::rc::Rc;

use weir_proto::error_code::ErrorCode;
use weir_proto::frame::{self, ResponseHeader};
use weir_proto::messages::{
    AcquiredRange, ShareAckBatch, ShareAcknowledgeRequest, ShareFetchRequest, ShareFetchResponse,
    ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, SharePartitionRequest,
    SharePartitionResult, TopicPartitions,
};
use weir_proto::messages::{AlterShareOffsetsRequest, AlterShareOffsetsResponse, ShareStartResult};
use weir_share::group::{Heartbeat, ShareGroupError};
use weir_share::partition::{AckBatch, AckType, AcquireMode, ShareError};

use super::connection::Answer;
use crate::shard::Core;
use crate::share::service::{PartRequest, ShareRefusal, ShareRequest};

/// Records acquired per fetch when the request says 0.
const MAX_RECORDS_DEFAULT: u32 = 500;
/// Most bytes a share fetch reads per partition.
const MAX_BYTES_MAX: u32 = 64 << 20;

fn refusal_code(e: &ShareRefusal) -> ErrorCode {
    match e {
        ShareRefusal::NotCoordinator(_) => ErrorCode::NotCoordinator,
        ShareRefusal::Group(ShareGroupError::UnknownMember(_)) => ErrorCode::UnknownMemberId,
        ShareRefusal::Group(ShareGroupError::FencedMemberEpoch(_)) => ErrorCode::FencedMemberEpoch,
        ShareRefusal::Group(ShareGroupError::InvalidRequest(_))
        | ShareRefusal::InvalidRequest(_) => ErrorCode::InvalidRequest,
        ShareRefusal::Group(ShareGroupError::GroupMaxSize(_)) => ErrorCode::GroupMaxSizeReached,
        ShareRefusal::InconsistentGroupProtocol(_) => ErrorCode::InconsistentGroupProtocol,
        ShareRefusal::SessionNotFound(_) => ErrorCode::ShareSessionNotFound,
        ShareRefusal::InvalidSessionEpoch(_) => ErrorCode::InvalidShareSessionEpoch,
        ShareRefusal::SessionLimitReached(_) => ErrorCode::ShareSessionLimitReached,
    }
}

fn ack_code(e: &ShareError) -> ErrorCode {
    match e {
        ShareError::InvalidRecordState(_) => ErrorCode::InvalidRecordState,
        ShareError::InvalidRequest(_) => ErrorCode::InvalidRequest,
    }
}

/// ShareGroupHeartbeat, on the group's coordinator core.
pub fn heartbeat(core: &Core, r: ShareGroupHeartbeatRequest) -> ShareGroupHeartbeatResponse {
    let hb = Heartbeat {
        member_id: r.member_id,
        member_epoch: r.member_epoch,
        subscribed: r.topics,
        rack: None,
    };
    match crate::share::service::heartbeat(core, &r.group, &hb) {
        Ok(a) => ShareGroupHeartbeatResponse {
            error: 0,
            message: None,
            member_epoch: a.member_epoch,
            heartbeat_interval_ms: a.heartbeat_interval_ms.clamp(0, i64::from(u32::MAX)) as u32,
            assignment: a.assignment.map(|tps| TopicPartitions::group(tps.iter())),
        },
        Err(e) => ShareGroupHeartbeatResponse {
            error: refusal_code(&e).as_u16(),
            message: Some(e.to_string()),
            ..Default::default()
        },
    }
}

/// The acknowledgements of one partition, their types checked.
fn acks_of(batches: &[ShareAckBatch]) -> Result<Vec<AckBatch>, ShareError> {
    batches
        .iter()
        .map(|b| {
            let types = b
                .types
                .iter()
                .map(|t| {
                    AckType::from_byte(*t)
                        .ok_or_else(|| ShareError::InvalidRequest(format!("acknowledge type {t}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(AckBatch {
                first: b.first,
                last: b.last,
                types,
            })
        })
        .collect()
}

/// The service's request, and the partitions whose acknowledgements are
/// malformed (answered at once, nothing of them applied).
fn request_of(
    group: String,
    member: String,
    epoch: i32,
    partitions: Vec<SharePartitionRequest>,
) -> (ShareRequest, Vec<SharePartitionResult>) {
    let mut early = Vec::new();
    let mut parts = Vec::new();
    for p in partitions {
        match acks_of(&p.acks) {
            Ok(acks) => parts.push(PartRequest {
                topic: p.topic,
                partition: p.partition,
                acks,
            }),
            Err(e) => early.push(SharePartitionResult {
                topic: p.topic,
                partition: p.partition,
                error: 0,
                message: None,
                ack_error: ack_code(&e).as_u16(),
                ack_message: Some(e.to_string()),
                acquired: Vec::new(),
                payload_offset: 0,
                payload_len: 0,
            }),
        }
    }
    (
        ShareRequest::acknowledging(group, member, epoch, parts),
        early,
    )
}

/// ShareFetch on this core.
pub async fn fetch(core: &Rc<Core>, corr: u32, r: ShareFetchRequest) -> Answer {
    let Some(acquire_mode) = AcquireMode::from_byte(r.acquire_mode) else {
        // Refused before anything, its acknowledgements included, applies.
        let e = ShareRefusal::InvalidRequest(format!(
            "acquire mode {} is neither 0 (batch_optimized) nor 1 (record_limit)",
            r.acquire_mode
        ));
        return refused(core, corr, &e);
    };
    let (req, early) = request_of(r.group, r.member_id, r.session_epoch, r.partitions);
    let req = ShareRequest {
        forgotten: TopicPartitions::pairs(&r.forgotten).collect(),
        acquire_mode,
        max_records: if r.max_records > 0 {
            r.max_records
        } else {
            MAX_RECORDS_DEFAULT
        } as usize,
        max_bytes: u64::from(r.max_bytes.clamp(1, MAX_BYTES_MAX)),
        max_wait_ms: r.max_wait_ms,
        acks_later: r.acks_later,
        ..req
    };
    serve(core, corr, req, early).await
}

/// ShareAcknowledge on this core.
pub async fn acknowledge(core: &Rc<Core>, corr: u32, r: ShareAcknowledgeRequest) -> Answer {
    let (req, early) = request_of(r.group, r.member_id, r.session_epoch, r.partitions);
    serve(core, corr, req, early).await
}

/// The group's record lock duration, as answered.
fn lock_timeout_ms(core: &Core) -> u32 {
    core.shared
        .config
        .share
        .lock_ms
        .clamp(0, i64::from(u32::MAX)) as u32
}

/// A request refused whole.
fn refused(core: &Core, corr: u32, e: &ShareRefusal) -> Answer {
    let body = ShareFetchResponse {
        error: refusal_code(e).as_u16(),
        message: Some(e.to_string()),
        lock_timeout_ms: lock_timeout_ms(core),
        partitions: Vec::new(),
    };
    answer(corr, &body, Vec::new())
}

async fn serve(
    core: &Rc<Core>,
    corr: u32,
    req: ShareRequest,
    mut partitions: Vec<SharePartitionResult>,
) -> Answer {
    let lock_timeout_ms = lock_timeout_ms(core);
    let answers = match crate::share::service::fetch(core, req).await {
        Ok(a) => a,
        Err(e) => return refused(core, corr, &e),
    };
    let mut pieces = Vec::new();
    let mut at: u64 = 0;
    for a in answers {
        let start = at;
        for b in a.batches {
            at += b.len() as u64;
            pieces.push(b);
        }
        let (error, message) = match &a.error {
            Some(e) => {
                let (c, m) = e.wire();
                (c, Some(m))
            }
            None => (0, None),
        };
        let (ack_error, ack_message) = match (&a.ack_error, &a.store_error) {
            (Some(e), _) => (ack_code(e).as_u16(), Some(e.to_string())),
            (None, Some(e)) => {
                let (c, m) = e.wire();
                (c, Some(m))
            }
            (None, None) => (0, None),
        };
        partitions.push(SharePartitionResult {
            topic: a.topic,
            partition: a.partition,
            error,
            message,
            ack_error,
            ack_message,
            acquired: a
                .acquired
                .iter()
                .map(|x| AcquiredRange {
                    first: x.first,
                    last: x.last,
                    delivery_count: x.delivery_count,
                })
                .collect(),
            payload_offset: start as u32,
            payload_len: (at - start) as u32,
        });
    }
    let body = ShareFetchResponse {
        error: 0,
        message: None,
        lock_timeout_ms,
        partitions,
    };
    answer(corr, &body, pieces)
}

fn answer<T: weir_proto::frame::Message>(corr: u32, body: &T, pieces: Vec<bytes::Bytes>) -> Answer {
    let len: usize = pieces.iter().map(|p| p.len()).sum();
    match frame::encode_response(&ResponseHeader::ok(corr), body, len) {
        Ok(head) => Answer {
            head,
            payload: weir_proto::segments::segments(&pieces),
            close: false,
        },
        Err(e) => Answer::error(corr, e.error_code(), &e.to_string(), false),
    }
}

/// AlterShareOffsets on this core: the group (asked of its coordinator)
/// must have no members; the starts stored before are read, then (unless
/// `validate_only`) each partition's share partition is reset at the core
/// owning it.
pub async fn alter_offsets(core: &Rc<Core>, corr: u32, r: AlterShareOffsetsRequest) -> Answer {
    let whole = |error: u16, message: String| AlterShareOffsetsResponse {
        error,
        message: Some(message),
        partitions: Vec::new(),
    };
    let limit = crate::server::limits::REQUEST_PARTITIONS_MAX;
    let body = if r.partitions.len() > limit {
        whole(
            ErrorCode::InvalidRequest.as_u16(),
            format!("{} partitions named; at most {limit}", r.partitions.len()),
        )
    } else {
        match crate::share::service::share_group_members(core, &r.group).await {
            Err((code, why)) => whole(code, why),
            Ok(n) if n > 0 && !r.validate_only => whole(
                ErrorCode::GroupNotEmpty.as_u16(),
                format!(
                    "share group `{}` has {n} members: stop them before resetting it",
                    r.group
                ),
            ),
            Ok(_) => {
                let wanted: Vec<(String, u32)> = r
                    .partitions
                    .iter()
                    .map(|p| (r.topic.clone(), p.partition))
                    .collect();
                let old = crate::share::service::stored_starts(core, &r.group, &wanted).await;
                let mut partitions = Vec::with_capacity(old.len());
                for (p, old) in r.partitions.iter().zip(old) {
                    let outcome = match old {
                        Err(e) => Err(e),
                        Ok(old) if r.validate_only => Ok(old),
                        Ok(old) => crate::share::service::reset(
                            core,
                            &r.group,
                            (&r.topic, p.partition),
                            p.start,
                        )
                        .await
                        .map(|_| old),
                    };
                    partitions.push(match outcome {
                        Ok(old) => ShareStartResult {
                            partition: p.partition,
                            error: 0,
                            message: None,
                            old_start: old.map(|(start, _)| start),
                        },
                        Err(e) => ShareStartResult {
                            partition: p.partition,
                            error: e.code().as_u16(),
                            message: Some(e.to_string()),
                            old_start: None,
                        },
                    });
                }
                AlterShareOffsetsResponse {
                    error: 0,
                    message: None,
                    partitions,
                }
            }
        }
    };
    answer(corr, &body, Vec::new())
}
