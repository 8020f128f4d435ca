"""Access control on the operator's side: the image allow-list, its settings, the token Secret
and the dedup pods' NetworkPolicy (control/access.py, control/builders/access.py)."""

from __future__ import annotations

import base64
import json

import pytest

from eopipe.control import access
from eopipe.control.builders import access as build
from eopipe.control.builders import dedup
from eopipe.control.builders.pipeline import dedup_objects
from eopipe.control.settings import Settings
from eopipe.core.assignment import Assignment
from eopipe.core.names import Names
from eopipe.core.spec import PipelineSpec
from eopipe.dedup import auth

SPEC = {"kafka": {"bootstrapServers": "k:9092"}, "source": {"topic": "payments", "partitions": 4}}


def names(**dedup_spec) -> Names:
    return Names("team-a", "payments", PipelineSpec.model_validate({**SPEC, "dedup": dedup_spec}))


@pytest.mark.parametrize("image, repo", [
    ("python", "docker.io/library/python"),
    ("python:3.12", "docker.io/library/python"),
    ("acme/eopipe:1", "docker.io/acme/eopipe"),
    ("docker.io/python", "docker.io/library/python"),
    ("index.docker.io/acme/x", "docker.io/acme/x"),
    ("ghcr.io/acme/eopipe:1.2@sha256:" + "a" * 64, "ghcr.io/acme/eopipe"),
    ("registry.example.com:5000/team/eopipe", "registry.example.com:5000/team/eopipe"),
    ("localhost/eopipe:dev", "localhost/eopipe"),
    ("localhost:5000/eopipe", "localhost:5000/eopipe"),
    ("GHCR.io/acme/x", "ghcr.io/acme/x"),
])
def test_repository(image, repo):
    assert access.repository(image) == repo


@pytest.mark.parametrize("image", ["", " python", "https://ghcr.io/x", "ghcr.io/Acme/x", "x:bad tag", "a//b",
                                   "ghcr.io/x@sha256"])
def test_repository_refuses(image):
    with pytest.raises(ValueError):
        access.repository(image)


ALLOW = ("ghcr.io/acme", "registry.example.com:5000", "docker.io/library")


@pytest.mark.parametrize("image, ok", [
    ("ghcr.io/acme/eopipe:1", True),
    ("ghcr.io/acme/team/eopipe", True),
    ("ghcr.io/acme-evil/eopipe", False),      # whole path components only
    ("ghcr.io/acme:1", True),                 # an entry may name one repository exactly
    ("ghcr.io/other/eopipe", False),
    ("registry.example.com:5000/x", True),
    ("registry.example.com/x", False),        # another port is another registry
    ("registry.example.com:5000.evil.io/x", False),
    ("python:3.12", True),                    # docker.io/library/python
    ("acme/python", False),                   # docker.io/acme/python
    ("https://ghcr.io/acme/x", False),
])
def test_allowed(image, ok):
    assert (access.allowed(image, ALLOW) is None) is ok
    assert access.allowed(image, ()) is None or image.startswith("https")  # empty list: anything parseable


def test_refused_images_names_the_field():
    n = names(image="quay.io/someone/dedup:1")
    assert access.refused_images(n.spec, ("ghcr.io/acme",)) == [
        ("spec.dedup.image: quay.io/someone/dedup:1 (quay.io/someone/dedup) is not from an allowed registry "
         "(ghcr.io/acme)")]
    assert access.refused_images(n.spec, ()) == []
    assert access.refused_images(names().spec, ("ghcr.io/acme",)) == []  # defaults: the operator's own


@pytest.mark.parametrize("text, want", [
    ("", ()),
    ("ghcr.io/acme, registry.example.com:5000", ("ghcr.io/acme", "registry.example.com:5000")),
    ("Docker.io ghcr.io/acme/", ("docker.io", "ghcr.io/acme")),
    ("index.docker.io/library", ("docker.io/library",)),
])
def test_parse_allow_list(text, want):
    assert access.parse_allow_list(text) == want


@pytest.mark.parametrize("text", ["https://ghcr.io", "ghcr.io//x", "ghcr.io/Acme", "-bad-.io"])
def test_parse_allow_list_refuses(text):
    with pytest.raises(ValueError, match="EOPIPE_ALLOWED_REGISTRIES"):
        access.parse_allow_list(text)


LABELS = {"app.kubernetes.io/name": "eopipe", "app.kubernetes.io/instance": "eopipe",
          "app.kubernetes.io/component": "operator"}
NP_ENV = {"EOPIPE_NETWORK_POLICIES": "true", "POD_NAMESPACE": "eopipe-system",
          "EOPIPE_OPERATOR_POD_LABELS": json.dumps(LABELS),
          "EOPIPE_METRICS_NAMESPACE_SELECTOR": '{"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}'}


@pytest.mark.parametrize("env, want", [
    ({}, None),
    ({"EOPIPE_NETWORK_POLICIES": "false", "EOPIPE_OPERATOR_POD_LABELS": "garbage"}, None),
    (NP_ENV, build.PolicyPeers("eopipe-system", tuple(sorted(LABELS.items())),
                               {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}})),
    ({**NP_ENV, "EOPIPE_METRICS_NAMESPACE_SELECTOR": "null"}, build.PolicyPeers("eopipe-system",
                                                                                 tuple(sorted(LABELS.items())))),
    ({**NP_ENV, "EOPIPE_OPERATOR_NAMESPACE": "ops"}, build.PolicyPeers(
        "ops", tuple(sorted(LABELS.items())), {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}})),
])
def test_network_policy_settings(env, want):
    assert Settings.from_env(env).network_policy == want


@pytest.mark.parametrize("env, message", [
    ({"EOPIPE_NETWORK_POLICIES": "yes please"}, "EOPIPE_NETWORK_POLICIES"),
    ({"EOPIPE_NETWORK_POLICIES": "true"}, "needs EOPIPE_OPERATOR_POD_LABELS"),
    ({**NP_ENV, "POD_NAMESPACE": ""}, "needs EOPIPE_OPERATOR_POD_LABELS"),
    ({**NP_ENV, "EOPIPE_OPERATOR_POD_LABELS": "{"}, "EOPIPE_OPERATOR_POD_LABELS: not JSON"),
    ({**NP_ENV, "EOPIPE_OPERATOR_POD_LABELS": "{}"}, "non-empty JSON object"),
    ({**NP_ENV, "EOPIPE_METRICS_NAMESPACE_SELECTOR": '{"namespace": "x"}'}, "label selector"),
    ({"EOPIPE_ALLOWED_REGISTRIES": "https://x"}, "EOPIPE_ALLOWED_REGISTRIES"),
])
def test_access_settings_errors(env, message):
    with pytest.raises(ValueError, match=message):
        Settings.from_env(env)


def test_network_policy():
    n = names()
    peers = build.PolicyPeers("eopipe-system", tuple(LABELS.items()), {"matchLabels": {"team": "obs"}})
    np = build.network_policy(n, peers)
    assert np["metadata"] == {"name": "payments-dedup", "namespace": "team-a", "labels": n.labels("dedup")}
    sts = dedup.statefulset(n, "eopipe:1")
    assert np["spec"]["podSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    assert np["spec"]["policyTypes"] == ["Ingress"]
    own, metrics = np["spec"]["ingress"]
    port = [{"protocol": "TCP", "port": "http"}]
    assert own["ports"] == metrics["ports"] == port
    assert sts["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"] == "http"
    # The pipeline's own pods (every one carries the pipeline label) and the operator's.
    assert own["from"][0] == {"podSelector": {"matchLabels": {"eopipe.dev/pipeline": "payments"}}}
    assert own["from"][0]["podSelector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert own["from"][1] == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "eopipe-system"}},
                              "podSelector": {"matchLabels": LABELS}}
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}]
    no_metrics = build.network_policy(n, build.PolicyPeers("eopipe-system", tuple(LABELS.items())))
    assert no_metrics["spec"]["ingress"] == [own]


def test_dedup_objects_with_and_without_the_policy():
    n = names()
    plain = dedup_objects(n, "eopipe:1", Assignment(1, {0: "payments-dedup-0"}), 1)
    assert "NetworkPolicy" not in [o["kind"] for o in plain]
    peers = build.PolicyPeers("eopipe-system", tuple(LABELS.items()))
    kinds = [o["kind"] for o in dedup_objects(n, "eopipe:1", Assignment(1, {0: "payments-dedup-0"}), 1, peers)]
    assert kinds[-2:] == ["NetworkPolicy", "StatefulSet"]  # in force before the pods start


def test_token_secret_and_env():
    n = names()
    token = build.new_token()
    assert len(token) >= 43 and token != build.new_token()
    secret = build.token_secret(n, token)
    assert secret["metadata"]["name"] == n.token_secret == "payments-dedup-token"
    assert base64.b64decode(secret["data"][build.TOKEN_KEY]).decode() == token
    assert build.token_problem(secret) is None
    # The pods read it as the worker expects (one env var, through a secretKeyRef).
    assert build.TOKEN_ENV == auth.TOKEN_ENV
    env = {e["name"]: e for e in dedup.statefulset(n, "eopipe:1")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[auth.TOKEN_ENV] == {"name": "EOPIPE_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "payments-dedup-token", "key": "token"}}}
    assert auth.read_token({auth.TOKEN_ENV: base64.b64decode(secret["data"]["token"]).decode()}, None) == token
    # The longest pipeline name still gives a valid Secret name.
    from eopipe.core.names import MAX_PIPELINE_NAME
    assert len(f"{'x' * MAX_PIPELINE_NAME}-dedup-token") <= 253


@pytest.mark.parametrize("data, problem", [
    ({"token": base64.b64encode(b"abc").decode()}, None),
    ({}, "has no key 'token'"),
    (None, "has no key 'token'"),
    ({"token": "!!!"}, "not a base64 text"),
    ({"token": base64.b64encode(b"  ").decode()}, "one word"),
    ({"token": base64.b64encode(b"two words").decode()}, "one word"),
])
def test_token_problem(data, problem):
    got = build.token_problem({"metadata": {"name": "p-dedup-token"}, "data": data})
    assert (got is None) if problem is None else (problem in got and "delete it" in got)
