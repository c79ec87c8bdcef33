//! The Kafka protocol for the connection pipeline: frame lengths, and
//! each request onto its API family.

use super::authz::{
    group_describable, refuse_alter_configs, refuse_create_partitions, refuse_delete_records,
    refuse_describe_configs, refuse_offset_commit_topics,
};
use super::cluster::*;
use super::common::*;
use super::data::*;
use super::groups::*;
use super::quotas::*;
use super::security::*;
use super::topics::*;
use crate::service::auth::{Gate, Session, Step};

/// The Kafka protocol (framing and dispatch) for [`crate::listener::connection`].
#[derive(Debug, Clone, Copy)]
pub struct Kafka;

impl Protocol for Kafka {
    fn frame_len(&self, buf: &[u8], max: usize) -> Result<Option<usize>, (u32, Answer)> {
        let len = codec::peek_request_frame_len(buf, max).map_err(|e| {
            tracing::warn!(error = %e, "closing Kafka connection: bad frame size");
            (0, closing())
        })?;
        let key = buf.get(4..6).map(|b| i16::from_be_bytes([b[0], b[1]]));
        if let (Some(n), Some(key)) = (len, key) {
            let produce = key == kafka_protocol::messages::ApiKey::Produce as i16;
            if !produce && n > KAFKA_NON_PRODUCE_FRAME_BYTES_MAX {
                tracing::warn!(
                    api = key,
                    bytes = n,
                    max = KAFKA_NON_PRODUCE_FRAME_BYTES_MAX,
                    "closing Kafka connection: a request other than Produce over its size limit"
                );
                return Err((0, closing()));
            }
        }
        Ok(len)
    }

    fn api_of(&self, frame: &[u8]) -> Option<NativeKey> {
        let key = frame.get(4..6).map(|b| i16::from_be_bytes([b[0], b[1]]))?;
        native_key(key)
    }

    fn is_error(&self, _answer: &Answer) -> bool {
        false
    }

    async fn dispatch(
        &self,
        core: &Rc<Core>,
        request: Bytes,
        ctx: Ctx,
        session: &Rc<Session>,
    ) -> Pending {
        // After a SaslHandshake v0, the frames are the mechanism's tokens,
        // bare (and so are the answers); a failure closes the connection.
        if session.bare_tokens() {
            let token = request.slice(codec::SIZE_PREFIX_BYTES..);
            return Pending::Ready(match session.authenticate(core, &token).await {
                Ok(Step::Continue(bytes) | Step::Done { bytes, .. }) => {
                    let mut head = BytesMut::with_capacity(4 + bytes.len());
                    head.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
                    head.extend_from_slice(&bytes);
                    Answer::plain(head)
                }
                Err(_) => closing(),
            });
        }
        // Before a SASL login succeeds (or after it expired), nothing but
        // the login is even decoded.
        let key = request.get(4..6).map(|b| i16::from_be_bytes([b[0], b[1]]));
        let login = key.is_some_and(|k| {
            use kafka_protocol::messages::ApiKey as K;
            [K::ApiVersions, K::SaslHandshake, K::SaslAuthenticate]
                .iter()
                .any(|a| *a as i16 == k)
        });
        if let Gate::Close(reason) = session.gate(login) {
            session.failed(core, reason);
            return Pending::Ready(closing());
        }
        let frame = request.slice(codec::SIZE_PREFIX_BYTES..);
        match codec::decode_request(frame) {
            Ok(req) => serve(core, req, ctx, session).await,
            Err(codec::DecodeError::Refused { header, answer }) => {
                tracing::debug!(
                    api = header.api_key,
                    version = header.api_version,
                    "Kafka request at a version not served: refused"
                );
                Pending::Ready(Answer::plain(BytesMut::from(&answer[..])))
            }
            Err(e) => {
                tracing::debug!(error = %e, "Kafka request not decoded");
                let error = match &e {
                    codec::DecodeError::UnsupportedVersion { .. } => codec::UNSUPPORTED_VERSION,
                    _ => E::InvalidRequest.code(),
                };
                // An error body where the API has one at that version (the
                // ApiVersions fallback among them); else the connection is
                // closed, as Kafka does.
                let answer = e
                    .header()
                    .filter(|_| !matches!(e, codec::DecodeError::UnsupportedApi { .. }))
                    .and_then(|h| codec::error_response(&h, error))
                    .map(|b| Answer::plain(BytesMut::from(&b[..])))
                    .unwrap_or_else(closing);
                Pending::Ready(answer)
            }
        }
    }
}

/// Starts serving one decoded request.
async fn serve(core: &Rc<Core>, req: RequestFrame, ctx: Ctx, session: &Rc<Session>) -> Pending {
    let h = req.header();
    if let Some(refused) = super::authz::gate(core, session, &h, &req.body) {
        return Pending::Ready(refused);
    }
    let version = req.api_version;
    let client_id = req.client_id.clone().unwrap_or_default();
    session.quotas.set_client_id(&client_id);
    let core = core.clone();
    let session = session.clone();
    match req.body {
        KafkaRequest::ApiVersions(_) => {
            Pending::Ready(answer(&h, KafkaResponse::ApiVersions(api_versions())))
        }
        KafkaRequest::Metadata(r) => at_turn(async move {
            let resp = metadata(&core, r, version, &session).await;
            answer(&h, KafkaResponse::Metadata(resp))
        }),
        KafkaRequest::Produce(r) => produce(&core, h, r, ctx, &session).await,
        KafkaRequest::Fetch(r) => later(async move { fetch(&core, h, r, ctx, &session).await }),
        KafkaRequest::ListOffsets(r) => later(async move {
            let resp = list_offsets(&core, r, version, &session).await;
            answer(&h, KafkaResponse::ListOffsets(resp))
        }),
        KafkaRequest::FindCoordinator(r) => at_turn(async move {
            answer(
                &h,
                KafkaResponse::FindCoordinator(find_coordinator(
                    &core,
                    session.protocol,
                    r,
                    version,
                )),
            )
        }),
        KafkaRequest::AddPartitionsToTxn(r) => later(async move {
            let resp = super::txn::add_partitions_to_txn(&core, r, version, &session).await;
            answer(&h, KafkaResponse::AddPartitionsToTxn(resp))
        }),
        KafkaRequest::EndTxn(r) => later(async move {
            answer(
                &h,
                KafkaResponse::EndTxn(super::txn::end_txn(&core, r, version).await),
            )
        }),
        KafkaRequest::AddOffsetsToTxn(r) => later(async move {
            let resp = super::txn::add_offsets_to_txn(&core, r, version).await;
            answer(&h, KafkaResponse::AddOffsetsToTxn(resp))
        }),
        KafkaRequest::DescribeTransactions(r) => later(async move {
            let resp = super::txn::describe_transactions(&core, r).await;
            answer(&h, KafkaResponse::DescribeTransactions(resp))
        }),
        KafkaRequest::ListTransactions(r) => later(async move {
            let resp = super::txn::list_transactions(&core, r).await;
            answer(&h, KafkaResponse::ListTransactions(resp))
        }),
        KafkaRequest::DescribeProducers(r) => later(async move {
            let resp = super::txn::describe_producers(&core, r).await;
            answer(&h, KafkaResponse::DescribeProducers(resp))
        }),
        KafkaRequest::TxnOffsetCommit(r) => later(async move {
            let resp = super::txn::txn_offset_commit(&core, r, version).await;
            answer(&h, KafkaResponse::TxnOffsetCommit(resp))
        }),
        KafkaRequest::InitProducerId(r) => later(async move {
            let resp = match r.transactional_id.as_ref().filter(|t| !t.is_empty()) {
                Some(id) => {
                    super::txn::init_transactional(&core, id.to_string(), &r, &session).await
                }
                None => init_producer_id(&core, &session).await,
            };
            answer(&h, KafkaResponse::InitProducerId(resp))
        }),
        KafkaRequest::CreateTopics(r) => later(async move {
            answer(
                &h,
                KafkaResponse::CreateTopics(create_topics(&core, r, version, &session).await),
            )
        }),
        KafkaRequest::DeleteTopics(r) => later(async move {
            answer(
                &h,
                KafkaResponse::DeleteTopics(delete_topics(&core, r).await),
            )
        }),
        KafkaRequest::JoinGroup(r) => later(async move {
            answer(
                &h,
                KafkaResponse::JoinGroup(join_group(&core, r, version, client_id).await),
            )
        }),
        KafkaRequest::SyncGroup(r) => {
            later(async move { answer(&h, KafkaResponse::SyncGroup(sync_group(&core, r).await)) })
        }
        KafkaRequest::Heartbeat(r) => {
            later(async move { answer(&h, KafkaResponse::Heartbeat(heartbeat(&core, r).await)) })
        }
        KafkaRequest::LeaveGroup(r) => later(async move {
            answer(
                &h,
                KafkaResponse::LeaveGroup(leave_group(&core, r, version).await),
            )
        }),
        KafkaRequest::OffsetCommit(mut r) => {
            // Topics the principal may not read: refused, the rest committed.
            let refused = refuse_offset_commit_topics(&core, &session, &mut r);
            later(async move {
                let mut resp = offset_commit(&core, r).await;
                resp.topics.extend(refused);
                answer(&h, KafkaResponse::OffsetCommit(resp))
            })
        }
        KafkaRequest::OffsetFetch(r) => {
            // v8+: the groups the principal may not describe are answered
            // GROUP_AUTHORIZATION_FAILED, the others served.
            let refused: Vec<String> = r
                .groups
                .iter()
                .map(|g| g.group_id.to_string())
                .filter(|g| !group_describable(&core, &session, g))
                .collect();
            later(async move {
                answer(
                    &h,
                    KafkaResponse::OffsetFetch(offset_fetch(&core, r, version, &refused).await),
                )
            })
        }
        KafkaRequest::ListGroups(r) => later(async move {
            let mut resp = list_groups(&core, r).await;
            // Only the groups the principal may describe (Kafka's).
            resp.groups
                .retain(|g| group_describable(&core, &session, g.group_id.as_str()));
            answer(&h, KafkaResponse::ListGroups(resp))
        }),
        KafkaRequest::DescribeGroups(r) => later(async move {
            answer(
                &h,
                KafkaResponse::DescribeGroups(describe_groups(&core, r, version).await),
            )
        }),
        KafkaRequest::DeleteGroups(r) => later(async move {
            let mut resp = delete_groups(&core, r).await;
            // Not a consumer group: a share group, perhaps — each looked
            // for on every partition, so a request looks for a few only.
            let mut sweeps = 0;
            for g in resp.results.iter_mut() {
                if g.error_code != kafka_protocol::ResponseError::GroupIdNotFound.code() {
                    continue;
                }
                sweeps += 1;
                g.error_code = if sweeps > super::share::SHARE_GROUP_DELETES_MAX {
                    kafka_protocol::ResponseError::InvalidRequest.code()
                } else {
                    super::share::delete_group(&core, g.group_id.as_str()).await
                };
            }
            answer(&h, KafkaResponse::DeleteGroups(resp))
        }),
        // The resources the principal may not touch are answered with the
        // authorization error; the others are served.
        KafkaRequest::CreatePartitions(mut r) => {
            let refused = refuse_create_partitions(&core, &session, &mut r);
            later(async move {
                let mut resp = create_partitions(&core, r).await;
                resp.results.extend(refused);
                answer(&h, KafkaResponse::CreatePartitions(resp))
            })
        }
        KafkaRequest::DescribeConfigs(mut r) => {
            let refused = refuse_describe_configs(&core, &session, &mut r);
            later(async move {
                let mut resp = describe_configs(&core, r).await;
                resp.results.extend(refused);
                answer(&h, KafkaResponse::DescribeConfigs(resp))
            })
        }
        KafkaRequest::IncrementalAlterConfigs(mut r) => {
            let refused = refuse_alter_configs(&core, &session, &mut r);
            later(async move {
                let mut resp = alter_configs(&core, r).await;
                resp.responses.extend(refused);
                answer(&h, KafkaResponse::IncrementalAlterConfigs(resp))
            })
        }
        KafkaRequest::OffsetForLeaderEpoch(r) => later(async move {
            answer(
                &h,
                KafkaResponse::OffsetForLeaderEpoch(offset_for_leader_epoch(&core, r).await),
            )
        }),
        KafkaRequest::DescribeCluster(_) => at_turn(async move {
            answer(
                &h,
                KafkaResponse::DescribeCluster(describe_cluster(&core, session.protocol)),
            )
        }),
        KafkaRequest::ShareGroupHeartbeat(r) => later(async move {
            answer(
                &h,
                KafkaResponse::ShareGroupHeartbeat(super::share::heartbeat(&core, r)),
            )
        }),
        KafkaRequest::ShareFetch(r) => later(async move {
            let resp = super::share::fetch(&core, r, &session).await;
            answer(&h, KafkaResponse::ShareFetch(resp))
        }),
        KafkaRequest::ShareAcknowledge(r) => later(async move {
            let resp = super::share::acknowledge(&core, r, &session).await;
            answer(&h, KafkaResponse::ShareAcknowledge(resp))
        }),
        KafkaRequest::ShareGroupDescribe(r) => later(async move {
            let resp = super::share::describe(&core, r).await;
            answer(&h, KafkaResponse::ShareGroupDescribe(resp))
        }),
        KafkaRequest::DescribeShareGroupOffsets(r) => later(async move {
            let resp = super::share::describe_offsets(&core, r).await;
            answer(&h, KafkaResponse::DescribeShareGroupOffsets(resp))
        }),
        KafkaRequest::AlterShareGroupOffsets(r) => later(async move {
            let resp = super::share::alter_offsets(&core, r).await;
            answer(&h, KafkaResponse::AlterShareGroupOffsets(resp))
        }),
        KafkaRequest::DeleteShareGroupOffsets(r) => later(async move {
            let resp = super::share::delete_offsets(&core, r).await;
            answer(&h, KafkaResponse::DeleteShareGroupOffsets(resp))
        }),
        KafkaRequest::ConsumerGroupHeartbeat(r) => later(async move {
            answer(
                &h,
                KafkaResponse::ConsumerGroupHeartbeat(
                    consumer_group_heartbeat(&core, r, client_id).await,
                ),
            )
        }),
        KafkaRequest::DeleteRecords(mut r) => {
            let refused = refuse_delete_records(&core, &session, &mut r);
            later(async move {
                let mut resp = delete_records(&core, r).await;
                resp.topics.extend(refused);
                answer(&h, KafkaResponse::DeleteRecords(resp))
            })
        }
        // The login's steps are served in order, before the next request
        // is read: its outcome decides what that one may do.
        KafkaRequest::SaslHandshake(r) => {
            let resp = sasl_handshake(&core, &session, r);
            if version == 0 && resp.error_code == 0 {
                session.expect_bare_tokens();
            }
            Pending::Ready(answer(&h, KafkaResponse::SaslHandshake(resp)))
        }
        KafkaRequest::SaslAuthenticate(r) => {
            let (resp, close) = sasl_authenticate(&core, &session, r).await;
            let mut a = answer(&h, KafkaResponse::SaslAuthenticate(resp));
            a.close |= close;
            Pending::Ready(a)
        }
        KafkaRequest::DescribeUserScramCredentials(r) => Pending::Ready(answer(
            &h,
            KafkaResponse::DescribeUserScramCredentials(describe_user_scram_credentials(&core, r)),
        )),
        KafkaRequest::AlterUserScramCredentials(r) => later(async move {
            answer(
                &h,
                KafkaResponse::AlterUserScramCredentials(
                    alter_user_scram_credentials(&core, r).await,
                ),
            )
        }),
        KafkaRequest::DescribeAcls(r) => Pending::Ready(answer(
            &h,
            KafkaResponse::DescribeAcls(describe_acls(&core, r)),
        )),
        KafkaRequest::CreateAcls(r) => {
            later(async move { answer(&h, KafkaResponse::CreateAcls(create_acls(&core, r).await)) })
        }
        KafkaRequest::DeleteAcls(r) => {
            later(async move { answer(&h, KafkaResponse::DeleteAcls(delete_acls(&core, r).await)) })
        }
        KafkaRequest::DescribeClientQuotas(r) => Pending::Ready(answer(
            &h,
            KafkaResponse::DescribeClientQuotas(describe_client_quotas(&core, r)),
        )),
        KafkaRequest::AlterClientQuotas(r) => later(async move {
            answer(
                &h,
                KafkaResponse::AlterClientQuotas(alter_client_quotas(&core, &session, r).await),
            )
        }),
        KafkaRequest::ConsumerGroupDescribe(r) => later(async move {
            answer(
                &h,
                KafkaResponse::ConsumerGroupDescribe(consumer_group_describe(&core, r).await),
            )
        }),
    }
}
