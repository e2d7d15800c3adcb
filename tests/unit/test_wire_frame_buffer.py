"""A large frame read straight into its own buffer (``FrameReader.frame_buffer``, ``docs/wire.md``,
"Receiving a large frame"): frames come out whole however the reads fall, the payload is that buffer
(no copy), a hostile length allocates nothing, and a half-closed frame is still refused.

The reader alone, driven as a ``BufferedProtocol`` drives it, and a real listener on loopback on both
event loops the services run on.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import socket
from collections.abc import Callable

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.common.wire import HEADER, FrameReader, FrameTooLarge, FrameType, Payload, frame
from sluice.server.wire import READ_BUFFER_MIN, WireConnection, WireListener
from sluice.v1 import common_pb2, wire_pb2

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def _drive(stream: bytes, reads: list[int], direct_min: int = 1) -> list[tuple[int, Payload]]:
    """Read ``stream`` as a server does: each read of at most the next of ``reads`` bytes (cycled)
    goes into the frame's own buffer while one is begun with ``direct_min`` or more to come, else
    into a scratch buffer that is then overwritten (as a reused receive buffer is)."""
    reader = FrameReader()
    got: list[tuple[int, Payload]] = []
    scratch = bytearray(max(reads))
    pos = 0
    for size in itertools.cycle(reads):
        if pos >= len(stream):
            break
        into = None
        if reader.receiving_frame or reader.missing >= direct_min:
            into = reader.frame_buffer()
        if into is not None:
            n = min(len(into), size, len(stream) - pos)
            into[:n] = stream[pos : pos + n]
            got += reader.frame_filled(n)
        else:
            n = min(size, len(stream) - pos)
            scratch[:n] = stream[pos : pos + n]
            got += reader.feed(memoryview(scratch)[:n])
            scratch[:] = b"\xff" * len(scratch)
        pos += n
    assert reader.buffered == 0
    return got


def test_a_frame_split_at_every_byte_comes_out_whole_into_its_own_buffer() -> None:
    frames = [(FrameType.PRODUCE, os.urandom(300)), (FrameType.FETCH, b"x"), (FrameType.PRODUCE, b"yz" * 40)]
    stream = b"".join(frame(kind, payload) for kind, payload in frames)
    for first in range(1, len(stream) + 1):
        for rest in (1, 7, 64, len(stream)):
            got = _drive(stream, [first, rest])
            assert [(k, bytes(p)) for k, p in got] == frames, (first, rest)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=5000), min_size=1, max_size=8),
    reads=st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=6),
    direct_min=st.sampled_from([1, 100, 2000]),
)
def test_frames_come_out_whole_and_in_order_whatever_the_reads(
    sizes: list[int], reads: list[int], direct_min: int
) -> None:
    frames = [(FrameType.PRODUCE, os.urandom(size)) for size in sizes]
    stream = b"".join(frame(kind, payload) for kind, payload in frames)
    got = _drive(stream, reads, direct_min)
    assert [(k, bytes(p)) for k, p in got] == frames


def test_the_payload_is_the_buffer_the_reads_went_into() -> None:
    payload = os.urandom(100_000)
    stream = frame(FrameType.PRODUCE, payload)
    reader = FrameReader()
    assert reader.feed(stream[:1000]) == []
    into = reader.frame_buffer()
    assert into is not None
    assert len(into) == len(stream) - 1000
    into[:] = stream[1000:]
    [(kind, got)] = reader.frame_filled(len(into))
    assert kind == FrameType.PRODUCE
    assert got == payload
    assert isinstance(got, bytearray)
    assert into.obj is got


def test_a_hostile_length_is_refused_before_any_buffer_is_allocated() -> None:
    reader = FrameReader(max_frame_bytes=1 << 20)
    with pytest.raises(FrameTooLarge):
        reader.feed(HEADER.pack(2**32 - 1, FrameType.PRODUCE))
    assert not reader.receiving_frame
    assert reader.frame_buffer() is None  # nothing was kept of it: no frame to allocate


def test_the_hello_cap_holds_for_a_frame_read_into_its_own_buffer() -> None:
    reader = FrameReader(max_frame_bytes=1 << 20, first_frame_bytes=100)
    with pytest.raises(FrameTooLarge) as err:
        reader.feed(HEADER.pack(50_000, FrameType.HELLO))
    assert err.value.first


# ---- a real listener ---------------------------------------------------------------------------


class _Direct(WireConnection):
    """Reads large frames into their own buffers (as the broker does once its pool granted them);
    answers each frame with its payload's SHA-256 and notes the payload's type and the read buffer."""

    preallocates_frames = True
    allow = True
    last: _Direct | None = None

    def __init__(self, listener: WireListener) -> None:
        super().__init__(listener)
        self.seen: list[tuple[type, int]] = []
        _Direct.last = self

    def frame_buffer_allowed(self) -> bool:
        return self.allow

    def on_frame(self, kind: int, payload: Payload) -> None:
        self.seen.append((type(payload), self.read_buffer_bytes))
        self.write(FrameType.CONSUME, hashlib.sha256(payload).digest())

    @property
    def reader(self) -> FrameReader:
        return self._reader


async def _open(max_frame_bytes: int | None = None) -> tuple[WireListener, socket.socket, _Direct]:
    listener = WireListener("test", _Direct, "127.0.0.1", 0, max_frame_bytes=max_frame_bytes)
    port = await listener.start()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setblocking(False)
    hello = wire_pb2.WireHello(version=1, client_id="t").SerializeToString()
    await _send(sock, frame(FrameType.HELLO, hello))
    await _frames(sock, 1)
    assert _Direct.last is not None
    return listener, sock, _Direct.last


async def _send(sock: socket.socket, data: bytes) -> None:
    await asyncio.get_running_loop().sock_sendall(sock, data)


async def _frames(sock: socket.socket, n: int) -> list[tuple[int, bytes]]:
    """The next ``n`` frames the server sends (fewer if it closes)."""
    loop = asyncio.get_running_loop()
    reader = FrameReader()
    got: list[tuple[int, bytes]] = []
    while len(got) < n:
        data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 10)
        if not data:
            break
        got += reader.feed(data)
    return got


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached within 5 s")


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_frames_larger_than_the_read_buffer_are_read_into_their_own(loop: str) -> None:
    payloads = [
        b"small",
        os.urandom(3 * 256 * 1024 + 123),
        b"again",
        os.urandom(100_000),
        os.urandom(600_000),
    ]

    async def run() -> tuple[list[bytes], list[tuple[type, int]]]:
        listener, sock, conn = await _open()
        try:
            digests = []
            for payload in payloads:
                data = frame(FrameType.CONSUME, payload)
                # Split at the header's every boundary and inside the payload, as a slow sender would.
                for a, b in itertools.pairwise([0, 2, 4, 5, 9, 20_000, len(data)]):
                    await _send(sock, data[a:b])
                    await asyncio.sleep(0.002)
                digests += [d for _, d in await _frames(sock, 1)]
            return digests, conn.seen
        finally:
            sock.close()
            await listener.stop()

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        digests, seen = runner.run(run())
    assert digests == [hashlib.sha256(p).digest() for p in payloads]
    # Frames larger than the largest read buffer came as their own buffers, and the receive buffer
    # did not grow for them; a frame it can hold was read through it as before.
    assert [kind for kind, _ in seen] == [bytes, bytearray, bytes, bytes, bytearray]
    assert [size for _, size in seen][:3] == [READ_BUFFER_MIN] * 3


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_frame_not_allowed_its_buffer_is_assembled_as_before(loop: str) -> None:
    payload = os.urandom(100_000)

    async def run() -> tuple[list[tuple[int, bytes]], list[tuple[type, int]]]:
        listener, sock, conn = await _open()
        conn.allow = False  # the broker's pool has not granted the frame
        try:
            await _send(sock, frame(FrameType.CONSUME, payload))
            return await _frames(sock, 1), conn.seen
        finally:
            sock.close()
            await listener.stop()

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        got, seen = runner.run(run())
    assert got == [(FrameType.CONSUME, hashlib.sha256(payload).digest())]
    assert seen[0][0] is bytes


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_hostile_length_closes_the_connection_without_allocating(loop: str) -> None:
    async def run() -> tuple[list[tuple[int, bytes]], bool]:
        listener, sock, conn = await _open(max_frame_bytes=1 << 20)
        try:
            await _send(sock, HEADER.pack((1 << 20) + 1, FrameType.CONSUME) + b"\x00" * 100)
            return await _frames(sock, 2), conn.reader.receiving_frame
        finally:
            sock.close()
            await listener.stop()

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        got, receiving = runner.run(run())
    assert got[0][0] == FrameType.ERROR
    assert "frames hold 1 to 1048576 bytes" in common_pb2.Error.FromString(got[0][1]).message
    assert not receiving


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_half_closed_in_the_middle_of_a_frame_read_into_its_own_buffer(loop: str) -> None:
    async def run() -> tuple[list[tuple[int, bytes]], bool]:
        listener, sock, conn = await _open()
        try:
            await _send(sock, HEADER.pack(400_001, FrameType.CONSUME) + b"\x00" * 1000)
            await _until(lambda: conn.reader.buffered == 1005)
            await _send(sock, b"\x01" * 300_000)
            await _until(lambda: conn.reader.buffered == 301_005)
            assert conn.reader.receiving_frame  # the rest went into the frame's own buffer
            sock.shutdown(socket.SHUT_WR)
            return await _frames(sock, 2), conn.closing
        finally:
            sock.close()
            await listener.stop()

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        got, closing = runner.run(run())
    assert got
    assert got[0][0] == FrameType.ERROR
    assert "half-closed 301005 bytes into a frame" in common_pb2.Error.FromString(got[0][1]).message
    assert closing
