"""One pod's life on this node, on its own thread: volumes, the first container's process
(start, probes, exit, restart policy with back-off, SIGTERM then SIGKILL), the status it
reports, and the final delete of a terminating pod."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from localenv import daemon
from localenv.nodeagent import podfiles
from localenv.nodeagent.kube import kv, log, now_rfc3339, ts_rfc3339
from localenv.nodeagent.podspec import PodConfigError, PodFatalError, container_process
from localenv.nodeagent.probes import ProbeState, run_probe
from localenv.nodeagent.status import ContainerRuntime, build_pod_status
from localenv.nodeagent.volumes import PodVolumes

if TYPE_CHECKING:
    from localenv.nodeagent.agent import Agent

TERMINATION_GRACE_CAP = 30.0
BACKOFF_START = 1.0
BACKOFF_MAX = 10.0
BACKOFF_RESET_AFTER = 60.0
FINAL_DELETE_DELAY = 1.0


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
        self.dir = podfiles.pod_dir(agent.workdir, self.ns, self.name)
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
        self.volumes = PodVolumes(agent.kube, agent.workdir, self.ns, self.name, self.uid_dir,
                                  self._pod_with_ips)
        self.env: dict[str, str] = {}
        self.cwd = str(self.uid_dir / "root")
        self.probes: dict[str, ProbeState] = {}
        self.liveness_kill = False
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
            self._delete(pod)
            return True
        if self.terminal:
            return False
        if self.volumes.dirs is None:
            try:
                self.volumes.setup(self.container)
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
        self.volumes.refresh(t)
        self._publish()
        return False

    def _delete(self, pod: dict) -> None:
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
        kube = self.agent.kube
        hostname = (self.pod.get("spec") or {}).get("hostname") or self.name
        argv, env, cwd = container_process(
            self.container, self._pod_with_ips(), self.agent.base_env(self.pod_ip, hostname),
            self.volumes.rewrite, lambda ns, n: kube.data("configmaps", ns, n),
            lambda ns, n: kube.data("secrets", ns, n), self.uid_dir / "root")
        cwd.mkdir(parents=True, exist_ok=True)
        self.env, self.cwd = env, str(cwd)
        if self.starts > 0 or self.had_run_before:
            self.c.restart_count += 1
        self.had_run_before = False
        self.starts += 1
        self.dir.mkdir(parents=True, exist_ok=True)
        lf = open(podfiles.log_file(self.dir, self.c.name, self.uid, self.c.restart_count), "ab")
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
        podfiles.write_pid(self.dir, self.uid, proc.pid)
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
                                env=self.env, cwd=self.cwd, rewrite=self.volumes.rewrite)
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
        self._release_process()
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
        if self.proc is None:
            return
        rc = daemon.stop_group(self.proc, grace)
        if rc == -signal.SIGKILL:  # SIGTERM was not enough
            self.info("pod.sigkill_after_grace", grace=grace)
        self._on_exit(rc, final=final)

    def _kill_now(self) -> None:
        if self.proc is not None:
            daemon.signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._release_process()

    def _release_process(self) -> None:
        """What is left of the container's process group dies with it; pid file and log close."""
        if self.proc is not None:
            daemon.signal_group(self.proc.pid, signal.SIGKILL)
            podfiles.drop_pid(self.dir, self.proc.pid)
            self.proc = None
        if self.log_file:
            self.log_file.close()
            self.log_file = None

    # ---------- status ----------
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
