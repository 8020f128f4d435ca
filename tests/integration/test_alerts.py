"""The chart's monitoring: the alert rules (PrometheusRule) checked and unit-tested by promtool,
and the PodMonitor selecting the dedup pods the operator builds.

The rules are rendered by `helm template` (release eopipe, namespace eopipe-system, as the
promtool tests in charts/eopipe/alerts-test.yaml expect), the PrometheusRule's groups written
as a rules file, then `promtool check rules` and `promtool test rules`. The tests must notice a
broken rule: a few plausible mistakes in the expressions, and every tunable value changed,
each make `promtool test rules` fail.

promtool is built from the Go module proxy by hack/build-tools.sh (cached; the `tools` fixture).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.helm import CHART, run_helm

ALERTS_TEST = CHART / "alerts-test.yaml"
ENABLED = ["--set", "prometheusRule.enabled=true", "--set", "serviceMonitor.enabled=true"]
ALERTS = ["EopipeOperatorDown", "EopipePipelineNotReady", "EopipeReconcileErrors", "EopipeDedupLagGrowing",
          "EopipeEffectiveWindowShort", "EopipeDeadLetters", "EopipeTransactionAborts",
          "EopipeSparkBatchSlow", "EopipeSparkLagGrowing", "EopipeSparkNoBatch"]


def rendered(tools, helm_env, *values: str, template: str = "prometheusrule.yaml") -> list[dict]:
    out = run_helm(tools, helm_env, "template", "eopipe", str(CHART), "--namespace", "eopipe-system",
                   *values, "--show-only", f"templates/{template}").stdout
    return [d for d in yaml.safe_load_all(out) if d]


def rule_groups(tools, helm_env, *values: str) -> dict:
    (rule,) = rendered(tools, helm_env, *ENABLED, *values)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    return rule["spec"]


def alert_rules(groups: dict) -> dict[str, dict]:
    return {r["alert"]: r for g in groups["groups"] for r in g["rules"]}


def promtool(tools, tmp_path: Path, groups: dict, *command: str) -> subprocess.CompletedProcess:
    """Runs `promtool <command>` in tmp_path, which holds the groups as rules.yaml and a copy of
    alerts-test.yaml (whose rule_files names rules.yaml)."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups, sort_keys=False, width=10**6))
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    return subprocess.run([str(tools["promtool"]), *command], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def test_alert_rules_pass_promtool(tools, helm_env, tmp_path):
    groups = rule_groups(tools, helm_env)
    assert sorted(alert_rules(groups)) == sorted(ALERTS)
    res = promtool(tools, tmp_path, groups, "check", "rules", "--lint=all", "--lint-fatal", "rules.yaml")
    assert res.returncode == 0 and f"SUCCESS: {len(ALERTS)} rules found" in res.stdout, res.stdout + res.stderr
    res = promtool(tools, tmp_path, groups, "test", "rules", ALERTS_TEST.name)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_alert_is_tested_firing_and_not_firing():
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    cases = [c for t in tests for c in t["alert_rule_test"]]
    for alert in ALERTS:
        mine = [c for c in cases if c["alertname"] == alert]
        assert any(c["exp_alerts"] for c in mine), f"{alert}: no case where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{alert}: no case where it stays quiet"


# Plausible mistakes, one per alert: each must turn `promtool test rules` red.
BROKEN = [
    ("EopipeOperatorDown", " or absent(up{", " and absent(up{"),  # an unscraped operator goes unnoticed
    ("EopipePipelineNotReady", "== 0", "== 1"),
    ("EopipeReconcileErrors", 'result="error"', 'result="retry"'),
    ("EopipeDedupLagGrowing", "[15m:]) > 0", "[15m:]) < 0"),
    # The untested snippet this replaced compared every pod with the longest window of any pipeline.
    ("EopipeEffectiveWindowShort", "< 0.9 * max by (namespace, pipeline, pod) (eopipe_dedup_window_seconds)",
     "< on () group_left () max(eopipe_dedup_window_seconds) * 0.9"),
    ("EopipeDeadLetters", "eopipe_dedup_dead_lettered_total", "eopipe_dedup_dead_lettered"),
    ("EopipeTransactionAborts", "sum by (namespace, pipeline, pod) (rate(", "max by (namespace, pipeline, pod) (rate("),
    ("EopipeSparkBatchSlow", "> max by (namespace, name) (eopipe_operator_spark_trigger", "> 2 * max by (namespace, name) (eopipe_operator_spark_trigger"),
    ("EopipeSparkLagGrowing", "[15m:]) > 0", "[15m:]) >= 0"),
    # Without the floor, a 1 s trigger would page after 10 s without a batch.
    ("EopipeSparkNoBatch", "(eopipe_operator_spark_trigger_seconds), 60)", "(eopipe_operator_spark_trigger_seconds), 0)"),
]


@pytest.mark.parametrize("alert, old, new", BROKEN, ids=[b[0] for b in BROKEN])
def test_promtool_tests_catch_a_broken_expression(tools, helm_env, tmp_path, alert, old, new):
    groups = rule_groups(tools, helm_env)
    rule = alert_rules(groups)[alert]
    assert old in rule["expr"], rule["expr"]
    rule["expr"] = rule["expr"].replace(old, new)
    assert promtool(tools, tmp_path, groups, "check", "rules", "rules.yaml").returncode == 0  # still valid PromQL
    res = promtool(tools, tmp_path, groups, "test", "rules", ALERTS_TEST.name)
    assert res.returncode != 0 and f"alertname: {alert}," in res.stderr, res.stdout + res.stderr


# Every tunable value: rendered where it belongs, and covered by the promtool tests (which
# expect the defaults, so a changed value must make them fail).
TUNABLES = [
    ("operatorDown.for=2m", "EopipeOperatorDown", "for", "2m"),
    ("pipelineNotReady.for=2m", "EopipePipelineNotReady", "for", "2m"),
    ("reconcileErrors.for=5m", "EopipeReconcileErrors", "for", "5m"),
    ("dedupLag.records=200000", "EopipeDedupLagGrowing", "expr", "> 200000\n"),
    ("dedupLag.for=5m", "EopipeDedupLagGrowing", "for", "5m"),
    ("effectiveWindow.ratio=0.5", "EopipeEffectiveWindowShort", "expr", "< 0.5 * max"),
    ("effectiveWindow.for=45m", "EopipeEffectiveWindowShort", "for", "45m"),
    ("deadLetters.range=10m", "EopipeDeadLetters", "expr", "[10m]"),
    ("transactionAborts.perSecond=0.3", "EopipeTransactionAborts", "expr", "> 0.3"),
    ("transactionAborts.for=5m", "EopipeTransactionAborts", "for", "5m"),
    ("sparkBatchSlow.for=20m", "EopipeSparkBatchSlow", "for", "20m"),
    ("sparkLag.records=400000", "EopipeSparkLagGrowing", "expr", "> 400000\n"),
    ("sparkLag.for=5m", "EopipeSparkLagGrowing", "for", "5m"),
    ("sparkNoBatch.triggers=20", "EopipeSparkNoBatch", "expr", "clamp_min(20 *"),
    ("sparkNoBatch.for=15m", "EopipeSparkNoBatch", "for", "15m"),
]


@pytest.mark.parametrize("value, alert, field, expected", TUNABLES, ids=[t[0] for t in TUNABLES])
def test_thresholds_are_values_and_tested(tools, helm_env, tmp_path, value, alert, field, expected):
    groups = rule_groups(tools, helm_env, "--set", f"prometheusRule.{value}")
    rule = alert_rules(groups)[alert]
    if field == "for":
        assert rule["for"] == expected
    else:
        assert expected in rule["expr"], rule["expr"]
    res = promtool(tools, tmp_path, groups, "test", "rules", ALERTS_TEST.name)
    assert res.returncode != 0 and f"alertname: {alert}," in res.stderr, res.stdout + res.stderr


def test_rule_labels_and_the_operator_down_alert(tools, helm_env):
    (rule,) = rendered(tools, helm_env, "--set", "prometheusRule.enabled=true",
                       "--set", "prometheusRule.labels.release=prom", "--set", "prometheusRule.ruleLabels.team=data")
    assert rule["metadata"]["labels"]["release"] == "prom"
    alerts = alert_rules(rule["spec"])
    # Without the ServiceMonitor nothing scrapes the operator under that job: no such alert.
    assert sorted(alerts) == sorted(set(ALERTS) - {"EopipeOperatorDown"})
    for r in alerts.values():
        assert r["labels"]["team"] == "data" and r["labels"]["severity"] in ("critical", "warning"), r
    # The job is the metrics Service's name, which follows the release's full name.
    alerts = alert_rules(rule_groups(tools, helm_env, "--set", "fullnameOverride=eo"))
    assert 'up{job="eo-metrics", namespace="eopipe-system"} == 0' in alerts["EopipeOperatorDown"]["expr"]
    # Off by default.
    out = run_helm(tools, helm_env, "template", "eopipe", str(CHART), "--set", "serviceMonitor.enabled=true").stdout
    assert "PrometheusRule" not in {d["kind"] for d in yaml.safe_load_all(out) if d}


@pytest.mark.parametrize("watch", [[], ["team-a", "team-b"]])
def test_pod_monitor_selects_the_dedup_pods(tools, helm_env, watch):
    from eopipe.control.builders.dedup import statefulset
    from tests.helpers.pipelines import example_names

    values = ["--set", "podMonitor.enabled=true", "--set", "podMonitor.labels.release=prom"]
    if watch:
        values += ["--set", f"watchNamespaces={{{','.join(watch)}}}"]
    (pm,) = rendered(tools, helm_env, *values, template="podmonitor.yaml")
    assert pm["kind"] == "PodMonitor" and pm["metadata"]["labels"]["release"] == "prom"
    # The pod template the operator builds for a pipeline's dedup StatefulSet.
    pod = statefulset(example_names("minimal.yaml", "team-a"), "eopipe:0.1.0")["spec"]["template"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    ports = [p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    assert endpoint["relabelings"] == [{"sourceLabels": ["__meta_kubernetes_pod_label_eopipe_dev_pipeline"],
                                        "targetLabel": "pipeline"}]
    assert pod["metadata"]["labels"]["eopipe.dev/pipeline"] == "minimal"
    assert pm["spec"]["namespaceSelector"] == ({"matchNames": watch} if watch else {"any": True})
    # The operator's pods are not selected (they have their own ServiceMonitor).
    dep = next(d for d in yaml.safe_load_all(run_helm(tools, helm_env, "template", "eopipe", str(CHART)).stdout)
               if d and d["kind"] == "Deployment")
    assert not pm["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
