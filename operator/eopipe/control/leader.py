"""Leader election on a coordination.k8s.io/v1 Lease: of the operator's replicas only the holder
runs Kopf, so no pipeline is reconciled by two operators at once.

Why not `kubernetes.leaderelection`: the client (35.0.0) ships only a ConfigMap lock and compares
the holder's renew time with the local wall clock. Why not Kopf's peering: it freezes every
operator of equal priority instead of electing one, and needs a CRD of its own; Kopf runs
standalone (no peering) behind this election.

The rules are client-go's: a follower takes the Lease over once the record has not changed for
`leaseDurationSeconds` by its *own* monotonic clock (no clock skew between nodes matters); a
leader that has not renewed within `renew_deadline` (< lease duration) gives up, and gives up
by ending the process (the pod restarts as a follower), never by running on. Every write names
the resourceVersion it read (or creates), so of two candidates the API server lets one win.
"""

from __future__ import annotations

import datetime
import json
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import urllib3
from kubernetes import client
from prometheus_client import Gauge

log = logging.getLogger("eopipe.leader")
_NETWORK = (urllib3.exceptions.HTTPError, OSError)
LEADER = Gauge("eopipe_operator_leader", "1 while this operator process holds the leader Lease")


@dataclass(frozen=True)
class Record:
    """A Lease's spec as read, and the version every write must name."""
    holder: str
    duration: float           # leaseDurationSeconds; 0 when unset
    transitions: int
    acquire_time: str
    version: str


@dataclass(frozen=True)
class Facts:
    me: str
    lease: Record | None      # None: no Lease yet
    unchanged_for: float      # seconds since this process first saw lease.version
    leading: bool             # this process holds the Lease as far as it knows
    since_renewed: float      # seconds since the start of its last successful write (leading)
    duration: float           # our lease duration
    renew_deadline: float
    now: str                  # MicroTime for the record
    error: str = ""           # reading the Lease failed (lease is then unknown, not absent)


@dataclass(frozen=True)
class Plan:
    action: str               # acquire | renew | wait | lost
    why: str
    spec: dict | None = None  # the Lease spec to write (acquire, renew)


def decide(f: Facts) -> Plan:
    lease = f.lease
    if f.leading and f.since_renewed >= f.renew_deadline:
        # Followers may take over after the lease duration: stop well before that.
        return Plan("lost", f"not renewed for {f.since_renewed:.1f}s (renew deadline {f.renew_deadline:g}s)"
                            + (f": {f.error}" if f.error else ""))
    if f.error:
        return Plan("wait", f.error)
    if f.leading:
        if lease is None:
            return Plan("lost", "the Lease was deleted")
        if lease.holder != f.me:
            return Plan("lost", f"the Lease is held by {lease.holder or 'nobody'}")
        return Plan("renew", "holder", _spec(f, lease.acquire_time, lease.transitions))
    if lease is None:
        return Plan("acquire", "no Lease yet", _spec(f, f.now, 0))
    if lease.holder == f.me:  # this pod's previous process: it is gone
        return Plan("acquire", "held by this identity's previous process", _spec(f, f.now, lease.transitions))
    if not lease.holder:
        return Plan("acquire", "released", _spec(f, f.now, lease.transitions + 1))
    expiry = lease.duration or f.duration
    if f.unchanged_for >= expiry:
        return Plan("acquire", f"{lease.holder} has not renewed for {f.unchanged_for:.1f}s",
                    _spec(f, f.now, lease.transitions + 1))
    return Plan("wait", f"held by {lease.holder}")


def _spec(f: Facts, acquired: str, transitions: int) -> dict:
    return {"holderIdentity": f.me, "leaseDurationSeconds": max(1, round(f.duration)),
            "acquireTime": acquired, "renewTime": f.now, "leaseTransitions": transitions}


def micro_time(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    """Outside a pod (no POD_NAME): unique per process, as client-go does."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class Fatal(Exception):
    """The election cannot work (no permission): retrying would not help."""


class Elector:
    def __init__(self, api: client.ApiClient, name: str, namespace: str, identity: str, *,
                 duration: float = 15, renew_deadline: float = 10, retry_period: float = 2,
                 clock=time.monotonic, wall=time.time):
        self.coord = client.CoordinationV1Api(api)
        self.name, self.namespace, self.me = name, namespace, identity
        self.duration, self.renew_deadline, self.retry_period = duration, renew_deadline, retry_period
        self.clock, self.wall = clock, wall
        self.leading = False
        self._seen: tuple[str, float] | None = None  # (resourceVersion, when first seen)
        self._renewed = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- I/O around decide ----------------------------------------------------------------
    def _timeout(self) -> float:
        return max(1.0, min(self.retry_period, self.renew_deadline / 2))

    def _read(self) -> Record | None:
        try:
            resp = self.coord.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                    _request_timeout=self._timeout())
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        obj = json.loads(resp.data)
        spec = obj.get("spec") or {}
        return Record(spec.get("holderIdentity") or "", float(spec.get("leaseDurationSeconds") or 0),
                      int(spec.get("leaseTransitions") or 0), spec.get("acquireTime") or "",
                      obj["metadata"]["resourceVersion"])

    def _observe(self, rec: Record | None, now: float) -> float:
        version = rec.version if rec else ""
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, now)
        return now - self._seen[1]

    def step(self) -> Plan:
        """One round: read, decide, write. A refused or failed write changes nothing: the next
        round reads again (a 409 means another candidate wrote first)."""
        started = self.clock()
        try:
            rec = self._read()
        except client.ApiException as e:
            self._fatal(e)
            rec, failed = None, f"reading the Lease: {e.status} {e.reason}"
        except _NETWORK as e:  # connection refused, timeout
            rec, failed = None, f"reading the Lease: {type(e).__name__}: {e}"
        else:
            failed = ""
        if failed:
            return decide(self._facts(None, 0.0, started, failed))
        plan = decide(self._facts(rec, self._observe(rec, started), started))
        if plan.spec is None:
            return plan
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": plan.spec}
        try:
            if rec is None:
                out = self.coord.create_namespaced_lease(self.namespace, body, _request_timeout=self._timeout())
            else:
                body["metadata"]["resourceVersion"] = rec.version
                out = self.coord.replace_namespaced_lease(self.name, self.namespace, body,
                                                          _request_timeout=self._timeout())
        except client.ApiException as e:
            self._fatal(e)
            return Plan("wait", f"{plan.action} refused: {e.status} {e.reason}")
        except _NETWORK as e:
            return Plan("wait", f"{plan.action} failed: {type(e).__name__}: {e}")
        self._seen = (out.metadata.resource_version, started)
        self._renewed = started
        if not self.leading:
            log.info(f"{self.me} leads ({plan.why}); Lease {self.namespace}/{self.name}")
        self.leading = True
        LEADER.set(1)
        return plan

    def _facts(self, rec: Record | None, unchanged_for: float, now: float, error: str = "") -> Facts:
        return Facts(self.me, rec, unchanged_for, self.leading, now - self._renewed, self.duration,
                     self.renew_deadline, micro_time(self.wall()), error)

    @staticmethod
    def _fatal(e: client.ApiException) -> None:
        if e.status in (401, 403):
            raise Fatal(f"leader election on Lease needs get, create and update on "
                        f"coordination.k8s.io leases: {e.status} {e.reason}") from None

    # -- the loops --------------------------------------------------------------------------
    def acquire(self) -> None:
        """Blocks until this process leads."""
        LEADER.set(0)
        log.info(f"{self.me} waits for Lease {self.namespace}/{self.name}")
        last = ""
        while not self._stop.is_set():
            plan = self.step()
            if self.leading:
                return
            if plan.why != last:
                log.info(f"not leading: {plan.why}")
                last = plan.why
            self._stop.wait(self.retry_period)

    def keep(self, on_lost) -> None:
        """Renews every retry period in a thread; on_lost(why) when leadership is gone."""
        def run():
            while not self._stop.wait(self.retry_period):
                try:
                    plan = self.step()
                except Fatal as e:
                    plan = Plan("lost", str(e))
                if plan.action == "lost":
                    self.leading = False
                    LEADER.set(0)
                    on_lost(plan.why)
                    return
                if plan.action == "wait":
                    log.warning(f"Lease not renewed: {plan.why}")
        self._thread = threading.Thread(target=run, name="lease-renew", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """On a clean shutdown: stop renewing and hand the Lease over at once (an empty holder
        with a 1 s duration, as client-go releases), so a follower need not wait it out."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._timeout() * 2 + 1)
        if not self.leading:
            return
        self.leading = False
        LEADER.set(0)
        try:
            rec = self._read()
            if rec is None or rec.holder != self.me:
                return
            now = micro_time(self.wall())
            self.coord.replace_namespaced_lease(self.name, self.namespace, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace, "resourceVersion": rec.version},
                "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "acquireTime": now, "renewTime": now,
                         "leaseTransitions": rec.transitions}}, _request_timeout=self._timeout())
            log.info(f"{self.me} released Lease {self.namespace}/{self.name}")
        except (client.ApiException, *_NETWORK) as e:  # the Lease expires by itself
            log.warning(f"could not release the Lease: {e}")


class FollowerHealth:
    """/healthz while waiting to lead (Kopf, which serves it otherwise, has not started): a
    follower is alive and ready, so probes and rollouts do not restart or wait on it."""

    def __init__(self, bind: str, port: int):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                ok = self.path.split("?")[0] == "/healthz"
                body = b'{"leader": false}' if ok else b"not found"
                self.send_response(200 if ok else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((bind, port), Handler)
        threading.Thread(target=self.server.serve_forever, name="follower-health", daemon=True).start()

    def close(self) -> None:
        """Frees the port for Kopf's own liveness endpoint."""
        self.server.shutdown()
        self.server.server_close()
