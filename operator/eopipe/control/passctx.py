"""What one reconcile pass works with: the control plane's clients (`Plane`), the pass itself
(`Pass`: the pipeline, its body as read at the start, the outcome being built, its one Kafka
admin client) and the `Outcome` the handler turns into status and events."""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka.admin import AdminClient
from kubernetes import client
from pydantic import ValidationError

from eopipe.control import nodeloss
from eopipe.control.kube import Applier
from eopipe.control.observe import Observer
from eopipe.control.recorder import StatusRecorder
from eopipe.control.settings import Settings
from eopipe.control.status import Condition
from eopipe.core.names import Names
from eopipe.core.rebalancing import Facts


def first_error(exc: BaseException) -> str:
    """One line for a condition: a spec error as `spec.<field>: <why>`, else the exception's text."""
    if isinstance(exc, ValidationError):
        e = exc.errors()[0]
        loc = ".".join(str(p) for p in e["loc"])
        return f"spec.{loc}: {e['msg']}" if loc else e["msg"]
    return str(exc)


@dataclass
class Outcome:
    stages: list[Condition] = field(default_factory=list)
    stalled: Condition | None = None
    fields: dict = field(default_factory=dict)  # extra status fields
    retry: bool = False  # something failed that is worth retrying soon
    retry_reason: str = "Kafka not reachable yet"
    rebalancing: str | None = None  # the running rebalance's message (phase Rebalancing)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (Normal|Warning, reason, message)

    def stage(self, type_: str) -> Condition | None:
        return next((c for c in self.stages if c.type == type_), None)

    def ready(self, type_: str) -> bool:
        return any(c.type == type_ and c.status for c in self.stages)

    def replace(self, condition: Condition) -> None:
        """`condition` in place of the stage condition of its type."""
        self.stages = [condition if c.type == condition.type else c for c in self.stages]


@dataclass
class Plane:
    """The operator's clients, made once and shared by every pass."""
    api: client.ApiClient
    core: client.CoreV1Api
    applier: Applier
    observer: Observer
    recorder: StatusRecorder
    settings: Settings
    kafka_timeout: float


class Pass:
    """One reconcile pass of one pipeline. Its Kafka admin client is made on first use (a
    refused or conflicting pipeline never connects) and shared by every Kafka read and write
    of the pass; `close` lets it go at the end (confluent_kafka's AdminClient has no close():
    the client is destroyed with its last reference)."""

    def __init__(self, plane: Plane, names: Names, body: dict, out: Outcome):
        self.plane, self.names, self.body, self.out = plane, names, body, out
        self._admin: AdminClient | None = None
        self.facts: Facts | None = None  # the dedup stage's last observation (stage_dedup)
        self.nodes: nodeloss.Facts | None = None  # the dedup pods' nodes, read once (stage_nodes.observe)

    @property
    def meta(self) -> dict:
        return self.body["metadata"]

    @property
    def status(self) -> dict:
        return self.body.get("status") or {}

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = self.plane.observer.kafka_admin(self.names)
        return self._admin

    def record(self, status_patch: dict) -> None:
        """A write-ahead status record (StatusRecorder)."""
        self.plane.recorder.record(self.meta["namespace"], self.meta["name"], status_patch)

    def close(self) -> None:
        self._admin = None
