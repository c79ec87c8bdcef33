"""confluent-kafka (librdkafka) producing over SASL_PLAINTEXT/SCRAM-SHA-512
for a while, against a broker whose logins expire (KIP-368).

    python reauth.py BOOTSTRAP TOPIC USER PASSWORD SECONDS

Sends one record every 20 ms for SECONDS, waits for every delivery, and
prints one JSON line: records sent, delivered, and the delivery errors.
"""

import json
import sys
import time

import confluent_kafka as ck


def main():
    b, topic, user, password, seconds = sys.argv[1:6]
    errors, delivered = [], [0]

    def done(err, _msg):
        if err:
            errors.append(str(err))
        else:
            delivered[0] += 1

    p = ck.Producer({
        "bootstrap.servers": b,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
        "acks": "all",
    })
    sent, t0 = 0, time.time()
    while time.time() - t0 < float(seconds):
        p.produce(topic, value=f"r{sent}".encode(), on_delivery=done)
        sent += 1
        p.poll(0.02)
    left = p.flush(30)
    print(json.dumps({"sent": sent, "delivered": delivered[0], "left": left,
                      "errors": errors[:5]}))
    sys.exit(0 if delivered[0] == sent and not errors else 1)


if __name__ == "__main__":
    main()
