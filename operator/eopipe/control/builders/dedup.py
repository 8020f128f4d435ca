"""Kubernetes objects of the dedup stage (spec in, manifests out).

StatefulSet (one RocksDB volume per pod), headless Service (stable pod DNS, metrics scraping),
PodDisruptionBudget, the ConfigMap that carries the partition assignment and its generation
(and, with spec.dedup.backup, the pipeline's manifest, which the pods keep beside their
snapshots for `eopipe restore`), and the pods' ServiceAccount with the one permission they need: watching that ConfigMap.
Owner references are added by the handler, not here.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import PurePosixPath

import yaml

from kubernetes.utils.quantity import parse_quantity

from eopipe.control.builders import access, pods
from eopipe.core import kafkaconf
from eopipe.core.assignment import CONFIGMAP_KEY as ASSIGNMENT_KEY
from eopipe.core.assignment import Assignment
from eopipe.core.backupspec import Backup
from eopipe.core.durations import parse_duration
from eopipe.core.defaults import STATE_DIR
from eopipe.core.names import DEDUP_HTTP_PORT as HTTP_PORT
from eopipe.core.names import Names
from eopipe.core.spec import GROUP, KIND, VERSION, Resources

ASSIGNMENT_DIR = "/etc/eopipe/assignment"
# The pipeline's manifest in the assignment ConfigMap (and so a file beside the assignment's).
MANIFEST_KEY = "pipeline.yaml"
# The volume claim template: each pod's claim is state-<pod> (node loss deletes only those).
STATE_VOLUME = "state"
# The root filesystem is read-only; /tmp is the one scratch directory (an emptyDir) for whatever
# a library writes there. The worker's own files are all under STATE_DIR.
TMP_DIR = "/tmp"
TMP_SIZE_LIMIT = "64Mi"

# The worker container's resources where the spec leaves a key unset (pod_resources).
# - cpu: a request and no limit. 250m schedules a small pod anywhere; a CPU limit would add CFS
#   throttling, which stalls the transactional calls the watchdog times and the probes' answers.
#   Raise requests.cpu for throughput: each owned partition runs on its own thread.
# - memory: limit 1Gi, request 512Mi (Burstable). The limit is what the RocksDB budget is derived
#   from (memory_budget_mb); the request is about what a worker holds once its block cache is
#   warm (RocksDB's share plus the Python process), so the scheduler does not pack pods on the
#   assumption that the cache stays empty.
DEFAULT_REQUESTS = {"cpu": "250m", "memory": "512Mi"}
DEFAULT_LIMITS = {"memory": "1Gi"}

# RocksDB's share of the memory limit (--memory-mb: block cache + memtables, for the whole
# process whatever the number of partitions). The rest of the worker's memory is not bounded by
# that budget:
# - the Python process with its imports (confluent-kafka, rocksdict, pydantic, prometheus-client:
#   about 50 MiB resident; the kubernetes client of the ConfigMap watch adds about 40 MiB);
# - per owned partition, its consumer's prefetch queue (`queued.max.messages.kbytes` 16384 in
#   dedup/clients.py: up to 16 MiB) and its transactional producer's queue: records wait there
#   until the transaction commits, so it holds at most one batch (`--max-batch` 20,000 records,
#   about 20 MiB at 1 KiB per record; `queue.buffering.max.kbytes` caps it at 256 MiB);
# - RocksDB beyond its cache: allocator fragmentation, iterators, table readers of open files.
# Measured (bench.memory, 10M keys, budget 409 MiB, one partition, 400,000 records): peak RSS
# 299 MiB with 208 MiB in the cache, so about 90 MiB besides the cache (no kubernetes client:
# the bench reads its assignment from a file). A full cache then puts one partition near
# 500 MiB, and the 1 GiB limit leaves room for about ten more partitions of 1 KiB records.
# Pods that own more partitions or larger records need a larger limit, not a larger share.
# Below 160 MiB of limit the floor applies (64 MiB: less leaves too few index and filter blocks
# cached for a large store).
ROCKSDB_SHARE = Decimal("0.4")
ROCKSDB_FLOOR_MB = 64


def pod_resources(resources: Resources) -> dict:
    """The worker container's requests and limits: the spec's, and the defaults for the keys it
    leaves out. A defaulted limit is never below the spec's request and a defaulted request
    never above the spec's limit (the API server refuses a request above its limit)."""
    requests, limits = dict(resources.requests), dict(resources.limits)
    for key, value in DEFAULT_LIMITS.items():
        if key not in limits:
            limits[key] = max(value, requests.get(key, value), key=parse_quantity)
    for key, value in DEFAULT_REQUESTS.items():
        if key not in requests:
            requests[key] = min(value, limits.get(key, value), key=parse_quantity)
    return {"requests": requests, "limits": limits}


def memory_budget_mb(memory_limit: str) -> int:
    """The worker's --memory-mb (RocksDB block cache + memtables) for a container memory limit."""
    return max(ROCKSDB_FLOOR_MB, int(parse_quantity(memory_limit) * ROCKSDB_SHARE) >> 20)


def worker_args(names: Names, *, bootstrap: str | None = None,
                assignment_file: str = f"{ASSIGNMENT_DIR}/{ASSIGNMENT_KEY}", watch_configmap: bool = True,
                state_dir: str = STATE_DIR, http_port: int = HTTP_PORT) -> list[str]:
    """The worker's command line; the keywords let local runs (demo, tests) place files and
    run without an API server."""
    spec = names.spec
    watch = ["--assignment-configmap", names.assignment_configmap] if watch_configmap else []
    return [
        "dedup",
        "--bootstrap", bootstrap or spec.kafka.bootstrap_servers,
        "--source-topic", names.source_topic,
        "--output-topic", names.deduped_topic,
        "--dlq-topic", names.dlq_topic,
        "--pipeline", names.pipeline,
        "--namespace", names.namespace,
        *(["--identity", "/".join(names.identity)] if names.spec.restore_from is not None else []),
        "--assignment-file", assignment_file,
        *watch,
        "--key", str(spec.dedup.key.key_spec()),
        "--window", f"{int(parse_duration(spec.dedup.window).total_seconds())}s",
        "--partitioner", spec.source.partitioner,
        "--state-dir", state_dir,
        "--http-port", str(http_port),
        "--memory-mb", str(memory_budget_mb(pod_resources(spec.dedup.resources)["limits"]["memory"])),
        *backup_args(spec.dedup.backup),
        *(["--pipeline-manifest", str(PurePosixPath(assignment_file).parent / MANIFEST_KEY)]
          if spec.dedup.backup is not None else []),
    ]


def backup_args(backup: Backup | None) -> list[str]:
    if backup is None:
        return []
    endpoint = ["--backup-endpoint", backup.endpoint] if backup.endpoint else []
    return ["--backup-uri", backup.uri, *endpoint,
            "--backup-interval", f"{int(parse_duration(backup.interval).total_seconds())}s",
            "--backup-retention", str(backup.retention)]


def backup_env(backup: Backup | None) -> list[dict]:
    """The object store's credentials from the pipeline's Secret (opened to it: control/policy.py)."""
    if backup is None or backup.credentials is None:
        return []
    return [backup.credentials.access_key_id.env("AWS_ACCESS_KEY_ID"),
            backup.credentials.secret_access_key.env("AWS_SECRET_ACCESS_KEY")]


def _env() -> list[dict]:
    def field(name: str, path: str) -> dict:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
    return [field("POD_NAME", "metadata.name"), field("POD_NAMESPACE", "metadata.namespace"),
            field("POD_IP", "status.podIP")]


def _anti_affinity(names: Names) -> dict:
    """Preferred, not required: spread the pods over nodes when there are nodes to spare, and
    still schedule them all on a cluster with fewer nodes than pods."""
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": names.selector("dedup")},
                                            "topologyKey": "kubernetes.io/hostname"}}]}}


def _pod_template(names: Names, container: dict, labels: dict) -> dict:
    """The pod template: the operator's settings merged with spec.dedup.podTemplate. The operator's
    labels (the selector's among them) and env always win; the spec validation also refuses them
    (spec.OPERATOR_LABELS, spec.OPERATOR_ENV)."""
    spec = names.spec
    over = spec.dedup.pod_template
    own_env = {e["name"] for e in container["env"]}
    container = {**container, "env": container["env"] + [e.model_dump(by_alias=True, exclude_none=True)
                                                         for e in over.env if e.name not in own_env]}
    pod = {
        "serviceAccountName": names.dedup,
        "containers": [container],
        # Long enough for a clean stop: commit the open transaction, flush.
        "terminationGracePeriodSeconds": 30,
        # OnRootMismatch: the volume's files are not chowned again on every start (a large
        # RocksDB state has many files).
        "securityContext": {**pods.pod_security_context(), "fsGroupChangePolicy": "OnRootMismatch"},
        "affinity": {**_anti_affinity(names), **(over.affinity or {})},
        "volumes": [{"name": "assignment", "configMap": {"name": names.assignment_configmap}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}}],
    }
    if secrets := pods.image_pull_secrets(spec):
        pod["imagePullSecrets"] = [{"name": s} for s in secrets]
    if over.node_selector:
        pod["nodeSelector"] = dict(over.node_selector)
    if over.tolerations:
        pod["tolerations"] = list(over.tolerations)
    if over.priority_class_name:
        pod["priorityClassName"] = over.priority_class_name
    annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(HTTP_PORT), **over.annotations}
    return {"metadata": {"labels": {**over.labels, **labels}, "annotations": annotations}, "spec": pod}


def statefulset(names: Names, image: str, replicas: int | None = None) -> dict:
    spec = names.spec
    labels = names.labels("dedup")
    storage = {"accessModes": ["ReadWriteOnce"],
               "resources": {"requests": {"storage": spec.dedup.storage.size}}}
    if spec.dedup.storage.storage_class_name:
        storage["storageClassName"] = spec.dedup.storage.storage_class_name
    container = {
        "name": "dedup",
        "image": spec.dedup.image or image,
        "command": ["eopipe"],
        "args": worker_args(names),
        # The state endpoints' bearer token from the pipeline's Secret (builders/access.py).
        "env": _env() + [access.token_env(names)] + kafkaconf.pod_env(spec.kafka) + backup_env(spec.dedup.backup),
        "ports": [{"name": "http", "containerPort": HTTP_PORT}],
        # The HTTP server shares a Python process with the hot loop: allow it a slow answer.
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"},
                           "periodSeconds": 2, "timeoutSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                          "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
        "volumeMounts": [{"name": STATE_VOLUME, "mountPath": STATE_DIR},
                         {"name": "assignment", "mountPath": ASSIGNMENT_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": TMP_DIR}],
        "securityContext": pods.container_security_context(read_only_root_filesystem=True),
        "resources": pod_resources(spec.dedup.resources),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": names.dedup, "namespace": names.namespace, "labels": labels},
        "spec": {
            "serviceName": names.dedup,
            "replicas": spec.dedup.replicas if replicas is None else replicas,
            # Pods start and stop independently: partition ownership comes from the
            # assignment, not from pod ordinals, so ordered startup buys nothing.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": names.selector("dedup")},
            "template": _pod_template(names, container, labels),
            "volumeClaimTemplates": [{"metadata": {"name": STATE_VOLUME, "labels": labels},
                                      "spec": storage}],
            # Retain (the default) on both: the operator deletes the claims with the pipeline
            # (control/teardown.py); the policy's Delete makes the pods land on one node.
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
        },
    }


def rbac(names: Names) -> list[dict]:
    """ServiceAccount, Role and RoleBinding of the dedup pods: read and watch the assignment
    ConfigMap, nothing else (a watch of one object by name satisfies resourceNames)."""
    meta = {"name": names.dedup, "namespace": names.namespace, "labels": names.labels("dedup")}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                    "resourceNames": [names.assignment_configmap], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.dedup},
         "subjects": [{"kind": "ServiceAccount", "name": names.dedup, "namespace": names.namespace}]},
    ]


def headless_service(names: Names) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": names.dedup, "namespace": names.namespace, "labels": names.labels("dedup")},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": names.selector("dedup"),
                 "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http"}]},
    }


def pod_disruption_budget(names: Names, replicas: int, drains: bool) -> dict:
    """With `drains` and two pods or more, no eviction at all: a drain waits while the operator
    hands the partitions of each pod on a cordoned node to the others and then deletes it
    (control/nodeloss.py), so no partition waits for a restore. Else one pod at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": names.dedup, "namespace": names.namespace, "labels": names.labels("dedup")},
        "spec": {"maxUnavailable": 0 if drains and replicas >= 2 else 1,
                 "selector": {"matchLabels": names.selector("dedup")}},
    }


def assignment_configmap(names: Names, assignment: Assignment) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": names.assignment_configmap, "namespace": names.namespace,
                     "labels": names.labels("dedup"),
                     "annotations": {"eopipe.dev/assignment-generation": str(assignment.generation)}},
        "data": {ASSIGNMENT_KEY: json.dumps(assignment.to_json(), sort_keys=True),
                 # Only where the pods keep it: for others a spec change would wake every pod's watch.
                 **({MANIFEST_KEY: manifest(names)} if names.spec.dedup.backup is not None else {})},
    }


def manifest(names: Names) -> str:
    """The pipeline's manifest for a restore elsewhere: its spec without the fields at their
    defaults, so the same whether the API server filled them in (the operator's copy) or not
    (`eopipe render`'s)."""
    return yaml.safe_dump({"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                           "metadata": {"name": names.pipeline, "namespace": names.namespace},
                           "spec": names.spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)},
                          sort_keys=False)
