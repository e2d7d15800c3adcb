"""How much of a client's input an error message repeats: ``echo`` cuts an echoed input, ``bounded_message``
a whole message (issue 16: a 1 MB topic name came back as a 2 MB error, and a 100 KB group name as a
RESOURCE_EXHAUSTED metadata failure instead of the typed error). Re-exported by ``sluice.errors``.
"""

from __future__ import annotations

__all__ = ["ECHO_LIMIT", "MAX_ERROR_MESSAGE_BYTES", "bounded_message", "echo"]

#: The most characters of a client's input an error message repeats (issue 16): a 1 MB topic name came
#: back as a 2 MB error. ``echo`` is the one function that cuts an echoed input.
ECHO_LIMIT = 200

#: The most UTF-8 bytes of one error message sent to a client (a status's details, an ``Error`` in a
#: response): the backstop behind ``echo`` for a message that repeats several inputs. The details travel in
#: the ``grpc-message`` trailer, percent-encoded (up to 3 bytes per byte), and a client drops a response
#: whose metadata passes its limit (16 KiB hard, 8 KiB soft by default) as RESOURCE_EXHAUSTED, losing the
#: typed error.
MAX_ERROR_MESSAGE_BYTES = 960


def echo(value: object, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters of the input plus its length.

    ``echo("x" * 10**6)`` is ``'xxx…x'... (1000000 characters)`` with 200 x's: a reader sees what was sent
    and how big it was, and the message stays small whatever the input.
    """
    if isinstance(value, str | bytes) and len(value) > limit:
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value)} {unit})"
    text = repr(value)
    if len(text) > limit:
        return f"{text[:limit]}... ({len(text)} characters)"
    return text


def bounded_message(message: str, limit: int = MAX_ERROR_MESSAGE_BYTES) -> str:
    """``message``, cut to ``limit`` UTF-8 bytes with its full length said."""
    encoded = message.encode(errors="replace")
    if len(encoded) <= limit:
        return message
    head = encoded[:limit].decode(errors="ignore")
    return f"{head}... (cut: {len(message)} characters)"
