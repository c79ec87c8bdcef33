//! Byte compatibility with the `kafka-protocol` crate, for every codec Weir
//! supports: our batches decode there, and its batches decode here.

mod common;

use bytes::{Bytes, BytesMut};
use common::*;
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records as kp;
use proptest::prelude::*;
use weir_proto::batch::{set_base_offset, Compression};
use weir_proto::builder::BatchBuilder;
use weir_proto::reader::RecordBatch;
use weir_proto::record::RecordData;

fn kp_codec(c: Compression) -> kp::Compression {
    match c {
        Compression::None => kp::Compression::None,
        Compression::Lz4 => kp::Compression::Lz4,
        Compression::Zstd => kp::Compression::Zstd,
        other => panic!("codec {other:?} not under test"),
    }
}

const PRODUCER_ID: i64 = 4242;
const PRODUCER_EPOCH: i16 = 7;
const BASE_SEQUENCE: i32 = 100;

/// Ours → kafka-protocol.
fn weir_to_kafka(codec: Compression, records: &[RecordData], base_offset: i64) {
    let mut b = BatchBuilder::new(codec).unwrap();
    b.producer_id = PRODUCER_ID;
    b.producer_epoch = PRODUCER_EPOCH;
    b.base_sequence = BASE_SEQUENCE;
    for r in records {
        b.push(r).unwrap();
    }
    let mut buf = b.build().unwrap();
    set_base_offset(&mut buf, base_offset);
    let mut bytes = buf.freeze();
    let set = kp::RecordBatchDecoder::decode(&mut bytes).unwrap();
    assert!(bytes.is_empty());
    assert_eq!(set.version, 2);
    assert_eq!(set.compression, kp_codec(codec));
    assert_eq!(set.records.len(), records.len());
    for (i, (got, want)) in set.records.iter().zip(records).enumerate() {
        assert_eq!(got.offset, base_offset + i as i64);
        assert_eq!(got.sequence, BASE_SEQUENCE + i as i32);
        assert_eq!(got.producer_id, PRODUCER_ID);
        assert_eq!(got.producer_epoch, PRODUCER_EPOCH);
        assert_eq!(got.timestamp_type, kp::TimestampType::Creation);
        assert_eq!(got.timestamp, want.timestamp);
        assert_eq!(got.key, want.key);
        assert_eq!(got.value, want.value);
        let headers: Vec<_> = got
            .headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.clone()))
            .collect();
        assert_eq!(headers, want.headers);
    }
}

/// kafka-protocol → ours.
fn kafka_to_weir(codec: Compression, records: &[RecordData], base_offset: i64) {
    let kp_records: Vec<kp::Record> = records
        .iter()
        .enumerate()
        .map(|(i, r)| kp::Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: kp::NO_PARTITION_LEADER_EPOCH,
            producer_id: PRODUCER_ID,
            producer_epoch: PRODUCER_EPOCH,
            timestamp_type: kp::TimestampType::Creation,
            offset: base_offset + i as i64,
            sequence: BASE_SEQUENCE + i as i32,
            timestamp: r.timestamp,
            key: r.key.clone(),
            value: r.value.clone(),
            headers: r
                .headers
                .iter()
                .map(|(k, v)| (StrBytes::from_string(k.clone()), v.clone()))
                .collect::<IndexMap<_, _>>(),
        })
        .collect();
    let mut buf = BytesMut::new();
    let options = kp::RecordEncodeOptions {
        version: 2,
        compression: kp_codec(codec),
    };
    kp::RecordBatchEncoder::encode(&mut buf, &kp_records, &options).unwrap();

    let rb = RecordBatch::parse(&buf).unwrap();
    assert_eq!(rb.as_bytes().len(), buf.len(), "one batch");
    assert_eq!(rb.compression(), codec);
    let h = rb.header();
    assert_eq!(h.base_offset, base_offset);
    assert_eq!(h.records_count as usize, records.len());
    assert_eq!(h.last_offset_delta as usize, records.len() - 1);
    assert_eq!(
        (h.producer_id, h.producer_epoch),
        (PRODUCER_ID, PRODUCER_EPOCH)
    );
    assert_eq!(h.base_sequence, BASE_SEQUENCE);
    assert_eq!(
        h.max_timestamp,
        records.iter().map(|r| r.timestamp).max().unwrap()
    );
    let decoded = rb.records().unwrap();
    let mut n = 0;
    for (i, (got, want)) in decoded.iter().zip(records).enumerate() {
        let got = got.unwrap();
        assert_eq!(got.offset, base_offset + i as i64);
        assert_eq!(got.timestamp, want.timestamp);
        assert_eq!(got.record.key, want.key.as_deref());
        assert_eq!(got.record.value, want.value.as_deref());
        let headers: Vec<_> = got.record.headers().map(|h| (h.key, h.value)).collect();
        let expected: Vec<_> = want
            .headers
            .iter()
            .map(|(k, v)| (k.as_bytes(), v.as_deref()))
            .collect();
        assert_eq!(headers, expected);
        n += 1;
    }
    assert_eq!(n, records.len());
}

/// Enough compressible data to span several 64 KiB LZ4 blocks.
fn large_records() -> Vec<RecordData> {
    (0..300)
        .map(|i| RecordData {
            key: (i % 7 != 0).then(|| Bytes::from(format!("key-{i}"))),
            value: (i % 11 != 0).then(|| Bytes::from(format!("value {i} ").repeat(150))),
            headers: vec![
                ("trace".into(), Some(Bytes::from(format!("t{i}")))),
                ("null".into(), None),
            ],
            timestamp: 1_700_000_000_000 + (i * 37 % 101) - 50,
        })
        .collect()
}

#[test]
fn large_batches_both_ways() {
    let records = large_records();
    for codec in CODECS {
        weir_to_kafka(codec, &records, 0);
        weir_to_kafka(codec, &records, 1 << 40);
        kafka_to_weir(codec, &records, 0);
        kafka_to_weir(codec, &records, 123_456);
    }
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn weir_batches_decode_in_kafka_protocol(
        codec in codec(),
        records in prop::collection::vec(record_unique_headers(), 1..30),
        base_offset in 0i64..(1 << 50),
    ) {
        weir_to_kafka(codec, &records, base_offset);
    }

    #[test]
    fn kafka_protocol_batches_decode_in_weir(
        codec in codec(),
        records in prop::collection::vec(record_unique_headers(), 1..30),
        base_offset in 0i64..(1 << 50),
    ) {
        kafka_to_weir(codec, &records, base_offset);
    }
}
