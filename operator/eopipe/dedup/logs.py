"""Structured logs: one JSON object per line on stderr."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage()}
        fields = getattr(record, "fields", None)
        if fields:
            doc.update(fields)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def event(logger: logging.Logger, level: int, msg: str, **fields) -> None:
    """logger.log with structured fields: event(log, INFO, "committed", partition=3)."""
    logger.log(level, msg, extra={"fields": fields})


# librdkafka logs every failed connect of every client: one broker restart made a worker of
# 2 partitions (4 clients, reconnecting every 100 ms-10 s) write 130 "Connection refused"
# lines. Its lines are summarized: the first of a kind passes, repeats are counted for
# REPEAT_WINDOW_S and the first line after the window carries their count.
REPEAT_WINDOW_S = 30.0
_ADDR = re.compile(r"\d+(?:\.\d+)+(?::\d+)?|#\d+|\d+")


def kind(fac: str, text: str) -> tuple[str, str]:
    """What makes two librdkafka lines the same kind: the facility and the text with numbers
    (addresses, ports, broker ids, client numbers, milliseconds) blanked."""
    return fac, _ADDR.sub("N", text)


class Summarizer:
    """Pure: (time, facility, text) in; the text to log (with "(N similar lines in Xs
    suppressed)" appended after a quiet count) or None to drop it."""

    def __init__(self, window: float = REPEAT_WINDOW_S):
        self.window = window
        self._open: dict[tuple[str, str], tuple[float, int]] = {}  # kind -> (passed at, dropped)

    def line(self, now: float, fac: str, text: str) -> str | None:
        k = kind(fac, text)
        seen = self._open.get(k)
        if seen is not None and now - seen[0] < self.window:
            self._open[k] = (seen[0], seen[1] + 1)
            return None
        self._open[k] = (now, 0)
        if seen is not None and seen[1]:
            return f"{text} ({seen[1]} similar lines in the last {now - seen[0]:.0f}s suppressed)"
        return text


class RdkafkaFilter(logging.Filter):
    """On the "rdkafka" logger: confluent-kafka logs each line as
    log(level, "%s [%s] %s", facility, client, text); summarized by a Summarizer."""

    def __init__(self, window: float = REPEAT_WINDOW_S):
        super().__init__()
        self._sum = Summarizer(window)
        self._lock = threading.Lock()   # librdkafka's threads log concurrently

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not (isinstance(args, tuple) and len(args) == 3):
            return True
        fac, client, text = (str(a) for a in args)
        with self._lock:
            out = self._sum.line(record.created, fac, text)
        if out is None:
            return False
        record.args = (fac, client, out)
        return True


def rdkafka_logger() -> logging.Logger:
    """The logger given to every client, summarized (the filter installed once)."""
    lg = logging.getLogger("rdkafka")
    if not any(isinstance(f, RdkafkaFilter) for f in lg.filters):
        lg.addFilter(RdkafkaFilter())
    return lg
