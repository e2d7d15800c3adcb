"""Quota entities and limits, the snapshot services decide from, and their protobuf forms.

An entity is a user (an authenticated principal's name) or a client id (what an anonymous caller is
known by); ``name == ""`` is the default of its kind: it applies to every entity of that kind without
a quota of its own. Each matched key is limited on its own (two clients under one default quota each
get the whole of it), as in Kafka. A limit of 0 is no limit.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from sluice.errors import InvalidArgument
from sluice.security.model import Principal
from sluice.v1 import quota_pb2 as pb

__all__ = [
    "MAX_NAME",
    "Kind",
    "Limits",
    "QuotaKey",
    "QuotaSnapshot",
    "Resource",
    "entity_from_proto",
    "key_of",
    "limits_from_proto",
    "limits_to_proto",
]

#: The longest entity name accepted (a principal or a client id).
MAX_NAME = 256


class Kind(enum.Enum):
    USER = "user"
    CLIENT = "client"


class Resource(enum.Enum):
    """What a quota meters."""

    PRODUCE_BYTES = "produce_bytes_per_second"
    FETCH_BYTES = "fetch_bytes_per_second"
    REQUESTS = "requests_per_second"
    SUBSCRIBES = "subscribes_per_second"


@dataclass(frozen=True, slots=True)
class QuotaKey:
    """One entity: ``(kind, name)``; ``name == ""`` is the kind's default."""

    kind: Kind
    name: str

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.name or '<default>'}"


@dataclass(frozen=True, slots=True)
class Limits:
    """Rates per second; 0 is unlimited."""

    produce_bytes_per_second: float = 0.0
    fetch_bytes_per_second: float = 0.0
    requests_per_second: float = 0.0
    subscribes_per_second: float = 0.0

    def rate(self, resource: Resource) -> float:
        rate: float = getattr(self, resource.value)
        return rate

    @property
    def empty(self) -> bool:
        return not any(self.rate(r) for r in Resource)

    def to_dict(self) -> dict[str, float]:
        return {r.value: self.rate(r) for r in Resource if self.rate(r)}


def key_of(principal: Principal, client_id: str) -> QuotaKey:
    """Whom a request counts against: the authenticated principal, else the client id (KIP-55's
    order: an anonymous caller is only known by what it calls itself)."""
    if not principal.anonymous:
        return QuotaKey(Kind.USER, principal.name)
    return QuotaKey(Kind.CLIENT, client_id[:MAX_NAME])


class QuotaSnapshot:
    """Every quota at one version; resolves a key to its limits (its own, else its kind's default)."""

    def __init__(self, quotas: Mapping[QuotaKey, Limits] | None = None, version: int = 0) -> None:
        self.quotas: dict[QuotaKey, Limits] = dict(quotas or {})
        self.version = version

    def limits(self, key: QuotaKey) -> tuple[QuotaKey, Limits] | None:
        """The entry that governs ``key`` (its own, or the default), or None: unlimited."""
        own = self.quotas.get(key)
        if own is not None:
            return key, own
        default_key = QuotaKey(key.kind, "")
        default = self.quotas.get(default_key)
        return (default_key, default) if default is not None else None

    def __iter__(self) -> Iterator[tuple[QuotaKey, Limits]]:
        return iter(sorted(self.quotas.items(), key=lambda kv: (kv[0].kind.value, kv[0].name)))

    def __len__(self) -> int:
        return len(self.quotas)


# ---- protobuf -------------------------------------------------------------------------------------


def entity_from_proto(msg: pb.QuotaEntity) -> QuotaKey:
    try:
        kind = Kind(msg.kind)
    except ValueError:
        raise InvalidArgument(f"quota entity kind {msg.kind[:40]!r} is not one of: user, client") from None
    if len(msg.name) > MAX_NAME:
        raise InvalidArgument(f"quota entity name of {len(msg.name)} characters; at most {MAX_NAME}")
    return QuotaKey(kind, msg.name)


def entity_to_proto(key: QuotaKey) -> pb.QuotaEntity:
    return pb.QuotaEntity(kind=key.kind.value, name=key.name)


def limits_from_proto(msg: pb.QuotaLimits) -> Limits:
    values = [float(getattr(msg, r.value)) for r in Resource]
    for resource, value in zip(Resource, values, strict=True):
        if not value >= 0 or value == float("inf"):  # NaN fails >= too
            raise InvalidArgument(f"{resource.value} must be a finite number >= 0, got {value}")
    return Limits(*values)


def limits_to_proto(limits: Limits) -> pb.QuotaLimits:
    return pb.QuotaLimits(
        produce_bytes_per_second=round(limits.produce_bytes_per_second),
        fetch_bytes_per_second=round(limits.fetch_bytes_per_second),
        requests_per_second=limits.requests_per_second,
        subscribes_per_second=limits.subscribes_per_second,
    )


def quota_to_proto(key: QuotaKey, limits: Limits) -> pb.Quota:
    return pb.Quota(entity=entity_to_proto(key), limits=limits_to_proto(limits))


def snapshot_from_proto(quotas: Iterable[pb.Quota], version: int) -> QuotaSnapshot:
    return QuotaSnapshot({entity_from_proto(q.entity): limits_from_proto(q.limits) for q in quotas}, version)
