"""What a request to the worker is, and who may make it: the router and the state token.

`route(method, target, version)` is the one place that decides what a request asks for. It is
pure (the request line's facts in, a `Route` out) and strict: only GET, HTTP/1.0 or 1.1, and an
origin-form target made of the characters our own paths use. Anything else is BAD_REQUEST
(400) or METHOD_NOT_ALLOWED (405) before any endpoint or token is looked at: a target without
its leading '/', with '//', dot segments, percent-escapes, ';' parameters, a '#', a backslash,
an absolute URL, a number that is not plain decimal, an extra segment or an unknown or repeated
query key. The token is then asked of the parsed route (`Route.needs_token`), never of the raw
string: a decision on the raw string let `GET snapshots/1` through, unauthenticated, because
the path parser stripped the slashes the token check looked for.

/snapshots/... and /reshard/... serve dedup keys (often payment or user ids), so they answer
only a request that carries `Authorization: Bearer <the pipeline's token>`. The operator keeps
one random token per pipeline in a Secret and every dedup pod gets it as env EOPIPE_TOKEN
(docs/design.md#access-control); the pods send it to each other. /healthz, /readyz, /metrics
and /status stay open: kubelet probes and Prometheus carry no token, and they serve no keys.

A worker without a token refuses the state endpoints (403) rather than serve them open: a local
run that wants them open says so with --insecure-state-endpoints.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from eopipe.core.wire import ReshardRequest, SnapshotRequest, parse_transfer

TOKEN_ENV = "EOPIPE_TOKEN"

UNAUTHORIZED = (401, {"WWW-Authenticate": 'Bearer realm="eopipe-state"'},
                b"unauthorized: the state endpoints need the pipeline's bearer token\n")
DISABLED = (403, {}, (b"state transfer disabled: this worker has no token (EOPIPE_TOKEN or --token-file; "
                      b"--insecure-state-endpoints serves it open)\n"))


class Kind(StrEnum):
    HEALTHZ = "healthz"
    READYZ = "readyz"
    METRICS = "metrics"
    STATUS = "status"
    SNAPSHOT = "snapshot"
    RESHARD = "reshard"
    NOT_FOUND = "not-found"
    BAD_REQUEST = "bad-request"
    METHOD_NOT_ALLOWED = "method-not-allowed"


OPEN = {"/healthz": Kind.HEALTHZ, "/readyz": Kind.READYZ, "/metrics": Kind.METRICS, "/status": Kind.STATUS}
VERSIONS = ("HTTP/1.0", "HTTP/1.1")
# Our longest target is /reshard/<id>/<p>/<q> or /snapshots/<p>?generation=<g>: under 100.
MAX_TARGET = 256
# Origin-form in the characters our paths use. No '%' (an escape could spell a path the checks
# below never saw), no '.' (no dot segments), no ';', '#', '\\', ':' (no params, fragments,
# Windows paths or absolute URLs).
_TARGET = re.compile(r"/[A-Za-z0-9_/-]*(\?[A-Za-z0-9_=&-]*)?")
_METHOD = re.compile(r"[A-Z]{1,16}")


@dataclass(frozen=True)
class Route:
    kind: Kind
    transfer: SnapshotRequest | ReshardRequest | None = None
    why: str = ""   # BAD_REQUEST: what is wrong, in our words (never echoes the request)

    @property
    def needs_token(self) -> bool:
        return self.kind in (Kind.SNAPSHOT, Kind.RESHARD)


def _bad(why: str) -> Route:
    return Route(Kind.BAD_REQUEST, why=why)


def route(method: str, target: str, version: str | None, *, has_body: bool = False) -> Route:
    """What the request line asks for. `version` None: an HTTP/0.9 line (no version), which
    has no status line or headers to answer a refusal with, so it is refused as a whole."""
    if version not in VERSIONS:
        return _bad("HTTP/1.0 or HTTP/1.1 only")
    if not _METHOD.fullmatch(method):
        return _bad("malformed method")
    if method != "GET":
        return Route(Kind.METHOD_NOT_ALLOWED)
    if has_body:  # never read: it would be the next request on the connection
        return _bad("a GET has no body")
    if len(target) > MAX_TARGET:
        return _bad("target too long")
    if not _TARGET.fullmatch(target):
        return _bad("not an absolute path in plain characters")
    path, _, query = target.partition("?")
    if path != "/" and "" in path[1:].split("/"):
        return _bad("empty path segment")
    if path in OPEN:
        return Route(OPEN[path]) if not query else _bad("no query here")
    try:
        transfer = parse_transfer(path, query)
    except ValueError as e:
        return _bad(str(e))
    if transfer is None:
        return Route(Kind.NOT_FOUND)
    return Route(Kind.SNAPSHOT if isinstance(transfer, SnapshotRequest) else Kind.RESHARD, transfer)


def refusal(r: Route, authorization: str | None, token: str | None, insecure: bool = False) -> tuple | None:
    """None if the routed request may go on, else the (code, headers, body) to answer it with.
    `authorization`: the request's one Authorization header (None if it has none or several)."""
    if not r.needs_token:
        return None
    if token is None:
        return None if insecure else DISABLED
    scheme, _, given = (authorization or "").partition(" ")
    # Constant-time: the comparison must not tell how much of a guessed token was right.
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
        return None
    return UNAUTHORIZED


def headers(token: str | None) -> dict[str, str]:
    """What a peer sends with a state request."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def read_token(environ: Mapping[str, str], token_file: str | None) -> str | None:
    """The token from --token-file, else env EOPIPE_TOKEN; None if neither is given.
    ValueError (one line, no token in it) if the one given is unreadable or empty."""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read --token-file {token_file}: {getattr(e, 'strerror', None) or e}") from None
        where = f"--token-file {token_file}"
    elif TOKEN_ENV in environ:
        text, where = environ[TOKEN_ENV], f"env {TOKEN_ENV}"
    else:
        return None
    token = text.strip()
    if not token:
        raise ValueError(f"{where} is empty")
    if any(c.isspace() for c in token) or not token.isprintable():
        raise ValueError(f"{where}: the token must be one word of printable characters")
    return token
