"""The shell commands of a doc section, so a test runs what the doc says and nothing else."""

from __future__ import annotations

import re

from tests.helpers.helm import ROOT


def sh_blocks(doc: str, section: str) -> list[list[str]]:
    """The ```sh blocks of a `## ` section of docs/<doc> (its `### ` subsections included), each
    as its commands, continuation lines joined, comments left out."""
    text = (ROOT / "docs" / doc).read_text()
    assert section in text, f"docs/{doc} has no section {section!r}"
    body = text.split(section, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", body, re.S)
    return [[c.strip() for c in b.replace("\\\n", " ").splitlines() if c.strip() and not c.strip().startswith("#")]
            for b in blocks]
