"""The dedup worker's control loop: a stall leaves every thread's stack in the log, and a stop
signal never waits for a lock its own thread may hold."""

import threading
import time

from eopipe.dedup.metrics import StallDump
from eopipe.dedup.worker import Worker


def _dumped(path, within: float) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = path.read_text()
        if text:
            return text
        time.sleep(0.05)
    return path.read_text()


def test_a_silent_loop_dumps_every_thread_once(tmp_path):
    out = tmp_path / "stderr"
    with open(out, "w") as f:
        stall = StallDump(0.3, file=f)
        try:
            stall.arm()
            text = _dumped(out, 5)
        finally:
            stall.cancel()
    # Threads newest first, at most 100 (a long test session has more): so not this test's own.
    assert text.startswith("Timeout (0:00:00.300000)!\nThread 0x"), text
    assert "(most recent call first):\n  File " in text, text


def test_a_loop_that_keeps_arming_or_cancels_dumps_nothing(tmp_path):
    out = tmp_path / "stderr"
    with open(out, "w") as f:
        stall = StallDump(1.0, file=f)
        try:
            end = time.monotonic() + 1.6
            while time.monotonic() < end:
                stall.arm()
                time.sleep(0.05)
            stall.cancel()
            time.sleep(1.2)
        finally:
            stall.cancel()
    assert out.read_text() == ""


def test_stop_signal_waits_for_no_lock():
    """SIGTERM's handler runs on the main thread between two bytecodes, possibly while that
    thread holds the lock of the Event its loop waits on: the handler must not take it."""
    w = Worker.__new__(Worker)
    w._stop = False
    w.assignments = type("A", (), {"changed": threading.Event()})()

    def handler_inside_the_wait():
        with w.assignments.changed._cond:  # what Event.wait holds around its own bytecodes
            w.request_stop()

    t = threading.Thread(target=handler_inside_the_wait, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "request_stop blocked on a lock its own thread held"
    assert w._stop
