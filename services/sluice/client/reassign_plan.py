"""Reassignment plans the CLI computes from metadata: rebalance replicas over the live brokers, drain a
broker, or read a plan file. Pure functions over ``TopicInfo`` (no I/O); the plan goes to
``Admin.reassign_partitions``. docs/replication.md, "Reassignment".

A plan maps ``(topic, partition)`` to its target replicas in preference order; only partitions whose
replicas change are in it, so applying a plan twice moves nothing the second time.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sluice.client.metadata import TopicInfo
from sluice.errors import InvalidArgument

__all__ = ["Plan", "drain_plan", "parse_plan", "plan_to_json", "rebalance_plan"]

Plan = dict[tuple[str, int], tuple[int, ...]]


def rebalance_plan(topics: Iterable[TopicInfo], live: Sequence[int]) -> Plan:
    """Spread replicas (and preferred leaders) evenly over ``live``: a replica on a broker holding more
    than its share (or on a broker not live) moves to the least-loaded live broker the partition is not
    on; then each partition's preferred leader is its replica leading the fewest partitions so far. Moves
    are minimal in count for the greedy order (partitions in name order), not globally optimal: Kafka's
    tool leaves the plan to the user too, and a second run converges further."""
    if not live:
        raise InvalidArgument("no live broker to rebalance onto")
    topics = sorted(topics, key=lambda t: t.name)
    current = {(t.name, p.partition): tuple(p.replicas) for t in topics for p in t.partitions}
    load: Counter[int] = Counter({b: 0 for b in live})
    for replicas in current.values():
        load.update(b for b in replicas if b in load)
    total = sum(len(r) for r in current.values())
    ceiling = -(-total // len(live))
    targets: dict[tuple[str, int], list[int]] = {}
    for key, replicas in current.items():
        target = list(replicas)
        for i, b in enumerate(target):
            if b in load and load[b] <= ceiling:
                continue
            spare = [c for c in live if c not in target and load[c] < ceiling]
            if not spare:
                spare = [c for c in live if c not in target] if b not in load else []
            if not spare:
                continue
            best = min(spare, key=lambda c: (load[c], c))
            target[i] = best
            load[best] += 1
            if b in load:
                load[b] -= 1
        targets[key] = target
    return _with_leaders(current, targets)


def drain_plan(topics: Iterable[TopicInfo], live: Sequence[int], broker: int) -> Plan:
    """Move every replica off ``broker``, each to the least-loaded other live broker the partition is
    not on (the partition's preference order kept, the replacement in the drained one's place)."""
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
            best = min(spare, key=lambda c: (load[c], c))
            load[best] += 1
            plan[(t.name, p.partition)] = tuple(best if b == broker else b for b in p.replicas)
    return plan


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
