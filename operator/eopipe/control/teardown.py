"""What a pipeline's deletion removes itself, before the garbage collector takes the rest: the
dedup pods' state claims, their StatefulSet first scaled to zero (the Spark checkpoint claim is
owned by the pipeline and goes with it).

Not the StatefulSet's persistentVolumeClaimRetentionPolicy (whenDeleted: Delete): with it the
StatefulSet controller writes an owner reference into each claim it creates while the
scheduler's volume binding writes the same claim; the binding fails on the conflict and the
pods, scheduled again, land on one node, not spread (kubernetes#121436)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kubernetes import client

from eopipe.control.builders.dedup import STATE_VOLUME
from eopipe.control.kube import delete_by_uid
from eopipe.core.names import dedup_set, label_selector


@dataclass(frozen=True)
class Found:
    """A claim in the pipeline's namespace carrying its dedup labels."""
    name: str
    uid: str


def state_claims(pipeline: str, found: list[Found]) -> list[Found]:
    """The claims the dedup StatefulSet made (`state-<set>-<ordinal>`, every ordinal it ever ran,
    scaled-down ones too): labels alone are not enough, anyone who may create a claim may set them."""
    made = re.compile(rf"{re.escape(STATE_VOLUME)}-{re.escape(dedup_set(pipeline))}-(0|[1-9][0-9]*)")
    return sorted((c for c in found if made.fullmatch(c.name)), key=lambda c: c.name)


def delete_dedup_state(api: client.ApiClient, namespace: str, pipeline: str, owner_uid: str) -> list[str]:
    """Scales the pipeline's dedup StatefulSet to zero and deletes its state claims, each by uid;
    returns the claims deleted. Nothing if a set of that name is not the pipeline's. A claim still
    mounted by a terminating pod is removed when the pod is gone (kubernetes.io/pvc-protection)."""
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    name = dedup_set(pipeline)
    try:
        sts = apps.read_namespaced_stateful_set(name, namespace)
    except client.ApiException as e:
        if e.status != 404:
            raise
    else:
        if not any(ref.uid == owner_uid and ref.controller for ref in sts.metadata.owner_references or ()):
            return []  # someone else's set of that name (ObjectConflict): its claims are not ours
        # Scaled to zero, not deleted (the operator may not delete a StatefulSet): it makes no
        # pod, so no claim, again; the garbage collector deletes it with the pipeline. The uid
        # in the patch is its precondition.
        delete_by_uid(lambda: apps.patch_namespaced_stateful_set(
            name, namespace, {"metadata": {"uid": sts.metadata.uid}, "spec": {"replicas": 0}}))
    listed = core.list_namespaced_persistent_volume_claim(
        namespace, label_selector=label_selector(pipeline, "dedup"))
    claims = state_claims(pipeline, [Found(c.metadata.name, c.metadata.uid) for c in listed.items])
    for c in claims:
        delete_by_uid(lambda c=c: core.delete_namespaced_persistent_volume_claim(
            c.name, namespace, body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=c.uid))))
    return [c.name for c in claims]
