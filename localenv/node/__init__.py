"""The node tier: a Kubernetes cluster of one node or several whose pods are run by a real kubelet and
containerd from images built with no registry (docs/design.md#the-local-environment).

Containment, as kind's node container gives it: everything of node 0 runs inside the network
namespace NETNS that the harness creates. The node IP, the pod CIDR and the service CIDR exist
only there (on NODE_LINK, one end of a veth to the nodes' switch, and CNI_BRIDGE, the pods'
gateway); kube-proxy's and the CNI plugins' iptables rules live in that
namespace's tables; no default route leads out. Files live under STATE_DIR and RUN_DIR, pod
cgroups under one cgroup root; `down` removes all of it (localenv/node/host.py checks).

NetworkPolicy is enforced by kube-network-policies (sigs.k8s.io/kube-network-policies v0.8.0,
the agent kind's kindnetd embeds), a DaemonSet in kube-system on the node's network
(localenv/node/addons.py): its nftables table, in the namespace's ruleset, queues each new
connection of a pod that a policy selects to the agent, which accepts or drops it. That needs
the kernel's nftables `queue` statement (CONFIG_NFT_QUEUE); on a kernel without it the agent
runs but installs nothing, and `up` says NetworkPolicy is NOT enforced, and why
(NETPOL_STATUS; the policy test then skips with that reason).

Several nodes (`up --nodes N`, `make cluster NODES=N`): node 0 above also runs the control
plane and the broker; each further node i is a namespace of its own, `eopipe-node-i`, with its
own containerd, kubelet and kube-proxy, files under STATE_DIR/nodes/<name> and RUN_DIR/nodes/<name>,
its own cgroup root, and its own NODE_LINK, a veth to a bridge in a namespace of its own
(localenv/node/host.py, the nodes' one L2 network). Each node's pods have a /24 of POD_RANGE,
routed through that node's IP.

    python -m localenv.node up      # make cluster
    python -m localenv.node down    # make cluster-down
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

NETNS = "eopipe-node"
NODE_NAME = "eopipe-node"
NODE_LINK = "eopnode0"       # each node's end of its veth to the nodes' switch: holds the node IP
CNI_BRIDGE = "eopcni0"       # the pods' bridge, made by the CNI bridge plugin
NODE_IP = "10.211.0.2"
NODE_PREFIX = 24
POD_RANGE = "10.212.0.0/16"  # every node's pods: node i has 10.212.i.0/24
POD_CIDR = "10.212.0.0/24"   # node 0's
MAX_NODES = 5
# The control plane's range (localenv/controlplane.py): its certificate already names 10.0.0.1.
SERVICE_CIDR = "10.0.0.0/24"
CLUSTER_DOMAIN = "cluster.local"

STATE_DIR = Path("/var/lib/eopipe-node")   # etcd, pki, containerd root, kubelet root, CNI config
RUN_DIR = Path("/run/eopipe-node")         # containerd state and socket, pid file
CNI_BIN_DIR = Path("/usr/lib/cni")         # Debian's containernetworking-plugins
CONTAINERD_SOCK = RUN_DIR / "containerd" / "containerd.sock"
# Whether NetworkPolicy is enforced on the node ({"enforced", "agent", "reason"}), written by serve.
NETPOL_STATUS = RUN_DIR / "networkpolicy.json"
# Where the tier keeps what a test must not lose with a node: the control plane's add-ons.
ON_NODE_0 = {"kubernetes.io/hostname": NODE_NAME}
# How many nodes `up` started (written by `up`; one when absent).
NODES_FILE = RUN_DIR / "nodes.json"


@dataclass(frozen=True)
class NodeSpec:
    """One node of the tier: where its processes run and keep their files."""

    index: int
    name: str
    ip: str
    pod_cidr: str
    state_dir: Path   # containerd root, kubelet root, CNI config, logs
    run_dir: Path     # containerd state and socket
    cgroup: str       # its kubelet's cgroup root's name (below the harness's memory cgroup)

    @property
    def netns(self) -> str:
        return self.name

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns

    @property
    def containerd_sock(self) -> Path:
        return self.run_dir / "containerd" / "containerd.sock"

    @property
    def local_path_dir(self) -> Path:
        """Where its local volumes are: a directory of its own, as a disk of its own."""
        return self.state_dir / "local-path"


def node_specs(count: int) -> list[NodeSpec]:
    """Node 0 (NODE_NAME: the control plane's and the broker's too) and count - 1 more."""
    if not 1 <= count <= MAX_NODES:
        raise ValueError(f"the node tier runs 1 to {MAX_NODES} nodes, not {count}")
    base = ipaddress.ip_address(NODE_IP)
    pods = list(ipaddress.ip_network(POD_RANGE).subnets(new_prefix=24))
    out = [NodeSpec(0, NODE_NAME, NODE_IP, POD_CIDR, STATE_DIR, RUN_DIR, NETNS)]
    for i in range(1, count):
        name = f"{NODE_NAME}-{i}"
        out.append(NodeSpec(i, name, str(base + i), str(pods[i]), STATE_DIR / "nodes" / name,
                            RUN_DIR / "nodes" / name, name))
    return out


def running_nodes() -> list[NodeSpec]:
    """The nodes of the tier `up` started (node 0 alone when it has not said)."""
    try:
        return node_specs(int(json.loads(NODES_FILE.read_text())["count"]))
    except (OSError, ValueError, KeyError):
        return node_specs(1)
