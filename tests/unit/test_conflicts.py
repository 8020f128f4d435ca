"""Two pipelines that would write one topic (control/conflicts.py): who yields, table-tested; and the
derived topic names that make pipelines on one source topic not collide (core/names.py)."""

from __future__ import annotations

import pytest

from eopipe.control.conflicts import Claim, claim, conflicts
from eopipe.core import names
from eopipe.core.names import Names
from eopipe.core.spec import PipelineSpec
from eopipe.dedup.config import WorkerConfig

T1, T2 = "2025-01-01T10:00:00Z", "2025-01-01T10:00:05Z"


def body(ns: str, name: str, created: str, topic: str = "events", **spec) -> dict:
    return {"metadata": {"namespace": ns, "name": name, "creationTimestamp": created},
            "spec": {"kafka": {"bootstrapServers": "k:9092"}, "source": {"topic": topic, "partitions": 4}, **spec}}


def c(ns, name, created, topic="events", **spec) -> Claim:
    return claim(body(ns, name, created, topic, **spec))


ORIGIN = {"namespace": "a", "name": "p"}
PROCESSING = {"processing": {"checkpoint": {"pvc": {}}}, "sink": {"kafka": {"topic": "out"}}}
SINK_Q = {**PROCESSING, "sink": {"kafka": {"topic": "out-q"}}}
SHARED = {**PROCESSING, "processing": {"checkpoint": {"pvc": {}}, "serviceAccount": "spark-s3"}}
SHARED_Q = {**SHARED, "sink": SINK_Q["sink"]}

CASES = [
    # (what, me, others, [(topic, my role, other, its role)])
    ("alone", c("a", "p", T2), [], []),
    ("the listing includes me", c("a", "p", T2), [c("a", "p", T2)], []),
    ("one source, two namespaces, default names", c("b", "p", T2), [c("a", "p", T1)], []),
    ("one source, one namespace, two names", c("a", "q", T2), [c("a", "p", T1)], []),
    ("my deduped is their deduped", c("b", "p", T2, topics={"deduped": "a.p.deduped"}), [c("a", "p", T1)],
     [("a.p.deduped", "deduped", "a/p", "deduped")]),
    ("the older one goes on", c("a", "p", T1), [c("b", "p", T2, topics={"deduped": "a.p.deduped"})], []),
    ("my dead-letter is their deduped", c("b", "q", T2, topics={"deadLetter": "shared"}),
     [c("a", "p", T1, topics={"deduped": "shared"})], [("shared", "dead-letter", "a/p", "deduped")]),
    ("same sink topic", c("b", "q", T2, "other", **PROCESSING), [c("a", "p", T1, **PROCESSING)],
     [("out", "sink", "a/p", "sink")]),
    ("a sink without processing writes nothing", c("b", "q", T2, sink={"kafka": {"topic": "out"}}),
     [c("a", "p", T1, **PROCESSING)], []),
    ("reading what another writes is no conflict", c("b", "q", T2, "a.p.deduped"), [c("a", "p", T1)], []),
    ("writing another's source is no conflict", c("b", "q", T2, topics={"deduped": "events"}, source={
        "topic": "raw", "partitions": 4}), [c("a", "p", T1)], []),
    ("a restored pipeline takes its origin's topics and group", c("b", "p", T2, restoreFrom=ORIGIN),
     [c("a", "p", T1)], [("a.p.deduped", "deduped", "a/p", "deduped"), ("a.p.dlq", "dead-letter", "a/p", "dead-letter"),
                         ("group:a.p.dedup", "consumer group", "a/p", "consumer group")]),
    ("topics named apart, the group is still one", c("b", "p", T2, restoreFrom=ORIGIN, topics={
        "deduped": "x", "deadLetter": "y"}), [c("a", "p", T1)],
     [("group:a.p.dedup", "consumer group", "a/p", "consumer group")]),
    ("two restores of one pipeline: the newer yields", c("c", "p", T2, restoreFrom=ORIGIN),
     [c("b", "p", T1, restoreFrom=ORIGIN)], [("a.p.deduped", "deduped", "b/p", "deduped"),
                                              ("a.p.dlq", "dead-letter", "b/p", "dead-letter"),
                                              ("group:a.p.dedup", "consumer group", "b/p", "consumer group")]),
    ("same second: namespace, then name decides", c("a", "q", T1, topics={"deduped": "x"}),
     [c("a", "p", T1, topics={"deduped": "x"})], [("x", "deduped", "a/p", "deduped")]),
    ("same second, the earlier name goes on", c("a", "p", T1, topics={"deduped": "x"}),
     [c("a", "q", T1, topics={"deduped": "x"})], []),
    ("one driver ServiceAccount named by two pipelines of a namespace", c("a", "q", T2, "other", **SHARED_Q),
     [c("a", "p", T1, **SHARED)], [("serviceaccount:a/spark-s3", "Spark driver ServiceAccount", "a/p",
                                   "Spark driver ServiceAccount")]),
    ("one ServiceAccount name in two namespaces", c("b", "q", T2, "other", **SHARED_Q), [c("a", "p", T1, **SHARED)],
     []),
    ("the operator's own ServiceAccounts never meet", c("a", "q", T2, "other", **SINK_Q),
     [c("a", "p", T1, **PROCESSING)], []),
    ("several older ones, oldest first", c("c", "r", T2, topics={"deduped": "x", "deadLetter": "y"}),
     [c("b", "q", T1, topics={"deadLetter": "y"}), c("a", "p", "2024-12-31T00:00:00Z", topics={"deduped": "x"})],
     [("x", "deduped", "a/p", "deduped"), ("y", "dead-letter", "b/q", "dead-letter")]),
]


@pytest.mark.parametrize("what, me, others, want", CASES, ids=[case[0] for case in CASES])
def test_conflicts(what, me, others, want):
    got = [(x.topic, x.role, x.other, x.other_role) for x in conflicts(me, others)]
    assert got == want


def test_the_message_names_the_other_pipeline_the_topic_and_the_way_out():
    (x,) = conflicts(c("b", "p", T2, topics={"deduped": "a.p.deduped"}), [c("a", "p", T1)])
    assert "a.p.deduped" in x.message() and "a/p" in x.message() and "spec.topics" in x.message()


def test_a_shared_group_says_so():
    x = conflicts(c("b", "p", T2, restoreFrom=ORIGIN), [c("a", "p", T1)])[-1]
    assert x.message().startswith("consumer group a.p.dedup (and its transactional ids) is also that of") \
        and "a/p" in x.message(), x.message()


def test_a_shared_driver_account_says_so():
    (x,) = conflicts(c("a", "q", T2, "other", **SHARED_Q), [c("a", "p", T1, **SHARED)])
    assert x.message().startswith("the Spark driver's ServiceAccount spark-s3 is also that of the older pipeline a/p") \
        and "spec.processing.serviceAccount" in x.message(), x.message()


def test_an_invalid_spec_claims_nothing():
    bad = body("a", "p", T1)
    bad["spec"]["source"]["partitions"] = 0
    assert claim(bad) is None


def test_default_topic_names_carry_namespace_and_pipeline():
    spec = PipelineSpec.model_validate(body("team-a", "p", T1)["spec"])
    n = Names("team-a", "payments", spec)
    assert (n.deduped_topic, n.dlq_topic) == ("team-a.payments.deduped", "team-a.payments.dlq")
    assert n.written_topics == {"deduped": "team-a.payments.deduped", "dead-letter": "team-a.payments.dlq"}
    spec = PipelineSpec.model_validate({**body("a", "p", T1)["spec"], "topics": {"deduped": "d", "deadLetter": "l"}})
    assert (Names("a", "p", spec).deduped_topic, Names("a", "p", spec).dlq_topic) == ("d", "l")


def test_the_workers_default_dead_letter_topic_is_the_operators():
    cfg = WorkerConfig(bootstrap="k", source_topic="events", output_topic="o", pipeline="payments",
                       namespace="team-a", partitions=[0])
    assert cfg.dlq_topic == names.dlq_topic("team-a", "payments") == "team-a.payments.dlq"


@pytest.mark.parametrize("topics, sink", [
    ({"deduped": "events"}, None),
    ({"deadLetter": "events"}, None),
    ({"deduped": "x", "deadLetter": "x"}, None),
    ({"deduped": "out"}, {"kafka": {"topic": "out"}}),
])
def test_a_pipeline_cannot_write_its_own_source_or_one_topic_twice(topics, sink):
    from pydantic import ValidationError

    from eopipe.core.spec import TOPICS_MESSAGE

    doc = {**body("a", "p", T1)["spec"], "topics": topics}
    if sink:
        doc["sink"] = sink
    with pytest.raises(ValidationError, match=TOPICS_MESSAGE.split(" must")[0]):
        PipelineSpec.model_validate(doc)
