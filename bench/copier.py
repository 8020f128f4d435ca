"""The baseline of the dedup benchmark: a plain at-least-once consume -> produce copier.

Same client library and batch sizes as the dedup worker; no dedup, no transactions: records
are produced, the producer is flushed, then the consumed offsets are committed.
"""

from __future__ import annotations

import argparse
import signal
import sys

from confluent_kafka import Consumer, Producer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--batch", type=int, default=5000)
    args = ap.parse_args(argv)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         # the dedup worker's setting, so neither idles on a full queue
                         "fetch.queue.backoff.ms": 10})
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5,
                         "enable.idempotence": True})
    consumer.subscribe([args.source])
    while not stop:
        msgs = consumer.consume(args.batch, timeout=0.1)
        if not msgs:
            continue
        for m in msgs:
            if m.error():
                continue
            while True:
                try:
                    producer.produce(args.output, key=m.key(), value=m.value(), headers=m.headers(),
                                     timestamp=m.timestamp()[1], partition=m.partition())
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.flush()
        consumer.commit(asynchronous=False)
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
