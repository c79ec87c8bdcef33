//! Property tests of the native protocol: every request and response type
//! round trips through encode → peek_frame_len → decode → decode_body, with
//! its payload; decoding arbitrary or mutated frames never panics.

mod proto_common;

use std::fmt::Debug;

use proptest::prelude::*;
use proto_common::*;
use weir_proto::api::ApiKey;
use weir_proto::error_code::ErrorCode;
use weir_proto::frame::*;
use weir_proto::messages::*;

/// Returns a copy of `bytes` that starts `shift` bytes past a 16-byte
/// boundary (its backing vector is kept alive by the caller).
fn shifted(bytes: &[u8], shift: usize) -> (Vec<u8>, usize) {
    let mut v = vec![0u8; bytes.len() + 32];
    let base = v.as_ptr() as usize;
    let start = (16 - base % 16) % 16 + shift;
    v[start..start + bytes.len()].copy_from_slice(bytes);
    (v, start)
}

/// Splits `payload` in two pieces (at `cut`, clamped) for the vectored
/// encoders.
fn pieces(payload: &[u8], cut: usize) -> [&[u8]; 2] {
    let (a, b) = payload.split_at(cut.min(payload.len()));
    [a, b]
}

/// The common checks on one encoded frame: its length can be peeked from
/// 4 bytes, a too-small limit rejects it, every proper prefix is truncated.
fn check_framing(frame: &[u8]) {
    assert_eq!(
        peek_frame_len(&frame[..3], FRAME_BYTES_MAX_DEFAULT),
        Ok(None)
    );
    assert_eq!(
        peek_frame_len(&frame[..4], FRAME_BYTES_MAX_DEFAULT),
        Ok(Some(frame.len()))
    );
    assert_eq!(
        peek_frame_len(frame, frame.len() - 4),
        Ok(Some(frame.len()))
    );
    assert_eq!(
        peek_frame_len(&frame[..4], frame.len() - 5),
        Err(FrameError::TooLarge {
            len: frame.len() - 4,
            max: frame.len() - 5
        })
    );
    let body_len = u32::from_be_bytes(frame[12..16].try_into().unwrap()) as usize;
    assert!(body_len <= frame.len() - FRAME_HEADER_BYTES);
    for cut in [0, 3, 4, FRAME_HEADER_BYTES, frame.len() - 1] {
        if cut >= frame.len() {
            continue;
        }
        let r = decode_request(&frame[..cut]);
        assert!(
            matches!(r, Err(FrameError::Truncated { .. })),
            "prefix {cut}: {r:?}"
        );
    }
}

fn round_trip_request<T>(body: &T, payload: &[u8], correlation_id: u32, cut: usize, shift: usize)
where
    T: Request + Debug + PartialEq,
{
    let header = RequestHeader::of::<T>(correlation_id);
    assert_eq!(header.api(), Some(T::API_KEY));

    let mut frame = encode_request(&header, body, payload.len()).unwrap();
    frame.extend_from_slice(payload);
    let whole = encode_request_with_payload(&header, body, &pieces(payload, cut)).unwrap();
    assert_eq!(frame, whole);
    check_framing(&frame);

    let (backing, start) = shifted(&frame, shift);
    let frame = &backing[start..start + frame.len()];
    let (h, b, p) = decode_request(frame).unwrap();
    assert_eq!(h, header);
    assert_eq!(p, payload);
    assert_eq!(&decode_body::<T>(b).unwrap(), body);
    let any = AnyRequest::decode(&h, b).unwrap();
    assert_eq!(any.api_key(), T::API_KEY);
}

fn round_trip_response<T>(
    api: ApiKey,
    body: &T,
    payload: &[u8],
    correlation_id: u32,
    cut: usize,
    shift: usize,
) where
    T: Message + Debug + PartialEq,
{
    let header = ResponseHeader::ok(correlation_id);
    let mut frame = encode_response(&header, body, payload.len()).unwrap();
    frame.extend_from_slice(payload);
    let whole = encode_response_with_payload(&header, body, &pieces(payload, cut)).unwrap();
    assert_eq!(frame, whole);
    check_framing(&frame);

    let (backing, start) = shifted(&frame, shift);
    let frame = &backing[start..start + frame.len()];
    let (h, b, p) = decode_response(frame).unwrap();
    assert_eq!(h, header);
    assert_eq!(p, payload);
    assert_eq!(&decode_body::<T>(b).unwrap(), body);
    AnyResponse::decode(api, &h, b).unwrap();
}

/// Request bodies, each with a payload, of any type.
fn any_request() -> impl Strategy<Value = (AnyRequest, Vec<u8>)> {
    let no_payload = prop::collection::vec(any::<u8>(), 0..64);
    prop_oneof![
        (api_versions_request(), no_payload.clone())
            .prop_map(|(r, p)| (AnyRequest::ApiVersions(r), p)),
        (metadata_request(), no_payload.clone()).prop_map(|(r, p)| (AnyRequest::Metadata(r), p)),
        (create_topics_request(), no_payload.clone())
            .prop_map(|(r, p)| (AnyRequest::CreateTopics(r), p)),
        (delete_topics_request(), no_payload.clone())
            .prop_map(|(r, p)| (AnyRequest::DeleteTopics(r), p)),
        (describe_configs_request(), no_payload.clone())
            .prop_map(|(r, p)| (AnyRequest::DescribeConfigs(r), p)),
        (alter_configs_request(), no_payload.clone())
            .prop_map(|(r, p)| (AnyRequest::AlterConfigs(r), p)),
        (create_partitions_request(), no_payload.clone())
            .prop_map(|(r, p)| (AnyRequest::CreatePartitions(r), p)),
        produce_request().prop_map(|(r, p)| (AnyRequest::Produce(r), p)),
        (fetch_request(), no_payload.clone()).prop_map(|(r, p)| (AnyRequest::Fetch(r), p)),
        (list_offsets_request(), no_payload.clone())
            .prop_map(|(r, p)| (AnyRequest::ListOffsets(r), p)),
        no_payload.clone().prop_map(|p| (
            AnyRequest::InitProducerId(InitProducerIdRequest::default()),
            p
        )),
        (".{0,20}", any::<bool>(), no_payload)
            .prop_map(|(topic, run, p)| (AnyRequest::Compact(CompactRequest { topic, run }), p)),
    ]
}

fn encode_any(req: &AnyRequest, correlation_id: u32, payload: &[u8]) -> Vec<u8> {
    let key = req.api_key();
    let h = RequestHeader::new(key, key.max_version(), correlation_id);
    let p = [payload];
    let frame = match req {
        AnyRequest::ApiVersions(r) => encode_request_with_payload(&h, r, &p),
        AnyRequest::Metadata(r) => encode_request_with_payload(&h, r, &p),
        AnyRequest::CreateTopics(r) => encode_request_with_payload(&h, r, &p),
        AnyRequest::DeleteTopics(r) => encode_request_with_payload(&h, r, &p),
        AnyRequest::DescribeConfigs(r) => encode_request_with_payload(&h, r, &p),
        AnyRequest::AlterConfigs(r) => encode_request_with_payload(&h, r, &p),
        AnyRequest::CreatePartitions(r) => encode_request_with_payload(&h, r, &p),
        AnyRequest::Produce(r) => encode_request_with_payload(&h, r, &p),
        AnyRequest::Fetch(r) => encode_request_with_payload(&h, r, &p),
        AnyRequest::ListOffsets(r) => encode_request_with_payload(&h, r, &p),
        AnyRequest::InitProducerId(r) => encode_request_with_payload(&h, r, &p),
        AnyRequest::Compact(r) => encode_request_with_payload(&h, r, &p),
        other => panic!("no encoder for {other:?}"),
    };
    let frame = frame.unwrap().to_vec();
    // `AnyRequest::encode_body` writes the same body bytes.
    let mut body = bytes::BytesMut::new();
    req.encode_body(&mut body).unwrap();
    assert_eq!(
        &frame[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + body.len()],
        &body[..]
    );
    frame
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn api_versions_round_trip(req in api_versions_request(), resp in api_versions_response(),
                               id in any::<u32>(), cut in 0usize..64, shift in 0usize..16) {
        round_trip_request(&req, &[], id, cut, shift);
        round_trip_response(ApiKey::ApiVersions, &resp, &[], id, cut, shift);
    }

    #[test]
    fn metadata_round_trip(req in metadata_request(), resp in metadata_response(),
                           id in any::<u32>(), cut in 0usize..64, shift in 0usize..16) {
        round_trip_request(&req, &[], id, cut, shift);
        round_trip_response(ApiKey::Metadata, &resp, &[], id, cut, shift);
    }

    #[test]
    fn create_topics_round_trip(req in create_topics_request(), resp in create_topics_response(),
                                id in any::<u32>(), cut in 0usize..64, shift in 0usize..16) {
        round_trip_request(&req, &[], id, cut, shift);
        round_trip_response(ApiKey::CreateTopics, &resp, &[], id, cut, shift);
    }

    #[test]
    fn delete_topics_round_trip(req in delete_topics_request(), resp in delete_topics_response(),
                                id in any::<u32>(), cut in 0usize..64, shift in 0usize..16) {
        round_trip_request(&req, &[], id, cut, shift);
        round_trip_response(ApiKey::DeleteTopics, &resp, &[], id, cut, shift);
    }

    #[test]
    fn describe_configs_round_trip(req in describe_configs_request(), resp in describe_configs_response(),
                                   id in any::<u32>(), cut in 0usize..64, shift in 0usize..16) {
        round_trip_request(&req, &[], id, cut, shift);
        round_trip_response(ApiKey::DescribeConfigs, &resp, &[], id, cut, shift);
    }

    #[test]
    fn alter_configs_round_trip(req in alter_configs_request(), resp in alter_configs_response(),
                                id in any::<u32>(), cut in 0usize..64, shift in 0usize..16) {
        round_trip_request(&req, &[], id, cut, shift);
        round_trip_response(ApiKey::AlterConfigs, &resp, &[], id, cut, shift);
    }

    #[test]
    fn create_partitions_round_trip(req in create_partitions_request(), resp in create_partitions_response(),
                                    id in any::<u32>(), cut in 0usize..64, shift in 0usize..16) {
        round_trip_request(&req, &[], id, cut, shift);
        round_trip_response(ApiKey::CreatePartitions, &resp, &[], id, cut, shift);
    }

    #[test]
    fn produce_round_trip((req, payload) in produce_request(), resp in produce_response(),
                          id in any::<u32>(), cut in 0usize..1500, shift in 0usize..16) {
        round_trip_request(&req, &payload, id, cut, shift);
        round_trip_response(ApiKey::Produce, &resp, &[], id, cut, shift);
        // Every partition's range lies inside the payload, and the ranges
        // tile it.
        let mut end = 0;
        for p in &req.partitions {
            prop_assert_eq!(p.payload_offset as usize, end);
            let s = payload_slice(&payload, p.payload_offset, p.payload_len).unwrap();
            end += s.len();
        }
        prop_assert_eq!(end, payload.len());
    }

    #[test]
    fn fetch_round_trip(req in fetch_request(), (resp, payload) in fetch_response(),
                        id in any::<u32>(), cut in 0usize..1500, shift in 0usize..16) {
        round_trip_request(&req, &[], id, cut, shift);
        round_trip_response(ApiKey::Fetch, &resp, &payload, id, cut, shift);
        for p in &resp.partitions {
            payload_slice(&payload, p.payload_offset, p.payload_len).unwrap();
        }
    }

    #[test]
    fn list_offsets_round_trip(req in list_offsets_request(), resp in list_offsets_response(),
                               id in any::<u32>(), cut in 0usize..64, shift in 0usize..16) {
        round_trip_request(&req, &[], id, cut, shift);
        round_trip_response(ApiKey::ListOffsets, &resp, &[], id, cut, shift);
    }

    #[test]
    fn group_membership_round_trip(join in join_group_request(), hb in heartbeat_request(),
                                   answer in group_assignment(), id in any::<u32>(),
                                   cut in 0usize..64, shift in 0usize..16) {
        round_trip_request(&join, &[], id, cut, shift);
        round_trip_request(&hb, &[], id, cut, shift);
        round_trip_response(ApiKey::JoinGroup, &answer, &[], id, cut, shift);
        round_trip_response(ApiKey::Heartbeat, &answer, &[], id, cut, shift);
    }

    #[test]
    fn group_offsets_round_trip(req in offset_commit_request(), offsets in committed_offsets(),
                                describe in describe_group_response(), id in any::<u32>(),
                                cut in 0usize..64, shift in 0usize..16) {
        round_trip_request(&req, &[], id, cut, shift);
        let fetched = OffsetFetchResponse { error: 0, message: None, offsets };
        round_trip_response(ApiKey::OffsetFetch, &fetched, &[], id, cut, shift);
        round_trip_response(ApiKey::DescribeGroup, &describe, &[], id, cut, shift);
    }

    #[test]
    fn error_response_round_trip(body in error_body(), code in 0u16..40, id in any::<u32>(),
                                 api in prop::sample::select(ApiKey::ALL.to_vec())) {
        let error = ErrorCode::from_u16(code);
        prop_assume!(!error.is_none());
        let frame = encode_error_response(id, error, &body.message).unwrap();
        prop_assert_eq!(peek_frame_len(&frame, FRAME_BYTES_MAX_DEFAULT), Ok(Some(frame.len())));
        let (h, b, p) = decode_response(&frame).unwrap();
        prop_assert_eq!(h, ResponseHeader { correlation_id: id, error });
        prop_assert!(p.is_empty());
        prop_assert_eq!(AnyResponse::decode(api, &h, b).unwrap(), AnyResponse::Error(body));
    }

    /// Frames written back to back and delivered in arbitrary chunks are
    /// split by `peek_frame_len` exactly as a server's read loop would.
    #[test]
    fn stream_of_frames(reqs in prop::collection::vec(any_request(), 1..6),
                        chunk_sizes in prop::collection::vec(1usize..200, 1..50)) {
        let mut stream = Vec::new();
        for (i, (req, payload)) in reqs.iter().enumerate() {
            let frame = encode_any(req, i as u32, payload);
            stream.extend_from_slice(&frame);
        }

        let mut buf: Vec<u8> = Vec::new();
        let mut decoded = Vec::new();
        let mut pos = 0;
        let mut sizes = chunk_sizes.iter().cycle();
        while decoded.len() < reqs.len() {
            let n = (*sizes.next().unwrap()).min(stream.len() - pos);
            buf.extend_from_slice(&stream[pos..pos + n]);
            pos += n;
            while let Some(total) = peek_frame_len(&buf, FRAME_BYTES_MAX_DEFAULT).unwrap() {
                if buf.len() < total {
                    let truncated = matches!(decode_request(&buf), Err(FrameError::Truncated { .. }));
                    prop_assert!(truncated);
                    break;
                }
                let frame: Vec<u8> = buf.drain(..total).collect();
                let (h, b, p) = decode_request(&frame).unwrap();
                decoded.push((h.correlation_id, AnyRequest::decode(&h, b).unwrap(), p.to_vec()));
            }
        }
        prop_assert!(buf.is_empty());
        for (i, ((id, req, payload), (want, want_payload))) in decoded.iter().zip(&reqs).enumerate() {
            prop_assert_eq!(*id, i as u32);
            prop_assert_eq!(req, want);
            prop_assert_eq!(payload, want_payload);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Arbitrary bytes never panic any decoder.
    #[test]
    fn arbitrary_bytes_never_panic(buf in prop::collection::vec(any::<u8>(), 0..512)) {
        exercise(&buf);
    }

    /// Arbitrary bytes behind a well-formed header (right lengths, known
    /// api key): reaches body validation every time.
    #[test]
    fn arbitrary_bodies_never_panic(api in 0u16..20, body in prop::collection::vec(any::<u8>(), 0..512),
                                    payload_len in 0usize..32) {
        let mut frame = Vec::new();
        frame.extend_from_slice(&((12 + body.len() + payload_len) as u32).to_be_bytes());
        frame.extend_from_slice(&api.to_be_bytes());
        frame.extend_from_slice(&0u16.to_be_bytes());
        frame.extend_from_slice(&7u32.to_be_bytes());
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(&body);
        frame.resize(frame.len() + payload_len, 0xab);
        exercise(&frame);
        let (h, b, p) = decode_request(&frame).unwrap();
        prop_assert_eq!(h.api_key, api);
        prop_assert_eq!(b, &body[..]);
        prop_assert_eq!(p.len(), payload_len);
    }

    /// Valid frames with random bytes overwritten, truncated or extended
    /// never panic any decoder.
    #[test]
    fn mutated_frames_never_panic((req, payload) in any_request(),
                                  edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
                                  fix_lengths in any::<bool>(),
                                  resize in prop::option::of(-64isize..64)) {
        let mut frame = encode_any(&req, 1, &payload);
        for (i, v) in &edits {
            let i = i.index(frame.len());
            frame[i] = *v;
        }
        if let Some(d) = resize {
            let n = (frame.len() as isize + d).max(0) as usize;
            frame.resize(n, 0x5a);
        }
        if fix_lengths && frame.len() >= FRAME_HEADER_BYTES {
            // Keep the lengths consistent so the mutation reaches the body.
            let frame_len = (frame.len() - 4) as u32;
            frame[..4].copy_from_slice(&frame_len.to_be_bytes());
            let body_len = u32::from_be_bytes(frame[12..16].try_into().unwrap()).min(frame_len - 12);
            frame[12..16].copy_from_slice(&body_len.to_be_bytes());
        }
        exercise(&frame);
    }
}
