//! The crate's error type.
//!
//! Every fallible function of the crate (outside the controller's own
//! [`crate::ControllerError`]) fails with an [`Error`]. Its message says
//! what was being done; the error that caused it, if any, is its
//! [`source`](std::error::Error::source). Print the whole chain with
//! [`Error::chain`].

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// A `Result` whose error defaults to this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an operation of `weir-replication` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // Files.
    /// A file or directory operation failed.
    #[error("{action} {}", .path.display())]
    Io {
        /// What was being done ("creating", "writing", …).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The cluster CA's key cannot be read (no CA was created there?).
    #[error(
        "reading the cluster CA key {} (create a CA first with `weir cluster certs`)",
        .path.display()
    )]
    ReadCaKey {
        /// The key file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be replaced atomically.
    #[error("{}", .path.display())]
    Replace {
        /// The file.
        path: PathBuf,
        /// The storage layer's error.
        #[source]
        source: weir_storage::error::StorageError,
    },
    /// A file of the Raft directory does not decode.
    #[error("{}: {message}", .path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why it does not decode.
        message: String,
    },
    /// The Raft directory's `format` file does not hold a number.
    #[error("{}: not a format number: {text:?}", .path.display())]
    FormatMarker {
        /// The `format` file.
        path: PathBuf,
        /// What it holds.
        text: String,
    },
    /// The Raft directory was written in another format.
    #[error(
        "{} holds the controller's Raft log in format {found}; this build reads format {}: run \
         the build that wrote it, or start this node from an empty data directory",
        .dir.display(),
        .reads
    )]
    RaftFormat {
        /// The Raft directory.
        dir: PathBuf,
        /// The format it was written in.
        found: u32,
        /// The format this build reads.
        reads: u32,
    },
    /// The Raft directory was written by an early build (format 1, which
    /// left no `format` file).
    #[error(
        "{} holds the controller's Raft log in format 1 (an earlier development build); this \
         build reads format {}: run the build that wrote it, or start this node from an empty \
         data directory",
        .dir.display(),
        .reads
    )]
    RaftFormatUnmarked {
        /// The Raft directory.
        dir: PathBuf,
        /// The format this build reads.
        reads: u32,
    },
    /// The Raft log or snapshot cannot be opened.
    #[error("opening the Raft {what} in {}", .dir.display())]
    OpenRaft {
        /// "log" or "snapshot".
        what: &'static str,
        /// The Raft directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: Box<Error>,
    },

    // Endpoints and connections.
    /// A QUIC endpoint (its UDP socket) cannot be set up.
    #[error("{action}")]
    Endpoint {
        /// What was being done, with the address.
        action: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A node's address cannot be resolved.
    #[error("resolving node {node}'s address `{addr}`")]
    Resolve {
        /// The node.
        node: u64,
        /// Its address.
        addr: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A node's address resolves to no socket address.
    #[error("node {node}'s address `{addr}` resolves to nothing")]
    Unresolved {
        /// The node.
        node: u64,
        /// Its address.
        addr: String,
    },
    /// A connection to a node cannot be started.
    #[error("connecting to node {node} at {addr}")]
    Connect {
        /// The node.
        node: u64,
        /// Its address.
        addr: String,
        /// QUIC's error.
        #[source]
        source: quinn::ConnectError,
    },
    /// The handshake with a node failed (a certificate refused by either
    /// side, the node unreachable, …).
    #[error("TLS handshake with node {node} at {addr}")]
    Handshake {
        /// The node.
        node: u64,
        /// Its address.
        addr: String,
        /// QUIC's error.
        #[source]
        source: quinn::ConnectionError,
    },
    /// An established connection failed.
    #[error("{action}")]
    Connection {
        /// What was being done ("opening a stream", …).
        action: &'static str,
        /// QUIC's error.
        #[source]
        source: quinn::ConnectionError,
    },
    /// Writing a frame to a stream failed.
    #[error("writing a frame")]
    Write {
        /// QUIC's error.
        #[source]
        source: quinn::WriteError,
    },
    /// Finishing a stream failed.
    #[error("finishing a stream")]
    Finish {
        /// QUIC's error.
        #[source]
        source: quinn::ClosedStream,
    },
    /// Reading from a stream failed.
    #[error("{action}")]
    Read {
        /// What was being read ("a frame header", …).
        action: &'static str,
        /// QUIC's error.
        #[source]
        source: quinn::ReadExactError,
    },
    /// A call to a node took longer than its limit.
    #[error("node {node} at {addr} did not answer within {limit:?}")]
    Timeout {
        /// The node.
        node: u64,
        /// Its address.
        addr: String,
        /// The limit.
        limit: Duration,
    },

    // The node protocol.
    /// A frame's header is not a Weir node frame's.
    #[error("not a Weir node frame (magic {magic:#04x}, version {version})")]
    NotAFrame {
        /// The header's first byte.
        magic: u8,
        /// The header's version byte.
        version: u8,
    },
    /// A frame's body is longer than the limit (`wire::BODY_MAX`).
    #[error("frame of {len} bytes is over the {max}-byte limit")]
    FrameTooLarge {
        /// The limit.
        max: usize,
        /// The body length in the header.
        len: usize,
    },
    /// A frame's body does not decode.
    #[error("{message}")]
    Malformed {
        /// Why.
        message: String,
    },
    /// A node refused this node's hello.
    #[error("node {node} at {addr} refused this node: {reason}")]
    Refused {
        /// The node.
        node: u64,
        /// Its address.
        addr: String,
        /// Its reason.
        reason: String,
    },
    /// A leader refused a fetch.
    #[error("fetch refused: {reason}")]
    FetchRefused {
        /// The leader's reason.
        reason: String,
    },
    /// A node answered with a message the protocol does not allow there.
    #[error("{message}")]
    Unexpected {
        /// What was asked and answered.
        message: String,
    },
    /// This node refused a node of another cluster.
    #[error("refused node {node} of cluster `{cluster_id}`")]
    WrongCluster {
        /// The node.
        node: u64,
        /// Its cluster id.
        cluster_id: String,
    },
    /// A data connection did not start with a hello.
    #[error("a data connection did not start with a hello")]
    NoHello,
    /// This node refused a node whose certificate does not match its
    /// hello.
    #[error("refused a node")]
    PeerRejected {
        /// Why.
        #[source]
        source: Box<Error>,
    },

    // Certificates and TLS.
    /// A certificate directory already holds a cluster CA.
    #[error(
        "{} already holds a cluster CA; add nodes with --add-node instead of making a new CA \
         (a new CA would lock every existing node out)",
        .dir.display()
    )]
    CaExists {
        /// The directory.
        dir: PathBuf,
    },
    /// A node's certificate exists already.
    #[error(
        "{} exists; remove it first to issue a new certificate for node {node}",
        .path.display()
    )]
    NodeCertExists {
        /// The certificate file.
        path: PathBuf,
        /// The node.
        node: u64,
    },
    /// A client certificate of that name exists already.
    #[error("{} exists; remove it first to issue a new one", .path.display())]
    ClientCertExists {
        /// The certificate file.
        path: PathBuf,
    },
    /// A client name that cannot name a certificate file.
    #[error("client name `{name}`: use 1 to 64 letters, digits, `.`, `_` or `-`")]
    ClientName {
        /// The name given.
        name: String,
    },
    /// Generating a key or signing a certificate failed.
    #[error("{action}")]
    Certificate {
        /// What was being done.
        action: &'static str,
        /// rcgen's error.
        #[source]
        source: rcgen::Error,
    },
    /// A private key file does not parse.
    #[error("parsing {}", .path.display())]
    ParseKey {
        /// The key file.
        path: PathBuf,
        /// rcgen's error.
        #[source]
        source: rcgen::Error,
    },
    /// A PEM file cannot be read.
    #[error("reading {what} from {}", .path.display())]
    ReadPem {
        /// "a certificate" or "a private key".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The PEM error.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A TLS configuration cannot be built.
    #[error("{action}")]
    Tls {
        /// What was being done.
        action: &'static str,
        /// rustls' error.
        #[source]
        source: rustls::Error,
    },
    /// The client certificate verifier cannot be built.
    #[error("building the client certificate verifier")]
    ClientVerifier {
        /// rustls' error.
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
    /// A rustls configuration is not usable for QUIC.
    #[error("QUIC {side} TLS configuration")]
    QuicTls {
        /// "server" or "client".
        side: &'static str,
        /// quinn's error.
        #[source]
        source: quinn::crypto::rustls::NoInitialCipherSuite,
    },
    /// The peer of a connection presented no certificate.
    #[error("the peer presented no certificate")]
    NoPeerCertificate,
    /// The peer's certificate cannot be parsed.
    #[error("the peer's certificate cannot be read")]
    PeerCertificate {
        /// webpki's error.
        #[source]
        source: webpki::Error,
    },
    /// A node's server name is not a valid DNS name.
    #[error("a node name")]
    NodeName {
        /// The error.
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
    /// The peer's certificate is not the certificate of the node its
    /// hello claims to be.
    #[error(
        "it says it is node {node}, but its certificate is not node {node}'s (it does not name \
         {name})"
    )]
    NotThatNode {
        /// The node the hello claims.
        node: u64,
        /// That node's server name.
        name: String,
    },

    // The controller.
    /// Node id 0 was configured.
    #[error("node id 0 is not allowed: use 1 or more")]
    NodeIdZero,
    /// The Raft configuration is invalid.
    #[error("Raft configuration")]
    RaftConfig {
        /// openraft's error.
        #[source]
        source: Box<openraft::ConfigError>,
    },
    /// The Raft member cannot start.
    #[error("starting Raft")]
    RaftStart {
        /// openraft's error.
        #[source]
        source: Box<openraft::error::Fatal<u64>>,
    },
    /// The initial voters cannot initialize the quorum.
    #[error("initializing the metadata quorum")]
    RaftInit {
        /// openraft's error.
        #[source]
        source: Box<
            openraft::error::RaftError<
                u64,
                openraft::error::InitializeError<u64, openraft::BasicNode>,
            >,
        >,
    },
    /// The controller's thread or runtime cannot start.
    #[error("{action}")]
    Thread {
        /// What was being done.
        action: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The controller's thread ended before it was ready.
    #[error("the controller thread ended before it started")]
    ThreadEnded,
}

impl Error {
    /// An [`Error::Io`] maker for `map_err`: `action` on `path` failed.
    pub(crate) fn io(
        action: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.to_path_buf();
        move |source| Error::Io {
            action,
            path,
            source,
        }
    }

    /// Displays this error and its sources, each after a `: ` (what an
    /// error-reporting crate prints for `{:#}`).
    pub fn chain(&self) -> Chain<'_> {
        Chain(self)
    }
}

/// An [`Error`] and its sources, displayed `: `-separated (see
/// [`Error::chain`]).
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(&'a Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = std::error::Error::source(self.0);
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

// Callers' `?` can box it as a `dyn Error + Send + Sync + 'static`.
const _: () = {
    const fn is_send_sync<T: Send + Sync + 'static>() {}
    is_send_sync::<Error>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_shows_every_source() {
        let e = Error::PeerRejected {
            source: Box::new(Error::PeerCertificate {
                source: webpki::Error::BadDer,
            }),
        };
        assert_eq!(e.to_string(), "refused a node");
        assert_eq!(
            e.chain().to_string(),
            format!(
                "refused a node: the peer's certificate cannot be read: {}",
                webpki::Error::BadDer
            )
        );
    }
}
