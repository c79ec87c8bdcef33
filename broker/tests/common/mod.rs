//! A broker process on loopback and a minimal blocking client, for tests.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use weir_proto::frame::{self, RequestHeader, ResponseHeader};
use weir_proto::messages::Request;
// Each test binary uses some of these.
#[allow(unused_imports)]
pub use weir_testkit::{runtime, scrape, wait_until, Node};

/// A running `weir broker`: the testkit's [`Node`] (its addresses, its
/// process), started on loopback with every listener on a port the kernel
/// picks.
pub struct Broker(Node);

impl Broker {
    /// Starts a broker on free loopback ports over `dir` and waits for its
    /// ready line.
    pub fn start(dir: &Path, cores: usize) -> Broker {
        Self::start_with(dir, cores, &[])
    }

    /// [`Broker::start`] with more arguments of `weir broker`.
    pub fn start_with(dir: &Path, cores: usize, extra: &[&str]) -> Broker {
        Broker(
            Node::builder(env!("CARGO_BIN_EXE_weir"))
                .data_dir(dir)
                .cores(cores)
                .args(extra)
                .start(),
        )
    }

    /// [`Broker::start_with`] with environment variables set (the test
    /// hooks').
    pub fn start_with_env(
        dir: &Path,
        cores: usize,
        extra: &[&str],
        env: &[(&str, &Path)],
    ) -> Broker {
        let mut b = Node::builder(env!("CARGO_BIN_EXE_weir"))
            .data_dir(dir)
            .cores(cores)
            .args(extra);
        for (k, v) in env {
            b = b.env(k, v);
        }
        Broker(b.start())
    }

    /// [`Broker::start_with`], with the OTLP receivers on free ports.
    pub fn start_otlp(dir: &Path, cores: usize, extra: &[&str]) -> Broker {
        Broker::start_otlp_on(dir, cores, ("127.0.0.1:0", "127.0.0.1:0"), extra)
    }

    /// [`Broker::start_otlp`] with the OTLP receivers on the addresses
    /// given (gRPC, HTTP).
    pub fn start_otlp_on(
        dir: &Path,
        cores: usize,
        (grpc, http): (&str, &str),
        extra: &[&str],
    ) -> Broker {
        Broker(
            Node::builder(env!("CARGO_BIN_EXE_weir"))
                .data_dir(dir)
                .cores(cores)
                .otlp_listen(grpc, http)
                .args(extra)
                .start(),
        )
    }

    pub fn client(&self) -> Client {
        Client::connect(self.listen)
    }

    /// SIGTERM and a bounded wait; returns the exit status.
    pub fn stop(self) -> std::process::ExitStatus {
        self.0.stop()
    }

    /// SIGKILL and a bounded wait.
    pub fn kill(self) {
        self.0.kill()
    }
}

impl Deref for Broker {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.0
    }
}

impl DerefMut for Broker {
    fn deref_mut(&mut self) -> &mut Node {
        &mut self.0
    }
}

/// What a [`Client`] talks over: a TCP stream, or TLS over one.
pub trait Stream: Read + Write {}

impl<T: Read + Write> Stream for T {}

/// A blocking native-protocol client.
pub struct Client {
    pub stream: Box<dyn Stream>,
    corr: u32,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client::over(Box::new(stream))
    }

    /// A client over a connected stream (TLS, in the TLS tests).
    pub fn over(stream: Box<dyn Stream>) -> Client {
        Client { stream, corr: 0 }
    }

    /// Sends raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Reads one response frame.
    pub fn read_frame(&mut self) -> std::io::Result<Vec<u8>> {
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len)?;
        let n = u32::from_be_bytes(len) as usize;
        let mut buf = vec![0u8; 4 + n];
        buf[..4].copy_from_slice(&len);
        self.stream.read_exact(&mut buf[4..])?;
        Ok(buf)
    }

    /// Sends a request with a payload; returns the response header, body
    /// (or the frame-level error message) and payload.
    pub fn call<R: Request>(
        &mut self,
        req: &R,
        payload: &[&[u8]],
    ) -> (ResponseHeader, Result<R::Response, String>, Vec<u8>) {
        self.corr += 1;
        let h = RequestHeader::of::<R>(self.corr);
        let bytes = frame::encode_request_with_payload(&h, req, payload).unwrap();
        self.stream.write_all(&bytes).unwrap();
        let f = self.read_frame().unwrap();
        let (rh, body, pl) = frame::decode_response(&f).unwrap();
        assert_eq!(rh.correlation_id, self.corr);
        let body = if rh.error == weir_proto::error_code::ErrorCode::None {
            Ok(frame::decode_body::<R::Response>(body).unwrap())
        } else {
            Err(frame::decode_body::<weir_proto::messages::ErrorBody>(body)
                .map(|b| b.message)
                .unwrap_or_default())
        };
        (rh, body, pl.to_vec())
    }

    /// Sends a request and reads its answer; I/O errors (a dead broker) are
    /// returned, not panicked on. Frame-level errors are `InvalidData`.
    pub fn try_ok<R: Request>(
        &mut self,
        req: &R,
        payload: &[&[u8]],
    ) -> std::io::Result<R::Response> {
        self.corr += 1;
        let h = RequestHeader::of::<R>(self.corr);
        let bytes = frame::encode_request_with_payload(&h, req, payload).unwrap();
        self.stream.write_all(&bytes)?;
        let f = self.read_frame()?;
        let bad = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let (rh, body, _) = frame::decode_response(&f).map_err(|e| bad(e.to_string()))?;
        if rh.error != weir_proto::error_code::ErrorCode::None {
            return Err(bad(format!("{:?}", rh.error)));
        }
        frame::decode_body::<R::Response>(body).map_err(|e| bad(e.to_string()))
    }

    /// Creates topic `name` (replication factor 1) and returns its result
    /// (`error` 0: created).
    pub fn create_topic(
        &mut self,
        name: &str,
        partitions: u32,
        configs: &[(&str, &str)],
    ) -> weir_proto::messages::TopicResult {
        let req = weir_proto::messages::CreateTopicsRequest {
            topics: vec![weir_proto::messages::NewTopic {
                name: name.into(),
                partitions,
                configs: configs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                replication_factor: 1,
            }],
        };
        let (r, _) = self.ok(&req, &[]);
        r.topics.into_iter().next().expect("one topic result")
    }

    /// Like `call`, expecting success.
    pub fn ok<R: Request>(&mut self, req: &R, payload: &[&[u8]]) -> (R::Response, Vec<u8>) {
        let (h, b, p) = self.call(req, payload);
        match b {
            Ok(b) => (b, p),
            Err(m) => panic!("request failed: {:?}: {m}", h.error),
        }
    }
}

/// A batch of `n` records with values `prefix-i`.
pub fn records_batch(prefix: &str, n: usize, ts: i64) -> bytes::BytesMut {
    let mut b =
        weir_proto::builder::BatchBuilder::new(weir_proto::batch::Compression::None).unwrap();
    for i in 0..n {
        b.push(&weir_proto::record::RecordData {
            key: None,
            value: Some(bytes::Bytes::from(format!("{prefix}-{i}"))),
            headers: Vec::new(),
            timestamp: ts + i as i64,
        })
        .unwrap();
    }
    b.build().unwrap()
}

/// Values of every record in a payload of batches.
pub fn values(payload: &[u8]) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < payload.len() {
        let rb = weir_proto::reader::RecordBatch::parse(&payload[at..]).unwrap();
        at += rb.header().total_len();
        for r in rb.records().unwrap().iter() {
            let r = r.unwrap();
            out.push((
                r.offset as u64,
                String::from_utf8(r.record.value.unwrap().to_vec()).unwrap(),
            ));
        }
    }
    out
}

/// Runs `weir ARGS` against `b` (through `WEIR_BOOTSTRAP`), feeding `stdin`.
pub fn weir(b: &Broker, args: &[&str], stdin: &[u8]) -> std::process::Output {
    weir_at(b.listen, args, stdin)
}

/// [`weir`] against the native listener at `listen`.
pub fn weir_at(listen: SocketAddr, args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .env("WEIR_BOOTSTRAP", listen.to_string())
        .env("WEIR_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run weir");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

/// A program that is not Weir's (a Kafka client: kcat, Python, Go), to be
/// run without `LD_LIBRARY_PATH`: `cargo test --workspace` puts there the
/// native library directories of every crate it built — among them the
/// librdkafka `weir-bench` builds from source, without zlib — and a
/// system client would load that one instead of its own ("zlib not
/// available at build time").
pub fn client_program(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    c.env_remove("LD_LIBRARY_PATH");
    c
}

/// A raw Kafka connection, for tests that need exact control of what
/// shares a connection and of the versions sent.
pub struct KafkaConn {
    pub s: TcpStream,
    pub corr: i32,
}

impl KafkaConn {
    pub fn connect(addr: SocketAddr) -> KafkaConn {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        KafkaConn { s, corr: 0 }
    }

    /// Sends a request without waiting for its answer.
    pub fn send<R>(&mut self, key: kafka_protocol::messages::ApiKey, version: i16, req: &R)
    where
        R: kafka_protocol::protocol::Encodable + kafka_protocol::protocol::HeaderVersion,
    {
        use kafka_protocol::protocol::Encodable;
        self.corr += 1;
        let header = kafka_protocol::messages::RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.corr)
            .with_client_id(Some(kafka_protocol::protocol::StrBytes::from_static_str(
                "test",
            )));
        let mut body = bytes::BytesMut::new();
        header
            .encode(&mut body, R::header_version(version))
            .unwrap();
        req.encode(&mut body, version).unwrap();
        self.s
            .write_all(&(body.len() as i32).to_be_bytes())
            .unwrap();
        self.s.write_all(&body).unwrap();
    }

    /// The next answer, decoded as `R` at `version`.
    pub fn read<R>(&mut self, version: i16) -> R
    where
        R: kafka_protocol::protocol::Decodable + kafka_protocol::protocol::HeaderVersion,
    {
        use kafka_protocol::protocol::Decodable;
        use std::io::Read;
        let mut size = [0u8; 4];
        self.s.read_exact(&mut size).unwrap();
        let mut frame = vec![0u8; i32::from_be_bytes(size) as usize];
        self.s.read_exact(&mut frame).unwrap();
        let mut b = bytes::Bytes::from(frame);
        kafka_protocol::messages::ResponseHeader::decode(&mut b, R::header_version(version))
            .unwrap();
        R::decode(&mut b, version).unwrap()
    }

    /// AlterShareGroupOffsets v0 of share group `group`: `topic`-`partition`'s
    /// start moved to `start`; the whole answer.
    pub fn alter_share_start(
        &mut self,
        group: &str,
        (topic, partition): (&str, i32),
        start: i64,
    ) -> kafka_protocol::messages::AlterShareGroupOffsetsResponse {
        use kafka_protocol::messages::alter_share_group_offsets_request::{
            AlterShareGroupOffsetsRequestPartition as Partition,
            AlterShareGroupOffsetsRequestTopic as Topic,
        };
        use kafka_protocol::messages::{AlterShareGroupOffsetsRequest, GroupId, TopicName};
        use kafka_protocol::protocol::StrBytes;
        let req = AlterShareGroupOffsetsRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_topics(vec![Topic::default()
                .with_topic_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![Partition::default()
                    .with_partition_index(partition)
                    .with_start_offset(start)])]);
        self.send(
            kafka_protocol::messages::ApiKey::AlterShareGroupOffsets,
            0,
            &req,
        );
        self.read(0)
    }

    /// Produce v9 of `data` to `topic`-0 with `acks` (as the
    /// transactional producer `transactional_id`, if given): the
    /// partition's error code.
    pub fn produce(
        &mut self,
        topic: &str,
        data: bytes::Bytes,
        acks: i16,
        transactional_id: Option<&str>,
    ) -> i16 {
        use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
        use kafka_protocol::messages::*;
        use kafka_protocol::protocol::StrBytes;
        let req = ProduceRequest::default()
            .with_transactional_id(
                transactional_id.map(|t| TransactionalId(StrBytes::from_string(t.into()))),
            )
            .with_acks(acks)
            .with_timeout_ms(5_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(topic.into())))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(data))])]);
        self.send(ApiKey::Produce, 9, &req);
        let r: ProduceResponse = self.read(9);
        r.responses[0].partition_responses[0].error_code
    }

    /// Metadata v12 of `topic`: each partition's (leader broker, leader
    /// epoch).
    pub fn leaders(&mut self, topic: &str) -> Vec<(i32, i32)> {
        use kafka_protocol::messages::{metadata_request::MetadataRequestTopic, *};
        let req =
            MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
                .with_name(Some(TopicName(
                    kafka_protocol::protocol::StrBytes::from_string(topic.into()),
                )))]));
        self.send(ApiKey::Metadata, 12, &req);
        let r: MetadataResponse = self.read(12);
        r.topics[0]
            .partitions
            .iter()
            .map(|p| (p.leader_id.0, p.leader_epoch))
            .collect()
    }
}

/// The sum of the samples in `text` (a `/metrics` page) whose line starts
/// with `prefix` (a family name with the start of its labels, e.g.
/// `weir_x_total{signal="traces"`).
pub fn samples(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// The sum over cores of one metric family's samples (it must be there).
pub fn metric(addr: SocketAddr, name: &str) -> f64 {
    let text = scrape(addr);
    let samples: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .collect();
    assert!(!samples.is_empty(), "no metric {name} in /metrics");
    samples.iter().sum()
}

/// A Kafka request frame: size prefix, header v1 (key, version,
/// correlation id, client id `test`), body.
pub fn kafka_frame(key: i16, version: i16, corr: i32, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&key.to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(&corr.to_be_bytes());
    f.extend_from_slice(&4i16.to_be_bytes());
    f.extend_from_slice(b"test");
    f.extend_from_slice(body);
    let mut out = (f.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&f);
    out
}

/// Debian's kcat against a Kafka listener, `stdin` fed to it; its output,
/// whatever its exit status.
pub fn kcat(kafka: SocketAddr, args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut child = client_program("kcat")
        .args(["-b", &kafka.to_string()])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("kcat: {e}: run `bash .ci/kafka-clients` (installs Debian's kcat)")
        });
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// One record batch of `values` (uncompressed, timestamp 1); of producer
/// `(id, epoch)` from sequence `seq`, transactional or not, if `producer`
/// is given.
pub fn batch_of_values(values: &[&str], producer: Option<(i64, i16, i32, bool)>) -> bytes::Bytes {
    let mut b =
        weir_proto::builder::BatchBuilder::new(weir_proto::batch::Compression::None).unwrap();
    if let Some((id, epoch, seq, transactional)) = producer {
        (
            b.producer_id,
            b.producer_epoch,
            b.base_sequence,
            b.transactional,
        ) = (id, epoch, seq, transactional);
    }
    for v in values {
        b.push(&weir_proto::record::RecordData {
            key: None,
            value: Some(bytes::Bytes::copy_from_slice(v.as_bytes())),
            headers: Vec::new(),
            timestamp: 1,
        })
        .unwrap();
    }
    b.finish().unwrap().freeze()
}
