"""librdkafka client settings for a pipeline's Kafka, with credentials from Secrets.

The operator resolves Secret references through the API; pods get the same values as env
vars (EOPIPE_KAFKA_*) from secretKeyRefs, so no credential is ever written into a manifest.
"""

from __future__ import annotations

import base64
import os
from typing import Callable

from eopipe.core.spec import KafkaSpec, SecretKeyRef

ENV_PREFIX = "EOPIPE_KAFKA_"
# A Secret reaches a pipeline only if whoever may edit the Secret opened it to that pipeline
# (docs/security.md#secrets): a comma-separated list of pipeline names of its namespace, or *.
OPT_IN = "eopipe.dev/pipelines"
# For a consumer that only reads a group's committed offsets (lag, progress): committed() of a
# read_committed consumer asks for stable offsets (KIP-447), which the broker refuses while a
# transaction holds offsets of the partition, and librdkafka asks again, so under a busy
# transactional group an answer took up to 2.5 s. Either way only committed offsets are
# returned, never a transaction's pending ones; a just-committed one may show a moment late
# (tests/integration/test_load_verify.py).
OFFSETS_NOW = {"isolation.level": "read_uncommitted"}


class NotAllowed(Exception):
    """The tenant policy keeps the operator from connecting to Kafka for this pipeline."""


class SecretNotOpen(NotAllowed):
    """A Secret (or another object of `kind`) a pipeline names is missing, or not opened to it:
    the two read the same, so a status never tells a tenant which objects exist."""

    def __init__(self, name: str, pipeline: str, kind: str = "Secret"):
        super().__init__(f"{kind} {name} is not open to pipeline {pipeline}: it must exist and carry the "
                         f"annotation {OPT_IN} naming {pipeline} (or *)")


def opened_to(annotations: dict | None, pipeline: str) -> bool:
    names = {n.strip() for n in ((annotations or {}).get(OPT_IN) or "").split(",")}
    return pipeline in names or "*" in names


def settings(kafka: KafkaSpec) -> list[tuple[str, str | SecretKeyRef]]:
    """librdkafka settings beyond bootstrap.servers; credentials stay Secret references."""
    out: list[tuple[str, str | SecretKeyRef]] = [("security.protocol", kafka.security_protocol)]
    if kafka.sasl is not None:
        out += [("sasl.mechanism", kafka.sasl.mechanism), ("sasl.username", kafka.sasl.username),
                ("sasl.password", kafka.sasl.password)]
    if kafka.tls is not None:
        for field, key in (("ca", "ssl.ca.pem"), ("cert", "ssl.certificate.pem"), ("key", "ssl.key.pem")):
            if getattr(kafka.tls, field) is not None:
                out.append((key, getattr(kafka.tls, field)))
    return out


def client_config(kafka: KafkaSpec, read_secret: Callable[[SecretKeyRef], str]) -> dict[str, str]:
    conf = {"bootstrap.servers": kafka.bootstrap_servers}
    for key, value in settings(kafka):
        conf[key] = read_secret(value) if isinstance(value, SecretKeyRef) else value
    return conf


def env_name(setting: str) -> str:
    return ENV_PREFIX + setting.upper().replace(".", "_")


def pod_env(kafka: KafkaSpec) -> list[dict]:
    """The container env of a pod that talks to Kafka: literals, and secretKeyRefs for credentials."""
    env = []
    for setting, value in settings(kafka):
        if isinstance(value, SecretKeyRef):
            env.append(value.env(env_name(setting)))
        else:
            env.append({"name": env_name(setting), "value": value})
    return env


def secret_reader(core_v1, namespace: str, pipeline: str) -> Callable[[SecretKeyRef], str]:
    """Reads a credential for `pipeline`; SecretNotOpen unless the Secret opted in to it."""
    from kubernetes.client import ApiException

    def read(ref: SecretKeyRef) -> str:
        try:
            secret = core_v1.read_namespaced_secret(ref.name, namespace)
        except ApiException as e:
            if e.status == 404:
                raise SecretNotOpen(ref.name, pipeline) from None
            raise
        if not opened_to(secret.metadata.annotations, pipeline):
            raise SecretNotOpen(ref.name, pipeline)
        if ref.key not in (secret.data or {}):
            raise KeyError(f"secret {namespace}/{ref.name} has no key {ref.key!r}")
        return base64.b64decode(secret.data[ref.key]).decode()
    return read


def from_env(environ=os.environ) -> dict[str, str]:
    """Client settings given to a worker pod: EOPIPE_KAFKA_SASL_USERNAME -> sasl.username."""
    return {k[len(ENV_PREFIX):].lower().replace("_", "."): v
            for k, v in environ.items() if k.startswith(ENV_PREFIX)}
