"""Per-key poison parking for a pull consumer (``park_poison_keys=True``; docs/poison-keys.md, "Pull
consumers").

``consumer.fail(record)`` parks the record's key for its source partition: the record, and every later
record of that key from that partition, is written in order to ``PARK.<group>`` (an event log, replayed
by ``ParkBook``) instead of being handed out, while the partition's position and commits go on as usual.
The key's *head* (its oldest parked record) is handed out again by ``poll()`` after ``park_retry_delay``;
processed (no ``fail()`` before the next ``poll()``), the next one becomes the head; failed more than
``max_redeliver`` times, every waiting record of the key goes to ``DLQ.<group>`` in order (policy
``dlq``) or the key stays parked for an operator (``hold``; ``sluice group unpark``).

Every write is acknowledged before the original's offset can be committed (every commit path waits for
the writes in flight first, ``ParkingEngine._before_commit``; ``fail`` waits before it returns), so
nothing is committed that is not parked.
The state is only what the topic says: a new owner of a partition (or a restarted consumer) replays the
topic before handing out any record of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, cast

from sluice.client.consumer.retry import RetryPorts
from sluice.client.consumer.retry_dedup import SourceIndex
from sluice.codec.batch import Record
from sluice.errors import RequestTimedOut
from sluice.retry.levels import (
    H_COUNT,
    H_FIRST_FAILURE,
    H_OFFSET,
    H_PARTITION,
    H_SOURCE,
    H_TOPIC,
    dlq_topic,
    source_key,
)
from sluice.retry.parkbook import (
    H_HOW,
    H_OP,
    H_PCOUNT,
    H_PDUE,
    H_PSOURCE,
    PARK_HEADERS,
    ParkBook,
    ParkedKey,
    park_topic,
)

__all__ = ["ParkOutcome", "Parker"]

log = logging.getLogger("sluice.consumer.park")

TopicPartition = tuple[str, int]
KeyId = tuple[TopicPartition, bytes]
#: How often poll() reads what others appended to the park topic (an operator's ``unpark``).
TAIL_EVERY = 1.0
#: Parking writes in flight (sent, not waited for) beyond which a poll pass waits for them: bounds what
#: is held for the acknowledgements between commits.
MAX_UNFLUSHED = 5_000
#: An event to append: key, value, tag, headers; and for a ``park`` event the record it parks (the book
#: learns it from that at the acknowledgement, without re-parsing the event).
_Event = tuple[bytes, bytes, str | None, dict[str, bytes], Record | None]


class _Written(Protocol):
    offset: int


@dataclass(frozen=True, slots=True)
class ParkOutcome:
    """What ``consumer.fail(record)`` did."""

    #: Failures of the key's head so far (0: the record only waits behind an earlier failure).
    count: int
    #: Records of the key waiting in the parking store after this call.
    waiting: int
    dead_lettered: bool
    #: Past ``max_redeliver`` under the ``hold`` policy: parked until ``sluice group unpark``.
    held: bool


class Parker:
    """The parking side of one group consumer."""

    def __init__(
        self,
        group: str,
        max_redeliver: int,
        max_messages: int,
        policy: str,
        delay: timedelta,
        ports: RetryPorts,
        dedup_window: timedelta,
        timeout: float,
    ) -> None:
        self.topic = park_topic(group)
        self.dlq = dlq_topic(group)
        self.max_redeliver = max_redeliver
        self.max_messages = max_messages
        self.hold = policy == "hold"
        self._delay_ms = int(delay.total_seconds() * 1000)
        self._ports = ports
        self._timeout = timeout
        self.book = ParkBook()
        self._dlq_index = SourceIndex(ports.list_offsets, ports.fetcher, H_SOURCE, dedup_window, timeout)
        self._dlq_stale = True
        #: Dead-lettering sent, not yet acknowledged: (key, [(source, future)], its resolved event).
        self._dlq_inflight: list[tuple[KeyId, list[tuple[str, Any]], _Event]] = []
        self._dlq_keys: set[KeyId] = set()
        self._producer = ports.producer(self.topic)
        self._dlq_producer = ports.producer(self.dlq)
        #: The park topic is replayed up to here; offsets of our own writes above it (applied already).
        self._pos = 0
        self._own: set[int] = set()
        self._owned: frozenset[TopicPartition] | None = None
        self._next_tail = 0.0
        #: Writes sent and not yet waited for (divert): (events, futures), in send order.
        self._inflight: list[tuple[list[_Event], list[Any]]] = []
        self._unflushed = 0
        #: Heads handed out by the last poll(): {source key: key id}; processed unless fail()ed.
        self._out: dict[str, KeyId] = {}
        #: The last poll()'s records, and those of them fail() parked behind an earlier one.
        self._batch: list[Record] = []
        self.recalled: set[str] = set()

    # ---- the park topic ---------------------------------------------------------------------------

    def catch_up(self) -> None:
        """Replay what was appended to the park topic since the last call (others' writes too)."""
        tp = (self.topic, 0)
        end = self._ports.list_offsets(self.topic, "latest", [0])[0]
        if self._pos < end:
            fetcher = self._ports.fetcher({tp: self._pos})
            deadline = time.monotonic() + self._timeout
            try:
                while fetcher.positions()[tp] < end:
                    if time.monotonic() > deadline:
                        raise RequestTimedOut(f"replaying {self.topic} {self._pos}..{end} took too long")
                    for event in fetcher.fetch(0.5):
                        if event.offset in self._own:
                            self._own.discard(event.offset)
                        else:
                            self.book.apply(event)
            finally:
                fetcher.close()
            self._pos = end
        self._own = {o for o in self._own if o >= self._pos}
        self._next_tail = time.monotonic() + TAIL_EVERY

    def _send(self, events: list[_Event]) -> None:
        """Append ``events`` in order without waiting; ``flush()`` waits and applies them."""
        if events:
            futures = [
                self._producer.send(value, key=key, tag=tag, headers=headers, partition=0)
                for key, value, tag, headers, _ in events
            ]
            self._inflight.append((events, futures))
            self._unflushed += len(events)

    def flush(self) -> None:
        """Wait for every write sent and apply it, in order; then finish the dead-lettering in flight
        (its ``resolved`` event only once the DLQ acknowledged every record). Runs before anything can
        commit the offsets of the records parked (poll()'s start, commit(), close()) and before other
        writes."""
        self._wait_sent()
        if not self._dlq_inflight:
            return
        dlq, self._dlq_inflight = self._dlq_inflight, []
        for _, futures, _ in dlq:
            for src, f in futures:
                f.result(self._timeout)
                self._dlq_index.add((self.dlq, 0), src)
        self._send([event for _, _, event in dlq])
        self._wait_sent()
        for kid, _, _ in dlq:
            self._dlq_keys.discard(kid)

    def _wait_sent(self) -> None:
        inflight, self._inflight = self._inflight, []
        self._unflushed = 0
        for events, futures in inflight:
            written = [cast(_Written, f.result(self._timeout)).offset for f in futures]
            now = int(time.time() * 1000)
            for (key, value, tag, headers, parked), offset in zip(events, written, strict=True):
                event = Record(self.topic, 0, offset, key, value, tag, headers, now)
                if parked is None:
                    self.book.apply(event)
                else:
                    self.book.add(parked._replace(timestamp=now), event)
                if offset == self._pos:
                    self._pos += 1
                else:
                    self._own.add(offset)

    def _write(self, events: list[_Event]) -> None:
        """Append ``events`` after what is in flight, and wait for all of it."""
        self._send(events)
        self.flush()

    # ---- poll()'s steps ---------------------------------------------------------------------------

    def settle(self) -> None:
        """The heads the last poll() handed out and nobody failed are processed (poll mode). Written
        after everything in flight and waited for: once a key's head is resolved, the key may be
        released, and its next records flow only after all of its parked ones are in the book."""
        out, self._out = self._out, {}
        if out:
            self._write([_resolved(kid, src, b"ok") for src, kid in out.items()])

    def pace(self) -> None:
        """A poll pass: finish the dead-lettering in flight (its key stays blocked until then), and wait
        for the parking writes only past ``MAX_UNFLUSHED``. Otherwise the commits wait for them
        (``flush`` before any commit): waiting at every poll cost a round trip per poll, measured
        in bench/poison_pull.py (docs/poison-keys.md, "Measured")."""
        if self._dlq_inflight or self._unflushed > MAX_UNFLUSHED:
            self.flush()

    def prepare(self, owned: frozenset[TopicPartition]) -> None:
        """Replay the topic when the assignment changed (before any record of a new partition is
        taken) or once a second; dead-letter keys past ``max_redeliver`` (a crash may have left one)
        or past ``max_messages`` waiting records."""
        if owned != self._owned or time.monotonic() >= self._next_tail:
            if owned != self._owned:
                self._dlq_stale = True
            self.flush()  # our own writes applied first: the replay skips them by offset
            self.catch_up()
            self._owned = owned
        if not self.book.keys:
            return
        for kid, pk in list(self.book.keys.items()):
            # Past the cap a key goes to the DLQ whatever the policy: the store stays bounded.
            give_up = len(pk.pending) > self.max_messages or (not self.hold and pk.count > self.max_redeliver)
            if give_up and kid[0] in owned and kid not in self._dlq_keys and not self._is_out(kid):
                self._dead_letter(pk)

    def take(self, owned: frozenset[TopicPartition], room: int) -> list[Record]:
        """The heads due now of the keys of ``owned`` partitions (at most ``room``)."""
        if not self.book.keys or room <= 0:
            return []
        now = int(time.time() * 1000)
        busy = set(self._out.values()) | self._dlq_keys  # a key on its way to the DLQ is not tried
        out: list[Record] = []
        for kid, pk in self.book.keys.items():
            if (
                len(out) < room
                and kid[0] in owned
                and kid not in busy
                and pk.due_ms <= now
                and pk.count <= self.max_redeliver
            ):
                head = pk.pending[0]
                self._out[source_key(head.topic, head.partition, head.offset)] = kid
                out.append(head._replace(headers={**head.headers, H_PCOUNT: str(pk.count).encode()}))
        return out

    def wait_bound(self, wait: float, owned: frozenset[TopicPartition]) -> float:
        """``wait`` cut to the next head's due time (and the next tail of the topic)."""
        dues = [
            pk.due_ms
            for kid, pk in self.book.keys.items()
            if kid[0] in owned and pk.count <= self.max_redeliver
        ]
        until_tail = self._next_tail - time.monotonic()
        if dues:
            until_tail = min(until_tail, min(dues) / 1000.0 - time.time())
        return max(min(wait, until_tail), 0.001)

    def divert(self, records: list[Record]) -> list[Record]:
        """``records`` without those of parked keys. Their parking is sent, not waited for: the
        application processes the rest meanwhile, and ``flush()`` waits before any commit can cover
        them (measured: waiting here cut the good keys' rate to a third, bench/poison_pull.py). The
        book learns them at that flush: until then a key's cap check lags by what is in flight."""
        book = self.book
        if not book.keys and not book.max_source:
            return records
        keep: list[Record] = []
        events: list[_Event] = []
        for r in records:
            tp = (r.topic, r.partition)
            if book.seen(tp, r.offset):
                continue  # parked before a crash took the commit of its offset
            if book.parked(tp, r.key):
                events.append(_park(r))
            else:
                keep.append(r)
        self._send(events)
        return keep

    def handed(self, records: list[Record]) -> None:
        self._batch = records
        self.recalled = set()

    # ---- fail() -----------------------------------------------------------------------------------

    def is_head(self, record: Record) -> bool:
        return source_key(record.topic, record.partition, record.offset) in self._out

    def fail(self, record: Record) -> ParkOutcome:
        """Park ``record``'s key (or count another failure of its head)."""
        assert record.key is not None
        tp, key = (record.topic, record.partition), record.key
        kid = (tp, key)
        src = source_key(record.topic, record.partition, record.offset)
        now = int(time.time() * 1000)
        if src in self._out:  # the head failed again
            del self._out[src]
            pk = self.book.keys[kid]
            count = pk.count + 1
            held = count > self.max_redeliver and self.hold
            self._write([_fail(kid, src, count, 0 if held else now + self._delay_ms)])
        elif self.book.seen(tp, record.offset):
            pk = self.book.keys.get(kid) or ParkedKey(tp, key)
            return ParkOutcome(0, len(pk.pending), False, False)  # parked already (recalled)
        elif self.book.parked(tp, key):  # a later record of a parked key: it waits behind the head
            count = 0
            self._write([_park(record), *self._recall(record)])
        else:
            count = 1
            first = _park(record, count, now + self._delay_ms)
            self._write([first, *self._recall(record)])
        pk = self.book.keys[kid]
        if count > self.max_redeliver and not self.hold:
            waiting = len(pk.pending)
            self._dead_letter(pk)
            return ParkOutcome(count, waiting, True, False)
        return ParkOutcome(count, len(pk.pending), False, count > self.max_redeliver)

    def _recall(self, record: Record) -> list[_Event]:
        """Records of ``record``'s key after it in the current poll's batch: the application has them
        but has not processed them yet; they are parked behind it (skip them: ``is_parked``)."""
        out = []
        for r in self._batch:
            if (r.topic, r.partition, r.key) == (record.topic, record.partition, record.key) and (
                r.offset > record.offset
            ):
                src = source_key(r.topic, r.partition, r.offset)
                if src not in self.recalled and not self.book.seen((r.topic, r.partition), r.offset):
                    self.recalled.add(src)
                    out.append(_park(r))
        return out

    def _is_out(self, kid: KeyId) -> bool:
        return kid in self._out.values()

    def _dead_letter(self, pk: ParkedKey) -> None:
        """Every waiting record of ``pk`` to the DLQ, in order (each once, even across a crash between
        the DLQ write and the ``resolved`` event), then the key is resolved."""
        self.flush()  # every diverted record of the key in the book first: all of it goes, in order
        if not pk.pending:
            return
        if self._dlq_stale:
            # Only a previous owner of these partitions (a crash before its ``resolved`` event) can have
            # written these sources: read what was appended since the assignment last changed, once.
            self._dlq_index.catch_up((self.dlq, 0))
            self._dlq_stale = False
        futures: list[tuple[str, Any]] = []
        now = str(int(time.time() * 1000)).encode()
        # The same for every record of the key (one source partition): encoded once.
        common = {
            H_TOPIC: pk.tp[0].encode(),
            H_PARTITION: str(pk.tp[1]).encode(),
            H_FIRST_FAILURE: str(pk.since_ms).encode() if pk.since_ms else now,
            H_COUNT: str(pk.count).encode(),
        }
        send, seen = self._dlq_producer.send, self._dlq_index.seen
        for r in pk.pending:
            src = source_key(r.topic, r.partition, r.offset)
            if seen(src):
                continue
            headers = {**r.headers, **common, H_OFFSET: str(r.offset).encode(), H_SOURCE: src.encode()}
            futures.append((src, send(r.value, key=r.key, tag=r.tag, headers=headers, partition=0)))
        last = pk.pending[-1]
        log.warning(
            "%s[%d] key %r: %d records to %s after %d failures",
            pk.tp[0], pk.tp[1], pk.key, len(pk.pending), self.dlq, pk.count,
        )  # fmt: skip
        # Waited for in flush() (the next poll, commit or close), so the application goes on meanwhile;
        # until then the key stays parked past max_redeliver: nothing of it is handed out.
        kid = (pk.tp, pk.key)
        resolved = _resolved(kid, source_key(last.topic, last.partition, last.offset), b"dlq")
        self._dlq_inflight.append((kid, futures, resolved))
        self._dlq_keys.add(kid)

    def close(self) -> None:
        try:
            self.settle()
            self.flush()
        finally:
            for producer in (self._producer, self._dlq_producer):
                producer.close(self._timeout)


def _park(r: Record, count: int = 0, due_ms: int = 0) -> _Event:
    headers = {**r.headers, H_OP: b"park", H_PSOURCE: source_key(r.topic, r.partition, r.offset).encode()}
    if count:
        headers[H_PCOUNT] = str(count).encode()
        headers[H_PDUE] = str(due_ms).encode()
    if r.headers and not PARK_HEADERS.isdisjoint(r.headers):
        r = r._replace(headers={k: v for k, v in r.headers.items() if k not in PARK_HEADERS})  # as a replay
    return (cast(bytes, r.key), r.value, r.tag, headers, r)


def _fail(kid: KeyId, src: str, count: int, due_ms: int) -> _Event:
    headers = {H_OP: b"fail", H_PSOURCE: src.encode(), H_PCOUNT: str(count).encode()}
    headers[H_PDUE] = str(due_ms).encode()
    return (kid[1], b"", None, headers, None)


def _resolved(kid: KeyId, src: str, how: bytes) -> _Event:
    return (kid[1], b"", None, {H_OP: b"resolved", H_PSOURCE: src.encode(), H_HOW: how}, None)


def unpark_event(
    key: bytes, tps: Iterable[TopicPartition] = ()
) -> list[tuple[bytes, bytes, str | None, dict[str, bytes]]]:
    """The events of ``sluice group unpark``: every partition of ``key``, or the ones given."""
    chosen = list(tps)
    if not chosen:
        return [(key, b"", None, {H_OP: b"unpark"})]
    return [(key, b"", None, {H_OP: b"unpark", H_PSOURCE: source_key(t, p, -1).encode()}) for t, p in chosen]
