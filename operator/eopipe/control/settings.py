"""The operator's configuration: read once at start (from the environment the chart sets) and
passed in, so nothing reads the environment at import time and tests can build their own."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import json

from eopipe.control import access, nodeloss, policy
from eopipe.control.builders.access import PolicyPeers
from eopipe.control.builders.spark import DRIVER_CLUSTER_ROLE


@dataclass(frozen=True)
class Settings:
    image: str = "eopipe:latest"               # the dedup pods' image (the operator's own)
    spark_image: str = "eopipe-spark:latest"   # the SparkApplication's image
    # Level-based repair of every pipeline (drift, children deleted by hand). Changes are
    # event-driven; a running rebalance is stepped every rebalance_poll_seconds.
    resync_seconds: float = 60.0
    delete_attempts: int = 5                   # tries to delete topics before the finalizer lets go
    # How long one Kafka admin call of a pass (metadata, describe, create, delete) may take.
    kafka_timeout_seconds: float = 15.0
    # While a rebalance runs, one reconcile pass keeps stepping it for up to this long (then the
    # periodic resync continues it), so a handoff does not wait a whole resync interval per step.
    rebalance_poll_seconds: float = 10.0
    # An output partition whose last stable offset has not moved for this long, below its high
    # watermark, holds a hanging transaction: twice the workers' transaction timeout.
    hanging_transaction_seconds: float = 120.0
    # How often a pipeline with spec.dedup.autoscale is observed and decided on (the HPA's sync
    # period): the resync is too far apart for a load step.
    autoscale_seconds: float = 15.0
    # A dedup pod whose node has been NotReady this long (or is gone) is force-deleted, and its
    # claim too if pinned to that node (control/nodeloss.py). 0: never.
    node_lost_seconds: float = nodeloss.DEFAULT_THRESHOLD_SECONDS
    # The namespaces the operator watches (--namespace); empty: all. Topics are cluster-wide in
    # Kafka, so a pipeline's written topics are compared with every pipeline it can see here.
    namespaces: tuple[str, ...] = ()
    # Leader election (control/leader.py): only the holder of the Lease runs Kopf. Off by
    # default for a single local process; the chart turns it on.
    leader_election: bool = False
    lease_name: str = "eopipe-operator"
    lease_namespace: str = ""                  # EOPIPE_LEASE_NAMESPACE, else the pod's (POD_NAMESPACE)
    identity: str = ""                         # the pod's name (POD_NAME); empty: host and a random id
    lease_duration_seconds: float = 15.0       # a follower takes over after this long without renewal
    renew_deadline_seconds: float = 10.0       # a leader that could not renew for this long exits
    retry_period_seconds: float = 2.0          # how often the leader renews and followers look
    # Access control (control/access.py): the registries images named in CRs must come from
    # (empty: any), and the dedup pods' NetworkPolicy (None: not made).
    allowed_registries: tuple[str, ...] = ()
    network_policy: PolicyPeers | None = None
    # What a pipeline's author may ask for (control/policy.py; EOPIPE_TENANT_POLICY, JSON).
    tenant_policy: policy.TenantPolicy = policy.TenantPolicy()
    # The chart's ClusterRole of the Spark drivers, which the operator binds (RoleBinding) in a
    # pipeline's namespace instead of granting the rights itself (builders/spark.py driver_rbac).
    spark_driver_cluster_role: str = DRIVER_CLUSTER_ROLE

    def check(self) -> None:
        """One clear error for a configuration that cannot work."""
        if self.resync_seconds <= 0:
            raise ValueError("EOPIPE_RESYNC_SECONDS must be above 0")
        if self.kafka_timeout_seconds <= 0:
            raise ValueError("EOPIPE_KAFKA_TIMEOUT_SECONDS must be above 0")
        if self.node_lost_seconds < 0:
            raise ValueError("EOPIPE_NODE_LOST_SECONDS must be 0 (never act) or above")
        if self.leader_election:
            if not self.lease_namespace:
                raise ValueError("leader election needs the Lease's namespace: set POD_NAMESPACE "
                                 "(the downward API) or EOPIPE_LEASE_NAMESPACE")
            if not 0 < self.retry_period_seconds < self.renew_deadline_seconds < self.lease_duration_seconds:
                raise ValueError("leader election needs 0 < EOPIPE_RETRY_PERIOD_SECONDS < "
                                 "EOPIPE_RENEW_DEADLINE_SECONDS < EOPIPE_LEASE_DURATION_SECONDS (got "
                                 f"{self.retry_period_seconds:g}, {self.renew_deadline_seconds:g}, "
                                 f"{self.lease_duration_seconds:g})")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, namespaces=()) -> Settings:
        """ValueError (naming the variable) for a value that does not parse."""
        d = cls()

        def num(var: str, default, kind=float):
            try:
                return kind(environ.get(var, default))
            except ValueError:
                raise ValueError(f"{var}={environ[var]!r}: not a{'n integer' if kind is int else ' number'}") from None

        return cls(image=environ.get("EOPIPE_IMAGE", d.image),
                   spark_image=environ.get("EOPIPE_SPARK_IMAGE", d.spark_image),
                   resync_seconds=num("EOPIPE_RESYNC_SECONDS", d.resync_seconds),
                   delete_attempts=num("EOPIPE_DELETE_ATTEMPTS", d.delete_attempts, int),
                   kafka_timeout_seconds=num("EOPIPE_KAFKA_TIMEOUT_SECONDS", d.kafka_timeout_seconds),
                   rebalance_poll_seconds=num("EOPIPE_REBALANCE_POLL_SECONDS", d.rebalance_poll_seconds),
                   hanging_transaction_seconds=num("EOPIPE_HANGING_TRANSACTION_SECONDS",
                                                   d.hanging_transaction_seconds),
                   autoscale_seconds=num("EOPIPE_AUTOSCALE_SECONDS", d.autoscale_seconds),
                   node_lost_seconds=num("EOPIPE_NODE_LOST_SECONDS", d.node_lost_seconds),
                   namespaces=tuple(namespaces),
                   leader_election=_flag(environ, "EOPIPE_LEADER_ELECTION", d.leader_election),
                   lease_name=environ.get("EOPIPE_LEASE_NAME", d.lease_name),
                   lease_namespace=environ.get("EOPIPE_LEASE_NAMESPACE") or environ.get("POD_NAMESPACE", ""),
                   identity=environ.get("POD_NAME", d.identity),
                   lease_duration_seconds=num("EOPIPE_LEASE_DURATION_SECONDS", d.lease_duration_seconds),
                   renew_deadline_seconds=num("EOPIPE_RENEW_DEADLINE_SECONDS", d.renew_deadline_seconds),
                   retry_period_seconds=num("EOPIPE_RETRY_PERIOD_SECONDS", d.retry_period_seconds),
                   spark_driver_cluster_role=environ.get("EOPIPE_SPARK_DRIVER_CLUSTERROLE",
                                                         d.spark_driver_cluster_role),
                   tenant_policy=_tenant_policy(environ),
                   **access.settings_from_env(environ))


def _tenant_policy(environ: Mapping[str, str]) -> policy.TenantPolicy:
    text = environ.get("EOPIPE_TENANT_POLICY", "").strip()
    try:
        return policy.parse(json.loads(text) if text else None)
    except ValueError as e:
        raise ValueError(f"EOPIPE_TENANT_POLICY: {e}") from None


def _flag(environ: Mapping[str, str], var: str, default: bool) -> bool:
    v = environ.get(var, "").strip().lower()
    if not v:
        return default
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{var}={environ[var]!r}: not true or false")
