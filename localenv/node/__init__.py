"""The node tier: a single-node Kubernetes cluster whose pods are run by a real kubelet and
containerd from images built with no registry (docs/design.md#the-local-environment).

Containment, as kind's node container gives it: everything runs inside the network namespace
NETNS that the harness creates. The node IP, the pod CIDR and the service CIDR exist only there
(on two bridges: NODE_LINK, which has no ports and serves as the host-only interface, and
CNI_BRIDGE, the pods' gateway); kube-proxy's and the CNI plugins' iptables rules live in that
namespace's tables; no default route leads out. Files live under STATE_DIR and RUN_DIR, pod
cgroups under one cgroup root; `down` removes all of it (localenv/node/host.py checks).

NetworkPolicy is enforced by kube-network-policies (sigs.k8s.io/kube-network-policies v0.8.0,
the agent kind's kindnetd embeds), a DaemonSet in kube-system on the node's network
(localenv/node/addons.py): its nftables table, in the namespace's ruleset, queues each new
connection of a pod that a policy selects to the agent, which accepts or drops it. That needs
the kernel's nftables `queue` statement (CONFIG_NFT_QUEUE); on a kernel without it the agent
runs but installs nothing, and `up` says NetworkPolicy is NOT enforced, and why
(NETPOL_STATUS; the policy test then skips with that reason).

    python -m localenv.node up      # make cluster
    python -m localenv.node down    # make cluster-down
"""

from __future__ import annotations

from pathlib import Path

NETNS = "eopipe-node"
NODE_NAME = "eopipe-node"
NODE_LINK = "eopnode0"       # a bridge with no ports: holds the node IP
CNI_BRIDGE = "eopcni0"       # the pods' bridge, made by the CNI bridge plugin
NODE_IP = "10.211.0.2"
NODE_PREFIX = 24
POD_CIDR = "10.212.0.0/24"
# The control plane's range (localenv/controlplane.py): its certificate already names 10.0.0.1.
SERVICE_CIDR = "10.0.0.0/24"
CLUSTER_DOMAIN = "cluster.local"

STATE_DIR = Path("/var/lib/eopipe-node")   # etcd, pki, containerd root, kubelet root, CNI config
RUN_DIR = Path("/run/eopipe-node")         # containerd state and socket, pid file
CNI_BIN_DIR = Path("/usr/lib/cni")         # Debian's containernetworking-plugins
CONTAINERD_SOCK = RUN_DIR / "containerd" / "containerd.sock"
# Whether NetworkPolicy is enforced on the node ({"enforced", "agent", "reason"}), written by serve.
NETPOL_STATUS = RUN_DIR / "networkpolicy.json"
