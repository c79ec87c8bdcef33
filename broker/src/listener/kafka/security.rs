//! SaslHandshake, SaslAuthenticate (with KIP-368 re-authentication),
//! DescribeUserScramCredentials and AlterUserScramCredentials, onto
//! [`crate::service::auth`] and [`crate::service::users`].

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};

use super::common::*;
use crate::service::auth::{Session, Step};
use crate::service::users::{self, Upsertion, UserError};

/// SaslHandshake: the mechanism, if enabled on this listener; the
/// enabled ones either way.
pub(super) fn sasl_handshake(
    core: &Core,
    session: &Session,
    r: SaslHandshakeRequest,
) -> SaslHandshakeResponse {
    let enabled = Session::mechanisms(core);
    let mut resp = SaslHandshakeResponse::default();
    resp.mechanisms = if session.protocol.sasl() {
        enabled.iter().map(|m| s(m.name())).collect()
    } else {
        Vec::new()
    };
    if let Err(e) = session.handshake(r.mechanism.as_str(), enabled) {
        tracing::debug!(peer = %session.peer, error = e, "SaslHandshake refused");
        resp.error_code = E::UnsupportedSaslMechanism.code();
    }
    resp
}

/// SaslAuthenticate: one step of the login; `true` when the connection
/// closes after the answer (a failed login).
pub(super) async fn sasl_authenticate(
    core: &Rc<Core>,
    session: &Session,
    r: SaslAuthenticateRequest,
) -> (SaslAuthenticateResponse, bool) {
    let mut resp = SaslAuthenticateResponse::default();
    if !session.protocol.sasl() {
        resp.error_code = E::IllegalSaslState.code();
        resp.error_message = Some(s(format!(
            "this is a {} listener: it takes no SASL login",
            session.protocol.name()
        )));
        return (resp, true);
    }
    match session.authenticate(core, &r.auth_bytes).await {
        Ok(Step::Continue(bytes)) => {
            resp.auth_bytes = Bytes::from(bytes);
            (resp, false)
        }
        Ok(Step::Done { bytes, lifetime_ms }) => {
            resp.auth_bytes = Bytes::from(bytes);
            resp.session_lifetime_ms = lifetime_ms;
            (resp, false)
        }
        Err(e) => {
            resp.error_code = E::SaslAuthenticationFailed.code();
            resp.error_message = Some(s(e.message));
            (resp, true)
        }
    }
}

fn user_error_code(e: &UserError) -> i16 {
    weir_kafka::error::coordinator_code(e.code())
}

/// DescribeUserScramCredentials.
pub(super) fn describe_user_scram_credentials(
    core: &Core,
    r: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let names = r
        .users
        .map(|us| us.into_iter().map(|u| u.name.to_string()).collect());
    let mut resp = DescribeUserScramCredentialsResponse::default();
    resp.results = users::describe_scram(core, names)
        .into_iter()
        .map(|(user, r)| {
            let mut out = DescribeUserScramCredentialsResult::default();
            out.user = s(user);
            match r {
                Ok(infos) => {
                    out.credential_infos = infos
                        .into_iter()
                        .map(|(m, i)| {
                            let mut c = CredentialInfo::default();
                            c.mechanism = m;
                            c.iterations = i;
                            c
                        })
                        .collect();
                }
                Err(e) => {
                    out.error_code = user_error_code(&e);
                    out.error_message = Some(s(e.to_string()));
                }
            }
            out
        })
        .collect();
    resp
}

/// AlterUserScramCredentials.
pub(super) async fn alter_user_scram_credentials(
    core: &Rc<Core>,
    r: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let deletions = r
        .deletions
        .into_iter()
        .map(|d| (d.name.to_string(), d.mechanism))
        .collect();
    let upsertions = r
        .upsertions
        .into_iter()
        .map(|u| Upsertion {
            user: u.name.to_string(),
            mechanism: u.mechanism,
            iterations: u.iterations,
            salt: u.salt.to_vec(),
            salted_password: u.salted_password.to_vec(),
        })
        .collect();
    let mut resp = AlterUserScramCredentialsResponse::default();
    resp.results = users::alter_scram(core, deletions, upsertions)
        .await
        .into_iter()
        .map(|(user, r)| {
            let mut out = AlterUserScramCredentialsResult::default();
            out.user = s(user);
            if let Err(e) = r {
                out.error_code = user_error_code(&e);
                out.error_message = Some(s(e.to_string()));
            }
            out
        })
        .collect();
    resp
}
