"""An unchanged confluent-kafka (librdkafka) producer under node kills.

    python failover_producer.py BOOTSTRAP TOPIC PARTITIONS

Idempotent, acks=all, bootstrapped with every node given (comma-separated),
client defaults otherwise. Writes round-robin to the topic's partitions
(explicit partition numbers), about 1 000 records a second, until told to
stop. Each record's value is `k<MARK>:<SEQ>`: MARK is the last number read
from standard input as a `mark N` line (the test sends one after each kill,
so a record of mark N was sent after kill N), SEQ counts from 0.

Standard output, one line per outcome:

    ack PARTITION OFFSET VALUE
    fail PARTITION VALUE ERROR

and `done` after `stop` on standard input has flushed everything.
"""

import os
import sys
import threading
import time

from confluent_kafka import Producer

boot, topic, partitions = sys.argv[1], sys.argv[2], int(sys.argv[3])
mark = 0
stopping = threading.Event()
out_lock = threading.Lock()


def say(line):
    with out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def read_commands():
    global mark
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["mark"]:
            mark = int(words[1])
        elif words[:1] == ["stop"]:
            break
    stopping.set()


def delivered(err, msg):
    value = msg.value().decode()
    if err is None:
        say(f"ack {msg.partition()} {msg.offset()} {value}")
    else:
        say(f"fail {msg.partition()} {value} {str(err).replace(chr(10), ' ')}")


p = Producer(
    {
        "bootstrap.servers": boot,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        # Longer than any failover the test allows: a record is never
        # given up on while the cluster elects a leader.
        "message.timeout.ms": 120000,
        # The test kills a node moments after the previous one came back,
        # which librdkafka, backing off its reconnects to a broker that
        # was down up to 10 s by default, has not reconnected to yet: a
        # partition that moves there would wait out that back-off, a
        # client-side wait no broker can shorten. Real restarts are
        # minutes apart; docs/operations.md ("Failover") names this knob.
        "reconnect.backoff.max.ms": 1000,
    }
    # The test's diagnostics: librdkafka's own account, to standard error.
    | ({"debug": os.environ["WEIR_RDKAFKA_DEBUG"]} if os.environ.get("WEIR_RDKAFKA_DEBUG") else {})
)
threading.Thread(target=read_commands, daemon=True).start()
seq = 0
while not stopping.is_set():
    part = seq % partitions
    p.produce(topic, value=f"k{mark}:{seq}".encode(), partition=part, on_delivery=delivered)
    seq += 1
    p.poll(0)
    if seq % 10 == 0:
        time.sleep(0.01)
left = p.flush(120)
if left:
    say(f"fail -1 - {left} records not delivered at the end")
say("done")
