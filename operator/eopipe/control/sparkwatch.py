"""The operator's watch of the SparkApplications and dedup StatefulSets it made, and of Nodes: a
change of the application's state (a driver Failed, the Stalled/CheckpointIncompatible exit), or
of the count of ready dedup pods (one on a node that stopped reporting turns NotReady:
control/nodeloss.py), reconciles the owning pipeline at once instead of at the next resync
(Settings.resync_seconds, a minute in the chart); a node turning cordoned reconciles every
pipeline with dedup pods. All share one memory: a pipeline's passes keep their gap whichever
object changed.

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
    dedup: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # StatefulSet -> its pipeline

    def _remember(self, key: tuple[str, ...], state: str, deleted: bool) -> str | None:
        """The state seen before; a deleted object is forgotten (bounded memory)."""
        was = self.seen.pop(key, None) if deleted else self.seen.get(key)
        if not deleted:
            self.seen[key] = state
        return was

    def _decide(self, was: str | None, state: str, deleted: bool, pipeline: tuple[str, str],
                now: float) -> Decision:
        d = decide(was, state, deleted, self.passes.get(pipeline), now)
        if d.trigger:
            self.passes[pipeline] = now + d.delay
        return d

    def observe(self, key: tuple[str, ...], pipeline: tuple[str, str], state: str, deleted: bool,
                now: float) -> Decision:
        if key[0] == "StatefulSet":
            if deleted:
                self.dedup.pop(key[1:], None)
            else:
                self.dedup[key[1:]] = pipeline
        return self._decide(self._remember(key, state, deleted), state, deleted, pipeline, now)

    def cordon(self, node: str, cordoned: bool, deleted: bool, now: float) -> list[tuple[tuple[str, str], float]]:
        """A Node's event. When it turns cordoned (kubectl cordon, the first step of a drain):
        every pipeline with a dedup StatefulSet, each with its delay, since a budget of
        maxUnavailable 0 holds the drain until the operator moves the partitions off it."""
        state = "cordoned" if cordoned else ""
        was = self._remember(("Node", "", node), state, deleted)
        if not cordoned or deleted:
            return []
        decisions = ((pipeline, self._decide(was, state, False, pipeline, now))
                     for pipeline in sorted(set(self.dedup.values())))
        return [(pipeline, d.delay) for pipeline, d in decisions if d.trigger]
