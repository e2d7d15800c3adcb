"""The one way a doc carries a generated section: between two markers, rewritten by a script, and
checked for freshness by a test (the script's ``--check``). Used by ``module_map.py`` (docs/architecture.md)
and ``guard_table.py`` (docs/security.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def replaced(text: str, begin: str, end: str, body: str, heading: str) -> str:
    """``text`` with the section between ``begin`` and ``end`` replaced by ``body`` (which carries the
    markers); appended under ``heading`` when the document has no such section yet."""
    if begin not in text:
        return text.rstrip("\n") + f"\n\n{heading}\n\n" + body + "\n"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + body + tail


def main(doc: Path, update: Callable[[str], str], stale_hint: str, description: str) -> int:
    """Write the section (or, with ``--check``, exit 1 if the document is stale, writing nothing)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="exit 1 if the section is stale, write nothing")
    args = parser.parse_args()
    text = doc.read_text()
    new = update(text)
    if args.check:
        if new != text:
            print(stale_hint, file=sys.stderr)
            return 1
        return 0
    doc.write_text(new)
    return 0
