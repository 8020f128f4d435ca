"""The recovery decision (eopipe.dedup.recovery.plan), pure: one row per case of the fault matrix.

Each row gives the facts that differ from a clean running partition and the whole plan it
must get, so any change to the decision fails the rows it touches.
"""

from __future__ import annotations

import pytest

from eopipe.core.assignment import ReshardEra
from eopipe.dedup.recovery import (
    NONE,
    REBUILD,
    REPLAY,
    RESET,
    Facts,
    Plan,
    Reshard,
    plan,
    reshard_bounds,
    window_start_ms,
)

NOW = 100_000_000
WINDOW = 3_600_000
SEGMENT = 900_000
SINCE = NOW - WINDOW - SEGMENT
GROWING = Reshard(id=7, old_count=4, new_count=8)   # 4 -> 8 partitions, in progress


def facts(**kw) -> Facts:
    """Partition 1 of 4, committed and applied at 1000, its store complete for 4 partitions."""
    base = dict(partition=1, committed=1000, log_start=0, applied=1000, store_count=4, store_reshard=None,
                home_count=4, reshard=None, now_ms=NOW, window_ms=WINDOW, segment_ms=SEGMENT)
    return Facts(**{**base, **kw})


NO_STORE = dict(applied=None, store_count=None)

MATRIX = [
    pytest.param(dict(committed=-1, **NO_STORE), Plan(NONE, 0, skip_below=0),
                 id="new pipeline: nothing committed, no store"),
    pytest.param(dict(partition=5, committed=-1, home_count=8, **NO_STORE), Plan(NONE, 0, skip_below=0),
                 id="new partition after a growth: starts empty, complete for the new count"),
    pytest.param(dict(partition=5, committed=-1, home_count=8, reshard=GROWING, **NO_STORE),
                 Plan(NONE, 0, skip_below=0, mark_complete=False),
                 id="new partition during its re-shard: complete only once its import is done"),
    pytest.param(dict(committed=-1, log_start=400, applied=1000), Plan(RESET, 400, skip_below=400),
                 id="group offsets expired: the store is from an earlier life, reset at the log start"),
    pytest.param(dict(committed=-1, log_start=400, applied=400), Plan(NONE, 400, skip_below=400),
                 id="group offsets expired, store already at the log start: kept"),
    pytest.param(dict(committed=-1, log_start=400, applied=1000, home_count=8),
                 Plan(REBUILD, 400, rebuild_since_ms=SINCE),
                 id="group offsets expired and the store stale: rebuilt from the log start"),
    pytest.param(dict(), Plan(NONE, 1000),
                 id="clean restart: store at the committed offset"),
    pytest.param(dict(committed=1200), Plan(REPLAY, 1200, replay_from=1000),
                 id="crash between Kafka commit and RocksDB write: store behind, replay the gap"),
    pytest.param(dict(committed=1000, applied=1500), Plan(REBUILD, 1000, rebuild_since_ms=SINCE),
                 id="store ahead of Kafka (an old backup restored): rebuild"),
    pytest.param(dict(**NO_STORE), Plan(REBUILD, 1000, rebuild_since_ms=SINCE),
                 id="store deleted, or a handoff's snapshot failed: rebuild"),
    pytest.param(dict(applied=1000, store_count=None), Plan(NONE, 1000),
                 id="store that never went through a re-shard: trusted"),
    pytest.param(dict(home_count=8), Plan(REBUILD, 1000, rebuild_since_ms=SINCE),
                 id="stale store after a missed re-shard: rebuild, complete for the new count"),
    pytest.param(dict(store_count=2, home_count=8, reshard=GROWING), Plan(REBUILD, 1000, rebuild_since_ms=SINCE),
                 id="stale store during a later re-shard: rebuild, complete without an import"),
    pytest.param(dict(home_count=8, reshard=GROWING), Plan(NONE, 1000, mark_complete=False),
                 id="store exactly at the re-shard export point: kept, completed by the import"),
    pytest.param(dict(home_count=8, reshard=GROWING, store_reshard=3), Plan(NONE, 1000, mark_complete=False),
                 id="store that imported an earlier re-shard, at this one's export point"),
    pytest.param(dict(store_count=8, store_reshard=7, home_count=8, reshard=GROWING), Plan(NONE, 1000),
                 id="restart after this re-shard's import: complete"),
    pytest.param(dict(committed=1200, home_count=8, reshard=GROWING), Plan(REPLAY, 1200, replay_from=1000,
                                                                          mark_complete=False),
                 id="crash gap at the re-shard export point: replayed, then imported"),
    pytest.param(dict(log_start=1500), Plan(NONE, 1000, lost=500),
                 id="retention deleted unprocessed records: counted as lost"),
    pytest.param(dict(committed=1200, log_start=1100), Plan(REPLAY, 1200, replay_from=1000, lost=0),
                 id="retention deleted part of a crash gap: processed already, nothing lost"),
    pytest.param(dict(committed=1200, log_start=1300), Plan(REPLAY, 1200, replay_from=1000, lost=100),
                 id="retention deleted a crash gap and unprocessed records after it"),
    pytest.param(dict(committed=1000, applied=1000), Plan(NONE, 1000),
                 id="snapshot installed by a handoff, taken after the old owner's last commit"),
    pytest.param(dict(committed=1300, applied=1000), Plan(REPLAY, 1300, replay_from=1000),
                 id="snapshot installed by a handoff, older than the last commit: replay"),
]


@pytest.mark.parametrize("changes, expected", MATRIX)
def test_recovery_plan(changes, expected):
    assert plan(facts(**changes)) == expected


def test_a_fresh_store_is_reset_or_rebuilt_only():
    assert [a for a in (NONE, RESET, REBUILD, REPLAY) if Plan(a, 0).fresh_store] == [RESET, REBUILD]


def test_a_rebuild_reads_the_window_and_one_segment_more():
    assert window_start_ms(NOW, WINDOW, SEGMENT) == NOW - 4_500_000


def test_a_rebuild_scans_other_partitions_up_to_their_highest_boundary():
    history = (ReshardEra(3, 2, 4, {0: 50, 1: 70}), ReshardEra(7, 4, 8, {0: 90, 1: 100, 2: 10, 3: 20}))
    assert reshard_bounds(history, 1) == {0: 90, 2: 10, 3: 20}
    assert reshard_bounds((), 1) == {}
