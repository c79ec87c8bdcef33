//! The data plane's transport on glommio executors: a follower core's
//! endpoint fetches raw batch bytes from a leader core's endpoint (mutual
//! TLS, hello, one stream per fetch); another cluster, and a node claiming
//! another node's id, are refused.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use bytes::Bytes;
use weir_replication::data::{
    accept_hello, core_endpoint, write_frame_with_payload, DataLink, DataRequest, DataResponse,
    FetchPart, FetchedPart, ReplicaFetch, UdpSettings,
};
use weir_replication::tls::{generate_cluster, NodeTls};
use weir_replication::wire::{decode, encode, read_frame};

/// Jumbo-sized packets, as the broker's default.
const UDP: UdpSettings = UdpSettings {
    buffer_bytes: 1 << 20,
    max_payload: 8952,
};

fn executor<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = T>>> + Send + 'static,
) -> glommio::ExecutorJoinHandle<T> {
    glommio::LocalExecutorBuilder::default()
        .name(name)
        .spawn(f)
        .unwrap()
}

/// A leader core: answers one connection's fetches with `payload` for
/// every partition asked, until the connection closes.
fn leader(
    tls: NodeTls,
    cluster: &'static str,
    addr_tx: mpsc::Sender<SocketAddr>,
    payload: Bytes,
) -> glommio::ExecutorJoinHandle<()> {
    answering(tls, cluster, addr_tx, move |f| {
        let parts: Vec<FetchedPart> = f
            .partitions
            .iter()
            .map(|p| FetchedPart {
                leader_epoch: p.leader_epoch,
                high_watermark: p.fetch_offset,
                payload_len: payload.len() as u32,
                ..FetchedPart::default()
            })
            .collect();
        let payloads = vec![payload.clone(); parts.len()];
        (parts, payloads)
    })
}

/// A leader core whose answers `answer` makes (what they claim need not be
/// what they carry); a follower that gives up on a stream is not an error.
fn answering(
    tls: NodeTls,
    cluster: &'static str,
    addr_tx: mpsc::Sender<SocketAddr>,
    answer: impl Fn(&ReplicaFetch) -> (Vec<FetchedPart>, Vec<Bytes>) + Send + 'static,
) -> glommio::ExecutorJoinHandle<()> {
    executor("leader", move || {
        Box::pin(async move {
            let endpoint = core_endpoint(&tls, "127.0.0.1:0".parse().unwrap(), UDP).unwrap();
            addr_tx.send(endpoint.local_addr().unwrap()).unwrap();
            while let Some(incoming) = endpoint.accept().await {
                let Ok(conn) = incoming.await else { continue };
                if accept_hello(&conn, cluster).await.is_err() {
                    continue;
                }
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    let body = read_frame(&mut recv).await.unwrap();
                    let DataRequest::Fetch(f) = decode::<DataRequest>(&body).unwrap() else {
                        panic!("not a fetch")
                    };
                    let (parts, payloads) = answer(&f);
                    let answer = encode(&DataResponse::Fetched(parts));
                    let _ = write_frame_with_payload(&mut send, &answer, &payloads).await;
                }
                return;
            }
        })
    })
}

#[test]
fn a_follower_core_fetches_raw_batches_from_a_leader_core() {
    let dir = tempfile::tempdir().unwrap();
    generate_cluster(dir.path(), 2).unwrap();
    let payload = Bytes::from(
        (0..300_000u32)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    let (tx, rx) = mpsc::channel();
    let server = leader(
        NodeTls::load(dir.path(), 1).unwrap(),
        "c1",
        tx,
        payload.clone(),
    );
    let addr = rx.recv().unwrap();
    let tls = NodeTls::load(dir.path(), 2).unwrap();
    let want = payload.clone();
    let client = executor("follower", move || {
        Box::pin(async move {
            let endpoint = core_endpoint(&tls, "127.0.0.1:0".parse().unwrap(), UDP).unwrap();
            // Another cluster id is refused.
            let e = DataLink::connect(&endpoint, 1, addr, "c2", 2)
                .await
                .unwrap_err();
            assert!(format!("{e:#}").contains("refused"), "{e:#}");
            // Node 2's certificate cannot speak for node 3.
            let e = DataLink::connect(&endpoint, 1, addr, "c1", 3)
                .await
                .unwrap_err();
            assert!(
                format!("{e:#}").contains("its certificate is not node 3's"),
                "{e:#}"
            );
            let link = DataLink::connect(&endpoint, 1, addr, "c1", 2)
                .await
                .unwrap();
            let fetch = |round: u64| ReplicaFetch {
                replica: 2,
                max_wait_ms: 0,
                max_bytes: 1 << 20,
                partitions: (0..3)
                    .map(|p| FetchPart {
                        topic: "t".into(),
                        partition: p,
                        leader_epoch: 7,
                        fetch_offset: round,
                        last_fetched_epoch: None,
                        durable_offset: 0,
                    })
                    .collect(),
            };
            for round in 0..5u64 {
                let got = link.fetch(&fetch(round)).await.unwrap();
                assert_eq!(got.len(), 3);
                for (part, bytes) in got {
                    assert_eq!(part.leader_epoch, 7);
                    assert_eq!(part.high_watermark, round);
                    assert_eq!(bytes, want);
                }
            }
            // Path MTU discovery goes past Ethernet's 1452 on loopback, and
            // stays there under full-size transfers: sends that batch
            // several jumbo datagrams fit in one GSO send (when they did
            // not, every one failed and the MTU fell back to 1200). (The
            // refused connections above close at once: with jumbo probes
            // filling quinn's default initial window they could not send
            // their CONNECTION_CLOSE, and the next handshake timed out.)
            let mut round = 5;
            while link.stats().path.current_mtu <= 1452 {
                round += 1;
                assert!(
                    round < 500,
                    "MTU discovery never passed 1452: {:?}",
                    link.stats().path
                );
                link.fetch(&fetch(round)).await.unwrap();
            }
            for _ in 0..20 {
                round += 1;
                for (_, bytes) in link.fetch(&fetch(round)).await.unwrap() {
                    assert_eq!(bytes, want);
                }
            }
            let path = link.stats().path;
            assert!(path.current_mtu > 1452, "the MTU fell back: {path:?}");
            endpoint.close(0u32.into(), b"done");
            endpoint.wait_idle().await;
        })
    });
    client.join().unwrap();
    server.join().unwrap();
}

/// The largest single allocation made in this test binary.
static LARGEST_ALLOCATION: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, noting [`LARGEST_ALLOCATION`].
struct Noting;

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Noting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST_ALLOCATION.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST_ALLOCATION.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST_ALLOCATION.fetch_max(new_size, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Noting = Noting;

/// A follower makes room for what a leader's answer brings, not for what
/// it claims: 4 GiB claimed and 100 bytes sent fail as a short read
/// without a 4 GiB buffer. An answer past the fetch's size by a batch
/// (one batch larger than asked, or a batch on each of several
/// partitions) is read whole; one answering fewer partitions than asked
/// is refused.
#[test]
fn a_follower_makes_room_for_what_an_answer_brings_not_what_it_claims() {
    let dir = tempfile::tempdir().unwrap();
    generate_cluster(dir.path(), 2).unwrap();
    const ASKED: u32 = 64 << 10;
    let big = Bytes::from(vec![7u8; 200 << 10]);
    let sent = big.clone();
    let (tx, rx) = mpsc::channel();
    let server = answering(NodeTls::load(dir.path(), 1).unwrap(), "c1", tx, move |f| {
        let part = |len: usize| FetchedPart {
            payload_len: len as u32,
            ..FetchedPart::default()
        };
        let n = f.partitions.len();
        match f.partitions[0].fetch_offset {
            0 => (vec![part(sent.len())], vec![sent.clone()]),
            1 => (vec![part(sent.len()); n], vec![sent.clone(); n]),
            2 => (
                vec![part(u32::MAX as usize)],
                vec![Bytes::from(vec![1u8; 100])],
            ),
            _ => (Vec::new(), Vec::new()),
        }
    });
    let addr = rx.recv().unwrap();
    let tls = NodeTls::load(dir.path(), 2).unwrap();
    let client = executor("follower", move || {
        Box::pin(async move {
            let endpoint = core_endpoint(&tls, "127.0.0.1:0".parse().unwrap(), UDP).unwrap();
            let link = DataLink::connect(&endpoint, 1, addr, "c1", 2)
                .await
                .unwrap();
            let fetch = |case: u64, partitions: u32| ReplicaFetch {
                replica: 2,
                max_wait_ms: 0,
                max_bytes: ASKED,
                partitions: (0..partitions)
                    .map(|p| FetchPart {
                        topic: "t".into(),
                        partition: p,
                        leader_epoch: 1,
                        fetch_offset: case,
                        last_fetched_epoch: None,
                        durable_offset: 0,
                    })
                    .collect(),
            };
            let got = link.fetch(&fetch(0, 1)).await.unwrap();
            assert_eq!(got[0].1, big);
            let got = link.fetch(&fetch(1, 3)).await.unwrap();
            assert!(got.iter().all(|(_, b)| *b == big));
            let e = link.fetch(&fetch(2, 1)).await.unwrap_err();
            assert!(
                format!("{e:#}").contains("reading fetched batches"),
                "{e:#}"
            );
            let largest = LARGEST_ALLOCATION.load(Ordering::Relaxed);
            assert!(largest < 1 << 30, "{largest} bytes allocated at once");
            let e = link.fetch(&fetch(3, 2)).await.unwrap_err();
            assert!(
                format!("{e:#}").contains("a fetch of 2 partitions answered for 0"),
                "{e:#}"
            );
            // The connection stays usable after refused answers.
            assert_eq!(link.fetch(&fetch(0, 1)).await.unwrap()[0].1, big);
            endpoint.close(0u32.into(), b"done");
            endpoint.wait_idle().await;
        })
    });
    client.join().unwrap();
    server.join().unwrap();
}

/// The replication socket gets the buffer it asks for, up to the kernel's
/// cap (`net.core.rmem_max` / `wmem_max`, which the broker warns about).
#[test]
fn a_replication_socket_gets_its_buffers_up_to_the_kernel_cap() {
    let cap = |name: &str| -> usize {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let asked = 4 << 20;
    let granted = weir_replication::data::size_udp_buffers(&sock, asked).unwrap();
    assert_eq!(granted, asked.min(cap("rmem_max")));
    // A smaller ask is granted whole.
    let granted = weir_replication::data::size_udp_buffers(&sock, 128 << 10).unwrap();
    assert_eq!(granted, 128 << 10);
}
