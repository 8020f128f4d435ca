"""docs/install.md's kubectl path (no Helm release), run as written on the local control plane.

The commands come from the code blocks of the doc's "kubectl (without a Helm release)"
section, so the doc cannot drift from what is tested: the install block, then the upgrade
block, each command in the doc's order, in a folder where the doc's relative paths (`crds/`,
`charts/`) resolve. Only the namespace names are made unique for the shared control plane, and `<registry>` filled in.

The operator Deployment gets no pod here (no image registry): a ResourceQuota of zero pods in
the operator's namespace, created as soon as that namespace exists, keeps the test node from
running it. What is checked is that every command succeeds, the API server holds the objects,
and the operator's ServiceAccount may do its job (`kubectl auth can-i`) in the watched
namespace and not elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid

import pytest
import yaml

from localenv.fixtures_operator import kubectl, wait_established
from tests.helpers.docs import sh_blocks
from tests.helpers.helm import OPERATOR_GRANTS, ROOT

SECTION = "## kubectl (without a Helm release)"
CRD = "exactlyoncepipelines.eopipe.dev"
CRD_FILE = ROOT / "crds" / f"{CRD}.yaml"
REGISTRY = "registry.invalid"  # the doc's <registry>
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def _can_i(cp, sa: str, *args: str) -> bool:
    return kubectl(cp, "auth", "can-i", f"--as={sa}", *args, check=False).stdout.strip() == "yes"


@pytest.mark.k8s
def test_kubectl_install_and_upgrade_as_documented(tools, helm_env, crds, tmp_path):
    cp = crds
    blocks = sh_blocks("install.md", SECTION)
    assert len(blocks) == 2, f"expected an install and an upgrade block, found {blocks}"
    install, upgrade = blocks
    suffix = uuid.uuid4().hex[:6]
    op_ns, watch_ns = f"eopipe-system-{suffix}", f"pipelines-{suffix}"
    for rel in ("crds", "charts"):
        (tmp_path / rel).symlink_to(ROOT / rel)
    env = {**helm_env, "KUBECONFIG": str(cp.kubeconfig),
           "PATH": os.pathsep.join([str(cp.kubectl.parent), str(tools["helm"].parent), os.environ["PATH"]])}
    quota = False

    def run(command: str) -> str:
        nonlocal quota
        command = re.sub(r"\bpipelines\b", watch_ns, re.sub(r"\beopipe-system\b", op_ns, command))
        command = command.replace("<registry>", REGISTRY)
        res = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, f"docs/install.md: `{command}` failed ({res.returncode}):\n{res.stderr}{res.stdout}"
        if not quota and kubectl(cp, "get", "namespace", op_ns, check=False).returncode == 0:
            kubectl(cp, "create", "quota", "no-pods", "--hard=pods=0", "-n", op_ns)
            quota = True
        return res.stdout

    crb = f"eopipe-{op_ns}-kopf"
    try:
        for command in install:
            run(command)

        # The objects, in the watched namespace and the operator's.
        wait_established(cp, f"crd/{CRD}")
        kubectl(cp, "get", "-n", op_ns, "serviceaccount/eopipe", "service/eopipe-metrics")
        image = kubectl(cp, "get", "-n", op_ns, "deployment/eopipe", "-o",
                        "jsonpath={.spec.template.spec.containers[0].image}").stdout
        assert image == f"{REGISTRY}/eopipe:0.1.0", image
        kubectl(cp, "get", "-n", watch_ns, "role/eopipe", "rolebinding/eopipe")
        kubectl(cp, "get", f"clusterrole/{crb}", f"clusterrolebinding/{crb}")
        # The rendered file the doc keeps: RBAC before the operator (Helm's install order).
        rendered = [d for d in yaml.safe_load_all((tmp_path / "eopipe.yaml").read_text()) if d]
        kinds = [d["kind"] for d in rendered]
        assert max(i for i, k in enumerate(kinds) if k in RBAC_KINDS) < kinds.index("Deployment"), kinds

        sa = f"system:serviceaccount:{op_ns}:eopipe"
        for verb, what in OPERATOR_GRANTS:
            assert _can_i(cp, sa, verb, what, "-n", watch_ns), (verb, what)
        assert _can_i(cp, sa, "watch", "customresourcedefinitions.apiextensions.k8s.io")
        assert _can_i(cp, sa, "watch", "namespaces")
        for ns in (op_ns, "default"):
            assert not _can_i(cp, sa, "create", "statefulsets.apps", "-n", ns)
            assert not _can_i(cp, sa, "get", "secrets", "-n", ns)
        # Leader election: the operator's own Lease in its own namespace, nothing more.
        assert _can_i(cp, sa, "update", "leases.coordination.k8s.io/eopipe-leader", "-n", op_ns)
        assert not _can_i(cp, sa, "update", "leases.coordination.k8s.io/eopipe-leader", "-n", watch_ns)

        # The upgrade, as documented, over an older CRD whose changed field another manager
        # owns (as after a Helm install): the CRD server-side, then the newly rendered manifests.
        def description(crd: dict) -> str:
            return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"]

        older = yaml.safe_load(CRD_FILE.read_text())
        older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "an older eopipe CRD"
        kubectl(cp, "apply", "--server-side", "--force-conflicts", "--field-manager=helm", "-f", "-",
                input=yaml.safe_dump(older))
        for command in upgrade:
            run(command)
        crd = json.loads(kubectl(cp, "get", f"crd/{CRD}", "-o", "json").stdout)
        assert description(crd) == description(yaml.safe_load(CRD_FILE.read_text()))
        kubectl(cp, "get", "-n", op_ns, "deployment/eopipe")
        kubectl(cp, "get", "-n", watch_ns, "role/eopipe")
    finally:
        kubectl(cp, "apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE), check=False)
        kubectl(cp, "delete", "namespace", op_ns, watch_ns, "--ignore-not-found", "--wait=false", check=False)
        kubectl(cp, "delete", f"clusterrole/{crb}", f"clusterrolebinding/{crb}", "--ignore-not-found", check=False)
