"""spec.processing.upgradeMode: which checkpoint the driver gets (control/sparkstage.py), where a
query with an empty one starts and what Spark's refusal of a changed query says (spark_app/upgrade.py),
and the Stalled condition that names the fix (control/sparkstatus.py)."""

from __future__ import annotations

import json

import pytest

from eopipe.control import sparkstatus
from eopipe.control.builders import spark
from eopipe.control.sparkstage import checkpoint_record
from eopipe.control.sparkstatus import CONFIG_EXIT, DriverExit, judge
from eopipe.core.names import Names
from spark_app import upgrade
from spark_app.upgrade import choose_start, refusal
from tests.helpers.pipelines import example_names

# mode, query key now, status.sparkCheckpoint -> the record (generation, query)
RECORDS = [
    ("no record: generation 0 (new, or from before upgradeMode)", "keepCheckpoint", "B", None, (0, "B")),
    ("no record under fromSink: generation 0 too", "fromSink", "B", None, (0, "B")),
    ("keepCheckpoint keeps the checkpoint whatever the query (Spark judges)", "keepCheckpoint", "B",
     {"generation": 2, "query": "A"}, (2, "A")),
    ("fromSink, same query: the same checkpoint (a restart resumes)", "fromSink", "A",
     {"generation": 2, "query": "A"}, (2, "A")),
    ("fromSink, changed query: a new generation", "fromSink", "B", {"generation": 2, "query": "A"}, (3, "B")),
    ("reprocess, changed query: a new generation", "reprocess", "R", {"generation": 0, "query": "A"}, (1, "R")),
    ("a malformed record: generation 0", "fromSink", "B", {"generation": "x"}, (0, "B")),
]


@pytest.mark.parametrize("mode,key,recorded,want", [c[1:] for c in RECORDS], ids=[c[0] for c in RECORDS])
def test_checkpoint_record(mode, key, recorded, want):
    got = checkpoint_record(mode, key, recorded)
    assert (got["generation"], got["query"]) == want
    assert checkpoint_record(mode, key, got) == got  # a second pass does not move it again


def test_generation_is_a_new_location_beside_nothing_deleted():
    assert spark.checkpoint_location("/var/lib/eopipe/checkpoints/p", 0) == "/var/lib/eopipe/checkpoints/p"
    assert spark.checkpoint_location("s3a://b/cp/", 3) == "s3a://b/cp/generation-3"


def _with(names: Names, **processing) -> Names:
    spec = names.spec.model_copy(update={"processing": names.spec.processing.model_copy(update=processing)})
    return Names(names.namespace, names.pipeline, spec)


def test_the_driver_gets_the_generation_the_mode_and_reprocess_start():
    n = _with(example_names(), upgrade_mode="reprocess", reprocess_from="latest")
    conf = json.loads(spark.spark_application(n, "img", 2)["spec"]["arguments"][1])
    assert conf["checkpoint_location"].endswith("/generation-2")
    assert (conf["upgrade_mode"], conf["starting_offsets"]) == ("reprocess", "latest")
    assert "starting_offsets" not in spark.spark_config(example_names())


def test_query_key_moves_with_the_query_not_with_resources():
    proc = example_names().spec.processing
    key = proc.query_key()
    assert proc.model_copy(update={"trigger": "5s", "upgrade_mode": "fromSink"}).query_key() == key
    assert proc.model_copy(update={"sql": "SELECT key FROM events"}).query_key() != key
    assert proc.model_copy(update={"value_schema": "id STRING"}).query_key() != key
    assert proc.model_copy(update={"upgrade_mode": "reprocess"}).query_key() != key  # a reprocess is asked anew


SPARK = {
    "added": "[STREAM_FAILED] Query [id = 1] terminated with exception: "
             "[STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY] Cannot restart streaming query ...",
    "changed": "terminated with exception: [STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE] Provided value schema ...",
    "removed": "[STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA] Streaming stateful operator name ...",
    "other": "[STREAM_FAILED] terminated with exception: org.apache.kafka.common.errors.TimeoutException",
}


@pytest.mark.parametrize("case,named", [("added", "MISSING_STATE_DIRECTORY"), ("changed", "VALUE_SCHEMA"),
                                        ("removed", "NOT_MATCH_IN_STATE_METADATA"), ("other", None)])
def test_refusal_from_sparks_own_error(case, named):
    got = refusal(SPARK[case])
    if named is None:
        assert got is None
    else:
        assert got.startswith(upgrade.CHECKPOINT_REFUSED) and named in got and "upgradeMode fromSink" in got


PLACED = ({0: 20}, '{"src": {"0": 20}}')
NONE = (None, None)
# mode, markers, of them without source ranges, what they place -> offsets, refused?
STARTS = [
    ("keep: where the markers end", "keepCheckpoint", 2, 0, PLACED, PLACED[1], False),
    ("fromSink: where the markers end", "fromSink", 2, 0, PLACED, PLACED[1], False),
    ("no markers: the config's start", "fromSink", 0, 0, NONE, None, False),
    ("keep, a lost checkpoint under a stateful query's markers: refused, not a new run that writes again",
     "keepCheckpoint", 2, 2, ({}, None), None, True),
    ("keep, a lost checkpoint, a stateless query's then a stateful one's: refused", "keepCheckpoint", 3, 2,
     PLACED, None, True),
    ("keep, markers of another source topic only: a new run", "keepCheckpoint", 2, 0, ({}, None), None, False),
    ("fromSink, a stateful query's markers: refused, not a silent rewrite", "fromSink", 2, 2, ({}, None), None,
     True),
    ("fromSink, a stateless query's then a stateful one's: its end is unknown, refused", "fromSink", 3, 2,
     PLACED, None, True),
    ("reprocess: the config's start, whatever the sink holds", "reprocess", 0, 0, NONE, None, False),
]


@pytest.mark.parametrize("mode,markers,rangeless,placed,offsets,problem", [c[1:] for c in STARTS],
                         ids=[c[0] for c in STARTS])
def test_choose_start(mode, markers, rangeless, placed, offsets, problem):
    got = choose_start(mode, markers, rangeless, placed[0], placed[1], "earliest")
    assert got.offsets == offsets
    assert bool(got.problem) == problem
    if problem:  # the operator's CheckpointIncompatible path; the mode that works is named
        assert got.problem.startswith(upgrade.CHECKPOINT_REFUSED) and "upgradeMode reprocess" in got.problem
        assert ("restore the checkpoint" in got.problem) == (mode == "keepCheckpoint")


def test_refused_checkpoint_stalls_naming_the_mode_and_is_not_resubmitted():
    words = refusal(SPARK["added"])
    state = {"status": {"applicationState": {"state": "FAILED", "errorMessage": "ExitCode: 2"}}}
    v = judge(state, (DriverExit(CONFIG_EXIT, words),))
    assert v.stalled.reason == sparkstatus.INCOMPATIBLE and "upgradeMode fromSink" in v.stalled.message
    assert not v.resubmit
    lost = judge(state, (DriverExit(CONFIG_EXIT, upgrade.unknown_end("keepCheckpoint")),))
    assert lost.stalled.reason == sparkstatus.INCOMPATIBLE and not lost.resubmit
    assert "upgradeMode reprocess" in lost.stalled.message and "fromSink" not in lost.stalled.message
    other = judge(state, (DriverExit(CONFIG_EXIT, "invalid spark_app config:\n  - sql: bad"),))
    assert other.stalled.reason == "SparkFailed"
    assert sparkstatus.CHECKPOINT_REFUSED == upgrade.CHECKPOINT_REFUSED  # the two sides agree
