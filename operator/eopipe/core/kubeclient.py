"""Kubernetes API credentials, the same way for the operator and the dedup pods."""

from __future__ import annotations

from kubernetes import client, config


def load_config() -> client.ApiClient:
    """In-cluster credentials in a pod, else KUBECONFIG (local runs and tests)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()
