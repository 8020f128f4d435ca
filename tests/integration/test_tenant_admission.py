"""The tenant policy at admission (docs/security.md): the chart's ValidatingAdmissionPolicy on
the real API server refuses what the operator's policy refuses, naming the field, and
`eopipe validate` says the same of the same manifest."""

from __future__ import annotations

import json

import pytest
import yaml

from localenv.fixtures_operator import kubectl, wait_for
from tests.helpers.helm import CHART, run_helm
from tests.helpers.manifests import changed, example, lines_about, validate
from tests.helpers.pipelines import kubectl_apply

pytestmark = pytest.mark.k8s

TOLERATE_ALL = [{"operator": "Exists"}]
# (what a tenant writes, the field the refusal names); each also refused by `eopipe validate`.
REFUSED = [
    ({"spec.processing.sparkConf": {"spark.kubernetes.driver.volumes.hostPath.x.options.path": "/"}},
     "spec.processing.sparkConf[spark.kubernetes.driver.volumes.hostPath.x.options.path]"),
    ({"spec.processing.sparkConf": {"spark.driver.extraJavaOptions": "-javaagent:/tmp/a.jar"}},
     "spec.processing.sparkConf[spark.driver.extraJavaOptions]"),
    ({"spec.processing.serviceAccount": "admin"}, "spec.processing.serviceAccount: admin"),
    ({"spec.dedup.podTemplate": {"env": [{"name": "PYTHONWARNINGS", "value": "x"}]}}, "PYTHONWARNINGS"),
    ({"spec.processing.env": [{"name": "JAVA_TOOL_OPTIONS", "value": "x"}]}, "JAVA_TOOL_OPTIONS"),
    ({"spec.processing.envFrom": [{"secretRef": {"name": "s"}, "prefix": "EOPIPE_KAFKA_"}]}, "EOPIPE_KAFKA_"),
    ({"spec.processing.envFrom": [{"secretRef": {"name": "s"}}]}, "spec.processing.envFrom"),
    ({"spec.dedup.podTemplate": {"tolerations": TOLERATE_ALL}}, "every taint"),
    ({"spec.processing.tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]},
     "node-role.kubernetes.io/control-plane"),
    ({"spec.dedup.podTemplate": {"priorityClassName": "system-node-critical"}}, "system-node-critical"),
    ({"spec.dedup.storage": {"size": "10Ti"}}, "spec.dedup.storage.size: 10Ti"),
    ({"spec.processing.sparkConf": {"spark.driver.defaultJavaOptions": "-XX:OnOutOfMemoryError=sh"}},
     "spec.processing.sparkConf[spark.driver.defaultJavaOptions]"),
    ({"spec.processing.sparkConf": {"spark.hadoop.fs.s3a.assumed.role.arn": "arn:aws:iam::1:role/x"}},
     "spec.processing.sparkConf[spark.hadoop.fs.s3a.assumed.role.arn]"),
    ({"spec.processing.hadoopConf": {"fs.s3a.aws.credentials.provider": "x"}},
     "spec.processing.hadoopConf[fs.s3a.aws.credentials.provider]"),
    ({"spec.dedup.podTemplate": {"annotations": {"sidecar.istio.io/proxyImage": "evil"}}},
     "spec.dedup.podTemplate.annotations[sidecar.istio.io/proxyImage]"),
    ({"spec.dedup.podTemplate": {"labels": {"controller-revision-hash": "x"}}},
     "spec.dedup.podTemplate.labels[controller-revision-hash]"),
]
HOSTNAME_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["cp"]}]}]}}}


def _install(cp, ns: str, tools, helm_env, *values: str) -> str:
    """The chart's admission policy bound to namespace `ns` only (the control plane is shared
    with the other tests), once the API server enforces it; returns its YAML, to delete it."""
    out = run_helm(tools, helm_env, "template", "eopipe", str(CHART), "--namespace", ns, "--show-only",
                   "templates/admissionpolicy.yaml", "--set", f"watchNamespaces={{{ns}}}", *values).stdout
    kubectl(cp, "apply", "-f", "-", input=out)
    probe = yaml.safe_dump(changed(example("payments.yaml"), **{"metadata.name": "probe", **REFUSED[0][0]}))
    # The API server picks a new policy up within a second or so; a server-side dry run goes
    # through admission and stores nothing (a stored probe would make later tries updates).
    wait_for(lambda: kubectl(cp, "apply", "--dry-run=server", "-n", ns, "-f", "-", input=probe,
                             check=False).returncode != 0, timeout=60, what="the admission policy to take effect")
    return out


@pytest.fixture
def admission(crds, kube_api, k8s_namespace, tools, helm_env):
    out = _install(crds, k8s_namespace, tools, helm_env)
    yield crds
    kubectl(crds, "delete", "--ignore-not-found", "-f", "-", input=out)


def test_the_admission_policy_refuses_what_the_tenant_policy_refuses(admission, k8s_namespace, tmp_path):
    good = example("payments.yaml")
    res = kubectl_apply(admission, k8s_namespace, good, check=False)
    assert res.returncode == 0, res.stderr
    files = []
    for i, (over, field) in enumerate(REFUSED):
        doc = changed(good, **{"metadata.name": "t", **over})
        res = kubectl_apply(admission, k8s_namespace, doc, check=False)
        assert res.returncode != 0 and field in res.stderr and "tenantPolicy" in res.stderr, (over, res.stderr)
        files.append(tmp_path / f"{i:02d}.yaml")
        files[-1].write_text(yaml.safe_dump(doc))
    # `eopipe validate` says the same of each manifest: one run over a file each (a process start
    # apiece cost a second or more; the command checks each file on its own).
    val = validate(*files)
    assert val.returncode == 1, val.stdout + val.stderr
    for f, (over, field) in zip(files, REFUSED):
        said = lines_about(val.stdout, f)
        assert any(field in line for line in said), (over, said)


def test_a_pipeline_written_before_the_policy_can_still_be_deleted(crds, kube_api, k8s_namespace, tools, helm_env):
    # An object the policy would refuse, stored before it existed, with a finalizer as Kopf adds.
    old = changed(example("payments.yaml"), **{"metadata.finalizers": ["eopipe.dev/test"], **REFUSED[2][0]})
    kubectl_apply(crds, k8s_namespace, old)
    out = _install(crds, k8s_namespace, tools, helm_env)
    try:
        # A change of its spec that keeps the refused field is refused; metadata changes are not.
        res = kubectl_apply(crds, k8s_namespace, changed(old, **{"spec.dedup.window": "12h"}), check=False)
        assert res.returncode != 0 and "spec.processing.serviceAccount" in res.stderr, res.stderr
        res = kubectl(crds, "patch", "-n", k8s_namespace, "exactlyoncepipeline", "payments", "--type=merge",
                      "-p", '{"metadata": {"finalizers": null}}', check=False)
        assert res.returncode == 0, res.stderr
    finally:
        kubectl(crds, "delete", "--ignore-not-found", "-f", "-", input=out)


def test_an_admin_can_allow_more(crds, kube_api, k8s_namespace, tools, helm_env):
    out = _install(crds, k8s_namespace, tools, helm_env, "--set", "tenantPolicy.spark.serviceAccounts={spark-s3}",
                   "--set", "tenantPolicy.scheduling.priorityClasses={data}",
                   "--set", "tenantPolicy.kafka.bootstrapServers={*.kafka.svc:9092}",
                   "--set", "tenantPolicy.objectStore.endpoints={http://*.storage.svc:8333}",
                   "--set", "tenantPolicy.scheduling.nodeSelectorKeys={pool}", "--set", "tenantPolicy.pods.labelKeys={team}")
    try:
        pool = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
            "matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}}]}}
        good = changed(example("payments.yaml"), **{"spec.processing.serviceAccount": "spark-s3",
                                                    "spec.processing.affinity": pool,
                                                    "spec.dedup.podTemplate": {"priorityClassName": "data",
                                                                               "affinity": pool, "annotations": {
                                                                                   "sidecar.istio.io/inject": "false"},
                                                                               "labels": {"team": "a"}},
                                                    "spec.dedup.backup": {"uri": "s3://state",
                                                                          "endpoint": "http://s3.storage.svc:8333"}})
        far = changed(good, **{"metadata.name": "far", "spec.kafka.bootstrapServers": "kafka.evil.example:9092"})
        res = kubectl_apply(crds, k8s_namespace, far, check=False)
        assert "spec.kafka.bootstrapServers: kafka.evil.example:9092" in res.stderr, res.stderr
        store = changed(good, **{"metadata.name": "store",
                                 "spec.dedup.backup": {"uri": "s3://state", "endpoint": "http://169.254.169.254"}})
        res = kubectl_apply(crds, k8s_namespace, store, check=False)
        assert "spec.dedup.backup.endpoint: http://169.254.169.254 is not allowed" in res.stderr, res.stderr
        for conf, key in (("hadoopConf", "fs.s3a.bucket.ckpt.eu.endpoint"), ("sparkConf", "spark.hadoop.fs.s3a.proxy.host")):
            ckpt = changed(good, **{"metadata.name": "ckpt", f"spec.processing.{conf}": {key: "169.254.169.254"}})
            res = kubectl_apply(crds, k8s_namespace, ckpt, check=False)
            assert f"spec.processing.{conf}[{key}]: 169.254.169.254 is not allowed" in res.stderr, res.stderr
        # A nodeAffinity by another key than the admin's nodeSelectorKeys, in either stage.
        for field in ("spec.dedup.podTemplate.affinity", "spec.processing.affinity"):
            res = kubectl_apply(crds, k8s_namespace, changed(good, **{"metadata.name": "pin", field: HOSTNAME_AFFINITY}),
                                check=False)
            assert f"{field}.nodeAffinity: a key is not allowed" in res.stderr, res.stderr
        # A label outside the admin's labelKeys (one a NetworkPolicy of the namespace may select by).
        res = kubectl_apply(crds, k8s_namespace, changed(good, **{"metadata.name": "label", "spec.dedup.podTemplate.labels":
                                                                  {"team": "a", "db-client": "true"}}), check=False)
        assert "spec.dedup.podTemplate.labels[db-client]: not allowed" in res.stderr, res.stderr
        res = kubectl_apply(crds, k8s_namespace, good, check=False)
        assert res.returncode == 0, res.stderr
    finally:
        kubectl(crds, "delete", "--ignore-not-found", "-f", "-", input=out)


def test_restoring_from_another_namespace_needs_the_admins_grant(crds, kube_api, k8s_namespace, tools, helm_env,
                                                                 tmp_path):
    """spec.restoreFrom takes another pipeline's consumer group and topics: across namespaces only
    where tenantPolicy.restores grants it (at admission, and `eopipe validate` with the same
    policy); within its namespace always. Once stored, the field is neither removed, changed nor
    added (the CRD's transition rule)."""
    grant = [{"from": "shop", "to": k8s_namespace}]
    out = _install(crds, k8s_namespace, tools, helm_env, "--set-json", f"tenantPolicy.restores={json.dumps(grant)}")
    try:
        base = changed(example("payments.yaml"), **{"metadata.namespace": k8s_namespace})
        far = changed(base, **{"metadata.name": "far", "spec.restoreFrom": {"namespace": "bank", "name": "payments"}})
        res = kubectl_apply(crds, k8s_namespace, far, check=False)
        assert res.returncode != 0 and (f"spec.restoreFrom: continuing a pipeline of namespace bank in {k8s_namespace} "
                                        "is not allowed by the tenant policy (tenantPolicy.restores)") in res.stderr, \
            res.stderr
        granted = changed(base, **{"metadata.name": "granted", "spec.restoreFrom": {"namespace": "shop",
                                                                                     "name": "payments"}})
        home = changed(base, **{"metadata.name": "home", "spec.restoreFrom": {"namespace": k8s_namespace,
                                                                               "name": "old"}})
        for doc in (granted, home, changed(base, **{"metadata.name": "plain"})):
            res = kubectl_apply(crds, k8s_namespace, doc, check=False)
            assert res.returncode == 0, res.stderr
        policy = tmp_path / "policy.yaml"
        policy.write_text(yaml.safe_dump({"tenantPolicy": {"restores": grant}}))
        files = [tmp_path / f"{d['metadata']['name']}.yaml" for d in (far, granted, home)]
        for f, d in zip(files, (far, granted, home)):
            f.write_text(yaml.safe_dump(d))
        val = validate("--policy", policy, *files)
        refused = " ".join(lines_about(val.stdout, files[0]))
        assert val.returncode == 1 and "tenantPolicy.restores" in refused, val.stdout
        assert all(f"{f}: ExactlyOncePipeline/{f.stem}: valid" in val.stdout for f in files[1:]), val.stdout
        # Never moved between identities.
        for doc, edit in ((granted, {"spec.restoreFrom": None}), (granted, {"spec.restoreFrom.name": "other"}),
                          (changed(base, **{"metadata.name": "plain"}), {"spec.restoreFrom": {
                              "namespace": "shop", "name": "payments"}})):
            res = kubectl_apply(crds, k8s_namespace, changed(doc, **edit), check=False)
            assert res.returncode != 0 and "restoreFrom is set when the pipeline is created and never changed" \
                in res.stderr, (edit, res.stderr)
    finally:
        kubectl(crds, "delete", "-n", k8s_namespace, "exactlyoncepipelines", "--all", "--wait=false", check=False)
        kubectl(crds, "delete", "--ignore-not-found", "-f", "-", input=out)
