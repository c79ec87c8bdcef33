//! Client quotas, Kafka's model: produce and fetch byte rates and a
//! request-time percentage, per user, per client id and per both, with
//! defaults (`weir_replication::security::quota_for` picks the entity).
//! Budgets are node-wide ([`crate::shard::quotas`]): a client's
//! connections on every core spend one.
//!
//! A client over its quota is not refused: its answer carries the
//! throttle time (Kafka's `throttle_time_ms`) and its connection is muted
//! that long — the next request is not read before ([`ClientQuotas::
//! muted_until`](crate::shard::quotas::ClientQuotas::muted_until)) — so a client that ignores the field is held to the
//! rate all the same. Produce spends the request's bytes, Fetch the
//! answer's (capped at what the budget holds, [`fetch_allowance`]), and
//! every request the time its core spent reading and starting it.
//!
//! And the quotas themselves: set and removed through the metadata
//! quorum (Kafka's AlterClientQuotas, `weir quota`), listed with filters
//! (DescribeClientQuotas).

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_replication::meta::{QuotaAlteration, QuotaEntry};
use weir_replication::security::{quota_for, QuotaFilter};
use weir_replication::Command;

use crate::service::auth::Session;
use crate::service::fetch::FetchParams;
use crate::service::produce::ProducePart;
use crate::shard::answers::FetchOk;
use crate::shard::quotas::{Kind, Meter};
use crate::shard::Core;

/// The user a quota names: `alice` of `User:alice`.
fn user_of(principal: &str) -> &str {
    principal.split_once(':').map_or(principal, |(_, n)| n)
}

/// The rate and budget of `kind` that apply to the session, if any.
fn meter(core: &Core, session: &Session, kind: Kind) -> Option<(f64, Arc<Meter>)> {
    let generation = core.shared.quota_config.generation();
    if generation == 0 {
        // No quota was ever set on this node.
        return None;
    }
    session.with_principal_ref(|principal| {
        session
            .quotas
            .meter(generation, principal?, kind, |principal, client_id| {
                let quotas: Arc<Vec<QuotaEntry>> = core.quota_config_now();
                let user = user_of(principal);
                Kind::ALL.map(|k| {
                    quota_for(&quotas, user, client_id, k.key()).map(|m| {
                        let rate = k.rate(m.value);
                        (rate, core.shared.meters.get((k, m.user, m.client_id)))
                    })
                })
            })
    })
}

/// Spends `amount` of the session's `kind` budget: the throttle time
/// (zero within the quota, or without one). A throttled connection is
/// muted that long.
pub fn record(core: &Core, session: &Session, kind: Kind, amount: f64) -> Duration {
    let Some((rate, meter)) = meter(core, session, kind) else {
        return Duration::ZERO;
    };
    let now = Instant::now();
    let throttle = meter.spend(rate, amount, now);
    if !throttle.is_zero() {
        session.quotas.mute(now + throttle);
    }
    throttle
}

/// The most bytes a fetch may answer now under the session's fetch
/// quota (`None`: no quota): what its budget holds, so that one large
/// answer does not run up a long debt. A fetch still answers at least
/// the first batch of a partition.
pub fn fetch_allowance(core: &Core, session: &Session) -> Option<u32> {
    let (rate, meter) = meter(core, session, Kind::Fetch)?;
    Some(meter.available(rate, Instant::now()).min(u32::MAX as f64) as u32)
}

/// How long the session's produce budget stays in debt (zero: it is
/// not, or there is no quota): for a receiver that refuses over its quota
/// rather than delaying its answer (OTLP's "retry later").
pub fn produce_debt(core: &Core, session: &Session) -> Duration {
    meter(core, session, Kind::Produce).map_or(Duration::ZERO, |(rate, meter)| {
        meter.debt(rate, Instant::now())
    })
}

/// Spends a produce request's bytes (its batches): the throttle time.
pub fn spend_produce(core: &Core, session: &Session, parts: &[ProducePart]) -> Duration {
    let bytes: usize = parts
        .iter()
        .filter_map(|p| p.data.as_ref().ok())
        .map(|b| b.len())
        .sum();
    record(core, session, Kind::Produce, bytes as f64)
}

/// Caps a fetch at what the session's fetch budget holds
/// ([`fetch_allowance`]).
pub fn cap_fetch(core: &Core, session: &Session, params: &mut FetchParams) {
    if let Some(allowed) = fetch_allowance(core, session) {
        params.max_bytes = params.max_bytes.min(allowed);
    }
}

/// Spends a fetch answer's bytes (its batches): the throttle time.
pub fn spend_fetch(
    core: &Core,
    session: &Session,
    results: &[crate::service::Result<FetchOk>],
) -> Duration {
    let bytes: usize = results
        .iter()
        .flatten()
        .flat_map(|f| f.batches.iter().map(|b| b.len()))
        .sum();
    record(core, session, Kind::Fetch, bytes as f64)
}

/// A throttle in Kafka's field: milliseconds.
pub fn throttle_ms(t: Duration) -> i32 {
    t.as_millis().min(i32::MAX as u128) as i32
}

/// Why a quota change failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// A change Kafka would refuse.
    #[error("{0}")]
    Invalid(String),
    /// The metadata could not be changed.
    #[error("the cluster metadata was not changed: {0}")]
    Metadata(String),
}

impl QuotaError {
    /// The code both protocols answer with.
    pub fn code(&self) -> weir_proto::error_code::ErrorCode {
        use weir_proto::error_code::ErrorCode;
        match self {
            QuotaError::Invalid(_) => ErrorCode::InvalidRequest,
            QuotaError::Metadata(_) => ErrorCode::Unknown,
        }
    }
}

/// The quotas `filter` matches.
pub fn describe(core: &Core, filter: &QuotaFilter) -> Vec<QuotaEntry> {
    core.shared
        .controller
        .state()
        .security
        .quotas
        .iter()
        .filter(|e| filter.matches(e))
        .cloned()
        .collect()
}

/// Applies `changes`; one result each, in order. `validate_only`: check,
/// change nothing (Kafka's).
pub async fn alter(
    core: &Rc<Core>,
    changes: Vec<QuotaAlteration>,
    validate_only: bool,
) -> Vec<Result<(), QuotaError>> {
    let results: Vec<Result<(), QuotaError>> = changes
        .iter()
        .map(|c| c.check().map_err(QuotaError::Invalid))
        .collect();
    let good: Vec<QuotaAlteration> = changes
        .into_iter()
        .zip(&results)
        .filter(|(_, r)| r.is_ok())
        .map(|(c, _)| c)
        .collect();
    if good.is_empty() || validate_only {
        return results;
    }
    let proposed = core
        .shared
        .controller
        .propose(Command::AlterClientQuotas { changes: good })
        .await
        .map_err(|e| QuotaError::Metadata(e.to_string()));
    match proposed {
        Ok(_) => {
            // Enforced on this node from the answer on.
            core.shared
                .publish_security(&core.shared.controller.state().security);
            results
        }
        Err(e) => results.into_iter().map(|r| r.and(Err(e.clone()))).collect(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn users_of_principals() {
        assert_eq!(super::user_of("User:alice"), "alice");
        assert_eq!(super::user_of("User:CN=a:b"), "CN=a:b");
        assert_eq!(super::user_of("bare"), "bare");
    }
}
