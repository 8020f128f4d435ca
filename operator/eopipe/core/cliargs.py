"""Command-line plumbing shared by `eopipe` and its `dedup` worker: a parser whose usage errors
are one line on stderr with exit status 2, and argument types that say what they expect."""

from __future__ import annotations

import argparse
from typing import NoReturn

from eopipe.core.durations import parse_duration
from eopipe.core.keys import KeySpec

USAGE = 2  # exit status of a usage error, as argparse's


class Parser(argparse.ArgumentParser):
    """`eopipe <cmd>: error: <what>` and exit 2, instead of the usage dump; subparsers made by
    add_subparsers() are of the same class."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: error: {message}\n")


def _number(text: str, kind, what: str, ok) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def count(text: str) -> int:
    return _number(text, int, "a whole number >= 0", lambda v: v >= 0)


def positive_int(text: str) -> int:
    return _number(text, int, "a whole number >= 1", lambda v: v >= 1)


def whole_number_between(lo: int, hi: int):
    """An argparse type: a whole number from lo to hi."""
    return lambda text: _number(text, int, f"a whole number from {lo} to {hi}", lambda v: lo <= v <= hi)


def port(text: str) -> int:
    return _number(text, int, "a port number from 0 to 65535", lambda v: 0 <= v <= 65535)


def seconds(text: str) -> float:
    """Seconds > 0 (a number)."""
    return _number(text, float, "a number of seconds > 0", lambda v: v > 0)


def positive_float(text: str) -> float:
    return _number(text, float, "a number > 0", lambda v: v > 0)


def ratio(text: str) -> float:
    """A share in [0, 1): 1 would mean nothing but repeats."""
    return _number(text, float, "a ratio within [0, 1)", lambda v: 0 <= v < 1)


def share(text: str) -> float:
    return _number(text, float, "a ratio within [0, 1]", lambda v: 0 <= v <= 1)


def key_spec(text: str) -> KeySpec:
    try:
        return KeySpec.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def duration_seconds(text: str) -> float:
    """A Go duration (15m, 24h) in seconds."""
    try:
        return parse_duration(text).total_seconds()
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def key_value(text: str) -> tuple[str, str]:
    k, sep, v = text.partition("=")
    if not sep or not k:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return k, v
