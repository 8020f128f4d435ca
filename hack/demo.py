#!/usr/bin/env python3
"""`make demo`: a pipeline end to end with duplicates and faults, then its exactly-once verdict.

Today's stage: a real Kafka broker (KRaft, local process) and dedup workers run as local
processes, the way the dedup StatefulSet's pods run them. While `eopipe load` sends events
with duplicates, one worker is SIGKILLed mid-transaction and restarted, and the broker is
restarted. Then `eopipe verify` reads both topics and the demo exits non-zero unless
lost=0 and duplicated=0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from confluent_kafka.admin import AdminClient  # noqa: E402

from eopipe.assignment import Assignment, assign  # noqa: E402
from eopipe.builders.dedup import worker_args  # noqa: E402
from eopipe.builders.names import Names  # noqa: E402
from eopipe.builders.topics import desired_topics  # noqa: E402
from eopipe.keys import KeySpec  # noqa: E402
from eopipe.loadgen import run_load  # noqa: E402
from eopipe.spec import PipelineSpec  # noqa: E402
from eopipe.topics import ensure_topics  # noqa: E402
from eopipe.verify import verify, wait_for_group  # noqa: E402
from tests.localenv.kafka import KafkaBroker, free_port  # noqa: E402

T0 = time.monotonic()


def say(step: str, msg: str = "") -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {step}{(': ' + msg) if msg else ''}", flush=True)


class Worker:
    """One dedup worker process, as a dedup pod would run it."""

    def __init__(self, name: str, names: Names, bootstrap: str, workdir: Path, assignment: Path, port: int):
        self.name, self.log = name, workdir / f"{name}.log"
        self.cmd = [str(REPO / ".venv" / "bin" / "eopipe"),
                    *worker_args(names, bootstrap=bootstrap, assignment_file=str(assignment),
                                 state_dir=str(workdir / "state" / name), http_port=port),
                    "--pod-name", name]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=30_000, help="records to send (default 30000)")
    ap.add_argument("--rate", type=float, default=3_000, help="records per second (default 3000)")
    ap.add_argument("--workdir", type=Path, default=REPO / ".work" / "demo")
    args = ap.parse_args()

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    kafka = KafkaBroker(args.workdir / "kafka")
    workers: list[Worker] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    try:
        say("1/5 kafka", "starting a single-node KRaft broker")
        kafka.start()
        say("1/5 kafka", f"ready at {kafka.bootstrap}")

        doc = {"kafka": {"bootstrapServers": kafka.bootstrap},
               "source": {"topic": "payments", "partitions": 4},
               "dedup": {"key": {"from": "jsonField", "name": "id"}, "window": "1h", "replicas": 2}}
        names = Names("demo", "payments", PipelineSpec.model_validate(doc))
        report = ensure_topics(AdminClient({"bootstrap.servers": kafka.bootstrap}), desired_topics(names))
        say("2/5 topics", f"created {', '.join(report.created)}")

        pods = [f"payments-dedup-{i}" for i in range(2)]
        assignment = Assignment(1, assign(4, pods))
        assignment_file = args.workdir / "assignment.json"
        assignment_file.write_text(json.dumps(assignment.to_json()))
        workers = [Worker(p, names, kafka.bootstrap, args.workdir, assignment_file, free_port())
                   for p in pods]
        for w in workers:
            w.start()
        say("3/5 dedup", f"{len(workers)} workers, assignment {assignment.to_json()['assignments']}")

        stats: dict = {}
        load = threading.Thread(target=lambda: stats.update(run_load(
            kafka.bootstrap, "payments", args.records, dup_ratio=0.2, wrong_partition_ratio=0.05,
            poison=25, rate=args.rate, seed=7, producer_config={"message.timeout.ms": 120_000})))
        say("4/5 load", f"{args.records} records at {args.rate:.0f}/s, 20% resends, 5% to a wrong partition, 25 malformed")
        load.start()
        duration = args.records / args.rate
        time.sleep(duration * 0.3)
        say("    fault", f"SIGKILL {workers[1].name} mid-transaction")
        workers[1].kill()
        time.sleep(2)
        workers[1].start()
        say("    fault", f"{workers[1].name} restarted: it recovers from its RocksDB state and the committed offsets")
        time.sleep(duration * 0.3)
        say("    fault", "broker restart")
        kafka.restart(kill=True)
        say("    fault", "broker back; transactions resume")
        load.join()
        say("4/5 load", f"sent {stats['records']} ({stats['unique']} unique, {stats['duplicates']} resends)")

        say("4/5 load", "waiting for the dedup workers to drain the source")
        drained = wait_for_group(kafka.bootstrap, names.consumer_group, names.source_topic, timeout=300)
        say("4/5 load", f"drained {drained:.1f}s after the last send")
        say("5/5 verify", "reading source and output with read_committed")
        rep = verify(kafka.bootstrap, names.source_topic, names.deduped_topic,
                     key_spec=KeySpec.parse(names.spec.dedup.key.spec_string()),
                     dlq_topic=names.dlq_topic, settle=5, timeout=300)
        print(rep.line(), flush=True)
        say("done", f"total {time.monotonic() - T0:.0f}s; logs in {args.workdir}")
        return 0 if rep.ok else 1
    except KeyboardInterrupt:
        say("interrupted", "tearing down")
        return 130
    finally:
        for w in workers:
            w.kill(signal.SIGTERM)
        kafka.stop()


if __name__ == "__main__":
    sys.exit(main())
