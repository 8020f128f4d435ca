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
            env.append({"name": env_name(setting),
                        "valueFrom": {"secretKeyRef": {"name": value.name, "key": value.key}}})
        else:
            env.append({"name": env_name(setting), "value": value})
    return env


def secret_reader(core_v1, namespace: str) -> Callable[[SecretKeyRef], str]:
    def read(ref: SecretKeyRef) -> str:
        secret = core_v1.read_namespaced_secret(ref.name, namespace)
        if ref.key not in (secret.data or {}):
            raise KeyError(f"secret {namespace}/{ref.name} has no key {ref.key!r}")
        return base64.b64decode(secret.data[ref.key]).decode()
    return read


def from_env(environ=os.environ) -> dict[str, str]:
    """Client settings given to a worker pod: EOPIPE_KAFKA_SASL_USERNAME -> sasl.username."""
    return {k[len(ENV_PREFIX):].lower().replace("_", "."): v
            for k, v in environ.items() if k.startswith(ENV_PREFIX)}
