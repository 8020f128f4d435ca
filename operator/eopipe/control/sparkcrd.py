"""Whether the cluster's Kubeflow Spark Operator is one eopipe runs on: its SparkApplication
CustomResourceDefinition is there, serves the version eopipe writes, and keeps the driver's and
executors' pod templates (where eopipe puts the checkpoint volume, the security contexts and the
env: control/builders/spark.py). A CRD without them would prune the templates silently, and a
driver would run without its checkpoint claim and replay. Checked when the operator starts (a
log line) and per pipeline on each pass (a condition), the CRD read at most once a minute (it is
large: a list by name, which the operator's Kopf rights already allow).
"""

from __future__ import annotations

import json
import logging
import threading
import time

from kubernetes import client

from eopipe.control.status import PROCESSING, Condition
from eopipe.core.names import SPARK_GROUP, SPARK_PLURAL, SPARK_VERSION

CRD_NAME = f"{SPARK_PLURAL}.{SPARK_GROUP}"
SUPPORTED = "the Kubeflow Spark Operator v2.5.2 (docs/install.md)"
TTL = 60.0
_MISSING = "SparkOperatorMissing"


def _keeps(schema: dict, path: tuple[str, ...]) -> bool:
    """Whether an object with a field at `path` keeps it through this structural schema."""
    for key in path:
        props = schema.get("properties") or {}
        if key not in props:
            return bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        schema = props[key]
    return True


def judge(crd: dict | None) -> Condition | None:
    """None if eopipe can run on the CRD as read (None: there is none), else the condition."""
    if crd is None:
        return Condition(PROCESSING, False, _MISSING,
                         f"the cluster has no CustomResourceDefinition {CRD_NAME}; install {SUPPORTED}")
    versions = {v["name"]: v for v in crd.get("spec", {}).get("versions") or []}
    version = versions.get(SPARK_VERSION)
    if version is None or not version.get("served"):
        served = sorted(n for n, v in versions.items() if v.get("served")) or ["none"]
        return Condition(PROCESSING, False, _MISSING,
                         f"{CRD_NAME} serves {', '.join(served)}, not {SPARK_VERSION}, which eopipe writes; "
                         f"install {SUPPORTED}")
    schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
    lost = [role for role in ("driver", "executor") if not _keeps(schema, ("spec", role, "template"))]
    if lost:
        return Condition(PROCESSING, False, _MISSING,
                         f"{CRD_NAME} {SPARK_VERSION} has no spec.{'/'.join(lost)}.template (a Spark Operator older "
                         f"than eopipe supports): the pods would lose their checkpoint volume and security "
                         f"contexts; install {SUPPORTED}")
    return None


def startup_line(verdict: Condition | None) -> tuple[int, str]:
    """What the operator logs at start about the Spark Operator it found."""
    if verdict is None:
        return logging.INFO, f"{CRD_NAME} serves {SPARK_VERSION} with pod templates: Spark stages can run"
    return logging.WARNING, f"no pipeline's Spark stage can run until this is fixed: {verdict.message}"


_lock = threading.Lock()
_cached: tuple[float, Condition | None] | None = None


def check(api: client.ApiClient) -> Condition | None:
    """judge() of the cluster's CRD, read at most once per TTL."""
    global _cached
    with _lock:
        if _cached is not None and time.monotonic() - _cached[0] < TTL:
            return _cached[1]
    res = client.ApiextensionsV1Api(api).list_custom_resource_definition(
        field_selector=f"metadata.name={CRD_NAME}", _preload_content=False)
    items = json.loads(res.data).get("items") or []
    verdict = judge(items[0] if items else None)
    with _lock:
        _cached = (time.monotonic(), verdict)
    return verdict
