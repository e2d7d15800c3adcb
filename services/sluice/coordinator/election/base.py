"""The contracts of leader election: what the coordinator uses (``Elector``) and what a backend provides
(``LeaseStore``). Both electors (Redis, Kubernetes Lease) are an ``ElectionLoop`` over their own store."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from sluice.coordinator.election.machine import LeaderInfo, LeaseRecord

__all__ = ["Candidate", "Elector", "LeaseStore", "OnElected", "OnLost"]

#: Called once this replica has won, with its fencing epoch; leadership starts when it returns.
OnElected = Callable[[int], Awaitable[None]]
#: Called once leadership (that ``OnElected`` started) is over.
OnLost = Callable[[], Awaitable[None]]


class Elector(Protocol):
    """One replica's membership in the election.

    Caller: the coordinator's main (``run``, ``resign``) and its service layer (``is_leader``, ``leader``).
    """

    @property
    def identity(self) -> str: ...

    async def run(self, on_elected: OnElected, on_lost: OnLost) -> None:
        """Take part until ``resign`` (or cancellation, which is treated like a crash: the lease is not
        released and expires on its own). ``on_elected``/``on_lost`` alternate, strictly."""
        ...

    def is_leader(self) -> bool:
        """True while this replica may act as leader: it holds the lease, within its renew deadline, and
        ``on_elected`` has returned. Checked against the clock at every call."""
        ...

    def leader(self) -> LeaderInfo | None:
        """Who leads, as far as this replica knows (itself included); None while nobody is known."""
        ...

    async def resign(self) -> None:
        """Stop taking part: step down (``on_lost``), release the lease so a standby takes over at once,
        and make ``run`` return."""
        ...

    def fenced(self) -> None:
        """The metadata store refused a write of ours: a newer epoch exists, so our leadership is void
        even if our lease looks fine. Step down, release, and stand again after a short hold-off."""
        ...


@dataclass(frozen=True)
class Candidate:
    """What a replica writes into the lease when it acquires it."""

    identity: str
    address: str
    #: Seconds; followers wait this long after the record stops changing.
    lease_duration: float


class LeaseStore(Protocol):
    """One lease in some store. Every method raises ``StorageError`` when the store cannot be reached or
    answers unexpectedly; ``False`` results mean "the store answered: not yours"."""

    async def read(self) -> LeaseRecord | None:
        """The current record, or None when there is none (never created, deleted, or expired)."""
        ...

    async def acquire(
        self, expected: LeaseRecord | None, candidate: Candidate
    ) -> tuple[bool, LeaseRecord | None]:
        """Take the lease if it is still exactly ``expected`` (None: absent), with a new fencing epoch.

        Returns (True, our record) or (False, the record found instead, if known).
        """
        ...

    async def renew(self, held: LeaseRecord) -> tuple[bool, LeaseRecord | None]:
        """Extend our lease if the store still holds ``held`` (same holder and epoch)."""
        ...

    async def release(self, held: LeaseRecord) -> None:
        """Give the lease up if it is still ``held``, so a follower need not wait for it to expire."""
        ...

    async def close(self) -> None: ...
