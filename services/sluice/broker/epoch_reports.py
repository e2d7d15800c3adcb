"""What this broker tells the controller about partitions it knows newer state of than the controller.

After a Redis failover the controller's store may have lost the latest leader, ISR or epoch changes, which
this broker obeyed and persisted (its epoch marks). When the controller then sends an assignment older than
a mark (ignored as stale, ``roles.EpochBook.is_stale``), the registry keeps the partition in ``ahead``, and
each heartbeat reports it: the epochs of the mark, and the leader, replicas and ISR as this broker knows
them (the follower's assignment, or the leader's own state). The controller takes the newest report before
electing anyone (``coordinator/cluster/rebuild.py``). Bounded: only partitions the controller is behind on,
at most :data:`MAX_REPORTS` per heartbeat (the rest go in the next ones).
docs/replication.md, "Controller state that cannot roll back".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from sluice.broker.assignment import PartitionRegistry
from sluice.broker.leading import Leaders
from sluice.broker.log.manager import LogManager
from sluice.v1 import coordinator_pb2

__all__ = ["MAX_REPORTS", "DamageReports", "epoch_reports", "log_reports"]

MAX_REPORTS = 1_000
#: A partition found damaged again (every read of the damaged batch finds it) is reported at most this
#: often: the controller's answer to the first report is all there is to do.
DAMAGE_REPORT_EVERY_S = 5.0
_UNKNOWN = -1


def epoch_reports(
    registry: PartitionRegistry, leaders: Leaders, broker_id: int
) -> list[coordinator_pb2.PartitionEpochReport]:
    out = []
    for key in sorted(registry.ahead)[:MAX_REPORTS]:
        mark = registry.epochs.marks.get(key)
        if mark is None:
            continue
        leader: int = _UNKNOWN
        replicas: tuple[int, ...] = ()
        isr: tuple[int, ...] = ()
        followed = registry.following.get(key)
        led = leaders.states.get(key)
        if followed is not None and followed.leader is not None:
            leader, replicas, isr = followed.leader, followed.replicas, followed.isr
        elif led is not None and key in registry.served:
            leader, replicas, isr = broker_id, led.replicas, led.isr
        out.append(
            coordinator_pb2.PartitionEpochReport(
                topic=key[0],
                topic_id=mark.topic_id,
                partition=key[1],
                leader_epoch=mark.leader_epoch,
                partition_epoch=mark.partition_epoch,
                leader=leader,
                replicas=replicas,
                isr=isr,
            )
        )
    return out


def log_reports(
    logs: LogManager, only: Collection[tuple[str, int]] | None = None
) -> list[coordinator_pb2.PartitionLogReport]:
    """Each log as it is now (``only``: these partitions): its newest leader epoch, its log end, whether
    it holds batches that failed verification. Listed at every registration: the controller removes the
    stray ones (``coordinator/cluster/strays.py``) and, after an unclean shutdown, its recovery elects
    the longest (``coordinator/cluster/unclean.py``)."""
    out = []
    for (topic, partition), plog in sorted(logs.partitions().items()):
        if only is not None and (topic, partition) not in only:
            continue
        out.append(
            coordinator_pb2.PartitionLogReport(
                topic=topic,
                topic_id=logs.topic_id(topic, partition) or "",
                partition=partition,
                last_leader_epoch=plog.latest_epoch,
                log_end_offset=plog.log_end_offset,
                damaged=bool(plog.corrupt_ranges),
            )
        )
    return out


class DamageReports:
    """Partitions whose reads found a damaged batch (``PartitionLog.on_damage``), for the next heartbeat,
    which ``wake`` sends at once. The controller moves leadership away and takes this replica out of the
    ISR; as a follower it then truncates to before the damage and re-fetches (docs/replication.md,
    "A damaged leader steps down")."""

    def __init__(self, logs: LogManager, clock: Callable[[], float] = time.monotonic) -> None:
        self._logs = logs
        self._clock = clock
        self._pending: set[tuple[str, int]] = set()
        self._sent: dict[tuple[str, int], float] = {}
        self.wake: Callable[[], None] = lambda: None

    def found(self, topic: str, partition: int) -> None:
        key = (topic, partition)
        now = self._clock()
        if now - self._sent.get(key, -DAMAGE_REPORT_EVERY_S) < DAMAGE_REPORT_EVERY_S:
            return
        self._sent[key] = now
        self._pending.add(key)
        self.wake()

    def take(self) -> list[coordinator_pb2.PartitionLogReport]:
        """The pending reports (a lost heartbeat loses them; the next read of the damage finds it again)."""
        if not self._pending:
            return []
        keys, self._pending = self._pending, set()
        return log_reports(self._logs, keys)
