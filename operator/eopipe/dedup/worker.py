"""The dedup worker process: follows the assignment, runs a PartitionRunner per owned partition,
restarts the ones that failed, serves HTTP, and stops cleanly on SIGTERM.

docs/design.md#architecture: one process owns a set of source partitions; each partition runs
on its own thread (dedup/partition.py) through take-over (dedup/incoming.py), recovery
(dedup/restore.py), the steady state and its stop; a runner sees only its PartitionContext
(dedup/context.py), never this Worker. This thread, the control loop, also refreshes the source
partition count and releases the partitions handed to other pods (dedup/outgoing.py).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import time
from logging import INFO, WARNING

from confluent_kafka.admin import AdminClient

from eopipe.core.assignment import Assignment
from eopipe.core.wire import PartitionState, PodStatus
from eopipe.dedup import backup
from eopipe.dedup.assignment_source import AssignmentSource
from eopipe.dedup.config import WorkerConfig
from eopipe.dedup.context import PartitionContext
from eopipe.dedup.faults import FaultHook
from eopipe.dedup.http import HttpServer
from eopipe.dedup.logs import event
from eopipe.dedup.metrics import Heartbeat, Metrics, StallDump
from eopipe.dedup.outgoing import Outgoing, Ownership
from eopipe.dedup.partition import PartitionRunner
from eopipe.dedup.store import StateStore

log = logging.getLogger("eopipe.dedup")
TICK = 0.1  # seconds between rounds of the control loop at most


class SourceInfo:
    """The source topic's current partition count, refreshed by the control loop."""

    def __init__(self, admin: AdminClient, topic: str):
        self.admin = admin
        self.topic = topic
        self.partitions = 0

    def refresh(self, timeout: float = 10.0) -> int:
        md = self.admin.list_topics(self.topic, timeout=timeout).topics.get(self.topic)
        if md is None or md.error is not None or not md.partitions:
            raise RuntimeError(f"source topic {self.topic!r} not available: {md.error if md else 'missing'}")
        n = len(md.partitions)
        if n != self.partitions:
            if self.partitions:
                event(log, WARNING, "source partition count changed", old=self.partitions, new=n)
            self.partitions = n
        return n


class Worker:
    def __init__(self, cfg: WorkerConfig):
        self.cfg = cfg
        self.metrics = Metrics()
        self.metrics.window.set(cfg.window_seconds)
        self.heartbeat = Heartbeat()
        self.fault = FaultHook(os.environ.get("EOPIPE_FAULT"))
        self.store = StateStore(cfg.state_dir, window_ms=cfg.window_ms, segment_ms=cfg.segment_ms,
                                memory_bytes=cfg.memory_mb << 20)
        self._admin = AdminClient({"bootstrap.servers": cfg.bootstrap, "logger": logging.getLogger("rdkafka"),
                                   **cfg.kafka_config})
        self.source = SourceInfo(self._admin, cfg.source_topic)
        self.assignments = AssignmentSource(cfg.me, cfg.partitions, cfg.assignment_file,
                                            cfg.namespace, cfg.assignment_configmap)
        self.runners: dict[int, PartitionRunner] = {}
        self.generation: int | None = None
        self.owned: tuple[int, ...] = ()
        self.assignment: Assignment = Assignment(-1)
        self.outgoing = Outgoing(self.store, cfg.me)
        self.ownership = Ownership()  # what the HTTP thread serves state transfers by
        self.context = PartitionContext(cfg=cfg, store=self.store, metrics=self.metrics, heartbeat=self.heartbeat,
                                        fault=self.fault, assignment=lambda: self.assignment,
                                        home_count=self.home_count, read_assignment=self.assignments.read)
        self._stuck: list[PartitionRunner] = []
        self._stop = False  # set by SIGTERM, SIGINT
        self._restart_at: dict[int, float] = {}
        self.http: HttpServer | None = None

    def home_count(self) -> int:
        """The partition count of the home check: the one the operator published (never a
        newer one read from metadata while a re-shard is in progress), else the topic's."""
        return self.assignment.partition_count or self.source.partitions

    def runnable(self) -> tuple[int, ...]:
        return () if self.assignment.paused else self.owned

    # -- readiness / status ------------------------------------------------------------------
    def ready(self) -> bool:
        return (not self._stop and self.generation is not None
                and all(p in self.runners and self.runners[p].state is PartitionState.RUNNING for p in self.runnable()))

    def paused(self) -> bool:
        """Told to pause, and nothing runs any more: the operator may change the partitions."""
        return (self.assignment.paused and not any(r.is_alive() for r in self.runners.values())
                and not any(r.is_alive() for r in self._stuck))

    def status(self) -> PodStatus:
        return PodStatus(pipeline=self.cfg.pipeline, namespace=self.cfg.namespace, pod=self.cfg.me,
                         generation=self.generation, owned=list(self.owned), paused=self.paused(),
                         partition_count=self.home_count(), source_partitions=self.source.partitions,
                         window_seconds=self.cfg.window_seconds, ready=self.ready(),
                         partitions={p: r.status() for p, r in sorted(self.runners.items())},
                         released=dict(sorted(self.outgoing.released.items())), memory=self.store.memory(),
                         counts=self.metrics.totals.snapshot())

    def request_stop(self, *_args) -> None:
        """SIGTERM, SIGINT. A flag only, read by the loop within a TICK: a Python signal handler
        runs on the main thread between two of its bytecodes, maybe inside the Event.wait below
        holding that Event's lock, and setting that Event would wait for itself
        (python/cpython#126434)."""
        self._stop = True

    # -- control loop -----------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        self.http = HttpServer(cfg.http_host, cfg.http_port, self.metrics, self.status, self.ready,
                               self.heartbeat.alive, files=lambda req: self.outgoing.serve(self.ownership, req),
                               token=cfg.token, insecure=cfg.insecure_state_endpoints)
        self.http.start()
        self.assignments.start()
        snapshots = None
        if cfg.backup_uri:
            snapshots = backup.Snapshotter(cfg, self.store, self.metrics, partitions=lambda: list(self.runners),
                                           running=self._running)
            snapshots.start()
        event(log, INFO, "dedup worker starting", pipeline=cfg.pipeline, namespace=cfg.namespace,
              source=cfg.source_topic, output=cfg.output_topic, dlq=cfg.dlq_topic,
              key=str(cfg.key_spec), window_seconds=cfg.window_seconds,
              partitioner=cfg.partitioner, http=f"{cfg.http_host}:{self.http.port}",
              state_dir=str(cfg.state_dir), memory_mb=cfg.memory_mb, fault=self.fault.kind)
        if cfg.token is None:
            event(log, WARNING, "no token: state transfer " + ("served OPEN (--insecure-state-endpoints)" if cfg.insecure_state_endpoints
                                                 else "refused; moved partitions are rebuilt from the source"))
        # A control loop silent for half the liveness limit leaves its threads' stacks in the
        # log: what a probe's restart alone would not tell.
        stall = StallDump(self.heartbeat.max_silence / 2)
        retry_at = 0.0
        while not self._stop:
            stall.arm()
            if time.monotonic() < retry_at:
                time.sleep(TICK)
                continue
            try:
                self.source.refresh()
                break
            except Exception as e:  # noqa: BLE001
                event(log, WARNING, "waiting for the source topic", error=str(e))
                retry_at = time.monotonic() + 2
        next_meta = time.monotonic() + cfg.metadata_refresh_seconds
        while not self._stop:
            stall.arm()
            self.heartbeat.beat()
            self._follow_assignment()
            if time.monotonic() >= next_meta:
                try:
                    self.metrics.source_partitions.set(self.source.refresh())
                except Exception as e:  # noqa: BLE001
                    event(log, WARNING, "source metadata refresh failed", error=str(e))
                next_meta = time.monotonic() + cfg.metadata_refresh_seconds
            mem = self.store.memory()
            for kind in ("cache_usage_bytes", "write_buffer_usage_bytes", "budget_bytes"):
                self.metrics.memory.labels(kind).set(mem[kind])
            # Woken at once by a new assignment from the API watch; the mounted file is read
            # each tick. A handoff's pause starts when the old owner sees the new generation.
            self.assignments.changed.wait(TICK)
            self.assignments.changed.clear()
        event(log, INFO, "stopping: committing open transactions")
        self.assignments.stop()
        if snapshots is not None:
            snapshots.stop()  # one being uploaded goes on from its own copy; the store is not needed
        for r in self.runners.values():
            r.stop()
        for r in self.runners.values():
            r.join(60)
        busy = sorted(r.p for r in [*self.runners.values(), *self._stuck] if r.is_alive())
        if busy:
            # A thread still inside a librdkafka call uses its RocksDB handle: closing the store
            # under it can crash the process. Leave it open; the state is written after each
            # commit and recovery reconciles the rest, as after a kill.
            event(log, WARNING, "partitions still busy at exit; state left to recovery", partitions=busy)
        else:
            self.store.close()
        self.http.stop()
        stall.cancel()
        event(log, INFO, "dedup worker stopped",
              partitions={p: r.committed for p, r in self.runners.items()})
        return 0

    def _follow_assignment(self) -> None:
        try:
            a = self.assignments.read()
        except (OSError, ValueError, KeyError, TypeError) as e:
            if self.generation is None:
                event(log, WARNING, "assignment not readable yet", error=str(e))
            return
        owned = tuple(a.partitions_of(self.cfg.me))
        if a != self.assignment:
            event(log, INFO, "assignment", generation=a.generation, partitions=list(owned),
                  previous=list(self.owned), paused=a.paused, partition_count=a.partition_count,
                  handoffs=sorted(a.handoffs), reshard=a.reshard.to_dict() if a.reshard else None)
            self.assignment, self.generation, self.owned = a, a.generation, owned
            self.metrics.generation.set(a.generation)
            self.metrics.owned.set(len(owned))
            self._publish_ownership()
        runnable = self.runnable()
        stopped: dict[int, int] = {}
        leaving = [p for p in self.runners if p not in runnable]
        for p in leaving:  # all at once: each commits its open transaction and closes its clients
            self.runners[p].stop()
        for p in leaving:
            r = self.runners[p]
            r.join(60)
            # Removed only now: until its last commit is done, /status must not call it paused.
            del self.runners[p]
            if r.is_alive():
                self._stuck.append(r)
            stopped[p] = int(time.time() * 1000)
        self._stuck = [r for r in self._stuck if r.is_alive()]
        if self.cfg.partitions is None:  # else fixed ownership (tests, local runs): nothing moves
            self.outgoing.release(a, owned, set(self.runners) | {r.p for r in self._stuck}, stopped)
        for p in runnable:
            r = self.runners.get(p)
            if r is None:
                self._start(p)
            elif r.state in self._restartable() and not r.is_alive():
                # Like a pod restart: back off, then recover with a fresh producer.
                at = self._restart_at.setdefault(p, time.monotonic() + 2)
                if time.monotonic() >= at:
                    self._restart_at.pop(p, None)
                    event(log, WARNING, f"restarting {r.state} partition", partition=p, error=r.error)
                    self._start(p)
        self._publish_ownership()

    def _publish_ownership(self) -> None:
        """A new snapshot for the HTTP thread (replaced whole: it never sees one half-made)."""
        self.ownership = Ownership(self.generation, self.owned, frozenset(self.runners), self.assignment.handoffs)

    def _restartable(self) -> tuple[PartitionState, ...]:
        """Fenced while the assignment still gives p to this pod: a zombie that had not yet read
        the new assignment took p back (its replaced producer's init_transactions fenced ours).
        Taking p back fences it in turn; once it reads the assignment it lets go. With fixed
        ownership (--partitions) no assignment decides, so the fenced one stays stopped."""
        if self.cfg.partitions is None:
            return (PartitionState.FAILED, PartitionState.FENCED)
        return (PartitionState.FAILED,)

    def _running(self, p: int) -> bool:
        r = self.runners.get(p)
        return r is not None and r.state is PartitionState.RUNNING

    def _start(self, p: int) -> None:
        r = self.runners[p] = PartitionRunner(self.context, p)
        r.start()


def run(cfg: WorkerConfig) -> int:
    # The hot path allocates a Message per record, which the cyclic GC tracks but which never
    # form cycles: collecting the young generation every 700 allocations cost ~5% of the CPU.
    # Objects alive at start-up are frozen out of every collection.
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    return Worker(cfg).run()
