"""What a pod spec means for a local process, as pure functions: `$(VAR)` expansion, the
downward API, the container's environment, argv and working directory, and the mount path
rewrite that stands in for volume mounts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable


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


def container_process(container: dict, pod: dict, base: dict[str, str], rewrite: Callable[[str], str],
                      get_configmap: Lookup, get_secret: Lookup,
                      default_cwd: Path) -> tuple[list[str], dict[str, str], Path]:
    """argv, environment and working directory of the container's process.

    `$(VAR)`s are expanded with the values the pod spec gives; then mount paths are rewritten
    in argv, in the env values the spec sets and in workingDir.
    """
    env, own = resolve_env(container, pod, base, get_configmap, get_secret)
    argv = [rewrite(a) for a in build_argv(container, env, lambda s: s)]  # un-rewritten env
    for k in own:
        env[k] = rewrite(env[k])
    cwd = default_cwd
    if container.get("workingDir"):
        cwd = Path(rewrite(expand_vars(container["workingDir"], env)))
    return argv, env, cwd
