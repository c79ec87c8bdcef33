//! TLS to a broker's `SSL://` listener (Kafka's `security.protocol=SSL`),
//! with rustls (the `ring` provider) and tokio-rustls.
//!
//! Set through [`crate::ClientConfig::security_protocol`] and
//! [`crate::ClientConfig::tls`], or the Kafka properties
//! `security.protocol`, `ssl.ca.location`, `ssl.certificate.location`,
//! `ssl.key.location` (PEM files) in `from_config`. The broker's
//! certificate must chain to the CA file and name the address connected to
//! (the host name the broker is known by — a bootstrap entry, or what it
//! advertises — or the IP address; [`TlsSettings::server_name`] overrides).

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::error::ClientError;

/// How the client talks to the broker (Kafka's `security.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SecurityProtocol {
    /// Plain TCP.
    #[default]
    Plaintext,
    /// TLS.
    Ssl,
    /// A SASL login (see [`crate::sasl`]), no encryption.
    SaslPlaintext,
    /// A SASL login over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Whether connections are TLS.
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Whether connections log in with SASL.
    pub fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

impl std::str::FromStr for SecurityProtocol {
    type Err = String;

    fn from_str(s: &str) -> Result<SecurityProtocol, String> {
        match s.to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Ok(SecurityProtocol::Plaintext),
            "SSL" => Ok(SecurityProtocol::Ssl),
            "SASL_PLAINTEXT" => Ok(SecurityProtocol::SaslPlaintext),
            "SASL_SSL" => Ok(SecurityProtocol::SaslSsl),
            _ => Err(format!("`{s}`: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")),
        }
    }
}

/// The files and name of a TLS connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsSettings {
    /// PEM certificates the broker's must chain to (`ssl.ca.location`);
    /// `None`: the system's root certificates (`SSL_CERT_FILE` and
    /// `SSL_CERT_DIR` honoured).
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain of the client (`ssl.certificate.location`),
    /// for listeners that ask for one.
    pub certificate_file: Option<PathBuf>,
    /// Its PEM private key (`ssl.key.location`).
    pub key_file: Option<PathBuf>,
    /// The name every broker's certificate must carry (default: the host
    /// name the broker is known by — its bootstrap entry, or the host it
    /// advertises — or the IP address connected to).
    pub server_name: Option<String>,
}

fn tls_error(what: String) -> ClientError {
    ClientError::Tls(what)
}

/// The certificates of a PEM file (`ssl.ca.location`).
fn file_roots(ca: &std::path::Path) -> Result<rustls::RootCertStore, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    let cas = CertificateDer::pem_file_iter(ca)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| tls_error(format!("reading {}: {e}", ca.display())))?;
    for c in cas {
        roots
            .add(c)
            .map_err(|e| tls_error(format!("{}: {e}", ca.display())))?;
    }
    if roots.is_empty() {
        return Err(tls_error(format!(
            "{} holds no PEM certificate",
            ca.display()
        )));
    }
    Ok(roots)
}

/// The system's root certificates (as OpenSSL finds them, `SSL_CERT_FILE`
/// and `SSL_CERT_DIR` first), for a broker whose certificate a public or
/// company CA installed on the machine signed.
fn system_roots() -> Result<rustls::RootCertStore, ClientError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map_or_else(String::new, |e| format!(" ({e})"));
        return Err(tls_error(format!(
            "security.protocol=SSL without ssl.ca.location uses the system's root certificates,              and none were found{why}: set ssl.ca.location (a PEM file) or SSL_CERT_FILE"
        )));
    }
    Ok(roots)
}

/// The rustls configuration the settings describe.
pub(crate) fn client_config(s: &TlsSettings) -> Result<Arc<rustls::ClientConfig>, ClientError> {
    let roots = match &s.ca_file {
        Some(ca) => file_roots(ca)?,
        None => system_roots()?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(e.to_string()))?
        .with_root_certificates(roots);
    let config = match (&s.certificate_file, &s.key_file) {
        (None, None) => builder.with_no_client_auth(),
        (Some(c), Some(k)) => {
            let chain = CertificateDer::pem_file_iter(c)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| tls_error(format!("reading {}: {e}", c.display())))?;
            let key = PrivateKeyDer::from_pem_file(k)
                .map_err(|e| tls_error(format!("reading {}: {e}", k.display())))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_error(format!("{} and {}: {e}", c.display(), k.display())))?
        }
        _ => {
            return Err(tls_error(
                "ssl.certificate.location and ssl.key.location go together".into(),
            ))
        }
    };
    Ok(Arc::new(config))
}

/// The rustls configuration of a [`crate::ClientConfig`]'s settings, built
/// on first use and shared by its clones (every client a producer or group
/// consumer opens): the PEM files are read once, not per connection. Built
/// again if the settings change; a new `ClientConfig` reads the files
/// again (a rotated client certificate).
#[derive(Clone, Default)]
pub(crate) struct Built(Arc<std::sync::Mutex<Option<(TlsSettings, BuiltConfig)>>>);

type BuiltConfig = Result<Arc<rustls::ClientConfig>, String>;

impl Built {
    /// The configuration for `settings`.
    pub(crate) fn get(&self, settings: &TlsSettings) -> BuiltConfig {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match &*slot {
            Some((s, built)) if s == settings => built.clone(),
            _ => {
                let built = client_config(settings).map_err(|e| e.to_string());
                *slot = Some((settings.clone(), built.clone()));
                built
            }
        }
    }
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Built")
    }
}

/// Connects TLS over `tcp` to the broker at `ip`.
pub(crate) async fn connect(
    config: Arc<rustls::ClientConfig>,
    settings: &TlsSettings,
    ip: std::net::IpAddr,
    tcp: TcpStream,
) -> Result<(ReadHalf, WriteHalf), ClientError> {
    let name = match &settings.server_name {
        Some(n) => ServerName::try_from(n.clone())
            .map_err(|e| tls_error(format!("server name `{n}`: {e}")))?,
        None => ServerName::IpAddress(ip.into()),
    };
    // rustls reads at most one record (4 KiB to 16 KiB) from its transport
    // per `read_tls` call: straight on the socket, one recv syscall per
    // record of a fetch answer. Under a read buffer one syscall fetches what
    // the socket holds (up to TLS_READ_BUFFER_BYTES) and rustls takes it
    // from memory. Writes pass through unbuffered (vectored).
    let tcp = tokio::io::BufReader::with_capacity(TLS_READ_BUFFER_BYTES, tcp);
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| {
            // rustls' refusals (certificates, alerts) come as InvalidData;
            // anything else is the connection failing (retriable).
            if e.kind() == io::ErrorKind::InvalidData {
                tls_error(format!("TLS handshake with {ip}: {e}"))
            } else {
                ClientError::Io(e)
            }
        })?;
    let (r, w) = tokio::io::split(tls);
    Ok((ReadHalf::Tls(r), WriteHalf::Tls(w)))
}

/// The halves of a plain TCP connection.
pub(crate) fn plain(tcp: TcpStream) -> (ReadHalf, WriteHalf) {
    let (r, w) = tcp.into_split();
    (ReadHalf::Plain(r), WriteHalf::Plain(w))
}

/// The read buffer under a TLS session: what one recv syscall may fetch.
const TLS_READ_BUFFER_BYTES: usize = 256 << 10;

type Tls = tokio_rustls::client::TlsStream<tokio::io::BufReader<TcpStream>>;

/// A connection's read half, plain or TLS.
pub(crate) enum ReadHalf {
    Plain(OwnedReadHalf),
    Tls(tokio::io::ReadHalf<Tls>),
}

/// A connection's write half, plain or TLS.
pub(crate) enum WriteHalf {
    Plain(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<Tls>),
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_write(cx, buf),
            WriteHalf::Tls(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            WriteHalf::Tls(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WriteHalf::Plain(w) => w.is_write_vectored(),
            WriteHalf::Tls(w) => w.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}
