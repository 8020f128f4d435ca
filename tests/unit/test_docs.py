"""docs/: the CRD reference is generated from the spec model, and the docs point at files
and names that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eopipe.control import docgen
from eopipe.core import spec

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_crd_reference_is_generated_from_the_model():
    assert (DOCS / "crd-reference.md").read_text() == docgen.render(), \
        "docs/crd-reference.md is stale: .venv/bin/python -m eopipe.control.docgen > docs/crd-reference.md"


def test_crd_reference_covers_every_spec_field():
    text = (DOCS / "crd-reference.md").read_text()

    def fields(model, prefix=""):
        for name, f in model.model_fields.items():
            alias = f.alias or name
            yield alias
            for arg in [f.annotation, *getattr(f.annotation, "__args__", ())]:
                if isinstance(arg, type) and issubclass(arg, spec.Model):
                    yield from fields(arg)

    for alias in fields(spec.PipelineSpec):
        assert f"| `{alias}` |" in text, alias
    for rules in spec.CEL_RULES.values():
        for r in rules:
            assert r["message"] in text


@pytest.mark.parametrize("doc", ["concepts.md", "install.md", "crd-reference.md", "operations.md",
                                 "troubleshooting.md"])
def test_docs_exist_and_their_paths_exist(doc):
    text = (DOCS / doc).read_text()
    prose = re.sub(r"`[^`\n]*`", "", text)  # a code span (a field's pattern, say) holds no link
    for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", prose):
        assert (DOCS / link).exists(), f"{doc}: broken link {link}"
    for path in re.findall(r"`((?:examples|charts|crds|argocd|hack|tests)/[\w./-]*)`", text):
        assert (ROOT / path).exists(), f"{doc}: {path} does not exist"


def test_troubleshooting_lists_every_reason_the_operator_sets():
    text = (DOCS / "troubleshooting.md").read_text()
    src = (ROOT / "operator" / "eopipe" / "control" / "reconcile.py").read_text() + \
        (ROOT / "operator" / "eopipe" / "control" / "status.py").read_text()
    reasons = set(re.findall(r'Condition\("\w+", (?:True|False), "(\w+)"', src))
    reasons |= {"Paused", "Rebalancing", "Progressing"}
    for reason in reasons:
        assert f"`{reason}`" in text, reason


def test_documented_metrics_exist():
    text = (DOCS / "operations.md").read_text()
    src = "".join(p.read_text() for p in (ROOT / "operator" / "eopipe").rglob("*.py"))
    defined = {n.removesuffix("_total") for n in re.findall(r'(?:Counter|Gauge|Histogram)\(\s*"(eopipe_\w+)"', src)}
    named = set(re.findall(r"`(eopipe_\w+?)(?:_total)?(?:\{[^}]*\})?`", text))
    assert named, "operations.md names no metric"
    for name in named:
        assert name in defined, f"operations.md names {name}, which no code defines"
