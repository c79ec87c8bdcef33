//! `weir txn …`: transactions as an operator sees them (Kafka's
//! `kafka-transactions.sh`): list the transactional ids, describe one,
//! list a partition's producers, abort a hanging transaction.

use anyhow::Result;
use clap::{Args, Subcommand};
use weir_proto::messages::TransactionInfo;

use crate::cli::{connect, runtime, table, Conn};

/// `weir txn …`.
#[derive(Args, Debug)]
pub struct TxnArgs {
    #[command(subcommand)]
    command: TxnCommand,
}

#[derive(Subcommand, Debug)]
enum TxnCommand {
    /// Every transactional id the cluster's coordinators hold: its producer
    /// id and epoch, state, and how long its transaction has been open.
    List {
        /// Only these states (`Ongoing`, `PrepareCommit`, `PrepareAbort`,
        /// `CompleteCommit`, `CompleteAbort`, `Empty`); repeatable.
        #[arg(long = "state")]
        states: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// One transactional id: state, producer, timeout, its partitions.
    Describe {
        /// The transactional id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// The producers a partition's leader remembers (Kafka's
    /// `describe-producers`): an open transaction's first offset holds the
    /// last stable offset back.
    Producers {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        #[command(flatten)]
        conn: Conn,
    },
    /// Abort a transactional id's open transaction now (a hanging one),
    /// fencing its producer: a client still using it gets
    /// PRODUCER_FENCED and must initialize again.
    Abort {
        /// The transactional id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

/// How long a transaction has been open, for a table (`-` if none is).
fn open_for(t: &TransactionInfo, now_ms: i64) -> String {
    if t.start_ms < 0 {
        "-".to_string()
    } else {
        format!("{:.1}s", (now_ms - t.start_ms).max(0) as f64 / 1000.0)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Runs `weir txn …`.
pub fn txn(args: TxnArgs) -> Result<()> {
    let rt = runtime()?;
    match args.command {
        TxnCommand::List { states, conn } => {
            let list = rt.block_on(async {
                let client = connect(&conn).await?;
                anyhow::Ok(client.list_transactions(states).await?)
            })?;
            let now = now_ms();
            let mut rows = vec![[
                "TRANSACTIONAL-ID",
                "PRODUCER-ID",
                "EPOCH",
                "STATE",
                "OPEN-FOR",
                "PARTITIONS",
            ]
            .map(String::from)
            .to_vec()];
            for t in &list {
                rows.push(vec![
                    t.transactional_id.clone(),
                    t.producer_id.to_string(),
                    t.producer_epoch.to_string(),
                    t.state.clone(),
                    open_for(t, now),
                    t.partitions.len().to_string(),
                ]);
            }
            print!("{}", table(&rows));
            Ok(())
        }
        TxnCommand::Describe { id, conn } => {
            let t = rt.block_on(async {
                let client = connect(&conn).await?;
                anyhow::Ok(client.describe_transaction(&id).await?)
            })?;
            println!("transactional id: {}", t.transactional_id);
            println!("producer id:      {}", t.producer_id);
            println!("producer epoch:   {}", t.producer_epoch);
            println!("state:            {}", t.state);
            println!("timeout:          {} ms", t.timeout_ms);
            println!("open for:         {}", open_for(&t, now_ms()));
            let parts: Vec<String> = t
                .partitions
                .iter()
                .map(|p| format!("{}-{}", p.topic, p.partition))
                .collect();
            println!("partitions:       {}", parts.join(" "));
            Ok(())
        }
        TxnCommand::Producers {
            topic,
            partition,
            conn,
        } => {
            let producers = rt.block_on(async {
                let client = connect(&conn).await?;
                anyhow::Ok(client.describe_producers(&topic, partition).await?)
            })?;
            let mut rows = vec![[
                "PRODUCER-ID",
                "EPOCH",
                "LAST-SEQUENCE",
                "LAST-TIMESTAMP",
                "TXN-START-OFFSET",
            ]
            .map(String::from)
            .to_vec()];
            for p in producers {
                rows.push(vec![
                    p.producer_id.to_string(),
                    p.producer_epoch.to_string(),
                    p.last_sequence.to_string(),
                    p.last_timestamp.to_string(),
                    if p.txn_start_offset < 0 {
                        "-".to_string()
                    } else {
                        p.txn_start_offset.to_string()
                    },
                ]);
            }
            print!("{}", table(&rows));
            Ok(())
        }
        TxnCommand::Abort { id, conn } => {
            let (pid, epoch) = rt.block_on(async {
                let client = connect(&conn).await?;
                anyhow::Ok(client.abort_transaction(&id).await?)
            })?;
            println!(
                "aborted the open transaction of `{id}` (producer {pid} now at epoch {epoch})"
            );
            Ok(())
        }
    }
}
