"""Kafka transactions with the pure-Python clients.

    transactions_py.py CLIENT BOOTSTRAP TOPIC

CLIENT: kafka-python or aiokafka. On TOPIC (created here, 4 partitions):
a transactional producer commits 100 records, aborts 100, commits 50; a
read_committed consumer sees exactly the 150 committed ones, a
read_uncommitted one all 250. A second producer with the same
transactional id fences the first: the first's commit fails. Prints one
line per check; exits non-zero on the first failure.
"""

import asyncio
import sys
import time

from kafka.admin import KafkaAdminClient, NewTopic

client, bootstrap, topic = sys.argv[1], sys.argv[2], sys.argv[3]
PARTITIONS = 4
DEADLINE_S = 60


def check(cond, what):
    if not cond:
        print(f"FAIL {what}", flush=True)
        sys.exit(1)
    print(f"ok {what}", flush=True)


admin = KafkaAdminClient(bootstrap_servers=bootstrap)
admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
admin.close()


def kafka_python():
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    def producer(tid):
        p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid, enable_idempotence=True)
        p.init_transactions()
        return p

    def send(p, prefix, n):
        for i in range(n):
            p.send(topic, value=f"{prefix}{i}".encode(), partition=i % PARTITIONS)
        p.flush()

    def read(isolation, expect):
        c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation,
                          enable_auto_commit=False, consumer_timeout_ms=3000)
        c.assign([TopicPartition(topic, q) for q in range(PARTITIONS)])
        c.seek_to_beginning()
        got = []
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            batch = c.poll(timeout_ms=500)
            for recs in batch.values():
                got.extend(r.value.decode() for r in recs)
            if not batch and len(got) >= expect:
                break
        c.close()
        return got

    p = producer(f"{topic}-tx")
    p.begin_transaction()
    send(p, "c", 100)
    p.commit_transaction()
    p.begin_transaction()
    send(p, "a", 100)
    p.abort_transaction()
    p.begin_transaction()
    send(p, "d", 50)
    p.commit_transaction()
    p.close()
    committed = read("read_committed", 150)
    everything = read("read_uncommitted", 250)

    zombie = producer(f"{topic}-z")
    zombie.begin_transaction()
    send(zombie, "z", 10)
    fresh = producer(f"{topic}-z")
    try:
        zombie.commit_transaction()
        fenced = False
    except Exception as e:  # kafka-python raises its ProducerFencedError (or a KafkaError)
        fenced = True
        print(f"zombie: {type(e).__name__}: {e}", flush=True)
    fresh.close()
    after = read("read_committed", 150)
    return committed, everything, fenced, after


def aiokafka():
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition

    async def producer(tid):
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid, enable_idempotence=True)
        await p.start()
        return p

    async def send(p, prefix, n):
        for i in range(n):
            await p.send(topic, value=f"{prefix}{i}".encode(), partition=i % PARTITIONS)

    async def read(isolation, expect):
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False)
        await c.start()
        c.assign([TopicPartition(topic, q) for q in range(PARTITIONS)])
        await c.seek_to_beginning()
        got = []
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            batch = await c.getmany(timeout_ms=500)
            for recs in batch.values():
                got.extend(r.value.decode() for r in recs)
            if not batch and len(got) >= expect:
                break
        await c.stop()
        return got

    async def go():
        p = await producer(f"{topic}-tx")
        async with p.transaction():
            await send(p, "c", 100)
        await p.begin_transaction()
        await send(p, "a", 100)
        await p.abort_transaction()
        async with p.transaction():
            await send(p, "d", 50)
        await p.stop()
        committed = await read("read_committed", 150)
        everything = await read("read_uncommitted", 250)
        zombie = await producer(f"{topic}-z")
        await zombie.begin_transaction()
        await send(zombie, "z", 10)
        fresh = await producer(f"{topic}-z")
        try:
            await zombie.commit_transaction()
            fenced = False
        except Exception as e:
            fenced = True
            print(f"zombie: {type(e).__name__}: {e}", flush=True)
        try:
            await zombie.stop()
        except Exception:
            pass
        await fresh.stop()
        after = await read("read_committed", 150)
        return committed, everything, fenced, after

    return asyncio.run(go())


committed, everything, fenced, after = {"kafka-python": kafka_python, "aiokafka": aiokafka}[client]()
check(len(committed) == 150 and not any(v.startswith("a") for v in committed),
      f"{client}: read_committed sees the 150 committed records (got {len(committed)})")
check(sorted(committed) == sorted([f"c{i}" for i in range(100)] + [f"d{i}" for i in range(50)]),
      f"{client}: every committed record once")
check(len(everything) == 250, f"{client}: read_uncommitted sees all 250 (got {len(everything)})")
check(fenced, f"{client}: the zombie's commit fails")
check(not any(v.startswith("z") for v in after), f"{client}: nothing the zombie wrote is visible committed")
print("done", flush=True)
