"""One unchanged Kafka client library against Weir's Kafka listener over TLS
with a client certificate.

    python tls_clients.py CLIENT BOOTSTRAP TOPIC CA CERT KEY

CLIENT is confluent (librdkafka), kafka-python or aiokafka. Produces 50
records (acks=all) to TOPIC (it exists, 2 partitions), then reads them all
back in a consumer group (subscribe, poll until every record came, commit).
Prints one JSON line; exits non-zero on any failure.
"""

import asyncio
import json
import ssl
import sys
import time

N = 50
DEADLINE_S = 45


def values():
    return [f"tls-{i}".encode() for i in range(N)]


def confluent(b, topic, ca, cert, key):
    import confluent_kafka as ck

    sec = {
        "bootstrap.servers": b,
        "security.protocol": "SSL",
        "ssl.ca.location": ca,
        "ssl.certificate.location": cert,
        "ssl.key.location": key,
    }
    p = ck.Producer({**sec, "acks": "all"})
    errors = []
    for v in values():
        p.produce(topic, value=v, on_delivery=lambda e, m: errors.append(e) if e else None)
    left = p.flush(DEADLINE_S)
    assert left == 0 and not errors, f"produce: {left} left, {errors}"
    c = ck.Consumer({**sec, "group.id": f"{topic}-group", "auto.offset.reset": "earliest",
                     "enable.auto.commit": False})
    c.subscribe([topic])
    got, t0 = [], time.time()
    while len(got) < N and time.time() - t0 < DEADLINE_S:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.commit(asynchronous=False)
    c.close()
    return got


def kafka_python(b, topic, ca, cert, key):
    import kafka

    sec = dict(bootstrap_servers=b, security_protocol="SSL", ssl_cafile=ca,
               ssl_certfile=cert, ssl_keyfile=key)
    p = kafka.KafkaProducer(acks="all", **sec)
    for f in [p.send(topic, value=v) for v in values()]:
        f.get(timeout=DEADLINE_S)
    p.close()
    c = kafka.KafkaConsumer(topic, group_id=f"{topic}-group", auto_offset_reset="earliest",
                            enable_auto_commit=False, **sec)
    got, t0 = [], time.time()
    while len(got) < N and time.time() - t0 < DEADLINE_S:
        for ms in c.poll(timeout_ms=500).values():
            got.extend(m.value for m in ms)
    c.commit()
    c.close()
    return got


def aiokafka_run(b, topic, ca, cert, key):
    import aiokafka
    from aiokafka.helpers import create_ssl_context

    async def go():
        ctx = create_ssl_context(cafile=ca, certfile=cert, keyfile=key)
        sec = dict(bootstrap_servers=b, security_protocol="SSL", ssl_context=ctx)
        p = aiokafka.AIOKafkaProducer(acks="all", **sec)
        await p.start()
        for f in [await p.send(topic, value=v) for v in values()]:
            await f
        await p.stop()
        c = aiokafka.AIOKafkaConsumer(topic, group_id=f"{topic}-group",
                                      auto_offset_reset="earliest",
                                      enable_auto_commit=False, **sec)
        await c.start()
        got, t0 = [], time.time()
        while len(got) < N and time.time() - t0 < DEADLINE_S:
            for ms in (await c.getmany(timeout_ms=500)).values():
                got.extend(m.value for m in ms)
        await c.commit()
        await c.stop()
        return got

    return asyncio.new_event_loop().run_until_complete(go())


def main():
    client, b, topic, ca, cert, key = sys.argv[1:7]
    run = {"confluent": confluent, "kafka-python": kafka_python, "aiokafka": aiokafka_run}[client]
    got = run(b, topic, ca, cert, key)
    ok = sorted(got) == sorted(values())
    print(json.dumps({"client": client, "ok": ok, "read": len(got), "tls": ssl.OPENSSL_VERSION}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
