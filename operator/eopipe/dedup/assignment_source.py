"""Where a worker reads its partition assignment.

The operator publishes the assignment in a ConfigMap. A pod sees it two ways: the mounted file,
which the kubelet refreshes only every sync period (typically 60-90 s on a real node), and the
ConfigMap itself through a watch on the API, which arrives within a second. A handoff or a
re-shard waits for every pod to follow a new generation, so the watch is what keeps those
pauses short; the file keeps the pod working when the API is unreachable or RBAC forbids the
watch. The newest generation wins (the operator only ever raises it); on a tie the API's copy.
"""

from __future__ import annotations

import json
import logging
import threading
from logging import INFO, WARNING
from pathlib import Path

from eopipe.core.assignment import CONFIGMAP_KEY, Assignment
from eopipe.dedup.logs import event

log = logging.getLogger("eopipe.dedup.assignment")


class ConfigMapWatch(threading.Thread):
    """Keeps the latest assignment of one ConfigMap, watched through the API; reconnects with
    back-off. `latest` is None until the first read."""

    def __init__(self, namespace: str, name: str, changed: threading.Event):
        super().__init__(name="assignment-watch", daemon=True)
        self.namespace, self.name = namespace, name
        self.latest: Assignment | None = None
        self.changed = changed
        self._stop = threading.Event()
        self._watch = None

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def run(self) -> None:
        # Imported here: workers with --partitions or a file only never load the client.
        from kubernetes import client, watch

        from eopipe.core.kubeclient import load_config

        try:
            core = client.CoreV1Api(load_config())
        except Exception as e:  # noqa: BLE001
            event(log, WARNING, "no Kubernetes credentials: following the mounted assignment file only",
                  error=str(e))
            return
        backoff, failing = 1.0, False
        while not self._stop.is_set():
            self._watch = watch.Watch()
            try:
                # A watch without a resourceVersion starts with the object as it is (ADDED).
                for ev in self._watch.stream(core.list_namespaced_config_map, self.namespace,
                                             field_selector=f"metadata.name={self.name}",
                                             timeout_seconds=300, _request_timeout=330):
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self._take(ev["object"])
                    if failing:
                        event(log, INFO, "watching the assignment ConfigMap again", configmap=self.name)
                    backoff, failing = 1.0, False
            except Exception as e:  # noqa: BLE001 - any failure: the file still works; retry
                if not failing:
                    event(log, WARNING, "cannot watch the assignment ConfigMap; following the "
                          "mounted file until it works", configmap=self.name, error=str(e)[:300])
                failing = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _take(self, cm) -> None:
        text = (cm.data or {}).get(CONFIGMAP_KEY)
        if not text:
            return
        try:
            self.latest = Assignment.from_json(json.loads(text))
            self.changed.set()
        except (ValueError, KeyError, TypeError) as e:
            event(log, WARNING, "unreadable assignment in the ConfigMap", error=str(e))


class AssignmentSource:
    """The fixed --partitions (generation 0), or the newest of the file and the watched
    ConfigMap. `changed` is set when the watch brings a new copy."""

    def __init__(self, me: str, partitions: list[int] | None = None, file: Path | None = None,
                 namespace: str | None = None, configmap: str | None = None):
        self.me, self.partitions, self.file = me, partitions, file
        self.changed = threading.Event()
        self.watch = ConfigMapWatch(namespace, configmap, self.changed) if configmap else None

    def start(self) -> None:
        if self.watch is not None:
            self.watch.start()

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()

    def read(self) -> Assignment:
        """Raises OSError/ValueError while neither copy is readable. A pod missing from the
        assignment owns nothing: it may be about to be scaled away."""
        if self.partitions is not None:
            return Assignment(0, {p: self.me for p in self.partitions})
        api = self.watch.latest if self.watch is not None else None
        try:
            mounted = Assignment.from_json(json.loads(self.file.read_text())) if self.file else None
        except (OSError, ValueError, KeyError, TypeError):
            if api is None:
                raise
            mounted = None
        if mounted is None and api is None:
            raise ValueError(f"no assignment yet from ConfigMap {self.watch.name}")
        if mounted is None or (api is not None and api.generation >= mounted.generation):
            return api
        return mounted
