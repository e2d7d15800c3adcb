"""docs/producer.md documents every producer option, with its real default, every doc in docs/ is in
the index (docs/README.md), and every file docs/design.md cites exists, so none of these pages rots as
options, pages and files are added, moved or removed."""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from pathlib import Path

from sluice.client.producer.config import ProducerConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _option_rows() -> dict[str, str]:
    text = (DOCS / "producer.md").read_text()
    text = text[text.index("## Options") :]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| ([^|]+) \|", text, re.M)}


def _spelled(value: object) -> str:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        if seconds >= 86400 and seconds % 86400 == 0:
            return f"{int(seconds // 86400)}d"
        return f"{int(seconds * 1000)}ms" if seconds < 1 else f"{int(seconds)}s"
    if isinstance(value, int) and value >= 1024 * 1024 and value % (1024 * 1024) == 0:
        return f"{value // (1024 * 1024)}MiB"
    if isinstance(value, int) and value >= 1024 and value % 1024 == 0:
        return f"{value // 1024}KiB"
    return str(value)


def test_every_producer_option_is_documented_with_its_default() -> None:
    rows = _option_rows()
    fields = {f.name: f.default for f in dataclasses.fields(ProducerConfig)}
    assert set(fields) == set(rows), "docs/producer.md's option table and ProducerConfig differ"
    for name, default in fields.items():
        if name in ("acks", "enable_idempotence"):
            continue  # spelled in words ("all", "on unless acks=0")
        assert _spelled(default) in rows[name], f"{name}: default {default!r} not in {rows[name]!r}"


def test_the_docs_index_lists_every_page() -> None:
    index = (DOCS / "README.md").read_text()
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    missing = sorted(p for p in pages if f"({p})" not in index)
    assert not missing, f"docs/README.md does not list {missing}"


#: A file cited in backquotes: a path with a directory and one of the repository's file kinds.
CITED = re.compile(r"`([\w./-]+/[\w.-]+\.(?:py|md|yaml|json|toml|proto|sh))`")


def test_every_file_docs_design_cites_exists() -> None:
    """Paths are read from the repository root, services/ or services/sluice (how the docs name modules)."""
    root = DOCS.parent
    cited = set(CITED.findall((DOCS / "design.md").read_text()))
    assert cited, "the pattern finds no citation at all"
    missing = sorted(
        p
        for p in cited
        if not any((base / p).exists() for base in (root, root / "services", root / "services" / "sluice"))
    )
    assert not missing, f"docs/design.md cites files that are not in the repository: {missing}"
