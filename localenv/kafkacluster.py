"""A three-node Apache Kafka cluster (KRaft, combined mode: every node is broker and controller,
3 voters) run as local processes, with every client connection going through toxiproxy.

Production shape for the fault tests: default replication 3 and min.insync.replicas 2, the
transaction state log and the offsets topic with replication 3 (min ISR 2). Each node is a
`localenv.kafka.KafkaBroker` (one way to start a node) with three listeners:

    PLAINTEXT  127.0.0.1:<port>         inter-broker, and `direct_bootstrap` for test tooling
    CONTROLLER 127.0.0.1:<cport>        the KRaft quorum
    CLIENT     127.0.0.1:<client_port>  advertised as 127.0.0.1:<proxy_port>; toxiproxy forwards
                                        <proxy_port> -> <client_port>

so a client given `bootstrap` (the proxy ports) reaches every broker through its proxy, for the
bootstrap and for the per-broker connections the metadata names, and a toxic on node i's
proxy cuts clients off node i while replication and the quorum carry on.

    python -m localenv.kafkacluster up --workdir /tmp/k3   # for humans, Ctrl-C stops it
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from localenv.daemon import free_port
from localenv.kafka import KafkaBroker, ensure_kafka_jars, new_cluster_id, serve_up
from localenv.toxiproxy import Proxy, Toxiproxy

TXN_STATE_PARTITIONS = 4  # transaction.state.log.num.partitions, as KafkaBroker sets it


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (UTF-16 code units, 32-bit signed overflow)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def txn_state_partition(transactional_id: str, partitions: int = TXN_STATE_PARTITIONS) -> int:
    """The __transaction_state partition whose leader coordinates `transactional_id`:
    Utils.abs(id.hashCode) % partitions (TransactionStateManager.partitionFor)."""
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class KafkaCluster:
    def __init__(self, workdir: Path, nodes: int = 3, jars_dir: Path | None = None):
        self.workdir = Path(workdir)
        jars = jars_dir or ensure_kafka_jars()
        self.toxiproxy = Toxiproxy(self.workdir / "toxiproxy")
        ports = [(free_port(), free_port(), free_port(), free_port()) for _ in range(nodes)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_, c, _, _) in enumerate(ports))
        cluster_id = new_cluster_id()
        self.proxy_ports = {i + 1: pp for i, (_, _, _, pp) in enumerate(ports)}
        self.nodes: dict[int, KafkaBroker] = {}
        for i, (port, cport, client, proxy) in enumerate(ports):
            nid = i + 1
            self.nodes[nid] = KafkaBroker(
                self.workdir / f"node-{nid}", jars, node_id=nid, port=port, controller_port=cport,
                voters=voters, cluster_id=cluster_id, replication=min(3, nodes), min_isr=min(2, nodes),
                client_port=client, client_advertised=f"127.0.0.1:{proxy}", heap="512m",
                extra={
                    # Tests lower transaction.timeout.ms: have the coordinator abort promptly.
                    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
                    "replica.lag.time.max.ms": "5000",
                })
        self.bootstrap = ",".join(f"127.0.0.1:{p}" for p in self.proxy_ports.values())  # via toxiproxy
        self.direct_bootstrap = ",".join(n.bootstrap for n in self.nodes.values())
        self.proxies: dict[int, Proxy] = {}

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, timeout: float = 120) -> float:
        t0 = time.monotonic()
        if not self.proxies:
            self.toxiproxy.start()
            for nid, n in self.nodes.items():
                self.proxies[nid] = self.toxiproxy.create(f"kafka-{nid}", self.proxy_ports[nid], n.client_port)
        for n in self.nodes.values():
            if not n.running:
                n.launch()
        for n in self.nodes.values():
            n._wait_ready(t0 + timeout)
        self.wait_brokers(len(self.nodes), t0 + timeout)
        elapsed = time.monotonic() - t0
        print(f"kafka cluster {self.bootstrap} (direct {self.direct_bootstrap}) ready in {elapsed:.1f}s",
              file=sys.stderr)
        return elapsed

    def stop(self) -> None:
        majority = len(self.nodes) // 2 + 1
        for n in self.nodes.values():
            if n.running:
                n.resume()  # a paused node must be able to take its SIGTERM
            # A clean shutdown needs the quorum: the last node of three would wait out its whole
            # timeout (30 s) for a controller that is gone, so it is killed instead.
            n.stop(kill=sum(m.running for m in self.nodes.values()) < majority)
        self.toxiproxy.stop()

    def node(self, nid: int) -> KafkaBroker:
        return self.nodes[nid]

    def kill(self, nid: int) -> None:
        self.nodes[nid].stop(kill=True)

    def stop_node(self, nid: int) -> None:
        self.nodes[nid].stop()

    def pause(self, nid: int) -> None:
        self.nodes[nid].pause()

    def resume(self, nid: int) -> None:
        self.nodes[nid].resume()

    def restart(self, nid: int, kill: bool = False, down_seconds: float = 0) -> None:
        n = self.nodes[nid]
        n.stop(kill=kill)
        time.sleep(down_seconds)
        n.start()

    def ensure_all_running(self, timeout: float = 120) -> None:
        """After a test that stopped nodes: every node up again, every proxy healed."""
        self.toxiproxy.heal_all()
        for n in self.nodes.values():
            if n.running:
                n.resume()
        if not all(n.running for n in self.nodes.values()):
            self.start(timeout)

    # -- who leads what ---------------------------------------------------------------------------
    def admin(self):
        from confluent_kafka.admin import AdminClient

        live = ",".join(n.bootstrap for n in self.nodes.values() if n.running)
        return AdminClient({"bootstrap.servers": live or self.direct_bootstrap})

    def wait_brokers(self, count: int, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                if len(self.admin().list_topics(timeout=5).brokers) >= count:
                    return
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.3)
        raise TimeoutError(f"fewer than {count} brokers registered")

    def leader(self, topic: str, partition: int, timeout: float = 30) -> int:
        """Node id of the partition's current leader (waits while it has none)."""
        deadline = time.monotonic() + timeout
        while True:
            md = self.admin().list_topics(topic, timeout=10).topics.get(topic)
            if md is not None and md.error is None and partition in md.partitions:
                leader = md.partitions[partition].leader
                if leader >= 0:
                    return leader
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}[{partition}] has no leader")
            time.sleep(0.3)

    def isr(self, topic: str, partition: int) -> list[int]:
        md = self.admin().list_topics(topic, timeout=10).topics[topic]
        return list(md.partitions[partition].isrs)

    def wait_isr(self, topic: str, size: int = 3, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            md = self.admin().list_topics(topic, timeout=10).topics.get(topic)
            if md is not None and md.error is None and md.partitions and all(
                    len(p.isrs) >= size for p in md.partitions.values()):
                return
            time.sleep(0.5)
        raise TimeoutError(f"{topic}: ISR below {size}")

    def coordinator(self, transactional_id: str) -> int:
        """Node id of the transaction coordinator of `transactional_id` (confluent-kafka has no
        describe_transactions: it is the leader of the id's __transaction_state partition)."""
        return self.leader("__transaction_state", txn_state_partition(transactional_id))


def main(argv: list[str] | None = None) -> int:
    return serve_up("python -m localenv.kafkacluster", "a local three-node Kafka (KRaft) behind toxiproxy",
                    KafkaCluster, argv)


if __name__ == "__main__":
    sys.exit(main())
