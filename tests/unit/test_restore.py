"""A pipeline restored into another namespace (spec.restoreFrom): the names it takes, the manifest
`eopipe restore` writes, the tenant policy's grant, and that the field never changes."""

from __future__ import annotations

import pytest

from eopipe.control import policy
from eopipe.control.builders.dedup import worker_args
from eopipe.control.builders.spark import spark_config
from eopipe.core.names import Names
from eopipe.core.spec import RESTORE_FROM_MESSAGE, PipelineSpec, immutable_changes
from eopipe.dedup.config import WorkerConfig
from eopipe.tools.restore import CannotRestore, restored

SPEC = {"kafka": {"bootstrapServers": "k:9092"}, "source": {"topic": "events", "partitions": 2}}
ORIGIN = {"namespace": "shop", "name": "payments"}
PROCESSING = {"processing": {"sql": "SELECT * FROM events", "checkpoint": {"pvc": {}}},
              "sink": {"kafka": {"topic": "out"}}}


def spec(**extra) -> PipelineSpec:
    return PipelineSpec.model_validate({**SPEC, **extra})


def test_a_restored_pipeline_takes_every_kafka_name_of_its_origin():
    own, restored_ = Names("shop", "payments", spec(**PROCESSING)), Names("dr", "pay", spec(restoreFrom=ORIGIN,
                                                                                             **PROCESSING))
    kafka = ("consumer_group", "deduped_topic", "dlq_topic", "spark_commit_topic", "written_topics")
    assert {k: getattr(restored_, k) for k in kafka} == {k: getattr(own, k) for k in kafka}
    assert restored_.identity == ("shop", "payments") and restored_.dedup == "pay-dedup"  # objects: its own
    args = worker_args(restored_)
    assert args[args.index("--namespace") + 1] == "dr" and args[args.index("--identity") + 1] == "shop/payments"
    assert "--identity" not in worker_args(own)
    conf = spark_config(restored_)
    assert (conf["namespace"], conf["pipeline"]) == ("shop", "payments")  # its transactional ids
    assert conf["sink"]["commit_topic"] == own.spark_commit_topic


@pytest.mark.parametrize("identity, group, txn", [
    (None, "dr.pay.dedup", "dr.pay.dedup.3"),
    ("shop/payments", "shop.payments.dedup", "shop.payments.dedup.3"),
])
def test_the_workers_group_and_transactional_ids_follow_its_identity(identity, group, txn):
    cfg = WorkerConfig(bootstrap="k", source_topic="events", output_topic="o", pipeline="pay", namespace="dr",
                       partitions=[0], identity=identity)
    assert (cfg.group_id, cfg.transactional_id(3)) == (group, txn)


@pytest.mark.parametrize("identity", ["shop", "shop/", "/p", "Shop/p", "a/b/c"])
def test_a_malformed_identity_is_refused(identity):
    with pytest.raises(ValueError, match="NAMESPACE/PIPELINE"):
        WorkerConfig(bootstrap="k", source_topic="e", output_topic="o", pipeline="p", partitions=[0],
                     identity=identity)


GRANT = policy.parse({"restores": [{"from": "shop", "to": "shop-dr-*"}]})
REFUSED = ("spec.restoreFrom: continuing a pipeline of namespace shop in {ns} is not allowed by the tenant "
           "policy (tenantPolicy.restores)")


@pytest.mark.parametrize("namespace, origin, tenant, refused", [
    ("shop-dr-1", None, policy.TenantPolicy(), False),
    ("shop", ORIGIN, policy.TenantPolicy(), False),  # within its namespace: no grant needed
    ("other", ORIGIN, policy.TenantPolicy(), True),
    ("shop-dr-1", ORIGIN, policy.TenantPolicy(), True),
    ("shop-dr-1", ORIGIN, GRANT, False),
    ("other", ORIGIN, GRANT, True),
    ("shop-dr-1", {"namespace": "shops", "name": "p"}, GRANT, True),
    (None, ORIGIN, policy.TenantPolicy(), False),  # offline, no namespace: not judged
])
def test_restoring_across_namespaces_needs_the_admins_grant(namespace, origin, tenant, refused):
    s = spec(**({"restoreFrom": origin} if origin else {}))
    got = policy.refusals(s, tenant, namespace=namespace)
    assert got == ([REFUSED.format(ns=namespace).replace("shop in", f"{origin['namespace']} in")] if refused else [])


@pytest.mark.parametrize("old, new", [(None, ORIGIN), (ORIGIN, None), (ORIGIN, {**ORIGIN, "name": "p2"})])
def test_restore_from_never_changes(old, new):
    def s(origin):
        return spec(**({"restoreFrom": origin} if origin else {}))
    assert immutable_changes(s(old), s(new)) == [RESTORE_FROM_MESSAGE]
    assert immutable_changes(s(old), s(old)) == []


def doc(namespace: str | None = "shop", **extra) -> dict:
    meta = {"name": "payments", "uid": "u", "resourceVersion": "7",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "a",
                            "kopf.zalando.org/last-handled-configuration": "{}"}}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "eopipe.dev/v1beta1", "kind": "ExactlyOncePipeline", "metadata": meta,
            "spec": {**SPEC, **extra}, "status": {"phase": "Running"}}


@pytest.mark.parametrize("what, given, args, origin, meta", [
    ("as kubectl prints it", doc(), ("shop-dr",), ORIGIN,
     {"name": "payments", "namespace": "shop-dr", "annotations": {"team": "a"}}),
    ("as written, its namespace given", doc(None), ("shop-dr", "shop"), ORIGIN,
     {"name": "payments", "namespace": "shop-dr", "annotations": {"team": "a"}}),
    ("renamed in its own namespace", doc(), ("shop", None, "payments-2"), ORIGIN,
     {"name": "payments-2", "namespace": "shop", "annotations": {"team": "a"}}),
    ("a restored one again: the first origin", doc("shop-dr", restoreFrom=ORIGIN), ("shop-dr-2",), ORIGIN,
     {"name": "payments", "namespace": "shop-dr-2", "annotations": {"team": "a"}}),
    ("back where it first ran: its own names", doc("shop-dr", restoreFrom=ORIGIN), ("shop",), None,
     {"name": "payments", "namespace": "shop", "annotations": {"team": "a"}}),
])
def test_eopipe_restore_writes_the_continuing_manifest(what, given, args, origin, meta):
    out = restored(given, *args)
    assert out["metadata"] == meta and out["spec"].get("restoreFrom") == origin
    assert "status" not in out and {k: v for k, v in out["spec"].items() if k != "restoreFrom"} == SPEC
    PipelineSpec.model_validate(out["spec"])


@pytest.mark.parametrize("what, given, args, says", [
    ("no namespace anywhere", doc(None), ("dr",), "--from-namespace"),
    ("onto itself", doc(), ("shop",), "the pipeline itself"),
    ("not a pipeline", {"kind": "Secret"}, ("dr",), "not an ExactlyOncePipeline"),
    ("invalid", doc(source={"topic": "events", "partitions": 0}), ("dr",), "not valid"),
])
def test_eopipe_restore_refuses_what_it_cannot_continue(what, given, args, says):
    with pytest.raises(CannotRestore, match=says):
        restored(given, *args)
