"""The node tier's configuration (localenv/node/config.py): the settings this machine needs
(issue 14's measured facts) and the containment of its addresses."""

from __future__ import annotations

import ipaddress
import json
import tomllib
from pathlib import Path

import pytest

from localenv.node import NODE_IP, NODE_PREFIX, POD_CIDR, SERVICE_CIDR
from localenv.node import config as cfg


@pytest.mark.parametrize("text, root", [
    ("4:memory:/\n1:cpu:/\n", "/eopipe-node"),
    ("4:memory:/process_api/abc\n1:cpu:/\n", "/process_api/abc/eopipe-node"),
    ("5:cpu,memory:/a/b/\n", "/a/b/eopipe-node"),
    ("0::/user.slice\n", "/eopipe-node"),  # no memory controller named: the top
])
def test_cgroup_root_follows_the_harness_memory_cgroup(text, root):
    assert cfg.cgroup_root(text, "eopipe-node") == root


def test_containerd_config():
    t = tomllib.loads(cfg.containerd_toml(Path("/s"), Path("/r"), Path("/r/c.sock"), Path("/cni"),
                                          Path("/s/net.d"), "localhost/pause:1"))
    cri = t["plugins"]["io.containerd.grpc.v1.cri"]
    assert t["grpc"]["address"] == "/r/c.sock" and t["root"] == "/s/containerd" and t["state"] == "/r/containerd"
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == "localhost/pause:1"
    assert cri["containerd"]["snapshotter"] == "overlayfs"
    assert cri["containerd"]["runtimes"]["runc"]["options"] == {"SystemdCgroup": False, "Root": "/r/runc"}
    assert cri["cni"] == {"bin_dir": "/cni", "conf_dir": "/s/net.d", "max_conf_num": 1}


def test_kubelet_config():
    c = json.loads(cfg.kubelet_config(node_ip="10.1.0.2", sock=Path("/r/c.sock"), cgroup_root_path="/x/n",
                                      ca=Path("/ca.crt"), cluster_domain="cluster.local", cluster_dns="10.0.0.10",
                                      pod_logs_dir=Path("/l")))
    assert c["cgroupDriver"] == "cgroupfs" and c["failCgroupV1"] is False
    assert c["imageGCHighThresholdPercent"] == 100 and c["imageGCLowThresholdPercent"] < 100
    assert c["containerRuntimeEndpoint"] == "unix:///r/c.sock" and c["cgroupRoot"] == "/x/n"
    assert c["authentication"]["anonymous"]["enabled"] is False and c["readOnlyPort"] == 0
    assert c["resolvConf"] == "" and c["podLogsDir"] == "/l"  # no host resolver reaches a pod
    assert c["clusterDNS"] == ["10.0.0.10"]


def test_kube_proxy_config():
    c = json.loads(cfg.kube_proxy_config(kubeconfig=Path("/k"), cluster_cidr=POD_CIDR, node_name="n"))
    assert c["oomScoreAdj"] == 0 and c["mode"] == "iptables" and c["clusterCIDR"] == POD_CIDR
    assert c["conntrack"]["maxPerCore"] == 0  # the conntrack table size is the host's: untouched


def test_cni_gives_pods_addresses_from_the_pod_cidr_and_no_masquerade():
    c = json.loads(cfg.cni_conflist("br0", POD_CIDR, Path("/ipam")))
    assert c["name"] == cfg.CNI_NETWORK == "eopipe-node"  # host.py finds libcni's cache files by it
    bridge = c["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": POD_CIDR}]] and bridge["ipam"]["dataDir"] == "/ipam"


@pytest.mark.parametrize("flag, want", [
    ("--bind-address=127.0.0.1", "--bind-address=0.0.0.0"),
    ("--advertise-address=127.0.0.1", f"--advertise-address={NODE_IP}"),
    ("--endpoint-reconciler-type=none", None),
    ("--secure-port=123", "--secure-port=123"),
])
def test_apiserver_flags_for_a_node(flag, want):
    out = cfg.apiserver_argv(["kube-apiserver", flag], NODE_IP, Path("/pki"))
    assert out[:-3] == ["kube-apiserver"] + ([want] if want else [])
    # The kubelet by its address, not its name: no DNS lookup leaves the namespace.
    assert out[-3:] == ["--kubelet-preferred-address-types=InternalIP",
                        "--kubelet-client-certificate=/pki/admin.crt", "--kubelet-client-key=/pki/admin.key"]


def test_the_tier_addresses_do_not_overlap():
    nets = [ipaddress.ip_network(f"{NODE_IP}/{NODE_PREFIX}", strict=False), ipaddress.ip_network(POD_CIDR),
            ipaddress.ip_network(SERVICE_CIDR)]
    assert all(n.is_private for n in nets)
    assert not any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
