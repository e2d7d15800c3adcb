"""Push messages whose ``key`` / ``value`` go through the consumer's deserializers (docs/serializers.md).

A push consumer with ``key_deserializer`` / ``value_deserializer`` gets message classes of its own
(:func:`message_kinds`): subclasses of :class:`Message` whose ``key`` and ``value`` deserialize on first
access, lazily like the rest of a message, and keep the result. A message that fails raises
DeserializationError (carrying the raw record) from ``.key`` / ``.value``; the message is still a message:
ack it, nack it, or hand ``err.record`` to a dead-letter topic. ``raw_key`` / ``raw_value`` are the bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice.client.push.message import Message, PushedMessageView
from sluice.codec.batch import Record
from sluice.serde.records import RecordDeserializer

__all__ = ["MessageKinds", "message_kinds"]

#: The class for messages of record batches and the one for ``PushedMessage``s.
MessageKinds = tuple[type[Message], type[PushedMessageView]]
_UNSET: Any = object()


def _make(base: type[Message], deserializer: RecordDeserializer) -> type[Any]:
    # The base class's properties read the bytes as stored.
    base_key: Callable[[Message], bytes | None] = base.key.fget  # type: ignore[attr-defined]
    base_value: Callable[[Message], bytes] = base.value.fget  # type: ignore[attr-defined]

    def raw(msg: Message) -> Callable[[], Record]:
        return lambda: Record(
            msg.topic,
            msg.partition,
            msg.offset,
            base_key(msg),
            base_value(msg),
            msg.tag,
            msg.headers,
            msg.timestamp,
        )

    class Deserializing(base):  # type: ignore[valid-type,misc]
        __slots__ = ("_k", "_v")

        @property
        def raw_key(self) -> bytes | None:
            return base_key(self)

        @property
        def raw_value(self) -> bytes:
            return base_value(self)

        @property
        def key(self) -> Any:
            found = getattr(self, "_k", _UNSET)
            if found is _UNSET:
                found = self._k = deserializer.key(base_key(self), raw(self))
            return found

        @property
        def value(self) -> Any:
            found = getattr(self, "_v", _UNSET)
            if found is _UNSET:
                found = self._v = deserializer.value(base_value(self), raw(self))
            return found

    Deserializing.__name__ = Deserializing.__qualname__ = base.__name__
    return Deserializing


def message_kinds(key_spec: object, value_spec: object) -> MessageKinds | None:
    """Message classes that deserialize with these options (None: neither is set; plain messages)."""
    deserializer = RecordDeserializer.of(key_spec, value_spec)
    if deserializer is None:
        return None
    return _make(Message, deserializer), _make(PushedMessageView, deserializer)
