//! What operators ask of transactions (`weir txn`, Kafka's
//! `kafka-transactions.sh`): the transactional ids a node coordinates
//! (ListTransactions, DescribeTransactions) and the producers a
//! partition's leader remembers (DescribeProducers). The abort of a
//! hanging transaction is a coordinator step ([`super::api::TxnRequest::Abort`]).

use std::rc::Rc;
use std::time::Duration;

use weir_storage::ActiveProducer;
use weir_txn::TxnMetadata;

use super::coordinator::coordinator_of;
use crate::error::BrokerError;
use crate::service::offsets::on_owner;
use crate::shard::mesh::CoreMsg;
use crate::shard::Core;

/// The transactional ids this core coordinates now (only `ids`, if
/// given).
pub fn local_states(core: &Core, ids: Option<&[String]>) -> Vec<TxnMetadata> {
    let parts = core.txns.parts.borrow();
    parts
        .values()
        .flat_map(|t| t.all())
        .filter(|m| ids.is_none_or(|ids| ids.contains(&m.transactional_id)))
        .filter(|m| coordinator_of(core, &m.transactional_id) == Ok(core.id))
        .cloned()
        .collect()
}

/// The transactional ids every core of this node coordinates (only
/// `ids`, if given), by id. A core that does not answer is left out (and
/// logged).
pub async fn node_states(core: &Rc<Core>, ids: Option<Vec<String>>) -> Vec<TxnMetadata> {
    let mut out = local_states(core, ids.as_deref());
    for c in 0..core.cores() {
        if c == core.id {
            continue;
        }
        let ids = ids.clone();
        match core
            .call(c, Duration::ZERO, |reply| CoreMsg::TxnStates { ids, reply })
            .await
        {
            Ok(states) => out.extend(states),
            Err(e) => tracing::warn!(core = c, error = %e, "no transactions from a core"),
        }
    }
    out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
    out
}

/// The producers `topic`-`partition`'s log remembers, on its owner core.
pub async fn producers(
    core: &Rc<Core>,
    topic: &str,
    partition: u32,
) -> Result<Vec<ActiveProducer>, BrokerError> {
    on_owner(
        core,
        topic,
        partition,
        async { producers_local(core, topic, partition) },
        |reply| CoreMsg::Producers {
            topic: topic.to_string(),
            partition,
            reply,
        },
    )
    .await
}

/// [`producers`] on the owner core.
pub fn producers_local(
    core: &Core,
    topic: &str,
    partition: u32,
) -> Result<Vec<ActiveProducer>, BrokerError> {
    Ok(core.owned_log(topic, partition)?.producers())
}
