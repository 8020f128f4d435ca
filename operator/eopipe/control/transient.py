"""Which errors of a pass are passing (the API server or a webhook it calls briefly unavailable)
and how soon the pass is tried again. Kopf waits 60 s after any other exception; a webhook that
is starting (the Spark Operator's, for some seconds after a `helm upgrade` that turns it on) is
asked again after 1 s, then at doubling intervals, as controller-runtime's per-object rate
limiter does (there from 5 ms up to 1000 s; here from 1 s up to Kopf's 60 s)."""

from __future__ import annotations

from kubernetes import client
from urllib3.exceptions import HTTPError

from eopipe.control.kube import api_message

# 429: the API server's priority and fairness; 500: a webhook it could not call, an etcd
# timeout; 502-504: a proxy or aggregated API in between.
PASSING_STATUS = frozenset({429, 500, 502, 503, 504})
REASON = "Retrying"  # the Warning event of each such try
FIRST_DELAY_SECONDS = 1.0
MAX_DELAY_SECONDS = 60.0


def is_passing(e: BaseException) -> bool:
    """An API answer or a connection error that the same request may not get a moment later."""
    if isinstance(e, client.ApiException):
        return e.status in PASSING_STATUS
    return isinstance(e, (HTTPError, ConnectionError, TimeoutError))


def delay(retry: int) -> float:
    """Seconds before the next try, `retry` tries after the first: doubling from
    FIRST_DELAY_SECONDS up to MAX_DELAY_SECONDS (Kopf's own wait for other errors)."""
    return min(FIRST_DELAY_SECONDS * 2 ** min(max(retry, 0), 6), MAX_DELAY_SECONDS)


def describe(e: BaseException) -> str:
    """One line for the retry's event: the API server's reason and message, else the error."""
    if isinstance(e, client.ApiException):
        return f"the API server answered {e.status} {e.reason}: {api_message(e)[:500] or 'no message'}"
    return f"{type(e).__name__}: {e}"
