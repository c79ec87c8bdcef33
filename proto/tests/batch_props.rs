//! Property tests: builder → validate → reader round trips, and decoding
//! arbitrary or corrupted bytes never panics.

mod common;

use common::*;
use proptest::prelude::*;
use weir_proto::batch::{self, set_base_offset, validate, Attributes, BatchHeader, HEADER_BYTES};
use weir_proto::builder::BatchBuilder;
use weir_proto::reader::RecordBatch;
use weir_proto::record::RecordData;

/// Runs every decoder over `buf`, touching every field; results are ignored.
fn exercise(buf: &[u8]) {
    let _ = BatchHeader::peek(buf);
    let _ = validate(buf);
    for b in batch::batches(buf) {
        let _ = b;
    }
    let Ok(rb) = RecordBatch::parse(buf) else {
        return;
    };
    let Ok(records) = rb.records() else {
        return;
    };
    for r in &records {
        let Ok(r) = r else { break };
        let mut n = r.record.key.map_or(0, <[u8]>::len) + r.record.value.map_or(0, <[u8]>::len);
        for h in r.record.headers() {
            n += h.key.len() + h.value.map_or(0, <[u8]>::len);
            let _ = h.key_str();
        }
        std::hint::black_box((n, r.offset, r.timestamp));
    }
}

fn build(codec: weir_proto::batch::Compression, records: &[RecordData]) -> Vec<u8> {
    let mut b = BatchBuilder::new(codec).unwrap();
    for r in records {
        b.push(r).unwrap();
    }
    b.build().unwrap().to_vec()
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn round_trip(
        codec in codec(),
        records in prop::collection::vec(record(), 1..40),
        producer_id in any::<i64>(),
        producer_epoch in any::<i16>(),
        base_sequence in any::<i32>(),
        leader_epoch in any::<i32>(),
        transactional in any::<bool>(),
        base_offset in 0i64..(1 << 50),
    ) {
        let mut b = BatchBuilder::new(codec).unwrap();
        b.producer_id = producer_id;
        b.producer_epoch = producer_epoch;
        b.base_sequence = base_sequence;
        b.partition_leader_epoch = leader_epoch;
        b.transactional = transactional;
        for r in &records {
            b.push(r).unwrap();
        }
        prop_assert_eq!(b.len(), records.len());
        let mut buf = b.build().unwrap();
        set_base_offset(&mut buf, base_offset);

        let h = validate(&buf).unwrap();
        prop_assert_eq!(h.total_len(), buf.len());
        prop_assert_eq!(h.base_offset, base_offset);
        prop_assert_eq!(h.records_count as usize, records.len());
        prop_assert_eq!(h.last_offset_delta as usize, records.len() - 1);
        prop_assert_eq!(h.base_timestamp, records[0].timestamp);
        prop_assert_eq!(h.max_timestamp, records.iter().map(|r| r.timestamp).max().unwrap());
        prop_assert_eq!(h.producer_id, producer_id);
        prop_assert_eq!(h.producer_epoch, producer_epoch);
        prop_assert_eq!(h.base_sequence, base_sequence);
        prop_assert_eq!(h.partition_leader_epoch, leader_epoch);
        prop_assert_eq!(h.attributes.is_transactional(), transactional);
        prop_assert_eq!(h.attributes.compression(), Some(codec));

        let rb = RecordBatch::parse(&buf).unwrap();
        prop_assert_eq!(rb.header(), &h);
        let decoded = rb.records().unwrap();
        let mut n = 0;
        for (i, (got, want)) in decoded.iter().zip(&records).enumerate() {
            let got = got.unwrap();
            prop_assert_eq!(got.offset, base_offset + i as i64);
            prop_assert_eq!(got.record.offset_delta as usize, i);
            prop_assert_eq!(got.timestamp, want.timestamp);
            prop_assert_eq!(got.record.key, want.key.as_deref());
            prop_assert_eq!(got.record.value, want.value.as_deref());
            prop_assert_eq!(got.record.headers_len(), want.headers.len());
            let headers: Vec<_> = got.record.headers().map(|h| (h.key, h.value)).collect();
            let expected: Vec<_> =
                want.headers.iter().map(|(k, v)| (k.as_bytes(), v.as_deref())).collect();
            prop_assert_eq!(headers, expected);
            n += 1;
        }
        prop_assert_eq!(n, records.len());
        prop_assert_eq!(decoded.iter().count(), records.len());
    }

    #[test]
    fn arbitrary_bytes_never_panic(buf in prop::collection::vec(any::<u8>(), 0..1024)) {
        exercise(&buf);
    }

    /// A well-formed, CRC-correct header over an arbitrary records section,
    /// so the record decoders and decompressors see the bytes.
    #[test]
    fn arbitrary_records_section_never_panics(
        codec_id in 0i16..8,
        log_append in any::<bool>(),
        count in prop_oneof![0i32..64, Just(i32::MAX), any::<i32>()],
        body in prop::collection::vec(any::<u8>(), 0..1024),
    ) {
        let mut buf = build(weir_proto::batch::Compression::None, &[RecordData::default()]);
        buf.truncate(HEADER_BYTES);
        buf.extend_from_slice(&body);
        let len = (buf.len() - 12) as i32;
        buf[OFF_LENGTH..OFF_LENGTH + 4].copy_from_slice(&len.to_be_bytes());
        let attrs = codec_id | if log_append { Attributes::TIMESTAMP_TYPE } else { 0 };
        buf[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attrs.to_be_bytes());
        buf[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4]
            .copy_from_slice(&count.max(1).wrapping_sub(1).to_be_bytes());
        patch(&mut buf, OFF_RECORDS_COUNT, &count.to_be_bytes());
        exercise(&buf);
    }

    /// Random corruption of a valid batch (CRC recomputed, length optionally
    /// fixed after resizing).
    #[test]
    fn mutated_batches_never_panic(
        codec in codec(),
        records in prop::collection::vec(record(), 1..8),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        resize in prop_oneof![Just(None), (0usize..64, any::<bool>()).prop_map(Some)],
        fix_length in any::<bool>(),
    ) {
        let mut buf = build(codec, &records);
        if let Some((n, grow)) = resize {
            if grow {
                buf.extend(std::iter::repeat_n(0xa5, n));
            } else {
                buf.truncate((buf.len() - n).max(HEADER_BYTES));
            }
            if fix_length {
                let len = (buf.len() - 12) as i32;
                buf[OFF_LENGTH..OFF_LENGTH + 4].copy_from_slice(&len.to_be_bytes());
            }
        }
        // Mutate only the CRC-covered region, so the CRC fix makes it count.
        let covered = buf.len() - batch::CRC_START;
        for (at, byte) in flips {
            let at = batch::CRC_START + at.index(covered);
            buf[at] ^= byte;
        }
        if let Ok(h) = batch::BatchHeader::parse_framed(&buf) {
            let end = h.total_len();
            fix_crc(&mut buf[..end]);
        }
        exercise(&buf);
    }
}

#[test]
fn huge_records_count_errors_quickly() {
    for codec in CODECS {
        let mut buf = build(codec, &[RecordData::default()]);
        patch(&mut buf, OFF_LAST_OFFSET_DELTA, &i32::MAX.to_be_bytes());
        patch(&mut buf, OFF_RECORDS_COUNT, &i32::MAX.to_be_bytes());
        let start = std::time::Instant::now();
        let rb = RecordBatch::parse(&buf).unwrap();
        assert!(rb.records().is_err(), "{codec:?}");
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
    }
}
