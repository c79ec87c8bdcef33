"""The unchanged OpenTelemetry Python SDK exports to Weir's OTLP receivers;
confluent-kafka reads the topics back and opentelemetry-proto decodes them.

usage: otlp.py GRPC_ADDR HTTP_ADDR KAFKA_ADDR ENCODING SPANS LOGS

Over gRPC and over HTTP (protobuf), each with its own service name: SPANS
spans (traces of 10), LOGS log records and a counter and a histogram. Then
every record of otlp_spans, otlp_logs and otlp_metrics is decoded
(ENCODING: otlp_proto or otlp_json) and checked: every span and log record
exactly once, the spans of a trace in one partition under the trace id's
key, the resource attributes on every resource, the metrics' points.
Prints one JSON line of counts; exits non-zero on any failure.
"""

import base64
import json
import logging
import sys
import time

from confluent_kafka import Consumer, TopicPartition
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogs
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

grpc_addr, http_addr, kafka, encoding, n_spans, n_logs = sys.argv[1:7]
n_spans, n_logs = int(n_spans), int(n_logs)


def fail(msg):
    print(json.dumps({"ok": False, "error": msg}))
    sys.exit(1)


def exporters(transport):
    if transport == "grpc":
        ep = f"http://{grpc_addr}"
        return (GrpcSpans(endpoint=ep, insecure=True), GrpcLogs(endpoint=ep, insecure=True),
                GrpcMetrics(endpoint=ep, insecure=True))
    base = f"http://{http_addr}"
    return (HttpSpans(endpoint=f"{base}/v1/traces"), HttpLogs(endpoint=f"{base}/v1/logs"),
            HttpMetrics(endpoint=f"{base}/v1/metrics"))


expected_spans = {}   # span id hex -> (trace id hex, service)
expected_logs = set()
for transport in ("grpc", "http"):
    service = f"svc-{transport}"
    resource = Resource.create({"service.name": service, "weir.test": "otlp"})
    spans, logs, metrics = exporters(transport)

    tp = TracerProvider(resource=resource)
    memory = InMemorySpanExporter()
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tp.add_span_processor(BatchSpanProcessor(spans, max_queue_size=n_spans + 1, max_export_batch_size=512))
    tracer = tp.get_tracer("weir.otlp.test")
    for t in range(n_spans // 10):
        with tracer.start_as_current_span(f"root-{t}"):
            for i in range(9):
                with tracer.start_as_current_span(f"child-{t}-{i}") as s:
                    s.set_attribute("i", i)
    if not tp.force_flush(30_000):
        fail(f"{transport}: spans not flushed")
    tp.shutdown()
    for s in memory.get_finished_spans():
        ctx = s.get_span_context()
        expected_spans[f"{ctx.span_id:016x}"] = (f"{ctx.trace_id:032x}", service)

    lp = LoggerProvider(resource=resource)
    lp.add_log_record_processor(BatchLogRecordProcessor(logs, max_queue_size=n_logs + 1, max_export_batch_size=512))
    handler = LoggingHandler(level=logging.INFO, logger_provider=lp)
    log = logging.getLogger(f"weir.otlp.{transport}")
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(handler)
    for i in range(n_logs):
        body = f"log-{transport}-{i}"
        log.info(body)
        expected_logs.add(body)
    if not lp.force_flush(30_000):
        fail(f"{transport}: logs not flushed")
    log.removeHandler(handler)
    lp.shutdown()

    reader = PeriodicExportingMetricReader(metrics, export_interval_millis=3_600_000)
    mp = MeterProvider(resource=resource, metric_readers=[reader])
    meter = mp.get_meter("weir.otlp.test")
    counter = meter.create_counter("requests")
    hist = meter.create_histogram("latency_ms")
    for i in range(100):
        counter.add(1, {"route": f"/r{i % 3}"})
        hist.record(i, {"route": "/h"})
    if not mp.force_flush(30_000):
        fail(f"{transport}: metrics not flushed")
    mp.shutdown()

if len(expected_spans) != 2 * (n_spans // 10) * 10:
    fail(f"the SDK recorded {len(expected_spans)} spans")


def hex_ids(d):
    """OTLP/JSON's hex ids as protobuf JSON's base64, for json_format."""
    if isinstance(d, dict):
        for k, v in d.items():
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str):
                d[k] = base64.b64encode(bytes.fromhex(v)).decode()
            else:
                hex_ids(v)
    elif isinstance(d, list):
        for v in d:
            hex_ids(v)
    return d


def decode(cls, value):
    if encoding == "otlp_json":
        return json_format.ParseDict(hex_ids(json.loads(value)), cls())
    return cls.FromString(value)


def read(topic, cls):
    c = Consumer({"bootstrap.servers": kafka, "group.id": f"otlp-check-{topic}",
                  "enable.auto.commit": False})
    meta = c.list_topics(topic, timeout=10).topics[topic]
    if meta.error is not None:
        fail(f"{topic}: {meta.error}")
    parts = sorted(meta.partitions)
    ends = {}
    for p in parts:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        ends[p] = hi
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out = []
    pos = {p: 0 for p in parts}
    deadline = time.time() + 60
    while any(pos[p] < ends[p] for p in parts):
        if time.time() > deadline:
            fail(f"{topic}: read {pos} of {ends}")
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            fail(f"{topic}: {m.error()}")
        pos[m.partition()] = m.offset() + 1
        out.append((m.partition(), m.key(), decode(cls, m.value())))
    c.close()
    return out, len(parts)


def resource_ok(resource):
    attrs = {kv.key: kv.value.string_value for kv in resource.attributes}
    if attrs.get("weir.test") != "otlp" or not attrs.get("service.name", "").startswith("svc-"):
        fail(f"resource attributes missing: {attrs}")
    return attrs["service.name"]


seen_spans = {}
trace_partition = {}
records, span_partitions = read("otlp_spans", ExportTraceServiceRequest)
for partition, key, req in records:
    for rs in req.resource_spans:
        service = resource_ok(rs.resource)
        for ss in rs.scope_spans:
            for s in ss.spans:
                sid, tid = s.span_id.hex(), s.trace_id.hex()
                seen_spans[sid] = seen_spans.get(sid, 0) + 1
                if expected_spans.get(sid) != (tid, service):
                    fail(f"span {sid}: {(tid, service)}, expected {expected_spans.get(sid)}")
                if key != tid.encode():
                    fail(f"span {sid} of trace {tid} under key {key!r}")
                if trace_partition.setdefault(tid, partition) != partition:
                    fail(f"trace {tid} in partitions {trace_partition[tid]} and {partition}")
dupes = [s for s, n in seen_spans.items() if n != 1]
missing = set(expected_spans) - set(seen_spans)
if dupes or missing:
    fail(f"{len(dupes)} spans more than once, {len(missing)} missing")

seen_logs = {}
records, _ = read("otlp_logs", ExportLogsServiceRequest)
for partition, key, req in records:
    for rl in req.resource_logs:
        resource_ok(rl.resource)
        for sl in rl.scope_logs:
            for r in sl.log_records:
                body = r.body.string_value
                seen_logs[body] = seen_logs.get(body, 0) + 1
if set(seen_logs) != expected_logs or any(n != 1 for n in seen_logs.values()):
    fail(f"logs: {len(seen_logs)} distinct of {len(expected_logs)}, "
         f"{sum(1 for n in seen_logs.values() if n != 1)} repeated")

sums = {}
points = 0
records, _ = read("otlp_metrics", ExportMetricsServiceRequest)
for partition, key, req in records:
    for rm in req.resource_metrics:
        service = resource_ok(rm.resource)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == "requests":
                    # Cumulative: the flush and the shutdown each export
                    # the running totals.
                    for p in m.sum.data_points:
                        points += 1
                        route = p.attributes[0].value.string_value
                        sums[(service, route)] = max(sums.get((service, route), 0), p.as_int)
                elif m.name == "latency_ms":
                    for p in m.histogram.data_points:
                        points += 1
                        if p.count != 100 or p.sum != sum(range(100)):
                            fail(f"histogram of {service}: count {p.count} sum {p.sum}")
totals = {}
for (service, _), v in sums.items():
    totals[service] = totals.get(service, 0) + v
if totals != {"svc-grpc": 100, "svc-http": 100}:
    fail(f"counter totals {totals}")

print(json.dumps({"ok": True, "spans": len(seen_spans), "traces": len(trace_partition),
                  "span_partitions": span_partitions,
                  "partitions_used": len(set(trace_partition.values())),
                  "logs": len(seen_logs), "metric_points": points}))
