"""argocd/health.lua, run by a real Lua 5.1 interpreter (lupa; Argo CD's gopher-lua is 5.1),
on objects built the way the operator builds its status (eopipe.control.status.summarize and
merge_conditions), so these tables follow the operator when it changes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from eopipe.control.status import FAILURE_REASONS, Condition, merge_conditions, summarize

lupa = pytest.importorskip("lupa.lua51")

ROOT = Path(__file__).resolve().parents[2]
LUA = (ROOT / "argocd" / "health.lua").read_text()

# Every reason a stage condition can be False with, and how Argo CD should show it.
DEGRADED_REASONS = {"KafkaUnavailable", "NotSupported", "SparkOperatorMissing", "SparkFailed", "InvalidSpec",
                    "ApplyFailed", "AdoptedTopicMismatch", "Conflict", "HangingTransaction", "LagGrowing",
                    "ImageNotAllowed"}
PROGRESSING_REASONS = {"PodsNotReady", "SparkStarting"}

OK_STAGES = [Condition("TopicsReady", True, "TopicsReconciled", "all topics as specified"),
             Condition("DedupReady", True, "PodsReady", "2/2 pods ready"),
             Condition("ProcessingReady", True, "Running", "Spark application running")]


def pipeline(stages=None, *, generation=1, observed=1, paused=False, stalled=None, rebalancing=None,
             extra_status=None, status=True) -> dict:
    obj = {"apiVersion": "eopipe.dev/v1alpha1", "kind": "ExactlyOncePipeline",
           "metadata": {"name": "p", "namespace": "ns", "generation": generation},
           "spec": {"kafka": {"bootstrapServers": "k:9092"}, "source": {"topic": "t", "partitions": 4},
                    **({"paused": True} if paused else {})}}
    if not status:
        return obj
    conditions, phase = summarize(list(OK_STAGES if stages is None else stages), stalled=stalled,
                                  rebalancing=rebalancing, paused=paused)
    # Twice, as after two reconcile passes: lastTransitionTime carried over.
    merged = merge_conditions(merge_conditions(None, conditions, observed), conditions, observed)
    obj["status"] = {"observedGeneration": observed, "phase": phase, "conditions": merged,
                     "partitions": 4, "replicas": 2, "readyReplicas": 2, **(extra_status or {})}
    return obj


def health(obj: dict) -> dict:
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    out = lua.execute(LUA)
    return dict(out.items())


def stage(type_: str, reason: str, message: str = "") -> list[Condition]:
    return [Condition(c.type, False, reason, message) if c.type == type_ else c for c in OK_STAGES]


CASES = [
    ("created, no status yet", pipeline(status=False), "Progressing", "report status"),
    ("running", pipeline(), "Healthy", "Running"),
    ("spec changed, not observed yet", pipeline(generation=3, observed=2), "Progressing", "generation 3"),
    ("stalled from an older generation", pipeline(generation=2, observed=1,
                                                  stalled=Condition("Stalled", True, "InvalidSpec", "bad")),
     "Progressing", "generation 2"),
    ("dedup pods starting", pipeline(stage("DedupReady", "PodsNotReady", "1/2 pods ready")), "Progressing",
     "1/2 pods ready"),
    ("spark submitted", pipeline(stage("ProcessingReady", "SparkStarting", "Spark application SUBMITTED")),
     "Progressing", "SparkStarting"),
    ("spark failed", pipeline(stage("ProcessingReady", "SparkFailed", "driver OOMKilled")), "Degraded",
     "OOMKilled"),
    ("spark failed behind pods starting",
     pipeline([OK_STAGES[0], Condition("DedupReady", False, "PodsNotReady", "1/2"),
               Condition("ProcessingReady", False, "SparkFailed", "driver OOMKilled")]),
     "Degraded", "SparkFailed: ProcessingReady: driver OOMKilled"),
    ("no spark operator", pipeline(stage("ProcessingReady", "SparkOperatorMissing", "install it")), "Degraded",
     "SparkOperatorMissing"),
    ("kafka unreachable", pipeline([Condition("TopicsReady", False, "KafkaUnavailable", "timed out")]),
     "Degraded", "KafkaUnavailable"),
    ("invalid spec", pipeline([], stalled=Condition("Stalled", True, "InvalidSpec", "spec.source: bad")),
     "Degraded", "InvalidSpec"),
    ("partition decrease refused",
     pipeline([Condition("TopicsReady", False, "NotSupported", "cannot shrink")],
              stalled=Condition("Stalled", True, "NotSupported", "topic t: cannot shrink")),
     "Degraded", "NotSupported"),
    ("paused", pipeline(paused=True), "Suspended", "Paused"),
    ("paused, not observed yet", pipeline(paused=True, generation=2, observed=1), "Progressing", "generation 2"),
    ("rebalancing (phase)", pipeline(rebalancing="moving partitions 2, 3 to p-dedup-1"), "Progressing",
     "Rebalancing"),
    ("rebalancing (status.rebalance)",
     pipeline(extra_status={"rebalance": {"phase": "Handoff", "generation": 4, "moving": [2, 3]}}),
     "Progressing", "Handoff"),
    ("rebalance finished (empty object)", pipeline(extra_status={"rebalance": {}}), "Healthy", "Running"),
]


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
    m = re.search(r"resource\.customizations\.health\.eopipe\.dev_ExactlyOncePipeline: \|\n(.*?)\n```",
                  readme, re.S)
    assert m, "argocd/README.md has no argocd-cm snippet"
    block = "\n".join(line[4:] for line in m.group(1).splitlines()) + "\n"
    assert block == LUA, "argocd/README.md's snippet differs from argocd/health.lua"
    # The snippet is valid YAML with the script as the key's value.
    doc = yaml.safe_load(re.search(r"```yaml\n(apiVersion: v1\nkind: ConfigMap.*?)```", readme, re.S).group(1))
    assert doc["data"]["resource.customizations.health.eopipe.dev_ExactlyOncePipeline"] == LUA


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
    # Pipelines are not pruned (deleting one may delete its topics).
    assert operator["spec"]["syncPolicy"]["automated"]["prune"] is True
    assert pipelines["spec"]["syncPolicy"]["automated"]["prune"] is False
    include = pipelines["spec"]["source"]["directory"]["include"].strip("{}").split(",")
    for name in include:
        assert (ROOT / pipelines["spec"]["source"]["path"] / name).exists(), name


def _seconds(duration: str) -> int:
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in re.findall(r"(\d+)([smh])", duration))


def _argocd_cm() -> dict:
    readme = (ROOT / "argocd" / "README.md").read_text()
    return yaml.safe_load(re.search(r"```yaml\n(apiVersion: v1\nkind: ConfigMap.*?)```", readme, re.S).group(1))


@pytest.mark.parametrize("app_status, status", [
    (None, "Progressing"),
    ({"health": {"status": "Progressing", "message": "rolling out"}}, "Progressing"),
    ({"health": {"status": "Degraded"}}, "Degraded"),
    ({"health": {"status": "Healthy"}}, "Healthy"),
])
def test_application_health_check_for_sync_waves(app_status, status):
    """The argocd-cm of argocd/README.md also wires Argo CD's health check of Applications,
    without which an app-of-apps does not wait for one wave's Application to be Healthy."""
    script = _argocd_cm()["data"]["resource.customizations.health.argoproj.io_Application"]
    app = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": "eopipe-operator"},
           **({"status": app_status} if app_status else {})}
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(app, recursive=True)
    assert dict(lua.execute(script).items())["status"] == status
