//! TLS on the client listeners — Kafka's `SSL` security protocol — with
//! rustls (the same library, with the same `ring` provider, as the
//! node-to-node QUIC links).
//!
//! A listener's protocol is the scheme of its address: `--listen
//! SSL://0.0.0.0:9393`, `--kafka-listener SSL://0.0.0.0:9093`; a bare
//! `host:port` (or `PLAINTEXT://`) is plaintext. A listener's per-core
//! ports speak its protocol. The certificate and key are PEM files
//! (`--ssl-certificate-file`, `--ssl-key-file`: the chain, leaf first, and
//! its PKCS#8, PKCS#1 or SEC1 key); `--ssl-client-auth required|requested`
//! verifies client certificates against `--ssl-ca-file`.
//!
//! **Reload:** the files are read again on SIGHUP and when one of them
//! changes (checked every [`RELOAD_CHECK_MS`]); connections accepted after
//! that get the new configuration, open ones keep theirs. Files that do
//! not load (a half-written certificate, a key that does not match) are
//! reported and the previous configuration stays.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::limits::TLS_HANDSHAKE_TIMEOUT_MS;

/// How often core 0 looks at the certificate files' modification times.
pub const RELOAD_CHECK_MS: u64 = 1000;

/// The read buffer under a TLS connection: what one recv syscall may fetch
/// (rustls asks for at most one record, often only 4 KiB, per read).
/// Measured on a TLS produce of 16 partitions: 64 KiB took the broker's
/// CPU time per GB received from 3.0–4.2 s to 2.3–2.4 s; 256 KiB did no
/// better and costs four times the memory per connection.
pub const READ_BUFFER_BYTES: usize = 64 << 10;

/// A client listener's security protocol (Kafka's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SecurityProtocol {
    /// No encryption, no authentication.
    #[default]
    Plaintext,
    /// TLS (with client certificates if `--ssl-client-auth` asks).
    Ssl,
    /// SASL authentication, no encryption.
    SaslPlaintext,
    /// SASL authentication over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Kafka's name of it.
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    /// Whether connections are TLS.
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Whether clients must log in with SASL before anything is served.
    pub fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

/// Splits a listener setting (`SSL://host:port`, `PLAINTEXT://host:port`
/// or `host:port`) into its protocol and address; `flag` names the setting
/// in errors.
pub fn split_listener(flag: &str, value: &str) -> anyhow::Result<(SecurityProtocol, String)> {
    let Some((scheme, addr)) = value.split_once("://") else {
        return Ok((SecurityProtocol::Plaintext, value.to_string()));
    };
    let protocol = match scheme.to_ascii_uppercase().as_str() {
        "PLAINTEXT" => SecurityProtocol::Plaintext,
        "SSL" => SecurityProtocol::Ssl,
        "SASL_PLAINTEXT" => SecurityProtocol::SaslPlaintext,
        "SASL_SSL" => SecurityProtocol::SaslSsl,
        _ => {
            bail!(
                "{flag} `{value}`: unknown security protocol `{scheme}` \
                 (PLAINTEXT://, SSL://, SASL_PLAINTEXT:// or SASL_SSL://)"
            )
        }
    };
    Ok((protocol, addr.to_string()))
}

/// Whether a TLS listener asks clients for certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuth {
    /// It does not (`ssl.client.auth=none`).
    #[default]
    None,
    /// It asks; a client without one is served (`requested`).
    Requested,
    /// A client without a valid one is refused (`required`).
    Required,
}

impl std::str::FromStr for ClientAuth {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<ClientAuth> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(ClientAuth::None),
            "requested" => Ok(ClientAuth::Requested),
            "required" => Ok(ClientAuth::Required),
            _ => bail!("--ssl-client-auth `{s}`: none, requested or required"),
        }
    }
}

/// The TLS settings of the client listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SslSettings {
    /// PEM certificate chain, leaf first.
    pub certificate: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
    /// PEM certificates that client certificates must chain to.
    pub ca: Option<PathBuf>,
    /// Whether clients are asked for certificates.
    pub client_auth: ClientAuth,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls server configuration the settings describe (TLS 1.2 and
/// 1.3, rustls' safe defaults).
pub fn server_config(s: &SslSettings) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&s.certificate)
        .and_then(|i| i.collect::<Result<_, _>>())
        .with_context(|| format!("reading certificates from {}", s.certificate.display()))?;
    if certs.is_empty() {
        bail!("{} holds no PEM certificate", s.certificate.display());
    }
    let key = PrivateKeyDer::from_pem_file(&s.key)
        .with_context(|| format!("reading a private key from {}", s.key.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match (s.client_auth, &s.ca) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, None) => bail!("--ssl-client-auth requested or required needs --ssl-ca-file"),
        (auth, Some(ca)) => {
            let mut roots = rustls::RootCertStore::empty();
            let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
                .and_then(|i| i.collect::<Result<_, _>>())
                .with_context(|| format!("reading CA certificates from {}", ca.display()))?;
            for c in cas {
                roots.add(c).with_context(|| {
                    format!("a certificate in {} is no trust anchor", ca.display())
                })?;
            }
            if roots.is_empty() {
                bail!("{} holds no PEM certificate", ca.display());
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            );
            let verifier = if auth == ClientAuth::Requested {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().context("client verifier")?)
        }
    };
    let config = builder.with_single_cert(certs, key).with_context(|| {
        format!(
            "the certificate {} and key {} do not go together",
            s.certificate.display(),
            s.key.display()
        )
    })?;
    Ok(Arc::new(config))
}

/// The listeners' TLS configuration, replaced when its files change.
#[derive(Debug)]
pub struct ServerTls {
    settings: SslSettings,
    current: RwLock<Arc<rustls::ServerConfig>>,
    /// Modification times of the files when last loaded.
    loaded: RwLock<Vec<Option<SystemTime>>>,
}

impl ServerTls {
    /// Loads the files (start-up: an error stops the start).
    pub fn load(settings: SslSettings) -> anyhow::Result<ServerTls> {
        let stamps = stamps(&settings);
        let config = server_config(&settings)?;
        Ok(ServerTls {
            settings,
            current: RwLock::new(config),
            loaded: RwLock::new(stamps),
        })
    }

    /// An acceptor with the configuration now.
    pub fn acceptor(&self) -> futures_rustls::TlsAcceptor {
        let config = self.current.read().map(|c| c.clone());
        futures_rustls::TlsAcceptor::from(config.unwrap_or_else(|e| e.into_inner().clone()))
    }

    /// Whether a file changed since it was loaded.
    pub fn changed(&self) -> bool {
        let now = stamps(&self.settings);
        self.loaded.read().map_or(true, |l| *l != now)
    }

    /// Reads the files again; on failure the current configuration stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let stamps = stamps(&self.settings);
        let result = server_config(&self.settings);
        // Not retried until a file changes again, failed or not.
        if let Ok(mut l) = self.loaded.write() {
            *l = stamps;
        }
        let config = result?;
        if let Ok(mut c) = self.current.write() {
            *c = config;
        }
        Ok(())
    }
}

/// The TLS handshake of a connection on an SSL:// listener, within
/// [`TLS_HANDSHAKE_TIMEOUT_MS`]; `None` (counted in `failures`, logged with
/// the client's address, the connection closed) if it fails or does not
/// finish.
pub async fn handshake<S>(
    acceptor: futures_rustls::TlsAcceptor,
    stream: S,
    peer: &str,
    failures: &Cell<u64>,
) -> Option<futures_rustls::server::TlsStream<S>>
where
    S: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin,
{
    let limit = Duration::from_millis(TLS_HANDSHAKE_TIMEOUT_MS);
    let done = futures_lite::future::or(async { Some(acceptor.accept(stream).await) }, async {
        glommio::timer::sleep(limit).await;
        None
    })
    .await;
    let why = match done {
        Some(Ok(s)) => return Some(s),
        Some(Err(e)) => format!("failed: {e}"),
        None => format!("not done within {TLS_HANDSHAKE_TIMEOUT_MS} ms"),
    };
    failures.set(failures.get() + 1);
    tracing::warn!(%peer, "closing connection: TLS handshake {why}");
    None
}

fn stamps(s: &SslSettings) -> Vec<Option<SystemTime>> {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut out = vec![modified(&s.certificate), modified(&s.key)];
    out.extend(s.ca.as_deref().map(modified));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_names_its_protocol_kafkas_way() {
        let ssl = split_listener("--listen", "SSL://0.0.0.0:9393").unwrap();
        assert_eq!(ssl, (SecurityProtocol::Ssl, "0.0.0.0:9393".to_string()));
        let plain = split_listener("--listen", "127.0.0.1:9292").unwrap();
        assert_eq!(plain.0, SecurityProtocol::Plaintext);
        let named = split_listener("--listen", "plaintext://127.0.0.1:1").unwrap();
        assert_eq!(named.0, SecurityProtocol::Plaintext);
        let sasl = split_listener("--kafka-listener", "sasl_ssl://h:1").unwrap();
        assert_eq!(sasl, (SecurityProtocol::SaslSsl, "h:1".to_string()));
        let bad = split_listener("--kafka-listener", "TLS://h:1").unwrap_err();
        assert!(
            bad.to_string().contains("unknown security protocol `TLS`"),
            "{bad}"
        );
    }

    #[test]
    fn missing_or_mismatched_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let s = SslSettings {
            certificate: dir.path().join("none.pem"),
            key: dir.path().join("none.key"),
            ca: None,
            client_auth: ClientAuth::None,
        };
        let e = format!("{:#}", server_config(&s).unwrap_err());
        assert!(e.contains("none.pem"), "{e}");
        std::fs::write(&s.certificate, "not a certificate").unwrap();
        let e = format!("{:#}", server_config(&s).unwrap_err());
        assert!(e.contains("holds no PEM certificate"), "{e}");
    }
}
