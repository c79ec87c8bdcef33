"""The unchanged OpenTelemetry Python SDK's span exporters (gRPC and HTTP)
export while the test SIGKILLs and restarts the broker behind them.

usage: otlp_sigkill.py GRPC_ADDR HTTP_ADDR EXPORTS SPANS_PER_EXPORT

Two threads, one per exporter, each calling the exporter's `export` EXPORTS
times with SPANS_PER_EXPORT spans numbered so that every span id is unique
(the gRPC exporter's from 1, the HTTP exporter's from 1 000 001; the trace
id equals the span id). The exporters retry as they ship: a refused
connection, UNAVAILABLE or 503 is sent again with backoff, within a 60 s
timeout per export. After each export one JSON line:
{"first": FIRST_SPAN_ID, "n": N, "ok": true|false} (ok: the exporter
returned SUCCESS: the export was answered success). Exits when both are done.
"""

import json
import logging
import sys
import threading

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

grpc_addr, http_addr, exports, per = sys.argv[1:5]
exports, per = int(exports), int(per)
# The exporters log each retry as a warning ("Transient error ...
# retrying in ..."), on stderr: the test counts them.
logging.basicConfig(level=logging.WARNING)

resource = Resource.create({"service.name": "sigkill"})
out = threading.Lock()


def spans(first):
    made = []
    for i in range(first, first + per):
        ctx = SpanContext(trace_id=i, span_id=i, is_remote=False, trace_flags=TraceFlags(1))
        made.append(
            ReadableSpan(
                name="numbered",
                context=ctx,
                resource=resource,
                kind=SpanKind.INTERNAL,
                start_time=1_700_000_000_000_000_000,
                end_time=1_700_000_000_000_001_000,
            )
        )
    return made


def run(exporter, base):
    for e in range(exports):
        first = base + e * per
        ok = exporter.export(spans(first)) == SpanExportResult.SUCCESS
        with out:
            print(json.dumps({"first": first, "n": per, "ok": ok}), flush=True)
    exporter.shutdown()


threads = [
    threading.Thread(target=run, args=(GrpcSpans(endpoint=grpc_addr, insecure=True, timeout=60), 1)),
    threading.Thread(
        target=run,
        args=(HttpSpans(endpoint=f"http://{http_addr}/v1/traces", timeout=60), 1_000_001),
    ),
]
for t in threads:
    t.start()
for t in threads:
    t.join()
