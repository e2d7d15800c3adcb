"""Parked keys: the events of a parking topic and their replay (docs/poison-keys.md).

Two writers share these events and this replay: a pull group's consumers (``PARK.<group>``, "Pull
consumers") and the dispatcher for a push subscription (``<topic>.<subscription>.PARK``,
``sub_park_topic``; the dispatcher's ``parkstore.py``).

The parking store of a group is one ordinary topic, ``PARK.<group>`` (one partition), written as an event
log. Its replay from offset 0 is the state: which (source partition, key) pairs are parked, the records
waiting for each (in order), the head's failure count and when it is due again. Pure: the SDK's consumer
and the ``sluice group parked`` command both replay with it, and the unit tests check it without a cluster.

Events (header ``sluice-park-op``; the key is the parked key, ``sluice-park-source`` the coordinates):

- ``park``: a record of the key, parked (its key, value, tag and headers are the original's). Carries a
  count and a due time when it is the failed record that parks its key.
- ``fail``: the head failed again: its count and next due time.
- ``resolved``: the key's records up to a source offset are finished (``how``: ``ok`` processed, ``dlq``
  dead-lettered); the key is no longer parked once nothing of it waits.
- ``unpark``: an operator released the key: counts start again at 0, the head is due at once.
- ``dlqmark`` (push subscriptions only, ``parkstore.py``): an offset of the subscription's DLQ below which
  none of the parked records not yet ``resolved`` was dead-lettered. Written (and acknowledged) before a
  parked key's records go to the DLQ, so a restart reads the DLQ from it and drops the records found
  there by their source (``drop_dead``) instead of dead-lettering them twice.

Every source ever parked is remembered (``sources``), so a record delivered again after a crash between
its parking and the commit of its offset is recognised and not parked twice.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sluice.codec.batch import Record
from sluice.retry.levels import source_key

__all__ = [
    "H_DLQ_MARK",
    "H_HOW",
    "H_OP",
    "H_PCOUNT",
    "H_PDUE",
    "H_PSINCE",
    "H_PSOURCE",
    "PARK_HEADERS",
    "PARK_PREFIX",
    "ParkBook",
    "ParkedKey",
    "park_topic",
    "parse_source",
    "sub_park_topic",
]

PARK_PREFIX = "PARK."
H_OP = "sluice-park-op"
H_PSOURCE = "sluice-park-source"
H_PCOUNT = "sluice-park-count"
H_PDUE = "sluice-park-due-ms"
H_HOW = "sluice-park-how"
H_DLQ_MARK = "sluice-park-dlq-mark"
#: A snapshot's first record of a key: the key's age (``parksnap.py``).
H_PSINCE = "sluice-park-since-ms"
#: The park topic's own headers (a parked record keeps only its original ones).
PARK_HEADERS = frozenset((H_OP, H_PSOURCE, H_PCOUNT, H_PDUE, H_HOW, H_DLQ_MARK, H_PSINCE))
#: Sources remembered for deduplication; the oldest go first beyond it.
MAX_SOURCES = 1_000_000

TopicPartition = tuple[str, int]
KeyId = tuple[TopicPartition, bytes]


def park_topic(group: str) -> str:
    return PARK_PREFIX + group


#: A push subscription's parking topic: ``<topic>.<subscription>.PARK``, named like its dead letters
#: (``<topic>.<subscription>.DLQ``, ``levels.sub_dlq_topic``), as ``PARK.<group>`` is like ``DLQ.<group>``.
SUB_PARK_SUFFIX = ".PARK"


def sub_park_topic(topic: str, subscription: str) -> str:
    return f"{topic}.{subscription}{SUB_PARK_SUFFIX}"


def parse_source(raw: bytes | str) -> tuple[str, int, int]:
    """``topic/partition/offset`` -> its parts (ValueError if malformed)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    rest, _, offset = text.rpartition("/")
    topic, _, partition = rest.rpartition("/")
    if not topic:
        raise ValueError(f"not a source: {text!r}")
    return topic, int(partition), int(offset)


@dataclass(slots=True)
class ParkedKey:
    """One parked key of one source partition."""

    tp: TopicPartition
    key: bytes
    #: Its records waiting, head first, in source offset order, with their original coordinates.
    pending: deque[Record] = field(default_factory=deque)
    #: Failures of the current head.
    count: int = 0
    #: When the head may be tried again (unix ms).
    due_ms: int = 0
    #: When it was parked (unix ms, the park event's timestamp).
    since_ms: int = 0
    #: The source offset ``count`` belongs to (the head it was counted for): a ``resolved`` below it
    #: keeps it (the push side writes a new head's ``fail`` before the previous heads' ``resolved``).
    count_at: int = -1


class ParkBook:
    """The replayed state of a ``PARK.<group>`` topic."""

    def __init__(self) -> None:
        self.keys: dict[KeyId, ParkedKey] = {}
        self.sources: dict[str, None] = {}
        #: The highest parked source offset per source partition: a record above it was never parked,
        #: so most records need no lookup in ``sources``.
        self.max_source: dict[TopicPartition, int] = {}
        #: The last ``dlqmark`` (push subscriptions): the DLQ offset to read from at a restart.
        self.dlq_mark: int | None = None

    def parked(self, tp: TopicPartition, key: bytes | None) -> bool:
        return key is not None and (tp, key) in self.keys

    def seen(self, tp: TopicPartition, offset: int) -> bool:
        """Whether the record at ``tp``/``offset`` was parked (now or before)."""
        limit = self.max_source.get(tp)
        return limit is not None and offset <= limit and source_key(tp[0], tp[1], offset) in self.sources

    def apply(self, event: Record) -> None:
        """Apply one event record of the park topic (others are ignored)."""
        headers = event.headers
        op = headers.get(H_OP) if headers else None
        if op is None or event.key is None:
            return
        if op == b"dlqmark":
            self.dlq_mark = _int(headers.get(H_DLQ_MARK))
            return
        src = headers.get(H_PSOURCE, b"")
        try:
            topic, partition, offset = parse_source(src)
        except ValueError:
            if op != b"unpark":
                return
            topic, partition, offset = "", -1, -1
        kid = ((topic, partition), event.key)
        if op == b"park":
            self._park(kid, offset, event)
        elif op == b"fail":
            pk = self.keys.get(kid)
            if pk is not None:
                pk.count = _int(headers.get(H_PCOUNT))
                pk.due_ms = _int(headers.get(H_PDUE))
                pk.count_at = offset
        elif op == b"resolved":
            self._resolve(kid, offset)
        elif op == b"unpark":
            for pk in self.keys.values():
                if pk.key == event.key and (partition < 0 or pk.tp == kid[0]):
                    pk.count, pk.due_ms = 0, 0

    def _park(self, kid: KeyId, offset: int, event: Record) -> None:
        (topic, partition), key = kid
        headers = {k: v for k, v in event.headers.items() if k not in PARK_HEADERS}
        parked = Record(topic, partition, offset, key, event.value, event.tag, headers, event.timestamp)
        self.add(parked, event)

    def add(self, record: Record, event: Record | None = None) -> None:
        """Park ``record`` (its original coordinates; ``timestamp``: when it was parked) behind its key.
        ``event``'s headers, when given, may set the head's count and due time (the key's first park).
        The replay's ``park`` events come here, and the parking consumer's own acknowledged writes
        directly (``Parker``: no re-parsing of what it just wrote)."""
        tp, key = (record.topic, record.partition), record.key
        assert key is not None
        if not self.note(tp, record.offset):
            return  # parked already (a write repeated after a crash)
        kid = (tp, key)
        pk = self.keys.get(kid)
        if pk is None:
            pk = self.keys[kid] = ParkedKey(tp, key, since_ms=record.timestamp)
        pk.pending.append(record)
        if event is not None and H_PCOUNT in event.headers:
            pk.count = _int(event.headers.get(H_PCOUNT))
            pk.due_ms = _int(event.headers.get(H_PDUE))
            pk.count_at = record.offset

    def note(self, tp: TopicPartition, offset: int) -> bool:
        """Remember that the record at ``tp``/``offset`` was parked; False if it was already."""
        src = source_key(tp[0], tp[1], offset)
        if src in self.sources:
            return False
        self.sources[src] = None
        if offset > self.max_source.get(tp, -1):
            self.max_source[tp] = offset
        if len(self.sources) > MAX_SOURCES:
            del self.sources[next(iter(self.sources))]
        return True

    def offsets_parked(self, tp: TopicPartition, low: int = 0) -> list[int]:
        """Every offset of ``tp`` at or above ``low`` ever parked (remembered), sorted."""
        if self.max_source.get(tp, -1) < low:
            return []
        prefix = f"{tp[0]}/{tp[1]}/"
        n = len(prefix)
        return sorted(o for s in self.sources if s.startswith(prefix) and (o := int(s[n:])) >= low)

    def _resolve(self, kid: KeyId, through: int) -> None:
        pk = self.keys.get(kid)
        if pk is None:
            return
        while pk.pending and pk.pending[0].offset <= through:
            pk.pending.popleft()
        if pk.count_at <= through:
            pk.count, pk.due_ms = 0, 0
        if not pk.pending:
            del self.keys[kid]

    def trim_sources(self, lows: dict[TopicPartition, int]) -> int:
        """Forget the oldest remembered sources while they are below their partition's low bound (no
        restart needs them: ``parksnap``); stops at the first that is not. Returns how many went."""
        n = 0
        while self.sources:
            src = next(iter(self.sources))
            topic, partition, offset = parse_source(src)
            if offset >= lows.get((topic, partition), 0):
                break
            del self.sources[src]
            n += 1
        return n

    def drop_dead(self, dead: set[str]) -> list[tuple[TopicPartition, bytes, int]]:
        """Drop the parked records whose source is in ``dead`` (found in the DLQ after a crash between
        their dead-lettering and its ``resolved`` event). Returns, per key, the ``resolved`` to record:
        (source partition, key, through offset) of its longest prefix now gone. A key's records go to
        the DLQ head first and in order, so what was dead-lettered is a prefix of what waits."""
        out: list[tuple[TopicPartition, bytes, int]] = []
        for kid, pk in list(self.keys.items()):
            tp = kid[0]
            through = -1
            while pk.pending and source_key(tp[0], tp[1], pk.pending[0].offset) in dead:
                through = pk.pending.popleft().offset
            if through < 0:
                continue
            out.append((tp, kid[1], through))
            if pk.count_at <= through:
                pk.count, pk.due_ms = 0, 0
            if not pk.pending:
                del self.keys[kid]
        return out

    def oldest_first(self) -> list[ParkedKey]:
        return sorted(self.keys.values(), key=lambda pk: (pk.since_ms, pk.tp, pk.key))


def _int(raw: bytes | None) -> int:
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0
