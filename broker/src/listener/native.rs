//! The native protocol listener: the codec ([`Native`]: frame length,
//! decode, error answers) and the dispatch of each request onto
//! [`crate::service`], with the answer encoded back in the native format.
//! Wire types (rkyv bodies, `u16` error codes) live here and in
//! `weir_proto`, nowhere below.

use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use weir_proto::api::ApiKey;
use weir_proto::error_code::ErrorCode;
use weir_proto::frame::{self, FrameError, Message, ResponseHeader};
use weir_proto::messages::*;

use super::connection::{Answer, Pending, Protocol};
use crate::groups::coordinator::{self, GroupRequest, GroupResponse};
use crate::metadata::Change;
use crate::metadata::{ConfigOp, TopicError, TopicSpec};
use crate::server::limits::REQUEST_PARTITIONS_MAX;
use crate::server::tls::SecurityProtocol;
use crate::service::acl::{self, Op, Resource};
use crate::service::auth::{Gate, Session, Step};
use crate::service::fetch::{FetchParams, FetchPart};
use crate::service::offsets::OffsetQuery;
use crate::service::produce::ProducePart;
use crate::service::{self, admin, topic_code, users, BrokerError, Ctx, FetchOk};
use crate::shard::Core;

/// The native protocol's codec.
#[derive(Debug, Clone, Copy)]
pub struct Native;

impl Protocol for Native {
    fn frame_len(&self, buf: &[u8], max: usize) -> Result<Option<usize>, (u32, Answer)> {
        frame::peek_frame_len(buf, max).map_err(|e| {
            let corr = correlation_id_of(buf);
            (
                corr,
                Answer::error(corr, e.error_code(), &e.to_string(), true),
            )
        })
    }

    fn api_of(&self, frame: &[u8]) -> Option<ApiKey> {
        frame
            .get(4..6)
            .and_then(|b| ApiKey::from_u16(u16::from_be_bytes([b[0], b[1]])))
    }

    fn is_error(&self, answer: &Answer) -> bool {
        answer.head.get(8..10).is_some_and(|e| e != [0, 0])
    }

    async fn dispatch(
        &self,
        core: &Rc<Core>,
        request: Bytes,
        ctx: Ctx,
        session: &Rc<crate::service::auth::Session>,
    ) -> Pending {
        dispatch(core, request, ctx, session).await
    }
}

/// The correlation id of a (possibly partial) request frame, 0 if not there yet.
pub fn correlation_id_of(buf: &[u8]) -> u32 {
    buf.get(8..12)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
        .unwrap_or(0)
}

/// Turns a body decoding failure into an answer that keeps the connection.
pub fn bad_body(correlation_id: u32, e: &FrameError) -> Answer {
    Answer::error(correlation_id, e.error_code(), &e.to_string(), false)
}

fn ok<T: Message>(correlation_id: u32, body: &T) -> Answer {
    match frame::encode_response(&ResponseHeader::ok(correlation_id), body, 0) {
        Ok(head) => Answer::plain(head),
        Err(e) => Answer::error(correlation_id, e.error_code(), &e.to_string(), false),
    }
}

/// A request-level refusal (over a limit) as a frame-level error that
/// keeps the connection.
fn refused(corr: u32, e: &BrokerError) -> Answer {
    Answer::error(corr, e.code(), &e.to_string(), false)
}

fn topic_result(name: &str, r: Result<(), TopicError>) -> TopicResult {
    match r {
        Ok(()) => TopicResult {
            name: name.into(),
            error: 0,
            message: None,
        },
        Err(e) => TopicResult {
            name: name.into(),
            error: topic_code(&e).as_u16(),
            message: Some(e.to_string()),
        },
    }
}

/// Decodes one request frame and starts serving it. Returns once the
/// request no longer needs to run before the connection's next one: a
/// produce once its batches are appended (its acknowledgements are awaited
/// in the returned task), a fetch at once (it runs in the task), anything
/// else once answered.
pub async fn dispatch(core: &Rc<Core>, request: Bytes, ctx: Ctx, session: &Rc<Session>) -> Pending {
    let (h, body, payload) = match frame::decode_request(&request) {
        Ok(x) => x,
        Err(e) => {
            let corr = correlation_id_of(&request);
            return Pending::Ready(Answer::error(corr, e.error_code(), &e.to_string(), true));
        }
    };
    let corr = h.correlation_id;
    let api = match h.check_supported() {
        Ok(api) => api,
        Err(e) => return Pending::Ready(bad_body(corr, &e)),
    };
    let payload = request.slice_ref(payload);
    // Before a SASL login succeeds (or after it expired), nothing but the
    // login is served; anything else is answered and the connection closed.
    let login = matches!(
        api,
        ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
    );
    if let Gate::Close(reason) = session.gate(login) {
        session.failed(core, reason);
        let code = ErrorCode::SaslAuthenticationFailed;
        return Pending::Ready(Answer::error(corr, code, reason, true));
    }
    if let Some(refused) = authorize(core, session, &h, body) {
        return Pending::Ready(refused);
    }
    match api {
        ApiKey::Produce => match frame::decode_body::<ProduceRequest>(body) {
            Ok(req) => match produce(core, corr, req, payload, ctx, session).await {
                Ok(rest) => Pending::Later(glommio::spawn_local(rest)),
                Err(a) => Pending::Ready(a),
            },
            Err(e) => Pending::Ready(bad_body(corr, &e)),
        },
        ApiKey::Fetch => match frame::decode_body::<FetchRequest>(body) {
            Ok(req) => {
                let core = core.clone();
                let session = session.clone();
                let seq = session.fetch_cursors.begin();
                let continues = req
                    .partitions
                    .iter()
                    .any(|p| p.offset == FetchPartition::CONTINUE);
                let run = async move { fetch(&core, corr, req, ctx, &session, seq).await };
                if continues {
                    // From where the fetches before it ended: served once
                    // they are all answered.
                    Pending::AtTurn(Box::new(move || Box::pin(run)))
                } else {
                    Pending::Later(glommio::spawn_local(run))
                }
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
                let session = session.clone();
                Pending::Later(glommio::spawn_local(async move {
                    let mut r = coordinator::serve(&core, req).await;
                    // A listing shows the groups the principal may describe.
                    if let GroupResponse::List(groups) = &mut r {
                        groups.retain(|(g, _)| acl::may_describe_group(&core, &session, &g.group));
                    }
                    // A share group's offsets are its share partitions' starts.
                    if let GroupResponse::Describe(d) = &mut r {
                        if d.kind == "share" {
                            d.offsets = share_offsets(&core, d).await;
                        }
                    }
                    group_answer(corr, r)
                }))
            }
            Err(e) => Pending::Ready(bad_body(corr, &e)),
        },
        ApiKey::ShareGroupHeartbeat => match frame::decode_body(body) {
            Ok(req) => Pending::Ready(ok(corr, &super::native_share::heartbeat(core, req))),
            Err(e) => Pending::Ready(bad_body(corr, &e)),
        },
        // Tasks: a share fetch may wait for records, and an
        // acknowledgement for its state to be stored.
        ApiKey::ShareFetch => match frame::decode_body(body) {
            Ok(req) => {
                let core = core.clone();
                Pending::Later(glommio::spawn_local(async move {
                    super::native_share::fetch(&core, corr, req).await
                }))
            }
            Err(e) => Pending::Ready(bad_body(corr, &e)),
        },
        ApiKey::ShareAcknowledge => match frame::decode_body(body) {
            Ok(req) => {
                let core = core.clone();
                Pending::Later(glommio::spawn_local(async move {
                    super::native_share::acknowledge(&core, corr, req).await
                }))
            }
            Err(e) => Pending::Ready(bad_body(corr, &e)),
        },
        ApiKey::AlterShareOffsets => match frame::decode_body(body) {
            Ok(req) => {
                let core = core.clone();
                Pending::Later(glommio::spawn_local(async move {
                    super::native_share::alter_offsets(&core, corr, req).await
                }))
            }
            Err(e) => Pending::Ready(bad_body(corr, &e)),
        },
        _ => Pending::Ready(serve_other(core, corr, api, body, session).await),
    }
}

/// The offsets of a described share group: for each partition its
/// members read, where its share partition starts (the first record not
/// acknowledged; the metadata says how many past it are acknowledged
/// already). Partitions with nothing stored are left out.
async fn share_offsets(core: &Rc<Core>, d: &DescribeGroupResponse) -> Vec<CommittedOffset> {
    let partitions: Vec<(String, u32)> = d
        .members
        .iter()
        .flat_map(|m| TopicPartitions::pairs(&m.assignment))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let starts = crate::share::service::stored_starts(core, &d.group, &partitions).await;
    partitions
        .into_iter()
        .zip(starts)
        .filter_map(|((topic, partition), r)| match r {
            Ok(Some((start, done))) => Some(CommittedOffset {
                topic,
                partition,
                offset: start,
                metadata: Some(format!("{done} acknowledged past the start")),
                commit_timestamp: -1,
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(topic, partition, error = %e, "share state not read");
                None
            }
        })
        .collect()
}

fn topic(op: Op, t: &str) -> (Op, Resource<'_>) {
    (op, Resource::Topic(t))
}

/// What a request needs of the ACLs ([`crate::service::acl`]): the same
/// checks the Kafka listener makes, so both protocols answer alike.
fn needs(req: &AnyRequest) -> Vec<(Op, Resource<'_>)> {
    use AnyRequest as R;
    match req {
        R::Produce(r) => r
            .partitions
            .iter()
            .map(|p| topic(Op::Write, &p.topic))
            .collect(),
        R::Fetch(r) => r
            .partitions
            .iter()
            .map(|p| topic(Op::Read, &p.topic))
            .collect(),
        R::ListOffsets(r) => r
            .partitions
            .iter()
            .map(|p| topic(Op::Describe, &p.topic))
            .collect(),
        R::CreateTopics(r) => r
            .topics
            .iter()
            .map(|t| topic(Op::Create, &t.name))
            .collect(),
        R::DeleteTopics(r) => r.names.iter().map(|t| topic(Op::Delete, t)).collect(),
        R::DescribeConfigs(r) => r
            .topics
            .iter()
            .map(|t| topic(Op::DescribeConfigs, t))
            .collect(),
        R::AlterConfigs(r) => r
            .topics
            .iter()
            .map(|(t, _)| topic(Op::AlterConfigs, t))
            .collect(),
        R::CreatePartitions(r) => r.topics.iter().map(|(t, _)| topic(Op::Alter, t)).collect(),
        R::Compact(r) => vec![topic(Op::Alter, &r.topic)],
        R::JoinGroup(r) => vec![(Op::Read, Resource::Group(&r.group))],
        R::Heartbeat(r) => vec![(Op::Read, Resource::Group(&r.group))],
        R::LeaveGroup(r) => vec![(Op::Read, Resource::Group(&r.group))],
        R::OffsetCommit(r) => std::iter::once((Op::Read, Resource::Group(r.group.as_str())))
            .chain(r.offsets.iter().map(|o| topic(Op::Read, &o.topic)))
            .collect(),
        R::OffsetFetch(r) => vec![(Op::Describe, Resource::Group(&r.group))],
        R::DescribeGroup(r) => vec![(Op::Describe, Resource::Group(&r.group))],
        R::DeleteGroup(r) => vec![(Op::Delete, Resource::Group(&r.group))],
        R::FindCoordinator(r) => vec![(Op::Describe, Resource::Group(&r.group))],
        R::InitProducerId(_) => Vec::new(),
        // Transactional-id ACLs are not built: the topics and the group.
        R::AddPartitionsToTxn(r) => r
            .partitions
            .iter()
            .map(|p| topic(Op::Write, &p.topic))
            .collect(),
        R::AddOffsetsToTxn(r) => vec![(Op::Read, Resource::Group(&r.group))],
        R::EndTxn(_) => Vec::new(),
        R::TxnOffsetCommit(r) => {
            std::iter::once((Op::Read, Resource::Group(r.commit.group.as_str())))
                .chain(r.commit.offsets.iter().map(|o| topic(Op::Read, &o.topic)))
                .collect()
        }
        // Filtered: only the groups the principal may describe.
        R::ListGroups(_) => Vec::new(),
        R::DescribeCluster(_) | R::DescribeUsers(_) | R::DescribeAcls(_) => {
            vec![(Op::Describe, Resource::Cluster)]
        }
        R::ChangeVoters(_)
        | R::ReassignPartitions(_)
        | R::AlterUsers(_)
        | R::CreateAcls(_)
        | R::DeleteAcls(_) => vec![(Op::Alter, Resource::Cluster)],
        // Metadata is filtered by what the principal may describe.
        R::ApiVersions(_) | R::Metadata(_) => Vec::new(),
        R::SaslHandshake(_) | R::SaslAuthenticate(_) => Vec::new(),
        R::DescribeClientQuotas(_) => vec![(Op::DescribeConfigs, Resource::Cluster)],
        R::AlterClientQuotas(_) => vec![(Op::AlterConfigs, Resource::Cluster)],
        // Transactional-id ACLs are not built: the cluster stands for them.
        R::ListTransactions(_) => vec![(Op::Describe, Resource::Cluster)],
        R::AbortTransaction(_) => vec![(Op::Alter, Resource::Cluster)],
        R::DescribeProducers(r) => vec![topic(Op::Read, &r.topic)],
        // Kafka's: Read on the group, Read on each topic.
        R::ShareGroupHeartbeat(r) => vec![(Op::Read, Resource::Group(&r.group))],
        R::ShareFetch(r) => std::iter::once((Op::Read, Resource::Group(r.group.as_str())))
            .chain(r.partitions.iter().map(|p| topic(Op::Read, &p.topic)))
            .collect(),
        R::ShareAcknowledge(r) => std::iter::once((Op::Read, Resource::Group(r.group.as_str())))
            .chain(r.partitions.iter().map(|p| topic(Op::Read, &p.topic)))
            .collect(),
        // Kafka's for AlterShareGroupOffsets (Read on the group; Delete
        // to forget its state) and Read on the topic.
        R::AlterShareOffsets(r) => {
            let op = if r.partitions.iter().any(|p| p.start.is_none()) {
                Op::Delete
            } else {
                Op::Read
            };
            vec![(op, Resource::Group(&r.group)), topic(Op::Read, &r.topic)]
        }
        // An API added later: the most a request can need, until it says.
        _ => vec![(Op::Alter, Resource::Cluster)],
    }
}

/// The refusal of a request the session may not make (a frame-level
/// error with the authorization code), if it may not.
fn authorize(
    core: &Core,
    session: &Session,
    h: &frame::RequestHeader,
    body: &[u8],
) -> Option<Answer> {
    if !core.shared.config.authorization.enabled {
        return None;
    }
    // Decoded a second time here, only with an authorizer on: the bodies
    // are small (batches travel in the payload).
    let req = AnyRequest::decode(h, body).ok()?;
    let denied = if matches!(req, AnyRequest::InitProducerId(_)) {
        (!acl::may_write_idempotently(core, session)).then(|| BrokerError::Unauthorized {
            kind: crate::error::Denied::Cluster,
            principal: session.principal().unwrap_or_default(),
            operation: "IdempotentWrite",
            resource: "the cluster".into(),
        })
    } else {
        needs(&req)
            .into_iter()
            .find_map(|(op, r)| acl::check(core, session, op, r).err())
    }?;
    tracing::debug!(peer = %session.peer, error = %denied, "native request refused");
    Some(Answer::error(
        h.correlation_id,
        denied.code(),
        &denied.to_string(),
        false,
    ))
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
        GroupResponse::Fetch(a) | GroupResponse::FetchStable(a, _) => ok(corr, &a),
        GroupResponse::Describe(a) | GroupResponse::DescribeWithBytes(a, _) => ok(corr, &a),
        GroupResponse::List(groups) => ok(
            corr,
            &ListGroupsResponse {
                groups: groups.into_iter().map(|(g, _)| g).collect(),
            },
        ),
        GroupResponse::Refused(code, message) => {
            Answer::error(corr, ErrorCode::from_u16(code), &message, false)
        }
        // Answers to the Kafka protocols' group requests; the native
        // listener never sends those.
        GroupResponse::ConsumerHeartbeat(_)
        | GroupResponse::ClassicJoin(_)
        | GroupResponse::ClassicSync(_)
        | GroupResponse::ClassicHeartbeat(_)
        | GroupResponse::ClassicLeave(_) => Answer::error(
            corr,
            ErrorCode::Unknown,
            "a Kafka group answer to a native request",
            false,
        ),
    }
}

/// Answers a request other than produce, fetch and the group APIs.
async fn serve_other(
    core: &Rc<Core>,
    corr: u32,
    api: ApiKey,
    body: &[u8],
    session: &Session,
) -> Answer {
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
            let named = req.topics.is_some();
            let mut resp = metadata(core, session.protocol, req).await;
            // Topics the principal may not describe: named, they are
            // answered TopicAuthorizationFailed; asked for all, they are
            // left out (Kafka's).
            let describable = |t: &TopicMetadata| {
                acl::allowed(core, session, Op::Describe, Resource::Topic(&t.name))
            };
            if named {
                for t in resp.topics.iter_mut().filter(|t| !describable(t)) {
                    t.error = ErrorCode::TopicAuthorizationFailed.as_u16();
                    t.partitions.clear();
                }
            } else {
                resp.topics.retain(describable);
            }
            ok(corr, &resp)
        }
        ApiKey::DescribeCluster => {
            let _ = body!(DescribeClusterRequest);
            ok(
                corr,
                &admin::describe_cluster(core, session.protocol.name()),
            )
        }
        ApiKey::FindCoordinator => {
            let req = body!(FindCoordinatorRequest);
            ok(
                corr,
                &find_coordinator(core, session.protocol, &req.group, req.transaction),
            )
        }
        ApiKey::ChangeVoters => {
            let req = body!(ChangeVotersRequest);
            ok(corr, &admin::change_voters(core, req).await)
        }
        ApiKey::SaslHandshake => {
            let req = body!(SaslHandshakeRequest);
            let enabled = Session::mechanisms(core);
            let error = match session.handshake(&req.mechanism, enabled) {
                Ok(_) => 0,
                Err(e) => {
                    tracing::debug!(peer = %session.peer, error = e, "SaslHandshake refused");
                    ErrorCode::UnsupportedSaslMechanism.as_u16()
                }
            };
            let mechanisms = if session.protocol.sasl() {
                enabled.iter().map(|m| m.name().to_string()).collect()
            } else {
                Vec::new()
            };
            ok(corr, &SaslHandshakeResponse { error, mechanisms })
        }
        ApiKey::SaslAuthenticate => {
            let req = body!(SaslAuthenticateRequest);
            let (resp, close) = if !session.protocol.sasl() {
                let message = format!(
                    "this is a {} listener: it takes no SASL login",
                    session.protocol.name()
                );
                (auth_failed(message), true)
            } else {
                match session.authenticate(core, &req.auth_bytes).await {
                    Ok(Step::Continue(auth_bytes)) => (
                        SaslAuthenticateResponse {
                            auth_bytes,
                            ..Default::default()
                        },
                        false,
                    ),
                    Ok(Step::Done { bytes, lifetime_ms }) => (
                        SaslAuthenticateResponse {
                            auth_bytes: bytes,
                            session_lifetime_ms: lifetime_ms,
                            ..Default::default()
                        },
                        false,
                    ),
                    Err(e) => (auth_failed(e.message), true),
                }
            };
            let mut answer = ok(corr, &resp);
            answer.close |= close;
            answer
        }
        ApiKey::DescribeAcls => {
            let req = body!(DescribeAclsRequest);
            let acls = acl::describe(core, &filter_of(req.filter));
            let result = AclResult {
                error: 0,
                message: None,
                acls: acls.into_iter().map(entry_of).collect(),
            };
            ok(
                corr,
                &AclsResponse {
                    results: vec![result],
                },
            )
        }
        ApiKey::CreateAcls => {
            let req = body!(CreateAclsRequest);
            let bindings = req.acls.into_iter().map(binding_of).collect();
            let results = acl::create(core, bindings)
                .await
                .into_iter()
                .map(|r| acl_result(r.map(|()| Vec::new())))
                .collect();
            ok(corr, &AclsResponse { results })
        }
        ApiKey::DeleteAcls => {
            let req = body!(DeleteAclsRequest);
            let filters = req.filters.into_iter().map(filter_of).collect();
            let results = acl::delete(core, filters)
                .await
                .into_iter()
                .map(acl_result)
                .collect();
            ok(corr, &AclsResponse { results })
        }
        ApiKey::DescribeUsers => {
            let req = body!(DescribeUsersRequest);
            ok(
                corr,
                &users_response(users::describe_scram(core, req.users)),
            )
        }
        ApiKey::AlterUsers => {
            let req = body!(AlterUsersRequest);
            let deletions = req
                .deletions
                .into_iter()
                .map(|d| (d.user, d.mechanism))
                .collect();
            let upsertions = req
                .upsertions
                .into_iter()
                .map(|u| users::Upsertion {
                    user: u.user,
                    mechanism: u.mechanism,
                    iterations: u.iterations,
                    salt: u.salt,
                    salted_password: u.salted_password,
                })
                .collect();
            let results = users::alter_scram(core, deletions, upsertions).await;
            let results = results
                .into_iter()
                .map(|(u, r)| (u, r.map(|()| Vec::new())))
                .collect();
            ok(corr, &users_response(results))
        }
        ApiKey::CreateTopics => {
            let req = body!(CreateTopicsRequest);
            let mut topics = Vec::new();
            for t in req.topics {
                let mut spec = TopicSpec::new(t.partitions, t.configs.into_iter().collect());
                spec.replication_factor = t.replication_factor.max(1);
                let r = admin::change_topic(core, Change::Create(t.name.clone(), spec)).await;
                topics.push(topic_result(&t.name, r));
            }
            ok(corr, &CreateTopicsResponse { topics })
        }
        ApiKey::DeleteTopics => {
            let req = body!(DeleteTopicsRequest);
            let mut topics = Vec::new();
            for name in req.names {
                let r = admin::change_topic(core, Change::Delete(name.clone())).await;
                topics.push(topic_result(&name, r));
            }
            ok(corr, &DeleteTopicsResponse { topics })
        }
        ApiKey::AlterConfigs => {
            let req = body!(AlterConfigsRequest);
            let mut topics = Vec::new();
            for (name, set) in req.topics {
                let r = admin::change_topic(core, Change::Alter(name.clone(), ConfigOp::sets(set)))
                    .await;
                topics.push(topic_result(&name, r));
            }
            ok(corr, &AlterConfigsResponse { topics })
        }
        ApiKey::CreatePartitions => {
            let req = body!(CreatePartitionsRequest);
            let mut topics = Vec::new();
            for (name, total) in req.topics {
                let r = admin::change_topic(core, Change::AddPartitions(name.clone(), total)).await;
                topics.push(topic_result(&name, r));
            }
            ok(corr, &CreatePartitionsResponse { topics })
        }
        ApiKey::ReassignPartitions => {
            let req = body!(ReassignPartitionsRequest);
            if req.partitions.len() > REQUEST_PARTITIONS_MAX {
                let why = format!(
                    "the request names {} partitions; at most {REQUEST_PARTITIONS_MAX} per request",
                    req.partitions.len()
                );
                return Answer::error(corr, ErrorCode::InvalidRequest, &why, false);
            }
            ok(corr, &reassign(core, req).await)
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
            match list_offsets(core, req).await {
                Ok(r) => ok(corr, &r),
                Err(e) => refused(corr, &e),
            }
        }
        ApiKey::InitProducerId => {
            let req = body!(InitProducerIdRequest);
            match req.transactional_id.clone() {
                Some(id) => ok(corr, &init_transactional(core, id, &req).await),
                None => ok(corr, &init_producer_id(core).await),
            }
        }
        ApiKey::AddPartitionsToTxn => {
            let req = body!(AddPartitionsToTxnRequest);
            ok(corr, &add_partitions_to_txn(core, req).await)
        }
        ApiKey::AddOffsetsToTxn => {
            let req = body!(AddOffsetsToTxnRequest);
            let answer = match crate::coordinator::partition_of(
                core,
                crate::metadata::OFFSETS_TOPIC,
                &req.group,
            ) {
                None => txn_result(Err(crate::txns::api::TxnRefusal::Loading(format!(
                    "{} does not exist yet: retry",
                    crate::metadata::OFFSETS_TOPIC
                )))),
                Some(p) => txn_result(
                    crate::txns::coordinator::serve(
                        core,
                        crate::txns::api::TxnRequest::AddPartitions {
                            id: req.transactional_id,
                            producer_id: req.producer_id,
                            epoch: req.producer_epoch,
                            partitions: vec![(crate::metadata::OFFSETS_TOPIC.to_string(), p)],
                            version: weir_txn::TransactionVersion::V1,
                        },
                    )
                    .await,
                ),
            };
            ok(corr, &answer)
        }
        ApiKey::EndTxn => {
            let req = body!(EndTxnRequest);
            let r = crate::txns::coordinator::serve(
                core,
                crate::txns::api::TxnRequest::EndTxn {
                    id: req.transactional_id,
                    producer_id: req.producer_id,
                    epoch: req.producer_epoch,
                    commit: req.commit,
                    version: weir_txn::TransactionVersion::V1,
                },
            )
            .await;
            let answer = match r {
                Ok(pair) => {
                    let (producer_id, producer_epoch) =
                        pair.unwrap_or((req.producer_id, req.producer_epoch));
                    EndTxnResponse {
                        producer_id,
                        producer_epoch,
                        ..Default::default()
                    }
                }
                Err(e) => {
                    let (error, message) = BrokerError::Transaction(e).wire();
                    EndTxnResponse {
                        error,
                        message: Some(message),
                        producer_id: -1,
                        producer_epoch: -1,
                    }
                }
            };
            ok(corr, &answer)
        }
        ApiKey::TxnOffsetCommit => {
            let req = body!(TxnOffsetCommitRequest);
            let r = coordinator::serve(
                core,
                GroupRequest::TxnCommit {
                    request: req.commit,
                    producer: (req.producer_id, req.producer_epoch),
                },
            )
            .await;
            group_answer(corr, r)
        }
        ApiKey::DescribeClientQuotas => ok(
            corr,
            &describe_quotas(core, body!(DescribeClientQuotasRequest)),
        ),
        ApiKey::AlterClientQuotas => ok(
            corr,
            &alter_quotas(core, body!(AlterClientQuotasRequest)).await,
        ),
        ApiKey::ListTransactions => ok(
            corr,
            &list_transactions(core, body!(ListTransactionsRequest)).await,
        ),
        ApiKey::AbortTransaction => ok(
            corr,
            &abort_transaction(core, body!(AbortTransactionRequest)).await,
        ),
        ApiKey::DescribeProducers => ok(
            corr,
            &describe_producers(core, body!(DescribeProducersRequest)).await,
        ),
        _ => Answer::error(
            corr,
            ErrorCode::UnsupportedApi,
            "API not served by this broker",
            false,
        ),
    }
}

/// The transactions this node coordinates (those asked for, in the
/// states asked for).
async fn list_transactions(
    core: &Rc<Core>,
    req: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let node_id = core.shared.config.cluster.node_id;
    if req.ids.len() > REQUEST_PARTITIONS_MAX {
        return ListTransactionsResponse {
            error: ErrorCode::InvalidRequest.as_u16(),
            message: Some(format!(
                "the request names {} transactional ids; at most {REQUEST_PARTITIONS_MAX}",
                req.ids.len()
            )),
            node_id,
            transactions: Vec::new(),
        };
    }
    let ids = (!req.ids.is_empty()).then_some(req.ids);
    let transactions = crate::txns::admin::node_states(core, ids)
        .await
        .into_iter()
        .filter(|m| req.states.is_empty() || req.states.iter().any(|s| s == m.state.name()))
        .map(|m| TransactionInfo {
            state: m.state.name().to_string(),
            partitions: m
                .partitions
                .iter()
                .map(|(topic, partition)| TxnPartition {
                    topic: topic.clone(),
                    partition: *partition,
                })
                .collect(),
            transactional_id: m.transactional_id,
            producer_id: m.producer_id,
            producer_epoch: m.producer_epoch,
            timeout_ms: m.timeout_ms,
            start_ms: m.start_ms,
        })
        .collect();
    ListTransactionsResponse {
        error: 0,
        message: None,
        node_id,
        transactions,
    }
}

/// An operator's abort of a transactional id's open transaction, at its
/// coordinator.
async fn abort_transaction(
    core: &Rc<Core>,
    req: AbortTransactionRequest,
) -> AbortTransactionResponse {
    let request = crate::txns::api::TxnRequest::Abort {
        id: req.transactional_id.clone(),
    };
    // Only the coordinating node answers (others: NotCoordinator): a
    // client asks each in turn.
    match crate::txns::coordinator::serve(core, request).await {
        Ok(pair) => {
            let (producer_id, producer_epoch) = pair.unwrap_or((-1, -1));
            AbortTransactionResponse {
                error: 0,
                message: None,
                producer_id,
                producer_epoch,
            }
        }
        Err(e) => {
            let (error, message) = BrokerError::Transaction(e).wire();
            AbortTransactionResponse {
                error,
                message: Some(message),
                producer_id: -1,
                producer_epoch: -1,
            }
        }
    }
}

/// The producers a partition's leader (this node) remembers.
async fn describe_producers(
    core: &Rc<Core>,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    match crate::txns::admin::producers(core, &req.topic, req.partition).await {
        Ok(producers) => DescribeProducersResponse {
            error: 0,
            message: None,
            producers: producers
                .into_iter()
                .map(|a| ProducerInfo {
                    producer_id: a.producer_id,
                    producer_epoch: a.epoch,
                    last_sequence: a.last_sequence,
                    last_timestamp: a.last_timestamp,
                    txn_start_offset: a.txn_first_offset.map_or(-1, |o| o as i64),
                })
                .collect(),
        },
        Err(e) => {
            let (error, message) = e.wire();
            DescribeProducersResponse {
                error,
                message: Some(message),
                producers: Vec::new(),
            }
        }
    }
}

/// A transaction coordinator's answer as a [`TxnResult`].
fn txn_result(r: crate::txns::api::TxnResponse) -> TxnResult {
    match r {
        Ok(_) => TxnResult::default(),
        Err(e) => {
            let (error, message) = BrokerError::Transaction(e).wire();
            TxnResult {
                error,
                message: Some(message),
            }
        }
    }
}

/// InitProducerId of a transactional producer, at its coordinator.
async fn init_transactional(
    core: &Rc<Core>,
    id: String,
    req: &InitProducerIdRequest,
) -> InitProducerIdResponse {
    let request = crate::txns::api::TxnRequest::InitProducerId {
        id,
        timeout_ms: i64::from(req.transaction_timeout_ms),
        expected: (req.producer_id >= 0).then_some((req.producer_id, req.producer_epoch)),
        version: weir_txn::TransactionVersion::V1,
    };
    match crate::txns::coordinator::serve(core, request).await {
        Ok(Some((producer_id, producer_epoch))) => InitProducerIdResponse {
            error: 0,
            message: None,
            producer_id,
            producer_epoch,
        },
        Ok(None) => InitProducerIdResponse {
            error: ErrorCode::Unknown.as_u16(),
            message: Some("the coordinator handed out no producer id".into()),
            producer_id: -1,
            producer_epoch: -1,
        },
        Err(e) => {
            let (error, message) = BrokerError::Transaction(e).wire();
            InitProducerIdResponse {
                error,
                message: Some(message),
                producer_id: -1,
                producer_epoch: -1,
            }
        }
    }
}

/// AddPartitionsToTxn: every partition must exist.
async fn add_partitions_to_txn(core: &Rc<Core>, req: AddPartitionsToTxnRequest) -> TxnResult {
    if req.partitions.len() > weir_txn::coordinator::TXN_PARTITIONS_MAX {
        return TxnResult {
            error: ErrorCode::InvalidRequest.as_u16(),
            message: Some(format!(
                "{} partitions; a transaction has at most {}",
                req.partitions.len(),
                weir_txn::coordinator::TXN_PARTITIONS_MAX
            )),
        };
    }
    let view = core.metadata();
    if let Some(p) = req.partitions.iter().find(|p| {
        view.get(&p.topic)
            .is_none_or(|t| p.partition >= t.partitions())
    }) {
        return TxnResult {
            error: ErrorCode::UnknownTopicOrPartition.as_u16(),
            message: Some(format!("no partition {}-{}", p.topic, p.partition)),
        };
    }
    drop(view);
    let request = crate::txns::api::TxnRequest::AddPartitions {
        id: req.transactional_id,
        producer_id: req.producer_id,
        epoch: req.producer_epoch,
        partitions: req
            .partitions
            .into_iter()
            .map(|p| (p.topic, p.partition))
            .collect(),
        version: weir_txn::TransactionVersion::V1,
    };
    txn_result(crate::txns::coordinator::serve(core, request).await)
}

async fn init_producer_id(core: &Rc<Core>) -> InitProducerIdResponse {
    match admin::init_producer_id(core).await {
        Ok(id) => InitProducerIdResponse {
            error: 0,
            message: None,
            producer_id: id,
            producer_epoch: 0,
        },
        Err(e) => {
            let (error, message) = e.wire();
            InitProducerIdResponse {
                error,
                message: Some(message),
                producer_id: -1,
                producer_epoch: -1,
            }
        }
    }
}

/// The cores of every node of the cluster, each with a cluster-wide
/// index (nodes by id, cores in order; a one-node cluster's indexes are
/// its core ids), and each partition named by the index of its leader's
/// core. A partition without a live leader carries `NotLeader`.
///
/// A node without its leader lease (cut off from the controller, paused,
/// fenced: see `Controller::holds_lease`) may hold metadata long out of
/// date — leaders that moved while it could not learn of it. It answers
/// every topic `NotLeader` instead ("ask another node"): a client that
/// asked it would otherwise send to the old leaders, be refused, ask it
/// again and go round for as long as the fault lasts.
async fn metadata(
    core: &Rc<Core>,
    listener: SecurityProtocol,
    req: MetadataRequest,
) -> MetadataResponse {
    if !core.holds_lease() {
        // The names alone: no auto-creation, which would wait on the
        // controller this node cannot reach.
        let names = req.topics.unwrap_or_else(|| admin::visible_topics(core));
        return MetadataResponse {
            cores: Vec::new(),
            topics: names
                .into_iter()
                .map(|name| TopicMetadata {
                    name,
                    error: ErrorCode::NotLeader.as_u16(),
                    partitions: Vec::new(),
                })
                .collect(),
        };
    }
    let endpoints = endpoints(core, listener);
    let cores = endpoints
        .cores
        .iter()
        .enumerate()
        .map(|(i, (host, port))| CoreInfo {
            core: i as u32,
            host: host.clone(),
            port: *port,
        })
        .collect();
    let topics = admin::topics(core, req.topics, false)
        .await
        .into_iter()
        .map(|(name, meta)| match meta {
            Some(meta) => TopicMetadata {
                partitions: (0..meta.partitions())
                    .map(|p| {
                        let at = endpoints.leader(&name, &meta, p);
                        PartitionMetadata {
                            partition: p,
                            core: at.unwrap_or(u32::MAX),
                            error: if at.is_some() {
                                0
                            } else {
                                ErrorCode::NotLeader.as_u16()
                            },
                        }
                    })
                    .collect(),
                name,
                error: 0,
            },
            None => TopicMetadata {
                name,
                error: ErrorCode::UnknownTopicOrPartition.as_u16(),
                partitions: Vec::new(),
            },
        })
        .collect();
    MetadataResponse { cores, topics }
}

/// The native endpoints of every core of the cluster on the listener a
/// client came in on (`listener`, its security protocol; this node's
/// own: its live listeners).
fn endpoints(core: &Core, listener: SecurityProtocol) -> admin::ClusterEndpoints {
    let config = &core.shared.config;
    let more = config
        .listen_more
        .iter()
        .position(|l| l.protocol == listener);
    let local = match more {
        // The advertised host if there is one (clients check a TLS
        // certificate against it), else the bound address.
        None => {
            let host = config
                .cluster
                .advertised_listen
                .as_deref()
                .and_then(|a| a.rsplit_once(':'))
                .map(|(h, _)| h.trim_matches(['[', ']']).to_string())
                .unwrap_or_else(|| config.listen.ip().to_string());
            (host, admin::core_ports(core))
        }
        Some(k) => {
            let l = &config.listen_more[k];
            let host = l
                .advertised
                .as_ref()
                .map_or_else(|| l.addr.ip().to_string(), |(h, _)| h.clone());
            let ports = core.shared.more_core_ports[k]
                .iter()
                .map(|p| p.load(std::sync::atomic::Ordering::Acquire))
                .collect();
            (host, ports)
        }
    };
    admin::ClusterEndpoints::new(core, false, listener.name(), local)
}

/// Where a group's coordinator is (see [`FindCoordinatorRequest`]).
fn find_coordinator(
    core: &Core,
    listener: SecurityProtocol,
    group: &str,
    transaction: bool,
) -> FindCoordinatorResponse {
    let endpoints = endpoints(core, listener);
    let found = if transaction {
        crate::service::admin::coordinator_in(core, &endpoints, crate::txns::TXN_TOPIC, group)
    } else {
        crate::service::admin::coordinator_at(core, &endpoints, group)
    };
    let found = found.and_then(|(node, i)| {
        let (host, port) = endpoints.cores.get(i as usize).ok_or_else(|| {
            coordinator::Refusal(
                ErrorCode::NotCoordinator.as_u16(),
                format!("group {group}'s coordinator core {i} has no known address: retry"),
            )
        })?;
        Ok((node, i, host.clone(), *port))
    });
    match found {
        Ok((node_id, core, host, port)) => FindCoordinatorResponse {
            error: 0,
            message: None,
            node_id,
            core,
            host,
            port,
        },
        Err(coordinator::Refusal(error, message)) => FindCoordinatorResponse {
            error,
            message: Some(message),
            ..FindCoordinatorResponse::default()
        },
    }
}

fn produce_result(
    topic: String,
    partition: u32,
    r: service::Result<service::ProduceOk>,
) -> ProducePartitionResult {
    match r {
        Ok(ok) => ProducePartitionResult {
            topic,
            partition,
            error: 0,
            message: None,
            base_offset: ok.base_offset,
            log_start_offset: ok.log_start_offset,
        },
        Err(e) => {
            let (error, message) = e.wire();
            ProducePartitionResult {
                topic,
                partition,
                error,
                message: Some(message),
                base_offset: 0,
                log_start_offset: 0,
            }
        }
    }
}

/// Appends a produce request's batches; the returned future waits for
/// their acknowledgements and builds the answer.
async fn produce(
    core: &Rc<Core>,
    corr: u32,
    req: ProduceRequest,
    payload: Bytes,
    ctx: Ctx,
    session: &Session,
) -> Result<impl Future<Output = Answer> + 'static, Answer> {
    let transaction: Option<Rc<str>> = req.transactional_id.as_deref().map(Rc::from);
    let parts: Vec<ProducePart> = req
        .partitions
        .into_iter()
        .map(|p| ProducePart {
            data: frame::payload_slice(&payload, p.payload_offset, p.payload_len)
                .map(|s| payload.slice_ref(s))
                .map_err(|e| BrokerError::InvalidRequest(e.to_string())),
            topic: p.topic,
            partition: p.partition,
            transaction: transaction.clone(),
            adds_to_txn: false,
        })
        .collect();
    // 0: no limit.
    let timeout = match req.timeout_ms {
        0 => None,
        ms => Some(Duration::from_millis(u64::from(ms))),
    };
    // Over its quota, the client's connection is muted (the native
    // answer has no throttle field).
    service::quota::spend_produce(core, session, &parts);
    let acked = service::produce::produce(core, parts, req.acks, timeout, ctx)
        .await
        .map_err(|e| refused(corr, &e))?;
    Ok(async move {
        let partitions = acked
            .await
            .into_iter()
            .map(|(t, p, r)| produce_result(t, p, r))
            .collect();
        ok(corr, &ProduceResponse { partitions })
    })
}

async fn fetch(
    core: &Rc<Core>,
    corr: u32,
    req: FetchRequest,
    ctx: Ctx,
    session: &Session,
    seq: u64,
) -> Answer {
    // Each partition's offset: the request's, or for CONTINUE where this
    // connection's previous fetch of it ended (none: refused, unread).
    let offsets: Vec<Option<u64>> = req
        .partitions
        .iter()
        .map(|p| match p.offset {
            FetchPartition::CONTINUE => session.fetch_cursors.resolve(&p.topic, p.partition),
            offset => Some(offset),
        })
        .collect();
    let parts: Vec<FetchPart> = req
        .partitions
        .iter()
        .zip(&offsets)
        .filter_map(|(p, offset)| {
            Some(FetchPart {
                topic: p.topic.clone(),
                partition: p.partition,
                offset: (*offset)?,
                max_bytes: p.max_bytes,
            })
        })
        .collect();
    let mut params = FetchParams {
        max_bytes: req.max_bytes,
        min_bytes: req.min_bytes,
        max_wait_ms: req.max_wait_ms,
        read_committed: req.read_committed,
    };
    service::quota::cap_fetch(core, session, &mut params);
    let read = match service::fetch::fetch(core, &parts, params, ctx).await {
        Ok(r) => r,
        Err(e) => return refused(corr, &e),
    };
    let mut read = read.into_iter();
    let results: Vec<service::Result<FetchOk>> = req
        .partitions
        .iter()
        .zip(&offsets)
        .map(|(p, offset)| match offset {
            Some(offset) => {
                let r = read.next().expect("one result per partition read");
                let end = service::fetch::end_of(*offset, &r);
                session.fetch_cursors.ended(seq, &p.topic, p.partition, end);
                r
            }
            None => Err(BrokerError::InvalidRequest(format!(
                "nothing to continue from: this connection has no fetch of {}-{} \
                 that succeeded; fetch it by offset",
                p.topic, p.partition
            ))),
        })
        .collect();
    service::quota::spend_fetch(core, session, &results);
    let mut partitions = Vec::with_capacity(results.len());
    let mut pieces = Vec::new();
    let mut at: u64 = 0;
    for ((p, r), offset) in req.partitions.into_iter().zip(results).zip(offsets) {
        let fetch_offset = offset.unwrap_or(p.offset);
        match r {
            Ok(f) => {
                let start = at;
                for b in f.batches {
                    at += b.len() as u64;
                    pieces.push(b);
                }
                partitions.push(FetchPartitionResult {
                    topic: p.topic,
                    partition: p.partition,
                    error: 0,
                    message: None,
                    high_watermark: f.high_watermark,
                    log_start_offset: f.log_start_offset,
                    payload_offset: start as u32,
                    payload_len: (at - start) as u32,
                    last_stable_offset: f.last_stable_offset,
                    aborted: if req.read_committed {
                        f.aborted
                            .iter()
                            .map(|&(producer_id, first_offset)| AbortedTransaction {
                                producer_id,
                                first_offset,
                            })
                            .collect()
                    } else {
                        Vec::new()
                    },
                    fetch_offset,
                });
            }
            Err(e) => {
                let (error, message) = e.wire();
                partitions.push(FetchPartitionResult {
                    topic: p.topic,
                    partition: p.partition,
                    error,
                    message: Some(message),
                    high_watermark: 0,
                    log_start_offset: 0,
                    payload_offset: at as u32,
                    payload_len: 0,
                    last_stable_offset: 0,
                    aborted: Vec::new(),
                    fetch_offset,
                });
            }
        }
    }
    let body = FetchResponse { partitions };
    match frame::encode_response(&ResponseHeader::ok(corr), &body, at as usize) {
        Ok(head) => Answer {
            head,
            payload: weir_proto::segments::segments(&pieces),
            close: false,
        },
        Err(e) => Answer::error(corr, e.error_code(), &e.to_string(), false),
    }
}

async fn list_offsets(
    core: &Rc<Core>,
    req: ListOffsetsRequest,
) -> service::Result<ListOffsetsResponse> {
    let queries: Vec<(String, u32, OffsetQuery)> = req
        .partitions
        .iter()
        .map(|p| {
            let q = match p.spec {
                OffsetSpec::Earliest => OffsetQuery::Earliest,
                OffsetSpec::Latest if req.read_committed => OffsetQuery::LatestStable,
                OffsetSpec::Latest => OffsetQuery::Latest,
                OffsetSpec::Timestamp(t) => OffsetQuery::Timestamp(t),
            };
            (p.topic.clone(), p.partition, q)
        })
        .collect();
    let results = service::offsets::list_offsets(core, &queries).await?;
    let partitions = req
        .partitions
        .into_iter()
        .zip(results)
        .map(|(p, r)| {
            let ts = match p.spec {
                OffsetSpec::Timestamp(t) => Some(t),
                _ => None,
            };
            match r {
                Ok(listed) => ListOffsetsResult {
                    topic: p.topic,
                    partition: p.partition,
                    error: 0,
                    offset: listed.offset,
                    timestamp: ts,
                },
                Err(e) => ListOffsetsResult {
                    topic: p.topic,
                    partition: p.partition,
                    error: e.code().as_u16(),
                    offset: None,
                    timestamp: ts,
                },
            }
        })
        .collect();
    Ok(ListOffsetsResponse { partitions })
}

/// Parts per million of a ratio in 0..=1.
fn ppm(r: f64) -> u32 {
    (r.clamp(0.0, 1.0) * 1e6).round() as u32
}

async fn compact(core: &Rc<Core>, req: CompactRequest) -> CompactResponse {
    let results = match admin::compact(core, &req.topic, req.run).await {
        Ok(r) => r,
        Err(e) => {
            let (error, message) = e.wire();
            return CompactResponse {
                error,
                message: Some(message),
                partitions: Vec::new(),
            };
        }
    };
    let partitions = results
        .into_iter()
        .map(|(partition, r)| match r {
            Ok(c) => CompactPartitionResult {
                partition,
                error: 0,
                message: None,
                dirty_ratio_ppm: ppm(c.dirty_ratio),
                pass: c.pass.map(|r| CompactPass {
                    bytes_read: r.bytes_read,
                    bytes_written: r.bytes_written,
                    records_read: r.records_read,
                    records_removed: r.records_removed,
                    tombstones_removed: r.tombstones_removed,
                    segments_before: r.segments_before as u32,
                    segments_after: r.segments_after as u32,
                    size_before: r.size_before,
                    size_after: r.size_after,
                    dirty_ratio_before_ppm: ppm(r.dirty_ratio_before),
                    dirty_ratio_after_ppm: ppm(r.dirty_ratio_after),
                    first_dirty: r.first_dirty,
                    map_full: r.map_full,
                    duration_us: r.duration.as_micros() as u64,
                }),
            },
            Err(e) => {
                let (error, message) = e.wire();
                CompactPartitionResult {
                    partition,
                    error,
                    message: Some(message),
                    dirty_ratio_ppm: 0,
                    pass: None,
                }
            }
        })
        .collect();
    CompactResponse {
        error: 0,
        message: None,
        partitions,
    }
}

/// Moves each partition in turn (one metadata change each); a partition
/// named twice is refused the second time.
async fn reassign(core: &Rc<Core>, req: ReassignPartitionsRequest) -> ReassignPartitionsResponse {
    let mut seen = std::collections::HashSet::new();
    let mut partitions = Vec::with_capacity(req.partitions.len());
    for r in req.partitions {
        let result = if !seen.insert((r.topic.clone(), r.partition)) {
            Err(TopicError::Reassignment(format!(
                "{}-{} named twice in one request",
                r.topic, r.partition
            )))
        } else {
            let change = Change::Reassign {
                topic: r.topic.clone(),
                partition: r.partition,
                nodes: r.replicas,
            };
            admin::change_topic(core, change).await
        };
        let (error, message) = match result {
            Ok(()) => (0, None),
            Err(e) => (topic_code(&e).as_u16(), Some(e.to_string())),
        };
        partitions.push(ReassignmentResult {
            topic: r.topic,
            partition: r.partition,
            error,
            message,
        });
    }
    ReassignPartitionsResponse { partitions }
}

async fn describe(core: &Rc<Core>, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let topics = admin::describe(core, req.topics)
        .await
        .into_iter()
        .map(|(name, d)| match d {
            None => TopicConfigs {
                name,
                error: ErrorCode::UnknownTopicOrPartition.as_u16(),
                configs: Vec::new(),
                partitions: Vec::new(),
            },
            Some(d) => TopicConfigs {
                name,
                error: 0,
                configs: d.configs,
                partitions: d
                    .partitions
                    .into_iter()
                    .map(|p| {
                        let here = p.offsets.is_some();
                        let o = p.offsets.unwrap_or_default();
                        PartitionDescription {
                            partition: p.partition,
                            core: p.core as u32,
                            log_start_offset: o.log_start_offset,
                            log_end_offset: o.high_watermark,
                            size_bytes: o.size_bytes,
                            local_log_start_offset: o.local_log_start_offset,
                            remote_bytes: o.remote_bytes,
                            remote_segments: o.remote_segments,
                            leader: p.leader,
                            leader_epoch: p.leader_epoch,
                            replicas: p.replicas,
                            isr: p.isr,
                            target: p.target,
                            here,
                        }
                    })
                    .collect(),
            },
        })
        .collect();
    DescribeConfigsResponse { topics }
}

/// Users' results on the native protocol.
fn users_response(
    results: Vec<(String, Result<users::Described, users::UserError>)>,
) -> weir_proto::messages::UsersResponse {
    use weir_proto::messages::{CredentialInfo, UserResult};
    weir_proto::messages::UsersResponse {
        results: results
            .into_iter()
            .map(|(user, r)| match r {
                Ok(creds) => UserResult {
                    user,
                    error: 0,
                    message: None,
                    credentials: creds
                        .into_iter()
                        .map(|(mechanism, iterations)| CredentialInfo {
                            mechanism,
                            iterations,
                        })
                        .collect(),
                },
                Err(e) => UserResult {
                    user,
                    error: e.code().as_u16(),
                    message: Some(e.to_string()),
                    credentials: Vec::new(),
                },
            })
            .collect(),
    }
}

fn binding_of(e: weir_proto::messages::AclEntry) -> weir_replication::meta::AclBinding {
    weir_replication::meta::AclBinding {
        resource_type: e.resource_type,
        resource_name: e.resource_name,
        pattern_type: e.pattern_type,
        principal: e.principal,
        host: e.host,
        operation: e.operation,
        permission: e.permission,
    }
}

fn entry_of(b: weir_replication::meta::AclBinding) -> weir_proto::messages::AclEntry {
    weir_proto::messages::AclEntry {
        resource_type: b.resource_type,
        resource_name: b.resource_name,
        pattern_type: b.pattern_type,
        principal: b.principal,
        host: b.host,
        operation: b.operation,
        permission: b.permission,
    }
}

fn filter_of(f: weir_proto::messages::AclFilterEntry) -> weir_replication::security::AclFilter {
    weir_replication::security::AclFilter {
        resource_type: f.resource_type,
        resource_name: f.resource_name,
        pattern_type: f.pattern_type,
        principal: f.principal,
        host: f.host,
        operation: f.operation,
        permission: f.permission,
    }
}

fn acl_result(
    r: Result<Vec<weir_replication::meta::AclBinding>, acl::AclError>,
) -> weir_proto::messages::AclResult {
    match r {
        Ok(acls) => AclResult {
            error: 0,
            message: None,
            acls: acls.into_iter().map(entry_of).collect(),
        },
        Err(e) => AclResult {
            error: e.code().as_u16(),
            message: Some(e.to_string()),
            acls: Vec::new(),
        },
    }
}

fn auth_failed(message: String) -> SaslAuthenticateResponse {
    SaslAuthenticateResponse {
        error: ErrorCode::SaslAuthenticationFailed.as_u16(),
        message: Some(message),
        ..Default::default()
    }
}

fn describe_quotas(core: &Core, req: DescribeClientQuotasRequest) -> DescribeClientQuotasResponse {
    use weir_replication::security::{QuotaComponent, QuotaFilter};
    let mut components = Vec::new();
    for c in req.components {
        match QuotaComponent::from_kafka(c.entity_type, c.match_type, c.name) {
            Ok(c) => components.push(c),
            Err(message) => {
                return DescribeClientQuotasResponse {
                    error: ErrorCode::InvalidRequest.as_u16(),
                    message: Some(message),
                    entries: Vec::new(),
                }
            }
        }
    }
    let filter = QuotaFilter {
        components,
        strict: req.strict,
    };
    let entries = service::quota::describe(core, &filter)
        .into_iter()
        .map(|e| QuotaEntryInfo {
            entity: e
                .entity
                .into_iter()
                .map(|p| QuotaEntityEntry {
                    entity_type: p.entity_type,
                    name: p.name,
                })
                .collect(),
            values: e
                .values
                .into_iter()
                .map(|(key, value_bits)| QuotaValue { key, value_bits })
                .collect(),
        })
        .collect();
    DescribeClientQuotasResponse {
        error: 0,
        message: None,
        entries,
    }
}

async fn alter_quotas(core: &Rc<Core>, req: AlterClientQuotasRequest) -> AlterClientQuotasResponse {
    let changes = req
        .changes
        .into_iter()
        .map(|c| {
            let entity = c
                .entity
                .into_iter()
                .map(|p| weir_replication::meta::QuotaEntityPart {
                    entity_type: p.entity_type,
                    name: p.name,
                })
                .collect();
            weir_replication::meta::QuotaAlteration::new(
                entity,
                c.set.into_iter().map(|v| (v.key, v.value_bits)).collect(),
                c.remove,
            )
        })
        .collect();
    let results = service::quota::alter(core, changes, req.validate_only)
        .await
        .into_iter()
        .map(|r| match r {
            Ok(()) => QuotaResult::default(),
            Err(e) => QuotaResult {
                error: e.code().as_u16(),
                message: Some(e.to_string()),
            },
        })
        .collect();
    AlterClientQuotasResponse { results }
}
