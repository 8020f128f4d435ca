"""toxiproxy (github.com/Shopify/toxiproxy/v2, built by hack/build-tools.sh) as a local process,
and a small client for its HTTP API (stdlib only).

A proxy listens on 127.0.0.1:<listen> and forwards to 127.0.0.1:<upstream>; toxics degrade
one direction of it (`upstream`: client -> server, `downstream`: server -> client):

    tp = Toxiproxy(workdir); tp.start()
    p = tp.create("broker-1", listen_port, upstream_port)
    p.blackhole()            # `timeout` toxic with timeout=0 both ways: bytes vanish, sockets stay open
    p.add("latency", latency=500, jitter=50)
    p.heal()                 # every toxic removed
    p.disable() / p.enable() # connections refused / back (disable also drops open ones)
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from localenv import REPO_ROOT, daemon
from localenv.daemon import free_port


def ensure_toxiproxy() -> Path:
    """The toxiproxy server binary (built once from the Go module proxy, cached)."""
    out = subprocess.run(["bash", str(REPO_ROOT / "hack" / "build-tools.sh"), "toxiproxy"],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1]) / "toxiproxy"


class ToxiproxyError(RuntimeError):
    pass


class Api:
    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def call(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise ToxiproxyError(f"{method} {path}: {e.code} {e.read().decode(errors='replace')}") from None
        return json.loads(raw) if raw.strip() else None


class Proxy:
    def __init__(self, api: Api, name: str, listen: str, upstream: str):
        self.api, self.name, self.listen, self.upstream = api, name, listen, upstream

    def add(self, kind: str, stream: str = "downstream", toxicity: float = 1.0, name: str | None = None,
            **attributes) -> str:
        """Adds a toxic (latency, bandwidth, timeout, reset_peer, slow_close, limit_data, ...)."""
        name = name or f"{kind}_{stream}"
        self.api.call("POST", f"/proxies/{self.name}/toxics",
                      {"name": name, "type": kind, "stream": stream, "toxicity": toxicity,
                       "attributes": attributes})
        return name

    def remove(self, toxic: str) -> None:
        self.api.call("DELETE", f"/proxies/{self.name}/toxics/{toxic}")

    def toxics(self) -> list[dict]:
        return self.api.call("GET", f"/proxies/{self.name}/toxics") or []

    def heal(self) -> None:
        for t in self.toxics():
            self.remove(t["name"])

    def blackhole(self) -> None:
        """Nothing passes either way and no connection is closed: what a cut-off peer looks like."""
        self.add("timeout", "upstream", timeout=0)
        self.add("timeout", "downstream", timeout=0)

    def reset_peer(self, after_ms: int = 0) -> None:
        self.add("reset_peer", "upstream", timeout=after_ms)

    def latency(self, ms: int, jitter: int = 0) -> None:
        self.add("latency", "downstream", latency=ms, jitter=jitter)

    def bandwidth(self, kb_per_s: int) -> None:
        self.add("bandwidth", "downstream", rate=kb_per_s)

    def _enabled(self, on: bool) -> None:
        self.api.call("POST", f"/proxies/{self.name}",
                      {"enabled": on, "listen": self.listen, "upstream": self.upstream})

    def disable(self) -> None:
        self._enabled(False)

    def enable(self) -> None:
        self._enabled(True)


class Toxiproxy:
    """The toxiproxy server on a free loopback port; proxies are created through its API."""

    def __init__(self, workdir: Path, binary: Path | None = None):
        self.workdir = Path(workdir)
        self.binary = binary
        self.port = free_port()
        self.api = Api(f"http://127.0.0.1:{self.port}")
        self.proxies: dict[str, Proxy] = {}
        self._proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> None:
        self.binary = self.binary or ensure_toxiproxy()
        self.workdir.mkdir(parents=True, exist_ok=True)
        out = open(self.workdir / "toxiproxy.log", "ab")
        self._proc = subprocess.Popen([str(self.binary), "-host", "127.0.0.1", "-port", str(self.port)],
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"toxiproxy exited {self._proc.returncode}: "
                                   f"{daemon.last_lines(self.workdir / 'toxiproxy.log')}")
            try:
                self.api.call("GET", "/proxies")
                return
            except (OSError, ToxiproxyError):
                time.sleep(0.1)
        raise TimeoutError("toxiproxy did not answer")

    def version(self) -> str:
        req = urllib.request.urlopen(self.api.url + "/version", timeout=5)
        return req.read().decode().strip()

    def create(self, name: str, listen_port: int, upstream_port: int) -> Proxy:
        listen, upstream = f"127.0.0.1:{listen_port}", f"127.0.0.1:{upstream_port}"
        self.api.call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream, "enabled": True})
        p = self.proxies[name] = Proxy(self.api, name, listen, upstream)
        return p

    def heal_all(self) -> None:
        for p in self.proxies.values():
            p.enable()
            p.heal()

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            daemon.stop_group(proc, 5)
