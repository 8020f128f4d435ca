"""Every Kubernetes object of a pipeline, in the order the operator applies them: the one list
that the reconcile pass applies and `eopipe render` prints."""

from __future__ import annotations

from typing import Protocol

from eopipe.control.builders import access, dedup, spark
from eopipe.core.assignment import Assignment
from eopipe.core.names import Names


class Setup(Protocol):
    """What the objects take of the operator's settings (control/settings.Settings has them);
    named here so that the builders need not import the settings, which import the builders."""
    image: str
    spark_image: str
    network_policy: access.PolicyPeers | None
    spark_driver_cluster_role: str
    node_lost_seconds: float  # > 0: the operator acts on lost and drained nodes (control/nodeloss.py)


def dedup_objects(names: Names, image: str, assignment: Assignment, replicas: int,
                  network: access.PolicyPeers | None = None, drains: bool = False) -> list[dict]:
    """The assignment ConfigMap, the pods' RBAC, the headless Service, the PodDisruptionBudget
    (`drains`: the operator moves the partitions off a cordoned node itself), the NetworkPolicy
    (with `network`: the operator's setting), and last the StatefulSet (the reconcile pass reads
    its status). The token Secret is not here: it is created once, with a random token
    (control/tokens.py)."""
    policy = [access.network_policy(names, network)] if network is not None else []
    return [dedup.assignment_configmap(names, assignment), *dedup.rbac(names), dedup.headless_service(names),
            dedup.pod_disruption_budget(names, replicas, drains), *policy, dedup.statefulset(names, image, replicas)]


def processing_objects(names: Names, spark_image: str, driver_cluster_role: str, generation: int = 0) -> list[dict]:
    """The Spark driver's ServiceAccount and its binding to the chart's ClusterRole, and last the
    SparkApplication on checkpoint `generation` (status.sparkCheckpoint); nothing without
    spec.processing."""
    if names.spec.processing is None:
        return []
    return [*spark.driver_rbac(names, driver_cluster_role), spark.spark_application(names, spark_image, generation)]


def objects(names: Names, settings: Setup, assignment: Assignment, replicas: int) -> list[dict]:
    return (dedup_objects(names, settings.image, assignment, replicas, settings.network_policy,
                          settings.node_lost_seconds > 0)
            + processing_objects(names, settings.spark_image, settings.spark_driver_cluster_role))
