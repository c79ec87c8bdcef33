//! The Kafka listener's request path up to the service layer: the frame
//! length check, `decode_request` (header, body at every served version,
//! the hostile-length guard), the error answer built from the header, and
//! the validation Produce's record batches get — errors, never a panic, an
//! abort or an allocation beyond what the input's size allows, on any input.
//!
//! The first input byte picks the API among those served and the second
//! its version within the served range (so every API's decoder is reached
//! from a small corpus); the rest is the frame after the API key and
//! version (correlation id, client id, body).
#![no_main]

use bytes::{BufMut, Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use weir_kafka::codec::{
    decode_request, error_response, peek_request_frame_len, KafkaRequest, MAX_REQUEST_FRAME_BYTES,
    SUPPORTED,
};

fuzz_target!(|data: &[u8]| {
    let Some((&[api, version], rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let (key, min, max) = SUPPORTED[usize::from(api) % SUPPORTED.len()];
    let version = min + (i16::from(version) % (max - min + 1));
    let mut frame = BytesMut::with_capacity(8 + rest.len());
    frame.put_i32((4 + rest.len()) as i32);
    frame.put_i16(key);
    frame.put_i16(version);
    frame.put_slice(rest);
    let _ = peek_request_frame_len(&frame, MAX_REQUEST_FRAME_BYTES);
    let body = Bytes::from(frame).slice(4..);
    match decode_request(body) {
        Ok(req) => {
            let h = req.header();
            let _ = error_response(&h, 42);
            if let KafkaRequest::Produce(p) = &req.body {
                for t in &p.topic_data {
                    for part in &t.partition_data {
                        if let Some(records) = &part.records {
                            let mut at = 0;
                            while at < records.len() {
                                match weir_proto::batch::BatchHeader::parse_framed(&records[at..]) {
                                    Ok(h) => {
                                        let end = at + h.total_len();
                                        if end > records.len() {
                                            break;
                                        }
                                        let _ = weir_proto::batch::validate(&records[at..end]);
                                        at = end;
                                    }
                                    Err(_) => break,
                                }
                            }
                        }
                    }
                }
            }
        }
        Err(_) => {}
    }
});
