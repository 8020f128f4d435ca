"""docs/design.md: its headings exist, every citation of one of its anchors points at a real
heading, and nothing else in the repository names the retired design file.

Citations look like `docs/design.md#<anchor>` (GitHub-style anchors: lowercase, spaces to
hyphens, punctuation dropped). No services: reads the git-tracked files only.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
DESIGN_REL = "docs/design.md"

# The headings other files cite; changing one breaks their links.
REQUIRED_HEADINGS = [
    "# eopipe design",
    "## Architecture",
    "## The exactly-once protocol",
    "### One transaction",
    "### Fencing",
    "### State after commit",
    "### Recovery",
    "## Rebalancing",
    "### Snapshot handoff",
    "### Re-shard on partition growth",
    "### Reroute",
    "## The Spark stage",
    "## The local environment",
    "## Test tiers",
    "## Known limits",
]

CITATION = re.compile(r"docs/design\.md#([a-z0-9-]+)")
# Relative links from the other documents of docs/, e.g. [x](design.md#fencing).
RELATIVE_CITATION = re.compile(r"\]\((?:\./)?design\.md#([a-z0-9-]+)\)")
# Built from parts so that this file does not contain the name it looks for.
RETIRED_NAME = "DESIGN" + ".md"


def github_anchor(heading_text: str) -> str:
    """GitHub's slug of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading_text.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(markdown: str) -> list[str]:
    """ATX headings (`#` to `######`) outside fenced code blocks, as written."""
    out, fence = [], None
    for line in markdown.splitlines():
        m = re.match(r"^\s{0,3}(```+|~~~+)", line)
        if m:
            marker = m.group(1)[0] * 3
            if fence is None:
                fence = marker
            elif marker == fence:
                fence = None
            continue
        if fence is None and re.match(r"^#{1,6} \S", line):
            out.append(line.rstrip().rstrip("#").rstrip())
    return out


def anchors(markdown: str) -> set[str]:
    """Every anchor GitHub generates for the document (duplicates get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for h in headings(markdown):
        slug = github_anchor(h.lstrip("#"))
        n = seen.get(slug, 0)
        out.add(slug if n == 0 else f"{slug}-{n}")
        seen[slug] = n + 1
    return out


def tracked_text_files() -> dict[str, str]:
    """path -> text of every git-tracked file that exists and is text (binary files skipped)."""
    try:
        listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout: {e}")
    out = {}
    for rel in filter(None, listing.decode().split("\0")):
        path = ROOT / rel
        if not path.is_file():
            continue  # deleted in the work tree
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        try:
            out[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return out


def citations(files: dict[str, str]) -> list[tuple[str, int, str]]:
    """(file, line, anchor) of every citation of docs/design.md in `files`."""
    found = []
    for rel, text in files.items():
        patterns = [CITATION]
        if rel.startswith("docs/") and rel.endswith(".md"):
            patterns.append(RELATIVE_CITATION)
        for n, line in enumerate(text.splitlines(), 1):
            for pat in patterns:
                found += [(rel, n, m.group(1)) for m in pat.finditer(line)]
    return found


def broken_citations(files: dict[str, str], design_text: str) -> list[str]:
    known = anchors(design_text)
    return [f"{rel}:{n}: #{anchor}" for rel, n, anchor in citations(files) if anchor not in known]


def files_naming_the_retired_design(files: dict[str, str]) -> list[str]:
    return [f"{rel}:{n}" for rel, text in sorted(files.items()) if rel != DESIGN_REL
            for n, line in enumerate(text.splitlines(), 1) if RETIRED_NAME in line]


# -- the checks -----------------------------------------------------------------------------------
def test_design_has_every_required_heading():
    text = DESIGN.read_text()
    have = set(headings(text))
    missing = [h for h in REQUIRED_HEADINGS if h not in have]
    assert not missing, f"docs/design.md lacks the heading(s): {missing}"
    assert headings(text)[0] == "# eopipe design", "the title comes first"


def test_required_headings_give_the_anchors_others_cite():
    got = anchors(DESIGN.read_text())
    for a in ("architecture", "the-exactly-once-protocol", "one-transaction", "fencing",
              "state-after-commit", "recovery", "rebalancing", "snapshot-handoff",
              "re-shard-on-partition-growth", "reroute", "the-spark-stage",
              "the-local-environment", "test-tiers", "known-limits"):
        assert a in got, a


def test_every_citation_of_a_design_anchor_resolves():
    broken = broken_citations(tracked_text_files(), DESIGN.read_text())
    assert not broken, ("citations of docs/design.md anchors that are not headings there:\n  "
                        + "\n  ".join(broken))


def test_no_tracked_file_names_the_retired_design_file():
    offenders = files_naming_the_retired_design(tracked_text_files())
    assert not offenders, (f"{len(offenders)} line(s) still name {RETIRED_NAME}; cite "
                           f"docs/design.md#<anchor> instead:\n  " + "\n  ".join(offenders))


# -- the checkers themselves (so a green run means something) --------------------------------------
def test_anchor_rules_follow_github():
    assert github_anchor("The exactly-once protocol") == "the-exactly-once-protocol"
    assert github_anchor("Re-shard on partition growth") == "re-shard-on-partition-growth"
    assert github_anchor("What's `eopipe.core`? (v2)") == "whats-eopipecore-v2"
    doc = "# A\n## Same\n```\n## Not a heading\n```\n## Same\n"
    assert anchors(doc) == {"a", "same", "same-1"}


def test_checkers_catch_a_bad_citation_and_the_retired_name():
    design = "# eopipe design\n## Fencing\n"
    cite = "docs/design.md" + "#"
    files = {"a.py": f"# see {cite}fencing\n# and {cite}no-such-heading\n",
             "docs/x.md": "[f](design.md" + "#fencing) [g](design.md" + "#gone)\n",
             "b.md": f"old: {RETIRED_NAME} section 3\n",
             DESIGN_REL: f"mentions {RETIRED_NAME} itself\n"}
    assert broken_citations(files, design) == ["a.py:2: #no-such-heading", "docs/x.md:1: #gone"]
    assert files_naming_the_retired_design(files) == ["b.md:1"]
