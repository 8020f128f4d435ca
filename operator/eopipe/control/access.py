"""The operator's access-control settings and the image allow-list (docs/design.md#access-control).

Pure: the settings read from the environment the chart sets, and which images named in a
pipeline's spec come from a registry the operator is not allowed to run images from.

Images are compared by the registry and path a container runtime would pull them from:
`python:3.12` is `docker.io/library/python`, `ghcr.io/acme/eopipe:1@sha256:...` is
`ghcr.io/acme/eopipe`. An allow-list entry is a registry host (with its port, if any), or a
registry and a path prefix: `registry.example.com`, `registry.example.com:5000`,
`ghcr.io/acme`. An entry matches whole path components only (`ghcr.io/acme` does not admit
`ghcr.io/acme-evil/x`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from eopipe.control.builders.access import PolicyPeers

DEFAULT_REGISTRY = "docker.io"
_DOCKER_ALIASES = {"index.docker.io", "registry-1.docker.io", "docker.io"}
# A reference as the distribution spec writes it, loosely: [host[:port]/]path[:tag][@digest].
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_HOST = re.compile(r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
                   r"(?::[0-9]+)?$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$")


def repository(image: str) -> str:
    """`registry/path` of an image reference, as a runtime resolves it; ValueError if it is not one."""
    ref = image.strip()
    if not ref or ref != image or "://" in ref:
        raise ValueError(f"{image!r} is not an image reference")
    name, _, digest = ref.partition("@")
    if digest and not _DIGEST.match(digest):
        raise ValueError(f"{image!r}: bad digest")
    head, sep, tag = name.rpartition(":")
    if sep and "/" not in tag:
        name = head
        if not _TAG.match(tag):
            raise ValueError(f"{image!r}: bad tag")
    parts = name.split("/")
    first = parts[0]
    if len(parts) > 1 and ("." in first or ":" in first or first == "localhost"):
        host, path = first.lower(), parts[1:]
        if not _HOST.match(host):
            raise ValueError(f"{image!r}: bad registry host")
    else:
        host, path = DEFAULT_REGISTRY, parts
    if host in _DOCKER_ALIASES:
        host = DEFAULT_REGISTRY
        if len(path) == 1:
            path = ["library", *path]
    if not path or not all(_COMPONENT.match(c) for c in path):
        raise ValueError(f"{image!r}: bad repository path")
    return "/".join([host, *path])


def parse_allow_list(text: str) -> tuple[str, ...]:
    """EOPIPE_ALLOWED_REGISTRIES: entries separated by commas or spaces; ValueError if one is
    not a registry (with an optional path)."""
    out = []
    for entry in filter(None, re.split(r"[,\s]+", text)):
        e = entry.rstrip("/")
        host, _, path = e.partition("/")
        ok = _HOST.match(host) and "://" not in e and all(_COMPONENT.match(c) for c in filter(None, path.split("/")))
        if not ok or "//" in e:
            raise ValueError(f"EOPIPE_ALLOWED_REGISTRIES: {entry!r} is not a registry host or registry/path "
                             "(e.g. registry.example.com, registry.example.com:5000, ghcr.io/acme)")
        host = host.lower()
        out.append(DEFAULT_REGISTRY + (f"/{path}" if path else "") if host in _DOCKER_ALIASES else e.lower())
    return tuple(out)


def allowed(image: str, allow: tuple[str, ...]) -> str | None:
    """None if `image` may run under the allow-list (empty: any image), else why not."""
    if not allow:
        return None
    try:
        repo = repository(image)
    except ValueError as e:
        return str(e)
    if any(repo == a or repo.startswith(a + "/") for a in allow):
        return None
    return f"{image} ({repo}) is not from an allowed registry ({', '.join(allow)})"


def refused_images(spec, allow: tuple[str, ...]) -> list[str]:
    """The images the spec names (the defaults are the operator's own) that the allow-list
    refuses, as `spec.<field>: <why>`."""
    named = {"dedup.image": spec.dedup.image,
             "processing.image": getattr(spec.processing, "image", None) if spec.processing is not None else None}
    return [f"spec.{f}: {why}" for f, image in named.items()
            if image is not None and (why := allowed(image, allow)) is not None]


def _json(environ: Mapping[str, str], var: str):
    try:
        return json.loads(environ[var])
    except ValueError:
        raise ValueError(f"{var}: not JSON") from None


def settings_from_env(environ: Mapping[str, str]) -> dict:
    """Settings fields: allowed_registries (EOPIPE_ALLOWED_REGISTRIES) and network_policy
    (EOPIPE_NETWORK_POLICIES=true with EOPIPE_OPERATOR_POD_LABELS, a JSON object, the operator's
    namespace from EOPIPE_OPERATOR_NAMESPACE or POD_NAMESPACE, and EOPIPE_METRICS_NAMESPACE_SELECTOR,
    a JSON namespaceSelector or null). Off unless set: an operator run outside the chart does not
    know the labels its own pods are selected by, and a policy that left it out would cut it off
    from the pods' /status. ValueError names the variable."""
    out: dict = {"allowed_registries": parse_allow_list(environ.get("EOPIPE_ALLOWED_REGISTRIES", ""))}
    flag = environ.get("EOPIPE_NETWORK_POLICIES", "").strip().lower()
    if flag not in ("", "true", "false", "1", "0"):
        raise ValueError(f"EOPIPE_NETWORK_POLICIES={environ['EOPIPE_NETWORK_POLICIES']!r}: not true or false")
    if flag not in ("true", "1"):
        return {**out, "network_policy": None}
    namespace = environ.get("EOPIPE_OPERATOR_NAMESPACE") or environ.get("POD_NAMESPACE")
    if not namespace or "EOPIPE_OPERATOR_POD_LABELS" not in environ:
        raise ValueError("EOPIPE_NETWORK_POLICIES needs EOPIPE_OPERATOR_POD_LABELS (the operator pods' labels, "
                         "JSON) and its namespace (POD_NAMESPACE or EOPIPE_OPERATOR_NAMESPACE)")
    labels = _json(environ, "EOPIPE_OPERATOR_POD_LABELS")
    if not (isinstance(labels, dict) and labels and all(isinstance(v, str) for v in labels.values())):
        raise ValueError("EOPIPE_OPERATOR_POD_LABELS: expected a non-empty JSON object of label: value")
    selector = _json(environ, "EOPIPE_METRICS_NAMESPACE_SELECTOR") \
        if environ.get("EOPIPE_METRICS_NAMESPACE_SELECTOR", "").strip() else None
    if selector is not None and (not isinstance(selector, dict) or set(selector) - {"matchLabels", "matchExpressions"}):
        raise ValueError("EOPIPE_METRICS_NAMESPACE_SELECTOR: expected a label selector "
                         "({\"matchLabels\": {...}} and/or matchExpressions) or null")
    return {**out, "network_policy": PolicyPeers(namespace, tuple(sorted(labels.items())), selector)}
