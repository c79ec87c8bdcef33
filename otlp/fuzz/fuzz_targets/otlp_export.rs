//! What an OTLP receiver does with a request body, on any input: the
//! gRPC frame, decompression under a limit, the protobuf check or the
//! JSON transcoding, and the cut into records in every keying and
//! encoding — errors, never a panic, an abort or an allocation beyond a
//! bound of the input's size.
//!
//! The first input byte picks the signal, the content (protobuf, JSON,
//! gRPC-framed, gzip) and the cut; the rest is the body.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use weir_otlp::{codec, cut, decode_export, decompress, grpc, Content, Cut, Encoding, Partitioning, Signal};

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let signal = Signal::ALL[usize::from(pick % 3)];
    let body = match (pick >> 2) % 4 {
        0 => Bytes::copy_from_slice(body),
        1 => match grpc::unframe(body) {
            Ok((_, m)) => Bytes::copy_from_slice(m),
            Err(_) => return,
        },
        2 => match decompress("gzip", Bytes::copy_from_slice(body), LIMIT) {
            Ok(b) => b,
            Err(_) => return,
        },
        _ => {
            // JSON: the body as text.
            if let Ok(proto) = decode_export(signal, Content::Json, Bytes::copy_from_slice(body)) {
                codec::check(signal.request(), &proto).expect("transcoded JSON is valid protobuf");
                exercise(signal, &proto, pick);
            }
            return;
        }
    };
    if let Ok(proto) = decode_export(signal, Content::Protobuf, body) {
        exercise(signal, &proto, pick);
    }
});

fn exercise(signal: Signal, proto: &Bytes, pick: u8) {
    let partitioning = match (pick >> 4) % 3 {
        0 => Partitioning::None,
        1 => Partitioning::TraceId,
        _ => Partitioning::ResourceAttributes,
    };
    let encoding = if pick & 0x40 != 0 { Encoding::Json } else { Encoding::Proto };
    let how = Cut {
        partitioning,
        encoding,
        topic_from_attribute: (pick & 0x80 != 0).then(|| "service.name".to_string()),
    };
    let records = cut(signal, proto, &how).expect("a checked request cuts");
    for r in records {
        if encoding == Encoding::Proto {
            codec::check(signal.request(), &r.value).expect("a record is a valid request");
        }
    }
    let json = codec::to_json(signal.request(), proto).expect("a checked request writes as JSON");
    let back = codec::from_json(signal.request(), json.as_bytes()).expect("its JSON reads back");
    assert_eq!(codec::to_json(signal.request(), &back).unwrap(), json);
}
