"""Pipelines driven through the operator under load: their topics, a paced load with resends,
probes of the dedup pods, and the end-to-end verification (tests/e2e)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

from eopipe.core.names import deduped_topic, dlq_topic
from localenv.fixtures_operator import wait_for
from tests.helpers.pipelines import condition, example_manifest, get_pipeline, kubectl_apply
from tests.helpers.workers import Pipeline, resend_all_to  # noqa: F401 - the e2e tests' import


def wait_until(fn, timeout=90, what="condition", interval=0.3):
    return wait_for(fn, timeout, interval, what)


class Load:
    """run_load in a thread with a rate: continuous load with duplicates, `count` records or
    until `stop()`."""

    def __init__(self, bootstrap, topic, count, rate, seed):
        from eopipe.tools.loadgen import run_load
        self.result: dict = {}
        self._stop = threading.Event()

        def run():
            try:
                self.result.update(run_load(bootstrap, topic, count, dup_ratio=0.3,
                                            wrong_partition_ratio=0.05, rate=rate, seed=seed,
                                            stop=self._stop))
            except BaseException as e:  # noqa: BLE001
                self.result["error"] = e
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def stop(self) -> dict:
        """Ends a load that must have lasted through what the test did under it."""
        assert self.thread.is_alive(), "the load ended before the faults did: raise its count"
        self._stop.set()
        return self.finish()

    def finish(self, timeout=300) -> dict:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "load did not finish"
        if "error" in self.result:
            raise self.result["error"]
        return self.result


class _Probe(Pipeline):
    """Only Pipeline's read-based drain check, for a pipeline the operator runs."""

    def __init__(self, bootstrap, source, partitions, group):
        self.bootstrap, self.source, self.partitions, self._group = bootstrap, source, partitions, group

    @property
    def group(self) -> str:
        return self._group


class Pipe:
    def __init__(self, operator, kube_api, bootstrap, ns, name="minimal", **spec):
        self.cp, self.kube_api, self.bootstrap, self.ns, self.name = operator.cp, kube_api, bootstrap, ns, name
        self.topic = f"rb-{ns}"
        self.doc = example_manifest("minimal.yaml", bootstrap, **{"source.topic": self.topic, **spec})
        kubectl_apply(self.cp, ns, self.doc)

    def get(self) -> dict:
        return get_pipeline(self.kube_api, self.ns, self.name)

    def set(self, check=True, **spec):
        for path, value in spec.items():
            node = self.doc["spec"]
            *parents, last = path.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = value
        return kubectl_apply(self.cp, self.ns, self.doc, check=check)

    def settled(self, last_id=None):
        obj = self.get()
        st = obj.get("status") or {}
        ok = (condition(obj, "Ready").get("status") == "True" and st.get("phase") == "Running"
              and st.get("observedGeneration") == obj["metadata"]["generation"] and not st.get("rebalance")
              and (last_id is None or (st.get("lastRebalance") or {}).get("id", -1) > last_id))
        return obj if ok else None

    def wait_settled(self, last_id=None, timeout=240):
        return wait_for(lambda: self.settled(last_id), timeout, interval=1,
                        what=f"pipeline settled after rebalance > {last_id}: "
                             f"{json.dumps((self.get().get('status') or {}).get('rebalance'))[:400]}")

    def rebalance(self) -> dict:
        return (self.get().get("status") or {}).get("rebalance") or {}

    def wait_phase(self, phases, timeout=180) -> dict:
        return wait_for(lambda: (rb := self.rebalance()).get("phase") in phases and rb, timeout, interval=0.3,
                        what=f"rebalance phase in {phases}")

    def pod_status(self, pod: str) -> dict | None:
        from kubernetes import client as k
        try:
            ip = k.CoreV1Api(self.kube_api).read_namespaced_pod(pod, self.ns).status.pod_ip
            with urllib.request.urlopen(f"http://{ip}:8080/status", timeout=2) as r:
                return json.loads(r.read())
        except Exception:  # noqa: BLE001
            return None

    def group(self) -> str:
        return f"{self.ns}.{self.name}.dedup"

    def wait_drained(self, timeout=240):
        from confluent_kafka.admin import AdminClient as _A

        n = len(_A({"bootstrap.servers": self.bootstrap}).list_topics(self.topic, timeout=10)
                .topics[self.topic].partitions)
        probe = _Probe(self.bootstrap, self.topic, n, self.group())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if Pipeline.committed_and_drained(probe):
                return
            time.sleep(1)
        raise AssertionError(f"dedup stage did not drain {self.topic} in {timeout}s")

    def verify(self):
        from eopipe.core.keys import KeySpec
        from eopipe.tools.verify import verify
        rep = verify(self.bootstrap, self.topic, deduped_topic(self.ns, self.name), key_spec=KeySpec(),
                     dlq_topic=dlq_topic(self.ns, self.name), settle=5, timeout=300)
        print(rep.line())
        return rep


def assert_verified(rep, unique: int | None = None):
    assert rep.lost == 0 and rep.duplicated == 0 and rep.unexpected == 0, rep.line()
    if unique is not None:
        assert rep.out == rep.unique_in == unique, rep.line()
