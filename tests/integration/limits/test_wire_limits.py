"""Connection limits of the wire ports (docs/limits.md, "Connections"), on real broker and
dispatcher processes: what a client that has not said hello can cost, deadlines (hello, frame,
idle), half-closed frames, and the caps on connections."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

import pytest

from sluice.common.wire import HEADER, FrameType
from sluice.v1 import common_pb2, wire_pb2
from tests.harness import ServiceProcess
from tests.integration.limits.conftest import (
    closed,
    closed_by_server,
    connect,
    hello,
    metric,
    read_frame,
    rss_bytes,
    send_frame,
    wait_for,
)

MiB = 1024 * 1024
SERVICES = ("broker", "dispatcher")
Launch = Callable[..., ServiceProcess]


def _flood(sp: ServiceProcess, results: list[str]) -> None:
    """One connection that sends 64 MiB without a hello: a frame header claiming 64 MiB, then the
    bytes, 1 MiB at a time, until the server closes the connection."""
    chunk = os.urandom(MiB)
    sent = 0
    with connect(sp) as sock:
        try:
            sock.sendall(HEADER.pack(64 * MiB, FrameType.HELLO))
            while sent < 64 * MiB:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            closed_by_server(sock)
        except TimeoutError:
            results.append(f"still open after {sent} bytes")
            return
    results.append("closed")


def test_eight_connections_sending_64_mib_without_a_hello_are_closed_and_cost_little(launch: Launch) -> None:
    broker = launch("broker")
    baseline = rss_bytes(broker)
    peak = baseline
    results: list[str] = []
    threads = [threading.Thread(target=_flood, args=(broker, results)) for _ in range(8)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss_bytes(broker))
        time.sleep(0.01)
    for t in threads:
        t.join()
    peak = max(peak, rss_bytes(broker))
    assert results == ["closed"] * 8
    # On main (no cap before the hello) the 8 connections took 582 MB.
    assert peak - baseline < 16 * MiB, f"RSS grew {(peak - baseline) / MiB:.1f} MiB"
    assert closed(broker, "pre_auth_too_large") == 8


@pytest.mark.parametrize("service", SERVICES)
def test_no_hello_in_time_closes_the_connection(launch: Launch, service: str) -> None:
    sp = launch(service, "--hello-timeout", "1s")
    silent = connect(sp)
    partial = connect(sp)
    partial.sendall(HEADER.pack(1000, FrameType.HELLO) + b"x" * 100)  # a hello that never ends
    started = time.monotonic()
    for sock in (silent, partial):
        with sock:
            err = closed_by_server(sock)
            assert err is not None
            assert err.code == common_pb2.INVALID_REQUEST
            assert "no hello within 1 s" in err.message
    assert time.monotonic() - started < 10
    assert closed(sp, "pre_auth_timeout") == 2


@pytest.mark.parametrize("greeted", [False, True], ids=["before-hello", "after-hello"])
@pytest.mark.parametrize("service", SERVICES)
def test_half_a_frame_then_fin_is_closed(launch: Launch, service: str, greeted: bool) -> None:
    sp = launch(service)
    with connect(sp) as sock:
        if greeted:
            hello(sock)
        kind = FrameType.PRODUCE if service == "broker" else FrameType.CONSUME
        sock.sendall(HEADER.pack(1001, kind) + b"\x00" * 500)
        sock.shutdown(socket.SHUT_WR)
        err = closed_by_server(sock)  # within the socket's timeout: no wait for any deadline
    if greeted:
        assert err is not None
        assert err.code == common_pb2.INVALID_REQUEST
        assert "half-closed 505 bytes into a frame" in err.message
    else:
        assert err is None  # a client not greeted is told nothing
    assert closed(sp, "half_frame") == 1


def test_half_a_large_frame_read_into_its_own_buffer_then_fin_is_closed(launch: Launch) -> None:
    """A produce frame larger than the read buffer is read into its own buffer once the produce pool
    granted it (docs/wire.md, "Receiving a large frame"); half of it, then FIN, is refused the same."""
    sp = launch("broker")
    with connect(sp) as sock:
        hello(sock)
        sock.sendall(HEADER.pack(1_000_001, FrameType.PRODUCE) + b"\x00" * 600_000)
        sock.shutdown(socket.SHUT_WR)
        err = closed_by_server(sock)
    assert err is not None
    assert err.code == common_pb2.INVALID_REQUEST
    assert "half-closed 600005 bytes into a frame" in err.message
    assert closed(sp, "half_frame") == 1


@pytest.mark.parametrize("service", SERVICES)
def test_a_frame_sent_slower_than_the_frame_timeout_is_closed(launch: Launch, service: str) -> None:
    sp = launch(service, "--frame-timeout", "1s")
    with connect(sp) as sock:
        hello(sock)
        kind = FrameType.PRODUCE if service == "broker" else FrameType.CONSUME
        sock.sendall(HEADER.pack(10_001, kind))
        started = time.monotonic()
        try:
            # One byte every 100 ms: every read is fresh, the frame never completes in time.
            for _ in range(200):
                sock.sendall(b"\x00")
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass
        err = closed_by_server(sock)
        took = time.monotonic() - started
    assert err is None or "a frame not complete within 1 s" in err.message
    assert 0.9 < took < 15, took
    assert closed(sp, "frame_timeout") == 1


def test_connections_per_address_and_in_total_are_capped(launch: Launch) -> None:
    broker = launch("broker", "--max-connections-per-address", "5", "--max-connections", "8")
    kept = [connect(broker) for _ in range(5)]
    for sock in kept:
        hello(sock)
    with connect(broker) as sixth:
        err = closed_by_server(sixth)
    assert err is not None
    assert err.code == common_pb2.BROKER_NOT_AVAILABLE
    assert "max_connections_per_address" in err.message
    kept.pop().close()
    wait_for(lambda: metric(broker, "sluice_broker_wire_connections_open") == 4, 10, "a close")
    again = connect(broker)
    hello(again)  # room again
    kept.append(again)
    # The total: 5 from 127.0.0.1 and 3 from 127.0.0.2 fill 8; a ninth from 127.0.0.3 is refused.
    port = int(again.getpeername()[1])
    others = [socket.create_connection(("127.0.0.1", port), timeout=20, source_address=("127.0.0.2", 0))]
    others += [
        socket.create_connection(("127.0.0.1", port), timeout=20, source_address=("127.0.0.2", 0))
        for _ in range(2)
    ]
    for sock in others:
        hello(sock)
    with socket.create_connection(("127.0.0.1", port), timeout=20, source_address=("127.0.0.3", 0)) as ninth:
        err = closed_by_server(ninth)
    assert err is not None
    assert "max_connections)" in err.message
    assert closed(broker, "limit") == 2
    for sock in kept + others:
        sock.close()


def _open_idle(sp: ServiceProcess, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        sock = connect(sp)
        hello(sock)
        socks.append(sock)
    return socks


@pytest.mark.parametrize("service", SERVICES)
def test_a_thousand_idle_connections_cost_little_and_are_closed_after_the_idle_timeout(
    launch: Launch, service: str
) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    idle_s = 10
    sp = launch(service, "--connections-max-idle", f"{idle_s}s")
    # Warm up what a first connection allocates once (modules, caches) before the baseline.
    for sock in _open_idle(sp, 20):
        sock.close()
    wait_for(lambda: metric(sp, f"sluice_{service}_wire_connections_open") == 0, 10, "the warm-up to close")
    baseline = rss_bytes(sp)
    opened_at = time.monotonic()
    socks = _open_idle(sp, 1000)
    opened = time.monotonic() - opened_at
    grown = rss_bytes(sp) - baseline
    assert metric(sp, f"sluice_{service}_wire_connections_open") == 1000, "closed before measured"
    per_connection = grown / 1000
    print(f"{service}: 1,000 idle connections opened in {opened:.1f} s, {per_connection / 1024:.1f} KiB each")
    assert per_connection < 64 * 1024, f"{per_connection / 1024:.1f} KiB per idle connection"
    try:
        wait_for(
            lambda: metric(sp, f"sluice_{service}_wire_connections_open") == 0,
            idle_s + 60,
            "the idle connections to be closed",
        )
        assert closed(sp, "idle") >= 1000
        # Closed silently, by the service: each socket reads EOF.
        for sock in socks[:50]:
            assert closed_by_server(sock) is None
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.parametrize("service", SERVICES)
def test_the_frame_cap_is_configured_announced_and_enforced(launch: Launch, service: str) -> None:
    sp = launch(service, "--max-frame-bytes", str(MiB))
    with connect(sp) as sock:
        send_frame(sock, FrameType.HELLO, wire_pb2.WireHello(version=1, client_id="cap").SerializeToString())
        kind, payload = read_frame(sock)
        assert kind == FrameType.HELLO
        assert wire_pb2.WireHelloResponse.FromString(payload).max_frame_bytes == MiB
        sock.sendall(HEADER.pack(MiB + 1, FrameType.PRODUCE))  # refused from the header alone
        err = closed_by_server(sock)
    assert err is not None
    assert err.code == common_pb2.INVALID_REQUEST
    assert f"frames hold 1 to {MiB} bytes" in err.message
    assert closed(sp, "too_large") == 1
