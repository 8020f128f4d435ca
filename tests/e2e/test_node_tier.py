"""The node tier end to end: `python -m localenv.node up` (what `make cluster` runs) brings up a
kubelet and containerd in the tier's network namespace; a pod from the image built from the
project's Dockerfile runs there; the operator installed by Helm runs examples/minimal.yaml,
examples/payments.yaml (Spark on pods) and examples/file-sink.yaml (Parquet on a shared claim)
exactly once under pod faults, scaling and partition growth; `down` leaves nothing of the tier
on the host."""

from __future__ import annotations

import base64
import ipaddress
import json
import secrets
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from eopipe.control.builders import access as access_builders
from eopipe.control.builders import dedup as dedup_builders
from eopipe.control.builders.spark import RESTART_POLICY, spark_version
from eopipe.core.kafkaconf import OPT_IN
from eopipe.core.names import LABEL_PIPELINE, Names, deduped_topic, dlq_topic, spark_commit_topic
from eopipe.core.processing import DEFAULT_MOUNT_PATH as MOUNT_PATH
from eopipe.core.spec import PipelineSpec
from localenv import REPO_ROOT
from localenv.node import NETNS, NETPOL_STATUS, running_nodes
from localenv.node.__main__ import kill_container, kubectl_argv
from localenv.node.host import shim_sockets
from localenv.node import objectstore as node_objectstore
from tests.helpers import nodetier
from tests.helpers.docs import sh_blocks
from tests.helpers.manifests import differences
from tests.helpers.podsecurity import RESTRICTED_LABELS
from tests.helpers.nodepipes import (
    delete_spark_pipeline,
    delete_topics,
    driver_says,
    helm_bin,
    install_operator,
    settled,
    start_load,
    verify_both_stages,
)
from tests.helpers.nodestore import (
    backup_to,
    delete_object_store,
    object_store_pod,
    s3_keys,
    s3_secret,
    s3a_checkpoint,
    store_url,
)
from tests.helpers.nodetier import (
    NODE_TESTS,
    BOOTSTRAP,
    EOPIPE,
    eopipe,
    in_tier,
    kubectl,
    kubectl_json,
    log,
    node_cmd,
    sysctls,
    shell_env,
    tag_image,
    tcp_probe,
    topics,
    wait,
)
from tests.helpers.sparkfiles import checkpoint_offsets, parse_rows, reader_script

pytestmark = NODE_TESTS


# The version, then the apiserver through the `kubernetes` Service (kube-proxy's rules).
POD_SCRIPT = ("eopipe --version && python -c \"import socket; "
              "socket.create_connection(('10.0.0.1', 443), 5); print('service ok')\" && exec sleep 3600")


def test_pod_from_the_project_image_runs_on_the_kubelet(node_tier):
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "eopipe-version", "namespace": "default"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "eopipe", "image": node_tier["app"], "imagePullPolicy": "Never",
            "command": ["sh", "-c", POD_SCRIPT]}]},
    }
    res = subprocess.run([sys.executable, "-m", "localenv.node", "kubectl", "apply", "-f", "-"], check=False,
                         cwd=REPO_ROOT,
                         input=json.dumps(pod), text=True, capture_output=True)
    assert res.returncode == 0, res.stderr
    deadline = time.monotonic() + 120
    while json.loads(kubectl("get", "pod", "eopipe-version", "-o", "json"))["status"].get("phase") != "Running":
        assert time.monotonic() < deadline, kubectl("describe", "pod", "eopipe-version")
        time.sleep(1)
    wide = kubectl("get", "pods", "-o", "wide")
    log(f"kubectl get pods -o wide\n{wide}")
    row = next(ln.split() for ln in wide.splitlines() if ln.startswith("eopipe-version "))
    header = wide.splitlines()[0].split()
    ip, node = row[header.index("IP")], row[header.index("NODE")]
    # Its address is from the /24 of the node it runs on.
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(
        next(n.pod_cidr for n in running_nodes() if n.name == node)), (ip, node)
    deadline = time.monotonic() + 30
    while "service ok" not in (logs := kubectl("logs", "eopipe-version")):
        assert time.monotonic() < deadline, logs
        time.sleep(1)
    assert logs.startswith("eopipe "), logs  # eopipe --version ran in the image
    # kube-proxy's rules are in the namespace's tables, none in the host's.
    inside = subprocess.run(["ip", "netns", "exec", NETNS, "iptables-save"], check=False,
                            capture_output=True, text=True).stdout
    assert "KUBE-SERVICES" in inside
    assert json.loads(node_cmd("leftovers").stdout)["iptables"] == []
    # The pod's shim socket: at a fixed host path; the teardown test checks it is gone.
    node_tier["shim_sockets"] = shim_sockets()
    assert node_tier["shim_sockets"], "no shim socket found for the running pod"


def test_install_doc_helm_path_in_restricted_namespaces(node_tier):
    """docs/install.md's Helm section, every command in the doc's order: namespaces that enforce
    the restricted Pod Security Standard, helm install, a first pipeline (examples/minimal.yaml),
    the upgrade, the uninstall. `<registry>` is the tier's: its images, built from the
    Dockerfile's targets, also carry the chart's default tag, as the doc's `docker build -t`
    gives. Between the blocks: a privileged pod is refused in the watched namespace, the
    operator reconciles as its ServiceAccount with nothing refused, the pipeline deduplicates a
    load exactly once, and `eopipe render` prints what the chart's operator applied."""
    install, first, upgrade, uninstall = sh_blocks("install.md", "## Helm")
    version = yaml.safe_load((REPO_ROOT / "charts" / "eopipe" / "Chart.yaml").read_text())["appVersion"]
    for role, repo in (("app", "localhost/eopipe"), ("spark", "localhost/eopipe-spark")):
        assert node_tier[role].startswith(f"{repo}:"), node_tier[role]
        tag_image(node_tier[role], f"{repo}:{version}")
    env = shell_env(helm_bin())

    def run(commands: list[str]) -> dict[str, str]:
        outs = {}
        for command in commands:
            t = time.monotonic()
            res = subprocess.run(in_tier("bash", "-o", "pipefail", "-c", command.replace("<registry>", "localhost")),
                                 cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)
            log(f"$ {command}  ({time.monotonic() - t:.0f}s)\n{res.stdout}{res.stderr}")
            assert res.returncode == 0, f"docs/install.md: `{command}` failed ({res.returncode})"
            outs[command] = res.stdout
        return outs

    ns, name = "pipelines", "minimal"
    run(install)
    privileged = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged", "namespace": ns},
                  "spec": {"containers": [{"name": "c", "image": node_tier["app"],
                                           "securityContext": {"privileged": True}}]}}
    refused = nodetier.run(kubectl_argv("apply", "--dry-run=server", "-f", "-"), input=json.dumps(privileged))
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused
    table = run(first)[f"kubectl get eop -n {ns}"].splitlines()
    assert table[1].split()[:3] == [name, "Running", "True"], table
    load = eopipe("load", "--bootstrap", BOOTSTRAP, "--topic", "events", "--count", "4000", "--rate", "1000",
                  "--dup-ratio", "0.3", "--poison", "5", "--seed", "13", "--quiet", "--json")
    assert load.returncode == 0, load.stderr
    res = eopipe("verify", "--bootstrap", BOOTSTRAP, "--source", "events", "--output", f"{ns}.{name}.deduped",
                 "--dlq", f"{ns}.{name}.dlq", "--json", "--timeout", "300")
    log(f"eopipe verify: {res.stdout}{res.stderr}")
    rep = json.loads(res.stdout)
    assert res.returncode == 0 and rep["unique_in"] == json.loads(load.stdout)["unique"], rep
    leader = kubectl("-n", "eopipe-system", "get", "lease", "eopipe-leader", "-o", "jsonpath={.spec.holderIdentity}")
    logs = kubectl("-n", "eopipe-system", "logs", leader)
    assert "Forbidden" not in logs and " 403" not in logs, logs[-4000:]
    ip = kubectl("-n", "eopipe-system", "get", "pod", leader, "-o", "jsonpath={.status.podIP}")
    metrics = nodetier.python(f"import urllib.request; print(urllib.request.urlopen('http://{ip}:9090/metrics', "
                              "timeout=10).read().decode())")
    assert f'eopipe_operator_pipeline_ready{{name="{name}",namespace="{ns}"}} 1.0' in metrics
    _render_is_what_the_chart_applied(ns, REPO_ROOT / "examples" / "minimal.yaml",
                                      {role: f"localhost/{repo}:{version}"
                                       for role, repo in (("app", "eopipe"), ("spark", "eopipe-spark"))})
    run(upgrade)
    kubectl("-n", "eopipe-system", "rollout", "status", "deployment/eopipe", "--timeout=180s")
    wait(lambda: settled(ns, name), 180, "the pipeline Ready after the upgrade")
    run(uninstall)
    wait(lambda: not kubectl("-n", "eopipe-system", "get", "pods", "-o", "name"), 120, "the operator's pods gone")
    # The next test starts from no topics, as on a fresh cluster.
    nodetier.python("from confluent_kafka.admin import AdminClient\n"
                    f"a = AdminClient({{'bootstrap.servers': '{BOOTSTRAP}'}})\n"
                    f"[f.result(30) for f in a.delete_topics(['events', '{ns}.{name}.deduped', '{ns}.{name}.dlq'])"
                    ".values()]")
    wait(lambda: "events" not in topics(), 60, "the topics deleted")


def _render_is_what_the_chart_applied(ns: str, manifest: Path, images: dict) -> None:
    """`eopipe render` with the release, images and broker count of this install prints what the
    chart's operator applied, with the chart's defaults (its NetworkPolicy, the token Secret, the
    driver ClusterRole's name): every field render sets has that value in the live object.
    The token Secret's data aside: render's is a placeholder, the operator's is random."""
    res = subprocess.run([sys.executable, "-m", "eopipe.tools.cli", "render", str(manifest),
                          "--namespace", ns, "--release", "eopipe", "--operator-namespace", "eopipe-system",
                          "--image", images["app"], "--spark-image", images["spark"], "--brokers", "1"],
                         capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert res.returncode == 0, res.stderr
    *rendered, kafka_topics = [d for d in yaml.safe_load_all(res.stdout) if d]
    assert kafka_topics["kind"] == "KafkaTopics"
    assert {"NetworkPolicy", "Secret", "StatefulSet"} <= {d["kind"] for d in rendered}
    for want in rendered:
        group, _, version = want["apiVersion"].rpartition("/")
        resource = ".".join(filter(None, (want["kind"].lower(), version if group else "", group)))
        live = kubectl_json("-n", ns, "get", f"{resource}/{want['metadata']['name']}")
        if want["kind"] == "Secret":
            want = {k: v for k, v in want.items() if k != "data"}
        assert not list(differences(want, live)), f"{resource}: {list(differences(want, live))}"
    log(f"eopipe render = what the chart's operator applied: {len(rendered)} objects")


def _spark_app(ns: str, name: str) -> dict:
    return kubectl_json("-n", ns, "get", "sparkapplication", name).get("status") or {}


def _restricted_namespace(ns: str) -> None:
    """A namespace enforcing the restricted Pod Security Standard, as docs/install.md has the
    watched ones: the real Spark driver and executor pods (and the dedup pods) are admitted there."""
    kubectl("create", "namespace", ns)
    kubectl("label", "namespace", ns, *(f"{k}={v}" for k, v in RESTRICTED_LABELS.items()))


def _start_spark_example(ns: str, name: str, example: str, patch: dict | None = None,
                         first: tuple[dict, ...] = ()) -> None:
    """examples/<example> applied as written (with `patch` merged in) in a new namespace, after
    the objects `first`, until Ready with its Spark driver RUNNING and an executor pod Running."""
    _restricted_namespace(ns)
    for obj in first:
        kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(obj))
    doc = yaml.safe_load((REPO_ROOT / "examples" / example).read_text())
    kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(_merged(doc, patch or {})))
    t = time.monotonic()
    wait(lambda: settled(ns, name) and _spark_app(ns, f"{name}-spark").get("applicationState", {}).get("state")
         == "RUNNING", 400, f"{name} Ready with its Spark driver RUNNING")
    log(f"{name} Ready, Spark driver RUNNING in {time.monotonic() - t:.0f}s")
    log(f"kubectl get pods,pvc -o wide\n{kubectl('-n', ns, 'get', 'pods,pvc', '-o', 'wide')}")
    _submitted_once(ns, name)
    _spark_pods_keep_the_spec(ns, name)


def _spark_pods_keep_the_spec(ns: str, name: str) -> None:
    """Once an executor pod runs: what the SparkApplication's pod templates ask of its pods is on
    the pods the Kubeflow Spark Operator and Spark made, with its webhook on or off: the
    checkpoint claim mounted in the driver (and in the executors when the claim is
    ReadWriteMany), once, the restricted security contexts, the operator's Kafka env. A dropped
    checkpoint volume would make a replaced driver replay and duplicate."""
    wait(lambda: "Running" in kubectl("-n", ns, "get", "pods", "-l", "spark-role=executor",
                                      "-o", "jsonpath={.items[*].status.phase}"), 180, "a Spark executor pod Running")
    app = kubectl_json("-n", ns, "get", "sparkapplication", f"{name}-spark")["spec"]
    claim = next(v["persistentVolumeClaim"]["claimName"] for v in app["driver"]["template"]["spec"]["volumes"])
    for role in ("driver", "executor"):
        want = app[role]["template"]["spec"]
        want_c = want["containers"][0]
        pods = kubectl_json("-n", ns, "get", "pods", "-l", f"spark-role={role}")["items"]
        assert pods, role
        for pod in pods:
            spec = pod["spec"]
            c = next(c for c in spec["containers"] if c["name"] == want_c["name"])
            names = [v["name"] for v in spec.get("volumes") or []]
            assert len(names) == len(set(names)), (role, names)  # nothing added twice
            vols = {v["name"]: v for v in spec.get("volumes") or []}
            for m in want_c.get("volumeMounts") or []:
                assert vols.get(m["name"], {}).get("persistentVolumeClaim", {}).get("claimName") == claim, (role, vols)
                assert {"name": m["name"], "mountPath": m["mountPath"]}.items() <= next(
                    x for x in c.get("volumeMounts") or [] if x["name"] == m["name"]).items(), c.get("volumeMounts")
            assert want["securityContext"].items() <= (spec.get("securityContext") or {}).items(), (role, spec)
            assert want_c["securityContext"].items() <= (c.get("securityContext") or {}).items(), (role, c)
            env = {e["name"] for e in c.get("env") or []}
            assert {e["name"] for e in want_c.get("env") or []} <= env, (role, sorted(env))
    log(f"{name}: the driver and executor pods carry the checkpoint claim {claim}, the restricted "
        "security contexts and the env the SparkApplication's pod templates ask for")


def _events(ns: str, name: str) -> Counter:
    """The reasons of the events of the SparkApplication `<name>-spark` (this object: by uid)."""
    uid = kubectl_json("-n", ns, "get", "sparkapplication", f"{name}-spark")["metadata"]["uid"]
    events = kubectl_json("-n", ns, "get", "events", "--field-selector", f"involvedObject.uid={uid}")["items"]
    return Counter(e["reason"] for e in events for _ in range(e.get("count") or 1))


def _submitted_once(ns: str, name: str, before: Counter | None = None) -> None:
    """The Spark Operator submitted the application once (since the events `before`, when its
    spec changed and it runs again): one submission attempt, one more SparkApplicationSubmitted
    event and no SparkApplicationSubmissionFailed (a write by eopipe between its read and its
    status write made v2.5.2 submit again and fail on the existing driver pod:
    control/sparkwrites.py)."""
    st = _spark_app(ns, f"{name}-spark")
    reasons = _events(ns, name)
    reasons.subtract(before or Counter())
    log(f"{name}-spark: submissionAttempts {st.get('submissionAttempts')}, executionAttempts "
        f"{st.get('executionAttempts')}, events {dict(+reasons)}")
    assert (st.get("submissionAttempts"), st.get("executionAttempts")) == (1, 1), st
    assert reasons["SparkApplicationSubmitted"] == 1 and reasons["SparkApplicationSubmissionFailed"] <= 0, reasons


def _kill_driver(ns: str, name: str) -> None:
    """SIGKILL to the driver's container under the kubelet, then until the Spark Operator's retry
    (one more execution attempt) has the streaming query running again (RUNNING is only its pod:
    on two busy cores its executor and query start a minute or more later, longer than a
    verify's settle time)."""
    before = _spark_app(ns, f"{name}-spark").get("executionAttempts", 0)
    log(f"killed the Spark driver's container under the kubelet: {kill_container(ns, f'{name}-spark-driver')[:12]}")
    t = time.monotonic()
    wait(lambda: (st := _spark_app(ns, f"{name}-spark")).get("executionAttempts", 0) > before
         and st.get("applicationState", {}).get("state") == "RUNNING", 300, "the driver resubmitted and RUNNING")
    wait(lambda: "streaming query running" in kubectl("-n", ns, "logs", f"{name}-spark-driver", check=False), 300,
         "the resubmitted driver's streaming query running", interval=3)
    log(f"driver resubmitted (attempt {before + 1}), its query running again in {time.monotonic() - t:.0f}s")


def _driver_token_makes_only_executors(ns: str, name: str) -> None:
    """The chart's driver policy on the real install (docs/security.md#the-spark-drivers-token):
    the real executors ran under it, a running executor's pod made again with the driver's token
    is admitted, and the same pod mounting a Secret is refused (the admin may make it: the
    policy, not the namespace's Pod Security level, refused it)."""
    live = kubectl_json("-n", ns, "get", "pods", "-l", f"spark-role=executor,{LABEL_PIPELINE}={name}")["items"][0]
    # As Spark sends it: not yet scheduled.
    spec = {k: v for k, v in live["spec"].items() if k != "nodeName"}
    pod = {"apiVersion": "v1", "kind": "Pod", "spec": spec,
           "metadata": {"name": f"{live['metadata']['name']}-again", "labels": live["metadata"]["labels"]}}
    admin = ("-n", ns, "create", "--dry-run=server", "-f", "-")
    as_driver = (*admin, f"--as=system:serviceaccount:{ns}:{name}-spark")
    kubectl(*as_driver, input=json.dumps(pod))
    pod["spec"]["volumes"].append({"name": "admin-secret", "secret": {"secretName": "db-root"}})
    res = nodetier.run(kubectl_argv(*as_driver), input=json.dumps(pod))
    assert res.returncode != 0 and "may not mount volume admin-secret" in res.stderr, res.stderr
    kubectl(*admin, input=json.dumps(pod))
    log(f"the driver's token: {live['metadata']['name']} made again admitted, with a Secret volume refused")


def _jvms_share_classes(ns: str, name: str) -> None:
    """The driver's and each running executor's JVM map the image's class data sharing archive
    (hack/spark/entrypoint.sh): it holds for the class path they run with on the node's
    filesystem, not only the build's."""
    executors = kubectl("-n", ns, "get", "pods", "-l", "spark-role=executor", "--field-selector=status.phase=Running",
                        "-o", "jsonpath={.items[*].metadata.name}").split()
    assert executors, "no executor pod running"
    for pod in [f"{name}-spark-driver", *executors]:
        wait(lambda pod=pod: "/maps" in kubectl("-n", ns, "exec", pod, "--", "sh", "-c",
                                                "grep -l /opt/eopipe/spark.jsa /proc/[0-9]*/maps", check=False),
             30, f"a JVM of {pod} mapping the archive", interval=2)
        assert "Unable to use shared archive" not in kubectl("-n", ns, "logs", pod, check=False), pod
    log(f"the JVMs of {name}-spark-driver and {executors} map the class data sharing archive")


@pytest.fixture(scope="module")
def object_store(node_tier):
    """The SeaweedFS pod, for the tests of this module that back up; deleted after the last (if
    the tier is still up: the module's last test takes it down)."""
    yield object_store_pod()
    delete_object_store()


def _worker_log(ns: str, pod: str, msg: str) -> dict[int, dict]:
    """The worker's JSON log lines `msg` by partition, the last of each."""
    out = {}
    for line in kubectl("-n", ns, "logs", pod, check=False).splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("msg") == msg:
            out[doc["partition"]] = doc
    return out


def _lose_state(ns: str, pod: str) -> None:
    """The pod's claim and the pod deleted, as a lost volume is replaced by hand: the claim first
    (it goes once no pod uses it), then the pod (grace 0, forced). A replacement pod created while
    the old claim was still terminating cannot be scheduled on it: deleted again, as a user would,
    until the StatefulSet's pod runs on a new claim."""
    claim = next(v["persistentVolumeClaim"]["claimName"] for v in kubectl_json("-n", ns, "get", "pod", pod)["spec"]
                 ["volumes"] if "persistentVolumeClaim" in v)
    uid = kubectl_json("-n", ns, "get", "pvc", claim)["metadata"]["uid"]
    kubectl("-n", ns, "delete", "pvc", claim, "--wait=false")
    kubectl("-n", ns, "delete", "pod", pod, "--grace-period=0", "--force")
    log(f"deleted claim {claim} and pod {pod} (--grace-period=0 --force)")
    t = time.monotonic()

    def replaced() -> bool:
        pvc = json.loads(kubectl("-n", ns, "get", "pvc", claim, "-o", "json", "--ignore-not-found", check=False)
                         or "{}")
        new = pvc.get("metadata", {}).get("uid") not in (None, uid)
        if new and pvc["status"].get("phase") == "Bound":
            return True
        p = json.loads(kubectl("-n", ns, "get", "pod", pod, "-o", "json", "--ignore-not-found", check=False) or "{}")
        if not new and p and p["status"].get("phase") == "Pending" and not p["spec"].get("nodeName"):
            kubectl("-n", ns, "delete", "pod", pod, "--wait=false", check=False)
            log(f"{pod} Pending on the deleted claim: deleted again")
        return False
    wait(replaced, 180, f"{pod} on a new claim {claim}", interval=3)
    log(f"{pod} on a new claim {claim} in {time.monotonic() - t:.0f}s")


def _pipeline_events(ns: str, name: str, reason: str) -> list[str]:
    uid = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name)["metadata"]["uid"]
    items = kubectl_json("-n", ns, "get", "events", "--field-selector", f"involvedObject.uid={uid}")["items"]
    return [e["message"] for e in items if e["reason"] == reason]


def test_file_sink_on_a_shared_claim_exactly_once(node_tier, object_store):
    """examples/file-sink.yaml as written: clicks deduplicated by a header, selected by SQL with
    the example's schema, written as Parquet by the driver and two executors onto one
    ReadWriteMany claim (the tier's `shared` class). Its dedup state backed up to SeaweedFS run as
    a pod (spec.dedup.backup, credentials from a Secret). Under resends a dedup pod's claim and
    the pod are deleted: its partitions are restored from the object store's snapshots and
    replayed from their offsets, not rebuilt (the worker's log and a StateRestored event say
    so); the driver's container is killed mid-stream (resubmitted from the checkpoint on that
    claim); then the Parquet rows, read through Spark's reader (which honours _spark_metadata),
    are every click with a page, each exactly once. The Spark Operator's webhook is off
    (`webhook.enable=false`) throughout: the pods carry the claim, the security contexts and the
    env all the same, from the pod templates Spark applies itself (the lifecycle test checks them
    with it on)."""
    _install_operator_if_absent(node_tier)
    _spark_webhook(False)
    try:
        _file_sink_exactly_once(node_tier, object_store)
    finally:
        _spark_webhook(True)


def _file_sink_exactly_once(node_tier: dict, object_store) -> None:
    ns, name = "clicks", "clicks"
    example = yaml.safe_load((REPO_ROOT / "examples" / "file-sink.yaml").read_text())
    secret = s3_secret("clicks-s3", name, object_store)
    _start_spark_example(ns, name, "file-sink.yaml", backup_to(name, "clicks-s3"), first=(secret,))
    _jvms_share_classes(ns, name)
    _driver_token_makes_only_executors(ns, name)
    pvc = kubectl_json("-n", ns, "get", "pvc", f"{name}-spark-checkpoint")
    assert pvc["status"]["accessModes"] == ["ReadWriteMany"], pvc["status"]
    pv = kubectl_json("get", "pv", pvc["spec"]["volumeName"])["spec"]
    # The claim's directory on the shared file system (polled here; the rows are read in a pod).
    root = Path((pv.get("hostPath") or pv["local"])["path"])
    out = root / Path(example["spec"]["sink"]["files"]["path"]).relative_to(MOUNT_PATH)

    load = subprocess.Popen(in_tier(nodetier.PY, "-m", "tests.helpers.clicks", BOOTSTRAP, "clicks", "9000", "300",
                                    "16"), cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # A lost volume under load: once each partition of the pod has a snapshot of some clicks.
    pod = f"{name}-dedup-1"
    owned = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name)["status"]["assignment"][pod]
    taken = wait(lambda: (up := _worker_log(ns, pod, "snapshot uploaded")) and all(
        up.get(p, {}).get("applied_offset", 0) > 0 for p in owned) and up, 120, f"snapshots of {pod}'s {owned}")
    assert load.poll() is None, "the load ended before the volume was lost: raise its count"
    _lose_state(ns, pod)
    wait(lambda: list(out.glob("_spark_metadata/[0-9]*")), 240, "a first batch in the file sink's log")
    _kill_driver(ns, name)
    stdout, err = load.communicate(timeout=300)
    assert load.returncode == 0, err
    sent = json.loads(stdout)
    log(f"clicks: {sent['records']} records, {sent['clicks']} clicks, {len(sent['expected'])} with a page")
    # Restored from the newest snapshot (at or after the one seen before the loss) and replayed from
    # its offset only.
    running = wait(lambda: (r := _worker_log(ns, pod, "partition running")) and set(owned) <= set(r) and r, 120,
                   f"{pod}'s partitions running again")
    restored = _worker_log(ns, pod, "restored from snapshot")
    for p in owned:
        assert p in restored, (p, running[p])
        r, snap = running[p], restored[p]["snapshot_offset"]
        log(f"partition {p}: snapshot at {taken[p]['applied_offset']} seen before the loss, restored at {snap}, "
            f"committed {r['committed']}, replayed {r['replayed']} in {r['recovery_seconds']} s")
        assert snap >= taken[p]["applied_offset"] and r["snapshot_offset"] == r["applied_before"] == snap, r
        assert r["recovery"] != "rebuild" and r["replayed"] <= r["committed"] - snap, r
    told = wait(lambda: len(_pipeline_events(ns, name, "StateRestored")) >= len(owned) and
                _pipeline_events(ns, name, "StateRestored"), 60, "a StateRestored event per partition")
    log(f"StateRestored events: {told}")
    assert all(f" on {pod}: " in m for m in told), told

    res = eopipe("verify", "--bootstrap", BOOTSTRAP, "--source", "clicks", "--key", "header:event-id",
                 "--output", f"{ns}.{name}.deduped", "--dlq", f"{ns}.{name}.dlq", "--json", "--timeout", "300")
    log(f"eopipe verify, dedup stage: {res.stdout}{res.stderr}")
    rep = json.loads(res.stdout)
    assert res.returncode == 0 and rep["unique_in"] == sent["clicks"], rep
    assert rep["lost"] == 0 and rep["duplicated"] == 0, rep
    # Done when Spark's last committed batch ends at the deduped topic's end.
    ends = json.loads(nodetier.python("import json; from tests.helpers.sparkfiles import end_offsets; "
                                      f"print(json.dumps(end_offsets({BOOTSTRAP!r}, '{ns}.{name}.deduped')))"))
    checkpoint = next((root / "checkpoints").iterdir())
    wait(lambda: checkpoint_offsets(checkpoint) == {int(p): o for p, o in ends.items()}, 180,
         "Spark's checkpoint at the deduped topic's end")
    rows = _read_parquet_in_a_pod(node_tier["spark"], ns, pvc["metadata"]["name"], example)
    counts = Counter(r[0] for r in rows)
    log(f"Parquet through Spark: {len(rows)} rows, {len(counts)} clicks, "
        f"{sum(n > 1 for n in counts.values())} twice, {len(set(sent['expected']) - set(counts))} missing")
    assert all(r[1] is not None and r[2] for r in rows), rows[:3]
    assert set(counts) == set(sent["expected"]) and max(counts.values()) == 1
    delete_spark_pipeline(ns, name)  # the cores to the next test


def _operator_pods() -> set[str]:
    return set(kubectl("-n", "eopipe-system", "get", "pods", "-l", "app.kubernetes.io/component=operator",
                       "-o", "jsonpath={.items[*].metadata.name}").split())


def _sink_end(topic: str) -> int:
    return sum(json.loads(nodetier.python(
        "import json; from tests.helpers.sparkfiles import end_offsets; "
        f"print(json.dumps(end_offsets({BOOTSTRAP!r}, {topic!r})))")).values())


def _sink_forms(topic: str) -> dict[str, int]:
    """The sink's committed records by the set of their JSON fields (one per SQL's form)."""
    return json.loads(nodetier.python(
        "import json; from collections import Counter; from eopipe.tools.verify import TopicReader\n"
        f"c = Counter(','.join(sorted(json.loads(m.value()))) for m in TopicReader({BOOTSTRAP!r}).read({topic!r}))\n"
        "print(json.dumps(c))", timeout=300))


# The sink's records of each SQL the test runs: a projection, then an aggregate.
FORMS = {"a": "SELECT key, id, account, 'a' AS form FROM events WHERE id IS NOT NULL",
         "c": "SELECT key, id, count(*) AS n FROM events WHERE id IS NOT NULL GROUP BY key, id"}


@pytest.mark.timeout(2700)  # eight driver runs, a pause, an outage, three changes under two loads, two verifies: 10-15 min
def test_spark_stage_lifecycle_and_upgrade_modes_through_the_real_operator(node_tier, object_store):
    """One pipeline (examples/payments.yaml on topics of its own, one dedup pod, its checkpoint on
    a ReadWriteMany claim that the aggregate's executors mount too) through the Spark stage's
    whole life on the real Spark Operator, its webhook on:
    - a schema Spark cannot parse: phase Failed with Spark's own words (the driver pod's
      termination message: v2.5.2 puts only the exit code in the SparkApplication's
      errorMessage) after 1 + onFailureRetries driver runs, not submitted again, and the same
      spec with the schema fixed (`kubectl apply`) runs by one new submission (SQL that does
      not analyse takes the same path: spark_app exits 2, tests/integration/test_spark_app.py);
    - under load every eopipe operator pod is deleted: the Spark stage runs on untouched (the
      same SparkApplication uid, its driver pod not replaced, still one submission);
    - spec.paused mid-load: the SparkApplication and its driver pod go, the dedup stage goes to
      zero pods, the sink stays still while records keep arriving; the checkpoint claim stays;
    - resumed: a new SparkApplication whose driver resumes the same streaming query from the
      checkpoint.
    Then, under a second load, its namespace is deleted (deletionPolicy Retain: the topics stay)
    once the dedup pod has a snapshot of each partition in SeaweedFS (spec.dedup.backup), and
    the manifest `eopipe restore` makes of the one the dedup pod kept there is applied in another
    namespace (the admin's grant: RESTORE_GRANT): each partition restored from its snapshot (a
    StateRestored event each), the new driver, its checkpoint now on s3a:// in SeaweedFS
    (hadoop-aws in the Spark image, the credentials from the Secret), starting where the sink's
    markers end. There, under load, the store down for 30 s: ProcessingReady=False/
    CheckpointUnreachable while it lasts, the sink still, then on again. Then, on
    spec.processing.upgradeMode (docs/upgrades.md):
    - a stateful change (a new aggregate) with keepCheckpoint: Spark refuses the checkpoint, the
      pipeline is Stalled (CheckpointIncompatible) naming fromSink, not submitted again;
    - switched to fromSink: a new checkpoint generation, started where the sink's output ends;
    then both stages are verified (0 lost, 0 twice), each sink record in one SQL's form. One
    pipeline for both halves: each Spark start costs a minute of the node's two cores. What other
    tests do with a driver is not done again here: a stateless SQL change on a kept checkpoint
    (test_gitops.py), a driver killed and resumed from a claim (the demo, the file sink) or from
    the store (test_node_loss.py)."""
    ns, name, src = "sparklife", "payments", "sparklife"
    app_name, sink, claim = f"{name}-spark", f"{src}-enriched", f"{name}-spark-checkpoint"
    _install_operator_if_absent(node_tier)
    doc = yaml.safe_load((REPO_ROOT / "examples" / "payments.yaml").read_text())
    proc = doc["spec"]["processing"]
    good_schema = proc["schema"]
    doc["spec"].update(source={"topic": src, "partitions": 2})
    doc["spec"]["dedup"].update(replicas=1, backup=backup_to(name, "payments-s3")["spec"]["dedup"]["backup"])
    doc["spec"]["sink"]["kafka"] = {"topic": sink, "partitions": 2}
    proc.update(sql=FORMS["a"], schema="id STRING, amount BIGINTT, user STRUCT<name: STRING",
                checkpoint={"pvc": {"size": "1Gi", "accessMode": "ReadWriteMany", "storageClassName": "shared"}})

    def apply() -> None:
        kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(doc))

    def running(*words: str, what: str) -> None:
        t = time.monotonic()
        wait(lambda: _spark_app(ns, app_name).get("applicationState", {}).get("state") == "RUNNING"
             and driver_says(ns, app_name, "streaming query running", *words), 600, what, interval=3)
        log(f"{what}: in {time.monotonic() - t:.0f}s")

    origin, restored_ns = ns, "sparklife-restored"
    secret = s3_secret("payments-s3", name, object_store)
    _restricted_namespace(ns)
    kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(secret))
    load = None
    try:
        apply()
        t = time.monotonic()

        def failed() -> dict | None:
            st = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name).get("status") or {}
            ready = next((c for c in st.get("conditions") or [] if c["type"] == "Ready"), {})
            return st if st.get("phase") == "Failed" and ready.get("reason") == "SparkFailed" else None
        st = wait(failed, 400, "phase Failed, Ready=False/SparkFailed")
        retries = [e["message"][:200] for e in kubectl_json("-n", ns, "get", "events", "--field-selector",
                                                            f"involvedObject.name={name},reason=Retrying")["items"]]
        log(f"{name} with a bad schema: Failed in {time.monotonic() - t:.0f}s; {len(retries)} pass(es) tried "
            f"again soon (Warning Retrying), the first: {retries[:1]}")
        conditions = {c["type"]: c for c in st["conditions"]}
        for kind in ("Ready", "ProcessingReady", "Stalled"):
            msg = conditions[kind]["message"]  # Spark's parser's words, from the driver pod
            assert "schema:" in msg and "BIGINTT" in msg and "SQLSTATE" in msg, (kind, msg)
        log(f"Ready: {conditions['Ready']['message'][:300]}")
        # 1 + onFailureRetries driver runs, then the operator does not submit it again.
        runs = 1 + RESTART_POLICY["onFailureRetries"]
        app = wait(lambda: (a := kubectl_json("-n", ns, "get", "sparkapplication", app_name))
                   ["status"]["applicationState"]["state"] == "FAILED" and a, runs * 240, "SparkApplication FAILED")
        assert app["status"]["executionAttempts"] == runs, app["status"]
        # The pass that set Failed saw the application FAILED and left it; some time on, it is
        # still the same application (a resubmission would be a new uid or more attempts).
        time.sleep(25)
        again = kubectl_json("-n", ns, "get", "sparkapplication", app_name)
        assert again["metadata"]["uid"] == app["metadata"]["uid"], "the operator submitted the application again"
        assert (again["status"]["executionAttempts"], again["status"]["applicationState"]["state"]) == (runs, "FAILED")

        # The schema fixed by re-applying the whole spec, as a user does: one new submission.
        t, before = time.monotonic(), _events(ns, name)
        proc["schema"] = good_schema
        apply()
        wait(lambda: settled(ns, name) and _spark_app(ns, app_name).get("applicationState", {}).get("state")
             == "RUNNING", 400, f"{name} Ready with its fixed schema's driver RUNNING")
        log(f"{name}: the fixed schema Ready, its driver RUNNING in {time.monotonic() - t:.0f}s")
        _submitted_once(ns, name, before)
        running(what="projection A's query running")
        _spark_pods_keep_the_spec(ns, name)  # the webhook on (the file sink's test: off)
        app = kubectl_json("-n", ns, "get", "sparkapplication", app_name)
        driver_uid = kubectl_json("-n", ns, "get", "pod", f"{app_name}-driver")["metadata"]["uid"]

        # The malformed records first (the load below is stopped while paused, so would send only
        # some of its own), then the load.
        poison = eopipe("load", "--bootstrap", BOOTSTRAP, "--topic", src, "--count", "0", "--poison", "10",
                        "--seed", "28", "--quiet", "--json")
        assert poison.returncode == 0, poison.stderr
        load = start_load(src, "42000", "600", "28")
        time.sleep(6)
        old = _operator_pods()
        kubectl("-n", "eopipe-system", "delete", "pods", *sorted(old), "--wait=false")
        log(f"deleted every eopipe operator pod mid-load: {sorted(old)}")
        t = time.monotonic()
        wait(lambda: (pods := _operator_pods()) and not pods & old and kubectl(
            "-n", "eopipe-system", "get", "lease", "eopipe-leader", "-o",
            "jsonpath={.spec.holderIdentity}") in pods, 180, "a new operator pod holding the lease")
        kubectl("-n", "eopipe-system", "rollout", "status", "deployment/eopipe", "--timeout=180s")
        leader = kubectl("-n", "eopipe-system", "get", "lease", "eopipe-leader", "-o",
                         "jsonpath={.spec.holderIdentity}")
        wait(lambda: "reconciled: phase=Running" in kubectl("-n", "eopipe-system", "logs", leader, check=False),
             120, "a pass of the new leader (its resume handler) over the running stage", interval=2)
        wait(lambda: settled(ns, name), 120, "the pipeline Ready under the new operator")
        log(f"new operator pods leading, a pass over the pipeline done, in {time.monotonic() - t:.0f}s")
        now = kubectl_json("-n", ns, "get", "sparkapplication", app_name)
        assert now["metadata"]["uid"] == app["metadata"]["uid"], "the new operator re-created the application"
        assert now["metadata"]["generation"] == app["metadata"]["generation"], "the application's spec changed"
        assert kubectl_json("-n", ns, "get", "pod", f"{app_name}-driver")["metadata"]["uid"] == driver_uid
        _submitted_once(ns, name, before)
        assert load.poll() is None, "the load ended before the pause: make it longer"

        # Paused mid-load: the SparkApplication and its driver go, the dedup pods too.
        kubectl("-n", ns, "patch", "exactlyoncepipeline", name, "--type=merge", "-p", '{"spec": {"paused": true}}')
        t = time.monotonic()
        wait(lambda: not kubectl("-n", ns, "get", "sparkapplication", "-o", "name")
             and not kubectl("-n", ns, "get", "pods", "-l", "spark-role", "-o", "name")
             and f"pod/{name}-dedup-" not in kubectl("-n", ns, "get", "pods", "-o", "name"),
             180, "the SparkApplication, the Spark pods and the dedup pods gone")
        st = wait(lambda: (s := kubectl_json("-n", ns, "get", "exactlyoncepipeline", name)["status"])
                  .get("phase") == "Paused" and s, 60, "phase Paused")
        processing = next(c for c in st["conditions"] if c["type"] == "ProcessingReady")
        # "stopping ..." until the next resync says "stopped ...": both name the kept claim.
        assert processing["reason"] == "Paused" and claim in processing["message"], processing
        log(f"paused in {time.monotonic() - t:.0f}s: {processing['message']}")
        held = _sink_end(sink)
        time.sleep(10)  # a driver left running would write the paused load's records by now
        assert _sink_end(sink) == held, "the sink grew while paused"
        assert load.poll() is None, "the load ended before the sink was seen still while paused"
        load.terminate()
        out, err = load.communicate(timeout=300)
        assert load.returncode == 0, err
        sent = json.loads(out)
        log(f"load: {sent}")
        pvc = kubectl_json("-n", ns, "get", "pvc", claim)
        pv = kubectl_json("get", "pv", pvc["spec"]["volumeName"])["spec"]
        checkpoint = Path((pv.get("hostPath") or pv["local"])["path"]) / "checkpoints" / name
        query = json.loads((checkpoint / "metadata").read_text())["id"]

        kubectl("-n", ns, "patch", "exactlyoncepipeline", name, "--type=merge", "-p", '{"spec": {"paused": false}}')
        t = time.monotonic()
        wait(lambda: settled(ns, name) and _spark_app(ns, app_name).get("applicationState", {}).get("state")
             == "RUNNING", 400, "Ready again, the driver RUNNING, after the resume")
        again = kubectl_json("-n", ns, "get", "sparkapplication", app_name)
        assert again["metadata"]["uid"] != app["metadata"]["uid"]  # created again on resume
        running(what="the resumed driver's streaming query running")
        log(f"resumed: Ready, a new driver's query running in {time.monotonic() - t:.0f}s")
        assert kubectl_json("-n", ns, "get", "pvc", claim)["metadata"]["uid"] == pvc["metadata"]["uid"]
        assert json.loads((checkpoint / "metadata").read_text())["id"] == query  # the same query, resumed

        # Load until the refusal (Spark judges a checkpoint when records arrive), stopped then.
        base = _sink_end(sink)
        load = start_load(src, "200000", "120", "31")
        wait(lambda: _sink_end(sink) > base, 300, "the second load's first records in the sink", interval=3)

        # The namespace lost mid-load, once each partition has a snapshot; the pipeline restored
        # into another from what is outside it (topics, offsets, snapshots, the sink's markers).
        pod = f"{name}-dedup-0"
        taken = wait(lambda: (up := _worker_log(ns, pod, "snapshot uploaded")) and all(
            up.get(p, {}).get("applied_offset", 0) > 0 for p in (0, 1)) and up, 120, "a snapshot of each partition")
        t = time.monotonic()
        kubectl("delete", "namespace", ns, "--timeout=300s", timeout=330)
        log(f"deleted namespace {ns} mid-load: gone in {time.monotonic() - t:.0f}s")
        kept = {deduped_topic(ns, name), dlq_topic(ns, name), spark_commit_topic(ns, name), sink}
        assert kept <= topics(), kept - topics()
        # The manifest from where the dedup pods kept it, beside their snapshots (as of the last
        # apply: the fixed schema), read with the Secret's credentials.
        res = nodetier.run(in_tier("env", *(f"{k}={v}" for k, v in object_store.env().items()), EOPIPE, "restore",
                                   f"s3://eopipe/{name}", "--endpoint", store_url(),
                                   "--namespace", restored_ns), timeout=120)
        assert res.returncode == 0, res.stderr
        restored_doc, ns = yaml.safe_load(res.stdout), restored_ns
        assert restored_doc["spec"].pop("restoreFrom") == {"namespace": origin, "name": name}, restored_doc["spec"]
        assert PipelineSpec.model_validate(restored_doc["spec"]) == PipelineSpec.model_validate(doc["spec"])
        doc = {**restored_doc, "spec": {**restored_doc["spec"], "restoreFrom": {"namespace": origin, "name": name}}}
        proc = doc["spec"]["processing"]
        # Restored with its checkpoint in the object store (the Spark image's hadoop-aws), its
        # credentials from the same Secret: a new location, so it starts where the sink ends.
        proc.update(s3a_checkpoint(f"{name}/checkpoint", secret["metadata"]["name"]))
        _restricted_namespace(ns)
        kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(secret))
        t = time.monotonic()
        apply()

        def restored_app() -> str:
            st = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name).get("status") or {}
            stalled = [c for c in st.get("conditions") or [] if c["type"] == "Stalled" and c["status"] == "True"]
            assert not stalled, stalled  # a refusal (policy, conflict) would hold it
            return kubectl("-n", ns, "get", "sparkapplication", app_name, "-o", "name", "--ignore-not-found")
        wait(restored_app, 300, "the restored pipeline's SparkApplication", interval=3)
        running("starting where the sink's markers say its output ends", what="the restored pipeline's driver")
        restored = _worker_log(ns, pod, "restored from snapshot")
        for p in (0, 1):
            log(f"partition {p}: snapshot at {taken[p]['applied_offset']} seen before the loss, restored at "
                f"{restored.get(p, {}).get('snapshot_offset')}")
            assert restored[p]["snapshot_offset"] >= taken[p]["applied_offset"], restored
        told = wait(lambda: len(e := _pipeline_events(ns, name, "StateRestored")) >= 2 and e, 120,
                    "a StateRestored event per partition")
        log(f"restored into {ns} in {time.monotonic() - t:.0f}s: {told}")

        # Under the load, the s3a:// checkpoint's store down, once a batch committed there.
        wait(lambda: _last_commit(object_store, f"{name}/checkpoint/commits/") >= 0, 300,
             "a batch committed in the checkpoint in the store", interval=5)
        batch = _last_commit(object_store, f"{name}/checkpoint/commits/")
        _object_store_outage(ns, name, sink)
        # The sink moves when a batch's output commits; its commit file follows when the batch ends.
        wait(lambda: _last_commit(object_store, f"{name}/checkpoint/commits/") > batch, 300,
             f"a batch after {batch} committed in the checkpoint in the store", interval=5)

        # A stateful change, keepCheckpoint: refused, Stalled naming fromSink, nothing written.
        proc.update(sql=FORMS["c"], outputMode="update")
        apply()

        def incompatible() -> dict | None:
            st = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name).get("status") or {}
            return next((c for c in st.get("conditions") or [] if c["type"] == "Stalled" and c["status"] == "True"
                         and c["reason"] == "CheckpointIncompatible"), None)
        stalled = wait(incompatible, 600, "Stalled/CheckpointIncompatible", interval=3)
        log(f"Stalled: {stalled['message'][:400]}")
        assert "upgradeMode fromSink" in stalled["message"], stalled
        load.kill()
        load.wait(30)
        assert "id,n" not in _sink_forms(sink), "the refused query wrote"
        # The Spark Operator's own retry of the same spec (restartPolicy) runs; the stall holds
        # through it (status.sparkStall), and the operator does not submit the application again.
        uid = kubectl_json("-n", ns, "get", "sparkapplication", app_name)["metadata"]["uid"]
        retried = wait(lambda: (a := kubectl_json("-n", ns, "get", "sparkapplication", app_name))["status"]
                       .get("executionAttempts") == runs and a["status"]["applicationState"]["state"]
                       in ("RUNNING", "FAILED") and a, 300, "the Spark Operator's retry", interval=3)
        time.sleep(15)  # a few passes on (the watch debounces 5 s)
        assert incompatible() is not None, "the stall did not hold through the Spark Operator's retry"
        again = kubectl_json("-n", ns, "get", "sparkapplication", app_name)
        assert (again["metadata"]["uid"], again["status"].get("executionAttempts")) == (uid, runs), again
        log(f"the Spark Operator's retry {retried['status']['applicationState']['state']}; still Stalled")

        # fromSink: a new checkpoint generation, from where the sink's output ends (the records
        # the refused query left too), then a load of its own.
        proc["upgradeMode"] = "fromSink"
        apply()
        running("starting where the sink's markers say its output ends", "generation-1",
                what="the aggregate's query running on a new checkpoint generation")
        st = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name)["status"]
        assert st["sparkCheckpoint"]["generation"] == 1, st.get("sparkCheckpoint")
        load = start_load(src, "4000", "150", "32")
        out, err = load.communicate(timeout=300)
        assert load.returncode == 0, err
        log(f"load: {out}")
        wait(lambda: settled(ns, name), 300, f"{name} Ready on the aggregate")

        # The second load was stopped: the source is the truth, and it holds the first and last
        # loads' records whole.
        reports = verify_both_stages(ns, name, src, sink, topics_of=origin)
        assert reports["dedup stage"]["unique_in"] >= sent["unique"] + json.loads(out)["unique"], reports
        assert reports["dedup stage"]["malformed_in"] == reports["dedup stage"]["dead_lettered"] == 10, reports
        got = _sink_forms(sink)
        log(f"the sink's records by form: {got}")
        assert set(got) == {"account,form,id", "id,n"}, got
    finally:  # passed or not: the node's cores and the topics to the next test
        if load is not None:
            load.kill()
        delete_spark_pipeline(ns, name, check=False)
        delete_topics(origin, name, src, sink)
        kubectl("delete", "namespace", origin, restored_ns, "--wait=false", "--ignore-not-found", check=False)


def _last_commit(store, prefix: str) -> int:
    """The newest batch id committed in the checkpoint in the object store (by its commits/ file
    names; Spark deletes all but the last 100, so their count stops growing), or -1."""
    ids = [int(k.rsplit("/", 1)[1]) for k in s3_keys(store, prefix) if k.rsplit("/", 1)[1].isdigit()]
    return max(ids, default=-1)


OUTAGE_S = 30


def _processing(ns: str, name: str) -> dict:
    st = kubectl_json("-n", ns, "get", "exactlyoncepipeline", name).get("status") or {}
    return next((c for c in st.get("conditions") or [] if c["type"] == "ProcessingReady"), {})


def _object_store_outage(ns: str, name: str, sink: str) -> None:
    """The SeaweedFS pod scaled to 0 for OUTAGE_S at least and until the pipeline says so
    (ProcessingReady=False/CheckpointUnreachable: the next pass after the driver's probe has gone
    10 s unanswered). Meanwhile the sink stands still: every batch ends by writing the checkpoint.
    Then the store back: the condition clears and the sink moves on."""
    deploy = ["-n", node_objectstore.NAMESPACE, "deployment", node_objectstore.NAME]
    kubectl("scale", *deploy, "--replicas=0")
    t = time.monotonic()
    wait(lambda: not kubectl("-n", node_objectstore.NAMESPACE, "get", "pods", "-o", "name"), 120,
         "the SeaweedFS pod gone")
    log(f"object store down (SeaweedFS scaled to 0) in {time.monotonic() - t:.0f}s")
    told = wait(lambda: (c := _processing(ns, name)).get("reason") == "CheckpointUnreachable" and c, 150,
                "ProcessingReady=False/CheckpointUnreachable", interval=2)
    log(f"{told['reason']} {time.monotonic() - t:.0f}s into the outage: {told['message'][:300]}")
    # Committed records, not offsets: a transaction the outage left open may be aborted meanwhile.
    held = sum(_sink_forms(sink).values())
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - t)))
    assert sum(_sink_forms(sink).values()) == held, "the sink moved while the checkpoint's store was down"
    kubectl("scale", *deploy, "--replicas=1")
    kubectl("rollout", "status", *deploy, "--timeout=180s", timeout=200)
    log(f"object store back after {time.monotonic() - t:.0f}s")
    t = time.monotonic()
    wait(lambda: _processing(ns, name).get("reason") != "CheckpointUnreachable", 180, "the condition cleared",
         interval=3)
    wait(lambda: sum(_sink_forms(sink).values()) > held, 300, "the sink moving again", interval=5)
    log(f"condition cleared and the sink moving again {time.monotonic() - t:.0f}s after the store came back")


def _spark_webhook(enable: bool) -> None:
    """`helm upgrade` of the Spark Operator's release with its webhook on or off, its other values
    as `make cluster` installed them (localenv/node/cluster.py)."""
    from localenv.node import STATE_DIR
    from localenv.node.cluster import SPARK_OPERATOR_CONF
    from localenv.node.sparkoperator import helm_install_argv

    conf = json.loads(SPARK_OPERATOR_CONF.read_text())
    values = json.loads((STATE_DIR / "spark-operator-values.json").read_text())
    values["webhook"]["enable"] = enable
    path = STATE_DIR / "spark-operator-values-test.json"
    path.write_text(json.dumps(values))
    t = time.monotonic()
    res = nodetier.run(in_tier(*helm_install_argv(conf["helm"], nodetier.KUBECONFIG, Path(conf["chart"]), path)),
                       timeout=330)
    assert res.returncode == 0, res.stdout + res.stderr
    hooks = kubectl("get", "mutatingwebhookconfigurations", "-o", "name")
    assert ("spark-operator" in hooks) is enable, hooks
    took = f"helm upgrade, {time.monotonic() - t:.0f}s"
    if enable:
        # helm's --wait sees the webhook's pod ready tens of seconds before the API server can
        # call it (over 31 s in the CI run of 2026-12-05): until then a SparkApplication create
        # is answered 500. The operator retries that (test_operator.py checks how); the test
        # waits, as an admin would, so the next pipeline's first passes are not spent on it.
        t = time.monotonic()
        wait(_spark_webhook_answers, 180, "the Spark Operator's webhook called by the API server", interval=2)
        took += f"; called by the API server {time.monotonic() - t:.0f}s later"
    log(f"Spark Operator webhook {'on' if enable else 'off'} ({took})")


def _spark_webhook_answers() -> bool:
    """Whether the API server can call the Spark Operator's webhooks: a server-side dry run of a
    SparkApplication create goes through them (their sideEffects are None) and writes nothing."""
    app = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
           "metadata": {"name": "webhook-probe", "namespace": "default"},
           "spec": {"type": "Python", "mode": "cluster", "sparkVersion": spark_version(), "image": "probe",
                    "mainApplicationFile": "local:///probe.py", "driver": {}, "executor": {}}}
    res = nodetier.run(kubectl_argv("create", "--dry-run=server", "-f", "-"), timeout=60, input=json.dumps(app))
    if res.returncode == 0:
        return True
    assert "calling webhook" in res.stderr, res.stderr  # refused for another reason: the probe is wrong
    return False


def _read_parquet_in_a_pod(image: str, ns: str, claim: str, example: dict) -> list[list]:
    """The sink's rows, read by Spark in a pod of the Spark image that mounts the claim where the
    driver and executors do: the sink's log names its files by that path."""
    script = reader_script(example["spec"]["sink"]["files"]["path"], "parquet", ["user_id", "page", "ts"])
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "parquet-reader", "namespace": ns},
           "spec": {"restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{"name": "read", "image": image, "imagePullPolicy": "Never",
                                    "command": ["python3", "-c", script],
                                    "env": [{"name": "SPARK_LOCAL_IP", "value": "127.0.0.1"}],
                                    "securityContext": {"allowPrivilegeEscalation": False,
                                                        "capabilities": {"drop": ["ALL"]}},
                                    "volumeMounts": [{"name": "data", "mountPath": MOUNT_PATH}]}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}}
    kubectl("apply", "-f", "-", input=json.dumps(pod))

    def ended() -> str | None:
        phase = kubectl("-n", ns, "get", "pod", "parquet-reader", "-o", "jsonpath={.status.phase}")
        return phase if phase in ("Succeeded", "Failed") else None
    phase = wait(ended, 300, "the Parquet reader pod to end")
    out = kubectl("-n", ns, "logs", "parquet-reader", timeout=60)
    assert phase == "Succeeded", out[-3000:]
    return parse_rows(out)


# The chart's operator pod labels (charts/eopipe/templates/_helpers.tpl, release `eopipe`).
OPERATOR_LABELS = {"app.kubernetes.io/name": "eopipe", "app.kubernetes.io/instance": "eopipe",
                   "app.kubernetes.io/component": "operator"}


def test_network_policy_of_a_pipeline_holds(node_tier):
    """The operator's NetworkPolicy for a pipeline's dedup pods (access.network_policy, its own
    builder), enforced on the node by kube-network-policies: a pod listening as a dedup pod does
    (the StatefulSet builder's labels and named port `http`) is reached by a pod of its pipeline
    and by the operator's pod, not by an unlabelled pod of its namespace nor by a pod with the
    pipeline's label in another namespace; without the policy, by all four (before it is made,
    and again once it is deleted)."""
    status = json.loads(NETPOL_STATUS.read_text())
    if not status["enforced"]:
        pytest.skip(status["reason"])
    t0 = time.monotonic()
    ns, other_ns, operator_ns, pipeline = "np-team", "np-other", "np-operator", "np"
    names = Names(ns, pipeline, PipelineSpec.model_validate(
        {"kafka": {"bootstrapServers": "kafka.kafka.svc:9092"}, "source": {"topic": "np", "partitions": 1}}))
    template = dedup_builders.statefulset(names, node_tier["app"])["spec"]["template"]
    port = template["spec"]["containers"][0]["ports"][0]
    assert port["name"] == "http"
    peers = access_builders.PolicyPeers(operator_ns, tuple(OPERATOR_LABELS.items()))
    policy = access_builders.network_policy(names, peers)

    def pod(name: str, pod_ns: str, labels: dict, command: list[str], ports: list | None = None) -> dict:
        container = {"name": "c", "image": node_tier["app"], "imagePullPolicy": "Never", "command": command,
                     **({"ports": ports} if ports else {})}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": pod_ns, "labels": labels},
                "spec": {"terminationGracePeriodSeconds": 0, "containers": [container]}}
    sleep = ["sleep", "3600"]
    clients = {  # name -> (namespace, allowed by the policy)
        "own": (ns, True), "operator": (operator_ns, True), "unlabelled": (ns, False), "other-ns": (other_ns, False)}
    objs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in (ns, other_ns, operator_ns)]
    objs += [pod("dedup", ns, template["metadata"]["labels"],
                 ["python", "-m", "http.server", str(port["containerPort"])], [port]),
             pod("own", ns, {LABEL_PIPELINE: pipeline}, sleep),
             pod("operator", operator_ns, OPERATOR_LABELS, sleep),
             pod("unlabelled", ns, {}, sleep),
             pod("other-ns", other_ns, {LABEL_PIPELINE: pipeline}, sleep)]
    try:
        kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
        for n in (ns, other_ns, operator_ns):
            kubectl("-n", n, "wait", "pod", "--all", "--for=condition=Ready", "--timeout=120s", timeout=150)
        ip = kubectl("-n", ns, "get", "pod", "dedup", "-o", "jsonpath={.status.podIP}")

        def probe_all() -> dict[str, str]:
            with ThreadPoolExecutor(len(clients)) as ex:
                futs = {c: ex.submit(tcp_probe, cns, c, ip, port["containerPort"]) for c, (cns, _) in clients.items()}
                return {c: f.result() for c, f in futs.items()}

        def all_connect() -> dict[str, str] | None:
            r = probe_all()
            return r if set(r.values()) == {"connected"} else None

        # Without a policy every client connects (the server listens, the probes work); the
        # http.server may take a moment to bind.
        before = wait(all_connect, 30, "every client to connect before the policy")
        log(f"network policy: no policy: {before}")
        kubectl("apply", "-f", "-", input=json.dumps(policy))
        t = time.monotonic()
        wait(lambda: tcp_probe(ns, "unlabelled", ip, port["containerPort"]) != "connected", 30,
             "the policy to take effect (the unlabelled pod refused)", interval=0.5)
        log(f"network policy: in force {time.monotonic() - t:.1f}s after it was made")
        during = probe_all()
        log(f"network policy: {policy['metadata']['name']} in force: {during}")
        for c, (_, allowed) in clients.items():
            assert (during[c] == "connected") == allowed, (c, during, policy)
        kubectl("-n", ns, "delete", "networkpolicy", policy["metadata"]["name"])
        after = wait(all_connect, 30, "every client to connect again once the policy is deleted", interval=0.5)
        log(f"network policy: deleted: {after}")
    finally:
        kubectl("delete", "namespace", ns, other_ns, operator_ns, "--wait=false", check=False)
    log(f"network policy test: {time.monotonic() - t0:.0f}s")


# -- a hostile tenant --------------------------------------------------------------------------
# docs/security.md: a tenant who may manage pipelines in its namespace, and nothing else, tries
# through a pipeline for what it could not reach alone. Its namespace, an "outside" namespace
# (a listener standing in for an attacker's Kafka, and a pod probing from there).
TENANT_NS, OUTSIDE_NS = "tenant-t", "tenant-x"
TENANT = f"system:serviceaccount:{TENANT_NS}:tenant"
LISTEN_PORT = 9092
# A Kafka that is not one: accepts, records whatever a client sends (a SASL PLAIN handshake
# would carry the password), then closes. Each connection is one line on its stdout.
LISTENER = """import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", %d))
s.listen(16)
print("listening", flush=True)
while True:
    c, a = s.accept()
    c.settimeout(2)
    try:
        data = c.recv(65536)
    except OSError:
        data = b""
    print("CONNECTION", a[0], data.hex(), flush=True)
    c.close()
""" % LISTEN_PORT
# The chart's resyncSeconds: every pipeline is reconciled again this often (a Secret's change
# starts no pass of its own).
RESYNC_SECONDS = yaml.safe_load((REPO_ROOT / "charts" / "eopipe" / "values.yaml").read_text())["resyncSeconds"]
# What the operator makes for a pipeline <p> in its namespace (named <p>-..., or labelled with it).
CHILD_KINDS = ("statefulsets,pods,services,configmaps,secrets,serviceaccounts,roles,rolebindings,networkpolicies,"
               "persistentvolumeclaims")


def _merged(base: dict, patch: dict) -> dict:
    out = dict(base)
    for k, v in patch.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _tenant_doc(name: str, spec: dict | None = None, spark: bool = False) -> dict:
    """examples/minimal.yaml in the tenant's namespace (its Kafka, kafka.kafka.svc), on a source of
    its own with 2 partitions, one dedup pod asking for little CPU (the file-sink test's Spark
    stage still holds most of the node's two cores); `spark`: with the smallest Spark stage."""
    doc = yaml.safe_load((REPO_ROOT / "examples" / "minimal.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": TENANT_NS}
    doc["spec"]["source"] = {"topic": "tenant-events", "partitions": 2}
    doc["spec"]["dedup"] = {"resources": {"requests": {"cpu": "50m"}}}
    if spark:
        doc["spec"].update(processing={"checkpoint": {"pvc": {"size": "1Gi"}}},
                           sink={"kafka": {"topic": f"{name}-out"}})
    return _merged(doc, {"spec": spec or {}})


def _as_tenant(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return nodetier.kubectl_as(TENANT, "-n", TENANT_NS, *args, input=input)


def _tenant_apply(doc: dict, dry_run: bool = False) -> subprocess.CompletedProcess:
    return _as_tenant("apply", *(["--dry-run=server"] if dry_run else []), "-f", "-", input=json.dumps(doc))


def _condition(name: str, type_: str) -> dict | None:
    """The pipeline's condition `type_` as of its current generation (None before that pass)."""
    obj = kubectl_json("-n", TENANT_NS, "get", "exactlyoncepipeline", name)
    st = obj.get("status") or {}
    if st.get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), None)


def _stalled(name: str, reason: str) -> dict | None:
    c = _condition(name, "Stalled")
    return c if c and c["status"] == "True" and c["reason"] == reason else None


def _children(pipeline: str, spark_kind: bool, but: tuple[str, ...] = ()) -> list[str]:
    """Objects of the pipeline's in the tenant's namespace: named <pipeline>-..., or labelled with it."""
    kinds = CHILD_KINDS + (",sparkapplications" if spark_kind else "")
    named = [n for n in kubectl("-n", TENANT_NS, "get", kinds, "-o", "name").split()
             if n.split("/", 1)[1].startswith(f"{pipeline}-")]
    labelled = kubectl("-n", TENANT_NS, "get", kinds, "-l", f"{LABEL_PIPELINE}={pipeline}", "-o", "name").split()
    return sorted({n for n in named + labelled if n.split("/", 1)[1] not in but})


def _listener_connections() -> list[str]:
    return [ln for ln in kubectl("-n", OUTSIDE_NS, "logs", "listener").splitlines() if ln.startswith("CONNECTION")]


def _install_operator_if_absent(node_tier) -> None:
    """The operator as tests.helpers.nodepipes.install_operator installs it, if no earlier test left it."""
    if kubectl("-n", "eopipe-system", "get", "deployment", "eopipe", "-o", "name", check=False).strip():
        return
    install_operator(node_tier)
    log("installed the operator (helm install)")


def _status_line(r: dict) -> str:
    if not r["connected"]:
        return f"no connection ({r['error']})"
    head = r["response"].split(b"\r\n", 1)[0].decode("latin-1")
    return head or f"closed without an answer ({r['error'] or 'EOF'})"


def test_a_hostile_tenant_gains_nothing(node_tier):
    """A ServiceAccount that may manage ExactlyOncePipelines (and read ConfigMaps) in tenant-t and
    nothing else, with `kubectl --as`, against the operator installed by Helm: each attack of
    docs/security.md is refused at admission (server-side dry-run: the field named), or admitted
    and then refused by the operator (Stalled, PolicyDenied or Conflict, the field or object
    named) with no effect: no object made for that pipeline, the admin's objects unchanged, no
    connection to a listener the pipeline names as its Kafka (with a Secret not opened to it),
    not on a resync nor on deletion. Opening the Secret to the pipeline makes the same manifest
    run (the negative control). The state endpoints of a running pipeline's dedup pod answer
    raw requests without the token 400/401 from the tenant's namespace, from another one and
    from the pod itself; the token makes the difference. No Secret value and no token ends up in
    the operator's or the dedup pods' logs, the events or the pipelines' status."""
    t0 = time.monotonic()
    _install_operator_if_absent(node_tier)
    rows: list[tuple[str, str]] = []

    def outcome(attack: str, result: str) -> None:
        rows.append((attack, result))
        log(f"hostile tenant: {attack}: {result}")

    bank_password = secrets.token_urlsafe(24)
    admin_token = secrets.token_urlsafe(32)
    spark_kind = bool(kubectl("get", "crd", "sparkapplications.sparkoperator.k8s.io", "-o", "name",
                              check=False).strip())

    def b64(s: str) -> str:
        return base64.b64encode(s.encode()).decode()

    def pod(name: str, ns: str, command: list[str]) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
                    "name": "c", "image": node_tier["app"], "imagePullPolicy": "Never", "command": command}]}}
    setup = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in (TENANT_NS, OUTSIDE_NS)] + [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant", "namespace": TENANT_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "tenant", "namespace": TENANT_NS},
         "rules": [{"apiGroups": ["eopipe.dev"], "resources": ["exactlyoncepipelines", "exactlyoncepipelines/scale"],
                    "verbs": ["*"]},
                   {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "tenant", "namespace": TENANT_NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
         "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": TENANT_NS}]},
        # The admin's: a credential opened to no pipeline, and a Secret named as pipeline grab's
        # token Secret would be.
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bank-creds", "namespace": TENANT_NS},
         "type": "Opaque", "data": {"username": b64("bank"), "password": b64(bank_password)}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "grab-dedup-token", "namespace": TENANT_NS},
         "type": "Opaque", "data": {"token": b64(admin_token)}},
        pod("probe", TENANT_NS, ["sleep", "3600"]),
        pod("listener", OUTSIDE_NS, ["python", "-c", LISTENER]),
    ]
    try:
        # create, not apply: apply would keep the Secrets' data in an annotation of theirs.
        kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": setup}))
        # What the tenant may do alone: pipelines yes; Secrets, pods, exec no.
        for verb, what, want in (("get", "secrets", "no"), ("list", "secrets", "no"), ("create", "pods", "no"),
                                 ("create", "pods/exec", "no"), ("create", "rolebindings", "no"),
                                 ("create", "exactlyoncepipelines.eopipe.dev", "yes"),
                                 ("get", "configmaps", "yes")):
            said = _as_tenant("auth", "can-i", verb, what).stdout.strip()
            assert said == want, (verb, what, said)
        outcome("0 read bank-creds alone", "kubectl auth can-i get/list secrets: no (pipelines: yes)")

        # A pipeline of the tenant's that it may run: started first, it gets Ready meanwhile.
        assert _tenant_apply(_tenant_doc("minimal")).returncode == 0

        # -- 1-5: refused at admission -------------------------------------------------------------
        assert _tenant_apply(_tenant_doc("control"), dry_run=True).returncode == 0
        assert _tenant_apply(_tenant_doc("control", spark=True), dry_run=True).returncode == 0
        admission = [
            ("1 sparkConf hostPath volume of /", "spec.processing.sparkConf[spark.kubernetes.driver.volumes.hostPath",
             _tenant_doc("attack", {"processing": {"sparkConf": {
                 "spark.kubernetes.driver.volumes.hostPath.x.options.path": "/",
                 "spark.kubernetes.driver.volumes.hostPath.x.mount.path": "/host"}}}, spark=True)),
            ("2 driver ServiceAccount default", "spec.processing.serviceAccount",
             _tenant_doc("attack", {"processing": {"serviceAccount": "default"}}, spark=True)),
            ("2 driver ServiceAccount tenant", "spec.processing.serviceAccount",
             _tenant_doc("attack", {"processing": {"serviceAccount": "tenant"}}, spark=True)),
            ("3 dedup pod env PYTHONWARNINGS", "spec.dedup.podTemplate.env",
             _tenant_doc("attack", {"dedup": {"podTemplate": {"env": [
                 {"name": "PYTHONWARNINGS", "value": "error"}]}}})),
            ("3 envFrom bank-creds without a prefix", "spec.processing.envFrom",
             _tenant_doc("attack", {"processing": {"envFrom": [{"secretRef": {"name": "bank-creds"}}]}}, spark=True)),
            ("4 toleration {operator: Exists}", "tolerations",
             _tenant_doc("attack", {"dedup": {"podTemplate": {"tolerations": [{"operator": "Exists"}]}}})),
            ("4 priorityClassName system-node-critical", "spec.dedup.podTemplate.priorityClassName",
             _tenant_doc("attack", {"dedup": {"podTemplate": {"priorityClassName": "system-node-critical"}}})),
            ("5 dedup.replicas 1000 on 8 partitions", "dedup.replicas",
             _tenant_doc("attack", {"source": {"partitions": 8}, "dedup": {"replicas": 1000}})),
        ]
        for attack, field, doc in admission:
            res = _tenant_apply(doc, dry_run=True)
            assert res.returncode != 0 and field in res.stderr, (attack, res.stdout, res.stderr)
            outcome(attack, f"refused at admission: {res.stderr[res.stderr.index(field):].strip()[:200]}")
        # The same on an update of a running pipeline, and through the scale subresource.
        res = _as_tenant("patch", "exactlyoncepipeline", "minimal", "--type=merge", "--dry-run=server", "-p",
                         json.dumps({"spec": {"dedup": {"podTemplate": {"tolerations": [{"operator": "Exists"}]}}}}))
        assert res.returncode != 0 and "tolerations" in res.stderr, res
        outcome("4 toleration added to a running pipeline",
                f"refused at admission: {res.stderr[res.stderr.index('tolerations'):].strip()[:160]}")
        res = _as_tenant("scale", "exactlyoncepipeline", "minimal", "--replicas=1000", "--dry-run=server")
        assert res.returncode != 0 and "dedup.replicas" in res.stderr, res
        outcome("5 kubectl scale --replicas=1000",
                f"refused by the CRD: {res.stderr[res.stderr.index('dedup.replicas'):].strip()[:160]}")

        # -- 6: Kafka credentials from bank-creds, sent to a listener of the test's -----------------
        kubectl("-n", OUTSIDE_NS, "wait", "pod/listener", "--for=condition=Ready", "--timeout=120s", timeout=150)
        kubectl("-n", TENANT_NS, "wait", "pod/probe", "--for=condition=Ready", "--timeout=120s", timeout=150)
        listen_ip = kubectl("-n", OUTSIDE_NS, "get", "pod", "listener", "-o", "jsonpath={.status.podIP}")
        wait(lambda: "listening" in kubectl("-n", OUTSIDE_NS, "logs", "listener"), 30, "the listener")
        # The listener records a connection (so that silence below means none was made).
        assert tcp_probe(TENANT_NS, "probe", listen_ip, LISTEN_PORT) == "connected"
        wait(lambda: len(_listener_connections()) == 1, 10, "the listener to record the probe's connection")
        exfil = _tenant_doc("exfil", {"deletionPolicy": "Delete", "kafka": {
            "bootstrapServers": f"{listen_ip}:{LISTEN_PORT}", "securityProtocol": "SASL_PLAINTEXT",
            "sasl": {"mechanism": "PLAIN", "username": {"name": "kafka-user", "key": "username"},
                     "password": {"name": "bank-creds", "key": "password"}}}})
        res = _tenant_apply(exfil)
        assert res.returncode == 0, res.stderr  # admission cannot see Secrets' opt-in: the operator decides
        t_exfil = time.monotonic()
        # -- 7: the dedup pod's env from bank-creds; 8: a pipeline named after the admin's Secret ----
        leak = _tenant_doc("leak", {"dedup": {"podTemplate": {"env": [
            {"name": "BANK_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "bank-creds", "key": "password"}}}]}}})
        assert _tenant_apply(leak).returncode == 0
        # -- 7b: the Spark checkpoint on the dedup state claim of the tenant's pipeline minimal ------
        steal = _tenant_doc("steal", {"processing": {"checkpoint": {"pvc": {"claimName": "state-minimal-dedup-0"}}}},
                            spark=True)
        assert _tenant_apply(steal).returncode == 0  # nor a claim's: the operator decides
        admin_secret = kubectl_json("-n", TENANT_NS, "get", "secret", "grab-dedup-token")["metadata"]
        assert _tenant_apply(_tenant_doc("grab")).returncode == 0
        t_grab = time.monotonic()

        st = wait(lambda: _stalled("exfil", "PolicyDenied"), 60, "exfil Stalled (PolicyDenied)")
        assert "spec.kafka.sasl.password: Secret bank-creds is not open to pipeline exfil" in st["message"], st
        # A closed Secret reads as a missing one: the status tells the tenant nothing of bank-creds.
        said = {f: st["message"].split(f"{f}: ", 1)[1].split(";")[0] for f in ("spec.kafka.sasl.username",
                                                                                "spec.kafka.sasl.password")}
        assert said["spec.kafka.sasl.username"].replace("kafka-user", "X") == \
            said["spec.kafka.sasl.password"].replace("bank-creds", "X"), said
        assert _children("exfil", spark_kind) == []
        outcome("6 SASL from bank-creds to a listener", f"admitted; Stalled/PolicyDenied: {st['message'][:220]}")
        # The username's Secret, made now by the admin and opened to exfil: the next resync sees it
        # (a Secret's change starts no pass) and must still refuse the password's.
        kubectl("-n", TENANT_NS, "create", "secret", "generic", "kafka-user", "--from-literal=username=bank")
        kubectl("-n", TENANT_NS, "annotate", "secret", "kafka-user", f"{OPT_IN}=exfil")

        st = wait(lambda: _stalled("leak", "PolicyDenied"), 60, "leak Stalled (PolicyDenied)")
        assert "spec.dedup.podTemplate.env[0].valueFrom.secretKeyRef: Secret bank-creds is not open to pipeline leak" \
            in st["message"], st
        assert _children("leak", spark_kind) == []
        outcome("7 dedup env secretKeyRef bank-creds",
                f"admitted; Stalled/PolicyDenied, nothing made: {st['message'][:160]}")
        st = wait(lambda: _stalled("steal", "PolicyDenied"), 60, "steal Stalled (PolicyDenied)")
        assert ("spec.processing.checkpoint.pvc.claimName: PersistentVolumeClaim state-minimal-dedup-0 is not open "
                "to pipeline steal") in st["message"], st
        assert _children("steal", spark_kind) == []
        outcome("7b Spark checkpoint on claim state-minimal-dedup-0",
                f"admitted; Stalled/PolicyDenied, nothing made: {st['message'][:160]}")

        st = wait(lambda: _stalled("grab", "Conflict"), 90, "grab Stalled (Conflict)")
        assert f"Secret {TENANT_NS}/grab-dedup-token exists and is not this pipeline's" in st["message"], st
        assert _children("grab", spark_kind, but=("grab-dedup-token",)) == []
        outcome("8 pipeline grab over the admin's Secret grab-dedup-token",
                f"Stalled/Conflict, nothing made: {st['message'][:120]}")

        # -- 9: the negative control: bank-creds opened to leak, the same manifest runs -------------
        kubectl("-n", TENANT_NS, "annotate", "secret", "bank-creds", f"{OPT_IN}=leak")
        assert _tenant_apply(leak).returncode == 0  # unchanged: the next resync takes the opt-in

        # -- 10: the state endpoints of the tenant's running pipeline -------------------------------
        t = time.monotonic()
        wait(lambda: settled(TENANT_NS, "minimal"), 180, "the tenant's pipeline minimal Ready")
        log(f"hostile tenant: minimal Ready after {time.monotonic() - t:.0f}s more")
        dedup_pod = "minimal-dedup-0"
        dedup_ip = kubectl("-n", TENANT_NS, "get", "pod", dedup_pod, "-o", "jsonpath={.status.podIP}")
        token = base64.b64decode(kubectl("-n", TENANT_NS, "get", "secret", "minimal-dedup-token", "-o",
                                         "jsonpath={.data.token}")).decode()
        # Keys in its state, so that key bytes in an answer would show.
        keys = [f"tenant-key-{secrets.token_hex(8)}" for _ in range(40)]
        nodetier.python("from confluent_kafka import Producer\n"
                        f"p = Producer({{'bootstrap.servers': '{BOOTSTRAP}'}})\n"
                        f"[p.produce('tenant-events', key=k, value=b'{{}}') for k in {keys!r}]\n"
                        "assert p.flush(30) == 0")

        def consumed() -> bool:
            r = nodetier.http_raw(TENANT_NS, dedup_pod, dedup_ip, 8080, [b"GET /status HTTP/1.0\r\n\r\n"])[0]
            try:
                status = json.loads(r.get("response", b"").split(b"\r\n\r\n", 1)[1])
            except (IndexError, ValueError):
                return False
            return status.get("counts", {}).get("consumed", 0) >= len(keys)
        wait(consumed, 60, "the dedup pod to consume the keyed records", interval=2)
        wrong = secrets.token_urlsafe(32).encode()
        attacks = {"GET snapshots/0 HTTP/1.0": b"GET snapshots/0 HTTP/1.0\r\n\r\n",
                   "GET //snapshots/0 HTTP/1.1": b"GET //snapshots/0 HTTP/1.1\r\nHost: x\r\n\r\n",
                   "GET /snapshots/0 HTTP/1.1": b"GET /snapshots/0 HTTP/1.1\r\nHost: x\r\n\r\n",
                   "GET /snapshots/1 HTTP/1.1, a wrong token": (b"GET /snapshots/1 HTTP/1.1\r\nHost: x\r\n"
                                                                b"Authorization: Bearer " + wrong + b"\r\n\r\n"),
                   "GET /reshard/1/0/1 HTTP/1.1": b"GET /reshard/1/0/1 HTTP/1.1\r\nHost: x\r\n\r\n",
                   "GET /snapshots/0 (HTTP/0.9)": b"GET /snapshots/0\r\n"}
        for origin, ns, pod_name, container in (("a pod in tenant-t", TENANT_NS, "probe", None),
                                                ("a pod in tenant-x", OUTSIDE_NS, "listener", None),
                                                ("the dedup pod itself", TENANT_NS, dedup_pod, None)):
            answers = nodetier.http_raw(ns, pod_name, dedup_ip, 8080, list(attacks.values()), container=container)
            for (what, _), r in zip(attacks.items(), answers):
                line = _status_line(r)
                resp = r.get("response", b"")
                assert not r["connected"] or resp == b"" or line.split()[1] in ("400", "401"), (origin, what, line)
                assert not any(k.encode() in resp for k in keys) and b"application/octet-stream" not in resp, \
                    (origin, what, resp[:300])
                outcome(f"10 {what} from {origin}", line)
        # The token makes the difference (the pod's own state endpoint, as a peer asks it).
        authed, status = nodetier.http_raw(TENANT_NS, dedup_pod, dedup_ip, 8080, [
            b"GET /snapshots/0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode() + b"\r\n\r\n",
            b"GET /status HTTP/1.0\r\n\r\n"])
        assert _status_line(status).split()[1] == "200", _status_line(status)
        assert _status_line(authed).split()[1] not in ("400", "401", "403"), _status_line(authed)
        outcome("10 control: /snapshots/0 with the token, /status", f"{_status_line(authed)}; {_status_line(status)}")

        # -- 9 (cont.): the resync took the opt-in: leak's dedup pod runs with bank-creds -----------
        st = wait(lambda: (c := _condition("leak", "Stalled")) and c["status"] == "False" and c, 120,
                  "leak no longer stalled once bank-creds is opened to it")
        sts = kubectl_json("-n", TENANT_NS, "get", "statefulset", "leak-dedup")
        env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "BANK_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "bank-creds", "key": "password"}}} \
            in env, env
        outcome("9 control: bank-creds opened to leak", "same manifest accepted: StatefulSet leak-dedup made "
                                                        "with the secretKeyRef")

        # -- 6 (cont.): nothing reached the listener, 30 s on and after a resync ------------------------
        time.sleep(max(0.0, 30 - (time.monotonic() - t_exfil)))
        assert len(_listener_connections()) == 1, _listener_connections()
        outcome("6 after 30 s", "the listener got no connection")
        st = wait(lambda: (c := _stalled("exfil", "PolicyDenied")) and "spec.kafka.sasl.username" not in c["message"]
                  and c, 120, "a resync of exfil (the username's Secret, opened, no longer refused)")
        assert "spec.kafka.sasl.password: Secret bank-creds is not open to pipeline exfil" in st["message"], st
        assert len(_listener_connections()) == 1, _listener_connections()
        assert _children("exfil", spark_kind) == []
        outcome("6 after a resync, kafka-user opened to exfil",
                f"the listener got no connection; Stalled/PolicyDenied: {st['message'][:110]}")
        # Deletion with deletionPolicy Delete connects to Kafka too (to delete the topics the
        # operator recorded creating). A record as a pipeline has once it ran, before the tenant
        # pointed it at the listener (written here by the admin: the tenant cannot write status).
        kubectl("-n", TENANT_NS, "patch", "exactlyoncepipeline", "exfil", "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"ownedTopics": [f"{TENANT_NS}.exfil.deduped"]}}))
        res = _as_tenant("delete", "exactlyoncepipeline", "exfil", "--timeout=90s")
        assert res.returncode == 0, res.stderr

        def retained() -> list[str]:
            events = kubectl_json("-n", TENANT_NS, "get", "events", "--field-selector", "involvedObject.name=exfil")
            return [e["message"] for e in events["items"] if e.get("reason") == "TopicsRetained"
                    and "Secret bank-creds is not open to pipeline exfil" in e["message"]]
        retained = wait(retained, 30, "the event TopicsRetained naming the Secret not open to exfil")
        assert len(_listener_connections()) == 1, _listener_connections()
        outcome("6 kubectl delete (deletionPolicy Delete)",
                f"no connection; event TopicsRetained: {retained[0][:140]}")

        # -- 8 (cont.): the admin's Secret as it was, after a resync of grab ---------------------------
        time.sleep(max(0.0, RESYNC_SECONDS + 5 - (time.monotonic() - t_grab)))
        assert _stalled("grab", "Conflict")
        now = kubectl_json("-n", TENANT_NS, "get", "secret", "grab-dedup-token")
        assert now["metadata"]["resourceVersion"] == admin_secret["resourceVersion"], now["metadata"]
        assert not now["metadata"].get("ownerReferences") and now["data"] == {"token": b64(admin_token)}
        outcome("8 after a resync", f"grab-dedup-token unchanged (resourceVersion {admin_secret['resourceVersion']}, "
                                    "no ownerReference)")

        # -- 11: no Secret value in logs, events or status ---------------------------------------------
        leak_token = base64.b64decode(kubectl("-n", TENANT_NS, "get", "secret", "leak-dedup-token", "-o",
                                              "jsonpath={.data.token}")).decode()
        values = {"bank-creds password": bank_password, "minimal's token": token, "leak's token": leak_token,
                  "the admin's grab-dedup-token": admin_token}
        leader = kubectl("-n", "eopipe-system", "get", "lease", "eopipe-leader", "-o",
                         "jsonpath={.spec.holderIdentity}")
        texts = {f"operator {p}": kubectl("-n", "eopipe-system", "logs", p, "--all-containers")
                 for p in kubectl("-n", "eopipe-system", "get", "pods", "-o", "name").split()}
        assert f"operator pod/{leader}" in texts and "reconciled" in texts[f"operator pod/{leader}"], list(texts)
        wait(lambda: "Running" in kubectl("-n", TENANT_NS, "get", "pod", "leak-dedup-0", "-o",
                                          "jsonpath={.status.phase}", check=False), 90, "leak's dedup pod running",
             explain=lambda: f"{kubectl('-n', TENANT_NS, 'describe', 'pod', 'leak-dedup-0', check=False)}\n"
                             f"{kubectl('describe', 'node', check=False)[-3000:]}")
        for p in kubectl("-n", TENANT_NS, "get", "pods", "-l", LABEL_PIPELINE, "-o", "name").split():
            texts[f"tenant-t {p}"] = kubectl("-n", TENANT_NS, "logs", p, "--all-containers")
        texts["events -A"] = kubectl("get", "events", "-A", "-o", "json")
        texts["tenant-t pipelines"] = kubectl("-n", TENANT_NS, "get", "exactlyoncepipelines", "-o", "json")
        texts["listener"] = kubectl("-n", OUTSIDE_NS, "logs", "listener")
        assert any(p.startswith("tenant-t pod/leak-dedup") for p in texts) and \
            any(p.startswith("tenant-t pod/minimal-dedup") for p in texts), list(texts)
        found = [(what, where) for what, v in values.items() for where, text in texts.items()
                 for form in (v, b64(v), v.encode().hex()) if form in text]
        assert not found, found
        outcome("11 Secret values in logs/events/status",
                f"none of {len(values)} values in {len(texts)} texts ({', '.join(texts)})")
    finally:
        kubectl("-n", TENANT_NS, "delete", "exactlyoncepipelines", "--all", "--timeout=90s", check=False, timeout=120)
        kubectl("delete", "namespace", TENANT_NS, OUTSIDE_NS, "--wait=false", check=False)
        width = max((len(a) for a, _ in rows), default=0)
        log("hostile tenant: outcomes\n" + "\n".join(f"  {a:<{width}}  {r}" for a, r in rows))
        log(f"hostile tenant test: {time.monotonic() - t0:.0f}s")


def test_down_leaves_nothing_behind(node_tier):
    """Last in the module: cluster-down with a pod still running."""
    res = node_cmd("down", timeout=180)
    assert res.returncode == 0, res.stdout
    left = json.loads(node_cmd("leftovers").stdout)
    assert not any(left.values()), left
    assert not [p for p in node_tier.get("shim_sockets", []) if p.exists()]
    assert sysctls() == node_tier["sysctls"]  # the host-wide ones the kubelet sets, put back
