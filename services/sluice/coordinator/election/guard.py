"""How a replica that is not the leader answers: ``NOT_COORDINATOR`` naming the leader.

The message format is part of the contract with the SDK (docs/election.md): ``not the leader; leader is
<host:port>`` when a leader is known, ``not the leader; no leader is elected yet`` otherwise. The SDK
prefers the structured answer (``MetadataResponse.coordinator``) and uses the message only as a hint.
"""

from __future__ import annotations

import re

from sluice.coordinator.election.base import Elector
from sluice.errors import NotCoordinator

__all__ = ["leader_guard", "leader_hint", "not_leader"]

_LEADER_IS = re.compile(r"leader is (\S+:\d+)")


def not_leader(elector: Elector, detail: str = "") -> NotCoordinator:
    """The error a non-leader answers with, naming the leader it knows of."""
    leader = elector.leader()
    if leader is None:
        text = "not the leader; no leader is elected yet (an election is in progress): retry shortly"
    elif leader.identity == elector.identity:
        text = f"not the leader; leader is {leader.address} (this replica, still taking office): retry"
    else:
        text = f"not the leader; leader is {leader.address}"
    return NotCoordinator(f"{text}{detail}")


def leader_guard(elector: Elector | None) -> None:
    """Raise ``NotCoordinator`` naming the leader unless this replica is the serving leader.

    Caller: the coordinator's service layer, first thing in every RPC except ``Metadata`` (which a
    standby answers by forwarding, see forward.py). ``None`` (``--election none``) always passes.
    """
    if elector is not None and not elector.is_leader():
        raise not_leader(elector)


def leader_hint(message: str) -> str | None:
    """The leader address named in a ``NOT_COORDINATOR`` message, if any (for the SDK)."""
    m = _LEADER_IS.search(message)
    return m.group(1) if m else None
