"""Structured logs: one JSON object per line on stderr."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from logging import DEBUG, INFO


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
        if record.levelno <= DEBUG or not (isinstance(args, tuple) and len(args) == 3):
            return True  # debug lines (librdkafka's `debug` set, or retired clients) all pass
        fac, client, text = (str(a) for a in args)
        with self._lock:
            out = self._sum.line(record.created, fac, text)
        if out is None:
            return False
        record.args = (fac, client, out)
        return True


def rdkafka_logger() -> logging.Logger:
    """The "rdkafka" logger, summarized (the filter installed once)."""
    lg = logging.getLogger("rdkafka")
    if not any(isinstance(f, RdkafkaFilter) for f in lg.filters):
        lg.addFilter(RdkafkaFilter())
    return lg


# Facilities of the lines a broker restart makes every client write: connections failing
# (FAIL), requests timing out (REQTMOUT), transactional requests retried or timed out. Whatever
# of it matters reaches the worker as the API call's error, which it reports itself: one
# warning per partition ("transaction stalled ..."). So they are info, not a stream of errors.
TRANSIENT = frozenset({"FAIL", "REQTMOUT", "GETPID", "ADDOFFSETS", "ADDPARTS", "ENDTXN", "TXNCOORD"})
# ...except a connection refused for a reason a retry does not cure: misconfiguration shows.
_NOT_TRANSIENT = re.compile(r"SSL|SASL|[Aa]uthenticat|[Cc]ertificate|[Uu]nsupported")


def rdkafka_level(fac: str, text: str, level: int, retired: bool) -> int:
    """The level to log a librdkafka line at. A client the partition gave up (retired: replaced
    after a stall and fenced by its successor, on purpose) says only what is expected: debug."""
    if retired:
        return DEBUG
    if fac in TRANSIENT and not _NOT_TRANSIENT.search(text):
        return min(level, INFO)
    if fac == "TXNERR" and not text.startswith("Fatal"):
        return min(level, INFO)  # an abortable error: the call returns it, the worker aborts and warns
    return level


class ClientLog:
    """A client's `logger` (confluent-kafka calls log(level, "%s [%s] %s", facility, client,
    text)): its lines go to the summarized "rdkafka" logger at rdkafka_level."""

    def __init__(self):
        self.retired = False
        self._lg = rdkafka_logger()

    def log(self, level: int, fmt: str, *args) -> None:
        if len(args) == 3:
            level = rdkafka_level(str(args[0]), str(args[2]), level, self.retired)
        self._lg.log(level, fmt, *args)

    def retire(self) -> None:
        self.retired = True
