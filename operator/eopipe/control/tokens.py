"""The pipeline's token Secret: created once with a random token, then only read.

Not server-side applied like the other children: an apply would write a new random token on
every pass. A create that finds the Secret already there (409) reads it instead and checks it
holds a usable token; it is never rewritten, so a token changes only when someone deletes the
Secret (docs/operations.md#rotating-the-state-token). A Secret of that name that is not the
pipeline's (control/ownership.py) is neither read for its token nor touched: ObjectConflict.
RBAC: secrets create (which RBAC cannot limit to one name) and get.
"""

from __future__ import annotations

import json
import logging

from kubernetes import client

from eopipe.control import ownership
from eopipe.control.builders import access
from eopipe.control.kube import ApplyError, owner_reference
from eopipe.core.names import Names

log = logging.getLogger(__name__)


class TokenSecretError(ApplyError):
    """The token Secret exists but gives the pods no token, or the API refused to create it."""

    def __init__(self, name: str, message: str, status: int = 422):
        self.kind, self.name, self.status = "Secret", name, status
        Exception.__init__(self, message)


def ensure_token_secret(core: client.CoreV1Api, names: Names, owner: dict) -> bool:
    """Creates the pipeline's token Secret if missing; True if it was created now."""
    manifest = access.token_secret(names, access.new_token())
    manifest["metadata"]["ownerReferences"] = [owner_reference(owner)]
    try:
        core.create_namespaced_secret(names.namespace, manifest)
        log.info("created the state-endpoint token Secret %s/%s", names.namespace, names.token_secret)
        return True
    except client.ApiException as e:
        if e.status != 409:
            if e.status in (400, 403, 422):
                raise TokenSecretError(names.token_secret, f"Secret {names.token_secret}: {_message(e)}",
                                       e.status) from None
            raise
    # As the API writes it (ownerReferences, not the client model's owner_references).
    existing = core.api_client.sanitize_for_serialization(
        core.read_namespaced_secret(names.token_secret, names.namespace))
    if ownership.decide(existing["metadata"], owner["metadata"]["uid"]) == ownership.CONFLICT:
        raise ownership.ObjectConflict("Secret", names.namespace, names.token_secret)
    problem = access.token_problem(existing)
    if problem:
        raise TokenSecretError(names.token_secret, problem)
    return False


def _message(e: client.ApiException) -> str:
    try:
        return json.loads(e.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(e.reason)
