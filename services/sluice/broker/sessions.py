"""Incremental fetch sessions (Kafka KIP-227), as a pure cache: no I/O, time passed in.

A consumer fetching many partitions would otherwise send and receive every partition on
every fetch. With a session the broker remembers the partition set and what it last told the
client, so:

- the request carries only partitions that were added or changed (new fetch offset, limits
  or filter), plus ``forgotten`` ones to drop;
- the response carries only partitions with something new: records, an error, a changed
  high watermark or log start, or a ``next_offset`` that moved past filtered-out records.

Request forms (``session_id``, ``session_epoch``):

- ``(any, -1)``: sessionless full fetch; a given session id is closed;
- ``(0, 0)``: open a new session with the request's partitions (full fetch, full response);
- ``(id, 0)``: close ``id`` and open a new one;
- ``(id, n > 0)``: incremental; ``n`` must be the session's next epoch (the previous plus one),
  else INVALID_FETCH_SESSION_EPOCH; an unknown or evicted ``id`` is FETCH_SESSION_NOT_FOUND,
  and the client falls back to opening a new session.

The cache holds at most ``max_sessions`` sessions and drops sessions idle longer than
``idle_timeout_ms``. When full, a new session evicts the least recently used one if that has
been idle ``min_evict_ms``, else a smaller one; if none qualifies the request is served without
a session (``session_id = 0`` in the response), as Kafka does.

A session also knows which of its partitions may have something new (``dirty``): the ones
added or changed by a request, the ones appended to since (the service's standing watch adds
them), and the ones whose last answer the client has not caught up with. A request reads only
those; a partition leaves the set once a read finds it caught up with nothing to tell
(:meth:`FetchContext.settle`). So an idle incremental fetch costs nothing per partition.
"""

from __future__ import annotations

import dataclasses
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sluice.broker.fetch import PartitionRead, PartitionSpec, TopicPartitionKey
from sluice.errors import FetchSessionNotFound, InvalidFetchSessionEpoch

FINAL_EPOCH = -1
INITIAL_EPOCH = 0
MAX_EPOCH = 2**31 - 1


@dataclass(slots=True)
class CachedPartition:
    """A session's view of one partition: the request and what the client was last told."""

    spec: PartitionSpec
    high_watermark: int = -1
    log_start_offset: int = -1
    #: Its place in the session's fetch order (larger: later), so the dirty few are read in
    #: that order without a walk over every partition.
    seq: int = 0


@dataclass(slots=True)
class FetchSession:
    id: int
    #: The epoch the next incremental request must carry.
    next_epoch: int
    #: In fetch order; partitions that returned records move to the back, so under a tight
    #: max_bytes every partition gets its turn.
    partitions: OrderedDict[TopicPartitionKey, CachedPartition] = field(default_factory=OrderedDict)
    last_used_ms: int = 0
    #: The partitions a request must read (see the module docstring). Mutated, never replaced:
    #: the service's standing watch holds it.
    dirty: set[TopicPartitionKey] = field(default_factory=set)
    last_seq: int = 0

    @classmethod
    def of(cls, session_id: int, specs: Iterable[PartitionSpec], now_ms: int = 0) -> FetchSession:
        """A session over ``specs``, every partition dirty (nothing read yet)."""
        session = cls(id=session_id, next_epoch=1, last_used_ms=now_ms)
        for spec in specs:
            session.put(spec)
        return session

    def put(self, spec: PartitionSpec) -> None:
        """Add or change a partition; it is read by the next request."""
        cached = self.partitions.get(spec.key)
        if cached is None:
            self.last_seq += 1
            self.partitions[spec.key] = CachedPartition(spec, seq=self.last_seq)
        else:
            cached.spec = spec
        self.dirty.add(spec.key)

    def forget(self, key: TopicPartitionKey) -> None:
        self.partitions.pop(key, None)
        self.dirty.discard(key)

    def dirty_specs(self) -> list[PartitionSpec]:
        """The partitions to read, in fetch order."""
        cached = [self.partitions[key] for key in self.dirty if key in self.partitions]
        cached.sort(key=lambda c: c.seq)
        return [c.spec for c in cached]

    def select(self, parts: list[PartitionRead], incremental: bool) -> list[PartitionRead]:
        """The partitions to answer with; records what the client now knows.

        Affects: the cached marks and the fetch order.
        """
        out: list[PartitionRead] = []
        for part in parts:
            cached = self.partitions.get(part.key)
            if cached is None:
                # Forgotten by a newer request while this one was parked.
                if not incremental:
                    out.append(part)
                continue
            changed = (
                not incremental
                or bool(part.batches)
                or part.error is not None
                or part.high_watermark != cached.high_watermark
                or part.log_start_offset != cached.log_start_offset
                or part.position != part.spec.fetch_offset
            )
            cached.high_watermark = part.high_watermark
            cached.log_start_offset = part.log_start_offset
            if part.batches:
                self.partitions.move_to_end(part.key)
                self.last_seq += 1
                cached.seq = self.last_seq
            if changed:
                out.append(part)
        return out

    def settle(self, parts: Iterable[PartitionRead]) -> None:
        """After an answer: a partition read, caught up, with nothing the client was not told,
        leaves ``dirty`` (an append puts it back)."""
        for part in parts:
            cached = self.partitions.get(part.key)
            if (
                cached is not None
                and cached.spec == part.spec
                and part.error is None
                and not part.batches
                and part.position == part.spec.fetch_offset == part.high_watermark
            ):
                self.dirty.discard(part.key)

    def advance(self, parts: Iterable[PartitionRead]) -> None:
        """A follow's session after an answer: each partition goes on from its next offset, and
        leaves ``dirty`` when it is caught up."""
        for part in parts:
            cached = self.partitions.get(part.key)
            if cached is None or part.error is not None:
                continue
            if part.position != cached.spec.fetch_offset:
                cached.spec = dataclasses.replace(cached.spec, fetch_offset=part.position)
            if part.position == part.high_watermark:
                self.dirty.discard(part.key)


@dataclass(slots=True)
class FetchContext:
    """How one fetch request relates to the session cache."""

    #: The session id to put in the response (0: no session).
    session_id: int
    #: The partitions to read, in order (of a session: only its dirty ones).
    specs: list[PartitionSpec]
    session: FetchSession | None = None
    incremental: bool = False
    #: The session's partitions not in ``specs``: caught up, waited on all the same.
    others: int = 0
    #: Partitions that joined or left the session with this request (for its watch).
    added: list[TopicPartitionKey] = field(default_factory=list)
    forgotten: list[TopicPartitionKey] = field(default_factory=list)

    def select(self, parts: list[PartitionRead]) -> list[PartitionRead]:
        """The partitions to answer with; records what the client now knows.

        Caller: the service, once the fetch completes. Affects: the session's cached marks
        and partition order.
        """
        if self.session is None:
            return parts
        return self.session.select(parts, self.incremental)

    def settle(self, parts: Iterable[PartitionRead]) -> None:
        """Caller: the service, after :meth:`select`, with every partition it read."""
        if self.session is not None:
            self.session.settle(parts)


def _dedupe(specs: Iterable[PartitionSpec]) -> list[PartitionSpec]:
    """Last occurrence wins, first position kept."""
    by_key: dict[TopicPartitionKey, PartitionSpec] = {}
    for spec in specs:
        by_key[spec.key] = spec
    return list(by_key.values())


def _random_id() -> int:
    return random.getrandbits(63) or 1


class FetchSessionCache:
    """Fetch sessions by id, LRU-bounded. Caller: the broker service, one per broker."""

    def __init__(
        self,
        max_sessions: int = 1000,
        idle_timeout_ms: int = 120_000,
        new_id: Callable[[], int] = _random_id,
        min_evict_ms: int = 10_000,
    ) -> None:
        self.max_sessions = max_sessions
        self.idle_timeout_ms = idle_timeout_ms
        #: A full cache evicts its least recently used session only once idle this long.
        self.min_evict_ms = min_evict_ms
        self._new_id = new_id
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self.evictions = 0
        #: Told of every session that ends (closed, replaced, evicted, expired); set by the owner.
        self.on_drop: Callable[[FetchSession], None] | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def context(
        self,
        session_id: int,
        epoch: int,
        partitions: Iterable[PartitionSpec],
        forgotten: Iterable[TopicPartitionKey],
        now_ms: int,
    ) -> FetchContext:
        """Resolve a request against the cache (see the module docstring for the forms)."""
        self._expire(now_ms)
        if epoch == FINAL_EPOCH:
            if session_id:
                self._drop(session_id)
            return FetchContext(0, _dedupe(partitions))
        if epoch == INITIAL_EPOCH:
            if session_id:
                self._drop(session_id)
            specs = _dedupe(partitions)
            if self.max_sessions <= 0:
                return FetchContext(0, specs)
            session = self._open(specs, now_ms)
            if session is None:
                return FetchContext(0, specs)
            return FetchContext(session.id, specs, session, incremental=False, added=list(session.partitions))
        if epoch < FINAL_EPOCH:
            raise InvalidFetchSessionEpoch(f"fetch session epoch {epoch} is invalid")
        found = self._sessions.get(session_id) if session_id else None
        if found is None:
            raise FetchSessionNotFound(
                f"fetch session {session_id} not found (expired or evicted): open a new one with epoch 0"
            )
        session = found
        if epoch != session.next_epoch:
            raise InvalidFetchSessionEpoch(
                f"fetch session {session_id} expected epoch {session.next_epoch}, got {epoch}"
            )
        session.next_epoch = epoch + 1 if epoch < MAX_EPOCH else 1
        session.last_used_ms = now_ms
        self._sessions.move_to_end(session_id)
        added: list[TopicPartitionKey] = []
        for spec in partitions:
            if spec.key not in session.partitions:
                added.append(spec.key)
            session.put(spec)
        dropped = [key for key in forgotten if key in session.partitions]
        for key in dropped:
            session.forget(key)
        specs = session.dirty_specs()
        return FetchContext(
            session.id,
            specs,
            session,
            incremental=True,
            others=len(session.partitions) - len(specs),
            added=added,
            forgotten=dropped,
        )

    def _make_room(self, partitions: int, now_ms: int) -> bool:
        """Evict one session for a new one with ``partitions`` partitions, if any may go.

        Kafka's rule, simplified: the least recently used session goes if it has been idle
        for ``min_evict_ms``; otherwise the smallest session with fewer partitions than the
        newcomer goes. A busy cache of big sessions is not churned by clients that open a
        session on every fetch; they get session id 0 and keep fetching without one.
        """
        lru = next(iter(self._sessions.values()))
        victim: FetchSession | None = lru if now_ms - lru.last_used_ms >= self.min_evict_ms else None
        if victim is None:
            smaller = [s for s in self._sessions.values() if len(s.partitions) < partitions]
            if smaller:
                victim = min(smaller, key=lambda s: len(s.partitions))
        if victim is None:
            return False
        self._drop(victim.id)
        self.evictions += 1
        return True

    def _open(self, specs: list[PartitionSpec], now_ms: int) -> FetchSession | None:
        if len(self._sessions) >= self.max_sessions and not self._make_room(len(specs), now_ms):
            return None
        session_id = self._new_id()
        while session_id == 0 or session_id in self._sessions:
            session_id = _random_id()
        session = FetchSession.of(session_id, specs, now_ms)
        self._sessions[session_id] = session
        return session

    def _drop(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None and self.on_drop is not None:
            self.on_drop(session)

    def _expire(self, now_ms: int) -> None:
        limit = now_ms - self.idle_timeout_ms
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if oldest.last_used_ms >= limit:
                return
            self._drop(oldest.id)
            self.evictions += 1
