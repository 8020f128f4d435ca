"""Whether the pass writes the SparkApplication now (pure).

The Kubeflow Spark Operator (v2.5.2) runs spark-submit for a new SparkApplication inside a
retry-on-conflict loop around its status write: any write to the object between its read and that
status write (a second apply, a managedFields clean-up) makes it submit again, fail ("driver pod
already exists", SUBMISSION_FAILED), delete that driver and resubmit 20 s later. So the object is
made in one write (a POST: Applier.apply's `create_only`), and no spec or metadata write follows
until the Spark Operator has recorded its submission (status.applicationState), unless what the
operator wants really differs from what is there; after that, applies are as for every object
(drift repair, field ownership).
"""

from __future__ import annotations


def _contains(live, want) -> bool:
    """Every field of `want` is in `live` with that value; the API server and the Spark Operator's
    webhook may add fields (defaults), which are no difference."""
    if isinstance(want, dict):
        return isinstance(live, dict) and all(k in live and _contains(live[k], v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(live, list) and len(live) == len(want) and all(map(_contains, live, want))
    return live == want


def write_now(live: dict | None, desired: dict) -> bool:
    """Whether to apply `desired` (the built SparkApplication) to `live` (as read; None: missing)."""
    # v2.5.2's state of a new application is "" (ApplicationStateNew): not yet submitted.
    if live is None or (((live.get("status") or {}).get("applicationState") or {}).get("state")):
        return True
    labels = (desired.get("metadata") or {}).get("labels") or {}
    return not (_contains(live.get("spec"), desired.get("spec") or {})
                and _contains((live.get("metadata") or {}).get("labels") or {}, labels))
