"""The worker's HTTP endpoints.

    /healthz   200 while the worker's control loop is alive
    /readyz    200 once every owned partition finished recovery and is running; else 503
    /metrics   Prometheus text format
    /status    JSON (eopipe.core.wire.PodStatus): assignment, per-partition state, offsets,
               state size, memory, handoffs
    /snapshots/<p>           a released partition's packed state (docs/design.md#snapshot-handoff)
    /reshard/<id>/<p>/<q>    keys of old partition p whose new home is q
The last two need the pipeline's bearer token (dedup/auth.py); the others are open.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from eopipe.core.wire import PodStatus
from eopipe.dedup import auth
from eopipe.dedup.metrics import Metrics


class HttpServer:
    def __init__(self, host: str, port: int, metrics: Metrics, status: Callable[[], PodStatus],
                 ready: Callable[[], bool], alive: Callable[[], bool],
                 files: Callable[[str, str], tuple | None] | None = None,
                 token: str | None = None, insecure: bool = False):
        """`files(path, query)` serves the state-transfer paths: (code, headers, body) where
        body is bytes or a Path streamed from disk; None -> 404. They answer only requests with
        `token` (auth.refusal), none at all without one unless `insecure`."""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
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
                    outer._send(self, 200, json.dumps(status().to_json()).encode(), "application/json")
                elif (denied := auth.refusal(path, self.headers.get("Authorization"), token, insecure)) is not None:
                    outer._send_file(self, *denied)
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
