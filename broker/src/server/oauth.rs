//! OAUTHBEARER logins (RFC 7628, Kafka's KIP-255/KIP-768): the client
//! presents a JWT; the broker checks its signature against the keys of a
//! JWKS file (no network fetch), its expiry (with `clock_skew`), and the
//! issuer and audience when configured. The principal is `User:` + the
//! subject claim (`sub`, or `--sasl-oauthbearer-sub-claim-name`).
//!
//! The file is read at start (a bad one stops the broker with what is
//! wrong) and again when its modification time changes — an identity
//! provider rotating its keys needs no restart; a changed file that does
//! not parse is logged and the keys before it are kept.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::Context;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// Where the keys are and what a token must say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthSettings {
    /// The JWKS file (`{"keys": [...]}`).
    pub jwks_file: PathBuf,
    /// `iss` must be this, if set.
    pub expected_issuer: Option<String>,
    /// `aud` must name one of these, if any.
    pub expected_audience: Vec<String>,
    /// The claim naming the principal.
    pub sub_claim_name: String,
    /// Leeway on `exp` and `nbf`, seconds.
    pub clock_skew_s: u64,
}

/// Default of `--sasl-oauthbearer-clock-skew-seconds` (Kafka's).
pub const CLOCK_SKEW_S_DEFAULT: u64 = 30;

/// A login the token allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The principal's name (the subject claim).
    pub subject: String,
    /// When the token expires, seconds since the epoch.
    pub expires_s: u64,
}

/// The keys, as last read.
#[derive(Debug)]
pub struct OAuthKeys {
    settings: OAuthSettings,
    loaded: Mutex<(Option<SystemTime>, Arc<JwkSet>)>,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn read(path: &Path) -> anyhow::Result<JwkSet> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the JWKS file {}", path.display()))?;
    let set: JwkSet = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a JWKS (a JSON object with a `keys` array of JWKs)",
            path.display()
        )
    })?;
    if set.keys.is_empty() {
        anyhow::bail!("the JWKS file {} holds no key", path.display());
    }
    for k in &set.keys {
        if matches!(k.algorithm, AlgorithmParameters::OctetKey(_)) {
            anyhow::bail!(
                "the JWKS file {} holds a symmetric (oct) key: only public keys (RSA, EC, OKP) \
                 are accepted, so that no holder of the file can mint tokens",
                path.display()
            );
        }
    }
    Ok(set)
}

impl OAuthKeys {
    /// Reads the keys; an unreadable or invalid file is an error saying why.
    pub fn load(settings: OAuthSettings) -> anyhow::Result<OAuthKeys> {
        let at = modified(&settings.jwks_file);
        let set = read(&settings.jwks_file)?;
        Ok(OAuthKeys {
            settings,
            loaded: Mutex::new((at, Arc::new(set))),
        })
    }

    /// The keys, read again if the file changed.
    fn keys(&self) -> Arc<JwkSet> {
        let mut loaded = self.loaded.lock().expect("not poisoned");
        let at = modified(&self.settings.jwks_file);
        if at.is_some() && at != loaded.0 {
            match read(&self.settings.jwks_file) {
                Ok(set) => {
                    tracing::info!(file = %self.settings.jwks_file.display(), keys = set.keys.len(), "JWKS reloaded");
                    *loaded = (at, Arc::new(set));
                }
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "JWKS file changed but not reloaded: the keys before it stay");
                    loaded.0 = at;
                }
            }
        }
        loaded.1.clone()
    }

    /// Checks `token` at `now_s` (seconds since the epoch): the login it
    /// allows, or why not (for the log; the client is told only that the
    /// login failed).
    pub fn verify(&self, token: &str, now_s: u64) -> Result<Verified, String> {
        verify(&self.settings, &self.keys(), token, now_s)
    }
}

/// [`OAuthKeys::verify`] over `keys` (sans-IO).
pub fn verify(
    settings: &OAuthSettings,
    keys: &JwkSet,
    token: &str,
    now_s: u64,
) -> Result<Verified, String> {
    let header = jsonwebtoken::decode_header(token).map_err(|e| format!("not a JWT: {e}"))?;
    if matches!(
        header.alg,
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512
    ) {
        return Err(format!(
            "{:?}: only signed tokens (RS, PS, ES, EdDSA) are accepted",
            header.alg
        ));
    }
    let jwk = match &header.kid {
        Some(kid) => keys
            .find(kid)
            .ok_or_else(|| format!("no key `{kid}` in the JWKS file"))?,
        None if keys.keys.len() == 1 => &keys.keys[0],
        None => return Err("the token names no key (kid) and the JWKS file holds several".into()),
    };
    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key unusable: {e}"))?;
    let mut v = Validation::new(header.alg);
    v.leeway = settings.clock_skew_s;
    v.validate_exp = false; // checked below, against `now_s`
    v.validate_nbf = false;
    v.required_spec_claims.clear();
    if let Some(iss) = &settings.expected_issuer {
        v.set_issuer(&[iss]);
    }
    if settings.expected_audience.is_empty() {
        v.validate_aud = false;
    } else {
        v.set_audience(&settings.expected_audience);
    }
    let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(token, &key, &v)
        .map_err(|e| format!("token refused: {e}"))?;
    let claims = data.claims;
    let exp = claims
        .get("exp")
        .and_then(|e| e.as_f64())
        .ok_or("the token has no exp claim")? as u64;
    if exp + settings.clock_skew_s <= now_s {
        return Err(format!("the token expired {} s ago", now_s - exp));
    }
    if let Some(nbf) = claims.get("nbf").and_then(|n| n.as_f64()) {
        if nbf as u64 > now_s + settings.clock_skew_s {
            return Err("the token is not valid yet (nbf)".into());
        }
    }
    let subject = claims
        .get(&settings.sub_claim_name)
        .and_then(|s| s.as_str())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("the token has no `{}` claim", settings.sub_claim_name))?;
    Ok(Verified {
        subject: subject.to_string(),
        expires_s: exp,
    })
}

/// Keys and tokens for tests: an ES256 key pair, its JWKS, tokens it signs.
#[cfg(test)]
pub(crate) mod test_keys {
    use base64::Engine;
    use jsonwebtoken::{encode, EncodingKey, Header};

    /// A key pair named `kid`.
    pub struct Key {
        kid: String,
        encoding: EncodingKey,
        /// The public half, as a JWK (JSON).
        pub jwk: String,
    }

    impl Key {
        /// A new P-256 key.
        pub fn new(kid: &str) -> Key {
            let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            let raw = pair.public_key_raw();
            let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
            Key {
                kid: kid.into(),
                encoding: EncodingKey::from_ec_der(&pair.serialize_der()),
                jwk: format!(
                    r#"{{"kty":"EC","crv":"P-256","kid":"{kid}","use":"sig","alg":"ES256","x":"{}","y":"{}"}}"#,
                    b64(&raw[1..33]),
                    b64(&raw[33..65])
                ),
            }
        }

        /// A token with `claims` (JSON), signed.
        pub fn token(&self, claims: &str) -> String {
            let mut h = Header::new(jsonwebtoken::Algorithm::ES256);
            h.kid = Some(self.kid.clone());
            let claims: serde_json::Value = serde_json::from_str(claims).unwrap();
            encode(&h, &claims, &self.encoding).unwrap()
        }
    }

    /// A JWKS of `keys`.
    pub fn jwks(keys: &[&Key]) -> String {
        let keys: Vec<&str> = keys.iter().map(|k| k.jwk.as_str()).collect();
        format!(r#"{{"keys":[{}]}}"#, keys.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::test_keys::{jwks, Key};
    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn settings() -> OAuthSettings {
        OAuthSettings {
            jwks_file: PathBuf::new(),
            expected_issuer: Some("https://idp.example".into()),
            expected_audience: vec!["weir".into()],
            sub_claim_name: "sub".into(),
            clock_skew_s: 30,
        }
    }

    fn claims(extra: &str) -> String {
        format!(
            r#"{{"sub":"agent-7","iss":"https://idp.example","aud":"weir","exp":{}{extra}}}"#,
            NOW + 600
        )
    }

    #[test]
    fn signed_tokens_are_checked_against_the_jwks() {
        let key = Key::new("k1");
        let set: JwkSet = serde_json::from_str(&jwks(&[&key])).unwrap();
        let s = settings();
        let ok = verify(&s, &set, &key.token(&claims("")), NOW).unwrap();
        assert_eq!(ok.subject, "agent-7");
        assert_eq!(ok.expires_s, NOW + 600);
        let refused = |token: &str, s: &OAuthSettings| verify(s, &set, token, NOW).unwrap_err();
        // Expired (beyond the skew), not yet valid.
        let e = refused(
            &key.token(r#"{"sub":"a","iss":"https://idp.example","aud":"weir","exp":1799999900}"#),
            &s,
        );
        assert!(e.contains("expired"), "{e}");
        let e = refused(&key.token(&claims(&format!(r#","nbf":{}"#, NOW + 300))), &s);
        assert!(e.contains("not valid yet"), "{e}");
        // Another key under the same name: the signature fails.
        let e = refused(&Key::new("k1").token(&claims("")), &s);
        assert!(e.contains("refused"), "{e}");
        // An unknown key name.
        let e = refused(&Key::new("k2").token(&claims("")), &s);
        assert!(e.contains("no key `k2`"), "{e}");
        // Issuer and audience, when expected.
        let other = r#"{"sub":"a","iss":"https://evil.example","aud":"weir","exp":1800000600}"#;
        assert!(refused(&key.token(other), &s).contains("refused"));
        let other = r#"{"sub":"a","iss":"https://idp.example","aud":"else","exp":1800000600}"#;
        assert!(refused(&key.token(other), &s).contains("refused"));
        let mut lax = settings();
        lax.expected_issuer = None;
        lax.expected_audience.clear();
        assert!(verify(&lax, &set, &key.token(other), NOW).is_ok());
        // No subject; another subject claim.
        let e = refused(
            &key.token(r#"{"exp":1800000600,"iss":"https://idp.example","aud":"weir"}"#),
            &s,
        );
        assert!(e.contains("no `sub` claim"), "{e}");
        lax.sub_claim_name = "client_id".into();
        let ok = verify(
            &lax,
            &set,
            &key.token(&claims(r#","client_id":"svc""#)),
            NOW,
        )
        .unwrap();
        assert_eq!(ok.subject, "svc");
        // No exp at all.
        let e = refused(
            &key.token(r#"{"sub":"a","iss":"https://idp.example","aud":"weir"}"#),
            &s,
        );
        assert!(e.contains("no exp"), "{e}");
        // Not a JWT; an HMAC-signed one (anyone with a shared secret
        // could mint those).
        assert!(refused("garbage", &s).contains("not a JWT"));
        let hs = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(Algorithm::HS256),
            &serde_json::json!({"sub": "a", "exp": NOW + 60}),
            &jsonwebtoken::EncodingKey::from_secret(b"secret"),
        )
        .unwrap();
        assert!(refused(&hs, &s).contains("only signed tokens"));
    }

    #[test]
    fn the_jwks_file_is_checked_at_start_and_reloaded_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("jwks.json");
        let mut s = settings();
        s.jwks_file = file.clone();
        let e = OAuthKeys::load(s.clone()).unwrap_err();
        assert!(format!("{e:#}").contains("reading the JWKS file"), "{e:#}");
        std::fs::write(&file, "{}").unwrap();
        assert!(format!("{:#}", OAuthKeys::load(s.clone()).unwrap_err()).contains("not a JWKS"));
        std::fs::write(&file, r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#).unwrap();
        assert!(format!("{:#}", OAuthKeys::load(s.clone()).unwrap_err()).contains("symmetric"));
        let (k1, k2) = (Key::new("k1"), Key::new("k2"));
        std::fs::write(&file, jwks(&[&k1])).unwrap();
        let keys = OAuthKeys::load(s).unwrap();
        let now = || {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        };
        let fresh = |k: &Key| {
            k.token(&format!(
                r#"{{"sub":"a","iss":"https://idp.example","aud":"weir","exp":{}}}"#,
                now() + 600
            ))
        };
        assert!(keys.verify(&fresh(&k1), now()).is_ok());
        assert!(keys.verify(&fresh(&k2), now()).is_err());
        // Rotated: k2 added (a later modification time).
        std::fs::write(&file, jwks(&[&k1, &k2])).unwrap();
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert!(keys.verify(&fresh(&k2), now()).is_ok());
        // A broken rewrite keeps the keys before it.
        std::fs::write(&file, "not json").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(later + std::time::Duration::from_secs(5))
            .unwrap();
        assert!(keys.verify(&fresh(&k2), now()).is_ok());
    }
}
