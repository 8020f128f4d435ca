"""Admission on the real API server: names too long for the derived objects and changes that
cannot be carried out in place are refused with a message that says why, and `eopipe validate`
says what the API server says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from eopipe.core.manifest import ROOT_RULES
from eopipe.core.names import MAX_PIPELINE_NAME
from eopipe.core.spec import IMMUTABLE
from tests.helpers.manifests import changed, example, lines_about, validate
from tests.helpers.pipelines import REPO, kubectl_apply

pytestmark = pytest.mark.k8s

EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))


def _doc(name: str = "minimal.yaml", **over) -> dict:
    return changed(example(name), **over)


def test_a_name_too_long_for_the_derived_names_is_refused(crds, k8s_namespace):
    ok = _doc(**{"metadata.name": "p" * MAX_PIPELINE_NAME})
    res = kubectl_apply(crds, k8s_namespace, ok, check=False)
    assert res.returncode == 0, res.stderr
    long = _doc(**{"metadata.name": "p" * (MAX_PIPELINE_NAME + 1)})
    res = kubectl_apply(crds, k8s_namespace, long, check=False)
    assert res.returncode != 0 and f"metadata: Invalid value: {ROOT_RULES[0]['message']}" in res.stderr, res.stderr
    res = kubectl_apply(crds, k8s_namespace, _doc(**{"metadata.name": "9lives"}), check=False)
    assert res.returncode != 0 and ROOT_RULES[1]["message"] in res.stderr, res.stderr


@pytest.mark.parametrize("path, value", [
    ("spec.source.topic", "events-v2"),
    ("spec.source.partitioner", "crc32"),
    ("spec.dedup.key", {"from": "jsonField", "name": "id"}),  # from the defaulted recordKey
])
def test_changes_that_cannot_be_made_in_place_are_refused(crds, k8s_namespace, path, value):
    doc = _doc()
    kubectl_apply(crds, k8s_namespace, doc)
    res = kubectl_apply(crds, k8s_namespace, _doc(**{path: value}), check=False)
    message = IMMUTABLE[tuple(path.split(".")[1:])]
    assert res.returncode != 0 and f"{path}: Invalid value: " in res.stderr and message in res.stderr, res.stderr
    # Other changes still go through.
    kubectl_apply(crds, k8s_namespace, _doc(**{"spec.source.partitions": 6}))


def test_a_pod_template_is_stored_as_written(crds, k8s_namespace, kube_api):
    """Tolerations, affinity and env sources are Kubernetes objects the CRD keeps whole
    (x-kubernetes-preserve-unknown-fields): nothing pruned on the way to the operator."""
    from tests.helpers.pipelines import get_pipeline
    from tests.helpers.podsecurity import POD_TEMPLATE

    doc = _doc(**{"spec.dedup": {"podTemplate": POD_TEMPLATE}, "spec.imagePullSecrets": [{"name": "registry"}]})
    kubectl_apply(crds, k8s_namespace, doc)
    stored = get_pipeline(kube_api, k8s_namespace, "minimal")["spec"]
    assert stored["dedup"]["podTemplate"] == POD_TEMPLATE and stored["imagePullSecrets"] == [{"name": "registry"}]


# One break per example, and a few more of the minimal one: each refused by the API server with
# the text `eopipe validate` prints.
BREAKS = [
    ("payments.yaml", "spec.dedup.window", "200h"),            # window > retention (CEL)
    ("minimal.yaml", "spec.dedup", {"window": "0s"}),          # no window at all (CEL on the field)
    ("minimal.yaml", "spec.source.topic", "bad topic!"),        # pattern
    # The Spark checkpoint on durable storage, a files sink on storage the executors share (CEL).
    ("file-sink.yaml", "spec.processing.checkpoint", None),
    ("payments.yaml", "spec.processing.checkpointLocation", "/var/lib/eopipe/checkpoints/payments"),
    ("payments.yaml", "spec.processing.checkpoint", {"uri": "s3a://b/ck", "pvc": {}}),
    ("file-sink.yaml", "spec.processing.checkpoint", {"pvc": {}}),
    ("file-sink.yaml", "spec.processing.outputMode", "update"),
    ("payments.yaml", "spec.processing.watermark", {"column": "timestamp", "delay": "10 seconds"}),
    ("payments.yaml", "spec.processing.env", [{"name": "EOPIPE_KAFKA_ACKS", "value": "0"}]),
    ("minimal.yaml", "metadata.name", "p" * (MAX_PIPELINE_NAME + 1)),  # root rule
    ("minimal.yaml", "spec.dedup", {"replicas": "two"}),        # type
    ("minimal.yaml", "spec.source.partitioner", "fnv"),         # enum
    ("minimal.yaml", "spec.source.topic", "t" * 250),           # pattern and length
    ("minimal.yaml", "spec.source.surprise", 1),                # unknown field
    ("payments.yaml", "spec.dedup.key", {"from": "header"}),    # CEL on a nested object
    ("file-sink.yaml", "spec.sink", {"kafka": {"topic": "x"}, "files": {"path": "/o"}}),
    # The pod template may not change the operator's selector labels or the worker's env (CEL).
    ("minimal.yaml", "spec.dedup", {"podTemplate": {"labels": {"eopipe.dev/pipeline": "other"}}}),
    ("minimal.yaml", "spec.dedup", {"podTemplate": {"env": [{"name": "EOPIPE_KAFKA_ACKS", "value": "0"}]}}),
    ("minimal.yaml", "spec.dedup", {"podTemplate": {"env": [{"name": "bad name", "value": "0"}]}}),  # pattern
    # Autoscale bounds: min <= max (CEL), max <= source.partitions (CEL at the root), min >= 1.
    ("minimal.yaml", "spec.dedup", {"autoscale": {"minReplicas": 3, "maxReplicas": 2}}),
    ("minimal.yaml", "spec.dedup", {"autoscale": {"maxReplicas": 5}}),
    ("minimal.yaml", "spec.dedup", {"autoscale": {"minReplicas": 0, "maxReplicas": 2}}),
]


def test_validate_passes_the_examples_the_api_server_accepts(crds, k8s_namespace):
    pipelines = [e for e in EXAMPLES if "argocd" not in e]  # a file without a pipeline is refused
    res = validate(*(REPO / "examples" / e for e in pipelines))
    assert res.returncode == 0, res.stdout + res.stderr
    for name in EXAMPLES:
        for doc in yaml.safe_load_all((REPO / "examples" / name).read_text()):
            if doc and doc.get("kind") == "ExactlyOncePipeline":
                kubectl_apply(crds, k8s_namespace, doc)


@pytest.fixture(scope="module")
def validated_breaks(tmp_path_factory) -> tuple[list[Path], str]:
    """Every break in a file of its own, all checked by one `eopipe validate` (a process start
    each would cost a second or more apiece; the command checks each file on its own)."""
    d = tmp_path_factory.mktemp("breaks")
    files = []
    for i, (name, path, value) in enumerate(BREAKS):
        f = d / f"{i:02d}-{name}"
        f.write_text(yaml.safe_dump(_doc(name, **{path: value})))
        files.append(f)
    res = validate(*files)
    assert res.returncode == 1, res.stdout + res.stderr
    return files, res.stdout


@pytest.mark.parametrize("i", range(len(BREAKS)), ids=[f"{e}-{p}" for e, p, _ in BREAKS])
def test_validate_says_what_the_api_server_says(crds, k8s_namespace, validated_breaks, i):
    name, path, value = BREAKS[i]
    doc = _doc(name, **{path: value})
    files, stdout = validated_breaks
    f = files[i]
    messages = _messages("\n".join(lines_about(stdout, f)), f, doc)
    refused = kubectl_apply(crds, k8s_namespace, doc, check=False)
    assert refused.returncode != 0
    for message in messages:
        assert message in refused.stderr, f"validate: {message!r}\nAPI server: {refused.stderr}"


def _messages(stdout: str, f: Path, doc: dict) -> list[str]:
    """The problems of `FILE:LINE: ExactlyOncePipeline/NAME: <problem>` lines, all of that form."""
    prefix = re.compile(rf"{re.escape(str(f))}:[0-9]+: ExactlyOncePipeline/{re.escape(doc['metadata']['name'])}: ")
    lines = stdout.splitlines()
    assert lines and all(prefix.match(line) for line in lines), stdout
    return [prefix.sub("", line, count=1) for line in lines]


# Where validate says what to write instead: the API server refuses the same field, and of the key
# shorthand validate still gives the API server's words first.
HINTED = [
    ({"key": "json:id"}, "spec.dedup.key", "; write the key as an object: {from: jsonField, name: id}"),
    ({"window": "3 lightyears"}, "spec.dedup.window", None),
]


@pytest.mark.parametrize("dedup, field, hint", HINTED, ids=[h[1] for h in HINTED])
def test_what_validate_says_more_than_the_api_server(crds, k8s_namespace, tmp_path, dedup, field, hint):
    doc = _doc(**{"spec.dedup": dedup})
    f = tmp_path / "minimal.yaml"
    f.write_text(yaml.safe_dump(doc))
    res = validate(f)
    assert res.returncode == 1, res.stdout + res.stderr
    (message,) = _messages(res.stdout, f, doc)
    refused = kubectl_apply(crds, k8s_namespace, doc, check=False)
    assert refused.returncode != 0 and f"{field}: Invalid value: " in refused.stderr, refused.stderr
    if hint is not None:
        said, _, rest = message.partition("; ")
        assert "; " + rest == hint and said in refused.stderr, f"validate: {message!r}\nAPI server: {refused.stderr}"
