"""`eopipe validate` says what the API server would say about a manifest; `eopipe render` prints
what the operator would apply for it. (Against the real API server and operator:
tests/integration/test_admission.py and tests/e2e/test_operator.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from eopipe.control.builders.pipeline import objects
from eopipe.control import topics as topics_plan
from eopipe.control.builders import checkpoint
from eopipe.control.builders.access import token_problem, token_secret
from eopipe.control.builders.topics import desired_topics
from eopipe.tools import manifests
from eopipe.core import manifest
from eopipe.core.assignment import Assignment, assign
from eopipe.core.names import MAX_PIPELINE_NAME, Names
from eopipe.core.spec import IMMUTABLE, WINDOW_MESSAGE, PipelineSpec, immutable_changes
from tests.helpers.manifests import EXAMPLES, changed, example, lines_about

ROOT = Path(__file__).resolve().parents[2]
EOPIPE = [sys.executable, "-m", "eopipe.tools.cli"]


def eopipe(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*EOPIPE, *args], capture_output=True, text=True, input=input, timeout=60, cwd=ROOT)


def broken(doc: dict, path: str, value) -> dict:
    return changed(doc, **{path: value})


def test_validate_passes_the_examples():
    pipelines = sorted(str(p.relative_to(ROOT)) for p in EXAMPLES.glob("*.yaml") if "argocd" not in p.name)
    res = eopipe("validate", *pipelines)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert "examples/payments.yaml: ExactlyOncePipeline/payments: valid" in lines
    assert "examples/minimal.yaml: ExactlyOncePipeline/minimal: valid" in lines
    # A file with no pipeline in it is a mistake (the wrong file given), even beside valid ones.
    res = eopipe("validate", "examples/minimal.yaml", "examples/argocd-application.yaml")
    lines = res.stdout.splitlines()
    assert res.returncode == 1 and lines[0] == "examples/minimal.yaml: ExactlyOncePipeline/minimal: valid"
    assert "examples/argocd-application.yaml: Application/eopipe-operator: skipped, not an ExactlyOncePipeline" \
        in lines
    assert lines[-1] == "examples/argocd-application.yaml: no ExactlyOncePipeline in it"


LONG = "p" * (MAX_PIPELINE_NAME + 1)


BROKEN = [
    ("spec.dedup", {"window": "200h"}, f"spec: Invalid value: {WINDOW_MESSAGE}"),
    ("spec.source.topic", "bad topic!",
     "spec.source.topic: Invalid value: \"bad topic!\": spec.source.topic in body should match "
     "'^[a-zA-Z0-9._-]{1,249}$'"),
    ("spec.source.partitions", None, "spec.source.partitions: Required value"),
    ("spec.source.partitions", 0,
     "spec.source.partitions: Invalid value: 0: spec.source.partitions in body should be greater than or equal to 1"),
    ("spec.source.partitions", "4",
     'spec.source.partitions: Invalid value: "string": spec.source.partitions in body must be of type integer: '
     '"string"'),
    ("spec.source.partitioner", "fnv",
     'spec.source.partitioner: Unsupported value: "fnv": supported values: "murmur2", "crc32"'),
    ("spec.dedup", {"key": {"from": "header"}},
     "spec.dedup.key: Invalid value: dedup.key.name is required when from is header or jsonField"),
    ("spec.surprise", 1, 'unknown field "spec.surprise"'),
    ("metadata.name", LONG, f"metadata: Invalid value: metadata.name may have at most {MAX_PIPELINE_NAME} characters"),
    ("metadata.name", "2fast", "metadata: Invalid value: metadata.name must start with a letter"),
    ("metadata.name", None, "metadata.name: Required value: name or generateName is required"),
    ("metadata.name", "Bad_Name", 'metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain'),
    ("apiVersion", "eopipe.dev/v1", 'no matches for kind "ExactlyOncePipeline" in version "eopipe.dev/v1"'),
]


@pytest.fixture(scope="module")
def validated_broken(tmp_path_factory) -> tuple[list[Path], str]:
    """Each broken manifest in a file of its own, all checked by one `eopipe validate` (a process
    start apiece cost about a second each; the command checks each file on its own)."""
    d = tmp_path_factory.mktemp("broken")
    files = [d / f"{i:02d}-pipeline.yaml" for i in range(len(BROKEN))]
    for f, (path, value, _) in zip(files, BROKEN):
        f.write_text(yaml.safe_dump(broken(example(), path, value)))
    res = eopipe("validate", *map(str, files))
    assert res.returncode == 1, res.stdout + res.stderr
    return files, res.stdout


@pytest.mark.parametrize("i", range(len(BROKEN)), ids=[f"{p}-{v}-{m}" for p, v, m in BROKEN])
def test_validate_says_what_the_api_server_says(validated_broken, i):
    path, value, message = BROKEN[i]
    files, stdout = validated_broken
    f = files[i]
    said = lines_about(stdout, f)
    name = value if path == "metadata.name" and value else "minimal" if path != "metadata.name" else "(document 1)"
    # FILE:LINE: as a compiler says it, so an editor opens the file there.
    prefix = re.compile(rf"{re.escape(str(f))}:[0-9]+: ExactlyOncePipeline/{re.escape(name)}: ")
    assert any(prefix.match(line) and line[prefix.match(line).end():].startswith(message) for line in said), said


def test_validate_reads_stdin_and_every_document():
    text = "\n---\n".join(yaml.safe_dump(d) for d in [
        example(), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
        broken(example("payments.yaml"), "spec.dedup.window", "200h")])
    res = eopipe("validate", "-", input=text)
    assert res.returncode == 1
    assert res.stdout.splitlines() == [
        "<stdin>: ExactlyOncePipeline/minimal: valid",
        "<stdin>: ConfigMap/x: skipped, not an ExactlyOncePipeline",
        f"<stdin>:23: ExactlyOncePipeline/payments: spec: Invalid value: {WINDOW_MESSAGE}"]  # the spec: line


def test_immutable_changes_say_how_to_migrate():
    old = PipelineSpec.model_validate(example("payments.yaml")["spec"])
    assert immutable_changes(old, old) == []
    assert immutable_changes(old, old.model_copy(update={"source": old.source.model_copy(
        update={"partitions": 16})})) == []
    new = PipelineSpec.model_validate(broken(example("payments.yaml"), "spec.dedup.key", {"from": "header", "name": "id"})
                                      ["spec"])
    assert immutable_changes(old, new) == [IMMUTABLE[("dedup", "key")]]
    for path, message in IMMUTABLE.items():
        assert message.startswith(".".join(path) + " is immutable: ") and "create a new pipeline" in message


def _docs(res: subprocess.CompletedProcess) -> list[dict]:
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d is not None]


def test_render_prints_what_the_operator_applies():
    docs = _docs(eopipe("render", "examples/payments.yaml", "--namespace", "team-a",
                        "--image", "reg/eopipe:1", "--spark-image", "reg/spark:1"))
    assert [d["kind"] for d in docs] == [
        "Secret", "PersistentVolumeClaim", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Service",
        "PodDisruptionBudget", "NetworkPolicy", "StatefulSet", "ServiceAccount", "RoleBinding", "SparkApplication",
        "KafkaTopics"]
    assert {d["metadata"]["namespace"] for d in docs} == {"team-a"}
    # The operator's own builders, with the assignment its first pass publishes, and the Settings
    # of the operator the chart installs with its defaults (its NetworkPolicy peers).
    names = Names("team-a", "payments", PipelineSpec.model_validate(example("payments.yaml")["spec"]))
    first = Assignment(1, assign(8, ["payments-dedup-0", "payments-dedup-1"]), partition_count=8)
    chart = manifests.chart_settings(image="reg/eopipe:1", spark_image="reg/spark:1")
    assert docs[0] == token_secret(names, manifests.TOKEN_PLACEHOLDER) and docs[1] == checkpoint.claim(names)
    assert docs[2:-1] == objects(names, chart, first, 2)
    assert json.loads(docs[2]["data"]["assignment.json"])["generation"] == 1
    # The placeholder is no token: the operator refuses it if the output is applied as it is.
    assert token_problem(docs[0]) is not None
    policy = docs[8]["spec"]["ingress"]
    assert policy[0]["from"][1]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "eopipe-system"}}
    assert policy[1]["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    sts, app = docs[9], docs[12]
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/eopipe:1"
    assert app["spec"]["image"] == "reg/spark:1"
    topics = docs[-1]["topics"]
    assert [(t["name"], t["partitions"], t["replicationFactor"], t["config"]) for t in topics] == \
        [(t.name, t.partitions, t.replication_factor, t.config)
         for t in (topics_plan.replicated(t, 3) for t in desired_topics(names))]  # as on three brokers
    assert {(t["replicationFactor"], t["config"]["min.insync.replicas"]) for t in topics} == {(3, "2")}


@pytest.mark.parametrize("args, kinds, image", [
    ([], ["Secret", "NetworkPolicy"], f"eopipe:{version('eopipe')}"),  # the chart's tag, never latest
    (["--no-network-policy"], ["Secret"], f"eopipe:{version('eopipe')}"),
    (["--image", "reg/e:2"], ["Secret", "NetworkPolicy"], "reg/e:2"),
])
def test_render_follows_the_chart_defaults(args, kinds, image):
    docs = _docs(eopipe("render", "examples/minimal.yaml", *args))
    assert [d["kind"] for d in docs if d["kind"] in ("Secret", "NetworkPolicy", "PersistentVolumeClaim")] == kinds
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == image != "eopipe:latest"


def test_render_topics_follow_the_broker_count():
    (topics,) = [d for d in _docs(eopipe("render", "examples/minimal.yaml", "--brokers", "1"))
                 if d["kind"] == "KafkaTopics"]
    assert {(t["replicationFactor"], t["config"]["min.insync.replicas"]) for t in topics["topics"]} == {(1, "1")}


def test_render_a_dedup_only_and_a_paused_pipeline(tmp_path):
    docs = _docs(eopipe("render", "examples/minimal.yaml"))
    assert "SparkApplication" not in {d["kind"] for d in docs}
    assert docs[0]["metadata"]["namespace"] == "default"
    f = tmp_path / "paused.yaml"
    f.write_text(yaml.safe_dump(broken(example(), "spec.paused", True)))
    sts = next(d for d in _docs(eopipe("render", str(f))) if d["kind"] == "StatefulSet")
    assert sts["spec"]["replicas"] == 0


def test_render_refuses_an_invalid_manifest(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(broken(example("payments.yaml"), "spec.dedup.window", "200h")))
    res = eopipe("render", str(f))
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == f"{f}: ExactlyOncePipeline/payments: spec: Invalid value: {WINDOW_MESSAGE}\n"


def test_problems_of_a_document():
    with pytest.raises(manifest.Invalid) as e:
        manifest.parse(broken(broken(example(), "spec.source.partitions", 0), "metadata.name", LONG))
    # As the API server: a schema error means no CEL rule (the name's length) was evaluated.
    assert e.value.problems == ["spec.source.partitions: Invalid value: 0: spec.source.partitions in body "
                                "should be greater than or equal to 1"]
    p = manifest.parse(broken(example(), "metadata.namespace", "team-a"))
    assert (p.name, p.namespace, p.spec.source.partitions) == ("minimal", "team-a", 4)
