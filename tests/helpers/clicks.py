"""Clicks for examples/file-sink.yaml, run in the tier: `python -m tests.helpers.clicks BOOTSTRAP
TOPIC COUNT RATE SEED`. Click n has user_id "u-n" (so each output row names its click) and the
header event-id; a share are resent (same header and value), every tenth has no page (the SQL
drops it). Prints JSON: the user_ids the Parquet output must hold, each exactly once."""

from __future__ import annotations

import json
import random
import sys
import time
import uuid

from eopipe.core.partitioner import get
from eopipe.tools.loadgen import Sender


def main(bootstrap: str, topic: str, count: int, rate: float, seed: int) -> dict:
    rng, place = random.Random(seed), get("murmur2")
    out = Sender(bootstrap, topic)
    partitions = len(out.producer.list_topics(topic, timeout=30).topics[topic].partitions)
    sent, expected, t0, n = [], [], time.monotonic(), 0
    while n < count:
        if sent and rng.random() < 0.25:
            eid, value = sent[-1 - rng.randrange(min(len(sent), 200))]
        else:
            i, eid = len(sent), uuid.UUID(int=rng.getrandbits(128)).hex
            page = None if i % 10 == 9 else f"/p{i % 7}"
            value = json.dumps({"page": page, "user_id": f"u-{i}", "ts": 1763760000 + i}).encode()
            if page is not None:
                expected.append(f"u-{i}")
            sent.append((eid, value))
        out.send(place(eid.encode(), partitions), key=eid.encode(), value=value, headers=[("event-id", eid.encode())])
        n += 1
        if (ahead := n / rate - (time.monotonic() - t0)) > 0:
            time.sleep(ahead)
    out.finish()
    return {"records": n, "clicks": len(sent), "expected": expected}


if __name__ == "__main__":
    b, t, c, r, s = sys.argv[1:]
    print(json.dumps(main(b, t, int(c), float(r), int(s))))
