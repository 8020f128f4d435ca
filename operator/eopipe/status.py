"""Pipeline status in the kstatus convention: conditions, phase and observedGeneration.

Pure functions: the reconcile handler gathers facts (per-stage conditions) and these derive
the summary conditions (Ready, Reconciling, Stalled) and the phase, so Argo CD and
`kubectl wait --for=condition=Ready` read the same truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

STAGES = ("TopicsReady", "DedupReady", "ProcessingReady")


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str = ""


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def merge_conditions(old: list[dict] | None, new: list[Condition], generation: int,
                     now: str | None = None) -> list[dict]:
    """Conditions as the API wants them; lastTransitionTime moves only when status flips."""
    now = now or now_rfc3339()
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
    if stalled is not None:
        ready = Condition("Ready", False, stalled.reason, stalled.message)
        phase = "Failed"
    elif paused:
        ready = Condition("Ready", False, "Paused", "spec.paused is true")
        phase = "Paused"
    elif not_ready:
        first = not_ready[0]
        ready = Condition("Ready", False, first.reason, f"{first.type}: {first.message}")
        phase = "Provisioning"
    elif rebalancing:
        ready = Condition("Ready", True, "Rebalancing", rebalancing)
        phase = "Rebalancing"
    else:
        ready = Condition("Ready", True, "Running", "all stages ready")
        phase = "Running"
    reconciling = bool(stalled is None and not paused and (not_ready or rebalancing))
    summary = [
        ready,
        Condition("Reconciling", reconciling, "Progressing" if reconciling else "Settled",
                  rebalancing or (not_ready[0].message if not_ready else "")),
        Condition("Stalled", stalled is not None,
                  stalled.reason if stalled else "NotStalled", stalled.message if stalled else ""),
    ]
    return summary + list(stages), phase


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
