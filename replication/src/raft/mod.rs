//! The metadata quorum on openraft: its type configuration, durable
//! storage ([`store`]) and the network that carries its messages over the
//! node links ([`crate::link`]).

use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Snapshot, Vote};

use std::sync::Arc;

use crate::link::Transport;
use crate::meta::{Command, Outcome};
use crate::wire::{Request, Response, WEntry, WVote};

pub mod store;

openraft::declare_raft_types!(
    /// Weir's Raft types: metadata [`Command`]s in, [`Outcome`]s out, nodes
    /// by id with their replication address, snapshots as bytes.
    pub TypeConfig:
        D = Command,
        R = Outcome,
        NodeId = u64,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Vec<u8>,
        AsyncRuntime = openraft::TokioRuntime,
        Responder = openraft::impls::OneshotResponder<TypeConfig>,
);

/// A Raft log entry.
pub type Entry = openraft::Entry<TypeConfig>;
/// The Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;

/// Creates a [`Peer`] per target node.
pub struct Network {
    /// How the node reaches its peers.
    pub links: Arc<dyn Transport>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Peer {
        Peer {
            target,
            addr: node.addr.clone(),
            links: self.links.clone(),
        }
    }
}

/// Raft's messages to one peer.
pub struct Peer {
    target: u64,
    addr: String,
    links: Arc<dyn Transport>,
}

fn unreachable(e: impl std::fmt::Display) -> Unreachable {
    Unreachable::new(&std::io::Error::other(e.to_string()))
}

impl Peer {
    async fn call(&self, request: &Request, option: &RPCOption) -> Result<Response, Unreachable> {
        let call = self
            .links
            .call_within(self.target, &self.addr, request, option.hard_ttl());
        match call.await {
            Ok(Response::Refused(why)) => {
                Err(unreachable(format!("node {} refused: {why}", self.target)))
            }
            Ok(response) => Ok(response),
            Err(e) => Err(unreachable(e.chain())),
        }
    }
}

fn unexpected(r: &Response) -> Unreachable {
    unreachable(format!("unexpected answer {r:?}"))
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let request = Request::Append {
            vote: rpc.vote.into(),
            prev_log_id: rpc.prev_log_id.map(Into::into),
            entries: rpc.entries.iter().map(WEntry::from).collect(),
            leader_commit: rpc.leader_commit.map(Into::into),
        };
        match self.call(&request, &option).await? {
            Response::Append(r) => Ok(r.into()),
            other => Err(unexpected(&other).into()),
        }
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        // Snapshots travel whole (`full_snapshot`); the chunked path is off
        // with openraft's `generic-snapshot-data`.
        Err(unreachable("chunked snapshots are not used").into())
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let request = Request::Vote {
            vote: rpc.vote.into(),
            last_log_id: rpc.last_log_id.map(Into::into),
        };
        match self.call(&request, &option).await? {
            Response::Vote {
                vote,
                granted,
                last_log_id,
            } => Ok(VoteResponse {
                vote: vote.into(),
                vote_granted: granted,
                last_log_id: last_log_id.map(Into::into),
            }),
            other => Err(unexpected(&other).into()),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote<u64>,
        snapshot: Snapshot<TypeConfig>,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<u64>, StreamingError<TypeConfig, openraft::error::Fatal<u64>>>
    {
        let request = Request::Snapshot {
            vote: WVote::from(vote),
            meta: (&snapshot.meta).into(),
            data: *snapshot.snapshot,
        };
        match self.call(&request, &option).await? {
            Response::Snapshot(vote) => Ok(SnapshotResponse::new(vote.into())),
            other => Err(unexpected(&other).into()),
        }
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(Duration::from_millis(100)))
    }
}
