"""A raw HTTP/2 client for the limit tests: frames built and read one by one (hyperframe, hpack), so
it can do what grpc's own clients never do — open streams past the server's cap, reset them as fast
as it opens them (Rapid Reset, CVE-2023-44487), flood pings — and report exactly what the server
answered."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

import hpack
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: RST_STREAM / GOAWAY error codes (RFC 9113, 7).
CANCEL = 0x8
REFUSED_STREAM = 0x7
ENHANCE_YOUR_CALM = 0xB
#: An empty protobuf message as one gRPC message: not compressed, length 0.
EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"


@dataclass
class Seen:
    """What the server sent, by kind."""

    settings: dict[int, int] = field(default_factory=dict)
    answered: set[int] = field(default_factory=set)  # streams the server sent HEADERS on
    refused: set[int] = field(default_factory=set)  # RST_STREAM with REFUSED_STREAM
    reset: set[int] = field(default_factory=set)  # RST_STREAM with any other code
    goaway: GoAwayFrame | None = None
    closed: bool = False


class RawH2:
    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.encoder = hpack.Encoder()
        self.buffer = b""
        self.seen = Seen()
        self.next_stream = 1
        self.sock.sendall(PREFACE + SettingsFrame(0).serialize())

    def close(self) -> None:
        self.sock.close()

    def request(self, path: str, end: bool = True) -> int:
        """Open a stream calling ``path`` with an empty message; its id."""
        stream = self.next_stream
        self.next_stream += 2
        self.sock.sendall(self.request_bytes(stream, path, end))
        return stream

    def request_bytes(self, stream: int, path: str, end: bool = True) -> bytes:
        headers = HeadersFrame(stream)
        headers.data = self.encoder.encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "limits"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
        )
        headers.flags.add("END_HEADERS")
        data = DataFrame(stream)
        data.data = EMPTY_MESSAGE
        if end:
            data.flags.add("END_STREAM")
        return headers.serialize() + data.serialize()

    def reset_bytes(self, stream: int) -> bytes:
        rst = RstStreamFrame(stream)
        rst.error_code = CANCEL
        return rst.serialize()

    def ping(self) -> None:
        self.sock.sendall(PingFrame(0, b"12345678").serialize())

    def read_for(self, seconds: float) -> Seen:
        """Read and sort what the server sends for ``seconds`` (or until it closes)."""
        deadline = time.monotonic() + seconds
        while not self.seen.closed and (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                break
            except ConnectionResetError:
                data = b""
            if not data:
                self.seen.closed = True
                break
            self.buffer += data
            self._frames()
        return self.seen

    def _frames(self) -> None:
        while len(self.buffer) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(self.buffer[:9]))
            if len(self.buffer) < 9 + length:
                return
            frame.parse_body(memoryview(self.buffer[9 : 9 + length]))
            self.buffer = self.buffer[9 + length :]
            self._sort(frame)

    def _sort(self, frame: Frame) -> None:
        seen = self.seen
        if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
            seen.settings.update(frame.settings)
            ack = SettingsFrame(0)
            ack.flags.add("ACK")
            self.sock.sendall(ack.serialize())
        elif isinstance(frame, HeadersFrame):
            seen.answered.add(frame.stream_id)
        elif isinstance(frame, RstStreamFrame):
            (seen.refused if frame.error_code == REFUSED_STREAM else seen.reset).add(frame.stream_id)
        elif isinstance(frame, GoAwayFrame):
            seen.goaway = frame
