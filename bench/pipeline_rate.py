"""The pipeline at rate: both stages of examples/payments.yaml together on the node tier (dedup
pods and the Spark stage through the real Kubeflow Spark Operator), under `eopipe load` at each
rate in turn (default 1,000 then 10,000 records/s, 20% resends) for a warm-up (--warmup, then
until both stages have caught up, at most a minute more), then `--seconds` measured (default
180), then drained before the next rate; at the end `eopipe verify` of both
stages (tests/helpers/nodepipes.py), 0 lost and 0 duplicated, or the benchmark fails.

What it reads, all from Kafka or the host, none of it from the code under test:
  latency   a watcher in the tier's network (`watch` below), one read_committed consumer of the
            source, the sink and the Spark stage's commit markers: per unique record, the time
            it appeared in the sink minus its produce time (the source record's timestamp, which
            `eopipe load` sets as it makes the record; a resend keeps the first send's).
            p50/p99/max of the records produced in the measured window, however late they came.
  kept up   per stage its input's rate, the rate it consumed at and its lag: the dedup group's
            committed offsets against the source's ends (bench.node_faults' sampler), the Spark
            stage's read offsets (the `source` ranges of its sink's committed markers) against
            the deduped topic's last stable offsets (the watcher). A stage whose lag grew by more
            than two seconds of its input over the window did not keep up; the rate it reached
            is then the rate it consumed at (bench/pipeline_rate_summary.py). Rates are in offsets:
            the source's also hold the dedup stage's reroutes of records `eopipe load` sent to a
            wrong partition (5%) and their transaction markers, so `sent/s` is the loads' own count.
  CPU       per stage, its pods' cgroup CPU time (cpuacct on the host) over the window, divided
            by the records it consumed there (dedup: source records, resends included; Spark:
            deduped records); the machine's busy cores (/proc/stat), and the load generators'
            and the watcher's and sampler's own (they share the 2 cores with the tier); and where
            the busy cores went: every process's CPU time over the window (/proc), by pod or by
            program, the hypervisor's steal, and what no process accounts for.
  requests  the broker's requests/s by type over the window: its own request meters (JMX),
            read through the JVM's local attach by bench/BrokerRequests.java.
The loads linger 50 ms and the watcher's fetches wait for 64 KiB or 20 ms (LOAD_OPTIONS, watch):
both share the tier's broker and cores, and their requests were most of the broker's work.

The run itself is tests/e2e/test_pipeline_rate.py (the node-tier helpers live with the tests),
run here by pytest with this run's settings. Needs root and no node tier up (`make cluster-down`
first): it starts one of --nodes nodes (default 1: nothing is lost here, and each further node's
agents take a share of the cores), about 2 minutes, plus about 4 minutes per rate and the verify.

    python -m bench.pipeline_rate [--rates 1000,10000] [--seconds 180] [--warmup 20] [--nodes 1] [--trigger 1s] [--spark-cpu 250m] [--executor-cores 1]
    python -m bench.pipeline_rate watch --bootstrap H:P --source T --sink T --deduped T --commits T
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from bench import pipeline_rate_summary as summary
from bench.common import REPO, node_test, positive_ints, say, write_json
from eopipe.core import cliargs

NS, NAME, SRC, SINK = "pipeline-rate", "payments", "payments", "payments-enriched"
EXAMPLE = "examples/payments.yaml"
DUP_RATIO = 0.2
LOAD_PER_PROCESS = 5000  # records/s per `eopipe load` (one Python process paces itself by sleeping)
# librdkafka sends each partition's batch in a ProduceRequest of its own: at its 5 ms linger the two
# loads' 8 partitions were 2,100 of the broker's 3,100 requests/s at 10,000 records/s. A producer
# elsewhere would not spend this machine's cores; 50 ms batches them (a record waits at most that).
LOAD_OPTIONS = ("--kafka-config", "linger.ms=50")
WARMUP_CAP_S = 60       # at most this long after the warm-up for the stages to catch up
TEST = "tests/e2e/test_pipeline_rate.py"
SETTINGS_ENV = "EOPIPE_PIPELINE_RATE"  # the run's settings and where the test writes its result
table = summary.table


# ------------------------------------------------------------------ the watcher (in the tier)

def watch(bootstrap: str, source: str, sink: str, deduped: str, commits: str, interval: float = 1.0) -> None:
    """JSON lines on stdout, one per `interval`, until SIGTERM: {"t", "pairs": [[produced ms,
    seen ms], ...] (new ones), "pending" (records produced but not yet seen in the sink), "read"
    and "ends" (per deduped partition: read up to, per the sink's markers; last stable offset)};
    the last line also has "unmatched": the produced ms of every record never seen."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    conf = {"bootstrap.servers": bootstrap}
    c = Consumer({**conf, "group.id": f"pipeline-rate-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                  "isolation.level": "read_committed",
                  # A fetch answers at 64 KiB or after 20 ms (a record seen at most that late), not
                  # for each new record: its requests are the broker's work on this machine's cores.
                  "fetch.min.bytes": 65536, "fetch.wait.max.ms": 20})
    admin = AdminClient(conf)

    def parts(topic: str) -> list[int]:
        deadline = time.monotonic() + 120
        while True:
            md = c.list_topics(topic, timeout=10).topics.get(topic)
            if md is not None and md.error is None and md.partitions:
                return sorted(md.partitions)
            if time.monotonic() > deadline:
                raise RuntimeError(f"no topic {topic}")
            time.sleep(1)

    # Source and sink from their ends now (the load starts after); the markers from the start.
    tps = [TopicPartition(t, p, c.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1])
           for t in (source, sink) for p in parts(t)]
    c.assign(tps + [TopicPartition(commits, p, OFFSET_BEGINNING) for p in parts(commits)])
    deduped_tps = [TopicPartition(deduped, p) for p in parts(deduped)]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ends: dict[int, int] = {}

    def poll_ends() -> None:  # its own thread: a list_offsets round trip must not delay reading
        nonlocal ends
        while not stop.is_set():
            try:
                got = admin.list_offsets({tp: OffsetSpec.latest() for tp in deduped_tps},
                                         isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=5)
                ends = {tp.partition: f.result().offset for tp, f in got.items()}
            except Exception:  # noqa: BLE001 - a missed sample is a gap
                pass
            stop.wait(interval)
    threading.Thread(target=poll_ends, daemon=True).start()

    produced: dict[bytes, float | None] = {}  # id -> produce ms; None once seen in the sink
    early: dict[bytes, float] = {}            # seen in the sink before its source record was read
    read: dict[int, int] = {}
    pairs: list[tuple[float, float]] = []
    pending, last = 0, time.monotonic()
    print(json.dumps({"t": time.time(), "ready": True}), flush=True)
    while not stop.is_set():
        # Wake on the first record, then take what is fetched already: the clock stops on arrival.
        msgs = c.consume(1, 0.1)
        msgs += c.consume(999, 0) if msgs else []
        now = time.time() * 1000
        for m in msgs:
            if m.error() is not None:
                continue
            topic = m.topic()
            if topic == source:
                key = m.key()
                if key is None or key in produced:  # malformed, or a resend
                    continue
                ts = m.timestamp()[1]
                if key in early:
                    pairs.append((ts, early.pop(key)))
                    produced[key] = None
                else:
                    produced[key] = ts
                    pending += 1
            elif topic == sink:
                key = json.loads(m.value())["id"].encode()
                ts = produced.get(key, -1)
                if ts == -1:
                    early[key] = now
                elif ts is not None:
                    pairs.append((ts, now))
                    produced[key] = None
                    pending -= 1
            else:
                for r in json.loads(m.value()).get("source") or ():
                    if r.get("topic") == deduped:
                        read[r["partition"]] = max(read.get(r["partition"], 0), r["until"])
        if time.monotonic() - last >= interval:
            last = time.monotonic()
            print(json.dumps({"t": time.time(), "pairs": pairs, "pending": pending, "read": read, "ends": ends}),
                  flush=True)
            pairs = []
    print(json.dumps({"t": time.time(), "pairs": pairs, "pending": pending, "read": read, "ends": ends,
                      "unmatched": [ts for ts in produced.values() if ts is not None]}), flush=True)
    c.close()


class Lines:
    """A JSON-lines file a child writes (a file, not a pipe: a full pipe would stop the child),
    read as it grows."""

    def __init__(self, path: Path):
        self.path, self.pos, self.all = path, 0, []

    def new(self) -> list:
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            data = f.read()
        done = data[:data.rfind(b"\n") + 1]  # a line still being written waits for the next call
        self.pos += len(done)
        got = [json.loads(line) for line in done.decode().splitlines() if line.startswith(("{", "["))]
        self.all += got
        return got


# ------------------------------------------------------------------ CPU, from the host

def _cgroup_dirs() -> list[Path]:
    """Each node's pod cgroup root in the cpuacct hierarchy (cgroup v1 here), or in v2's."""
    from localenv.node import running_nodes
    from localenv.node.host import CGROUP_FS, node_cgroup_root

    base = CGROUP_FS / "cpuacct" if (CGROUP_FS / "cpuacct").is_dir() else CGROUP_FS
    return [base / node_cgroup_root(n.cgroup).strip("/") for n in running_nodes()]


def _cgroup_ns(d: Path) -> int:
    if (d / "cpuacct.usage").exists():
        return int((d / "cpuacct.usage").read_text())
    stat = dict(line.split() for line in (d / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) * 1000


def cgroup_cpu(stages: dict[str, str]) -> dict[str, dict[str, int]]:
    """{stage: {pod uid: CPU ns so far}} of the pods `stages` names ({uid: stage}), from their
    cgroups on the host."""
    out: dict[str, dict[str, int]] = {s: {} for s in summary.STAGES}
    for root in _cgroup_dirs():
        for d, subdirs, _ in os.walk(root):
            uid = Path(d).name.removeprefix("pod")
            if uid in stages:
                out[stages[uid]][uid] = _cgroup_ns(Path(d))
                subdirs.clear()
    return out


def cpu_delta(before: dict, after: dict) -> dict[str, int]:
    """ns per stage over the pods present at both ends (a pod made in between is not counted)."""
    return {s: sum(after[s][uid] - ns for uid, ns in before[s].items() if uid in after[s]) for s in before}


def machine_busy() -> tuple[float, float, float]:
    """(busy, all, steal) CPU seconds of the machine so far, from /proc/stat; busy includes the
    hypervisor's steal (time this machine's CPUs were not its own)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]  # guest is in user
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(f) - f[3] - f[4]) / hz, sum(f) / hz, f[7] / hz


_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def _stat(d: Path) -> tuple[str, list[str]]:
    """A process's comm and the fields of /proc/<pid>/stat after it (OSError: it is gone)."""
    head, tail = (d / "stat").read_text().rsplit(")", 1)
    return head.split("(", 1)[1], tail.split()


def processes(pods: dict[str, str]) -> dict[tuple[int, int], summary.Proc]:
    """Every process on the host (the nodes' pods included: they share its process table), by
    (pid, start time): who it is (its pod's name from `pods` {uid: name} when its cgroup is a
    pod's, else summary.program), its own CPU seconds, its reaped children's and its parent."""
    hz, out = os.sysconf("SC_CLK_TCK"), {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):  # gone meanwhile
            comm, f = _stat(d)
            pod = _POD_UID.search((d / "cgroup").read_text())
            if pod:
                uid = pod.group(1).replace("_", "-")
                who = pods.get(uid, f"pod {uid}")
            else:
                who = summary.program(comm, (d / "cmdline").read_bytes().decode(errors="replace").split("\0"))
            out[(int(d.name), int(f[19]))] = (who, (int(f[11]) + int(f[12])) / hz, (int(f[13]) + int(f[14])) / hz,
                                              int(f[1]))
    return out


BROKER_REQUESTS = REPO / "bench" / "BrokerRequests.java"


def broker_pid(properties: Path) -> int | None:
    """The Kafka process started with this properties file last on its command line."""
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if d.name.isdigit() and (d / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")[-1] == bytes(properties):
                return int(d.name)
    return None


def broker_requests(pid: int) -> tuple[float, str]:
    """(when, the broker's request counts as bench/BrokerRequests.java prints them). Run in the
    broker's network namespace: the JMX agent it starts there answers on that loopback only."""
    t0 = time.time()
    res = subprocess.run(["nsenter", "--target", str(pid), "--net", "java", str(BROKER_REQUESTS), str(pid)],
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"{BROKER_REQUESTS.name} exited {res.returncode}: "
                           f"{(res.stderr.strip().splitlines() or ['no output'])[0]}")
    return (t0 + time.time()) / 2, res.stdout


def proc_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (0 for one that is gone)."""
    total, hz = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with contextlib.suppress(OSError):
            f = _stat(Path(f"/proc/{pid}"))[1]
            total += (int(f[11]) + int(f[12])) / hz
    return total


# ------------------------------------------------------------------ the run

def bench(work: Path, rates: tuple[int, ...] = (1000, 10000), seconds: float = 180, warmup: float = 20,
          nodes: int = 1, trigger: str | None = None, spark_cpu: str | None = None,
          executor_cores: int | None = None, progress=say) -> dict:
    """TEST on a tier of its own (it needs the harness's node-tier helpers, which live with the
    tests); what it measured, or RuntimeError (its verify included)."""
    work.mkdir(parents=True, exist_ok=True)
    out = work / "pipeline_rate.json"
    progress(f"pipeline_rate: {TEST} on a {nodes}-node tier of its own, rates {', '.join(map(str, rates))}")
    settings = {"rates": list(rates), "seconds": seconds, "warmup": warmup, "nodes": nodes, "trigger": trigger,
                "spark_cpu": spark_cpu, "executor_cores": executor_cores, "out": str(out)}
    return node_test(TEST, work, out, nodes, {SETTINGS_ENV: json.dumps(settings)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pipeline_rate", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("watch", help="the latency and Spark-progress watcher (runs in the tier's network)")
    for opt in ("bootstrap", "source", "sink", "deduped", "commits"):
        w.add_argument(f"--{opt}", required=True)
    ap.add_argument("--rates", type=positive_ints, default=(1000, 10000), help="records/s, comma separated")
    ap.add_argument("--seconds", type=float, default=180, help="measured seconds per rate (default 180)")
    ap.add_argument("--warmup", type=float, default=20, help="seconds of load before each window (default 20)")
    ap.add_argument("--nodes", type=int, default=1, help="nodes of the tier it starts (default 1)")
    ap.add_argument("--trigger", type=cliargs.duration_seconds, help="the Spark stage's trigger instead of the example's (1s)")
    ap.add_argument("--spark-cpu", help="the Spark driver's and executors' coreRequest instead of the example's (250m)")
    ap.add_argument("--executor-cores", type=cliargs.whole_number_between(1, 64),  # the CRD's bounds
                    help="the Spark executor's cores (task slots, 1 to 64) instead of the example's (1)")
    ap.add_argument("--work", type=Path, default=REPO / ".work" / "bench" / "pipeline_rate")
    ap.add_argument("--json", type=Path, help="also write the result as JSON here")
    args = ap.parse_args(argv)
    if args.cmd == "watch":
        watch(args.bootstrap, args.source, args.sink, args.deduped, args.commits)
        return 0
    result = bench(args.work, args.rates, args.seconds, args.warmup, args.nodes,
                   f"{args.trigger:g}s" if args.trigger else None, args.spark_cpu, args.executor_cores)
    print(table(result))
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
