"""Parked keys for operators: ``ListParkedKeys`` and ``UnparkKey`` (``sluice subscription parked|unpark``).

Core: authorizes, reads or changes the live state of a loaded subscription (``parking.py``), and
answers domain values (``convert.py`` makes the protobuf). A subscription this dispatcher has not loaded
(right after a restart, before a consumer came back) is listed from its parking store
(``parkread.replay``), for the partitions this dispatcher serves, with the state ``stored``: its policy
and limits come with its first consumer. ``unpark`` needs it loaded (``docs/poison-keys.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.dispatcher.host import ServiceHost
from sluice.dispatcher.parkread import replay
from sluice.dispatcher.registry import wall_ms
from sluice.retry.parkbook import sub_park_topic
from sluice.security.context import Operation, RequestContext
from sluice.security.model import Resource, ResourceType

__all__ = ["ParkedKeyInfo", "ParkedKeysAdmin"]


@dataclass(frozen=True, slots=True)
class ParkedKeyInfo:
    key: bytes
    state: str
    since_ms: int
    head_partition: int
    head_offset: int
    head_redelivery_count: int
    waiting: int
    dispatcher_id: str


async def stored_keys(service: ServiceHost, topic: str, subscription: str) -> list[ParkedKeyInfo]:
    """The parked keys in the store of a subscription not loaded here (partitions served here)."""
    mine = set(service.link.view.partitions_of(topic, service.dispatcher_id))
    book = (await replay(service.link, service.channels, sub_park_topic(topic, subscription))).book
    by_key: dict[bytes, list[tuple[int, int, int, int, int]]] = {}
    for ((t, p), key), bk in book.keys.items():
        if t == topic and p in mine and bk.pending:
            head = bk.pending[0].offset
            by_key.setdefault(key, []).append((p, head, bk.count, bk.since_ms, len(bk.pending)))
    out = []
    for key, parts in by_key.items():
        p, o, *_ = min(parts)
        out.append(
            ParkedKeyInfo(
                key=key,
                state="stored",
                since_ms=min(s for _, _, _, s, _ in parts),
                head_partition=p,
                head_offset=o,
                head_redelivery_count=max(c for _, _, c, _, _ in parts),
                waiting=sum(n for *_, n in parts) - 1,
                dispatcher_id=service.dispatcher_id,
            )
        )
    return sorted(out, key=lambda k: k.since_ms)


class ParkedKeysAdmin:
    def __init__(self, service: ServiceHost) -> None:
        self._service = service

    async def list(self, ctx: RequestContext, topic: str, subscription: str) -> list[ParkedKeyInfo]:
        """The parked keys of a subscription, oldest first (from its store if it is not loaded here)."""
        service = self._service
        service.authorizer.authorize(
            ctx, Operation.DESCRIBE, Resource(ResourceType.SUBSCRIPTION, subscription)
        )
        service.authorizer.authorize(ctx, Operation.DESCRIBE, Resource(ResourceType.TOPIC, topic))
        rt = service.runtimes.get((topic, subscription))
        if rt is None or rt.closing:
            return await stored_keys(service, topic, subscription)
        machine = rt.machine
        # The monotonic clock of parking, turned into wall-clock ms for the answer.
        now = service.now_ms()
        wall = wall_ms()
        out = []
        for pk in sorted(machine.parking.keys.values(), key=lambda k: k.since_ms):
            p, o = pk.head if pk.head is not None else (-1, -1)  # probing: no head yet
            ps = machine.partitions.get(p)
            count = machine.parking.counts.get((p, o), 0)  # a stored head: parking counts it
            if not count and ps is not None:
                count = ps.cursor.redelivery_count(o)
            out.append(
                ParkedKeyInfo(
                    key=pk.key,
                    state=pk.state.value,
                    since_ms=wall - (now - pk.since_ms),
                    head_partition=p,
                    head_offset=o,
                    head_redelivery_count=count,
                    waiting=sum(1 for m in pk.waiting if (m.partition, m.offset) != pk.head),
                    dispatcher_id=service.dispatcher_id,
                )
            )
        return out

    def unpark(self, ctx: RequestContext, topic: str, subscription: str, key: bytes) -> tuple[bool, int]:
        """Release ``key``: its waiting messages go again, counted from 0. (found, messages released)."""
        service = self._service
        service.authorizer.authorize(ctx, Operation.ALTER, Resource(ResourceType.SUBSCRIPTION, subscription))
        rt = service.runtimes.get((topic, subscription))
        if rt is None or rt.closing:
            return False, 0
        pk = rt.machine.parking.keys.get(key)
        if pk is None:
            return False, 0
        released = len(pk.waiting)
        rt.call(lambda now: rt.machine.unpark(key, now))
        return True, released
