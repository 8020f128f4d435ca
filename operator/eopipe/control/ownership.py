"""Whether the operator may write an object of a pipeline's: only one it made for that pipeline.

A name like `<pipeline>-spark` can be taken by anyone with rights in the namespace first; taking
it over (rewriting it, adding the pipeline's ownerReference, so that deleting the pipeline
garbage-collects it) would let a pipeline reach past its own objects. So an existing object is
the pipeline's only if a controller ownerReference names the pipeline's uid, or, for an object
that outlives its pipeline by design (the Spark checkpoint claim under deletionPolicy Retain,
which a pipeline re-created under the same name resumes from), if it has no controller and
carries the labels the operator puts on it for that pipeline's name.

Pure: the object's metadata as read and the owner's uid in, a decision out (I/O: control/kube.py
and control/tokens.py).
"""

from __future__ import annotations

from eopipe.core.names import LABEL_MANAGED_BY, LABEL_PIPELINE, MANAGED_BY

CREATE, UPDATE, CONFLICT = "create", "update", "conflict"


class ObjectConflict(Exception):
    """An object the pipeline would write exists and is not the pipeline's; left untouched."""

    def __init__(self, kind: str, namespace: str, name: str):
        self.kind, self.namespace, self.name = kind, namespace, name
        super().__init__(f"{kind} {namespace}/{name} exists and is not this pipeline's: the operator "
                         "leaves it as it is and goes no further; delete or rename it, or rename the pipeline")


def _controller(meta: dict) -> dict | None:
    return next((r for r in meta.get("ownerReferences") or () if r.get("controller")), None)


def decide(existing: dict | None, owner_uid: str, kept_for: str | None = None) -> str:
    """CREATE (nothing there), UPDATE (the pipeline's own) or CONFLICT (someone else's).

    existing: the object's metadata, None if there is no object. kept_for: the pipeline's name
    for an object that may outlive its pipeline (then the operator's labels for that name, with
    no controller at all, also make it the pipeline's); None for every other object."""
    if existing is None:
        return CREATE
    controller = _controller(existing)
    if controller is not None:
        return UPDATE if controller.get("uid") == owner_uid else CONFLICT
    labels = existing.get("labels") or {}
    if kept_for is not None and labels.get(LABEL_PIPELINE) == kept_for \
            and labels.get(LABEL_MANAGED_BY) == MANAGED_BY:
        return UPDATE
    return CONFLICT
