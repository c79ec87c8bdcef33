//! `weir`: the broker and its command-line tools.

mod acl_cli;
mod cli;
mod cluster_cli;
mod quota_cli;
mod txn_cli;
mod user_cli;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;
use weir_broker::server::config::{BrokerArgs, BrokerConfig};

#[derive(Parser, Debug)]
#[command(
    name = "weir",
    version,
    about = "Weir: a durable, partitioned log broker"
)]
struct Cli {
    /// Log format on stderr: `text` (colours only when stderr is a
    /// terminal) or `json` (one object per line, for log shippers).
    #[arg(long, global = true, env = "WEIR_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start a broker (embedded defaults: ./weir-data, 127.0.0.1:9292, Kafka
    /// clients on 127.0.0.1:9092, all cores).
    Broker(Box<BrokerArgs>),
    /// Manage topics: create, list, describe, alter, delete, add-partitions.
    Topic(cli::TopicArgs),
    /// Write records to a topic, one per line of stdin.
    Produce(cli::ProduceArgs),
    /// Print a topic's records, one per line (as a group member with --group).
    Consume(cli::ConsumeArgs),
    /// Manage consumer groups: list, describe, reset, delete.
    Group(cli::GroupArgs),
    /// The cluster: certificates for its nodes, its status.
    Cluster(cluster_cli::ClusterArgs),
    /// Users' SASL/SCRAM credentials: add, remove, list.
    User(user_cli::UserArgs),
    /// ACLs: who may do what (with `weir broker --authorizer acl`).
    Acl(acl_cli::AclArgs),
    /// Client quotas: byte rates and request time per user and client id.
    Quota(quota_cli::QuotaArgs),
    /// Transactions: list, describe, a partition's producers, abort a
    /// hanging one.
    Txn(txn_cli::TxnArgs),
}

/// Logs go to stderr, filtered by `WEIR_LOG` (default `info`).
fn init_logs(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_from_env("WEIR_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,openraft=warn"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

fn main() {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    let result = match cli.command {
        Command::Broker(args) => BrokerConfig::resolve(&args).and_then(weir_broker::server::run),
        Command::Topic(args) => cli::topic(args),
        Command::Produce(args) => cli::produce(args),
        Command::Consume(args) => cli::consume(args),
        Command::Group(args) => cli::group(args),
        Command::Cluster(args) => cluster_cli::cluster(args),
        Command::User(args) => user_cli::user(args),
        Command::Acl(args) => acl_cli::acl(args),
        Command::Quota(args) => quota_cli::quota(args),
        Command::Txn(args) => txn_cli::txn(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
