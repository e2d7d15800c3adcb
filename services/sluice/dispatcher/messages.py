"""Messages as the dispatcher holds them: a record's place in a fetched log batch, nothing decoded.

A partition feed indexes each fetched batch once (``codec.batch.BatchView``: header, columns, record
offsets) and makes one small :class:`Message` per record pointing into it; every subscription of the
partition shares these objects. No record is decoded or re-encoded on the hot path:

- a consumer that subscribed with ``record_batches`` (the SDK) gets the log batches themselves,
  cut down to the records it was given (:func:`encode_batches_event`; a cut is a handful of slices
  of the columnar layout plus a CRC, whatever the number of records);
- an older consumer gets one ``PushedMessage`` per record (:attr:`Message.wire`), encoded on first
  use and cached, exactly as before. A redelivered message appends its ``redelivery_count`` field
  (protobuf merges repeated occurrences of a message's fields), so the cached encoding never changes.

Filters read the tag column, Key_Shared reads the key (both per record, only for subscriptions that
need them), and the DLQ decodes the few records it publishes (:attr:`Message.record`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from itertools import groupby, repeat
from operator import attrgetter

from sluice.codec.batch import BatchView, Record
from sluice.dispatcher.keyshared import key_hash
from sluice.v1 import dispatcher_pb2 as pb

__all__ = [
    "Message",
    "compact",
    "encode_batch_event",
    "encode_batches_event",
    "encode_pushed",
    "messages_of",
    "offset_of",
    "varint",
]

_MESSAGES_FIELD = b"\x12"  # MessageBatch.messages (2, length-delimited)
_TOPIC_FIELD = b"\x0a"  # MessageBatch.topic (1, length-delimited)
_EVENT_MESSAGES_FIELD = b"\x12"  # DispatcherEvent.messages (2, length-delimited)
_REDELIVERY_FIELD = b"\x10"  # PushedMessage.redelivery_count (2, varint)
#: What a message counts for against read-ahead limits on top of its share of the batch bytes.
_OVERHEAD = 48
_view_of = attrgetter("view")
#: A message's offset, as a C-level callable for ``map`` (one Python step less per message).
offset_of = attrgetter("offset")
_index_of = attrgetter("index")


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class Message:
    """One record of a partition (record ``index`` of ``view``), shared by every subscription.

    ``_hash`` and ``_wire`` are filled on first use (an unset slot raises AttributeError), which
    keeps construction, once per record read, to five stores.
    """

    __slots__ = ("_hash", "_head", "_wire", "index", "offset", "partition", "size", "view")

    _hash: int
    _head: int
    _wire: bytes

    def __init__(self, view: BatchView, index: int, offset: int, partition: int, size: int) -> None:
        self.view = view
        self.index = index
        self.offset = offset
        self.partition = partition
        #: What this message counts for against read-ahead limits.
        self.size = size

    @property
    def record(self) -> Record:
        """The decoded record (its ``topic`` is empty: a message does not know it)."""
        return self.view.record("", self.partition, self.index)

    @property
    def tag(self) -> str | None:
        return self.view.tag(self.index)

    @property
    def key_hash(self) -> int:
        try:
            return self._hash
        except AttributeError:
            h = self._hash = key_hash(self.view.key(self.index))
            return h

    @property
    def wire(self) -> bytes:
        """This message as one ``MessageBatch.messages`` element (the ``PushedMessage`` path)."""
        try:
            return self._wire
        except AttributeError:
            body = encode_pushed(self.record, self.view.header.partition_leader_epoch)
            head = _MESSAGES_FIELD + varint(len(body))
            self._head = len(head)
            w = self._wire = head + body
            return w

    def framed(self, redelivery_count: int) -> bytes:
        """:attr:`wire` with the ``redelivery_count`` field when it is not 0."""
        wire = self.wire
        if not redelivery_count:
            return wire
        body = wire[self._head :] + _REDELIVERY_FIELD + varint(redelivery_count)
        return _MESSAGES_FIELD + varint(len(body)) + body

    def __repr__(self) -> str:
        return f"Message(partition={self.partition}, offset={self.offset})"


def messages_of(views: Sequence[BatchView], partition: int, start: int) -> list[Message]:
    """Messages for the records of ``views`` at offsets ``>= start`` (a fetch returns whole batches,
    which may begin before the offset asked for). Caller: the partition feed, once per fetch."""
    out: list[Message] = []
    for v in views:
        h = v.header
        if h.next_offset <= start:
            continue
        offsets = v.offsets
        size = h.length // h.record_count + _OVERHEAD
        first = bisect_left(offsets, start) if offsets[0] < start else 0
        # map() with repeat(): about half the cost of a list comprehension calling the class.
        n = len(offsets)
        out += map(Message, repeat(v), range(first, n), offsets[first:], repeat(partition), repeat(size))
    return out


def encode_pushed(r: Record, leader_epoch: int = -1) -> bytes:
    """A record as a serialized ``PushedMessage`` (without ``redelivery_count``), its id carrying the
    ``leader_epoch`` of its batch (-1: none, a batch stamped before epochs) for the consumer's acks.

    Records without headers (the common case) are encoded by hand, field by field in field-number
    order exactly as the protobuf runtime would; the unit tests compare both encodings.
    """
    if r.headers:
        m = pb.PushedMessage(
            id=pb.MessageId(partition=r.partition, offset=r.offset), value=r.value, timestamp=r.timestamp
        )
        if leader_epoch >= 0:
            m.id.leader_epoch = leader_epoch
        if r.key is not None:
            m.key = r.key
        if r.tag:
            m.tag = r.tag
        m.headers.update(r.headers)
        return m.SerializeToString()
    v = varint
    pid = b"\x08" + v(r.partition) if r.partition else b""
    mid = pid + b"\x10" + v(r.offset) if r.offset else pid
    if leader_epoch >= 0:  # a field with presence: 0 is written too
        mid += b"\x18" + v(leader_epoch)
    parts = [b"\x0a", v(len(mid)), mid]
    key = r.key
    if key:
        parts += (b"\x1a", v(len(key)), key)
    value = r.value
    if value:
        parts += (b"\x22", v(len(value)), value)
    tag = r.tag
    if tag:
        raw = tag.encode()
        parts += (b"\x2a", v(len(raw)), raw)
    ts = r.timestamp
    if ts:
        parts += (b"\x38", v(ts if ts >= 0 else ts + (1 << 64)))
    return b"".join(parts)


def encode_batch_event(topic: str, framed: Sequence[bytes]) -> bytes:
    """A serialized ``DispatcherEvent{messages: MessageBatch{topic, messages}}``."""
    raw_topic = topic.encode()
    batch = b"".join((_TOPIC_FIELD, varint(len(raw_topic)), raw_topic, *framed))
    return _EVENT_MESSAGES_FIELD + varint(len(batch)) + batch


def encode_batches_event(topic: str, messages: Sequence[Message], counts: Sequence[int]) -> bytes:
    """A serialized ``DispatcherEvent{messages: MessageBatch{topic, batches}}`` carrying ``messages``
    (with their redelivery ``counts``) as cuts of their log batches, in the order given.

    Consecutive messages of one log batch with increasing indexes share one cut; a message of
    another batch (or an earlier index, e.g. a redelivery after new messages) starts the next one.
    """
    batch = pb.MessageBatch(topic=topic)
    add = batch.batches.add
    # Groups of consecutive messages of one log batch, found at C level (``groupby`` on the view);
    # a group whose indexes are one increasing run (the usual case: a delivery of new messages) is
    # one cut with no step per message. Any other group goes through ``_add_runs``.
    first = 0
    for view, group in groupby(messages, _view_of):
        indexes = list(map(_index_of, group))
        end = first + len(indexes)
        lo = indexes[0]
        if indexes[-1] - lo + 1 == len(indexes) and indexes == list(range(lo, lo + len(indexes))):
            _add_cut(add, messages[first].partition, view, [(lo, lo + len(indexes))], counts, first, end)
        else:
            _add_runs(add, messages, counts, first, end)
        first = end
    payload = batch.SerializeToString()
    return _EVENT_MESSAGES_FIELD + varint(len(payload)) + payload


def _add_runs(add: object, messages: Sequence[Message], counts: Sequence[int], lo: int, hi: int) -> None:
    """``messages[lo:hi]`` (one log batch) as cuts of increasing index runs: an earlier index than the
    last (e.g. a redelivery after new messages) starts the next cut."""
    view: BatchView | None = None
    partition = 0
    runs: list[tuple[int, int]] = []
    start = end = -1
    first = lo  # index in ``messages`` of the cut's first message
    for k in range(lo, hi):
        m = messages[k]
        v, i = m.view, m.index
        if v is view and i >= end:
            if i == end:
                end += 1
                continue
            runs.append((start, end))
            start, end = i, i + 1
            continue
        if view is not None:
            runs.append((start, end))
            _add_cut(add, partition, view, runs, counts, first, k)
        view, partition, runs, start, end, first = v, m.partition, [], i, i + 1, k
    if view is not None:
        runs.append((start, end))
        _add_cut(add, partition, view, runs, counts, first, hi)


def _add_cut(
    add: object,
    partition: int,
    view: BatchView,
    runs: list[tuple[int, int]],
    counts: Sequence[int],
    first: int,
    end: int,
) -> None:
    entry = add(partition=partition, records=view.cut(runs))  # type: ignore[operator]
    group = counts[first:end]
    if any(group):
        entry.redelivery_counts.extend(group)


#: Batches smaller than this are never compacted: keeping them whole costs little.
COMPACT_MIN_BATCH_BYTES = 64 * 1024
#: A batch is compacted when the messages still held account for less than 1/COMPACT_RATIO of it.
COMPACT_RATIO = 8


def compact(held: Iterable[Message]) -> int:
    """Move long-held messages out of mostly-finished large batches; returns the bytes released.

    A message keeps its whole log batch alive (up to the producer's batch size, 1 MiB by default).
    When a consumer leaves a few messages of a large batch unacknowledged (poison messages, slow
    work), the batch would stay in memory for them: here those messages get a batch of their own,
    cut from the old one (their cached hash and encoding stay valid). Caller: the runtime, every few
    seconds, with every message a subscription holds (in flight, waiting for redelivery, dead).
    """
    by_view: dict[int, list[Message]] = {}
    for m in held:
        group = by_view.get(id(m.view))
        if group is None:
            by_view[id(m.view)] = [m]
        else:
            group.append(m)
    released = 0
    for group in by_view.values():
        view = group[0].view
        length = view.header.length
        if length < COMPACT_MIN_BATCH_BYTES or len(group) * COMPACT_RATIO * group[0].size > length:
            continue
        # Other holders (another subscription, a pending queue) may still reference the old view;
        # messages are shared, so moving them here moves them for every subscription.
        indexes = sorted({m.index for m in group})
        small = BatchView(view.cut(list(_runs(indexes))))
        new_index = {i: k for k, i in enumerate(indexes)}
        for m in group:
            if m.view is view:
                m.index = new_index[m.index]
                m.view = small
        released += length - small.header.length
    return released


def _runs(indexes: list[int]) -> Iterator[tuple[int, int]]:
    start = end = indexes[0]
    for i in indexes:
        if i != end:
            yield start, end
            start = i
        end = i + 1
    yield start, end
