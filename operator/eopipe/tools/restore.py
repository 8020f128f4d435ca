"""`eopipe restore`: a pipeline's manifest made into the one that continues it in another namespace
(docs/operations.md#restore-a-pipeline-into-a-new-namespace).

What carries exactly-once across is outside the namespace: the topics (kept by
`deletionPolicy: Retain`), the dedup group's committed offsets in Kafka, the snapshots in
`spec.dedup.backup` and the Spark sink's commit markers. The restored pipeline finds them by the
origin's names: `spec.restoreFrom`, which this writes (`restored`, pure: a document in, a
document out). The manifest comes from a file, or from `spec.dedup.backup`'s location, where
the dedup pods keep it (`stored`)."""

from __future__ import annotations

from eopipe.core import manifest
from eopipe.core.spec import KIND

# Metadata that belongs to the manifest a user applies; the rest is the stored object's.
KEPT_METADATA = ("labels", "annotations")
# Annotations that are state of the stored object: kubectl's copy of the last apply, and Kopf's
# record of what it handled (copied, the new object's create would be taken as handled).
STATE_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration", "kopf.zalando.org/")


class CannotRestore(ValueError):
    """The document cannot be restored (a usage error: exit 2)."""


class NotStored(RuntimeError):
    """The object store did not give the manifest (exit 1)."""


def stored(uri: str, endpoint: str | None) -> str:
    """The pipeline's manifest the dedup pods keep under `uri` (spec.dedup.backup.uri), read with
    the AWS SDK's credentials (env AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, ...), bounded."""
    from eopipe.dedup import snapshot
    from eopipe.dedup.objectstore import Bucket

    try:
        loc = snapshot.parse_uri(uri)
    except ValueError as e:
        raise CannotRestore(str(e)) from None
    try:
        data = Bucket(loc, endpoint).get_bounded(loc.pipeline_key, snapshot.MAX_PIPELINE_MANIFEST_BYTES)
        return data.decode("utf-8")
    except Exception as e:  # noqa: BLE001 - boto3's errors, unreachable store, not UTF-8: one line
        raise NotStored(f"s3://{loc.bucket}/{loc.pipeline_key}: {type(e).__name__}: {e}") from None


def restored(doc: dict, namespace: str, origin_namespace: str | None = None, name: str | None = None) -> dict:
    """`doc` (a pipeline as written, or as `kubectl get -o yaml` prints it) for `namespace`, with
    spec.restoreFrom naming the pipeline whose Kafka names it takes: the one `doc` already
    continues, else `doc` itself (its namespace: the manifest's, else `origin_namespace`)."""
    if not manifest.is_pipeline(doc):
        raise CannotRestore(f"not an {KIND}")
    try:
        pipeline = manifest.parse(doc)
    except manifest.Invalid as e:
        raise CannotRestore(f"{KIND} not valid: {e.problems[0]}") from None
    origin = pipeline.spec.restore_from
    if origin is not None:
        source = {"namespace": origin.namespace, "name": origin.name}
    elif pipeline.namespace or origin_namespace:
        source = {"namespace": pipeline.namespace or origin_namespace, "name": pipeline.name}
    else:
        raise CannotRestore("the manifest names no namespace: give --from-namespace, where the pipeline ran")
    meta = doc.get("metadata") or {}
    new_meta = {"name": name or pipeline.name, "namespace": namespace}
    for key in KEPT_METADATA:
        kept = {k: v for k, v in (meta.get(key) or {}).items() if not k.startswith(STATE_ANNOTATIONS)}
        if kept:
            new_meta[key] = kept
    spec = {k: v for k, v in doc["spec"].items() if k != "restoreFrom"}
    if source != {"namespace": namespace, "name": new_meta["name"]}:
        spec["restoreFrom"] = source
    elif origin is None:
        raise CannotRestore(f"{namespace}/{new_meta['name']} is the pipeline itself: restore into another "
                            "namespace (--namespace) or name (--name)")
    # else back where it first ran, where those names are its own: no restoreFrom
    return {"apiVersion": doc["apiVersion"], "kind": KIND, "metadata": new_meta, "spec": spec}
