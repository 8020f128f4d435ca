"""The tenant policy (control/policy.py): what a pipeline's author may ask of the operator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eopipe.control import policy
from eopipe.core.kafkaconf import OPT_IN
from eopipe.core.spec import PipelineSpec

ROOT = Path(__file__).resolve().parents[2]
BASE = {"kafka": {"bootstrapServers": "kafka.kafka.svc:9092"}, "source": {"topic": "src", "partitions": 8}}
PROC = {"checkpoint": {"pvc": {}}}


def spec(dedup: dict | None = None, processing: dict | None = None, **top) -> PipelineSpec:
    doc = {**BASE, **top}
    if dedup is not None:
        doc["dedup"] = dedup
    if processing is not None:
        doc["processing"] = {**PROC, **processing}
        doc["sink"] = {"kafka": {"topic": "out"}}
    return PipelineSpec.model_validate(doc)


def refused(s: PipelineSpec, p: dict | None = None, registries=()) -> list[str]:
    return policy.refusals(s, policy.parse(p), registries)


@pytest.mark.parametrize("s, p, want", [
    # Spark settings: spark.kubernetes.* and the code-loading families are denied, a few allowed.
    (spec(processing={"sparkConf": {"spark.kubernetes.driver.volumes.hostPath.x.options.path": "/"}}), None,
     ["spec.processing.sparkConf[spark.kubernetes.driver.volumes.hostPath.x.options.path]: not allowed"]),
    (spec(processing={"sparkConf": {"spark.kubernetes.container.image": "evil"}}), None,
     ["spec.processing.sparkConf[spark.kubernetes.container.image]: not allowed"]),
    (spec(processing={"sparkConf": {"spark.kubernetes.driver.podTemplateFile": "/x"}}), None, ["podTemplateFile]"]),
    (spec(processing={"sparkConf": {"spark.kubernetes.namespace": "kube-system"}}), None, ["namespace]"]),
    (spec(processing={"sparkConf": {"spark.jars": "http://x/a.jar"}}), None, ["[spark.jars]"]),
    (spec(processing={"sparkConf": {"spark.jars.packages": "a:b:1"}}), None, ["[spark.jars.packages]"]),
    (spec(processing={"sparkConf": {"spark.plugins": "x.Y"}}), None, ["[spark.plugins]"]),
    (spec(processing={"sparkConf": {"spark.driver.extraJavaOptions": "-javaagent:/x"}}), None, ["extraJavaOptions]"]),
    (spec(processing={"sparkConf": {"spark.executor.extraClassPath": "/x"}}), None, ["extraClassPath]"]),
    (spec(processing={"sparkConf": {"spark.kubernetes.driverEnv.EOPIPE_KAFKA_X": "y"}}), None, ["driverEnv"]),
    (spec(processing={"sparkConf": {"spark.executorEnv.PYTHONPATH": "/x"}}), None, ["executorEnv.PYTHONPATH]"]),
    (spec(processing={"sparkConf": {"spark.hadoop.fs.s3a.impl": "x.Y"}}), None, ["fs.s3a.impl]"]),
    # JVM options: a command (-XX:OnOutOfMemoryError) or any spark.* setting as a system property.
    (spec(processing={"sparkConf": {"spark.driver.defaultJavaOptions": "-XX:OnOutOfMemoryError=sh"}}), None,
     ["spec.processing.sparkConf[spark.driver.defaultJavaOptions]: not allowed"]),
    (spec(processing={"sparkConf": {"spark.executor.defaultJavaOptions": "-Dspark.kubernetes.x=y"}}), None,
     ["executor.defaultJavaOptions]"]),
    (spec(processing={"sparkConf": {"spark.sql.hive.metastore.jars.path": "https://x/a.jar"}}), None,
     ["metastore.jars.path]"]),
    # A Hadoop setting is judged alike in hadoopConf and, as spark.hadoop.*, in sparkConf.
    (spec(processing={"sparkConf": {"spark.hadoop.fs.s3a.assumed.role.arn": "arn:aws:iam::1:role/x"}}), None,
     ["spec.processing.sparkConf[spark.hadoop.fs.s3a.assumed.role.arn]: not allowed by the tenant policy "
      "(tenantPolicy.spark.deniedHadoopConf)"]),
    (spec(processing={"sparkConf": {"spark.hadoop.fs.gs.project.id": "p"}, "hadoopConf": {"fs.gs.project.id": "p"}}),
     {"spark": {"deniedHadoopConf": ["fs.gs.*"]}}, ["sparkConf[spark.hadoop.fs.gs.project.id]: not allowed",
                                                    "hadoopConf[fs.gs.project.id]: not allowed"]),
    (spec(processing={"sparkConf": {"spark.sql.shuffle.partitions": "4",
                                    "spark.kubernetes.executor.request.cores": "250m"}}), None, []),
    # A label could put the driver into another pipeline's NetworkPolicy.
    (spec(processing={"sparkConf": {"spark.kubernetes.driver.label.eopipe.dev/pipeline": "other"}}), None,
     ["label.eopipe.dev/pipeline]"]),
    # The admin may allow more, and then the image and env rules still apply inside sparkConf.
    (spec(processing={"sparkConf": {"spark.executorEnv.LD_PRELOAD": "/x", "spark.executorEnv.TEAM": "a"}}),
     {"spark": {"allowedConf": ["spark.executorEnv.*"]}}, ["executorEnv.LD_PRELOAD]: environment variable LD_PRELOAD"]),
    (spec(processing={"sparkConf": {"spark.sql.catalog.x": "y"}}), None, ["spark.sql.catalog.x]"]),
    (spec(processing={"sparkConf": {"spark.sql.adaptive.enabled": "false"}}),
     {"spark": {"deniedConf": ["spark.sql.adaptive.*"]}}, ["spark.sql.adaptive.enabled]"]),
    (spec(processing={"hadoopConf": {"fs.s3a.aws.credentials.provider": "x", "fs.s3a.endpoint": "http://s3:8333"}}),
     None, ["spec.processing.hadoopConf[fs.s3a.aws.credentials.provider]"]),
    # The driver's ServiceAccount: the operator's own unless the admin allows another.
    (spec(processing={"serviceAccount": "admin"}), None, ["spec.processing.serviceAccount: admin is not allowed"]),
    (spec(processing={"serviceAccount": "spark-s3"}), {"spark": {"serviceAccounts": ["spark-s3"]}}, []),
    # Environment names.
    (spec(dedup={"podTemplate": {"env": [{"name": "PYTHONWARNINGS", "value": "x"}]}}), None,
     ["spec.dedup.podTemplate.env[0]: environment variable PYTHONWARNINGS is reserved"]),
    (spec(dedup={"podTemplate": {"env": [{"name": "BROWSER", "value": "x"}]}}), None, ["BROWSER is reserved"]),
    (spec(dedup={"podTemplate": {"env": [{"name": "EOPIPE_TOKEN_FILE", "value": "x"}]}}), None, ["EOPIPE_TOKEN_FILE"]),
    (spec(dedup={"podTemplate": {"env": [{"name": "http_proxy", "value": "x"}]}}), None, ["allowPattern"]),
    (spec(processing={"env": [{"name": "JAVA_TOOL_OPTIONS", "value": "x"}]}), None, ["processing.env[0]"]),
    (spec(processing={"env": [{"name": "TEAM", "value": "a"}]}), None, []),
    (spec(dedup={"podTemplate": {"env": [{"name": "TEAM", "value": "a"}]}}), {"env": {"denied": ["TEAM"]}},
     ["TEAM is reserved"]),
    (spec(processing={"envFrom": [{"secretRef": {"name": "s"}}]}), None, ["envFrom[0]: envFrom needs a prefix"]),
    (spec(processing={"envFrom": [{"secretRef": {"name": "s"}, "prefix": "PY"}]}), None, ["reserved variable PYTHON*"]),
    (spec(processing={"envFrom": [{"secretRef": {"name": "s"}, "prefix": "EOPIPE_KAFKA_"}]}), None, ["EOPIPE_*"]),
    (spec(processing={"envFrom": [{"configMapRef": {"name": "s"}, "prefix": "B"}]}), None, ["BROWSER"]),
    (spec(processing={"envFrom": [{"configMapRef": {"name": "s"}, "prefix": "APP_"}]}), None, []),
    # Scheduling.
    (spec(dedup={"podTemplate": {"tolerations": [{"operator": "Exists"}]}}), None,
     ["spec.dedup.podTemplate.tolerations[0]: toleration of every taint"]),
    (spec(processing={"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}),
     None, ["spec.processing.tolerations[0]"]),
    (spec(dedup={"podTemplate": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}}), None, []),
    (spec(dedup={"podTemplate": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}}),
     {"scheduling": {"tolerationKeys": ["pool"]}}, ["tolerations[0]"]),
    (spec(dedup={"podTemplate": {"priorityClassName": "system-cluster-critical"}}), None,
     ["spec.dedup.podTemplate.priorityClassName: system-cluster-critical"]),
    (spec(dedup={"podTemplate": {"priorityClassName": "data"}}), {"scheduling": {"priorityClasses": ["data"]}}, []),
    (spec(dedup={"podTemplate": {"nodeSelector": {"kubernetes.io/hostname": "cp"}}}),
     {"scheduling": {"nodeSelectorKeys": ["pool"]}}, ["spec.dedup.podTemplate.nodeSelector: key kubernetes.io/hostname"]),
    # A nodeAffinity chooses nodes as a nodeSelector does: the same keys.
    (spec(dedup={"podTemplate": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                              {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["cp"]}]}]}}}}}),
     {"scheduling": {"nodeSelectorKeys": ["pool"]}},
     ["spec.dedup.podTemplate.affinity.nodeAffinity: key metadata.name is not allowed"]),
    (spec(processing={"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                           "values": ["cp"]}]}}]}}}),
     {"scheduling": {"nodeSelectorKeys": ["pool"]}}, ["spec.processing.affinity.nodeAffinity: key kubernetes.io/hostname"]),
    (spec(processing={"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"},
                                   "podAntiAffinity": {}}}), {"scheduling": {"nodeSelectorKeys": ["pool"]}}, []),
    # Annotations other controllers act on: a sidecar's image, a Vault role, a Multus network.
    (spec(dedup={"podTemplate": {"annotations": {"sidecar.istio.io/proxyImage": "evil", "team": "a"}}}), None,
     ["spec.dedup.podTemplate.annotations[sidecar.istio.io/proxyImage]: not allowed by the tenant policy"]),
    (spec(dedup={"podTemplate": {"annotations": {"vault.hashicorp.com/agent-inject": "true",
                                                 "k8s.v1.cni.cncf.io/networks": "host-net"}}}), None,
     ["[vault.hashicorp.com/agent-inject]", "[k8s.v1.cni.cncf.io/networks]"]),
    (spec(dedup={"podTemplate": {"annotations": {"sidecar.istio.io/inject": "false", "linkerd.io/inject": "disabled"}}}),
     None, []),  # in or out of the mesh, as the admin configured it
    (spec(dedup={"podTemplate": {"annotations": {"sidecar.istio.io/inject": "false"}}}),
     {"pods": {"deniedAnnotationKeys": ["sidecar.istio.io/*"]}}, ["annotations[sidecar.istio.io/inject]"]),
    (spec(dedup={"podTemplate": {"annotations": {"team": "a", "example.com/owner": "b"}}}),
     {"pods": {"annotationKeys": ["example.com/*"]}}, ["annotations[team]"]),
    (spec(dedup={"podTemplate": {"annotations": {"team": "a"}}}), {"pods": {"deniedAnnotationKeys": ["team"]}},
     ["annotations[team]"]),
    # Labels other controllers act on: a StatefulSet's revision or pod, a mesh revision or waypoint.
    (spec(dedup={"podTemplate": {"labels": {"controller-revision-hash": "x", "team": "a"}}}), None,
     ["spec.dedup.podTemplate.labels[controller-revision-hash]: not allowed by the tenant policy "
      "(tenantPolicy.pods.labelKeys)"]),
    (spec(dedup={"podTemplate": {"labels": {"statefulset.kubernetes.io/pod-name": "p-0", "istio.io/use-waypoint": "w",
                                            "kubernetes.io/x": "y"}}}), None,
     ["labels[statefulset.kubernetes.io/pod-name]", "labels[istio.io/use-waypoint]", "labels[kubernetes.io/x]"]),
    (spec(dedup={"podTemplate": {"labels": {"app.kubernetes.io/part-of": "shop", "sidecar.istio.io/inject": "false",
                                            "team": "a"}}}), None, []),  # the recommended labels, the mesh's opt-out
    # An admin's NetworkPolicy selects by a label: the admin names the keys pipelines may set.
    (spec(dedup={"podTemplate": {"labels": {"team": "a", "db-client": "true"}}}), {"pods": {"labelKeys": ["team"]}},
     ["labels[db-client]"]),
    (spec(dedup={"podTemplate": {"labels": {"app.kubernetes.io/version": "2"}}}),
     {"pods": {"deniedLabelKeys": ["app.kubernetes.io/*"]}}, ["labels[app.kubernetes.io/version]"]),
    # Sizes and addresses.
    (spec(dedup={"storage": {"size": "10Ti"}}), None, ["spec.dedup.storage.size: 10Ti is above"]),
    (spec(processing={"checkpoint": {"pvc": {"size": "2Gi"}}}), {"maxStorage": "1Gi"},
     ["spec.processing.checkpoint.pvc.size: 2Gi"]),
    (spec(kafka={"bootstrapServers": "kafka.kafka.svc:9092,evil.example:9092"}),
     {"kafka": {"bootstrapServers": ["*.kafka.svc:9092"]}}, ["spec.kafka.bootstrapServers: evil.example:9092"]),
    (spec(), {"kafka": {"bootstrapServers": ["*.kafka.svc:9092"]}}, []),
    (spec(dedup={"backup": {"uri": "s3://bkt/p", "endpoint": "http://169.254.169.254"}}),
     {"objectStore": {"endpoints": ["http://*.storage.svc:8333"]}},
     ["spec.dedup.backup.endpoint: http://169.254.169.254 is not allowed"]),
    (spec(dedup={"backup": {"uri": "s3://bkt/p", "endpoint": "http://s3.storage.svc:8333"}}),
     {"objectStore": {"endpoints": ["http://*.storage.svc:8333"]}}, []),
    (spec(dedup={"backup": {"uri": "s3://bkt/p", "endpoint": "http://anywhere:8333"}}), None, []),
    (spec(dedup={"backup": {"uri": "s3://bkt/p"}, "podTemplate": {"env": [{"name": "AWS_ENDPOINT_URL_S3", "value": "x"}]}}),
     {"objectStore": {"endpoints": ["http://*.storage.svc:8333"]}}, ["AWS_ENDPOINT_URL_S3 is reserved"]),
    # s3a's endpoint and proxy, however spelt, are held to the same list as the backups.
    (spec(processing={"hadoopConf": {"fs.s3a.endpoint": "http://169.254.169.254"}}),
     {"objectStore": {"endpoints": ["http://*.storage.svc:8333"]}},
     ["spec.processing.hadoopConf[fs.s3a.endpoint]: http://169.254.169.254 is not allowed"]),
    (spec(processing={"hadoopConf": {"fs.s3a.bucket.ckpt.endpoint": "http://far:80",
                                     "fs.s3a.proxy.host": "far", "fs.s3a.endpoint": "http://s3.storage.svc:8333",
                                     "fs.s3a.endpoint.region": "us-east-1"},
                      "sparkConf": {"spark.hadoop.fs.s3a.endpoint": "http://far:80"}}),
     {"objectStore": {"endpoints": ["http://*.storage.svc:8333"]}},
     ["sparkConf[spark.hadoop.fs.s3a.endpoint]: http://far:80", "hadoopConf[fs.s3a.bucket.ckpt.endpoint]",
      "hadoopConf[fs.s3a.proxy.host]: far is not allowed"]),
    (spec(processing={"hadoopConf": {"fs.s3a.bucket.ckpt.eu.endpoint": "http://far:80"}}),  # a bucket name with dots
     {"objectStore": {"endpoints": ["http://*.storage.svc:8333"]}}, ["hadoopConf[fs.s3a.bucket.ckpt.eu.endpoint]"]),
    (spec(processing={"hadoopConf": {"fs.s3a.endpoint": "http://far:80"}}), None, []),  # no list: any store
    (spec(dedup={"image": "ghcr.io/evil/x:1"}), None, []),  # no registry allow-list: any image
])
def test_refusals_name_the_field(s, p, want):
    got = refused(s, p)
    assert len(got) == len(want), got
    for line, fragment in zip(got, want):
        assert fragment in line, (fragment, got)


def test_images_are_refused_through_the_registry_allow_list():
    assert refused(spec(dedup={"image": "ghcr.io/evil/x:1"}), None, ("ghcr.io/acme",)) == [
        "spec.dedup.image: ghcr.io/evil/x:1 (ghcr.io/evil/x) is not from an allowed registry (ghcr.io/acme)"]
    # An image an admin lets a pipeline set inside sparkConf is held to the same list.
    key = "spark.kubernetes.executor.container.image"
    s = spec(processing={"sparkConf": {key: "ghcr.io/evil/x:1"}})
    assert refused(s, {"spark": {"allowedConf": [key]}}, ("ghcr.io/acme",)) == [
        f"spec.processing.sparkConf[{key}]: ghcr.io/evil/x:1 (ghcr.io/evil/x) is not from an allowed registry "
        "(ghcr.io/acme)"]
    assert refused(s, {"spark": {"allowedConf": [key]}}, ()) == []


@pytest.mark.parametrize("annotations, pipeline, ok", [
    (None, "p", False),                             # no such Secret
    ({}, "p", False),                               # not opened
    ({OPT_IN: "other"}, "p", False),
    ({OPT_IN: "other, p"}, "p", True),
    ({OPT_IN: "*"}, "p", True),
    ({OPT_IN: "pp"}, "p", False),
])
def test_a_secret_reaches_a_pipeline_only_if_opened_to_it(annotations, pipeline, ok):
    s = spec(kafka={"bootstrapServers": "k:9092", "securityProtocol": "SASL_SSL",
                    "sasl": {"username": {"name": "kc", "key": "u"}, "password": {"name": "kc", "key": "p"}}})
    got = policy.opt_in_refusals("Secret", policy.secret_refs(s),
                                 {"kc": annotations} if annotations is not None else {}, pipeline)
    assert got == ([] if ok else [f"spec.kafka.sasl.{f}: Secret kc is not open to pipeline {pipeline}: it must exist "
                                  f"and carry the annotation {OPT_IN} naming {pipeline} (or *)"
                                  for f in ("username", "password")])


@pytest.mark.parametrize("annotations, ok", [(None, False), ({}, False), ({OPT_IN: "other"}, False),
                                              ({OPT_IN: "p, payments"}, True), ({OPT_IN: "*"}, True)])
def test_a_named_checkpoint_claim_is_mounted_only_if_opened_to_the_pipeline(annotations, ok):
    """Another pipeline's state-<pod> claim, or another team's data, is not the tenant's to mount."""
    s = spec(processing={"checkpoint": {"pvc": {"claimName": "state-other-dedup-0"}}})
    refs = policy.claim_refs(s)
    assert refs == [("processing.checkpoint.pvc.claimName", "state-other-dedup-0")]
    got = policy.opt_in_refusals("PersistentVolumeClaim", refs,
                                 {"state-other-dedup-0": annotations} if annotations is not None else {}, "payments")
    assert got == ([] if ok else ["spec.processing.checkpoint.pvc.claimName: PersistentVolumeClaim state-other-dedup-0 "
                                  f"is not open to pipeline payments: it must exist and carry the annotation {OPT_IN} "
                                  "naming payments (or *)"])
    assert policy.claim_refs(spec(processing={})) == []  # the operator's own claim needs no opening


def test_every_secret_a_spec_names_is_found():
    s = spec(dedup={"podTemplate": {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s1", "key": "k"}}}]},
                    "backup": {"uri": "s3://bkt", "credentials": {"accessKeyId": {"name": "s6", "key": "i"},
                                                                "secretAccessKey": {"name": "s7", "key": "k"}}}},
             processing={"env": [{"name": "B", "valueFrom": {"secretKeyRef": {"name": "s2", "key": "k"}}}],
                         "envFrom": [{"secretRef": {"name": "s3"}, "prefix": "X_"}, {"configMapRef": {"name": "c"}}]},
             kafka={"bootstrapServers": "k:9092", "tls": {"ca": {"name": "s4", "key": "ca"}}},
             imagePullSecrets=[{"name": "s5"}])
    assert policy.secret_refs(s) == [
        ("kafka.tls.ca", "s4"), ("dedup.backup.credentials.accessKeyId", "s6"),
        ("dedup.backup.credentials.secretAccessKey", "s7"), ("dedup.podTemplate.env[0].valueFrom.secretKeyRef", "s1"),
        ("processing.env[0].valueFrom.secretKeyRef", "s2"), ("processing.envFrom[0].secretRef", "s3"),
        ("imagePullSecrets[0]", "s5")]


@pytest.mark.parametrize("doc, error", [
    ({"spark": {"allowedConf": "x"}}, "tenantPolicy.spark.allowedConf"),
    ({"maxStorage": "lots"}, "tenantPolicy"),
    ({"env": {"allowPattern": "("}}, "tenantPolicy"),
    ({"nope": 1}, "tenantPolicy.nope"),
])
def test_a_bad_policy_is_one_clear_error(doc, error):
    with pytest.raises(ValueError, match=error.replace(".", r"\.")):
        policy.parse(doc)


def test_the_charts_copy_of_the_builtin_lists_is_current():
    committed = json.loads((ROOT / "charts/eopipe/files/tenant-policy-builtin.json").read_text())
    assert committed == policy.builtin(), \
        "run: .venv/bin/python -m eopipe.control.policy > charts/eopipe/files/tenant-policy-builtin.json"
