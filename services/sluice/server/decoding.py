"""Request decoding inside the handler, so that bytes which are not the request message get a typed
``INVALID_ARGUMENT`` instead of grpcio's ``UNKNOWN`` and a traceback per call.

grpcio runs a method's request deserializer before any handler or interceptor code, and an exception
there escapes as ``UNKNOWN`` with the stack logged at ERROR (issue 16). The interceptor therefore
registers every method with a pass-through deserializer and decodes here, raising ``InvalidArgument``:
the one error path every other bad input takes. Undecodable requests are a client's problem, not the
server's, so they are logged as one warning line per method at most every ``WARN_EVERY`` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from google.protobuf.message import DecodeError

from sluice.errors import InvalidArgument

log = logging.getLogger(__name__)

WARN_EVERY = 10.0


class RequestDecoder:
    """Decodes one method's requests with the deserializer its handler was registered with."""

    def __init__(self, method: str, deserializer: Callable[[bytes], Any] | None) -> None:
        self._method = method
        self._deserializer = deserializer
        self._warned_at = float("-inf")
        self._suppressed = 0

    def decode(self, raw: Any) -> Any:
        if self._deserializer is None or not isinstance(raw, bytes):
            return raw
        try:
            return self._deserializer(raw)
        except DecodeError:
            self._warn(len(raw))
            raise InvalidArgument(
                f"the request ({len(raw)} bytes) is not a valid {self._method} request"
            ) from None

    async def stream(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for raw in requests:
            yield self.decode(raw)

    def _warn(self, size: int) -> None:
        now = time.monotonic()
        if now - self._warned_at < WARN_EVERY:
            self._suppressed += 1
            return
        log.warning(
            "undecodable %s request (%d bytes) answered INVALID_ARGUMENT (%d more since the last warning)",
            self._method,
            size,
            self._suppressed,
        )
        self._warned_at, self._suppressed = now, 0
