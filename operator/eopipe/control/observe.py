"""What a reconcile pass decides on, read from the cluster and from Kafka: the source topic's
partition count, the published assignment, the StatefulSet, the dedup pods with their /status,
and (while pausing for a re-shard) the group's committed offsets; for node loss, the dedup pods'
nodes and claims. Only reads; the decisions are control.rebalance's and control.nodeloss's,
from these facts."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from kubernetes import client

from eopipe.control import nodeloss, policy
from eopipe.control.builders.dedup import STATE_VOLUME
from eopipe.control.kube import Applier
from eopipe.control.policy import TenantPolicy
from eopipe.core import kafkaconf
from eopipe.core.assignment import CONFIGMAP_KEY, Assignment
from eopipe.core.durations import duration_ms
from eopipe.core.names import DEDUP_HTTP_PORT, Names
from eopipe.core.rebalancing import PAUSING, Facts, PodFacts, Rebalance
from eopipe.core.wire import read_status

POD_STATUS_TIMEOUT = 2.0


class Observer:
    def __init__(self, core: client.CoreV1Api, applier: Applier, kafka_timeout: float,
                 tenant_policy: TenantPolicy = TenantPolicy()):
        self.core, self.applier, self.kafka_timeout = core, applier, kafka_timeout
        self.tenant_policy = tenant_policy

    def kafka_conf(self, names: Names) -> dict[str, str]:
        """librdkafka settings of the pipeline's Kafka, credentials read from the Secrets opened to
        it. Checked here too, not only before a reconcile: deleting a pipeline connects as well."""
        if refused := policy.bootstrap_refusals(names.spec.kafka.bootstrap_servers, self.tenant_policy):
            raise kafkaconf.NotAllowed(refused[0])
        return kafkaconf.client_config(names.spec.kafka,
                                       kafkaconf.secret_reader(self.core, names.namespace, names.pipeline))

    def annotations(self, kind: str, names: Names, refs: list[tuple[str, str]]) -> dict[str, dict]:
        """The annotations of each Secret or PersistentVolumeClaim (`kind`) named in `refs` that
        exists (for policy.opt_in_refusals)."""
        read = {"Secret": self.core.read_namespaced_secret,
                "PersistentVolumeClaim": self.core.read_namespaced_persistent_volume_claim}[kind]
        out = {}
        for name in {n for _, n in refs}:
            try:
                out[name] = read(name, names.namespace).metadata.annotations or {}
            except client.ApiException as e:
                if e.status != 404:
                    raise
        return out

    def kafka_admin(self, names: Names) -> AdminClient:
        return AdminClient({**self.kafka_conf(names),
                            "socket.connection.setup.timeout.ms": int(self.kafka_timeout * 1000)})

    def stable_offsets(self, admin: AdminClient, topic: str) -> dict[int, tuple[int, int]]:
        """Per partition of `topic`: (last stable offset, high watermark). Below the high
        watermark, the LSO waits on the oldest open transaction."""
        md = admin.list_topics(topic, timeout=self.kafka_timeout).topics.get(topic)
        if md is None or md.error is not None:
            return {}
        partitions = len(md.partitions)
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        out: dict[int, list[int]] = {p: [0, 0] for p in range(partitions)}
        for i, level in enumerate((IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED)):
            futs = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, isolation_level=level,
                                      request_timeout=self.kafka_timeout)
            for tp, fut in futs.items():
                out[tp.partition][i] = fut.result().offset
        return {p: (lso, hwm) for p, (lso, hwm) in out.items()}

    def facts(self, names: Names, rb: Rebalance | None, admin: AdminClient) -> Facts:
        """The facts of one rebalance step, through the pass's admin client."""
        spec = names.spec
        md = admin.list_topics(timeout=self.kafka_timeout).topics.get(names.source_topic)
        actual = len(md.partitions) if md is not None and md.error is None and md.partitions else None
        cm = self.applier.get("v1", "ConfigMap", names.assignment_configmap, names.namespace)
        assignment = None
        if cm is not None and (cm.get("data") or {}).get(CONFIGMAP_KEY):
            assignment = Assignment.from_json(json.loads(cm["data"][CONFIGMAP_KEY]))
        sts = self.applier.get("apps/v1", "StatefulSet", names.dedup, names.namespace)
        sts_replicas = None if sts is None else int((sts.get("spec") or {}).get("replicas") or 0)
        pods = self.pods(names)
        committed = None
        if rb is not None and rb.phase == PAUSING and actual:
            committed = self.committed(names, actual)
        return Facts(
            now_ms=int(time.time() * 1000), pod_prefix=names.dedup, replicas=spec.dedup.replicas,
            partitions=spec.source.partitions, paused=bool(spec.paused), actual_partitions=actual,
            assignment=assignment, sts_replicas=sts_replicas, pods=pods, committed=committed,
            window_ms=duration_ms(spec.dedup.window))

    def pods(self, names: Names) -> dict[str, PodFacts]:
        sel = names.label_selector("dedup")
        items = self.core.list_namespaced_pod(names.namespace, label_selector=sel).items
        pods = {}
        for pod in items:
            st = pod.status
            ready = any(c.type == "Ready" and c.status == "True" for c in (st.conditions or []))
            pods[pod.metadata.name] = PodFacts(pod.metadata.name, st.pod_ip, ready, port=DEDUP_HTTP_PORT)

        def fetch(pf):
            if not pf.ip:
                return
            # None: unreachable, too big or too slow (wire.STATUS_MAX_BYTES, STATUS_READ_SECONDS),
            # or not a /status; the rebalance treats the pod as not answering.
            pf.status = read_status(f"{pf.url}/status", timeout=POD_STATUS_TIMEOUT)
        if pods:
            with ThreadPoolExecutor(min(8, len(pods))) as ex:
                list(ex.map(fetch, pods.values()))
        return pods

    def committed(self, names: Names, partitions: int) -> dict[int, int] | None:
        c = Consumer({**self.kafka_conf(names), "group.id": names.consumer_group, "enable.auto.commit": False,
                      **kafkaconf.OFFSETS_NOW})
        try:
            tps = c.committed([TopicPartition(names.source_topic, p) for p in range(partitions)],
                              timeout=self.kafka_timeout)
            return {tp.partition: tp.offset for tp in tps}
        except KafkaException:
            return None
        finally:
            c.close()

    def node_loss(self, names: Names, now_ms: int, threshold_ms: int,
                  serving: set[str], owners: dict[str, tuple[int, ...]]) -> nodeloss.Facts:
        """The facts of control/nodeloss: the dedup pods, the Nodes they and their claims are on,
        and (only for a pod whose node is not Ready, or not scheduled) its claims with the node
        their volume is pinned to. With every node Ready: one list and one get per node."""
        sel = names.label_selector("dedup")
        # Only the StatefulSet's own pods and their state claims (state-<pod>): a pod that only
        # carries the labels, or a claim it names, is never the operator's to delete.
        pods = [nodeloss.Pod(
            name=pod.metadata.name, uid=pod.metadata.uid, node=pod.spec.node_name or "",
            claims=tuple(v.persistent_volume_claim.claim_name for v in pod.spec.volumes or ()
                         if v.persistent_volume_claim is not None
                         and v.persistent_volume_claim.claim_name == f"{STATE_VOLUME}-{pod.metadata.name}"),
            deleting=pod.metadata.deletion_timestamp is not None, serving=pod.metadata.name in serving,
            partitions=owners.get(pod.metadata.name, ()))
            for pod in self.core.list_namespaced_pod(names.namespace, label_selector=sel).items
            if any(o.kind == "StatefulSet" and o.name == names.dedup and o.controller
                   for o in pod.metadata.owner_references or ())]
        nodes: dict[str, nodeloss.Node] = {}
        read: set[str] = set()

        def node(name: str) -> None:
            if name and name not in read:
                read.add(name)
                if (found := self.node(name)) is not None:
                    nodes[name] = found
        for pod in pods:
            node(pod.node)
        claims = {}
        labels: dict[str, dict[str, str]] | None = None  # every Node's, read once if a claim needs them
        for pod in pods:
            if pod.node and nodes.get(pod.node, nodeloss.Node("", "")).ready == "True":
                continue
            for name in pod.claims:
                if labels is None:
                    labels = {n.metadata.name: n.metadata.labels or {} for n in self.core.list_node().items}
                if (claim := self._claim(names.namespace, name, labels)) is not None:
                    claims[name] = claim
                    node(claim.node or "")
        return nodeloss.Facts(now_ms, threshold_ms, tuple(pods), claims, nodes)

    def node(self, name: str) -> nodeloss.Node | None:
        """The Node called `name` as control/nodeloss sees it; None when there is none."""
        try:
            n = self.core.read_node(name)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        cond = next((c for c in (n.status and n.status.conditions) or () if c.type == "Ready"), None)
        cordoned = bool(n.spec and n.spec.unschedulable)
        if cond is None:
            return nodeloss.Node(name, "", cordoned=cordoned)
        since = cond.last_transition_time
        return nodeloss.Node(name, cond.status or "", int(since.timestamp() * 1000) if since else None, cordoned)

    def _claim(self, namespace: str, name: str, labels: dict[str, dict[str, str]]) -> nodeloss.Claim | None:
        """The claim, pinned to the node its PersistentVolume's affinity names (nodeloss.pinned_node,
        from every Node's `labels`); a claim not bound yet, to the node the scheduler picked for it
        (volume.kubernetes.io/selected-node)."""
        try:
            pvc = self.core.read_namespaced_persistent_volume_claim(name, namespace)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        pinned = None
        if pvc.spec.volume_name:
            try:
                pv = self.core.read_persistent_volume(pvc.spec.volume_name)
            except client.ApiException as e:
                if e.status != 404:
                    raise
            else:
                required = pv.spec.node_affinity and pv.spec.node_affinity.required
                pinned = nodeloss.pinned_node([
                    [(x.key, x.operator, tuple(x.values or ())) for x in t.match_expressions or ()]
                    for t in (required.node_selector_terms if required else ())], labels)
        else:
            pinned = (pvc.metadata.annotations or {}).get(nodeloss.SELECTED_NODE)
        return nodeloss.Claim(name, pvc.metadata.uid, pinned, pvc.metadata.deletion_timestamp is not None)
