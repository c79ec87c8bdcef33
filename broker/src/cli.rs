//! The command-line tools: `weir topic …`, `weir produce`, `weir consume`,
//! `weir group …`.
//!
//! Each command talks to one broker listener (`--bootstrap`, env
//! `WEIR_BOOTSTRAP`) through `weir-client` on a tokio current-thread
//! runtime, and returns an error (printed by `main` as one line) on failure.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::str::FromStr;
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::{Args, Subcommand};
use weir_client::producer::Compression as ProducerCompression;
use weir_client::{
    Acks, Client, Consumer, ConsumerConfig, ConsumerRecord, DeliveryFuture, GroupAssignor,
    GroupConsumer, GroupConsumerConfig, OffsetReset, ProducerConfig, ProducerRecord,
};
use weir_proto::messages::{CommitOffset, OffsetSpec, ShareStartChange};

/// Where to find the broker, and how to talk to it.
#[derive(Args, Debug, Clone)]
pub struct Conn {
    /// Broker listener to connect to (HOST:PORT).
    #[arg(long, env = "WEIR_BOOTSTRAP", default_value = "127.0.0.1:9292")]
    pub bootstrap: String,
    /// A Kafka-style properties file of connection settings
    /// (`security.protocol=SSL`, `ssl.ca.location=…`,
    /// `ssl.certificate.location=…`, `ssl.key.location=…`, timeouts), as
    /// Kafka's tools take with `--command-config`.
    #[arg(long, env = "WEIR_COMMAND_CONFIG", value_name = "FILE")]
    pub command_config: Option<std::path::PathBuf>,
}

impl Conn {
    /// The client settings `--command-config` names (defaults without it).
    pub fn client_config(&self) -> Result<weir_client::ClientConfig> {
        let Some(path) = &self.command_config else {
            return Ok(weir_client::ClientConfig::default());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --command-config {}", path.display()))?;
        let props = weir_client::Properties::parse(&text)
            .with_context(|| format!("--command-config {}", path.display()))?;
        weir_client::ClientConfig::from_properties(props.iter())
            .with_context(|| format!("--command-config {}", path.display()))
    }
}

/// `weir topic …`.
#[derive(Args, Debug)]
pub struct TopicArgs {
    #[command(subcommand)]
    command: TopicCommand,
}

#[derive(Subcommand, Debug)]
enum TopicCommand {
    /// Create a topic.
    Create {
        /// Topic name.
        name: String,
        /// Number of partitions.
        #[arg(long)]
        partitions: u32,
        /// Replicas of each partition, on distinct nodes (at most the live
        /// nodes).
        #[arg(long, default_value_t = 1)]
        replication_factor: u32,
        /// Config override (repeatable), e.g. `--config retention.ms=86400000`.
        #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_config)]
        configs: Vec<(String, String)>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List topic names.
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Show a topic's configs and, per partition, its core, offsets and size.
    Describe {
        /// Topic name.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Set config entries of a topic.
    Alter {
        /// Topic name.
        name: String,
        /// Config entry to set (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_config, required = true)]
        configs: Vec<(String, String)>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Delete a topic and its data.
    Delete {
        /// Topic name.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Run a cleaner pass now on every partition of a compacted topic
    /// (whatever the dirty ratio) and print what it did.
    Compact {
        /// Topic name.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Move a partition's replicas to other nodes (`--partition P
    /// --replicas 1,2,4`), or every replica off a node (`--drain-node N`,
    /// of the topic named or of every topic). New replicas copy the log
    /// and join the ISR; then the old ones leave and delete their copy; a
    /// leader that leaves hands over to the first new in-sync replica.
    Reassign {
        /// Topic name (optional with --drain-node: every topic).
        name: Option<String>,
        /// The partition to move.
        #[arg(long, requires = "replicas", conflicts_with = "drain_node")]
        partition: Option<u32>,
        /// Its new replicas' node ids, the preferred leader first.
        #[arg(long, value_delimiter = ',', requires = "partition")]
        replicas: Vec<u64>,
        /// Move every replica on this node to the live node with the
        /// fewest replicas that does not hold one of that partition.
        #[arg(long, value_name = "NODE")]
        drain_node: Option<u64>,
        /// Wait until the moves complete, printing progress.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Grow a topic to a total number of partitions.
    AddPartitions {
        /// Topic name.
        name: String,
        /// The new total number of partitions.
        #[arg(long)]
        total: u32,
        #[command(flatten)]
        conn: Conn,
    },
}

/// `weir produce`.
#[derive(Args, Debug)]
pub struct ProduceArgs {
    /// Topic to write to.
    topic: String,
    /// Write every record to this partition (default: by key with Kafka's
    /// murmur2 partitioner, sticky per batch for records without a key).
    #[arg(long)]
    partition: Option<u32>,
    /// Split each line into key and value at the first SEP (a line without
    /// SEP is a record without key).
    #[arg(long, value_name = "SEP")]
    key_separator: Option<String>,
    /// Acknowledgement: 0 (none), 1 (appended) or all (durable).
    #[arg(long, default_value = "all")]
    acks: Acks,
    /// Batch codec: none, lz4, zstd or zstd:LEVEL.
    #[arg(long, default_value = "none", value_parser = parse_compression)]
    compression: ProducerCompression,
    /// How long a batch waits for more records after its first one.
    #[arg(long, default_value_t = 5)]
    linger_ms: u64,
    /// A batch is sent once it holds this many bytes.
    #[arg(long, default_value_t = 128 << 10, value_parser = clap::value_parser!(u64).range(1..=(64 << 20)))]
    batch_size: u64,
    #[command(flatten)]
    conn: Conn,
}

fn parse_compression(s: &str) -> Result<ProducerCompression, String> {
    match s {
        "none" => Ok(ProducerCompression::None),
        "lz4" => Ok(ProducerCompression::Lz4),
        "zstd" => Ok(ProducerCompression::Zstd { level: 3 }),
        _ => match s.strip_prefix("zstd:").map(str::parse::<i32>) {
            Some(Ok(level)) => Ok(ProducerCompression::Zstd { level }),
            _ => Err(format!("`{s}`: use none, lz4, zstd or zstd:LEVEL")),
        },
    }
}

/// `weir consume`.
#[derive(Args, Debug)]
pub struct ConsumeArgs {
    /// Topic to read.
    topic: String,
    /// Read only this partition (default: all, round-robin).
    #[arg(long)]
    partition: Option<u32>,
    /// Where to start: earliest, latest, an OFFSET, or an RFC 3339 UTC
    /// TIMESTAMP like 2024-01-15T10:00:00Z (the first record at or after it).
    #[arg(long, default_value = "earliest")]
    from: StartAt,
    /// Exit after this many records.
    #[arg(long)]
    max_records: Option<u64>,
    /// Exit after this many milliseconds without a new record.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
    /// Output per record (a newline follows): %t topic, %p partition,
    /// %o offset, %k key, %v value, %T timestamp (ms), %% a percent sign;
    /// \t, \n and \\ escapes.
    #[arg(long, default_value = "%v")]
    format: String,
    /// Consume as a member of this consumer group: the group's coordinator
    /// assigns the partitions, which start at the group's committed
    /// offsets (`--from earliest|latest` applies where none is committed).
    #[arg(long, conflicts_with = "partition")]
    group: Option<String>,
    /// With --group: commit the offsets of the printed records after each
    /// batch is written to stdout.
    #[arg(long, requires = "group")]
    commit: bool,
    /// With --group: the member is expelled after this long without a
    /// heartbeat (e.g. when the process is killed).
    #[arg(long, default_value_t = 10_000, requires = "group")]
    session_timeout_ms: u64,
    /// With --group: range, roundrobin or cooperative-sticky.
    #[arg(long, default_value = "cooperative-sticky", requires = "group")]
    assignor: GroupAssignor,
    /// Only records of committed transactions (Kafka's
    /// `isolation.level=read_committed`): reads end at the last stable
    /// offset, aborted transactions are skipped.
    #[arg(long)]
    read_committed: bool,
    #[command(flatten)]
    conn: Conn,
}

impl ConsumeArgs {
    fn isolation(&self) -> weir_client::IsolationLevel {
        if self.read_committed {
            weir_client::IsolationLevel::ReadCommitted
        } else {
            weir_client::IsolationLevel::ReadUncommitted
        }
    }
}

fn parse_config(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got `{s}`")),
    }
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

pub(crate) async fn connect(conn: &Conn) -> Result<Client> {
    Client::connect_with(conn.bootstrap.as_str(), conn.client_config()?)
        .await
        .with_context(|| format!("connecting to {}", conn.bootstrap))
}

/// Runs `weir topic …`.
pub fn topic(args: TopicArgs) -> Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        match args.command {
            TopicCommand::Create {
                name,
                partitions,
                replication_factor,
                configs,
                conn,
            } => {
                let c = connect(&conn).await?;
                c.create_replicated_topic(&name, partitions, replication_factor, configs)
                    .await?;
                println!(
                    "created topic {name} with {partitions} partitions of {replication_factor} replica(s)"
                );
            }
            TopicCommand::List { conn } => {
                for name in connect(&conn).await?.list_topics().await? {
                    println!("{name}");
                }
            }
            TopicCommand::Describe { name, conn } => {
                let c = connect(&conn).await?;
                let t = c.describe_topic(&name).await?;
                let compacted = t
                    .configs
                    .iter()
                    .any(|(k, v)| k == "cleanup.policy" && v.contains("compact"));
                let dirty = if compacted {
                    Some(c.compact(&name, false).await?)
                } else {
                    None
                };
                print!("{}", describe_text(&t, dirty.as_deref()));
            }
            TopicCommand::Compact { name, conn } => {
                let parts = connect(&conn).await?.compact(&name, true).await?;
                print!("{}", compact_text(&parts));
                if let Some(p) = parts.iter().find(|p| p.error != 0) {
                    anyhow::bail!(
                        "partition {} failed: {}",
                        p.partition,
                        p.message.as_deref().unwrap_or("error")
                    );
                }
            }
            TopicCommand::Alter {
                name,
                configs,
                conn,
            } => {
                connect(&conn).await?.alter_configs(&name, configs).await?;
                println!("altered topic {name}");
            }
            TopicCommand::Delete { name, conn } => {
                connect(&conn).await?.delete_topic(&name).await?;
                println!("deleted topic {name}");
            }
            TopicCommand::Reassign {
                name,
                partition,
                replicas,
                drain_node,
                wait,
                conn,
            } => {
                let c = connect(&conn).await?;
                let moves = match (drain_node, partition, name) {
                    (Some(node), _, name) => {
                        let names = match name {
                            Some(n) => vec![n],
                            None => {
                                let mut all = c.list_topics().await?;
                                all.extend(
                                    weir_broker::metadata::INTERNAL_TOPICS.map(String::from),
                                );
                                all
                            }
                        };
                        let mut topics = Vec::new();
                        for n in names {
                            match c.describe_topic(&n).await {
                                Ok(t) => topics.push(t),
                                // A single node has no internal topics.
                                Err(_) if weir_broker::metadata::is_internal(&n) => {}
                                Err(e) => return Err(e.into()),
                            }
                        }
                        let live: Vec<u64> = c
                            .describe_cluster()
                            .await?
                            .nodes
                            .iter()
                            .filter(|n| !n.fenced)
                            .map(|n| n.id)
                            .collect();
                        drain_plan(&topics, &live, node)?
                    }
                    (None, Some(p), Some(name)) => vec![(name, p, replicas)],
                    _ => anyhow::bail!(
                        "name a topic with --partition P --replicas N,N,…, or give --drain-node N"
                    ),
                };
                if moves.is_empty() {
                    println!("nothing to move");
                    return Ok(());
                }
                let results = c.reassign_partitions(moves.clone()).await?;
                let mut failed = 0;
                for ((t, p, to), r) in moves.iter().zip(&results) {
                    let to = to.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
                    match r {
                        Ok(()) => println!("moving {t}-{p} to nodes {to}"),
                        Err(e) => {
                            failed += 1;
                            eprintln!("{t}-{p}: {e}");
                        }
                    }
                }
                if failed > 0 {
                    anyhow::bail!("{failed} of {} moves refused", moves.len());
                }
                if wait {
                    wait_moved(&c, &moves).await?;
                }
            }
            TopicCommand::AddPartitions { name, total, conn } => {
                let c = connect(&conn).await?;
                c.create_partitions(&name, total).await?;
                println!("topic {name} now has {total} partitions");
            }
        }
        Ok(())
    })
}

/// The moves that take every replica off `node`: each goes to the live
/// node with the fewest replicas (counting the moves planned so far,
/// lowest id first) that holds none of that partition, in its place in
/// the replica order.
fn drain_plan(
    topics: &[weir_proto::messages::TopicConfigs],
    live: &[u64],
    node: u64,
) -> Result<Vec<(String, u32, Vec<u64>)>> {
    let mut load: BTreeMap<u64, usize> = live.iter().map(|n| (*n, 0)).collect();
    for p in topics.iter().flat_map(|t| &t.partitions) {
        for n in &p.replicas {
            if let Some(c) = load.get_mut(n) {
                *c += 1;
            }
        }
    }
    let mut moves = Vec::new();
    for t in topics {
        for p in &t.partitions {
            // A move under way is replaced: plan from where it goes.
            let now = if p.target.is_empty() {
                &p.replicas
            } else {
                &p.target
            };
            if !now.contains(&node) {
                continue;
            }
            let to = load
                .iter()
                .filter(|(n, _)| **n != node && !now.contains(n))
                .min_by_key(|(n, c)| (**c, **n))
                .map(|(n, _)| *n)
                .with_context(|| {
                    format!(
                        "no live node left to take the replica of {}-{} (replicas {now:?}, live nodes {live:?})",
                        t.name, p.partition
                    )
                })?;
            *load.get_mut(&to).expect("a live node") += 1;
            let replicas = now
                .iter()
                .map(|n| if *n == node { to } else { *n })
                .collect();
            moves.push((t.name.clone(), p.partition, replicas));
        }
    }
    Ok(moves)
}

/// Waits until every move is done (the partition's replicas are its
/// target and no reassignment is under way), printing each as it ends.
async fn wait_moved(c: &Client, moves: &[(String, u32, Vec<u64>)]) -> Result<()> {
    let mut pending: Vec<&(String, u32, Vec<u64>)> = moves.iter().collect();
    let started = Instant::now();
    while !pending.is_empty() {
        tokio::time::sleep(Duration::from_millis(250)).await;
        // Each topic described once per round.
        let mut topics = BTreeMap::new();
        for m in &pending {
            if !topics.contains_key(&m.0) {
                topics.insert(m.0.clone(), c.describe_topic(&m.0).await?);
            }
        }
        let mut still = Vec::new();
        for m in pending {
            let now = topics[&m.0].partitions.iter().find(|p| p.partition == m.1);
            let done = now.is_some_and(|p| p.target.is_empty() && p.replicas == m.2);
            let replaced = now.is_some_and(|p| !p.target.is_empty() && p.target != m.2);
            if replaced {
                anyhow::bail!(
                    "{}-{}: another move replaced this one (now to nodes {:?})",
                    m.0,
                    m.1,
                    now.map(|p| p.target.clone()).unwrap_or_default()
                );
            }
            if done {
                println!(
                    "{}-{} moved ({:.1} s)",
                    m.0,
                    m.1,
                    started.elapsed().as_secs_f64()
                );
            } else {
                still.push(m);
            }
        }
        pending = still;
    }
    println!("all {} moves done", moves.len());
    Ok(())
}

/// Right-aligned columns, two spaces apart.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, String::len))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// A ratio in parts per million as a fraction with three decimals.
fn ratio(ppm: u32) -> String {
    format!("{:.3}", ppm as f64 / 1e6)
}

/// `weir topic compact`'s output: a row per partition.
fn compact_text(parts: &[weir_proto::messages::CompactPartitionResult]) -> String {
    let mut rows = vec![[
        "PARTITION",
        "DIRTY-BEFORE",
        "DIRTY-AFTER",
        "READ-BYTES",
        "WRITTEN-BYTES",
        "RECORDS-REMOVED",
        "TOMBSTONES-REMOVED",
        "SEGMENTS",
        "SIZE",
        "MS",
    ]
    .map(String::from)
    .to_vec()];
    for p in parts {
        let mut row = vec![p.partition.to_string()];
        match (&p.pass, p.error) {
            (_, e) if e != 0 => row.push(format!(
                "error: {}",
                p.message.as_deref().unwrap_or("failed")
            )),
            (None, _) => row.extend([
                ratio(p.dirty_ratio_ppm),
                ratio(p.dirty_ratio_ppm),
                "nothing cleanable".to_string(),
            ]),
            (Some(s), _) => row.extend([
                ratio(s.dirty_ratio_before_ppm),
                ratio(s.dirty_ratio_after_ppm),
                s.bytes_read.to_string(),
                s.bytes_written.to_string(),
                s.records_removed.to_string(),
                s.tombstones_removed.to_string(),
                format!("{}->{}", s.segments_before, s.segments_after),
                format!("{}->{}", s.size_before, s.size_after),
                format!("{:.1}", s.duration_us as f64 / 1000.0),
            ]),
        }
        rows.push(row);
    }
    table(&rows)
}

/// `weir topic describe`'s output: the configs, then a table of partitions
/// (with each one's dirty ratio for a compacted topic).
fn describe_text(
    t: &weir_proto::messages::TopicConfigs,
    dirty: Option<&[weir_proto::messages::CompactPartitionResult]>,
) -> String {
    let mut out = format!(
        "Topic: {}\nPartitions: {}\nConfigs:\n",
        t.name,
        t.partitions.len()
    );
    let width = t.configs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in &t.configs {
        out.push_str(&format!("  {k:<width$}  {v}\n"));
    }
    let mut head = [
        "PARTITION",
        "LEADER",
        "EPOCH",
        "REPLICAS",
        "ISR",
        "CORE",
        "LOG-START",
        "LOG-END",
        "BYTES",
    ]
    .map(String::from)
    .to_vec();
    let nodes = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    if dirty.is_some() {
        head.push("DIRTY-RATIO".into());
    }
    let tiered = t
        .configs
        .iter()
        .any(|(k, v)| k == "remote.storage.enable" && v == "true");
    if tiered {
        head.extend(["LOCAL-START", "REMOTE-BYTES", "REMOTE-SEGMENTS"].map(String::from));
    }
    let moving = t.partitions.iter().any(|p| !p.target.is_empty());
    if moving {
        head.push("MOVING-TO".into());
    }
    let mut rows = vec![head];
    for p in &t.partitions {
        let known = |v: u64| if p.here { v.to_string() } else { "-".into() };
        let mut row = vec![
            p.partition.to_string(),
            if p.leader == 0 {
                "none".into()
            } else {
                p.leader.to_string()
            },
            p.leader_epoch.to_string(),
            nodes(&p.replicas),
            nodes(&p.isr),
            p.core.to_string(),
            known(p.log_start_offset),
            known(p.log_end_offset),
            known(p.size_bytes),
        ];
        if let Some(d) = dirty {
            row.push(
                d.iter()
                    .find(|x| x.partition == p.partition && x.error == 0)
                    .map_or_else(|| "-".to_string(), |x| ratio(x.dirty_ratio_ppm)),
            );
        }
        if tiered {
            row.extend([
                known(p.local_log_start_offset),
                known(p.remote_bytes),
                known(u64::from(p.remote_segments)),
            ]);
        }
        if moving {
            row.push(if p.target.is_empty() {
                "-".into()
            } else {
                nodes(&p.target)
            });
        }
        rows.push(row);
    }
    out.push_str(&table(&rows));
    out
}

// --- produce -----------------------------------------------------------------

/// The position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > hay.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Runs `weir produce`: one record per stdin line, through the SDK's
/// batching, idempotent producer.
pub fn produce(args: ProduceArgs) -> Result<()> {
    // The producer's sender task runs on a worker thread, so it keeps
    // sending while this thread waits for stdin.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let client = rt.block_on(connect(&args.conn))?;
    let md = rt.block_on(client.topic_metadata(&args.topic))?;
    let partitions = md.partitions.len() as u32;
    if partitions == 0 {
        bail!("topic `{}` has no partitions", args.topic);
    }
    if let Some(p) = args.partition {
        if p >= partitions {
            bail!(
                "--partition {p} is out of range: topic `{}` has {partitions} partitions",
                args.topic
            );
        }
    }
    let mut config = ProducerConfig::default();
    config.acks = args.acks;
    config.compression = args.compression;
    config.linger_ms = args.linger_ms;
    config.batch_size = args.batch_size as usize;
    let _guard = rt.enter();
    let producer = weir_client::Producer::new(client, config);
    let sep = args.key_separator.as_deref().map(str::as_bytes);
    let mut input = BufReader::with_capacity(1 << 20, std::io::stdin().lock());
    let mut line = Vec::new();
    let mut tally = Tally::default();
    let topic: std::sync::Arc<str> = args.topic.as_str().into();
    let mut waiting: std::collections::VecDeque<DeliveryFuture> = Default::default();
    let result = (|| -> Result<()> {
        loop {
            line.clear();
            if input
                .read_until(b'\n', &mut line)
                .context("reading stdin")?
                == 0
            {
                break;
            }
            if line.last() == Some(&b'\n') {
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
            }
            let (key, value) = match sep.and_then(|s| find(&line, s).map(|i| (i, s.len()))) {
                Some((i, n)) => (Some(&line[..i]), &line[i + n..]),
                None => (None, &line[..]),
            };
            let record = ProducerRecord {
                topic: topic.clone(),
                partition: args.partition,
                key: key.map(Bytes::copy_from_slice),
                value: Some(Bytes::copy_from_slice(value)),
                ..ProducerRecord::default()
            };
            waiting.push_back(rt.block_on(producer.send(record))?);
            tally.sent += 1;
            // Count the records already acknowledged (in order), so that
            // memory stays bounded by the producer's buffer.
            while let Some(outcome) = waiting.front_mut().and_then(DeliveryFuture::try_outcome) {
                waiting.pop_front();
                tally.add(outcome);
            }
        }
        Ok(())
    })();
    rt.block_on(async {
        producer.close().await;
        for f in waiting {
            tally.add(f.await);
        }
    });
    if args.acks == Acks::None {
        eprintln!("{} records sent (acks=0: not acknowledged)", tally.sent);
    } else {
        eprintln!("{} records acknowledged", tally.acked);
    }
    result?;
    if let Some(e) = tally.first_error {
        bail!(
            "{} of {} records not acknowledged; first error: {e}",
            tally.sent - tally.acked,
            tally.sent
        );
    }
    Ok(())
}

/// What became of the records `weir produce` sent.
#[derive(Default)]
struct Tally {
    sent: u64,
    acked: u64,
    first_error: Option<String>,
}

impl Tally {
    fn add(&mut self, outcome: weir_client::Result<weir_client::RecordMetadata>) {
        match outcome {
            Ok(_) => self.acked += 1,
            Err(e) => {
                self.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

// --- consume -----------------------------------------------------------------

/// Where `weir consume` starts in each partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StartAt {
    Earliest,
    Latest,
    Offset(u64),
    /// Milliseconds since the Unix epoch.
    Timestamp(i64),
}

impl FromStr for StartAt {
    type Err = String;

    fn from_str(s: &str) -> Result<StartAt, String> {
        match s {
            "earliest" => return Ok(StartAt::Earliest),
            "latest" => return Ok(StartAt::Latest),
            _ => {}
        }
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            return s
                .parse()
                .map(StartAt::Offset)
                .map_err(|e| format!("offset `{s}`: {e}"));
        }
        let t = humantime::parse_rfc3339_weak(s).map_err(|e| {
            format!(
                "`{s}` is not earliest, latest, an offset or an RFC 3339 UTC time \
                 like 2024-01-15T10:00:00Z ({e})"
            )
        })?;
        let ms = t
            .duration_since(UNIX_EPOCH)
            .map_err(|_| format!("`{s}` is before 1970"))?
            .as_millis();
        Ok(StartAt::Timestamp(ms as i64))
    }
}

/// One piece of a `--format`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(Vec<u8>),
    Topic,
    Partition,
    Offset,
    Key,
    Value,
    Timestamp,
}

fn parse_format(s: &str) -> Result<Vec<Piece>> {
    let mut pieces = Vec::new();
    let mut text = Vec::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        let field = match c {
            '%' => match chars.next() {
                Some('t') => Piece::Topic,
                Some('p') => Piece::Partition,
                Some('o') => Piece::Offset,
                Some('k') => Piece::Key,
                Some('v') => Piece::Value,
                Some('T') => Piece::Timestamp,
                Some('%') => {
                    text.push(b'%');
                    continue;
                }
                Some(x) => bail!("unknown field `%{x}` in --format (use %t %p %o %k %v %T %%)"),
                None => bail!("--format ends with a lone `%`"),
            },
            '\\' => {
                match chars.next() {
                    Some('t') => text.push(b'\t'),
                    Some('n') => text.push(b'\n'),
                    Some('\\') => text.push(b'\\'),
                    Some(x) => {
                        text.push(b'\\');
                        text.extend_from_slice(x.encode_utf8(&mut [0; 4]).as_bytes());
                    }
                    None => text.push(b'\\'),
                }
                continue;
            }
            c => {
                text.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                continue;
            }
        };
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(field);
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// One record, as `--format` sees it.
struct Printed<'a> {
    topic: &'a str,
    partition: u32,
    offset: i64,
    timestamp: i64,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
}

fn write_record(out: &mut impl Write, format: &[Piece], r: &Printed<'_>) -> std::io::Result<()> {
    for p in format {
        match p {
            Piece::Text(t) => out.write_all(t)?,
            Piece::Topic => out.write_all(r.topic.as_bytes())?,
            Piece::Partition => write!(out, "{}", r.partition)?,
            Piece::Offset => write!(out, "{}", r.offset)?,
            Piece::Timestamp => write!(out, "{}", r.timestamp)?,
            Piece::Key => out.write_all(r.key.unwrap_or_default())?,
            Piece::Value => out.write_all(r.value.unwrap_or_default())?,
        }
    }
    out.write_all(b"\n")
}

/// Runs `weir consume`, through the SDK's consumer.
pub fn consume(args: ConsumeArgs) -> Result<()> {
    let format = parse_format(&args.format)?;
    let rt = runtime()?;
    let client = rt.block_on(connect(&args.conn))?;
    if let Some(group) = args.group.clone() {
        return consume_group(&args, &format, &rt, client, group);
    }
    let topic = args.topic.as_str();
    let md = rt.block_on(client.topic_metadata(topic))?;
    let count = md.partitions.len() as u32;
    let partitions: Vec<(String, u32)> = match args.partition {
        Some(p) if p >= count => {
            bail!("--partition {p} is out of range: topic `{topic}` has {count} partitions")
        }
        Some(p) => vec![(topic.to_string(), p)],
        None => (0..count).map(|p| (topic.to_string(), p)).collect(),
    };
    let mut config = ConsumerConfig::default();
    config.max_poll_records = 10_000;
    config.auto_offset_reset = OffsetReset::Earliest;
    config.isolation_level = args.isolation();
    let mut consumer = Consumer::new(client, config);
    consumer.assign(partitions.clone());
    rt.block_on(async {
        match args.from {
            StartAt::Earliest => consumer.seek_to_beginning(&partitions).await,
            StartAt::Latest => consumer.seek_to_end(&partitions).await,
            StartAt::Offset(o) => {
                for (t, p) in &partitions {
                    consumer.seek(t, *p, o)?;
                }
                Ok(())
            }
            StartAt::Timestamp(ms) => {
                for (t, p) in &partitions {
                    consumer.seek_to_timestamp(t, *p, ms).await?;
                }
                Ok(())
            }
        }
    })?;

    let printed = print_records(&args, &format, Plain(&rt, &mut consumer))?;
    eprintln!("{printed} records consumed");
    Ok(())
}

/// Where `weir consume` gets its records, and what it does once a poll's
/// records are printed.
trait Source {
    /// Records for up to `left`.
    fn poll(&mut self, left: Duration) -> Result<Vec<ConsumerRecord>>;
    /// Called with the records just printed (and flushed).
    fn printed(&mut self, _records: &[ConsumerRecord]) -> Result<()> {
        Ok(())
    }
}

/// A plain consumer over assigned partitions.
struct Plain<'a>(&'a tokio::runtime::Runtime, &'a mut Consumer);

impl Source for Plain<'_> {
    fn poll(&mut self, left: Duration) -> Result<Vec<ConsumerRecord>> {
        Ok(self.0.block_on(self.1.poll(left))?)
    }
}

/// A group member, committing what it printed with `--commit`.
struct Member<'a> {
    rt: &'a tokio::runtime::Runtime,
    consumer: &'a mut GroupConsumer,
    commit: bool,
}

impl Source for Member<'_> {
    fn poll(&mut self, left: Duration) -> Result<Vec<ConsumerRecord>> {
        Ok(self.rt.block_on(self.consumer.poll(left))?)
    }

    fn printed(&mut self, records: &[ConsumerRecord]) -> Result<()> {
        if !self.commit {
            return Ok(());
        }
        // Next offset to consume per printed partition.
        let mut next: std::collections::BTreeMap<(String, u32), u64> = Default::default();
        for r in records {
            next.insert((r.topic.to_string(), r.partition), r.offset + 1);
        }
        let offsets = next
            .into_iter()
            .map(|((topic, partition), offset)| CommitOffset {
                topic,
                partition,
                offset,
                metadata: None,
            })
            .collect();
        self.rt
            .block_on(self.consumer.commit_offsets(offsets))
            .context("committing the printed records' offsets")
    }
}

/// Prints records from `source` with `format` until `--max-records` are
/// printed or none came for `--timeout-ms`; returns how many were printed.
/// A closed standard output (broken pipe) ends it quietly.
fn print_records(args: &ConsumeArgs, format: &[Piece], mut source: impl Source) -> Result<u64> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    let idle = Duration::from_millis(args.timeout_ms);
    let max = args.max_records.unwrap_or(u64::MAX);
    let mut printed: u64 = 0;
    let mut last_progress = Instant::now();
    let result = (|| -> Result<()> {
        while printed < max {
            let left = idle.saturating_sub(last_progress.elapsed());
            if left.is_zero() {
                break;
            }
            let records = source.poll(left)?;
            if records.is_empty() {
                continue;
            }
            last_progress = Instant::now();
            let mut n = 0;
            for r in &records {
                let shown = Printed {
                    topic: &r.topic,
                    partition: r.partition,
                    offset: r.offset as i64,
                    timestamp: r.timestamp,
                    key: r.key.as_deref(),
                    value: r.value.as_deref(),
                };
                write_record(&mut out, format, &shown)?;
                n += 1;
                printed += 1;
                if printed >= max {
                    break;
                }
            }
            out.flush()?;
            source.printed(&records[..n])?;
        }
        Ok(())
    })();
    let flushed = out.flush();
    match result.and(flushed.map_err(Into::into)) {
        Err(e) if is_broken_pipe(&e) => Ok(printed),
        Err(e) => Err(e),
        Ok(()) => Ok(printed),
    }
}

/// `weir consume --group`: a group member that prints what it is
/// assigned, committing the printed records' offsets with `--commit`.
fn consume_group(
    args: &ConsumeArgs,
    format: &[Piece],
    rt: &tokio::runtime::Runtime,
    client: Client,
    group: String,
) -> Result<()> {
    let mut config = GroupConsumerConfig::new(group);
    config.client_id = "weir-consume".into();
    config.assignor = args.assignor;
    config.session_timeout = Duration::from_millis(args.session_timeout_ms);
    config.heartbeat_interval = Duration::from_millis((args.session_timeout_ms / 3).max(1));
    config.consumer.max_poll_records = 10_000;
    config.consumer.isolation_level = args.isolation();
    config.consumer.auto_offset_reset = match args.from {
        StartAt::Earliest => OffsetReset::Earliest,
        StartAt::Latest => OffsetReset::Latest,
        _ => bail!("with --group, --from must be earliest or latest (where nothing is committed); use `weir group reset` to move a group's offsets"),
    };
    let mut consumer = GroupConsumer::new(client, config);
    rt.block_on(consumer.subscribe(&[args.topic.as_str()]))?;
    let result = print_records(
        args,
        format,
        Member {
            rt,
            consumer: &mut consumer,
            commit: args.commit,
        },
    );
    let closed = rt.block_on(consumer.close());
    let printed = result?;
    closed.context("leaving the group")?;
    eprintln!("{printed} records consumed");
    Ok(())
}

// --- group -------------------------------------------------------------------

/// `weir group …`.
#[derive(Args, Debug)]
pub struct GroupArgs {
    #[command(subcommand)]
    command: GroupCommand,
}

#[derive(Subcommand, Debug)]
enum GroupCommand {
    /// List consumer groups.
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Show a group's state and members and, per partition, the committed
    /// offset, log end, lag (records and seconds) and consumer.
    Describe {
        /// Group id.
        group: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Move the committed offsets of a group without active members. Prints
    /// the plan; applies it only with --execute.
    Reset {
        /// Group id.
        group: String,
        /// The topic whose offsets move (every partition).
        #[arg(long)]
        topic: String,
        #[command(flatten)]
        to: ResetTo,
        /// A share group's (KIP-932): move the start of its share
        /// partitions — records from there on are delivered again, those
        /// below never (Kafka's `kafka-share-groups.sh --reset-offsets`).
        #[arg(long)]
        share: bool,
        /// Apply the plan (without it: a dry run).
        #[arg(long)]
        execute: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Delete a group without active members and its committed offsets.
    Delete {
        /// Group id.
        group: String,
        #[command(flatten)]
        conn: Conn,
    },
}

/// Where `weir group reset` moves the offsets (exactly one).
#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
struct ResetTo {
    /// To the log start.
    #[arg(long)]
    to_earliest: bool,
    /// To the log end.
    #[arg(long)]
    to_latest: bool,
    /// To this offset (clamped to the log's range).
    #[arg(long, value_name = "N")]
    to_offset: Option<u64>,
    /// To the first record at or after this RFC 3339 UTC time (through the
    /// time index; the log end if every record is older).
    #[arg(long, value_name = "RFC3339")]
    to_datetime: Option<String>,
    /// By ±N from the committed offset (clamped to the log's range).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    shift_by: Option<i64>,
}

fn parse_datetime(s: &str) -> Result<i64> {
    match s.parse::<StartAt>() {
        Ok(StartAt::Timestamp(ms)) => Ok(ms),
        _ => bail!("`{s}` is not an RFC 3339 UTC time like 2024-01-15T10:00:00Z"),
    }
}

/// Runs `weir group …`.
pub fn group(args: GroupArgs) -> Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        match args.command {
            GroupCommand::List { conn } => {
                let groups = connect(&conn).await?.list_groups().await?;
                let mut rows = vec![["GROUP", "STATE", "MEMBERS", "ASSIGNOR"]
                    .map(String::from)
                    .to_vec()];
                for g in groups {
                    rows.push(vec![g.group, g.state, g.members.to_string(), g.assignor]);
                }
                print!("{}", table(&rows));
            }
            GroupCommand::Describe { group, conn } => {
                let c = connect(&conn).await?;
                let d = c.describe_group(&group).await?;
                let lag = c
                    .group_lag(&d, weir_storage::Clock::now_ms(&weir_storage::SystemClock))
                    .await?;
                print!("{}", describe_group_text(&d, &lag));
            }
            GroupCommand::Reset {
                group,
                topic,
                to,
                share,
                execute,
                conn,
            } => {
                let c = connect(&conn).await?;
                reset(&c, &group, &topic, &to, share, execute).await?;
            }
            GroupCommand::Delete { group, conn } => {
                connect(&conn).await?.delete_group(&group).await?;
                println!("deleted group {group}");
            }
        }
        Ok(())
    })
}

/// `weir group describe`'s output.
fn describe_group_text(
    d: &weir_proto::messages::DescribeGroupResponse,
    lag: &[weir_client::PartitionLag],
) -> String {
    let mut out = format!(
        "Group: {}\nType: {}\nState: {}\nGroup epoch: {}\nAssignment epoch: {}\nAssignor: {}\n\
         Coordinator core: {}\nMembers: {}\n",
        d.group,
        d.kind,
        d.state,
        d.generation,
        d.assignment_epoch,
        if d.assignor.is_empty() {
            "-"
        } else {
            &d.assignor
        },
        d.coordinator_core,
        d.members.len()
    );
    let list = |tps: &[weir_proto::messages::TopicPartitions]| {
        let parts: Vec<String> = tps
            .iter()
            .flat_map(|t| t.partitions.iter().map(move |p| format!("{}-{p}", t.topic)))
            .collect();
        if parts.is_empty() {
            "-".to_string()
        } else {
            parts.join(",")
        }
    };
    if !d.members.is_empty() {
        let mut rows = vec![[
            "CONSUMER-ID",
            "CLIENT-ID",
            "EPOCH",
            "TOPICS",
            "ASSIGNED",
            "REVOKING",
            "TARGET",
        ]
        .map(String::from)
        .to_vec()];
        for m in &d.members {
            rows.push(vec![
                m.member_id.clone(),
                m.client_id.clone(),
                m.member_epoch.to_string(),
                m.topics.join(","),
                list(&m.owned),
                list(&m.revoking),
                list(&m.assignment),
            ]);
        }
        out.push('\n');
        out.push_str(&table(&rows));
    }
    let mut rows = vec![[
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "LAG-SECONDS",
        "CONSUMER-ID",
    ]
    .map(String::from)
    .to_vec()];
    for l in lag {
        rows.push(vec![
            l.topic.clone(),
            l.partition.to_string(),
            l.committed.map_or("-".into(), |c| c.to_string()),
            l.log_end.to_string(),
            l.lag.to_string(),
            format!("{:.1}", l.lag_seconds),
            l.consumer.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    out.push('\n');
    out.push_str(&table(&rows));
    out
}

/// `weir group reset`: computes the plan, prints it, applies it with
/// `execute` — a consumer group's committed offsets, or (`share`) a share
/// group's share-partition starts.
async fn reset(
    c: &Client,
    group: &str,
    topic: &str,
    to: &ResetTo,
    share: bool,
    execute: bool,
) -> Result<()> {
    match c.describe_group(group).await {
        Ok(d) if !d.members.is_empty() => bail!(
            "group `{group}` has {} active members: stop them before resetting its offsets",
            d.members.len()
        ),
        Ok(d) if share && d.kind != "share" => {
            bail!("group `{group}` is a consumer group, not a share group: leave out --share")
        }
        Ok(d) if !share && d.kind == "share" => {
            bail!("group `{group}` is a share group: add --share")
        }
        Ok(_) => {}
        Err(e) if e.code() == Some(weir_proto::error_code::ErrorCode::GroupIdNotFound) => {}
        Err(e) => return Err(e.into()),
    }
    let count = c.topic_metadata(topic).await?.partitions.len() as u32;
    // Where each partition is now: the committed offset, or the share
    // partition's stored start.
    let old: Vec<Option<u64>> = if share {
        let all = (0..count)
            .map(|partition| ShareStartChange {
                partition,
                start: None,
            })
            .collect();
        share_starts(topic, c.alter_share_offsets(group, topic, all, true).await?)?
    } else {
        let committed = c.committed_offsets(group, None).await?;
        (0..count)
            .map(|p| {
                committed
                    .iter()
                    .find(|o| o.topic == topic && o.partition == p)
                    .map(|o| o.offset)
            })
            .collect()
    };
    let datetime = to.to_datetime.as_deref().map(parse_datetime).transpose()?;
    let mut rows = vec![["TOPIC", "PARTITION", "OLD", "NEW"]
        .map(String::from)
        .to_vec()];
    let mut plan = Vec::new();
    for (p, old) in (0..count).zip(old) {
        let start = c
            .list_offsets(topic, p, OffsetSpec::Earliest)
            .await?
            .unwrap_or(0);
        let end = c
            .list_offsets(topic, p, OffsetSpec::Latest)
            .await?
            .unwrap_or(0);
        let new = if to.to_earliest {
            start
        } else if to.to_latest {
            end
        } else if let Some(n) = to.to_offset {
            n.clamp(start, end)
        } else if let Some(ms) = datetime {
            c.list_offsets(topic, p, OffsetSpec::Timestamp(ms))
                .await?
                .unwrap_or(end)
        } else if let Some(d) = to.shift_by {
            let base = old.unwrap_or(start) as i128;
            (base + d as i128).clamp(start as i128, end as i128) as u64
        } else {
            bail!("say where to: --to-earliest, --to-latest, --to-offset, --to-datetime or --shift-by");
        };
        rows.push(vec![
            topic.to_string(),
            p.to_string(),
            old.map_or("-".into(), |o| o.to_string()),
            new.to_string(),
        ]);
        plan.push((p, new));
    }
    print!("{}", table(&rows));
    if !execute {
        println!("dry run: nothing changed (add --execute to apply)");
        return Ok(());
    }
    if share {
        let changes = plan
            .into_iter()
            .map(|(partition, start)| ShareStartChange {
                partition,
                start: Some(start),
            })
            .collect();
        share_starts(
            topic,
            c.alter_share_offsets(group, topic, changes, false).await?,
        )?;
        println!("share-partition starts of share group {group} reset");
    } else {
        let offsets = plan
            .into_iter()
            .map(|(partition, offset)| CommitOffset {
                topic: topic.to_string(),
                partition,
                offset,
                metadata: None,
            })
            .collect();
        c.commit_offsets(group, "", -1, offsets).await?;
        println!("offsets of group {group} reset");
    }
    Ok(())
}

/// The stored starts an AlterShareOffsets answered, or its first
/// partition's refusal.
fn share_starts(
    topic: &str,
    answered: Vec<weir_proto::messages::ShareStartResult>,
) -> Result<Vec<Option<u64>>> {
    answered
        .into_iter()
        .map(|r| match r.error {
            0 => Ok(r.old_start),
            e => bail!(
                "{topic}-{}: {}",
                r.partition,
                r.message.unwrap_or_else(|| format!("error {e}"))
            ),
        })
        .collect()
}

/// Whether writing stdout failed because the reader went away (e.g.
/// `weir consume … | head`): not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(name: &str, parts: &[(&[u64], &[u64])]) -> weir_proto::messages::TopicConfigs {
        weir_proto::messages::TopicConfigs {
            name: name.into(),
            error: 0,
            configs: Vec::new(),
            partitions: parts
                .iter()
                .enumerate()
                .map(
                    |(i, (replicas, target))| weir_proto::messages::PartitionDescription {
                        partition: i as u32,
                        core: 0,
                        log_start_offset: 0,
                        log_end_offset: 0,
                        size_bytes: 0,
                        local_log_start_offset: 0,
                        remote_bytes: 0,
                        remote_segments: 0,
                        leader: replicas[0],
                        leader_epoch: 0,
                        replicas: replicas.to_vec(),
                        isr: replicas.to_vec(),
                        target: target.to_vec(),
                        here: false,
                    },
                )
                .collect(),
        }
    }

    #[test]
    fn a_drain_spreads_the_replicas_over_the_least_loaded_nodes_in_place() {
        let t = topic(
            "t",
            &[
                (&[3, 1], &[]),
                (&[1, 3], &[]),
                (&[1, 2], &[]),
                (&[2, 3, 5], &[2, 3, 4]),
            ],
        );
        let plan = drain_plan(&[t], &[1, 2, 3, 4], 3).unwrap();
        // Loads: node 1 three, node 2 two, node 4 none.
        assert_eq!(
            plan,
            vec![
                ("t".to_string(), 0, vec![4, 1]),
                // Node 4 has one now, still fewer than node 2.
                ("t".to_string(), 1, vec![1, 4]),
                // A move under way is planned from its target; only node
                // 1 holds none of it.
                ("t".to_string(), 3, vec![2, 1, 4]),
            ]
        );
        let e = drain_plan(&[topic("u", &[(&[1, 2], &[])])], &[1, 2], 2).unwrap_err();
        assert!(e.to_string().contains("no live node left"), "{e}");
    }

    #[test]
    fn start_at_parses() {
        assert_eq!("earliest".parse(), Ok(StartAt::Earliest));
        assert_eq!("latest".parse(), Ok(StartAt::Latest));
        assert_eq!("42".parse(), Ok(StartAt::Offset(42)));
        assert_eq!(
            "2024-01-15T10:00:00Z".parse(),
            Ok(StartAt::Timestamp(1_705_312_800_000))
        );
        assert!("yesterday".parse::<StartAt>().is_err());
        assert!("-1".parse::<StartAt>().is_err());
    }

    #[test]
    fn formats() {
        let f = parse_format("%p %o\\t%k=%v %T %t %%\\n\\x").unwrap();
        let mut out = Vec::new();
        let r = Printed {
            topic: "t",
            partition: 3,
            offset: 17,
            timestamp: 99,
            key: None,
            value: Some(b"v"),
        };
        write_record(&mut out, &f, &r).unwrap();
        assert_eq!(out, b"3 17\t=v 99 t %\n\\x\n");
        assert!(parse_format("%q").is_err());
        assert!(parse_format("50%").is_err());
        assert_eq!(parse_format("%v").unwrap(), vec![Piece::Value]);
    }

    #[test]
    fn compression_flags_parse() {
        assert_eq!(parse_compression("lz4"), Ok(ProducerCompression::Lz4));
        assert_eq!(
            parse_compression("zstd:9"),
            Ok(ProducerCompression::Zstd { level: 9 })
        );
        assert!(parse_compression("gzip").is_err());
    }

    #[test]
    fn config_pairs() {
        assert_eq!(
            parse_config("retention.ms=5=6"),
            Ok(("retention.ms".into(), "5=6".into()))
        );
        assert!(parse_config("=x").is_err());
        assert!(parse_config("novalue").is_err());
    }

    #[test]
    fn finds_separators() {
        assert_eq!(find(b"k::v::w", b"::"), Some(1));
        assert_eq!(find(b"kv", b"::"), None);
        assert_eq!(find(b"kv", b""), None);
    }
}
