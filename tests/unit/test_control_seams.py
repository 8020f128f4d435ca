"""The control plane's seams: one function writes status; the stages name their conditions
from status.STAGES; a pass makes at most one Kafka admin client and lets it go; the facts a
step observed cannot be overwritten by a decision."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from eopipe.control.passctx import Outcome, Pass
from eopipe.core.rebalancing import Facts

CONTROL = Path(__file__).resolve().parents[2] / "operator" / "eopipe"


def test_exactly_one_function_patches_status():
    calls = [(p.relative_to(CONTROL).as_posix(), n) for p in sorted(CONTROL.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if "patch_namespaced_custom_object_status" in line]
    assert [f for f, _ in calls] == ["control/recorder.py"], calls


# The modules of the reconcile pass; sparkstage/sparkstatus (the Spark stage's pure decisions)
# build their own ProcessingReady conditions.
PASS_MODULES = ("reconcile", "handlers", "stage_dedup", "stage_topics", "stage_health", "stage_spark", "passctx")


@pytest.mark.parametrize("module", PASS_MODULES)
def test_the_pass_names_condition_types_from_the_one_table(module):
    text = (CONTROL / "control" / f"{module}.py").read_text()
    literals = re.findall(r'"(TopicsReady|DedupReady|ProcessingReady|Ready|Reconciling|Stalled)"', text)
    assert literals == [], f"control/{module}.py: use status.TOPICS/DEDUP/PROCESSING/READY/RECONCILING/STALLED"


class CountingObserver:
    def __init__(self):
        self.made = 0

    def kafka_admin(self, names):
        self.made += 1
        return object()


def test_a_pass_makes_one_admin_client_on_first_use_and_lets_it_go():
    observer = CountingObserver()
    plane = type("Plane", (), {"observer": observer})()
    p = Pass(plane, names=None, body={"metadata": {}}, out=Outcome())
    assert observer.made == 0  # a pass that never talks to Kafka never connects
    first = p.admin
    assert p.admin is first and p.admin is first and observer.made == 1
    p.close()
    assert p._admin is None


def test_observed_facts_cannot_be_overwritten():
    facts = Facts(now_ms=1, pod_prefix="p-dedup", replicas=2, partitions=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.replicas = 3
    wanted = dataclasses.replace(facts, replicas=3)  # a decision: a new value beside the observation
    assert (facts.replicas, wanted.replicas) == (2, 3)
