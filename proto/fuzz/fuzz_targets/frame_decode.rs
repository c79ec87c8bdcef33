//! Native-protocol frames: `peek_frame_len`, `decode_request`,
//! `decode_response` and `decode_body` must return errors, never panic, on
//! any input.
//!
//! The first input byte chooses which message type the body is decoded as
//! (so every type's validation is reached from a small corpus); the rest is
//! the frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_proto::api::ApiKey;
use weir_proto::frame::{
    decode_body, decode_request, decode_response, payload_slice, peek_frame_len,
    FRAME_BYTES_MAX_DEFAULT,
};
use weir_proto::messages::*;

/// Decodes `body` as message type number `selector` (modulo the number of
/// types), following payload ranges into `payload`.
fn decode_selected(selector: u8, body: &[u8], payload: &[u8]) {
    match selector % 23 {
        0 => drop(decode_body::<ErrorBody>(body)),
        1 => drop(decode_body::<ApiVersionsRequest>(body)),
        2 => drop(decode_body::<ApiVersionsResponse>(body)),
        3 => drop(decode_body::<MetadataRequest>(body)),
        4 => drop(decode_body::<MetadataResponse>(body)),
        5 => drop(decode_body::<CreateTopicsRequest>(body)),
        6 => drop(decode_body::<CreateTopicsResponse>(body)),
        7 => drop(decode_body::<DeleteTopicsRequest>(body)),
        8 => drop(decode_body::<DeleteTopicsResponse>(body)),
        9 => drop(decode_body::<DescribeConfigsRequest>(body)),
        10 => drop(decode_body::<DescribeConfigsResponse>(body)),
        11 => drop(decode_body::<AlterConfigsRequest>(body)),
        12 => drop(decode_body::<AlterConfigsResponse>(body)),
        13 => drop(decode_body::<CreatePartitionsRequest>(body)),
        14 => drop(decode_body::<CreatePartitionsResponse>(body)),
        15 => {
            if let Ok(req) = decode_body::<ProduceRequest>(body) {
                for p in &req.partitions {
                    let _ = payload_slice(payload, p.payload_offset, p.payload_len);
                }
            }
        }
        16 => drop(decode_body::<ProduceResponse>(body)),
        17 => drop(decode_body::<FetchRequest>(body)),
        18 => {
            if let Ok(resp) = decode_body::<FetchResponse>(body) {
                for p in &resp.partitions {
                    let _ = payload_slice(payload, p.payload_offset, p.payload_len);
                }
            }
        }
        19 => drop(decode_body::<ListOffsetsRequest>(body)),
        20 => drop(decode_body::<InitProducerIdRequest>(body)),
        21 => drop(decode_body::<InitProducerIdResponse>(body)),
        _ => drop(decode_body::<ListOffsetsResponse>(body)),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, frame)) = data.split_first() else {
        return;
    };
    let _ = peek_frame_len(frame, FRAME_BYTES_MAX_DEFAULT);
    let _ = peek_frame_len(frame, 256);

    if let Ok((header, body, payload)) = decode_request(frame) {
        decode_selected(selector, body, payload);
        let _ = header.check_supported();
        let _ = AnyRequest::decode(&header, body);
    }
    if let Ok((header, body, payload)) = decode_response(frame) {
        decode_selected(selector, body, payload);
        if let Some(api) = ApiKey::from_u16(u16::from(selector) % 11) {
            let _ = AnyResponse::decode(api, &header, body);
        }
    }
    // The whole input as a body: reaches validation without a valid header.
    decode_selected(selector, frame, &[]);
});
