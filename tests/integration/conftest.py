"""Fixtures of the chart tests (test_chart.py, test_alerts.py, test_install_doc.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("helm", "kubeconform", "promtool")


@pytest.fixture(scope="session")
def tools() -> dict[str, Path]:
    """helm, kubeconform and promtool, built once from the Go module proxy and cached
    (hack/build-tools.sh, idempotent)."""
    res = subprocess.run(["bash", str(ROOT / "hack" / "build-tools.sh"), *TOOLS], capture_output=True,
                         text=True, timeout=1800)
    assert res.returncode == 0, res.stderr
    bin_dirs = [Path(line) for line in res.stdout.split()]
    assert len(bin_dirs) == len(TOOLS), res.stdout
    return {name: d / name for name, d in zip(TOOLS, bin_dirs)}


@pytest.fixture(scope="session")
def helm_env(tmp_path_factory) -> dict[str, str]:
    """helm's own state (repositories, cache) kept out of $HOME."""
    d = tmp_path_factory.mktemp("helm-home")
    return {**os.environ, "HELM_CACHE_HOME": str(d / "cache"), "HELM_CONFIG_HOME": str(d / "config"),
            "HELM_DATA_HOME": str(d / "data")}
