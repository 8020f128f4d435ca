"""The local test environment: a real Kafka broker, a real Kubernetes control plane, a
test-only node agent and a Spark Operator stand-in, all run as local processes
(docs/design.md#the-local-environment)."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# Downloads and builds kept between runs (hack/lib.sh uses the same default).
CACHE = Path(os.environ.get("EOPIPE_CACHE", Path.home() / ".cache" / "eopipe"))


def quick_jit() -> list[str]:
    """JVM options for the harness's own JVMs (Kafka brokers, the Spark tests' local drivers of
    fixtures_spark) when EOPIPE_QUICK_JIT=1, which the test suite sets (tests/conftest.py): C1
    only. In a JVM that lives minutes, compiling (C2 and C1) was 40-55% of its CPU (a broker 55 s
    of 134 s, a driver 34 s of 63 s: thread CPU on the node tier); with C1 only,
    tests/integration/test_dedup_worker.py took 116 s of CPU instead of 179. Benchmarks (those
    that run a node-tier test set it to 0: bench.common.node_test) and `make demo`: full JIT."""
    return ["-XX:TieredStopAtLevel=1"] if os.environ.get("EOPIPE_QUICK_JIT") == "1" else []
