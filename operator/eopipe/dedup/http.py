"""The worker's HTTP endpoints.

    /healthz   200 while the worker's control loop is alive
    /readyz    200 once every owned partition finished recovery and is running; else 503
    /metrics   Prometheus text format
    /status    JSON (eopipe.core.wire.PodStatus): assignment, per-partition state, offsets,
               state size, memory, handoffs
    /snapshots/<p>?generation=<g>   a released partition's packed state (docs/design.md#snapshot-handoff)
    /reshard/<id>/<p>/<q>           keys of old partition p whose new home is q
The last two need the pipeline's bearer token; the others are open. What a request is and
whether it needs the token is decided once, by dedup/auth.py's `route` on the parsed request
line; this module only reads the request and writes the answer.

The port is reachable from every pod of the pipeline and the metrics namespaces, so the server
keeps its own bounds: the request head (line and headers) is read within HEAD_BYTES and
HEAD_SECONDS, with IDLE_SECONDS at most between two receives, at most MAX_CONNECTIONS are
served at once (503 beyond), and one request per connection (HTTP/1.0 answers, no keep-alive).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from http.client import HTTPMessage, parse_headers
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from eopipe.core.wire import PodStatus, ReshardRequest, SnapshotRequest
from eopipe.dedup import auth
from eopipe.dedup.auth import Kind
from eopipe.dedup.metrics import Metrics

log = logging.getLogger("eopipe.dedup")

# Our clients (kubelet, Prometheus, urllib) send a few hundred bytes of head at once.
HEAD_BYTES = 8 << 10      # request line and headers together; more: 431
MAX_HEADERS = 64          # header lines; more: 431
IDLE_SECONDS = 5.0        # a client silent this long while sending its head is dropped (408)
HEAD_SECONDS = 10.0       # the whole head by then, however slowly it trickles in (408)
# A peer reads a snapshot as fast as its disk writes: a send that makes no progress for this
# long is a client that stopped reading, and it would hold a connection slot for nothing.
SEND_SECONDS = 30.0
# Each connection is a thread. Enough for every partition of a pod being fetched at once, plus
# probes, Prometheus and the operator; beyond it a request gets 503 (peers retry a 503 soon).
MAX_CONNECTIONS = 64
# After answering, unread input is drained this long (or this much) before the close: closing
# with unread input sends a reset, which can destroy the answer before the client reads it.
LINGER_SECONDS = 1.0
LINGER_BYTES = 64 << 10
CHUNK = 1 << 20

_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
         b"Retry-After: 1\r\nConnection: close\r\n\r\nbusy\n")

Files = Callable[[SnapshotRequest | ReshardRequest], tuple | None]


class HeadTooLarge(Exception):
    """The request head is over HEAD_BYTES or MAX_HEADERS: answered 431."""


class _Head:
    """Reads a request head from the raw socket, line by line, within the bounds above."""

    def __init__(self, sock: socket.socket, idle: float, within: float):
        self.sock, self.idle, self.deadline = sock, idle, time.monotonic() + within
        self.buf = b""
        self.received = 0   # for the whole head: HEAD_BYTES bounds it, not each line
        self.lines = 0

    def line(self) -> bytes:
        """The next line without its end; TimeoutError, HeadTooLarge, EOFError (closed)."""
        while (end := self.buf.find(b"\n")) < 0:
            if self.received >= HEAD_BYTES:
                raise HeadTooLarge()
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request head not received in time")
            self.sock.settimeout(min(self.idle, left))
            chunk = self.sock.recv(HEAD_BYTES - self.received)
            if not chunk:
                raise EOFError()
            self.received += len(chunk)
            self.buf += chunk
        line, self.buf = self.buf[:end], self.buf[end + 1:]
        self.lines += 1
        if self.lines > MAX_HEADERS + 2:  # the request line, the headers, the empty line
            raise HeadTooLarge()
        return line.rstrip(b"\r")

    def headers(self) -> HTTPMessage:
        block = []
        while line := self.line():
            block.append(line)
        return parse_headers(BytesIO(b"\r\n".join(block) + b"\r\n\r\n"))


def request_line(raw: bytes) -> tuple[str, str, str | None] | None:
    """(method, target, version) of a request line; version None for HTTP/0.9 (two words);
    None if it is neither (pure: auth.route decides on the parts)."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    words = text.split(" ")
    if len(words) == 3 and all(words):
        return words[0], words[1], words[2]
    if len(words) == 2 and all(words):
        return words[0], words[1], None
    return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, handler, max_connections: int):
        self.slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            # Answered here, in the accepting thread: a short write into an empty send buffer.
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address):  # a peer that went away: not worth a traceback
        log.debug("http connection from %s failed", client_address[0], exc_info=True)


class HttpServer:
    def __init__(self, host: str, port: int, metrics: Metrics, status: Callable[[], PodStatus],
                 ready: Callable[[], bool], alive: Callable[[], bool],
                 files: Files | None = None, token: str | None = None, insecure: bool = False,
                 *, max_connections: int = MAX_CONNECTIONS, idle_seconds: float = IDLE_SECONDS,
                 head_seconds: float = HEAD_SECONDS):
        """`files(request)` serves a routed state transfer (the request is parsed already):
        (code, headers, body) where body is bytes or a Path streamed from disk; None -> 404.
        Such requests reach it only with `token` (auth.refusal), and none at all without a
        token unless `insecure`."""
        open_endpoints: dict[Kind, Callable[[], tuple[int, bytes, str]]] = {
            Kind.HEALTHZ: lambda: (200, b"ok\n", "text/plain") if alive() else (503, b"stalled\n", "text/plain"),
            Kind.READYZ: lambda: (200, b"ready\n", "text/plain") if ready() else (503, b"not ready\n", "text/plain"),
            Kind.METRICS: lambda: (200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST),
            Kind.STATUS: lambda: (200, json.dumps(status().to_json()).encode(), "application/json"),
        }

        class Handler(BaseHTTPRequestHandler):
            server_version = "eopipe-dedup"
            sys_version = ""
            # Every answer is HTTP/1.0 with a status line, even to an HTTP/0.9 request line.
            request_version = "HTTP/1.0"
            requestline = command = ""

            def handle(self):
                self.close_connection = True
                try:
                    self._answer()
                    self._linger()
                except OSError:  # reset, broken pipe, a send that timed out: nothing to answer
                    pass
                except Exception:  # noqa: BLE001 - a failing endpoint closes its connection only
                    log.warning("http request failed: %s", self.requestline, exc_info=True)

            def _answer(self):
                head = _Head(self.connection, idle_seconds, head_seconds)
                try:
                    parts = request_line(head.line())
                    if parts is None:
                        return self._plain(400, b"bad request\n")
                    method, target, version = parts
                    # HTTP/0.9 has no headers to read: refused by the route as it stands.
                    hdrs = head.headers() if version is not None else HTTPMessage()
                except HeadTooLarge:
                    return self._plain(431, b"request head too large\n")
                except TimeoutError:
                    return self._plain(408, b"request timeout\n")
                except EOFError:
                    return None
                self.command, self.requestline = method, f"{method} {target[:auth.MAX_TARGET]}"
                has_body = "Transfer-Encoding" in hdrs or (hdrs.get("Content-Length") or "0").strip() != "0"
                r = auth.route(method, target, version, has_body=has_body)
                if r.kind is Kind.BAD_REQUEST:
                    return self._plain(400, b"bad request\n")
                if r.kind is Kind.METHOD_NOT_ALLOWED:
                    return self._plain(405, b"method not allowed\n", {"Allow": "GET"})
                if r.kind is Kind.NOT_FOUND:
                    return self._plain(404, b"not found\n")
                if r.kind in open_endpoints:
                    code, body, ctype = open_endpoints[r.kind]()
                    return self._send(code, {"Content-Type": ctype}, body)
                values = hdrs.get_all("Authorization") or []
                if (denied := auth.refusal(r, values[0] if len(values) == 1 else None, token, insecure)) is not None:
                    code, extra, body = denied
                    return self._plain(code, body, extra)
                res = files(r.transfer) if files is not None else None
                if res is None:
                    return self._plain(404, b"not found\n")
                code, extra, body = res
                if isinstance(body, Path):
                    return self._send_path(code, extra, body)
                ctype = "application/octet-stream" if code == 200 else "text/plain"
                return self._send(code, {"Content-Type": ctype, **extra}, body)

            def _plain(self, code: int, body: bytes, extra: dict | None = None) -> None:
                self._send(code, {"Content-Type": "text/plain", **(extra or {})}, body)

            def _send(self, code: int, hdrs: dict, body: bytes) -> None:
                self._head(code, hdrs, len(body))
                self.wfile.write(body)

            def _head(self, code: int, hdrs: dict, length: int) -> None:
                self.connection.settimeout(SEND_SECONDS)
                self.send_response(code)
                for k, v in hdrs.items():
                    if v is not None:
                        self.send_header(k, str(v))
                self.send_header("Content-Length", str(length))
                self.send_header("Connection", "close")
                self.end_headers()

            def _send_path(self, code: int, hdrs: dict, path: Path) -> None:
                """Exactly the size announced: the file is sized by its open descriptor, and a
                file that shrinks meanwhile ends the answer short (the peer's size check)."""
                try:
                    f = open(path, "rb")
                except FileNotFoundError:  # released and forgotten since files() answered
                    return self._plain(404, b"not found\n")
                with f:
                    left = os.fstat(f.fileno()).st_size
                    self._head(code, {"Content-Type": "application/octet-stream", **hdrs}, left)
                    while left > 0 and (chunk := f.read(min(CHUNK, left))):
                        self.wfile.write(chunk)
                        left -= len(chunk)

            def _linger(self) -> None:
                """Tell the client we are done, and drain what it still sends before closing."""
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_WR)
                deadline, drained = time.monotonic() + LINGER_SECONDS, 0
                while drained < LINGER_BYTES and (left := deadline - time.monotonic()) > 0:
                    self.connection.settimeout(left)
                    try:
                        chunk = self.connection.recv(LINGER_BYTES)
                    except TimeoutError:
                        return
                    if not chunk:
                        return
                    drained += len(chunk)

            def log_message(self, *args):  # quiet: probes hit this every few seconds
                pass

        self.server = _Server((host, port), Handler, max_connections)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
