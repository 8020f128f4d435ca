"""The `eopipe` command: the operator, the dedup worker, the load generator, the verifier, manifest
validation and rendering, and the CRD."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from eopipe.core import cliargs
from eopipe.core.keys import KeySpec
from eopipe.dedup.cli import add_parser as add_dedup

VERIFY_EPILOG = """exit status:
  0  exactly once: nothing lost, nothing duplicated, nothing unexpected, each partition in its
     source order (and, with --dlq, every malformed source record dead-lettered)
  1  keys lost, duplicated, unexpected or out of order (or malformed records missing from --dlq)
  2  usage error
  3  incomplete: no verdict within --timeout (Kafka unreachable, a topic missing, a read held
     back by an open transaction); one line on stderr says what"""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("eopipe")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _progress(stats: dict) -> None:
    done, total = stats["records"], stats["total"]
    rate = done / stats["seconds"] if stats["seconds"] else 0
    print(f"  load: {done}/{total} records ({100 * done // total}%), {rate:,.0f}/s, "
          f"{stats['duplicates']} duplicates, {stats['wrong_partition']} to a wrong partition",
          file=sys.stderr, flush=True)


def cmd_load(args: argparse.Namespace) -> int:
    import threading

    from eopipe.tools.loadgen import ProducerConfigError, run_load

    # SIGTERM ends the load early but cleanly: what was sent is flushed and reported, so a test
    # can keep a load running exactly as long as what it does under it.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stats = run_load(args.bootstrap, args.topic, args.count, dup_ratio=args.dup_ratio,
                         wrong_partition_ratio=args.wrong_partition_ratio, poison=args.poison,
                         partitioner=args.partitioner, rate=args.rate, seed=args.seed,
                         progress=None if args.quiet else _progress, producer_config=dict(args.kafka_config),
                         id_at=("user.id",) if args.nested_id else ("id",), stop=stop)
    except ProducerConfigError as e:
        print(f"eopipe load: error: --kafka-config: {e}", file=sys.stderr)
        return 2
    print(json.dumps(stats) if args.json else
          f"load: sent {stats['records']} records ({stats['unique']} unique, "
          f"{stats['duplicates']} duplicates, {stats['wrong_partition']} to a wrong partition, "
          f"{stats['poison']} malformed) in {stats['seconds']:.1f}s")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from eopipe.tools.verify import Incomplete, verify

    try:
        rep = verify(args.bootstrap, args.source, args.output, key_spec=args.key,
                     output_key_spec=args.output_key, dlq_topic=args.dlq, settle=args.settle,
                     timeout=args.timeout, order=args.order)
    except Incomplete as e:
        print(f"eopipe verify: incomplete after {args.timeout:g}s: {e}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps(rep.to_dict()))
    else:
        print(rep.line())
        for kind, keys in rep.examples.items():
            print(f"  {kind}: {', '.join(keys)}")
    return 0 if rep.ok else 1


def cmd_validate(args: argparse.Namespace) -> int:
    from eopipe.tools import manifests

    from eopipe.control.access import parse_allow_list

    try:
        allow = parse_allow_list(args.allowed_registries)
    except ValueError as e:
        args.parser.error(str(e))
    try:
        return manifests.validate(args.files, tenant_policy=manifests.load_policy(args.policy),
                                  allowed_registries=allow)
    except manifests.Unreadable as e:
        args.parser.error(str(e))


def cmd_render(args: argparse.Namespace) -> int:
    from eopipe.tools import manifests

    settings = manifests.chart_settings(args.release, args.operator_namespace,
                                        network_policy=args.network_policy, image=args.image,
                                        spark_image=args.spark_image,
                                        spark_driver_cluster_role=args.spark_driver_cluster_role)
    try:
        return manifests.render_file(args.file, args.namespace, settings, brokers=args.brokers)
    except manifests.Unreadable as e:
        args.parser.error(str(e))


def cmd_restore(args: argparse.Namespace) -> int:
    import yaml

    from eopipe.core import manifest
    from eopipe.core.spec import KIND
    from eopipe.tools import manifests
    from eopipe.tools.restore import CannotRestore, NotStored, restored, stored

    try:
        if args.source.startswith("s3://"):
            docs = [d for _, d in manifests.documents(args.source, stored(args.source, args.endpoint))]
        else:
            _, docs = manifests.load(args.source)
        pipelines = [d for d in docs if manifest.is_pipeline(d)]
        if len(pipelines) != 1:
            raise CannotRestore(f"{len(pipelines)} {KIND}s in it: give a file with one")
        out = restored(pipelines[0], args.namespace, args.from_namespace, args.name)
    except (manifests.Unreadable, manifests.NotYaml) as e:
        args.parser.error(str(e))
    except CannotRestore as e:
        args.parser.error(f"{args.source}: {e}")
    except NotStored as e:
        print(f"eopipe restore: {e}", file=sys.stderr)
        return 1
    print(yaml.safe_dump(out, sort_keys=False, width=100), end="")
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    from eopipe.control.crd import render

    print(render(), end="")
    return 0


def cmd_operator(args: argparse.Namespace) -> int:
    import kopf
    from prometheus_client import start_http_server

    from eopipe.control import handlers
    from eopipe.control.settings import Settings

    try:
        settings = Settings.from_env(os.environ, namespaces=args.namespace or ())
        settings.check()
    except ValueError as e:
        args.parser.error(str(e))
    registry = kopf.OperatorRegistry()
    handlers.register(settings, registry)
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind)
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.JSON if args.log_json else kopf.LogFormat.FULL)
    elector = _elector(settings) if settings.leader_election else None
    try:
        if elector is not None:
            # Until Kopf takes SIGTERM over: a clean exit (the Lease released below), not a kill.
            signal.signal(signal.SIGTERM, _exit_cleanly)
            _lead(elector, args)
        # standalone: no Kopf peering; the Lease above decides who runs.
        kopf.run(registry=registry, standalone=True, clusterwide=not args.namespace, namespaces=args.namespace or (),
                 liveness_endpoint=f"http://{args.bind}:{args.health_port}/healthz" if args.health_port else None)
    finally:
        if elector is not None:
            elector.release()  # Kopf has stopped: a follower may lead now
    return 0


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)


def _elector(settings):
    from eopipe.control import leader
    from eopipe.core.kubeclient import load_config

    return leader.Elector(load_config(), settings.lease_name, settings.lease_namespace,
                          settings.identity or leader.default_identity(),
                          duration=settings.lease_duration_seconds,
                          renew_deadline=settings.renew_deadline_seconds,
                          retry_period=settings.retry_period_seconds)


def _lead(elector, args: argparse.Namespace) -> None:
    """Blocks until this process holds the Lease, then keeps it in a thread. Losing it ends the
    process at once (exit 1; the pod restarts as a follower): no second leader, not even while
    Kopf would be shutting down."""
    import logging

    from eopipe.control import leader

    log = logging.getLogger("eopipe.leader")
    health = leader.FollowerHealth(args.bind, args.health_port) if args.health_port else None
    try:
        elector.acquire()
    except leader.Fatal as e:
        log.error(str(e))
        sys.exit(1)
    finally:
        if health is not None:
            health.close()

    def lost(why: str) -> None:
        log.error(f"leadership lost ({why}): exiting so that only one operator reconciles")
        for h in logging.getLogger().handlers:
            h.flush()
        os._exit(1)

    elector.keep(lost)


def build_parser() -> argparse.ArgumentParser:
    ap = cliargs.Parser(prog="eopipe", description=__doc__)
    ap.add_argument("--version", action="version", version=f"eopipe {_version()}",
                    help="print the version and exit")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    load = sub.add_parser("load", help="produce keyed events with duplicates (at-least-once producers)",
                          description="Produce keyed JSON events with UUID ids and a share of "
                                      "resends, some delayed and some to a wrong partition.")
    load.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    load.add_argument("--topic", required=True, help="source topic (must exist)")
    load.add_argument("--count", type=cliargs.count, required=True,
                      help="records to send, resends included (SIGTERM stops early and reports what was sent)")
    load.add_argument("--dup-ratio", type=cliargs.ratio, default=0.2,
                      help="share of sends that are resends, within [0, 1) (default 0.2)")
    load.add_argument("--wrong-partition-ratio", type=cliargs.share, default=0.05,
                      help="share of sends placed on a wrong partition, within [0, 1] (default 0.05)")
    load.add_argument("--poison", type=cliargs.count, default=0, help="extra malformed records (no key, not JSON)")
    load.add_argument("--partitioner", choices=["murmur2", "crc32"], default="murmur2",
                      help="how keys are placed: murmur2 (the Java client's default, the default here) "
                           "or crc32 (librdkafka's default)")
    load.add_argument("--rate", type=cliargs.positive_float,
                      help="records per second (default: as fast as possible)")
    load.add_argument("--seed", type=int, help="random seed, for a repeatable run")
    load.add_argument("--nested-id", action="store_true",
                      help='the id in a nested JSON object, {"user": {"id": ...}} (dedup key json:user.id), '
                           'instead of the top-level field "id"')
    load.add_argument("--kafka-config", type=cliargs.key_value, action="append", default=[], metavar="KEY=VALUE",
                      help="extra librdkafka producer setting, repeatable (e.g. linger.ms=50: librdkafka sends "
                           "each partition's batch in a request of its own, so a longer linger means fewer, "
                           "larger requests for the broker)")
    load.add_argument("--json", action="store_true", help="print the stats as JSON")
    load.add_argument("--quiet", action="store_true", help="no progress lines")
    load.set_defaults(func=cmd_load)

    ver = sub.add_parser("verify", help="count lost and duplicated keys between source and output",
                         description="Read source and output topics read_committed and report "
                                     "lost and duplicated keys.",
                         epilog=VERIFY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ver.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    ver.add_argument("--source", required=True, help="source topic")
    ver.add_argument("--output", required=True, help="output topic")
    ver.add_argument("--dlq", help="dead-letter topic: malformed source records must all be there")
    ver.add_argument("--key", type=cliargs.key_spec, default=KeySpec(),
                     help="dedup key: 'key', 'header:NAME' or 'json:FIELD', where FIELD may be a path "
                          "(json:user.id) or a JSON array of names ('json:[\"a.b\", \"c\"]') (default: key)")
    ver.add_argument("--output-key", type=cliargs.key_spec, help="key in the output, if different")
    ver.add_argument("--settle", type=cliargs.seconds, default=10.0,
                     help="seconds without new output after which the output counts as complete (default 10)")
    ver.add_argument("--timeout", type=cliargs.seconds, default=300.0,
                     help="seconds for the whole run, Kafka metadata included; past it, exit status 3 "
                          "(default 300)")
    ver.add_argument("--no-order", dest="order", action="store_false",
                     help="do not check order within partitions (for an output that promises none, "
                          "such as a Spark sink)")
    ver.add_argument("--json", action="store_true", help="print the report as JSON")
    ver.set_defaults(func=cmd_verify)

    op = sub.add_parser("operator", help="run the operator (reconciles ExactlyOncePipelines)",
                        description="Run the Kopf operator. Credentials: in-cluster, else KUBECONFIG.")
    op.add_argument("--namespace", action="append",
                    help="watch this namespace (repeatable); default: all namespaces")
    op.add_argument("--bind", default="0.0.0.0", help="address of the health and metrics servers")
    op.add_argument("--health-port", type=cliargs.port, default=8081, help="liveness probe at /healthz (0: off)")
    op.add_argument("--metrics-port", type=cliargs.port, default=9090, help="Prometheus /metrics (0: off)")
    op.add_argument("--log-json", action="store_true", help="JSON log lines")
    op.add_argument("--verbose", action="store_true", help="debug logging")
    op.set_defaults(func=cmd_operator)

    val = sub.add_parser(
        "validate", help="check pipeline manifests as the API server would, without a cluster",
        description="Check each ExactlyOncePipeline in the files (multi-document YAML) as the API "
                    "server does on create: apiVersion and kind, metadata.name, the spec's schema "
                    "and its validation rules. Prints 'FILE: KIND/NAME: valid' or the API server's "
                    "message for each problem; other documents are skipped with a note. Rules that "
                    "compare with the stored object (fields that may not change) need a cluster. "
                    "Then the tenant policy the operator enforces (docs/security.md): the default one, "
                    "or --policy; whether the Secrets a pipeline names are open to it needs a cluster. "
                    "Exit status: 0 all valid, 1 something invalid, 2 usage error or unreadable file.")
    val.add_argument("files", nargs="+", metavar="FILE", help="manifest file, or - for stdin")
    val.add_argument("--policy", metavar="FILE",
                     help="the tenant policy: the chart's values file (its tenantPolicy) or the policy alone "
                          "(YAML); default: the chart's default policy")
    val.add_argument("--allowed-registries", default=os.environ.get("EOPIPE_ALLOWED_REGISTRIES", ""),
                     metavar="LIST", help="the operator's registry allow-list (default: env "
                                          "EOPIPE_ALLOWED_REGISTRIES, else any registry)")
    val.set_defaults(func=cmd_validate, parser=val)

    ren = sub.add_parser(
        "render", help="print the Kubernetes objects and Kafka topics the operator makes of a manifest",
        description="Print, as multi-document YAML, the objects the operator installed by the chart with "
                    "its default values applies for each ExactlyOncePipeline in FILE (the token Secret, "
                    "with a placeholder for the random token the operator writes; the Spark checkpoint "
                    "claim it creates; the assignment ConfigMap, RBAC, headless Service, "
                    "PodDisruptionBudget, NetworkPolicy and StatefulSet; with a processing stage, the "
                    "Spark driver's RBAC and the SparkApplication), built by the operator's own builders, "
                    "and last a 'kind: KafkaTopics' document (not a Kubernetes object) with the topics "
                    "it creates. No cluster or Kafka needed. Exit status: 0, 1 invalid manifest, "
                    "2 usage error.")
    ren.add_argument("file", metavar="FILE", help="manifest file, or - for stdin")
    ren.add_argument("--namespace", help="the pipeline's namespace (default: the manifest's, else default)")
    ren.add_argument("--release", default="eopipe", help="the chart's release name (default eopipe)")
    ren.add_argument("--operator-namespace", default="eopipe-system", metavar="NAMESPACE",
                     help="the chart's namespace, where the operator runs (default eopipe-system)")
    ren.add_argument("--image", default=os.environ.get("EOPIPE_IMAGE"),
                     help="the dedup pods' image, the chart's image (default: env EOPIPE_IMAGE, else the "
                          "chart's eopipe:<its appVersion>)")
    ren.add_argument("--spark-image", default=os.environ.get("EOPIPE_SPARK_IMAGE"),
                     help="the SparkApplication's image, the chart's sparkImage (default: env "
                          "EOPIPE_SPARK_IMAGE, else the chart's eopipe-spark:<its appVersion>)")
    ren.add_argument("--spark-driver-cluster-role", metavar="NAME",
                     default=os.environ.get("EOPIPE_SPARK_DRIVER_CLUSTERROLE"),
                     help="the chart's Spark-driver ClusterRole the driver is bound to (default: env "
                          "EOPIPE_SPARK_DRIVER_CLUSTERROLE, else the chart's, named after the release and "
                          "its namespace)")
    ren.add_argument("--no-network-policy", dest="network_policy", action="store_false",
                     help="as with the chart's networkPolicy.enabled=false: no NetworkPolicy per pipeline")
    ren.add_argument("--brokers", type=cliargs.positive_int, default=3,
                     help="the Kafka cluster's broker count, which topics without source.replicationFactor "
                          "follow (default 3)")
    ren.set_defaults(func=cmd_render, parser=ren)

    res = sub.add_parser(
        "restore", help="print the manifest that continues a pipeline in another namespace",
        description="Print the ExactlyOncePipeline of SOURCE for --namespace with spec.restoreFrom naming "
                    "the pipeline it continues (the one SOURCE continues, if any): applied there, it takes "
                    "that pipeline's topics, consumer group and transactional ids, restores the dedup state "
                    "from spec.dedup.backup and starts Spark where the sink's commit markers end "
                    "(docs/operations.md). SOURCE: a manifest file (as written, or as `kubectl get -o yaml` "
                    "prints it), or the pipeline's spec.dedup.backup.uri, where its dedup pods keep its "
                    "manifest (credentials from env AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY). Exit "
                    "status: 0, 1 the object store did not give it, 2 usage error or a manifest that cannot "
                    "be restored.")
    res.add_argument("source", metavar="SOURCE", help="manifest file with one pipeline, - for stdin, or s3://bucket/prefix")
    res.add_argument("--namespace", required=True, help="the namespace to restore into")
    res.add_argument("--name", help="the restored pipeline's name (default: the same)")
    res.add_argument("--from-namespace", metavar="NAMESPACE",
                     help="where the pipeline ran, when the manifest names no namespace")
    res.add_argument("--endpoint", default=os.environ.get("AWS_ENDPOINT_URL"), metavar="URL",
                     help="an S3-compatible store's endpoint, as spec.dedup.backup.endpoint (env AWS_ENDPOINT_URL; "
                          "default AWS's)")
    res.set_defaults(func=cmd_restore, parser=res)

    crd = sub.add_parser("crd", help="print the ExactlyOncePipeline CRD (YAML)",
                         description="Print the ExactlyOncePipeline CustomResourceDefinition as YAML.")
    crd.set_defaults(func=cmd_crd)

    add_dedup(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
