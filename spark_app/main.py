"""eopipe's Spark job: deduped topic -> the pipeline's SQL (and optional Python) transform -> sink.

Run it as the SparkApplication's main file (`spark-submit .../spark_app/main.py --config-json
'...'`), or as a module (`python -m spark_app.main --config FILE`) with pyspark installed; then
the master defaults to local[2,4] (two cores, up to four attempts per task) and the Kafka
connector jars are taken from EOPIPE_SPARK_JARS (a folder or a comma-separated list).

Exit status: 0 when the query ends on its own (trigger availableNow) or on SIGTERM; 1 when the
query fails (the SparkApplication restarts OnFailure and resumes from the checkpoint); 2 for
a bad configuration, including a schema or SQL that Spark cannot analyse, at once and without
retrying (the same configuration fails the same way), for a changed query that Spark
refuses to run on its checkpoint's state, and for a query without a checkpoint over a sink a
stateful query wrote to (upgrade.py: the reason starts "checkpoint refused:" and names the
upgradeMode that would run it). The reasons go to stderr and, for 1 and
2, to the termination log ($EOPIPE_TERMINATION_LOG, else Kubernetes' /dev/termination-log when
the container has one), where the driver pod's status shows them and the operator reads them.

Reading: `kafka.isolation.level=read_committed` (only what the dedup stage committed),
`failOnDataLoss=true` (offsets that vanished, e.g. by retention, stop the job instead of being
skipped silently). Stateful transforms keep their state in the RocksDB state store provider;
all progress is in `checkpoint_location`, which must be durable (a PVC path or an object
store URI) for the exactly-once guarantee to survive the loss of the driver's pod.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
import tempfile
import time
import zipfile
from pathlib import Path

if not __package__:  # run as a file by spark-submit: make `spark_app` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spark_app.config import META_COLUMNS, Config, ConfigError, FileSink, KafkaSink, load  # noqa: E402
from spark_app.progress import PORT_LINE, Progress, listen, probe, serve  # noqa: E402
from spark_app.sink_units import UnsupportedPlan  # noqa: E402
from spark_app.upgrade import CHECKPOINT_REFUSED, CheckpointRefused, refusal  # noqa: E402

RUNNING_LINE = "eopipe-spark: streaming query running"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
JARS_ENV = "EOPIPE_SPARK_JARS"
TERMINATION_LOG_ENV = "EOPIPE_TERMINATION_LOG"
TERMINATION_LOG = "/dev/termination-log"  # the container's default terminationMessagePath
TERMINATION_LOG_MAX = 4096  # what the kubelet keeps of it


def log(msg: str) -> None:
    print(f"eopipe-spark: {msg}", file=sys.stderr, flush=True)


def write_termination_log(text: str) -> None:
    """Why the driver ends, where Kubernetes puts it in the container's status (terminated.message)."""
    path = os.environ.get(TERMINATION_LOG_ENV) or (TERMINATION_LOG if os.path.exists(TERMINATION_LOG) else None)
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.encode("utf-8")[:TERMINATION_LOG_MAX].decode("utf-8", "ignore"))
    except OSError as e:  # not worth failing over: stderr has the same
        log(f"termination log {path}: {e}")


def _analysis_error(e: BaseException) -> bool:
    """Spark could not analyse the query (AnalysisException, of which ParseException is one)."""
    from pyspark.errors import AnalysisException

    return isinstance(e, AnalysisException)


def _refused_plan(error: str) -> str | None:
    """The exactly-once sink's reason for refusing the query's plan, from Spark's wrapping of
    the foreachBatch error, or None."""
    m = re.search(rf"{UnsupportedPlan.__name__}: (.+)", error)
    return m.group(1).strip() if m else None


def _jars_from_env() -> str | None:
    spec = os.environ.get(JARS_ENV)
    if not spec:
        return None
    if os.path.isdir(spec):
        return ",".join(str(p) for p in sorted(Path(spec).glob("*.jar")))
    return spec


def java_kafka_options(cfg: Config) -> dict[str, str]:
    """The source's Java client options (`kafka.` prefix) from librdkafka-style settings.

    Most names are shared; librdkafka's sasl.username/password and ssl.ca.pem have Java
    equivalents that are spelt differently."""
    conf = dict(cfg.kafka)
    user, password = conf.pop("sasl.username", None), conf.pop("sasl.password", None)
    if user is not None and "sasl.jaas.config" not in conf:
        mech = conf.get("sasl.mechanism", "PLAIN").upper()
        module = ("org.apache.kafka.common.security.scram.ScramLoginModule"
                  if mech.startswith("SCRAM") else
                  "org.apache.kafka.common.security.plain.PlainLoginModule")
        esc = lambda s: (s or "").replace("\\", "\\\\").replace('"', '\\"')  # noqa: E731
        conf["sasl.jaas.config"] = f'{module} required username="{esc(user)}" password="{esc(password)}";'
    ca = conf.pop("ssl.ca.pem", None)
    if ca is not None:
        conf["ssl.truststore.type"] = "PEM"
        conf["ssl.truststore.certificates"] = ca
    ca_file = conf.pop("ssl.ca.location", None)
    if ca_file is not None:
        conf["ssl.truststore.type"] = "PEM"
        conf["ssl.truststore.location"] = ca_file
    return {f"kafka.{k}": v for k, v in conf.items()}


def build_session(cfg: Config):
    from pyspark.sql import SparkSession

    standalone = "PYSPARK_GATEWAY_PORT" not in os.environ  # not launched by spark-submit
    b = SparkSession.builder.appName(f"eopipe-{cfg.namespace}-{cfg.pipeline}")
    if standalone:
        # Python workers run the interpreter that runs us (the one with confluent-kafka).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        b = b.master(cfg.spark_conf.get("spark.master", "local[2,4]"))
        jars = _jars_from_env()
        if jars:
            b = b.config("spark.jars", jars)
        # Quick start for small local runs; spark-submit users set their own.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        b = (b.config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", cfg.spark_conf.get("spark.driver.memory", "1g"))
             .config("spark.sql.shuffle.partitions", "2"))
    for k, v in cfg.spark_conf.items():
        if k != "spark.master":
            b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("EOPIPE_SPARK_LOG_LEVEL", "WARN"))
    launch = spark.sparkContext.getConf()
    # The state store is fixed at the query's first run (kept in the checkpoint); RocksDB keeps
    # large state off the JVM heap and commits incrementally (changelog checkpointing).
    if not launch.contains("spark.sql.streaming.stateStore.providerClass"):
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
    if not launch.contains("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"):
        spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    # Task partitioning of a micro-batch must be a function of its logged offsets only (see
    # sink_kafka.py); adaptive execution could coalesce partitions from runtime statistics.
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    _ship_package(spark)
    return spark


def _ship_package(spark) -> None:
    """Executors unpickle the sink's task function by reference to `spark_app.sink_kafka`
    (and a transform's UDFs by their module), so they must import spark_app: ship it."""
    pkg = Path(__file__).resolve().parent
    out = Path(tempfile.mkdtemp(prefix="eopipe-spark-")) / "spark_app.zip"
    with zipfile.ZipFile(out, "w") as z:
        for p in sorted(pkg.rglob("*.py")):
            z.write(p, Path("spark_app") / p.relative_to(pkg))
    spark.sparkContext.addPyFile(str(out))


def events_view(spark, cfg: Config, starting: str | None = None):
    """The streaming DataFrame behind the view `events`: JSON fields + Kafka metadata.
    `starting`: startingOffsets if not the config's (used only without a checkpoint)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    try:
        schema = StructType.fromDDL(cfg.schema)
    except Exception as e:  # noqa: BLE001 - ParseException, or another type for a DDL that is not a struct
        raise ConfigError([f"schema: {cfg.schema!r} is not a DDL column list: {_first_line(e)}"]) from None
    clash = sorted(set(schema.fieldNames()) & set(META_COLUMNS))
    if clash:
        raise ConfigError([f"schema: field(s) {', '.join(clash)} clash with the Kafka metadata "
                           f"columns {', '.join(META_COLUMNS)} of the events view"])
    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", cfg.bootstrap)
              .option("subscribe", cfg.source_topic)
              .option("startingOffsets", starting or cfg.starting_offsets)
              .option("failOnDataLoss", "true")
              .option("kafka.isolation.level", "read_committed"))
    # A task's pooled consumer can still have a fetch in flight from the previous batch, which
    # the broker holds up to fetch.max.wait.ms (Java default 500) while no new record arrives;
    # the task's first fetch waits behind it. The ranges tasks read always hold records (they
    # end at or below the last stable offset), so a short wait costs nothing.
    reader = reader.option("kafka.fetch.max.wait.ms", "10")
    for k, v in java_kafka_options(cfg).items():
        reader = reader.option(k, v)
    if cfg.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(cfg.max_offsets_per_trigger))
    raw = reader.load()
    parsed = raw.select(
        F.col("key").cast("string").alias("key"), "partition", "offset", "timestamp",
        F.from_json(F.col("value").cast("string"), schema).alias("_v"),
    ).select("key", "partition", "offset", "timestamp", "_v.*")
    if cfg.watermark is not None:
        if cfg.watermark.column not in parsed.columns:
            raise ConfigError([f"watermark.column: {cfg.watermark.column!r} is not a column of "
                               f"events ({', '.join(parsed.columns)})"])
        parsed = parsed.withWatermark(cfg.watermark.column, cfg.watermark.delay)
    return parsed


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def build_query_frame(spark, cfg: Config, starting: str | None = None):
    events = events_view(spark, cfg, starting)
    events.createOrReplaceTempView("events")
    try:
        result = spark.sql(cfg.sql)
    except Exception as e:  # noqa: BLE001 - AnalysisException, ParseException: planning has no I/O, all are the SQL's
        raise ConfigError([f"sql: {_first_line(e)}"]) from None
    if cfg.transform:
        mod_name, fn_name = cfg.transform.split(":")
        try:
            fn = getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError) as e:
            raise ConfigError([f"transform: cannot load {cfg.transform}: {e}"]) from None
        result = fn(result)
    if not getattr(result, "isStreaming", False):
        raise ConfigError(["sql: the result is not a streaming query over `events`"])
    return result


def _kafka_topics_exist(cfg: Config, wait_seconds: float = 30) -> None:
    from confluent_kafka.admin import AdminClient

    need = [cfg.source_topic] + ([cfg.sink.topic, cfg.sink.commit_topic]
                                 if isinstance(cfg.sink, KafkaSink) else [])
    admin = AdminClient(cfg.kafka_client_config())
    # Topics just created (by the operator, a moment ago) may not be in every broker's metadata
    # yet: look again for a while rather than spend a driver restart on it.
    deadline = time.monotonic() + wait_seconds
    while True:
        md = admin.list_topics(timeout=max(1.0, deadline - time.monotonic()))
        missing = [t for t in need if t not in md.topics or md.topics[t].error is not None]
        if not missing:
            return
        if time.monotonic() >= deadline:
            # Not a config error: the operator may still be creating them. Fail (exit 1) and let
            # the restart policy try again.
            raise RuntimeError(f"topic(s) missing: {', '.join(missing)}")
        time.sleep(1)


def _starting_offsets(spark, cfg: Config, unplanned: bool) -> str | None:
    """Where a query with no checkpoint (`unplanned`: no batch planned there) starts over a Kafka
    sink that holds output already: where the sink's markers say each source partition's records
    are written up to (sink_position.py), unless upgradeMode is reprocess (upgrade.choose_start).
    None: the config's startingOffsets."""
    from spark_app.sink_position import end_offsets, plan_start, read_markers
    from spark_app.upgrade import choose_start

    if not isinstance(cfg.sink, KafkaSink) or not unplanned:
        return None
    markers, plan = [], None
    if cfg.upgrade_mode != "reprocess":
        try:
            markers = read_markers(cfg.kafka_client_config(), cfg.sink.commit_topic)
        except ValueError as e:  # a value no sink of ours wrote: a restart reads it again
            raise ConfigError([f"sink.commit_topic: {e}"]) from None
    if markers:
        plan = plan_start(markers, cfg.source_topic, end_offsets(cfg.kafka_client_config(), cfg.source_topic),
                          cfg.starting_offsets)
        if plan.problems:  # as lasting as the markers: stop with the reason rather than restart
            raise ConfigError([f"sink.commit_topic: no checkpoint, and the sink's markers do not say where "
                               f"to start: {p}" for p in plan.problems])
    rangeless = sum(1 for m in markers if not m.get("source"))
    start = choose_start(cfg.upgrade_mode, len(markers), rangeless, plan and plan.from_markers,
                         plan and plan.spark_json(cfg.source_topic), cfg.starting_offsets)
    if start.problem:
        raise CheckpointRefused(f"{start.problem} (checkpoint {cfg.checkpoint_location}, sink markers in "
                                f"{cfg.sink.commit_topic})")
    log(f"no checkpoint at {cfg.checkpoint_location}: {start.note}")
    return start.offsets


def _checkpoint_refused(error: str) -> bool:
    """Says so (stderr, the termination log) when Spark refused the checkpoint for a changed
    query, or the query has none to start from (CheckpointRefused): the same spec on this
    checkpoint is refused the same way each run (exit 2)."""
    # Ours as raised, or inside Spark's report of a batch whose sink refused (sink_kafka).
    at = error.find(CHECKPOINT_REFUSED)
    reason = error[at:].splitlines()[0] if at >= 0 else refusal(error)
    if reason:
        log(reason)
        write_termination_log(reason)
    return reason is not None


def start_query(spark, cfg: Config):
    from spark_app.sink_kafka import KafkaSinkBatchWriter, SinkParams, one_slot, one_task_at_a_time, to_kafka_records

    from spark_app.sink_position import clear_unplanned_checkpoint

    unplanned, removed = clear_unplanned_checkpoint(spark, cfg.checkpoint_location)
    if removed:
        log(f"checkpoint {cfg.checkpoint_location} has no batch planned: removed what a driver stopped while "
            f"planning its first batch left there: {', '.join(removed)}")
    result = build_query_frame(spark, cfg, _starting_offsets(spark, cfg, unplanned))
    if isinstance(cfg.sink, KafkaSink):
        result = to_kafka_records(result)  # the writer gets (key, value) batches
    w = result.writeStream.outputMode(cfg.output_mode).option("checkpointLocation",
                                                              cfg.checkpoint_location)
    name = f"eopipe_{cfg.namespace}_{cfg.pipeline}".replace("-", "_").replace(".", "_")
    w = w.queryName(name)
    if cfg.trigger_ms is None:
        w = w.trigger(availableNow=True)
    else:
        w = w.trigger(processingTime=f"{cfg.trigger_ms} milliseconds")
    if isinstance(cfg.sink, KafkaSink):
        conf = dict(spark.sparkContext.getConf().getAll())
        params = SinkParams(cfg.sink.topic, cfg.sink.commit_topic, cfg.transactional_id_prefix,
                            cfg.kafka_client_config(), keep_producers=one_task_at_a_time(conf),
                            one_task=one_slot(conf))
        if params.one_task:
            log("the job has one task slot: the sink writes a batch of a narrow plan in one task")
        w = w.foreachBatch(KafkaSinkBatchWriter(params, spark, name))
    else:
        assert isinstance(cfg.sink, FileSink)
        # Spark's file sink: a batch's files become visible only through the sink's metadata
        # log (<path>/_spark_metadata), written once per batch id; a replayed batch that is
        # already in the log is skipped. Readers must read through Spark (or that log).
        w = w.format(cfg.sink.format).option("path", cfg.sink.path)
    try:
        return w.start()
    except Exception as e:  # e.g. an output mode the query cannot have, found only when it starts
        if _analysis_error(e):
            raise ConfigError([f"sql: {_first_line(e)}"]) from None
        raise


def run(cfg: Config) -> int:
    stop = {"requested": False}

    def on_term(signum, _frame):
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_term)
    _kafka_topics_exist(cfg)
    spark = build_session(cfg)
    progress = Progress(int(time.time() * 1000))
    listen(spark, progress)  # before the query starts: its first batch is reported too
    try:
        server = serve(progress)
        print(f"{PORT_LINE} port={server.server_address[1]}", flush=True)
    except OSError as e:  # the port taken (another driver on this host): run, unobserved
        log(f"progress not served: {e}")
    query = start_query(spark, cfg)
    progress.query_started()
    probe(spark, cfg.checkpoint_location, progress)  # once the query has the file system up
    print(f"{RUNNING_LINE} id={query.id} run={query.runId} source={cfg.source_topic} "
          f"sink={cfg.sink.kind}", flush=True)
    progress_log = bool(os.environ.get("EOPIPE_SPARK_PROGRESS_LOG"))
    last_batch = None
    try:
        while not stop["requested"]:
            if query.awaitTermination(1):
                break
            # Every batch since the last look (about one a trigger), not just the latest.
            for p in (query.recentProgress if progress_log else []):
                if last_batch is None or p.get("batchId", -1) > last_batch:
                    last_batch = p.get("batchId")
                    log(f"batch {last_batch} at {p.get('timestamp')}: rows={p.get('numInputRows')} "
                        f"durationMs={p.get('durationMs')}")
    finally:
        if stop["requested"]:
            log("SIGTERM: stopping the query (progress is in the checkpoint)")
            try:
                query.stop()
            except Exception as e:  # noqa: BLE001 - the JVM may be shutting down too
                log(f"stop: {_first_line(e)}")
            return 0
    exc = query.exception()
    if exc is not None:
        if _checkpoint_refused(str(exc)):
            return 2
        log(f"query failed: {exc}")
        write_termination_log(f"query failed: {exc}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spark_app.main", description=__doc__.splitlines()[0])
    ap.add_argument("--config-json", help="the configuration as one JSON document")
    ap.add_argument("--config", help="a file holding the JSON configuration")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        rc = run(load(args.config_json, args.config))
    except ConfigError as e:
        print(str(e), file=sys.stderr, flush=True)
        write_termination_log(str(e))
        return 2
    except Exception as e:  # noqa: BLE001 - reported, and the restart policy takes over
        if _checkpoint_refused(str(e)):
            return 2
        refused = _refused_plan(str(e))
        if refused:  # the SQL's plan, not a fault: the same SQL fails the same way on a restart
            msg = str(ConfigError([f"sql: {refused}"]))
            print(msg, file=sys.stderr, flush=True)
            write_termination_log(msg)
            return 2
        log(f"failed after {time.monotonic() - t0:.0f}s: {type(e).__name__}: {e}")
        write_termination_log(f"{type(e).__name__}: {e}")
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
