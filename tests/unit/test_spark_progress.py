"""The Spark stage's progress: what the driver serves (spark_app/progress.py), the operator's
strict read of it (core/sparkprogress.py) and status.processing (control/status.spark_processing)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from eopipe.control import stage_progress
from eopipe.control.status import FAILURE_REASONS, PROCESSING, spark_processing
from eopipe.core.names import SPARK_PROGRESS_PATH, SPARK_PROGRESS_PORT
from eopipe.core.sparkprogress import SparkProgress, progress_from_body, read_progress
from spark_app import progress as driver

TOPIC = "ns.p.deduped"
# A Kafka query's progress as Spark 4 writes it (StreamingQueryProgress.json), trimmed.
SPARK_JSON = {
    "id": "q-1", "runId": "r-1", "name": "eopipe_ns_p", "timestamp": "2026-11-25T23:00:00.000Z",
    "batchId": 7, "batchDuration": 250, "numInputRows": 120,
    "inputRowsPerSecond": 100.0, "processedRowsPerSecond": 480.0,
    "durationMs": {"triggerExecution": 250},
    "stateOperators": [{"numRowsTotal": 10, "memoryUsedBytes": 2048}, {"numRowsTotal": 5, "memoryUsedBytes": 1024}],
    "sources": [{"description": "KafkaV2[Subscribe[ns.p.deduped]]",
                 "startOffset": {TOPIC: {"0": 40, "1": 60}},
                 "endOffset": {TOPIC: {"0": 100, "1": 80}}, "numInputRows": 120}],
    "sink": {"description": "ForeachBatchSink"},
}
T0 = 1_795_000_000_000  # 2026-11-18


def test_the_drivers_document_is_what_the_operator_reads():
    doc = driver.progress_doc(SPARK_JSON, started_at_ms=T0)
    p = progress_from_body(json.dumps(doc).encode())
    assert p.batch_id == 7 and p.batch_duration_ms == 250 and p.num_input_rows == 120
    assert p.batch_time_ms == driver._ms("2026-11-25T23:00:00.000Z") + 250
    assert (p.input_rows_per_second, p.processed_rows_per_second) == (100.0, 480.0)
    assert (p.state_rows, p.state_bytes) == (15, 3072)
    assert p.end_offsets == {TOPIC: {0: 100, 1: 80}}
    assert driver.PORT == SPARK_PROGRESS_PORT and driver.PATH == SPARK_PROGRESS_PATH


def test_query_running_is_strict_and_absent_from_an_earlier_images_driver():
    assert progress_from_body(json.dumps({"startedAtMs": T0}).encode()).query_running is True
    with pytest.raises(ValueError):
        progress_from_body(json.dumps({"startedAtMs": T0, "queryRunning": "yes"}).encode())


@pytest.mark.parametrize("change, expect", [
    ({"endOffset": json.dumps({TOPIC: {"0": 5}})}, {TOPIC: {0: 5}}),    # a JSON text (older Spark)
    ({"endOffset": "not json"}, {}),                                     # another source's offset
    ({"endOffset": None}, {}),
])
def test_end_offsets_of_other_shapes(change, expect):
    spark = {**SPARK_JSON, "sources": [{**SPARK_JSON["sources"][0], **change}]}
    assert progress_from_body(json.dumps(driver.progress_doc(spark, T0)).encode()).end_offsets == expect


def test_a_stateless_query_without_batch_duration():
    spark = {k: v for k, v in SPARK_JSON.items() if k not in ("batchDuration", "stateOperators")}
    spark["inputRowsPerSecond"] = float("nan")
    doc = driver.progress_doc(spark, T0)
    assert doc["batchDurationMs"] == 250 and doc["stateRows"] is None and doc["inputRowsPerSecond"] is None


@pytest.mark.parametrize("body", [
    b"[]", b"not json", b'{"batchId": 1}',                              # not an object; no startedAtMs
    b'{"startedAtMs": 1, "batchId": -1}', b'{"startedAtMs": 1, "batchId": "x"}',
    b'{"startedAtMs": 1, "endOffsets": {"t": {"zero": 1}}}', b"[" * 100_000 + b"]" * 100_000,
    # Figures status could not hold: past the year 9999, beyond int64, not a number.
    b'{"startedAtMs": 0, "batchTimeMs": 1000000000000000000}', b'{"startedAtMs": 1, "batchId": 9223372036854775808}',
    b'{"startedAtMs": 1, "checkpointUnreachableSinceMs": 253402300800000}',
    b'{"startedAtMs": 1, "endOffsets": {"t": {"0": 9223372036854775808}}}',
    b'{"startedAtMs": 1, "inputRowsPerSecond": Infinity}', b'{"startedAtMs": 1, "processedRowsPerSecond": NaN}',
])
def test_what_is_not_a_progress_is_refused(body):
    with pytest.raises(ValueError):
        progress_from_body(body)


# -- the read over HTTP, against the driver's own server on loopback -------------------------

@pytest.fixture
def served():
    prog = driver.Progress(T0)
    server = driver.serve(prog, port=0, host="127.0.0.1")
    yield prog, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_driver_answers_get_progress_only(served):
    prog, base = served
    p, err = read_progress(base + "/progress")
    assert err is None and p.batch_id is None and p.started_at_ms == T0  # before the first batch
    assert p.query_running is False  # until start_query returned
    prog.query_started()
    prog.update(SPARK_JSON)
    p, err = read_progress(base + "/progress")
    assert err is None and p.batch_id == 7 and p.query_running is True
    for path in ("/", "/progress/", "/progress?x=1", "/metrics"):
        p, err = read_progress(base + path)
        assert p is None and "404" in err, path
    for method in ("POST", "PUT", "DELETE"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(base + "/progress", data=b"x", method=method), timeout=2)
        assert e.value.code == 501


class _Bad(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        if self.path == "/big":
            self.send_response(200)
            self.end_headers()  # no length: read until the cap
            self.wfile.write(b'{"startedAtMs": 1, "x": "' + b"a" * (80 << 10) + b'"}')
        elif self.path == "/announced":
            self.send_response(200)
            self.send_header("Content-Length", str(10 << 20))
            self.end_headers()
        elif self.path == "/slow":
            self.send_response(200)
            self.end_headers()
            for _ in range(40):
                self.wfile.write(b" ")
                self.wfile.flush()
                threading.Event().wait(0.1)

    def log_message(self, *_a):
        pass


@pytest.mark.parametrize("path, words", [("/big", "over"), ("/announced", "Content-Length"),
                                         ("/slow", "in time")])
def test_a_hostile_driver_is_reported_not_held(path, words):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Bad)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        p, err = read_progress(f"http://127.0.0.1:{server.server_address[1]}{path}", within=1.0)
        assert p is None and words in err
    finally:
        server.shutdown()
        server.server_close()


def test_an_unreachable_driver_is_reported():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    p, err = read_progress(f"http://127.0.0.1:{port}/progress")
    assert p is None and err


# -- status.processing ---------------------------------------------------------------------

def _progress(batch_id=7, batch_time=T0, started=T0 - 600_000, offsets=None) -> SparkProgress:
    return SparkProgress(started_at_ms=started, batch_id=batch_id, batch_time_ms=batch_time,
                         batch_duration_ms=250, input_rows_per_second=100.0, processed_rows_per_second=480.0,
                         num_input_rows=120, state_rows=15, state_bytes=3072,
                         end_offsets={TOPIC: {0: 100, 1: 80}} if offsets is None else offsets)


S = 1000
# (case, progress, ends, trigger_ms, now_ms, lag, stuck)
CASES = [
    ("caught up", _progress(), {0: 100, 1: 80}, S, T0 + 3600 * S, 0, False),
    ("behind, batches coming", _progress(), {0: 150, 1: 90}, S, T0 + 5 * S, 60, False),
    ("no batch for 10 triggers, under the floor", _progress(), {0: 150, 1: 80}, S, T0 + 59 * S, 50, False),
    ("no batch past the floor with records waiting", _progress(), {0: 150, 1: 80}, S, T0 + 61 * S, 50, True),
    ("a long trigger: 10 of them", _progress(), {0: 150, 1: 80}, 30 * S, T0 + 299 * S, 50, False),
    ("a long trigger, past 10", _progress(), {0: 150, 1: 80}, 30 * S, T0 + 301 * S, 50, True),
    ("a new partition counts from 0", _progress(), {0: 100, 1: 80, 2: 7}, S, T0 + S, 7, False),
    ("a trimmed end below the batch is 0, not negative", _progress(), {0: 90, 1: 80}, S, T0, 0, False),
    ("no batch yet, started long ago", _progress(None, None, T0, offsets={}), {0: 5}, S, T0 + 120 * S, 5, True),
    ("no batch yet, just started", _progress(None, None, T0, offsets={}), {0: 5}, S, T0 + 10 * S, 5, False),
    ("availableNow: no cadence to miss", _progress(), {0: 150, 1: 80}, None, T0 + 3600 * S, 50, False),
    ("topic offsets unknown: no lag, no verdict", _progress(), None, S, T0 + 3600 * S, None, False),
]


@pytest.mark.parametrize("case, progress, ends, trigger, now, lag, stuck", CASES, ids=[c[0] for c in CASES])
def test_processing_status(case, progress, ends, trigger, now, lag, stuck):
    record, cond = spark_processing(progress, None, TOPIC, ends, trigger, now, None)
    assert record.get("lagRecords") == lag
    assert (cond is not None) == stuck
    if progress.batch_id is not None:
        assert record["lastBatchId"] == 7 and record["batchDurationMs"] == 250
        assert record["lastBatchTime"].endswith("Z") and record["stateBytes"] == 3072
    if stuck:
        assert cond.type == PROCESSING and not cond.status and cond.reason in FAILURE_REASONS
        assert f"{lag} records wait in {TOPIC}" in cond.message


def test_without_a_progress_the_last_figures_stay_with_the_error():
    before, _ = spark_processing(_progress(), None, TOPIC, {0: 100, 1: 80}, S, T0, None)
    record, cond = spark_processing(None, "URLError: refused", TOPIC, {0: 500}, S, T0 + 3600 * S, before)
    assert cond is None and record == {**before, "error": "URLError: refused"}


# -- the checkpoint probe's verdict (the driver) and its condition (the operator) -------------

# (case, last answer ms before now, the last probe's error, reported)
PROBES = [
    ("answered just now", 0, None, False),
    ("answered 10 s ago: within the bound", 10 * S, None, False),
    ("a probe waiting past the bound", 11 * S, None, True),
    ("a probe failing past the bound", 30 * S, "java.net.ConnectException: refused", True),
    ("a failure within the bound: not yet", 4 * S, "java.net.ConnectException: refused", False),
]


@pytest.mark.parametrize("case, ago, error, reported", PROBES, ids=[c[0] for c in PROBES])
def test_the_driver_reports_a_checkpoint_store_without_answer(case, ago, error, reported):
    assert driver.unreachable(None, error, T0) == {}  # the probe not started yet (the query starting)
    keys = driver.unreachable(T0 - ago, error, T0)
    assert bool(keys) == reported
    if reported:
        assert keys["checkpointUnreachableSinceMs"] == T0 - ago
        assert keys["checkpointError"] == (error or f"a probe unanswered for {ago // S}s")
        p = progress_from_body(json.dumps({"startedAtMs": T0, **keys}).encode())
        assert p.checkpoint_unreachable_since_ms == T0 - ago


def test_the_served_document_carries_the_probe_and_bounds_its_error(served):
    prog, base = served
    prog.update(SPARK_JSON)
    prog.probed(T0, "refused")  # before the probe started: nothing to count from
    p, err = read_progress(base + "/progress")
    assert err is None and p.checkpoint_unreachable_since_ms is None
    prog.probing(T0)
    prog.probed(T0, "x" * 5000)  # failing since T0, long before the server's clock (now)
    p, err = read_progress(base + "/progress")
    assert err is None and p.batch_id == 7 and p.checkpoint_unreachable_since_ms == T0
    assert p.checkpoint_error == "x" * driver.ERROR_CHARS
    prog.probed(int(time.time() * 1000), None)
    p, err = read_progress(base + "/progress")
    assert err is None and p.checkpoint_unreachable_since_ms is None and p.checkpoint_error is None


def test_an_unreachable_checkpoint_is_the_condition_before_stuck():
    stuck = _progress()  # no batch for an hour with records waiting: SparkStuck on its own
    down = stuck.model_copy(update={"checkpoint_unreachable_since_ms": T0 + 3540 * S,
                                    "checkpoint_error": "ConnectException: refused"})
    _, cond = spark_processing(stuck, None, TOPIC, {0: 150, 1: 80}, S, T0 + 3600 * S, None)
    assert cond.reason == "SparkStuck"
    record, cond = spark_processing(down, None, TOPIC, {0: 150, 1: 80}, S, T0 + 3600 * S, None)
    assert (cond.type, cond.status, cond.reason) == (PROCESSING, False, "CheckpointUnreachable")
    assert cond.reason in FAILURE_REASONS and "for 60s (ConnectException: refused)" in cond.message
    assert record["checkpointUnreachableSince"].endswith("Z") and record["lagRecords"] == 50


# (case, the driver's word, ProcessingReady's reason in status, a pass now)
DOWN = SparkProgress(started_at_ms=T0, checkpoint_unreachable_since_ms=T0, checkpoint_error="refused")
UP = SparkProgress(started_at_ms=T0)
NEWS = [
    ("store down, not said yet", DOWN, "Running", True),
    ("store down, said", DOWN, "CheckpointUnreachable", False),
    ("store back, still said", UP, "CheckpointUnreachable", True),
    ("store up, nothing said", UP, "Running", False),
    ("stuck is another pass's business", UP, "SparkStuck", False),
    ("no answer from the driver: no news", None, "Running", False),
    ("the query now running, status says starting", UP, "SparkStarting", True),
    ("the query still starting", SparkProgress(started_at_ms=T0, query_running=False), "SparkStarting", False),
]


@pytest.mark.parametrize("case, progress, reason, news", NEWS, ids=[c[0] for c in NEWS])
def test_a_look_between_resyncs_starts_a_pass_only_on_news(case, progress, reason, news):
    conditions = [{"type": "DedupReady", "reason": "CheckpointUnreachable"},  # another stage's: not read
                  {"type": PROCESSING, "status": str(reason == "Running"), "reason": reason}]
    assert stage_progress.progress_news(progress, conditions) is news


def _pod(phase, ip, created):
    return SimpleNamespace(status=SimpleNamespace(phase=phase, pod_ip=ip),
                           metadata=SimpleNamespace(creation_timestamp=created))


def test_the_driver_read_is_the_newest_running_pod():
    assert stage_progress.driver_url([]) is None
    assert stage_progress.driver_url([_pod("Pending", None, 1), _pod("Running", None, 2)]) is None
    url = stage_progress.driver_url([_pod("Running", "10.0.0.1", 1), _pod("Running", "10.0.0.2", 2),
                                     _pod("Failed", "10.0.0.3", 3)])
    assert url == f"http://10.0.0.2:{SPARK_PROGRESS_PORT}/progress"
    assert stage_progress.trigger_ms("1m30s") == 90_000


def test_the_gauges_follow_the_progress_and_a_paused_pipeline_drops_them():
    from prometheus_client import REGISTRY

    def value(metric: str):
        return REGISTRY.get_sample_value(metric, {"namespace": "gauges", "name": "p"})

    p = _progress()
    record, _ = spark_processing(p, None, TOPIC, {0: 150, 1: 80}, S, T0, None)
    stage_progress._export("gauges", "p", p, record, 30 * S)
    assert value("eopipe_operator_spark_lag_records") == 50
    assert value("eopipe_operator_spark_last_batch_timestamp_seconds") == T0 / 1000
    assert value("eopipe_operator_spark_batch_duration_seconds") == 0.25
    assert value("eopipe_operator_spark_trigger_seconds") == 30
    assert value("eopipe_operator_spark_state_bytes") == 3072
    stage_progress._export("gauges", "p", None, {"error": "refused"}, 30 * S)  # unreadable: values stay
    assert value("eopipe_operator_spark_lag_records") == 50
    stage_progress.forget("gauges", "p")
    assert value("eopipe_operator_spark_lag_records") is None
    stage_progress.forget("gauges", "p")  # twice is fine
