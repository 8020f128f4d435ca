"""The restricted Pod Security Standard, for the pods the operator makes and the operator's own.

- `restricted_problems(pod_spec)`: the checks of the restricted profile
  (https://kubernetes.io/docs/concepts/security/pod-security-standards/), for unit tests. The
  authority is the API server's PodSecurity admission plugin (on by default): the integration
  and e2e tests label a namespace with `restrict_namespace` and create pods there.
- `spark_pod(app, role)`: the pod Spark on Kubernetes creates for a SparkApplication's driver or
  executor from its pod template (`<role>.template`, which carries the security contexts:
  control/builders/spark.py), with Spark's labels. The process tiers start no pods, so this is
  the closest they get; the node tier runs the real ones in namespaces enforcing the restricted level
  (tests/e2e/test_node_tier.py: the Spark lifecycle and file sink tests, the install doc's path).
- `pod_from_template(template, name)`: a Pod of a workload's pod template.
- `dry_run_create(kube_api, ns, pod)`: None if the API server admits the pod, else its refusal.
- `POD_TEMPLATE`: a `dedup.podTemplate` that uses every field.
"""

from __future__ import annotations

import copy

RESTRICTED_LABELS = {"pod-security.kubernetes.io/enforce": "restricted",
                     "pod-security.kubernetes.io/enforce-version": "latest"}
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                   "projected", "secret"}
# The containers Spark on Kubernetes names (org.apache.spark.deploy.k8s.Constants).
SPARK_CONTAINER = {"driver": "spark-kubernetes-driver", "executor": "spark-kubernetes-executor"}

# A dedup.podTemplate with every field (the unit tests' builder checks, admission round trip).
POD_TEMPLATE = {
    "labels": {"team": "data", "cost-center": "42"},
    "annotations": {"prometheus.io/scrape": "false", "example.com/owner": "data"},
    "nodeSelector": {"pool": "stateful"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "kafka", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
    "priorityClassName": "data-critical",
    "env": [{"name": "EOPIPE_LOG_LEVEL", "value": "DEBUG"},
            {"name": "TEAM_TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "token"}}}],
}


def restricted_problems(pod: dict) -> list[str]:
    """What the restricted profile refuses in a pod spec (baseline checks included where the
    operator's pods could break them)."""
    out = []
    psc = pod.get("securityContext") or {}
    containers = (pod.get("initContainers") or []) + pod.get("containers", [])
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            out.append(flag)
    for v in pod.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            out.append(f"volume {v['name']}: {sorted(kinds - ALLOWED_VOLUMES)}")
    if psc.get("runAsUser") == 0:
        out.append("pod runAsUser 0")
    for c in containers:
        sc, name = c.get("securityContext") or {}, c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation != false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities.drop lacks ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: capabilities.add {caps['add']}")
        if sc.get("runAsNonRoot") is False or not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
            out.append(f"{name}: runAsNonRoot != true")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"{name}: hostPort")
    return out


def spark_pod(app: dict, role: str) -> dict:
    """The driver or an executor pod of a SparkApplication (v1beta2), as Spark on Kubernetes makes
    it from the role's pod template (`<role>.template`: its Spark container and pod fields kept,
    Spark's own container fields, local dir and conf volume added) and as it reaches admission."""
    spec, part = app["spec"], app["spec"][role]
    meta = app["metadata"]
    pod = copy.deepcopy((part.get("template") or {}).get("spec") or {})
    containers = pod.setdefault("containers", [{"name": SPARK_CONTAINER[role]}])
    container = next(c for c in containers if c["name"] == SPARK_CONTAINER[role])
    container.update(image=part.get("image") or spec["image"], args=[role])
    # Spark's own mounts: its local dir (emptyDir) and, on the driver, its conf.
    container.setdefault("volumeMounts", []).append({"name": "spark-local-dir-1", "mountPath": "/var/data/spark-local"})
    volumes = pod.setdefault("volumes", [])
    volumes.append({"name": "spark-local-dir-1", "emptyDir": {}})
    if role == "driver":
        container["volumeMounts"].append({"name": "spark-conf-volume-driver", "mountPath": "/opt/spark/conf"})
        volumes.append({"name": "spark-conf-volume-driver", "configMap": {"name": f"{meta['name']}-conf"}})
    pod.update(restartPolicy="Never", serviceAccountName=spec["driver"].get("serviceAccount", "default"))
    if spec.get("imagePullSecrets"):
        pod["imagePullSecrets"] = [{"name": n} for n in spec["imagePullSecrets"]]
    # Spark's own labels beside the role's (the Spark Operator's app-name among them).
    labels = {**(part.get("labels") or {}), "spark-role": role, "spark-app-selector": f"spark-{meta['name']}",
              "sparkoperator.k8s.io/app-name": meta["name"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{meta['name']}-{role}", "labels": labels},
            "spec": pod}


def pod_from_template(template: dict, name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": dict(template["metadata"].get("labels") or {})},
            "spec": copy.deepcopy(template["spec"])}


def restrict_namespace(kube_api, ns: str) -> None:
    from kubernetes import client

    client.CoreV1Api(kube_api).patch_namespace(ns, {"metadata": {"labels": RESTRICTED_LABELS}})


def dry_run_create(kube_api, ns: str, pod: dict) -> str | None:
    """Server-side dry run: every admission plugin runs, nothing is stored."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        client.CoreV1Api(kube_api).create_namespaced_pod(ns, pod, dry_run="All")
    except ApiException as e:
        return f"{e.status}: {e.body}"
    return None
