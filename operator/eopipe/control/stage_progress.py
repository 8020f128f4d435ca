"""The running Spark stage's progress, read each pass: the driver's GET /progress
(core/sparkprogress.py) and the deduped topic's ends (the pass's admin client) become
status.processing (control/status.spark_processing, the pure part) and the operator's
eopipe_operator_spark_* gauges. A driver or broker that does not answer is reported in
status.processing.error, never raised into the pass."""

from __future__ import annotations

import time

from confluent_kafka import KafkaException
from prometheus_client import Gauge

from eopipe.control.passctx import Pass
from eopipe.control.sparkstage import driver_selector
from eopipe.control.sparkstatus import STARTING, query_starting
from eopipe.control.status import PROCESSING, UNREACHABLE, Condition, spark_processing
from eopipe.core.durations import duration_ms
from eopipe.core.names import LABEL_SPARK_SPEC, SPARK_PROGRESS_PATH, SPARK_PROGRESS_PORT, spark_app
from eopipe.core.sparkprogress import read_progress

_LABELS = ["namespace", "name"]
GAUGES = {
    "lastBatchTime": Gauge("eopipe_operator_spark_last_batch_timestamp_seconds",
                           "when the Spark stage's last micro-batch ended", _LABELS),
    "batchDurationMs": Gauge("eopipe_operator_spark_batch_duration_seconds",
                             "how long the Spark stage's last micro-batch took", _LABELS),
    "trigger": Gauge("eopipe_operator_spark_trigger_seconds", "the Spark stage's trigger interval", _LABELS),
    "inputRowsPerSecond": Gauge("eopipe_operator_spark_input_rows_per_second",
                                "rows/s arriving in the last micro-batch, as Spark reports it", _LABELS),
    "processedRowsPerSecond": Gauge("eopipe_operator_spark_processed_rows_per_second",
                                    "rows/s the last micro-batch processed, as Spark reports it", _LABELS),
    "lagRecords": Gauge("eopipe_operator_spark_lag_records",
                        "records of the deduped topic the Spark stage has not read (status.processing.lagRecords)",
                        _LABELS),
    "stateRows": Gauge("eopipe_operator_spark_state_rows", "rows in the Spark query's state", _LABELS),
    "stateBytes": Gauge("eopipe_operator_spark_state_bytes", "memory the Spark query's state uses", _LABELS),
}


def running_driver(drivers):
    """The running driver pod (the newest, while a replaced one terminates), or None."""
    running = [d for d in drivers if d.status is not None and d.status.phase == "Running" and d.status.pod_ip]
    return max(running, key=lambda d: d.metadata.creation_timestamp or 0) if running else None


def driver_url(drivers) -> str | None:
    """The /progress of the running driver pod."""
    pod = running_driver(drivers)
    return None if pod is None else f"http://{pod.status.pod_ip}:{SPARK_PROGRESS_PORT}{SPARK_PROGRESS_PATH}"


# Between resyncs (a minute apart), a running stage's driver is looked at this often: one pod
# list and one GET /progress, no write; a pass follows only when its word differs from status:
# on the checkpoint's store (CheckpointUnreachable comes and goes within seconds), or a query
# now running that status still calls starting.
LOOK_SECONDS = 10.0


def progress_news(progress, conditions: list[dict]) -> bool:
    """Whether the driver's progress and status disagree: the checkpoint's store unreachable by
    the one, not said by ProcessingReady, or the other way round; or the query running while
    ProcessingReady says SparkStarting. No progress: no news."""
    if progress is None:
        return False
    reason = next((c.get("reason") for c in conditions if c.get("type") == PROCESSING), None)
    if progress.query_running and reason == STARTING:
        return True
    return (progress.checkpoint_unreachable_since_ms is not None) != (reason == UNREACHABLE)


def look(core, body) -> bool:
    """progress_news of a pipeline whose Spark application runs, read now (LOOK_SECONDS)."""
    meta, st = body["metadata"], body.get("status") or {}
    drivers = core.list_namespaced_pod(meta["namespace"],
                                       label_selector=driver_selector(spark_app(meta["name"]))).items
    url = driver_url(drivers)
    return url is not None and progress_news(read_progress(url)[0], st.get("conditions") or [])


def trigger_ms(trigger: str) -> int | None:
    try:
        return duration_ms(trigger)
    except ValueError:
        return None  # availableNow: one run, no cadence


def observe(p: Pass, drivers, condition: Condition, spec: str) -> Condition:
    """status.processing of the running stage; the condition `condition`, or SparkStuck, or
    SparkStarting until the running driver is `spec`'s (LABEL_SPARK_SPEC) with its query started."""
    names = p.names
    url = driver_url(drivers)
    progress, error = read_progress(url) if url else (None, "no running driver pod with an IP")
    ends = None
    if progress is not None:
        try:
            ends = {q: lso for q, (lso, _hwm) in p.plane.observer.stable_offsets(p.admin, names.deduped_topic).items()}
        except KafkaException as e:
            error = f"deduped topic's offsets: {e}"
    trigger = trigger_ms(names.spec.processing.trigger)
    record, stuck = spark_processing(progress, error, names.deduped_topic, ends, trigger,
                                     int(time.time() * 1000), p.status.get("processing"))
    if progress is not None and error is not None:
        record["error"] = error
    p.out.fields["processing"] = record
    _export(p.meta["namespace"], p.meta["name"], progress, record, trigger)
    if not condition.status:
        return condition
    pod = running_driver(drivers)
    if pod is None:  # no driver pod to judge by
        return stuck or condition
    started = pod.status.start_time
    age = time.time() - started.timestamp() if started is not None else 0.0
    starting = query_starting((pod.metadata.labels or {}).get(LABEL_SPARK_SPEC, ""), spec,
                              None if progress is None else progress.query_running, age, error)
    return starting or stuck or condition


def _export(namespace: str, name: str, progress, record: dict, trigger: int | None) -> None:
    if progress is None:
        return  # the series keep their last values

    def seconds(ms: int | None) -> float | None:
        return None if ms is None else ms / 1000

    values = {**record, "lastBatchTime": seconds(progress.batch_time_ms),
              "batchDurationMs": seconds(progress.batch_duration_ms), "trigger": seconds(trigger)}
    for key, gauge in GAUGES.items():
        if isinstance(values.get(key), (int, float)):
            gauge.labels(namespace, name).set(values[key])


def forget(namespace: str, name: str) -> None:
    """Drops a deleted pipeline's series."""
    for gauge in GAUGES.values():
        try:
            gauge.remove(namespace, name)
        except KeyError:
            pass
