//! DescribeClientQuotas and AlterClientQuotas, onto
//! [`crate::service::quota`].

use kafka_protocol::messages::alter_client_quotas_response::{
    EntityData as AlteredEntity, EntryData as AlteredEntry,
};
use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
};
use weir_replication::meta::{QuotaAlteration, QuotaEntityPart};
use weir_replication::security::{QuotaComponent, QuotaFilter};

use super::common::*;
use super::errors::broker_error_code;
use crate::service::acl::{self, Op, Resource};
use crate::service::auth::Session;
use crate::service::quota;

/// DescribeClientQuotas (DescribeConfigs on the cluster, checked by the
/// gate).
pub(super) fn describe_client_quotas(
    core: &Core,
    r: DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    let mut resp = DescribeClientQuotasResponse::default();
    let mut components = Vec::new();
    for c in r.components {
        let component = QuotaComponent::from_kafka(
            c.entity_type.to_string(),
            c.match_type,
            c._match.map(|m| m.to_string()),
        );
        match component {
            Ok(c) => components.push(c),
            Err(e) => {
                resp.error_code = E::InvalidRequest.code();
                resp.error_message = Some(s(e));
                return resp;
            }
        }
    }
    let filter = QuotaFilter {
        components,
        strict: r.strict,
    };
    resp.entries = Some(
        quota::describe(core, &filter)
            .into_iter()
            .map(|e| {
                let mut d = EntryData::default();
                d.entity = e
                    .entity
                    .into_iter()
                    .map(|p| {
                        let mut x = EntityData::default();
                        x.entity_type = s(p.entity_type);
                        x.entity_name = p.name.map(s);
                        x
                    })
                    .collect();
                d.values = e
                    .values
                    .into_iter()
                    .map(|(k, bits)| {
                        let mut v = ValueData::default();
                        v.key = s(k);
                        v.value = f64::from_bits(bits);
                        v
                    })
                    .collect();
                d
            })
            .collect(),
    );
    resp
}

/// AlterClientQuotas: AlterConfigs on the cluster, or every entry is
/// refused with CLUSTER_AUTHORIZATION_FAILED.
pub(super) async fn alter_client_quotas(
    core: &Rc<Core>,
    session: &Session,
    r: AlterClientQuotasRequest,
) -> AlterClientQuotasResponse {
    let refused = acl::check(core, session, Op::AlterConfigs, Resource::Cluster).err();
    let mut entities = Vec::new();
    let mut changes = Vec::new();
    for e in r.entries {
        entities.push(e.entity.clone());
        let entity = e
            .entity
            .into_iter()
            .map(|p| QuotaEntityPart {
                entity_type: p.entity_type.to_string(),
                name: p.entity_name.map(|n| n.to_string()),
            })
            .collect();
        let (remove, set): (Vec<_>, Vec<_>) = e.ops.into_iter().partition(|o| o.remove);
        changes.push(QuotaAlteration::new(
            entity,
            set.into_iter()
                .map(|o| (o.key.to_string(), o.value.to_bits()))
                .collect(),
            remove.into_iter().map(|o| o.key.to_string()).collect(),
        ));
    }
    let results = match &refused {
        Some(_) => Vec::new(),
        None => quota::alter(core, changes, r.validate_only).await,
    };
    let mut resp = AlterClientQuotasResponse::default();
    resp.entries = entities
        .into_iter()
        .enumerate()
        .map(|(i, entity)| {
            let mut out = AlteredEntry::default();
            out.entity = entity
                .into_iter()
                .map(|p| {
                    let mut x = AlteredEntity::default();
                    x.entity_type = p.entity_type;
                    x.entity_name = p.entity_name;
                    x
                })
                .collect();
            if let Some(e) = &refused {
                out.error_code = broker_error_code(e);
                out.error_message = Some(s(e.to_string()));
            } else if let Some(Err(e)) = results.get(i) {
                out.error_code = coordinator_code(e.code());
                out.error_message = Some(s(e.to_string()));
            }
            out
        })
        .collect();
    resp
}
