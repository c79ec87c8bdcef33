"""Drives one unchanged Kafka client library against Weir's Kafka listener.

    python clients.py CLIENT BOOTSTRAP PREFIX IDEMPOTENCE [no-group]

CLIENT is confluent (librdkafka), kafka-python or aiokafka; IDEMPOTENCE is
default (the client's default) or on. The run, on topics named PREFIX-*:

1. creates a topic of 4 partitions with the client's admin API;
2. produces 10 000 keyed records (100 keys) with acks=all and murmur2
   partitioning, each delivery acknowledged;
3. reads every partition from the beginning: each record exactly once, per
   key in the order produced, each key on its murmur2 partition;
4. a group of two consumers splits the partitions, each commits what it
   processed, one leaves, the other takes its partitions over from the
   committed offsets: every record is processed, none lost, and the
   survivor starts each taken-over partition exactly at the committed
   offset (left out with no-group);
5. looks offsets up by timestamp (ListOffsets).

Prints one JSON line with what it saw; exits non-zero on any failure.
"""

import asyncio
import json
import sys
import time
import queue
import threading

from kafka.partitioner import murmur2

N = 10_000
KEYS = 100
PARTITIONS = 4
DEADLINE_S = 60


def partition_of(key: bytes) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % PARTITIONS


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")


def records():
    return [(f"k{i % KEYS}".encode(), str(i).encode()) for i in range(N)]


# --- adapters: the same operations in each library --------------------------


class Confluent:
    threaded = True

    def __init__(self, b, idem):
        import confluent_kafka as ck
        from confluent_kafka.admin import AdminClient, NewTopic

        self.ck, self.b, self.idem = ck, b, idem
        self.admin, self.NewTopic = AdminClient({"bootstrap.servers": b}), NewTopic

    def create(self, topic):
        for f in self.admin.create_topics([self.NewTopic(topic, PARTITIONS, 1)]).values():
            f.result(30)

    def produce(self, topic, recs):
        conf = {"bootstrap.servers": self.b, "acks": "all", "partitioner": "murmur2_random", "linger.ms": 5}
        if self.idem:
            conf["enable.idempotence"] = True
        p = self.ck.Producer(conf)
        acked, errors = [], []

        def cb(e, m):
            (errors if e else acked).append(e or (m.key(), m.value(), m.partition(), m.offset()))

        for i, (k, v) in enumerate(recs):
            while True:
                try:
                    p.produce(topic, key=k, value=v, on_delivery=cb)
                    break
                except BufferError:
                    p.poll(0.1)
            if i % 500 == 0:
                p.poll(0)
        p.flush(DEADLINE_S)
        check(not errors, f"delivery errors {errors[:3]}")
        return acked

    def read_all(self, topic, expect):
        c = self.ck.Consumer({"bootstrap.servers": self.b, "group.id": "unused", "enable.auto.commit": False})
        c.assign([self.ck.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        out, t0 = [], time.time()
        while len(out) < expect and time.time() - t0 < DEADLINE_S:
            for m in c.consume(1000, 0.5):
                check(m.error() is None, f"consume error {m.error()}")
                out.append((m.key(), m.value(), m.partition(), m.offset()))
        c.close()
        return out

    def member_conf(self, group):
        return {
            "bootstrap.servers": self.b,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 500,
        }

    def member(self, topic, group):
        c = self.ck.Consumer(self.member_conf(group))
        c.subscribe([topic])
        ck = self.ck

        class M:
            def poll(self):
                return [
                    (m.key(), m.value(), m.partition(), m.offset())
                    for m in c.consume(500, 0.2)
                    if m.error() is None
                ]

            def assignment(self):
                return {tp.partition for tp in c.assignment()}

            def commit(self):
                try:
                    c.commit(asynchronous=False)
                except ck.KafkaException as e:
                    # Nothing consumed since the last commit.
                    if e.args[0].code() != ck.KafkaError._NO_OFFSET:
                        raise

            def committed(self, parts):
                r = c.committed([ck.TopicPartition(topic, p) for p in parts], timeout=10)
                return {tp.partition: tp.offset for tp in r}

            def close(self):
                c.close()

        return M()

    def offsets_for_time(self, topic, ts):
        c = self.ck.Consumer({"bootstrap.servers": self.b, "group.id": "unused"})
        r = c.offsets_for_times([self.ck.TopicPartition(topic, p, ts) for p in range(PARTITIONS)], 10)
        c.close()
        return {tp.partition: tp.offset for tp in r}


class Confluent848(Confluent):
    """librdkafka's KIP-848 consumer (`group.protocol=consumer`): the
    broker assigns (ConsumerGroupHeartbeat, member epochs)."""

    def member_conf(self, group):
        return {
            "bootstrap.servers": self.b,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }


class KafkaPython:
    threaded = True

    def __init__(self, b, idem):
        import kafka

        self.k, self.b, self.idem = kafka, b, idem

    def create(self, topic):
        from kafka.admin import KafkaAdminClient, NewTopic

        a = KafkaAdminClient(bootstrap_servers=self.b)
        a.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
        a.close()

    def produce(self, topic, recs):
        kw = {"enable_idempotence": True} if self.idem else {}
        p = self.k.KafkaProducer(bootstrap_servers=self.b, acks="all", linger_ms=5, **kw)
        fs = [(k, v, p.send(topic, key=k, value=v)) for k, v in recs]
        p.flush(DEADLINE_S)
        out = []
        for k, v, f in fs:
            md = f.get(DEADLINE_S)
            out.append((k, v, md.partition, md.offset))
        p.close()
        return out

    def read_all(self, topic, expect):
        c = self.k.KafkaConsumer(bootstrap_servers=self.b, enable_auto_commit=False)
        tps = [self.k.TopicPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out, t0 = [], time.time()
        while len(out) < expect and time.time() - t0 < DEADLINE_S:
            for ms in c.poll(500).values():
                out.extend((m.key, m.value, m.partition, m.offset) for m in ms)
        c.close()
        return out

    def member(self, topic, group):
        TopicPartition = self.k.TopicPartition
        c = self.k.KafkaConsumer(
            topic,
            bootstrap_servers=self.b,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=10000,
            heartbeat_interval_ms=500,
            max_poll_records=500,
        )

        class M:
            def poll(self):
                # Long enough for a whole rebalance inside one poll:
                # kafka-python 3.0.12 loses the assignment of a join that
                # completes after its poll returned early (the next poll
                # sees no rejoin needed and never completes the join: no
                # assignment, heartbeats off, evicted after the session
                # timeout).
                return [(m.key, m.value, m.partition, m.offset) for ms in c.poll(3000).values() for m in ms]

            def assignment(self):
                return {tp.partition for tp in c.assignment()}

            def commit(self):
                c.commit()

            def committed(self, parts):
                return {p: c.committed(TopicPartition(topic, p)) for p in parts}

            def close(self):
                c.close()

        return M()

    def offsets_for_time(self, topic, ts):
        c = self.k.KafkaConsumer(bootstrap_servers=self.b)
        r = c.offsets_for_times({self.k.TopicPartition(topic, p): ts for p in range(PARTITIONS)})
        c.close()
        return {tp.partition: (o.offset if o else -1) for tp, o in r.items()}


class AioKafka:
    # One event loop: members' joins and heartbeats run as its tasks.
    threaded = False

    def __init__(self, b, idem):
        import aiokafka

        self.a, self.b, self.idem = aiokafka, b, idem
        self.loop = asyncio.new_event_loop()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def create(self, topic):
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        async def go():
            a = AIOKafkaAdminClient(bootstrap_servers=self.b)
            await a.start()
            await a.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
            await a.close()

        self.run(go())

    def produce(self, topic, recs):
        async def go():
            kw = {"enable_idempotence": True} if self.idem else {}
            p = self.a.AIOKafkaProducer(bootstrap_servers=self.b, acks="all", linger_ms=5, **kw)
            await p.start()
            fs = [(k, v, await p.send(topic, key=k, value=v)) for k, v in recs]
            out = []
            for k, v, f in fs:
                md = await f
                out.append((k, v, md.partition, md.offset))
            await p.stop()
            return out

        return self.run(go())

    def read_all(self, topic, expect):
        async def go():
            c = self.a.AIOKafkaConsumer(bootstrap_servers=self.b, enable_auto_commit=False)
            await c.start()
            tps = [self.a.TopicPartition(topic, p) for p in range(PARTITIONS)]
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            out, t0 = [], time.time()
            while len(out) < expect and time.time() - t0 < DEADLINE_S:
                for ms in (await c.getmany(timeout_ms=500)).values():
                    out.extend((m.key, m.value, m.partition, m.offset) for m in ms)
            await c.stop()
            return out

        return self.run(go())

    def member(self, topic, group):
        outer = self

        async def make():
            c = self.a.AIOKafkaConsumer(
                topic,
                bootstrap_servers=self.b,
                group_id=group,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                session_timeout_ms=10000,
                heartbeat_interval_ms=500,
            )
            await c.start()
            return c

        c = self.run(make())

        class M:
            def poll(self):
                r = outer.run(c.getmany(timeout_ms=200, max_records=500))
                return [(m.key, m.value, m.partition, m.offset) for ms in r.values() for m in ms]

            def assignment(self):
                return {tp.partition for tp in c.assignment()}

            def commit(self):
                outer.run(c.commit())

            def committed(self, parts):
                tp = outer.a.TopicPartition
                return {p: outer.run(c.committed(tp(topic, p))) for p in parts}

            def close(self):
                outer.run(c.stop())

        return M()

    def offsets_for_time(self, topic, ts):
        async def go():
            c = self.a.AIOKafkaConsumer(bootstrap_servers=self.b)
            await c.start()
            r = await c.offsets_for_times({self.a.TopicPartition(topic, p): ts for p in range(PARTITIONS)})
            await c.stop()
            return {tp.partition: (o.offset if o else -1) for tp, o in r.items()}

        return self.run(go())


CLIENTS = {
    "confluent": Confluent,
    "confluent-kip848": Confluent848,
    "kafka-python": KafkaPython,
    "aiokafka": AioKafka,
}


# --- the scenario -----------------------------------------------------------------


class Worker(threading.Thread):
    """Polls one member on its own thread without pause, as an application
    would (kafka-python blocks in poll while its JoinGroup is held: one
    thread for two members would wait in one member's join for the other's
    rejoin, which it could never send). Other calls run on the same thread
    (the libraries are not thread-safe) through `call`."""

    def __init__(self, member, seen, lock):
        super().__init__(daemon=True)
        self.m, self.seen, self.lock = member, seen, lock
        self.cmds = queue.Queue()
        self.assigned = set()
        self.watch, self.first = set(), {}

    def run(self):
        while True:
            try:
                name, args, reply = self.cmds.get_nowait()
                reply.put(getattr(self.m, name)(*args))
                if name == "close":
                    return
                continue
            except queue.Empty:
                pass
            got = self.m.poll()
            with self.lock:
                for _, _, p, o in got:
                    self.seen[(p, o)] = self.seen.get((p, o), 0) + 1
                    if p in self.watch:
                        self.first.setdefault(p, o)
            self.assigned = self.m.assignment()

    def call(self, name, *args):
        reply = queue.Queue()
        self.cmds.put((name, args, reply))
        return reply.get(timeout=DEADLINE_S)


def wait_for(what, cond):
    t0 = time.time()
    while not cond():
        check(time.time() - t0 < DEADLINE_S, what())
        time.sleep(0.05)


def group_phase_threaded(client, topic, produced):
    """As `group_phase`, each member polling on its own thread."""
    group = f"{topic}-group"
    end = {p: 0 for p in range(PARTITIONS)}
    for _, _, p, o in produced:
        end[p] = max(end[p], o + 1)
    seen, lock = {}, threading.Lock()
    a = Worker(client.member(topic, group), seen, lock)
    b = Worker(client.member(topic, group), seen, lock)
    a.start()
    b.start()
    # Each thread's view of its assignment is as of its last poll: wait for
    # views that split the partitions between the two (a view overlapping
    # the other's for a moment is one member not having polled yet).
    def split():
        x, y = set(a.assigned), set(b.assigned)
        return x and y and len(x | y) == PARTITIONS and not (x & y)

    wait_for(lambda: f"the group never split: {a.assigned} {b.assigned}", split)
    a_parts = set(a.assigned)
    time.sleep(0.5)
    a.call("commit")
    b.call("commit")
    raw = a.call("committed", a_parts)
    a_committed = {p: (o if o is not None and o >= 0 else 0) for p, o in raw.items()}
    with lock:
        b.watch = set(a_parts)
    a.call("close")
    wait_for(
        lambda: f"records lost or partitions not taken over: {len(seen)} of {N}, {b.assigned}",
        lambda: a_parts <= b.assigned and sum(1 for (p, o) in seen if o < end[p]) >= N,
    )
    b.call("commit")
    for p in a_parts:
        if a_committed[p] < end[p]:
            check(b.first.get(p) == a_committed[p], f"partition {p}: resumed at {b.first.get(p)}, committed {a_committed[p]}")
    b.call("close")
    duplicates = sum(n - 1 for n in seen.values())
    return {"a_partitions": sorted(a_parts), "a_committed": a_committed, "duplicates": duplicates}


def group_phase(client, topic, produced):
    """Two members split the partitions and commit; one leaves; the other
    takes over from the committed offsets. Returns what it checked."""
    group = f"{topic}-group"
    end = {p: 0 for p in range(PARTITIONS)}
    for _, _, p, o in produced:
        end[p] = max(end[p], o + 1)
    a, b = client.member(topic, group), client.member(topic, group)
    seen = {}  # (partition, offset) -> how many times processed
    t0 = time.time()
    # Both members hold partitions, then each processes some and commits.
    while not (a.assignment() and b.assignment() and len(a.assignment() | b.assignment()) == PARTITIONS):
        check(time.time() - t0 < DEADLINE_S, f"the group never split: {a.assignment()} {b.assignment()}")
        for m in (a, b):
            for _, _, p, o in m.poll():
                seen[(p, o)] = seen.get((p, o), 0) + 1
    check(not (a.assignment() & b.assignment()), "two members hold one partition")
    a_parts = set(a.assignment())
    for _ in range(5):
        for m in (a, b):
            for _, _, p, o in m.poll():
                seen[(p, o)] = seen.get((p, o), 0) + 1
    a.commit()
    b.commit()
    a_committed = {p: (o if o is not None and o >= 0 else 0) for p, o in a.committed(a_parts).items()}
    a.close()
    # B takes A's partitions over from A's committed offsets.
    first = {}
    t0 = time.time()
    while sum(1 for (p, o) in seen if o < end[p]) < N or not a_parts <= b.assignment():
        check(time.time() - t0 < DEADLINE_S, f"records lost: {len(seen)} of {N} processed")
        for _, _, p, o in b.poll():
            first.setdefault(p, o)
            seen[(p, o)] = seen.get((p, o), 0) + 1
    b.commit()
    check(a_parts <= b.assignment(), f"the survivor did not take over {a_parts - b.assignment()}")
    for p in a_parts:
        if a_committed[p] < end[p]:
            check(first.get(p) == a_committed[p], f"partition {p}: resumed at {first.get(p)}, committed {a_committed[p]}")
    b.close()
    duplicates = sum(n - 1 for n in seen.values())
    return {"a_partitions": sorted(a_parts), "a_committed": a_committed, "duplicates": duplicates}


def compression(bootstrap, prefix):
    """librdkafka producing with each codec; its consumer reads them back
    (the broker stores and serves the batches as they are)."""
    import confluent_kafka as ck

    out = {}
    for codec in ["lz4", "zstd", "gzip", "snappy"]:
        topic = f"{prefix}-{codec}"
        c = Confluent(bootstrap, True)
        c.create(topic)
        p = ck.Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20, "partitioner": "murmur2_random"})
        errors = []
        for i in range(1000):
            p.produce(topic, key=f"k{i}", value=f"v{i}" * 10, on_delivery=lambda e, m: e and errors.append(e))
        p.flush(DEADLINE_S)
        check(not errors, f"{codec}: {errors[:3]}")
        got = c.read_all(topic, 1000)
        check(sorted(v for _, v, _, _ in got) == sorted(f"v{i}".encode() * 10 for i in range(1000)), f"{codec}: records differ")
        out[codec] = len(got)
    print(json.dumps({"client": "confluent", "compression": out, "ok": True}))


def admin(bootstrap, prefix):
    """librdkafka's admin API: DeleteRecords (a record boundary and the high
    watermark; past the end refused), what consumers then read and
    ListOffsets report; DescribeConsumerGroups of a KIP-848 group
    (ConsumerGroupDescribe) and of a classic group (DescribeGroups); topic
    configs altered incrementally (set, append, subtract, delete)."""
    import confluent_kafka as ck
    from confluent_kafka.admin import (AdminClient, NewTopic, ConfigResource, ConfigEntry,
                                       AlterConfigOpType, ResourceType)

    a = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"{prefix}-deleted"
    for f in a.create_topics([NewTopic(topic, 2, 1)]).values():
        f.result(30)
    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for part in (0, 1):
        for i in range(100):
            p.produce(topic, value=f"{part}-{i}", partition=part)
    check(p.flush(DEADLINE_S) == 0, "records not delivered")

    fs = a.delete_records([ck.TopicPartition(topic, 0, 40), ck.TopicPartition(topic, 1, -1)])
    low = {tp.partition: f.result(30).low_watermark for tp, f in fs.items()}
    check(low == {0: 40, 1: 100}, f"low watermarks after DeleteRecords: {low}")
    past = a.delete_records([ck.TopicPartition(topic, 0, 1000)])
    for f in past.values():
        try:
            f.result(30)
            check(False, "DeleteRecords past the high watermark was accepted")
        except ck.KafkaException as e:
            check(e.args[0].code() == ck.KafkaError.OFFSET_OUT_OF_RANGE, f"past the end: {e}")

    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}-reader",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False})
    lo, hi = c.get_watermark_offsets(ck.TopicPartition(topic, 0), 10)
    check((lo, hi) == (40, 100), f"partition 0 watermarks: {(lo, hi)}")
    lo, hi = c.get_watermark_offsets(ck.TopicPartition(topic, 1), 10)
    check((lo, hi) == (100, 100), f"partition 1 watermarks: {(lo, hi)}")
    c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING), ck.TopicPartition(topic, 1, ck.OFFSET_BEGINNING)])
    got, deadline = [], time.time() + DEADLINE_S
    while len(got) < 60 and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append((m.partition(), m.offset(), m.value().decode()))
    check(sorted(got) == [(0, i, f"0-{i}") for i in range(40, 100)], f"read after DeleteRecords: {got[:3]}…")
    c.close()

    # A KIP-848 group and a classic group, each with one member holding
    # both partitions.
    kip848 = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}-kip848",
                          "group.protocol": "consumer", "auto.offset.reset": "earliest"})
    classic = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}-classic",
                           "auto.offset.reset": "earliest"})
    kip848.subscribe([topic])
    classic.subscribe([topic])
    deadline = time.time() + DEADLINE_S
    while (len(kip848.assignment()) < 2 or len(classic.assignment()) < 2) and time.time() < deadline:
        kip848.poll(0.2)
        classic.poll(0.2)
    check(len(kip848.assignment()) == 2 and len(classic.assignment()) == 2, "groups did not assign")
    described = {}
    for g, f in a.describe_consumer_groups([f"{prefix}-kip848", f"{prefix}-classic"]).items():
        d = f.result(30)
        members = [(sorted(tp.partition for tp in m.assignment.topic_partitions)) for m in d.members]
        described[g] = {"type": str(d.type), "state": str(d.state), "members": members}
        if g.endswith("kip848"):
            m = d.members[0]
            target = sorted(tp.partition for tp in m.target_assignment.topic_partitions)
            check(target == [0, 1], f"{g}: target assignment {target}")
    check(described[f"{prefix}-kip848"]["type"].endswith("CONSUMER"), f"KIP-848 group: {described}")
    check(described[f"{prefix}-classic"]["type"].endswith("CLASSIC"), f"classic group: {described}")
    for g in described.values():
        check(g["members"] == [[0, 1]], f"described members: {described}")
    # ListGroups tells the two kinds apart, and filters by type (v5).
    listed = {g.group_id: str(g.type) for g in a.list_consumer_groups().result(30).valid}
    check(listed.get(f"{prefix}-kip848", "").endswith("CONSUMER"), f"listed: {listed}")
    check(listed.get(f"{prefix}-classic", "").endswith("CLASSIC"), f"listed: {listed}")
    from confluent_kafka import ConsumerGroupType
    only = a.list_consumer_groups(types={ConsumerGroupType.CLASSIC}).result(30).valid
    check(f"{prefix}-kip848" not in {g.group_id for g in only}, f"type filter: {[g.group_id for g in only]}")
    kip848.close()
    classic.close()

    # IncrementalAlterConfigs: set, append to and subtract from a list,
    # delete (back to the default).
    res = ConfigResource(ResourceType.TOPIC, topic)
    def alter(*entries):
        res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=list(entries))
        for f in a.incremental_alter_configs([res]).values():
            f.result(30)
    def configs():
        return {k: v.value for k, v in a.describe_configs([res])[res].result(30).items()}
    alter(ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
          ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET))
    alter(ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND))
    after_append = configs()
    check(set(after_append["cleanup.policy"].split(",")) == {"delete", "compact"},
          f"after APPEND: {after_append['cleanup.policy']}")
    alter(ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT),
          ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE))
    after = configs()
    check(after["cleanup.policy"] == "compact", f"after SUBTRACT: {after['cleanup.policy']}")
    check(after["retention.ms"] == "604800000", f"after DELETE: retention.ms={after['retention.ms']}")
    # validate_only: checked like a change, nothing stored.
    def validate(value):
        entry = ConfigEntry("retention.ms", value, incremental_operation=AlterConfigOpType.SET)
        res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
        for f in a.incremental_alter_configs([res], validate_only=True).values():
            f.result(30)
    try:
        validate("soon")
        check(False, "validate_only accepted retention.ms=soon")
    except ck.KafkaException as e:
        check(e.args[0].code() == ck.KafkaError.INVALID_CONFIG, f"validate_only of a bad value: {e}")
    validate("1000")
    check(configs()["retention.ms"] == "604800000", "validate_only changed retention.ms")

    # Transactions are served (the v1 client flow): a transactional
    # producer initialises, commits, and never hangs.
    started = time.time()
    tx = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{prefix}-tx"})
    tx.init_transactions(30)
    tx.begin_transaction()
    tx.produce(topic, key=b"tx", value=b"committed")
    tx.commit_transaction(30)
    transactions = "served"
    check(time.time() - started < 20, f"a transaction took {time.time() - started:.1f} s")
    print(json.dumps({"client": "confluent", "admin": {"low_watermarks": low, "groups": described,
                                                       "transactions": transactions}, "ok": True}))


# --- __consumer_offsets read as Kafka's ---------------------------------------
# An independent decoder of Kafka's record schemas for __consumer_offsets,
# written from Apache Kafka's JSON message definitions (group-coordinator:
# OffsetCommitKey/Value, GroupMetadataKey/Value): int16 record type in front
# of a key, int16 version in front of a value, int16-length strings (-1
# null), int32-length bytes, big-endian integers. Not Weir's code.


class Buf:
    def __init__(self, b):
        self.b, self.i = b, 0

    def take(self, n):
        check(self.i + n <= len(self.b), f"record ends early at {self.i}+{n} of {len(self.b)}")
        v = self.b[self.i:self.i + n]
        self.i += n
        return v

    def int(self, n):
        return int.from_bytes(self.take(n), "big", signed=True)

    def string(self, nullable=False):
        n = self.int(2)
        if n == -1:
            check(nullable, "null in a non-nullable string")
            return None
        return self.take(n).decode()

    def bytes_(self):
        return self.take(self.int(4))

    def done(self):
        check(self.i == len(self.b), f"{len(self.b) - self.i} bytes after the record")


def kafka_offsets_record(key, value):
    """(type, decoded key, decoded value or None) as Kafka's loader reads it;
    types Kafka does not define are returned undecoded (Kafka skips them)."""
    k = Buf(key)
    t = k.int(2)
    if t in (0, 1):
        dk = {"group": k.string(), "topic": k.string(), "partition": k.int(4)}
        k.done()
        if value is None:
            return t, dk, None
        v = Buf(value)
        ver = v.int(2)
        check(0 <= ver <= 3, f"OffsetCommitValue version {ver}")
        dv = {"offset": v.int(8)}
        if ver >= 3:
            dv["leader_epoch"] = v.int(4)
        dv["metadata"] = v.string()
        dv["commit_timestamp"] = v.int(8)
        if ver == 1:
            dv["expire_timestamp"] = v.int(8)
        v.done()
        return t, dk, dv
    if t == 2:
        dk = {"group": k.string()}
        k.done()
        if value is None:
            return t, dk, None
        v = Buf(value)
        ver = v.int(2)
        check(0 <= ver <= 3, f"GroupMetadataValue version {ver}")
        dv = {"protocol_type": v.string(), "generation": v.int(4),
              "protocol": v.string(True), "leader": v.string(True)}
        if ver >= 2:
            dv["current_state_timestamp"] = v.int(8)
        members = []
        for _ in range(v.int(4)):
            m = {"member_id": v.string()}
            if ver >= 3:
                m["group_instance_id"] = v.string(True)
            m["client_id"] = v.string()
            m["client_host"] = v.string()
            if ver >= 1:
                m["rebalance_timeout"] = v.int(4)
            m["session_timeout"] = v.int(4)
            m["subscription"] = len(v.bytes_())
            m["assignment"] = len(v.bytes_())
            members.append(m)
        dv["members"] = members
        v.done()
        return t, dk, dv
    check(not (3 <= t <= 23), f"record type {t} is Kafka's, in a layout Kafka would misread")
    return t, None, None


def offsets_topic(bootstrap, prefix):
    """Commits offsets with metadata in a classic group, then reads every
    record of __consumer_offsets and decodes it with Kafka's schemas."""
    import confluent_kafka as ck

    topic, group = f"{prefix}-t", f"{prefix}-g"
    c = Confluent(bootstrap, False)
    c.create(topic)
    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(100):
        p.produce(topic, value=str(i), partition=i % PARTITIONS)
    check(p.flush(DEADLINE_S) == 0, "records not delivered")
    t0 = int(time.time() * 1000)
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                            "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen, deadline = {}, time.time() + DEADLINE_S
    while sum(seen.values()) < 100 and time.time() < deadline:
        m = consumer.poll(0.5)
        if m is not None and not m.error():
            seen[m.partition()] = seen.get(m.partition(), 0) + 1
    check(sum(seen.values()) == 100, f"read {seen}")
    commits = [ck.TopicPartition(topic, part, n, f"meta-{part}") for part, n in seen.items()]
    consumer.commit(offsets=commits, asynchronous=False)
    consumer.close()
    t1 = int(time.time() * 1000)

    meta = c.admin.list_topics(timeout=30)
    check("__consumer_offsets" in meta.topics, f"Metadata lists no __consumer_offsets: {list(meta.topics)}")
    parts = list(meta.topics["__consumer_offsets"].partitions)
    reader = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}-reader",
                          "enable.partition.eof": True, "enable.auto.commit": False})
    reader.assign([ck.TopicPartition("__consumer_offsets", q, ck.OFFSET_BEGINNING) for q in parts])
    eof, types, offsets, groups = set(), set(), {}, {}
    deadline = time.time() + DEADLINE_S
    while len(eof) < len(parts) and time.time() < deadline:
        m = reader.poll(0.5)
        if m is None:
            continue
        if m.error():
            check(m.error().code() == ck.KafkaError._PARTITION_EOF, str(m.error()))
            eof.add(m.partition())
            continue
        t, dk, dv = kafka_offsets_record(m.key(), m.value())
        types.add(t)
        if t in (0, 1) and dk["group"] == group:
            offsets[f"{dk['topic']}:{dk['partition']}"] = dv
        elif t == 2 and dk["group"] == group:
            groups[dk["group"]] = dv
    reader.close()
    check(len(eof) == len(parts), "__consumer_offsets not read to its end")
    for q, n in seen.items():
        got = offsets.get(f"{topic}:{q}")
        check(got is not None, f"no offset record of {topic}-{q}: {offsets}")
        # confluent-kafka sends the metadata with C's terminating NUL; it is
        # stored as sent, as Kafka stores it.
        check((got["offset"], got["metadata"].rstrip("\x00")) == (n, f"meta-{q}"),
              f"{topic}-{q}: {got}, committed {n}")
        check(t0 - 1000 <= got["commit_timestamp"] <= t1 + 1000, f"{topic}-{q}: timestamp {got} not in [{t0}, {t1}]")
    g = groups.get(group)
    check(g is not None and g["protocol_type"] == "consumer", f"group record of {group}: {g}")
    check(types <= {1, 2, 0x5701, 0x5702}, f"record types {types}")
    print(json.dumps({"types": sorted(types), "offsets": offsets, "groups": groups,
                      "committed": {f"{topic}:{q}": n for q, n in seen.items()},
                      "t0": t0, "t1": t1, "ok": True}))


def main():
    # WEIR_KAFKA_DEBUG=logger[,logger]: those client loggers at DEBUG on
    # stderr (e.g. kafka.coordinator), to see a group's joins and syncs.
    import os

    debug = os.environ.get("WEIR_KAFKA_DEBUG")
    if debug:
        import logging

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(message)s"))
        for name in debug.split(","):
            log = logging.getLogger(name)
            log.setLevel(logging.DEBUG)
            log.addHandler(handler)
    if sys.argv[1] == "compression":
        return compression(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "admin":
        return admin(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "offsets-topic":
        return offsets_topic(sys.argv[2], sys.argv[3])
    name, bootstrap, prefix, idem = sys.argv[1:5]
    # "no-group": produce and read only (a second run of a client whose
    # group phase an earlier run already covered: kafka-python's takes
    # ~20 s, its long polls delaying every call on the member's thread).
    groups = sys.argv[5:6] != ["no-group"]
    client = CLIENTS[name](bootstrap, idem == "on")
    topic = f"{prefix}-records"
    client.create(topic)
    before = int(time.time() * 1000)
    produced = client.produce(topic, records())
    check(len(produced) == N, f"{len(produced)} of {N} acknowledged")
    for k, v, p, o in produced:
        check(p == partition_of(k), f"key {k} on partition {p}, murmur2 says {partition_of(k)}")
    got = client.read_all(topic, N)
    check(len(got) == N, f"read {len(got)} of {N}")
    check(len({(p, o) for _, _, p, o in got}) == N, "a record read twice")
    check(sorted((k, v) for k, v, _, _ in got) == sorted(records()), "the records read differ from those produced")
    by_key = {}
    for k, v, p, o in sorted(got, key=lambda r: (r[2], r[3])):
        by_key.setdefault(k, []).append(int(v))
    check(all(vs == sorted(vs) for vs in by_key.values()), "a key's records out of order")
    phase = group_phase_threaded if client.threaded else group_phase
    group = phase(client, topic, produced) if groups else None
    times = client.offsets_for_time(topic, before)
    check(all(o == 0 for o in times.values()), f"offsets for a time before the records: {times}")
    later = client.offsets_for_time(topic, int(time.time() * 1000) + 60_000)
    check(all(o in (-1, None) for o in later.values()), f"offsets for a future time: {later}")
    print(json.dumps({"client": name, "produced": N, "read": len(got), "group": group, "ok": True}))


if __name__ == "__main__":
    main()
