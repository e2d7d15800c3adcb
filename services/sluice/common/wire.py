"""Framing of the Sluice wire protocol, shared by the broker and the clients.

The wire protocol is the broker's data plane: Produce and Fetch as the same protobuf
messages the Broker gRPC service takes, framed over plain TCP (``proto/sluice/v1/wire.proto``
describes it; ``docs/wire.md`` says why it exists). This module only cuts a byte stream into
frames and builds frames; what a frame means is the broker's and the client's business.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from sluice.common.rpc import MAX_MESSAGE_BYTES
from sluice.errors import InvalidArgument, InvalidRequest, SluiceError, error_from_proto
from sluice.v1 import common_pb2

__all__ = [
    "CONNECT_TIMEOUT_S",
    "HEADER",
    "LANE",
    "LANES_VERSION",
    "LANE_CREDIT",
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "WIRE_PORT_OFFSET",
    "FrameReader",
    "FrameTooLarge",
    "FrameType",
    "Payload",
    "WireProtocolError",
    "WireRequest",
    "error_from_frame",
    "frame",
    "frame_parts",
    "has_records",
    "lane_frame_parts",
    "parse_frame",
    "split_address",
    "wire_listen_port",
    "wire_port_help",
]

#: The version every wire server speaks (the dispatcher's Consume, the broker's per-kind frames).
PROTOCOL_VERSION = 1
#: Version 2 (brokers): fetch lanes, so one connection carries every fetch of a client
#: (``docs/wire.md``, "Lanes"). A broker answers a version-1 hello as before.
LANES_VERSION = 2

#: How long a client may take to connect and be greeted (the hello answered).
CONNECT_TIMEOUT_S = 10.0

#: The length prefix (counting the type byte and the payload) and the type byte.
HEADER = struct.Struct(">IB")
_LENGTH = struct.Struct(">I")
#: A lane frame's payload starts with its lane id (then, for FETCH_LANE and LANE_CREDIT from the
#: client, a count of answers): fetches of several owners share one connection by lane.
LANE = struct.Struct(">I")
LANE_CREDIT = struct.Struct(">II")

#: The largest frame either side accepts: what a gRPC message may be, so a request that
#: fits one transport fits the other.
MAX_FRAME_BYTES = MAX_MESSAGE_BYTES


class FrameType(enum.IntEnum):
    HELLO = 1
    #: Broker: ProduceRequest in, ProduceResponse out.
    PRODUCE = 2
    #: Broker: FetchRequest in, FetchResponse out.
    FETCH = 3
    #: Dispatcher: ConsumerCommand in, DispatcherEvent out (one Consume stream per connection).
    CONSUME = 4
    #: Broker, version 2: ``lane, window`` + FetchRequest in; ``lane`` + FetchResponse out.
    FETCH_LANE = 5
    #: Broker, version 2: ``lane, n`` in: the lane's client holds room for ``n`` more answers.
    LANE_CREDIT = 6
    #: Broker, version 2: ``lane`` in: the lane is over (its fetch stops, nothing is answered).
    LANE_END = 7
    #: Broker -> client, then the broker closes: the connection broke the protocol.
    ERROR = 127


#: Where a service's wire port goes when not configured: this far above its gRPC port.
WIRE_PORT_OFFSET = 10


def wire_listen_port(grpc_port: int, wire_port: int | None) -> int | None:
    """The wire port to bind (0: any free one), or None to serve none.

    ``wire_port`` unset: the gRPC port + ``WIRE_PORT_OFFSET``, or a free port when the gRPC port
    is 0 (ephemeral everything, as tests and ``sluice up --port 0`` ask); -1: none.
    """
    if wire_port is None:
        port = grpc_port + WIRE_PORT_OFFSET if grpc_port else 0
        if port > 65535:
            raise InvalidArgument(f"gRPC port {grpc_port} leaves no room for the wire port: set wire_port")
        return port
    if not -1 <= wire_port <= 65535:
        raise InvalidArgument(f"wire_port must be -1 (none) or in [0, 65535], got {wire_port}")
    return None if wire_port < 0 else wire_port


def wire_port_help(default: int) -> str:
    return (
        "port of the wire protocol (the data plane over plain TCP, what the SDK uses); 0 picks a free "
        f"one, -1 serves none (clients then use gRPC); unset: --port + {WIRE_PORT_OFFSET} ({default}), "
        "or a free one when --port is 0"
    )


#: A frame's payload as the receiving side hands it on: ``bytes`` when cut from a read, or the
#: frame's own ``bytearray`` when it was received straight into it (``FrameReader.frame_buffer``).
Payload = bytes | bytearray


class WireProtocolError(InvalidRequest):
    """The peer sent bytes that are not a valid frame; the connection cannot go on."""


class FrameTooLarge(WireProtocolError):
    """A frame's declared length is over the cap (the first frame's, or every frame's)."""

    #: Whether it was the first frame (the hello, before authentication) that was too large.
    first: bool = False


class WireRequest(Protocol):
    """What a client sends: a protobuf request carrying the id its answer echoes."""

    request_id: int

    def SerializeToString(self) -> bytes: ...


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[::1]:7611``) -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def error_from_frame(payload: bytes, peer: str) -> SluiceError:
    """The typed error an error frame carries (the server closes the connection after it)."""
    err = common_pb2.Error.FromString(payload)
    where = f"{peer} closed the connection"
    return error_from_proto(err, where) or SluiceError(f"{where}: {err.message}")


#: Payloads up to this size are copied behind their header (one buffer, one send); larger ones
#: are sent after it as they are, since copying megabytes costs more than a second send.
COALESCE_BYTES = 64 * 1024


def frame(kind: FrameType, payload: bytes) -> bytes:
    """One frame: header and payload in a single buffer (one send, one syscall)."""
    return HEADER.pack(len(payload) + 1, kind) + payload


def frame_parts(kind: FrameType, payload: bytes) -> tuple[bytes, ...]:
    """One frame as the buffers to send in order: one for a small payload, else header and payload."""
    if len(payload) <= COALESCE_BYTES:
        return (HEADER.pack(len(payload) + 1, kind) + payload,)
    return HEADER.pack(len(payload) + 1, kind), payload


def lane_frame_parts(kind: FrameType, prefix: bytes, payload: bytes) -> tuple[bytes, ...]:
    """A lane frame (``prefix``: its lane header) as the buffers to send, as ``frame_parts``."""
    header = HEADER.pack(len(prefix) + len(payload) + 1, kind) + prefix
    if len(payload) <= COALESCE_BYTES:
        return (header + payload,)
    return header, payload


class _Answer(Protocol):
    @property
    def partitions(self) -> Iterable[_PartitionAnswer]: ...


class _PartitionAnswer(Protocol):
    @property
    def records(self) -> bytes: ...


def has_records(answer: _Answer) -> bool:
    """Whether a fetch answer counts against its lane's window (``docs/wire.md``, "Lanes"): it
    does when a partition carries records. An empty answer (a long-poll that timed out, every
    record filtered out) holds nothing in the client's memory, so it is free: an idle follow
    costs one frame per ``max_wait``, and no credit frame back."""
    return any(part.records for part in answer.partitions)


class FrameReader:
    """Cuts received bytes into ``(type, payload)`` frames.

    ``feed`` takes whatever the socket gave and returns every frame now complete; a partial
    frame waits in the buffer for the next call. A frame whose declared length is zero or
    above ``max_frame_bytes`` raises FrameTooLarge before its payload is buffered, so a
    hostile length cannot make the reader allocate it. ``first_frame_bytes`` caps the first
    frame alone (a server's hello, sent before the client is authenticated): a client that
    has not said who it is can make the reader hold that much and no more.

    A receiver that reads into buffers it is given (a server's ``BufferedProtocol``) may instead
    have the rest of a large frame read straight into that frame's own payload buffer:
    ``frame_buffer`` allocates it at the declared size (a length ``feed`` has already checked)
    and returns its unfilled part, ``frame_filled`` says how much a read put there. The payload
    is then handed on as that ``bytearray``: no growth of the buffer, no copy out of it
    (``docs/wire.md``, "Receiving a large frame").
    """

    __slots__ = ("_buffer", "_filled", "_frame", "_kind", "_limit", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES, first_frame_bytes: int | None = None) -> None:
        self._buffer = bytearray()
        self.max_frame_bytes = max_frame_bytes
        #: The cap of the next frame's length: ``first_frame_bytes`` until a first frame is cut.
        self._limit = max_frame_bytes if first_frame_bytes is None else first_frame_bytes
        #: The payload buffer of the frame being received straight into it (None: none), its
        #: type, and how many of its bytes have arrived.
        self._frame: bytearray | None = None
        self._kind = 0
        self._filled = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        if self._frame is not None:
            return HEADER.size + self._filled
        return len(self._buffer)

    @property
    def missing(self) -> int:
        """Bytes still to come for the frame begun in the buffer (0: none begun, or its length
        not yet read). A server sizes its next socket read by it (``server/wire.py``)."""
        if self._frame is not None:
            return len(self._frame) - self._filled
        buffer = self._buffer
        if len(buffer) < 4:
            return 0
        length: int = _LENGTH.unpack_from(buffer, 0)[0]
        return 4 + length - len(buffer)

    @property
    def receiving_frame(self) -> bool:
        """A frame is being received into its own buffer: every read goes there until it is whole."""
        return self._frame is not None

    def frame_buffer(self) -> memoryview | None:
        """The unfilled part of the incomplete frame's own payload buffer, to read into; None when
        no frame has its header (length and type) buffered. The first call allocates the buffer at
        the declared size, which ``feed`` checked against the cap when the length arrived, and
        moves the payload bytes already buffered into it."""
        frame = self._frame
        if frame is None:
            buffer = self._buffer
            if len(buffer) < HEADER.size:
                return None
            length, self._kind = HEADER.unpack_from(buffer, 0)
            self._frame = frame = bytearray(length - 1)
            self._filled = len(buffer) - HEADER.size
            with memoryview(buffer) as held:
                frame[: self._filled] = held[HEADER.size :]
            buffer.clear()
        return memoryview(frame)[self._filled :]

    def frame_filled(self, nbytes: int) -> list[tuple[int, bytearray]]:
        """A read put ``nbytes`` into ``frame_buffer``'s view: the frame, once that completes it."""
        frame = self._frame
        if frame is None:
            raise RuntimeError("frame_filled without a frame_buffer")
        self._filled += nbytes
        if self._filled < len(frame):
            return []
        self._frame = None
        self._limit = self.max_frame_bytes
        return [(self._kind, frame)]

    def feed(self, data: bytes | memoryview) -> list[tuple[int, bytes]]:
        """Every frame ``data`` completes. ``data`` may be reused by the caller afterwards:
        what is kept of it is copied."""
        done: list[tuple[int, bytes]] = []
        frame = self._frame
        if frame is not None:  # a caller that mixes both ways of reading: finish the frame first
            take = min(len(frame) - self._filled, len(data))
            frame[self._filled : self._filled + take] = data[:take]
            done = [(kind, bytes(payload)) for kind, payload in self.frame_filled(take)]
            data = data[take:]
            if not data:
                return done
        buffer = self._buffer
        if buffer:
            buffer += data
            view: bytes | bytearray | memoryview = buffer
        else:
            view = data  # the common case: the data holds whole frames, no copy into the buffer
        frames = done
        pos = 0
        end = len(view)
        limit = self._limit
        while end - pos >= 4:
            (length,) = _LENGTH.unpack_from(view, pos)
            if length == 0 or length > limit:
                raise self._too_large(length, limit)
            stop = pos + 4 + length
            if stop > end:
                break
            frames.append((view[pos + 4], bytes(view[pos + 5 : stop])))
            pos = stop
            limit = self.max_frame_bytes
        self._limit = limit
        if view is buffer:
            del buffer[:pos]
        elif pos < end:
            buffer += view[pos:]
        return frames

    def _too_large(self, length: int, limit: int) -> FrameTooLarge:
        first = limit != self.max_frame_bytes
        what = " before the hello (the first frame, with its credentials)" if first else ""
        err = FrameTooLarge(f"frame of {length} bytes: frames hold 1 to {limit} bytes{what}")
        err.first = first
        return err


def parse_frame(message_type: Any, payload: bytes | bytearray | memoryview, what: str) -> Any:
    """A frame's protobuf payload; InvalidRequest (ending the connection) when it does not parse."""
    try:
        return message_type.FromString(payload)
    except DecodeError as exc:
        raise InvalidRequest(f"a {what} frame that is not a valid {message_type.__name__}: {exc}") from exc
