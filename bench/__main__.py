"""`make bench`: the benchmarks side by side on one broker, in one run, as one table.

Absolute numbers drift on a shared 2-core machine; compare the rows of one run.
    python -m bench [--records N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import dedup_vs_copy, migration

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000, help="records in the source (default 200000)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per contestant (default 2)")
    ap.add_argument("--keys", type=int, default=1_000_000,
                    help="keys in the partition handed off in the migration benchmark (default 1000000)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(REPO))
    from tests.localenv.kafka import KafkaBroker

    work = REPO / ".work" / "bench"
    work.mkdir(parents=True, exist_ok=True)
    broker = KafkaBroker(work / "kafka")
    broker.start()
    progress = lambda m: print(f"  bench: {m}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        rows = dedup_vs_copy.bench(broker.bootstrap, work, records=args.records, rounds=args.rounds,
                                   progress=progress)
        moves = migration.bench(broker.bootstrap, work / "migration", keys=args.keys, progress=progress)
    finally:
        broker.stop()
    print(dedup_vs_copy.table(rows))
    print()
    print(migration.table(moves))
    if args.json:
        args.json.write_text(json.dumps({"dedup_vs_copy": rows, "migration": moves}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
