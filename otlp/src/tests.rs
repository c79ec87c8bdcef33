//! The crate's behaviour on built OTLP requests: checks, both encodings,
//! the cut into records, decompression limits, the answers.

use std::io::Write;

use crate::codec::{check, from_json, to_json};
use crate::records::count_items;
use crate::wire::{put_len, put_nested, put_tag, put_varint_field, Reader, Value, FIXED64};
use crate::*;

fn by(v: &[u8]) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(v)
}

fn kv(out: &mut Vec<u8>, field: u32, key: &str, value: &str) {
    put_nested(out, field, |k| {
        put_len(k, 1, key.as_bytes());
        put_nested(k, 2, |v| put_len(v, 1, value.as_bytes()));
    });
}

fn span(trace: [u8; 16], id: u8, name: &str) -> Vec<u8> {
    let mut s = Vec::new();
    put_len(&mut s, 1, &trace);
    put_len(&mut s, 2, &[id; 8]);
    put_len(&mut s, 5, name.as_bytes());
    put_varint_field(&mut s, 6, 2);
    put_tag(&mut s, 7, FIXED64);
    s.extend_from_slice(&1_700_000_000_000_000_000u64.to_le_bytes());
    kv(&mut s, 9, "http.route", "/a");
    s
}

/// One resource: its attributes, its scopes' spans.
type ResourceShape<'a> = (&'a [(&'a str, &'a str)], &'a [&'a [Vec<u8>]]);

/// A traces request: resources of (attributes, scopes of spans).
fn traces(resources: &[ResourceShape<'_>]) -> Vec<u8> {
    let mut req = Vec::new();
    for (attrs, scopes) in resources {
        put_nested(&mut req, 1, |rs| {
            put_nested(rs, 1, |res| {
                for (k, v) in attrs.iter() {
                    kv(res, 1, k, v);
                }
            });
            for (i, spans) in scopes.iter().enumerate() {
                put_nested(rs, 2, |ss| {
                    put_nested(ss, 1, |scope| {
                        put_len(scope, 1, format!("scope{i}").as_bytes())
                    });
                    for s in spans.iter() {
                        put_len(ss, 2, s);
                    }
                });
            }
            put_len(rs, 3, b"https://opentelemetry.io/schemas/1.26.0");
        });
    }
    req
}

const T1: [u8; 16] = [1; 16];
const T2: [u8; 16] = [2; 16];

#[test]
fn a_valid_export_passes_the_check_and_bad_ones_say_why() {
    let req = traces(&[(&[("service.name", "a")], &[&[span(T1, 1, "x")]])]);
    check(Signal::Traces.request(), &req).unwrap();

    // A 5-byte trace id.
    let mut bad_span = Vec::new();
    put_len(&mut bad_span, 1, &[1; 5]);
    let bad = traces(&[(&[], &[&[bad_span]])]);
    let e = check(Signal::Traces.request(), &bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Span.trace_id: 5 bytes, an id has 16"), "{e}");

    // A name that is not UTF-8.
    let mut bad_span = span(T1, 1, "x");
    put_len(&mut bad_span, 5, &[0xff, 0xfe]);
    let bad = traces(&[(&[], &[&[bad_span]])]);
    let e = check(Signal::Traces.request(), &bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Span.name: not valid UTF-8"), "{e}");

    // A varint where a message belongs.
    let mut bad = Vec::new();
    put_varint_field(&mut bad, 1, 5);
    let e = check(Signal::Traces.request(), &bad)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ExportTraceServiceRequest.resource_spans: wire type 0"),
        "{e}"
    );

    // Truncated.
    let e = check(Signal::Traces.request(), &req[..req.len() - 3]).unwrap_err();
    assert!(matches!(e, Error::Malformed(_)));

    // Unknown fields are kept and pass.
    let mut with_unknown = req.clone();
    put_varint_field(&mut with_unknown, 99, 1);
    check(Signal::Traces.request(), &with_unknown).unwrap();
}

#[test]
fn attribute_values_nested_past_the_limit_are_refused() {
    let mut v = Vec::new();
    put_len(&mut v, 1, b"leaf");
    for _ in 0..100 {
        let mut outer = Vec::new();
        put_nested(&mut outer, 5, |a| put_len(a, 1, &v));
        v = outer;
    }
    let mut log = Vec::new();
    put_len(&mut log, 5, &v);
    let mut req = Vec::new();
    put_nested(&mut req, 1, |rl| {
        put_nested(rl, 2, |sl| put_len(sl, 2, &log))
    });
    let e = check(Signal::Logs.request(), &req).unwrap_err().to_string();
    assert!(e.contains("nested deeper than"), "{e}");
}

#[test]
fn otlp_json_is_written_as_the_specification_says() {
    let req = traces(&[(&[("service.name", "svc")], &[&[span(T1, 0xab, "GET /")]])]);
    let json = to_json(Signal::Traces.request(), &req).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let s = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
    assert_eq!(s["traceId"], "01010101010101010101010101010101");
    assert_eq!(s["spanId"], "abababababababab");
    assert_eq!(s["kind"], 2);
    assert_eq!(s["startTimeUnixNano"], "1700000000000000000");
    assert_eq!(s["attributes"][0]["value"]["stringValue"], "/a");
    assert_eq!(
        v["resourceSpans"][0]["resource"]["attributes"][0]["key"],
        "service.name"
    );
    assert_eq!(
        v["resourceSpans"][0]["schemaUrl"],
        "https://opentelemetry.io/schemas/1.26.0"
    );
}

#[test]
fn otlp_json_reads_back_to_the_same_protobuf_meaning() {
    let req = traces(&[
        (
            &[("service.name", "a"), ("k", "v")],
            &[&[span(T1, 1, "x"), span(T2, 2, "y")]],
        ),
        (&[], &[&[span(T1, 3, "z")], &[]]),
    ]);
    let json = to_json(Signal::Traces.request(), &req).unwrap();
    let back = from_json(Signal::Traces.request(), json.as_bytes()).unwrap();
    check(Signal::Traces.request(), &back).unwrap();
    assert_eq!(to_json(Signal::Traces.request(), &back).unwrap(), json);
}

#[test]
fn otlp_json_input_takes_every_form_a_sender_may_use() {
    let text = r#"{
      "resource_logs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "py"}}]},
        "scopeLogs": [{
          "scope": {"name": "s", "unknownField": [1, 2]},
          "logRecords": [
            {"timeUnixNano": 1700000000000000000, "severityNumber": "SEVERITY_NUMBER_WARN",
             "body": {"stringValue": "hi"}, "traceId": "0102030405060708090A0B0C0D0E0F10",
             "spanId": "", "flags": 1, "attributes": null},
            {"time_unix_nano": "17", "severityNumber": 9, "body": {}}
          ]
        }]
      }]
    }"#;
    let proto = from_json(Signal::Logs.request(), text.as_bytes()).unwrap();
    check(Signal::Logs.request(), &proto).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&to_json(Signal::Logs.request(), &proto).unwrap()).unwrap();
    let logs = &json["resourceLogs"][0]["scopeLogs"][0]["logRecords"];
    assert_eq!(logs[0]["timeUnixNano"], "1700000000000000000");
    assert_eq!(logs[0]["severityNumber"], 13);
    assert_eq!(logs[0]["traceId"], "0102030405060708090a0b0c0d0e0f10");
    assert!(logs[0].get("spanId").is_none());
    assert_eq!(logs[1]["timeUnixNano"], "17");
    assert_eq!(logs[1]["body"], serde_json::json!({}));
    assert_eq!(count_items(Signal::Logs, &children1(&proto)[0]).unwrap(), 2);
}

#[test]
fn bad_otlp_json_is_refused_with_the_field_named() {
    for (text, want) in [
        (
            r#"{"resourceSpans": 5}"#,
            "resource_spans: expected an array",
        ),
        (
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"abc"}]}]}]}"#,
            "Span.trace_id: expected 32 hex digits",
        ),
        (
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"kind":"SPAN_KIND_BOGUS"}]}]}]}"#,
            "Span.kind: expected an enum number or name",
        ),
        (
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"droppedAttributesCount":-1}]}]}]}"#,
            "Span.dropped_attributes_count",
        ),
        (r#"[1]"#, "expected an object"),
        (r#"{"resourceSpans": [ "#, "not JSON"),
    ] {
        let e = from_json(Signal::Traces.request(), text.as_bytes()).unwrap_err();
        assert!(matches!(e, Error::Json(_)), "{e}");
        assert!(e.to_string().contains(want), "{text}: {e}");
    }
}

#[test]
fn metric_points_of_every_kind_survive_both_encodings() {
    let text = r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[
      {"name":"g","gauge":{"dataPoints":[{"asDouble":1.5,"timeUnixNano":"5"},{"asInt":"-7"}]}},
      {"name":"s","sum":{"dataPoints":[{"asInt":3}],"aggregationTemporality":2,"isMonotonic":true}},
      {"name":"h","histogram":{"dataPoints":[{"count":"3","sum":6.5,"bucketCounts":["1","2"],"explicitBounds":[1.0],"min":0.5,"max":"Infinity"}],"aggregationTemporality":1}},
      {"name":"e","exponentialHistogram":{"dataPoints":[{"scale":-3,"positive":{"offset":-2,"bucketCounts":["4","5"]},"zeroCount":"1"}]}},
      {"name":"q","summary":{"dataPoints":[{"count":"2","quantileValues":[{"quantile":0.5,"value":"NaN"}]}]}}
    ]}]}]}"#;
    let proto = from_json(Signal::Metrics.request(), text.as_bytes()).unwrap();
    check(Signal::Metrics.request(), &proto).unwrap();
    let json = to_json(Signal::Metrics.request(), &proto).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let m = &v["resourceMetrics"][0]["scopeMetrics"][0]["metrics"];
    assert_eq!(m[0]["gauge"]["dataPoints"][0]["asDouble"], 1.5);
    assert_eq!(m[0]["gauge"]["dataPoints"][1]["asInt"], "-7");
    assert_eq!(
        m[2]["histogram"]["dataPoints"][0]["bucketCounts"],
        serde_json::json!(["1", "2"])
    );
    assert_eq!(m[2]["histogram"]["dataPoints"][0]["max"], "Infinity");
    assert_eq!(m[3]["exponentialHistogram"]["dataPoints"][0]["scale"], -3);
    assert_eq!(
        m[3]["exponentialHistogram"]["dataPoints"][0]["positive"]["offset"],
        -2
    );
    assert_eq!(
        m[4]["summary"]["dataPoints"][0]["quantileValues"][0]["value"],
        "NaN"
    );
    assert_eq!(
        count_items(Signal::Metrics, &children1(&proto)[0]).unwrap(),
        6
    );
    assert_eq!(
        from_json(Signal::Metrics.request(), json.as_bytes())
            .map(|p| to_json(Signal::Metrics.request(), &p).unwrap())
            .unwrap(),
        json
    );
}

fn children1(req: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut r = Reader::new(req);
    while let Some(f) = r.next_field().unwrap() {
        if let (1, Value::Len(b)) = (f.number, f.value) {
            out.push(b.to_vec());
        }
    }
    out
}

#[test]
fn without_partitioning_an_export_is_one_record_as_sent() {
    let req = traces(&[
        (
            &[("service.name", "a")],
            &[&[span(T1, 1, "x"), span(T2, 2, "y")]],
        ),
        (&[("service.name", "b")], &[&[span(T1, 3, "z")]]),
    ]);
    let recs = cut(Signal::Traces, &by(&req), &Cut::default()).unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].value, req);
    assert_eq!(
        (recs[0].key.clone(), recs[0].items, recs[0].topic.clone()),
        (None, 3, None)
    );
    assert!(cut(Signal::Traces, &by(&[]), &Cut::default())
        .unwrap()
        .is_empty());
}

#[test]
fn by_trace_id_each_record_holds_one_trace_of_one_scope_keyed_in_hex() {
    let req = traces(&[
        (
            &[("service.name", "a")],
            &[
                &[span(T1, 1, "x"), span(T2, 2, "y"), span(T1, 3, "z")],
                &[span(T1, 4, "w")],
            ],
        ),
        (&[("service.name", "b")], &[&[span(T2, 5, "v")]]),
    ]);
    let how = Cut {
        partitioning: Partitioning::TraceId,
        ..Cut::default()
    };
    let recs = cut(Signal::Traces, &by(&req), &how).unwrap();
    let t1 = b"01010101010101010101010101010101".to_vec();
    let t2 = b"02020202020202020202020202020202".to_vec();
    let keys: Vec<_> = recs
        .iter()
        .map(|r| (r.key.clone().unwrap(), r.items))
        .collect();
    assert_eq!(
        keys,
        vec![(t1.clone(), 2), (t2.clone(), 1), (t1, 1), (t2, 1)]
    );
    for r in &recs {
        check(Signal::Traces.request(), &r.value).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&to_json(Signal::Traces.request(), &r.value).unwrap()).unwrap();
        let rs = &v["resourceSpans"][0];
        assert!(rs["resource"]["attributes"][0]["key"] == "service.name");
        assert_eq!(rs["schemaUrl"], "https://opentelemetry.io/schemas/1.26.0");
        assert!(rs["scopeSpans"][0]["scope"]["name"]
            .as_str()
            .unwrap()
            .starts_with("scope"));
        let key = String::from_utf8(r.key.clone().unwrap()).unwrap();
        for s in rs["scopeSpans"][0]["spans"].as_array().unwrap() {
            assert_eq!(s["traceId"], key.as_str());
        }
    }
    // Span order within a trace is kept: x then z.
    let first: serde_json::Value =
        serde_json::from_str(&to_json(Signal::Traces.request(), &recs[0].value).unwrap()).unwrap();
    let names: Vec<_> = first["resourceSpans"][0]["scopeSpans"][0]["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["x", "z"]);
}

#[test]
fn by_resource_attributes_the_key_ignores_attribute_order() {
    let a = traces(&[(
        &[("service.name", "a"), ("host", "h")],
        &[&[span(T1, 1, "x")]],
    )]);
    let b = traces(&[(
        &[("host", "h"), ("service.name", "a")],
        &[&[span(T2, 2, "y")]],
    )]);
    let c = traces(&[(
        &[("host", "h"), ("service.name", "b")],
        &[&[span(T2, 2, "y")]],
    )]);
    let how = Cut {
        partitioning: Partitioning::ResourceAttributes,
        ..Cut::default()
    };
    let key = |r: &[u8]| {
        cut(Signal::Traces, &by(r), &how).unwrap()[0]
            .key
            .clone()
            .unwrap()
    };
    assert_eq!(key(&a).len(), 16);
    assert_eq!(key(&a), key(&b));
    assert_ne!(key(&a), key(&c));
    let empty = traces(&[(&[], &[&[span(T1, 1, "x")]])]);
    assert_eq!(key(&empty), vec![0; 16]);
}

#[test]
fn a_resource_attribute_routes_its_records_to_a_topic() {
    let req = traces(&[
        (&[("kafka.topic", "spans_a")], &[&[span(T1, 1, "x")]]),
        (&[("service.name", "b")], &[&[span(T1, 2, "y")]]),
        (&[("kafka.topic", "spans_a")], &[&[span(T2, 3, "z")]]),
    ]);
    let how = Cut {
        topic_from_attribute: Some("kafka.topic".into()),
        ..Cut::default()
    };
    let recs = cut(Signal::Traces, &by(&req), &how).unwrap();
    let topics: Vec<_> = recs.iter().map(|r| r.topic.clone()).collect();
    assert_eq!(
        topics,
        [
            Some("spans_a".to_string()),
            None,
            Some("spans_a".to_string())
        ]
    );
    assert!(recs.iter().all(|r| r.key.is_none() && r.items == 1));
}

#[test]
fn logs_by_trace_id_leave_records_without_a_trace_unkeyed() {
    let text = r#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[
        {"traceId":"0102030405060708090a0b0c0d0e0f10","body":{"stringValue":"a"}},
        {"body":{"stringValue":"b"}}]}]}]}"#;
    let proto = from_json(Signal::Logs.request(), text.as_bytes()).unwrap();
    let how = Cut {
        partitioning: Partitioning::TraceId,
        encoding: Encoding::Json,
        ..Cut::default()
    };
    let recs = cut(Signal::Logs, &by(&proto), &how).unwrap();
    assert_eq!(recs.len(), 2);
    assert_eq!(
        recs[0].key.as_deref(),
        Some(&b"0102030405060708090a0b0c0d0e0f10"[..])
    );
    assert_eq!(recs[1].key, None);
    let v: serde_json::Value = serde_json::from_slice(&recs[1].value).unwrap();
    assert_eq!(
        v["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["body"]["stringValue"],
        "b"
    );
}

#[test]
fn a_gzip_bomb_stops_at_the_limit() {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![0u8; 64 << 20]).unwrap();
    let bomb = gz.finish().unwrap();
    assert!(bomb.len() < 1 << 20);
    let e = decompress("gzip", by(&bomb), 4 << 20).unwrap_err();
    assert!(matches!(e, Error::TooLarge(_)), "{e}");
    assert_eq!(
        decompress("gzip", by(&bomb), 64 << 20).unwrap().len(),
        64 << 20
    );
    let z = zstd::encode_all(&b"hello"[..], 1).unwrap();
    assert_eq!(&decompress("zstd", by(&z), 10).unwrap()[..], b"hello");
    assert!(matches!(
        decompress("zstd", by(&z), 4),
        Err(Error::TooLarge(_))
    ));
    assert!(matches!(
        decompress("br", by(b"x"), 10),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        decompress("gzip", by(b"not gzip"), 10),
        Err(Error::Malformed(_))
    ));
    assert!(matches!(
        decompress("identity", by(b"12345"), 4),
        Err(Error::TooLarge(_))
    ));
}

#[test]
fn answers_are_empty_on_success_and_name_what_was_rejected() {
    assert!(export_response(Signal::Traces, Content::Protobuf, 0, "").is_empty());
    assert_eq!(export_response(Signal::Traces, Content::Json, 0, ""), b"{}");
    let p = export_response(Signal::Logs, Content::Protobuf, 3, "too big");
    let Value::Len(inner) = Reader::new(&p).next_field().unwrap().unwrap().value else {
        panic!()
    };
    let mut r = Reader::new(inner);
    assert_eq!(r.next_field().unwrap().unwrap().value, Value::Varint(3));
    assert_eq!(
        r.next_field().unwrap().unwrap().value,
        Value::Len(b"too big")
    );
    let j: serde_json::Value =
        serde_json::from_slice(&export_response(Signal::Metrics, Content::Json, 2, "x")).unwrap();
    assert_eq!(j["partialSuccess"]["rejectedDataPoints"], "2");
    assert_eq!(
        Content::from_content_type("application/x-protobuf; charset=x").unwrap(),
        Content::Protobuf
    );
    assert!(matches!(
        Content::from_content_type("text/plain"),
        Err(Error::Unsupported(_))
    ));
    assert_eq!(Signal::from_http_path("/v1/logs"), Some(Signal::Logs));
    assert_eq!(Signal::from_http_path("/v1/logsx"), None);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn any_span() -> impl Strategy<Value = Vec<u8>> {
        (any::<[u8; 16]>(), any::<u8>(), "[a-z]{0,8}").prop_map(|(t, id, n)| span(t, id, &n))
    }

    proptest! {
        #[test]
        fn cut_keeps_every_span_once_and_json_round_trips(
            shape in proptest::collection::vec(
                proptest::collection::vec(proptest::collection::vec(any_span(), 0..4), 0..3), 0..3),
            by_trace in any::<bool>(),
        ) {
            let scopes: Vec<Vec<&[Vec<u8>]>> = shape
                .iter()
                .map(|r| r.iter().map(|s| s.as_slice()).collect())
                .collect();
            let resources: Vec<ResourceShape<'_>> =
                scopes.iter().map(|s| (&[("service.name", "p")][..], s.as_slice())).collect();
            let req = traces(&resources);
            check(Signal::Traces.request(), &req).unwrap();
            let total: usize = shape.iter().flatten().map(|s| s.len()).sum();
            let how = Cut {
                partitioning: if by_trace { Partitioning::TraceId } else { Partitioning::None },
                ..Cut::default()
            };
            let recs = cut(Signal::Traces, &by(&req), &how).unwrap();
            prop_assert_eq!(recs.iter().map(|r| r.items as usize).sum::<usize>(), total);
            let json = to_json(Signal::Traces.request(), &req).unwrap();
            let back = from_json(Signal::Traces.request(), json.as_bytes()).unwrap();
            prop_assert_eq!(to_json(Signal::Traces.request(), &back).unwrap(), json);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            for s in Signal::ALL {
                if check(s.request(), &bytes).is_ok() {
                    let _ = cut(s, &by(&bytes), &Cut { partitioning: Partitioning::TraceId, ..Cut::default() });
                    let _ = cut(s, &by(&bytes), &Cut { partitioning: Partitioning::ResourceAttributes, ..Cut::default() });
                    let _ = to_json(s.request(), &bytes);
                }
                let _ = from_json(s.request(), &bytes);
            }
        }
    }
}

#[test]
fn grpc_timeouts_parse_as_the_protocol_writes_them() {
    use crate::grpc::parse_timeout;
    use std::time::Duration;
    assert_eq!(parse_timeout("10S"), Some(Duration::from_secs(10)));
    assert_eq!(parse_timeout("9999m"), Some(Duration::from_millis(9999)));
    assert_eq!(parse_timeout("2H"), Some(Duration::from_secs(7200)));
    assert_eq!(parse_timeout("1M"), Some(Duration::from_secs(60)));
    assert_eq!(parse_timeout("500u"), Some(Duration::from_micros(500)));
    assert_eq!(
        parse_timeout("99999999n"),
        Some(Duration::from_nanos(99_999_999))
    );
    for bad in [
        "",
        "S",
        "10",
        "123456789S",
        "10s",
        "-1S",
        "1.5S",
        "１S",
        "1é",
    ] {
        assert_eq!(parse_timeout(bad), None, "{bad:?}");
    }
}
