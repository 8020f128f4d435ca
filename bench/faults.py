"""The faults of bench.recovery and the broker they hit.

The recovery step runs on a broker of its own (it kills it): localenv's KafkaBroker (one broker,
its KRaft controller in a second process, so a broker crash leaves the quorum up) with an extra
CLIENT listener advertised at a toxiproxy port. The worker is given the proxy's address, so
every connection it makes (bootstrap and the broker the metadata names) goes through toxiproxy;
the load, the lag sampling and verify use the direct listener, so a toxic cuts off only the
worker, as a network partition between a dedup pod and Kafka would.

Each fault blocks from its start to its end and returns nothing:
  worker_kill   SIGKILL of the worker, then the same command again at once (a pod restart
                without the kubelet's back-off); end = the new process started
  broker_kill   SIGKILL of the broker, down until the controller fenced it (KafkaBroker.restart,
                whose docstring says why), then started again; end = it accepts clients
  partition     the worker's connections blackholed (toxiproxy `timeout` toxic, timeout 0 both
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


def worker_kill(env: FaultBroker, w: Worker, hold: float) -> None:
    w.kill()
    w.start()


def broker_kill(env: FaultBroker, w: Worker, hold: float) -> None:
    env.kafka.restart(kill=True)


def partition(env: FaultBroker, w: Worker, hold: float) -> None:
    env.proxy.blackhole()
    try:
        time.sleep(hold)
    finally:
        env.proxy.heal()


def worker_pause(env: FaultBroker, w: Worker, hold: float) -> None:
    w.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(hold)
    finally:
        w.proc.send_signal(signal.SIGCONT)


ACTIONS = {"worker_kill": worker_kill, "broker_kill": broker_kill, "partition": partition,
           "worker_pause": worker_pause}
