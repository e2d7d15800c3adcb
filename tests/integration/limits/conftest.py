"""Real broker and dispatcher processes with short connection deadlines, and what the limit tests
read of them: RSS, the listener metrics, raw sockets."""

from __future__ import annotations

import re
import socket
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from sluice.common.wire import HEADER, FrameReader, FrameType
from sluice.v1 import common_pb2, wire_pb2
from tests.harness import ServiceProcess, start_service
from tests.wire_client import wire_address

#: Where the tests' dispatchers look for a coordinator: nobody listens there, and a dispatcher
#: serves its wire port while it retries the registration.
NO_COORDINATOR = "127.0.0.1:1"


def start(service: str, *args: str) -> ServiceProcess:
    """``service`` (broker or dispatcher) on free ports, with extra flags."""
    extra: list[str] = ["--port", "0", "--metrics-port", "0"]
    if service == "broker":
        extra += ["--data-dir", tempfile.mkdtemp(prefix="sluice-limits-")]
    else:
        extra += ["--coordinator", NO_COORDINATOR]
    return start_service(service, *extra, *args)


@pytest.fixture
def launch() -> Iterator[Callable[..., ServiceProcess]]:
    started: list[ServiceProcess] = []

    def launch(service: str, *args: str) -> ServiceProcess:
        sp = start(service, *args)
        started.append(sp)
        return sp

    yield launch
    for sp in started:
        sp.terminate()


def rss_bytes(sp: ServiceProcess) -> int:
    with open(f"/proc/{sp.process.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def metric(sp: ServiceProcess, name: str, labels: str = "") -> float:
    """One sample of the service's /metrics (0 when absent)."""
    text = urllib.request.urlopen(f"http://{sp.metrics}/metrics", timeout=10).read().decode()
    sample = name + (f"{{{labels}}}" if labels else "")
    m = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def closed(sp: ServiceProcess, reason: str) -> float:
    return metric(sp, f"sluice_{sp.service}_wire_connections_closed_total", f'reason="{reason}"')


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def connect(sp: ServiceProcess, timeout: float = 20) -> socket.socket:
    host, _, port = wire_address(sp.output).rpartition(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def send_frame(sock: socket.socket, kind: int, payload: bytes) -> None:
    sock.sendall(HEADER.pack(len(payload) + 1, kind) + payload)


def hello(sock: socket.socket) -> None:
    send_frame(sock, FrameType.HELLO, wire_pb2.WireHello(version=1, client_id="limits").SerializeToString())
    kind, payload = read_frame(sock)
    assert kind == FrameType.HELLO, (kind, payload)
    assert not wire_pb2.WireHelloResponse.FromString(payload).HasField("error")


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """The next frame; AssertionError at EOF."""
    reader = FrameReader()
    while True:
        data = sock.recv(1 << 16)
        assert data, "closed without a frame"
        frames = reader.feed(data)
        if frames:
            return frames[0]


def closed_by_server(sock: socket.socket) -> common_pb2.Error | None:
    """Read until the server closes: the error frame it sent first (None: a silent close).
    Raises socket.timeout if it does not close within the socket's timeout."""
    reader = FrameReader()
    error = None
    while True:
        try:
            data = sock.recv(1 << 16)
        except ConnectionResetError:
            return error
        if not data:
            return error
        for kind, payload in reader.feed(data):
            if kind == FrameType.ERROR:
                error = common_pb2.Error.FromString(payload)
