"""The node tier's Spark Operator install (localenv/node/sparkoperator.py): the values given to the
module's own chart, and what that chart renders from them (helm template; skipped where the
module or helm cannot be had)."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from localenv import REPO_ROOT
from localenv.node import sparkoperator as so

IMAGE = "localhost/eopipe-spark-operator:0123456789abcdef"


@pytest.mark.parametrize("webhook", [True, False])
def test_values_name_our_image_every_namespace_and_the_webhook(webhook):
    v = so.values(IMAGE, webhook)
    assert v["image"] == {"registry": "localhost", "repository": "eopipe-spark-operator", "tag": "0123456789abcdef",
                          "pullPolicy": "IfNotPresent"}
    assert v["spark"]["jobNamespaces"] == [""]
    assert v["spark"]["serviceAccount"]["create"] is False and v["spark"]["rbac"]["create"] is False
    assert v["webhook"]["enable"] is webhook


def test_extra_rbac_grants_the_controller_networkpolicies():
    role, binding = so.extra_rbac()
    assert role["rules"][0]["resources"] == ["networkpolicies"] and "create" in role["rules"][0]["verbs"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": so.CONTROLLER, "namespace": so.NAMESPACE}]


def test_helm_install_argv_waits_in_its_namespace(tmp_path):
    argv = so.helm_install_argv("helm", tmp_path / "kc", tmp_path / "chart", tmp_path / "v.json")
    assert argv[2:5] == ["upgrade", "--install", so.RELEASE] and "--wait" in argv
    assert argv[argv.index("--namespace") + 1] == so.NAMESPACE


def _helm() -> str | None:
    res = subprocess.run(["bash", str(REPO_ROOT / "hack" / "build-tools.sh"), "helm"], check=False,
                         capture_output=True, text=True)
    return f"{res.stdout.split()[-1]}/helm" if res.returncode == 0 and res.stdout.strip() else None


@pytest.mark.parametrize("webhook", [True, False])
def test_the_modules_chart_renders_our_deployments(tmp_path, webhook):
    try:
        chart = so.chart_dir()
    except (RuntimeError, OSError) as e:
        pytest.skip(f"the Spark Operator module is not at hand: {e}")
    helm = _helm()
    if helm is None:
        pytest.skip("no helm (hack/build-tools.sh helm)")
    vals = tmp_path / "values.json"
    vals.write_text(json.dumps(so.values(IMAGE, webhook)))
    out = subprocess.run([helm, "template", so.RELEASE, str(chart), "--namespace", so.NAMESPACE, "--values",
                          str(vals)], check=True, capture_output=True, text=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(deployments) == ({so.CONTROLLER, so.WEBHOOK} if webhook else {so.CONTROLLER})
    for d in deployments.values():
        c = d["spec"]["template"]["spec"]["containers"][0]
        assert c["image"] == IMAGE and '--namespaces=""' in c["args"]
    # The controller's env reaches the spark-submit it runs (exec with the parent's environment).
    env = deployments[so.CONTROLLER]["spec"]["template"]["spec"]["containers"][0].get("env") or []
    assert {"name": "SPARK_SUBMIT_OPTS", "value": so.SUBMIT_JVM} in env, env
    hooks = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert len(hooks) == int(webhook)
    for h in hooks:  # every namespace: no namespaceSelector to keep a pipeline's pods out
        assert all("namespaceSelector" not in w for w in h["webhooks"])
    assert not [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"].endswith("-spark")]
