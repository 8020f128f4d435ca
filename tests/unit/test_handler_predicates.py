"""Which pipelines the operator's fast timers step: pure predicates over status and spec."""

import pytest

from eopipe.control.handlers import _autoscaling, _node_waiting, _progressing

RECONCILING = {"type": "Reconciling", "status": "True"}
SETTLED = {"type": "Reconciling", "status": "False"}


@pytest.mark.parametrize("status, expected", [
    (None, False),
    ({}, False),
    ({"phase": "Running", "conditions": [SETTLED]}, False),
    ({"phase": "Provisioning", "conditions": [RECONCILING]}, True),   # pods starting
    ({"phase": "Rebalancing", "rebalance": {"id": 3}, "conditions": [SETTLED]}, True),
    ({"phase": "Degraded", "conditions": [SETTLED]}, False),          # a failure waits for the resync
    ({"conditions": [{"type": "Ready", "status": "True"}]}, False),
    # a dedup pod's node NotReady: its threshold is seconds away, not a resync
    ({"phase": "Degraded", "conditions": [SETTLED, {"type": "DedupReady", "status": "False",
                                                    "reason": "NodeNotReady"}]}, True),
    ({"conditions": [{"type": "DedupReady", "status": "False", "reason": "NodeLost"}]}, True),
    ({"conditions": [{"type": "DedupReady", "status": "False", "reason": "NodeDrained"}]}, True),
    ({"conditions": [{"type": "DedupReady", "status": "False", "reason": "PodsNotReady"}]}, False),
])
def test_progressing(status, expected):
    assert _progressing(status) is expected


@pytest.mark.parametrize("spec, expected", [
    (None, False),
    ({"dedup": {}}, False),
    ({"dedup": {"autoscale": {"maxReplicas": 4}}}, True),
    ({"dedup": {"autoscale": {"enabled": False}}}, False),
])
def test_autoscaling(spec, expected):
    assert _autoscaling(spec) is expected


@pytest.mark.parametrize("status, expected", [
    (None, False),
    ({"conditions": [SETTLED]}, False),
    ({"conditions": [SETTLED, {"type": "DedupReady", "status": "False", "reason": "NodeNotReady"}]}, True),
    ({"conditions": [{"type": "DedupReady", "status": "False", "reason": "NodeLost"}]}, False),  # acted on
    ({"conditions": [{"type": "Ready", "status": "False", "reason": "NodeNotReady"}]}, False),
])
def test_node_waiting(status, expected):
    """Stepped every 2 s while a node's threshold runs: the move comes at the threshold."""
    assert _node_waiting(status) is expected
