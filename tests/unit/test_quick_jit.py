"""localenv.quick_jit: C1 only for the harness's JVMs exactly when EOPIPE_QUICK_JIT is 1."""

import pytest

from localenv import quick_jit


@pytest.mark.parametrize("value, want", [
    ("1", ["-XX:TieredStopAtLevel=1"]),
    ("0", []),
    ("", []),
    (None, []),  # benchmarks and make demo: full JIT
])
def test_quick_jit(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv("EOPIPE_QUICK_JIT", raising=False)
    else:
        monkeypatch.setenv("EOPIPE_QUICK_JIT", value)
    assert quick_jit() == want
