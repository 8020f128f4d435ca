"""What the benchmarks share: the real dedup worker as a process, a paced load, a dedup store
built directly through eopipe.dedup.store, the broker, waiting and progress output."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from eopipe.core.kafkaconf import OFFSETS_NOW
from eopipe.core.names import consumer_group
from eopipe.tools.loadgen import send
from localenv.daemon import free_port

REPO = Path(__file__).resolve().parents[1]
WINDOW_MS = 24 * 3600 * 1000     # the workers run with --window 24h and the default 4 segments
SEGMENTS = 4


def process_tree(root: int) -> list[int]:
    """root and its descendants, from /proc/<pid>/stat's parent ids."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def proc_memory(pid: int) -> dict[str, int]:
    """/proc/<pid>/status memory lines in kB (VmRSS, VmHWM, ...); {} once it exited."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k.startswith("Vm") or k.startswith("Rss"):
                out[k] = int(v.split()[0])
    except (OSError, ValueError):
        pass
    return out


def peak_rss_mb(root: int) -> float:
    """The largest peak RSS (VmHWM) among root's process tree now; 0 once it is gone. Not
    wait4's ru_maxrss: Linux keeps a process's peak across exec, so a child of the benchmark
    reports at least the benchmark's own size when it forked (a preload of 1M records: 365 MB)."""
    return max((proc_memory(pid).get("VmHWM", 0) for pid in process_tree(root)), default=0) / 1024


def json_log(path: Path) -> list[dict]:
    """A worker's structured log lines (one JSON document each), librdkafka's raw lines skipped."""
    docs = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                docs.append(json.loads(line))
            except ValueError:
                pass
    return docs


def python() -> str:
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def say(msg: str) -> None:
    """Progress output: stderr, so stdout stays the table."""
    print(f"  bench: {msg}", file=sys.stderr, flush=True)


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[i]


def positive_ints(text: str) -> tuple[int, ...]:
    """argparse type of a list option (`1,2,4`): integers >= 1, comma separated, no repeats."""
    try:
        values = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma separated integers, got {text!r}") from None
    if min(values) < 1 or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct integers >= 1, got {text!r}")
    return values


def write_json(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def wait(fn, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(interval)
    raise TimeoutError(what)


def create_topics(bootstrap: str, names, partitions: int = 1, replication: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, partitions, replication) for t in names]).values():
        f.result(30)


class Setup:
    """One run of a worker benchmark: a new pipeline name, its 1-partition source, output and
    DLQ topics, and its own work directory."""

    def __init__(self, bootstrap: str, workdir: Path, kind: str, short: str, replication: int = 1):
        run_id = uuid.uuid4().hex[:6]
        self.pipeline = f"{short}{run_id}"
        self.topics = (f"{short}-src-{run_id}", f"{short}-out-{run_id}", f"{short}-dlq-{run_id}")
        create_topics(bootstrap, self.topics, replication=replication)
        self.work = workdir / f"{kind}-{run_id}"
        self.work.mkdir(parents=True, exist_ok=True)


@contextmanager
def broker(workdir: Path, bootstrap: str | None = None):
    """The bootstrap of `bootstrap`, or of a fresh local test broker in workdir (stopped after)."""
    if bootstrap:
        yield bootstrap
        return
    sys.path.insert(0, str(REPO))
    from localenv.kafka import KafkaBroker

    shutil.rmtree(workdir, ignore_errors=True)  # a fresh broker each run
    b = KafkaBroker(workdir)
    b.start()
    try:
        yield b.bootstrap
    finally:
        b.stop()


def node_test(test: str, work: Path, out: Path, nodes: int, env: dict[str, str]) -> dict:
    """A node-tier test run by pytest on a tier of its own (the tier's helpers live with the
    tests), which writes what it measured to `out` once verified: that JSON, or RuntimeError."""
    out.unlink(missing_ok=True)
    # Full JIT for the tier's JVMs (its broker): the suite's C1-only default is for short tests.
    env = {**os.environ, "EOPIPE_NODE_TESTS": "1", "EOPIPE_NODES": str(nodes), "EOPIPE_QUICK_JIT": "0", **env}
    res = subprocess.run([sys.executable, "-m", "pytest", test, "-p", "no:randomly", "-q", "-s",
                          "-p", "no:cacheprovider"], cwd=REPO, env=env, capture_output=True, text=True)
    (work / "pytest.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0 or not out.exists():
        tail = (res.stdout + res.stderr).strip().splitlines()[-5:]
        raise RuntimeError(f"{test} failed (exit {res.returncode}; log {work / 'pytest.log'}): {' | '.join(tail)}")
    return json.loads(out.read_text())


def standalone(prog: str, doc: str, options, table, argv, run, needs_broker: bool = True) -> int:
    """main() of one benchmark run alone (`python -m <prog>`): its `options(parser)` plus
    --bootstrap and --json, a fresh local broker unless --bootstrap, then its table.
    `run(bootstrap, workdir, args)` returns the result; workdir is removed after a success.
    A benchmark that starts a broker of its own (`needs_broker=False`) gets bootstrap None."""
    ap = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    options(ap)
    if needs_broker:
        ap.add_argument("--bootstrap", help="an existing broker (default: start the local test broker)")
    ap.add_argument("--json", type=Path, help="also write the result as JSON here")
    args = ap.parse_args(argv)
    work = REPO / ".work" / "bench" / f"{prog.rsplit('.', 1)[-1]}-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        if not needs_broker:
            result = run(None, work, args)
        else:
            with broker(work / "kafka", args.bootstrap) as bootstrap:
                result = run(bootstrap, work, args)
    except BaseException:
        say(f"work files kept in {work}")
        raise
    shutil.rmtree(work, ignore_errors=True)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


class Worker:
    """`python -m eopipe.dedup` following an assignment file, as a dedup pod runs it."""

    def __init__(self, name: str, bootstrap: str, topics: tuple[str, str, str], assignment: Path, work: Path,
                 pipeline: str, memory_mb: int = 256, extra: tuple[str, ...] = (), env: dict | None = None):
        self.name, self.port = name, free_port()
        self.env = dict(env or {})  # besides the bench's own (e.g. the object store's credentials)
        self.state = work / f"state-{name}"
        self.log = work / f"{name}.log"
        src, out, dlq = topics
        self.cmd = [python(), "-m", "eopipe.dedup", "--bootstrap", bootstrap, "--source-topic", src,
                    "--output-topic", out, "--dlq-topic", dlq, "--pipeline", pipeline, "--namespace", "bench",
                    "--assignment-file", str(assignment), "--pod-name", name, "--state-dir", str(self.state),
                    "--http-port", str(self.port), "--memory-mb", str(memory_mb), "--window", "24h", *extra]
        self.group = consumer_group("bench", pipeline)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        """Starts the process (again: same state directory and port, like a restarted pod)."""
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, cwd=REPO,
                                     env={**os.environ, "EOPIPE_HANDOFF_TIMEOUT_SECONDS": "30",
                                          # the pipeline's token, as the operator gives it to every pod:
                                          # without one, workers refuse state transfer (rebuild only)
                                          "EOPIPE_TOKEN": "bench-token", **self.env})

    def status(self) -> dict:
        try:
            with urllib.request.urlopen(f"{self.url}/status", timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            return {}

    def running(self, p: int, generation: int) -> dict | None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker {self.name} exited with {self.proc.returncode}; see {self.log}")
        st = self.status()
        part = (st.get("partitions") or {}).get(str(p)) or {}
        gen = st.get("generation")
        return part if gen is not None and gen >= generation and part.get("state") == "running" else None

    def metrics(self) -> dict[str, float]:
        """/metrics as {'name{labels}': value}."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def proc_status(self) -> dict[str, int]:
        return proc_memory(self.proc.pid)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def single_owner(path: Path, pod: str) -> None:
    """An assignment file giving partition 0 of a 1-partition source to `pod`."""
    write_json(path, {"generation": 1, "assignments": {pod: [0]}, "partitionCount": 1})


class GroupLag:
    """The dedup group's committed offset on partition 0 of the source, read from Kafka."""

    def __init__(self, bootstrap: str, group: str, topic: str):
        self.tp = TopicPartition(topic, 0)
        conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
        self.c = Consumer({**conf, "isolation.level": "read_committed"})  # high(): the last stable offset
        self.offsets = Consumer({**conf, **OFFSETS_NOW})

    def committed(self, timeout: float = 10) -> int:
        return self.offsets.committed([self.tp], timeout=timeout)[0].offset

    def high(self, timeout: float = 10) -> int:
        return self.c.get_watermark_offsets(self.tp, timeout=timeout, cached=False)[1]

    def lag(self, timeout: float = 10) -> tuple[int, int]:
        """(committed offset, high watermark - committed)."""
        committed = self.committed(timeout)
        return committed, self.high(timeout) - max(committed, 0)

    def close(self) -> None:
        self.offsets.close()
        self.c.close()


# -- the independent check -----------------------------------------------------------------------
def verified(bootstrap: str, source: str, output: str, key: str = "json:id", *, group: str | None = None,
             dlq: str | None = None, stop=None, count_aborted: bool = True, timeout: float = 300) -> dict:
    """eopipe verify over a benchmark's output, once the dedup `group` (if given) committed the
    end of the source: its counts, or RuntimeError if a record was lost or duplicated."""
    from eopipe.core.keys import KeySpec
    from eopipe.tools.verify import verify, wait_for_group

    if group:
        wait_for_group(bootstrap, group, source, 300, **({"stop": stop} if stop else {}))
    rep = verify(bootstrap, source, output, key_spec=KeySpec.parse(key), dlq_topic=dlq, settle=2, timeout=timeout,
                 count_aborted=count_aborted)
    if not rep.ok:
        raise RuntimeError(f"output {output} not exactly-once: {rep.line()} {rep.examples}")
    return {k: getattr(rep, k, None) for k in ("unique_in", "out", "lost", "duplicated", "unexpected",
                                                 "out_of_order", "aborted_reads", "dead_lettered")}


# -- a dedup store built directly ---------------------------------------------------------------
def prebuilt_key(i: int) -> bytes:
    """The i-th key of a pre-built store: a UUID-shaped string like the load generator's ids."""
    h = hashlib.blake2b(i.to_bytes(8, "big"), digest_size=16, key=b"eopipe-bench").hexdigest()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{h[16:20]}-{h[20:]}".encode()


def prebuild_store(state_dir: Path, keys: int, progress=say, batch: int = 200_000) -> float:
    """Writes partition 0's store of a worker with `keys` keys, event times spread over the last
    20 h (inside the 24 h window, so they land in several segments as a day of traffic would),
    through StateStore.apply() as the worker writes it, and applied_offset 0 last.

    A worker trusts that store when its source partition starts at offset 0 and its group has
    no committed offset (a new pipeline): recovery then finds applied_offset == log start and
    neither replays nor rebuilds (worker.py, PartitionRunner._recover). No partition_count is
    written, so the store is not stale for any count. Returns the seconds it took."""
    from eopipe.dedup.store import StateStore

    t0 = time.monotonic()
    store = StateStore(state_dir, window_ms=WINDOW_MS, segment_ms=WINDOW_MS // SEGMENTS)
    try:
        ps = store.open(0)
        now = int(time.time() * 1000)
        span = 20 * 3600 * 1000
        last = time.monotonic()
        for start in range(0, keys, batch):
            end = min(keys, start + batch)
            ps.apply([(prebuilt_key(i), now - span + span * i // keys) for i in range(start, end)], None,
                     now_ms=now)
            if time.monotonic() - last > 10:
                last = time.monotonic()
                progress(f"pre-building the store: {end:,}/{keys:,} keys")
        ps.apply({}, 0, now_ms=now)
    finally:
        store.close()
    return time.monotonic() - t0


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# -- a paced load ---------------------------------------------------------------------------------
class Load(threading.Thread):
    """Produces keyed events at `rate` per second into partition 0 of `topic` until stopped or
    `count` are sent: new events (eopipe.tools.loadgen's), a share of resends of recent ones, and a
    share of re-sends of pre-built keys (`old_keys` > 0): duplicates only the store can catch."""

    def __init__(self, bootstrap: str, topic: str, rate: float, *, count: int | None = None,
                 old_keys: int = 0, old_ratio: float = 0.1, dup_ratio: float = 0.1, seed: int = 7):
        super().__init__(daemon=True)
        self.topic, self.rate, self.count = topic, rate, count
        self.old_keys, self.old_ratio, self.dup_ratio = old_keys, old_ratio, dup_ratio
        self.rng = random.Random(seed)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
        self.halt = threading.Event()
        self.sent = self.old = self.dups = 0
        self.error: BaseException | None = None

    def _next(self, recent: list) -> tuple[bytes, bytes, int]:
        from eopipe.tools.loadgen import _event

        now = int(time.time() * 1000)
        r = self.rng.random()
        if self.old_keys and r < self.old_ratio:
            self.old += 1
            key = prebuilt_key(self.rng.randrange(self.old_keys))
            return key, json.dumps({"id": key.decode(), "ts": now}).encode(), now
        if recent and r < (self.old_ratio if self.old_keys else 0.0) + self.dup_ratio:
            self.dups += 1
            return recent[self.rng.randrange(len(recent))]
        ev = _event(self.rng, self.sent, now, ("id",))
        recent.append(ev)
        del recent[:-1000]
        return ev

    def run(self) -> None:
        recent: list = []
        t0 = time.monotonic()
        try:
            while not self.halt.is_set() and (self.count is None or self.sent < self.count):
                due = int((time.monotonic() - t0) * self.rate)
                if self.count is not None:
                    due = min(due, self.count)
                while self.sent < due:
                    key, value, ts = self._next(recent)
                    send(self.producer, self.topic, key=key, value=value, timestamp=ts, partition=0)
                    self.sent += 1
                self.producer.poll(0)
                time.sleep(0.01)
            if self.producer.flush(60):
                raise RuntimeError("load: records not delivered")
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.error = e

    def stop(self) -> None:
        self.halt.set()
        self.join(90)
        if self.error is not None:
            raise RuntimeError(f"load generator failed: {self.error}") from self.error


class LatencyReader(threading.Thread):
    """Arrival minus source timestamp of every output record (read_committed)."""

    def __init__(self, bootstrap: str, topic: str, t0_epoch: float):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.t0 = bootstrap, topic, t0_epoch
        self.halt, self.seen = threading.Event(), []

    def run(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                      "isolation.level": "read_committed", "enable.auto.commit": False})
        parts = wait(lambda: c.list_topics(self.topic, timeout=5).topics[self.topic].partitions, 120, "output")
        c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
        while not self.halt.is_set():
            # Wake on the first record (a batch call waits for all 500 or the timeout, which
            # would add up to 200 ms to what is measured), then take what is already fetched.
            msgs = c.consume(1, 0.2)
            for m in msgs + c.consume(499, 0) if msgs else ():
                if m.error() is None:
                    ts = m.timestamp()[1] / 1000
                    self.seen.append((ts - self.t0, (time.time() - ts) * 1000))
        c.close()
