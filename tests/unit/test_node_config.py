"""The node tier's configuration (localenv/node/config.py): the settings this machine needs
(issue 14's measured facts) and the containment of its addresses."""

from __future__ import annotations

import ipaddress
import json
import tomllib
from pathlib import Path

import pytest

from localenv.node import MAX_NODES, NODE_IP, NODE_PREFIX, POD_CIDR, POD_RANGE, SERVICE_CIDR, STATE_DIR, node_specs
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


@pytest.mark.parametrize("count, names, ips, pods", [
    (1, ["eopipe-node"], ["10.211.0.2"], ["10.212.0.0/24"]),
    (3, ["eopipe-node", "eopipe-node-1", "eopipe-node-2"], ["10.211.0.2", "10.211.0.3", "10.211.0.4"],
     ["10.212.0.0/24", "10.212.1.0/24", "10.212.2.0/24"]),
])
def test_the_nodes_of_a_tier(count, names, ips, pods):
    specs = node_specs(count)
    assert [n.name for n in specs] == names and [n.ip for n in specs] == ips and [n.pod_cidr for n in specs] == pods
    assert specs[0].state_dir == STATE_DIR and specs[0].pod_cidr == POD_CIDR and specs[0].ip == NODE_IP
    node_net = ipaddress.ip_network(f"{NODE_IP}/{NODE_PREFIX}", strict=False)
    for n in specs[1:]:
        # Files of its own below the tier's (down removes them), a cgroup root and netns of its own.
        assert n.state_dir.is_relative_to(STATE_DIR / "nodes") and n.cgroup == n.netns == n.name
        assert len(str(n.containerd_sock)) < 108  # a unix socket path's limit
    for n in specs:
        assert ipaddress.ip_address(n.ip) in node_net
        assert ipaddress.ip_network(n.pod_cidr).subnet_of(ipaddress.ip_network(POD_RANGE))
    assert not ipaddress.ip_network(POD_RANGE).overlaps(ipaddress.ip_network(SERVICE_CIDR))
    assert not ipaddress.ip_network(POD_RANGE).overlaps(node_net)


@pytest.mark.parametrize("count", [0, MAX_NODES + 1])
def test_a_tier_of_no_node_or_too_many_is_refused(count):
    with pytest.raises(ValueError, match=f"1 to {MAX_NODES}"):
        node_specs(count)
