"""Server-side apply of built manifests, owned by the pipeline.

Server-side apply makes every reconcile the same call whether an object is missing, drifted
or current: the operator's field manager owns the fields it sets and forces them back.
"""

from __future__ import annotations

import json

from kubernetes import client
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

FIELD_MANAGER = "eopipe-operator"
# Answers that a retry of the same object cannot change (invalid, forbidden, an immutable
# field): reported in status; anything else (a timeout, a 5xx) is raised and retried.
_REFUSED = {400, 403, 404, 422}


class ApplyError(Exception):
    """The API server refused an object the operator applies; str() is its own message."""

    def __init__(self, manifest: dict, e: client.ApiException):
        self.kind, self.name, self.status = manifest["kind"], manifest["metadata"]["name"], e.status
        try:
            why = json.loads(e.body)["message"]
        except (TypeError, ValueError, KeyError):
            why = e.reason
        super().__init__(f"{self.kind} {self.name}: {why}")


def owner_reference(owner: dict) -> dict:
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


class Applier:
    def __init__(self, api: client.ApiClient):
        self.dyn = DynamicClient(api)

    def _resource(self, api_version: str, kind: str):
        return self.dyn.resources.get(api_version=api_version, kind=kind)

    def apply(self, manifest: dict, owner: dict | None = None) -> dict:
        if owner is not None:
            manifest = {**manifest, "metadata": {**manifest["metadata"],
                                                 "ownerReferences": [owner_reference(owner)]}}
        res = self._resource(manifest["apiVersion"], manifest["kind"])
        try:
            out = res.server_side_apply(body=manifest, name=manifest["metadata"]["name"],
                                        namespace=manifest["metadata"].get("namespace"),
                                        field_manager=FIELD_MANAGER, force_conflicts=True)
        except client.ApiException as e:
            if e.status in _REFUSED:
                raise ApplyError(manifest, e) from None
            raise
        return out.to_dict()

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict | None:
        try:
            return self._resource(api_version, kind).get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None

    def kind_available(self, api_version: str, kind: str) -> bool:
        try:
            self._resource(api_version, kind)
            return True
        except ResourceNotFoundError:
            return False
