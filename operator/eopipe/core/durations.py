"""Durations and timestamps as the Kubernetes API writes them.

Durations are Go duration strings, what the CRD's CEL `duration()` parses ("90s", "15m",
"1h30m"); no library parses exactly that grammar, so a regular expression does, the same one
the CRD schema carries. Timestamps are RFC 3339 in UTC to the second, as in conditions.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> timedelta:
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"bad duration {text!r}: use Go duration syntax such as '90s', '15m' or '24h'")
    return timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(text)))


def duration_ms(text: str) -> int:
    return int(parse_duration(text).total_seconds() * 1000)


def format_duration(seconds: float) -> str:
    """Seconds as a Go duration, whole seconds: 86400 -> "24h", 5430 -> "1h30m30s", 0 -> "0s"."""
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (sec, "s")) if v) or "0s"


def rfc3339(ms: int | None = None) -> str:
    """`ms` since the epoch (default: now) as 2026-01-02T03:04:05Z."""
    ms = int(time.time() * 1000) if ms is None else ms
    return datetime.fromtimestamp(ms // 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
