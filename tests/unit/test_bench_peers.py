"""The Java peers of `make bench` use the Kafka client version of the broker the harness runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _property(pom: Path, name: str) -> str:
    m = re.search(rf"<{name}>([^<]+)</{name}>", pom.read_text())
    assert m, f"{pom}: no <{name}>"
    return m.group(1)


def test_peers_use_the_broker_kafka_version():
    assert _property(REPO / "bench/peers/pom.xml", "kafka.version") == \
        _property(REPO / "hack/kafka/pom.xml", "kafka.version")


def test_peers_pom_compiles_for_java_17():
    assert _property(REPO / "bench/peers/pom.xml", "maven.compiler.release") == "17"
    assert "--release 17" in (REPO / "bench/peers/build.sh").read_text()
