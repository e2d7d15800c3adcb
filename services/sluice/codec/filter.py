"""Filter expressions: tags (``*`` or empty matches everything, ``a || b`` a set of tags) or SQL92.

An SQL92 property filter travels as the same string, prefixed ``%SQL92%`` (``sql_expression``;
docs/filters.md): every place a filter already goes (fetch requests, group subscriptions and their
offset tracks, push subscriptions, message track) carries it unchanged, and the prefix, which no
tag can contain (``%`` is outside the tag alphabet), keeps a tag filter and an SQL filter of the
same text apart, also as offset-track identities.

Unlike RocketMQ, which filters by tag hash on the broker and again by string on
the client, Sluice filters exactly on the broker, so there is one parser and it
lives here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from sluice.codec.batch.layout import Headers
from sluice.codec.filter_limits import filter_limits
from sluice.codec.sql_filter import SqlFilter, compile_sql
from sluice.errors import InvalidFilter, LimitExceeded, echo

#: The prefix marking an SQL92 filter expression.
SQL_PREFIX = "%SQL92%"

_TAG = re.compile(r"[A-Za-z0-9._:/-]{1,255}")

# The limits (length, tag count, SQL depth and IN list) are ``codec/filter_limits``'s, configurable per
# service. A tag filter has no nesting (``a || b || c``): its size is its tag count; RocketMQ bounds
# neither, and a broker tests each fetched tag against the set (a hash lookup), so the bound is about
# memory and the cache, not CPU. The length is checked before anything else, and before the parse cache.


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A parsed filter. ``tags`` is None when no tag filter applies; ``sql`` is set for an SQL92
    filter (then ``tags`` is None). Everything matches when both are None."""

    expression: str
    tags: frozenset[str] | None
    sql: SqlFilter | None = None

    @property
    def matches_all(self) -> bool:
        return self.tags is None and self.sql is None

    def matches(self, tag: str | None, headers: Headers | None = None) -> bool:
        if self.sql is not None:
            return self.sql.matches(headers) if headers else self.sql.matches_empty
        return self.tags is None or (tag is not None and tag in self.tags)


MATCH_ALL = TagFilter("*", None)


def parse_filter(expression: str) -> TagFilter:
    """Parse a filter expression; raises InvalidFilter with the reason, LimitExceeded over a limit."""
    limit = filter_limits().max_length
    if len(expression) > limit:
        raise LimitExceeded(
            f"filter expression of {len(expression)} characters exceeds the limit of {limit} "
            f"characters (max_filter_length): {echo(expression)}",
            limit="max_filter_length",
            value=limit,
        )
    return _parse(expression)


@lru_cache(maxsize=4096)
def _parse(expression: str) -> TagFilter:
    expr = expression.strip()
    if expr.startswith(SQL_PREFIX):
        sql = compile_sql(expr[len(SQL_PREFIX) :])
        return TagFilter(sql_expression(sql.expression), None, sql)
    if expr in ("", "*"):
        return MATCH_ALL
    parts = [p.strip() for p in expr.split("||")]
    max_tags = filter_limits().max_tags
    if len(parts) > max_tags:
        raise LimitExceeded(
            f"filter names {len(parts)} tags, over the limit of {max_tags} (max_filter_tags): "
            f"{echo(expression)}",
            limit="max_filter_tags",
            value=max_tags,
        )
    for p in parts:
        if p == "*":
            return MATCH_ALL
        if not _TAG.fullmatch(p):
            raise InvalidFilter(
                f"invalid filter {echo(expression)}: {echo(p)} is not a tag "
                "(tags use [A-Za-z0-9._:/-]; combine them with '||', or use '*')"
            )
    return TagFilter(" || ".join(sorted(set(parts))), frozenset(parts))


def sql_expression(sql: str) -> str:
    """The filter expression of the SQL92 filter ``sql`` (``sql_expression("a > 1")``)."""
    return f"{SQL_PREFIX} {sql.strip()}"
