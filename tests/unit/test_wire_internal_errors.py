"""A bug in a wire connection's frame handling (not bad input) is counted in
``sluice_internal_errors_total{method="wire"}``, answered with an error frame and the connection closed;
the listener goes on serving others. A real listener on loopback."""

from __future__ import annotations

import asyncio

from sluice.common.wire import HEADER, FrameReader, FrameType, Payload
from sluice.server.metrics import INTERNAL_ERRORS
from sluice.server.wire import WireConnection, WireListener
from sluice.v1 import wire_pb2


class _Buggy(WireConnection):
    def on_frame(self, kind: int, payload: Payload) -> None:
        if payload == b"boom":
            raise RuntimeError("a bug")
        self.write(FrameType.CONSUME, bytes(payload))


def _count() -> float:
    return float(INTERNAL_ERRORS.labels("buggy-test", "wire")._value.get())


async def _session(payload: bytes, port: int) -> list[tuple[int, bytes]]:
    """Hello, one frame, and every frame the server sends until it closes or answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    frames = FrameReader()
    got: list[tuple[int, bytes]] = []
    hello = wire_pb2.WireHello(version=1, client_id="t").SerializeToString()
    writer.write(HEADER.pack(len(hello) + 1, FrameType.HELLO) + hello)
    writer.write(HEADER.pack(len(payload) + 1, FrameType.CONSUME) + payload)
    try:
        while len(got) < 2:
            data = await asyncio.wait_for(reader.read(1 << 16), 10)
            if not data:
                break
            got += [(kind, bytes(p)) for kind, p in frames.feed(data)]
    finally:
        writer.close()
    return got


def test_a_bug_in_a_frame_handler_is_counted_answered_and_the_listener_goes_on() -> None:
    async def run() -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]]]:
        listener = WireListener("buggy-test", _Buggy, "127.0.0.1", 0)
        port = await listener.start()
        try:
            return await _session(b"boom", port), await _session(b"fine", port)
        finally:
            await listener.stop()

    before = _count()
    failed, fine = asyncio.run(run())
    assert _count() == before + 1
    assert failed[-1][0] == FrameType.ERROR  # an error frame, then the close
    assert fine[-1] == (FrameType.CONSUME, b"fine")
