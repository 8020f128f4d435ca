"""The test-only fault hook, EOPIPE_FAULT; never set in production.

    crash_after_commit[:N]      os._exit(137) right after the process's N-th successful Kafka
                                commit (default 1), before the RocksDB write
    crash_after_commit:p=PROB   the same, with that probability per commit
    no_dedup                    every record counts as new: the demo and its verdict test use it
                                to show that verification catches a broken pipeline
"""

from __future__ import annotations

import logging
import os
import random
import threading
from logging import ERROR

from eopipe.dedup.logs import event

log = logging.getLogger("eopipe.dedup")


class FaultHook:
    def __init__(self, spec: str | None):
        self.kind = None
        self.nth = 1
        self.prob = None
        self._count = 0
        self._lock = threading.Lock()
        if not spec:
            return
        kind, _, arg = spec.partition(":")
        if kind not in ("crash_after_commit", "no_dedup"):
            raise ValueError(f"unknown EOPIPE_FAULT {spec!r}")
        self.kind = kind
        if arg.startswith("p="):
            self.prob = float(arg[2:])
        elif arg:
            self.nth = int(arg)

    @property
    def no_dedup(self) -> bool:
        return self.kind == "no_dedup"

    def after_commit(self, partition: int) -> None:
        if self.kind != "crash_after_commit":
            return
        with self._lock:
            self._count += 1
            hit = random.random() < self.prob if self.prob is not None else self._count >= self.nth
        if hit:
            event(log, ERROR, "fault injected: exiting between Kafka commit and RocksDB write",
                  fault=self.kind, partition=partition, commits=self._count)
            logging.shutdown()
            os._exit(137)
