//! Example-based tests of the native protocol: the limits, the malformed
//! frames a server must reject, and the stable numbers of API keys and error
//! codes.

mod proto_common;

use bytes::Bytes;
use weir_proto::api::{supported_apis, ApiKey};
use weir_proto::batch::{self, Compression};
use weir_proto::builder::BatchBuilder;
use weir_proto::error_code::ErrorCode;
use weir_proto::frame::*;
use weir_proto::messages::*;
use weir_proto::record::RecordData;

/// A request frame assembled by hand: `frame_len`, the fixed fields,
/// `body_len`, then `rest`.
fn raw_request(frame_len: u32, api_key: u16, version: u16, body_len: u32, rest: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&frame_len.to_be_bytes());
    f.extend_from_slice(&api_key.to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(&42u32.to_be_bytes());
    f.extend_from_slice(&body_len.to_be_bytes());
    f.extend_from_slice(rest);
    f
}

#[test]
fn constants() {
    assert_eq!(FRAME_HEADER_BYTES, 16);
    assert_eq!(FRAME_LEN_MIN, 12);
    assert_eq!(FRAME_BYTES_MAX_DEFAULT, 100 * 1024 * 1024);
}

#[test]
fn header_layout_is_pinned() {
    let header = RequestHeader::new(ApiKey::Fetch, 0, 0x0102_0304);
    let frame = encode_request_with_payload(&header, &FetchRequest::default(), &[b"xyz"]).unwrap();
    let body_len = frame.len() - 16 - 3;
    assert_eq!(&frame[0..4], &((frame.len() - 4) as u32).to_be_bytes());
    assert_eq!(&frame[4..6], &[0, 8]);
    assert_eq!(&frame[6..8], &[0, 0]);
    assert_eq!(&frame[8..12], &[1, 2, 3, 4]);
    assert_eq!(&frame[12..16], &(body_len as u32).to_be_bytes());
    assert_eq!(&frame[frame.len() - 3..], b"xyz");

    let header = ResponseHeader {
        correlation_id: 0x0a0b_0c0d,
        error: ErrorCode::NotOwner,
    };
    let frame = encode_response(
        &header,
        &ErrorBody {
            message: "x".into(),
        },
        0,
    )
    .unwrap();
    assert_eq!(&frame[0..4], &((frame.len() - 4) as u32).to_be_bytes());
    assert_eq!(&frame[4..8], &[0x0a, 0x0b, 0x0c, 0x0d]);
    assert_eq!(&frame[8..10], &[0, 13]);
    assert_eq!(&frame[10..12], &[0, 0]);
    assert_eq!(&frame[12..16], &((frame.len() - 16) as u32).to_be_bytes());
}

#[test]
fn too_large_is_rejected_from_the_length_alone() {
    let max = FRAME_BYTES_MAX_DEFAULT as u32;
    // Only the 4 length bytes: the rest of the frame is never needed.
    assert_eq!(
        peek_frame_len(&(max + 1).to_be_bytes(), FRAME_BYTES_MAX_DEFAULT),
        Err(FrameError::TooLarge {
            len: FRAME_BYTES_MAX_DEFAULT + 1,
            max: FRAME_BYTES_MAX_DEFAULT
        })
    );
    assert_eq!(
        peek_frame_len(&u32::MAX.to_be_bytes(), FRAME_BYTES_MAX_DEFAULT)
            .unwrap_err()
            .error_code(),
        ErrorCode::FrameTooLarge
    );
    // Exactly the maximum is accepted.
    assert_eq!(
        peek_frame_len(&max.to_be_bytes(), FRAME_BYTES_MAX_DEFAULT),
        Ok(Some(FRAME_BYTES_MAX_DEFAULT + 4))
    );
    // A configured limit applies the same way.
    assert!(matches!(
        peek_frame_len(&[0, 0, 4, 1, 0xff], 1024),
        Err(FrameError::TooLarge {
            len: 1025,
            max: 1024
        })
    ));
    assert!(FrameError::TooLarge { len: 1, max: 0 }.is_fatal());
}

#[test]
fn short_frame_len_is_rejected() {
    for frame_len in 0..12u32 {
        assert_eq!(
            peek_frame_len(&frame_len.to_be_bytes(), FRAME_BYTES_MAX_DEFAULT),
            Err(FrameError::TooShort {
                len: frame_len as usize
            })
        );
        let mut f = frame_len.to_be_bytes().to_vec();
        f.resize(4 + frame_len as usize, 0);
        assert_eq!(
            decode_request(&f),
            Err(FrameError::TooShort {
                len: frame_len as usize
            })
        );
    }
}

#[test]
fn truncated_frames_need_more() {
    let frame = encode_request_with_payload(
        &RequestHeader::of::<DeleteTopicsRequest>(9),
        &DeleteTopicsRequest {
            names: vec!["a".into(), "b".into()],
        },
        &[b"payload"],
    )
    .unwrap();
    for cut in 0..frame.len() {
        let prefix = &frame[..cut];
        let peek = peek_frame_len(prefix, FRAME_BYTES_MAX_DEFAULT).unwrap();
        if cut < 4 {
            assert_eq!(peek, None);
        } else {
            assert_eq!(peek, Some(frame.len()));
        }
        let needed = if cut < 4 { 4 } else { frame.len() };
        assert_eq!(
            decode_request(prefix),
            Err(FrameError::Truncated {
                needed,
                available: cut
            })
        );
        assert_eq!(
            decode_response(prefix),
            Err(FrameError::Truncated {
                needed,
                available: cut
            })
        );
    }
    // One byte too many is not a frame either.
    let mut longer = frame.to_vec();
    longer.push(0);
    assert_eq!(
        decode_request(&longer),
        Err(FrameError::TrailingBytes {
            frame_bytes: frame.len(),
            available: frame.len() + 1
        })
    );
}

#[test]
fn body_len_larger_than_the_frame_is_rejected() {
    // frame_len 20: 8 bytes after the header; body_len 9.
    let f = raw_request(20, 0, 0, 9, &[0; 8]);
    assert_eq!(
        decode_request(&f),
        Err(FrameError::BadBodyLen {
            body_len: 9,
            max: 8
        })
    );
    let f = raw_request(20, 0, 0, u32::MAX, &[0; 8]);
    let e = decode_request(&f).unwrap_err();
    assert!(matches!(e, FrameError::BadBodyLen { .. }));
    assert_eq!(e.error_code(), ErrorCode::InvalidRequest);
    assert!(e.is_fatal());
    // body_len == frame_len - 12: all body, no payload.
    let f = raw_request(20, 0, 0, 8, &[0; 8]);
    let (_, body, payload) = decode_request(&f).unwrap();
    assert_eq!((body.len(), payload.len()), (8, 0));
    // body_len 0: all payload.
    let f = raw_request(20, 0, 0, 0, &[7; 8]);
    let (_, body, payload) = decode_request(&f).unwrap();
    assert_eq!((body.len(), payload), (0, &[7u8; 8][..]));
}

#[test]
fn response_flags_and_unknown_error_numbers() {
    let mut frame = encode_response(&ResponseHeader::ok(5), &ProduceResponse::default(), 0)
        .unwrap()
        .to_vec();
    frame[8..10].copy_from_slice(&999u16.to_be_bytes());
    let (h, _, _) = decode_response(&frame).unwrap();
    assert_eq!(h.error, ErrorCode::Unknown);
    frame[10..12].copy_from_slice(&1u16.to_be_bytes());
    assert_eq!(
        decode_response(&frame),
        Err(FrameError::UnknownFlags { flags: 1 })
    );
}

#[test]
fn unsupported_api_and_version() {
    let body = encode_request(
        &RequestHeader::of::<ApiVersionsRequest>(1),
        &ApiVersionsRequest {},
        0,
    )
    .unwrap();
    let (_, b, _) = decode_request(&body).unwrap();

    let unknown = RequestHeader {
        api_key: 999,
        api_version: 0,
        correlation_id: 1,
    };
    let e = AnyRequest::decode(&unknown, b).unwrap_err();
    assert_eq!(e, FrameError::UnsupportedApi { api_key: 999 });
    assert_eq!(e.error_code(), ErrorCode::UnsupportedApi);
    assert!(!e.is_fatal());

    let too_new = RequestHeader::new(ApiKey::ApiVersions, 1, 1);
    let e = AnyRequest::decode(&too_new, b).unwrap_err();
    assert_eq!(
        e,
        FrameError::UnsupportedVersion {
            api_key: 0,
            version: 1
        }
    );
    assert_eq!(e.error_code(), ErrorCode::UnsupportedVersion);
    assert!(!e.is_fatal());

    assert_eq!(
        AnyRequest::decode(&RequestHeader::new(ApiKey::ApiVersions, 0, 1), b),
        Ok(AnyRequest::ApiVersions(ApiVersionsRequest {}))
    );
}

#[test]
fn api_versions_lists_every_api_at_its_versions() {
    let resp = ApiVersionsResponse::supported();
    assert_eq!(resp.apis, supported_apis());
    assert_eq!(resp.apis.len(), ApiKey::ALL.len());
    for (k, r) in ApiKey::ALL.iter().zip(&resp.apis) {
        assert_eq!(
            *r,
            ApiVersionRange {
                api_key: k.as_u16(),
                min: k.min_version(),
                max: k.max_version()
            }
        );
    }
}

#[test]
fn hostile_bodies_are_errors() {
    // Garbage, empty, and a valid body of another type.
    let meta = encode_request(
        &RequestHeader::of::<MetadataRequest>(1),
        &MetadataRequest {
            topics: Some(vec!["orders".into()]),
        },
        0,
    )
    .unwrap();
    let (_, meta_body, _) = decode_request(&meta).unwrap();
    for body in [&[][..], &[1, 2, 3][..], &[0xff; 64][..], meta_body] {
        let e = decode_body::<FetchResponse>(body).unwrap_err();
        assert!(matches!(e, FrameError::Body(_)), "{e:?}");
        assert_eq!(e.error_code(), ErrorCode::InvalidRequest);
        assert!(!e.is_fatal());
        proto_common::exercise(body);
    }
    // A length pointing far past the body: an error, not a huge allocation.
    let mut b = meta_body.to_vec();
    let n = b.len();
    b[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = decode_body::<MetadataRequest>(&b);
    assert!(e.is_err(), "{e:?}");
    // Error text never carries memory addresses.
    for i in 0..b.len() {
        let mut m = meta_body.to_vec();
        m[i] ^= 0x80;
        if let Err(FrameError::Body(msg)) = decode_body::<MetadataRequest>(&m) {
            assert!(!msg.contains("0x0"), "{msg}");
            assert!(!msg.contains("0x7"), "{msg}");
        }
    }
}

#[test]
fn empty_body_types() {
    // A zero-sized body encodes to zero bytes.
    let f = encode_request(
        &RequestHeader::of::<ApiVersionsRequest>(3),
        &ApiVersionsRequest {},
        0,
    )
    .unwrap();
    assert_eq!(f.len(), FRAME_HEADER_BYTES);
    assert_eq!(
        decode_body::<ApiVersionsRequest>(&[]),
        Ok(ApiVersionsRequest {})
    );
}

#[test]
fn encode_rejects_frames_over_u32() {
    let h = RequestHeader::of::<ProduceRequest>(1);
    let e = encode_request(&h, &ProduceRequest::default(), u32::MAX as usize).unwrap_err();
    assert!(matches!(e, FrameError::TooLarge { .. }), "{e:?}");
    let e = encode_response(
        &ResponseHeader::ok(1),
        &FetchResponse::default(),
        usize::MAX,
    )
    .unwrap_err();
    assert!(matches!(e, FrameError::TooLarge { .. }), "{e:?}");
}

#[test]
fn payload_ranges() {
    let p = b"0123456789";
    assert_eq!(payload_slice(p, 2, 3), Ok(&b"234"[..]));
    assert_eq!(payload_slice(p, 10, 0), Ok(&b""[..]));
    let e = payload_slice(p, 8, 3).unwrap_err();
    assert_eq!(
        e,
        FrameError::BadPayloadRange {
            offset: 8,
            len: 3,
            payload_len: 10
        }
    );
    assert_eq!(e.error_code(), ErrorCode::InvalidRequest);
    assert!(payload_slice(p, u32::MAX, 1).is_err());
    assert!(payload_slice(p, 11, 0).is_err());
}

/// A produce request carrying real record batches sent as a vectored
/// write (header+body, then each batch's `Bytes` untouched); the server
/// side finds and validates each partition's batches.
#[test]
fn produce_with_real_batches_and_vectored_payload() {
    let mut batches: Vec<Bytes> = Vec::new();
    for (i, codec) in [Compression::None, Compression::Lz4, Compression::Zstd]
        .into_iter()
        .enumerate()
    {
        let mut b = BatchBuilder::new(codec).unwrap();
        for j in 0..=i {
            b.push(&RecordData {
                key: Some(Bytes::from(format!("k{j}"))),
                value: Some(Bytes::from(vec![j as u8; 100])),
                headers: vec![],
                timestamp: 1_700_000_000_000 + j as i64,
            })
            .unwrap();
        }
        batches.push(b.build().unwrap().freeze());
    }
    let mut partitions = Vec::new();
    let mut offset = 0u32;
    for (i, b) in batches.iter().enumerate() {
        partitions.push(ProducePartition {
            topic: "orders".into(),
            partition: i as u32,
            payload_offset: offset,
            payload_len: b.len() as u32,
        });
        offset += b.len() as u32;
    }
    let req = ProduceRequest {
        acks: -1,
        timeout_ms: 30_000,
        partitions,
        transactional_id: None,
    };
    let header = RequestHeader::of::<ProduceRequest>(77);
    let head = encode_request(&header, &req, offset as usize)
        .unwrap()
        .freeze();
    // What a vectored write puts on the wire.
    let wire: Vec<u8> = std::iter::once(&head)
        .chain(batches.iter())
        .flat_map(|b| b.iter().copied())
        .collect();
    let slices: Vec<&[u8]> = batches.iter().map(|b| &b[..]).collect();
    assert_eq!(
        wire,
        encode_request_with_payload(&header, &req, &slices).unwrap()
    );

    let total = peek_frame_len(&wire, FRAME_BYTES_MAX_DEFAULT)
        .unwrap()
        .unwrap();
    assert_eq!(total, wire.len());
    let (h, body, payload) = decode_request(&wire[..total]).unwrap();
    assert_eq!(h.api(), Some(ApiKey::Produce));
    let AnyRequest::Produce(got) = AnyRequest::decode(&h, body).unwrap() else {
        panic!("not a produce request");
    };
    assert_eq!(got, req);
    for (p, want) in got.partitions.iter().zip(&batches) {
        let bytes = payload_slice(payload, p.payload_offset, p.payload_len).unwrap();
        assert_eq!(bytes, &want[..]);
        batch::validate(bytes).unwrap();
    }
}

#[test]
fn error_codes_are_pinned() {
    let table: &[(&str, u16)] = &[
        ("None", 0),
        ("Unknown", 1),
        ("CorruptMessage", 2),
        ("UnknownTopicOrPartition", 3),
        ("OffsetOutOfRange", 4),
        ("MessageTooLarge", 5),
        ("InvalidRequest", 6),
        ("UnsupportedVersion", 7),
        ("UnsupportedApi", 8),
        ("FrameTooLarge", 9),
        ("TopicAlreadyExists", 10),
        ("InvalidConfig", 11),
        ("InvalidPartitions", 12),
        ("NotOwner", 13),
        ("RequestTimedOut", 14),
        ("StorageError", 15),
        ("NotEnoughReplicas", 16),
        ("PolicyViolation", 17),
        ("InvalidTopic", 18),
        ("Recovering", 19),
        ("OutOfOrderSequence", 20),
        ("InvalidProducerEpoch", 21),
        ("UnknownProducerId", 22),
        ("InvalidRecord", 23),
        ("UnknownMemberId", 30),
        ("IllegalGeneration", 31),
        ("GroupNotEmpty", 32),
        ("GroupIdNotFound", 33),
        ("InvalidGroupId", 34),
        ("InconsistentAssignor", 35),
        ("InvalidSessionTimeout", 36),
        ("FencedMemberEpoch", 37),
        ("StaleMemberEpoch", 38),
        ("RebalanceInProgress", 39),
        ("FencedInstanceId", 40),
        ("NotLeader", 41),
        ("NotCoordinator", 42),
        ("InvalidReplicationFactor", 43),
        ("InvalidReplicaAssignment", 44),
        ("ResourceNotFound", 45),
        ("DuplicateResource", 46),
        ("UnacceptableCredential", 47),
        ("UnsupportedSaslMechanism", 48),
        ("TopicAuthorizationFailed", 49),
        ("GroupAuthorizationFailed", 50),
        ("ClusterAuthorizationFailed", 51),
        ("SecurityDisabled", 52),
        ("SaslAuthenticationFailed", 53),
        ("InvalidTxnState", 54),
        ("TransactionalIdNotFound", 55),
        ("ConcurrentTransactions", 56),
        ("ShareSessionNotFound", 57),
        ("InvalidShareSessionEpoch", 58),
        ("ShareSessionLimitReached", 59),
        ("InvalidRecordState", 60),
        ("GroupMaxSizeReached", 61),
        ("InconsistentGroupProtocol", 62),
        ("RemoteStorageError", 63),
    ];
    assert_eq!(table.len(), ErrorCode::ALL.len());
    for (&(name, n), code) in table.iter().zip(ErrorCode::ALL) {
        assert_eq!(code.name(), name);
        assert_eq!(code.as_u16(), n, "{name}");
        assert_eq!(u16::from(code), n);
        assert_eq!(ErrorCode::from_u16(n), code);
        assert!(!code.to_string().is_empty());
    }
    // Spot checks by variant, independent of ALL's order.
    assert_eq!(ErrorCode::None as u16, 0);
    assert_eq!(ErrorCode::CorruptMessage as u16, 2);
    assert_eq!(ErrorCode::FrameTooLarge as u16, 9);
    assert_eq!(ErrorCode::NotOwner as u16, 13);
    assert_eq!(ErrorCode::Recovering as u16, 19);
}

#[test]
fn unknown_error_numbers_map_to_unknown() {
    for n in (24..=29).chain(64..=u16::MAX) {
        assert_eq!(ErrorCode::from_u16(n), ErrorCode::Unknown, "{n}");
    }
    assert_eq!(ErrorCode::from(1u16), ErrorCode::Unknown);
}

#[test]
fn retriable_codes() {
    let retriable: Vec<ErrorCode> = ErrorCode::ALL
        .into_iter()
        .filter(|c| c.is_retriable())
        .collect();
    assert_eq!(
        retriable,
        [
            ErrorCode::NotOwner,
            ErrorCode::RequestTimedOut,
            ErrorCode::NotEnoughReplicas,
            ErrorCode::Recovering,
            ErrorCode::NotLeader,
            ErrorCode::NotCoordinator,
            ErrorCode::ConcurrentTransactions,
            ErrorCode::ShareSessionLimitReached,
            ErrorCode::RemoteStorageError
        ]
    );
    assert_eq!(
        ErrorCode::UnknownTopicOrPartition.to_string(),
        "unknown topic or partition"
    );
}

#[test]
fn api_keys_are_pinned() {
    let table: &[(&str, u16)] = &[
        ("ApiVersions", 0),
        ("Metadata", 1),
        ("CreateTopics", 2),
        ("DeleteTopics", 3),
        ("DescribeConfigs", 4),
        ("AlterConfigs", 5),
        ("CreatePartitions", 6),
        ("Produce", 7),
        ("Fetch", 8),
        ("ListOffsets", 9),
        ("InitProducerId", 10),
        ("Compact", 11),
        ("JoinGroup", 12),
        ("Heartbeat", 13),
        ("LeaveGroup", 14),
        ("OffsetCommit", 15),
        ("OffsetFetch", 16),
        ("ListGroups", 17),
        ("DescribeGroup", 18),
        ("DeleteGroup", 19),
        ("DescribeCluster", 20),
        ("ChangeVoters", 21),
        ("FindCoordinator", 22),
        ("ReassignPartitions", 23),
        ("DescribeUsers", 24),
        ("AlterUsers", 25),
        ("DescribeAcls", 26),
        ("CreateAcls", 27),
        ("DeleteAcls", 28),
        ("SaslHandshake", 29),
        ("SaslAuthenticate", 30),
        ("DescribeClientQuotas", 31),
        ("AlterClientQuotas", 32),
        ("ListTransactions", 33),
        ("AbortTransaction", 34),
        ("DescribeProducers", 35),
        ("AddPartitionsToTxn", 36),
        ("AddOffsetsToTxn", 37),
        ("EndTxn", 38),
        ("TxnOffsetCommit", 39),
        ("ShareGroupHeartbeat", 40),
        ("ShareFetch", 41),
        ("ShareAcknowledge", 42),
        ("AlterShareOffsets", 43),
    ];
    assert_eq!(table.len(), ApiKey::ALL.len());
    for (&(name, n), key) in table.iter().zip(ApiKey::ALL) {
        assert_eq!(key.name(), name);
        assert_eq!(key.as_u16(), n);
        assert_eq!(ApiKey::from_u16(n), Some(key));
        // DescribeGroup's body changed shape (members with epochs),
        // CreateTopics' (replication factor), ListOffsets' (read_committed),
        // FindCoordinator's, InitProducerId's and
        // Produce's (transactional ids): v1 only; DescribeConfigs' three
        // times (leader, replicas, ISR; a move's target; the local log
        // start and the remote tier): v3 only; ShareFetch's twice (the
        // acquire mode; acknowledgements answered later): v2; Fetch's twice (read_committed; CONTINUE and the offset
        // read from): v2; everything else is at v0.
        let v = match key {
            ApiKey::DescribeGroup
            | ApiKey::CreateTopics
            | ApiKey::ListOffsets
            | ApiKey::FindCoordinator
            | ApiKey::InitProducerId
            | ApiKey::Produce => 1,
            ApiKey::DescribeConfigs => 3,
            // The acquire mode (KIP-1206); acks_later.
            ApiKey::ShareFetch => 2,
            ApiKey::Fetch => 2,
            _ => 0,
        };
        assert!(key.supports(v));
        assert!(!key.supports(v + 1));
        assert_eq!(key.supports(0), v == 0);
    }
    for n in 44..=u16::MAX {
        assert_eq!(ApiKey::from_u16(n), None);
    }
    assert_eq!(<ProduceRequest as Request>::API_KEY, ApiKey::Produce);
    assert_eq!(
        <ListOffsetsRequest as Request>::API_KEY,
        ApiKey::ListOffsets
    );
}
