"""argocd/health.lua in Argo CD's own code (hack/argocd-health: Argo CD's settings manager reads
the argocd-cm, util/lua runs the script in gopher-lua as the application controller does) over
the table that tests/unit/test_argocd_health.py runs in lupa (tests/helpers/argocd_health.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import lupa.lua51
import pytest
import yaml

from localenv.fixtures_operator import kubectl
from tests.helpers.argocd_health import (
    APP_CASES,
    CASES,
    LUA,
    LUA_PATH,
    README,
    RESOURCE,
    ROOT,
    application,
    argocd_cm,
    argocd_cm_text,
)
from tests.helpers.pipelines import example_manifest, kubectl_apply

MODULE = ROOT / "hack" / "argocd-health"


@pytest.fixture(scope="session")
def argocd_health() -> Path:
    """The program, built once from the Go module proxy and cached (hack/build-tools.sh,
    idempotent; `make tools` builds it before the tests). Without Go it is skipped, except in
    CI, where the table must pass in Argo CD's runtime."""
    res = subprocess.run(["bash", str(ROOT / "hack" / "build-tools.sh"), "argocd-health"], capture_output=True,
                         text=True, timeout=1800)
    if res.returncode != 0 and shutil.which("go") is None and os.environ.get("CI", "").lower() not in ("true", "1"):
        pytest.skip("argocd-health is not built and there is no go toolchain to build it (in CI this fails)")
    assert res.returncode == 0, res.stderr
    return Path(res.stdout.strip()) / "argocd-health"


def run(binary: Path, objects: list[dict], *args: str) -> list[dict]:
    res = subprocess.run([str(binary), *args], input=json.dumps(objects), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert len(out) == len(objects), out
    return out


@pytest.fixture(scope="session")
def from_script(argocd_health) -> list[dict]:
    """Every row at once, the script under its argocd-cm key."""
    return run(argocd_health, [obj for _, obj, _, _ in CASES], "-script", str(LUA_PATH), "-resource", RESOURCE)


@pytest.mark.parametrize("i", range(len(CASES)), ids=[c[0] for c in CASES])
def test_health_in_argocd(from_script, i):
    _, _, status, message = CASES[i]
    hs = from_script[i]
    assert "error" not in hs, hs
    assert hs["status"] == status, hs
    assert message in hs["message"], hs


def test_argocd_and_lua_5_1_agree(from_script):
    """Whole messages, not only the parts the table names: gopher-lua and Lua 5.1 render the
    same text (numbers, concatenation, table walks) for every row."""
    for (name, obj, _, _), go in zip(CASES, from_script):
        lua = lupa.lua51.LuaRuntime(unpack_returned_tuples=True)
        lua.globals().obj = lua.table_from(obj, recursive=True)
        assert go == dict(lua.execute(LUA).items()), name


def test_readme_configmap_in_argocd(argocd_health, tmp_path):
    """The argocd-cm of argocd/README.md as Argo CD reads it (its name, the part-of label, the
    resource.customizations.health.<group>_<kind> keys): the pipelines' table and the
    Application check of the sync waves."""
    cm = tmp_path / "argocd-cm.yaml"
    cm.write_text(argocd_cm_text())
    objects = [obj for _, obj, _, _ in CASES] + [application(s) for s, _ in APP_CASES]
    got = run(argocd_health, objects, "-configmap", str(cm))
    want = [status for _, _, status, _ in CASES] + [status for _, status in APP_CASES]
    assert [hs.get("status") for hs in got] == want, got


def test_argocd_ignores_a_configmap_without_its_label(argocd_health, tmp_path):
    """The runtime is Argo CD's settings manager, not a shortcut: it reads only ConfigMaps
    labelled app.kubernetes.io/part-of: argocd, so without the label there is no argocd-cm."""
    doc = argocd_cm()
    del doc["metadata"]["labels"]["app.kubernetes.io/part-of"]
    cm = tmp_path / "argocd-cm.yaml"
    cm.write_text(yaml.safe_dump(doc))
    res = subprocess.run([str(argocd_health), "-configmap", str(cm)], input=json.dumps([CASES[1][1]]),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and 'configmap "argocd-cm" not found' in res.stderr, res


def test_argocd_sandbox(argocd_health, tmp_path):
    """Argo CD opens only the base, table, package and a safe os library: a script that uses io
    runs in a full Lua 5.1 and fails in Argo CD, so health.lua passing there means it stays
    inside them."""
    script = tmp_path / "io.lua"
    script.write_text('io.write("")\nreturn {status = "Healthy"}\n')
    lua = lupa.lua51.LuaRuntime(unpack_returned_tuples=True)
    assert dict(lua.execute(script.read_text()).items()) == {"status": "Healthy"}
    (hs,) = run(argocd_health, [CASES[1][1]], "-script", str(script), "-resource", RESOURCE)
    assert "attempt to index a non-table object(nil) with key 'write'" in hs.get("error", ""), hs


def test_built_against_the_pinned_argo_cd(argocd_health):
    gomod = (MODULE / "go.mod").read_text()
    pinned = re.search(r"^\s*(?:require\s+)?github\.com/argoproj/argo-cd/v3 (v\S+)$", gomod, re.M)
    assert pinned, "hack/argocd-health/go.mod pins no github.com/argoproj/argo-cd/v3"
    res = subprocess.run([str(argocd_health), "-version"], capture_output=True, text=True, timeout=30)
    assert res.stdout.strip() == pinned.group(1), res


@pytest.mark.k8s
def test_readme_command_on_a_cluster(argocd_health, crds, k8s_namespace):
    """argocd/README.md's command as written, on a pipeline in the local API server whose status
    (written by the test: no operator runs) is the table's hanging transaction."""
    block = re.search(r"## How it is tested.*?```sh\n(.*?)```", README.read_text(), re.S)
    assert block, "argocd/README.md shows no command under How it is tested"
    doc = example_manifest("payments.yaml", "127.0.0.1:9")
    kubectl_apply(crds, k8s_namespace, doc)
    name = doc["metadata"]["name"]
    generation = json.loads(kubectl(crds, "get", "exactlyoncepipeline", name, "-n", k8s_namespace,
                                    "-o", "json").stdout)["metadata"]["generation"]
    _, row, status, message = next(c for c in CASES if c[0] == "hanging transaction")
    kubectl(crds, "patch", "exactlyoncepipeline", name, "-n", k8s_namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": {**row["status"], "observedGeneration": generation}}))
    env = {**os.environ, "KUBECONFIG": str(crds.kubeconfig),
           "PATH": f"{crds.kubectl.parent}{os.pathsep}{os.environ['PATH']}"}
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", block.group(1).replace("team-a", k8s_namespace)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    (hs,) = json.loads(res.stdout)
    assert hs["status"] == status and message in hs["message"], hs
