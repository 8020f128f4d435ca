"""Which errors of a reconcile pass are tried again soon, and when (control/transient.py)."""

import json

import pytest
from kubernetes import client
from kubernetes.dynamic.exceptions import api_exception
from urllib3.exceptions import MaxRetryError, ProtocolError

from eopipe.control import transient


def api_error(status: int, message: str | None = None) -> client.ApiException:
    e = client.ApiException(status=status, reason="Reason")
    e.body = json.dumps({"kind": "Status", "message": message}) if message is not None else None
    return e


WEBHOOK = ('Internal error occurred: failed calling webhook "mutate-sparkapplication.sparkoperator.k8s.io": '
           'failed to call webhook: Post "https://spark-operator-webhook-svc.spark-operator.svc:9443": '
           'dial tcp 10.96.0.9:9443: connect: connection refused')


@pytest.mark.parametrize("error, passing", [
    (api_error(500, WEBHOOK), True),             # the Spark Operator's webhook restarting
    (api_exception(api_error(503)), True),       # the dynamic client's ServiceUnavailableError
    (api_error(429), True),                      # the API server's priority and fairness
    (api_error(504), True),
    (api_error(409), False),                     # a conflict is the pass's to decide, not a retry's
    (api_error(422, "spec.x: Invalid value"), False),
    (api_error(403), False),
    (MaxRetryError(None, "/api", reason="connection refused"), True),
    (ProtocolError("Connection aborted."), True),
    (ConnectionResetError(), True),
    (TimeoutError(), True),
    (KeyError("spec"), False),                   # a bug: Kopf's own 60 s and its traceback
    (ValueError("x"), False),
])
def test_is_passing(error, passing):
    assert transient.is_passing(error) is passing


@pytest.mark.parametrize("retry, seconds", [
    (0, 1.0), (1, 2.0), (2, 4.0), (5, 32.0), (6, 60.0), (7, 60.0), (10_000, 60.0), (-1, 1.0),
])
def test_delay_doubles_up_to_kopfs_own(retry, seconds):
    assert transient.delay(retry) == seconds


@pytest.mark.parametrize("error, line", [
    (api_error(500, WEBHOOK), f"the API server answered 500 Reason: {WEBHOOK}"),
    (api_error(503), "the API server answered 503 Reason: no message"),
    (api_error(500, "x" * 900), "the API server answered 500 Reason: " + "x" * 500),
    (TimeoutError("read timed out"), "TimeoutError: read timed out"),
])
def test_describe(error, line):
    assert transient.describe(error) == line
