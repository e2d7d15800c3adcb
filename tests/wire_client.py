"""A bare wire-protocol client for tests: frames in, frames out, nothing hidden (docs/wire.md)."""

from __future__ import annotations

import os
import re
import socket
import time
import urllib.request

from sluice.common.wire import HEADER, FrameReader, FrameType
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2, wire_pb2


class RawWire:
    """A bare wire-protocol client: frames in, frames out, nothing hidden."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.reader = FrameReader()
        self.frames: list[tuple[int, bytes]] = []

    def close(self) -> None:
        self.sock.close()

    def send(self, kind: int, payload: bytes) -> None:
        self.sock.sendall(HEADER.pack(len(payload) + 1, kind) + payload)

    def recv(self) -> tuple[int, bytes] | None:
        """The next frame, or None when the broker closed the connection."""
        while not self.frames:
            data = self.sock.recv(1 << 20)
            if not data:
                return None
            self.frames += self.reader.feed(data)
        return self.frames.pop(0)

    def hello(self, version: int = 1) -> wire_pb2.WireHelloResponse:
        self.send(FrameType.HELLO, wire_pb2.WireHello(version=version, client_id="test").SerializeToString())
        got = self.recv()
        assert got is not None
        assert got[0] == FrameType.HELLO
        return wire_pb2.WireHelloResponse.FromString(got[1])

    def produce(self, request: pb.ProduceRequest) -> None:
        self.send(FrameType.PRODUCE, request.SerializeToString())

    def fetch(self, request: pb.FetchRequest) -> None:
        self.send(FrameType.FETCH, request.SerializeToString())

    def answer(self, kind: FrameType) -> bytes:
        got = self.recv()
        assert got is not None, "the broker closed the connection"
        assert got[0] == kind, f"expected frame type {kind}, got {got}"
        return got[1]

    def closed_with_error(self) -> common_pb2.Error:
        """The error frame the broker sends before it closes, then the close itself."""
        got = self.recv()
        assert got is not None
        assert got[0] == FrameType.ERROR, got
        assert self.recv() is None, "the broker kept the connection open"
        return common_pb2.Error.FromString(got[1])


def wire_address(output: list[str]) -> str:
    """The ``wire=host:port`` of a service's ready line."""
    for line in output:
        if line.startswith("SLUICE_READY") and " wire=" in line:
            return line.split(" wire=", 1)[1].split()[0]
    raise AssertionError("the service's ready line names no wire port")


def wire_connections(metrics: str, service: str) -> float:
    """``sluice_<service>_wire_connections`` as the service at ``metrics`` (host:port) exports it now."""
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
    m = re.search(rf"^sluice_{service}_wire_connections (\S+)$", text, re.MULTILINE)
    assert m is not None, f"the {service} exports no sluice_{service}_wire_connections"
    return float(m.group(1))


def settle_connections(metrics: str, service: str, expected: float, timeout: float = 10.0) -> None:
    """Wait until the service counts ``expected`` wire connections: opening and closing reach it
    asynchronously (a client's close is a FIN the service has yet to read)."""
    deadline = time.monotonic() + timeout
    while (now := wire_connections(metrics, service)) != expected:
        assert time.monotonic() < deadline, (
            f"the {service} counts {now} wire connections, expected {expected}"
        )
        time.sleep(0.02)


def sockets_to(port: int) -> int:
    """This process's established TCP connections to ``port`` (loopback, IPv4 or IPv6)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for row in f:
                cols = row.split()
                remote_port = int(cols[2].rsplit(":", 1)[1], 16)
                if remote_port == port and cols[3] == "01" and cols[9] in inodes:
                    count += 1
    return count
