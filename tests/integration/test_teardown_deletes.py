"""A deleted pipeline's dedup state, on a real API server and its controllers
(control/teardown.py): the StatefulSet scaled to zero, the claims it made deleted, and nothing
else. A StatefulSet whose pods never run (no scheduler serves their name), no Kafka."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from eopipe.control import teardown
from eopipe.control.builders.dedup import STATE_VOLUME
from eopipe.core.names import Names
from tests.helpers.pipelines import example_names


def _claim(name: str, labels: dict | None) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {
        "storageClassName": "", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}}


def _set(names: Names, owner: client.V1ConfigMap) -> dict:
    labels = names.labels("dedup")
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {
        "name": names.dedup, "labels": labels, "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name, "uid": owner.metadata.uid,
            "controller": True}]},
        "spec": {"replicas": 2, "serviceName": names.dedup, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": names.selector("dedup")},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "schedulerName": "eopipe-nobody", "containers": [
                         {"name": "dedup", "image": "eopipe:never-runs",
                          "volumeMounts": [{"name": STATE_VOLUME, "mountPath": "/state"}]}]}},
                 "volumeClaimTemplates": [{"metadata": {"name": STATE_VOLUME, "labels": labels},
                                           "spec": _claim(STATE_VOLUME, None)["spec"]}]}}


def _claims(core: client.CoreV1Api, ns: str) -> set[str]:
    return {c.metadata.name for c in core.list_namespaced_persistent_volume_claim(ns).items
            if c.metadata.deletion_timestamp is None}


def _until(what, fn, timeout=30.0):
    end = time.monotonic() + timeout
    while not fn():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.k8s
def test_only_the_claims_its_statefulset_made_are_deleted(kube_api, k8s_namespace):
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    ex = example_names()
    names = Names(k8s_namespace, ex.pipeline, ex.spec)
    owner = core.create_namespaced_config_map(k8s_namespace, {"metadata": {"name": "the-pipeline"}})
    apps.create_namespaced_stateful_set(k8s_namespace, _set(names, owner))
    made = {f"{STATE_VOLUME}-{names.dedup}-{i}" for i in (0, 1)}
    _until("the StatefulSet's claims", lambda: made <= _claims(core, k8s_namespace))
    labels = names.labels("dedup")
    scaled_down = f"{STATE_VOLUME}-{names.dedup}-5"  # left by a scale-down (whenScaled: Retain)
    kept = {"tenants-own": labels, f"{STATE_VOLUME}-{names.dedup}-x-0": labels,  # its labels, not its set's name
            f"{STATE_VOLUME}-{names.dedup}-6": None}  # its set's name, not its labels
    for name, lab in [(scaled_down, labels), *kept.items()]:
        core.create_namespaced_persistent_volume_claim(k8s_namespace, _claim(name, lab))

    # Another owner's set of that name: nothing is touched.
    assert teardown.delete_dedup_state(kube_api, k8s_namespace, names.pipeline, "not-the-owner") == []
    assert apps.read_namespaced_stateful_set(names.dedup, k8s_namespace).spec.replicas == 2
    assert made | {scaled_down} | set(kept) <= _claims(core, k8s_namespace)

    deleted = teardown.delete_dedup_state(kube_api, k8s_namespace, names.pipeline, owner.metadata.uid)
    assert deleted == sorted(made | {scaled_down})
    assert apps.read_namespaced_stateful_set(names.dedup, k8s_namespace).spec.replicas == 0
    _until("the pods gone and the claims with them", lambda: not core.list_namespaced_pod(k8s_namespace).items
           and _claims(core, k8s_namespace) == set(kept))
    time.sleep(2)  # the set, at zero, makes no claim again
    assert _claims(core, k8s_namespace) == set(kept)
    # Again (Kopf retries a handler): nothing left to delete, no error.
    assert teardown.delete_dedup_state(kube_api, k8s_namespace, names.pipeline, owner.metadata.uid) == []
