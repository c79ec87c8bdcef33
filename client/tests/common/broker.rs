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
    let mut b = Node::builder(weir_testkit::weir_bin())
        .data_dir(dir)
        .cores(cores)
        .listen(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .env("WEIR_LOG", "error");
    if port != 0 {
        // A fixed listen port makes the broker's node-to-node (QUIC)
        // endpoint default to port 9293 and its cores' to 9294…, which any
        // other process may hold: a run of free UDP ports instead, chosen
        // at the first start and kept (in the data directory) for restarts.
        let file = dir.join("test-replication-port");
        let udp: u16 = match std::fs::read_to_string(&file) {
            Ok(p) => p.trim().parse().expect("a port"),
            Err(_) => {
                let p = weir_testkit::ports::run(weir_testkit::ports::Proto::Udp, cores as u16);
                std::fs::create_dir_all(dir).expect("the data directory");
                std::fs::write(&file, p.to_string()).expect("writing the port");
                p
            }
        };
        b = b.args([
            "--replication-listen".to_string(),
            SocketAddr::from((Ipv4Addr::LOCALHOST, udp)).to_string(),
        ]);
    }
    b.start()
}
