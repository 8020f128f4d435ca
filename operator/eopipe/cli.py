"""The `eopipe` command: the operator, the dedup worker, the load generator, the verifier and the CRD."""

from __future__ import annotations

import argparse
import json
import sys

from eopipe.dedup.cli import add_parser as add_dedup
from eopipe.keys import KeySpec


def _progress(stats: dict) -> None:
    done, total = stats["records"], stats["total"]
    rate = done / stats["seconds"] if stats["seconds"] else 0
    print(f"  load: {done}/{total} records ({100 * done // total}%), {rate:,.0f}/s, "
          f"{stats['duplicates']} duplicates, {stats['wrong_partition']} to a wrong partition",
          file=sys.stderr, flush=True)


def cmd_load(args: argparse.Namespace) -> int:
    from eopipe.loadgen import run_load

    stats = run_load(args.bootstrap, args.topic, args.count, dup_ratio=args.dup_ratio,
                     wrong_partition_ratio=args.wrong_partition_ratio, poison=args.poison,
                     partitioner=args.partitioner, rate=args.rate, seed=args.seed,
                     progress=None if args.quiet else _progress)
    print(json.dumps(stats) if args.json else
          f"load: sent {stats['records']} records ({stats['unique']} unique, "
          f"{stats['duplicates']} duplicates, {stats['wrong_partition']} to a wrong partition, "
          f"{stats['poison']} malformed) in {stats['seconds']:.1f}s")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from eopipe.verify import verify

    rep = verify(args.bootstrap, args.source, args.output, key_spec=args.key,
                 output_key_spec=args.output_key, dlq_topic=args.dlq, settle=args.settle,
                 timeout=args.timeout)
    if args.json:
        print(json.dumps(rep.to_dict()))
    else:
        print(rep.line())
        for kind, keys in rep.examples.items():
            print(f"  {kind}: {', '.join(keys)}")
    return 0 if rep.ok else 1


def cmd_crd(args: argparse.Namespace) -> int:
    from eopipe.crd import render

    print(render(), end="")
    return 0


def cmd_operator(args: argparse.Namespace) -> int:
    import kopf
    from prometheus_client import start_http_server

    import eopipe.handlers  # noqa: F401  (registers the handlers)

    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind)
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.JSON if args.log_json else kopf.LogFormat.FULL)
    kopf.run(standalone=True, clusterwide=not args.namespace, namespaces=args.namespace or (),
             liveness_endpoint=f"http://{args.bind}:{args.health_port}/healthz" if args.health_port else None)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="eopipe", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    load = sub.add_parser("load", help="produce keyed events with duplicates (at-least-once producers)",
                          description="Produce keyed JSON events with UUID ids and a share of "
                                      "resends, some delayed and some to a wrong partition.")
    load.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    load.add_argument("--topic", required=True, help="source topic (must exist)")
    load.add_argument("--count", type=int, required=True, help="records to send, resends included")
    load.add_argument("--dup-ratio", type=float, default=0.2, help="share of sends that are resends (default 0.2)")
    load.add_argument("--wrong-partition-ratio", type=float, default=0.05,
                      help="share of sends placed on a wrong partition (default 0.05)")
    load.add_argument("--poison", type=int, default=0, help="extra malformed records (no key, not JSON)")
    load.add_argument("--partitioner", choices=["murmur2", "crc32"], default="murmur2")
    load.add_argument("--rate", type=float, help="records per second (default: as fast as possible)")
    load.add_argument("--seed", type=int, help="random seed, for a repeatable run")
    load.add_argument("--json", action="store_true", help="print the stats as JSON")
    load.add_argument("--quiet", action="store_true", help="no progress lines")
    load.set_defaults(func=cmd_load)

    ver = sub.add_parser("verify", help="count lost and duplicated keys between source and output",
                         description="Read source and output topics read_committed and report "
                                     "lost and duplicated keys. Exit status 1 if any.")
    ver.add_argument("--bootstrap", required=True)
    ver.add_argument("--source", required=True, help="source topic")
    ver.add_argument("--output", required=True, help="output topic")
    ver.add_argument("--dlq", help="dead-letter topic: malformed source records must all be there")
    ver.add_argument("--key", type=KeySpec.parse, default=KeySpec(),
                     help="dedup key: 'key', 'header:NAME' or 'json:FIELD' (default: key)")
    ver.add_argument("--output-key", type=KeySpec.parse, help="key in the output, if different")
    ver.add_argument("--settle", type=float, default=10.0,
                     help="seconds without new output after which the output counts as complete")
    ver.add_argument("--timeout", type=float, default=300.0)
    ver.add_argument("--json", action="store_true", help="print the report as JSON")
    ver.set_defaults(func=cmd_verify)

    op = sub.add_parser("operator", help="run the operator (reconciles ExactlyOncePipelines)",
                        description="Run the Kopf operator. Credentials: in-cluster, else KUBECONFIG.")
    op.add_argument("--namespace", action="append",
                    help="watch this namespace (repeatable); default: all namespaces")
    op.add_argument("--bind", default="0.0.0.0", help="address of the health and metrics servers")
    op.add_argument("--health-port", type=int, default=8081, help="liveness probe at /healthz (0: off)")
    op.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics (0: off)")
    op.add_argument("--log-json", action="store_true", help="JSON log lines")
    op.add_argument("--verbose", action="store_true")
    op.set_defaults(func=cmd_operator)

    crd = sub.add_parser("crd", help="print the ExactlyOncePipeline CRD (YAML)")
    crd.set_defaults(func=cmd_crd)

    add_dedup(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
