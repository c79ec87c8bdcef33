//! OAUTHBEARER: JWTs checked against a JWKS file. An unchanged client
//! (confluent-kafka's oauth_cb) produces and consumes with a signed
//! token; an expired one, one signed by another key and garbage are
//! refused with its authentication error and counted; the principal is
//! the token's subject (ACLs for `User:agent-7` apply to it); the CLI
//! and SDK log in on a SASL native listener with a token file.

use std::path::Path;

use base64::Engine;
use jsonwebtoken::{encode, EncodingKey, Header};

use crate::common;
use crate::sasl::start_with;

/// An ES256 key pair named `kid`: its signing half and its JWK.
pub(crate) fn key(kid: &str) -> (EncodingKey, String) {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let raw = pair.public_key_raw();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let jwk = format!(
        r#"{{"kty":"EC","crv":"P-256","kid":"{kid}","x":"{}","y":"{}"}}"#,
        b64(&raw[1..33]),
        b64(&raw[33..65])
    );
    (EncodingKey::from_ec_der(&pair.serialize_der()), jwk)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token for `sub`, expiring `exp_in` seconds from now (negative: ago).
pub(crate) fn token(k: &EncodingKey, kid: &str, sub: &str, exp_in: i64) -> String {
    let mut h = Header::new(jsonwebtoken::Algorithm::ES256);
    h.kid = Some(kid.into());
    let claims = serde_json::json!({
        "sub": sub,
        "iss": "https://idp.test",
        "aud": "weir",
        "exp": (now() as i64 + exp_in),
    });
    encode(&h, &claims, k).unwrap()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let f = dir.join(name);
    std::fs::write(&f, text).unwrap();
    f.to_str().unwrap().to_string()
}

#[test]
fn oauthbearer_logins_are_checked_against_the_jwks_file() {
    let dir = tempfile::tempdir().unwrap();
    let (signing, jwk) = key("k1");
    let jwks = write(dir.path(), "jwks.json", &format!(r#"{{"keys":[{jwk}]}}"#));
    let node = start_with(
        dir.path(),
        "SASL_PLAINTEXT://127.0.0.1:0",
        None,
        10_000,
        &format!(
            "listen = \"SASL_PLAINTEXT://127.0.0.1:0\"\n\
             sasl_oauthbearer_jwks_file = {jwks:?}\n\
             sasl_oauthbearer_expected_issuer = \"https://idp.test\"\n\
             sasl_oauthbearer_expected_audience = \"weir\"\n\
             authorizer = \"acl\"\nsuper_users = \"User:admin\"\n"
        ),
    );
    // The CLI logs in with a token file: as the super user, it makes the
    // topic and lets agent-7 use it.
    let props = |name: &str, token: &str| {
        let t = write(dir.path(), &format!("{name}.jwt"), token);
        write(
            dir.path(),
            &format!("{name}.properties"),
            &format!(
                "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n\
                 weir.sasl.oauthbearer.token.file={t}\n"
            ),
        )
    };
    let admin = props("admin", &token(&signing, "k1", "admin", 600));
    let weir = |args: &[&str], stdin: &[u8]| {
        let out = common::weir_at(node.listen, args, stdin);
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, text) = weir(
        &[
            "topic",
            "create",
            "oauth",
            "--partitions",
            "1",
            "--command-config",
            &admin,
        ],
        b"",
    );
    assert!(ok, "{text}");
    for (what, name) in [("--topic", "oauth"), ("--group", "oauth-readers")] {
        let (ok, text) = weir(
            &[
                "acl",
                "add",
                "--principal",
                "User:agent-7",
                "--operation",
                "All",
                what,
                name,
                "--command-config",
                &admin,
            ],
            b"",
        );
        assert!(ok, "{text}");
    }
    // The principal is the token's subject: agent-7 may write, mallory
    // (a valid token too) may not.
    let agent = props("agent", &token(&signing, "k1", "agent-7", 600));
    let (ok, text) = weir(
        &["produce", "oauth", "--command-config", &agent],
        b"from-sdk\n",
    );
    assert!(ok, "{text}");
    let mallory = props("mallory", &token(&signing, "k1", "mallory", 600));
    let (ok, text) = weir(&["produce", "oauth", "--command-config", &mallory], b"x\n");
    assert!(!ok && text.contains("topic authorization failed"), "{text}");
    // A token the broker refuses is the SDK's authentication error.
    let expired = props("expired", &token(&signing, "k1", "agent-7", -600));
    let (ok, text) = weir(&["topic", "list", "--command-config", &expired], b"");
    assert!(
        !ok && text.to_lowercase().contains("authentication"),
        "{text}"
    );

    // An unchanged Kafka client, with its own token callback.
    let py = |token: &str, expect: &str| {
        let t = write(dir.path(), "py.jwt", token);
        crate::kafka_clients::python_script(
            "oauth.py",
            &[&node.kafka.to_string(), "oauth", &t, expect],
        )
    };
    let failures = || common::metric(node.metrics, "weir_sasl_authentication_failures_total");
    let out = py(&token(&signing, "k1", "agent-7", 600), "ok");
    assert!(out.contains("\"ok\": true"), "{out}");
    let before = failures();
    let (other, _) = key("k1");
    for bad in [
        token(&signing, "k1", "agent-7", -600),
        token(&other, "k1", "agent-7", 600),
        "not-a-jwt".to_string(),
    ] {
        let out = py(&bad, "refused");
        assert!(out.contains("\"ok\": true"), "{out}");
    }
    assert!(failures() >= before + 3.0, "failed logins counted");
    assert!(
        std::fs::read_to_string(dir.path().join("broker.log"))
            .unwrap()
            .contains("OAUTHBEARER token refused"),
        "the reason is logged"
    );
}
