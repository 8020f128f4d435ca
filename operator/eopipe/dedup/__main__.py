"""`python -m eopipe.dedup ...` is `eopipe dedup ...`."""

import sys

from eopipe.core.cliargs import Parser
from eopipe.dedup.cli import add_parser


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="python -m eopipe.dedup")
    sub = ap.add_subparsers(dest="command")
    add_parser(sub)
    args = ap.parse_args(["dedup", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
