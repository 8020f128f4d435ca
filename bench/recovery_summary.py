"""The pure half of bench.recovery: the fault classes with their targets, and the summary of
the measured rounds (median and max per class, pass or FAIL against the target) as rows and
as a table. No I/O: tests/unit/test_bench_recovery.py table-tests it.

A round is a dict with at least
  fault             the class (a key of FAULTS)
  held_s            seconds from the fault's start to its end (the heal, the restart done)
  first_commit_s    seconds from the fault's end until the group's committed offset passed the
                    source's end at the fault's start (new work committed)
  caught_up_s       seconds from the fault's end until the lag was back to steady
  no_commit_s       the longest time the committed offset stood still, from the fault's start
                    (Stood)
The times from the fault's start are these plus held_s. The verdict is on caught_up_s from the
fault's end: the class passes when its slowest round recovered in less than the target.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    name: str
    label: str                 # in the tables
    target_s: float | None     # recovery target (lag back to steady after the fault's end)


FAULTS = {f.name: f for f in (
    Fault("worker_kill", "worker SIGKILL", 10.0),
    Fault("broker_kill", "broker SIGKILL", 30.0),
    Fault("partition", "network partition", 30.0),
    Fault("worker_pause", "worker SIGSTOP", None),
)}


class Stood:
    """The longest time the group's committed offset stood still (samples in, seconds out).
    With three brokers the worker may go on committing while a broker is down: this, not the
    first commit after the broker's return, is how long it waited."""

    def __init__(self, t: float):
        self.t, self.committed, self.longest = t, None, 0.0

    def see(self, t: float, committed: int) -> None:
        if self.committed is None or committed > self.committed:
            if self.committed is not None:
                self.longest = max(self.longest, t - self.t)
            self.t, self.committed = t, committed


def parse_faults(text: str) -> list[str]:
    """'worker_kill,partition' -> those names, in FAULTS order; ValueError names the unknown ones."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAULTS]
    if unknown or not names:
        raise ValueError(f"unknown fault classes {','.join(unknown) or '(none given)'}; "
                         f"known: {','.join(FAULTS)}")
    return [n for n in FAULTS if n in names]


def verdict(caught_up: list[float], target: float | None) -> str:
    if target is None:
        return "-"
    return "pass" if max(caught_up) < target else "FAIL"


def summarize(rounds: list[dict]) -> list[dict]:
    """One row per fault class that has rounds, in FAULTS order."""
    rows = []
    for f in FAULTS.values():
        mine = [r for r in rounds if r["fault"] == f.name]
        if not mine:
            continue
        row = {"fault": f.name, "label": f.label, "rounds": len(mine), "target_s": f.target_s,
               "held_s": statistics.median(r["held_s"] for r in mine)}
        for key in ("first_commit_s", "caught_up_s"):
            ends = [r[key] for r in mine]
            starts = [r[key] + r["held_s"] for r in mine]
            stem = key[:-2]
            row[f"{stem}_median_s"] = statistics.median(ends)
            row[f"{stem}_max_s"] = max(ends)
            row[f"{stem}_from_start_median_s"] = statistics.median(starts)
            row[f"{stem}_from_start_max_s"] = max(starts)
        row["verdict"] = verdict([r["caught_up_s"] for r in mine], f.target_s)
        rows.append(row)
    return rows


def passed(rows: list[dict]) -> bool:
    """Every class with a target met it."""
    return all(r["verdict"] != "FAIL" for r in rows)


def table(rows: list[dict]) -> str:
    """Per class: time to the first new commit and until the lag is back to steady, median and
    max, from the fault's end (and the latter from its start), the target and the verdict."""
    head = (f"{'fault':<20}{'n':>3}{'held s':>8}{'1st commit s':>14}{'caught up s':>13}"
            f"{'from start s':>14}{'target s':>10}  verdict")
    sub = f"{'':<31}{'median / max':>14}{'median / max':>13}{'median / max':>14}"
    lines = [head, sub, "-" * len(head)]
    for r in rows:
        def pair(stem):
            return f"{r[stem + '_median_s']:.1f} / {r[stem + '_max_s']:.1f}"
        target = "-" if r["target_s"] is None else f"< {r['target_s']:.0f}"
        lines.append(f"{r['label']:<20}{r['rounds']:>3}{r['held_s']:>8.1f}{pair('first_commit'):>14}"
                     f"{pair('caught_up'):>13}{pair('caught_up_from_start'):>14}{target:>10}  {r['verdict']}")
    return "\n".join(lines)
