"""Generates the ExactlyOncePipeline CRD from the spec model (`eopipe crd`).

crds/ holds the output; a test fails when the two drift apart. The pydantic JSON schema is
made structural for the API server: $refs inlined, Optional unwrapped, no additionalProperties
false (the API server prunes unknown fields), and the CEL rules of `core.spec.CEL_RULES`
attached where they apply (and `core.manifest.ROOT_RULES` at the root).
"""

from __future__ import annotations

import copy

import yaml

from eopipe.core import manifest, spec

KEEP = {"type", "description", "default", "enum", "minimum", "maximum", "minLength",
        "maxLength", "pattern", "properties", "required", "items", "additionalProperties",
        # Bounds that keep the CEL rules' estimated cost within the API server's limit, and the
        # Kubernetes objects (tolerations, affinity) passed through unchecked (spec.KubeObject).
        "minItems", "maxItems", "maxProperties", "x-kubernetes-preserve-unknown-fields"}


def _structural(node: dict, defs: dict) -> dict:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[1]]
        return _structural({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    if "anyOf" in node:  # Optional[X] -> X: absence means "not set"
        variants = [v for v in node["anyOf"] if v.get("type") != "null"]
        assert len(variants) == 1, f"unions other than Optional are not structural: {node}"
        merged = {**variants[0], **{k: v for k, v in node.items() if k not in ("anyOf", "default")}}
        return _structural(merged, defs)
    if "const" in node:
        node = {**node, "enum": [node["const"]]}
    out = {k: copy.deepcopy(v) for k, v in node.items() if k in KEEP}
    if "properties" in out:
        out["properties"] = {name: _structural(sub, defs) for name, sub in node["properties"].items()}
        out["type"] = "object"
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _structural(out["additionalProperties"], defs)
    elif "additionalProperties" in out:
        del out["additionalProperties"]
    if "items" in out:
        out["items"] = _structural(out["items"], defs)
    return out


def _at(schema: dict, path: tuple[str, ...]) -> dict:
    for name in path:
        schema = schema["properties"][name]
    return schema


def spec_schema() -> dict:
    raw = spec.PipelineSpec.model_json_schema(by_alias=True)
    schema = _structural(raw, raw.get("$defs", {}))
    for path, rules in spec.CEL_RULES.items():
        _at(schema, path)["x-kubernetes-validations"] = copy.deepcopy(rules)
    return schema


def _condition_column(type_: str) -> str:
    return f'.status.conditions[?(@.type=="{type_}")].status'


def crd() -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{spec.PLURAL}.{spec.GROUP}"},
        "spec": {
            "group": spec.GROUP,
            "scope": "Namespaced",
            "names": {"kind": spec.KIND, "listKind": f"{spec.KIND}List", "plural": spec.PLURAL,
                      "singular": spec.KIND.lower(), "shortNames": ["eop", "eopipe"],
                      "categories": ["eopipe"]},
            # Identical schemas, so the API server converts by rewriting apiVersion alone (the
            # default, stated): no conversion webhook to run or to be down.
            "conversion": {"strategy": "None"},
            "versions": [version(spec.VERSION), *(version(v, deprecated=True) for v in spec.DEPRECATED_VERSIONS)],
        },
    }


def version(name: str, *, deprecated: bool = False) -> dict:
    """One served version; only the current one is stored. A deprecated one makes the API server
    add a warning to each answer (kubectl prints it)."""
    return {
        "name": name,
        "served": True,
        "storage": not deprecated,
        **({"deprecated": True, "deprecationWarning": spec.deprecation_warning(name)} if deprecated else {}),
        # The scale subresource: `kubectl scale`, an HPA or KEDA drive the dedup pods;
        # the operator moves partitions live, as for an edit of spec.dedup.replicas.
        "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.dedup.replicas",
                                                 "statusReplicasPath": ".status.replicas",
                                                 "labelSelectorPath": ".status.selector"}},
        "additionalPrinterColumns": [
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Ready", "type": "string", "jsonPath": _condition_column("Ready")},
            {"name": "Partitions", "type": "integer", "jsonPath": ".spec.source.partitions"},
            # What runs (status): with spec.dedup.autoscale the spec's count is only the start.
            {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas",
             "description": "dedup pods (the StatefulSet's replicas)"},
            {"name": "Lag", "type": "integer", "jsonPath": ".status.lag.dedup",
             "description": "source records the dedup stage has not committed yet"},
            # The Spark stage as its driver reports it (status.processing); -o wide.
            {"name": "Batch", "type": "integer", "jsonPath": ".status.processing.lastBatchId",
             "priority": 1, "description": "the Spark query's last finished micro-batch"},
            {"name": "Spark Lag", "type": "integer", "jsonPath": ".status.processing.lagRecords",
             "priority": 1, "description": "deduped records the Spark stage has not read yet"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        "schema": {"openAPIV3Schema": {
            "type": "object",
            "description": "An exactly-once Kafka -> dedup -> Spark pipeline.",
            "required": ["spec"],
            # Rules on the whole object: the only place a rule can read metadata.name.
            "x-kubernetes-validations": copy.deepcopy(manifest.ROOT_RULES),
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                "spec": spec_schema(),
                # Written only by the operator; kept open so older operators never
                # lose fields that newer ones add.
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        }},
    }


def render() -> str:
    header = "# Generated from eopipe.core.spec by `eopipe crd`; do not edit by hand.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)
