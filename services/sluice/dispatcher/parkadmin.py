"""Parked keys for operators: ``ListParkedKeys`` and ``UnparkKey`` (``sluice subscription parked|unpark``).

Core: authorizes, reads or changes the live state of a loaded subscription (``parking.py``), and
answers domain values (``convert.py`` makes the protobuf). Parking lives with the loaded
subscription: a subscription this dispatcher has not loaded has no parked key here (after a restart a
key parks again at its head's next return: ``docs/poison-keys.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.dispatcher.host import ServiceHost
from sluice.dispatcher.registry import wall_ms
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


class ParkedKeysAdmin:
    def __init__(self, service: ServiceHost) -> None:
        self._service = service

    def list(self, ctx: RequestContext, topic: str, subscription: str) -> list[ParkedKeyInfo]:
        """The parked keys of a loaded subscription, oldest first (none if it is not loaded here)."""
        service = self._service
        service.authorizer.authorize(
            ctx, Operation.DESCRIBE, Resource(ResourceType.SUBSCRIPTION, subscription)
        )
        service.authorizer.authorize(ctx, Operation.DESCRIBE, Resource(ResourceType.TOPIC, topic))
        rt = service.runtimes.get((topic, subscription))
        if rt is None or rt.closing:
            return []
        machine = rt.machine
        # The monotonic clock of parking, turned into wall-clock ms for the answer.
        now = service.now_ms()
        wall = wall_ms()
        out = []
        for pk in sorted(machine.parking.keys.values(), key=lambda k: k.since_ms):
            p, o = pk.head if pk.head is not None else (-1, -1)  # probing: no head yet
            ps = machine.partitions.get(p)
            count = ps.cursor.redelivery_count(o) if ps is not None else 0
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
