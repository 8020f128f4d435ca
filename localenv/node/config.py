"""The node tier's configuration files and command lines, as pure functions of a few facts
(paths, addresses, image names). Why each unusual setting is there:

- containerd `restrict_oom_score_adj`: the harness has no CAP_SYS_RESOURCE, so containerd may
  only raise a container's oom_score_adj, never lower it below its own.
- kubelet `cgroupDriver: cgroupfs` (no systemd here) and `failCgroupV1: false` (this machine
  has cgroup v1); `imageGCHighThresholdPercent: 100`: images come from archives, never from a
  registry, so one garbage-collected could never be pulled again.
- kube-proxy `oomScoreAdj: 0`: the default -999 needs CAP_SYS_RESOURCE too.
"""

from __future__ import annotations

import json
from pathlib import Path

CNI_NETWORK = "eopipe-node"  # also names libcni's cache files (/var/lib/cni/results/<network>-<id>-eth0)


def cgroup_root(proc_self_cgroup: str, name: str) -> str:
    """The kubelet's cgroup root: `name` below the memory cgroup the harness runs in, so that
    pods count against the same memory limit as the process that started them ("/" -> "/name")."""
    for line in proc_self_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path.rstrip("/") + "/" + name
    return "/" + name


def containerd_toml(state_dir: Path, run_dir: Path, sock: Path, cni_bin: Path, cni_conf: Path,
                    pause_image: str) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{state_dir / 'containerd'}"
state = "{run_dir / 'containerd'}"
# Only the overlayfs snapshotter: the others probe the host's file systems at start.
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{sock}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{state_dir / 'opt'}"

[{cri}]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{run_dir / 'runc'}"
  [{cri}.cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
"""


def cni_conflist(bridge: str, pod_cidr: str, ipam_dir: Path) -> str:
    """One bridge, host-local addresses from the pod CIDR, a default route to the bridge (the
    node), port mappings. No masquerade: nothing is reached through the node but the node."""
    return json.dumps({
        "cniVersion": "0.4.0",
        "name": CNI_NETWORK,
        "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": str(ipam_dir),
                      "ranges": [[{"subnet": pod_cidr}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=2) + "\n"


def kubelet_config(*, node_ip: str, sock: Path, cgroup_root_path: str, ca: Path,
                   cluster_domain: str, cluster_dns: str, pod_logs_dir: Path) -> str:
    cfg = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node_ip,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "readOnlyPort": 0,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{sock}",
        "podLogsDir": str(pod_logs_dir),
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root_path,
        "failCgroupV1": False,
        "failSwapOn": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # A shared test machine: evict only when really out of room.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%",
                         "imagefs.available": "2%"},
        "clusterDomain": cluster_domain,
        "clusterDNS": [cluster_dns],
        # Not the host's resolvers: pods (ClusterFirst) ask CoreDNS, which knows only the cluster.
        "resolvConf": "",
        "maxPods": 50,
        "serializeImagePulls": False,
        "registerNode": True,
    }
    return json.dumps(cfg, indent=2) + "\n"


def kube_proxy_config(*, kubeconfig: Path, cluster_cidr: str, node_name: str) -> str:
    cfg = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": cluster_cidr,
        "hostnameOverride": node_name,
        "oomScoreAdj": 0,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # conntrack sysctls are the host's (not per namespace): leave them alone.
        "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }
    return json.dumps(cfg, indent=2) + "\n"


def kubelet_argv(kubelet: Path, *, config: Path, kubeconfig: Path, root_dir: Path, cert_dir: Path,
                 node_name: str, node_ip: str) -> list[str]:
    return [str(kubelet), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={root_dir}", f"--cert-dir={cert_dir}",
            f"--hostname-override={node_name}", f"--node-ip={node_ip}", "--v=1"]


def apiserver_argv(base: list[str], node_ip: str, pki: Path) -> list[str]:
    """The control plane's apiserver flags, changed for a node: it listens on the namespace's
    addresses (loopback and the node IP, nothing else exists there) and advertises the node IP,
    so the `kubernetes` Service gets a real endpoint that pods reach through kube-proxy. It
    reaches the kubelet (logs, exec) at the node's InternalIP, never by resolving its name,
    as cluster admin (the kubelet authorizes by webhook)."""
    out = []
    for a in base:
        if a.startswith("--bind-address="):
            a = "--bind-address=0.0.0.0"
        elif a.startswith("--advertise-address="):
            a = f"--advertise-address={node_ip}"
        elif a == "--endpoint-reconciler-type=none":
            continue
        out.append(a)
    return out + ["--kubelet-preferred-address-types=InternalIP",
                  f"--kubelet-client-certificate={pki / 'admin.crt'}",
                  f"--kubelet-client-key={pki / 'admin.key'}"]
