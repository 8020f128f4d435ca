"""The worker's real HTTP server (eopipe.dedup.http.HttpServer) on loopback, fed raw request
lines through a socket: what each one gets, and that no refused request gets a byte of the
state (the `files` callable is not even called). Then its bounds: a silent or trickling client
is dropped, and connections beyond the cap get 503. No Kafka: the endpoints are faked."""

from __future__ import annotations

import select
import socket
import time

import pytest

from eopipe.core.wire import PodStatus, ReshardRequest, SnapshotRequest
from eopipe.dedup.http import HttpServer
from eopipe.dedup.metrics import Metrics

TOKEN = "s3cret-Token_0123456789"
SECRET = b"SECRET-DEDUP-KEYS-OF-PARTITION-1"
EXPORT = b"SECRET-EXPORTED-KEYS-0-TO-1"
WAIT = 5.0  # a bound for a test that fails, never a speed assertion


def server(tmp_path, **kw) -> tuple[HttpServer, list]:
    calls: list = []
    export = tmp_path / "to-1.bin"
    export.write_bytes(EXPORT)

    def files(req):
        calls.append(req)
        if isinstance(req, SnapshotRequest) and req.partition == 1:
            return 200, {"X-Eopipe-Keys": 3}, SECRET
        if isinstance(req, ReshardRequest) and (req.source, req.target) == (0, 1):
            return 200, {}, export
        return None

    kw.setdefault("token", TOKEN)
    s = HttpServer("127.0.0.1", 0, Metrics(), lambda: PodStatus(pod="pod-a"), lambda: True, lambda: True,
                   files=files, **kw)
    s.start()
    return s, calls


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    s, calls = server(tmp_path_factory.mktemp("files"))
    yield s, calls
    s.stop()


@pytest.fixture
def srv(shared):
    shared[1].clear()
    return shared


def exchange(port: int, raw: bytes) -> bytes:
    """Sends raw, then reads the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as c:
        c.sendall(raw)
        out = b""
        while chunk := c.recv(65536):
            out += chunk
        return out


def code_of(answer: bytes) -> int:
    line = answer.split(b"\r\n", 1)[0].split(b" ")
    assert line[0] == b"HTTP/1.0", answer[:80]
    return int(line[1])


AUTH = f"Authorization: Bearer {TOKEN}\r\n".encode()


@pytest.mark.parametrize("raw, code", [
    # The bypass: no leading slash, with and without the token.
    (b"GET snapshots/1 HTTP/1.0\r\n\r\n", 400),
    (b"GET snapshots/1 HTTP/1.0\r\n" + AUTH + b"\r\n", 400),
    (b"GET reshard/1/0/1 HTTP/1.0\r\n\r\n", 400),
    (b"GET //snapshots/1 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"GET /./snapshots/1 HTTP/1.1\r\n\r\n", 400),
    (b"GET /../snapshots/1 HTTP/1.1\r\n\r\n", 400),
    (b"GET /%73napshots/1 HTTP/1.1\r\n\r\n", 400),
    (b"GET http://h/snapshots/1 HTTP/1.1\r\n\r\n", 400),
    (b"GET /snapshots/1;x HTTP/1.1\r\n\r\n", 400),
    (b"GET /snapshots/1#x HTTP/1.1\r\n\r\n", 400),
    (b"GET \\snapshots\\1 HTTP/1.1\r\n\r\n", 400),
    (b"GET /snapshots/1?generation=1&generation=2 HTTP/1.1\r\n" + AUTH + b"\r\n", 400),
    (b"GET /snapshots/1/2 HTTP/1.1\r\n" + AUTH + b"\r\n", 400),
    # HTTP/0.9 (no version): a status line comes back, never a bare body.
    (b"GET /snapshots/1\r\n", 400),
    (b"GET snapshots/1\r\n", 400),
    (b"GET /snapshots/1\r\n" + AUTH + b"\r\n", 400),
    # Malformed request lines.
    (b"GET  /snapshots/1 HTTP/1.1\r\n\r\n", 400),
    (b"GET /snapshots/1 HTTP/1.1 x\r\n\r\n", 400),
    (b"\xff\xfe /snapshots/1 HTTP/1.1\r\n\r\n", 400),
    (b"GET /snapshots/1 HTTP/2.0\r\n\r\n", 400),
    (b"\r\n", 400),
    # Heads over the bounds.
    (b"GET /snapshots/1 HTTP/1.1\r\n" + AUTH + b"X-Pad: " + b"a" * 10_000 + b"\r\n\r\n", 431),
    (b"GET /snapshots/1 HTTP/1.1\r\n" + AUTH + b"".join(b"X-%d: 1\r\n" % i for i in range(100)) + b"\r\n", 431),
    (b"GET /snapshots/1 HTTP/1.1\r\n" + AUTH + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 500) for i in range(20))
     + b"\r\n", 431),                                                     # each line short, the head not
    (b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n", 431),
    (b"GET /" + b"a" * 1000 + b" HTTP/1.1\r\n\r\n", 400),
    # Other methods, a body on a GET.
    (b"POST /snapshots/1 HTTP/1.1\r\n" + AUTH + b"Content-Length: 0\r\n\r\n", 405),
    (b"HEAD /snapshots/1 HTTP/1.1\r\n" + AUTH + b"\r\n", 405),
    (b"GET /snapshots/1 HTTP/1.1\r\n" + AUTH + b"Content-Length: 3\r\n\r\nabc", 400),
    (b"GET /snapshots/1 HTTP/1.1\r\n" + AUTH + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    # The token: missing, wrong, twice.
    (b"GET /snapshots/1 HTTP/1.1\r\n\r\n", 401),
    (b"GET /snapshots/1?generation=2 HTTP/1.0\r\n\r\n", 401),
    (b"GET /reshard/1/0/1 HTTP/1.1\r\n\r\n", 401),
    (b"GET /snapshots/1 HTTP/1.1\r\nAuthorization: Bearer wrong\r\n\r\n", 401),
    (b"GET /snapshots/1 HTTP/1.1\r\nAuthorization: Bearer wrong\r\n" + AUTH + b"\r\n", 401),
    (b"GET /snapshots/1 HTTP/1.1\r\n" + AUTH + b"Authorization: Bearer wrong\r\n\r\n", 401),
    (b"GET /nope HTTP/1.1\r\n\r\n", 404),
])
def test_refused_requests_get_no_state(srv, raw, code):
    s, calls = srv
    answer = exchange(s.port, raw)
    assert code_of(answer) == code, answer[:200]
    assert SECRET not in answer and EXPORT not in answer
    assert calls == []
    if code == 405:
        assert b"\r\nAllow: GET\r\n" in answer


@pytest.mark.parametrize("raw, body", [
    (b"GET /snapshots/1 HTTP/1.1\r\n" + AUTH + b"\r\n", SECRET),
    (b"GET /snapshots/1?generation=7 HTTP/1.0\r\n" + AUTH + b"\r\n", SECRET),
    (b"GET /snapshots/1 HTTP/1.1\r\nauthorization: bearer " + TOKEN.encode() + b"\r\n\r\n", SECRET),
    (b"GET /reshard/1/0/1 HTTP/1.1\r\n" + AUTH + b"\r\n", EXPORT),   # a file, streamed
])
def test_the_state_with_the_token(srv, raw, body):
    s, calls = srv
    answer = exchange(s.port, raw)
    assert code_of(answer) == 200
    head, _, got = answer.partition(b"\r\n\r\n")
    assert got == body and b"\r\nContent-Length: %d\r\n" % len(body) in head
    assert len(calls) == 1


def test_state_files_say_404_for_what_they_do_not_have(srv):
    s, calls = srv
    assert code_of(exchange(s.port, b"GET /snapshots/2 HTTP/1.1\r\n" + AUTH + b"\r\n")) == 404
    assert calls == [SnapshotRequest(2, 0)]


@pytest.mark.parametrize("path, marker", [("/healthz", b"ok"), ("/readyz", b"ready"), ("/metrics", b"eopipe_dedup"),
                                          ("/status", b'"pod": "pod-a"')])
def test_the_open_endpoints_need_no_token(srv, path, marker):
    s, calls = srv
    answer = exchange(s.port, b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
    assert code_of(answer) == 200 and marker in answer.partition(b"\r\n\r\n")[2]
    assert calls == []


def test_no_token_refuses_the_state_unless_insecure(tmp_path):
    for kw, code in (({"token": None}, 403), ({"token": None, "insecure": True}, 200)):
        s, _ = server(tmp_path, **kw)
        try:
            answer = exchange(s.port, b"GET /snapshots/1 HTTP/1.1\r\n\r\n")
            assert code_of(answer) == code and (SECRET in answer) == (code == 200)
            assert code_of(exchange(s.port, b"GET snapshots/1 HTTP/1.1\r\n\r\n")) == 400
        finally:
            s.stop()


def test_a_silent_client_is_dropped(tmp_path):
    s, _ = server(tmp_path, idle_seconds=0.3, head_seconds=1.0)
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=WAIT) as c:
            c.sendall(b"GET /healthz HTTP/1.1\r\n")   # and then nothing
            answer = b""
            while chunk := c.recv(65536):              # socket.timeout here: never dropped
                answer += chunk
        assert code_of(answer) == 408
        assert code_of(exchange(s.port, b"GET /healthz HTTP/1.1\r\n\r\n")) == 200
    finally:
        s.stop()


def test_a_trickling_client_is_dropped_at_the_head_deadline(tmp_path):
    # Each byte comes well within the idle timeout: only the deadline on the whole head ends it.
    s, _ = server(tmp_path, idle_seconds=1.0, head_seconds=1.0)
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=WAIT) as c:
            c.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
            t_end = time.monotonic() + WAIT
            while not select.select([c], [], [], 0.1)[0]:
                assert time.monotonic() < t_end, "a trickling client was never dropped"
                c.sendall(b"a")
            answer = b""
            while chunk := c.recv(65536):
                answer += chunk
        assert code_of(answer) == 408
    finally:
        s.stop()


def test_connections_beyond_the_cap_get_503(tmp_path):
    s, _ = server(tmp_path, max_connections=2, idle_seconds=WAIT, head_seconds=WAIT)
    holders = [socket.create_connection(("127.0.0.1", s.port), timeout=WAIT) for _ in range(2)]
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=WAIT) as c:
            answer = b""
            while chunk := c.recv(65536):
                answer += chunk
        assert code_of(answer) == 503 and b"Retry-After: 1" in answer
        # A slot comes back when a connection ends.
        holders.pop().close()
        t_end = time.monotonic() + WAIT
        while code_of(exchange(s.port, b"GET /healthz HTTP/1.1\r\n\r\n")) != 200:
            assert time.monotonic() < t_end, "the freed slot never came back"
            time.sleep(0.05)
    finally:
        for h in holders:
            h.close()
        s.stop()
