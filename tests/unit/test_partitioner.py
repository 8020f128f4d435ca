"""The partitioner's pure parts: errors and the fast path against the Python reference."""

import random
import uuid

import pytest

from eopipe.core import partitioner


def test_unknown_partitioner_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown partitioner 'fnv'"):
        partitioner.get("fnv")
    with pytest.raises(ValueError, match="unknown partitioner 'fnv'"):
        partitioner.get_many("fnv")


@pytest.mark.parametrize("name", sorted(partitioner.PARTITIONERS))
@pytest.mark.parametrize("n", [1, 4, 7])
def test_a_batch_of_keys_is_placed_as_each_key_alone(name, n):
    """The worker's home check takes a polled batch at once (get_many): the same partitions."""
    rng = random.Random(3)
    keys = [rng.randbytes(rng.randrange(1, 50)) for _ in range(500)] + [b"a", b"\xff" * 37]
    one = partitioner.get(name)
    assert partitioner.get_many(name)(keys, n) == [one(k, n) for k in keys]
    assert partitioner.get_many(name)([], n) == []


def test_fast_path_matches_the_python_reference():
    """The compiled murmur2 (core/native.pyx) must agree exactly with the Python one."""
    rng = random.Random(7)
    keys = [rng.randbytes(rng.randrange(0, 70)) for _ in range(3000)] + [str(uuid.uuid4()).encode()]
    for k in keys:
        for n in (1, 3, 7, 64):
            assert partitioner.murmur2_partition(k, n) == partitioner._murmur2_partition_py(k, n)
    # Java's Utils.murmur2, as Kafka's own tests give it, through toPositive.
    assert partitioner._murmur2_partition_py(b"21", 2**31 - 1) == (-973932308 & 0x7FFFFFFF)
