"""ResetOffsets: the one sanctioned way to move a committed offset backwards.

Commits are increase-only (``scripts.COMMIT``); a reset sets offsets exactly, and only

- through this explicit admin request (never through CommitOffsets),
- while the group has no live members (checked here to fail fast, and again atomically in
  ``scripts.RESET``, so a consumer that joins meanwhile refuses the whole reset),
- for every named partition in one write: all topics of one request land together or not at all
  (every topic of a track lives in one hash).

A request is resolved in four steps: which partitions (named, every partition of a named topic, or
every topic with a committed offset), the offsets committed now, the log bounds and timestamp lookups
from the brokers (``resolver.py``), and the targets, clamped into ``[log start, log end]``.
``dry_run`` stops before the write: that is ``sluice group reset-offsets`` without ``--execute``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from sluice.common.units import iso_ms
from sluice.errors import InvalidArgument, UnknownGroup
from sluice.offsetstore.model import ResetOutcome, ResetRequest, ResetSpec, TopicPartition
from sluice.offsetstore.storage import FetchedOffsets, group_not_empty

__all__ = ["OffsetResolver", "ResetStore", "plan_outcomes", "run_reset"]

CLAMP_START = "log_start"
CLAMP_END = "log_end"


class OffsetResolver(Protocol):
    """Looks up offsets the broker knows (see resolver.BrokerOffsetResolver)."""

    async def partitions(self, topic: str) -> list[int]: ...

    async def resolve(
        self, topic: str, partitions: Sequence[int], spec: ResetSpec, value: int
    ) -> dict[int, int]: ...

    async def close(self) -> None: ...


class ResetStore(Protocol):
    """What a reset needs of storage.PositionStore."""

    async def live_members(self, group: str) -> int: ...

    async def fetch(
        self, group: str, track: str, partitions: Sequence[TopicPartition] = (), member_id: str = ""
    ) -> FetchedOffsets: ...

    async def reset(
        self, group: str, track: str, offsets: Mapping[TopicPartition, int], topic_ids: Mapping[str, str]
    ) -> None: ...


def check_not_future(timestamp_ms: int, now_ms: int) -> None:
    """A reset to a time that has not come yet is a mistake (a wrong year or zone), not "latest"."""
    if timestamp_ms > now_ms:
        raise InvalidArgument(
            f"reset to {iso_ms(timestamp_ms)}: that time is in the future (the offset store's clock reads "
            f"{iso_ms(now_ms)}); give a past time, or reset to latest"
        )


def plan_outcomes(
    spec: ResetSpec,
    value: int,
    partitions: Sequence[TopicPartition],
    previous: Mapping[TopicPartition, int],
    bounds: Mapping[TopicPartition, tuple[int, int]] | None,
    found: Mapping[TopicPartition, int] | None = None,
) -> list[ResetOutcome]:
    """The target of each partition, clamped into its log bounds when they are known. Pure.

    ``previous``: committed offsets (absent: none). ``bounds``: (log start, log end) per partition, or
    None when no broker was asked (an explicit offset without a coordinator: set as given). ``found``:
    the brokers' answer for a timestamp.
    """
    if spec is ResetSpec.SHIFT:
        missing = [str(tp) for tp in partitions if previous.get(tp, -1) < 0]
        if missing:
            raise InvalidArgument(
                f"cannot shift partitions without a committed offset: {', '.join(missing)}; reset them to "
                "an offset, a time, earliest or latest first"
            )
    out = []
    for tp in partitions:
        before = previous.get(tp, -1)
        start, end = bounds[tp] if bounds is not None else (-1, -1)
        if spec is ResetSpec.EARLIEST:
            target = start
        elif spec is ResetSpec.LATEST:
            target = end
        elif spec is ResetSpec.TIMESTAMP:
            assert found is not None
            target = found[tp]
        elif spec is ResetSpec.SHIFT:
            target = before + value
        else:
            target = value
        clamped = ""
        if bounds is not None and target < start:
            target, clamped = start, CLAMP_START
        elif bounds is not None and target > end:
            target, clamped = end, CLAMP_END
        out.append(ResetOutcome(tp.topic, tp.partition, before, max(0, target), clamped, start, end))
    return out


async def _partitions(
    store: ResetStore, resolver: OffsetResolver | None, request: ResetRequest, track: str
) -> list[TopicPartition]:
    targets = dict(request.targets)
    committed: dict[TopicPartition, int] | None = None
    if request.all_topics:
        committed = (await store.fetch(request.group, track)).offsets
        if not committed and not targets:
            raise UnknownGroup(
                f"group {request.group!r} has no committed offsets on track {track!r}: nothing to reset "
                "for all topics; name the topics to reset"
            )
        for tp in committed:
            targets.setdefault(tp.topic, ())
    out: list[TopicPartition] = []
    for topic, parts in sorted(targets.items()):
        if parts:
            chosen = sorted(parts)
        elif resolver is not None:
            chosen = await resolver.partitions(topic)
        else:
            if committed is None:
                committed = (await store.fetch(request.group, track)).offsets
            chosen = sorted(tp.partition for tp in committed if tp.topic == topic)
            if not chosen:
                raise InvalidArgument(
                    f"group {request.group!r} has no committed offsets for topic {topic!r} on track "
                    f"{track!r}: list the partitions to reset explicitly"
                )
        out.extend(TopicPartition(topic, p) for p in chosen)
    return out


async def _bounds(
    resolver: OffsetResolver, partitions: Sequence[TopicPartition]
) -> dict[TopicPartition, tuple[int, int]]:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    topics = sorted(by_topic)
    starts, ends = await asyncio.gather(
        asyncio.gather(*(resolver.resolve(t, by_topic[t], ResetSpec.EARLIEST, 0) for t in topics)),
        asyncio.gather(*(resolver.resolve(t, by_topic[t], ResetSpec.LATEST, 0) for t in topics)),
    )
    out = {}
    for topic, start, end in zip(topics, starts, ends, strict=True):
        for p in by_topic[topic]:
            out[TopicPartition(topic, p)] = (start[p], end[p])
    return out


async def _lookup(
    resolver: OffsetResolver, partitions: Sequence[TopicPartition], timestamp: int
) -> dict[TopicPartition, int]:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    topics = sorted(by_topic)
    replies = await asyncio.gather(
        *(resolver.resolve(t, by_topic[t], ResetSpec.TIMESTAMP, timestamp) for t in topics)
    )
    return {
        TopicPartition(t, p): off
        for t, reply in zip(topics, replies, strict=True)
        for p, off in reply.items()
    }


async def run_reset(
    store: ResetStore, resolver: OffsetResolver | None, request: ResetRequest, track: str
) -> list[ResetOutcome]:
    """Resolve ``request`` and, unless it is a dry run, write it. Raises GroupNotEmpty while the group
    has live members (a dry run too: its preview could not be executed)."""
    group, spec = request.group, request.spec
    if spec is not ResetSpec.OFFSET and resolver is None:
        raise InvalidArgument(
            f"this offset store cannot resolve {spec.name.lower()} offsets: it runs without a "
            "coordinator address (--coordinator). Only explicit offsets (RESET_SPEC_OFFSET) can be set; "
            "configure the coordinator or look the offsets up with the broker's ListOffsets"
        )
    if spec is ResetSpec.TIMESTAMP:
        check_not_future(request.value, int(time.time() * 1000))
    # Fail fast before asking brokers; the Lua script checks again atomically.
    live = await store.live_members(group)
    if live > 0:
        raise group_not_empty(group, live)
    partitions = await _partitions(store, resolver, request, track)
    # The topics' ids are read with the offsets: the write is refused (UNKNOWN_TOPIC_ID) if one of them
    # is deleted or re-created while the brokers are asked, so no target of an old incarnation lands.
    fetched = await store.fetch(group, track, partitions)
    previous = fetched.offsets
    bounds = await _bounds(resolver, partitions) if resolver is not None else None
    found = (
        await _lookup(resolver, partitions, request.value)
        if spec is ResetSpec.TIMESTAMP and resolver
        else None
    )
    outcomes = plan_outcomes(spec, request.value, partitions, previous, bounds, found)
    if not request.dry_run:
        targets = {TopicPartition(o.topic, o.partition): o.offset for o in outcomes}
        await store.reset(group, track, targets, fetched.topic_ids)
    return outcomes
