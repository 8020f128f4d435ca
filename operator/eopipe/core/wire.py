"""What the planes say to each other over HTTP: the dedup worker's /status, and state transfer.

The dedup worker writes `PodStatus` at GET /status; the operator reads it into its rebalance
facts (control/rebalance.py `PodFacts`). During a rebalance both versions run side by side, so
the JSON keeps its keys, a reader ignores the keys it does not know (a newer writer) and
defaults the ones that are missing (an older one), and a state or method it does not know
stays a plain str (never "running", so a rebalance waits rather than misreads it).

Between dedup pods (docs/design.md#snapshot-handoff, docs/design.md#re-shard-on-partition-growth):
    GET /snapshots/<p>?generation=<g>    a released partition's packed store
    GET /reshard/<id>/<p>/<q>            the keys of old partition p whose new home is q
with the facts of the transfer in the H_* headers. Both need `Authorization: Bearer <token>`, the
pipeline's token (eopipe.dedup.auth); /status is open.

Both readers are strict, because the other side may be broken or hostile: `parse_transfer`
takes only the paths `.path` writes (plain ASCII numbers, the exact segments, no unknown or
repeated query key; ValueError for the rest), and `read_status` reads at most STATUS_MAX_BYTES
within STATUS_READ_SECONDS, a pod answering anything else being unreadable (None), never an
exception in the operator.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.parse
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field


class PartitionState(StrEnum):
    STARTING = "starting"
    FETCHING = "fetching"        # downloading the old owner's snapshot (handoff)
    RECOVERING = "recovering"
    IMPORTING = "importing"      # importing re-sharded keys from the old partitions' owners
    RUNNING = "running"
    STOPPING = "stopping"        # committing its open transaction
    STOPPED = "stopped"
    FENCED = "fenced"
    FAILED = "failed"


class RecoveryAction(StrEnum):
    NONE = "none"
    RESET = "reset"
    REBUILD = "rebuild"
    REPLAY = "replay"


class MigrationMethod(StrEnum):
    SNAPSHOT = "snapshot"
    REBUILD = "rebuild"
    LOCAL = "local"                      # the state was already on this pod
    RESHARD_IMPORT = "reshard-import"


def _tolerant(enum: type[Enum]):
    return Annotated[enum | str, Field(union_mode="left_to_right")]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    @classmethod
    def from_json(cls, doc: dict):
        return cls.model_validate(doc)

    def to_json(self) -> dict:
        # Only what the writer set: the JSON has the keys it had before these models.
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class Recovery(_Wire):
    """How the partition's last recovery went (empty until it is done)."""
    recovery: _tolerant(RecoveryAction) | None = None
    applied_before: int | None = None    # the store's applied offset before it
    replayed: int | None = None          # source records scanned into the store
    recovery_seconds: float | None = None
    high_watermark: int | None = None
    snapshot_offset: int | None = None   # the lost store came back from a snapshot at this offset


class Migration(_Wire):
    """How the partition's state came to this pod (handoff or re-shard), kept across restarts."""
    method: _tolerant(MigrationMethod) | None = None
    generation: int | None = None
    from_: str | None = Field(None, alias="from")   # the old owner
    restarted: bool | None = None       # this pod restarted after the migration
    reshard: int | None = None
    bytes: int | None = None
    keys: int | None = None
    sha256: str | None = None
    fetch_ms: int | None = None          # from the first request, waits for the old owner included
    transfer_ms: int | None = None       # the download and install that succeeded
    import_ms: int | None = None
    stopped_at_ms: int | None = None    # when the old owner stopped the partition
    pause_ms: int | None = None         # from then until it ran here
    running_at_ms: int | None = None
    reason: str | None = None           # why the state was rebuilt


class StoreStats(_Wire):
    """The partition's RocksDB state; the operator reports the window it really covers. The
    other figures (segments, SST and memtable bytes, watermark) pass through for people."""
    model_config = ConfigDict(extra="allow")

    keys: int | None = None
    bytes: int | None = None
    # How far back a duplicate is surely caught: less than the window after a rebuild from a
    # source whose retention had already dropped part of it.
    effective_window_seconds: float | None = None


class PartitionStatus(_Wire):
    state: _tolerant(PartitionState)
    error: str | None = None
    committed: int | None = None         # the group's committed offset == the store's applied
    lag: int | None = None
    recovery: Recovery = Field(default_factory=Recovery)
    migration: Migration | None = None
    store: StoreStats | None = None


class PodStatus(_Wire):
    pipeline: str | None = None
    namespace: str | None = None
    pod: str | None = None
    generation: int | None = None        # of the assignment applied; None: none read yet
    owned: list[int] = Field(default_factory=list)
    paused: bool = False                 # told to pause, and every partition committed and stopped
    partition_count: int | None = None   # of the home check
    source_partitions: int | None = None
    window_seconds: float | None = None
    ready: bool = False
    partitions: dict[int, PartitionStatus] = Field(default_factory=dict)
    released: dict[int, dict[str, Any]] = Field(default_factory=dict)  # snapshot manifests served
    memory: dict[str, Any] = Field(default_factory=dict)
    counts: dict[str, int] = Field(default_factory=dict)  # committed since the pod started (Totals)


# -- state transfer ---------------------------------------------------------------------------
H_SHA = "X-Eopipe-Sha256"
H_APPLIED = "X-Eopipe-Applied-Offset"
H_STOPPED = "X-Eopipe-Stopped-At-Ms"
H_KEYS = "X-Eopipe-Keys"


@dataclass(frozen=True)
class SnapshotRequest:
    partition: int
    generation: int = 0    # the asker's assignment generation: a server behind it says 503

    @property
    def path(self) -> str:
        return f"/snapshots/{self.partition}?generation={self.generation}"


@dataclass(frozen=True)
class ReshardRequest:
    reshard: int
    source: int            # the old partition
    target: int            # the partition its keys move to

    @property
    def path(self) -> str:
        return f"/reshard/{self.reshard}/{self.source}/{self.target}"


# Canonical ASCII decimal, below 10**18: str.isdigit would take "²" or "١", int() takes " 1", "+1", "1_0".
_NUMBER = re.compile(r"0|[1-9][0-9]{0,17}")


def _number(text: str) -> int:
    if not _NUMBER.fullmatch(text):
        raise ValueError("not a plain number")
    return int(text)


def _query(query: str) -> dict[str, str]:
    """key=value pairs; ValueError on a repeated key or a pair without '='."""
    out: dict[str, str] = {}
    for pair in query.split("&") if query else ():
        k, eq, v = pair.partition("=")
        if not k or not eq or k in out:
            raise ValueError("malformed query")
        out[k] = v
    return out


def parse_transfer(path: str, query: str) -> SnapshotRequest | ReshardRequest | None:
    """The request of a state-transfer path (the inverse of `.path`); None if the path is not
    under /snapshots/ or /reshard/. ValueError if it is but malformed: another number of
    segments, a number that is not plain ASCII decimal, a query key unknown or repeated. The
    request target's form (origin-form, characters) is eopipe.dedup.auth.route's to check."""
    if not path.startswith("/"):
        raise ValueError("not an absolute path")
    parts = path[1:].split("/")
    if parts[0] not in ("snapshots", "reshard"):
        return None
    params = _query(query)
    if parts[0] == "snapshots":
        if len(parts) != 2 or set(params) - {"generation"}:
            raise ValueError("malformed snapshot request")
        return SnapshotRequest(_number(parts[1]), _number(params.get("generation", "0")))
    if len(parts) != 4 or params:
        raise ValueError("malformed reshard request")
    return ReshardRequest(_number(parts[1]), _number(parts[2]), _number(parts[3]))


# -- the operator reading a pod's /status -------------------------------------------------------
# A /status is a few hundred bytes per partition; 4 MiB is thousands of partitions. A pod that
# sends more, or trickles it, is broken or hostile: the operator must not hold it in memory or
# wait on it (the rebalance reads every pod each pass).
STATUS_MAX_BYTES = 4 << 20
STATUS_READ_SECONDS = 5.0
_READ_CHUNK = 1 << 16


def read_capped(stream, limit: int, deadline: float) -> bytes:
    """The rest of `stream` (a response), at most `limit` bytes, read by the monotonic
    `deadline`; ValueError otherwise. Each read returns what one receive got (read1), so a
    trickling sender meets the deadline instead of holding the reader."""
    parts: list[bytes] = []
    n = 0
    while chunk := stream.read1(min(_READ_CHUNK, limit + 1 - n)):
        n += len(chunk)
        if n > limit:
            raise ValueError(f"body over {limit} bytes")
        if time.monotonic() > deadline:
            raise ValueError("body not read in time")
        parts.append(chunk)
    return b"".join(parts)


def json_object(body: bytes) -> dict:
    """ValueError if `body` is not one JSON object (or is nested beyond reason)."""
    try:
        doc = json.loads(body)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


class _DeadlineSocket(socket.socket):
    """http.client reads an answer receive by receive (its status line, any number of
    "100 Continue" heads before it, each header, the body), each with only the connection's own
    timeout: here every receive also ends by the monotonic `deadline`, so a peer trickling or
    repeating its head cannot hold the reader past it."""
    deadline = float("inf")
    per_read: float | None = None

    def recv_into(self, buffer, nbytes=0, flags=0):
        left = self.deadline - time.monotonic()
        if left > 0:
            self.settimeout(left if self.per_read is None else min(left, self.per_read))
            try:
                return super().recv_into(buffer, nbytes, flags)
            except TimeoutError:
                if time.monotonic() < self.deadline:
                    raise
        raise TimeoutError("the answer was not read in time")


class _Connection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, per_read: float, deadline: float):
        super().__init__(host, port, timeout=per_read)
        self.deadline = deadline

    def connect(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no time left to connect")
        plain = socket.create_connection((self.host, self.port), min(self.timeout, left))
        sock = _DeadlineSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
        sock.deadline, sock.per_read = self.deadline, self.timeout
        sock.settimeout(min(self.timeout, left))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock


def open_get(url: str, per_read: float, deadline: float, headers: dict | None = None) -> http.client.HTTPResponse:
    """GET url (http:// only), its response's head read: every receive waits at most `per_read`
    seconds and, head and body alike, ends by the monotonic `deadline` (TimeoutError, an
    OSError). What answers is the peer asked: no redirect is followed, no proxy is used (the
    environment's http_proxy is for the pod's own traffic, not for the cluster's)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not an http:// URL: {url[:100]!r}")
    conn = _Connection(parts.hostname, parts.port or 80, per_read, deadline)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request("GET", target, headers={**(headers or {}), "Connection": "close"})
        r = conn.getresponse()
    except BaseException:
        conn.close()
        raise
    # One request per connection: the response owns it (as http.client hands it over when the
    # peer says it will close), and its file keeps the socket open until it is closed.
    r.will_close = True
    if (sock := conn.sock) is not None:
        conn.sock = None
        sock.close()
    return r


def get_capped(url: str, timeout: float, limit: int, within: float) -> bytes:
    """The body of GET url, at most `limit` bytes, the whole exchange `within` seconds;
    ValueError for an answer other than 200, a body announced or found longer, cut short of its
    Content-Length or read too slowly (OSError and HTTPException as http.client raises them)."""
    deadline = time.monotonic() + within
    with open_get(url, timeout, deadline) as r:
        if r.status != 200:
            raise ValueError(f"HTTP {r.status}")
        announced = r.headers.get("Content-Length")
        if announced is not None and (not announced.isascii() or not announced.strip().isdigit()
                                      or int(announced) > limit):
            raise ValueError(f"Content-Length {announced[:20]!r} is not a length up to {limit}")
        body = read_capped(r, limit, deadline)
        if announced is not None and len(body) != int(announced):
            raise ValueError("body cut short of its Content-Length")
        return body


def status_from_body(body: bytes) -> PodStatus:
    """ValueError if `body` is not a /status (not JSON, not an object, nested beyond reason)."""
    return PodStatus.from_json(json_object(body))


def read_status(url: str, timeout: float, *, limit: int = STATUS_MAX_BYTES,
                within: float = STATUS_READ_SECONDS) -> PodStatus | None:
    """GET url (a pod's /status); None if the pod does not answer it readably: unreachable, an
    HTTP error, malformed HTTP, a body over `limit` or not read `within` seconds, not a /status.
    The rebalance treats such a pod as not answering."""
    try:
        return status_from_body(get_capped(url, timeout, limit, within))
    except (OSError, ValueError, http.client.HTTPException):  # ValidationError is a ValueError
        return None
