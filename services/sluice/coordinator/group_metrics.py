"""Which consumer groups get per-group series on ``/metrics``: a bounded set.

Each exported group costs about 2.5 KB of ``/metrics`` (members, state, rebalances and their duration
histogram, fencings) plus its lag series, refreshed every second; 750 groups made a 2.7 MB page, and
every group ever seen was exported. Now at most ``--group-metrics-max`` groups are (default 200:
about 0.5 MB), chosen in this order, each by name:

1. groups with members (the ones whose rebalances and lag someone is watching),
2. groups asked about recently (``DescribeGroup``),
3. the others (empty groups: idle offsets waiting for their retention).

``--group-metrics-groups`` (names or regular expressions, comma separated, each matched in full)
exports only the matching groups (still at most ``--group-metrics-max``). The rest are counted, not
exported: ``sluice_coordinator_groups{state}`` counts every group, and
``sluice_coordinator_groups_not_exported`` says how many have no series of their own.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from sluice.errors import InvalidArgument

__all__ = ["DEFAULT_MAX_GROUPS", "GroupMetricsPolicy"]

DEFAULT_MAX_GROUPS = 200


@dataclass(frozen=True)
class GroupMetricsPolicy:
    max_groups: int = DEFAULT_MAX_GROUPS
    patterns: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def parse(cls, max_groups: int, spec: str) -> GroupMetricsPolicy:
        """From the flags; a bad value is InvalidArgument naming the flag."""
        if max_groups < 0:
            raise InvalidArgument(f"--group-metrics-max {max_groups} must be >= 0 (0: no per-group series)")
        patterns = []
        for item in (part.strip() for part in spec.split(",")):
            if not item:
                continue
            try:
                patterns.append(re.compile(item))
            except re.error as exc:
                raise InvalidArgument(
                    f"--group-metrics-groups: {item!r} is not a regular expression: {exc}"
                ) from exc
        return cls(max_groups, tuple(patterns))

    def named(self, group: str) -> bool:
        """Whether ``--group-metrics-groups`` names ``group`` (False when it is not given)."""
        return any(p.fullmatch(group) for p in self.patterns)

    def select(self, groups: Iterable[str], live: Collection[str], asked: Collection[str]) -> list[str]:
        """The groups to export, at most ``max_groups``: live first, then asked, then the rest, by name.
        O(groups) plus a sort of the live and asked ones: the caller runs it only when the groups changed."""
        candidates = [g for g in groups if self.named(g)] if self.patterns else list(groups)
        room = self.max_groups
        out: list[str] = []
        for tier in (
            sorted(g for g in candidates if g in live),
            sorted(g for g in candidates if g in asked and g not in live),
        ):
            out += tier[: max(0, room - len(out))]
        if len(out) < room:
            chosen = set(out)
            rest = (g for g in candidates if g not in chosen)
            out += heapq.nsmallest(room - len(out), rest)
        return out
