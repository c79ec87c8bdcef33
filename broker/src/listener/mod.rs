//! Listeners: the connection pipeline ([`connection`], protocol-neutral)
//! with a codec and dispatch per protocol ([`native`]), and the HTTP
//! metrics endpoint ([`http`]), and the OTLP receivers ([`otlp`]). A listener knows the service
//! ([`crate::service`]) and nothing below it.

pub mod connection;
pub mod http;
pub mod kafka;
pub mod native;
pub mod native_share;
pub mod otlp;

use std::time::Duration;

use glommio::net::TcpListener;

use crate::server::limits::STOP_POLL_MS;
use crate::shard::Core;

/// The next connection, or `None` once the broker is stopping.
pub async fn accept_or_stop(
    core: &Core,
    listener: &TcpListener,
) -> Option<glommio::Result<glommio::net::TcpStream, ()>> {
    futures_lite::future::or(async { Some(listener.accept().await) }, async {
        while !core.shared.stopping() {
            glommio::timer::sleep(Duration::from_millis(STOP_POLL_MS)).await;
        }
        None
    })
    .await
}

/// Whether the core is at `--max-connections-per-core` (the client
/// listeners' and the OTLP receivers' connections together): then the
/// refusal is counted and logged, and the caller drops the connection.
pub fn at_connection_limit(core: &Core, listener: &str) -> bool {
    let max = core.shared.config.max_connections_per_core;
    if core.connections.get() < max {
        return false;
    }
    let m = &core.metrics.connections_refused;
    m.set(m.get() + 1);
    tracing::warn!(
        core = core.id,
        max,
        listener,
        "connection refused: the core has --max-connections-per-core open"
    );
    true
}
