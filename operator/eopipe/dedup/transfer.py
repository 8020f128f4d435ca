"""Fetching state from another pod over HTTP, within bounds (docs/design.md#snapshot-handoff).

A transfer is data from another pod: a download must announce its Content-Length, is refused
before a byte is written unless that fits the free disk space with DISK_MARGIN to spare, and is
refused if the body runs longer (or shorter) than announced or its sha256 differs. Every refusal
is a TransferError, which the worker answers with a rebuild (dedup/incoming.py).
"""

from __future__ import annotations

import hashlib
import http.client
import re
import shutil
import time
from pathlib import Path

from eopipe.core.wire import H_APPLIED, H_KEYS, H_SHA, H_STOPPED, open_get
from eopipe.dedup import auth

CHUNK = 1 << 20
BUSY_RETRY = 0.05  # seconds before asking again after a 503
# Left free after a transfer lands: RocksDB's own writes (WAL, flushes, compactions) and the
# logs need room too, and a full disk would fail the partitions that are running.
DISK_MARGIN = 64 << 20
_INT = re.compile(r"-?[0-9]{1,19}")


class TransferError(Exception):
    """The state could not be fetched; `final` means retrying will not help (404, 410);
    `busy` that the peer answered it is not ready yet (503): worth asking again soon."""

    def __init__(self, msg: str, final: bool = False, busy: bool = False):
        super().__init__(msg)
        self.final = final
        self.busy = busy


def _get(url: str, timeout: float, deadline: float, token: str | None = None) -> http.client.HTTPResponse:
    try:
        r = open_get(url, timeout, deadline, auth.headers(token))
    except http.client.HTTPException as e:  # not HTTP, or cut short in its head
        raise TransferError(f"{url}: malformed answer ({type(e).__name__})") from None
    except (OSError, ValueError) as e:
        raise TransferError(f"{url}: {e}") from None
    if r.status != 200:
        r.close()
        # 401/403: the peer has another token or none; waiting does not change that.
        raise TransferError(f"{url}: HTTP {r.status}", final=r.status in (401, 403, 404, 410), busy=r.status == 503)
    return r


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def ensure_room(directory: Path, size: int, what: str) -> None:
    """TransferError (final: a rebuild needs no transfer) unless `size` bytes fit in
    `directory`'s file system with DISK_MARGIN left."""
    free = free_bytes(directory)
    if size > free - DISK_MARGIN:
        raise TransferError(f"{what}: {size} bytes do not fit ({free} free, {DISK_MARGIN} kept)", final=True)


def announced_size(url: str, value: str | None) -> int:
    """The Content-Length a transfer must announce: without it, no bound to check it against."""
    if value is None or not _INT.fullmatch(value.strip()) or int(value) < 0:
        raise TransferError(f"{url}: no valid Content-Length", final=True)
    return int(value)


def header_facts(url: str, headers) -> dict[str, int | None]:
    """The transfer's facts as numbers (None: not sent; "None" as an older server sent it)."""
    out: dict[str, int | None] = {}
    for k in (H_APPLIED, H_STOPPED, H_KEYS):
        v = (headers.get(k) or "").strip()
        if v in ("", "None"):
            out[k] = None
        elif _INT.fullmatch(v):
            out[k] = int(v)
        else:
            raise TransferError(f"{url}: malformed {k} header", final=True)
    return out


def copy_capped(src, dst, size: int, what: str) -> str:
    """Copies exactly `size` bytes of src (a response) into dst; its sha256 (hex). TransferError
    if src ends short of `size`, or has more: a body over what it announced is not read past
    the first byte too many."""
    h = hashlib.sha256()
    got = 0
    while chunk := src.read(min(CHUNK, size + 1 - got)):
        got += len(chunk)
        if got > size:
            raise TransferError(f"{what}: body longer than the {size} bytes announced", final=True)
        dst.write(chunk)
        h.update(chunk)
    if got != size:
        raise TransferError(f"{what}: got {got} bytes, expected {size}")
    return h.hexdigest()


def download(url: str, dest: Path, *, timeout: float = 30, deadline: float | None = None,
             token: str | None = None) -> dict:
    """GETs url into dest with the pipeline's token, within the bounds above and by the
    monotonic `deadline` (default: `timeout` from now), head and body; checks the size and
    sha256. Returns the headers' facts (numbers) and how long it took (ms)."""
    t0 = time.monotonic()
    with _get(url, timeout, t0 + timeout if deadline is None else deadline, token) as r:
        size = announced_size(url, r.headers.get("Content-Length"))
        facts = header_facts(url, r.headers)
        want = r.headers.get(H_SHA)
        ensure_room(Path(dest).parent, size, url)
        try:
            with open(dest, "wb") as f:
                digest = copy_capped(r, f, size, url)
        except (OSError, http.client.HTTPException) as e:  # the peer went away mid-body, or our disk
            raise TransferError(f"{url}: {type(e).__name__}: {e}") from None
    if want and digest != want:
        raise TransferError(f"{url}: sha256 mismatch (got {digest[:12]}, expected {want[:12]})")
    return {"bytes": size, "sha256": digest, "ms": int((time.monotonic() - t0) * 1000), **facts}


def fetch_with_retries(url: str, dest: Path, *, deadline: float, should_stop=lambda: False,
                       on_retry=lambda err: None, token: str | None = None) -> dict:
    """Retries transient failures (connection refused while A restarts, 503 while A prepares,
    a checksum mismatch) until the monotonic deadline; 404/410 give up at once. A 503 is asked
    again after BUSY_RETRY: A is seconds at most from ready, and the partition waits for it."""
    delay = 0.2
    while True:
        if should_stop():
            raise TransferError("stopping", final=True)
        try:
            return download(url, dest, timeout=max(1.0, min(60.0, deadline - time.monotonic())),
                            deadline=deadline, token=token)
        except TransferError as e:
            busy = e.busy
            wait = BUSY_RETRY if busy else delay
            if e.final or time.monotonic() + wait >= deadline:
                raise
            on_retry(e)
        time.sleep(wait)
        if not busy:
            delay = min(delay * 1.5, 2.0)
