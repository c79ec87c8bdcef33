"""Tiered storage read back by an unchanged client (confluent-kafka):

    tiered.py BOOTSTRAP TOPIC COUNT TIMESTAMP

Reads partition 0 of TOPIC from offset 0 up to COUNT records — most of
them from the remote tier — checking each record's offset against its
whole value (`{offset:08}-` padded to 1000 bytes with one letter, written
by the test through the Weir SDK) and every batch's CRC, then
asks offsets-for-times for TIMESTAMP. Prints `read N`, `ts OFFSET` and
`done`.
"""
import sys

from confluent_kafka import Consumer, TopicPartition

bootstrap, topic, count, ts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = Consumer({
    "bootstrap.servers": bootstrap,
    "group.id": "tiered-reader",
    "enable.auto.commit": False,
    "fetch.max.bytes": 4 << 20,
    "check.crcs": True,
})
c.assign([TopicPartition(topic, 0, 0)])
seen = 0
while seen < count:
    msgs = c.consume(num_messages=1000, timeout=30)
    if not msgs:
        sys.exit(f"no records after {seen}")
    for m in msgs:
        if m.error():
            sys.exit(f"error at {seen}: {m.error()}")
        want = f"{m.offset():08}-".encode()
        want += bytes([ord("a") + m.offset() % 26]) * (1000 - len(want))
        if m.offset() != seen or m.value() != want:
            sys.exit(f"record at {m.offset()} (expected {seen}): {m.value()[:20]!r}")
        seen += 1
        if seen == count:
            break
print(f"read {seen}")
found = c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=30)
print(f"ts {found[0].offset}")
c.close()
print("done")
