"""A pushed message as the application sees it.

Fields are read from the wire message only when asked for: the receive path
stays one object per message with no per-field copies, and a consumer that only
acks (or only reads ``value``) never pays for the headers map.
"""

from __future__ import annotations

from typing import NamedTuple

from sluice.v1 import dispatcher_pb2

__all__ = ["Message", "MessageId"]


class MessageId(NamedTuple):
    partition: int
    offset: int


class Message:
    """One message of a push subscription.

    ``topic``, ``partition``, ``offset``, ``key`` (bytes or None), ``value``, ``tag`` (str
    or None), ``headers`` (dict of str to bytes), ``timestamp`` (ms), ``redelivery_count``
    (how many times it was delivered before) and ``message_id`` ((partition, offset)).
    Pass it back to ``ack``/``nack``/``ack_cumulative`` of the consumer that received it.
    """

    __slots__ = ("_pm", "_session", "offset", "partition", "topic")

    def __init__(self, topic: str, pm: dispatcher_pb2.PushedMessage, session: object) -> None:
        self.topic = topic
        self._pm = pm
        # Identity of the stream session that delivered it: acks go back on that
        # session and are dropped if the session is gone (the dispatcher redelivers).
        self._session = session
        mid = pm.id
        self.partition: int = mid.partition
        self.offset: int = mid.offset

    @property
    def message_id(self) -> MessageId:
        return MessageId(self.partition, self.offset)

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

    @property
    def redelivery_count(self) -> int:
        return self._pm.redelivery_count

    def __repr__(self) -> str:
        return (
            f"<Message {self.topic}[{self.partition}]@{self.offset} key={self.key!r} tag={self.tag!r} "
            f"redelivery_count={self.redelivery_count} value={self.value[:32]!r}>"
        )
