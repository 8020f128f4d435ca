"""The `eopipe` command tells the truth: its version, one-line usage errors with exit status 2,
help for every option without internal references, and verify's timeout over the whole run."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import socket
import subprocess
import sys
import time

import pytest

from eopipe.tools.cli import build_parser

EOPIPE = [sys.executable, "-m", "eopipe.tools.cli"]
KAFKA = ["--bootstrap", "127.0.0.1:9"]
DEDUP = ["dedup", *KAFKA, "--source-topic", "a", "--output-topic", "b", "--pipeline", "p"]
LOAD = ["load", *KAFKA, "--topic", "t"]
VERIFY = ["verify", *KAFKA, "--source", "a", "--output", "b"]


def eopipe(*args: str, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*EOPIPE, *args], capture_output=True, text=True, timeout=timeout, **kw)


def test_version_is_the_installed_distributions():
    res = eopipe("--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"eopipe {importlib.metadata.version('eopipe')}\n"


@pytest.mark.parametrize("args, says", [
    ([*VERIFY, "--key", "id"], "expected 'key', 'header:NAME' or 'json:FIELD'"),
    ([*DEDUP, "--key", "json:"], "expected 'key', 'header:NAME' or 'json:FIELD'"),
    ([*LOAD, "--count", "10", "--dup-ratio", "3"], "within [0, 1)"),
    ([*LOAD, "--count", "10", "--dup-ratio", "1"], "within [0, 1)"),
    ([*LOAD, "--count", "-5"], ">= 0"),
    ([*LOAD, "--count", "5", "--poison", "-1"], ">= 0"),
    ([*LOAD, "--count", "5", "--rate", "-100"], "> 0"),
    ([*LOAD, "--count", "5", "--kafka-config", "linger.ms"], "expected KEY=VALUE"),
    ([*LOAD, "--count", "5", "--kafka-config", "lingr.ms=5"], 'No such configuration property: "lingr.ms"'),
    ([*VERIFY, "--timeout", "-1"], "> 0"),
    ([*DEDUP, "--partitions", "5-2"], "the range 5-2 is empty"),
    ([*DEDUP, "--partitions", "-1"], "expected partition numbers"),
    ([*DEDUP, "--segments", "0"], ">= 1"),
    ([*DEDUP, "--http-port", "70000"], "0 to 65535"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "required: COMMAND"),
    (["verify", "--source", "a"], "required: --bootstrap, --output"),
    (["load", *KAFKA, "--topic", "t"], "required: --count"),
    (["validate"], "required: FILE"),
    (["validate", "/nonexistent/pipeline.yaml"], "cannot read /nonexistent/pipeline.yaml"),
    (["render", "/nonexistent/pipeline.yaml"], "cannot read /nonexistent/pipeline.yaml"),
    (["restore", "examples/payments.yaml"], "required: --namespace"),
    (["restore", "/nonexistent/pipeline.yaml", "--namespace", "n"], "cannot read /nonexistent/pipeline.yaml"),
    (["restore", "charts/eopipe/values.yaml", "--namespace", "n"], "0 ExactlyOncePipelines in it"),
    (["restore", "examples/payments.yaml", "--namespace", "n"], "give --from-namespace"),
    (["restore", "s3://Bad/x", "--namespace", "n"], "'Bad' is not a bucket name"),
    ([*DEDUP, "--partitions", "0", "--identity", "payments"], "expected NAMESPACE/PIPELINE"),
    ([*DEDUP, "--partitions", "0", "--kafka-config", "linger.ms=50", "--kafka-config", "isolation.level=read_uncommitted"],
     "--kafka-config isolation.level, linger.ms: set by the worker itself"),
])
def test_usage_errors_are_one_line_and_exit_2(args, says):
    res = eopipe(*args, timeout=20)  # a worker or load run that starts instead would time out
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert res.stdout == ""
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr and "usage:" not in res.stderr, res.stderr
    assert re.match(r"eopipe( \w+)?: error: ", res.stderr), res.stderr
    assert says in res.stderr, res.stderr


def _parsers(parser: argparse.ArgumentParser, path: str = "eopipe"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


INTERNAL = re.compile(r"DESIGN|design\.md|#\d+|\bissue\b|\beopipe\.\w+\.\w+|\.py\b|TODO|FIXME", re.IGNORECASE)


def test_every_option_has_help_without_internal_references():
    parsers = dict(_parsers(build_parser()))
    assert {"eopipe load", "eopipe verify", "eopipe operator", "eopipe validate", "eopipe render",
            "eopipe crd", "eopipe dedup"} <= set(parsers)
    missing, internal = [], []
    for path, parser in parsers.items():
        texts = [parser.description or "", parser.epilog or ""]
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
            texts.append(action.help or "")
        internal += [f"{path}: {t}" for t in texts if INTERNAL.search(t)]
    assert not missing, f"options without help: {missing}"
    assert not internal, internal


def test_verify_help_documents_the_exit_statuses():
    text = eopipe("verify", "--help").stdout
    for status, meaning in [("0", "exactly once"), ("1", "keys lost"), ("2", "usage"), ("3", "incomplete")]:
        assert re.search(rf"^\s+{status}\s+{meaning}", text, re.MULTILINE), text


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_verify_timeout_bounds_the_whole_run():
    """Kafka unreachable: no 30 s metadata wait and no traceback, but exit status 3 within the
    timeout and one line saying what is incomplete."""
    t0 = time.monotonic()
    res = eopipe("verify", "--bootstrap", f"127.0.0.1:{_closed_port()}", "--source", "src", "--output", "out",
                 "--timeout", "3", timeout=60)
    took = time.monotonic() - t0
    assert res.returncode == 3, (res.returncode, res.stderr)
    assert took < 15, took
    assert res.stderr.startswith("eopipe verify: incomplete after 3s: topic src") and res.stderr.count("\n") == 1, \
        res.stderr


def test_load_stops_cleanly_on_sigterm(monkeypatch, capsys):
    """SIGTERM sets the load's stop event: it returns and prints what it sent, exit 0."""
    import os
    import signal

    import eopipe.tools.loadgen as loadgen

    def fake_run_load(*_a, stop, **_kw):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before kill returns
        return {"records": 7 if stop.is_set() else -1, "unique": 7, "duplicates": 0, "wrong_partition": 0,
                "poison": 0, "seconds": 0.1}
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(loadgen, "run_load", fake_run_load)
    try:
        args = build_parser().parse_args([*LOAD, "--count", "1000000", "--json"])
        assert args.func(args) == 0
    finally:
        signal.signal(signal.SIGTERM, before)
    assert '"records": 7' in capsys.readouterr().out
