"""The assignment is balanced and moves no more partitions than the best balanced assignment;
a worker reads the newest published copy."""

import itertools
import json
import math
import random

import pytest

from eopipe.core.assignment import Assignment, assign, moves


def _balanced(owners, n, pods):
    counts = [sum(1 for o in owners.values() if o == pod) for pod in pods]
    return sorted(owners) == list(range(n)) and max(counts) <= math.ceil(n / len(pods)) \
        and min(counts) >= n // len(pods)


def _best_moves(n, pods, previous):
    best = n
    for combo in itertools.product(pods, repeat=n):
        owners = dict(enumerate(combo))
        if _balanced(owners, n, pods):
            best = min(best, len(moves(previous, owners)))
    return best


@pytest.mark.parametrize("seed", range(60))
def test_balanced_and_minimal_against_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    old_pods = [f"p{i}" for i in range(rng.randint(1, 3))]
    new_pods = [f"p{i}" for i in range(rng.randint(1, 3))]
    previous = assign(n, old_pods)
    if rng.random() < 0.5:  # an unbalanced or partial history, as after crashes or growth
        previous = {p: rng.choice(old_pods) for p in range(n) if rng.random() < 0.8}
    owners = assign(n, new_pods, previous)
    assert _balanced(owners, n, new_pods)
    assert len(moves(previous, owners)) == _best_moves(n, new_pods, previous)


def test_scale_up_and_down_moves_only_what_it_must():
    a1 = assign(12, ["d-0"])
    a3 = assign(12, ["d-0", "d-1", "d-2"], a1)
    assert len(moves(a1, a3)) == 8  # d-0 keeps 4
    a2 = assign(12, ["d-0", "d-1"], a3)
    assert len(moves(a3, a2)) == 4  # only d-2's partitions move
    assert all(src == "d-2" for src, _ in moves(a3, a2).values())
    assert assign(12, ["d-0", "d-1"], a2) == a2  # stable when nothing changed


def test_partition_increase_keeps_existing_owners():
    a4 = assign(4, ["d-0", "d-1"])
    a8 = assign(8, ["d-0", "d-1"], a4)
    assert all(a8[p] == a4[p] for p in range(4))
    assert sorted(moves(a4, a8)) == [4, 5, 6, 7]


def test_json_round_trip_and_errors():
    a = Assignment(7, assign(5, ["x", "y"]))
    assert Assignment.from_json(a.to_json()) == a
    assert sorted(a.partitions_of("x") + a.partitions_of("y")) == list(range(5))
    assert {len(a.partitions_of("x")), len(a.partitions_of("y"))} == {2, 3}
    with pytest.raises(ValueError, match="no pods"):
        assign(3, [])


def test_worker_follows_the_newest_of_mounted_file_and_watched_configmap(tmp_path):
    from eopipe.dedup.assignment_source import AssignmentSource

    path = tmp_path / "assignment.json"
    src = AssignmentSource("pod-a", file=path, namespace="ns", configmap="cm")  # watch not started
    with pytest.raises(OSError):
        src.read()  # nothing readable yet: the worker waits
    src.watch.latest = Assignment(3, {0: "pod-a"})
    assert src.read().generation == 3  # the API alone will do
    path.write_text(json.dumps(Assignment(2, {0: "pod-b"}).to_json()))
    assert src.read().owners == {0: "pod-a"}  # the kubelet has not refreshed the file yet
    path.write_text(json.dumps(Assignment(4, {0: "pod-b"}).to_json()))
    assert src.read().owners == {0: "pod-b"}  # the watch is broken and behind: the file is newer
    src.watch.latest = Assignment(4, {0: "pod-c"})
    assert src.read().owners == {0: "pod-c"}  # a tie goes to the API's copy
    assert AssignmentSource("pod-a", partitions=[1, 2]).read() == Assignment(0, {1: "pod-a", 2: "pod-a"})


def test_a_watched_configmap_wakes_the_worker():
    from types import SimpleNamespace

    from eopipe.core.assignment import CONFIGMAP_KEY
    from eopipe.dedup.assignment_source import AssignmentSource

    src = AssignmentSource("pod-a", namespace="ns", configmap="cm")  # watch not started
    assert not src.changed.is_set()
    src.watch._take(SimpleNamespace(data={CONFIGMAP_KEY: "not json"}))
    assert not src.changed.is_set()  # nothing new to follow
    src.watch._take(SimpleNamespace(data={CONFIGMAP_KEY: json.dumps(Assignment(5, {0: "pod-a"}).to_json())}))
    assert src.changed.is_set() and src.read().generation == 5
