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

from sluice.broker.assignment import PartitionRegistry
from sluice.broker.leading import Leaders
from sluice.v1 import coordinator_pb2

__all__ = ["MAX_REPORTS", "epoch_reports"]

MAX_REPORTS = 1_000
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
