"""Share groups (KIP-932) against Weir with an unchanged client:
confluent-kafka's ShareConsumer (librdkafka's preview).

    share.py BOOTSTRAP TOPIC all|acks|poison|kill

TOPIC is created here with 2 partitions (the broker must start share
groups at the log's start: `--share-auto-offset-reset earliest`).

all: 20 000 records; 8 share consumers (one instance per thread, implicit
acknowledgement) of one group read them: every record delivered exactly
once across the members, and more than one member got records.

acks: 2 000 records; 4 members acknowledge explicitly: each record whose
value is a multiple of 7 is RELEASEd the first time it is seen (it comes
back, to any member, with delivery count 2, and is then accepted), each
multiple of 11 (not of 7) is REJECTed (never delivered again), the rest
ACCEPTed. Then every record not rejected was accepted exactly once.

poison: 10 records, one of them released by every member every time: it
is delivered exactly delivery.count.limit (5) times, then archived —
never delivered again — while the other 9 are accepted once.

restart-1 PATH / restart-2 PATH (the broker SIGKILLed and restarted in
between): acknowledgements survive the crash — a member accepts 400 of
1 000 records and holds more; after the restart the others are each
delivered exactly once and none of the 400 again.

produce N: only creates TOPIC (2 partitions) and writes values 0..N-1
(records the Weir SDK's share consumers then read).

read N: TOPIC was written by the Weir SDK (values 0..N-1): 4 share
consumers read every value exactly once.

kill: 1 000 records; a member in another process acquires records and is
SIGKILLed holding them (explicit mode, nothing acknowledged); another
member gets them once their lock expires (the broker runs with a short
`--group-share-record-lock-duration-ms`), delivery count 2, and every
record is accepted exactly once in the end.

Prints one line per check; exits non-zero on the first failure.
"""

import os
import signal
import subprocess
import sys
import threading
import time

from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, NewTopic


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        sys.exit(1)


def setup(bootstrap, topic, n):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result()
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=str(i).encode(), partition=i % 2)
    check(p.flush(30) == 0, f"{n} records written to {topic}")


def member(bootstrap, group, topic, explicit=False):
    conf = {"bootstrap.servers": bootstrap, "group.id": group}
    if explicit:
        conf["share.acknowledgement.mode"] = "explicit"
    c = ShareConsumer(conf)
    c.subscribe([topic])
    return c


def run_members(n, body, seconds):
    """Runs body(i) in n threads; returns once all end (each bounded)."""
    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
        check(not t.is_alive(), "a member thread ended")


def all_accept(bootstrap, topic):
    n = 20_000
    setup(bootstrap, topic, n)
    lock = threading.Lock()
    got = []
    by_member = [0] * 8
    trace = []

    def body(i):
        c = member(bootstrap, "share-all", topic)
        deadline = time.time() + 60
        while time.time() < deadline:
            for m in c.poll(0.5):
                if m.error():
                    print("error", m.error(), flush=True)
                    continue
                with lock:
                    got.append(int(m.value()))
                    by_member[i] += 1
                    trace.append((int(m.value()), i, m.delivery_count(), m.partition(), m.offset()))
            with lock:
                if len(got) >= n:
                    break
        # Implicit mode accepts a poll's records at the next poll or
        # commit: close() alone would release the last poll's.
        c.commit_sync()
        c.close()

    run_members(8, body, 60)
    if len(got) != n:
        firsts = {}
        for t in trace:
            if t[0] in firsts:
                print("twice", firsts[t[0]], t, flush=True)
            else:
                firsts[t[0]] = t
    check(len(got) == n, f"{len(got)} deliveries of {n} records")
    check(len(set(got)) == n, f"{len(set(got))} distinct records: each exactly once")
    busy = sum(1 for k in by_member if k > 0)
    check(busy > 1, f"{busy} of 8 members got records ({by_member})")


def acks(bootstrap, topic):
    n = 2_000
    setup(bootstrap, topic, n)
    lock = threading.Lock()
    seen = {}  # value -> deliveries seen
    accepted = []
    rejected = []
    released = set()

    def body(i):
        c = member(bootstrap, "share-acks", topic, explicit=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            msgs = c.poll(0.5)
            for m in msgs:
                if m.error():
                    print("error", m.error(), flush=True)
                    continue
                v = int(m.value())
                with lock:
                    seen[v] = seen.get(v, 0) + 1
                    if v % 7 == 0 and v not in released:
                        released.add(v)
                        t = AcknowledgeType.RELEASE
                    elif v % 11 == 0 and v % 7 != 0:
                        rejected.append(v)
                        t = AcknowledgeType.REJECT
                    else:
                        if v % 7 == 0:
                            check(m.delivery_count() >= 2,
                                  f"released {v} back with delivery count {m.delivery_count()}")
                        accepted.append(v)
                        t = AcknowledgeType.ACCEPT
                c.acknowledge(m, t)
            if msgs:
                c.commit_sync()
            with lock:
                if len(accepted) + len(rejected) >= n:
                    break
        c.close()

    run_members(4, body, 60)
    want_rejected = {v for v in range(n) if v % 11 == 0 and v % 7 != 0}
    check(sorted(rejected) == sorted(want_rejected),
          f"{len(rejected)} records rejected once each")
    check(len(accepted) == len(set(accepted)) == n - len(want_rejected),
          f"{len(accepted)} accepted exactly once")
    twice = [v for v in range(0, n, 7) if seen.get(v) != 2]
    check(not twice, f"every released record delivered exactly twice ({twice[:5]})")
    never = [v for v in want_rejected if seen.get(v) != 1]
    check(not never, "no rejected record delivered again")


def poison(bootstrap, topic):
    setup(bootstrap, topic, 10)
    lock = threading.Lock()
    deliveries = {}
    counts = []

    def body(i):
        c = member(bootstrap, "share-poison", topic, explicit=True)
        deadline = time.time() + 20
        while time.time() < deadline:
            msgs = c.poll(0.5)
            for m in msgs:
                v = int(m.value())
                with lock:
                    deliveries[v] = deliveries.get(v, 0) + 1
                    if v == 3:
                        counts.append(m.delivery_count())
                c.acknowledge(m, AcknowledgeType.RELEASE if v == 3 else AcknowledgeType.ACCEPT)
            if msgs:
                c.commit_sync()
            with lock:
                # The poison record's last delivery, then a while to be
                # sure it does not come back.
                if deliveries.get(3, 0) >= 5 and len(deliveries) == 10:
                    break
        # Nothing more for a few polls.
        for _ in range(6):
            for m in c.poll(0.5):
                with lock:
                    deliveries[int(m.value())] = deliveries.get(int(m.value()), 0) + 1
                c.acknowledge(m, AcknowledgeType.ACCEPT)
            c.commit_sync()
        c.close()

    run_members(2, body, 30)
    check(deliveries.get(3) == 5, f"the poison record delivered {deliveries.get(3)} times (limit 5)")
    check(sorted(counts) == [1, 2, 3, 4, 5], f"with delivery counts {sorted(counts)}")
    others = {v: k for v, k in deliveries.items() if v != 3}
    check(len(others) == 9 and all(k == 1 for k in others.values()),
          f"the 9 others accepted once each ({others})")


def holder(bootstrap, topic):
    """The member that gets killed: acquires, prints what, then sleeps."""
    c = member(bootstrap, "share-kill", topic, explicit=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        msgs = c.poll(0.5)
        if msgs:
            print("held " + " ".join(m.value().decode() for m in msgs), flush=True)
            time.sleep(600)
    print("nothing acquired", flush=True)


def kill(bootstrap, topic):
    n = 1_000
    setup(bootstrap, topic, n)
    child = subprocess.Popen([sys.executable, __file__, bootstrap, topic, "holder"],
                             stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    check(line.startswith("held "), f"the doomed member acquired records: {line[:60]!r}")
    held = {int(v) for v in line.split()[1:]}
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    check(True, f"it was SIGKILLed holding {len(held)} records")
    got = []
    counts = {}
    c = member(bootstrap, "share-kill", topic, explicit=True)
    deadline = time.time() + 60
    while time.time() < deadline and len(got) < n:
        msgs = c.poll(0.5)
        for m in msgs:
            v = int(m.value())
            got.append(v)
            counts[v] = m.delivery_count()
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        if msgs:
            c.commit_sync()
    c.close()
    check(len(got) == len(set(got)) == n, f"{len(got)} accepted, each once")
    again = [v for v in held if counts.get(v) != 2]
    check(not again, f"the held records came back once their locks expired, delivery count 2 ({again[:5]})")


def restart_1(bootstrap, topic, path):
    """Before the broker's SIGKILL: 1 000 records; a member accepts at
    least 400 (their values written to PATH) and leaves without a word,
    holding what it acquired after them."""
    n = 1_000
    setup(bootstrap, topic, n)
    c = member(bootstrap, "share-restart", topic, explicit=True)
    accepted = []
    deadline = time.time() + 30
    while time.time() < deadline and len(accepted) < 400:
        msgs = c.poll(0.5)
        for m in msgs:
            accepted.append(int(m.value()))
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        if msgs:
            c.commit_sync()
    # Acquired and never acknowledged: delivered again after the restart.
    held = [int(m.value()) for m in c.poll(2.0)]
    with open(path, "w") as f:
        f.write(" ".join(map(str, accepted)))
    check(len(accepted) >= 400, f"{len(accepted)} accepted, {len(held)} more held")
    print("done", flush=True)
    os._exit(0)


def restart_2(bootstrap, topic, path):
    """After the restart: every record not accepted before is delivered
    exactly once; none accepted before comes back."""
    n = 1_000
    with open(path) as f:
        before = {int(v) for v in f.read().split()}
    got = []
    c = member(bootstrap, "share-restart", topic, explicit=True)
    deadline = time.time() + 30
    while time.time() < deadline and len(got) < n - len(before):
        msgs = c.poll(0.5)
        for m in msgs:
            got.append(int(m.value()))
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        if msgs:
            c.commit_sync()
    # Nothing more comes.
    for m in c.poll(2.0):
        got.append(int(m.value()))
    c.close()
    again = sorted(set(got) & before)
    check(not again, f"no record accepted before the restart came back ({again[:5]})")
    check(len(got) == len(set(got)) == n - len(before),
          f"the {n - len(before)} others delivered exactly once ({len(got)} deliveries)")


def produce_only(bootstrap, topic, n):
    setup(bootstrap, topic, n)


def read_sdk_records(bootstrap, topic, n):
    lock = threading.Lock()
    got = []

    def body(i):
        c = member(bootstrap, "share-read", topic)
        deadline = time.time() + 30
        while time.time() < deadline:
            for m in c.poll(0.5):
                if m.error():
                    continue
                with lock:
                    got.append(int(m.value()))
            with lock:
                if len(got) >= n:
                    break
        c.commit_sync()
        c.close()

    run_members(4, body, 30)
    check(sorted(got) == list(range(n)),
          f"{len(got)} deliveries, {len(set(got))} distinct of the SDK's {n} records")


if __name__ == "__main__":
    if sys.argv[3] in ("produce", "read"):
        {"produce": produce_only, "read": read_sdk_records}[sys.argv[3]](
            sys.argv[1], sys.argv[2], int(sys.argv[4]))
        print("done", flush=True)
        sys.exit(0)
    if sys.argv[3] in ("restart-1", "restart-2"):
        {"restart-1": restart_1, "restart-2": restart_2}[sys.argv[3]](
            sys.argv[1], sys.argv[2], sys.argv[4])
        print("done", flush=True)
        sys.exit(0)
    bootstrap, topic, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    {"all": all_accept, "acks": acks, "poison": poison, "kill": kill, "holder": holder}[mode](
        bootstrap, topic)
    print("done", flush=True)
