//! SASL logins to a broker's `SASL_PLAINTEXT://` or `SASL_SSL://` native
//! listener (Kafka's `security.protocol=SASL_*`, `sasl.mechanism`,
//! `sasl.username`, `sasl.password`): PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
//! (the messages are [`weir_proto::sasl`]'s), and OAUTHBEARER with a JWT
//! read from `weir.sasl.oauthbearer.token.file` at every login. Each new connection logs in
//! before its first request (`conn::sasl_login`); a refused login is
//! [`ClientError::Authentication`](crate::ClientError::Authentication).
//!
//! Re-authentication (KIP-368): when the broker limits a login's lifetime
//! (`--connections-max-reauth-ms`, a token's expiry), the connection logs
//! in again at 85 % of it, in the background, its messages pipelined with
//! the other requests (`conn::Pipeline::reauthenticate_if_due`). Should
//! that fail, the broker closes the connection when the login expires and
//! the next call opens (and logs in on) a new one.

use weir_proto::sasl::Mechanism;

/// Who logs in, and how.
#[derive(Clone, PartialEq, Eq)]
pub struct SaslSettings {
    /// The mechanism (`sasl.mechanism`).
    pub mechanism: Mechanism,
    /// The user (`sasl.username`).
    pub username: String,
    /// The password (`sasl.password`).
    pub password: String,
    /// OAUTHBEARER: the file holding the token.
    pub token_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for SaslSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslSettings")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .field("token_file", &self.token_file)
            .finish()
    }
}
