"""A test-only node agent: plays kubelet for one Node by running pods as local processes.

There is no Docker and no kubelet on the test machine. The real control plane (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler) schedules pods onto the Node this
agent registers; the agent then runs the FIRST container of each pod bound to it as a local
process. Images are ignored. It is not a security boundary and not a container runtime: it
exists so that `kubectl delete pod`, StatefulSet recreation, PVC reuse, restarts and SIGKILL
of a worker really happen in tests.

Rules (what a pod sees):

* Process: argv = first container's `command` + `args` (after Kubernetes `$(VAR)` expansion);
  init containers and further containers are NOT run (a warning is logged).
  A container without `command` fails the pod (phase Failed, reason `NoCommand`); the agent
  carries on. The process runs in its own session/process group with cwd
  `<workdir>/pods/<ns>_<pod>/<uid8>/root` (or the rewritten `workingDir`); stdout+stderr go to
  `<workdir>/pods/<ns>_<pod>/<container>.<uid8>.<restart>.log`; the group leader's pid is in
  `<workdir>/pods/<ns>_<pod>/pid` while it runs.
* Environment: the agent's own environment, PATH with `extra_path` prepended (default: the
  directory of sys.executable, i.e. the project venv's bin), then KUBECONFIG (the admin
  kubeconfig, a test-only stand-in for in-cluster credentials), KUBERNETES_SERVICE_HOST/PORT,
  POD_IP and HOSTNAME, then the container's `envFrom` (configMapRef/secretRef, with prefix),
  then `env` (literal values with `$(VAR)` expansion; valueFrom fieldRef for metadata.name,
  metadata.namespace, metadata.uid, metadata.labels['k'], metadata.annotations['k'],
  spec.nodeName, spec.serviceAccountName, status.podIP, status.podIPs, status.hostIP;
  configMapKeyRef; secretKeyRef; resourceFieldRef gives "0"). A container that sets KUBECONFIG
  keeps its own.
* Pod IP: each pod gets its own loopback address 127.1.X.Y (127.(1+N).X.Y on a node named
  `...-N`; all of 127.0.0.0/8 is loopback on Linux), so several pods can listen on the same
  port; hostIP is 127.0.0.1 (also the pod IP of hostNetwork pods). Note: the legacy Endpoints
  API rejects loopback addresses, and there is no cluster DNS: find pods by status.podIP.
* Volumes cannot be real mounts (no root). Each volume is a local directory:
  persistentVolumeClaim -> the bound PV's hostPath (the agent's own PVs live in
  `<workdir>/volumes/<ns>/<claimName>` and outlive pods); emptyDir -> a per-pod directory
  deleted with the pod; configMap / secret / downwardAPI / projected -> files materialised in
  a per-pod directory and refreshed every 5 s (env EOPIPE_NODEAGENT_VOLUME_REFRESH_SECONDS); hostPath -> the path itself.
  MOUNT PATH REWRITE RULE: every occurrence of a volumeMount's `mountPath` at the start of a
  path (not preceded by a path character, followed by `/` or a non-path character) in the
  container's command, args, workingDir and env values (those the pod spec sets) is replaced
  by the local directory (`subPath` appended), longest mount path first, in one pass. So
  `--state-dir /var/lib/eopipe/db` becomes `--state-dir <workdir>/volumes/ns/data-x-0/db`.
  Paths that only appear in files or are computed by the program are NOT rewritten.
* Status: Pending -> Running with containerStatuses and the conditions PodScheduled,
  PodReadyToStartContainers, Initialized, ContainersReady, Ready, via pods/status. Readiness
  honours readinessProbe httpGet/tcpSocket/exec (initialDelaySeconds, periodSeconds,
  timeoutSeconds, successThreshold, failureThreshold); without one a running container is
  ready. startupProbe gates the others; a failing livenessProbe restarts the process.
* restartPolicy Always/OnFailure/Never, back-off 1 s doubling to 10 s (reset after 60 s of
  running); restartCount counts restarts; pods are restarted in place.
* Deletion: on deletionTimestamp the group gets SIGTERM, then SIGKILL after the grace period
  (capped at 30 s), then the pod object is deleted with gracePeriodSeconds=0. Pods that vanish
  from the API get their processes killed. Stopping the agent kills all processes and leaves
  the pod objects alone (like a node that lost power).
* Node: registered with capacity cpu 16, memory 64Gi, pods 200; its Lease in kube-node-lease
  and its Ready heartbeat are renewed every 10 s; not-ready/unreachable taints are removed.
* PVCs: for each Pending claim without a volume the agent creates a hostPath PV pre-bound to
  it (capacity = request, claim's access modes and class, Retain), and the real PV controller
  binds them. A default StorageClass `local` (provisioner eopipe.dev/local-test, Immediate) is
  created if missing.

Run as a subprocess (`NodeAgent.start()`), so that its life does not depend on the test
process's threads or GIL and tests can stop/restart it like a node:

    python -m tests.localenv.nodeagent --kubeconfig K --workdir W [--node-name N]

Log: `<workdir>/nodeagent.log`, one `event=... key=value` line per event.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http.client
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from tests.localenv import daemon

REPO_ROOT = Path(__file__).resolve().parents[2]

log = logging.getLogger("eopipe.nodeagent")

TERMINATION_GRACE_CAP = 30.0
BACKOFF_START = 1.0
BACKOFF_MAX = 10.0
BACKOFF_RESET_AFTER = 60.0
HEARTBEAT_PERIOD = 10.0
# A kubelet refreshes configMap/secret volumes every sync period plus cache TTL (~60-90 s);
# set this to 60 to see what a product would do on a real node.
VOLUME_REFRESH_PERIOD = float(os.environ.get("EOPIPE_NODEAGENT_VOLUME_REFRESH_SECONDS", "5"))
FINAL_DELETE_DELAY = 1.0
STORAGE_CLASS = "local"
PROVISIONER = "eopipe.dev/local-test"
NOT_READY_TAINTS = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
POD_NET = ipaddress.ip_network("127.1.0.0/16")


def pod_network_for(node_name: str) -> ipaddress.IPv4Network:
    """127.(1+N).0.0/16 for a node named `...-N` (eopipe-node-0 -> 127.1.0.0/16), so that
    several agents (nodes) on one machine never hand out the same pod IP."""
    m = re.search(r"(\d+)$", node_name)
    n = int(m.group(1)) % 250 if m else 0
    return ipaddress.ip_network(f"127.{1 + n}.0.0/16")


def kv(**fields: Any) -> str:
    """logfmt-style `key=value` pairs; values with spaces are quoted."""
    out = []
    for k, v in fields.items():
        s = str(v)
        if s == "" or any(c in s for c in ' "='):
            s = json.dumps(s)
        out.append(f"{k}={s}")
    return " ".join(out)


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ts_rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_key(pod: dict) -> str:
    md = pod["metadata"]
    return f"{md.get('namespace', '')}/{md['name']}"


def pod_dir_name(namespace: str, name: str) -> str:
    return f"{namespace}_{name}"


# --------------------------------------------------------------------------------------
# Pure helpers: $(VAR) expansion, downward API, env, mount path rewriting, status.
# --------------------------------------------------------------------------------------

class PodConfigError(Exception):
    """A pod cannot start yet (missing ConfigMap/Secret/PVC...). Retried, pod stays Pending."""

    reason = "CreateContainerConfigError"


class PodFatalError(Exception):
    """A pod can never start (no command...). The pod is failed."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


_VAR_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand_vars(s: str, env: dict[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined vars replaced, `$$` escapes to `$`, undefined kept."""

    def repl(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR_RE.sub(repl, s)


_FIELD_SUBSCRIPT_RE = re.compile(r"^(metadata\.(?:labels|annotations))\[['\"]?(.*?)['\"]?\]$")


def field_ref_value(pod: dict, field_path: str) -> str:
    """Value of a downward-API fieldRef for `pod` (a dict in API JSON form)."""
    md = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    m = _FIELD_SUBSCRIPT_RE.match(field_path)
    if m:
        what, key = m.group(1), m.group(2)
        src = md.get("labels" if what.endswith("labels") else "annotations") or {}
        return str(src.get(key, ""))
    simple = {
        "metadata.name": md.get("name", ""),
        "metadata.namespace": md.get("namespace", ""),
        "metadata.uid": md.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "") or "default",
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIPs": ",".join(p.get("ip", "") for p in status.get("podIPs") or []),
        "status.hostIPs": ",".join(p.get("ip", "") for p in status.get("hostIPs") or []),
    }
    if field_path in ("metadata.labels", "metadata.annotations"):
        src = md.get(field_path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(src.items()))
    if field_path not in simple:
        raise PodFatalError("UnsupportedFieldRef", f"fieldRef {field_path!r} is not supported")
    return str(simple[field_path])


Lookup = Callable[[str, str], "dict[str, str] | None"]  # (namespace, name) -> data or None


def resolve_env(container: dict, pod: dict, base: dict[str, str],
                get_configmap: Lookup, get_secret: Lookup) -> tuple[dict[str, str], set[str]]:
    """The container's environment on top of `base`.

    Returns (env, names the pod spec set). ConfigMap/Secret data come from the lookups as
    decoded str->str dicts (None = object missing). A missing non-optional source raises
    PodConfigError, as kubelet's CreateContainerConfigError.
    """
    ns = pod["metadata"].get("namespace", "default")
    env = dict(base)
    own: set[str] = set()
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        for kind, lookup in (("configMapRef", get_configmap), ("secretRef", get_secret)):
            ref = src.get(kind)
            if not ref:
                continue
            data = lookup(ns, ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise PodConfigError(f"{kind} {ns}/{ref['name']} not found")
            for k, v in data.items():
                env[prefix + k] = v
                own.add(prefix + k)
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" not in item:
            env[name] = expand_vars(item.get("value", "") or "", env)
            own.add(name)
            continue
        vf = item["valueFrom"]
        if "fieldRef" in vf:
            value = field_ref_value(pod, vf["fieldRef"]["fieldPath"])
        elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
            kind = "configMapKeyRef" if "configMapKeyRef" in vf else "secretKeyRef"
            ref = vf[kind]
            data = (get_configmap if kind == "configMapKeyRef" else get_secret)(ns, ref["name"])
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    continue
                what = "configmap" if kind == "configMapKeyRef" else "secret"
                if data is None:
                    raise PodConfigError(f"{what} {ns}/{ref['name']} not found")
                raise PodConfigError(f"key {ref['key']!r} not found in {what} {ns}/{ref['name']}")
            value = data[ref["key"]]
        elif "resourceFieldRef" in vf:
            value = "0"
        else:
            raise PodFatalError("UnsupportedEnvSource", f"env {name}: unsupported valueFrom {vf}")
        env[name] = value
        own.add(name)
    return env, own


_PATH_CHARS = r"A-Za-z0-9_.\-~"


class MountRewriter:
    """Replaces mount paths at the start of a path with local directories (one pass)."""

    def __init__(self, mapping: dict[str, str]):
        self.mapping = {}
        for mount, local in mapping.items():
            m = "/" + mount.strip("/")
            if m == "/":
                continue  # a mount at "/" cannot be rewritten sensibly
            self.mapping[m] = str(local)
        if self.mapping:
            alts = "|".join(re.escape(m) for m in sorted(self.mapping, key=len, reverse=True))
            self._re = re.compile(rf"(?<![{_PATH_CHARS}/])(?:{alts})(?![{_PATH_CHARS}])")
        else:
            self._re = None

    def __call__(self, s: str) -> str:
        if self._re is None or not s:
            return s
        return self._re.sub(lambda m: self.mapping[m.group(0)], s)


def build_argv(container: dict, env: dict[str, str], rewrite: Callable[[str], str]) -> list[str]:
    command = container.get("command") or []
    if not command:
        raise PodFatalError(
            "NoCommand",
            f"container {container.get('name')!r} has no command: the eopipe node agent ignores "
            "images and runs command+args as a local process",
        )
    return [rewrite(expand_vars(a, env)) for a in list(command) + list(container.get("args") or [])]


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


def pv_for_claim(pvc: dict, host_path: str) -> dict:
    """A hostPath PersistentVolume pre-bound to `pvc`. Pure."""
    md, spec = pvc["metadata"], pvc.get("spec") or {}
    storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
    pv_spec: dict[str, Any] = {
        "capacity": {"storage": storage},
        "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": spec.get("storageClassName") or "",
        "volumeMode": spec.get("volumeMode") or "Filesystem",
        "hostPath": {"path": host_path, "type": "DirectoryOrCreate"},
        "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "namespace": md["namespace"], "name": md["name"], "uid": md["uid"]},
    }
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"pvc-{md['uid']}",
                         "labels": {"eopipe.dev/node-agent": "true"},
                         "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
            "spec": pv_spec}


def resolve_probe_port(port: Any, container: dict) -> int:
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"named port {port!r} not found in container ports")


def run_probe(probe: dict, *, pod_ip: str, container: dict, env: dict[str, str], cwd: str,
              rewrite: Callable[[str], str]) -> tuple[bool, str]:
    """Runs one probe attempt. Returns (success, message)."""
    timeout = float(probe.get("timeoutSeconds") or 1)
    try:
        if "httpGet" in probe:
            hg = probe["httpGet"]
            host = hg.get("host") or pod_ip
            port = resolve_probe_port(hg.get("port"), container)
            path = hg.get("path") or "/"
            headers = {h["name"]: h["value"] for h in hg.get("httpHeaders") or []}
            if (hg.get("scheme") or "HTTP").upper() == "HTTPS":
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    host, port, timeout=timeout, context=ssl._create_unverified_context())
            else:
                conn = http.client.HTTPConnection(host, port, timeout=timeout)
            try:
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
                resp.read(1024)
                ok = 200 <= resp.status < 400
                return ok, f"HTTP probe {host}:{port}{path} status {resp.status}"
            finally:
                conn.close()
        if "tcpSocket" in probe:
            ts = probe["tcpSocket"]
            host = ts.get("host") or pod_ip
            port = resolve_probe_port(ts.get("port"), container)
            with socket.create_connection((host, port), timeout=timeout):
                return True, f"TCP probe {host}:{port} ok"
        if "exec" in probe:
            cmd = [rewrite(expand_vars(a, env)) for a in probe["exec"].get("command") or []]
            r = subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            return r.returncode == 0, f"exec probe exit {r.returncode}: {r.stdout[-200:]!r}"
        return True, "unsupported probe type treated as success"
    except Exception as e:  # noqa: BLE001 - any failure is a probe failure
        return False, f"probe failed: {type(e).__name__}: {e}"


class ProbeState:
    """Thresholds and timing of one probe (readiness, liveness or startup)."""

    def __init__(self, spec: dict | None, kind: str, started_at: float):
        self.spec = spec
        self.kind = kind
        self.failures = 0
        self.successes = 0
        self.result = spec is None or kind == "liveness"  # readiness starts false
        if spec is None and kind == "startup":
            self.result = True
        self.next_at = started_at + float((spec or {}).get("initialDelaySeconds") or 0)
        self.message = ""

    def due(self, t: float) -> bool:
        return self.spec is not None and t >= self.next_at

    def record(self, ok: bool, msg: str, t: float) -> bool:
        """Records one attempt; returns True when the result flipped."""
        spec = self.spec or {}
        self.next_at = t + float(spec.get("periodSeconds") or 10)
        self.message = msg
        before = self.result
        if ok:
            self.failures = 0
            self.successes += 1
            if self.successes >= int(spec.get("successThreshold") or 1):
                self.result = True
        else:
            self.successes = 0
            self.failures += 1
            if self.failures >= int(spec.get("failureThreshold") or 3):
                self.result = False
        return before != self.result


# --------------------------------------------------------------------------------------
# A minimal JSON REST client over the kubernetes package's ApiClient (auth from kubeconfig).
# --------------------------------------------------------------------------------------

class Kube:
    def __init__(self, kubeconfig: Path):
        from kubernetes import config  # imported late: the pure helpers need no client
        self.kubeconfig = Path(kubeconfig)
        self._new = lambda: config.new_client_from_config(config_file=str(kubeconfig))
        self.api = self._new()
        self.server = self.api.configuration.host

    def new_watch_client(self) -> "Kube":
        k = object.__new__(Kube)
        k.kubeconfig, k._new, k.server = self.kubeconfig, self._new, self.server
        k.api = self._new()
        return k

    def request(self, method: str, path: str, body: Any = None, query: dict | None = None,
                content_type: str = "application/json", timeout: float = 30) -> Any:
        resp = self.api.call_api(
            path, method, query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"], _preload_content=False,
            _return_http_data_only=True, _request_timeout=timeout)
        data = resp.data
        return json.loads(data) if data else None

    def get(self, path: str) -> dict | None:
        from kubernetes.client.rest import ApiException
        try:
            return self.request("GET", path)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create(self, path: str, body: dict, ok_exists: bool = True) -> dict | None:
        from kubernetes.client.rest import ApiException
        try:
            return self.request("POST", path, body)
        except ApiException as e:
            if e.status == 409 and ok_exists:
                return None
            raise

    def merge_patch(self, path: str, body: dict) -> dict:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: dict | None = None) -> None:
        from kubernetes.client.rest import ApiException
        try:
            self.request("DELETE", path, body or {})
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def watch(self, path: str, query: dict, timeout: int = 240) -> Iterator[dict]:
        """Yields watch events (dicts). Raises WatchExpired on 410 / ERROR events."""
        from kubernetes.watch.watch import iter_resp_lines
        q = dict(query, watch="true", timeoutSeconds=str(timeout), allowWatchBookmarks="true")
        resp = self.api.call_api(
            path, "GET", query_params=list(q.items()), header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
            _request_timeout=(10, timeout + 30))
        try:
            for line in iter_resp_lines(resp):
                if not line or not line.strip():
                    continue
                ev = json.loads(line)
                if ev.get("type") == "ERROR":
                    raise WatchExpired(str(ev.get("object")))
                yield ev
        finally:
            resp.close()
            resp.release_conn()


class WatchExpired(Exception):
    pass


def informer(kube: Kube, path: str, query: dict, on_list: Callable[[list[dict]], None],
             on_event: Callable[[str, dict], None], stop: threading.Event, name: str) -> None:
    """List then watch `path` until `stop`; re-lists after any error (410 Gone included)."""
    while not stop.is_set():
        try:
            lst = kube.request("GET", path, query=query)
            on_list(lst.get("items") or [])
            rv = lst["metadata"]["resourceVersion"]
            while not stop.is_set():
                for ev in kube.watch(path, dict(query, resourceVersion=rv)):
                    obj = ev.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if ev["type"] != "BOOKMARK":
                        on_event(ev["type"], obj)
                    if stop.is_set():
                        return
        except Exception as e:  # noqa: BLE001 - always re-list
            if stop.is_set():
                return
            log.warning(kv(event="watch.restart", watch=name, error=f"{type(e).__name__}: {e}"[:300]))
            stop.wait(1.0)


# --------------------------------------------------------------------------------------
# The agent (runs in the subprocess).
# --------------------------------------------------------------------------------------

class IPAllocator:
    def __init__(self, net: ipaddress.IPv4Network = POD_NET):
        self.net = net
        self.used: set[str] = set()
        self.cursor = int(net.network_address) + 2
        self.lock = threading.Lock()

    def reserve(self, ip: str | None) -> bool:
        with self.lock:
            if not ip or ip in self.used or ipaddress.ip_address(ip) not in self.net:
                return False
            self.used.add(ip)
            return True

    def allocate(self) -> str:
        with self.lock:
            lo, hi = int(self.net.network_address) + 2, int(self.net.broadcast_address) - 1
            for _ in range(hi - lo + 1):
                ip = ipaddress.ip_address(self.cursor)
                self.cursor = self.cursor + 1 if self.cursor < hi else lo
                if str(ip).endswith((".0", ".255")) or str(ip) in self.used:
                    continue
                self.used.add(str(ip))
                return str(ip)
            raise RuntimeError("pod IP range exhausted")

    def release(self, ip: str | None) -> None:
        with self.lock:
            self.used.discard(ip or "")


class Agent:
    def __init__(self, kubeconfig: Path, workdir: Path, node_name: str, extra_path: list[str]):
        self.kubeconfig = Path(kubeconfig).resolve()
        self.workdir = Path(workdir).resolve()
        self.node_name = node_name
        self.extra_path = extra_path
        self.kube = Kube(self.kubeconfig)
        self.stop_event = threading.Event()
        self.workers: dict[str, PodWorker] = {}
        self.workers_lock = threading.Lock()
        self.ips = IPAllocator(pod_network_for(node_name))
        self.host_ip = "127.0.0.1"
        self.node_uid = ""
        self.threads: list[threading.Thread] = []
        (self.workdir / "pods").mkdir(parents=True, exist_ok=True)
        (self.workdir / "volumes").mkdir(parents=True, exist_ok=True)
        u = self.kube.server.split("://", 1)[-1].rstrip("/")
        host, _, port = u.rpartition(":")
        self.service_host, self.service_port = host.strip("[]") or u, port or "443"
        self._pvc_done: set[str] = set()

    # ---------- node ----------
    def node_status(self) -> dict:
        now = now_rfc3339()
        res = {"cpu": "16", "memory": "64Gi", "pods": "200", "ephemeral-storage": "100Gi"}

        def cond(t: str, st: str, reason: str, msg: str) -> dict:
            return {"type": t, "status": st, "reason": reason, "message": msg,
                    "lastHeartbeatTime": now, "lastTransitionTime": self._transition.get(t, now)}
        self._transition = getattr(self, "_transition", {})
        conds = [cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
                 cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
                 cond("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
                 cond("Ready", "True", "KubeletReady", "eopipe test node agent is posting ready status")]
        for c in conds:
            self._transition.setdefault(c["type"], now)
        return {"capacity": res, "allocatable": res, "conditions": conds,
                "addresses": [{"type": "InternalIP", "address": self.host_ip},
                              {"type": "Hostname", "address": self.node_name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"machineID": "eopipe", "systemUUID": "eopipe", "bootID": "eopipe",
                             "kernelVersion": os.uname().release, "osImage": "eopipe-node-agent",
                             "containerRuntimeVersion": "eopipe://local-process",
                             "kubeletVersion": "v1.35.4", "kubeProxyVersion": "",
                             "operatingSystem": "linux", "architecture": "amd64"}}

    def register_node(self) -> None:
        path = f"/api/v1/nodes/{self.node_name}"
        node = self.kube.get(path)
        if node is None:
            body = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": self.node_name,
                                 "labels": {"kubernetes.io/hostname": self.node_name,
                                            "kubernetes.io/os": "linux",
                                            "kubernetes.io/arch": "amd64",
                                            "eopipe.dev/node-agent": "true"}},
                    "spec": {}, "status": self.node_status()}
            self.kube.create("/api/v1/nodes", body)
            node = self.kube.get(path)
            log.info(kv(event="node.registered", node=self.node_name))
        self.node_uid = node["metadata"]["uid"]
        self.heartbeat()

    def heartbeat(self) -> None:
        path = f"/api/v1/nodes/{self.node_name}"
        node = self.kube.merge_patch(path + "/status", {"status": self.node_status()})
        taints = (node.get("spec") or {}).get("taints") or []
        keep = [t for t in taints if t.get("key") not in NOT_READY_TAINTS]
        if len(keep) != len(taints):
            self.kube.merge_patch(path, {"spec": {"taints": keep or None}})
            log.info(kv(event="node.untainted", removed=len(taints) - len(keep)))
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node_name}"
        spec = {"holderIdentity": self.node_name, "leaseDurationSeconds": 40, "renewTime": now_micro()}
        if self.kube.get(lease_path) is None:
            self.kube.create("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.node_name, "namespace": "kube-node-lease",
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                                                  "name": self.node_name, "uid": self.node_uid}]},
                "spec": spec})
        else:
            self.kube.merge_patch(lease_path, {"spec": spec})

    def _heartbeat_loop(self) -> None:
        while not self.stop_event.wait(HEARTBEAT_PERIOD):
            try:
                if self.kube.get(f"/api/v1/nodes/{self.node_name}") is None:
                    log.warning(kv(event="node.missing", node=self.node_name))
                    self.register_node()
                else:
                    self.heartbeat()
            except Exception as e:  # noqa: BLE001
                log.warning(kv(event="heartbeat.error", error=f"{type(e).__name__}: {e}"[:300]))
            try:  # resync: a claim whose PV creation failed gets another chance
                for pvc in self.kube.request("GET", "/api/v1/persistentvolumeclaims").get("items") or []:
                    self._pvc_event("MODIFIED", pvc)
            except Exception as e:  # noqa: BLE001
                log.warning(kv(event="pvc.resync_error", error=f"{type(e).__name__}: {e}"[:300]))

    # ---------- storage ----------
    def ensure_storage_class(self) -> None:
        path = f"/apis/storage.k8s.io/v1/storageclasses/{STORAGE_CLASS}"
        if self.kube.get(path) is None:
            self.kube.create("/apis/storage.k8s.io/v1/storageclasses", {
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": STORAGE_CLASS, "annotations": {
                    "storageclass.kubernetes.io/is-default-class": "true"}},
                "provisioner": PROVISIONER, "reclaimPolicy": "Retain",
                "volumeBindingMode": "Immediate"})
            log.info(kv(event="storageclass.created", name=STORAGE_CLASS))

    def claim_dir(self, namespace: str, claim: str) -> Path:
        return self.workdir / "volumes" / namespace / claim

    def on_pvc(self, pvc: dict) -> None:
        md, spec = pvc["metadata"], pvc.get("spec") or {}
        if md.get("deletionTimestamp") or spec.get("volumeName"):
            return
        if (pvc.get("status") or {}).get("phase", "Pending") != "Pending" or md["uid"] in self._pvc_done:
            return
        if spec.get("volumeMode") == "Block":
            log.warning(kv(event="pvc.skipped", pvc=pod_key(pvc), reason="Block volumes unsupported"))
            return
        d = self.claim_dir(md["namespace"], md["name"])
        marker = d.parent / f".{md['name']}.uid"
        if d.exists() and marker.exists() and marker.read_text().strip() != md["uid"]:
            # a new claim with an old claim's name: the old data is retained, not handed over
            old = self.workdir / "volumes" / ".released" / f"{md['namespace']}_{md['name']}_{marker.read_text().strip()}"
            old.parent.mkdir(parents=True, exist_ok=True)
            d.rename(old)
        d.mkdir(parents=True, exist_ok=True)
        marker.write_text(md["uid"])
        created = self.kube.create("/api/v1/persistentvolumes", pv_for_claim(pvc, str(d)))
        self._pvc_done.add(md["uid"])
        log.info(kv(event="pv.created" if created else "pv.exists", pvc=pod_key(pvc),
                    pv=f"pvc-{md['uid']}", path=d))

    def _pvc_event(self, typ: str, pvc: dict) -> None:
        if typ in ("ADDED", "MODIFIED"):
            try:
                self.on_pvc(pvc)
            except Exception as e:  # noqa: BLE001
                log.warning(kv(event="pvc.error", pvc=pod_key(pvc), error=f"{type(e).__name__}: {e}"[:300]))

    # ---------- pods ----------
    def _pods_listed(self, pods: list[dict]) -> None:
        uids = set()
        for p in pods:
            uids.add(p["metadata"]["uid"])
            self._pod_event("MODIFIED", p)
        with self.workers_lock:
            gone = [w for uid, w in self.workers.items() if uid not in uids]
        for w in gone:
            w.mark_gone()

    def _pod_event(self, typ: str, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        if (pod.get("spec") or {}).get("nodeName") != self.node_name:
            return
        with self.workers_lock:
            w = self.workers.get(uid)
            if typ == "DELETED":
                if w:
                    w.mark_gone()
                return
            if w is None:
                w = PodWorker(self, pod)
                self.workers[uid] = w
                w.thread.start()
                return
        w.update(pod)

    def worker_done(self, w: "PodWorker") -> None:
        with self.workers_lock:
            if self.workers.get(w.uid) is w:
                del self.workers[w.uid]

    def data(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        obj = self.kube.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        if obj is None:
            return None
        out = dict(obj.get("data") or {})
        if kind == "secrets":
            out = {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in out.items()}
        return out

    def data_bytes(self, kind: str, namespace: str, name: str) -> dict[str, bytes] | None:
        obj = self.kube.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        if obj is None:
            return None
        out: dict[str, bytes] = {}
        for k, v in (obj.get("data") or {}).items():
            out[k] = base64.b64decode(v) if kind == "secrets" else v.encode()
        for k, v in (obj.get("binaryData") or {}).items():
            out[k] = base64.b64decode(v)
        return out

    # ---------- lifecycle ----------
    def run(self) -> None:
        self.ensure_storage_class()
        self.register_node()
        pods_ready, pvcs_ready = threading.Event(), threading.Event()

        def pods_list(items: list[dict]) -> None:
            self._pods_listed(items)
            pods_ready.set()

        def pvc_list(items: list[dict]) -> None:
            for p in items:
                self._pvc_event("ADDED", p)
            pvcs_ready.set()

        specs = [
            ("heartbeat", self._heartbeat_loop),
            ("pod-informer", lambda: informer(
                self.kube.new_watch_client(), "/api/v1/pods",
                {"fieldSelector": f"spec.nodeName={self.node_name}"},
                pods_list, self._pod_event, self.stop_event, "pods")),
            ("pvc-informer", lambda: informer(
                self.kube.new_watch_client(), "/api/v1/persistentvolumeclaims", {},
                pvc_list, self._pvc_event, self.stop_event, "pvcs")),
        ]
        for name, fn in specs:
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self.threads.append(t)
        pods_ready.wait(60)
        pvcs_ready.wait(60)
        (self.workdir / "ready").write_text(str(os.getpid()))
        log.info(kv(event="agent.ready", node=self.node_name, pid=os.getpid()))

    def shutdown(self) -> None:
        log.info(kv(event="agent.stopping"))
        self.stop_event.set()
        with self.workers_lock:
            workers = list(self.workers.values())
        for w in workers:
            w.wake.set()
        for w in workers:
            w.thread.join(10)
        kill_leftover_groups(self.workdir)
        log.info(kv(event="agent.stopped"))


def kill_leftover_groups(workdir: Path) -> None:
    for pidfile in (Path(workdir) / "pods").glob("*/pid"):
        try:
            os.killpg(int(pidfile.read_text().strip()), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError, FileNotFoundError):
            pass
        pidfile.unlink(missing_ok=True)


class PodWorker:
    """Owns one pod (by uid): volumes, process, probes, restarts, status, deletion."""

    def __init__(self, agent: Agent, pod: dict):
        self.agent = agent
        self.pod = pod
        md = pod["metadata"]
        self.uid, self.ns, self.name = md["uid"], md.get("namespace", "default"), md["name"]
        self.wake = threading.Event()
        self.gone = False
        self.thread = threading.Thread(target=self._run, name=f"pod:{self.ns}/{self.name}", daemon=True)
        self.dir = agent.workdir / "pods" / pod_dir_name(self.ns, self.name)
        self.uid_dir = self.dir / self.uid[:8]
        self.proc: subprocess.Popen | None = None
        self.log_file = None
        spec = pod.get("spec") or {}
        self.container = (spec.get("containers") or [{}])[0]
        ignored = [c.get("name") for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])[1:]]
        if ignored:
            log.warning(kv(event="pod.containers_ignored", pod=f"{self.ns}/{self.name}",
                           containers=",".join(map(str, ignored)),
                           why="the agent runs only the first container; init and other containers are skipped"))
        status = pod.get("status") or {}
        prev = (status.get("containerStatuses") or [{}])[0]
        self.c = ContainerRuntime(name=self.container.get("name", "main"),
                                  image=self.container.get("image", ""),
                                  restart_count=int(prev.get("restartCount") or 0))
        self.had_run_before = bool(prev.get("state", {}).get("running") or prev.get("lastState"))
        self.phase = "Pending"
        self.terminal = status.get("phase") in ("Succeeded", "Failed")
        self.pod_reason = self.pod_message = ""
        self.start_time = status.get("startTime") or now_rfc3339()
        self.pod_ip: str | None = None
        self.last_status: dict | None = None
        self.next_start = 0.0
        self.backoff = BACKOFF_START
        self.volumes: dict[str, Path] | None = None
        self.rewrite: MountRewriter = MountRewriter({})
        self.env: dict[str, str] = {}
        self.cwd = str(self.uid_dir / "root")
        self.probes: dict[str, ProbeState] = {}
        self.last_volume_refresh = 0.0
        self.liveness_kill = False
        self._tokens: dict[tuple, tuple[bytes, float]] = {}
        self.starts = 0
        self.adopted_terminal = self.terminal  # finished before this agent saw it: status is not ours

    # called from informer threads
    def update(self, pod: dict) -> None:
        self.pod = pod
        self.wake.set()

    def mark_gone(self) -> None:
        self.gone = True
        self.wake.set()

    def info(self, event: str, **f: Any) -> None:
        log.info(kv(event=event, pod=f"{self.ns}/{self.name}", **f))

    # ---------- main loop ----------
    def _run(self) -> None:
        try:
            if self.terminal:
                self.phase = (self.pod.get("status") or {}).get("phase")
            else:
                self._init_ip()
            while True:
                try:
                    if self._step():
                        return
                except Exception as e:  # noqa: BLE001 - one bad pod never stops the agent
                    log.exception(kv(event="pod.step_error", pod=f"{self.ns}/{self.name}",
                                     error=f"{type(e).__name__}: {e}"[:300]))
                    self.wake.wait(1.0)
                self.wake.wait(0.25)
                self.wake.clear()
        finally:
            self.agent.ips.release(self.pod_ip)
            self.agent.worker_done(self)

    def _init_ip(self) -> None:
        spec, status = self.pod.get("spec") or {}, self.pod.get("status") or {}
        if spec.get("hostNetwork"):
            self.pod_ip = self.agent.host_ip
            return
        old = status.get("podIP")
        self.pod_ip = old if self.agent.ips.reserve(old) else self.agent.ips.allocate()

    def _step(self) -> bool:
        """One iteration. Returns True when the worker is finished."""
        pod = self.pod
        if self.agent.stop_event.is_set():
            self._kill_now()
            self.info("pod.left_running_on_agent_stop")
            return True
        if self.gone:
            self._terminate(grace=2.0, final=True)
            self._cleanup()
            self.info("pod.gone")
            return True
        if pod["metadata"].get("deletionTimestamp"):
            md = pod["metadata"]
            grace = md.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            grace = min(float(grace), TERMINATION_GRACE_CAP)
            self.info("pod.terminating", grace=grace)
            self._terminate(grace=grace, final=True)
            self._publish()
            # Like kubelet, report the terminated container first and finish the deletion a
            # moment later. Deleting within milliseconds of the request races `kubectl delete
            # --wait` (its GET sees the old pod, its LIST already the controller's new one with
            # the same name, and it waits forever for a DELETED event it missed).
            until = time.monotonic() + FINAL_DELETE_DELAY
            while not self.gone and time.monotonic() < until:
                time.sleep(0.05)
            self.agent.kube.delete(f"/api/v1/namespaces/{self.ns}/pods/{self.name}",
                                   {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}})
            self._cleanup()
            self.info("pod.deleted")
            return True
        if self.terminal:
            return False
        if self.volumes is None:
            try:
                self._setup_volumes()
            except PodConfigError as e:
                self._waiting(e.reason, str(e))
                self._publish()
                self.wake.wait(2.0)
                return False
            except PodFatalError as e:
                self._fail(e.reason, e.message)
                return False
        t = time.time()
        if self.proc is None and t >= self.next_start:
            try:
                self._start()
            except PodConfigError as e:
                self._waiting(e.reason, str(e))
                self.next_start = t + 2.0
            except PodFatalError as e:
                self._fail(e.reason, e.message)
                return False
        if self.proc is not None:
            rc = self.proc.poll()
            if rc is not None:
                self._on_exit(rc)
            else:
                self._run_probes()
        if t - self.last_volume_refresh > VOLUME_REFRESH_PERIOD:
            self.last_volume_refresh = t
            try:
                self._materialise_volumes()
            except Exception as e:  # noqa: BLE001 - keep old files
                log.warning(kv(event="volume.refresh_error", pod=f"{self.ns}/{self.name}", error=str(e)[:200]))
        self._publish()
        return False

    # ---------- volumes ----------
    def _setup_volumes(self) -> None:
        spec = self.pod.get("spec") or {}
        vols: dict[str, Path] = {}
        for v in spec.get("volumes") or []:
            name = v["name"]
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                pvc = self.agent.kube.get(f"/api/v1/namespaces/{self.ns}/persistentvolumeclaims/{claim}")
                if pvc is None:
                    raise PodConfigError(f"persistentvolumeclaim {claim!r} not found")
                local = self.agent.claim_dir(self.ns, claim)
                pv_name = (pvc.get("spec") or {}).get("volumeName")
                if pv_name:
                    pv = self.agent.kube.get(f"/api/v1/persistentvolumes/{pv_name}") or {}
                    hp = ((pv.get("spec") or {}).get("hostPath") or {}).get("path")
                    if hp:
                        local = Path(hp)
                vols[name] = local
            elif "hostPath" in v:
                vols[name] = Path(v["hostPath"]["path"])
            elif "emptyDir" in v:
                vols[name] = self.uid_dir / "empty" / name
            elif any(k in v for k in ("configMap", "secret", "downwardAPI", "projected")):
                vols[name] = self.uid_dir / "vol" / name
            else:
                raise PodFatalError("UnsupportedVolume", f"volume {name!r}: unsupported type {sorted(v)}")
        for d in vols.values():
            d.mkdir(parents=True, exist_ok=True)
        self._vol_specs = {v["name"]: v for v in spec.get("volumes") or []}
        self.volumes = vols
        self._materialise_volumes(strict=True)
        self.last_volume_refresh = time.time()
        mapping = {}
        for m in self.container.get("volumeMounts") or []:
            if m["name"] not in vols:
                raise PodFatalError("InvalidVolumeMount", f"volumeMount {m['name']!r} has no volume")
            local = vols[m["name"]]
            if m.get("subPath"):
                local = local / m["subPath"]
                local.mkdir(parents=True, exist_ok=True)
            mapping[m["mountPath"]] = str(local)
        self.rewrite = MountRewriter(mapping)
        self.info("pod.volumes", mounts=json.dumps(mapping))

    def _materialise_volumes(self, strict: bool = False) -> None:
        if not self.volumes:
            return
        for name, v in self._vol_specs.items():
            if not any(k in v for k in ("configMap", "secret", "downwardAPI", "projected")):
                continue
            files: dict[str, bytes] = {}
            if "projected" in v:
                for src in v["projected"].get("sources") or []:
                    try:  # projected sources are lenient (kube-api-access-* of every pod)
                        files.update(self._source_files(src))
                    except PodConfigError as e:
                        log.warning(kv(event="volume.projected_source_missing", pod=f"{self.ns}/{self.name}",
                                       volume=name, error=str(e)))
            else:
                try:
                    files = self._source_files(v)
                except PodConfigError:
                    if strict:
                        raise
                    continue
            root = self.volumes[name]
            for rel, content in files.items():
                p = root / rel
                if p.exists() and p.read_bytes() == content:
                    continue
                p.parent.mkdir(parents=True, exist_ok=True)
                tmp = p.with_name(p.name + ".tmp-agent")
                tmp.write_bytes(content)
                tmp.replace(p)

    def _source_files(self, src: dict) -> dict[str, bytes]:
        for kind, api in (("configMap", "configmaps"), ("secret", "secrets")):
            if kind in src:
                ref = src[kind]
                obj_name = ref.get("name") or ref.get("secretName")
                data = self.agent.data_bytes(api, self.ns, obj_name)
                if data is None:
                    if ref.get("optional"):
                        return {}
                    raise PodConfigError(f"{api[:-1]} {self.ns}/{obj_name} not found")
                items = ref.get("items")
                if items:
                    return {it["path"]: data[it["key"]] for it in items if it["key"] in data}
                return dict(data)
        if "downwardAPI" in src:
            out = {}
            for it in src["downwardAPI"].get("items") or []:
                if "fieldRef" in it:
                    out[it["path"]] = field_ref_value(self._pod_with_ips(), it["fieldRef"]["fieldPath"]).encode()
                else:
                    out[it["path"]] = b"0"
            return out
        if "serviceAccountToken" in src:
            sat = src["serviceAccountToken"]
            sa = (self.pod.get("spec") or {}).get("serviceAccountName") or "default"
            key = (sa, sat.get("audience"), sat.get("path", "token"))
            token, renew_at = self._tokens.get(key, (b"", 0.0))
            if time.time() >= renew_at:
                ttl = int(sat.get("expirationSeconds") or 3607)
                try:
                    spec: dict[str, Any] = {"expirationSeconds": ttl}
                    if sat.get("audience"):
                        spec["audiences"] = [sat["audience"]]
                    r = self.agent.kube.request(
                        "POST", f"/api/v1/namespaces/{self.ns}/serviceaccounts/{sa}/token",
                        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
                    token, renew_at = r["status"]["token"].encode(), time.time() + ttl / 2
                except Exception as e:  # noqa: BLE001 - a token is a nice-to-have here
                    renew_at = time.time() + 60
                    log.warning(kv(event="volume.token_error", pod=f"{self.ns}/{self.name}",
                                   error=str(getattr(e, "body", None) or e)[:300]))
                self._tokens[key] = (token, renew_at)
            return {sat.get("path", "token"): token}
        return {}

    # ---------- process ----------
    def _pod_with_ips(self) -> dict:
        pod = json.loads(json.dumps(self.pod))
        st = pod.setdefault("status", {})
        st["podIP"] = self.pod_ip
        st["podIPs"] = [{"ip": self.pod_ip}]
        st["hostIP"] = self.agent.host_ip
        st["hostIPs"] = [{"ip": self.agent.host_ip}]
        return pod

    def _start(self) -> None:
        a = self.agent
        base = dict(os.environ)
        base["PATH"] = os.pathsep.join(list(a.extra_path) + [base.get("PATH", "")])
        base.update({
            "KUBECONFIG": str(a.kubeconfig),
            "KUBERNETES_SERVICE_HOST": a.service_host,
            "KUBERNETES_SERVICE_PORT": a.service_port,
            "POD_IP": self.pod_ip or "",
            "HOSTNAME": (self.pod.get("spec") or {}).get("hostname") or self.name,
        })
        env, own = resolve_env(self.container, self._pod_with_ips(), base,
                               lambda ns, n: a.data("configmaps", ns, n),
                               lambda ns, n: a.data("secrets", ns, n))
        argv = build_argv(self.container, env, lambda s: s)  # expand with un-rewritten env
        argv = [self.rewrite(x) for x in argv]
        for k in own:
            env[k] = self.rewrite(env[k])
        cwd = self.uid_dir / "root"
        if self.container.get("workingDir"):
            cwd = Path(self.rewrite(expand_vars(self.container["workingDir"], env)))
        cwd.mkdir(parents=True, exist_ok=True)
        self.env, self.cwd = env, str(cwd)
        if self.starts > 0 or self.had_run_before:
            self.c.restart_count += 1
        self.had_run_before = False
        self.starts += 1
        self.dir.mkdir(parents=True, exist_ok=True)
        logpath = self.dir / f"{self.c.name}.{self.uid[:8]}.{self.c.restart_count}.log"
        lf = open(logpath, "ab")
        lf.write(f"# eopipe node agent: argv={json.dumps(argv)} cwd={cwd} pod_ip={self.pod_ip}\n".encode())
        lf.flush()
        try:
            proc = subprocess.Popen(argv, cwd=str(cwd), env=env, stdin=subprocess.DEVNULL,
                                    stdout=lf, stderr=subprocess.STDOUT, start_new_session=True,
                                    close_fds=True)
        except OSError as e:
            lf.write(f"# start failed: {e}\n".encode())
            lf.close()
            self.info("pod.start_error", error=str(e))
            self.c.started_at = time.time()
            self._on_exit(128 if not isinstance(e, FileNotFoundError) else 127,
                          reason="StartError", message=f"{type(e).__name__}: {e}")
            return
        self.proc, self.log_file = proc, lf
        self._write_pidfile(proc.pid)
        t = time.time()
        self.c = ContainerRuntime(name=self.c.name, image=self.c.image, state="running", reason="",
                                  started_at=t, last_state=self.c.last_state,
                                  restart_count=self.c.restart_count, pid=proc.pid)
        spec = self.container
        self.probes = {k: ProbeState(spec.get(f"{k}Probe"), k, t) for k in ("startup", "readiness", "liveness")}
        self.c.ready = self.probes["readiness"].result and self.probes["startup"].result
        self.c.started = self.probes["startup"].result
        self.phase = "Running"
        self.info("pod.started", pid=proc.pid, restart=self.c.restart_count, ip=self.pod_ip,
                  argv=json.dumps(argv)[:500])

    def _run_probes(self) -> None:
        t = time.time()
        start = self.probes["startup"]
        kinds = ["startup"] if not start.result else ["readiness", "liveness"]
        for k in kinds:
            p = self.probes[k]
            if not p.due(t):
                continue
            ok, msg = run_probe(p.spec, pod_ip=self.pod_ip or self.agent.host_ip, container=self.container,
                                env=self.env, cwd=self.cwd, rewrite=self.rewrite)
            if p.record(ok, msg, time.time()):
                self.info("pod.probe", probe=k, result=p.result, msg=msg[:200])
            if k == "startup" and not p.result and p.failures >= int(p.spec.get("failureThreshold") or 3):
                self._liveness_restart(f"startup probe failed: {msg}")
                return
            if k == "liveness" and not p.result:
                self._liveness_restart(f"liveness probe failed: {msg}")
                return
        self.c.started = start.result
        self.c.ready = start.result and self.probes["readiness"].result

    def _liveness_restart(self, why: str) -> None:
        self.info("pod.unhealthy", why=why[:200])
        grace = min(float((self.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)),
                    TERMINATION_GRACE_CAP)
        self.liveness_kill = True
        self._terminate(grace=grace)

    def _on_exit(self, rc: int, reason: str = "", message: str = "", final: bool = False) -> None:
        t = time.time()
        ran = t - (self.c.started_at or t)
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the container's leftovers die with it
            except (ProcessLookupError, PermissionError):
                pass
            self._drop_pidfile(self.proc.pid)
            self.proc = None
        if self.log_file:
            self.log_file.close()
            self.log_file = None
        exit_code = rc if rc >= 0 else 128 + (-rc)
        reason = reason or ("Completed" if exit_code == 0 else "Error")
        term = {"exitCode": exit_code, "reason": reason,
                "startedAt": ts_rfc3339(self.c.started_at or t), "finishedAt": ts_rfc3339(t)}
        if message:
            term["message"] = message
        self.info("pod.exited", exit_code=exit_code, ran=f"{ran:.1f}s", reason=reason)
        policy = (self.pod.get("spec") or {}).get("restartPolicy") or "Always"
        restart = not final and (policy == "Always" or (
            policy == "OnFailure" and (exit_code != 0 or self.liveness_kill)))
        self.liveness_kill = False
        if restart:
            if ran > BACKOFF_RESET_AFTER:
                self.backoff = BACKOFF_START
            delay = self.backoff
            self.backoff = min(self.backoff * 2, BACKOFF_MAX)
            self.next_start = t + delay
            self.c = ContainerRuntime(name=self.c.name, image=self.c.image, state="waiting",
                                      reason="CrashLoopBackOff",
                                      message=f"back-off {delay:.0f}s restarting failed container {self.c.name}",
                                      started_at=self.c.started_at, last_state={"terminated": term},
                                      restart_count=self.c.restart_count)
            self.phase = "Running"
        else:
            self.c = ContainerRuntime(name=self.c.name, image=self.c.image, state="terminated",
                                      reason=reason, message=message, started_at=self.c.started_at,
                                      finished_at=t, exit_code=exit_code, last_state=self.c.last_state,
                                      restart_count=self.c.restart_count)
            self.phase = "Succeeded" if exit_code == 0 else "Failed"
            self.terminal = True

    def _terminate(self, grace: float, final: bool = False) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=max(grace, 0.0))
        except subprocess.TimeoutExpired:
            self.info("pod.sigkill_after_grace", grace=grace)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        rc = proc.wait()
        self._on_exit(rc, final=final)

    def _kill_now(self) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        self._drop_pidfile(proc.pid)
        self.proc = None
        if self.log_file:
            self.log_file.close()
            self.log_file = None

    def _waiting(self, reason: str, message: str) -> None:
        if self.c.state != "waiting" or self.c.reason != reason or self.c.message != message:
            self.info("pod.waiting", reason=reason, message=message[:300])
        self.c.state, self.c.reason, self.c.message = "waiting", reason, message

    def _fail(self, reason: str, message: str) -> None:
        self.info("pod.failed", reason=reason, message=message[:300])
        self.c = ContainerRuntime(name=self.c.name, image=self.c.image, state="terminated",
                                  reason=reason, message=message, exit_code=128,
                                  finished_at=time.time(), restart_count=self.c.restart_count)
        self.phase = "Failed"
        self.pod_reason, self.pod_message = reason, message
        self.terminal = True
        self._publish()

    def _cleanup(self) -> None:
        shutil.rmtree(self.uid_dir, ignore_errors=True)

    def _write_pidfile(self, pid: int) -> None:
        tmp = self.dir / f"pid.{self.uid[:8]}.tmp"
        tmp.write_text(str(pid))
        tmp.replace(self.dir / "pid")

    def _drop_pidfile(self, pid: int) -> None:
        # a recreated pod with the same name may already own the file
        f = self.dir / "pid"
        try:
            if f.read_text().strip() == str(pid):
                f.unlink()
        except FileNotFoundError:
            pass

    def _publish(self) -> None:
        if self.adopted_terminal or (self.pod_ip is None and not self.terminal):
            return
        st = build_pod_status(
            phase=self.phase, c=self.c, pod_ip=self.pod_ip, host_ip=self.agent.host_ip,
            start_time=self.start_time,
            old_conditions=(self.pod.get("status") or {}).get("conditions"),
            now=now_rfc3339(), reason=self.pod_reason, message=self.pod_message)
        if st == self.last_status:
            return
        from kubernetes.client.rest import ApiException
        try:
            self.pod = self.agent.kube.merge_patch(
                f"/api/v1/namespaces/{self.ns}/pods/{self.name}/status", {"status": st}) or self.pod
            self.last_status = st
        except ApiException as e:
            if e.status == 404:
                self.gone = True
            else:
                log.warning(kv(event="pod.status_error", pod=f"{self.ns}/{self.name}", status=e.status,
                               error=str(e.body)[:300]))
                self.last_status = None


# --------------------------------------------------------------------------------------
# Test-side handle: starts the agent as a subprocess.
# --------------------------------------------------------------------------------------

class NodeAgent:
    """Runs the agent as a subprocess (`python -m tests.localenv.nodeagent`).

    A subprocess, not threads in pytest: the agent's life is independent of the tests (a hung
    or failing test cannot stall pod supervision, and tests can stop/restart the "node"), it
    has its own GIL, and it watches the test process and exits (killing its pods) if pytest
    dies. Pod processes are reachable from tests through pid files.
    """

    def __init__(self, kubeconfig: Path, workdir: Path, node_name: str = "eopipe-node-0",
                 extra_path: list[str] | None = None):
        self.kubeconfig = Path(kubeconfig)
        self.workdir = Path(workdir)
        self.node_name = node_name
        self.extra_path = extra_path if extra_path is not None else [os.path.dirname(sys.executable)]
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "nodeagent.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "tests.localenv.nodeagent", "--kubeconfig", str(self.kubeconfig),
               "--workdir", str(self.workdir), "--node-name", self.node_name,
               "--parent-pid", str(os.getpid())]
        for p in self.extra_path:
            cmd += ["--extra-path", p]
        self.proc = daemon.spawn(cmd, self.workdir, "nodeagent", timeout, self.tail, self.stop)

    def stop(self, timeout: float = 20) -> None:
        if self.proc is None:
            return
        daemon.terminate(self.proc, timeout)
        kill_leftover_groups(self.workdir)
        self.proc = None

    def tail(self, n: int = 60) -> str:
        text = ""
        for f in (self.workdir / "nodeagent.out", self.log_path):
            if f.exists():
                text += f"--- {f}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-n:]) + "\n"
        return text

    # ---------- helpers for tests ----------
    def pod_dir(self, namespace: str, pod: str) -> Path:
        return self.workdir / "pods" / pod_dir_name(namespace, pod)

    def volume_dir(self, namespace: str, claim: str) -> Path:
        return self.workdir / "volumes" / namespace / claim

    def pod_pid(self, namespace: str, pod: str) -> int | None:
        try:
            return int((self.pod_dir(namespace, pod) / "pid").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def kill_pod_process(self, namespace: str, pod: str, sig: int = signal.SIGKILL,
                         group: bool = True) -> int:
        """Sends `sig` to the pod's process group (or only its main process). Returns the pid."""
        pid = self.pod_pid(namespace, pod)
        if pid is None:
            raise ProcessLookupError(f"pod {namespace}/{pod} has no running process")
        (os.killpg if group else os.kill)(pid, sig)
        return pid

    def pod_logs(self, namespace: str, pod: str) -> str:
        d = self.pod_dir(namespace, pod)
        files = sorted(d.glob("*.log"), key=lambda p: p.stat().st_mtime)
        return "".join(f"=== {f.name}\n" + f.read_text(errors="replace") for f in files)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.localenv.nodeagent", description=__doc__.split("\n")[0])
    ap.add_argument("--kubeconfig", required=True, type=Path)
    ap.add_argument("--workdir", required=True, type=Path)
    ap.add_argument("--node-name", default="eopipe-node-0")
    ap.add_argument("--extra-path", action="append", default=None,
                    help="prepended to pods' PATH (repeatable; default: dir of this python)")
    ap.add_argument("--parent-pid", type=int, default=0, help="exit (killing pods) when it dies")
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=str(args.workdir / "nodeagent.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s [%(threadName)s] %(message)s")
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    extra = args.extra_path if args.extra_path is not None else [os.path.dirname(sys.executable)]
    agent = Agent(args.kubeconfig, args.workdir, args.node_name, extra)
    done = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info(kv(event="agent.signal", signal=signal.Signals(signum).name))
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(kv(event="agent.starting", node=args.node_name, pid=os.getpid(), server=agent.kube.server))
    try:
        agent.run()
        while not done.wait(2.0):
            if args.parent_pid and os.getppid() != args.parent_pid:
                log.warning(kv(event="agent.parent_gone", parent=args.parent_pid))
                break
    finally:
        agent.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
