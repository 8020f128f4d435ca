"""Smoke tests of the test-only node agent on the real control plane.

The real kube-scheduler binds the pods, the real StatefulSet/PV controllers do their part,
and the agent runs the pods as local processes.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time

import pytest

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]


def wait_for(pred, timeout: float = 60, interval: float = 0.3, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={last!r}")


@pytest.fixture
def core(kube_api):
    from kubernetes import client
    return client.CoreV1Api(kube_api)


@pytest.fixture
def ns(k8s_namespace, core, running_node_agent) -> str:
    # pods need the namespace's default ServiceAccount (the real serviceaccount controller)
    wait_for(lambda: core.read_namespaced_service_account("default", k8s_namespace),
             30, what="default ServiceAccount")
    return k8s_namespace


def pod_dict(name: str, command: list[str] | None, **spec) -> dict:
    container = {"name": "main", "image": "ignored:latest"}
    if command is not None:
        container["command"] = command
    container.update(spec.pop("container", {}))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 10, **spec}}


def get_pod(core, ns: str, name: str) -> dict:
    return core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, ns))


def pod_ready(p: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])


def wait_pod(core, ns: str, name: str, pred, timeout: float = 60, what: str = "") -> dict:
    return wait_for(lambda: (lambda p: p if pred(p) else None)(get_pod(core, ns, name)),
                    timeout, what=what or f"pod {ns}/{name}")


def wait_gone(core, ns: str, name: str, uid: str | None = None, timeout: float = 60) -> None:
    from kubernetes.client.rest import ApiException

    def gone() -> bool:
        try:
            p = core.read_namespaced_pod(name, ns)
        except ApiException as e:
            return e.status == 404
        return uid is not None and p.metadata.uid != uid
    wait_for(gone, timeout, what=f"pod {ns}/{name} gone")


# --- (a) StatefulSet with a volumeClaimTemplate: pod recreated, same volume ----------------

STS_SCRIPT = textwrap.dedent("""
    import http.server, os, sys, threading, time
    d = sys.argv[1]
    name = os.environ["POD_NAME"]
    path = os.path.join(d, "log.txt")
    existing = open(path).read().count("\\n") if os.path.exists(path) else 0
    with open(path, "a") as f:
        f.write(f"{name} start existing={existing} ip={os.environ['POD_IP']}\\n")
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    srv = http.server.HTTPServer((os.environ["POD_IP"], 8080), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    n = 0
    while True:
        with open(path, "a") as f:
            f.write(f"{name} {n}\\n")
        n += 1
        time.sleep(0.2)
""")


def test_statefulset_pod_recreated_keeps_its_volume(ns, core, kube_api, control_plane, node_agent):
    from kubernetes import client
    apps = client.AppsV1Api(kube_api)
    core.create_namespaced_service(ns, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"port": 8080}]}})
    apps.create_namespaced_stateful_set(ns, {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web"},
        "spec": {
            "serviceName": "web", "replicas": 2, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"terminationGracePeriodSeconds": 5, "containers": [{
                    "name": "web", "image": "python:ignored",
                    "command": ["python", "-c", STS_SCRIPT, "/var/lib/web"],
                    "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib/web"}],
                }]},
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            }],
        }})

    def both_ready():
        sts = apps.read_namespaced_stateful_set("web", ns)
        return (sts.status.ready_replicas or 0) == 2
    wait_for(both_ready, 90, what="2 ready replicas")

    p0, p1 = get_pod(core, ns, "web-0"), get_pod(core, ns, "web-1")
    assert p0["status"]["podIP"] != p1["status"]["podIP"]  # both listen on :8080
    assert p0["spec"]["nodeName"] == node_agent.node_name
    pvc = core.read_namespaced_persistent_volume_claim("data-web-0", ns)
    assert pvc.status.phase == "Bound" and pvc.spec.storage_class_name == "local"

    log0 = node_agent.volume_dir(ns, "data-web-0") / "log.txt"
    log1 = node_agent.volume_dir(ns, "data-web-1") / "log.txt"
    wait_for(lambda: log0.exists() and "web-0 3\n" in log0.read_text(), 30, what="web-0 writing")
    assert "web-1" in log1.read_text() and "web-1" not in log0.read_text()

    control_plane.kubectl_run("delete", "pod", "web-0", "-n", ns, "--wait=true", timeout=60)
    before = log0.read_text()
    assert before.startswith("web-0 start existing=0")

    # the real StatefulSet controller recreates web-0 with a new uid on the same claim
    new = wait_pod(core, ns, "web-0", lambda p: p["metadata"]["uid"] != p0["metadata"]["uid"]
                   and pod_ready(p), 90, what="web-0 recreated and ready")
    assert new["status"]["containerStatuses"][0]["restartCount"] == 0
    wait_for(lambda: log0.read_text().count("web-0 0\n") == 2, 30, what="new process writing")
    after = log0.read_text()
    assert after.startswith(before)  # the data from before is there, the file grows
    restart_line = [ln for ln in after.splitlines() if "start existing=" in ln][1]
    assert int(restart_line.split("existing=")[1].split()[0]) >= before.count("\n")
    assert core.read_namespaced_persistent_volume_claim("data-web-0", ns).spec.volume_name == \
        pvc.spec.volume_name


# --- (b) env: downward API, ConfigMap/Secret refs, $(VAR) expansion ------------------------

def test_env_reaches_the_process(ns, core, node_agent):
    core.create_namespaced_config_map(ns, {"metadata": {"name": "cfg"}, "data": {"color": "blue", "size": "9"}})
    core.create_namespaced_secret(ns, {"metadata": {"name": "sec"}, "stringData": {"token": "s3cret"}})
    keys = ["MY_NAME", "MY_NS", "MY_UID", "MY_APP", "MY_NOTE", "MY_NODE", "MY_SA", "MY_IP", "MY_HOST_IP",
            "COLOR", "TOKEN", "size", "LITERAL", "POD_IP", "KUBECONFIG", "KUBERNETES_SERVICE_HOST"]
    script = f"import json, os, sys; print('ENV=' + json.dumps({{k: os.environ.get(k) for k in {keys!r}}})); " \
             "print('ARGV=' + json.dumps(sys.argv[1:]))"

    def fr(path):
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}
    body = pod_dict("envpod", ["python", "-c", script, "$(MY_NAME)-$(COLOR)"], restartPolicy="Never",
                    container={
                        "env": [
                            {"name": "MY_NAME", **fr("metadata.name")},
                            {"name": "MY_NS", **fr("metadata.namespace")},
                            {"name": "MY_UID", **fr("metadata.uid")},
                            {"name": "MY_APP", **fr("metadata.labels['app']")},
                            {"name": "MY_NOTE", **fr("metadata.annotations['note']")},
                            {"name": "MY_NODE", **fr("spec.nodeName")},
                            {"name": "MY_SA", **fr("spec.serviceAccountName")},
                            {"name": "MY_IP", **fr("status.podIP")},
                            {"name": "MY_HOST_IP", **fr("status.hostIP")},
                            {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "color"}}},
                            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
                            {"name": "LITERAL", "value": "x-$(MY_NAME)"},
                        ],
                        "envFrom": [{"configMapRef": {"name": "cfg"}}],
                    })
    body["metadata"]["labels"] = {"app": "envtest"}
    body["metadata"]["annotations"] = {"note": "hello world"}
    core.create_namespaced_pod(ns, body)
    p = wait_pod(core, ns, "envpod", lambda p: p["status"].get("phase") == "Succeeded", 60,
                 what="envpod Succeeded")
    out = node_agent.pod_logs(ns, "envpod")
    lines = {ln.split("=", 1)[0]: ln.split("=", 1)[1] for ln in out.splitlines() if ln.startswith(("ENV=", "ARGV="))}
    env, argv = json.loads(lines["ENV"]), json.loads(lines["ARGV"])
    assert env["MY_NAME"] == "envpod" and env["MY_NS"] == ns
    assert env["MY_UID"] == p["metadata"]["uid"]
    assert env["MY_APP"] == "envtest" and env["MY_NOTE"] == "hello world"
    assert env["MY_NODE"] == node_agent.node_name and env["MY_SA"] == "default"
    assert env["MY_IP"] == env["POD_IP"] == p["status"]["podIP"] and env["MY_IP"].startswith("127.1.")
    assert env["MY_HOST_IP"] == "127.0.0.1"
    assert env["COLOR"] == "blue" and env["size"] == "9" and env["TOKEN"] == "s3cret"
    assert env["LITERAL"] == "x-envpod"
    assert env["KUBECONFIG"] == str(node_agent.kubeconfig.resolve()) and env["KUBERNETES_SERVICE_HOST"]
    assert argv == ["envpod-blue"]
    assert p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


# --- (c) deletion: SIGTERM, grace, SIGKILL --------------------------------------------------

TRAP_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    marker = sys.argv[1]
    def on_term(*_):
        time.sleep(1)
        with open(os.path.join(marker, "marker"), "w") as f:
            f.write("graceful " + os.environ["POD_IP"])
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open(os.path.join(marker, "started"), "w").close()
    while True:
        time.sleep(0.1)
""")


def test_sigterm_grace_lets_the_process_finish(ns, core, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    core.create_namespaced_pod(ns, pod_dict(
        "trap", ["python", "-c", TRAP_SCRIPT, "/out"], volumes=[{"name": "o", "hostPath": {"path": str(out)}}],
        container={"volumeMounts": [{"name": "o", "mountPath": "/out"}]}))
    p = wait_pod(core, ns, "trap", pod_ready, 60, what="trap ready")
    wait_for(lambda: (out / "started").exists(), 30, what="handler installed")
    t0 = time.monotonic()
    core.delete_namespaced_pod("trap", ns)  # default grace: the pod's 10 s
    wait_gone(core, ns, "trap", timeout=30)
    took = time.monotonic() - t0
    assert (out / "marker").read_text() == "graceful " + p["status"]["podIP"]
    assert took < 8, f"the process exited after ~1 s, the agent waited {took:.1f}s"


def test_sigkill_after_grace(ns, core, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = ("import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "pathlib.Path(sys.argv[1], 'ignoring').touch()\nwhile True: time.sleep(1)")
    body = pod_dict("stubborn", ["python", "-c", script, "/out"], volumes=[{"name": "o", "hostPath": {"path": str(out)}}],
                    container={"volumeMounts": [{"name": "o", "mountPath": "/out"}]})
    body["spec"]["terminationGracePeriodSeconds"] = 2
    core.create_namespaced_pod(ns, body)
    wait_pod(core, ns, "stubborn", pod_ready, 60)
    # A SIGTERM before the handler is in place ends the process at once (CI saw it: ran 0.0 s).
    wait_for(lambda: (out / "ignoring").exists(), 30, what="SIGTERM ignored")
    t0 = time.monotonic()
    core.delete_namespaced_pod("stubborn", ns)
    wait_gone(core, ns, "stubborn", timeout=30)
    assert 1.5 < time.monotonic() - t0 < 15


# --- (d) restartPolicy ------------------------------------------------------------------------

def test_on_failure_restarts_and_counts(ns, core):
    core.create_namespaced_pod(ns, pod_dict(
        "crash", ["python", "-c", "import sys, time; time.sleep(0.3); sys.exit(1)"], restartPolicy="OnFailure"))
    p = wait_pod(core, ns, "crash", lambda p: (p["status"].get("containerStatuses") or [{}])[0]
                 .get("restartCount", 0) >= 2, 60, what="restartCount >= 2")
    cs = p["status"]["containerStatuses"][0]
    assert p["status"]["phase"] == "Running"
    assert cs["lastState"]["terminated"]["exitCode"] == 1


def test_on_failure_success_completes_and_never_fails(ns, core):
    core.create_namespaced_pod(ns, pod_dict("ok", ["python", "-c", "pass"], restartPolicy="OnFailure"))
    core.create_namespaced_pod(ns, pod_dict("bad", ["python", "-c", "raise SystemExit(3)"], restartPolicy="Never"))
    p = wait_pod(core, ns, "ok", lambda p: p["status"].get("phase") == "Succeeded", 60)
    assert p["status"]["containerStatuses"][0]["restartCount"] == 0
    p = wait_pod(core, ns, "bad", lambda p: p["status"].get("phase") == "Failed", 60)
    assert p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


def test_sigkill_of_the_process_restarts_it_in_place(ns, core, node_agent):
    core.create_namespaced_pod(ns, pod_dict("victim", ["python", "-c", "import time; time.sleep(3600)"]))
    p = wait_pod(core, ns, "victim", pod_ready, 60)
    pid = node_agent.kill_pod_process(ns, "victim", signal.SIGKILL)
    p2 = wait_pod(core, ns, "victim", lambda q: q["status"]["containerStatuses"][0]["restartCount"] == 1
                  and pod_ready(q), 30, what="restarted after SIGKILL")
    assert p2["metadata"]["uid"] == p["metadata"]["uid"]
    assert p2["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137
    assert node_agent.pod_pid(ns, "victim") not in (None, pid)


# --- (e) a pod without a command fails; the agent goes on ----------------------------------

def test_pod_without_command_fails_and_agent_keeps_serving(ns, core):
    core.create_namespaced_pod(ns, pod_dict("nocmd", None, container={"args": ["--only-args"]}))
    p = wait_pod(core, ns, "nocmd", lambda p: p["status"].get("phase") == "Failed", 60)
    assert p["status"]["reason"] == "NoCommand"
    assert "no command" in p["status"]["message"]
    core.create_namespaced_pod(ns, pod_dict("fine", ["python", "-c", "import time; time.sleep(3600)"]))
    wait_pod(core, ns, "fine", pod_ready, 60, what="a later pod runs")


# --- node registration and heartbeat -------------------------------------------------------

def test_node_is_ready_untainted_and_heartbeating(core, kube_api, running_node_agent):
    from kubernetes import client
    node = core.read_node(running_node_agent.node_name)
    ready = [c for c in node.status.conditions if c.type == "Ready"][0]
    assert ready.status == "True"
    assert node.status.allocatable == {"cpu": "16", "memory": "64Gi", "pods": "200",
                                       "ephemeral-storage": "100Gi"}
    assert not [t for t in node.spec.taints or [] if t.key.startswith("node.kubernetes.io/")]
    leases = client.CoordinationV1Api(kube_api)
    first = leases.read_namespaced_lease(running_node_agent.node_name, "kube-node-lease").spec.renew_time
    wait_for(lambda: leases.read_namespaced_lease(running_node_agent.node_name, "kube-node-lease")
             .spec.renew_time > first, 25, what="lease renewed")


# --- volumes: configMap files (refreshed), emptyDir; liveness; forced deletion -------------

def test_configmap_volume_is_materialised_and_refreshed(ns, core, node_agent):
    core.create_namespaced_config_map(ns, {"metadata": {"name": "app"}, "data": {"app.conf": "v1"}})
    script = textwrap.dedent("""
        import os, sys, time
        cfg, scratch = sys.argv[1], sys.argv[2]
        last = None
        while True:
            v = open(os.path.join(cfg, "app.conf")).read()
            if v != last:
                print("CONF=" + v, flush=True)
                open(os.path.join(scratch, "seen"), "a").write(v + "\\n")
                last = v
            time.sleep(0.2)
    """)
    core.create_namespaced_pod(ns, pod_dict(
        "cfgpod", ["python", "-c", script, "/etc/app", "/scratch"],
        volumes=[{"name": "cfg", "configMap": {"name": "app"}}, {"name": "tmp", "emptyDir": {}}],
        container={"volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"},
                                    {"name": "tmp", "mountPath": "/scratch"}]}))
    wait_pod(core, ns, "cfgpod", pod_ready, 60)
    wait_for(lambda: "CONF=v1" in node_agent.pod_logs(ns, "cfgpod"), 20, what="v1 read")
    core.patch_namespaced_config_map("app", ns, {"data": {"app.conf": "v2"}})
    wait_for(lambda: "CONF=v2" in node_agent.pod_logs(ns, "cfgpod"), 20, what="v2 read after refresh")
    seen = list(node_agent.pod_dir(ns, "cfgpod").glob("*/empty/tmp/seen"))
    assert len(seen) == 1 and seen[0].read_text() == "v1\nv2\n"
    core.delete_namespaced_pod("cfgpod", ns, grace_period_seconds=1)
    wait_gone(core, ns, "cfgpod")
    wait_for(lambda: not seen[0].exists(), 10, what="emptyDir removed with the pod")


def test_failing_liveness_probe_restarts_the_process(ns, core):
    core.create_namespaced_pod(ns, pod_dict(
        "sick", ["python", "-c", "import time; time.sleep(3600)"],
        container={"livenessProbe": {"tcpSocket": {"port": 1}, "periodSeconds": 1, "failureThreshold": 2}}))
    p = wait_pod(core, ns, "sick", lambda p: (p["status"].get("containerStatuses") or [{}])[0]
                 .get("restartCount", 0) >= 1, 60, what="restart after liveness failures")
    assert p["status"]["phase"] == "Running"


def test_force_deleted_pod_has_its_process_killed(ns, core, node_agent, control_plane):
    core.create_namespaced_pod(ns, pod_dict("forced", ["python", "-c", "import time; time.sleep(3600)"]))
    wait_pod(core, ns, "forced", pod_ready, 60)
    pid = node_agent.pod_pid(ns, "forced")
    assert pid is not None
    control_plane.kubectl_run("delete", "pod", "forced", "-n", ns, "--grace-period=0", "--force")

    def dead() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    wait_for(dead, 15, what="process killed")


# --- agent restart: processes die with the "node", pods are re-run in place ------------------

def test_agent_stop_kills_processes_and_restart_reruns_pods(ns, core, node_agent):
    core.create_namespaced_pod(ns, pod_dict("survivor", ["python", "-c", "import time; time.sleep(3600)"]))
    p = wait_pod(core, ns, "survivor", pod_ready, 60)
    pid = node_agent.pod_pid(ns, "survivor")
    node_agent.stop()
    try:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert get_pod(core, ns, "survivor")["metadata"]["uid"] == p["metadata"]["uid"]  # left alone
    finally:
        node_agent.start()
    p2 = wait_pod(core, ns, "survivor", lambda q: q["status"]["containerStatuses"][0]["restartCount"] == 1
                  and pod_ready(q), 60, what="re-run after agent restart")
    assert p2["status"]["podIP"] == p["status"]["podIP"]
    assert node_agent.pod_pid(ns, "survivor") not in (None, pid)
