//! `weir cluster …`: certificates for a new cluster, and its status.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use weir_client::Client;
use weir_proto::messages::DescribeClusterResponse;

use crate::cli::{connect, runtime, table, Conn};

/// `weir cluster …`.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Create a cluster CA and node certificates in DIR (`ca.pem`,
    /// `ca.key`, `node-<id>.pem`, `node-<id>.key`); with --add-node, sign
    /// one more node's certificate with the CA already in DIR; with
    /// --client, a client certificate (`client-<name>.pem`, `.key`) for
    /// listeners with `--ssl-ca-file DIR/ca.pem --ssl-client-auth required`.
    Certs {
        /// Directory to write to.
        #[arg(long)]
        out: PathBuf,
        /// Certificates for nodes 1..=N (a new CA).
        #[arg(
            long,
            conflicts_with_all = ["add_node", "client"],
            required_unless_present_any = ["add_node", "client"]
        )]
        nodes: Option<u64>,
        /// A certificate for node ID, signed by the CA in DIR.
        #[arg(long, value_name = "ID", conflicts_with = "client")]
        add_node: Option<u64>,
        /// A client certificate `CN=NAME`, signed by the CA in DIR (its
        /// principal: `User:CN=NAME`, or what
        /// `--ssl-principal-mapping-rules` makes of it).
        #[arg(long, value_name = "NAME")]
        client: Option<String>,
    },
    /// Nodes (up or fenced, epoch, addresses), the controller leader, and
    /// the metadata version each node has applied.
    Status {
        #[command(flatten)]
        conn: Conn,
    },
    /// Make a running node a controller voter: it catches up as a learner
    /// first, then a joint change adds it (asked of the leader, found
    /// through --bootstrap).
    AddVoter {
        /// The node's id.
        id: u64,
        /// Its replication address (`host:port`, udp).
        #[arg(long)]
        replication: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove a node from the controller voters (keep three or five).
    RemoveVoter {
        /// The node's id.
        id: u64,
        #[command(flatten)]
        conn: Conn,
    },
}

/// Runs `weir cluster …`.
pub fn cluster(args: ClusterArgs) -> Result<()> {
    match args.command {
        ClusterCommand::Certs {
            out,
            nodes,
            add_node,
            client,
        } => {
            let written = match (nodes, add_node, client) {
                (Some(0), _, _) => bail!("--nodes must be 1 or more"),
                (Some(n), _, _) => weir_replication::tls::generate_cluster(&out, n)?,
                (None, Some(0), _) => bail!("--add-node: node ids start at 1"),
                (None, Some(id), _) => weir_replication::tls::add_node(&out, id)?,
                (None, None, Some(name)) => weir_replication::tls::add_client(&out, &name)?,
                (None, None, None) => unreachable!("clap requires one"),
            };
            for f in written {
                println!("{}", f.display());
            }
            Ok(())
        }
        ClusterCommand::Status { conn } => {
            let rt = runtime()?;
            print!("{}", rt.block_on(status(&conn))?);
            Ok(())
        }
        ClusterCommand::AddVoter {
            id,
            replication,
            conn,
        } => {
            let voters = runtime()?.block_on(change_voters(&conn, id, true, &replication))?;
            println!("node {id} is a voter; voters {voters:?}");
            Ok(())
        }
        ClusterCommand::RemoveVoter { id, conn } => {
            let voters = runtime()?.block_on(change_voters(&conn, id, false, ""))?;
            println!("node {id} is no longer a voter; voters {voters:?}");
            Ok(())
        }
    }
}

/// Asks the controller leader (found from the bootstrap node's view) to
/// change the voters; the voters after it.
async fn change_voters(conn: &Conn, id: u64, add: bool, replication: &str) -> Result<Vec<u64>> {
    let boot = connect(conn).await?;
    let mut client = boot;
    for _ in 0..3 {
        let r = client.change_voters(id, add, replication).await?;
        if r.error == 0 {
            return Ok(r.voters);
        }
        if r.error != weir_proto::error_code::ErrorCode::NotLeader.as_u16() || r.leader == 0 {
            bail!(
                "{}",
                r.message.unwrap_or_else(|| format!("error {}", r.error))
            );
        }
        let view = client.describe_cluster().await?;
        let leader = view
            .nodes
            .iter()
            .find(|n| n.id == r.leader)
            .with_context(|| format!("the leader, node {}, is not in the metadata", r.leader))?;
        client = Client::connect_with(leader.native.as_str(), conn.client_config()?)
            .await
            .with_context(|| {
                format!(
                    "connecting to the leader, node {} at {}",
                    r.leader, leader.native
                )
            })?;
    }
    bail!("the controller leader kept changing; try again")
}

/// How long `weir cluster status` waits for each node.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);

async fn describe(conn: &Conn, addr: &str) -> Result<DescribeClusterResponse> {
    let c = Client::connect_with(addr, conn.client_config()?).await?;
    c.describe_cluster().await.map_err(Into::into)
}

async fn status(conn: &Conn) -> Result<String> {
    let first = connect(conn)
        .await?
        .describe_cluster()
        .await
        .context("describing the cluster")?;
    let mut rows = vec![[
        "NODE",
        "STATE",
        "EPOCH",
        "VOTER",
        "RACK",
        "NATIVE",
        "REPLICATION",
        "APPLIED",
        "DIGEST",
        "LEADER",
    ]
    .map(String::from)
    .to_vec()];
    let mut versions = Vec::new();
    for n in &first.nodes {
        // Each node's own view: what it has applied and whom it follows.
        let own = if n.native.is_empty() {
            Err(anyhow::anyhow!("no address"))
        } else {
            tokio::time::timeout(NODE_TIMEOUT, describe(conn, &n.native))
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out")))
        };
        let (applied, digest, leader) = match &own {
            Ok(d) => {
                versions.push(d.metadata_version);
                (
                    d.metadata_version.to_string(),
                    format!("{:08x}", d.metadata_digest),
                    leader_text(d.controller_leader),
                )
            }
            Err(_) => ("unreachable".to_string(), "-".to_string(), "-".to_string()),
        };
        let state = match (n.fenced, own.is_ok()) {
            (true, _) => "fenced",
            (false, true) => "up",
            (false, false) => "unreachable",
        };
        rows.push(vec![
            n.id.to_string(),
            state.to_string(),
            n.broker_epoch.to_string(),
            if n.voter { "yes" } else { "no" }.to_string(),
            if n.rack.is_empty() {
                "-".into()
            } else {
                n.rack.clone()
            },
            n.native.clone(),
            n.replication.clone(),
            applied,
            digest,
            leader,
        ]);
    }
    Ok(format!(
        "cluster {}\ncontroller leader {}\nmetadata version {} (answered by node {})\n\n{}",
        first.cluster_id,
        leader_text(first.controller_leader),
        versions
            .iter()
            .max()
            .copied()
            .unwrap_or(first.metadata_version),
        first.node_id,
        table(&rows)
    ))
}

fn leader_text(id: u64) -> String {
    if id == 0 {
        "none".into()
    } else {
        id.to_string()
    }
}
