//! Helpers shared by the client's tests with in-process fake servers.
#![allow(dead_code)]

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Reads one whole frame (length prefix included); `None` once the client
/// has closed the connection.
pub async fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.ok()?;
    let mut f = vec![0u8; 4 + u32::from_be_bytes(len) as usize];
    f[..4].copy_from_slice(&len);
    s.read_exact(&mut f[4..]).await.ok()?;
    Some(f)
}

pub mod broker;
