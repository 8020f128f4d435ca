"""One home per default: `eopipe dedup`'s options default to WorkerConfig's fields, and those to
core/defaults (or core/names) where the control plane relies on the same value."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from eopipe.core import defaults, names
from eopipe.dedup.cli import add_parser, config_from_args
from eopipe.dedup.config import WorkerConfig

REQUIRED = ["dedup", "--bootstrap", "k:9092", "--source-topic", "s", "--output-topic", "o", "--pipeline", "p",
            "--partitions", "0"]


def parse(argv):
    ap = argparse.ArgumentParser()
    add_parser(ap.add_subparsers())
    return ap.parse_args(argv)


@pytest.fixture
def clean_env(monkeypatch):
    for k in ("EOPIPE_STATE_DIR", "EOPIPE_HANDOFF_TIMEOUT_SECONDS", "POD_NAMESPACE", "EOPIPE_TOKEN",
              "EOPIPE_TOKEN_FILE", "POD_IP"):
        monkeypatch.delenv(k, raising=False)


def test_the_command_line_defaults_are_the_configs(clean_env):
    got = config_from_args(parse(REQUIRED))
    want = WorkerConfig(bootstrap="k:9092", source_topic="s", output_topic="o", pipeline="p", partitions=[0])
    assert got == want


@pytest.mark.parametrize("field, value", [
    ("http_port", names.DEDUP_HTTP_PORT),
    ("state_dir", Path(defaults.STATE_DIR)),
    ("window_seconds", defaults.WINDOW_SECONDS),
])
def test_shared_defaults_come_from_core(field, value):
    cfg = WorkerConfig(bootstrap="k:9092", source_topic="s", output_topic="o", pipeline="p", partitions=[0])
    assert getattr(cfg, field) == value


def test_the_help_states_the_configs_defaults(clean_env, capsys):
    with pytest.raises(SystemExit):
        parse(["dedup", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for said in ("(default 24h)", "(default 4)", "(default 8080;", "(default 100)", "(default 20000)",
                 "default 120)", "(default 60)"):
        assert said in text
