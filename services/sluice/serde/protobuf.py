"""Protobuf messages: a message is its ``SerializeToString()``; reading needs the message class.

Protobuf's binary encoding carries no type: the reader says which message it expects
(``ProtobufDeserializer(OrderPlaced)``). The serializer can be bound to a class too, so that a message of
another type is refused at ``send()`` instead of being read as garbage later. protobuf is a dependency
of the SDK itself, so these need no extra.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from sluice.errors import InvalidArgument

__all__ = ["ProtobufDeserializer", "ProtobufSerializer"]

M = TypeVar("M", bound=Message)


def _check_class(message_class: object) -> None:
    if not (isinstance(message_class, type) and issubclass(message_class, Message)):
        raise InvalidArgument(f"a protobuf message class is needed, got {message_class!r}")


class ProtobufSerializer:
    """``message -> bytes``. With ``message_class``, other message types are refused."""

    def __init__(self, message_class: type[Message] | None = None) -> None:
        if message_class is not None:
            _check_class(message_class)
        self._cls = message_class

    def __call__(self, obj: Any) -> bytes:
        expected = self._cls or Message
        if not isinstance(obj, expected):
            raise TypeError(f"expected a {expected.__name__} message, got {type(obj).__name__}")
        # Deterministic: the same message gives the same bytes (map order), so keys hash alike.
        return obj.SerializeToString(deterministic=True)


class ProtobufDeserializer(Generic[M]):
    """``bytes -> message_class``. Bytes that are not a valid encoding fail (DecodeError); note that
    protobuf accepts many byte strings as some message (unknown fields are kept)."""

    def __init__(self, message_class: type[M]) -> None:
        _check_class(message_class)
        self._cls = message_class

    def __call__(self, data: bytes) -> M:
        msg = self._cls()
        msg.ParseFromString(data)
        return msg
