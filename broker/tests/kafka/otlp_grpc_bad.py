"""Bad OTLP/gRPC input, sent with grpcio (the OpenTelemetry exporters'
transport): each call must fail with the gRPC code OTLP's retry rules
expect, with a message saying why.

usage: otlp_grpc_bad.py GRPC_ADDR
Prints one JSON line: {"ok": true, "codes": {...}}; exits non-zero if a
call got another answer.
"""

import gzip
import json
import sys

import grpc

addr = sys.argv[1]
TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
channel = grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", -1)])


def call(path, body, compression=None):
    f = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    try:
        f(body, timeout=10, compression=compression)
        return "OK", ""
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""


codes = {}
fails = []


def expect(name, want, got, needle):
    codes[name] = got[0]
    if got[0] != want or needle not in got[1]:
        fails.append(f"{name}: {got}, expected {want} with {needle!r}")


# A truncated field: not protobuf.
expect("malformed", "INVALID_ARGUMENT", call(TRACES, b"\x0a\x05\x01"), "malformed OTLP protobuf")
# A span whose trace id has 5 bytes.
span = b"\x0a\x05" + b"\x01" * 5
scope = b"\x12" + bytes([len(span)]) + span
resource = b"\x12" + bytes([len(scope)]) + scope
expect("bad id", "INVALID_ARGUMENT", call(TRACES, b"\x0a" + bytes([len(resource)]) + resource),
       "Span.trace_id: 5 bytes")
# 64 MiB of zeros, gzip-compressed by grpcio: refused at the limit, for good.
bomb = b"\x00" * (64 << 20)
expect("bomb", "RESOURCE_EXHAUSTED", call(TRACES, bomb, grpc.Compression.Gzip), "decompressed")
# No such method.
expect("unknown method", "UNIMPLEMENTED", call("/opentelemetry.proto.collector.trace.v1.TraceService/Nope", b""),
       "no gRPC method")
# An empty export is a success.
expect("empty", "OK", call(TRACES, b""), "")

print(json.dumps({"ok": not fails, "codes": codes, "fails": fails}))
sys.exit(1 if fails else 0)
