//! SASL logins to a broker's `SASL_PLAINTEXT://` or `SASL_SSL://` native
//! listener (Kafka's `security.protocol=SASL_*`, `sasl.mechanism`,
//! `sasl.username`, `sasl.password`): PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
//! (the messages are [`weir_proto::sasl`]'s). Each new connection logs in
//! before its first request; a refused login is
//! [`ClientError::Authentication`](crate::ClientError::Authentication).
//!
//! Not done: re-authentication (KIP-368). With the broker's
//! `--connections-max-reauth-ms`, a connection is closed at its first
//! request after the login expires, and the next call opens (and logs in
//! on) a new one.

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use weir_proto::error_code::ErrorCode;
use weir_proto::frame::{self, Message, RequestHeader};
use weir_proto::messages::{
    Request, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
};
use weir_proto::sasl::{Mechanism, ScramClient};

use crate::conn::{read_frame, write_frame};
use crate::{ClientError, Result};

/// Who logs in, and how.
#[derive(Clone, PartialEq, Eq)]
pub struct SaslSettings {
    /// The mechanism (`sasl.mechanism`).
    pub mechanism: Mechanism,
    /// The user (`sasl.username`).
    pub username: String,
    /// The password (`sasl.password`).
    pub password: String,
}

impl std::fmt::Debug for SaslSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslSettings")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .finish()
    }
}

async fn call<T: Request, R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    r: &mut R,
    w: &mut W,
    req: &T,
    corr: u32,
    max_frame_bytes: usize,
) -> Result<T::Response> {
    let head = frame::encode_request(&RequestHeader::of::<T>(corr), req, 0)
        .map_err(ClientError::Protocol)?;
    write_frame(w, &head, &[]).await?;
    let answer: Bytes = read_frame(r, max_frame_bytes).await?;
    let (h, body, _) = frame::decode_response(&answer).map_err(ClientError::Protocol)?;
    if !h.error.is_none() {
        let code = h.error;
        let message = weir_proto::messages::ErrorBody::decode_body(body)
            .map(|e| e.message)
            .unwrap_or_default();
        return Err(match code {
            ErrorCode::SaslAuthenticationFailed => ClientError::Authentication(message),
            code => ClientError::Server { code, message },
        });
    }
    T::Response::decode_body(body).map_err(ClientError::Protocol)
}

async fn step<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    r: &mut R,
    w: &mut W,
    bytes: Vec<u8>,
    corr: u32,
    max_frame_bytes: usize,
) -> Result<SaslAuthenticateResponse> {
    let req = SaslAuthenticateRequest { auth_bytes: bytes };
    call(r, w, &req, corr, max_frame_bytes).await
}

/// Logs in on a new connection, before anything else is sent on it.
pub(crate) async fn login<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    r: &mut R,
    w: &mut W,
    s: &SaslSettings,
    corr: u32,
    max_frame_bytes: usize,
) -> Result<()> {
    let hs = call(
        r,
        w,
        &SaslHandshakeRequest {
            mechanism: s.mechanism.name().to_string(),
        },
        corr,
        max_frame_bytes,
    )
    .await?;
    if hs.error != 0 {
        return Err(ClientError::Authentication(format!(
            "the broker does not offer {} (it offers {})",
            s.mechanism,
            if hs.mechanisms.is_empty() {
                "no SASL login: is it a SASL_* listener?".to_string()
            } else {
                hs.mechanisms.join(", ")
            }
        )));
    }
    let failed = |a: &SaslAuthenticateResponse| {
        ClientError::Authentication(a.message.clone().unwrap_or_else(|| "refused".into()))
    };
    match s.mechanism {
        Mechanism::Plain => {
            let a = step(
                r,
                w,
                weir_proto::sasl::plain_token(&s.username, &s.password),
                corr,
                max_frame_bytes,
            )
            .await?;
            if a.error != 0 {
                return Err(failed(&a));
            }
        }
        m => {
            let (mut client, first) = ScramClient::start(m, &s.username, &s.password);
            let a = step(r, w, first, corr, max_frame_bytes).await?;
            if a.error != 0 {
                return Err(failed(&a));
            }
            let last = client
                .server_first(&a.auth_bytes)
                .map_err(|e| ClientError::Authentication(e.to_string()))?;
            let a = step(r, w, last, corr, max_frame_bytes).await?;
            if a.error != 0 {
                return Err(failed(&a));
            }
            client
                .server_final(&a.auth_bytes)
                .map_err(|e| ClientError::Authentication(e.to_string()))?;
        }
    }
    Ok(())
}
