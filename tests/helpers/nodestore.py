"""The object store of the node-tier tests: SeaweedFS as a pod (localenv/node/objectstore.py) with
the bucket `eopipe`, the Secret a user keeps its credentials in, and the spec fields that point
a pipeline's dedup snapshots or Spark checkpoint at it."""

from __future__ import annotations

import json
import secrets
import time

from eopipe.core.kafkaconf import OPT_IN
from localenv.node import objectstore as node_objectstore
from localenv.objectstore import S3Credentials, s3a_conf
from tests.helpers import nodetier
from tests.helpers.nodetier import in_tier, kubectl, log, wait


def object_store_pod() -> S3Credentials:
    """SeaweedFS as a pod (localenv/node/objectstore.py: its image, Deployment, claim, Service and
    S3 identity from a Secret), and the bucket `eopipe` made by an S3 call through its Service, as
    a user would. The identity's credentials."""
    t = time.monotonic()
    ref, archive = node_objectstore.image()
    nodetier.import_image(archive)
    creds = S3Credentials("eopipe-node", secrets.token_hex(16))
    kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": node_objectstore.manifests(ref, creds)}))
    kubectl("-n", node_objectstore.NAMESPACE, "rollout", "status", f"deployment/{node_objectstore.NAME}",
            "--timeout=180s", timeout=200)
    make = with_s3(creds, "s3.create_bucket('eopipe')")
    wait(lambda: nodetier.run(in_tier(nodetier.PY, "-c", make)).returncode == 0, 60, "the bucket made", interval=2)
    log(f"SeaweedFS pod ({ref}) serving S3 at {node_objectstore.ENDPOINT}, bucket eopipe made, "
        f"in {time.monotonic() - t:.0f}s")
    return creds


def store_url() -> str:
    """The S3 gateway as the tier's host reaches it: the Service's cluster IP (no cluster DNS there)."""
    ip = kubectl("-n", node_objectstore.NAMESPACE, "get", "service", node_objectstore.NAME,
                 "-o", "jsonpath={.spec.clusterIP}")
    return f"http://{ip}:{node_objectstore.S3_PORT}"


def with_s3(creds: S3Credentials, code: str) -> str:
    """`code`, to run in the tier, with `s3` an S3Client of the SeaweedFS pod."""
    return ("import json\nfrom localenv.objectstore import S3Client, S3Credentials\n"
            f"s3 = S3Client({store_url()!r}, S3Credentials(*{[creds.access_key, creds.secret_key]!r}), timeout=5)\n"
            + code)


def s3_keys(creds: S3Credentials, prefix: str) -> list[str]:
    """The keys under `prefix` of the bucket eopipe in the SeaweedFS pod."""
    return json.loads(nodetier.python(with_s3(creds, f"print(json.dumps(s3.keys('eopipe', {prefix!r})))")))


def s3_secret(secret: str, pipeline: str, creds: S3Credentials) -> dict:
    """The object store's credentials as a user keeps them: a Secret opened to the pipeline."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret, "annotations": {OPT_IN: pipeline}},
            "stringData": creds.env()}


def backup_to(pipeline: str, secret: str) -> dict:
    """spec.dedup.backup to the SeaweedFS pod, its credentials from `secret`."""
    return {"spec": {"dedup": {"backup": {
        "uri": f"s3://eopipe/{pipeline}", "endpoint": node_objectstore.ENDPOINT, "interval": "5s", "retention": 2,
        "credentials": {"accessKeyId": {"name": secret, "key": "AWS_ACCESS_KEY_ID"},
                        "secretAccessKey": {"name": secret, "key": "AWS_SECRET_ACCESS_KEY"}}}}}}


def s3a_checkpoint(path: str, secret: str) -> dict:
    """spec.processing's fields for a Spark checkpoint at `path` in the SeaweedFS pod's bucket
    (s3a://, the Spark image's hadoop-aws), its credentials from `secret` as env of the driver
    and executors."""
    return {"checkpoint": {"uri": f"s3a://eopipe/{path}"},
            "hadoopConf": s3a_conf(node_objectstore.ENDPOINT),
            "env": [{"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": k}}}
                    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")]}


def delete_object_store(until_gone: bool = False) -> None:
    kubectl("delete", "namespace", node_objectstore.NAMESPACE, f"--wait={str(until_gone).lower()}", "--ignore-not-found",
            "--timeout=180s", check=False, timeout=200)
