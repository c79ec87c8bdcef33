//! Strategies and helpers shared by the integration tests.
#![allow(dead_code)]

use bytes::Bytes;
use proptest::prelude::*;
use weir_proto::batch::{compute_crc, set_crc, Compression};
use weir_proto::record::RecordData;

/// Offsets of header fields the tests patch.
pub const OFF_LENGTH: usize = 8;
pub const OFF_ATTRIBUTES: usize = 21;
pub const OFF_LAST_OFFSET_DELTA: usize = 23;
pub const OFF_RECORDS_COUNT: usize = 57;

pub const CODECS: [Compression; 3] = [Compression::None, Compression::Lz4, Compression::Zstd];

pub fn codec() -> impl Strategy<Value = Compression> {
    prop::sample::select(CODECS.to_vec())
}

pub fn bytes_opt(max: usize) -> impl Strategy<Value = Option<Bytes>> {
    prop::option::of(prop::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from))
}

pub fn timestamp() -> impl Strategy<Value = i64> {
    -(1i64 << 40)..(1i64 << 44)
}

/// A record whose header keys may repeat.
pub fn record() -> impl Strategy<Value = RecordData> {
    let headers = prop::collection::vec((".{0,8}", bytes_opt(16)), 0..4);
    (bytes_opt(32), bytes_opt(200), headers, timestamp()).prop_map(
        |(key, value, headers, timestamp)| RecordData {
            key,
            value,
            headers,
            timestamp,
        },
    )
}

/// A record with distinct header keys (kafka-protocol keeps headers in a map).
pub fn record_unique_headers() -> impl Strategy<Value = RecordData> {
    let headers = prop::collection::btree_map(".{0,8}", bytes_opt(16), 0..4);
    (bytes_opt(32), bytes_opt(200), headers, timestamp()).prop_map(
        |(key, value, headers, timestamp)| RecordData {
            key,
            value,
            headers: headers.into_iter().collect(),
            timestamp,
        },
    )
}

/// Overwrites bytes at `at` and recomputes the CRC.
pub fn patch(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
    fix_crc(buf);
}

/// Recomputes and stores the CRC of the batch filling `buf`.
pub fn fix_crc(buf: &mut [u8]) {
    let crc = compute_crc(buf);
    set_crc(buf, crc);
}

/// Proptest config with `cases` cases; failures persist next to the test
/// source (`tests/<name>.proptest-regressions`).
pub fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    }
}
