"""The import contracts in pyproject.toml ([tool.importlinter]) hold, and each catches a breach:
a layer imported upward or sideways, the harness imported by the product, a cycle."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'operator'}"}
    return subprocess.run([str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_layer_contracts_hold():
    r = lint(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("core/names.py", "import eopipe.control.status", "Planes are layered"),
    ("dedup/txn.py", "from eopipe.control import status", "Planes are layered"),
    ("control/status.py", "import eopipe.dedup.txn", "Planes are layered"),
    ("control/status.py", "import localenv", "imports no harness"),
    ("dedup/txn.py", "import eopipe.dedup.worker", "No import cycles"),
    ("control/settings.py", "from eopipe.control.reconcile import reconcile", "No import cycles"),
])
def test_a_breach_is_caught(tmp_path, module, line, contract):
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    shutil.copytree(REPO / "operator" / "eopipe", tmp_path / "operator" / "eopipe",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for pkg in ("localenv", "bench", "tests", "spark_app"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    target = tmp_path / "operator" / "eopipe" / module
    target.write_text(line + "\n" + target.read_text())
    r = lint(tmp_path)
    assert r.returncode != 0
    broken = [ln for ln in r.stdout.splitlines() if ln.endswith("BROKEN")]
    assert any(contract in ln for ln in broken), r.stdout
