//! Mutual TLS between nodes: one certificate authority per cluster, one
//! certificate per node, both ends of every QUIC connection verified
//! against the cluster's CA.
//!
//! Files (PEM), as `weir cluster certs --out DIR --nodes N` writes them:
//!
//! ```text
//! DIR/ca.pem            the cluster CA's certificate (every node needs it)
//! DIR/ca.key            the CA's private key (keep it off the nodes; needed to add a node)
//! DIR/node-<id>.pem     node <id>'s certificate, signed by the CA
//! DIR/node-<id>.key     node <id>'s private key
//! ```
//!
//! A node certificate names `node-<id>.weir` (and `localhost`) as its DNS
//! names; a node connecting to node `id` asks for `node-<id>.weir`, and a
//! node accepting a connection checks that the certificate presented names
//! the node id its hello claims ([`check_peer_is`]) — so a peer can neither
//! answer nor speak for another node's id with its own certificate.
//! Certificates are ECDSA P-256, valid ten years; TLS 1.3 only (QUIC's).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{Error, Result};

/// The name the QUIC handshake asks for when it connects to node `id`.
pub fn node_server_name(id: u64) -> String {
    format!("node-{id}.weir")
}

/// Checks that the peer of an accepted connection presented node `id`'s
/// certificate (one naming `node-<id>.weir`; the handshake already
/// checked it is from the cluster CA): a node's hello cannot claim
/// another node's id.
pub fn check_peer_is(conn: &quinn::Connection, id: u64) -> Result<()> {
    let certs = conn
        .peer_identity()
        .and_then(|i| i.downcast::<Vec<CertificateDer<'static>>>().ok())
        .ok_or(Error::NoPeerCertificate)?;
    let leaf = certs.first().ok_or(Error::NoPeerCertificate)?;
    let cert = webpki::EndEntityCert::try_from(leaf)
        .map_err(|source| Error::PeerCertificate { source })?;
    let name = rustls::pki_types::ServerName::try_from(node_server_name(id))
        .map_err(|source| Error::NodeName { source })?;
    // webpki's error says no more than the message does.
    cert.verify_is_valid_for_subject_name(&name)
        .map_err(|_| Error::NotThatNode {
            node: id,
            name: node_server_name(id),
        })
}

/// The ALPN protocol of Weir's node-to-node connections.
pub const ALPN: &[u8] = b"weir-node/1";

/// Paths of a cluster CA's files in a certificate directory.
pub fn ca_paths(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("ca.pem"), dir.join("ca.key"))
}

/// Paths of node `id`'s certificate and key in a certificate directory.
pub fn node_paths(dir: &Path, id: u64) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("node-{id}.pem")),
        dir.join(format!("node-{id}.key")),
    )
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "Weir");
    name.push(DnType::CommonName, "Weir cluster CA");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2099, 1, 1);
    params
}

/// Creates a cluster CA in `dir` (which must not hold one already) and a
/// certificate for each of nodes `1..=nodes`. Returns the files written.
pub fn generate_cluster(dir: &Path, nodes: u64) -> Result<Vec<PathBuf>> {
    let (ca_pem, ca_key_path) = ca_paths(dir);
    if ca_pem.exists() || ca_key_path.exists() {
        return Err(Error::CaExists {
            dir: dir.to_path_buf(),
        });
    }
    std::fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
    let ca_key = KeyPair::generate().map_err(certificate("generating the CA key"))?;
    let ca_cert = ca_params()
        .self_signed(&ca_key)
        .map_err(certificate("signing the CA certificate"))?;
    write_private(&ca_key_path, &ca_key.serialize_pem())?;
    std::fs::write(&ca_pem, ca_cert.pem()).map_err(Error::io("writing", &ca_pem))?;
    let mut written = vec![ca_pem, ca_key_path];
    for id in 1..=nodes {
        written.extend(add_node(dir, id)?);
    }
    Ok(written)
}

/// The CA in `dir`, to sign with.
fn load_issuer(dir: &Path) -> Result<Issuer<'static, KeyPair>> {
    let (_, ca_key_path) = ca_paths(dir);
    let ca_key_pem = std::fs::read_to_string(&ca_key_path).map_err(|source| Error::ReadCaKey {
        path: ca_key_path.clone(),
        source,
    })?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(|source| Error::ParseKey {
        path: ca_key_path.clone(),
        source,
    })?;
    // The CA's subject and key identifier derive from ca_params() and its
    // key, so the issuer is rebuilt rather than parsed from ca.pem.
    Ok(Issuer::new(ca_params(), ca_key))
}

/// Signs `params` (valid 2024–2099, a new key) with the CA in `dir` and
/// writes the certificate and its key (owner-only).
fn sign_into(
    dir: &Path,
    mut params: CertificateParams,
    cert_path: &Path,
    key_path: &Path,
) -> Result<Vec<PathBuf>> {
    let issuer = load_issuer(dir)?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2099, 1, 1);
    let key = KeyPair::generate().map_err(certificate("generating a key"))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(certificate("signing the certificate"))?;
    write_private(key_path, &key.serialize_pem())?;
    std::fs::write(cert_path, cert.pem()).map_err(Error::io("writing", cert_path))?;
    Ok(vec![cert_path.to_path_buf(), key_path.to_path_buf()])
}

/// Signs a certificate for node `id` with the CA in `dir`. Refuses to
/// overwrite an existing one.
pub fn add_node(dir: &Path, id: u64) -> Result<Vec<PathBuf>> {
    let (cert_path, key_path) = node_paths(dir, id);
    if cert_path.exists() {
        return Err(Error::NodeCertExists {
            path: cert_path,
            node: id,
        });
    }
    let mut params = CertificateParams::new(vec![node_server_name(id), "localhost".to_string()])
        .map_err(certificate("node certificate names"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("weir node {id}"));
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    sign_into(dir, params, &cert_path, &key_path)
}

/// Signs a client certificate `CN=<name>` with the CA in `dir`
/// (`client-<name>.pem`, `client-<name>.key`), for a client listener with
/// `--ssl-ca-file <dir>/ca.pem --ssl-client-auth required`: its principal
/// is `User:CN=<name>` (or what `--ssl-principal-mapping-rules` makes of
/// it). `name` is letters, digits, `.`, `_` and `-`. Refuses to overwrite.
pub fn add_client(dir: &Path, name: &str) -> Result<Vec<PathBuf>> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !ok {
        return Err(Error::ClientName {
            name: name.to_string(),
        });
    }
    let (cert_path, key_path) = (
        dir.join(format!("client-{name}.pem")),
        dir.join(format!("client-{name}.key")),
    );
    if cert_path.exists() {
        return Err(Error::ClientCertExists { path: cert_path });
    }
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    sign_into(dir, params, &cert_path, &key_path)
}

/// An [`Error::Certificate`] maker for `map_err`.
fn certificate(action: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Certificate { action, source }
}

/// An [`Error::Tls`] maker for `map_err`.
fn tls_error(action: &'static str) -> impl FnOnce(rustls::Error) -> Error {
    move |source| Error::Tls { action, source }
}

fn write_private(path: &Path, pem: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(Error::io("creating", path))?;
    file.write_all(pem.as_bytes())
        .map_err(Error::io("writing", path))
}

/// What a node needs for its QUIC endpoint: the CA to trust, its own
/// certificate and key.
#[derive(Clone, Debug)]
pub struct NodeTls {
    ca: CertificateDer<'static>,
    cert: CertificateDer<'static>,
    key: Arc<PrivateKeyDer<'static>>,
}

impl NodeTls {
    /// Loads the CA certificate and node `id`'s certificate and key from `dir`.
    pub fn load(dir: &Path, id: u64) -> Result<Self> {
        let (ca_pem, _) = ca_paths(dir);
        let (cert_path, key_path) = node_paths(dir, id);
        Self::from_files(&ca_pem, &cert_path, &key_path)
    }

    /// Loads the three PEM files named.
    pub fn from_files(ca: &Path, cert: &Path, key: &Path) -> Result<Self> {
        let read_cert = |path: &Path| {
            CertificateDer::from_pem_file(path).map_err(|source| Error::ReadPem {
                what: "a certificate",
                path: path.to_path_buf(),
                source,
            })
        };
        let key = PrivateKeyDer::from_pem_file(key).map_err(|source| Error::ReadPem {
            what: "a private key",
            path: key.to_path_buf(),
            source,
        })?;
        Ok(Self {
            ca: read_cert(ca)?,
            cert: read_cert(cert)?,
            key: Arc::new(key),
        })
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn roots(&self) -> Result<Arc<rustls::RootCertStore>> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone()).map_err(tls_error(
            "the cluster CA certificate is not a usable trust anchor",
        ))?;
        Ok(Arc::new(roots))
    }

    /// The server side: presents this node's certificate and requires a
    /// client certificate signed by the cluster CA.
    pub fn server_config(&self) -> Result<quinn::ServerConfig> {
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots()?,
            Self::provider(),
        )
        .build()
        .map_err(|source| Error::ClientVerifier { source })?;
        let mut tls = rustls::ServerConfig::builder_with_provider(Self::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_error("TLS 1.3"))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![self.cert.clone()], self.key.clone_key())
            .map_err(tls_error("this node's certificate and key do not match"))?;
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(|source| {
            Error::QuicTls {
                side: "server",
                source,
            }
        })?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        config.transport_config(transport());
        Ok(config)
    }

    /// The client side: presents this node's certificate and verifies the
    /// peer's against the cluster CA (and the node name asked for).
    pub fn client_config(&self) -> Result<quinn::ClientConfig> {
        let mut tls = rustls::ClientConfig::builder_with_provider(Self::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_error("TLS 1.3"))?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(vec![self.cert.clone()], self.key.clone_key())
            .map_err(tls_error("this node's certificate and key do not match"))?;
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|source| {
            Error::QuicTls {
                side: "client",
                source,
            }
        })?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        config.transport_config(transport());
        Ok(config)
    }
}

/// Transport settings of node connections: a keep-alive well inside the
/// idle timeout, so an idle but healthy connection stays open and a dead
/// peer is noticed within the idle timeout.
fn transport() -> Arc<quinn::TransportConfig> {
    Arc::new(transport_config())
}

/// [`transport`]'s settings, with path MTU discovery searching up to
/// `max_udp_payload` (quinn's default stops at 1452: Ethernet's 1500).
///
/// The congestion window starts at 64 such packets: quinn counts its MTU
/// probes against the window, and its default start (about ten 1200-byte
/// packets) is filled by two jumbo-sized probes — a connection closed
/// right after its handshake then could not send its CONNECTION_CLOSE
/// ("blocked by congestion control"), and the peer kept it open until
/// its idle timeout.
pub(crate) fn transport_with_mtu(max_udp_payload: u16) -> Arc<quinn::TransportConfig> {
    let mut transport = transport_config();
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(max_udp_payload);
    transport.mtu_discovery_config(Some(mtu));
    let mut cubic = quinn::congestion::CubicConfig::default();
    cubic.initial_window(64 * u64::from(max_udp_payload));
    transport.congestion_controller_factory(Arc::new(cubic));
    Arc::new(transport)
}

fn transport_config() -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(std::time::Duration::from_millis(500)));
    transport.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(std::time::Duration::from_secs(3)).expect("3 s fits"),
    ));
    // A follower's fetch asks up to 8 MiB on one stream: windows that
    // hold a whole answer, so it is not paced by window updates.
    transport.stream_receive_window(quinn::VarInt::from_u32(16 << 20));
    transport.receive_window(quinn::VarInt::from_u32(32 << 20));
    transport.send_window(32 << 20);
    transport
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_ca_signs_node_certificates_and_refuses_to_be_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let files = generate_cluster(dir.path(), 3).unwrap();
        assert_eq!(files.len(), 2 + 3 * 2);
        for id in 1..=3 {
            let tls = NodeTls::load(dir.path(), id).unwrap();
            tls.server_config().unwrap();
            tls.client_config().unwrap();
        }
        let err = generate_cluster(dir.path(), 3).unwrap_err().to_string();
        assert!(err.contains("already holds a cluster CA"), "{err}");
        let err = add_node(dir.path(), 2).unwrap_err().to_string();
        assert!(err.contains("exists"), "{err}");
        add_node(dir.path(), 4).unwrap();
        NodeTls::load(dir.path(), 4).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("node-4.key"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }
}
