//! A real `weir broker` process on loopback for the client's tests: the
//! testkit's [`Node`], of the `weir` binary [`weir_testkit::weir_bin`]
//! finds (the broker crate builds it; `WEIR_BIN` names another).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

pub use weir_testkit::Node;

/// Starts a broker over `dir` with `cores` cores, listening on
/// `127.0.0.1:port` (0: a port the kernel picks; a port the test fixes in
/// advance, e.g. to restart on it, comes from [`weir_testkit::ports`]),
/// and waits for its ready line. It logs errors only.
pub fn start_broker(dir: &Path, cores: usize, port: u16) -> Node {
    Node::builder(weir_testkit::weir_bin())
        .data_dir(dir)
        .cores(cores)
        .listen(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .env("WEIR_LOG", "error")
        .start()
}
