"""Reassignment plans the CLI computes from metadata: rebalance replicas over the live brokers, drain a
broker, or read a plan file. Pure functions over ``TopicInfo`` (no I/O); the plan goes to
``Admin.reassign_partitions``. docs/replication.md, "Reassignment".

A plan maps ``(topic, partition)`` to its target replicas in preference order; only partitions whose
replicas change are in it, so applying a plan twice moves nothing the second time.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sluice.client.metadata import TopicInfo
from sluice.errors import InvalidArgument

__all__ = ["Plan", "drain_plan", "parse_plan", "plan_to_json", "rebalance_plan"]

Plan = dict[tuple[str, int], tuple[int, ...]]


def rebalance_plan(
    topics: Iterable[TopicInfo], live: Sequence[int], racks: Mapping[int, str] | None = None
) -> Plan:
    """Spread replicas (and preferred leaders) evenly over ``live``, and each partition's replicas over
    racks: a replica on a broker holding more than its share (or on a broker not live), or sharing its
    rack with an earlier replica of the partition while a live broker of an unused rack has room, moves to
    the least-loaded live broker the partition is not on, a broker of a rack the partition does not use
    first; then each partition's preferred leader is its replica leading the fewest partitions so far.
    ``racks``: each broker's rack ("" or absent: unknown, never counted as shared). Moves are minimal in
    count for the greedy order (partitions in name order), not globally optimal: Kafka's tool leaves the
    plan to the user too. Where racks cannot all be distinct within the load ceiling (a rack with too few
    brokers), the load wins."""
    if not live:
        raise InvalidArgument("no live broker to rebalance onto")
    rack_of = _racks(racks)
    topics = sorted(topics, key=lambda t: t.name)
    current = {(t.name, p.partition): tuple(p.replicas) for t in topics for p in t.partitions}
    targets = {key: list(replicas) for key, replicas in current.items()}
    # One pass leaves rack conflicts a later partition's move made fixable; a few more settle them (and
    # make a second run of the command plan nothing). Each pass only moves what it improves.
    for _ in range(MAX_PASSES):
        changed = _balance(targets, live, rack_of)
        if racks:
            changed |= _swap_for_racks(targets, rack_of)
        if not changed:
            break
    return _with_leaders(current, targets)


#: Passes of the rebalance (each moves only replicas it places better).
MAX_PASSES = 8


def _balance(
    targets: dict[tuple[str, int], list[int]], live: Sequence[int], rack_of: Callable[[int], str]
) -> bool:
    """One greedy pass over ``targets`` (changed in place): whether it moved anything."""
    load: Counter[int] = Counter({b: 0 for b in live})
    for replicas in targets.values():
        load.update(b for b in replicas if b in load)
    total = sum(len(r) for r in targets.values())
    ceiling = -(-total // len(live))
    changed = False
    for target in targets.values():
        for i, b in enumerate(target):
            shared = not _unused(b, target[: i + 1], i, rack_of)  # an earlier replica has its rack
            fresh_racks = [
                c for c in live if c not in target and load[c] < ceiling and _unused(c, target, i, rack_of)
            ]
            if b in load and load[b] <= ceiling and not (shared and fresh_racks):
                continue
            spare = [c for c in live if c not in target and load[c] < ceiling]
            if not spare:
                spare = [c for c in live if c not in target] if b not in load else []
            if not spare:
                continue
            best = min(spare, key=lambda c: (not _unused(c, target, i, rack_of), load[c], c))
            target[i] = best
            load[best] += 1
            if b in load:
                load[b] -= 1
            changed = True
    return changed


def _swap_for_racks(targets: dict[tuple[str, int], list[int]], rack_of: Callable[[int], str]) -> bool:
    """Where a partition still holds two replicas in one rack because every broker of the racks it lacks
    is full, swap that replica with another partition's replica in a rack it lacks, when the swap keeps
    the other partition's racks distinct too: the brokers' loads stay as they are. Cost: for each such
    replica, one scan of the other partitions' replicas. Whether it swapped anything."""
    keys = list(targets)
    swapped = False
    for key in keys:
        mine = targets[key]
        for i, b in enumerate(mine):
            if _unused(b, mine, i, rack_of):
                continue
            for other in keys:
                theirs = targets[other]
                if other == key or b in theirs:
                    continue
                j = next(
                    (
                        j
                        for j, c in enumerate(theirs)
                        if c not in mine
                        and rack_of(c)
                        and _unused(c, mine, i, rack_of)
                        and _unused(b, theirs, j, rack_of)
                    ),
                    None,
                )
                if j is not None:
                    mine[i], theirs[j] = theirs[j], b
                    swapped = True
                    break
    return swapped


def drain_plan(
    topics: Iterable[TopicInfo], live: Sequence[int], broker: int, racks: Mapping[int, str] | None = None
) -> Plan:
    """Move every replica off ``broker``, each to the least-loaded other live broker the partition is
    not on, a broker of a rack the partition's other replicas do not use first (the partition's
    preference order kept, the replacement in the drained one's place)."""
    rack_of = _racks(racks)
    others = [b for b in live if b != broker]
    topics = sorted(topics, key=lambda t: t.name)
    load: Counter[int] = Counter({b: 0 for b in others})
    for t in topics:
        for p in t.partitions:
            load.update(b for b in p.replicas if b in load)
    plan: Plan = {}
    for t in topics:
        for p in t.partitions:
            if broker not in p.replicas:
                continue
            spare = [c for c in others if c not in p.replicas]
            if not spare:
                raise InvalidArgument(
                    f"{t.name}/{p.partition} has {len(p.replicas)} replicas and only {len(others)} other "
                    f"live brokers: add a broker before draining broker {broker}"
                )
            at = p.replicas.index(broker)
            best = min(spare, key=lambda c: (not _unused(c, p.replicas, at, rack_of), load[c], c))
            load[best] += 1
            plan[(t.name, p.partition)] = tuple(best if b == broker else b for b in p.replicas)
    return plan


def _racks(racks: Mapping[int, str] | None) -> Callable[[int], str]:
    known = dict(racks or {})
    return lambda broker: known.get(broker, "")


def _unused(candidate: int, replicas: Sequence[int], at: int, rack_of: Callable[[int], str]) -> bool:
    """Whether ``candidate`` in place ``at`` of ``replicas`` keeps the partition's racks distinct: its rack
    is unknown or used by none of the other replicas."""
    rack = rack_of(candidate)
    return not rack or all(rack_of(b) != rack for i, b in enumerate(replicas) if i != at)


def _with_leaders(
    current: Mapping[tuple[str, int], tuple[int, ...]], targets: Mapping[tuple[str, int], list[int]]
) -> Plan:
    leaders: Counter[int] = Counter()
    plan: Plan = {}
    for key, target in targets.items():
        first = min(target, key=lambda b: (leaders[b], target.index(b)))
        leaders[first] += 1
        ordered = (first, *(b for b in target if b != first))
        if ordered != current[key]:
            plan[key] = ordered
    return plan


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan file's shape (Kafka's reassignment JSON, lower-cased):
    ``{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [3, 1, 2]}]}``."""
    return {
        "version": 1,
        "partitions": [
            {"topic": t, "partition": p, "replicas": list(r)} for (t, p), r in sorted(plan.items())
        ],
    }


def parse_plan(text: str) -> Plan:
    """A plan file (see :func:`plan_to_json`), or InvalidArgument naming what is wrong."""
    try:
        doc = json.loads(text)
        entries = doc["partitions"]
        plan: Plan = {}
        for e in entries:
            key = (str(e["topic"]), int(e["partition"]))
            if key in plan:
                raise InvalidArgument(f"the plan names {key[0]}/{key[1]} twice")
            plan[key] = tuple(int(b) for b in e["replicas"])
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, InvalidArgument):
            raise
        raise InvalidArgument(
            f'invalid reassignment plan ({exc!r}): expected {{"partitions": [{{"topic": ..., '
            f'"partition": ..., "replicas": [...]}}]}}'
        ) from exc
    if not plan:
        raise InvalidArgument("the reassignment plan names no partition")
    return plan
