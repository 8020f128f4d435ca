"""A changed query and its checkpoint (spec.processing.upgradeMode; docs/upgrades.md). Pure.

Whether a checkpoint can serve a changed query is Spark's own judgement: when it plans the first
batch on an existing checkpoint, Spark 4 compares the plan's stateful operators with the state
metadata in the checkpoint (state/<op>/_metadata, the state schema files) and raises an error of
its own class before any row reaches the sink: an operator added (no state directory for it),
removed or replaced (not the operator in the metadata), an aggregate's key or value changed
(schema not compatible). A stateless change (another projection, filter or schema field) passes
and goes on from the checkpoint's offsets; the sink's markers make the replayed batch exact.
`refusal` turns those errors into the driver's reason (exit 2, the termination message), which
the operator shows as a Stalled condition naming the mode that would run the query.

Without a usable checkpoint (lost, or a new generation the operator chose), `choose_start` says
where the query starts: keepCheckpoint and fromSink where the sink's markers prove its output
ends (sink_position.py); reprocess at startingOffsets, whatever the sink holds. A stateful
query's markers name no source ranges (its units are shuffle partitions), so over a sink one
wrote to, where the output ends is unknown: keepCheckpoint (a lost checkpoint) and fromSink
refuse to start, the same way as Spark's refusal above (exit 2, CHECKPOINT_REFUSED), rather
than write again from startingOffsets what the sink holds; reprocess is the explicit choice.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

CHECKPOINT_REFUSED = "checkpoint refused:"  # operator/eopipe/control/sparkstatus.py looks for it
# Spark's error classes for a checkpoint whose state cannot serve the plan, and what they mean.
STATE_ERRORS = {
    "STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY":
        "the query has a stateful operator the checkpoint holds no state for (an aggregate, window, "
        "deduplication or join added)",
    "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA":
        "the query's stateful operators are not those of the checkpoint's state metadata (one removed or replaced)",
    "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE": "a stateful operator's key (grouping) changed",
    "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE": "a stateful operator's value (its aggregates) changed",
    "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION": "a stateful operator's value changed in a way state cannot evolve",
}
_CLASS = re.compile(r"\[(" + "|".join(STATE_ERRORS) + r")\]")


def refusal(error: str) -> str | None:
    """The driver's reason when Spark refused the checkpoint for the changed query, else None."""
    m = _CLASS.search(error or "")
    if m is None:
        return None
    return (f"{CHECKPOINT_REFUSED} Spark cannot run the changed query on this checkpoint's state "
            f"({m.group(1)}: {STATE_ERRORS[m.group(1)]}); nothing of it was written. Set "
            "spec.processing.upgradeMode fromSink to start a new checkpoint where the sink's output ends "
            "(its stateful operators start empty), or undo the change")


class CheckpointRefused(Exception):
    """Do not start: the reason (it starts with CHECKPOINT_REFUSED) for the termination log, exit 2."""


def unknown_end(mode: str) -> str:
    """The reason a query without a checkpoint does not start over a stateful query's markers."""
    why = ("the checkpoint is empty (lost: its claim or directory deleted)" if mode == "keepCheckpoint"
           else f"upgradeMode {mode} starts a new checkpoint")
    return (f"{CHECKPOINT_REFUSED} {why}, and a stateful query wrote to the sink: its markers name no source "
            "ranges, so where its output ends is unknown, and a new run from startingOffsets would write again "
            "what the sink holds; nothing was written. Set spec.processing.upgradeMode reprocess to start over "
            "from reprocessFrom knowingly (its stateful operators start empty)"
            + (", or restore the checkpoint" if mode == "keepCheckpoint" else ""))


@dataclass(frozen=True)
class Start:
    offsets: str | None   # startingOffsets JSON; None: the config's startingOffsets
    note: str             # for the log
    problem: str | None = None  # set: do not start (exit 2, the reason: CheckpointRefused)


def choose_start(mode: str, markers: int, rangeless: int, from_markers: dict[int, int] | None,
                 offsets_json: str | None, default: str) -> Start:
    """Where a query with an empty checkpoint starts. markers: how many the commit topic holds
    (latest per unit); rangeless: how many of them name no source range (a stateful query's
    units); from_markers: the source partitions the markers place and where
    (sink_position.plan_start), offsets_json the same as Spark's startingOffsets."""
    if mode == "reprocess":
        return Start(None, f"upgradeMode reprocess: starting at {default}, whatever the sink holds "
                           "(records written already are written again)")
    if not markers:
        return Start(None, f"no markers: a new run from {default}")
    if rangeless:  # the stateful query's output may go further than any range
        return Start(None, "", unknown_end(mode))
    if not from_markers:
        return Start(None, f"the sink's markers name no range of this source topic: starting at {default}, "
                           "as a new run")
    return Start(offsets_json, "starting where the sink's markers say its output ends, per source partition "
                               + json.dumps(from_markers, sort_keys=True))
