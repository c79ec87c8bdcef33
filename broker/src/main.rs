//! `weir`: the broker and its command-line tools.

mod cli;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;
use weir_broker::config::{BrokerArgs, BrokerConfig};

#[derive(Parser, Debug)]
#[command(
    name = "weir",
    version,
    about = "Weir: a durable, partitioned log broker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start a broker (embedded defaults: ./weir-data, 127.0.0.1:9292, all cores).
    Broker(BrokerArgs),
    /// Manage topics: create, list, describe, alter, delete, add-partitions.
    Topic(cli::TopicArgs),
    /// Write records to a topic, one per line of stdin.
    Produce(cli::ProduceArgs),
    /// Print a topic's records, one per line (as a group member with --group).
    Consume(cli::ConsumeArgs),
    /// Manage consumer groups: list, describe, reset, delete.
    Group(cli::GroupArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("WEIR_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Broker(args) => BrokerConfig::resolve(&args).and_then(weir_broker::server::run),
        Command::Topic(args) => cli::topic(args),
        Command::Produce(args) => cli::produce(args),
        Command::Consume(args) => cli::consume(args),
        Command::Group(args) => cli::group(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
