"""Who may read the worker's state: the bearer token of the state-transfer endpoints.

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
from collections.abc import Mapping

STATE_PREFIXES = ("/snapshots/", "/reshard/")
TOKEN_ENV = "EOPIPE_TOKEN"

UNAUTHORIZED = (401, {"WWW-Authenticate": 'Bearer realm="eopipe-state"'},
                b"unauthorized: the state endpoints need the pipeline's bearer token\n")
DISABLED = (403, {}, (b"state transfer disabled: this worker has no token (EOPIPE_TOKEN or --token-file; "
                      b"--insecure-state-endpoints serves it open)\n"))


def is_state_path(path: str) -> bool:
    return path.startswith(STATE_PREFIXES)


def refusal(path: str, authorization: str | None, token: str | None, insecure: bool = False) -> tuple | None:
    """None if the request may go on, else the (code, headers, body) to answer it with."""
    if not is_state_path(path):
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
