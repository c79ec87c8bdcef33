//! The HTTP listener (core 0): `GET /metrics` in Prometheus text format,
//! gathered from every core through the mesh. A request head is bounded
//! ([`HTTP_HEAD_BYTES_MAX`]) and must arrive within the frame read timeout.
//! `--metrics-listen SSL://…` serves it over TLS (the client listeners'
//! certificate); `--metrics-bearer-token-file` asks for
//! `Authorization: Bearer <token>` (Prometheus' `authorization` setting).

use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::net::TcpListener;

use super::accept_or_stop;
use crate::metrics::{render, Snapshot, HTTP_HEAD_BYTES_MAX};
use crate::server::tls::handshake;
use crate::shard::mesh::CoreMsg;
use crate::shard::stats::snapshot;
use crate::shard::Core;

/// Serves `GET /metrics` (core 0), over TLS if `tls` is given.
pub async fn serve_http(
    core: Rc<Core>,
    listener: TcpListener,
    tls: Option<std::sync::Arc<crate::server::tls::ServerTls>>,
) {
    loop {
        let accepted = accept_or_stop(&core, &listener).await;
        let Some(Ok(stream)) = accepted else {
            if core.shared.stopping() {
                return;
            }
            continue;
        };
        let core = core.clone();
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        glommio::spawn_local(async move {
            let Some(acceptor) = acceptor else {
                return answer(&core, stream).await;
            };
            let peer = stream
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into());
            let failures = &core.metrics.tls_handshake_failures;
            if let Some(stream) = handshake(acceptor, stream, &peer, failures).await {
                answer(&core, stream).await
            }
        })
        .detach();
    }
}

/// Reads one request head and answers it.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(core: &Rc<Core>, mut stream: S) {
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    let timeout = Duration::from_millis(core.shared.config.frame_read_timeout_ms);
    let t0 = Instant::now();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HTTP_HEAD_BYTES_MAX {
        let left = timeout.saturating_sub(t0.elapsed());
        let read = futures_lite::future::or(async { Some(stream.read(&mut chunk).await) }, async {
            glommio::timer::sleep(left).await;
            None
        })
        .await;
        match read {
            None | Some(Ok(0)) | Some(Err(_)) => return,
            Some(Ok(n)) => head.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head);
    let (status, body) = if !authorized(core, &text) {
        (
            "401 Unauthorized",
            "credentials are required (--metrics-bearer-token-file, --metrics-basic-auth-file)\n"
                .to_string(),
        )
    } else if text.starts_with("GET /metrics ") {
        let mut text = render(&gather(core).await);
        core.shared.meters.render(&mut text);
        ("200 OK", text)
    } else {
        (
            "404 Not Found",
            "only GET /metrics is served here\n".to_string(),
        )
    };
    let challenge = if status.starts_with("401") {
        challenges(core)
    } else {
        String::new()
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\n{challenge}Content-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(resp.as_bytes()).await;
    let _ = stream.close().await;
}

/// Whether the request head carries the bearer token or the basic-auth
/// credentials, if any are set (compared in constant time).
fn authorized(core: &Core, head: &str) -> bool {
    use base64::Engine;
    let config = &core.shared.config;
    if config.metrics_bearer_token.is_none() && config.metrics_basic_auth.is_empty() {
        return true;
    }
    let accepted: Vec<String> = config
        .metrics_bearer_token
        .iter()
        .map(|t| format!("Bearer {t}"))
        .chain(config.metrics_basic_auth.iter().map(|(u, p)| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        }))
        .collect();
    head.lines().any(|line| {
        let Some((name, value)) = line.split_once(':') else {
            return false;
        };
        name.trim().eq_ignore_ascii_case("authorization")
            && accepted
                .iter()
                .fold(false, |ok, want| ok | same(value.trim(), want))
    })
}

/// The `WWW-Authenticate` lines of a 401: the schemes configured.
fn challenges(core: &Core) -> String {
    let config = &core.shared.config;
    let mut out = String::new();
    if config.metrics_bearer_token.is_some() {
        out += "WWW-Authenticate: Bearer\r\n";
    }
    if !config.metrics_basic_auth.is_empty() {
        out += "WWW-Authenticate: Basic realm=\"weir\"\r\n";
    }
    out
}

/// Equality of two strings in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Snapshots of every core.
pub async fn gather(core: &Rc<Core>) -> Vec<Snapshot> {
    let mut out = vec![snapshot(core)];
    for c in 0..core.cores() {
        if c == core.id {
            continue;
        }
        match core
            .call(c, Duration::ZERO, |reply| CoreMsg::Metrics { reply })
            .await
        {
            Ok(s) => out.push(s),
            Err(e) => tracing::warn!(core = c, error = %e, "no metrics from a core"),
        }
    }
    out.sort_by_key(|s| s.core);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_compare_whole() {
        assert!(super::same("Bearer abc", "Bearer abc"));
        assert!(!super::same("Bearer abd", "Bearer abc"));
        assert!(!super::same("Bearer ab", "Bearer abc"));
    }
}
