//! Administration of topics: create, delete, partitions, records, configs.

use super::cluster::*;
use super::common::*;
use super::errors::*;
use crate::service::auth::Session;

pub(super) async fn create_topics(
    core: &Rc<Core>,
    r: CreateTopicsRequest,
    version: i16,
    session: &Session,
) -> CreateTopicsResponse {
    let mut out = Vec::new();
    for t in r.topics {
        let name = t.name.to_string();
        if let Some(refused) = super::authz::create_refused(core, session, &name) {
            out.push(refused);
            continue;
        }
        let partitions = if t.num_partitions < 0 {
            core.shared.config.default_partitions
        } else {
            t.num_partitions as u32
        };
        // -1: the broker's default (one replica).
        let rf = if t.replication_factor < 0 {
            1
        } else {
            t.replication_factor as u32
        };
        let mut result = CreatableTopicResult::default().with_name(t.name.clone());
        if version >= 5 {
            result = result
                .with_num_partitions(partitions as i32)
                .with_replication_factor(rf as i16);
        }
        let configs = t
            .configs
            .into_iter()
            .filter_map(|c| c.value.map(|v| (c.name.to_string(), v.to_string())))
            .collect();
        let mut spec = TopicSpec::new(partitions, configs);
        spec.replication_factor = rf;
        let change = Change::Create(name.clone(), spec);
        let done = if r.validate_only {
            admin::validate_change(core, change)
        } else {
            admin::change_topic(core, change).await
        };
        out.push(match done {
            Ok(()) => {
                let id = core.metadata().get(&name).map(uuid_of).unwrap_or_default();
                result.with_topic_id(id)
            }
            Err(e) => result
                .with_error_code(topic_error_code(&e))
                .with_error_message(Some(s(e.to_string()))),
        });
    }
    CreateTopicsResponse::default().with_topics(out)
}

pub(super) async fn delete_topics(core: &Rc<Core>, r: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let mut wanted: Vec<(Option<String>, uuid::Uuid)> = r
        .topic_names
        .into_iter()
        .map(|n| (Some(n.to_string()), uuid::Uuid::nil()))
        .collect();
    wanted.extend(
        r.topics
            .into_iter()
            .map(|t| (t.name.map(|n| n.to_string()), t.topic_id)),
    );
    let mut out = Vec::new();
    let ids = TopicIds::new(core);
    for (name, id) in wanted {
        let resolved = name.clone().or_else(|| ids.name(id));
        let result = DeletableTopicResult::default()
            .with_name(name.clone().map(topic_name))
            .with_topic_id(id);
        let Some(topic) = resolved else {
            out.push(result.with_error_code(E::UnknownTopicId.code()));
            continue;
        };
        out.push(
            match admin::change_topic(core, Change::Delete(topic)).await {
                Ok(()) => result,
                Err(e) => result
                    .with_error_code(topic_error_code(&e))
                    .with_error_message(Some(s(e.to_string()))),
            },
        );
    }
    DeleteTopicsResponse::default().with_responses(out)
}

// --- more admin --------------------------------------------------------------

/// DeleteRecords: raises each partition's log start offset (offset -1:
/// to the high watermark); answers the new low watermark.
pub(super) async fn delete_records(
    core: &Rc<Core>,
    r: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    use kafka_protocol::messages::delete_records_response::{
        DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
    };
    let asked: usize = r.topics.iter().map(|t| t.partitions.len()).sum();
    let too_many = asked > REQUEST_PARTITIONS_MAX;
    let mut topics = Vec::with_capacity(r.topics.len());
    for t in r.topics {
        let name = t.name.to_string();
        let mut parts = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let res = DeleteRecordsPartitionResult::default()
                .with_partition_index(p.partition_index)
                .with_low_watermark(-1);
            let outcome = if too_many {
                Err(E::InvalidRequest.code())
            } else if p.partition_index < 0 {
                Err(E::UnknownTopicOrPartition.code())
            } else {
                service::offsets::delete_records(core, &name, p.partition_index as u32, p.offset)
                    .await
                    .map_err(|e| broker_error_code(&e))
            };
            parts.push(match outcome {
                Ok(low) => res.with_low_watermark(low as i64),
                Err(c) => res.with_error_code(c),
            });
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(parts),
        );
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

pub(super) async fn create_partitions(
    core: &Rc<Core>,
    r: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut out = Vec::new();
    for t in r.topics {
        let result = CreatePartitionsTopicResult::default().with_name(t.name.clone());
        let done = if t.count < 0 {
            Err(TopicError::Partitions {
                topic: t.name.to_string(),
                count: 0,
                reason: "negative count".into(),
            })
        } else {
            let change = Change::AddPartitions(t.name.to_string(), t.count as u32);
            if r.validate_only {
                admin::validate_change(core, change)
            } else {
                admin::change_topic(core, change).await
            }
        };
        out.push(match done {
            Ok(()) => result,
            Err(e) => result
                .with_error_code(topic_error_code(&e))
                .with_error_message(Some(s(e.to_string()))),
        });
    }
    CreatePartitionsResponse::default().with_results(out)
}

/// Kafka's config resource types.
pub(super) const RESOURCE_TOPIC: i8 = 2;
pub(super) const RESOURCE_BROKER: i8 = 4;
/// Kafka's config sources.
pub(super) const SOURCE_TOPIC: i8 = 1;
pub(super) const SOURCE_DEFAULT: i8 = 5;

pub(super) async fn describe_configs(
    core: &Rc<Core>,
    r: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let mut out = Vec::new();
    for res in r.resources {
        let result = DescribeConfigsResult::default()
            .with_resource_type(res.resource_type)
            .with_resource_name(res.resource_name.clone());
        let keys: Option<Vec<String>> = res
            .configuration_keys
            .map(|k| k.into_iter().map(|k| k.to_string()).collect());
        let wanted = |k: &str| keys.as_ref().is_none_or(|ks| ks.iter().any(|x| x == k));
        match res.resource_type {
            RESOURCE_TOPIC => {
                let name = res.resource_name.to_string();
                let explicit = core
                    .metadata()
                    .get(&name)
                    .map(|m| m.configs.clone())
                    .unwrap_or_default();
                let described = admin::describe(core, vec![name.clone()]).await;
                out.push(match described.into_iter().next().and_then(|(_, d)| d) {
                    Some(d) => result.with_configs(
                        d.configs
                            .into_iter()
                            .filter(|(k, _)| wanted(k))
                            .map(|(k, v)| {
                                let source = if explicit.contains_key(&k) {
                                    SOURCE_TOPIC
                                } else {
                                    SOURCE_DEFAULT
                                };
                                DescribeConfigsResourceResult::default()
                                    .with_name(s(k))
                                    .with_value(Some(s(v)))
                                    .with_config_source(source)
                            })
                            .collect(),
                    ),
                    None => result
                        .with_error_code(E::UnknownTopicOrPartition.code())
                        .with_error_message(Some(s(format!("unknown topic `{name}`")))),
                });
            }
            // This node's settings are flags, not Kafka broker configs:
            // an empty list.
            RESOURCE_BROKER => out.push(result),
            t => out.push(
                result
                    .with_error_code(E::InvalidRequest.code())
                    .with_error_message(Some(s(format!("config resource type {t} is not served")))),
            ),
        }
    }
    DescribeConfigsResponse::default().with_results(out)
}

pub(super) async fn alter_configs(
    core: &Rc<Core>,
    r: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut out = Vec::new();
    for res in r.resources {
        let result = AlterConfigsResourceResponse::default()
            .with_resource_type(res.resource_type)
            .with_resource_name(res.resource_name.clone());
        if res.resource_type != RESOURCE_TOPIC {
            out.push(
                result
                    .with_error_code(E::InvalidRequest.code())
                    .with_error_message(Some(s("only topic configs can be changed"))),
            );
            continue;
        }
        // Kafka's operations: 0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT.
        let mut ops = Vec::new();
        let mut refused = None;
        for c in res.configs {
            let name = c.name.to_string();
            match (c.config_operation, c.value) {
                (0, Some(v)) => ops.push(ConfigOp::Set(name, v.to_string())),
                (1, _) => ops.push(ConfigOp::Delete(name)),
                (2, Some(v)) => ops.push(ConfigOp::Append(name, v.to_string())),
                (3, Some(v)) => ops.push(ConfigOp::Subtract(name, v.to_string())),
                (op @ 0..=3, None) => {
                    refused = Some(format!("config `{name}`: operation {op} needs a value"))
                }
                (op, _) => {
                    refused = Some(format!(
                        "config `{name}`: unknown operation {op} (0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT)"
                    ))
                }
            }
        }
        let done = match refused {
            Some(m) => Err((E::InvalidRequest.code(), m)),
            None if r.validate_only => {
                admin::validate_change(core, Change::Alter(res.resource_name.to_string(), ops))
                    .map_err(|e| (topic_error_code(&e), e.to_string()))
            }
            None => admin::change_topic(core, Change::Alter(res.resource_name.to_string(), ops))
                .await
                .map_err(|e| (topic_error_code(&e), e.to_string())),
        };
        out.push(match done {
            Ok(()) => result,
            Err((c, m)) => result.with_error_code(c).with_error_message(Some(s(m))),
        });
    }
    IncrementalAlterConfigsResponse::default().with_responses(out)
}
