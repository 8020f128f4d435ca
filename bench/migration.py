"""Handoff of one partition's dedup state: snapshot transfer vs rebuild from the source topic.

One partition holding `keys` unique keys (default 1,000,000) is deduplicated by worker A.
Then, in one run, side by side:
  snapshot  A hands the partition to B: A commits and stops it, checkpoints and packs its
            RocksDB state, serves it; B downloads it (size + sha256 checked), installs it,
            fences A with init_transactions and resumes;
  rebuild   B hands it to C without a snapshot: C rebuilds the state from the source topic
            over the dedup window (what happens when the old owner is gone).
The pause is measured from the moment the new assignment is written until the new owner
reports the partition running (both include the workers' 0.5 s assignment poll); the worker's
own pause (old owner stopped -> new owner running) is shown for the snapshot. MB/s is the
state's size over the pause.

    python -m bench.migration [--keys N]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Worker:
    def __init__(self, name: str, bootstrap: str, topics: tuple[str, str, str], assignment: Path, work: Path,
                 pipeline: str):
        self.name, self.port = name, _free_port()
        self.state = work / f"state-{name}"
        src, out, dlq = topics
        py = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
        self.proc = subprocess.Popen(
            [py, "-m", "eopipe.dedup", "--bootstrap", bootstrap, "--source-topic", src, "--output-topic", out,
             "--dlq-topic", dlq, "--pipeline", pipeline, "--namespace", "bench",
             "--assignment-file", str(assignment), "--pod-name", name, "--state-dir", str(self.state),
             "--http-port", str(self.port), "--memory-mb", "256", "--window", "24h"],
            stdout=open(work / f"{name}.log", "wb"), stderr=subprocess.STDOUT, cwd=REPO,
            env={**os.environ, "EOPIPE_HANDOFF_TIMEOUT_SECONDS": "30"})
        self.url = f"http://127.0.0.1:{self.port}"

    def status(self) -> dict:
        try:
            with urllib.request.urlopen(f"{self.url}/status", timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            return {}

    def running(self, p: int, generation: int) -> dict | None:
        st = self.status()
        part = (st.get("partitions") or {}).get(str(p)) or {}
        gen = st.get("generation")
        return part if gen is not None and gen >= generation and part.get("state") == "running" else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _write(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def _wait(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise TimeoutError(what)


def bench(bootstrap: str, workdir: Path, keys: int = 1_000_000, progress=print) -> list[dict]:
    from eopipe.loadgen import run_load

    run_id = uuid.uuid4().hex[:6]
    topics = (f"mig-src-{run_id}", f"mig-out-{run_id}", f"mig-dlq-{run_id}")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        f.result(30)
    work = workdir / f"migration-{run_id}"
    work.mkdir(parents=True, exist_ok=True)
    progress(f"preloading {keys} unique keys into one partition of {topics[0]}")
    run_load(bootstrap, topics[0], keys, dup_ratio=0.0, wrong_partition_ratio=0.0, seed=5)
    path = work / "assignment.json"
    _write(path, {"generation": 1, "assignments": {"a": [0]}, "partitionCount": 1})
    workers = {n: _Worker(n, bootstrap, topics, path, work, f"mig{run_id}") for n in ("a", "b", "c")}
    rows = []
    try:
        t0 = time.monotonic()
        _wait(lambda: (s := workers["a"].running(0, 1)) and s.get("lag") == 0 and
              (s.get("store") or {}).get("applied_offset", 0) >= keys and s, 1800, "A deduplicated the partition")
        progress(f"A deduplicated {keys} keys in {time.monotonic() - t0:.1f}s")
        _wait(lambda: all(w.status().get("generation") == 1 for w in workers.values()), 120, "workers up")

        # 1. snapshot: a -> b
        t = time.monotonic()
        _write(path, {"generation": 2, "assignments": {"b": [0]}, "partitionCount": 1,
                      "handoffs": {"0": {"from": "a", "url": workers["a"].url}}})
        part = _wait(lambda: workers["b"].running(0, 2), 600, "B running")
        pause = time.monotonic() - t
        mig = part["migration"]
        size = mig["bytes"]
        rows.append({"method": "snapshot", "keys": part["store"]["keys"], "state_mb": size / 1e6,
                     "pause_s": pause, "worker_pause_s": mig["pause_ms"] / 1000,
                     "transfer_s": mig.get("fetch_ms", 0) / 1000, "mb_per_s": size / 1e6 / pause})
        progress(f"snapshot: {rows[-1]}")

        # 2. rebuild: b -> c, no snapshot offered
        t = time.monotonic()
        _write(path, {"generation": 3, "assignments": {"c": [0]}, "partitionCount": 1})
        part = _wait(lambda: workers["c"].running(0, 3), 1800, "C running")
        pause = time.monotonic() - t
        rebuilt = part["store"]["bytes"]
        rows.append({"method": "rebuild", "keys": part["store"]["keys"], "state_mb": rebuilt / 1e6,
                     "pause_s": pause, "worker_pause_s": part["recovery"]["recovery_seconds"],
                     "transfer_s": 0.0, "mb_per_s": rebuilt / 1e6 / pause,
                     "records_replayed": part["recovery"]["replayed"]})
        progress(f"rebuild: {rows[-1]}")
    finally:
        for w in workers.values():
            w.stop()
    return rows


def table(rows: list[dict]) -> str:
    head = f"{'handoff of 1 partition':<24}{'keys':>11}{'state MB':>10}{'pause s':>9}{'worker s':>10}{'MB/s':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['method']:<24}{r['keys']:>11,}{r['state_mb']:>10.1f}{r['pause_s']:>9.2f}"
                     f"{r['worker_pause_s']:>10.2f}{r['mb_per_s']:>8.1f}")
    if len(rows) == 2 and rows[0]["pause_s"] > 0:
        lines.append(f"snapshot is {rows[1]['pause_s'] / rows[0]['pause_s']:.1f}x faster than rebuild")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.migration", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000, help="unique keys in the partition (default 1000000)")
    ap.add_argument("--bootstrap", help="an existing broker (default: start the local test broker)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    work = REPO / ".work" / "bench"
    work.mkdir(parents=True, exist_ok=True)
    say = lambda m: print(f"  bench: {m}", file=sys.stderr, flush=True)  # noqa: E731
    if args.bootstrap:
        rows = bench(args.bootstrap, work, keys=args.keys, progress=say)
    else:
        from tests.localenv.kafka import KafkaBroker

        import shutil

        shutil.rmtree(work / "kafka-migration", ignore_errors=True)  # a fresh broker each run
        broker = KafkaBroker(work / "kafka-migration")
        broker.start()
        try:
            rows = bench(broker.bootstrap, work, keys=args.keys, progress=say)
        finally:
            broker.stop()
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
