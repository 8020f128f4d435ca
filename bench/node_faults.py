"""A node lost and a node drained, timed: the node-loss scenario of tests/e2e/test_node_loss.py
(examples/payments.yaml on the node tier's three nodes, duplicated load at 400 records/s, the
node of one of two dedup pods lost, later, with three pods, the node of two of them drained with
`kubectl drain`) run on a tier of its own, and what it measured:
  NotReady         seconds from the loss until the node controller marked the node NotReady
                   (its node-monitor-grace-period, 40 s by default, sets most of it)
  to a live pod    until the lost pod's partitions were given to the live pod (the operator's
                   nodeLoss.thresholdSeconds, 10 s in the test, after NotReady)
  pods Ready       until the lost node's dedup pod ran Ready on a live node (a new pod and claim)
  full rate        until the pipeline was back to full rate: every source partition committed
                   past where the source ended at the loss, and the dedup group's lag back at or
                   below the p95 of its lag before the loss, or one second of the source's rate
                   then if that is more. Goal: 60 s.
  drain pause      the longest time one partition's committed offset stood still while its
                   source had records beyond it, from the drain's start until every dedup pod ran
                   Ready off the drained node. Goal: 1 s.
The lag comes from a sampler in the tier's network (`sample` below) reading the group's
committed offsets and the source's ends from Kafka, as often as two requests allow (every 200 ms
at most; 0.24 s in a CI run here, 0.7 s while other tests loaded the machine): an independent
read, not the operator's or the workers' word. The verdict on the data is the test's: `eopipe verify`
of both stages, 0 lost and 0 duplicated, or the step fails.

Needs root and no node tier up (`make cluster-down` first): it starts one (3 nodes, ~3 min)
and takes it down; about 10 minutes in all.

    python -m bench.node_faults sample --bootstrap HOST:PORT --group G --topic T   (the sampler)
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from bench.common import REPO, node_test, say

TEST = "tests/e2e/test_node_loss.py"
OUT_ENV = "EOPIPE_NODE_FAULTS_OUT"  # where the test writes what it measured


def sample(bootstrap: str, group: str, topic: str, interval: float) -> None:
    """JSON lines [t, committed, ends] on stdout every `interval` s, until SIGTERM: one request
    for the group's offsets and one for the partitions' ends, so a sample costs two round trips."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    from eopipe.core.kafkaconf import OFFSETS_NOW

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, **OFFSETS_NOW})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    tps = [TopicPartition(topic, p) for p in sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)]
    while not stop:
        t = time.time()
        try:
            committed = [tp.offset for tp in c.committed(tps, timeout=5)]
            ends = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, request_timeout=5)
            ends = [ends[tp].result().offset for tp in tps]
        except Exception:  # noqa: BLE001 - a missed sample is a gap, not the end of the run
            continue
        print(json.dumps([t, committed, ends]), flush=True)
        time.sleep(max(0.0, interval - (time.time() - t)))
    c.close()


def bench(work: Path, progress=say) -> dict:
    """The test run on a tier of its own; what it measured (its JSON), or RuntimeError."""
    progress(f"node faults: {TEST} on a 3-node tier of its own (about 10 minutes)")
    out = work / "node_faults.json"
    return node_test(TEST, work, out, 3, {OUT_ENV: str(out)})


def table(result: dict) -> str:
    rows = [("node loss: NotReady", result["not_ready_s"], "node controller's grace period"),
            ("node loss: partitions to a live pod", result["moved_s"],
             f"operator threshold {result['threshold_s']:.0f} s"),
            ("node loss: pod Ready on a live node", result["pods_ready_s"], "a new pod and claim"),
            ("node loss: back to full rate", result["full_rate_s"],
             f"goal 60 s; lag back under {result['lag_bound'] or 0:.0f} records ({result['lag_at_end']} at the end)"),
            ("drain: longest partition pause", result["drain_pause_s"], "goal 1 s"),
            ("drain: kubectl drain done", result["drain_s"], "")]
    head = f"node faults (3 nodes, {result['rate']} records/s)"
    lines = [f"{head:<40} {'seconds':>8}  notes (a sample every {result['sample_every_s']:.2f} s)"]
    lines += [f"{name:<40} {'-' if v is None else f'{v:.1f}':>8}  {notes}" for name, v, notes in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.node_faults", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    s = sub.add_parser("sample", help="the lag sampler (runs in the tier's network)")
    s.add_argument("--bootstrap", required=True)
    s.add_argument("--group", required=True)
    s.add_argument("--topic", required=True)
    s.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--work", type=Path, default=REPO / ".work" / "bench" / "node_faults")
    args = ap.parse_args(argv)
    if args.cmd == "sample":
        sample(args.bootstrap, args.group, args.topic, args.interval)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    print(table(bench(args.work)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
