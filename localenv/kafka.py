"""A real single-broker Apache Kafka (KRaft) run as local processes.

The jars come from Maven (hack/fetch-kafka.sh, cached by version). Alone, it is one broker and
one KRaft controller in two processes (isolated mode, the production shape): a broker crash
leaves the controller up, as when one node of a cluster dies. Transactions are enabled on the
one broker: the offsets and transaction state topics use replication factor 1 and min ISR 1.

`restart()` keeps the data directory and the ports, so it is a real broker restart that
clients reconnect to (fault tests use this).

    python -m localenv.kafka up --workdir /tmp/k   # a broker for humans, Ctrl-C stops it
"""

from __future__ import annotations

import argparse
import base64
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from localenv import REPO_ROOT, daemon, quick_jit
from localenv.daemon import free_port  # hack/demo.py imports it from here

SESSION_TIMEOUT_MS = 3000

LOG4J2_CONFIG = """\
Configuration:
  Appenders:
    File:
      name: file
      fileName: "{log}"
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        ref: file
"""


def ensure_kafka_jars() -> Path:
    """Resolves the broker jars (cached) and returns their directory."""
    return Path(daemon.script_output(REPO_ROOT / "hack" / "fetch-kafka.sh")[-1])


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class KafkaBroker:
    """One KRaft node (broker + controller). Alone by default (`--standalone` quorum, replication
    1); localenv/kafkacluster.py starts three of them as one cluster through `node_id`,
    `voters` (the static quorum), `replication` and `client_port`/`client_advertised` (an extra
    CLIENT listener advertised at a toxiproxy port, so that clients go through the proxy while
    controller and inter-broker traffic stays direct); the node tier binds that listener to its
    node address (`client_host`)."""

    def __init__(self, workdir: Path, jars_dir: Path | None = None, *, node_id: int = 1,
                 port: int | None = None, controller_port: int | None = None, voters: str | None = None,
                 cluster_id: str | None = None, replication: int = 1, min_isr: int = 1,
                 client_port: int | None = None, client_advertised: str | None = None,
                 client_host: str = "127.0.0.1",
                 heap: str = "1g", extra: dict[str, str] | None = None, role: str | None = None):
        self.workdir = Path(workdir)
        # Alone: a broker with its own controller process; in a static quorum (kafkacluster):
        # combined broker+controller nodes.
        self.role = role or ("combined" if voters else "broker")
        self.jars_dir = jars_dir or ensure_kafka_jars()
        self.node_id = node_id
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        self.voters = voters
        self.cluster_id = cluster_id
        self.replication, self.min_isr = replication, min_isr
        self.client_port, self.client_advertised, self.client_host = client_port, client_advertised, client_host
        self.heap = heap
        self.extra = extra or {}
        self.bootstrap = f"127.0.0.1:{self.port}"  # the direct (PLAINTEXT) listener
        self.log_path = self.workdir / "server.log"
        self.stdout_path = self.workdir / "stdout.log"
        self._proc: subprocess.Popen | None = None
        self._formatted = False
        self.controller: KafkaBroker | None = None
        if self.role == "broker":
            self.cluster_id = self.cluster_id or new_cluster_id()
            self.controller = KafkaBroker(
                self.workdir / "controller", self.jars_dir, node_id=1000 + node_id, role="controller",
                controller_port=self.controller_port, cluster_id=self.cluster_id, heap="256m", extra=self.extra)

    def _java(self, main: str, *args: str, **kw) -> list[str]:
        return [
            "java", "-Xms256m", f"-Xmx{self.heap}", "-XX:+UseG1GC", *quick_jit(),
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.yaml'}",
            "-cp", f"{self.jars_dir}/*", main, *args,
        ]

    def _write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "log4j2.yaml").write_text(LOG4J2_CONFIG.format(log=self.log_path))
        controller = f"CONTROLLER://127.0.0.1:{self.controller_port}"
        quorum = ({"controller.quorum.voters": self.voters} if self.voters else
                  {"controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}"})
        common = {
            "node.id": str(self.node_id),
            **quorum,
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(self.workdir / "data"),
            # After a SIGKILL the controller waits out the old broker session before the
            # restarted broker may register: keep that short for restart fault tests.
            "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS),
            "broker.heartbeat.interval.ms": "500",
        }
        if self.role == "controller":
            props = {"process.roles": "controller", **common, "listeners": controller,
                     "listener.security.protocol.map": "CONTROLLER:PLAINTEXT", **self.extra}
        else:
            props = self._broker_props(common, controller)
        path = self.workdir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _broker_props(self, common: dict[str, str], controller: str) -> dict[str, str]:
        rf, isr = str(self.replication), str(self.min_isr)
        listeners = [f"PLAINTEXT://127.0.0.1:{self.port}"] + ([controller] if self.role == "combined" else [])
        advertised = [f"PLAINTEXT://127.0.0.1:{self.port}"]
        protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        if self.client_port:
            listeners.append(f"CLIENT://{self.client_host}:{self.client_port}")
            advertised.append(f"CLIENT://{self.client_advertised or f'{self.client_host}:{self.client_port}'}")
            protocols += ",CLIENT:PLAINTEXT"
        return {
            "process.roles": "broker,controller" if self.role == "combined" else "broker",
            **common,
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "listener.security.protocol.map": protocols,
            "inter.broker.listener.name": "PLAINTEXT",
            "num.partitions": "1",
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
            # Transactions: on one node replication 1; a cluster sets 3 / min ISR 2.
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
            # Tests create and drop many groups; don't make the first join wait 3 s.
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.flush.interval.messages": "9223372036854775807",
            **self.extra,
        }

    def _format(self, config: Path) -> None:
        # The id may start with "-": pass it glued to its option, never as a separate word.
        cluster_id = self.cluster_id or new_cluster_id()
        # Static voters have nothing to bootstrap; a broker-only node joins the controller's quorum.
        quorum = [] if self.voters or self.role == "broker" else ["--standalone"]
        subprocess.run(
            self._java("kafka.tools.StorageTool", "format", *quorum,
                       f"--cluster-id={cluster_id}", "-c", str(config)),
            check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self._formatted = True

    def launch(self) -> None:
        """Starts the process without waiting for it to serve (a cluster's nodes start together:
        none can serve before a quorum of controllers is up)."""
        if self.controller is not None and not self.controller.running:
            self.controller.launch()
        config = self._write_config()
        if not self._formatted:
            self._format(config)
        out = open(self.stdout_path, "ab")
        self._proc = subprocess.Popen(
            self._java("kafka.Kafka", str(config)),
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def start(self, timeout: float = 90) -> float:
        """Starts (or restarts) the broker; returns the seconds it took to accept clients."""
        t0 = time.monotonic()
        self.launch()
        self._wait_ready(t0 + timeout)
        elapsed = time.monotonic() - t0
        print(f"kafka {self.bootstrap} ready in {elapsed:.1f}s", file=sys.stderr)
        return elapsed

    def _wait_ready(self, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"kafka exited with {self._proc.returncode}:\n{self.tail()}")
            if _port_open(self.port):
                try:
                    md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
                    if md.brokers:
                        return
                except Exception:
                    pass
            time.sleep(0.3)
        self.stop(kill=True)
        raise TimeoutError(f"kafka not ready on {self.bootstrap}:\n{self.tail()}")

    def stop(self, kill: bool = False, timeout: float = 30, keep_controller: bool = False) -> None:
        """SIGTERM (clean shutdown) or SIGKILL (crash) of the broker, then of its controller
        unless `keep_controller`; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            daemon.stop_group(proc, timeout, signal.SIGKILL if kill else signal.SIGTERM)
        if self.controller is not None and not keep_controller:
            self.controller.stop(kill=kill, timeout=timeout)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing (a hung node)."""
        daemon.signal_group(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        daemon.signal_group(self._proc.pid, signal.SIGCONT)

    def restart(self, kill: bool = False, down_seconds: float = 0) -> float:
        """The broker goes down (the controller stays) and comes back. After a crash it stays
        down until the controller has fenced it, as a restarted pod's broker usually does: one
        that returns inside its old session serves leadership the controller then takes away
        for a moment, and Kafka's transaction coordinator skips the markers of a transaction it
        was completing for partitions with no leader ("likely deleted"), leaving it hanging
        for every read_committed reader. That is a Kafka limitation (docs/design.md, Known
        limits), not a fault eopipe can repair, so the harness does not provoke it."""
        self.stop(kill=kill, keep_controller=True)
        if kill and self.controller is not None:
            down_seconds = max(down_seconds, SESSION_TIMEOUT_MS / 1000 + 1)
        time.sleep(down_seconds)
        return self.start()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        own = "".join(daemon.last_lines(p, lines) + "\n" for p in (self.stdout_path, self.log_path) if p.exists())
        return own + (f"-- controller --\n{self.controller.tail(lines)}" if self.controller is not None else "")


def serve_up(prog: str, what: str, make, argv: list[str] | None = None) -> int:
    """`prog up --workdir DIR`: starts make(DIR), prints its bootstrap, runs until Ctrl-C/SIGTERM."""
    ap = argparse.ArgumentParser(prog=prog, description=f"Run {what} for eopipe.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start it and keep it up until Ctrl-C")
    up.add_argument("--workdir", type=Path, required=True)
    args = ap.parse_args(argv)
    kafka = make(args.workdir)
    kafka.start()
    print(f"export KAFKA_BOOTSTRAP={kafka.bootstrap}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while getattr(kafka, "running", True):
            time.sleep(1)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        kafka.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    return serve_up("python -m localenv.kafka", "a local single-node Kafka (KRaft)", KafkaBroker, argv)


if __name__ == "__main__":
    sys.exit(main())
