//! `weir`: the broker and its command-line tools.

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
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
