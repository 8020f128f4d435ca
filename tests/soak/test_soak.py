"""Soak: a randomized nemesis over every fault class the worker tier can meet, with duplicated
load throughout, then heal, drain and the independent verification (docs/design.md#test-tiers).

Three brokers (replication 3, min ISR 2) behind toxiproxy, two dedup workers following an
assignment file as the operator writes it. Every few seconds the nemesis picks a fault:
a worker SIGKILLed or SIGSTOPped past its transaction timeout, a broker killed or paused, the
broker coordinating a worker's transactions killed, the workers' network slowed, cut or reset,
a partition moved to another worker by snapshot handoff, a third worker added or removed, the
source's partitions increased (re-shard). Each fault is healed, and the
time until the group commits past where it stood at the heal is its recovery time.

    make soak DURATION=10m SEED=7          # the report: .work/soak-report.json and a table
    EOPIPE_SOAK_DURATION=3m pytest tests/soak   # the default: 3 minutes (not part of `make test`)
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import time
from pathlib import Path

import pytest

from eopipe.core.assignment import Assignment, Handoff
from eopipe.core.durations import parse_duration
from eopipe.core.names import transactional_id
from tests.helpers.rebalance import reshard, running_at, wait_until, write_assignment
from tests.helpers.workers import Pipeline, assert_clean, background_load, finish_load

TXN_TIMEOUT = 8  # seconds: a pause past it must end in the zombie's fencing
PODS = ("pod-a", "pod-b")
EXTRA = "pod-c"  # the pod a scale-up adds


def _seconds(raw: str) -> float:
    return parse_duration(raw).total_seconds() if not raw.replace(".", "").isdigit() else float(raw)


SECONDS = _seconds(os.environ.get("EOPIPE_SOAK_DURATION") or "3m")
# Setup, drain and verify on top of the soak itself.
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(int(SECONDS) + 900)]


class Soak:
    def __init__(self, pipe: Pipeline, cluster, rng: random.Random):
        self.pipe, self.cluster, self.rng = pipe, cluster, rng
        self.path = pipe.tmp / "assignment.json"
        self.owners = {p: PODS[p % 2] for p in range(pipe.partitions)}
        self.generation = 0
        self.history: tuple = ()  # re-shards so far: every later assignment carries them
        self.workers: dict = {}  # pod -> WorkerProc, running ones only
        self.rows: list[dict] = []
        self.exits: dict[str, int] = {}  # exit statuses after SIGTERM: a clean stop exits 0

    # -- the assignment, written as the operator does: atomically, a generation at a time ----------
    def write(self, handoffs: dict | None = None) -> None:
        self.generation += 1
        write_assignment(self.path, Assignment(self.generation, dict(self.owners), self.pipe.partitions,
                                               handoffs=handoffs or {}, reshards=self.history))

    def add_worker(self, pod: str) -> None:
        self.workers[pod] = self.pipe.worker(
            self.path, state=pod, extra=["--pod-name", pod, "--transaction-timeout", str(TXN_TIMEOUT)]
        ).start().wait_ready()

    def start(self) -> None:
        self.write()
        for pod in PODS:
            self.add_worker(pod)

    def move_to(self, parts: list[int], dst: str) -> None:
        """Moves `parts` to `dst` by snapshot handoff, then finalizes (the handoff entries go)."""
        handoffs = {p: Handoff(self.owners[p], f"http://127.0.0.1:{self.workers[self.owners[p]].port}")
                    for p in parts}
        for p in parts:
            self.owners[p] = dst
        self.write(handoffs)
        for p in parts:
            wait_until(lambda p=p: running_at(self.workers[dst], p, self.generation), what=f"partition {p} at {dst}")
        self.write()

    # -- the faults: each returns what it hit and heals itself before returning --------------------
    def worker_kill(self) -> str:
        pod = self.rng.choice(sorted(self.workers))
        w = self.workers[pod]
        w.kill()
        time.sleep(self.rng.uniform(0.5, 3))
        w.start().wait_ready()
        return pod

    def worker_pause(self) -> str:
        pod = self.rng.choice(sorted(self.workers))
        w = self.workers[pod]
        w.proc.send_signal(signal.SIGSTOP)
        time.sleep(TXN_TIMEOUT + self.rng.uniform(1, 4))
        w.proc.send_signal(signal.SIGCONT)
        return pod

    def broker_kill(self) -> str:
        nid = self.rng.choice(sorted(self.cluster.nodes))
        self.cluster.restart(nid, kill=True, down_seconds=self.rng.uniform(4, 8))  # past its session
        return f"broker {nid}"

    def broker_pause(self) -> str:
        nid = self.rng.choice(sorted(self.cluster.nodes))
        self.cluster.pause(nid)
        time.sleep(self.rng.uniform(2, 6))
        self.cluster.resume(nid)
        return f"broker {nid}"

    def coordinator_kill(self) -> str:
        p = self.rng.randrange(self.pipe.partitions)
        nid = self.cluster.coordinator(transactional_id(self.pipe.namespace, self.pipe.name, p))
        self.cluster.restart(nid, kill=True, down_seconds=5)
        return f"broker {nid} (coordinator of partition {p})"

    def network(self) -> str:
        kind = self.rng.choice(("latency", "blackhole", "reset"))
        for proxy in self.cluster.proxies.values():
            {"latency": lambda px: px.latency(400, 200), "blackhole": lambda px: px.blackhole(),
             "reset": lambda px: px.reset_peer(100)}[kind](proxy)
        time.sleep(self.rng.uniform(3, 8))
        self.cluster.toxiproxy.heal_all()
        return kind

    def move(self) -> str:
        p = self.rng.randrange(self.pipe.partitions)
        src = self.owners[p]
        dst = self.rng.choice([pod for pod in sorted(self.workers) if pod != src])
        self.move_to([p], dst)
        return f"partition {p} {src} -> {dst}"

    def scale(self) -> str:
        """Up: a third pod takes a share by handoff. Down: its partitions go back and it stops."""
        if EXTRA not in self.workers:
            self.add_worker(EXTRA)
            share = self.rng.sample(sorted(self.owners), max(1, self.pipe.partitions // 3))
            self.move_to(share, EXTRA)
            return f"2 -> 3 pods ({EXTRA} takes {share})"
        mine = [p for p, pod in self.owners.items() if pod == EXTRA]
        for p in mine:
            self.move_to([p], self.rng.choice(PODS))
        self.exits[EXTRA + " (scale-down)"] = self.workers.pop(EXTRA).terminate()
        return f"3 -> 2 pods ({EXTRA} gives back {mine})"

    def grow(self) -> str:
        """A partition increase: pause, create, re-shard, resume (the load keeps producing by the
        old count; the workers reroute)."""
        old, new = self.pipe.partitions, self.pipe.partitions + 2
        self.owners, self.history = reshard(self.pipe, self.workers, self.owners, new, self.generation + 1,
                                            self.history)
        self.generation += 3
        return f"partitions {old} -> {new}"

    FAULTS = ("worker_kill", "worker_pause", "broker_kill", "broker_pause", "coordinator_kill", "network", "move",
              "scale", "grow")
    MAX_PARTITIONS = 8

    def recovery_seconds(self, load_running, timeout: float = 120) -> float | None:
        """Seconds from the heal until the group commits past where it stood then; None when the
        load has ended and nothing is left to commit."""
        t0, floor = time.monotonic(), self.pipe.committed_total()
        while time.monotonic() - t0 < timeout:
            if self.pipe.committed_total() > floor:
                return round(time.monotonic() - t0, 1)
            if not load_running() and self.pipe.committed_and_drained():
                return None
            time.sleep(0.5)
        raise AssertionError(f"no progress {timeout}s after healing; " + "; ".join(
            w.tail() for w in self.workers.values()))

    def run(self, seconds: float, load_running, classes: int = 0) -> None:
        """Faults for `seconds`, then on until `classes` fault classes have run (slow broker
        restarts can fill the time), for at most twice as long again."""
        end = time.monotonic() + seconds
        t0 = time.monotonic()
        bag: list[str] = []
        while time.monotonic() < end or (len({r["fault"] for r in self.rows}) < classes
                                         and time.monotonic() < end + 2 * seconds):
            time.sleep(self.rng.uniform(2, 6))
            if not bag:  # every class once per round, in a random order
                bag = self.rng.sample(self.FAULTS, len(self.FAULTS))
            name = bag.pop()
            if name == "grow" and self.pipe.partitions >= self.MAX_PARTITIONS:
                continue
            started = time.monotonic()
            target = getattr(self, name)()
            held = round(time.monotonic() - started, 1)
            rec = self.recovery_seconds(load_running)
            self.rows.append({"at_s": round(started - t0, 1), "fault": name, "target": target,
                              "held_s": held, "recovery_s": rec})
            print(f"soak: {self.rows[-1]}", flush=True)


def report_table(rows: list[dict]) -> str:
    lines = ["| at (s) | fault | target | held (s) | recovery (s) |", "|---|---|---|---|---|"]
    lines += [f"| {r['at_s']} | {r['fault']} | {r['target']} | {r['held_s']} | "
              f"{'-' if r['recovery_s'] is None else r['recovery_s']} |" for r in rows]
    by_kind: dict[str, list[float]] = {}
    for r in rows:
        if r["recovery_s"] is not None:
            by_kind.setdefault(r["fault"], []).append(r["recovery_s"])
    lines += ["", "| fault | count | median recovery (s) | worst recovery (s) |", "|---|---|---|---|"]
    lines += [f"| {k} | {sum(r['fault'] == k for r in rows)} | {round(statistics.median(v), 1)} | {max(v)} |"
              for k, v in sorted(by_kind.items())]
    return "\n".join(lines)


def test_randomized_nemesis_ends_with_zero_lost_and_zero_duplicated(kafka3, tmp_path, pytestconfig):
    seconds = SECONDS
    seed = int(os.environ.get("EOPIPE_SOAK_SEED") or int(time.time()) % 10_000)
    print(f"soak: {seconds:.0f}s, seed {seed} (EOPIPE_SOAK_SEED={seed} repeats the schedule)")
    rng = random.Random(seed)
    pipe = Pipeline(kafka3.direct_bootstrap, tmp_path, partitions=4, replication=3,
                    worker_bootstrap=kafka3.bootstrap)
    soak = Soak(pipe, kafka3, rng)
    try:
        soak.start()
        rate = 300
        t, res = background_load(pipe, int(rate * seconds), dup_ratio=0.2, rate=rate, seed=seed)
        soak.run(seconds, load_running=t.is_alive, classes=8 if seconds >= 180 else 0)
        kafka3.ensure_all_running()
        stats = finish_load(t, res, timeout=seconds + 300)
        pipe.wait_drained(timeout=300)
        for pod, w in soak.workers.items():
            soak.exits[pod] = w.terminate()
        rep = pipe.verify()
    finally:
        pipe.stop_all()
    out = Path(os.environ.get("EOPIPE_SOAK_REPORT", tmp_path / "soak-report.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seed": seed, "seconds": seconds, "load": {k: v for k, v in stats.items()
                                                                        if isinstance(v, int | float)},
                               "faults": soak.rows, "exits": soak.exits, "verify": rep.to_dict()}, indent=2))
    # Past pytest's capture: the CI log shows the report, passed or not.
    with pytestconfig.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print(f"\n{report_table(soak.rows)}\n{rep.line()}\nsoak report: {out}", flush=True)
    assert soak.rows, "the nemesis injected no fault"
    if seconds >= 180:  # a round of every class takes about 90 s
        classes = {r["fault"] for r in soak.rows}
        assert len(classes) >= 8, f"only {sorted(classes)} in {seconds:.0f}s and twice as long again"
    assert_clean(rep)
    assert all(code == 0 for code in soak.exits.values()), f"exit statuses after SIGTERM: {soak.exits}"
