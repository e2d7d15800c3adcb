"""A wire connection's read buffer (``server/wire.py``): 16 KiB to start, larger only while a large
frame arrives or reads fill it, back to 16 KiB after; frames pass whole whatever its size.

A real listener on loopback, on both event loops the services run on, with a connection that
answers each frame with the SHA-256 of its payload and notes the buffer it was read into.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable

import pytest
import uvloop

from sluice.common.wire import HEADER, FrameReader, FrameType, Payload
from sluice.server.wire import READ_BUFFER_MAX, READ_BUFFER_MIN, WireConnection, WireListener
from sluice.v1 import wire_pb2

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


class _Digests(WireConnection):
    """Answers each frame with its payload's SHA-256; ``sizes``: the buffer size at each frame."""

    last: _Digests | None = None

    def __init__(self, listener: WireListener) -> None:
        super().__init__(listener)
        self.sizes: list[int] = []
        _Digests.last = self

    def on_frame(self, kind: int, payload: Payload) -> None:
        self.sizes.append(self.read_buffer_bytes)
        self.write(FrameType.CONSUME, hashlib.sha256(payload).digest())


async def _exchange(payloads: list[bytes]) -> tuple[list[bytes], list[int], list[int]]:
    """Send each payload in turn and wait for its digest: (digests, the buffer each frame ended in,
    the buffer after each frame)."""
    listener = WireListener("test", _Digests, "127.0.0.1", 0)
    port = await listener.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    frames = FrameReader()
    pending: list[tuple[int, bytes]] = []

    async def answer() -> bytes:
        while not pending:
            data = await asyncio.wait_for(reader.read(1 << 16), 10)
            assert data, "the server closed the connection"
            pending.extend(frames.feed(data))
        return pending.pop(0)[1]

    def send(kind: int, payload: bytes) -> None:
        writer.write(HEADER.pack(len(payload) + 1, kind) + payload)

    try:
        send(FrameType.HELLO, wire_pb2.WireHello(version=1, client_id="t").SerializeToString())
        await answer()
        connection = _Digests.last
        assert connection is not None
        assert connection.read_buffer_bytes == READ_BUFFER_MIN
        digests = []
        after = []
        for payload in payloads:
            send(FrameType.CONSUME, payload)
            await writer.drain()
            digests.append(await answer())
            # The server sized its next read in the callback that wrote the answer: done by now.
            after.append(connection.read_buffer_bytes)
        return digests, connection.sizes, after
    finally:
        writer.close()
        await listener.stop()


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_the_buffer_grows_for_a_large_frame_and_shrinks_after_it(loop: str) -> None:
    large = os.urandom(3 * READ_BUFFER_MAX + 123)
    payloads = [b"small", large, b"small again", os.urandom(READ_BUFFER_MAX // 2), b"x", large]
    runner = asyncio.Runner(loop_factory=LOOPS[loop])
    with runner:
        digests, ended_in, after = runner.run(_exchange(payloads))
    assert digests == [hashlib.sha256(p).digest() for p in payloads]
    assert ended_in[0] == READ_BUFFER_MIN
    assert after[0] == READ_BUFFER_MIN
    # The first read of a large frame is at most 16 KiB; the rest goes into a grown buffer.
    assert ended_in[1] == READ_BUFFER_MAX
    # A small frame after it is read (at the latest) into the grown buffer, which then shrinks.
    assert after[2] == READ_BUFFER_MIN
    # A frame of half the maximum: the buffer grows to what the frame still needs, not beyond.
    assert READ_BUFFER_MIN < ended_in[3] < READ_BUFFER_MAX
    assert after[4] == READ_BUFFER_MIN
    assert ended_in[5] == READ_BUFFER_MAX
