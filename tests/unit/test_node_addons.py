"""The node tier's add-on manifests (localenv/node/addons.py): pure, checked without a cluster."""

import ipaddress
import json

import pytest

from localenv.node import SERVICE_CIDR, addons, node_specs

IMAGES = {"coredns": "localhost/eopipe-coredns:1", "local-path-provisioner": "localhost/eopipe-lpp:1",
          "base": "localhost/eopipe-base:1"}
OBJS = addons.manifests(IMAGES, "10.211.0.2")


def find(kind, name, ns=None):
    found = [o for o in OBJS if o["kind"] == kind and o["metadata"]["name"] == name
             and o["metadata"].get("namespace") == ns]
    assert len(found) == 1, (kind, name, ns)
    return found[0]


def test_dns_service_in_the_service_cidr_maps_53_to_the_unprivileged_port():
    svc = find("Service", "kube-dns", "kube-system")
    assert ipaddress.ip_address(svc["spec"]["clusterIP"]) in ipaddress.ip_network(SERVICE_CIDR)
    assert {p["port"] for p in svc["spec"]["ports"]} == {53}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == {addons.DNS_PORT}
    assert f".:{addons.DNS_PORT} " in addons.COREFILE
    assert "forward" not in addons.COREFILE  # nothing is resolved outside the cluster


def test_default_storage_class_is_the_provisioners():
    sc = find("StorageClass", addons.STORAGE_CLASS)
    assert sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert sc["provisioner"] == "rancher.io/local-path"
    cm = find("ConfigMap", "local-path-config", "local-path-storage")
    classes = json.loads(cm["data"]["config.json"])["storageClassConfigs"]
    assert classes[addons.STORAGE_CLASS]["nodePathMap"][0]["paths"] == [addons.LOCAL_PATH_DIR]
    assert IMAGES["base"] in cm["data"]["helperPod.yaml"]


def test_each_node_keeps_its_local_volumes_on_its_own_disk():
    """Several nodes on one host: each node's volumes in a directory of its own, so a claim's
    data is where its node is, as with a disk per node."""
    objs = addons.local_path(IMAGES["local-path-provisioner"], IMAGES["base"], node_specs(3)[1:])
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    paths = {m["node"]: m["paths"] for m in
             json.loads(cm["data"]["config.json"])["storageClassConfigs"][addons.STORAGE_CLASS]["nodePathMap"]}
    assert paths == {"DEFAULT_PATH_FOR_NON_LISTED_NODES": [addons.LOCAL_PATH_DIR],
                     "eopipe-node-1": ["/var/lib/eopipe-node/nodes/eopipe-node-1/local-path"],
                     "eopipe-node-2": ["/var/lib/eopipe-node/nodes/eopipe-node-2/local-path"]}
    assert str(node_specs(1)[0].local_path_dir) == addons.LOCAL_PATH_DIR


def test_shared_class_is_the_provisioners_shared_filesystem_mode_and_not_the_default():
    """ReadWriteMany binds only in that mode (the provisioner refuses it for node paths), and
    every class the provisioner serves needs its entry (it refuses claims of any other)."""
    sc = find("StorageClass", addons.SHARED_STORAGE_CLASS)
    assert sc["provisioner"] == "rancher.io/local-path" and "annotations" not in sc["metadata"]
    cm = find("ConfigMap", "local-path-config", "local-path-storage")
    classes = json.loads(cm["data"]["config.json"])["storageClassConfigs"]
    assert classes[addons.SHARED_STORAGE_CLASS] == {"sharedFileSystemPath": addons.SHARED_DIR}
    assert set(classes) == {o["metadata"]["name"] for o in OBJS if o["kind"] == "StorageClass"}


def test_kafka_service_points_at_the_broker_by_endpointslice():
    svc = find("Service", addons.KAFKA_SERVICE, addons.KAFKA_NAMESPACE)
    assert "selector" not in svc["spec"]  # endpoints are ours, not a pod selector's
    eps = find("EndpointSlice", f"{addons.KAFKA_SERVICE}-broker", addons.KAFKA_NAMESPACE)
    assert eps["metadata"]["labels"]["kubernetes.io/service-name"] == svc["metadata"]["name"]
    assert eps["endpoints"][0]["addresses"] == ["10.211.0.2"]
    assert eps["ports"][0]["port"] == svc["spec"]["ports"][0]["port"] == 9092


@pytest.mark.parametrize("ns, name", addons.DEPLOYMENTS)
def test_addon_pods_run_restricted_from_the_built_images(ns, name):
    pod = find("Deployment", name, ns)["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] in IMAGES.values() and c["imagePullPolicy"] == "IfNotPresent"
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    assert find("ServiceAccount", pod["serviceAccountName"], ns)


def test_object_store_pod_reads_its_identity_from_the_secret_and_serves_s3_on_its_service():
    from localenv.node import objectstore
    from localenv.objectstore import S3Credentials

    objs = {o["kind"]: o for o in objectstore.manifests("localhost/eopipe-weed:1", S3Credentials("ak", "sk"))}
    assert all(o["metadata"].get("namespace") == objectstore.NAMESPACE for k, o in objs.items() if k != "Namespace")
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    # The identity: the Secret's s3.json, mounted where -s3.config points.
    assert vols["config"]["secret"]["secretName"] == objs["Secret"]["metadata"]["name"]
    assert f"-s3.config={mounts['config']}/s3.json" in c["args"]
    creds = json.loads(objs["Secret"]["stringData"]["s3.json"])["identities"][0]["credentials"]
    assert creds == [{"accessKey": "ak", "secretKey": "sk"}]
    # Data on the claim, the gateway on all addresses, its port the Service's and the endpoint's.
    assert vols["data"]["persistentVolumeClaim"]["claimName"] == objs["PersistentVolumeClaim"]["metadata"]["name"]
    assert f"-dir={mounts['data']}" in c["args"] and "-ip.bind=0.0.0.0" in c["args"]
    assert f"-s3.port={objectstore.S3_PORT}" in c["args"]
    assert objs["Service"]["spec"]["ports"][0]["targetPort"] == objectstore.S3_PORT
    assert objs["Service"]["spec"]["selector"] == objs["Deployment"]["spec"]["selector"]["matchLabels"]
    svc = objs["Service"]["metadata"]
    assert objectstore.ENDPOINT == f"http://{svc['name']}.{svc['namespace']}.svc:{objectstore.S3_PORT}"
    assert c["image"] == "localhost/eopipe-weed:1" and c["securityContext"]["readOnlyRootFilesystem"]
