//! Transaction requests and answers as they travel the mesh to the
//! coordinator's core (plain data).

use weir_txn::{TransactionVersion, TxnError};

/// A topic partition.
pub type Tp = (String, u32);

/// A request for a transactional id's coordinator.
#[derive(Debug, Clone)]
pub enum TxnRequest {
    /// InitProducerId with a transactional id.
    InitProducerId {
        /// The transactional id.
        id: String,
        /// `transaction.timeout.ms`.
        timeout_ms: i64,
        /// KIP-360: the producer id and epoch the client had.
        expected: Option<(i64, i16)>,
        /// The protocol the client speaks.
        version: TransactionVersion,
    },
    /// AddPartitionsToTxn / AddOffsetsToTxn.
    AddPartitions {
        /// The transactional id.
        id: String,
        /// Its producer id.
        producer_id: i64,
        /// Its epoch.
        epoch: i16,
        /// The partitions.
        partitions: Vec<Tp>,
        /// The protocol of the request.
        version: TransactionVersion,
    },
    /// KIP-890's check before a transactional write lands: is the
    /// partition in the producer's open transaction? With `add` (a v2
    /// client's write: Produce v12+), it joins the transaction instead,
    /// which opens if none is.
    Verify {
        /// The transactional id.
        id: String,
        /// Its producer id.
        producer_id: i64,
        /// Its epoch.
        epoch: i16,
        /// The partition written.
        tp: Tp,
        /// Add it (KIP-890 v2) rather than check it.
        add: bool,
    },
    /// EndTxn.
    EndTxn {
        /// The transactional id.
        id: String,
        /// Its producer id.
        producer_id: i64,
        /// Its epoch.
        epoch: i16,
        /// Commit (else abort).
        commit: bool,
        /// The protocol of the request (v2: the epoch is bumped).
        version: TransactionVersion,
    },
    /// An operator's abort of the id's open transaction (`weir txn
    /// abort`): its producer fenced.
    Abort {
        /// The transactional id.
        id: String,
    },
}

impl TxnRequest {
    /// The transactional id it is for.
    pub fn id(&self) -> &str {
        match self {
            TxnRequest::InitProducerId { id, .. }
            | TxnRequest::AddPartitions { id, .. }
            | TxnRequest::Verify { id, .. }
            | TxnRequest::EndTxn { id, .. }
            | TxnRequest::Abort { id } => id,
        }
    }
}

/// Why a transaction request was not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnRefusal {
    /// The state machine's refusal.
    Txn(TxnError),
    /// This node does not coordinate the id (now): ask FindCoordinator.
    NotCoordinator(String),
    /// The coordinator is replaying its partition: retry.
    Loading(String),
    /// Storing the step failed.
    Storage(String),
}

impl std::fmt::Display for TxnRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TxnRefusal::Txn(e) => write!(f, "{e}"),
            TxnRefusal::NotCoordinator(m) | TxnRefusal::Loading(m) | TxnRefusal::Storage(m) => {
                f.write_str(m)
            }
        }
    }
}

/// The answer: a producer id and epoch (InitProducerId, EndTxn), or
/// nothing, or the refusal.
pub type TxnResponse = Result<Option<(i64, i16)>, TxnRefusal>;

/// A transactional producer's write, checked on its partition's owner
/// core (`service::produce::append_here`).
#[derive(Debug, Clone)]
pub struct TxnWrite {
    /// The transactional id.
    pub id: String,
    /// The batches' producer id and epoch.
    pub producer: (i64, i16),
    /// Add the partition to the transaction (KIP-890 v2) rather than
    /// check that it is in it.
    pub add: bool,
}
