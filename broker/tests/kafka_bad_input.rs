//! Bad input on the Kafka listener gets what bad input on the native
//! port gets: an error answer or a closed connection, never a crash, a
//! stall of other clients, or an allocation on the input's word.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Broker;

/// A request frame: size prefix, header v1 (key, version, correlation id,
/// client id), body.
fn frame(key: i16, version: i16, corr: i32, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&key.to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(&corr.to_be_bytes());
    f.extend_from_slice(&4i16.to_be_bytes());
    f.extend_from_slice(b"test");
    f.extend_from_slice(body);
    let mut out = (f.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&f);
    out
}

fn connect(b: &Broker) -> TcpStream {
    let s = TcpStream::connect(b.kafka).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// The next response frame (after its size prefix), or `None` once the
/// broker closed the connection.
fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut size = [0u8; 4];
    if s.read_exact(&mut size).is_err() {
        return None;
    }
    let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

/// ApiVersions v0 works on a new connection: the broker is alive.
fn alive(b: &Broker) {
    let mut s = connect(b);
    s.write_all(&frame(18, 0, 7, &[])).unwrap();
    let r = read_frame(&mut s).expect("an ApiVersions answer");
    assert_eq!(&r[..4], &7i32.to_be_bytes());
    assert_eq!(&r[4..6], &0i16.to_be_bytes(), "error code");
}

#[test]
fn bad_frames_get_errors_or_a_closed_connection_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(dir.path(), 2);
    // A size over the frame limit, a negative one, a tiny one: closed.
    for size in [i32::MAX, -5, 3] {
        let mut s = connect(&b);
        s.write_all(&size.to_be_bytes()).unwrap();
        assert_eq!(read_frame(&mut s), None, "size {size}");
    }
    // A Metadata request declaring 9 MiB (requests other than Produce are
    // capped at 8 MiB): closed before it is buffered.
    let mut s = connect(&b);
    let mut head = (9i32 << 20).to_be_bytes().to_vec();
    head.extend_from_slice(&3i16.to_be_bytes());
    s.write_all(&head).unwrap();
    assert_eq!(read_frame(&mut s), None);
    // An unknown API: closed, as Kafka does.
    let mut s = connect(&b);
    s.write_all(&frame(999, 0, 1, &[])).unwrap();
    assert_eq!(read_frame(&mut s), None);
    // ApiVersions at a version the broker does not know: Kafka's fallback
    // (a v0 answer, UNSUPPORTED_VERSION, and the ApiVersions range).
    let mut s = connect(&b);
    s.write_all(&frame(18, 99, 2, &[])).unwrap();
    let r = read_frame(&mut s).expect("the fallback answer");
    assert_eq!(&r[..4], &2i32.to_be_bytes());
    assert_eq!(&r[4..6], &35i16.to_be_bytes());
    // A Metadata v1 body declaring i32::MAX topics with none sent: an
    // error or a close, promptly, and no allocation on its word (the
    // broker would abort).
    let mut s = connect(&b);
    s.write_all(&frame(3, 1, 3, &i32::MAX.to_be_bytes()))
        .unwrap();
    if let Some(r) = read_frame(&mut s) {
        assert_eq!(&r[..4], &3i32.to_be_bytes());
    }
    // A frame that declares more bytes than it sends, then stalls: other
    // clients are served meanwhile.
    let mut stalled = connect(&b);
    stalled.write_all(&1000i32.to_be_bytes()).unwrap();
    stalled.write_all(&[0u8; 10]).unwrap();
    alive(&b);
    // Random bytes after a valid header of every served API and version
    // range edge: answers or closes, never a crash.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in 0..300 {
        let key = [
            0i16, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 19, 20, 22, 32, 37, 42, 44, 60, 68,
        ][(rnd() % 22) as usize];
        let version = (rnd() % 14) as i16;
        let body: Vec<u8> = (0..(rnd() % 64)).map(|_| rnd() as u8).collect();
        let mut s = connect(&b);
        s.write_all(&frame(key, version, i, &body)).unwrap();
        let _ = read_frame(&mut s);
    }
    alive(&b);
    drop(stalled);
    assert!(
        b.stop().success(),
        "the broker stops cleanly after all that"
    );
}
