"""Tag filter expressions: ``*`` (or empty) matches everything, ``a || b`` a set of tags.

Unlike RocketMQ, which filters by tag hash on the broker and again by string on
the client, Sluice filters exactly on the broker, so there is one parser and it
lives here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from sluice.errors import InvalidFilter

_TAG = re.compile(r"[A-Za-z0-9._:/-]{1,255}")


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A parsed filter. ``tags`` is None when everything matches."""

    expression: str
    tags: frozenset[str] | None

    @property
    def matches_all(self) -> bool:
        return self.tags is None

    def matches(self, tag: str | None) -> bool:
        return self.tags is None or (tag is not None and tag in self.tags)


MATCH_ALL = TagFilter("*", None)


@lru_cache(maxsize=4096)
def parse_filter(expression: str) -> TagFilter:
    """Parse a filter expression; raises InvalidFilter with the reason."""
    expr = expression.strip()
    if expr in ("", "*"):
        return MATCH_ALL
    parts = [p.strip() for p in expr.split("||")]
    for p in parts:
        if p == "*":
            return MATCH_ALL
        if not _TAG.fullmatch(p):
            raise InvalidFilter(
                f"invalid filter {expression!r}: {p!r} is not a tag "
                "(tags use [A-Za-z0-9._:/-]; combine them with '||', or use '*')"
            )
    return TagFilter(" || ".join(sorted(set(parts))), frozenset(parts))
