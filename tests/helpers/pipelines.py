"""Pipelines through the operator on the local control plane: manifests from examples/ with
test overrides, applied with kubectl, read back through the API."""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes import client

from eopipe.core.names import Names
from eopipe.core.spec import RESOURCE, PipelineSpec
from localenv.fixtures_operator import kubectl, wait_for

REPO = Path(__file__).resolve().parents[2]


def example_names(example: str = "payments.yaml", ns: str = "team-a") -> Names:
    """The Names of an example pipeline, as the operator derives them."""
    doc = yaml.safe_load((REPO / "examples" / example).read_text())
    return Names(ns, doc["metadata"]["name"], PipelineSpec.model_validate(doc["spec"]))


def example_manifest(example: str, bootstrap: str, **spec_over) -> dict:
    doc = yaml.safe_load((REPO / "examples" / example).read_text())
    doc["spec"]["kafka"]["bootstrapServers"] = bootstrap
    for path, value in spec_over.items():
        node = doc["spec"]
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return doc


def kubectl_apply(cp, ns: str, doc: dict, check: bool = True):
    return kubectl(cp, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=check)


def get_pipeline(kube_api, ns: str, name: str) -> dict:
    group, version, plural = RESOURCE
    return client.CustomObjectsApi(kube_api).get_namespaced_custom_object(group, version, ns, plural, name)


def condition(obj: dict, type_: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def object_events(kube_api, ns: str, name: str = "minimal") -> list:
    """The events of the object `name` in `ns` (the pipeline's, by default the examples' name)."""
    return client.CoreV1Api(kube_api).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items


def ready_pipeline(kube_api, ns, name):
    obj = get_pipeline(kube_api, ns, name)
    return obj if condition(obj, "Ready").get("status") == "True" and \
        obj["status"].get("observedGeneration") == obj["metadata"]["generation"] else None


def unique_topic(name: str, ns: str) -> str:
    # Topics are cluster-wide: each test's source topic carries its namespace.
    return f"{name}-{ns}"


def topic_config(admin, topic: str, key: str) -> str | None:
    """The topic's value for key; None also while the broker does not know the topic yet (a
    create returns once the controller has it; the broker learns it from metadata a moment later)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import ConfigResource

    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        entry = admin.describe_configs([res])[res].result(30).get(key)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise
        return None
    return None if entry is None else entry.value


def set_topic_config(admin, topic: str, key: str, value: str) -> None:
    """What a topic's owner (or Strimzi) does by hand: kafka-configs.sh --alter --add-config."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(30)


def reconcile_passes(operator) -> float:
    """The operator's finished reconcile passes (all pipelines), from its /metrics."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("eopipe_operator_reconciles_total{"))


def wait_passes(operator, n: int, timeout: float = 120) -> None:
    """Until the operator has finished at least `n` more reconcile passes (resyncs included)."""
    start = reconcile_passes(operator)
    wait_for(lambda: reconcile_passes(operator) >= start + n, timeout, what=f"{n} more reconcile passes")
