//! The command-line tools: `weir topic …`, `weir produce`, `weir consume`.
//!
//! Each command talks to one broker listener (`--bootstrap`, env
//! `WEIR_BOOTSTRAP`) through `weir-client` on a tokio current-thread
//! runtime, and returns an error (printed by `main` as one line) on failure.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::{Args, Subcommand};
use weir_client::{Acks, Client};
use weir_proto::batch::Compression;
use weir_proto::builder::BatchBuilder;
use weir_proto::messages::{FetchPartition, OffsetSpec};
use weir_proto::reader::RecordBatch;
use weir_proto::record::RecordData;

/// Where to find the broker.
#[derive(Args, Debug, Clone)]
pub struct Conn {
    /// Broker listener to connect to (HOST:PORT).
    #[arg(long, env = "WEIR_BOOTSTRAP", default_value = "127.0.0.1:9292")]
    pub bootstrap: String,
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
    /// Write every record to this partition (default: by key, or
    /// round-robin per batch for records without a key).
    #[arg(long)]
    partition: Option<u32>,
    /// Split each line into key and value at the first SEP (a line without
    /// SEP is a record without key).
    #[arg(long, value_name = "SEP")]
    key_separator: Option<String>,
    /// Acknowledgement: 0 (none), 1 (appended) or all (durable).
    #[arg(long, default_value = "all")]
    acks: Acks,
    /// Records per batch (a batch is also closed at 1 MiB, and when stdin
    /// has no more buffered input).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    batch_records: u32,
    #[command(flatten)]
    conn: Conn,
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
    #[command(flatten)]
    conn: Conn,
}

fn parse_config(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got `{s}`")),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

async fn connect(conn: &Conn) -> Result<Client> {
    Client::connect(conn.bootstrap.as_str())
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
                configs,
                conn,
            } => {
                let c = connect(&conn).await?;
                c.create_topic(&name, partitions, configs).await?;
                println!("created topic {name} with {partitions} partitions");
            }
            TopicCommand::List { conn } => {
                for name in connect(&conn).await?.list_topics().await? {
                    println!("{name}");
                }
            }
            TopicCommand::Describe { name, conn } => {
                let t = connect(&conn).await?.describe_topic(&name).await?;
                print!("{}", describe_text(&t));
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
            TopicCommand::AddPartitions { name, total, conn } => {
                let c = connect(&conn).await?;
                c.create_partitions(&name, total).await?;
                println!("topic {name} now has {total} partitions");
            }
        }
        Ok(())
    })
}

/// `weir topic describe`'s output: the configs, then a table of partitions.
fn describe_text(t: &weir_proto::messages::TopicConfigs) -> String {
    let mut out = format!(
        "Topic: {}\nPartitions: {}\nConfigs:\n",
        t.name,
        t.partitions.len()
    );
    let width = t.configs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in &t.configs {
        out.push_str(&format!("  {k:<width$}  {v}\n"));
    }
    let mut rows = vec![["PARTITION", "CORE", "LOG-START", "LOG-END", "BYTES"].map(String::from)];
    for p in &t.partitions {
        rows.push([
            p.partition.to_string(),
            p.core.to_string(),
            p.log_start_offset.to_string(),
            p.log_end_offset.to_string(),
            p.size_bytes.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    for r in &rows {
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

// --- produce -----------------------------------------------------------------

/// A batch is closed at this size even before `--batch-records`.
const BATCH_BYTES_MAX: usize = 1 << 20;
/// Closed batches are sent once they add up to this many bytes (or count).
const SEND_BYTES: usize = 4 << 20;
const SEND_BATCHES: usize = 64;

/// The partition of a keyed record: Kafka's murmur2 partitioner, so keys
/// land where the Java client and librdkafka would put them.
fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    weir_client::partitioner::partition_for_key(key, partitions)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Turns records into batches per partition and sends them.
struct Producer<'c> {
    client: &'c Client,
    rt: &'c tokio::runtime::Runtime,
    topic: String,
    partitions: u32,
    fixed: Option<u32>,
    acks: Acks,
    batch_records: usize,
    /// Open batches of records whose partition is known (fixed or keyed).
    by_partition: HashMap<u32, BatchBuilder>,
    /// The open batch of records without key; its partition is chosen
    /// round-robin when it is closed.
    unkeyed: Option<BatchBuilder>,
    next_partition: u32,
    /// Closed batches not sent yet, with their record counts.
    ready: Vec<(String, u32, Bytes)>,
    ready_records: Vec<u64>,
    ready_bytes: usize,
    sent: u64,
    acked: u64,
    failed_batches: u64,
    total_batches: u64,
    first_error: Option<String>,
}

impl Producer<'_> {
    fn push(&mut self, key: Option<&[u8]>, value: &[u8]) -> Result<()> {
        let record = RecordData {
            key: key.map(Bytes::copy_from_slice),
            value: Some(Bytes::copy_from_slice(value)),
            headers: Vec::new(),
            timestamp: now_ms(),
        };
        let target = self
            .fixed
            .or_else(|| key.map(|k| partition_for_key(k, self.partitions)));
        let full =
            |b: &BatchBuilder, n: usize| b.len() >= n || b.estimated_size() >= BATCH_BYTES_MAX;
        match target {
            Some(p) => {
                let b = match self.by_partition.entry(p) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(BatchBuilder::new(Compression::None)?)
                    }
                };
                b.push(&record)?;
                if full(b, self.batch_records) {
                    self.close_partition(p)?;
                }
            }
            None => {
                let b = match &mut self.unkeyed {
                    Some(b) => b,
                    None => self.unkeyed.insert(BatchBuilder::new(Compression::None)?),
                };
                b.push(&record)?;
                if full(b, self.batch_records) {
                    self.close_unkeyed()?;
                }
            }
        }
        if self.ready_bytes >= SEND_BYTES || self.ready.len() >= SEND_BATCHES {
            self.send()?;
        }
        Ok(())
    }

    fn close(&mut self, partition: u32, b: BatchBuilder) -> Result<()> {
        if b.is_empty() {
            return Ok(());
        }
        let batch = b.build()?.freeze();
        self.ready_bytes += batch.len();
        self.ready_records.push(b.len() as u64);
        self.ready.push((self.topic.clone(), partition, batch));
        Ok(())
    }

    fn close_partition(&mut self, p: u32) -> Result<()> {
        match self.by_partition.remove(&p) {
            Some(b) => self.close(p, b),
            None => Ok(()),
        }
    }

    fn close_unkeyed(&mut self) -> Result<()> {
        let Some(b) = self.unkeyed.take() else {
            return Ok(());
        };
        let p = self.next_partition;
        self.next_partition = (p + 1) % self.partitions;
        self.close(p, b)
    }

    /// Closes every open batch and sends everything closed.
    fn flush(&mut self) -> Result<()> {
        let mut open: Vec<u32> = self.by_partition.keys().copied().collect();
        open.sort_unstable();
        for p in open {
            self.close_partition(p)?;
        }
        self.close_unkeyed()?;
        self.send()
    }

    fn send(&mut self) -> Result<()> {
        if self.ready.is_empty() {
            return Ok(());
        }
        let batches = std::mem::take(&mut self.ready);
        let counts = std::mem::take(&mut self.ready_records);
        self.ready_bytes = 0;
        let results = self
            .rt
            .block_on(self.client.produce_many(self.acks, batches))
            .with_context(|| format!("producing to {}", self.topic))?;
        for (r, n) in results.into_iter().zip(counts) {
            self.total_batches += 1;
            self.sent += n;
            match r {
                Ok(_) => self.acked += n,
                Err(e) => {
                    self.failed_batches += 1;
                    self.first_error.get_or_insert_with(|| e.to_string());
                }
            }
        }
        Ok(())
    }
}

/// The position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > hay.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Runs `weir produce`.
pub fn produce(args: ProduceArgs) -> Result<()> {
    let rt = runtime()?;
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
    let mut producer = Producer {
        client: &client,
        rt: &rt,
        topic: args.topic.clone(),
        partitions,
        fixed: args.partition,
        acks: args.acks,
        batch_records: args.batch_records as usize,
        by_partition: HashMap::new(),
        unkeyed: None,
        next_partition: 0,
        ready: Vec::new(),
        ready_records: Vec::new(),
        ready_bytes: 0,
        sent: 0,
        acked: 0,
        failed_batches: 0,
        total_batches: 0,
        first_error: None,
    };
    let sep = args.key_separator.as_deref().map(str::as_bytes);
    let mut input = BufReader::with_capacity(1 << 20, std::io::stdin().lock());
    let mut line = Vec::new();
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
            match sep.and_then(|s| find(&line, s).map(|i| (i, s.len()))) {
                Some((i, n)) => producer.push(Some(&line[..i]), &line[i + n..])?,
                None => producer.push(None, &line)?,
            }
            // Nothing more buffered: send what we have rather than wait for
            // a full batch (interactive input shows up promptly).
            if input.buffer().is_empty() {
                producer.flush()?;
            }
        }
        producer.flush()
    })();
    if args.acks == Acks::None {
        // Answers come in order, so once this one is in, the broker has
        // handled every produce request sent before it.
        if result.is_ok() {
            rt.block_on(client.api_versions())?;
        }
        eprintln!("{} records sent (acks=0: not acknowledged)", producer.sent);
    } else {
        eprintln!("{} records acknowledged", producer.acked);
    }
    result?;
    if producer.failed_batches > 0 {
        bail!(
            "{} of {} batches failed ({} records not acknowledged); first error: {}",
            producer.failed_batches,
            producer.total_batches,
            producer.sent - producer.acked,
            producer.first_error.unwrap_or_default()
        );
    }
    Ok(())
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

/// Bytes asked for per partition and per fetch.
const FETCH_PARTITION_BYTES: u32 = 1 << 20;
const FETCH_BYTES: u32 = 8 << 20;

/// Runs `weir consume`.
pub fn consume(args: ConsumeArgs) -> Result<()> {
    let format = parse_format(&args.format)?;
    let rt = runtime()?;
    let client = rt.block_on(connect(&args.conn))?;
    let topic = args.topic.as_str();
    let md = rt.block_on(client.topic_metadata(topic))?;
    let count = md.partitions.len() as u32;
    let partitions: Vec<u32> = match args.partition {
        Some(p) if p >= count => {
            bail!("--partition {p} is out of range: topic `{topic}` has {count} partitions")
        }
        Some(p) => vec![p],
        None => (0..count).collect(),
    };
    // The next offset to print, per partition.
    let mut next: Vec<u64> = Vec::with_capacity(partitions.len());
    for &p in &partitions {
        let spec = match args.from {
            StartAt::Offset(o) => {
                next.push(o);
                continue;
            }
            StartAt::Earliest => OffsetSpec::Earliest,
            StartAt::Latest => OffsetSpec::Latest,
            StartAt::Timestamp(ms) => OffsetSpec::Timestamp(ms),
        };
        let found = rt.block_on(client.list_offsets(topic, p, spec))?;
        let offset = match found {
            Some(o) => o,
            // Every record is older than the timestamp: start at the end.
            None => rt
                .block_on(client.list_offsets(topic, p, OffsetSpec::Latest))?
                .unwrap_or(0),
        };
        next.push(offset);
    }

    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    let idle = Duration::from_millis(args.timeout_ms);
    let max = args.max_records.unwrap_or(u64::MAX);
    let mut printed: u64 = 0;
    let mut last_progress = Instant::now();
    let mut progressed = true;
    let result = (|| -> Result<()> {
        while printed < max {
            // Poll without waiting while records flow; when a round brought
            // nothing, long-poll for the rest of the idle timeout.
            let wait = if progressed {
                0
            } else {
                let left = idle.saturating_sub(last_progress.elapsed());
                if left.is_zero() {
                    break;
                }
                u32::try_from(left.as_millis()).unwrap_or(u32::MAX).max(1)
            };
            let targets = partitions
                .iter()
                .zip(&next)
                .map(|(&partition, &offset)| FetchPartition {
                    topic: topic.to_string(),
                    partition,
                    offset,
                    max_bytes: FETCH_PARTITION_BYTES,
                })
                .collect();
            let results = rt.block_on(client.fetch_many(wait, FETCH_BYTES, targets))?;
            progressed = false;
            'partitions: for ((&partition, pos), r) in partitions.iter().zip(&mut next).zip(results)
            {
                for batch in r?.batches {
                    let rb = RecordBatch::parse(&batch)
                        .with_context(|| format!("batch of {topic}-{partition} at {pos}"))?;
                    let h = *rb.header();
                    if !h.attributes.is_control() {
                        let records = rb.records()?;
                        for rec in records.iter() {
                            let rec = rec?;
                            if rec.offset < *pos as i64 {
                                continue;
                            }
                            let shown = Printed {
                                topic,
                                partition,
                                offset: rec.offset,
                                timestamp: rec.timestamp,
                                key: rec.record.key,
                                value: rec.record.value,
                            };
                            write_record(&mut out, &format, &shown)?;
                            *pos = rec.offset as u64 + 1;
                            progressed = true;
                            printed += 1;
                            if printed >= max {
                                break 'partitions;
                            }
                        }
                    }
                    let after = (h.last_offset() + 1) as u64;
                    if after > *pos {
                        *pos = after;
                        progressed = true;
                    }
                }
            }
            out.flush()?;
            if progressed {
                last_progress = Instant::now();
            }
        }
        Ok(())
    })();
    let flushed = out.flush();
    match result.and(flushed.map_err(Into::into)) {
        Err(e) if is_broken_pipe(&e) => return Ok(()),
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    eprintln!("{printed} records consumed");
    Ok(())
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
    fn key_partitioning_is_stable() {
        // Kafka: toPositive(murmur2("foobar")) % 50 = 16.
        assert_eq!(partition_for_key(b"foobar", 50), 16);
        for k in [&b"x"[..], b"key-1", b"\xff"] {
            assert!(partition_for_key(k, 7) < 7);
        }
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
