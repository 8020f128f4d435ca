"""The operator's API access table (control/permissions.py) is exactly what the code does:
every kubernetes client call in control/ and core/ (resource and verb read from the client's
own request path and method), every kind the builders make (applied server-side: get, create,
patch), and Kopf's declared needs; and IMPLIED is exactly what the API server checks besides:
what the Roles the builders make grant, `bind` for RoleBindings to a ClusterRole, and the
finalizers of blockOwnerDeletion. The chart is checked against the same tables in
tests/integration/test_chart.py."""

from __future__ import annotations

import ast
import inspect
import re
from functools import cache
from pathlib import Path

import kubernetes.client.api as kapi
import pytest

from eopipe.control import permissions
from eopipe.control.builders.pipeline import objects
from eopipe.control.kube import owner_reference
from eopipe.control.permissions import API_ACCESS, APPLY, CREATED_NOT_APPLIED, IMPLIED, KOPF, OWN, WATCHED
from eopipe.control.settings import Settings
from eopipe.core.assignment import Assignment, assign
from tests.helpers.pipelines import example_names

PKG = Path(__file__).resolve().parents[2] / "operator" / "eopipe"
SCANNED = sorted([*(PKG / "control").rglob("*.py"), *(PKG / "core").rglob("*.py")])
CUSTOM = ("eopipe.dev", "exactlyoncepipelines")  # the only custom resource the code calls (RESOURCE)


@cache
def client_methods() -> dict[str, tuple[str, str]]:
    """kubernetes client method name -> (request path, HTTP method)."""
    out = {}
    for _, cls in inspect.getmembers(kapi, inspect.isclass):
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if not name.endswith("_with_http_info"):
                continue
            m = re.search(r"call_api\(\s*'([^']+)',\s*'(\w+)'", inspect.getsource(fn))
            if m:
                out[name.removesuffix("_with_http_info")] = (m.group(1), m.group(2))
    return out


def access_of(path: str, method: str) -> tuple[str, str, str]:
    """(group, resource[/subresource], verb) of a request, as RBAC authorizes it."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource, named = rest[0], len(rest) > 1 and rest[1] == "{name}"
    if named and len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    if (group, rest[0]) == ("{group}", "{plural}"):
        resource = "/".join([CUSTOM[1], *resource.split("/")[1:]])
        group = CUSTOM[0]
    verb = {"GET": "get" if named else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection"}[method]
    return group, resource, verb


@cache
def string_constants() -> dict[str, str]:
    """Module-level `NAME = "text"` (and `A, B = "x", "y"`) of the scanned code; a name given two
    values in two modules is left out."""
    seen: dict[str, set[str]] = {}
    for path in SCANNED:
        for node in ast.parse(path.read_text(), str(path)).body:
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            target, value = node.targets[0], node.value
            pairs = ([(target, value)] if isinstance(target, ast.Name) else
                     list(zip(target.elts, value.elts)) if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                     and len(target.elts) == len(value.elts) else [])
            for t, v in pairs:
                if isinstance(t, ast.Name) and isinstance(v, ast.Constant) and isinstance(v.value, str):
                    seen.setdefault(t.id, set()).add(v.value)
    return {k: next(iter(v)) for k, v in seen.items() if len(v) == 1}


def custom_resource(call: ast.Call) -> tuple[str, str] | None:
    """(group, plural) of a CustomObjectsApi call that names them by string constants (arguments
    0 and 3), else None: the call is on RESOURCE (CUSTOM), unpacked into variables."""
    def text(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return string_constants().get(node.id) if isinstance(node, ast.Name) else None
    if len(call.args) < 4 or any(isinstance(a, ast.Starred) for a in call.args[:4]):
        return None
    group, plural = text(call.args[0]), text(call.args[3])
    return (group, plural) if group and plural else None


def client_calls() -> set[tuple[str, str, str, str]]:
    """(group, resource, verb, where) of every kubernetes client call in the scanned code."""
    methods = client_methods()
    found = set()
    for path in SCANNED:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in methods:
                group, resource, verb = access_of(*methods[node.func.attr])
                if (group, resource.split("/")[0]) == CUSTOM and (named := custom_resource(node)):
                    group, resource = named[0], "/".join([named[1], *resource.split("/")[1:]])
                found.add((group, resource, verb, f"{path.relative_to(PKG)}:{node.lineno}"))
    return found


def built_kinds() -> set[tuple[str, str]]:
    """(group, plural) of every object a builder makes: dicts with a constant apiVersion and kind."""
    found = set()
    for path in sorted((PKG / "control" / "builders").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Dict):
                continue
            consts = {k.value: v.value for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
            if isinstance(consts.get("apiVersion"), str) and isinstance(consts.get("kind"), str):
                group = consts["apiVersion"].rpartition("/")[0]
                kind = consts["kind"].lower()
                found.add((group, kind[:-1] + "ies" if kind.endswith("y") else kind + "s"))
    return found


def derived() -> set[tuple[str, str, str]]:
    out = {(g, r, v) for g, r, v, _ in client_calls()}
    out |= {(g, r, v) for g, r in built_kinds() - CREATED_NOT_APPLIED for v in APPLY}
    out |= {(a.group, a.resource, v) for a in KOPF for v in a.verbs}
    return out


def declared() -> set[tuple[str, str, str]]:
    return {(a.group, a.resource, v) for a in API_ACCESS for v in a.verbs}


@pytest.mark.parametrize("path, method, want", [
    ("/api/v1/namespaces/{namespace}/secrets/{name}", "GET", ("", "secrets", "get")),
    ("/api/v1/namespaces/{namespace}/pods", "GET", ("", "pods", "list")),
    ("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}", "PUT",
     ("coordination.k8s.io", "leases", "update")),
    ("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status", "PATCH",
     ("eopipe.dev", "exactlyoncepipelines/status", "patch")),
    ("/apis/{group}/{version}/{plural}", "GET", ("eopipe.dev", "exactlyoncepipelines", "list")),
    ("/api/v1/namespaces/{namespace}/pods", "DELETE", ("", "pods", "deletecollection")),
])
def test_request_to_rbac(path, method, want):
    assert access_of(path, method) == want


def test_the_scan_sees_the_calls_it_must():
    calls = {(g, r, v) for g, r, v, _ in client_calls()}
    assert {("coordination.k8s.io", "leases", "update"), ("", "pods", "list"),
            ("eopipe.dev", "exactlyoncepipelines/status", "patch"),
            ("sparkoperator.k8s.io", "sparkapplications", "delete")} <= calls  # named by constants
    assert {("apps", "statefulsets"), ("rbac.authorization.k8s.io", "roles")} <= built_kinds()


def test_every_access_of_the_code_is_declared():
    missing = {(g, r, v, where) for g, r, v, where in client_calls() if (g, r, v) not in declared()}
    missing |= {(g, r, v, "builders (applied)") for g, r in built_kinds() - CREATED_NOT_APPLIED
                for v in APPLY if (g, r, v) not in declared()}
    assert not missing, f"add to control/permissions.py (and the chart's RBAC): {sorted(missing)}"


def test_nothing_is_declared_that_the_code_does_not_do():
    assert declared() <= derived(), sorted(declared() - derived())


def test_leases_are_the_operators_own_namespace_only():
    assert permissions.granted(OWN) == {("coordination.k8s.io", "leases"): {"get", "create", "update"}}
    assert all(a.resource != "leases" for a in API_ACCESS if a.scope != OWN)


def made_objects() -> list[dict]:
    """Every object the operator applies for a pipeline with both stages."""
    names = example_names("payments.yaml")
    pods = [f"{names.dedup}-0", f"{names.dedup}-1"]
    return objects(names, Settings(), Assignment(1, assign(names.spec.source.partitions, pods)), 2)


def implied() -> set[tuple[str, str, str]]:
    """What the API server checks beyond the calls: the rules of the Roles the operator makes
    (RBAC lets it grant only what it holds), bind on the ClusterRoles its RoleBindings name, and
    the owner's finalizers for blockOwnerDeletion."""
    out = set()
    for obj in made_objects():
        if obj["kind"] in ("Role", "ClusterRole"):
            out |= {(g, r, v) for rule in obj["rules"] for g in rule["apiGroups"]
                    for r in rule["resources"] for v in rule["verbs"]}
        if obj["kind"] == "RoleBinding" and obj["roleRef"]["kind"] == "ClusterRole":
            out.add(("rbac.authorization.k8s.io", "clusterroles", "bind"))
    ref = owner_reference({"apiVersion": "eopipe.dev/v1beta1", "kind": "ExactlyOncePipeline",
                           "metadata": {"name": "p", "uid": "u"}})
    if ref["blockOwnerDeletion"]:
        out.add(("eopipe.dev", "exactlyoncepipelines/finalizers", "update"))
    return out - declared()


def test_implied_is_what_the_api_server_checks_beyond_the_calls():
    assert {(a.group, a.resource, v) for a in IMPLIED for v in a.verbs} == implied()
    assert all(a.scope == WATCHED for a in IMPLIED)


def test_the_operator_grants_no_write_it_would_have_to_hold():
    """The Roles it makes grant reads only; the Spark driver's rights are a ClusterRole it binds."""
    granted_by_roles = {v for o in made_objects() if o["kind"] == "Role" for rule in o["rules"] for v in rule["verbs"]}
    assert granted_by_roles <= {"get", "list", "watch"}, granted_by_roles
    assert "ClusterRole" not in {o["kind"] for o in made_objects()}


def test_only_bind_is_named():
    """resourceNames is what limits `bind` to the chart's ClusterRole; nothing else needs one."""
    assert [(a.resource, a.verbs) for a in (*API_ACCESS, *IMPLIED) if a.named] == [("clusterroles", ("bind",))]
