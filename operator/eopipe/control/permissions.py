"""Every Kubernetes API access of the operator, as RBAC sees it: the table the chart's
ClusterRole and Roles are checked against (tests/integration/test_chart.py) and that is itself
checked against the code (tests/unit/test_permissions.py: the client calls in control/ and
core/, the kinds the builders make, which are applied server-side, and Kopf's own).

Scopes: WATCHED, in every namespace whose pipelines the operator reconciles (a Role there, or
the ClusterRole when it watches all); OWN, the operator's own namespace (its Lease); CLUSTER,
cluster-scoped reads.

The operator holds no right only so that it may grant it: the Spark driver's rights are the
chart's ClusterRole, which the operator may bind by name (IMPLIED), and the one Role it makes,
the dedup pods', grants reads of one ConfigMap.
"""

from __future__ import annotations

from dataclasses import dataclass

from eopipe.core.names import SPARK_GROUP, SPARK_PLURAL

WATCHED, OWN, CLUSTER = "watched", "own", "cluster"

# Server-side apply of an object: get (read back), create (when missing) and patch.
APPLY = ("get", "create", "patch")


@dataclass(frozen=True)
class Access:
    group: str
    resource: str
    verbs: tuple[str, ...]
    scope: str
    why: str
    named: bool = False  # granted on the objects the chart names only (resourceNames)


KOPF = (
    Access("eopipe.dev", "exactlyoncepipelines", ("list", "watch", "patch"), WATCHED,
           "Kopf: watches pipelines, patches its finalizer and handler progress"),
    Access("", "events", ("create",), WATCHED, "Kopf posts the operator's events"),
    Access("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch"), CLUSTER,
           "Kopf observes the CRD"),
    Access("", "namespaces", ("list", "watch"), CLUSTER, "Kopf observes namespaces, even named ones"),
    Access(SPARK_GROUP, SPARK_PLURAL, ("list", "watch"), WATCHED,
           "Kopf watches the SparkApplications: a state change reconciles the pipeline (control/sparkwatch.py)"),
    Access("apps", "statefulsets", ("list", "watch"), WATCHED,
           "Kopf watches the dedup StatefulSets: a change of their ready pods reconciles the pipeline "
           "(control/sparkwatch.py; a pod on a node that stopped reporting turns NotReady)"),
    Access("", "nodes", ("list", "watch"), CLUSTER,
           "Kopf watches Nodes: one turning cordoned (a drain) reconciles the pipelines with dedup pods "
           "(control/sparkwatch.py), whose budget holds the drain until their partitions moved"),
)

API_ACCESS = (
    *KOPF,
    Access("eopipe.dev", "exactlyoncepipelines", ("get", "list"), WATCHED,
           "re-read inside the lock; list all to find two pipelines writing one topic"),
    Access("eopipe.dev", "exactlyoncepipelines/status", ("patch",), WATCHED, "status"),
    Access("", "pods", ("list",), WATCHED,
           "the dedup pods, to read their /status; the Spark driver's (control/sparkstage.py)"),
    # create: the token Secret is made by the operator, with a random token; RBAC cannot name
    # the object of a create.
    Access("", "secrets", ("get", "create"), WATCHED,
           "Kafka credentials (read); the state-endpoint token Secret (created once, then read)"),
    Access("", "configmaps", APPLY, WATCHED, "the assignment ConfigMap"),
    Access("", "services", APPLY, WATCHED, "the dedup pods' headless Service"),
    Access("", "serviceaccounts", APPLY, WATCHED, "the dedup pods' and the Spark driver's"),
    Access("", "persistentvolumeclaims", APPLY, WATCHED, "the Spark checkpoint volume"),
    Access("", "pods", ("delete",), WATCHED,
           "node loss: a dedup pod on a lost node, force-deleted by uid, or on a drained node once it owns "
           "no partition, deleted by uid (control/nodeloss.py)"),
    Access("", "persistentvolumeclaims", ("list", "delete"), WATCHED,
           "node loss: a dedup pod's claim pinned to a lost node, deleted by uid (control/nodeloss.py); "
           "a deleted pipeline's dedup state claims, listed by label, deleted by uid (control/teardown.py)"),
    Access("", "nodes", ("get",), CLUSTER,
           "node loss: the Ready condition and the cordon of the dedup pods' nodes, by name"),
    Access("", "persistentvolumes", ("get",), CLUSTER,
           "node loss: whether a dedup pod's volume is pinned to one node, by name"),
    Access("apps", "statefulsets", APPLY, WATCHED, "the dedup pods"),
    Access("policy", "poddisruptionbudgets", APPLY, WATCHED, "the dedup pods' budget"),
    Access("networking.k8s.io", "networkpolicies", APPLY, WATCHED, "who may reach the dedup pods"),
    Access("rbac.authorization.k8s.io", "roles", APPLY, WATCHED, "the dedup pods'"),
    Access("rbac.authorization.k8s.io", "rolebindings", APPLY, WATCHED,
           "the dedup pods' and the driver's (to the chart's ClusterRole)"),
    Access(SPARK_GROUP, SPARK_PLURAL, APPLY, WATCHED, "the processing stage"),
    Access(SPARK_GROUP, SPARK_PLURAL, ("delete",), WATCHED,
           "spec.paused stops the Spark application (control/sparkstage.py)"),
    Access("apiextensions.k8s.io", "customresourcedefinitions", ("list",), CLUSTER,
           "the SparkApplication CRD, listed by name: is the Spark Operator one eopipe runs on "
           "(control/sparkcrd.py); Kopf's grant"),
    Access("coordination.k8s.io", "leases", ("get", "create", "update"), OWN,
           "leader election (control/leader.py)"),
)

# What no call makes but the API server checks: setting an owner reference with
# blockOwnerDeletion (clusters with OwnerReferencesPermissionEnforcement), and RBAC's escalation
# check on the Roles and RoleBindings the operator makes (one may grant only what one holds, or
# bind a role one may `bind`).
IMPLIED = (
    Access("eopipe.dev", "exactlyoncepipelines/finalizers", ("update",), WATCHED,
           "owner references with blockOwnerDeletion on every child"),
    Access("", "configmaps", ("list", "watch"), WATCHED,
           "the dedup pods' Role grants them (a watch of their assignment ConfigMap); reads only"),
    Access("rbac.authorization.k8s.io", "clusterroles", ("bind",), WATCHED,
           "the driver's RoleBinding to the chart's Spark driver ClusterRole, that one only",
           named=True),
)

# Built by a builder but created once instead of applied (an apply would rotate its token).
CREATED_NOT_APPLIED = {("", "secrets")}


def granted(scope: str) -> dict[tuple[str, str], set[str]]:
    """(group, resource) -> verbs, for one scope."""
    out: dict[tuple[str, str], set[str]] = {}
    for a in API_ACCESS:
        if a.scope == scope:
            out.setdefault((a.group, a.resource), set()).update(a.verbs)
    return out
