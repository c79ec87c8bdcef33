"""One unchanged Kafka client library against Weir's Kafka listener over TLS
with a client certificate, or over SASL_SSL.

    python tls_clients.py CLIENT BOOTSTRAP TOPIC CA CERT KEY

CLIENT is confluent (librdkafka), kafka-python or aiokafka. Produces 50
records (acks=all) to TOPIC (it exists, 2 partitions), then reads them all
back in a consumer group (subscribe, poll until every record came, commit).
Prints one JSON line; exits non-zero on any failure.

With WEIR_SASL=MECHANISM:USER:PASSWORD the client logs in over SASL_SSL
instead (CERT and KEY are `-`). With WEIR_EXPECT=auth-failure as well, it
expects its login to be refused: prints the client's error and exits 0 only
if that error is the client's authentication error.
"""

import asyncio
import json
import os
import ssl
import sys
import time

N = 50
DEADLINE_S = 45
SASL = os.environ.get("WEIR_SASL", "").split(":", 2) if os.environ.get("WEIR_SASL") else None
EXPECT_AUTH_FAILURE = os.environ.get("WEIR_EXPECT") == "auth-failure"


def values():
    return [f"tls-{i}".encode() for i in range(N)]


def confluent(b, topic, ca, cert, key):
    import confluent_kafka as ck

    sec = {
        "bootstrap.servers": b,
        "security.protocol": "SSL",
        "ssl.ca.location": ca,
    }
    if SASL:
        mech, user, password = SASL
        sec.update({"security.protocol": "SASL_SSL", "sasl.mechanism": mech,
                    "sasl.username": user, "sasl.password": password})
    else:
        sec.update({"ssl.certificate.location": cert, "ssl.key.location": key})
    if EXPECT_AUTH_FAILURE:
        seen = []
        p = ck.Producer({**sec, "error_cb": lambda e: seen.append(e)})
        t0 = time.time()
        while not seen and time.time() - t0 < DEADLINE_S:
            p.poll(0.2)
        auth = [e for e in seen if e.code() == ck.KafkaError._AUTHENTICATION]
        raise AuthOutcome(bool(auth), str(seen[:1]))
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
    import kafka.errors

    sec = dict(bootstrap_servers=b, security_protocol="SSL", ssl_cafile=ca)
    if SASL:
        mech, user, password = SASL
        sec.update(security_protocol="SASL_SSL", sasl_mechanism=mech,
                   sasl_plain_username=user, sasl_plain_password=password)
    else:
        sec.update(ssl_certfile=cert, ssl_keyfile=key)
    if EXPECT_AUTH_FAILURE:
        # kafka-python reports the refused login in its log and then fails
        # to bootstrap: both are what a user of it sees.
        import logging
        seen = []
        handler = logging.Handler()
        handler.emit = lambda r: seen.append(r.getMessage())
        logging.getLogger("kafka").addHandler(handler)
        try:
            kafka.KafkaProducer(bootstrap_timeout_ms=5000, **sec)
        except kafka.errors.KafkaError as e:
            auth = [m for m in seen if "SaslAuthenticationFailedError" in m]
            raise AuthOutcome(bool(auth), f"{e!r}; {(auth or seen)[:3]}")
        raise AuthOutcome(False, "the producer connected")
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
    import aiokafka.conn
    import aiokafka.errors
    from aiokafka.helpers import create_ssl_context

    async def go():
        if SASL:
            mech, user, password = SASL
            ctx = create_ssl_context(cafile=ca)
            sec = dict(bootstrap_servers=b, security_protocol="SASL_SSL", ssl_context=ctx,
                       sasl_mechanism=mech, sasl_plain_username=user,
                       sasl_plain_password=password)
        else:
            ctx = create_ssl_context(cafile=ca, certfile=cert, keyfile=key)
            sec = dict(bootstrap_servers=b, security_protocol="SSL", ssl_context=ctx)
        if EXPECT_AUTH_FAILURE:
            # A producer's bootstrap hides the cause; a connection shows it.
            host, port = b.rsplit(":", 1)
            try:
                conn = await aiokafka.conn.create_conn(host, int(port), **{
                    k: v for k, v in sec.items() if k != "bootstrap_servers"})
                conn.close()
            except aiokafka.errors.KafkaError as e:
                raise AuthOutcome(isinstance(e, aiokafka.errors.SaslAuthenticationFailed), repr(e))
            raise AuthOutcome(False, "the connection logged in")
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


class AuthOutcome(Exception):
    """How an expected authentication failure went."""

    def __init__(self, auth_error, detail):
        super().__init__(detail)
        self.auth_error, self.detail = auth_error, detail


def main():
    client, b, topic, ca, cert, key = sys.argv[1:7]
    run = {"confluent": confluent, "kafka-python": kafka_python, "aiokafka": aiokafka_run}[client]
    if EXPECT_AUTH_FAILURE:
        try:
            run(b, topic, ca, cert, key)
        except AuthOutcome as o:
            print(json.dumps({"client": client, "auth_error": o.auth_error, "error": o.detail}))
            sys.exit(0 if o.auth_error else 1)
        sys.exit(1)
    got = run(b, topic, ca, cert, key)
    ok = sorted(got) == sorted(values())
    print(json.dumps({"client": client, "ok": ok, "read": len(got), "tls": ssl.OPENSSL_VERSION}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
