"""The driver's latest query progress, served for the operator (status.processing).

A StreamingQueryListener keeps the last finished micro-batch as one small JSON document
(`progress_doc`, the keys of eopipe.core.sparkprogress); a stdlib HTTP server in a daemon thread
answers GET /progress with it and 404 to any other path (other methods: 501, the stdlib's
default). It holds counters and offsets only, never the query's text or its data.

A probe thread asks the checkpoint's file system (Hadoop's, so a path and an s3a:// URI alike)
whether the checkpoint exists every PROBE_SECONDS. While the store has not answered for
UNREACHABLE_SECONDS (a probe failing, or one still waiting: the S3 client retries for a long
time), the document says since when and why: the query's batches are waiting on it too, and
the operator turns it into a condition (CheckpointUnreachable).

Port: $EOPIPE_PROGRESS_PORT, else PORT (eopipe.core.names.SPARK_PROGRESS_PORT, the port the
operator reads); 0 takes a free one (local runs, several drivers on one machine). The port
actually bound is printed on the driver's stdout (`PORT_LINE port=<n>`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = 4045  # eopipe.core.names.SPARK_PROGRESS_PORT (this package does not import eopipe)
PATH = "/progress"
PORT_ENV = "EOPIPE_PROGRESS_PORT"
PORT_LINE = "eopipe-spark: progress served"
REQUEST_SECONDS = 5  # a client that trickles its request is cut off
PROBE_SECONDS = 5
UNREACHABLE_SECONDS = 10
ERROR_CHARS = 300  # eopipe.core.sparkprogress bounds what it reads


def _ms(timestamp: str) -> int:
    """Spark's progress timestamp ("2026-11-25T23:05:00.123Z") in epoch milliseconds."""
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)


def _offsets(value) -> dict:
    """A source's endOffset: the Kafka source's {topic: {partition: offset}} (a JSON text in
    some Spark versions); anything else (another source) is left out."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, dict):
        return {}
    return {t: {str(p): int(o) for p, o in parts.items() if isinstance(o, int)}
            for t, parts in value.items() if isinstance(parts, dict)}


def progress_doc(progress: dict, started_at_ms: int) -> dict:
    """The /progress document of one finished batch, from Spark's progress JSON
    (StreamingQueryProgress.json): rates as Spark reports them, state summed over operators."""
    duration = progress.get("batchDuration")
    if duration is None:
        duration = (progress.get("durationMs") or {}).get("triggerExecution")
    start = _ms(progress["timestamp"]) if progress.get("timestamp") else None
    states = progress.get("stateOperators") or []
    offsets: dict = {}
    for source in progress.get("sources") or []:
        for topic, parts in _offsets(source.get("endOffset")).items():
            offsets.setdefault(topic, {}).update(parts)

    def rate(key: str) -> float | None:
        v = progress.get(key)
        return round(v, 3) if isinstance(v, (int, float)) and v == v and v >= 0 else None  # NaN: None

    return {
        "queryId": progress.get("id"), "runId": progress.get("runId"), "startedAtMs": started_at_ms,
        "batchId": progress.get("batchId"),
        "batchTimeMs": start + int(duration) if start is not None and duration is not None else start,
        "batchDurationMs": int(duration) if duration is not None else None,
        "numInputRows": progress.get("numInputRows"),
        "inputRowsPerSecond": rate("inputRowsPerSecond"),
        "processedRowsPerSecond": rate("processedRowsPerSecond"),
        "stateRows": sum(int(s.get("numRowsTotal") or 0) for s in states) if states else None,
        "stateBytes": sum(int(s.get("memoryUsedBytes") or 0) for s in states) if states else None,
        "endOffsets": offsets,
    }


def unreachable(last_ok_ms: int | None, error: str | None, now_ms: int) -> dict:
    """The document's checkpoint keys: none before the probe starts (None) or while the store
    answered within UNREACHABLE_SECONDS, else since when it has not, and its last error (or that
    the probe is still waiting)."""
    if last_ok_ms is None or now_ms - last_ok_ms <= UNREACHABLE_SECONDS * 1000:
        return {}
    why = error or f"a probe unanswered for {(now_ms - last_ok_ms) // 1000}s"
    return {"checkpointUnreachableSinceMs": last_ok_ms, "checkpointError": why[:ERROR_CHARS]}


class Progress:
    """The latest document, shared by the listener (Spark's listener thread), the checkpoint
    probe and the server."""

    def __init__(self, started_at_ms: int):
        self._lock = threading.Lock()
        self._doc: dict = {"startedAtMs": started_at_ms}
        self.started_at_ms = started_at_ms
        self._query_running = False  # until start_query returns: the operator says "starting"
        # Counted from the probe's start: the query's own start may take longer than the bound.
        self._last_ok_ms: int | None = None
        self._error: str | None = None

    def update(self, progress: dict) -> None:
        doc = progress_doc(progress, self.started_at_ms)
        with self._lock:
            self._doc = doc

    def query_started(self) -> None:
        with self._lock:
            self._query_running = True

    def probed(self, now_ms: int, error: str | None) -> None:
        """A probe's answer: None when the store answered."""
        with self._lock:
            if error is None:
                self._last_ok_ms = now_ms
            self._error = error

    def probing(self, now_ms: int) -> None:
        """The probe starts: from now on, no answer for UNREACHABLE_SECONDS is reported."""
        with self._lock:
            if self._last_ok_ms is None:
                self._last_ok_ms = now_ms

    def body(self, now_ms: int) -> bytes:
        with self._lock:
            return json.dumps({**self._doc, "queryRunning": self._query_running,
                               **unreachable(self._last_ok_ms, self._error, now_ms)}).encode()


def _first_line(e: Exception) -> str:
    """The JVM's exception (`java.net.ConnectException: ...`) rather than Py4J's "An error
    occurred while calling o42.exists"."""
    java = getattr(e, "java_exception", None)
    try:
        text = str(java.toString()) if java is not None else str(e)
    except Exception:  # noqa: BLE001 - the JVM may be going away
        text = str(e)
    return (text.strip().splitlines() or [type(e).__name__])[0]


def probe(spark, location: str, progress: Progress) -> threading.Thread:
    """Starts the checkpoint probe (module docstring) in a daemon thread."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(location)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    progress.probing(int(time.time() * 1000))

    def loop() -> None:
        while True:
            try:
                path.getFileSystem(conf).exists(path)  # absent (before the first batch) is an answer too
                error = None
            except Exception as e:  # noqa: BLE001 - Py4J's error carries the JVM's exception
                error = _first_line(e)
            progress.probed(int(time.time() * 1000), error)
            time.sleep(PROBE_SECONDS)

    t = threading.Thread(target=loop, name="eopipe-checkpoint-probe", daemon=True)
    t.start()
    return t


def _handler(progress: Progress):
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_SECONDS

        def do_GET(self):  # noqa: N802 - the stdlib's name
            if self.path != PATH:
                self.send_error(404)
                return
            body = progress.body(int(time.time() * 1000))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):  # the operator asks every pass: keep the driver's log quiet
            pass

    return Handler


def serve(progress: Progress, port: int | None = None, host: str = "") -> ThreadingHTTPServer:
    """Starts the server in a daemon thread; returns it (server_address has the bound port)."""
    if port is None:
        port = int(os.environ.get(PORT_ENV) or PORT)
    server = ThreadingHTTPServer((host, port), _handler(progress))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="eopipe-progress", daemon=True).start()
    return server


def listen(spark, progress: Progress) -> None:
    """Registers the listener that keeps `progress` current (pyspark >= 3.4)."""
    from pyspark.sql.streaming import StreamingQueryListener

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event):  # noqa: N802 - Spark's names
            pass

        def onQueryProgress(self, event):  # noqa: N802
            try:
                progress.update(json.loads(event.progress.json))
            except Exception as e:  # noqa: BLE001 - never fail the query over its report
                print(f"eopipe-spark: progress not kept: {e}", flush=True)

        def onQueryIdle(self, event):  # noqa: N802
            pass

        def onQueryTerminated(self, event):  # noqa: N802
            pass

    spark.streams.addListener(Listener())
