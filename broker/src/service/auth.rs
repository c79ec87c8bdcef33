//! Who a connection is: its [`Session`] (the principal, the SASL login
//! under way or done), and SASL logins checked against the users'
//! credentials in the cluster metadata — the same for every protocol
//! that carries SASL tokens.
//!
//! **Logins.** A SASL_* listener serves nothing but the login before one
//! succeeds ([`Session::gate`]); the login must finish within
//! `--sasl-login-timeout-ms` of connecting (the connection enforces it
//! with [`Session::login_deadline`]). SCRAM is computed on the
//! core (a few HMACs); PLAIN, checked against the stored SCRAM credential,
//! costs a PBKDF2 run and goes to the blocking pool, as does OAUTHBEARER's
//! signature check (with its look at the JWKS file). A failure is counted,
//! logged with the client's address and answered the same whether the
//! user exists or not; after [`SASL_FAILURES_BEFORE_DELAY`] failures from
//! one address, its next failures are answered later and later (doubling
//! up to [`SASL_FAILURE_DELAY_MS_MAX`]), per core.
//!
//! **Re-authentication** (KIP-368, `--connections-max-reauth-ms`): a login
//! holds that long; the client logs in again on the same connection (the
//! same principal), or its next request after the deadline closes it.

use std::cell::{Cell, RefCell};
use std::net::IpAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use weir_proto::sasl::{self, Mechanism, SaslError, ScramCredential, ScramServer};

use crate::server::tls::SecurityProtocol;
use crate::shard::Core;

/// The principal of a connection that has not logged in (PLAINTEXT and
/// SSL listeners without client certificates), Kafka's.
pub const ANONYMOUS: &str = "User:ANONYMOUS";

/// One connection's identity and login.
#[derive(Debug)]
pub struct Session {
    /// The client's address, for logs.
    pub peer: String,
    /// The listener's security protocol.
    pub protocol: SecurityProtocol,
    connected: Instant,
    /// How long after connecting a login must have succeeded.
    login_timeout: Duration,
    /// `User:name` once known (at once on a listener without SASL).
    principal: RefCell<Option<String>>,
    /// When the login stops holding (`--connections-max-reauth-ms`).
    expires: Cell<Option<Instant>>,
    /// The mechanism SaslHandshake chose, waiting for its tokens.
    mechanism: Cell<Option<Mechanism>>,
    /// A SCRAM exchange half done.
    scram: RefCell<Option<ScramServer>>,
    /// Kafka's SaslHandshake v0: the tokens that follow are bare
    /// size-prefixed frames, not SaslAuthenticate requests.
    bare_tokens: Cell<bool>,
    /// The client's quotas: its client id, its budgets, its mute.
    pub quotas: crate::shard::quotas::ClientQuotas,
    /// Where this connection's native fetches of each partition ended.
    pub fetch_cursors: crate::service::fetch::Cursors,
}

/// What a connection may do with a request, given its login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Serve it.
    Serve,
    /// Close the connection (the reason is logged).
    Close(&'static str),
}

/// One step of a login.
#[derive(Debug)]
pub enum Step {
    /// Send these bytes; the exchange goes on.
    Continue(Vec<u8>),
    /// Logged in: send these bytes; the login holds this long (0: for
    /// the connection's life).
    Done {
        /// The mechanism's last bytes.
        bytes: Vec<u8>,
        /// `session_lifetime_ms` (KIP-368).
        lifetime_ms: i64,
    },
}

/// A failed login: what the client is told. The connection is closed
/// after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginFailed {
    /// For the client (never whether the user exists).
    pub message: String,
}

impl Session {
    /// A new connection on a listener of `protocol`, which must log in
    /// within `login_timeout` if the protocol has SASL.
    pub fn new(peer: String, protocol: SecurityProtocol, login_timeout: Duration) -> Rc<Session> {
        Session::with_principal(peer, protocol, login_timeout, None)
    }

    /// [`Session::new`] for a client whose TLS certificate named it
    /// (`User:<mapped subject>`); a SASL login still decides on SASL_*
    /// listeners.
    pub fn with_principal(
        peer: String,
        protocol: SecurityProtocol,
        login_timeout: Duration,
        certificate: Option<String>,
    ) -> Rc<Session> {
        let principal =
            (!protocol.sasl()).then(|| certificate.unwrap_or_else(|| ANONYMOUS.to_string()));
        Rc::new(Session {
            peer,
            protocol,
            connected: Instant::now(),
            login_timeout,
            principal: RefCell::new(principal),
            expires: Cell::new(None),
            mechanism: Cell::new(None),
            scram: RefCell::new(None),
            bare_tokens: Cell::new(false),
            quotas: Default::default(),
            fetch_cursors: Default::default(),
        })
    }

    /// The principal, once logged in (`User:name`).
    pub fn principal(&self) -> Option<String> {
        self.principal.borrow().clone()
    }

    /// Runs `f` on the principal, once logged in, without copying it.
    pub fn with_principal_ref<R>(&self, f: impl FnOnce(Option<&str>) -> R) -> R {
        f(self.principal.borrow().as_deref())
    }

    /// Whether a login holds now.
    pub fn logged_in(&self) -> bool {
        self.principal.borrow().is_some() && self.expires.get().is_none_or(|t| Instant::now() < t)
    }

    /// While no login has succeeded: when the connection is closed if
    /// none has by then.
    pub fn login_deadline(&self) -> Option<Instant> {
        self.principal
            .borrow()
            .is_none()
            .then(|| self.connected + self.login_timeout)
    }

    /// Whether a request may be served: the login's own requests always
    /// (a first login, or a re-authentication), any other only while a
    /// login holds.
    pub fn gate(&self, login_request: bool) -> Gate {
        if login_request || self.logged_in() {
            return Gate::Serve;
        }
        if self.principal.borrow().is_some() {
            Gate::Close(
                "its SASL login expired (--connections-max-reauth-ms) without re-authentication",
            )
        } else {
            Gate::Close("a request other than the SASL login arrived before the login succeeded")
        }
    }

    /// SaslHandshake: chooses the mechanism named, if `enabled` has it;
    /// else the error for the client.
    pub fn handshake(&self, name: &str, enabled: &[Mechanism]) -> Result<Mechanism, String> {
        if !self.protocol.sasl() {
            return Err(format!(
                "this is a {} listener: it takes no SASL login",
                self.protocol.name()
            ));
        }
        match Mechanism::from_name(name).filter(|m| enabled.contains(m)) {
            Some(m) => {
                self.mechanism.set(Some(m));
                self.bare_tokens.set(false);
                *self.scram.borrow_mut() = None;
                Ok(m)
            }
            None => Err(format!("SASL mechanism `{name}` is not enabled")),
        }
    }

    /// Whether the login's next frames are bare tokens (after Kafka's
    /// SaslHandshake v0), until it ends.
    pub fn bare_tokens(&self) -> bool {
        self.bare_tokens.get() && self.mechanism.get().is_some()
    }

    /// Kafka's SaslHandshake v0 chose the mechanism: its tokens come bare.
    pub fn expect_bare_tokens(&self) {
        self.bare_tokens.set(true);
    }

    /// The mechanisms a handshake may choose.
    pub fn mechanisms(core: &Core) -> &[Mechanism] {
        &core.shared.config.sasl.mechanisms
    }

    /// One SaslAuthenticate token: the next step, or a failure (counted,
    /// logged, slowed down per source address; the caller closes the
    /// connection after answering it).
    pub async fn authenticate(&self, core: &Rc<Core>, token: &[u8]) -> Result<Step, LoginFailed> {
        let r = self.step(core, token).await;
        match &r {
            Ok(Step::Done { .. }) => {
                let m = &core.metrics.sasl_authentications;
                m.set(m.get() + 1);
                if let Some(ip) = self.ip() {
                    core.logins.succeeded(ip);
                }
            }
            Ok(Step::Continue(_)) => {}
            Err(e) => {
                let delay = self.failed(core, &e.message);
                if !delay.is_zero() {
                    glommio::timer::sleep(delay).await;
                }
            }
        }
        r
    }

    /// Counts and logs a failed login (also a deadline missed, or a
    /// request before the login); the delay its answer gets.
    pub fn failed(&self, core: &Core, reason: &str) -> Duration {
        let m = &core.metrics.sasl_authentication_failures;
        m.set(m.get() + 1);
        tracing::warn!(peer = %self.peer, reason, "SASL authentication failed");
        self.ip()
            .map_or(Duration::ZERO, |ip| core.logins.failed(ip))
    }

    fn ip(&self) -> Option<IpAddr> {
        self.peer
            .parse::<std::net::SocketAddr>()
            .ok()
            .map(|a| a.ip())
    }

    async fn step(&self, core: &Rc<Core>, token: &[u8]) -> Result<Step, LoginFailed> {
        let Some(mechanism) = self.mechanism.get() else {
            return Err(LoginFailed {
                message: "SaslAuthenticate before SaslHandshake chose a mechanism".into(),
            });
        };
        let fail = |e: SaslError| {
            LoginFailed {
            message: match e {
                SaslError::BadCredentials => format!(
                    "Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
                ),
                e => format!("Authentication failed: {e}"),
            },
        }
        };
        if token.len() > mechanism.token_bytes_max() {
            return Err(fail(SaslError::TooLarge(token.len())));
        }
        let user = match mechanism {
            Mechanism::Plain => {
                let t = sasl::parse_plain(token).map_err(fail)?;
                let stored = credential(core, &t.user, None);
                // PBKDF2 (thousands of HMACs): off the core's loop.
                let ok = weir_storage::checkpoint::on_blocking_pool(move || {
                    stored.is_some_and(|(m, c)| c.verify_password(m, t.password.as_bytes()))
                })
                .await;
                if !ok {
                    return Err(fail(SaslError::BadCredentials));
                }
                self.mechanism.set(None);
                t.user
            }
            Mechanism::OAuthBearer => {
                self.mechanism.set(None);
                let jwt = sasl::parse_oauthbearer(token).map_err(fail)?;
                let Some(keys) = core.shared.oauth.clone() else {
                    return Err(LoginFailed {
                        message: "OAUTHBEARER is not configured".into(),
                    });
                };
                let now_s = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs();
                // A signature check, and a look at the JWKS file (read
                // again if it changed): off the core's loop, as PLAIN's.
                let v =
                    weir_storage::checkpoint::on_blocking_pool(move || keys.verify(&jwt, now_s))
                        .await
                        .map_err(|reason| LoginFailed {
                            message: format!("Authentication failed: OAUTHBEARER {reason}"),
                        })?;
                let left_ms = v.expires_s.saturating_sub(now_s).saturating_mul(1000);
                return self.logged_in_for(core, v.subject, Vec::new(), Some(left_ms));
            }
            _ => {
                let mut slot = self.scram.borrow_mut();
                match slot.as_mut() {
                    None => {
                        let mut server = ScramServer::new(mechanism);
                        let first = server
                            .client_first(token, |u| {
                                credential(core, u, Some(mechanism)).map(|(_, c)| c)
                            })
                            .map_err(fail)?;
                        *slot = Some(server);
                        return Ok(Step::Continue(first));
                    }
                    Some(server) => {
                        let r = server.client_final(token);
                        *slot = None;
                        self.mechanism.set(None);
                        let (user, last) = r.map_err(fail)?;
                        return self.logged_in_as(core, user, last);
                    }
                }
            }
        };
        self.logged_in_as(core, user, Vec::new())
    }

    fn logged_in_as(&self, core: &Core, user: String, bytes: Vec<u8>) -> Result<Step, LoginFailed> {
        self.logged_in_for(core, user, bytes, None)
    }

    /// A login of `user`; `credential_ms`: how long its credential holds
    /// (a token's expiry), which bounds the session as Kafka does when
    /// re-authentication is on.
    fn logged_in_for(
        &self,
        core: &Core,
        user: String,
        bytes: Vec<u8>,
        credential_ms: Option<u64>,
    ) -> Result<Step, LoginFailed> {
        let principal = format!("User:{user}");
        let mut current = self.principal.borrow_mut();
        if current.as_ref().is_some_and(|p| p != &principal) {
            return Err(LoginFailed {
                message: format!(
                    "re-authentication as {principal} on a connection of {}: a connection's principal cannot change",
                    current.as_deref().unwrap_or("?")
                ),
            });
        }
        let reauth = match (core.shared.config.sasl.reauth_ms, credential_ms) {
            (0, _) => 0,
            (r, Some(c)) => r.min(c.max(1)),
            (r, None) => r,
        };
        self.expires
            .set((reauth > 0).then(|| Instant::now() + Duration::from_millis(reauth)));
        if current.is_none() {
            tracing::debug!(peer = %self.peer, %principal, "SASL login");
        }
        *current = Some(principal);
        Ok(Step::Done {
            bytes,
            lifetime_ms: reauth as i64,
        })
    }
}

/// A user's stored credential for `mechanism` (any SCRAM one for PLAIN,
/// SHA-512 first), from this node's copy of the cluster metadata.
fn credential(
    core: &Core,
    user: &str,
    mechanism: Option<Mechanism>,
) -> Option<(Mechanism, ScramCredential)> {
    let state = core.shared.controller.state();
    let creds = state.security.users.get(user)?;
    let wanted: Vec<Mechanism> = match mechanism {
        Some(m) => vec![m],
        None => vec![Mechanism::ScramSha512, Mechanism::ScramSha256],
    };
    wanted.into_iter().find_map(|m| {
        let c = creds.scram.get(&m.scram_type()?)?;
        Some((
            m,
            ScramCredential {
                salt: c.salt.clone(),
                iterations: c.iterations,
                stored_key: c.stored_key.clone(),
                server_key: c.server_key.clone(),
            },
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sasl_session_serves_nothing_but_the_login_until_it_succeeds() {
        let s = Session::new(
            "127.0.0.1:5".into(),
            SecurityProtocol::SaslSsl,
            Duration::from_secs(1),
        );
        assert!(s.principal().is_none());
        assert!(s.login_deadline().is_some());
        assert!(matches!(s.gate(false), Gate::Close(_)));
        assert_eq!(s.gate(true), Gate::Serve);
        assert!(s.handshake("GSSAPI", &Mechanism::ALL).is_err());
        assert_eq!(
            s.handshake("SCRAM-SHA-256", &Mechanism::ALL),
            Ok(Mechanism::ScramSha256)
        );
        assert!(s.handshake("PLAIN", &[Mechanism::ScramSha512]).is_err());
        let plain = Session::new(
            "127.0.0.1:5".into(),
            SecurityProtocol::Ssl,
            Duration::from_secs(1),
        );
        assert_eq!(plain.principal().as_deref(), Some(ANONYMOUS));
        assert_eq!(plain.gate(false), Gate::Serve);
        assert!(plain.login_deadline().is_none());
        assert!(plain.handshake("PLAIN", &Mechanism::ALL).is_err());
    }
}
