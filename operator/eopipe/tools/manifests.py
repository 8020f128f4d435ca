"""`eopipe validate` and `eopipe render`: pipeline manifests checked as the API server checks
them, and the objects and topics the operator makes of them; no cluster and no Kafka needed."""

from __future__ import annotations

import sys
from typing import TextIO

import yaml

from eopipe.control import policy, rebalance
from eopipe.control.builders.pipeline import objects
from eopipe.control.builders.topics import desired_topics
from eopipe.control.settings import Settings
from eopipe.core import manifest
from eopipe.core.durations import duration_ms
from eopipe.core.names import Names
from eopipe.core.spec import KIND

VALID, INVALID, USAGE = 0, 1, 2


class _Dumper(yaml.SafeDumper):
    """Writes a dict used twice (the builders share label dicts) twice, never as an alias."""

    def ignore_aliases(self, data) -> bool:
        return True


class Unreadable(Exception):
    """The file cannot be opened or read (a usage error: exit 2)."""


def load(path: str) -> tuple[str, list]:
    """(the name to print, the YAML documents) of a file, `-` for stdin; yaml.YAMLError if it
    is not YAML."""
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as e:
        raise Unreadable(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    return ("<stdin>" if path == "-" else path), list(yaml.safe_load_all(text))


def _label(doc, index: int) -> str:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    return f"{doc.get('kind')}/{meta.get('name') or f'(document {index + 1})'}"


def load_policy(path: str | None) -> policy.TenantPolicy:
    """The tenant policy of `--policy`: the chart's values file (its `tenantPolicy`) or the policy
    alone; the default policy without one. Raises Unreadable (also for a policy that does not parse)."""
    if path is None:
        return policy.TenantPolicy()
    try:
        _, docs = load(path)
        doc = docs[0] if docs else None
        doc = doc.get("tenantPolicy", doc) if isinstance(doc, dict) else doc
        if doc is not None and not isinstance(doc, dict):
            raise ValueError("not a mapping")
        return policy.parse(doc)
    except (yaml.YAMLError, ValueError) as e:
        raise Unreadable(f"--policy {path}: {' '.join(str(e).split())}") from None


def validate(paths: list[str], out: TextIO = sys.stdout, tenant_policy: policy.TenantPolicy | None = None,
             allowed_registries: tuple[str, ...] = ()) -> int:
    """Prints `FILE: <kind>/<name>: valid` or one line per problem, the tenant policy's refusals
    among them (Secrets need a cluster: not checked); 0 if all valid, 1 if not. Raises Unreadable."""
    tenant_policy = tenant_policy or policy.TenantPolicy()
    status = VALID
    for path in paths:
        try:
            shown, docs = load(path)
        except yaml.YAMLError as e:
            print(f"{path}: not YAML: {' '.join(str(e).split())}", file=out)
            status = INVALID
            continue
        for i, doc in enumerate(docs):
            if doc is None:
                continue
            if not isinstance(doc, dict):
                print(f"{shown}: document {i + 1}: skipped, not a Kubernetes object", file=out)
                continue
            label = _label(doc, i)
            if not manifest.is_pipeline(doc):
                print(f"{shown}: {label}: skipped, not an {KIND}", file=out)
                continue
            try:
                problems = policy.refusals(manifest.parse(doc).spec, tenant_policy, allowed_registries)
            except manifest.Invalid as e:
                problems = e.problems
            for problem in problems:
                print(f"{shown}: {label}: {problem}", file=out)
            if problems:
                status = INVALID
            else:
                print(f"{shown}: {label}: valid", file=out)
    return status


def topics_document(names: Names) -> dict:
    """The Kafka topics the operator creates and keeps as specified (not a Kubernetes object)."""
    return {"kind": "KafkaTopics",
            "metadata": {"name": names.pipeline, "namespace": names.namespace},
            "topics": [{"name": t.name, "role": t.role, "partitions": t.partitions,
                        "replicationFactor": t.replication_factor, "config": dict(t.config)}
                       for t in desired_topics(names)]}


def render(pipeline: manifest.Pipeline, namespace: str, settings: Settings) -> list[dict]:
    """What the operator's first reconcile pass of a new pipeline applies: the first assignment
    and replica count are the rebalance state machine's own decision for a pipeline with no
    history, the objects come from the operator's builders, then the topics."""
    names = Names(namespace, pipeline.name, pipeline.spec)
    spec = pipeline.spec
    plan = rebalance.step(rebalance.Facts(now_ms=0, pod_prefix=names.dedup, replicas=spec.dedup.replicas,
                                          partitions=spec.source.partitions, paused=spec.paused,
                                          window_ms=duration_ms(spec.dedup.window)), None)
    return [*objects(names, settings, plan.assignment, plan.replicas), topics_document(names)]


def render_file(path: str, namespace: str | None, settings: Settings, out: TextIO = sys.stdout,
                err: TextIO = sys.stderr) -> int:
    """Prints the objects of every pipeline in the file as multi-document YAML; 1 (and the
    problems on `err`) if a pipeline is invalid. Raises Unreadable."""
    try:
        shown, docs = load(path)
    except yaml.YAMLError as e:
        print(f"{path}: not YAML: {' '.join(str(e).split())}", file=err)
        return INVALID
    rendered, status = [], VALID
    for i, doc in enumerate(docs):
        if not manifest.is_pipeline(doc):
            continue
        try:
            pipeline = manifest.parse(doc)
        except manifest.Invalid as e:
            status = INVALID
            for problem in e.problems:
                print(f"{shown}: {_label(doc, i)}: {problem}", file=err)
            continue
        rendered += render(pipeline, namespace or pipeline.namespace or "default", settings)
    if status == VALID and not rendered:
        print(f"{shown}: no {KIND} to render", file=err)
        return INVALID
    if status == VALID:
        print(yaml.dump_all(rendered, Dumper=_Dumper, sort_keys=False, explicit_start=True, width=100),
              end="", file=out)
    return status
