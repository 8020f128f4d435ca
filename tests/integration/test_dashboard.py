"""The chart's Grafana dashboard: charts/eopipe/dashboards/eopipe.json, shipped as a ConfigMap for
Grafana's dashboard sidecar (templates/dashboard.yaml, `grafanaDashboard.enabled`).

- The ConfigMap renders with the sidecar's label, the values' namespace and annotations, and
  holds the dashboard file unchanged under a `.json` key; values.schema.json rejects bad values.
- Every query (each panel target and each template variable's label_values) names only series
  the code exports. Those are collected from the code, not listed here: the worker's `Metrics`
  (its registry's metric families) and every prometheus_client metric defined at module level
  in `eopipe.control` (the operator serves the default registry). A family's series are its
  name with the suffixes of its type (counter `_total`, histogram `_bucket`/`_sum`/`_count`).
- The queries are parsed by promtool (`promql label-matchers set`, which rewrites every vector
  selector with an extra matcher): so the metric names come from PromQL's own parser, not from
  a guess at which identifiers are functions. The label matchers name labels the series carry
  (their own, the scrape target's, the PodMonitor's relabelings), and every per-pipeline series
  is filtered by the dashboard's `namespace` and `pipeline` variables.
- Every panel has a title, the `datasource` variable as its data source, and a place on the
  grid that no other panel takes; docs/dashboard.svg (hack/dashboard-preview.py) shows them all.

helm and promtool come from the `tools` fixture (conftest.py).
"""

from __future__ import annotations

import difflib
import importlib
import json
import pkgutil
import re
import subprocess
from dataclasses import dataclass

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tests.helpers.helm import CHART, ROOT, run_helm

DASHBOARD = CHART / "dashboards" / "eopipe.json"
PREVIEW = ROOT / "docs" / "dashboard.svg"
ENABLED = ["--set", "grafanaDashboard.enabled=true"]
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# The series of each metric type (prometheus_client's exposition).
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created"), "info": ("_info",), "stateset": ("",), "enum": ("",)}
# Labels the Prometheus Operator gives every series of a ServiceMonitor or PodMonitor target.
TARGET_LABELS = frozenset({"namespace", "pod", "container", "endpoint", "service", "job", "instance"})
# Grafana's interval variables, as a value PromQL parses (other variables sit inside strings).
GRAFANA_INTERVALS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
PROBE = "__eopipe_probe__"
SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\{([^{}]*)\}")
MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
LABEL_VALUES = re.compile(r"^label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)$")


@dataclass(frozen=True)
class Exported:
    family: str
    stage: str  # "dedup" (each dedup pod's /metrics) or "operator"
    labels: frozenset[str]


def _wrappers_of_module(module) -> list[MetricWrapperBase]:
    return [m for m in vars(module).values() if isinstance(m, MetricWrapperBase)]


@pytest.fixture(scope="module")
def exported() -> dict[str, Exported]:
    """Every series name the worker and the operator export -> its metric."""
    import eopipe.control
    from eopipe.dedup.metrics import Metrics

    worker = Metrics()
    dedup = [m for m in vars(worker).values() if isinstance(m, MetricWrapperBase)]
    # Each of the registry's families is one of Metrics' attributes (their label names are read there).
    assert {f.name for f in worker.registry.collect()} == {f.name for m in dedup for f in m.describe()}
    operator = []
    for mod in pkgutil.walk_packages(eopipe.control.__path__, "eopipe.control."):
        operator += _wrappers_of_module(importlib.import_module(mod.name))
    assert dedup and operator
    out: dict[str, Exported] = {}
    for stage, wrappers in (("dedup", dedup), ("operator", operator)):
        for m in wrappers:
            for family in m.describe():
                for suffix in SUFFIXES[family.type]:
                    labels = frozenset(m._labelnames) | ({"le"} if suffix == "_bucket" else set())
                    out[family.name + suffix] = Exported(family.name, stage, labels)
    return out


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside collapsed rows included."""
    return [q for p in dashboard["panels"] for q in (p, *(p.get("panels") or ()))]


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable's label_values."""
    out = [(f"panel {p['title']!r} target {t.get('refId')}", t["expr"])
           for p in all_panels(dashboard) for t in p.get("targets") or ()]
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            m = LABEL_VALUES.match(v["definition"])
            assert m, f"variable {v['name']}: {v['definition']!r} is not label_values(<selector>, <label>)"
            out.append((f"variable {v['name']}", m.group(1)))
    return out


def selectors(tools, expr: str) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """The vector selectors of a PromQL expression as promtool parses it: (metric name, {label:
    (operator, value)}). Fails if it does not parse or has a selector without a metric name."""
    query = expr
    for var, value in GRAFANA_INTERVALS.items():
        query = query.replace(var, value)
    res = subprocess.run([str(tools["promtool"]), "--experimental", "promql", "label-matchers", "set", query, PROBE,
                          "1"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"{expr!r} is not PromQL: {res.stderr}"
    found = []
    for name, body in SELECTOR.findall(res.stdout):
        matchers = {label: (op, value) for label, op, value in MATCHER.findall(body)}
        if PROBE in matchers:
            del matchers[PROBE]
            assert name, f"{expr!r}: a selector without a metric name ({{{body}}})"
            found.append((name, matchers))
    assert found and len(found) == res.stdout.count(PROBE), f"{expr!r}: selectors not understood in {res.stdout}"
    return found


@pytest.fixture(scope="module")
def relabeled(tools, helm_env) -> frozenset[str]:
    """Labels the chart's PodMonitor adds to the dedup pods' series (`pipeline`)."""
    out = run_helm(tools, helm_env, "template", "eopipe", str(CHART), "--set", "podMonitor.enabled=true",
                   "--show-only", "templates/podmonitor.yaml").stdout
    (pm,) = [d for d in yaml.safe_load_all(out) if d]
    return frozenset(r["targetLabel"] for e in pm["spec"]["podMetricsEndpoints"] for r in e.get("relabelings") or ())


# ---------------------------------------------------------------------------------------
# the chart
# ---------------------------------------------------------------------------------------

def render(tools, helm_env, *values: str) -> list[dict]:
    out = run_helm(tools, helm_env, "template", "eopipe", str(CHART), "--namespace", "eopipe-system", *values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def dashboard_config_maps(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"].get("labels", {})]


def test_dashboard_is_off_by_default(tools, helm_env):
    assert dashboard_config_maps(render(tools, helm_env)) == []


def test_dashboard_config_map(tools, helm_env, dashboard):
    (cm,) = dashboard_config_maps(render(tools, helm_env, *ENABLED))
    assert cm["apiVersion"] == "v1"
    assert cm["metadata"]["name"] == "eopipe-dashboard" and cm["metadata"]["namespace"] == "eopipe-system"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["app.kubernetes.io/instance"] == "eopipe"
    assert "annotations" not in cm["metadata"]
    ((key, text),) = cm["data"].items()
    assert key.endswith(".json")
    assert json.loads(text) == dashboard


def test_dashboard_config_map_values(tools, helm_env):
    (cm,) = dashboard_config_maps(render(
        tools, helm_env, *ENABLED, "--set", "grafanaDashboard.namespace=monitoring",
        "--set", "grafanaDashboard.annotations.grafana_folder=Data platform",
        "--set-string", "grafanaDashboard.labels.release=prometheus"))
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Data platform"}
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1" and cm["metadata"]["labels"]["release"] == "prometheus"
    # Another label instead of the sidecar's default one.
    (cm,) = [d for d in render(tools, helm_env, *ENABLED, "--set", "grafanaDashboard.labels.grafana_dashboard=null",
                               "--set-string", "grafanaDashboard.labels.dashboards=eopipe")
             if d["kind"] == "ConfigMap"]
    assert "grafana_dashboard" not in cm["metadata"]["labels"] and cm["metadata"]["labels"]["dashboards"] == "eopipe"


def test_helm_lint_with_the_dashboard(tools, helm_env):
    res = run_helm(tools, helm_env, "lint", "--strict", str(CHART), *ENABLED)
    assert "0 chart(s) failed" in res.stdout


@pytest.mark.parametrize("args, message", [
    (["--set", "grafanaDashboard.enabled=yes"], "/grafanaDashboard/enabled"),
    (["--set", "grafanaDashboard.namespace=Monitoring"], "/grafanaDashboard/namespace"),
    (["--set", "grafanaDashboard.labels.grafana_dashboard=1"], "/grafanaDashboard/labels/grafana_dashboard"),
    (["--set", "grafanaDashboard.folder=eopipe"], "additional properties 'folder'"),
])
def test_values_schema_rejects_bad_dashboard_values(tools, helm_env, args, message):
    res = run_helm(tools, helm_env, "template", "eopipe", str(CHART), *args, check=False)
    assert res.returncode != 0 and message in res.stderr, res.stderr


# ---------------------------------------------------------------------------------------
# the dashboard
# ---------------------------------------------------------------------------------------

def test_dashboard_model(dashboard):
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"] and dashboard["id"] is None
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name, label in (("namespace", "namespace"), ("pipeline", "name")):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"] == DATASOURCE
        m = LABEL_VALUES.match(v["definition"])
        assert m and m.group(2) == label and v["query"]["query"] == v["definition"]
        assert v["multi"] and v["includeAll"] and v["allValue"] == ".*"  # the queries filter with =~


def test_every_panel_has_a_title_a_datasource_and_queries(dashboard):
    panels = all_panels(dashboard)
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        assert p.get("title"), p
        if p["type"] == "row":
            continue
        assert p.get("datasource") == DATASOURCE, f"{p['title']}: datasource {p.get('datasource')}"
        targets = p.get("targets") or []
        assert targets, f"{p['title']}: no queries"
        assert len({t["refId"] for t in targets}) == len(targets)
        for t in targets:
            assert t.get("expr", "").strip() and t.get("datasource", DATASOURCE) == DATASOURCE, (p["title"], t)


def test_panels_tile_the_grid(dashboard):
    """Each panel within Grafana's 24 columns, none on top of another."""
    taken: dict[tuple[int, int], str] = {}
    for p in all_panels(dashboard):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, (p["title"], g)
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{p['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = p["title"]


def test_variables_used_are_defined(dashboard):
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    for where, expr in queries(dashboard):
        for var in re.findall(r"\$\{?(\w+)", expr):
            assert var in defined or f"${var}" in GRAFANA_INTERVALS, f"{where}: ${var} is not a variable"


def test_every_query_reads_exported_series(tools, dashboard, exported, relabeled):
    """The test that keeps the dashboard honest: every metric a query names is exported by the code
    (with its type's suffix), every label it matches on is one that series carries, and every
    per-pipeline series is narrowed to the selected namespace and pipeline."""
    assert "pipeline" in relabeled
    problems = []
    used = set()
    for where, expr in queries(dashboard):
        for name, matchers in selectors(tools, expr):
            metric = exported.get(name)
            if metric is None:
                near = difflib.get_close_matches(name, exported, n=3)
                problems.append(f"{where}: {name} is not exported by the code (near: {near})")
                continue
            used.add(metric.family)
            carried = metric.labels | TARGET_LABELS | (relabeled if metric.stage == "dedup" else frozenset())
            problems += [f"{where}: {name} has no label {label!r} (it has {sorted(carried)})"
                         for label in matchers if label not in carried]
            if where.startswith("variable"):
                continue
            wanted = {"dedup": {"namespace": "$namespace", "pipeline": "$pipeline"}}.get(metric.stage) or (
                {"namespace": "$namespace", "name": "$pipeline"} if "name" in metric.labels else {})
            problems += [f"{where}: {name} is not filtered by {label}=~\"{value}\""
                         for label, value in wanted.items() if matchers.get(label) != ("=~", value)]
    assert not problems, "\n".join(problems)
    assert {m.stage for m in exported.values() if m.family in used} == {"dedup", "operator"}


def test_a_wrong_metric_name_is_caught(tools, exported):
    """The check above fails on what it should: each of these names is absent from `exported`."""
    for expr in ('sum(rate(eopipe_dedup_consumed{pipeline=~"$pipeline"}[$__rate_interval]))',  # no _total
                 "eopipe_dedup_commit_seconds",  # a histogram's family name is no series
                 "rate(eopipe_dedup_emited_total[5m]) > 0"):
        (name, _), *_ = selectors(tools, expr)
        assert name not in exported, name
    with pytest.raises(AssertionError, match="not PromQL"):
        selectors(tools, "sum(rate(eopipe_dedup_consumed_total[$__rate_interval])")


def test_preview_shows_every_panel(dashboard):
    """docs/dashboard.svg is drawn from this dashboard (hack/dashboard-preview.py; text kept as text)."""
    svg = PREVIEW.read_text()
    missing = [p["title"] for p in all_panels(dashboard)
               if p["title"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") not in svg]
    assert not missing, f"docs/dashboard.svg is out of date (.venv/bin/python hack/dashboard-preview.py): {missing}"
