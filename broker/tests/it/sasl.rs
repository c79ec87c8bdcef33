//! SASL on the Kafka listener (`SASL_PLAINTEXT://`, `SASL_SSL://`): users
//! made with `weir user`; unchanged clients (kcat on Debian's librdkafka
//! 2.0, confluent-kafka, kafka-python, aiokafka) log in with SCRAM and
//! PLAIN, and a wrong password is their authentication error; nothing is
//! served before a login; a stalled, oversized or replayed login is closed
//! and counted while other clients go on; users survive a restart.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    MetadataRequest, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use weir_proto::sasl::{Mechanism, ScramClient};
use weir_testkit::{wait_until, Node};

use crate::common;
use crate::tls::Pki;

pub(crate) const PASSWORD: &str = "correct horse";

/// A broker whose Kafka listener is `kafka` (`SASL_PLAINTEXT://…` or
/// `SASL_SSL://…`), its native listener plaintext on loopback (for `weir
/// user`), logins due within `login_timeout_ms`.
fn start(dir: &Path, kafka: &str, tls: Option<(&Path, &Path)>, login_timeout_ms: u64) -> Node {
    start_with(dir, kafka, tls, login_timeout_ms, "")
}

/// [`start`] with more lines of the config file.
pub(crate) fn start_with(
    dir: &Path,
    kafka: &str,
    tls: Option<(&Path, &Path)>,
    login_timeout_ms: u64,
    extra: &str,
) -> Node {
    let config = dir.join("weir.toml");
    // The native listener: plaintext on loopback unless `extra` says.
    let mut text = if extra.lines().any(|l| l.starts_with("listen ")) {
        String::new()
    } else {
        "listen = \"127.0.0.1:0\"\n".to_string()
    };
    text += &format!(
        "core_port_base = 0\nmetrics_listen = \"127.0.0.1:0\"\n\
         kafka_listener = \"{kafka}\"\nsasl_login_timeout_ms = {login_timeout_ms}\n\
         auto_create_topics = false\ngroup_initial_rebalance_delay_ms = 0\n"
    );
    if let Some((cert, key)) = tls {
        text += &format!("ssl_certificate_file = {cert:?}\nssl_key_file = {key:?}\n");
    }
    text += extra;
    std::fs::write(&config, text).unwrap();
    Node::builder(env!("CARGO_BIN_EXE_weir"))
        .data_dir(dir.join("data"))
        .cores(2)
        .config(&config)
        .env("WEIR_LOG", "info")
        .log_to(dir.join("broker.log"))
        .start()
}

/// `weir user add NAME` with [`PASSWORD`].
pub(crate) fn add_user(node: &Node, dir: &Path, name: &str) {
    let file = dir.join("password");
    std::fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    let out = common::weir_at(
        node.listen,
        &[
            "user",
            "add",
            name,
            "--password-file",
            file.to_str().unwrap(),
        ],
        b"",
    );
    assert!(
        out.status.success(),
        "weir user add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn failures(node: &Node) -> f64 {
    common::metric(node.metrics, "weir_sasl_authentication_failures_total")
}

/// Waits until the failed logins counted pass `n`.
fn counted(node: &Node, n: f64) {
    wait_until(
        Instant::now() + Duration::from_secs(10),
        "a failed login counted",
        || match failures(node) {
            now if now >= n => Ok(()),
            now => Err(format!("weir_sasl_authentication_failures_total {now}")),
        },
    );
}

fn kcat(node: &Node, mechanism: &str, password: &str, args: &[&str], stdin: &[u8]) -> Output {
    let settings = [
        "security.protocol=SASL_PLAINTEXT".to_string(),
        format!("sasl.mechanism={mechanism}"),
        "sasl.username=agent".into(),
        format!("sasl.password={password}"),
    ];
    let mut all: Vec<&str> = settings.iter().flat_map(|s| ["-X", s.as_str()]).collect();
    all.extend_from_slice(args);
    common::kcat(node.kafka, &all, stdin)
}

#[test]
fn kcat_logs_in_with_scram_and_plain_and_a_wrong_password_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), "SASL_PLAINTEXT://127.0.0.1:0", None, 10_000);
    add_user(&node, dir.path(), "agent");
    let listed = common::weir_at(node.listen, &["user", "list"], b"");
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(
        listed.contains("agent") && listed.contains("SCRAM-SHA-512 (8192 iterations)"),
        "{listed}"
    );
    let mut native = common::Client::connect(node.listen);
    assert_eq!(native.create_topic("logs", 2, &[]).error, 0);

    // librdkafka 2.0 (its SCRAM sends the client nonce twice: accepted).
    let out = kcat(
        &node,
        "SCRAM-SHA-256",
        PASSWORD,
        &["-P", "-t", "logs"],
        b"one\ntwo\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for mechanism in ["SCRAM-SHA-512", "PLAIN"] {
        let out = kcat(
            &node,
            mechanism,
            PASSWORD,
            &["-C", "-t", "logs", "-o", "beginning", "-e", "-q"],
            b"",
        );
        let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect();
        got.sort();
        assert_eq!(
            got,
            ["one", "two"],
            "{mechanism}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let before = failures(&node);
    let out = kcat(&node, "SCRAM-SHA-512", "wrong", &["-L", "-m", "3"], b"");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Authentication failed"), "{err}");
    counted(&node, before + 1.0);
    assert!(
        std::fs::read_to_string(dir.path().join("broker.log"))
            .unwrap()
            .contains("SASL authentication failed peer=127.0.0.1:"),
        "the failure is logged with the client's address"
    );

    // The user survives a restart; removed, it can no longer log in.
    node.stop();
    let node = start(dir.path(), "SASL_PLAINTEXT://127.0.0.1:0", None, 10_000);
    let out = kcat(&node, "SCRAM-SHA-512", PASSWORD, &["-L", "-m", "10"], b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = common::weir_at(node.listen, &["user", "remove", "agent"], b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kcat(&node, "PLAIN", PASSWORD, &["-L", "-m", "3"], b"");
    assert!(!out.status.success(), "a removed user logged in");
}

use common::kafka_frame as frame;

pub(crate) fn body<M: Encodable>(m: &M, version: i16) -> Vec<u8> {
    let mut b = BytesMut::new();
    m.encode(&mut b, version).unwrap();
    b.to_vec()
}

/// The next answer's body (after the size and correlation id), or `None`
/// once the broker closed the connection.
pub(crate) fn answer(s: &mut TcpStream) -> Option<Bytes> {
    let mut size = [0u8; 4];
    s.read_exact(&mut size).ok()?;
    let mut b = vec![0u8; i32::from_be_bytes(size) as usize];
    s.read_exact(&mut b).ok()?;
    Some(Bytes::from(b).slice(4..))
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn handshake(s: &mut TcpStream, mechanism: &str) {
    let mut r = SaslHandshakeRequest::default();
    r.mechanism = StrBytes::from_string(mechanism.into());
    s.write_all(&frame(17, 1, 1, &body(&r, 1))).unwrap();
    let resp = SaslHandshakeResponse::decode(&mut answer(s).unwrap(), 1).unwrap();
    assert_eq!(resp.error_code, 0, "{mechanism}");
}

/// One SaslAuthenticate (v1) step; `None` if the connection was closed
/// without an answer.
fn authenticate(s: &mut TcpStream, token: &[u8]) -> Option<SaslAuthenticateResponse> {
    let mut r = SaslAuthenticateRequest::default();
    r.auth_bytes = Bytes::copy_from_slice(token);
    s.write_all(&frame(36, 1, 2, &body(&r, 1))).ok()?;
    Some(SaslAuthenticateResponse::decode(&mut answer(s)?, 1).unwrap())
}

/// Whether the broker closed `s` (a read sees the end, not an answer).
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

/// A Metadata request (v1) answered on `s`.
pub(crate) fn metadata_answered(s: &mut TcpStream) -> bool {
    let mut m = MetadataRequest::default();
    m.topics = None;
    s.write_all(&frame(3, 1, 9, &body(&m, 1))).is_ok() && answer(s).is_some()
}

/// A SCRAM-SHA-256 login on a new connection; the connection and the
/// client's two messages (for replaying).
pub(crate) fn scram_login(addr: SocketAddr) -> (TcpStream, Vec<u8>, Vec<u8>) {
    let mut s = connect(addr);
    handshake(&mut s, "SCRAM-SHA-256");
    let (mut client, first) = ScramClient::start(Mechanism::ScramSha256, "agent", PASSWORD);
    let r = authenticate(&mut s, &first).unwrap();
    assert_eq!(r.error_code, 0);
    let last = client.server_first(&r.auth_bytes).unwrap();
    let r = authenticate(&mut s, &last).unwrap();
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    client.server_final(&r.auth_bytes).unwrap();
    (s, first, last)
}

#[test]
fn nothing_is_served_before_a_login_and_bad_logins_are_closed_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), "SASL_PLAINTEXT://127.0.0.1:0", None, 1_000);
    add_user(&node, dir.path(), "agent");
    let addr = node.kafka;
    // A client that logged in, kept open throughout: it is served after
    // every bad connection below.
    let (mut good, first, last) = scram_login(addr);
    assert!(metadata_answered(&mut good));

    let mut n = failures(&node);
    // A request before logging in: closed unanswered.
    let mut s = connect(addr);
    assert!(!metadata_answered(&mut s), "served before a login");
    n += 1.0;
    counted(&node, n);

    // A login that never finishes: closed at the deadline (1 s here).
    let mut s = connect(addr);
    handshake(&mut s, "SCRAM-SHA-512");
    let t0 = Instant::now();
    assert!(closed(&mut s));
    let waited = t0.elapsed();
    assert!(waited < Duration::from_secs(10), "closed after {waited:?}");
    n += 1.0;
    counted(&node, n);
    assert!(metadata_answered(&mut good));

    // An oversized token: refused, closed.
    let mut s = connect(addr);
    handshake(&mut s, "SCRAM-SHA-256");
    let r = authenticate(&mut s, &vec![b'n'; 64 * 1024]).unwrap();
    assert_eq!(r.error_code, 58, "SASL_AUTHENTICATION_FAILED");
    assert!(closed(&mut s));
    n += 1.0;
    counted(&node, n);

    // A captured login replayed: the server's nonce differs, so the
    // captured proof is refused.
    let mut s = connect(addr);
    handshake(&mut s, "SCRAM-SHA-256");
    assert_eq!(authenticate(&mut s, &first).unwrap().error_code, 0);
    let r = authenticate(&mut s, &last).unwrap();
    assert_eq!(r.error_code, 58, "a replayed login");
    assert!(closed(&mut s));
    n += 1.0;
    counted(&node, n);

    // Garbage as the first token, and a mechanism not offered.
    let mut s = connect(addr);
    handshake(&mut s, "SCRAM-SHA-256");
    assert_eq!(
        authenticate(&mut s, b"\xff\x00garbage").unwrap().error_code,
        58
    );
    let mut s = connect(addr);
    let mut r = SaslHandshakeRequest::default();
    r.mechanism = StrBytes::from_static_str("GSSAPI");
    s.write_all(&frame(17, 1, 1, &body(&r, 1))).unwrap();
    let resp = SaslHandshakeResponse::decode(&mut answer(&mut s).unwrap(), 1).unwrap();
    assert_eq!(resp.error_code, 33, "UNSUPPORTED_SASL_MECHANISM");
    let offered: Vec<&str> = resp.mechanisms.iter().map(|m| m.as_str()).collect();
    assert_eq!(offered, ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]);

    // The good client was never disturbed, and a new one logs in.
    assert!(metadata_answered(&mut good));
    let (mut again, _, _) = scram_login(addr);
    assert!(metadata_answered(&mut again));
}

/// One Python client over SASL_SSL with SCRAM-SHA-512: produces and reads
/// in a group; with a wrong password, its own authentication error.
fn python_client_over_sasl_ssl(client: &str) {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign("server", "weir", true);
    let node = start(
        dir.path(),
        "SASL_SSL://127.0.0.1:0",
        Some((&cert, &key)),
        10_000,
    );
    add_user(&node, dir.path(), "agent");
    let topic = format!("sasl-{client}");
    let mut native = common::Client::connect(node.listen);
    assert_eq!(native.create_topic(&topic, 2, &[]).error, 0);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/tls_clients.py");
    let run = |password: &str, expect: &str| {
        common::client_program(crate::kafka_clients::python())
            .arg(&script)
            .args([client, &node.kafka.to_string(), &topic])
            .arg(pki.ca("ca"))
            .args(["-", "-"])
            .env("WEIR_SASL", format!("SCRAM-SHA-512:agent:{password}"))
            .env("WEIR_EXPECT", expect)
            .output()
            .unwrap()
    };
    let out = run(PASSWORD, "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("\"ok\": true"),
        "{client}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run("wrong", "auth-failure");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("\"auth_error\": true"),
        "{client} with a wrong password: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn confluent_kafka_over_sasl_ssl_with_scram() {
    python_client_over_sasl_ssl("confluent");
}

#[test]
fn kafka_python_over_sasl_ssl_with_scram() {
    python_client_over_sasl_ssl("kafka-python");
}

#[test]
fn aiokafka_over_sasl_ssl_with_scram() {
    python_client_over_sasl_ssl("aiokafka");
}

#[test]
fn the_cli_and_sdk_log_in_on_a_sasl_native_listener() {
    let dir = tempfile::tempdir().unwrap();
    // Users are made through a plaintext native listener, then the node
    // restarts with SASL on it (users live in the metadata).
    let node = start(dir.path(), "127.0.0.1:0", None, 10_000);
    add_user(&node, dir.path(), "agent");
    node.stop();
    let node = start_with(
        dir.path(),
        "PLAINTEXT://127.0.0.1:0",
        None,
        2_000,
        "listen = \"SASL_PLAINTEXT://127.0.0.1:0\"\n",
    );
    let props = |mechanism: &str, password: &str| {
        let file = dir
            .path()
            .join(format!("{mechanism}-{password}.properties"));
        std::fs::write(
            &file,
            format!(
                "security.protocol=SASL_PLAINTEXT\nsasl.mechanism={mechanism}\n\
                 sasl.username=agent\nsasl.password={password}\n"
            ),
        )
        .unwrap();
        file.to_str().unwrap().to_string()
    };
    let weir = |args: &[&str], stdin: &[u8]| common::weir_at(node.listen, args, stdin);
    let good = props("SCRAM-SHA-512", PASSWORD);
    let out = weir(
        &[
            "topic",
            "create",
            "sdk-logs",
            "--partitions",
            "2",
            "--command-config",
            &good,
        ],
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plain = props("PLAIN", PASSWORD);
    let out = weir(
        &["produce", "sdk-logs", "--command-config", &plain],
        b"a\nb\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sha256 = props("SCRAM-SHA-256", PASSWORD);
    let out = weir(
        &[
            "consume",
            "sdk-logs",
            "--timeout-ms",
            "500",
            "--command-config",
            &sha256,
        ],
        b"",
    );
    let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    got.sort();
    assert_eq!(got, ["a", "b"], "{}", String::from_utf8_lossy(&out.stderr));
    // A wrong password, and no login at all: refused, with the reason.
    let bad = props("SCRAM-SHA-512", "wrong");
    let out = weir(&["topic", "list", "--command-config", &bad], b"");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("SASL authentication failed"),
        "{err}"
    );
    let out = weir(&["topic", "list"], b"");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "served without a login: {err}");
}

/// KIP-368: with logins that expire after 1.5 s, librdkafka logs in again
/// on the connections it has (more logins than connections) and a
/// producer running for 5 s loses nothing.
#[test]
fn confluent_kafka_reauthenticates_before_its_login_expires() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_with(
        dir.path(),
        "SASL_PLAINTEXT://127.0.0.1:0",
        None,
        10_000,
        "connections_max_reauth_ms = 1500\n",
    );
    add_user(&node, dir.path(), "agent");
    let mut native = common::Client::connect(node.listen);
    assert_eq!(native.create_topic("reauth", 1, &[]).error, 0);
    let logins = || common::metric(node.metrics, "weir_sasl_authentications_total");
    let connections = || common::metric(node.metrics, "weir_connections_total");
    let (logins0, connections0) = (logins(), connections());
    let stdout = crate::kafka_clients::python_script(
        "reauth.py",
        &[&node.kafka.to_string(), "reauth", "agent", PASSWORD, "5"],
    );
    let (relogins, opened) = (logins() - logins0, connections() - connections0);
    assert!(
        relogins > opened,
        "{relogins} logins on {opened} connections: no re-authentication ({stdout})"
    );
}

/// KIP-368 in the SDK: with logins that expire after 1.5 s, an SDK client
/// producing for 5 s logs in again on its connection before each expiry
/// (more logins than connections) and no request fails.
#[test]
fn the_sdk_reauthenticates_before_its_login_expires() {
    use weir_client::{Acks, Client, ClientConfig, SecurityProtocol};

    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), "127.0.0.1:0", None, 10_000);
    add_user(&node, dir.path(), "agent");
    let mut plain = common::Client::connect(node.listen);
    assert_eq!(plain.create_topic("renewed", 1, &[]).error, 0);
    node.stop();
    let node = start_with(
        dir.path(),
        "PLAINTEXT://127.0.0.1:0",
        None,
        10_000,
        "listen = \"SASL_PLAINTEXT://127.0.0.1:0\"\nconnections_max_reauth_ms = 1500\n",
    );
    let logins = || common::metric(node.metrics, "weir_sasl_authentications_total");
    let connections = || common::metric(node.metrics, "weir_connections_total");
    let (logins0, connections0) = (logins(), connections());
    let mut config = ClientConfig::default();
    config.security_protocol = SecurityProtocol::SaslPlaintext;
    config.sasl_mechanism = Some(Mechanism::ScramSha512);
    config.sasl_username = Some("agent".into());
    config.sasl_password = Some(PASSWORD.into());
    common::runtime().block_on(async {
        let c = Client::connect_with(node.listen, config).await.unwrap();
        let t0 = Instant::now();
        let mut sent = 0;
        while t0.elapsed() < Duration::from_secs(5) && sent < 500 {
            let batch = common::records_batch("r", 1, 1_700_000_000_000);
            c.produce("renewed", 0, batch.freeze(), Acks::Leader)
                .await
                .unwrap_or_else(|e| panic!("produce {sent} failed: {e}"));
            sent += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let (relogins, opened) = (logins() - logins0, connections() - connections0);
    assert!(
        relogins > opened,
        "{relogins} logins on {opened} connections: the SDK did not re-authenticate"
    );
}
