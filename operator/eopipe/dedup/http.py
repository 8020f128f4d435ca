"""The worker's metrics (one CollectorRegistry per worker) and its HTTP endpoints.

    /healthz   200 while the worker's control loop is alive
    /readyz    200 once every owned partition finished recovery and is running; else 503
    /metrics   Prometheus text format
    /status    JSON: assignment, per-partition state, offsets, state size, memory, handoffs
    /snapshots/<p>           a released partition's packed state (DESIGN.md section 4)
    /reshard/<id>/<p>/<q>    keys of old partition p whose new home is q
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import generate_latest


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        lp = ["partition"]
        self.consumed = Counter("eopipe_dedup_consumed", "Source records consumed and committed", lp, registry=r)
        self.emitted = Counter("eopipe_dedup_emitted", "Records emitted to the deduped topic", lp, registry=r)
        self.duplicates = Counter("eopipe_dedup_duplicates", "Records dropped as duplicates", lp, registry=r)
        self.rerouted = Counter("eopipe_dedup_rerouted", "Records re-produced to their home partition", lp, registry=r)
        self.dead_lettered = Counter("eopipe_dedup_dead_lettered", "Malformed records sent to the DLQ", lp, registry=r)
        self.aborts = Counter("eopipe_dedup_aborted_transactions", "Transactions aborted and retried", lp, registry=r)
        self.replayed = Counter("eopipe_dedup_replayed", "Source records replayed into the state on recovery", lp, registry=r)
        self.rebuilds = Counter("eopipe_dedup_rebuilds", "Full state rebuilds from the source topic", lp, registry=r)
        self.commit_latency = Histogram(
            "eopipe_dedup_commit_seconds", "send_offsets_to_transaction + commit_transaction", lp,
            buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30), registry=r)
        self.batch_records = Histogram("eopipe_dedup_transaction_records", "Source records per transaction", lp,
                                       buckets=(1, 10, 100, 1000, 5000, 10000, 20000, 50000), registry=r)
        self.lag = Gauge("eopipe_dedup_lag_records", "High watermark minus committed offset", lp, registry=r)
        self.committed = Gauge("eopipe_dedup_committed_offset", "Committed source offset", lp, registry=r)
        self.state_keys = Gauge("eopipe_dedup_state_keys", "Keys in the dedup state (estimate)", lp, registry=r)
        self.state_bytes = Gauge("eopipe_dedup_state_bytes", "Dedup state size (SST + memtables)", lp, registry=r)
        self.effective_window = Gauge("eopipe_dedup_effective_window_seconds",
                                      "Window over which duplicates are surely caught", lp, registry=r)
        self.recovery_seconds = Gauge("eopipe_dedup_recovery_seconds", "Duration of the last recovery", lp, registry=r)
        self.partition_state = Gauge("eopipe_dedup_partition_state", "1 for the partition's current state",
                                     ["partition", "state"], registry=r)
        self.window = Gauge("eopipe_dedup_window_seconds", "Configured dedup window", registry=r)
        self.generation = Gauge("eopipe_dedup_assignment_generation", "Assignment generation applied", registry=r)
        self.owned = Gauge("eopipe_dedup_partitions_owned", "Partitions in the current assignment", registry=r)
        self.source_partitions = Gauge("eopipe_dedup_source_partitions", "Source topic partition count", registry=r)
        self.memory = Gauge("eopipe_dedup_rocksdb_memory_bytes", "RocksDB shared memory", ["kind"], registry=r)


STATES = ("starting", "fetching", "recovering", "importing", "running", "stopping", "stopped", "fenced", "failed")


class HttpServer:
    def __init__(self, host: str, port: int, metrics: Metrics, status: Callable[[], dict],
                 ready: Callable[[], bool], alive: Callable[[], bool],
                 files: Callable[[str, str], tuple | None] | None = None):
        """`files(path, query)` serves the state-transfer paths: (code, headers, body) where
        body is bytes or a Path streamed from disk; None -> 404."""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    ok = alive()
                    outer._send(self, 200 if ok else 503, b"ok\n" if ok else b"stalled\n", "text/plain")
                elif path == "/readyz":
                    ok = ready()
                    outer._send(self, 200 if ok else 503, b"ready\n" if ok else b"not ready\n", "text/plain")
                elif path == "/metrics":
                    outer._send(self, 200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
                elif path == "/status":
                    outer._send(self, 200, json.dumps(status(), default=str).encode(), "application/json")
                elif files is not None and (res := files(path, self.path.partition("?")[2])) is not None:
                    outer._send_file(self, *res)
                else:
                    outer._send(self, 404, b"not found\n", "text/plain")

            def log_message(self, *args):  # quiet: probes hit this every few seconds
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)

    @staticmethod
    def _send(handler, code: int, body: bytes, ctype: str) -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    @staticmethod
    def _send_file(handler, code: int, headers: dict, body) -> None:
        from pathlib import Path

        if isinstance(body, Path):
            size = body.stat().st_size
            handler.send_response(code)
            handler.send_header("Content-Type", "application/octet-stream")
            handler.send_header("Content-Length", str(size))
            for k, v in headers.items():
                handler.send_header(k, str(v))
            handler.end_headers()
            with open(body, "rb") as f:
                while chunk := f.read(1 << 20):
                    handler.wfile.write(chunk)
            return
        handler.send_response(code)
        handler.send_header("Content-Type", "application/octet-stream" if code == 200 else "text/plain")
        handler.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            handler.send_header(k, str(v))
        handler.end_headers()
        handler.wfile.write(body)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Heartbeat:
    """The control loop beats; /healthz fails if it stopped beating."""

    def __init__(self, max_silence: float = 60.0):
        self.max_silence = max_silence
        self._last = time.monotonic()

    def beat(self) -> None:
        self._last = time.monotonic()

    def alive(self) -> bool:
        return time.monotonic() - self._last < self.max_silence
