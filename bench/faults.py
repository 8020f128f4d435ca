"""The faults of bench.recovery and the brokers they hit.

The recovery step runs on a broker of its own (it kills it): localenv's KafkaBroker (one broker,
its KRaft controller in a second process, so a broker crash leaves the quorum up) with an extra
CLIENT listener advertised at a toxiproxy port; or, with --brokers 3, localenv's three-node
cluster (FaultCluster: every node broker and controller, replication 3, min ISR 2, each node
behind a proxy of its own). The worker is given the proxy's address, so
every connection it makes (bootstrap and the broker the metadata names) goes through toxiproxy;
the load, the lag sampling and verify use the direct listener, so a toxic cuts off only the
worker, as a network partition between a dedup pod and Kafka would.

Each fault blocks from its start to its end and returns nothing:
  worker_kill   SIGKILL of the worker, then the same command again at once (a pod restart
                without the kubelet's back-off); end = the new process started
  broker_kill   SIGKILL of the broker, down until the controller fenced it (KafkaBroker.restart,
                whose docstring says why), then started again; end = it accepts clients.
                Three brokers: SIGKILL of the node coordinating the worker's transactional id
                (the coordinator its commits wait for), down CLUSTER_DOWN_S, then started again
  partition     the worker's connections (to every broker) blackholed (toxiproxy `timeout` toxic, timeout 0 both
                ways: nothing passes, nothing is closed) for `hold` s, then healed; end = heal
  worker_pause  SIGSTOP of the worker for `hold` s, then SIGCONT; end = SIGCONT
`hold` is longer than the worker's transaction timeout: its open transaction is aborted by the
broker meanwhile, and the worker has to notice and start over by itself.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from bench.common import REPO, Worker, free_port

# The broker aborts timed-out transactions every second (Kafka's default: 10 s), in scale with
# the short transaction timeout the step gives the worker (as localenv/kafkacluster.py does).
BROKER_EXTRA = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}


class FaultBroker:
    """A broker and a toxiproxy in front of it for the worker; `bootstrap` is the direct
    listener, `worker_bootstrap` the proxy."""

    replication = 1

    def __init__(self, workdir: Path):
        sys.path.insert(0, str(REPO))
        from localenv.kafka import KafkaBroker
        from localenv.toxiproxy import Toxiproxy

        self.toxiproxy = Toxiproxy(workdir / "toxiproxy")
        self.proxy_port = free_port()
        self.kafka = KafkaBroker(workdir / "kafka", client_port=free_port(),
                                 client_advertised=f"127.0.0.1:{self.proxy_port}", extra=BROKER_EXTRA)
        self.bootstrap = self.kafka.bootstrap
        self.worker_bootstrap = f"127.0.0.1:{self.proxy_port}"
        self.proxy = None

    def start(self) -> None:
        self.toxiproxy.start()
        self.proxy = self.toxiproxy.create("kafka", self.proxy_port, self.kafka.client_port)
        self.kafka.start()

    def stop(self) -> None:
        try:
            self.kafka.stop(kill=True)  # its data goes with the work directory
        finally:
            self.toxiproxy.stop()

    def kill_restart(self, txid: str) -> None:
        self.kafka.restart(kill=True)

    def blackhole(self) -> None:
        self.proxy.blackhole()

    def heal(self) -> None:
        self.proxy.heal()


# A combined-mode node of the cluster is its own controller: down this long, its session (3 s)
# has expired and the others took its leaderships, as in test_faults' broker kill.
CLUSTER_DOWN_S = 10.0


class FaultCluster:
    """localenv's three-node cluster, its own: `bootstrap` the direct listeners, the worker's
    through the nodes' proxies. Topics on it get replication 3."""

    replication = 3

    def __init__(self, workdir: Path):
        sys.path.insert(0, str(REPO))
        from localenv.kafkacluster import KafkaCluster

        self.cluster = KafkaCluster(workdir / "kafka3")
        self.bootstrap = self.cluster.direct_bootstrap
        self.worker_bootstrap = self.cluster.bootstrap

    def start(self) -> None:
        self.cluster.start()

    def stop(self) -> None:
        self.cluster.stop()

    def kill_restart(self, txid: str) -> None:
        nid = self.cluster.coordinator(txid)
        self.cluster.kill(nid)
        time.sleep(CLUSTER_DOWN_S)
        self.cluster.node(nid).start()

    def blackhole(self) -> None:
        for p in self.cluster.proxies.values():
            p.blackhole()

    def heal(self) -> None:
        self.cluster.toxiproxy.heal_all()


Env = FaultBroker | FaultCluster


def worker_kill(env: Env, w: Worker, hold: float) -> None:
    w.kill()
    w.start()


def broker_kill(env: Env, w: Worker, hold: float) -> None:
    env.kill_restart(f"{w.group}.0")  # partition 0's transactional id (eopipe.core.names)


def partition(env: Env, w: Worker, hold: float) -> None:
    env.blackhole()
    try:
        time.sleep(hold)
    finally:
        env.heal()


def worker_pause(env: Env, w: Worker, hold: float) -> None:
    w.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(hold)
    finally:
        w.proc.send_signal(signal.SIGCONT)


ACTIONS = {"worker_kill": worker_kill, "broker_kill": broker_kill, "partition": partition,
           "worker_pause": worker_pause}
