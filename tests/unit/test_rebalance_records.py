"""The typed records of the rebalance (core/rebalancing.py) and of the assignment's sub-documents
(core/assignment.py): `to_dict(parse(doc)) == doc` for every shape status and the assignment
ConfigMap hold (so the serialized form is the one the untyped code wrote), `parse(to_dict(r)) == r`,
and a clear ValueError for a malformed document."""

import json

import pytest

from eopipe.core.assignment import Assignment, Handoff, Reshard, ReshardEra
from eopipe.core.rebalancing import Move, Rebalance, RebalanceSummary
from tests.unit.test_rebalance_sm import SCENARIOS, Cluster, run_operator

TARGET = {"generation": 5, "assignments": {"p-dedup-0": [0, 2], "p-dedup-1": [1, 3]}, "partitionCount": 4}
SHAPES = [
    (Handoff, {"from": "p-dedup-0", "url": "http://10.0.0.1:8080"}),
    (Reshard, {"id": 5, "from": 4, "to": 8, "peers": {"p-dedup-0": "http://10.0.0.1:8080"}}),
    (Reshard, {"id": 2, "from": 4, "to": 8, "peers": {}}),
    (ReshardEra, {"id": 5, "from": 1, "to": 2, "at": 1, "offsets": {"0": 10}}),
    (ReshardEra, {"id": 3, "from": 4, "to": 8, "offsets": {"0": 10, "1": 0}}),  # no "at" (test_era_count)
    (Move, {"from": "p-dedup-0", "to": "p-dedup-1"}),
    (Move, {"from": None, "to": "p-dedup-1", "done": True, "method": "reshard-import", "keys": 7, "bytes": 70}),
    (Move, {"from": "p-dedup-0", "to": "p-dedup-1", "done": True, "method": "snapshot", "bytes": 1000,
            "pauseMs": 50}),
    # status.rebalance, phase by phase, as the state machine writes it
    (Rebalance, {"id": 2, "type": "replicas", "phase": "ScalingUp", "fromReplicas": 1, "toReplicas": 3,
                 "fromPartitions": 4, "toPartitions": 4, "startedAt": "1970-01-01T00:16:40Z",
                 "startedAtMs": 1000000, "moves": {}, "message": "scaling up: 1/3 dedup pods ready"}),
    (Rebalance, {"id": 2, "type": "replicas", "phase": "HandingOff", "fromReplicas": 1, "toReplicas": 2,
                 "fromPartitions": 4, "toPartitions": 4, "startedAt": "1970-01-01T00:16:40Z",
                 "startedAtMs": 1000000, "targetGeneration": 5,
                 "target": {**TARGET, "handoffs": {"1": {"from": "p-dedup-0", "url": "http://127.0.1.0:8080"}}},
                 "moves": {"1": {"from": "p-dedup-0", "to": "p-dedup-1", "done": True, "method": "snapshot",
                                 "bytes": 1000, "pauseMs": 50},
                           "3": {"from": "p-dedup-0", "to": "p-dedup-1"}},
                 "handoffStartedAtMs": 1001000, "message": "handing off partitions 1, 3: 1/2 done"}),
    (Rebalance, {"id": 2, "type": "partitions", "phase": "CreatingPartitions", "fromReplicas": 2, "toReplicas": 2,
                 "fromPartitions": 4, "toPartitions": 8, "startedAt": "1970-01-01T00:16:40Z",
                 "startedAtMs": 1000000, "moves": {}, "targetGeneration": 2,
                 "target": {**TARGET, "generation": 2, "paused": True,
                            "reshards": [{"id": 1, "from": 2, "to": 4, "at": 5, "offsets": {"0": 3, "1": 4}}]},
                 "offsets": {"0": 100, "1": 101, "2": 102, "3": 103}, "pausedAtMs": 1002000,
                 "message": "creating partitions 4..7"}),
    (Rebalance, {"id": 2, "type": "partitions", "phase": "Finalizing", "fromReplicas": 2, "toReplicas": 2,
                 "fromPartitions": 4, "toPartitions": 8, "moves": {"4": {"from": None, "to": "p-dedup-0", "done": True,
                                                                         "method": "none", "keys": 0, "bytes": 0}},
                 "targetGeneration": 4, "target": TARGET, "finalizingSinceMs": 9, "resumedAtMs": 9}),
    # status.lastRebalance, both types
    (RebalanceSummary, {"id": 2, "type": "replicas", "fromReplicas": 1, "toReplicas": 3, "fromPartitions": 4,
                        "toPartitions": 4, "startedAt": "1970-01-01T00:16:40Z", "finishedAt": "1970-01-01T00:16:45Z",
                        "durationSeconds": 5.0, "bytesMoved": 2000, "partitionsMoved": 2, "snapshot": 2,
                        "rebuild": 0, "maxPauseMs": 50}),
    (RebalanceSummary, {"id": 2, "type": "partitions", "fromReplicas": 2, "toReplicas": 2, "fromPartitions": 4,
                        "toPartitions": 8, "startedAt": None, "finishedAt": "1970-01-01T00:16:45Z",
                        "durationSeconds": 0.0, "bytesMoved": 70, "partitionsCreated": 4, "keysMoved": 7,
                        "pauseMs": 3000, "rebuilt": [5, 6]}),
]


@pytest.mark.parametrize("cls, doc", SHAPES, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(SHAPES)])
def test_every_shape_round_trips(cls, doc):
    record = cls.parse(json.loads(json.dumps(doc)))
    assert record.to_dict() == doc
    assert cls.parse(record.to_dict()) == record


def test_a_null_from_dropped_by_the_api_server_reads_back_the_same():
    """A merge patch stores no nulls: a move to a new partition comes back without "from"."""
    stored = {"to": "p-dedup-1", "done": True}
    assert Move.parse(stored) == Move(to="p-dedup-1", done=True)
    assert Move.parse(stored).to_dict() == {"from": None, **stored}


@pytest.mark.parametrize("doc", [
    {"generation": 5, "assignments": {"a": [0, 1]}},
    {"generation": 5, "assignments": {"a": [0], "b": [1]}, "partitionCount": 2, "paused": True,
     "handoffs": {"1": {"from": "a", "url": "http://x:8080"}},
     "reshard": {"id": 5, "from": 1, "to": 2, "peers": {"a": "u"}},
     "reshards": [{"id": 5, "from": 1, "to": 2, "at": 1, "offsets": {"0": 10}}]},
])
def test_the_assignment_and_its_typed_records(doc):
    a = Assignment.from_json(doc)
    assert a.to_json() == doc
    assert {str(p): h.to_dict() for p, h in a.handoffs.items()} == doc.get("handoffs", {})
    assert (a.reshard and a.reshard.to_dict()) == doc.get("reshard")
    assert [e.to_dict() for e in a.reshards] == doc.get("reshards", [])


@pytest.mark.parametrize("bad", [
    {"handoffs": {"x": {"from": "a", "url": "u"}}},
    {"handoffs": {"1": {"from": "a"}}},
    {"reshard": {"id": "5", "from": 1, "to": 2}},
    {"reshard": {"id": 5, "from": 1, "to": 2, "peers": ["a"]}},
    {"reshards": [{"id": 5, "from": 1, "to": 2, "offsets": {"0": "10"}}]},
])
def test_a_malformed_sub_document_makes_the_assignment_unreadable(bad):
    with pytest.raises(ValueError):
        Assignment.from_json({"generation": 5, "assignments": {"a": [0, 1]}, **bad})


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_record_the_state_machine_writes_round_trips(name):
    cluster, replicas, partitions = SCENARIOS[name]
    seen = []
    c = Cluster(**cluster)
    status, _, _ = run_operator(c, replicas, partitions, record=seen.append)
    assert len(seen) >= 2
    for doc in seen + [status["lastRebalance"]]:
        cls = RebalanceSummary if "finishedAt" in doc else Rebalance
        assert as_stored(cls.parse(doc).to_dict()) == doc


def as_stored(doc):
    """What the API server keeps of a merge patch: no null values."""
    if isinstance(doc, dict):
        return {k: as_stored(v) for k, v in doc.items() if v is not None}
    return doc


@pytest.mark.parametrize("cls, doc, says", [
    (Handoff, {"from": "a"}, "handoff.url"),
    (Reshard, {"id": True, "from": 1, "to": 2}, "reshard.id"),
    (ReshardEra, {"id": 1, "from": 1, "to": 2, "offsets": {"x": 1}}, "partition keys"),
    (Move, {"from": "a"}, "move.to"),
    (Rebalance, {"id": 1, "type": "replicas", "phase": "ScalingUp"}, "rebalance.fromReplicas"),
    (Rebalance, {"id": 1, "type": "replicas", "phase": "HandingOff", "fromReplicas": 1, "toReplicas": 2,
                 "fromPartitions": 1, "toPartitions": 1, "moves": {"0": {"to": 3}}}, "move.to"),
    (Rebalance, [], "expected an object"),
    (RebalanceSummary, {"id": 1}, "lastRebalance.type"),
])
def test_a_malformed_document_is_a_clear_error(cls, doc, says):
    with pytest.raises(ValueError, match=says):
        cls.parse(doc)
