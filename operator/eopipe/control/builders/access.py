"""Who may reach a pipeline's dedup pods (docs/design.md#access-control).

- The token Secret: one random bearer token per pipeline for the pods' state endpoints
  (/snapshots, /reshard; eopipe.dedup.auth). The operator creates it once (control/tokens.py)
  and never rewrites it; the pods get it as env EOPIPE_TOKEN through a secretKeyRef.
- The NetworkPolicy: ingress to the pods' HTTP port only from the pipeline's own pods, from the
  operator (it reads /status) and, for /metrics, from the namespaces a selector names.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass

from eopipe.core.names import LABEL_PIPELINE, Names

TOKEN_KEY = "token"
TOKEN_ENV = "EOPIPE_TOKEN"   # what eopipe.dedup.auth reads (the planes share no import)
TOKEN_BYTES = 32             # 256 random bits, url-safe base64: 43 characters
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"   # the API server sets it on every namespace


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_secret(names: Names, token: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": names.token_secret, "namespace": names.namespace, "labels": names.labels("dedup"),
                     "annotations": {"eopipe.dev/purpose": "bearer token of the dedup pods' state endpoints; "
                                                           "delete it to rotate, then restart the dedup pods"}},
        "type": "Opaque",
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def token_env(names: Names) -> dict:
    return {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": names.token_secret, "key": TOKEN_KEY}}}


def token_problem(secret: dict) -> str | None:
    """What makes an existing token Secret unusable by the pods, or None. The operator reports it
    and leaves the Secret alone: a token is never replaced behind the user's back."""
    name = (secret.get("metadata") or {}).get("name", "?")
    fix = "delete it and the operator creates a new token (then restart the dedup pods)"
    value = (secret.get("data") or {}).get(TOKEN_KEY)
    if not value:
        return f"Secret {name} has no key {TOKEN_KEY!r}: {fix}"
    try:
        token = base64.b64decode(value, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return f"Secret {name}: key {TOKEN_KEY!r} is not a base64 text: {fix}"
    if not token.strip() or any(c.isspace() for c in token.strip()) or not token.strip().isprintable():
        return f"Secret {name}: key {TOKEN_KEY!r} must be one word of printable characters: {fix}"
    return None


@dataclass(frozen=True)
class PolicyPeers:
    """Who besides the pipeline's own pods may reach its dedup pods (the operator's settings)."""
    operator_namespace: str
    operator_labels: tuple[tuple[str, str], ...]     # the operator pods' labels (chart selectorLabels)
    # A namespaceSelector (matchLabels / matchExpressions) of the metrics scrapers; None: none.
    metrics_namespace_selector: dict | None = None


def network_policy(names: Names, peers: PolicyPeers) -> dict:
    """Ingress to the dedup pods' `http` port (state transfer, /status, /metrics, probes) from
    their own pipeline's pods, the operator and the metrics namespaces; nothing else. A
    NetworkPolicy sees ports, not paths: the metrics scrapers reach the state endpoints' port
    too, and the token is what keeps them out. Egress is not restricted (Kafka's address is
    the user's)."""
    port = [{"protocol": "TCP", "port": "http"}]
    own = {"podSelector": {"matchLabels": {LABEL_PIPELINE: names.pipeline}}}
    operator = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: peers.operator_namespace}},
                "podSelector": {"matchLabels": dict(peers.operator_labels)}}
    ingress = [{"from": [own, operator], "ports": port}]
    if peers.metrics_namespace_selector is not None:
        ingress.append({"from": [{"namespaceSelector": peers.metrics_namespace_selector}], "ports": port})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": names.dedup, "namespace": names.namespace, "labels": names.labels("dedup")},
        "spec": {"podSelector": {"matchLabels": names.selector("dedup")}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    }
