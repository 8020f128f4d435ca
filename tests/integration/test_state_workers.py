"""The state endpoints' bearer token with real workers (docs/design.md#access-control): a handoff
by snapshot between two workers that share the pipeline's token, the served snapshot refused
without the token and given with it, a new owner with a wrong token rebuilding instead, and a
worker with no token refusing its state endpoints unless told it may serve them open; and a
worker restarted on its state with a longer, then a shorter dedup window.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter

import pytest

from eopipe.core.assignment import Assignment, Handoff
from tests.helpers.rebalance import running_at, wait_until, write_assignment

pytestmark = pytest.mark.kafka


def test_state_endpoints_need_the_token(pipe):
    path = pipe.tmp / "assignment.json"
    write_assignment(path, Assignment(1, {0: "pod-a", 1: "pod-a", 2: "pod-a"}, partition_count=3))
    a = pipe.worker(path, state="a", extra=["--pod-name", "pod-a"]).start().wait_ready()
    b = pipe.worker(path, state="b", extra=["--pod-name", "pod-b"]).start().wait_ready()
    c = pipe.worker(path, state="c", extra=["--pod-name", "pod-c"],
                    env={"EOPIPE_TOKEN": "not-the-pipelines-token"}).start().wait_ready()
    stats = pipe.load(3000, dup_ratio=0.3, seed=31)
    pipe.wait_drained()
    url = f"http://127.0.0.1:{a.port}"
    write_assignment(path, Assignment(2, {0: "pod-a", 1: "pod-b", 2: "pod-c"}, partition_count=3,
                                      handoffs={p: Handoff("pod-a", url) for p in (1, 2)}))
    # The same token: the snapshot moves.
    part = wait_until(lambda: running_at(b, 1, 2), what="partition 1 at pod-b")
    assert part["migration"]["method"] == "snapshot" and part["migration"]["bytes"] > 0, part
    # A wrong token: 401 is final, so the new owner rebuilds at once (not after the handoff timeout).
    part = wait_until(lambda: running_at(c, 2, 2), what="partition 2 at pod-c", timeout=60)
    assert part["migration"]["method"] == "rebuild" and "HTTP 401" in part["migration"]["reason"], part

    # The released snapshot of partition 1, as served until the handoff is finalized.
    snap = "/snapshots/1?generation=2"
    released = wait_until(lambda: a.status()["released"].get("1"), what="snapshot served")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {pipe.token}"},
                    {"Authorization": f"Bearer {pipe.token[:-1]}"}):
        code, body = a.get(snap, headers)
        assert code == 401 and b"unauthorized" in body, (headers, code, body)
    assert a.get("/reshard/1/0/1")[0] == 401
    code, body = a.get(snap, {"Authorization": f"Bearer {pipe.token}"})
    assert code == 200 and len(body) == released["bytes"] > 0
    assert hashlib.sha256(body).hexdigest() == released["sha256"]
    # Probes, Prometheus and the operator's /status need no token.
    for open_path in ("/healthz", "/readyz", "/metrics", "/status"):
        assert a.get(open_path)[0] == 200, open_path

    # No token at all: the state endpoints are refused, unless explicitly served open.
    d = pipe.worker(path, state="d", extra=["--pod-name", "pod-d"], env={"EOPIPE_TOKEN": None}).start().wait_ready()
    code, body = d.get("/snapshots/0?generation=2")
    assert code == 403 and b"no token" in body
    assert d.get("/status")[0] == 200
    e = pipe.worker(path, state="e", extra=["--pod-name", "pod-e", "--insecure-state-endpoints"],
                    env={"EOPIPE_TOKEN": None}).start().wait_ready()
    assert e.get("/snapshots/0?generation=2")[0] == 404  # open: nothing released here
    assert any("no token" in (doc.get("msg") or "") for doc in e.logs())

    write_assignment(path, Assignment(3, {0: "pod-a", 1: "pod-b", 2: "pod-c"}, partition_count=3))
    for w in (a, b, c, d, e):
        assert w.terminate() == 0
    rep = pipe.verify()
    assert rep.lost == 0 and rep.duplicated == 0 and rep.out == stats["unique"], rep.line()


MIN = 60_000


def test_a_changed_window_keeps_its_promise(pipe):
    """docs/design.md#window-changes, with a real worker restarted on its state: a longer window
    catches a duplicate the old one had already forgotten (its coverage is scanned from the
    source), a shorter one lets through a duplicate beyond it and still catches one inside it
    stored in a segment of the old length; nothing lost. Counted on the output topic."""
    from eopipe.core.partitioner import murmur2_partition
    from eopipe.tools.loadgen import Sender
    from eopipe.tools.verify import TopicReader

    ten = 10 * MIN
    now = int(time.time() * 1000)
    head = ((now - 60 * MIN) // ten) * ten + 8 * MIN  # the watermark; 8 m into a 10 m segment
    keys, home = {}, {"p1": 1, "p2": 2}  # p1, p2: one record on each other partition (drained checks)
    for name in ("A", "B", "C", "F", "G", "head", "p1", "p2"):  # the others' home is partition 0
        keys[name] = next(k for i in range(1000)
                          if murmur2_partition(k := f"{name}-{i}".encode(), 3) == home.get(name, 0))
    out = Sender(pipe.bootstrap, pipe.source)

    def send(*records):
        for name, ago in records:
            out.send(home.get(name, 0), value=b"v", key=keys[name], timestamp=head - ago)
        out.finish(30)
        pipe.wait_drained()

    def run(window: str):
        return pipe.worker([0, 1, 2], extra=["--window", window]).start().wait_ready()

    def store(w) -> dict:
        return w.status()["partitions"]["0"]["store"]

    # 10 m (2.5 m segments): A expires once the head's event time arrives; C's duplicate is caught.
    w = run("10m")
    send(("A", 30 * MIN), ("p1", 30 * MIN), ("p2", 30 * MIN))
    send(("head", 0), ("C", 3 * MIN))
    send(("C", 3 * MIN))
    windows = [store(w)["effective_window_seconds"]]
    assert w.terminate() == 0
    # 40 m (10 m segments): the store covered only since A's segment ended; the restart scans
    # the source over the new window, so A's duplicate (30 m back) is caught.
    w = run("40m")
    windows.append(store(w)["effective_window_seconds"])
    scanned = w.status()["partitions"]["0"]["recovery"]["replayed"]
    send(("A", 30 * MIN), ("B", 25 * MIN), ("F", 4 * MIN))
    assert w.terminate() == 0
    # 5 m (75 s segments): B (25 m back) is beyond it and passes; F (4 m back) is inside, in the
    # 10 m segment [head-8m, head+2m) that a 75 s length would have dropped, and is caught.
    w = run("5m")
    send(("G", MIN))
    send(("B", 25 * MIN), ("F", 4 * MIN), ("C", 3 * MIN))
    windows.append(store(w)["effective_window_seconds"])
    assert w.terminate() == 0

    counts = Counter(m.key() for m in TopicReader(pipe.bootstrap).read(pipe.output, timeout=60))
    want = {"A": 1, "B": 2, "C": 1, "F": 1, "G": 1, "head": 1, "p1": 1, "p2": 1}
    assert counts == Counter({keys[n]: c for n, c in want.items()}), counts
    # What each worker reported it covers: its whole window, the longer one from the restart on.
    assert windows == [600, 2400, 300]
    assert scanned == 4  # the restart with 40 m read partition 0's four records back
