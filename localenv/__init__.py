"""The local test environment: a real Kafka broker, a real Kubernetes control plane, a
test-only node agent and a Spark Operator stand-in, all run as local processes
(docs/design.md#the-local-environment)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
