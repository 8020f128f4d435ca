"""Container probes (httpGet, tcpSocket, exec) and their thresholds and timing, as kubelet runs
them: startupProbe gates the others, readiness starts false, liveness starts true."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
from typing import Any, Callable

from localenv.nodeagent.podspec import expand_vars


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
