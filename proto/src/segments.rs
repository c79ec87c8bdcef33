//! Zero-copy answers: the record batches of a fetch answer go to the socket
//! as the `Bytes` the storage engine handed out, not copied into one
//! buffer, but a write per tiny batch would cost more than the copy. Both
//! listeners (native and Kafka) cut their answers with [`segments`].

use bytes::{Bytes, BytesMut};

/// Batches shorter than this go to the socket joined with their short
/// neighbours (one copy of those); longer ones are segments of their own.
/// Each segment of an answer is one write to the socket (the listener's `send`), so a
/// fetch of a thousand 1 KiB batches must not become a thousand writes.
pub const SEGMENT_MIN_BYTES: usize = 64 << 10;

/// The segments to send `batches` as, in order, none empty: each batch of
/// [`SEGMENT_MIN_BYTES`] or more as it is (its own memory, no copy), each
/// run of shorter ones joined into one (a short batch alone stays itself).
pub fn segments(batches: &[Bytes]) -> Vec<Bytes> {
    let mut out: Vec<Bytes> = Vec::new();
    let mut short: Vec<&Bytes> = Vec::new();
    for b in batches.iter().filter(|b| !b.is_empty()) {
        if b.len() < SEGMENT_MIN_BYTES {
            short.push(b);
        } else {
            join_into(&mut short, &mut out);
            out.push(b.clone());
        }
    }
    join_into(&mut short, &mut out);
    out
}

/// Moves a run of short batches to `out` as one segment.
fn join_into(short: &mut Vec<&Bytes>, out: &mut Vec<Bytes>) {
    match short.len() {
        0 => {}
        1 => out.push(short[0].clone()),
        _ => {
            let mut joined = BytesMut::with_capacity(short.iter().map(|b| b.len()).sum());
            for b in short.iter() {
                joined.extend_from_slice(b);
            }
            out.push(joined.freeze());
        }
    }
    short.clear();
}
