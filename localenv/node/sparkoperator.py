"""The Kubeflow Spark Operator on the node tier, installed as a user installs it: `helm install` of
the chart its Go module ships (charts/spark-operator-chart, with its CRDs), the controller and
the webhook running from an image of our own (localenv/node/images.py: the project's Spark image
plus the operator's binary, built by hack/build-tools.sh from the same module and version).

Nothing of that module is copied into this repository: the chart is read where `go mod download`
puts the module (the Go module cache), by its exact version (the proxy refuses the version list).

Settings (`values`, pure), and why:
- every namespace is a Spark job namespace (`spark.jobNamespaces: [""]`): tests and users create
  pipeline namespaces after the install; the webhook then has no namespaceSelector (its pod
  webhook still selects only pods labelled launched-by-spark-operator).
- no Spark ServiceAccount or RBAC from the chart: eopipe makes each pipeline's driver account
  and binds its driver ClusterRole (control/builders/spark.py).
- the webhook on (the chart's default): on v2.5.2 spark-submit carries only `spark-local-dir-*`
  volumes; the webhook is what puts the checkpoint claim, the env list and the security contexts
  on the driver and executor pods (docs/install.md).
- `SPARK_SUBMIT_OPTS` on the controller: C1 only and the serial collector for its spark-submit
  JVMs, which live seconds (docs/install.md).
- `EXTRA_RULES`: Spark 4 creates a NetworkPolicy in front of each driver at submission
  (NetworkPolicyFeatureStep, always on), which the chart's controller role does not grant; the
  install adds a ClusterRole for it, bound to the controller's ServiceAccount.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from localenv.node import ON_NODE_0

VERSION = os.environ.get("SPARK_OPERATOR_VERSION", "v2.5.2")
MODULE = "github.com/kubeflow/spark-operator/v2"
RELEASE = NAMESPACE = "spark-operator"
# The chart's names for release `spark-operator` (its fullname is the release name).
CONTROLLER, WEBHOOK = f"{RELEASE}-controller", f"{RELEASE}-webhook"
DEPLOYMENTS = ((NAMESPACE, CONTROLLER), (NAMESPACE, WEBHOOK))
EXTRA_ROLE = "eopipe-node:spark-operator-networkpolicies"
EXTRA_RULES = [{"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
                "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]}]


def module_dir(version: str = VERSION) -> Path:
    """The module's directory in the Go module cache (downloaded on first use)."""
    res = subprocess.run(["go", "mod", "download", "-json", f"{MODULE}@{version}"], check=False, text=True,
                         capture_output=True, env={**os.environ, "GOFLAGS": "-mod=mod"})
    info = json.loads(res.stdout or "{}")
    if res.returncode != 0 or not info.get("Dir"):
        raise RuntimeError(f"go mod download {MODULE}@{version}: {info.get('Error') or res.stderr.strip()}")
    return Path(info["Dir"])


def chart_dir(version: str = VERSION) -> Path:
    return module_dir(version) / "charts" / "spark-operator-chart"


# Each submission is a JVM of its own that lives seconds (it creates the driver pod and exits): C1
# only and the serial collector spare the controller's node the compiling a long-lived JVM pays
# for (docs/install.md).
SUBMIT_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def values(image: str, webhook: bool = True) -> dict:
    """The chart's values for `image` (`<registry>/<repository>:<tag>`, as the node holds it)."""
    registry, rest = image.split("/", 1)
    repository, tag = rest.rsplit(":", 1)
    ref = {"registry": registry, "repository": repository, "tag": tag}
    return {
        "image": {**ref, "pullPolicy": "IfNotPresent"},
        "spark": {"jobNamespaces": [""], "serviceAccount": {"create": False}, "rbac": {"create": False}},
        # On node 0, the control plane's, as a cluster keeps its add-ons on nodes a test does not lose.
        "webhook": {"enable": webhook, "nodeSelector": ON_NODE_0},
        # Two cores: one replica each (the chart's default) with short leases.
        "controller": {"leaderElection": {"leaseDuration": "15s"}, "nodeSelector": ON_NODE_0,
                       "env": [{"name": "SPARK_SUBMIT_OPTS", "value": SUBMIT_JVM}]},
        "prometheus": {"podMonitor": {"create": False}},
    }


def extra_rbac() -> list[dict]:
    """What the chart's controller role lacks for Spark 4's spark-submit (module docstring)."""
    rbac = "rbac.authorization.k8s.io/v1"
    return [{"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": EXTRA_ROLE}, "rules": EXTRA_RULES},
            {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": EXTRA_ROLE},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": EXTRA_ROLE},
             "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": NAMESPACE}]}]


def helm_install_argv(helm: str, kubeconfig: Path, chart: Path, values_file: Path,
                      timeout: str = "240s") -> list[str]:
    return [helm, f"--kubeconfig={kubeconfig}", "upgrade", "--install", RELEASE, str(chart),
            "--namespace", NAMESPACE, "--create-namespace", "--values", str(values_file),
            "--wait", f"--timeout={timeout}"]
