"""control/ownership.py: the operator writes only objects it made for the pipeline."""

import pytest

from eopipe.control.ownership import CONFLICT, CREATE, MANAGED_BY, UPDATE, ObjectConflict, decide
from eopipe.core.names import LABEL_MANAGED_BY
from tests.helpers.pipelines import example_names

UID = "uid-of-the-pipeline"
OURS = {"eopipe.dev/pipeline": "x", "app.kubernetes.io/managed-by": "eopipe-operator"}


def ref(uid: str, controller: bool | None = True, kind: str = "ExactlyOncePipeline") -> dict:
    r = {"apiVersion": "eopipe.dev/v1beta1", "kind": kind, "name": "x", "uid": uid}
    return r if controller is None else {**r, "controller": controller}


def meta(*refs: dict, labels: dict | None = None) -> dict:
    m = {"name": "x-spark", "namespace": "t", "uid": "uid-of-the-object"}
    if refs:
        m["ownerReferences"] = list(refs)
    if labels is not None:
        m["labels"] = labels
    return m


@pytest.mark.parametrize("existing, kept_for, want", [
    (None, None, CREATE),
    (None, "x", CREATE),
    # Controlled by this pipeline.
    (meta(ref(UID)), None, UPDATE),
    (meta(ref("another-owner", controller=False), ref(UID)), None, UPDATE),
    (meta(ref(UID), labels={}), "x", UPDATE),             # the claim under deletionPolicy Delete
    # Made by someone else, or by another pipeline (an older one of the same name included).
    (meta(), None, CONFLICT),
    (meta(labels=OURS), None, CONFLICT),                  # labels are no proof on ordinary objects
    (meta(ref("another-uid")), None, CONFLICT),
    (meta(ref("another-uid")), "x", CONFLICT),            # labelled ours, but someone else controls it
    (meta(ref("another-uid"), labels=OURS), "x", CONFLICT),
    (meta(ref(UID, controller=False)), None, CONFLICT),   # a mere owner reference is not control
    (meta(ref(UID, controller=None)), None, CONFLICT),
    (meta(ref(UID, kind="Deployment"), labels=OURS), "x", UPDATE),  # the uid is the pipeline's
    # Retained (no owner by design): the operator's labels for this pipeline's name.
    (meta(labels=OURS), "x", UPDATE),
    (meta(ref("someone", controller=False), labels=OURS), "x", UPDATE),
    (meta(labels=OURS), "y", CONFLICT),
    (meta(labels={**OURS, "eopipe.dev/pipeline": "y"}), "x", CONFLICT),
    (meta(labels={"eopipe.dev/pipeline": "x"}), "x", CONFLICT),
    (meta(labels={**OURS, "app.kubernetes.io/managed-by": "helm"}), "x", CONFLICT),
    (meta(), "x", CONFLICT),
])
def test_decide(existing, kept_for, want):
    assert decide(existing, UID, kept_for) == want


def test_the_retained_marker_is_what_the_builders_label():
    labels = example_names().labels("processing")
    assert labels[LABEL_MANAGED_BY] == MANAGED_BY
    assert decide({"name": "payments-spark-checkpoint", "labels": labels}, UID, "payments") == UPDATE


def test_the_conflict_names_the_object():
    e = ObjectConflict("Role", "t", "x-spark")
    assert str(e).startswith("Role t/x-spark exists and is not this pipeline's")
