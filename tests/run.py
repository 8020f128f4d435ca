"""`make test`: the node tier's tests and the rest as two pytest runs at once.

The node tier's tests spend much of their time waiting (a node's grace period, a Spark driver's
start, a retry interval) on a cluster that is idle meanwhile; the rest (unit, harness,
integration, the process tier's end to end) run on loopback beside it. Each run is a whole
pytest session: the node run streams its output, the other's is printed when both have ended,
then one line with the totals. Either run failing, or running no test, fails `make test`.
Without root or EOPIPE_NODE_TESTS=1 it is the one run it always was.

    python -m tests.run [pytest args for both runs]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMON = ["--ignore=tests/soak", "--tb=short"]


@dataclass(frozen=True)
class Run:
    name: str
    marks: str


def runs(node_tier: bool) -> list[Run]:
    """The runs of `make test`: the first streams its output; each marker expression selects
    what no other run does."""
    if not node_tier:
        return [Run("all", "not bench")]
    return [Run("node tier", "node and not bench"), Run("the rest", "not node and not bench")]


@dataclass(frozen=True)
class Outcome:
    name: str
    code: int
    passed: int
    failed: int
    skipped: int
    seconds: float


def counts(junit: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) from a run's JUnit XML; a run that wrote none counts nothing."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return 0, 0, 0
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = failed = skipped = 0
    for s in suites:
        total += int(s.get("tests", 0))
        failed += int(s.get("failures", 0)) + int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
    return total - failed - skipped, failed, skipped


def verdict(outcomes: list[Outcome]) -> tuple[str, int]:
    """The closing line and exit code: 1 when a run failed (pytest's 5, no test run, too)."""
    passed, failed, skipped = (sum(getattr(o, f) for o in outcomes) for f in ("passed", "failed", "skipped"))
    bad = [o for o in outcomes if o.code != 0]
    line = f"tests: {passed} passed, {failed} failed, {skipped} skipped"
    if bad:
        line += " (" + "; ".join(f"{o.name}: pytest exit {o.code}" for o in bad) + ")"
    return line, 1 if bad else 0


def main(args: list[str]) -> int:
    node_tier = os.environ.get("EOPIPE_NODE_TESTS") == "1" and os.geteuid() == 0
    plan = runs(node_tier)
    work = REPO / ".work"
    work.mkdir(exist_ok=True)
    started, procs, logs = time.monotonic(), [], []
    for i, run in enumerate(plan):
        junit = work / f"test-run-{i}.xml"
        junit.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "pytest", "-m", run.marks, *COMMON, f"--junitxml={junit}", *args]
        out = None
        if i:  # only the first run writes to the terminal as it goes
            logs.append(open(work / f"test-run-{i}.log", "w+"))
            out = logs[-1]
        print(f"==> {run.name}: {' '.join(argv[1:])}", flush=True)
        procs.append((run, junit, subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)))
    ended: dict[int, float] = {}
    while len(ended) < len(procs):  # each run's own end, whichever ends first
        for i, (_, _, proc) in enumerate(procs):
            if i not in ended and proc.poll() is not None:
                ended[i] = time.monotonic() - started
        time.sleep(0.5)
    outcomes = [Outcome(run.name, proc.returncode, *counts(junit), ended[i])
                for i, (run, junit, proc) in enumerate(procs)]
    for i, log in enumerate(logs, start=1):
        log.seek(0)
        print(f"\n==> {plan[i].name}, run beside the node tier (ended {outcomes[i].seconds:.0f} s in):", flush=True)
        sys.stdout.write(log.read())
        log.close()
    line, code = verdict(outcomes)
    if len(outcomes) > 1:
        print("\n" + "; ".join(f"{o.name} ended {o.seconds:.0f} s in" for o in outcomes))
    print(line, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
