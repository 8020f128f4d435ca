"""The contestants of the throughput table (bench/dedup_vs_copy.py): eopipe's dedup worker, the
Python plain copier and the same copier in C (the client library's own cost), and the peers:
Java plain and transactional copiers, Kafka Streams dedup (exactly_once_v2) and Spark's
dropDuplicatesWithinWatermark (bench/peers/).

Every contestant is its own process, reads the same preloaded source topic from the start and
writes its own output topic. Timing: from process start until its consumer group has committed
the end of the source (wait_for_group, the same poll for every contestant); Spark commits no
group offsets, so it is timed until its query ends (trigger availableNow: everything that was
in the source). CPU comes from the kernel: wait4's rusage of the process, after SIGTERM (Spark's
driver waits for its JVM, so its rusage covers the JVM too). Peak RSS is the largest VmHWM in the
contestant's process tree, read from /proc while it runs (bench.common.peak_rss_mb says why not
the rusage's).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import peak_rss_mb
from eopipe.core.names import consumer_group
from eopipe.tools.verify import wait_for_group
from localenv import CACHE

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / "bench" / "peers"
SPARK_ENDED = "ended"  # bench/peers/spark_dedup.py prints it when the query has ended


@dataclass(frozen=True)
class Contestant:
    id: str
    name: str
    guarantee: str
    dedups: bool
    peer: bool
    short: str = ""  # the label in the combined table of `make bench`


PY_COPY = Contestant("copy", "plain copy (at-least-once)", "at-least-once", False, False)
EOPIPE = Contestant("dedup", "dedup worker (exactly-once)", "exactly-once", True, False)
# Keyed by a JSON field as Kafka Streams and Spark are here (they read the top-level `id`), but the
# nested copy of it, `user.id` (the preload writes both; the record key is the same id).
JSON_KEY = "json:user.id"
EOPIPE_JSON = Contestant("dedup_json", "dedup worker, key = JSON field user.id", "exactly-once", True, False)
# bench/peers/ccopy.c: the Python copier's loop on the same librdkafka, without Python.
C_COPY = Contestant("c_copy", "C plain copy, same librdkafka", "at-least-once", False, False)
JAVA_COPY = Contestant("java_copy", "Java plain copy (at-least-once)", "at-least-once", False, True,
                       "Java plain copy")
JAVA_TX_COPY = Contestant("java_tx_copy", "Java transactional copy, no dedup", "exactly-once", False, True,
                          "Java transactional copy")
KSTREAMS = Contestant("kstreams_dedup", "Kafka Streams dedup (exactly_once_v2)", "exactly-once", True, True,
                      "Kafka Streams dedup")
SPARK = Contestant("spark_dedup", "Spark dropDuplicatesWithinWatermark", "at-least-once sink", True, True,
                   "Spark dedup")
ALL = (PY_COPY, EOPIPE, EOPIPE_JSON, C_COPY, JAVA_COPY, JAVA_TX_COPY, KSTREAMS, SPARK)


def python() -> str:
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else "python3"


def java_classpath() -> str:
    """The peers' jar and its dependencies (bench/peers/build.sh: built once, cached by hash)."""
    out = subprocess.run(["bash", str(PEERS / "build.sh")], check=True, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


def c_copier() -> str:
    """bench/peers/ccopy.c built against the librdkafka the confluent-kafka wheel bundles (the
    Python contestants' own), cached by the hash of the source and that library's name. Its
    header is Debian's librdkafka-dev (installed when missing, as root), whose C API the newer
    library keeps."""
    import hashlib

    import confluent_kafka

    header = Path("/usr/include/librdkafka/rdkafka.h")
    if not header.exists():
        if os.geteuid() != 0:
            raise RuntimeError(f"the C copier needs {header} (Debian: apt-get install librdkafka-dev)")
        from localenv.node.host import ensure_packages

        ensure_packages({str(header): "librdkafka-dev"})
    libs = sorted((Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs").glob("librdkafka*.so*"))
    link = [str(libs[0]), f"-Wl,-rpath,{libs[0].parent}"] if libs else ["-lrdkafka"]  # else: a system-built wheel
    src = PEERS / "ccopy.c"
    key = hashlib.sha256(src.read_bytes() + " ".join(link).encode()).hexdigest()[:16]
    out = CACHE / f"bench-ccopy-{key}" / "ccopy"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-Wall", "-o", f"{out}.tmp", str(src), *link], check=True)
        os.replace(f"{out}.tmp", out)
    return str(out)


def spark_jars() -> Path:
    from localenv.fixtures_spark import ensure_spark_jars

    return ensure_spark_jars()


def spark_cmd(bootstrap: str, source: str, output: str, checkpoint: Path, jars: Path, *,
              partitions: int, trigger: str = "available-now", max_offsets: int | None = None) -> list[str]:
    cmd = [python(), str(PEERS / "spark_dedup.py"), "--bootstrap", bootstrap, "--source", source,
           "--output", output, "--checkpoint", str(checkpoint), "--jars", str(jars), "--trigger", trigger,
           "--partitions", str(partitions)]
    return cmd + (["--max-offsets", str(max_offsets)] if max_offsets else [])


def command(c: Contestant, bootstrap: str, source: str, output: str, work: Path, partitions: int,
            tools: dict) -> tuple[list[str], str | None]:
    """(argv, consumer group to wait for; None: wait for the process to end)."""
    if c is PY_COPY:
        group = f"bench-copy-{output}"
        return [python(), "-m", "bench.copier", "--bootstrap", bootstrap, "--source", source,
                "--output", output, "--group", group], group
    if c is C_COPY:
        group = f"bench-ccopy-{output}"
        return [tools["ccopy"], bootstrap, source, output, group], group
    if c in (EOPIPE, EOPIPE_JSON):
        key = ["--key", JSON_KEY] if c is EOPIPE_JSON else []
        return [python(), "-m", "eopipe.tools.cli", "dedup", *key, "--bootstrap", bootstrap,
                "--source-topic", source, "--output-topic", output, "--dlq-topic", output + ".dlq",
                "--pipeline", output, "--namespace", "bench",
                "--partitions", ",".join(str(p) for p in range(partitions)),
                "--state-dir", str(work / output), "--http-port", "0"], consumer_group("bench", output)
    if c is SPARK:
        return spark_cmd(bootstrap, source, output, work / f"{output}.ck", tools["spark_jars"],
                         partitions=partitions), None
    peer = {JAVA_COPY: "plain-copy", JAVA_TX_COPY: "tx-copy", KSTREAMS: "streams-dedup"}[c]
    group = f"bench-{peer}-{output}"
    # --idle-ms: a peer left behind by a dead harness exits on its own.
    return ["java", "-cp", tools["classpath"], "dev.eopipe.bench.Peer", peer, "--bootstrap", bootstrap,
            "--source", source, "--output", output, "--group", group, "--idle-ms", "60000",
            "--state-dir", str(work / f"{output}.streams")], group


def tools_for(contestants) -> dict:
    """Builds or finds what the chosen contestants need (cached after the first run)."""
    tools = {}
    if C_COPY in contestants:
        tools["ccopy"] = c_copier()
    if any(c in (JAVA_COPY, JAVA_TX_COPY, KSTREAMS) for c in contestants):
        tools["classpath"] = java_classpath()
    if SPARK in contestants:
        tools["spark_jars"] = spark_jars()
    return tools


def _ended(log: Path) -> bool:
    try:
        with open(log, "rb") as f:
            return any(line.startswith(SPARK_ENDED.encode()) for line in f)
    except OSError:
        return False


def run(c: Contestant, bootstrap: str, source: str, output: str, work: Path, partitions: int, tools: dict,
        timeout: float = 900) -> dict:
    """Runs one contestant to the end of the source: {seconds, cpu_seconds, max_rss_mb, log}."""
    cmd, group = command(c, bootstrap, source, output, work, partitions, tools)
    log = work / f"{output}.log"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    t0 = time.monotonic()
    # Own session: a failed run's leftovers (Spark's JVM) go with its process group.
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                start_new_session=True)
    exited = None  # (status, rusage) once reaped: os.wait4, never Popen.poll, which would drop the rusage
    peak_mb = 0.0

    def check():
        nonlocal exited, peak_mb
        if exited is None:
            peak_mb = max(peak_mb, peak_rss_mb(proc.pid))
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                exited = (status, ru)
        if exited is not None and (group is not None or not _ended(log)):
            raise RuntimeError(f"{c.name} exited ({exited[0]:#x}) before it was done; see {log}")
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{c.name} did not finish in {timeout:.0f}s; see {log}")
    try:
        if group is not None:
            wait_for_group(bootstrap, group, source, timeout, stop=check)
            seconds = time.monotonic() - t0
            peak_mb = max(peak_mb, peak_rss_mb(proc.pid))
            os.kill(proc.pid, signal.SIGTERM)
        else:
            while not _ended(log):
                check()
                time.sleep(0.1)
            seconds = time.monotonic() - t0
        if exited is None:
            _, status, ru = os.wait4(proc.pid, 0)
            exited = (status, ru)
    except BaseException:
        if exited is None:
            os.killpg(proc.pid, signal.SIGKILL)
            os.waitpid(proc.pid, 0)
        raise
    status, ru = exited
    if group is None and not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        raise RuntimeError(f"{c.name} ended with status {status:#x}; see {log}")
    return {"seconds": seconds, "cpu_seconds": ru.ru_utime + ru.ru_stime, "max_rss_mb": peak_mb,
            "log": str(log)}


def config_lines(log: str) -> list[str]:
    """The configuration a peer printed at start ("config k=v" lines)."""
    try:
        return [line[7:].rstrip() for line in Path(log).read_text(errors="replace").splitlines()
                if line.startswith("config ")]
    except OSError:
        return []
