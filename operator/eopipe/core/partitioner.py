"""Key -> partition, byte-compatible with the Kafka clients that producers use.

The dedup state of a key lives with the key's home partition, so the worker, `eopipe load`
and the re-sharding of a partition increase must all agree with the producers' partitioner:
- murmur2: the Java client's default for keyed records (Utils.murmur2, then toPositive % n);
  librdkafka calls it "murmur2_random".
- crc32: librdkafka's default ("consistent_random"): zlib crc32 % n.
"""

from __future__ import annotations

import struct
import zlib
from typing import Callable

from eopipe.core import native

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_UNPACK: dict[int, Callable] = {}


def murmur2(data: bytes) -> int:
    """Kafka's org.apache.kafka.common.utils.Utils.murmur2, as a signed 32-bit int."""
    length = len(data)
    n4 = length >> 2
    unpack = _UNPACK.get(n4)
    if unpack is None:  # all 4-byte words in one call: the hot path runs once per record
        unpack = _UNPACK[n4] = struct.Struct(f"<{n4}I").unpack_from
    h = (0x9747B28C ^ length) & _MASK
    for k in unpack(data):
        k = (k * _M) & _MASK
        k ^= k >> 24
        h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    rest, tail = length & 3, n4 << 2
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _murmur2_partition_py(key: bytes, partitions: int) -> int:
    # Java's Utils.toPositive masks the sign bit (it is not abs()).
    return (murmur2(key) & 0x7FFFFFFF) % partitions


# Compiled (core/native.pyx); murmur2() above is the reference the tests compare it with.
murmur2_partition: Callable[[bytes, int], int] = native.murmur2_partition


def crc32_partition(key: bytes, partitions: int) -> int:
    return zlib.crc32(key) % partitions


PARTITIONERS: dict[str, Callable[[bytes, int], int]] = {
    "murmur2": murmur2_partition,
    "crc32": crc32_partition,
}

# The same, for a list of keys at once (the worker's hot path: a polled batch's home check).
MANY: dict[str, Callable[[list[bytes], int], list[int]]] = {
    "murmur2": native.murmur2_partitions,
    "crc32": lambda keys, n, _crc=zlib.crc32: [_crc(k) % n for k in keys],
}

# The librdkafka `partitioner` setting that matches each of ours.
LIBRDKAFKA_NAMES = {"murmur2": "murmur2_random", "crc32": "consistent_random"}


def get(name: str) -> Callable[[bytes, int], int]:
    return _named(PARTITIONERS, name)


def get_many(name: str) -> Callable[[list[bytes], int], list[int]]:
    """get(name) over a list of keys: [get(name)(k, n) for k in keys], faster."""
    return _named(MANY, name)


def _named(table: dict, name: str):
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown partitioner {name!r}; expected one of {sorted(table)}") from None
