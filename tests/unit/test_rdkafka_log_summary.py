"""dedup/logs.py: librdkafka's repeated lines summarized (pure: lines in, lines out)."""

from __future__ import annotations

import logging

import pytest

from eopipe.dedup.logs import RdkafkaFilter, Summarizer, kind

REFUSED = "127.0.0.1:{port}/bootstrap: Connect to ipv4#127.0.0.1:{port} failed: Connection refused (after {ms}ms in state CONNECT)"


def refused(port=9092, ms=0):
    return REFUSED.format(port=port, ms=ms)


@pytest.mark.parametrize("lines, expected", [
    # one line passes as it is
    ([(0, "FAIL", refused())], [refused()]),
    # repeats inside the window (other ports, times, brokers) are dropped...
    ([(0, "FAIL", refused()), (0.1, "FAIL", refused(9093, 1)), (29.9, "FAIL", refused())],
     [refused()]),
    # ...and counted on the first line after it
    ([(0, "FAIL", refused()), (1, "FAIL", refused()), (2, "FAIL", refused()), (31, "FAIL", refused(ms=3))],
     [refused(), refused(ms=3) + " (2 similar lines in the last 31s suppressed)"]),
    # after a quiet window, a new line passes plain
    ([(0, "FAIL", refused()), (40, "FAIL", refused())], [refused(), refused()]),
    # other kinds (facility or words) pass on their own
    ([(0, "FAIL", refused()), (0.1, "ERROR", refused()), (0.2, "FAIL", "Disconnected"), (0.3, "FAIL", "Disconnected")],
     [refused(), refused(), "Disconnected"]),
])
def test_summarizer(lines, expected):
    s = Summarizer(window=30)
    out = [s.line(t, fac, text) for t, fac, text in lines]
    assert [x for x in out if x is not None] == expected


def test_kind_blanks_numbers_only():
    assert kind("FAIL", refused(1)) == kind("FAIL", refused(2, 7))
    assert kind("FAIL", "Connection refused") != kind("FAIL", "Connection reset")


def test_filter_on_confluent_kafkas_call_shape():
    """confluent-kafka calls logger.log(level, "%s [%s] %s", facility, client, text)."""
    f = RdkafkaFilter(window=30)

    def rec(t, client, text):
        r = logging.LogRecord("rdkafka", logging.ERROR, __file__, 1, "%s [%s] %s", ("FAIL", client, text), None)
        r.created = t
        return r

    a, b, c = rec(0, "p0.producer#producer-1", refused()), rec(1, "p1.consumer#consumer-2", refused()), rec(40, "p0", refused())
    assert [f.filter(r) for r in (a, b, c)] == [True, False, True]
    assert c.getMessage().endswith("(1 similar lines in the last 40s suppressed)")
    assert f.filter(logging.LogRecord("rdkafka", logging.ERROR, __file__, 1, "plain", None, None))
