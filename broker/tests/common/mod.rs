//! A broker process on loopback and a minimal blocking client, for tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weir_proto::frame::{self, RequestHeader, ResponseHeader};
use weir_proto::messages::Request;

/// A running `weir broker`.
pub struct Broker {
    pub child: Child,
    pub addr: SocketAddr,
    pub core_ports: Vec<u16>,
    pub metrics: SocketAddr,
    /// The Kafka listener.
    pub kafka: SocketAddr,
    /// Each core's own Kafka port (only its own partitions).
    pub kafka_core_ports: Vec<u16>,
    pub dir: PathBuf,
}

impl Broker {
    /// Starts a broker on free loopback ports over `dir` and waits for its
    /// ready line.
    pub fn start(dir: &Path, cores: usize) -> Broker {
        Self::start_with(dir, cores, &[])
    }

    pub fn start_with(dir: &Path, cores: usize, extra: &[&str]) -> Broker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args([
                "broker",
                "--data-dir",
                dir.to_str().unwrap(),
                "--cores",
                &cores.to_string(),
                "--listen",
                "127.0.0.1:0",
                "--core-port-base",
                "0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--kafka-listener",
                "127.0.0.1:0",
            ])
            .args(extra)
            .env("WEIR_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start weir broker");
        let out = child.stdout.take().unwrap();
        let mut lines = BufReader::new(out).lines();
        let deadline = Instant::now() + Duration::from_secs(60);
        let line = loop {
            match lines.next() {
                Some(Ok(l)) if l.starts_with("weir broker ready:") => break l,
                Some(Ok(_)) if Instant::now() < deadline => continue,
                other => panic!("broker did not become ready: {other:?}"),
            }
        };
        // weir broker ready: listen=127.0.0.1:P cores=N core_ports=[a, b] data_dir=...
        let field = |k: &str| {
            let i = line.find(k).unwrap() + k.len();
            line[i..].split_whitespace().next().unwrap().to_string()
        };
        let addr: SocketAddr = field("listen=").parse().unwrap();
        let metrics: SocketAddr = field("metrics=").parse().unwrap();
        let kafka: SocketAddr = field("kafka=").parse().unwrap();
        let ports = |k: &str| -> Vec<u16> {
            let i = line.find(k).unwrap() + k.len();
            let j = line[i..].find(']').unwrap() + i;
            line[i..j]
                .split(',')
                .map(|s| s.trim().parse().unwrap())
                .collect()
        };
        let core_ports = ports(" core_ports=[");
        let kafka_core_ports = ports("kafka_core_ports=[");
        // Keep draining stdout so the broker never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Broker {
            child,
            addr,
            core_ports,
            metrics,
            kafka,
            kafka_core_ports,
            dir: dir.to_path_buf(),
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        unsafe {
            libc_kill(self.child.id() as i32, 15);
        }
        let st = self.child.wait().unwrap();
        std::mem::forget(self);
        st
    }

    /// SIGKILL and wait.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        std::mem::forget(self);
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// A blocking native-protocol client.
pub struct Client {
    pub stream: TcpStream,
    corr: u32,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .env("WEIR_BOOTSTRAP", b.addr.to_string())
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

/// A tokio runtime for SDK clients in tests: 2 workers, like the machine.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `GET /metrics` from a broker's metrics address: the whole HTTP answer.
pub fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
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
