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
  binds them; a claim of no class (`storageClassName: ""`) is left to a volume made by hand, as
  Kubernetes never provisions one. A default StorageClass `local` (provisioner
  eopipe.dev/local-test, Immediate) is created if missing.

Run as a subprocess (`NodeAgent.start()`), so that its life does not depend on the test
process's threads or GIL and tests can stop/restart it like a node:

    python -m localenv.nodeagent --kubeconfig K --workdir W [--node-name N]

Log: `<workdir>/nodeagent.log`, one `event=... key=value` line per event.

Modules: kube (API client, informer), podspec (env, argv, mount path rewrite), probes, status
(pod and Node status), volumes (provisioner, pod volumes), podfiles (pid and log files), pods
(PodWorker: one pod's lifecycle), agent (Agent: the node), cli (NodeAgent handle, `main`).
"""

from localenv.nodeagent.agent import HEARTBEAT_PERIOD, POD_NET, Agent, IPAllocator, pod_network_for
from localenv.nodeagent.cli import NodeAgent, main
from localenv.nodeagent.kube import Kube, WatchExpired, informer, kv, log, now_micro, now_rfc3339, pod_key, ts_rfc3339
from localenv.nodeagent.podfiles import kill_leftover_groups, pod_dir_name
from localenv.nodeagent.pods import (
                                     BACKOFF_MAX,
                                     BACKOFF_RESET_AFTER,
                                     BACKOFF_START,
                                     FINAL_DELETE_DELAY,
                                     TERMINATION_GRACE_CAP,
                                     PodWorker,
)
from localenv.nodeagent.podspec import (
                                     Lookup,
                                     MountRewriter,
                                     PodConfigError,
                                     PodFatalError,
                                     build_argv,
                                     expand_vars,
                                     field_ref_value,
                                     resolve_env,
)
from localenv.nodeagent.probes import ProbeState, resolve_probe_port, run_probe
from localenv.nodeagent.status import NOT_READY_TAINTS, ContainerRuntime, build_pod_status
from localenv.nodeagent.volumes import PROVISIONER, STORAGE_CLASS, VOLUME_REFRESH_PERIOD, pv_for_claim

__all__ = [
    "BACKOFF_MAX", "BACKOFF_RESET_AFTER", "BACKOFF_START", "FINAL_DELETE_DELAY", "HEARTBEAT_PERIOD",
    "NOT_READY_TAINTS", "POD_NET", "PROVISIONER", "STORAGE_CLASS", "TERMINATION_GRACE_CAP",
    "VOLUME_REFRESH_PERIOD", "Agent", "ContainerRuntime", "IPAllocator", "Kube", "Lookup",
    "MountRewriter", "NodeAgent", "PodConfigError", "PodFatalError", "PodWorker", "ProbeState",
    "WatchExpired", "build_argv", "build_pod_status", "expand_vars", "field_ref_value", "informer",
    "kill_leftover_groups", "kv", "log", "main", "now_micro", "now_rfc3339", "pod_dir_name", "pod_key",
    "pod_network_for", "pv_for_claim", "resolve_env", "resolve_probe_port", "run_probe", "ts_rfc3339",
]
