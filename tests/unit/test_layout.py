"""The layout keeps the architecture (docs/design.md#architecture): which package may import which,
modules small enough to read in one sitting, and the harness and tools kept apart from tests."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "operator" / "eopipe"
MAX_LINES = 420  # "about 400": a module an engineer reads in one sitting

# package -> the eopipe packages it must not import
FORBIDDEN = {
    "core": {"control", "dedup", "tools"},
    "control": {"dedup", "tools"},
    "dedup": {"control", "tools"},
}


def imported_modules(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_planes_do_not_import_each_other(package):
    bad = []
    for path in sorted((PKG / package).rglob("*.py")):
        for mod in imported_modules(path):
            parts = mod.split(".")
            if parts[0] == "eopipe" and len(parts) > 1 and parts[1] in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(REPO)} imports {mod}")
    assert not bad, "\n".join(bad)


def test_modules_are_small_enough_to_read():
    long = {str(p.relative_to(REPO)): n for p in sorted(PKG.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


@pytest.mark.parametrize("folder", ["hack", "bench", "localenv", "operator", "spark_app"])
def test_nothing_outside_tests_imports_tests(folder):
    bad = [f"{p.relative_to(REPO)} imports {m}" for p in sorted((REPO / folder).rglob("*.py"))
           for m in imported_modules(p) if m == "tests" or m.startswith("tests.")]
    assert not bad, "\n".join(bad)


def test_tests_hold_tests_only():
    """Fixtures' service code lives in localenv/; tests/ holds tests, their helpers and conftest."""
    allowed_dirs = {"unit", "integration", "e2e", "soak", "harness", "helpers"}
    for p in sorted((REPO / "tests").rglob("*")):
        rel = p.relative_to(REPO / "tests")
        if "__pycache__" in rel.parts or p.is_dir():
            continue
        if len(rel.parts) == 1:
            assert rel.name in {"__init__.py", "conftest.py"}, rel
            continue
        assert rel.parts[0] in allowed_dirs, rel
        if rel.parts[0] != "helpers" and p.suffix == ".py":
            assert rel.name.startswith("test_") or rel.name in {"__init__.py", "conftest.py"}, rel
