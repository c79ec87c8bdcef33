"""Kafka transactions against Weir with an unchanged client.

    transactions.py CLIENT BOOTSTRAP TOPIC [ctp|timeout|ctp-kill]

CLIENT: confluent-kafka (librdkafka). On TOPIC (created here, 4
partitions): a transactional producer commits 100 records, aborts 100,
commits 50; a read_committed consumer then sees exactly the 150 committed
ones, a read_uncommitted one all 250. A second instance with the same
transactional id fences the first: the first's open transaction is
aborted, its commit fails as fenced, and nothing it wrote is visible
committed; the second commits. Prints one line per check; exits non-zero
on the first failure.

With `ctp`, instead: a consume-transform-produce loop. TOPIC-in (4
partitions, 2 000 plain records) is read by a read_committed group member
that writes each record transformed to TOPIC-out inside a transaction of
up to 100 records, with the consumed offsets sent to the transaction
(send_offsets_to_transaction); every third transaction is aborted (its
output and offsets roll back and are read again). Then TOPIC-out read
committed holds every input record's output exactly once, and the
group's committed offsets are the input's end offsets.

With `ctp-kill`: 20 000 records through consume-transform-produce in
transactions of up to 500, the worker process SIGKILLed three times
inside a transaction and restarted with the same transactional id; then
every input record's output exactly once, read committed.

With `timeout`: a producer process dies with its transaction open; the
coordinator aborts it after its 2 s timeout and read_committed's last
stable offsets pass the abort markers.

With `hang WEIR NATIVE`: a producer process dies with its transaction open
(timeout 10 minutes); `weir txn list|describe|producers` (the `weir`
binary WEIR against the native listener NATIVE) and kafka-python's admin
(ListTransactions, DescribeTransactions, DescribeProducers) show it
Ongoing on its partitions, holding the last stable offsets; `weir txn
abort` ends it at once (the last stable offsets pass its abort markers,
nothing of it is visible read_committed) and a second abort is refused.
"""

import os
import sys
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

client, bootstrap, topic = sys.argv[1], sys.argv[2], sys.argv[3]
mode = sys.argv[4] if len(sys.argv) > 4 else "basic"
assert client == "confluent-kafka", client
PARTITIONS = 4
DEADLINE_S = 60


T0 = time.monotonic()


def check(cond, what):
    at = f"[{time.monotonic() - T0:.1f}s]"
    if not cond:
        print(f"FAIL {at} {what}", flush=True)
        sys.exit(1)
    print(f"ok {at} {what}", flush=True)


def create(name=None):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(name or topic, PARTITIONS, 1)])
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


def read(isolation, expect, name=None):
    """Every value of the topic as a consumer with `isolation` sees it,
    read until `expect` values arrived and the end of every partition was
    reached (or the deadline)."""
    name = name or topic
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{name}-{isolation}-{time.monotonic_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    c.assign([TopicPartition(name, p, 0) for p in range(PARTITIONS)])
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


def high(isolation):
    """Each partition's end as a consumer of `isolation` sees it (the
    last stable offset read_committed, the high watermark else)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-w", "isolation.level": isolation})
    h = [c.get_watermark_offsets(TopicPartition(topic, q), 30)[1] for q in range(PARTITIONS)]
    c.close()
    return h


def ctp_input(n):
    """The topics of a consume-transform-produce run, `n` plain records in
    its input: (input, output, group)."""
    src, dst, group = f"{topic}-in", f"{topic}-out", f"{topic}-ctp"
    create(src)
    create(dst)
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        plain.produce(src, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % PARTITIONS)
    plain.flush(30)
    return src, dst, group


def ctp():
    n = 2000
    src, dst, group = ctp_input(n)
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    c.subscribe([src])
    p = producer(f"{topic}-ctp-tx")
    done, txns, aborted = 0, 0, 0
    deadline = time.monotonic() + 120
    while done < n and time.monotonic() < deadline:
        msgs = [m for m in c.consume(100, 1.0) if not m.error()]
        if not msgs:
            continue
        p.begin_transaction()
        for m in msgs:
            p.produce(dst, key=m.key(), value=b"t-" + m.value(), partition=m.partition())
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
        txns += 1
        if txns % 3 == 0:
            p.abort_transaction(30)
            aborted += 1
            # Read the aborted records again: back to the committed offsets.
            for tp in c.committed(c.assignment(), 30):
                c.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))
            continue
        p.commit_transaction(30)
        done += len(msgs)
    check(done == n, f"consumed, transformed and committed {done} of {n} in {txns} transactions ({aborted} aborted)")
    committed = c.committed([TopicPartition(src, q) for q in range(PARTITIONS)], 30)
    ends = [c.get_watermark_offsets(TopicPartition(src, q), 30)[1] for q in range(PARTITIONS)]
    check([tp.offset for tp in committed] == ends, f"the group's offsets {[tp.offset for tp in committed]} are the input's ends ({ends})")
    c.close()
    out = read("read_committed", n, dst)
    check(len(out) == n and len(set(out)) == n, f"read_committed output holds {len(out)} records, {len(set(out))} distinct")
    check(set(out) == {f"t-v{i}" for i in range(n)}, "every input record's output exactly once")
    print("done", flush=True)
    sys.exit(0)


def dead_producer(tid, timeout_ms):
    """A child process opens a transaction of 20 records over the
    partitions and dies without ending it."""
    import subprocess
    code = (
        "from confluent_kafka import Producer\n"
        f"p = Producer({{'bootstrap.servers': {bootstrap!r}, 'transactional.id': {tid!r},"
        f" 'transaction.timeout.ms': {timeout_ms}}})\n"
        "p.init_transactions(30)\n"
        "p.begin_transaction()\n"
        f"[p.produce({topic!r}, value=b'dead%d' % i, partition=i % {PARTITIONS}) for i in range(20)]\n"
        "p.flush(30)\n"
        "import os; os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def timeout():
    """A producer that dies with its transaction open: the coordinator
    aborts it after transaction.timeout.ms and the last stable offset
    moves past it; the records stay invisible to read_committed."""
    import os
    create()
    dead_producer(topic + "-dead", 2000)
    written = high("read_uncommitted")
    check(high("read_committed") != written, "the dead producer's transaction holds the last stable offset")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and high("read_committed") != [w + 1 for w in written]:
        time.sleep(0.2)
    stable = high("read_committed")
    check(stable == [w + 1 for w in written],
          f"aborted after its timeout: the last stable offsets {stable} passed the abort markers ({written} + 1)")
    check(read("read_committed", 0) == [], "nothing of the dead producer's transaction is visible")
    print("done", flush=True)
    sys.exit(0)


def hang(weir, native):
    import subprocess
    from kafka import KafkaAdminClient
    from kafka.structs import TopicPartition as KTp
    create()
    tid = topic + "-hung"
    dead_producer(tid, 600000)
    written = high("read_uncommitted")
    check(high("read_committed") == [0] * PARTITIONS, "the hanging transaction holds the last stable offsets at 0")

    def weir_txn(*args, ok=True):
        r = subprocess.run([weir, "txn", *args, "--bootstrap", native], capture_output=True, text=True, timeout=60)
        check((r.returncode == 0) == ok, f"weir txn {' '.join(args)} exits {r.returncode}: {r.stdout}{r.stderr}")
        return r.stdout + r.stderr

    out = weir_txn("list")
    row = next((r for r in (l.split() for l in out.splitlines()) if r and r[0] == tid), None)
    check(row is not None and row[3] == "Ongoing" and row[5] == str(PARTITIONS),
          f"weir txn list shows {tid} Ongoing on {PARTITIONS} partitions: {row}")
    out = weir_txn("list", "--state", "CompleteCommit")
    check(tid not in out, "weir txn list --state filters")
    out = weir_txn("describe", tid)
    check("Ongoing" in out and f"{topic}-3" in out and "600000 ms" in out, "weir txn describe names its state, partitions, timeout")
    out = weir_txn("producers", topic, "0")
    rows = [l.split() for l in out.splitlines()[1:]]
    check(len(rows) == 1 and rows[0][4] == "0", f"weir txn producers shows the open transaction from offset 0: {rows}")

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    listed = [t for per_node in admin.list_transactions().values() for t in per_node]
    mine = [t for t in listed if t.transactional_id == tid]
    check(len(mine) == 1 and mine[0].state == "Ongoing", f"kafka-python ListTransactions: {mine}")
    longer = [t for n in admin.list_transactions(duration_filter_ms=3_600_000).values() for t in n]
    check(longer == [], f"ListTransactions v1's duration filter: none open for an hour ({longer})")
    d = admin.describe_transactions([tid])[tid]
    check(d.state == "Ongoing" and d.transaction_timeout_ms == 600000
          and d.topic_partitions == {KTp(topic, q) for q in range(PARTITIONS)},
          f"kafka-python DescribeTransactions: {d}")
    ps = admin.describe_producers([KTp(topic, 1)])[KTp(topic, 1)].active_producers
    check(len(ps) == 1 and ps[0].current_transaction_start_offset == 0 and ps[0].producer_id == d.producer_id,
          f"kafka-python DescribeProducers: {ps}")
    try:
        admin.describe_transactions(["no-such-id"])
        check(False, "an unknown transactional id is refused")
    except Exception as e:
        check("TransactionalIdNotFound" in type(e).__name__, f"an unknown transactional id is refused ({type(e).__name__})")

    out = weir_txn("abort", tid)
    check("aborted" in out, f"weir txn abort: {out.strip()}")
    stable = high("read_committed")
    check(stable == [w + 1 for w in written],
          f"aborted at once: the last stable offsets {stable} passed the abort markers ({written} + 1)")
    check(read("read_committed", 0) == [], "nothing of the hanging transaction is visible")
    out = weir_txn("abort", tid, ok=False)
    check("InvalidTxnState" in out, f"a second abort is refused: {out.strip()}")
    out = weir_txn("describe", tid)
    check("CompleteAbort" in out, "weir txn describe shows it CompleteAbort")
    admin.close()
    print("done", flush=True)
    sys.exit(0)


def ctp_worker():
    """One instance of a consume-transform-produce application (assigned
    partitions, no group membership): resumes from the group's committed
    offsets, transforms in transactions of up to 500 records, and says
    `begun` with each transaction open (then waits 0.2 s before its
    commit, so that a kill lands inside it) and `committed N` after it."""
    src, dst, group = f"{topic}-in", f"{topic}-out", f"{topic}-ctp"
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    # init_transactions first (KIP-447's order): it fences the previous
    # instance and aborts its open transaction, whose offsets would
    # otherwise stay pending (a read_committed committed() waits on them).
    p = producer(f"{topic}-ctp-tx")
    tps = [TopicPartition(src, q) for q in range(PARTITIONS)]
    start = c.committed(tps, 30)
    c.assign([TopicPartition(src, t.partition, t.offset if t.offset >= 0 else 0) for t in start])
    ends = [c.get_watermark_offsets(t, 30)[1] for t in tps]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = [c.position([TopicPartition(src, q)])[0].offset for q in range(PARTITIONS)]
        if all(d >= e for d, e in zip(done, ends)):
            break
        msgs = [m for m in c.consume(500, 1.0) if not m.error()]
        if not msgs:
            continue
        p.begin_transaction()
        for m in msgs:
            p.produce(dst, key=m.key(), value=b"t-" + m.value(), partition=m.partition())
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
        print("begun", flush=True)
        time.sleep(0.2)
        p.commit_transaction(30)
        print(f"committed {len(msgs)}", flush=True)
    c.close()
    print("finished", flush=True)
    sys.exit(0)


def ctp_kill():
    """Consume-transform-produce of 20 000 records whose worker process is
    SIGKILLed three times inside a transaction and started again with the
    same transactional id: read_committed, the output holds every input
    record exactly once, and the group's offsets are the input's ends."""
    import signal
    import subprocess
    n = 20000
    src, dst, group = ctp_input(n)
    worker = [sys.executable, __file__, client, bootstrap, topic, "ctp-worker"]
    kills = 0
    for _ in range(3):
        w = subprocess.Popen(worker, stdout=subprocess.PIPE, text=True)
        committed = 0
        for line in w.stdout:
            if line.startswith("committed"):
                committed += 1
            elif line.startswith("begun") and committed >= 2:
                os.kill(w.pid, signal.SIGKILL)
                kills += 1
                break
            elif line.startswith("finished"):
                break
        w.wait(60)
    check(kills == 3, f"the worker was killed inside a transaction {kills} times")
    w = subprocess.run(worker, stdout=subprocess.PIPE, text=True, timeout=180)
    check(w.returncode == 0 and "finished" in w.stdout, "the last worker finished")
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed"})
    committed = c.committed([TopicPartition(src, q) for q in range(PARTITIONS)], 30)
    ends = [c.get_watermark_offsets(TopicPartition(src, q), 30)[1] for q in range(PARTITIONS)]
    c.close()
    check([t.offset for t in committed] == ends, f"the group's offsets {[t.offset for t in committed]} are the input's ends {ends}")
    out = read("read_committed", n, dst)
    check(len(out) == n and set(out) == {f"t-v{i}" for i in range(n)},
          f"read_committed output holds every input record exactly once ({len(out)} records, {len(set(out))} distinct)")
    print("done", flush=True)
    sys.exit(0)


if mode == "ctp":
    ctp()
if mode == "timeout":
    timeout()
if mode == "ctp-worker":
    ctp_worker()
if mode == "ctp-kill":
    ctp_kill()
if mode == "hang":
    hang(sys.argv[5], sys.argv[6])

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
# While it is open, read_committed ends at the last stable offset.
stable, written = high("read_committed"), high("read_uncommitted")
check(all(s_ < w for s_, w in zip(stable, written)),
      f"an open transaction holds the last stable offsets {stable} below the high watermarks {written}")
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

# KIP-447: offsets pending in an open transaction are unstable to a
# read_committed consumer (librdkafka asks OffsetFetch with require_stable
# and retries), visible to others as the offsets before it.
group = f"{topic}-stable"


def committed_as(isolation, timeout):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": isolation,
                  "enable.auto.commit": False})
    try:
        return c.committed([TopicPartition(topic, 0)], timeout)[0].offset
    except KafkaException as e:
        return e.args[0]
    finally:
        c.close()


meta = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
p = producer(f"{topic}-stable")
p.begin_transaction()
p.send_offsets_to_transaction([TopicPartition(topic, 0, 7)], meta.consumer_group_metadata(), 30)
pending = committed_as("read_committed", 3)
check(isinstance(pending, KafkaError) and pending.code() in (KafkaError.UNSTABLE_OFFSET_COMMIT, KafkaError._TIMED_OUT),
      f"read_committed: offsets pending in a transaction are unstable ({pending})")
check(committed_as("read_uncommitted", 10) < 0, "read_uncommitted: the offsets before the transaction (none)")
p.commit_transaction(30)
check(committed_as("read_committed", 10) == 7, "read_committed: the offsets once the transaction commits")
meta.close()
print("done", flush=True)
