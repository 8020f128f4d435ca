"""Dedup workers as processes against a real broker: the topics of one test pipeline, the
workers that serve it, load in the background, and the exactly-once checks."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.common import json_log
from eopipe.core import partitioner
from eopipe.core.kafkaconf import OFFSETS_NOW
from eopipe.core.keys import KeySpec
from eopipe.core.names import consumer_group
from eopipe.dedup.partition import NOT_DIRECT
from eopipe.tools.loadgen import Sender, run_load
from eopipe.tools.verify import TopicReader, transient, verify
from localenv.daemon import free_port

REPO = Path(__file__).resolve().parents[2]
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable


def open_transaction(bootstrap: str, topic: str, partitions: list[int] | None = None) -> bool:
    """Whether some partition of `topic` (of `partitions`, or any) has an open transaction:
    its last stable offset below its high watermark."""
    c_unc = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "isolation.level": "read_uncommitted"})
    c_com = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "isolation.level": "read_committed"})
    try:
        if partitions is None:
            partitions = list(c_unc.list_topics(topic, timeout=10).topics[topic].partitions)
        for p in partitions:
            tp = TopicPartition(topic, p)
            hw = c_unc.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            lso = c_com.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            if lso < hw:
                return True
        return False
    finally:
        c_unc.close()
        c_com.close()


class Pipeline:
    """Topics of one test pipeline and the worker processes that serve it."""

    def __init__(self, bootstrap: str, tmp: Path, partitions: int = 3, name: str | None = None,
                 replication: int = 1, worker_bootstrap: str | None = None):
        self.bootstrap = bootstrap  # the test's own clients: load, drain checks, verify
        self.worker_bootstrap = worker_bootstrap or bootstrap  # the workers' (e.g. through toxiproxy)
        self.tmp = tmp
        self.name = name or f"t{uuid.uuid4().hex[:8]}"
        self.source, self.output, self.dlq = f"{self.name}-src", f"{self.name}-out", f"{self.name}-dlq"
        self.partitions = partitions
        self.namespace = "test"
        # The pipeline's state-endpoint token, given to every worker as a pod gets it from the
        # operator's Secret (env EOPIPE_TOKEN through a secretKeyRef).
        self.token = secrets.token_urlsafe(32)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        rf = replication
        futs = admin.create_topics([NewTopic(self.source, partitions, rf), NewTopic(self.output, 3, rf),
                                    NewTopic(self.dlq, 1, rf)])
        for f in futs.values():
            f.result(30)
        self.workers: list[WorkerProc] = []

    @property
    def group(self) -> str:
        return consumer_group(self.namespace, self.name)

    def worker(self, partitions, state: str = "a", env: dict | None = None, extra: list[str] = ()) -> "WorkerProc":
        w = WorkerProc(self, partitions, self.tmp / f"state-{state}", env or {}, list(extra),
                       log=self.tmp / f"worker-{state}-{len(self.workers)}.log")
        self.workers.append(w)
        return w

    def load(self, count: int, **kw) -> dict:
        return run_load(self.bootstrap, self.source, count, **kw)

    def committed_total(self) -> int:
        """The group's committed source offsets, summed (read directly, not through the worker).
        Asked again while the group coordinator moves or loads (a broker restarted or was cut off)."""
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group, "enable.auto.commit": False,
                      **OFFSETS_NOW})
        deadline = time.monotonic() + 60
        try:
            while True:
                try:
                    got = c.committed([TopicPartition(self.source, p) for p in range(self.partitions)], timeout=30)
                    return sum(max(0, tp.offset) for tp in got)
                except KafkaException as e:
                    if not transient(e) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        finally:
            c.close()

    def committed_and_drained(self) -> bool:
        """True when, for every source partition, nothing committed lies past the group's
        committed offset (read independently of the worker, with read_committed)."""
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                      "enable.auto.commit": False, "isolation.level": "read_committed",
                      "enable.partition.eof": True})
        try:
            tps = [TopicPartition(self.source, p) for p in range(self.partitions)]
            try:
                committed = c.committed(tps, timeout=30)
            except KafkaException as e:
                if transient(e):
                    return False  # the group coordinator is moving or loading (a broker restarted)
                raise
            # A partition with no committed offset is drained only while it has no records.
            unset = [tp for tp in committed if tp.offset < 0]
            if any(c.get_watermark_offsets(tp, timeout=30)[1] > 0 for tp in unset):
                return False
            committed = [tp for tp in committed if tp.offset >= 0]
            if not committed:
                return True
            c.assign(committed)
            pending = {tp.partition for tp in committed}
            deadline = time.monotonic() + 10
            while pending and time.monotonic() < deadline:
                for m in c.consume(100, 0.5):
                    if m.error() is None:
                        return False  # a committed record beyond the committed offset
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
            return not pending
        finally:
            c.close()

    def wait_drained(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for w in self.workers:
                w.assert_not_crashed()
            if self.committed_and_drained():
                return
            time.sleep(0.5)
        raise AssertionError(f"workers did not drain the source in {timeout}s; logs: " + self.stacks_and_tails())

    def stacks_and_tails(self) -> str:
        """Each running worker's thread stacks (faulthandler, into its log), then every log's tail:
        what a test that waited in vain reports."""
        for w in self.workers:
            if w.running:
                w.proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        return "; ".join(w.tail() for w in self.workers if w.proc)

    def verify(self, **kw):
        rep = verify(self.bootstrap, self.source, self.output, key_spec=KeySpec(), dlq_topic=self.dlq,
                     settle=5, timeout=300, **kw)
        print(rep.line())
        return rep

    def stop_all(self) -> None:
        for w in self.workers:
            if w.running:
                w.kill()
        # Every worker test is also one of the direct path (dedup/direct.pyx): none fell back.
        fell_back = [w.log.name for w in self.workers if NOT_DIRECT in w.log.read_text(errors="replace")]
        assert not fell_back, f"{fell_back}: {NOT_DIRECT}"


class WorkerProc:
    def __init__(self, pipe: Pipeline, partitions, state_dir: Path, env: dict, extra: list[str], log: Path):
        self.pipe, self.partitions, self.state_dir, self.env, self.extra = pipe, partitions, state_dir, env, extra
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.starts = 0

    def cmd(self) -> list[str]:
        p = self.pipe
        own = (["--partitions", ",".join(map(str, self.partitions))]
               if not isinstance(self.partitions, Path) else ["--assignment-file", str(self.partitions)])
        return [PYTHON, "-m", "eopipe.dedup", "--bootstrap", p.worker_bootstrap, "--source-topic", p.source,
                "--output-topic", p.output, "--dlq-topic", p.dlq, "--pipeline", p.name,
                "--namespace", p.namespace, *own, "--state-dir", str(self.state_dir),
                "--http-port", str(self.port), "--memory-mb", "32", "--window", "1h", *self.extra]

    def start(self, env: dict | None = None) -> "WorkerProc":
        self.port = free_port()
        self.starts += 1
        with open(self.log, "a") as f:
            f.write(f"--- start {self.starts}\n")
        self._out = open(self.log, "ab")
        # An env value None removes the variable (a worker without a token).
        merged = {**os.environ, "EOPIPE_TOKEN": self.pipe.token, **self.env, **(env or {})}
        self.proc = subprocess.Popen(self.cmd(), stdout=self._out, stderr=subprocess.STDOUT,
                                     env={k: v for k, v in merged.items() if v is not None}, cwd=REPO)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def get(self, path: str, headers: dict | None = None) -> tuple[int, bytes]:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers=headers or {})
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def status(self) -> dict:
        return json.loads(self.get("/status")[1])

    def wait_ready(self, timeout: float = 120) -> "WorkerProc":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.assert_not_crashed()
            try:
                if self.get("/readyz")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"worker not ready in {timeout}s: {self.tail()}")

    def assert_not_crashed(self) -> None:
        if self.proc is not None and self.proc.poll() is not None and self.proc.returncode not in (0, -9, 137):
            raise AssertionError(f"worker exited {self.proc.returncode}: {self.tail()}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self, timeout: float = 60) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)  # its thread stacks, into its log
            time.sleep(1)
            raise AssertionError(f"worker did not stop in {timeout}s after SIGTERM: {self.tail(80)}") from None

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for line in self.get("/metrics")[1].decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def logs(self) -> list[dict]:
        return json_log(self.log)

    def tail(self, n: int = 40) -> str:
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if not ln.startswith("%")]
        return f"{self.log}:\n" + "\n".join(lines[-n:])


def metric_sum(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if re.match(rf"{name}(\{{|$)", k))


def background_load(pipe: Pipeline, count: int, **kw) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run():
        try:
            result.update(pipe.load(count, **kw))
        except BaseException as e:  # noqa: BLE001
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def finish_load(t: threading.Thread, result: dict, timeout: float = 300) -> dict:
    t.join(timeout)
    assert not t.is_alive(), "load did not finish"
    if "error" in result:
        raise result["error"]
    return result


def assert_clean(rep, poison: int = 0) -> None:
    assert rep.lost == 0, rep.line() + f" {rep.examples}"
    assert rep.duplicated == 0, rep.line() + f" {rep.examples}"
    assert rep.unexpected == 0, rep.line()
    assert rep.malformed_in == poison
    assert rep.dead_lettered == poison, rep.line()
    assert rep.ok


def resend_all(pipe: Pipeline) -> int:
    """Re-sends every keyed source record once more, to its home partition (resend_all_to)."""
    return resend_all_to(pipe.bootstrap, pipe.source, pipe.partitions)


def resend_all_to(bootstrap: str, topic: str, partitions: int) -> int:
    """Every keyed record of the topic once more, to its home by the CURRENT count: a worst-case
    redelivery (a key the state forgot shows up as a duplicate in verify). Returns how many."""
    out = Sender(bootstrap, topic)
    seen, n = set(), 0
    for m in TopicReader(bootstrap).read(topic, timeout=120):
        if not m.key() or m.key() in seen:
            continue
        seen.add(m.key())
        out.send(partitioner.murmur2_partition(m.key(), partitions), value=m.value(), key=m.key(),
                 timestamp=m.timestamp()[1])
        n += 1
    out.finish(60)
    return n


def recoveries(w: WorkerProc) -> list[dict]:
    return [d for d in w.logs() if d.get("msg") == "partition running"]
