"""The topics stage: the pipeline's topics ensured in Kafka (control/topics.py does the I/O),
reported as the TopicsReady condition. The topics the operator creates are recorded in
status.ownedTopics the moment it creates them: only those are ever altered or deleted."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException
from kubernetes import client

from eopipe.control.builders.topics import desired_topics
from eopipe.control.passctx import Pass, first_error
from eopipe.control.status import STALLED, TOPICS, Condition
from eopipe.control.topics import ensure_topics
from eopipe.core.durations import duration_ms
from eopipe.core.kafkaconf import NotAllowed
from eopipe.core.names import Names

log = logging.getLogger(__name__)

# Kafka (or the connection's Secrets) out of reach: the stage reports it and the pass is retried.
KAFKA_ERRORS = (KafkaException, KeyError, NotAllowed, client.ApiException)


def kafka_unavailable(why: str) -> Condition:
    return Condition(TOPICS, False, "KafkaUnavailable", why)


def run(p: Pass, names: Names) -> tuple[bool, list[Condition]]:
    """Ensures the topics of `names` (the spec as the rebalance wants it: its partition count).
    Returns whether the dedup stage may go on, and the TopicsReady condition; a topic Kafka
    cannot have (a partition decrease) stalls the pipeline."""
    out = p.out
    owned = out.fields.get("ownedTopics")
    if owned is None:  # first step of the pass: what earlier passes recorded (else nothing)
        recorded = p.status.get("ownedTopics")
        owned = [t for t in recorded if isinstance(t, str)] if isinstance(recorded, list) else []

    def record(now: list[str]) -> None:
        # Written at once, as the rebalance record is: a later failure in this pass must not
        # lose the fact that these topics are ours.
        out.fields["ownedTopics"] = now
        try:
            p.record({"ownedTopics": now})
        except client.ApiException as e:
            log.warning("could not record owned topics %s yet (written with the status): %s", now, e)
    try:
        report = ensure_topics(p.admin, desired_topics(names), owned,
                               window_ms=duration_ms(names.spec.dedup.window),
                               bootstrap=names.spec.kafka.bootstrap_servers,
                               timeout=p.plane.kafka_timeout, record_owned=record)
    except KAFKA_ERRORS as e:
        out.retry = True
        return False, [kafka_unavailable(first_error(e))]
    out.fields["ownedTopics"] = report.owned
    if report.refused:
        name, why = next(iter(report.refused.items()))
        out.stalled = Condition(STALLED, True, "NotSupported", f"topic {name}: {why}")
        return False, [Condition(TOPICS, False, "NotSupported", why)]
    changes = []
    if report.created:
        changes.append(f"created {', '.join(report.created)}")
    for t, (a, b) in report.partitions_added.items():
        changes.append(f"{t} partitions {a} -> {b}")
    for t, cfg in report.configs_set.items():
        changes.append(f"{t} config set {', '.join(sorted(cfg))}")
    for t in report.released:
        changes.append(f"released {t} (no longer used by the pipeline; kept in Kafka)")
    out.fields["topicChanges"] = changes
    if report.mismatches:
        # Adopted topics are the producers' (or Strimzi's): reported with the fix, never changed.
        return (not any(m.partitions for m in report.mismatches),
                [Condition(TOPICS, False, "AdoptedTopicMismatch", "; ".join(m.message() for m in report.mismatches))])
    adopted = f" (adopted, checked only: {', '.join(report.adopted)})" if report.adopted else ""
    done = ("; ".join(changes) or "all topics as specified") + adopted
    if report.warnings:  # e.g. LowReplication: the topics are usable, TopicsReady stays True
        said = "; ".join([*(w.message for w in report.warnings), done])
        return True, [Condition(TOPICS, True, report.warnings[0].reason, said)]
    return True, [Condition(TOPICS, True, "TopicsReconciled", done)]

