"""Moving one member from its current assignment towards the group's target: pure (Kafka's
``CurrentAssignmentBuilder``).

The rule that makes rebalances duplicate-free: a slot (track, topic, partition) is given to a member only
when no other member owns it, and a member owns a slot from the moment it is assigned until its heartbeat
no longer lists the partition in ``owned`` (the SDK commits before it releases). So ownership moves

    A: assigned -> pending revocation -> (A's heartbeat omits it) -> free -> B: assigned

and two members never own one slot at once. The member epoch moves to the target epoch only once the
member has released everything it must give up (KIP-848), so the epoch a member commits with stays valid
for the partitions it still has to commit before releasing them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from sluice.coordinator.groups.model import Slot, TopicPartition

__all__ = ["MemberState", "Reconciled", "reconcile"]


class MemberState(enum.Enum):
    """A member's reconciliation state (KIP-848 ``MemberState``), with asserted transitions."""

    #: Holds exactly its target at the target epoch.
    STABLE = "stable"
    #: Must release ``pending`` partitions (commit, then omit them from ``owned``).
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    #: At the target epoch, waiting for other members to release partitions it is due to get.
    UNRELEASED_PARTITIONS = "unreleased_partitions"
    #: Fallback for a state written by a newer coordinator; reconciled like any other.
    UNKNOWN = "unknown"

    @classmethod
    def parse(cls, text: str) -> MemberState:
        try:
            return cls(text)
        except ValueError:
            return cls.UNKNOWN

    def move(self, to: MemberState) -> MemberState:
        assert to in _TRANSITIONS[self], f"illegal member state transition {self} -> {to}"
        return to


_ANY = frozenset(MemberState) - {MemberState.UNKNOWN}
_TRANSITIONS: dict[MemberState, frozenset[MemberState]] = {
    MemberState.STABLE: _ANY,
    MemberState.UNREVOKED_PARTITIONS: _ANY,
    MemberState.UNRELEASED_PARTITIONS: _ANY,
    MemberState.UNKNOWN: _ANY,
}


@dataclass(frozen=True)
class Reconciled:
    member_epoch: int
    previous_member_epoch: int
    state: MemberState
    assigned: frozenset[Slot]
    pending: frozenset[Slot]


def reconcile(
    current: Reconciled,
    target_epoch: int,
    target: frozenset[Slot],
    owned: frozenset[TopicPartition] | None,
    is_free: Callable[[Slot], bool],
    exclusive: bool = True,
) -> Reconciled:
    """One reconciliation step for one member.

    ``owned`` is what the member's heartbeat says it holds (None: not reported, nothing is released).
    ``is_free(slot)`` says no *other* member owns the slot. Without ``exclusive`` (broadcasting) there is
    no handoff: the member simply gets its target.
    """
    assigned, pending = current.assigned, current.pending
    if not exclusive:
        state = current.state.move(MemberState.STABLE)
        if current.member_epoch == target_epoch and assigned == target and not pending:
            return current
        epochs = _advance(current, target_epoch)
        return Reconciled(epochs[0], epochs[1], state, target, frozenset())
    if pending and owned is not None:
        # Released slot by slot: each released partition is free for its next owner at once.
        pending = frozenset(s for s in pending if (s[1], s[2]) in owned)
    if pending:
        return Reconciled(
            current.member_epoch,
            current.previous_member_epoch,
            current.state.move(MemberState.UNREVOKED_PARTITIONS),
            assigned,
            pending,
        )
    if current.member_epoch == target_epoch and current.state is MemberState.STABLE:
        return current
    kept = assigned & target
    revoke = assigned - target
    if revoke:
        # Keep the epoch until the member has released: it still commits these under it.
        return Reconciled(
            current.member_epoch,
            current.previous_member_epoch,
            current.state.move(MemberState.UNREVOKED_PARTITIONS),
            kept,
            revoke,
        )
    incoming = target - kept
    assignable = frozenset(s for s in incoming if is_free(s))
    state = MemberState.UNRELEASED_PARTITIONS if len(assignable) < len(incoming) else MemberState.STABLE
    epochs = _advance(current, target_epoch)
    return Reconciled(epochs[0], epochs[1], current.state.move(state), kept | assignable, frozenset())


def _advance(current: Reconciled, target_epoch: int) -> tuple[int, int]:
    if current.member_epoch == target_epoch:
        return current.member_epoch, current.previous_member_epoch
    return target_epoch, current.member_epoch
