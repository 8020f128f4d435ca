"""Topic ownership and adoption (control/topics.py): the pure plan, table-tested, and the order in
which ensure_topics records ownership around a fake AdminClient."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException

from eopipe.control import topics
from eopipe.control.builders.topics import TopicSpec, desired_topics
from eopipe.control.topics import Existing, plan
from tests.helpers.pipelines import example_names

H = 3600 * 1000
WINDOW = 24 * H
SRC = TopicSpec("events", 4, 1, {"min.insync.replicas": "1", "retention.ms": str(168 * H)}, "source")
DEDUPED = TopicSpec("ns.p.deduped", 4, 1, {"min.insync.replicas": "1", "retention.ms": str(168 * H)}, "deduped")
DLQ = TopicSpec("ns.p.dlq", 1, 1, {"min.insync.replicas": "1", "retention.ms": str(168 * H)}, "dead-letter")
COMMITS = TopicSpec("eopipe.ns.p.spark-commits", 1, 1, {"cleanup.policy": "compact"}, "spark-commits")
DESIRED = [SRC, DEDUPED, DLQ]


def producers_source(partitions=4, **config) -> Existing:
    """A source topic made by its producers' team, with configs of their own."""
    return Existing(partitions, {"retention.ms": str(72 * H), "min.insync.replicas": "2",
                                 "cleanup.policy": "delete", **config})


def as_desired(t: TopicSpec, partitions=None) -> Existing:
    return Existing(partitions or t.partitions, dict(t.config))


def test_a_new_pipeline_creates_everything_and_owns_nothing_yet():
    p = plan(DESIRED, {}, (), window_ms=WINDOW)
    assert [t.name for t in p.create] == ["events", "ns.p.deduped", "ns.p.dlq"]
    # Ownership comes from a create call that succeeded (ensure_topics), never from the plan.
    assert p.owned == [] and p.adopted == [] and not (p.grow or p.set_configs or p.mismatches or p.refused)


def test_an_existing_source_is_adopted_and_never_altered():
    p = plan(DESIRED, {"events": producers_source()}, (), window_ms=WINDOW)
    assert [t.name for t in p.create] == ["ns.p.deduped", "ns.p.dlq"]
    assert p.adopted == ["events"] and p.owned == []
    # Its retention.ms and min.insync.replicas differ from what eopipe would set: left as they are.
    assert "events" not in p.set_configs and "events" not in p.grow and not p.mismatches


def test_owned_topics_keep_drift_reverted_and_grow():
    existing = {"events": Existing(4, {**SRC.config, "retention.ms": "1000"}),
                "ns.p.deduped": as_desired(DEDUPED, partitions=2), "ns.p.dlq": as_desired(DLQ)}
    p = plan(DESIRED, existing, ["events", "ns.p.deduped", "ns.p.dlq"], window_ms=WINDOW)
    assert p.set_configs == {"events": {"retention.ms": str(168 * H)}}
    assert p.grow == {"ns.p.deduped": (2, 4)}
    assert p.owned == ["events", "ns.p.deduped", "ns.p.dlq"] and not p.create and not p.adopted


def test_an_owned_topic_deleted_by_hand_is_created_again():
    p = plan(DESIRED, {"events": as_desired(SRC), "ns.p.deduped": as_desired(DEDUPED)},
             ["events", "ns.p.deduped", "ns.p.dlq"], window_ms=WINDOW)
    assert [t.name for t in p.create] == ["ns.p.dlq"]
    assert p.owned == ["events", "ns.p.deduped", "ns.p.dlq"]


@pytest.mark.parametrize("topic, have, problem, fix", [
    # (which desired topic, what Kafka has, what the message says, the command it gives)
    (SRC, producers_source(**{"retention.ms": str(H)}), "shorter than the dedup window",
     "kafka-configs.sh --bootstrap-server k:9092 --alter --entity-type topics --entity-name events "
     f"--add-config retention.ms={168 * H}"),
    (SRC, producers_source(**{"cleanup.policy": "compact"}), "cleanup.policy=compact",
     "--entity-name events --add-config cleanup.policy=delete"),
    (SRC, producers_source(**{"cleanup.policy": "compact,delete"}), "cleanup.policy=compact,delete",
     "--add-config cleanup.policy=delete"),
    (SRC, producers_source(partitions=2), "2 partitions, the pipeline needs 4",
     "kafka-topics.sh --bootstrap-server k:9092 --alter --topic events --partitions 4"),
    (DEDUPED, Existing(3, {"cleanup.policy": "delete"}), "3 partitions, the pipeline needs 4", "--partitions 4"),
    (COMMITS, Existing(1, {"cleanup.policy": "delete"}), "must be kept by compaction",
     "--add-config cleanup.policy=compact"),
])
def test_an_adopted_topic_that_does_not_fit_is_reported_with_the_fix_not_changed(topic, have, problem, fix):
    p = plan([topic], {topic.name: have}, (), window_ms=WINDOW, bootstrap="k:9092")
    assert p.adopted == [topic.name] and not (p.create or p.grow or p.set_configs or p.refused)
    (m,) = p.mismatches
    assert m.topic == topic.name and problem in m.problem and fix in m.fix, m
    assert "Strimzi: KafkaTopic" in m.fix and "not created by eopipe" in m.message()
    assert m.partitions == ("partitions" in problem)


@pytest.mark.parametrize("retention", ["-1", str(WINDOW), str(168 * H)])
def test_an_adopted_source_whose_retention_covers_the_window_fits(retention):
    p = plan([SRC], {"events": producers_source(**{"retention.ms": retention})}, (), window_ms=WINDOW)
    assert not p.mismatches and p.adopted == ["events"]


def test_growing_an_adopted_source_is_refused_with_the_command():
    """spec.source.partitions 4 -> 6 on a topic eopipe did not create: the operator asks for it."""
    grown = [TopicSpec("events", 6, 1, SRC.config, "source"), TopicSpec("ns.p.deduped", 6, 1, DEDUPED.config,
                                                                         "deduped")]
    p = plan(grown, {"events": producers_source(), "ns.p.deduped": as_desired(DEDUPED)}, ["ns.p.deduped"],
             window_ms=WINDOW, bootstrap="k:9092")
    assert p.grow == {"ns.p.deduped": (4, 6)}  # its own topic it grows
    (m,) = p.mismatches
    assert m.partitions and "--alter --topic events --partitions 6" in m.fix


def test_fewer_partitions_than_the_topic_has_is_refused_owned_or_not():
    for owned in ((), ["events"]):
        p = plan([SRC], {"events": producers_source(partitions=8)}, owned, window_ms=WINDOW)
        assert "cannot remove partitions" in p.refused["events"] and not p.mismatches and not p.set_configs


def test_a_topic_no_longer_desired_is_released_not_owned():
    p = plan([SRC], {"events": as_desired(SRC)}, ["events", "old-sink"], window_ms=WINDOW)
    assert p.owned == ["events"] and p.released == ["old-sink"]


def test_the_payments_example_with_everything_adopted_fits():
    desired = desired_topics(example_names())
    existing = {t.name: as_desired(t) for t in desired}
    p = plan(desired, existing, (), window_ms=WINDOW)
    assert sorted(p.adopted) == sorted(t.name for t in desired) and not p.mismatches


# -- ensure_topics: ownership is recorded from create calls that succeeded, before anything else --
def _done(value=None, error=None) -> Future:
    f = Future()
    f.set_exception(error) if error is not None else f.set_result(value)
    return f


class _Partition:
    replicas = [1]


class _Topic:
    def __init__(self, n):
        self.partitions = {i: _Partition() for i in range(n)}


class FakeAdmin:
    """The AdminClient calls ensure_topics makes, against an in-memory cluster."""

    def __init__(self, topics: dict[str, Existing], create_errors: dict[str, KafkaError] | None = None):
        self.topics, self.create_errors, self.calls = dict(topics), create_errors or {}, []

    def list_topics(self, timeout=None):
        md = type("Md", (), {})()
        md.topics = {n: _Topic(t.partitions) for n, t in self.topics.items()}
        md.brokers = {1: None}
        return md

    def describe_configs(self, resources, request_timeout=None):
        entry = type("Entry", (), {})
        out = {}
        for r in resources:
            cfg = {}
            for k, v in self.topics[r.name].config.items():
                cfg[k] = entry()
                cfg[k].value = v
            out[r] = _done(cfg)
        return out

    def create_topics(self, new, operation_timeout=None):
        self.calls.append(("create", [t.topic for t in new]))
        out = {}
        for t in new:
            err = self.create_errors.get(t.topic)
            if err is None:
                self.topics[t.topic] = Existing(t.num_partitions, dict(t.config))
            out[t.topic] = _done(error=KafkaException(err) if err is not None else None)
        return out

    def create_partitions(self, new, operation_timeout=None):
        self.calls.append(("grow", [p.topic for p in new]))
        return {p.topic: _done() for p in new}

    def incremental_alter_configs(self, resources):
        self.calls.append(("alter", [r.name for r in resources]))
        return {r: _done() for r in resources}


def test_ownership_is_recorded_only_for_topics_whose_create_call_succeeded():
    """Someone else creating a topic between our look and our create (TOPIC_ALREADY_EXISTS), or
    a create that fails: not ours. What did succeed is recorded before the error is raised."""
    admin = FakeAdmin({}, {"ns.p.deduped": KafkaError(KafkaError.TOPIC_ALREADY_EXISTS),
                           "ns.p.dlq": KafkaError(KafkaError.POLICY_VIOLATION)})
    recorded = []
    with pytest.raises(KafkaException):
        topics.ensure_topics(admin, DESIRED, (), window_ms=WINDOW, record_owned=recorded.append)
    assert recorded == [["events"]]


def test_taken_topics_are_adopted_and_nothing_is_altered_after_a_record():
    admin = FakeAdmin({}, {"ns.p.deduped": KafkaError(KafkaError.TOPIC_ALREADY_EXISTS)})
    recorded = []
    report = topics.ensure_topics(admin, DESIRED, (), window_ms=WINDOW, record_owned=recorded.append)
    assert report.created == ["events", "ns.p.dlq"] and report.adopted == ["ns.p.deduped"]
    assert recorded == [["events", "ns.p.dlq"]] and report.owned == ["events", "ns.p.dlq"]


def test_a_restarted_operator_adopts_what_it_cannot_prove_it_created():
    """The operator created a topic but died before recording it: the next pass finds it
    existing and not recorded, so it is adopted (checked, never altered or deleted)."""
    admin = FakeAdmin({"ns.p.deduped": Existing(4, {"retention.ms": "1000"})})
    report = topics.ensure_topics(admin, [DEDUPED], [], window_ms=WINDOW, record_owned=pytest.fail)
    assert report.adopted == ["ns.p.deduped"] and report.owned == [] and admin.calls == []


def test_owned_topics_stay_owned_and_drift_is_reverted():
    admin = FakeAdmin({"events": Existing(4, {**SRC.config, "retention.ms": "1000"}),
                       "ns.p.deduped": producers_source()})
    report = topics.ensure_topics(admin, [SRC, DEDUPED], ["events"], window_ms=WINDOW, record_owned=pytest.fail)
    assert admin.calls == [("alter", ["events"])] and report.configs_set == {"events": {"retention.ms": str(168 * H)}}
    assert report.owned == ["events"] and report.adopted == ["ns.p.deduped"]


# -- replication: an unset factor follows the broker count; an explicit one wins --
@pytest.mark.parametrize("brokers, explicit, factor, min_insync, warned", [
    (1, None, 1, 1, True),
    (2, None, 2, 1, True),
    (3, None, 3, 2, False),
    (7, None, 3, 2, False),
    (0, None, 1, 1, True),   # no broker in the metadata: Kafka's create call says why
    (1, 1, 1, 1, False),     # explicit: no warning, whatever the cluster
    (7, 1, 1, 1, False),
    (3, 2, 2, 2, False),
    (5, 5, 5, 2, False),
    (1, 3, 3, 2, False),     # above the broker count: Kafka refuses the create call, as before
])
def test_replication_from_the_broker_count(brokers, explicit, factor, min_insync, warned):
    r = topics.replication(brokers, explicit)
    assert (r.factor, r.min_insync, r.warning is not None) == (factor, min_insync, warned)


UNSET = [TopicSpec("events", 4, None, {"retention.ms": "1"}, "source"),
         TopicSpec("ns.p.dlq", 1, None, {"retention.ms": "1"}, "dead-letter")]


@pytest.mark.parametrize("brokers, factor, min_insync, warning", [
    (3, 3, "2", None),
    (1, 1, "1", "the cluster has 1 broker: topics get replication 1 and min.insync.replicas 1 (3 and 2 need 3 "
                "brokers), so losing a broker can lose records; set source.replicationFactor to choose "
                "(events, ns.p.dlq)"),
    (2, 2, "1", "the cluster has 2 brokers"),
])
def test_topics_without_a_factor_are_created_as_the_brokers_allow(brokers, factor, min_insync, warning):
    p = plan(UNSET, {}, (), window_ms=WINDOW, brokers=brokers)
    assert [(t.replication_factor, t.config["min.insync.replicas"]) for t in p.create] == [(factor, min_insync)] * 2
    assert [w.message for w in p.warnings if warning and w.message.startswith(warning)] == \
        [w.message for w in p.warnings]
    assert bool(p.warnings) == bool(warning) and all(w.reason == "LowReplication" for w in p.warnings)


@pytest.mark.parametrize("brokers, replicas, owned, warned", [
    (1, 1, True, ["events", "ns.p.dlq"]),   # ours, as few as one broker allows: said again every pass
    (2, 2, True, ["events", "ns.p.dlq"]),
    (3, 3, True, []),                       # safe now
    (1, 1, False, []),                      # adopted topics are their owners' to replicate
])
def test_the_low_replication_warning_stays_while_it_is_true(brokers, replicas, owned, warned):
    have = {t.name: Existing(t.partitions, {"retention.ms": "1", "min.insync.replicas": "1"}, replicas)
            for t in UNSET}
    p = plan(UNSET, have, [t.name for t in UNSET] if owned else (), window_ms=WINDOW, brokers=brokers)
    assert not p.create
    named = [w.message.rsplit("(", 1)[-1].rstrip(")").split(", ") for w in p.warnings if "cluster has" in w.message]
    assert named == ([warned] if warned else [])


def test_an_explicit_factor_wins_and_the_source_config_keeps_its_min_insync():
    src = TopicSpec("events", 4, 1, {"min.insync.replicas": "1", "retention.ms": "1"}, "source")
    dlq = TopicSpec("ns.p.dlq", 1, 2, {"retention.ms": "1"}, "dead-letter")
    p = plan([src, dlq], {}, (), window_ms=WINDOW, brokers=5)
    assert [(t.replication_factor, t.config["min.insync.replicas"]) for t in p.create] == [(1, "1"), (2, "2")]
    assert not p.warnings
    mine = TopicSpec("events", 4, None, {"min.insync.replicas": "1", "retention.ms": "1"}, "source")
    (t,) = plan([mine], {}, (), window_ms=WINDOW, brokers=3).create
    assert (t.replication_factor, t.config["min.insync.replicas"]) == (3, "1")


@pytest.mark.parametrize("replicas, min_insync, warned", [(1, "1", True), (2, "1", True), (3, "2", False)])
def test_an_owned_topic_keeps_its_replicas_and_gets_the_min_insync_they_allow(replicas, min_insync, warned):
    """A topic created before (the old default: 1 replica) on what is now a 3-broker cluster: never
    a min.insync.replicas above what its replicas can meet (writes would fail), and a warning."""
    have = Existing(4, {"retention.ms": "1", "min.insync.replicas": "1"}, replication=replicas)
    p = plan(UNSET[:1], {"events": have}, ["events"], window_ms=WINDOW, brokers=3)
    assert p.set_configs.get("events", {}).get("min.insync.replicas", "1") == min_insync
    assert bool(p.warnings) == warned
    if warned:
        assert "topic events has replication" in p.warnings[0].message and "kafka-reassign" in p.warnings[0].message
