"""Where the Spark sink keeps each unit's producer between batches (spark_app/sink_kafka.py)."""

import pytest

from spark_app.sink_kafka import one_slot, one_task_at_a_time, task_slots


@pytest.mark.parametrize("conf, cpus, one", [
    ({"spark.master": "local"}, 8, True),
    ({"spark.master": "local[1]"}, 8, True),
    ({"spark.master": "local[1,4]"}, 8, True),
    ({"spark.master": "local[2,4]"}, 8, False),
    ({"spark.master": "local[*]"}, 1, True),
    ({"spark.master": "local[*]"}, 2, False),
    ({"spark.master": "local[2]", "spark.task.cpus": "2"}, 8, True),
    ({"spark.master": "local-cluster[2,1,1024]"}, 8, False),
    ({"spark.master": "k8s://https://kubernetes.default.svc"}, 8, True),  # executor cores default 1
    ({"spark.master": "k8s://https://kubernetes.default.svc", "spark.executor.cores": "2"}, 8, False),
    ({"spark.master": "k8s://x", "spark.executor.cores": "2", "spark.task.cpus": "2"}, 8, True),
    ({"spark.master": "k8s://x", "spark.executor.cores": "two"}, 8, False),
    ({"spark.master": "k8s://x", "spark.task.cpus": "0"}, 8, False),
])
def test_one_task_at_a_time(conf, cpus, one):
    assert one_task_at_a_time(conf, cpus) is one


@pytest.mark.parametrize("conf, cpus, slots, one", [
    ({"spark.master": "local[1,4]"}, 8, (1, 1), True),
    ({"spark.master": "local[*]"}, 2, (2, 1), False),
    ({"spark.master": "local-cluster[2,1,1024]"}, 8, (0, None), False),
    ({"spark.master": "k8s://x", "spark.executor.instances": "1"}, 8, (1, 1), True),
    ({"spark.master": "k8s://x"}, 8, (1, 2), False),  # Spark's default: 2 executors
    ({"spark.master": "k8s://x", "spark.executor.instances": "1", "spark.executor.cores": "2"}, 8, (2, 1), False),
    ({"spark.master": "k8s://x", "spark.executor.instances": "1", "spark.dynamicAllocation.enabled": "true"},
     8, (1, None), False),
    ({"spark.master": "k8s://x", "spark.executor.instances": "one"}, 8, (0, None), False),
])
def test_the_jobs_task_slots(conf, cpus, slots, one):
    """Where the whole job has one slot the sink writes a narrow batch in one task."""
    assert task_slots(conf, cpus) == slots
    assert one_slot(conf, cpus) is one
