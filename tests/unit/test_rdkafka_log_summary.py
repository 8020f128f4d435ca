"""dedup/logs.py: librdkafka's repeated lines summarized, and the level each is logged at (pure: lines in, lines out)."""

from __future__ import annotations

import logging

import pytest

from eopipe.dedup.logs import ClientLog, RdkafkaFilter, Summarizer, kind, rdkafka_level

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


REFUSED_TEXT = refused()


@pytest.mark.parametrize("fac, text, level, retired, expected", [
    # a broker restart's lines: info, whatever librdkafka calls them
    ("FAIL", REFUSED_TEXT, logging.ERROR, False, logging.INFO),
    ("FAIL", "Disconnected: connection reset by peer", logging.INFO, False, logging.INFO),
    ("REQTMOUT", "TxnCoordinator: Timed out 0 in-flight, 0 retry-queued, 1 out-queue", logging.WARNING, False,
     logging.INFO),
    ("GETPID", "Failed to acquire transactional PID: Coordinator load in progress: retrying", logging.WARNING,
     False, logging.INFO),
    ("ADDOFFSETS", "Failed to add offsets to transaction: Local: Timed out", logging.ERROR, False, logging.INFO),
    # a connection failing for a reason a retry does not cure keeps its level
    ("FAIL", "SSL handshake failed: certificate verify failed", logging.ERROR, False, logging.ERROR),
    ("FAIL", "SASL authentication error: Authentication failed", logging.ERROR, False, logging.ERROR),
    # an abortable transaction error: the call returns it and the worker aborts and warns
    ("TXNERR", "Current transaction failed in state InTransaction: Failed to commit offsets to transaction "
     "on broker 127.0.0.1:53665/1: src[2](Broker: Coordinator not available)", logging.ERROR, False, logging.INFO),
    # other facilities keep theirs: a live producer's fatal error shows
    ("TXNERR", "Fatal transaction error: fenced by a newer instance", logging.CRITICAL, False, logging.CRITICAL),
    ("CONFWARN", "Configuration property x is a consumer property", logging.WARNING, False, logging.WARNING),
    # a client the partition gave up: its fencing by the successor is expected, as is the rest
    ("TXNERR", "Fatal transaction error: fenced by a newer instance", logging.CRITICAL, True, logging.DEBUG),
    ("FAIL", REFUSED_TEXT, logging.ERROR, True, logging.DEBUG),
])
def test_rdkafka_level(fac, text, level, retired, expected):
    assert rdkafka_level(fac, text, level, retired) == expected


def test_client_log_retires(caplog):
    lg = ClientLog()
    with caplog.at_level(logging.DEBUG, logger="rdkafka"):
        lg.log(logging.CRITICAL, "%s [%s] %s", "TXNERR", "p0.producer#producer-1", "Fatal: fenced (live)")
        lg.retire()
        lg.log(logging.CRITICAL, "%s [%s] %s", "TXNERR", "p0.producer#producer-1", "Fatal: fenced (retired)")
    assert [(r.levelno, r.getMessage().endswith("(live)")) for r in caplog.records if r.name == "rdkafka"] == [
        (logging.CRITICAL, True), (logging.DEBUG, False)]


def test_debug_lines_are_not_summarized():
    """Debug lines (librdkafka's `debug` property set) are for debugging: every one passes."""
    f = RdkafkaFilter(window=30)
    recs = [logging.LogRecord("rdkafka", logging.DEBUG, __file__, 1, "%s [%s] %s", ("BRKMAIN", "c", "Waking up"), None)
            for _ in range(3)]
    assert [f.filter(r) for r in recs] == [True, True, True]
