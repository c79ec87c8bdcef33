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

/// Kafka's DescribeClientQuotas match types.
const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;
const MATCH_SPECIFIED: i8 = 2;

/// DescribeClientQuotas (DescribeConfigs on the cluster, checked by the
/// gate).
pub(super) fn describe_client_quotas(
    core: &Core,
    r: DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    let mut resp = DescribeClientQuotasResponse::default();
    let mut components = Vec::new();
    for c in r.components {
        let t = c.entity_type.to_string();
        let component = match (c.match_type, c._match) {
            (MATCH_EXACT, Some(name)) => QuotaComponent::Exact(t, name.to_string()),
            (MATCH_DEFAULT, _) => QuotaComponent::Default(t),
            (MATCH_SPECIFIED, _) => QuotaComponent::Any(t),
            (m, _) => {
                resp.error_code = E::InvalidRequest.code();
                resp.error_message = Some(s(format!(
                    "match type {m} for entity type `{t}` (0 exact with a name, 1 default, 2 any)"
                )));
                return resp;
            }
        };
        components.push(component);
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
        let mut entity: Vec<QuotaEntityPart> = e
            .entity
            .into_iter()
            .map(|p| QuotaEntityPart {
                entity_type: p.entity_type.to_string(),
                name: p.entity_name.map(|n| n.to_string()),
            })
            .collect();
        entity.sort();
        let (remove, set): (Vec<_>, Vec<_>) = e.ops.into_iter().partition(|o| o.remove);
        changes.push(QuotaAlteration {
            entity,
            set: set
                .into_iter()
                .map(|o| (o.key.to_string(), o.value.to_bits()))
                .collect(),
            remove: remove.into_iter().map(|o| o.key.to_string()).collect(),
        });
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
