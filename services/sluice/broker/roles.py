"""A broker's part in each partition it hosts (leader or follower), and the epochs that fence stale orders.

The coordinator (the controller) tells every replica of a partition its state: leader, leader epoch,
partition epoch, replicas, ISR (``UpdatePartitions``). The broker whose id is the leader *serves* the
partition (produce, consumer fetch); the others *follow*: they hold the log but answer NOT_LEADER to clients
(and, in a later step, fetch from the leader). docs/replication.md, "Roles on the broker".

Two epochs never go backwards here, and survive restarts (the assignment journal persists them):

- the controller epoch (the coordinator's term): an update from an older one comes from a deposed
  coordinator, or from a Redis that rolled back, and is refused whole with STALE_CONTROLLER_EPOCH;
- per partition, (leader epoch, partition epoch) of the topic incarnation: an assignment older than one
  already seen is ignored (logged), and the partition keeps the role it has.

Pure: :class:`EpochBook` is plain data; the registry (``assignment.py``) applies and journals it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sluice.broker.fetch import TopicPartitionKey
from sluice.errors import StaleControllerEpoch

log = logging.getLogger(__name__)

__all__ = ["EpochBook", "EpochMark", "Role", "role_of"]


class Role(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"


class _Assigned(Protocol):
    @property
    def topic_id(self) -> str: ...
    @property
    def replicas(self) -> tuple[int, ...]: ...
    @property
    def leader(self) -> int | None: ...
    @property
    def leader_epoch(self) -> int: ...
    @property
    def partition_epoch(self) -> int: ...
    @property
    def key(self) -> TopicPartitionKey: ...


def role_of(item: _Assigned, broker_id: int) -> Role:
    """Leader when the assignment names this broker as leader, or names no leader at all (an update from
    a coordinator older than replication, or a standalone sender: the one broker that holds it leads)."""
    return Role.LEADER if item.leader is None or item.leader == broker_id else Role.FOLLOWER


@dataclass(frozen=True, slots=True)
class EpochMark:
    """The newest state seen for one partition of one topic incarnation."""

    topic_id: str
    leader_epoch: int
    partition_epoch: int
    #: The partition has other replicas: after a restart this broker does not serve it before the
    #: controller confirms who leads (another replica may have been elected meanwhile).
    replicated: bool = False

    def to_json(self, key: TopicPartitionKey) -> list[Any]:
        out = [key[0], key[1], self.topic_id, self.leader_epoch, self.partition_epoch]
        return [*out, 1] if self.replicated else out


def marks_from_json(raw: Iterable[Any]) -> dict[TopicPartitionKey, EpochMark]:
    """Entries of 5 fields (no ``replicated``: one replica) or 6."""
    out = {}
    for t, p, tid, le, pe, *rest in raw:
        out[(str(t), int(p))] = EpochMark(str(tid), int(le), int(pe), bool(rest and rest[0]))
    return out


class EpochBook:
    """The highest controller epoch and per-partition epochs seen. Caller: ``PartitionRegistry``."""

    def __init__(
        self, controller_epoch: int = 0, marks: Mapping[TopicPartitionKey, EpochMark] | None = None
    ) -> None:
        self.controller_epoch = controller_epoch
        self.marks: dict[TopicPartitionKey, EpochMark] = dict(marks or {})

    def check_controller(self, epoch: int) -> bool:
        """Raise StaleControllerEpoch for an epoch older than the highest seen; True when ``epoch`` is
        newer (the caller persists it). 0 (a sender without a term) is never refused."""
        if epoch <= 0 or epoch == self.controller_epoch:
            return False
        if epoch < self.controller_epoch:
            log.warning(
                "refusing a partition update from controller epoch %d: epoch %d was seen already",
                epoch,
                self.controller_epoch,
            )
            raise StaleControllerEpoch(
                f"controller epoch {epoch} is older than {self.controller_epoch}, which this broker has "
                "already seen: this coordinator was deposed (or its metadata rolled back)"
            )
        return True

    def is_stale(self, item: _Assigned) -> bool:
        """The assignment's (leader epoch, partition epoch) is older than seen for this topic incarnation
        (a reordered or replayed order of an older state): ignore it."""
        mark = self.marks.get(item.key)
        if mark is None or mark.topic_id != item.topic_id:
            return False
        stale = (item.leader_epoch, item.partition_epoch) < (mark.leader_epoch, mark.partition_epoch)
        if stale:
            log.warning(
                "ignoring the assignment of %s/%s at leader epoch %d, partition epoch %d: "
                "epochs %d, %d were seen already",
                *item.key,
                item.leader_epoch,
                item.partition_epoch,
                mark.leader_epoch,
                mark.partition_epoch,
            )
        return stale

    def newer_marks(self, items: Iterable[_Assigned]) -> dict[TopicPartitionKey, EpochMark]:
        """The marks ``items`` would change (not stale ones; the caller filtered those). A one-replica
        partition at epochs (0, 0) is not marked: nothing is older, so its mark would refuse nothing, and
        every unreplicated partition is that for ever (this keeps their journal frames what they were)."""
        out = {}
        for item in items:
            replicated = len(item.replicas) > 1
            if not (item.leader_epoch or item.partition_epoch or replicated):
                continue
            mark = EpochMark(item.topic_id, item.leader_epoch, item.partition_epoch, replicated)
            if self.marks.get(item.key) != mark:
                out[item.key] = mark
        return out
