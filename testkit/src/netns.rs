//! A network of its own for a test cluster: each node in a Linux network
//! namespace, joined to a bridge by a veth pair, and faults made with
//! nftables inside the namespaces — partitions (symmetric, one-way,
//! bridges), random packet loss — with counters that prove each fault
//! dropped something.
//!
//! Node `i` (0-based) has address `10.A.B.(i + 1)/24`; the test process
//! (the root namespace) is `10.A.B.254` on the bridge and reaches every
//! node, partitions or not (partitions are between nodes: a client of an
//! isolated leader is what the tests are about). Names carry the test
//! process's PID (`wf<pid>…`): a run that died without dropping its
//! [`Net`] leaves namespaces and a bridge that the next [`Net::new`]
//! removes, once that PID is gone; nothing else is touched.
//!
//! Needs root (CI and these machines run as root), iproute2 and nftables
//! (`.ci/fault-tools` installs them); [`Net::new`] says which is missing.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// The namespaces' nftables table.
const TABLE: &str = "weirfault";

/// Nets made by this process (part of their names and subnet).
static MADE: AtomicU32 = AtomicU32::new(0);

/// A bridge, one namespace per node, and the faults in effect.
#[derive(Debug)]
pub struct Net {
    tag: String,
    subnet: [u8; 3],
    nodes: usize,
    /// Directed links cut now: (from, to), packets from `from` to `to`
    /// dropped in `from`'s namespace.
    cut: BTreeSet<(usize, usize)>,
    /// Nodes whose packets to the test process (their clients) are
    /// dropped.
    mute: BTreeSet<usize>,
}

/// Why a [`Net`] could not be made.
#[derive(Debug)]
pub struct NetError(String);

impl std::fmt::Display for NetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NetError {}

/// [`crate::run_command`], its error a [`NetError`] that says what to
/// install when the program is missing.
fn run(program: &str, args: &[&str]) -> Result<String, NetError> {
    crate::run_command(program, args).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            NetError(format!(
                "running `{program}`: {e} (the fault tests need iproute2 and nftables: \
                 `bash .ci/fault-tools`)"
            ))
        } else {
            NetError(e.to_string())
        }
    })
}

/// [`run`] that must succeed.
fn must(program: &str, args: &[&str]) -> String {
    run(program, args).unwrap_or_else(|e| panic!("{e}"))
}

/// `nft -f -` with `script` inside namespace `ns`.
fn nft(ns: &str, script: &str) -> Result<(), NetError> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| NetError(format!("running nft in {ns}: {e}")))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())
        .map_err(|e| NetError(format!("writing to nft: {e}")))?;
    let out = child
        .wait_with_output()
        .map_err(|e| NetError(format!("waiting for nft: {e}")))?;
    if !out.status.success() {
        return Err(NetError(format!(
            "nft in {ns} failed ({}): {}\nscript:\n{script}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Whether process `pid` is alive.
fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The PID in a name of ours (`wf<pid>x…`), if it is one.
fn owner(name: &str) -> Option<u32> {
    name.strip_prefix("wf")?.split('x').next()?.parse().ok()
}

/// Removes namespaces and bridges of ours whose process is gone.
fn sweep() {
    if let Ok(list) = run("ip", &["netns", "list"]) {
        for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
            if owner(name).is_some_and(|pid| !alive(pid)) {
                let _ = run("ip", &["netns", "del", name]);
            }
        }
    }
    if let Ok(list) = run("ip", &["-o", "link", "show", "type", "bridge"]) {
        for name in list.lines().filter_map(|l| l.split(':').nth(1)) {
            let name = name.trim();
            if owner(name).is_some_and(|pid| !alive(pid)) {
                let _ = run("ip", &["link", "del", name]);
            }
        }
    }
}

impl Net {
    /// `nodes` namespaces on a new bridge, each with loopback up and an
    /// empty nftables table (no fault).
    pub fn new(nodes: usize) -> Result<Net, NetError> {
        assert!((1..=200).contains(&nodes));
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(NetError(
                "network namespaces need root: run the fault tests as root".into(),
            ));
        }
        run("nft", &["--version"])?;
        sweep();
        let pid = std::process::id();
        let k = MADE.fetch_add(1, Ordering::Relaxed);
        let tag = format!("wf{pid}x{k}");
        // A /24 no interface here has yet.
        let used = run("ip", &["-4", "-o", "addr", "show"])?;
        let mut seed = pid
            .wrapping_mul(2_654_435_761)
            .wrapping_add(k.wrapping_mul(40_503));
        let subnet = loop {
            let s = [10, (seed >> 8) as u8, seed as u8];
            if !used.contains(&format!(" {}.{}.{}.", s[0], s[1], s[2])) {
                break s;
            }
            seed = seed.wrapping_add(7_919);
        };
        let net = Net {
            tag,
            subnet,
            nodes,
            cut: BTreeSet::new(),
            mute: BTreeSet::new(),
        };
        net.build()?;
        Ok(net)
    }

    fn bridge(&self) -> String {
        format!("{}b", self.tag)
    }

    fn build(&self) -> Result<(), NetError> {
        let br = self.bridge();
        run("ip", &["link", "add", &br, "type", "bridge"])?;
        let host = format!("{}/24", self.host_ip());
        run("ip", &["addr", "add", &host, "dev", &br])?;
        run("ip", &["link", "set", &br, "up"])?;
        for i in 0..self.nodes {
            let ns = self.ns(i);
            let (outer, inner) = (format!("{}h{i}", self.tag), format!("{}n{i}", self.tag));
            run("ip", &["netns", "add", &ns])?;
            run(
                "ip",
                &[
                    "link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", &ns,
                ],
            )?;
            run("ip", &["link", "set", &outer, "master", &br, "up"])?;
            let x = |args: &[&str]| {
                let mut all = vec!["netns", "exec", &ns, "ip"];
                all.extend_from_slice(args);
                run("ip", &all)
            };
            x(&["link", "set", "lo", "up"])?;
            let addr = format!("{}/24", self.ip(i));
            x(&["addr", "add", &addr, "dev", &inner])?;
            x(&["link", "set", &inner, "up"])?;
            nft(
                &ns,
                &format!(
                    "table inet {TABLE} {{\n\
                     chain input {{ type filter hook input priority 0; }}\n\
                     chain output {{ type filter hook output priority 0; }}\n\
                     }}\n"
                ),
            )?;
        }
        Ok(())
    }

    /// How many nodes it has.
    pub fn len(&self) -> usize {
        self.nodes
    }

    /// Whether it has no node (never: [`Net::new`] asks for one at least).
    pub fn is_empty(&self) -> bool {
        self.nodes == 0
    }

    /// Node `i`'s namespace (for `ip netns exec`).
    pub fn ns(&self, i: usize) -> String {
        format!("{}s{i}", self.tag)
    }

    /// Node `i`'s address.
    pub fn ip(&self, i: usize) -> Ipv4Addr {
        assert!(i < self.nodes, "node {i} of {}", self.nodes);
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, i as u8 + 1)
    }

    /// The test process's address on the bridge.
    pub fn host_ip(&self) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, 254)
    }

    /// The directed links cut now.
    pub fn cut_links(&self) -> &BTreeSet<(usize, usize)> {
        &self.cut
    }

    /// Makes exactly `links` (directed: packets from `.0` to `.1` are
    /// dropped) the cut ones.
    pub fn set_cut(&mut self, links: BTreeSet<(usize, usize)>) {
        self.cut = links;
        self.apply_output();
    }

    /// Node `i` sends nothing to the test process: its clients' requests
    /// arrive, its answers are lost (a client then times out and retries
    /// what may already be written).
    pub fn mute_to_clients(&mut self, i: usize) {
        self.mute.insert(i);
        self.apply_output();
    }

    /// Writes every node's output chain from `cut` and `mute`.
    fn apply_output(&self) {
        for i in 0..self.nodes {
            let mut script = format!("flush chain inet {TABLE} output\n");
            let mut to: Vec<Ipv4Addr> = self
                .cut
                .iter()
                .filter(|(from, _)| *from == i)
                .map(|(_, to)| self.ip(*to))
                .collect();
            if self.mute.contains(&i) {
                to.push(self.host_ip());
            }
            for addr in to {
                script.push_str(&format!(
                    "add rule inet {TABLE} output ip daddr {addr} counter drop\n"
                ));
            }
            nft(&self.ns(i), &script).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// Nodes of different `groups` cannot reach each other; nodes in no
    /// group reach everyone. `partition(&[&[0], &[1, 2]])` isolates node 0.
    pub fn partition(&mut self, groups: &[&[usize]]) {
        let mut links = BTreeSet::new();
        for (gi, g) in groups.iter().enumerate() {
            for (hi, h) in groups.iter().enumerate() {
                if gi != hi {
                    for a in g.iter() {
                        for b in h.iter() {
                            links.insert((*a, *b));
                        }
                    }
                }
            }
        }
        self.set_cut(links);
    }

    /// Node `i` reaches no other node, and none reaches it.
    pub fn isolate(&mut self, i: usize) {
        let rest: Vec<usize> = (0..self.nodes).filter(|j| *j != i).collect();
        self.partition(&[&[i], &rest]);
    }

    /// Packets from `from` to `to` are dropped; the other way they pass.
    pub fn cut_one_way(&mut self, from: usize, to: usize) {
        self.set_cut(BTreeSet::from([(from, to)]));
    }

    /// A bridge: `middle` reaches everyone; the others are split in two
    /// halves that reach only their own half and `middle`.
    pub fn bridge_through(&mut self, middle: usize) {
        let others: Vec<usize> = (0..self.nodes).filter(|j| *j != middle).collect();
        let (a, b) = others.split_at(others.len() / 2);
        self.partition(&[a, b]);
    }

    /// Every cut link restored, every node heard by its clients, and no
    /// loss.
    pub fn heal(&mut self) {
        self.mute.clear();
        self.set_cut(BTreeSet::new());
        for i in 0..self.nodes {
            self.set_loss(i, 0);
            self.set_slow(i, None);
        }
    }

    /// Node `i`'s link sends at most `rate` (tc's units: `2mbit`), what it
    /// cannot send at once queued up to 200 ms and the rest dropped (a
    /// token bucket, `tbf`: a congested link; this kernel has no `netem`
    /// for a fixed delay). `None`: full speed again.
    pub fn set_slow(&self, i: usize, rate: Option<&str>) {
        let dev = self.dev(i);
        match rate {
            Some(rate) => {
                self.tc(
                    i,
                    &[
                        "qdisc", "replace", "dev", &dev, "root", "tbf", "rate", rate, "burst",
                        "16kb", "latency", "200ms",
                    ],
                )
                .unwrap_or_else(|e| panic!("{e}"));
            }
            // Absent already is fine.
            None => {
                let _ = self.tc(i, &["qdisc", "del", "dev", &dev, "root"]);
            }
        }
    }

    /// Packets node `i`'s slow link held back (queued or dropped) since it
    /// was made slow: the proof the link was slow.
    pub fn held_back(&self, i: usize) -> u64 {
        let dev = self.dev(i);
        let out = self
            .tc(i, &["-s", "qdisc", "show", "dev", &dev])
            .unwrap_or_else(|e| panic!("{e}"));
        out.split("overlimits ")
            .skip(1)
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    /// Node `i`'s link device inside its namespace.
    fn dev(&self, i: usize) -> String {
        format!("{}n{i}", self.tag)
    }

    /// `tc args` inside node `i`'s namespace.
    fn tc(&self, i: usize, args: &[&str]) -> Result<String, NetError> {
        let ns = self.ns(i);
        let mut all = vec!["netns", "exec", &ns, "tc"];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Node `i` drops `percent` % of the packets it receives, at random
    /// (0: none).
    pub fn set_loss(&self, i: usize, percent: u32) {
        let mut script = format!("flush chain inet {TABLE} input\n");
        if percent > 0 {
            script.push_str(&format!(
                "add rule inet {TABLE} input ip saddr != {} numgen random mod 100 < {percent} counter drop\n",
                self.host_ip()
            ));
        }
        nft(&self.ns(i), &script).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Packets node `i`'s rules dropped so far (since its rules were last
    /// set): the proof a fault was in effect.
    pub fn dropped(&self, i: usize) -> u64 {
        let out = must(
            "ip",
            &[
                "netns",
                "exec",
                &self.ns(i),
                "nft",
                "list",
                "table",
                "inet",
                TABLE,
            ],
        );
        out.split("packets ")
            .skip(1)
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 0..self.nodes {
            let _ = run("ip", &["netns", "del", &self.ns(i)]);
        }
        let _ = run("ip", &["link", "del", &self.bridge()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddr, UdpSocket};
    use std::time::Duration;

    /// Node `i` sends ten datagrams to the host's `port` (bash's
    /// `/dev/udp`: no tool the machine may lack).
    fn echo_in(net: &Net, i: usize, port: u16) -> std::process::Child {
        Command::new("ip")
            .args(["netns", "exec", &net.ns(i), "bash", "-c"])
            .arg(format!(
                "for n in 1 2 3 4 5 6 7 8 9 10; do echo hi{i} > /dev/udp/{}/{port}; sleep 0.05; done",
                net.host_ip()
            ))
            .spawn()
            .unwrap()
    }

    #[test]
    fn namespaces_reach_the_host_and_cuts_drop_between_nodes() {
        let mut net = match Net::new(3) {
            Ok(n) => n,
            Err(e) => panic!("{e}"),
        };
        let host = UdpSocket::bind(SocketAddr::from((net.host_ip(), 0))).unwrap();
        host.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let port = host.local_addr().unwrap().port();
        let mut child = echo_in(&net, 1, port);
        let mut buf = [0u8; 16];
        let (n, from) = host.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"hi1\n");
        assert_eq!(from.ip(), net.ip(1));
        child.wait().unwrap();

        // Node 0 cut off: its packets to node 1 are counted and dropped.
        net.isolate(0);
        assert_eq!(net.cut_links().len(), 4);
        let send = format!("echo x > /dev/udp/{}/9", net.ip(1));
        let out = Command::new("ip")
            .args(["netns", "exec", &net.ns(0), "bash", "-c", &send])
            .output()
            .unwrap();
        // A dropped packet is an error for the sender (EPERM).
        assert!(!out.status.success());
        assert!(net.dropped(0) >= 1, "dropped {}", net.dropped(0));
        net.heal();
        assert_eq!(net.dropped(0), 0);
        let tag = net.tag.clone();
        drop(net);
        let left = must("ip", &["netns", "list"]);
        assert!(!left.contains(&tag), "{left}");
    }
}
