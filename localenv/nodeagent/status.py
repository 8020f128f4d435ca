"""Status the agent writes: the pod's (phase, conditions, containerStatuses) and its Node's
(conditions, capacity, heartbeat Lease), as kubelet reports them."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from localenv.nodeagent.kube import Kube, kv, log, now_micro, now_rfc3339, ts_rfc3339

NOT_READY_TAINTS = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


@dataclass
class ContainerRuntime:
    """What the agent knows about the running container, input of build_pod_status."""

    name: str
    image: str = ""
    state: str = "waiting"            # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    last_state: dict = field(default_factory=dict)
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    pid: int | None = None


def _merge_condition(old: dict[str, dict], ctype: str, status: bool, now: str,
                     reason: str = "", message: str = "") -> dict:
    st = "True" if status else "False"
    prev = old.get(ctype)
    cond = {"type": ctype, "status": st, "lastProbeTime": None,
            "lastTransitionTime": prev["lastTransitionTime"]
            if prev and prev.get("status") == st and prev.get("lastTransitionTime") else now}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def build_pod_status(*, phase: str, c: ContainerRuntime, pod_ip: str | None, host_ip: str,
                     start_time: str, old_conditions: list[dict] | None, now: str,
                     reason: str = "", message: str = "", initialized: bool = True) -> dict:
    """The pod's status (for a JSON merge patch of pods/status). Pure."""
    old = {c_["type"]: c_ for c_ in old_conditions or []}
    managed = ("PodScheduled", "PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
    running = c.state == "running"
    ready = running and c.ready
    not_ready_reason = "" if ready else ("PodCompleted" if phase in ("Succeeded", "Failed")
                                         else "ContainersNotReady")
    not_ready_msg = "" if ready or not_ready_reason == "PodCompleted" else \
        f"containers with unready status: [{c.name}]"
    conds = [_merge_condition(old, "PodReadyToStartContainers", pod_ip is not None and
                              phase in ("Pending", "Running"), now),
             _merge_condition(old, "Initialized", initialized, now,
                              "" if initialized else "ContainersNotInitialized"),
             _merge_condition(old, "Ready", ready, now, not_ready_reason, not_ready_msg),
             _merge_condition(old, "ContainersReady", ready, now, not_ready_reason, not_ready_msg),
             _merge_condition(old, "PodScheduled", True, now)]
    # keep conditions others own (DisruptionTarget, readiness gates, ...)
    conds = [x for t, x in old.items() if t not in managed] + conds
    if c.state == "running":
        state = {"running": {"startedAt": ts_rfc3339(c.started_at or time.time())},
                 "waiting": None, "terminated": None}
    elif c.state == "terminated":
        term = {"exitCode": c.exit_code if c.exit_code is not None else 0,
                "reason": c.reason or ("Completed" if c.exit_code == 0 else "Error"),
                "startedAt": ts_rfc3339(c.started_at) if c.started_at else None,
                "finishedAt": ts_rfc3339(c.finished_at or time.time())}
        if c.message:
            term["message"] = c.message
        state = {"terminated": term, "waiting": None, "running": None}
    else:
        wait = {"reason": c.reason or "ContainerCreating"}
        if c.message:
            wait["message"] = c.message
        state = {"waiting": wait, "running": None, "terminated": None}
    cs = {"name": c.name, "image": c.image or "none", "imageID": "",
          "containerID": f"eopipe://{c.pid}" if c.pid else "",
          "ready": ready, "started": c.started and running, "restartCount": c.restart_count,
          "state": state, "lastState": c.last_state or {}}
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conds,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": [cs],
        "reason": reason or None,
        "message": message or None,
    }
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status


class Node:
    """The Node this agent plays kubelet for: registration, Ready status, Lease heartbeat."""

    def __init__(self, kube: Kube, name: str, host_ip: str):
        self.kube, self.name, self.host_ip = kube, name, host_ip
        self.path = f"/api/v1/nodes/{name}"
        self.uid = ""
        self._transition: dict[str, str] = {}

    def status(self) -> dict:
        now = now_rfc3339()
        res = {"cpu": "16", "memory": "64Gi", "pods": "200", "ephemeral-storage": "100Gi"}

        def cond(t: str, st: str, reason: str, msg: str) -> dict:
            return {"type": t, "status": st, "reason": reason, "message": msg,
                    "lastHeartbeatTime": now, "lastTransitionTime": self._transition.get(t, now)}
        conds = [cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
                 cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
                 cond("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
                 cond("Ready", "True", "KubeletReady", "eopipe test node agent is posting ready status")]
        for c in conds:
            self._transition.setdefault(c["type"], now)
        return {"capacity": res, "allocatable": res, "conditions": conds,
                "addresses": [{"type": "InternalIP", "address": self.host_ip},
                              {"type": "Hostname", "address": self.name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"machineID": "eopipe", "systemUUID": "eopipe", "bootID": "eopipe",
                             "kernelVersion": os.uname().release, "osImage": "eopipe-node-agent",
                             "containerRuntimeVersion": "eopipe://local-process",
                             "kubeletVersion": "v1.35.4", "kubeProxyVersion": "",
                             "operatingSystem": "linux", "architecture": "amd64"}}

    def register(self) -> None:
        node = self.kube.get(self.path)
        if node is None:
            body = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": self.name,
                                 "labels": {"kubernetes.io/hostname": self.name,
                                            "kubernetes.io/os": "linux",
                                            "kubernetes.io/arch": "amd64",
                                            "eopipe.dev/node-agent": "true"}},
                    "spec": {}, "status": self.status()}
            self.kube.create("/api/v1/nodes", body)
            node = self.kube.get(self.path)
            log.info(kv(event="node.registered", node=self.name))
        self.uid = node["metadata"]["uid"]
        self.heartbeat()

    def heartbeat(self) -> None:
        node = self.kube.merge_patch(self.path + "/status", {"status": self.status()})
        taints = (node.get("spec") or {}).get("taints") or []
        keep = [t for t in taints if t.get("key") not in NOT_READY_TAINTS]
        if len(keep) != len(taints):
            self.kube.merge_patch(self.path, {"spec": {"taints": keep or None}})
            log.info(kv(event="node.untainted", removed=len(taints) - len(keep)))
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": now_micro()}
        if self.kube.get(lease_path) is None:
            self.kube.create("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": "kube-node-lease",
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                                                  "name": self.name, "uid": self.uid}]},
                "spec": spec})
        else:
            self.kube.merge_patch(lease_path, {"spec": spec})
