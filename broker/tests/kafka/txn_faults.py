"""Kafka transactions under broker faults (issue 32's acceptance run).

    txn_faults.py BOOTSTRAP TOPIC PARTITIONS TRANSACTIONAL_ID MAX_TXNS MAX_SECONDS
    txn_faults.py BOOTSTRAP TOPIC PARTITIONS read

The first form: one transactional confluent-kafka producer (acks=all,
`transactional.id` fixed) runs transactions k = 0, 1, …: each writes
RECORDS_PER_PARTITION records to every partition (value `t{k}:{i}`,
record i on partition i % PARTITIONS), waits until they are delivered,
then ends the transaction: every 4th is aborted on purpose, the others
committed. It goes on across broker kills, as an application does: an
abortable error aborts the transaction and goes on; a fatal one (fenced,
…) or an end whose outcome stays unknown makes a new producer instance
(init_transactions again, which fences the old one and aborts whatever
it left open). It stops after MAX_TXNS transactions, after MAX_SECONDS,
or when `stop` arrives on standard input.

Standard output, one line per event, flushed at once:

    init N                 producer instance N initialised
    ending K commit|abort  K's records delivered, its end about to be sent
    commit-ok K SECONDS    the client learned K committed, its end took SECONDS
    abort-ok K deliberate SECONDS  the client learned K aborted (on purpose)
    abort-ok K after ERR   … after ERR made it abort
    failed K ERR           K's outcome is unknown to the client
    done COMMITTED ABORTED FAILED

Every transaction begun gets exactly one of the last four lines.

The second form reads TOPIC to its end twice, read_committed and
read_uncommitted, once no transaction holds the last stable offset
below the high watermark (waits for that), and prints each record seen as
`rc|ru PARTITION OFFSET VALUE`, then `ends rc [..] ru [..]` and `done`.
"""

import os
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

bootstrap, topic, partitions = sys.argv[1], sys.argv[2], int(sys.argv[3])
RECORDS_PER_PARTITION = 3
# How long an end (commit or abort) is retried while its errors are
# retriable: past a failover of the coordinator.
END_S = 30
# How long the records of a transaction may take to be delivered.
FLUSH_S = 30


def say(line):
    sys.stdout.write(line.replace("\n", " ") + "\n")
    sys.stdout.flush()


def err_of(e):
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        return e.args[0]
    return None


def describe(e):
    err = err_of(e)
    return str(err if err is not None else e).replace(" ", "_")[:200]


class Unknown(Exception):
    """The transaction's outcome is unknown: a new instance is needed."""


def new_producer(tid, deadline, instance):
    """A new instance of the application's producer, initialised (which
    fences the previous one and aborts what it left open)."""
    while True:
        p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": tid,
                "acks": "all",
                "linger.ms": 5,
                "transaction.timeout.ms": 20000,
                "message.timeout.ms": 10000,
                # Longer than the coordinator holds an EndTxn (10 s); at
                # most transaction.timeout.ms (librdkafka's rule).
                "socket.timeout.ms": 20000,
                # A killed node comes back within seconds: reconnect soon
                # (librdkafka backs off up to 10 s by default).
                "reconnect.backoff.max.ms": 1000,
            }
            # librdkafka's own account, to standard error (diagnostics).
            | ({"debug": os.environ["WEIR_RDKAFKA_DEBUG"]} if os.environ.get("WEIR_RDKAFKA_DEBUG") else {})
        )
        while True:
            try:
                p.init_transactions(20)
                say(f"init {instance}")
                return p
            except KafkaException as e:
                sys.stderr.write(f"init_transactions: {e}\n")
                if time.monotonic() > deadline + 30:
                    raise
                err = err_of(e)
                if err is None or err.fatal() or not err.retriable():
                    break  # another instance


def end(p, k, commit, deadline):
    """Commits or aborts, retrying retriable errors until `deadline`."""
    while True:
        left = max(1.0, deadline - time.monotonic())
        try:
            if commit:
                p.commit_transaction(left)
            else:
                p.abort_transaction(left)
            return
        except KafkaException as e:
            err = err_of(e)
            if err is not None and err.retriable() and not err.fatal() and time.monotonic() < deadline:
                sys.stderr.write(f"{k}: retrying the {'commit' if commit else 'abort'}: {err}\n")
                continue
            raise


def transaction(p, k):
    """Runs transaction k; the line telling its outcome."""
    commit = k % 4 != 3
    try:
        p.begin_transaction()
        for i in range(RECORDS_PER_PARTITION * partitions):
            p.produce(topic, value=f"t{k}:{i}".encode(), partition=i % partitions)
        left = p.flush(FLUSH_S)
        if left:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{left} records undelivered", txn_requires_abort=True))
        say(f"ending {k} {'commit' if commit else 'abort'}")
        t = time.monotonic()
        end(p, k, commit, t + END_S)
        took = f"{time.monotonic() - t:.3f}"
        return f"commit-ok {k} {took}" if commit else f"abort-ok {k} deliberate {took}"
    except KafkaException as e:
        err = err_of(e)
        if err is not None and err.txn_requires_abort() and not err.fatal():
            try:
                end(p, k, False, time.monotonic() + END_S)
                return f"abort-ok {k} after {describe(e)}"
            except KafkaException as e2:
                raise Unknown(f"{describe(e)}_then_abort:_{describe(e2)}")
        raise Unknown(describe(e))
    except BufferError as e:
        raise Unknown(describe(e))


def run(tid, max_txns, max_s):
    stop = threading.Event()

    def read_stdin():
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=read_stdin, daemon=True).start()
    deadline = time.monotonic() + max_s
    instance = 1
    p = new_producer(tid, deadline, instance)
    counts = {"commit": 0, "abort": 0, "failed": 0}
    k = 0
    while k < max_txns and time.monotonic() < deadline and not stop.is_set():
        try:
            line = transaction(p, k)
            counts["commit" if line.startswith("commit") else "abort"] += 1
            say(line)
        except Unknown as e:
            counts["failed"] += 1
            say(f"failed {k} {e}")
            # A new instance: fences this one, aborts what it left open.
            try:
                p.purge()
            except KafkaException:
                pass
            del p
            instance += 1
            p = new_producer(tid, deadline, instance)
        k += 1
    say(f"done {counts['commit']} {counts['abort']} {counts['failed']}")


def ends(isolation):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-ends", "isolation.level": isolation})
    h = [c.get_watermark_offsets(TopicPartition(topic, q), 30)[1] for q in range(partitions)]
    c.close()
    return h


def read_all(isolation, tag):
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
    c.assign([TopicPartition(topic, q, 0) for q in range(partitions)])
    eof = set()
    deadline = time.monotonic() + 60
    while len(eof) < partitions:
        if time.monotonic() > deadline:
            raise SystemExit(f"{isolation}: no end of partitions {set(range(partitions)) - eof} within 60 s")
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                eof.add(m.partition())
                continue
            raise KafkaException(m.error())
        eof.discard(m.partition())
        say(f"{tag} {m.partition()} {m.offset()} {m.value().decode()}")
    c.close()


def read():
    # Every transaction ended (or timed out and was aborted by the
    # coordinator): the last stable offsets reach the high watermarks.
    deadline = time.monotonic() + 40
    while True:
        rc, ru = ends("read_committed"), ends("read_uncommitted")
        if rc == ru or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    read_all("read_committed", "rc")
    read_all("read_uncommitted", "ru")
    say(f"ends rc {rc} ru {ru}")
    say("done")


if sys.argv[4] == "read":
    read()
else:
    run(sys.argv[4], int(sys.argv[5]), float(sys.argv[6]))
