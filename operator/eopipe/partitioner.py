"""Key -> partition, byte-compatible with the Kafka clients that producers use.

The dedup state of a key lives with the key's home partition, so the worker, `eopipe load`
and the re-sharding of a partition increase must all agree with the producers' partitioner:
- murmur2: the Java client's default for keyed records (Utils.murmur2, then toPositive % n);
  librdkafka calls it "murmur2_random".
- crc32: librdkafka's default ("consistent_random"): zlib crc32 % n.
"""

from __future__ import annotations

import zlib
from typing import Callable

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's org.apache.kafka.common.utils.Utils.murmur2, as a signed 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    n4 = length & ~3
    for i in range(0, n4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[n4 + 2] << 16
    if rest >= 2:
        h ^= data[n4 + 1] << 8
    if rest >= 1:
        h ^= data[n4]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def murmur2_partition(key: bytes, partitions: int) -> int:
    # Java's Utils.toPositive masks the sign bit (it is not abs()).
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def crc32_partition(key: bytes, partitions: int) -> int:
    return zlib.crc32(key) % partitions


PARTITIONERS: dict[str, Callable[[bytes, int], int]] = {
    "murmur2": murmur2_partition,
    "crc32": crc32_partition,
}

# The librdkafka `partitioner` setting that matches each of ours.
LIBRDKAFKA_NAMES = {"murmur2": "murmur2_random", "crc32": "consistent_random"}


def get(name: str) -> Callable[[bytes, int], int]:
    try:
        return PARTITIONERS[name]
    except KeyError:
        raise ValueError(f"unknown partitioner {name!r}; expected one of {sorted(PARTITIONERS)}")
