//! Fixed ports for test nodes.
//!
//! A test cluster's nodes must know each other's addresses before they
//! start, so their ports are chosen in advance, checked free, and released
//! for the node to bind. Chosen from the kernel's ephemeral range (what a
//! bind to port 0 gives), such a port can be handed to any socket bound to
//! port 0 meanwhile — another node's outgoing QUIC endpoint, a client — and
//! the node then fails with "Address already in use". These ports come from
//! below the ephemeral range instead, which the kernel never hands out, so
//! only another explicit choice could take them: each process starts its
//! search at a different place (by PID) and never returns a port twice.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};

/// Which protocol a port is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// TCP (listeners).
    Tcp,
    /// UDP (QUIC endpoints).
    Udp,
}

/// Lowest port handed out.
const FLOOR: u32 = 10_000;

/// The first port of the kernel's ephemeral range (32768 if unreadable).
fn ephemeral_floor() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Ports handed out by this process so far (the search goes on from there).
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A loopback port `p` such that `p..=p + extra` are all free for `proto`
/// now and lie below the ephemeral range; never the same twice in one
/// process. Panics (naming the range) if the range has no such run left.
pub fn run(proto: Proto, extra: u16) -> u16 {
    let top = ephemeral_floor().max(FLOOR + 1_000);
    let span = top - FLOOR;
    let width = u32::from(extra) + 1;
    let start = (std::process::id().wrapping_mul(7_919)) % span;
    loop {
        let at = NEXT.fetch_add(width, Ordering::Relaxed);
        if at + width > span - width {
            panic!("no free run of {width} ports left in {FLOOR}..{top} for this process");
        }
        let first = FLOOR + (start + at) % (span - width);
        if (0..width).all(|i| free(proto, (first + i) as u16)) {
            return first as u16;
        }
    }
}

/// A loopback address with a port from [`run`] (no successors needed).
pub fn addr(proto: Proto) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, run(proto, 0)))
}

/// A loopback address of its own for a test's fake server: random in
/// 127.0.0.0/8, never 127.0.0.1. A server on 127.0.0.1 bound to port 0 can
/// be handed a port some other test's client is still dialling (a node that
/// test killed, a port it bound and released to stand for a dead address);
/// that client's connection would then reach this server and be taken for
/// its own client's. Nothing dials these addresses but whoever was told.
pub fn private_loopback() -> Ipv4Addr {
    use std::hash::{BuildHasher, Hasher};
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let [_, b, c, d, ..] = h.finish().to_le_bytes();
        let ip = Ipv4Addr::new(127, b, c, d);
        if (b, c) != (0, 0) && d != 0 && d != 255 {
            return ip;
        }
    }
}

/// Whether `port` can be bound on loopback for `proto` now.
fn free(proto: Proto, port: u16) -> bool {
    match proto {
        Proto::Tcp => TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok(),
        Proto::Udp => UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_free_below_the_ephemeral_range_and_never_repeat() {
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..50 {
            let proto = if i % 2 == 0 { Proto::Tcp } else { Proto::Udp };
            let p = run(proto, 3);
            assert!(u32::from(p) + 3 < ephemeral_floor().max(FLOOR + 1_000));
            assert!(u32::from(p) >= FLOOR);
            for q in p..=p + 3 {
                assert!(seen.insert(q), "port {q} handed out twice");
                assert!(free(proto, q), "port {q} is not free");
            }
        }
    }

    #[test]
    fn private_loopback_addresses_are_bindable_and_not_the_usual_one() {
        for _ in 0..20 {
            let ip = private_loopback();
            assert!(ip.is_loopback() && ip != Ipv4Addr::LOCALHOST, "{ip}");
            TcpListener::bind((ip, 0)).unwrap();
        }
    }
}
