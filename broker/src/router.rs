//! Request dispatch: decode a request, run its parts on the cores that own
//! them (locally, or through the cross-core mesh), assemble the answer on
//! the connection's core.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use bytes::Bytes;
use weir_proto::api::ApiKey;
use weir_proto::batch::BatchHeader;
use weir_proto::error_code::ErrorCode;
use weir_proto::frame::{self, Message, ResponseHeader};
use weir_proto::messages::*;

use crate::connection::{bad_body, Answer};
use crate::core::{
    AdminChange, Core, CoreMsg, FetchOk, OffsetsOk, PartitionError, ProduceOk, ReplyTo,
};
use crate::errors as code;
use crate::group_coordinator::{self, GroupRequest, GroupResponse};
use crate::group_records::OFFSETS_TOPIC;
use crate::handlers;
use crate::registry::{self, TopicError, TopicSpec};

fn ok<T: Message>(correlation_id: u32, body: &T) -> Answer {
    match frame::encode_response(&ResponseHeader::ok(correlation_id), body, 0) {
        Ok(head) => Answer::plain(head),
        Err(e) => Answer::error(correlation_id, e.error_code(), &e.to_string(), false),
    }
}

fn topic_error_code(e: &TopicError) -> u16 {
    match e {
        TopicError::InvalidName(_) => code::INVALID_TOPIC,
        TopicError::Exists(_) => code::TOPIC_ALREADY_EXISTS,
        TopicError::Unknown(_) => code::UNKNOWN_TOPIC_OR_PARTITION,
        TopicError::Partitions { .. } => code::INVALID_PARTITIONS,
        TopicError::Config(_) => code::INVALID_CONFIG,
    }
}

fn topic_result(name: &str, r: Result<(), TopicError>) -> TopicResult {
    match r {
        Ok(()) => TopicResult {
            name: name.into(),
            error: code::NONE,
            message: None,
        },
        Err(e) => TopicResult {
            name: name.into(),
            error: topic_error_code(&e),
            message: Some(e.to_string()),
        },
    }
}

/// What kind of listener a connection came through.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ctx {
    /// A core's own port: produce and fetch requests for partitions of
    /// other cores get [`code::NOT_OWNER`] (so shard-aware clients learn
    /// of stale metadata) instead of being forwarded.
    pub owner_only: bool,
}

/// A request in progress.
pub enum Pending {
    /// Answered.
    Ready(Answer),
    /// Still running (a produce waiting for acknowledgements, a fetch).
    Later(glommio::Task<Answer>),
}

impl Pending {
    /// The answer, once there is one.
    pub async fn answer(self) -> Answer {
        match self {
            Pending::Ready(a) => a,
            Pending::Later(t) => t.await,
        }
    }
}

/// Decodes one request frame and starts serving it. Returns once the
/// request no longer needs to run before the connection's next one: a
/// produce once its batches are appended (its acknowledgements are awaited
/// in the returned task), a fetch at once (it runs in the task), anything
/// else once answered.
pub async fn dispatch(core: &Rc<Core>, request: Bytes, ctx: Ctx) -> Pending {
    let (h, body, payload) = match frame::decode_request(&request) {
        Ok(x) => x,
        Err(e) => {
            let corr = crate::connection::correlation_id_of(&request);
            return Pending::Ready(Answer::error(corr, e.error_code(), &e.to_string(), true));
        }
    };
    let corr = h.correlation_id;
    let api = match h.check_supported() {
        Ok(api) => api,
        Err(e) => return Pending::Ready(bad_body(corr, &e)),
    };
    let payload = request.slice_ref(payload);
    match api {
        ApiKey::Produce => match frame::decode_body::<ProduceRequest>(body) {
            Ok(req) => {
                let rest = produce(core, corr, req, payload, ctx).await;
                Pending::Later(glommio::spawn_local(rest))
            }
            Err(e) => Pending::Ready(bad_body(corr, &e)),
        },
        ApiKey::Fetch => match frame::decode_body::<FetchRequest>(body) {
            Ok(req) => {
                let core = core.clone();
                Pending::Later(glommio::spawn_local(async move {
                    fetch(&core, corr, req, ctx).await
                }))
            }
            Err(e) => Pending::Ready(bad_body(corr, &e)),
        },
        ApiKey::JoinGroup
        | ApiKey::Heartbeat
        | ApiKey::LeaveGroup
        | ApiKey::OffsetCommit
        | ApiKey::OffsetFetch
        | ApiKey::ListGroups
        | ApiKey::DescribeGroup
        | ApiKey::DeleteGroup => match group_request(api, body) {
            // A task: a heartbeat may be held by the coordinator, and the
            // connection reads on meanwhile.
            Ok(req) => {
                let core = core.clone();
                Pending::Later(glommio::spawn_local(async move {
                    group_answer(corr, group_coordinator::serve(&core, req).await)
                }))
            }
            Err(e) => Pending::Ready(bad_body(corr, &e)),
        },
        _ => Pending::Ready(serve_other(core, corr, api, body).await),
    }
}

/// Decodes the body of a group API request.
fn group_request(api: ApiKey, body: &[u8]) -> Result<GroupRequest, frame::FrameError> {
    Ok(match api {
        ApiKey::JoinGroup => GroupRequest::Join(frame::decode_body(body)?),
        ApiKey::Heartbeat => GroupRequest::Heartbeat(frame::decode_body(body)?),
        ApiKey::LeaveGroup => GroupRequest::Leave(frame::decode_body(body)?),
        ApiKey::OffsetCommit => GroupRequest::Commit(frame::decode_body(body)?),
        ApiKey::OffsetFetch => GroupRequest::Fetch(frame::decode_body(body)?),
        ApiKey::DescribeGroup => GroupRequest::Describe(frame::decode_body(body)?),
        ApiKey::DeleteGroup => GroupRequest::Delete(frame::decode_body(body)?),
        _ => {
            let _: ListGroupsRequest = frame::decode_body(body)?;
            GroupRequest::List
        }
    })
}

fn group_answer(corr: u32, r: GroupResponse) -> Answer {
    match r {
        GroupResponse::Assignment(a) => ok(corr, &a),
        GroupResponse::Result(a) => ok(corr, &a),
        GroupResponse::Commit(a) => ok(corr, &a),
        GroupResponse::Fetch(a) => ok(corr, &a),
        GroupResponse::Describe(a) => ok(corr, &a),
        GroupResponse::List(groups) => ok(corr, &ListGroupsResponse { groups }),
    }
}

/// Answers a request other than produce and fetch.
async fn serve_other(core: &Rc<Core>, corr: u32, api: ApiKey, body: &[u8]) -> Answer {
    macro_rules! body {
        ($t:ty) => {
            match frame::decode_body::<$t>(body) {
                Ok(b) => b,
                Err(e) => return bad_body(corr, &e),
            }
        };
    }
    match api {
        ApiKey::ApiVersions => {
            let _ = body!(ApiVersionsRequest);
            ok(corr, &ApiVersionsResponse::supported())
        }
        ApiKey::Metadata => {
            let req = body!(MetadataRequest);
            ok(corr, &metadata(core, req).await)
        }
        ApiKey::CreateTopics => {
            let req = body!(CreateTopicsRequest);
            let mut topics = Vec::new();
            for t in req.topics {
                let spec = TopicSpec {
                    partitions: t.partitions,
                    configs: t.configs.into_iter().collect(),
                };
                let r = admin(core, AdminChange::Create(t.name.clone(), spec)).await;
                topics.push(topic_result(&t.name, r));
            }
            ok(corr, &CreateTopicsResponse { topics })
        }
        ApiKey::DeleteTopics => {
            let req = body!(DeleteTopicsRequest);
            let mut topics = Vec::new();
            for name in req.names {
                let r = client_admin(core, AdminChange::Delete(name.clone())).await;
                topics.push(topic_result(&name, r));
            }
            ok(corr, &DeleteTopicsResponse { topics })
        }
        ApiKey::AlterConfigs => {
            let req = body!(AlterConfigsRequest);
            let mut topics = Vec::new();
            for (name, set) in req.topics {
                let r = admin(core, AdminChange::Alter(name.clone(), set)).await;
                topics.push(topic_result(&name, r));
            }
            ok(corr, &AlterConfigsResponse { topics })
        }
        ApiKey::CreatePartitions => {
            let req = body!(CreatePartitionsRequest);
            let mut topics = Vec::new();
            for (name, total) in req.topics {
                let r = client_admin(core, AdminChange::AddPartitions(name.clone(), total)).await;
                topics.push(topic_result(&name, r));
            }
            ok(corr, &CreatePartitionsResponse { topics })
        }
        ApiKey::Compact => {
            let req = body!(CompactRequest);
            ok(corr, &compact(core, req).await)
        }
        ApiKey::DescribeConfigs => {
            let req = body!(DescribeConfigsRequest);
            ok(corr, &describe(core, req).await)
        }
        ApiKey::ListOffsets => {
            let req = body!(ListOffsetsRequest);
            ok(corr, &list_offsets(core, req).await)
        }
        ApiKey::InitProducerId => {
            let _ = body!(InitProducerIdRequest);
            ok(corr, &init_producer_id(core).await)
        }
        _ => Answer::error(
            corr,
            ErrorCode::UnsupportedApi,
            "API not served by this broker",
            false,
        ),
    }
}

/// Applies a topic change requested by a client: the internal topic
/// cannot be deleted or grown (its partition count maps groups to cores).
async fn client_admin(core: &Rc<Core>, change: AdminChange) -> Result<(), TopicError> {
    if let AdminChange::Delete(name) | AdminChange::AddPartitions(name, _) = &change {
        if name == OFFSETS_TOPIC {
            return Err(TopicError::Config(format!(
                "{OFFSETS_TOPIC} is internal: it cannot be deleted or get more partitions"
            )));
        }
    }
    admin(core, change).await
}

/// Applies a topic change through core 0.
async fn admin(core: &Rc<Core>, change: AdminChange) -> Result<(), TopicError> {
    if core.id == 0 {
        return handlers::apply_admin(core, change).await;
    }
    let (tx, rx) = core.expect_reply();
    core.send_to(0, CoreMsg::Admin { change, reply: tx })
        .await
        .map_err(|e| TopicError::Config(format!("{e:#}")))?;
    rx.await
        .unwrap_or_else(|| Err(TopicError::Config("core 0 dropped the request".into())))
}

/// Hands out a producer id through core 0.
async fn init_producer_id(core: &Rc<Core>) -> InitProducerIdResponse {
    let r = if core.id == 0 {
        handlers::init_producer_id_local(core)
    } else {
        let (tx, rx) = core.expect_reply();
        match core.send_to(0, CoreMsg::InitProducerId { reply: tx }).await {
            Ok(()) => rx.await.unwrap_or_else(|| Err(dropped(0))),
            Err(e) => Err(PartitionError {
                code: code::STORAGE_ERROR,
                message: format!("{e:#}"),
            }),
        }
    };
    match r {
        Ok(id) => InitProducerIdResponse {
            error: code::NONE,
            message: None,
            producer_id: id,
            producer_epoch: 0,
        },
        Err(e) => InitProducerIdResponse {
            error: e.code,
            message: Some(e.message),
            producer_id: -1,
            producer_epoch: -1,
        },
    }
}

/// Creates `topic` if auto-creation is on and it does not exist; whether it
/// exists afterwards.
async fn ensure_topic(core: &Rc<Core>, topic: &str) -> bool {
    if core.registry.borrow().get(topic).is_some() {
        return true;
    }
    if !core.shared.config.auto_create_topics {
        return false;
    }
    let spec = TopicSpec {
        partitions: core.shared.config.default_partitions,
        configs: BTreeMap::new(),
    };
    let r = admin(core, AdminChange::Create(topic.into(), spec)).await;
    r.is_ok() || matches!(r, Err(TopicError::Exists(_)))
}

async fn metadata(core: &Rc<Core>, req: MetadataRequest) -> MetadataResponse {
    let host = core.shared.config.listen.ip().to_string();
    let cores = (0..core.cores())
        .map(|c| CoreInfo {
            core: c as u32,
            host: host.clone(),
            port: core.shared.core_ports[c].load(std::sync::atomic::Ordering::Acquire),
        })
        .collect();
    let names: Vec<String> = match req.topics {
        Some(t) => t,
        None => visible_topics(core),
    };
    let mut topics = Vec::new();
    for name in names {
        ensure_topic(core, &name).await;
        let spec = core.registry.borrow().get(&name).cloned();
        topics.push(match spec {
            Some(spec) => TopicMetadata {
                name: name.clone(),
                error: code::NONE,
                partitions: (0..spec.partitions)
                    .map(|p| PartitionMetadata {
                        partition: p,
                        core: core.owner(&name, p) as u32,
                        error: code::NONE,
                    })
                    .collect(),
            },
            None => TopicMetadata {
                name,
                error: code::UNKNOWN_TOPIC_OR_PARTITION,
                partitions: Vec::new(),
            },
        });
    }
    MetadataResponse { cores, topics }
}

/// Every topic but the internal `__consumer_offsets` (listed only when
/// asked for by name).
fn visible_topics(core: &Core) -> Vec<String> {
    core.registry
        .borrow()
        .topics()
        .keys()
        .filter(|t| t.as_str() != OFFSETS_TOPIC)
        .cloned()
        .collect()
}

fn partition_exists(core: &Core, topic: &str, partition: u32) -> bool {
    core.registry
        .borrow()
        .get(topic)
        .is_some_and(|s| partition < s.partitions)
}

/// Runs a partition operation on its owner core.
async fn on_owner<T: 'static>(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    local: impl std::future::Future<Output = Result<T, PartitionError>>,
    remote: impl FnOnce(ReplyTo<Result<T, PartitionError>>) -> CoreMsg,
) -> Result<T, PartitionError> {
    if !partition_exists(core, topic, partition) {
        return Err(PartitionError::unknown(topic, partition));
    }
    let owner = core.owner(topic, partition);
    if owner == core.id {
        return local.await;
    }
    let (tx, rx) = core.expect_reply();
    core.send_to(owner, remote(tx))
        .await
        .map_err(|e| PartitionError {
            code: code::STORAGE_ERROR,
            message: format!("{e:#}"),
        })?;
    rx.await.unwrap_or_else(|| Err(dropped(owner)))
}

/// Waits for the acknowledgement of one appended batch.
type AckWait = Pin<Box<dyn Future<Output = Result<ProduceOk, PartitionError>>>>;

/// Appends every batch of one partition's payload, in order, on the owner
/// core; returns once they are queued, with the waits for their
/// acknowledgements. The first refused batch ends the partition's part.
async fn append_partition(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    data: Bytes,
    acks: i8,
    ctx: Ctx,
) -> Result<Vec<AckWait>, PartitionError> {
    if topic == OFFSETS_TOPIC {
        return Err(PartitionError {
            code: code::POLICY_VIOLATION,
            message: format!(
                "{OFFSETS_TOPIC} is internal: only the group coordinator writes it (commit offsets instead)"
            ),
        });
    }
    if !ensure_topic(core, topic).await || !partition_exists(core, topic, partition) {
        return Err(PartitionError::unknown(topic, partition));
    }
    let owner = core.owner(topic, partition);
    if ctx.owner_only && owner != core.id {
        return Err(not_owner(core, topic, partition, owner));
    }
    if data.is_empty() {
        return Err(PartitionError {
            code: code::CORRUPT_MESSAGE,
            message: "empty record set".into(),
        });
    }
    let mut waits: Vec<AckWait> = Vec::new();
    let mut at = 0usize;
    while at < data.len() {
        let h = BatchHeader::parse_framed(&data[at..]).map_err(|e| PartitionError {
            code: code::CORRUPT_MESSAGE,
            message: format!("record batch at byte {at} of the partition's payload: {e}"),
        })?;
        let batch = data.slice(at..at + h.total_len());
        at += h.total_len();
        if owner == core.id {
            let (log, info) = handlers::append_local(core, topic, partition, batch).await?;
            waits.push(Box::pin(handlers::ack_local(log, info, acks)));
            continue;
        }
        let (appended_tx, appended_rx) = core.expect_reply();
        let (reply_tx, reply_rx) = core.expect_reply();
        let msg = CoreMsg::Produce {
            topic: topic.to_string(),
            partition,
            batch,
            acks,
            appended: appended_tx,
            reply: reply_tx,
        };
        core.send_to(owner, msg).await.map_err(|e| PartitionError {
            code: code::STORAGE_ERROR,
            message: format!("{e:#}"),
        })?;
        appended_rx.await.unwrap_or_else(|| Err(dropped(owner)))?;
        waits.push(Box::pin(async move {
            reply_rx.await.unwrap_or_else(|| Err(dropped(owner)))
        }));
    }
    Ok(waits)
}

fn dropped(owner: usize) -> PartitionError {
    PartitionError {
        code: code::STORAGE_ERROR,
        message: format!("core {owner} dropped the request"),
    }
}

fn not_owner(core: &Core, topic: &str, partition: u32, owner: usize) -> PartitionError {
    let port = |c: usize| core.shared.core_ports[c].load(std::sync::atomic::Ordering::Acquire);
    PartitionError {
        code: code::NOT_OWNER,
        message: format!(
            "{topic}-{partition} is owned by core {owner} (port {}); this connection is on \
             core {}'s port {}: refresh metadata, or use the shared port",
            port(owner),
            core.id,
            port(core.id)
        ),
    }
}

fn produce_result(
    topic: String,
    partition: u32,
    r: Result<ProduceOk, PartitionError>,
) -> ProducePartitionResult {
    match r {
        Ok(ok) => ProducePartitionResult {
            topic,
            partition,
            error: code::NONE,
            message: None,
            base_offset: ok.base_offset,
            log_start_offset: ok.log_start_offset,
        },
        Err(e) => ProducePartitionResult {
            topic,
            partition,
            error: e.code,
            message: Some(e.message),
            base_offset: 0,
            log_start_offset: 0,
        },
    }
}

/// Appends a produce request's batches (every partition concurrently, the
/// batches of one partition in order) and returns once all are queued;
/// the returned future waits for their acknowledgements (bounded by
/// `timeout_ms`) and builds the answer. Appends of the requests of one
/// connection thus happen in request order while their acknowledgements
/// overlap.
async fn produce(
    core: &Rc<Core>,
    corr: u32,
    req: ProduceRequest,
    payload: Bytes,
    ctx: Ctx,
) -> impl Future<Output = Answer> + 'static {
    let acks = req.acks;
    // 0: no limit.
    let timeout = std::time::Duration::from_millis(match req.timeout_ms {
        0 => u64::from(u32::MAX),
        ms => u64::from(ms),
    });
    let tasks: Vec<_> = req
        .partitions
        .into_iter()
        .map(|p| {
            let core = core.clone();
            let data = frame::payload_slice(&payload, p.payload_offset, p.payload_len)
                .map(|s| payload.slice_ref(s));
            glommio::spawn_local(async move {
                let r = match data {
                    Ok(data) => {
                        append_partition(&core, &p.topic, p.partition, data, acks, ctx).await
                    }
                    Err(e) => Err(PartitionError {
                        code: code::INVALID_REQUEST,
                        message: e.to_string(),
                    }),
                };
                (p.topic, p.partition, r)
            })
        })
        .collect();
    let mut appended = Vec::with_capacity(tasks.len());
    for t in tasks {
        appended.push(t.await);
    }
    let deadline = std::time::Instant::now() + timeout;
    async move {
        let mut partitions = Vec::with_capacity(appended.len());
        for (topic, partition, r) in appended {
            let r = match r {
                Ok(waits) => {
                    // `timeout_ms` bounds the wait for the acknowledgements.
                    // As in Kafka, a timed-out batch may still be appended.
                    futures_lite::future::or(all_acked(waits), async {
                        let left = deadline.saturating_duration_since(std::time::Instant::now());
                        glommio::timer::sleep(left).await;
                        Err(PartitionError {
                            code: code::REQUEST_TIMED_OUT,
                            message: format!(
                                "not acknowledged within timeout_ms={}; the batch may still be appended",
                                timeout.as_millis()
                            ),
                        })
                    })
                    .await
                }
                Err(e) => Err(e),
            };
            partitions.push(produce_result(topic, partition, r));
        }
        ok(corr, &ProduceResponse { partitions })
    }
}

/// The first batch's acknowledgement, or the first failure.
async fn all_acked(waits: Vec<AckWait>) -> Result<ProduceOk, PartitionError> {
    let mut first = None;
    for w in waits {
        let r = w.await?;
        first.get_or_insert(r);
    }
    first.ok_or_else(|| PartitionError {
        code: code::CORRUPT_MESSAGE,
        message: "empty record set".into(),
    })
}

/// Fetches one partition on its owner core; with `wait_ms`, the owner waits
/// for data at `offset` if there is none yet.
async fn fetch_one(
    core: &Rc<Core>,
    p: &FetchPartition,
    max_bytes: u64,
    wait_ms: u32,
    ctx: Ctx,
) -> Result<FetchOk, PartitionError> {
    let (topic, partition, offset) = (p.topic.as_str(), p.partition, p.offset);
    if ctx.owner_only && partition_exists(core, topic, partition) {
        let owner = core.owner(topic, partition);
        if owner != core.id {
            return Err(not_owner(core, topic, partition, owner));
        }
    }
    on_owner(
        core,
        topic,
        partition,
        handlers::fetch_local(core, topic, partition, offset, max_bytes, wait_ms),
        |reply| CoreMsg::Fetch {
            topic: topic.to_string(),
            partition,
            offset,
            max_bytes,
            wait_ms,
            reply,
        },
    )
    .await
}

/// Fetches every partition of a request concurrently, without waiting.
async fn fetch_all(
    core: &Rc<Core>,
    req: &FetchRequest,
    ctx: Ctx,
) -> Vec<Result<FetchOk, PartitionError>> {
    let tasks: Vec<_> = req
        .partitions
        .iter()
        .map(|p| {
            let (core, p) = (core.clone(), p.clone());
            let max_bytes = p.max_bytes.min(req.max_bytes).max(1) as u64;
            glommio::spawn_local(async move { fetch_one(&core, &p, max_bytes, 0, ctx).await })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await);
    }
    out
}

async fn fetch(core: &Rc<Core>, corr: u32, req: FetchRequest, ctx: Ctx) -> Answer {
    let mut results = fetch_all(core, &req, ctx).await;
    let got: u64 = results
        .iter()
        .flatten()
        .flat_map(|f| f.batches.iter().map(|b| b.len() as u64))
        .sum();
    // A partition error (out of range, unknown, not owner) is answered at
    // once: waiting would not change it.
    let any_error = results.iter().any(|r| r.is_err());
    if req.max_wait_ms > 0 && req.min_bytes > 0 && got < req.min_bytes as u64 && !any_error {
        // Long poll: wait until any partition gets data (each owner waits on
        // its log), or the timeout; then read everything again.
        // A plain futures channel: the waiting tasks outlive this request
        // (each runs until its own wait ends), so they must be able to
        // signal a receiver that is gone.
        let (tx, mut rx) = futures_channel::mpsc::channel::<()>(1);
        for p in &req.partitions {
            let (core, p, mut tx) = (core.clone(), p.clone(), tx.clone());
            let wait = req.max_wait_ms;
            glommio::spawn_local(async move {
                match fetch_one(&core, &p, 1, wait, ctx).await {
                    Ok(f) if f.batches.is_empty() => {}
                    // Data, or an error (e.g. the log was truncated below
                    // the offset meanwhile): answer now.
                    _ => {
                        let _ = tx.try_send(());
                    }
                }
            })
            .detach();
        }
        drop(tx);
        let wait = std::time::Duration::from_millis(req.max_wait_ms as u64);
        futures_lite::future::or(
            async {
                use futures_lite::StreamExt;
                // Every waiting task ended without data: wait out the rest.
                if rx.next().await.is_none() {
                    std::future::pending::<()>().await;
                }
            },
            glommio::timer::sleep(wait),
        )
        .await;
        results = fetch_all(core, &req, ctx).await;
    }
    let tasks: Vec<_> = req.partitions.into_iter().zip(results).collect();
    let mut partitions = Vec::with_capacity(tasks.len());
    let mut pieces = Vec::new();
    let mut at: u64 = 0;
    for (p, r) in tasks {
        match r {
            Ok(f) => {
                let start = at;
                for b in f.batches {
                    // The response budget: always at least the first batch.
                    if at > 0 && at + b.len() as u64 > req.max_bytes as u64 {
                        break;
                    }
                    at += b.len() as u64;
                    pieces.push(b);
                }
                partitions.push(FetchPartitionResult {
                    topic: p.topic,
                    partition: p.partition,
                    error: code::NONE,
                    message: None,
                    high_watermark: f.high_watermark,
                    log_start_offset: f.log_start_offset,
                    payload_offset: start as u32,
                    payload_len: (at - start) as u32,
                });
            }
            Err(e) => partitions.push(FetchPartitionResult {
                topic: p.topic,
                partition: p.partition,
                error: e.code,
                message: Some(e.message),
                high_watermark: 0,
                log_start_offset: 0,
                payload_offset: at as u32,
                payload_len: 0,
            }),
        }
    }
    let body = FetchResponse { partitions };
    match frame::encode_response(&ResponseHeader::ok(corr), &body, at as usize) {
        Ok(head) => Answer {
            head,
            payload: pieces,
            close: false,
        },
        Err(e) => Answer::error(corr, e.error_code(), &e.to_string(), false),
    }
}

async fn offsets(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
    ts: Option<i64>,
) -> Result<OffsetsOk, PartitionError> {
    on_owner(
        core,
        topic,
        partition,
        handlers::offsets_local(core, topic, partition, ts),
        |reply| CoreMsg::Offsets {
            topic: topic.to_string(),
            partition,
            timestamp: ts,
            reply,
        },
    )
    .await
}

async fn list_offsets(core: &Rc<Core>, req: ListOffsetsRequest) -> ListOffsetsResponse {
    let mut partitions = Vec::new();
    for p in req.partitions {
        let ts = match p.spec {
            OffsetSpec::Timestamp(t) => Some(t),
            _ => None,
        };
        let r = offsets(core, &p.topic, p.partition, ts).await;
        partitions.push(match r {
            Ok(o) => ListOffsetsResult {
                topic: p.topic,
                partition: p.partition,
                error: code::NONE,
                offset: match p.spec {
                    OffsetSpec::Earliest => Some(o.log_start_offset),
                    OffsetSpec::Latest => Some(o.high_watermark),
                    OffsetSpec::Timestamp(_) => o.for_timestamp,
                },
                timestamp: ts,
            },
            Err(e) => ListOffsetsResult {
                topic: p.topic,
                partition: p.partition,
                error: e.code,
                offset: None,
                timestamp: ts,
            },
        });
    }
    ListOffsetsResponse { partitions }
}

/// `Compact`: every partition of a compacted topic, one after the other
/// (each on its owner core).
async fn compact(core: &Rc<Core>, req: CompactRequest) -> CompactResponse {
    let spec = core.registry.borrow().get(&req.topic).cloned();
    let Some(spec) = spec else {
        return CompactResponse {
            error: code::UNKNOWN_TOPIC_OR_PARTITION,
            message: Some(format!("unknown topic `{}`", req.topic)),
            partitions: Vec::new(),
        };
    };
    let policy = registry::log_config(&spec.configs)
        .map(|c| c.cleanup_policy)
        .unwrap_or_default();
    if !policy.compacts() {
        return CompactResponse {
            error: code::INVALID_CONFIG,
            message: Some(format!(
                "topic `{}` is not compacted (cleanup.policy={}); set cleanup.policy=compact first",
                req.topic,
                policy.as_str()
            )),
            partitions: Vec::new(),
        };
    }
    let mut partitions = Vec::new();
    for p in 0..spec.partitions {
        let (topic, run) = (req.topic.as_str(), req.run);
        let r = on_owner(
            core,
            topic,
            p,
            handlers::compact_local(core, topic, p, run),
            |reply| CoreMsg::Compact {
                topic: topic.to_string(),
                partition: p,
                run,
                reply,
            },
        )
        .await;
        partitions.push(r.unwrap_or_else(|e| CompactPartitionResult {
            partition: p,
            error: e.code,
            message: Some(e.message),
            dirty_ratio_ppm: 0,
            pass: None,
        }));
    }
    CompactResponse {
        error: code::NONE,
        message: None,
        partitions,
    }
}

async fn describe(core: &Rc<Core>, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let names: Vec<String> = if req.topics.is_empty() {
        visible_topics(core)
    } else {
        req.topics
    };
    let mut topics = Vec::new();
    for name in names {
        let spec = core.registry.borrow().get(&name).cloned();
        let Some(spec) = spec else {
            topics.push(TopicConfigs {
                name,
                error: code::UNKNOWN_TOPIC_OR_PARTITION,
                configs: Vec::new(),
                partitions: Vec::new(),
            });
            continue;
        };
        let mut partitions = Vec::new();
        for p in 0..spec.partitions {
            let o = offsets(core, &name, p, None).await;
            let o = o.unwrap_or(OffsetsOk {
                log_start_offset: 0,
                high_watermark: 0,
                size_bytes: 0,
                for_timestamp: None,
            });
            partitions.push(PartitionDescription {
                partition: p,
                core: core.owner(&name, p) as u32,
                log_start_offset: o.log_start_offset,
                log_end_offset: o.high_watermark,
                size_bytes: o.size_bytes,
            });
        }
        topics.push(TopicConfigs {
            configs: registry::effective_configs(&spec.configs),
            name,
            error: code::NONE,
            partitions,
        });
    }
    DescribeConfigsResponse { topics }
}
