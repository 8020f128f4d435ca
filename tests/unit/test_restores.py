"""control/restores.py: one StateRestored event per restore a pod reports, told once."""

import pytest

from eopipe.control.restores import REASON, told
from eopipe.core.wire import PodStatus


def pod(**parts: dict) -> PodStatus:
    """Partitions by name p<n>: their recovery."""
    return PodStatus.from_json({"partitions": {k[1:]: {"state": "running", "recovery": r} for k, r in parts.items()}})


RESTORED = {"recovery": "replay", "applied_before": 500, "replayed": 40, "recovery_seconds": 1.2345,
            "snapshot_offset": 500}
SEEN = {"pod": "clicks-dedup-1", "snapshotOffset": 500, "replayed": 40, "seconds": 1.234}


@pytest.mark.parametrize("reports, recorded, events, record", [
    # Nothing restored: no event, nothing to record.
    ({"clicks-dedup-0": pod(p0={"recovery": "none"}, p1={"recovery": "rebuild", "replayed": 9})}, None, [], {}),
    # A restore: told, and recorded by partition.
    ({"clicks-dedup-1": pod(p3=RESTORED)}, None, [3], {"3": SEEN}),
    # The same restore on the next pass (or after an operator restart): not told again.
    ({"clicks-dedup-1": pod(p3=RESTORED)}, {"3": SEEN}, [], {"3": SEEN}),
    # Another restore of that partition (another pod, or the same one again): told.
    ({"clicks-dedup-0": pod(p3=RESTORED)}, {"3": SEEN}, [3], {"3": {**SEEN, "pod": "clicks-dedup-0"}}),
    ({"clicks-dedup-1": pod(p3={**RESTORED, "recovery_seconds": 2.0})}, {"3": SEEN}, [3], {"3": {**SEEN, "seconds": 2.0}}),
    # The pod restarted since (its store kept: no snapshot_offset): the record stays, nothing told.
    ({"clicks-dedup-1": pod(p3={"recovery": "none"})}, {"3": SEEN}, [], {"3": SEEN}),
    # A hand-edited record is nothing recorded: replaced, the restore told.
    ({"clicks-dedup-1": pod(p3=RESTORED)}, ["3"], [3], {"3": SEEN}),
    ({"clicks-dedup-1": pod(p3=RESTORED)}, {"3": "x"}, [3], {"3": SEEN}),
    # Two partitions restored on two pods: one event each, in order.
    ({"b": pod(p2=RESTORED), "a": pod(p0=RESTORED)}, None, [0, 2],
     {"0": {**SEEN, "pod": "a"}, "2": {**SEEN, "pod": "b"}}),
])
def test_each_restore_is_told_once(reports, recorded, events, record):
    out = told(reports, recorded)
    assert [int(m.split()[1]) for _, _, m in out.events] == events
    assert all(t == "Normal" and r == REASON for t, r, _ in out.events)
    assert out.record == record
    assert out.changed == (record != (recorded if isinstance(recorded, dict) else {}))


def test_the_message_says_where_it_came_from_and_what_was_replayed():
    (_, _, msg), = told({"clicks-dedup-1": pod(p3=RESTORED)}, None).events
    assert msg == ("partition 3 on clicks-dedup-1: its state was gone and is restored from the object store's "
                   "snapshot at offset 500, then 40 records replayed from there (1.234 s), not rebuilt over the window")
