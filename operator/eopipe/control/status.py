"""Pipeline status in the kstatus convention: conditions, phase and observedGeneration.

Pure functions: the reconcile handler gathers facts (per-stage conditions) and these derive
the summary conditions (Ready, Reconciling, Stalled) and the phase, so Argo CD and
`kubectl wait --for=condition=Ready` read the same truth.
"""

from __future__ import annotations

from dataclasses import dataclass

from eopipe.core.durations import rfc3339
from eopipe.core.names import COUNT_KINDS
from eopipe.core.wire import PartitionState

# The condition types: one per stage (each stage module reports its own), then the summary.
STAGES = TOPICS, DEDUP, PROCESSING = ("TopicsReady", "DedupReady", "ProcessingReady")
READY, RECONCILING, STALLED = "Ready", "Reconciling", "Stalled"
# Reasons of a stage that failed (as opposed to one on its way): the pipeline is Degraded, and
# argocd/health.lua keeps the same list.
FAILURE_REASONS = frozenset({"KafkaUnavailable", "SparkFailed", "SparkOperatorMissing", "ApplyFailed",
                             "AdoptedTopicMismatch", "HangingTransaction", "LagGrowing", "SparkStuck",
                             "CheckpointUnreachable", "DriverNodeLost", "PolicyDenied"})  # the spec asks for what the tenant policy refuses


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str = ""


def merge_conditions(old: list[dict] | None, new: list[Condition], generation: int,
                     now: str | None = None) -> list[dict]:
    """Conditions as the API wants them; lastTransitionTime moves only when status flips."""
    now = now or rfc3339()
    previous = {c["type"]: c for c in old or ()}
    out = []
    for c in new:
        status = "True" if c.status else "False"
        prev = previous.get(c.type)
        changed = prev is None or prev.get("status") != status
        out.append({"type": c.type, "status": status, "reason": c.reason, "message": c.message,
                    "observedGeneration": generation,
                    "lastTransitionTime": now if changed else prev.get("lastTransitionTime", now)})
    return out


def summarize(stages: list[Condition], *, stalled: Condition | None = None,
              rebalancing: str | None = None, paused: bool = False) -> tuple[list[Condition], str]:
    """Stage conditions -> all conditions (summary first) and the phase."""
    not_ready = [c for c in stages if not c.status]
    failed = [c for c in not_ready if c.reason in FAILURE_REASONS]
    if stalled is not None:
        ready = Condition(READY, False, stalled.reason, stalled.message)
        phase = "Failed"
    elif paused:
        ready = Condition(READY, False, "Paused", "spec.paused is true")
        phase = "Paused"
    elif failed:
        ready = Condition(READY, False, failed[0].reason, f"{failed[0].type}: {failed[0].message}")
        phase = "Degraded"
    elif not_ready:
        first = not_ready[0]
        ready = Condition(READY, False, first.reason, f"{first.type}: {first.message}")
        phase = "Provisioning"
    elif rebalancing:
        ready = Condition(READY, True, "Rebalancing", rebalancing)
        phase = "Rebalancing"
    else:
        ready = Condition(READY, True, "Running", "all stages ready")
        phase = "Running"
    # A failure is retried, but nothing is progressing until it is fixed.
    reconciling = bool(stalled is None and not paused and not failed and (not_ready or rebalancing))
    summary = [
        ready,
        Condition(RECONCILING, reconciling, "Progressing" if reconciling else "Settled",
                  rebalancing or (not_ready[0].message if not_ready and not failed else "")),
        Condition(STALLED, stalled is not None,
                  stalled.reason if stalled else "NotStalled", stalled.message if stalled else ""),
    ]
    return summary + list(stages), phase


def dedup_lag(pods) -> int | None:
    """Source records the dedup stage has not committed yet: per partition the lag its running
    owner reports (the highest, while a handoff shows it at two pods), summed. None when no
    running partition reports one."""
    lag: dict[int, int] = {}
    for pod in pods:
        for p, st in pod.partitions.items():
            if st.state == PartitionState.RUNNING and st.lag is not None:
                lag[p] = max(lag.get(p, 0), st.lag)
    return sum(lag.values()) if lag else None


# Per-second figures (the autoscaler's records/s, status.dedupStats) from samples at least this
# far apart: reconcile passes closer together would measure mostly noise.
MIN_RATE_INTERVAL_MS = 5_000


def dedup_stats(pods: dict, previous: dict | None, now_ms: int) -> dict | None:
    """status.dedupStats from the pods' /status (name -> PodStatus) and the last record: the
    state's keys and bytes over the running partitions (a partition in handoff counted once, at
    its running owner); the records the pods committed since each started, summed; and per
    second since the previous sample, a pod whose counts went down (restarted) counting from
    zero, as Prometheus' rate() does. None without any pod status."""
    if not pods:
        return None
    store: dict[int, tuple[int, int]] = {}
    for st in pods.values():
        for p, ps in st.partitions.items():
            if ps.state == PartitionState.RUNNING and ps.store is not None:
                store[p] = (ps.store.keys or 0, ps.store.bytes or 0)
    counts = {name: {k: st.counts.get(k, 0) for k in COUNT_KINDS} for name, st in sorted(pods.items())}
    out = {"stateKeys": sum(k for k, _ in store.values()), "stateBytes": sum(b for _, b in store.values()),
           "records": {k: sum(c[k] for c in counts.values()) for k in COUNT_KINDS},
           "sampledAtMs": now_ms, "pods": counts}
    prev = previous or {}
    dt = now_ms - prev.get("sampledAtMs", now_ms)
    if prev.get("pods") is not None and dt < MIN_RATE_INTERVAL_MS:
        # Too close to the last sample: it stays the base, and its rates stand.
        out.update(sampledAtMs=prev["sampledAtMs"], pods=prev["pods"])
        if "perSecond" in prev:
            out["perSecond"] = prev["perSecond"]
        return out
    if prev.get("pods") is not None and dt > 0:
        def delta(name: str, k: str) -> int:
            now, before = counts[name][k], prev["pods"].get(name, {}).get(k, 0)
            return now - before if now >= before else now
        out["perSecond"] = {k: round(sum(delta(n, k) for n in counts) * 1000 / dt, 1) for k in COUNT_KINDS}
    return out


def open_transactions(previous: dict | None, offsets: dict[int, tuple[int, int]], now_ms: int,
                      threshold_ms: int) -> tuple[dict, list[int]]:
    """Partitions of the output whose last stable offset stays below the high watermark: an
    open transaction holds every read_committed reader there. Returns the record for status
    (`{"<p>": {"lastStableOffset", "sinceMs"}}`, since when the LSO has not moved) and the
    partitions held longer than `threshold_ms`: a transaction the broker no longer times out
    (a hanging transaction) or a producer that keeps one open far beyond its own timeout."""
    record, hanging = {}, []
    for p, (lso, hwm) in sorted(offsets.items()):
        if lso >= hwm:
            continue
        was = (previous or {}).get(str(p)) or {}
        since = was.get("sinceMs", now_ms) if was.get("lastStableOffset") == lso else now_ms
        record[str(p)] = {"lastStableOffset": lso, "sinceMs": since}
        if now_ms - since > threshold_ms:
            hanging.append(p)
    return record, hanging


def lag_alert(since_ms: int | None, lag: int | None, now_ms: int, threshold: int | None,
              window_ms: int) -> tuple[int | None, bool]:
    """spec.dedup.lagThreshold: since when the dedup lag has stayed above the threshold (None:
    it is not above), and whether that has lasted longer than the window (phase Degraded,
    LagGrowing). Without a lag report (no pod running a partition) the last verdict stands: an
    outage must not clear the alert it causes."""
    if threshold is None:
        return None, False
    if lag is not None:
        since_ms = (since_ms if since_ms is not None else now_ms) if lag > threshold else None
    return since_ms, since_ms is not None and now_ms - since_ms >= window_ms


# The Spark stage is stuck when it has had no batch for this many triggers (at least
# STUCK_MIN_MS: a garbage collection or a slow first batch is not yet stuck) while the deduped
# topic holds records it has not read. A query with nothing to read runs no batch, rightly.
UNREACHABLE = "CheckpointUnreachable"
STUCK_TRIGGERS = 10
STUCK_MIN_MS = 60_000


def spark_lag(progress, topic: str, ends: dict[int, int] | None) -> int | None:
    """Records of `topic` the Spark stage has not read: per partition its end (the last stable
    offset, what a read_committed reader can reach, transaction markers included, as in Spark's
    own offsets) minus the offset the last batch read up to; a partition the batch does not name
    counts from 0 (Spark reads a partition new to the query from its start). None without ends."""
    if ends is None:
        return None
    read = progress.end_offsets.get(topic, {}) if progress is not None else {}
    return sum(max(0, end - read.get(p, 0)) for p, end in ends.items())


def spark_processing(progress, error: str | None, topic: str, ends: dict[int, int] | None,
                     trigger_ms: int | None, now_ms: int,
                     previous: dict | None) -> tuple[dict, Condition | None]:
    """status.processing from the driver's /progress (a core.sparkprogress.SparkProgress) and the
    deduped topic's ends, and the ProcessingReady condition that replaces the stage's own when
    the stage is stuck (else None). Without a progress (`error` says why) the last figures stay,
    with the error, and no verdict is made on them."""
    if progress is None:
        return {**(previous or {}), "error": error or "no progress"}, None
    lag = spark_lag(progress, topic, ends)
    out = {"lastBatchId": progress.batch_id,
           "lastBatchTime": rfc3339(progress.batch_time_ms) if progress.batch_time_ms is not None else None,
           "batchDurationMs": progress.batch_duration_ms,
           "inputRowsPerSecond": progress.input_rows_per_second,
           "processedRowsPerSecond": progress.processed_rows_per_second,
           "lagRecords": lag, "stateRows": progress.state_rows, "stateBytes": progress.state_bytes}
    out = {k: v for k, v in out.items() if v is not None}
    if progress.checkpoint_unreachable_since_ms is not None:
        # The cause before its symptom: the batches wait on the store, so no SparkStuck verdict.
        since = progress.checkpoint_unreachable_since_ms
        out["checkpointUnreachableSince"] = rfc3339(since)
        return out, Condition(PROCESSING, False, UNREACHABLE,
                              f"the Spark checkpoint's store has not answered for {max(0, now_ms - since) // 1000}s "
                              f"({progress.checkpoint_error}): batches wait for it and go on from the checkpoint "
                              "when it answers")
    if trigger_ms is None or not lag:  # availableNow runs once; nothing to read is no reason to run
        return out, None
    since = max(progress.batch_time_ms or 0, progress.started_at_ms)
    quiet, limit = now_ms - since, max(STUCK_TRIGGERS * trigger_ms, STUCK_MIN_MS)
    if quiet <= limit:
        return out, None
    last = f"batch {progress.batch_id}" if progress.batch_id is not None else "none since the query started"
    return out, Condition(PROCESSING, False, "SparkStuck",
                          f"no Spark batch for {quiet // 1000}s (last: {last}; the trigger is {trigger_ms}ms) "
                          f"while {lag} records wait in {topic}: see the driver's log")


def effective_window_seconds(pods) -> float | None:
    """The window the dedup state really covers: the shortest any partition reports (after a
    rebuild from a source with less retention it is shorter than spec.dedup.window). None when
    no worker reports one (none running yet)."""
    spans = [p.store.effective_window_seconds for pod in pods for p in pod.partitions.values()
             if p.store is not None and p.store.effective_window_seconds is not None]
    return min(spans) if spans else None


def merge_patch(old, new):
    """The JSON merge patch (RFC 7386) that turns `old` into `new` exactly.

    Status is written by merge patch, and a merge patch keeps every key it does not mention:
    sent as is, a record that lost a key (a rebalance target without its `reshard` block, an
    assignment without a pod scaled away) would keep the old one. So every key of `old` that
    `new` no longer has is sent as null, at every depth."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch = {k: merge_patch(old.get(k), v) for k, v in new.items()}
    patch.update({k: None for k in old if k not in new})
    return patch


def rebalance_patch(status: dict, rebalance: dict | None, last: dict | None = None) -> dict:
    """The status patch that records a rebalance step: `status.rebalance` becomes `rebalance`
    (None: no rebalance running), and `status.lastRebalance` becomes `last` if given, exactly,
    whatever `status` held before."""
    patch = {"rebalance": merge_patch(status.get("rebalance"), rebalance)}
    if last is not None:
        patch["lastRebalance"] = merge_patch(status.get("lastRebalance"), last)
    return patch
