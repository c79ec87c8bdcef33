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
