"""Example manifests with changes, for the tests of admission, `eopipe validate` and `eopipe render`."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str = "minimal.yaml") -> dict:
    """The first document of examples/<name>."""
    return yaml.safe_load((EXAMPLES / name).read_text())


def changed(doc: dict, **paths) -> dict:
    """A copy of `doc` with each dotted path (`spec.dedup.window`; a number indexes a list:
    `spec.containers.0.image`) set to its value, or removed if the value is None."""
    doc = copy.deepcopy(doc)
    for path, value in paths.items():
        *parents, last = path.split(".")
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
        last = int(last) if isinstance(node, list) else last
        if value is None:
            del node[last]
        else:
            node[last] = copy.deepcopy(value)
    return doc


def differences(want, live, path=""):
    """Where `live` differs from `want` in a field `want` sets (the API server adds defaults)."""
    if isinstance(want, dict) and isinstance(live, dict):
        for k, v in want.items():
            yield from differences(v, live.get(k), f"{path}.{k}")
    elif isinstance(want, list) and isinstance(live, list) and len(want) == len(live):
        for i, (a, b) in enumerate(zip(want, live)):
            yield from differences(a, b, f"{path}[{i}]")
    elif want != live:
        yield f"{path}: rendered {want!r}, applied {live!r}"


def validate(*paths: Path) -> subprocess.CompletedProcess:
    """`eopipe validate` of these files in one process (it checks each file on its own)."""
    return subprocess.run([sys.executable, "-m", "eopipe.tools.cli", "validate", *map(str, paths)],
                          capture_output=True, text=True, timeout=60)


def lines_about(stdout: str, path: Path) -> list[str]:
    """What one run of `eopipe validate` over many files said of `path`: at least one line, and
    none that calls it valid."""
    said = [line for line in stdout.splitlines() if line.startswith(f"{path}:")]
    assert said and not any(line.endswith(": valid") for line in said), stdout
    return said
