"""`make bench`: the benchmarks side by side on one broker, in one run, as one table.

Absolute numbers drift on a shared 2-core machine; compare the rows of one run.
    python -m bench [--records N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import dedup_vs_copy

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000, help="records in the source (default 200000)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per contestant (default 2)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(REPO))
    from tests.localenv.kafka import KafkaBroker

    work = REPO / ".work" / "bench"
    work.mkdir(parents=True, exist_ok=True)
    broker = KafkaBroker(work / "kafka")
    broker.start()
    try:
        rows = dedup_vs_copy.bench(broker.bootstrap, work, records=args.records, rounds=args.rounds,
                                   progress=lambda m: print(f"  bench: {m}", file=sys.stderr, flush=True))
    finally:
        broker.stop()
    print(dedup_vs_copy.table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
