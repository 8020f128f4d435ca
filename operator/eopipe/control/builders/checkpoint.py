"""The PersistentVolumeClaim of the Spark checkpoint (spec.processing.checkpoint.pvc without
claimName): one per pipeline, mounted in the driver by builders/spark.py."""

from __future__ import annotations

from eopipe.core.names import Names


def claim(names: Names) -> dict | None:
    """The claim to create, or None (no Spark stage, a remote URI, or the user's own claim)."""
    proc = names.spec.processing
    pvc = proc.checkpoint.pvc if proc is not None else None
    if pvc is None or pvc.claim_name is not None:
        return None
    spec = {"accessModes": [pvc.access_mode], "resources": {"requests": {"storage": pvc.size}}}
    if pvc.storage_class_name is not None:
        spec["storageClassName"] = pvc.storage_class_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": names.spark_checkpoint_claim, "namespace": names.namespace,
                         "labels": names.labels("processing")},
            "spec": spec}


def claim_name(names: Names) -> str | None:
    """The claim mounted for the checkpoint: the user's or the operator's; None for a URI."""
    pvc = names.spec.processing.checkpoint.pvc
    return None if pvc is None else pvc.claim_name or names.spark_checkpoint_claim


def owned(names: Names) -> bool:
    """Whether the pipeline owns the claim (deleted with it): with deletionPolicy Delete only, so
    a pipeline re-created under the same name resumes from its checkpoint, as from its topics."""
    return names.spec.deletion_policy == "Delete"
