"""Every shell block of README.md, docs/*.md and the chart's README is either run by a test or
marked as an example that is not run.

The convention: a block a test runs is fenced ```sh and sits in a section that RUN names,
with the test that runs it (through tests/helpers/docs.sh_blocks, which reads only plain
```sh blocks); any other shell block is fenced ```sh example. Output, tables and diagrams go
in fences without a language."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.docs import sh_blocks

ROOT = Path(__file__).resolve().parents[2]
SHELLS = {"sh", "bash", "shell", "console", "zsh"}
# (doc, `## ` section) -> the test file that runs its ```sh blocks.
RUN = {
    ("docs/install.md", "## Helm"): "tests/e2e/test_node_tier.py",
    ("docs/install.md", "## kubectl (without a Helm release)"): "tests/integration/test_install_doc.py",
    ("docs/install.md", "## Upgrading the API version"): "tests/integration/test_api_versions.py",
    ("docs/operations.md", "## Checking manifests before they are applied"): "tests/unit/test_doc_blocks.py",
}
DOCS = ["README.md", "charts/eopipe/README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def shell_blocks(text: str) -> list[tuple[str, str, int]]:
    """(info string, the `## ` section it is in, line) of each shell fence."""
    out, section, fenced = [], "", False
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not fenced and line.startswith("## "):
            section = line
        if stripped.startswith("```"):
            info = stripped[3:].strip()
            if not fenced and info.split(" ")[0] in SHELLS:
                out.append((info, section, n))
            fenced = not fenced if not info or not fenced else fenced
    return out


def problems(doc: str, text: str, run=RUN) -> list[str]:
    out = []
    for info, section, line in shell_blocks(text):
        words = info.split()
        if words[1:] == ["example"]:
            continue
        if info == "sh" and (doc, section) in run:
            continue
        out.append(f"{doc}:{line}: a ```{info} block that no test runs: fence it ```sh example, or run it "
                   "from a test and name its section in RUN")
    return out


@pytest.mark.parametrize("text, expected", [
    ("```sh\nls\n```\n", ["d.md:1"]),
    ("```bash\nls\n```\n", ["d.md:1"]),
    ("  ```sh\n  ls\n  ```\n", ["d.md:1"]),                     # indented, in a list
    ("```sh example\nls\n```\n", []),
    ("```\n$ ls\n```\n```yaml\na: 1\n```\n", []),
    ("## Run\n```sh\nls\n```\n## Other\n```sh\nls\n```\n", ["d.md:6"]),
    ("## Run\n```sh bash\nls\n```\n", ["d.md:2"]),
])
def test_the_convention(text, expected):
    assert [p.split(": ")[0] for p in problems("d.md", text, {("d.md", "## Run"): "x"})] == expected


@pytest.mark.parametrize("doc", DOCS)
def test_every_shell_block_is_run_or_marked(doc):
    assert problems(doc, (ROOT / doc).read_text()) == []


@pytest.mark.parametrize("doc, section", RUN)
def test_the_named_tests_run_those_sections(doc, section):
    runner = (ROOT / RUN[doc, section]).read_text()
    assert section in runner and f'sh_blocks("{Path(doc).name}"' in runner, RUN[doc, section]


def test_the_manifest_checks_of_operations_md_run():
    """docs/operations.md's `eopipe validate` and `eopipe render` commands, as written, from the
    repository's root with the virtualenv's eopipe: each exits 0."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    commands = [c for block in sh_blocks("operations.md", "## Checking manifests before they are applied")
                for c in block]
    assert len(commands) == 3
    for command in commands:
        res = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, f"{command}: {res.stderr}"
