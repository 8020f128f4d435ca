"""The SparkApplication of the processing stage (Kubeflow Spark Operator, v1beta2)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from importlib import metadata

from eopipe.control.builders import checkpoint, pods
from eopipe.core import kafkaconf
from eopipe.core.names import LABEL_SPARK_SPEC, Names

SPARK_APP_MAIN = "local:///opt/eopipe/spark_app/main.py"
CHECKPOINT_VOLUME = "checkpoint"
# The Spark Operator retries a failed driver whatever its exit status, so a spec Spark cannot
# analyse (exit 2) would be run again and again: it retries once (a quick restart after a lone
# crash), and once it gives up (FAILED) the operator decides (control/sparkstatus.py): submitted
# again after any other failure, left FAILED (pipeline phase Failed) after exit 2 until the spec
# changes. A bad spec thus costs at most two driver runs.
RESTART_POLICY = {"type": "OnFailure", "onFailureRetries": 1, "onFailureRetryInterval": 10,
                  "onSubmissionFailureRetries": 10, "onSubmissionFailureRetryInterval": 20}
_PYSPARK_PIN = re.compile(r"^pyspark==([0-9][0-9.]*)\s*(;.*)?$")


@functools.cache
def spark_version() -> str:
    """The Spark release of the image: the pyspark pin of the `spark` extra, written only in
    pyproject.toml (hack/spark-version.sh reads it for the image and the connector jars), as
    the installed package's metadata carries it."""
    for line in metadata.requires("eopipe") or ():
        if 'extra == "spark"' in line and (m := _PYSPARK_PIN.match(line)):
            return m.group(1)
    raise RuntimeError("the installed eopipe has no pyspark==<version> pin in its `spark` extra")


def checkpoint_location(base: str, generation: int) -> str:
    """Generation 0 is where the checkpoint always was; the next ones are beside Spark's own
    directories in it (Spark reads only offsets/, commits/, state/, sources/ and metadata)."""
    return base if generation == 0 else f"{base.rstrip('/')}/generation-{generation}"


def spark_config(names: Names, generation: int = 0) -> dict:
    """What spark_app needs, passed as one JSON argument so it is validated in one place.
    generation: the checkpoint's (status.sparkCheckpoint, control/sparkstage.checkpoint_record)."""
    spec = names.spec
    proc, sink = spec.processing, spec.sink
    namespace, pipeline = names.identity  # they make the Kafka ids (spark_app/config.py)
    conf = {
        "pipeline": pipeline,
        "namespace": namespace,
        "bootstrap": spec.kafka.bootstrap_servers,
        "source_topic": names.deduped_topic,
        "sql": proc.sql,
        "trigger": proc.trigger,
        "checkpoint_location": checkpoint_location(proc.checkpoint.location(names.pipeline), generation),
        "output_mode": proc.output_mode,
        "upgrade_mode": proc.upgrade_mode,
    }
    if proc.upgrade_mode == "reprocess":
        conf["starting_offsets"] = proc.reprocess_from
    optional = {"schema": proc.value_schema, "transform": proc.transform,
                "max_offsets_per_trigger": proc.max_offsets_per_trigger,
                "watermark": proc.watermark and {"column": proc.watermark.column, "delay": proc.watermark.delay}}
    conf.update({k: v for k, v in optional.items() if v is not None})
    if sink.kafka is not None:
        conf["sink"] = {"kind": "kafka", "topic": sink.kafka.topic,
                        "commit_topic": names.spark_commit_topic}
    else:
        conf["sink"] = {"kind": "files", "path": sink.files.path, "format": sink.files.format}
    return conf


def shuffle_partitions(names: Names) -> int:
    """Spark's default of 200 makes a small streaming batch 200 tasks. Two per executor core
    keeps every core busy; the first run pins the number in the checkpoint, so later changes
    of the executors do not reshuffle existing state."""
    ex = names.spec.processing.executors
    return max(2, 2 * ex.instances * ex.cores)


# The Spark container of each pod (org.apache.spark.deploy.k8s.Constants); a pod template names it.
SPARK_CONTAINER = {"driver": "spark-kubernetes-driver", "executor": "spark-kubernetes-executor"}


def _pod(role) -> dict:
    """What spark-submit itself passes to the pods (as Spark settings): resources."""
    pod = {"cores": role.cores, "memory": role.memory}
    extra = {"coreRequest": role.core_request, "memoryOverhead": role.memory_overhead}
    pod.update({k: v for k, v in extra.items() if v is not None})
    return pod


def pod_template(proc, role: str, env: list[dict], vols: list[dict], mounts: list[dict]) -> dict:
    """The driver's or the executors' pod template, which Spark applies to the pods it creates:
    the restricted security contexts, the checkpoint claim, env and placement. Not the
    SparkApplication's own pod fields: the Spark Operator's pod webhook is what applies those
    (v2.5.2's spark-submit passes only its local-dir volumes and `envVars`), so with the webhook
    off they would be dropped (a checkpoint in the container's file system: a replaced driver
    replays), and with it on the webhook would add a volume the template has a second time.
    The root filesystem stays writable: Spark and spark_app write outside the local-dir volumes
    Spark mounts (the JVM and spark_app's zip of itself under /tmp, caches under the home
    directory), and no test here runs Spark in a container to find every such path."""
    container = {"name": SPARK_CONTAINER[role],
                 "securityContext": pods.container_security_context(read_only_root_filesystem=False)}
    extra = {"env": env or None, "envFrom": list(proc.env_from) or None, "volumeMounts": mounts or None}
    container.update({k: v for k, v in extra.items() if v is not None})
    spec = {"securityContext": pods.pod_security_context(), "containers": [container]}
    placement = {"volumes": vols if mounts else None, "nodeSelector": dict(proc.node_selector) or None,
                 "tolerations": list(proc.tolerations) or None, "affinity": proc.affinity}
    spec.update({k: v for k, v in placement.items() if v is not None})
    return {"spec": spec}


def volumes(names: Names) -> tuple[list[dict], list[dict], list[dict]]:
    """(the pods' volumes, the driver's volumeMounts, the executors'): the checkpoint claim in the
    driver, and in the executors too when it is ReadWriteMany (their state files, a files sink)."""
    claim = checkpoint.claim_name(names)
    if claim is None:
        return [], [], []
    pvc = names.spec.processing.checkpoint.pvc
    mount = [{"name": CHECKPOINT_VOLUME, "mountPath": pvc.mount_path}]
    return ([{"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}}], mount,
            mount if pvc.access_mode == "ReadWriteMany" else [])


def spark_application(names: Names, image: str, generation: int = 0) -> dict:
    proc = names.spec.processing
    labels = names.labels("processing")
    env = [e.model_dump(by_alias=True, exclude_none=True) for e in proc.env]
    vols, driver_mounts, executor_mounts = volumes(names)
    app = {
        # A literal: tests/unit/test_permissions.py reads the kinds the builders make from it.
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": names.spark_app, "namespace": names.namespace, "labels": labels},
        "spec": {
            "type": "Python",
            "mode": "cluster",
            "pythonVersion": "3",
            "image": proc.image or image,
            "mainApplicationFile": SPARK_APP_MAIN,
            "arguments": ["--config-json", json.dumps(spark_config(names, generation), sort_keys=True)],
            "sparkVersion": spark_version(),
            "restartPolicy": RESTART_POLICY,
            "sparkConf": {
                "spark.sql.streaming.stateStore.providerClass":
                    "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
                "spark.sql.shuffle.partitions": str(shuffle_partitions(names)),
                **proc.spark_conf,
            },
            # spark_app reads the Kafka client settings (credentials from Secrets) on the
            # driver and hands them to the Kafka source and sink it plans for the executors.
            "driver": {**_pod(proc.driver), "labels": labels,
                       "serviceAccount": driver_account(names),
                       "template": pod_template(proc, "driver", kafkaconf.pod_env(names.spec.kafka) + env,
                                                vols, driver_mounts)},
            "executor": {"instances": proc.executors.instances, **_pod(proc.executors), "labels": labels,
                         "template": pod_template(proc, "executor", env, vols, executor_mounts)},
        },
    }
    if proc.hadoop_conf:
        app["spec"]["hadoopConf"] = dict(proc.hadoop_conf)
    if secrets := pods.image_pull_secrets(names.spec):
        app["spec"]["imagePullSecrets"] = secrets  # v1beta2 takes names, not references
    digest = hashlib.sha256(json.dumps(app["spec"], sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    for role in ("driver", "executor"):
        app["spec"][role]["labels"] = {**labels, LABEL_SPARK_SPEC: digest}
    return app


# What the Spark driver does on Kubernetes (Spark 4.2's scheduler backend and pod allocator):
# it makes, watches, labels and deletes its executor pods; makes their ConfigMap; at its end
# deletes its ConfigMaps, Services and claims by label (one deletecollection each); and lists
# claims to reuse (a refusal it logs and passes over). Nothing more: no reads of the namespace's
# ConfigMaps, Services or claims beyond that list, which the tenant's query, run in the driver,
# could otherwise make. The chart's driver admission policy narrows these rights to what Spark
# made (docs/security.md#the-spark-drivers-token). The chart ships these rules as one ClusterRole
# (charts/eopipe/templates/rbac.yaml, `<fullname>-<namespace>-spark-driver`) and the operator
# binds it in the pipeline's namespace: RBAC lets it bind that ClusterRole by name (`bind` with
# resourceNames) without holding these rights itself, as it would have to to grant them in a
# Role of its own making.
DRIVER_RULES = [
    {"apiGroups": [""], "resources": ["pods"],
     "verbs": ["get", "list", "watch", "create", "delete", "deletecollection", "patch"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "deletecollection"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["list", "deletecollection"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["deletecollection"]},
]
# The ClusterRole's name where no chart sets EOPIPE_SPARK_DRIVER_CLUSTERROLE (control/settings.py).
DRIVER_CLUSTER_ROLE = "eopipe-spark-driver"


def driver_account(names: Names) -> str:
    """The ServiceAccount the driver runs as: the spec's (one the admin allows), else the operator's."""
    return names.spec.processing.service_account or own_driver_account(names)


def own_driver_account(names: Names) -> str:
    return f"{names.pipeline}-spark"


def driver_rbac(names: Names, cluster_role: str = DRIVER_CLUSTER_ROLE) -> list[dict]:
    """ServiceAccount that the SparkApplication's driver runs as, and the RoleBinding of the
    chart's driver ClusterRole to it, in the pipeline's namespace only. The binding is
    `<pipeline>-spark-driver`: a RoleBinding's roleRef cannot change, and releases before the
    ClusterRole bound a Role `<pipeline>-spark` from a RoleBinding `<pipeline>-spark`."""
    sa = own_driver_account(names)
    labels = names.labels("processing")
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": sa, "namespace": names.namespace, "labels": labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{sa}-driver", "namespace": names.namespace, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": names.namespace}]},
    ]
