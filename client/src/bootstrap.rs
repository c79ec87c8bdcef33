//! A bootstrap list — `"broker1:9292,broker2:9292"` — and connecting to
//! the first reachable server of it, with retries.
//!
//! Each entry is `host:port` (a name, an IPv4 address, or `[v6]:port`); a
//! missing port means [`PORT_DEFAULT`]. Names are resolved when
//! connecting, again in every round, so a broker that comes up under a
//! name after the client started is found. Rounds are bounded by
//! [`ClientConfig::bootstrap_timeout`]; between rounds the client waits
//! [`ClientConfig::reconnect_backoff`], doubling up to
//! [`ClientConfig::reconnect_backoff_max`].

use std::fmt;
use std::str::FromStr;

use tokio::time::Instant;

use crate::{Client, ClientConfig, ClientError, Result};

/// The port of a bootstrap entry that names none: the broker's default
/// native listener.
pub const PORT_DEFAULT: u16 = 9292;

/// Most entries in one bootstrap list.
pub const BOOTSTRAP_SERVERS_MAX: usize = 64;

/// A parsed bootstrap list (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    /// `host:port` entries, in the order given.
    servers: Vec<String>,
}

impl Bootstrap {
    /// The `host:port` entries, in the order given.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// Connects to the first server that accepts, in rounds (see
    /// [`Client::bootstrap`]).
    pub async fn connect(&self, config: ClientConfig) -> Result<Client> {
        let deadline = Instant::now() + config.bootstrap_timeout;
        let mut backoff = config.reconnect_backoff;
        loop {
            let mut last = None;
            for server in &self.servers {
                let addrs = match tokio::net::lookup_host(server.as_str()).await {
                    Ok(a) => a,
                    Err(e) => {
                        last = Some(ClientError::Io(e));
                        continue;
                    }
                };
                let named = crate::config_for_host(&config, crate::host_of(server));
                for addr in addrs {
                    let client = Client::connect_lazy(addr, named.clone());
                    match client.conn.connect().await {
                        Ok(()) => return Ok(client),
                        // A refused certificate or bad TLS settings do not
                        // get better by trying again.
                        Err(e @ ClientError::Tls(_)) => return Err(e),
                        Err(e) => last = Some(e),
                    }
                }
            }
            let e = last.unwrap_or_else(|| {
                ClientError::Io(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "the bootstrap servers resolved to no address",
                ))
            });
            let now = Instant::now();
            if now + backoff >= deadline {
                return Err(e);
            }
            tracing::debug!(servers = %self, error = %e, ?backoff, "no bootstrap server reachable; trying again");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(config.reconnect_backoff_max.max(backoff));
        }
    }
}

impl FromStr for Bootstrap {
    type Err = ClientError;

    /// Parses a comma-separated list; blanks around entries are ignored.
    fn from_str(s: &str) -> Result<Bootstrap> {
        let mut servers = Vec::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let with_port = if let Some(rest) = entry.strip_prefix('[') {
                // [v6] or [v6]:port
                match rest.split_once(']') {
                    Some((_, "")) => format!("{entry}:{PORT_DEFAULT}"),
                    Some((_, p)) if p.starts_with(':') => entry.to_string(),
                    _ => return Err(invalid(entry, "an IPv6 address is written [addr]:port")),
                }
            } else {
                match entry.rsplit_once(':') {
                    None => format!("{entry}:{PORT_DEFAULT}"),
                    Some((host, _)) if host.contains(':') => {
                        return Err(invalid(entry, "write an IPv6 address as [addr]:port"))
                    }
                    Some(_) => entry.to_string(),
                }
            };
            let (host, port) = with_port.rsplit_once(':').expect("a port was added");
            if host.is_empty() || host == "[]" {
                return Err(invalid(entry, "no host"));
            }
            if port.parse::<u16>().is_err() {
                return Err(invalid(entry, "the port is not a number from 0 to 65535"));
            }
            servers.push(with_port);
        }
        if servers.is_empty() {
            return Err(ClientError::InvalidArgument(
                "the bootstrap list names no server".into(),
            ));
        }
        if servers.len() > BOOTSTRAP_SERVERS_MAX {
            return Err(ClientError::InvalidArgument(format!(
                "the bootstrap list names {} servers, more than {BOOTSTRAP_SERVERS_MAX}",
                servers.len()
            )));
        }
        Ok(Bootstrap { servers })
    }
}

impl fmt::Display for Bootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.servers.join(","))
    }
}

fn invalid(entry: &str, why: &str) -> ClientError {
    ClientError::InvalidArgument(format!("bootstrap server `{entry}`: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_with_default_ports() {
        let b: Bootstrap = " broker1:9292, broker2 ,127.0.0.1:1,[::1]:7,[::1]"
            .parse()
            .unwrap();
        assert_eq!(
            b.servers(),
            [
                "broker1:9292",
                "broker2:9292",
                "127.0.0.1:1",
                "[::1]:7",
                "[::1]:9292"
            ]
        );
        assert_eq!(b.to_string().parse::<Bootstrap>().unwrap(), b);
        for bad in ["", " , ", "h:x", "h:70000", ":9292", "::1:9292", "[::1"] {
            assert!(bad.parse::<Bootstrap>().is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn gives_up_after_the_bootstrap_timeout_with_the_last_error() {
        // A port nobody listens on: every round is refused.
        let l = std::net::TcpListener::bind((weir_testkit::ports::private_loopback(), 0)).unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let c = ClientConfig {
            bootstrap_timeout: std::time::Duration::from_millis(300),
            ..ClientConfig::default()
        };
        let started = std::time::Instant::now();
        let b: Bootstrap = addr.to_string().parse().unwrap();
        let e = b.connect(c).await.unwrap_err();
        assert!(matches!(e, ClientError::Io(_)), "{e}");
        let took = started.elapsed();
        assert!(
            took >= std::time::Duration::from_millis(100),
            "retried: {took:?}"
        );
        assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    }
}
