"""confluent-kafka (librdkafka) over SASL_PLAINTEXT with OAUTHBEARER: the
token comes from a file through librdkafka's oauth_cb (what an
application with its own identity provider does).

    python oauth.py BOOTSTRAP TOPIC TOKEN_FILE ok|refused

ok: produces one record and reads it back in a group; refused: expects
the broker to refuse the login (librdkafka's authentication error).
Prints one JSON line.
"""

import json
import sys
import time

import confluent_kafka as ck


def main():
    b, topic, token_file, expect = sys.argv[1:5]
    errors = []

    def token(_config):
        with open(token_file) as f:
            return f.read().strip(), time.time() + 300, "weir-test"

    base = {
        "bootstrap.servers": b,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "OAUTHBEARER",
        "oauth_cb": token,
        "error_cb": lambda e: errors.append(e),
    }
    p = ck.Producer({**base, "message.timeout.ms": 10000})
    delivered = []
    p.produce(topic, value=b"oauth-record",
              on_delivery=lambda err, m: delivered.append(err))
    if expect == "refused":
        deadline = time.time() + 15
        while time.time() < deadline and not any(
                e.code() == ck.KafkaError._AUTHENTICATION for e in errors):
            p.poll(0.1)
        auth = [str(e) for e in errors if e.code() == ck.KafkaError._AUTHENTICATION]
        p.purge()
        print(json.dumps({"ok": bool(auth), "errors": auth[:2]}))
        return
    p.flush(20)
    if delivered != [None]:
        print(json.dumps({"ok": False, "delivered": [str(d) for d in delivered],
                          "errors": [str(e) for e in errors]}))
        return
    c = ck.Consumer({**base, "group.id": "oauth-readers",
                     "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got, deadline = [], time.time() + 30
    while "oauth-record" not in got and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value().decode())
    c.close()
    print(json.dumps({"ok": "oauth-record" in got, "got": got,
                      "errors": [str(e) for e in errors][:3]}))


if __name__ == "__main__":
    main()
