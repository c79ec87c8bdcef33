//! SASL mechanisms, sans-IO: the messages of `PLAIN` (RFC 4616) and
//! `SCRAM-SHA-256` / `SCRAM-SHA-512` (RFC 5802, RFC 7677), both sides.
//!
//! Nothing here knows a connection: the broker feeds the client's tokens
//! to a [`ScramServer`] and sends back what it answers; the SDK does the
//! same with a [`ScramClient`]. A stored credential is Kafka's: the salt,
//! the iteration count, `StoredKey = H(HMAC(SaltedPassword, "Client Key"))`
//! and `ServerKey = HMAC(SaltedPassword, "Server Key")` — never the
//! password, nor anything that lets a reader of the metadata log in.
//!
//! Supported as Kafka does: no channel binding (`n,,` or `y,,` only), an
//! authorization id only if it names the user itself, no extensions
//! (Kafka's `tokenauth` for delegation tokens is refused). Passwords are
//! used as their UTF-8 bytes (no SASLprep, as Kafka).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ring::{digest, hmac, pbkdf2, rand::SecureRandom};

/// Fewest PBKDF2 iterations a SCRAM credential may have (RFC 7677, Kafka).
pub const SCRAM_ITERATIONS_MIN: u32 = 4096;
/// Most PBKDF2 iterations (Kafka's bound: a login costs this many HMACs).
pub const SCRAM_ITERATIONS_MAX: u32 = 16384;
/// Longest token of an exchange accepted (a SCRAM message or a PLAIN
/// token is well under 1 KiB; a larger one is refused unparsed).
pub const TOKEN_BYTES_MAX: usize = 4096;
/// Longest user name.
pub const USER_BYTES_MAX: usize = 256;
/// Bytes of the random nonce each side adds.
const NONCE_BYTES: usize = 24;

/// Why an exchange failed. The message is for the server's log and, for
/// authentication failures, deliberately says no more than Kafka does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SaslError {
    /// Wrong user or password (the two are not told apart).
    #[error("authentication failed: invalid credentials")]
    BadCredentials,
    /// A message that does not follow the mechanism.
    #[error("malformed {mechanism} message: {reason}")]
    Malformed {
        /// Mechanism.
        mechanism: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Something the mechanism allows but Weir does not (channel binding,
    /// extensions, another authorization id).
    #[error("{0}")]
    Unsupported(String),
    /// The server's final message does not prove it knows the credential.
    #[error("the server's signature does not match: it does not hold this user's credential")]
    BadServerSignature,
    /// A token over [`TOKEN_BYTES_MAX`].
    #[error("SASL token of {0} bytes is over its limit ({TOKEN_BYTES_MAX} bytes; {OAUTHBEARER_TOKEN_BYTES_MAX} for OAUTHBEARER)")]
    TooLarge(usize),
    /// A parameter out of range (iterations, empty salt).
    #[error("{0}")]
    Invalid(String),
}

/// A SASL mechanism Weir serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mechanism {
    /// `PLAIN`: user and password in the clear (use it over TLS only).
    Plain,
    /// `SCRAM-SHA-256`.
    ScramSha256,
    /// `SCRAM-SHA-512`.
    ScramSha512,
    /// `OAUTHBEARER` (RFC 7628): a bearer token (a JWT the server checks
    /// against its keys).
    OAuthBearer,
}

impl Mechanism {
    /// Every mechanism, in the order servers list them.
    pub const ALL: [Mechanism; 3] = [
        Mechanism::ScramSha512,
        Mechanism::ScramSha256,
        Mechanism::Plain,
    ];

    /// The SASL name, e.g. `"SCRAM-SHA-512"`.
    pub const fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
            Mechanism::OAuthBearer => "OAUTHBEARER",
        }
    }

    /// The mechanism of a SASL name (case-sensitive, as SASL names are).
    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL
            .into_iter()
            .chain([Mechanism::OAuthBearer])
            .find(|m| m.name() == name)
    }

    /// The largest token a login of this mechanism may send: a JWT may be
    /// larger than a SCRAM message.
    pub const fn token_bytes_max(self) -> usize {
        match self {
            Mechanism::OAuthBearer => OAUTHBEARER_TOKEN_BYTES_MAX,
            _ => TOKEN_BYTES_MAX,
        }
    }

    /// Kafka's `ScramMechanism` number (AlterUserScramCredentials): 1 for
    /// SHA-256, 2 for SHA-512; `None` for PLAIN.
    pub const fn scram_type(self) -> Option<i8> {
        match self {
            Mechanism::Plain | Mechanism::OAuthBearer => None,
            Mechanism::ScramSha256 => Some(1),
            Mechanism::ScramSha512 => Some(2),
        }
    }

    /// The SCRAM mechanism of Kafka's `ScramMechanism` number.
    pub const fn from_scram_type(t: i8) -> Option<Mechanism> {
        match t {
            1 => Some(Mechanism::ScramSha256),
            2 => Some(Mechanism::ScramSha512),
            _ => None,
        }
    }

    fn hash(
        self,
    ) -> Option<(
        hmac::Algorithm,
        &'static digest::Algorithm,
        pbkdf2::Algorithm,
    )> {
        match self {
            Mechanism::Plain | Mechanism::OAuthBearer => None,
            Mechanism::ScramSha256 => Some((
                hmac::HMAC_SHA256,
                &digest::SHA256,
                pbkdf2::PBKDF2_HMAC_SHA256,
            )),
            Mechanism::ScramSha512 => Some((
                hmac::HMAC_SHA512,
                &digest::SHA512,
                pbkdf2::PBKDF2_HMAC_SHA512,
            )),
        }
    }

    fn scram(
        self,
    ) -> (
        hmac::Algorithm,
        &'static digest::Algorithm,
        pbkdf2::Algorithm,
    ) {
        self.hash().expect("a SCRAM mechanism")
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A stored SCRAM credential (what the metadata holds for a user and a
/// mechanism).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramCredential {
    /// Salt.
    pub salt: Vec<u8>,
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// `H(ClientKey)`.
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: Vec<u8>,
}

fn hmac_of(alg: hmac::Algorithm, key: &[u8], data: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(alg, key), data)
        .as_ref()
        .to_vec()
}

/// `SaltedPassword = Hi(password, salt, iterations)`.
pub fn salted_password(
    mechanism: Mechanism,
    password: &[u8],
    salt: &[u8],
    iterations: u32,
) -> Result<Vec<u8>, SaslError> {
    let (_, d, p) = mechanism
        .hash()
        .ok_or_else(|| SaslError::Invalid("PLAIN has no salted password".into()))?;
    check_iterations(iterations)?;
    let mut out = vec![0u8; d.output_len()];
    let n = std::num::NonZeroU32::new(iterations).expect("checked above");
    pbkdf2::derive(p, n, salt, password, &mut out);
    Ok(out)
}

fn check_iterations(iterations: u32) -> Result<(), SaslError> {
    if !(SCRAM_ITERATIONS_MIN..=SCRAM_ITERATIONS_MAX).contains(&iterations) {
        return Err(SaslError::Invalid(format!(
            "SCRAM iterations {iterations} are outside {SCRAM_ITERATIONS_MIN}..={SCRAM_ITERATIONS_MAX}"
        )));
    }
    Ok(())
}

impl ScramCredential {
    /// The credential of a salted password (what Kafka's
    /// AlterUserScramCredentials carries: the client salts the password).
    pub fn from_salted(
        mechanism: Mechanism,
        salt: Vec<u8>,
        iterations: u32,
        salted: &[u8],
    ) -> Result<ScramCredential, SaslError> {
        let (h, d, _) = mechanism
            .hash()
            .ok_or_else(|| SaslError::Invalid("PLAIN has no SCRAM credential".into()))?;
        check_iterations(iterations)?;
        if salt.is_empty() {
            return Err(SaslError::Invalid("a SCRAM salt may not be empty".into()));
        }
        if salted.len() != d.output_len() {
            return Err(SaslError::Invalid(format!(
                "a {mechanism} salted password is {} bytes, not {}",
                d.output_len(),
                salted.len()
            )));
        }
        let client_key = hmac_of(h, salted, b"Client Key");
        Ok(ScramCredential {
            salt,
            iterations,
            stored_key: digest::digest(d, &client_key).as_ref().to_vec(),
            server_key: hmac_of(h, salted, b"Server Key"),
        })
    }

    /// The credential of a password, with a fresh random salt.
    pub fn new(
        mechanism: Mechanism,
        password: &[u8],
        iterations: u32,
    ) -> Result<ScramCredential, SaslError> {
        let salt = random_bytes(32);
        let salted = salted_password(mechanism, password, &salt, iterations)?;
        ScramCredential::from_salted(mechanism, salt, iterations, &salted)
    }

    /// Whether `password` is this credential's (PLAIN logins against a
    /// stored SCRAM credential; costs `iterations` HMACs, constant time
    /// in the comparison).
    pub fn verify_password(&self, mechanism: Mechanism, password: &[u8]) -> bool {
        let Ok(salted) = salted_password(mechanism, password, &self.salt, self.iterations) else {
            return false;
        };
        let Ok(c) =
            ScramCredential::from_salted(mechanism, self.salt.clone(), self.iterations, &salted)
        else {
            return false;
        };
        constant_time_eq(&c.stored_key, &self.stored_key)
    }
}

/// Random bytes from the system's generator.
pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .expect("the system random generator works");
    out
}

fn random_nonce() -> String {
    B64.encode(random_bytes(NONCE_BYTES))
}

/// Equality whose time depends on the length only, not on where the
/// first difference is.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A PLAIN token's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainToken {
    /// The user.
    pub user: String,
    /// The password.
    pub password: String,
}

/// Parses a PLAIN token (`authzid NUL authcid NUL passwd`); an
/// authorization id other than empty or the user itself is refused.
pub fn parse_plain(token: &[u8]) -> Result<PlainToken, SaslError> {
    if token.len() > TOKEN_BYTES_MAX {
        return Err(SaslError::TooLarge(token.len()));
    }
    let malformed = |reason: &str| SaslError::Malformed {
        mechanism: "PLAIN",
        reason: reason.into(),
    };
    let text = std::str::from_utf8(token).map_err(|_| malformed("not UTF-8"))?;
    let mut parts = text.split('\0');
    let (Some(authz), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed(
            "expected authorization id, user and password separated by NUL",
        ));
    };
    if user.is_empty() || password.is_empty() {
        return Err(malformed("empty user or password"));
    }
    if !authz.is_empty() && authz != user {
        return Err(SaslError::Unsupported(
            "an authorization id other than the user is not supported".into(),
        ));
    }
    Ok(PlainToken {
        user: user.into(),
        password: password.into(),
    })
}

/// A PLAIN token for `user` and `password` (client side).
pub fn plain_token(user: &str, password: &str) -> Vec<u8> {
    format!("\0{user}\0{password}").into_bytes()
}

/// The largest OAUTHBEARER client message (its JWT included).
pub const OAUTHBEARER_TOKEN_BYTES_MAX: usize = 16 * 1024;

/// The bearer token of an OAUTHBEARER client first message (RFC 7628:
/// `n,[a=authzid],` then `\x01`-separated `key=value` pairs, one of them
/// `auth=Bearer <token>`, ending `\x01\x01`). Other pairs (`host`,
/// `port`, Kafka's extensions) are ignored; an authorization id is
/// refused (the principal is the token's subject).
pub fn parse_oauthbearer(message: &[u8]) -> Result<String, SaslError> {
    if message.len() > OAUTHBEARER_TOKEN_BYTES_MAX {
        return Err(SaslError::TooLarge(message.len()));
    }
    let malformed = |reason: &str| SaslError::Malformed {
        mechanism: "OAUTHBEARER",
        reason: reason.into(),
    };
    let text = std::str::from_utf8(message).map_err(|_| malformed("not UTF-8"))?;
    let Some((gs2, rest)) = text.split_once('\x01') else {
        return Err(malformed("no \\x01 after the GS2 header"));
    };
    let mut header = gs2.split(',');
    match (header.next(), header.next(), header.next(), header.next()) {
        (Some("n" | "y"), Some(""), Some(""), None) => {}
        (Some("n" | "y"), Some(a), Some(""), None) if a.starts_with("a=") => {
            return Err(SaslError::Unsupported(
                "an authorization id is not supported: the principal is the token's subject".into(),
            ))
        }
        (Some(p), ..) if p.starts_with("p=") => {
            return Err(SaslError::Unsupported(
                "channel binding is not supported".into(),
            ))
        }
        _ => return Err(malformed("the GS2 header is not `n,,`")),
    }
    let Some(pairs) = rest.strip_suffix("\x01\x01") else {
        return Err(malformed("the message does not end with \\x01\\x01"));
    };
    for pair in pairs.split('\x01') {
        if let Some(value) = pair.strip_prefix("auth=") {
            let Some((scheme, token)) = value.split_once(' ') else {
                return Err(malformed("auth is not `Bearer <token>`"));
            };
            if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
                return Err(malformed("auth is not `Bearer <token>`"));
            }
            return Ok(token.trim().to_string());
        }
    }
    Err(malformed("no auth=Bearer <token>"))
}

/// An OAUTHBEARER client first message carrying `token` (client side).
pub fn oauthbearer_message(token: &str) -> Vec<u8> {
    format!("n,,\x01auth=Bearer {token}\x01\x01").into_bytes()
}

/// `saslname` of RFC 5802: `,` and `=` escaped.
fn escape_name(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

fn unescape_name(name: &str) -> Result<String, SaslError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => {
                return Err(SaslError::Malformed {
                    mechanism: "SCRAM",
                    reason: "bad escape in the user name".into(),
                })
            }
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The `k=v` attributes of a SCRAM message, in order.
fn attributes(msg: &str) -> Result<Vec<(char, &str)>, SaslError> {
    msg.split(',')
        .map(|part| {
            let mut c = part.chars();
            match (c.next(), c.next()) {
                (Some(k), Some('=')) if k.is_ascii_alphabetic() => Ok((k, &part[2..])),
                _ => Err(SaslError::Malformed {
                    mechanism: "SCRAM",
                    reason: format!(
                        "bad attribute `{}`",
                        part.chars().take(32).collect::<String>()
                    ),
                }),
            }
        })
        .collect()
}

fn scram_text(token: &[u8]) -> Result<&str, SaslError> {
    if token.len() > TOKEN_BYTES_MAX {
        return Err(SaslError::TooLarge(token.len()));
    }
    std::str::from_utf8(token).map_err(|_| SaslError::Malformed {
        mechanism: "SCRAM",
        reason: "not UTF-8".into(),
    })
}

fn printable_nonce(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

/// The server side of one SCRAM exchange.
#[derive(Debug)]
pub struct ScramServer {
    mechanism: Mechanism,
    state: ServerState,
}

#[derive(Debug)]
enum ServerState {
    /// Waiting for the client's first message.
    First,
    /// Sent the server-first message; waiting for the client's final.
    Final {
        user: String,
        /// `None`: the user is unknown (the exchange goes on with a made-up
        /// salt and fails at the end, so an unknown user looks like a wrong
        /// password).
        credential: Option<ScramCredential>,
        nonce: String,
        /// The client's part of `nonce`, its first bytes.
        cnonce_len: usize,
        gs2_header: String,
        auth_prefix: String,
    },
    /// Finished (either way): any further message is an error.
    Done,
}

impl ScramServer {
    /// A new exchange for `mechanism` (a SCRAM one).
    pub fn new(mechanism: Mechanism) -> ScramServer {
        assert!(
            mechanism.hash().is_some(),
            "ScramServer needs a SCRAM mechanism"
        );
        ScramServer {
            mechanism,
            state: ServerState::First,
        }
    }

    /// The user named in the client's first message, once it arrived.
    pub fn user(&self) -> Option<&str> {
        match &self.state {
            ServerState::Final { user, .. } => Some(user),
            _ => None,
        }
    }

    /// Takes the client-first message; `lookup` finds the user's
    /// credential. Answers the server-first message.
    pub fn client_first(
        &mut self,
        token: &[u8],
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<Vec<u8>, SaslError> {
        if !matches!(self.state, ServerState::First) {
            self.state = ServerState::Done;
            return Err(SaslError::Malformed {
                mechanism: self.mechanism.name(),
                reason: "client-first message out of turn".into(),
            });
        }
        self.state = ServerState::Done;
        let text = scram_text(token)?;
        let malformed = |reason: &str| SaslError::Malformed {
            mechanism: self.mechanism.name(),
            reason: reason.into(),
        };
        // gs2-header: "n,," / "y,," / "n,a=user,"; then client-first-bare.
        let (cb, rest) = text
            .split_once(',')
            .ok_or_else(|| malformed("no GS2 header"))?;
        let (authz, bare) = rest
            .split_once(',')
            .ok_or_else(|| malformed("no GS2 header"))?;
        match cb {
            "n" | "y" => {}
            c if c.starts_with("p=") => {
                return Err(SaslError::Unsupported(
                    "SCRAM channel binding (-PLUS) is not supported".into(),
                ))
            }
            _ => return Err(malformed("bad channel binding flag")),
        }
        let attrs = attributes(bare)?;
        let mut user = None;
        let mut cnonce = None;
        for (i, (k, v)) in attrs.iter().enumerate() {
            match (i, k) {
                (0, 'm') => {
                    return Err(SaslError::Unsupported(
                        "SCRAM mandatory extensions are not supported".into(),
                    ))
                }
                (0, 'n') => user = Some(unescape_name(v)?),
                (1, 'r') => cnonce = Some(*v),
                // Kafka's extensions (tokenauth=true: delegation tokens).
                (_, _) if i >= 2 => {
                    return Err(SaslError::Unsupported(format!(
                        "SCRAM extension `{k}` is not supported (delegation tokens are not served)"
                    )))
                }
                _ => return Err(malformed("expected n=user,r=nonce")),
            }
        }
        let (Some(user), Some(cnonce)) = (user, cnonce) else {
            return Err(malformed("expected n=user,r=nonce"));
        };
        if user.is_empty() || user.len() > USER_BYTES_MAX {
            return Err(malformed("empty or over-long user name"));
        }
        if !printable_nonce(cnonce) {
            return Err(malformed("bad client nonce"));
        }
        if let Some(a) = authz.strip_prefix("a=") {
            if unescape_name(a)? != user {
                return Err(SaslError::Unsupported(
                    "an authorization id other than the user is not supported".into(),
                ));
            }
        } else if !authz.is_empty() {
            return Err(malformed("bad authorization id"));
        }
        let credential = lookup(&user);
        let (salt, iterations) = match &credential {
            Some(c) => (c.salt.clone(), c.iterations),
            // A made-up salt, the same for the same user each time (a
            // stable answer does not tell an unknown user from a known one).
            None => (
                digest::digest(
                    &digest::SHA256,
                    format!("weir-unknown-user:{user}").as_bytes(),
                )
                .as_ref()
                .to_vec(),
                SCRAM_ITERATIONS_MIN,
            ),
        };
        let nonce = format!("{cnonce}{}", random_nonce());
        let server_first = format!("r={nonce},s={},i={iterations}", B64.encode(&salt));
        let gs2_header = format!("{cb},{authz},");
        self.state = ServerState::Final {
            user,
            credential,
            cnonce_len: cnonce.len(),
            nonce,
            gs2_header,
            auth_prefix: format!("{bare},{server_first}"),
        };
        Ok(server_first.into_bytes())
    }

    /// Takes the client-final message: the user on success, and the
    /// server-final message to send.
    pub fn client_final(&mut self, token: &[u8]) -> Result<(String, Vec<u8>), SaslError> {
        let state = std::mem::replace(&mut self.state, ServerState::Done);
        let ServerState::Final {
            user,
            credential,
            nonce,
            cnonce_len,
            gs2_header,
            auth_prefix,
        } = state
        else {
            return Err(SaslError::Malformed {
                mechanism: self.mechanism.name(),
                reason: "client-final message out of turn".into(),
            });
        };
        let malformed = |reason: &str| SaslError::Malformed {
            mechanism: self.mechanism.name(),
            reason: reason.into(),
        };
        let text = scram_text(token)?;
        let (without_proof, proof) = text
            .rsplit_once(",p=")
            .ok_or_else(|| malformed("no proof"))?;
        let attrs = attributes(without_proof)?;
        let (Some(('c', cbind)), Some(('r', r))) = (attrs.first(), attrs.get(1)) else {
            return Err(malformed("expected c=…,r=…,p=…"));
        };
        if attrs.len() > 2 {
            return Err(SaslError::Unsupported(
                "SCRAM extensions are not supported".into(),
            ));
        }
        if B64.decode(cbind).ok().as_deref() != Some(gs2_header.as_bytes()) {
            return Err(malformed("channel binding does not repeat the GS2 header"));
        }
        // A nonce other than this exchange's: a replayed or forged message.
        // librdkafka before 2.6.1 sends its own nonce once more in front
        // (librdkafka#4895): accepted, as Kafka 3.8.1–3.9 do, since it
        // still carries this exchange's server nonce whole.
        let doubled = r.len() == cnonce_len + nonce.len()
            && r.as_bytes()[..cnonce_len] == nonce.as_bytes()[..cnonce_len];
        let r = if doubled { &r[cnonce_len..] } else { r };
        if !constant_time_eq(r.as_bytes(), nonce.as_bytes()) {
            return Err(SaslError::BadCredentials);
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| malformed("proof is not base64"))?;
        let (h, d, _) = self.mechanism.scram();
        let auth_message = format!("{auth_prefix},{without_proof}");
        let Some(credential) = credential else {
            return Err(SaslError::BadCredentials);
        };
        let client_signature = hmac_of(h, &credential.stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return Err(SaslError::BadCredentials);
        }
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let stored = digest::digest(d, &client_key);
        if !constant_time_eq(stored.as_ref(), &credential.stored_key) {
            return Err(SaslError::BadCredentials);
        }
        let server_signature = hmac_of(h, &credential.server_key, auth_message.as_bytes());
        Ok((
            user,
            format!("v={}", B64.encode(server_signature)).into_bytes(),
        ))
    }
}

/// The client side of one SCRAM exchange.
#[derive(Debug)]
pub struct ScramClient {
    mechanism: Mechanism,
    password: Vec<u8>,
    first_bare: String,
    cnonce: String,
    server_signature: Option<Vec<u8>>,
}

impl ScramClient {
    /// Starts an exchange for `user`: the client and its first message.
    pub fn start(mechanism: Mechanism, user: &str, password: &str) -> (ScramClient, Vec<u8>) {
        Self::start_with_nonce(mechanism, user, password, random_nonce())
    }

    fn start_with_nonce(
        mechanism: Mechanism,
        user: &str,
        password: &str,
        cnonce: String,
    ) -> (ScramClient, Vec<u8>) {
        assert!(
            mechanism.hash().is_some(),
            "ScramClient needs a SCRAM mechanism"
        );
        let first_bare = format!("n={},r={cnonce}", escape_name(user));
        let first = format!("n,,{first_bare}").into_bytes();
        (
            ScramClient {
                mechanism,
                password: password.as_bytes().to_vec(),
                first_bare,
                cnonce,
                server_signature: None,
            },
            first,
        )
    }

    /// Takes the server-first message; answers the client-final one.
    pub fn server_first(&mut self, token: &[u8]) -> Result<Vec<u8>, SaslError> {
        let text = scram_text(token)?;
        let malformed = |reason: &str| SaslError::Malformed {
            mechanism: self.mechanism.name(),
            reason: reason.into(),
        };
        let attrs = attributes(text)?;
        let (Some(('r', nonce)), Some(('s', salt)), Some(('i', iterations))) =
            (attrs.first(), attrs.get(1), attrs.get(2))
        else {
            return Err(malformed("expected r=…,s=…,i=…"));
        };
        if !nonce.starts_with(&self.cnonce) || nonce.len() == self.cnonce.len() {
            return Err(malformed("the server nonce does not extend the client's"));
        }
        let salt = B64
            .decode(salt)
            .map_err(|_| malformed("salt is not base64"))?;
        let iterations: u32 = iterations
            .parse()
            .map_err(|_| malformed("iterations are not a number"))?;
        let salted = salted_password(self.mechanism, &self.password, &salt, iterations)?;
        let (h, d, _) = self.mechanism.scram();
        let client_key = hmac_of(h, &salted, b"Client Key");
        let stored_key = digest::digest(d, &client_key);
        let without_proof = format!("c={},r={nonce}", B64.encode("n,,"));
        let auth_message = format!("{},{text},{without_proof}", self.first_bare);
        let signature = hmac_of(h, stored_key.as_ref(), auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = hmac_of(h, &salted, b"Server Key");
        self.server_signature = Some(hmac_of(h, &server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Checks the server-final message.
    pub fn server_final(&self, token: &[u8]) -> Result<(), SaslError> {
        let text = scram_text(token)?;
        if let Some(e) = text.strip_prefix("e=") {
            return Err(SaslError::Unsupported(format!("the server refused: {e}")));
        }
        let v = text
            .strip_prefix("v=")
            .and_then(|v| B64.decode(v).ok())
            .ok_or_else(|| SaslError::Malformed {
                mechanism: self.mechanism.name(),
                reason: "expected v=signature".into(),
            })?;
        match &self.server_signature {
            Some(s) if constant_time_eq(s, &v) => Ok(()),
            _ => Err(SaslError::BadServerSignature),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's SCRAM-SHA-256 example, both sides.
    #[test]
    fn rfc_7677_example() {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = salted_password(Mechanism::ScramSha256, b"pencil", &salt, 4096).unwrap();
        let cred =
            ScramCredential::from_salted(Mechanism::ScramSha256, salt, 4096, &salted).unwrap();
        let (mut client, first) = ScramClient::start_with_nonce(
            Mechanism::ScramSha256,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO".into(),
        );
        assert_eq!(first, b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        // The server's nonce is random here, so the example's server-first
        // message is fed to the client directly.
        let server_first =
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let fin = client.server_first(server_first).unwrap();
        assert_eq!(
            String::from_utf8(fin).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        client
            .server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
        assert!(cred.verify_password(Mechanism::ScramSha256, b"pencil"));
        assert!(!cred.verify_password(Mechanism::ScramSha256, b"pencil "));
    }

    fn exchange(
        mech: Mechanism,
        stored: &ScramCredential,
        password: &str,
    ) -> Result<String, SaslError> {
        let (mut client, first) = ScramClient::start(mech, "al,i=ce", password);
        let mut server = ScramServer::new(mech);
        let sf = server.client_first(&first, |u| (u == "al,i=ce").then(|| stored.clone()))?;
        let cf = client.server_first(&sf)?;
        let (user, fin) = server.client_final(&cf)?;
        client.server_final(&fin)?;
        Ok(user)
    }

    #[test]
    fn both_sides_agree_and_a_wrong_password_fails() {
        for mech in [Mechanism::ScramSha256, Mechanism::ScramSha512] {
            let stored = ScramCredential::new(mech, b"s3cret", 4096).unwrap();
            assert_eq!(exchange(mech, &stored, "s3cret").unwrap(), "al,i=ce");
            assert_eq!(
                exchange(mech, &stored, "wrong"),
                Err(SaslError::BadCredentials)
            );
        }
    }

    #[test]
    fn an_unknown_user_fails_like_a_wrong_password() {
        let mech = Mechanism::ScramSha512;
        let (mut client, first) = ScramClient::start(mech, "nobody", "x");
        let mut server = ScramServer::new(mech);
        let sf = server.client_first(&first, |_| None).unwrap();
        let cf = client.server_first(&sf).unwrap();
        assert_eq!(server.client_final(&cf), Err(SaslError::BadCredentials));
    }

    #[test]
    fn a_replayed_client_final_fails_on_a_new_exchange() {
        let mech = Mechanism::ScramSha256;
        let stored = ScramCredential::new(mech, b"pw", 4096).unwrap();
        let (mut client, first) = ScramClient::start(mech, "u", "pw");
        let mut server = ScramServer::new(mech);
        let sf = server
            .client_first(&first, |_| Some(stored.clone()))
            .unwrap();
        let cf = client.server_first(&sf).unwrap();
        server.client_final(&cf).unwrap();
        // The same two client messages on a new exchange: the server's
        // nonce differs, so the captured final message is refused.
        let mut again = ScramServer::new(mech);
        again
            .client_first(&first, |_| Some(stored.clone()))
            .unwrap();
        assert_eq!(again.client_final(&cf), Err(SaslError::BadCredentials));
        // And a finished exchange takes nothing more.
        assert!(server.client_final(&cf).is_err());
    }

    #[test]
    fn old_librdkafkas_doubled_client_nonce_is_accepted_and_still_bound_to_the_exchange() {
        let mech = Mechanism::ScramSha512;
        let stored = ScramCredential::new(mech, b"pw", 4096).unwrap();
        // What librdkafka < 2.6.1 does: r = client nonce + the server's r.
        let final_with = |sf: &[u8], r_of: &dyn Fn(&str, &str) -> String| {
            let text = std::str::from_utf8(sf).unwrap().to_string();
            let server_r = text.split(',').next().unwrap()[2..].to_string();
            let (_, d, _) = mech.scram();
            let salted = salted_password(mech, b"pw", &stored.salt, 4096).unwrap();
            let client_key = hmac_of(hmac::HMAC_SHA512, &salted, b"Client Key");
            let stored_key = digest::digest(d, &client_key);
            let without_proof = format!("c=biws,r={}", r_of("cn0nce", &server_r));
            let auth = format!("n=u,r=cn0nce,{text},{without_proof}");
            let sig = hmac_of(hmac::HMAC_SHA512, stored_key.as_ref(), auth.as_bytes());
            let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
            format!("{without_proof},p={}", B64.encode(proof)).into_bytes()
        };
        let run = |r_of: &dyn Fn(&str, &str) -> String| {
            let mut server = ScramServer::new(mech);
            let sf = server
                .client_first(b"n,,n=u,r=cn0nce", |_| Some(stored.clone()))
                .unwrap();
            server.client_final(&final_with(&sf, r_of)).map(|(u, _)| u)
        };
        assert_eq!(run(&|_, s| s.to_string()).unwrap(), "u");
        assert_eq!(run(&|c, s| format!("{c}{s}")).unwrap(), "u");
        // Anything else is refused: the client nonce alone, twice, or the
        // server nonce cut short.
        assert!(run(&|c, _| c.to_string()).is_err());
        assert!(run(&|c, _| format!("{c}{c}")).is_err());
        assert!(run(&|c, s| format!("{c}{}", &s[..s.len() - 1])).is_err());
    }

    #[test]
    fn bad_messages_are_refused() {
        let mech = Mechanism::ScramSha256;
        for bad in [
            &b""[..],
            b"n,,",
            b"x,,n=u,r=abc",
            b"p=tls-unique,,n=u,r=abc",
            b"n,,m=ext,n=u,r=abc",
            b"n,,n=u,r=abc,tokenauth=true",
            b"n,a=other,n=u,r=abc",
            b"n,,n=u=zz,r=abc",
            b"n,,n=,r=abc",
            b"\xff\xfe",
        ] {
            let mut s = ScramServer::new(mech);
            assert!(s.client_first(bad, |_| None).is_err(), "{bad:?}");
        }
        let mut s = ScramServer::new(mech);
        let big = vec![b'a'; TOKEN_BYTES_MAX + 1];
        assert_eq!(
            s.client_first(&big, |_| None),
            Err(SaslError::TooLarge(TOKEN_BYTES_MAX + 1))
        );
        assert!(ScramCredential::new(mech, b"pw", 1000).is_err());
    }

    #[test]
    fn plain_tokens() {
        assert_eq!(
            parse_plain(&plain_token("alice", "pw")).unwrap(),
            PlainToken {
                user: "alice".into(),
                password: "pw".into()
            }
        );
        assert!(parse_plain(b"alice\0alice\0pw").is_ok());
        assert!(parse_plain(b"bob\0alice\0pw").is_err());
        assert!(parse_plain(b"\0alice").is_err());
        assert!(parse_plain(b"\0alice\0pw\0x").is_err());
        assert!(parse_plain(b"\0\0pw").is_err());
    }

    #[test]
    fn oauthbearer_messages_round_trip_and_bad_ones_are_refused() {
        let m = oauthbearer_message("eyJ.a.b");
        assert_eq!(m, b"n,,\x01auth=Bearer eyJ.a.b\x01\x01");
        assert_eq!(parse_oauthbearer(&m).unwrap(), "eyJ.a.b");
        // Kafka's clients add extensions and librdkafka host/port pairs.
        let with = b"n,,\x01host=x\x01auth=Bearer t0k\x01traceId=1\x01\x01";
        assert_eq!(parse_oauthbearer(with).unwrap(), "t0k");
        for (bad, why) in [
            (&b"n,,auth=Bearer t"[..], "GS2"),
            (b"n,,\x01auth=Bearer t\x01", "end"),
            (b"n,,\x01auth=Basic dTpw\x01\x01", "Bearer"),
            (b"n,,\x01auth=Bearer \x01\x01", "Bearer"),
            (b"n,,\x01host=x\x01\x01", "no auth"),
            (b"x,,\x01auth=Bearer t\x01\x01", "GS2"),
            (b"n,a=admin,\x01auth=Bearer t\x01\x01", "authorization id"),
            (b"\xff\x01", "UTF-8"),
        ] {
            let e = parse_oauthbearer(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        let huge = oauthbearer_message(&"a".repeat(OAUTHBEARER_TOKEN_BYTES_MAX));
        assert!(matches!(
            parse_oauthbearer(&huge),
            Err(SaslError::TooLarge(_))
        ));
        assert_eq!(
            Mechanism::from_name("OAUTHBEARER"),
            Some(Mechanism::OAuthBearer)
        );
        assert!(!Mechanism::ALL.contains(&Mechanism::OAuthBearer));
    }
}
