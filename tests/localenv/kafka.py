"""A real single-node Apache Kafka broker (KRaft) run as a local process.

The jars come from Maven (hack/fetch-kafka.sh, cached by version). The broker is formatted in
its own directory, listens on free loopback ports and has transactions enabled on one node:
the offsets and transaction state topics use replication factor 1 and min ISR 1.

`stop()` / `start()` keep the data directory and the ports, so a restart is a real broker
restart that clients reconnect to (fault tests use this).

    python -m tests.localenv.kafka up --workdir /tmp/k   # a broker for humans, Ctrl-C stops it
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_kafka_jars() -> Path:
    """Resolves the broker jars (cached) and returns their directory."""
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "hack" / "fetch-kafka.sh")],
        check=True, stdout=subprocess.PIPE, text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class KafkaBroker:
    def __init__(self, workdir: Path, jars_dir: Path | None = None):
        self.workdir = Path(workdir)
        self.jars_dir = jars_dir or ensure_kafka_jars()
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log_path = self.workdir / "server.log"
        self.stdout_path = self.workdir / "stdout.log"
        self._proc: subprocess.Popen | None = None
        self._formatted = False

    def _java(self, main: str, *args: str, **kw) -> list[str]:
        return [
            "java", "-Xms256m", "-Xmx1g", "-XX:+UseG1GC",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.yaml'}",
            "-cp", f"{self.jars_dir}/*", main, *args,
        ]

    def _write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "log4j2.yaml").write_text(LOG4J2_CONFIG.format(log=self.log_path))
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.workdir / "data"),
            "num.partitions": "1",
            "default.replication.factor": "1",
            # Transactions on one node.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Tests create and drop many groups; don't make the first join wait 3 s.
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            # After a SIGKILL the controller waits out the old broker session before the
            # restarted broker may register: keep that short for restart fault tests.
            "broker.session.timeout.ms": "3000",
            "broker.heartbeat.interval.ms": "500",
            "log.flush.interval.messages": "9223372036854775807",
        }
        path = self.workdir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _format(self, config: Path) -> None:
        # The id may start with "-": pass it glued to its option, never as a separate word.
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "--standalone",
                       f"--cluster-id={cluster_id}", "-c", str(config)),
            check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self._formatted = True

    def start(self, timeout: float = 90) -> float:
        """Starts (or restarts) the broker; returns the seconds it took to accept clients."""
        t0 = time.monotonic()
        config = self._write_config()
        if not self._formatted:
            self._format(config)
        out = open(self.stdout_path, "ab")
        self._proc = subprocess.Popen(
            self._java("kafka.Kafka", str(config)),
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
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

    def stop(self, kill: bool = False, timeout: float = 30) -> None:
        """SIGTERM (clean shutdown) or SIGKILL (crash); idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def restart(self, kill: bool = False, down_seconds: float = 0) -> float:
        self.stop(kill=kill)
        time.sleep(down_seconds)
        return self.start()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        text = ""
        for p in (self.stdout_path, self.log_path):
            if p.exists():
                text += "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) + "\n"
        return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.localenv.kafka",
                                 description="Run a local single-node Kafka (KRaft) for eopipe.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a broker and keep it up until Ctrl-C")
    up.add_argument("--workdir", type=Path, required=True)
    args = ap.parse_args(argv)
    broker = KafkaBroker(args.workdir)
    broker.start()
    print(f"export KAFKA_BOOTSTRAP={broker.bootstrap}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while broker.running:
            time.sleep(1)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
