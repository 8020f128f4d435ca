"""The worker's router (eopipe.dedup.auth.route): what each request line asks for, and whether
the token is asked of it. Pure: the request line's parts in, the decision out. The same lines
through a real socket: tests/integration/test_state_endpoints.py."""

from __future__ import annotations

import pytest

from eopipe.core.wire import ReshardRequest, SnapshotRequest
from eopipe.dedup import auth
from eopipe.dedup.auth import Kind

TOKEN = "s3cret-Token_0123456789"
BAD, NOT_FOUND = Kind.BAD_REQUEST, Kind.NOT_FOUND

GOOD = [
    ("/healthz", Kind.HEALTHZ, None),
    ("/readyz", Kind.READYZ, None),
    ("/metrics", Kind.METRICS, None),
    ("/status", Kind.STATUS, None),
    ("/snapshots/1", Kind.SNAPSHOT, SnapshotRequest(1, 0)),
    ("/snapshots/0?generation=0", Kind.SNAPSHOT, SnapshotRequest(0, 0)),
    ("/snapshots/12?generation=34", Kind.SNAPSHOT, SnapshotRequest(12, 34)),
    ("/snapshots/1?", Kind.SNAPSHOT, SnapshotRequest(1, 0)),
    ("/reshard/1/0/1", Kind.RESHARD, ReshardRequest(1, 0, 1)),
    ("/reshard/7/11/23", Kind.RESHARD, ReshardRequest(7, 11, 23)),
    ("/", NOT_FOUND, None),
    ("/nope", NOT_FOUND, None),
    ("/healthzz", NOT_FOUND, None),
    ("/Snapshots/1", NOT_FOUND, None),   # paths are case-sensitive: not ours, and no keys
]

REFUSED = [
    # Not an origin-form absolute path: the bypass found, and its cousins.
    "snapshots/1", "reshard/1/0/1", "//snapshots/1", "///snapshots/1", "/snapshots//1", "/snapshots/1/",
    "/./snapshots/1", "/../snapshots/1", "/snapshots/./1", "/snapshots/../status", "/healthz/",
    "/%73napshots/1", "/snapshots/%31", "/snapshots%2f1", "http://h/snapshots/1", "HTTP://h/snapshots/1",
    "h/snapshots/1", "*", "", "?generation=1", "/snapshots/1;x", "/snapshots;x/1", "/snapshots/1#x",
    "/snapshots/1?generation=1#x", "\\snapshots\\1", "/snapshots\\1", "/snapshots/1 ", "/snapshots/\t1",
    "/snapshots/\u00b9", "/snapshots/\u0661", "/sn\u0430pshots/1",
    # Numbers: plain ASCII decimal, canonical, bounded.
    "/snapshots/x", "/snapshots/-1", "/snapshots/+1", "/snapshots/01", "/snapshots/1_0", "/snapshots/1e3",
    "/snapshots/" + "9" * 19, "/reshard/1/0/x", "/reshard/1/0/" + "1" * 40,
    "/snapshots/1?generation=x", "/snapshots/1?generation=", "/snapshots/1?generation=-1",
    "/snapshots/1?generation=01",
    # Segments and query keys: exactly ours.
    "/snapshots", "/snapshots/", "/snapshots/1/2", "/reshard", "/reshard/1", "/reshard/1/0",
    "/reshard/1/0/1/2", "/snapshots/1?generation=1&generation=2", "/snapshots/1?foo=1",
    "/snapshots/1?generation=1&foo=1", "/snapshots/1?generation", "/snapshots/1?&generation=1",
    "/snapshots/1?=1", "/reshard/1/0/1?generation=1", "/healthz?x=1", "/status?verbose=1",
    # Too long to be ours.
    "/" + "a" * 300, "/snapshots/1?generation=1" + "&x=1" * 100,
]


@pytest.mark.parametrize("target, kind, transfer", GOOD)
def test_the_good_targets(target, kind, transfer):
    r = auth.route("GET", target, "HTTP/1.1")
    assert (r.kind, r.transfer) == (kind, transfer)
    assert r.needs_token == (kind in (Kind.SNAPSHOT, Kind.RESHARD))
    assert auth.route("GET", target, "HTTP/1.0") == r


@pytest.mark.parametrize("target", REFUSED)
def test_targets_that_are_not_ours_are_bad_requests(target):
    r = auth.route("GET", target, "HTTP/1.1")
    assert r.kind is BAD and r.transfer is None and not r.needs_token and r.why
    # Refused before the token is looked at: the right token does not make it a state request.
    assert auth.refusal(r, f"Bearer {TOKEN}", TOKEN) is None and auth.refusal(r, None, None) is None


@pytest.mark.parametrize("method, target, version, kind", [
    ("GET", "/snapshots/1", None, BAD),             # an HTTP/0.9 line: no status line to refuse with
    ("GET", "/healthz", None, BAD),
    ("GET", "/snapshots/1", "HTTP/0.9", BAD),
    ("GET", "/snapshots/1", "HTTP/2.0", BAD),
    ("GET", "/snapshots/1", "http/1.1", BAD),
    ("GET", "/snapshots/1", "HTTP/1.1 ", BAD),
    ("GET", "/snapshots/1", "HTTP/1.10", BAD),
    ("get", "/snapshots/1", "HTTP/1.1", BAD),
    ("G\u00c9T", "/snapshots/1", "HTTP/1.1", BAD),
    ("", "/snapshots/1", "HTTP/1.1", BAD),
    ("POST", "/snapshots/1", "HTTP/1.1", Kind.METHOD_NOT_ALLOWED),
    ("HEAD", "/snapshots/1", "HTTP/1.1", Kind.METHOD_NOT_ALLOWED),
    ("PUT", "/status", "HTTP/1.0", Kind.METHOD_NOT_ALLOWED),
    ("DELETE", "/reshard/1/0/1", "HTTP/1.1", Kind.METHOD_NOT_ALLOWED),
    ("CONNECT", "h:80", "HTTP/1.1", Kind.METHOD_NOT_ALLOWED),
    ("OPTIONS", "*", "HTTP/1.1", Kind.METHOD_NOT_ALLOWED),
])
def test_methods_and_versions(method, target, version, kind):
    r = auth.route(method, target, version)
    assert r.kind is kind and r.transfer is None and not r.needs_token


def test_a_get_with_a_body_is_refused():
    assert auth.route("GET", "/snapshots/1", "HTTP/1.1", has_body=True).kind is BAD
    assert auth.route("GET", "/status", "HTTP/1.1", has_body=True).kind is BAD


@pytest.mark.parametrize("target", ["/snapshots/1?generation=2", "/reshard/1/0/1"])
@pytest.mark.parametrize("authorization, token, insecure, code", [
    (f"Bearer {TOKEN}", TOKEN, False, None),
    (None, TOKEN, False, 401),
    ("Bearer wrong", TOKEN, False, 401),
    (f"Bearer {TOKEN}", None, False, 403),
    (None, None, True, None),
])
def test_the_token_is_asked_of_the_state_routes(target, authorization, token, insecure, code):
    res = auth.refusal(auth.route("GET", target, "HTTP/1.1"), authorization, token, insecure)
    assert (res[0] if res else None) == code


@pytest.mark.parametrize("target", ["/healthz", "/readyz", "/metrics", "/status", "/nope"])
def test_the_open_routes_need_no_token(target):
    assert auth.refusal(auth.route("GET", target, "HTTP/1.1"), None, TOKEN) is None


def test_every_request_a_peer_writes_routes_back_to_itself():
    for req in (SnapshotRequest(0), SnapshotRequest(5, 17), ReshardRequest(3, 2, 9), ReshardRequest(0, 0, 0)):
        r = auth.route("GET", req.path, "HTTP/1.1")
        assert r.transfer == req and r.needs_token
