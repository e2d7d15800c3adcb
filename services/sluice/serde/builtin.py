"""The serializer types and the built-ins that need no extra library: bytes, str (UTF-8) and JSON.

A serializer is any callable ``obj -> bytes``; a deserializer any callable ``bytes -> obj``. The config
options take one of those or a built-in's name (``"bytes"``, ``"str"``, ``"json"``), so a TOML file or an
environment variable can name them; the Avro and Protobuf built-ins need arguments (a schema, a message
class) and are passed as objects (``sluice.serde.avro``, ``sluice.serde.protobuf``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sluice.errors import InvalidArgument

__all__ = [
    "BUILTIN_NAMES",
    "Deserializer",
    "DeserializerSpec",
    "Serializer",
    "SerializerSpec",
    "bytes_deserializer",
    "bytes_serializer",
    "json_deserializer",
    "json_serializer",
    "resolve_deserializer",
    "resolve_serializer",
    "str_deserializer",
    "str_serializer",
]

Serializer = Callable[[Any], bytes]
Deserializer = Callable[[bytes], Any]
#: What a ``key_serializer`` / ``value_serializer`` option accepts: a callable, a built-in's name, or None.
SerializerSpec = Serializer | str | None
DeserializerSpec = Deserializer | str | None


def bytes_serializer(obj: Any) -> bytes:
    """bytes as they are (bytearray and memoryview copied): the same as no serializer, named."""
    if isinstance(obj, bytes | bytearray | memoryview):
        return bytes(obj)
    raise TypeError(f"the bytes serializer takes bytes, got {type(obj).__name__}")


def bytes_deserializer(data: bytes) -> bytes:
    return data


def str_serializer(obj: Any) -> bytes:
    """A str as UTF-8. Other types are refused rather than ``str()``-ed: a stray object must not be
    sent as its repr."""
    if not isinstance(obj, str):
        raise TypeError(f"the str serializer takes str, got {type(obj).__name__}")
    return obj.encode("utf-8")


def str_deserializer(data: bytes) -> str:
    """Strict UTF-8: bytes that are not UTF-8 fail (DeserializationError), they are not replaced."""
    return data.decode("utf-8")


def json_serializer(obj: Any) -> bytes:
    """Compact UTF-8 JSON. NaN and infinities are refused: they are not JSON, and other readers
    (JavaScript, Java, Go) reject them."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def json_deserializer(data: bytes) -> Any:
    """JSON from UTF-8 bytes; ``NaN`` and ``Infinity`` tokens are refused like the serializer does."""
    return json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)


def _refuse_constant(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


_SERIALIZERS: dict[str, Serializer] = {
    "bytes": bytes_serializer,
    "str": str_serializer,
    "json": json_serializer,
}
_DESERIALIZERS: dict[str, Deserializer] = {
    "bytes": bytes_deserializer,
    "str": str_deserializer,
    "json": json_deserializer,
}
#: The names the options accept.
BUILTIN_NAMES = tuple(_SERIALIZERS)


def resolve_serializer(spec: object, option: str) -> Serializer | None:
    """The callable for a ``*_serializer`` option's value (None: none). InvalidArgument names the option."""
    return _resolve(spec, option, _SERIALIZERS)


def resolve_deserializer(spec: object, option: str) -> Deserializer | None:
    """The callable for a ``*_deserializer`` option's value (None: none)."""
    return _resolve(spec, option, _DESERIALIZERS)


def _resolve(spec: object, option: str, named: dict[str, Any]) -> Callable[..., Any] | None:
    if spec is None:
        return None
    if isinstance(spec, str):
        fn = named.get(spec.strip().lower())
        if fn is None:
            raise InvalidArgument(
                f"{option}: unknown built-in {spec!r}; use one of {', '.join(BUILTIN_NAMES)}, "
                "an Avro or Protobuf serializer object, or any callable"
            )
        return fn  # type: ignore[no-any-return]
    if not callable(spec):
        raise InvalidArgument(f"{option} must be a callable or a built-in's name, got {spec!r}")
    return spec
