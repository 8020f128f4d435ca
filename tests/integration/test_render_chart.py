"""`eopipe render` runs as the operator the chart installs: the Settings it renders with
(manifests.chart_settings) are those the operator reads from the env of `helm template`'s
Deployment, for the default values and for the values render has flags for."""

import pytest
import yaml

from eopipe.control.settings import Settings
from eopipe.tools import manifests
from tests.helpers.helm import CHART, run_helm

# What render takes from the Settings (the rest is the operator's timing and policy).
RENDERED = ("image", "spark_image", "spark_driver_cluster_role", "network_policy")


def _operator_settings(tools, helm_env, release: str, namespace: str, *values: str) -> Settings:
    out = run_helm(tools, helm_env, "template", release, str(CHART), "--namespace", namespace, *values).stdout
    (dep,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"]
    env = {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    return Settings.from_env({**env, "POD_NAMESPACE": namespace})  # the downward API's value


@pytest.mark.parametrize("release, namespace, values, kw", [
    ("eopipe", "eopipe-system", (), {}),
    ("prod", "streaming", (), {}),
    ("eopipe", "eopipe-system", ("--set", "networkPolicy.enabled=false"), {"network_policy": False}),
    ("eopipe", "eopipe-system", ("--set", "image.repository=reg.example/eopipe", "--set-string", "image.tag=9"),
     {"image": "reg.example/eopipe:9"}),
])
def test_render_settings_are_the_charts(tools, helm_env, release, namespace, values, kw):
    want = _operator_settings(tools, helm_env, release, namespace, *values)
    got = manifests.chart_settings(release, namespace, **kw)
    assert {f: getattr(got, f) for f in RENDERED} == {f: getattr(want, f) for f in RENDERED}
    assert want.network_policy is None or want.network_policy.operator_namespace == namespace
