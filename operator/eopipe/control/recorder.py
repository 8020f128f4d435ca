"""The one writer of a pipeline's status.

Every status patch goes through `StatusRecorder.record`: the write-ahead records of a pass
(the rebalance step before its actions, the autoscaler's count before the rebalance it starts,
the topics the operator created the moment it created them) and the pass's final status
(handlers.py). A merge patch: what a record drops is sent as null (status.merge_patch).
"""

from __future__ import annotations

from kubernetes import client

from eopipe.core.spec import RESOURCE


class StatusRecorder:
    def __init__(self, api: client.ApiClient):
        self.custom = client.CustomObjectsApi(api)

    def record(self, namespace: str, name: str, status_patch: dict) -> None:
        group, version, plural = RESOURCE
        self.custom.patch_namespaced_custom_object_status(group, version, namespace, plural, name,
                                                          {"status": status_patch})
