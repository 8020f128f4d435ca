"""helm, as the chart tests run it: the binary of the `tools` fixture, its state out of $HOME
(the `helm_env` fixture; both in tests/integration/conftest.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "eopipe"


def run_helm(tools, helm_env, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    res = subprocess.run([str(tools["helm"]), *args], capture_output=True, text=True, env=helm_env,
                         timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({res.returncode}):\n{res.stderr}\n{res.stdout}")
    return res


# What the operator's ServiceAccount must be allowed in a namespace it watches, as
# (verb, resource) for `kubectl auth can-i` (the chart's eopipe.namespacedRules).
OPERATOR_GRANTS = [
    # list: the pipelines of every namespace, to catch two that would write one topic.
    ("watch", "exactlyoncepipelines.eopipe.dev"), ("list", "exactlyoncepipelines.eopipe.dev"),
    ("patch", "exactlyoncepipelines.eopipe.dev/status"),
    ("create", "statefulsets.apps"), ("patch", "statefulsets.apps"),
    ("create", "poddisruptionbudgets.policy"), ("create", "configmaps"),
    ("create", "services"), ("create", "sparkapplications.sparkoperator.k8s.io"),
    ("watch", "sparkapplications.sparkoperator.k8s.io"),  # state changes reconcile at once (control/sparkwatch.py)
    ("get", "secrets"), ("create", "events"), ("list", "pods"),
    ("create", "roles.rbac.authorization.k8s.io"), ("create", "serviceaccounts"),
]
