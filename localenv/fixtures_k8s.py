"""pytest plugin: the real local Kubernetes control plane (localenv/controlplane.py).

Load it with `pytest_plugins = ["localenv.fixtures_k8s"]`. Fixtures:

- control_plane (session): etcd + apiserver + controller-manager + scheduler, started once.
- kube_api: a kubernetes.client.ApiClient authenticated as cluster admin.
- k8s_namespace: a fresh namespace for one test, deleted afterwards (without waiting).

When a test that uses the control plane fails, the tail of each component's log is attached
to its report, and the end of the run says where the full logs are kept.
"""

from __future__ import annotations

import re
import uuid

import pytest

from localenv.controlplane import ControlPlane
from localenv.daemon import last_lines

_CP_KEY = pytest.StashKey[ControlPlane]()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory, request) -> ControlPlane:
    cp = ControlPlane(tmp_path_factory.mktemp("k8s"))
    request.config.stash[_CP_KEY] = cp
    cp.start()
    yield cp
    cp.stop()


@pytest.fixture
def kube_api(control_plane):
    from kubernetes import config

    if not control_plane.running:  # a fault test stopped a component; bring it all back
        control_plane.stop()
        control_plane.start()
    client = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def k8s_namespace(kube_api, request) -> str:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base or 't'}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(kube_api)
    core.create_namespace(client.V1Namespace(
        metadata=client.V1ObjectMeta(name=name, labels={"eopipe.dev/test": "true"})))
    yield name
    try:
        core.delete_namespace(name, propagation_policy="Background")
    except ApiException as e:
        if e.status != 404:
            raise


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    cp = item.config.stash.get(_CP_KEY, None)
    if cp is None or not rep.failed or "control_plane" not in getattr(item, "fixturenames", ()):
        return
    for name, path in cp.log_paths().items():
        if path.exists():
            rep.sections.append((f"{name} log (tail of {path})", last_lines(path, 30)))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    cp = config.stash.get(_CP_KEY, None)
    if cp is not None and (exitstatus != 0 or terminalreporter.stats.get("failed")):
        terminalreporter.write_line(f"control plane logs kept in {cp.logs_dir}")
