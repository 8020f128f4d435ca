"""The health checks on a running dedup stage, after it is applied: a hanging transaction on
the output or the source, and a lag above spec.dedup.lagThreshold for its window. Each returns
the DedupReady condition that replaces the stage's own (a failure reason: phase Degraded), or None."""

from __future__ import annotations

import time

from confluent_kafka import KafkaException

from eopipe.control.passctx import Pass
from eopipe.control.status import DEDUP, TOPICS, Condition, lag_alert, open_transactions
from eopipe.core.durations import duration_ms, format_duration


def transactions(p: Pass) -> Condition | None:
    """Open transactions on the output and on the source (the workers' reroutes, the
    producers' own): a hanging one holds every read_committed reader, the dedup stage included."""
    names, out = p.names, p.out
    if not out.ready(TOPICS):
        return None
    now_ms = int(time.time() * 1000)
    hung = []
    for key, topic in (("transactions", names.deduped_topic), ("sourceTransactions", names.source_topic)):
        try:
            offsets = p.plane.observer.stable_offsets(p.admin, topic)
        except KafkaException:
            return None  # Kafka trouble is the topics stage's to report
        record, hanging = open_transactions(p.status.get(key), offsets, now_ms,
                                            int(p.plane.settings.hanging_transaction_seconds * 1000))
        out.fields[key] = record
        hung += [(topic, q, record[str(q)]) for q in hanging]
    if not hung:
        return None
    topic, q, txn = hung[0]
    lso, since = txn["lastStableOffset"], txn["sinceMs"]
    msg = (f"{topic} partition {q}{f' (and {len(hung) - 1} more)' if len(hung) > 1 else ''}: a "
           f"transaction open at offset {lso} for {(now_ms - since) // 1000}s holds every read_committed "
           f"reader; find it with `kafka-transactions.sh --bootstrap-server <kafka> find-hanging "
           f"--broker-id <leader of {topic}-{q}>` and abort it with `kafka-transactions.sh "
           f"--bootstrap-server <kafka> abort --topic {topic} --partition {q} --start-offset {lso}`")
    return Condition(DEDUP, False, "HangingTransaction", msg)


def lag_threshold(p: Pass) -> Condition | None:
    """spec.dedup.lagThreshold: lag above it for lagThresholdWindow is Degraded (LagGrowing)."""
    dedup, out = p.names.spec.dedup, p.out
    lag = out.fields.get("lag")
    was = p.status.get("lag") or {}
    now_ms = int(time.time() * 1000)
    since, degraded = lag_alert(was.get("aboveThresholdSinceMs"), (lag or {}).get("dedup"), now_ms,
                                dedup.lag_threshold, duration_ms(dedup.lag_threshold_window))
    if lag is not None and since is not None:
        lag["aboveThresholdSinceMs"] = since
    if not (degraded and out.ready(DEDUP)):
        return None
    msg = (f"the dedup lag has stayed above spec.dedup.lagThreshold ({dedup.lag_threshold} records) for "
           f"{format_duration((now_ms - since) / 1000)}: the dedup pods do not keep up "
           "(add replicas or spec.dedup.autoscale) or cannot commit (see their logs)")
    return Condition(DEDUP, False, "LagGrowing", msg)
