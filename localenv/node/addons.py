"""The node tier's cluster add-ons, as a kind cluster has them, as manifests (pure: image refs
and addresses in, objects out; localenv/node/cluster.py applies them once the node is Ready):

- CoreDNS in kube-system behind the `kube-dns` Service at DNS_IP (the kubelet's clusterDNS).
  It answers cluster.local only: there is no upstream to forward to, nothing leaves the tier.
- local-path-provisioner and its StorageClass `standard`, the default one (kind's name), so a
  PersistentVolumeClaim with no class gets a directory of the node (each node its own), created and removed by
  helper pods running the base image's shell, as on kind. ReadWriteOnce only, as on kind.
- A second class, `shared`, from the same provisioner in its shared-filesystem mode: a directory
  every node mounts (one node here), so ReadWriteMany claims bind. It stands in for the NFS,
  CephFS, EFS or Azure Files class a cluster offers for storage that pods on several nodes share.
- kube-network-policies (sigs.k8s.io/kube-network-policies, hack/build-tools.sh), the NetworkPolicy
  agent kind's kindnetd embeds, as its own install.yaml runs it: a DaemonSet in kube-system on the
  node's network (hostNetwork), with NET_ADMIN. It puts the first packet of each new connection to
  or from a pod that a NetworkPolicy selects on an nftables queue (table `inet
  kube-network-policies`) and accepts or drops it by the policies; the rest of the connection
  follows (`ct state established`). Fail closed, its default: while it is not running, those
  packets are dropped. The kernel must have nftables' `queue` statement (CONFIG_NFT_QUEUE,
  nfnetlink_queue): localenv/node/cluster.py checks, and `up` says when it is missing.
- Kafka's name for pods: the Service `kafka` in namespace `kafka` with no selector, its
  EndpointSlice the broker on the node address (how a cluster names a Kafka outside it), so
  `kafka.kafka.svc:9092` in a manifest is reached as written.
"""

from __future__ import annotations

import json

from localenv.node import ON_NODE_0, STATE_DIR, NodeSpec

DNS_IP = "10.0.0.10"
DNS_PORT = 5353          # CoreDNS listens unprivileged; the Service maps 53 to it
LOCAL_PATH_DIR = str(STATE_DIR / "local-path")  # node 0's (NodeSpec.local_path_dir)
SHARED_DIR = "/var/lib/eopipe-node/shared"
STORAGE_CLASS, SHARED_STORAGE_CLASS = "standard", "shared"
KAFKA_NAMESPACE, KAFKA_SERVICE, KAFKA_PORT = "kafka", "kafka", 9092

COREFILE = f""".:{DNS_PORT} {{
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    cache 30
    loop
    loadbalance
}}
"""

_SETUP = '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n'
_TEARDOWN = '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n'

_RESTRICTED = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
               "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
               "seccompProfile": {"type": "RuntimeDefault"}}


def _sa(name: str, ns: str) -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}


def _cluster_role(name: str, rules: list[dict], sa: str, ns: str) -> list[dict]:
    rbac = "rbac.authorization.k8s.io/v1"
    return [{"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules},
            {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}]


def _deployment(name: str, ns: str, sa: str, container: dict, volumes: list[dict], replicas: int = 1,
                placement: dict | None = None) -> dict:
    labels = {"k8s-app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"serviceAccountName": sa, "priorityClassName": "system-cluster-critical",
                                           "containers": [{"imagePullPolicy": "IfNotPresent",
                                                           "securityContext": _RESTRICTED, **container}],
                                           "volumes": volumes, **(placement or {})}}}}


def coredns(image: str) -> list[dict]:
    ns = "kube-system"
    rules = [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
              "verbs": ["list", "watch"]},
             {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]
    container = {"name": "coredns", "image": image, "args": ["-conf", "/etc/coredns/Corefile"],
                 "ports": [{"containerPort": DNS_PORT, "protocol": "UDP", "name": "dns"},
                           {"containerPort": DNS_PORT, "protocol": "TCP", "name": "dns-tcp"}],
                 "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                 "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}},
                 "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}]}
    return [
        _sa("coredns", ns), *_cluster_role("system:coredns", rules, "coredns", ns),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", "namespace": ns},
         "data": {"Corefile": COREFILE}},
        # Two replicas on different nodes where there are several, as kubeadm and kind run it: a
        # lost node then takes half the cluster's DNS for the 40-50 s until it is NotReady, not all of it.
        _deployment("coredns", ns, "coredns", container, [{"name": "config", "configMap": {"name": "coredns"}}],
                    replicas=2, placement={"affinity": {"podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {
                            "labelSelector": {"matchLabels": {"k8s-app": "coredns"}},
                            "topologyKey": "kubernetes.io/hostname"}}]}}}),
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": ns, "labels": {"k8s-app": "kube-dns"}},
         "spec": {"clusterIP": DNS_IP, "selector": {"k8s-app": "coredns"},
                  "ports": [{"name": "dns", "port": 53, "targetPort": DNS_PORT, "protocol": "UDP"},
                            {"name": "dns-tcp", "port": 53, "targetPort": DNS_PORT, "protocol": "TCP"}]}},
    ]


def local_path(image: str, helper_image: str, other_nodes: list[NodeSpec] = ()) -> list[dict]:
    ns, sa = "local-path-storage", "local-path-provisioner"
    rules = [{"apiGroups": [""], "resources": ["nodes", "persistentvolumeclaims", "configmaps", "pods", "pods/log"],
              "verbs": ["get", "list", "watch"]},
             {"apiGroups": [""], "resources": ["persistentvolumes"],
              "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
             {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
             {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["get", "list", "watch"]}]
    # Its helper pods, in its own namespace (it runs without leader election: one replica).
    ns_rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "patch",
                                                                     "update", "delete"]}]
    rbac = "rbac.authorization.k8s.io/v1"
    helper = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "helper-pod"},
              "spec": {"priorityClassName": "system-node-critical",
                       "containers": [{"name": "helper-pod", "image": helper_image,
                                       "imagePullPolicy": "IfNotPresent"}]}}
    config = {"storageClassConfigs": {
        STORAGE_CLASS: {"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [LOCAL_PATH_DIR]},
                                        *({"node": n.name, "paths": [str(n.local_path_dir)]} for n in other_nodes)]},
        SHARED_STORAGE_CLASS: {"sharedFileSystemPath": SHARED_DIR}}}
    container = {"name": "local-path-provisioner", "image": image,
                 "args": ["--debug", "start", "--config", "/etc/config/config.json",
                          "--service-account-name", sa, "--configmap-name", "local-path-config",
                          "--helper-image", helper_image],
                 "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                         {"name": "CONFIG_MOUNT_PATH", "value": "/etc/config/"}],
                 "volumeMounts": [{"name": "config", "mountPath": "/etc/config/", "readOnly": True}]}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        _sa(sa, ns), *_cluster_role("local-path-provisioner", rules, sa, ns),
        {"apiVersion": rbac, "kind": "Role", "metadata": {"name": sa, "namespace": ns}, "rules": ns_rules},
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": {"name": sa, "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "local-path-config", "namespace": ns},
         "data": {"config.json": json.dumps(config), "setup": _SETUP, "teardown": _TEARDOWN,
                  "helperPod.yaml": json.dumps(helper)}},
        # On node 0, the control plane's (kind runs it there too): one replica, no leader election.
        _deployment("local-path-provisioner", ns, sa, container,
                    [{"name": "config", "configMap": {"name": "local-path-config"}}],
                    placement={"nodeSelector": ON_NODE_0}),
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
         "metadata": {"name": STORAGE_CLASS,
                      "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
         "provisioner": "rancher.io/local-path", "volumeBindingMode": "WaitForFirstConsumer",
         "reclaimPolicy": "Delete"},
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": SHARED_STORAGE_CLASS},
         "provisioner": "rancher.io/local-path", "volumeBindingMode": "Immediate", "reclaimPolicy": "Delete"},
    ]


NETPOL = "kube-network-policies"
NETPOL_QUEUE = 98          # its install.yaml's --nfqueue-id
NETPOL_METRICS = "127.0.0.1:9080"  # its default port, on the node's loopback only


def network_policies(image: str) -> list[dict]:
    """The agent as its install.yaml (v0.8.0) deploys it: its RBAC (pods, namespaces and
    NetworkPolicies, list and watch), a DaemonSet on the host network. Not privileged: NET_ADMIN
    is all its nftables rules and its queue need (install.yaml's `privileged` serves the NRI
    socket and /var/run/netns it mounts; the node's containerd has no NRI, so the agent takes pod
    addresses from the API, as it does when NRI is missing). Root: the image's user is 65535."""
    ns = "kube-system"
    rules = [{"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["list", "watch"]},
             {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "watch"]}]
    labels = {"app": NETPOL, "k8s-app": NETPOL, "tier": "node"}
    container = {
        "name": NETPOL, "image": image, "imagePullPolicy": "IfNotPresent",
        "args": ["--hostname-override=$(MY_NODE_NAME)", "--v=2", f"--nfqueue-id={NETPOL_QUEUE}",
                 f"--metrics-bind-address={NETPOL_METRICS}"],
        "env": [{"name": "MY_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "resources": {"requests": {"cpu": "100m", "memory": "50Mi"}},
        "securityContext": {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
                            "seccompProfile": {"type": "RuntimeDefault"}}}
    return [
        _sa(NETPOL, ns), *_cluster_role(NETPOL, rules, NETPOL, ns),
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": NETPOL, "namespace": ns, "labels": labels},
         "spec": {"selector": {"matchLabels": {"app": NETPOL}},
                  "template": {"metadata": {"labels": labels},
                               "spec": {"hostNetwork": True, "dnsPolicy": "ClusterFirst",
                                        "nodeSelector": {"kubernetes.io/os": "linux"},
                                        "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
                                        "priorityClassName": "system-node-critical",
                                        "serviceAccountName": NETPOL, "containers": [container]}}}},
    ]


def kafka_service(broker_ip: str) -> list[dict]:
    ns, name = KAFKA_NAMESPACE, KAFKA_SERVICE
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
         "spec": {"ports": [{"name": "kafka", "port": KAFKA_PORT, "targetPort": KAFKA_PORT, "protocol": "TCP"}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": f"{name}-broker", "namespace": ns,
                      "labels": {"kubernetes.io/service-name": name,
                                 "endpointslice.kubernetes.io/managed-by": "eopipe-node-tier"}},
         "addressType": "IPv4",
         "ports": [{"name": "kafka", "port": KAFKA_PORT, "protocol": "TCP"}],
         "endpoints": [{"addresses": [broker_ip], "conditions": {"ready": True}}]},
    ]


def manifests(images: dict[str, str], broker_ip: str, other_nodes: list[NodeSpec] = ()) -> list[dict]:
    return [*coredns(images["coredns"]),
            *local_path(images["local-path-provisioner"], images["base"], other_nodes),
            # Always built (images.ADDONS); `serve` waits for its DaemonSet, so a tier never runs
            # without it. Optional here for callers that name only some images.
            *(network_policies(images[NETPOL]) if NETPOL in images else []),
            *kafka_service(broker_ip)]


# What `up` waits for before it calls the node ready: (namespace, deployment), (namespace, daemonset).
DEPLOYMENTS = (("kube-system", "coredns"), ("local-path-storage", "local-path-provisioner"))
DAEMONSETS = (("kube-system", NETPOL),)
