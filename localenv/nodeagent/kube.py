"""The agent's view of the API server: a minimal JSON REST client over the kubernetes package's
ApiClient (auth from the kubeconfig), a list-then-watch informer, and the agent's log format."""

from __future__ import annotations

import base64
import datetime
import json
import logging
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

log = logging.getLogger("eopipe.nodeagent")


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

    def data(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's or Secret's `data` as text, for environment variables (kubelet reads
        no binaryData there); None when the object is missing."""
        obj = self.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        if obj is None:
            return None
        out = dict(obj.get("data") or {})
        if kind == "secrets":
            out = {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in out.items()}
        return out

    def data_bytes(self, kind: str, namespace: str, name: str) -> dict[str, bytes] | None:
        """A ConfigMap's or Secret's files for a volume (binaryData included)."""
        obj = self.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        if obj is None:
            return None
        out: dict[str, bytes] = {}
        for k, v in (obj.get("data") or {}).items():
            out[k] = base64.b64decode(v) if kind == "secrets" else v.encode()
        for k, v in (obj.get("binaryData") or {}).items():
            out[k] = base64.b64decode(v)
        return out

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
