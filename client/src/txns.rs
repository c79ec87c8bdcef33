//! Transactions as an operator sees them (Kafka's `kafka-transactions.sh`,
//! `weir txn`): the transactional ids the cluster's coordinators hold, the
//! abort of a hanging transaction, and the producers a partition's leader
//! remembers. Each node answers for what it coordinates or leads; these
//! calls ask every node.

use std::collections::BTreeMap;

use weir_proto::error_code::ErrorCode;
use weir_proto::messages::{
    AbortTransactionRequest, DescribeProducersRequest, ListTransactionsRequest, ProducerInfo,
    TransactionInfo,
};

use crate::{Client, ClientError, Result};

/// A server's refusal as a [`ClientError::Server`].
fn refused(code: u16, message: Option<String>) -> ClientError {
    let code = ErrorCode::from_u16(code);
    ClientError::Server {
        code,
        message: message.unwrap_or_else(|| code.description().to_string()),
    }
}

impl Client {
    /// The transactions of the cluster (in `states` only, if not empty:
    /// `Ongoing`, `PrepareCommit`, …), by transactional id. A node that
    /// cannot be reached is left out.
    pub async fn list_transactions(&self, states: Vec<String>) -> Result<Vec<TransactionInfo>> {
        let req = ListTransactionsRequest {
            ids: Vec::new(),
            states,
        };
        let mut all = BTreeMap::new();
        let others = self.other_nodes().await;
        for (i, node) in std::iter::once(self).chain(&others).enumerate() {
            match node.request(&req).await {
                Ok(r) if r.error == 0 => {
                    for t in r.transactions {
                        all.entry(t.transactional_id.clone()).or_insert(t);
                    }
                }
                Ok(r) if i == 0 => return Err(refused(r.error, r.message)),
                Err(e) if i == 0 => return Err(e),
                _ => {}
            }
        }
        Ok(all.into_values().collect())
    }

    /// One transactional id as its coordinator knows it
    /// (`TransactionalIdNotFound` if none does).
    pub async fn describe_transaction(&self, id: &str) -> Result<TransactionInfo> {
        let req = ListTransactionsRequest {
            ids: vec![id.to_string()],
            states: Vec::new(),
        };
        let others = self.other_nodes().await;
        for node in std::iter::once(self).chain(&others) {
            if let Ok(r) = node.request(&req).await {
                if let Some(t) = r.transactions.into_iter().next() {
                    return Ok(t);
                }
            }
        }
        Err(refused(
            ErrorCode::TransactionalIdNotFound.as_u16(),
            Some(format!("no coordinator knows the transactional id `{id}`")),
        ))
    }

    /// Aborts `id`'s open transaction at its coordinator, fencing its
    /// producer (Kafka's `kafka-transactions.sh abort`); the producer id and
    /// epoch after. Refused (`InvalidTxnState`) when nothing is open.
    pub async fn abort_transaction(&self, id: &str) -> Result<(i64, i16)> {
        let req = AbortTransactionRequest {
            transactional_id: id.to_string(),
        };
        let mut last = None;
        let others = self.other_nodes().await;
        for node in std::iter::once(self).chain(&others) {
            match node.request(&req).await {
                Ok(r) if r.error == 0 => return Ok((r.producer_id, r.producer_epoch)),
                Ok(r) if ErrorCode::from_u16(r.error) == ErrorCode::NotCoordinator => {
                    last = Some(refused(r.error, r.message));
                }
                Ok(r) => return Err(refused(r.error, r.message)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            refused(
                ErrorCode::NotCoordinator.as_u16(),
                Some(format!("no node coordinates `{id}`")),
            )
        }))
    }

    /// The producers `topic`-`partition`'s leader remembers (ids, epochs,
    /// last sequences, open transactions).
    pub async fn describe_producers(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Vec<ProducerInfo>> {
        let req = DescribeProducersRequest {
            topic: topic.to_string(),
            partition,
        };
        let mut last = None;
        let others = self.other_nodes().await;
        for node in std::iter::once(self).chain(&others) {
            match node.request(&req).await {
                Ok(r) if r.error == 0 => return Ok(r.producers),
                Ok(r) if ErrorCode::from_u16(r.error) == ErrorCode::NotLeader => {
                    last = Some(refused(r.error, r.message));
                }
                Ok(r) => {
                    return Err(ClientError::Partition {
                        topic: topic.to_string(),
                        partition,
                        code: ErrorCode::from_u16(r.error),
                        message: r.message.unwrap_or_default(),
                    })
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            refused(
                ErrorCode::NotLeader.as_u16(),
                Some(format!("no node leads {topic}-{partition}")),
            )
        }))
    }
}
