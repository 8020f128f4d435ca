"""Server-side apply of built manifests, owned by the pipeline.

Server-side apply makes every reconcile the same call whether an object is missing, drifted
or current: the operator's field manager owns the fields it sets and forces them back, on the
pipeline's own objects only (control/ownership.py): an object of that name someone else made is
left as it is (ObjectConflict). So that no write lands on an object made or replaced since it
was read, a missing object is created with a POST (409 if it exists) and every apply names the
object's uid.
"""

from __future__ import annotations

import json

from kubernetes import client
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

from eopipe.control import ownership

FIELD_MANAGER = "eopipe-operator"
# Answers that a retry of the same object cannot change (invalid, forbidden, an immutable
# field): reported in status; anything else (a timeout, a 5xx) is raised and retried.
_REFUSED = {400, 403, 404, 422}


class ApplyError(Exception):
    """The API server refused an object the operator applies; str() is its own message."""

    def __init__(self, manifest: dict, e: client.ApiException):
        self.kind, self.name, self.status = manifest["kind"], manifest["metadata"]["name"], e.status
        super().__init__(f"{self.kind} {self.name}: {api_message(e) or e.reason}")


def api_message(e: client.ApiException) -> str:
    """The message of the Status the API server answered with, "" if it sent none."""
    try:
        return str(json.loads(e.body)["message"])
    except (TypeError, ValueError, KeyError):
        return ""


def delete_by_uid(delete) -> None:
    """A delete whose uid precondition names the object observed: already gone (404) or already
    replaced by one of the same name (409) is done."""
    try:
        delete()
    except client.ApiException as e:
        if e.status not in (404, 409):
            raise


def owner_reference(owner: dict) -> dict:
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


class Applier:
    def __init__(self, api: client.ApiClient):
        self.dyn = DynamicClient(api)

    def _resource(self, api_version: str, kind: str):
        return self.dyn.resources.get(api_version=api_version, kind=kind)

    def apply(self, manifest: dict, owner: dict | None = None, *, owned: bool = True,
              retainable: bool = False, create_only: bool = False) -> dict:
        """Applies `manifest` for the pipeline `owner`, with an ownerReference to it if `owned`.
        An existing object that is not the pipeline's raises ObjectConflict untouched;
        `retainable`: the object may outlive its pipeline (ownership.decide's kept_for). Without
        an owner (tools, tests), a plain forced apply. `create_only`: a missing object is made
        by the POST alone, one write (control/sparkwrites.py says why); a later apply takes its
        fields over."""
        if owner is None:
            return self._apply(manifest)
        meta = manifest["metadata"]
        live = self.get(manifest["apiVersion"], manifest["kind"], meta["name"], meta.get("namespace"))
        decision = ownership.decide(None if live is None else live["metadata"], owner["metadata"]["uid"],
                                    owner["metadata"]["name"] if retainable else None)
        if decision == ownership.CONFLICT:
            raise ownership.ObjectConflict(manifest["kind"], meta.get("namespace") or "", meta["name"])
        if owned:
            manifest = {**manifest, "metadata": {**meta, "ownerReferences": [owner_reference(owner)]}}
        if decision == ownership.CREATE:
            live = self._create(manifest)
            if create_only:
                return live
        # The uid read (or just made) is a precondition, uid being immutable (422): an object
        # replaced by someone else since is refused, never overwritten.
        out = self._apply({**manifest, "metadata": {**manifest["metadata"], "uid": live["metadata"]["uid"]}})
        return self._drop_create_entry(out)

    def _create(self, manifest: dict) -> dict:
        """POST, the one write that fails if the object exists: made since the read, it is not
        the pipeline's (an apply would have taken it over)."""
        meta = manifest["metadata"]
        try:
            return self._resource(manifest["apiVersion"], manifest["kind"]).create(
                body=manifest, namespace=meta.get("namespace"), field_manager=FIELD_MANAGER).to_dict()
        except client.ApiException as e:
            if e.status == 409:
                raise ownership.ObjectConflict(manifest["kind"], meta.get("namespace") or "", meta["name"]) from None
            if e.status in _REFUSED:
                raise ApplyError(manifest, e) from None
            raise

    def _drop_create_entry(self, obj: dict) -> dict:
        """The create's Update entry in managedFields, dropped once the apply owns the same fields:
        it would go on owning a field the manifest later leaves out, which an apply then keeps.
        Without it the object is as if the apply had created it."""
        meta = obj["metadata"]
        entries = meta.get("managedFields") or []
        keep = [m for m in entries if (m.get("manager"), m.get("operation")) != (FIELD_MANAGER, "Update")]
        if len(keep) == len(entries):
            return obj
        return self._resource(obj["apiVersion"], obj["kind"]).patch(
            body={"metadata": {"uid": meta["uid"], "managedFields": keep}}, name=meta["name"],
            namespace=meta.get("namespace"), content_type="application/merge-patch+json").to_dict()

    def _apply(self, manifest: dict) -> dict:
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
