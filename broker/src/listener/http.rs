//! The HTTP listener (core 0): `GET /metrics` in Prometheus text format,
//! gathered from every core through the mesh. A request head is bounded
//! ([`HTTP_HEAD_BYTES_MAX`]) and must arrive within the frame read timeout.

use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpListener;

use super::accept_or_stop;
use crate::metrics::{render, Snapshot, HTTP_HEAD_BYTES_MAX};
use crate::shard::mesh::CoreMsg;
use crate::shard::stats::snapshot;
use crate::shard::Core;

/// Serves `GET /metrics` (core 0).
pub async fn serve_http(core: Rc<Core>, listener: TcpListener) {
    loop {
        let accepted = accept_or_stop(&core, &listener).await;
        let Some(Ok(mut stream)) = accepted else {
            if core.shared.stopping() {
                return;
            }
            continue;
        };
        let core = core.clone();
        glommio::spawn_local(async move {
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
            let line = String::from_utf8_lossy(&head);
            let (status, body) = if line.starts_with("GET /metrics ") {
                ("200 OK", render(&gather(&core).await))
            } else {
                ("404 Not Found", "only GET /metrics is served here\n".to_string())
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(resp.as_bytes()).await;
            let _ = stream.close().await;
        })
        .detach();
    }
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
