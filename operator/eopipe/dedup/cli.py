"""`eopipe dedup`: the dedup worker a StatefulSet pod runs."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from eopipe.core import cliargs, kafkaconf
from eopipe.core.durations import format_duration
from eopipe.dedup import auth, clients
from eopipe.dedup.config import WorkerConfig, default_http_host, parse_partitions


def _partitions(text: str) -> list[int]:
    try:
        return parse_partitions(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# WorkerConfig's defaults, the one home of each (a default_factory is called for its value).
DEFAULTS = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(WorkerConfig)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}


def add_parser(subparsers) -> argparse.ArgumentParser:
    env = os.environ.get
    d = DEFAULTS
    ap = subparsers.add_parser(
        "dedup", help="run the exactly-once dedup worker (the process of a dedup pod)",
        description="Deduplicate the owned source partitions into the output topic with Kafka "
                    "transactions and RocksDB state. SIGTERM commits the open transactions and exits 0.")
    ap.add_argument("--bootstrap", default=env("EOPIPE_BOOTSTRAP"), required=not env("EOPIPE_BOOTSTRAP"),
                    help="Kafka bootstrap servers (env EOPIPE_BOOTSTRAP)")
    ap.add_argument("--source-topic", required=True, help="the source topic")
    ap.add_argument("--output-topic", required=True, help="the deduped topic")
    ap.add_argument("--dlq-topic", help="dead-letter topic for malformed records "
                                        "(default <namespace>.<pipeline>.dlq, the operator's default name)")
    ap.add_argument("--pipeline", required=True, help="pipeline name (part of transactional.id and group)")
    ap.add_argument("--namespace", default=env("POD_NAMESPACE", d["namespace"]),
                    help=f"namespace (env POD_NAMESPACE; default {d['namespace']!r})")
    ap.add_argument("--identity", metavar="NAMESPACE/PIPELINE", default=d["identity"],
                    help="the pipeline whose consumer group and transactional ids to use (a restored "
                         "pipeline's origin; default --namespace/--pipeline)")
    ap.add_argument("--partitions", type=_partitions,
                    help="fixed owned partitions, e.g. 0,1,2 or 0-5 (instead of an assignment)")
    ap.add_argument("--assignment-file", type=Path,
                    help='the operator\'s assignment, JSON {"generation": g, "assignments": {"<pod>": '
                         '[partitions]}}, re-read on change (the mounted ConfigMap)')
    ap.add_argument("--assignment-configmap", metavar="NAME",
                    help="the same assignment read from this ConfigMap of --namespace through a watch "
                         "on the API: seen in a second instead of the kubelet's volume refresh; the "
                         "newer generation of file and ConfigMap wins")
    ap.add_argument("--pod-name", default=env("POD_NAME"), help="this pod's name in the assignment (env POD_NAME)")
    ap.add_argument("--key", type=cliargs.key_spec, default=d["key_spec"],
                    help="dedup key: 'key', 'header:NAME' or 'json:FIELD' (default: key)")
    ap.add_argument("--window", type=cliargs.duration_seconds, default=d["window_seconds"],
                    help="dedup window by event time, Go duration syntax: 15m, 24h, 168h "
                         f"(default {format_duration(d['window_seconds'])}); a state kept for a shorter "
                         "one is read back from the source over the longer one on start")
    ap.add_argument("--segments", type=cliargs.positive_int, default=d["segments"],
                    help=f"time segments per window; expiry drops one whole segment (default {d['segments']})")
    ap.add_argument("--partitioner", choices=["murmur2", "crc32"], default=d["partitioner"],
                    help="the producers' partitioner, defines a key's home partition")
    ap.add_argument("--state-dir", type=Path, default=Path(env("EOPIPE_STATE_DIR", d["state_dir"])),
                    help="RocksDB directory, on the pod's PersistentVolume (env EOPIPE_STATE_DIR)")
    ap.add_argument("--http-host", default=default_http_host(), help="default: env POD_IP, else 127.0.0.1")
    ap.add_argument("--http-port", type=cliargs.port, default=d["http_port"],
                    help="port of /healthz, /readyz, /metrics, /status and the state transfer "
                         f"(default {d['http_port']}; 0 picks a free port, logged)")
    ap.add_argument("--commit-interval-ms", type=cliargs.positive_int, default=d["commit_interval_ms"],
                    help=f"a transaction commits at the latest this long after it began (default {d['commit_interval_ms']})")
    ap.add_argument("--max-batch", type=cliargs.positive_int, default=d["max_batch"],
                    help=f"records per transaction at most (default {d['max_batch']})")
    ap.add_argument("--memory-mb", type=cliargs.positive_int, default=d["memory_mb"],
                    help="RocksDB memory (block cache + memtables) for the whole process")
    ap.add_argument("--kafka-config", type=cliargs.key_value, action="append", default=[], metavar="KEY=VALUE",
                    help="extra librdkafka setting for all clients, repeatable; also read from env "
                         "EOPIPE_KAFKA_* (EOPIPE_KAFKA_SASL_USERNAME -> sasl.username), as the operator sets them; "
                         "a setting the worker gives its clients itself (isolation.level, linger.ms, ...) is refused")
    ap.add_argument("--handoff-timeout", type=cliargs.seconds, metavar="SECONDS",
                    default=float(env("EOPIPE_HANDOFF_TIMEOUT_SECONDS", d["handoff_timeout_seconds"])),
                    help="how long a new owner waits for a moved partition's state before it rebuilds "
                         f"it from the source (env EOPIPE_HANDOFF_TIMEOUT_SECONDS; default {d['handoff_timeout_seconds']:g})")
    ap.add_argument("--transaction-timeout", type=cliargs.seconds, metavar="SECONDS",
                    default=d["transaction_timeout_seconds"],
                    help="the producers' transaction.timeout.ms in seconds, and how long a commit may "
                         "stall before the partition replaces its producer and consumer "
                         f"(default {d['transaction_timeout_seconds']:g})")
    ap.add_argument("--token-file", metavar="PATH", default=env("EOPIPE_TOKEN_FILE"),
                    help="file with the pipeline's bearer token of /snapshots and /reshard, sent to the "
                         "other pods too (env EOPIPE_TOKEN_FILE; else the token itself in env EOPIPE_TOKEN, "
                         "as the operator sets it from the pipeline's Secret)")
    ap.add_argument("--insecure-state-endpoints", action="store_true",
                    help="without a token, serve /snapshots and /reshard to anyone (local runs only; "
                         "by default a worker without a token refuses them)")
    ap.add_argument("--backup-uri", default=env("EOPIPE_BACKUP_URI"), metavar="s3://BUCKET/PREFIX",
                    help="upload snapshots of the state here, and restore a partition whose state is gone "
                         "from the newest one (env EOPIPE_BACKUP_URI; credentials from env AWS_ACCESS_KEY_ID "
                         "and AWS_SECRET_ACCESS_KEY)")
    ap.add_argument("--backup-interval", type=cliargs.duration_seconds, default=d["backup_interval_seconds"],
                    help=f"how often each partition is snapshotted, Go duration syntax "
                         f"(default {format_duration(d['backup_interval_seconds'])})")
    ap.add_argument("--backup-retention", type=cliargs.positive_int, default=d["backup_retention"],
                    help=f"snapshots kept per partition (default {d['backup_retention']})")
    ap.add_argument("--backup-endpoint", default=env("AWS_ENDPOINT_URL", d["backup_endpoint"]), metavar="URL",
                    help="the S3-compatible store's endpoint (env AWS_ENDPOINT_URL; default AWS's)")
    ap.add_argument("--pipeline-manifest", type=Path, default=d["pipeline_manifest"], metavar="FILE",
                    help="the pipeline's manifest, uploaded as pipeline.yaml under --backup-uri whenever it "
                         "changes (eopipe restore reads it there)")
    ap.add_argument("--log-level", default=env("EOPIPE_LOG_LEVEL", "INFO"),
                    help="DEBUG, INFO, WARNING or ERROR (env EOPIPE_LOG_LEVEL; default INFO)")
    ap.set_defaults(func=cmd_dedup, parser=ap)
    return ap


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    cfg = WorkerConfig(
        bootstrap=args.bootstrap, source_topic=args.source_topic, output_topic=args.output_topic,
        dlq_topic=args.dlq_topic, pipeline=args.pipeline, namespace=args.namespace,
        identity=args.identity, partitions=args.partitions, assignment_file=args.assignment_file,
        assignment_configmap=args.assignment_configmap, pod_name=args.pod_name,
        key_spec=args.key, window_seconds=args.window, segments=args.segments,
        partitioner=args.partitioner, state_dir=args.state_dir, http_host=args.http_host,
        http_port=args.http_port, commit_interval_ms=args.commit_interval_ms,
        max_batch=args.max_batch, memory_mb=args.memory_mb, handoff_timeout_seconds=args.handoff_timeout,
        transaction_timeout_seconds=args.transaction_timeout,
        kafka_config={**kafkaconf.from_env(), **dict(args.kafka_config)},
        token=auth.read_token(os.environ, args.token_file), insecure_state_endpoints=args.insecure_state_endpoints,
        backup_uri=args.backup_uri, backup_interval_seconds=args.backup_interval,
        backup_retention=args.backup_retention, backup_endpoint=args.backup_endpoint,
        pipeline_manifest=args.pipeline_manifest)
    taken = sorted(clients.owned_settings(cfg) & {k for k, _ in args.kafka_config})
    if taken:
        raise ValueError(f"--kafka-config {', '.join(taken)}: set by the worker itself for its exactly-once "
                         "clients (docs/design.md#one-transaction)")
    return cfg


def cmd_dedup(args: argparse.Namespace) -> int:
    from eopipe.dedup import logs
    from eopipe.dedup.worker import run

    logs.setup(args.log_level)
    import faulthandler
    import signal
    import sys

    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # stacks on demand
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        args.parser.error(str(e))  # usage and the reason, exit 2
    return run(cfg)
