"""The client half of incremental fetch sessions (Kafka's KIP-227).

A pure state machine per broker. The first request of a session is a full fetch
(``session_id=0, session_epoch=0``: "open a session"); the broker answers with a
session id. Later requests carry ``session_id`` and an epoch that grows by one per
request, and list only the partitions that were added or whose fetch state
(offset, max bytes, filter) changed since the last *answered* request, plus the
``forgotten`` ones. The broker then answers only for partitions with something
new. Any error resets the session: the next request is a full fetch again.

Caller: the Fetcher, one FetchSession per broker, one request in flight at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["FetchSession", "PartitionFetchState", "SessionRequest"]

TopicPartition = tuple[str, int]
# Epochs are int32 and wrap to 1 (0 means "open a session").
_MAX_EPOCH = 2**31 - 1


class PartitionFetchState(NamedTuple):
    """A tuple, so comparing a session's thousands of them is done in C (``build``)."""

    fetch_offset: int
    max_bytes: int
    filter: str
    #: The partition's leader epoch as the fetcher last saw it in Metadata (KIP-320; -1: unknown,
    #: not checked). Part of the state, so a new epoch is sent even in an incremental request.
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """What to put in one FetchRequest."""

    session_id: int
    session_epoch: int
    #: Partitions to send (all of them in a full fetch; changed ones otherwise).
    partitions: dict[TopicPartition, PartitionFetchState]
    forgotten: list[TopicPartition]
    #: The fetch state of every partition in the session as of this request, to match
    #: the answer against (a partition not in the answer had nothing new).
    session: dict[TopicPartition, PartitionFetchState]

    @property
    def full(self) -> bool:
        return self.session_epoch == 0


class FetchSession:
    """Tracks one broker's fetch session and builds the next request."""

    def __init__(self, use_sessions: bool = True) -> None:
        self.use_sessions = use_sessions
        self.session_id = 0
        self.next_epoch = 0
        self._sent: dict[TopicPartition, PartitionFetchState] = {}

    def build(self, wanted: dict[TopicPartition, PartitionFetchState]) -> SessionRequest:
        """The request that fetches ``wanted`` (every partition this broker should serve).

        ``wanted`` is the caller's to give away (the fetcher builds it per request): it is kept,
        not copied. An idle incremental request finds what changed with set operations over
        the dictionaries' views, done in C, and encodes only that (usually nothing).
        """
        if not self.use_sessions:
            return SessionRequest(0, -1, wanted, [], wanted)
        if self.session_id == 0 or self.next_epoch == 0:
            return SessionRequest(0, 0, wanted, [], wanted)
        sent = self._sent
        changed = dict(sorted(wanted.items() - sent.items()))
        forgotten = sorted(sent.keys() - wanted.keys())
        return SessionRequest(self.session_id, self.next_epoch, changed, forgotten, wanted)

    def on_response(self, request: SessionRequest, session_id: int) -> None:
        """The broker answered ``request`` without a top-level error."""
        if not self.use_sessions:
            return
        if request.full:
            self.session_id = session_id
            self.next_epoch = 1 if session_id != 0 else 0
        else:
            self.next_epoch = self.next_epoch + 1 if self.next_epoch < _MAX_EPOCH else 1
        self._sent = request.session

    def reset(self) -> None:
        """Forget the session (after an error): the next request is a full fetch."""
        self.session_id = 0
        self.next_epoch = 0
        self._sent = {}

    @property
    def partitions(self) -> dict[TopicPartition, PartitionFetchState]:
        return dict(self._sent)
