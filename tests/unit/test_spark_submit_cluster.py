"""The node tier's Spark Operator stand-in (localenv/node/sparkpods.py): a SparkApplication as the
spark-submit command the operator runs, its pod templates, and the driver pod's outcome."""

from pathlib import Path

import pytest

from eopipe.control.builders.spark import spark_application
from eopipe.core.names import Names
from eopipe.core.spec import PipelineSpec
from localenv.node.sparkpods import DRIVER_CONTAINER, cluster_submit, driver_outcome, pod_template

AUTH = {"caCertFile": "/ca.crt", "oauthTokenFile": "/token"}
TEMPLATES = {"driver": Path("/t/driver.json"), "executor": Path("/t/executor.json")}


def _payments_app() -> dict:
    import yaml

    from localenv import REPO_ROOT
    doc = yaml.safe_load((REPO_ROOT / "examples" / "payments.yaml").read_text())
    app = spark_application(Names("team-a", "payments", PipelineSpec.model_validate(doc["spec"])), "eopipe-spark:1")
    app["metadata"].setdefault("namespace", "team-a")
    return app


def _conf(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")


def test_the_built_application_as_spark_submit_in_cluster_mode():
    app = _payments_app()
    argv = cluster_submit(app, spark_submit="spark-submit", master="k8s://https://10.0.0.1:443", auth=AUTH,
                          templates=TEMPLATES)
    assert argv[:5] == ["spark-submit", "--master", "k8s://https://10.0.0.1:443", "--deploy-mode", "cluster"]
    conf = _conf(argv)
    spec = app["spec"]
    assert conf["spark.kubernetes.container.image"] == "eopipe-spark:1"
    assert conf["spark.kubernetes.namespace"] == "team-a"
    assert conf["spark.kubernetes.driver.pod.name"] == "payments-spark-driver"
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == spec["driver"]["serviceAccount"]
    assert conf["spark.kubernetes.driver.request.cores"] == "250m" == conf["spark.kubernetes.executor.request.cores"]
    assert conf["spark.driver.cores"] == "1" and conf["spark.executor.instances"] == "1"
    claim = spec["volumes"][0]["persistentVolumeClaim"]["claimName"]
    pre = "spark.kubernetes.driver.volumes.persistentVolumeClaim.checkpoint"
    assert conf[f"{pre}.options.claimName"] == claim
    assert conf[f"{pre}.mount.path"] == spec["driver"]["volumeMounts"][0]["mountPath"]
    assert conf["spark.kubernetes.authenticate.submission.oauthTokenFile"] == "/token"
    assert conf["spark.kubernetes.driver.podTemplateFile"] == "/t/driver.json"
    for k, v in spec["sparkConf"].items():
        assert conf[k] == v
    for e in spec["driver"]["env"]:
        assert conf[f"spark.kubernetes.driverEnv.{e['name']}"] == e["value"]
    assert argv[-len(spec["arguments"]) - 1:] == [spec["mainApplicationFile"], *spec["arguments"]]


def test_pod_template_carries_what_confs_cannot():
    app = _payments_app()
    t = pod_template(app["spec"]["driver"], DRIVER_CONTAINER)
    assert t["spec"]["securityContext"] == app["spec"]["driver"]["podSecurityContext"]
    assert t["spec"]["containers"] == [{"name": DRIVER_CONTAINER,
                                        "securityContext": app["spec"]["driver"]["securityContext"]}]


@pytest.mark.parametrize("volume, error", [
    ({"name": "checkpoint", "configMap": {"name": "x"}}, "persistentVolumeClaim, hostPath and emptyDir"),
])
def test_unsupported_volumes_are_refused(volume, error):
    app = _payments_app()
    app["spec"]["volumes"] = [volume]
    with pytest.raises(ValueError, match=error):
        cluster_submit(app, spark_submit="s", master="m", auth=AUTH, templates=TEMPLATES)


def _pod(phase, exit_code=None, reason=None):
    st = {"phase": phase}
    if exit_code is not None:
        st["containerStatuses"] = [{"name": DRIVER_CONTAINER,
                                    "state": {"terminated": {"exitCode": exit_code, "reason": reason}}}]
    return {"status": st}


@pytest.mark.parametrize("pod, expected", [
    (None, (False, 1, "DriverPodDeleted")),
    (_pod("Pending"), (True, None, "")),
    (_pod("Running"), (True, None, "")),
    (_pod("Succeeded", 0, "Completed"), (False, 0, "Completed")),
    (_pod("Failed", 2, "Error"), (False, 2, "Error")),
    (_pod("Failed", 137, "OOMKilled"), (False, 137, "OOMKilled")),
    (_pod("Failed"), (False, 1, "Error")),
])
def test_driver_outcome(pod, expected):
    assert driver_outcome(pod) == expected
