//! TLS on the client listeners (`SSL://`): unchanged Kafka clients (kcat on
//! Debian's librdkafka) and a native client over rustls produce and read;
//! client certificates when the listener requires them; plaintext and
//! garbage on a TLS port are closed and counted while other clients go on;
//! a new certificate is taken on SIGHUP without a restart.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use weir_testkit::{wait_until, Node};

use crate::common::{self, Client};

/// A CA and what it signed, as PEM files in a directory.
pub(crate) struct Pki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

fn ca_params(name: &str) -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.not_before = rcgen::date_time_ymd(2024, 1, 1);
    p.not_after = rcgen::date_time_ymd(2099, 1, 1);
    p
}

impl Pki {
    /// A new CA `name`, its certificate in `dir/<name>.pem`.
    pub(crate) fn new(dir: &Path, name: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = ca_params(name).self_signed(&key).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        Pki {
            dir: dir.to_path_buf(),
            issuer: Issuer::new(ca_params(name), key),
        }
    }

    pub(crate) fn ca(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pem"))
    }

    /// Signs a server certificate that names `dns` only (no IP address).
    pub(crate) fn sign_dns(&self, file: &str, dns: &str) -> (PathBuf, PathBuf) {
        let mut p = Self::params(dns);
        p.subject_alt_names = vec![SanType::DnsName(dns.try_into().unwrap())];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(file, p)
    }

    /// A leaf certificate's common settings, named `cn`.
    fn params(cn: &str) -> CertificateParams {
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.not_before = rcgen::date_time_ymd(2024, 1, 1);
        p.not_after = rcgen::date_time_ymd(2099, 1, 1);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p
    }

    /// Signs `p` with the CA; writes `<file>.pem` and `<file>.key`.
    fn issue(&self, file: &str, p: CertificateParams) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (
            self.dir.join(format!("{file}.pem")),
            self.dir.join(format!("{file}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    /// Signs a certificate: `server` for 127.0.0.1 and localhost, else a
    /// client named `cn`. Writes `<file>.pem` and `<file>.key`.
    pub(crate) fn sign(&self, file: &str, cn: &str, server: bool) -> (PathBuf, PathBuf) {
        let mut p = Self::params(cn);
        if server {
            p.subject_alt_names = vec![
                SanType::DnsName("localhost".try_into().unwrap()),
                SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            ];
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        } else {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
        self.issue(file, p)
    }
}

/// A broker whose native and Kafka listeners are both `SSL://`, with
/// `client_auth` and the CA at `ca`; its log goes to `log`.
fn start(dir: &Path, cert: &Path, key: &Path, ca: &Path, client_auth: &str) -> Node {
    start_with(
        dir,
        cert,
        key,
        ca,
        client_auth,
        "metrics_listen = \"127.0.0.1:0\"\n",
    )
}

/// [`start`] with more lines of the config file (the metrics listener's
/// among them).
fn start_with(
    dir: &Path,
    cert: &Path,
    key: &Path,
    ca: &Path,
    client_auth: &str,
    extra: &str,
) -> Node {
    let config = dir.join("weir.toml");
    let text = format!(
        "listen = \"SSL://127.0.0.1:0\"\ncore_port_base = 0\n{extra}\
         kafka_listener = \"SSL://127.0.0.1:0\"\nssl_certificate_file = {cert:?}\n\
         ssl_key_file = {key:?}\nssl_ca_file = {ca:?}\nssl_client_auth = \"{client_auth}\"\n\
         auto_create_topics = false\ngroup_initial_rebalance_delay_ms = 0\n",
    );
    std::fs::write(&config, text).unwrap();
    Node::builder(env!("CARGO_BIN_EXE_weir"))
        .data_dir(dir.join("data"))
        .cores(2)
        .config(&config)
        .env("WEIR_LOG", "info")
        .log_to(dir.join("broker.log"))
        .start()
}

/// A native client over TLS trusting `ca`, with a client certificate if
/// given.
fn native_tls(addr: SocketAddr, ca: &Path, client: Option<(&Path, &Path)>) -> Client {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((c, k)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_file(c).unwrap()],
                PrivateKeyDer::from_pem_file(k).unwrap(),
            )
            .unwrap(),
    };
    let name = ServerName::IpAddress(addr.ip().into());
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    Client::over(Box::new(rustls::StreamOwned::new(conn, tcp)))
}

/// kcat against the Kafka listener over TLS (`-X` settings added).
fn kcat(node: &Node, settings: &[String], args: &[&str], stdin: &[u8]) -> Output {
    let mut all: Vec<&str> = settings.iter().flat_map(|s| ["-X", s.as_str()]).collect();
    all.extend_from_slice(args);
    common::kcat(node.kafka, &all, stdin)
}

fn ssl(ca: &Path) -> Vec<String> {
    vec![
        "security.protocol=SSL".into(),
        format!("ssl.ca.location={}", ca.display()),
    ]
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "kcat failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn failures(node: &Node) -> f64 {
    common::metric(node.metrics, "weir_tls_handshake_failures_total")
}

/// Waits until a failed handshake is counted beyond `before` (the count
/// comes just after the connection is closed).
fn counted(node: &Node, before: f64) {
    wait_until(
        Instant::now() + Duration::from_secs(10),
        "a failed TLS handshake counted",
        || {
            let now = failures(node);
            if now > before {
                Ok(())
            } else {
                Err(format!("weir_tls_handshake_failures_total {now}"))
            }
        },
    );
}

#[test]
fn kafka_and_native_clients_produce_and_read_over_tls_and_plaintext_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign("server", "weir", true);
    let node = start(dir.path(), &cert, &key, &pki.ca("ca"), "none");

    // The native protocol over TLS: a topic made, a batch appended.
    let mut native = native_tls(node.listen, &pki.ca("ca"), None);
    assert_eq!(native.create_topic("secure", 2, &[]).error, 0);

    // kcat over TLS: produce, then read everything back.
    let lines: String = (0..100).map(|i| format!("k{i}:v{i}\n")).collect();
    ok(kcat(
        &node,
        &ssl(&pki.ca("ca")),
        &["-t", "secure", "-P", "-K:"],
        lines.as_bytes(),
    ));
    let read = ok(kcat(
        &node,
        &ssl(&pki.ca("ca")),
        &["-t", "secure", "-C", "-e", "-f", "%k:%s\n"],
        b"",
    ));
    let mut got: Vec<&str> = read.lines().collect();
    got.sort_unstable();
    let mut want: Vec<String> = (0..100).map(|i| format!("k{i}:v{i}")).collect();
    want.sort_unstable();
    assert_eq!(got, want);

    // Plaintext on a TLS port: refused, counted; TLS clients unaffected.
    let before = failures(&node);
    let plain = kcat(&node, &[], &["-L", "-m", "3"], b"");
    assert!(!plain.status.success(), "a plaintext client got metadata");
    counted(&node, before);
    let meta = ok(kcat(
        &node,
        &ssl(&pki.ca("ca")),
        &["-L", "-t", "secure"],
        b"",
    ));
    assert!(
        meta.contains("topic \"secure\" with 2 partitions"),
        "{meta}"
    );
    let log = std::fs::read_to_string(dir.path().join("broker.log")).unwrap();
    assert!(log.contains("TLS handshake failed"), "{log}");
}

#[test]
fn a_required_client_certificate_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign("server", "weir", true);
    let (ccert, ckey) = pki.sign("agent", "telemetry-agent", false);
    let node = start(dir.path(), &cert, &key, &pki.ca("ca"), "required");
    let mut with_cert = ssl(&pki.ca("ca"));
    with_cert.push(format!("ssl.certificate.location={}", ccert.display()));
    with_cert.push(format!("ssl.key.location={}", ckey.display()));
    // With a certificate the CA signed: produce, and read in a group.
    let mut native = native_tls(node.listen, &pki.ca("ca"), Some((&ccert, &ckey)));
    assert_eq!(native.create_topic("certified", 2, &[]).error, 0);
    let lines: String = (0..40).map(|i| format!("r{i}\n")).collect();
    ok(kcat(
        &node,
        &with_cert,
        &["-t", "certified", "-P"],
        lines.as_bytes(),
    ));
    let grouped = ok(kcat(
        &node,
        &with_cert,
        &[
            "-G",
            "agents",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%s\n",
            "certified",
        ],
        b"",
    ));
    assert_eq!(grouped.lines().count(), 40, "{grouped}");
    // Without one: refused, however the client retries.
    let without = kcat(&node, &ssl(&pki.ca("ca")), &["-L", "-m", "3"], b"");
    assert!(
        !without.status.success(),
        "served without a client certificate"
    );
    // One from another CA: refused too.
    let other = Pki::new(&dir.path().join("other"), "other");
    let (ocert, okey) = other.sign("intruder", "intruder", false);
    let mut wrong = ssl(&pki.ca("ca"));
    wrong.push(format!("ssl.certificate.location={}", ocert.display()));
    wrong.push(format!("ssl.key.location={}", okey.display()));
    let refused = kcat(&node, &wrong, &["-L", "-m", "3"], b"");
    assert!(
        !refused.status.success(),
        "served a certificate of another CA"
    );
    // The native listener requires one as well.
    let mut anonymous = native_tls(node.listen, &pki.ca("ca"), None);
    let refused = anonymous.try_ok(&weir_proto::messages::MetadataRequest { topics: None }, &[]);
    assert!(
        refused.is_err(),
        "the native listener served a client without a certificate"
    );
}

#[test]
fn garbage_on_a_tls_port_is_closed_and_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign("server", "weir", true);
    let node = start(dir.path(), &cert, &key, &pki.ca("ca"), "none");
    let before = failures(&node);
    let mut garbage = TcpStream::connect(node.kafka).unwrap();
    garbage
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    garbage.write_all(&[0x16, 0x03, 0x01, 0xff, 0xff]).unwrap();
    garbage.write_all(&[0xab; 512]).unwrap();
    // Whatever the server answers (an alert), the connection ends.
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut garbage, &mut rest);
    counted(&node, before);
    let mut native = native_tls(node.listen, &pki.ca("ca"), None);
    assert_eq!(native.create_topic("after-garbage", 1, &[]).error, 0);
}

#[test]
fn a_new_certificate_is_taken_on_sighup_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign("server", "weir", true);
    let mut node = start(dir.path(), &cert, &key, &pki.ca("ca"), "none");
    ok(kcat(&node, &ssl(&pki.ca("ca")), &["-L"], b""));
    // A certificate of a new CA replaces the files; SIGHUP.
    let next = Pki::new(&dir.path().join("next"), "next");
    let (ncert, nkey) = next.sign("server", "weir", true);
    std::fs::copy(&ncert, &cert).unwrap();
    std::fs::copy(&nkey, &key).unwrap();
    node.process().hangup();
    wait_until(
        Instant::now() + Duration::from_secs(15),
        "clients trusting the new CA are served",
        || {
            let out = kcat(&node, &ssl(&next.ca("next")), &["-L", "-m", "2"], b"");
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        },
    );
    // Clients trusting only the old CA no longer are.
    let old = kcat(&node, &ssl(&pki.ca("ca")), &["-L", "-m", "2"], b"");
    assert!(!old.status.success(), "the old certificate is still served");
    let log = std::fs::read_to_string(dir.path().join("broker.log")).unwrap();
    assert!(log.contains("TLS certificate reloaded"), "{log}");
}

#[test]
fn the_sdk_produces_and_reads_over_tls_with_a_client_certificate() {
    use weir_client::{Acks, Client, ClientConfig, SecurityProtocol};

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign("server", "weir", true);
    let (ccert, ckey) = pki.sign("agent", "telemetry-agent", false);
    let node = start(dir.path(), &cert, &key, &pki.ca("ca"), "required");
    let mut config = ClientConfig::default();
    config.security_protocol = SecurityProtocol::Ssl;
    config.tls.ca_file = Some(pki.ca("ca"));
    config.tls.certificate_file = Some(ccert.clone());
    config.tls.key_file = Some(ckey.clone());
    common::runtime().block_on(async {
        let c = Client::connect_with(node.listen, config.clone())
            .await
            .unwrap();
        c.create_topic("sdk-tls", 1, vec![]).await.unwrap();
        let batch = common::records_batch("tls", 20, 1_700_000_000_000);
        c.produce("sdk-tls", 0, batch.freeze(), Acks::All)
            .await
            .unwrap();
        let f = c.fetch("sdk-tls", 0, 0, 1 << 20, 0).await.unwrap();
        assert!(f.high_watermark >= 20, "{}", f.high_watermark);
        // Without the client certificate: a TLS error, not a hang.
        let mut anonymous = config.clone();
        anonymous.tls.certificate_file = None;
        anonymous.tls.key_file = None;
        let c = Client::connect_lazy(node.listen, anonymous);
        let e = c.list_topics().await.unwrap_err();
        assert!(
            matches!(
                e,
                weir_client::ClientError::Tls(_)
                    | weir_client::ClientError::Io(_)
                    | weir_client::ClientError::Disconnected
            ),
            "{e}"
        );
        // Trusting another CA: the broker's certificate is refused.
        let other = Pki::new(&dir.path().join("other"), "other");
        let mut distrust = config.clone();
        distrust.tls.ca_file = Some(other.ca("other"));
        let e = Client::connect_with(node.listen, distrust)
            .await
            .unwrap_err();
        assert!(matches!(e, weir_client::ClientError::Tls(_)), "{e}");
        assert!(e.to_string().contains("certificate"), "{e}");
    });
}

#[test]
fn the_cli_talks_tls_with_a_command_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign("server", "weir", true);
    let (ccert, ckey) = pki.sign("operator", "operator", false);
    let node = start(dir.path(), &cert, &key, &pki.ca("ca"), "required");
    let props = dir.path().join("client.properties");
    std::fs::write(
        &props,
        format!(
            "# Kafka tools' --command-config format\nsecurity.protocol=SSL\n\
             ssl.ca.location={}\nssl.certificate.location={}\nssl.key.location={}\n",
            pki.ca("ca").display(),
            ccert.display(),
            ckey.display()
        ),
    )
    .unwrap();
    let weir = |args: &[&str], stdin: &[u8]| common::weir_at(node.listen, args, stdin);
    let config = props.to_str().unwrap();
    let create = weir(
        &[
            "topic",
            "create",
            "ops",
            "--partitions",
            "2",
            "--command-config",
            config,
        ],
        b"",
    );
    assert!(create.status.success(), "{create:?}");
    let lines: String = (0..30).map(|i| format!("line-{i}\n")).collect();
    let produce = weir(
        &["produce", "ops", "--command-config", config],
        lines.as_bytes(),
    );
    assert!(produce.status.success(), "{produce:?}");
    let consume = weir(
        &[
            "consume",
            "ops",
            "--from",
            "earliest",
            "--max-records",
            "30",
            "--command-config",
            config,
        ],
        b"",
    );
    assert!(consume.status.success(), "{consume:?}");
    assert_eq!(String::from_utf8_lossy(&consume.stdout).lines().count(), 30);
    // Without the file: the TLS port does not speak plaintext.
    let plain = weir(&["topic", "list"], b"");
    assert!(!plain.status.success(), "{plain:?}");
}

#[test]
fn metrics_are_served_over_tls_to_a_holder_of_the_bearer_token_or_a_basic_login() {
    use std::io::Read;

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign("server", "weir", true);
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-scrape\n").unwrap();
    let logins = dir.path().join("logins");
    std::fs::write(&logins, "# Prometheus' basic_auth\nprometheus:p4ss:word\n").unwrap();
    let extra = format!(
        "metrics_listen = \"SSL://127.0.0.1:0\"\nmetrics_bearer_token_file = {token:?}\n\
         metrics_basic_auth_file = {logins:?}\n"
    );
    let node = start_with(dir.path(), &cert, &key, &pki.ca("ca"), "none", &extra);
    let get = |auth: Option<&str>| {
        let mut c = native_tls(node.metrics, &pki.ca("ca"), None);
        let head = match auth {
            Some(a) => format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {a}\r\n\r\n"),
            None => "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
        };
        c.send_raw(head.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = c.stream.read_to_string(&mut out);
        out
    };
    let ok = get(Some("Bearer s3cret-scrape"));
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.contains("weir_tls_handshake_failures_total"), "{ok}");
    let missing = get(None);
    assert!(missing.starts_with("HTTP/1.1 401"), "{missing}");
    assert!(missing.contains("WWW-Authenticate: Basic"), "{missing}");
    let wrong = get(Some("Bearer s3cret-scrapf"));
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    // prometheus:p4ss:word (the password may hold a colon).
    let basic = get(Some("Basic cHJvbWV0aGV1czpwNHNzOndvcmQ="));
    assert!(basic.starts_with("HTTP/1.1 200"), "{basic}");
    // prometheus:p4ss
    let wrong = get(Some("Basic cHJvbWV0aGV1czpwNHNz"));
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    // Plain HTTP on the TLS port gets no metrics.
    let mut plain = TcpStream::connect(node.metrics).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    plain
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(
        !String::from_utf8_lossy(&answer).contains("weir_"),
        "metrics over plaintext"
    );
}

/// One Python Kafka client (`tls_clients.py`) over TLS with a client
/// certificate: produces, then reads everything in a group.
fn python_client_over_tls(client: &str) {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign("server", "weir", true);
    let (ccert, ckey) = pki.sign("agent", "telemetry-agent", false);
    let node = start(dir.path(), &cert, &key, &pki.ca("ca"), "required");
    let mut native = native_tls(node.listen, &pki.ca("ca"), Some((&ccert, &ckey)));
    let topic = format!("py-{client}");
    assert_eq!(native.create_topic(&topic, 2, &[]).error, 0);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/tls_clients.py");
    let out = common::client_program(crate::kafka_clients::python())
        .arg(script)
        .args([client, &node.kafka.to_string(), &topic])
        .args([pki.ca("ca"), ccert, ckey])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("\"ok\": true"),
        "{client}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn confluent_kafka_over_tls_with_a_client_certificate() {
    python_client_over_tls("confluent");
}

#[test]
fn kafka_python_over_tls_with_a_client_certificate() {
    python_client_over_tls("kafka-python");
}

#[test]
fn aiokafka_over_tls_with_a_client_certificate() {
    python_client_over_tls("aiokafka");
}

/// Without `ssl.ca.location` the SDK trusts the system's root
/// certificates (here: `SSL_CERT_FILE` naming the test CA, as a machine
/// whose administrator installed a company CA); with none to be found it
/// says what to set.
#[test]
fn the_cli_trusts_the_system_roots_without_a_ca_location() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign("server", "weir", true);
    let node = start(dir.path(), &cert, &key, &pki.ca("ca"), "none");
    let props = dir.path().join("client.properties");
    std::fs::write(&props, "security.protocol=SSL\n").unwrap();
    let list = |cert_file: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["topic", "list", "--command-config"])
            .arg(&props)
            .env("WEIR_BOOTSTRAP", node.listen.to_string())
            .env("WEIR_LOG", "warn")
            .env("SSL_CERT_FILE", cert_file)
            .env("SSL_CERT_DIR", dir.path().join("no-such-dir"))
            .output()
            .unwrap()
    };
    let out = list(&pki.ca("ca"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = list(&dir.path().join("no-such-file.pem"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "connected without any root");
    assert!(err.contains("ssl.ca.location"), "{err}");
}

/// The brokers (`(host, port)`, sorted) a kcat `-L` listing names.
fn listed_brokers(listing: &str) -> Vec<(String, u16)> {
    let mut out: Vec<(String, u16)> = listing
        .lines()
        .filter_map(|l| l.trim().strip_prefix("broker ")?.split_once(" at "))
        .filter_map(|(_, at)| {
            let at = at.split_whitespace().next()?;
            let (h, p) = at.rsplit_once(':')?;
            Some((h.to_string(), p.parse().ok()?))
        })
        .collect();
    out.sort();
    out
}

#[test]
fn several_listeners_each_tell_clients_their_own_addresses() {
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse};
    use kafka_protocol::protocol::Decodable;
    use std::io::Read as _;

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign("server", "weir", true);
    // Plaintext on loopback (told as `localhost`) and SSL beside it, for
    // both protocols.
    let tcp = weir_testkit::ports::Proto::Tcp;
    let (native_ssl, kafka_ssl, kafka_plain) = (
        weir_testkit::ports::run(tcp, 0),
        weir_testkit::ports::run(tcp, 0),
        weir_testkit::ports::run(tcp, 0),
    );
    let config = dir.path().join("weir.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:{native_ssl}\"\ncore_port_base = 0\n\
             metrics_listen = \"127.0.0.1:0\"\n\
             kafka_listener = \"PLAINTEXT://127.0.0.1:{kafka_plain},SSL://127.0.0.1:{kafka_ssl}\"\n\
             kafka_core_port_base = \"0\"\n\
             kafka_advertised_listener = \"PLAINTEXT://localhost:{kafka_plain}\"\n\
             ssl_certificate_file = {cert:?}\nssl_key_file = {key:?}\n\
             auto_create_topics = false\ngroup_initial_rebalance_delay_ms = 0\n"
        ),
    )
    .unwrap();
    let node = Node::builder(env!("CARGO_BIN_EXE_weir"))
        .data_dir(dir.path().join("data"))
        .cores(2)
        .config(&config)
        .env("WEIR_LOG", "info")
        .log_to(dir.path().join("broker.log"))
        .start();

    // Native: each listener's Metadata names its own per-core ports.
    let mut plain = common::Client::connect(node.listen);
    let cores = plain.ok(&weir_proto::messages::MetadataRequest { topics: None }, &[]);
    let plain_ports: Vec<u16> = cores.0.cores.iter().map(|c| c.port).collect();
    assert_eq!(plain_ports, node.core_ports);
    let ssl_at = SocketAddr::from(([127, 0, 0, 1], native_ssl));
    let mut secure = native_tls(ssl_at, &pki.ca("ca"), None);
    assert_eq!(secure.create_topic("both", 2, &[]).error, 0);
    let cores = secure.ok(&weir_proto::messages::MetadataRequest { topics: None }, &[]);
    let ssl_ports: Vec<u16> = cores.0.cores.iter().map(|c| c.port).collect();
    assert_eq!(ssl_ports.len(), 2);
    assert!(
        ssl_ports.iter().all(|p| !plain_ports.contains(p)),
        "{ssl_ports:?} {plain_ports:?}"
    );
    // Each of those is a TLS port of that core.
    for p in &ssl_ports {
        let mut c = native_tls(SocketAddr::from(([127, 0, 0, 1], *p)), &pki.ca("ca"), None);
        c.ok(&weir_proto::messages::MetadataRequest { topics: None }, &[]);
    }

    // Kafka, plaintext: the brokers are `localhost` at the per-core ports.
    let mut s = TcpStream::connect(node.kafka).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut m = MetadataRequest::default();
    m.topics = None;
    s.write_all(&common::kafka_frame(3, 1, 9, &crate::sasl::body(&m, 1)))
        .unwrap();
    let mut size = [0u8; 4];
    s.read_exact(&mut size).unwrap();
    let mut b = vec![0u8; i32::from_be_bytes(size) as usize];
    s.read_exact(&mut b).unwrap();
    let resp = MetadataResponse::decode(&mut bytes::Bytes::from(b).slice(4..), 1).unwrap();
    let mut told: Vec<(String, u16)> = resp
        .brokers
        .iter()
        .map(|b| (b.host.to_string(), b.port as u16))
        .collect();
    told.sort();
    let mut want: Vec<(String, u16)> = node
        .kafka_core_ports
        .iter()
        .map(|p| ("localhost".to_string(), *p))
        .collect();
    want.sort();
    assert_eq!(told, want);

    // Kafka over TLS: the SSL listener's own per-core ports, which kcat
    // follows to produce and read back.
    let ssl_kafka = SocketAddr::from(([127, 0, 0, 1], kafka_ssl));
    let tls_kcat = |args: &[&str], stdin: &[u8]| {
        let settings = ssl(&pki.ca("ca"));
        let mut all: Vec<&str> = settings.iter().flat_map(|s| ["-X", s.as_str()]).collect();
        all.extend_from_slice(args);
        ok(common::kcat(ssl_kafka, &all, stdin))
    };
    let listed = listed_brokers(&tls_kcat(&["-L", "-t", "both"], b""));
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(
        listed.iter().all(|(h, p)| h == "127.0.0.1"
            && !node.kafka_core_ports.contains(p)
            && *p != kafka_ssl),
        "{listed:?} (plaintext: {:?})",
        node.kafka_core_ports
    );
    let lines: String = (0..50).map(|i| format!("k{i}:v{i}\n")).collect();
    tls_kcat(&["-t", "both", "-P", "-K:"], lines.as_bytes());
    // Read back on the plaintext listener (through `localhost`).
    let read = ok(common::kcat(
        node.kafka,
        &["-t", "both", "-C", "-e", "-f", "%k:%s\n"],
        b"",
    ));
    assert_eq!(read.lines().count(), 50, "{read}");
    assert_eq!(
        tls_kcat(&["-t", "both", "-C", "-e"], b"").lines().count(),
        50
    );
}

/// The SDK checks each broker's certificate against the host name it knows
/// the broker by (the bootstrap entry, then what the broker advertises),
/// as Kafka clients do: a certificate naming `localhost` only is trusted
/// for a broker bootstrapped and advertised as `localhost`, though the
/// connections go to 127.0.0.1.
#[test]
fn the_sdk_checks_certificates_against_the_advertised_host_name() {
    use weir_client::producer::{Producer, ProducerConfig, ProducerRecord};
    use weir_client::{Client, ClientConfig, SecurityProtocol};

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (cert, key) = pki.sign_dns("server", "localhost");
    // (The advertised port is not what clients use: the cores' own.)
    let node = start_with(
        dir.path(),
        &cert,
        &key,
        &pki.ca("ca"),
        "none",
        "metrics_listen = \"127.0.0.1:0\"\nadvertised_listen = \"localhost:9292\"\n",
    );
    let mut config = ClientConfig::default();
    config.security_protocol = SecurityProtocol::Ssl;
    config.tls.ca_file = Some(pki.ca("ca"));
    common::runtime().block_on(async {
        // By IP address: the certificate does not name it.
        let by_ip = Client::connect_with(node.listen, config.clone()).await;
        assert!(
            matches!(by_ip, Err(weir_client::ClientError::Tls(_))),
            "{by_ip:?}"
        );
        // By name: trusted, and so are the cores' ports it advertises.
        let c = Client::bootstrap(&format!("localhost:{}", node.listen.port()), config.clone())
            .await
            .unwrap();
        c.create_topic("named", 2, vec![]).await.unwrap();
        // The cores are advertised at the node's host name.
        let md = c.metadata(None).await.unwrap();
        assert!(md.cores.iter().all(|k| k.host == "localhost"), "{md:?}");
        // Each core's own port, by that name, is trusted too.
        for k in &md.cores {
            let own = Client::bootstrap(&format!("localhost:{}", k.port), config.clone())
                .await
                .unwrap();
            own.list_topics().await.unwrap();
        }
        let c = std::sync::Arc::new(c);
        let producer = Producer::new(c.clone(), ProducerConfig::default());
        let mut acks = Vec::new();
        for i in 0..20 {
            let r = ProducerRecord::new("named", format!("v{i}")).partition(i % 2);
            acks.push(producer.send(r).await.unwrap());
        }
        for a in acks {
            a.await.unwrap();
        }
        producer.close().await;
    });
}
