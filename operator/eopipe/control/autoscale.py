"""The dedup stage's autoscaler (docs/design.md#autoscaling): pure, recorded in status.

`decide(cfg, obs, previous) -> Decision`: the spec's `dedup.autoscale`, what a reconcile pass
observed (the replicas running, the total lag, records/s into the source, the partition count,
whether a rebalance runs) and the last `status.autoscale` in; the desired replicas, why, the next
`status.autoscale` and an event out. The desired count replaces `spec.dedup.replicas` in the
rebalance facts, so a change moves partitions by the same live snapshot handoff as an edit.

The math is the HorizontalPodAutoscaler's, per metric `ceil(total / target per replica)`, a
metric within TOLERANCE of its target recommending no change, the larger recommendation of lag
and throughput winning. Every recommendation is kept with its time for the longer of the two
stabilization windows: a scale up goes only as far as the lowest recommendation of the up
window (a burst must last), a scale down only as far as the highest of the down window (a lull
must last). Then at most `maxStep` pods per move, within [minReplicas, maxReplicas] and never
above the partition count (a pod owns whole partitions). While a rebalance runs nothing is
recommended: its handoff pause inflates the lag, and its target is fixed anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from eopipe.control.status import MIN_RATE_INTERVAL_MS, dedup_lag
from eopipe.core.durations import duration_ms, rfc3339
from eopipe.core.wire import PartitionState

TOLERANCE = 0.1


@dataclass(frozen=True)
class Observation:
    now_ms: int
    current: int                    # dedup pods running (the StatefulSet's replicas); 0: none yet
    partitions: int                 # the source's partitions (Kafka's count, else the spec's)
    lag: int | None = None          # source records not yet committed, all partitions; None: unknown
    rate: float | None = None       # records/s into the source; None: unknown
    rebalancing: bool = False
    paused: bool = False
    spec_replicas: int = 1          # spec.dedup.replicas: the starting count


@dataclass
class Decision:
    desired: int
    reason: str
    message: str
    record: dict                    # the next status.autoscale
    events: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.events)


def _clamp(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, n))


def recommend(current: int, total: float | None, target: float) -> int | None:
    """The HPA's formula for one metric: the pods that bring `total` to `target` per pod; the
    current count while within TOLERANCE of it. None: the metric is unknown."""
    if total is None:
        return None
    if current > 0 and abs(total / (current * target) - 1) <= TOLERANCE:
        return current
    return math.ceil(total / target)


def stabilize(current: int, history: list[dict], now_ms: int, up_ms: int, down_ms: int) -> int:
    """HPA's stabilization: up to the lowest recommendation of the up window, down to the
    highest of the down window (`history` holds {atMs, replicas}, the newest included)."""
    up = min(r["replicas"] for r in history if now_ms - r["atMs"] <= up_ms)
    down = max(r["replicas"] for r in history if now_ms - r["atMs"] <= down_ms)
    # In the HPA's order: raised to the up window's floor, then capped by the down window's peak.
    return min(max(current, up), down)


def decide(cfg, obs: Observation, previous: dict | None) -> Decision:
    """`cfg` is a core.spec.Autoscale; `previous` the recorded status.autoscale (or None)."""
    previous = previous or {}
    hi = max(1, min(cfg.max_replicas, obs.partitions))
    lo = min(cfg.min_replicas, hi)
    capped = (f"; maxReplicas {cfg.max_replicas} capped at the source's {obs.partitions} partitions"
              if cfg.max_replicas > obs.partitions else "")
    current = obs.current if obs.current > 0 else _clamp(obs.spec_replicas, lo, hi)
    held = previous.get("desiredReplicas")
    held = _clamp(int(held) if isinstance(held, int) else current, lo, hi)
    history = [r for r in previous.get("recommendations") or ()
               if isinstance(r, dict) and isinstance(r.get("atMs"), int) and isinstance(r.get("replicas"), int)]
    metrics = (f"lag {obs.lag if obs.lag is not None else 'unknown'} records"
               + (f", {obs.rate:.0f} records/s" if obs.rate is not None else ""))

    by_lag = recommend(current, obs.lag, cfg.target_lag_per_replica)
    by_rate = (recommend(current, obs.rate, cfg.target_records_per_second_per_replica)
               if cfg.target_records_per_second_per_replica else None)
    if obs.paused or obs.rebalancing or (by_lag is None and by_rate is None):
        reason = "Paused" if obs.paused else "Rebalancing" if obs.rebalancing else "NoMetrics"
        why = {"Paused": "spec.paused: holding", "Rebalancing": "a rebalance is running: holding",
               "NoMetrics": "no dedup pod reports its lag yet: holding"}[reason]
        return _decision(obs, previous, held, reason, f"{why} {held}{capped}", history, lo, hi)

    raw = max(r for r in (by_lag, by_rate) if r is not None)
    up_ms, down_ms = duration_ms(cfg.scale_up_stabilization), duration_ms(cfg.scale_down_stabilization)
    history = [r for r in history if obs.now_ms - r["atMs"] <= max(up_ms, down_ms)]
    history.append({"atMs": obs.now_ms, "replicas": raw})
    stable = stabilize(current, history, obs.now_ms, up_ms, down_ms)
    stepped = _clamp(stable, current - cfg.max_step, current + cfg.max_step)
    desired = _clamp(stepped, lo, hi)

    driver = ("throughput" if by_rate is not None and by_rate > (by_lag or 0) else "lag")
    if desired > current:
        reason = ("BelowMinReplicas" if stepped <= current
                  else "LagAboveTarget" if driver == "lag" else "ThroughputAboveTarget")
    elif desired < current:
        reason = "AboveMaxReplicas" if stepped >= current else "BelowTarget"
    elif raw > current:
        reason = "AtMaxReplicas" if current >= hi else "ScaleUpStabilizing"
    elif raw < current:
        reason = "AtMinReplicas" if current <= lo else "ScaleDownStabilizing"
    else:
        reason = "WithinTarget"
    detail = [f"{metrics} over {current} pod{'s' * (current != 1)} (target {cfg.target_lag_per_replica} lag"
              + (f", {cfg.target_records_per_second_per_replica} records/s"
                 if cfg.target_records_per_second_per_replica else "") + " per pod)",
              f"recommends {raw}"]
    if stable != raw:
        detail.append(f"stabilized to {stable}")
    if stepped != stable:
        detail.append(f"{'+' if stepped > current else '-'}{cfg.max_step} per step")
    if desired != stepped:
        detail.append(f"within [{lo}, {hi}]")
    return _decision(obs, previous, desired, reason, ": ".join(detail[:2]) + "".join(
        f", {d}" for d in detail[2:]) + f" -> {desired}{capped}", history, lo, hi)


def _decision(obs: Observation, previous: dict, desired: int, reason: str, message: str,
              history: list[dict], lo: int, hi: int) -> Decision:
    record = {"desiredReplicas": desired, "currentReplicas": obs.current, "minReplicas": lo, "maxReplicas": hi,
              "reason": reason, "message": message, "recommendations": history}
    if obs.lag is not None:
        record["lag"] = obs.lag
    if obs.rate is not None:
        record["recordsPerSecond"] = round(obs.rate, 1)
    for k in ("lastScaleTime", "lastScaleTimeMs", "sample"):
        if k in previous:
            record[k] = previous[k]
    events = []
    # A change from what was recorded, else from what runs (autoscale just enabled); a new
    # pipeline's first count is no scaling.
    was = previous.get("desiredReplicas", obs.current or desired)
    if was != desired:
        record["lastScaleTime"], record["lastScaleTimeMs"] = rfc3339(obs.now_ms), obs.now_ms
        events.append(("Normal", "Autoscaled", f"dedup replicas {was} -> {desired} ({reason}): {message}"))
    return Decision(desired, reason, message, record, events)


# -- throughput ------------------------------------------------------------------------------------
def end_offsets(pods) -> dict[int, int]:
    """The source's end offset per partition as the running owners last saw it (committed +
    lag; the highest while a handoff shows a partition at two pods)."""
    ends: dict[int, int] = {}
    for pod in pods:
        for p, st in pod.partitions.items():
            if st.state == PartitionState.RUNNING and st.committed is not None and st.lag is not None:
                ends[p] = max(ends.get(p, 0), st.committed + st.lag)
    return ends


def throughput(sample: dict | None, ends: dict[int, int], now_ms: int,
               last_rate: float | None = None) -> tuple[dict | None, float | None]:
    """Records/s into the source since `sample` ({atMs, offsets}), over the partitions both
    report. Returns the sample to keep and the rate: the earlier one and `last_rate` while the
    samples are closer than MIN_RATE_INTERVAL_MS, the new one and None when nothing compares."""
    now = {"atMs": now_ms, "offsets": {str(p): o for p, o in sorted(ends.items())}}
    if not ends:
        return sample, None
    if not isinstance(sample, dict) or not isinstance(sample.get("offsets"), dict) \
            or not isinstance(sample.get("atMs"), int):
        return now, None
    elapsed = now_ms - sample["atMs"]
    if elapsed < MIN_RATE_INTERVAL_MS:
        return sample, last_rate
    common = [p for p in now["offsets"] if p in sample["offsets"]]
    grown = sum(now["offsets"][p] - int(sample["offsets"][p]) for p in common)
    if not common or grown < 0:  # a partition re-created or read from a stale pod: start over
        return now, None
    return now, grown * 1000 / elapsed


def observe(cfg, facts, rb, previous: dict | None) -> Decision:
    """The decision from a reconcile pass's rebalance facts (core.rebalancing.Facts), the running
    rebalance (core.rebalancing.Rebalance; None: none) and the recorded status.autoscale; the
    records/s sample rides along in the record. The facts are not changed: the caller hands
    `decision.desired` to the rebalance as its wanted count."""
    previous = previous or {}
    statuses = [pf.status for pf in facts.pods.values() if pf.status is not None]
    sample, rate = throughput(previous.get("sample"), end_offsets(statuses), facts.now_ms,
                              previous.get("recordsPerSecond"))
    current = facts.sts_replicas or 0
    obs = Observation(now_ms=facts.now_ms, current=current,
                      partitions=facts.actual_partitions or facts.partitions, lag=dedup_lag(statuses),
                      rate=rate, rebalancing=rb is not None, paused=facts.paused, spec_replicas=facts.replicas)
    d = decide(cfg, obs, previous)
    if sample is not None:
        d.record["sample"] = sample
    return d
