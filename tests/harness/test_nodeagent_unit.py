"""Unit tests of the node agent's pure parts (no cluster needed)."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from localenv.nodeagent import (
    ContainerRuntime,
    IPAllocator,
    MountRewriter,
    PodConfigError,
    PodFatalError,
    ProbeState,
    build_argv,
    build_pod_status,
    expand_vars,
    field_ref_value,
    pv_for_claim,
    resolve_env,
    run_probe,
)

POD = {
    "metadata": {"name": "web-0", "namespace": "ns1", "uid": "u-123",
                 "labels": {"app": "web", "apps.kubernetes.io/pod-index": "0"},
                 "annotations": {"note": "hi there"}},
    "spec": {"nodeName": "node-a", "serviceAccountName": "sa1"},
    "status": {"podIP": "127.1.0.7", "podIPs": [{"ip": "127.1.0.7"}], "hostIP": "127.0.0.1"},
}


def test_expand_vars_follows_kubernetes_rules():
    env = {"A": "x", "B": "y"}
    assert expand_vars("$(A)/$(B)", env) == "x/y"
    assert expand_vars("$(MISSING)", env) == "$(MISSING)"
    assert expand_vars("$$(A)", env) == "$(A)"
    assert expand_vars("cost $5 $(A)", env) == "cost $5 x"


@pytest.mark.parametrize("path,value", [
    ("metadata.name", "web-0"), ("metadata.namespace", "ns1"), ("metadata.uid", "u-123"),
    ("metadata.labels['app']", "web"),
    ("metadata.labels['apps.kubernetes.io/pod-index']", "0"),
    ("metadata.annotations['note']", "hi there"), ("metadata.labels['nope']", ""),
    ("spec.nodeName", "node-a"), ("spec.serviceAccountName", "sa1"),
    ("status.podIP", "127.1.0.7"), ("status.hostIP", "127.0.0.1"), ("status.podIPs", "127.1.0.7"),
])
def test_field_ref_value(path, value):
    assert field_ref_value(POD, path) == value


def test_field_ref_unsupported_is_fatal():
    with pytest.raises(PodFatalError):
        field_ref_value(POD, "spec.bogus")


def _lookups(cms: dict, secrets: dict):
    return (lambda ns, n: cms.get((ns, n))), (lambda ns, n: secrets.get((ns, n)))


def test_resolve_env_sources_and_order():
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}}, {"secretRef": {"name": "s"}, "prefix": "S_"}],
        "env": [
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "GREETING", "value": "hello $(NAME) from $(FROM_CM)"},
            {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "FROM_CM"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "x", "optional": True}}},
            {"name": "FROM_CM", "value": "overridden"},
        ],
    }
    cm, sec = _lookups({("ns1", "cm"): {"FROM_CM": "cmval"}}, {("ns1", "s"): {"pw": "pa55"}})
    env, own = resolve_env(container, POD, {"PATH": "/bin"}, cm, sec)
    assert env["NAME"] == "web-0"
    assert env["GREETING"] == "hello web-0 from cmval"
    assert env["K"] == "cmval" and env["PW"] == "pa55" and env["S_pw"] == "pa55"
    assert env["FROM_CM"] == "overridden"
    assert "OPT" not in env and env["PATH"] == "/bin"
    assert own == {"FROM_CM", "S_pw", "NAME", "GREETING", "K", "PW"}


def test_resolve_env_missing_sources_are_config_errors():
    cm, sec = _lookups({("ns1", "cm"): {"a": "1"}}, {})
    with pytest.raises(PodConfigError, match="not found"):
        resolve_env({"envFrom": [{"secretRef": {"name": "x"}}]}, POD, {}, cm, sec)
    with pytest.raises(PodConfigError, match="key 'b'"):
        resolve_env({"env": [{"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "b"}}}]},
                    POD, {}, cm, sec)
    env, _ = resolve_env({"envFrom": [{"configMapRef": {"name": "x", "optional": True}}]}, POD, {}, cm, sec)
    assert env == {}


def test_mount_rewriter_prefix_rules():
    rw = MountRewriter({"/var/lib/eopipe": "/w/vol/a", "/var/lib/eopipe/cache": "/w/vol/b",
                        "/data": "/w/d", "/cfg/": "/w/c"})
    assert rw("/var/lib/eopipe") == "/w/vol/a"
    assert rw("/var/lib/eopipe/db") == "/w/vol/a/db"
    assert rw("/var/lib/eopipe/cache/x") == "/w/vol/b/x"  # longest first
    assert rw("--state-dir=/var/lib/eopipe/db") == "--state-dir=/w/vol/a/db"
    assert rw("a:/data:/data/x") == "a:/w/d:/w/d/x"
    assert rw("/database") == "/database"  # not a path prefix
    assert rw("/x/data") == "/x/data"  # not at the start of a path
    assert rw("/data.bak") == "/data.bak"
    assert rw("cat /cfg/app.yaml") == "cat /w/c/app.yaml"
    # one pass: a replacement is never rewritten again
    rw2 = MountRewriter({"/tmp": "/tmp/pytest/vol"})
    assert rw2("/tmp/x") == "/tmp/pytest/vol/x"
    assert MountRewriter({})("/data") == "/data"


def test_build_argv_expands_then_rewrites_and_requires_command():
    c = {"name": "w", "command": ["python", "-m", "x"], "args": ["--dir", "/data/$(SUB)", "$(POD)"]}
    argv = build_argv(c, {"SUB": "s1", "POD": "p"}, MountRewriter({"/data": "/local"}))
    assert argv == ["python", "-m", "x", "--dir", "/local/s1", "p"]
    with pytest.raises(PodFatalError) as ei:
        build_argv({"name": "w", "args": ["x"]}, {}, lambda s: s)
    assert ei.value.reason == "NoCommand"


def test_build_pod_status_running_ready_and_transition_times_are_kept():
    c = ContainerRuntime(name="w", image="img", state="running", reason="", started_at=1000.0,
                         restart_count=2, ready=True, started=True, pid=42)
    st = build_pod_status(phase="Running", c=c, pod_ip="127.1.0.9", host_ip="127.0.0.1",
                          start_time="2020-01-01T00:00:00Z",
                          old_conditions=[{"type": "PodScheduled", "status": "True",
                                           "lastTransitionTime": "T0"},
                                          {"type": "DisruptionTarget", "status": "False"}],
                          now="T1")
    conds = {x["type"]: x for x in st["conditions"]}
    assert conds["Ready"]["status"] == "True" and conds["ContainersReady"]["status"] == "True"
    assert conds["PodScheduled"]["lastTransitionTime"] == "T0"
    assert conds["Ready"]["lastTransitionTime"] == "T1"
    assert "DisruptionTarget" in conds
    cs = st["containerStatuses"][0]
    assert cs["ready"] and cs["restartCount"] == 2 and cs["containerID"] == "eopipe://42"
    assert cs["state"]["running"]["startedAt"] and cs["state"]["terminated"] is None
    assert st["podIP"] == "127.1.0.9" and st["podIPs"] == [{"ip": "127.1.0.9"}]
    # same status later: the Ready transition time stays
    st2 = build_pod_status(phase="Running", c=c, pod_ip="127.1.0.9", host_ip="127.0.0.1",
                           start_time="2020-01-01T00:00:00Z", old_conditions=st["conditions"], now="T2")
    assert {x["type"]: x for x in st2["conditions"]}["Ready"]["lastTransitionTime"] == "T1"
    assert st2 == st


def test_build_pod_status_not_ready_and_terminated():
    c = ContainerRuntime(name="w", state="running", started_at=1.0, ready=False)
    st = build_pod_status(phase="Running", c=c, pod_ip="127.1.0.9", host_ip="127.0.0.1",
                          start_time="s", old_conditions=None, now="T")
    ready = {x["type"]: x for x in st["conditions"]}["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "ContainersNotReady"
    c = ContainerRuntime(name="w", state="terminated", reason="NoCommand", message="m", exit_code=128,
                         finished_at=5.0)
    st = build_pod_status(phase="Failed", c=c, pod_ip="127.1.0.9", host_ip="127.0.0.1",
                          start_time="s", old_conditions=None, now="T", reason="NoCommand", message="m")
    assert st["phase"] == "Failed" and st["reason"] == "NoCommand"
    term = st["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 128 and term["reason"] == "NoCommand"
    assert st["containerStatuses"][0]["state"]["running"] is None


def test_pv_for_claim():
    pvc = {"metadata": {"name": "data-web-0", "namespace": "ns1", "uid": "abc"},
           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                    "resources": {"requests": {"storage": "2Gi"}}}}
    pv = pv_for_claim(pvc, "/w/volumes/ns1/data-web-0")
    assert pv["metadata"]["name"] == "pvc-abc"
    s = pv["spec"]
    assert s["capacity"] == {"storage": "2Gi"} and s["storageClassName"] == "local"
    assert s["claimRef"]["uid"] == "abc" and s["claimRef"]["name"] == "data-web-0"
    assert s["persistentVolumeReclaimPolicy"] == "Retain"
    assert s["hostPath"]["path"] == "/w/volumes/ns1/data-web-0"
    pvc["spec"].pop("storageClassName")
    assert pv_for_claim(pvc, "/x")["spec"]["storageClassName"] == ""


@pytest.mark.parametrize("klass, provisioned", [("local", True), (None, True), ("", False)])
def test_the_provisioner_leaves_a_claim_with_no_class_to_a_volume_made_by_hand(tmp_path, klass, provisioned):
    from localenv.nodeagent.volumes import Provisioner

    made = []

    class Kube:
        def create(self, path, body):
            made.append(body["metadata"]["name"])
            return True

    spec = {"accessModes": ["ReadWriteOnce"]} | ({} if klass is None else {"storageClassName": klass})
    Provisioner(Kube(), tmp_path).on_pvc({"metadata": {"name": "state-p-0", "namespace": "ns", "uid": "u1"},
                                          "spec": spec, "status": {"phase": "Pending"}})
    assert made == (["pvc-u1"] if provisioned else [])


def test_probe_state_thresholds():
    p = ProbeState({"periodSeconds": 1, "failureThreshold": 2, "initialDelaySeconds": 5}, "readiness", 100.0)
    assert not p.result and not p.due(104.0) and p.due(105.0)
    assert p.record(True, "", 105.0) and p.result
    assert not p.record(False, "", 106.0) and p.result  # one failure is tolerated
    assert p.record(False, "", 107.0) and not p.result
    live = ProbeState({"failureThreshold": 1}, "liveness", 0.0)
    assert live.result
    assert ProbeState(None, "readiness", 0.0).result and ProbeState(None, "startup", 0.0).result


def test_ip_allocator_unique_and_reserve():
    a = IPAllocator()
    ips = {a.allocate() for _ in range(600)}
    assert len(ips) == 600 and all(ip.startswith("127.1.") for ip in ips)
    assert not any(ip.endswith((".0", ".255")) for ip in ips)
    assert not a.reserve(next(iter(ips)))  # in use
    assert a.reserve("127.1.200.3") and not a.reserve("10.0.0.1")


def test_ip_allocator_starts_at_its_offset_and_wraps():
    # An agent starts at a random offset: two test sessions' agents rarely hand out one address.
    assert IPAllocator(offset=0).allocate() == "127.1.0.2"
    assert IPAllocator(offset=254).allocate() == "127.1.1.1"  # 127.1.1.0 skipped
    a = IPAllocator(offset=65532)  # the last address of the range, then the first
    assert [a.allocate(), a.allocate()] == ["127.1.255.254", "127.1.0.2"]


def test_run_probe_http_and_tcp_on_pod_loopback_address():
    ip = "127.1.250.17"

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/ready" else 503)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer((ip, 0), H)
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        container = {"ports": [{"name": "http", "containerPort": port}]}
        kw = dict(pod_ip=ip, container=container, env={}, cwd="/", rewrite=lambda s: s)
        assert run_probe({"httpGet": {"path": "/ready", "port": "http"}}, **kw)[0]
        assert not run_probe({"httpGet": {"path": "/nope", "port": port}}, **kw)[0]
        assert run_probe({"tcpSocket": {"port": port}}, **kw)[0]
        # the same port on another pod's address is not listening
        assert not run_probe({"tcpSocket": {"port": port}}, **dict(kw, pod_ip="127.1.250.18"))[0]
        assert run_probe({"exec": {"command": ["true"]}}, **kw)[0]
        assert not run_probe({"exec": {"command": ["false"]}}, **kw)[0]
    finally:
        srv.shutdown()
        srv.server_close()


def test_loopback_addresses_allow_same_port_twice():
    a, b = socket.socket(), socket.socket()
    try:
        a.bind(("127.1.251.1", 0))
        port = a.getsockname()[1]
        b.bind(("127.1.251.2", port))
    finally:
        a.close()
        b.close()


def test_informer_relists_after_watch_expiry_and_errors():
    from localenv.nodeagent import WatchExpired, informer

    stop = threading.Event()
    calls = {"list": 0, "watch": []}

    class FakeKube:
        def request(self, method, path, query=None):
            calls["list"] += 1
            if calls["list"] == 2:
                raise ConnectionError("apiserver restarting")
            return {"metadata": {"resourceVersion": str(10 * calls["list"])},
                    "items": [{"metadata": {"name": f"l{calls['list']}"}}]}

        def watch(self, path, query):
            calls["watch"].append(query["resourceVersion"])
            if len(calls["watch"]) == 1:
                yield {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "11"}}}
                yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}}
                return  # server-side timeout: re-watch from the last resourceVersion
            if len(calls["watch"]) == 2:
                raise WatchExpired("410 Gone")
            yield {"type": "DELETED", "object": {"metadata": {"name": "b", "resourceVersion": "31"}}}
            stop.set()

    listed, events = [], []
    informer(FakeKube(), "/x", {}, lambda items: listed.append([i["metadata"]["name"] for i in items]),
             lambda t, o: events.append((t, o["metadata"]["name"])), stop, "fake")
    assert listed == [["l1"], ["l3"]]  # the failed second list was retried
    assert calls["watch"] == ["10", "12", "30"]
    assert events == [("ADDED", "a"), ("DELETED", "b")]


def test_pod_network_per_node():
    from localenv.nodeagent import pod_network_for
    assert str(pod_network_for("eopipe-node-0")) == "127.1.0.0/16"
    assert str(pod_network_for("eopipe-node-2")) == "127.3.0.0/16"
    assert str(pod_network_for("worker")) == "127.1.0.0/16"
