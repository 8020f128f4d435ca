"""`python -m eopipe.dedup ...` is `eopipe dedup ...`."""

import argparse
import sys

from eopipe.dedup.cli import add_parser


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eopipe.dedup")
    sub = ap.add_subparsers(dest="command")
    add_parser(sub)
    args = ap.parse_args(["dedup", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
