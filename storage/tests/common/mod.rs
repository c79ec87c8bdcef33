//! Helpers shared by the storage integration tests.
#![allow(dead_code)]

use std::future::Future;
use std::path::Path;

use bytes::{BufMut, BytesMut};
use glommio::{LocalExecutorBuilder, Placement};
use weir_proto::batch;

/// Runs `f` on a fresh glommio executor and waits for it.
pub fn run<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(f)
        .expect("glommio executor starts (check `ulimit -l`)")
        .join()
        .expect("test body panicked");
}

/// A valid batch of `records` records whose records section is `payload`
/// (opaque to storage), timestamps `ts..=ts_max`.
pub fn batch_with(records: i32, payload: &[u8], ts: i64, ts_max: i64) -> BytesMut {
    let mut b = BytesMut::with_capacity(batch::HEADER_BYTES + payload.len());
    b.put_i64(0); // base offset
    b.put_i32((batch::HEADER_BYTES - batch::LOG_OVERHEAD + payload.len()) as i32);
    b.put_i32(0); // leader epoch
    b.put_i8(2); // magic
    b.put_u32(0); // crc, set below
    b.put_i16(0); // attributes
    b.put_i32(records - 1); // last offset delta
    b.put_i64(ts);
    b.put_i64(ts_max);
    b.put_i64(-1); // producer id
    b.put_i16(-1);
    b.put_i32(-1);
    b.put_i32(records);
    b.put_slice(payload);
    let crc = batch::compute_crc(&b);
    batch::set_crc(&mut b, crc);
    b
}

/// A batch with one timestamp.
pub fn batch(records: i32, payload: &[u8], ts: i64) -> BytesMut {
    batch_with(records, payload, ts, ts)
}

/// Deterministic payload for batch number `i`.
pub fn payload(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Batch bytes as stored at `base_offset`.
pub fn stored(mut b: BytesMut, base_offset: u64) -> Vec<u8> {
    batch::set_base_offset(&mut b, base_offset as i64);
    b.to_vec()
}

/// The `.log` files in a partition directory, sorted.
pub fn log_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v
}
