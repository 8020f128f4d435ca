"""Kubernetes objects of the dedup stage (spec in, manifests out).

StatefulSet (one RocksDB volume per pod), headless Service (stable pod DNS, metrics scraping),
PodDisruptionBudget, the ConfigMap that carries the partition assignment and its generation,
and the pods' ServiceAccount with the one permission they need: watching that ConfigMap.
Owner references are added by the handler, not here.
"""

from __future__ import annotations

import json

from eopipe import kafkaconf
from eopipe.assignment import CONFIGMAP_KEY as ASSIGNMENT_KEY, Assignment
from eopipe.builders.names import Names
from eopipe.spec import parse_duration

HTTP_PORT = 8080
STATE_DIR = "/var/lib/eopipe"
ASSIGNMENT_DIR = "/etc/eopipe/assignment"


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
        "--assignment-file", assignment_file,
        *watch,
        "--key", spec.dedup.key.spec_string(),
        "--window", f"{int(parse_duration(spec.dedup.window).total_seconds())}s",
        "--partitioner", spec.source.partitioner,
        "--state-dir", state_dir,
        "--http-port", str(http_port),
    ]


def _env() -> list[dict]:
    def field(name: str, path: str) -> dict:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
    return [field("POD_NAME", "metadata.name"), field("POD_NAMESPACE", "metadata.namespace"),
            field("POD_IP", "status.podIP")]


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
        "env": _env() + kafkaconf.pod_env(names.spec.kafka),
        "ports": [{"name": "http", "containerPort": HTTP_PORT}],
        # The HTTP server shares a Python process with the hot loop: allow it a slow answer.
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"},
                           "periodSeconds": 2, "timeoutSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                          "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
        "volumeMounts": [{"name": "state", "mountPath": STATE_DIR},
                         {"name": "assignment", "mountPath": ASSIGNMENT_DIR, "readOnly": True}],
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
    }
    resources = spec.dedup.resources.model_dump(exclude_defaults=True)
    if resources:
        container["resources"] = resources
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
            "template": {
                "metadata": {"labels": labels,
                             "annotations": {"prometheus.io/scrape": "true",
                                             "prometheus.io/port": str(HTTP_PORT)}},
                "spec": {
                    "serviceAccountName": names.dedup,
                    "containers": [container],
                    # Long enough for a clean stop: commit the open transaction, flush.
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001},
                    "volumes": [{"name": "assignment",
                                 "configMap": {"name": names.assignment_configmap}}],
                },
            },
            "volumeClaimTemplates": [{"metadata": {"name": "state", "labels": labels},
                                      "spec": storage}],
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
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


def pod_disruption_budget(names: Names) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": names.dedup, "namespace": names.namespace, "labels": names.labels("dedup")},
        # One pod at a time: each voluntary eviction is a partition handoff.
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector("dedup")}},
    }


def assignment_configmap(names: Names, assignment: Assignment) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": names.assignment_configmap, "namespace": names.namespace,
                     "labels": names.labels("dedup"),
                     "annotations": {"eopipe.dev/assignment-generation": str(assignment.generation)}},
        "data": {ASSIGNMENT_KEY: json.dumps(assignment.to_json(), sort_keys=True)},
    }
