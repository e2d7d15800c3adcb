"""A wire-protocol connection for asyncio services: one request at a time.

The dispatcher's partition feeds fetch from brokers with it (one long-poll in flight per
feed, which is all a feed needs). ``docs/wire.md`` describes the protocol; the SDK's
thread-based counterpart, which pipelines, is ``sluice.client.wire``.

A failure of any kind closes the connection and raises a typed error (BrokerNotAvailable
when a retry may succeed); the next request connects again. Cancelling a request (a feed's
kick) also closes the connection: its answer would otherwise arrive later, unasked for.
A continuous fetch (``FetchRequest.continuous``) is sent once with ``request`` and then
read answer after answer with ``answer``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Generic, TypeVar

from google.protobuf.message import DecodeError

from sluice.common.wire import (
    HEADER,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    FrameType,
    WireRequest,
    error_from_frame,
    frame,
    split_address,
)
from sluice.errors import BrokerNotAvailable, error_for_code
from sluice.v1 import wire_pb2

__all__ = ["AsyncWireConnection"]

CONNECT_TIMEOUT_S = 10.0


Req = TypeVar("Req", bound=WireRequest)
Resp = TypeVar("Resp")


class AsyncWireConnection(Generic[Req, Resp]):
    """Requests of one kind to one broker, one at a time; not safe for concurrent ``request``."""

    def __init__(self, address: str, kind: FrameType, response_type: type[Resp], client_id: str = "") -> None:
        self.address = address
        self._endpoint = split_address(address)
        self._kind = kind
        self._response_type: Any = response_type
        self._hello = wire_pb2.WireHello(version=PROTOCOL_VERSION, client_id=client_id).SerializeToString()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._next_id = 1

    async def request(self, request: Req) -> Resp:
        """Send ``request`` and wait for its answer."""
        try:
            if self._writer is None:
                await self._connect()
            assert self._writer is not None
            request.request_id = self._next_id
            self._next_id += 1
            self._writer.write(frame(self._kind, request.SerializeToString()))
        except BaseException as exc:
            failure = self._failed(exc)
            if failure is exc:
                raise
            raise failure from exc
        return await self.answer()

    async def answer(self) -> Resp:
        """The next answer to the last request (a continuous fetch answers it again and again)."""
        try:
            kind, payload = await self._read_frame()
            if kind != self._kind:
                raise BrokerNotAvailable(f"broker {self.address}: unexpected frame type {kind}")
            response = self._response_type.FromString(payload)
            if response.request_id != self._next_id - 1:
                raise BrokerNotAvailable(
                    f"broker {self.address}: answer to request {response.request_id}, "
                    f"expected {self._next_id - 1}"
                )
            return response  # type: ignore[no-any-return]
        except BaseException as exc:
            failure = self._failed(exc)
            if failure is exc:
                raise
            raise failure from exc

    def _failed(self, exc: BaseException) -> BaseException:
        """Any failure (cancellation included) closes the connection; the error to raise."""
        self.close()
        if isinstance(exc, OSError | asyncio.IncompleteReadError | DecodeError):
            return BrokerNotAvailable(f"broker {self.address}: {exc!r}")
        return exc

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def _connect(self) -> None:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*self._endpoint), CONNECT_TIMEOUT_S)
        self._reader, self._writer = reader, writer
        writer.write(frame(FrameType.HELLO, self._hello))
        kind, payload = await asyncio.wait_for(self._read_frame(), CONNECT_TIMEOUT_S)
        if kind != FrameType.HELLO:
            raise BrokerNotAvailable(f"broker {self.address}: expected a hello answer, got frame type {kind}")
        answer = wire_pb2.WireHelloResponse.FromString(payload)
        if answer.error.code:
            raise error_for_code(answer.error.code, answer.error.message)

    async def _read_frame(self) -> tuple[int, bytes]:
        assert self._reader is not None
        length, kind = HEADER.unpack(await self._reader.readexactly(HEADER.size))
        if not 1 <= length <= MAX_FRAME_BYTES:
            raise BrokerNotAvailable(f"broker {self.address}: a frame of {length} bytes")
        payload = await self._reader.readexactly(length - 1)
        if kind == FrameType.ERROR:
            raise error_from_frame(payload, f"broker {self.address}")
        return kind, payload
