"""State transfer helpers (eopipe.dedup.migrate, eopipe.dedup.transfer): integrity checks and the export format."""

import hashlib
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eopipe.dedup import migrate, transfer
from eopipe.dedup.store import StateStore

BODY = b"x" * 100_000


@pytest.fixture
def server():
    routes = {}

    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            code, headers, body = routes.get(self.path, (404, {}, b""))
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", routes
    srv.shutdown()


def test_download_checks_size_and_checksum(server, tmp_path):
    url, routes = server
    good = hashlib.sha256(BODY).hexdigest()
    routes["/ok"] = (200, {"Content-Length": str(len(BODY)), transfer.H_SHA: good}, BODY)
    routes["/bad-sum"] = (200, {"Content-Length": str(len(BODY)), transfer.H_SHA: "0" * 64}, BODY)
    routes["/short"] = (200, {"Content-Length": str(len(BODY) + 10), transfer.H_SHA: good}, BODY)
    routes["/gone"] = (410, {}, b"")
    assert transfer.download(f"{url}/ok", tmp_path / "f")["sha256"] == good
    with pytest.raises(transfer.TransferError, match="sha256 mismatch"):
        transfer.download(f"{url}/bad-sum", tmp_path / "f")
    with pytest.raises(transfer.TransferError):
        transfer.download(f"{url}/short", tmp_path / "f", timeout=2)
    for path in ("/gone", "/missing"):
        with pytest.raises(transfer.TransferError) as e:
            transfer.fetch_with_retries(f"{url}{path}", tmp_path / "f", deadline=1e18)
        assert e.value.final  # 404/410: rebuild at once, no retries


def test_a_busy_peer_is_asked_again_soon_and_others_back_off(server, tmp_path):
    url, routes = server
    good = hashlib.sha256(BODY).hexdigest()
    answers = iter([(503, {}, b"being prepared\n")] * 5)
    retried = []

    def on_retry(e):
        retried.append(e)
        # the 6th request finds the snapshot ready
        routes["/snap"] = next(answers, (200, {"Content-Length": str(len(BODY)), transfer.H_SHA: good}, BODY))
    routes["/snap"] = next(answers)
    import time
    t0 = time.monotonic()
    facts = transfer.fetch_with_retries(f"{url}/snap", tmp_path / "f", deadline=time.monotonic() + 30,
                                       on_retry=on_retry)
    waited = time.monotonic() - t0
    assert facts["sha256"] == good and facts["ms"] >= 0
    assert len(retried) == 5 and all(e.busy and not e.final for e in retried)
    assert waited < 5 * 0.2  # at the backoff's first step (0.2 s) five retries would take 1 s or more


def test_retries_end_at_the_deadline(tmp_path):
    import time
    t0 = time.monotonic()
    with pytest.raises(transfer.TransferError) as e:  # nobody listens there: connection refused
        transfer.fetch_with_retries("http://127.0.0.1:9/snapshots/0", tmp_path / "f", deadline=time.monotonic() + 1.5)
    assert not e.value.final and time.monotonic() - t0 < 5


def test_snapshot_round_trip_and_unsafe_members_refused(tmp_path):
    a = StateStore(tmp_path / "a", window_ms=3_600_000, segment_ms=900_000, memory_bytes=16 << 20)
    now = 1_800_000_000_000
    a.open(3).apply({b"k%d" % i: now for i in range(1000)}, 1234, now_ms=now, partition_count=4)
    a.close_partition(3)
    man = migrate.make_snapshot(a, 3, generation=7, stopped_at_ms=5)
    tar_path, _ = migrate.snapshot_paths(a.root, 3)
    assert man["applied_offset"] == 1234 and man["sha256"] == migrate.sha256_file(tar_path)
    b = StateStore(tmp_path / "b", window_ms=3_600_000, segment_ms=900_000, memory_bytes=16 << 20)
    migrate.install_snapshot(tar_path, b, 3)
    ps = b.open(3)
    assert ps.applied_offset == 1234 and ps.partition_count == 4
    assert ps.contains([b"k1", b"k999", b"nope"]) == {b"k1", b"k999"}
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tf:
        f = tmp_path / "x"
        f.write_bytes(b"1")
        tf.add(f, arcname="../x")
    with pytest.raises(transfer.TransferError, match="unexpected member"):
        migrate.install_snapshot(evil, b, 5)


def test_exports_split_keys_by_new_home(tmp_path):
    from eopipe.core.partitioner import murmur2_partition

    keys = [b"key-%d" % i for i in range(2000)]
    man = migrate.write_exports(tmp_path, 9, 1, ((100, k) for k in keys), murmur2_partition, 8)
    moved = {q: [e for b in migrate.read_export(migrate.export_dir(tmp_path, 9, 1) / f"to-{q}.bin") for e in b]
             for q in map(int, man["targets"])}
    for q, entries in moved.items():
        assert q != 1 and all(murmur2_partition(k, 8) == q and ts == 100 for k, ts in entries)
    assert sum(len(v) for v in moved.values()) == sum(1 for k in keys if murmur2_partition(k, 8) != 1)
    assert migrate.read_export_manifest(tmp_path, 9, 1)["scanned"] == 2000
