"""Volumes without mounts: the local provisioner (a default StorageClass, hostPath PVs
pre-bound to Pending claims) and each pod's volumes as local directories, with the files of
configMap, secret, downwardAPI and projected volumes written and refreshed there."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from localenv.nodeagent import podfiles
from localenv.nodeagent.kube import Kube, kv, log, pod_key
from localenv.nodeagent.podspec import MountRewriter, PodConfigError, PodFatalError, field_ref_value

STORAGE_CLASS = "local"
PROVISIONER = "eopipe.dev/local-test"
# A kubelet refreshes configMap/secret volumes every sync period plus cache TTL (~60-90 s);
# set this to 60 to see what a product would do on a real node.
VOLUME_REFRESH_PERIOD = float(os.environ.get("EOPIPE_NODEAGENT_VOLUME_REFRESH_SECONDS", "5"))
_FILE_SOURCES = ("configMap", "secret", "downwardAPI", "projected")


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


class Provisioner:
    """Creates a PV for each Pending claim without a volume; the real PV controller binds them."""

    def __init__(self, kube: Kube, workdir: Path):
        self.kube, self.workdir = kube, workdir
        self._done: set[str] = set()

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

    def on_pvc(self, pvc: dict) -> None:
        md, spec = pvc["metadata"], pvc.get("spec") or {}
        if md.get("deletionTimestamp") or spec.get("volumeName"):
            return
        if (pvc.get("status") or {}).get("phase", "Pending") != "Pending" or md["uid"] in self._done:
            return
        if spec.get("storageClassName") == "":
            return  # "no class": bound only to a volume made by hand, as Kubernetes does; never provisioned
        if spec.get("volumeMode") == "Block":
            log.warning(kv(event="pvc.skipped", pvc=pod_key(pvc), reason="Block volumes unsupported"))
            return
        d = podfiles.claim_dir(self.workdir, md["namespace"], md["name"])
        marker = d.parent / f".{md['name']}.uid"
        if d.exists() and marker.exists() and marker.read_text().strip() != md["uid"]:
            # a new claim with an old claim's name: the old data is retained, not handed over
            old = self.workdir / "volumes" / ".released" / f"{md['namespace']}_{md['name']}_{marker.read_text().strip()}"
            old.parent.mkdir(parents=True, exist_ok=True)
            d.rename(old)
        d.mkdir(parents=True, exist_ok=True)
        marker.write_text(md["uid"])
        created = self.kube.create("/api/v1/persistentvolumes", pv_for_claim(pvc, str(d)))
        self._done.add(md["uid"])
        log.info(kv(event="pv.created" if created else "pv.exists", pvc=pod_key(pvc),
                    pv=f"pvc-{md['uid']}", path=d))

    def event(self, typ: str, pvc: dict) -> None:
        if typ in ("ADDED", "MODIFIED"):
            try:
                self.on_pvc(pvc)
            except Exception as e:  # noqa: BLE001
                log.warning(kv(event="pvc.error", pvc=pod_key(pvc), error=f"{type(e).__name__}: {e}"[:300]))

    def resync(self) -> None:
        """A claim whose PV creation failed gets another chance."""
        try:
            for pvc in self.kube.request("GET", "/api/v1/persistentvolumeclaims").get("items") or []:
                self.event("MODIFIED", pvc)
        except Exception as e:  # noqa: BLE001
            log.warning(kv(event="pvc.resync_error", error=f"{type(e).__name__}: {e}"[:300]))


class PodVolumes:
    """One pod's volumes as local directories, and the mount path rewrite that points at them.

    `pod()` gives the pod as the downward API sees it (with its IPs).
    """

    def __init__(self, kube: Kube, workdir: Path, ns: str, name: str, uid_dir: Path,
                 pod: Callable[[], dict]):
        self.kube, self.workdir, self.uid_dir, self.pod = kube, workdir, uid_dir, pod
        self.ns, self.who = ns, f"{ns}/{name}"
        self.dirs: dict[str, Path] | None = None  # None until set up
        self.rewrite: MountRewriter = MountRewriter({})
        self.last_refresh = 0.0
        self._specs: dict[str, dict] = {}
        self._tokens: dict[tuple, tuple[bytes, float]] = {}

    def setup(self, container: dict) -> None:
        """Directories, files and the rewrite; PodConfigError until the sources exist."""
        spec = self.pod().get("spec") or {}
        vols: dict[str, Path] = {}
        for v in spec.get("volumes") or []:
            name = v["name"]
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                pvc = self.kube.get(f"/api/v1/namespaces/{self.ns}/persistentvolumeclaims/{claim}")
                if pvc is None:
                    raise PodConfigError(f"persistentvolumeclaim {claim!r} not found")
                local = podfiles.claim_dir(self.workdir, self.ns, claim)
                pv_name = (pvc.get("spec") or {}).get("volumeName")
                if pv_name:
                    pv = self.kube.get(f"/api/v1/persistentvolumes/{pv_name}") or {}
                    hp = ((pv.get("spec") or {}).get("hostPath") or {}).get("path")
                    if hp:
                        local = Path(hp)
                vols[name] = local
            elif "hostPath" in v:
                vols[name] = Path(v["hostPath"]["path"])
            elif "emptyDir" in v:
                vols[name] = self.uid_dir / "empty" / name
            elif any(k in v for k in _FILE_SOURCES):
                vols[name] = self.uid_dir / "vol" / name
            else:
                raise PodFatalError("UnsupportedVolume", f"volume {name!r}: unsupported type {sorted(v)}")
        for d in vols.values():
            d.mkdir(parents=True, exist_ok=True)
        self._specs = {v["name"]: v for v in spec.get("volumes") or []}
        self.dirs = vols
        self.materialise(strict=True)
        self.last_refresh = time.time()
        mapping = {}
        for m in container.get("volumeMounts") or []:
            if m["name"] not in vols:
                raise PodFatalError("InvalidVolumeMount", f"volumeMount {m['name']!r} has no volume")
            local = vols[m["name"]]
            if m.get("subPath"):
                local = local / m["subPath"]
                local.mkdir(parents=True, exist_ok=True)
            mapping[m["mountPath"]] = str(local)
        self.rewrite = MountRewriter(mapping)
        log.info(kv(event="pod.volumes", pod=self.who, mounts=json.dumps(mapping)))

    def refresh(self, t: float) -> None:
        """Rewrites changed files every VOLUME_REFRESH_PERIOD; a failure keeps the old files."""
        if t - self.last_refresh <= VOLUME_REFRESH_PERIOD:
            return
        self.last_refresh = t
        try:
            self.materialise()
        except Exception as e:  # noqa: BLE001 - keep old files
            log.warning(kv(event="volume.refresh_error", pod=self.who, error=str(e)[:200]))

    def materialise(self, strict: bool = False) -> None:
        if not self.dirs:
            return
        for name, v in self._specs.items():
            if not any(k in v for k in _FILE_SOURCES):
                continue
            files: dict[str, bytes] = {}
            if "projected" in v:
                for src in v["projected"].get("sources") or []:
                    try:  # projected sources are lenient (kube-api-access-* of every pod)
                        files.update(self._source_files(src))
                    except PodConfigError as e:
                        log.warning(kv(event="volume.projected_source_missing", pod=self.who,
                                       volume=name, error=str(e)))
            else:
                try:
                    files = self._source_files(v)
                except PodConfigError:
                    if strict:
                        raise
                    continue
            root = self.dirs[name]
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
                data = self.kube.data_bytes(api, self.ns, obj_name)
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
                    out[it["path"]] = field_ref_value(self.pod(), it["fieldRef"]["fieldPath"]).encode()
                else:
                    out[it["path"]] = b"0"
            return out
        if "serviceAccountToken" in src:
            return self._token_file(src["serviceAccountToken"])
        return {}

    def _token_file(self, sat: dict) -> dict[str, bytes]:
        sa = (self.pod().get("spec") or {}).get("serviceAccountName") or "default"
        key = (sa, sat.get("audience"), sat.get("path", "token"))
        token, renew_at = self._tokens.get(key, (b"", 0.0))
        if time.time() >= renew_at:
            ttl = int(sat.get("expirationSeconds") or 3607)
            try:
                spec: dict[str, Any] = {"expirationSeconds": ttl}
                if sat.get("audience"):
                    spec["audiences"] = [sat["audience"]]
                r = self.kube.request(
                    "POST", f"/api/v1/namespaces/{self.ns}/serviceaccounts/{sa}/token",
                    {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
                token, renew_at = r["status"]["token"].encode(), time.time() + ttl / 2
            except Exception as e:  # noqa: BLE001 - a token is a nice-to-have here
                renew_at = time.time() + 60
                log.warning(kv(event="volume.token_error", pod=self.who,
                               error=str(getattr(e, "body", None) or e)[:300]))
            self._tokens[key] = (token, renew_at)
        return {sat.get("path", "token"): token}
