"""Every read of a peer is bounded, and a bad answer is never a crash: the operator's read of a
pod's /status (eopipe.core.wire.read_status), a state transfer's download (size announced, disk
room, no longer body), the parse of a re-shard export, and, through the worker's real handoff
code (dedup/incoming.py) against a loopback peer, that each malformed transfer ends in a rebuild.
"""

from __future__ import annotations

import hashlib
import socket
import struct
import tarfile
import threading
import time
from types import SimpleNamespace

import pytest

from eopipe.core.assignment import Assignment, Handoff, Reshard
from eopipe.core.wire import H_KEYS, H_SHA, H_STOPPED, Migration, MigrationMethod, PodStatus, ReshardRequest, read_status
from eopipe.dedup import incoming, migrate, transfer
from eopipe.dedup.http import HttpServer
from eopipe.dedup.metrics import Metrics
from eopipe.dedup.store import StateStore

WAIT = 5.0  # a bound for a test that fails, never a speed assertion
STATUS = b'{"pod": "pod-a", "generation": 3, "owned": [0], "partitions": {"0": {"state": "running"}}}'


@pytest.fixture
def peer():
    """A loopback peer answering every connection with `answer[0](conn)` after reading the head."""
    answer = [lambda c: None]
    lsock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            with conn:
                buf = b""
                conn.settimeout(WAIT)
                try:
                    while b"\r\n\r\n" not in buf and (chunk := conn.recv(4096)):
                        buf += chunk
                    answer[0](conn)
                except OSError:
                    pass
    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{lsock.getsockname()[1]}", answer
    stop.set()
    lsock.close()


def raw(head: bytes, body: bytes = b""):
    return lambda c: c.sendall(head + b"\r\n\r\n" + body)


def ok(body: bytes, **headers) -> bytes:
    hs = b"".join(b"\r\n%s: %s" % (k.replace("_", "-").encode(), str(v).encode()) for k, v in headers.items())
    return b"HTTP/1.0 200 OK" + hs


def chunked(body: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 1000]), body[i:i + 1000])
                    for i in range(0, len(body), 1000)) + b"0\r\n\r\n"


def trickle(head: bytes, body: bytes, every: float):
    def send(c):
        c.sendall(head + b"\r\n\r\n")
        for b in body:
            c.sendall(bytes([b]))
            time.sleep(every)
    return send


def then_good(first, seconds: float = 0.0):
    """Answers `first` to the first request (taking `seconds` more over it), a good status to
    the next: a reader that follows a redirect, or waits that long, reads a good status."""
    calls = []

    def send(c):
        calls.append(1)
        if len(calls) > 1:
            return raw(ok(STATUS, Content_Length=len(STATUS)), STATUS)(c)
        end = time.monotonic() + seconds
        first(c)
        while time.monotonic() < end:
            c.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            time.sleep(0.2)
        if seconds:
            raw(ok(STATUS, Content_Length=len(STATUS)), STATUS)(c)
    return send


def head_trickle(c):
    for b in ok(STATUS, Content_Length=len(STATUS)) + b"\r\n\r\n":
        c.sendall(bytes([b]))
        time.sleep(0.15)  # about 6 s in all, past WAIT
    c.sendall(STATUS)


# -- the operator reading /status ---------------------------------------------------------------
@pytest.mark.parametrize("version", [b"HTTP/1.0", b"HTTP/1.1"])  # 1.1: the peer may keep the connection
def test_a_good_status_is_read(peer, version):
    url, answer = peer
    answer[0] = raw(ok(STATUS, Content_Length=len(STATUS)).replace(b"HTTP/1.0", version), STATUS)
    st = read_status(url + "/status", timeout=WAIT)
    assert isinstance(st, PodStatus) and st.pod == "pod-a" and st.generation == 3


BIG = b'{"pod": "' + b"a" * 5000 + b'"}'


@pytest.mark.parametrize("answer", [
    raw(ok(BIG, Content_Length=len(BIG)), BIG),                                # announced over the cap
    raw(ok(BIG), BIG),                                                         # no length: read to the cap
    raw(ok(BIG, Transfer_Encoding="chunked"), chunked(BIG)),
    raw(ok(BIG, Content_Length=10), BIG),                                      # says 10, is not JSON in 10
    raw(ok(b"", Content_Length="x"), STATUS),
    raw(ok(b"", Content_Length="-1"), STATUS),
    raw(ok(b"", Content_Length=10 ** 30), STATUS),
    raw(ok(b"", Content_Length=len(STATUS) + 50), STATUS),                    # ends short
    raw(ok(b""), b"not json"),
    raw(ok(b""), b"[1, 2]"),
    raw(ok(b""), b'{"partitions": {"0": {}}}'),                               # no state: not a /status
    raw(ok(b""), b'{"owned": "x"}'),
    raw(ok(b""), b"[" * 900 + b"]" * 900),                                    # nested too deep (within the cap)
    raw(ok(b""), b"\xff\xfe"),
    raw(b"HTTP/1.0 500 Internal Server Error\r\nContent-Length: 0"),
    raw(b"HTTP/1.0 200 OK\r\nX: " + b"a" * 70_000),                           # a header line too long
    raw(b"HELLO"),                                                            # not HTTP
    lambda c: None,                                                           # closes without a word
    trickle(ok(b""), STATUS, 0.25),                                           # too slow for the deadline
    then_good(lambda c: None, seconds=WAIT + 1),                              # "100 Continue" past WAIT, then good
    head_trickle,                                                             # a good answer's head, byte by byte
    then_good(raw(b"HTTP/1.0 302 Found\r\nLocation: /status\r\nContent-Length: 0")),  # good where it points
], ids=["announced-over", "unannounced-over", "chunked-over", "short-length", "length-x", "length-neg",
        "length-huge", "ends-short", "not-json", "list", "no-state", "owned-str", "deep", "binary", "500",
        "long-header", "not-http", "silent", "trickle", "continue-forever", "head-trickle", "redirect"])
def test_an_unreadable_status_is_none(peer, answer):
    url, ans = peer
    ans[0] = answer
    t = time.monotonic()
    assert read_status(url + "/status", timeout=WAIT, limit=2000, within=1.0) is None
    assert time.monotonic() - t < WAIT  # within=1.0 bounds the whole exchange, not each receive


def test_nobody_listening_is_none():
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    assert read_status(f"http://127.0.0.1:{port}/status", timeout=WAIT) is None


def test_the_status_cap_fits_a_real_status():
    # The cap must never refuse a real pod: one with 1000 partitions is far below it.
    part = {"state": "running", "committed": 10 ** 12, "lag": 10 ** 6, "recovery": {"recovery": "replay"},
            "migration": {"method": "snapshot", "sha256": "0" * 64, "from": "pod-x"},
            "store": {"keys": 10 ** 9, "bytes": 10 ** 12}}
    import json

    from eopipe.core.wire import STATUS_MAX_BYTES, status_from_body
    body = json.dumps({"pod": "p", "owned": list(range(1000)), "partitions": {str(p): part for p in range(1000)}})
    assert len(body) < STATUS_MAX_BYTES // 8
    assert len(status_from_body(body.encode()).partitions) == 1000


# -- a state transfer's download ----------------------------------------------------------------
DATA = b"x" * 50_000
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.mark.parametrize("version", [b"HTTP/1.0", b"HTTP/1.1"])
def test_a_good_transfer(peer, tmp_path, version):
    url, answer = peer
    answer[0] = raw(ok(DATA, Content_Length=len(DATA), **{H_SHA: SHA, H_KEYS: 7}).replace(b"HTTP/1.0", version), DATA)
    facts = transfer.download(url + "/x", tmp_path / "f")
    assert facts["bytes"] == len(DATA) and facts[H_KEYS] == 7 and facts[H_STOPPED] is None
    assert (tmp_path / "f").read_bytes() == DATA


@pytest.mark.parametrize("answer, match, final", [
    (raw(ok(DATA), DATA), "Content-Length", True),
    (raw(ok(DATA, Transfer_Encoding="chunked"), chunked(DATA)), "Content-Length", True),
    (raw(ok(DATA, Content_Length="5x"), DATA), "Content-Length", True),
    # Chunked wins over Content-Length in HTTP: a body past the length announced is refused.
    (raw(ok(DATA, Content_Length=1000, Transfer_Encoding="chunked"), chunked(DATA)), "longer than", True),
    (raw(ok(DATA, Content_Length=len(DATA) + 1, **{H_SHA: SHA}), DATA), "expected", False),
    (raw(ok(DATA, Content_Length=len(DATA), **{H_SHA: "0" * 64}), DATA), "sha256 mismatch", False),
    (raw(ok(DATA, Content_Length=len(DATA), **{H_KEYS: "lots"}), DATA), "malformed", True),
    (raw(ok(DATA, Content_Length=len(DATA), **{H_STOPPED: "1e9"}), DATA), "malformed", True),
    (raw(b"HELLO"), "BadStatusLine", False),
])
def test_a_bad_transfer_is_a_transfer_error(peer, tmp_path, answer, match, final):
    url, ans = peer
    ans[0] = answer
    with pytest.raises(transfer.TransferError, match=match) as e:
        transfer.download(url + "/x", tmp_path / "f", timeout=WAIT)
    assert e.value.final is final


@pytest.mark.parametrize("answer", [
    trickle(ok(DATA, Content_Length=100, **{H_SHA: SHA}), DATA[:100], 0.1),  # each byte in time, the whole not
    then_good(lambda c: None, seconds=WAIT + 1),                               # "100 Continue" past WAIT
], ids=["body-trickle", "continue-forever"])
def test_a_transfer_ends_by_its_deadline(peer, tmp_path, answer):
    """A peer that keeps every receive within its timeout cannot hold the new owner past the
    handoff's deadline: it gives up there (and rebuilds), head and body alike."""
    url, ans = peer
    ans[0] = answer
    t = time.monotonic()
    with pytest.raises(transfer.TransferError, match="not read in time"):
        transfer.fetch_with_retries(url + "/x", tmp_path / "f", deadline=t + 1.0)
    assert time.monotonic() - t < WAIT


def test_a_transfer_must_fit_on_disk(peer, tmp_path, monkeypatch):
    url, answer = peer
    answer[0] = raw(ok(DATA, Content_Length=len(DATA), **{H_SHA: SHA}), DATA)
    monkeypatch.setattr(transfer, "free_bytes", lambda path: transfer.DISK_MARGIN + len(DATA) - 1)
    with pytest.raises(transfer.TransferError, match="do not fit") as e:
        transfer.download(url + "/x", tmp_path / "f")
    assert e.value.final and not (tmp_path / "f").exists()  # refused before a byte was written
    monkeypatch.setattr(transfer, "free_bytes", lambda path: transfer.DISK_MARGIN + len(DATA))
    assert transfer.download(url + "/x", tmp_path / "f")["bytes"] == len(DATA)


def test_a_snapshot_unpacks_only_plain_files_that_fit(tmp_path, monkeypatch):
    store = StateStore(tmp_path / "s", window_ms=3_600_000, segment_ms=900_000, memory_bytes=16 << 20)
    f = tmp_path / "CURRENT"
    f.write_bytes(b"1" * 1000)
    plain = tmp_path / "plain.tar"
    with tarfile.open(plain, "w") as tf:
        tf.add(f, arcname="CURRENT")
    monkeypatch.setattr(transfer, "free_bytes", lambda path: transfer.DISK_MARGIN + 999)
    with pytest.raises(transfer.TransferError, match="do not fit"):
        migrate.install_snapshot(plain, store, 0)
    assert not store.exists(0)
    monkeypatch.undo()
    sparse = tmp_path / "sparse.tar"
    with tarfile.open(sparse, "w", format=tarfile.GNU_FORMAT) as tf:
        info = tf.gettarinfo(f, arcname="CURRENT")
        info.type = tarfile.GNUTYPE_SPARSE
        tf.addfile(info)
    for bad in (sparse,):
        with pytest.raises(transfer.TransferError, match="unexpected member"):
            migrate.install_snapshot(bad, store, 0)
    many = tmp_path / "many.tar"
    with tarfile.open(many, "w") as tf:
        for name in ("CURRENT", "000001.sst", "000002.sst", "MANIFEST-000003"):
            tf.add(f, arcname=name)
    monkeypatch.setattr(migrate, "MAX_SNAPSHOT_FILES", 3)
    with pytest.raises(transfer.TransferError, match="more than 3 files"):
        migrate.install_snapshot(many, store, 0)
    monkeypatch.setattr(migrate, "MAX_SNAPSHOT_FILES", 4)
    migrate.install_snapshot(many, store, 0)
    assert store.exists(0)


# -- re-shard exports -----------------------------------------------------------------------------
REC = struct.Struct(">qI")
GOOD = b"".join(REC.pack(100 + i, len(k)) + k for i, k in enumerate([b"alpha", b"", b"gamma-key"]))


def parsed(tmp_path, data: bytes, keys=None, batch=migrate.IMPORT_BATCH) -> list:
    f = tmp_path / "export.bin"
    f.write_bytes(data)
    return list(migrate.read_export(f, keys, batch))


def test_a_good_export_parses(tmp_path):
    assert parsed(tmp_path, GOOD) == [[(b"alpha", 100), (b"", 101), (b"gamma-key", 102)]]
    assert parsed(tmp_path, GOOD, 3) == parsed(tmp_path, GOOD)
    assert parsed(tmp_path, GOOD, 3, batch=2) == [[(b"alpha", 100), (b"", 101)], [(b"gamma-key", 102)]]
    assert migrate.check_export(tmp_path / "export.bin", 3) == (3, (b"gamma-key", 102))
    assert parsed(tmp_path, b"", 0) == []


@pytest.mark.parametrize("data, keys, match", [
    *[(GOOD[:n], None, "cut short|left") for n in (1, 11, 12, 13, 16, 17 + 11, len(GOOD) - 1)],
    (REC.pack(1, 6) + b"abc", None, "left"),                       # a length past the end
    (REC.pack(1, 2 ** 32 - 1) + b"abc", None, "left"),             # refused before a 4 GiB read
    (GOOD + b"\x00\x01", None, "cut short"),                       # trailing garbage
    (GOOD, 2, "more than the 2"),                                  # more keys than announced
    (GOOD, 4, "3 keys, 4 announced"),                              # fewer
    (GOOD, 0, "more than the 0"),
])
def test_a_malformed_export_is_a_final_transfer_error(tmp_path, data, keys, match):
    with pytest.raises(transfer.TransferError, match=match) as e:
        parsed(tmp_path, data, keys, batch=1)
    assert e.value.final


def test_an_own_export_is_checked_against_its_manifest(tmp_path):
    from eopipe.core.partitioner import murmur2_partition
    keys = [b"key-%d" % i for i in range(200)]
    man = migrate.write_exports(tmp_path, 9, 1, ((100, k) for k in keys), murmur2_partition, 4)
    q = int(next(iter(man["targets"])))
    f = migrate.own_export(tmp_path, 9, 1, q, man)
    assert migrate.check_export(f, man["targets"][str(q)]["keys"])[0] == man["targets"][str(q)]["keys"]
    assert migrate.own_export(tmp_path, 9, 1, 1, man) is None  # no file for a target that gets nothing
    f.write_bytes(f.read_bytes()[:-1] + b"!")   # same size, another sha
    with pytest.raises(transfer.TransferError, match="does not match"):
        migrate.own_export(tmp_path, 9, 1, q, man)
    f.unlink()
    with pytest.raises(transfer.TransferError, match="own export"):
        migrate.own_export(tmp_path, 9, 1, q, man)


# -- every malformed transfer ends in a rebuild -------------------------------------------------
class FakeStore:
    """The partition's open store, as incoming.reshard reads it."""

    reshard_id = None

    def iter_keys(self):
        return iter(())


CFG = SimpleNamespace(me="pod-b", token="t0k", handoff_timeout_seconds=3.0, partitioner="murmur2")


def states(tmp_path) -> StateStore:
    return StateStore(tmp_path / "b", window_ms=3_600_000, segment_ms=900_000, memory_bytes=16 << 20)


def export_server(tmp_path, body: bytes, headers: dict) -> HttpServer:
    """The old owner: the worker's real HTTP server and token, serving `body` as the export."""
    s = HttpServer("127.0.0.1", 0, Metrics(), lambda: PodStatus(), lambda: True, lambda: True,
                   files=lambda req: (200, headers, body) if isinstance(req, ReshardRequest) else None, token="t0k")
    s.start()
    return s


def _reshard_importing(tmp_path, body: bytes, keys):
    """Re-shard 2 -> 4: this pod (pod-b) owns new partition 2 and imports from old partition 0 at
    pod-a, which serves `body`; its own old partition 1 exported nothing to 2."""
    s = export_server(tmp_path, body, {H_SHA: hashlib.sha256(body).hexdigest(), H_KEYS: keys})
    try:
        a = Assignment(5, {0: "pod-a", 1: "pod-b", 2: "pod-b", 3: "pod-a"}, partition_count=4,
                       reshard=Reshard(1, 2, 4, {"pod-a": f"http://127.0.0.1:{s.port}"}))
        st, calls = states(tmp_path), []
        migrate.write_exports(st.root, 1, 1, iter(()), lambda k, n: 1, 4)
        imp = incoming.reshard(CFG, st, a, 2, FakeStore(), False, threading.Event(),
                               importing=lambda: calls.append("importing"))
    finally:
        s.stop()
    assert calls == ["importing"]
    return imp


@pytest.mark.parametrize("body, keys", [
    (GOOD[:13], 3),                         # truncated inside a record
    (GOOD[:-1], 3),                         # truncated inside the last key
    (REC.pack(1, 999) + b"abc", 1),         # a length past the end
    (GOOD + b"\x00", 3),                    # trailing garbage
    (GOOD, 2),                              # more keys than announced
    (GOOD, 9),                              # fewer
], ids=["cut-record", "cut-key", "length-past-end", "trailing", "too-many-keys", "too-few-keys"])
def test_a_malformed_reshard_import_rebuilds(tmp_path, body, keys):
    # pod-a answers with a checksum-correct but malformed export.
    imp = _reshard_importing(tmp_path, body, keys)
    assert imp.rebuild and imp.files == () and (imp.reshard, imp.to) == (1, 4)
    assert not list((states(tmp_path).root / "reshard" / "1").glob("incoming-*"))  # the download removed
    assert imp.migration.method is MigrationMethod.REBUILD and imp.migration.reason


def test_a_good_reshard_import_is_applied(tmp_path):
    imp = _reshard_importing(tmp_path, GOOD, 3)
    assert not imp.rebuild and (imp.reshard, imp.to) == (1, 4)
    assert imp.migration.method is MigrationMethod.RESHARD_IMPORT and imp.migration.keys == 3
    # The newest record first (it sets the watermark the whole import gives), then every record.
    assert [e for b in imp.batches() for e in b] == [(b"gamma-key", 102), (b"alpha", 100), (b"", 101), (b"gamma-key", 102)]
    (downloaded,) = imp.files
    assert downloaded.downloaded and downloaded.path.exists()
    imp.discard()
    assert not downloaded.path.exists()


def test_an_import_applied_in_batches_keeps_what_one_apply_keeps(tmp_path, monkeypatch):
    """An export's keys reach the store a batch at a time (its memory stays bounded). Keys two
    windows older than the newest go into the oldest live segment when applied at once; so they
    do in batches, because the newest record comes first and sets the watermark."""
    now = int(time.time() * 1000)
    newest = now // 900_000 * 900_000
    entries = [(b"old-%d" % i, newest - 7_200_000) for i in range(6)] + [(b"new-%d" % i, newest) for i in range(6)]
    f = tmp_path / "export.bin"
    f.write_bytes(b"".join(REC.pack(t, len(k)) + k for k, t in entries))
    monkeypatch.setattr(migrate, "IMPORT_BATCH", 4)
    keys = [k for k, _ in entries]

    def kept(imp: incoming.Import | None, name: str) -> set:
        st = StateStore(tmp_path / name, window_ms=3_600_000, segment_ms=900_000, memory_bytes=16 << 20)
        ps = st.open(0)
        for batch in imp.batches() if imp else [entries]:
            ps.apply(batch, None, now_ms=now)
        try:
            return ps.contains(keys)
        finally:
            st.close_partition(0)

    at_once = kept(None, "once")
    assert at_once == set(keys)
    ordered = incoming.Import(1, 4, (incoming.ExportFile(f, 12),), Migration(), newest=(b"new-0", newest))
    assert kept(ordered, "batches") == at_once
    # What the order prevents: the first batch's old keys in a segment of their own, live then,
    # dropped by the next batch's watermark (whose old keys go into the oldest live segment).
    unordered = incoming.Import(1, 4, (incoming.ExportFile(f, 12),), Migration())
    assert kept(unordered, "unordered") == set(keys) - {b"old-%d" % i for i in range(4)}


@pytest.mark.parametrize("answer", [
    raw(ok(DATA, Content_Length=1000, Transfer_Encoding="chunked", **{H_SHA: SHA}), chunked(DATA)),  # longer
    raw(ok(DATA, **{H_SHA: SHA}), DATA),                                      # no length announced
    raw(ok(DATA, Content_Length=len(DATA), **{H_SHA: SHA}), DATA),            # right size, not a tar
    raw(ok(DATA, Content_Length=len(DATA), **{H_SHA: SHA, H_STOPPED: "x"}), DATA),
], ids=["longer-than-announced", "unannounced", "not-a-tar", "bad-header"])
def test_a_malformed_snapshot_rebuilds(tmp_path, peer, answer):
    url, ans = peer
    ans[0] = answer
    a = Assignment(3, {0: "pod-b"}, partition_count=1, handoffs={0: Handoff("pod-a", url)})
    st, calls = states(tmp_path), []
    m = incoming.take_over(CFG, st, a, 0, threading.Event(), fetching=lambda: calls.append("fetching"))
    assert calls == ["fetching"]
    assert m.method is MigrationMethod.REBUILD and m.reason
    assert not st.exists(0)  # recovery finds no store: it rebuilds
    assert not list((st.root / "snapshots").glob("incoming-*"))

