"""What a partition becomes when one of its brokers is gone: the leader election of the controller. Pure.

Wired to session expiry (``cluster/elections.py``, called by the coordinator's expiry timer): the
controller calls :func:`on_broker_gone` for every replicated partition of a broker whose session expired,
persists the states that changed and pushes them to the replicas (docs/replication.md, "Failover").

The rules (Kafka's, with KIP-966's eligible leader replicas):

1. The gone broker leaves the ISR. If the ISR is then smaller than ``min_insync_replicas`` (empty
   included), the gone broker joins the ELR instead of vanishing: from that moment the high watermark stops
   (strict min ISR), so it still holds every committed record and may lead again. While the ISR is at least
   ``min_insync_replicas`` the ELR is empty (the HW moves, and an ELR member would miss what it commits).
2. If the gone broker led, the new leader is the first replica in preference order that is live and in the
   ISR; else the first live one in the ELR (it then becomes the ISR, alone). None: with
   ``unclean_leader_election``, the first live replica at all leads (everything it lacks is lost; the
   outcome says so, for the metric), else the partition is offline (leader ``NO_LEADER``). If the new ISR
   reaches ``min_insync_replicas``, the ELR is emptied, as in rule 1.
3. A leader change bumps the leader epoch; any change bumps the partition epoch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from sluice.coordinator.cluster.replication import NO_LEADER, PartitionState, ReplicationConfig

__all__ = ["Election", "elect_leader", "on_broker_gone"]


@dataclass(frozen=True)
class Election:
    """A partition's new state, and whether getting there lost data (an unclean election)."""

    state: PartitionState
    unclean: bool = False

    @property
    def offline(self) -> bool:
        return self.state.leader == NO_LEADER


def on_broker_gone(
    state: PartitionState, gone: int, live: Collection[int], config: ReplicationConfig
) -> Election:
    """``state`` after broker ``gone`` left (session expired). ``live``: the brokers alive now (``gone``
    is not among them). Unchanged when ``gone`` holds no replica of the partition."""
    if gone not in state.replicas:
        return Election(state)
    live_now = set(live) - {gone}
    isr = tuple(b for b in state.isr if b != gone)
    elr = state.elr
    if len(isr) < config.min_insync_replicas:
        if gone in state.isr and gone not in elr:
            elr = (*elr, gone)
    else:
        elr = ()
    leader = state.leader
    unclean = False
    if leader in (gone, NO_LEADER):
        leader, isr, elr, unclean = elect_leader(state.replicas, isr, elr, live_now, config)
        if len(isr) >= config.min_insync_replicas:
            elr = ()  # the new ISR can move the HW again: the others may miss what it commits
    if (leader, isr, elr) == (state.leader, state.isr, state.elr):
        return Election(state)
    # replace(), not a new state: a reassignment in progress (adding, removing, original) survives it.
    return Election(
        dataclasses.replace(
            state,
            leader=leader,
            leader_epoch=state.leader_epoch + (1 if leader != state.leader else 0),
            partition_epoch=state.partition_epoch + 1,
            isr=isr,
            elr=elr,
        ),
        unclean,
    )


def elect_leader(
    replicas: Sequence[int],
    isr: tuple[int, ...],
    elr: tuple[int, ...],
    live: Collection[int],
    config: ReplicationConfig,
) -> tuple[int, tuple[int, ...], tuple[int, ...], bool]:
    """(leader, isr, elr, unclean) for a partition that needs a leader: rule 2 of the module doc."""
    for b in replicas:
        if b in live and b in isr:
            return b, isr, elr, False
    for b in replicas:
        if b in live and b in elr:
            # KIP-966: an eligible replica leads and is the ISR; it holds everything committed.
            return b, (b,), tuple(e for e in elr if e != b), False
    if config.unclean_leader_election:
        for b in replicas:
            if b in live:
                return b, (b,), (), True
    return NO_LEADER, isr, elr, False
