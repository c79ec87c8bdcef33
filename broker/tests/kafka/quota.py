"""Two confluent-kafka (librdkafka) producers on one broker, over
SASL_PLAINTEXT/SCRAM-SHA-512: CAPPED under a produce quota, FREE under
none.

    python quota.py BOOTSTRAP TOPIC CAPPED FREE PASSWORD SECONDS FREE_MB

CAPPED produces as fast as it can for SECONDS; FREE, once CAPPED has
spent its burst and is being throttled (3 s in), FREE_MB MiB as fast as
it can (or until CAPPED stops, if sooner). Prints one JSON
line: each one's bytes of values acknowledged within its run and their
rate (bytes/s), and the largest throttle time the broker answered it
(librdkafka's statistics).
"""

import json
import sys
import threading
import time

import confluent_kafka as ck

VALUE = b"x" * 10240


def run(bootstrap, topic, user, password, seconds, limit, delay, out):
    acked = [0]
    throttle = [0]

    def done(err, msg):
        if err is None:
            acked[0] += len(msg.value())

    def stats(text):
        s = json.loads(text)
        for b in s.get("brokers", {}).values():
            throttle[0] = max(throttle[0], b.get("throttle", {}).get("max", 0))

    p = ck.Producer({
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
        "acks": "1",
        "linger.ms": 5,
        "queue.buffering.max.kbytes": 8192,
        "statistics.interval.ms": 500,
        "stats_cb": stats,
    })
    # Connected and the topic known before the clock starts.
    p.list_topics(topic, timeout=20)
    time.sleep(delay)
    t0 = time.monotonic()
    end = t0 + seconds
    queued = 0
    while time.monotonic() < end and queued < limit:
        try:
            p.produce(topic, value=VALUE, on_delivery=done)
            queued += len(VALUE)
            p.poll(0)
        except BufferError:
            p.poll(0.005)
    if queued >= limit:
        # All of it, acknowledged: the rate is over the whole run.
        p.flush(max(end - time.monotonic(), 1))
    p.poll(0)
    elapsed = time.monotonic() - t0
    got = acked[0]
    p.purge()
    p.flush(10)
    out[user] = {"bytes": got, "seconds": elapsed, "rate": got / elapsed,
                 "max_throttle_ms": throttle[0]}


def main():
    b, topic, capped, free, password, seconds, free_mb = sys.argv[1:8]
    out = {}
    seconds = float(seconds)
    threads = [
        threading.Thread(target=run, args=(b, topic, capped, password, seconds,
                                           float("inf"), 0, out)),
        threading.Thread(target=run, args=(b, topic, free, password, seconds - 3,
                                           float(free_mb) * 1048576, 3, out)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
