"""A pushed message as the application sees it.

The dispatcher forwards the broker's record batches (``MessageBatch.batches``, cut down to the
records this consumer got). The SDK indexes each batch once (``codec.batch.BatchView``: offsets and
column views) and makes one small :class:`Message` per record; key, value, tag, headers and
timestamp are read from the batch only when asked for. So the receive path is one object per
message with no per-field copies, and a consumer that only acks (or only reads ``value``) never
pays for the rest. The first ``key`` (or ``value``) read of a batch slices every key (value) of the
batch at once, at C level (:class:`BatchRecords`), so each later read is a list index: reading one
record's key through ``BatchView.key`` was two Python calls and a slice, 0.4 µs, a third of what the
consumer spent per record in the compare's push run (docs/push-consumer.md, "Keys and values per
batch"). A dispatcher that sends ``PushedMessage``s instead (one predating
``record_batches``) gets :class:`PushedMessageView`s with the same interface.
"""

from __future__ import annotations

from itertools import islice, repeat
from typing import NamedTuple

from sluice.codec.batch import BatchView, batch_views
from sluice.v1 import dispatcher_pb2

__all__ = ["BatchRecords", "Message", "MessageId", "PushedMessageView", "messages_of"]


class MessageId(NamedTuple):
    partition: int
    offset: int


class BatchRecords:
    """One forwarded batch as its messages read it: the view, and its keys and values sliced all at
    once on the first read of one (a slice per record through C-level ``map``, no Python step per
    record). Two threads reading at once may both slice; they store equal lists. Caller: Message."""

    __slots__ = ("keys", "values", "view")

    def __init__(self, view: BatchView) -> None:
        self.view = view
        self.keys: list[bytes | None] | None = None
        self.values: list[bytes] | None = None

    def load_keys(self) -> list[bytes | None]:
        view = self.view
        ks = view.starts()[0]  # a missing key (length -1) spans nothing: ks[i] == ks[i + 1]
        keys: list[bytes | None] = list(map(view.buf.__getitem__, map(slice, ks, islice(ks, 1, None))))
        lengths = view.cols.key_lengths
        if min(lengths, default=0) < 0:  # some records have no key (rare): None, not b""
            keys = [None if n < 0 else k for k, n in zip(keys, lengths, strict=True)]
        self.keys = keys
        return keys

    def load_values(self) -> list[bytes]:
        vs = self.view.starts()[1]
        values = list(map(self.view.buf.__getitem__, map(slice, vs, islice(vs, 1, None))))
        self.values = values
        return values


class Message:
    """One message of a push subscription.

    ``topic``, ``partition``, ``offset``, ``key`` (bytes or None), ``value``, ``tag`` (str
    or None), ``headers`` (dict of str to bytes), ``timestamp`` (ms), ``redelivery_count``
    (how many times it was delivered before) and ``message_id`` ((partition, offset)).
    Pass it back to ``ack``/``nack``/``ack_cumulative`` of the consumer that received it.
    ``leader_epoch`` is the leader epoch of the record's log batch (None: not known, a dispatcher
    predating it); acks and nacks carry it, so the dispatcher refuses one whose record was truncated
    away by an unclean election rather than acknowledge the record now at its offset
    (docs/dispatcher.md, "Acks across a truncation").
    """

    __slots__ = (
        "_i",
        "_records",
        "_session",
        "leader_epoch",
        "offset",
        "partition",
        "redelivery_count",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        session: object,
        records: BatchRecords | None,
        index: int,
        redelivery_count: int,
        leader_epoch: int | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        # Identity of the stream session that delivered it: acks go back on that
        # session and are dropped if the session is gone (the dispatcher redelivers).
        self._session = session
        self._records = records
        self._i = index
        self.redelivery_count = redelivery_count
        self.leader_epoch = leader_epoch

    @property
    def message_id(self) -> MessageId:
        return MessageId(self.partition, self.offset)

    @property
    def key(self) -> bytes | None:
        r = self._records
        assert r is not None
        keys = r.keys
        return (r.load_keys() if keys is None else keys)[self._i]

    @property
    def value(self) -> bytes:
        r = self._records
        assert r is not None
        values = r.values
        return (r.load_values() if values is None else values)[self._i]

    @property
    def tag(self) -> str | None:
        assert self._records is not None
        return self._records.view.tag(self._i)

    @property
    def headers(self) -> dict[str, bytes]:
        assert self._records is not None
        return self._records.view.headers(self._i)

    @property
    def timestamp(self) -> int:
        assert self._records is not None
        return self._records.view.timestamp(self._i)

    def __repr__(self) -> str:
        return (
            f"<Message {self.topic}[{self.partition}]@{self.offset} key={self.key!r} tag={self.tag!r} "
            f"redelivery_count={self.redelivery_count} value={self.value[:32]!r}>"
        )


class PushedMessageView(Message):
    """A message that came as a ``PushedMessage`` (a dispatcher without ``record_batches``)."""

    __slots__ = ("_pm",)

    def __init__(self, topic: str, pm: dispatcher_pb2.PushedMessage, session: object) -> None:
        mid = pm.id
        epoch = mid.leader_epoch if mid.HasField("leader_epoch") else None
        super().__init__(topic, mid.partition, mid.offset, session, None, 0, pm.redelivery_count, epoch)
        self._pm = pm

    @property
    def key(self) -> bytes | None:
        # proto3 bytes have no presence: an empty key and no key look the same on the wire.
        return self._pm.key or None

    @property
    def value(self) -> bytes:
        return self._pm.value

    @property
    def tag(self) -> str | None:
        return self._pm.tag or None

    @property
    def headers(self) -> dict[str, bytes]:
        return dict(self._pm.headers)

    @property
    def timestamp(self) -> int:
        return self._pm.timestamp


def messages_of(
    batch: dispatcher_pb2.MessageBatch,
    topic: str,
    session: object,
    kinds: tuple[type[Message], type[PushedMessageView]] | None = None,
) -> list[Message]:
    """The messages of one ``MessageBatch``, in order: its record batches (CRC-checked, indexed once
    per batch) and any ``PushedMessage``s. ``kinds``: the classes to make them of (a consumer with
    deserializers, ``serde_message.message_kinds``), else Message and PushedMessageView."""
    plain, pushed = (Message, PushedMessageView) if kinds is None else kinds
    out: list[Message] = []
    for entry in batch.batches:
        p = entry.partition
        counts = list(entry.redelivery_counts)
        k = 0
        for v in batch_views(entry.records):
            offsets = v.offsets
            n = len(offsets)
            # map() with repeat(): about half the cost of a list comprehension calling the class.
            c = counts[k : k + n] if counts else repeat(0)
            k += n
            # The batch's leader epoch travels with each message to its ack (one per batch, no step
            # per message).
            epoch = repeat(v.header.partition_leader_epoch)
            out += map(
                plain,
                repeat(topic),
                repeat(p),
                offsets,
                repeat(session),
                repeat(BatchRecords(v)),
                range(n),
                c,
                epoch,
            )
    if batch.messages:
        out += [pushed(topic, pm, session) for pm in batch.messages]
    return out
