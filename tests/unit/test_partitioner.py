"""The partitioner's pure parts: errors and the fast path against the Python reference."""

import random
import uuid

import pytest

from eopipe.core import partitioner


def test_unknown_partitioner_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown partitioner 'fnv'"):
        partitioner.get("fnv")


def test_fast_path_matches_the_python_reference():
    """The hot path may call librdkafka's murmur2 through ctypes; it must agree exactly."""
    rng = random.Random(7)
    keys = [rng.randbytes(rng.randrange(0, 70)) for _ in range(3000)] + [str(uuid.uuid4()).encode()]
    for k in keys:
        for n in (1, 3, 7, 64):
            assert partitioner.murmur2_partition(k, n) == partitioner._murmur2_partition_py(k, n)
    assert partitioner.murmur2_partition is not partitioner._murmur2_partition_py, \
        "librdkafka's murmur2 was not found: the worker runs ~6x slower per record"
