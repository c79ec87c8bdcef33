"""Kafka transactions against Weir with an unchanged client.

    transactions.py CLIENT BOOTSTRAP TOPIC

CLIENT: confluent-kafka (librdkafka). On TOPIC (created here, 4
partitions): a transactional producer commits 100 records, aborts 100,
commits 50; a read_committed consumer then sees exactly the 150 committed
ones, a read_uncommitted one all 250. A second instance with the same
transactional id fences the first: the first's open transaction is
aborted, its commit fails as fenced, and nothing it wrote is visible
committed; the second commits. Prints one line per check; exits non-zero
on the first failure.
"""

import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

client, bootstrap, topic = sys.argv[1], sys.argv[2], sys.argv[3]
assert client == "confluent-kafka", client
PARTITIONS = 4
DEADLINE_S = 60


def check(cond, what):
    if not cond:
        print(f"FAIL {what}", flush=True)
        sys.exit(1)
    print(f"ok {what}", flush=True)


def create():
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    for f in fs.values():
        f.result(30)


def producer(tid):
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": tid,
            "transaction.timeout.ms": 60000,
            "linger.ms": 5,
        }
    )
    p.init_transactions(30)
    return p


def send(p, prefix, n):
    for i in range(n):
        p.produce(topic, key=f"k{i % 10}".encode(), value=f"{prefix}{i}".encode(), partition=i % PARTITIONS)
    p.flush(30)


def read(isolation, expect):
    """Every value of the topic as a consumer with `isolation` sees it,
    read until `expect` values arrived and the end of every partition was
    reached (or the deadline)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-{isolation}-{time.monotonic_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got, eof = [], set()
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            if len(got) >= expect and len(eof) == PARTITIONS:
                break
            continue
        if m.error():
            if m.error().code() == -191:  # _PARTITION_EOF
                eof.add(m.partition())
                if len(got) >= expect and len(eof) == PARTITIONS:
                    break
                continue
            raise KafkaException(m.error())
        eof.discard(m.partition())
        got.append(m.value().decode())
    c.close()
    return got


create()

# Commit, abort, commit.
p = producer(f"{topic}-tx")
p.begin_transaction()
send(p, "c", 100)
p.commit_transaction(30)
p.begin_transaction()
send(p, "a", 100)
p.abort_transaction(30)
p.begin_transaction()
send(p, "d", 50)
p.commit_transaction(30)
check(True, "committed 100, aborted 100, committed 50")

committed = read("read_committed", 150)
check(len(committed) == 150, f"read_committed sees 150 records (got {len(committed)})")
check(not any(v.startswith("a") for v in committed), "read_committed sees no aborted record")
check(sorted(committed) == sorted([f"c{i}" for i in range(100)] + [f"d{i}" for i in range(50)]),
      "read_committed sees every committed record once")
everything = read("read_uncommitted", 250)
check(len(everything) == 250, f"read_uncommitted sees all 250 (got {len(everything)})")

# A zombie: the first instance's open transaction is aborted when the
# second initialises; its commit is refused.
zombie = producer(f"{topic}-z")
zombie.begin_transaction()
send(zombie, "z", 20)
fresh = producer(f"{topic}-z")
try:
    zombie.commit_transaction(30)
    check(False, "the zombie's commit is refused")
except KafkaException as e:
    err = e.args[0]
    check(err.fatal() or "fenced" in str(err).lower(), f"the zombie's commit is refused ({err})")
fresh.begin_transaction()
send(fresh, "f", 10)
fresh.commit_transaction(30)
committed = read("read_committed", 160)
check(not any(v.startswith("z") for v in committed), "nothing the zombie wrote is visible committed")
check(sum(v.startswith("f") for v in committed) == 10, "the new instance's commit is visible")
print("done", flush=True)
