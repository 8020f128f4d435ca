"""The SparkApplication of the processing stage (Kubeflow Spark Operator, v1beta2)."""

from __future__ import annotations

import json

from eopipe import kafkaconf
from eopipe.builders.names import Names

SPARK_APP_MAIN = "local:///opt/eopipe/spark_app/main.py"


def spark_config(names: Names) -> dict:
    """What spark_app needs, passed as one JSON argument so it is validated in one place."""
    spec = names.spec
    proc, sink = spec.processing, spec.sink
    conf = {
        "pipeline": names.pipeline,
        "namespace": names.namespace,
        "bootstrap": spec.kafka.bootstrap_servers,
        "source_topic": names.deduped_topic,
        "sql": proc.sql,
        "trigger": proc.trigger,
        "checkpoint_location": proc.checkpoint_location,
    }
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


def spark_application(names: Names, image: str) -> dict:
    proc = names.spec.processing
    labels = names.labels("processing")
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": names.spark_app, "namespace": names.namespace, "labels": labels},
        "spec": {
            "type": "Python",
            "mode": "cluster",
            "pythonVersion": "3",
            "image": proc.image or image,
            "mainApplicationFile": SPARK_APP_MAIN,
            "arguments": ["--config-json", json.dumps(spark_config(names), sort_keys=True)],
            "sparkVersion": "4.0.0",
            "restartPolicy": {"type": "OnFailure", "onFailureRetries": 1000,
                              "onFailureRetryInterval": 10, "onSubmissionFailureRetries": 10,
                              "onSubmissionFailureRetryInterval": 20},
            "sparkConf": {
                "spark.sql.streaming.stateStore.providerClass":
                    "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
                "spark.sql.shuffle.partitions": str(shuffle_partitions(names)),
            },
            # spark_app reads the Kafka client settings (credentials from Secrets) on the
            # driver and hands them to the Kafka source and sink it plans for the executors.
            "driver": {"cores": 1, "memory": proc.driver_memory, "labels": labels,
                       "serviceAccount": driver_rbac(names)[0]["metadata"]["name"],
                       "env": kafkaconf.pod_env(names.spec.kafka)},
            "executor": {"instances": proc.executors.instances, "cores": proc.executors.cores,
                         "memory": proc.executors.memory, "labels": labels},
        },
    }


# What the Spark driver does on Kubernetes: executor pods, their service, config maps and
# (with dynamic allocation of volumes) claims. The operator holds the same rights (RBAC forbids
# granting more than one has), see charts/eopipe/templates/_helpers.tpl.
DRIVER_RULES = [
    {"apiGroups": [""], "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
     "verbs": ["get", "list", "watch", "create", "delete", "deletecollection", "patch"]},
]


def driver_rbac(names: Names) -> list[dict]:
    """ServiceAccount, Role and RoleBinding that the SparkApplication's driver runs as."""
    sa = f"{names.pipeline}-spark"
    meta = {"name": sa, "namespace": names.namespace, "labels": names.labels("processing")}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": DRIVER_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": names.namespace}]},
    ]
