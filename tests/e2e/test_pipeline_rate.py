"""The pipeline at rate, as bench.pipeline_rate runs it (its docstring says what is measured and
how): examples/payments.yaml on the node tier, `eopipe load` at each rate in turn, the watcher
and the lag sampler in the tier's network, the pods' CPU from the host, and `eopipe verify` of
both stages at the end. Marked `bench`: `make test` leaves it out; the benchmark runs it with
its settings in EOPIPE_PIPELINE_RATE and reads what it measured from the file it names."""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from bench import pipeline_rate as pr
from bench import pipeline_rate_summary as summary
from eopipe.core.durations import parse_duration
from eopipe.core.names import LABEL_COMPONENT, LABEL_PIPELINE, consumer_group, deduped_topic, spark_commit_topic
from localenv import REPO_ROOT
from localenv.node import STATE_DIR
from tests.helpers.nodepipes import driver_says, install_operator, settled, start_load, verify_both_stages
from tests.helpers.nodetier import BOOTSTRAP, NODE_TESTS, PY, in_tier, kubectl, kubectl_json, log, wait

pytestmark = [*NODE_TESTS, pytest.mark.bench,
              pytest.mark.skipif(not os.environ.get(pr.SETTINGS_ENV), reason="run by python -m bench.pipeline_rate")]


def pod_cpu(ns: str, name: str) -> dict[str, dict[str, int]]:
    """{stage: {pod uid: CPU ns so far}} of the pipeline's dedup and Spark pods."""
    stages = {}
    for pod in kubectl_json("-n", ns, "get", "pods", "-l", f"{LABEL_PIPELINE}={name}")["items"]:
        labels = pod["metadata"]["labels"]
        stage = "spark" if "spark-role" in labels else "dedup" if labels.get(LABEL_COMPONENT) == "dedup" else None
        if stage:
            stages[pod["metadata"]["uid"]] = stage
    return pr.cgroup_cpu(stages)


def _start_pipeline(images: dict, trigger: str | None, spark_cpu: str | None, executor_cores: int | None) -> dict:
    """examples/payments.yaml as written (but for its trigger, its Spark pods' coreRequest and its
    executor's cores, if given), in a namespace of its own, Ready with its query running."""
    install_operator(images)
    doc = yaml.safe_load((REPO_ROOT / pr.EXAMPLE).read_text())
    if trigger:
        doc["spec"]["processing"]["trigger"] = trigger
    if spark_cpu:
        for role in ("driver", "executors"):
            doc["spec"]["processing"][role]["coreRequest"] = spark_cpu
    if executor_cores:
        doc["spec"]["processing"]["executors"]["cores"] = executor_cores
    kubectl("create", "namespace", pr.NS)
    kubectl("-n", pr.NS, "apply", "-f", "-", input=json.dumps(doc))
    t = time.monotonic()
    wait(lambda: settled(pr.NS, pr.NAME) and driver_says(pr.NS, f"{pr.NAME}-spark", "streaming query running"), 480,
         "the pipeline Ready, its streaming query running", interval=3)
    wait(lambda: "Running" in kubectl("-n", pr.NS, "get", "pods", "-l", "spark-role=executor", "-o",
                                      "jsonpath={.items[*].status.phase}"), 180, "a Spark executor Running")
    log(f"pipeline_rate: {pr.NAME} Ready, its query running, in {time.monotonic() - t:.0f}s")
    return doc


def _lags(sampler: pr.Lines, watcher: pr.Lines) -> tuple[float, float]:
    """The latest (dedup lag, Spark lag), inf before a sample."""
    from bench.node_faults_summary import lag

    sampler.new(), watcher.new()
    spark = summary.spark_points(watcher.all[-3:])
    return (lag(sampler.all[-1]) if sampler.all else math.inf, spark[-1][2] - spark[-1][1] if spark else math.inf)


def _broker_requests() -> tuple[float, str] | None:
    """The tier's broker's request counts now, or None (logged: the table then lacks them)."""
    pid = pr.broker_pid(STATE_DIR / "kafka" / "server.properties")
    try:
        if pid is None:
            raise RuntimeError("no process runs the broker's server.properties")
        return pr.broker_requests(pid)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        log(f"pipeline_rate: the broker's requests not read: {e}")
        return None


def _one_rate(rate: int, seconds: float, warmup: float, sampler: pr.Lines, watcher: pr.Lines, harness: list[int],
              drain_s: float) -> dict:
    """A load at `rate` for warmup + seconds, then the stages drained; the window's marks and CPU."""
    n = math.ceil(rate / pr.LOAD_PER_PROCESS)
    seed = random.randrange(1 << 30)  # new ids every run: a rerun's must not be duplicates of the last
    loads = [start_load(pr.SRC, str(10**9), f"{rate / n:g}", str(seed + i), f"{pr.DUP_RATIO:g}", *pr.LOAD_OPTIONS)
             for i in range(n)]
    pids = harness + [p.pid for p in loads]
    log(f"pipeline_rate: {rate:,} records/s ({n} load process{'es' * (n > 1)}): {warmup:g} s warm-up, "
        f"{seconds:g} s measured")
    try:
        time.sleep(warmup)
        # The window starts once both stages have caught up with the load (the Spark stage's first
        # batches start its Python workers), or WARMUP_CAP_S later if they do not: that is a result.
        t = time.monotonic()
        with contextlib.suppress(AssertionError):
            wait(lambda: all(x <= 2 * rate for x in _lags(sampler, watcher)), pr.WARMUP_CAP_S, "caught up",
                 interval=2)
        log(f"pipeline_rate: {rate:,}/s: window starts {time.monotonic() - t:.0f}s after the warm-up "
            f"(lags {_lags(sampler, watcher)})")
        pods = {p["metadata"]["uid"]: f'{p["metadata"]["namespace"]}/{p["metadata"]["name"]}'
                for p in kubectl_json("get", "pods", "-A")["items"]}
        req0 = _broker_requests()
        start, cpu0, m0, h0 = time.time(), pod_cpu(pr.NS, pr.NAME), pr.machine_busy(), pr.proc_seconds(pids)
        procs0 = pr.processes(pods)
        time.sleep(seconds)
        end, cpu1, m1, h1 = time.time(), pod_cpu(pr.NS, pr.NAME), pr.machine_busy(), pr.proc_seconds(pids)
        procs1 = pr.processes(pods)
        req1 = _broker_requests() if req0 else None
    finally:
        for p in loads:
            p.terminate()
        sent = [p.communicate(timeout=180) for p in loads]
    for p, (out, err) in zip(loads, sent):
        assert p.returncode == 0, f"eopipe load exited {p.returncode}: {err[-2000:]}"
    stats = [json.loads(out) for out, _ in sent]
    t = time.monotonic()

    def drained() -> bool:
        """Every record produced seen in the sink. (Not the dedup group's lag at 0: transaction
        markers at a partition's end are offsets no consumer commits past.)"""
        watcher.new()
        seen = [d for d in watcher.all if "pending" in d][-1:]
        return bool(seen and seen[0]["pending"] == 0)
    try:
        wait(drained, drain_s, "both stages drained", interval=2)
        drained_s = time.monotonic() - t
        log(f"pipeline_rate: {rate:,}/s: both stages drained {drained_s:.0f}s after the load stopped")
    except AssertionError:
        drained_s = None
        log(f"pipeline_rate: {rate:,}/s: not drained {drain_s:.0f}s after the load stopped; going on")
    cores = (os.cpu_count() or 1) / (m1[1] - m0[1])  # CPU seconds -> cores over the window
    return {"rate": rate, "window": (start, end), "cpu_ns": pr.cpu_delta(cpu0, cpu1),
            "cpu_by": summary.cpu_shares(procs0, procs1, end - start, (m1[0] - m0[0]) * cores,
                                         (m1[2] - m0[2]) * cores),
            "pods_counted": {s: len(cpu1[s]) for s in cpu1},
            "machine_cores": (m1[0] - m0[0]) * cores,
            "harness_cores": (h1 - h0) / (end - start),
            "sent": {k: sum(s.get(k, 0) for s in stats) for k in ("records", "unique", "duplicates")},
            "sent_per_s": sum(s["records"] / s["seconds"] for s in stats if s.get("seconds")),
            "requests_by": summary.request_rates(req0, req1) if req0 and req1 else None,
            "drained_s": drained_s}


def _measure(rates, seconds: float, warmup: float, work: Path) -> tuple[pr.Lines, pr.Lines, list[dict]]:
    """The sampler and the watcher in the tier's network (into files: a pipe read only at the end
    would fill and stop them), each rate in turn; their lines and the runs."""
    files = {k: work / f"{k}.jsonl" for k in ("sampler", "watcher")}
    argv = {"sampler": ("bench.node_faults", "sample", "--bootstrap", BOOTSTRAP, "--group",
                        consumer_group(pr.NS, pr.NAME), "--topic", pr.SRC, "--interval", "1"),
            "watcher": ("bench.pipeline_rate", "watch", "--bootstrap", BOOTSTRAP, "--source", pr.SRC, "--sink",
                        pr.SINK, "--deduped", deduped_topic(pr.NS, pr.NAME),
                        "--commits", spark_commit_topic(pr.NS, pr.NAME))}
    procs = []
    try:
        for k, path in files.items():
            with open(path, "w") as out, open(work / f"{k}.err", "w") as err:
                procs.append(subprocess.Popen(in_tier(PY, "-m", *argv[k]), cwd=REPO_ROOT, stdout=out, stderr=err))
        sampler, watcher = pr.Lines(files["sampler"]), pr.Lines(files["watcher"])
        wait(lambda: sampler.new() or sampler.all, 120, "the sampler's first sample")
        wait(lambda: watcher.new() or watcher.all, 120, "the watcher ready")
        runs = [_one_rate(rate, seconds, warmup, sampler, watcher, [p.pid for p in procs], max(180.0, 3 * seconds))
                for rate in rates]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    sampler.new(), watcher.new()  # the watcher's last line: the records never seen
    return sampler, watcher, runs


def test_the_pipeline_at_rate(node_tier, tmp_path):
    settings = json.loads(os.environ[pr.SETTINGS_ENV])
    rates, seconds, warmup = settings["rates"], settings["seconds"], settings["warmup"]
    doc = _start_pipeline(node_tier, settings.get("trigger"), settings.get("spark_cpu"), settings.get("executor_cores"))
    sampler, watcher, runs = _measure(rates, seconds, warmup, tmp_path)
    log("pipeline_rate: eopipe verify of both stages")
    reports = verify_both_stages(pr.NS, pr.NAME, pr.SRC, pr.SINK)
    last = next(d for d in reversed(watcher.all) if "unmatched" in d)
    pairs = [p for d in watcher.all for p in d.get("pairs", ())]
    dedup, spark = summary.dedup_points(sampler.all), summary.spark_points(watcher.all)
    rows = [summary.row({**r, "dedup": dedup, "spark": spark, "pairs": pairs, "unmatched": last["unmatched"]})
            for r in runs]
    for r, run in zip(rows, runs):
        r.update(sent=run["sent"], pods_counted=run["pods_counted"], drained_s=run["drained_s"])
    result = {"example": pr.EXAMPLE, "nodes": settings["nodes"], "dup_ratio": pr.DUP_RATIO, "seconds": seconds,
              "warmup_s": warmup, "cpus": os.cpu_count(),
              "trigger_s": parse_duration(doc["spec"]["processing"]["trigger"]).total_seconds(),
              "spark_cpu": doc["spec"]["processing"]["driver"].get("coreRequest"),
              "executor_cores": doc["spec"]["processing"]["executors"].get("cores", 1),
              "rows": rows, "verify": reports}
    log(summary.table(result))
    Path(settings["out"]).write_text(json.dumps(result))  # only from a verified run
