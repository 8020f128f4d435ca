"""argocd/health.lua, run by a real Lua 5.1 interpreter (lupa; Argo CD's gopher-lua is 5.1),
on the table of tests/helpers/argocd_health.py: objects built the way the operator builds its
status, so the table follows the operator when it changes. The same table runs in Argo CD's own
code in tests/integration/test_argocd_health_go.py."""

from __future__ import annotations

import re

import pytest
import yaml

from eopipe.control.status import FAILURE_REASONS
from tests.helpers.argocd_health import (
    APP_CASES,
    APP_CM_KEY,
    CASES,
    CM_KEY,
    DEGRADED_REASONS,
    LUA,
    PROGRESSING_REASONS,
    ROOT,
    application,
    argocd_cm,
    pipeline,
    stage,
)

lupa = pytest.importorskip("lupa.lua51")


def health(obj: dict) -> dict:
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    out = lua.execute(LUA)
    return dict(out.items())


@pytest.mark.parametrize("name, obj, status, message", CASES, ids=[c[0] for c in CASES])
def test_health(name, obj, status, message):
    hs = health(obj)
    assert hs["status"] == status, hs
    assert message in hs["message"], hs


def test_every_reason_the_operator_sets_is_classified():
    """Reasons of False stage conditions in the reconciler: each one is either a failure
    (Degraded) or a step on the way (Progressing) in these tables and in the Lua file."""
    src = (ROOT / "operator" / "eopipe" / "control" / "reconcile.py").read_text()
    reasons = set(re.findall(r'Condition\("\w+", False, "(\w+)"', src))
    reasons |= set(re.findall(r'Condition\("Stalled", True, "(\w+)"', src))
    assert reasons <= DEGRADED_REASONS | PROGRESSING_REASONS, reasons - DEGRADED_REASONS - PROGRESSING_REASONS
    lua_failures = set(re.findall(r"^\s+(\w+) = true,", LUA, re.M))
    assert lua_failures == DEGRADED_REASONS
    assert FAILURE_REASONS <= lua_failures, "the operator's Degraded reasons must be Degraded in Argo CD too"
    for reason in PROGRESSING_REASONS:
        type_ = "DedupReady" if reason.startswith("Pods") else "ProcessingReady"
        assert health(pipeline(stage(type_, reason)))["status"] == "Progressing"


def test_lua_is_5_1():
    """No syntax newer than Lua 5.1 (goto, integer division, bitwise operators)."""
    lua = lupa.LuaRuntime()
    assert lua.eval("_VERSION") == "Lua 5.1"
    lua.execute("return function() " + LUA.replace("return health(obj)", "") + " end")


def test_readme_snippet_is_the_lua_file():
    readme = (ROOT / "argocd" / "README.md").read_text()
    m = re.search(re.escape(CM_KEY) + r": \|\n(.*?)\n```", readme, re.S)
    assert m, "argocd/README.md has no argocd-cm snippet"
    block = "\n".join(line[4:] for line in m.group(1).splitlines()) + "\n"
    assert block == LUA, "argocd/README.md's snippet differs from argocd/health.lua"
    # The snippet is valid YAML with the script as the key's value.
    assert argocd_cm()["data"][CM_KEY] == LUA


def test_example_applications():
    """The watched namespace, then the operator's Application (chart), then the pipelines', in
    sync waves; server-side apply, retries with backoff, CreateNamespace only where the
    Application owns its destination namespace."""
    namespace, operator, pipelines = yaml.safe_load_all((ROOT / "examples" / "argocd-application.yaml").read_text())
    wave = lambda obj: int(obj["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"])  # noqa: E731
    for app in (operator, pipelines):
        assert app["apiVersion"] == "argoproj.io/v1alpha1" and app["kind"] == "Application"
        policy = app["spec"]["syncPolicy"]
        assert "ServerSideApply=true" in policy["syncOptions"]
        retry = policy["retry"]
        assert retry["limit"] >= 3, retry
        backoff = retry["backoff"]
        assert backoff["factor"] >= 2 and _seconds(backoff["duration"]) < _seconds(backoff["maxDuration"]), backoff
    assert wave(namespace) < wave(operator) < wave(pipelines)
    assert operator["spec"]["source"]["path"] == "charts/eopipe"
    assert (ROOT / operator["spec"]["source"]["path"] / "Chart.yaml").exists()
    # The operator's Roles go into the watched namespaces, which must exist before its sync:
    # the Namespace of an earlier wave, not the pipelines' CreateNamespace (a later wave).
    watched = operator["spec"]["source"]["helm"]["valuesObject"]["watchNamespaces"]
    assert namespace["kind"] == "Namespace" and watched == [namespace["metadata"]["name"]]
    assert pipelines["spec"]["destination"]["namespace"] in watched
    assert "CreateNamespace=true" in operator["spec"]["syncPolicy"]["syncOptions"]
    assert "CreateNamespace=true" not in pipelines["spec"]["syncPolicy"]["syncOptions"]
    assert "SkipDryRunOnMissingResource=true" in pipelines["spec"]["syncPolicy"]["syncOptions"]
    # Their diff by the API server, no step of it from Argo CD's cached schema (stale after a
    # CRD upgrade until the CRD's next change).
    compare = pipelines["metadata"]["annotations"]["argocd.argoproj.io/compare-options"].split(",")
    assert {"ServerSideDiff=true", "IncludeMutationWebhook=true"} <= set(compare), compare
    # Pipelines are not pruned (deleting one may delete its topics).
    assert operator["spec"]["syncPolicy"]["automated"]["prune"] is True
    assert pipelines["spec"]["syncPolicy"]["automated"]["prune"] is False
    # The layout of docs/install.md's GitOps repository, managed by the app-of-apps.
    assert pipelines["spec"]["source"]["path"] == "pipelines"
    assert "Prune=false" in namespace["metadata"]["annotations"]["argocd.argoproj.io/sync-options"]
    root = yaml.safe_load((ROOT / "examples" / "argocd-app-of-apps.yaml").read_text())
    assert root["spec"]["source"]["path"] == "apps" and root["spec"]["destination"]["namespace"] == "argocd"
    assert "apps/eopipe.yaml" in (ROOT / "docs" / "install.md").read_text()


def _seconds(duration: str) -> int:
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in re.findall(r"(\d+)([smh])", duration))


@pytest.mark.parametrize("app_status, status", APP_CASES)
def test_application_health_check_for_sync_waves(app_status, status):
    """The argocd-cm of argocd/README.md also wires Argo CD's health check of Applications,
    without which an app-of-apps does not wait for one wave's Application to be Healthy."""
    script = argocd_cm()["data"][APP_CM_KEY]
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(application(app_status), recursive=True)
    assert dict(lua.execute(script).items())["status"] == status
