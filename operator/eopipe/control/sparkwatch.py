"""The operator's watch of the SparkApplications and dedup StatefulSets it made: a change of the
application's state (a driver Failed, the Stalled/CheckpointIncompatible exit), or of the count
of ready dedup pods (one on a node that stopped reporting turns NotReady: control/nodeloss.py),
reconciles the owning pipeline at once instead of at the next resync (Settings.resync_seconds, a
minute in the chart). Both share one memory: a pipeline's passes keep their gap whichever child
changed.

Only status.applicationState.state matters, and the application's deletion (the pass that
follows creates it again, as after a resubmission): the Spark Operator patches its status often
(executor states, timestamps), and each patch is an event. The first sight of an application
(the watch's listing at start, one the operator has just created) triggers nothing: the
operator's resume and create handlers reconcile then anyway. A flapping driver cannot make the
operator loop: a pipeline is reconciled for its application at most once per MIN_GAP_SECONDS,
a change inside that gap waiting for its end, and a change while a pass is due adding none (that
pass reads the application as it is then). Kopf also handles one object's events in order and
hands the handler only the latest of those that queued while it waited.

`decide` and `owner` are pure; handlers.py holds the memory (Watch) and does the I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eopipe.core.spec import GROUP, KIND

MIN_GAP_SECONDS = 5.0  # as the retry delay of a pass that waits (handlers.py TemporaryError)
RETRIES = 6  # passes one event may make while the pass asks to be retried (about 30 s); then the resync


def state_of(app: dict) -> str:
    return str(((app.get("status") or {}).get("applicationState") or {}).get("state") or "")


def ready_of(sts: dict) -> str:
    """A StatefulSet's state for the watch: its ready pods of those it wants. The controller
    patches its status for every pod change; only the count matters here."""
    spec, status = sts.get("spec") or {}, sts.get("status") or {}
    return f"{status.get('readyReplicas') or 0}/{spec.get('replicas')}"


def owner(meta: dict) -> str | None:
    """The pipeline whose controller ownerReference the application carries (the operator sets it,
    kube.Applier), else None: an application of someone else's is not the operator's business."""
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == KIND \
                and str(ref.get("apiVersion", "")).split("/")[0] == GROUP and ref.get("name"):
            return ref["name"]
    return None


@dataclass(frozen=True)
class Decision:
    trigger: bool
    delay: float = 0.0  # seconds to wait before the pass (the gap since the last one)


def decide(seen: str | None, state: str, deleted: bool, last_pass: float | None, now: float,
           min_gap: float = MIN_GAP_SECONDS) -> Decision:
    """seen: the state last seen of this application (None: never seen); last_pass: when this
    watch last reconciled its pipeline, or will (monotonic; None: never)."""
    if seen is None or (seen == state and not deleted):
        return Decision(False)
    if last_pass is not None and last_pass > now:  # a pass is due: it reads the state as it is then
        return Decision(False)
    wait = 0.0 if last_pass is None else max(0.0, last_pass + min_gap - now)
    return Decision(True, wait)


@dataclass
class Watch:
    """The memory between events: each application's last state, each pipeline's last pass."""
    seen: dict[tuple[str, ...], str] = field(default_factory=dict)  # by (kind, namespace, name)
    passes: dict[tuple[str, str], float] = field(default_factory=dict)

    def observe(self, key: tuple[str, ...], pipeline: tuple[str, str], state: str, deleted: bool,
                now: float) -> Decision:
        d = decide(self.seen.get(key), state, deleted, self.passes.get(pipeline), now)
        if deleted:  # bounded: a deleted application is forgotten
            self.seen.pop(key, None)
        else:
            self.seen[key] = state
        if d.trigger:
            self.passes[pipeline] = now + d.delay
        return d
