"""Replication values of the controller: a topic's replication config and one partition's replica state.

Pure domain values (no protobuf, no I/O). docs/replication.md, "Topic configuration" and "Controller
state", says what each field means and why the defaults are what they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.errors import InvalidArgument, InvalidReplicationFactor

__all__ = [
    "DEFAULT_SPEC",
    "MAX_REPLICATION_FACTOR",
    "NO_LEADER",
    "UNREPLICATED",
    "PartitionState",
    "ReplicaLog",
    "ReplicationConfig",
    "ReplicationSpec",
    "altered",
    "default_min_insync",
]

#: ``leader`` of a partition without one (offline): no live in-sync replica could take over.
NO_LEADER = -1
#: More replicas than this is a typo, not a plan (Kafka has no cap; each replica costs a broker a fetch).
MAX_REPLICATION_FACTOR = 16


def default_min_insync(factor: int) -> int:
    """``min(2, factor)``: at factor 3 an acknowledged write survives one lost broker while one more
    may be down; at factor 1 there is nothing else to wait for."""
    return min(2, factor)


@dataclass(frozen=True)
class ReplicationConfig:
    """A topic's replication settings, resolved (no "default" placeholders left)."""

    factor: int = 1
    min_insync_replicas: int = 1
    unclean_leader_election: bool = False

    @property
    def is_default(self) -> bool:
        """The settings every topic had before replication (kept out of the persisted record)."""
        return self == ReplicationConfig()

    def to_dict(self) -> dict[str, Any]:
        return {
            "factor": self.factor,
            "min_insync_replicas": self.min_insync_replicas,
            "unclean_leader_election": self.unclean_leader_election,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplicationConfig:
        return cls(
            int(data.get("factor", 1)),
            int(data.get("min_insync_replicas", 1)),
            bool(data.get("unclean_leader_election", False)),
        )


def altered(
    config: ReplicationConfig, topic: str, min_insync_replicas: int, unclean_leader_election: bool | None
) -> ReplicationConfig:
    """``config`` with the settings an AlterTopic changes (0 / None: unchanged), or the typed error."""
    min_isr = min_insync_replicas or config.min_insync_replicas
    if min_insync_replicas < 0 or not 1 <= min_isr <= config.factor:
        raise InvalidArgument(
            f"topic {topic!r}: min_insync_replicas must be between 1 and the replication factor "
            f"({config.factor}), got {min_insync_replicas}"
        )
    unclean = config.unclean_leader_election if unclean_leader_election is None else unclean_leader_election
    return ReplicationConfig(config.factor, min_isr, unclean)


@dataclass(frozen=True)
class ReplicationSpec:
    """What a CreateTopic asks for: 0 means "the default" (the wire form's unset fields)."""

    factor: int = 0
    min_insync_replicas: int = 0
    unclean_leader_election: bool = False

    def resolve(self, default_factor: int, topic: str) -> ReplicationConfig:
        """The config this spec gives, or the typed error naming the bad value. Live brokers are checked
        by the caller (``ClusterState.create_topic``), which knows them."""
        factor = self.factor or default_factor
        if not 1 <= factor <= MAX_REPLICATION_FACTOR:
            raise InvalidReplicationFactor(
                f"topic {topic!r}: replication factor must be between 1 and {MAX_REPLICATION_FACTOR}, "
                f"got {factor}"
            )
        min_isr = self.min_insync_replicas or default_min_insync(factor)
        if self.min_insync_replicas < 0 or not 1 <= min_isr <= factor:
            raise InvalidArgument(
                f"topic {topic!r}: min_insync_replicas must be between 1 and the replication factor "
                f"({factor}), got {self.min_insync_replicas}"
            )
        return ReplicationConfig(factor, min_isr, self.unclean_leader_election)


#: The replication every topic had before replication existed (and the default of a view without one).
UNREPLICATED = ReplicationConfig()
#: A CreateTopic that names no replication settings.
DEFAULT_SPEC = ReplicationSpec()


@dataclass(frozen=True)
class ReplicaLog:
    """A replica's log as it reported it at an unclean restart: one entry of a partition's unclean-recovery
    pool (KIP-966's LastKnownElr, with the log lengths; docs/replication.md, "Unclean shutdowns")."""

    broker: int
    last_leader_epoch: int
    log_end_offset: int
    damaged: bool = False

    @property
    def length(self) -> tuple[int, int]:
        return (self.last_leader_epoch, self.log_end_offset)

    def to_list(self) -> list[int]:
        return [self.broker, self.last_leader_epoch, self.log_end_offset, int(self.damaged)]

    @classmethod
    def from_list(cls, data: Sequence[Any]) -> ReplicaLog:
        return cls(int(data[0]), int(data[1]), int(data[2]), bool(data[3]))


@dataclass(frozen=True)
class PartitionState:
    """One partition as the controller keeps it (docs/replication.md, "Controller state").

    ``replicas`` in preference order (the first is the preferred leader); ``leader`` is
    :data:`NO_LEADER` when offline; ``leader_epoch`` moves at every leader change, ``partition_epoch`` at
    every change of this state; ``isr`` the in-sync replicas; ``elr`` the eligible leader replicas of
    KIP-966 (out of the ISR, but still holding every committed record).
    """

    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    isr: tuple[int, ...] = ()
    elr: tuple[int, ...] = ()
    #: A reassignment in progress (docs/replication.md, "Reassignment"): replicas being added (followers
    #: catching up) and replicas that leave once every added one is in the ISR. ``replicas`` holds both.
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()
    #: The reassignment's replication throttle, bytes/s per added replica (0: none).
    throttle: int = 0
    #: The replica list in its order before the reassignment in progress started: what a cancel goes back
    #: to (``replicas`` minus ``adding`` holds the same brokers, but the target's order first).
    original: tuple[int, ...] = ()
    #: The unclean-recovery pool: replicas taken out of the ISR / ELR after an unclean restart, with the
    #: log each reported, until they rejoin the ISR or a recovery elects one. Persisted with the state so
    #: a new controller term still knows the earlier reports (KIP-966's LastKnownElr).
    pool: tuple[ReplicaLog, ...] = ()

    @property
    def target(self) -> tuple[int, ...]:
        """The replicas once the reassignment in progress (if any) completes, in preference order."""
        return tuple(r for r in self.replicas if r not in self.removing)

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @classmethod
    def new(cls, replicas: Sequence[int]) -> PartitionState:
        """A new partition: the preferred replica leads, every replica is in sync, epochs 0."""
        if not replicas or len(set(replicas)) != len(replicas):
            raise ValueError(f"replicas must be distinct and non-empty, got {list(replicas)}")
        return cls(tuple(replicas), replicas[0], 0, 0, tuple(replicas), ())

    @property
    def is_single(self) -> bool:
        """A one-replica partition at epoch 0: all that a record of before replication could hold."""
        return (
            len(self.replicas) == 1
            and self.leader == self.replicas[0]
            and self.isr == self.replicas
            and not self.elr
            and not self.reassigning
            and not self.pool
            and self.leader_epoch == 0
            and self.partition_epoch == 0
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "replicas": list(self.replicas),
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "partition_epoch": self.partition_epoch,
            "isr": list(self.isr),
            "elr": list(self.elr),
        }
        # Only while reassigning, so records of every other partition stay as they were.
        if self.reassigning:
            out["adding"] = list(self.adding)
            out["removing"] = list(self.removing)
            out["throttle"] = self.throttle
            if self.original:
                out["original"] = list(self.original)
        if self.pool:  # only while it holds reports, like the reassignment's fields
            out["pool"] = [r.to_list() for r in self.pool]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PartitionState:
        return cls(
            tuple(int(b) for b in data["replicas"]),
            int(data["leader"]),
            int(data.get("leader_epoch", 0)),
            int(data.get("partition_epoch", 0)),
            tuple(int(b) for b in data.get("isr", ())),
            tuple(int(b) for b in data.get("elr", ())),
            tuple(int(b) for b in data.get("adding", ())),
            tuple(int(b) for b in data.get("removing", ())),
            int(data.get("throttle", 0)),
            tuple(int(b) for b in data.get("original", ())),
            tuple(ReplicaLog.from_list(r) for r in data.get("pool", ())),
        )
