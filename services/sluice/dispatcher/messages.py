"""Messages as the dispatcher holds them: a decoded record plus its pre-encoded wire form.

A partition feed decodes each fetched batch once (``codec.batch.decode_records``) and encodes each
record once as a ``PushedMessage`` already framed as field 2 of ``MessageBatch``. Every subscription
of the partition shares these objects, and sending a batch of N messages to a consumer is one
``b"".join`` instead of N protobuf constructions. A redelivered message appends its
``redelivery_count`` field (protobuf merges repeated occurrences of a message's fields), so the
shared encoding never changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.codec.batch import Record
from sluice.dispatcher.keyshared import key_hash
from sluice.v1 import dispatcher_pb2 as pb

__all__ = ["Message", "encode_batch_event", "encode_messages", "varint"]

_MESSAGES_FIELD = b"\x12"  # MessageBatch.messages (2, length-delimited)
_TOPIC_FIELD = b"\x0a"  # MessageBatch.topic (1, length-delimited)
_EVENT_MESSAGES_FIELD = b"\x12"  # DispatcherEvent.messages (2, length-delimited)
_REDELIVERY_FIELD = b"\x10"  # PushedMessage.redelivery_count (2, varint)


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
    """One record of a partition, shared by every subscription of that partition."""

    __slots__ = ("_hash", "_head", "offset", "record", "size", "wire")

    def __init__(self, record: Record, body: bytes) -> None:
        self.record = record
        self.offset = record.offset
        n = len(body)
        # The encoded ``PushedMessage`` (without ``redelivery_count``), framed as one
        # ``MessageBatch.messages`` element: what a first delivery sends as it is.
        if n < 0x80:
            self.wire = b"\x12" + bytes((n,)) + body
            self._head = 2
        else:
            head = _MESSAGES_FIELD + varint(n)
            self.wire = head + body
            self._head = len(head)
        #: What this message counts for against read-ahead limits.
        self.size = n + 70
        self._hash = -1

    @property
    def key_hash(self) -> int:
        h = self._hash
        if h < 0:
            h = self._hash = key_hash(self.record.key)
        return h

    def framed(self, redelivery_count: int) -> bytes:
        """This message as one ``MessageBatch.messages`` element."""
        if not redelivery_count:
            return self.wire
        body = self.wire[self._head :] + _REDELIVERY_FIELD + varint(redelivery_count)
        return _MESSAGES_FIELD + varint(len(body)) + body

    def __repr__(self) -> str:
        return f"Message(partition={self.record.partition}, offset={self.offset}, key={self.record.key!r})"


def _encode_with_headers(r: Record) -> bytes:
    """The general (slower) path: a record with headers, through the protobuf runtime."""
    m = pb.PushedMessage(
        id=pb.MessageId(partition=r.partition, offset=r.offset), value=r.value, timestamp=r.timestamp
    )
    if r.key is not None:
        m.key = r.key
    if r.tag:
        m.tag = r.tag
    m.headers.update(r.headers)
    return m.SerializeToString()


def encode_messages(records: Sequence[Record]) -> list[Message]:
    """Encode decoded records once; the partition feed calls this per fetched chunk.

    Records without headers (the common case) are encoded by hand, field by field in field-number
    order exactly as the protobuf runtime would (about twice as fast as building a ``PushedMessage``);
    the unit tests compare both encodings.
    """
    out: list[Message] = []
    append = out.append
    v = varint
    last_ts = None
    ts_field = b""
    pid = b""
    last_partition = -1
    for r in records:
        if r.headers:
            append(Message(r, _encode_with_headers(r)))
            continue
        if r.partition != last_partition:
            last_partition = r.partition
            pid = b"\x08" + v(r.partition) if r.partition else b""
        mid = pid + b"\x10" + v(r.offset) if r.offset else pid
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
        if ts != last_ts:
            last_ts = ts
            ts_field = b"\x38" + v(ts if ts >= 0 else ts + (1 << 64)) if ts else b""
        parts.append(ts_field)
        append(Message(r, b"".join(parts)))
    return out


def encode_batch_event(topic: str, framed: Sequence[bytes]) -> bytes:
    """A serialized ``DispatcherEvent{messages: MessageBatch{topic, messages}}``."""
    raw_topic = topic.encode()
    batch = b"".join((_TOPIC_FIELD, varint(len(raw_topic)), raw_topic, *framed))
    return _EVENT_MESSAGES_FIELD + varint(len(batch)) + batch
