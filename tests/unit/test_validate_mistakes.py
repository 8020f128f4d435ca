"""`eopipe validate` catches the mistakes people make in a pipeline manifest, each with the exact
line it prints: `FILE:LINE: KIND/NAME: <what the API server says>`, and where the API server's
words (a type, a regular expression) would not say what to write, what to write.

Most cases call `manifests.validate`; those marked CLI run `python -m eopipe.tools.cli validate`
as a subprocess, so the exit status and the streams are the real command's."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from eopipe.control import crd, policy
from eopipe.core.spec import WINDOW_MESSAGE, ZERO_WINDOW_MESSAGE
from eopipe.tools import manifests

ROOT = Path(__file__).resolve().parents[2]

# Lines 1-10; a case adds lines from 11 on (`dedup:` is line 11, its first field line 12).
BASE = """\
apiVersion: eopipe.dev/v1beta1
kind: ExactlyOncePipeline
metadata:
  name: p
spec:
  kafka:
    bootstrapServers: kafka:9092
  source:
    topic: events
    partitions: 4
"""
DURATION = "is not a duration: use Go duration syntax in h, m, s or ms, such as 15m, 24h or 168h"
KEY_TYPE = 'spec.dedup.key: Invalid value: "string": spec.dedup.key in body must be of type object: "string"'


def dedup(*fields: str) -> str:
    return BASE + "  dedup:\n" + "".join(f"    {f}\n" for f in fields)


def at(line: int, message: str) -> str:
    return f"{{f}}:{line}: ExactlyOncePipeline/p: {message}"


PROCESSING = BASE + """\
  processing:
    sql: SELECT * FROM events
    checkpoint: {pvc: {size: 1Gi}}
    serviceAccount: admin
  sink:
    kafka: {topic: out}
"""

# (id, how it runs, the file's text, the lines validate prints with {f} for the file's name)
CASES = [
    # The kind: a typo or another kind in eopipe's API group is a mistake, not "skipped".
    ("kind-typo", "cli", BASE.replace("kind: ExactlyOncePipeline", "kind: ExactlyOncePipline"),
     ['{f}:2: ExactlyOncePipline/p: no matches for kind "ExactlyOncePipline" in version "eopipe.dev/v1beta1": '
      "did you mean ExactlyOncePipeline?"]),
    ("kind-other-in-group", "fn", BASE.replace("kind: ExactlyOncePipeline", "kind: Pipeline"),
     ['{f}:2: Pipeline/p: no matches for kind "Pipeline" in version "eopipe.dev/v1beta1": '
      "did you mean ExactlyOncePipeline?"]),
    ("kind-lowercase-wrong-group", "fn",
     BASE.replace("eopipe.dev/v1beta1", "eopipe.io/v1").replace("kind: ExactlyOncePipeline",
                                                                 "kind: exactlyoncepipeline"),
     ['{f}:2: exactlyoncepipeline/p: no matches for kind "exactlyoncepipeline" in version "eopipe.io/v1": '
      "did you mean ExactlyOncePipeline (apiVersion eopipe.dev/v1beta1)?"]),
    ("kind-missing", "fn", BASE.replace("kind: ExactlyOncePipeline\n", ""),
     ["{f}:1: (no kind)/p: Object 'Kind' is missing: did you mean ExactlyOncePipeline?"]),
    ("version-wrong", "fn", BASE.replace("v1beta1", "v1"),
     [at(1, 'no matches for kind "ExactlyOncePipeline" in version "eopipe.dev/v1"')]),
    # A file that checks nothing: empty, only comments, or no pipeline in it.
    ("empty", "cli", "", ["{f}: no ExactlyOncePipeline in it"]),
    ("comments-only", "fn", "# apiVersion: eopipe.dev/v1beta1\n---\n", ["{f}: no ExactlyOncePipeline in it"]),
    ("no-pipeline", "fn", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
     ["{f}: ConfigMap/c: skipped, not an ExactlyOncePipeline", "{f}: no ExactlyOncePipeline in it"]),
    # The dedup window: above 0 and within the source's retention.
    ("window-zero", "fn", dedup("window: 0s"),
     [at(12, f'spec.dedup.window: Invalid value: "0s": {ZERO_WINDOW_MESSAGE}')]),
    ("window-zero-spelled-out", "fn", dedup("window: 0h0m"),
     [at(12, f'spec.dedup.window: Invalid value: "0h0m": {ZERO_WINDOW_MESSAGE}')]),
    ("window-over-retention", "fn", dedup("window: 200h"), [at(5, f"spec: Invalid value: {WINDOW_MESSAGE}")]),
    # Durations are Go durations; the answer says so, not the pattern.
    ("window-lightyears", "cli", dedup('window: "3 lightyears"'),
     [at(12, f'spec.dedup.window: "3 lightyears" {DURATION}')]),
    ("window-days", "fn", dedup("window: 2d"), [at(12, f'spec.dedup.window: "2d" {DURATION}')]),
    ("retention", "fn", BASE + "    retention: 1 week\n", [at(11, f'spec.source.retention: "1 week" {DURATION}')]),
    ("trigger", "fn", PROCESSING.replace("    serviceAccount: admin\n", "    trigger: 5 seconds\n"),
     [at(14, f'spec.processing.trigger: "5 seconds" {DURATION}')]),
    ("stabilization", "fn", dedup("autoscale: {maxReplicas: 2, scaleDownStabilization: 10min}"),
     [at(12, f'spec.dedup.autoscale.scaleDownStabilization: "10min" {DURATION}')]),
    ("lag-window", "fn", dedup("lagThreshold: 1000", "lagThresholdWindow: -5m"),
     [at(13, f'spec.dedup.lagThresholdWindow: "-5m" {DURATION}')]),
    # The CLI's key shorthand: the object form to write instead.
    ("key-json", "cli", dedup("key: json:id"),
     [at(12, f"{KEY_TYPE}; write the key as an object: {{from: jsonField, name: id}}")]),
    ("key-json-dotted-name", "cli", dedup("key: 'json:[\"a.b\", \"c\"]'"),
     [at(12, f"{KEY_TYPE}; write the key as an object: {{from: jsonField, path: [a.b, c]}}")]),
    ("key-header", "fn", dedup("key: header:X-Id"),
     [at(12, f"{KEY_TYPE}; write the key as an object: {{from: header, name: X-Id}}")]),
    ("key-record", "fn", dedup("key: key"), [at(12, f"{KEY_TYPE}; write the key as an object: {{from: recordKey}}")]),
    ("key-bare", "fn", dedup("key: id"),
     [at(12, f"{KEY_TYPE}; write the key as an object: {{from: recordKey}}, {{from: header, name: NAME}} "
             "or {from: jsonField, name: FIELD}")]),
    ("key-no-name", "fn", dedup("key: {from: header}"),
     [at(12, "spec.dedup.key: Invalid value: dedup.key.name is required when from is header or jsonField")]),
    # Not YAML: the file and the line, not PyYAML's `<unicode string>`.
    ("yaml-missing-colon", "cli", BASE + "  dedup\n    window: 1h\n",
     ["{f}:12: not YAML: could not find expected ':' at column 11 (while scanning a simple key at line 11, "
      "column 3)"]),
    ("yaml-unclosed-quote", "fn", dedup('window: "1h'),
     ['{f}:13: not YAML: found unexpected end of stream at column 1 (while scanning a quoted scalar at line 12, '
      "column 13)"]),
    ("yaml-tab", "fn", BASE + "\tdedup: {}\n",
     ["{f}:11: not YAML: while scanning for the next token: found character '\\t' that cannot start any token "
      "at column 1"]),
    # Fields the API server does not know, or given twice (YAML keeps the last silently).
    ("field-typo", "fn", dedup("windows: 1h"), [at(12, 'unknown field "spec.dedup.windows"')]),
    ("field-python-name", "fn", BASE.replace("bootstrapServers", "bootstrap_servers"),
     [at(7, 'unknown field "spec.kafka.bootstrap_servers"')]),
    ("field-twice", "fn", dedup("window: 1h") + "  dedup:\n    window: 2h\n", [at(13, 'duplicate field "spec.dedup"')]),
    ("name-bad", "fn", BASE.replace("name: p", "name: P_1"),
     ['{f}:4: ExactlyOncePipeline/P_1: metadata.name: Invalid value: "P_1": a lowercase RFC 1123 subdomain must '
      "consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
      "character (e.g. 'example.com', regex used for validation is "
      "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
      "{f}:4: ExactlyOncePipeline/P_1: metadata: Invalid value: metadata.name must start with a letter and hold only "
      "lowercase letters, digits and '-': it names the dedup Service, which must be a DNS-1035 label"]),
    # The tenant policy's refusals, at the field they name.
    ("policy", "fn", PROCESSING,
     [at(14, "spec.processing.serviceAccount: admin is not allowed by the tenant policy "
             "(tenantPolicy.spark.serviceAccounts); leave it out to run as <pipeline>-spark")]),
    # Lines count from the top of the file, in every document of it.
    ("second-document", "fn", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n" + dedup("window: 0s"),
     ["{f}: ConfigMap/c: skipped, not an ExactlyOncePipeline",
      at(16, f'spec.dedup.window: Invalid value: "0s": {ZERO_WINDOW_MESSAGE}')]),
]


def run_validate(path: Path) -> tuple[int, str]:
    out = io.StringIO()
    return manifests.validate([str(path)], out=out, tenant_policy=policy.TenantPolicy()), out.getvalue()


def run_cli(*paths: Path) -> tuple[int, str]:
    res = subprocess.run([sys.executable, "-m", "eopipe.tools.cli", "validate", *map(str, paths)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.stderr == ""
    return res.returncode, res.stdout


@pytest.mark.parametrize("how, text, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_mistake_is_caught_with_its_line(tmp_path, how, text, expected):
    f = tmp_path / "pipeline.yaml"
    f.write_text(text)
    status, out = (run_cli if how == "cli" else run_validate)(f)
    assert (status, out.splitlines()) == (1, [line.replace("{f}", str(f)) for line in expected])


def test_the_table_is_broad():
    assert len(CASES) >= 20 and len({c[0] for c in CASES}) == len(CASES)
    assert sum(c[1] == "cli" for c in CASES) >= 3


def test_the_base_manifest_is_valid(tmp_path):
    """Every case above is one mistake away from a valid manifest; the deprecated API version,
    still served with the same schema, is valid too, with the warning the API server gives."""
    f = tmp_path / "pipeline.yaml"
    for text in (BASE, dedup("window: 1h", "key: {from: jsonField, name: id}"),
                 PROCESSING.replace("    serviceAccount: admin\n", "")):
        f.write_text(text)
        assert run_validate(f) == (0, f"{f}: ExactlyOncePipeline/p: valid\n")
    f.write_text(BASE.replace("eopipe.dev/v1beta1", "eopipe.dev/v1alpha1"))
    (warning,) = [v["deprecationWarning"] for v in crd.crd()["spec"]["versions"] if v.get("deprecated")]
    assert run_validate(f) == (0, f"{f}: ExactlyOncePipeline/p: Warning: {warning}\n"
                                  f"{f}: ExactlyOncePipeline/p: valid\n")


def test_of_several_files_the_one_without_a_pipeline_is_the_mistake(tmp_path):
    good, empty = tmp_path / "good.yaml", tmp_path / "empty.yaml"
    good.write_text(BASE)
    empty.write_text("")
    assert run_cli(good, empty) == (1, f"{good}: ExactlyOncePipeline/p: valid\n{empty}: no ExactlyOncePipeline in it\n")
    assert run_cli(good, good)[0] == 0


def test_stdin_is_named_and_lined():
    res = subprocess.run([sys.executable, "-m", "eopipe.tools.cli", "validate", "-"], input=dedup("window: 0s"),
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (res.returncode, res.stdout) == (
        1, f'<stdin>:12: ExactlyOncePipeline/p: spec.dedup.window: Invalid value: "0s": {ZERO_WINDOW_MESSAGE}\n')
